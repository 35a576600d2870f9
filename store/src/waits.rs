//! What a live workflow waits for, read from its journal: a sleep's timer, an event of a name,
//! a person (a pause, a checkpoint, an agent's approval request), a slot for a queued agent
//! attempt, or a retry's backoff. Nothing of it is stored: the journal's unsettled entries say
//! it (their *waits*, [`crate::Snapshot::waits`] and [`crate::ListedWorkflow::waits`]), so
//! nothing can disagree with what the workflow does. The workflow's stored status stays as it
//! is (`running` while it sleeps): the status is the state machine's, this is what people read
//! beside it.
//!
//! A workflow's waits are the entries of a waiting status ([`WAITING_STATUSES`]) that are
//! `running` `sleep`, `waitForEvent`, `pause` and `humanCheckpoint` calls, `queued` `agent`
//! attempts, and `running` `agent` attempts whose child run waits for a person's answer. They
//! are bounded by the calls a script has in flight (`parallel_max`), whatever the journal's
//! length. Each backend reads them with one statement for a record and one for a page of a
//! listing (never one per listed workflow), and keeps a listing to one kind by the same rules
//! ([`WaitKind::of`]).

use std::fmt;

use serde::{Serialize, Serializer};

use crate::status::stored_text;
use crate::{StepCall, StepRow, StepStatus, WorkflowStatus};

/// The statuses of a workflow whose waits are read: live and run by its script. A workflow
/// that is cancelling, waits for an operator or ended waits for none of its calls.
pub const WAITING_STATUSES: [WorkflowStatus; 3] = [
    WorkflowStatus::Running,
    WorkflowStatus::Paused,
    WorkflowStatus::WaitingApproval,
];

/// What a call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitKind {
    /// A `sleep` or `sleepUntil`: its due time.
    Sleep,
    /// A `waitForEvent`: an event of its name (or its deadline).
    Event,
    /// A `pause`, a `humanCheckpoint`, or an agent's approval request: a person's answer.
    Person,
    /// A queued `agent` attempt: a slot (or the end of the attempt before's run).
    Slot,
    /// An `agent` attempt its retry policy queued: its backoff's due time.
    Retry,
}

impl WaitKind {
    /// Every kind, in the order messages name them.
    pub const ALL: [WaitKind; 5] = [
        WaitKind::Sleep,
        WaitKind::Event,
        WaitKind::Person,
        WaitKind::Slot,
        WaitKind::Retry,
    ];

    /// Its name in the API (`waiting_for[].kind`, `?waiting_for=`).
    pub const fn as_str(self) -> &'static str {
        match self {
            WaitKind::Sleep => "sleep",
            WaitKind::Event => "event",
            WaitKind::Person => "person",
            WaitKind::Slot => "slot",
            WaitKind::Retry => "retry",
        }
    }

    /// What one of a workflow's waits waits for at `now_ms` (epoch milliseconds): a queued
    /// attempt whose retry is due waits for a slot. `None` for an entry that is no wait.
    pub fn of(step: &StepRow, now_ms: i64) -> Option<WaitKind> {
        let call = &step.record()?.call;
        match (step.status, call) {
            (StepStatus::Running, StepCall::Sleep { .. }) => Some(WaitKind::Sleep),
            (StepStatus::Running, StepCall::WaitForEvent { .. }) => Some(WaitKind::Event),
            (StepStatus::Running, StepCall::Pause { .. } | StepCall::HumanCheckpoint { .. }) => {
                Some(WaitKind::Person)
            }
            // A running attempt is among the waits only when its run asks a person.
            (StepStatus::Running, StepCall::Agent { .. }) => Some(WaitKind::Person),
            (StepStatus::Queued, StepCall::Agent { retry, .. }) => Some(match retry {
                Some(wait) if wait.due_at_ms > now_ms => WaitKind::Retry,
                _ => WaitKind::Slot,
            }),
            _ => None,
        }
    }
}

stored_text!(WaitKind);

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{RetryWait, StepKind, StepRecord};

    fn entry(status: StepStatus, call: StepCall) -> StepRow {
        let kind = call.kind();
        let record = StepRecord {
            call,
            ..StepRecord::new(kind, json!({"stepId": "s"}))
        };
        StepRow::decoded(
            1,
            "s".into(),
            2,
            status,
            (kind.as_str(), &record.encode()),
            0.0,
        )
    }

    #[test]
    fn each_waiting_entry_says_what_it_waits_for_and_a_due_retry_waits_for_a_slot() {
        let retry = |due_at_ms| StepCall::Agent {
            child: None,
            previous_run_id: None,
            detached: false,
            run_status: None,
            retry: Some(Box::new(RetryWait {
                due_at_ms,
                first_at_ms: 0,
                reason: None,
                max_attempts: Some(3),
            })),
            closing: false,
        };
        let of = |status, call| WaitKind::of(&entry(status, call), 5_000);
        assert_eq!(
            of(StepStatus::Running, StepCall::Sleep { due_at_ms: Some(9) }),
            Some(WaitKind::Sleep)
        );
        assert_eq!(
            of(StepStatus::Running, StepCall::new(StepKind::WaitForEvent)),
            Some(WaitKind::Event)
        );
        for kind in [StepKind::Pause, StepKind::HumanCheckpoint, StepKind::Agent] {
            assert_eq!(
                of(StepStatus::Running, StepCall::new(kind)),
                Some(WaitKind::Person)
            );
        }
        assert_eq!(
            of(StepStatus::Queued, StepCall::new(StepKind::Agent)),
            Some(WaitKind::Slot)
        );
        assert_eq!(of(StepStatus::Queued, retry(6_000)), Some(WaitKind::Retry));
        assert_eq!(of(StepStatus::Queued, retry(5_000)), Some(WaitKind::Slot));
        assert_eq!(
            of(StepStatus::Completed, StepCall::Sleep { due_at_ms: None }),
            None
        );
        assert_eq!(
            of(
                StepStatus::Running,
                StepCall::new(StepKind::CaptureArtifact)
            ),
            None
        );
        for kind in WaitKind::ALL {
            assert_eq!(WaitKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(WaitKind::parse("nap"), None);
    }
}
