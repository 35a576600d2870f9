//! `agent`: a child run admitted under the step's idempotency key (`workflow/step/attempt`)
//! and the workflow's fence, followed to its end; its outcome, or what the store shows of its
//! run, concludes the call (transitions: [`Agent`]).

use runtime::{CallId, Command, Outcome};
use serde_json::{Value, json};
use store::{RunId, RunRow, RunStatus, StepCall, StepChild, StepStatus, WriteOp};

use super::super::reconciliation::{Reconciliation, ReconciliationReason};
use super::transitions::{Agent, Transition};
use super::{Admission, Effect, Event, Millis, Phase, Waiting, WorkflowMachine, thread_for};
use crate::Error;
use crate::backoff::{STORE_RETRY_FIRST, store_backoff};
use crate::child_run::RunRequest;

impl WorkflowMachine {
    /// A new agent call: asks for its admission, or, when the journal holds an attempt its
    /// retry policy queued, waits for that attempt's time first.
    pub(super) fn begin_agent(&mut self, out: &mut Vec<Effect>, command: Command, now: Millis) {
        let id = command.id;
        self.took(&command.step_id, Transition::Agent(Agent::Begun));
        let due = self
            .retry_waits
            .get(&command.seq)
            .map(|wait| wait.due_at_ms);
        self.first_attempts.entry(command.seq).or_insert(now);
        if self.closing_seqs.remove(&command.seq) {
            // The journal says this attempt's run was being closed for the next attempt: its
            // interruption, once final, is the step's own doing.
            self.closing.insert(id);
        }
        self.waiting.insert(id, (Waiting::Slot, command));
        match due {
            Some(due_at_ms) => self.wait_until(out, id, due_at_ms, now),
            None => self.admit(out, id, now),
        }
    }

    /// The step id of call `id`, for the transitions it takes.
    pub(super) fn step_of(&self, id: CallId) -> String {
        let waiting = self.waiting.get(&id).map(|(_, command)| command);
        let detached = || self.detached.get(&id).map(|(_, command)| command);
        waiting
            .or_else(detached)
            .map(|command| command.step_id.clone())
            .unwrap_or_default()
    }

    /// A queued call's fallback, or a freed slot's cue for it: asks again, once.
    pub(super) fn on_slot_check(&mut self, out: &mut Vec<Effect>, id: CallId, now: Millis) {
        if self.slot_waits.remove(&id) {
            self.took(&self.step_of(id), Transition::Agent(Agent::WokenForSlot));
            self.admit(out, id, now);
        }
    }

    /// A slot was freed somewhere (the change bus): every queued call asks again.
    pub(super) fn on_slot_freed(&mut self, out: &mut Vec<Effect>, now: Millis) {
        for id in std::mem::take(&mut self.slot_waits) {
            self.took(&self.step_of(id), Transition::Agent(Agent::WokenForSlot));
            self.admit(out, id, now);
        }
    }

    /// The fallback of a call whose run waits for a person: its row is read again, once.
    pub(super) fn on_answer_check(&mut self, out: &mut Vec<Effect>, id: CallId) {
        if let Some(run_id) = self.answer_waits.remove(&id) {
            self.took(&self.step_of(id), Transition::Agent(Agent::AnswerCue));
            out.push(Effect::Post(Event::ChildEnded {
                id,
                run_id,
                committed: None,
            }));
        }
    }

    /// An answer was given somewhere (the change bus): every run waiting for one is read again.
    pub(super) fn on_input_changed(&mut self, out: &mut Vec<Effect>) {
        for (id, run_id) in std::mem::take(&mut self.answer_waits) {
            self.took(&self.step_of(id), Transition::Agent(Agent::AnswerCue));
            out.push(Effect::Post(Event::ChildEnded {
                id,
                run_id,
                committed: None,
            }));
        }
    }

    /// Asks for the child run of agent call `id` (idempotent: a replayed call finds its run).
    pub(super) fn admit(&self, out: &mut Vec<Effect>, id: CallId, now: Millis) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        let carried = self.carried.as_ref().filter(|carried| carried.call == id);
        let workflow_id = &self.config.workflow_id;
        let attempt = self.attempt(command.seq);
        let request = RunRequest {
            thread_id: thread_for(workflow_id, &command.step_id),
            agent: command.args["agentRef"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            task: command.args["task"].clone(),
            idempotency_key: Some(store::idempotency_key(
                workflow_id,
                &command.step_id,
                attempt,
            )),
            step: Some(store::WorkflowStep {
                workflow_id: workflow_id.clone(),
                step_id: command.step_id.clone(),
                attempt,
                slots_max: self.config.slots_max,
                slots_per_user_max: self.config.slots_per_user_max,
                slots_reserved: self.config.slots_reserved,
                fence: self.config.fence.clone(),
                journal: carried.map_or_else(Vec::new, |carried| {
                    let mut journal = carried.before.ops.clone();
                    journal.push(carried.running.clone());
                    journal
                }),
            }),
            run_id: carried.map(|carried| carried.run_id.clone()),
            timeouts: self.attempt_timeouts(command, now),
        };
        out.push(Effect::Admit { id, request });
    }

    /// The script no longer awaits call `id` (a `parallel` it belongs to failed). A call still
    /// waiting for its admission or its child is kept apart from the script's calls: its child
    /// run is asked to stop, durably, and its end is journaled as `cancelled` with its slot
    /// given back; anything else is simply dropped.
    pub(super) fn detach(&mut self, out: &mut Vec<Effect>, id: CallId) {
        match self.waiting.remove(&id) {
            Some((Waiting::Slot, command)) => {
                self.took(&command.step_id, Transition::Agent(Agent::Detached));
                self.detached.insert(id, (None, command));
            }
            Some((Waiting::Child(Some(run_id)), command)) => {
                self.took(&command.step_id, Transition::Agent(Agent::Detached));
                out.push(Effect::CancelChildren {
                    run_ids: vec![run_id.clone()],
                    awaited: false,
                });
                self.detached.insert(id, (Some(run_id), command));
            }
            _ => {}
        }
    }

    /// The child runs this workflow knows to be live: those the script waits for and those it
    /// left behind.
    pub(super) fn live_children(&self) -> Vec<RunId> {
        let waited = self
            .waiting
            .values()
            .filter_map(|(waiting, _)| match waiting {
                Waiting::Child(Some(run_id)) => Some(run_id.clone()),
                _ => None,
            });
        let detached = self
            .detached
            .values()
            .filter_map(|(run_id, _)| run_id.clone());
        waited.chain(detached).collect()
    }

    /// An admission answered for a detached call: a run it started is stopped at once and
    /// followed to its end; a run that exists from before is asked to stop (its slot is given
    /// back by the workflow's end).
    pub(super) fn admitted_detached(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        result: Admission,
    ) {
        let Some((_, command)) = self.detached.remove(&id) else {
            return;
        };
        match result {
            Admission::Started(row) => {
                out.push(Effect::CancelChildren {
                    run_ids: vec![row.run_id.clone()],
                    awaited: false,
                });
                self.detached.insert(id, (Some(row.run_id), command));
                out.push(Effect::FollowChild { id });
            }
            Admission::Existing(row) if !row.status.is_final() => {
                out.push(Effect::CancelChildren {
                    run_ids: vec![row.run_id],
                    awaited: false,
                });
            }
            _ => {}
        }
    }

    /// A detached call's child run ended: its step is journaled `cancelled` and its slot is
    /// given back.
    pub(super) fn detached_child_ended(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        run_id: &RunId,
    ) {
        let Some((_, command)) = self.detached.remove(&id) else {
            return;
        };
        let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
            return;
        };
        self.took(&command.step_id, Transition::Agent(Agent::DetachedEnded));
        let mut call = self.agent_call(
            run_id,
            &thread_for(&self.config.workflow_id, &command.step_id),
            command.args["agentRef"].as_str().unwrap_or_default(),
        );
        if let StepCall::Agent { detached, .. } = &mut call {
            *detached = true;
        }
        self.unwritten
            .ops
            .push(self.step_op(&entry, StepStatus::Cancelled, Some(call)));
        self.unwritten.ops.push(WriteOp::ReleaseSlot {
            workflow_id: self.config.workflow_id.clone(),
            step_id: command.step_id,
        });
        self.write(out, Vec::new());
    }

    pub(super) fn on_admission(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        result: Admission,
        now: Millis,
    ) {
        if !matches!(&result, Admission::Failed(Error::Store(error)) if error.is_transient()) {
            self.admission_tries.remove(&id);
        }
        let carried = self.carried.take_if(|carried| carried.call == id);
        let journaled = carried.is_some() && matches!(result, Admission::Started(_));
        if let Admission::Failed(
            error @ (Error::Store(store::Error::OutcomeUnknown(_))
            | Error::Unanswered { .. }
            | Error::Spawn { .. }),
        ) = &result
        {
            // The admission (and any journal it carried) may have committed, and a child run
            // may exist (unanswered, or admitted but never started): recovery reads which,
            // instead of a guess here.
            self.took(
                &self.step_of(id),
                Transition::Agent(Agent::AdmissionUnknown),
            );
            tracing::error!(parent: &self.span, %error, "an admission's outcome is unknown; stopping");
            self.halt(out, true);
            return;
        }
        let mut ask_again_now = false;
        match (carried, &result) {
            (None, _)
            | (Some(_), Admission::Failed(Error::Store(store::Error::LeaseLost { .. }))) => {}
            (Some(carried), Admission::Started(_)) => {
                self.announce(out, carried.before.events);
            }
            (Some(carried), _) => {
                // Not admitted: the journal it carried was not written; write it, with the
                // call as queued.
                let mut before = carried.before;
                before.ops.push(carried.queued);
                self.unwritten.restore(before);
                self.write(out, Vec::new());
                // A slot freed before the queued entry committed announced nobody waiting
                // (the cue is sent only while a step is queued): ask once more at once.
                ask_again_now = true;
            }
        }
        if self.detached.contains_key(&id) {
            self.admitted_detached(out, id, result);
            return;
        }
        if matches!(self.phase, Phase::Cancelling { .. }) {
            // Admitted after the cancel began: stop it too, and wait for it like the others.
            if let Admission::Started(row) = result {
                if let Some((_, command)) = self.waiting.get(&id).cloned() {
                    self.waiting
                        .insert(id, (Waiting::Child(Some(row.run_id.clone())), command));
                }
                out.push(Effect::CancelChildren {
                    run_ids: vec![row.run_id],
                    awaited: true,
                });
                out.push(Effect::FollowChild { id });
            }
            return;
        }
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        match result {
            Admission::Started(row) => {
                self.took(&command.step_id, Transition::Agent(Agent::Admitted));
                out.push(Effect::Count {
                    name: "reins_child_runs_started_total",
                    labels: Vec::new(),
                });
                // For debugging: at info, a step is its "step started" and "step finished"
                // lines (the child run's own lines carry its id in their span).
                tracing::debug!(parent: &self.span, step_id = %command.step_id,
                    child_run_id = %row.run_id, "child run admitted");
                out.push(Effect::Fault("admission"));
                self.waiting.insert(
                    id,
                    (Waiting::Child(Some(row.run_id.clone())), command.clone()),
                );
                let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
                    return;
                };
                if !journaled {
                    let call = self.attempt_call(entry.seq, &row);
                    let op = self.step_op(&entry, StepStatus::Running, Some(call));
                    self.write(out, vec![op]);
                }
                out.push(Effect::FollowChild { id });
            }
            Admission::Existing(row) if row.stop_reason.as_deref() == Some("orphan_recovered") => {
                // Closed by the orphan sweep: the agent's real effects are unknown, and guessing
                // "failed" could make a retry run it twice. A person decides.
                self.took(&command.step_id, Transition::Agent(Agent::FoundOrphaned));
                if self.policy_of(&command).idempotent {
                    self.waiting
                        .insert(id, (Waiting::Child(Some(row.run_id.clone())), command));
                    let lost = format!(
                        "its run {} was orphaned (its node is gone); the agent is idempotent",
                        row.run_id
                    );
                    if !self.retry_failed_attempt(out, id, &row, Some(lost), now) {
                        self.fail_attempt(out, id, &row, now);
                    }
                    return;
                }
                let reason = ReconciliationReason::OrphanedChild;
                #[cfg(test)]
                let reason = if crate::workflow::mutants::planted(
                    crate::workflow::mutants::Mutant::OrphanReportedAsOutcomeUnknown,
                ) {
                    ReconciliationReason::ChildOutcomeUnknown
                } else {
                    reason
                };
                let why = Reconciliation::of_step(reason, &command.step_id, &row.run_id);
                self.reconcile_needed(out, why, now);
            }
            Admission::Existing(row) if row.status.is_final() => {
                self.took(&command.step_id, Transition::Agent(Agent::FoundEnded));
                self.waiting.insert(id, (Waiting::Child(None), command));
                self.adopt(out, id, row, now);
            }
            Admission::Existing(row) if row.status == RunStatus::WaitingForInput => {
                // Its agent asked a person before this workflow changed hands: the answer (given
                // on any node) decides the run, so follow the row as the first owner did. The
                // journal may not name the run (the first owner's write of it may never have
                // committed): it is written again, so the step shows the run a person answers.
                self.took(&command.step_id, Transition::Agent(Agent::FoundWaiting));
                if let Some(entry) = self.journal.get(id.0 as usize).cloned() {
                    let call = self.attempt_call(entry.seq, &row);
                    let op = self.step_op(&entry, StepStatus::Running, Some(call));
                    self.write(out, vec![op]);
                }
                let run_id = row.run_id;
                self.waiting
                    .insert(id, (Waiting::Child(Some(run_id.clone())), command));
                out.push(Effect::Post(Event::ChildEnded {
                    id,
                    run_id,
                    committed: None,
                }));
            }
            Admission::Existing(row) => {
                // A child run exists for this step and has no outcome: it may still be running on
                // a node that is gone. Guessing would risk a second run, so a person decides.
                self.took(&command.step_id, Transition::Agent(Agent::FoundLive));
                if self.policy_of(&command).idempotent {
                    self.waiting.insert(id, (Waiting::Slot, command));
                    self.close_then_retry(out, id, row.run_id);
                    return;
                }
                let why = Reconciliation::of_step(
                    ReconciliationReason::ChildOutcomeUnknown,
                    &command.step_id,
                    &row.run_id,
                );
                self.reconcile_needed(out, why, now);
            }
            Admission::Queued if ask_again_now => {
                self.took(&command.step_id, Transition::Agent(Agent::Queued));
                self.slot_waits.insert(id);
                out.push(Effect::Post(Event::SlotCheck(id)));
            }
            Admission::Queued => {
                // Woken by a freed slot (the workflows actor hands the cues out), or by the
                // fallback, whichever comes first; the other then finds nothing to do.
                self.took(&command.step_id, Transition::Agent(Agent::Queued));
                self.slot_waits.insert(id);
                out.push(Effect::SlotWanted);
                out.push(Effect::After {
                    delay: self.config.wake_fallback,
                    event: Event::SlotCheck(id),
                });
            }
            Admission::Failed(Error::Store(error)) if error.is_transient() => {
                // Nothing was written: the database is unreachable. That is never the step's
                // failure; the admission is asked again (the idempotency key makes a repeat
                // find the same run) until the database answers or the workflow times out.
                self.took(&command.step_id, Transition::Agent(Agent::AdmissionRetried));
                let tries = self.admission_tries.entry(id).or_insert(0);
                *tries += 1;
                let delay = store_backoff(*tries);
                if delay == STORE_RETRY_FIRST {
                    tracing::warn!(parent: &self.span, step_id = %command.step_id, %error,
                        "an admission wrote nothing (database unavailable or its disk full); retrying");
                }
                out.push(Effect::After {
                    delay,
                    event: Event::RetryAdmission(id),
                });
            }
            Admission::Failed(Error::Store(store::Error::LeaseLost { .. })) => {
                // Fenced at admission: no child run exists, and nothing more is ours to write.
                self.took(&command.step_id, Transition::Agent(Agent::Fenced));
                tracing::warn!(parent: &self.span, step_id = %command.step_id,
                    "admission refused: the lease is lost; the workflow stops here");
                self.halt(out, true);
            }
            Admission::Failed(error) => {
                self.took(&command.step_id, Transition::Agent(Agent::Refused));
                let outcome = Outcome::Rejected(json!({
                    "message": error.to_string(),
                    "status": "error",
                    "attempts": self.attempt(command.seq),
                    "retryable": false,
                }));
                self.waiting.insert(id, (Waiting::Child(None), command));
                self.conclude(out, id, outcome, Vec::new(), None, now);
            }
        }
    }

    /// What an agent step's journal entry says about its child run: which run, on which thread,
    /// under which definition of its agent.
    pub(super) fn agent_call(&self, run_id: &RunId, thread_id: &str, agent: &str) -> StepCall {
        let configuration_version = self
            .config
            .agents
            .get(agent)
            .map(|agent| agent.configuration_version.clone());
        StepCall::Agent {
            child: Some(Box::new(StepChild {
                run_id: run_id.clone(),
                thread_id: thread_id.to_owned(),
                configuration_version,
            })),
            previous_run_id: None,
            detached: false,
            run_status: None,
            retry: None,
            closing: false,
        }
    }

    /// What an admitted attempt's journal entry records: its run, and the timer it waited for
    /// when its retry policy queued it.
    fn attempt_call(&self, seq: u32, row: &RunRow) -> StepCall {
        let mut call = self.agent_call(&row.run_id, &row.thread_id, &row.agent);
        if let StepCall::Agent { retry, .. } = &mut call {
            *retry = self.retry_waits.get(&seq).cloned().map(Box::new);
        }
        call
    }

    /// A child's row, when its end was announced (or it was found waiting for a person).
    pub(super) fn on_child_row(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        run_id: RunId,
        row: Result<Option<RunRow>, store::Error>,
        now: Millis,
    ) {
        match row {
            Ok(Some(row))
                if row.status.is_final()
                    && row.stop_reason.as_deref() != Some("orphan_recovered") =>
            {
                self.took(&self.step_of(id), Transition::Agent(Agent::Ended));
                self.adopt(out, id, row, now);
            }
            Ok(Some(row)) if self.closing.contains(&id) && row.status.is_final() => {
                // Closed (by its node, or the orphan sweep): the step goes on from its row.
                self.took(&self.step_of(id), Transition::Agent(Agent::Ended));
                self.adopt(out, id, row, now);
            }
            #[cfg(test)]
            Ok(Some(row))
                if self.closing.contains(&id)
                    && crate::workflow::mutants::planted(
                        crate::workflow::mutants::Mutant::ClosingNotAwaited,
                    ) =>
            {
                self.adopt(out, id, row, now);
            }
            Ok(Some(_)) if self.closing.contains(&id) => self.still_closing(out, id, run_id),
            Ok(Some(row)) if row.status == RunStatus::WaitingForInput => {
                self.took(&self.step_of(id), Transition::Agent(Agent::WaitsForAnswer));
                // The agent ended its run in a pause: a person's answer (on any node) ends the
                // run, and announces it on the change bus; the fallback reads the row should the
                // cue be lost.
                self.answer_waits.insert(id, run_id);
                out.push(Effect::After {
                    delay: self.config.wake_fallback,
                    event: Event::AnswerCheck(id),
                });
            }
            Err(error) if error.is_transient() => {
                // The row could not be read (the database is unreachable): read it again later;
                // an outage says nothing about the child.
                self.took(&self.step_of(id), Transition::Agent(Agent::ReadRetried));
                self.read_tries += 1;
                out.push(Effect::After {
                    delay: store_backoff(self.read_tries),
                    event: Event::ChildEnded {
                        id,
                        run_id,
                        committed: None,
                    },
                });
            }
            Ok(_) | Err(_) => {
                // The run's end was not recorded by its node (fenced, or unknown).
                let step_id = self.step_of(id);
                self.took(&step_id, Transition::Agent(Agent::EndUnrecorded));
                let idempotent = self
                    .waiting
                    .get(&id)
                    .is_some_and(|(_, command)| self.policy_of(command).idempotent);
                if idempotent {
                    self.close_then_retry(out, id, run_id);
                    return;
                }
                let why = Reconciliation::of_step(
                    ReconciliationReason::ChildEndUnrecorded,
                    &step_id,
                    &run_id,
                );
                self.reconcile_needed(out, why, now);
            }
        }
    }

    /// Records a child run's terminal outcome as its step's outcome and frees the slot.
    pub(super) fn adopt(&mut self, out: &mut Vec<Effect>, id: CallId, row: RunRow, now: Millis) {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        out.push(Effect::Count {
            name: "reins_child_runs_finished_total",
            labels: vec![("status", row.status.as_str().to_owned())],
        });
        if row.status != RunStatus::Success {
            let lost = self.closing.remove(&id).then(|| {
                format!(
                    "its run {}'s outcome was unknown (its node is gone, or fenced); it was \
                     closed and the agent is idempotent",
                    row.run_id
                )
            });
            if !self.retry_failed_attempt(out, id, &row, lost, now) {
                self.fail_attempt(out, id, &row, now);
            }
            return;
        }
        self.closing.remove(&id);
        out.push(Effect::Count {
            name: "reins_step_attempts_total",
            labels: vec![
                ("agent", row.agent.clone()),
                ("outcome", "completed".into()),
            ],
        });
        let mut extra = Vec::new();
        // The output is kept as an immutable artifact version, like a captured file: a JSON
        // document, `null` when the run ended without one (an approved request).
        let content = row.output.as_ref().unwrap_or(&Value::Null).to_string();
        let version = self.next_artifact(&mut extra, &command.step_id, None, content.into_bytes());
        let mut resolved = json!({
            "output": row.output,
            "artifactVersion": version,
            "threadId": row.thread_id,
            "runId": row.run_id,
            "status": row.status,
            "attempts": self.attempt(command.seq),
        });
        // A person's answer to the agent's approval request, when it asked one.
        // (The whole stored answer, `{"request_id", "answer"}`, as scripts have always seen it.)
        if let (Some(map), Some(answer)) = (
            resolved.as_object_mut(),
            store::ApprovalSlot::of(&row.metadata).answered(),
        ) {
            map.insert(
                "approval".into(),
                json!({"request_id": answer.request_id, "answer": answer.answer}),
            );
        }
        extra.push(WriteOp::ReleaseSlot {
            workflow_id: self.config.workflow_id.clone(),
            step_id: command.step_id,
        });
        let call = self.attempt_call(command.seq, &row);
        out.push(Effect::Fault("result_before"));
        let outcome = Outcome::Resolved(resolved);
        self.conclude(out, id, outcome, extra, Some(call), now);
    }

    /// Attempt `row` of call `id` failed and is not run again: the step fails with its
    /// `StepError`, and its slot is given back.
    pub(super) fn fail_attempt(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        row: &RunRow,
        now: Millis,
    ) {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        let error = self.step_error(&command, row);
        out.push(Effect::Count {
            name: "reins_step_attempts_total",
            labels: vec![
                ("agent", row.agent.clone()),
                (
                    "outcome",
                    error["status"].as_str().unwrap_or("error").to_owned(),
                ),
            ],
        });
        let extra = vec![WriteOp::ReleaseSlot {
            workflow_id: self.config.workflow_id.clone(),
            step_id: command.step_id.clone(),
        }];
        let call = self.attempt_call(command.seq, row);
        out.push(Effect::Fault("result_before"));
        self.conclude(out, id, Outcome::Rejected(error), extra, Some(call), now);
    }
}
