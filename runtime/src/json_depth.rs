//! One bound on how deeply a JSON value may nest, for every value that enters reins: a request
//! body, a script's call arguments and result, an agent's output. The store keeps such values
//! inside documents of its own (a step's outcome inside the step, the step inside the record) and
//! every reader parses them with `serde_json`, which refuses more than 128 levels. A value
//! accepted at [`JSON_DEPTH_MAX`] levels leaves room for that wrapping, so whatever was stored can
//! always be read back. The bound is not configurable: raising it would let a stored value outgrow
//! its readers.
//!
//! The depth is measured on the JSON text, before anything is parsed, so the same check serves
//! every typed body and line.

/// How many arrays and objects may nest at most in a value that enters reins.
pub const JSON_DEPTH_MAX: usize = 64;

/// The deepest nesting of arrays and objects in the JSON text `text` (0 for a scalar). Text that
/// is not JSON still gets a number; the parser that follows says what is wrong with it.
pub fn text_depth(text: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in text {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Refuses JSON text nested deeper than [`JSON_DEPTH_MAX`], with a message that names `what`.
pub fn check_text_depth(text: &[u8], what: &str) -> Result<(), String> {
    let depth = text_depth(text);
    if depth > JSON_DEPTH_MAX {
        Err(format!(
            "{what} nests {depth} levels of arrays and objects, over the limit of \
             {JSON_DEPTH_MAX}"
        ))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_arrays_and_objects_outside_strings() {
        assert_eq!(text_depth(b"1"), 0);
        assert_eq!(text_depth(b"\"[[[{{\""), 0);
        assert_eq!(text_depth(br#"{"a": [1, {"b": "]]\"[["}], "c": []}"#), 3);
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(text_depth(nested(124).as_bytes()), 124);
        assert!(check_text_depth(nested(JSON_DEPTH_MAX).as_bytes(), "v").is_ok());
        let over = check_text_depth(nested(JSON_DEPTH_MAX + 1).as_bytes(), "the output");
        assert_eq!(
            over,
            Err("the output nests 65 levels of arrays and objects, over the limit of 64".into())
        );
    }

    /// What the bound is for: a value at the bound, wrapped as deeply as any reader wraps it
    /// (and then some), still parses.
    #[test]
    fn a_value_at_the_bound_still_parses_inside_any_stored_document() {
        let value = format!(
            "{}{}",
            "[".repeat(JSON_DEPTH_MAX),
            "]".repeat(JSON_DEPTH_MAX)
        );
        let wrapped = format!("{}{value}{}", "{\"w\":".repeat(60), "}".repeat(60));
        assert!(serde_json::from_str::<serde_json::Value>(&wrapped).is_ok());
    }
}
