//! `reins reconcile`: settles the uncertain step of one workflow, or of every workflow that needs
//! reconciliation (`--all`), after the operator checked what its child run really did.

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::client::Client;
use super::{Common, encode, get, print_table, print_value, rows, text};

/// How the uncertain step is settled: `retry`, `fail` or `complete` (with `output`).
pub(super) struct Resolution {
    how: &'static str,
    output: Option<Value>,
}

/// How `--retry`, `--fail` or `--complete JSON` settles the step, and the output `--complete`
/// gives it.
pub(super) fn resolution(
    retry: bool,
    fail: bool,
    complete: Option<&str>,
) -> anyhow::Result<Resolution> {
    let (how, output) = match (retry, fail, complete) {
        (true, _, _) => ("retry", None),
        (_, true, _) => ("fail", None),
        (_, _, Some(output)) => (
            "complete",
            Some(serde_json::from_str::<Value>(output).context("--complete is not JSON")?),
        ),
        _ => bail!("say how to settle it: --retry, --fail or --complete JSON"),
    };
    Ok(Resolution { how, output })
}

/// `reins reconcile`: settles workflow `id` (none: every one that needs reconciliation) at
/// `step` (none: the one each record names), or with `dry_run` lists how it would; prints what
/// was settled, and exits 1 when any was refused (each refusal said on stderr).
pub(super) async fn reconcile(
    common: &Common,
    client: &Client,
    id: Option<String>,
    step: Option<&str>,
    resolution: &Resolution,
    reason: &str,
    dry_run: bool,
) -> anyhow::Result<u8> {
    let ids = match id {
        Some(id) => vec![id],
        None => waiting_for_reconcile(client).await?,
    };
    let mut refused = 0;
    let mut done = Vec::new();
    for id in ids {
        match settle(client, &id, step, resolution, reason, dry_run).await? {
            Ok(row) => done.push(row),
            Err(refusal) => {
                eprintln!("{refusal}");
                refused += 1;
            }
        }
    }
    let done = Value::Array(done);
    print_value(common, &done, || print_settled(&done, dry_run));
    Ok(if refused == 0 { 0 } else { 1 })
}
/// Settles workflow `id`'s uncertain step (with `dry_run`, only says how it would): its row to
/// print, or the line that says why it was refused; a record that cannot be read ends the
/// command.
async fn settle(
    client: &Client,
    id: &str,
    step: Option<&str>,
    resolution: &Resolution,
    reason: &str,
    dry_run: bool,
) -> anyhow::Result<Result<Value, String>> {
    let record = get(client, id).await?;
    let Some(step) = step
        .map(str::to_owned)
        .or_else(|| {
            record["reconciliation"]["step_id"]
                .as_str()
                .map(str::to_owned)
        })
        .filter(|step| !step.is_empty())
    else {
        return Ok(Err(format!(
            "{id}: its record names no uncertain step; give one with --step"
        )));
    };
    let how = resolution.how;
    let why = text(&record["reconciliation"]["reason"]);
    if dry_run {
        return Ok(Ok(
            json!({"run_id": id, "step_id": step, "resolution": how, "reason": why,
                   "dry_run": true}),
        ));
    }
    let mut body = json!({"step_id": step, "resolution": how, "reason": reason});
    if let Some(output) = &resolution.output {
        body["output"] = output.clone();
    }
    let path = format!("/api/v1/workflows/{}/reconcile", encode(id));
    Ok(match client.json("POST", &path, Some(&body)).await {
        Ok(_) => Ok(json!({"run_id": id, "step_id": step, "resolution": how, "reason": why})),
        Err(error) => Err(format!("{id}: {error}")),
    })
}

/// What was settled (or would be, with `--dry-run`), one row per workflow.
fn print_settled(done: &Value, dry_run: bool) {
    let table = rows(done, |d| {
        vec![
            text(&d["run_id"]),
            text(&d["step_id"]),
            text(&d["reason"]),
            format!(
                "{}{}",
                text(&d["resolution"]),
                if dry_run { " (dry run)" } else { "" }
            ),
        ]
    });
    print_table(&["RUN ID", "STEP", "WHY IT WAITED", "RESOLUTION"], &table);
}

/// Every workflow that waits for an operator's reconcile, newest first, page by page.
async fn waiting_for_reconcile(client: &Client) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = "/api/v1/workflows?status=needs_reconciliation&limit=100".to_owned();
        if let Some(after) = &after {
            path.push_str(&format!("&after={}", encode(after)));
        }
        let page = client.json("GET", &path, None).await?;
        ids.extend(
            page["workflows"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|w| w["run_id"].as_str().map(str::to_owned)),
        );
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return Ok(ids),
        }
    }
}
