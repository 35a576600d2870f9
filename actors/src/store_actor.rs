//! The store actor: the front door to the database for every actor. It never runs a query in its
//! own handler: each request becomes a task bounded by a semaphore (`store_requests_max` in
//! flight), so independent requests proceed in parallel on the store's pool and a slow query never
//! holds up the mailbox.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::Serialize;
use store::{
    Admission, ApprovalAnswer, ArtifactRow, Backend, CancelAction, ControlRow, ControlWrite,
    EventPage, EventRow, Fence, Launch, LaunchLimits, Lease, NewControl, NewRun, NewToken, NewUser,
    NewWorkflow, NodeRecord, RunOutcome, RunRenewal, RunRow, RunStatus, SlotRow, StatusCount,
    StepRow, Store, TakeOver, TokenRow, UserChange, UserChanged, UserDeletion, UserRow,
    WorkflowRow, WriteOp,
};

use crate::events::EventWakes;
use crate::faults::{FaultAction, StoreFaults};
use crate::metrics::Metrics;
use tokio::sync::Semaphore;

/// Requests the store actor serves, each with its reply port.
pub enum StoreMsg {
    /// Users, sessions and API tokens (the control plane's identities).
    Users(UsersRequest),
    /// Counts and lists for operators and metrics.
    Operators(OperatorsRequest),
    /// Workflow events and the feed.
    Events(EventsRequest),
    AcquireLease {
        resource_id: String,
        owner: String,
        lease_ms: u64,
        reply: RpcReplyPort<store::Result<Option<Lease>>>,
    },
    RenewLease {
        fence: Fence,
        lease_ms: u64,
        reply: RpcReplyPort<store::Result<(Lease, f64)>>,
    },
    ReleaseLease {
        fence: Fence,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    ReadLease {
        resource_id: String,
        reply: RpcReplyPort<store::Result<Option<Lease>>>,
    },
    CreateWorkflow {
        workflow: NewWorkflow,
        owner: String,
        lease_ms: u64,
        reply: RpcReplyPort<store::Result<Lease>>,
    },
    FencedWrite {
        fence: Fence,
        ops: Vec<WriteOp>,
        reply: RpcReplyPort<store::Result<()>>,
    },
    ReadWorkflow {
        workflow_id: String,
        reply: RpcReplyPort<store::Result<Option<WorkflowRow>>>,
    },
    ReadSteps {
        workflow_id: String,
        reply: RpcReplyPort<store::Result<Vec<StepRow>>>,
    },
    Health {
        reply: RpcReplyPort<store::Result<StoreHealth>>,
    },
    WriteProbe {
        reply: RpcReplyPort<store::Result<()>>,
    },
    Now {
        reply: RpcReplyPort<store::Result<f64>>,
    },
    RegisterNode {
        node: NodeRecord,
        reply: RpcReplyPort<store::Result<()>>,
    },
    MarkNodeStopped {
        worker_id: String,
        reply: RpcReplyPort<store::Result<()>>,
    },
    LaunchWorkflow {
        workflow: NewWorkflow,
        owner: String,
        lease_ms: u64,
        limits: LaunchLimits,
        reply: RpcReplyPort<store::Result<Launch>>,
    },
    TakeOverWorkflow {
        workflow_id: String,
        owner: String,
        lease_ms: u64,
        versions: store::Versions,
        purpose: store::Purpose,
        reply: RpcReplyPort<store::Result<TakeOver>>,
    },
    RecoverableWorkflows {
        limit: u32,
        versions: store::Versions,
        reply: RpcReplyPort<store::Result<Vec<store::Orphaned>>>,
    },
    PendingControls {
        owner: String,
        reply: RpcReplyPort<store::Result<Vec<String>>>,
    },
    DeleteWorkflow {
        workflow_id: String,
        reply: RpcReplyPort<store::Result<store::Deletion>>,
    },
    ListWorkflows {
        filter: store::ListFilter,
        reply: RpcReplyPort<store::Result<Vec<store::ListedWorkflow>>>,
    },
    ReadArtifact {
        workflow_id: String,
        version: i64,
        reply: RpcReplyPort<store::Result<Option<ArtifactRow>>>,
    },
    LastArtifactVersion {
        workflow_id: String,
        reply: RpcReplyPort<store::Result<i64>>,
    },
    PutControl {
        control: NewControl,
        reply: RpcReplyPort<store::Result<ControlWrite>>,
    },
    ReadControls {
        workflow_id: String,
        reply: RpcReplyPort<store::Result<Vec<ControlRow>>>,
    },
    AdmitRun {
        run: NewRun,
        reply: RpcReplyPort<store::Result<Admission>>,
    },
    ReadRun {
        run_id: String,
        reply: RpcReplyPort<store::Result<Option<RunRow>>>,
    },
    RenewRunLease {
        run_id: String,
        owner: String,
        lease_ms: u64,
        reply: RpcReplyPort<store::Result<Result<RunRenewal, Option<RunRow>>>>,
    },
    RequestRunCancel {
        run_id: String,
        action: CancelAction,
        reply: RpcReplyPort<store::Result<Option<CancelAction>>>,
    },
    UpdateRunStatus {
        run_id: String,
        owner: String,
        status: RunStatus,
        metadata: Option<serde_json::Value>,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    FinalizeRun {
        run_id: String,
        owner: String,
        outcome: RunOutcome,
        require_not_cancelled: bool,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    AnswerApproval {
        thread_id: String,
        request_ids: Vec<String>,
        answer: serde_json::Value,
        reply: RpcReplyPort<store::Result<Option<ApprovalAnswer>>>,
    },
    RestoreApproval {
        answer: ApprovalAnswer,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    ClaimOrphanRuns {
        claimer: String,
        limit: u32,
        reply: RpcReplyPort<store::Result<Vec<String>>>,
    },
}

/// What readiness needs to know about the database.
#[derive(Debug, Clone, Serialize)]
pub struct StoreHealth {
    pub backend: Backend,
    pub schema_version: i64,
    pub schema_current: bool,
    /// Connections in the PostgreSQL pool and how many are idle.
    pub pool: Option<(usize, usize)>,
    /// A write failed for a full disk and no write has succeeded since.
    pub disk_full: bool,
}

pub(crate) struct StoreActor;

pub(crate) struct StoreState {
    store: Arc<Store>,
    in_flight: Arc<Semaphore>,
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
            in_flight: Arc::new(Semaphore::new(args.requests_max.max(1))),
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
        message: StoreMsg,
        state: &mut StoreState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        // Waiting for a permit here is the back-pressure: the mailbox holds what cannot run yet.
        let permit = Arc::clone(&state.in_flight).acquire_owned().await?;
        let store = Arc::clone(&state.store);
        let metrics = Arc::clone(&state.metrics);
        metrics
            .store_requests_waiting
            .fetch_sub(1, Ordering::Relaxed);
        metrics
            .store_requests_running
            .fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            serve(&store, message).await;
            metrics
                .store_requests_running
                .fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
        Ok(())
    }
}

/// Runs one request against the store and answers it. A caller that gave up has dropped its port;
/// its answer is then discarded.
async fn serve(store: &Store, message: StoreMsg) {
    match message {
        StoreMsg::Users(request) => serve_users(store, request).await,
        StoreMsg::Operators(request) => serve_operators(store, request).await,
        StoreMsg::Events(request) => serve_events(store, request).await,
        StoreMsg::AcquireLease {
            resource_id,
            owner,
            lease_ms,
            reply,
        } => {
            let _ = reply.send(store.acquire_lease(&resource_id, &owner, lease_ms).await);
        }
        StoreMsg::RenewLease {
            fence,
            lease_ms,
            reply,
        } => {
            let _ = reply.send(store.renew_lease(&fence, lease_ms).await);
        }
        StoreMsg::ReleaseLease { fence, reply } => {
            let _ = reply.send(store.release_lease(&fence).await);
        }
        StoreMsg::ReadLease { resource_id, reply } => {
            let _ = reply.send(store.read_lease(&resource_id).await);
        }
        StoreMsg::CreateWorkflow {
            workflow,
            owner,
            lease_ms,
            reply,
        } => {
            let _ = reply.send(store.create_workflow(workflow, &owner, lease_ms).await);
        }
        StoreMsg::FencedWrite { fence, ops, reply } => {
            let _ = reply.send(store.fenced_write(&fence, ops).await);
        }
        StoreMsg::ReadWorkflow { workflow_id, reply } => {
            let _ = reply.send(store.read_workflow(&workflow_id).await);
        }
        StoreMsg::ReadSteps { workflow_id, reply } => {
            let _ = reply.send(store.read_steps(&workflow_id).await);
        }
        StoreMsg::Health { reply } => {
            let health = store
                .schema_version()
                .await
                .map(|schema_version| StoreHealth {
                    backend: store.backend(),
                    schema_version,
                    schema_current: schema_version == store::SCHEMA_VERSION,
                    pool: store.pool_status(),
                    disk_full: false,
                });
            let _ = reply.send(health);
        }
        StoreMsg::WriteProbe { reply } => {
            let _ = reply.send(store.write_probe().await);
        }
        StoreMsg::Now { reply } => {
            let _ = reply.send(store.now().await);
        }
        StoreMsg::RegisterNode { node, reply } => {
            let _ = reply.send(store.register_node(&node).await);
        }
        StoreMsg::MarkNodeStopped { worker_id, reply } => {
            let _ = reply.send(store.mark_node_stopped(&worker_id).await);
        }
        StoreMsg::LaunchWorkflow {
            workflow,
            owner,
            lease_ms,
            limits,
            reply,
        } => {
            let _ = reply.send(
                store
                    .launch_workflow(workflow, &owner, lease_ms, limits)
                    .await,
            );
        }
        StoreMsg::TakeOverWorkflow {
            workflow_id,
            owner,
            lease_ms,
            versions,
            purpose,
            reply,
        } => {
            let _ = reply.send(
                store
                    .take_over_workflow(&workflow_id, &owner, lease_ms, &versions, purpose)
                    .await,
            );
        }
        StoreMsg::RecoverableWorkflows {
            limit,
            versions,
            reply,
        } => {
            let _ = reply.send(store.recoverable_workflows(limit, &versions).await);
        }
        StoreMsg::PendingControls { owner, reply } => {
            let _ = reply.send(store.workflows_with_pending_controls(&owner).await);
        }
        StoreMsg::DeleteWorkflow { workflow_id, reply } => {
            let _ = reply.send(store.delete_workflow(&workflow_id).await);
        }
        StoreMsg::ListWorkflows { filter, reply } => {
            let _ = reply.send(store.list_workflows(filter).await);
        }
        StoreMsg::ReadArtifact {
            workflow_id,
            version,
            reply,
        } => {
            let _ = reply.send(store.read_artifact(&workflow_id, version).await);
        }
        StoreMsg::LastArtifactVersion { workflow_id, reply } => {
            let _ = reply.send(store.last_artifact_version(&workflow_id).await);
        }
        StoreMsg::PutControl { control, reply } => {
            let _ = reply.send(store.put_control(control).await);
        }
        StoreMsg::ReadControls { workflow_id, reply } => {
            let _ = reply.send(store.read_controls(&workflow_id).await);
        }
        StoreMsg::AdmitRun { run, reply } => {
            let _ = reply.send(store.admit_run(run).await);
        }
        StoreMsg::ReadRun { run_id, reply } => {
            let _ = reply.send(store.read_run(&run_id).await);
        }
        StoreMsg::RenewRunLease {
            run_id,
            owner,
            lease_ms,
            reply,
        } => {
            let _ = reply.send(store.renew_run_lease(&run_id, &owner, lease_ms).await);
        }
        StoreMsg::RequestRunCancel {
            run_id,
            action,
            reply,
        } => {
            let _ = reply.send(store.request_run_cancel(&run_id, action).await);
        }
        StoreMsg::UpdateRunStatus {
            run_id,
            owner,
            status,
            metadata,
            reply,
        } => {
            let _ = reply.send(
                store
                    .update_run_status(&run_id, &owner, status, metadata)
                    .await,
            );
        }
        StoreMsg::FinalizeRun {
            run_id,
            owner,
            outcome,
            require_not_cancelled,
            reply,
        } => {
            let _ = reply.send(
                store
                    .finalize_run(&run_id, &owner, &outcome, require_not_cancelled)
                    .await,
            );
        }
        StoreMsg::AnswerApproval {
            thread_id,
            request_ids,
            answer,
            reply,
        } => {
            let _ = reply.send(
                store
                    .answer_approval(&thread_id, &request_ids, &answer)
                    .await,
            );
        }
        StoreMsg::RestoreApproval { answer, reply } => {
            let _ = reply.send(store.restore_approval(&answer).await);
        }
        StoreMsg::ClaimOrphanRuns {
            claimer,
            limit,
            reply,
        } => {
            let _ = reply.send(store.claim_orphan_runs(&claimer, limit).await);
        }
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

/// Reads for operators, metrics and the API's views, each with its reply port.
pub enum OperatorsRequest {
    WorkflowCounts {
        owner: Option<String>,
        reply: RpcReplyPort<store::Result<Vec<StatusCount>>>,
    },
    RunCounts {
        owner: String,
        reply: RpcReplyPort<store::Result<Vec<StatusCount>>>,
    },
    ListSlots {
        limit: u32,
        reply: RpcReplyPort<store::Result<Vec<SlotRow>>>,
    },
    Snapshot {
        workflow_id: String,
        reply: RpcReplyPort<store::Result<Option<store::Snapshot>>>,
    },
    CountSlots {
        reply: RpcReplyPort<store::Result<i64>>,
    },
    ListNodes {
        limit: u32,
        reply: RpcReplyPort<store::Result<Vec<NodeRecord>>>,
    },
    WaitingWorkflows {
        user_id: Option<String>,
        limit: u32,
        reply: RpcReplyPort<store::Result<Vec<String>>>,
    },
}

async fn serve_operators(store: &Store, request: OperatorsRequest) {
    match request {
        OperatorsRequest::WorkflowCounts { owner, reply } => {
            let _ = reply.send(store.workflow_counts(owner.as_deref()).await);
        }
        OperatorsRequest::RunCounts { owner, reply } => {
            let _ = reply.send(store.run_counts(&owner).await);
        }
        OperatorsRequest::ListSlots { limit, reply } => {
            let _ = reply.send(store.list_slots(limit).await);
        }
        OperatorsRequest::Snapshot { workflow_id, reply } => {
            let _ = reply.send(store.read_snapshot(&workflow_id).await);
        }
        OperatorsRequest::CountSlots { reply } => {
            let _ = reply.send(store.count_slots().await);
        }
        OperatorsRequest::ListNodes { limit, reply } => {
            let _ = reply.send(store.list_nodes(limit).await);
        }
        OperatorsRequest::WaitingWorkflows {
            user_id,
            limit,
            reply,
        } => {
            let _ = reply.send(store.waiting_workflows(user_id.as_deref(), limit).await);
        }
    }
}

/// Reads of workflow events and the feed, each with its reply port.
pub enum EventsRequest {
    Workflow {
        workflow_id: String,
        after: i64,
        limit: u32,
        reply: RpcReplyPort<store::Result<Option<EventPage>>>,
    },
    Feed {
        after: i64,
        user_id: Option<String>,
        limit: u32,
        reply: RpcReplyPort<store::Result<Vec<EventRow>>>,
    },
    FeedHead {
        reply: RpcReplyPort<store::Result<i64>>,
    },
    Watch {
        workflow_id: String,
        watch_ms: u64,
        reply: RpcReplyPort<store::Result<()>>,
    },
}

async fn serve_events(store: &Store, request: EventsRequest) {
    match request {
        EventsRequest::Workflow {
            workflow_id,
            after,
            limit,
            reply,
        } => {
            let _ = reply.send(store.read_events(&workflow_id, after, limit).await);
        }
        EventsRequest::Feed {
            after,
            user_id,
            limit,
            reply,
        } => {
            let _ = reply.send(store.read_feed(after, user_id.as_deref(), limit).await);
        }
        EventsRequest::FeedHead { reply } => {
            let _ = reply.send(store.feed_head().await);
        }
        EventsRequest::Watch {
            workflow_id,
            watch_ms,
            reply,
        } => {
            let _ = reply.send(store.watch_events(&workflow_id, watch_ms).await);
        }
    }
}

/// Requests about users, sessions and API tokens, each with its reply port.
pub enum UsersRequest {
    CreateUser {
        user: NewUser,
        only_if_first: bool,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    UserByEmail {
        email: String,
        reply: RpcReplyPort<store::Result<Option<UserRow>>>,
    },
    UserById {
        user_id: String,
        reply: RpcReplyPort<store::Result<Option<UserRow>>>,
    },
    ListUsers {
        reply: RpcReplyPort<store::Result<Vec<UserRow>>>,
    },
    ChangeUser {
        user_id: String,
        change: UserChange,
        reply: RpcReplyPort<store::Result<UserChanged>>,
    },
    SetPassword {
        user_id: String,
        password_hash: String,
        keep_session: Option<String>,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    EndSessions {
        user_id: String,
        keep_session: Option<String>,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    DeleteUser {
        user_id: String,
        reply: RpcReplyPort<store::Result<UserDeletion>>,
    },
    OpenSession {
        session_id: String,
        user_id: String,
        session_seconds: u64,
        reply: RpcReplyPort<store::Result<()>>,
    },
    SessionUser {
        session_id: String,
        reply: RpcReplyPort<store::Result<Option<UserRow>>>,
    },
    RevokeSession {
        session_id: String,
        reply: RpcReplyPort<store::Result<bool>>,
    },
    CreateToken {
        token: NewToken,
        reply: RpcReplyPort<store::Result<TokenRow>>,
    },
    TokenUser {
        token_id: String,
        reply: RpcReplyPort<store::Result<Option<(TokenRow, UserRow)>>>,
    },
    ListTokens {
        user_id: String,
        reply: RpcReplyPort<store::Result<Vec<TokenRow>>>,
    },
    RevokeToken {
        user_id: String,
        token_id: String,
        reply: RpcReplyPort<store::Result<bool>>,
    },
}

async fn serve_users(store: &Store, request: UsersRequest) {
    match request {
        UsersRequest::CreateUser {
            user,
            only_if_first,
            reply,
        } => {
            let _ = reply.send(store.create_user(user, only_if_first).await);
        }
        UsersRequest::UserByEmail { email, reply } => {
            let _ = reply.send(store.user_by_email(&email).await);
        }
        UsersRequest::UserById { user_id, reply } => {
            let _ = reply.send(store.user_by_id(&user_id).await);
        }
        UsersRequest::ListUsers { reply } => {
            let _ = reply.send(store.list_users().await);
        }
        UsersRequest::ChangeUser {
            user_id,
            change,
            reply,
        } => {
            let _ = reply.send(store.change_user(&user_id, change).await);
        }
        UsersRequest::SetPassword {
            user_id,
            password_hash,
            keep_session,
            reply,
        } => {
            let _ = reply.send(
                store
                    .set_password(&user_id, &password_hash, keep_session.as_deref())
                    .await,
            );
        }
        UsersRequest::EndSessions {
            user_id,
            keep_session,
            reply,
        } => {
            let _ = reply.send(store.end_sessions(&user_id, keep_session.as_deref()).await);
        }
        UsersRequest::DeleteUser { user_id, reply } => {
            let _ = reply.send(store.delete_user(&user_id).await);
        }
        UsersRequest::OpenSession {
            session_id,
            user_id,
            session_seconds,
            reply,
        } => {
            let _ = reply.send(
                store
                    .open_session(&session_id, &user_id, session_seconds)
                    .await,
            );
        }
        UsersRequest::SessionUser { session_id, reply } => {
            let _ = reply.send(store.session_user(&session_id).await);
        }
        UsersRequest::RevokeSession { session_id, reply } => {
            let _ = reply.send(store.revoke_session(&session_id).await);
        }
        UsersRequest::CreateToken { token, reply } => {
            let _ = reply.send(store.create_token(token).await);
        }
        UsersRequest::TokenUser { token_id, reply } => {
            let _ = reply.send(store.token_user(&token_id).await);
        }
        UsersRequest::ListTokens { user_id, reply } => {
            let _ = reply.send(store.list_tokens(&user_id).await);
        }
        UsersRequest::RevokeToken {
            user_id,
            token_id,
            reply,
        } => {
            let _ = reply.send(store.revoke_token(&user_id, &token_id).await);
        }
    }
}

/// Whether a change may move its workflow to another status (an event of the feed).
fn changes_status(op: &WriteOp) -> bool {
    matches!(op, WriteOp::SetWorkflow { .. })
}

/// Whether an unanswered request may have changed the database.
#[derive(Clone, Copy)]
enum Effect {
    Read,
    Write,
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
    fn wake<T>(&self, workflow_id: &str, status_changed: bool, written: &store::Result<T>) {
        if matches!(written, Ok(_) | Err(store::Error::OutcomeUnknown(_))) {
            self.wakes.committed(workflow_id, status_changed);
        }
    }

    /// Sends one request, applying any test fault installed for `name`.
    async fn call<T: Send + 'static>(
        &self,
        name: &'static str,
        effect: Effect,
        message: impl FnOnce(RpcReplyPort<store::Result<T>>) -> StoreMsg,
    ) -> store::Result<T> {
        self.call_about(name, None, effect, message).await
    }

    /// [`StoreHandle::call`] for a request about one run, so faults can single it out.
    async fn call_about<T: Send + 'static>(
        &self,
        name: &'static str,
        key: Option<&str>,
        effect: Effect,
        message: impl FnOnce(RpcReplyPort<store::Result<T>>) -> StoreMsg,
    ) -> store::Result<T> {
        let Some(fault) = self.faults.as_ref().and_then(|f| f.take(name, key)) else {
            return self.send(effect, message).await;
        };
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
                self.send(effect, message).await
            }
            FaultAction::HoldAnswer { reached, release } => {
                let answer = self.send(effect, message).await;
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
                let _ = self.send(effect, message).await;
                Err(store::Error::OutcomeUnknown(format!(
                    "the answer of {name} was lost"
                )))
            }
        }
    }

    async fn send<T: Send + 'static>(
        &self,
        effect: Effect,
        message: impl FnOnce(RpcReplyPort<store::Result<T>>) -> StoreMsg,
    ) -> store::Result<T> {
        let unanswered = |reason: String| match effect {
            Effect::Read => store::Error::Unavailable(format!("store actor: {reason}")),
            // The request may have reached the database: its outcome is unknown, not failed.
            Effect::Write => store::Error::OutcomeUnknown(format!("store actor: {reason}")),
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
        resource_id: &str,
        owner: &str,
        lease_ms: u64,
    ) -> store::Result<Option<Lease>> {
        let (resource_id, owner) = (resource_id.to_owned(), owner.to_owned());
        self.call("acquire_lease", Effect::Write, |reply| {
            StoreMsg::AcquireLease {
                resource_id,
                owner,
                lease_ms,
                reply,
            }
        })
        .await
    }

    /// See [`Store::renew_lease`].
    pub async fn renew_lease(&self, fence: &Fence, lease_ms: u64) -> store::Result<(Lease, f64)> {
        let fence = fence.clone();
        self.call("renew_lease", Effect::Write, |reply| StoreMsg::RenewLease {
            fence,
            lease_ms,
            reply,
        })
        .await
    }

    /// See [`Store::release_lease`].
    pub async fn release_lease(&self, fence: &Fence) -> store::Result<bool> {
        let fence = fence.clone();
        self.call("release_lease", Effect::Write, |reply| {
            StoreMsg::ReleaseLease { fence, reply }
        })
        .await
    }

    /// See [`Store::read_lease`].
    pub async fn read_lease(&self, resource_id: &str) -> store::Result<Option<Lease>> {
        let resource_id = resource_id.to_owned();
        self.call("read_lease", Effect::Read, |reply| StoreMsg::ReadLease {
            resource_id,
            reply,
        })
        .await
    }

    /// See [`Store::create_workflow`].
    pub async fn create_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
    ) -> store::Result<Lease> {
        let owner = owner.to_owned();
        let workflow_id = workflow.workflow_id.clone();
        let created = self
            .call("create_workflow", Effect::Write, |reply| {
                StoreMsg::CreateWorkflow {
                    workflow,
                    owner,
                    lease_ms,
                    reply,
                }
            })
            .await;
        self.wake(&workflow_id, true, &created);
        created
    }

    /// See [`Store::fenced_write`].
    pub async fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> store::Result<()> {
        let status_changed = ops.iter().any(changes_status);
        let fence = fence.clone();
        let workflow_id = fence.resource_id.clone();
        let started = std::time::Instant::now();
        let written = self
            .call("fenced_write", Effect::Write, |reply| {
                StoreMsg::FencedWrite { fence, ops, reply }
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
    pub async fn read_workflow(&self, workflow_id: &str) -> store::Result<Option<WorkflowRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call("read_workflow", Effect::Read, |reply| {
            StoreMsg::ReadWorkflow { workflow_id, reply }
        })
        .await
    }

    /// See [`Store::read_events`].
    pub async fn read_events(
        &self,
        workflow_id: &str,
        after: i64,
        limit: u32,
    ) -> store::Result<Option<EventPage>> {
        let workflow_id = workflow_id.to_owned();
        self.call("read_events", Effect::Read, |reply| {
            StoreMsg::Events(EventsRequest::Workflow {
                workflow_id,
                after,
                limit,
                reply,
            })
        })
        .await
    }

    /// See [`Store::watch_events`].
    pub async fn watch_events(&self, workflow_id: &str, watch_ms: u64) -> store::Result<()> {
        let workflow_id = workflow_id.to_owned();
        self.call("watch_events", Effect::Write, |reply| {
            StoreMsg::Events(EventsRequest::Watch {
                workflow_id,
                watch_ms,
                reply,
            })
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
        self.call("read_feed", Effect::Read, |reply| {
            StoreMsg::Events(EventsRequest::Feed {
                after,
                user_id,
                limit,
                reply,
            })
        })
        .await
    }

    /// See [`Store::feed_head`].
    pub async fn feed_head(&self) -> store::Result<i64> {
        self.call("feed_head", Effect::Read, |reply| {
            StoreMsg::Events(EventsRequest::FeedHead { reply })
        })
        .await
    }

    /// See [`Store::read_steps`].
    pub async fn read_steps(&self, workflow_id: &str) -> store::Result<Vec<StepRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call("read_steps", Effect::Read, |reply| StoreMsg::ReadSteps {
            workflow_id,
            reply,
        })
        .await
    }

    /// The database clock, in epoch seconds.
    pub async fn now(&self) -> store::Result<f64> {
        self.call("now", Effect::Read, |reply| StoreMsg::Now { reply })
            .await
    }

    /// Whether the database answers, its schema is the one this build expects, and (after a
    /// write failed for a full disk) whether it can write again. Only then does it write: one
    /// probe per call until a probe succeeds, since a full disk fails writes and never reads,
    /// and a write that changes nothing succeeds even on a full disk.
    pub async fn health(&self) -> store::Result<StoreHealth> {
        let mut health = self
            .call("health", Effect::Read, |reply| StoreMsg::Health { reply })
            .await?;
        if self.disk_full.load(Ordering::Relaxed) {
            match self
                .call("write_probe", Effect::Write, |reply| StoreMsg::WriteProbe {
                    reply,
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
        self.call("register_node", Effect::Write, |reply| {
            StoreMsg::RegisterNode { node, reply }
        })
        .await
    }

    /// Records that this node stopped cleanly.
    pub async fn mark_node_stopped(&self, worker_id: &str) -> store::Result<()> {
        let worker_id = worker_id.to_owned();
        self.call("mark_node_stopped", Effect::Write, |reply| {
            StoreMsg::MarkNodeStopped { worker_id, reply }
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
            .call("launch_workflow", Effect::Write, |reply| {
                StoreMsg::LaunchWorkflow {
                    workflow,
                    owner,
                    lease_ms,
                    limits,
                    reply,
                }
            })
            .await;
        self.wake(&workflow_id, true, &launched);
        launched
    }

    /// See [`Store::take_over_workflow`].
    pub async fn take_over_workflow(
        &self,
        workflow_id: &str,
        owner: &str,
        lease_ms: u64,
        versions: &store::Versions,
        purpose: store::Purpose,
    ) -> store::Result<TakeOver> {
        let woken = workflow_id.to_owned();
        let (workflow_id, owner, versions) =
            (workflow_id.to_owned(), owner.to_owned(), versions.clone());
        let taken = self
            .call("take_over_workflow", Effect::Write, |reply| {
                StoreMsg::TakeOverWorkflow {
                    workflow_id,
                    owner,
                    lease_ms,
                    versions,
                    purpose,
                    reply,
                }
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
        self.call("recoverable_workflows", Effect::Read, |reply| {
            StoreMsg::RecoverableWorkflows {
                limit,
                versions,
                reply,
            }
        })
        .await
    }

    /// See [`Store::workflows_with_pending_controls`].
    pub async fn workflows_with_pending_controls(&self, owner: &str) -> store::Result<Vec<String>> {
        let owner = owner.to_owned();
        self.call("workflows_with_pending_controls", Effect::Read, |reply| {
            StoreMsg::PendingControls { owner, reply }
        })
        .await
    }

    /// See [`Store::delete_workflow`].
    pub async fn delete_workflow(&self, workflow_id: &str) -> store::Result<store::Deletion> {
        let workflow_id = workflow_id.to_owned();
        self.call("delete_workflow", Effect::Write, |reply| {
            StoreMsg::DeleteWorkflow { workflow_id, reply }
        })
        .await
    }

    /// See [`Store::workflow_counts`].
    pub async fn workflow_counts(&self, owner: Option<&str>) -> store::Result<Vec<StatusCount>> {
        let owner = owner.map(str::to_owned);
        self.call("workflow_counts", Effect::Read, |reply| {
            StoreMsg::Operators(OperatorsRequest::WorkflowCounts { owner, reply })
        })
        .await
    }

    /// See [`Store::run_counts`].
    pub async fn run_counts(&self, owner: &str) -> store::Result<Vec<StatusCount>> {
        let owner = owner.to_owned();
        self.call("run_counts", Effect::Read, |reply| {
            StoreMsg::Operators(OperatorsRequest::RunCounts { owner, reply })
        })
        .await
    }

    /// See [`Store::list_slots`].
    pub async fn list_slots(&self, limit: u32) -> store::Result<Vec<SlotRow>> {
        self.call("list_slots", Effect::Read, |reply| {
            StoreMsg::Operators(OperatorsRequest::ListSlots { limit, reply })
        })
        .await
    }

    /// See [`Store::read_snapshot`].
    pub async fn read_snapshot(&self, workflow_id: &str) -> store::Result<Option<store::Snapshot>> {
        let workflow_id = workflow_id.to_owned();
        self.call("read_snapshot", Effect::Read, |reply| {
            StoreMsg::Operators(OperatorsRequest::Snapshot { workflow_id, reply })
        })
        .await
    }

    /// See [`Store::count_slots`].
    pub async fn count_slots(&self) -> store::Result<i64> {
        self.call("count_slots", Effect::Read, |reply| {
            StoreMsg::Operators(OperatorsRequest::CountSlots { reply })
        })
        .await
    }

    /// See [`Store::list_nodes`].
    pub async fn list_nodes(&self, limit: u32) -> store::Result<Vec<NodeRecord>> {
        self.call("list_nodes", Effect::Read, |reply| {
            StoreMsg::Operators(OperatorsRequest::ListNodes { limit, reply })
        })
        .await
    }

    /// See [`Store::waiting_workflows`].
    pub async fn waiting_workflows(
        &self,
        user_id: Option<&str>,
        limit: u32,
    ) -> store::Result<Vec<String>> {
        let user_id = user_id.map(str::to_owned);
        self.call("waiting_workflows", Effect::Read, |reply| {
            StoreMsg::Operators(OperatorsRequest::WaitingWorkflows {
                user_id,
                limit,
                reply,
            })
        })
        .await
    }

    /// See [`Store::create_user`].
    pub async fn create_user(&self, user: NewUser, only_if_first: bool) -> store::Result<bool> {
        self.call("create_user", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::CreateUser {
                user,
                only_if_first,
                reply,
            })
        })
        .await
    }

    /// See [`Store::user_by_email`].
    pub async fn user_by_email(&self, email: &str) -> store::Result<Option<UserRow>> {
        let email = email.to_owned();
        self.call("user_by_email", Effect::Read, |reply| {
            StoreMsg::Users(UsersRequest::UserByEmail { email, reply })
        })
        .await
    }

    /// See [`Store::user_by_id`].
    pub async fn user_by_id(&self, user_id: &str) -> store::Result<Option<UserRow>> {
        let user_id = user_id.to_owned();
        self.call("user_by_id", Effect::Read, |reply| {
            StoreMsg::Users(UsersRequest::UserById { user_id, reply })
        })
        .await
    }

    /// See [`Store::list_users`].
    pub async fn list_users(&self) -> store::Result<Vec<UserRow>> {
        self.call("list_users", Effect::Read, |reply| {
            StoreMsg::Users(UsersRequest::ListUsers { reply })
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
        self.call("change_user", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::ChangeUser {
                user_id,
                change,
                reply,
            })
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
        self.call("set_password", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::SetPassword {
                user_id,
                password_hash,
                keep_session,
                reply,
            })
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
        self.call("end_sessions", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::EndSessions {
                user_id,
                keep_session,
                reply,
            })
        })
        .await
    }

    /// See [`Store::delete_user`].
    pub async fn delete_user(&self, user_id: &str) -> store::Result<UserDeletion> {
        let user_id = user_id.to_owned();
        self.call("delete_user", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::DeleteUser { user_id, reply })
        })
        .await
    }

    /// See [`Store::open_session`].
    pub async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
    ) -> store::Result<()> {
        let (session_id, user_id) = (session_id.to_owned(), user_id.to_owned());
        self.call("open_session", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::OpenSession {
                session_id,
                user_id,
                session_seconds,
                reply,
            })
        })
        .await
    }

    /// See [`Store::session_user`].
    pub async fn session_user(&self, session_id: &str) -> store::Result<Option<UserRow>> {
        let session_id = session_id.to_owned();
        self.call("session_user", Effect::Read, |reply| {
            StoreMsg::Users(UsersRequest::SessionUser { session_id, reply })
        })
        .await
    }

    /// See [`Store::revoke_session`].
    pub async fn revoke_session(&self, session_id: &str) -> store::Result<bool> {
        let session_id = session_id.to_owned();
        self.call("revoke_session", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::RevokeSession { session_id, reply })
        })
        .await
    }

    /// See [`Store::create_token`].
    pub async fn create_token(&self, token: NewToken) -> store::Result<TokenRow> {
        self.call("create_token", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::CreateToken { token, reply })
        })
        .await
    }

    /// See [`Store::token_user`].
    pub async fn token_user(&self, token_id: &str) -> store::Result<Option<(TokenRow, UserRow)>> {
        let token_id = token_id.to_owned();
        self.call("token_user", Effect::Read, |reply| {
            StoreMsg::Users(UsersRequest::TokenUser { token_id, reply })
        })
        .await
    }

    /// See [`Store::list_tokens`].
    pub async fn list_tokens(&self, user_id: &str) -> store::Result<Vec<TokenRow>> {
        let user_id = user_id.to_owned();
        self.call("list_tokens", Effect::Read, |reply| {
            StoreMsg::Users(UsersRequest::ListTokens { user_id, reply })
        })
        .await
    }

    /// See [`Store::revoke_token`].
    pub async fn revoke_token(&self, user_id: &str, token_id: &str) -> store::Result<bool> {
        let (user_id, token_id) = (user_id.to_owned(), token_id.to_owned());
        self.call("revoke_token", Effect::Write, |reply| {
            StoreMsg::Users(UsersRequest::RevokeToken {
                user_id,
                token_id,
                reply,
            })
        })
        .await
    }

    /// See [`Store::list_workflows`].
    pub async fn list_workflows(
        &self,
        filter: store::ListFilter,
    ) -> store::Result<Vec<store::ListedWorkflow>> {
        self.call("list_workflows", Effect::Read, |reply| {
            StoreMsg::ListWorkflows { filter, reply }
        })
        .await
    }

    /// See [`Store::read_artifact`].
    pub async fn read_artifact(
        &self,
        workflow_id: &str,
        version: i64,
    ) -> store::Result<Option<ArtifactRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call("read_artifact", Effect::Read, |reply| {
            StoreMsg::ReadArtifact {
                workflow_id,
                version,
                reply,
            }
        })
        .await
    }

    /// See [`Store::last_artifact_version`].
    pub async fn last_artifact_version(&self, workflow_id: &str) -> store::Result<i64> {
        let workflow_id = workflow_id.to_owned();
        self.call("last_artifact_version", Effect::Read, |reply| {
            StoreMsg::LastArtifactVersion { workflow_id, reply }
        })
        .await
    }

    /// See [`Store::put_control`].
    pub async fn put_control(&self, control: NewControl) -> store::Result<ControlWrite> {
        let workflow_id = control.workflow_id.clone();
        let written = self
            .call("put_control", Effect::Write, |reply| StoreMsg::PutControl {
                control,
                reply,
            })
            .await;
        self.wake(&workflow_id, false, &written);
        written
    }

    /// See [`Store::read_controls`].
    pub async fn read_controls(&self, workflow_id: &str) -> store::Result<Vec<ControlRow>> {
        let workflow_id = workflow_id.to_owned();
        self.call("read_controls", Effect::Read, |reply| {
            StoreMsg::ReadControls { workflow_id, reply }
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
            .call("admit_run", Effect::Write, |reply| StoreMsg::AdmitRun {
                run,
                reply,
            })
            .await;
        if let Some((workflow_id, status_changed)) = step {
            self.wake(&workflow_id, status_changed, &admitted);
        }
        admitted
    }

    /// See [`Store::read_run`].
    pub async fn read_run(&self, run_id: &str) -> store::Result<Option<RunRow>> {
        let run_id = run_id.to_owned();
        self.call("read_run", Effect::Read, |reply| StoreMsg::ReadRun {
            run_id,
            reply,
        })
        .await
    }

    /// See [`Store::renew_run_lease`].
    pub async fn renew_run_lease(
        &self,
        run_id: &str,
        owner: &str,
        lease_ms: u64,
    ) -> store::Result<Result<RunRenewal, Option<RunRow>>> {
        let key = run_id;
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.call_about("renew_run_lease", Some(key), Effect::Write, |reply| {
            StoreMsg::RenewRunLease {
                run_id,
                owner,
                lease_ms,
                reply,
            }
        })
        .await
    }

    /// See [`Store::request_run_cancel`].
    pub async fn request_run_cancel(
        &self,
        run_id: &str,
        action: CancelAction,
    ) -> store::Result<Option<CancelAction>> {
        let key = run_id;
        let run_id = run_id.to_owned();
        self.call_about("request_run_cancel", Some(key), Effect::Write, |reply| {
            StoreMsg::RequestRunCancel {
                run_id,
                action,
                reply,
            }
        })
        .await
    }

    /// See [`Store::update_run_status`].
    pub async fn update_run_status(
        &self,
        run_id: &str,
        owner: &str,
        status: RunStatus,
        metadata: Option<serde_json::Value>,
    ) -> store::Result<bool> {
        let key = run_id;
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.call_about("update_run_status", Some(key), Effect::Write, |reply| {
            StoreMsg::UpdateRunStatus {
                run_id,
                owner,
                status,
                metadata,
                reply,
            }
        })
        .await
    }

    /// See [`Store::finalize_run`].
    pub async fn finalize_run(
        &self,
        run_id: &str,
        owner: &str,
        outcome: &RunOutcome,
        require_not_cancelled: bool,
    ) -> store::Result<bool> {
        let key = run_id;
        let (run_id, owner, outcome) = (run_id.to_owned(), owner.to_owned(), outcome.clone());
        self.call_about("finalize_run", Some(key), Effect::Write, |reply| {
            StoreMsg::FinalizeRun {
                run_id,
                owner,
                outcome,
                require_not_cancelled,
                reply,
            }
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
        self.call("answer_approval", Effect::Write, |reply| {
            StoreMsg::AnswerApproval {
                thread_id,
                request_ids,
                answer,
                reply,
            }
        })
        .await
    }

    /// See [`Store::restore_approval`].
    pub async fn restore_approval(&self, answer: &ApprovalAnswer) -> store::Result<bool> {
        let answer = answer.clone();
        self.call("restore_approval", Effect::Write, |reply| {
            StoreMsg::RestoreApproval { answer, reply }
        })
        .await
    }

    /// See [`Store::claim_orphan_runs`].
    pub async fn claim_orphan_runs(&self, claimer: &str, limit: u32) -> store::Result<Vec<String>> {
        let claimer = claimer.to_owned();
        self.call("claim_orphan_runs", Effect::Write, |reply| {
            StoreMsg::ClaimOrphanRuns {
                claimer,
                limit,
                reply,
            }
        })
        .await
    }
}
