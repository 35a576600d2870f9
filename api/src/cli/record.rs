//! A workflow's record as `reins get` (and `run --wait`) prints it for people: its fields, then
//! its steps, artifact versions and checkpoints as tables, then what each step's agent asks.

use std::collections::HashMap;

use serde_json::Value;

use super::{cells, format_time, inbox, print_table, rows, text, waits};

/// The whole record, block by block, its owner named from `names`.
pub(super) fn print_record(record: &Value, names: &HashMap<String, String>) {
    print_fields(record, names);
    print_steps(record);
    print_artifacts(record);
    print_checkpoints(record);
    print_approvals(record);
}

/// One line of the record's fields: its name, padded, then its value.
fn field(name: &str, value: String) {
    println!("{name:<14} {value}");
}

/// The record's fields: what it is, what it waits for, why it needs reconciliation, whose it is
/// and how it ended, each only when it has one.
fn print_fields(record: &Value, names: &HashMap<String, String>) {
    field("run id", text(&record["run_id"]));
    if !record["title"].is_null() {
        field("title", text(&record["title"]));
    }
    field("status", text(&record["status"]));
    let now = waits::now();
    for wait in record["waiting_for"].as_array().into_iter().flatten() {
        field(
            "waiting",
            format!("{}: {}", text(&wait["step_id"]), waits::line(wait, now)),
        );
    }
    print_reconciliation(record);
    // The person the workflow is for, and the node that runs it (the record's `owner`).
    field("owner", cells::owner_name(names, &record["user_id"]));
    field("node", text(&record["owner"]));
    field("epoch", text(&record["epoch"]));
    field("created", format_time(&record["created_at"]));
    if !record["result"].is_null() {
        field("result", record["result"].to_string());
    }
    if !record["error"].is_null() {
        field("error", text(&record["error"]));
    }
    if !record["retry_of"].is_null() {
        field("retry of", text(&record["retry_of"]));
    }
    if !record["retried_by"].is_null() {
        field("retried by", text(&record["retried_by"]));
    }
}

/// Why the workflow needs reconciliation, and the command that settles it (when it does).
fn print_reconciliation(record: &Value) {
    let why = &record["reconciliation"];
    if why.is_null() {
        return;
    }
    field(
        "why",
        format!(
            "{}: {}",
            text(&why["reason"]),
            inbox::printable(&text(&why["message"]))
        ),
    );
    field(
        "settle with",
        format!(
            "reins reconcile {} --step {} --retry|--fail|--complete JSON --reason TEXT \
             (admins, after checking what child run {} did)",
            text(&record["run_id"]),
            text(&why["step_id"]),
            text(&why["run_id"])
        ),
    );
}

/// The steps' table (each attempt's wait and run apart, its error cut to the line), then who
/// reconciled which attempt, how and why.
fn print_steps(record: &Value) {
    let steps = rows(&record["steps"], |s| {
        vec![
            text(&s["step_id"]),
            text(&s["kind"]),
            text(&s["attempt"]),
            text(&s["status"]),
            cells::duration_ms(&s["waited_ms"]),
            cells::duration_ms(&s["ran_ms"]),
            text(&s["run_id"]),
            text(&s["artifact_version"]),
            s["error"].as_str().unwrap_or("-").to_owned(),
        ]
    });
    let headers = [
        "STEP",
        "KIND",
        "ATTEMPT",
        "STATUS",
        "WAITED",
        "RAN",
        "CHILD RUN",
        "ARTIFACT",
        "ERROR",
    ];
    print_block(&headers, &cut_last_column(&headers, steps));
    for step in record["steps"].as_array().into_iter().flatten() {
        let reconciled = &step["reconciled"];
        if !reconciled.is_null() {
            println!(
                "{} attempt {}: reconciled by {} ({}): {}",
                text(&step["step_id"]),
                text(&step["attempt"]),
                text(&reconciled["by"]),
                text(&reconciled["resolution"]),
                inbox::printable(&text(&reconciled["reason"]))
            );
        }
    }
}

/// The artifact versions' table, when there is one.
fn print_artifacts(record: &Value) {
    let artifacts = rows(&record["artifacts"], |a| {
        texts(a, &["version", "step_id", "name", "bytes", "media_type"])
    });
    print_block(&["ARTIFACT", "STEP", "NAME", "BYTES", "TYPE"], &artifacts);
}

/// The checkpoints' table, then each one's message and its decider's comment.
fn print_checkpoints(record: &Value) {
    let checkpoints = rows(&record["checkpoints"], |c| {
        texts(
            c,
            &[
                "step_id",
                "kind",
                "status",
                "artifact_version",
                "decided_by",
            ],
        )
    });
    print_block(
        &["CHECKPOINT", "KIND", "STATUS", "ARTIFACT", "BY"],
        &checkpoints,
    );
    for checkpoint in record["checkpoints"].as_array().into_iter().flatten() {
        let step = text(&checkpoint["step_id"]);
        if let Some(message) = checkpoint["message"].as_str() {
            println!("{step}: message: {}", inbox::printable(message));
        }
        if let Some(comment) = checkpoint["comment"].as_str() {
            println!(
                "{step}: {} commented: {}",
                text(&checkpoint["decided_by"]),
                inbox::printable(comment)
            );
        }
    }
}

/// Each step whose agent asked for approval: waiting (with the command that answers it) or
/// answered (how, by whom), the actions it asks to do, and the answer's comment.
fn print_approvals(record: &Value) {
    for step in record["steps"].as_array().into_iter().flatten() {
        let approval = &step["approval"];
        if approval.is_null() {
            continue;
        }
        let answer = &approval["answer"];
        let state = if approval["status"] == "waiting" {
            format!(
                "asks for approval: answer with `reins answer {} {} --approve` (or --reject)",
                text(&record["run_id"]),
                text(&step["step_id"])
            )
        } else {
            format!(
                "asked, and was answered {} by {}",
                text(&answer["decision"]),
                text(&answer["by"])
            )
        };
        println!();
        println!(
            "{}: its agent {state}; it asks to do:",
            text(&step["step_id"])
        );
        for line in inbox::actions(&approval["actions"]) {
            println!("  {line}");
        }
        if let Some(comment) = answer["comment"].as_str() {
            println!("  comment: {}", inbox::printable(comment));
        }
    }
}

/// The text of each of `keys` of `item`, a row's cells.
fn texts(item: &Value, keys: &[&str]) -> Vec<String> {
    keys.iter().map(|key| text(&item[*key])).collect()
}

/// A table after a blank line, when it has rows.
fn print_block(headers: &[&str], rows: &[Vec<String>]) {
    if !rows.is_empty() {
        println!();
        print_table(headers, rows);
    }
}

/// `rows` with their last cell on one line and cut to the room the other columns leave (see
/// [`cells::room_after`]): a long error never wraps a table.
fn cut_last_column(headers: &[&str], mut rows: Vec<Vec<String>>) -> Vec<Vec<String>> {
    let others = headers.len().saturating_sub(1);
    let used: usize = (0..others)
        .map(|column| {
            rows.iter()
                .filter_map(|row| row.get(column))
                .map(|cell| cell.chars().count())
                .chain(headers.get(column).map(|header| header.len()))
                .max()
                .unwrap_or(0)
                + 2
        })
        .sum();
    let room = cells::room_after(used);
    for row in &mut rows {
        if let Some(last) = row.get_mut(others) {
            *last = cells::cut(last, room);
        }
    }
    rows
}
