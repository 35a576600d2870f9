//! The store actor: the front door to the database for every actor. It never runs a query in its
//! own handler: each request is a job over the store ([`StoreMsg`]) that becomes a task bounded by
//! a semaphore (`store_requests_max` in flight), so independent requests proceed in parallel on the
//! store's pool and a slow query never holds up the mailbox. Reads and writes have a semaphore
//! each: however many reads wait (a flood of `get`s of a large record), a write never waits
//! behind them for its turn. There is one message for every
//! operation: a job calls the store's typed method and answers its own caller. [`StoreHandle`]
//! is the typed API the actors use, its methods made from the store's list of operations (see
//! `handle_methods!`) but for those that do more than call; each names its [`Operation`] (test
//! faults and whether an unanswered call may have written come from it) and the call it makes. A job runs
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
    Admission, Backend, ControlWrite, Fence, Launch, LaunchLimits, NewControl, NewRun, NewWorkflow,
    Operation, Store, TakeOver, WorkflowId, WriteOp,
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

    /// See [`Store::fenced_write`].
    pub async fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> store::Result<()> {
        // Not generated: it wakes the workflow's event streams and counts latency and refusals.
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

    /// See [`Store::launch_workflow`].
    pub async fn launch_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> store::Result<Launch> {
        // Not generated: it wakes the new workflow's event streams.
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
        // Not generated: it wakes the new workflow's event streams.
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
        // Not generated: it wakes the workflow's event streams.
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

    /// See [`Store::put_control`].
    pub async fn put_control(&self, control: NewControl) -> store::Result<ControlWrite> {
        // Not generated: it wakes the workflow's event streams.
        let workflow_id = control.workflow_id.clone();
        let written = self
            .call(Operation::PutControl, move |store| async move {
                store.put_control(control).await
            })
            .await;
        self.wake(&workflow_id, false, &written);
        written
    }

    /// See [`Store::send_event`].
    pub async fn send_event(&self, event: store::NewSentEvent) -> store::Result<store::EventSend> {
        // Not generated: it wakes the workflow's event streams.
        let workflow_id = event.workflow_id.clone();
        let written = self
            .call(Operation::SendEvent, move |store| async move {
                store.send_event(event).await
            })
            .await;
        self.wake(&workflow_id, false, &written);
        written
    }

    /// See [`Store::admit_run`].
    pub async fn admit_run(&self, run: NewRun) -> store::Result<Admission> {
        // Not generated: it wakes the event streams of the step's workflow.
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
}

/// The handle's method of every operation in the store's list (`store::with_operations!`), but
/// those written out in `impl StoreHandle` above and those that are not the handle's: each as
/// `Store`'s method of the same name takes it, its borrowed arguments carried to the job owned
/// (see [`Carry`]).
macro_rules! handle_methods {
    ($(
        $(#[$trait_doc:meta])*
        trait $trait:ident {
            $(
                $(#[$doc:meta])*
                $effect:ident $variant:ident:
                fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty
                $(=> |$store:ident| $call:expr)?;
            )*
        }
    )*) => {
        impl StoreHandle {
            $($(
                handle_method!($effect $variant $name ($($arg: $ty),*) -> $ret);
            )*)*
        }
    };
}

/// One operation's method of [`StoreHandle`], or none.
macro_rules! handle_method {
    // Written out above: they also wake event streams (and `fenced_write` counts its latency
    // and refusals).
    ($effect:ident FencedWrite $($rest:tt)*) => {};
    ($effect:ident LaunchWorkflow $($rest:tt)*) => {};
    ($effect:ident RetryWorkflow $($rest:tt)*) => {};
    ($effect:ident TakeOverWorkflow $($rest:tt)*) => {};
    ($effect:ident PutControl $($rest:tt)*) => {};
    ($effect:ident SendEvent $($rest:tt)*) => {};
    ($effect:ident AdmitRun $($rest:tt)*) => {};
    // Not the handle's: a node migrates before its store actor starts, and `health` makes the
    // probes.
    ($effect:ident Migrate $($rest:tt)*) => {};
    ($effect:ident SchemaVersion $($rest:tt)*) => {};
    ($effect:ident WriteProbe $($rest:tt)*) => {};
    ($effect:ident $variant:ident $name:ident ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[doc = concat!("See [`Store::", stringify!($name), "`].")]
        pub async fn $name(&self $(, $arg: $ty)*) -> store::Result<$ret> {
            let key = fault_key!($effect $($arg $arg)*);
            $(let $arg = Carry::carry($arg);)*
            self.call_about(Operation::$variant, key, move |store| async move {
                store.$name($($arg.lend()),*).await
            })
            .await
        }
    };
}

/// What a test fault can single out a call by: a write about one run (its first argument
/// `run_id`) by the run's id; any other call by nothing.
macro_rules! fault_key {
    (write run_id $run_id:ident $($rest:ident)*) => {
        Some($run_id.as_str())
    };
    ($effect:ident $($arg:ident)*) => {
        None
    };
}

/// An argument of a [`StoreHandle`] method, as the job that runs it on the store actor's task
/// carries it: that task outlives the caller's borrows, so a borrowed argument travels owned (its
/// one copy per call), anything else as it is.
trait Carry {
    type Owned: Send + 'static;
    fn carry(self) -> Self::Owned;
}

/// A carried argument handed to the store's method as that method takes it: an owned form lent
/// by reference (method-call autoref picks the `&Owned` implementation), anything else moved.
trait Lend {
    type Arg;
    fn lend(self) -> Self::Arg;
}

/// Arguments taken by value: carried and handed over as they are.
macro_rules! moved {
    ($($ty:ty),* $(,)?) => {$(
        impl Carry for $ty {
            type Owned = $ty;
            fn carry(self) -> $ty {
                self
            }
        }

        impl Lend for $ty {
            type Arg = $ty;
            fn lend(self) -> $ty {
                self
            }
        }
    )*};
}

/// Arguments borrowed as `&T`: carried as a clone of `T`, lent as `&T`.
macro_rules! cloned {
    ($($ty:ty),* $(,)?) => {$(
        impl Carry for &$ty {
            type Owned = $ty;
            fn carry(self) -> $ty {
                self.clone()
            }
        }

        impl<'a> Lend for &'a $ty {
            type Arg = &'a $ty;
            fn lend(self) -> &'a $ty {
                self
            }
        }
    )*};
}

mod carried {
    use serde_json::Value;
    use store::{ApprovalAnswer, Fence, NodeRecord, RunId, RunOutcome, Versions, WorkflowId};
    use store::{
        CancelAction, LaunchLimits, ListFilter, NewControl, NewRetry, NewRun, NewSentEvent,
        NewToken, NewUser, NewWorkflow, Purpose, RunStatus, Settlement, StepPosition, UserChange,
        WriteOp,
    };

    use super::{Carry, Lend};

    moved!(
        bool,
        u32,
        u64,
        i64,
        CancelAction,
        LaunchLimits,
        ListFilter,
        NewControl,
        NewRetry,
        NewRun,
        NewSentEvent,
        NewToken,
        NewUser,
        NewWorkflow,
        Option<Value>,
        Purpose,
        RunStatus,
        Settlement,
        StepPosition,
        UserChange,
        Vec<String>,
        Vec<WriteOp>,
    );
    cloned!(
        ApprovalAnswer,
        Fence,
        NodeRecord,
        RunId,
        RunOutcome,
        Value,
        Versions,
        WorkflowId
    );

    impl Carry for &str {
        type Owned = String;
        fn carry(self) -> String {
            self.to_owned()
        }
    }

    impl<'a> Lend for &'a String {
        type Arg = &'a str;
        fn lend(self) -> &'a str {
            self
        }
    }

    impl Carry for Option<&str> {
        type Owned = Option<String>;
        fn carry(self) -> Option<String> {
            self.map(str::to_owned)
        }
    }

    impl<'a> Lend for &'a Option<String> {
        type Arg = Option<&'a str>;
        fn lend(self) -> Option<&'a str> {
            self.as_deref()
        }
    }

    // A `Box`, not a `Vec`: a `Vec<String>` argument is one taken by value.
    impl Carry for &[String] {
        type Owned = Box<[String]>;
        fn carry(self) -> Box<[String]> {
            self.into()
        }
    }

    impl<'a> Lend for &'a Box<[String]> {
        type Arg = &'a [String];
        fn lend(self) -> &'a [String] {
            self
        }
    }

    impl Carry for &std::path::Path {
        type Owned = std::path::PathBuf;
        fn carry(self) -> std::path::PathBuf {
            self.to_path_buf()
        }
    }

    impl<'a> Lend for &'a std::path::PathBuf {
        type Arg = &'a std::path::Path;
        fn lend(self) -> &'a std::path::Path {
            self
        }
    }
}

/// The generated methods, where the list's names for the store's types are in scope.
mod generated {
    use serde_json::Value;
    use store::*;

    use super::{Carry, Lend, StoreHandle};

    store::with_operations!(handle_methods);
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
