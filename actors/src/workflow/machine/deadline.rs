//! The deadline of a wait (`timeoutMs` of `pause`, `humanCheckpoint`, `waitForEvent`): when it
//! passes is fixed as the call is first journaled and written with it (as a `sleep`'s due time),
//! so a node that takes the workflow over honours the same moment, and a deadline that passed
//! while no node ran the workflow passes at once.
//!
//! A `pause` or `humanCheckpoint` is answered by a control, which any node may record for a
//! person at any time: its deadline's default answer (`onTimeout`) is recorded the same way,
//! through the same unique row, and then applied as any control is. So exactly one answer is
//! the step's, across nodes: a person's recorded first wins over the deadline, and a person who
//! answers after the deadline's is told it was decided `by: "timeout"`. A `waitForEvent` takes
//! no control: its deadline resolves it with `null`, and an event sent later stays for the next
//! wait (transitions: [`Deadline`]).

use runtime::{CallId, CallKind, Command, JournalEntry};
use serde_json::{Value, json};
use store::{ControlKind, ControlRow, ControlWrite, NewControl, StepCall};

use super::transitions::{Deadline, Transition};
use super::{ControlsFor, Effect, Event, Millis, WorkflowMachine};
use crate::backoff::store_backoff;

/// Who a deadline's control says answered (`body.by`): no person's control carries it.
pub(crate) const BY_TIMEOUT: &str = "timeout";

/// The call a wait journaled at `now` is, with its deadline when it takes a `timeoutMs`.
pub(super) fn journaled_call(entry: &JournalEntry, now: Millis) -> Option<StepCall> {
    let deadline_at_ms = entry.args["timeoutMs"]
        .as_i64()
        .map(|ms| now.saturating_add(ms));
    match entry.kind {
        CallKind::Pause => Some(StepCall::Pause { deadline_at_ms }),
        CallKind::HumanCheckpoint => Some(StepCall::HumanCheckpoint { deadline_at_ms }),
        CallKind::WaitForEvent => Some(StepCall::WaitForEvent {
            deadline_at_ms,
            event_seq: None,
        }),
        _ => None,
    }
}

/// Whether `control` is a deadline's answer.
pub(super) fn by_timeout(control: &ControlRow) -> bool {
    control.body["by"] == BY_TIMEOUT
}

/// The `StepError` of a wait whose deadline passed with nothing to resolve it with.
pub(super) fn timeout_error(command: &Command) -> Value {
    json!({
        "message": format!(
            "{} {:?} got no answer within {} ms",
            command.kind.as_str(),
            command.step_id,
            command.args["timeoutMs"]
        ),
        "status": "timeout",
    })
}

/// Who asked the control an [`Effect::PutControl`] records.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ControlBy {
    /// The workflow's own `timeout_seconds`: a cancel.
    WorkflowTimeout,
    /// The deadline of the wait of this call: its default answer.
    Deadline(CallId),
}

impl WorkflowMachine {
    /// The call `entry` is, with the time it journaled for itself (a sleep's due time, a wait's
    /// deadline), so that every later write of its entry keeps it.
    pub(super) fn timed_call(&self, entry: &JournalEntry) -> StepCall {
        let at = self.dues.get(&entry.seq).copied();
        match entry.kind {
            CallKind::Sleep => StepCall::Sleep { due_at_ms: at },
            CallKind::Pause => StepCall::Pause { deadline_at_ms: at },
            CallKind::HumanCheckpoint => StepCall::HumanCheckpoint { deadline_at_ms: at },
            CallKind::WaitForEvent => StepCall::WaitForEvent {
                deadline_at_ms: at,
                event_seq: None,
            },
            kind => StepCall::new(super::step_kind(kind)),
        }
    }

    /// Arms the deadline of call `id` when its entry has one.
    pub(super) fn arm_deadline(&self, out: &mut Vec<Effect>, command: &Command, now: Millis) {
        if let Some(deadline) = self.dues.get(&command.seq) {
            self.arm(out, command.id, *deadline, now);
        }
    }

    /// The deadline of the `pause` or `humanCheckpoint` of call `id` passed: its default
    /// answer is recorded as a control (a person's, if there first, stays).
    pub(super) fn deadline_passed(&mut self, out: &mut Vec<Effect>, id: CallId, command: &Command) {
        self.took(&command.step_id, Transition::Deadline(Deadline::Passed));
        #[cfg(test)]
        if crate::workflow::mutants::planted(crate::workflow::mutants::Mutant::DeadlineDecidesAlone)
        {
            let decided = json!({"decision": "reject", "decidedBy": BY_TIMEOUT});
            self.conclude(
                out,
                id,
                runtime::Outcome::Resolved(decided),
                Vec::new(),
                None,
                0,
            );
            return;
        }
        let (kind, body) = match command.kind {
            CallKind::HumanCheckpoint => {
                let decision = match command.args["onTimeout"].as_str() {
                    Some("approve") => "approve",
                    Some("fail") => "fail",
                    _ => "reject",
                };
                let body = json!({
                    "decision": decision,
                    "artifactVersion": command.args["artifactVersion"],
                    "by": BY_TIMEOUT,
                });
                (ControlKind::Decide, body)
            }
            _ => {
                let mut body = json!({"by": BY_TIMEOUT});
                if let Some(input) = command.args["onTimeout"].get("resume") {
                    body["input"] = input.clone();
                }
                (ControlKind::Resume, body)
            }
        };
        out.push(Effect::PutControl {
            control: NewControl {
                workflow_id: self.config.workflow_id.clone(),
                kind,
                step_id: command.step_id.clone(),
                attempt: 1,
                body,
                created_by: None,
            },
            by: ControlBy::Deadline(id),
        });
    }

    /// The deadline's control of call `id` was recorded, or not.
    pub(super) fn on_deadline_recorded(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        recorded: Result<ControlWrite, store::Error>,
    ) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        let step_id = command.step_id.clone();
        match recorded {
            // Whichever answer holds the row is applied, as a person's is.
            Ok(_) | Err(store::Error::Conflict(_)) => {
                self.took(&step_id, Transition::Deadline(Deadline::Recorded));
                out.push(Effect::ReadControls(ControlsFor::Poll));
            }
            Err(error) => {
                self.took(&step_id, Transition::Deadline(Deadline::Retried));
                tracing::warn!(parent: &self.span, %error, step_id, "cannot record the deadline's answer yet");
                self.read_tries += 1;
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::TimerDue(id),
                });
            }
        }
    }
}
