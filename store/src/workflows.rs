//! Workflows beyond the fenced journal writes: launching (idempotent per user and request id,
//! under cluster-wide limits counted atomically) and controls (durable requests any node writes
//! and the owner carries out).

use std::fmt;

use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::status::stored_text;
use crate::{COUNTED_STATUSES, Error, Lease, NewWorkflow, WorkflowId, WorkflowRow, WorkflowStatus};

/// [`COUNTED_STATUSES`] as a slice with a static life, a statement parameter on PostgreSQL.
pub(crate) static COUNTED: &[&str] = &COUNTED_STATUSES;

/// The cluster-wide limits a launch is admitted under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchLimits {
    pub max_workflows: u64,
    pub max_workflows_per_owner: u64,
}

impl LaunchLimits {
    /// No limit at all (tools and tests).
    pub const NONE: LaunchLimits = LaunchLimits {
        max_workflows: u64::MAX,
        max_workflows_per_owner: u64::MAX,
    };
}

/// What a launch did.
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// A new workflow, `running`, leased by the launching node (epoch 1): its row as written
    /// (its times on the database clock) and its lease.
    Created { row: WorkflowRow, lease: Lease },
    /// The same user launched the same request before: that workflow.
    Existing(WorkflowRow),
    /// A limit refused it; nothing was written.
    Refused { limit: crate::Limit, max: u64 },
}

/// A failed workflow run again from its failed step: a new workflow, launched as
/// [`NewRetry::workflow`] is (its own id, its source's script, arguments, seed and owner), that
/// adopts its source's journal below [`NewRetry::adopted_calls`]: every entry of those calls and
/// the artifact versions they made, under the same numbers. The source is never written.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRetry {
    pub workflow: NewWorkflow,
    /// The failed workflow it runs again.
    pub retry_of: WorkflowId,
    /// Calls numbered below this one are adopted (every attempt of each); the rest run live.
    pub adopted_calls: i32,
    /// The owner's quota (`limits.user_stored_bytes_max`; 0: none), which the adopted artifacts'
    /// and errors' bytes and `copied_bytes` are taken from as a grant of the new workflow, as
    /// [`crate::WriteOp::TakeStorage`] takes one.
    pub stored_bytes_max: i64,
    /// The bytes of data copied from the adopted steps' workspaces for the new workflow's
    /// threads (`workflow_storage.copied_bytes`).
    pub copied_bytes: i64,
}

/// What a retry did.
#[derive(Debug, Clone, PartialEq)]
pub enum Retry {
    /// A new workflow, `running`, leased by the retrying node (epoch 1), with its adopted journal
    /// and artifacts: its row as written and its lease.
    Created { row: WorkflowRow, lease: Lease },
    /// The workflow was retried already: that retry, still one.
    Existing(WorkflowRow),
    /// No such workflow.
    NotFound,
    /// Only a failed workflow is run again; this one is at this status. Nothing was written.
    NotFailed(WorkflowStatus),
    /// A limit refused it (a place under the launch limits, or the owner's stored bytes for the
    /// adopted artifacts); nothing was written.
    Refused { limit: crate::Limit, max: u64 },
}

/// What an attempt to take over a workflow did.
#[derive(Debug, Clone, PartialEq)]
pub enum TakeOver {
    /// This node holds the workflow now, at the returned (incremented) epoch.
    Taken(Lease),
    /// The workflow is not recoverable: it finished.
    NotRecoverable(String),
    /// Its owner's lease is still valid (by the database clock): nothing was written. Asking
    /// again once that lease has run out may succeed.
    LeaseHeld,
    /// A rule refused the takeover; nothing was written and the lease is untouched.
    Refused(String),
}

/// A workflow whose owner's lease ran out while it was live, as automatic recovery claims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphaned {
    pub workflow_id: WorkflowId,
    /// A cancellation is pending (or under way): the claim is for [`Purpose::Cancel`], which
    /// never replays the body.
    pub cancel_pending: bool,
}

/// What [`crate::Store::dormant_workflows`] answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dormancy {
    /// Dormant workflows whose wake time came, as automatic recovery would claim them.
    pub due: Vec<Orphaned>,
    /// The soonest wake time of the dormant workflows not yet due (epoch seconds; none when no
    /// time wakes any of them).
    pub next_wake_at: Option<f64>,
}

/// Why a node takes a workflow over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// Replay it here after its owner died (`recover`).
    Recover,
    /// Settle its uncertain step and replay it here (`reconcile`).
    Reconcile,
    /// Finish a pending cancellation without ever replaying the body (the owner died).
    Cancel,
}

/// What a journal's replay depends on: the runtime (engine, script API, limits) and the
/// configuration (the agents' definitions). A node replays a workflow only under both of the
/// versions it was written under.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Versions {
    pub runtime: String,
    pub configuration: String,
}

/// The rules a takeover is judged by, from what the workflow's row and controls say, before
/// anything is written. `None` lets it proceed to the lease. A workflow written before
/// configuration versions were recorded (none in its data) is judged by its runtime alone.
pub(crate) fn takeover_refusal(
    status: WorkflowStatus,
    written_under: &Versions,
    ours: &Versions,
    cancel_pending: bool,
    purpose: Purpose,
) -> Option<TakeOver> {
    if status.is_final() {
        return Some(TakeOver::NotRecoverable(format!(
            "the workflow is {status}"
        )));
    }
    let cancelling = cancel_pending || status == WorkflowStatus::Cancelling;
    let refused = |reason: String| Some(TakeOver::Refused(reason));
    match purpose {
        Purpose::Cancel if !cancelling => refused("no cancellation was asked for".into()),
        // A cancellation replays nothing, so any runtime may finish it.
        Purpose::Cancel => None,
        Purpose::Reconcile if status != WorkflowStatus::NeedsReconciliation => refused(format!(
            "only a workflow that needs reconciliation can be reconciled; it is {status}"
        )),
        Purpose::Recover if status == WorkflowStatus::NeedsReconciliation => {
            refused("it needs reconciliation: an operator settles it with reconcile".into())
        }
        _ if written_under.runtime != ours.runtime => refused(format!(
            "the workflow's journal was written by runtime {:?}, this node runs {:?}",
            written_under.runtime, ours.runtime
        )),
        _ if !written_under.configuration.is_empty()
            && written_under.configuration != ours.configuration =>
        {
            refused(format!(
                "the workflow was launched under agent configuration {:?}, this node has {:?}",
                written_under.configuration, ours.configuration
            ))
        }
        Purpose::Recover if cancelling => {
            refused("a cancellation is pending: only cancel may finish this workflow".into())
        }
        _ => None,
    }
}

/// What a control asks of a workflow, as stored (`workflow_controls.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlKind {
    /// Resolves a `pause` call.
    Resume,
    /// Resolves a `humanCheckpoint` call.
    Decide,
    /// Cancels the workflow.
    Cancel,
}

impl ControlKind {
    /// Every kind.
    pub const ALL: [ControlKind; 3] = [
        ControlKind::Resume,
        ControlKind::Decide,
        ControlKind::Cancel,
    ];

    /// The stored text.
    pub const fn as_str(self) -> &'static str {
        match self {
            ControlKind::Resume => "resume",
            ControlKind::Decide => "decide",
            ControlKind::Cancel => "cancel",
        }
    }

    /// A control row's stored kind, or the store error naming the row.
    pub(crate) fn read(stored: &str, workflow_id: &WorkflowId, id: i64) -> Result<Self, Error> {
        Self::parse(stored).ok_or_else(|| {
            Error::Database(format!(
                "control {id} of workflow {workflow_id:?} has an unknown kind {stored:?}"
            ))
        })
    }
}

stored_text!(ControlKind);

/// A durable request to a workflow.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ControlRow {
    pub id: i64,
    pub workflow_id: WorkflowId,
    pub kind: ControlKind,
    /// The step it answers (`""` for a cancel).
    pub step_id: String,
    pub attempt: i32,
    pub body: Value,
    pub created_by: Option<String>,
    /// When it was recorded (epoch seconds, database clock): a repeat and a contradiction say
    /// when the answer that stands was given.
    pub created_at: f64,
    pub applied: bool,
}

/// A control to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewControl {
    pub workflow_id: WorkflowId,
    pub kind: ControlKind,
    pub step_id: String,
    pub attempt: i32,
    pub body: Value,
    pub created_by: Option<String>,
}

/// Whether `new` says what the recorded control `existing` says, so that recording it again is
/// a repeat, not a contradiction: a decision the same decision about the same artifact version,
/// whatever its comment; a resume the same input; a cancel the same body.
pub(crate) fn same_answer(existing: &ControlRow, new: &NewControl) -> bool {
    let key = |body: &Value, field: &str| body.get(field).cloned().unwrap_or(Value::Null);
    // A wait's deadline answers `by: "timeout"`, a person never: theirs is not a repeat of it.
    if key(&existing.body, "by") != key(&new.body, "by") {
        return false;
    }
    match new.kind {
        ControlKind::Decide => ["decision", "artifactVersion"]
            .iter()
            .all(|field| key(&existing.body, field) == key(&new.body, field)),
        ControlKind::Resume => key(&existing.body, "input") == key(&new.body, "input"),
        ControlKind::Cancel => existing.body == new.body,
    }
}

/// The refusal of a control that contradicts the recorded one: what was said, and by whom.
pub(crate) fn contradiction(existing: &ControlRow) -> Error {
    let by = match existing.body["by"].as_str() {
        Some("timeout") => "its timeout",
        _ => existing
            .created_by
            .as_deref()
            .unwrap_or("an earlier request"),
    };
    let said = match existing.kind {
        ControlKind::Decide => format!(
            "decided {} (artifact version {})",
            existing.body["decision"].as_str().unwrap_or("?"),
            existing.body["artifactVersion"]
        ),
        ControlKind::Resume => format!("resumed with the input {}", existing.body["input"]),
        ControlKind::Cancel => format!("asked to cancel ({})", existing.body),
    };
    Error::Conflict(format!(
        "step {:?} attempt {} was already {said} by {by} at {}; a different {} is refused",
        existing.step_id,
        existing.attempt,
        crate::rfc3339_utc(existing.created_at),
        existing.kind
    ))
}

/// What recording a control did.
#[derive(Debug, Clone, PartialEq)]
pub enum ControlWrite {
    /// This call wrote the row.
    Recorded(ControlRow),
    /// The same answer was already recorded (a decision's comment aside): still one row, the
    /// first one, with who recorded it.
    Repeated(ControlRow),
}

/// What deleting a workflow did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The workflow, its journal, controls, artifacts, slots and lease are gone.
    Deleted,
    /// Only terminal workflows may be deleted; nothing was removed.
    NotTerminal,
    NotFound,
}

/// Which workflows a listing shows, and where a page starts. A listing is newest first, by
/// `(created_at, id)` descending.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ListFilter {
    /// Only this user's workflows (`None`: everyone's, for an admin).
    pub user_id: Option<String>,
    pub status: Option<StatusFilter>,
    /// Only workflows with a wait of this kind (see [`crate::WaitKind`]; [`crate::WaitKind::of`]
    /// judged on the database clock).
    pub waiting_for: Option<crate::WaitKind>,
    /// Only the workflow launched with this `request_id` (one per user).
    pub request_id: Option<String>,
    /// The page starts after this position (the last workflow of the previous page).
    pub after: Option<ListCursor>,
    pub limit: u32,
}

/// Which status a listing keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusFilter {
    /// This stored status.
    Stored(WorkflowStatus),
    /// What `get` shows as `recoverable`: a status of [`COUNTED_STATUSES`] (live, not waiting
    /// for an operator) with no lease, or a lease expired on the database clock.
    Recoverable,
    /// What `get` shows as `waiting_for_input`: `running`, not recoverable, with a child run of
    /// its agent steps waiting for a person's answer (`runs.status` `waiting_for_input`). Read
    /// from the runs, never stored: the owner writes nothing for it, and nothing can disagree.
    WaitingForInput,
}

/// A position in a listing: a workflow's `(created_at, id)`. It names no row, so a page goes on
/// from where the previous one ended even when that workflow has been deleted since, and
/// workflows launched meanwhile (newer) never shift what comes next.
#[derive(Debug, Clone, PartialEq)]
pub struct ListCursor {
    pub created_at: f64,
    pub workflow_id: WorkflowId,
}

/// One line of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedWorkflow {
    pub row: WorkflowRow,
    /// As [`StatusFilter::Recoverable`] decides, when the page was read.
    pub recoverable: bool,
    /// As [`StatusFilter::WaitingForInput`] decides, in the same read.
    pub waiting_for_input: bool,
    /// Its waits (see [`crate::WaitKind`]), in journal order, read for the whole page by one more
    /// statement (none unless its status is one of [`crate::WAITING_STATUSES`]).
    pub waits: Vec<crate::StepRow>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_kinds_read_back_from_their_stored_text_and_nothing_else_does() {
        assert_eq!(
            ControlKind::ALL.map(ControlKind::as_str),
            ["resume", "decide", "cancel"]
        );
        for kind in ControlKind::ALL {
            assert_eq!(ControlKind::parse(kind.as_str()), Some(kind));
            assert_eq!(
                serde_json::to_value(kind).expect("serializes"),
                serde_json::json!(kind.as_str())
            );
        }
        assert_eq!(ControlKind::parse("approve"), None);
        assert_eq!(
            ControlKind::read("approve", &WorkflowId::new("wf-1"), 7).map_err(|e| e.to_string()),
            Err(
                "database error: control 7 of workflow \"wf-1\" has an unknown kind \"approve\""
                    .to_owned()
            )
        );
    }
}
