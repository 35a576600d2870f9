//! A workflow's status: the one definition of which statuses exist, which are live, which hold a
//! place under the launch limits and which are final. The database keeps it as text
//! (`workflows.status`); [`WorkflowStatus::as_str`] and [`WorkflowStatus::parse`] are the two
//! directions, and the string lists SQL binds are derived from the enum here.

use std::fmt;

use serde::{Serialize, Serializer};

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

    /// The status a stored text names, if any.
    pub fn parse(stored: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|status| status.as_str() == stored)
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

impl fmt::Display for WorkflowStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for WorkflowStatus {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl rusqlite::ToSql for WorkflowStatus {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.as_str().into())
    }
}

impl tokio_postgres::types::ToSql for WorkflowStatus {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.as_str().to_sql(ty, out)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <&str as tokio_postgres::types::ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A set of statuses, for deriving its stored texts at compile time.
#[derive(Clone, Copy)]
enum Set {
    Live,
    Counted,
    Final,
}

impl Set {
    const fn holds(self, status: WorkflowStatus) -> bool {
        match self {
            Set::Live => status.is_live(),
            Set::Counted => status.holds_place(),
            Set::Final => status.is_final(),
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

/// [`WorkflowStatus::is_final`] as stored texts.
pub const FINAL_STATUSES: [&str; 3] = stored(Set::Final);

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
        assert_eq!(FINAL_STATUSES, ["completed", "failed", "cancelled"]);
    }
}
