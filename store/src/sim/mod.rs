//! The in-memory simulation store: the semantics of the real stores as plain Rust data, for a
//! deterministic simulation to drive. No threads, no IO and no clock of its own: time is a
//! [`SimClock`] the caller moves. Every operation takes the state's lock, reads the clock once
//! (as a SQL statement reads the database clock once) and finishes before it returns, so
//! operations are atomic and serial, as on SQLite's single writer. A write checks everything that
//! can refuse it before it changes anything, so a refused write leaves the state as it was.
//!
//! Events are written where the real stores' triggers write them (migration 18): a launch and a
//! change of status, a journal entry, a control, an artifact, an approval asked and answered,
//! `console.log` lines. The conformance suite (`store/tests/conformance`) holds it to the same
//! tests as PostgreSQL and SQLite; where they disagree, the real stores are the truth.

mod notify;
mod runs;
mod sent_events;
mod users;
mod workflows;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::{Value, json};

use crate::lease::ttl_seconds;
use crate::write::{ArtifactRow, StepRow, WorkflowRow, WriteOp};
use crate::{
    ControlRow, Epoch, Error, EventPage, EventRow, Fence, Lease, MigrationReport, Result, RunId,
    RunRow, RunStatus, SCHEMA_VERSION, SentEvent, SlotRow, StepStatus, WorkflowId, WorkflowStatus,
};
use crate::{StepCall, StepKind, StepOutcome, StepRecord};

/// The simulated clock: epoch milliseconds that move only when the caller moves them.
#[derive(Debug, Clone, Default)]
pub struct SimClock {
    millis: Arc<AtomicU64>,
}

impl SimClock {
    /// A clock that reads `millis` (epoch milliseconds) until moved.
    pub fn at(millis: u64) -> SimClock {
        SimClock {
            millis: Arc::new(AtomicU64::new(millis)),
        }
    }

    /// Moves the clock forward by `millis`.
    pub fn advance(&self, millis: u64) {
        self.millis.fetch_add(millis, Ordering::SeqCst);
    }

    /// Epoch milliseconds now.
    pub fn millis(&self) -> u64 {
        self.millis.load(Ordering::SeqCst)
    }

    /// Epoch seconds now, as the database clock reads.
    pub fn seconds(&self) -> f64 {
        // Milliseconds of any realistic epoch fit in f64 exactly.
        self.millis() as f64 / 1000.0
    }
}

/// The simulation store. Clones share one state.
#[derive(Debug, Clone)]
pub struct SimStore {
    clock: SimClock,
    state: Arc<Mutex<State>>,
}

/// A bug planted in the simulation store on purpose, so that a test can prove the simulation's
/// oracle finds it (each is named after the rule it breaks). Never planted outside those tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutant {
    /// `ReleaseSlots` (a workflow's end gives back every slot its steps hold) does nothing.
    SlotsKeptAfterTheEnd,
    /// An admission with an idempotency key that names an existing run admits a second run.
    IdempotencyKeyIgnored,
    /// A fenced write is applied whatever the lease: a stale epoch's write goes through.
    StaleFenceAccepted,
    /// A grant resets what the owner's ended workflows gave back without counting it off the
    /// owner's row: the row grows past the sum of their grants.
    ReturnedNotCountedOff,
    /// An event is stored without a grant of its bytes: its owner's quota does not count it.
    EventNotCounted,
    /// A read of a workflow's pending events answers events of every name, not only those
    /// asked for.
    PendingOfAnyName,
    /// An admission ignores a live run on its thread: a step's next attempt can start while
    /// the run of the attempt before still lives.
    ThreadBusyIgnored,
}

/// The storage quota's rows, whole (`user_storage`, `workflow_storage`), with what each
/// workflow's artifacts take: what the simulation's oracle checks them against.
#[derive(Debug, Clone, Default)]
pub struct Storage {
    /// Each user's row: the sum of their workflows' grants.
    pub users: BTreeMap<String, i64>,
    /// Each workflow that stores anything, or was granted anything.
    pub workflows: BTreeMap<WorkflowId, WorkflowStorage>,
}

/// One workflow's grant and everything it stores inside it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkflowStorage {
    pub granted_bytes: i64,
    /// What its end gave back, not yet counted off its owner's row.
    pub returned_bytes: i64,
    /// The bytes of its artifact versions.
    pub artifact_bytes: i64,
    /// The bytes of its journal rows' errors ([`crate::StepRecord::error_bytes`]).
    pub error_bytes: i64,
    /// The payload bytes of the events sent to it, taken or not.
    pub event_bytes: i64,
    /// The bytes its retry copied from the workspaces it adopted.
    pub copied_bytes: i64,
}

impl WorkflowStorage {
    /// Everything it stores inside its grant.
    pub fn stored_bytes(&self) -> i64 {
        self.artifact_bytes + self.error_bytes + self.event_bytes + self.copied_bytes
    }
}

/// One journal entry with when it last changed.
#[derive(Debug, Clone)]
struct Step {
    row: StepRow,
    updated_at: f64,
    /// Insertion order, the tie-break of `(seq, attempt)`.
    order: u64,
}

/// One artifact version.
#[derive(Debug, Clone)]
struct Artifact {
    row: ArtifactRow,
    created_at: f64,
}

/// A workflow with everything that goes with it (deleted with it).
#[derive(Debug, Clone)]
struct Workflow {
    row: WorkflowRow,
    request_id: Option<String>,
    event_seq: i64,
    log_events: i64,
    log_bytes: i64,
    log_dropped: i64,
    steps: BTreeMap<(String, i32), Step>,
    artifacts: BTreeMap<i64, Artifact>,
    /// The bytes its artifacts may take: its part of its owner's stored bytes.
    granted_bytes: i64,
    /// What its end gave back of its grant, not yet counted off its owner's stored bytes.
    returned_bytes: i64,
    /// The bytes of data its retry copied from the workspaces it adopted.
    copied_bytes: i64,
    events: Vec<Event>,
    /// When a dormant workflow wakes (its lease expires then; `workflows.wake_at`); `None`
    /// while it is not dormant.
    wake_at: Option<f64>,
    /// The event names a dormant workflow waits for (`workflows.wake_on_events`).
    wake_on_events: Vec<String>,
}

impl Workflow {
    /// The bytes of its journal rows' errors (`workflow_steps.error_bytes`).
    fn error_bytes(&self) -> i64 {
        self.steps
            .values()
            .map(|step| step.row.record().map_or(0, crate::StepRecord::error_bytes))
            .sum()
    }
}

/// One event, with its place in the feed (status events only).
#[derive(Debug, Clone)]
struct Event {
    row: EventRow,
    feed_seq: Option<i64>,
}

/// Everything the store holds.
#[derive(Debug, Default)]
struct State {
    leases: BTreeMap<WorkflowId, Lease>,
    workflows: BTreeMap<WorkflowId, Workflow>,
    /// By id: ids grow, so this is oldest first.
    controls: BTreeMap<i64, ControlRow>,
    last_control_id: i64,
    /// Events sent to workflows, by `seq` (oldest first).
    sent_events: BTreeMap<i64, SentEvent>,
    last_event_seq: i64,
    /// By (workflow, step): a step holds at most one slot.
    slots: BTreeMap<(WorkflowId, String), SlotRow>,
    runs: BTreeMap<RunId, RunRow>,
    /// Insertion order of runs, the tie-break of `created_at`.
    run_order: BTreeMap<RunId, u64>,
    feed_seq: i64,
    /// Counter for insertion orders.
    inserted: u64,
    /// Users, sessions, API tokens and nodes.
    people: users::People,
    /// The sum of each user's workflows' grants (`user_storage`): what they store, less what
    /// their ended workflows gave back and is still marked on them.
    stored_bytes: BTreeMap<String, i64>,
    /// Each retried workflow's retry (`workflow_retries`), by the workflow it retries.
    retries: BTreeMap<WorkflowId, WorkflowId>,
    /// The notification outbox (migration 36), by id.
    outbox: BTreeMap<String, notify::OutboxRow>,
    /// When each webhook was first configured (`notify_targets`, migration 43), by its URL.
    notify_targets: BTreeMap<String, f64>,
    /// The bug planted in this store, if a test planted one.
    mutant: Option<Mutant>,
}

impl SimStore {
    /// An empty store on `clock`.
    pub fn new(clock: SimClock) -> SimStore {
        SimStore {
            clock,
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// The clock this store reads.
    pub fn clock(&self) -> &SimClock {
        &self.clock
    }

    /// Plants `mutant` in this store (see [`Mutant`]).
    pub fn plant(&self, mutant: Mutant) {
        self.lock().mutant = Some(mutant);
    }

    /// Every event sent to a workflow, oldest first, with the step that took it: what the
    /// simulation's oracle reads (the `sent_events` table, whole).
    pub fn all_sent_events(&self) -> Vec<SentEvent> {
        self.lock().all_sent_events()
    }

    /// When a dormant workflow wakes (`workflows.wake_at`), or `None` when it is not dormant:
    /// whether the simulation's oracle must judge a takeover of it as a wake.
    pub fn dormant_wake_at(&self, workflow_id: &WorkflowId) -> Option<f64> {
        self.lock()
            .workflows
            .get(workflow_id)
            .and_then(|workflow| workflow.wake_at)
    }

    /// Every child run the store holds, in the order they were admitted: what the simulation's
    /// oracle reads (the `child_runs` table, whole).
    pub fn all_runs(&self) -> Vec<RunRow> {
        let state = self.lock();
        let mut runs: Vec<(u64, RunRow)> = state
            .runs
            .values()
            .map(|run| {
                (
                    state.run_order.get(&run.run_id).copied().unwrap_or(0),
                    run.clone(),
                )
            })
            .collect();
        runs.sort_by_key(|(order, _)| *order);
        runs.into_iter().map(|(_, run)| run).collect()
    }

    /// The storage quota's rows (see [`Storage`]).
    pub fn all_storage(&self) -> Storage {
        let state = self.lock();
        let workflows = state
            .workflows
            .iter()
            .map(|(id, workflow)| {
                let artifact_bytes = workflow
                    .artifacts
                    .values()
                    .map(|artifact| i64::try_from(artifact.row.content.len()).unwrap_or(i64::MAX))
                    .sum();
                let storage = WorkflowStorage {
                    granted_bytes: workflow.granted_bytes,
                    returned_bytes: workflow.returned_bytes,
                    artifact_bytes,
                    error_bytes: workflow.error_bytes(),
                    event_bytes: state.event_bytes(id),
                    copied_bytes: workflow.copied_bytes,
                };
                (id.clone(), storage)
            })
            .filter(|(_, storage)| *storage != WorkflowStorage::default())
            .collect();
        Storage {
            users: state.stored_bytes.clone(),
            workflows,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while the lock was held left a state some test already failed on; the
        // simulation carries on with it rather than poisoning every later call.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads the state at one moment.
    fn read<T>(&self, read: impl FnOnce(&State, f64) -> Result<T>) -> Result<T> {
        let now = self.clock.seconds();
        read(&self.lock(), now)
    }

    /// Changes the state at one moment. All or nothing is the writer's duty: every operation
    /// checks everything that can refuse it before it changes anything (a list of changes is
    /// checked whole by [`State::check_ops`] first), so an error leaves the state as it was.
    fn write<T>(&self, write: impl FnOnce(&mut State, f64) -> Result<T>) -> Result<T> {
        let now = self.clock.seconds();
        write(&mut self.lock(), now)
    }
}

impl State {
    fn next_order(&mut self) -> u64 {
        self.inserted += 1;
        self.inserted
    }

    /// Whether `fence` holds its unexpired lease at `now`.
    fn holds(&self, fence: &Fence, now: f64) -> bool {
        self.leases.get(&fence.resource_id).is_some_and(|lease| {
            lease.owner == fence.owner && lease.epoch == fence.epoch && lease.expires_at > now
        })
    }

    fn check_fence(&self, fence: &Fence, now: f64) -> Result<()> {
        if self.holds(fence, now) || self.mutant == Some(Mutant::StaleFenceAccepted) {
            Ok(())
        } else {
            Err(fence.lost())
        }
    }

    fn workflow_mut(&mut self, workflow_id: &WorkflowId) -> Result<&mut Workflow> {
        self.workflows
            .get_mut(workflow_id)
            .ok_or_else(|| Error::NotFound(format!("workflow {workflow_id:?}")))
    }

    /// Appends an event to a workflow (a no-op for one that does not exist, as a trigger's
    /// `INSERT ... SELECT` finds no row).
    fn event(&mut self, workflow_id: &WorkflowId, kind: &str, data: Value, now: f64) {
        if let Some(workflow) = self.workflows.get_mut(workflow_id) {
            workflow.event_seq += 1;
            let seq = workflow.event_seq;
            workflow.events.push(Event {
                row: EventRow {
                    workflow_id: workflow_id.to_owned(),
                    seq,
                    kind: kind.to_owned(),
                    data: data.clone(),
                    created_at: now,
                },
                feed_seq: None,
            });
            self.outbox_event(workflow_id, seq, kind, &data, now);
        }
    }

    /// A status event, which is also one of the feed.
    fn status_event(
        &mut self,
        workflow_id: &WorkflowId,
        status: WorkflowStatus,
        previous: Option<WorkflowStatus>,
        now: f64,
    ) {
        self.feed_seq += 1;
        let feed_seq = self.feed_seq;
        self.event(
            workflow_id,
            "status",
            json!({"status": status, "previous": previous}),
            now,
        );
        if let Some(event) = self
            .workflows
            .get_mut(workflow_id)
            .and_then(|workflow| workflow.events.last_mut())
        {
            event.feed_seq = Some(feed_seq);
        }
    }

    /// Sets a workflow's status (with its event when it changes).
    fn set_status(
        &mut self,
        workflow_id: &WorkflowId,
        status: WorkflowStatus,
        now: f64,
    ) -> Result<()> {
        let workflow = self.workflow_mut(workflow_id)?;
        let previous = std::mem::replace(&mut workflow.row.status, status);
        workflow.row.updated_at = now;
        if previous != status {
            self.status_event(workflow_id, status, Some(previous), now);
        }
        Ok(())
    }

    /// The events a journal entry's status writes (`step_started`/`pause_waiting`/
    /// `checkpoint_waiting` when running, `step_finished` when it ended).
    fn step_status_events(&mut self, workflow_id: &WorkflowId, step: &Step, now: f64) {
        let row = &step.row;
        let Some(record) = row.record() else {
            return;
        };
        match row.status {
            StepStatus::Running => {
                let (kind, data) = match record.kind() {
                    StepKind::Pause => ("pause_waiting", step_fields(row)),
                    StepKind::HumanCheckpoint => {
                        let mut data = step_fields(row);
                        data["artifact_version"] = json!(record.artifact_version());
                        ("checkpoint_waiting", data)
                    }
                    _ => ("step_started", step_fields(row)),
                };
                self.event(workflow_id, kind, data, now);
            }
            status if status.is_final() => {
                let run_id = record.finished_run_id();
                let run = run_id.and_then(|id| self.runs.get(&RunId::new(id)));
                let output_bytes = record.output_version().and_then(|version| {
                    self.workflows
                        .get(workflow_id)
                        .and_then(|workflow| workflow.artifacts.get(&version))
                        .map(|artifact| artifact.row.content.len())
                });
                let mut data = step_fields(row);
                data["status"] = json!(row.status);
                data["child_run_id"] = json!(run_id);
                // From the attempt's own run's start (a step without one: its journaling), in
                // whole milliseconds, as the triggers of migration 43 count them.
                let started = record
                    .run_id()
                    .and_then(|id| self.runs.get(id))
                    .map_or(row.created_at, |run| run.created_at)
                    .max(row.created_at);
                data["duration_ms"] = json!(((step.updated_at - started) * 1000.0).round() as i64);
                data["waited_ms"] = json!(((started - row.created_at) * 1000.0).round() as i64);
                data["output_bytes"] = json!(output_bytes);
                data["total_tokens"] = json!(run.map(|run| run.total_tokens));
                data["message_count"] = json!(run.map(|run| run.message_count));
                if let (StepStatus::Failed, Some(StepOutcome::Rejected(error))) =
                    (row.status, &record.outcome)
                {
                    for (key, field) in [("error", "message"), ("error_status", "status")] {
                        if let Some(value) = error.get(field).filter(|value| !value.is_null()) {
                            data[key] = value.clone();
                        }
                    }
                }
                self.event(workflow_id, "step_finished", data, now);
            }
            _ => {}
        }
    }

    /// The approval events a change of a child run writes.
    fn run_events(&mut self, before: &RunRow, now: f64) {
        let Some(after) = self.runs.get(&before.run_id).cloned() else {
            return;
        };
        let Some(workflow_id) = after.workflow.clone() else {
            return;
        };
        let fields = |run: &RunRow| json!({"step_id": run.step_id, "attempt": run.attempt, "child_run_id": run.run_id});
        if after.status == RunStatus::WaitingForInput && before.status != RunStatus::WaitingForInput
        {
            let mut data = fields(&after);
            data["request_id"] = crate::pending_request_id(&after.metadata).into();
            self.event(&workflow_id, "approval_requested", data, now);
        }
        let slot = crate::ApprovalSlot::of(&after.metadata);
        if let Some(answer) = slot.answered()
            && crate::ApprovalSlot::of(&before.metadata).answered() != Some(answer)
        {
            let mut data = fields(&after);
            data["request_id"] = answer.request_id.into();
            data["decision"] = answer.decision().clone();
            data["by"] = answer.by().clone();
            self.event(&workflow_id, "approval_answered", data, now);
        }
    }

    fn exists(&self, workflow_id: &WorkflowId) -> Result<()> {
        if self.workflows.contains_key(workflow_id) {
            Ok(())
        } else {
            Err(Error::NotFound(format!("workflow {workflow_id:?}")))
        }
    }

    /// Fails as applying `ops` in order would, without changing anything: what makes a list of
    /// changes all or nothing. (No change creates or deletes a workflow; only artifact versions
    /// and, through statuses, the places under the limits change along the list.)
    fn check_ops(&self, ops: &[WriteOp]) -> Result<()> {
        let mut statuses: BTreeMap<&WorkflowId, WorkflowStatus> = BTreeMap::new();
        let mut versions: Vec<(&WorkflowId, i64)> = Vec::new();
        // Grants taken earlier in the list, by user.
        let mut taken: BTreeMap<&str, i64> = BTreeMap::new();
        for op in ops {
            match op {
                WriteOp::SetWorkflow {
                    workflow_id,
                    status,
                    ..
                } => {
                    self.exists(workflow_id)?;
                    statuses.insert(workflow_id, *status);
                }
                WriteOp::PutStep { workflow_id, .. } | WriteOp::PutLogs { workflow_id, .. } => {
                    self.exists(workflow_id)?;
                }
                WriteOp::PutArtifact {
                    workflow_id,
                    version,
                    ..
                } => {
                    self.exists(workflow_id)?;
                    let stored = self.workflows[workflow_id].artifacts.contains_key(version);
                    if stored || versions.contains(&(workflow_id, *version)) {
                        return Err(artifact_exists(workflow_id, *version));
                    }
                    versions.push((workflow_id, *version));
                }
                WriteOp::TakePlaces {
                    user_id,
                    max_workflows,
                    max_workflows_per_owner,
                    ..
                } => {
                    self.check_places(user_id, *max_workflows, *max_workflows_per_owner, &statuses)?
                }
                WriteOp::TakeStorage {
                    workflow_id,
                    bytes,
                    bytes_max,
                } => {
                    self.exists(workflow_id)?;
                    let user_id = self.workflows[workflow_id].row.user_id.as_str();
                    let earlier = taken.entry(user_id).or_default();
                    self.check_storage(user_id, *earlier, *bytes, *bytes_max)?;
                    *earlier += bytes;
                }
                WriteOp::TakeEvent {
                    workflow_id,
                    seq,
                    step_id,
                } => self.check_take(workflow_id, *seq, step_id)?,
                WriteOp::MarkControlApplied { .. }
                | WriteOp::ReturnStorage { .. }
                | WriteOp::CloseStepRuns { .. }
                | WriteOp::CancelRuns { .. }
                | WriteOp::ReleaseSlot { .. }
                | WriteOp::ReleaseSlots { .. }
                | WriteOp::ReleaseLease => {}
                WriteOp::GoDormant { workflow_id, .. } => {
                    self.exists(workflow_id)?;
                }
            }
        }
        Ok(())
    }

    /// Refuses when no place is free under the limits, counting each workflow at its status in
    /// `statuses` if it is there (changes earlier in the same write).
    fn check_places(
        &self,
        user_id: &str,
        max_workflows: i64,
        max_workflows_per_owner: i64,
        statuses: &BTreeMap<&WorkflowId, WorkflowStatus>,
    ) -> Result<()> {
        let counted = |user: Option<&str>| {
            let count = self
                .workflows
                .values()
                .filter(|workflow| {
                    let id = &workflow.row.workflow_id;
                    let status = statuses.get(id).copied().unwrap_or(workflow.row.status);
                    status.holds_place() && user.is_none_or(|user| workflow.row.user_id == user)
                })
                .count();
            i64::try_from(count).unwrap_or(i64::MAX)
        };
        if counted(None) >= max_workflows {
            return Err(Error::LimitReached(crate::Limit::Workflows));
        }
        if counted(Some(user_id)) >= max_workflows_per_owner {
            return Err(Error::LimitReached(crate::Limit::WorkflowsPerOwner));
        }
        Ok(())
    }

    /// What `user_id`'s workflows store: their grants, less what ended ones gave back.
    fn stored_by(&self, user_id: &str) -> i64 {
        let returned: i64 = self
            .workflows
            .values()
            .filter(|workflow| workflow.row.user_id == user_id)
            .map(|workflow| workflow.returned_bytes)
            .sum();
        self.stored_bytes.get(user_id).copied().unwrap_or(0) - returned
    }

    /// Refuses a grant of `bytes` more to `user_id`, who takes `earlier` in the same write, when
    /// their stored bytes would pass `bytes_max` (0: no quota).
    fn check_storage(&self, user_id: &str, earlier: i64, bytes: i64, bytes_max: i64) -> Result<()> {
        let stored = self.stored_by(user_id) + earlier;
        if bytes_max > 0 && stored.saturating_add(bytes) > bytes_max {
            return Err(Error::LimitReached(crate::Limit::StoredBytes {
                stored,
                max: bytes_max,
            }));
        }
        Ok(())
    }

    /// Applies one ownership-dependent change; `fence` has been checked at `now`, and the list
    /// it belongs to by [`State::check_ops`].
    fn apply(&mut self, fence: &Fence, op: &WriteOp, now: f64) -> Result<()> {
        match op {
            WriteOp::SetWorkflow {
                workflow_id,
                status,
                data,
            } => {
                self.workflow_mut(workflow_id)?.row.data = data.clone();
                self.set_status(workflow_id, *status, now)?;
            }
            WriteOp::PutStep {
                workflow_id,
                seq,
                step_id,
                attempt,
                status,
                record,
            } => self.put_step(workflow_id, *seq, step_id, *attempt, *status, record, now)?,
            WriteOp::MarkControlApplied { control_id } => {
                if let Some(control) = self.controls.get_mut(control_id) {
                    control.applied = true;
                }
            }
            WriteOp::TakeEvent { seq, step_id, .. } => {
                if let Some(event) = self.sent_events.get_mut(seq) {
                    event.taken_by = Some(step_id.clone());
                }
            }
            WriteOp::PutArtifact {
                workflow_id,
                version,
                source_step_id,
                path,
                content,
                sha256,
            } => {
                let workflow = self.workflow_mut(workflow_id)?;
                if workflow.artifacts.contains_key(version) {
                    return Err(artifact_exists(workflow_id, *version));
                }
                workflow.artifacts.insert(
                    *version,
                    Artifact {
                        row: ArtifactRow {
                            version: *version,
                            source_step_id: Some(source_step_id.clone()),
                            path: path.clone(),
                            content: content.clone(),
                            sha256: sha256.clone(),
                        },
                        created_at: now,
                    },
                );
                let data = json!({
                    "version": version,
                    "bytes": content.len(),
                    "step_id": source_step_id,
                    "name": path,
                });
                self.event(workflow_id, "artifact", data, now);
            }
            WriteOp::CloseStepRuns {
                idempotency_key, ..
            } => {
                self.change_runs(
                    |run| {
                        run.idempotency_key.as_ref() == Some(idempotency_key)
                            && !run.status.is_final()
                    },
                    |run| {
                        run.status = RunStatus::Interrupted;
                        run.stop_reason = Some("reconciled".into());
                        run.error = Some("closed by reconcile".into());
                    },
                    now,
                );
            }
            WriteOp::CancelRuns { workflow_id } => self.change_runs(
                |run| {
                    run.workflow.as_ref() == Some(workflow_id)
                        && !run.status.is_final()
                        && run.cancel_action.is_none()
                },
                runs::ask_to_cancel(crate::CancelAction::Interrupt),
                now,
            ),
            WriteOp::ReleaseSlot {
                workflow_id,
                step_id,
            } => {
                self.slots.remove(&(workflow_id.clone(), step_id.clone()));
            }
            WriteOp::ReleaseSlots { .. } if self.mutant == Some(Mutant::SlotsKeptAfterTheEnd) => {}
            WriteOp::ReleaseSlots { workflow_id } => {
                self.slots
                    .retain(|(workflow, _), _| workflow != workflow_id);
            }
            WriteOp::TakePlaces {
                user_id,
                max_workflows,
                max_workflows_per_owner,
                ..
            } => self.check_places(
                user_id,
                *max_workflows,
                *max_workflows_per_owner,
                &BTreeMap::new(),
            )?,
            WriteOp::TakeStorage {
                workflow_id,
                bytes,
                bytes_max,
            } => self.take_storage(workflow_id, *bytes, *bytes_max)?,
            WriteOp::ReturnStorage { workflow_id } => {
                let events = self.event_bytes(workflow_id);
                let workflow = self.workflow_mut(workflow_id)?;
                let artifacts: usize = workflow
                    .artifacts
                    .values()
                    .map(|artifact| artifact.row.content.len())
                    .sum();
                let used = i64::try_from(artifacts).unwrap_or(i64::MAX)
                    + workflow.error_bytes()
                    + events
                    + workflow.copied_bytes;
                workflow.returned_bytes = (workflow.granted_bytes - used).max(0);
            }
            WriteOp::PutLogs {
                workflow_id,
                lines,
                events_max,
                bytes_max,
            } => self.put_logs(workflow_id, lines, *events_max, *bytes_max, now)?,
            WriteOp::ReleaseLease => {
                if let Some(lease) = self.leases.get_mut(&fence.resource_id)
                    && lease.owner == fence.owner
                    && lease.epoch == fence.epoch
                {
                    lease.expires_at = now;
                }
            }
            WriteOp::GoDormant {
                workflow_id,
                wake_at_ms,
                event_names,
            } => {
                let waited = self
                    .controls
                    .values()
                    .any(|control| control.workflow_id == *workflow_id && !control.applied)
                    || self.sent_events.values().any(|event| {
                        event.workflow_id == *workflow_id
                            && event.taken_by.is_none()
                            && event_names.contains(&event.name)
                    });
                let wake_at = if waited {
                    now
                } else {
                    crate::write::dormant_wake_s(*wake_at_ms)
                };
                let workflow = self.workflow_mut(workflow_id)?;
                workflow.wake_at = Some(wake_at);
                workflow.wake_on_events = event_names.clone();
                if let Some(lease) = self.leases.get_mut(&fence.resource_id)
                    && lease.owner == fence.owner
                    && lease.epoch == fence.epoch
                {
                    lease.expires_at = wake_at;
                    lease.owner = String::new();
                }
            }
        }
        Ok(())
    }

    /// The payload bytes of the events sent to `workflow_id`, taken or not.
    fn event_bytes(&self, workflow_id: &WorkflowId) -> i64 {
        self.sent_events
            .values()
            .filter(|event| event.workflow_id == *workflow_id)
            .map(|event| i64::try_from(event.payload.to_string().len()).unwrap_or(i64::MAX))
            .sum()
    }

    /// Grows `workflow_id`'s grant by `bytes` from its owner's quota `bytes_max` (0: none)
    /// ([`WriteOp::TakeStorage`]).
    fn take_storage(&mut self, workflow_id: &WorkflowId, bytes: i64, bytes_max: i64) -> Result<()> {
        let user_id = self.workflow_mut(workflow_id)?.row.user_id.clone();
        self.check_storage(&user_id, 0, bytes, bytes_max)?;
        // What the owner's ended workflows gave back comes off their count first.
        let mut returned = 0;
        for workflow in self.workflows.values_mut() {
            if workflow.row.user_id == user_id {
                let marked = std::mem::take(&mut workflow.returned_bytes);
                workflow.granted_bytes -= marked;
                returned += marked;
            }
        }
        if self.mutant == Some(Mutant::ReturnedNotCountedOff) {
            returned = 0;
        }
        self.workflow_mut(workflow_id)?.granted_bytes += bytes;
        *self.stored_bytes.entry(user_id).or_default() += bytes - returned;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn put_step(
        &mut self,
        workflow_id: &WorkflowId,
        seq: i32,
        step_id: &str,
        attempt: i32,
        status: StepStatus,
        record: &StepRecord,
        now: f64,
    ) -> Result<()> {
        let order = self.next_order();
        let workflow = self.workflow_mut(workflow_id)?;
        let key = (step_id.to_owned(), attempt);
        let previous = workflow.steps.get(&key).cloned();
        let step = Step {
            row: StepRow {
                seq,
                step_id: step_id.to_owned(),
                attempt,
                status,
                record: Ok(record.clone()),
                created_at: previous.as_ref().map_or(now, |step| step.row.created_at),
                run_started_at: None,
            },
            updated_at: now,
            order: previous.as_ref().map_or(order, |step| step.order),
        };
        workflow.steps.insert(key, step.clone());
        match previous {
            None => self.journaled(workflow_id, &step, now),
            Some(previous) if previous.row.status != status => {
                self.step_status_events(workflow_id, &step, now);
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The events of a journal entry just inserted, as the step trigger writes them.
    fn journaled(&mut self, workflow_id: &WorkflowId, step: &Step, now: f64) {
        let mut fields = step_fields(&step.row);
        fields["seq"] = json!(step.row.seq);
        if let Some(StepRecord {
            call: StepCall::Agent {
                retry: Some(wait), ..
            },
            ..
        }) = step.row.record()
        {
            fields["retry_due_at_ms"] = json!(wait.due_at_ms);
            fields["retry_reason"] = json!(wait.reason);
        }
        self.event(workflow_id, "step_journaled", fields, now);
        self.step_status_events(workflow_id, step, now);
    }

    /// Changes every run `matches` selects with `change`, counting a revision each, and writes
    /// the events the changes call for.
    fn change_runs(
        &mut self,
        matches: impl Fn(&RunRow) -> bool,
        change: impl Fn(&mut RunRow),
        now: f64,
    ) {
        let chosen: Vec<RunId> = self
            .runs
            .values()
            .filter(|run| matches(run))
            .map(|run| run.run_id.clone())
            .collect();
        for run_id in chosen {
            if let Some(run) = self.runs.get_mut(&run_id) {
                let before = run.clone();
                change(run);
                run.revision += 1;
                run.updated_at = now;
                self.run_events(&before, now);
            }
        }
    }

    /// Live workflows holding a place under the limits (the counted statuses), everyone's or
    /// one user's.
    fn counted(&self, user_id: Option<&str>) -> i64 {
        let count = self
            .workflows
            .values()
            .filter(|workflow| {
                workflow.row.status.holds_place()
                    && user_id.is_none_or(|user| workflow.row.user_id == user)
            })
            .count();
        i64::try_from(count).unwrap_or(i64::MAX)
    }

    fn put_logs(
        &mut self,
        workflow_id: &WorkflowId,
        lines: &[String],
        events_max: i64,
        bytes_max: i64,
        now: f64,
    ) -> Result<()> {
        let workflow = self.workflow_mut(workflow_id)?;
        let (mut kept, mut bytes, mut dropped) = (
            workflow.log_events,
            workflow.log_bytes,
            workflow.log_dropped,
        );
        let mut events = Vec::new();
        for line in lines {
            let size = i64::try_from(line.len()).unwrap_or(i64::MAX);
            if dropped == 0 && kept < events_max && bytes.saturating_add(size) <= bytes_max {
                kept += 1;
                bytes += size;
                events.push(("log", json!({ "line": line })));
            } else {
                dropped += 1;
                if dropped == 1 {
                    events.push((
                        "log_truncated",
                        json!({"events_max": events_max, "bytes_max": bytes_max}),
                    ));
                }
            }
        }
        (
            workflow.log_events,
            workflow.log_bytes,
            workflow.log_dropped,
        ) = (kept, bytes, dropped);
        for (kind, data) in events {
            self.event(workflow_id, kind, data, now);
        }
        Ok(())
    }
}

fn artifact_exists(workflow_id: &WorkflowId, version: i64) -> Error {
    Error::Conflict(format!(
        "artifact version {version} of workflow {workflow_id:?} exists"
    ))
}

/// The fields every journal event carries.
fn step_fields(row: &StepRow) -> Value {
    json!({"step_id": row.step_id, "attempt": row.attempt, "step_kind": row.kind()})
}

impl crate::Schema for SimStore {
    async fn migrate(&self) -> Result<MigrationReport> {
        Ok(MigrationReport {
            applied: Vec::new(),
            version: SCHEMA_VERSION,
        })
    }

    async fn schema_version(&self) -> Result<i64> {
        Ok(SCHEMA_VERSION)
    }

    async fn write_probe(&self) -> Result<()> {
        Ok(())
    }

    async fn backup(&self, _destination: &std::path::Path) -> Result<crate::BackupReport> {
        Err(Error::Unsupported(
            "the simulation store has no file to back up".into(),
        ))
    }
}

impl crate::Leases for SimStore {
    async fn now(&self) -> Result<f64> {
        Ok(self.clock.seconds())
    }

    async fn acquire_lease(
        &self,
        resource_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Option<Lease>> {
        self.write(|state, now| {
            let epoch = match state.leases.get(resource_id) {
                Some(lease) if lease.expires_at > now => return Ok(None),
                Some(lease) => lease.epoch.next(),
                None => Epoch::FIRST,
            };
            let lease = Lease {
                resource_id: resource_id.to_owned(),
                owner: owner.to_owned(),
                epoch,
                expires_at: now + ttl_seconds(lease_ms),
            };
            state.leases.insert(resource_id.to_owned(), lease.clone());
            Ok(Some(lease))
        })
    }

    async fn renew_lease(&self, fence: &Fence, lease_ms: u64) -> Result<(Lease, f64)> {
        self.write(|state, now| {
            state.check_fence(fence, now)?;
            let lease = state
                .leases
                .get_mut(&fence.resource_id)
                .ok_or_else(|| fence.lost())?;
            lease.expires_at = lease.expires_at.max(now + ttl_seconds(lease_ms));
            Ok((lease.clone(), now))
        })
    }

    async fn release_lease(&self, fence: &Fence) -> Result<bool> {
        self.write(|state, now| {
            if !state.holds(fence, now) {
                return Ok(false);
            }
            if let Some(lease) = state.leases.get_mut(&fence.resource_id) {
                lease.expires_at = now;
            }
            Ok(true)
        })
    }

    async fn read_lease(&self, resource_id: &WorkflowId) -> Result<Option<Lease>> {
        self.read(|state, _| Ok(state.leases.get(resource_id).cloned()))
    }

    async fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> Result<()> {
        let ops = crate::write::ordered(ops);
        self.write(|state, now| {
            state.check_fence(fence, now)?;
            state.check_ops(&ops)?;
            for op in &ops {
                state.apply(fence, op, now)?;
            }
            Ok(())
        })
    }
}

impl crate::Events for SimStore {
    async fn read_events(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> Result<Option<EventPage>> {
        self.read(|state, _| {
            Ok(state.workflows.get(workflow_id).map(|workflow| EventPage {
                events: workflow
                    .events
                    .iter()
                    .filter(|event| event.row.seq > after)
                    .take(limit as usize)
                    .map(|event| event.row.clone())
                    .collect(),
                status: workflow.row.status,
                last_seq: workflow.event_seq,
            }))
        })
    }

    async fn read_feed(
        &self,
        after: i64,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EventRow>> {
        self.read(|state, _| {
            let mut feed: Vec<EventRow> = state
                .workflows
                .values()
                .filter(|workflow| user_id.is_none_or(|user| workflow.row.user_id == user))
                .flat_map(|workflow| &workflow.events)
                .filter_map(|event| {
                    let seq = event.feed_seq.filter(|seq| *seq > after)?;
                    Some(EventRow {
                        seq,
                        ..event.row.clone()
                    })
                })
                .collect();
            feed.sort_by_key(|event| event.seq);
            feed.truncate(limit as usize);
            Ok(feed)
        })
    }

    async fn feed_head(&self) -> Result<i64> {
        self.read(|state, _| Ok(state.feed_seq))
    }

    async fn watch_events(&self, _workflow_id: &WorkflowId, _watch_ms: u64) -> Result<()> {
        Ok(())
    }
}
