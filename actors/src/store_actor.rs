//! The store actor: the front door to the database for every actor. It never runs a query in its
//! own handler: each request is a job over the store ([`StoreMsg`]) that becomes a task bounded by
//! a semaphore (`store_requests_max` in flight), so independent requests proceed in parallel on the
//! store's pool and a slow query never holds up the mailbox. Reads and writes have a semaphore
//! each: however many reads wait (a flood of `get`s of a large record), a write never waits
//! behind them for its turn. There is one message for every
//! operation: a job calls the store's typed method and answers its own caller. [`StoreHandle`]
//! is the typed API the actors use; each of its methods names its [`Operation`] (test faults and
//! whether an unanswered call may have written come from it) and the call it makes. A job runs
//! no longer than its caller waits (`store.call_timeout_ms`): past that it is abandoned, and the
//! PostgreSQL connections it held are closed rather than handed to the next request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use store::{
    Admission, ApprovalAnswer, ArtifactRow, Backend, BackupReport, CancelAction, ControlRow,
    ControlWrite, EventPage, EventRow, Fence, Launch, LaunchLimits, Lease, NewControl, NewRun,
    NewToken, NewUser, NewWorkflow, NodeRecord, Notification, Operation, RunId, RunOutcome,
    RunRenewal, RunRow, RunStatus, Settlement, SlotRow, StatusCount, StepRow, Store, TakeOver,
    TokenRow, UserChange, UserChanged, UserDeletion, UserRow, WorkflowId, WorkflowRow, WriteOp,
};
use tokio::sync::Semaphore;

use crate::events::EventWakes;
use crate::faults::{FaultAction, StoreFaults};
use crate::metrics::Metrics;

/// The work of one request: a call on the store that sends its own answer.
type Job = Box<dyn FnOnce(Arc<Store>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// A request the store actor serves: one job over the store, whatever the operation, and
/// whether that operation may write (which semaphore it waits for).
pub struct StoreMsg {
    writes: bool,
    job: Job,
}

/// What readiness needs to know about the database.
#[derive(Debug, Clone, Serialize)]
pub struct StoreHealth {
    pub backend: Backend,
    pub schema_version: i64,
    pub schema_current: bool,
    /// Connections in the PostgreSQL pool and how many are idle.
    pub pool: Option<(usize, usize)>,
    /// Transactions of more than one write so far (group commit), and the writes they carried.
    pub write_batches: (u64, u64),
    /// A write failed for a full disk and no write has succeeded since.
    pub disk_full: bool,
}

pub(crate) struct StoreActor;

pub(crate) struct StoreState {
    store: Arc<Store>,
    /// Reads in flight, at most `requests_max`.
    reads_in_flight: Arc<Semaphore>,
    /// Writes in flight, at most `requests_max`: never taken by a read.
    writes_in_flight: Arc<Semaphore>,
    metrics: Arc<Metrics>,
}

pub(crate) struct StoreArgs {
    pub store: Arc<Store>,
    pub requests_max: usize,
    pub metrics: Arc<Metrics>,
}

impl Actor for StoreActor {
    type Msg = StoreMsg;
    type State = StoreState;
    type Arguments = StoreArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: StoreArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(StoreState {
            store: args.store,
            reads_in_flight: Arc::new(Semaphore::new(args.requests_max.max(1))),
            writes_in_flight: Arc::new(Semaphore::new(args.requests_max.max(1))),
            metrics: args.metrics,
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut StoreState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        StoreMsg { writes, job }: StoreMsg,
        state: &mut StoreState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        let in_flight = Arc::clone(if writes {
            &state.writes_in_flight
        } else {
            &state.reads_in_flight
        });
        let metrics = Arc::clone(&state.metrics);
        let work = job(Arc::clone(&state.store));
        // The permit is waited for in the job's task, not in this handler: a read that waits
        // for one of the reads' permits must not keep a write behind it in the mailbox. What
        // waits is bounded by the callers, each of which waits for its answer with a timeout.
        tokio::spawn(async move {
            // The semaphores live as long as this actor's state and are never closed.
            let Ok(permit) = in_flight.acquire_owned().await else {
                return;
            };
            metrics
                .store_requests_waiting
                .fetch_sub(1, Ordering::Relaxed);
            metrics
                .store_requests_running
                .fetch_add(1, Ordering::Relaxed);
            work.await;
            metrics
                .store_requests_running
                .fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
        Ok(())
    }
}

/// A cheap, cloneable way to call the store actor with a timeout on every request.
#[derive(Clone)]
pub struct StoreHandle {
    actor: ActorRef<StoreMsg>,
    timeout: Duration,
    /// Test faults; `None` on every production node.
    faults: Option<StoreFaults>,
    /// Journal write latency and refused fenced writes are counted here.
    metrics: Arc<Metrics>,
    /// Set when any call answers [`store::Error::DiskFull`], cleared when a write probe
    /// succeeds; shared by every clone, read by readiness.
    disk_full: Arc<AtomicBool>,
    /// Told after each write that may have written workflow events (see [`EventWakes`]).
    wakes: Arc<EventWakes>,
}

/// Whether a change may move its workflow to another status (an event of the feed).
fn changes_status(op: &WriteOp) -> bool {
    matches!(op, WriteOp::SetWorkflow { .. })
}

impl StoreHandle {
    pub(crate) fn new(
        actor: ActorRef<StoreMsg>,
        timeout: Duration,
        faults: Option<StoreFaults>,
        metrics: Arc<Metrics>,
    ) -> Self {
        StoreHandle {
            actor,
            timeout,
            faults,
            metrics,
            disk_full: Arc::new(AtomicBool::new(false)),
            wakes: Arc::new(EventWakes::default()),
        }
    }

    /// What wakes this node's event streams; a change bus that hears of commits on other nodes
    /// tells it too.
    pub fn event_wakes(&self) -> &Arc<EventWakes> {
        &self.wakes
    }

    /// Wakes the streams of `workflow_id` after a write that may have committed (a write whose
    /// outcome is unknown may have): a wake is only a hint to read again.
    fn wake<T>(&self, workflow_id: &WorkflowId, status_changed: bool, written: &store::Result<T>) {
        if matches!(written, Ok(_) | Err(store::Error::OutcomeUnknown(_))) {
            self.wakes.committed(workflow_id, status_changed);
        }
    }

    /// Runs `work` on the store through the actor as `operation`, applying any test fault
    /// installed for it.
    async fn call<T, F, Fut>(&self, operation: Operation, work: F) -> store::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Store>) -> Fut + Send + 'static,
        Fut: Future<Output = store::Result<T>> + Send + 'static,
    {
        self.call_about(operation, None, work).await
    }

    /// [`StoreHandle::call`] for a request about one run, so faults can single it out.
    async fn call_about<T, F, Fut>(
        &self,
        operation: Operation,
        key: Option<&str>,
        work: F,
    ) -> store::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Store>) -> Fut + Send + 'static,
        Fut: Future<Output = store::Result<T>> + Send + 'static,
    {
        let Some(fault) = self.faults.as_ref().and_then(|f| f.take(operation, key)) else {
            return self.send(operation, work).await;
        };
        let name = operation.name();
        // A held call is bounded by the same timeout as a real one: past it, the caller hears
        // what it would hear from a hung store.
        let held_too_long = |what: &str| {
            format!(
                "{name} held {what} for more than {} ms",
                self.timeout.as_millis()
            )
        };
        match fault {
            FaultAction::Fail(error) => Err(error),
            FaultAction::HoldBefore { reached, release } => {
                reached.notify_one();
                if tokio::time::timeout(self.timeout, release.notified())
                    .await
                    .is_err()
                {
                    return Err(store::Error::Unavailable(held_too_long("before the store")));
                }
                self.send(operation, work).await
            }
            FaultAction::HoldAnswer { reached, release } => {
                let answer = self.send(operation, work).await;
                reached.notify_one();
                if tokio::time::timeout(self.timeout, release.notified())
                    .await
                    .is_err()
                {
                    return Err(store::Error::OutcomeUnknown(held_too_long("its answer")));
                }
                answer
            }
            FaultAction::DropAnswer => {
                let _ = self.send(operation, work).await;
                Err(store::Error::OutcomeUnknown(format!(
                    "the answer of {name} was lost"
                )))
            }
        }
    }

    async fn send<T, F, Fut>(&self, operation: Operation, work: F) -> store::Result<T>
    where
        T: Send + 'static,
        F: FnOnce(Arc<Store>) -> Fut + Send + 'static,
        Fut: Future<Output = store::Result<T>> + Send + 'static,
    {
        let unanswered = |reason: String| {
            if operation.writes() {
                // The request may have reached the database: its outcome is unknown, not failed.
                store::Error::OutcomeUnknown(format!("store actor: {reason}"))
            } else {
                store::Error::Unavailable(format!("store actor: {reason}"))
            }
        };
        let timeout = self.timeout;
        let message = |reply: RpcReplyPort<store::Result<T>>| {
            // A caller that gave up has dropped its port; its answer is then discarded. The work
            // itself is given up on after as long as the caller waits, so that a call stuck on
            // a dead network holds neither a permit nor a connection (which is closed, not
            // reused: see `store::bounded`).
            StoreMsg {
                writes: operation.writes(),
                job: Box::new(move |store| {
                    Box::pin(async move {
                        let _ = reply.send(store::bounded(timeout, operation, work(store)).await);
                    })
                }),
            }
        };
        let queue = &self.metrics.store_requests_waiting;
        queue.fetch_add(1, Ordering::Relaxed);
        let answer = crate::mailbox::call(&self.actor, message, Some(self.timeout)).await;
        if answer.is_err() {
            // Never delivered: it is in no queue.
            queue.fetch_sub(1, Ordering::Relaxed);
        }
        match answer {
            Ok(CallResult::Success(result)) => {
                if let Err(store::Error::DiskFull(_)) = &result {
                    self.disk_full.store(true, Ordering::Relaxed);
                }
                result
            }
            Ok(CallResult::Timeout) => Err(unanswered(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
            Ok(CallResult::SenderError) => Err(unanswered("dropped the request".into())),
            // The message was never delivered, so nothing can have been written.
            Err(e) => Err(store::Error::Unavailable(format!("store actor: {e}"))),
        }
    }

    /// See [`Store::acquire_lease`].
    pub async fn acquire_lease(
        &self,
        resource_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
    ) -> store::Result<Option<Lease>> {
        let (resource_id, owner) = (resource_id.to_owned(), owner.to_owned());
        self.call(Operation::AcquireLease, move |store| async move {
            store.acquire_lease(&resource_id, &owner, lease_ms).await
        })
        .await
    }

    /// See [`Store::renew_lease`].
    pub async fn renew_lease(&self, fence: &Fence, lease_ms: u64) -> store::Result<(Lease, f64)> {
        let fence = fence.clone();
        self.call(Operation::RenewLease, move |store| async move {
            store.renew_lease(&fence, lease_ms).await
        })
        .await
    }

    /// See [`Store::release_lease`].
    pub async fn release_lease(&self, fence: &Fence) -> store::Result<bool> {
        let fence = fence.clone();
        self.call(Operation::ReleaseLease, move |store| async move {
            store.release_lease(&fence).await
        })
        .await
    }

    /// See [`Store::read_lease`].
    pub async fn read_lease(&self, resource_id: &WorkflowId) -> store::Result<Option<Lease>> {
        let resource_id = resource_id.to_owned();
        self.call(Operation::ReadLease, move |store| async move {
            store.read_lease(&resource_id).await
        })
        .await
    }

    /// See [`Store::fenced_write`].
    pub async fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> store::Result<()> {
        let status_changed = ops.iter().any(changes_status);
        let workflow_id = fence.resource_id.clone();
        let fence = fence.clone();
        let started = std::time::Instant::now();
        let written = self
            .call(Operation::FencedWrite, move |store| async move {
                store.fenced_write(&fence, ops).await
            })
            .await;
        self.wake(&workflow_id, status_changed, &written);
        match &written {
            Ok(()) => self
                .metrics
                .observe("reins_journal_write_seconds", started.elapsed()),
            Err(store::Error::LeaseLost { .. }) => {
                self.metrics.inc("reins_fenced_writes_rejected_total", &[]);
            }
            Err(_) => {}
        }
        written
    }

    /// See [`Store::read_workflow`].
    pub async fn read_workflow(
        &self,
        workflow_id: &WorkflowId,
    ) -> store::Result<Option<WorkflowRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadWorkflow, move |store| async move {
            store.read_workflow(&workflow_id).await
        })
        .await
    }

    /// See [`Store::read_events`].
    pub async fn read_events(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> store::Result<Option<EventPage>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadEvents, move |store| async move {
            store.read_events(&workflow_id, after, limit).await
        })
        .await
    }

    /// See [`Store::read_feed`].
    pub async fn read_feed(
        &self,
        after: i64,
        user_id: Option<&str>,
        limit: u32,
    ) -> store::Result<Vec<EventRow>> {
        let user_id = user_id.map(str::to_owned);
        self.call(Operation::ReadFeed, move |store| async move {
            store.read_feed(after, user_id.as_deref(), limit).await
        })
        .await
    }

    /// See [`Store::feed_head`].
    pub async fn feed_head(&self) -> store::Result<i64> {
        self.call(Operation::FeedHead, |store| async move {
            store.feed_head().await
        })
        .await
    }

    /// See [`Store::register_notify_target`].
    pub async fn register_notify_target(&self, target: &str) -> store::Result<bool> {
        let target = target.to_owned();
        self.call(Operation::RegisterNotifyTarget, move |store| async move {
            store.register_notify_target(&target).await
        })
        .await
    }

    /// See [`Store::claim_notifications`].
    pub async fn claim_notifications(
        &self,
        owner: &str,
        target: &str,
        claim_ms: u64,
        max: u32,
    ) -> store::Result<Vec<Notification>> {
        let (owner, target) = (owner.to_owned(), target.to_owned());
        self.call(Operation::ClaimNotifications, move |store| async move {
            store
                .claim_notifications(&owner, &target, claim_ms, max)
                .await
        })
        .await
    }

    /// See [`Store::settle_notification`].
    pub async fn settle_notification(
        &self,
        id: &str,
        target: &str,
        epoch: i64,
        settlement: Settlement,
        targets: &[String],
    ) -> store::Result<bool> {
        let (id, target, targets) = (id.to_owned(), target.to_owned(), targets.to_vec());
        self.call(Operation::SettleNotification, move |store| async move {
            store
                .settle_notification(&id, &target, epoch, settlement, &targets)
                .await
        })
        .await
    }

    /// See [`Store::purge_notifications`].
    pub async fn purge_notifications(&self, retention_ms: u64) -> store::Result<u64> {
        self.call(Operation::PurgeNotifications, move |store| async move {
            store.purge_notifications(retention_ms).await
        })
        .await
    }

    /// See [`Store::overdue_waits`].
    pub async fn overdue_waits(&self) -> store::Result<u64> {
        self.call(Operation::OverdueWaits, move |store| async move {
            store.overdue_waits().await
        })
        .await
    }

    /// See [`Store::notification_backlog`].
    pub async fn notification_backlog(&self) -> store::Result<u64> {
        self.call(Operation::NotificationBacklog, |store| async move {
            store.notification_backlog().await
        })
        .await
    }

    /// See [`Store::watch_events`].
    pub async fn watch_events(&self, workflow_id: &WorkflowId, watch_ms: u64) -> store::Result<()> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::WatchEvents, move |store| async move {
            store.watch_events(&workflow_id, watch_ms).await
        })
        .await
    }

    /// See [`Store::read_steps`].
    pub async fn read_steps(&self, workflow_id: &WorkflowId) -> store::Result<Vec<StepRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadSteps, move |store| async move {
            store.read_steps(&workflow_id).await
        })
        .await
    }

    /// See [`Store::backup`].
    pub async fn backup(&self, destination: &std::path::Path) -> store::Result<BackupReport> {
        let destination = destination.to_path_buf();
        self.call(Operation::Backup, move |store| async move {
            store.backup(&destination).await
        })
        .await
    }

    /// The database clock, in epoch seconds.
    pub async fn now(&self) -> store::Result<f64> {
        self.call(Operation::Now, |store| async move { store.now().await })
            .await
    }

    /// Whether the database answers, its schema is the one this build expects, and (after a
    /// write failed for a full disk) whether it can write again. Only then does it write: one
    /// probe per call until a probe succeeds, since a full disk fails writes and never reads,
    /// and a write that changes nothing succeeds even on a full disk.
    pub async fn health(&self) -> store::Result<StoreHealth> {
        let mut health = self
            .call(Operation::SchemaVersion, |store| async move {
                let schema_version = store.schema_version().await?;
                Ok(StoreHealth {
                    backend: store.backend(),
                    schema_version,
                    schema_current: schema_version == store::SCHEMA_VERSION,
                    pool: store.pool_status(),
                    write_batches: store.write_batches(),
                    disk_full: false,
                })
            })
            .await?;
        if self.disk_full.load(Ordering::Relaxed) {
            match self
                .call(Operation::WriteProbe, |store| async move {
                    store.write_probe().await
                })
                .await
            {
                Ok(()) => self.disk_full.store(false, Ordering::Relaxed),
                Err(store::Error::DiskFull(_)) => {}
                Err(error) => return Err(error),
            }
            health.disk_full = self.disk_full.load(Ordering::Relaxed);
        }
        Ok(health)
    }

    /// Records this node in the `nodes` table.
    pub async fn register_node(&self, node: &NodeRecord) -> store::Result<()> {
        let node = node.clone();
        self.call(Operation::RegisterNode, move |store| async move {
            store.register_node(&node).await
        })
        .await
    }

    /// Records that this node stopped cleanly.
    pub async fn mark_node_stopped(&self, worker_id: &str) -> store::Result<()> {
        let worker_id = worker_id.to_owned();
        self.call(Operation::MarkNodeStopped, move |store| async move {
            store.mark_node_stopped(&worker_id).await
        })
        .await
    }

    /// See [`Store::launch_workflow`].
    pub async fn launch_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> store::Result<Launch> {
        let owner = owner.to_owned();
        let workflow_id = workflow.workflow_id.clone();
        let launched = self
            .call(Operation::LaunchWorkflow, move |store| async move {
                store
                    .launch_workflow(workflow, &owner, lease_ms, limits)
                    .await
            })
            .await;
        self.wake(&workflow_id, true, &launched);
        launched
    }

    /// See [`Store::retry_workflow`].
    pub async fn retry_workflow(
        &self,
        retry: store::NewRetry,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> store::Result<store::Retry> {
        let owner = owner.to_owned();
        let workflow_id = retry.workflow.workflow_id.clone();
        let retried = self
            .call(Operation::RetryWorkflow, move |store| async move {
                store.retry_workflow(retry, &owner, lease_ms, limits).await
            })
            .await;
        self.wake(&workflow_id, true, &retried);
        retried
    }

    /// See [`Store::take_over_workflow`].
    pub async fn take_over_workflow(
        &self,
        workflow_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
        versions: &store::Versions,
        purpose: store::Purpose,
    ) -> store::Result<TakeOver> {
        let woken = workflow_id.to_owned();
        let (workflow_id, owner, versions) =
            (workflow_id.to_owned(), owner.to_owned(), versions.clone());
        let taken = self
            .call(Operation::TakeOverWorkflow, move |store| async move {
                store
                    .take_over_workflow(&workflow_id, &owner, lease_ms, &versions, purpose)
                    .await
            })
            .await;
        self.wake(&woken, true, &taken);
        taken
    }

    /// See [`Store::recoverable_workflows`].
    pub async fn recoverable_workflows(
        &self,
        limit: u32,
        versions: &store::Versions,
    ) -> store::Result<Vec<store::Orphaned>> {
        let versions = versions.clone();
        self.call(Operation::RecoverableWorkflows, move |store| async move {
            store.recoverable_workflows(limit, &versions).await
        })
        .await
    }

    /// See [`Store::dormant_workflows`].
    pub async fn dormant_workflows(
        &self,
        limit: u32,
        versions: &store::Versions,
    ) -> store::Result<store::Dormancy> {
        let versions = versions.clone();
        self.call(Operation::DormantWorkflows, move |store| async move {
            store.dormant_workflows(limit, &versions).await
        })
        .await
    }

    /// See [`Store::workflows_with_pending_controls`].
    pub async fn workflows_with_pending_controls(
        &self,
        owner: &str,
    ) -> store::Result<Vec<WorkflowId>> {
        let owner = owner.to_owned();
        self.call(Operation::PendingControls, move |store| async move {
            store.workflows_with_pending_controls(&owner).await
        })
        .await
    }

    /// See [`Store::delete_workflow`].
    pub async fn delete_workflow(
        &self,
        workflow_id: &WorkflowId,
    ) -> store::Result<store::Deletion> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::DeleteWorkflow, move |store| async move {
            store.delete_workflow(&workflow_id).await
        })
        .await
    }

    /// See [`Store::workflow_counts`].
    pub async fn workflow_counts(&self, owner: Option<&str>) -> store::Result<Vec<StatusCount>> {
        let owner = owner.map(str::to_owned);
        self.call(Operation::WorkflowCounts, move |store| async move {
            store.workflow_counts(owner.as_deref()).await
        })
        .await
    }

    /// See [`Store::run_counts`].
    pub async fn run_counts(&self, owner: &str) -> store::Result<Vec<StatusCount>> {
        let owner = owner.to_owned();
        self.call(Operation::RunCounts, move |store| async move {
            store.run_counts(&owner).await
        })
        .await
    }

    /// See [`Store::list_slots`].
    pub async fn list_slots(&self, limit: u32) -> store::Result<Vec<SlotRow>> {
        self.call(Operation::ListSlots, move |store| async move {
            store.list_slots(limit).await
        })
        .await
    }

    /// See [`Store::read_snapshot`].
    pub async fn read_snapshot(
        &self,
        workflow_id: &WorkflowId,
        steps_max: u32,
        artifacts_max: u32,
    ) -> store::Result<Option<store::Snapshot>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadSnapshot, move |store| async move {
            store
                .read_snapshot(&workflow_id, steps_max, artifacts_max)
                .await
        })
        .await
    }

    /// See [`Store::read_step_page`].
    pub async fn read_step_page(
        &self,
        workflow_id: &WorkflowId,
        after: store::StepPosition,
        limit: u32,
    ) -> store::Result<store::StepPage> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadStepPage, move |store| async move {
            store.read_step_page(&workflow_id, after, limit).await
        })
        .await
    }

    /// See [`Store::read_artifact_page`].
    pub async fn read_artifact_page(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> store::Result<Vec<store::ArtifactInfo>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadArtifactPage, move |store| async move {
            store.read_artifact_page(&workflow_id, after, limit).await
        })
        .await
    }

    /// See [`Store::count_slots`].
    pub async fn count_slots(&self) -> store::Result<i64> {
        self.call(Operation::CountSlots, |store| async move {
            store.count_slots().await
        })
        .await
    }

    /// See [`Store::list_nodes`].
    pub async fn list_nodes(&self, limit: u32) -> store::Result<Vec<NodeRecord>> {
        self.call(Operation::ListNodes, move |store| async move {
            store.list_nodes(limit).await
        })
        .await
    }

    /// See [`Store::waiting_workflows`].
    pub async fn waiting_workflows(
        &self,
        user_id: Option<&str>,
        limit: u32,
    ) -> store::Result<Vec<WorkflowId>> {
        let user_id = user_id.map(str::to_owned);
        self.call(Operation::WaitingWorkflows, move |store| async move {
            store.waiting_workflows(user_id.as_deref(), limit).await
        })
        .await
    }

    /// See [`Store::create_user`].
    pub async fn create_user(&self, user: NewUser, only_if_first: bool) -> store::Result<bool> {
        self.call(Operation::CreateUser, move |store| async move {
            store.create_user(user, only_if_first).await
        })
        .await
    }

    /// See [`Store::user_by_email`].
    pub async fn user_by_email(&self, email: &str) -> store::Result<Option<UserRow>> {
        let email = email.to_owned();
        self.call(Operation::UserByEmail, move |store| async move {
            store.user_by_email(&email).await
        })
        .await
    }

    /// See [`Store::user_by_id`].
    pub async fn user_by_id(&self, user_id: &str) -> store::Result<Option<UserRow>> {
        let user_id = user_id.to_owned();
        self.call(Operation::UserById, move |store| async move {
            store.user_by_id(&user_id).await
        })
        .await
    }

    /// See [`Store::list_users`].
    pub async fn list_users(&self) -> store::Result<Vec<UserRow>> {
        self.call(Operation::ListUsers, |store| async move {
            store.list_users().await
        })
        .await
    }

    /// See [`Store::stored_bytes`].
    pub async fn stored_bytes(
        &self,
        user_id: Option<&str>,
    ) -> store::Result<Vec<store::UserStorage>> {
        let user_id = user_id.map(str::to_owned);
        self.call(Operation::StoredBytes, move |store| async move {
            store.stored_bytes(user_id.as_deref()).await
        })
        .await
    }

    /// See [`Store::change_user`].
    pub async fn change_user(
        &self,
        user_id: &str,
        change: UserChange,
    ) -> store::Result<UserChanged> {
        let user_id = user_id.to_owned();
        self.call(Operation::ChangeUser, move |store| async move {
            store.change_user(&user_id, change).await
        })
        .await
    }

    /// See [`Store::set_password`].
    pub async fn set_password(
        &self,
        user_id: &str,
        password_hash: String,
        keep_session: Option<&str>,
    ) -> store::Result<bool> {
        let user_id = user_id.to_owned();
        let keep_session = keep_session.map(str::to_owned);
        self.call(Operation::SetPassword, move |store| async move {
            store
                .set_password(&user_id, &password_hash, keep_session.as_deref())
                .await
        })
        .await
    }

    /// See [`Store::end_sessions`].
    pub async fn end_sessions(
        &self,
        user_id: &str,
        keep_session: Option<&str>,
    ) -> store::Result<bool> {
        let user_id = user_id.to_owned();
        let keep_session = keep_session.map(str::to_owned);
        self.call(Operation::EndSessions, move |store| async move {
            store.end_sessions(&user_id, keep_session.as_deref()).await
        })
        .await
    }

    /// See [`Store::delete_user`].
    pub async fn delete_user(&self, user_id: &str) -> store::Result<UserDeletion> {
        let user_id = user_id.to_owned();
        self.call(Operation::DeleteUser, move |store| async move {
            store.delete_user(&user_id).await
        })
        .await
    }

    /// See [`Store::open_session`].
    pub async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
        sessions_max: u32,
    ) -> store::Result<()> {
        let (session_id, user_id) = (session_id.to_owned(), user_id.to_owned());
        self.call(Operation::OpenSession, move |store| async move {
            store
                .open_session(&session_id, &user_id, session_seconds, sessions_max)
                .await
        })
        .await
    }

    /// See [`Store::session_user`].
    pub async fn session_user(&self, session_id: &str) -> store::Result<Option<UserRow>> {
        let session_id = session_id.to_owned();
        self.call(Operation::SessionUser, move |store| async move {
            store.session_user(&session_id).await
        })
        .await
    }

    /// See [`Store::revoke_session`].
    pub async fn revoke_session(&self, session_id: &str) -> store::Result<bool> {
        let session_id = session_id.to_owned();
        self.call(Operation::RevokeSession, move |store| async move {
            store.revoke_session(&session_id).await
        })
        .await
    }

    /// See [`Store::create_token`].
    pub async fn create_token(&self, token: NewToken) -> store::Result<TokenRow> {
        self.call(Operation::CreateToken, move |store| async move {
            store.create_token(token).await
        })
        .await
    }

    /// See [`Store::expired_token`].
    pub async fn expired_token(&self, token_id: &str) -> store::Result<Option<TokenRow>> {
        let token_id = token_id.to_owned();
        self.call(Operation::ExpiredToken, move |store| async move {
            store.expired_token(&token_id).await
        })
        .await
    }

    /// See [`Store::token_user`].
    pub async fn token_user(&self, token_id: &str) -> store::Result<Option<(TokenRow, UserRow)>> {
        let token_id = token_id.to_owned();
        self.call(Operation::TokenUser, move |store| async move {
            store.token_user(&token_id).await
        })
        .await
    }

    /// See [`Store::list_tokens`].
    pub async fn list_tokens(&self, user_id: &str) -> store::Result<Vec<TokenRow>> {
        let user_id = user_id.to_owned();
        self.call(Operation::ListTokens, move |store| async move {
            store.list_tokens(&user_id).await
        })
        .await
    }

    /// See [`Store::revoke_token`].
    pub async fn revoke_token(&self, user_id: &str, token_id: &str) -> store::Result<bool> {
        let (user_id, token_id) = (user_id.to_owned(), token_id.to_owned());
        self.call(Operation::RevokeToken, move |store| async move {
            store.revoke_token(&user_id, &token_id).await
        })
        .await
    }

    /// See [`Store::list_workflows`].
    pub async fn list_workflows(
        &self,
        filter: store::ListFilter,
    ) -> store::Result<Vec<store::ListedWorkflow>> {
        self.call(Operation::ListWorkflows, move |store| async move {
            store.list_workflows(filter).await
        })
        .await
    }

    /// See [`Store::read_artifact`].
    pub async fn read_artifact(
        &self,
        workflow_id: &WorkflowId,
        version: i64,
    ) -> store::Result<Option<ArtifactRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadArtifact, move |store| async move {
            store.read_artifact(&workflow_id, version).await
        })
        .await
    }

    /// See [`Store::last_artifact_version`].
    pub async fn last_artifact_version(&self, workflow_id: &WorkflowId) -> store::Result<i64> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::LastArtifactVersion, move |store| async move {
            store.last_artifact_version(&workflow_id).await
        })
        .await
    }

    /// See [`Store::put_control`].
    pub async fn put_control(&self, control: NewControl) -> store::Result<ControlWrite> {
        let workflow_id = control.workflow_id.clone();
        let written = self
            .call(Operation::PutControl, move |store| async move {
                store.put_control(control).await
            })
            .await;
        self.wake(&workflow_id, false, &written);
        written
    }

    /// See [`Store::read_controls`].
    pub async fn read_controls(&self, workflow_id: &WorkflowId) -> store::Result<Vec<ControlRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::ReadControls, move |store| async move {
            store.read_controls(&workflow_id).await
        })
        .await
    }

    /// See [`Store::send_event`].
    pub async fn send_event(&self, event: store::NewSentEvent) -> store::Result<store::EventSend> {
        let workflow_id = event.workflow_id.clone();
        let written = self
            .call(Operation::SendEvent, move |store| async move {
                store.send_event(event).await
            })
            .await;
        self.wake(&workflow_id, false, &written);
        written
    }

    /// See [`Store::pending_events`].
    pub async fn pending_events(
        &self,
        workflow_id: &WorkflowId,
        names: Vec<String>,
        per_name: u32,
    ) -> store::Result<Vec<store::SentEvent>> {
        let workflow_id = workflow_id.to_owned();
        self.call(Operation::PendingEvents, move |store| async move {
            store.pending_events(&workflow_id, names, per_name).await
        })
        .await
    }

    /// See [`Store::admit_run`].
    pub async fn admit_run(&self, run: NewRun) -> store::Result<Admission> {
        let step = run.step.as_ref().map(|step| {
            (
                step.workflow_id.clone(),
                step.journal.iter().any(changes_status),
            )
        });
        let admitted = self
            .call(Operation::AdmitRun, move |store| async move {
                store.admit_run(run).await
            })
            .await;
        if let Some((workflow_id, status_changed)) = step {
            self.wake(&workflow_id, status_changed, &admitted);
        }
        admitted
    }

    /// See [`Store::read_run`].
    pub async fn read_run(&self, run_id: &RunId) -> store::Result<Option<RunRow>> {
        let run_id = run_id.to_owned();
        self.call(Operation::ReadRun, move |store| async move {
            store.read_run(&run_id).await
        })
        .await
    }

    /// See [`Store::renew_run_lease`].
    pub async fn renew_run_lease(
        &self,
        run_id: &RunId,
        owner: &str,
        lease_ms: u64,
    ) -> store::Result<Result<RunRenewal, Option<RunRow>>> {
        let key = run_id.as_str();
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.call_about(
            Operation::RenewRunLease,
            Some(key),
            move |store| async move { store.renew_run_lease(&run_id, &owner, lease_ms).await },
        )
        .await
    }

    /// See [`Store::request_run_cancel`].
    pub async fn request_run_cancel(
        &self,
        run_id: &RunId,
        action: CancelAction,
    ) -> store::Result<Option<CancelAction>> {
        let key = run_id.as_str();
        let run_id = run_id.to_owned();
        self.call_about(
            Operation::RequestRunCancel,
            Some(key),
            move |store| async move { store.request_run_cancel(&run_id, action).await },
        )
        .await
    }

    /// See [`Store::update_run_status`].
    pub async fn update_run_status(
        &self,
        run_id: &RunId,
        owner: &str,
        status: RunStatus,
        metadata: Option<serde_json::Value>,
    ) -> store::Result<bool> {
        let key = run_id.as_str();
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.call_about(
            Operation::UpdateRunStatus,
            Some(key),
            move |store| async move {
                store
                    .update_run_status(&run_id, &owner, status, metadata)
                    .await
            },
        )
        .await
    }

    /// See [`Store::claim_run_slot`].
    pub async fn claim_run_slot(
        &self,
        run_id: &RunId,
        owner: &str,
        slots_max: u64,
        slots_per_user_max: u64,
        slots_reserved: u64,
    ) -> store::Result<store::RunSlot> {
        let key = run_id.as_str();
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.call_about(
            Operation::ClaimRunSlot,
            Some(key),
            move |store| async move {
                store
                    .claim_run_slot(
                        &run_id,
                        &owner,
                        slots_max,
                        slots_per_user_max,
                        slots_reserved,
                    )
                    .await
            },
        )
        .await
    }

    /// See [`Store::finalize_run`].
    pub async fn finalize_run(
        &self,
        run_id: &RunId,
        owner: &str,
        outcome: &RunOutcome,
        require_not_cancelled: bool,
    ) -> store::Result<bool> {
        let key = run_id.as_str();
        let (run_id, owner, outcome) = (run_id.to_owned(), owner.to_owned(), outcome.clone());
        self.call_about(Operation::FinalizeRun, Some(key), move |store| async move {
            store
                .finalize_run(&run_id, &owner, &outcome, require_not_cancelled)
                .await
        })
        .await
    }

    /// See [`Store::answer_approval`].
    pub async fn answer_approval(
        &self,
        thread_id: &str,
        request_ids: &[String],
        answer: &serde_json::Value,
    ) -> store::Result<Option<ApprovalAnswer>> {
        let (thread_id, request_ids, answer) =
            (thread_id.to_owned(), request_ids.to_vec(), answer.clone());
        self.call(Operation::AnswerApproval, move |store| async move {
            store
                .answer_approval(&thread_id, &request_ids, &answer)
                .await
        })
        .await
    }

    /// See [`Store::restore_approval`].
    pub async fn restore_approval(&self, answer: &ApprovalAnswer) -> store::Result<bool> {
        let answer = answer.clone();
        self.call(Operation::RestoreApproval, move |store| async move {
            store.restore_approval(&answer).await
        })
        .await
    }

    /// See [`Store::claim_orphan_runs`].
    pub async fn claim_orphan_runs(&self, claimer: &str, limit: u32) -> store::Result<Vec<RunId>> {
        let claimer = claimer.to_owned();
        self.call(Operation::ClaimOrphanRuns, move |store| async move {
            store.claim_orphan_runs(&claimer, limit).await
        })
        .await
    }

    /// See [`Store::expired_approvals`].
    pub async fn expired_approvals(
        &self,
        limit: u32,
    ) -> store::Result<Vec<store::ExpiredApproval>> {
        self.call(Operation::ExpiredApprovals, move |store| async move {
            store.expired_approvals(limit).await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use store::{DatabaseUrl, StoreOptions};

    use super::*;

    /// A store actor on a fresh SQLite database, and a handle to it with `faults`.
    async fn handle(dir: &tempfile::TempDir, faults: StoreFaults) -> (StoreHandle, Arc<Metrics>) {
        let url = DatabaseUrl::Sqlite(dir.path().join("reins.db"));
        let store = Store::open(&url, &StoreOptions::default())
            .await
            .expect("open");
        store.migrate().await.expect("migrate");
        let metrics = Arc::new(Metrics::default());
        let args = StoreArgs {
            store: Arc::new(store),
            requests_max: 2,
            metrics: Arc::clone(&metrics),
        };
        let (actor, _) = Actor::spawn(None, StoreActor, args).await.expect("spawn");
        // A call that waits for something that never comes fails at this; an answer on a busy
        // machine comes well before.
        let timeout = Duration::from_secs(30);
        let handle = StoreHandle::new(actor, timeout, Some(faults), Arc::clone(&metrics));
        (handle, metrics)
    }

    /// Issue 29, item 5: reads that take every read permit, and more that wait behind them, never
    /// hold up a write: it has permits of its own and is not queued behind a waiting read.
    #[tokio::test]
    async fn a_write_never_waits_behind_reads_that_fill_the_store() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (handle, _) = handle(&dir, StoreFaults::default()).await;
        let release = Arc::new(tokio::sync::Notify::new());
        // Twice the read permits (2): two run and hold, two wait for a permit.
        for _ in 0..4 {
            let release = Arc::clone(&release);
            let job: Job =
                Box::new(move |_store| Box::pin(async move { release.notified().await }));
            crate::mailbox::Post::post(&handle.actor, StoreMsg { writes: false, job })
                .expect("send");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let launched = handle
            .launch_workflow(workflow("w"), "node", 60_000, LaunchLimits::NONE)
            .await;
        assert!(launched.is_ok(), "{launched:?}");
        release.notify_waiters();
    }

    fn workflow(id: &str) -> NewWorkflow {
        NewWorkflow {
            workflow_id: WorkflowId::new(id),
            user_id: "u".into(),
            request_id: None,
            fingerprint: "fp".into(),
            data: json!({}),
        }
    }

    fn done(id: &str) -> WriteOp {
        WriteOp::SetWorkflow {
            workflow_id: WorkflowId::new(id),
            status: store::WorkflowStatus::Completed,
            data: json!({}),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_request_is_a_job_that_answers_its_caller_and_leaves_the_gauges_at_rest() {
        let dir = tempfile::tempdir().expect("dir");
        let (store, metrics) = handle(&dir, StoreFaults::default()).await;
        let calls: Vec<_> = (0..8)
            .map(|n| {
                let store = store.clone();
                tokio::spawn(async move {
                    let id = format!("wf-{n}");
                    store
                        .launch_workflow(workflow(&id), "node", 60_000, LaunchLimits::NONE)
                        .await
                })
            })
            .collect();
        for call in calls {
            let launched = call.await.expect("join").expect("launch");
            assert!(matches!(launched, Launch::Created { .. }), "{launched:?}");
        }
        let row = store
            .read_workflow(&WorkflowId::from("wf-7"))
            .await
            .expect("read")
            .expect("row");
        assert_eq!(row.status, store::WorkflowStatus::Running);
        assert_eq!(
            store.health().await.expect("health").schema_version,
            store::SCHEMA_VERSION
        );
        // A job's task counts itself out just after it answered.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let at_rest = || {
            metrics.store_requests_waiting.load(Ordering::Relaxed) == 0
                && metrics.store_requests_running.load(Ordering::Relaxed) == 0
        };
        while !at_rest() {
            assert!(
                std::time::Instant::now() < deadline,
                "the gauges never came back to 0"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn faults_take_the_calls_of_their_operation_and_run_only_as_often_as_asked() {
        let dir = tempfile::tempdir().expect("dir");
        let faults = StoreFaults::default();
        let (store, _) = handle(&dir, faults.clone()).await;
        let Launch::Created { lease, .. } = store
            .launch_workflow(workflow("wf"), "node", 60_000, LaunchLimits::NONE)
            .await
            .expect("launch")
        else {
            panic!("not created");
        };
        faults.add("fenced_write", FaultAction::DropAnswer, 1);
        faults.add(
            "read_workflow",
            FaultAction::Fail(store::Error::Unavailable("refused".into())),
            1,
        );
        // The lost answer: the write committed, the caller cannot know.
        let lost = store.fenced_write(&lease.fence(), vec![done("wf")]).await;
        assert!(
            matches!(lost, Err(store::Error::OutcomeUnknown(_))),
            "{lost:?}"
        );
        let failed = store.read_workflow(&WorkflowId::from("wf")).await;
        assert!(
            matches!(failed, Err(store::Error::Unavailable(_))),
            "{failed:?}"
        );
        let row = store
            .read_workflow(&WorkflowId::from("wf"))
            .await
            .expect("read")
            .expect("row");
        assert_eq!(
            row.status,
            store::WorkflowStatus::Completed,
            "the write whose answer was lost committed"
        );
        store
            .fenced_write(&lease.fence(), vec![done("wf")])
            .await
            .expect("a rule runs only as often as asked");
    }

    #[test]
    #[should_panic(expected = "no store operation is named \"fenced_writes\"")]
    fn a_fault_for_no_operation_is_refused_when_it_is_added() {
        StoreFaults::default().add("fenced_writes", FaultAction::DropAnswer, 1);
    }
}
