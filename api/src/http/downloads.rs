//! How an artifact goes out over HTTP: its content type, whether a browser may show it inline,
//! and the file name a download gets. Stored bytes are anyone's (an agent's, a script's), so
//! these are the rules that keep them from ever running as a page of our origin.

/// How an artifact is served: its content type, and whether a browser may show it inline.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Served {
    pub content_type: &'static str,
    pub inline: bool,
}

/// How an artifact is served. Stored bytes are anyone's (an agent's, a script's): only types a
/// browser never runs are shown inline (plain text, JSON, raster images); every other type goes
/// out as an attachment, and a type a browser could run as a page (HTML, SVG, XML, anything
/// unknown) as `application/octet-stream`. An agent's output (a step's, with no file path) is
/// JSON; a captured file goes by its extension.
pub(super) fn served(path: Option<&str>, from_step: bool) -> Served {
    let inline = |content_type| Served {
        content_type,
        inline: true,
    };
    let attachment = |content_type| Served {
        content_type,
        inline: false,
    };
    let Some(path) = path else {
        return if from_step {
            inline("application/json")
        } else {
            attachment("application/octet-stream")
        };
    };
    let extension = path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match extension.as_str() {
        "txt" | "log" => inline("text/plain; charset=utf-8"),
        "json" => inline("application/json"),
        "png" => inline("image/png"),
        "jpg" | "jpeg" => inline("image/jpeg"),
        "gif" => inline("image/gif"),
        "webp" => inline("image/webp"),
        "md" => attachment("text/markdown; charset=utf-8"),
        "csv" => attachment("text/csv; charset=utf-8"),
        "pdf" => attachment("application/pdf"),
        "zip" => attachment("application/zip"),
        _ => attachment("application/octet-stream"),
    }
}

/// The file name a download of an artifact gets: its path's last part reduced to characters
/// that need no quoting, or `artifact-<version>` when nothing is left of it.
pub(super) fn file_name(path: Option<&str>, version: i64) -> String {
    let name: String = path
        .and_then(|p| p.rsplit('/').next())
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .collect();
    if name.trim_matches('.').is_empty() {
        format!("artifact-{version}")
    } else {
        name
    }
}

/// The `Content-Disposition` of an artifact, naming it by [`file_name`].
pub(super) fn disposition(served: &Served, path: Option<&str>, version: i64) -> String {
    let name = file_name(path, version);
    let kind = if served.inline {
        "inline"
    } else {
        "attachment"
    };
    format!("{kind}; filename=\"{name}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_inert_types_are_served_inline() {
        for (path, content_type) in [
            ("/o/x.html", "application/octet-stream"),
            ("/o/x.HTM", "application/octet-stream"),
            ("/o/x.svg", "application/octet-stream"),
            ("/o/x.xml", "application/octet-stream"),
            ("/o/x.xhtml", "application/octet-stream"),
            ("/o/noextension", "application/octet-stream"),
            ("/o/x.pdf", "application/pdf"),
        ] {
            assert_eq!(
                served(Some(path), true),
                Served {
                    content_type,
                    inline: false
                },
                "{path}"
            );
        }
        assert!(served(Some("/o/a.txt"), true).inline);
        assert!(served(Some("/o/a.PNG"), true).inline);
        assert!(served(None, true).inline);
        assert!(!served(None, false).inline);
    }

    #[test]
    fn a_disposition_names_the_file_with_safe_characters_only() {
        let html = served(Some("/o/x.html"), true);
        assert_eq!(
            disposition(&html, Some("/mnt/user-data/outputs/r\"e p;o<r>t.html"), 3),
            "attachment; filename=\"report.html\""
        );
        assert_eq!(
            disposition(&html, Some("/o/\"\"\""), 3),
            "attachment; filename=\"artifact-3\""
        );
        let text = served(Some("/o/a.txt"), true);
        assert_eq!(
            disposition(&text, None, 2),
            "inline; filename=\"artifact-2\""
        );
    }
}
