use std::collections::BTreeMap;
use std::time::Duration;

use runtime::{CallId, Command};
use store::{ControlWrite, RunId, RunRow, StepCall, StepRow, StepStatus, WorkflowStatus, WriteOp};

use super::super::reconciliation::{Reconciliation, ReconciliationReason};
use super::super::unwritten::Journaled;
use super::{
    CHILD_CHECK, ControlsFor, Effect, Event, Millis, Phase, RunReadFor, Waiting, WorkflowMachine,
};
use crate::backoff::store_backoff;

impl WorkflowMachine {
    /// A cancel request: stop the script, interrupt the child runs (durably), and end
    /// `cancelled` once every child has an outcome, or `needs_reconciliation` if one cannot be
    /// observed within the window.
    pub(super) fn begin_cancel(&mut self, out: &mut Vec<Effect>, control_id: i64) {
        tracing::info!(parent: &self.span, "cancelling");
        self.phase = Phase::Cancelling { control_id };
        out.push(Effect::Park);
        let op = self.set_workflow(WorkflowStatus::Cancelling, self.config.document.encode());
        self.write(out, vec![op]);
        out.push(Effect::Fault("cancelling"));
        let children: Vec<RunId> = self
            .waiting
            .values()
            .filter_map(|(waiting, _)| match waiting {
                Waiting::Child(Some(run_id)) => Some(run_id.clone()),
                _ => None,
            })
            .collect();
        // Calls that have no child run yet are simply dropped; the children of calls the
        // script left behind were asked to stop already, and are waited for like the others.
        self.waiting
            .retain(|_, (waiting, _)| matches!(waiting, Waiting::Child(Some(_))));
        for (id, (run_id, command)) in std::mem::take(&mut self.detached) {
            if let Some(run_id) = run_id {
                self.waiting
                    .insert(id, (Waiting::Child(Some(run_id)), command));
            }
        }
        if !children.is_empty() {
            out.push(Effect::CancelChildren {
                run_ids: children,
                awaited: true,
            });
        }
        out.push(Effect::After {
            delay: Duration::from_millis(self.config.cancel_window_ms),
            event: Event::CancelDeadline,
        });
        out.push(Effect::After {
            delay: CHILD_CHECK,
            event: Event::CheckChildren,
        });
        self.end_cancel_if_quiet(out);
    }

    /// A cancellation asked of a workflow whose owner died: the children the journal shows
    /// running are asked to stop, and the cancellation proceeds from their rows. The script never
    /// runs.
    pub(super) fn finish_cancel_of_dead_owner(
        &mut self,
        out: &mut Vec<Effect>,
        newest: &BTreeMap<u32, StepRow>,
    ) {
        for (seq, step) in newest {
            let (Some(entry), Some(run_id)) = (
                self.journal.iter().find(|e| e.seq == *seq).cloned(),
                step.record().and_then(store::StepRecord::run_id),
            ) else {
                continue;
            };
            if step.status != StepStatus::Running {
                continue;
            }
            let command = Command {
                id: CallId(*seq),
                seq: *seq,
                kind: entry.kind,
                step_id: entry.step_id,
                args: entry.args,
                in_flight_in_journal: true,
            };
            self.waiting.insert(
                CallId(*seq),
                (Waiting::Child(Some(run_id.clone())), command),
            );
        }
        out.push(Effect::ReadControls(ControlsFor::DeadOwnerCancel));
    }

    /// Reads the rows of the children a cancellation waits for; an ended one is recorded.
    pub(super) fn check_children(&mut self, out: &mut Vec<Effect>) {
        for (id, (waiting, _)) in &self.waiting {
            if let Waiting::Child(Some(run_id)) = waiting {
                out.push(Effect::ReadRun {
                    id: *id,
                    run_id: run_id.clone(),
                    purpose: RunReadFor::Cancelling,
                });
            }
        }
        out.push(Effect::After {
            delay: CHILD_CHECK,
            event: Event::CheckChildren,
        });
    }

    /// The cancellation's window closed with children still unobserved: a person decides.
    pub(super) fn cancel_deadline(&mut self, out: &mut Vec<Effect>, now: Millis) {
        if !matches!(self.phase, Phase::Cancelling { .. }) || self.waiting.is_empty() {
            return;
        }
        let reason = ReconciliationReason::CancelWindowPassed;
        let why = self
            .waiting
            .values()
            .find_map(|(waiting, command)| match waiting {
                Waiting::Child(Some(run_id)) => {
                    Some(Reconciliation::of_step(reason, &command.step_id, run_id))
                }
                _ => None,
            })
            .unwrap_or(Reconciliation {
                reason,
                step_id: String::new(),
                run_id: None,
                message: reason.message().to_owned(),
            });
        self.reconcile_needed(out, why, now);
    }

    pub(super) fn on_timeout_recorded(
        &mut self,
        out: &mut Vec<Effect>,
        recorded: Result<ControlWrite, store::Error>,
    ) {
        match recorded {
            Ok(ControlWrite::Recorded(row) | ControlWrite::Repeated(row)) => {
                self.begin_cancel(out, row.id);
            }
            // A cancel was asked for already (with another reason): the poll finds it.
            Err(store::Error::Conflict(_)) => {}
            Err(error) if error.is_transient() => {
                self.read_tries += 1;
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::TimedOut,
                });
            }
            Err(error) => {
                tracing::error!(parent: &self.span, %error, "cannot record the timeout");
                self.halt(out, true);
            }
        }
    }

    /// Ends the cancellation once no child run is outstanding.
    pub(super) fn end_cancel_if_quiet(&mut self, out: &mut Vec<Effect>) {
        let Phase::Cancelling { control_id } = self.phase else {
            return;
        };
        if !self.waiting.is_empty() {
            return;
        }
        #[cfg(test)]
        if crate::workflow::mutants::planted(crate::workflow::mutants::Mutant::CancelNeverFinishes)
        {
            return;
        }
        // As every end does, it asks every run of the workflow still live to stop, in the same
        // write: the ones this owner waited for have ended, but one it never learnt of (a run
        // admitted by an owner whose journal write was lost, waiting for a person, when a
        // timeout's cancel came before the journal was read) would otherwise wait on forever
        // for an approval of a cancelled workflow (found by the simulation, seed 5003486).
        let workflow_id = self.config.workflow_id.clone();
        let ops = vec![
            self.set_workflow(WorkflowStatus::Cancelled, self.config.document.encode()),
            WriteOp::MarkControlApplied { control_id },
            WriteOp::CancelRuns {
                workflow_id: workflow_id.clone(),
            },
            WriteOp::ReleaseSlots {
                workflow_id: workflow_id.clone(),
            },
            WriteOp::ReturnStorage { workflow_id },
            WriteOp::ReleaseLease,
        ];
        self.unwritten.events.push(Journaled::Ended {
            status: WorkflowStatus::Cancelled,
            reconciliation: None,
        });
        self.write(out, ops);
        self.halt(out, false);
    }

    /// A child run ended during a cancellation: record it, free its slot, and see whether the
    /// cancellation can end.
    pub(super) fn child_ended_while_cancelling(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        row: RunRow,
    ) {
        let Some((_, command)) = self.waiting.remove(&id) else {
            return;
        };
        let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
            return;
        };
        let mut call = self.agent_call(&row.run_id, &row.thread_id, &row.agent);
        if let StepCall::Agent { run_status, .. } = &mut call {
            *run_status = Some(row.status);
        }
        let ops = vec![
            self.step_op(&entry, StepStatus::Cancelled, Some(call)),
            WriteOp::ReleaseSlot {
                workflow_id: self.config.workflow_id.clone(),
                step_id: command.step_id,
            },
        ];
        self.write(out, ops);
        self.end_cancel_if_quiet(out);
    }
}
