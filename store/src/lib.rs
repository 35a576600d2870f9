//! All SQL of reins. One schema on two backends with the same behaviour: PostgreSQL for a cluster
//! of nodes, SQLite for the embedded single-node default. Callers see one [`Store`] whose
//! operations are the primitives everything else is built from: leases judged by the database
//! clock, and fenced writes that happen only while the writer still holds its lease.
//!
//! The store knows nothing of actors, HTTP or JavaScript.

mod changes;
mod error;
mod events;
mod lease;
mod migrations;
mod operators;
mod postgres;
mod runs;
mod sqlite;
mod users;
mod workflows;
mod write;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub use changes::{Change, Changes, LISTEN_APPLICATION_NAME};
pub use error::{Error, Result};
pub use events::{EventPage, EventRow, FINAL_STATUSES};
pub use lease::{Fence, Lease};
pub use migrations::{MigrationReport, SCHEMA_VERSION};
pub use operators::{SlotRow, StatusCount};
pub use runs::{
    Admission, ApprovalAnswer, CancelAction, NewRun, RunOutcome, RunRenewal, RunRow, RunStatus,
    WorkflowStep, pending_request_id,
};
pub use users::{
    NewToken, NewUser, Role, TokenRow, UserChange, UserChanged, UserDeletion, UserRow,
};
pub use workflows::{
    COUNTED_STATUSES, ControlRow, ControlWrite, Deletion, LIVE_STATUSES, Launch, LaunchLimits,
    ListCursor, ListFilter, ListedWorkflow, NewControl, Orphaned, Purpose, StatusFilter,
    TERMINAL_STATUSES, TakeOver, Versions,
};
pub use write::{ArtifactInfo, ArtifactRow, NewWorkflow, Snapshot, StepRow, WorkflowRow, WriteOp};

/// Where the data lives, parsed from the configuration's `database` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// `sqlite:PATH`: the embedded single-node default.
    Sqlite(PathBuf),
    /// `postgres://...` or `postgresql://...`: the cluster store.
    Postgres(String),
}

impl DatabaseUrl {
    /// Parses and checks a database URL without touching the disk or the network.
    pub fn parse(url: &str) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidUrl {
            url: postgres::redact(url),
            reason: reason.to_owned(),
        };
        if let Some(path) = url.strip_prefix("sqlite:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(invalid(
                    "sqlite: needs a file path, as in sqlite:reins-data/reins.db",
                ));
            }
            return Ok(DatabaseUrl::Sqlite(PathBuf::from(path)));
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            use std::str::FromStr;
            tokio_postgres::Config::from_str(url).map_err(|e| invalid(&e.to_string()))?;
            return Ok(DatabaseUrl::Postgres(url.to_owned()));
        }
        Err(invalid(
            "expected sqlite:PATH or postgres://USER@HOST:PORT/DATABASE",
        ))
    }

    /// The backend's name as shown to operators.
    /// The URL as it may be shown: a PostgreSQL password replaced.
    pub fn redacted(&self) -> String {
        match self {
            DatabaseUrl::Sqlite(path) => format!("sqlite:{}", path.display()),
            DatabaseUrl::Postgres(url) => postgres::redact(url),
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            DatabaseUrl::Sqlite(_) => Backend::Sqlite,
            DatabaseUrl::Postgres(_) => Backend::Postgres,
        }
    }
}

/// Which backend a store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Sizes and timeouts of the store, from the `[store]` section of the configuration.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// PostgreSQL connections, or SQLite read connections.
    pub pool_size: usize,
    /// How long a caller waits for a free pooled connection.
    pub pool_wait_timeout: Duration,
    /// How long connecting to PostgreSQL may take.
    pub connect_timeout: Duration,
    /// The longest a PostgreSQL statement waits for a row lock.
    pub lock_timeout: Duration,
    /// The longest a PostgreSQL statement runs.
    pub statement_timeout: Duration,
    /// SQLite writes waiting for the writer thread before callers are made to wait.
    pub write_queue_max: usize,
    /// SQLite writes committed together in one transaction at most.
    pub write_batch_max: usize,
    /// The name written into the SQLite node lock, shown to a node that is refused.
    pub holder: String,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            pool_size: 16,
            pool_wait_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_secs(10),
            statement_timeout: Duration::from_secs(30),
            write_queue_max: 1024,
            write_batch_max: 64,
            holder: format!("pid {}", std::process::id()),
        }
    }
}

/// A node as recorded in the `nodes` table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeRecord {
    pub worker_id: String,
    pub host: String,
    pub pid: i64,
    pub version: String,
    /// Epoch seconds by the database clock; ignored when registering.
    pub started_at: f64,
    pub stopped_at: Option<f64>,
}

/// The retry schedule for transient failures: attempts, first delay, longest delay.
const RETRY_ATTEMPTS: u32 = 5;
const RETRY_FIRST_DELAY: Duration = Duration::from_millis(50);
const RETRY_MAX_DELAY: Duration = Duration::from_secs(1);

/// Runs `operation` again after failures that surely wrote nothing and clear quickly (busy
/// database, lock timeout, serialization failure, no connection), with bounded doubling backoff. Unknown
/// outcomes are never retried here.
async fn retry<T, F, Fut>(mut operation: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut delay = RETRY_FIRST_DELAY;
    let mut attempt = 1;
    loop {
        match operation().await {
            // Only a busy or unreachable database clears within these retries; a full disk waits
            // for an operator, so it goes back to the caller at once.
            Err(error @ Error::Unavailable(_)) if attempt < RETRY_ATTEMPTS => {
                tracing::debug!(%error, attempt, "transient store error, retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX_DELAY);
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// The store: one of the two backends behind the same operations.
pub struct Store {
    backend: Inner,
}

enum Inner {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PgStore),
}

/// Calls the same method on whichever backend this store runs on.
macro_rules! on_backend {
    ($self:expr, $store:ident => $call:expr) => {
        match &$self.backend {
            Inner::Sqlite($store) => $call,
            Inner::Postgres($store) => $call,
        }
    };
}

impl Store {
    /// Opens (and for SQLite creates) the database. Does not migrate.
    pub async fn open(url: &DatabaseUrl, options: &StoreOptions) -> Result<Store> {
        let backend = match url {
            DatabaseUrl::Sqlite(path) => Inner::Sqlite(sqlite::SqliteStore::open(path, options)?),
            DatabaseUrl::Postgres(url) => {
                Inner::Postgres(postgres::PgStore::open(url, options).await?)
            }
        };
        Ok(Store { backend })
    }

    /// Which backend this store runs on.
    pub fn backend(&self) -> Backend {
        match self.backend {
            Inner::Sqlite(_) => Backend::Sqlite,
            Inner::Postgres(_) => Backend::Postgres,
        }
    }

    /// The change bus: cues, after each commit, that something waited for may have happened
    /// (see [`Change`]). On PostgreSQL the first call opens the node's listening connection.
    pub fn changes(&self) -> Changes {
        match &self.backend {
            Inner::Sqlite(store) => store.changes(),
            Inner::Postgres(store) => store.changes(),
        }
    }

    /// Connections in the pool and how many of them are idle (PostgreSQL only).
    pub fn pool_status(&self) -> Option<(usize, usize)> {
        match &self.backend {
            Inner::Sqlite(_) => None,
            Inner::Postgres(store) => Some(store.pool_status()),
        }
    }

    /// Applies every migration this database has not seen, safely when nodes start together.
    pub async fn migrate(&self) -> Result<MigrationReport> {
        retry(|| async { on_backend!(self, store => store.migrate().await) }).await
    }

    /// The newest schema version recorded in the database (0 for an empty one).
    pub async fn schema_version(&self) -> Result<i64> {
        on_backend!(self, store => store.schema_version().await)
    }

    /// Writes one small row unchanged and commits it: whether the database can write right now
    /// (a full disk fails writes, never reads). Fails with [`Error::DiskFull`] while it cannot.
    pub async fn write_probe(&self) -> Result<()> {
        on_backend!(self, store => store.write_probe().await)
    }

    /// The database clock, in epoch seconds.
    pub async fn now(&self) -> Result<f64> {
        on_backend!(self, store => store.now().await)
    }

    /// Takes `resource_id` for `owner` if its lease is free or expired, with epoch + 1. Returns
    /// `None` while another holder's lease is still valid.
    pub async fn acquire_lease(
        &self,
        resource_id: &str,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Option<Lease>> {
        retry(|| async {
            on_backend!(self, store => store.acquire_lease(resource_id, owner, lease_ms).await)
        })
        .await
    }

    /// Extends a lease still held by `fence` to `lease_ms` from now; never moves it backwards.
    /// Fails with [`Error::LeaseLost`] if the lease expired or was taken over. Also returns the
    /// database clock at the renewal, so the caller can derive its local deadline.
    pub async fn renew_lease(&self, fence: &Fence, lease_ms: u64) -> Result<(Lease, f64)> {
        retry(|| async { on_backend!(self, store => store.renew_lease(fence, lease_ms).await) })
            .await
    }

    /// Ends a lease now so another node may take it at once. Returns whether it was still held.
    pub async fn release_lease(&self, fence: &Fence) -> Result<bool> {
        retry(|| async { on_backend!(self, store => store.release_lease(fence).await) }).await
    }

    /// The current lease row of a resource, if it ever had one.
    pub async fn read_lease(&self, resource_id: &str) -> Result<Option<Lease>> {
        retry(|| async { on_backend!(self, store => store.read_lease(resource_id).await) }).await
    }

    /// Launches a workflow: `running`, owned by `owner`, with its first lease (epoch 1), in one
    /// transaction that also enforces `limits` over the live workflows of the whole cluster and
    /// the idempotency of (user, `request_id`): the same request again is the same workflow, a
    /// different one under the same `request_id` is a conflict.
    pub async fn launch_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> Result<Launch> {
        retry(|| {
            let workflow = workflow.clone();
            async move {
                on_backend!(self, store =>
                    store.launch_workflow(workflow, owner, lease_ms, limits).await)
            }
        })
        .await
    }

    /// [`Store::launch_workflow`] without limits, for a workflow that must be new.
    pub async fn create_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Lease> {
        let id = workflow.workflow_id.clone();
        match self
            .launch_workflow(workflow, owner, lease_ms, LaunchLimits::NONE)
            .await?
        {
            Launch::Created(lease) => Ok(lease),
            Launch::Existing(_) | Launch::Refused { .. } => Err(Error::Conflict(format!(
                "workflow {id:?} exists under that request id"
            ))),
        }
    }

    /// Takes over a `recoverable` workflow (live status, expired lease) for `owner` with epoch +
    /// 1, in one transaction that first refuses, writing nothing, when the workflow was written
    /// under other [`Versions`] (runtime or agent configuration) or a cancellation is pending
    /// (only `cancel` may finish it).
    /// `purpose` sets the rules (see [`Purpose`]): a reconcile takes only a workflow that needs
    /// reconciliation, which a recover refuses; a cancel takes only a workflow with a cancellation
    /// pending, under any runtime version, since it never replays the body.
    pub async fn take_over_workflow(
        &self,
        workflow_id: &str,
        owner: &str,
        lease_ms: u64,
        versions: &Versions,
        purpose: crate::workflows::Purpose,
    ) -> Result<TakeOver> {
        retry(|| async {
            on_backend!(self, store => store
                .take_over_workflow(workflow_id, owner, lease_ms, versions, purpose)
                .await)
        })
        .await
    }

    /// Records a control (resume, decide, cancel) for a workflow, once: an identical control
    /// again is `Repeated` (still one row), a different one for the same step attempt is a
    /// conflict. Any node may write it; the owner carries it out.
    pub async fn put_control(&self, control: NewControl) -> Result<ControlWrite> {
        retry(|| {
            let control = control.clone();
            async move { on_backend!(self, store => store.put_control(control).await) }
        })
        .await
    }

    /// Up to `limit` live workflows whose owner's lease expired, in a random order, that a node
    /// running `versions` may take: what automatic recovery claims (each claim still goes
    /// through the takeover's rules). A workflow with a pending cancellation is listed whatever
    /// its versions, flagged, since only a cancel takeover may finish it.
    pub async fn recoverable_workflows(
        &self,
        limit: u32,
        versions: &Versions,
    ) -> Result<Vec<Orphaned>> {
        retry(|| async {
            on_backend!(self, store => store.recoverable_workflows(limit, versions).await)
        })
        .await
    }

    /// The workflows owned by `owner` that have controls not yet carried out: one query for a
    /// whole node, however many workflows it runs.
    pub async fn workflows_with_pending_controls(&self, owner: &str) -> Result<Vec<String>> {
        retry(|| async {
            on_backend!(self, store => store.workflows_with_pending_controls(owner).await)
        })
        .await
    }

    /// Deletes a terminal workflow with its journal, controls, artifacts, slots and lease.
    pub async fn delete_workflow(&self, workflow_id: &str) -> Result<Deletion> {
        retry(|| async { on_backend!(self, store => store.delete_workflow(workflow_id).await) })
            .await
    }

    /// A page of workflows, newest first.
    pub async fn list_workflows(&self, filter: ListFilter) -> Result<Vec<ListedWorkflow>> {
        retry(|| {
            let filter = filter.clone();
            async move { on_backend!(self, store => store.list_workflows(filter).await) }
        })
        .await
    }

    /// One artifact version of a workflow.
    pub async fn read_artifact(
        &self,
        workflow_id: &str,
        version: i64,
    ) -> Result<Option<ArtifactRow>> {
        retry(|| async {
            on_backend!(self, store => store.read_artifact(workflow_id, version).await)
        })
        .await
    }

    /// The newest artifact version of a workflow (0 when it has none).
    pub async fn last_artifact_version(&self, workflow_id: &str) -> Result<i64> {
        retry(|| async {
            on_backend!(self, store => store.last_artifact_version(workflow_id).await)
        })
        .await
    }

    /// Every control of a workflow, oldest first.
    pub async fn read_controls(&self, workflow_id: &str) -> Result<Vec<ControlRow>> {
        retry(|| async { on_backend!(self, store => store.read_controls(workflow_id).await) }).await
    }

    /// Applies `ops` atomically if and only if `fence` still holds its unexpired lease, checked in
    /// the same transaction in a way that conflicts with a concurrent takeover. Otherwise writes
    /// nothing and fails with [`Error::LeaseLost`].
    pub async fn fenced_write(&self, fence: &Fence, mut ops: Vec<WriteOp>) -> Result<()> {
        write::release_last(&mut ops);
        retry(|| async { on_backend!(self, store => store.fenced_write(fence, &ops).await) }).await
    }

    /// One workflow row, without its journal.
    pub async fn read_workflow(&self, workflow_id: &str) -> Result<Option<WorkflowRow>> {
        retry(|| async { on_backend!(self, store => store.read_workflow(workflow_id).await) }).await
    }

    /// A workflow with its lease, the database clock, its journal and its controls, read as of
    /// one moment (what `get` shows).
    pub async fn read_snapshot(&self, workflow_id: &str) -> Result<Option<Snapshot>> {
        retry(|| async { on_backend!(self, store => store.read_snapshot(workflow_id).await) }).await
    }

    /// A workflow's journal, in the order it was written.
    pub async fn read_steps(&self, workflow_id: &str) -> Result<Vec<StepRow>> {
        retry(|| async { on_backend!(self, store => store.read_steps(workflow_id).await) }).await
    }

    /// A workflow's events numbered after `after`, at most `limit`, with its status; `None`
    /// when there is no such workflow.
    pub async fn read_events(
        &self,
        workflow_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Option<EventPage>> {
        retry(|| async {
            on_backend!(self, store => store.read_events(workflow_id, after, limit).await)
        })
        .await
    }

    /// An event stream watches `workflow_id`'s events for the next `watch_ms`: until then, on
    /// PostgreSQL, every commit that writes events of it announces [`Change::Event`] to every
    /// node (an unwatched workflow's step events notify nobody, which keeps the cluster-wide
    /// `NOTIFY` lock out of ordinary steps). Watch before reading, so an event that commits
    /// after the read is announced. On SQLite there is one node, whose own writes wake its
    /// streams: nothing to do. An unknown workflow is no error (a stream then finds nothing).
    pub async fn watch_events(&self, workflow_id: &str, watch_ms: u64) -> Result<()> {
        match &self.backend {
            Inner::Postgres(store) => {
                retry(|| async { store.watch_events(workflow_id, watch_ms).await }).await
            }
            Inner::Sqlite(_) => Ok(()),
        }
    }

    /// Status changes of every workflow (or of `user_id`'s) whose feed number is after `after`,
    /// at most `limit`, oldest first; each with its feed number as `seq`.
    pub async fn read_feed(
        &self,
        after: i64,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EventRow>> {
        retry(|| async { on_backend!(self, store => store.read_feed(after, user_id, limit).await) })
            .await
    }

    /// The feed's newest number (0 before any launch).
    pub async fn feed_head(&self) -> Result<i64> {
        retry(|| async { on_backend!(self, store => store.feed_head().await) }).await
    }

    /// Creates a user; with `only_if_first`, only while no user exists at all (the first admin),
    /// atomically across nodes. `false`: nothing was written. A taken email is a conflict.
    pub async fn create_user(&self, user: NewUser, only_if_first: bool) -> Result<bool> {
        retry(|| {
            let user = user.clone();
            async move { on_backend!(self, store => store.create_user(user, only_if_first).await) }
        })
        .await
    }

    /// The user with this email.
    pub async fn user_by_email(&self, email: &str) -> Result<Option<UserRow>> {
        retry(|| async { on_backend!(self, store => store.user_by_email(email).await) }).await
    }

    /// The user with this id.
    pub async fn user_by_id(&self, user_id: &str) -> Result<Option<UserRow>> {
        retry(|| async { on_backend!(self, store => store.user_by_id(user_id).await) }).await
    }

    /// Every user, oldest first.
    pub async fn list_users(&self) -> Result<Vec<UserRow>> {
        retry(|| async { on_backend!(self, store => store.list_users().await) }).await
    }

    /// Changes a user's role or disables or enables them, unless that would leave no enabled
    /// admin (checked and changed atomically across nodes). Disabling ends every session of
    /// the user in the same transaction.
    pub async fn change_user(&self, user_id: &str, change: UserChange) -> Result<UserChanged> {
        retry(|| async { on_backend!(self, store => store.change_user(user_id, change).await) })
            .await
    }

    /// Sets a user's password hash and, in the same transaction, ends their sessions: every one,
    /// or every one but `keep_session` (the caller's own, when they change their password).
    /// `false`: no such user.
    pub async fn set_password(
        &self,
        user_id: &str,
        password_hash: &str,
        keep_session: Option<&str>,
    ) -> Result<bool> {
        retry(|| async {
            on_backend!(self, store => store.set_password(user_id, password_hash, keep_session).await)
        })
        .await
    }

    /// Ends a user's sessions: every one (and every cookie minted for them, by bumping
    /// `token_version`), or every one but `keep_session`. API tokens are not sessions and stay.
    /// `false`: no such user.
    pub async fn end_sessions(&self, user_id: &str, keep_session: Option<&str>) -> Result<bool> {
        retry(|| async {
            on_backend!(self, store => store.end_sessions(user_id, keep_session).await)
        })
        .await
    }

    /// Deletes a user with their sessions and API tokens, unless they own a live workflow or are
    /// the last enabled admin. Their finished workflows stay (an admin still sees them).
    pub async fn delete_user(&self, user_id: &str) -> Result<UserDeletion> {
        retry(|| async { on_backend!(self, store => store.delete_user(user_id).await) }).await
    }

    /// Opens a session for `user_id` that expires `session_seconds` from now on the database clock,
    /// and records the sign-in as the user's `last_login_at`.
    pub async fn open_session(
        &self,
        session_id: &str,
        user_id: &str,
        session_seconds: u64,
    ) -> Result<()> {
        retry(|| async {
            on_backend!(self, store => store.open_session(session_id, user_id, session_seconds).await)
        })
        .await
    }

    /// The enabled user of a session that is neither revoked nor expired.
    pub async fn session_user(&self, session_id: &str) -> Result<Option<UserRow>> {
        retry(|| async { on_backend!(self, store => store.session_user(session_id).await) }).await
    }

    /// Revokes one session (logout). `false` when no such session exists.
    pub async fn revoke_session(&self, session_id: &str) -> Result<bool> {
        retry(|| async { on_backend!(self, store => store.revoke_session(session_id).await) }).await
    }

    /// Records an API token (its hash only).
    pub async fn create_token(&self, token: NewToken) -> Result<TokenRow> {
        retry(|| {
            let token = token.clone();
            async move { on_backend!(self, store => store.create_token(token).await) }
        })
        .await
    }

    /// A token that is neither revoked nor expired, with its user, who is not disabled.
    pub async fn token_user(&self, token_id: &str) -> Result<Option<(TokenRow, UserRow)>> {
        retry(|| async { on_backend!(self, store => store.token_user(token_id).await) }).await
    }

    /// A user's tokens, revoked ones included, oldest first.
    pub async fn list_tokens(&self, user_id: &str) -> Result<Vec<TokenRow>> {
        retry(|| async { on_backend!(self, store => store.list_tokens(user_id).await) }).await
    }

    /// Revokes one of a user's tokens. `false` when it does not exist or was revoked before.
    pub async fn revoke_token(&self, user_id: &str, token_id: &str) -> Result<bool> {
        retry(|| async { on_backend!(self, store => store.revoke_token(user_id, token_id).await) })
            .await
    }

    /// Workflows by status: this node's (`owner`), or everyone's.
    pub async fn workflow_counts(&self, owner: Option<&str>) -> Result<Vec<StatusCount>> {
        retry(|| async { on_backend!(self, store => store.workflow_counts(owner).await) }).await
    }

    /// Child runs owned by `owner`, by status.
    pub async fn run_counts(&self, owner: &str) -> Result<Vec<StatusCount>> {
        retry(|| async { on_backend!(self, store => store.run_counts(owner).await) }).await
    }

    /// The live workflows that wait for a person (a pause or a human checkpoint without its
    /// control, or a step whose agent asked for approval), `user_id`'s or everyone's, oldest first,
    /// at most `limit`. Running workflows are the candidates that need a look at their journal and
    /// live runs (both indexed by workflow); paused ones wait by their status alone.
    pub async fn waiting_workflows(
        &self,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>> {
        retry(|| async {
            on_backend!(self, store => store.waiting_workflows(user_id, limit).await)
        })
        .await
    }

    /// The child slots held, oldest first, at most `limit`.
    pub async fn list_slots(&self, limit: u32) -> Result<Vec<SlotRow>> {
        retry(|| async { on_backend!(self, store => store.list_slots(limit).await) }).await
    }

    /// Records a node that has started.
    pub async fn register_node(&self, node: &NodeRecord) -> Result<()> {
        retry(|| async { on_backend!(self, store => store.register_node(node).await) }).await
    }

    /// Records that a node stopped cleanly.
    pub async fn mark_node_stopped(&self, worker_id: &str) -> Result<()> {
        retry(|| async { on_backend!(self, store => store.mark_node_stopped(worker_id).await) })
            .await
    }

    /// Admits a child run: the `runs` row (`pending`, owned by `run.owner`, leased), checked
    /// against the idempotency key, the thread's one active run, and, for a workflow step, the
    /// workflow's fence and a free `workflow_slots` slot, all in one transaction.
    pub async fn admit_run(&self, mut run: NewRun) -> Result<Admission> {
        if let Some(step) = &mut run.step {
            write::release_last(&mut step.journal);
        }
        retry(|| async { on_backend!(self, store => store.admit_run(&run).await) }).await
    }

    /// One child run.
    pub async fn read_run(&self, run_id: &str) -> Result<Option<RunRow>> {
        retry(|| async { on_backend!(self, store => store.read_run(run_id).await) }).await
    }

    /// Extends a live run's lease if `owner` still owns it and its lease has not expired; the
    /// answer carries any durable cancel request and any approval answer its live agent waits for.
    /// When refused, returns the row as it is now.
    pub async fn renew_run_lease(
        &self,
        run_id: &str,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Result<RunRenewal, Option<RunRow>>> {
        retry(|| async {
            on_backend!(self, store => store.renew_run_lease(run_id, owner, lease_ms).await)
        })
        .await
    }

    /// Records a durable cancel request on a live run (the first action asked for stands); a run
    /// waiting for input, which nobody runs, is interrupted at once. Returns the action in force,
    /// or `None` when the run already has an outcome.
    pub async fn request_run_cancel(
        &self,
        run_id: &str,
        action: CancelAction,
    ) -> Result<Option<CancelAction>> {
        retry(|| async {
            on_backend!(self, store => store.request_run_cancel(run_id, action).await)
        })
        .await
    }

    /// Moves a run `owner` still owns from `pending`/`running` to another live status
    /// (`running`, `waiting_for_input`), optionally replacing its metadata.
    pub async fn update_run_status(
        &self,
        run_id: &str,
        owner: &str,
        status: RunStatus,
        metadata: Option<serde_json::Value>,
    ) -> Result<bool> {
        retry(|| {
            let metadata = metadata.clone();
            async move {
                on_backend!(self, store => store.update_run_status(run_id, owner, status, metadata).await)
            }
        })
        .await
    }

    /// The terminal compare-and-set: records `outcome` only if `owner` still owns the row, it is
    /// still live, and (with `require_not_cancelled`) nobody asked to cancel it. `true` means this
    /// call's own write was acknowledged.
    pub async fn finalize_run(
        &self,
        run_id: &str,
        owner: &str,
        outcome: &RunOutcome,
        require_not_cancelled: bool,
    ) -> Result<bool> {
        retry(|| async {
            on_backend!(self, store =>
                store.finalize_run(run_id, owner, outcome, require_not_cancelled).await)
        })
        .await
    }

    /// Answers the newest pause of `thread_id` if it waits for one of `request_ids`: a single-winner
    /// compare-and-set across nodes that records `answer` in `metadata.hitl_answer`. A detached
    /// pause ends its run `success`; an attached one (its agent still alive) goes back to
    /// `running`, and the owner's next renewal hands the answer to the agent. `None` when there is
    /// no such pause or another answer won.
    pub async fn answer_approval(
        &self,
        thread_id: &str,
        request_ids: &[String],
        answer: &serde_json::Value,
    ) -> Result<Option<ApprovalAnswer>> {
        retry(|| async {
            on_backend!(self, store => store.answer_approval(thread_id, request_ids, answer).await)
        })
        .await
    }

    /// Undoes an answer, only if nothing was committed on the run since.
    pub async fn restore_approval(&self, answer: &ApprovalAnswer) -> Result<bool> {
        retry(|| async { on_backend!(self, store => store.restore_approval(answer).await) }).await
    }

    /// Claims up to `limit` live runs whose lease expired (their node is gone) and closes them as
    /// `error` with `stop_reason = orphan_recovered`. Returns the run ids it closed.
    pub async fn claim_orphan_runs(&self, claimer: &str, limit: u32) -> Result<Vec<String>> {
        retry(|| async {
            on_backend!(self, store => store.claim_orphan_runs(claimer, limit).await)
        })
        .await
    }

    /// Slots taken in `workflow_slots` across the cluster.
    pub async fn count_slots(&self) -> Result<i64> {
        retry(|| async { on_backend!(self, store => store.count_slots().await) }).await
    }

    /// The nodes that started on this database, newest first, at most `limit`.
    pub async fn list_nodes(&self, limit: u32) -> Result<Vec<NodeRecord>> {
        retry(|| async { on_backend!(self, store => store.list_nodes(limit).await) }).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_parse_or_name_the_problem() {
        assert_eq!(
            DatabaseUrl::parse("sqlite:data/reins.db").ok(),
            Some(DatabaseUrl::Sqlite("data/reins.db".into()))
        );
        assert_eq!(
            DatabaseUrl::parse("sqlite:///tmp/r.db").ok(),
            Some(DatabaseUrl::Sqlite("/tmp/r.db".into()))
        );
        assert!(matches!(
            DatabaseUrl::parse("postgres://reins@127.0.0.1:5432/reins"),
            Ok(DatabaseUrl::Postgres(_))
        ));
        for bad in ["sqlite:", "mysql://x", "postgres://host:notaport/db", ""] {
            assert!(
                matches!(DatabaseUrl::parse(bad), Err(Error::InvalidUrl { .. })),
                "{bad:?} was accepted"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retry_gives_up_after_five_transient_failures() {
        let mut calls = 0;
        let result: Result<()> = retry(|| {
            calls += 1;
            async { Err(Error::Unavailable("busy".into())) }
        })
        .await;
        assert!(matches!(result, Err(Error::Unavailable(_))));
        assert_eq!(calls, RETRY_ATTEMPTS);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_never_repeats_an_unknown_outcome() {
        let mut calls = 0;
        let result: Result<()> = retry(|| {
            calls += 1;
            async { Err(Error::OutcomeUnknown("ack lost".into())) }
        })
        .await;
        assert!(matches!(result, Err(Error::OutcomeUnknown(_))));
        assert_eq!(calls, 1);
    }
}
