//! The child-runs actor: the front door for child runs on this node, and the supervisor of their
//! child-agent actors. It checks a request before anything is written (known agent, task size,
//! thread id), admits it through the store (idempotency, one active run per thread, slots), starts
//! a linked child-agent actor for an admitted run, relays cancel requests durably, relays freed-slot
//! cues to the answered runs that wait for a slot, and periodically closes orphaned runs whose
//! node is gone. `agent.rs` is the child-agent actor of one run;
//! `commit.rs` the pure rules of its terminal commit authority; `timeouts.rs` those of its
//! attempt's time limits; `error_text.rs` how much of an agent's error is kept.

pub(crate) mod agent;
pub(crate) mod commit;
pub(crate) mod error_text;
pub(crate) mod timeouts;

use crate::mailbox::Post;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use runtime::policy::TimeoutOptions;
use serde_json::Value;
use store::{Admission, CancelAction, NewRun, RunId, RunRow, WorkflowStep};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Error;
use crate::agents::{AgentRegistry, ConfinementMode, ProcessRecords};
use crate::child_run::agent::{ChildAgent, ChildArgs, ChildMsg, RunEnd, StepSlots};
use crate::lease::LeaseMsg;
use crate::store_actor::StoreHandle;
use crate::workspace;

/// Orphaned runs closed per sweep at most.
const ORPHAN_SWEEP_LIMIT: u32 = 100;

/// A request to run an agent.
#[derive(Debug, Clone)]
pub struct RunRequest {
    pub thread_id: String,
    pub agent: String,
    /// A string (plain text) or JSON.
    pub task: Value,
    /// The same key with the same request admits the same run once.
    pub idempotency_key: Option<String>,
    pub step: Option<WorkflowStep>,
    /// The new run's id, when the caller chose it (a workflow step journals it in the
    /// admission's own transaction); a fresh one otherwise.
    pub run_id: Option<RunId>,
    /// The attempt's time limits the caller gives (`attempt_ms`, `idle_ms`; `total_ms` is the
    /// caller's own), over the agent's configured ones: the run ends `error`, class `timeout`,
    /// when one runs out.
    pub timeouts: TimeoutOptions,
}

/// What admission gave the caller.
#[derive(Debug)]
pub enum Admitted {
    /// A new run started on this node; `ended` resolves when it ends.
    Started {
        row: RunRow,
        ended: oneshot::Receiver<RunEnd>,
    },
    /// The idempotency key named an earlier run: here it is, as stored.
    Existing(RunRow),
    /// No slot is free; nothing was written.
    Queued,
}

/// A cheap, cloneable way to start and cancel child runs on this node.
#[derive(Clone)]
pub struct RunsHandle {
    actor: ActorRef<ChildRunsMsg>,
    store: StoreHandle,
    timeout: Duration,
}

impl RunsHandle {
    pub(crate) fn new(
        actor: ActorRef<ChildRunsMsg>,
        store: StoreHandle,
        timeout: Duration,
    ) -> Self {
        RunsHandle {
            actor,
            store,
            timeout,
        }
    }

    async fn call<T: Send + 'static>(
        &self,
        message: impl FnOnce(RpcReplyPort<T>) -> ChildRunsMsg,
    ) -> Result<T, Error> {
        crate::error::ask(&self.actor, "child-runs", self.timeout, message).await
    }

    /// Checks, admits and starts a child run.
    pub async fn start(&self, request: RunRequest) -> Result<Admitted, Error> {
        self.call(|reply| ChildRunsMsg::Admit { request, reply })
            .await?
    }

    /// Asks a run to stop, durably: the node running it (this one or another) stops it at its
    /// next lease renewal at the latest. Returns the action in force, or `None` if the run already
    /// has an outcome.
    pub async fn cancel(
        &self,
        run_id: &RunId,
        action: CancelAction,
    ) -> Result<Option<CancelAction>, Error> {
        let run_id = run_id.to_owned();
        Ok(self
            .call(|reply| ChildRunsMsg::Cancel {
                run_id,
                action,
                reply,
            })
            .await??)
    }

    /// Answers the newest pause of a thread (see [`store::Store::answer_approval`]).
    pub async fn answer_approval(
        &self,
        thread_id: &str,
        request_ids: &[String],
        answer: &Value,
    ) -> Result<Option<store::ApprovalAnswer>, Error> {
        Ok(self
            .store
            .answer_approval(thread_id, request_ids, answer)
            .await?)
    }

    /// One run as stored.
    pub async fn get(&self, run_id: &RunId) -> Result<Option<RunRow>, Error> {
        Ok(self.store.read_run(run_id).await?)
    }

    /// The runs executing on this node.
    pub async fn running(&self) -> Result<Vec<RunId>, Error> {
        self.call(|reply| ChildRunsMsg::Running { reply }).await
    }
}

/// Messages of the child-runs actor.
pub enum ChildRunsMsg {
    Admit {
        request: RunRequest,
        reply: RpcReplyPort<Result<Admitted, Error>>,
    },
    /// The store answered an admission.
    AdmissionDone {
        request: RunRequest,
        sent: Instant,
        result: Box<store::Result<Admission>>,
        reply: RpcReplyPort<Result<Admitted, Error>>,
    },
    /// Records a durable cancel request and delivers it at once if the run is here.
    Cancel {
        run_id: RunId,
        action: CancelAction,
        reply: RpcReplyPort<store::Result<Option<CancelAction>>>,
    },
    /// Closes orphaned runs.
    SweepOrphans,
    /// An answered run waits for a slot before its agent goes on: tell it when one frees.
    SlotWanted { run_id: RunId },
    /// A slot was freed (or changes may have been missed): the runs waiting for one ask again.
    SlotFreed,
    /// The runs executing on this node.
    Running { reply: RpcReplyPort<Vec<RunId>> },
}

/// Sizes and places the child-runs actor works with.
#[derive(Debug, Clone)]
pub struct RunsOptions {
    pub lease_ms: u64,
    pub workspaces_dir: PathBuf,
    pub fault_dir: Option<PathBuf>,
    /// Where `command` agents record their process groups (`<data_dir>/agents`), so that the
    /// next node process on this host kills what a dead one left; `None` records nothing.
    pub agent_records_dir: Option<PathBuf>,
    /// How `command` agents are confined (`agent_confinement`; see `agents::confinement`).
    pub agent_confinement: ConfinementMode,
    /// A task's JSON at most this many bytes (`limits.frame_bytes_max`).
    pub task_bytes_max: usize,
    /// An agent's error text kept at most this many bytes (`limits.error_bytes_max`).
    pub error_bytes_max: usize,
    /// How often orphaned runs are looked for.
    pub orphan_sweep: Duration,
}

pub(crate) struct ChildRuns;

pub(crate) struct ChildRunsArgs {
    pub store: StoreHandle,
    pub lease: ActorRef<LeaseMsg>,
    pub agents: Arc<AgentRegistry>,
    pub worker_id: String,
    pub options: RunsOptions,
    /// The change bus, for its freed-slot cues.
    pub changes: store::Changes,
    /// How long a run waiting for a slot waits for a cue before it asks anyway.
    pub wake_fallback: Duration,
}

pub(crate) struct ChildRunsState {
    args: ChildRunsArgs,
    running: HashMap<RunId, ActorRef<ChildMsg>>,
    /// Answered runs of this node that wait for a slot, each told once at the next cue.
    slot_waiters: HashSet<RunId>,
    /// The task that hands the change bus's freed-slot cues to this actor (stopped with it).
    _listening: crate::mailbox::Task,
}

impl Actor for ChildRuns {
    type Msg = ChildRunsMsg;
    type State = ChildRunsState;
    type Arguments = ChildRunsArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ChildRunsArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        crate::mailbox::post_every(&myself, args.options.orphan_sweep, || {
            ChildRunsMsg::SweepOrphans
        });
        let listening = listen(&myself, args.changes.subscribe());
        Ok(ChildRunsState {
            args,
            running: HashMap::new(),
            slot_waiters: HashSet::new(),
            _listening: listening,
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut ChildRunsState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: ChildRunsMsg,
        state: &mut ChildRunsState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        match message {
            ChildRunsMsg::Admit { mut request, reply } => {
                let run = match check(&state.args, &mut request) {
                    Ok(run) => run,
                    Err(error) => {
                        let _ = reply.send(Err(error));
                        return Ok(());
                    }
                };
                let (store, me) = (state.args.store.clone(), myself.clone());
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let result = store.admit_run(run).await;
                    let _ = me.post(ChildRunsMsg::AdmissionDone {
                        request,
                        sent,
                        result: Box::new(result),
                        reply,
                    });
                });
            }
            ChildRunsMsg::AdmissionDone {
                request,
                sent,
                result,
                reply,
            } => {
                let answer = match *result {
                    Ok(Admission::Admitted(row)) => {
                        start_child(&myself, state, request, sent, row).await
                    }
                    Ok(Admission::Existing(row)) => Ok(Admitted::Existing(row)),
                    Ok(Admission::Queued) => Ok(Admitted::Queued),
                    Err(error) => Err(Error::Store(error)),
                };
                let _ = reply.send(answer);
            }
            ChildRunsMsg::Cancel {
                run_id,
                action,
                reply,
            } => {
                if let Some(child) = state.running.get(&run_id) {
                    // The run is here: stop it now; the durable request covers every other node.
                    let _ = child.post(ChildMsg::Cancel(action));
                }
                let store = state.args.store.clone();
                tokio::spawn(async move {
                    let _ = reply.send(store.request_run_cancel(&run_id, action).await);
                });
            }
            ChildRunsMsg::SweepOrphans => {
                let (store, worker_id) = (state.args.store.clone(), state.args.worker_id.clone());
                tokio::spawn(async move {
                    match store
                        .claim_orphan_runs(&worker_id, ORPHAN_SWEEP_LIMIT)
                        .await
                    {
                        Ok(claimed) if !claimed.is_empty() => {
                            tracing::warn!(?claimed, "closed orphaned child runs");
                        }
                        Ok(_) => {}
                        Err(error) => tracing::warn!(%error, "orphan sweep failed"),
                    }
                    answer_expired_approvals(&store).await;
                });
            }
            ChildRunsMsg::Running { reply } => {
                let _ = reply.send(state.running.keys().cloned().collect());
            }
            ChildRunsMsg::SlotWanted { run_id } => {
                if state.running.contains_key(&run_id) {
                    state.slot_waiters.insert(run_id);
                }
            }
            ChildRunsMsg::SlotFreed => {
                for run_id in std::mem::take(&mut state.slot_waiters) {
                    if let Some(child) = state.running.get(&run_id) {
                        let _ = child.post(ChildMsg::SlotCheck);
                    }
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        _myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut ChildRunsState,
    ) -> Result<(), ActorProcessingErr> {
        let cell = match event {
            SupervisionEvent::ActorTerminated(cell, _, _) => cell,
            SupervisionEvent::ActorFailed(cell, error) => {
                // A child that panicked is not restarted in place: its lease lapses and the run is
                // closed as an orphan (or adopted by a workflow recovery).
                tracing::error!(%error, "a child-agent actor failed");
                cell
            }
            _ => return Ok(()),
        };
        let ended: Vec<RunId> = state
            .running
            .iter()
            .filter(|(_, child)| child.get_id() == cell.get_id())
            .map(|(run_id, _)| run_id.clone())
            .collect();
        for run_id in ended {
            state.running.remove(&run_id);
            state.slot_waiters.remove(&run_id);
        }
        Ok(())
    }
}

/// Hands the change bus's freed-slot cues to the actor, as messages; a resync (or a receiver
/// that fell behind) may have missed one, so it counts as one.
fn listen(
    myself: &ActorRef<ChildRunsMsg>,
    mut changes: tokio::sync::broadcast::Receiver<store::Change>,
) -> crate::mailbox::Task {
    use tokio::sync::broadcast::error::RecvError;
    let me = myself.clone();
    crate::mailbox::Task::spawn(async move {
        loop {
            let freed = match changes.recv().await {
                Ok(store::Change::SlotFreed | store::Change::Resync)
                | Err(RecvError::Lagged(_)) => true,
                Ok(_) => false,
                Err(RecvError::Closed) => return,
            };
            if freed && me.post(ChildRunsMsg::SlotFreed).is_err() {
                return;
            }
        }
    })
}

/// Checks a request before anything is written, and turns it into the row to admit.
fn check(args: &ChildRunsArgs, request: &mut RunRequest) -> Result<NewRun, Error> {
    workspace::check_thread_id(&request.thread_id)
        .map_err(|e| Error::InvalidRequest(e.to_string()))?;
    if args.agents.get(&request.agent).is_none() {
        return Err(Error::UnknownAgent {
            name: request.agent.clone(),
            known: args.agents.names().collect::<Vec<_>>().join(", "),
        });
    }
    let task_bytes = request.task.to_string().len();
    if task_bytes > args.options.task_bytes_max {
        return Err(Error::TooLarge {
            what: "task",
            bytes: task_bytes,
            limit_name: "frame_bytes_max",
            limit: args.options.task_bytes_max,
        });
    }
    let run_id = request
        .run_id
        .clone()
        .unwrap_or_else(crate::ids::new_run_id);
    Ok(NewRun {
        run_id,
        thread_id: request.thread_id.clone(),
        agent: request.agent.clone(),
        owner: args.worker_id.clone(),
        lease_ms: args.options.lease_ms,
        idempotency: request
            .idempotency_key
            .clone()
            .map(|key| (key, run_fingerprint(request))),
        metadata: Value::Object(Default::default()),
        // The journal goes to the store only; the rest of the request stays to start the run.
        step: request.step.as_mut().map(|step| WorkflowStep {
            journal: std::mem::take(&mut step.journal),
            ..step.clone()
        }),
    })
}

/// What makes two admissions under one idempotency key the same request.
pub(crate) fn run_fingerprint(request: &RunRequest) -> Value {
    serde_json::json!({
        "thread_id": request.thread_id,
        "agent": request.agent,
        "task": request.task,
        "step": request.step.as_ref().map(|s| (&s.workflow_id, &s.step_id, s.attempt)),
    })
}

async fn start_child(
    myself: &ActorRef<ChildRunsMsg>,
    state: &mut ChildRunsState,
    request: RunRequest,
    sent: Instant,
    row: RunRow,
) -> Result<Admitted, Error> {
    let agent = state
        .args
        .agents
        .get(&request.agent)
        .ok_or_else(|| Error::UnknownAgent {
            name: request.agent.clone(),
            known: state.args.agents.names().collect::<Vec<_>>().join(", "),
        })?;
    let workspace = workspace::thread_root(&state.args.options.workspaces_dir, &row.thread_id)
        .map_err(|e| Error::InvalidRequest(e.to_string()))?;
    let (ended_tx, ended) = oneshot::channel();
    let run_id = row.run_id.clone();
    let timeouts = request.timeouts.over(&agent.defaults.timeout);
    let (child, _) = Actor::spawn_linked(
        Some(format!("child-run-{run_id}")),
        ChildAgent,
        ChildArgs {
            row: row.clone(),
            agent,
            task: request.task,
            attempt: request.step.as_ref().map_or(1, |step| step.attempt),
            timeouts,
            workspace,
            fault_dir: state.args.options.fault_dir.clone(),
            process_records: state
                .args
                .options
                .agent_records_dir
                .clone()
                .map(ProcessRecords::new),
            confinement: state.args.options.agent_confinement,
            store: state.args.store.clone(),
            lease: state.args.lease.clone(),
            worker_id: state.args.worker_id.clone(),
            output_bytes_max: state.args.options.task_bytes_max,
            error_bytes_max: state.args.options.error_bytes_max,
            deadline: sent + Duration::from_millis(state.args.options.lease_ms),
            ended: ended_tx,
            step_slots: request.step.as_ref().map(|step| StepSlots {
                slots_max: step.slots_max,
                slots_per_user_max: step.slots_per_user_max,
                slots_reserved: step.slots_reserved,
            }),
            runs: myself.clone(),
            wake_fallback: state.args.wake_fallback,
        },
        myself.get_cell(),
    )
    .await
    .map_err(|e| Error::Spawn {
        actor: "child-agent",
        reason: e.to_string(),
    })?;
    state.running.insert(run_id, child);
    Ok(Admitted::Started { row, ended })
}

/// Answers `reject`, by `timeout`, every approval request whose deadline passed (the agent's
/// `timeout.approvalMs`, recorded with the request): through the same single-winner answer as a
/// person's, so a person's answer recorded first stands, and one sent after is told who answered.
/// Any node's sweep does it, so a request whose node died is answered too.
async fn answer_expired_approvals(store: &StoreHandle) {
    let expired = match store.expired_approvals(ORPHAN_SWEEP_LIMIT).await {
        Ok(expired) => expired,
        Err(error) => {
            tracing::warn!(%error, "cannot read the approvals past their deadline");
            return;
        }
    };
    for request in expired {
        let answer = serde_json::json!({
            "decision": "reject",
            "comment": null,
            "by": "timeout",
            "actions": request.actions,
        });
        match store
            .answer_approval(
                &request.thread_id,
                std::slice::from_ref(&request.request_id),
                &answer,
            )
            .await
        {
            Ok(Some(_)) => {
                tracing::info!(run_id = %request.run_id, request_id = %request.request_id,
                "an approval request past its deadline was answered reject by timeout")
            }
            Ok(None) => {}
            Err(error) => tracing::warn!(%error, run_id = %request.run_id,
                "cannot answer an approval request past its deadline"),
        }
    }
}
