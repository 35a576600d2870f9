//! The lease actor: one per node. Every `lease_ms / 3` it renews the lease of each child run and
//! each workflow this node owns, each renewal its own task bounded by that lease's own confirmed deadline, so a slow
//! renewal never delays another and never outlives its lease. A renewal carries any durable cancel
//! request back to the run. When a deadline passes without an acknowledged renewal, the run's owner
//! is told at once that the lease is lost (fencing), whatever its renewal is still doing.
//!
//! Deadlines are local `Instant`s derived without comparing clocks: a renewal sent at local time
//! `sent` that the database answered with `expires_at` at database time `now` holds until
//! `sent + (expires_at - now)`, which is never later than the database's own deadline.

use crate::mailbox::Post;
use std::collections::HashMap;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, DerivedActorRef, RpcReplyPort};
use store::{CancelAction, Epoch, Fence, RunId, RunRenewal, RunRow, WorkflowId};
use tokio::time::Instant;

use crate::store_actor::StoreHandle;

/// What the lease actor tells the owner of a lease.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseEvent {
    /// The lease was renewed; a durable cancel request, or the answer the run's live agent waits
    /// for, may ride along.
    Renewed {
        cancel: Option<CancelAction>,
        answer: Option<serde_json::Value>,
    },
    /// The store refused the renewal: the row is no longer live and this node's.
    Refused,
    /// The confirmed deadline passed without an acknowledged renewal: ownership is lost.
    Lost,
}

/// A lease this node holds, with what renewing it takes: a child run's or a workflow's, each
/// named by its own kind of id, so one cannot be renewed as the other:
///
/// ```compile_fail,E0308
/// let lease = actors::Leased::Run(store::WorkflowId::new("wf-1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leased {
    /// A child run: its lease is the `runs` row's owner and deadline.
    Run(RunId),
    /// A workflow: its lease is the `extension_execution_leases` row at this epoch.
    Workflow {
        workflow_id: WorkflowId,
        epoch: Epoch,
    },
}

impl Leased {
    /// The metrics label.
    pub fn label(&self) -> &'static str {
        match self {
            Leased::Run(_) => "run",
            Leased::Workflow { .. } => "workflow",
        }
    }

    /// The resource, whatever the epoch: what the lease actor tracks it by.
    pub fn key(&self) -> LeaseKey {
        match self {
            Leased::Run(run_id) => LeaseKey::Run(run_id.clone()),
            Leased::Workflow { workflow_id, .. } => LeaseKey::Workflow(workflow_id.clone()),
        }
    }
}

/// The resource a tracked lease is for: a lease taken again at a later epoch replaces the one
/// before it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LeaseKey {
    Run(RunId),
    Workflow(WorkflowId),
}

impl LeaseKey {
    /// The id, for logs.
    fn id(&self) -> &str {
        match self {
            LeaseKey::Run(run_id) => run_id.as_str(),
            LeaseKey::Workflow(workflow_id) => workflow_id.as_str(),
        }
    }
}

/// Messages of the lease actor.
pub enum LeaseMsg {
    /// Start renewing `lease`, which holds until `deadline`.
    Track {
        lease: Leased,
        deadline: Instant,
        notify: DerivedActorRef<LeaseEvent>,
    },
    /// Stop renewing a lease (its outcome is persisted, or it was fenced).
    Untrack { key: LeaseKey },
    /// Time to renew every lease that has no renewal in flight.
    Tick,
    /// A renewal task finished.
    Renewed {
        key: LeaseKey,
        sent: Instant,
        result: Box<RenewalResult>,
    },
    /// A lease's deadline may have passed.
    Deadline { key: LeaseKey },
    /// The tracked leases, for operators and tests.
    Leases { reply: RpcReplyPort<Vec<LeaseView>> },
}

type RenewalResult = Result<store::Result<Result<RunRenewal, Option<RunRow>>>, RenewalTimedOut>;

/// A renewal that could not finish before its lease's deadline.
#[derive(Debug)]
pub struct RenewalTimedOut;

/// One tracked lease as operators see it.
#[derive(Debug, Clone)]
pub struct LeaseView {
    pub lease: Leased,
    pub remaining_ms: u64,
    pub renewing: bool,
    pub refused: bool,
}

pub(crate) struct LeaseActor;

pub(crate) struct LeaseArgs {
    pub store: StoreHandle,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    pub worker_id: String,
    pub lease_ms: u64,
}

pub(crate) struct LeaseState {
    store: StoreHandle,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    worker_id: String,
    lease_ms: u64,
    leases: HashMap<LeaseKey, Tracked>,
}

struct Tracked {
    lease: Leased,
    deadline: Instant,
    notify: DerivedActorRef<LeaseEvent>,
    /// A renewal task is running; the next tick does not start another.
    renewing: bool,
    /// The store refused a renewal; renewing again cannot help, only the deadline remains.
    refused: bool,
}

impl LeaseState {
    /// Tells the owner of the lease `key`; an owner that is gone no longer needs its lease.
    fn tell(&mut self, key: &LeaseKey, event: LeaseEvent) {
        let delivered = self
            .leases
            .get(key)
            .is_some_and(|lease| lease.notify.post(event).is_ok());
        if !delivered {
            self.leases.remove(key);
        }
    }
}

impl Actor for LeaseActor {
    type Msg = LeaseMsg;
    type State = LeaseState;
    type Arguments = LeaseArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: LeaseArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let period = Duration::from_millis((args.lease_ms / 3).max(1));
        crate::mailbox::post_every(&myself, period, || LeaseMsg::Tick);
        Ok(LeaseState {
            store: args.store,
            metrics: args.metrics,
            worker_id: args.worker_id,
            lease_ms: args.lease_ms,
            leases: HashMap::new(),
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut LeaseState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: LeaseMsg,
        state: &mut LeaseState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        match message {
            LeaseMsg::Track {
                lease,
                deadline,
                notify,
            } => {
                let key = lease.key();
                schedule_deadline(&myself, &key, deadline);
                state.leases.insert(
                    key,
                    Tracked {
                        lease,
                        deadline,
                        notify,
                        renewing: false,
                        refused: false,
                    },
                );
            }
            LeaseMsg::Untrack { key } => {
                state.leases.remove(&key);
            }
            LeaseMsg::Tick => {
                for tracked in state.leases.values_mut() {
                    if tracked.renewing || tracked.refused {
                        continue;
                    }
                    tracked.renewing = true;
                    spawn_renewal(
                        &myself,
                        &state.store,
                        &tracked.lease,
                        &state.worker_id,
                        state.lease_ms,
                        tracked.deadline,
                    );
                }
            }
            LeaseMsg::Renewed { key, sent, result } => {
                let Some(lease) = state.leases.get_mut(&key) else {
                    return Ok(());
                };
                lease.renewing = false;
                let kind = lease.lease.label();
                let resource_id = key.id();
                match *result {
                    Ok(Ok(Ok(renewal))) => {
                        state
                            .metrics
                            .inc("reins_lease_renewals_total", &[("kind", kind)]);
                        let held_for =
                            Duration::from_secs_f64((renewal.expires_at - renewal.now).max(0.0));
                        let deadline = sent + held_for;
                        if deadline > lease.deadline {
                            lease.deadline = deadline;
                            schedule_deadline(&myself, &key, deadline);
                        }
                        state.tell(
                            &key,
                            LeaseEvent::Renewed {
                                cancel: renewal.cancel_action,
                                answer: renewal.answer,
                            },
                        );
                    }
                    Ok(Ok(Err(row))) => {
                        tracing::info!(
                            resource_id,
                            status = ?row.as_ref().map(|r| r.status),
                            "lease renewal refused"
                        );
                        lease.refused = true;
                        state
                            .metrics
                            .inc("reins_lease_losses_total", &[("kind", kind)]);
                        state.tell(&key, LeaseEvent::Refused);
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(resource_id, %error, "lease renewal failed; retrying next tick");
                    }
                    Err(RenewalTimedOut) => {
                        tracing::warn!(
                            resource_id,
                            "lease renewal did not finish before its deadline"
                        );
                    }
                }
            }
            LeaseMsg::Deadline { key } => {
                let expired = state
                    .leases
                    .get(&key)
                    .filter(|lease| lease.deadline <= Instant::now())
                    .map(|lease| lease.lease.label());
                if let Some(kind) = expired {
                    state
                        .metrics
                        .inc("reins_lease_losses_total", &[("kind", kind)]);
                    tracing::warn!(
                        resource_id = key.id(),
                        "lease deadline passed without a renewal: fencing"
                    );
                    state.tell(&key, LeaseEvent::Lost);
                    state.leases.remove(&key);
                }
            }
            LeaseMsg::Leases { reply } => {
                let now = Instant::now();
                let views = state
                    .leases
                    .values()
                    .map(|lease| LeaseView {
                        lease: lease.lease.clone(),
                        remaining_ms: u64::try_from(
                            lease.deadline.saturating_duration_since(now).as_millis(),
                        )
                        .unwrap_or(u64::MAX),
                        renewing: lease.renewing,
                        refused: lease.refused,
                    })
                    .collect();
                let _ = reply.send(views);
            }
        }
        Ok(())
    }
}

fn schedule_deadline(myself: &ActorRef<LeaseMsg>, key: &LeaseKey, deadline: Instant) {
    let key = key.clone();
    crate::mailbox::post_after(
        myself,
        deadline.saturating_duration_since(Instant::now()),
        move || LeaseMsg::Deadline { key },
    );
}

/// One renewal, bounded by the lease's deadline; its answer comes back as a message. Nothing
/// awaits it, so a hung store never holds up the actor or its shutdown.
fn spawn_renewal(
    myself: &ActorRef<LeaseMsg>,
    store: &StoreHandle,
    lease: &Leased,
    worker_id: &str,
    lease_ms: u64,
    deadline: Instant,
) {
    let (myself, store, lease) = (myself.clone(), store.clone(), lease.clone());
    let worker_id = worker_id.to_owned();
    tokio::spawn(async move {
        let sent = Instant::now();
        let key = lease.key();
        let renewal = async {
            match lease {
                Leased::Run(run_id) => store.renew_run_lease(&run_id, &worker_id, lease_ms).await,
                Leased::Workflow { workflow_id, epoch } => {
                    let fence = Fence {
                        resource_id: workflow_id,
                        owner: worker_id.clone(),
                        epoch,
                    };
                    // A workflow lease has the same answers as a run's, minus the riders.
                    match store.renew_lease(&fence, lease_ms).await {
                        Ok((lease, now)) => Ok(Ok(RunRenewal {
                            expires_at: lease.expires_at,
                            now,
                            cancel_action: None,
                            answer: None,
                        })),
                        Err(store::Error::LeaseLost { .. }) => Ok(Err(None)),
                        Err(error) => Err(error),
                    }
                }
            }
        };
        let result = tokio::time::timeout_at(deadline, renewal)
            .await
            .map_err(|_| RenewalTimedOut);
        // The actor may have stopped meanwhile; the answer then has nobody to go to.
        let _ = myself.post(LeaseMsg::Renewed {
            key,
            sent,
            result: Box::new(result),
        });
    });
}
