//! The workflow supervisor: one actor per live workflow on its owner node. It drives the script
//! through the JS pool, and for each command the script issues it persists first (the journal
//! entry, under the workflow's fence), then acts: admits a child run for an `agent` step, waits for
//! a `resume` or `decide` control for `pause` and `humanCheckpoint`. Each outcome is persisted
//! (with the step's slot released or its control marked applied, in the same fenced write) before
//! the script sees it. A workflow that waits only for people parks: its VM is dropped, and waking
//! it replays the journal once. When the lease actor reports the lease lost, the supervisor stops
//! at once; any write already in flight is refused by the epoch check.
//!
//! The supervisor awaits its own fenced writes in its handler: a workflow's steps are sequential
//! by nature, every write is bounded by the store call timeout, and a stale write is refused by
//! the database whatever the mailbox holds.

use crate::mailbox::{Post, Timer};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use runtime::{CallId, CallKind, Command, JournalEntry, Outcome, Status, VmOptions};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use store::{Fence, RunRow, RunStatus, WorkflowStep, WriteOp};
use tokio::time::Instant;

use crate::Error;
use crate::child_agent::RunEnd;
use crate::child_runs::{Admitted, RunRequest, RunsHandle};
use crate::js_pool::{Activated, JsPool, Settle, StartSpec};
use crate::lease_actor::{LeaseEvent, LeaseKind, LeaseMsg};
use crate::store_actor::StoreHandle;
use crate::unwritten::{Carried, Journaled, Unwritten};

/// How often a cancellation looks at the rows of the children it waits for (some may run on a
/// node that is gone, and only their rows will tell).
const CHILD_CHECK: Duration = Duration::from_millis(250);
/// The stop reason of a supervisor that left its workflow live (see `WorkflowState::stop`).
pub(crate) const ABANDONED: &str = "abandoned";

/// The first wait before asking the store again after it proved it wrote nothing (the database
/// was unreachable); each further try waits twice as long, up to [`STORE_RETRY_MAX`].
const STORE_RETRY_FIRST: Duration = Duration::from_millis(50);
const STORE_RETRY_MAX: Duration = Duration::from_secs(2);

/// The wait before try `attempt` (1 for the first retry) of a store call that wrote nothing.
pub(crate) fn store_backoff(attempt: u32) -> Duration {
    STORE_RETRY_FIRST
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(10))
        .min(STORE_RETRY_MAX)
}

/// Why a workflow needs an operator's reconcile: each reason is a fact about one child run that
/// this node cannot settle without guessing at the agent's real effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReconciliationReason {
    /// The orphan sweep closed the step's child run after its node died.
    OrphanedChild,
    /// The step's child run exists with no outcome (it may still run on a node that is gone).
    ChildOutcomeUnknown,
    /// The child run ended without its node recording the end (fenced, or its answer lost).
    ChildEndUnrecorded,
    /// A cancellation could not observe a child's end within its window (`2 × lease`).
    CancelWindowPassed,
    /// A row of the journal cannot be read, or a call is missing from it: replaying around it
    /// would put every later call on the wrong outcome.
    JournalUnreadable,
}

impl ReconciliationReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReconciliationReason::OrphanedChild => "orphaned_child",
            ReconciliationReason::ChildOutcomeUnknown => "child_outcome_unknown",
            ReconciliationReason::ChildEndUnrecorded => "child_end_unrecorded",
            ReconciliationReason::CancelWindowPassed => "cancel_window_passed",
            ReconciliationReason::JournalUnreadable => "journal_unreadable",
        }
    }

    fn message(self) -> &'static str {
        match self {
            ReconciliationReason::OrphanedChild => {
                "the child run's node died and the orphan sweep closed it; what the agent did is unknown"
            }
            ReconciliationReason::ChildOutcomeUnknown => {
                "the child run has no outcome and may still run on a node that is gone"
            }
            ReconciliationReason::ChildEndUnrecorded => {
                "the child run ended without its node recording the end; its outcome is unknown"
            }
            ReconciliationReason::CancelWindowPassed => {
                "the cancellation could not observe the child run's end within its window"
            }
            ReconciliationReason::JournalUnreadable => {
                "a journal row cannot be read or is missing; the workflow is not replayed around it"
            }
        }
    }
}

/// What a workflow sent to `needs_reconciliation` records about why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reconciliation {
    reason: ReconciliationReason,
    step_id: String,
    run_id: String,
    /// The sentence recorded for people: the reason's own, or one naming what was found.
    message: String,
}

impl Reconciliation {
    fn of_step(reason: ReconciliationReason, step_id: &str, run_id: &str) -> Self {
        Reconciliation {
            reason,
            step_id: step_id.to_owned(),
            run_id: run_id.to_owned(),
            message: reason.message().to_owned(),
        }
    }

    fn of_journal(unreadable: &UnreadableJournal) -> Self {
        Reconciliation {
            reason: ReconciliationReason::JournalUnreadable,
            step_id: unreadable.step_id.clone(),
            run_id: String::new(),
            message: format!(
                "{}: {unreadable}",
                ReconciliationReason::JournalUnreadable.message()
            ),
        }
    }
}

/// Messages of a workflow supervisor.
pub enum WorkflowMsg {
    /// Start (or replay) the script.
    Begin,
    Lease(LeaseEvent),
    /// A child-run admission answered.
    Admission {
        id: CallId,
        result: Box<Result<Admitted, Error>>,
    },
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
        run_id: String,
        /// The run as this node's own compare-and-set ended it (no need to read it back);
        /// `None` when another node's word, or none, decides.
        committed: Option<Box<RunRow>>,
    },
    /// Look for controls (the node's poller found some pending for this workflow).
    Poll,
    /// Carry out a call that needs no other actor (capture or read an artifact).
    Local {
        id: CallId,
    },
    /// The cancellation's window closed.
    CancelDeadline,
    /// The workflow's wall-clock limit passed.
    TimedOut,
    /// Look at the rows of the child runs a cancellation waits for.
    CheckChildren,
    /// Stop and give the lease up now (an operator's `fence`, or the node's clean stop);
    /// answers the epoch given up.
    GiveUp {
        shutdown: bool,
        reply: ractor::RpcReplyPort<Result<i64, Error>>,
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
    pub(crate) fn from_data(data: Value) -> Result<Self, Error> {
        let missing = |field: &str| Error::InvalidRequest(format!("workflow data has no {field}"));
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

pub(crate) struct WorkflowSupervisor;

pub(crate) struct WorkflowArgs {
    pub workflow_id: String,
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
    pub slots_max: u64,
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
    /// The workflows actor, told when a step waits for a slot (it hands out the cues).
    pub workflows: ActorRef<crate::workflows::WorkflowsMsg>,
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

/// What an outstanding call waits for.
#[derive(Debug, Clone, PartialEq)]
enum Waiting {
    /// A slot, to admit its child run.
    Slot,
    /// Its child run (the run id once admitted).
    Child(Option<String>),
    /// A control of this kind (`resume`, `decide`).
    Control(&'static str),
}

pub(crate) struct WorkflowState {
    args: WorkflowArgs,
    /// The newest artifact version of this workflow.
    artifacts: i64,
    /// The current attempt of each call, by sequence number (1 unless a reconcile retried it).
    attempts: BTreeMap<u32, i32>,
    journal: Vec<JournalEntry>,
    waiting: BTreeMap<CallId, (Waiting, Command)>,
    /// The VM is loaded in the JS pool (not parked).
    loaded: bool,
    /// `console.log` bytes the script logged on this node (bounded per workflow, across parks).
    logged_bytes: u64,
    status: &'static str,
    done: bool,
    /// A cancellation in progress: the control to mark applied when it ends.
    cancelling: Option<i64>,
    /// What the last failed journal write failed with (fault records for tests).
    last_write_error: Option<store::Error>,
    /// Journal writes decided on and not yet committed; the next write carries them.
    unwritten: Unwritten,
    /// The unwritten journal an admission in flight carries.
    carried: Option<Carried>,
    /// Calls the script no longer awaits whose admission or child run is still on its way
    /// (with the child's run id once known): they end as `cancelled`, never as outcomes.
    detached: BTreeMap<CallId, (Option<String>, Command)>,
    /// How often each call's admission wrote nothing in a row (its backoff).
    admission_tries: BTreeMap<CallId, u32>,
    /// Calls refused for want of a slot, not asked again yet: a cue or the fallback asks once.
    slot_waits: std::collections::BTreeSet<CallId>,
    /// Children whose run waits for a person's answer, by call, with their run id, not read
    /// again yet: a cue or the fallback reads each once.
    answer_waits: BTreeMap<CallId, String>,
    /// How many reads found the database unavailable or its disk full (the next retry's backoff).
    read_tries: u32,
    span: tracing::Span,
    /// The `timeout_seconds` timer, cancelled with this state: it would hold the stopped
    /// actor's cell for a day (the default) after the workflow ended.
    _timeout: Timer<WorkflowMsg>,
}

/// When a workflow's wall-clock limit (`timeout_seconds` from launch) passes, in epoch ms.
fn deadline_ms(args: &WorkflowArgs) -> i64 {
    args.document
        .started_at_ms
        .saturating_add(i64::try_from(args.timeout_ms).unwrap_or(i64::MAX))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The thread an agent step runs on: one per (workflow, step), a valid folder name whatever the
/// step id is.
pub(crate) fn thread_for(workflow_id: &str, step_id: &str) -> String {
    let digest = Sha256::digest(step_id.as_bytes());
    let suffix: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{workflow_id}-{suffix}")
}

impl WorkflowState {
    /// Holds at a test fault point if one is armed here.
    async fn fault(&self, boundary: &str) {
        if let Some(faults) = &self.args.faults {
            faults.reach(boundary, &self.args.workflow_id).await;
        }
    }

    /// When the workflow's wall-clock limit (`timeout_seconds` from launch) passes, in epoch ms.
    fn deadline_ms(&self) -> i64 {
        deadline_ms(&self.args)
    }

    fn attempt(&self, seq: u32) -> i32 {
        self.attempts.get(&seq).copied().unwrap_or(1)
    }

    fn step_op(&self, entry: &JournalEntry, status: &str, extra: Value) -> WriteOp {
        let mut data = json!({
            "args": entry.args,
            "outcome": entry.outcome,
            "settled_at_ms": entry.settled_at_ms,
        });
        if let (Some(data), Some(extra)) = (data.as_object_mut(), extra.as_object()) {
            data.extend(extra.clone());
        }
        WriteOp::PutStep {
            workflow_id: self.args.workflow_id.clone(),
            seq: i32::try_from(entry.seq).unwrap_or(i32::MAX),
            step_id: entry.step_id.clone(),
            attempt: self.attempt(entry.seq),
            kind: entry.kind.as_str().to_owned(),
            status: status.to_owned(),
            data,
        }
    }

    /// A fenced write; a lost lease stops the workflow here.
    async fn write(&mut self, myself: &ActorRef<WorkflowMsg>, ops: Vec<WriteOp>) -> bool {
        let Unwritten {
            ops: mut all,
            events,
        } = std::mem::take(&mut self.unwritten);
        all.extend(ops);
        if all.is_empty() {
            return true;
        }
        let mut tries = 0;
        let written = loop {
            let written = self
                .args
                .store
                .fenced_write(&self.args.fence, all.clone())
                .await;
            match written {
                // The store proved nothing was written (the database is unreachable): an outage
                // costs this workflow time, never its outcome. The fence decides once the
                // database is back: if the lease lapsed meanwhile, the write is refused and
                // another node (or this one) recovers the workflow from its journal.
                Err(error) if error.is_transient() && now_ms() < self.deadline_ms() => {
                    tries += 1;
                    if tries == 1 {
                        tracing::warn!(parent: &self.span, %error,
                            "a journal write wrote nothing (database unavailable or its disk full); retrying");
                    }
                    tokio::time::sleep(store_backoff(tries)).await;
                }
                written => break written,
            }
        };
        if let Err(error) = &written {
            self.last_write_error = Some(error.clone());
        }
        match written {
            Ok(()) => {
                self.announce(events).await;
                true
            }
            Err(store::Error::LeaseLost { .. }) => {
                tracing::warn!(parent: &self.span, "lease lost: the workflow stops here");
                self.stop(myself);
                false
            }
            Err(error) => {
                // Unknown or failed: the journal may or may not hold the write, so the
                // workflow stops and recovery, reading the journal, decides.
                tracing::error!(parent: &self.span, %error, "a journal write failed; stopping");
                self.stop(myself);
                false
            }
        }
    }

    /// What a committed journal write made true: counted and logged once, here, and never by a
    /// replay (which journals nothing new).
    async fn announce(&self, events: Vec<Journaled>) {
        for event in events {
            match event {
                Journaled::Started { step_id, kind } => {
                    let kind = kind.as_str();
                    self.args
                        .metrics
                        .inc("reins_steps_started_total", &[("kind", kind)]);
                    tracing::info!(parent: &self.span, %step_id, kind, "step started");
                }
                Journaled::Finished {
                    step_id,
                    kind,
                    status,
                } => {
                    self.args.metrics.inc(
                        "reins_steps_finished_total",
                        &[("kind", kind.as_str()), ("outcome", status)],
                    );
                    tracing::info!(parent: &self.span, %step_id, kind = kind.as_str(), status,
                        "step finished");
                    match kind {
                        CallKind::Agent => self.fault("result").await,
                        CallKind::HumanCheckpoint => self.fault("approval").await,
                        _ => {}
                    }
                }
            }
        }
    }

    /// Stops supervising a workflow that is still live (the lease lost, a write whose outcome
    /// is unknown, a read that failed): the supervisor stops with [`ABANDONED`], and the node
    /// takes the workflow back by the usual takeover once its lease has run out, whatever the
    /// recovery mode (another node may win; the takeover decides).
    fn stop(&mut self, myself: &ActorRef<WorkflowMsg>) {
        self.halt(myself, Some(ABANDONED.to_owned()));
    }

    /// Stops after the workflow ended (its lease released in the same write) or was given up
    /// on an operator's word: nothing is to be taken back.
    fn end(&mut self, myself: &ActorRef<WorkflowMsg>) {
        self.halt(myself, None);
    }

    fn halt(&mut self, myself: &ActorRef<WorkflowMsg>, reason: Option<String>) {
        self.done = true;
        self.args.js.park(&self.args.workflow_id);
        let _ = self.args.lease.post(LeaseMsg::Untrack {
            run_id: self.args.workflow_id.clone(),
        });
        myself.stop(reason);
    }

    fn options(&self) -> VmOptions {
        VmOptions {
            limits: self.args.limits.clone(),
            seed: self.args.document.seed,
            started_at_ms: self.args.document.started_at_ms,
            journal: self.journal.clone(),
            logged_bytes: self.logged_bytes,
        }
    }

    /// Runs an activation: settles into a loaded VM, or starts (replays) a parked one, whose
    /// journal already holds the outcomes.
    async fn activate(&mut self, myself: &ActorRef<WorkflowMsg>, settles: Vec<Settle>) {
        let start = (!self.loaded).then(|| StartSpec {
            script: self.args.document.script.clone(),
            args: self.args.document.args.clone(),
            options: self.options(),
        });
        let settles = if self.loaded { settles } else { Vec::new() };
        match self
            .args
            .js
            .activate(&self.args.workflow_id, start, settles)
            .await
        {
            Ok(activated) => {
                self.loaded = true;
                self.apply(myself, activated).await;
            }
            Err(error) => self.finish(myself, Err(error.to_string())).await,
        }
    }

    async fn apply(&mut self, myself: &ActorRef<WorkflowMsg>, activated: Activated) {
        let activation = activated.activation;
        for line in &activation.logs {
            self.logged_bytes += line.len() as u64;
            tracing::info!(parent: &self.span, script_log = %line, "console.log");
        }
        if !activation.logs.is_empty() {
            // Kept as `log` events with whatever the workflow writes next, like an outcome.
            self.unwritten.ops.push(WriteOp::PutLogs {
                workflow_id: self.args.workflow_id.clone(),
                lines: activation.logs.clone(),
                events_max: i64::try_from(self.args.log_events_max).unwrap_or(i64::MAX),
                bytes_max: i64::try_from(self.args.log_event_bytes_max).unwrap_or(i64::MAX),
            });
        }
        if let Some(carried) = self.carry(&activation) {
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
                        "queued"
                    } else {
                        "running"
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
            if !self.write(myself, ops).await {
                return;
            }
            self.journal.extend(activation.journal);
        }
        for id in &activation.cancels {
            self.detach(*id);
        }
        for command in activation.commands {
            if activation.cancels.contains(&command.id) {
                // A replay re-made a call the script no longer awaits (a failed `parallel`
                // left it behind): nothing is begun for it. A child run it may have is asked
                // to stop, and its slot given back, by the workflow's end at the latest.
                continue;
            }
            self.begin_command(myself, command).await;
            if self.done {
                return;
            }
        }
        match activation.status {
            Status::Completed(result) => self.finish(myself, Ok(result)).await,
            Status::Failed(message) => self.finish(myself, Err(message)).await,
            Status::Waiting => {
                // Outcomes settled into a script that now waits on calls already journaled.
                if self.write(myself, Vec::new()).await {
                    self.settle_status(myself).await;
                }
            }
        }
    }

    /// The journal an activation can hand to its admission: when it made exactly one new call,
    /// an agent call, and the workflow waits for nothing else. (With other calls outstanding, a
    /// later write could commit before the admission and journal outcomes out of order.)
    fn carry(&mut self, activation: &runtime::Activation) -> Option<Carried> {
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
            || self.cancelling.is_some()
            || self.carried.is_some()
        {
            return None;
        }
        let run_id = crate::ids::new_id();
        let agent = entry.args["agentRef"].as_str().unwrap_or_default();
        let thread_id = thread_for(&self.args.workflow_id, &entry.step_id);
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
            running: self.step_op(entry, "running", fields),
            queued: self.step_op(entry, "queued", json!({})),
        })
    }

    async fn begin_command(&mut self, myself: &ActorRef<WorkflowMsg>, command: Command) {
        match command.kind {
            CallKind::Agent => {
                self.waiting
                    .insert(command.id, (Waiting::Slot, command.clone()));
                self.admit(myself, command.id);
            }
            CallKind::Pause => {
                self.waiting
                    .insert(command.id, (Waiting::Control("resume"), command));
            }
            CallKind::HumanCheckpoint => {
                self.waiting
                    .insert(command.id, (Waiting::Control("decide"), command));
            }
            CallKind::CaptureArtifact | CallKind::ReadArtifact => {
                let id = command.id;
                self.waiting.insert(id, (Waiting::Child(None), command));
                // Carried out from the mailbox, after this activation's commands are all begun.
                let _ = myself.post(WorkflowMsg::Local { id });
            }
        }
    }

    /// Asks for the child run of agent call `id` (idempotent: a replayed call finds its run).
    fn admit(&self, myself: &ActorRef<WorkflowMsg>, id: CallId) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        let carried = self.carried.as_ref().filter(|carried| carried.call == id);
        let request = RunRequest {
            thread_id: thread_for(&self.args.workflow_id, &command.step_id),
            agent: command.args["agentRef"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            task: command.args["task"].clone(),
            idempotency_key: Some(format!(
                "{}/{}/{}",
                self.args.workflow_id,
                command.step_id,
                self.attempt(command.seq)
            )),
            step: Some(WorkflowStep {
                workflow_id: self.args.workflow_id.clone(),
                step_id: command.step_id.clone(),
                attempt: self.attempt(command.seq),
                slots_max: self.args.slots_max,
                fence: self.args.fence.clone(),
                journal: carried.map_or_else(Vec::new, |carried| {
                    let mut journal = carried.before.ops.clone();
                    journal.push(carried.running.clone());
                    journal
                }),
            }),
            run_id: carried.map(|carried| carried.run_id.clone()),
        };
        let (runs, me) = (self.args.runs.clone(), myself.clone());
        let (faults, workflow_id) = (self.args.faults.clone(), self.args.workflow_id.clone());
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

    /// The script no longer awaits call `id` (a `parallel` it belongs to failed). A call still
    /// waiting for its admission or its child is kept apart from the script's calls: its child
    /// run is asked to stop, durably, and its end is journaled as `cancelled` with its slot
    /// given back; anything else is simply dropped.
    fn detach(&mut self, id: CallId) {
        match self.waiting.remove(&id) {
            Some((Waiting::Slot, command)) => {
                self.detached.insert(id, (None, command));
            }
            Some((Waiting::Child(Some(run_id)), command)) => {
                self.stop_child(&run_id);
                self.detached.insert(id, (Some(run_id), command));
            }
            _ => {}
        }
    }

    /// The child runs this workflow knows to be live: those the script waits for and those it
    /// left behind.
    fn live_children(&self) -> Vec<String> {
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

    /// Asks a child run to stop (durably; at once when it runs on this node), without waiting.
    fn stop_child(&self, run_id: &str) {
        let (runs, run_id, span) = (self.args.runs.clone(), run_id.to_owned(), self.span.clone());
        tokio::spawn(async move {
            if let Err(error) = runs.cancel(&run_id, store::CancelAction::Interrupt).await {
                // The workflow's end asks again, in its own write.
                tracing::warn!(parent: &span, %error, %run_id, "cancel request failed");
            }
        });
    }

    /// An admission answered for a detached call: a run it started is stopped at once and
    /// followed to its end; a run that exists from before is asked to stop (its slot is given
    /// back by the workflow's end).
    fn admitted_detached(
        &mut self,
        myself: &ActorRef<WorkflowMsg>,
        id: CallId,
        result: Result<Admitted, Error>,
    ) {
        let Some((_, command)) = self.detached.remove(&id) else {
            return;
        };
        match result {
            Ok(Admitted::Started { row, ended }) => {
                self.stop_child(&row.run_id);
                self.detached
                    .insert(id, (Some(row.run_id.clone()), command));
                let me = myself.clone();
                tokio::spawn(async move {
                    let _ = ended.await;
                    let _ = me.post(WorkflowMsg::ChildEnded {
                        id,
                        run_id: row.run_id,
                        committed: None,
                    });
                });
            }
            Ok(Admitted::Existing(row)) if !row.status.is_terminal() => {
                self.stop_child(&row.run_id);
            }
            _ => {}
        }
    }

    /// A detached call's child run ended: its step is journaled `cancelled` and its slot is
    /// given back.
    async fn detached_child_ended(
        &mut self,
        myself: &ActorRef<WorkflowMsg>,
        id: CallId,
        run_id: &str,
    ) {
        let Some((_, command)) = self.detached.remove(&id) else {
            return;
        };
        let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
            return;
        };
        let mut fields = self.child_fields(
            run_id,
            &thread_for(&self.args.workflow_id, &command.step_id),
            command.args["agentRef"].as_str().unwrap_or_default(),
        );
        fields["detached"] = json!(true);
        self.unwritten
            .ops
            .push(self.step_op(&entry, "cancelled", fields));
        self.unwritten.ops.push(WriteOp::ReleaseSlot {
            workflow_id: self.args.workflow_id.clone(),
            step_id: command.step_id,
        });
        self.write(myself, Vec::new()).await;
    }

    /// Records an outcome (with `extra` ops in the same fenced write) and hands it to the script.
    async fn conclude(
        &mut self,
        myself: &ActorRef<WorkflowMsg>,
        id: CallId,
        outcome: Outcome,
        mut extra: Vec<WriteOp>,
        fields: Value,
    ) {
        if self.cancelling.is_some() {
            return;
        }
        let Some(_) = self.waiting.remove(&id) else {
            return;
        };
        let at_ms = now_ms();
        let Some(entry) = self.journal.get_mut(id.0 as usize) else {
            return;
        };
        entry.outcome = Some(outcome.clone());
        entry.settled_at_ms = Some(at_ms);
        let entry = entry.clone();
        let status = match outcome {
            Outcome::Resolved(_) => "completed",
            Outcome::Rejected(_) => "failed",
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
        if !self.loaded {
            self.set_status(myself, "running").await;
        }
        self.activate(myself, vec![Settle { id, outcome, at_ms }])
            .await;
    }

    /// After an activation that left the script waiting: park it if only people can wake it.
    async fn settle_status(&mut self, myself: &ActorRef<WorkflowMsg>) {
        let humans: Vec<&'static str> = self
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
        self.args.js.park(&self.args.workflow_id);
        self.loaded = false;
        let status = if humans.contains(&"decide") {
            "waiting_approval"
        } else {
            "paused"
        };
        self.set_status(myself, status).await;
    }

    async fn set_status(&mut self, myself: &ActorRef<WorkflowMsg>, status: &'static str) {
        if self.status == status {
            return;
        }
        let op = WriteOp::SetWorkflow {
            workflow_id: self.args.workflow_id.clone(),
            status: status.to_owned(),
            data: self.args.document.data.clone(),
        };
        if self.write(myself, vec![op]).await {
            self.status = status;
        }
    }

    async fn finish(&mut self, myself: &ActorRef<WorkflowMsg>, result: Result<Value, String>) {
        let mut data = self.args.document.data.clone();
        let status = match &result {
            Ok(value) => {
                data["result"] = value.clone();
                "completed"
            }
            Err(message) => {
                data["error"] = json!(message);
                "failed"
            }
        };
        tracing::info!(parent: &self.span, status, "workflow finished");
        self.args
            .metrics
            .inc("reins_workflows_finished_total", &[("status", status)]);
        let op = WriteOp::SetWorkflow {
            workflow_id: self.args.workflow_id.clone(),
            status: status.to_owned(),
            data,
        };
        // The end, a durable stop request to every child run still live (a sibling a failed
        // step left running), every slot given back and the lease's release are one write.
        let workflow_id = self.args.workflow_id.clone();
        let ops = vec![
            op,
            WriteOp::CancelRuns {
                workflow_id: workflow_id.clone(),
            },
            WriteOp::ReleaseSlots { workflow_id },
            WriteOp::ReleaseLease,
        ];
        if self.write(myself, ops).await {
            for run_id in self.live_children() {
                self.stop_child(&run_id);
            }
            self.end(myself);
        }
    }

    async fn on_admission(
        &mut self,
        myself: &ActorRef<WorkflowMsg>,
        id: CallId,
        result: Result<Admitted, Error>,
    ) {
        if !matches!(&result, Err(Error::Store(error)) if error.is_transient()) {
            self.admission_tries.remove(&id);
        }
        let carried = self.carried.take_if(|carried| carried.call == id);
        let journaled = carried.is_some() && matches!(result, Ok(Admitted::Started { .. }));
        if let Err(
            error @ (Error::Store(store::Error::OutcomeUnknown(_))
            | Error::Unanswered { .. }
            | Error::Spawn { .. }),
        ) = &result
        {
            // The admission (and any journal it carried) may have committed, and a child run
            // may exist (unanswered, or admitted but never started): recovery reads which,
            // instead of a guess here.
            tracing::error!(parent: &self.span, %error, "an admission's outcome is unknown; stopping");
            self.stop(myself);
            return;
        }
        let mut ask_again_now = false;
        match (carried, &result) {
            (None, _) | (Some(_), Err(Error::Store(store::Error::LeaseLost { .. }))) => {}
            (Some(carried), Ok(Admitted::Started { .. })) => {
                self.announce(carried.before.events).await;
            }
            (Some(carried), _) => {
                // Not admitted: the journal it carried was not written; write it, with the
                // call as queued.
                let mut before = carried.before;
                before.ops.push(carried.queued);
                self.unwritten.restore(before);
                if !self.write(myself, Vec::new()).await {
                    return;
                }
                // A slot freed before the queued entry committed announced nobody waiting
                // (the cue is sent only while a step is queued): ask once more at once.
                ask_again_now = true;
            }
        }
        if self.detached.contains_key(&id) {
            self.admitted_detached(myself, id, result);
            return;
        }
        if self.cancelling.is_some() {
            // Admitted after the cancel began: stop it too, and wait for it like the others.
            if let Ok(Admitted::Started { row, ended }) = result {
                if let Some((_, command)) = self.waiting.get(&id).cloned() {
                    self.waiting
                        .insert(id, (Waiting::Child(Some(row.run_id.clone())), command));
                }
                let _ = self
                    .args
                    .runs
                    .cancel(&row.run_id, store::CancelAction::Interrupt)
                    .await;
                let (me, run_id) = (myself.clone(), row.run_id);
                tokio::spawn(async move {
                    let _ = ended.await;
                    let _ = me.post(WorkflowMsg::ChildEnded {
                        id,
                        run_id,
                        committed: None,
                    });
                });
            }
            return;
        }
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        match result {
            Ok(Admitted::Started { row, ended }) => {
                self.args.metrics.inc("reins_child_runs_started_total", &[]);
                tracing::info!(parent: &self.span, step_id = %command.step_id,
                    child_run_id = %row.run_id, "child run admitted");
                self.fault("admission").await;
                self.waiting.insert(
                    id,
                    (Waiting::Child(Some(row.run_id.clone())), command.clone()),
                );
                let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
                    return;
                };
                let fields = self.child_fields(&row.run_id, &row.thread_id, &row.agent);
                if !journaled
                    && !self
                        .write(myself, vec![self.step_op(&entry, "running", fields)])
                        .await
                {
                    return;
                }
                let me = myself.clone();
                tokio::spawn(async move {
                    // An end this node committed is known as committed; any other end (fenced,
                    // paused, answered, the actor gone) is read from the row, so the step's
                    // result is what a takeover would read.
                    let committed = match ended.await {
                        Ok(RunEnd::Persisted(outcome)) => {
                            Some(Box::new(ended_with(row.clone(), outcome)))
                        }
                        _ => None,
                    };
                    let _ = me.post(WorkflowMsg::ChildEnded {
                        id,
                        run_id: row.run_id,
                        committed,
                    });
                });
            }
            Ok(Admitted::Existing(row))
                if row.stop_reason.as_deref() == Some("orphan_recovered") =>
            {
                // Closed by the orphan sweep: the agent's real effects are unknown, and guessing
                // "failed" could make a retry run it twice. A person decides.
                let why = Reconciliation::of_step(
                    ReconciliationReason::OrphanedChild,
                    &command.step_id,
                    &row.run_id,
                );
                self.reconcile_needed(myself, why).await;
            }
            Ok(Admitted::Existing(row)) if row.status.is_terminal() => {
                self.waiting.insert(id, (Waiting::Child(None), command));
                self.adopt(myself, id, row).await;
            }
            Ok(Admitted::Existing(row)) if row.status == RunStatus::WaitingForInput => {
                // Its agent asked a person before this workflow changed hands: the answer (given
                // on any node) decides the run, so follow the row as the first owner did.
                let run_id = row.run_id;
                self.waiting
                    .insert(id, (Waiting::Child(Some(run_id.clone())), command));
                let _ = myself.post(WorkflowMsg::ChildEnded {
                    id,
                    run_id,
                    committed: None,
                });
            }
            Ok(Admitted::Existing(row)) => {
                // A child run exists for this step and has no outcome: it may still be running on
                // a node that is gone. Guessing would risk a second run, so a person decides.
                let why = Reconciliation::of_step(
                    ReconciliationReason::ChildOutcomeUnknown,
                    &command.step_id,
                    &row.run_id,
                );
                self.reconcile_needed(myself, why).await;
            }
            Ok(Admitted::Queued) if ask_again_now => {
                self.slot_waits.insert(id);
                let _ = myself.post(WorkflowMsg::SlotCheck(id));
            }
            Ok(Admitted::Queued) => {
                // Woken by a freed slot (the workflows actor hands the cues out), or by the
                // fallback, whichever comes first; the other then finds nothing to do.
                self.slot_waits.insert(id);
                let _ = self
                    .args
                    .workflows
                    .post(crate::workflows::WorkflowsMsg::SlotWanted(
                        self.args.workflow_id.clone(),
                    ));
                crate::mailbox::post_after(myself, self.args.wake_fallback, move || {
                    WorkflowMsg::SlotCheck(id)
                });
            }
            Err(Error::Store(error)) if error.is_transient() => {
                // Nothing was written: the database is unreachable. That is never the step's
                // failure; the admission is asked again (the idempotency key makes a repeat
                // find the same run) until the database answers or the workflow times out.
                let tries = self.admission_tries.entry(id).or_insert(0);
                *tries += 1;
                let wait = store_backoff(*tries);
                if wait == STORE_RETRY_FIRST {
                    tracing::warn!(parent: &self.span, step_id = %command.step_id, %error,
                        "an admission wrote nothing (database unavailable or its disk full); retrying");
                }
                crate::mailbox::post_after(myself, wait, move || WorkflowMsg::RetryAdmission(id));
            }
            Err(Error::Store(store::Error::LeaseLost { .. })) => {
                // Fenced at admission: no child run exists, and nothing more is ours to write.
                tracing::warn!(parent: &self.span, step_id = %command.step_id,
                    "admission refused: the lease is lost; the workflow stops here");
                self.stop(myself);
            }
            Err(error) => {
                let outcome =
                    Outcome::Rejected(json!({"message": error.to_string(), "status": "error"}));
                self.waiting.insert(id, (Waiting::Child(None), command));
                self.conclude(myself, id, outcome, Vec::new(), json!({}))
                    .await;
            }
        }
    }

    /// What an agent step's journal entry says about its child run: which run, on which thread,
    /// under which definition of its agent.
    fn child_fields(&self, run_id: &str, thread_id: &str, agent: &str) -> Value {
        let configuration_version = self
            .args
            .agents
            .get(agent)
            .map(|agent| agent.configuration_version.clone());
        json!({"run_id": run_id, "thread_id": thread_id,
               "configuration_version": configuration_version})
    }

    /// Records a child run's terminal outcome as its step's outcome and frees the slot.
    async fn adopt(&mut self, myself: &ActorRef<WorkflowMsg>, id: CallId, row: RunRow) {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        self.args.metrics.inc(
            "reins_child_runs_finished_total",
            &[("status", row.status.as_str())],
        );
        let mut extra = Vec::new();
        let outcome = if row.status == RunStatus::Success {
            // The output is kept as an immutable artifact version, like a captured file.
            let content = row
                .output
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default();
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
        let release = WriteOp::ReleaseSlot {
            workflow_id: self.args.workflow_id.clone(),
            step_id: command.step_id,
        };
        extra.push(release);
        let fields = self.child_fields(&row.run_id, &row.thread_id, &row.agent);
        self.fault("result_before").await;
        self.conclude(myself, id, outcome, extra, fields).await;
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
            workflow_id: self.args.workflow_id.clone(),
            version: self.artifacts,
            source_step_id: source_step_id.to_owned(),
            path,
            sha256: sha256_hex(&content),
            content,
        });
        self.artifacts
    }

    /// Captures a file or reads an artifact, and concludes the call.
    async fn local(&mut self, myself: &ActorRef<WorkflowMsg>, id: CallId) {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        let mut extra = Vec::new();
        let outcome = if command.kind == CallKind::CaptureArtifact {
            match self.read_capture(&command).await {
                Ok((path, content)) => {
                    self.fault("capture").await;
                    let (bytes, sha256) = (content.len(), sha256_hex(&content));
                    let version =
                        self.next_artifact(&mut extra, &command.step_id, Some(path), content);
                    Outcome::Resolved(
                        json!({"artifactVersion": version, "bytes": bytes, "sha256": sha256}),
                    )
                }
                Err(message) => Outcome::Rejected(json!({"message": message, "status": "error"})),
            }
        } else {
            let version = command.args["artifactVersion"].as_i64().unwrap_or(0);
            match self
                .args
                .store
                .read_artifact(&self.args.workflow_id, version)
                .await
            {
                Ok(Some(artifact)) => Outcome::Resolved(artifact_content(artifact.content)),
                Ok(None) => Outcome::Rejected(json!({
                    "message": format!("artifact version {version} does not exist"),
                    "status": "error",
                })),
                Err(error) if error.is_transient() => {
                    self.read_tries += 1;
                    let wait = store_backoff(self.read_tries);
                    crate::mailbox::post_after(myself, wait, move || WorkflowMsg::Local { id });
                    return;
                }
                Err(error) => {
                    tracing::error!(parent: &self.span, %error, "reading an artifact failed");
                    self.stop(myself);
                    return;
                }
            }
        };
        let capture = command.kind == CallKind::CaptureArtifact;
        self.conclude(myself, id, outcome, extra, json!({})).await;
        if let (true, true, Some(faults), Some(error)) = (
            capture,
            self.done,
            &self.args.faults,
            &self.last_write_error,
        ) {
            faults.record_error("capture_error", error).await;
        }
    }

    /// The bytes of the file a capture names, from the source step's thread workspace. A file
    /// that is not there, or not a regular file, is an error, never invented content.
    async fn read_capture(&self, command: &Command) -> Result<(String, Vec<u8>), String> {
        let source = command.args["sourceStepId"].as_str().unwrap_or_default();
        let path = command.args["path"].as_str().unwrap_or_default();
        let thread = thread_for(&self.args.workflow_id, source);
        let root = crate::workspace::thread_root(&self.args.workspaces_dir, &thread)
            .map_err(|e| e.to_string())?;
        // Read off this turn, with a deadline: the file may be a FIFO or sit on a stuck disk.
        let content = crate::capture::read(crate::capture::CaptureRequest {
            root,
            path: path.to_owned(),
            source_step_id: source.to_owned(),
            bytes_max: self.args.artifact_bytes_max,
            timeout: self.args.capture_timeout,
        })
        .await?;
        Ok((path.to_owned(), content))
    }

    /// Ends this owner's part: the workflow waits for an operator, with `why` recorded in its
    /// data (`reconciliation`), logged and counted.
    async fn reconcile_needed(&mut self, myself: &ActorRef<WorkflowMsg>, why: Reconciliation) {
        tracing::warn!(parent: &self.span, reason = why.reason.as_str(), step_id = %why.step_id,
            child_run_id = %why.run_id, message = %why.message,
            "the workflow needs reconciliation");
        self.args.metrics.inc(
            "reins_workflows_finished_total",
            &[("status", "needs_reconciliation")],
        );
        self.args.metrics.inc(
            "reins_reconciliations_needed_total",
            &[("reason", why.reason.as_str())],
        );
        let mut data = self.args.document.data.clone();
        data["reconciliation"] = json!({
            "reason": why.reason.as_str(),
            "message": why.message,
            "step_id": why.step_id,
            "run_id": why.run_id,
            "at_ms": now_ms(),
        });
        let op = WriteOp::SetWorkflow {
            workflow_id: self.args.workflow_id.clone(),
            status: "needs_reconciliation".into(),
            data,
        };
        // Its slots stay held; its lease is given back in the same write, so an operator's
        // reconcile can take the workflow at once.
        if self.write(myself, vec![op, WriteOp::ReleaseLease]).await {
            self.end(myself);
        }
    }

    async fn poll_controls(&mut self, myself: &ActorRef<WorkflowMsg>) {
        if self.cancelling.is_some() {
            return;
        }
        let controls = match self.args.store.read_controls(&self.args.workflow_id).await {
            Ok(controls) => controls,
            Err(error) => {
                // The node's poller asks again while the control is pending.
                tracing::warn!(parent: &self.span, %error, "reading controls failed");
                return;
            }
        };
        if let Some(cancel) = controls.iter().find(|c| c.kind == "cancel" && !c.applied) {
            self.begin_cancel(myself, cancel.id).await;
            return;
        }
        let wanted: Vec<(CallId, &'static str, String)> = self
            .waiting
            .iter()
            .filter_map(|(id, (waiting, command))| match waiting {
                Waiting::Control(kind) => Some((*id, *kind, command.step_id.clone())),
                _ => None,
            })
            .collect();
        for (id, kind, step_id) in wanted {
            let Some(control) = controls
                .iter()
                .find(|c| !c.applied && c.kind == kind && c.step_id == step_id && c.attempt == 1)
            else {
                continue;
            };
            let outcome = match kind {
                "resume" => {
                    Outcome::Resolved(control.body.get("input").cloned().unwrap_or(Value::Null))
                }
                _ => Outcome::Resolved(json!({
                    "decision": control.body["decision"],
                    "decidedBy": control.created_by,
                    "decidedAt": now_ms(),
                    "comment": control.body.get("comment"),
                })),
            };
            let applied = WriteOp::MarkControlApplied {
                control_id: control.id,
            };
            self.conclude(myself, id, outcome, vec![applied], json!({}))
                .await;
            if self.done {
                return;
            }
        }
    }

    /// A cancel request: stop the script, interrupt the child runs (durably), and end
    /// `cancelled` once every child has an outcome, or `needs_reconciliation` if one cannot be
    /// observed within the window.
    async fn begin_cancel(&mut self, myself: &ActorRef<WorkflowMsg>, control_id: i64) {
        tracing::info!(parent: &self.span, "cancelling");
        self.cancelling = Some(control_id);
        self.args.js.park(&self.args.workflow_id);
        self.loaded = false;
        self.set_status(myself, "cancelling").await;
        if self.done {
            return;
        }
        self.fault("cancelling").await;
        let children: Vec<String> = self
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
        for run_id in children {
            if let Err(error) = self
                .args
                .runs
                .cancel(&run_id, store::CancelAction::Interrupt)
                .await
            {
                tracing::warn!(parent: &self.span, %error, run_id, "cancel request failed");
            }
        }
        let window = Duration::from_millis(self.args.cancel_window_ms);
        crate::mailbox::post_after(myself, window, || WorkflowMsg::CancelDeadline);
        crate::mailbox::post_after(myself, CHILD_CHECK, || WorkflowMsg::CheckChildren);
        self.end_cancel_if_quiet(myself).await;
    }

    /// A cancellation asked of a workflow whose owner died: the children the journal shows
    /// running are asked to stop, and the cancellation proceeds from their rows. The script never
    /// runs.
    async fn finish_cancel_of_dead_owner(
        &mut self,
        myself: &ActorRef<WorkflowMsg>,
        newest: &BTreeMap<u32, store::StepRow>,
    ) {
        for (seq, step) in newest {
            let (Some(entry), Some(run_id)) = (
                self.journal.iter().find(|e| e.seq == *seq).cloned(),
                step.data["run_id"].as_str(),
            ) else {
                continue;
            };
            if step.status != "running" {
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
                (Waiting::Child(Some(run_id.to_owned())), command),
            );
        }
        match self.args.store.read_controls(&self.args.workflow_id).await {
            Ok(controls) => match controls.iter().find(|c| c.kind == "cancel" && !c.applied) {
                Some(cancel) => self.begin_cancel(myself, cancel.id).await,
                None => self.stop(myself),
            },
            Err(error) => {
                tracing::error!(parent: &self.span, %error, "cannot read the controls");
                self.stop(myself);
            }
        }
    }

    /// Reads the rows of the children a cancellation waits for; an ended one is recorded.
    async fn check_children(&mut self, myself: &ActorRef<WorkflowMsg>) {
        let children: Vec<(CallId, String)> = self
            .waiting
            .iter()
            .filter_map(|(id, (waiting, _))| match waiting {
                Waiting::Child(Some(run_id)) => Some((*id, run_id.clone())),
                _ => None,
            })
            .collect();
        for (id, run_id) in children {
            if let Ok(Some(row)) = self.args.store.read_run(&run_id).await
                && row.status.is_terminal()
            {
                self.child_ended_while_cancelling(myself, id, row).await;
                if self.done {
                    return;
                }
            }
        }
        crate::mailbox::post_after(myself, CHILD_CHECK, || WorkflowMsg::CheckChildren);
    }

    /// Ends the cancellation once no child run is outstanding.
    async fn end_cancel_if_quiet(&mut self, myself: &ActorRef<WorkflowMsg>) {
        let Some(control_id) = self.cancelling else {
            return;
        };
        if !self.waiting.is_empty() {
            return;
        }
        let op = WriteOp::SetWorkflow {
            workflow_id: self.args.workflow_id.clone(),
            status: "cancelled".into(),
            data: self.args.document.data.clone(),
        };
        let applied = WriteOp::MarkControlApplied { control_id };
        let slots = WriteOp::ReleaseSlots {
            workflow_id: self.args.workflow_id.clone(),
        };
        if self
            .write(myself, vec![op, applied, slots, WriteOp::ReleaseLease])
            .await
        {
            tracing::info!(parent: &self.span, "cancelled");
            self.args
                .metrics
                .inc("reins_workflows_finished_total", &[("status", "cancelled")]);
            self.end(myself);
        }
    }

    /// A child run ended during a cancellation: record it, free its slot, and see whether the
    /// cancellation can end.
    async fn child_ended_while_cancelling(
        &mut self,
        myself: &ActorRef<WorkflowMsg>,
        id: CallId,
        row: RunRow,
    ) {
        let Some((_, command)) = self.waiting.remove(&id) else {
            return;
        };
        let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
            return;
        };
        let mut fields = self.child_fields(&row.run_id, &row.thread_id, &row.agent);
        fields["run_status"] = json!(row.status);
        let ops = vec![
            self.step_op(&entry, "cancelled", fields),
            WriteOp::ReleaseSlot {
                workflow_id: self.args.workflow_id.clone(),
                step_id: command.step_id,
            },
        ];
        if self.write(myself, ops).await {
            self.end_cancel_if_quiet(myself).await;
        }
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
            epoch = args.fence.epoch,
        );
        args.lease.post(LeaseMsg::Track {
            run_id: args.workflow_id.clone(),
            kind: LeaseKind::Workflow {
                epoch: args.fence.epoch,
            },
            deadline: args.deadline,
            notify: myself.get_derived(),
        })?;
        myself.post(WorkflowMsg::Begin)?;
        let left = u64::try_from(deadline_ms(&args).saturating_sub(now_ms())).unwrap_or(0);
        let timeout = Timer::after(&myself, Duration::from_millis(left), || {
            WorkflowMsg::TimedOut
        });
        Ok(WorkflowState {
            args,
            artifacts: 0,
            attempts: BTreeMap::new(),
            journal: Vec::new(),
            waiting: BTreeMap::new(),
            loaded: false,
            logged_bytes: 0,
            status: "running",
            done: false,
            cancelling: None,
            last_write_error: None,
            unwritten: Unwritten::default(),
            carried: None,
            admission_tries: BTreeMap::new(),
            slot_waits: std::collections::BTreeSet::new(),
            answer_waits: BTreeMap::new(),
            read_tries: 0,
            detached: BTreeMap::new(),
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
        if state.done {
            return Ok(());
        }
        match message {
            WorkflowMsg::Begin if state.args.start == Start::Fresh => {
                state.activate(&myself, Vec::new()).await;
            }
            WorkflowMsg::Begin => {
                let id = state.args.workflow_id.clone();
                let journal = match state.args.store.last_artifact_version(&id).await {
                    Ok(version) => {
                        state.artifacts = version;
                        state.args.store.read_steps(&id).await
                    }
                    Err(error) => Err(error),
                };
                match journal {
                    Ok(steps) => {
                        let (newest, journal) = newest_attempts(steps);
                        state.attempts = newest
                            .iter()
                            .map(|(seq, step)| (*seq, step.attempt))
                            .collect();
                        match journal {
                            // A cancel replays nothing: it waits for the children its journal
                            // shows running, and its end stops every live child run of the
                            // workflow, so an unreadable journal only leaves nothing to wait for.
                            journal if state.args.start == Start::CancelOnly => {
                                state.journal = journal.unwrap_or_else(|unreadable| {
                                    tracing::warn!(parent: &state.span, %unreadable,
                                        "the journal cannot be read; cancelling without it");
                                    Vec::new()
                                });
                                state.finish_cancel_of_dead_owner(&myself, &newest).await;
                            }
                            Ok(journal) => {
                                state.journal = journal;
                                state.activate(&myself, Vec::new()).await;
                            }
                            Err(unreadable) => {
                                let why = Reconciliation::of_journal(&unreadable);
                                state.reconcile_needed(&myself, why).await;
                            }
                        }
                    }
                    Err(error) if error.is_transient() => {
                        state.read_tries += 1;
                        tracing::warn!(parent: &state.span, %error,
                            "cannot read the journal yet; retrying");
                        let wait = store_backoff(state.read_tries);
                        crate::mailbox::post_after(&myself, wait, || WorkflowMsg::Begin);
                    }
                    Err(error) => {
                        tracing::error!(parent: &state.span, %error, "cannot read the journal");
                        state.stop(&myself);
                    }
                }
            }
            WorkflowMsg::Lease(LeaseEvent::Renewed { .. }) => {}
            WorkflowMsg::Lease(LeaseEvent::Refused | LeaseEvent::Lost) => {
                tracing::warn!(parent: &state.span, "lease lost: fenced");
                state.stop(&myself);
            }
            WorkflowMsg::Admission { id, result } => {
                state.on_admission(&myself, id, *result).await;
            }
            WorkflowMsg::RetryAdmission(id) => state.admit(&myself, id),
            WorkflowMsg::SlotCheck(id) => {
                if state.slot_waits.remove(&id) {
                    state.admit(&myself, id);
                }
            }
            WorkflowMsg::SlotFreed => {
                for id in std::mem::take(&mut state.slot_waits) {
                    state.admit(&myself, id);
                }
            }
            WorkflowMsg::AnswerCheck(id) => {
                if let Some(run_id) = state.answer_waits.remove(&id) {
                    let _ = myself.post(WorkflowMsg::ChildEnded {
                        id,
                        run_id,
                        committed: None,
                    });
                }
            }
            WorkflowMsg::InputChanged => {
                for (id, run_id) in std::mem::take(&mut state.answer_waits) {
                    let _ = myself.post(WorkflowMsg::ChildEnded {
                        id,
                        run_id,
                        committed: None,
                    });
                }
            }
            WorkflowMsg::ChildEnded { id, run_id, .. } if state.cancelling.is_some() => {
                // An end whose fate is unknown is left to the cancel window.
                if let Ok(Some(row)) = state.args.store.read_run(&run_id).await
                    && row.status.is_terminal()
                {
                    state.child_ended_while_cancelling(&myself, id, row).await;
                }
            }
            WorkflowMsg::TimedOut if state.cancelling.is_none() => {
                tracing::warn!(parent: &state.span, "the workflow ran past timeout_seconds: cancelling");
                let control = store::NewControl {
                    workflow_id: state.args.workflow_id.clone(),
                    kind: "cancel".into(),
                    step_id: String::new(),
                    attempt: 0,
                    body: json!({"reason": "timeout"}),
                    created_by: None,
                };
                match state.args.store.put_control(control).await {
                    Ok(store::ControlWrite::Recorded(row) | store::ControlWrite::Repeated(row)) => {
                        state.begin_cancel(&myself, row.id).await;
                    }
                    // A cancel was asked for already (with another reason): the poll finds it.
                    Err(store::Error::Conflict(_)) => {}
                    Err(error) if error.is_transient() => {
                        state.read_tries += 1;
                        let wait = store_backoff(state.read_tries);
                        crate::mailbox::post_after(&myself, wait, || WorkflowMsg::TimedOut);
                    }
                    Err(error) => {
                        tracing::error!(parent: &state.span, %error, "cannot record the timeout");
                        state.stop(&myself);
                    }
                }
            }
            WorkflowMsg::TimedOut => {}
            WorkflowMsg::CheckChildren if state.cancelling.is_some() => {
                state.check_children(&myself).await;
            }
            WorkflowMsg::CheckChildren => {}
            WorkflowMsg::CancelDeadline => {
                if state.cancelling.is_some() && !state.waiting.is_empty() {
                    let (step_id, run_id) = state
                        .waiting
                        .values()
                        .find_map(|(waiting, command)| match waiting {
                            Waiting::Child(Some(run_id)) => {
                                Some((command.step_id.clone(), run_id.clone()))
                            }
                            _ => None,
                        })
                        .unwrap_or_default();
                    let why = Reconciliation::of_step(
                        ReconciliationReason::CancelWindowPassed,
                        &step_id,
                        &run_id,
                    );
                    state.reconcile_needed(&myself, why).await;
                }
            }
            WorkflowMsg::ChildEnded { id, run_id, .. } if state.detached.contains_key(&id) => {
                state.detached_child_ended(&myself, id, &run_id).await;
            }
            WorkflowMsg::ChildEnded {
                id,
                run_id,
                committed,
            } => {
                let row = match committed {
                    Some(row) => Ok(Some(*row)),
                    None => state.args.store.read_run(&run_id).await,
                };
                match row {
                    Ok(Some(row))
                        if row.status.is_terminal()
                            && row.stop_reason.as_deref() != Some("orphan_recovered") =>
                    {
                        state.adopt(&myself, id, row).await;
                    }
                    Ok(Some(row)) if row.status == RunStatus::WaitingForInput => {
                        // The agent ended its run in a pause: a person's answer (on any node)
                        // ends the run, and announces it on the change bus; the fallback
                        // reads the row should the cue be lost.
                        state.answer_waits.insert(id, run_id);
                        crate::mailbox::post_after(&myself, state.args.wake_fallback, move || {
                            WorkflowMsg::AnswerCheck(id)
                        });
                    }
                    Err(error) if error.is_transient() => {
                        // The row could not be read (the database is unreachable): read it
                        // again later; an outage says nothing about the child.
                        state.read_tries += 1;
                        let wait = store_backoff(state.read_tries);
                        crate::mailbox::post_after(&myself, wait, move || {
                            WorkflowMsg::ChildEnded {
                                id,
                                run_id,
                                committed: None,
                            }
                        });
                    }
                    Ok(_) | Err(_) => {
                        // The run's end was not recorded by its node (fenced, or unknown).
                        let step_id = state
                            .waiting
                            .get(&id)
                            .map(|(_, command)| command.step_id.clone())
                            .unwrap_or_default();
                        let why = Reconciliation::of_step(
                            ReconciliationReason::ChildEndUnrecorded,
                            &step_id,
                            &run_id,
                        );
                        state.reconcile_needed(&myself, why).await;
                    }
                }
            }
            WorkflowMsg::Poll => state.poll_controls(&myself).await,
            WorkflowMsg::GiveUp { shutdown, reply } => {
                // At a clean stop, a child run of this node stops with it while its run is
                // still leased: a new owner would have to take it for an orphan. Such a
                // workflow keeps its lease and is recovered once that runs out, as after a crash.
                if shutdown && (state.waiting.values()).any(|(w, _)| matches!(w, Waiting::Child(_)))
                {
                    let refused = Error::Refused("a child run of it is in flight".into());
                    let _ = reply.send(Err(refused));
                    return Ok(());
                }
                // Between two handlers nothing is being written: stop first, so nothing more
                // is, then let the lease go so another node can take the workflow at once.
                if shutdown {
                    tracing::info!(parent: &state.span, "the node stops: giving up the lease");
                } else {
                    tracing::warn!(parent: &state.span, "fenced by an operator: giving up the lease");
                }
                state.end(&myself);
                let released = state.args.store.release_lease(&state.args.fence).await;
                let _ = reply.send(
                    released
                        .map(|_| state.args.fence.epoch)
                        .map_err(Error::from),
                );
            }
            WorkflowMsg::Local { id } => state.local(&myself, id).await,
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut WorkflowState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        state.args.js.park(&state.args.workflow_id);
        Ok(())
    }
}

/// The run as admitted, with the outcome this node's compare-and-set gave it (what the row now
/// holds in the fields an adoption reads; `revision` and `updated_at` stay the admission's).
fn ended_with(admitted: RunRow, outcome: store::RunOutcome) -> RunRow {
    RunRow {
        status: outcome.status,
        error: outcome.error,
        output: outcome.output,
        stop_reason: outcome.stop_reason,
        total_tokens: outcome.total_tokens,
        message_count: outcome.message_count,
        ..admitted
    }
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

/// A journal row that cannot be replayed: the workflow is never replayed around it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("journal call {seq} (step {step_id:?}, attempt {attempt}): {problem}")]
pub(crate) struct UnreadableJournal {
    seq: i32,
    step_id: String,
    attempt: i32,
    problem: String,
}

/// The newest attempt of each call, and the journal they make: read whole, every row parsed and
/// the calls numbered 0, 1, 2, ... with none missing, or the first row that breaks this named.
/// Dropping a row would shift every later call onto the wrong outcome.
fn newest_attempts(
    steps: Vec<store::StepRow>,
) -> (
    BTreeMap<u32, store::StepRow>,
    Result<Vec<JournalEntry>, UnreadableJournal>,
) {
    let unreadable = |step: &store::StepRow, problem: String| UnreadableJournal {
        seq: step.seq,
        step_id: step.step_id.clone(),
        attempt: step.attempt,
        problem,
    };
    let mut newest: BTreeMap<u32, store::StepRow> = BTreeMap::new();
    let mut out_of_range = None;
    for step in steps {
        let Ok(seq) = u32::try_from(step.seq) else {
            out_of_range.get_or_insert_with(|| {
                unreadable(&step, "its call number is out of range".to_owned())
            });
            continue;
        };
        if newest
            .get(&seq)
            .is_none_or(|known| known.attempt < step.attempt)
        {
            newest.insert(seq, step);
        }
    }
    let journal = match out_of_range {
        Some(error) => Err(error),
        None => (0u32..)
            .zip(&newest)
            .map(|(expected, (seq, step))| {
                if *seq != expected {
                    return Err(UnreadableJournal {
                        // Invariant: `expected` is below `seq`, which came from an `i32`.
                        seq: i32::try_from(expected).unwrap_or(i32::MAX),
                        step_id: String::new(),
                        attempt: 0,
                        problem: format!("missing (the next call journaled is {seq})"),
                    });
                }
                journal_entry(*seq, step).map_err(|problem| unreadable(step, problem))
            })
            .collect(),
    };
    (newest, journal)
}

/// A stored step as the runtime's journal entry.
fn journal_entry(seq: u32, step: &store::StepRow) -> Result<JournalEntry, String> {
    let kind = CallKind::parse(&step.kind)
        .ok_or_else(|| format!("{:?} is not a kind of call", step.kind))?;
    let outcome = serde_json::from_value(step.data["outcome"].clone())
        .map_err(|e| format!("its outcome cannot be read: {e}"))?;
    let settled_at_ms = match &step.data["settled_at_ms"] {
        Value::Null => None,
        at => Some(
            at.as_i64()
                .ok_or_else(|| format!("its settled_at_ms {at} is not a whole number"))?,
        ),
    };
    Ok(JournalEntry {
        seq,
        kind,
        step_id: step.step_id.clone(),
        args: step.data["args"].clone(),
        outcome,
        settled_at_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i32, step_id: &str, attempt: i32, data: Value) -> store::StepRow {
        store::StepRow {
            seq,
            step_id: step_id.to_owned(),
            attempt,
            kind: "agent".to_owned(),
            status: "completed".to_owned(),
            data,
            created_at: 0.0,
        }
    }

    fn settled(value: i64) -> Value {
        json!({"args": {}, "outcome": {"outcome": "resolved", "value": value}, "settled_at_ms": 7})
    }

    #[test]
    fn the_journal_is_the_newest_attempt_of_each_call_in_order() {
        let (newest, journal) = newest_attempts(vec![
            row(1, "b", 1, settled(2)),
            row(0, "a", 1, settled(1)),
            row(1, "b", 2, json!({"args": {}})),
        ]);
        let journal = journal.expect("readable");
        assert_eq!(newest[&1].attempt, 2);
        assert_eq!(journal.len(), 2);
        assert_eq!(journal[0].outcome, Some(Outcome::Resolved(json!(1))));
        assert_eq!(journal[0].settled_at_ms, Some(7));
        assert_eq!((journal[1].seq, journal[1].outcome.clone()), (1, None));
    }

    #[test]
    fn a_missing_call_is_named_never_skipped() {
        let error = newest_attempts(vec![row(0, "a", 1, settled(1)), row(2, "c", 1, settled(3))])
            .1
            .expect_err("a gap");
        assert_eq!((error.seq, error.step_id.as_str()), (1, ""));
        assert!(
            error.to_string().contains("next call journaled is 2"),
            "{error}"
        );
    }

    #[test]
    fn an_unreadable_row_is_named_never_dropped() {
        let bad_outcome = json!({"args": {}, "outcome": 42});
        let error = newest_attempts(vec![
            row(0, "a", 1, settled(1)),
            row(1, "b", 3, bad_outcome),
        ])
        .1
        .expect_err("unreadable outcome");
        assert_eq!(
            (error.seq, error.step_id.as_str(), error.attempt),
            (1, "b", 3)
        );
        let mut bad_kind = row(0, "a", 1, settled(1));
        bad_kind.kind = "teleport".to_owned();
        assert!(newest_attempts(vec![bad_kind]).1.is_err());
        let bad_time = json!({"args": {}, "settled_at_ms": "noon"});
        assert!(newest_attempts(vec![row(0, "a", 1, bad_time)]).1.is_err());
        let (newest, journal) = newest_attempts(vec![row(-1, "z", 1, settled(1))]);
        assert!(newest.is_empty() && journal.is_err());
    }
}
