//! `pause`: waits for a `resume` control of its step; its input is the call's value. Its
//! deadline (`timeoutMs`, `deadline.rs`) records a `resume` of its own: with `onTimeout:
//! {resume: VALUE}` the pause resolves with that value, without it the step fails with status
//! `timeout` (transitions: [`Pause`]).

use runtime::{Command, Outcome};
use serde_json::Value;
use store::{ControlKind, ControlRow};

use super::deadline::{by_timeout, timeout_error};
use super::transitions::{Pause, Transition};
use super::{Effect, Millis, Waiting, WorkflowMachine};

impl WorkflowMachine {
    /// A new pause: waits for its control (the poller, or a cue, reads the controls), and for
    /// its deadline, if it has one.
    pub(super) fn begin_pause(&mut self, out: &mut Vec<Effect>, command: Command, now: Millis) {
        self.took(&command.step_id, Transition::Pause(Pause::Begun));
        self.arm_deadline(out, &command, now);
        let waiting = Waiting::Control(ControlKind::Resume);
        self.waiting.insert(command.id, (waiting, command));
    }

    /// What a `resume` control gives `command`'s pause: its input, or the deadline's failure.
    pub(super) fn resumed(&self, command: &Command, control: &ControlRow) -> Outcome {
        match control.body.get("input") {
            None if by_timeout(control) => {
                self.took(&command.step_id, Transition::Pause(Pause::TimedOut));
                Outcome::Rejected(timeout_error(command))
            }
            input => {
                self.took(&command.step_id, Transition::Pause(Pause::Resumed));
                Outcome::Resolved(input.cloned().unwrap_or(Value::Null))
            }
        }
    }
}
