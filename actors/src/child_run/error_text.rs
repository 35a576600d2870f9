//! An agent's error text as it is kept: cut at ingest to `limits.error_bytes_max`, before the
//! run's terminal write, so that every copy made of it afterwards (the run's row, the attempt's
//! `StepError`, the next attempt's retry reason, its event and log line) is bounded by the same
//! named limit whatever the agent (a hostile provider's 4 MB error body included) answered.

/// `message` if it fits in `bytes_max` bytes; otherwise its head, cut at a character boundary,
/// and a note of its whole length, together at most `bytes_max` bytes (the note alone if even
/// it does not fit).
pub(crate) fn kept_error(message: String, bytes_max: usize) -> String {
    if message.len() <= bytes_max {
        return message;
    }
    let note = format!(
        "… (an error of {} bytes, cut to limits.error_bytes_max)",
        message.len()
    );
    let head = bytes_max.saturating_sub(note.len());
    let head = message.floor_char_boundary(head);
    format!("{}{note}", &message[..head])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_within_its_bound_is_kept_whole_and_a_longer_one_is_cut_at_a_character() {
        assert_eq!(kept_error("short".into(), 5), "short");
        let long = "é".repeat(3_000);
        let kept = kept_error(long.clone(), 4_096);
        assert!(kept.len() <= 4_096, "{}", kept.len());
        assert!(kept.starts_with("éé"));
        assert!(
            kept.ends_with("… (an error of 6000 bytes, cut to limits.error_bytes_max)"),
            "{kept}"
        );
        // A bound smaller than the note keeps the note.
        assert!(kept_error(long, 10).starts_with("… (an error of 6000 bytes"));
    }
}
