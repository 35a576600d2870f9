//! Takeovers: recover, reconcile, a dead owner's cancellation, taking back what this node's own
//! supervisor left live; and the claims that take recoverable workflows (`recovery: automatic`)
//! and dormant ones whose wake time came. Each takeover runs in a task; its supervisor starts on
//! the actor's turn.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use store::{LaunchLimits, WorkflowId, WorkflowRow};
use tokio::time::Instant;

use super::actor::{Asked, WorkflowsMsg, WorkflowsState, start_supervisor};
use super::{not_found, our_versions};
use crate::clock::now_ms;
use crate::error::{Error, Takeover};
use crate::mailbox::Post;
use crate::store_actor::StoreHandle;
use crate::workflow::Start;
use crate::workflow::requests::ReconcileRequest;
use crate::workflow::rules::{self, AfterCancel, AfterTakeBack, Supervised};

/// A workflow this node has taken over and read back: what its supervisor starts from.
pub struct Ready {
    pub(super) workflow: Supervised,
    pub(super) lease: store::Lease,
    /// When the takeover was sent: the lease's local deadline counts from here.
    pub(super) sent: Instant,
}

/// Recoverable workflows claimed per query; a full batch is followed by another claim at once,
/// so any number of orphaned workflows is taken over within a claim period or two.
const RECOVERY_BATCH: u32 = 64;

/// A takeover's task has finished: its supervisor starts here, and whoever asked hears.
pub(super) async fn taken_over(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    workflow_id: WorkflowId,
    result: Result<Ready, Error>,
    asked: Asked,
) {
    state.taking_over.remove(&workflow_id);
    let started = match result {
        Ok(ready) => start_ready(myself, state, ready, asked.start()).await,
        Err(error) => Err(error),
    };
    after_takeover(myself, state, workflow_id, started, asked);
}

/// Claims, in a task, what `claimable` finds, as `rules::claim` decides (not the workflows
/// supervised here): the end comes back as [`WorkflowsMsg::Claimed`].
pub(super) fn claim(myself: &ActorRef<WorkflowsMsg>, state: &mut WorkflowsState) {
    state.claiming = true;
    let versions = our_versions(state);
    let (store, me) = (state.args.store.clone(), myself.clone());
    let automatic = state.args.options.automatic_recovery;
    let live: std::collections::HashSet<WorkflowId> = state.live.keys().cloned().collect();
    tokio::spawn(async move {
        let (found, next_wake_ms) = claimable(&store, &versions, automatic).await;
        let claim = rules::claim(found, RECOVERY_BATCH, |id| live.contains(id));
        claim_all(&me, claim.takeovers).await;
        let _ = me.post(WorkflowsMsg::Claimed {
            full: claim.full,
            next_wake_ms,
        });
    });
}

/// A claim is decided: another follows at once if it found a full batch or was asked for
/// meanwhile, and one is planned for the next dormant workflow's wake time.
pub(super) fn claimed(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    full: bool,
    next_wake_ms: Option<i64>,
) {
    state.claiming = false;
    if full || std::mem::take(&mut state.claim_again) {
        let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
    }
    plan_wake(myself, state, next_wake_ms);
}

/// The wake time a claim planned for has come: claim.
pub(super) fn wake_due(myself: &ActorRef<WorkflowsMsg>, state: &mut WorkflowsState) {
    state.planned_wake_ms = None;
    let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
}

/// Tells whoever waits for a takeover to cancel that this try is decided.
fn reply_done(done: Option<RpcReplyPort<()>>) {
    if let Some(done) = done {
        let _ = done.send(());
    }
}

/// What a claim takes: under automatic recovery every recoverable workflow (the dormant ones
/// whose wake time came among them), under manual recovery only those dormant ones; and when
/// the next dormant workflow wakes (epoch ms). A read that fails claims nothing this time.
async fn claimable(
    store: &StoreHandle,
    versions: &store::Versions,
    automatic: bool,
) -> (Vec<store::Orphaned>, Option<i64>) {
    let dormancy = match store.dormant_workflows(RECOVERY_BATCH, versions).await {
        Ok(dormancy) => dormancy,
        Err(error) => {
            tracing::warn!(%error, "looking for dormant workflows failed");
            store::Dormancy::default()
        }
    };
    let next_wake_ms = rules::next_wake_ms(dormancy.next_wake_at);
    if rules::claim_query(automatic) == rules::ClaimQuery::DueDormant {
        return (dormancy.due, next_wake_ms);
    }
    match store.recoverable_workflows(RECOVERY_BATCH, versions).await {
        Ok(orphaned) => (orphaned, next_wake_ms),
        Err(error) => {
            tracing::warn!(%error, "looking for recoverable workflows failed");
            (dormancy.due, next_wake_ms)
        }
    }
}

/// Plans a claim for when the next dormant workflow wakes, unless one is planned no later
/// (`rules::plan_wake`), judged by the database's clock as this node reads it
/// (`clock::now_ms`).
fn plan_wake(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    next_wake_ms: Option<i64>,
) {
    let Some(plan) = rules::plan_wake(state.planned_wake_ms, next_wake_ms, now_ms()) else {
        return;
    };
    state.planned_wake_ms = Some(plan.wake_ms);
    crate::mailbox::post_after(myself, plan.delay, || WorkflowsMsg::WakeDue);
}

/// Takes over every orphaned workflow of a claim, all at once, each with the usual rules (a
/// pending cancellation is finished without replaying the body), and returns when every
/// takeover is decided.
async fn claim_all(workflows: &ActorRef<WorkflowsMsg>, takeovers: Vec<(WorkflowId, Takeover)>) {
    let mut decided = Vec::new();
    for (workflow_id, action) in takeovers {
        if action == Takeover::Cancel {
            let (done, answer) = ractor::concurrency::oneshot();
            let _ = workflows.post(WorkflowsMsg::TakeOverToCancel {
                workflow_id,
                tries: 0,
                done: Some(done.into()),
            });
            decided.push(tokio::spawn(async move {
                let _ = answer.await;
            }));
            continue;
        }
        let (reply, answer) = ractor::concurrency::oneshot();
        let _ = workflows.post(WorkflowsMsg::Recover {
            workflow_id: workflow_id.clone(),
            reply: reply.into(),
        });
        decided.push(tokio::spawn(async move {
            match answer.await {
                Ok(Ok(_)) => tracing::info!(run_id = %workflow_id, "recovered automatically"),
                Ok(Err(error)) => tracing::info!(run_id = %workflow_id, %error, "not recovered"),
                Err(_) => {}
            }
        }));
    }
    futures_util::future::join_all(decided).await;
}

/// Takes a workflow over in a task, which also reads it back (and, for a reconcile, settles its
/// step): nothing of it runs on the actor's turn. The result comes back as
/// [`WorkflowsMsg::TakenOver`], where the supervisor starts. A workflow supervised here, or with
/// a takeover in flight here, is not taken over again: the asker hears
/// [`Error::Supervised`] at once.
pub(super) fn take_over(
    state: &mut WorkflowsState,
    myself: &ActorRef<WorkflowsMsg>,
    workflow_id: WorkflowId,
    asked: Asked,
) {
    let supervised_here = state.live.contains_key(&workflow_id);
    if !rules::may_take_over(supervised_here, state.taking_over.contains(&workflow_id)) {
        let supervised = Err(Error::Supervised {
            workflow_id: workflow_id.clone(),
        });
        after_takeover(myself, state, workflow_id, supervised, asked);
        return;
    }
    state.taking_over.insert(workflow_id.clone());
    let (store, me) = (state.args.store.clone(), myself.clone());
    let (owner, lease_ms) = (state.args.worker_id.clone(), state.args.options.lease_ms);
    let (versions, limits) = (our_versions(state), state.args.options.launch_limits);
    tokio::spawn(async move {
        let result = async {
            let sent = Instant::now();
            let purpose = rules::purpose(asked.action());
            let answer = store
                .take_over_workflow(&workflow_id, &owner, lease_ms, &versions, purpose)
                .await;
            let lease = rules::taken(asked.action(), answer)?;
            let workflow = match &asked {
                Asked::Reconcile { request, .. } => {
                    reconcile(&store, limits, request, &lease).await?
                }
                _ => Supervised::stored(stored_row(&store, &workflow_id).await?)?,
            };
            Ok(Ready {
                workflow,
                lease,
                sent,
            })
        }
        .await;
        let _ = me.post(WorkflowsMsg::TakenOver {
            workflow_id,
            result: Box::new(result),
            asked,
        });
    });
}

/// Starts the supervisor of a workflow this node has taken over, unless one supervises it
/// here already (then the lease just taken is given back, in a task). Runs on the actor's turn,
/// so no two supervisors of one workflow ever start on this node.
pub(super) async fn start_ready(
    myself: &ActorRef<WorkflowsMsg>,
    state: &mut WorkflowsState,
    ready: Ready,
    start: Start,
) -> Result<WorkflowId, Error> {
    let workflow_id = ready.workflow.workflow_id.clone();
    if state.live.contains_key(&workflow_id) {
        let (store, fence) = (state.args.store.clone(), ready.lease.fence());
        tokio::spawn(async move {
            let _ = store.release_lease(&fence).await;
        });
        return Err(Error::Supervised { workflow_id });
    }
    start_supervisor(
        myself,
        state,
        ready.workflow,
        ready.lease,
        ready.sent,
        start,
    )
    .await?;
    Ok(workflow_id)
}

/// What follows a takeover's end, for whoever asked for it (`rules::after_cancel`,
/// `rules::after_take_back`).
fn after_takeover(
    myself: &ActorRef<WorkflowsMsg>,
    state: &WorkflowsState,
    workflow_id: WorkflowId,
    started: Result<WorkflowId, Error>,
    asked: Asked,
) {
    let lease_period = Duration::from_millis(state.args.options.lease_ms.max(1));
    match asked {
        Asked::Recover(reply) | Asked::Reconcile { reply, .. } => {
            let _ = reply.send(started);
        }
        Asked::Cancel { tries, done } => {
            match rules::after_cancel(started, tries) {
                AfterCancel::Finishing => {
                    tracing::info!(run_id = %workflow_id, "finishing the cancellation of a workflow whose owner is gone");
                }
                // The owner may be alive (its poll finds the cancel and carries it out), or dead
                // with a lease not yet run out: look again when it may have.
                AfterCancel::LookAgain => {
                    crate::mailbox::post_after(myself, lease_period, move || {
                        WorkflowsMsg::TakeOverToCancel {
                            workflow_id,
                            tries: tries + 1,
                            done: None,
                        }
                    });
                }
                // It already ended, or no cancellation is pending any more.
                AfterCancel::Over => {}
                AfterCancel::Unreached(error) => {
                    tracing::warn!(run_id = %workflow_id, %error, "cannot take the workflow over to cancel it");
                }
                AfterCancel::Failed(error) => {
                    tracing::error!(run_id = %workflow_id, %error, "cannot finish the cancellation");
                }
            }
            reply_done(done);
        }
        Asked::TakeBack { tries } => match rules::after_take_back(started, tries) {
            AfterTakeBack::Taken => tracing::info!(run_id = %workflow_id, "taken back"),
            AfterTakeBack::AgainIfOurs => {
                // Still this node's own lease, running out: ask again when it has. Another
                // node's lease means that node took the workflow over: it is not ours to
                // take back.
                let (store, me) = (state.args.store.clone(), myself.clone());
                let ours = state.args.worker_id.clone();
                tokio::spawn(async move {
                    if let Ok(Some(lease)) = store.read_lease(&workflow_id).await
                        && lease.owner == ours
                    {
                        crate::mailbox::post_after(&me, lease_period, move || {
                            WorkflowsMsg::TakeBack {
                                workflow_id,
                                tries: tries + 1,
                            }
                        });
                    }
                });
            }
            AfterTakeBack::Again => {
                crate::mailbox::post_after(myself, lease_period, move || WorkflowsMsg::TakeBack {
                    workflow_id,
                    tries: tries + 1,
                });
            }
            // A cancellation is pending (or another rule refused): a cancel takeover
            // finishes it if one is asked for; otherwise the workflow waits as it is.
            AfterTakeBack::Cancel => {
                let _ = myself.post(WorkflowsMsg::TakeOverToCancel {
                    workflow_id,
                    tries: 0,
                    done: None,
                });
            }
            AfterTakeBack::NotTaken(error) => {
                tracing::info!(run_id = %workflow_id, %error, "not taken back");
            }
            AfterTakeBack::Failed(error) => {
                tracing::warn!(run_id = %workflow_id, %error, "cannot take it back");
            }
        },
    }
}

pub(super) async fn stored_row(
    store: &StoreHandle,
    workflow_id: &WorkflowId,
) -> Result<WorkflowRow, Error> {
    store
        .read_workflow(workflow_id)
        .await?
        .ok_or_else(|| not_found(workflow_id))
}

/// Settles the step under the new lease (in the takeover's task) and answers the workflow its
/// supervisor resumes by replay.
async fn reconcile(
    store: &StoreHandle,
    limits: LaunchLimits,
    request: &ReconcileRequest,
    lease: &store::Lease,
) -> Result<Supervised, Error> {
    let id = &request.workflow_id;
    let row = store
        .read_workflow(id)
        .await?
        .ok_or_else(|| not_found(id))?;
    let steps = store.read_steps(id).await?;
    let (ops, row) = rules::reconcile_writes(row, steps, limits, request, now_ms())?;
    let written = store.fenced_write(&lease.fence(), ops).await;
    if let Err(store::Error::LimitReached(limit)) = &written {
        // Nothing was written; the lease taken for the reconcile is given back so that the
        // operator can try again once a place is free.
        let _ = store.release_lease(&lease.fence()).await;
        let max = match limit {
            store::Limit::Workflows => limits.max_workflows,
            store::Limit::WorkflowsPerOwner => limits.max_workflows_per_owner,
            store::Limit::TokensPerUser { max } => u64::from(*max),
            store::Limit::StoredBytes { max, .. }
            | store::Limit::UntakenEvents { max }
            | store::Limit::UntakenEventBytes { max, .. } => u64::try_from(*max).unwrap_or(0),
        };
        return Err(Error::LimitReached { limit: *limit, max });
    }
    written?;
    Supervised::stored(row)
}
