//! What a caller asks of the workflows on this node (the Rust API the HTTP layer calls): a
//! launch, a pause's input, a checkpoint's decision, an operator's reconcile, a retry. Plain data, read by
//! the front door and its rules.

use serde_json::Value;
use store::WorkflowId;

/// A request to start a workflow.
#[derive(Debug, Clone)]
pub struct LaunchRequest {
    pub user_id: String,
    pub request_id: Option<String>,
    /// What people call it (checked by the caller against `limits.title_chars_max`); kept in
    /// the workflow's document, read by no rule.
    pub title: Option<String>,
    /// Its life limit, over the node's `limits.timeout_seconds` (checked by `rules::launch`).
    pub timeout_seconds: Option<u64>,
    pub script: String,
    pub args: Value,
}

/// A `resume` of a pause, as a caller asked for it.
#[derive(Debug, Clone)]
pub struct Resume {
    pub workflow_id: WorkflowId,
    /// The digest of script and args the caller saw; a different one is refused (stale).
    pub fingerprint: Option<String>,
    pub step_id: String,
    pub attempt: i32,
    pub input: Value,
}

/// An event sent to a workflow (`waitForEvent`), as a caller sent it.
#[derive(Debug, Clone)]
pub struct SendEvent {
    pub workflow_id: WorkflowId,
    /// The sender's id for it: the same id again is the same event.
    pub event_id: String,
    pub name: String,
    pub payload: Value,
}

/// A decision on a checkpoint, as a caller asked for it.
#[derive(Debug, Clone)]
pub struct Decide {
    pub workflow_id: WorkflowId,
    pub step_id: String,
    pub attempt: i32,
    /// The artifact version the person looked at; the checkpoint must be about this one.
    pub artifact_version: u64,
    /// `approve` or `reject`.
    pub decision: String,
    pub comment: Option<String>,
}

/// How an operator settles a step whose child run's outcome was unknown, after checking the
/// child's real effects.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// Run the step again as attempt + 1 (the old child run stays on record).
    Retry,
    /// The step failed.
    Fail,
    /// The step succeeded with this output.
    Complete(Value),
}

/// A reconcile, as an operator asked for it.
#[derive(Debug, Clone)]
pub struct ReconcileRequest {
    pub workflow_id: WorkflowId,
    pub step_id: String,
    pub resolution: Resolution,
    pub reason: String,
    pub by: String,
}

/// A failed workflow to run again from its failed step, as a new workflow (see `rules::retry`).
#[derive(Debug, Clone)]
pub struct RetryRequest {
    pub workflow_id: WorkflowId,
    /// Makes the retry idempotent as a launch's `request_id` does (the retry is its source's
    /// owner's workflow, under this id).
    pub request_id: Option<String>,
}
