//! The rules every batch of a workflow's machine keeps, whatever the event: checked on what the
//! machine decided, where it decided it. One broken is a bug, never an operating error, so they
//! are checked in debug builds (every test and every simulation seed) and cost nothing in a
//! release build.

use std::collections::BTreeMap;

use store::{Fence, WorkflowStatus, WriteOp};

use super::machine::Effect;

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
    /// Checks one batch of effects of the machine that writes under `fence`.
    pub(super) fn check(&mut self, fence: &Fence, out: &[Effect]) {
        if !cfg!(debug_assertions) {
            return;
        }
        for effect in out {
            match effect {
                Effect::Write(ops) => self.check_writes(ops),
                Effect::Admit { request, .. } => {
                    assert!(
                        !self.ended,
                        "{}: an admission of {:?} after the workflow's end",
                        fence.resource_id, request.idempotency_key
                    );
                    if let Some(step) = &request.step {
                        // The epoch never goes back: every admission carries the machine's own
                        // fence, never one it held before.
                        assert_eq!(
                            &step.fence, fence,
                            "an admission under another fence than the machine's"
                        );
                        self.check_writes(&step.journal);
                    }
                }
                _ => {}
            }
        }
    }

    fn check_writes(&mut self, ops: &[WriteOp]) {
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
                    assert!(
                        *attempt >= *highest,
                        "{workflow_id}: step {step_id:?} written at attempt {attempt} after \
                         attempt {highest}"
                    );
                    *highest = *attempt;
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use store::{Epoch, StepStatus, WorkflowId};

    use super::*;

    fn step(attempt: i32) -> WriteOp {
        WriteOp::PutStep {
            workflow_id: WorkflowId::new("wf"),
            seq: 0,
            step_id: "a".into(),
            attempt,
            kind: "agent".into(),
            status: StepStatus::Running,
            data: json!({}),
        }
    }

    fn fence() -> Fence {
        Fence {
            resource_id: WorkflowId::new("wf"),
            owner: "node".into(),
            epoch: Epoch::new(2),
        }
    }

    #[test]
    fn a_steps_attempt_may_stay_or_grow() {
        let mut invariants = Invariants::default();
        invariants.check(&fence(), &[Effect::Write(vec![step(1), step(1), step(2)])]);
    }

    #[test]
    #[should_panic(expected = "written at attempt 1 after attempt 2")]
    fn a_steps_attempt_going_back_is_a_bug() {
        let mut invariants = Invariants::default();
        invariants.check(&fence(), &[Effect::Write(vec![step(2)])]);
        invariants.check(&fence(), &[Effect::Write(vec![step(1)])]);
    }
}
