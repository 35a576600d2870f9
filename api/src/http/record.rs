//! The workflow record of spec section 3, built from what the store holds: the row, the first
//! page of the journal's steps, the checkpoints, the controls, the lease and the first page of
//! the artifact versions. `steps` are the `agent`, `captureArtifact` and `readArtifact` calls (a
//! page of them at a time, `steps_next` leading on); `checkpoints` are the places where the
//! workflow waits for a person (`pause` and `humanCheckpoint`), all of them; `artifacts` the
//! versions without their bytes (a page at a time, `artifacts_next` leading on). A step whose
//! agent asked for approval shows the request, read from its child run's row
//! (`metadata.hitl_approval` while it waits, `metadata.hitl_answer` once answered) in the same
//! snapshot. `waiting_for` says what a live workflow waits for, from its journal's waiting
//! entries (see `store::WaitKind`), in a record and a listing alike.

use actors::WorkflowView;
use serde_json::Value;
use store::{
    ApprovalSlot, ArtifactInfo, ControlKind, ControlRow, ListedWorkflow, RunRow, RunStatus,
    StepKind, StepOutcome, StepPosition, StepRow, StepStatus, WaitKind, WorkflowDoc, WorkflowRow,
    WorkflowStatus,
};

use super::error::ApiError;
use super::wire::{
    ApprovalRecord, ArtifactRecord, CheckpointRecord, ReconciledRecord, ReconciliationRecord,
    RetryRecord, StepRecord, WaitRecord, WorkflowRecord, WorkflowSummary,
};

/// How many steps and artifact versions a record's page holds at most
/// (`http.record_steps_page_max`, `http.record_artifacts_page_max`).
#[derive(Debug, Clone, Copy)]
pub struct PageMax {
    pub steps: u32,
    pub artifacts: u32,
}

impl PageMax {
    /// What a record's read asks the store for: one more of each than a page holds, which
    /// tells whether there are more.
    pub fn read(self) -> (u32, u32) {
        (
            self.steps.saturating_add(1),
            self.artifacts.saturating_add(1),
        )
    }
}

/// The record `get` answers with, from a view read with [`PageMax::read`].
pub fn record(view: &WorkflowView, pages: PageMax) -> WorkflowRecord {
    let row = &view.row;
    // A document this build cannot decode shows as blanks: the rest of the record still answers
    // (the supervisor, which must run it, is the one that refuses it).
    let doc = WorkflowDoc::decode(&row.workflow_id, &row.data).ok();
    let (mut steps, steps_next) = step_page(&view.steps, &view.approval_runs, pages.steps);
    let reconciliation = reconciliation(row);
    if let Some(why) = &reconciliation {
        mark_uncertain(&mut steps, why);
    }
    let (artifacts, artifacts_next) = artifact_page(&view.artifacts, pages.artifacts);
    let asks = waiting_requests(view).next().is_some();
    WorkflowRecord {
        run_id: row.workflow_id.as_str().to_owned(),
        title: title(row),
        status: shown_status(row, view.recoverable, asks),
        stored_status: row.status.as_str().to_owned(),
        waiting_for: waiting_for(row, &view.waits),
        recoverable: view.recoverable,
        user_id: row.user_id.clone(),
        owner: row.owner.clone(),
        epoch: view.lease.as_ref().map(|l| l.epoch.get()),
        lease_expires_at: view.lease.as_ref().map(|l| l.expires_at),
        script: doc.as_ref().map(|d| d.script.clone()).unwrap_or_default(),
        args: doc.as_ref().map(|d| d.args.clone()).unwrap_or_default(),
        fingerprint: row.fingerprint.clone(),
        runtime_version: doc.as_ref().and_then(|d| d.runtime_version.clone()),
        configuration_version: doc.as_ref().and_then(|d| d.configuration_version.clone()),
        checkpoints: view
            .checkpoints
            .iter()
            .map(|s| checkpoint(s, &view.controls))
            .collect(),
        steps,
        steps_next,
        artifacts,
        artifacts_next,
        result: doc.as_ref().and_then(|d| d.result.clone()),
        error: doc.as_ref().and_then(|d| d.error.clone()),
        reconciliation,
        retry_of: doc.as_ref().and_then(|d| d.retry_of.clone()),
        retried_by: view.retried_by.as_ref().map(|id| id.as_str().to_owned()),
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

/// The attempt a workflow that needs reconciliation waits on shows `needs_reconciliation`, not
/// the `running` its row keeps (nothing runs it: an operator's reconcile settles it).
pub fn mark_uncertain(steps: &mut [StepRecord], why: &ReconciliationRecord) {
    for step in steps.iter_mut().filter(|step| {
        step.status == StepStatus::Running.as_str()
            && step.step_id == why.step_id
            && (why.run_id.is_empty() || step.run_id.as_deref() == Some(why.run_id.as_str()))
    }) {
        step.status = WorkflowStatus::NeedsReconciliation.as_str().to_owned();
    }
}

/// The first `max` of `rows` (read as `max + 1`) as a record shows them, and the position after
/// the last of them when more follow.
pub fn step_page(
    rows: &[StepRow],
    approval_runs: &[RunRow],
    max: u32,
) -> (Vec<StepRecord>, Option<String>) {
    let shown = &rows[..rows.len().min(usize::try_from(max).unwrap_or(usize::MAX))];
    let next = (rows.len() > shown.len())
        .then(|| shown.last().map(|last| step_cursor(StepPosition::of(last))))
        .flatten();
    let mut records: Vec<StepRecord> = shown.iter().map(|s| step(s, approval_runs)).collect();
    name_retry_reasons(&mut records);
    (records, next)
}

/// An attempt queued after its step's attempt before failed shows that attempt's error as its
/// reason: the journal stores the error once, on the failed attempt's row. Where the attempt
/// before is not on the page, the reason names it.
fn name_retry_reasons(records: &mut [StepRecord]) {
    let errors: std::collections::HashMap<(String, i32), String> = records
        .iter()
        .filter_map(|record| {
            let error = record.error.clone()?;
            Some(((record.step_id.clone(), record.attempt), error))
        })
        .collect();
    for record in records.iter_mut() {
        let before = record.attempt - 1;
        if let Some(retry) = &mut record.retry
            && retry.reason.is_empty()
        {
            retry.reason = errors
                .get(&(record.step_id.clone(), before))
                .cloned()
                .unwrap_or_else(|| format!("attempt {before} failed: see its error"));
        }
    }
}

/// The first `max` of `infos` (read as `max + 1`) as a record shows them, and the last version
/// of them when more follow.
pub fn artifact_page(infos: &[ArtifactInfo], max: u32) -> (Vec<ArtifactRecord>, Option<i64>) {
    let shown = &infos[..infos.len().min(usize::try_from(max).unwrap_or(usize::MAX))];
    let next = (infos.len() > shown.len())
        .then(|| shown.last().map(|last| last.version))
        .flatten();
    (shown.iter().map(artifact).collect(), next)
}

/// A step's position as a page's cursor: `<seq>_<attempt>`.
fn step_cursor(position: StepPosition) -> String {
    format!("{}_{}", position.seq, position.attempt)
}

/// The position a cursor of [`step_cursor`] names; anything else is refused (400).
pub fn parse_step_cursor(text: &str) -> Result<StepPosition, ApiError> {
    let refused = || {
        ApiError::bad_request(format!(
            "query `after` {text:?} is not a position a record gave as `steps_next` (or a page \
             as `next`)"
        ))
    };
    if !super::rules::STEP_CURSOR.is_match(text) {
        return Err(refused());
    }
    let (seq, attempt) = text.split_once('_').ok_or_else(refused)?;
    let number = |digits: &str| -> Result<i32, ApiError> {
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(refused());
        }
        digits.parse().map_err(|_| refused())
    };
    Ok(StepPosition {
        seq: number(seq)?,
        attempt: number(attempt)?,
    })
}

/// The agents' requests that wait for a person's answer, whichever page their steps are on:
/// `(step_id, attempt, request)` of each.
pub fn waiting_requests(view: &WorkflowView) -> impl Iterator<Item = (&str, i32, ApprovalRecord)> {
    view.approval_runs
        .iter()
        .filter(|run| pending_request(run).is_some())
        .filter_map(|run| Some((run.step_id.as_deref()?, run.attempt?, approval(run)?)))
}

/// The pauses and checkpoints nobody has answered yet.
pub fn waiting_checkpoints(view: &WorkflowView) -> impl Iterator<Item = &StepRow> {
    view.checkpoints
        .iter()
        .filter(|step| answer(step, &view.controls).0 == CheckpointStatus::Waiting)
}

/// A listing's line.
pub fn summary(listed: &ListedWorkflow) -> WorkflowSummary {
    let row = &listed.row;
    WorkflowSummary {
        run_id: row.workflow_id.as_str().to_owned(),
        title: title(row),
        status: shown_status(row, listed.recoverable, listed.waiting_for_input),
        stored_status: row.status.as_str().to_owned(),
        waiting_for: waiting_for(row, &listed.waits),
        recoverable: listed.recoverable,
        user_id: row.user_id.clone(),
        owner: row.owner.clone(),
        fingerprint: row.fingerprint.clone(),
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

/// What a workflow waits for, from its waits (see [`store::WaitKind`]), judged now (a queued
/// attempt whose backoff is over waits for a slot). A record and a listing say the same.
fn waiting_for(row: &WorkflowRow, waits: &[StepRow]) -> Vec<WaitRecord> {
    if !store::WAITING_STATUSES.contains(&row.status) {
        return Vec::new();
    }
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |now| i64::try_from(now.as_millis()).unwrap_or(i64::MAX));
    waits.iter().filter_map(|step| wait(step, now_ms)).collect()
}

/// What one waiting journal entry waits for, if it waits.
fn wait(step: &StepRow, now_ms: i64) -> Option<WaitRecord> {
    let record = step.record()?;
    let seconds = |ms: i64| ms as f64 / 1000.0;
    let step_id = step.step_id.clone();
    let deadline = record.call.deadline_at_ms().map(seconds);
    Some(match (WaitKind::of(step, now_ms)?, &record.call) {
        (WaitKind::Sleep, store::StepCall::Sleep { due_at_ms }) => WaitRecord::Sleep {
            step_id,
            until: seconds((*due_at_ms)?),
        },
        (WaitKind::Event, _) => WaitRecord::Event {
            step_id,
            name: text(&record.args["name"]).unwrap_or_default(),
            deadline,
        },
        (WaitKind::Person, _) => WaitRecord::Person {
            step_id,
            call: step.kind_name().to_owned(),
            deadline,
        },
        (WaitKind::Slot, _) => WaitRecord::Slot {
            step_id,
            attempt: step.attempt,
        },
        (
            WaitKind::Retry,
            store::StepCall::Agent {
                retry: Some(retry), ..
            },
        ) => WaitRecord::Retry {
            step_id,
            at: seconds(retry.due_at_ms),
            attempt: step.attempt,
            max_attempts: retry.max_attempts,
        },
        _ => return None,
    })
}

/// The recorded reason of a workflow that waits for an operator's reconcile.
pub fn reconciliation(row: &WorkflowRow) -> Option<ReconciliationRecord> {
    if row.status != WorkflowStatus::NeedsReconciliation {
        return None;
    }
    let why = WorkflowDoc::reconciliation_of(&row.data);
    Some(ReconciliationRecord {
        reason: why
            .as_ref()
            .and_then(|w| w.reason.clone())
            .unwrap_or_else(|| "unrecorded".to_owned()),
        message: why
            .as_ref()
            .and_then(|w| w.message.clone())
            .unwrap_or_else(|| "recorded before reasons were kept".to_owned()),
        step_id: why.as_ref().map(|w| w.step_id.clone()).unwrap_or_default(),
        run_id: why.as_ref().map(|w| w.run_id.clone()).unwrap_or_default(),
        at: why.and_then(|w| w.at_ms).map(|ms| ms as f64 / 1000.0),
    })
}

/// The status a record and a listing show: `recoverable` first (an operator's to act on), then
/// `waiting_for_input` for a running workflow whose agent waits for a person's answer (`asks`),
/// else the stored status. Neither is stored: each is read from the lease and the runs.
fn shown_status(row: &WorkflowRow, recoverable: bool, asks: bool) -> String {
    if recoverable {
        "recoverable".to_owned()
    } else if asks && row.status == WorkflowStatus::Running {
        WAITING_FOR_INPUT.to_owned()
    } else {
        row.status.as_str().to_owned()
    }
}

/// The status of a running workflow whose agent waits for a person (see [`shown_status`]).
pub const WAITING_FOR_INPUT: &str = "waiting_for_input";

/// The launch's title, kept in the workflow's document.
pub fn title(row: &WorkflowRow) -> Option<String> {
    WorkflowDoc::title_of(&row.data).map(str::to_owned)
}

fn text(value: &Value) -> Option<String> {
    value.as_str().map(str::to_owned)
}

/// `(resolved value, rejection)` of a journal entry's outcome.
fn outcome(step: &StepRow) -> (Option<&Value>, Option<&Value>) {
    match step.record().and_then(|record| record.outcome.as_ref()) {
        Some(StepOutcome::Resolved(value)) => (Some(value), None),
        Some(StepOutcome::Rejected(value)) => (None, Some(value)),
        None => (None, None),
    }
}

fn step(step: &StepRow, approval_runs: &[RunRow]) -> StepRecord {
    let (resolved, rejected) = outcome(step);
    let record = step.record();
    let child = record.and_then(store::StepRecord::child);
    let run_id = child.map(|child| child.run_id.as_str().to_owned());
    let asked = run_id
        .as_deref()
        .and_then(|id| approval_runs.iter().find(|run| run.run_id == id));
    let waiting = asked.is_some_and(|run| pending_request(run).is_some());
    let approval = asked.and_then(approval);
    let run_started_at = run_started_at(step);
    let finished_at = settled_at(step);
    StepRecord {
        step_id: step.step_id.clone(),
        kind: step.kind_name().to_owned(),
        attempt: step.attempt,
        status: if waiting && step.status == StepStatus::Running {
            "waiting_for_input".to_owned()
        } else {
            step.status.as_str().to_owned()
        },
        thread_id: child.map(|child| child.thread_id.clone()),
        run_id,
        configuration_version: child.and_then(|child| child.configuration_version.clone()),
        output: resolved
            .filter(|_| step.kind() == Some(StepKind::Agent))
            .map(|v| v["output"].clone()),
        artifact_version: match step.kind() {
            Some(StepKind::ReadArtifact) => record.and_then(store::StepRecord::artifact_version),
            _ => resolved.and_then(|v| v["artifactVersion"].as_i64()),
        },
        error: rejected.map(|v| {
            v["message"]
                .as_str()
                .map_or_else(|| v.to_string(), str::to_owned)
        }),
        error_status: rejected.and_then(|v| text(&v["status"])),
        retry: match record.map(|record| &record.call) {
            Some(store::StepCall::Agent {
                retry: Some(wait), ..
            }) => Some(RetryRecord {
                due_at: wait.due_at_ms as f64 / 1000.0,
                // Filled from the attempt before when it failed (`name_retry_reasons`).
                reason: wait.reason.clone().unwrap_or_default(),
            }),
            _ => None,
        },
        wakes_at: match record.map(|record| &record.call) {
            Some(store::StepCall::Sleep {
                due_at_ms: Some(due),
            }) => Some(*due as f64 / 1000.0),
            _ => None,
        },
        deadline_at: record
            .and_then(|record| record.call.deadline_at_ms())
            .map(|at| at as f64 / 1000.0),
        approval,
        started_at: step.created_at,
        run_started_at,
        waited_ms: run_started_at.map(|at| millis_between(step.created_at, at)),
        ran_ms: run_started_at
            .zip(finished_at)
            .map(|(from, to)| millis_between(from, to)),
        finished_at,
        reconciled: record
            .and_then(|record| record.reconciled.as_ref())
            .map(|reconciled| ReconciledRecord {
                by: reconciled.by.clone(),
                reason: reconciled.reason.clone(),
                resolution: reconciled.resolution.clone(),
            }),
    }
}

/// When a step began to run: an `agent` attempt when its child run was admitted (read from the
/// run's row; where that row is gone, its retry's due time or its journaling), any other step
/// when it was journaled. An attempt never admitted has not begun.
fn run_started_at(step: &StepRow) -> Option<f64> {
    let record = step.record()?;
    match &record.call {
        store::StepCall::Agent { child: None, .. } => None,
        store::StepCall::Agent { retry, .. } => step.run_started_at.or_else(|| {
            Some(retry.as_ref().map_or(step.created_at, |wait| {
                (wait.due_at_ms as f64 / 1000.0).max(step.created_at)
            }))
        }),
        _ => Some(step.created_at),
    }
}

/// Whole milliseconds from `from` to `to` (epoch seconds), never negative: the two may be read
/// from different clocks (the database's and the owner's).
fn millis_between(from: f64, to: f64) -> i64 {
    ((to - from).max(0.0) * 1000.0).round() as i64
}

fn artifact(info: &ArtifactInfo) -> ArtifactRecord {
    let path = info.path.as_deref();
    ArtifactRecord {
        version: info.version,
        step_id: info.source_step_id.clone(),
        path: info.path.clone(),
        name: super::downloads::file_name(path, info.version),
        bytes: info.bytes,
        media_type: super::downloads::served(path, info.source_step_id.is_some())
            .content_type
            .to_owned(),
        sha256: info.sha256.clone(),
        created_at: info.created_at,
    }
}

/// The id of the request a child run waits for a person to answer, if it waits.
fn pending_request(run: &RunRow) -> Option<&str> {
    if run.status == RunStatus::WaitingForInput {
        store::pending_request_id(&run.metadata)
    } else {
        None
    }
}

/// The approval request of a child run: the pending one, or the answered one.
pub fn approval(run: &RunRow) -> Option<ApprovalRecord> {
    let slot = ApprovalSlot::of(&run.metadata);
    if let (Some(request_id), Some(asked)) = (pending_request(run), slot.asked()) {
        return Some(ApprovalRecord {
            run_id: run.run_id.as_str().to_owned(),
            request_id: request_id.to_owned(),
            actions: asked.actions.clone(),
            status: "waiting".to_owned(),
            asked_at: Some(run.updated_at),
            answer: None,
        });
    }
    let answered = slot.answered()?;
    Some(ApprovalRecord {
        run_id: run.run_id.as_str().to_owned(),
        request_id: answered.request_id.to_owned(),
        actions: answered.actions().clone(),
        status: "answered".to_owned(),
        asked_at: None,
        answer: Some(answered.answer.clone()),
    })
}

/// Where a pause or a checkpoint stands (its record's `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CheckpointStatus {
    /// Nobody has answered it yet.
    Waiting,
    Resumed,
    Approved,
    Rejected,
}

impl CheckpointStatus {
    const fn as_str(self) -> &'static str {
        match self {
            CheckpointStatus::Waiting => "waiting",
            CheckpointStatus::Resumed => "resumed",
            CheckpointStatus::Approved => "approved",
            CheckpointStatus::Rejected => "rejected",
        }
    }
}

/// Where a pause or a checkpoint stands, from the control recorded for it, and that control.
fn answer<'a>(
    step: &StepRow,
    controls: &'a [ControlRow],
) -> (CheckpointStatus, Option<&'a ControlRow>) {
    let kind = if step.kind() == Some(StepKind::Pause) {
        ControlKind::Resume
    } else {
        ControlKind::Decide
    };
    let control = controls
        .iter()
        .find(|c| c.kind == kind && c.step_id == step.step_id && c.attempt == step.attempt);
    let status = match control {
        None => CheckpointStatus::Waiting,
        Some(_) if kind == ControlKind::Resume => CheckpointStatus::Resumed,
        Some(control) => match control.body["decision"].as_str() {
            Some("approve") => CheckpointStatus::Approved,
            Some("reject") => CheckpointStatus::Rejected,
            _ => CheckpointStatus::Waiting,
        },
    };
    (status, control)
}

/// A pause's or a checkpoint's record.
pub fn checkpoint(step: &StepRow, controls: &[ControlRow]) -> CheckpointRecord {
    let (status, control) = answer(step, controls);
    let (resolved, _) = outcome(step);
    let record = step.record();
    CheckpointRecord {
        step_id: step.step_id.clone(),
        kind: step.kind_name().to_owned(),
        attempt: step.attempt,
        source_step_id: record
            .and_then(|record| record.args["sourceStepId"].as_str())
            .map(str::to_owned),
        artifact_version: record.and_then(store::StepRecord::artifact_version),
        status: status.as_str().to_owned(),
        // A deadline's answer is nobody's: it says `by: "timeout"`.
        decided_by: control.and_then(|c| match c.body["by"].as_str() {
            Some(by) => Some(by.to_owned()),
            None => c.created_by.clone(),
        }),
        deadline_at: record
            .and_then(|record| record.call.deadline_at_ms())
            .map(|at| at as f64 / 1000.0),
        // When the owner applied the decision; until then, when it was recorded.
        decided_at: resolved
            .and_then(|v| v["decidedAt"].as_f64())
            .map(|ms| ms / 1000.0)
            .or_else(|| control.map(|c| c.created_at)),
        message: record
            .and_then(|record| record.args["message"].as_str())
            .map(str::to_owned),
        comment: control
            .and_then(|c| c.body["comment"].as_str())
            .map(str::to_owned),
        started_at: step.created_at,
    }
}

/// When a journal entry's outcome was recorded, in epoch seconds.
fn settled_at(step: &StepRow) -> Option<f64> {
    let at_ms = step.record()?.settled_at_ms?;
    Some(at_ms as f64 / 1000.0)
}
