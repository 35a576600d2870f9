//! Why a workflow waits for an operator: the reasons the machine knows, each a fact about one
//! child run (or the journal) that a node cannot settle without guessing, and what a workflow
//! sent to `needs_reconciliation` records of it (`data.reconciliation`).

use store::RunId;

use super::journal::UnreadableJournal;

/// Why a workflow needs an operator's reconcile: each reason is a fact about one child run that
/// this node cannot settle without guessing at the agent's real effects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReconciliationReason {
    /// The orphan sweep closed the step's child run after its node died.
    OrphanedChild,
    /// The step's child run exists with no outcome (it may still run on a node that is gone).
    ChildOutcomeUnknown,
    /// The child run ended without its node recording the end (fenced, or its answer lost).
    ChildEndUnrecorded,
    /// A cancellation could not observe a child's end within its window (`2 × lease`).
    CancelWindowPassed,
    /// A row of the journal cannot be read, or a call is missing from it: replaying around it
    /// would put every later call on the wrong outcome.
    JournalUnreadable,
}

impl ReconciliationReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ReconciliationReason::OrphanedChild => "orphaned_child",
            ReconciliationReason::ChildOutcomeUnknown => "child_outcome_unknown",
            ReconciliationReason::ChildEndUnrecorded => "child_end_unrecorded",
            ReconciliationReason::CancelWindowPassed => "cancel_window_passed",
            ReconciliationReason::JournalUnreadable => "journal_unreadable",
        }
    }

    pub(super) fn message(self) -> &'static str {
        match self {
            ReconciliationReason::OrphanedChild => {
                "the child run's node died and the orphan sweep closed it; what the agent did is unknown"
            }
            ReconciliationReason::ChildOutcomeUnknown => {
                "the child run has no outcome and may still run on a node that is gone"
            }
            ReconciliationReason::ChildEndUnrecorded => {
                "the child run ended without its node recording the end; its outcome is unknown"
            }
            ReconciliationReason::CancelWindowPassed => {
                "the cancellation could not observe the child run's end within its window"
            }
            ReconciliationReason::JournalUnreadable => {
                "a journal row cannot be read or is missing; the workflow is not replayed around it"
            }
        }
    }
}

/// What a workflow sent to `needs_reconciliation` records about why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reconciliation {
    pub(super) reason: ReconciliationReason,
    pub(super) step_id: String,
    /// The step's child run; none when no row could be read to name one.
    pub(super) run_id: Option<RunId>,
    /// The sentence recorded for people: the reason's own, or one naming what was found.
    pub(super) message: String,
}

impl Reconciliation {
    pub(super) fn of_step(reason: ReconciliationReason, step_id: &str, run_id: &RunId) -> Self {
        Reconciliation {
            reason,
            step_id: step_id.to_owned(),
            run_id: Some(run_id.clone()),
            message: reason.message().to_owned(),
        }
    }

    pub(super) fn of_journal(unreadable: &UnreadableJournal) -> Self {
        Reconciliation {
            reason: ReconciliationReason::JournalUnreadable,
            step_id: unreadable.step_id.clone(),
            run_id: None,
            message: format!(
                "{}: {unreadable}",
                ReconciliationReason::JournalUnreadable.message()
            ),
        }
    }
}
