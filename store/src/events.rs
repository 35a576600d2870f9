//! A workflow's events as read back. They are written by triggers (migration 18) in the
//! transaction of the change they describe, so what a reader sees is what committed; see
//! ARCHITECTURE.md for the kinds and why their numbers commit in order.

use serde_json::Value;

use crate::{WorkflowId, WorkflowStatus};

/// One event.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub workflow_id: WorkflowId,
    /// The workflow's own number of the event: 1, 2, 3, ... without gaps. For an event of the
    /// feed, the feed's number instead.
    pub seq: i64,
    /// `status`, `step_journaled`, `step_started`, `step_finished`, `pause_waiting`,
    /// `checkpoint_waiting`, `pause_resumed`, `checkpoint_decided`, `cancel_requested`,
    /// `artifact`, `approval_requested`, `approval_answered`.
    pub kind: String,
    /// The kind's fields (a JSON object).
    pub data: Value,
    /// When it committed, epoch seconds on the database clock.
    pub created_at: f64,
}

/// A workflow's events after a number, read as of one moment with the workflow's status.
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    /// At most the limit asked for, oldest first.
    pub events: Vec<EventRow>,
    pub status: WorkflowStatus,
    /// The workflow's newest event number.
    pub last_seq: i64,
}

impl EventPage {
    /// Whether a reader that has everything up to `after` has seen the workflow's last event.
    pub fn ended(&self, after: i64) -> bool {
        self.events.is_empty() && after >= self.last_seq && self.status.is_final()
    }
}
