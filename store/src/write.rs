//! The writes that need ownership. Each is data, not code, so that one list can be checked
//! against one fence in one transaction on either backend.

use serde_json::Value;

use crate::{StepKind, StepRecord, StepStatus, WorkflowId, WorkflowStatus};

/// One ownership-dependent change to a workflow's state. A list of them is applied by
/// [`crate::Store::fenced_write`] atomically, after the fence check, or not at all.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOp {
    /// Set a workflow's status and data document.
    SetWorkflow {
        workflow_id: WorkflowId,
        status: WorkflowStatus,
        data: Value,
    },
    /// Insert or replace one step attempt of a workflow's journal, with the bytes of its error
    /// ([`StepRecord::error_bytes`]), which its workflow's grant must hold
    /// ([`WriteOp::TakeStorage`]).
    PutStep {
        workflow_id: WorkflowId,
        /// The call's place in the script's order; replay reads the journal by it.
        seq: i32,
        step_id: String,
        attempt: i32,
        status: StepStatus,
        /// Its kind and everything it records (encoded by [`StepRecord::encode`]).
        record: StepRecord,
    },
    /// Mark a control as carried out.
    MarkControlApplied { control_id: i64 },
    /// A `waitForEvent` step takes event `seq` of its workflow (see `crate::sent_events`):
    /// refused (`Error::NotFound`, nothing of the write stored) unless the event exists and no
    /// other step took it; the same step taking it again is a repeat.
    TakeEvent {
        workflow_id: WorkflowId,
        seq: i64,
        step_id: String,
    },
    /// Store an immutable artifact version (a captured file, an agent's output). A version that
    /// exists already is a conflict: versions never change.
    PutArtifact {
        workflow_id: WorkflowId,
        version: i64,
        source_step_id: String,
        path: Option<String>,
        content: Vec<u8>,
        sha256: String,
    },
    /// Close every live child run of one step attempt of this workflow (found by the attempt's
    /// idempotency key, [`crate::idempotency_key`], whatever the journal names), on an
    /// operator's word (reconcile): they become `interrupted` with `stop_reason = reconciled`.
    CloseStepRuns {
        workflow_id: WorkflowId,
        idempotency_key: String,
    },
    /// Ask every live child run of this workflow to stop (`cancel_action = interrupt`, as a
    /// cancel does; a run waiting for input is interrupted at once). The write that ends a
    /// workflow carries it, so no child outlives its workflow's end unasked.
    CancelRuns { workflow_id: WorkflowId },
    /// Give back the `workflow_slots` slot a step held for its child run.
    ReleaseSlot {
        workflow_id: WorkflowId,
        step_id: String,
    },
    /// Give back every slot this workflow holds. The write that ends a workflow carries it.
    ReleaseSlots { workflow_id: WorkflowId },
    /// Give a workflow coming back from `needs_reconciliation` (which holds no place under the
    /// limits) its places under `max_workflows` and its owner's `max_workflows_per_owner`, as a
    /// launch takes them; with none free the write is refused (`Error::LimitReached`). It must
    /// come before the change of status in its write.
    TakePlaces {
        workflow_id: WorkflowId,
        user_id: String,
        max_workflows: i64,
        max_workflows_per_owner: i64,
    },
    /// Grow this workflow's grant of stored bytes by `bytes`, taken from its owner's quota: the
    /// owner's stored bytes (the sum of their workflows' grants) may not pass `bytes_max` (0: no
    /// quota), or the write is refused ([`crate::Limit::StoredBytes`]). A workflow's artifacts,
    /// errors, events and copied workspaces are stored inside its grant, so this is the one
    /// write that checks the quota, and the one that orders a user's writes on every node.
    TakeStorage {
        workflow_id: WorkflowId,
        bytes: i64,
        bytes_max: i64,
    },
    /// Give back to the owner's quota what this workflow's grant holds beyond what it stores:
    /// its artifacts, its journal's errors ([`crate::StepRecord::error_bytes`]), the events sent
    /// to it and the workspaces its retry copied. The write that ends a workflow carries it, after its last artifact. It writes the
    /// workflow's own row only (`returned_bytes`): the owner's next grant counts it off their
    /// row, and [`crate::Store::stored_bytes`] at once.
    ReturnStorage { workflow_id: WorkflowId },
    /// Keep `console.log` lines as `log` events of the workflow, within its durable bounds: at
    /// most `events_max` lines and `bytes_max` bytes of lines per workflow, whichever node ran
    /// it; the first line over either is replaced by one `log_truncated` event, and later ones
    /// are dropped.
    PutLogs {
        workflow_id: WorkflowId,
        lines: Vec<String>,
        events_max: i64,
        bytes_max: i64,
    },
    /// Give up the lease the write is fenced by: it expires now. The write that ends a workflow
    /// carries it, so the end and the release are one transaction. It is applied after every
    /// other change of its write, wherever it stands in the list (see [`release_last`]).
    ReleaseLease,
    /// Leave the workflow to wait in the store alone: its owner stops, and no node holds it.
    /// The workflow is marked dormant (`workflows.dormant`, with `wake_at`) and the lease the
    /// write is fenced by names no owner (so the fence it was holds nothing any more) and expires at `wake_at_ms` (epoch ms; `None`: [`DORMANT_FOREVER_S`], only
    /// a control or an event wakes it), so that no node may take it over before then and the
    /// first to find it expired takes it over (epoch + 1) and replays its journal. When a
    /// control is pending, an event named in `event_names` is untaken, or `wake_at_ms` has
    /// passed, the lease expires now instead: nothing that committed before this write is
    /// missed, and whatever commits after it wakes the workflow itself
    /// ([`crate::Store::put_control`], [`crate::Store::send_event`]). Like
    /// [`WriteOp::ReleaseLease`] it ends the fence and is applied after every other change.
    GoDormant {
        workflow_id: WorkflowId,
        wake_at_ms: Option<i64>,
        event_names: Vec<String>,
    },
}

/// The lease expiry (epoch seconds: 9999-12-31T23:59:59Z) of a dormant workflow that no time
/// wakes, only a control or an event: a finite time every reader can print.
pub const DORMANT_FOREVER_S: f64 = 253_402_300_799.0;

impl WriteOp {
    /// Whether this change ends the fence it is written under (it gives the lease up or moves
    /// it to a dormant workflow's wake time): it is applied last.
    pub fn ends_fence(&self) -> bool {
        matches!(self, WriteOp::ReleaseLease | WriteOp::GoDormant { .. })
    }
}

/// The bytes of the errors the journal rows among `ops` store ([`StepRecord::error_bytes`]):
/// what their workflow's grant must hold for them.
pub fn error_bytes(ops: &[WriteOp]) -> i64 {
    ops.iter()
        .map(|op| match op {
            WriteOp::PutStep { record, .. } => record.error_bytes(),
            _ => 0,
        })
        .fold(0, i64::saturating_add)
}

/// The wake time a [`WriteOp::GoDormant`] asks for, in epoch seconds as leases keep them.
pub(crate) fn dormant_wake_s(wake_at_ms: Option<i64>) -> f64 {
    wake_at_ms.map_or(DORMANT_FOREVER_S, |ms| {
        (ms as f64 / 1000.0).min(DORMANT_FOREVER_S)
    })
}

/// Moves any change that ends the fence ([`WriteOp::ReleaseLease`], [`WriteOp::GoDormant`])
/// behind the other changes, keeping their order: inside the transaction a released lease no
/// longer fences, so every backend applies the changes it fenced first (PostgreSQL checks the
/// fence once, before the first change), and outside it the order is invisible.
pub(crate) fn release_last(ops: &mut [WriteOp]) {
    ops.sort_by_key(WriteOp::ends_fence);
}

/// `ops` with any [`WriteOp::ReleaseLease`] last (see [`release_last`]).
pub(crate) fn ordered(mut ops: Vec<WriteOp>) -> Vec<WriteOp> {
    release_last(&mut ops);
    ops
}

/// `run` with its step's journal writes [`ordered`].
pub(crate) fn ordered_run(mut run: crate::NewRun) -> crate::NewRun {
    if let Some(step) = &mut run.step {
        release_last(&mut step.journal);
    }
    run
}

/// A workflow row created together with its first lease.
#[derive(Debug, Clone, PartialEq)]
pub struct NewWorkflow {
    pub workflow_id: WorkflowId,
    pub user_id: String,
    pub request_id: Option<String>,
    pub fingerprint: String,
    pub data: Value,
}

impl NewWorkflow {
    /// The row a launch writes: `running`, owned by the launching node, at the times the
    /// database gave its `created_at` and `updated_at` (epoch seconds, database clock).
    pub(crate) fn created(self, owner: &str, (created_at, updated_at): (f64, f64)) -> WorkflowRow {
        WorkflowRow {
            workflow_id: self.workflow_id,
            user_id: self.user_id,
            status: WorkflowStatus::Running,
            owner: Some(owner.to_owned()),
            fingerprint: self.fingerprint,
            data: self.data,
            created_at,
            updated_at,
        }
    }
}

/// One journal entry as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRow {
    pub seq: i32,
    pub step_id: String,
    pub attempt: i32,
    pub status: StepStatus,
    /// Its record, or why the stored `kind` and `data` cannot be decoded: such a row is kept
    /// and named, never dropped (a replay sends its workflow to an operator).
    pub record: Result<StepRecord, String>,
    /// When the entry was first journaled (epoch seconds, database clock).
    pub created_at: f64,
    /// When its attempt's child run was admitted (epoch seconds, database clock): read with a
    /// record's page of steps only (`None` elsewhere, and for an attempt never admitted), so
    /// that the wait before an attempt (its retry's backoff, a wait for a slot) is told apart
    /// from its run.
    pub run_started_at: Option<f64>,
}

impl StepRow {
    /// A row read back with its stored `kind` and `data` (see [`StepRecord::decode`]).
    pub fn decoded(
        seq: i32,
        step_id: String,
        attempt: i32,
        status: StepStatus,
        stored: (&str, &Value),
        created_at: f64,
    ) -> StepRow {
        let record = StepRecord::decode(stored.0, stored.1).map_err(|error| error.to_string());
        StepRow {
            seq,
            step_id,
            attempt,
            status,
            record,
            created_at,
            run_started_at: None,
        }
    }

    /// The row with when its child run was admitted (see [`StepRow::run_started_at`]).
    pub fn with_run_started_at(self, run_started_at: Option<f64>) -> StepRow {
        StepRow {
            run_started_at,
            ..self
        }
    }

    /// Its record, if it could be decoded.
    pub fn record(&self) -> Option<&StepRecord> {
        self.record.as_ref().ok()
    }

    /// Its call kind, if its record could be decoded.
    pub fn kind(&self) -> Option<StepKind> {
        self.record().map(StepRecord::kind)
    }

    /// Its call kind's name, or `unreadable` when its record could not be decoded.
    pub fn kind_name(&self) -> &'static str {
        self.kind().map_or("unreadable", StepKind::as_str)
    }

    /// Its record as stored (`null` when it could not be decoded): for tests and diagnostics
    /// that look at the stored document; code reads the typed [`StepRow::record`].
    pub fn encoded(&self) -> Value {
        self.record().map_or(Value::Null, StepRecord::encode)
    }
}

/// One artifact version as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRow {
    pub version: i64,
    pub source_step_id: Option<String>,
    pub path: Option<String>,
    pub content: Vec<u8>,
    pub sha256: String,
}

/// A workflow row as read back (without its journal).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkflowRow {
    pub workflow_id: WorkflowId,
    pub user_id: String,
    pub status: WorkflowStatus,
    pub owner: Option<String>,
    pub fingerprint: String,
    pub data: Value,
    /// Epoch seconds on the database clock.
    pub created_at: f64,
    pub updated_at: f64,
}

/// The kinds of journal entry that wait for a person (`pause`, `humanCheckpoint`): a reader gets
/// them whole, as [`Snapshot::checkpoints`]. Every other kind is a step, read a page at a time.
pub const CHECKPOINT_KINDS: [StepKind; 2] = [StepKind::Pause, StepKind::HumanCheckpoint];

/// A place in a workflow's journal: attempt `attempt` of call `seq`. The journal's order is
/// `(seq, attempt)`, and one pair names one entry (each call has a `seq` of its own, each try of
/// it an attempt of its own), so a page that starts after a position never repeats or skips one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StepPosition {
    pub seq: i32,
    pub attempt: i32,
}

impl StepPosition {
    /// Where `step` stands.
    pub fn of(step: &StepRow) -> StepPosition {
        StepPosition {
            seq: step.seq,
            attempt: step.attempt,
        }
    }

    /// Before every entry (`seq` counts from 0, attempts from 1): where a first page starts.
    pub const START: StepPosition = StepPosition {
        seq: -1,
        attempt: 0,
    };
}

/// A page of a workflow's steps, read as of one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct StepPage {
    /// The steps (journal entries of any kind but [`CHECKPOINT_KINDS`]) after the position asked
    /// for, in journal order, at most as many as asked.
    pub steps: Vec<StepRow>,
    /// The workflow's child runs that asked a person for approval and either wait for the answer
    /// (`waiting_for_input`: every one of them, whichever page its step is on) or carry it
    /// (`metadata.hitl_answer`: those of this page's steps).
    pub approval_runs: Vec<crate::RunRow>,
}

/// A workflow with everything a reader shows about it, read together: its row, lease, controls
/// and checkpoints whole, its steps and artifact versions a first page of each (so that a read
/// holds what its pages bound, however long the workflow's journal).
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub row: WorkflowRow,
    pub lease: Option<crate::Lease>,
    /// The database clock when it was read (to judge the lease).
    pub db_now: f64,
    /// The workflow that runs this one again from its failed step, if one does
    /// ([`crate::Store::retry_workflow`]).
    pub retried_by: Option<WorkflowId>,
    /// The first steps of the journal (see [`StepPage::steps`]).
    pub steps: Vec<StepRow>,
    /// Every journal entry of [`CHECKPOINT_KINDS`], in journal order.
    pub checkpoints: Vec<StepRow>,
    pub controls: Vec<crate::ControlRow>,
    /// The runs that asked a person: every one waiting, and those of [`Snapshot::steps`] that
    /// carry an answer (see [`StepPage::approval_runs`]).
    pub approval_runs: Vec<crate::RunRow>,
    /// The first artifact versions of the workflow, without their bytes, oldest first.
    pub artifacts: Vec<ArtifactInfo>,
    /// Its waits (see [`crate::WaitKind`]), in journal order: none unless its status is one of
    /// [`crate::WAITING_STATUSES`].
    pub waits: Vec<StepRow>,
}

/// An artifact version as a record lists it: everything but its bytes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ArtifactInfo {
    pub version: i64,
    /// The step that made it: the agent step whose output it is, or the capture.
    pub source_step_id: Option<String>,
    /// The captured file's path (an agent's output has none).
    pub path: Option<String>,
    pub bytes: i64,
    pub sha256: String,
    /// Epoch seconds.
    pub created_at: f64,
}
