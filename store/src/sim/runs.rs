//! Child runs in the simulation store, by the rules of `sqlite/runs.rs`.

use serde_json::Value;

use super::{SimStore, State};
use crate::approval::{answered, pending_answer, pending_request_id, status_after_answer};
use crate::lease::ttl_seconds;
use crate::runs::replay;
use crate::{
    Admission, ApprovalAnswer, CancelAction, Error, ExpiredApproval, NewRun, Result, RunId,
    RunOutcome, RunRenewal, RunRow, RunSlot, RunStatus, SlotRow, StepStatus, WorkflowId,
    WorkflowStatus, WriteOp,
};

/// The change a durable cancel request makes to a live run: the first action asked for stands,
/// and a run waiting for input, which nobody runs, is interrupted at once.
pub(super) fn ask_to_cancel(action: CancelAction) -> impl Fn(&mut RunRow) {
    move |run| {
        run.cancel_action.get_or_insert(action);
        if run.status == RunStatus::WaitingForInput {
            run.status = RunStatus::Interrupted;
        }
    }
}

/// The rules a slot is claimed under (see [`crate::WorkflowStep`]).
#[derive(Debug, Clone, Copy)]
struct Rules {
    slots_max: u64,
    /// `slots_per_user_max`.
    share: u64,
    /// `slots_reserved`.
    reserved: u64,
}

impl State {
    /// The user who launched the workflow (`workflows.user_id`), if it is stored.
    fn user_of(&self, workflow_id: &WorkflowId) -> Option<&str> {
        self.workflows
            .get(workflow_id)
            .map(|workflow| workflow.row.user_id.as_str())
    }

    /// The slots the steps of `user`'s workflows hold.
    fn slots_of(&self, user: &str) -> u64 {
        let count = self
            .slots
            .keys()
            .filter(|(workflow_id, _)| self.user_of(workflow_id) == Some(user))
            .count();
        u64::try_from(count).unwrap_or(u64::MAX)
    }

    /// Whether the share `share` refuses a slot to a step of `workflow_id`: its owner holds it
    /// already (less `released`, given back in the same write) while another user waits below
    /// theirs, with a step `queued` in a running, paused or waiting_approval workflow whose
    /// lease holds.
    fn share_binds(&self, workflow_id: &WorkflowId, released: u64, share: u64, now: f64) -> bool {
        let Some(user) = self.user_of(workflow_id) else {
            return false;
        };
        if self.slots_of(user).saturating_sub(released) < share {
            return false;
        }
        self.workflows.iter().any(|(waiting_id, workflow)| {
            let other = workflow.row.user_id.as_str();
            other != user
                && matches!(
                    workflow.row.status,
                    WorkflowStatus::Running
                        | WorkflowStatus::Paused
                        | WorkflowStatus::WaitingApproval
                )
                && self
                    .leases
                    .get(waiting_id)
                    .is_some_and(|lease| lease.expires_at > now)
                && workflow
                    .steps
                    .values()
                    .any(|step| step.row.status == StepStatus::Queued)
                && self.slots_of(other) < share
        })
    }

    /// Whether the slots kept for other users refuse a slot to a step of `workflow_id`: with
    /// `taken` slots held (less what the write gives back), one more would leave fewer than
    /// `reserved` free, and its owner holds their share already (less `released`, theirs).
    fn reserve_binds(
        &self,
        workflow_id: &WorkflowId,
        taken: u64,
        released: u64,
        rules: Rules,
    ) -> bool {
        if rules.reserved == 0
            || rules.share >= rules.slots_max
            || taken.saturating_add(rules.reserved) < rules.slots_max
        {
            return false;
        }
        self.user_of(workflow_id)
            .is_some_and(|user| self.slots_of(user).saturating_sub(released) >= rules.share)
    }

    /// Claims a slot for the step of an answered run (see [`crate::Runs::claim_run_slot`]).
    fn claim_run_slot(&mut self, run_id: &RunId, owner: &str, rules: Rules, now: f64) -> RunSlot {
        let Some(RunRow {
            workflow: Some(workflow_id),
            step_id: Some(step_id),
            attempt: Some(attempt),
            ..
        }) = self
            .runs
            .get(run_id)
            .filter(|run| {
                run.owner_worker_id.as_deref() == Some(owner)
                    && run.status == RunStatus::Running
                    && run.cancel_action.is_none()
            })
            .cloned()
        else {
            return RunSlot::Refused;
        };
        let running = self.workflows.get(&workflow_id).is_some_and(|workflow| {
            matches!(
                workflow.row.status,
                WorkflowStatus::Running | WorkflowStatus::Paused | WorkflowStatus::WaitingApproval
            )
        });
        if !running {
            return RunSlot::Refused;
        }
        let place = (workflow_id.clone(), step_id.clone());
        if let Some(slot) = self.slots.get_mut(&place) {
            slot.attempt = attempt;
            return RunSlot::Held;
        }
        let taken = u64::try_from(self.slots.len()).unwrap_or(u64::MAX);
        if taken >= rules.slots_max
            || (rules.share < rules.slots_max
                && self.share_binds(&workflow_id, 0, rules.share, now))
            || self.reserve_binds(&workflow_id, taken, 0, rules)
        {
            return RunSlot::Queued;
        }
        self.slots.insert(
            place,
            SlotRow {
                workflow_id,
                step_id,
                attempt,
                created_at: now,
            },
        );
        RunSlot::Held
    }

    fn admit(&mut self, run: NewRun, now: f64) -> Result<Admission> {
        if let Some(step) = &run.step {
            self.check_fence(&step.fence, now)?;
        }
        if let Some((key, request)) = &run.idempotency
            && self.mutant != Some(super::Mutant::IdempotencyKeyIgnored)
            && let Some(existing) = self
                .runs
                .values()
                .find(|row| row.idempotency_key.as_ref() == Some(key))
        {
            return replay(existing.clone(), request);
        }
        // Everything that can refuse the admission is checked before anything changes.
        if let Some(step) = &run.step {
            let held = self
                .slots
                .contains_key(&(step.workflow_id.clone(), step.step_id.clone()));
            if !held {
                // The slots the carried journal gives back are free for this step (the real
                // stores apply the journal before they claim).
                let released: Vec<&WorkflowId> = step
                    .journal
                    .iter()
                    .filter_map(|op| match op {
                        WriteOp::ReleaseSlot {
                            workflow_id,
                            step_id,
                        } if self
                            .slots
                            .contains_key(&(workflow_id.clone(), step_id.clone())) =>
                        {
                            Some(workflow_id)
                        }
                        _ => None,
                    })
                    .collect();
                let taken = self.slots.len().saturating_sub(released.len());
                let taken = u64::try_from(taken).unwrap_or(u64::MAX);
                if taken >= step.slots_max {
                    return Ok(Admission::Queued);
                }
                self.exists(&step.workflow_id)?;
                // The owner's share, less the slots the carried journal gives back (the
                // workflow's own, so its owner's).
                let released = u64::try_from(released.len()).unwrap_or(u64::MAX);
                if step.slots_per_user_max < step.slots_max
                    && self.share_binds(&step.workflow_id, released, step.slots_per_user_max, now)
                {
                    return Ok(Admission::Queued);
                }
                let rules = Rules {
                    slots_max: step.slots_max,
                    share: step.slots_per_user_max,
                    reserved: step.slots_reserved,
                };
                if self.reserve_binds(&step.workflow_id, taken, released, rules) {
                    return Ok(Admission::Queued);
                }
            }
        }
        let thread_busy = self
            .runs
            .values()
            .any(|row| row.thread_id == run.thread_id && row.status.is_active())
            && self.mutant != Some(super::Mutant::ThreadBusyIgnored);
        if thread_busy || self.runs.contains_key(&run.run_id) {
            return Err(Error::Conflict(format!(
                "thread {:?} already has an active run",
                run.thread_id
            )));
        }
        if let Some(step) = &run.step {
            self.check_ops(&step.journal)?;
            let place = (step.workflow_id.clone(), step.step_id.clone());
            let slot = self.slots.entry(place).or_insert_with(|| SlotRow {
                workflow_id: step.workflow_id.clone(),
                step_id: step.step_id.clone(),
                attempt: step.attempt,
                created_at: now,
            });
            slot.attempt = step.attempt;
        }
        let (key, request) = run.idempotency.clone().unzip();
        let row = RunRow {
            run_id: run.run_id.clone(),
            thread_id: run.thread_id.clone(),
            workflow: run.step.as_ref().map(|step| step.workflow_id.clone()),
            step_id: run.step.as_ref().map(|step| step.step_id.clone()),
            attempt: run.step.as_ref().map(|step| step.attempt),
            agent: run.agent.clone(),
            status: RunStatus::Running,
            owner_worker_id: Some(run.owner.clone()),
            lease_expires_at: Some(now + ttl_seconds(run.lease_ms)),
            cancel_action: None,
            error: None,
            output: None,
            idempotency_key: key,
            idempotency_request: request,
            metadata: run.metadata.clone(),
            total_tokens: 0,
            message_count: 0,
            stop_reason: None,
            revision: 0,
            created_at: now,
            updated_at: now,
        };
        let order = self.next_order();
        self.run_order.insert(row.run_id.clone(), order);
        self.runs.insert(row.run_id.clone(), row.clone());
        if let Some(step) = &run.step {
            for op in &step.journal {
                self.apply(&step.fence, op, now)?;
            }
        }
        Ok(Admission::Admitted(row))
    }

    /// Changes one run if `allowed` says so: a revision and the events the change calls for.
    /// Whether it changed.
    fn change_run(
        &mut self,
        run_id: &RunId,
        allowed: impl FnOnce(&RunRow) -> bool,
        change: impl FnOnce(&mut RunRow),
        now: f64,
    ) -> Result<Option<RunRow>> {
        let Some(before) = self.runs.get(run_id).filter(|run| allowed(run)).cloned() else {
            return Ok(None);
        };
        let mut after = before.clone();
        change(&mut after);
        after.revision += 1;
        after.updated_at = now;
        if after.status.is_active()
            && !before.status.is_active()
            && self.runs.values().any(|other| {
                other.run_id != after.run_id
                    && other.thread_id == after.thread_id
                    && other.status.is_active()
            })
        {
            return Err(Error::Conflict(format!(
                "thread {:?} already has an active run",
                after.thread_id
            )));
        }
        self.runs.insert(after.run_id.clone(), after.clone());
        self.run_events(&before, now);
        Ok(Some(after))
    }

    fn answer(
        &mut self,
        thread_id: &str,
        request_ids: &[String],
        answer: &Value,
        now: f64,
    ) -> Result<Option<ApprovalAnswer>> {
        let newest = self
            .runs
            .values()
            .filter(|run| run.thread_id == thread_id)
            .max_by(|a, b| {
                a.created_at.total_cmp(&b.created_at).then_with(|| {
                    self.run_order
                        .get(&a.run_id)
                        .cmp(&self.run_order.get(&b.run_id))
                })
            });
        let Some(paused) = newest
            .filter(|run| run.status == RunStatus::WaitingForInput)
            .cloned()
        else {
            return Ok(None);
        };
        let request_id = match pending_request_id(&paused.metadata) {
            Some(id) if request_ids.iter().any(|r| r == id) => id.to_owned(),
            _ => return Ok(None),
        };
        let status = status_after_answer(&paused.metadata);
        let metadata = answered(&paused.metadata, &request_id, answer);
        let changed = self.change_run(
            &paused.run_id,
            |run| run.status == RunStatus::WaitingForInput && run.revision == paused.revision,
            |run| {
                run.status = status;
                run.metadata = metadata;
            },
            now,
        )?;
        Ok(changed.map(|run| ApprovalAnswer {
            run_id: run.run_id,
            thread_id: thread_id.to_owned(),
            previous_metadata: paused.metadata,
            revision: run.revision,
            status,
        }))
    }

    fn claim_orphans(&mut self, claimer: &str, limit: u32, now: f64) -> Result<Vec<RunId>> {
        let orphans: Vec<RunId> = self
            .runs
            .values()
            .filter(|run| {
                run.status.is_active() && run.lease_expires_at.is_some_and(|at| at <= now)
            })
            .take(limit as usize)
            .map(|run| run.run_id.clone())
            .collect();
        for run_id in &orphans {
            let closed = self.change_run(
                run_id,
                |_| true,
                |run| {
                    run.status = RunStatus::Error;
                    run.stop_reason = Some("orphan_recovered".into());
                    run.error = Some("the node running it stopped renewing its lease".into());
                    run.owner_worker_id = Some(claimer.to_owned());
                },
                now,
            )?;
            // A closed run is no longer live: the slot its step held is given back with it.
            if let Some(RunRow {
                workflow: Some(workflow),
                step_id: Some(step_id),
                attempt: Some(attempt),
                ..
            }) = closed
            {
                self.free_slot(&workflow, &step_id, attempt);
            }
        }
        Ok(orphans)
    }

    /// Gives back the slot of a step's attempt, if it holds one.
    fn free_slot(&mut self, workflow: &WorkflowId, step_id: &str, attempt: i32) {
        let place = (workflow.clone(), step_id.to_owned());
        if self
            .slots
            .get(&place)
            .is_some_and(|slot| slot.attempt == attempt)
        {
            self.slots.remove(&place);
        }
    }
}

/// Whether `owner` owns a live run.
fn owned_live(run: &RunRow, owner: &str) -> bool {
    run.owner_worker_id.as_deref() == Some(owner) && !run.status.is_final()
}

impl crate::Runs for SimStore {
    async fn admit_run(&self, run: NewRun) -> Result<Admission> {
        let run = crate::write::ordered_run(run);
        self.write(|state, now| state.admit(run, now))
    }

    async fn read_run(&self, run_id: &RunId) -> Result<Option<RunRow>> {
        self.read(|state, _| Ok(state.runs.get(run_id).cloned()))
    }

    async fn renew_run_lease(
        &self,
        run_id: &RunId,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Result<RunRenewal, Option<RunRow>>> {
        self.write(|state, now| {
            let Some(run) = state.runs.get_mut(run_id).filter(|run| {
                owned_live(run, owner) && run.lease_expires_at.is_some_and(|at| at > now)
            }) else {
                return Ok(Err(state.runs.get(run_id).cloned()));
            };
            let expires_at = run
                .lease_expires_at
                .unwrap_or(0.0)
                .max(now + ttl_seconds(lease_ms));
            run.lease_expires_at = Some(expires_at);
            Ok(Ok(RunRenewal {
                expires_at,
                now,
                cancel_action: run.cancel_action,
                answer: pending_answer(run.status, &run.metadata),
            }))
        })
    }

    async fn request_run_cancel(
        &self,
        run_id: &RunId,
        action: CancelAction,
    ) -> Result<Option<CancelAction>> {
        self.write(|state, now| {
            let changed = state.change_run(
                run_id,
                |run| !run.status.is_final(),
                ask_to_cancel(action),
                now,
            )?;
            Ok(changed.and_then(|run| run.cancel_action))
        })
    }

    async fn update_run_status(
        &self,
        run_id: &RunId,
        owner: &str,
        status: RunStatus,
        metadata: Option<Value>,
    ) -> Result<bool> {
        self.write(|state, now| {
            let changed = state.change_run(
                run_id,
                |run| {
                    run.owner_worker_id.as_deref() == Some(owner)
                        && run.status.is_active()
                        && (status != RunStatus::WaitingForInput || run.cancel_action.is_none())
                },
                |run| {
                    run.status = status;
                    if let Some(metadata) = metadata {
                        run.metadata = metadata;
                    }
                },
                now,
            )?;
            // Nobody runs while a person decides: the step's slot is given back with the wait.
            if let Some(RunRow {
                status: RunStatus::WaitingForInput,
                workflow: Some(workflow),
                step_id: Some(step_id),
                attempt: Some(attempt),
                ..
            }) = &changed
            {
                state.free_slot(workflow, step_id, *attempt);
            }
            Ok(changed.is_some())
        })
    }

    async fn claim_run_slot(
        &self,
        run_id: &RunId,
        owner: &str,
        slots_max: u64,
        slots_per_user_max: u64,
        slots_reserved: u64,
    ) -> Result<RunSlot> {
        let rules = Rules {
            slots_max,
            share: slots_per_user_max,
            reserved: slots_reserved,
        };
        self.write(|state, now| Ok(state.claim_run_slot(run_id, owner, rules, now)))
    }

    async fn finalize_run(
        &self,
        run_id: &RunId,
        owner: &str,
        outcome: &RunOutcome,
        require_not_cancelled: bool,
    ) -> Result<bool> {
        self.write(|state, now| {
            let changed = state.change_run(
                run_id,
                |run| {
                    owned_live(run, owner)
                        && (!require_not_cancelled || run.cancel_action.is_none())
                },
                |run| {
                    run.status = outcome.status;
                    run.error = outcome.error.clone();
                    run.output = outcome.output.clone();
                    run.stop_reason = outcome.stop_reason.clone();
                    run.total_tokens = outcome.total_tokens;
                    run.message_count = outcome.message_count;
                    if let Some(failure) = &outcome.failure {
                        run.metadata["failure"] = failure.to_json();
                    }
                },
                now,
            )?;
            Ok(changed.is_some())
        })
    }

    async fn answer_approval(
        &self,
        thread_id: &str,
        request_ids: &[String],
        answer: &Value,
    ) -> Result<Option<ApprovalAnswer>> {
        self.write(|state, now| state.answer(thread_id, request_ids, answer, now))
    }

    async fn restore_approval(&self, answer: &ApprovalAnswer) -> Result<bool> {
        self.write(|state, now| {
            let changed = state.change_run(
                &answer.run_id,
                |run| run.revision == answer.revision,
                |run| {
                    run.status = RunStatus::WaitingForInput;
                    run.metadata = answer.previous_metadata.clone();
                },
                now,
            )?;
            Ok(changed.is_some())
        })
    }

    async fn expired_approvals(&self, limit: u32) -> Result<Vec<ExpiredApproval>> {
        self.read(|state, now| {
            Ok(state
                .runs
                .values()
                .filter_map(|row| ExpiredApproval::of(row, now * 1000.0))
                .take(usize::try_from(limit).unwrap_or(usize::MAX))
                .collect())
        })
    }

    async fn claim_orphan_runs(&self, claimer: &str, limit: u32) -> Result<Vec<RunId>> {
        self.write(|state, now| state.claim_orphans(claimer, limit, now))
    }

    async fn count_slots(&self) -> Result<i64> {
        self.read(|state, _| Ok(i64::try_from(state.slots.len()).unwrap_or(i64::MAX)))
    }
}
