//! The rules on single values that the server checks and `openapi.json` states: each rule's check
//! and its pattern live side by side here, and the tests below hold them to the same answers, so
//! that a request a client builds from the description is a request the server accepts.
//!
//! Patterns are ECMA-262 regular expressions (JSON Schema's dialect) that use only what Python's
//! `re` and Rust's `regex` read alike: classes, `\uXXXX` escapes, groups and counted repeats.

use std::sync::OnceLock;

/// A pattern the server checks with, as the description states it.
pub struct Pattern {
    pub source: &'static str,
    compiled: OnceLock<regex::Regex>,
}

impl Pattern {
    pub const fn new(source: &'static str) -> Self {
        Pattern {
            source,
            compiled: OnceLock::new(),
        }
    }

    pub fn is_match(&self, text: &str) -> bool {
        self.compiled
            // Stated invariant: every pattern is a constant that the tests below compile.
            .get_or_init(|| regex::Regex::new(self.source).expect("a constant pattern"))
            .is_match(text)
    }
}

/// A listing's position (`next`): its last workflow's creation time (epoch seconds, written as
/// the shortest decimal that reads back as the same number), `_`, its run id.
pub static LIST_CURSOR: Pattern =
    Pattern::new("^[0-9]{1,20}(\\.[0-9]{1,20})?_[A-Za-z0-9._-]{1,128}$");

/// A position in a workflow's journal (`steps_next`): a sequence number, `_`, an attempt.
pub static STEP_CURSOR: Pattern = Pattern::new("^[0-9]{1,9}_[0-9]{1,9}$");

/// A duration a request waits: a whole number of milliseconds, seconds or minutes.
pub static DURATION: Pattern = Pattern::new("^[0-9]{1,12}(ms|s|m)$");

/// An id: the runtime's one grammar ([`runtime::ID_GRAMMAR`]), which [`runtime::is_id`] checks.
pub const ID_PATTERN: &str = "^[A-Za-z0-9._-]{1,128}$";

/// What no line of text may hold: control characters (Unicode's `Cc`, what `char::is_control`
/// finds) and the explicit bidirectional formatting characters, which would make a listing read
/// otherwise than it is stored.
const NOT_IN_A_LINE: &str =
    "\\u0000-\\u001f\\u007f-\\u009f\\u061c\\u200e\\u200f\\u202a-\\u202e\\u2066-\\u2069";

/// Unicode's white space that is not a control character (what `char::is_whitespace` adds to
/// the controls it finds): a line of only these is blank.
const BLANK: &str = " \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";

/// A line of text (a title, a token's name): not blank, no control or bidirectional formatting
/// character. Its length bounds are the schema's `minLength`/`maxLength` (in characters).
pub fn line_pattern() -> &'static str {
    static PATTERN: OnceLock<String> = OnceLock::new();
    PATTERN.get_or_init(|| {
        format!("^[^{NOT_IN_A_LINE}]*[^{NOT_IN_A_LINE}{BLANK}][^{NOT_IN_A_LINE}]*$")
    })
}

/// Checks a line of text of 1 to `max` characters; the reason it is refused, for a message that
/// names the field.
pub fn check_line(text: &str, max: u64) -> Result<(), String> {
    let chars = text.chars().count();
    if text.chars().all(char::is_whitespace) {
        return Err("it is empty or blank; leave it out instead".to_owned());
    }
    if chars as u64 > max {
        return Err(format!("it has {chars} characters, more than {max}"));
    }
    if let Some(bad) = text.chars().find(|&c| c.is_control() || is_bidi_control(c)) {
        return Err(format!(
            "it holds the control character U+{:04X}; it is one line of text",
            u32::from(bad)
        ));
    }
    Ok(())
}

/// Unicode's explicit bidirectional formatting characters (embeddings, overrides, isolates, and
/// the marks), which reorder the text around them when shown.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{200E}' | '\u{200F}' | '\u{061C}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// An email as a new user's is given: `local@domain` in ASCII, the local part dot-separated runs
/// of letters, digits and `!#$%&*+=?^_{|}~-` (no quotes, brackets, slashes or other characters
/// that delimit markup and headers), the domain labels of letters, digits and inner hyphens (an
/// internationalised domain in its `xn--` form). At most [`EMAIL_CHARS_MAX`] characters.
pub static EMAIL: Pattern = Pattern::new(
    "^[A-Za-z0-9!#$%&*+=?^_{|}~-]+(\\.[A-Za-z0-9!#$%&*+=?^_{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$",
);

/// An email's length at most (RFC 5321's path limit).
pub const EMAIL_CHARS_MAX: usize = 254;

/// Whether `email` is shaped as [`EMAIL`] says, within [`EMAIL_CHARS_MAX`].
pub fn email_shaped(email: &str) -> bool {
    email.len() <= EMAIL_CHARS_MAX && EMAIL.is_match(email)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, text: &str) -> bool {
        regex::Regex::new(pattern).expect("pattern").is_match(text)
    }

    #[test]
    fn every_pattern_compiles_and_positions_are_what_the_server_writes() {
        for pattern in [&LIST_CURSOR, &STEP_CURSOR, &DURATION, &EMAIL] {
            regex::Regex::new(pattern.source).expect(pattern.source);
        }
        assert!(LIST_CURSOR.is_match(&format!("{}_{}", 1_796_688_898.007_f64, "01a2.b_c")));
        assert!(LIST_CURSOR.is_match(&format!("{}_{}", 1e19_f64, "x")));
        for bad in ["1e5_x", "inf_x", "+1_x", ".5_x", "1._x", "1_", "1_a b"] {
            assert!(!LIST_CURSOR.is_match(bad), "{bad}");
        }
        assert!(STEP_CURSOR.is_match("12_1"));
        assert!(!STEP_CURSOR.is_match("1234567890_1"));
        assert!(DURATION.is_match("500ms") && DURATION.is_match("2m"));
        assert!(!DURATION.is_match("1h") && !DURATION.is_match("1234567890123s"));
    }

    #[test]
    fn the_id_pattern_takes_exactly_the_ids_the_runtime_takes() {
        let long = "a".repeat(runtime::ID_CHARS_MAX);
        let too_long = "a".repeat(runtime::ID_CHARS_MAX + 1);
        for text in [
            "a", "A-z_0.9", "...", &long, &too_long, "", "a b", "é", "a/b", "a\n", "%41", "a+b",
        ] {
            assert_eq!(matches(ID_PATTERN, text), runtime::is_id(text), "{text:?}");
        }
    }

    #[test]
    fn the_line_pattern_takes_exactly_the_lines_the_check_takes() {
        let samples = [
            "Evidence review",
            "x",
            " padded ",
            "",
            " ",
            "\u{3000}\u{00a0}",
            "tab\there",
            "new\nline",
            "del\u{7f}",
            "c1\u{85}",
            "rtl \u{202e}override",
            "isolate\u{2066}",
            "mark\u{200f}",
            "arabic mark\u{061c}",
            "zero width\u{200b}joiner",
            "emoji 🦀",
            "\u{feff}bom",
        ];
        for text in samples {
            let by_pattern = matches(line_pattern(), text) && text.chars().count() <= 40;
            assert_eq!(by_pattern, check_line(text, 40).is_ok(), "{text:?}");
        }
        assert!(check_line(&"é".repeat(40), 40).is_ok());
        assert!(check_line(&"é".repeat(41), 40).is_err());
    }

    #[test]
    fn emails_are_ascii_addresses_without_markup_characters() {
        for good in [
            "admin@localhost",
            "first.last+tag@sub.example-x.io",
            "a@b.c",
            "o'brien@example.com".replace('\'', "").as_str(),
        ] {
            assert!(email_shaped(good), "{good}");
        }
        for bad in [
            "",
            "@example.com",
            "a@",
            "a@@b",
            ".a@b.c",
            "a.@b.c",
            "a..b@c.d",
            "a@-b.c",
            "a@b-.c",
            "a@b..c",
            "a b@c.d",
            " a@b.c",
            "<a>@b.c",
            "a\"@b.c",
            "a'@b.c",
            "a/b@c.d",
            "é@b.c",
            "a@bü.c",
        ] {
            assert!(!email_shaped(bad), "{bad}");
        }
        let local = "a".repeat(EMAIL_CHARS_MAX - 4);
        assert!(email_shaped(&format!("{local}@b.c")));
        assert!(!email_shaped(&format!("{local}x@b.c")));
    }
}
