//! `pause`: waits for a `resume` control of its step; its input is the call's value
//! (transitions: [`Pause`]).

use runtime::{Command, Outcome};
use serde_json::Value;
use store::{ControlKind, ControlRow};

use super::transitions::{Pause, Transition};
use super::{Waiting, WorkflowMachine};

impl WorkflowMachine {
    /// A new pause: waits for its control (the poller, or a cue, reads the controls).
    pub(super) fn begin_pause(&mut self, command: Command) {
        self.took(&command.step_id, Transition::Pause(Pause::Begun));
        let waiting = Waiting::Control(ControlKind::Resume);
        self.waiting.insert(command.id, (waiting, command));
    }

    /// What a `resume` control gives the pause of `step_id`: its input.
    pub(super) fn resumed(&self, step_id: &str, control: &ControlRow) -> Outcome {
        self.took(step_id, Transition::Pause(Pause::Resumed));
        Outcome::Resolved(control.body.get("input").cloned().unwrap_or(Value::Null))
    }
}
