use std::collections::VecDeque;

use runtime::CallId;
use store::{ControlKind, ControlRow, WriteOp};

use super::{ControlsFor, Effect, Millis, Then, Waiting, WorkflowMachine};

impl WorkflowMachine {
    pub(super) fn on_controls(
        &mut self,
        out: &mut Vec<Effect>,
        purpose: ControlsFor,
        result: Result<Vec<ControlRow>, store::Error>,
        now: Millis,
    ) {
        let controls = match (purpose, result) {
            (_, Ok(controls)) => controls,
            (ControlsFor::Poll, Err(error)) => {
                // The node's poller asks again while the control is pending.
                tracing::warn!(parent: &self.span, %error, "reading controls failed");
                return;
            }
            (ControlsFor::DeadOwnerCancel, Err(error)) => {
                tracing::error!(parent: &self.span, %error, "cannot read the controls");
                self.halt(out, true);
                return;
            }
        };
        let cancel = controls
            .iter()
            .find(|c| c.kind == ControlKind::Cancel && !c.applied);
        match (purpose, cancel) {
            (ControlsFor::DeadOwnerCancel, None) => self.halt(out, true),
            (_, Some(cancel)) => self.begin_cancel(out, cancel.id),
            (ControlsFor::Poll, None) => {
                let wanted = self
                    .waiting
                    .iter()
                    .filter_map(|(id, (waiting, command))| match waiting {
                        Waiting::Control(kind) => Some((*id, *kind, command.step_id.clone())),
                        _ => None,
                    })
                    .collect();
                self.apply_controls(out, controls, wanted, now);
            }
        }
    }

    /// Concludes the next call a control answers; the rest resume after its activation.
    pub(super) fn apply_controls(
        &mut self,
        out: &mut Vec<Effect>,
        controls: Vec<ControlRow>,
        mut wanted: VecDeque<(CallId, ControlKind, String)>,
        now: Millis,
    ) {
        while let Some((id, kind, step_id)) = wanted.pop_front() {
            let Some(control) = controls
                .iter()
                .find(|c| !c.applied && c.kind == kind && c.step_id == step_id && c.attempt == 1)
            else {
                continue;
            };
            let Some((_, command)) = self.waiting.get(&id) else {
                continue;
            };
            let outcome = match kind {
                ControlKind::Resume => self.resumed(command, control),
                ControlKind::Decide => self.decided(command, control, now),
                // A cancel is the workflow's, never a call's: `on_controls` carries it out.
                ControlKind::Cancel => continue,
            };
            let applied = WriteOp::MarkControlApplied {
                control_id: control.id,
            };
            self.conclude(out, id, outcome, vec![applied], None, now);
            out.push(Effect::Then(Then::Controls { controls, wanted }));
            return;
        }
    }
}
