//! `captureArtifact`: a file of the source step's workspace becomes the workflow's next
//! artifact version, written with the call's outcome (transitions: [`Capture`]).

use runtime::{CallId, Command, Outcome};
use serde_json::json;

use super::transitions::{Capture, Transition};
use super::{Effect, Event, Millis, Then, Waiting, WorkflowMachine, sha256_hex, thread_for};

impl WorkflowMachine {
    /// A new capture: carried out from the mailbox, after this activation's commands are all
    /// begun.
    pub(super) fn begin_capture(&mut self, out: &mut Vec<Effect>, command: Command) {
        let id = command.id;
        self.took(&command.step_id, Transition::Capture(Capture::Begun));
        self.waiting.insert(id, (Waiting::Child(None), command));
        out.push(Effect::Post(Event::Local { id }));
    }

    /// Asks the interpreter to read the file.
    pub(super) fn capture(&self, out: &mut Vec<Effect>, id: CallId, command: &Command) {
        let source = command.args["sourceStepId"].as_str().unwrap_or_default();
        out.push(Effect::Capture {
            id,
            thread_id: thread_for(&self.config.workflow_id, source),
            path: command.args["path"].as_str().unwrap_or_default().to_owned(),
            source_step_id: source.to_owned(),
        });
    }

    /// The file was read (its path and bytes), or cannot be captured (why).
    pub(super) fn on_captured(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        result: Result<(String, Vec<u8>), String>,
        now: Millis,
    ) {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        let mut extra = Vec::new();
        let outcome = match result {
            Ok((path, content)) => {
                self.took(&command.step_id, Transition::Capture(Capture::Captured));
                out.push(Effect::Fault("capture"));
                let (bytes, sha256) = (content.len(), sha256_hex(&content));
                let version = self.next_artifact(&mut extra, &command.step_id, Some(path), content);
                Outcome::Resolved(
                    json!({"artifactVersion": version, "bytes": bytes, "sha256": sha256}),
                )
            }
            Err(message) => {
                self.took(&command.step_id, Transition::Capture(Capture::Failed));
                Outcome::Rejected(json!({"message": message, "status": "error"}))
            }
        };
        self.capturing = true;
        self.conclude(out, id, outcome, extra, None, now);
        out.push(Effect::Then(Then::CaptureConcluded));
    }
}
