//! `reins run` and `reins retry`: launch a workflow (a script, or a failed workflow's retry) and
//! print its run id, or with `--wait` follow it until it ends or waits for a person.

use std::path::PathBuf;

use anyhow::Context;
use serde_json::{Value, json};

use super::client::Client;
use super::{Common, WAIT_PER_REQUEST, encode, get_waiting, print_value, wait_for_rest};

/// What `reins run` launches: the script's file and the launch's optional fields.
pub(super) struct Launch {
    pub file: PathBuf,
    /// The script's `args`, as JSON text.
    pub args: String,
    pub request_id: Option<String>,
    pub title: Option<String>,
    pub timeout_seconds: Option<u64>,
}

/// `reins run`: launches the script; prints its run id, or with `wait` follows it.
pub(super) async fn run_script(
    common: &Common,
    client: &Client,
    launch: Launch,
    wait: bool,
) -> anyhow::Result<u8> {
    let body = launch_body(launch)?;
    let path = if wait {
        format!("/api/v1/workflows?wait={WAIT_PER_REQUEST}")
    } else {
        "/api/v1/workflows".to_owned()
    };
    let launched = client.json("POST", &path, Some(&body)).await?;
    let run_id = launched["run_id"].as_str().context("no run_id")?.to_owned();
    if !wait {
        print_value(common, &launched, || println!("{run_id}"));
        return Ok(0);
    }
    wait_for_rest(common, client, &run_id, launched).await
}

/// The launch request: the script read from its file, `--args` parsed as JSON, and only the
/// optional fields given.
fn launch_body(launch: Launch) -> anyhow::Result<Value> {
    let script = std::fs::read_to_string(&launch.file)
        .with_context(|| format!("cannot read {}", launch.file.display()))?;
    let args: Value = serde_json::from_str(&launch.args).context("--args is not JSON")?;
    let mut body = json!({"script": script, "args": args});
    if let Some(request_id) = launch.request_id {
        body["request_id"] = json!(request_id);
    }
    if let Some(title) = launch.title {
        body["title"] = json!(title);
    }
    if let Some(seconds) = launch.timeout_seconds {
        body["timeout_seconds"] = json!(seconds);
    }
    Ok(body)
}

/// `reins retry`: a new workflow from the failed one's failed step; prints its run id (saying
/// so when the workflow was retried before), or with `wait` follows it.
pub(super) async fn retry(
    common: &Common,
    client: &Client,
    id: &str,
    request_id: Option<String>,
    wait: bool,
) -> anyhow::Result<u8> {
    let mut body = json!({});
    if let Some(request_id) = request_id {
        body["request_id"] = json!(request_id);
    }
    let path = format!("/api/v1/workflows/{}/retry", encode(id));
    let retried = client.json("POST", &path, Some(&body)).await?;
    let run_id = retried["run_id"].as_str().context("no run_id")?.to_owned();
    if !wait {
        print_value(common, &retried, || {
            if retried["repeated"] == json!(true) {
                eprintln!("{id} was retried before: its retry is {run_id}");
            }
            println!("{run_id}");
        });
        return Ok(0);
    }
    let record = get_waiting(client, &run_id).await?;
    wait_for_rest(common, client, &run_id, record).await
}
