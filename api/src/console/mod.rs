//! The browser console: one page (`/`) and its assets (`/console/...`), embedded in the binary so
//! that the node serves them with no file, network or build step. The page is plain JavaScript
//! that talks to the same HTTP API as every other client (a session cookie and the CSRF header);
//! it routes by the URL's hash (`#/workflows/ID`), so the server has nothing to route but assets.
//!
//! These replies carry their own headers instead of the API's sandbox policy: a CSP that lets the
//! page run its own script and style and nothing else (no inline script or style, no other
//! origin, no framing), `nosniff` and `no-referrer`.

/// The policy of every console reply. `img-src blob:` is for artifact previews, which the page
/// fetches as bytes and shows from a blob URL (only raster types the server marks inline).
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' blob:; object-src 'none'; frame-ancestors 'none'; \
     base-uri 'none'; form-action 'self'";

/// One embedded file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    pub content_type: &'static str,
    pub body: &'static [u8],
}

/// Every file the console is made of, by its path.
const ASSETS: &[(&str, Asset)] = &[
    (
        "/",
        Asset {
            content_type: "text/html; charset=utf-8",
            body: include_bytes!("index.html"),
        },
    ),
    (
        "/console/app.js",
        Asset {
            content_type: "text/javascript; charset=utf-8",
            body: include_bytes!("app.js"),
        },
    ),
    (
        "/console/app.css",
        Asset {
            content_type: "text/css; charset=utf-8",
            body: include_bytes!("app.css"),
        },
    ),
    // The page names its icon; `/favicon.ico` is where a browser looks without being told.
    (
        "/console/favicon.svg",
        Asset {
            content_type: "image/svg+xml",
            body: include_bytes!("favicon.svg"),
        },
    ),
    (
        "/favicon.ico",
        Asset {
            content_type: "image/svg+xml",
            body: include_bytes!("favicon.svg"),
        },
    ),
];

/// Whether `path` is the console's to answer: the page, its icon and everything under
/// `/console/`.
pub fn owns(path: &str) -> bool {
    path == "/" || path == "/favicon.ico" || path.starts_with("/console/")
}

/// The asset at `path`; `None` for a console path that names no asset (a 404).
pub fn asset(path: &str) -> Option<Asset> {
    ASSETS
        .iter()
        .find(|(served_at, _)| *served_at == path)
        .map(|(_, asset)| *asset)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_and_its_assets_are_found_and_nothing_else() {
        assert!(owns("/") && owns("/console/app.js") && owns("/console/nope"));
        assert!(!owns("/api/v1/workflows") && !owns("/consoles"));
        assert_eq!(
            asset("/").map(|a| a.content_type),
            Some("text/html; charset=utf-8")
        );
        assert!(asset("/console/app.js").is_some());
        assert!(asset("/console/app.css").is_some());
        for icon in ["/favicon.ico", "/console/favicon.svg"] {
            assert!(owns(icon), "{icon}");
            assert_eq!(asset(icon).map(|a| a.content_type), Some("image/svg+xml"));
        }
        for missing in ["/console/", "/console/app.js.map", "/console/../Cargo.toml"] {
            assert_eq!(asset(missing), None, "{missing}");
        }
    }

    #[test]
    fn the_page_loads_only_its_own_files_and_runs_no_inline_code() {
        let page = std::str::from_utf8(asset("/").expect("page").body).expect("utf-8");
        assert!(page.contains(r#"<script type="module" src="/console/app.js">"#));
        assert!(page.contains(r#"<link rel="stylesheet" href="/console/app.css">"#));
        assert!(!page.contains("style="), "no inline style");
        assert_eq!(
            page.matches("<script").count(),
            1,
            "one script, from a file"
        );
        assert!(!page.contains("http://") && !page.contains("https://"));
    }
}
