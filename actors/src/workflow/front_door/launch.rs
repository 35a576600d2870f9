//! Launch and retry: a launch checked by `rules::launch`, compiled on a JS thread, written by
//! the store and supervised here; a retry read, decided by `rules::retry`, its adopted
//! workspaces copied, written, and supervised here from its journal, one at a time per workflow.

use ractor::{ActorRef, RpcReplyPort};
use serde::Serialize;
use store::{Launch, WorkflowId, WorkflowRow};
use tokio::time::Instant;

use super::actor::{WorkflowsMsg, WorkflowsState, start_supervisor};
use super::takeover::{Ready, start_ready, stored_row};
use super::{WorkflowsOptions, not_found, our_versions};
use crate::clock::now_ms;
use crate::error::Error;
use crate::js_pool::JsError;
use crate::mailbox::Post;
use crate::store_actor::StoreHandle;
use crate::workflow::Start;
use crate::workflow::requests::{LaunchRequest, RetryRequest};
use crate::workflow::rules::{self, Supervised};

/// What a launch gave the caller.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launched {
    /// The workflow's row as the store answered the launch: the row it wrote (`running`), or
    /// the one the same request had launched before.
    pub row: WorkflowRow,
    /// `false` when the same request had launched it before.
    pub created: bool,
}

/// What a retry's task came to.
pub enum RetryDone {
    /// The new workflow, as the store wrote it, to supervise here from its journal.
    Created { row: WorkflowRow, ready: Box<Ready> },
    /// The workflow was retried before: that retry.
    Existing(WorkflowRow),
}

/// Checks a launch against its limits (`rules::launch`), then, in a task, compiles its script
/// and writes it: the store's answer comes back as [`WorkflowsMsg::Launched`].
pub(super) fn launch(
    myself: &ActorRef<WorkflowsMsg>,
    state: &WorkflowsState,
    request: LaunchRequest,
    reply: RpcReplyPort<Result<Launched, Error>>,
) {
    let timeout_seconds = state.args.options.timeout_seconds;
    let (row, workflow) = match rules::launch(
        &state.args.options.limits,
        state.args.agents.configuration_version(),
        &request,
        (crate::ids::new_workflow_id(), now_ms()),
        (timeout_seconds > 0).then(|| timeout_seconds.saturating_mul(1000)),
    ) {
        Ok(launch) => launch,
        Err(error) => {
            let _ = reply.send(Err(error));
            return;
        }
    };
    let (store, js, me) = (
        state.args.store.clone(),
        state.args.js.clone(),
        myself.clone(),
    );
    let (owner, lease_ms, limits, script_limits) = (
        state.args.worker_id.clone(),
        state.args.options.lease_ms,
        state.args.options.launch_limits,
        state.args.options.limits.clone(),
    );
    tokio::spawn(async move {
        // Compiled (never run) on a JS thread before anything is written: a script
        // that cannot compile is refused with its own line and column.
        if let Err(error) = js
            .check(
                &workflow.workflow_id,
                &workflow.user_id,
                request.script,
                script_limits,
            )
            .await
        {
            let _ = reply.send(Err(match error {
                JsError::Start(runtime::Error::Script(message)) => Error::ScriptInvalid(message),
                other => Error::Unanswered {
                    actor: "js-pool",
                    reason: other.to_string(),
                },
            }));
            return;
        }
        let sent = Instant::now();
        let result = store.launch_workflow(row, &owner, lease_ms, limits).await;
        let _ = me.post(WorkflowsMsg::Launched {
            workflow: Box::new(workflow),
            sent,
            result: Box::new(result),
            reply,
        });
    });
}

/// The store answered a launch: a new workflow's supervisor starts here.
pub(super) async fn launched(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    workflow: Supervised,
    sent: Instant,
    result: store::Result<Launch>,
    reply: RpcReplyPort<Result<Launched, Error>>,
) {
    let answer = match result {
        Ok(Launch::Created { row, lease }) => {
            start_supervisor(myself, state, workflow, lease, sent, Start::Fresh)
                .await
                .map(|()| Launched { row, created: true })
        }
        Ok(Launch::Existing(row)) => Ok(Launched {
            row,
            created: false,
        }),
        Ok(Launch::Refused { limit, max }) => Err(Error::LimitReached { limit, max }),
        Err(error) => Err(Error::Store(error)),
    };
    let _ = reply.send(answer);
}

/// A retry asked for: started at once, or queued behind the one in flight for its workflow.
pub(super) fn retry(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    request: RetryRequest,
    reply: RpcReplyPort<Result<Launched, Error>>,
) {
    match state.retrying.get_mut(&request.workflow_id) {
        Some(queued) => queued.push_back(PendingRetry { request, reply }),
        None => {
            state
                .retrying
                .insert(request.workflow_id.clone(), Default::default());
            start_retry(myself, state, PendingRetry { request, reply });
        }
    }
}

/// A retry's task has finished: the next retry of its workflow starts, and a new workflow's
/// supervisor starts here.
pub(super) async fn retried(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    source: WorkflowId,
    result: Result<RetryDone, Error>,
    reply: RpcReplyPort<Result<Launched, Error>>,
) {
    let next = state.retrying.get_mut(&source).and_then(|q| q.pop_front());
    match next {
        Some(next) => start_retry(myself, state, next),
        None => {
            state.retrying.remove(&source);
        }
    }
    let answer = match result {
        Ok(RetryDone::Created { row, ready }) => start_ready(myself, state, *ready, Start::Replay)
            .await
            .map(|_| Launched { row, created: true }),
        Ok(RetryDone::Existing(row)) => Ok(Launched {
            row,
            created: false,
        }),
        Err(error) => Err(error),
    };
    let _ = reply.send(answer);
}
/// A retry asked for, and who waits for its answer.
pub(crate) struct PendingRetry {
    request: RetryRequest,
    reply: RpcReplyPort<Result<Launched, Error>>,
}

/// Starts the task of retry `pending`: its answer comes back as [`WorkflowsMsg::Retried`].
fn start_retry(myself: &ActorRef<WorkflowsMsg>, state: &WorkflowsState, pending: PendingRetry) {
    let retrying = Retrying {
        store: state.args.store.clone(),
        versions: our_versions(state),
        owner: state.args.worker_id.clone(),
        options: state.args.options.clone(),
    };
    let me = myself.clone();
    tokio::spawn(async move {
        let PendingRetry { request, reply } = pending;
        let source = request.workflow_id.clone();
        // Its end is always posted, a panic's included: the retries queued behind it wait for
        // that message.
        let result = tokio::spawn(retrying.retry(request))
            .await
            .unwrap_or_else(|failed| {
                Err(Error::Unanswered {
                    actor: "retry",
                    reason: failed.to_string(),
                })
            });
        let _ = me.post(WorkflowsMsg::Retried {
            source,
            result: Box::new(result),
            reply,
        });
    });
}

/// What a retry's task needs of the actor's state.
struct Retrying {
    store: StoreHandle,
    versions: store::Versions,
    owner: String,
    options: WorkflowsOptions,
}

impl Retrying {
    /// Reads the workflow retried and its journal, decides the retry (`rules::retry`), copies
    /// the workspaces of the agent steps it adopts into its own threads, then writes it in one
    /// transaction. The copies come first: a retry that exists has them, and a capture of an
    /// adopted step finds its file even after the workflow retried is deleted. A retry that was
    /// not written (refused, or an error that proves nothing was) leaves none behind; one whose
    /// write's outcome is unknown keeps them, since it may exist.
    async fn retry(self, request: RetryRequest) -> Result<RetryDone, Error> {
        let source = &request.workflow_id;
        let snapshot = self
            .store
            .read_snapshot(source, 0, 0)
            .await?
            .ok_or_else(|| not_found(source))?;
        if let Some(retry) = &snapshot.retried_by {
            return Ok(RetryDone::Existing(stored_row(&self.store, retry).await?));
        }
        let steps = self.store.read_steps(source).await?;
        let retried = rules::retry(
            &snapshot.row,
            &steps,
            &self.versions,
            &request,
            self.options.stored_bytes_max,
            crate::ids::new_workflow_id(),
            now_ms(),
        )?;
        if let Some(faults) = &self.options.faults {
            faults.reach("retry_copy", source).await;
        }
        let workspaces = self.options.workspaces_dir.clone();
        let threads = retried.threads.clone();
        let bytes_max = self.options.retry_copy_bytes_max;
        let copied =
            tokio::task::spawn_blocking(move || copy_threads(&workspaces, &threads, bytes_max))
                .await
                .map_err(|error| Error::Unanswered {
                    actor: "workspace-copy",
                    reason: error.to_string(),
                })
                .and_then(|copied| copied);
        let mut retry = retried.retry;
        match copied {
            // The copies count against the owner's quota with the rest of the retry.
            Ok(bytes) => retry.copied_bytes = i64::try_from(bytes).unwrap_or(i64::MAX),
            Err(error) => {
                self.remove_copies(&retried.threads).await;
                return Err(error);
            }
        }
        let sent = Instant::now();
        let answer = self
            .store
            .retry_workflow(
                retry,
                &self.owner,
                self.options.lease_ms,
                self.options.launch_limits,
            )
            .await;
        let done = match answer {
            Ok(store::Retry::Created { row, lease }) => {
                return Ok(RetryDone::Created {
                    row,
                    ready: Box::new(Ready {
                        workflow: retried.workflow,
                        lease,
                        sent,
                    }),
                });
            }
            Err(error @ store::Error::OutcomeUnknown(_)) => return Err(Error::Store(error)),
            Ok(store::Retry::Existing(row)) => Ok(RetryDone::Existing(row)),
            Ok(store::Retry::NotFound) => Err(not_found(source)),
            Ok(store::Retry::NotFailed(status)) => Err(Error::NotRetryable {
                workflow_id: source.clone(),
                reason: format!("it is {status} now"),
            }),
            Ok(store::Retry::Refused { limit, max }) => Err(Error::LimitReached { limit, max }),
            Err(error) => Err(Error::Store(error)),
        };
        self.remove_copies(&retried.threads).await;
        done
    }

    /// Removes the copies a retry that was not written made (what is left is only logged).
    async fn remove_copies(&self, threads: &[(String, String)]) {
        let workspaces = self.options.workspaces_dir.clone();
        let copies: Vec<String> = threads.iter().map(|(_, copy)| copy.clone()).collect();
        let removed = tokio::task::spawn_blocking(move || {
            copies
                .iter()
                .map(|copy| crate::workspace::remove_thread(&workspaces, copy))
                .find_map(Result::err)
        })
        .await;
        match removed {
            Ok(None) => {}
            Ok(Some(error)) => {
                tracing::warn!(%error, "cannot remove the workspace copy of a retry not made")
            }
            Err(error) => tracing::warn!(%error, "removing a retry's workspace copies failed"),
        }
    }
}

/// Copies each `(from, to)` thread's workspace (see [`crate::workspace::copy_thread`]), at most
/// `bytes_max` bytes of data in all (`limits.retry_copy_bytes_max`), and answers the bytes of
/// data copied.
fn copy_threads(
    workspaces_dir: &std::path::Path,
    threads: &[(String, String)],
    bytes_max: u64,
) -> Result<u64, Error> {
    let mut bytes = 0_u64;
    for (from, to) in threads {
        let left = bytes_max.saturating_sub(bytes);
        let copied =
            crate::workspace::copy_thread(workspaces_dir, from, to, left).map_err(|error| {
                match error {
                    // Said of the whole retry's bound, not of what this thread had left.
                    crate::workspace::WorkspaceError::TooLarge { .. } => {
                        crate::workspace::WorkspaceError::TooLarge { bytes_max }
                    }
                    other => other,
                }
            })?;
        bytes += copied.bytes;
        if copied.skipped > 0 {
            tracing::info!(thread = %from, files = copied.files, skipped = copied.skipped,
                "a retry's workspace copy left out what is not a folder, a file or a link");
        }
    }
    Ok(bytes)
}
