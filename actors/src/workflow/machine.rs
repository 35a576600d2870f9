//! `WorkflowMachine`: every rule of one workflow, as a synchronous type with no IO of its own.
//!
//! The machine is fed [`Event`]s with the time they happen at and answers the [`Effect`]s to
//! perform, in order: `on(event, now) -> Vec<Effect>`. It owns the workflow's phase (one
//! [`Phase`]), its journal, what each call waits for, the writes decided on and not yet
//! committed, and the retries of a store that wrote nothing. The actor in `mod.rs` performs the
//! effects (store calls, the JS pool, child runs, captures, timers) and hands their results back
//! as events; it decides nothing.
//!
//! How effects are performed is part of the contract:
//! - In order, depth first: an effect whose result is an event (a write, an activation, a read,
//!   a capture, [`Effect::Then`]) is awaited, its event is fed to the machine at once, and the
//!   effects that answers are performed before the rest of the batch. This is how a workflow's
//!   steps stay sequential with no continuation kept here.
//! - A batch is written as if each of its writes commits: the machine moves on at once. A write
//!   that fails for good halts the machine ([`Effect::Halt`]), and nothing after a halt is
//!   performed, so nothing decided on the strength of a write that failed leaves the process.
//! - Time is only the `now` given with each event; the id of a new child run comes in with the
//!   activation that may need one ([`Event::Activated`]). No map is iterated in hash order, so
//!   the same events give the same effects.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use runtime::{Activation, CallId, CallKind, Command, JournalEntry, Outcome, Status, VmOptions};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use store::{
    ControlRow, ControlWrite, Fence, NewControl, RunId, RunRow, RunStatus, StepRow, StepStatus,
    WorkflowId, WorkflowStatus, WriteOp,
};

use super::invariants::Invariants;
use super::journal::newest_attempts;
use super::reconciliation::{Reconciliation, ReconciliationReason};
use super::unwritten::{Carried, Journaled, Unwritten};
use crate::Error;
use crate::agents::AgentRegistry;
use crate::backoff::{STORE_RETRY_FIRST, store_backoff};
use crate::child_run::RunRequest;
use crate::js_pool::{Settle, StartSpec};

/// Milliseconds since the Unix epoch.
pub(crate) type Millis = i64;

/// How often a cancellation looks at the rows of the children it waits for (some may run on a
/// node that is gone, and only their rows will tell).
const CHILD_CHECK: Duration = Duration::from_millis(250);

/// What a control asks of a workflow (`workflow_controls.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// Resolves a `pause` call.
    Resume,
    /// Resolves a `humanCheckpoint` call.
    Decide,
    /// Cancels the workflow.
    Cancel,
}

impl ControlKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlKind::Resume => "resume",
            ControlKind::Decide => "decide",
            ControlKind::Cancel => "cancel",
        }
    }

    /// The kind a stored string names, if any.
    pub fn parse(stored: &str) -> Option<Self> {
        [
            ControlKind::Resume,
            ControlKind::Decide,
            ControlKind::Cancel,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == stored)
    }
}

/// The parts of a workflow's `data` document the supervisor needs.
#[derive(Debug, Clone)]
pub(crate) struct WorkflowDocument {
    pub script: String,
    pub args: Value,
    pub seed: u64,
    pub started_at_ms: i64,
    /// The whole document, kept as is when the status changes.
    pub data: Value,
}

impl WorkflowDocument {
    /// Reads the stored document of `workflow_id`. A document without one of the fields its
    /// launch wrote is a stored value that cannot be decoded (500), never the caller's bad
    /// request: no request of the caller's wrote it.
    pub(crate) fn from_data(workflow_id: &WorkflowId, data: Value) -> Result<Self, Error> {
        let missing = |field: &str| {
            Error::Store(store::Error::Database(format!(
                "workflow {workflow_id:?}: its stored document has no {field}"
            )))
        };
        Ok(WorkflowDocument {
            script: data["script"]
                .as_str()
                .ok_or_else(|| missing("script"))?
                .to_owned(),
            args: data["args"].clone(),
            seed: data["seed"].as_u64().ok_or_else(|| missing("seed"))?,
            started_at_ms: data["started_at_ms"]
                .as_i64()
                .ok_or_else(|| missing("started_at_ms"))?,
            data,
        })
    }
}

/// How a supervisor begins.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Start {
    /// Launched just now under this lease (epoch 1): its journal is empty and it has no
    /// artifact, so there is nothing to read before the script starts.
    Fresh,
    /// Taken over (recover, reconcile): the journal is read and replayed.
    Replay,
    /// Taken over only to finish a pending cancellation (its owner died): the journal is read,
    /// and the body is never replayed.
    CancelOnly,
}

/// What the machine is given once and never changes.
pub(crate) struct MachineConfig {
    pub workflow_id: WorkflowId,
    pub fence: Fence,
    pub document: WorkflowDocument,
    /// The agents, to record which definition each step's child ran under.
    pub agents: Arc<AgentRegistry>,
    pub limits: runtime::Limits,
    pub slots_max: u64,
    /// The slots the steps of one user's workflows hold at most (`max_active_children_per_user`).
    pub slots_per_user_max: u64,
    /// `console.log` lines kept as events per workflow at most, and their bytes.
    pub log_events_max: u64,
    pub log_event_bytes_max: u64,
    /// How long a cancellation waits for its child runs to stop before it gives up on observing
    /// them (and the workflow needs reconciliation).
    pub cancel_window_ms: u64,
    /// The workflow's wall-clock limit from launch (`timeout_seconds`); past it, it is
    /// cancelled with reason `timeout`.
    pub timeout_ms: u64,
    /// How it begins: fresh from its launch, or by replaying what the journal holds.
    pub start: Start,
    /// How long a step waits for a cue (a freed slot, an answer) before it looks anyway.
    pub wake_fallback: Duration,
}

/// Where the workflow stands: one value, so no two flags can disagree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Phase {
    /// The script runs or waits. `status` is the status the store holds (running, paused or
    /// waiting_approval); `loaded` says the VM is in the JS pool (not parked).
    Live {
        status: WorkflowStatus,
        loaded: bool,
    },
    /// A cancel request is being carried out: the control to mark applied when it ends.
    Cancelling { control_id: i64 },
    /// This node's part is over: the workflow ended, or is left live for a takeover.
    Halted,
}

/// What an outstanding call waits for.
#[derive(Debug, Clone, PartialEq)]
enum Waiting {
    /// A slot, to admit its child run.
    Slot,
    /// Its child run (the run id once admitted), or the capture or read it is.
    Child(Option<RunId>),
    /// A control of this kind (`resume`, `decide`).
    Control(ControlKind),
}

/// What an admission answered, as the machine reads it (the actor keeps the channel of a
/// started run's end, and follows it when told to, [`Effect::FollowChild`]).
#[derive(Debug)]
pub(crate) enum Admission {
    /// A new run started on this node.
    Started(RunRow),
    /// The idempotency key named an earlier run: here it is, as stored.
    Existing(RunRow),
    /// No slot is free; nothing was written.
    Queued,
    /// The admission failed.
    Failed(Error),
}

/// Why the machine asked for a run's row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RunReadFor {
    /// The step's outcome: its child ended (or was found waiting or ended by another node).
    Outcome,
    /// A cancellation waits for the run to end.
    Cancelling,
}

/// Why the machine asked for the workflow's controls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ControlsFor {
    /// The node's poller found some pending.
    Poll,
    /// A takeover only to finish the cancellation a dead owner began.
    DeadOwnerCancel,
}

/// Work the machine resumes once everything before it in the batch is done.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Then {
    /// Apply the next of the controls read by a poll, after the previous one's activation.
    Controls {
        controls: Vec<ControlRow>,
        wanted: VecDeque<(CallId, ControlKind, String)>,
    },
    /// A capture's outcome is concluded: a later failed write no longer belongs to it.
    CaptureConcluded,
}

/// What happened to the workflow.
#[derive(Debug)]
pub(crate) enum Event {
    /// Start (or replay) the script.
    Begin,
    /// The journal a takeover read: the newest artifact version and the step rows.
    JournalRead(Result<(i64, Vec<StepRow>), store::Error>),
    /// An activation ran. `run_id` is a fresh child-run id, used if the activation made one
    /// agent call whose admission carries its journal.
    Activated {
        result: Result<Activation, String>,
        run_id: RunId,
    },
    /// The oldest write handed out committed.
    Written,
    /// The oldest write handed out failed.
    WriteFailed(store::Error),
    /// A child-run admission answered.
    Admission { id: CallId, result: Admission },
    /// Ask again for a slot (after the store wrote nothing).
    RetryAdmission(CallId),
    /// A child slot was freed (the change bus): ask again for every call waiting for one.
    SlotFreed,
    /// The fallback of a call waiting for a slot: ask again, unless a cue did already.
    SlotCheck(CallId),
    /// A child run of this workflow began or stopped waiting for a person (the change bus): read
    /// again the rows of the children that wait for an answer.
    InputChanged,
    /// The fallback of a child that waits for an answer: read its row, unless a cue did already.
    AnswerCheck(CallId),
    /// A child run this workflow waits for ended.
    ChildEnded {
        id: CallId,
        run_id: RunId,
        /// The run as this node's own compare-and-set ended it (no need to read it back);
        /// `None` when another node's word, or none, decides.
        committed: Option<Box<RunRow>>,
    },
    /// A run's row, read as asked.
    RunRead {
        id: CallId,
        run_id: RunId,
        purpose: RunReadFor,
        result: Result<Option<RunRow>, store::Error>,
    },
    /// Look for controls (the node's poller found some pending for this workflow).
    Poll,
    /// The workflow's controls, read as asked.
    Controls {
        purpose: ControlsFor,
        result: Result<Vec<ControlRow>, store::Error>,
    },
    /// Carry out a call that needs no other actor (capture or read an artifact).
    Local { id: CallId },
    /// A capture read its file (its path and bytes) or failed (why, for the script).
    Captured {
        id: CallId,
        result: Result<(String, Vec<u8>), String>,
    },
    /// An artifact version's bytes, read as asked (`None`: no such version).
    ArtifactRead {
        id: CallId,
        version: i64,
        result: Result<Option<Vec<u8>>, store::Error>,
    },
    /// The workflow's wall-clock limit passed.
    TimedOut,
    /// The timeout's cancel request was recorded (or not).
    TimeoutRecorded(Result<ControlWrite, store::Error>),
    /// The cancellation's window closed.
    CancelDeadline,
    /// Look at the rows of the child runs a cancellation waits for.
    CheckChildren,
    /// The lease actor reports the lease refused or lost.
    LeaseLost,
    /// An operator's `fence`, or the node's clean stop (`shutdown`): stop now (the actor gives
    /// the lease up).
    GiveUp { shutdown: bool },
    /// Resume work the machine put off ([`Effect::Then`]).
    Then(Then),
}

/// What the actor is to do.
#[derive(Debug)]
pub(crate) enum Effect {
    /// Read the newest artifact version and the journal; answer [`Event::JournalRead`].
    ReadJournal,
    /// Run an activation (starting the VM from `start` when it is parked); answer
    /// [`Event::Activated`].
    Activate {
        start: Option<Box<StartSpec>>,
        settles: Vec<Settle>,
    },
    /// A fenced write of these ops under the workflow's fence; answer [`Event::Written`] or
    /// [`Event::WriteFailed`].
    Write(Vec<WriteOp>),
    /// Admit the child run of call `id` (in a task: the answer comes as a message).
    Admit { id: CallId, request: RunRequest },
    /// Follow the run the admission of call `id` started until it ends; then post
    /// [`Event::ChildEnded`].
    FollowChild { id: CallId },
    /// Ask child runs to stop, durably, all at once (one slow request must not hold back the
    /// others); `awaited` waits for every request to be recorded.
    CancelChildren { run_ids: Vec<RunId>, awaited: bool },
    /// Read a run's row; answer [`Event::RunRead`].
    ReadRun {
        id: CallId,
        run_id: RunId,
        purpose: RunReadFor,
    },
    /// Read the workflow's controls; answer [`Event::Controls`].
    ReadControls(ControlsFor),
    /// Record a control; answer [`Event::TimeoutRecorded`].
    PutControl(NewControl),
    /// Read the file a capture names from the thread workspace; answer [`Event::Captured`].
    Capture {
        id: CallId,
        thread_id: String,
        path: String,
        source_step_id: String,
    },
    /// Read an artifact version; answer [`Event::ArtifactRead`].
    ReadArtifact { id: CallId, version: i64 },
    /// Post an event to the machine through the mailbox (after what is queued there).
    Post(Event),
    /// Post an event after a delay.
    After { delay: Duration, event: Event },
    /// Tell the workflows actor a step waits for a slot (it hands out the cues).
    SlotWanted,
    /// Drop the workflow's VM from the JS pool.
    Park,
    /// Add one to a counter.
    Count {
        name: &'static str,
        labels: Vec<(&'static str, String)>,
    },
    /// Hold at a test fault point, if one is armed there.
    Fault(&'static str),
    /// Record an error for a test fault point.
    RecordFault {
        name: &'static str,
        error: store::Error,
    },
    /// Wait before the next effect.
    Sleep(Duration),
    /// Resume the machine with [`Event::Then`].
    Then(Then),
    /// Stop the actor and stop tracking the lease; `abandoned`: the workflow is left live for a
    /// takeover. Nothing after it is performed.
    Halt { abandoned: bool },
}

/// A write handed out and not yet answered.
#[derive(Debug)]
struct InFlight {
    written: Unwritten,
    /// How often it wrote nothing in a row (its backoff).
    tries: u32,
}

/// One workflow's rules (see the module documentation).
pub(crate) struct WorkflowMachine {
    config: MachineConfig,
    phase: Phase,
    /// The newest artifact version of this workflow.
    artifacts: i64,
    /// The current attempt of each call, by sequence number (1 unless a reconcile retried it).
    attempts: BTreeMap<u32, i32>,
    journal: Vec<JournalEntry>,
    waiting: BTreeMap<CallId, (Waiting, Command)>,
    /// `console.log` bytes the script logged on this node (bounded per workflow, across parks).
    logged_bytes: u64,
    /// Journal writes decided on and not yet handed out; the next write carries them.
    unwritten: Unwritten,
    /// The unwritten journal an admission in flight carries.
    carried: Option<Carried>,
    /// Calls the script no longer awaits whose admission or child run is still on its way
    /// (with the child's run id once known): they end as `cancelled`, never as outcomes.
    detached: BTreeMap<CallId, (Option<RunId>, Command)>,
    /// How often each call's admission wrote nothing in a row (its backoff).
    admission_tries: BTreeMap<CallId, u32>,
    /// Calls refused for want of a slot, not asked again yet: a cue or the fallback asks once.
    slot_waits: BTreeSet<CallId>,
    /// Children whose run waits for a person's answer, by call, with their run id, not read
    /// again yet: a cue or the fallback reads each once.
    answer_waits: BTreeMap<CallId, RunId>,
    /// How many reads found the database unavailable or its disk full (the next retry's backoff).
    read_tries: u32,
    /// Writes handed out, oldest first (they are performed in this order).
    writes: VecDeque<InFlight>,
    /// A capture's outcome is being concluded: a write that fails now is recorded for tests.
    capturing: bool,
    /// The rules every batch keeps (checked in debug builds).
    invariants: Invariants,
    span: tracing::Span,
}

impl WorkflowMachine {
    pub(crate) fn new(config: MachineConfig, span: tracing::Span) -> Self {
        WorkflowMachine {
            config,
            phase: Phase::Live {
                status: WorkflowStatus::Running,
                loaded: false,
            },
            artifacts: 0,
            attempts: BTreeMap::new(),
            journal: Vec::new(),
            waiting: BTreeMap::new(),
            logged_bytes: 0,
            unwritten: Unwritten::default(),
            carried: None,
            detached: BTreeMap::new(),
            admission_tries: BTreeMap::new(),
            slot_waits: BTreeSet::new(),
            answer_waits: BTreeMap::new(),
            read_tries: 0,
            writes: VecDeque::new(),
            capturing: false,
            invariants: Invariants::default(),
            span,
        }
    }

    pub(crate) fn is_halted(&self) -> bool {
        self.phase == Phase::Halted
    }

    /// When the workflow's wall-clock limit (`timeout_seconds` from launch) passes, in epoch ms.
    pub(crate) fn deadline_ms(&self) -> Millis {
        self.config
            .document
            .started_at_ms
            .saturating_add(i64::try_from(self.config.timeout_ms).unwrap_or(i64::MAX))
    }

    /// Feeds one event; answers what to do, in order (see the module documentation).
    pub(crate) fn on(&mut self, event: Event, now: Millis) -> Vec<Effect> {
        let out = self.decide(event, now);
        self.invariants.check(&self.config.fence, &out);
        out
    }

    /// What `on` answers, before its invariants are checked.
    fn decide(&mut self, event: Event, now: Millis) -> Vec<Effect> {
        let mut out = Vec::new();
        // A halt decided on still hears how the writes before it went: their announcements,
        // and a failure that leaves the workflow live after all.
        if self.is_halted() && !matches!(event, Event::Written | Event::WriteFailed(_)) {
            return out;
        }
        let cancelling = matches!(self.phase, Phase::Cancelling { .. });
        match event {
            Event::Begin if self.config.start == Start::Fresh => self.activate(&mut out, vec![]),
            Event::Begin => out.push(Effect::ReadJournal),
            Event::JournalRead(read) => self.on_journal(&mut out, read, now),
            Event::Activated { result, run_id } => match result {
                Ok(activation) => self.apply(&mut out, activation, run_id),
                Err(message) => self.finish(&mut out, Err(message)),
            },
            Event::Written => {
                if let Some(written) = self.writes.pop_front() {
                    self.announce(&mut out, written.written.events);
                }
            }
            Event::WriteFailed(error) => self.write_failed(&mut out, error, now),
            Event::Admission { id, result } => self.on_admission(&mut out, id, result, now),
            Event::RetryAdmission(id) => self.admit(&mut out, id),
            #[cfg(test)]
            Event::SlotCheck(_) | Event::SlotFreed
                if super::mutants::planted(super::mutants::Mutant::QueuedCallNeverWoken) => {}
            Event::SlotCheck(id) => {
                if self.slot_waits.remove(&id) {
                    self.admit(&mut out, id);
                }
            }
            Event::SlotFreed => {
                for id in std::mem::take(&mut self.slot_waits) {
                    self.admit(&mut out, id);
                }
            }
            Event::AnswerCheck(id) => {
                if let Some(run_id) = self.answer_waits.remove(&id) {
                    out.push(Effect::Post(Event::ChildEnded {
                        id,
                        run_id,
                        committed: None,
                    }));
                }
            }
            Event::InputChanged => {
                for (id, run_id) in std::mem::take(&mut self.answer_waits) {
                    out.push(Effect::Post(Event::ChildEnded {
                        id,
                        run_id,
                        committed: None,
                    }));
                }
            }
            // An end whose fate is unknown is left to the cancel window.
            Event::ChildEnded { id, run_id, .. } if cancelling => out.push(Effect::ReadRun {
                id,
                run_id,
                purpose: RunReadFor::Cancelling,
            }),
            Event::ChildEnded { id, run_id, .. } if self.detached.contains_key(&id) => {
                self.detached_child_ended(&mut out, id, &run_id);
            }
            Event::ChildEnded {
                id,
                run_id,
                committed: Some(row),
            } => self.on_child_row(&mut out, id, run_id, Ok(Some(*row)), now),
            Event::ChildEnded {
                id,
                run_id,
                committed: None,
            } => out.push(Effect::ReadRun {
                id,
                run_id,
                purpose: RunReadFor::Outcome,
            }),
            Event::RunRead {
                id,
                run_id,
                purpose: RunReadFor::Outcome,
                result,
            } => self.on_child_row(&mut out, id, run_id, result, now),
            Event::RunRead {
                id,
                purpose: RunReadFor::Cancelling,
                result,
                ..
            } => {
                if let Ok(Some(row)) = result
                    && row.status.is_final()
                {
                    self.child_ended_while_cancelling(&mut out, id, row);
                }
            }
            Event::Poll if cancelling => {}
            Event::Poll => out.push(Effect::ReadControls(ControlsFor::Poll)),
            Event::Controls { purpose, result } => self.on_controls(&mut out, purpose, result, now),
            Event::Local { id } => self.local(&mut out, id),
            Event::Captured { id, result } => self.on_captured(&mut out, id, result, now),
            Event::ArtifactRead {
                id,
                version,
                result,
            } => self.on_artifact(&mut out, id, version, result, now),
            Event::TimedOut if cancelling => {}
            Event::TimedOut => {
                tracing::warn!(parent: &self.span, "the workflow ran past timeout_seconds: cancelling");
                out.push(Effect::PutControl(NewControl {
                    workflow_id: self.config.workflow_id.clone(),
                    kind: ControlKind::Cancel.as_str().into(),
                    step_id: String::new(),
                    attempt: 0,
                    body: json!({"reason": "timeout"}),
                    created_by: None,
                }));
            }
            Event::TimeoutRecorded(recorded) => self.on_timeout_recorded(&mut out, recorded),
            Event::CheckChildren if cancelling => self.check_children(&mut out),
            Event::CheckChildren => {}
            Event::CancelDeadline => self.cancel_deadline(&mut out, now),
            Event::LeaseLost => {
                tracing::warn!(parent: &self.span, "lease lost: fenced");
                self.halt(&mut out, true);
            }
            Event::GiveUp { shutdown } => {
                // Between two events nothing is being written: stop first, so nothing more is,
                // then the actor lets the lease go so another node can take the workflow at once.
                if shutdown {
                    tracing::info!(parent: &self.span, "the node stops: giving up the lease");
                } else {
                    tracing::warn!(parent: &self.span, "fenced by an operator: giving up the lease");
                }
                self.halt(&mut out, false);
            }
            Event::Then(Then::Controls { controls, wanted }) => {
                self.apply_controls(&mut out, controls, wanted, now);
            }
            Event::Then(Then::CaptureConcluded) => self.capturing = false,
        }
        out
    }

    /// Whether the workflow may give its lease up at the node's clean stop, for another node to
    /// take it over at once: not while a child run of it is in flight, since that run stops
    /// with the node while its own lease holds, and a new owner would have to take it for an
    /// orphan; nor while a call waits for its slot, whose admission may be starting such a run
    /// right now. Such a workflow is recovered when the leases run out, as after a crash.
    pub(crate) fn may_hand_over(&self) -> bool {
        !self
            .waiting
            .values()
            .any(|(waiting, _)| matches!(waiting, Waiting::Child(_) | Waiting::Slot))
    }

    fn attempt(&self, seq: u32) -> i32 {
        self.attempts.get(&seq).copied().unwrap_or(1)
    }

    /// The status the store holds, as this owner last wrote it.
    fn stored_status(&self) -> Option<WorkflowStatus> {
        match self.phase {
            Phase::Live { status, .. } => Some(status),
            Phase::Cancelling { .. } => Some(WorkflowStatus::Cancelling),
            Phase::Halted => None,
        }
    }

    fn loaded(&self) -> bool {
        matches!(self.phase, Phase::Live { loaded: true, .. })
    }

    fn set_loaded(&mut self, now_loaded: bool) {
        if let Phase::Live { loaded, .. } = &mut self.phase {
            *loaded = now_loaded;
        }
    }

    fn step_op(&self, entry: &JournalEntry, status: StepStatus, extra: Value) -> WriteOp {
        let mut data = json!({
            "args": entry.args,
            "outcome": entry.outcome,
            "settled_at_ms": entry.settled_at_ms,
        });
        if let (Some(data), Some(extra)) = (data.as_object_mut(), extra.as_object()) {
            data.extend(extra.clone());
        }
        WriteOp::PutStep {
            workflow_id: self.config.workflow_id.clone(),
            seq: i32::try_from(entry.seq).unwrap_or(i32::MAX),
            step_id: entry.step_id.clone(),
            attempt: self.attempt(entry.seq),
            kind: entry.kind.as_str().to_owned(),
            status,
            data,
        }
    }

    fn set_workflow(&self, status: WorkflowStatus, data: Value) -> WriteOp {
        WriteOp::SetWorkflow {
            workflow_id: self.config.workflow_id.clone(),
            status,
            data,
        }
    }

    /// A fenced write of everything unwritten and `ops`, if that is anything.
    fn write(&mut self, out: &mut Vec<Effect>, ops: Vec<WriteOp>) {
        let Unwritten {
            ops: mut all,
            events,
        } = std::mem::take(&mut self.unwritten);
        all.extend(ops);
        if all.is_empty() {
            return;
        }
        out.push(Effect::Write(all.clone()));
        self.writes.push_back(InFlight {
            written: Unwritten { ops: all, events },
            tries: 0,
        });
    }

    fn write_failed(&mut self, out: &mut Vec<Effect>, error: store::Error, now: Millis) {
        let deadline_ms = self.deadline_ms();
        let Some(front) = self.writes.front_mut() else {
            return;
        };
        // The store proved nothing was written (the database is unreachable): an outage costs
        // this workflow time, never its outcome. The fence decides once the database is back:
        // if the lease lapsed meanwhile, the write is refused and another node (or this one)
        // recovers the workflow from its journal.
        if error.is_transient() && now < deadline_ms {
            front.tries += 1;
            let tries = front.tries;
            out.push(Effect::Sleep(store_backoff(tries)));
            out.push(Effect::Write(front.written.ops.clone()));
            if tries == 1 {
                tracing::warn!(parent: &self.span, %error,
                    "a journal write wrote nothing (database unavailable or its disk full); retrying");
            }
            return;
        }
        self.writes.clear();
        if self.capturing {
            out.push(Effect::RecordFault {
                name: "capture_error",
                error: error.clone(),
            });
        }
        match error {
            store::Error::LeaseLost { .. } => {
                tracing::warn!(parent: &self.span, "lease lost: the workflow stops here");
            }
            error => {
                // Unknown or failed: the journal may or may not hold the write, so the workflow
                // stops and recovery, reading the journal, decides.
                tracing::error!(parent: &self.span, %error, "a journal write failed; stopping");
            }
        }
        self.halt(out, true);
    }

    /// What a committed journal write made true: counted and logged once, here, and never by a
    /// replay (which journals nothing new).
    fn announce(&self, out: &mut Vec<Effect>, events: Vec<Journaled>) {
        for event in events {
            match event {
                Journaled::Started { step_id, kind } => {
                    let kind = kind.as_str();
                    out.push(Effect::Count {
                        name: "reins_steps_started_total",
                        labels: vec![("kind", kind.to_owned())],
                    });
                    tracing::info!(parent: &self.span, %step_id, kind, "step started");
                }
                Journaled::Finished {
                    step_id,
                    kind,
                    status,
                } => {
                    out.push(Effect::Count {
                        name: "reins_steps_finished_total",
                        labels: vec![
                            ("kind", kind.as_str().to_owned()),
                            ("outcome", status.as_str().to_owned()),
                        ],
                    });
                    tracing::info!(parent: &self.span, %step_id, kind = kind.as_str(),
                        status = status.as_str(),
                        "step finished");
                    match kind {
                        CallKind::Agent => out.push(Effect::Fault("result")),
                        CallKind::HumanCheckpoint => out.push(Effect::Fault("approval")),
                        _ => {}
                    }
                }
                Journaled::Ended {
                    status,
                    reconciliation,
                } => self.announce_end(out, status, reconciliation),
            }
        }
    }

    /// The workflow's end, once its write committed: logged and counted here only.
    fn announce_end(
        &self,
        out: &mut Vec<Effect>,
        status: WorkflowStatus,
        reconciliation: Option<Reconciliation>,
    ) {
        out.push(Effect::Count {
            name: "reins_workflows_finished_total",
            labels: vec![("status", status.as_str().to_owned())],
        });
        match (status, reconciliation) {
            (_, Some(why)) => {
                tracing::warn!(parent: &self.span, reason = why.reason.as_str(),
                    step_id = %why.step_id,
                    child_run_id = why.run_id.as_ref().map_or("", RunId::as_str),
                    message = %why.message, "the workflow needs reconciliation");
                out.push(Effect::Count {
                    name: "reins_reconciliations_needed_total",
                    labels: vec![("reason", why.reason.as_str().to_owned())],
                });
            }
            (WorkflowStatus::Cancelled, None) => tracing::info!(parent: &self.span, "cancelled"),
            (status, None) => {
                tracing::info!(parent: &self.span, status = status.as_str(), "workflow finished");
            }
        }
    }

    /// Stops this node's part. `abandoned`: the workflow is still live (the lease lost, a write
    /// whose outcome is unknown, a read that failed), and the node takes it back by the usual
    /// takeover once its lease has run out (another node may win; the takeover decides).
    /// Otherwise it ended (its lease released in the same write) or was given up on an
    /// operator's word: nothing is to be taken back.
    fn halt(&mut self, out: &mut Vec<Effect>, abandoned: bool) {
        self.phase = Phase::Halted;
        out.push(Effect::Halt { abandoned });
    }

    fn on_journal(
        &mut self,
        out: &mut Vec<Effect>,
        read: Result<(i64, Vec<StepRow>), store::Error>,
        now: Millis,
    ) {
        match read {
            Ok((version, steps)) => {
                self.artifacts = version;
                let (newest, journal) = newest_attempts(steps);
                self.attempts = newest
                    .iter()
                    .map(|(seq, step)| (*seq, step.attempt))
                    .collect();
                match journal {
                    // A cancel replays nothing: it waits for the children its journal shows
                    // running, and its end stops every live child run of the workflow, so an
                    // unreadable journal only leaves nothing to wait for.
                    journal if self.config.start == Start::CancelOnly => {
                        self.journal = journal.unwrap_or_else(|unreadable| {
                            tracing::warn!(parent: &self.span, %unreadable,
                                "the journal cannot be read; cancelling without it");
                            Vec::new()
                        });
                        self.finish_cancel_of_dead_owner(out, &newest);
                    }
                    Ok(journal) => {
                        self.journal = journal;
                        self.activate(out, Vec::new());
                    }
                    Err(unreadable) => {
                        let why = Reconciliation::of_journal(&unreadable);
                        self.reconcile_needed(out, why, now);
                    }
                }
            }
            Err(error) if error.is_transient() => {
                self.read_tries += 1;
                tracing::warn!(parent: &self.span, %error, "cannot read the journal yet; retrying");
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::Begin,
                });
            }
            Err(error) => {
                tracing::error!(parent: &self.span, %error, "cannot read the journal");
                self.halt(out, true);
            }
        }
    }

    fn options(&self) -> VmOptions {
        VmOptions {
            limits: self.config.limits.clone(),
            seed: self.config.document.seed,
            started_at_ms: self.config.document.started_at_ms,
            journal: self.journal.clone(),
            logged_bytes: self.logged_bytes,
        }
    }

    /// Runs an activation: settles into a loaded VM, or starts (replays) a parked one, whose
    /// journal already holds the outcomes.
    fn activate(&mut self, out: &mut Vec<Effect>, settles: Vec<Settle>) {
        let loaded = self.loaded();
        let start = (!loaded).then(|| {
            Box::new(StartSpec {
                script: self.config.document.script.clone(),
                args: self.config.document.args.clone(),
                options: self.options(),
            })
        });
        let settles = if loaded { settles } else { Vec::new() };
        out.push(Effect::Activate { start, settles });
    }

    fn apply(&mut self, out: &mut Vec<Effect>, activation: Activation, run_id: RunId) {
        self.set_loaded(true);
        for line in &activation.logs {
            self.logged_bytes += line.len() as u64;
            tracing::info!(parent: &self.span, script_log = %line, "console.log");
        }
        if !activation.logs.is_empty() {
            // Kept as `log` events with whatever the workflow writes next, like an outcome.
            self.unwritten.ops.push(WriteOp::PutLogs {
                workflow_id: self.config.workflow_id.clone(),
                lines: activation.logs.clone(),
                events_max: i64::try_from(self.config.log_events_max).unwrap_or(i64::MAX),
                bytes_max: i64::try_from(self.config.log_event_bytes_max).unwrap_or(i64::MAX),
            });
        }
        if let Some(carried) = self.carry(&activation, run_id) {
            // One new agent call and nothing else to wait for: its entry, and everything
            // unwritten before it, is journaled by its admission.
            self.carried = Some(carried);
            self.journal.extend(activation.journal);
        } else if !activation.journal.is_empty() {
            let ops = activation
                .journal
                .iter()
                .map(|entry| {
                    let status = if entry.kind == CallKind::Agent {
                        StepStatus::Queued
                    } else {
                        StepStatus::Running
                    };
                    self.step_op(entry, status, json!({}))
                })
                .collect();
            // New calls only: a replayed call resolves from the journal and is not here, so a
            // restart neither counts nor logs a step again.
            self.unwritten
                .events
                .extend(activation.journal.iter().map(|entry| Journaled::Started {
                    step_id: entry.step_id.clone(),
                    kind: entry.kind,
                }));
            self.write(out, ops);
            self.journal.extend(activation.journal);
        }
        // The stops of the calls the script left behind wait for the outcome that made it
        // leave them (in `unwritten`) to be durable: a cancel that left the process before the
        // failure that caused it would leave a replay with two failed siblings and nothing to
        // say which failed first.
        let mut stops = Vec::new();
        for id in &activation.cancels {
            self.detach(&mut stops, *id);
        }
        for command in activation.commands {
            if activation.cancels.contains(&command.id) {
                // A replay re-made a call the script no longer awaits (a failed `parallel`
                // left it behind): nothing is begun for it. A child run it may have is asked
                // to stop, and its slot given back, by the workflow's end at the latest.
                continue;
            }
            self.begin_command(out, command);
        }
        match activation.status {
            // The end's write comes first, then it stops every live child, detached or not.
            Status::Completed(result) => self.finish(out, Ok(result)),
            Status::Failed(message) => self.finish(out, Err(message)),
            Status::Waiting => {
                // Outcomes settled into a script that now waits on calls already journaled.
                self.write(out, Vec::new());
                out.extend(stops);
                self.settle_status(out);
            }
        }
    }

    /// The journal an activation can hand to its admission: when it made exactly one new call,
    /// an agent call, and the workflow waits for nothing else. (With other calls outstanding, a
    /// later write could commit before the admission and journal outcomes out of order.)
    fn carry(&mut self, activation: &Activation, run_id: RunId) -> Option<Carried> {
        let ([entry], [command], Status::Waiting) = (
            activation.journal.as_slice(),
            activation.commands.as_slice(),
            &activation.status,
        ) else {
            return None;
        };
        if entry.kind != CallKind::Agent
            || command.seq != entry.seq
            || !self.waiting.is_empty()
            || matches!(self.phase, Phase::Cancelling { .. })
            || self.carried.is_some()
        {
            return None;
        }
        let agent = entry.args["agentRef"].as_str().unwrap_or_default();
        let thread_id = thread_for(&self.config.workflow_id, &entry.step_id);
        let fields = self.child_fields(&run_id, &thread_id, agent);
        let mut before = std::mem::take(&mut self.unwritten);
        before.events.push(Journaled::Started {
            step_id: entry.step_id.clone(),
            kind: entry.kind,
        });
        Some(Carried {
            call: command.id,
            run_id,
            before,
            running: self.step_op(entry, StepStatus::Running, fields),
            queued: self.step_op(entry, StepStatus::Queued, json!({})),
        })
    }

    fn begin_command(&mut self, out: &mut Vec<Effect>, command: Command) {
        let id = command.id;
        match command.kind {
            CallKind::Agent => {
                self.waiting.insert(id, (Waiting::Slot, command));
                self.admit(out, id);
            }
            CallKind::Pause => {
                let waiting = Waiting::Control(ControlKind::Resume);
                self.waiting.insert(id, (waiting, command));
            }
            CallKind::HumanCheckpoint => {
                let waiting = Waiting::Control(ControlKind::Decide);
                self.waiting.insert(id, (waiting, command));
            }
            CallKind::CaptureArtifact | CallKind::ReadArtifact => {
                self.waiting.insert(id, (Waiting::Child(None), command));
                // Carried out from the mailbox, after this activation's commands are all begun.
                out.push(Effect::Post(Event::Local { id }));
            }
        }
    }

    /// Asks for the child run of agent call `id` (idempotent: a replayed call finds its run).
    fn admit(&self, out: &mut Vec<Effect>, id: CallId) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        let carried = self.carried.as_ref().filter(|carried| carried.call == id);
        let workflow_id = &self.config.workflow_id;
        let attempt = self.attempt(command.seq);
        let request = RunRequest {
            thread_id: thread_for(workflow_id, &command.step_id),
            agent: command.args["agentRef"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            task: command.args["task"].clone(),
            idempotency_key: Some(format!("{workflow_id}/{}/{attempt}", command.step_id)),
            step: Some(store::WorkflowStep {
                workflow_id: workflow_id.clone(),
                step_id: command.step_id.clone(),
                attempt,
                slots_max: self.config.slots_max,
                slots_per_user_max: self.config.slots_per_user_max,
                fence: self.config.fence.clone(),
                journal: carried.map_or_else(Vec::new, |carried| {
                    let mut journal = carried.before.ops.clone();
                    journal.push(carried.running.clone());
                    journal
                }),
            }),
            run_id: carried.map(|carried| carried.run_id.clone()),
        };
        out.push(Effect::Admit { id, request });
    }

    /// The script no longer awaits call `id` (a `parallel` it belongs to failed). A call still
    /// waiting for its admission or its child is kept apart from the script's calls: its child
    /// run is asked to stop, durably, and its end is journaled as `cancelled` with its slot
    /// given back; anything else is simply dropped.
    fn detach(&mut self, out: &mut Vec<Effect>, id: CallId) {
        match self.waiting.remove(&id) {
            Some((Waiting::Slot, command)) => {
                self.detached.insert(id, (None, command));
            }
            Some((Waiting::Child(Some(run_id)), command)) => {
                out.push(Effect::CancelChildren {
                    run_ids: vec![run_id.clone()],
                    awaited: false,
                });
                self.detached.insert(id, (Some(run_id), command));
            }
            _ => {}
        }
    }

    /// The child runs this workflow knows to be live: those the script waits for and those it
    /// left behind.
    fn live_children(&self) -> Vec<RunId> {
        let waited = self
            .waiting
            .values()
            .filter_map(|(waiting, _)| match waiting {
                Waiting::Child(Some(run_id)) => Some(run_id.clone()),
                _ => None,
            });
        let detached = self
            .detached
            .values()
            .filter_map(|(run_id, _)| run_id.clone());
        waited.chain(detached).collect()
    }

    /// An admission answered for a detached call: a run it started is stopped at once and
    /// followed to its end; a run that exists from before is asked to stop (its slot is given
    /// back by the workflow's end).
    fn admitted_detached(&mut self, out: &mut Vec<Effect>, id: CallId, result: Admission) {
        let Some((_, command)) = self.detached.remove(&id) else {
            return;
        };
        match result {
            Admission::Started(row) => {
                out.push(Effect::CancelChildren {
                    run_ids: vec![row.run_id.clone()],
                    awaited: false,
                });
                self.detached.insert(id, (Some(row.run_id), command));
                out.push(Effect::FollowChild { id });
            }
            Admission::Existing(row) if !row.status.is_final() => {
                out.push(Effect::CancelChildren {
                    run_ids: vec![row.run_id],
                    awaited: false,
                });
            }
            _ => {}
        }
    }

    /// A detached call's child run ended: its step is journaled `cancelled` and its slot is
    /// given back.
    fn detached_child_ended(&mut self, out: &mut Vec<Effect>, id: CallId, run_id: &RunId) {
        let Some((_, command)) = self.detached.remove(&id) else {
            return;
        };
        let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
            return;
        };
        let mut fields = self.child_fields(
            run_id,
            &thread_for(&self.config.workflow_id, &command.step_id),
            command.args["agentRef"].as_str().unwrap_or_default(),
        );
        fields["detached"] = json!(true);
        self.unwritten
            .ops
            .push(self.step_op(&entry, StepStatus::Cancelled, fields));
        self.unwritten.ops.push(WriteOp::ReleaseSlot {
            workflow_id: self.config.workflow_id.clone(),
            step_id: command.step_id,
        });
        self.write(out, Vec::new());
    }

    /// Records an outcome (with `extra` ops in the same fenced write) and hands it to the script.
    fn conclude(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        outcome: Outcome,
        mut extra: Vec<WriteOp>,
        fields: Value,
        now: Millis,
    ) {
        if matches!(self.phase, Phase::Cancelling { .. }) {
            return;
        }
        let Some(_) = self.waiting.remove(&id) else {
            return;
        };
        let Some(entry) = self.journal.get_mut(id.0 as usize) else {
            return;
        };
        entry.outcome = Some(outcome.clone());
        entry.settled_at_ms = Some(now);
        let entry = entry.clone();
        let status = match outcome {
            Outcome::Resolved(_) => StepStatus::Completed,
            Outcome::Rejected(_) => StepStatus::Failed,
        };
        // Journaled with whatever the workflow writes next (see `unwritten`). The artifact the
        // outcome names goes first, so the step's `step_finished` event can give its size.
        let op = self.step_op(&entry, status, fields);
        self.unwritten.ops.append(&mut extra);
        self.unwritten.ops.push(op);
        self.unwritten.events.push(Journaled::Finished {
            step_id: entry.step_id.clone(),
            kind: entry.kind,
            status,
        });
        if !self.loaded() {
            self.set_status(out, WorkflowStatus::Running);
        }
        self.activate(
            out,
            vec![Settle {
                id,
                outcome,
                at_ms: now,
            }],
        );
    }

    /// After an activation that left the script waiting: park it if only people can wake it.
    fn settle_status(&mut self, out: &mut Vec<Effect>) {
        let humans: Vec<ControlKind> = self
            .waiting
            .values()
            .filter_map(|(waiting, _)| match waiting {
                Waiting::Control(kind) => Some(*kind),
                _ => None,
            })
            .collect();
        if humans.is_empty() || humans.len() < self.waiting.len() {
            return;
        }
        out.push(Effect::Park);
        self.set_loaded(false);
        let status = if humans.contains(&ControlKind::Decide) {
            WorkflowStatus::WaitingApproval
        } else {
            WorkflowStatus::Paused
        };
        self.set_status(out, status);
    }

    /// Writes the workflow's status, if the store does not hold it already.
    fn set_status(&mut self, out: &mut Vec<Effect>, status: WorkflowStatus) {
        if self.stored_status() == Some(status) {
            return;
        }
        let op = self.set_workflow(status, self.config.document.data.clone());
        self.write(out, vec![op]);
        if let Phase::Live { status: stored, .. } = &mut self.phase {
            *stored = status;
        }
    }

    fn finish(&mut self, out: &mut Vec<Effect>, result: Result<Value, String>) {
        let mut data = self.config.document.data.clone();
        let status = match &result {
            Ok(value) => {
                data["result"] = value.clone();
                WorkflowStatus::Completed
            }
            Err(message) => {
                data["error"] = json!(message);
                WorkflowStatus::Failed
            }
        };
        self.unwritten.events.push(Journaled::Ended {
            status,
            reconciliation: None,
        });
        // The end, a durable stop request to every child run still live (a sibling a failed
        // step left running), every slot given back and the lease's release are one write.
        let workflow_id = self.config.workflow_id.clone();
        let ops = vec![
            self.set_workflow(status, data),
            WriteOp::CancelRuns {
                workflow_id: workflow_id.clone(),
            },
            WriteOp::ReleaseSlots { workflow_id },
            WriteOp::ReleaseLease,
        ];
        #[cfg(test)]
        let ops = if super::mutants::planted(super::mutants::Mutant::LeaseKeptAfterTheEnd) {
            ops.into_iter()
                .filter(|op| !matches!(op, WriteOp::ReleaseLease))
                .collect()
        } else {
            ops
        };
        self.write(out, ops);
        let live = self.live_children();
        if !live.is_empty() {
            out.push(Effect::CancelChildren {
                run_ids: live,
                awaited: false,
            });
        }
        self.halt(out, false);
    }

    fn on_admission(&mut self, out: &mut Vec<Effect>, id: CallId, result: Admission, now: Millis) {
        if !matches!(&result, Admission::Failed(Error::Store(error)) if error.is_transient()) {
            self.admission_tries.remove(&id);
        }
        let carried = self.carried.take_if(|carried| carried.call == id);
        let journaled = carried.is_some() && matches!(result, Admission::Started(_));
        if let Admission::Failed(
            error @ (Error::Store(store::Error::OutcomeUnknown(_))
            | Error::Unanswered { .. }
            | Error::Spawn { .. }),
        ) = &result
        {
            // The admission (and any journal it carried) may have committed, and a child run
            // may exist (unanswered, or admitted but never started): recovery reads which,
            // instead of a guess here.
            tracing::error!(parent: &self.span, %error, "an admission's outcome is unknown; stopping");
            self.halt(out, true);
            return;
        }
        let mut ask_again_now = false;
        match (carried, &result) {
            (None, _)
            | (Some(_), Admission::Failed(Error::Store(store::Error::LeaseLost { .. }))) => {}
            (Some(carried), Admission::Started(_)) => {
                self.announce(out, carried.before.events);
            }
            (Some(carried), _) => {
                // Not admitted: the journal it carried was not written; write it, with the
                // call as queued.
                let mut before = carried.before;
                before.ops.push(carried.queued);
                self.unwritten.restore(before);
                self.write(out, Vec::new());
                // A slot freed before the queued entry committed announced nobody waiting
                // (the cue is sent only while a step is queued): ask once more at once.
                ask_again_now = true;
            }
        }
        if self.detached.contains_key(&id) {
            self.admitted_detached(out, id, result);
            return;
        }
        if matches!(self.phase, Phase::Cancelling { .. }) {
            // Admitted after the cancel began: stop it too, and wait for it like the others.
            if let Admission::Started(row) = result {
                if let Some((_, command)) = self.waiting.get(&id).cloned() {
                    self.waiting
                        .insert(id, (Waiting::Child(Some(row.run_id.clone())), command));
                }
                out.push(Effect::CancelChildren {
                    run_ids: vec![row.run_id],
                    awaited: true,
                });
                out.push(Effect::FollowChild { id });
            }
            return;
        }
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        match result {
            Admission::Started(row) => {
                out.push(Effect::Count {
                    name: "reins_child_runs_started_total",
                    labels: Vec::new(),
                });
                // For debugging: at info, a step is its "step started" and "step finished"
                // lines (the child run's own lines carry its id in their span).
                tracing::debug!(parent: &self.span, step_id = %command.step_id,
                    child_run_id = %row.run_id, "child run admitted");
                out.push(Effect::Fault("admission"));
                self.waiting.insert(
                    id,
                    (Waiting::Child(Some(row.run_id.clone())), command.clone()),
                );
                let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
                    return;
                };
                if !journaled {
                    let fields = self.child_fields(&row.run_id, &row.thread_id, &row.agent);
                    let op = self.step_op(&entry, StepStatus::Running, fields);
                    self.write(out, vec![op]);
                }
                out.push(Effect::FollowChild { id });
            }
            Admission::Existing(row) if row.stop_reason.as_deref() == Some("orphan_recovered") => {
                // Closed by the orphan sweep: the agent's real effects are unknown, and guessing
                // "failed" could make a retry run it twice. A person decides.
                let reason = ReconciliationReason::OrphanedChild;
                #[cfg(test)]
                let reason = if super::mutants::planted(
                    super::mutants::Mutant::OrphanReportedAsOutcomeUnknown,
                ) {
                    ReconciliationReason::ChildOutcomeUnknown
                } else {
                    reason
                };
                let why = Reconciliation::of_step(reason, &command.step_id, &row.run_id);
                self.reconcile_needed(out, why, now);
            }
            Admission::Existing(row) if row.status.is_final() => {
                self.waiting.insert(id, (Waiting::Child(None), command));
                self.adopt(out, id, row, now);
            }
            Admission::Existing(row) if row.status == RunStatus::WaitingForInput => {
                // Its agent asked a person before this workflow changed hands: the answer (given
                // on any node) decides the run, so follow the row as the first owner did. The
                // journal may not name the run (the first owner's write of it may never have
                // committed): it is written again, so the step shows the run a person answers.
                if let Some(entry) = self.journal.get(id.0 as usize).cloned() {
                    let fields = self.child_fields(&row.run_id, &row.thread_id, &row.agent);
                    let op = self.step_op(&entry, StepStatus::Running, fields);
                    self.write(out, vec![op]);
                }
                let run_id = row.run_id;
                self.waiting
                    .insert(id, (Waiting::Child(Some(run_id.clone())), command));
                out.push(Effect::Post(Event::ChildEnded {
                    id,
                    run_id,
                    committed: None,
                }));
            }
            Admission::Existing(row) => {
                // A child run exists for this step and has no outcome: it may still be running on
                // a node that is gone. Guessing would risk a second run, so a person decides.
                let why = Reconciliation::of_step(
                    ReconciliationReason::ChildOutcomeUnknown,
                    &command.step_id,
                    &row.run_id,
                );
                self.reconcile_needed(out, why, now);
            }
            Admission::Queued if ask_again_now => {
                self.slot_waits.insert(id);
                out.push(Effect::Post(Event::SlotCheck(id)));
            }
            Admission::Queued => {
                // Woken by a freed slot (the workflows actor hands the cues out), or by the
                // fallback, whichever comes first; the other then finds nothing to do.
                self.slot_waits.insert(id);
                out.push(Effect::SlotWanted);
                out.push(Effect::After {
                    delay: self.config.wake_fallback,
                    event: Event::SlotCheck(id),
                });
            }
            Admission::Failed(Error::Store(error)) if error.is_transient() => {
                // Nothing was written: the database is unreachable. That is never the step's
                // failure; the admission is asked again (the idempotency key makes a repeat
                // find the same run) until the database answers or the workflow times out.
                let tries = self.admission_tries.entry(id).or_insert(0);
                *tries += 1;
                let delay = store_backoff(*tries);
                if delay == STORE_RETRY_FIRST {
                    tracing::warn!(parent: &self.span, step_id = %command.step_id, %error,
                        "an admission wrote nothing (database unavailable or its disk full); retrying");
                }
                out.push(Effect::After {
                    delay,
                    event: Event::RetryAdmission(id),
                });
            }
            Admission::Failed(Error::Store(store::Error::LeaseLost { .. })) => {
                // Fenced at admission: no child run exists, and nothing more is ours to write.
                tracing::warn!(parent: &self.span, step_id = %command.step_id,
                    "admission refused: the lease is lost; the workflow stops here");
                self.halt(out, true);
            }
            Admission::Failed(error) => {
                let outcome =
                    Outcome::Rejected(json!({"message": error.to_string(), "status": "error"}));
                self.waiting.insert(id, (Waiting::Child(None), command));
                self.conclude(out, id, outcome, Vec::new(), json!({}), now);
            }
        }
    }

    /// What an agent step's journal entry says about its child run: which run, on which thread,
    /// under which definition of its agent.
    fn child_fields(&self, run_id: &RunId, thread_id: &str, agent: &str) -> Value {
        let configuration_version = self
            .config
            .agents
            .get(agent)
            .map(|agent| agent.configuration_version.clone());
        json!({"run_id": run_id, "thread_id": thread_id,
               "configuration_version": configuration_version})
    }

    /// A child's row, when its end was announced (or it was found waiting for a person).
    fn on_child_row(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        run_id: RunId,
        row: Result<Option<RunRow>, store::Error>,
        now: Millis,
    ) {
        match row {
            Ok(Some(row))
                if row.status.is_final()
                    && row.stop_reason.as_deref() != Some("orphan_recovered") =>
            {
                self.adopt(out, id, row, now);
            }
            Ok(Some(row)) if row.status == RunStatus::WaitingForInput => {
                // The agent ended its run in a pause: a person's answer (on any node) ends the
                // run, and announces it on the change bus; the fallback reads the row should the
                // cue be lost.
                self.answer_waits.insert(id, run_id);
                out.push(Effect::After {
                    delay: self.config.wake_fallback,
                    event: Event::AnswerCheck(id),
                });
            }
            Err(error) if error.is_transient() => {
                // The row could not be read (the database is unreachable): read it again later;
                // an outage says nothing about the child.
                self.read_tries += 1;
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::ChildEnded {
                        id,
                        run_id,
                        committed: None,
                    },
                });
            }
            Ok(_) | Err(_) => {
                // The run's end was not recorded by its node (fenced, or unknown).
                let step_id = self
                    .waiting
                    .get(&id)
                    .map(|(_, command)| command.step_id.clone())
                    .unwrap_or_default();
                let why = Reconciliation::of_step(
                    ReconciliationReason::ChildEndUnrecorded,
                    &step_id,
                    &run_id,
                );
                self.reconcile_needed(out, why, now);
            }
        }
    }

    /// Records a child run's terminal outcome as its step's outcome and frees the slot.
    fn adopt(&mut self, out: &mut Vec<Effect>, id: CallId, row: RunRow, now: Millis) {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        out.push(Effect::Count {
            name: "reins_child_runs_finished_total",
            labels: vec![("status", row.status.as_str().to_owned())],
        });
        let mut extra = Vec::new();
        let outcome = if row.status == RunStatus::Success {
            // The output is kept as an immutable artifact version, like a captured file: a JSON
            // document, `null` when the run ended without one (an approved request).
            let content = row.output.as_ref().unwrap_or(&Value::Null).to_string();
            let version =
                self.next_artifact(&mut extra, &command.step_id, None, content.into_bytes());
            let mut resolved = json!({
                "output": row.output,
                "artifactVersion": version,
                "threadId": row.thread_id,
                "runId": row.run_id,
                "status": row.status,
            });
            // A person's answer to the agent's approval request, when it asked one.
            if let (Some(map), Some(answer)) =
                (resolved.as_object_mut(), row.metadata.get("hitl_answer"))
            {
                map.insert("approval".into(), answer.clone());
            }
            Outcome::Resolved(resolved)
        } else {
            Outcome::Rejected(json!({
                "message": row.error.clone().unwrap_or_else(|| format!("the agent run ended {}", row.status.as_str())),
                "status": row.status,
                "runId": row.run_id,
            }))
        };
        extra.push(WriteOp::ReleaseSlot {
            workflow_id: self.config.workflow_id.clone(),
            step_id: command.step_id,
        });
        let fields = self.child_fields(&row.run_id, &row.thread_id, &row.agent);
        out.push(Effect::Fault("result_before"));
        self.conclude(out, id, outcome, extra, fields, now);
    }

    /// Adds the write of the next artifact version to `ops` and returns its number. The counter
    /// moves only here; a write that fails stops the workflow, and recovery reads the true newest
    /// version from the store.
    fn next_artifact(
        &mut self,
        ops: &mut Vec<WriteOp>,
        source_step_id: &str,
        path: Option<String>,
        content: Vec<u8>,
    ) -> i64 {
        self.artifacts += 1;
        ops.push(WriteOp::PutArtifact {
            workflow_id: self.config.workflow_id.clone(),
            version: self.artifacts,
            source_step_id: source_step_id.to_owned(),
            path,
            sha256: sha256_hex(&content),
            content,
        });
        self.artifacts
    }

    /// Captures a file or reads an artifact; the answer concludes the call.
    fn local(&mut self, out: &mut Vec<Effect>, id: CallId) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        if command.kind == CallKind::CaptureArtifact {
            let source = command.args["sourceStepId"].as_str().unwrap_or_default();
            out.push(Effect::Capture {
                id,
                thread_id: thread_for(&self.config.workflow_id, source),
                path: command.args["path"].as_str().unwrap_or_default().to_owned(),
                source_step_id: source.to_owned(),
            });
        } else {
            let version = command.args["artifactVersion"].as_i64().unwrap_or(0);
            out.push(Effect::ReadArtifact { id, version });
        }
    }

    fn on_captured(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        result: Result<(String, Vec<u8>), String>,
        now: Millis,
    ) {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        let mut extra = Vec::new();
        let outcome = match result {
            Ok((path, content)) => {
                out.push(Effect::Fault("capture"));
                let (bytes, sha256) = (content.len(), sha256_hex(&content));
                let version = self.next_artifact(&mut extra, &command.step_id, Some(path), content);
                Outcome::Resolved(
                    json!({"artifactVersion": version, "bytes": bytes, "sha256": sha256}),
                )
            }
            Err(message) => Outcome::Rejected(json!({"message": message, "status": "error"})),
        };
        self.capturing = true;
        self.conclude(out, id, outcome, extra, json!({}), now);
        out.push(Effect::Then(Then::CaptureConcluded));
    }

    fn on_artifact(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        version: i64,
        result: Result<Option<Vec<u8>>, store::Error>,
        now: Millis,
    ) {
        let outcome = match result {
            Ok(Some(content)) => Outcome::Resolved(artifact_content(content)),
            Ok(None) => Outcome::Rejected(json!({
                "message": format!("artifact version {version} does not exist"),
                "status": "error",
            })),
            Err(error) if error.is_transient() => {
                self.read_tries += 1;
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::Local { id },
                });
                return;
            }
            Err(error) => {
                tracing::error!(parent: &self.span, %error, "reading an artifact failed");
                self.halt(out, true);
                return;
            }
        };
        self.conclude(out, id, outcome, Vec::new(), json!({}), now);
    }

    /// Ends this owner's part: the workflow waits for an operator, with `why` recorded in its
    /// data (`reconciliation`), logged and counted once that write commits (a node whose lease
    /// is gone is refused it, and has sent nothing to `needs_reconciliation`).
    fn reconcile_needed(&mut self, out: &mut Vec<Effect>, why: Reconciliation, now: Millis) {
        let mut data = self.config.document.data.clone();
        data["reconciliation"] = json!({
            "reason": why.reason.as_str(),
            "message": why.message,
            "step_id": why.step_id,
            "run_id": why.run_id.as_ref().map_or("", RunId::as_str),
            "at_ms": now,
        });
        // Its slots stay held; its lease is given back in the same write, so an operator's
        // reconcile can take the workflow at once.
        let op = self.set_workflow(WorkflowStatus::NeedsReconciliation, data);
        self.unwritten.events.push(Journaled::Ended {
            status: WorkflowStatus::NeedsReconciliation,
            reconciliation: Some(why),
        });
        self.write(out, vec![op, WriteOp::ReleaseLease]);
        self.halt(out, false);
    }

    fn on_controls(
        &mut self,
        out: &mut Vec<Effect>,
        purpose: ControlsFor,
        result: Result<Vec<ControlRow>, store::Error>,
        now: Millis,
    ) {
        let controls = match (purpose, result) {
            (_, Ok(controls)) => controls,
            (ControlsFor::Poll, Err(error)) => {
                // The node's poller asks again while the control is pending.
                tracing::warn!(parent: &self.span, %error, "reading controls failed");
                return;
            }
            (ControlsFor::DeadOwnerCancel, Err(error)) => {
                tracing::error!(parent: &self.span, %error, "cannot read the controls");
                self.halt(out, true);
                return;
            }
        };
        let cancel = controls
            .iter()
            .find(|c| ControlKind::parse(&c.kind) == Some(ControlKind::Cancel) && !c.applied);
        match (purpose, cancel) {
            (ControlsFor::DeadOwnerCancel, None) => self.halt(out, true),
            (_, Some(cancel)) => self.begin_cancel(out, cancel.id),
            (ControlsFor::Poll, None) => {
                let wanted = self
                    .waiting
                    .iter()
                    .filter_map(|(id, (waiting, command))| match waiting {
                        Waiting::Control(kind) => Some((*id, *kind, command.step_id.clone())),
                        _ => None,
                    })
                    .collect();
                self.apply_controls(out, controls, wanted, now);
            }
        }
    }

    /// Concludes the next call a control answers; the rest resume after its activation.
    fn apply_controls(
        &mut self,
        out: &mut Vec<Effect>,
        controls: Vec<ControlRow>,
        mut wanted: VecDeque<(CallId, ControlKind, String)>,
        now: Millis,
    ) {
        while let Some((id, kind, step_id)) = wanted.pop_front() {
            let Some(control) = controls.iter().find(|c| {
                !c.applied
                    && ControlKind::parse(&c.kind) == Some(kind)
                    && c.step_id == step_id
                    && c.attempt == 1
            }) else {
                continue;
            };
            let outcome = match kind {
                ControlKind::Resume => {
                    Outcome::Resolved(control.body.get("input").cloned().unwrap_or(Value::Null))
                }
                _ => Outcome::Resolved(json!({
                    "decision": control.body["decision"],
                    "decidedBy": control.created_by,
                    "decidedAt": now,
                    "comment": control.body.get("comment"),
                })),
            };
            let applied = WriteOp::MarkControlApplied {
                control_id: control.id,
            };
            self.conclude(out, id, outcome, vec![applied], json!({}), now);
            out.push(Effect::Then(Then::Controls { controls, wanted }));
            return;
        }
    }

    /// A cancel request: stop the script, interrupt the child runs (durably), and end
    /// `cancelled` once every child has an outcome, or `needs_reconciliation` if one cannot be
    /// observed within the window.
    fn begin_cancel(&mut self, out: &mut Vec<Effect>, control_id: i64) {
        tracing::info!(parent: &self.span, "cancelling");
        self.phase = Phase::Cancelling { control_id };
        out.push(Effect::Park);
        let op = self.set_workflow(
            WorkflowStatus::Cancelling,
            self.config.document.data.clone(),
        );
        self.write(out, vec![op]);
        out.push(Effect::Fault("cancelling"));
        let children: Vec<RunId> = self
            .waiting
            .values()
            .filter_map(|(waiting, _)| match waiting {
                Waiting::Child(Some(run_id)) => Some(run_id.clone()),
                _ => None,
            })
            .collect();
        // Calls that have no child run yet are simply dropped; the children of calls the
        // script left behind were asked to stop already, and are waited for like the others.
        self.waiting
            .retain(|_, (waiting, _)| matches!(waiting, Waiting::Child(Some(_))));
        for (id, (run_id, command)) in std::mem::take(&mut self.detached) {
            if let Some(run_id) = run_id {
                self.waiting
                    .insert(id, (Waiting::Child(Some(run_id)), command));
            }
        }
        if !children.is_empty() {
            out.push(Effect::CancelChildren {
                run_ids: children,
                awaited: true,
            });
        }
        out.push(Effect::After {
            delay: Duration::from_millis(self.config.cancel_window_ms),
            event: Event::CancelDeadline,
        });
        out.push(Effect::After {
            delay: CHILD_CHECK,
            event: Event::CheckChildren,
        });
        self.end_cancel_if_quiet(out);
    }

    /// A cancellation asked of a workflow whose owner died: the children the journal shows
    /// running are asked to stop, and the cancellation proceeds from their rows. The script never
    /// runs.
    fn finish_cancel_of_dead_owner(
        &mut self,
        out: &mut Vec<Effect>,
        newest: &BTreeMap<u32, StepRow>,
    ) {
        for (seq, step) in newest {
            let (Some(entry), Some(run_id)) = (
                self.journal.iter().find(|e| e.seq == *seq).cloned(),
                step.data["run_id"].as_str(),
            ) else {
                continue;
            };
            if step.status != StepStatus::Running {
                continue;
            }
            let command = Command {
                id: CallId(*seq),
                seq: *seq,
                kind: entry.kind,
                step_id: entry.step_id,
                args: entry.args,
                in_flight_in_journal: true,
            };
            self.waiting.insert(
                CallId(*seq),
                (Waiting::Child(Some(RunId::new(run_id))), command),
            );
        }
        out.push(Effect::ReadControls(ControlsFor::DeadOwnerCancel));
    }

    /// Reads the rows of the children a cancellation waits for; an ended one is recorded.
    fn check_children(&mut self, out: &mut Vec<Effect>) {
        for (id, (waiting, _)) in &self.waiting {
            if let Waiting::Child(Some(run_id)) = waiting {
                out.push(Effect::ReadRun {
                    id: *id,
                    run_id: run_id.clone(),
                    purpose: RunReadFor::Cancelling,
                });
            }
        }
        out.push(Effect::After {
            delay: CHILD_CHECK,
            event: Event::CheckChildren,
        });
    }

    /// The cancellation's window closed with children still unobserved: a person decides.
    fn cancel_deadline(&mut self, out: &mut Vec<Effect>, now: Millis) {
        if !matches!(self.phase, Phase::Cancelling { .. }) || self.waiting.is_empty() {
            return;
        }
        let reason = ReconciliationReason::CancelWindowPassed;
        let why = self
            .waiting
            .values()
            .find_map(|(waiting, command)| match waiting {
                Waiting::Child(Some(run_id)) => {
                    Some(Reconciliation::of_step(reason, &command.step_id, run_id))
                }
                _ => None,
            })
            .unwrap_or(Reconciliation {
                reason,
                step_id: String::new(),
                run_id: None,
                message: reason.message().to_owned(),
            });
        self.reconcile_needed(out, why, now);
    }

    fn on_timeout_recorded(
        &mut self,
        out: &mut Vec<Effect>,
        recorded: Result<ControlWrite, store::Error>,
    ) {
        match recorded {
            Ok(ControlWrite::Recorded(row) | ControlWrite::Repeated(row)) => {
                self.begin_cancel(out, row.id);
            }
            // A cancel was asked for already (with another reason): the poll finds it.
            Err(store::Error::Conflict(_)) => {}
            Err(error) if error.is_transient() => {
                self.read_tries += 1;
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::TimedOut,
                });
            }
            Err(error) => {
                tracing::error!(parent: &self.span, %error, "cannot record the timeout");
                self.halt(out, true);
            }
        }
    }

    /// Ends the cancellation once no child run is outstanding.
    fn end_cancel_if_quiet(&mut self, out: &mut Vec<Effect>) {
        let Phase::Cancelling { control_id } = self.phase else {
            return;
        };
        if !self.waiting.is_empty() {
            return;
        }
        #[cfg(test)]
        if super::mutants::planted(super::mutants::Mutant::CancelNeverFinishes) {
            return;
        }
        let ops = vec![
            self.set_workflow(WorkflowStatus::Cancelled, self.config.document.data.clone()),
            WriteOp::MarkControlApplied { control_id },
            WriteOp::ReleaseSlots {
                workflow_id: self.config.workflow_id.clone(),
            },
            WriteOp::ReleaseLease,
        ];
        self.unwritten.events.push(Journaled::Ended {
            status: WorkflowStatus::Cancelled,
            reconciliation: None,
        });
        self.write(out, ops);
        self.halt(out, false);
    }

    /// A child run ended during a cancellation: record it, free its slot, and see whether the
    /// cancellation can end.
    fn child_ended_while_cancelling(&mut self, out: &mut Vec<Effect>, id: CallId, row: RunRow) {
        let Some((_, command)) = self.waiting.remove(&id) else {
            return;
        };
        let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
            return;
        };
        let mut fields = self.child_fields(&row.run_id, &row.thread_id, &row.agent);
        fields["run_status"] = json!(row.status);
        let ops = vec![
            self.step_op(&entry, StepStatus::Cancelled, fields),
            WriteOp::ReleaseSlot {
                workflow_id: self.config.workflow_id.clone(),
                step_id: command.step_id,
            },
        ];
        self.write(out, ops);
        self.end_cancel_if_quiet(out);
    }
}

/// The thread an agent step runs on: one per (workflow, step), a valid folder name whatever the
/// step id is.
pub(crate) fn thread_for(workflow_id: &WorkflowId, step_id: &str) -> String {
    let digest = Sha256::digest(step_id.as_bytes());
    let suffix: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{workflow_id}-{suffix}")
}

fn sha256_hex(content: &[u8]) -> String {
    Sha256::digest(content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An artifact's content as `readArtifact` returns it: text when it is UTF-8, base64 otherwise.
fn artifact_content(content: Vec<u8>) -> Value {
    match String::from_utf8(content) {
        Ok(text) => Value::String(text),
        Err(bytes) => {
            use base64::Engine;
            json!({
                "base64": base64::engine::general_purpose::STANDARD.encode(bytes.as_bytes()),
                "encoding": "base64",
            })
        }
    }
}

#[cfg(test)]
mod tests {
    //! Each transition family driven through the machine alone: no tokio, no database, no VM.
    //! `drive` plays the interpreter's part (depth first, nothing after a halt), answering each
    //! effect as the test says.

    use super::*;
    use store::Epoch;

    const WORKFLOW: &str = "wf-1";
    const STARTED_AT: Millis = 1_000_000;
    const NOW: Millis = STARTED_AT + 10;
    const TIMEOUT_MS: u64 = 60_000;

    fn machine(start: Start) -> WorkflowMachine {
        let data =
            json!({"script": "return 1", "args": {}, "seed": 7, "started_at_ms": STARTED_AT});
        let config = MachineConfig {
            workflow_id: WORKFLOW.into(),
            fence: Fence {
                resource_id: WORKFLOW.into(),
                owner: "node-a".into(),
                epoch: Epoch::new(3),
            },
            document: WorkflowDocument::from_data(&WORKFLOW.into(), data)
                .expect("a whole document"),
            agents: Arc::new(AgentRegistry::default()),
            limits: runtime::Limits::default(),
            slots_max: 4,
            slots_per_user_max: 2,
            log_events_max: 10,
            log_event_bytes_max: 1_000,
            cancel_window_ms: 2_000,
            timeout_ms: TIMEOUT_MS,
            start,
            wake_fallback: Duration::from_secs(5),
        };
        WorkflowMachine::new(config, tracing::Span::none())
    }

    fn call(seq: u32, kind: CallKind, step_id: &str, args: Value) -> (JournalEntry, Command) {
        let entry = JournalEntry {
            seq,
            kind,
            step_id: step_id.into(),
            args: args.clone(),
            outcome: None,
            settled_at_ms: None,
        };
        let command = Command {
            id: CallId(seq),
            seq,
            kind,
            step_id: step_id.into(),
            args,
            in_flight_in_journal: false,
        };
        (entry, command)
    }

    fn agent(seq: u32, step_id: &str) -> (JournalEntry, Command) {
        call(
            seq,
            CallKind::Agent,
            step_id,
            json!({"agentRef": "echo", "task": "t"}),
        )
    }

    fn activation(calls: Vec<(JournalEntry, Command)>, status: Status) -> Event {
        let (journal, commands) = calls.into_iter().unzip();
        Event::Activated {
            result: Ok(Activation {
                commands,
                cancels: Vec::new(),
                journal,
                status,
                logs: Vec::new(),
            }),
            run_id: "run-new".into(),
        }
    }

    fn run_row(run_id: &RunId, status: RunStatus) -> RunRow {
        RunRow {
            run_id: run_id.clone(),
            thread_id: thread_for(&WorkflowId::from(WORKFLOW), "a"),
            workflow: Some(WORKFLOW.into()),
            step_id: Some("a".into()),
            attempt: Some(1),
            agent: "echo".into(),
            status,
            owner_worker_id: None,
            lease_expires_at: None,
            cancel_action: None,
            error: None,
            output: Some(json!("hello")),
            idempotency_key: None,
            idempotency_request: None,
            metadata: json!({}),
            total_tokens: 0,
            message_count: 0,
            stop_reason: None,
            revision: 1,
            created_at: 0.0,
            updated_at: 0.0,
        }
    }

    fn control(id: i64, kind: ControlKind, step_id: &str, attempt: i32, body: Value) -> ControlRow {
        ControlRow {
            id,
            workflow_id: WORKFLOW.into(),
            kind: kind.as_str().into(),
            step_id: step_id.into(),
            attempt,
            body,
            created_by: Some("ann".into()),
            applied: false,
        }
    }

    fn op(op: &WriteOp) -> String {
        match op {
            WriteOp::SetWorkflow { status, .. } => format!("workflow {status}"),
            WriteOp::PutStep {
                step_id, status, ..
            } => format!("step {step_id} {status}"),
            WriteOp::MarkControlApplied { control_id } => format!("applied {control_id}"),
            WriteOp::PutArtifact { version, .. } => format!("artifact {version}"),
            WriteOp::CancelRuns { .. } => "cancel runs".into(),
            WriteOp::ReleaseSlot { step_id, .. } => format!("release slot {step_id}"),
            WriteOp::ReleaseSlots { .. } => "release slots".into(),
            WriteOp::PutLogs { lines, .. } => format!("logs {}", lines.len()),
            WriteOp::ReleaseLease => "release lease".into(),
            other => format!("{other:?}"),
        }
    }

    fn describe(effect: &Effect) -> String {
        match effect {
            Effect::ReadJournal => "read journal".into(),
            Effect::Activate { start, settles } => {
                let settles: Vec<&str> = settles
                    .iter()
                    .map(|settle| match settle.outcome {
                        Outcome::Resolved(_) => "resolved",
                        Outcome::Rejected(_) => "rejected",
                    })
                    .collect();
                let how = if start.is_some() { "start" } else { "loaded" };
                format!("activate {how} {settles:?}")
            }
            Effect::Write(ops) => {
                let ops: Vec<String> = ops.iter().map(op).collect();
                format!("write [{}]", ops.join(", "))
            }
            Effect::Admit { id, request } => {
                let carried = request.step.as_ref().map_or(0, |step| step.journal.len());
                format!("admit {} carrying {carried}", id.0)
            }
            Effect::FollowChild { id } => format!("follow {}", id.0),
            Effect::CancelChildren { run_ids, awaited } => {
                let run_ids: Vec<&str> = run_ids.iter().map(RunId::as_str).collect();
                format!("cancel child {} awaited={awaited}", run_ids.join(" "))
            }
            Effect::ReadRun { run_id, .. } => format!("read run {run_id}"),
            Effect::ReadControls(_) => "read controls".into(),
            Effect::PutControl(control) => format!("put control {}", control.kind),
            Effect::Capture { path, .. } => format!("capture {path}"),
            Effect::ReadArtifact { version, .. } => format!("read artifact {version}"),
            Effect::Post(event) => format!("post {event:?}"),
            Effect::After { delay, event } => format!("after {}ms {event:?}", delay.as_millis()),
            Effect::SlotWanted => "slot wanted".into(),
            Effect::Park => "park".into(),
            Effect::Count { name, .. } => format!("count {name}"),
            Effect::Fault(name) => format!("fault {name}"),
            Effect::RecordFault { name, .. } => format!("record {name}"),
            Effect::Sleep(delay) => format!("sleep {}ms", delay.as_millis()),
            Effect::Then(_) => "then".into(),
            Effect::Halt { abandoned: true } => "halt abandoned".into(),
            Effect::Halt { abandoned: false } => "halt ended".into(),
        }
    }

    /// Performs what `event` answers as the interpreter would: each write commits unless
    /// `answer` says otherwise, [`Effect::Then`] resumes, and nothing runs after a halt. Answers
    /// what was performed, described, and the effects themselves.
    fn drive_with(
        machine: &mut WorkflowMachine,
        event: Event,
        now: Millis,
        mut answer: impl FnMut(&Effect) -> Option<Event>,
    ) -> (Vec<String>, Vec<Effect>) {
        let mut queue: VecDeque<Effect> = machine.on(event, now).into();
        let (mut described, mut performed) = (Vec::new(), Vec::new());
        while let Some(effect) = queue.pop_front() {
            described.push(describe(&effect));
            let reply = match &effect {
                Effect::Then(then) => Some(Event::Then(then.clone())),
                effect => answer(effect)
                    .or_else(|| matches!(effect, Effect::Write(_)).then_some(Event::Written)),
            };
            let halts = matches!(effect, Effect::Halt { .. });
            performed.push(effect);
            if halts {
                break;
            }
            if let Some(reply) = reply {
                for effect in machine.on(reply, now).into_iter().rev() {
                    queue.push_front(effect);
                }
            }
        }
        (described, performed)
    }

    fn drive(machine: &mut WorkflowMachine, event: Event) -> Vec<String> {
        drive_with(machine, event, NOW, |_| None).0
    }

    /// The ops of every write performed.
    fn written(effects: &[Effect]) -> Vec<&WriteOp> {
        effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Write(ops) => Some(ops),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// A fresh machine whose script made one agent call `a` and whose child run `run-new` was
    /// admitted (the call's journal carried by the admission).
    fn admitted_agent() -> WorkflowMachine {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
        let started = Admission::Started(run_row(&RunId::from("run-new"), RunStatus::Running));
        let id = CallId(0);
        drive(
            &mut m,
            Event::Admission {
                id,
                result: started,
            },
        );
        m
    }

    #[test]
    fn control_kinds_read_back_from_their_stored_text() {
        for kind in [
            ControlKind::Resume,
            ControlKind::Decide,
            ControlKind::Cancel,
        ] {
            assert_eq!(ControlKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(ControlKind::parse("approve"), None);
    }

    #[test]
    fn a_workflow_hands_itself_over_at_a_clean_stop_only_with_no_child_in_flight() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        assert!(m.may_hand_over(), "nothing in flight yet");
        drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
        assert!(!m.may_hand_over(), "its admission is in flight");
        let started = Admission::Started(run_row(&RunId::from("run-new"), RunStatus::Running));
        drive(
            &mut m,
            Event::Admission {
                id: CallId(0),
                result: started,
            },
        );
        assert!(!m.may_hand_over(), "its child run is in flight");
    }

    #[test]
    fn a_launch_runs_its_lone_agent_call_through_one_admission_and_ends_in_one_write() {
        let mut m = machine(Start::Fresh);
        assert_eq!(drive(&mut m, Event::Begin), ["activate start []"]);
        let (described, effects) = drive_with(
            &mut m,
            activation(vec![agent(0, "a")], Status::Waiting),
            NOW,
            |_| None,
        );
        // Nothing is written: the call's entry rides its admission, under the fence, with the
        // run id the activation brought.
        assert_eq!(described, ["admit 0 carrying 1"]);
        let Some(Effect::Admit { request, .. }) = effects.first() else {
            panic!("an admission");
        };
        assert_eq!(request.run_id, Some(RunId::new("run-new")));
        assert_eq!(request.idempotency_key.as_deref(), Some("wf-1/a/1"));
        let step = request.step.as_ref().expect("a workflow step");
        assert_eq!(
            (step.fence.epoch, step.slots_max, step.slots_per_user_max),
            (Epoch::new(3), 4, 2)
        );
        assert_eq!(op(&step.journal[0]), "step a running");

        let started = Admission::Started(run_row(&RunId::from("run-new"), RunStatus::Running));
        let id = CallId(0);
        assert_eq!(
            drive(
                &mut m,
                Event::Admission {
                    id,
                    result: started
                }
            ),
            [
                "count reins_steps_started_total",
                "count reins_child_runs_started_total",
                "fault admission",
                "follow 0",
            ]
        );
        let ended = Event::ChildEnded {
            id,
            run_id: "run-new".into(),
            committed: Some(Box::new(run_row(
                &RunId::from("run-new"),
                RunStatus::Success,
            ))),
        };
        // The outcome is handed to the script first and journaled with the next write.
        assert_eq!(
            drive(&mut m, ended),
            [
                "count reins_child_runs_finished_total",
                "fault result_before",
                "activate loaded [\"resolved\"]",
            ]
        );
        let done = Event::Activated {
            result: Ok(Activation {
                commands: Vec::new(),
                cancels: Vec::new(),
                journal: Vec::new(),
                status: Status::Completed(json!(42)),
                logs: vec!["hi".into()],
            }),
            run_id: "unused".into(),
        };
        let (described, effects) = drive_with(&mut m, done, NOW, |_| None);
        assert_eq!(
            described,
            [
                "write [artifact 1, release slot a, step a completed, logs 1, workflow completed, \
                 cancel runs, release slots, release lease]",
                "count reins_steps_finished_total",
                "fault result",
                "count reins_workflows_finished_total",
                "halt ended",
            ]
        );
        let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().nth(4) else {
            panic!("the end");
        };
        assert_eq!(data["result"], json!(42));
        assert!(m.is_halted());
        assert!(
            m.on(Event::Poll, NOW).is_empty(),
            "a halted machine does nothing"
        );
    }

    #[test]
    fn a_replay_reads_the_journal_and_an_unreadable_one_goes_to_an_operator() {
        let step = |seq: i32, attempt: i32, data: Value| StepRow {
            seq,
            step_id: "a".into(),
            attempt,
            kind: "agent".into(),
            status: StepStatus::Running,
            data,
            created_at: 0.0,
        };
        let mut m = machine(Start::Replay);
        assert_eq!(drive(&mut m, Event::Begin), ["read journal"]);
        let outage = Event::JournalRead(Err(store::Error::Unavailable("down".into())));
        assert_eq!(drive(&mut m, outage), ["after 50ms Begin"]);
        let rows = vec![step(0, 2, json!({"args": {"agentRef": "echo"}}))];
        let (described, effects) =
            drive_with(&mut m, Event::JournalRead(Ok((5, rows))), NOW, |_| None);
        assert_eq!(described, ["activate start []"]);
        let Some(Effect::Activate {
            start: Some(start), ..
        }) = effects.first()
        else {
            panic!("a replay");
        };
        assert_eq!(start.options.journal.len(), 1);
        // The replayed call is admitted again under its newest attempt.
        let (_, effects) = drive_with(
            &mut m,
            Event::Activated {
                result: Ok(Activation {
                    commands: vec![agent(0, "a").1],
                    cancels: Vec::new(),
                    journal: Vec::new(),
                    status: Status::Waiting,
                    logs: Vec::new(),
                }),
                run_id: "unused".into(),
            },
            NOW,
            |_| None,
        );
        let Some(Effect::Admit { request, .. }) = effects.first() else {
            panic!("an admission");
        };
        assert_eq!(request.idempotency_key.as_deref(), Some("wf-1/a/2"));
        assert_eq!(request.run_id, None);

        let mut m = machine(Start::Replay);
        drive(&mut m, Event::Begin);
        let gap = vec![step(1, 1, json!({"args": {}}))];
        let (described, effects) =
            drive_with(&mut m, Event::JournalRead(Ok((0, gap))), NOW, |_| None);
        assert_eq!(
            described,
            [
                "write [workflow needs_reconciliation, release lease]",
                "count reins_workflows_finished_total",
                "count reins_reconciliations_needed_total",
                "halt ended",
            ]
        );
        let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
            panic!("the reconciliation");
        };
        assert_eq!(data["reconciliation"]["reason"], "journal_unreadable");
        assert_eq!(data["reconciliation"]["at_ms"], NOW);
    }

    #[test]
    fn an_agent_step_without_a_slot_journals_itself_queued_and_waits_for_a_cue() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
        let id = CallId(0);
        // The carried journal was not written: it is, with the call queued, and the slot is
        // asked for again at once (a slot freed meanwhile announced nobody waiting).
        assert_eq!(
            drive(
                &mut m,
                Event::Admission {
                    id,
                    result: Admission::Queued
                }
            ),
            [
                "write [step a queued]",
                "count reins_steps_started_total",
                "post SlotCheck(CallId(0))",
            ]
        );
        assert_eq!(drive(&mut m, Event::SlotCheck(id)), ["admit 0 carrying 0"]);
        assert_eq!(
            drive(
                &mut m,
                Event::Admission {
                    id,
                    result: Admission::Queued
                }
            ),
            ["slot wanted", "after 5000ms SlotCheck(CallId(0))"]
        );
        // The cue and the fallback: whichever comes first asks, the other finds nothing to do.
        assert_eq!(drive(&mut m, Event::SlotFreed), ["admit 0 carrying 0"]);
        assert!(drive(&mut m, Event::SlotCheck(id)).is_empty());
        let outage = Admission::Failed(Error::Store(store::Error::Unavailable("down".into())));
        assert_eq!(
            drive(&mut m, Event::Admission { id, result: outage }),
            ["after 50ms RetryAdmission(CallId(0))"]
        );
        let outage = Admission::Failed(Error::Store(store::Error::DiskFull("full".into())));
        assert_eq!(
            drive(&mut m, Event::Admission { id, result: outage }),
            ["after 100ms RetryAdmission(CallId(0))"]
        );
        let started = Admission::Started(run_row(&RunId::from("run-2"), RunStatus::Running));
        assert_eq!(
            drive(
                &mut m,
                Event::Admission {
                    id,
                    result: started
                }
            ),
            [
                "count reins_child_runs_started_total",
                "fault admission",
                "write [step a running]",
                "follow 0",
            ]
        );
    }

    #[test]
    fn a_refused_admission_fails_the_step_and_an_unknown_one_stops_the_owner() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
        let refused = Admission::Failed(Error::UnknownAgent {
            name: "echo".into(),
            known: String::new(),
        });
        let (described, effects) = drive_with(
            &mut m,
            Event::Admission {
                id: CallId(0),
                result: refused,
            },
            NOW,
            |_| None,
        );
        assert_eq!(
            described,
            [
                "write [step a queued]",
                "count reins_steps_started_total",
                "activate loaded [\"rejected\"]",
            ]
        );
        let Some(Effect::Activate { settles, .. }) = effects.last() else {
            panic!("an activation");
        };
        assert_eq!(settles[0].at_ms, NOW);
        // The step's failure is journaled with whatever the workflow writes next.
        let (described, _) = drive_with(
            &mut m,
            activation(Vec::new(), Status::Failed("boom".into())),
            NOW,
            |_| None,
        );
        assert_eq!(
            described[0],
            "write [step a failed, workflow failed, cancel runs, release slots, release lease]"
        );

        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(&mut m, activation(vec![agent(0, "a")], Status::Waiting));
        let unknown = Admission::Failed(Error::Store(store::Error::OutcomeUnknown("?".into())));
        let id = CallId(0);
        assert_eq!(
            drive(
                &mut m,
                Event::Admission {
                    id,
                    result: unknown
                }
            ),
            ["halt abandoned"],
            "recovery reads what the admission did; nothing is written"
        );
    }

    #[test]
    fn a_child_whose_end_nobody_recorded_goes_to_an_operator() {
        let mut m = admitted_agent();
        let id = CallId(0);
        let ended = Event::ChildEnded {
            id,
            run_id: "run-new".into(),
            committed: None,
        };
        assert_eq!(drive(&mut m, ended), ["read run run-new"]);
        let waiting = Event::RunRead {
            id,
            run_id: "run-new".into(),
            purpose: RunReadFor::Outcome,
            result: Ok(Some(run_row(
                &RunId::from("run-new"),
                RunStatus::WaitingForInput,
            ))),
        };
        assert_eq!(
            drive(&mut m, waiting),
            ["after 5000ms AnswerCheck(CallId(0))"]
        );
        assert_eq!(
            drive(&mut m, Event::InputChanged),
            ["post ChildEnded { id: CallId(0), run_id: \"run-new\", committed: None }"]
        );
        assert!(drive(&mut m, Event::AnswerCheck(id)).is_empty());
        let fenced = Event::RunRead {
            id,
            run_id: "run-new".into(),
            purpose: RunReadFor::Outcome,
            result: Ok(Some(run_row(&RunId::from("run-new"), RunStatus::Running))),
        };
        let (described, effects) = drive_with(&mut m, fenced, NOW, |_| None);
        assert_eq!(
            described,
            [
                "write [workflow needs_reconciliation, release lease]",
                "count reins_workflows_finished_total",
                "count reins_reconciliations_needed_total",
                "halt ended",
            ]
        );
        let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
            panic!("the reconciliation");
        };
        assert_eq!(data["reconciliation"]["reason"], "child_end_unrecorded");
        assert_eq!(data["reconciliation"]["step_id"], "a");
    }

    /// Issue 29 item 15: a node cut off from the database for longer than a lease found its
    /// child's end unrecorded, decided on `needs_reconciliation`, and counted it, although the
    /// database refused the write (its lease was gone). Only a committed end is counted.
    #[test]
    fn a_reconciliation_the_database_refused_is_not_counted() {
        let ended_unrecorded = || Event::RunRead {
            id: CallId(0),
            run_id: "run-new".into(),
            purpose: RunReadFor::Outcome,
            result: Ok(Some(run_row(&RunId::from("run-new"), RunStatus::Running))),
        };
        let refusals = [
            store::Error::LeaseLost {
                resource_id: "wf-1".into(),
                owner: "node-a".into(),
                epoch: store::Epoch::new(1),
            },
            store::Error::OutcomeUnknown("?".into()),
        ];
        for refusal in refusals {
            let mut m = admitted_agent();
            let (described, _) = drive_with(&mut m, ended_unrecorded(), NOW, |effect| {
                matches!(effect, Effect::Write(_)).then(|| Event::WriteFailed(refusal.clone()))
            });
            assert_eq!(
                described,
                [
                    "write [workflow needs_reconciliation, release lease]",
                    "halt abandoned"
                ],
                "{refusal}"
            );
        }
        // The same write committed, after an outage that wrote nothing, is counted once.
        let mut m = admitted_agent();
        let mut outage = true;
        let (described, _) = drive_with(&mut m, ended_unrecorded(), NOW, |effect| {
            let failed = matches!(effect, Effect::Write(_)) && std::mem::take(&mut outage);
            failed.then(|| Event::WriteFailed(store::Error::Unavailable("down".into())))
        });
        assert_eq!(
            described,
            [
                "write [workflow needs_reconciliation, release lease]",
                "sleep 50ms",
                "write [workflow needs_reconciliation, release lease]",
                "count reins_workflows_finished_total",
                "count reins_reconciliations_needed_total",
                "halt ended",
            ]
        );
    }

    #[test]
    fn a_pause_parks_the_workflow_and_its_resume_wakes_it_with_the_input() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let pause = call(0, CallKind::Pause, "p", json!({}));
        assert_eq!(
            drive(&mut m, activation(vec![pause], Status::Waiting)),
            [
                "write [step p running]",
                "count reins_steps_started_total",
                "park",
                "write [workflow paused]",
            ]
        );
        assert_eq!(drive(&mut m, Event::Poll), ["read controls"]);
        let unrelated = Event::Controls {
            purpose: ControlsFor::Poll,
            result: Ok(vec![
                control(6, ControlKind::Resume, "other", 1, json!({})),
                control(
                    8,
                    ControlKind::Decide,
                    "p",
                    1,
                    json!({"decision": "approve"}),
                ),
            ]),
        };
        assert!(drive(&mut m, unrelated).is_empty());
        let resume = Event::Controls {
            purpose: ControlsFor::Poll,
            result: Ok(vec![control(
                7,
                ControlKind::Resume,
                "p",
                1,
                json!({"input": {"x": 1}}),
            )]),
        };
        let (described, effects) = drive_with(&mut m, resume, NOW, |_| None);
        // Parked: the VM starts again from the journal, which now holds the outcome.
        assert_eq!(
            described,
            [
                "write [applied 7, step p completed, workflow running]",
                "count reins_steps_finished_total",
                "activate start []",
                "then",
            ]
        );
        let Some(Effect::Activate {
            start: Some(start), ..
        }) = effects.get(2)
        else {
            panic!("a start");
        };
        assert_eq!(
            start.options.journal[0].outcome,
            Some(Outcome::Resolved(json!({"x": 1})))
        );
    }

    #[test]
    fn a_checkpoint_waits_for_approval_and_takes_the_decision_made_for_it() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let checkpoint = call(
            0,
            CallKind::HumanCheckpoint,
            "c",
            json!({"artifactVersion": 1}),
        );
        let pause = call(1, CallKind::Pause, "p", json!({}));
        assert_eq!(
            drive(&mut m, activation(vec![checkpoint, pause], Status::Waiting)),
            [
                "write [step c running, step p running]",
                "count reins_steps_started_total",
                "count reins_steps_started_total",
                "park",
                "write [workflow waiting_approval]",
            ]
        );
        // Two answers in one poll: each is applied after the activation of the one before.
        let decided = Event::Controls {
            purpose: ControlsFor::Poll,
            result: Ok(vec![
                control(
                    9,
                    ControlKind::Decide,
                    "c",
                    2,
                    json!({"decision": "stale attempt"}),
                ),
                control(
                    10,
                    ControlKind::Decide,
                    "c",
                    1,
                    json!({"decision": "approve", "comment": "fine"}),
                ),
                control(11, ControlKind::Resume, "p", 1, json!({})),
            ]),
        };
        let later = NOW + 5;
        let mut activations = Vec::new();
        let (described, _) = drive_with(&mut m, decided, later, |effect| match effect {
            Effect::Activate { start, settles } => {
                activations.push((start.is_some(), settles.clone()));
                Some(activation(Vec::new(), Status::Waiting))
            }
            _ => None,
        });
        assert_eq!(
            described,
            [
                "write [applied 10, step c completed, workflow running]",
                "count reins_steps_finished_total",
                "fault approval",
                "activate start []",
                "park",
                "write [workflow paused]",
                "then",
                "write [applied 11, step p completed, workflow running]",
                "count reins_steps_finished_total",
                "activate start []",
                "then",
            ]
        );
        assert_eq!(activations.len(), 2);
        let decision = m.journal[0].outcome.clone();
        assert_eq!(
            decision,
            Some(Outcome::Resolved(json!({
                "decision": "approve",
                "decidedBy": "ann",
                "decidedAt": later,
                "comment": "fine",
            })))
        );
    }

    #[test]
    fn a_capture_becomes_the_next_artifact_version_or_fails_its_step() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let capture = call(
            0,
            CallKind::CaptureArtifact,
            "cap",
            json!({"sourceStepId": "a", "path": "out.txt"}),
        );
        assert_eq!(
            drive(&mut m, activation(vec![capture], Status::Waiting)),
            [
                "write [step cap running]",
                "count reins_steps_started_total",
                "post Local { id: CallId(0) }",
            ]
        );
        let id = CallId(0);
        let (_, effects) = drive_with(&mut m, Event::Local { id }, NOW, |_| None);
        let Some(Effect::Capture { thread_id, .. }) = effects.first() else {
            panic!("a capture");
        };
        assert_eq!(thread_id, &thread_for(&WorkflowId::from(WORKFLOW), "a"));
        let captured = Event::Captured {
            id,
            result: Ok(("out.txt".into(), b"hi".to_vec())),
        };
        let (described, effects) = drive_with(&mut m, captured, NOW, |_| None);
        assert_eq!(
            described,
            ["fault capture", "activate loaded [\"resolved\"]", "then"]
        );
        let Some(Effect::Activate { settles, .. }) = effects.get(1) else {
            panic!("an activation");
        };
        assert_eq!(
            settles[0].outcome,
            Outcome::Resolved(json!({
                "artifactVersion": 1,
                "bytes": 2,
                "sha256": "8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4",
            }))
        );

        // The next write fails: the capture's failure is recorded for the tests that hold it.
        let (described, _) = drive_with(
            &mut m,
            activation(Vec::new(), Status::Waiting),
            NOW,
            |effect| {
                matches!(effect, Effect::Write(_)).then(|| {
                    Event::WriteFailed(store::Error::LeaseLost {
                        resource_id: WORKFLOW.into(),
                        owner: "node-a".into(),
                        epoch: Epoch::new(3),
                    })
                })
            },
        );
        assert_eq!(
            described,
            ["write [artifact 1, step cap completed]", "halt abandoned"]
        );

        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let capture = call(
            0,
            CallKind::CaptureArtifact,
            "cap",
            json!({"sourceStepId": "a", "path": "gone"}),
        );
        drive(&mut m, activation(vec![capture], Status::Waiting));
        let missing = Event::Captured {
            id,
            result: Err("no file gone".into()),
        };
        let (_, effects) = drive_with(&mut m, missing, NOW, |_| None);
        let Some(Effect::Activate { settles, .. }) = effects.first() else {
            panic!("an activation");
        };
        assert_eq!(
            settles[0].outcome,
            Outcome::Rejected(json!({"message": "no file gone", "status": "error"}))
        );
        assert_eq!(m.artifacts, 0, "a failed capture makes no version");
    }

    #[test]
    fn a_capture_whose_step_write_fails_records_the_error_for_the_fault_tests() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let capture = call(
            0,
            CallKind::CaptureArtifact,
            "cap",
            json!({"sourceStepId": "a", "path": "out.txt"}),
        );
        drive(&mut m, activation(vec![capture], Status::Waiting));
        let captured = Event::Captured {
            id: CallId(0),
            result: Ok(("out.txt".into(), b"hi".to_vec())),
        };
        let lost = || {
            Event::WriteFailed(store::Error::LeaseLost {
                resource_id: WORKFLOW.into(),
                owner: "node-a".into(),
                epoch: Epoch::new(3),
            })
        };
        let (described, _) = drive_with(&mut m, captured, NOW, |effect| match effect {
            Effect::Activate { .. } => Some(activation(Vec::new(), Status::Waiting)),
            Effect::Write(_) => Some(lost()),
            _ => None,
        });
        assert_eq!(
            described,
            [
                "fault capture",
                "activate loaded [\"resolved\"]",
                "write [artifact 1, step cap completed]",
                "record capture_error",
                "halt abandoned",
            ]
        );
    }

    #[test]
    fn a_cancel_interrupts_the_live_children_and_ends_once_each_has_ended() {
        let mut m = admitted_agent();
        let cancel = Event::Controls {
            purpose: ControlsFor::Poll,
            result: Ok(vec![control(9, ControlKind::Cancel, "", 0, json!({}))]),
        };
        assert_eq!(
            drive(&mut m, cancel),
            [
                "park",
                "write [workflow cancelling]",
                "fault cancelling",
                "cancel child run-new awaited=true",
                "after 2000ms CancelDeadline",
                "after 250ms CheckChildren",
            ]
        );
        assert_eq!(m.phase, Phase::Cancelling { control_id: 9 });
        assert!(drive(&mut m, Event::Poll).is_empty());
        assert!(drive(&mut m, Event::TimedOut).is_empty());
        // A child's end is read, never taken from its node's word, while cancelling.
        let ended = Event::ChildEnded {
            id: CallId(0),
            run_id: "run-new".into(),
            committed: Some(Box::new(run_row(
                &RunId::from("run-new"),
                RunStatus::Success,
            ))),
        };
        assert_eq!(drive(&mut m, ended), ["read run run-new"]);
        assert_eq!(
            drive(&mut m, Event::CheckChildren),
            ["read run run-new", "after 250ms CheckChildren"]
        );
        let stopped = Event::RunRead {
            id: CallId(0),
            run_id: "run-new".into(),
            purpose: RunReadFor::Cancelling,
            result: Ok(Some(run_row(
                &RunId::from("run-new"),
                RunStatus::Interrupted,
            ))),
        };
        assert_eq!(
            drive(&mut m, stopped),
            [
                "write [step a cancelled, release slot a]",
                "write [workflow cancelled, applied 9, release slots, release lease]",
                "count reins_workflows_finished_total",
                "halt ended",
            ]
        );
    }

    #[test]
    fn a_cancel_whose_child_never_ends_goes_to_an_operator_when_its_window_closes() {
        let mut m = admitted_agent();
        let cancel = Event::Controls {
            purpose: ControlsFor::Poll,
            result: Ok(vec![control(9, ControlKind::Cancel, "", 0, json!({}))]),
        };
        drive(&mut m, cancel);
        let still = Event::RunRead {
            id: CallId(0),
            run_id: "run-new".into(),
            purpose: RunReadFor::Cancelling,
            result: Ok(Some(run_row(&RunId::from("run-new"), RunStatus::Running))),
        };
        assert!(drive(&mut m, still).is_empty());
        let (described, effects) = drive_with(&mut m, Event::CancelDeadline, NOW, |_| None);
        assert_eq!(
            described,
            [
                "write [workflow needs_reconciliation, release lease]",
                "count reins_workflows_finished_total",
                "count reins_reconciliations_needed_total",
                "halt ended",
            ]
        );
        let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
            panic!("the reconciliation");
        };
        assert_eq!(data["reconciliation"]["reason"], "cancel_window_passed");
        assert_eq!(data["reconciliation"]["run_id"], "run-new");
    }

    #[test]
    fn the_timeout_records_a_cancel_and_carries_it_out() {
        let mut m = admitted_agent();
        assert_eq!(drive(&mut m, Event::TimedOut), ["put control cancel"]);
        let outage = Event::TimeoutRecorded(Err(store::Error::Unavailable("down".into())));
        assert_eq!(drive(&mut m, outage), ["after 50ms TimedOut"]);
        let recorded = Event::TimeoutRecorded(Ok(ControlWrite::Recorded(control(
            12,
            ControlKind::Cancel,
            "",
            0,
            json!({"reason": "timeout"}),
        ))));
        assert_eq!(
            drive(&mut m, recorded)[..2],
            ["park", "write [workflow cancelling]"]
        );
        assert_eq!(m.phase, Phase::Cancelling { control_id: 12 });
    }

    #[test]
    fn a_write_that_wrote_nothing_is_retried_until_the_deadline_and_any_other_failure_stops() {
        let pause = || call(0, CallKind::Pause, "p", json!({}));
        let outage = || Event::WriteFailed(store::Error::Unavailable("down".into()));
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let mut failures = 2;
        let (described, _) = drive_with(
            &mut m,
            activation(vec![pause()], Status::Waiting),
            NOW,
            |effect| {
                (matches!(effect, Effect::Write(_)) && failures > 0).then(|| {
                    failures -= 1;
                    outage()
                })
            },
        );
        assert_eq!(
            described,
            [
                "write [step p running]",
                "sleep 50ms",
                "write [step p running]",
                "sleep 100ms",
                "write [step p running]",
                "count reins_steps_started_total",
                "park",
                "write [workflow paused]",
            ]
        );

        // Past the workflow's deadline an outage stops this owner; recovery decides.
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let late = STARTED_AT + i64::try_from(TIMEOUT_MS).expect("small");
        let (described, _) = drive_with(
            &mut m,
            activation(vec![pause()], Status::Waiting),
            late,
            |effect| matches!(effect, Effect::Write(_)).then(outage),
        );
        assert_eq!(described, ["write [step p running]", "halt abandoned"]);

        // An unknown outcome is never retried blindly, and nothing after it is performed.
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let (described, _) = drive_with(
            &mut m,
            activation(vec![pause()], Status::Waiting),
            NOW,
            |effect| {
                matches!(effect, Effect::Write(_))
                    .then(|| Event::WriteFailed(store::Error::OutcomeUnknown("?".into())))
            },
        );
        assert_eq!(described, ["write [step p running]", "halt abandoned"]);
        assert!(m.is_halted());

        // The end's own write failing leaves the workflow live for a takeover: the halt it
        // decided on as ended is never performed.
        let mut m = admitted_agent();
        let (described, _) = drive_with(
            &mut m,
            activation(Vec::new(), Status::Completed(json!(1))),
            NOW,
            |effect| {
                matches!(effect, Effect::Write(_))
                    .then(|| Event::WriteFailed(store::Error::OutcomeUnknown("?".into())))
            },
        );
        assert_eq!(
            described,
            [
                "write [workflow completed, cancel runs, release slots, release lease]",
                "halt abandoned",
            ]
        );
    }

    #[test]
    fn a_lost_lease_stops_the_workflow_with_nothing_written() {
        let mut m = admitted_agent();
        assert_eq!(drive(&mut m, Event::LeaseLost), ["halt abandoned"]);
        let ended = Event::ChildEnded {
            id: CallId(0),
            run_id: "run-new".into(),
            committed: Some(Box::new(run_row(
                &RunId::from("run-new"),
                RunStatus::Success,
            ))),
        };
        assert!(drive(&mut m, ended).is_empty());
        assert!(drive(&mut m, Event::TimedOut).is_empty());
    }

    #[test]
    fn a_dead_owners_cancel_waits_for_the_children_its_journal_shows_running() {
        let mut m = machine(Start::CancelOnly);
        drive(&mut m, Event::Begin);
        let running = StepRow {
            seq: 0,
            step_id: "a".into(),
            attempt: 1,
            kind: "agent".into(),
            status: StepStatus::Running,
            data: json!({"args": {"agentRef": "echo"}, "run_id": "run-old"}),
            created_at: 0.0,
        };
        assert_eq!(
            drive(&mut m, Event::JournalRead(Ok((0, vec![running])))),
            ["read controls"]
        );
        let cancel = Event::Controls {
            purpose: ControlsFor::DeadOwnerCancel,
            result: Ok(vec![control(4, ControlKind::Cancel, "", 0, json!({}))]),
        };
        let described = drive(&mut m, cancel);
        assert_eq!(described[3], "cancel child run-old awaited=true");
        assert_eq!(m.phase, Phase::Cancelling { control_id: 4 });

        let mut m = machine(Start::CancelOnly);
        drive(&mut m, Event::Begin);
        drive(&mut m, Event::JournalRead(Ok((0, Vec::new()))));
        let none = Event::Controls {
            purpose: ControlsFor::DeadOwnerCancel,
            result: Ok(Vec::new()),
        };
        assert_eq!(drive(&mut m, none), ["halt abandoned"]);
    }

    #[test]
    fn a_call_the_script_no_longer_awaits_has_its_child_stopped_and_journaled_cancelled() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        assert_eq!(
            drive(
                &mut m,
                activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting)
            ),
            [
                "write [step a queued, step b queued]",
                "count reins_steps_started_total",
                "count reins_steps_started_total",
                "admit 0 carrying 0",
                "admit 1 carrying 0",
            ]
        );
        let started = Admission::Started(run_row(&RunId::from("run-a"), RunStatus::Running));
        drive(
            &mut m,
            Event::Admission {
                id: CallId(0),
                result: started,
            },
        );
        let failed = Event::ChildEnded {
            id: CallId(0),
            run_id: "run-a".into(),
            committed: Some(Box::new(run_row(&RunId::from("run-a"), RunStatus::Error))),
        };
        assert_eq!(drive(&mut m, failed)[2], "activate loaded [\"rejected\"]");
        // The `parallel` failed: call 1, still waiting for its admission, is left behind.
        let left_behind = Event::Activated {
            result: Ok(Activation {
                commands: Vec::new(),
                cancels: vec![CallId(1)],
                journal: Vec::new(),
                status: Status::Waiting,
                logs: Vec::new(),
            }),
            run_id: "unused".into(),
        };
        assert_eq!(
            drive(&mut m, left_behind),
            [
                "write [release slot a, step a failed]",
                "count reins_steps_finished_total",
                "fault result",
            ]
        );
        let started = Admission::Started(run_row(&RunId::from("run-b"), RunStatus::Running));
        assert_eq!(
            drive(
                &mut m,
                Event::Admission {
                    id: CallId(1),
                    result: started,
                }
            ),
            ["cancel child run-b awaited=false", "follow 1"]
        );
        let ended = Event::ChildEnded {
            id: CallId(1),
            run_id: "run-b".into(),
            committed: None,
        };
        let (described, effects) = drive_with(&mut m, ended, NOW, |_| None);
        assert_eq!(described, ["write [step b cancelled, release slot b]"]);
        let Some(WriteOp::PutStep { data, .. }) = written(&effects).into_iter().next() else {
            panic!("the step");
        };
        assert_eq!(
            (&data["detached"], &data["run_id"]),
            (&json!(true), &json!("run-b"))
        );
    }

    /// Found by the simulation (seed 2000440 of `sim_store_fault_seeds`): the stop of a
    /// sibling a failed `parallel` left running went out before the failure that caused it was
    /// journaled; that write's answer was lost, and the replay found the sibling interrupted
    /// and the failure both in their rows, and settled the sibling's first.
    #[test]
    fn a_left_behind_sibling_is_stopped_only_after_the_failure_that_left_it_is_journaled() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(
            &mut m,
            activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting),
        );
        for (id, run_id) in [(0, "run-a"), (1, "run-b")] {
            let started = Admission::Started(run_row(&RunId::from(run_id), RunStatus::Running));
            drive(
                &mut m,
                Event::Admission {
                    id: CallId(id),
                    result: started,
                },
            );
        }
        let failed = Event::ChildEnded {
            id: CallId(0),
            run_id: "run-a".into(),
            committed: Some(Box::new(run_row(&RunId::from("run-a"), RunStatus::Error))),
        };
        drive(&mut m, failed);
        let left_behind = || Event::Activated {
            result: Ok(Activation {
                commands: Vec::new(),
                cancels: vec![CallId(1)],
                journal: Vec::new(),
                status: Status::Waiting,
                logs: Vec::new(),
            }),
            run_id: "unused".into(),
        };
        let mut late = m;
        assert_eq!(
            drive(&mut late, left_behind()),
            [
                "write [release slot a, step a failed]",
                "count reins_steps_finished_total",
                "fault result",
                "cancel child run-b awaited=false",
            ]
        );
        // The write fails for good: the workflow stops, and nobody asks run-b to stop: the
        // takeover replays the failure first and stops it then.
        let mut lost = machine(Start::Fresh);
        drive(&mut lost, Event::Begin);
        drive(
            &mut lost,
            activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting),
        );
        for (id, run_id) in [(0, "run-a"), (1, "run-b")] {
            let started = Admission::Started(run_row(&RunId::from(run_id), RunStatus::Running));
            drive(
                &mut lost,
                Event::Admission {
                    id: CallId(id),
                    result: started,
                },
            );
        }
        let failed = Event::ChildEnded {
            id: CallId(0),
            run_id: "run-a".into(),
            committed: Some(Box::new(run_row(&RunId::from("run-a"), RunStatus::Error))),
        };
        drive(&mut lost, failed);
        let (described, _) = drive_with(&mut lost, left_behind(), NOW, |effect| {
            matches!(effect, Effect::Write(_))
                .then(|| Event::WriteFailed(store::Error::OutcomeUnknown("?".into())))
        });
        assert!(
            !described
                .iter()
                .any(|effect| effect.starts_with("cancel child")),
            "{described:?}"
        );
        assert_eq!(described.last().map(String::as_str), Some("halt abandoned"));
    }

    #[test]
    fn a_replayed_step_whose_child_the_orphan_sweep_closed_goes_to_an_operator() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        drive(
            &mut m,
            activation(vec![agent(0, "a"), agent(1, "b")], Status::Waiting),
        );
        let mut orphan = run_row(&RunId::from("run-old"), RunStatus::Interrupted);
        orphan.stop_reason = Some("orphan_recovered".into());
        let (described, effects) = drive_with(
            &mut m,
            Event::Admission {
                id: CallId(0),
                result: Admission::Existing(orphan),
            },
            NOW,
            |_| None,
        );
        assert_eq!(
            described[..3],
            [
                "write [workflow needs_reconciliation, release lease]",
                "count reins_workflows_finished_total",
                "count reins_reconciliations_needed_total",
            ]
        );
        let Some(WriteOp::SetWorkflow { data, .. }) = written(&effects).into_iter().next() else {
            panic!("the reconciliation");
        };
        assert_eq!(data["reconciliation"]["reason"], "orphaned_child");
        assert_eq!(data["reconciliation"]["run_id"], "run-old");
    }

    #[test]
    fn a_read_artifact_call_answers_its_bytes_and_waits_out_an_outage() {
        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let read = call(
            0,
            CallKind::ReadArtifact,
            "read:0",
            json!({"artifactVersion": 3}),
        );
        drive(&mut m, activation(vec![read], Status::Waiting));
        let id = CallId(0);
        assert_eq!(drive(&mut m, Event::Local { id }), ["read artifact 3"]);
        let outage = Event::ArtifactRead {
            id,
            version: 3,
            result: Err(store::Error::Unavailable("down".into())),
        };
        assert_eq!(
            drive(&mut m, outage),
            ["after 50ms Local { id: CallId(0) }"]
        );
        let bytes = Event::ArtifactRead {
            id,
            version: 3,
            result: Ok(Some(vec![0xff, 0x00])),
        };
        let (_, effects) = drive_with(&mut m, bytes, NOW, |_| None);
        let Some(Effect::Activate { settles, .. }) = effects.first() else {
            panic!("an activation");
        };
        assert_eq!(
            settles[0].outcome,
            Outcome::Resolved(json!({"base64": "/wA=", "encoding": "base64"}))
        );

        let mut m = machine(Start::Fresh);
        drive(&mut m, Event::Begin);
        let read = call(
            0,
            CallKind::ReadArtifact,
            "read:0",
            json!({"artifactVersion": 3}),
        );
        drive(&mut m, activation(vec![read], Status::Waiting));
        let missing = Event::ArtifactRead {
            id,
            version: 3,
            result: Ok(None),
        };
        let (_, effects) = drive_with(&mut m, missing, NOW, |_| None);
        let Some(Effect::Activate { settles, .. }) = effects.first() else {
            panic!("an activation");
        };
        assert_eq!(
            settles[0].outcome,
            Outcome::Rejected(
                json!({"message": "artifact version 3 does not exist", "status": "error"})
            )
        );
    }

    /// A stored document its launch could not have written is a decoding error of the store
    /// (answered 500), never a bad request of whoever asked for the takeover (400).
    #[test]
    fn a_document_missing_a_field_is_a_stored_value_that_cannot_be_decoded() {
        let error = WorkflowDocument::from_data(&WORKFLOW.into(), json!({"args": {}, "seed": 1}))
            .expect_err("no script");
        match error {
            Error::Store(store::Error::Database(message)) => {
                assert!(
                    message.contains("wf-1") && message.contains("script"),
                    "{message}"
                );
            }
            other => panic!("expected a store decoding error, got {other:?}"),
        }
    }
}
