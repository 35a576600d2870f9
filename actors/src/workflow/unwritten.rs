//! Journal writes a workflow supervisor has decided on but not yet committed.
//!
//! A step's outcome need not be durable before the script sees it, only before anything the
//! script does next leaves the process: the outcome is journaled in the same transaction as the
//! next thing the workflow writes (the next call's journal entry, its child run's admission, the
//! final status). A crash before that transaction finds the step's child run ended, and recovery
//! adopts the same outcome from it. What happens "once it is durable" (metrics, log lines, test
//! fault points) waits for that commit, so a replay never counts or logs a step twice, and a
//! write the database refused (a node fenced after a partition) counts and logs nothing.

use runtime::CallKind;
use store::{RunId, StepStatus, WorkflowStatus, WriteOp};

use super::reconciliation::Reconciliation;

/// What a journal write made true once it became durable: a step's progress, or the
/// workflow's end.
#[derive(Debug, Clone)]
pub(crate) enum Journaled {
    Started {
        step_id: String,
        kind: CallKind,
    },
    Finished {
        step_id: String,
        kind: CallKind,
        status: StepStatus,
    },
    /// The workflow ended, or stopped to wait for an operator's reconcile.
    Ended {
        status: WorkflowStatus,
        /// Why it waits for an operator (`needs_reconciliation` only).
        reconciliation: Option<Reconciliation>,
    },
}

/// Writes not yet committed, and what they will have made true once they are.
#[derive(Debug, Default)]
pub(crate) struct Unwritten {
    pub ops: Vec<WriteOp>,
    pub events: Vec<Journaled>,
}

impl Unwritten {
    /// Puts `earlier` in front of what is here, keeping the order the writes were decided in.
    pub fn restore(&mut self, mut earlier: Unwritten) {
        earlier.ops.append(&mut self.ops);
        earlier.events.append(&mut self.events);
        *self = earlier;
    }
}

/// The unwritten journal of a workflow handed to the admission of its one pending agent call:
/// committed in the admission's transaction if the child run is admitted, and written by the
/// supervisor itself (with the call journaled `queued`) otherwise.
#[derive(Debug)]
pub(crate) struct Carried {
    /// The call being admitted.
    pub call: runtime::CallId,
    /// The run id the admission uses, so that the journal entry can name it.
    pub run_id: RunId,
    /// The writes before the call's own entry.
    pub before: Unwritten,
    /// The call's entry as `running` with its child run (written with an admission).
    pub running: WriteOp,
    /// The call's entry as `queued` (written when the admission did not admit).
    pub queued: WriteOp,
}
