//! All SQL of reins. One schema on two backends with the same behaviour: PostgreSQL for a cluster
//! of nodes, SQLite for the embedded single-node default. Callers see one [`Store`] whose
//! operations are the primitives everything else is built from: leases judged by the database
//! clock, and fenced writes that happen only while the writer still holds its lease.
//!
//! The store knows nothing of actors, HTTP or JavaScript.

mod approval;
mod backends;
mod batches;
mod changes;
mod error;
mod events;
mod ids;
mod lease;
mod migrations;
mod notify;
mod operations;
mod operators;
mod postgres;
mod rfc3339;
mod runs;
mod sent_events;
#[cfg(feature = "sim")]
mod sim;
mod sqlite;
mod status;
mod step;
mod users;
mod waits;
mod workflow_doc;
mod workflows;
mod write;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

pub use approval::{
    APPROVAL_DEADLINE, ApprovalAnswered, ApprovalAsked, ApprovalSlot, asking, pending_request_id,
};
pub use changes::{Change, Changes, LISTEN_APPLICATION_NAME};
pub use error::{Error, Limit, Result};
pub use events::{EventPage, EventRow};
pub use ids::{RunId, WorkflowId, idempotency_key};
pub use lease::{Epoch, Fence, Lease};
pub use migrations::{MigrationReport, SCHEMA_VERSION};
pub use notify::{Notification, NotificationData, NotificationKind, Settlement};
pub use operations::{
    Controls, Events, Leases, Notifications, Operation, Operators, Runs, Schema, Users, Workflows,
};
pub use operators::{BackupReport, SlotRow, StatusCount};
pub use rfc3339::{rfc3339_utc, rfc3339_utc_millis};
pub use runs::{
    Admission, ApprovalAnswer, CancelAction, ExpiredApproval, FailureClass, NewRun, RunFailure,
    RunOutcome, RunRenewal, RunRow, RunSlot, WorkflowStep,
};
pub use sent_events::{EventBounds, EventSend, NewSentEvent, SentEvent};
#[cfg(feature = "sim")]
pub use sim::{
    Mutant as SimMutant, SimClock, SimStore, Storage as SimStorage,
    WorkflowStorage as SimWorkflowStorage,
};
pub use status::{COUNTED_STATUSES, LIVE_STATUSES, RunStatus, StepStatus, WorkflowStatus};
pub use step::{Reconciled, RetryWait, StepCall, StepChild, StepKind, StepOutcome, StepRecord};
pub use users::{
    NewToken, NewUser, Role, TokenRow, UserChange, UserChanged, UserDeletion, UserRow, UserStorage,
};
pub use waits::{WAITING_STATUSES, WaitKind};
pub use workflow_doc::{DocReconciliation, LifeLimit, WorkflowDoc};
pub use workflows::{
    ControlKind, ControlRow, ControlWrite, Deletion, Dormancy, Launch, LaunchLimits, ListCursor,
    ListFilter, ListedWorkflow, NewControl, NewRetry, Orphaned, Purpose, Retry, StatusFilter,
    TakeOver, Versions,
};
pub use write::{
    ArtifactInfo, ArtifactRow, CHECKPOINT_KINDS, DORMANT_FOREVER_S, NewWorkflow, Snapshot,
    StepPage, StepPosition, StepRow, WorkflowRow, WriteOp, error_bytes,
};

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
    /// PostgreSQL: how long data sent on a connection may go unacknowledged before the kernel
    /// drops the connection (`TCP_USER_TIMEOUT`, milliseconds). Without it a call sent into a
    /// network partition waits for TCP's retransmissions (some 15 minutes), and after the heal
    /// for the next one of a doubling backoff; with it the call fails, its connection closes, and
    /// the next call connects anew. With keepalives it also bounds a silent idle connection.
    /// The database URL's own `tcp_user_timeout` wins.
    pub pg_tcp_user_timeout: Duration,
    /// PostgreSQL: how long a connection is idle before the kernel probes its peer with a
    /// keepalive (whole seconds), so that an idle connection across a partition (the change
    /// listener's) is noticed and closed. The URL's own `keepalives_idle` (or `keepalives=0`) wins.
    pub pg_keepalives_idle: Duration,
    /// PostgreSQL: the time between two keepalive probes of a silent peer (whole seconds). The
    /// URL's own `keepalives_interval` wins.
    pub pg_keepalives_interval: Duration,
    /// Writes waiting for the writers (SQLite's writer thread, PostgreSQL's batch writers)
    /// before callers are made to wait.
    pub write_queue_max: usize,
    /// SQLite writes committed together in one transaction at most.
    pub write_batch_max: usize,
    /// PostgreSQL: the writer tasks that commit fenced writes, admissions and child runs' ends
    /// in batches (group commit), each holding one pooled connection while it commits.
    pub pg_writers: usize,
    /// PostgreSQL: writes one batch commits together at most (1: every write alone).
    pub pg_batch_max: usize,
    /// PostgreSQL: the pool's connections that reads hold at once at most (never all of them:
    /// at most `pool_size - 1` while the pool has more than one), so that however many heavy
    /// reads run, writes always find a connection.
    pub pg_read_connections_max: usize,
    /// SQLite: pages the writer's commits add to the write-ahead log before the checkpointer
    /// thread copies them into the database file.
    pub wal_checkpoint_pages: u32,
    /// SQLite: past this many pages in the write-ahead log the writer checkpoints itself, so
    /// the log starts over even under constant load.
    pub wal_pages_max: u32,
    /// PostgreSQL: status events one read of the feed gives their feed numbers to at most (the
    /// next reads number the rest), so a backlog never makes a read outlast
    /// `statement_timeout`.
    pub feed_numbering_max: u32,
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
            pg_tcp_user_timeout: Duration::from_secs(5),
            pg_keepalives_idle: Duration::from_secs(5),
            pg_keepalives_interval: Duration::from_secs(2),
            write_queue_max: 1024,
            write_batch_max: 64,
            pg_writers: 4,
            pg_batch_max: 16,
            pg_read_connections_max: 10,
            wal_checkpoint_pages: 1000,
            wal_pages_max: 10_000,
            feed_numbering_max: 10_000,
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

/// Runs one store call, `operation`, for at most `deadline`. Past it the call is abandoned where
/// it stands: the caller hears that its outcome is unknown (an operation that writes, which may
/// have committed) or that the database is unavailable (a read), and every PostgreSQL connection
/// the call held is closed, never given back to the pool, since an answer may still be on its way
/// on it or the network under it may be gone (see `postgres/conn.rs`).
pub async fn bounded<T>(
    deadline: Duration,
    operation: Operation,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(deadline, postgres::abandonable(call)).await {
        Ok(answer) => answer,
        Err(_) => {
            let why = format!(
                "{} was abandoned after {} ms without an answer",
                operation.name(),
                deadline.as_millis()
            );
            Err(if operation.writes() {
                Error::OutcomeUnknown(why)
            } else {
                Error::Unavailable(why)
            })
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

    /// How many transactions of more than one write the writers have committed or tried (group
    /// commit), and how many writes they carried.
    pub fn write_batches(&self) -> (u64, u64) {
        match &self.backend {
            Inner::Sqlite(store) => store.write_batches(),
            Inner::Postgres(store) => store.write_batches(),
        }
    }

    /// Connections in the pool and how many of them are idle (PostgreSQL only).
    pub fn pool_status(&self) -> Option<(usize, usize)> {
        match &self.backend {
            Inner::Sqlite(_) => None,
            Inner::Postgres(store) => Some(store.pool_status()),
        }
    }

    /// Reads holding a place among the pool's connections for reads
    /// (`store.pg_read_connections_max`), and reads waiting for one (PostgreSQL only).
    pub fn read_places(&self) -> Option<(usize, usize)> {
        match &self.backend {
            Inner::Sqlite(_) => None,
            Inner::Postgres(store) => Some(store.read_places()),
        }
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
            Launch::Created { lease, .. } => Ok(lease),
            Launch::Existing(_) | Launch::Refused { .. } => Err(Error::Conflict(format!(
                "workflow {id:?} exists under that request id"
            ))),
        }
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
