//! `humanCheckpoint`: waits for a `decide` control of its step, bound to the artifact version
//! it reviews (the front door checks the binding when the decision is recorded); the decision
//! is the call's value (transitions: [`Checkpoint`]).

use runtime::{Command, Outcome};
use serde_json::json;
use store::{ControlKind, ControlRow};

use super::transitions::{Checkpoint, Transition};
use super::{Millis, Waiting, WorkflowMachine};

impl WorkflowMachine {
    /// A new checkpoint: waits for its control.
    pub(super) fn begin_checkpoint(&mut self, command: Command) {
        self.took(&command.step_id, Transition::Checkpoint(Checkpoint::Begun));
        let waiting = Waiting::Control(ControlKind::Decide);
        self.waiting.insert(command.id, (waiting, command));
    }

    /// What a `decide` control gives the checkpoint of `step_id`: the decision, who made it,
    /// when it was applied, and the comment.
    pub(super) fn decided(&self, step_id: &str, control: &ControlRow, now: Millis) -> Outcome {
        self.took(step_id, Transition::Checkpoint(Checkpoint::Decided));
        Outcome::Resolved(json!({
            "decision": control.body["decision"],
            "decidedBy": control.created_by,
            "decidedAt": now,
            "comment": control.body.get("comment"),
        }))
    }
}
