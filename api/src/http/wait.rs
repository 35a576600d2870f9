//! Waiting for a workflow (`?wait=DURATION`, `wait_ms`): a request parks until the workflow ends
//! or waits for a person, or until its time is up. A parked request costs no query: it is woken
//! by the change bus (a status change, a child run's request for input, or a resync), reads the
//! record once, and parks again if it must still wait. Waiters are counted against
//! `http.waiters_max` (503 with `Retry-After` beyond it); each holds a permit and a place in the
//! registry that a dropped request (a client that went away) gives back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actors::WorkflowView;
use store::{Change, Changes, WorkflowId, WorkflowStatus};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast, watch};

use super::error::ApiError;
use super::per_user::{PerUser, Place};
use super::record;

/// The test hook `REINS_FAULT_WAITER_POLL_MS` (0: off): a parked waiter also wakes this often
/// and reads again, as a waiter that polls would. It is the planted mutant that proves the
/// quiet-period test can fail; only a build with the `fault-points` feature sets it.
static POLL_MS_FOR_TESTS: AtomicU64 = AtomicU64::new(0);

/// Makes every parked waiter read again each `ms` (see [`POLL_MS_FOR_TESTS`]).
pub fn poll_for_tests(ms: u64) {
    POLL_MS_FOR_TESTS.store(ms, Ordering::Relaxed);
}

/// Whether a waiter may answer: the workflow ended, or waits for a person: a pause or a
/// checkpoint nobody has answered yet (once a person has, the owner is about to carry it out),
/// an agent's request for approval, an operator's reconcile. Read from the view's typed rows,
/// never from the record made of them.
pub fn settled(view: &WorkflowView) -> bool {
    let status = view.row.status;
    // Nothing happens any more without an operator, or ever again.
    let ended = status.is_final() || status == WorkflowStatus::NeedsReconciliation;
    let at_checkpoint = matches!(
        status,
        WorkflowStatus::Paused | WorkflowStatus::WaitingApproval
    ) && record::waiting_checkpoints(view).next().is_some();
    // An agent's request, whichever page of the record its step is on.
    ended || at_checkpoint || record::waiting_requests(view).next().is_some()
}

/// Parses a wait: a whole number with the unit `ms`, `s` or `m` (`500ms`, `30s`, `2m`).
pub fn parse_duration(text: &str) -> Result<Duration, ApiError> {
    let invalid = || {
        ApiError::bad_request(format!(
            "query `wait` {text:?} is not a duration: a whole number (at most 12 digits) with ms, s or m, as in \
             500ms, 30s or 2m"
        ))
    };
    if !super::rules::DURATION.is_match(text) {
        return Err(invalid());
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(invalid)?;
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(invalid());
    }
    let number: u64 = number.parse().map_err(|_| invalid())?;
    let millis = match unit {
        "ms" => Some(number),
        "s" => number.checked_mul(1000),
        "m" => number.checked_mul(60_000),
        _ => None,
    }
    .ok_or_else(invalid)?;
    Ok(Duration::from_millis(millis))
}

/// The waiters of one node: their permits, and who waits for which workflow.
pub struct Waiters {
    permits: Arc<Semaphore>,
    limit: u64,
    /// Each user's waiters, at most `http.waiters_per_user_max`.
    per_user: PerUser,
    registry: Arc<Mutex<Registry>>,
    /// Raised when the node stops serving: every waiter answers with what it sees.
    stopping: watch::Sender<bool>,
    /// The task that hands the change bus to the waiters; ends with the node's bus.
    _dispatch: AbortOnDrop,
}

/// Who waits for which workflow: a counter each change of it bumps, and how many wait on it.
#[derive(Default)]
struct Registry {
    by_workflow: HashMap<WorkflowId, (watch::Sender<u64>, usize)>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Waiters {
    /// Waiters fed by `changes`, at most `limit` at once and `per_user_max` of one user.
    pub fn new(changes: &Changes, limit: u64, per_user_max: u64) -> Waiters {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let dispatch = tokio::spawn(dispatch(changes.subscribe(), Arc::clone(&registry)));
        Waiters {
            permits: Arc::new(Semaphore::new(
                usize::try_from(limit).unwrap_or(Semaphore::MAX_PERMITS),
            )),
            limit,
            per_user: PerUser::new("http.waiters_per_user_max", "waiters_busy", per_user_max),
            registry,
            stopping: watch::channel(false).0,
            _dispatch: AbortOnDrop(dispatch),
        }
    }

    /// Takes a waiter's place for `user_id`, or refuses: 429 while they hold
    /// `http.waiters_per_user_max` already, 503 while `http.waiters_max` wait on the node.
    pub fn admit(&self, user_id: &str) -> Result<Permit, ApiError> {
        let place = self.per_user.take(user_id)?;
        let permit = Arc::clone(&self.permits)
            .try_acquire_owned()
            .map_err(|_| ApiError {
                retry_after_seconds: Some(1),
                ..ApiError::new(
                    hyper::StatusCode::SERVICE_UNAVAILABLE,
                    "waiters_busy",
                    format!(
                        "{} requests wait already (`http.waiters_max`, at most three quarters \
                         of `http.connections_max`): ask again, or without `wait`",
                        self.limit
                    ),
                )
            })?;
        Ok(Permit {
            _permit: permit,
            _place: place,
        })
    }

    /// Starts hearing the changes of `workflow_id`. Taken before the first read, so that a
    /// change committed after that read is never missed.
    pub fn watch(&self, workflow_id: &WorkflowId) -> Watch {
        let mut registry = lock(&self.registry);
        let entry = registry
            .by_workflow
            .entry(workflow_id.to_owned())
            .or_insert_with(|| (watch::channel(0).0, 0));
        entry.1 += 1;
        let changes = entry.0.subscribe();
        Watch {
            workflow_id: workflow_id.to_owned(),
            changes,
            stopping: self.stopping.subscribe(),
            registry: Arc::clone(&self.registry),
        }
    }

    /// Wakes every waiter to answer now (the node stops serving).
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }
}

/// A waiter's place under `http.waiters_max`: held for as long as the request waits.
pub struct Permit {
    _permit: OwnedSemaphorePermit,
    _place: Place,
}

/// One waiter's subscription to one workflow's changes; leaves the registry when dropped.
pub struct Watch {
    workflow_id: WorkflowId,
    changes: watch::Receiver<u64>,
    stopping: watch::Receiver<bool>,
    registry: Arc<Mutex<Registry>>,
}

impl Watch {
    /// Waits until the workflow may have changed (`true`), or the deadline or the node's stop
    /// came first (`false`).
    pub async fn changed(&mut self, deadline: tokio::time::Instant) -> bool {
        if *self.stopping.borrow() {
            return false;
        }
        let poll_ms = POLL_MS_FOR_TESTS.load(Ordering::Relaxed);
        let poll = async {
            if poll_ms == 0 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(poll_ms)).await;
        };
        tokio::select! {
            changed = self.changes.changed() => changed.is_ok(),
            _ = self.stopping.changed() => false,
            () = tokio::time::sleep_until(deadline) => false,
            () = poll => true,
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut registry = lock(&self.registry);
        if let Some(entry) = registry.by_workflow.get_mut(&self.workflow_id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                registry.by_workflow.remove(&self.workflow_id);
            }
        }
    }
}

/// The registry's lock; a panic while holding it cannot leave it inconsistent (each change is
/// one map operation), so a poisoned lock is used as it is.
fn lock(registry: &Mutex<Registry>) -> std::sync::MutexGuard<'_, Registry> {
    registry
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Hands each change to the waiters of its workflow; a resync, or changes missed by lagging,
/// wakes every waiter to read once.
async fn dispatch(mut changes: broadcast::Receiver<Change>, registry: Arc<Mutex<Registry>>) {
    loop {
        let change = match changes.recv().await {
            Ok(change) => change,
            Err(broadcast::error::RecvError::Lagged(_)) => Change::Resync,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let registry = lock(&registry);
        match change {
            Change::Status(id) | Change::Input(id) => {
                if let Some((sender, _)) = registry.by_workflow.get(&id) {
                    sender.send_modify(|version| *version = version.wrapping_add(1));
                }
            }
            Change::Resync => {
                for (sender, _) in registry.by_workflow.values() {
                    sender.send_modify(|version| *version = version.wrapping_add(1));
                }
            }
            Change::Control(_) | Change::SlotFreed | Change::Recoverable | Change::Event(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};
    use store::{ControlKind, ControlRow, RunRow, RunStatus, StepRow, StepStatus, WorkflowRow};

    use super::*;

    fn view(status: WorkflowStatus) -> WorkflowView {
        WorkflowView {
            row: WorkflowRow {
                workflow_id: "wf".into(),
                user_id: "ada".into(),
                status,
                owner: Some("node".into()),
                fingerprint: "fp".into(),
                data: json!({}),
                created_at: 1.0,
                updated_at: 2.0,
            },
            steps: Vec::new(),
            checkpoints: Vec::new(),
            controls: Vec::new(),
            lease: None,
            approval_runs: Vec::new(),
            artifacts: Vec::new(),
            recoverable: false,
            retried_by: None,
            waits: Vec::new(),
        }
    }

    /// A journal entry of `kind` at `step_id`, attempt 1, waiting.
    fn waiting(kind: &str, step_id: &str) -> StepRow {
        let data = json!({"args": {"stepId": step_id}, "outcome": null, "settled_at_ms": null});
        StepRow::decoded(
            0,
            step_id.into(),
            1,
            StepStatus::Running,
            (kind, &data),
            1.0,
        )
    }

    fn control(kind: ControlKind, step_id: &str, body: Value) -> ControlRow {
        ControlRow {
            id: 1,
            workflow_id: "wf".into(),
            kind,
            step_id: step_id.into(),
            attempt: 1,
            body,
            created_by: Some("ada".into()),
            created_at: 0.0,
            applied: false,
        }
    }

    /// The child run of step `a`, attempt 1, in `status` with `metadata`.
    fn run(status: RunStatus, metadata: Value) -> RunRow {
        RunRow {
            run_id: "run".into(),
            thread_id: "t".into(),
            workflow: Some("wf".into()),
            step_id: Some("a".into()),
            attempt: Some(1),
            agent: "echo".into(),
            status,
            owner_worker_id: None,
            lease_expires_at: None,
            cancel_action: None,
            error: None,
            output: None,
            idempotency_key: None,
            idempotency_request: None,
            metadata,
            total_tokens: 0,
            message_count: 0,
            stop_reason: None,
            revision: 1,
            created_at: 1.0,
            updated_at: 2.0,
        }
    }

    #[test]
    fn a_wait_answers_once_the_workflow_ends_or_waits_for_a_person_and_not_before() {
        assert!(!settled(&view(WorkflowStatus::Running)));
        assert!(!settled(&view(WorkflowStatus::Cancelling)));
        for ended in [
            WorkflowStatus::Completed,
            WorkflowStatus::Failed,
            WorkflowStatus::Cancelled,
            WorkflowStatus::NeedsReconciliation,
        ] {
            assert!(settled(&view(ended)), "{ended}");
        }

        // A pause nobody resumed; once resumed, the owner is about to carry it out.
        let mut paused = view(WorkflowStatus::Paused);
        paused.checkpoints.push(waiting("pause", "p"));
        assert!(settled(&paused));
        paused
            .controls
            .push(control(ControlKind::Resume, "p", json!({"input": 1})));
        assert!(!settled(&paused));
        // A control of another kind or step answers nothing here.
        let mut other = view(WorkflowStatus::Paused);
        other.checkpoints.push(waiting("pause", "p"));
        other.controls.push(control(
            ControlKind::Decide,
            "p",
            json!({"decision": "approve"}),
        ));
        other
            .controls
            .push(control(ControlKind::Resume, "q", json!({"input": 1})));
        assert!(settled(&other));

        // A checkpoint: decided, it is answered; a decision that is neither still waits.
        let mut review = view(WorkflowStatus::WaitingApproval);
        review.checkpoints.push(waiting("humanCheckpoint", "r"));
        assert!(settled(&review));
        review.controls.push(control(
            ControlKind::Decide,
            "r",
            json!({"decision": "maybe"}),
        ));
        assert!(settled(&review));
        review.controls[0].body = json!({"decision": "reject"});
        assert!(!settled(&review));

        // An unanswered checkpoint counts only once the workflow has parked for it.
        let mut running = view(WorkflowStatus::Running);
        running.checkpoints.push(waiting("pause", "p"));
        assert!(!settled(&running));

        // An agent's request for approval, while its run waits for the answer.
        let asked = json!({"hitl_approval": {"request_id": "req", "actions": []}});
        let mut requested = view(WorkflowStatus::Running);
        requested
            .approval_runs
            .push(run(RunStatus::WaitingForInput, asked.clone()));
        assert!(settled(&requested));
        requested.approval_runs[0].status = RunStatus::Running;
        assert!(!settled(&requested));
        requested.approval_runs[0] = run(RunStatus::WaitingForInput, json!({}));
        assert!(!settled(&requested));
    }

    #[test]
    fn durations_have_a_unit_and_nothing_else() {
        assert_eq!(
            parse_duration("500ms").ok(),
            Some(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("30s").ok(), Some(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m").ok(), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("0s").ok(), Some(Duration::ZERO));
        for bad in [
            "",
            "30",
            "s",
            "1.5s",
            "-1s",
            "30 s",
            "30sec",
            "1h",
            "ms",
            "99999999999999999999m",
        ] {
            let refused = parse_duration(bad).expect_err(bad);
            assert_eq!(refused.status, hyper::StatusCode::BAD_REQUEST, "{bad:?}");
            assert!(
                refused.message.contains(&format!("{bad:?}")),
                "{}",
                refused.message
            );
        }
    }
}
