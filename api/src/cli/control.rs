//! The commands that act on one workflow: answer what it waits for (`resume`, `send`,
//! `approve`, `reject`, `answer`), `cancel`, `recover` and `delete` it.

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::client::Client;
use super::{Common, encode, format_time, get, print_value, text};

/// `reins resume`: resolves the pause at `step` (default: the one that waits) to `input` (JSON;
/// default: null).
pub(super) async fn resume(
    common: &Common,
    client: &Client,
    id: &str,
    step: Option<String>,
    input: Option<String>,
) -> anyhow::Result<u8> {
    let record = get(client, id).await?;
    let step = match step {
        Some(step) => step,
        None => waiting_step(&record, "pause")?,
    };
    let input: Value = match input {
        Some(input) => serde_json::from_str(&input).context("--input is not JSON")?,
        None => Value::Null,
    };
    let body = json!({"fingerprint": record["fingerprint"], "step_id": step,
                      "attempt": attempt_of(&record, &step), "input": input});
    post(common, client, id, "resume", &body).await
}

/// `reins send`: the event `name` with `payload` (JSON; default: {}) under the sender's
/// `event_id`, for the workflow's `waitForEvent` of that name.
pub(super) async fn send_event(
    common: &Common,
    client: &Client,
    id: &str,
    name: &str,
    payload: Option<String>,
    event_id: &str,
) -> anyhow::Result<u8> {
    // Without --payload an event carries `{}`: `null` is what a wait resolves to when its
    // deadline passes, and the API refuses it as a payload.
    let payload: Value = match payload {
        Some(payload) => serde_json::from_str(&payload).context("--payload is not JSON")?,
        None => json!({}),
    };
    let body = json!({"name": name, "event_id": event_id, "payload": payload});
    post(common, client, id, "events", &body).await
}

/// `reins answer`: approves (else rejects) what the agent of `step` asked to do.
pub(super) async fn answer(
    common: &Common,
    client: &Client,
    id: &str,
    step: &str,
    approve: bool,
    comment: Option<String>,
) -> anyhow::Result<u8> {
    let decision = if approve { "approve" } else { "reject" };
    let mut body = json!({"decision": decision});
    if let Some(comment) = comment {
        body["comment"] = json!(comment);
    }
    let path = format!(
        "/api/v1/workflows/{}/steps/{}/answer",
        encode(id),
        encode(step)
    );
    let reply = client.json("POST", &path, Some(&body)).await?;
    print_value(common, &reply, || {
        println!(
            "{id} {step}: request {} {}",
            text(&reply["request_id"]),
            text(&reply["status"])
        );
    });
    Ok(0)
}

/// `reins delete`: deletes a finished workflow and everything it holds.
pub(super) async fn delete(common: &Common, client: &Client, id: &str) -> anyhow::Result<u8> {
    let reply = client
        .json("DELETE", &format!("/api/v1/workflows/{}", encode(id)), None)
        .await?;
    print_value(common, &reply, || println!("deleted {id}"));
    Ok(0)
}

/// Posts `action` (`resume`, `events`, `decide`, `cancel`, `recover`) with `body` to the
/// workflow and prints its status, and on stderr what a repeat found done already.
pub(super) async fn post(
    common: &Common,
    client: &Client,
    id: &str,
    action: &str,
    body: &Value,
) -> anyhow::Result<u8> {
    let path = format!("/api/v1/workflows/{}/{action}", encode(id));
    let reply = client.json("POST", &path, Some(body)).await?;
    print_value(common, &reply, || {
        println!("{id}: {}", text(&reply["status"]));
        if reply["repeated"] == json!(true) && action == "events" {
            let taken = match reply["taken_by"].as_str() {
                Some(step) => format!(", and step {step} took it"),
                None => ", and no wait has taken it yet".to_owned(),
            };
            eprintln!(
                "{id}: event {} was sent already by {}{taken}; this repeat changes nothing",
                text(&reply["event_id"]),
                reply["sent_by"].as_str().unwrap_or("an earlier request"),
            );
        } else if reply["repeated"] == json!(true) {
            eprintln!(
                "{id}: already {} by {} at {}; this repeat changes nothing",
                text(&reply["status"]),
                reply["recorded_by"]
                    .as_str()
                    .unwrap_or("an earlier request"),
                format_time(&reply["recorded_at"])
            );
        }
    });
    Ok(0)
}

/// `reins approve` and `reins reject`: decides the checkpoint at `step` (default: the one that
/// waits), on the artifact version it waits on.
pub(super) async fn decide(
    common: &Common,
    client: &Client,
    id: &str,
    step: Option<String>,
    comment: Option<String>,
    decision: &str,
) -> anyhow::Result<u8> {
    let record = get(client, id).await?;
    let step = match step {
        Some(step) => step,
        None => waiting_step(&record, "humanCheckpoint")?,
    };
    let checkpoint = record["checkpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["step_id"] == step.as_str())
        .with_context(|| format!("workflow {id} has no checkpoint {step:?}"))?;
    let mut body = json!({"step_id": step, "attempt": checkpoint["attempt"],
                          "artifact_version": checkpoint["artifact_version"], "decision": decision});
    if let Some(comment) = comment {
        body["comment"] = json!(comment);
    }
    post(common, client, id, "decide", &body).await
}

/// The step of the one checkpoint of `kind` that waits. When none does, the error says what the
/// workflow waits for instead and which command answers it, and which checkpoints of `kind` were
/// answered already, by whom.
fn waiting_step(record: &Value, kind: &str) -> anyhow::Result<String> {
    let checkpoints = || record["checkpoints"].as_array().into_iter().flatten();
    if let Some(step) = checkpoints()
        .filter(|c| c["kind"] == kind && c["status"] == "waiting")
        .map(|c| text(&c["step_id"]))
        .next_back()
    {
        return Ok(step);
    }
    let id = text(&record["run_id"]);
    let mut why = format!(
        "workflow {id} waits at no {kind} (it is {})",
        text(&record["status"])
    );
    for answered in checkpoints().filter(|c| c["kind"] == kind && c["status"] != "waiting") {
        why.push_str(&format!(
            "; {kind} {:?} was already {} by {}",
            text(&answered["step_id"]),
            text(&answered["status"]),
            answered["decided_by"].as_str().unwrap_or("someone")
        ));
        if answered["decided_at"].is_number() {
            why.push_str(&format!(" at {}", format_time(&answered["decided_at"])));
        }
    }
    for waiting in checkpoints().filter(|c| c["status"] == "waiting") {
        let step = text(&waiting["step_id"]);
        let answer = if waiting["kind"] == "pause" {
            format!("reins resume {id} --step {step} --input JSON")
        } else {
            format!("reins approve {id} --step {step} (or reins reject)")
        };
        why.push_str(&format!(
            "; it waits at {} {step:?}: answer it with `{answer}`",
            text(&waiting["kind"])
        ));
    }
    let asking = record["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|step| step["status"] == "waiting_for_input");
    for step in asking {
        let step = text(&step["step_id"]);
        why.push_str(&format!(
            "; its agent step {step:?} asks for approval: answer it with \
             `reins answer {id} {step} --approve` (or --reject)"
        ));
    }
    bail!("{why}; or name a step with --step")
}

/// The attempt of the checkpoint at `step` (1 when the record names none).
fn attempt_of(record: &Value, step: &str) -> Value {
    record["checkpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["step_id"] == step)
        .map_or(json!(1), |c| c["attempt"].clone())
}
