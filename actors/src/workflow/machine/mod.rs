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
    ControlKind, ControlRow, ControlWrite, Fence, NewControl, RetryWait, RunId, RunRow, SentEvent,
    StepCall, StepRecord, StepRow, StepStatus, WorkflowId, WorkflowStatus, WriteOp,
};

mod agent;
mod cancel;
mod capture;
mod checkpoint;
mod controls;
pub(crate) mod deadline;
mod dormant;
mod event;
mod pause;
mod read;
pub(crate) mod retry;
mod sleep;
mod storage;
mod timer;
pub(crate) mod transitions;

use self::deadline::ControlBy;
use super::invariants::Invariants;
use super::journal::{newest_attempts, step_kind, step_outcome};
use super::reconciliation::Reconciliation;
use super::unwritten::{Carried, Journaled, Unwritten};
use crate::Error;
use crate::agents::AgentRegistry;
use crate::backoff::store_backoff;
use crate::child_run::RunRequest;
use crate::js_pool::{Settle, StartSpec};

/// Milliseconds since the Unix epoch.
pub(crate) type Millis = i64;

/// How often a cancellation looks at the rows of the children it waits for (some may run on a
/// node that is gone, and only their rows will tell).
const CHILD_CHECK: Duration = Duration::from_millis(250);

/// A workflow's document, typed in the store (`store/src/workflow_doc.rs`, which documents its
/// stored keys); the supervisor runs what it records.
pub(crate) use store::WorkflowDoc as WorkflowDocument;

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
    /// The slots kept free for users other than one who holds their share already
    /// (`active_children_reserved`).
    pub slots_reserved: u64,
    /// The bytes one user's workflows store at most (`limits.user_stored_bytes_max`; 0: no
    /// quota): what the grants this workflow takes for its artifacts are checked against.
    pub stored_bytes_max: u64,
    /// `console.log` lines kept as events per workflow at most, and their bytes.
    pub log_events_max: u64,
    pub log_event_bytes_max: u64,
    /// How long a cancellation waits for its child runs to stop before it gives up on observing
    /// them (and the workflow needs reconciliation).
    pub cancel_window_ms: u64,
    /// The life limit of a workflow whose document records none ([`store::LifeLimit::Unrecorded`]:
    /// launched before launches recorded it): the node's `limits.timeout_seconds`, or a day, the
    /// default they were launched under, when the node sets none.
    pub timeout_ms: u64,
    /// How it begins: fresh from its launch, or by replaying what the journal holds.
    pub start: Start,
    /// How long a step waits for a cue (a freed slot, an answer) before it looks anyway.
    pub wake_fallback: Duration,
    /// How long a parked workflow waits before it goes dormant (`workflows.dormant_after_ms`;
    /// `None`: never): its supervisor stops and the store alone holds it (`dormant.rs`).
    pub dormant_after: Option<Duration>,
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
    /// An event of this name (`waitForEvent`).
    Event(String),
    /// Its durable timer, due at this time (an agent's next attempt).
    Timer(Millis),
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
    /// Hand the next of the events read to a wait, after the previous one's activation.
    Events(VecDeque<SentEvent>),
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
    /// A call's durable timer may be due.
    TimerDue(CallId),
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
    /// The workflow's untaken events, read as asked.
    EventsRead(Result<Vec<SentEvent>, store::Error>),
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
    /// A control the machine asked for (the timeout's cancel, a deadline's answer) was
    /// recorded (or not).
    ControlRecorded {
        by: ControlBy,
        result: Result<ControlWrite, store::Error>,
    },
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
    /// The workflow has been parked for `dormant_after` since park number `parked`: it may go
    /// dormant (`dormant.rs`).
    DormantCheck { parked: u64 },
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
    /// Read the workflow's oldest untaken events of each of `names`, `per_name` of each at
    /// most; answer [`Event::EventsRead`].
    ReadEvents { names: Vec<String>, per_name: u32 },
    /// Record a control; answer [`Event::ControlRecorded`].
    PutControl { control: NewControl, by: ControlBy },
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
    /// The outcome whose artifact this write stores under a new grant, which the quota may
    /// refuse: it reaches the script once the write commits.
    storing: Option<storage::Storing>,
}

/// One workflow's rules (see the module documentation).
pub(crate) struct WorkflowMachine {
    config: MachineConfig,
    phase: Phase,
    /// The newest artifact version of this workflow.
    artifacts: i64,
    /// The current attempt of each call, by sequence number (1 unless a reconcile or the
    /// call's retry policy retried it).
    attempts: BTreeMap<u32, i32>,
    /// The durable timer of each call whose current attempt its retry policy queued.
    retry_waits: BTreeMap<u32, RetryWait>,
    /// The time each call journaled for itself, by sequence number: a `sleep`'s due time, a
    /// wait's deadline.
    dues: BTreeMap<u32, Millis>,
    /// Events this owner took for its waits, written or not yet (a later wait of the same name
    /// takes the next one).
    taken_events: BTreeSet<i64>,
    /// When each agent call's first attempt began on this node (its `totalMs` counts from
    /// there; a later attempt's record carries it).
    first_attempts: BTreeMap<u32, Millis>,
    /// Calls whose run of unknown outcome (an idempotent agent's) is being closed before the
    /// next attempt.
    closing: BTreeSet<CallId>,
    /// Calls whose newest journaled attempt says its run was being closed (a takeover's read).
    closing_seqs: BTreeSet<u32>,
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
    /// Bytes of the grants this supervisor took that its artifacts have not used. It starts at
    /// none: what an earlier owner's grants hold is theirs, given back when the workflow ends.
    storage_room: i64,
    /// How often the VM was parked: a dormancy check armed at one park is void after a wake.
    parks: u64,
    /// The dormant write was handed out: the halt after it leaves the workflow dormant.
    dormant: bool,
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
            retry_waits: BTreeMap::new(),
            dues: BTreeMap::new(),
            taken_events: BTreeSet::new(),
            first_attempts: BTreeMap::new(),
            closing: BTreeSet::new(),
            closing_seqs: BTreeSet::new(),
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
            storage_room: 0,
            parks: 0,
            dormant: false,
            invariants: Invariants::default(),
            span,
        }
    }

    pub(crate) fn is_halted(&self) -> bool {
        self.phase == Phase::Halted
    }

    /// When the workflow's life limit (`timeout_seconds` from launch) passes, in epoch ms, if it
    /// has one.
    pub(crate) fn deadline_ms(&self) -> Option<Millis> {
        self.config.document.deadline_ms(self.config.timeout_ms)
    }

    /// Feeds one event; answers what to do, in order (see the module documentation).
    pub(crate) fn on(&mut self, event: Event, now: Millis) -> Vec<Effect> {
        let out = self.decide(event, now);
        if cfg!(debug_assertions) {
            for effect in &out {
                match effect {
                    Effect::Write(ops) => self.invariants.written(ops),
                    Effect::Admit { request, .. } => {
                        self.invariants.admitted(&self.config.fence, request);
                    }
                    _ => {}
                }
            }
        }
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
                Ok(activation) => self.apply(&mut out, activation, run_id, now),
                Err(message) => self.finish(&mut out, Err(message)),
            },
            Event::Written => {
                if let Some(written) = self.writes.pop_front() {
                    self.announce(&mut out, written.written.events);
                    if let Some(storing) = written.storing {
                        self.stored(&mut out, storing);
                    }
                }
            }
            Event::WriteFailed(error) => self.write_failed(&mut out, error, now),
            Event::Admission { id, result } => self.on_admission(&mut out, id, result, now),
            Event::RetryAdmission(id) => self.admit(&mut out, id, now),
            #[cfg(test)]
            Event::SlotCheck(_) | Event::SlotFreed
                if crate::workflow::mutants::planted(
                    crate::workflow::mutants::Mutant::QueuedCallNeverWoken,
                ) => {}
            Event::SlotCheck(id) => self.on_slot_check(&mut out, id, now),
            Event::SlotFreed => self.on_slot_freed(&mut out, now),
            Event::AnswerCheck(id) => self.on_answer_check(&mut out, id),
            Event::TimerDue(_) if cancelling => {}
            Event::TimerDue(id) => self.on_timer_due(&mut out, id, now),
            Event::InputChanged => self.on_input_changed(&mut out),
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
            Event::Poll => {
                out.push(Effect::ReadControls(ControlsFor::Poll));
                if let Some(read) = self.events_to_read() {
                    out.push(read);
                }
            }
            Event::Controls { purpose, result } => self.on_controls(&mut out, purpose, result, now),
            Event::EventsRead(_) if cancelling => {}
            Event::EventsRead(result) => self.on_events(&mut out, result, now),
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
                out.push(Effect::PutControl {
                    control: NewControl {
                        workflow_id: self.config.workflow_id.clone(),
                        kind: ControlKind::Cancel,
                        step_id: String::new(),
                        attempt: 0,
                        body: json!({"reason": "timeout"}),
                        created_by: None,
                    },
                    by: ControlBy::WorkflowTimeout,
                });
            }
            Event::ControlRecorded {
                by: ControlBy::WorkflowTimeout,
                result,
            } => self.on_timeout_recorded(&mut out, result),
            Event::ControlRecorded {
                by: ControlBy::Deadline(_),
                ..
            } if cancelling => {}
            Event::ControlRecorded {
                by: ControlBy::Deadline(id),
                result,
            } => self.on_deadline_recorded(&mut out, id, result),
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
            Event::Then(Then::Events(events)) => self.deliver_events(&mut out, events, now),
            Event::DormantCheck { parked } => self.on_dormant_check(&mut out, parked, now),
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

    /// The journal write of `entry` at `status`; `call` is what only its kind records (an
    /// agent's run), or `None` when there is nothing of the kind's own to record.
    fn step_op(&self, entry: &JournalEntry, status: StepStatus, call: Option<StepCall>) -> WriteOp {
        let record = StepRecord {
            call: call.unwrap_or_else(|| self.timed_call(entry)),
            args: entry.args.clone(),
            outcome: entry.outcome.clone().map(step_outcome),
            settled_at_ms: entry.settled_at_ms,
            reconciled: None,
        };
        WriteOp::PutStep {
            workflow_id: self.config.workflow_id.clone(),
            seq: i32::try_from(entry.seq).unwrap_or(i32::MAX),
            step_id: entry.step_id.clone(),
            attempt: self.attempt(entry.seq),
            status,
            record,
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
        if let Some(grant) = self.error_grant(&all) {
            // Before the end's return of what the grant holds unused, which must see it.
            let at = all
                .iter()
                .position(|op| matches!(op, WriteOp::ReturnStorage { .. }))
                .unwrap_or(all.len());
            all.insert(at, grant);
        }
        out.push(Effect::Write(all.clone()));
        self.writes.push_back(InFlight {
            written: Unwritten { ops: all, events },
            tries: 0,
            storing: None,
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
        if error.is_transient() && deadline_ms.is_none_or(|deadline| now < deadline) {
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
        if self.quota_refused(out, &error) {
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
                self.retry_waits = newest
                    .iter()
                    .filter_map(|(seq, step)| match step.record() {
                        Some(StepRecord {
                            call:
                                StepCall::Agent {
                                    retry: Some(wait), ..
                                },
                            ..
                        }) => Some((*seq, (**wait).clone())),
                        _ => None,
                    })
                    .collect();
                self.closing_seqs = newest
                    .iter()
                    .filter(|(_, step)| {
                        matches!(
                            step.record(),
                            Some(StepRecord {
                                call: StepCall::Agent { closing: true, .. },
                                ..
                            })
                        )
                    })
                    .map(|(seq, _)| *seq)
                    .collect();
                self.dues = newest
                    .iter()
                    .filter_map(|(seq, step)| match &step.record()?.call {
                        StepCall::Sleep {
                            due_at_ms: Some(due),
                        } => Some((*seq, *due)),
                        call => Some((*seq, call.deadline_at_ms()?)),
                    })
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

    fn apply(&mut self, out: &mut Vec<Effect>, activation: Activation, run_id: RunId, now: Millis) {
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
                .map(|entry| match entry.kind {
                    CallKind::Agent => self.step_op(entry, StepStatus::Queued, None),
                    CallKind::Sleep => {
                        // Its due time is fixed now, and journaled with the call.
                        let due_at_ms = sleep::due_at(entry, now);
                        self.dues.insert(entry.seq, due_at_ms);
                        let call = StepCall::Sleep {
                            due_at_ms: Some(due_at_ms),
                        };
                        self.step_op(entry, StepStatus::Running, Some(call))
                    }
                    _ => {
                        // A wait's deadline is fixed now, and journaled with the call.
                        let call = deadline::journaled_call(entry, now);
                        if let Some(deadline) = call.as_ref().and_then(StepCall::deadline_at_ms) {
                            self.dues.insert(entry.seq, deadline);
                        }
                        self.step_op(entry, StepStatus::Running, call)
                    }
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
            if self.waiting.contains_key(&command.id) {
                // A parked script's replay re-made a call this machine already carries out
                // (an attempt admitted while the script waited for a timer): it goes on as it
                // is, and its outcome settles into the replayed script.
                continue;
            }
            self.begin_command(out, command, now);
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
        let call = self.agent_call(&run_id, &thread_id, agent);
        let mut before = std::mem::take(&mut self.unwritten);
        // Written by the admission, not by `write`: the errors among it take their room here.
        if let Some(grant) = self.error_grant(&before.ops) {
            before.ops.push(grant);
        }
        before.events.push(Journaled::Started {
            step_id: entry.step_id.clone(),
            kind: entry.kind,
        });
        Some(Carried {
            call: command.id,
            run_id,
            before,
            running: self.step_op(entry, StepStatus::Running, Some(call)),
            queued: self.step_op(entry, StepStatus::Queued, None),
        })
    }

    /// A new call of the script: each kind begins in its own module.
    fn begin_command(&mut self, out: &mut Vec<Effect>, command: Command, now: Millis) {
        match command.kind {
            CallKind::Agent => self.begin_agent(out, command, now),
            CallKind::Pause => self.begin_pause(out, command, now),
            CallKind::HumanCheckpoint => self.begin_checkpoint(out, command, now),
            CallKind::CaptureArtifact => self.begin_capture(out, command),
            CallKind::ReadArtifact => self.begin_read(out, command),
            CallKind::Sleep => self.begin_sleep(out, command, now),
            CallKind::WaitForEvent => self.begin_wait_for_event(out, command, now),
        }
    }

    /// Carries out a call the node does itself, from the mailbox: a capture or a read.
    fn local(&self, out: &mut Vec<Effect>, id: CallId) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        match command.kind {
            CallKind::CaptureArtifact => self.capture(out, id, command),
            CallKind::ReadArtifact => self.read(out, id, command),
            // Only captures and reads post `Local`; the rest wait for others.
            CallKind::Agent
            | CallKind::Pause
            | CallKind::HumanCheckpoint
            | CallKind::Sleep
            | CallKind::WaitForEvent => {}
        }
    }

    /// Records an outcome (with `extra` ops in the same fenced write) and hands it to the script.
    fn conclude(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        outcome: Outcome,
        extra: Vec<WriteOp>,
        call: Option<StepCall>,
        now: Millis,
    ) {
        if matches!(self.phase, Phase::Cancelling { .. }) {
            return;
        }
        let Some(_) = self.waiting.remove(&id) else {
            return;
        };
        self.settle(out, id, outcome, extra, call, now);
    }

    /// Journals call `id`'s outcome with `extra` ops and hands it to the script, at once, or,
    /// when an artifact among `extra` needs a new grant of its owner's quota, once the write that
    /// takes it commits (see `storage.rs`).
    fn settle(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        outcome: Outcome,
        mut extra: Vec<WriteOp>,
        call: Option<StepCall>,
        now: Millis,
    ) {
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
        let grant = self.grant_for(&entry.step_id, &extra);
        // Kept only to journal the step's failure, should the quota refuse the grant.
        let storing_call = grant.as_ref().map(|_| call.clone());
        // Journaled with whatever the workflow writes next (see `unwritten`). The artifact the
        // outcome names goes first, so the step's `step_finished` event can give its size.
        let op = self.step_op(&entry, status, call);
        self.unwritten.ops.append(&mut extra);
        self.unwritten.ops.push(op);
        self.unwritten.events.push(Journaled::Finished {
            step_id: entry.step_id.clone(),
            kind: entry.kind,
            status,
        });
        match (grant, storing_call) {
            (Some(grant), Some(call)) => {
                self.store_then_hand_over(out, (id, outcome, call, now), grant);
            }
            _ => self.hand_over(out, id, outcome, now),
        }
    }

    /// Hands call `id`'s outcome to the script.
    fn hand_over(&mut self, out: &mut Vec<Effect>, id: CallId, outcome: Outcome, now: Millis) {
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

    /// While the script waits only for timers, events and people, its VM is dropped (it is
    /// replayed when one of them answers); its status stays what it is.
    fn park_if_only_waiting(&mut self, out: &mut Vec<Effect>) {
        let waits = || self.waiting.values().map(|(waiting, _)| waiting);
        let idle = waits().any(|waiting| matches!(waiting, Waiting::Timer(_) | Waiting::Event(_)))
            && waits().all(|waiting| {
                matches!(
                    waiting,
                    Waiting::Control(_) | Waiting::Timer(_) | Waiting::Event(_)
                )
            });
        if idle && self.loaded() {
            self.park(out);
        }
    }

    /// After an activation that left the script waiting: park it if only people (or timers)
    /// can wake it.
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
            self.park_if_only_waiting(out);
            return;
        }
        self.park(out);
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
        let op = self.set_workflow(status, self.config.document.encode());
        self.write(out, vec![op]);
        if let Phase::Live { status: stored, .. } = &mut self.phase {
            *stored = status;
        }
    }

    fn finish(&mut self, out: &mut Vec<Effect>, result: Result<Value, String>) {
        let mut document = self.config.document.clone();
        let status = match &result {
            Ok(value) => {
                document.result = Some(value.clone());
                WorkflowStatus::Completed
            }
            Err(message) => {
                document.error = Some(message.clone());
                WorkflowStatus::Failed
            }
        };
        let data = document.encode();
        self.unwritten.events.push(Journaled::Ended {
            status,
            reconciliation: None,
        });
        // The end, a durable stop request to every child run still live (a sibling a failed
        // step left running), every slot and the unused room of its grants given back and the
        // lease's release are one write.
        let workflow_id = self.config.workflow_id.clone();
        let ops = vec![
            self.set_workflow(status, data),
            WriteOp::CancelRuns {
                workflow_id: workflow_id.clone(),
            },
            WriteOp::ReleaseSlots {
                workflow_id: workflow_id.clone(),
            },
            WriteOp::ReturnStorage { workflow_id },
            WriteOp::ReleaseLease,
        ];
        #[cfg(test)]
        let ops: Vec<WriteOp> = {
            use crate::workflow::mutants::{Mutant, planted};
            let lease = planted(Mutant::LeaseKeptAfterTheEnd);
            let storage = planted(Mutant::StorageKeptAfterTheEnd);
            ops.into_iter()
                .filter(|op| match op {
                    WriteOp::ReleaseLease => !lease,
                    WriteOp::ReturnStorage { .. } => !storage,
                    _ => true,
                })
                .collect()
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

    /// Ends this owner's part: the workflow waits for an operator, with `why` recorded in its
    /// data (`reconciliation`), logged and counted once that write commits (a node whose lease
    /// is gone is refused it, and has sent nothing to `needs_reconciliation`).
    fn reconcile_needed(&mut self, out: &mut Vec<Effect>, why: Reconciliation, now: Millis) {
        let mut document = self.config.document.clone();
        document.reconciliation = Some(store::DocReconciliation {
            reason: Some(why.reason.as_str().to_owned()),
            message: Some(why.message.clone()),
            step_id: why.step_id.clone(),
            run_id: why.run_id.as_ref().map_or("", RunId::as_str).to_owned(),
            at_ms: Some(now),
        });
        let data = document.encode();
        // Its slots stay held; its lease is given back in the same write, so an operator's
        // reconcile can take the workflow at once, and so is the unused room of its grants
        // (whoever takes it over starts with none).
        let op = self.set_workflow(WorkflowStatus::NeedsReconciliation, data);
        self.unwritten.events.push(Journaled::Ended {
            status: WorkflowStatus::NeedsReconciliation,
            reconciliation: Some(why),
        });
        let give_back = WriteOp::ReturnStorage {
            workflow_id: self.config.workflow_id.clone(),
        };
        self.write(out, vec![op, give_back, WriteOp::ReleaseLease]);
        self.halt(out, false);
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
mod tests;
