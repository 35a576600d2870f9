//! `humanCheckpoint`: waits for a `decide` control of its step, bound to the artifact version
//! it reviews (the front door checks the binding when the decision is recorded); the decision
//! is the call's value. Its deadline (`timeoutMs`, `deadline.rs`) records the decision of its
//! `onTimeout` (`reject` unless it says `approve` or `fail`), decided `by: "timeout"`; `fail`
//! fails the step with status `timeout` (transitions: [`Checkpoint`]).

use runtime::{Command, Outcome};
use serde_json::json;
use store::{ControlKind, ControlRow};

use super::deadline::{by_timeout, timeout_error};
use super::transitions::{Checkpoint, Transition};
use super::{Effect, Millis, Waiting, WorkflowMachine};

impl WorkflowMachine {
    /// A new checkpoint: waits for its control, and for its deadline, if it has one.
    pub(super) fn begin_checkpoint(
        &mut self,
        out: &mut Vec<Effect>,
        command: Command,
        now: Millis,
    ) {
        self.took(&command.step_id, Transition::Checkpoint(Checkpoint::Begun));
        self.arm_deadline(out, &command, now);
        let waiting = Waiting::Control(ControlKind::Decide);
        self.waiting.insert(command.id, (waiting, command));
    }

    /// What a `decide` control gives `command`'s checkpoint: the decision, who made it (the
    /// deadline's is `timeout`), when it was applied, and the comment.
    pub(super) fn decided(&self, command: &Command, control: &ControlRow, now: Millis) -> Outcome {
        if by_timeout(control) && control.body["decision"] == "fail" {
            self.took(
                &command.step_id,
                Transition::Checkpoint(Checkpoint::TimedOut),
            );
            return Outcome::Rejected(timeout_error(command));
        }
        self.took(
            &command.step_id,
            Transition::Checkpoint(Checkpoint::Decided),
        );
        let decided_by = match by_timeout(control) {
            true => Some(super::deadline::BY_TIMEOUT.to_owned()),
            false => control.created_by.clone(),
        };
        Outcome::Resolved(json!({
            "decision": control.body["decision"],
            "decidedBy": decided_by,
            "decidedAt": now,
            "comment": control.body.get("comment"),
        }))
    }
}
