//! Events sent to a workflow (`waitForEvent`'s input): any node records one, unfenced, as it
//! records a control; the owner takes it in the fenced write that journals the wait's outcome
//! ([`crate::WriteOp::TakeEvent`]). Kept until a wait takes it, taken once, in the order sent
//! per name; the sender's `event_id` makes sending idempotent. The events a workflow holds
//! untaken are bounded, in number and in payload bytes ([`EventBounds`]): past either, a new
//! event is refused with nothing written, while a repeat of one stored is still answered. Every
//! event's payload bytes count against its workflow owner's quota, taken or not, until the
//! workflow is deleted. A wait reads only the oldest untaken events of the names it waits for
//! ([`crate::Store::pending_events`]), through an index that never reads another's payload.

use serde_json::Value;

use crate::error::Limit;
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
    /// What the workflow may hold untaken, this event included.
    pub bounds: EventBounds,
    /// The owner's quota (`limits.user_stored_bytes_max`; 0: none): a new event's payload
    /// bytes are taken from it as a grant of the workflow, as [`crate::WriteOp::TakeStorage`]
    /// takes one, and refused past it ([`crate::Limit::StoredBytes`]) with nothing written.
    pub stored_bytes_max: i64,
}

/// The events one workflow holds untaken at most (`limits.untaken_events_per_workflow_max`)
/// and their payloads' bytes as JSON text (`limits.untaken_event_bytes_per_workflow_max`); 0:
/// no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventBounds {
    pub untaken_max: i64,
    pub untaken_bytes_max: i64,
}

impl EventBounds {
    /// No bound at all.
    pub const NONE: EventBounds = EventBounds {
        untaken_max: 0,
        untaken_bytes_max: 0,
    };

    /// Refuses a new event of `bytes` when the workflow holds `untaken` events of `held` bytes
    /// already (read under the lock that orders the workflow's sends).
    pub(crate) fn check(&self, untaken: i64, held: i64, bytes: i64) -> Result<(), Error> {
        if self.untaken_max > 0 && untaken >= self.untaken_max {
            return Err(Error::LimitReached(Limit::UntakenEvents {
                max: self.untaken_max,
            }));
        }
        if self.untaken_bytes_max > 0 && held.saturating_add(bytes) > self.untaken_bytes_max {
            return Err(Error::LimitReached(Limit::UntakenEventBytes {
                held,
                max: self.untaken_bytes_max,
            }));
        }
        Ok(())
    }
}

impl NewSentEvent {
    /// Its payload's bytes as JSON text: what [`EventBounds`] counts.
    pub(crate) fn payload_bytes(&self) -> i64 {
        i64::try_from(self.payload.to_string().len()).unwrap_or(i64::MAX)
    }
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
    /// The workflow has ended: it takes no events, and nothing was written (a repeat of an
    /// event it stored is still [`EventSend::Repeated`]).
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
