//! The front door's rules, as functions of what was read: whether a launch may be written and
//! what it writes, whether a control names the step it answers, what a takeover's answer means,
//! what a reconcile writes, which slot waiters a freed slot wakes; and every claim and takeover
//! decision: how often and what a claim takes, when a dormant workflow's wake is planned, whether
//! a takeover may start here, what follows it. The workflows actor and its handle read, ask a
//! rule, and write (the simulation asks the same rules); everything here is tested without an
//! actor, a database or a clock.

use std::collections::VecDeque;
use std::time::Duration;

use runtime::CallKind;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use store::{
    LaunchLimits, NewRetry, NewWorkflow, Reconciled, StepCall, StepKind, StepOutcome, StepRecord,
    StepRow, StepStatus, TakeOver, WorkflowId, WorkflowRow, WorkflowStatus, WriteOp,
};

use super::journal::step_kind;
use super::requests::{Decide, LaunchRequest, ReconcileRequest, Resolution, RetryRequest};
use super::{Start, WorkflowDocument, thread_for};
use crate::error::{Error, Takeover};

/// The digest a control names to prove it is about this script and these arguments.
pub fn fingerprint(script: &str, args: &Value) -> String {
    fingerprint_of(script, &args.to_string())
}

/// [`fingerprint`] of arguments already serialised.
fn fingerprint_of(script: &str, args_text: &str) -> String {
    let mut digest = Sha256::new();
    digest.update(script.as_bytes());
    digest.update([0]);
    digest.update(args_text.as_bytes());
    digest
        .finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The longest life a launch may ask for (`timeout_seconds`): a year.
pub const TIMEOUT_SECONDS_MAX: u64 = 365 * 86_400;

/// Checks a launch against its limits before anything is written, and makes the row it writes
/// and the workflow its supervisor starts from (typed: the document is never parsed back):
/// `workflow_id` and `now_ms` are the caller's (a fresh id, the database's clock as read), and the seed of
/// the script's randomness follows from the id. Its life limit is the launch's own
/// `timeout_seconds`, else the node's (`default_timeout_ms`), else none.
pub(super) fn launch(
    limits: &runtime::Limits,
    configuration_version: String,
    request: &LaunchRequest,
    (workflow_id, now_ms): (WorkflowId, i64),
    default_timeout_ms: Option<u64>,
) -> Result<(NewWorkflow, Supervised), Error> {
    if let Some(seconds) = request.timeout_seconds
        && !(1..=TIMEOUT_SECONDS_MAX).contains(&seconds)
    {
        return Err(Error::InvalidRequest(format!(
            "timeout_seconds is {seconds}: it must be 1 to {TIMEOUT_SECONDS_MAX} (a year); \
             leave it out for the node's limit (limits.timeout_seconds, none when 0)"
        )));
    }
    let timeout_ms = request
        .timeout_seconds
        .map(|seconds| seconds.saturating_mul(1000))
        .or(default_timeout_ms);
    if request.script.len() as u64 > limits.script_bytes_max {
        return Err(Error::TooLarge {
            what: "script",
            bytes: request.script.len(),
            limit_name: "script_bytes_max",
            limit: usize::try_from(limits.script_bytes_max).unwrap_or(usize::MAX),
        });
    }
    let args_text = request.args.to_string();
    let args_bytes = args_text.len();
    if args_bytes as u64 > limits.frame_bytes_max {
        return Err(Error::TooLarge {
            what: "args",
            bytes: args_bytes,
            limit_name: "frame_bytes_max",
            limit: usize::try_from(limits.frame_bytes_max).unwrap_or(usize::MAX),
        });
    }
    let seed = u64::from_le_bytes(
        Sha256::digest(workflow_id.as_str().as_bytes())[..8]
            .try_into()
            .unwrap_or([0; 8]),
    );
    let document = WorkflowDocument::launched(
        request.script.clone(),
        request.args.clone(),
        request.title.clone(),
        seed,
        now_ms,
        timeout_ms,
        runtime::runtime_version(limits),
        configuration_version,
    );
    let row = NewWorkflow {
        fingerprint: fingerprint_of(&request.script, &args_text),
        data: document.encode(),
        workflow_id: workflow_id.clone(),
        user_id: request.user_id.clone(),
        request_id: request.request_id.clone(),
    };
    let supervised = Supervised {
        workflow_id,
        user_id: request.user_id.clone(),
        document,
    };
    Ok((row, supervised))
}

/// A retry as its rule decided it: what the store writes, the workflow its supervisor starts
/// from (by replay, at epoch 1), and the workspaces that go with the agent steps it adopts.
#[derive(Debug)]
pub(super) struct Retried {
    pub(super) retry: NewRetry,
    pub(super) workflow: Supervised,
    /// Each adopted agent step's thread in the workflow retried and in the retry, `(from, to)`:
    /// a capture of the retry reads its source step's files from its own thread of that step.
    pub(super) threads: Vec<(String, String)>,
}

/// Why a workflow at `status` is not run again, and what to do instead; `None` when it failed.
fn not_retryable(status: WorkflowStatus) -> Option<String> {
    Some(match status {
        WorkflowStatus::Failed => return None,
        WorkflowStatus::Completed => "it completed: there is nothing to run again".to_owned(),
        WorkflowStatus::Cancelled => "it was cancelled, which a retry does not undo: launch it \
                                      anew (`reins run`) to start over"
            .to_owned(),
        WorkflowStatus::NeedsReconciliation => "it needs reconciliation: it is still live and \
                                                waits for an operator to settle its uncertain \
                                                step with `reins reconcile`"
            .to_owned(),
        live => format!("it is {live}: only a failed workflow is retried"),
    })
}

/// A failed workflow run again from its failed step, from its row and journal as read: a new
/// workflow (`workflow_id`, launched at `now_ms`) with the same script, arguments, seed, clock
/// and owner, which adopts every call of the journal before the first one that did not complete
/// (the call whose failure failed the workflow, or the first a failed `parallel` left
/// unfinished; with every call completed, the script failed outside them and all are adopted).
/// Replay is exact: the adopted calls' outcomes are handed to the script as they were, in call
/// order, and `Date.now()`, `Math.random()` start where the source's did. Refused, with nothing
/// written, for a workflow that did not fail, one written by another runtime (its replay could
/// diverge) and one whose journal cannot be read before that call.
pub(super) fn retry(
    source: &WorkflowRow,
    steps: &[StepRow],
    ours: &store::Versions,
    request: &RetryRequest,
    stored_bytes_max: u64,
    workflow_id: WorkflowId,
    now_ms: i64,
) -> Result<Retried, Error> {
    let refused = |reason: String| Error::NotRetryable {
        workflow_id: source.workflow_id.clone(),
        reason,
    };
    if let Some(reason) = not_retryable(source.status) {
        return Err(refused(reason));
    }
    let document = WorkflowDocument::decode(&source.workflow_id, &source.data)?;
    let runtime = document.runtime_version.as_deref().unwrap_or_default();
    if runtime != ours.runtime {
        return Err(refused(format!(
            "its journal was written by runtime {runtime:?}, this node runs {:?}: its steps \
             would not replay; launch it anew",
            ours.runtime
        )));
    }
    let mut newest: std::collections::BTreeMap<i32, &StepRow> = std::collections::BTreeMap::new();
    for step in steps {
        if newest
            .get(&step.seq)
            .is_none_or(|known| known.attempt < step.attempt)
        {
            newest.insert(step.seq, step);
        }
    }
    let mut adopted_calls = 0;
    let mut threads = Vec::new();
    for (seq, step) in newest {
        if seq != adopted_calls || step.status != StepStatus::Completed {
            break;
        }
        let record = step.record.as_ref().map_err(|problem| {
            refused(format!(
                "call {seq} of its journal (step {:?}) cannot be read ({problem}): a retry would \
                 run it again",
                step.step_id
            ))
        })?;
        if record.kind() == StepKind::Agent {
            threads.push((
                thread_for(&source.workflow_id, &step.step_id),
                thread_for(&workflow_id, &step.step_id),
            ));
        }
        adopted_calls += 1;
    }
    let document = WorkflowDocument::retried(
        &document,
        &source.workflow_id,
        now_ms,
        ours.runtime.clone(),
        ours.configuration.clone(),
    );
    let retry = NewRetry {
        workflow: NewWorkflow {
            workflow_id: workflow_id.clone(),
            user_id: source.user_id.clone(),
            request_id: request.request_id.clone(),
            fingerprint: source.fingerprint.clone(),
            data: document.encode(),
        },
        retry_of: source.workflow_id.clone(),
        adopted_calls,
        stored_bytes_max: i64::try_from(stored_bytes_max).unwrap_or(i64::MAX),
        // Known once the workspaces are copied, before the retry is written.
        copied_bytes: 0,
    };
    let workflow = Supervised {
        workflow_id,
        user_id: source.user_id.clone(),
        document,
    };
    Ok(Retried {
        retry,
        workflow,
        threads,
    })
}

/// A workflow as its supervisor starts from it: launched here (typed), or read back from the
/// store for a takeover.
#[derive(Debug, Clone)]
pub(crate) struct Supervised {
    pub(crate) workflow_id: WorkflowId,
    pub(crate) user_id: String,
    pub(crate) document: WorkflowDocument,
}

impl Supervised {
    /// A stored workflow, for a takeover: its document is read here, and one that cannot be
    /// decoded is a stored value the store cannot give (500), not the caller's bad request.
    pub(super) fn stored(row: WorkflowRow) -> Result<Self, Error> {
        Ok(Supervised {
            document: WorkflowDocument::decode(&row.workflow_id, &row.data)?,
            workflow_id: row.workflow_id,
            user_id: row.user_id,
        })
    }
}

/// A control that names the script it is about (its fingerprint) is refused when the workflow
/// runs another.
pub(super) fn same_script(row: &WorkflowRow, given: &str) -> Result<(), Error> {
    if row.fingerprint == given {
        Ok(())
    } else {
        Err(Error::StaleFingerprint {
            given: given.to_owned(),
            current: row.fingerprint.clone(),
        })
    }
}

/// The journal entry a control answers: the newest attempt of `step_id`, which must be a
/// `kind` call at `attempt`. A control for a step the script has not reached, of another kind
/// or for another attempt is a conflict, and nothing is recorded.
pub(super) fn answered_step(
    steps: Vec<StepRow>,
    step_id: &str,
    kind: CallKind,
    attempt: i32,
) -> Result<StepRow, Error> {
    let Some(step) = steps
        .into_iter()
        .filter(|s| s.step_id == step_id)
        .max_by_key(|s| s.attempt)
    else {
        return Err(Error::StepNotReached {
            step_id: step_id.to_owned(),
        });
    };
    let stored = step.kind();
    if stored != Some(step_kind(kind)) {
        return Err(Error::WrongStepKind {
            step_id: step_id.to_owned(),
            kind: stored.map_or("unreadable", StepKind::as_str).to_owned(),
            expected: kind.as_str(),
        });
    }
    if step.attempt != attempt {
        return Err(Error::WrongAttempt {
            step_id: step_id.to_owned(),
            current: step.attempt,
            given: attempt,
        });
    }
    Ok(step)
}

/// A decision is `approve` or `reject`: checked before anything is read.
pub(super) fn valid_decision(request: &Decide) -> Result<(), Error> {
    if request.decision == "approve" || request.decision == "reject" {
        Ok(())
    } else {
        Err(Error::InvalidRequest(format!(
            "decision {:?} is neither \"approve\" nor \"reject\"",
            request.decision
        )))
    }
}

/// What a decision records on the checkpoint `step`: the decision, bound to the artifact
/// version the checkpoint reviews, and no time (the same decision twice must be the same
/// control).
pub(super) fn decision(request: &Decide, step: &StepRow) -> Result<Value, Error> {
    valid_decision(request)?;
    let under_review = step
        .record()
        .and_then(StepRecord::artifact_version)
        .and_then(|version| u64::try_from(version).ok());
    if under_review != Some(request.artifact_version) {
        return Err(Error::StaleArtifactVersion {
            step_id: request.step_id.clone(),
            under_review,
            given: request.artifact_version,
        });
    }
    let mut body = json!({
        "decision": request.decision,
        "artifactVersion": request.artifact_version,
    });
    if let Some(comment) = &request.comment {
        body["comment"] = json!(comment);
    }
    Ok(body)
}

/// The lease of a takeover for `action` the store granted, or why it did not.
pub(super) fn taken(
    action: Takeover,
    answer: store::Result<TakeOver>,
) -> Result<store::Lease, Error> {
    match answer? {
        TakeOver::Taken(lease) => Ok(lease),
        TakeOver::NotRecoverable(reason) => Err(Error::NotLive { action, reason }),
        TakeOver::LeaseHeld => Err(Error::LeaseHeld { action }),
        TakeOver::Refused(reason) => Err(Error::TakeoverRefused { reason }),
    }
}

/// The places in `waiters` (oldest first) of the `count` supervisors a freed slot wakes, in
/// ascending order: the oldest waiter of each user first, then the oldest of the others. The 16
/// oldest alone could all be one user's, each refused again while that user holds their share
/// of the slots (`max_active_children_per_user`), while another user's step, further back,
/// waited for its fallback.
pub(super) fn waiters_to_wake<'a>(
    waiters: &'a VecDeque<WorkflowId>,
    count: usize,
    user_of: impl Fn(&WorkflowId) -> Option<&'a str>,
) -> Vec<usize> {
    let count = count.min(waiters.len());
    if count == waiters.len() {
        return (0..count).collect();
    }
    let mut users = std::collections::HashSet::new();
    let mut picked: Vec<usize> = waiters
        .iter()
        .enumerate()
        .filter(|(_, workflow_id)| users.insert(user_of(workflow_id)))
        .map(|(place, _)| place)
        .take(count)
        .collect();
    let first_of_each = picked.clone();
    picked.extend(
        (0..waiters.len())
            .filter(|place| !first_of_each.contains(place))
            .take(count - first_of_each.len()),
    );
    picked.sort_unstable();
    picked
}

/// The one fenced write that settles the step a reconcile names, from the workflow's row and
/// journal as read under the reconcile's lease, and the row as it will stand (running, its
/// reason for waiting removed). Pure: the deterministic simulation settles its workflows with
/// it too.
pub(super) fn reconcile_writes(
    row: WorkflowRow,
    steps: Vec<StepRow>,
    limits: LaunchLimits,
    request: &ReconcileRequest,
    now_ms: i64,
) -> Result<(Vec<WriteOp>, WorkflowRow), Error> {
    let id = &request.workflow_id;
    let step = steps
        .into_iter()
        .filter(|step| step.step_id == request.step_id)
        .max_by_key(|step| step.attempt)
        .ok_or_else(|| Error::NoStep {
            workflow_id: id.clone(),
            step_id: request.step_id.clone(),
        })?;
    let stored = step.record.clone().map_err(|problem| {
        Error::Store(store::Error::Database(format!(
            "step {:?} attempt {} cannot be reconciled: {problem}",
            step.step_id, step.attempt
        )))
    })?;
    let record = Reconciled {
        by: request.by.clone(),
        reason: request.reason.clone(),
        resolution: match &request.resolution {
            Resolution::Retry => "retry",
            Resolution::Fail => "fail",
            Resolution::Complete(_) => "complete",
        }
        .to_owned(),
    };
    let run_id = json!(stored.run_id());
    let settled = |status: StepStatus, outcome: StepOutcome| WriteOp::PutStep {
        workflow_id: id.clone(),
        seq: step.seq,
        step_id: step.step_id.clone(),
        attempt: step.attempt,
        status,
        record: StepRecord {
            outcome: Some(outcome),
            settled_at_ms: Some(now_ms),
            reconciled: Some(record.clone()),
            ..stored.clone()
        },
    };
    let release = WriteOp::ReleaseSlot {
        workflow_id: id.clone(),
        step_id: step.step_id.clone(),
    };
    let mut ops = match &request.resolution {
        Resolution::Fail => vec![
            settled(
                StepStatus::Failed,
                StepOutcome::Rejected(json!({
                    "message": format!("reconciled as failed: {}", request.reason),
                    "status": "error",
                    "runId": run_id,
                    "attempts": step.attempt,
                    "retryable": false,
                })),
            ),
            release,
        ],
        Resolution::Complete(output) => {
            #[cfg(test)]
            let output = &if crate::workflow::mutants::planted(
                crate::workflow::mutants::Mutant::ReconcileAltersTheOutput,
            ) {
                json!({ "altered": output })
            } else {
                output.clone()
            };
            vec![
                settled(
                    StepStatus::Completed,
                    StepOutcome::Resolved(json!({
                        "output": output,
                        "status": "success",
                        "runId": run_id,
                        "attempts": step.attempt,
                        "reconciled": true,
                    })),
                ),
                release,
            ]
        }
        Resolution::Retry => {
            // The old attempt is closed as cancelled (it never gets an outcome; its record says
            // it was reconciled with a retry), and the new one is queued; the old attempt's
            // slot is given back, the new one claims its own.
            let mut next = StepRecord::new(stored.kind(), stored.args.clone());
            next.reconciled = Some(record.clone());
            if let StepCall::Agent {
                previous_run_id, ..
            } = &mut next.call
            {
                *previous_run_id = stored.run_id().cloned();
            }
            vec![
                WriteOp::PutStep {
                    workflow_id: id.clone(),
                    seq: step.seq,
                    step_id: step.step_id.clone(),
                    attempt: step.attempt,
                    status: StepStatus::Cancelled,
                    record: StepRecord {
                        reconciled: Some(record),
                        ..stored
                    },
                },
                WriteOp::PutStep {
                    workflow_id: id.clone(),
                    seq: step.seq,
                    step_id: step.step_id.clone(),
                    attempt: step.attempt + 1,
                    status: StepStatus::Queued,
                    record: next,
                },
                release,
            ]
        }
    };
    // A failure's error is stored inside the workflow's grant, as the supervisor's are
    // (`machine/storage.rs`): a grant of its bytes the quota does not refuse, so that an
    // operator's decision is never lost to it.
    let errors = store::error_bytes(&ops);
    if errors > 0 {
        ops.push(WriteOp::TakeStorage {
            workflow_id: id.clone(),
            bytes: errors,
            bytes_max: 0,
        });
    }
    // The operator checked the child's effects: every run of the step's attempt that is still
    // live is closed now (found by the attempt's idempotency key, so also a run admitted after
    // its journal entry was written as queued, which the journal never named), so the step's
    // thread is free for whatever comes next.
    ops.push(WriteOp::CloseStepRuns {
        workflow_id: id.clone(),
        idempotency_key: store::idempotency_key(id, &step.step_id, step.attempt),
    });
    // It held no place under the limits while it waited for an operator: it takes them back
    // before it counts as live again, or the reconcile is refused with nothing written.
    let clamp = |limit: u64| i64::try_from(limit).unwrap_or(i64::MAX);
    ops.push(WriteOp::TakePlaces {
        workflow_id: id.clone(),
        user_id: row.user_id.clone(),
        max_workflows: clamp(limits.max_workflows),
        max_workflows_per_owner: clamp(limits.max_workflows_per_owner),
    });
    // Settled: the reason it waited is kept in the step's `reconciled` record, not here.
    let mut data = row.data.clone();
    if let Some(fields) = data.as_object_mut() {
        fields.remove("reconciliation");
    }
    ops.push(WriteOp::SetWorkflow {
        workflow_id: id.clone(),
        status: WorkflowStatus::Running,
        data: data.clone(),
    });
    Ok((ops, WorkflowRow { data, ..row }))
}

/// The longest wait between two claims of automatic recovery (shorter when the lease is): an
/// orphaned workflow is claimed within this much of its owner's lease running out.
const CLAIM_PERIOD_MAX: Duration = Duration::from_secs(1);

/// How often a node tries to take back a workflow its own supervisor left live, a lease period
/// apart (the database may still be unreachable, or the lease not yet run out).
const TAKE_BACK_TRIES: u32 = 20;

/// How often a cancellation asked of a workflow whose owner's lease was still valid is tried
/// again, a lease period apart (the owner, if alive, carries it out itself meanwhile).
const CANCEL_TAKEOVER_TRIES: u32 = 10;

/// How often a node claims. Under automatic recovery every lease period, at most
/// [`CLAIM_PERIOD_MAX`] apart: a lease running out is a matter of time, which no cue announces.
/// Under manual recovery a claim takes only dormant workflows whose wake time came, which cues
/// and the planned wake bring: the slow fallback (`wake_fallback`) is enough.
pub(super) fn claim_period(
    automatic_recovery: bool,
    lease_ms: u64,
    wake_fallback: Duration,
) -> Duration {
    if automatic_recovery {
        Duration::from_millis(lease_ms.max(1)).min(CLAIM_PERIOD_MAX)
    } else {
        wake_fallback
    }
}

/// Which workflows a claim looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClaimQuery {
    /// Every recoverable workflow (`recoverable_workflows`), the dormant ones whose wake time
    /// came among them.
    Recoverable,
    /// Only the dormant workflows whose wake time came (`dormant_workflows`' `due`): a wake is
    /// no crash recovery, and nobody else would wake them.
    DueDormant,
}

/// What a claim looks for: every recoverable workflow under automatic recovery, only the due
/// dormant ones under manual recovery.
pub(super) fn claim_query(automatic_recovery: bool) -> ClaimQuery {
    if automatic_recovery {
        ClaimQuery::Recoverable
    } else {
        ClaimQuery::DueDormant
    }
}

/// When the next dormant workflow wakes, in epoch ms rounded up (a claim then finds it due), from
/// the soonest wake time `dormant_workflows` answers (epoch seconds): none when no workflow is
/// dormant, or only for ever ([`store::DORMANT_FOREVER_S`]).
pub(super) fn next_wake_ms(next_wake_at: Option<f64>) -> Option<i64> {
    next_wake_at
        .filter(|at| *at < store::DORMANT_FOREVER_S)
        .map(|at| (at * 1000.0).ceil() as i64)
}

/// What a claim takes a workflow over for: a pending cancellation is finished without replaying
/// the body; any other workflow is recovered.
pub(super) fn claimed_for(orphan: &store::Orphaned) -> Takeover {
    if orphan.cancel_pending {
        Takeover::Cancel
    } else {
        Takeover::Recover
    }
}

/// What a claim takes over of the workflows its query found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Claim {
    /// Each workflow found but those supervised here, with what it is taken over for
    /// ([`claimed_for`]), in the order found.
    pub(super) takeovers: Vec<(WorkflowId, Takeover)>,
    /// The query answered a whole batch: more may be waiting, and the next claim starts at once.
    pub(super) full: bool,
}

/// The takeovers of a claim whose query (of at most `batch`) found `found`: a workflow
/// supervised here (`supervised_here`) is not taken over again.
pub(super) fn claim(
    found: Vec<store::Orphaned>,
    batch: u32,
    supervised_here: impl Fn(&WorkflowId) -> bool,
) -> Claim {
    let full = found.len() >= batch as usize;
    let takeovers = found
        .into_iter()
        .filter(|orphan| !supervised_here(&orphan.workflow_id))
        .map(|orphan| {
            let action = claimed_for(&orphan);
            (orphan.workflow_id, action)
        })
        .collect();
    Claim { takeovers, full }
}

/// A claim planned for a dormant workflow's wake time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WakePlan {
    /// The wake time planned for (epoch ms).
    pub(super) wake_ms: i64,
    /// How long from now the claim is.
    pub(super) delay: Duration,
}

/// Plans a claim for when the next dormant workflow wakes (`next_wake_ms`), unless one is planned
/// (`planned_ms`) no later: the claim period alone would wake it up to a period late. Judged by
/// the database's clock as this node reads it (`now_ms`): a wake time already past is claimed at
/// once; an error in that reading claims early, finds nothing, and the period claims it.
pub(super) fn plan_wake(
    planned_ms: Option<i64>,
    next_wake_ms: Option<i64>,
    now_ms: i64,
) -> Option<WakePlan> {
    let wake_ms = next_wake_ms?;
    if planned_ms.is_some_and(|planned| planned <= wake_ms) {
        return None;
    }
    let delay = Duration::from_millis(u64::try_from(wake_ms.saturating_sub(now_ms)).unwrap_or(0));
    Some(WakePlan { wake_ms, delay })
}

/// Whether this node may take a workflow over: not while a supervisor of it runs here, nor while
/// a takeover of it is in flight here (the asker hears `Supervised`), so that no two supervisors
/// of one workflow ever start on one node.
pub(super) fn may_take_over(supervised_here: bool, taking_over_here: bool) -> bool {
    !supervised_here && !taking_over_here
}

/// What the store is told a takeover for `action` is for.
pub(super) fn purpose(action: Takeover) -> store::Purpose {
    match action {
        Takeover::Recover => store::Purpose::Recover,
        Takeover::Reconcile => store::Purpose::Reconcile,
        Takeover::Cancel => store::Purpose::Cancel,
    }
}

/// How the supervisor of a workflow taken over for `action` begins: one taken over to finish a
/// cancellation never replays the body; any other replays its journal.
pub(super) fn start_after(action: Takeover) -> Start {
    match action {
        Takeover::Cancel => Start::CancelOnly,
        Takeover::Recover | Takeover::Reconcile => Start::Replay,
    }
}

/// What follows a takeover asked for to finish a dead owner's cancellation.
#[derive(Debug)]
pub(super) enum AfterCancel {
    /// Taken over: its supervisor finishes the cancellation.
    Finishing,
    /// The owner may be alive (its poll finds the cancel and carries it out), or dead with a
    /// lease not yet run out: look again a lease period later.
    LookAgain,
    /// It already ended, no cancellation is pending any more, or a lease still held it after the
    /// last try: nothing to do.
    Over,
    /// The store failed (said as a warning).
    Unreached(Error),
    /// Anything else (said as an error).
    Failed(Error),
}

/// What follows try `tries` (from 0) of a takeover to finish a cancellation, from how it
/// `started`.
pub(super) fn after_cancel(started: Result<WorkflowId, Error>, tries: u32) -> AfterCancel {
    match started {
        Ok(_) => AfterCancel::Finishing,
        Err(Error::LeaseHeld { .. } | Error::Supervised { .. })
            if tries + 1 < CANCEL_TAKEOVER_TRIES =>
        {
            AfterCancel::LookAgain
        }
        Err(
            Error::LeaseHeld { .. }
            | Error::Supervised { .. }
            | Error::NotLive { .. }
            | Error::TakeoverRefused { .. },
        ) => AfterCancel::Over,
        Err(error @ Error::Store(_)) => AfterCancel::Unreached(error),
        Err(error) => AfterCancel::Failed(error),
    }
}

/// What follows a takeover asked for to take back a workflow this node's own supervisor left
/// live.
#[derive(Debug)]
pub(super) enum AfterTakeBack {
    /// Taken back: its supervisor replays it.
    Taken,
    /// A lease still holds it: if it is this node's own, running out, ask again a lease period
    /// later; another node's lease means that node took the workflow over, and it is not ours to
    /// take back.
    AgainIfOurs,
    /// The store could not be reached: ask again a lease period later.
    Again,
    /// A cancellation is pending (or another rule refused): a takeover to cancel finishes it if
    /// one is asked for; otherwise the workflow waits as it is.
    Cancel,
    /// Not taken back: it ended, another node holds it, or it is supervised here (said as
    /// information).
    NotTaken(Error),
    /// Anything else, or the tries ran out on an unreachable store (said as a warning).
    Failed(Error),
}

/// What follows try `tries` (from 0) of taking a workflow back, from how it `started`.
pub(super) fn after_take_back(started: Result<WorkflowId, Error>, tries: u32) -> AfterTakeBack {
    match started {
        Ok(_) => AfterTakeBack::Taken,
        Err(Error::LeaseHeld { .. }) if tries + 1 < TAKE_BACK_TRIES => AfterTakeBack::AgainIfOurs,
        Err(Error::Store(error)) if error.is_transient() && tries + 1 < TAKE_BACK_TRIES => {
            AfterTakeBack::Again
        }
        Err(Error::TakeoverRefused { .. }) => AfterTakeBack::Cancel,
        Err(
            error @ (Error::LeaseHeld { .. } | Error::NotLive { .. } | Error::Supervised { .. }),
        ) => AfterTakeBack::NotTaken(error),
        Err(error) => AfterTakeBack::Failed(error),
    }
}

/// When a workflow whose supervisor here stopped is taken back: if the supervisor left it live
/// (`abandoned`: it lost the lease, or a write's outcome was unknown), once that lease has run
/// out, a lease period and a little later, in either recovery mode; never while draining.
pub(super) fn take_back_after(abandoned: bool, draining: bool, lease_ms: u64) -> Option<Duration> {
    (abandoned && !draining).then(|| Duration::from_millis(lease_ms.max(1) + 100))
}

#[cfg(test)]
mod tests {
    use store::{Epoch, Lease};

    use super::*;
    use store::LifeLimit;

    fn request(script: &str, args: Value) -> LaunchRequest {
        LaunchRequest {
            user_id: "ann".into(),
            request_id: Some("r-1".into()),
            title: None,
            timeout_seconds: None,
            script: script.into(),
            args,
        }
    }

    fn step(step_id: &str, attempt: i32, kind: CallKind, data: Value) -> StepRow {
        StepRow {
            seq: 0,
            step_id: step_id.into(),
            attempt,
            status: StepStatus::Running,
            record: store::StepRecord::decode(kind.as_str(), &data).map_err(|e| e.to_string()),
            created_at: 0.0,
            run_started_at: None,
        }
    }

    fn row(data: Value) -> WorkflowRow {
        WorkflowRow {
            workflow_id: WorkflowId::new("wf-1"),
            user_id: "ann".into(),
            status: WorkflowStatus::NeedsReconciliation,
            owner: None,
            fingerprint: "f-1".into(),
            data,
            created_at: 0.0,
            updated_at: 0.0,
        }
    }

    fn decide(decision: &str, artifact_version: u64, comment: Option<&str>) -> Decide {
        Decide {
            workflow_id: WorkflowId::new("wf-1"),
            step_id: "review".into(),
            attempt: 1,
            artifact_version,
            decision: decision.into(),
            comment: comment.map(str::to_owned),
        }
    }

    /// Journal entry `seq` of a retried workflow: call `step_id` of `kind` at `attempt`.
    fn entry(seq: i32, step_id: &str, attempt: i32, kind: CallKind, status: StepStatus) -> StepRow {
        StepRow {
            seq,
            status,
            ..step(step_id, attempt, kind, json!({"args": {"stepId": step_id}}))
        }
    }

    fn failed(data: Value) -> WorkflowRow {
        WorkflowRow {
            status: WorkflowStatus::Failed,
            ..row(data)
        }
    }

    fn versions(runtime: &str) -> store::Versions {
        store::Versions {
            runtime: runtime.into(),
            configuration: "c-2".into(),
        }
    }

    fn launched_data() -> Value {
        json!({"script": "return 1;", "args": {"topic": "x"}, "seed": 77, "started_at_ms": 1_000,
               "runtime_version": "r-1", "configuration_version": "c-1", "error": "d failed"})
    }

    fn retried(source: &WorkflowRow, steps: &[StepRow]) -> Result<Retried, Error> {
        let request = RetryRequest {
            workflow_id: source.workflow_id.clone(),
            request_id: Some("again".into()),
        };
        retry(
            source,
            steps,
            &versions("r-1"),
            &request,
            500,
            WorkflowId::new("wf-2"),
            9_000,
        )
    }

    #[test]
    fn a_retry_adopts_every_call_before_the_first_that_did_not_complete() {
        use CallKind::{Agent, CaptureArtifact};
        use StepStatus::{Cancelled, Completed, Failed};
        let source = failed(launched_data());
        let journal = [
            entry(0, "a", 1, Agent, Completed),
            entry(1, "b", 1, Agent, Failed),
            entry(1, "b", 2, Agent, Completed),
            entry(2, "cap", 1, CaptureArtifact, Completed),
            // A failed `parallel`: `d` failed, its sibling `e` completed, `f` was left behind.
            entry(3, "d", 1, Agent, Failed),
            entry(4, "e", 1, Agent, Completed),
            entry(5, "f", 1, Agent, Cancelled),
        ];
        let plan = retried(&source, &journal).expect("a failed workflow is retried");
        assert_eq!(
            plan.retry.adopted_calls, 3,
            "every call before `d`, `b` at its newest attempt"
        );
        assert_eq!(plan.retry.retry_of, source.workflow_id);
        let new = WorkflowId::new("wf-2");
        assert_eq!(
            plan.threads,
            [
                (thread_for(&source.workflow_id, "a"), thread_for(&new, "a")),
                (thread_for(&source.workflow_id, "b"), thread_for(&new, "b")),
            ],
            "the adopted agent steps' workspaces, and no capture's"
        );
        // The same script, arguments, seed, clock and owner; its own launch time and id.
        let written = &plan.retry.workflow;
        assert_eq!(
            (
                written.workflow_id.as_str(),
                written.user_id.as_str(),
                written.fingerprint.as_str()
            ),
            ("wf-2", "ann", "f-1")
        );
        assert_eq!(written.request_id.as_deref(), Some("again"));
        assert_eq!(plan.retry.stored_bytes_max, 500);
        assert_eq!(
            written.data,
            json!({"script": "return 1;", "args": {"topic": "x"}, "seed": 77,
            "started_at_ms": 1_000, "launched_at_ms": 9_000, "runtime_version": "r-1",
            "configuration_version": "c-2", "retry_of": "wf-1"})
        );
        assert_eq!(plan.workflow.document.encode(), written.data);
        let document = &plan.workflow.document;
        assert_eq!(
            (
                document.seed,
                document.started_at_ms,
                document.launched_at_ms()
            ),
            (77, 1_000, 9_000)
        );
        let read_back = WorkflowDocument::decode(&new, &written.data).expect("read");
        assert_eq!(
            (read_back.started_at_ms, read_back.launched_at_ms()),
            (1_000, 9_000)
        );
        let launched = WorkflowDocument::decode(&new, &launched_data()).expect("read");
        assert_eq!(
            launched.launched_at_ms(),
            1_000,
            "a launch's timeout counts from its start"
        );

        // The script failed after every call completed: all of them are adopted.
        let all = [
            entry(0, "a", 1, Agent, Completed),
            entry(1, "cap", 1, CaptureArtifact, Completed),
        ];
        assert_eq!(
            retried(&source, &all).expect("retried").retry.adopted_calls,
            2
        );
        // It failed before any call completed: nothing is.
        let none = [entry(0, "a", 1, Agent, Failed)];
        let plan = retried(&source, &none).expect("retried");
        assert_eq!((plan.retry.adopted_calls, plan.threads.len()), (0, 0));
        assert_eq!(
            retried(&source, &[]).expect("retried").retry.adopted_calls,
            0
        );
    }

    #[test]
    fn only_a_failed_workflow_whose_journal_replays_here_is_retried() {
        let refusal = |source: &WorkflowRow, steps: &[StepRow], runtime: &str| {
            let request = RetryRequest {
                workflow_id: source.workflow_id.clone(),
                request_id: None,
            };
            match retry(
                source,
                steps,
                &versions(runtime),
                &request,
                0,
                WorkflowId::new("wf-2"),
                0,
            ) {
                Err(Error::NotRetryable { reason, .. }) => reason,
                other => panic!("not refused: {other:?}"),
            }
        };
        for (status, says) in [
            (
                WorkflowStatus::Completed,
                "it completed: there is nothing to run again",
            ),
            (
                WorkflowStatus::Cancelled,
                "it was cancelled, which a retry does not undo: launch it anew (`reins run`)",
            ),
            (
                WorkflowStatus::NeedsReconciliation,
                "it needs reconciliation: it is still live and waits for an operator to settle its uncertain step with `reins reconcile`",
            ),
            (
                WorkflowStatus::Running,
                "it is running: only a failed workflow is retried",
            ),
            (
                WorkflowStatus::Paused,
                "it is paused: only a failed workflow is retried",
            ),
            (
                WorkflowStatus::Cancelling,
                "it is cancelling: only a failed workflow is retried",
            ),
        ] {
            let source = WorkflowRow {
                status,
                ..row(launched_data())
            };
            let reason = refusal(&source, &[], "r-1");
            assert!(reason.starts_with(says), "{status}: {reason}");
        }
        let source = failed(launched_data());
        assert_eq!(
            refusal(&source, &[], "r-2"),
            "its journal was written by runtime \"r-1\", this node runs \"r-2\": its steps would not replay; launch it anew"
        );
        let mut unreadable = entry(1, "b", 1, CallKind::Agent, StepStatus::Completed);
        unreadable.record = Err("no such kind".into());
        let journal = [
            entry(0, "a", 1, CallKind::Agent, StepStatus::Completed),
            unreadable.clone(),
        ];
        assert_eq!(
            refusal(&source, &journal, "r-1"),
            "call 1 of its journal (step \"b\") cannot be read (no such kind): a retry would run it again"
        );
        // One that cannot be read after the failed call is not adopted, so it does not matter.
        let later = [
            entry(0, "a", 1, CallKind::Agent, StepStatus::Failed),
            unreadable,
        ];
        assert_eq!(
            retried(&source, &later)
                .expect("retried")
                .retry
                .adopted_calls,
            0
        );
        // A document without its script is a stored value the store cannot give, not a refusal.
        let broken = retried(&failed(json!({"runtime_version": "r-1"})), &[]);
        assert!(
            matches!(broken, Err(Error::Store(store::Error::Database(_)))),
            "{broken:?}"
        );
    }

    #[test]
    fn a_launch_at_its_limits_is_written_and_one_byte_over_is_refused() {
        let limits = runtime::Limits {
            script_bytes_max: 10,
            frame_bytes_max: 8,
            ..runtime::Limits::default()
        };
        let id = || WorkflowId::new("wf-1");
        let at_limits = request("return 12;", json!({"ab": 1}));
        assert_eq!(
            (at_limits.script.len(), at_limits.args.to_string().len()),
            (10, 8)
        );
        let (launched, supervised) = launch(&limits, "c-1".into(), &at_limits, (id(), 1_000), None)
            .expect("a script and args within their limits");
        assert_eq!(launched.workflow_id, id());
        assert_eq!(
            launched.fingerprint,
            fingerprint("return 12;", &json!({"ab": 1}))
        );
        assert_eq!(launched.data["started_at_ms"], 1_000);
        assert_eq!(launched.data["configuration_version"], "c-1");
        assert_eq!(
            launched.data["runtime_version"],
            runtime::runtime_version(&limits)
        );
        // The supervisor starts from the same document, typed, with nothing parsed back; the
        // document reads back the same from the row.
        assert_eq!(supervised.document.encode(), launched.data);
        assert_eq!(supervised.document.script, "return 12;");
        let read_back = WorkflowDocument::decode(&id(), &launched.data).expect("read");
        assert_eq!(
            (read_back.seed, read_back.started_at_ms, read_back.args),
            (supervised.document.seed, 1_000, json!({"ab": 1}))
        );
        // The seed follows from the id alone: the same id, the same randomness.
        let (again, _) =
            launch(&limits, "c-1".into(), &at_limits, (id(), 2_000), None).expect("launched");
        assert_eq!(launched.data["seed"], again.data["seed"]);

        // A life limit: the launch's own, else the node's, else none; each reads back as written,
        // and a document from before limits were recorded keeps the node's.
        assert_eq!(launched.data["timeout_ms"], Value::Null);
        assert_eq!(supervised.document.life, LifeLimit::Unlimited);
        let (by_node, _) =
            launch(&limits, "c".into(), &at_limits, (id(), 0), Some(60_000)).expect("launched");
        let timed = LaunchRequest {
            timeout_seconds: Some(5),
            ..at_limits.clone()
        };
        let (own, _) =
            launch(&limits, "c".into(), &timed, (id(), 0), Some(60_000)).expect("launched");
        for (data, life) in [
            (&by_node.data, LifeLimit::Millis(60_000)),
            (&own.data, LifeLimit::Millis(5_000)),
        ] {
            let read = WorkflowDocument::decode(&id(), data).expect("read");
            assert_eq!(read.life, life);
        }
        let mut before = launched.data.clone();
        before
            .as_object_mut()
            .expect("an object")
            .remove("timeout_ms");
        let read = WorkflowDocument::decode(&id(), &before).expect("read");
        assert_eq!(read.life, LifeLimit::Unrecorded);
        for seconds in [0, TIMEOUT_SECONDS_MAX + 1] {
            let asked = LaunchRequest {
                timeout_seconds: Some(seconds),
                ..at_limits.clone()
            };
            let refused = launch(&limits, "c".into(), &asked, (id(), 0), None);
            assert!(
                matches!(&refused, Err(Error::InvalidRequest(message))
                    if message.starts_with(&format!("timeout_seconds is {seconds}: it must be 1 to 31536000"))),
                "{refused:?}"
            );
        }

        let script = launch(
            &limits,
            "c".into(),
            &request("return 123;", json!(1)),
            (id(), 0),
            None,
        );
        assert!(
            matches!(
                script,
                Err(Error::TooLarge {
                    what: "script",
                    bytes: 11,
                    ..
                })
            ),
            "{script:?}"
        );
        let args = launch(
            &limits,
            "c".into(),
            &request("1", json!({"abc": 1})),
            (id(), 0),
            None,
        );
        assert!(
            matches!(
                args,
                Err(Error::TooLarge {
                    what: "args",
                    bytes: 9,
                    ..
                })
            ),
            "{args:?}"
        );
    }

    #[test]
    fn a_control_naming_another_script_is_refused() {
        assert!(same_script(&row(json!({})), "f-1").is_ok());
        assert!(matches!(
            same_script(&row(json!({})), "f-2"),
            Err(Error::StaleFingerprint { .. })
        ));
    }

    #[test]
    fn a_control_answers_the_newest_attempt_of_its_step_of_its_kind_only() {
        let steps = || {
            vec![
                step("go", 1, CallKind::Pause, json!({})),
                step("go", 2, CallKind::Pause, json!({})),
                step("draft", 1, CallKind::Agent, json!({})),
            ]
        };
        let answered = answered_step(steps(), "go", CallKind::Pause, 2).expect("the newest");
        assert_eq!(answered.attempt, 2);
        assert!(matches!(
            answered_step(steps(), "later", CallKind::Pause, 1),
            Err(Error::StepNotReached { .. })
        ));
        assert!(matches!(
            answered_step(steps(), "draft", CallKind::Pause, 1),
            Err(Error::WrongStepKind {
                expected: "pause",
                ..
            })
        ));
        assert!(matches!(
            answered_step(steps(), "go", CallKind::Pause, 1),
            Err(Error::WrongAttempt {
                current: 2,
                given: 1,
                ..
            })
        ));
    }

    #[test]
    fn a_decision_is_approve_or_reject_about_the_version_under_review_and_has_no_time() {
        let review = step(
            "review",
            1,
            CallKind::HumanCheckpoint,
            json!({"args": {"artifactVersion": 2}}),
        );
        assert_eq!(
            decision(&decide("approve", 2, Some("fine")), &review).expect("recorded"),
            json!({"decision": "approve", "artifactVersion": 2, "comment": "fine"})
        );
        assert_eq!(
            decision(&decide("reject", 2, None), &review).expect("recorded"),
            json!({"decision": "reject", "artifactVersion": 2})
        );
        assert!(matches!(
            valid_decision(&decide("maybe", 2, None)),
            Err(Error::InvalidRequest(_))
        ));
        assert!(matches!(
            decision(&decide("approve", 1, None), &review),
            Err(Error::StaleArtifactVersion {
                under_review: Some(2),
                given: 1,
                ..
            })
        ));
    }

    #[test]
    fn a_takeovers_answer_is_the_lease_or_why_not() {
        let lease = Lease {
            resource_id: WorkflowId::new("wf-1"),
            owner: "node-b".into(),
            epoch: Epoch::new(3),
            expires_at: 10.0,
        };
        let answer = taken(Takeover::Recover, Ok(TakeOver::Taken(lease.clone())));
        assert_eq!(answer.expect("taken"), lease);
        assert!(matches!(
            taken(Takeover::Recover, Ok(TakeOver::LeaseHeld)),
            Err(Error::LeaseHeld {
                action: Takeover::Recover
            })
        ));
        assert!(matches!(
            taken(
                Takeover::Cancel,
                Ok(TakeOver::NotRecoverable("ended".into()))
            ),
            Err(Error::NotLive {
                action: Takeover::Cancel,
                ..
            })
        ));
        assert!(matches!(
            taken(Takeover::Reconcile, Ok(TakeOver::Refused("cancel".into()))),
            Err(Error::TakeoverRefused { .. })
        ));
        assert!(matches!(
            taken(
                Takeover::Recover,
                Err(store::Error::Unavailable("down".into()))
            ),
            Err(Error::Store(store::Error::Unavailable(_)))
        ));
    }

    fn waiters(users: &[&'static str]) -> (VecDeque<WorkflowId>, Vec<&'static str>) {
        let ids = (0..users.len()).map(|n| WorkflowId::new(format!("wf-{n}")));
        (ids.collect(), users.to_vec())
    }

    fn wake(users: &[&'static str], count: usize) -> Vec<usize> {
        let (queue, owners) = waiters(users);
        waiters_to_wake(&queue, count, |workflow_id| {
            let place = queue.iter().position(|w| w == workflow_id)?;
            owners.get(place).copied()
        })
    }

    #[test]
    fn a_freed_slot_wakes_the_oldest_waiter_of_each_user_before_more_of_one_user() {
        // Ann's three waiters are the oldest; Bob's, behind them, is woken with her first.
        assert_eq!(wake(&["ann", "ann", "ann", "bob"], 2), [0, 3]);
        // Fewer users than wakes: the oldest of the rest make up the count.
        assert_eq!(wake(&["ann", "ann", "ann", "bob", "ann"], 3), [0, 1, 3]);
        // One user only, or room for all: the oldest, as before.
        assert_eq!(wake(&["ann", "ann", "ann"], 2), [0, 1]);
        assert_eq!(wake(&["ann", "bob"], 16), [0, 1]);
        assert_eq!(wake(&[], 16), Vec::<usize>::new());
    }

    fn reconcile(resolution: Resolution) -> Result<(Vec<WriteOp>, WorkflowRow), Error> {
        let waiting = row(json!({"script": "s", "reconciliation": {"reason": "orphaned_child"}}));
        let steps = vec![
            step(
                "a",
                1,
                CallKind::Agent,
                json!({"args": {"task": "t"}, "run_id": "run-1"}),
            ),
            step("b", 1, CallKind::Agent, json!({})),
        ];
        let request = ReconcileRequest {
            workflow_id: WorkflowId::new("wf-1"),
            step_id: "a".into(),
            resolution,
            reason: "checked the deploy".into(),
            by: "ops@example.com".into(),
        };
        reconcile_writes(waiting, steps, LaunchLimits::NONE, &request, 5_000)
    }

    /// Each op, as `kind step/attempt status`.
    fn described(ops: &[WriteOp]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                WriteOp::PutStep {
                    step_id,
                    attempt,
                    status,
                    ..
                } => format!("step {step_id}/{attempt} {}", status.as_str()),
                WriteOp::ReleaseSlot { step_id, .. } => format!("release slot {step_id}"),
                WriteOp::CloseStepRuns {
                    idempotency_key, ..
                } => format!("close runs {idempotency_key}"),
                WriteOp::TakePlaces { .. } => "take places".into(),
                WriteOp::SetWorkflow { status, .. } => format!("workflow {}", status.as_str()),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_reconcile_settles_the_newest_attempt_in_one_write_and_runs_the_workflow_again() {
        let tail = ["close runs wf-1/a/1", "take places", "workflow running"];
        let (ops, row) = reconcile(Resolution::Retry).expect("a retry");
        assert_eq!(
            described(&ops)[..3],
            ["step a/1 cancelled", "step a/2 queued", "release slot a"]
        );
        assert_eq!(described(&ops)[3..], tail);
        assert_eq!(
            row.data,
            json!({"script": "s"}),
            "the reason it waited is gone"
        );
        let WriteOp::PutStep { record, .. } = &ops[1] else {
            panic!("the new attempt");
        };
        let data = record.encode();
        assert_eq!(data["previous_run_id"], "run-1");
        assert_eq!(data["reconciled"]["resolution"], "retry");
        assert_eq!(data["reconciled"]["by"], "ops@example.com");

        let (ops, _) = reconcile(Resolution::Fail).expect("a failure");
        assert_eq!(described(&ops)[..2], ["step a/1 failed", "release slot a"]);
        let WriteOp::PutStep { record, .. } = &ops[0] else {
            panic!("the settled attempt");
        };
        let data = record.encode();
        assert_eq!(
            data["outcome"]["value"]["message"],
            "reconciled as failed: checked the deploy"
        );
        assert_eq!(data["settled_at_ms"], 5_000);

        let (ops, _) = reconcile(Resolution::Complete(json!({"deployed": true}))).expect("done");
        assert_eq!(
            described(&ops)[..2],
            ["step a/1 completed", "release slot a"]
        );
        assert_eq!(described(&ops)[2..], tail);
        let WriteOp::PutStep { record, .. } = &ops[0] else {
            panic!("the settled attempt");
        };
        let data = record.encode();
        assert_eq!(
            data["outcome"],
            json!({"outcome": "resolved", "value": {"output": {"deployed": true},
                   "status": "success", "runId": "run-1", "attempts": 1, "reconciled": true}})
        );
    }

    #[test]
    fn a_reconcile_of_a_step_the_journal_lacks_writes_nothing() {
        let waiting = row(json!({}));
        let request = ReconcileRequest {
            workflow_id: WorkflowId::new("wf-1"),
            step_id: "ghost".into(),
            resolution: Resolution::Retry,
            reason: "r".into(),
            by: "ops".into(),
        };
        assert!(matches!(
            reconcile_writes(waiting, Vec::new(), LaunchLimits::NONE, &request, 0),
            Err(Error::NoStep { .. })
        ));
    }

    fn orphan(id: &str, cancel_pending: bool) -> store::Orphaned {
        store::Orphaned {
            workflow_id: WorkflowId::new(id),
            cancel_pending,
        }
    }

    #[test]
    fn a_node_claims_every_lease_period_under_automatic_recovery_and_at_the_fallback_else() {
        let fallback = Duration::from_secs(30);
        assert_eq!(
            claim_period(true, 300, fallback),
            Duration::from_millis(300)
        );
        assert_eq!(
            claim_period(true, 10_000, fallback),
            Duration::from_secs(1),
            "at most a second apart"
        );
        assert_eq!(claim_period(true, 0, fallback), Duration::from_millis(1));
        assert_eq!(claim_period(false, 300, fallback), fallback);
        assert_eq!(claim_query(true), ClaimQuery::Recoverable);
        assert_eq!(claim_query(false), ClaimQuery::DueDormant);
    }

    #[test]
    fn a_claim_takes_what_it_found_but_its_own_and_finishes_pending_cancellations() {
        let found = vec![
            orphan("wf-1", false),
            orphan("wf-2", true),
            orphan("wf-3", false),
        ];
        let ours = |id: &WorkflowId| id.as_str() == "wf-3";
        let claimed = claim(found.clone(), 64, ours);
        assert_eq!(
            claimed.takeovers,
            [
                (WorkflowId::new("wf-1"), Takeover::Recover),
                (WorkflowId::new("wf-2"), Takeover::Cancel)
            ]
        );
        assert!(!claimed.full);
        // A whole batch, its own among it: more may be waiting.
        let claimed = claim(found, 3, ours);
        assert_eq!((claimed.takeovers.len(), claimed.full), (2, true));
        assert_eq!(
            claim(Vec::new(), 64, |_| false),
            Claim {
                takeovers: Vec::new(),
                full: false
            }
        );
    }

    #[test]
    fn a_takeover_says_its_purpose_and_starts_its_supervisor_and_none_is_taken_twice_here() {
        for (action, says, starts) in [
            (Takeover::Recover, store::Purpose::Recover, Start::Replay),
            (
                Takeover::Reconcile,
                store::Purpose::Reconcile,
                Start::Replay,
            ),
            (Takeover::Cancel, store::Purpose::Cancel, Start::CancelOnly),
        ] {
            assert_eq!((purpose(action), start_after(action)), (says, starts));
        }
        assert!(may_take_over(false, false));
        assert!(!may_take_over(true, false), "supervised here");
        assert!(!may_take_over(false, true), "a takeover in flight here");
        assert!(!may_take_over(true, true));
    }

    #[test]
    fn the_next_wake_is_the_soonest_in_ms_rounded_up_and_none_for_ever() {
        assert_eq!(next_wake_ms(None), None);
        assert_eq!(next_wake_ms(Some(store::DORMANT_FOREVER_S)), None);
        assert_eq!(next_wake_ms(Some(1_700_000_000.0)), Some(1_700_000_000_000));
        assert_eq!(
            next_wake_ms(Some(1.0005)),
            Some(1_001),
            "never before it is due"
        );
    }

    #[test]
    fn a_wake_is_planned_unless_one_is_planned_no_later() {
        let plan = |wake_ms, delay_ms| {
            Some(WakePlan {
                wake_ms,
                delay: Duration::from_millis(delay_ms),
            })
        };
        assert_eq!(plan_wake(None, None, 1_000), None, "nothing dormant");
        assert_eq!(plan_wake(Some(5_000), None, 1_000), None);
        assert_eq!(plan_wake(None, Some(5_000), 1_000), plan(5_000, 4_000));
        assert_eq!(plan_wake(Some(3_000), Some(5_000), 1_000), None, "sooner");
        assert_eq!(plan_wake(Some(5_000), Some(5_000), 1_000), None, "the same");
        assert_eq!(
            plan_wake(Some(9_000), Some(5_000), 1_000),
            plan(5_000, 4_000),
            "sooner than planned"
        );
        assert_eq!(plan_wake(None, Some(500), 1_000), plan(500, 0), "at once");
    }

    fn refused(error: Error) -> Result<WorkflowId, Error> {
        Err(error)
    }

    fn lease_held() -> Error {
        Error::LeaseHeld {
            action: Takeover::Cancel,
        }
    }

    fn supervised() -> Error {
        Error::Supervised {
            workflow_id: WorkflowId::new("wf-1"),
        }
    }

    fn not_live() -> Error {
        Error::NotLive {
            action: Takeover::Recover,
            reason: "ended".into(),
        }
    }

    fn takeover_refused() -> Error {
        Error::TakeoverRefused {
            reason: "a cancel is pending".into(),
        }
    }

    fn unavailable() -> Error {
        Error::Store(store::Error::Unavailable("down".into()))
    }

    #[test]
    fn a_takeover_to_cancel_looks_again_while_a_lease_holds_it_then_gives_up() {
        let last = CANCEL_TAKEOVER_TRIES - 1;
        let after = after_cancel;
        assert!(matches!(
            after(Ok(WorkflowId::new("wf-1")), 0),
            AfterCancel::Finishing
        ));
        assert!(matches!(
            after(refused(lease_held()), 0),
            AfterCancel::LookAgain
        ));
        assert!(matches!(
            after(refused(supervised()), last - 1),
            AfterCancel::LookAgain
        ));
        for error in [lease_held(), supervised()] {
            assert!(matches!(after(refused(error), last), AfterCancel::Over));
        }
        for error in [not_live(), takeover_refused()] {
            assert!(matches!(after(refused(error), 0), AfterCancel::Over));
        }
        assert!(matches!(
            after(refused(unavailable()), 0),
            AfterCancel::Unreached(Error::Store(_))
        ));
        assert!(matches!(
            after(refused(Error::Draining), 0),
            AfterCancel::Failed(Error::Draining)
        ));
    }

    #[test]
    fn taking_back_asks_again_while_its_lease_runs_out_or_the_store_is_down() {
        let last = TAKE_BACK_TRIES - 1;
        let after = after_take_back;
        assert!(matches!(
            after(Ok(WorkflowId::new("wf-1")), 0),
            AfterTakeBack::Taken
        ));
        assert!(matches!(
            after(refused(lease_held()), last - 1),
            AfterTakeBack::AgainIfOurs
        ));
        assert!(matches!(
            after(refused(lease_held()), last),
            AfterTakeBack::NotTaken(Error::LeaseHeld { .. })
        ));
        assert!(matches!(
            after(refused(unavailable()), last - 1),
            AfterTakeBack::Again
        ));
        assert!(matches!(
            after(refused(unavailable()), last),
            AfterTakeBack::Failed(Error::Store(_))
        ));
        let lasting = Error::Store(store::Error::Database("broken".into()));
        assert!(matches!(
            after(refused(lasting), 0),
            AfterTakeBack::Failed(Error::Store(_))
        ));
        assert!(matches!(
            after(refused(takeover_refused()), last),
            AfterTakeBack::Cancel
        ));
        for error in [not_live(), supervised()] {
            assert!(matches!(
                after(refused(error), 0),
                AfterTakeBack::NotTaken(_)
            ));
        }
        assert!(matches!(
            after(refused(Error::Draining), 0),
            AfterTakeBack::Failed(Error::Draining)
        ));
    }

    #[test]
    fn a_workflow_left_live_is_taken_back_once_its_lease_ran_out_unless_draining() {
        assert_eq!(
            take_back_after(true, false, 500),
            Some(Duration::from_millis(600))
        );
        assert_eq!(
            take_back_after(true, false, 0),
            Some(Duration::from_millis(101))
        );
        assert_eq!(take_back_after(true, true, 500), None, "draining");
        assert_eq!(take_back_after(false, false, 500), None, "it ended");
    }
}
