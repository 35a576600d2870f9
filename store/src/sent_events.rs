//! Events sent to a workflow (`waitForEvent`'s input): any node records one, unfenced, as it
//! records a control; the owner takes it in the fenced write that journals the wait's outcome
//! ([`crate::WriteOp::TakeEvent`]). Kept until a wait takes it, taken once, in the order sent
//! per name; the sender's `event_id` makes sending idempotent.

use serde_json::Value;

use crate::{Error, WorkflowId, WorkflowStatus};

/// An event to record.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSentEvent {
    pub workflow_id: WorkflowId,
    /// The sender's id for it, unique per workflow (the id grammar).
    pub event_id: String,
    /// What a `waitForEvent` names (the id grammar).
    pub name: String,
    pub payload: Value,
    pub created_by: Option<String>,
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SentEvent {
    /// Its place among the workflow's events: a wait takes the oldest untaken one of its name.
    pub seq: i64,
    pub workflow_id: WorkflowId,
    pub event_id: String,
    pub name: String,
    pub payload: Value,
    pub created_by: Option<String>,
    /// When it was recorded (epoch seconds, the database's clock).
    pub created_at: f64,
    /// The step that took it, once one did.
    pub taken_by: Option<String>,
}

/// What sending an event did.
#[derive(Debug, Clone, PartialEq)]
pub enum EventSend {
    /// This call stored it.
    Stored(SentEvent),
    /// The same event (name and payload) was stored under this `event_id` already: still one
    /// row, the first.
    Repeated(SentEvent),
    /// The workflow has ended: it takes no events, and nothing was written.
    Ended(WorkflowStatus),
}

/// The answer to sending `new` when `existing` holds its `event_id`: a repeat if it says the
/// same, else a conflict naming what was sent first.
pub(crate) fn resent(existing: SentEvent, new: &NewSentEvent) -> Result<EventSend, Error> {
    if existing.name == new.name && existing.payload == new.payload {
        Ok(EventSend::Repeated(existing))
    } else {
        Err(Error::Conflict(format!(
            "event {:?} of workflow {:?} was sent already as {:?} with another payload",
            existing.event_id,
            existing.workflow_id.as_str(),
            existing.name
        )))
    }
}
