//! What a table's cells need beyond the record's values: durations in units people read, long
//! texts cut to the room a terminal line has, and owners named by their email rather than their
//! id (as the console names them).

use std::collections::HashMap;
use std::io::IsTerminal;

use serde_json::Value;

use super::client::Client;
use super::inbox::printable;

/// The characters a cut cell keeps at most when standard output is no terminal (a pipe, a
/// file): the whole text is in `--json`.
pub const CELL_CHARS_MAX: usize = 72;

/// The fewest characters a cut cell keeps however narrow the terminal.
const CELL_CHARS_MIN: usize = 16;

/// Milliseconds as people read them: `12 ms`, `2.0 s`, `3 min 5 s`, `2 h 10 min` (`-` for none).
pub fn duration_ms(value: &Value) -> String {
    let Some(ms) = value.as_i64() else {
        return "-".to_owned();
    };
    match ms {
        ..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{:.1} s", ms as f64 / 1000.0),
        60_000..3_600_000 => format!("{} min {} s", ms / 60_000, ms % 60_000 / 1000),
        _ => format!("{} h {} min", ms / 3_600_000, ms % 3_600_000 / 60_000),
    }
}

/// `text` on one line (control characters escaped), cut to `room` characters with `…`.
pub fn cut(text: &str, room: usize) -> String {
    let line = printable(text);
    if line.chars().count() <= room {
        return line;
    }
    let kept: String = line.chars().take(room.saturating_sub(1)).collect();
    format!("{kept}…")
}

/// The characters left for a table's last column after `used` of a line: the terminal's width
/// less what the other columns take, or [`CELL_CHARS_MAX`] when standard output is no terminal.
pub fn room_after(used: usize) -> usize {
    match terminal_columns() {
        Some(columns) => columns.saturating_sub(used).max(CELL_CHARS_MIN),
        None => CELL_CHARS_MAX,
    }
}

/// The width of the terminal standard output is, if it is one.
fn terminal_columns() -> Option<usize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct it is given, which lives here.
    let asked = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (asked == 0 && size.ws_col > 0).then_some(usize::from(size.ws_col))
}

/// The emails of the people the caller may name, by user id: their own, and everyone's for an
/// admin (who may list users). A user the caller cannot name is shown by id.
pub async fn owner_names(client: &Client) -> HashMap<String, String> {
    let mut names = HashMap::new();
    let Ok(me) = client.json("GET", "/api/v1/auth/me", None).await else {
        return names;
    };
    if me["role"] == "admin"
        && let Ok(users) = client.json("GET", "/api/v1/auth/users", None).await
    {
        for user in users["users"].as_array().into_iter().flatten() {
            add(&mut names, user);
        }
    }
    add(&mut names, &me);
    names
}

fn add(names: &mut HashMap<String, String>, user: &Value) {
    if let (Some(id), Some(email)) = (user["id"].as_str(), user["email"].as_str()) {
        names.insert(id.to_owned(), email.to_owned());
    }
}

/// A workflow's owner as people know them: their email when the caller may name them, else
/// their user id.
pub fn owner_name(names: &HashMap<String, String>, user_id: &Value) -> String {
    let id = user_id.as_str().unwrap_or("-");
    names
        .get(id)
        .map_or_else(|| printable(id), |email| printable(email))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn durations_read_in_the_unit_that_fits() {
        assert_eq!(duration_ms(&json!(12)), "12 ms");
        assert_eq!(duration_ms(&json!(2_049)), "2.0 s");
        assert_eq!(duration_ms(&json!(185_000)), "3 min 5 s");
        assert_eq!(duration_ms(&json!(7_800_000)), "2 h 10 min");
        assert_eq!(duration_ms(&Value::Null), "-");
    }

    #[test]
    fn a_long_cell_is_cut_to_its_room_on_one_line() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("a\nb", 10), "a\\nb");
        assert_eq!(cut("abcdefghij", 5), "abcd…");
    }
}
