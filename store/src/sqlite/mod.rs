//! The embedded single-node backend. SQLite allows one writer at a time, so every write goes to
//! one writer thread that owns the only writing connection. The thread takes every job waiting in
//! its queue, runs each in its own savepoint of one `IMMEDIATE` transaction, commits once, and only
//! then answers each job (group commit). Reads use a small pool of connections in WAL mode and never
//! wait for the writer. A lock file beside the database keeps a second node out.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use serde_json::Value;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::batches::BatchCounts;
use crate::changes::Changes;
use crate::lease::{Fence, Lease, ttl_seconds};
use crate::migrations::{self, MigrationReport};
use crate::write::{
    ArtifactInfo, ArtifactRow, Snapshot, StepPage, StepPosition, StepRow, WorkflowRow, WriteOp,
};
use crate::{
    BackupReport, Error, NodeRecord, Result, StepRecord, StepStatus, StoreOptions, WorkflowId,
    WorkflowStatus,
};

/// The rows of a page of steps (`?1` the workflow, `(?2, ?3)` the position after which the page
/// starts, `?4` its length): every entry but a checkpoint ([`crate::CHECKPOINT_KINDS`]).
macro_rules! step_page {
    () => {
        "WHERE workflow = ?1 AND (seq, attempt) > (?2, ?3)
           AND kind NOT IN ('pause', 'humanCheckpoint')"
    };
}

mod backup;
mod changes;
mod checkpoint;
mod events;
mod notify;
mod operators;
mod runs;
mod sent_events;
mod users;
mod workflows;

// The database clock in SQL is `unixepoch('subsec')`: epoch seconds with sub-second precision.

/// Answers one job once its batch's commit outcome is known.
type Finish = Box<dyn FnOnce(Result<()>) + Send>;

/// A unit of work for the writer thread.
trait Job: Send {
    /// Runs inside a savepoint of the batch's transaction; returns how to answer after commit,
    /// and the job's own error if it failed.
    fn run(self: Box<Self>, connection: &Connection) -> (Finish, Option<Error>);
    /// Answers without running: the batch's transaction could not begin.
    fn refuse(self: Box<Self>, error: Error);
}

struct PendingWrite<R, F> {
    work: F,
    reply: oneshot::Sender<Result<R>>,
}

impl<R, F> Job for PendingWrite<R, F>
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> Result<R> + Send,
{
    fn run(self: Box<Self>, connection: &Connection) -> (Finish, Option<Error>) {
        let result = in_savepoint(connection, self.work);
        let failure = result.as_ref().err().cloned();
        let reply = self.reply;
        let finish: Finish = Box::new(move |commit: Result<()>| {
            // The caller may have gone away; its answer then has nobody to go to.
            let _ = reply.send(commit.and(result));
        });
        (finish, failure)
    }

    fn refuse(self: Box<Self>, error: Error) {
        let _ = self.reply.send(Err(error));
    }
}

pub(crate) struct SqliteStore {
    jobs: mpsc::Sender<Box<dyn Job>>,
    readers: Arc<ReaderPool>,
    /// The folder of the database, whose free space the write probe checks.
    folder: PathBuf,
    /// Where the writer hands on what each commit changed.
    changes: Changes,
    /// What group commit gathered.
    batches: Arc<BatchCounts>,
    /// Held for the life of the store: the operating system drops the lock when the process dies,
    /// so a killed node never leaves the database locked.
    _node_lock: File,
}

struct ReaderPool {
    connections: Mutex<Vec<Connection>>,
    permits: Semaphore,
}

impl SqliteStore {
    pub(crate) fn open(path: &Path, options: &StoreOptions) -> Result<Self> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            // The database holds password hashes and results: its folder is the node's alone.
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| {
                    Error::Unavailable(format!("cannot create {}: {e}", parent.display()))
                })?;
        }
        let node_lock = lock_node(path, &options.holder)?;
        let writer = open_connection(path)?;
        // The writer's temporary storage is in memory, which keeps each job's savepoint journal
        // off the disk: it only ever serves a rollback inside the open transaction. (Readers keep
        // the default: a large sort of theirs may spill to a file.)
        writer.execute_batch("PRAGMA temp_store = MEMORY;")?;
        writer.execute_batch(changes::TABLE)?;
        let checkpoints = checkpoint::Checkpoints::start(
            path,
            &writer,
            options.wal_checkpoint_pages,
            options.wal_pages_max,
        )?;
        let changes = Changes::new();
        let announce = changes.clone();
        let readers = (0..options.pool_size.max(1))
            .map(|_| open_connection(path))
            .collect::<Result<Vec<_>>>()?;
        let (jobs, queue) = mpsc::channel(options.write_queue_max.max(1));
        let batch_max = options.write_batch_max.max(1);
        let batches = Arc::new(BatchCounts::default());
        let counts = Arc::clone(&batches);
        std::thread::Builder::new()
            .name("reins-sqlite-writer".into())
            .spawn(move || {
                let writer = Writer {
                    connection: writer,
                    batch_max,
                    announce: &announce,
                    counts: &counts,
                };
                writer.run(queue, checkpoints);
            })
            .map_err(|e| Error::Unavailable(format!("cannot start the sqlite writer: {e}")))?;
        Ok(SqliteStore {
            jobs,
            readers: Arc::new(ReaderPool {
                permits: Semaphore::new(readers.len()),
                connections: Mutex::new(readers),
            }),
            folder: path
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf(),
            changes,
            batches,
            _node_lock: node_lock,
        })
    }

    pub(crate) fn write_batches(&self) -> (u64, u64) {
        self.batches.load()
    }

    pub(crate) fn changes(&self) -> Changes {
        self.changes.clone()
    }

    /// Runs `work` on the writer thread inside a savepoint; answers after the batch commits.
    async fn write<R: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job> = Box::new(PendingWrite { work, reply });
        self.jobs
            .send(job)
            .await
            .map_err(|_| Error::Unavailable("the sqlite writer has stopped".into()))?;
        answer.await.map_err(|_| {
            Error::OutcomeUnknown("the sqlite writer stopped before answering".into())
        })?
    }

    /// Runs `work` on a pooled read connection on a blocking thread.
    async fn read<R: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let readers = Arc::clone(&self.readers);
        let _permit = readers
            .permits
            .acquire()
            .await
            .map_err(|_| Error::Unavailable("the sqlite reader pool is closed".into()))?;
        let pool = Arc::clone(&readers);
        tokio::task::spawn_blocking(move || {
            let connection = pool
                .connections
                .lock()
                .map_err(|_| Error::Unavailable("the sqlite reader pool is poisoned".into()))?
                .pop()
                .ok_or_else(|| Error::Unavailable("no sqlite reader is free".into()))?;
            let result = work(&connection);
            if let Ok(mut connections) = pool.connections.lock() {
                connections.push(connection);
            }
            result
        })
        .await
        .map_err(|e| Error::Database(format!("sqlite read task failed: {e}")))?
    }

    pub(crate) async fn migrate(&self) -> Result<MigrationReport> {
        self.write(|connection| {
            connection.execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                     version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)",
            )?;
            let recorded = recorded_versions(connection)?;
            let mut applied = Vec::new();
            for migration in migrations::pending(&recorded)? {
                connection.execute_batch(migration.sqlite)?;
                connection
                    .prepare_cached(
                        "INSERT INTO schema_migrations VALUES (?1, ?2, unixepoch('subsec'))",
                    )?
                    .execute(params![migration.version, migration.name])?;
                applied.push(migration.version);
            }
            // The change bus's triggers name the migrated tables; they live on this (the
            // writer's) connection only.
            connection.execute_batch(changes::TRIGGERS)?;
            Ok(MigrationReport {
                applied,
                version: migrations::SCHEMA_VERSION,
            })
        })
        .await
    }

    pub(crate) async fn schema_version(&self) -> Result<i64> {
        self.read(|connection| {
            let exists: bool = connection
                .prepare_cached(
                    "SELECT count(*) > 0 FROM sqlite_master WHERE name = 'schema_migrations'",
                )?
                .query_row([], |row| row.get(0))?;
            if !exists {
                return Ok(0);
            }
            Ok(recorded_versions(connection)?
                .into_iter()
                .max()
                .unwrap_or(0))
        })
        .await
    }

    pub(crate) async fn write_probe(&self) -> Result<()> {
        // A write that failed for a full disk leaves its frames' room at the end of the
        // write-ahead log, so a small write succeeds there while the disk is still full: only
        // free space on the file system tells that bigger writes will fit again.
        let free = free_bytes(&self.folder)?;
        if free < DISK_FREE_MIN {
            return Err(Error::DiskFull(format!(
                "{free} bytes free in {}, fewer than {DISK_FREE_MIN}",
                self.folder.display()
            )));
        }
        self.write(|connection| {
            // Rewrites the newest migration's row unchanged: a write that always needs new space
            // on disk (a page in the write-ahead log).
            run(
                connection,
                "UPDATE schema_migrations SET name = name
                  WHERE version = (SELECT max(version) FROM schema_migrations)",
            )?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn backup(&self, destination: &Path) -> Result<BackupReport> {
        let destination = destination.to_path_buf();
        self.read(move |connection| backup::copy(connection, &destination))
            .await
    }

    pub(crate) async fn now(&self) -> Result<f64> {
        self.read(now_on).await
    }

    pub(crate) async fn acquire_lease(
        &self,
        resource_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Option<Lease>> {
        let (resource_id, owner) = (resource_id.to_owned(), owner.to_owned());
        self.write(move |connection| {
            let granted = connection
                .prepare_cached(
                    "INSERT INTO extension_execution_leases AS l
                             (resource_id, owner, epoch, expires_at)
                         VALUES (?1, ?2, 1, unixepoch('subsec') + ?3)
                         ON CONFLICT (resource_id) DO UPDATE
                            SET owner = excluded.owner, epoch = l.epoch + 1,
                                expires_at = unixepoch('subsec') + ?3
                          WHERE l.expires_at <= unixepoch('subsec')
                         RETURNING epoch, expires_at",
                )?
                .query_row(params![resource_id, owner, ttl_seconds(lease_ms)], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })
                .optional()?;
            Ok(granted.map(|(epoch, expires_at)| Lease {
                resource_id,
                owner,
                epoch,
                expires_at,
            }))
        })
        .await
    }

    pub(crate) async fn renew_lease(&self, fence: &Fence, lease_ms: u64) -> Result<(Lease, f64)> {
        let fence = fence.clone();
        self.write(move |connection| {
            let renewed: Option<(f64, f64)> = connection
                .prepare_cached(
                    "UPDATE extension_execution_leases
                            SET expires_at = max(expires_at, unixepoch('subsec') + ?4)
                          WHERE resource_id = ?1 AND owner = ?2 AND epoch = ?3
                            AND expires_at > unixepoch('subsec')
                         RETURNING expires_at, unixepoch('subsec')",
                )?
                .query_row(
                    params![
                        fence.resource_id,
                        fence.owner,
                        fence.epoch,
                        ttl_seconds(lease_ms)
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()?;
            match renewed {
                Some((expires_at, now)) => Ok((
                    Lease {
                        resource_id: fence.resource_id,
                        owner: fence.owner,
                        epoch: fence.epoch,
                        expires_at,
                    },
                    now,
                )),
                None => Err(fence.lost()),
            }
        })
        .await
    }

    pub(crate) async fn release_lease(&self, fence: &Fence) -> Result<bool> {
        let fence = fence.clone();
        self.write(move |connection| {
            let released = connection
                .prepare_cached(
                    "UPDATE extension_execution_leases SET expires_at = unixepoch('subsec')
                      WHERE resource_id = ?1 AND owner = ?2 AND epoch = ?3
                        AND expires_at > unixepoch('subsec')",
                )?
                .execute(params![fence.resource_id, fence.owner, fence.epoch])?;
            Ok(released == 1)
        })
        .await
    }

    pub(crate) async fn read_lease(&self, resource_id: &WorkflowId) -> Result<Option<Lease>> {
        let resource_id = resource_id.to_owned();
        self.read(move |connection| lease_on(connection, &resource_id))
            .await
    }

    pub(crate) async fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> Result<()> {
        let fence = fence.clone();
        let ops: Vec<Encoded> = ops.into_iter().map(Encoded::new).collect();
        self.write(move |connection| {
            check_fence(connection, &fence)?;
            for op in &ops {
                apply(connection, &fence, op)?;
            }
            Ok(())
        })
        .await
    }

    pub(crate) async fn read_workflow(
        &self,
        workflow_id: &WorkflowId,
    ) -> Result<Option<WorkflowRow>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| workflow_on(connection, &workflow_id))
            .await
    }

    pub(crate) async fn read_steps(&self, workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| steps_on(connection, &workflow_id))
            .await
    }

    /// A workflow with its lease, first steps, checkpoints, controls, asking runs and first
    /// artifact versions, read in one read transaction.
    pub(crate) async fn read_snapshot(
        &self,
        workflow_id: &WorkflowId,
        steps_max: u32,
        artifacts_max: u32,
    ) -> Result<Option<Snapshot>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| {
            let snapshot = connection.unchecked_transaction()?;
            let Some(row) = workflow_on(&snapshot, &workflow_id)? else {
                return Ok(None);
            };
            let StepPage {
                steps,
                approval_runs,
            } = step_page_on(&snapshot, &workflow_id, StepPosition::START, steps_max)?;
            let retried_by = snapshot
                .prepare_cached("SELECT workflow FROM workflow_retries WHERE retry_of = ?1")?
                .query_row([&workflow_id], |row| row.get(0))
                .optional()?;
            let waits = waits_on(&snapshot, &workflow_id, row.status)?;
            Ok(Some(Snapshot {
                row,
                lease: lease_on(&snapshot, &workflow_id)?,
                db_now: now_on(&snapshot)?,
                retried_by,
                steps,
                checkpoints: checkpoints_on(&snapshot, &workflow_id)?,
                controls: workflows::controls_on(&snapshot, &workflow_id)?,
                approval_runs,
                artifacts: artifact_page_on(&snapshot, &workflow_id, 0, artifacts_max)?,
                waits,
            }))
        })
        .await
    }

    /// A page of steps with the runs that asked, in one read transaction.
    pub(crate) async fn read_step_page(
        &self,
        workflow_id: &WorkflowId,
        after: StepPosition,
        limit: u32,
    ) -> Result<StepPage> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| {
            let page = connection.unchecked_transaction()?;
            step_page_on(&page, &workflow_id, after, limit)
        })
        .await
    }

    pub(crate) async fn read_artifact_page(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<ArtifactInfo>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| artifact_page_on(connection, &workflow_id, after, limit))
            .await
    }

    pub(crate) async fn read_artifact(
        &self,
        workflow_id: &WorkflowId,
        version: i64,
    ) -> Result<Option<ArtifactRow>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(
                    "SELECT version, source_step_id, path, content, sha256 FROM workflow_artifacts
                      WHERE workflow = ?1 AND version = ?2",
                )?
                .query_row(params![workflow_id, version], |row| {
                    Ok(ArtifactRow {
                        version: row.get(0)?,
                        source_step_id: row.get(1)?,
                        path: row.get(2)?,
                        content: row.get(3)?,
                        sha256: row.get(4)?,
                    })
                })
                .optional()?)
        })
        .await
    }

    pub(crate) async fn last_artifact_version(&self, workflow_id: &WorkflowId) -> Result<i64> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| {
            Ok(connection
                .prepare_cached(
                    "SELECT coalesce(max(version), 0) FROM workflow_artifacts WHERE workflow = ?1",
                )?
                .query_row([&workflow_id], |row| row.get(0))?)
        })
        .await
    }

    pub(crate) async fn register_node(&self, node: &NodeRecord) -> Result<()> {
        let node = node.clone();
        self.write(move |connection| {
            connection
                .prepare_cached(
                    "INSERT INTO nodes (worker_id, host, pid, version, started_at)
                     VALUES (?1, ?2, ?3, ?4, unixepoch('subsec'))",
                )?
                .execute(params![node.worker_id, node.host, node.pid, node.version])?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn mark_node_stopped(&self, worker_id: &str) -> Result<()> {
        let worker_id = worker_id.to_owned();
        self.write(move |connection| {
            connection
                .prepare_cached(
                    "UPDATE nodes SET stopped_at = unixepoch('subsec') WHERE worker_id = ?1",
                )?
                .execute([&worker_id])?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn list_nodes(&self, limit: u32) -> Result<Vec<NodeRecord>> {
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT worker_id, host, pid, version, started_at, stopped_at FROM nodes
                  ORDER BY started_at DESC, worker_id LIMIT ?1",
            )?;
            let rows = statement.query_map([limit], |row| {
                Ok(NodeRecord {
                    worker_id: row.get(0)?,
                    host: row.get(1)?,
                    pid: row.get(2)?,
                    version: row.get(3)?,
                    started_at: row.get(4)?,
                    stopped_at: row.get(5)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }
}

/// Fails with [`Error::LeaseLost`] unless `fence` holds its unexpired lease. Inside the writer's
/// `IMMEDIATE` transaction no takeover can commit before this transaction does.
pub(super) fn check_fence(connection: &Connection, fence: &Fence) -> Result<()> {
    let holds: bool = connection
        .prepare_cached(
            "SELECT count(*) = 1 FROM extension_execution_leases
              WHERE resource_id = ?1 AND owner = ?2 AND epoch = ?3
                AND expires_at > unixepoch('subsec')",
        )?
        .query_row(
            params![fence.resource_id, fence.owner, fence.epoch],
            |row| row.get(0),
        )?;
    if holds { Ok(()) } else { Err(fence.lost()) }
}

/// A write op whose JSON is already text. Encoding (and dropping the document) happens on the
/// caller's thread, so the single writer, which every write of the node waits for, only binds.
pub(super) struct Encoded {
    /// The op, its `data` document left `Null` once encoded.
    op: WriteOp,
    /// The `data` document of a `SetWorkflow` or `PutStep`, as JSON text.
    data: String,
}

impl Encoded {
    pub(super) fn new(mut op: WriteOp) -> Encoded {
        let data = match &mut op {
            WriteOp::SetWorkflow { data, .. } => std::mem::take(data).to_string(),
            WriteOp::PutStep { record, .. } => record.encode().to_string(),
            _ => String::new(),
        };
        Encoded { op, data }
    }
}

/// Applies one ownership-dependent change; `fence` has already been checked in this
/// transaction. One function per kind of write.
pub(super) fn apply(connection: &Connection, fence: &Fence, encoded: &Encoded) -> Result<()> {
    let data = &encoded.data;
    match &encoded.op {
        WriteOp::SetWorkflow {
            workflow_id,
            status,
            data: _,
        } => set_workflow(connection, workflow_id, status, data),
        WriteOp::PutStep {
            workflow_id,
            seq,
            step_id,
            attempt,
            status,
            record,
        } => put_step(
            connection,
            workflow_id,
            *seq,
            step_id,
            *attempt,
            status,
            record,
            data,
        ),
        WriteOp::MarkControlApplied { control_id } => mark_control_applied(connection, *control_id),
        WriteOp::TakeEvent {
            workflow_id,
            seq,
            step_id,
        } => take_event(connection, workflow_id, *seq, step_id),
        WriteOp::PutArtifact {
            workflow_id,
            version,
            source_step_id,
            path,
            content,
            sha256,
        } => put_artifact(
            connection,
            workflow_id,
            *version,
            source_step_id,
            path.as_deref(),
            content,
            sha256,
        ),
        WriteOp::ReleaseSlot {
            workflow_id,
            step_id,
        } => release_slot(connection, workflow_id, step_id),
        WriteOp::CloseStepRuns {
            idempotency_key, ..
        } => close_step_runs(connection, idempotency_key),
        WriteOp::CancelRuns { workflow_id } => cancel_runs(connection, workflow_id),
        WriteOp::TakePlaces {
            user_id,
            max_workflows,
            max_workflows_per_owner,
            ..
        } => take_places(
            connection,
            user_id,
            *max_workflows,
            *max_workflows_per_owner,
        ),
        WriteOp::ReleaseSlots { workflow_id } => release_slots(connection, workflow_id),
        WriteOp::TakeStorage {
            workflow_id,
            bytes,
            bytes_max,
        } => take_storage(connection, workflow_id, *bytes, *bytes_max),
        WriteOp::ReturnStorage { workflow_id } => return_storage(connection, workflow_id),
        WriteOp::PutLogs {
            workflow_id,
            lines,
            events_max,
            bytes_max,
        } => events::put_logs(connection, workflow_id, lines, *events_max, *bytes_max),
        WriteOp::ReleaseLease => release_lease(connection, fence),
        WriteOp::GoDormant {
            workflow_id,
            wake_at_ms,
            event_names,
        } => go_dormant(connection, fence, workflow_id, *wake_at_ms, event_names),
    }
}

/// [`WriteOp::SetWorkflow`]: the workflow's status and data document (`data`, encoded); a
/// workflow that does not exist is `NotFound`.
fn set_workflow(
    connection: &Connection,
    workflow_id: &WorkflowId,
    status: &WorkflowStatus,
    data: &str,
) -> Result<()> {
    let changed = connection
        .prepare_cached(
            "UPDATE workflows SET status = ?2, data = ?3, updated_at = unixepoch('subsec')
              WHERE id = ?1",
        )?
        .execute(params![workflow_id, status, data])?;
    if changed != 1 {
        return Err(Error::NotFound(format!("workflow {workflow_id:?}")));
    }
    Ok(())
}

/// [`WriteOp::PutStep`]: inserts or replaces the step attempt's row, its record encoded in
/// `data`.
#[allow(clippy::too_many_arguments)] // the row's columns, as the write names them
fn put_step(
    connection: &Connection,
    workflow_id: &WorkflowId,
    seq: i32,
    step_id: &str,
    attempt: i32,
    status: &StepStatus,
    record: &StepRecord,
    data: &str,
) -> Result<()> {
    connection
        .prepare_cached(
            "INSERT INTO workflow_steps (workflow, step_id, attempt, kind, status, data,
                                         seq, created_at, updated_at, error_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, unixepoch('subsec'), unixepoch('subsec'),
                     ?8)
             ON CONFLICT (workflow, step_id, attempt) DO UPDATE
                SET kind = excluded.kind, status = excluded.status,
                    data = excluded.data, seq = excluded.seq,
                    updated_at = excluded.updated_at,
                    error_bytes = excluded.error_bytes",
        )?
        .execute(params![
            workflow_id,
            step_id,
            attempt,
            record.kind(),
            status,
            data,
            seq,
            record.error_bytes()
        ])?;
    Ok(())
}

/// [`WriteOp::MarkControlApplied`]: the control is carried out (once: a repeat changes nothing).
fn mark_control_applied(connection: &Connection, control_id: i64) -> Result<()> {
    connection
        .prepare_cached(
            "UPDATE workflow_controls SET applied_at = unixepoch('subsec')
              WHERE id = ?1 AND applied_at IS NULL",
        )?
        .execute(params![control_id])?;
    Ok(())
}

/// [`WriteOp::TakeEvent`]: the step takes the event, unless another step took it or it does
/// not exist (`NotFound`); the same step taking it again is a repeat.
fn take_event(
    connection: &Connection,
    workflow_id: &WorkflowId,
    seq: i64,
    step_id: &str,
) -> Result<()> {
    let taken = connection
        .prepare_cached(
            "UPDATE sent_events SET taken_by = ?3, taken_at = unixepoch('subsec')
              WHERE workflow = ?1 AND seq = ?2 AND (taken_by IS NULL OR taken_by = ?3)",
        )?
        .execute(params![workflow_id, seq, step_id])?;
    if taken != 1 {
        return Err(Error::NotFound(format!(
            "event {seq} of workflow {workflow_id:?} untaken"
        )));
    }
    Ok(())
}

/// [`WriteOp::PutArtifact`]: a new artifact version (one that exists is a conflict).
fn put_artifact(
    connection: &Connection,
    workflow_id: &WorkflowId,
    version: i64,
    source_step_id: &str,
    path: Option<&str>,
    content: &[u8],
    sha256: &str,
) -> Result<()> {
    connection
        .prepare_cached(
            "INSERT INTO workflow_artifacts (workflow, version, source_step_id, path,
                                             content, bytes, sha256, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, unixepoch('subsec'))",
        )?
        .execute(params![
            workflow_id,
            version,
            source_step_id,
            path,
            content,
            i64::try_from(content.len()).unwrap_or(i64::MAX),
            sha256
        ])?;
    Ok(())
}

/// [`WriteOp::ReleaseSlot`]: frees the slot the step holds, if it holds one.
fn release_slot(connection: &Connection, workflow_id: &WorkflowId, step_id: &str) -> Result<()> {
    connection
        .prepare_cached("DELETE FROM workflow_slots WHERE workflow = ?1 AND step_id = ?2")?
        .execute(params![workflow_id, step_id])?;
    Ok(())
}

/// [`WriteOp::CloseStepRuns`]: the step attempt's live child runs become `interrupted`
/// (`reconciled`).
fn close_step_runs(connection: &Connection, idempotency_key: &str) -> Result<()> {
    connection
        .prepare_cached(
            "UPDATE runs SET status = 'interrupted', stop_reason = 'reconciled',
                    error = 'closed by reconcile', revision = revision + 1,
                    updated_at = unixepoch('subsec')
              WHERE idempotency_key = ?1
                AND status IN ('pending', 'running', 'waiting_for_input')",
        )?
        .execute(params![idempotency_key])?;
    Ok(())
}

/// [`WriteOp::CancelRuns`]: asks the workflow's live child runs to stop (one waiting for input
/// is interrupted at once), each once.
fn cancel_runs(connection: &Connection, workflow_id: &WorkflowId) -> Result<()> {
    connection
        .prepare_cached(
            "UPDATE runs SET cancel_action = coalesce(cancel_action, 'interrupt'),
                    status = CASE status WHEN 'waiting_for_input' THEN 'interrupted'
                                         ELSE status END,
                    revision = revision + 1, updated_at = unixepoch('subsec')
              WHERE workflow = ?1
                AND status IN ('pending', 'running', 'waiting_for_input')
                AND cancel_action IS NULL",
        )?
        .execute(params![workflow_id])?;
    Ok(())
}

/// [`WriteOp::TakePlaces`]: refused (`LimitReached`) when the live workflows, in all or of the
/// user, are at their limit.
fn take_places(
    connection: &Connection,
    user_id: &str,
    max_workflows: i64,
    max_workflows_per_owner: i64,
) -> Result<()> {
    // The counts kept by triggers (migrations 11 and 15) are exact inside the writer's
    // transaction; the workflow itself, in needs_reconciliation, is not among them.
    let total: i64 = connection
        .prepare_cached("SELECT live FROM live_workflows_total WHERE id = 1")?
        .query_row([], |row| row.get(0))?;
    if total >= max_workflows {
        return Err(Error::LimitReached(crate::Limit::Workflows));
    }
    let mine: i64 = connection
        .prepare_cached("SELECT live FROM live_workflows_by_user WHERE user_id = ?1")?
        .query_row([user_id], |row| row.get(0))
        .optional()?
        .unwrap_or(0);
    if mine >= max_workflows_per_owner {
        return Err(Error::LimitReached(crate::Limit::WorkflowsPerOwner));
    }
    Ok(())
}

/// [`WriteOp::ReleaseSlots`]: frees every slot the workflow holds.
fn release_slots(connection: &Connection, workflow_id: &WorkflowId) -> Result<()> {
    connection
        .prepare_cached("DELETE FROM workflow_slots WHERE workflow = ?1")?
        .execute(params![workflow_id])?;
    Ok(())
}

/// [`WriteOp::ReleaseLease`]: the fence's lease expires now.
fn release_lease(connection: &Connection, fence: &Fence) -> Result<()> {
    connection
        .prepare_cached(
            "UPDATE extension_execution_leases SET expires_at = unixepoch('subsec')
              WHERE resource_id = ?1 AND owner = ?2 AND epoch = ?3",
        )?
        .execute(params![fence.resource_id, fence.owner, fence.epoch])?;
    Ok(())
}

/// [`WriteOp::GoDormant`]: the workflow sleeps in the store until its wake time, or at once
/// when a control or an awaited event is already there; its lease is let go until then.
fn go_dormant(
    connection: &Connection,
    fence: &Fence,
    workflow_id: &WorkflowId,
    wake_at_ms: Option<i64>,
    event_names: &[String],
) -> Result<()> {
    // The one writer orders this after every control and event recorded before it.
    let names =
        serde_json::to_string(event_names).map_err(|error| Error::Database(error.to_string()))?;
    let wake_at: f64 = connection
        .prepare_cached(
            "SELECT CASE WHEN EXISTS (SELECT 1 FROM workflow_controls
                                       WHERE workflow = ?1 AND applied_at IS NULL)
                           OR EXISTS (SELECT 1 FROM sent_events
                                       WHERE workflow = ?1 AND taken_by IS NULL
                                         AND name IN (SELECT value FROM json_each(?2)))
                         THEN unixepoch('subsec') ELSE ?3 END",
        )?
        .query_row(
            params![workflow_id, names, crate::write::dormant_wake_s(wake_at_ms)],
            |row| row.get(0),
        )?;
    connection
        .prepare_cached(
            "UPDATE workflows SET dormant = 1, wake_at = ?2, wake_on_events = ?3
              WHERE id = ?1",
        )?
        .execute(params![workflow_id, wake_at, names])?;
    connection
        .prepare_cached(
            "UPDATE extension_execution_leases SET expires_at = ?4, owner = ''
              WHERE resource_id = ?1 AND owner = ?2 AND epoch = ?3",
        )?
        .execute(params![
            fence.resource_id,
            fence.owner,
            fence.epoch,
            wake_at
        ])?;
    Ok(())
}

/// [`WriteOp::TakeStorage`]: the one writer orders grants, so the owner's stored bytes read here
/// are the ones the grant adds to. What the owner's ended workflows gave back is counted off
/// first.
pub(super) fn take_storage(
    connection: &Connection,
    workflow_id: &WorkflowId,
    bytes: i64,
    bytes_max: i64,
) -> Result<()> {
    let user_id: String = connection
        .prepare_cached("SELECT user_id FROM workflows WHERE id = ?1")?
        .query_row([workflow_id], |row| row.get(0))
        .optional()?
        .ok_or_else(|| Error::NotFound(format!("workflow {workflow_id:?}")))?;
    let (granted, returned): (i64, i64) = connection
        .prepare_cached(
            "SELECT coalesce((SELECT stored_bytes FROM user_storage WHERE user_id = ?1), 0),
                    coalesce((SELECT sum(returned_bytes) FROM workflow_storage
                               WHERE user_id = ?1 AND returned_bytes > 0), 0)",
        )?
        .query_row([&user_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
    let stored = granted - returned;
    if bytes_max > 0 && stored.saturating_add(bytes) > bytes_max {
        return Err(Error::LimitReached(crate::Limit::StoredBytes {
            stored,
            max: bytes_max,
        }));
    }
    connection
        .prepare_cached(
            "UPDATE workflow_storage SET granted_bytes = granted_bytes - returned_bytes,
                                         returned_bytes = 0
              WHERE user_id = ?1 AND returned_bytes > 0",
        )?
        .execute([&user_id])?;
    connection
        .prepare_cached(
            "INSERT INTO user_storage (user_id, stored_bytes) VALUES (?1, ?2)
             ON CONFLICT (user_id) DO UPDATE SET stored_bytes = excluded.stored_bytes",
        )?
        .execute(params![user_id, stored + bytes])?;
    connection
        .prepare_cached(
            "INSERT INTO workflow_storage (workflow, user_id, granted_bytes) VALUES (?1, ?2, ?3)
             ON CONFLICT (workflow) DO UPDATE
                SET granted_bytes = granted_bytes + excluded.granted_bytes",
        )?
        .execute(params![workflow_id, user_id, bytes])?;
    Ok(())
}

/// [`WriteOp::ReturnStorage`]: what the grant holds beyond the workflow's artifacts, errors,
/// events and copied workspaces; only the workflow's own row is written.
fn return_storage(connection: &Connection, workflow_id: &WorkflowId) -> Result<()> {
    connection
        .prepare_cached(
            "UPDATE workflow_storage
                SET returned_bytes = max(granted_bytes - copied_bytes
                        - coalesce((SELECT sum(a.bytes) FROM workflow_artifacts a
                                     WHERE a.workflow = ?1), 0)
                        - coalesce((SELECT sum(s.error_bytes) FROM workflow_steps s
                                     WHERE s.workflow = ?1), 0)
                        - coalesce((SELECT sum(e.payload_bytes) FROM sent_events e
                                     WHERE e.workflow = ?1), 0), 0)
              WHERE workflow = ?1",
        )?
        .execute([workflow_id])?;
    Ok(())
}

pub(super) fn parse_json(text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| Error::Database(format!("stored JSON is invalid: {e}")))
}

fn recorded_versions(connection: &Connection) -> Result<Vec<i64>> {
    let mut statement = connection.prepare("SELECT version FROM schema_migrations")?;
    let versions = statement.query_map([], |row| row.get(0))?;
    Ok(versions.collect::<rusqlite::Result<Vec<i64>>>()?)
}

/// The free space the database's file system needs before the write probe tries a write.
const DISK_FREE_MIN: u64 = 1 << 20;

/// The bytes an unprivileged process may still write on the file system holding `folder`.
fn free_bytes(folder: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let unavailable = |e: std::io::Error| {
        Error::Unavailable(format!(
            "cannot read the free space of {}: {e}",
            folder.display()
        ))
    };
    let path = std::ffi::CString::new(folder.as_os_str().as_bytes())
        .map_err(|e| unavailable(std::io::Error::other(e)))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string and `stats` a buffer of the type statvfs(3)
    // fills; it is read only after the call reported success.
    let stats = unsafe {
        if libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return Err(unavailable(std::io::Error::last_os_error()));
        }
        stats.assume_init()
    };
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// Prepared statements kept per connection. The writer runs every write statement of the store
/// (about seventy); with rusqlite's default of 16 it re-parsed most of them on every job.
const STATEMENT_CACHE_CAPACITY: usize = 256;

fn open_connection(path: &Path) -> Result<Connection> {
    let connection = Connection::open(path)
        .map_err(|e| Error::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    // WAL lets readers run beside the writer; FULL makes every acknowledged commit durable, which
    // is what "persisted" means everywhere in reins.
    connection.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA busy_timeout = 5000;",
    )?;
    connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE_CAPACITY);
    Ok(connection)
}

/// Takes the node lock beside the database, or names the node that holds it.
fn lock_node(database: &Path, holder: &str) -> Result<File> {
    let mut lock_path = PathBuf::from(database);
    lock_path.as_mut_os_string().push(".node-lock");
    let unavailable =
        |e: std::io::Error| Error::Unavailable(format!("cannot use {}: {e}", lock_path.display()));
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(unavailable)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut current = String::new();
            // The holder's name is a courtesy for the message; an unreadable one is still a refusal.
            let _ = file.read_to_string(&mut current);
            return Err(Error::NodeLockHeld {
                path: database.display().to_string(),
                holder: current.trim().to_string(),
            });
        }
        Err(TryLockError::Error(e)) => return Err(unavailable(e)),
    }
    file.set_len(0).map_err(unavailable)?;
    file.rewind().map_err(unavailable)?;
    file.write_all(holder.as_bytes()).map_err(unavailable)?;
    Ok(file)
}

/// Runs `work` in a savepoint: its writes stay if it succeeds and vanish if it fails, without
/// touching the other jobs of the batch. Some failures (a full disk, an I/O error) make SQLite
/// roll back the whole transaction instead; the writer then sees no transaction left.
fn in_savepoint<R>(
    connection: &Connection,
    work: impl FnOnce(&Connection) -> Result<R>,
) -> Result<R> {
    run(connection, "SAVEPOINT job")?;
    let result = work(connection);
    if connection.is_autocommit() {
        return result;
    }
    if result.is_err() {
        run(connection, "ROLLBACK TO job")?;
    }
    run(connection, "RELEASE job")?;
    result
}

/// Runs one parameterless statement through the statement cache.
fn run(connection: &Connection, sql: &str) -> rusqlite::Result<()> {
    connection.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// The writer thread: one transaction per batch of queued jobs, answered after the commit.
struct Writer<'a> {
    connection: Connection,
    batch_max: usize,
    announce: &'a Changes,
    counts: &'a BatchCounts,
}

impl Writer<'_> {
    /// Commits batches until the store is dropped. Checkpoints run on their own thread (see
    /// `checkpoint`), stopped before the writer's connection closes.
    fn run(
        self,
        mut queue: mpsc::Receiver<Box<dyn Job>>,
        mut checkpoints: checkpoint::Checkpoints,
    ) {
        while let Some(first) = queue.blocking_recv() {
            // After the answers: a checkpoint the writer runs itself delays the next batch only.
            if self.batch(first, &mut queue) {
                checkpoints.committed(&self.connection);
            }
        }
        drop(checkpoints);
    }

    /// Runs `first`, then each job that is queued by the time the one before it has run (up to
    /// `batch_max` in all), in one transaction, and answers each once the commit's outcome is
    /// known. A job that queues while the batch runs joins it instead of waiting for the next
    /// commit: the batch grows with the load, and costs no wait when there is none. Returns
    /// whether it committed.
    fn batch(&self, first: Box<dyn Job>, queue: &mut mpsc::Receiver<Box<dyn Job>>) -> bool {
        let connection = &self.connection;
        if let Err(e) = run(connection, "BEGIN IMMEDIATE") {
            first.refuse(Error::from(e));
            return false;
        }
        let mut finishes = Vec::new();
        let mut next = Some(first);
        let mut ended = None;
        while let Some(job) = next.take() {
            let (finish, failure) = job.run(connection);
            finishes.push(finish);
            if connection.is_autocommit() {
                // SQLite rolled the whole transaction back (a full disk does that): nothing of
                // the batch was written, so every job of it hears why. Those still queued run
                // in the next batch.
                ended = Some(failure.unwrap_or_else(|| {
                    Error::Database("the sqlite transaction ended before its commit".into())
                }));
                break;
            }
            if finishes.len() < self.batch_max {
                next = queue.try_recv().ok();
            }
        }
        self.counts.record(finishes.len());
        let commit = match ended {
            Some(error) => Err(error),
            None => {
                // What the batch changed, taken inside its transaction; a cue is never worth
                // failing a batch over, so a failed drain is logged and the batch commits.
                let payloads = changes::drain(connection).unwrap_or_else(|error| {
                    tracing::warn!(%error, "cannot collect the batch's changes");
                    Vec::new()
                });
                let commit = commit_batch(connection);
                if commit.is_ok() {
                    for payload in &payloads {
                        self.announce.send_payload(payload);
                    }
                }
                commit
            }
        };
        let committed = commit.is_ok();
        for finish in finishes {
            finish(commit.clone());
        }
        committed
    }
}

/// Commits the batch's transaction, or rolls it back if the commit failed (a full disk may have
/// refused the write-ahead log's growth) and SQLite left it open.
fn commit_batch(connection: &Connection) -> Result<()> {
    run(connection, "COMMIT").map_err(|e| {
        let error = Error::from(e);
        if !connection.is_autocommit()
            && let Err(rollback) = run(connection, "ROLLBACK")
        {
            tracing::error!(%rollback, "sqlite rollback after a failed commit failed");
        }
        error
    })
}

fn now_on(connection: &Connection) -> Result<f64> {
    Ok(connection
        .prepare_cached("SELECT unixepoch('subsec')")?
        .query_row([], |r| r.get(0))?)
}

fn lease_on(connection: &Connection, resource_id: &WorkflowId) -> Result<Option<Lease>> {
    Ok(connection
        .prepare_cached(
            "SELECT owner, epoch, expires_at FROM extension_execution_leases WHERE resource_id = ?1",
        )?
        .query_row([resource_id], |row| {
            Ok(Lease {
                resource_id: resource_id.to_owned(),
                owner: row.get(0)?,
                epoch: row.get(1)?,
                expires_at: row.get(2)?,
            })
        })
        .optional()?)
}

fn workflow_on(connection: &Connection, workflow_id: &WorkflowId) -> Result<Option<WorkflowRow>> {
    let row = connection
        .prepare_cached(
            "SELECT user_id, status, owner, fingerprint, data, created_at, updated_at
               FROM workflows WHERE id = ?1",
        )?
        .query_row([workflow_id], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, String>(4)?,
                row.get::<_, f64>(5)?,
                row.get::<_, f64>(6)?,
            ))
        })
        .optional()?;
    row.map(
        |(user_id, status, owner, fingerprint, data, created_at, updated_at)| {
            Ok(WorkflowRow {
                workflow_id: workflow_id.to_owned(),
                user_id,
                status: WorkflowStatus::read(&status, workflow_id)?,
                owner,
                fingerprint,
                data: parse_json(&data)?,
                created_at,
                updated_at,
            })
        },
    )
    .transpose()
}

/// At most `limit` of a workflow's artifact versions above `after` (without their content),
/// oldest first (the primary key's order).
fn artifact_page_on(
    connection: &Connection,
    workflow_id: &WorkflowId,
    after: i64,
    limit: u32,
) -> Result<Vec<ArtifactInfo>> {
    let mut statement = connection.prepare_cached(
        "SELECT version, source_step_id, path, bytes, sha256, created_at FROM workflow_artifacts
          WHERE workflow = ?1 AND version > ?2 ORDER BY version LIMIT ?3",
    )?;
    let rows = statement.query_map(params![workflow_id, after, limit], |row| {
        Ok(ArtifactInfo {
            version: row.get(0)?,
            source_step_id: row.get(1)?,
            path: row.get(2)?,
            bytes: row.get(3)?,
            sha256: row.get(4)?,
            created_at: row.get(5)?,
        })
    })?;
    Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
}

/// A page of steps and the runs that asked (see [`StepPage`]). The journal has no index by
/// `seq` (migration 27): the page's query reads the workflow's entries by the primary key and
/// keeps the first `limit` of them in SQLite's sorter, so its memory is the page's, and its time
/// grows with the journal (some 8 ms at 10,000 entries).
fn step_page_on(
    connection: &Connection,
    workflow_id: &WorkflowId,
    after: StepPosition,
    limit: u32,
) -> Result<StepPage> {
    // Each with when its child run was admitted (its row's `created_at`, by the runs' key).
    let mut statement = connection.prepare_cached(concat!(
        "SELECT step_id, attempt, kind, status, data, seq, created_at,
                (SELECT r.created_at FROM runs r
                  WHERE r.run_id = json_extract(workflow_steps.data, '$.run_id'))
                AS run_started_at
           FROM workflow_steps ",
        step_page!(),
        " ORDER BY seq, attempt LIMIT ?4"
    ))?;
    let page = params![workflow_id, after.seq, after.attempt, limit];
    let steps = steps_of(statement.query(page)?, workflow_id)?;
    Ok(StepPage {
        steps,
        approval_runs: runs::approval_runs_on(connection, workflow_id, after, limit)?,
    })
}

/// A workflow's checkpoints ([`crate::CHECKPOINT_KINDS`]) in journal order, from the partial
/// index of migration 30.
fn checkpoints_on(connection: &Connection, workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
    let mut statement = connection.prepare_cached(
        "SELECT step_id, attempt, kind, status, data, seq, created_at FROM workflow_steps
          WHERE workflow = ?1 AND kind IN ('pause', 'humanCheckpoint') ORDER BY seq, attempt",
    )?;
    steps_of(statement.query([workflow_id])?, workflow_id)
}

fn steps_on(connection: &Connection, workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
    let mut statement = connection.prepare_cached(
        "SELECT step_id, attempt, kind, status, data, seq, created_at FROM workflow_steps
          WHERE workflow = ?1 ORDER BY seq, attempt",
    )?;
    steps_of(statement.query([workflow_id])?, workflow_id)
}

/// Journal entries from rows of `step_id, attempt, kind, status, data, seq, created_at`, and
/// when a row has it, when its child run was admitted.
fn steps_of(mut rows: rusqlite::Rows<'_>, workflow_id: &WorkflowId) -> Result<Vec<StepRow>> {
    let mut steps = Vec::new();
    while let Some(row) = rows.next()? {
        // When its child run was admitted, in the reads that join it (the page's).
        let run_started_at = if row.as_ref().column_name(7) == Ok("run_started_at") {
            row.get(7)?
        } else {
            None
        };
        steps.push(step_of(row, workflow_id)?.with_run_started_at(run_started_at));
    }
    Ok(steps)
}

/// A journal entry from a row of `step_id, attempt, kind, status, data, seq, created_at`.
fn step_of(row: &rusqlite::Row<'_>, workflow_id: &WorkflowId) -> Result<StepRow> {
    let seq = row.get(5)?;
    let status: String = row.get(3)?;
    let kind: String = row.get(2)?;
    let data: String = row.get(4)?;
    let (step_id, attempt, created_at) = (row.get(0)?, row.get(1)?, row.get(6)?);
    let status = StepStatus::read(&status, workflow_id, seq)?;
    // A document that is not JSON this node can parse fails the whole read, as on
    // PostgreSQL (whose driver cannot decode it either): the record is unreadable, and the
    // inbox and lists skip it and say so. A JSON document that is no step record is one
    // row's problem (see `StepRow::record`).
    let data = parse_json(&data)?;
    Ok(StepRow::decoded(
        seq,
        step_id,
        attempt,
        status,
        (&kind, &data),
        created_at,
    ))
}

/// The columns and the predicate of a workflow's waits (see [`crate::WaitKind`]), as on
/// PostgreSQL: its unsettled entries that wait, an agent's running attempt only when its run
/// waits for a person.
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

/// A record's waits: none unless its status is one of [`crate::WAITING_STATUSES`].
fn waits_on(
    connection: &Connection,
    workflow_id: &WorkflowId,
    status: crate::WorkflowStatus,
) -> Result<Vec<StepRow>> {
    if !crate::WAITING_STATUSES.contains(&status) {
        return Ok(Vec::new());
    }
    let mut statement = connection.prepare_cached(waits_of!("s.workflow = ?1"))?;
    steps_of(statement.query([workflow_id])?, workflow_id)
}

/// The waits of a listing's page: of `workflows` (those of the page whose status is one of
/// [`crate::WAITING_STATUSES`]), in one statement, by workflow.
fn page_waits_on(
    connection: &Connection,
    workflows: &[&WorkflowId],
) -> Result<std::collections::HashMap<WorkflowId, Vec<StepRow>>> {
    let mut waits: std::collections::HashMap<WorkflowId, Vec<StepRow>> =
        std::collections::HashMap::new();
    if workflows.is_empty() {
        return Ok(waits);
    }
    let ids = serde_json::to_string(workflows)
        .map_err(|e| crate::Error::Database(format!("workflow ids as JSON: {e}")))?;
    let mut statement =
        connection.prepare_cached(waits_of!("s.workflow IN (SELECT value FROM json_each(?1))"))?;
    let mut rows = statement.query([ids])?;
    while let Some(row) = rows.next()? {
        let workflow_id: WorkflowId = row.get(7)?;
        let step = step_of(row, &workflow_id)?;
        waits.entry(workflow_id).or_default().push(step);
    }
    Ok(waits)
}

/// A database at `path` as the migrations below `version` left it (for the upgrade tests).
#[cfg(test)]
pub(crate) fn database_before(path: &std::path::Path, version: i64) -> Connection {
    let connection = Connection::open(path).expect("open");
    connection
        .execute_batch(
            "PRAGMA foreign_keys = ON;
             CREATE TABLE schema_migrations (
                 version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)",
        )
        .expect("schema_migrations");
    for migration in migrations::MIGRATIONS
        .iter()
        .filter(|m| m.version < version)
    {
        connection
            .execute_batch(migration.sqlite)
            .expect("migration");
        connection
            .execute(
                "INSERT INTO schema_migrations VALUES (?1, ?2, 0)",
                rusqlite::params![migration.version, migration.name],
            )
            .expect("record");
    }
    connection
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tmpfs of `size` mounted at `path`; unmounted when dropped, also when the test panics.
    struct Tmpfs(PathBuf);

    impl Tmpfs {
        fn mount(path: &Path, size: &str) -> Tmpfs {
            // SAFETY: geteuid(2) has no preconditions and touches no memory.
            let uid = unsafe { libc::geteuid() };
            assert_eq!(
                uid, 0,
                "this test mounts a small tmpfs to fill a disk for real, which needs root (or \
                 CAP_SYS_ADMIN); it runs as uid {uid}: run the tests as root (as CI does)"
            );
            std::fs::create_dir_all(path).expect("mount point");
            let mounted = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(path)
                .output()
                .expect("run mount");
            assert!(
                mounted.status.success(),
                "mounting a tmpfs at {} failed although the test runs as root (no CAP_SYS_ADMIN \
                 in this container?): {}",
                path.display(),
                String::from_utf8_lossy(&mounted.stderr)
            );
            Tmpfs(path.to_path_buf())
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let unmounted = std::process::Command::new("umount").arg(&self.0).status();
            if !matches!(unmounted, Ok(status) if status.success()) {
                // Still busy (the writer thread closing its connection): detach it instead.
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&self.0)
                    .status();
            }
        }
    }

    /// A write that runs `sql`, then holds the writer inside its batch's transaction until
    /// released, so that what queues meanwhile is taken after it. Returns the write, the signal
    /// that it holds the writer, and its release.
    fn holding_write<'a>(
        store: &'a SqliteStore,
        sql: &'static str,
    ) -> (
        impl Future<Output = Result<()>> + 'a,
        oneshot::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        let (entered, held) = oneshot::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let hold = store.write(move |c| {
            c.execute(sql, [])?;
            let _ = entered.send(());
            let _ = released.recv();
            Ok(())
        });
        (hold, held, release)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn jobs_queued_while_a_batch_runs_join_it_and_commit_with_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(&dir.path().join("reins.db"), &StoreOptions::default())
            .expect("open");
        store
            .write(|c| Ok(c.execute_batch("CREATE TABLE t (x INTEGER)")?))
            .await
            .expect("create");
        let before = store.write_batches();

        // A job holds the writer inside its batch's transaction while three more queue.
        let (hold, held, release) = holding_write(&store, "INSERT INTO t VALUES (0)");
        let queued = async {
            held.await.expect("the writer runs the holding job");
            let insert =
                |n: i64| store.write(move |c| Ok(c.execute("INSERT INTO t VALUES (?1)", [n])?));
            let go = async {
                release.send(()).expect("release the writer");
            };
            let (a, b, c, ()) = tokio::join!(insert(1), insert(2), insert(3), go);
            (a, b, c)
        };
        let (held, (a, b, c)) = tokio::join!(hold, queued);
        for answer in [held.map(|()| 1), a, b, c] {
            assert_eq!(answer.expect("each job commits"), 1);
        }
        let after = store.write_batches();
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1, 4),
            "the queued jobs joined the holder's batch"
        );
        let rows: i64 = store
            .read(|c| Ok(c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?))
            .await
            .expect("count");
        assert_eq!(rows, 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_that_a_full_disk_rolls_back_writes_nothing_and_every_job_hears_why() {
        let dir = tempfile::tempdir().expect("temp dir");
        let _tmpfs = Tmpfs::mount(&dir.path().join("small"), "1M");
        let path = dir.path().join("small/reins.db");
        let store = SqliteStore::open(&path, &StoreOptions::default()).expect("open");
        store
            .write(|c| Ok(c.execute_batch("CREATE TABLE t (x BLOB)")?))
            .await
            .expect("create");

        // A job holds the writer, inside its batch's transaction and with a row written, while
        // the next two queue. The first of them joins the batch and overflows the page cache, and
        // SQLite rolls the whole transaction back for the full disk: neither its row nor the
        // holder's is committed, and both hear why. The last, small, was not yet in the batch:
        // it runs in the next one, and commits.
        let (hold, held, release) = holding_write(&store, "INSERT INTO t VALUES (x'03')");
        let batch = async {
            held.await.expect("the writer runs the holding job");
            let big =
                store.write(|c| Ok(c.execute("INSERT INTO t VALUES (zeroblob(4000000))", [])?));
            let small = store.write(|c| Ok(c.execute("INSERT INTO t VALUES (x'01')", [])?));
            let go = async {
                release.send(()).expect("release the writer");
            };
            let (big, small, ()) = tokio::join!(big, small, go);
            (big, small)
        };
        let (held, (big, small)) = tokio::join!(hold, batch);
        assert!(matches!(held, Err(Error::DiskFull(_))), "{held:?}");
        assert!(matches!(big, Err(Error::DiskFull(_))), "{big:?}");
        small.expect("the job behind the rolled-back batch");

        let rows: Vec<Vec<u8>> = store
            .read(|c| {
                let mut statement = c.prepare("SELECT x FROM t")?;
                let rows = statement.query_map([], |r| r.get(0))?;
                Ok(rows.collect::<rusqlite::Result<_>>()?)
            })
            .await
            .expect("rows");
        assert_eq!(
            rows,
            vec![vec![1u8]],
            "a job of the rolled-back batch committed"
        );
        store
            .write(|c| Ok(c.execute("INSERT INTO t VALUES (x'02')", [])?))
            .await
            .expect("a small write fits again");
        let integrity: String = store
            .read(|c| Ok(c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?))
            .await
            .expect("integrity check");
        assert_eq!(integrity, "ok");
        drop(store);
    }
}
