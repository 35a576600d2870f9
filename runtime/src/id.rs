//! The one grammar of the ids people and scripts name: a workflow's `run_id`, a `request_id`, a
//! `stepId`. The script API checks step ids with it when the script makes a call, and the HTTP
//! layer checks every id it is given with it, so that a step a script can name is a step the
//! control plane can answer (`reins approve`, `resume`, `reconcile`).

/// An id's length at most, in characters (all ASCII).
pub const ID_CHARS_MAX: usize = 128;

/// The grammar, as error messages state it.
pub const ID_GRAMMAR: &str = "1 to 128 of A-Z, a-z, 0-9, '-', '_', '.'";

/// Whether `text` is an id: 1 to [`ID_CHARS_MAX`] of ASCII letters, digits, `-`, `_` and `.`.
pub fn is_id(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= ID_CHARS_MAX
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}
