//! What operators and metrics read: counts by status, the child slots held, and what a backup
//! made. Plain reads, no ownership involved.

use serde::Serialize;

/// How many rows have one status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusCount {
    pub status: String,
    pub count: i64,
}

/// A backup of the embedded database that [`crate::Store::backup`] made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackupReport {
    pub path: std::path::PathBuf,
    pub bytes: u64,
    /// The schema version the copy carries (what a node restoring it must understand).
    pub schema_version: i64,
}

/// One held child slot (`workflow_slots`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotRow {
    pub workflow_id: crate::WorkflowId,
    pub step_id: String,
    pub attempt: i32,
    pub created_at: f64,
}
