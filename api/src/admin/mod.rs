//! The admin socket: one Unix socket per node (mode 0600) speaking JSON lines, for operators on
//! the node's host. A request is one line `{"command": NAME, ...}`; the answer is one line
//! `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`. Commands read live state
//! from the node's actors and the store, so whatever later issues add shows up here without a
//! new protocol. `reins admin` ([`client`]) is the command line over it.

pub mod client;
mod socket;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use store::WorkflowId;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

pub use socket::{AdminSocket, Error, bind, check_free as socket_free};

use crate::http::AppState;

/// A request line's bytes at most.
const REQUEST_BYTES_MAX: usize = 64 * 1024;
/// How long a command may take before the answer says so.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// Slots listed at most (the count is always exact).
const SLOTS_LISTED_MAX: u32 = 1000;
/// Workflows waiting for reconciliation listed at most, newest first.
const RECONCILIATIONS_LISTED_MAX: u32 = 1000;

/// What admin commands need besides the node.
pub struct AdminContext {
    pub app: Arc<AppState>,
    /// The effective configuration with secrets redacted.
    pub config: Value,
    pub max_active_children: u64,
    /// How long a backup may take (`store.call_timeout_ms`, which bounds its store call).
    pub backup_timeout: Duration,
}

/// One request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, tag = "command", rename_all = "snake_case")]
pub enum Request {
    Status,
    Workflows,
    Leases,
    Slots,
    Actors,
    Drain,
    Config,
    Fence {
        run_id: WorkflowId,
    },
    Reconciliations,
    /// A copy of the embedded database into `path`, a new file named by its absolute path.
    Backup {
        path: std::path::PathBuf,
    },
}

/// Serves the socket until `stop` turns true, then ends every open connection, so that nothing
/// holds the node once this returns.
pub async fn serve(
    listener: UnixListener,
    context: Arc<AdminContext>,
    mut stop: watch::Receiver<bool>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let context = Arc::clone(&context);
                    connections.spawn(async move { connection(stream, &context).await });
                }
                Err(error) => {
                    tracing::warn!(%error, "admin socket accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = stopped(&mut stop) => break,
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

/// Resolves once `stop` turns true (or its sender is gone, which also means stop).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopping| *stopping).await.map(|_| ());
}

async fn connection(mut stream: UnixStream, context: &AdminContext) {
    if started_by_this_node(&stream) {
        let refusal = json!({"ok": false, "error": "refused: the admin socket does not answer \
            processes this node started (its agents)"});
        let _ = stream.write_all(format!("{refusal}\n").as_bytes()).await;
        return;
    }
    let (reader, mut writer) = stream.into_split();
    let mut lines = FramedRead::new(reader, LinesCodec::new_with_max_length(REQUEST_BYTES_MAX));
    loop {
        let answer = match lines.next().await {
            None => return,
            Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                json!({"ok": false, "error": format!("a request line is at most {REQUEST_BYTES_MAX} bytes")})
            }
            Some(Err(LinesCodecError::Io(_))) => return,
            Some(Ok(line)) => match serde_json::from_str::<Request>(&line) {
                Err(error) => json!({"ok": false, "error": format!("bad request: {error}")}),
                Ok(request) => {
                    // A backup is bounded by the store's call timeout instead: it may copy a
                    // large database.
                    let within = match request {
                        Request::Backup { .. } => context.backup_timeout,
                        _ => COMMAND_TIMEOUT,
                    };
                    match tokio::time::timeout(within, run(context, request)).await {
                        Ok(Ok(result)) => json!({"ok": true, "result": result}),
                        Ok(Err(error)) => json!({"ok": false, "error": error}),
                        Err(_) => json!({"ok": false, "error": format!(
                            "the command did not finish within {} ms", within.as_millis())}),
                    }
                }
            },
        };
        let mut bytes = answer.to_string().into_bytes();
        bytes.push(b'\n');
        if writer.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// Whether the peer of `stream` descends from this node process (or cannot be told): an agent,
/// or anything an agent started. Agents run as the node's user, so the socket's mode does not
/// keep them out, and Landlock refuses them the socket's path only from ABI 9; an agent's
/// descendants stay below this process because its guard adopts its orphans (see
/// `actors::agents`' process module). The peer's pid is the one it connected with.
fn started_by_this_node(stream: &UnixStream) -> bool {
    let own = std::process::id();
    let Some(mut pid) = stream
        .peer_cred()
        .ok()
        .and_then(|credentials| credentials.pid())
        .and_then(|pid| u32::try_from(pid).ok())
    else {
        return true;
    };
    for _ in 0..ANCESTORS_MAX {
        if pid == own {
            return true;
        }
        if pid <= 1 {
            return false;
        }
        match parent_of(pid) {
            Some(parent) => pid = parent,
            // Gone meanwhile: who it was cannot be told.
            None => return true,
        }
    }
    true
}

/// How many ancestors of an admin socket's peer are looked at, at most, before it is refused
/// (real process trees are a few dozen deep).
const ANCESTORS_MAX: usize = 4096;

/// The parent of process `pid`, from `/proc/<pid>/stat` (field 4, counted after the command
/// name's last `)`).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 1..)?;
    after_name.split_whitespace().nth(1)?.parse().ok()
}

fn text(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Carries out one command.
async fn run(context: &AdminContext, request: Request) -> Result<Value, String> {
    let node = &context.app.node;
    let store = node.store();
    match request {
        Request::Status => {
            let status = node.status().await.map_err(text)?;
            let health = store.health().await.map_err(text)?;
            let worker_id = &status.worker_id;
            let workflows = store.workflow_counts(Some(worker_id)).await.map_err(text)?;
            let runs = store.run_counts(worker_id).await.map_err(text)?;
            Ok(json!({
                "worker_id": status.worker_id,
                "version": status.version,
                "runtime_version": status.runtime_version,
                "configuration_version": status.configuration_version,
                "uptime_seconds": status.uptime_seconds,
                "backend": health.backend,
                "schema_version": health.schema_version,
                "draining": context.app.draining.load(Ordering::SeqCst),
                "workflows": workflows,
                "child_runs": runs,
            }))
        }
        Request::Workflows => {
            let leases = node.leases().await.map_err(text)?;
            let mut owned = Vec::new();
            for lease in leases {
                let actors::Leased::Workflow { workflow_id, epoch } = lease.lease else {
                    continue;
                };
                let status = store
                    .read_workflow(&workflow_id)
                    .await
                    .map_err(text)?
                    .map(|row| row.status);
                owned.push(json!({
                    "run_id": workflow_id,
                    "status": status,
                    "epoch": epoch,
                    "lease_remaining_ms": lease.remaining_ms,
                    "renewing": lease.renewing,
                }));
            }
            Ok(Value::Array(owned))
        }
        Request::Leases => {
            let leases = node.leases().await.map_err(text)?;
            Ok(Value::Array(
                leases
                    .into_iter()
                    .map(|lease| {
                        let (kind, resource_id, epoch) = match lease.lease {
                            actors::Leased::Run(run_id) => ("run", run_id.into_string(), None),
                            actors::Leased::Workflow { workflow_id, epoch } => {
                                ("workflow", workflow_id.into_string(), Some(epoch))
                            }
                        };
                        json!({
                            "resource_id": resource_id,
                            "kind": kind,
                            "epoch": epoch,
                            "remaining_ms": lease.remaining_ms,
                            "renewing": lease.renewing,
                            "refused": lease.refused,
                        })
                    })
                    .collect(),
            ))
        }
        Request::Slots => {
            let held = store.count_slots().await.map_err(text)?;
            let slots = store.list_slots(SLOTS_LISTED_MAX).await.map_err(text)?;
            Ok(json!({
                "max_active_children": context.max_active_children,
                "held": held,
                "slots": slots,
            }))
        }
        Request::Actors => serde_json::to_value(node.actors()).map_err(text),
        Request::Drain => {
            context.app.draining.store(true, Ordering::SeqCst);
            node.workflows().drain();
            tracing::info!("draining (admin socket): no new launches or recoveries");
            Ok(json!({"draining": true}))
        }
        Request::Config => Ok(context.config.clone()),
        Request::Reconciliations => {
            let filter = store::ListFilter {
                user_id: None,
                status: Some(store::StatusFilter::Stored(
                    store::WorkflowStatus::NeedsReconciliation,
                )),
                waiting_for: None,
                request_id: None,
                after: None,
                limit: RECONCILIATIONS_LISTED_MAX,
            };
            let rows = node.workflows().list(filter).await.map_err(text)?;
            Ok(Value::Array(
                rows.iter()
                    .map(|listed| &listed.row)
                    .map(|row| {
                        json!({
                            "run_id": row.workflow_id,
                            "user_id": row.user_id,
                            "reconciliation": crate::http::record::reconciliation(row),
                        })
                    })
                    .collect(),
            ))
        }
        Request::Fence { run_id } => {
            let epoch = node.workflows().fence(&run_id).await.map_err(text)?;
            Ok(json!({"run_id": run_id, "released_epoch": epoch}))
        }
        Request::Backup { path } => {
            if !path.is_absolute() {
                return Err(format!(
                    "backup: {} is not an absolute path",
                    path.display()
                ));
            }
            let report = store.backup(&path).await.map_err(text)?;
            serde_json::to_value(report).map_err(text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_peer_that_descends_from_the_node_is_told_apart() {
        // A socket pair within this process: the peer is the node itself.
        let (ours, _other) = UnixStream::pair().expect("socket pair");
        assert!(started_by_this_node(&ours));
        // SAFETY: getppid(2) only reads this process's parent id.
        let parent = unsafe { libc::getppid() };
        assert_eq!(
            parent_of(std::process::id()),
            u32::try_from(parent).ok(),
            "the parent read from /proc"
        );
        assert_eq!(parent_of(u32::MAX), None);
    }
}
