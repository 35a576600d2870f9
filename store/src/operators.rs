//! What operators and metrics read: counts by status and the child slots held. Plain reads, no
//! ownership involved.

use serde::Serialize;

/// How many rows have one status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusCount {
    pub status: String,
    pub count: i64,
}

/// One held child slot (`workflow_slots`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotRow {
    pub workflow_id: crate::WorkflowId,
    pub step_id: String,
    pub attempt: i32,
    pub created_at: f64,
}
