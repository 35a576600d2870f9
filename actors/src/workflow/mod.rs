//! The workflow supervisor: one actor per live workflow on its owner node.
//!
//! Every rule of the workflow lives in [`machine::WorkflowMachine`]: it decides, for each event,
//! what to write (persist first: each new call's journal entry under the workflow's fence, each
//! outcome with its slot released or its control marked applied), what to admit, cancel,
//! capture or wait for, when to park, and when to stop. This actor is its interpreter: it turns
//! messages into events, performs the effects the machine answers (store calls, the JS pool,
//! child runs, captures, timers, metrics, test fault points) and feeds their results back, in
//! the order the machine's contract states. It decides nothing of its own.
//!
//! The supervisor awaits its own fenced writes in its handler: a workflow's steps are sequential
//! by nature, every write is bounded by the store call timeout, and a stale write is refused by
//! the database whatever the mailbox holds.

pub(crate) mod capture;
pub(crate) mod front_door;
mod invariants;
mod journal;
mod machine;
#[cfg(test)]
mod mutants;
mod reconciliation;
pub(crate) mod requests;
pub(crate) mod rules;
#[cfg(test)]
mod sim;
mod store_calls;
mod unwritten;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use runtime::CallId;
use store::{Epoch, Fence, RunRow, WorkflowId};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::Error;
use crate::child_run::agent::RunEnd;
use crate::child_run::{Admitted, RunRequest, RunsHandle};
use crate::js_pool::JsPool;
use crate::lease::{LeaseEvent, LeaseKey, LeaseMsg, Leased};
use crate::mailbox::{Post, Timer};
use crate::store_actor::StoreHandle;
use machine::{Admission, Effect, Event, MachineConfig, WorkflowMachine};
use store_calls::{Routed, StoreCall};

pub(crate) use machine::{Start, WorkflowDocument, thread_for};

/// The stop reason of a supervisor that left its workflow live (see `Effect::Halt`).
pub(crate) const ABANDONED: &str = "abandoned";

/// The stop reason of a supervisor that left its workflow dormant in the store.
pub(crate) const DORMANT: &str = "dormant";

/// Messages of a workflow supervisor.
pub(crate) enum WorkflowMsg {
    /// An event for the machine (the supervisor's own timers and posts).
    Event(Box<Event>),
    Lease(LeaseEvent),
    /// A child-run admission answered.
    Admission {
        id: CallId,
        result: Box<Result<Admitted, Error>>,
    },
    /// A child slot was freed (the change bus): ask again for every call waiting for one.
    SlotFreed,
    /// A child run of this workflow began or stopped waiting for a person (the change bus).
    InputChanged,
    /// Look for controls (the node's poller found some pending for this workflow).
    Poll,
    /// Stop and give the lease up now (an operator's `fence`, or the node's clean stop);
    /// answers the epoch given up.
    GiveUp {
        shutdown: bool,
        reply: ractor::RpcReplyPort<Result<Epoch, Error>>,
    },
}

impl From<LeaseEvent> for WorkflowMsg {
    fn from(event: LeaseEvent) -> Self {
        WorkflowMsg::Lease(event)
    }
}

impl TryFrom<WorkflowMsg> for LeaseEvent {
    type Error = String;

    fn try_from(message: WorkflowMsg) -> Result<Self, Self::Error> {
        match message {
            WorkflowMsg::Lease(event) => Ok(event),
            _ => Err("not a lease event".into()),
        }
    }
}

pub(crate) struct WorkflowSupervisor;

pub(crate) struct WorkflowArgs {
    pub workflow_id: WorkflowId,
    /// The workflow's owner: whose turn its activations take on a JS thread.
    pub user_id: String,
    pub fence: Fence,
    pub document: WorkflowDocument,
    pub store: StoreHandle,
    pub runs: RunsHandle,
    pub js: JsPool,
    pub lease: ActorRef<LeaseMsg>,
    /// The agents, to record which definition each step's child ran under.
    pub agents: std::sync::Arc<crate::agents::AgentRegistry>,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    pub limits: runtime::Limits,
    pub workspaces_dir: std::path::PathBuf,
    pub artifact_bytes_max: u64,
    /// `console.log` lines kept as events per workflow at most, and their bytes.
    pub log_events_max: u64,
    pub log_event_bytes_max: u64,
    /// How long a capture's read may take (`limits.capture_timeout_ms`).
    pub capture_timeout: Duration,
    /// The node's own files, which no capture opens.
    pub node_files: std::sync::Arc<crate::node_files::NodeFiles>,
    pub slots_max: u64,
    pub slots_per_user_max: u64,
    pub slots_reserved: u64,
    /// The bytes one user's workflows store at most (`limits.user_stored_bytes_max`).
    pub stored_bytes_max: u64,
    /// How long a cancellation waits for its child runs to stop before it gives up on observing
    /// them (and the workflow needs reconciliation).
    pub cancel_window_ms: u64,
    /// The workflow's wall-clock limit from launch (`timeout_seconds`); past it, it is
    /// cancelled with reason `timeout`.
    pub timeout_ms: u64,
    /// How it begins: fresh from its launch, or by replaying what the journal holds.
    pub start: Start,
    /// Test fault points (`REINS_FAULT_DIR`); `None` in production.
    pub faults: Option<crate::fault_points::FaultPoints>,
    pub deadline: Instant,
    /// How long a step waits for a cue (a freed slot, an answer) before it looks anyway.
    pub wake_fallback: Duration,
    /// How long a parked workflow waits before it goes dormant (`None`: never).
    pub dormant_after: Option<Duration>,
    /// The workflows actor, told when a step waits for a slot (it hands out the cues).
    pub workflows: ActorRef<crate::workflow::front_door::WorkflowsMsg>,
}

/// What the interpreter performs effects with.
struct Io {
    workflow_id: WorkflowId,
    user_id: String,
    fence: Fence,
    store: StoreHandle,
    runs: RunsHandle,
    js: JsPool,
    lease: ActorRef<LeaseMsg>,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    workspaces_dir: std::path::PathBuf,
    artifact_bytes_max: u64,
    capture_timeout: Duration,
    node_files: std::sync::Arc<crate::node_files::NodeFiles>,
    faults: Option<crate::fault_points::FaultPoints>,
    workflows: ActorRef<crate::workflow::front_door::WorkflowsMsg>,
}

pub(crate) struct WorkflowState {
    io: Io,
    machine: WorkflowMachine,
    /// The ends of the run an admission being handled started, until the machine asks to
    /// follow it (`Effect::FollowChild`); dropped with the message otherwise.
    started: BTreeMap<CallId, (RunRow, oneshot::Receiver<RunEnd>)>,
    span: tracing::Span,
    /// The `timeout_seconds` timer, if the workflow has a life limit, cancelled with this
    /// state: it would hold the stopped actor's cell until the limit after the workflow ended.
    _timeout: Option<Timer<WorkflowMsg>>,
}

impl WorkflowState {
    /// Feeds `event` to the machine and performs what it answers, depth first: an effect whose
    /// result is an event has that event's effects performed before the rest (the machine's
    /// contract). Nothing after a halt is performed.
    async fn run(&mut self, myself: &ActorRef<WorkflowMsg>, event: Event) {
        let mut queue: VecDeque<Effect> = self.machine.on(event, crate::clock::now_ms()).into();
        while let Some(effect) = queue.pop_front() {
            let halts = matches!(effect, Effect::Halt { .. });
            let answer = self.perform(myself, effect).await;
            if halts {
                return;
            }
            if let Some(event) = answer {
                for effect in self
                    .machine
                    .on(event, crate::clock::now_ms())
                    .into_iter()
                    .rev()
                {
                    queue.push_front(effect);
                }
            }
        }
    }

    /// Performs one effect; answers the event its result is, if it has one.
    async fn perform(&mut self, myself: &ActorRef<WorkflowMsg>, effect: Effect) -> Option<Event> {
        let io = &self.io;
        let effect = match StoreCall::of(effect) {
            Routed::Store(call) => return Some(call.perform(&io.store, &io.fence).await),
            Routed::Other(effect) => effect,
        };
        match effect {
            Effect::Activate { start, settles } => {
                let result = io
                    .js
                    .activate(
                        &io.workflow_id,
                        &io.user_id,
                        start.map(|start| *start),
                        settles,
                    )
                    .await
                    .map(|activated| activated.activation)
                    .map_err(|error| error.to_string());
                Some(Event::Activated {
                    result,
                    run_id: crate::ids::new_run_id(),
                })
            }
            Effect::Admit { id, request } => {
                self.admit(myself, id, request);
                None
            }
            Effect::FollowChild { id } => {
                if let Some((row, ended)) = self.started.remove(&id) {
                    let me = myself.clone();
                    tokio::spawn(async move {
                        // An end this node committed is known as committed; any other end
                        // (fenced, paused, answered, the actor gone) is read from the row, so the
                        // step's result is what a takeover would read.
                        let committed = match ended.await {
                            Ok(RunEnd::Persisted(outcome)) => {
                                Some(Box::new(ended_with(row.clone(), outcome)))
                            }
                            _ => None,
                        };
                        let _ = me.post(WorkflowMsg::Event(Box::new(Event::ChildEnded {
                            id,
                            run_id: row.run_id,
                            committed,
                        })));
                    });
                }
                None
            }
            Effect::CancelChildren { run_ids, awaited } => {
                let (runs, span) = (io.runs.clone(), self.span.clone());
                let cancel = async move {
                    let asked = run_ids
                        .iter()
                        .map(|run_id| runs.cancel(run_id, store::CancelAction::Interrupt));
                    let answers = futures_util::future::join_all(asked).await;
                    for (run_id, answer) in run_ids.iter().zip(answers) {
                        if let Err(error) = answer {
                            // The workflow's end asks again, in its own write.
                            tracing::warn!(parent: &span, %error, %run_id, "cancel request failed");
                        }
                    }
                };
                if awaited {
                    cancel.await;
                } else {
                    tokio::spawn(cancel);
                }
                None
            }
            Effect::Capture {
                id,
                thread_id,
                path,
                source_step_id,
            } => Some(Event::Captured {
                id,
                result: self.capture(&thread_id, path, source_step_id).await,
            }),
            Effect::Post(event) => {
                let _ = myself.post(WorkflowMsg::Event(Box::new(event)));
                None
            }
            Effect::After { delay, event } => {
                crate::mailbox::post_after(myself, delay, move || {
                    WorkflowMsg::Event(Box::new(event))
                });
                None
            }
            Effect::SlotWanted => {
                let _ = io
                    .workflows
                    .post(crate::workflow::front_door::WorkflowsMsg::SlotWanted(
                        io.workflow_id.clone(),
                    ));
                None
            }
            Effect::Park => {
                io.js.park(&io.workflow_id, &io.user_id);
                None
            }
            Effect::Count { name, labels } => {
                let labels: Vec<(&str, &str)> = labels
                    .iter()
                    .map(|(key, value)| (*key, value.as_str()))
                    .collect();
                io.metrics.inc(name, &labels);
                None
            }
            Effect::Fault(boundary) => {
                if let Some(faults) = &io.faults {
                    faults.reach(boundary, &io.workflow_id).await;
                }
                None
            }
            Effect::RecordFault { name, error } => {
                if let Some(faults) = &io.faults {
                    faults.record_error(name, &error).await;
                }
                None
            }
            Effect::Sleep(delay) => {
                tokio::time::sleep(delay).await;
                None
            }
            Effect::Then(then) => Some(Event::Then(then)),
            // Invariant: `StoreCall::of` took every store call above.
            Effect::ReadJournal
            | Effect::Write(_)
            | Effect::ReadRun { .. }
            | Effect::ReadControls(_)
            | Effect::PutControl { .. }
            | Effect::ReadEvents { .. }
            | Effect::ReadArtifact { .. } => unreachable!("a store call is performed above"),
            Effect::Halt { abandoned } => {
                self.halt(myself, abandoned);
                None
            }
        }
    }

    /// Starts an admission in a task; its answer comes back as a message.
    fn admit(&self, myself: &ActorRef<WorkflowMsg>, id: CallId, request: RunRequest) {
        let (runs, me) = (self.io.runs.clone(), myself.clone());
        let (faults, workflow_id) = (self.io.faults.clone(), self.io.workflow_id.clone());
        tokio::spawn(async move {
            if let Some(faults) = &faults {
                faults.reach("before_admission", &workflow_id).await;
            }
            let result = runs.start(request).await;
            if let (Some(faults), Err(Error::Store(error))) = (&faults, &result) {
                faults.record_error("admission_error", error).await;
            }
            let _ = me.post(WorkflowMsg::Admission {
                id,
                result: Box::new(result),
            });
        });
    }

    /// The bytes of the file a capture names, from the source step's thread workspace. A file
    /// that is not there, or not a regular file, is an error, never invented content.
    async fn capture(
        &self,
        thread_id: &str,
        path: String,
        source_step_id: String,
    ) -> Result<(String, Vec<u8>), String> {
        let root = crate::workspace::thread_root(&self.io.workspaces_dir, thread_id)
            .map_err(|e| e.to_string())?;
        // Read off this turn, with a deadline: the file may be a FIFO or sit on a stuck disk.
        let content = crate::workflow::capture::read(crate::workflow::capture::CaptureRequest {
            root,
            path: path.clone(),
            source_step_id,
            bytes_max: self.io.artifact_bytes_max,
            timeout: self.io.capture_timeout,
            node_files: std::sync::Arc::clone(&self.io.node_files),
        })
        .await?;
        Ok((path, content))
    }

    /// Stops the actor: its VM dropped, its lease no longer renewed. A workflow left live
    /// stops with [`ABANDONED`], and the node takes it back by the usual takeover.
    fn halt(&self, myself: &ActorRef<WorkflowMsg>, abandoned: bool) {
        self.io.js.park(&self.io.workflow_id, &self.io.user_id);
        let _ = self.io.lease.post(LeaseMsg::Untrack {
            key: LeaseKey::Workflow(self.io.workflow_id.clone()),
        });
        let reason = if abandoned {
            Some(ABANDONED.to_owned())
        } else {
            self.machine.is_dormant().then(|| DORMANT.to_owned())
        };
        myself.stop(reason);
    }
}

impl Actor for WorkflowSupervisor {
    type Msg = WorkflowMsg;
    type State = WorkflowState;
    type Arguments = WorkflowArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WorkflowArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let span = tracing::info_span!(
            "workflow",
            run_id = %args.workflow_id,
            epoch = args.fence.epoch.get(),
        );
        args.lease.post(LeaseMsg::Track {
            lease: Leased::Workflow {
                workflow_id: args.workflow_id.clone(),
                epoch: args.fence.epoch,
            },
            deadline: args.deadline,
            notify: myself.get_derived(),
        })?;
        myself.post(WorkflowMsg::Event(Box::new(Event::Begin)))?;
        if args.start == Start::Replay {
            // A control recorded while no node ran the workflow (one that woke it from
            // dormancy, or came while its owner was dead) is applied once the replay is done,
            // not at the node's next poll for controls.
            myself.post(WorkflowMsg::Poll)?;
        }
        let machine = WorkflowMachine::new(
            MachineConfig {
                workflow_id: args.workflow_id.clone(),
                fence: args.fence.clone(),
                document: args.document,
                agents: args.agents,
                limits: args.limits,
                slots_max: args.slots_max,
                slots_per_user_max: args.slots_per_user_max,
                slots_reserved: args.slots_reserved,
                stored_bytes_max: args.stored_bytes_max,
                log_events_max: args.log_events_max,
                log_event_bytes_max: args.log_event_bytes_max,
                cancel_window_ms: args.cancel_window_ms,
                timeout_ms: args.timeout_ms,
                start: args.start,
                wake_fallback: args.wake_fallback,
                dormant_after: args.dormant_after,
            },
            span.clone(),
        );
        let timeout = machine.deadline_ms().map(|deadline| {
            let left = u64::try_from(deadline.saturating_sub(crate::clock::now_ms())).unwrap_or(0);
            Timer::after(&myself, Duration::from_millis(left), || {
                WorkflowMsg::Event(Box::new(Event::TimedOut))
            })
        });
        Ok(WorkflowState {
            io: Io {
                workflow_id: args.workflow_id,
                user_id: args.user_id,
                fence: args.fence,
                store: args.store,
                runs: args.runs,
                js: args.js,
                lease: args.lease,
                metrics: args.metrics,
                workspaces_dir: args.workspaces_dir,
                artifact_bytes_max: args.artifact_bytes_max,
                capture_timeout: args.capture_timeout,
                node_files: args.node_files,
                faults: args.faults,
                workflows: args.workflows,
            },
            machine,
            started: BTreeMap::new(),
            span,
            _timeout: timeout,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: WorkflowMsg,
        state: &mut WorkflowState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        if state.machine.is_halted() {
            return Ok(());
        }
        match message {
            WorkflowMsg::Event(event) => state.run(&myself, *event).await,
            WorkflowMsg::Lease(LeaseEvent::Renewed { .. }) => {}
            WorkflowMsg::Lease(LeaseEvent::Refused | LeaseEvent::Lost) => {
                state.run(&myself, Event::LeaseLost).await;
            }
            WorkflowMsg::Admission { id, result } => {
                let result = match *result {
                    Ok(Admitted::Started { row, ended }) => {
                        state.started.insert(id, (row.clone(), ended));
                        Admission::Started(row)
                    }
                    Ok(Admitted::Existing(row)) => Admission::Existing(row),
                    Ok(Admitted::Queued) => Admission::Queued,
                    Err(error) => Admission::Failed(error),
                };
                state.run(&myself, Event::Admission { id, result }).await;
                state.started.remove(&id);
            }
            WorkflowMsg::SlotFreed => state.run(&myself, Event::SlotFreed).await,
            WorkflowMsg::InputChanged => state.run(&myself, Event::InputChanged).await,
            WorkflowMsg::Poll => state.run(&myself, Event::Poll).await,
            WorkflowMsg::GiveUp { shutdown, reply } => {
                if shutdown && !state.machine.may_hand_over() {
                    let workflow_id = state.io.workflow_id.clone();
                    let _ = reply.send(Err(Error::ChildInFlight { workflow_id }));
                    return Ok(());
                }
                state.run(&myself, Event::GiveUp { shutdown }).await;
                let released = state.io.store.release_lease(&state.io.fence).await;
                let _ = reply.send(released.map(|_| state.io.fence.epoch).map_err(Error::from));
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut WorkflowState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        state.io.js.park(&state.io.workflow_id, &state.io.user_id);
        Ok(())
    }
}

/// The run as admitted, with the outcome this node's compare-and-set gave it (what the row now
/// holds in the fields an adoption reads; `revision` and `updated_at` stay the admission's).
fn ended_with(admitted: RunRow, outcome: store::RunOutcome) -> RunRow {
    // The end's compare-and-set records the failure beside the admitted metadata.
    let mut metadata = admitted.metadata.clone();
    if let (Some(map), Some(failure)) = (metadata.as_object_mut(), &outcome.failure) {
        map.insert("failure".into(), failure.to_json());
    }
    RunRow {
        metadata,
        status: outcome.status,
        error: outcome.error,
        output: outcome.output,
        stop_reason: outcome.stop_reason,
        total_tokens: outcome.total_tokens,
        message_count: outcome.message_count,
        ..admitted
    }
}
