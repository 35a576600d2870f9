//! `readArtifact`: an artifact version of the workflow, read from the store (transitions:
//! [`Read`]).

use runtime::{CallId, Command, Outcome};
use serde_json::json;

use super::transitions::{Read, Transition};
use super::{Effect, Event, Millis, Waiting, WorkflowMachine, artifact_content};
use crate::backoff::store_backoff;

impl WorkflowMachine {
    /// A new read: carried out from the mailbox, after this activation's commands are all begun.
    pub(super) fn begin_read(&mut self, out: &mut Vec<Effect>, command: Command) {
        let id = command.id;
        self.took(&command.step_id, Transition::Read(Read::Begun));
        self.waiting.insert(id, (Waiting::Child(None), command));
        out.push(Effect::Post(Event::Local { id }));
    }

    /// Asks the interpreter to read the version.
    pub(super) fn read(&self, out: &mut Vec<Effect>, id: CallId, command: &Command) {
        let version = command.args["artifactVersion"].as_i64().unwrap_or(0);
        out.push(Effect::ReadArtifact { id, version });
    }

    /// The store's answer for version `version`.
    pub(super) fn on_artifact(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        version: i64,
        result: Result<Option<Vec<u8>>, store::Error>,
        now: Millis,
    ) {
        let step_id = self
            .waiting
            .get(&id)
            .map(|(_, command)| command.step_id.clone())
            .unwrap_or_default();
        let outcome = match result {
            Ok(Some(content)) => {
                self.took(&step_id, Transition::Read(Read::Found));
                Outcome::Resolved(artifact_content(content))
            }
            Ok(None) => {
                self.took(&step_id, Transition::Read(Read::Missing));
                Outcome::Rejected(json!({
                    "message": format!("artifact version {version} does not exist"),
                    "status": "error",
                }))
            }
            Err(error) if error.is_transient() => {
                self.took(&step_id, Transition::Read(Read::Retried));
                self.read_tries += 1;
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::Local { id },
                });
                return;
            }
            Err(error) => {
                self.took(&step_id, Transition::Read(Read::Failed));
                tracing::error!(parent: &self.span, %error, "reading an artifact failed");
                self.halt(out, true);
                return;
            }
        };
        self.conclude(out, id, outcome, Vec::new(), None, now);
    }
}
