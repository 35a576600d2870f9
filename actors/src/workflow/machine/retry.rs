//! An `agent` step's attempts. Its policy is the call's `retry`, `timeout` and `idempotent` over
//! its agent's configured defaults over the built-in ones. A failed attempt the policy allows to
//! retry is journaled `failed` with its error, its slot is given back, and the next attempt is
//! journaled `queued` behind a durable timer (`timer.rs`), in one fenced write; when the timer
//! fires, the next attempt is admitted under its own idempotency key, so it is a new child run.
//! An idempotent agent's run whose outcome is unknown (orphaned, or live on a node that is gone)
//! is closed first (its stop requested durably, its row followed until final) and then retried
//! the same way, the reason journaled. Everything else fails the step with a `StepError` that
//! says how many attempts ran, whether the failure was retryable, and its status (transitions:
//! the `Agent` rows `RetryScheduled`, `RetryDue`, `Closing`, `StillClosing`).

use runtime::policy::{CallPolicy, RetryPolicy, TimeoutOptions};
use runtime::{CallId, Command};
use serde_json::{Value, json};
use store::{
    FailureClass, RetryWait, RunFailure, RunId, RunRow, RunStatus, StepOutcome, StepRecord,
    StepStatus, WriteOp,
};

use super::transitions::{Agent, Transition};
use super::{CHILD_CHECK, Effect, Event, Millis, Waiting, WorkflowMachine};
use crate::agents::AgentRegistry;

/// What an `agent` step retries, times out and recovers by.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StepPolicy {
    pub retry: RetryPolicy,
    pub timeouts: TimeoutOptions,
    pub idempotent: bool,
}

/// How an attempt failed, as its run's row says.
struct AttemptFailure {
    message: String,
    /// `error`, `timeout` or `interrupted`: the `StepError`'s status.
    status: &'static str,
    /// Whether the failure may pass on another attempt (the agent said, or its class does).
    retryable: bool,
    code: Option<String>,
    retry_after_ms: Option<u64>,
}

impl AttemptFailure {
    fn of(row: &RunRow) -> Self {
        let failure = RunFailure::of(&row.metadata).unwrap_or_default();
        let interrupted = row.status == RunStatus::Interrupted;
        AttemptFailure {
            message: row
                .error
                .clone()
                .unwrap_or_else(|| format!("the agent run ended {}", row.status.as_str())),
            status: match (interrupted, failure.class) {
                (true, _) => "interrupted",
                (false, FailureClass::Timeout) => "timeout",
                (false, FailureClass::Error) => "error",
            },
            // A run someone asked to stop is not run again behind their back.
            retryable: !interrupted && failure.retryable != Some(false),
            code: failure.code,
            retry_after_ms: failure.retry_after_ms,
        }
    }
}

/// The policy of an `agent` call with `args`, under the configured `agents`.
pub(crate) fn step_policy(agents: &AgentRegistry, args: &Value) -> StepPolicy {
    let agent = args["agentRef"].as_str().unwrap_or_default();
    let defaults = agents
        .get(agent)
        .map(|agent| agent.defaults.clone())
        .unwrap_or_default();
    // The runtime refused a call whose keys are wrong before it was made; a call journaled
    // before those keys existed has none.
    let call = CallPolicy::from_call(args).unwrap_or_default();
    StepPolicy {
        retry: call.retry.over(&defaults.retry).policy(),
        timeouts: call.timeout.over(&defaults.timeout),
        idempotent: defaults.idempotent && call.idempotent != Some(false),
    }
}

impl WorkflowMachine {
    /// The policy of an `agent` call.
    pub(super) fn policy_of(&self, command: &Command) -> StepPolicy {
        step_policy(&self.config.agents, &command.args)
    }

    /// The timeouts an attempt of `command` admitted at `now` runs under: its policy's
    /// `attemptMs` and `idleMs`, the first no later than what `totalMs` leaves of the step's
    /// time (at least the smallest timeout, so that an attempt admitted late still starts).
    pub(super) fn attempt_timeouts(&self, command: &Command, now: Millis) -> TimeoutOptions {
        let timeouts = self.policy_of(command).timeouts;
        let left_ms = timeouts.total_ms.map(|total_ms| {
            let first_at_ms = self.first_attempt_at(command.seq, now);
            let spent_ms = u64::try_from(now.saturating_sub(first_at_ms)).unwrap_or(0);
            total_ms
                .saturating_sub(spent_ms)
                .max(runtime::policy::TIMEOUT_MS_MIN)
        });
        TimeoutOptions {
            attempt_ms: match (timeouts.attempt_ms, left_ms) {
                (Some(attempt_ms), Some(left_ms)) => Some(attempt_ms.min(left_ms)),
                (attempt_ms, left_ms) => attempt_ms.or(left_ms),
            },
            idle_ms: timeouts.idle_ms,
            total_ms: None,
            approval_ms: timeouts.approval_ms,
        }
    }

    /// When the step of call `seq` began its first attempt (its `totalMs` counts from there).
    pub(super) fn first_attempt_at(&self, seq: u32, now: Millis) -> Millis {
        self.retry_waits
            .get(&seq)
            .map(|wait| wait.first_at_ms)
            .or_else(|| self.first_attempts.get(&seq).copied())
            .unwrap_or(now)
    }

    /// The `StepError` of a step whose attempt `row` failed and is not run again.
    pub(super) fn step_error(&self, command: &Command, row: &RunRow) -> Value {
        let failure = AttemptFailure::of(row);
        let refused = self
            .policy_of(command)
            .retry
            .refuses(failure.code.as_deref());
        json!({
            "message": failure.message,
            "status": failure.status,
            "runId": row.run_id,
            "attempts": self.attempt(command.seq),
            "retryable": failure.retryable && !refused,
            "code": failure.code,
        })
    }

    /// After attempt `row` of call `id` failed (its run final, not a success; `lost`: why its
    /// outcome was unknown, for an idempotent agent's run that was closed): queues the next
    /// attempt if the policy allows, and answers whether it did.
    pub(super) fn retry_failed_attempt(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        row: &RunRow,
        lost: Option<String>,
        now: Millis,
    ) -> bool {
        let Some((_, command)) = self.waiting.get(&id).cloned() else {
            return false;
        };
        let Some(entry) = self.journal.get(id.0 as usize).cloned() else {
            return false;
        };
        let policy = self.policy_of(&command);
        let failure = AttemptFailure::of(row);
        let attempt = self.attempt(command.seq);
        let retryable = lost.is_some() || failure.retryable;
        let max_attempts = i32::try_from(policy.retry.max_attempts).unwrap_or(i32::MAX);
        #[cfg(test)]
        let max_attempts = if crate::workflow::mutants::planted(
            crate::workflow::mutants::Mutant::AttemptsUnbounded,
        ) {
            i32::MAX
        } else {
            max_attempts
        };
        if !retryable || policy.retry.refuses(failure.code.as_deref()) || attempt >= max_attempts {
            return false;
        }
        // Every attempt is a row of the workflow's record, as a journal entry is: together they
        // are bounded by `steps_max`.
        if self.step_rows() >= self.config.limits.steps_max {
            tracing::warn!(parent: &self.span, step_id = %command.step_id, attempt,
                steps_max = self.config.limits.steps_max,
                "attempt failed and is not run again: the workflow's steps and attempts reached \
                 steps_max");
            return false;
        }
        let next = attempt + 1;
        let delay_ms = policy.retry.delay_before(
            u32::try_from(next).unwrap_or(u32::MAX),
            failure.retry_after_ms,
        );
        let due_at_ms = now.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
        let first_at_ms = self.first_attempt_at(command.seq, now);
        if let Some(total_ms) = policy.timeouts.total_ms
            && due_at_ms >= first_at_ms.saturating_add(i64::try_from(total_ms).unwrap_or(i64::MAX))
        {
            // No time is left for another attempt: the step fails with this one's error.
            return false;
        }
        self.took(&command.step_id, Transition::Agent(Agent::RetryScheduled));
        // Logged (bounded: cut at ingest, escaped), not stored twice: an error is stored once,
        // on the failed attempt's row, and the next attempt names only another reason.
        let reason = lost.clone().unwrap_or_else(|| failure.message.clone());
        let wait = RetryWait {
            due_at_ms,
            first_at_ms,
            reason: lost,
            max_attempts: Some(policy.retry.max_attempts),
        };
        // The failed attempt keeps its run and its error; the next waits, queued, for its time.
        let mut failed = self.agent_call(&row.run_id, &row.thread_id, &row.agent);
        if let store::StepCall::Agent { retry, .. } = &mut failed {
            *retry = self.retry_waits.get(&command.seq).cloned().map(Box::new);
        }
        let seq = i32::try_from(entry.seq).unwrap_or(i32::MAX);
        let workflow_id = self.config.workflow_id.clone();
        let ops = vec![
            WriteOp::PutStep {
                workflow_id: workflow_id.clone(),
                seq,
                step_id: entry.step_id.clone(),
                attempt,
                status: StepStatus::Failed,
                record: StepRecord {
                    call: failed,
                    args: entry.args.clone(),
                    outcome: Some(StepOutcome::Rejected(self.step_error(&command, row))),
                    settled_at_ms: Some(now),
                    reconciled: None,
                },
            },
            WriteOp::ReleaseSlot {
                workflow_id: workflow_id.clone(),
                step_id: entry.step_id.clone(),
            },
            WriteOp::PutStep {
                workflow_id,
                seq,
                step_id: entry.step_id.clone(),
                attempt: next,
                status: StepStatus::Queued,
                record: StepRecord {
                    call: store::StepCall::Agent {
                        child: None,
                        previous_run_id: Some(row.run_id.clone()),
                        detached: false,
                        run_status: None,
                        retry: Some(Box::new(wait.clone())),
                        closing: false,
                    },
                    args: entry.args,
                    outcome: None,
                    settled_at_ms: None,
                    reconciled: None,
                },
            },
        ];
        self.attempts.insert(command.seq, next);
        self.retry_waits.insert(command.seq, wait);
        self.write(out, ops);
        let agent = row.agent.clone();
        out.push(Effect::Count {
            name: "reins_step_attempts_total",
            labels: vec![
                ("agent", agent.clone()),
                ("outcome", failure.status.to_owned()),
            ],
        });
        out.push(Effect::Count {
            name: "reins_step_retries_scheduled_total",
            labels: vec![("agent", agent)],
        });
        tracing::info!(parent: &self.span, step_id = %command.step_id, attempt, delay_ms,
            ?reason, "attempt failed; the next one is queued");
        self.wait_until(out, id, due_at_ms, now);
        self.park_if_only_waiting(out);
        true
    }

    /// The rows of this workflow's record: one per journal entry, and one more for each attempt
    /// after a call's first.
    fn step_rows(&self) -> u64 {
        let retried: u64 = self
            .attempts
            .values()
            .map(|attempt| u64::try_from(attempt.saturating_sub(1)).unwrap_or(0))
            .sum();
        u64::try_from(self.journal.len()).unwrap_or(u64::MAX) + retried
    }

    /// The timer of call `id`'s next attempt fired: its admission is asked for (a new child
    /// run, under the attempt's own idempotency key).
    pub(super) fn next_attempt_due(&mut self, out: &mut Vec<Effect>, id: CallId, now: Millis) {
        let Some((_, command)) = self.waiting.remove(&id) else {
            return;
        };
        self.took(&command.step_id, Transition::Agent(Agent::RetryDue));
        self.waiting.insert(id, (Waiting::Slot, command));
        self.admit(out, id, now);
    }

    /// An idempotent agent's run `run_id` has no outcome anyone can vouch for: it is asked to
    /// stop, durably, and its row followed until it is final; then the step goes on from what
    /// it says (a success is the step's; anything else is retried as the next attempt).
    pub(super) fn close_then_retry(&mut self, out: &mut Vec<Effect>, id: CallId, run_id: RunId) {
        let Some((_, command)) = self.waiting.remove(&id) else {
            return;
        };
        self.took(&command.step_id, Transition::Agent(Agent::Closing));
        // Journaled first, so that a node that takes the workflow over meanwhile knows the
        // interruption it may find is the step's own, not a person's.
        if let Some(entry) = self.journal.get(id.0 as usize).cloned() {
            let thread_id = super::thread_for(&self.config.workflow_id, &command.step_id);
            let agent = command.args["agentRef"].as_str().unwrap_or_default();
            let mut call = self.agent_call(&run_id, &thread_id, agent);
            if let store::StepCall::Agent { closing, retry, .. } = &mut call {
                *closing = true;
                *retry = self.retry_waits.get(&command.seq).cloned().map(Box::new);
            }
            let op = self.step_op(&entry, StepStatus::Running, Some(call));
            self.write(out, vec![op]);
        }
        self.waiting
            .insert(id, (Waiting::Child(Some(run_id.clone())), command));
        self.closing.insert(id);
        out.push(Effect::CancelChildren {
            run_ids: vec![run_id.clone()],
            awaited: false,
        });
        out.push(Effect::After {
            delay: CHILD_CHECK,
            event: Event::ChildEnded {
                id,
                run_id,
                committed: None,
            },
        });
    }

    /// A run being closed is not final yet: its row is read again after a while.
    pub(super) fn still_closing(&self, out: &mut Vec<Effect>, id: CallId, run_id: RunId) {
        self.took(&self.step_of(id), Transition::Agent(Agent::StillClosing));
        out.push(Effect::After {
            delay: CHILD_CHECK,
            event: Event::ChildEnded {
                id,
                run_id,
                committed: None,
            },
        });
    }
}
