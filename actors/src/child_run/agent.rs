//! The child-agent actor: one per child run this node executes (admitted `running` and owned by
//! this node). It runs the agent in a task (never in its handler) and records the outcome, with
//! its token counts, in one terminal compare-and-set, deciding what the answers mean through
//! [`TerminalAuthority`]. The lease actor
//! renews its lease and tells it about cancel requests and lost ownership; a fenced run stops its
//! agent and writes nothing more. A workflow step's run gives its slot back when its agent waits
//! for a person (in the write that records the wait); a live agent's answer is handed on only
//! once the run holds a slot again ([`StepSlots`]), which may wait for one to free. The attempt's
//! time limits ([`AttemptClock`]) stop the agent as a cancel does, and the run then ends `error`
//! with a failure of class `timeout`, through the same terminal compare-and-set.

use crate::mailbox::Post;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use runtime::policy::TimeoutOptions;
use serde_json::Value;
use store::{CancelAction, RunId, RunOutcome, RunRow, RunSlot, RunStatus, WorkflowId};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::agents::{
    Agent, AgentControl, AgentEnd, AgentRequest, ConfinementMode, ProcessRecords, Progress,
};
use crate::child_run::commit::{AttemptId, Renewal, TerminalAuthority, Verdict};
use crate::child_run::timeouts::{AttemptClock, Expiry};
use crate::lease::{LeaseEvent, LeaseKey, LeaseMsg, Leased};
use crate::store_actor::StoreHandle;

/// How a child run ended, as far as this node knows.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    /// This node's own write recorded the outcome, and the row holds nothing the admission did
    /// not (so the admitted row with this outcome is the row).
    Persisted(RunOutcome),
    /// This node's own write recorded the outcome after a person answered the agent's request:
    /// the row also holds the answer, so whoever needs the whole row reads it back.
    PersistedAnswered(RunOutcome),
    /// The agent asked for approval; the run waits in `waiting_for_input`.
    WaitingForInput,
    /// Ownership was lost; the run's fate is not this node's to report.
    Fenced,
}

/// Messages of a child-agent actor.
pub enum ChildMsg {
    /// The lease actor's news about this run's lease.
    Lease(LeaseEvent),
    /// The agent ended.
    AgentEnded(AgentEnd),
    /// The store answered a terminal compare-and-set.
    Committed {
        attempt: AttemptId,
        result: store::Result<bool>,
    },
    /// A refused compare-and-set was checked against the row.
    RefusalChecked {
        attempt: AttemptId,
        row: Box<store::Result<Option<RunRow>>>,
    },
    /// The pause for approval was recorded (or refused).
    Paused(store::Result<bool>),
    /// The live agent asks for approval and waits for the answer.
    AgentPaused(Value),
    /// The live agent's pause was recorded (or refused).
    PauseRecorded(store::Result<bool>),
    /// Stop the agent now (a cancel issued on this node; it is also durable in the store).
    Cancel(CancelAction),
    /// Send the terminal compare-and-set for this outcome again (the last one wrote nothing).
    Commit(RunOutcome),
    /// The store answered a claim of the slot an answered run needs before its agent goes on.
    SlotClaimed(store::Result<RunSlot>),
    /// A slot may be free (a cue from the change bus, or the fallback): claim it if waiting.
    SlotCheck,
    /// The attempt's next deadline came: stop the agent if its time ran out.
    ClockCheck,
}

/// Why this node stopped the agent: the first reason holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stopping {
    /// A cancel request (its action is what the agent reports).
    Cancelled,
    /// One of the attempt's time limits ran out.
    TimedOut(Expiry),
}

/// The slot rules of a workflow step's run, so that the run can claim its slot again after its
/// agent waited for a person (the wait gave it back).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StepSlots {
    pub slots_max: u64,
    pub slots_per_user_max: u64,
    pub slots_reserved: u64,
}

/// Whether the run's step holds its slot.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slot {
    /// Held since the admission, or claimed again (or not a workflow step's run: no slot to
    /// hold).
    Held,
    /// Given back with the pause (or being given back: its write was sent).
    GivenBack,
    /// A claim is in flight.
    Claiming,
}

impl From<LeaseEvent> for ChildMsg {
    fn from(event: LeaseEvent) -> Self {
        ChildMsg::Lease(event)
    }
}

impl TryFrom<ChildMsg> for LeaseEvent {
    type Error = String;

    fn try_from(message: ChildMsg) -> Result<Self, Self::Error> {
        match message {
            ChildMsg::Lease(event) => Ok(event),
            _ => Err("not a lease event".into()),
        }
    }
}

pub(crate) struct ChildAgent;

pub(crate) struct ChildArgs {
    pub row: RunRow,
    pub agent: Arc<Agent>,
    pub task: Value,
    /// The step's attempt this run is (1 for a run of no workflow).
    pub attempt: i32,
    /// The attempt's time limits, the agent's configured ones under the request's.
    pub timeouts: TimeoutOptions,
    pub workspace: PathBuf,
    pub fault_dir: Option<PathBuf>,
    pub process_records: Option<ProcessRecords>,
    pub confinement: ConfinementMode,
    pub store: StoreHandle,
    pub lease: ActorRef<LeaseMsg>,
    pub worker_id: String,
    /// An output's bytes at most (`limits.frame_bytes_max`): a bigger one is never stored.
    pub output_bytes_max: usize,
    /// An agent's error text at most (`limits.error_bytes_max`): a longer one is cut.
    pub error_bytes_max: usize,
    /// The admission's lease, measured from before the admission was sent.
    pub deadline: Instant,
    pub ended: oneshot::Sender<RunEnd>,
    /// A workflow step's slot rules; `None` for a run of no workflow (it holds no slot).
    pub step_slots: Option<StepSlots>,
    /// The child-runs actor, told when this run waits for a slot (it relays freed-slot cues).
    pub runs: ActorRef<super::ChildRunsMsg>,
    /// How long a run waiting for a slot waits for a cue before it asks anyway.
    pub wake_fallback: std::time::Duration,
}

pub(crate) struct ChildState {
    run_id: RunId,
    thread_id: String,
    agent: Arc<Agent>,
    task: Value,
    attempt: i32,
    workspace: PathBuf,
    fault_dir: Option<PathBuf>,
    process_records: Option<ProcessRecords>,
    confinement: ConfinementMode,
    store: StoreHandle,
    lease: ActorRef<LeaseMsg>,
    worker_id: String,
    /// An output's bytes at most (`limits.frame_bytes_max`): a bigger one is never stored.
    output_bytes_max: usize,
    /// An agent's error text at most (`limits.error_bytes_max`): a longer one is cut.
    error_bytes_max: usize,
    authority: TerminalAuthority,
    cancel: watch::Sender<Option<CancelAction>>,
    /// Answers for the live agent, and the request ids already handed to it.
    answers: mpsc::UnboundedSender<Value>,
    answers_for_agent: Option<mpsc::UnboundedReceiver<Value>>,
    answered: HashSet<String>,
    agent_task: Option<JoinHandle<()>>,
    /// The attempt's time limits, the agent's progress signals they read, and the timer of the
    /// next deadline (cancelled with the state).
    clock: AttemptClock,
    /// How long an approval it asks for waits for a person (`timeout.approvalMs`): recorded
    /// with the request as its deadline, which any node's sweep answers `reject` by `timeout`.
    approval_ms: Option<u64>,
    progress: Progress,
    progress_seen: watch::Receiver<Instant>,
    clock_check: Option<crate::mailbox::Timer<ChildMsg>>,
    /// Set once this node stopped the agent, with why.
    stopping: Option<Stopping>,
    /// Terminal writes in a row that wrote nothing (the database unavailable or its disk full):
    /// the backoff of the next.
    commit_tries: u32,
    ended: Option<oneshot::Sender<RunEnd>>,
    step_slots: Option<StepSlots>,
    slot: Slot,
    /// An answer that waits for the slot before it goes to the agent.
    held_answer: Option<Value>,
    /// Claims in a row that wrote nothing: the backoff of the next.
    claim_tries: u32,
    /// Whether this wait for a slot was logged (once per wait, not per refused claim).
    slot_wait_logged: bool,
    /// The fallback of a wait for a slot (cancelled with the state).
    slot_check: Option<crate::mailbox::Timer<ChildMsg>>,
    runs: ActorRef<super::ChildRunsMsg>,
    wake_fallback: std::time::Duration,
    span: tracing::Span,
}

impl ChildState {
    /// Sends one terminal compare-and-set for `outcome`, if the authority allows one.
    fn commit(&mut self, myself: &ActorRef<ChildMsg>, outcome: RunOutcome) {
        let Some(attempt) = self.authority.decide(outcome) else {
            return;
        };
        // A success must not be recorded over a cancel request; an interruption or a failure is
        // a truthful outcome for a run that was asked to stop.
        let require_not_cancelled = attempt.outcome.status == RunStatus::Success;
        let (store, myself) = (self.store.clone(), myself.clone());
        let (run_id, owner) = (self.run_id.clone(), self.worker_id.clone());
        tokio::spawn(
            async move {
                let result = store
                    .finalize_run(&run_id, &owner, &attempt.outcome, require_not_cancelled)
                    .await;
                let _ = myself.post(ChildMsg::Committed {
                    attempt: attempt.id,
                    result,
                });
            }
            .instrument(self.span.clone()),
        );
    }

    /// Acts on the authority's verdict.
    fn act(&mut self, myself: &ActorRef<ChildMsg>, verdict: Verdict) {
        match verdict {
            Verdict::Wait => {}
            Verdict::Cancel(action) => {
                tracing::info!(parent: &self.span, ?action, "cancel request delivered");
                self.stop_for_cancel(action);
            }
            Verdict::Persisted(outcome) => {
                self.untrack();
                let end = if self.answered.is_empty() {
                    RunEnd::Persisted(outcome)
                } else {
                    RunEnd::PersistedAnswered(outcome)
                };
                self.end(myself, end);
            }
            Verdict::Fenced => {
                tracing::warn!(parent: &self.span, "ownership lost: the run is fenced");
                self.stop_agent();
                self.untrack();
                self.end(myself, RunEnd::Fenced);
            }
        }
    }

    /// Takes an approval answer for the live agent: handed on at once while the run holds its
    /// slot, else kept until a claim gets one.
    fn answered(&mut self, myself: &ActorRef<ChildMsg>, answer: Value) {
        let known = answer["request_id"]
            .as_str()
            .is_some_and(|request_id| self.answered.contains(request_id));
        if known || self.slot == Slot::Held {
            self.deliver(myself, answer);
            return;
        }
        self.held_answer = Some(answer);
        self.claim_slot(myself);
    }

    /// Claims the slot the run gave back with its pause, if an answer waits for it and no claim
    /// is in flight.
    fn claim_slot(&mut self, myself: &ActorRef<ChildMsg>) {
        let (Slot::GivenBack, Some(_), Some(slots)) =
            (self.slot, &self.held_answer, self.step_slots)
        else {
            return;
        };
        self.slot = Slot::Claiming;
        self.slot_check = None;
        let (store, me) = (self.store.clone(), myself.clone());
        let (run_id, owner) = (self.run_id.clone(), self.worker_id.clone());
        tokio::spawn(
            async move {
                let claimed = store
                    .claim_run_slot(
                        &run_id,
                        &owner,
                        slots.slots_max,
                        slots.slots_per_user_max,
                        slots.slots_reserved,
                    )
                    .await;
                let _ = me.post(ChildMsg::SlotClaimed(claimed));
            }
            .instrument(self.span.clone()),
        );
    }

    /// Acts on the store's answer to a slot claim.
    fn slot_claimed(&mut self, myself: &ActorRef<ChildMsg>, claimed: store::Result<RunSlot>) {
        self.slot = Slot::GivenBack;
        match claimed {
            Ok(RunSlot::Held) => {
                self.slot = Slot::Held;
                self.claim_tries = 0;
                self.slot_wait_logged = false;
                if let Some(answer) = self.held_answer.take() {
                    self.deliver(myself, answer);
                }
            }
            Ok(RunSlot::Queued) => {
                self.claim_tries = 0;
                if !self.slot_wait_logged {
                    self.slot_wait_logged = true;
                    tracing::info!(parent: &self.span,
                        "the answered run waits for a slot before its agent goes on");
                }
                // Asked again at a freed slot's cue, or at the fallback, or with the answer at
                // the next renewal, whichever comes first.
                let _ = self.runs.post(super::ChildRunsMsg::SlotWanted {
                    run_id: self.run_id.clone(),
                });
                self.slot_check = Some(crate::mailbox::Timer::after(
                    myself,
                    self.wake_fallback,
                    || ChildMsg::SlotCheck,
                ));
            }
            // Not this node's live run of a running workflow any more (a cancel request, a
            // takeover, a reconcile): the next renewal says what to do.
            Ok(RunSlot::Refused) => {}
            Err(error) => {
                // Nothing was written, or the claim's outcome is unknown: asked again after a
                // wait (a claim of a slot the step holds keeps it, so a second one is harmless).
                self.claim_tries += 1;
                tracing::warn!(parent: &self.span, %error, tries = self.claim_tries,
                    "claiming the answered run's slot failed; retrying");
                let wait = crate::backoff::store_backoff(self.claim_tries);
                self.slot_check = Some(crate::mailbox::Timer::after(myself, wait, || {
                    ChildMsg::SlotCheck
                }));
            }
        }
    }

    /// Hands an approval answer to the live agent, once per request id; the attempt's time limits
    /// run again from here.
    fn deliver(&mut self, myself: &ActorRef<ChildMsg>, answer: Value) {
        let Some(request_id) = answer["request_id"].as_str().map(str::to_owned) else {
            return;
        };
        if self.answered.insert(request_id.clone()) {
            tracing::info!(parent: &self.span, request_id, "approval answer delivered to the agent");
            // The agent may have ended meanwhile; its end decides the run.
            let _ = self.answers.send(answer);
            self.clock.answered(Instant::now());
            self.arm_clock(myself);
        }
    }

    /// Arms the timer of the attempt's next deadline (none without limits, while the agent
    /// waits for a person, or once it ended).
    fn arm_clock(&mut self, myself: &ActorRef<ChildMsg>) {
        self.clock_check = self
            .clock
            .deadline()
            .filter(|_| self.agent_task.is_some() && self.stopping.is_none())
            .map(|(deadline, _)| {
                let wait = deadline.saturating_duration_since(Instant::now());
                crate::mailbox::Timer::after(myself, wait, || ChildMsg::ClockCheck)
            });
    }

    /// At a deadline: stops the agent if one of the attempt's limits ran out, with the latest
    /// progress signal counted; else waits for the next deadline.
    fn check_clock(&mut self, myself: &ActorRef<ChildMsg>) {
        self.clock.progress(*self.progress_seen.borrow());
        match self.clock.expired(Instant::now()) {
            Some(expiry) if self.agent_task.is_some() && self.stopping.is_none() => {
                tracing::warn!(parent: &self.span, reason = expiry.message(),
                    "the attempt timed out: stopping its agent");
                self.stopping = Some(Stopping::TimedOut(expiry));
                self.clock_check = None;
                // Stopped as a cancel stops it; its end is recorded as the timeout.
                self.cancel.send_replace(Some(CancelAction::Interrupt));
            }
            _ => self.arm_clock(myself),
        }
    }

    /// Stops the agent for a cancel request (unless it is already being stopped for its time).
    fn stop_for_cancel(&mut self, action: CancelAction) {
        self.stopping.get_or_insert(Stopping::Cancelled);
        self.clock_check = None;
        self.cancel.send_replace(Some(action));
    }

    /// Records in the background that the run waits for `approval`; the store's answer comes
    /// back as `answered(result)`.
    fn record_pause(
        &self,
        myself: &ActorRef<ChildMsg>,
        approval: Value,
        answered: fn(store::Result<bool>) -> ChildMsg,
    ) {
        let (store, me) = (self.store.clone(), myself.clone());
        let (run_id, owner) = (self.run_id.clone(), self.worker_id.clone());
        let deadline_at_ms = self.approval_ms.map(|approval_ms| {
            let now_ms = u64::try_from(crate::clock::now_ms()).unwrap_or(0);
            now_ms.saturating_add(approval_ms)
        });
        let metadata = store::asking(approval, deadline_at_ms);
        tokio::spawn(
            async move {
                let recorded = store
                    .update_run_status(&run_id, &owner, RunStatus::WaitingForInput, Some(metadata))
                    .await;
                let _ = me.post(answered(recorded));
            }
            .instrument(self.span.clone()),
        );
    }

    fn untrack(&self) {
        // The lease actor stops only with the node; if it is gone, there is nothing to untrack.
        let _ = self.lease.post(LeaseMsg::Untrack {
            key: LeaseKey::Run(self.run_id.clone()),
        });
    }

    fn stop_agent(&mut self) {
        self.cancel.send_replace(Some(CancelAction::Interrupt));
        if let Some(task) = self.agent_task.take() {
            task.abort();
        }
    }

    fn end(&mut self, myself: &ActorRef<ChildMsg>, end: RunEnd) {
        let Some(ended) = self.ended.take() else {
            // Already ended; the actor is stopping.
            return;
        };
        // The step's "step finished" line (at info) says how it ended.
        tracing::debug!(parent: &self.span, ?end, "child run ended");
        // Nobody may be waiting for this run any more; the row is the record.
        let _ = ended.send(end);
        myself.stop(None);
    }

    fn start_agent(&mut self, myself: &ActorRef<ChildMsg>) {
        let request = AgentRequest {
            run_id: self.run_id.clone(),
            thread_id: self.thread_id.clone(),
            task: self.task.clone(),
            workspace: self.workspace.clone(),
            fault_dir: self.fault_dir.clone(),
            process_records: self.process_records.clone(),
            confinement: self.confinement,
            attempt: self.attempt,
        };
        let (pauses, mut paused) = mpsc::unbounded_channel();
        let control = AgentControl {
            cancel: self.cancel.subscribe(),
            pauses,
            answers: self
                .answers_for_agent
                .take()
                .unwrap_or_else(|| mpsc::unbounded_channel().1),
            progress: self.progress.clone(),
        };
        let (agent, me) = (Arc::clone(&self.agent), myself.clone());
        self.agent_task = Some(tokio::spawn(
            async move {
                let run = agent.run(request, control);
                tokio::pin!(run);
                let end = loop {
                    tokio::select! {
                        end = &mut run => break end,
                        Some(approval) = paused.recv() => {
                            let _ = me.post(ChildMsg::AgentPaused(approval));
                        }
                    }
                };
                let _ = me.post(ChildMsg::AgentEnded(end));
            }
            .instrument(self.span.clone()),
        ));
        self.arm_clock(myself);
    }
}

impl Actor for ChildAgent {
    type Msg = ChildMsg;
    type State = ChildState;
    type Arguments = ChildArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ChildArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let span = tracing::info_span!(
            "child_run",
            run_id = %args.row.run_id,
            thread_id = %args.row.thread_id,
            agent = %args.agent.name,
            workflow = args.row.workflow.as_ref().map_or("", WorkflowId::as_str),
            step_id = args.row.step_id.as_deref().unwrap_or(""),
        );
        args.lease.post(LeaseMsg::Track {
            lease: Leased::Run(args.row.run_id.clone()),
            deadline: args.deadline,
            notify: myself.get_derived(),
        })?;
        let (cancel, _) = watch::channel(None);
        let (answers, answers_for_agent) = mpsc::unbounded_channel();
        let (progress, progress_seen) = Progress::channel();
        Ok(ChildState {
            run_id: args.row.run_id,
            thread_id: args.row.thread_id,
            agent: args.agent,
            task: args.task,
            attempt: args.attempt,
            workspace: args.workspace,
            fault_dir: args.fault_dir,
            process_records: args.process_records,
            confinement: args.confinement,
            store: args.store,
            lease: args.lease,
            worker_id: args.worker_id,
            output_bytes_max: args.output_bytes_max,
            error_bytes_max: args.error_bytes_max,
            authority: TerminalAuthority::new(),
            cancel,
            answers,
            answers_for_agent: Some(answers_for_agent),
            answered: HashSet::new(),
            agent_task: None,
            clock: AttemptClock::new(&args.timeouts, Instant::now()),
            approval_ms: args.timeouts.approval_ms,
            progress,
            progress_seen,
            clock_check: None,
            stopping: None,
            commit_tries: 0,
            ended: Some(args.ended),
            step_slots: args.step_slots,
            slot: Slot::Held,
            held_answer: None,
            claim_tries: 0,
            slot_wait_logged: false,
            slot_check: None,
            runs: args.runs,
            wake_fallback: args.wake_fallback,
            span,
        })
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut ChildState,
    ) -> Result<(), ActorProcessingErr> {
        state.start_agent(&myself);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: ChildMsg,
        state: &mut ChildState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        if state.authority.is_fenced() {
            // Nothing more is written for a fenced run; late answers only confirm that.
            return Ok(());
        }
        match message {
            ChildMsg::AgentEnded(end) => {
                state.agent_task = None;
                state.clock_check = None;
                let outcome = match end {
                    AgentEnd::Completed {
                        output,
                        total_tokens,
                        message_count,
                    } => {
                        let bytes = output.to_string().len();
                        // A step could never take a bigger output (its outcome would be over the
                        // same limit), so it is not kept anywhere: the run fails saying why.
                        let kept = bytes <= state.output_bytes_max;
                        RunOutcome {
                            status: if kept {
                                RunStatus::Success
                            } else {
                                RunStatus::Error
                            },
                            error: (!kept).then(|| {
                                format!(
                                    "the agent's output is {bytes} bytes, over frame_bytes_max \
                                     ({}); it is not kept",
                                    state.output_bytes_max
                                )
                            }),
                            output: kept.then_some(output),
                            stop_reason: (!kept).then(|| "output_too_large".into()),
                            total_tokens,
                            message_count,
                            // The same task would make an output over the same bound again:
                            // another attempt would only fetch it again.
                            failure: (!kept).then(|| store::RunFailure {
                                code: Some("output_too_large".into()),
                                retryable: Some(false),
                                ..store::RunFailure::default()
                            }),
                        }
                    }
                    AgentEnd::Failed { message, failure } => RunOutcome {
                        status: RunStatus::Error,
                        error: Some(super::error_text::kept_error(
                            message,
                            state.error_bytes_max,
                        )),
                        output: None,
                        stop_reason: Some("agent_failed".into()),
                        total_tokens: 0,
                        message_count: 0,
                        failure: Some(failure),
                    },
                    AgentEnd::Interrupted { action } => match state.stopping {
                        Some(Stopping::TimedOut(expiry)) => timed_out(expiry),
                        _ => interrupted(action),
                    },
                    AgentEnd::WaitingForInput { approval } => {
                        state.record_pause(&myself, approval, ChildMsg::Paused);
                        return Ok(());
                    }
                };
                state.commit(&myself, outcome);
            }
            ChildMsg::Committed {
                attempt,
                result: Ok(false),
            } => {
                // Before accepting a refusal, see whether the row is still ours and live with a
                // cancel request: then the truthful outcome is an interruption.
                let (store, me) = (state.store.clone(), myself.clone());
                let run_id = state.run_id.clone();
                tokio::spawn(
                    async move {
                        let row = store.read_run(&run_id).await;
                        let _ = me.post(ChildMsg::RefusalChecked {
                            attempt,
                            row: Box::new(row),
                        });
                    }
                    .instrument(state.span.clone()),
                );
            }
            ChildMsg::Committed {
                attempt,
                result: Ok(true),
            } => {
                let verdict = state.authority.on_answer(attempt, true);
                state.act(&myself, verdict);
            }
            ChildMsg::Committed {
                attempt,
                result: Err(error),
            } if error.is_transient() => {
                // Nothing was written (the database is unreachable): send the outcome again
                // after a wait, while the lease holds; an outage is not a lost answer.
                if let Some(outcome) = state.authority.on_not_written(attempt) {
                    state.commit_tries += 1;
                    tracing::warn!(parent: &state.span, %error, tries = state.commit_tries,
                        "the terminal write wrote nothing (database unavailable or its disk full); retrying");
                    let wait = crate::backoff::store_backoff(state.commit_tries);
                    crate::mailbox::post_after(&myself, wait, move || ChildMsg::Commit(outcome));
                }
            }
            ChildMsg::Committed {
                attempt,
                result: Err(store::Error::OutcomeUnknown(error)),
            } => {
                // The connection dropped mid-statement: reconcile by sending the same
                // compare-and-set again, which writes only a row still live and ours.
                if let Some(outcome) = state.authority.on_unknown_answer(attempt) {
                    state.commit_tries += 1;
                    tracing::warn!(parent: &state.span, %error, tries = state.commit_tries,
                        "the terminal write's outcome is unknown; sending it again as a compare-and-set");
                    let wait = crate::backoff::store_backoff(state.commit_tries);
                    crate::mailbox::post_after(&myself, wait, move || ChildMsg::Commit(outcome));
                }
            }
            ChildMsg::Commit(outcome) => state.commit(&myself, outcome),
            ChildMsg::Committed {
                attempt,
                result: Err(error),
            } => {
                tracing::warn!(parent: &state.span, %error, "terminal write has no acknowledgement");
                let verdict = state.authority.on_unknown(attempt);
                state.act(&myself, verdict);
            }
            ChildMsg::RefusalChecked { attempt, row } => {
                if let Ok(Some(row)) = row.as_ref()
                    && !row.status.is_final()
                    && row.owner_worker_id.as_deref() == Some(state.worker_id.as_str())
                    && let Some(action) = row.cancel_action
                {
                    state.commit(&myself, interrupted(action));
                }
                let verdict = state.authority.on_answer(attempt, false);
                state.act(&myself, verdict);
            }
            ChildMsg::Paused(Ok(true)) => {
                state.untrack();
                state.end(&myself, RunEnd::WaitingForInput);
            }
            ChildMsg::Paused(_) => state.act(&myself, Verdict::Fenced),
            ChildMsg::AgentPaused(approval) => {
                // The write that records the pause gives the step's slot back, so an answer
                // claims one first. Counted as given back from now on: an answer (committed
                // after the pause) may reach this actor before the pause's own acknowledgement,
                // and a claim keeps a slot the step still holds (the write refused or lost).
                if state.step_slots.is_some() {
                    state.slot = Slot::GivenBack;
                }
                // A person's time is not the agent's: no limit runs until the answer.
                state.clock.wait_for_person(Instant::now());
                state.clock_check = None;
                state.record_pause(&myself, approval, ChildMsg::PauseRecorded);
            }
            ChildMsg::PauseRecorded(Ok(true)) => {
                tracing::info!(parent: &state.span, "the agent waits for an approval");
            }
            ChildMsg::PauseRecorded(Ok(false)) => state.act(&myself, Verdict::Fenced),
            ChildMsg::PauseRecorded(Err(error)) => {
                // The pause may or may not be recorded; the agent keeps waiting either way, and an
                // answer can only come for a recorded pause.
                tracing::warn!(parent: &state.span, %error, "recording the pause has no acknowledgement");
            }
            ChildMsg::SlotClaimed(claimed) => state.slot_claimed(&myself, claimed),
            ChildMsg::SlotCheck => state.claim_slot(&myself),
            ChildMsg::ClockCheck => state.check_clock(&myself),
            ChildMsg::Lease(event) => {
                let verdict = match event {
                    LeaseEvent::Renewed { cancel, answer } => {
                        if let Some(answer) = answer {
                            state.answered(&myself, answer);
                        }
                        state.authority.on_renewal(Renewal::Renewed { cancel })
                    }
                    LeaseEvent::Refused => state.authority.on_renewal(Renewal::Refused),
                    LeaseEvent::Lost => state.authority.on_deadline(),
                };
                state.act(&myself, verdict);
            }
            ChildMsg::Cancel(action) => state.stop_for_cancel(action),
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut ChildState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        if let Some(task) = state.agent_task.take() {
            task.abort();
        }
        Ok(())
    }
}

/// The outcome of a run this node stopped for its time: `error`, saying which limit and its value,
/// with a failure of class `timeout`.
fn timed_out(expiry: Expiry) -> RunOutcome {
    RunOutcome {
        status: RunStatus::Error,
        error: Some(expiry.message()),
        output: None,
        stop_reason: Some(expiry.code().into()),
        total_tokens: 0,
        message_count: 0,
        failure: Some(expiry.failure()),
    }
}

pub(crate) fn interrupted(action: CancelAction) -> RunOutcome {
    RunOutcome {
        status: RunStatus::Interrupted,
        error: Some(match action {
            CancelAction::Interrupt => "interrupted by a cancel request".into(),
            CancelAction::Rollback => "rolled back by a cancel request".into(),
        }),
        output: None,
        stop_reason: Some(action.as_str().into()),
        total_tokens: 0,
        message_count: 0,
        failure: None,
    }
}
