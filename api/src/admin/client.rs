//! `reins admin [--socket PATH] COMMAND`: one request over the node's admin socket, printed as
//! tables for people or as the raw JSON answer with `--json`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Options of `reins admin`.
#[derive(Debug, clap::Args)]
pub struct AdminArgs {
    /// The node's admin socket.
    #[arg(
        long,
        env = "REINS_ADMIN_SOCKET",
        default_value = "reins-data/admin.sock"
    )]
    pub socket: PathBuf,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum AdminCommand {
    /// The node: id, versions, uptime, backend, its workflows and child runs by status.
    Status,
    /// The workflows this node owns, with epoch and lease time left.
    Workflows,
    /// Every lease this node renews.
    Leases,
    /// Child slots held across the cluster.
    Slots,
    /// The live supervision tree.
    Actors,
    /// Stop taking launches and recoveries; running workflows go on.
    Drain,
    /// The effective configuration, secrets redacted.
    Config,
    /// Give up one workflow's lease now, so another node can recover it.
    Fence { run_id: String },
    /// Workflows across the cluster that wait for an operator's reconcile, with the reason.
    Reconciliations,
    /// Copy the embedded database, as of one moment, into FILE (a new file), through the node.
    Backup { file: PathBuf },
}

/// Sends one command and prints the answer; `Ok(1)` when the node refused it.
pub async fn run(args: AdminArgs, json_output: bool) -> anyhow::Result<u8> {
    let request = match &args.command {
        AdminCommand::Fence { run_id } => json!({"command": "fence", "run_id": run_id}),
        AdminCommand::Backup { file } => {
            // The node writes the file: it needs the path as this shell means it.
            let file = std::path::absolute(file)
                .with_context(|| format!("cannot resolve {}", file.display()))?;
            json!({"command": "backup", "path": file})
        }
        other => json!({"command": name(other)}),
    };
    let stream = UnixStream::connect(&args.socket).await.with_context(|| {
        format!(
            "cannot reach the admin socket {} (is the node running? --socket or REINS_ADMIN_SOCKET)",
            args.socket.display()
        )
    })?;
    let (reader, mut writer) = stream.into_split();
    writer
        .write_all(format!("{request}\n").as_bytes())
        .await
        .context("cannot send the command")?;
    let mut line = String::new();
    BufReader::new(reader)
        .read_line(&mut line)
        .await
        .context("cannot read the answer")?;
    let answer: Value = serde_json::from_str(&line).context("the answer is not JSON")?;
    if answer["ok"] != true {
        bail!(
            "{}",
            answer["error"]
                .as_str()
                .unwrap_or("the node refused the command")
        );
    }
    let result = &answer["result"];
    if json_output {
        println!("{result}");
    } else {
        print_human(&args.command, result);
    }
    Ok(0)
}

fn name(command: &AdminCommand) -> &'static str {
    match command {
        AdminCommand::Status => "status",
        AdminCommand::Workflows => "workflows",
        AdminCommand::Leases => "leases",
        AdminCommand::Slots => "slots",
        AdminCommand::Actors => "actors",
        AdminCommand::Drain => "drain",
        AdminCommand::Config => "config",
        AdminCommand::Fence { .. } => "fence",
        AdminCommand::Reconciliations => "reconciliations",
        AdminCommand::Backup { .. } => "backup",
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn rows(value: &Value, fields: &[&str]) -> Vec<Vec<String>> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| fields.iter().map(|f| text(&item[*f])).collect())
        .collect()
}

fn print_human(command: &AdminCommand, result: &Value) {
    use crate::cli::print_table;
    match command {
        AdminCommand::Status => {
            for key in [
                "worker_id",
                "version",
                "runtime_version",
                "configuration_version",
                "uptime_seconds",
                "backend",
                "schema_version",
                "draining",
            ] {
                println!("{key:<22} {}", text(&result[key]));
            }
            for (title, key) in [("WORKFLOWS", "workflows"), ("CHILD RUNS", "child_runs")] {
                println!();
                print_table(&[title, "COUNT"], &rows(&result[key], &["status", "count"]));
            }
        }
        AdminCommand::Workflows => print_table(
            &["RUN ID", "STATUS", "EPOCH", "LEASE LEFT MS"],
            &rows(result, &["run_id", "status", "epoch", "lease_remaining_ms"]),
        ),
        AdminCommand::Leases => print_table(
            &[
                "RESOURCE", "KIND", "EPOCH", "LEFT MS", "RENEWING", "REFUSED",
            ],
            &rows(
                result,
                &[
                    "resource_id",
                    "kind",
                    "epoch",
                    "remaining_ms",
                    "renewing",
                    "refused",
                ],
            ),
        ),
        AdminCommand::Slots => {
            println!(
                "{} of {} slots held",
                text(&result["held"]),
                text(&result["max_active_children"])
            );
            print_table(
                &["WORKFLOW", "STEP", "ATTEMPT"],
                &rows(&result["slots"], &["workflow_id", "step_id", "attempt"]),
            );
        }
        AdminCommand::Actors => {
            let mut lines = Vec::new();
            tree(result, 0, &mut lines);
            print_table(&["ACTOR", "STATUS", "QUEUE", "RESTARTS"], &lines);
        }
        AdminCommand::Drain => println!("draining: no new launches or recoveries"),
        AdminCommand::Config => println!(
            "{}",
            serde_json::to_string_pretty(result).unwrap_or_default()
        ),
        AdminCommand::Fence { run_id } => println!(
            "{run_id}: lease given up at epoch {}",
            text(&result["released_epoch"])
        ),
        AdminCommand::Backup { .. } => println!(
            "backed up to {} ({} bytes, schema version {})",
            text(&result["path"]),
            text(&result["bytes"]),
            text(&result["schema_version"])
        ),
        AdminCommand::Reconciliations => {
            let lines: Vec<Vec<String>> = result
                .as_array()
                .into_iter()
                .flatten()
                .map(|item| {
                    let why = &item["reconciliation"];
                    vec![
                        text(&item["run_id"]),
                        text(&why["step_id"]),
                        text(&why["run_id"]),
                        text(&why["reason"]),
                    ]
                })
                .collect();
            print_table(&["WORKFLOW", "STEP", "CHILD RUN", "REASON"], &lines);
        }
    }
}

fn tree(actor: &Value, depth: usize, lines: &mut Vec<Vec<String>>) {
    let queue = format!(
        "{} waiting, {} running",
        text(&actor["queue"]["waiting"]),
        text(&actor["queue"]["running"])
    );
    lines.push(vec![
        format!("{}{}", "  ".repeat(depth), text(&actor["name"])),
        text(&actor["status"]),
        queue,
        text(&actor["restarts"]),
    ]);
    for child in actor["children"].as_array().into_iter().flatten() {
        tree(child, depth + 1, lines);
    }
}
