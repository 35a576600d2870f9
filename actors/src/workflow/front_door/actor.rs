//! The `Workflows` actor: its state, its messages, and the dispatch of each message to the file
//! that handles it; the supervisors it starts and counts.

use std::collections::HashMap;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use store::{Change, Epoch, Launch, WorkflowId};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::launch::{self, Launched, PendingRetry, RetryDone};
use super::takeover::{self, Ready};
use super::{WorkflowsOptions, changes, controls};
use crate::child_run::RunsHandle;
use crate::error::{Error, Takeover};
use crate::js_pool::JsPool;
use crate::lease::LeaseMsg;
use crate::mailbox::Post;
use crate::store_actor::StoreHandle;
use crate::workflow::requests::{LaunchRequest, ReconcileRequest, RetryRequest};
use crate::workflow::rules::{self, Supervised};
use crate::workflow::{Start, WorkflowArgs, WorkflowMsg, WorkflowSupervisor};

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
    /// A takeover's task has finished (see [`take_over`](super::takeover::take_over)): the workflow taken over and read
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
    pub(super) fn action(&self) -> Takeover {
        match self {
            Asked::Recover(_) | Asked::TakeBack { .. } => Takeover::Recover,
            Asked::Reconcile { .. } => Takeover::Reconcile,
            Asked::Cancel { .. } => Takeover::Cancel,
        }
    }

    pub(super) fn start(&self) -> Start {
        rules::start_after(self.action())
    }
}

/// The life limit of a workflow launched before launches recorded theirs, on a node that sets
/// none: the day every launch then had by default.
const LEGACY_TIMEOUT_MS: u64 = 86_400_000;

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
    /// Where the ids of stopped supervisors go (see [`WorkflowsHandle::stopped`](super::WorkflowsHandle::stopped)).
    pub stopped: broadcast::Sender<WorkflowId>,
    /// The change bus: controls, freed slots, answered approvals and recoverable work wake the
    /// actor instead of a timer.
    pub changes: store::Changes,
}

pub(crate) struct WorkflowsState {
    pub(super) args: WorkflowsArgs,
    pub(super) live: HashMap<WorkflowId, ActorRef<WorkflowMsg>>,
    /// Workflows with a takeover task in flight on this node: none is taken over twice at
    /// once, and none that has a supervisor here is taken over again.
    pub(super) taking_over: std::collections::HashSet<WorkflowId>,
    /// Workflows with a retry's task in flight on this node, and the retries of each asked for
    /// meanwhile: one at a time per workflow, so that concurrent requests make one copy of its
    /// workspaces, not one each (the next, once the first is written, answers it as `repeated`).
    pub(super) retrying: HashMap<WorkflowId, std::collections::VecDeque<PendingRetry>>,
    /// A look for pending controls is in flight.
    pub(super) polling: bool,
    /// Draining: no recoveries are taken any more.
    pub(super) draining: bool,
    /// A claim of automatic recovery is under way.
    pub(super) claiming: bool,
    /// A claim was asked for while one was under way: another follows it at once.
    pub(super) claim_again: bool,
    /// The wake time (epoch ms) of a dormant workflow a claim is planned for.
    pub(super) planned_wake_ms: Option<i64>,
    /// Supervisors with a step waiting for a child slot, oldest first, each once.
    pub(super) slot_waiters: std::collections::VecDeque<WorkflowId>,
    /// The user who launched each live workflow, so that a freed slot wakes the waiters of
    /// several users rather than only the oldest ones of one user who holds their share.
    pub(super) live_users: HashMap<WorkflowId, String>,
    /// The task that hands the change bus to this actor (stopped with it).
    pub(super) _listening: crate::mailbox::Task,
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
        let period = rules::claim_period(
            args.options.automatic_recovery,
            args.options.lease_ms,
            args.options.wake_fallback,
        );
        crate::mailbox::post_every(&myself, period, || WorkflowsMsg::ClaimRecoverable);
        // A dormant workflow whose time came while no node ran is woken by the first to start.
        myself.post(WorkflowsMsg::ClaimRecoverable)?;
        let listening = changes::listen(&myself, args.changes.subscribe());
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
                launch::launch(&myself, state, request, reply);
            }
            WorkflowsMsg::Launched {
                workflow,
                sent,
                result,
                reply,
            } => launch::launched(&myself, state, *workflow, sent, *result, reply).await,
            WorkflowsMsg::Retry { reply, .. } if state.draining => {
                let _ = reply.send(Err(Error::Draining));
            }
            WorkflowsMsg::Retry { request, reply } => launch::retry(&myself, state, request, reply),
            WorkflowsMsg::Retried {
                source,
                result,
                reply,
            } => launch::retried(&myself, state, source, *result, reply).await,
            WorkflowsMsg::Recover { reply, .. } if state.draining => {
                let _ = reply.send(Err(Error::Draining));
            }
            WorkflowsMsg::Recover { workflow_id, reply } => {
                takeover::take_over(state, &myself, workflow_id, Asked::Recover(reply));
            }
            WorkflowsMsg::TakeOverToCancel {
                workflow_id,
                tries,
                done,
            } => {
                takeover::take_over(state, &myself, workflow_id, Asked::Cancel { tries, done });
            }
            WorkflowsMsg::Reconcile { request, reply } => {
                let workflow_id = request.workflow_id.clone();
                let asked = Asked::Reconcile { request, reply };
                takeover::take_over(state, &myself, workflow_id, asked);
            }
            WorkflowsMsg::TakeBack { .. } if state.draining => {}
            WorkflowsMsg::TakeBack { workflow_id, tries } => {
                takeover::take_over(state, &myself, workflow_id, Asked::TakeBack { tries });
            }
            WorkflowsMsg::TakenOver {
                workflow_id,
                result,
                asked,
            } => takeover::taken_over(&myself, state, workflow_id, *result, asked).await,
            WorkflowsMsg::ClaimRecoverable if state.draining => {}
            WorkflowsMsg::ClaimRecoverable if state.claiming => state.claim_again = true,
            WorkflowsMsg::ClaimRecoverable => takeover::claim(&myself, state),
            WorkflowsMsg::Claimed { full, next_wake_ms } => {
                takeover::claimed(&myself, state, full, next_wake_ms);
            }
            WorkflowsMsg::WakeDue => takeover::wake_due(&myself, state),
            WorkflowsMsg::PollControls => controls::poll(&myself, state),
            WorkflowsMsg::PendingControls(pending) => controls::pending(state, pending),
            WorkflowsMsg::Changed(change) => changes::changed(&myself, state, change),
            WorkflowsMsg::SlotWanted(workflow_id) => changes::slot_wanted(state, workflow_id),
            WorkflowsMsg::Live { reply } => {
                let _ = reply.send(state.live.keys().cloned().collect());
            }
            WorkflowsMsg::Drain => controls::drain(state),
            WorkflowsMsg::Fence {
                workflow_id,
                shutdown,
                reply,
            } => controls::fence(state, workflow_id, shutdown, reply),
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
            let lease_ms = state.args.options.lease_ms;
            if let Some(wait) = rules::take_back_after(abandoned, state.draining, lease_ms) {
                // Left live with a lease that runs out within a lease period: take it back
                // then (its journal decides what happens next), in either recovery mode.
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

pub(super) async fn start_supervisor(
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
pub(super) fn count_supervisors(state: &WorkflowsState) {
    let live = i64::try_from(state.live.len()).unwrap_or(i64::MAX);
    state
        .args
        .metrics
        .workflow_supervisors
        .store(live, std::sync::atomic::Ordering::Relaxed);
}
