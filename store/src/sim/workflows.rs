//! Workflows and controls in the simulation store, by the rules of `sqlite/workflows.rs`.

use std::collections::BTreeMap;

use serde_json::json;

use super::{Artifact, SimStore, State, Step, Workflow};
use crate::lease::ttl_seconds;
use crate::workflows::takeover_refusal;
use crate::write::{
    ArtifactInfo, ArtifactRow, CHECKPOINT_KINDS, Snapshot, StepPage, StepPosition, StepRow,
    WorkflowRow,
};
use crate::{
    ControlKind, ControlRow, ControlWrite, Deletion, Dormancy, Epoch, Error, EventSend, Launch,
    LaunchLimits, Lease, ListFilter, ListedWorkflow, NewControl, NewRetry, NewSentEvent,
    NewWorkflow, Orphaned, Purpose, Result, Retry, RunStatus, SentEvent, StatusFilter, TakeOver,
    Versions, WorkflowId, WorkflowStatus, WriteOp,
};

impl State {
    fn launch(
        &mut self,
        new: NewWorkflow,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
        now: f64,
    ) -> Result<Launch> {
        if let Some(answered) = self.launch_answered(&new, limits)? {
            return Ok(answered);
        }
        let lease = Lease {
            resource_id: new.workflow_id.clone(),
            owner: owner.to_owned(),
            epoch: Epoch::FIRST,
            expires_at: now + ttl_seconds(lease_ms),
        };
        self.leases.insert(new.workflow_id.clone(), lease.clone());
        self.workflows.insert(
            new.workflow_id.clone(),
            Workflow {
                row: WorkflowRow {
                    workflow_id: new.workflow_id.clone(),
                    user_id: new.user_id,
                    status: WorkflowStatus::Running,
                    owner: Some(owner.to_owned()),
                    fingerprint: new.fingerprint,
                    data: new.data,
                    created_at: now,
                    updated_at: now,
                },
                request_id: new.request_id,
                event_seq: 0,
                log_events: 0,
                log_bytes: 0,
                log_dropped: 0,
                steps: BTreeMap::new(),
                artifacts: BTreeMap::new(),
                granted_bytes: 0,
                returned_bytes: 0,
                copied_bytes: 0,
                events: Vec::new(),
                wake_at: None,
                wake_on_events: Vec::new(),
            },
        );
        self.status_event(&new.workflow_id, WorkflowStatus::Running, None, now);
        let row = self.workflows[&new.workflow_id].row.clone();
        Ok(Launch::Created { row, lease })
    }

    /// What a launch answers without writing anything (the request launched before, a limit
    /// refusing it), or why it fails; `None` when it may be written.
    fn launch_answered(&self, new: &NewWorkflow, limits: LaunchLimits) -> Result<Option<Launch>> {
        if let Some(request_id) = &new.request_id
            && let Some(existing) = self.workflows.values().find(|workflow| {
                workflow.row.user_id == new.user_id
                    && workflow.request_id.as_ref() == Some(request_id)
            })
        {
            if existing.row.fingerprint == new.fingerprint {
                return Ok(Some(Launch::Existing(existing.row.clone())));
            }
            return Err(Error::Conflict(format!(
                "request_id {request_id:?} was used for a different workflow"
            )));
        }
        let counted = |user: Option<&str>| u64::try_from(self.counted(user)).unwrap_or(u64::MAX);
        if counted(None) >= limits.max_workflows {
            return Ok(Some(Launch::Refused {
                limit: crate::Limit::Workflows,
                max: limits.max_workflows,
            }));
        }
        if counted(Some(&new.user_id)) >= limits.max_workflows_per_owner {
            return Ok(Some(Launch::Refused {
                limit: crate::Limit::WorkflowsPerOwner,
                max: limits.max_workflows_per_owner,
            }));
        }
        if self.workflows.contains_key(&new.workflow_id) {
            return Err(Error::Conflict(format!(
                "workflow {:?} exists",
                new.workflow_id
            )));
        }
        if self.leases.contains_key(&new.workflow_id) {
            return Err(Error::Conflict(format!(
                "resource {:?} has a lease",
                new.workflow_id
            )));
        }
        Ok(None)
    }

    /// As the real stores' `retry_workflow`: every refusal is decided before anything changes.
    fn retry(
        &mut self,
        retry: NewRetry,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
        now: f64,
    ) -> Result<Retry> {
        let source = &retry.retry_of;
        let Some(workflow) = self.workflows.get(source) else {
            return Ok(Retry::NotFound);
        };
        if let Some(existing) = self
            .retries
            .get(source)
            .and_then(|id| self.workflows.get(id))
        {
            return Ok(Retry::Existing(existing.row.clone()));
        }
        if workflow.row.status != WorkflowStatus::Failed {
            return Ok(Retry::NotFailed(workflow.row.status));
        }
        let mut steps: Vec<Step> = workflow
            .steps
            .values()
            .filter(|step| step.row.seq < retry.adopted_calls)
            .cloned()
            .collect();
        steps.sort_by_key(|step| (step.row.seq, step.row.attempt, step.order));
        let adopted: std::collections::BTreeSet<&str> =
            steps.iter().map(|step| step.row.step_id.as_str()).collect();
        let artifacts: Vec<Artifact> = workflow
            .artifacts
            .values()
            .filter(|artifact| {
                artifact
                    .row
                    .source_step_id
                    .as_deref()
                    .is_some_and(|step| adopted.contains(step))
            })
            .cloned()
            .collect();
        // The new workflow stores the adopted artifacts, the adopted rows' errors and the
        // workspaces copied for it, all inside one grant.
        let bytes: usize = artifacts.iter().map(|a| a.row.content.len()).sum();
        let errors: i64 = steps
            .iter()
            .map(|step| step.row.record().map_or(0, crate::StepRecord::error_bytes))
            .sum();
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX) + errors + retry.copied_bytes;
        match self.launch_answered(&retry.workflow, limits)? {
            Some(Launch::Refused { limit, max }) => return Ok(Retry::Refused { limit, max }),
            // The request id names another workflow: the retry of this one would have been found.
            Some(_) => {
                return Err(Error::Conflict(format!(
                    "request_id {:?} was used for a different workflow",
                    retry.workflow.request_id.as_deref().unwrap_or_default()
                )));
            }
            None => {}
        }
        if bytes > 0 {
            let owner_id = &retry.workflow.user_id;
            if let Err(Error::LimitReached(limit @ crate::Limit::StoredBytes { max, .. })) =
                self.check_storage(owner_id, 0, bytes, retry.stored_bytes_max)
            {
                let max = u64::try_from(max).unwrap_or(0);
                return Ok(Retry::Refused { limit, max });
            }
        }
        let new = retry.workflow.workflow_id.clone();
        let Launch::Created { row, lease } =
            self.launch(retry.workflow, owner, lease_ms, limits, now)?
        else {
            return Err(Error::Database(format!(
                "the retry {new:?} was refused after its checks passed"
            )));
        };
        self.retries.insert(source.clone(), new.clone());
        for artifact in artifacts {
            let data = json!({
                "version": artifact.row.version,
                "bytes": artifact.row.content.len(),
                "step_id": artifact.row.source_step_id,
                "name": artifact.row.path,
            });
            self.workflow_mut(&new)?
                .artifacts
                .insert(artifact.row.version, artifact);
            self.event(&new, "artifact", data, now);
        }
        for mut step in steps {
            step.order = self.next_order();
            let key = (step.row.step_id.clone(), step.row.attempt);
            self.workflow_mut(&new)?.steps.insert(key, step.clone());
            self.journaled(&new, &step, now);
        }
        self.workflow_mut(&new)?.copied_bytes = retry.copied_bytes;
        if bytes > 0 {
            let grant = WriteOp::TakeStorage {
                workflow_id: new.clone(),
                bytes,
                bytes_max: retry.stored_bytes_max,
            };
            self.apply(&lease.fence(), &grant, now)?;
        }
        Ok(Retry::Created { row, lease })
    }

    fn cancel_pending(&self, workflow_id: &WorkflowId) -> bool {
        self.controls.values().any(|control| {
            control.workflow_id == *workflow_id
                && control.kind == ControlKind::Cancel
                && !control.applied
        })
    }

    fn take_over(
        &mut self,
        workflow_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
        versions: &Versions,
        purpose: Purpose,
        now: f64,
    ) -> Result<TakeOver> {
        let workflow = self
            .workflows
            .get(workflow_id)
            .ok_or_else(|| Error::NotFound(format!("workflow {workflow_id:?}")))?;
        let text = |key: &str| {
            workflow.row.data[key]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        let written_under = Versions {
            runtime: text("runtime_version"),
            configuration: text("configuration_version"),
        };
        if let Some(refusal) = takeover_refusal(
            workflow.row.status,
            &written_under,
            versions,
            self.cancel_pending(workflow_id),
            purpose,
        ) {
            return Ok(refusal);
        }
        let Some(lease) = self
            .leases
            .get_mut(workflow_id)
            .filter(|lease| lease.expires_at <= now)
        else {
            return Ok(TakeOver::LeaseHeld);
        };
        lease.owner = owner.to_owned();
        lease.epoch = lease.epoch.next();
        lease.expires_at = now + ttl_seconds(lease_ms);
        let lease = lease.clone();
        let workflow = self.workflow_mut(workflow_id)?;
        workflow.wake_at = None;
        workflow.row.owner = Some(owner.to_owned());
        workflow.row.updated_at = now;
        Ok(TakeOver::Taken(lease))
    }

    /// A control or an event was recorded: a dormant workflow's lease expires now.
    pub(super) fn wake_if_dormant(
        &mut self,
        workflow_id: &WorkflowId,
        event: Option<&str>,
        now: f64,
    ) {
        let Some(workflow) = self.workflows.get_mut(workflow_id) else {
            return;
        };
        if workflow.wake_at.is_none_or(|wake_at| wake_at <= now) {
            return;
        }
        if event.is_some_and(|name| !workflow.wake_on_events.iter().any(|waited| waited == name)) {
            return;
        }
        workflow.wake_at = Some(now);
        if let Some(lease) = self.leases.get_mut(workflow_id)
            && lease.expires_at > now
        {
            lease.expires_at = now;
        }
    }

    /// Whether a workflow is what `get` shows as recoverable: counted, with no lease or an
    /// expired one.
    fn recoverable(&self, workflow: &Workflow, now: f64) -> bool {
        workflow.row.status.holds_place()
            && self
                .leases
                .get(&workflow.row.workflow_id)
                .is_none_or(|lease| lease.expires_at <= now)
    }

    /// As [`StatusFilter::WaitingForInput`] decides: `running`, not recoverable, and a run of
    /// its agent steps waits for a person's answer.
    fn waiting_for_input(&self, workflow: &Workflow, now: f64) -> bool {
        let id = &workflow.row.workflow_id;
        workflow.row.status == WorkflowStatus::Running
            && !self.recoverable(workflow, now)
            && self.runs.values().any(|run| {
                run.workflow.as_ref() == Some(id) && run.status == RunStatus::WaitingForInput
            })
    }

    /// A workflow's waits (see [`crate::WaitKind`]), as the real stores' statements read
    /// them: none unless its status is one of [`crate::WAITING_STATUSES`].
    fn waits_of(&self, workflow: &Workflow) -> Vec<StepRow> {
        if !crate::WAITING_STATUSES.contains(&workflow.row.status) {
            return Vec::new();
        }
        let asks = |step: &StepRow| {
            self.runs.values().any(|run| {
                run.workflow.as_ref() == Some(&workflow.row.workflow_id)
                    && run.step_id.as_deref() == Some(step.step_id.as_str())
                    && run.attempt == Some(step.attempt)
                    && run.status == RunStatus::WaitingForInput
            })
        };
        steps_of(workflow)
            .into_iter()
            .filter(|step| match (step.status, step.kind()) {
                (crate::StepStatus::Queued, Some(crate::StepKind::Agent)) => true,
                (crate::StepStatus::Running, Some(crate::StepKind::Agent)) => asks(step),
                (crate::StepStatus::Running, Some(kind)) => matches!(
                    kind,
                    crate::StepKind::Sleep
                        | crate::StepKind::WaitForEvent
                        | crate::StepKind::Pause
                        | crate::StepKind::HumanCheckpoint
                ),
                _ => false,
            })
            .collect()
    }

    fn controls_of(&self, workflow_id: &WorkflowId) -> Vec<ControlRow> {
        self.controls
            .values()
            .filter(|control| control.workflow_id == *workflow_id)
            .cloned()
            .collect()
    }

    fn put_control(&mut self, control: NewControl, now: f64) -> Result<ControlWrite> {
        if !self.workflows.contains_key(&control.workflow_id) {
            return Err(Error::NotFound(format!(
                "workflow {:?}",
                control.workflow_id
            )));
        }
        if let Some(existing) = self.controls.values().find(|row| {
            row.workflow_id == control.workflow_id
                && row.kind == control.kind
                && row.step_id == control.step_id
                && row.attempt == control.attempt
        }) {
            return if crate::workflows::same_answer(existing, &control) {
                Ok(ControlWrite::Repeated(existing.clone()))
            } else {
                Err(crate::workflows::contradiction(existing))
            };
        }
        self.last_control_id += 1;
        let row = ControlRow {
            id: self.last_control_id,
            workflow_id: control.workflow_id,
            kind: control.kind,
            step_id: control.step_id,
            attempt: control.attempt,
            body: control.body,
            created_by: control.created_by,
            created_at: now,
            applied: false,
        };
        self.controls.insert(row.id, row.clone());
        self.wake_if_dormant(&row.workflow_id, None, now);
        let (kind, data) = match row.kind {
            ControlKind::Decide => (
                "checkpoint_decided",
                json!({
                    "step_id": row.step_id,
                    "attempt": row.attempt,
                    "decision": row.body["decision"],
                    "artifact_version": row.body["artifactVersion"],
                    "comment": row.body["comment"],
                    "by": row.created_by,
                }),
            ),
            ControlKind::Resume => (
                "pause_resumed",
                json!({"step_id": row.step_id, "attempt": row.attempt, "by": row.created_by}),
            ),
            ControlKind::Cancel => ("cancel_requested", json!({"by": row.created_by})),
        };
        self.event(&row.workflow_id, kind, data, now);
        Ok(ControlWrite::Recorded(row))
    }

    fn snapshot(
        &self,
        workflow_id: &WorkflowId,
        steps_max: u32,
        artifacts_max: u32,
        now: f64,
    ) -> Option<Snapshot> {
        let workflow = self.workflows.get(workflow_id)?;
        let StepPage {
            steps,
            approval_runs,
        } = self.step_page(workflow_id, StepPosition::START, steps_max);
        Some(Snapshot {
            row: workflow.row.clone(),
            lease: self.leases.get(workflow_id).cloned(),
            db_now: now,
            retried_by: self.retries.get(workflow_id).cloned(),
            steps,
            checkpoints: steps_of(workflow)
                .into_iter()
                .filter(|step| {
                    step.kind()
                        .is_some_and(|kind| CHECKPOINT_KINDS.contains(&kind))
                })
                .collect(),
            controls: self.controls_of(workflow_id),
            approval_runs,
            artifacts: self.artifact_page(workflow_id, 0, artifacts_max),
            waits: self.waits_of(workflow),
        })
    }

    /// What `step_page!` and `APPROVAL_RUNS_SQL` read on the real stores.
    fn step_page(&self, workflow_id: &WorkflowId, after: StepPosition, limit: u32) -> StepPage {
        let steps: Vec<StepRow> = self
            .workflows
            .get(workflow_id)
            .map(steps_of)
            .unwrap_or_default()
            .into_iter()
            .filter(|step| {
                StepPosition::of(step) > after
                    && !step
                        .kind()
                        .is_some_and(|kind| CHECKPOINT_KINDS.contains(&kind))
            })
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|step| {
                // When its child run was admitted, as the real stores read it from the run's row.
                let started = step
                    .record()
                    .and_then(crate::StepRecord::run_id)
                    .and_then(|run_id| self.runs.get(run_id))
                    .map(|run| run.created_at);
                step.with_run_started_at(started)
            })
            .collect();
        let mut approval_runs: Vec<_> = self
            .runs
            .values()
            .filter(|run| {
                let of_page = || {
                    steps.iter().any(|step| {
                        run.step_id.as_deref() == Some(step.step_id.as_str())
                            && run.attempt == Some(step.attempt)
                    })
                };
                run.workflow.as_ref() == Some(workflow_id)
                    && (run.status == crate::RunStatus::WaitingForInput
                        || (!run.metadata["hitl_answer"].is_null() && of_page()))
            })
            .cloned()
            .collect();
        approval_runs.sort_by(|a, b| {
            a.created_at
                .total_cmp(&b.created_at)
                .then_with(|| a.run_id.cmp(&b.run_id))
        });
        StepPage {
            steps,
            approval_runs,
        }
    }

    fn artifact_page(&self, workflow_id: &WorkflowId, after: i64, limit: u32) -> Vec<ArtifactInfo> {
        let Some(workflow) = self.workflows.get(workflow_id) else {
            return Vec::new();
        };
        workflow
            .artifacts
            .range(after.saturating_add(1)..)
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|(_, artifact)| ArtifactInfo {
                version: artifact.row.version,
                source_step_id: artifact.row.source_step_id.clone(),
                path: artifact.row.path.clone(),
                bytes: i64::try_from(artifact.row.content.len()).unwrap_or(i64::MAX),
                sha256: artifact.row.sha256.clone(),
                created_at: artifact.created_at,
            })
            .collect()
    }
}

/// A workflow's journal by `(seq, attempt)`, in the order written within a tie.
fn steps_of(workflow: &Workflow) -> Vec<StepRow> {
    let mut steps: Vec<_> = workflow.steps.values().collect();
    steps.sort_by_key(|step| (step.row.seq, step.row.attempt, step.order));
    steps.into_iter().map(|step| step.row.clone()).collect()
}

impl crate::Workflows for SimStore {
    async fn launch_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> Result<Launch> {
        self.write(|state, now| state.launch(workflow, owner, lease_ms, limits, now))
    }

    async fn retry_workflow(
        &self,
        retry: NewRetry,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> Result<Retry> {
        self.write(|state, now| state.retry(retry, owner, lease_ms, limits, now))
    }

    async fn take_over_workflow(
        &self,
        workflow_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
        versions: &Versions,
        purpose: Purpose,
    ) -> Result<TakeOver> {
        self.write(|state, now| {
            state.take_over(workflow_id, owner, lease_ms, versions, purpose, now)
        })
    }

    async fn recoverable_workflows(
        &self,
        limit: u32,
        versions: &Versions,
    ) -> Result<Vec<Orphaned>> {
        self.read(|state, now| {
            Ok(state
                .workflows
                .values()
                .filter(|workflow| {
                    workflow.row.status.holds_place()
                        && state
                            .leases
                            .get(&workflow.row.workflow_id)
                            .is_some_and(|lease| lease.expires_at <= now)
                })
                .filter_map(|workflow| {
                    let id = &workflow.row.workflow_id;
                    let cancel_pending = workflow.row.status == WorkflowStatus::Cancelling
                        || state.cancel_pending(id);
                    let data = &workflow.row.data;
                    let runtime = data["runtime_version"].as_str().unwrap_or_default();
                    let configuration = data["configuration_version"].as_str().unwrap_or_default();
                    let ours = runtime == versions.runtime
                        && (configuration.is_empty() || configuration == versions.configuration);
                    (cancel_pending || ours).then(|| Orphaned {
                        workflow_id: id.clone(),
                        cancel_pending,
                    })
                })
                .take(limit as usize)
                .collect())
        })
    }

    async fn dormant_workflows(&self, limit: u32, versions: &Versions) -> Result<Dormancy> {
        let recoverable = self.recoverable_workflows(u32::MAX, versions).await?;
        self.read(|state, now| {
            let wake_at = |id: &WorkflowId| state.workflows.get(id).and_then(|w| w.wake_at);
            let due = recoverable
                .into_iter()
                .filter(|orphan| wake_at(&orphan.workflow_id).is_some_and(|at| at <= now))
                .take(limit as usize)
                .collect();
            let next_wake_at = state
                .workflows
                .values()
                .filter_map(|workflow| workflow.wake_at)
                .filter(|at| *at > now)
                .min_by(f64::total_cmp);
            Ok(Dormancy { due, next_wake_at })
        })
    }

    async fn delete_workflow(&self, workflow_id: &WorkflowId) -> Result<Deletion> {
        self.write(|state, _| {
            let Some(workflow) = state.workflows.get(workflow_id) else {
                return Ok(Deletion::NotFound);
            };
            if !workflow.row.status.is_final() {
                return Ok(Deletion::NotTerminal);
            }
            let (user_id, granted) = (workflow.row.user_id.clone(), workflow.granted_bytes);
            if let Some(stored) = state.stored_bytes.get_mut(&user_id) {
                *stored -= granted;
            }
            state.workflows.remove(workflow_id);
            state
                .retries
                .retain(|retry_of, retry| retry_of != workflow_id && retry != workflow_id);
            state
                .controls
                .retain(|_, control| control.workflow_id != *workflow_id);
            state
                .sent_events
                .retain(|_, event| event.workflow_id != *workflow_id);
            state
                .slots
                .retain(|(workflow, _), _| workflow != workflow_id);
            state.leases.remove(workflow_id);
            Ok(Deletion::Deleted)
        })
    }

    async fn list_workflows(&self, filter: ListFilter) -> Result<Vec<ListedWorkflow>> {
        self.read(|state, now| {
            let mut listed: Vec<ListedWorkflow> = state
                .workflows
                .values()
                .filter(|workflow| {
                    let row = &workflow.row;
                    filter
                        .user_id
                        .as_ref()
                        .is_none_or(|user| row.user_id == *user)
                        && match &filter.status {
                            None => true,
                            Some(StatusFilter::Stored(status)) => row.status == *status,
                            Some(StatusFilter::Recoverable) => state.recoverable(workflow, now),
                            Some(StatusFilter::WaitingForInput) => {
                                state.waiting_for_input(workflow, now)
                            }
                        }
                        && filter.waiting_for.is_none_or(|kind| {
                            let now_ms = (now * 1000.0) as i64;
                            state
                                .waits_of(workflow)
                                .iter()
                                .any(|step| crate::WaitKind::of(step, now_ms) == Some(kind))
                        })
                        && filter.after.as_ref().is_none_or(|after| {
                            (row.created_at, &row.workflow_id)
                                < (after.created_at, &after.workflow_id)
                        })
                        && filter
                            .request_id
                            .as_ref()
                            .is_none_or(|request| workflow.request_id.as_ref() == Some(request))
                })
                .map(|workflow| ListedWorkflow {
                    row: workflow.row.clone(),
                    recoverable: state.recoverable(workflow, now),
                    waiting_for_input: state.waiting_for_input(workflow, now),
                    waits: state.waits_of(workflow),
                })
                .collect();
            listed.sort_by(|a, b| {
                b.row
                    .created_at
                    .total_cmp(&a.row.created_at)
                    .then_with(|| b.row.workflow_id.cmp(&a.row.workflow_id))
            });
            listed.truncate(filter.limit as usize);
            Ok(listed)
        })
    }

    async fn read_workflow(&self, workflow_id: &WorkflowId) -> Result<Option<WorkflowRow>> {
        self.read(|state, _| {
            Ok(state
                .workflows
                .get(workflow_id)
                .map(|workflow| workflow.row.clone()))
        })
    }

    async fn read_steps(&self, workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
        self.read(|state, _| {
            Ok(state
                .workflows
                .get(workflow_id)
                .map(steps_of)
                .unwrap_or_default())
        })
    }

    async fn read_snapshot(
        &self,
        workflow_id: &WorkflowId,
        steps_max: u32,
        artifacts_max: u32,
    ) -> Result<Option<Snapshot>> {
        self.read(|state, now| Ok(state.snapshot(workflow_id, steps_max, artifacts_max, now)))
    }

    async fn read_step_page(
        &self,
        workflow_id: &WorkflowId,
        after: StepPosition,
        limit: u32,
    ) -> Result<StepPage> {
        self.read(|state, _| Ok(state.step_page(workflow_id, after, limit)))
    }

    async fn read_artifact_page(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<ArtifactInfo>> {
        self.read(|state, _| Ok(state.artifact_page(workflow_id, after, limit)))
    }

    async fn read_artifact(
        &self,
        workflow_id: &WorkflowId,
        version: i64,
    ) -> Result<Option<ArtifactRow>> {
        self.read(|state, _| {
            Ok(state
                .workflows
                .get(workflow_id)
                .and_then(|workflow| workflow.artifacts.get(&version))
                .map(|artifact| artifact.row.clone()))
        })
    }

    async fn last_artifact_version(&self, workflow_id: &WorkflowId) -> Result<i64> {
        self.read(|state, _| {
            Ok(state
                .workflows
                .get(workflow_id)
                .and_then(|workflow| workflow.artifacts.keys().next_back().copied())
                .unwrap_or(0))
        })
    }
}

impl crate::Controls for SimStore {
    async fn put_control(&self, control: NewControl) -> Result<ControlWrite> {
        self.write(|state, now| state.put_control(control, now))
    }

    async fn read_controls(&self, workflow_id: &WorkflowId) -> Result<Vec<ControlRow>> {
        self.read(|state, _| Ok(state.controls_of(workflow_id)))
    }

    async fn send_event(&self, event: NewSentEvent) -> Result<EventSend> {
        self.write(|state, now| state.send_event(event, now))
    }

    async fn pending_events(
        &self,
        workflow_id: &WorkflowId,
        names: Vec<String>,
        per_name: u32,
    ) -> Result<Vec<SentEvent>> {
        self.read(|state, _| Ok(state.pending_events(workflow_id, &names, per_name)))
    }

    async fn workflows_with_pending_controls(&self, owner: &str) -> Result<Vec<WorkflowId>> {
        self.read(|state, _| {
            let mut pending: Vec<WorkflowId> = state
                .controls
                .values()
                .filter(|control| !control.applied)
                .filter(|control| {
                    state
                        .workflows
                        .get(&control.workflow_id)
                        .is_some_and(|workflow| workflow.row.owner.as_deref() == Some(owner))
                })
                .map(|control| control.workflow_id.clone())
                .collect();
            pending.sort();
            pending.dedup();
            Ok(pending)
        })
    }
}
