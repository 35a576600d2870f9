//! The statuses of what the store keeps, each the one definition of which statuses exist and
//! which are final: a workflow's (`workflows.status`: also which are live and which hold a place
//! under the launch limits), a journal entry's (`workflow_steps.status`) and a child run's
//! (`runs.status`). The database keeps each as text; `as_str` and `parse` are the two directions,
//! each binds to SQL as its text, and a row read back with a text none of them names is a store
//! error naming the row, never a default. The string lists SQL binds are derived from
//! [`WorkflowStatus`] here.

use std::fmt;

use serde::{Deserialize, Serialize, Serializer};

use crate::{Error, RunId, WorkflowId};

/// Implements what every stored status has from its `ALL` and `as_str`: `parse`, `Display`,
/// serialization as the stored text, binding to SQL as that text on both backends.
macro_rules! stored_text {
    ($status:ident) => {
        impl $status {
            /// The status a stored text names, if any.
            pub fn parse(stored: &str) -> Option<Self> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|status| status.as_str() == stored)
            }
        }

        impl fmt::Display for $status {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl Serialize for $status {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl rusqlite::ToSql for $status {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(self.as_str().into())
            }
        }

        impl tokio_postgres::types::ToSql for $status {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut tokio_postgres::types::private::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
            {
                self.as_str().to_sql(ty, out)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }
    };
}

/// A workflow's status as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkflowStatus {
    Running,
    Paused,
    WaitingApproval,
    Cancelling,
    Completed,
    Failed,
    Cancelled,
    /// Waits for an operator's reconcile: live, but holding no place under the launch limits.
    NeedsReconciliation,
}

impl WorkflowStatus {
    /// Every status, in the order listings and error messages name them.
    pub const ALL: [WorkflowStatus; 8] = [
        WorkflowStatus::Running,
        WorkflowStatus::Paused,
        WorkflowStatus::WaitingApproval,
        WorkflowStatus::Cancelling,
        WorkflowStatus::Completed,
        WorkflowStatus::Failed,
        WorkflowStatus::Cancelled,
        WorkflowStatus::NeedsReconciliation,
    ];

    /// The stored text.
    pub const fn as_str(self) -> &'static str {
        match self {
            WorkflowStatus::Running => "running",
            WorkflowStatus::Paused => "paused",
            WorkflowStatus::WaitingApproval => "waiting_approval",
            WorkflowStatus::Cancelling => "cancelling",
            WorkflowStatus::Completed => "completed",
            WorkflowStatus::Failed => "failed",
            WorkflowStatus::Cancelled => "cancelled",
            WorkflowStatus::NeedsReconciliation => "needs_reconciliation",
        }
    }

    /// A workflow row's stored status, or the store error naming the row.
    pub(crate) fn read(stored: &str, workflow_id: &WorkflowId) -> Result<Self, Error> {
        Self::parse(stored).ok_or_else(|| {
            Error::Database(format!(
                "workflow {workflow_id:?} has an unknown status {stored:?}"
            ))
        })
    }

    /// Final: nothing changes the workflow any more, and it writes no more events.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            WorkflowStatus::Completed | WorkflowStatus::Failed | WorkflowStatus::Cancelled
        )
    }

    /// Live: not final, so a takeover (recover, reconcile, cancel) may apply.
    pub const fn is_live(self) -> bool {
        !self.is_final()
    }

    /// Holds a place under `max_workflows` and `max_workflows_per_owner` (the live set of spec
    /// section 3), and may be shown as recoverable. `needs_reconciliation` holds none, so that
    /// nobody is locked out by workflows only an operator can settle; a reconcile takes the
    /// places back or is refused.
    pub const fn holds_place(self) -> bool {
        self.is_live() && !matches!(self, WorkflowStatus::NeedsReconciliation)
    }
}

pub(crate) use stored_text;

stored_text!(WorkflowStatus);

/// A journal entry's status (`workflow_steps.status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepStatus {
    /// An agent call waiting for a slot (its admission not yet made).
    Queued,
    /// Begun: its child run admitted, or waiting for a person, a capture or a read.
    Running,
    Completed,
    Failed,
    /// Ended by a cancellation, or left behind by a failed `parallel`.
    Cancelled,
}

impl StepStatus {
    /// Every status.
    pub const ALL: [StepStatus; 5] = [
        StepStatus::Queued,
        StepStatus::Running,
        StepStatus::Completed,
        StepStatus::Failed,
        StepStatus::Cancelled,
    ];

    /// The stored text.
    pub const fn as_str(self) -> &'static str {
        match self {
            StepStatus::Queued => "queued",
            StepStatus::Running => "running",
            StepStatus::Completed => "completed",
            StepStatus::Failed => "failed",
            StepStatus::Cancelled => "cancelled",
        }
    }

    /// Final: the entry holds its call's outcome, and replay answers the call from it.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            StepStatus::Completed | StepStatus::Failed | StepStatus::Cancelled
        )
    }

    /// A journal row's stored status, or the store error naming the row.
    pub(crate) fn read(stored: &str, workflow_id: &WorkflowId, seq: i32) -> Result<Self, Error> {
        Self::parse(stored).ok_or_else(|| {
            Error::Database(format!(
                "journal entry {seq} of workflow {workflow_id:?} has an unknown status {stored:?}"
            ))
        })
    }
}

stored_text!(StepStatus);

/// The status of a child run (`runs.status`, spec section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Admitted, not yet started by its owner.
    Pending,
    Running,
    Success,
    Error,
    Interrupted,
    /// Paused for a person's answer (`metadata.hitl_approval`).
    WaitingForInput,
}

impl RunStatus {
    /// Every status.
    pub const ALL: [RunStatus; 6] = [
        RunStatus::Pending,
        RunStatus::Running,
        RunStatus::Success,
        RunStatus::Error,
        RunStatus::Interrupted,
        RunStatus::WaitingForInput,
    ];

    /// The stored text.
    pub const fn as_str(self) -> &'static str {
        match self {
            RunStatus::Pending => "pending",
            RunStatus::Running => "running",
            RunStatus::Success => "success",
            RunStatus::Error => "error",
            RunStatus::Interrupted => "interrupted",
            RunStatus::WaitingForInput => "waiting_for_input",
        }
    }

    /// Final: the run has an outcome that nothing may change any more.
    pub const fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Success | RunStatus::Error | RunStatus::Interrupted
        )
    }

    /// Holds its thread's one active place (`pending` or `running`).
    pub const fn is_active(self) -> bool {
        matches!(self, RunStatus::Pending | RunStatus::Running)
    }

    /// A run row's stored status, or the store error naming the row.
    pub(crate) fn read(stored: &str, run_id: &RunId) -> Result<Self, Error> {
        Self::parse(stored).ok_or_else(|| {
            Error::Database(format!("run {run_id:?} has an unknown status {stored:?}"))
        })
    }
}

stored_text!(RunStatus);

/// A set of statuses, for deriving its stored texts at compile time.
#[derive(Clone, Copy)]
enum Set {
    Live,
    Counted,
}

impl Set {
    const fn holds(self, status: WorkflowStatus) -> bool {
        match self {
            Set::Live => status.is_live(),
            Set::Counted => status.holds_place(),
        }
    }
}

/// The stored texts of the statuses in `set`, in [`WorkflowStatus::ALL`]'s order; `N` must be
/// their number, or the constant that asks fails to compile.
const fn stored<const N: usize>(set: Set) -> [&'static str; N] {
    let mut texts = [""; N];
    let mut found = 0;
    let mut i = 0;
    while i < WorkflowStatus::ALL.len() {
        let status = WorkflowStatus::ALL[i];
        if set.holds(status) {
            assert!(
                found < N,
                "more statuses in the set than the constant holds"
            );
            texts[found] = status.as_str();
            found += 1;
        }
        i += 1;
    }
    assert!(
        found == N,
        "fewer statuses in the set than the constant holds"
    );
    texts
}

/// [`WorkflowStatus::is_live`] as stored texts.
pub const LIVE_STATUSES: [&str; 5] = stored(Set::Live);

/// [`WorkflowStatus::holds_place`] as stored texts.
pub const COUNTED_STATUSES: [&str; 4] = stored(Set::Counted);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_reads_back_from_its_stored_text_and_nothing_else_does() {
        for status in WorkflowStatus::ALL {
            assert_eq!(WorkflowStatus::parse(status.as_str()), Some(status));
            assert_eq!(
                serde_json::to_value(status).expect("serializes"),
                serde_json::json!(status.as_str())
            );
        }
        assert_eq!(WorkflowStatus::parse("asleep"), None);
        assert_eq!(WorkflowStatus::parse("recoverable"), None);
        assert_eq!(
            StepStatus::ALL.map(StepStatus::as_str),
            ["queued", "running", "completed", "failed", "cancelled"]
        );
        for status in StepStatus::ALL {
            assert_eq!(StepStatus::parse(status.as_str()), Some(status));
        }
        for status in RunStatus::ALL {
            assert_eq!(RunStatus::parse(status.as_str()), Some(status));
            let json = serde_json::to_value(status).expect("serializes");
            assert_eq!(json, serde_json::json!(status.as_str()));
            assert_eq!(serde_json::from_value::<RunStatus>(json).ok(), Some(status));
        }
        assert_eq!(StepStatus::parse("waiting_for_input"), None);
        assert_eq!(RunStatus::parse("completed"), None);
    }

    #[test]
    fn an_unknown_stored_status_is_an_error_naming_its_row() {
        let message = |error: Error| error.to_string();
        assert_eq!(
            WorkflowStatus::read("asleep", &WorkflowId::new("wf-1")).map_err(message),
            Err("database error: workflow \"wf-1\" has an unknown status \"asleep\"".to_owned())
        );
        assert_eq!(
            StepStatus::read("asleep", &WorkflowId::new("wf-1"), 3).map_err(message),
            Err(
                "database error: journal entry 3 of workflow \"wf-1\" has an unknown status \"asleep\""
                    .to_owned()
            )
        );
        assert_eq!(
            RunStatus::read("asleep", &RunId::new("run-1")).map_err(message),
            Err("database error: run \"run-1\" has an unknown status \"asleep\"".to_owned())
        );
        assert_eq!(
            WorkflowStatus::read("paused", &WorkflowId::new("wf-1")).ok(),
            Some(WorkflowStatus::Paused)
        );
    }

    #[test]
    fn the_stored_lists_are_the_sets_the_enum_defines() {
        assert_eq!(
            LIVE_STATUSES,
            [
                "running",
                "paused",
                "waiting_approval",
                "cancelling",
                "needs_reconciliation"
            ]
        );
        assert_eq!(
            COUNTED_STATUSES,
            ["running", "paused", "waiting_approval", "cancelling"]
        );
    }
}
