//! Child runs (the `runs` table): the types their operations take and return. Every write that
//! depends on owning a run is a compare-and-set on `owner_worker_id` (unique across restarts) and
//! on the row still being live; a write that finds the row changed writes nothing and says so.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::approval::{APPROVAL_DEADLINE, ApprovalSlot, pending_request_id};
use crate::{Error, Fence, RunId, RunStatus, WorkflowId};

/// The columns of a run, in the order both backends' row readers take them.
macro_rules! run_columns {
    () => {
        "run_id, thread_id, workflow, step_id, attempt, agent, status, owner_worker_id,
         lease_expires_at, cancel_action, error, output, idempotency_key, idempotency_request,
         metadata, total_tokens, message_count, stop_reason, revision, created_at, updated_at"
    };
}
pub(crate) use run_columns;

/// How a durable cancel request asks a run to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelAction {
    /// Stop now; keep what the agent did.
    Interrupt,
    /// Stop now and undo what the agent can undo.
    Rollback,
}

impl CancelAction {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelAction::Interrupt => "interrupt",
            CancelAction::Rollback => "rollback",
        }
    }

    pub fn parse(text: &str) -> Result<Self, Error> {
        match text {
            "interrupt" => Ok(CancelAction::Interrupt),
            "rollback" => Ok(CancelAction::Rollback),
            other => Err(Error::Database(format!("unknown cancel action {other:?}"))),
        }
    }
}

/// The workflow step a child run executes, and the slot rule it is admitted under.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowStep {
    pub workflow_id: WorkflowId,
    pub step_id: String,
    pub attempt: i32,
    /// Child runs holding a `workflow_slots` slot across the cluster at most
    /// (`max_active_children`); a step that finds none free is queued.
    pub slots_max: u64,
    /// The share of those slots the steps of all the workflows of this workflow's owner
    /// (`workflows.user_id`) are sure of (`max_active_children_per_user`). It binds only while
    /// another user waits below their own share (a step of theirs `queued` in a live workflow
    /// whose lease holds): then a step whose owner holds the share already is queued too, even
    /// with slots free, so that one user cannot keep every slot from another. With nobody else
    /// waiting, one user's steps may take every slot.
    pub slots_per_user_max: u64,
    /// Slots kept free for other users (`active_children_reserved`): a step whose owner holds
    /// their share already (`slots_per_user_max`, less what the carried journal gives back) is
    /// queued when it would leave fewer than this many slots free, whether or not anybody waits,
    /// so that another user's first step finds a slot at once even while one user's long agents
    /// hold all the others. A user below their share may take a kept slot. 0 keeps none; it binds
    /// only while the share does (`slots_per_user_max < slots_max`).
    pub slots_reserved: u64,
    /// The workflow's lease: admission happens only while it holds, in the same transaction.
    pub fence: Fence,
    /// Journal writes of the workflow that go with this admission: committed, under `fence`, in
    /// the admission's transaction if and only if the run is [`Admission::Admitted`]. (Queued,
    /// an earlier run, or an error: none of them is written, and the caller writes them itself.)
    pub journal: Vec<crate::WriteOp>,
}

/// A child run to admit.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    pub run_id: RunId,
    pub thread_id: String,
    pub agent: String,
    /// This node's `worker_id`: the run's first owner, which starts it at once (it is admitted
    /// `running`).
    pub owner: String,
    pub lease_ms: u64,
    /// Same key and same request: the same run. Same key, different request: a conflict.
    pub idempotency: Option<(String, Value)>,
    pub metadata: Value,
    pub step: Option<WorkflowStep>,
}

/// What admission did.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// A new run row, `pending`, owned by the caller.
    Admitted(RunRow),
    /// The idempotency key named a run admitted before with the same request.
    Existing(RunRow),
    /// Every slot is taken; nothing was written. Try again when a slot frees.
    Queued,
}

/// What claiming the slot of an answered run ([`crate::Runs::claim_run_slot`]) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSlot {
    /// The run's step holds a slot: claimed now, or held already.
    Held,
    /// No slot for it now (every slot is taken, its owner holds their share while another user
    /// waits, or it would take a slot kept for others): nothing was written; ask again when one
    /// frees.
    Queued,
    /// The run is not the caller's `running` run of a step, without a cancel request, of a
    /// running, paused or waiting_approval workflow: nothing was written.
    Refused,
}

/// A row of `runs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunRow {
    pub run_id: RunId,
    pub thread_id: String,
    pub workflow: Option<WorkflowId>,
    pub step_id: Option<String>,
    pub attempt: Option<i32>,
    pub agent: String,
    pub status: RunStatus,
    pub owner_worker_id: Option<String>,
    pub lease_expires_at: Option<f64>,
    pub cancel_action: Option<CancelAction>,
    pub error: Option<String>,
    pub output: Option<Value>,
    pub idempotency_key: Option<String>,
    pub idempotency_request: Option<Value>,
    pub metadata: Value,
    pub total_tokens: i64,
    pub message_count: i64,
    pub stop_reason: Option<String>,
    /// Incremented by every change of the row's status, outcome, metadata or cancel request.
    pub revision: i64,
    pub created_at: f64,
    pub updated_at: f64,
}

/// A terminal outcome to record.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub error: Option<String>,
    pub output: Option<Value>,
    pub stop_reason: Option<String>,
    /// Recorded in the same compare-and-set as the outcome, so completion data can never land
    /// without it.
    pub total_tokens: i64,
    pub message_count: i64,
    /// What a failed run says about trying its step again (kept as `metadata.failure`, in the
    /// same compare-and-set).
    pub failure: Option<RunFailure>,
}

/// How a run failed, and what that says about trying its step again: what the agent (or the
/// node that stopped it) said, kept in the run's `metadata.failure`. The workflow's retry
/// policy decides with it; nothing here decides by itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunFailure {
    /// `timeout`: the node stopped the attempt at its `attemptMs` or `idleMs`; `error`
    /// otherwise.
    #[serde(default)]
    pub class: FailureClass,
    /// A short code a policy's `nonRetryable` list can name: the agent's own, or what the node
    /// classified (`http_429`, `http_400`, `connection`, `exit_3`, `attempt_timeout`,
    /// `idle_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Whether a retry may succeed, when the agent said (`None`: it did not say, and the
    /// policy's default holds: retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// The wait before a retry the agent (or its provider's `Retry-After`) asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// Whether a run failed by itself or was stopped for its time (see [`RunFailure`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    #[default]
    Error,
    Timeout,
}

impl RunFailure {
    /// The failure a run's metadata records, if any (a record that cannot be read is none: the
    /// policy's default holds).
    pub fn of(metadata: &Value) -> Option<RunFailure> {
        metadata
            .get("failure")
            .and_then(|failure| serde_json::from_value(failure.clone()).ok())
    }

    /// As stored in `metadata.failure`.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// An acknowledged lease renewal of a child run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRenewal {
    /// The new deadline, epoch seconds by the database clock.
    pub expires_at: f64,
    /// The database clock when it renewed, so the caller can turn the deadline into a local one
    /// without comparing clocks.
    pub now: f64,
    /// A durable cancel request waiting for the run, if any.
    pub cancel_action: Option<CancelAction>,
    /// The answer to the approval the run's live agent waits for, once a human gave it
    /// (`metadata.hitl_answer`: `{"request_id", "answer"}`).
    pub answer: Option<Value>,
}

/// Proof that this caller's answer consumed a pause, and what to put back to undo it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalAnswer {
    pub run_id: RunId,
    pub thread_id: String,
    /// The metadata the paused run had, `hitl_approval` included.
    pub previous_metadata: Value,
    /// The row's revision the answer wrote: a restore happens only if it is still the latest.
    pub revision: i64,
    /// The status the answer moved the run to (`success`, or `running` for an attached agent).
    pub status: RunStatus,
}

/// The run an idempotency key already names, if the request matches; a conflict if it does not.
pub(crate) fn replay(existing: RunRow, request: &Value) -> Result<Admission, Error> {
    if existing.idempotency_request.as_ref() == Some(request) {
        Ok(Admission::Existing(existing))
    } else {
        Err(Error::Conflict(format!(
            "idempotency key {:?} was used for a different request",
            existing.idempotency_key.unwrap_or_default()
        )))
    }
}

/// An approval request whose deadline passed with nobody's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpiredApproval {
    pub run_id: RunId,
    pub thread_id: String,
    /// The request it waits for (`metadata.hitl_approval.request_id`).
    pub request_id: String,
    /// What the agent asked to do, kept with the answer.
    pub actions: Value,
}

impl ExpiredApproval {
    /// The request of paused run `row`, if its deadline is at or before `now_ms`.
    pub(crate) fn of(row: &RunRow, now_ms: f64) -> Option<ExpiredApproval> {
        let deadline = row.metadata.get(APPROVAL_DEADLINE)?.as_f64()?;
        (row.status == RunStatus::WaitingForInput && deadline <= now_ms).then(|| ExpiredApproval {
            run_id: row.run_id.clone(),
            thread_id: row.thread_id.clone(),
            request_id: pending_request_id(&row.metadata)
                .unwrap_or_default()
                .to_owned(),
            actions: ApprovalSlot::of(&row.metadata)
                .asked()
                .map_or(Value::Null, |asked| asked.actions.clone()),
        })
    }
}
