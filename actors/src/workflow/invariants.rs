//! The rules every batch of a workflow's machine keeps, whatever the event: checked on what the
//! machine decided, where it decided it (the machine hands each write and admission of a batch
//! here, in order). One broken is a bug, never an operating error, so they are checked in debug
//! builds (every test and every simulation seed) and cost nothing in a release build.

use std::collections::BTreeMap;

use store::{Fence, WorkflowStatus, WriteOp};

use crate::child_run::RunRequest;

/// What the checks remember from one batch to the next.
#[derive(Debug, Default)]
pub(super) struct Invariants {
    /// The highest attempt written of each step: a step's attempt only grows.
    highest_attempt: BTreeMap<String, i32>,
    /// A write that ends the workflow (a final status, or `needs_reconciliation`) was decided:
    /// nothing is admitted after it.
    ended: bool,
}

impl Invariants {
    /// An admission the machine that writes under `fence` asks for.
    pub(super) fn admitted(&mut self, fence: &Fence, request: &RunRequest) {
        assert!(
            !self.ended,
            "{}: an admission of {:?} after the workflow's end",
            fence.resource_id, request.idempotency_key
        );
        if let Some(step) = &request.step {
            // The epoch never goes back: every admission carries the machine's own fence,
            // never one it held before.
            assert_eq!(
                &step.fence, fence,
                "an admission under another fence than the machine's"
            );
            self.written(&step.journal);
        }
    }

    /// A write the machine decided on. A step's attempt only grows: each write names attempts
    /// no lower than the highest an earlier write named, besides the one a retry ends: the
    /// write that queues attempt `n` journals attempt `n - 1`'s failure with it (and is sent
    /// again as it was when the database wrote nothing).
    pub(super) fn written(&mut self, ops: &[WriteOp]) {
        let mut newest: BTreeMap<&str, i32> = BTreeMap::new();
        for op in ops {
            if let WriteOp::PutStep {
                step_id, attempt, ..
            } = op
            {
                let newest = newest.entry(step_id.as_str()).or_insert(*attempt);
                *newest = (*newest).max(*attempt);
            }
        }
        for op in ops {
            match op {
                WriteOp::SetWorkflow { status, .. }
                    if status.is_final() || *status == WorkflowStatus::NeedsReconciliation =>
                {
                    self.ended = true;
                }
                WriteOp::PutStep {
                    workflow_id,
                    step_id,
                    attempt,
                    ..
                } => {
                    let highest = self.highest_attempt.entry(step_id.clone()).or_insert(0);
                    let ends_the_one_before = newest
                        .get(step_id.as_str())
                        .is_some_and(|newest| *newest >= *highest && *attempt == newest - 1);
                    assert!(
                        *attempt >= *highest || ends_the_one_before,
                        "{workflow_id}: step {step_id:?} written at attempt {attempt} after \
                         attempt {highest}"
                    );
                    *highest = (*highest).max(*attempt);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use store::{StepStatus, WorkflowId};

    use super::*;

    fn step(attempt: i32) -> WriteOp {
        WriteOp::PutStep {
            workflow_id: WorkflowId::new("wf"),
            seq: 0,
            step_id: "a".into(),
            attempt,
            status: StepStatus::Running,
            record: store::StepRecord::decode("agent", &json!({})).expect("a step record"),
        }
    }

    #[test]
    fn a_steps_attempt_may_stay_or_grow() {
        let mut invariants = Invariants::default();
        invariants.written(&[step(1), step(1), step(2)]);
    }

    #[test]
    fn a_retry_ends_the_attempt_before_the_one_it_queues_even_when_sent_again() {
        let mut invariants = Invariants::default();
        invariants.written(&[step(1)]);
        invariants.written(&[step(1), step(2)]);
        invariants.written(&[step(1), step(2)]);
    }

    #[test]
    #[should_panic(expected = "written at attempt 1 after attempt 3")]
    fn a_retry_may_not_end_an_older_attempt() {
        let mut invariants = Invariants::default();
        invariants.written(&[step(3)]);
        invariants.written(&[step(1), step(2)]);
    }

    #[test]
    #[should_panic(expected = "written at attempt 1 after attempt 2")]
    fn a_steps_attempt_going_back_is_a_bug() {
        let mut invariants = Invariants::default();
        invariants.written(&[step(2)]);
        invariants.written(&[step(1)]);
    }
}
