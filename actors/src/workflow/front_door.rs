//! The workflows actor: the front door for workflows on this node and the supervisor of their
//! workflow supervisors. Launch checks the script and arguments against their limits, launches
//! through the store (idempotent per user and request id, under the cluster-wide limits), and
//! starts a linked supervisor for a new workflow. [`WorkflowsHandle`] is the Rust API the HTTP
//! layer calls: launch, get, resume, decide.

use crate::mailbox::Post;
use std::collections::HashMap;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use runtime::CallKind;
use serde::Serialize;
use serde_json::{Value, json};
use store::{
    Change, ControlKind, ControlRow, ControlWrite, Epoch, Launch, LaunchLimits, NewControl,
    StepRow, WorkflowId, WorkflowRow,
};
use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::child_run::RunsHandle;
use crate::clock::now_ms;
use crate::error::{Error, Takeover};
use crate::js_pool::{JsError, JsPool};
use crate::lease::LeaseMsg;
use crate::store_actor::StoreHandle;
use crate::workflow::requests::{
    Decide, LaunchRequest, ReconcileRequest, Resume, RetryRequest, SendEvent,
};
use crate::workflow::rules::{self, Supervised};
use crate::workflow::{Start, WorkflowArgs, WorkflowMsg, WorkflowSupervisor};

/// What a launch gave the caller.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Launched {
    /// The workflow's row as the store answered the launch: the row it wrote (`running`), or
    /// the one the same request had launched before.
    pub row: WorkflowRow,
    /// `false` when the same request had launched it before.
    pub created: bool,
}

/// A workflow as stored: its row, lease, controls and checkpoints, and the first page of its
/// steps and of its artifact versions (see [`store::Snapshot`]).
#[derive(Debug, Clone)]
pub struct WorkflowView {
    pub row: WorkflowRow,
    /// The first steps of its journal, in journal order (see [`store::Snapshot::steps`]).
    pub steps: Vec<StepRow>,
    /// Its pauses and human checkpoints, whole (see [`store::Snapshot::checkpoints`]).
    pub checkpoints: Vec<StepRow>,
    pub controls: Vec<ControlRow>,
    pub lease: Option<store::Lease>,
    /// The child runs that asked a person for approval (see [`store::Snapshot::approval_runs`]).
    pub approval_runs: Vec<store::RunRow>,
    /// The first artifact versions, without their bytes (see [`store::Snapshot::artifacts`]).
    pub artifacts: Vec<store::ArtifactInfo>,
    /// Live by its stored status, with its lease expired on the database clock: `recover` may
    /// take it over. Derived on every read, never stored.
    pub recoverable: bool,
    /// The workflow that runs this one again from its failed step, if one does.
    pub retried_by: Option<WorkflowId>,
    /// Its waits, whichever page their steps are on (see [`store::Snapshot::waits`]).
    pub waits: Vec<StepRow>,
}

/// Limits and sizes the workflows actor works with.
#[derive(Debug, Clone)]
pub struct WorkflowsOptions {
    pub limits: runtime::Limits,
    /// Where thread workspaces live (captures read files there).
    pub workspaces_dir: std::path::PathBuf,
    /// An artifact's bytes at most.
    pub artifact_bytes_max: u64,
    /// `console.log` lines a workflow keeps as events at most, whichever nodes ran it.
    pub log_events_max: u64,
    /// The bytes of those lines at most.
    pub log_event_bytes_max: u64,
    /// How long a capture's read may take before the capture fails.
    pub capture_timeout: Duration,
    /// The node's own files (database, secret, configuration), which no capture opens.
    pub node_files: std::sync::Arc<crate::node_files::NodeFiles>,
    pub launch_limits: LaunchLimits,
    pub slots_max: u64,
    /// The slots the steps of one user's workflows hold at most, across the cluster.
    pub slots_per_user_max: u64,
    /// The slots kept free for other users than one who holds their share already
    /// (`limits.active_children_reserved`).
    pub slots_reserved: u64,
    /// The bytes one user's workflows store at most (`limits.user_stored_bytes_max`; 0: no
    /// quota).
    pub stored_bytes_max: u64,
    /// The bytes of data a retry copies at most from the workspaces of the steps it adopts
    /// (`limits.retry_copy_bytes_max`; a file's holes do not count).
    pub retry_copy_bytes_max: u64,
    /// The events one workflow holds untaken at most, and their payload bytes
    /// (`limits.untaken_events_per_workflow_max`, `limits.untaken_event_bytes_per_workflow_max`).
    pub event_bounds: store::EventBounds,
    pub lease_ms: u64,
    /// The life limit of a workflow launched here without its own (`limits.timeout_seconds`;
    /// 0: none), and of one launched before launches recorded theirs (then a day when 0).
    pub timeout_seconds: u64,
    /// `recovery: automatic`: this node claims recoverable workflows itself, every lease period.
    pub automatic_recovery: bool,
    /// `REINS_FAULT_DIR` fault points (tests only; inert when `None`).
    pub faults: Option<crate::fault_points::FaultPoints>,
    /// The slow fallback of every wake-up the change bus brings (`cluster.wake_fallback_ms`):
    /// how often controls are looked for, and how long a step without a slot or a step whose
    /// agent waits for a person waits before it looks again, should a cue be lost.
    pub wake_fallback: Duration,
    /// How long a parked workflow waits before it goes dormant (`dormant_after_ms`; `None`:
    /// never).
    pub dormant_after: Option<Duration>,
}

/// Messages of the workflows actor.
pub enum WorkflowsMsg {
    Launch {
        request: LaunchRequest,
        reply: RpcReplyPort<Result<Launched, Error>>,
    },
    /// The store answered a launch.
    Launched {
        workflow: Box<Supervised>,
        sent: Instant,
        result: Box<store::Result<Launch>>,
        reply: RpcReplyPort<Result<Launched, Error>>,
    },
    /// Run a failed workflow again from its failed step, as a new workflow supervised here.
    Retry {
        request: RetryRequest,
        reply: RpcReplyPort<Result<Launched, Error>>,
    },
    /// A retry's task has finished: the new workflow, written with its lease, ready for its
    /// supervisor (which replays what it adopted), or the retry that existed, or why not.
    Retried {
        source: WorkflowId,
        result: Box<Result<RetryDone, Error>>,
        reply: RpcReplyPort<Result<Launched, Error>>,
    },
    /// Take over a recoverable workflow and replay it here.
    Recover {
        workflow_id: WorkflowId,
        reply: RpcReplyPort<Result<WorkflowId, Error>>,
    },
    /// Finish a cancellation whose workflow's owner is gone, if it is gone; while the owner's
    /// lease is valid, ask again when it may have run out (`tries` so far). `done` hears when
    /// this try is decided.
    TakeOverToCancel {
        workflow_id: WorkflowId,
        tries: u32,
        done: Option<RpcReplyPort<()>>,
    },
    /// Settle the uncertain step of a workflow that needs reconciliation, and resume it here.
    Reconcile {
        request: Box<ReconcileRequest>,
        reply: RpcReplyPort<Result<WorkflowId, Error>>,
    },
    /// A takeover's task has finished (see [`take_over`]): the workflow taken over and read
    /// back (and settled, for a reconcile), ready for its supervisor, or why not.
    TakenOver {
        workflow_id: WorkflowId,
        result: Box<Result<Ready, Error>>,
        asked: Asked,
    },
    /// The workflows supervised here.
    Live {
        reply: RpcReplyPort<Vec<WorkflowId>>,
    },
    /// Stop taking recoveries (manual and automatic): the node is draining.
    Drain,
    /// Give up one workflow's lease now (operators moving work, or the node stopping cleanly);
    /// answers the released epoch.
    Fence {
        workflow_id: WorkflowId,
        shutdown: bool,
        reply: RpcReplyPort<Result<Epoch, Error>>,
    },
    /// Time to look for pending controls of this node's workflows.
    PollControls,
    /// Take back a workflow this node's supervisor left live (it lost the lease, or a write's
    /// outcome was unknown), once its lease has run out: `tries` so far.
    TakeBack { workflow_id: WorkflowId, tries: u32 },
    /// Time to claim recoverable workflows (`recovery: automatic`), or, in either recovery
    /// mode, dormant ones whose wake time came.
    ClaimRecoverable,
    /// A claim's takeovers are all decided; `full` when it found a whole batch, so more may
    /// be waiting and the next claim starts at once. `next_wake_ms`: when the next dormant
    /// workflow wakes (epoch ms), for a claim then.
    Claimed {
        full: bool,
        next_wake_ms: Option<i64>,
    },
    /// The wake time a claim planned for has come: claim.
    WakeDue,
    /// Workflows of this node with controls to carry out.
    PendingControls(Vec<WorkflowId>),
    /// The change bus announced a committed change (or that changes may have been missed).
    Changed(Change),
    /// A supervisor of this node has a step waiting for a child slot: wake it when one frees.
    SlotWanted(WorkflowId),
}

/// Who asked for a takeover, and what follows it: the message goes to the takeover's task
/// and comes back with its result.
pub enum Asked {
    /// `recover` (an operator's, or a claim of automatic recovery): the caller hears the answer.
    Recover(RpcReplyPort<Result<WorkflowId, Error>>),
    /// `reconcile`: the task settles the step under the new lease before the supervisor starts.
    Reconcile {
        request: Box<ReconcileRequest>,
        reply: RpcReplyPort<Result<WorkflowId, Error>>,
    },
    /// Finish a dead owner's cancellation without replaying the body.
    Cancel {
        tries: u32,
        done: Option<RpcReplyPort<()>>,
    },
    /// Take back a workflow this node's own supervisor left live.
    TakeBack { tries: u32 },
}

impl Asked {
    fn action(&self) -> Takeover {
        match self {
            Asked::Recover(_) | Asked::TakeBack { .. } => Takeover::Recover,
            Asked::Reconcile { .. } => Takeover::Reconcile,
            Asked::Cancel { .. } => Takeover::Cancel,
        }
    }

    fn start(&self) -> Start {
        match self {
            Asked::Cancel { .. } => Start::CancelOnly,
            _ => Start::Replay,
        }
    }
}

/// A workflow this node has taken over and read back: what its supervisor starts from.
pub struct Ready {
    workflow: Supervised,
    lease: store::Lease,
    /// When the takeover was sent: the lease's local deadline counts from here.
    sent: Instant,
}

/// What a retry's task came to.
pub enum RetryDone {
    /// The new workflow, as the store wrote it, to supervise here from its journal.
    Created { row: WorkflowRow, ready: Box<Ready> },
    /// The workflow was retried before: that retry.
    Existing(WorkflowRow),
}

/// Supervisors woken per freed slot (a cue may stand for several slots freed in one write);
/// those refused again wait for the next cue, or their fallback.
pub(super) const SLOT_WAKES_MAX: usize = 16;

/// Recoverable workflows claimed per query; a full batch is followed by another claim at once,
/// so any number of orphaned workflows is taken over within a claim period or two.
const RECOVERY_BATCH: u32 = 64;

/// The life limit of a workflow launched before launches recorded theirs, on a node that sets
/// none: the day every launch then had by default.
const LEGACY_TIMEOUT_MS: u64 = 86_400_000;

/// The longest wait between two claims of automatic recovery (shorter when the lease is): an
/// orphaned workflow is claimed within this much of its owner's lease running out.
const CLAIM_PERIOD_MAX: Duration = Duration::from_secs(1);

/// How often the node tries to take back a workflow its own supervisor left live, a lease
/// period apart (the database may still be unreachable, or the lease not yet run out).
const TAKE_BACK_TRIES: u32 = 20;

/// How often a cancellation asked of a workflow whose owner's lease was still valid is tried
/// again, a lease period apart (the owner, if alive, carries it out itself meanwhile).
const CANCEL_TAKEOVER_TRIES: u32 = 10;

pub(crate) struct Workflows;

pub(crate) struct WorkflowsArgs {
    pub store: StoreHandle,
    pub runs: RunsHandle,
    pub js: JsPool,
    pub lease: ActorRef<LeaseMsg>,
    pub agents: std::sync::Arc<crate::agents::AgentRegistry>,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    pub worker_id: String,
    pub options: WorkflowsOptions,
    /// Where the ids of stopped supervisors go (see [`WorkflowsHandle::stopped`]).
    pub stopped: broadcast::Sender<WorkflowId>,
    /// The change bus: controls, freed slots, answered approvals and recoverable work wake the
    /// actor instead of a timer.
    pub changes: store::Changes,
}

pub(crate) struct WorkflowsState {
    args: WorkflowsArgs,
    live: HashMap<WorkflowId, ActorRef<WorkflowMsg>>,
    /// Workflows with a takeover task in flight on this node: none is taken over twice at
    /// once, and none that has a supervisor here is taken over again.
    taking_over: std::collections::HashSet<WorkflowId>,
    /// Workflows with a retry's task in flight on this node, and the retries of each asked for
    /// meanwhile: one at a time per workflow, so that concurrent requests make one copy of its
    /// workspaces, not one each (the next, once the first is written, answers it as `repeated`).
    retrying: HashMap<WorkflowId, std::collections::VecDeque<PendingRetry>>,
    /// A look for pending controls is in flight.
    polling: bool,
    /// Draining: no recoveries are taken any more.
    draining: bool,
    /// A claim of automatic recovery is under way.
    claiming: bool,
    /// A claim was asked for while one was under way: another follows it at once.
    claim_again: bool,
    /// The wake time (epoch ms) of a dormant workflow a claim is planned for.
    planned_wake_ms: Option<i64>,
    /// Supervisors with a step waiting for a child slot, oldest first, each once.
    slot_waiters: std::collections::VecDeque<WorkflowId>,
    /// The user who launched each live workflow, so that a freed slot wakes the waiters of
    /// several users rather than only the oldest ones of one user who holds their share.
    live_users: HashMap<WorkflowId, String>,
    /// The task that hands the change bus to this actor (stopped with it).
    _listening: crate::mailbox::Task,
}

impl Actor for Workflows {
    type Msg = WorkflowsMsg;
    type State = WorkflowsState;
    type Arguments = WorkflowsArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WorkflowsArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        // Controls arrive on the change bus; the poll is the fallback for a lost cue.
        crate::mailbox::post_every(&myself, args.options.wake_fallback, || {
            WorkflowsMsg::PollControls
        });
        // A lease running out is a matter of time, which no cue announces: this period stays
        // (a released lease or a stopped node also wakes a claim at once). Under manual
        // recovery the claim takes only dormant workflows whose wake time came (a wake is no
        // crash recovery, and nobody else would wake them): cues, the wake a claim plans, and
        // the slow fallback bring it, so a quiet node queries nothing.
        let period = if args.options.automatic_recovery {
            Duration::from_millis(args.options.lease_ms.max(1)).min(CLAIM_PERIOD_MAX)
        } else {
            args.options.wake_fallback
        };
        crate::mailbox::post_every(&myself, period, || WorkflowsMsg::ClaimRecoverable);
        // A dormant workflow whose time came while no node ran is woken by the first to start.
        myself.post(WorkflowsMsg::ClaimRecoverable)?;
        let listening = listen(&myself, args.changes.subscribe());
        Ok(WorkflowsState {
            args,
            live: HashMap::new(),
            taking_over: std::collections::HashSet::new(),
            retrying: HashMap::new(),
            polling: false,
            draining: false,
            claiming: false,
            claim_again: false,
            planned_wake_ms: None,
            slot_waiters: std::collections::VecDeque::new(),
            live_users: HashMap::new(),
            _listening: listening,
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut WorkflowsState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: WorkflowsMsg,
        state: &mut WorkflowsState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        match message {
            WorkflowsMsg::Launch { request, reply } => {
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
                        return Ok(());
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
                            JsError::Start(runtime::Error::Script(message)) => {
                                Error::ScriptInvalid(message)
                            }
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
            WorkflowsMsg::Launched {
                workflow,
                sent,
                result,
                reply,
            } => {
                let answer = match *result {
                    Ok(Launch::Created { row, lease }) => {
                        start_supervisor(&myself, state, *workflow, lease, sent, Start::Fresh)
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
            WorkflowsMsg::Retry { reply, .. } if state.draining => {
                let _ = reply.send(Err(Error::Draining));
            }
            WorkflowsMsg::Retry { request, reply } => {
                match state.retrying.get_mut(&request.workflow_id) {
                    Some(queued) => queued.push_back(PendingRetry { request, reply }),
                    None => {
                        state
                            .retrying
                            .insert(request.workflow_id.clone(), Default::default());
                        start_retry(&myself, state, PendingRetry { request, reply });
                    }
                }
            }
            WorkflowsMsg::Retried {
                source,
                result,
                reply,
            } => {
                let next = state.retrying.get_mut(&source).and_then(|q| q.pop_front());
                match next {
                    Some(next) => start_retry(&myself, state, next),
                    None => {
                        state.retrying.remove(&source);
                    }
                }
                let answer = match *result {
                    Ok(RetryDone::Created { row, ready }) => {
                        start_ready(&myself, state, *ready, Start::Replay)
                            .await
                            .map(|_| Launched { row, created: true })
                    }
                    Ok(RetryDone::Existing(row)) => Ok(Launched {
                        row,
                        created: false,
                    }),
                    Err(error) => Err(error),
                };
                let _ = reply.send(answer);
            }
            WorkflowsMsg::Recover { reply, .. } if state.draining => {
                let _ = reply.send(Err(Error::Draining));
            }
            WorkflowsMsg::Recover { workflow_id, reply } => {
                take_over(state, &myself, workflow_id, Asked::Recover(reply));
            }
            WorkflowsMsg::TakeOverToCancel {
                workflow_id,
                tries,
                done,
            } => {
                take_over(state, &myself, workflow_id, Asked::Cancel { tries, done });
            }
            WorkflowsMsg::Reconcile { request, reply } => {
                let workflow_id = request.workflow_id.clone();
                take_over(
                    state,
                    &myself,
                    workflow_id,
                    Asked::Reconcile { request, reply },
                );
            }
            WorkflowsMsg::TakeBack { .. } if state.draining => {}
            WorkflowsMsg::TakeBack { workflow_id, tries } => {
                take_over(state, &myself, workflow_id, Asked::TakeBack { tries });
            }
            WorkflowsMsg::TakenOver {
                workflow_id,
                result,
                asked,
            } => {
                state.taking_over.remove(&workflow_id);
                let started = match *result {
                    Ok(ready) => start_ready(&myself, state, ready, asked.start()).await,
                    Err(error) => Err(error),
                };
                after_takeover(&myself, state, workflow_id, started, asked);
            }
            WorkflowsMsg::ClaimRecoverable if state.draining => {}
            WorkflowsMsg::ClaimRecoverable if state.claiming => state.claim_again = true,
            WorkflowsMsg::ClaimRecoverable => {
                state.claiming = true;
                let versions = our_versions(state);
                let (store, me) = (state.args.store.clone(), myself.clone());
                let automatic = state.args.options.automatic_recovery;
                let live: std::collections::HashSet<WorkflowId> =
                    state.live.keys().cloned().collect();
                tokio::spawn(async move {
                    let (found, next_wake_ms) = claimable(&store, &versions, automatic).await;
                    let full = found.len() >= RECOVERY_BATCH as usize;
                    let found = found
                        .into_iter()
                        .filter(|orphan| !live.contains(&orphan.workflow_id));
                    claim_all(&me, found).await;
                    let _ = me.post(WorkflowsMsg::Claimed { full, next_wake_ms });
                });
            }
            WorkflowsMsg::Claimed { full, next_wake_ms } => {
                state.claiming = false;
                if full || std::mem::take(&mut state.claim_again) {
                    let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
                }
                plan_wake(&myself, state, next_wake_ms);
            }
            WorkflowsMsg::WakeDue => {
                state.planned_wake_ms = None;
                let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
            }
            WorkflowsMsg::PollControls => {
                // One poll at a time: a slow store must not pile them up.
                if state.live.is_empty() || state.polling {
                    return Ok(());
                }
                state.polling = true;
                let (store, me) = (state.args.store.clone(), myself.clone());
                let owner = state.args.worker_id.clone();
                tokio::spawn(async move {
                    let pending = store
                        .workflows_with_pending_controls(&owner)
                        .await
                        .unwrap_or_else(|error| {
                            tracing::warn!(%error, "looking for controls failed");
                            Vec::new()
                        });
                    let _ = me.post(WorkflowsMsg::PendingControls(pending));
                });
            }
            WorkflowsMsg::PendingControls(pending) => {
                state.polling = false;
                for workflow_id in pending {
                    if let Some(supervisor) = state.live.get(&workflow_id) {
                        // A supervisor that stopped meanwhile needs no poll.
                        let _ = supervisor.post(WorkflowMsg::Poll);
                    }
                }
            }
            WorkflowsMsg::Changed(change) => changed(&myself, state, change),
            WorkflowsMsg::SlotWanted(workflow_id) => {
                if !state.slot_waiters.contains(&workflow_id) {
                    state.slot_waiters.push_back(workflow_id);
                }
            }
            WorkflowsMsg::Live { reply } => {
                let _ = reply.send(state.live.keys().cloned().collect());
            }
            WorkflowsMsg::Drain => {
                tracing::info!("draining: no more recoveries");
                state.draining = true;
            }
            WorkflowsMsg::Fence {
                workflow_id,
                shutdown,
                reply,
            } => match state.live.get(&workflow_id) {
                // The supervisor answers once it has stopped writing and let the lease go.
                Some(supervisor) => {
                    let _ = supervisor.post(WorkflowMsg::GiveUp { shutdown, reply });
                }
                None => {
                    let _ = reply.send(Err(Error::NotSupervised { workflow_id }));
                }
            },
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut WorkflowsState,
    ) -> Result<(), ActorProcessingErr> {
        let (mut abandoned, mut dormant) = (false, false);
        let cell = match event {
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                abandoned = reason.as_deref() == Some(crate::workflow::ABANDONED);
                dormant = reason.as_deref() == Some(crate::workflow::DORMANT);
                cell
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                // Never restarted in place: its lease lapses and recovery replays the journal.
                tracing::error!(%error, "a workflow supervisor failed");
                cell
            }
            _ => return Ok(()),
        };
        // Its name says which workflow it supervised (a lookup, not a scan: many supervisors
        // stop together when their workflows go dormant).
        let named = cell
            .get_name()
            .and_then(|name| name.strip_prefix("workflow-").map(WorkflowId::new))
            .filter(|id| {
                state
                    .live
                    .get(id)
                    .is_some_and(|child| child.get_id() == cell.get_id())
            });
        let ended: Vec<WorkflowId> = match named {
            Some(workflow_id) => vec![workflow_id],
            None => state
                .live
                .iter()
                .filter(|(_, child)| child.get_id() == cell.get_id())
                .map(|(id, _)| id.clone())
                .collect(),
        };
        for workflow_id in ended {
            state.live.remove(&workflow_id);
            state.live_users.remove(&workflow_id);
            state.slot_waiters.retain(|waiter| waiter != &workflow_id);
            if abandoned && !state.draining {
                // Left live with a lease that runs out within a lease period: take it back
                // then (its journal decides what happens next), in either recovery mode.
                let wait = Duration::from_millis(state.args.options.lease_ms.max(1) + 100);
                let id = workflow_id.clone();
                crate::mailbox::post_after(&myself, wait, move || WorkflowsMsg::TakeBack {
                    workflow_id: id,
                    tries: 0,
                });
            }
            // Nobody listening is fine: it is a cue, never the record.
            let _ = state.args.stopped.send(workflow_id);
        }
        count_supervisors(state);
        if dormant {
            // Its wake time may come before the one planned: a claim plans again.
            let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
        }
        Ok(())
    }
}

/// Hands every change the bus announces to the actor, as a message; a receiver that fell
/// behind has missed some, which is a resync.
fn listen(
    myself: &ActorRef<WorkflowsMsg>,
    mut changes: broadcast::Receiver<Change>,
) -> crate::mailbox::Task {
    let me = myself.clone();
    crate::mailbox::Task::spawn(async move {
        loop {
            let change = match changes.recv().await {
                Ok(change) => change,
                Err(broadcast::error::RecvError::Lagged(_)) => Change::Resync,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if me.post(WorkflowsMsg::Changed(change)).is_err() {
                return;
            }
        }
    })
}

/// What a committed change means for this node: a control for a workflow it runs wakes that
/// supervisor; an answer to a child's request wakes the supervisor that waits for it; a freed
/// slot wakes the oldest steps waiting for one; released leases wake automatic recovery; a
/// resync does all of it. Each of these changes but a freed slot and a released lease also
/// wakes this node's event streams of its workflow (its events committed with it); a status
/// change wakes the feed's streams too. On PostgreSQL, an event of a workflow that some stream
/// watches is announced by itself (`Change::Event`), whichever node wrote it.
fn changed(myself: &ActorRef<WorkflowsMsg>, state: &mut WorkflowsState, change: Change) {
    let wakes = state.args.store.event_wakes();
    match &change {
        Change::Status(workflow_id) => wakes.committed(workflow_id, true),
        Change::Control(workflow_id) | Change::Input(workflow_id) | Change::Event(workflow_id) => {
            wakes.committed(workflow_id, false);
        }
        Change::Resync => wakes.resync(),
        Change::SlotFreed | Change::Recoverable => {}
    }
    match change {
        Change::Control(workflow_id) => {
            if let Some(supervisor) = state.live.get(&workflow_id) {
                let _ = supervisor.post(WorkflowMsg::Poll);
            }
        }
        Change::Input(workflow_id) => {
            if let Some(supervisor) = state.live.get(&workflow_id) {
                let _ = supervisor.post(WorkflowMsg::InputChanged);
            }
        }
        Change::SlotFreed => wake_slot_waiters(state, SLOT_WAKES_MAX),
        // A dormant workflow woken by a control or an event is claimed in either mode.
        Change::Recoverable => {
            let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
        }
        Change::Status(_) | Change::Event(_) => {}
        Change::Resync => {
            let _ = myself.post(WorkflowsMsg::PollControls);
            wake_slot_waiters(state, usize::MAX);
            for supervisor in state.live.values() {
                let _ = supervisor.post(WorkflowMsg::InputChanged);
                // An event's cue may be among those missed: a waiting `waitForEvent` reads.
                let _ = supervisor.post(WorkflowMsg::Poll);
            }
            let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
        }
    }
}

/// Tells up to `count` of the oldest supervisors waiting for a slot to ask again; those refused
/// again say so anew.
fn wake_slot_waiters(state: &mut WorkflowsState, count: usize) {
    let picked = rules::waiters_to_wake(&state.slot_waiters, count, |workflow_id| {
        state.live_users.get(workflow_id).map(String::as_str)
    });
    let mut woken = Vec::with_capacity(picked.len());
    // Highest place first, so that each removal leaves the places still to remove as they were.
    for place in picked.into_iter().rev() {
        if let Some(workflow_id) = state.slot_waiters.remove(place) {
            woken.push(workflow_id);
        }
    }
    for workflow_id in woken.into_iter().rev() {
        if let Some(supervisor) = state.live.get(&workflow_id) {
            let _ = supervisor.post(WorkflowMsg::SlotFreed);
        }
    }
}

/// Tells whoever waits for a takeover to cancel that this try is decided.
fn reply_done(done: Option<RpcReplyPort<()>>) {
    if let Some(done) = done {
        let _ = done.send(());
    }
}

/// The versions this node replays journals under.
fn our_versions(state: &WorkflowsState) -> store::Versions {
    store::Versions {
        runtime: runtime::runtime_version(&state.args.options.limits),
        configuration: state.args.agents.configuration_version(),
    }
}

/// What a claim takes: under automatic recovery every recoverable workflow (the dormant ones
/// whose wake time came among them), under manual recovery only those dormant ones; and when
/// the next dormant workflow wakes (epoch ms). A read that fails claims nothing this time.
async fn claimable(
    store: &StoreHandle,
    versions: &store::Versions,
    automatic: bool,
) -> (Vec<store::Orphaned>, Option<i64>) {
    let dormancy = match store.dormant_workflows(RECOVERY_BATCH, versions).await {
        Ok(dormancy) => dormancy,
        Err(error) => {
            tracing::warn!(%error, "looking for dormant workflows failed");
            store::Dormancy::default()
        }
    };
    let next_wake_ms = dormancy
        .next_wake_at
        .filter(|at| *at < store::DORMANT_FOREVER_S)
        .map(|at| (at * 1000.0).ceil() as i64);
    if !automatic {
        return (dormancy.due, next_wake_ms);
    }
    match store.recoverable_workflows(RECOVERY_BATCH, versions).await {
        Ok(orphaned) => (orphaned, next_wake_ms),
        Err(error) => {
            tracing::warn!(%error, "looking for recoverable workflows failed");
            (dormancy.due, next_wake_ms)
        }
    }
}

/// Plans a claim for when the next dormant workflow wakes, unless one is planned sooner: the
/// claim period alone would wake it up to a period late. Judged by the database's clock as
/// this node reads it (`clock::now_ms`): an error in that reading claims early, finds nothing,
/// and the period claims it.
fn plan_wake(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    next_wake_ms: Option<i64>,
) {
    let Some(wake_ms) = next_wake_ms else {
        return;
    };
    if state
        .planned_wake_ms
        .is_some_and(|planned| planned <= wake_ms)
    {
        return;
    }
    state.planned_wake_ms = Some(wake_ms);
    let delay = Duration::from_millis(u64::try_from(wake_ms.saturating_sub(now_ms())).unwrap_or(0));
    crate::mailbox::post_after(myself, delay, || WorkflowsMsg::WakeDue);
}

/// Takes over every orphaned workflow of a claim, all at once, each with the usual rules (a
/// pending cancellation is finished without replaying the body), and returns when every
/// takeover is decided.
async fn claim_all(
    workflows: &ActorRef<WorkflowsMsg>,
    orphaned: impl Iterator<Item = store::Orphaned>,
) {
    let mut decided = Vec::new();
    for orphan in orphaned {
        let workflow_id = orphan.workflow_id;
        if orphan.cancel_pending {
            let (done, answer) = ractor::concurrency::oneshot();
            let _ = workflows.post(WorkflowsMsg::TakeOverToCancel {
                workflow_id,
                tries: 0,
                done: Some(done.into()),
            });
            decided.push(tokio::spawn(async move {
                let _ = answer.await;
            }));
            continue;
        }
        let (reply, answer) = ractor::concurrency::oneshot();
        let _ = workflows.post(WorkflowsMsg::Recover {
            workflow_id: workflow_id.clone(),
            reply: reply.into(),
        });
        decided.push(tokio::spawn(async move {
            match answer.await {
                Ok(Ok(_)) => tracing::info!(run_id = %workflow_id, "recovered automatically"),
                Ok(Err(error)) => tracing::info!(run_id = %workflow_id, %error, "not recovered"),
                Err(_) => {}
            }
        }));
    }
    futures_util::future::join_all(decided).await;
}

/// Takes a workflow over in a task, which also reads it back (and, for a reconcile, settles its
/// step): nothing of it runs on the actor's turn. The result comes back as
/// [`WorkflowsMsg::TakenOver`], where the supervisor starts. A workflow supervised here, or with
/// a takeover in flight here, is not taken over again: the asker hears
/// [`Error::Supervised`] at once.
fn take_over(
    state: &mut WorkflowsState,
    myself: &ActorRef<WorkflowsMsg>,
    workflow_id: WorkflowId,
    asked: Asked,
) {
    if state.live.contains_key(&workflow_id) || !state.taking_over.insert(workflow_id.clone()) {
        let supervised = Err(Error::Supervised {
            workflow_id: workflow_id.clone(),
        });
        after_takeover(myself, state, workflow_id, supervised, asked);
        return;
    }
    let (store, me) = (state.args.store.clone(), myself.clone());
    let (owner, lease_ms) = (state.args.worker_id.clone(), state.args.options.lease_ms);
    let (versions, limits) = (our_versions(state), state.args.options.launch_limits);
    tokio::spawn(async move {
        let result = async {
            let sent = Instant::now();
            let purpose = match asked.action() {
                Takeover::Recover => store::Purpose::Recover,
                Takeover::Reconcile => store::Purpose::Reconcile,
                Takeover::Cancel => store::Purpose::Cancel,
            };
            let answer = store
                .take_over_workflow(&workflow_id, &owner, lease_ms, &versions, purpose)
                .await;
            let lease = rules::taken(asked.action(), answer)?;
            let workflow = match &asked {
                Asked::Reconcile { request, .. } => {
                    reconcile(&store, limits, request, &lease).await?
                }
                _ => Supervised::stored(stored_row(&store, &workflow_id).await?)?,
            };
            Ok(Ready {
                workflow,
                lease,
                sent,
            })
        }
        .await;
        let _ = me.post(WorkflowsMsg::TakenOver {
            workflow_id,
            result: Box::new(result),
            asked,
        });
    });
}

/// Starts the supervisor of a workflow this node has taken over, unless one supervises it
/// here already (then the lease just taken is given back, in a task). Runs on the actor's turn,
/// so no two supervisors of one workflow ever start on this node.
async fn start_ready(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    ready: Ready,
    start: Start,
) -> Result<WorkflowId, Error> {
    let workflow_id = ready.workflow.workflow_id.clone();
    if state.live.contains_key(&workflow_id) {
        let (store, fence) = (state.args.store.clone(), ready.lease.fence());
        tokio::spawn(async move {
            let _ = store.release_lease(&fence).await;
        });
        return Err(Error::Supervised { workflow_id });
    }
    start_supervisor(
        myself,
        state,
        ready.workflow,
        ready.lease,
        ready.sent,
        start,
    )
    .await?;
    Ok(workflow_id)
}

/// What follows a takeover's end, for whoever asked for it.
fn after_takeover(
    myself: &ActorRef<WorkflowsMsg>,
    state: &WorkflowsState,
    workflow_id: WorkflowId,
    started: Result<WorkflowId, Error>,
    asked: Asked,
) {
    let lease_period = Duration::from_millis(state.args.options.lease_ms.max(1));
    match asked {
        Asked::Recover(reply) | Asked::Reconcile { reply, .. } => {
            let _ = reply.send(started);
        }
        Asked::Cancel { tries, done } => {
            match started {
                Ok(_) => {
                    tracing::info!(run_id = %workflow_id, "finishing the cancellation of a workflow whose owner is gone");
                }
                // The owner may be alive (its poll finds the cancel and carries it out), or dead
                // with a lease not yet run out: look again when it may have.
                Err(Error::LeaseHeld { .. } | Error::Supervised { .. })
                    if tries + 1 < CANCEL_TAKEOVER_TRIES =>
                {
                    crate::mailbox::post_after(myself, lease_period, move || {
                        WorkflowsMsg::TakeOverToCancel {
                            workflow_id,
                            tries: tries + 1,
                            done: None,
                        }
                    });
                }
                // It already ended, or no cancellation is pending any more.
                Err(
                    Error::LeaseHeld { .. }
                    | Error::Supervised { .. }
                    | Error::NotLive { .. }
                    | Error::TakeoverRefused { .. },
                ) => {}
                Err(error @ Error::Store(_)) => {
                    tracing::warn!(run_id = %workflow_id, %error, "cannot take the workflow over to cancel it");
                }
                Err(error) => {
                    tracing::error!(run_id = %workflow_id, %error, "cannot finish the cancellation");
                }
            }
            reply_done(done);
        }
        Asked::TakeBack { tries } => match started {
            Ok(_) => tracing::info!(run_id = %workflow_id, "taken back"),
            Err(Error::LeaseHeld { .. }) if tries + 1 < TAKE_BACK_TRIES => {
                // Still this node's own lease, running out: ask again when it has. Another
                // node's lease means that node took the workflow over: it is not ours to
                // take back.
                let (store, me) = (state.args.store.clone(), myself.clone());
                let ours = state.args.worker_id.clone();
                tokio::spawn(async move {
                    if let Ok(Some(lease)) = store.read_lease(&workflow_id).await
                        && lease.owner == ours
                    {
                        crate::mailbox::post_after(&me, lease_period, move || {
                            WorkflowsMsg::TakeBack {
                                workflow_id,
                                tries: tries + 1,
                            }
                        });
                    }
                });
            }
            Err(Error::Store(error)) if error.is_transient() && tries + 1 < TAKE_BACK_TRIES => {
                crate::mailbox::post_after(myself, lease_period, move || WorkflowsMsg::TakeBack {
                    workflow_id,
                    tries: tries + 1,
                });
            }
            // A cancellation is pending (or another rule refused): a cancel takeover
            // finishes it if one is asked for; otherwise the workflow waits as it is.
            Err(Error::TakeoverRefused { .. }) => {
                let _ = myself.post(WorkflowsMsg::TakeOverToCancel {
                    workflow_id,
                    tries: 0,
                    done: None,
                });
            }
            Err(
                error
                @ (Error::LeaseHeld { .. } | Error::NotLive { .. } | Error::Supervised { .. }),
            ) => {
                tracing::info!(run_id = %workflow_id, %error, "not taken back");
            }
            Err(error) => {
                tracing::warn!(run_id = %workflow_id, %error, "cannot take it back");
            }
        },
    }
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

async fn stored_row(store: &StoreHandle, workflow_id: &WorkflowId) -> Result<WorkflowRow, Error> {
    store
        .read_workflow(workflow_id)
        .await?
        .ok_or_else(|| not_found(workflow_id))
}

/// Settles the step under the new lease (in the takeover's task) and answers the workflow its
/// supervisor resumes by replay.
async fn reconcile(
    store: &StoreHandle,
    limits: LaunchLimits,
    request: &ReconcileRequest,
    lease: &store::Lease,
) -> Result<Supervised, Error> {
    let id = &request.workflow_id;
    let row = store
        .read_workflow(id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let steps = store.read_steps(id).await?;
    let (ops, row) = rules::reconcile_writes(row, steps, limits, request, now_ms())?;
    let written = store.fenced_write(&lease.fence(), ops).await;
    if let Err(store::Error::LimitReached(limit)) = &written {
        // Nothing was written; the lease taken for the reconcile is given back so that the
        // operator can try again once a place is free.
        let _ = store.release_lease(&lease.fence()).await;
        let max = match limit {
            store::Limit::Workflows => limits.max_workflows,
            store::Limit::WorkflowsPerOwner => limits.max_workflows_per_owner,
            store::Limit::TokensPerUser { max } => u64::from(*max),
            store::Limit::StoredBytes { max, .. }
            | store::Limit::UntakenEvents { max }
            | store::Limit::UntakenEventBytes { max, .. } => u64::try_from(*max).unwrap_or(0),
        };
        return Err(Error::LimitReached { limit: *limit, max });
    }
    written?;
    Supervised::stored(row)
}

async fn start_supervisor(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    workflow: Supervised,
    lease: store::Lease,
    sent: Instant,
    start: Start,
) -> Result<(), Error> {
    let Supervised {
        workflow_id,
        user_id,
        document,
    } = workflow;
    let options = &state.args.options;
    let (supervisor, _) = Actor::spawn_linked(
        Some(format!("workflow-{workflow_id}")),
        WorkflowSupervisor,
        WorkflowArgs {
            workflow_id: workflow_id.clone(),
            user_id: user_id.clone(),
            fence: lease.fence(),
            document,
            store: state.args.store.clone(),
            runs: state.args.runs.clone(),
            js: state.args.js.clone(),
            lease: state.args.lease.clone(),
            agents: std::sync::Arc::clone(&state.args.agents),
            metrics: std::sync::Arc::clone(&state.args.metrics),
            limits: options.limits.clone(),
            workspaces_dir: options.workspaces_dir.clone(),
            artifact_bytes_max: options.artifact_bytes_max,
            log_events_max: options.log_events_max,
            log_event_bytes_max: options.log_event_bytes_max,
            capture_timeout: options.capture_timeout,
            node_files: std::sync::Arc::clone(&options.node_files),
            slots_max: options.slots_max,
            slots_per_user_max: options.slots_per_user_max,
            slots_reserved: options.slots_reserved,
            stored_bytes_max: options.stored_bytes_max,
            cancel_window_ms: options.lease_ms * 2,
            timeout_ms: match options.timeout_seconds {
                0 => LEGACY_TIMEOUT_MS,
                seconds => seconds.saturating_mul(1000),
            },
            start,
            faults: options.faults.clone(),
            deadline: sent + Duration::from_millis(options.lease_ms),
            wake_fallback: options.wake_fallback,
            dormant_after: options.dormant_after,
            workflows: myself.clone(),
        },
        myself.get_cell(),
    )
    .await
    .map_err(|e| Error::Spawn {
        actor: "workflow",
        reason: e.to_string(),
    })?;
    state.live.insert(workflow_id.clone(), supervisor);
    state.live_users.insert(workflow_id, user_id);
    count_supervisors(state);
    Ok(())
}

/// Keeps the `reins_workflow_supervisors` gauge at the number of supervisors running here.
fn count_supervisors(state: &WorkflowsState) {
    let live = i64::try_from(state.live.len()).unwrap_or(i64::MAX);
    state
        .args
        .metrics
        .workflow_supervisors
        .store(live, std::sync::atomic::Ordering::Relaxed);
}

fn not_found(workflow_id: &WorkflowId) -> Error {
    Error::NoWorkflow {
        workflow_id: workflow_id.to_owned(),
    }
}

/// A cheap, cloneable way to launch and control workflows on this node.
#[derive(Clone)]
pub struct WorkflowsHandle {
    actor: ActorRef<WorkflowsMsg>,
    store: StoreHandle,
    timeout: Duration,
    stopped: broadcast::Sender<WorkflowId>,
    /// Where the threads of workflows' agent steps live (removed with their workflow).
    workspaces_dir: std::path::PathBuf,
    events: EventLimits,
}

/// What bounds the events sent to workflows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventLimits {
    /// The largest payload of one, as JSON (`limits.frame_bytes_max`).
    pub payload_bytes_max: u64,
    /// The events a workflow holds untaken at most, and their bytes.
    pub bounds: store::EventBounds,
    /// The owner's quota, which every event's payload counts against
    /// (`limits.user_stored_bytes_max`; 0: none).
    pub stored_bytes_max: u64,
}

impl WorkflowsHandle {
    pub(crate) fn new(
        actor: ActorRef<WorkflowsMsg>,
        store: StoreHandle,
        timeout: Duration,
        stopped: broadcast::Sender<WorkflowId>,
        workspaces_dir: std::path::PathBuf,
        events: EventLimits,
    ) -> Self {
        WorkflowsHandle {
            actor,
            store,
            timeout,
            stopped,
            workspaces_dir,
            events,
        }
    }

    /// The ids of workflows whose supervisor on this node stops from now on: it finished,
    /// needs reconciliation, was fenced or given up. A cue to read the workflow, not a record:
    /// a receiver that falls more than `STOPPED_BACKLOG` (1,024) ids behind misses some
    /// (`RecvError::Lagged`) and reads the rows it waits for instead.
    pub fn stopped(&self) -> broadcast::Receiver<WorkflowId> {
        self.stopped.subscribe()
    }

    async fn call<T: Send + 'static>(
        &self,
        message: impl FnOnce(RpcReplyPort<T>) -> WorkflowsMsg,
    ) -> Result<T, Error> {
        crate::error::ask(&self.actor, "workflows", self.timeout, message).await
    }

    /// Launches a workflow on this node.
    pub async fn launch(&self, request: LaunchRequest) -> Result<Launched, Error> {
        self.call(|reply| WorkflowsMsg::Launch { request, reply })
            .await?
    }

    /// Runs a failed workflow again from its failed step, as a new workflow supervised on this
    /// node (see `rules::retry`); a workflow retried before answers its retry (`created:
    /// false`).
    ///
    /// A retry that does not answer within the call's timeout (a large copy, a slow store) goes
    /// on: that is an unknown outcome, never "nothing was written". Asking again is safe: a
    /// workflow is retried once, and the retry made answers it.
    pub async fn retry(&self, request: RetryRequest) -> Result<Launched, Error> {
        let source = request.workflow_id.clone();
        match self
            .call(|reply| WorkflowsMsg::Retry { request, reply })
            .await
        {
            Ok(answer) => answer,
            Err(Error::Unanswered { reason, .. }) => {
                Err(Error::Store(store::Error::OutcomeUnknown(format!(
                    "the retry of {:?} did not answer ({reason}); it may still be made: ask \
                     again (a workflow is retried once) or read its retried_by",
                    source.as_str()
                ))))
            }
            Err(error) => Err(error),
        }
    }

    /// A workflow with its lease, controls, checkpoints, first `steps_max` steps and first
    /// `artifacts_max` artifact versions, if it exists.
    pub async fn get(
        &self,
        workflow_id: &WorkflowId,
        steps_max: u32,
        artifacts_max: u32,
    ) -> Result<Option<WorkflowView>, Error> {
        let Some(snapshot) = self
            .store
            .read_snapshot(workflow_id, steps_max, artifacts_max)
            .await?
        else {
            return Ok(None);
        };
        let row = snapshot.row;
        let recoverable = row.status.holds_place()
            && snapshot
                .lease
                .as_ref()
                .is_none_or(|lease| lease.expires_at <= snapshot.db_now);
        Ok(Some(WorkflowView {
            row,
            steps: snapshot.steps,
            checkpoints: snapshot.checkpoints,
            controls: snapshot.controls,
            lease: snapshot.lease,
            approval_runs: snapshot.approval_runs,
            artifacts: snapshot.artifacts,
            recoverable,
            retried_by: snapshot.retried_by,
            waits: snapshot.waits,
        }))
    }

    /// Records a `resume` of a pause (any node; the owner carries it out). Refused as a conflict
    /// when the fingerprint is stale or the step is not a pause of this workflow at that attempt.
    pub async fn resume(&self, request: Resume, by: &str) -> Result<ControlWrite, Error> {
        if let Some(fingerprint) = &request.fingerprint {
            let row = self
                .store
                .read_workflow(&request.workflow_id)
                .await?
                .ok_or_else(|| not_found(&request.workflow_id))?;
            rules::same_script(&row, fingerprint)?;
        }
        self.journaled_step(
            &request.workflow_id,
            &request.step_id,
            CallKind::Pause,
            request.attempt,
        )
        .await?;
        self.control_at(
            &request.workflow_id,
            ControlKind::Resume,
            &request.step_id,
            request.attempt,
            json!({ "input": request.input }),
            by,
        )
        .await
    }

    /// Records an event sent to a live workflow, once per `event_id` (see
    /// [`store::Store::send_event`]): kept until a `waitForEvent` of its name takes it. Its
    /// payload is bounded as a step's input is (`limits.frame_bytes_max`), checked before
    /// anything is written; its bytes count against the workflow owner's quota.
    pub async fn send_event(&self, event: SendEvent, by: &str) -> Result<store::EventSend, Error> {
        let bytes = event.payload.to_string().len();
        let limit = usize::try_from(self.events.payload_bytes_max).unwrap_or(usize::MAX);
        if bytes > limit {
            return Err(Error::TooLarge {
                what: "the event's payload",
                bytes,
                limit_name: "limits.frame_bytes_max",
                limit,
            });
        }
        let sent = store::NewSentEvent {
            workflow_id: event.workflow_id,
            event_id: event.event_id,
            name: event.name,
            payload: event.payload,
            created_by: Some(by.to_owned()),
            bounds: self.events.bounds,
            stored_bytes_max: i64::try_from(self.events.stored_bytes_max).unwrap_or(i64::MAX),
        };
        Ok(self.store.send_event(sent).await?)
    }

    /// Records a decision on a checkpoint, once: an identical decision again is the same row; a
    /// different one, or one about another artifact version, is refused as a conflict.
    pub async fn decide(&self, request: Decide, by: &str) -> Result<ControlWrite, Error> {
        rules::valid_decision(&request)?;
        let step = self
            .journaled_step(
                &request.workflow_id,
                &request.step_id,
                CallKind::HumanCheckpoint,
                request.attempt,
            )
            .await?;
        let body = rules::decision(&request, &step)?;
        self.control_at(
            &request.workflow_id,
            ControlKind::Decide,
            &request.step_id,
            request.attempt,
            body,
            by,
        )
        .await
    }

    /// The journal entry a control answers (see [`rules::answered_step`]), of a workflow that
    /// exists.
    async fn journaled_step(
        &self,
        workflow_id: &WorkflowId,
        step_id: &str,
        kind: CallKind,
        attempt: i32,
    ) -> Result<StepRow, Error> {
        let steps = self.store.read_steps(workflow_id).await?;
        if steps.is_empty() && self.store.read_workflow(workflow_id).await?.is_none() {
            return Err(not_found(workflow_id));
        }
        rules::answered_step(steps, step_id, kind, attempt)
    }

    async fn control_at(
        &self,
        workflow_id: &WorkflowId,
        kind: ControlKind,
        step_id: &str,
        attempt: i32,
        body: Value,
        by: &str,
    ) -> Result<ControlWrite, Error> {
        Ok(self
            .store
            .put_control(NewControl {
                workflow_id: workflow_id.to_owned(),
                kind,
                step_id: step_id.to_owned(),
                attempt,
                body,
                created_by: Some(by.to_owned()),
            })
            .await?)
    }

    /// Asks a workflow to stop, durably: the owner interrupts its child runs and ends it
    /// `cancelled` (or `needs_reconciliation` if a child's fate cannot be observed in time).
    /// Cancelling again is the same request.
    pub async fn cancel(&self, workflow_id: &WorkflowId, by: &str) -> Result<ControlWrite, Error> {
        let recorded = self
            .control_at(workflow_id, ControlKind::Cancel, "", 0, json!({}), by)
            .await?;
        // If the owner is gone, this node finishes the cancellation (without replaying the body);
        // if it is alive, the takeover is refused and the owner's poll finds the request. An
        // owner that died with its lease still valid is looked at again once it may have run out.
        let _ = self.actor.post(WorkflowsMsg::TakeOverToCancel {
            workflow_id: workflow_id.to_owned(),
            tries: 0,
            done: None,
        });
        Ok(recorded)
    }

    /// Deletes a terminal workflow with everything it holds: its rows, then the workspaces of
    /// its agent steps' threads (see [`crate::workspace::remove_thread`]). The journal is read
    /// first, since it is what names those threads.
    pub async fn delete(&self, workflow_id: &WorkflowId) -> Result<store::Deletion, Error> {
        let steps = self.store.read_steps(workflow_id).await?;
        let deletion = self.store.delete_workflow(workflow_id).await?;
        if deletion != store::Deletion::Deleted {
            return Ok(deletion);
        }
        let threads: std::collections::BTreeSet<String> = steps
            .iter()
            .filter(|step| step.kind() == Some(store::StepKind::Agent))
            .map(|step| crate::workflow::thread_for(workflow_id, &step.step_id))
            .collect();
        let workspaces_dir = self.workspaces_dir.clone();
        let removed = tokio::task::spawn_blocking(move || {
            threads
                .iter()
                .map(|thread| crate::workspace::remove_thread(&workspaces_dir, thread))
                .find_map(Result::err)
        })
        .await;
        // The workflow is gone either way; what is left on disk is only logged.
        match removed {
            Ok(None) => {}
            Ok(Some(error)) => {
                tracing::warn!(%workflow_id, %error, "cannot remove a deleted workflow's workspace");
            }
            Err(error) => {
                tracing::warn!(%workflow_id, %error, "removing a deleted workflow's workspaces failed");
            }
        }
        Ok(deletion)
    }

    /// A page of workflows, newest first.
    pub async fn list(
        &self,
        filter: store::ListFilter,
    ) -> Result<Vec<store::ListedWorkflow>, Error> {
        Ok(self.store.list_workflows(filter).await?)
    }

    /// Takes over a recoverable workflow (live, its owner's lease expired) with epoch + 1 and
    /// replays it on this node. Refused, with the lease untouched, when this node's runtime
    /// version differs or a cancellation is pending.
    pub async fn recover(&self, workflow_id: &WorkflowId) -> Result<WorkflowId, Error> {
        let workflow_id = workflow_id.to_owned();
        self.call(|reply| WorkflowsMsg::Recover { workflow_id, reply })
            .await?
    }

    /// Settles the uncertain step of a workflow in `needs_reconciliation` (retry it as a new
    /// attempt, fail it, or complete it with an output) and resumes the workflow here by replay.
    pub async fn reconcile(&self, request: ReconcileRequest) -> Result<WorkflowId, Error> {
        self.call(|reply| WorkflowsMsg::Reconcile {
            request: Box::new(request),
            reply,
        })
        .await?
    }

    /// Stops every workflow supervisor of this node and waits for them (node shutdown). Each
    /// first gives its lease up after its last write (fenced on its epoch; the release wakes
    /// automatic recovery on the other nodes), so another node takes the workflow over at once
    /// instead of when the lease would have run out; one whose child run is in flight keeps it.
    pub(crate) async fn stop_supervisors(&self, timeout: Duration) {
        let give_up = async {
            let live = self.live().await.unwrap_or_default();
            let given_up = futures_util::future::join_all(live.into_iter().map(|workflow_id| {
                self.call(|reply| WorkflowsMsg::Fence {
                    workflow_id,
                    shutdown: true,
                    reply,
                })
            }))
            .await;
            for failed in given_up
                .into_iter()
                .filter_map(|given| given.and_then(|r| r).err())
            {
                // A workflow that ended meanwhile holds nothing, one with a child run in flight
                // keeps its lease (refused both); any other's lease runs out by itself, as after
                // a crash.
                if !matches!(
                    failed,
                    Error::NotSupervised { .. } | Error::ChildInFlight { .. }
                ) {
                    tracing::warn!(error = %failed, "a workflow's lease was not given up at shutdown");
                }
            }
        };
        if tokio::time::timeout(timeout, give_up).await.is_err() {
            tracing::warn!("giving the leases up did not finish within the shutdown timeout");
        }
        self.actor
            .stop_children_and_wait(Some("shutdown".into()), Some(timeout))
            .await;
    }

    /// Stops taking recoveries on this node (manual and automatic).
    pub fn drain(&self) {
        let _ = self.actor.post(WorkflowsMsg::Drain);
    }

    /// Gives up one workflow's lease now: its supervisor stops writing, then releases the lease,
    /// so another node can recover it at once. Answers the epoch that was given up.
    pub async fn fence(&self, workflow_id: &WorkflowId) -> Result<Epoch, Error> {
        let workflow_id = workflow_id.to_owned();
        self.call(|reply| WorkflowsMsg::Fence {
            workflow_id,
            shutdown: false,
            reply,
        })
        .await?
    }

    /// The workflows supervised on this node.
    pub async fn live(&self) -> Result<Vec<WorkflowId>, Error> {
        self.call(|reply| WorkflowsMsg::Live { reply }).await
    }
}
