//! What a waiting workflow waits for, as people read it: a record's or a listing's
//! `waiting_for` as one line per call (`sleeping until 09:00 UTC (in 2 h 10 min)`, `waiting for
//! event payment.received (deadline in 1 day)`, `waiting for a person`, `waiting for a slot`,
//! `retrying at 17:26:15 UTC (attempt 3 of 5)`), for `list`, `get` and `watch`. Times are UTC,
//! as everywhere in the CLI; a time of another day than now names its date.

use serde_json::Value;

use super::inbox::printable;

/// Epoch seconds now, by this machine's clock (what "in 2 h" counts from).
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |now| now.as_secs_f64())
}

/// Every wait of `waiting_for` (a record's or a listing's), each on its own line of the
/// answer, in the API's order; empty when the workflow waits for nothing.
pub fn lines(waiting_for: &Value, now: f64) -> Vec<String> {
    waiting_for
        .as_array()
        .into_iter()
        .flatten()
        .map(|wait| line(wait, now))
        .collect()
}

/// One wait as a person reads it.
pub fn line(wait: &Value, now: f64) -> String {
    let deadline = |wait: &Value| {
        wait["deadline"].as_f64().map_or_else(String::new, |at| {
            format!(" (deadline {})", relative(at, now))
        })
    };
    match wait["kind"].as_str().unwrap_or_default() {
        "sleep" => {
            let until = wait["until"].as_f64().unwrap_or(now);
            format!(
                "sleeping until {} ({})",
                clock(until, now),
                relative(until, now)
            )
        }
        "event" => format!(
            "waiting for event {}{}",
            printable(wait["name"].as_str().unwrap_or_default()),
            deadline(wait)
        ),
        "person" => format!("waiting for a person{}", deadline(wait)),
        "slot" => "waiting for a slot".to_owned(),
        "retry" => {
            let of = wait["max_attempts"]
                .as_u64()
                .map_or_else(String::new, |max| format!(" of {max}"));
            format!(
                "retrying at {} (attempt {}{of})",
                clock(wait["at"].as_f64().unwrap_or(now), now),
                wait["attempt"]
            )
        }
        other => format!("waiting ({})", printable(other)),
    }
}

/// A time people read beside now: `09:00 UTC` (seconds when not whole minutes) on today's
/// date, with its date on another day.
fn clock(at: f64, now: f64) -> String {
    let (at_text, now_text) = (store::rfc3339_utc(at), store::rfc3339_utc(now));
    let (date, time) = (&at_text[..10], &at_text[11..19]);
    let time = time.strip_suffix(":00").unwrap_or(time);
    if date == &now_text[..10] {
        format!("{time} UTC")
    } else {
        format!("{date} {time} UTC")
    }
}

/// `in 2 h 10 min` for a time after now, `5 s ago` for one before.
fn relative(at: f64, now: f64) -> String {
    if at >= now {
        format!("in {}", duration(at - now))
    } else {
        format!("{} ago", duration(now - at))
    }
}

/// A length of time in its two largest units, whole: `42 s`, `5 min 3 s`, `2 h 10 min`,
/// `1 day`, `3 days 2 h` (a unit that is 0 after the first is left out).
pub fn duration(seconds: f64) -> String {
    let total = seconds.max(0.0).round() as u64;
    let (days, hours, minutes, secs) = (
        total / 86_400,
        total % 86_400 / 3600,
        total % 3600 / 60,
        total % 60,
    );
    let two = |first: String, second: u64, unit: &str| {
        if second == 0 {
            first
        } else {
            format!("{first} {second} {unit}")
        }
    };
    if days > 0 {
        let first = format!("{days} day{}", if days == 1 { "" } else { "s" });
        two(first, hours, "h")
    } else if hours > 0 {
        two(format!("{hours} h"), minutes, "min")
    } else if minutes > 0 {
        two(format!("{minutes} min"), secs, "s")
    } else {
        format!("{secs} s")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// 2026-12-01T06:50:00Z.
    const NOW: f64 = 1_796_107_800.0;

    #[test]
    fn each_wait_reads_as_a_person_says_it() {
        let read = |wait: Value| line(&wait, NOW);
        assert_eq!(
            read(json!({"kind": "sleep", "step_id": "nap", "until": NOW + 7800.0})),
            "sleeping until 09:00 UTC (in 2 h 10 min)"
        );
        assert_eq!(
            read(
                json!({"kind": "event", "step_id": "paid", "name": "payment.received",
                        "deadline": NOW + 86_400.0})
            ),
            "waiting for event payment.received (deadline in 1 day)"
        );
        assert_eq!(
            read(json!({"kind": "event", "step_id": "paid", "name": "x", "deadline": null})),
            "waiting for event x"
        );
        assert_eq!(
            read(json!({"kind": "person", "step_id": "ok", "call": "pause", "deadline": null})),
            "waiting for a person"
        );
        assert_eq!(
            read(json!({"kind": "slot", "step_id": "a", "attempt": 1})),
            "waiting for a slot"
        );
        assert_eq!(
            read(
                json!({"kind": "retry", "step_id": "a", "at": NOW + 37_575.0, "attempt": 3,
                        "max_attempts": 5})
            ),
            "retrying at 17:16:15 UTC (attempt 3 of 5)"
        );
        assert_eq!(
            read(
                json!({"kind": "retry", "step_id": "a", "at": NOW + 86_400.0, "attempt": 2,
                        "max_attempts": null})
            ),
            "retrying at 2026-12-02 06:50 UTC (attempt 2)"
        );
        assert_eq!(
            read(json!({"kind": "sleep", "step_id": "nap", "until": NOW - 3.0})),
            "sleeping until 06:49:57 UTC (3 s ago)"
        );
    }

    #[test]
    fn durations_keep_their_two_largest_units() {
        assert_eq!(duration(0.4), "0 s");
        assert_eq!(duration(42.0), "42 s");
        assert_eq!(duration(303.0), "5 min 3 s");
        assert_eq!(duration(600.0), "10 min");
        assert_eq!(duration(7800.0), "2 h 10 min");
        assert_eq!(duration(86_400.0), "1 day");
        assert_eq!(duration(3.0 * 86_400.0 + 7200.0 + 59.0), "3 days 2 h");
    }
}
