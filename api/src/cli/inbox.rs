//! `reins inbox`: what waits for the caller (a pause, a checkpoint, an agent's request), oldest
//! first, each with its workflow's title and run id, what it is about and the command that
//! answers it; and how an agent's requested actions read in a terminal, which `reins get` shares.
//!
//! Everything shown here was written by someone else (a script's message, an agent's actions, a
//! person's comment): control characters are escaped, so no stored text can move the cursor,
//! recolour or retitle the terminal.

use serde_json::Value;

use super::client::Client;
use super::{Common, format_time, print_value, text};

/// Keys under which an agent usually names what an action does.
const NAME_KEYS: [&str; 4] = ["tool", "name", "action", "type"];
/// Keys under which an agent usually puts an action's arguments, shown as the action's own.
const ARGUMENT_KEYS: [&str; 4] = ["args", "arguments", "input", "parameters"];

/// Prints the inbox: one block per item.
pub async fn inbox(common: &Common, client: &Client) -> anyhow::Result<u8> {
    let inbox = client.json("GET", "/api/v1/inbox", None).await?;
    print_value(common, &inbox, || {
        let items = inbox["items"].as_array().map_or(&[][..], Vec::as_slice);
        if items.is_empty() {
            println!("nothing waits for you");
        }
        for (n, item) in items.iter().enumerate() {
            if n > 0 {
                println!();
            }
            print_item(item);
        }
        if inbox["more"] == Value::Bool(true) {
            println!("\nmore workflows wait than the inbox reads at once; answer these first");
        }
        for id in inbox["unreadable"].as_array().into_iter().flatten() {
            println!("left out: {} (its record cannot be read)", text(id));
        }
    });
    Ok(0)
}

fn print_item(item: &Value) {
    let id = text(&item["run_id"]);
    let step = text(&item["step_id"]);
    let named = match item["title"].as_str() {
        Some(title) => format!("{} ({id})", printable(title)),
        None => id.clone(),
    };
    let (what, answer) = match item["kind"].as_str() {
        Some("pause") => (
            "paused".to_owned(),
            format!("reins resume {id} --step {step} --input JSON"),
        ),
        Some("humanCheckpoint") => (
            format!(
                "checkpoint on artifact version {}",
                text(&item["artifact_version"])
            ),
            format!("reins approve {id} --step {step} (or reins reject)"),
        ),
        Some("agent_request") => (
            "its agent asks for approval".to_owned(),
            format!("reins answer {id} {step} --approve (or --reject)"),
        ),
        _ => (text(&item["kind"]), String::new()),
    };
    let overdue = if item["overdue"] == Value::Bool(true) {
        " [overdue]"
    } else {
        ""
    };
    println!("{named}{overdue}");
    println!(
        "  {what} at step {step} (attempt {}), waiting since {}",
        text(&item["attempt"]),
        format_time(&item["since"])
    );
    if !item["remind_at"].is_null() {
        let when = if overdue.is_empty() {
            "reminder at"
        } else {
            "overdue since"
        };
        println!("  {when} {}", format_time(&item["remind_at"]));
    }
    if !item["deadline_at"].is_null() {
        println!(
            "  deadline {}: unanswered by then, its timeout decides it",
            format_time(&item["deadline_at"])
        );
    }
    if item["recoverable"] == Value::Bool(true) {
        println!(
            "  warning: no node runs this workflow (recoverable): an answer is recorded now and \
             applied when a node takes it over (reins recover {id})"
        );
    }
    if let Some(message) = item["message"].as_str() {
        println!("  message: {}", printable(message));
    }
    if !item["approval"]["actions"].is_null() {
        println!("  it asks to do:");
        for line in actions(&item["approval"]["actions"]) {
            println!("    {line}");
        }
    }
    if !answer.is_empty() {
        println!("  answer: {answer}");
    }
}

/// An agent's requested actions, one line each, numbered: `1. deploy: target prod, version
/// 1.2`. An action that is an object is named by its `tool` (or `name`, `action`, `type`), and
/// its other fields, with those of its `args` (or `arguments`, `input`, `parameters`) object,
/// follow as `key value` pairs; a text is shown as it is; anything else as JSON.
pub fn actions(actions: &Value) -> Vec<String> {
    let list = match actions {
        Value::Array(list) => list.as_slice(),
        Value::Null => &[],
        one => std::slice::from_ref(one),
    };
    list.iter()
        .enumerate()
        .map(|(n, action)| format!("{}. {}", n + 1, action_line(action)))
        .collect()
}

fn action_line(action: &Value) -> String {
    let Value::Object(fields) = action else {
        return value_text(action);
    };
    let name = NAME_KEYS
        .iter()
        .find_map(|key| fields.get(*key).and_then(Value::as_str).map(|n| (*key, n)));
    let mut pairs = Vec::new();
    for (key, value) in fields {
        if name.is_some_and(|(name_key, _)| name_key == key) {
            continue;
        }
        match value {
            Value::Object(arguments) if ARGUMENT_KEYS.contains(&key.as_str()) => pairs.extend(
                arguments
                    .iter()
                    .map(|(key, value)| format!("{} {}", printable(key), value_text(value))),
            ),
            value => pairs.push(format!("{} {}", printable(key), value_text(value))),
        }
    }
    match (name, pairs.is_empty()) {
        (Some((_, name)), true) => printable(name),
        (Some((_, name)), false) => format!("{}: {}", printable(name), pairs.join(", ")),
        (None, _) => pairs.join(", "),
    }
}

/// A value as a line shows it: a text as it is (control characters escaped), anything else as
/// compact JSON.
fn value_text(value: &Value) -> String {
    match value {
        Value::String(text) => printable(text),
        other => other.to_string(),
    }
}

/// `text` with its control characters escaped (`\n`, `\u{1b}`), so that it prints as one line
/// and cannot drive the terminal.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_debug().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn actions_read_as_one_numbered_line_each_with_their_arguments() {
        assert_eq!(
            actions(&json!([
                {"tool": "deploy", "target": "prod"},
                {"name": "write_file", "arguments": {"path": "/tmp/x", "bytes": 12}},
                {"tool": "shell"},
                "delete the branch",
                {"what": [1, 2]},
                7
            ])),
            [
                "1. deploy: target prod",
                "2. write_file: bytes 12, path /tmp/x",
                "3. shell",
                "4. delete the branch",
                "5. what [1,2]",
                "6. 7",
            ]
        );
        assert_eq!(actions(&json!({"tool": "deploy"})), ["1. deploy"]);
        assert!(actions(&Value::Null).is_empty());
    }

    #[test]
    fn stored_text_cannot_drive_the_terminal() {
        assert_eq!(
            actions(&json!([{"tool": "rm\u{1b}[2J", "path": "a\nb"}])),
            ["1. rm\\u{1b}[2J: path a\\nb"]
        );
        assert_eq!(printable("plain title"), "plain title");
    }
}
