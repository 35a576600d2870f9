//! The cluster backend: PostgreSQL through a bounded `deadpool-postgres` pool. A fenced write is
//! one pipelined round trip `BEGIN; fence; change; change; COMMIT`: the fence (`reins_fence`)
//! raises unless the lease holds and locks the lease row `FOR SHARE` until the commit, and each
//! change is one statement that raises if it did not touch its row. A failing statement aborts
//! the transaction, so the pipelined `COMMIT` becomes a rollback and nothing is written.

use std::str::FromStr;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use deadpool_postgres::{
    GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};
use futures_util::future::join_all;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row, Statement};

use self::batch::{Batcher, Job};
pub(crate) use self::conn::abandonable;
use self::conn::{Conn, connection};
use crate::changes::{AbortOnDrop, CHANGES_CHANNEL_SQL, Change, Changes, listen_backoff};
use crate::lease::{Fence, Lease, ttl_seconds};
use crate::migrations::{self, MigrationReport, PG_MIGRATION_LOCK};
use crate::write::{
    ArtifactInfo, ArtifactRow, Snapshot, StepPage, StepPosition, StepRow, WorkflowRow, WriteOp,
};
use crate::{
    BackupReport, Error, NodeRecord, Result, StepStatus, StoreOptions, WorkflowId, WorkflowStatus,
};

/// The rows of a page of steps (`$1` the workflow, `($2, $3)` the position after which the page
/// starts, `$4` its length): every entry but a checkpoint ([`crate::CHECKPOINT_KINDS`]).
macro_rules! step_page {
    () => {
        "WHERE workflow = $1 AND (seq, attempt) > ($2, $3)
           AND kind NOT IN ('pause', 'humanCheckpoint')"
    };
}

mod batch;
mod conn;
mod events;
mod notify;
mod operators;
mod run_rows;
mod run_writes;
mod runs;
mod sent_events;
mod users;
mod workflows;

pub(crate) struct PgStore {
    pool: Pool,
    /// The writers that commit the hot writes (fenced writes, admissions, child runs' ends) of
    /// many workflows together.
    batcher: Batcher,
    /// How the change listener connects: the pool's settings under its own application name.
    listen_config: Box<tokio_postgres::Config>,
    /// The change bus and its listening task, started by the first subscriber.
    listener: OnceLock<(Changes, AbortOnDrop)>,
    /// Status events one read of the feed numbers at most (`StoreOptions::feed_numbering_max`).
    feed_numbering_max: i32,
    /// The places of reads on the pool's connections (`StoreOptions::pg_read_connections_max`,
    /// at most all but one): every read operation holds one while it runs, so reads never hold
    /// the connections that writes (the batch writers, launches, leases) need.
    reads: tokio::sync::Semaphore,
    /// The places `reads` has, to tell how many are held.
    read_places_max: usize,
    /// Reads waiting for a place in `reads` now (see [`PgStore::read_places`]).
    reads_waiting: AtomicUsize,
    /// How long a read waits for its place (the pool's own wait, `store.pool_wait_timeout_ms`).
    read_wait: std::time::Duration,
}

impl PgStore {
    pub(crate) async fn open(url: &str, options: &StoreOptions) -> Result<Self> {
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| Error::InvalidUrl {
            url: redact(url),
            reason: e.to_string(),
        })?;
        config.connect_timeout(options.connect_timeout);
        network_timeouts(&mut config, url, options);
        let mut listen_config = config.clone();
        listen_config.application_name(crate::changes::LISTEN_APPLICATION_NAME);
        config.application_name("reins");
        // A statement never waits for a lock longer than this; the fenced write it belongs to
        // then fails cleanly (nothing written) instead of hanging a caller.
        config.options(format!(
            "-c lock_timeout={} -c statement_timeout={}",
            options.lock_timeout.as_millis(),
            options.statement_timeout.as_millis()
        ));
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            .wait_timeout(Some(options.pool_wait_timeout))
            .create_timeout(Some(options.connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| Error::Unavailable(format!("cannot build the connection pool: {e}")))?;
        // Reachability is checked now, so that a bad address stops start-up with its cause.
        let client = pool.get().await?;
        drop(client);
        let batcher = Batcher::start(
            pool.clone(),
            options.pg_writers,
            options.pg_batch_max,
            options.write_queue_max,
        );
        let read_places_max = read_connections(options);
        Ok(PgStore {
            batcher,
            pool,
            listen_config: Box::new(listen_config),
            listener: OnceLock::new(),
            feed_numbering_max: i32::try_from(options.feed_numbering_max.max(1))
                .unwrap_or(i32::MAX),
            reads: tokio::sync::Semaphore::new(read_places_max),
            read_places_max,
            reads_waiting: AtomicUsize::new(0),
            read_wait: options.pool_wait_timeout,
        })
    }

    /// A place for one read operation on the pool's connections (see [`PgStore::reads`]),
    /// waited for as long as a connection of the pool is.
    pub(crate) async fn read_place(&self) -> Result<tokio::sync::SemaphorePermit<'_>> {
        let _waiting = WaitingForPlace::count(&self.reads_waiting);
        match tokio::time::timeout(self.read_wait, self.reads.acquire()).await {
            Ok(Ok(place)) => Ok(place),
            // Never closed: a timeout is every read place busy for the whole wait.
            Ok(Err(_)) | Err(_) => Err(Error::Unavailable(format!(
                "the database connections for reads (`store.pg_read_connections_max`) stayed \
                 busy for {} ms",
                self.read_wait.as_millis()
            ))),
        }
    }

    /// Reads holding a place among the pool's connections for reads, and reads waiting for one.
    pub(crate) fn read_places(&self) -> (usize, usize) {
        (
            self.read_places_max - self.reads.available_permits(),
            self.reads_waiting.load(Ordering::Relaxed),
        )
    }

    /// A pooled connection for the call running in this task (see [`conn`]).
    async fn connection(&self) -> Result<Conn> {
        connection(&self.pool).await
    }

    /// The change bus; the first call starts the node's listening connection.
    pub(crate) fn changes(&self) -> Changes {
        let (changes, _) = self.listener.get_or_init(|| {
            let changes = Changes::new();
            let task = tokio::spawn(listen((*self.listen_config).clone(), changes.clone()));
            (changes, AbortOnDrop(task))
        });
        changes.clone()
    }

    /// Cues this node's own subscribers, at once, with the status changes a write of its own
    /// just committed: a waiter or a stream here need not wait for the `NOTIFY` to come back
    /// through the listening connection, which may be down or slow. The `NOTIFY` still comes
    /// (every node hears it); a second cue is harmless, since a cue only names what to read.
    pub(super) fn cue_committed(&self, statuses: Vec<WorkflowId>) {
        let Some((changes, _)) = self.listener.get() else {
            return;
        };
        for workflow_id in statuses {
            changes.send(Change::Status(workflow_id));
        }
    }

    pub(crate) fn write_batches(&self) -> (u64, u64) {
        self.batcher.counts()
    }

    pub(crate) fn pool_status(&self) -> (usize, usize) {
        let status = self.pool.status();
        (status.size, status.available)
    }

    pub(crate) async fn migrate(&self) -> Result<MigrationReport> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        // Nodes starting together queue here; each then sees what the one before it applied.
        transaction
            .execute("SELECT pg_advisory_xact_lock($1)", &[&PG_MIGRATION_LOCK])
            .await?;
        transaction
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                     version BIGINT PRIMARY KEY, name TEXT NOT NULL,
                     applied_at DOUBLE PRECISION NOT NULL
                         DEFAULT extract(epoch FROM clock_timestamp()))",
            )
            .await?;
        let recorded: Vec<i64> = transaction
            .query("SELECT version FROM schema_migrations", &[])
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let mut applied = Vec::new();
        for migration in migrations::pending(&recorded)? {
            transaction.batch_execute(migration.postgres).await?;
            transaction
                .execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    &[&migration.version, &migration.name],
                )
                .await?;
            applied.push(migration.version);
        }
        transaction.commit().await?;
        Ok(MigrationReport {
            applied,
            version: migrations::SCHEMA_VERSION,
        })
    }

    pub(crate) async fn schema_version(&self) -> Result<i64> {
        let client = self.connection().await?;
        let row = client
            .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
            .await?;
        if !row.get::<_, bool>(0) {
            return Ok(0);
        }
        let row = client
            .query_one(
                "SELECT coalesce(max(version), 0) FROM schema_migrations",
                &[],
            )
            .await?;
        Ok(row.get(0))
    }

    pub(crate) async fn write_probe(&self) -> Result<()> {
        let client = self.connection().await?;
        client.execute(PROBE_SQL, &[]).await?;
        Ok(())
    }

    pub(crate) async fn backup(&self, _destination: &std::path::Path) -> Result<BackupReport> {
        Err(Error::Unsupported(
            "the node backs up only its embedded SQLite database; back up PostgreSQL with \
             pg_dump or pg_basebackup"
                .into(),
        ))
    }

    pub(crate) async fn now(&self) -> Result<f64> {
        let client = self.connection().await?;
        Ok(client
            .query_one(&client.prepare_cached("SELECT reins_now()").await?, &[])
            .await?
            .get(0))
    }

    pub(crate) async fn acquire_lease(
        &self,
        resource_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Option<Lease>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "INSERT INTO extension_execution_leases AS l (resource_id, owner, epoch, expires_at)
                 VALUES ($1, $2, 1, reins_now() + $3)
                 ON CONFLICT (resource_id) DO UPDATE
                    SET owner = EXCLUDED.owner, epoch = l.epoch + 1,
                        expires_at = reins_now() + $3
                  WHERE l.expires_at <= reins_now()
                 RETURNING epoch, expires_at",
            )
            .await?;
        let row = client
            .query_opt(&statement, &[&resource_id, &owner, &ttl_seconds(lease_ms)])
            .await?;
        Ok(row.map(|row| Lease {
            resource_id: resource_id.to_owned(),
            owner: owner.to_owned(),
            epoch: row.get(0),
            expires_at: row.get(1),
        }))
    }

    pub(crate) async fn renew_lease(&self, fence: &Fence, lease_ms: u64) -> Result<(Lease, f64)> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "UPDATE extension_execution_leases
                    SET expires_at = GREATEST(expires_at, reins_now() + $4)
                  WHERE resource_id = $1 AND owner = $2 AND epoch = $3
                    AND expires_at > reins_now()
                 RETURNING expires_at, reins_now()",
            )
            .await?;
        let row = client
            .query_opt(
                &statement,
                &[
                    &fence.resource_id,
                    &fence.owner,
                    &fence.epoch,
                    &ttl_seconds(lease_ms),
                ],
            )
            .await?;
        match row {
            Some(row) => Ok((
                Lease {
                    resource_id: fence.resource_id.clone(),
                    owner: fence.owner.clone(),
                    epoch: fence.epoch,
                    expires_at: row.get(0),
                },
                row.get(1),
            )),
            None => Err(fence.lost()),
        }
    }

    pub(crate) async fn release_lease(&self, fence: &Fence) -> Result<bool> {
        let client = self.connection().await?;
        let released = client
            .execute(
                &client
                    .prepare_cached(
                        "UPDATE extension_execution_leases SET expires_at = reins_now()
                  WHERE resource_id = $1 AND owner = $2 AND epoch = $3
                    AND expires_at > reins_now()",
                    )
                    .await?,
                &[&fence.resource_id, &fence.owner, &fence.epoch],
            )
            .await?;
        Ok(released == 1)
    }

    pub(crate) async fn read_lease(&self, resource_id: &WorkflowId) -> Result<Option<Lease>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "SELECT owner, epoch, expires_at FROM extension_execution_leases
                  WHERE resource_id = $1",
            )
            .await?;
        let row = client.query_opt(&statement, &[&resource_id]).await?;
        Ok(row.map(|row| Lease {
            resource_id: resource_id.to_owned(),
            owner: row.get(0),
            epoch: row.get(1),
            expires_at: row.get(2),
        }))
    }

    pub(crate) async fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> Result<()> {
        let statuses = status_changes(&ops);
        self.batcher
            .submit(|reply| Job::Fenced {
                fence: fence.clone(),
                ops,
                reply,
            })
            .await?;
        self.cue_committed(statuses);
        Ok(())
    }

    pub(crate) async fn read_workflow(
        &self,
        workflow_id: &WorkflowId,
    ) -> Result<Option<WorkflowRow>> {
        let client = self.connection().await?;
        Ok(workflow_in(&*client, workflow_id)
            .await?
            .map(|(row, _, _)| row))
    }

    pub(crate) async fn read_steps(&self, workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
        let client = self.connection().await?;
        steps_in(&*client, workflow_id).await
    }

    /// A workflow with its lease, first steps, checkpoints, controls, asking runs and first
    /// artifact versions: six queries in a repeatable-read transaction, so they see one moment.
    /// The statements are prepared first; then every future is polled once, in this order,
    /// before any answer is awaited, so the transaction goes in one round trip (a read: nothing
    /// of it can be half done).
    pub(crate) async fn read_snapshot(
        &self,
        workflow_id: &WorkflowId,
        steps_max: u32,
        artifacts_max: u32,
    ) -> Result<Option<Snapshot>> {
        let client = self.connection().await?;
        let head = client.prepare_cached(WORKFLOW_SQL).await?;
        let steps = client.prepare_cached(STEP_PAGE_SQL).await?;
        let checkpoints = client.prepare_cached(CHECKPOINTS_SQL).await?;
        let controls = client.prepare_cached(workflows::CONTROLS_SQL).await?;
        let approval_runs = client.prepare_cached(run_rows::APPROVAL_RUNS_SQL).await?;
        let artifacts = client.prepare_cached(ARTIFACT_PAGE_SQL).await?;
        let waits = client.prepare_cached(WAITS_SQL).await?;
        let id: [&(dyn ToSql + Sync); 1] = [workflow_id];
        let start = StepPosition::START;
        let steps_max = i64::from(steps_max);
        let page: [&(dyn ToSql + Sync); 4] = [workflow_id, &start.seq, &start.attempt, &steps_max];
        let (no_version, artifacts_max) = (0_i64, i64::from(artifacts_max));
        let artifact_page: [&(dyn ToSql + Sync); 3] = [workflow_id, &no_version, &artifacts_max];
        let (begun, head, steps, checkpoints, controls, approval_runs, artifacts, waits, committed) = tokio::join!(
            client.batch_execute("START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
            client.query_opt(&head, &id),
            client.query(&steps, &page),
            client.query(&checkpoints, &id),
            client.query(&controls, &id),
            client.query(&approval_runs, &page),
            client.query(&artifacts, &artifact_page),
            client.query(&waits, &id),
            client.batch_execute("COMMIT"),
        );
        begun?;
        let (head, steps, checkpoints, controls, approval_runs, artifacts, waits) = (
            head?,
            steps?,
            checkpoints?,
            controls?,
            approval_runs?,
            artifacts?,
            waits?,
        );
        committed?;
        let Some(head) = head else {
            return Ok(None);
        };
        let (row, lease, db_now) = workflow_from(&head, workflow_id)?;
        Ok(Some(Snapshot {
            row,
            lease,
            db_now,
            retried_by: head.get(11),
            steps: page_steps_from(&steps, workflow_id)?,
            checkpoints: steps_from(&checkpoints, workflow_id)?,
            controls: controls
                .iter()
                .map(workflows::control)
                .collect::<Result<_>>()?,
            approval_runs: approval_runs
                .iter()
                .map(run_rows::decode)
                .collect::<Result<_>>()?,
            artifacts: artifacts.iter().map(artifact_from).collect(),
            waits: steps_from(&waits, workflow_id)?,
        }))
    }

    /// A page of steps with the runs that asked, in one repeatable-read transaction sent in one
    /// round trip (as [`PgStore::read_snapshot`]).
    pub(crate) async fn read_step_page(
        &self,
        workflow_id: &WorkflowId,
        after: StepPosition,
        limit: u32,
    ) -> Result<StepPage> {
        let client = self.connection().await?;
        let steps = client.prepare_cached(STEP_PAGE_SQL).await?;
        let approval_runs = client.prepare_cached(run_rows::APPROVAL_RUNS_SQL).await?;
        let limit = i64::from(limit);
        let page: [&(dyn ToSql + Sync); 4] = [workflow_id, &after.seq, &after.attempt, &limit];
        let (begun, steps, approval_runs, committed) = tokio::join!(
            client.batch_execute("START TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
            client.query(&steps, &page),
            client.query(&approval_runs, &page),
            client.batch_execute("COMMIT"),
        );
        begun?;
        let (steps, approval_runs) = (steps?, approval_runs?);
        committed?;
        Ok(StepPage {
            steps: page_steps_from(&steps, workflow_id)?,
            approval_runs: approval_runs
                .iter()
                .map(run_rows::decode)
                .collect::<Result<_>>()?,
        })
    }

    pub(crate) async fn read_artifact_page(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<ArtifactInfo>> {
        let client = self.connection().await?;
        let statement = client.prepare_cached(ARTIFACT_PAGE_SQL).await?;
        let rows = client
            .query(&statement, &[workflow_id, &after, &i64::from(limit)])
            .await?;
        Ok(rows.iter().map(artifact_from).collect())
    }

    pub(crate) async fn read_artifact(
        &self,
        workflow_id: &WorkflowId,
        version: i64,
    ) -> Result<Option<ArtifactRow>> {
        let client = self.connection().await?;
        let row = client
            .query_opt(
                &client
                    .prepare_cached(
                        "SELECT version, source_step_id, path, content, sha256
                           FROM workflow_artifacts WHERE workflow = $1 AND version = $2",
                    )
                    .await?,
                &[&workflow_id, &version],
            )
            .await?;
        Ok(row.map(|row| ArtifactRow {
            version: row.get(0),
            source_step_id: row.get(1),
            path: row.get(2),
            content: row.get(3),
            sha256: row.get(4),
        }))
    }

    pub(crate) async fn last_artifact_version(&self, workflow_id: &WorkflowId) -> Result<i64> {
        let client = self.connection().await?;
        Ok(client
            .query_one(
                &client
                    .prepare_cached(
                        "SELECT coalesce(max(version), 0) FROM workflow_artifacts
                          WHERE workflow = $1",
                    )
                    .await?,
                &[&workflow_id],
            )
            .await?
            .get(0))
    }

    pub(crate) async fn register_node(&self, node: &NodeRecord) -> Result<()> {
        let client = self.connection().await?;
        client
            .execute(
                &client
                    .prepare_cached(
                        "INSERT INTO nodes (worker_id, host, pid, version, started_at)
                 VALUES ($1, $2, $3, $4, reins_now())",
                    )
                    .await?,
                &[&node.worker_id, &node.host, &node.pid, &node.version],
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn mark_node_stopped(&self, worker_id: &str) -> Result<()> {
        let client = self.connection().await?;
        client
            .execute(
                &client
                    .prepare_cached(
                        "UPDATE nodes SET stopped_at = reins_now() WHERE worker_id = $1",
                    )
                    .await?,
                &[&worker_id],
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn list_nodes(&self, limit: u32) -> Result<Vec<NodeRecord>> {
        let client = self.connection().await?;
        let rows = client
            .query(
                &client
                    .prepare_cached(
                        "SELECT worker_id, host, pid, version, started_at, stopped_at FROM nodes
                          ORDER BY started_at DESC, worker_id LIMIT $1",
                    )
                    .await?,
                &[&i64::from(limit)],
            )
            .await?;
        Ok(rows.iter().map(node_from_row).collect())
    }
}

fn node_from_row(row: &Row) -> NodeRecord {
    NodeRecord {
        worker_id: row.get(0),
        host: row.get(1),
        pid: row.get(2),
        version: row.get(3),
        started_at: row.get(4),
        stopped_at: row.get(5),
    }
}

/// The workflows whose status `ops` set: what [`PgStore::cue_committed`] names once they commit.
pub(super) fn status_changes(ops: &[WriteOp]) -> Vec<WorkflowId> {
    ops.iter()
        .filter_map(|op| match op {
            WriteOp::SetWorkflow { workflow_id, .. } => Some(workflow_id.clone()),
            _ => None,
        })
        .collect()
}

/// The statements of a fenced write, prepared on one connection.
pub(super) struct FencedStatements {
    fence: Statement,
    ops: Vec<Statement>,
}

pub(super) async fn prepare_fenced(client: &Object, ops: &[WriteOp]) -> Result<FencedStatements> {
    let releases = ops.iter().any(WriteOp::ends_fence);
    let fence = client
        .prepare_cached(if releases { FENCE_END_SQL } else { FENCE_SQL })
        .await?;
    let mut statements = Vec::with_capacity(ops.len());
    for op in ops {
        statements.push(client.prepare_cached(op_sql(op)).await?);
    }
    Ok(FencedStatements {
        fence,
        ops: statements,
    })
}

/// Sends a fenced write's statements, without `BEGIN` or `COMMIT`: every future is polled once,
/// in this order, before any answer is awaited, so they go out together and in order behind
/// whatever the caller sent before, and a caller that goes away afterwards cannot leave half of
/// them unsent. The fence comes first and holds the lease row until the commit. The answer is
/// the first failure: the statements after it only report the aborted transaction.
pub(super) async fn fenced_body(
    client: &Object,
    statements: &FencedStatements,
    fence: &Fence,
    ops: &[WriteOp],
) -> std::result::Result<(), tokio_postgres::Error> {
    let params: Vec<Vec<&(dyn ToSql + Sync)>> = ops.iter().map(|op| op_params(fence, op)).collect();
    let fence_params = fence_params(fence);
    let (checked, changed) = tokio::join!(
        client.execute(&statements.fence, &fence_params),
        join_all(
            statements
                .ops
                .iter()
                .zip(&params)
                .map(|(statement, params)| client.execute(statement, params)),
        ),
    );
    checked?;
    changed.into_iter().try_for_each(|r| r.map(|_| ()))
}

/// A fenced write in a transaction of its own, in one round trip: what a batch falls back to.
pub(super) async fn fenced_alone(pool: &Pool, fence: &Fence, ops: &[WriteOp]) -> Result<()> {
    let client = connection(pool).await?;
    let statements = prepare_fenced(&client, ops).await?;
    let (begun, changed, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        fenced_body(&client, &statements, fence, ops),
        client.batch_execute("COMMIT"),
    );
    if let Err(e) = begun {
        return Err(begin_error(e));
    }
    // A failed statement aborted the transaction, and the pipelined COMMIT rolled it back.
    changed.map_err(|e| fenced_error(fence, e))?;
    committed.map_err(commit_error)?;
    Ok(())
}

/// A pipelined `BEGIN` that failed. When the server ended the session over it (shutting down,
/// crashed, not yet accepting work: SQLSTATE class 57P), it ran nothing after it, so nothing of
/// the transaction was written and it may be tried again. Anything else leaves the fate of the
/// statements sent behind it unknown.
pub(super) fn begin_error(error: tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    match error.code() {
        Some(code)
            if [
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
            ]
            .contains(code) =>
        {
            Error::Unavailable(format!("BEGIN refused: {error}"))
        }
        _ => Error::OutcomeUnknown(format!("BEGIN failed: {error}")),
    }
}

/// A commit whose answer never came may have happened: without a SQLSTATE from the server, the
/// outcome is unknown. So it is when the server ended the session in the commit's place (see
/// [`session_ended`]). Any other refusal of a commit (an `ERROR`) rolled it back.
pub(super) fn commit_error(error: tokio_postgres::Error) -> Error {
    if error.code().is_some() && !session_ended(&error) {
        Error::from(error)
    } else {
        Error::OutcomeUnknown(error.to_string())
    }
}

/// Whether the server ended the session with `error` (severity `FATAL` or `PANIC`, such as
/// `57P01` when an operator or a fast shutdown terminates it). Answering a `COMMIT`, it may have
/// been raised after the commit was already durable, so it does not say that nothing committed.
pub(super) fn session_ended(error: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::Severity;
    error
        .as_db_error()
        .and_then(|db| db.parsed_severity())
        .is_some_and(|severity| matches!(severity, Severity::Fatal | Severity::Panic))
}

/// An error the server sent about a statement means its transaction rolled back: `RL001` is the
/// fence refusing. Anything else (a dropped connection, a timeout) leaves the commit's fate
/// unknown.
pub(super) fn fenced_error(fence: &Fence, error: tokio_postgres::Error) -> Error {
    match error.code() {
        Some(code) if code.code() == "RL001" => fence.lost(),
        Some(_) => Error::from(error),
        None => Error::OutcomeUnknown(error.to_string()),
    }
}

/// Each change as one statement, sent in a transaction whose first statement is the fence
/// ([`FENCE_SQL`]): `reins_fence` raises unless the fence holds and keeps the lease row locked
/// `FOR SHARE` until the transaction ends, so every later statement of the transaction runs under
/// the lease it checked, and one check per transaction is enough. The change's own parameters
/// are `$1...`; only [`WriteOp::ReleaseLease`] and [`WriteOp::GoDormant`] name the fence itself.
pub(super) fn op_sql(op: &WriteOp) -> &'static str {
    match op {
        WriteOp::SetWorkflow { .. } => {
            "WITH changed AS (
                 UPDATE workflows SET status = $2, data = $3, updated_at = reins_now()
                  WHERE id = $1 RETURNING 1)
             SELECT reins_expect((SELECT count(*) FROM changed), 1, 'workflow ' || $1)"
        }
        WriteOp::PutStep { .. } => {
            "INSERT INTO workflow_steps (workflow, step_id, attempt, kind, status, data, seq,
                                         created_at, updated_at, error_bytes)
             VALUES ($1::text, $2::text, $3::integer, $4::text, $5::text, $6::jsonb, $7::integer,
                     reins_now(), reins_now(), $8::bigint)
             ON CONFLICT (workflow, step_id, attempt) DO UPDATE
                SET kind = EXCLUDED.kind, status = EXCLUDED.status, data = EXCLUDED.data,
                    seq = EXCLUDED.seq, updated_at = EXCLUDED.updated_at,
                    error_bytes = EXCLUDED.error_bytes"
        }
        WriteOp::MarkControlApplied { .. } => {
            "UPDATE workflow_controls SET applied_at = reins_now()
              WHERE id = $1 AND applied_at IS NULL"
        }
        WriteOp::TakeEvent { .. } => {
            "WITH taken AS (
                 UPDATE sent_events SET taken_by = $3, taken_at = reins_now()
                  WHERE workflow = $1 AND seq = $2 AND (taken_by IS NULL OR taken_by = $3)
                 RETURNING 1)
             SELECT reins_expect((SELECT count(*) FROM taken), 1,
                                 'event ' || $2 || ' of workflow ' || $1 || ' untaken')"
        }
        WriteOp::PutArtifact { .. } => {
            "INSERT INTO workflow_artifacts (workflow, version, source_step_id, path, content,
                                             bytes, sha256, created_at)
             VALUES ($1::text, $2::bigint, $3::text, $4::text, $5::bytea, octet_length($5::bytea),
                     $6::text, reins_now())"
        }
        WriteOp::CloseStepRuns { .. } => {
            "UPDATE runs SET status = 'interrupted', stop_reason = 'reconciled',
                    error = 'closed by reconcile', revision = revision + 1,
                    updated_at = reins_now()
              WHERE idempotency_key = $1
                AND status IN ('pending', 'running', 'waiting_for_input')"
        }
        WriteOp::CancelRuns { .. } => {
            "UPDATE runs SET cancel_action = coalesce(cancel_action, 'interrupt'),
                    status = CASE status WHEN 'waiting_for_input' THEN 'interrupted'
                                         ELSE status END,
                    revision = revision + 1, updated_at = reins_now()
              WHERE workflow = $1 AND status IN ('pending', 'running', 'waiting_for_input')
                AND cancel_action IS NULL"
        }
        // The number freed is left to a slot claim later in the same transaction (migration 22).
        WriteOp::ReleaseSlot { .. } => {
            "DELETE FROM workflow_slots WHERE workflow = $1 AND step_id = $2
             RETURNING set_config('reins.freed_slot', coalesce(slot_no::text, ''), true)"
        }
        WriteOp::TakePlaces { .. } => {
            "UPDATE workflows w SET live_no = guard.live_no, owner_no = guard.owner_no
               FROM reins_launch_guard($2, NULL, $3, $4, $5) AS guard WHERE w.id = $1"
        }
        WriteOp::ReleaseSlots { .. } => "DELETE FROM workflow_slots WHERE workflow = $1",
        WriteOp::TakeStorage { .. } => "SELECT reins_take_storage($1, $2, $3)",
        WriteOp::ReturnStorage { .. } => "SELECT reins_return_storage($1)",
        WriteOp::PutLogs { .. } => "SELECT reins_log($1, $2, $3, $4)",
        WriteOp::ReleaseLease => {
            "UPDATE extension_execution_leases SET expires_at = reins_now()
              WHERE resource_id = $1 AND owner = $2 AND epoch = $3"
        }
        // Runs after `FENCE_END_SQL` locked the lease row: a control or an event recorded
        // before that lock is seen here (a statement of its own, so a snapshot of its own), and
        // one recorded after waits for the lock and then finds the workflow dormant.
        WriteOp::GoDormant { .. } => {
            "WITH wake AS MATERIALIZED (
                 SELECT CASE WHEN EXISTS (SELECT 1 FROM workflow_controls
                                           WHERE workflow = $1 AND applied_at IS NULL)
                               OR EXISTS (SELECT 1 FROM sent_events
                                           WHERE workflow = $1 AND taken_by IS NULL
                                             AND name = ANY($3::text[]))
                             THEN reins_now()
                             ELSE least(coalesce($2::bigint / 1000.0::double precision,
                                                 253402300799), 253402300799)
                        END AS at),
             marked AS (
                 UPDATE workflows SET dormant = true, wake_at = (SELECT at FROM wake),
                                      wake_on_events = $3::text[]
                  WHERE id = $1 RETURNING 1)
             UPDATE extension_execution_leases SET expires_at = (SELECT at FROM wake), owner = ''
              WHERE resource_id = $1 AND owner = $4 AND epoch = $5
                AND (SELECT count(*) FROM marked) = 1"
        }
    }
}

/// The statement that opens every fenced transaction: `$1..$3` are the fence.
pub(super) const FENCE_SQL: &str = "SELECT reins_fence($1, $2, $3)";

/// The fence of a write that gives the lease up (a workflow's end): the lease row locked
/// `FOR UPDATE` first, which waits for every fenced write of the workflow in flight (each holds
/// it `FOR SHARE` to its commit), then [`FENCE_SQL`]'s check. Under `READ COMMITTED` the end's
/// changes then see what those writes committed: an admission that raced the end has its slot
/// given back and its run asked to stop by the end itself, instead of outliving it unseen (its
/// uncommitted slot was invisible to the end's `DELETE`). A write that comes after finds the
/// lease released.
pub(super) const FENCE_END_SQL: &str = "WITH held AS MATERIALIZED (
         SELECT 1 FROM extension_execution_leases WHERE resource_id = $1 FOR UPDATE)
     SELECT reins_fence($1, $2, $3) FROM (SELECT count(*) FROM held) AS waited";

/// The parameters of [`FENCE_SQL`].
pub(super) fn fence_params(fence: &Fence) -> [&(dyn ToSql + Sync); 3] {
    [&fence.resource_id, &fence.owner, &fence.epoch]
}

/// The parameters of [`op_sql`]: the change's own (the fence for a lease release).
pub(super) fn op_params<'a>(fence: &'a Fence, op: &'a WriteOp) -> Vec<&'a (dyn ToSql + Sync)> {
    match op {
        WriteOp::SetWorkflow {
            workflow_id,
            status,
            data,
        } => vec![workflow_id, status, data],
        WriteOp::PutStep {
            workflow_id,
            seq,
            step_id,
            attempt,
            status,
            record,
        } => vec![
            workflow_id,
            step_id,
            attempt,
            record.kind().as_static(),
            status,
            record,
            seq,
            // As `$8::bigint`, the bytes of its error (see `StepRecord`'s `ToSql`).
            record,
        ],
        WriteOp::MarkControlApplied { control_id } => vec![control_id],
        WriteOp::TakeEvent {
            workflow_id,
            seq,
            step_id,
        } => vec![workflow_id, seq, step_id],
        WriteOp::PutArtifact {
            workflow_id,
            version,
            source_step_id,
            path,
            content,
            sha256,
        } => vec![workflow_id, version, source_step_id, path, content, sha256],
        WriteOp::ReleaseSlot {
            workflow_id,
            step_id,
        } => vec![workflow_id, step_id],
        WriteOp::CloseStepRuns {
            idempotency_key, ..
        } => vec![idempotency_key],
        WriteOp::CancelRuns { workflow_id }
        | WriteOp::ReleaseSlots { workflow_id }
        | WriteOp::ReturnStorage { workflow_id } => vec![workflow_id],
        WriteOp::TakeStorage {
            workflow_id,
            bytes,
            bytes_max,
        } => vec![workflow_id, bytes, bytes_max],
        WriteOp::TakePlaces {
            workflow_id,
            user_id,
            max_workflows,
            max_workflows_per_owner,
        } => vec![
            workflow_id,
            user_id,
            &crate::workflows::COUNTED,
            max_workflows,
            max_workflows_per_owner,
        ],
        WriteOp::PutLogs {
            workflow_id,
            lines,
            events_max,
            bytes_max,
        } => vec![workflow_id, lines, events_max, bytes_max],
        WriteOp::ReleaseLease => fence_params(fence).to_vec(),
        WriteOp::GoDormant {
            workflow_id,
            wake_at_ms,
            event_names,
        } => vec![
            workflow_id,
            wake_at_ms,
            event_names,
            &fence.owner,
            &fence.epoch,
        ],
    }
}

/// Sets what lets a connection notice that the network under it is gone (`TCP_USER_TIMEOUT`
/// and keepalives, see [`StoreOptions`]) unless the operator's `url` sets it itself: a
/// parameter the URL names keeps the URL's value, and `keepalives=0` there keeps keepalives off.
/// The listener's connection is configured from the same `config`, so it gets them too.
fn network_timeouts(config: &mut tokio_postgres::Config, url: &str, options: &StoreOptions) {
    let named: Vec<&str> = url
        .split_once('?')
        .map_or("", |(_, query)| query)
        .split('&')
        .filter_map(|pair| pair.split('=').next())
        .collect();
    let sets = |key: &str| named.contains(&key);
    if !sets("tcp_user_timeout") {
        config.tcp_user_timeout(options.pg_tcp_user_timeout);
    }
    if !sets("keepalives") {
        config.keepalives(true);
    }
    if !sets("keepalives_idle") {
        config.keepalives_idle(options.pg_keepalives_idle);
    }
    if !sets("keepalives_interval") {
        config.keepalives_interval(options.pg_keepalives_interval);
    }
}

/// The URL without its password, for messages.
/// Rewrites the newest migration's row unchanged: a write that always needs new space on disk.
const PROBE_SQL: &str = "UPDATE schema_migrations SET name = name
                          WHERE version = (SELECT max(version) FROM schema_migrations)";

pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &credentials[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// One read counted in [`PgStore::reads_waiting`] while it waits for its place: no longer once
/// the wait ends, whether it got its place, gave up, or was dropped with its abandoned call.
struct WaitingForPlace<'a>(&'a AtomicUsize);

impl<'a> WaitingForPlace<'a> {
    fn count(waiting: &'a AtomicUsize) -> Self {
        waiting.fetch_add(1, Ordering::Relaxed);
        WaitingForPlace(waiting)
    }
}

impl Drop for WaitingForPlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The pool's connections reads may hold at once: as configured, but never every one of them
/// while the pool has more than one.
fn read_connections(options: &StoreOptions) -> usize {
    let pool_size = options.pool_size.max(1);
    options
        .pg_read_connections_max
        .min(pool_size.saturating_sub(1))
        .max(1)
}

/// A workflow row with its lease and the database clock, in one statement.
const WORKFLOW_SQL: &str = "
    SELECT w.user_id, w.status, w.owner, w.fingerprint, w.data, w.created_at, w.updated_at,
           l.owner, l.epoch, l.expires_at, reins_now(),
           (SELECT r.workflow FROM workflow_retries r WHERE r.retry_of = w.id)
      FROM workflows w
      LEFT JOIN extension_execution_leases l ON l.resource_id = w.id
     WHERE w.id = $1";

/// A page of a workflow's artifacts (without their content): at most `$3` versions above `$2`,
/// oldest first (the primary key's order).
const ARTIFACT_PAGE_SQL: &str = "
    SELECT version, source_step_id, path, bytes, sha256, created_at
      FROM workflow_artifacts WHERE workflow = $1 AND version > $2 ORDER BY version LIMIT $3";

/// A workflow's journal, in call order.
const STEPS_SQL: &str = "
    SELECT step_id, attempt, kind, status, data, seq, created_at
      FROM workflow_steps WHERE workflow = $1 ORDER BY seq, attempt";

/// A page of a workflow's steps: at most `$4` after the position `($2, $3)`, in journal order,
/// read by the index on `(workflow, seq, attempt)` (migration 3) as far as the page goes, each
/// with when its child run was admitted (its row's `created_at`, by the runs' primary key).
const STEP_PAGE_SQL: &str = concat!(
    "SELECT step_id, attempt, kind, status, data, seq, created_at,
            (SELECT r.created_at FROM runs r WHERE r.run_id = workflow_steps.data->>'run_id')
       FROM workflow_steps ",
    step_page!(),
    " ORDER BY seq, attempt LIMIT $4"
);

/// A workflow's checkpoints ([`crate::CHECKPOINT_KINDS`]) in journal order, from the partial
/// index of migration 30.
const CHECKPOINTS_SQL: &str = "
    SELECT step_id, attempt, kind, status, data, seq, created_at
      FROM workflow_steps WHERE workflow = $1 AND kind IN ('pause', 'humanCheckpoint')
     ORDER BY seq, attempt";

/// The columns and the predicate of a workflow's waits (see [`crate::WaitKind`]): its unsettled
/// entries that wait, an agent's running attempt only when its run waits for a person (found
/// by the index on `runs (workflow, step_id, attempt)`).
macro_rules! waits_of {
    ($narrowed:literal) => {
        concat!(
            "SELECT s.step_id, s.attempt, s.kind, s.status, s.data, s.seq, s.created_at,
                    s.workflow
               FROM workflow_steps s
              WHERE ",
            $narrowed,
            " AND s.status IN ('queued', 'running')
                AND s.kind IN ('agent', 'sleep', 'waitForEvent', 'pause', 'humanCheckpoint')
                AND (s.status = 'queued' OR s.kind <> 'agent' OR EXISTS (
                      SELECT 1 FROM runs r
                       WHERE r.workflow = s.workflow AND r.step_id = s.step_id
                         AND r.attempt = s.attempt AND r.status = 'waiting_for_input'))
              ORDER BY s.workflow, s.seq, s.attempt"
        )
    };
}

/// A record's waits: none unless the workflow's status is one of [`crate::WAITING_STATUSES`].
/// The status test names no column of the entry, so PostgreSQL makes it a one-time filter: a
/// workflow that ended reads none of its journal for it.
const WAITS_SQL: &str = waits_of!(
    "s.workflow = $1 AND EXISTS (SELECT 1 FROM workflows w WHERE w.id = $1
                                   AND w.status IN ('running', 'paused', 'waiting_approval'))"
);

/// The waits of a listing's page: of the workflows `$1` (those of the page whose status is one
/// of [`crate::WAITING_STATUSES`]), in one statement.
pub(super) const PAGE_WAITS_SQL: &str = waits_of!("s.workflow = ANY($1)");

async fn workflow_in(
    client: &impl GenericClient,
    workflow_id: &WorkflowId,
) -> Result<Option<(WorkflowRow, Option<Lease>, f64)>> {
    let statement = client.prepare_cached(WORKFLOW_SQL).await?;
    let row = client.query_opt(&statement, &[&workflow_id]).await?;
    row.map(|row| workflow_from(&row, workflow_id)).transpose()
}

/// A row of [`WORKFLOW_SQL`].
fn workflow_from(row: &Row, workflow_id: &WorkflowId) -> Result<(WorkflowRow, Option<Lease>, f64)> {
    let lease = row.get::<_, Option<String>>(7).map(|owner| Lease {
        resource_id: workflow_id.to_owned(),
        owner,
        epoch: row.get(8),
        expires_at: row.get(9),
    });
    let workflow = WorkflowRow {
        workflow_id: workflow_id.to_owned(),
        user_id: row.get(0),
        status: WorkflowStatus::read(row.get(1), workflow_id)?,
        owner: row.get(2),
        fingerprint: row.get(3),
        data: row.get(4),
        created_at: row.get(5),
        updated_at: row.get(6),
    };
    Ok((workflow, lease, row.get(10)))
}

/// A row of [`ARTIFACT_PAGE_SQL`].
fn artifact_from(row: &Row) -> ArtifactInfo {
    ArtifactInfo {
        version: row.get(0),
        source_step_id: row.get(1),
        path: row.get(2),
        bytes: row.get(3),
        sha256: row.get(4),
        created_at: row.get(5),
    }
}

async fn steps_in(client: &impl GenericClient, workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
    let statement = client.prepare_cached(STEPS_SQL).await?;
    let rows = client.query(&statement, &[&workflow_id]).await?;
    steps_from(&rows, workflow_id)
}

/// The rows of [`STEPS_SQL`].
fn steps_from(rows: &[Row], workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
    rows.iter()
        .map(|row| {
            let seq = row.get(5);
            let data: serde_json::Value = row.get(4);
            Ok(StepRow::decoded(
                seq,
                row.get(0),
                row.get(1),
                StepStatus::read(row.get(3), workflow_id, seq)?,
                (row.get(2), &data),
                row.get(6),
            ))
        })
        .collect()
}

/// The rows of [`STEP_PAGE_SQL`]: journal entries with when their child run was admitted.
fn page_steps_from(rows: &[Row], workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
    Ok(steps_from(rows, workflow_id)?
        .into_iter()
        .zip(rows)
        .map(|(step, row)| step.with_run_started_at(row.get(7)))
        .collect())
}

/// The change listener: one connection of its own (never the pool's) that `LISTEN`s, hands
/// every notification on, and after any failure connects again with backoff. Each connect ends
/// with [`Change::Resync`], since whatever committed while it was away was not heard.
async fn listen(config: tokio_postgres::Config, changes: Changes) {
    let mut failures = 0u32;
    loop {
        match listening(&config, &changes, &mut failures).await {
            Ok(()) => tracing::warn!("the change listener's connection closed; reconnecting"),
            Err(error) => {
                tracing::warn!(%error, "the change listener's connection failed; reconnecting");
            }
        }
        failures += 1;
        tokio::time::sleep(listen_backoff(failures)).await;
    }
}

/// One connection's life: connect, `LISTEN`, resync, then hand notifications on until it ends.
async fn listening(
    config: &tokio_postgres::Config,
    changes: &Changes,
    failures: &mut u32,
) -> std::result::Result<(), tokio_postgres::Error> {
    use futures_util::StreamExt;
    use tokio_postgres::AsyncMessage;

    let (client, mut connection) = config.connect(NoTls).await?;
    let mut messages =
        futures_util::stream::poll_fn(move |context| connection.poll_message(context));
    let listen = client.batch_execute(CHANGES_CHANNEL_SQL);
    tokio::pin!(listen);
    // The connection only makes progress while its messages are polled, so both go together.
    loop {
        tokio::select! {
            listened = &mut listen => {
                listened?;
                break;
            }
            message = messages.next() => match message {
                Some(Ok(AsyncMessage::Notification(note))) => changes.send_payload(note.payload()),
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error),
                None => return Ok(()),
            },
        }
    }
    *failures = 0;
    changes.send(Change::Resync);
    while let Some(message) = messages.next().await {
        match message? {
            AsyncMessage::Notification(note) => changes.send_payload(note.payload()),
            _ => continue,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;
    use std::time::Duration;

    use crate::StoreOptions;

    fn configured(url: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::from_str(url).expect("a valid url");
        super::network_timeouts(&mut config, url, &StoreOptions::default());
        config
    }

    #[test]
    fn connections_notice_a_dead_network_by_default() {
        let config = configured("postgres://reins@db:5432/reins");
        let defaults = StoreOptions::default();
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&defaults.pg_tcp_user_timeout)
        );
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), defaults.pg_keepalives_idle);
        assert_eq!(
            config.get_keepalives_interval(),
            Some(defaults.pg_keepalives_interval)
        );
    }

    #[test]
    fn the_urls_own_network_settings_win() {
        let config = configured(
            "postgres://reins@db/reins?application_name=x&tcp_user_timeout=9\
             &keepalives_idle=60&keepalives_interval=7",
        );
        assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(9)));
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(
            config.get_keepalives_interval(),
            Some(Duration::from_secs(7))
        );
        // An operator who turned keepalives off keeps them off; the rest still applies.
        let config = configured("postgres://reins@db/reins?keepalives=0");
        assert!(!config.get_keepalives());
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&StoreOptions::default().pg_tcp_user_timeout)
        );
        // `tcp_user_timeout=0` (the system's default) is the operator's choice too.
        let config = configured("postgres://reins@db/reins?tcp_user_timeout=0");
        assert_eq!(config.get_tcp_user_timeout(), None);
    }

    #[test]
    fn reads_never_hold_every_connection_of_the_pool() {
        let reads = |pool_size, pg_read_connections_max| {
            super::read_connections(&StoreOptions {
                pool_size,
                pg_read_connections_max,
                ..StoreOptions::default()
            })
        };
        assert_eq!(reads(16, 10), 10, "as configured, below the pool");
        assert_eq!(reads(16, 15), 15, "at the edge: all but one");
        assert_eq!(reads(16, 16), 15, "never all of them");
        assert_eq!(reads(4, 10), 3);
        assert_eq!(reads(1, 10), 1, "a pool of one shares its connection");
    }

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            super::redact("postgres://reins:s3cret@db:5432/reins"),
            "postgres://reins:***@db:5432/reins"
        );
        assert_eq!(
            super::redact("postgres://reins@db/reins"),
            "postgres://reins@db/reins"
        );
    }
}
