//! `reins watch ID`: a workflow's events as they commit, one line each (`--json`: each event's
//! JSON), from the first. A dropped connection is resumed with `Last-Event-ID`, so nothing is
//! printed twice or missed. It exits when the workflow ends, with `run --wait`'s code for its
//! final status, or when it needs reconciliation (4).

use std::time::Duration;

use anyhow::bail;
use bytes::{Buf, BytesMut};
use http_body_util::BodyExt;
use serde_json::Value;

use super::client::{self, Client};
use super::{EXIT_NEEDS_RECONCILIATION, EXIT_WORKFLOW_FAILED, encode};

/// Connection attempts in a row that bring no event before `watch` gives up.
const RECONNECTS_MAX: u32 = 10;
const RECONNECT_FIRST_DELAY: Duration = Duration::from_millis(200);
const RECONNECT_MAX_DELAY: Duration = Duration::from_secs(5);

/// One event of the stream.
struct Event {
    id: i64,
    data: Value,
}

/// Follows the workflow's events to its end; the number is the exit code.
pub async fn watch(client: &Client, id: &str, json: bool) -> anyhow::Result<u8> {
    let path = format!("/api/v1/workflows/{}/events", encode(id));
    let mut last: Option<i64> = None;
    let mut failures = 0;
    let mut delay = RECONNECT_FIRST_DELAY;
    loop {
        match follow(client, id, &path, &mut last, json).await {
            Ok(Some(code)) => return Ok(code),
            Ok(None) => {}
            Err(Followed::Refused(error)) => return Err(error.into()),
            Err(Followed::Dropped { reason, progressed }) => {
                if progressed {
                    failures = 0;
                    delay = RECONNECT_FIRST_DELAY;
                }
                failures += 1;
                if failures > RECONNECTS_MAX {
                    bail!("the event stream of {id} keeps failing: {reason}");
                }
                eprintln!("{id}: event stream dropped ({reason}); resuming");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RECONNECT_MAX_DELAY);
    }
}

/// How one connection ended without the workflow ending.
enum Followed {
    /// The server refused the stream (unknown workflow, signed out): no use trying again.
    Refused(client::Error),
    /// The connection failed or ended; `progressed` when it brought at least one event.
    Dropped { reason: String, progressed: bool },
}

/// One connection: prints its events; `Some(code)` once the workflow has ended, `None` when
/// the stream ended without that (the node stopped serving).
async fn follow(
    client: &Client,
    id: &str,
    path: &str,
    last: &mut Option<i64>,
    json: bool,
) -> Result<Option<u8>, Followed> {
    let dropped = |reason: String, progressed| Followed::Dropped { reason, progressed };
    let response = client
        .stream(path, *last)
        .await
        .map_err(|e| dropped(e.to_string(), false))?;
    let status = response.status().as_u16();
    let mut body = response.into_body();
    if status >= 300 {
        let bytes = body
            .collect()
            .await
            .map_err(|e| dropped(e.to_string(), false))?
            .to_bytes();
        let answer = client::Answer {
            status,
            headers: hyper::HeaderMap::new(),
            body: bytes,
        };
        return match client::checked(&answer) {
            // A busy or draining node may be another one next time.
            Err(error) if status == 503 => Err(dropped(error.to_string(), false)),
            Err(error) => Err(Followed::Refused(error)),
            Ok(()) => Err(dropped(format!("HTTP {status}"), false)),
        };
    }
    let mut buffer = BytesMut::new();
    let mut progressed = false;
    loop {
        let frame = match body.frame().await {
            Some(Ok(frame)) => frame,
            Some(Err(error)) => return Err(dropped(error.to_string(), progressed)),
            None => return Ok(None),
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        buffer.extend_from_slice(&data);
        while let Some(end) = find(&buffer, b"\n\n") {
            let message = buffer.split_to(end);
            buffer.advance(2);
            let Some(event) = parse(&message) else {
                continue;
            };
            progressed = true;
            *last = Some(event.id);
            print(&event, json);
            if !json && begins_to_wait(&event.data) {
                print_waits(client, id, &event.data).await;
            }
            if let Some(code) = exit_code(&event.data) {
                return Ok(Some(code));
            }
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

/// One SSE message; comments (keep-alives) and messages without an id or JSON data are none.
fn parse(message: &[u8]) -> Option<Event> {
    let text = std::str::from_utf8(message).ok()?;
    let mut id = None;
    let mut data = String::new();
    for line in text.lines() {
        if let Some(value) = line.strip_prefix("id:") {
            id = value.trim().parse().ok();
        } else if let Some(value) = line.strip_prefix("data:") {
            data.push_str(value.trim_start());
        }
    }
    Some(Event {
        id: id?,
        data: serde_json::from_str(&data).ok()?,
    })
}

/// Whether this event tells of a call that begins to wait: a sleep or a `waitForEvent`
/// journaled, an attempt its retry policy queued, a pause or a checkpoint, an agent asking.
fn begins_to_wait(data: &Value) -> bool {
    match data["kind"].as_str() {
        Some("step_journaled") => {
            matches!(data["step_kind"].as_str(), Some("sleep" | "waitForEvent"))
                || !data["retry_due_at_ms"].is_null()
        }
        Some("pause_waiting" | "checkpoint_waiting" | "approval_requested") => true,
        _ => false,
    }
}

/// Prints what the event's step waits for, as the workflow's record says it now (its event
/// carries no due time nor event name): `     nap: sleeping until 09:00 UTC (in 2 h)`. Nothing
/// when it waits no more; a failed read is said and the watch goes on.
async fn print_waits(client: &Client, id: &str, data: &Value) {
    let path = format!("/api/v1/workflows/{}", encode(id));
    let record = match client.json("GET", &path, None).await {
        Ok(record) => record,
        Err(error) => {
            eprintln!("{id}: cannot read what it waits for: {error}");
            return;
        }
    };
    let now = super::waits::now();
    for wait in record["waiting_for"].as_array().into_iter().flatten() {
        if wait["step_id"] == data["step_id"] {
            println!(
                "     {}: {}",
                wait["step_id"].as_str().unwrap_or_default(),
                super::waits::line(wait, now)
            );
        }
    }
}

/// The exit code once this event ends the watch: the workflow's final status, or its need
/// for an operator.
fn exit_code(data: &Value) -> Option<u8> {
    if data["kind"] != "status" {
        return None;
    }
    match data["status"].as_str()? {
        "completed" => Some(0),
        "failed" | "cancelled" => Some(EXIT_WORKFLOW_FAILED),
        "needs_reconciliation" => Some(EXIT_NEEDS_RECONCILIATION),
        _ => None,
    }
}

fn print(event: &Event, json: bool) {
    if json {
        println!("{}", event.data);
        return;
    }
    println!("{}", human(event));
}

/// `  12 14:03:07.250 step_finished step_id=review status=completed duration_ms=41 ...`
fn human(event: &Event) -> String {
    let kind = event.data["kind"].as_str().unwrap_or("event");
    let mut line = format!(
        "{:>4} {} {kind}",
        event.id,
        clock(event.data["at"].as_f64().unwrap_or(0.0))
    );
    if let Some(fields) = event.data.as_object() {
        // The step and the status first, the other fields after them by name.
        let first = ["step_id", "status"];
        let ordered = first
            .iter()
            .filter_map(|key| fields.get_key_value(*key))
            .chain(
                fields
                    .iter()
                    .filter(|(key, _)| !first.contains(&key.as_str())),
            );
        for (key, value) in ordered {
            if matches!(key.as_str(), "id" | "run_id" | "kind" | "at") || value.is_null() {
                continue;
            }
            let value = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            line.push_str(&format!(" {key}={value}"));
        }
    }
    line
}

/// The time of day (UTC) of epoch seconds, to the millisecond.
fn clock(epoch_seconds: f64) -> String {
    let millis = (epoch_seconds * 1000.0).round() as i64;
    let of_day = millis.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1000 % 60,
        of_day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_parse_and_print_on_one_line() {
        let event = parse(
            b"id: 3\nevent: step_finished\ndata: {\"id\":3,\"run_id\":\"w\",\"kind\":\"step_finished\",\"at\":3723.5,\"step_id\":\"a\",\"status\":\"completed\",\"output_bytes\":null}",
        )
        .expect("an event");
        assert_eq!(event.id, 3);
        assert_eq!(
            human(&event),
            "   3 01:02:03.500 step_finished step_id=a status=completed"
        );
        assert!(parse(b": keep-alive").is_none());
        assert_eq!(
            exit_code(&serde_json::json!({"kind": "status", "status": "cancelled"})),
            Some(EXIT_WORKFLOW_FAILED)
        );
        assert_eq!(
            exit_code(&serde_json::json!({"kind": "status", "status": "paused"})),
            None
        );
    }
}
