//! Launching workflows and recording controls on SQLite. The single writer makes counting live
//! workflows and inserting one atomic.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{SqliteStore, parse_json};
use crate::lease::ttl_seconds;
use crate::workflows::takeover_refusal;
use crate::workflows::{
    ControlKind, ControlRow, ControlWrite, Deletion, Dormancy, Launch, LaunchLimits, ListFilter,
    ListedWorkflow, NewControl, NewRetry, Orphaned, Retry, StatusFilter, TakeOver, Versions,
};
use crate::{Epoch, Error, Lease, NewWorkflow, Result, WorkflowId, WorkflowRow, WorkflowStatus};

fn launch(
    connection: &Connection,
    workflow: NewWorkflow,
    owner: &str,
    lease_ms: u64,
    limits: LaunchLimits,
) -> Result<Launch> {
    if let Some(request_id) = &workflow.request_id {
        let existing = connection
            .prepare_cached(
                "SELECT id, user_id, status, owner, fingerprint, data, created_at, updated_at FROM workflows
                  WHERE user_id = ?1 AND request_id = ?2",
            )?
            .query_row(params![workflow.user_id, request_id], workflow_row)
            .optional()?;
        if let Some(existing) = existing {
            let existing = existing.decode()?;
            if existing.fingerprint == workflow.fingerprint {
                return Ok(Launch::Existing(existing));
            }
            return Err(Error::Conflict(format!(
                "request_id {request_id:?} was used for a different workflow"
            )));
        }
    }
    // Counts kept by triggers (migration 11) in every transaction that changes a workflow's
    // status, so they are exact here, inside the writer's transaction.
    let total: i64 = connection
        .prepare_cached("SELECT live FROM live_workflows_total WHERE id = 1")?
        .query_row([], |row| row.get(0))?;
    if u64::try_from(total).unwrap_or(u64::MAX) >= limits.max_workflows {
        return Ok(Launch::Refused {
            limit: crate::Limit::Workflows,
            max: limits.max_workflows,
        });
    }
    let mine: i64 = connection
        .prepare_cached("SELECT live FROM live_workflows_by_user WHERE user_id = ?1")?
        .query_row([&workflow.user_id], |row| row.get(0))
        .optional()?
        .unwrap_or(0);
    if u64::try_from(mine).unwrap_or(u64::MAX) >= limits.max_workflows_per_owner {
        return Ok(Launch::Refused {
            limit: crate::Limit::WorkflowsPerOwner,
            max: limits.max_workflows_per_owner,
        });
    }
    let at: (f64, f64) = connection
        .prepare_cached(
            "INSERT INTO workflows (id, user_id, request_id, status, owner, fingerprint, data,
                                    created_at, updated_at)
             VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, unixepoch('subsec'), unixepoch('subsec'))
             RETURNING created_at, updated_at",
        )?
        .query_row(
            params![
                workflow.workflow_id,
                workflow.user_id,
                workflow.request_id,
                owner,
                workflow.fingerprint,
                workflow.data.to_string()
            ],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )?;
    let expires_at = connection
        .prepare_cached(
            "INSERT INTO extension_execution_leases (resource_id, owner, epoch, expires_at)
             VALUES (?1, ?2, 1, unixepoch('subsec') + ?3) RETURNING expires_at",
        )?
        .query_row(
            params![workflow.workflow_id, owner, ttl_seconds(lease_ms)],
            |row| row.get(0),
        )?;
    Ok(Launch::Created {
        lease: Lease {
            resource_id: workflow.workflow_id.clone(),
            owner: owner.to_owned(),
            epoch: Epoch::FIRST,
            expires_at,
        },
        row: workflow.created(owner, at),
    })
}

/// [`SqliteStore::retry_workflow`] in the writer's transaction: everything that can refuse it is
/// checked before anything is written; an error after the launch rolls the job back whole.
fn retry(
    connection: &Connection,
    retry: NewRetry,
    owner: &str,
    lease_ms: u64,
    limits: LaunchLimits,
) -> Result<Retry> {
    let source = retry.retry_of;
    let status: Option<String> = connection
        .prepare_cached("SELECT status FROM workflows WHERE id = ?1")?
        .query_row([&source], |row| row.get(0))
        .optional()?;
    let Some(status) = status else {
        return Ok(Retry::NotFound);
    };
    let existing = connection
        .prepare_cached(
            "SELECT w.id, w.user_id, w.status, w.owner, w.fingerprint, w.data, w.created_at,
                    w.updated_at
               FROM workflow_retries r JOIN workflows w ON w.id = r.workflow
              WHERE r.retry_of = ?1",
        )?
        .query_row([&source], workflow_row)
        .optional()?;
    if let Some(existing) = existing {
        return Ok(Retry::Existing(existing.decode()?));
    }
    let status = WorkflowStatus::read(&status, &source)?;
    if status != WorkflowStatus::Failed {
        return Ok(Retry::NotFailed(status));
    }
    let request_id = retry.workflow.request_id.clone();
    let (row, lease) = match launch(connection, retry.workflow, owner, lease_ms, limits)? {
        Launch::Created { row, lease } => (row, lease),
        Launch::Refused { limit, max } => return Ok(Retry::Refused { limit, max }),
        // The request id names another workflow: the retry of this one would have been found.
        Launch::Existing(_) => {
            return Err(Error::Conflict(format!(
                "request_id {:?} was used for a different workflow",
                request_id.unwrap_or_default()
            )));
        }
    };
    let new = &row.workflow_id;
    connection
        .prepare_cached("INSERT INTO workflow_retries (retry_of, workflow) VALUES (?1, ?2)")?
        .execute(params![source, new])?;
    // The artifacts before the steps, whose `step_finished` events name their bytes.
    connection
        .prepare_cached(
            "INSERT INTO workflow_artifacts (workflow, version, source_step_id, path, content,
                                             bytes, sha256, created_at)
             SELECT ?1, a.version, a.source_step_id, a.path, a.content, a.bytes, a.sha256,
                    a.created_at
               FROM workflow_artifacts a
              WHERE a.workflow = ?2
                AND a.source_step_id IN (SELECT s.step_id FROM workflow_steps s
                                          WHERE s.workflow = ?2 AND s.seq < ?3)",
        )?
        .execute(params![new, source, retry.adopted_calls])?;
    connection
        .prepare_cached(
            "INSERT INTO workflow_steps (workflow, step_id, attempt, kind, status, data,
                                         created_at, updated_at, seq, error_bytes)
             SELECT ?1, step_id, attempt, kind, status, data, created_at, updated_at, seq,
                    error_bytes
               FROM workflow_steps WHERE workflow = ?2 AND seq < ?3
              ORDER BY seq, attempt",
        )?
        .execute(params![new, source, retry.adopted_calls])?;
    // One grant for everything the retry stores: the adopted artifacts and errors, and the
    // workspaces copied for it.
    let adopted_bytes: i64 = connection
        .prepare_cached(
            "SELECT coalesce((SELECT sum(bytes) FROM workflow_artifacts WHERE workflow = ?1), 0)
                  + coalesce((SELECT sum(error_bytes) FROM workflow_steps WHERE workflow = ?1), 0)",
        )?
        .query_row([new], |row| row.get(0))?;
    let adopted_bytes = adopted_bytes.saturating_add(retry.copied_bytes);
    if adopted_bytes > 0 {
        super::take_storage(connection, new, adopted_bytes, retry.stored_bytes_max)?;
    }
    if retry.copied_bytes > 0 {
        connection
            .prepare_cached("UPDATE workflow_storage SET copied_bytes = ?2 WHERE workflow = ?1")?
            .execute(params![new, retry.copied_bytes])?;
    }
    Ok(Retry::Created { row, lease })
}

/// A workflow row as SQLite stores it (its status and data as text), before decoding.
struct RawWorkflow {
    workflow_id: WorkflowId,
    user_id: String,
    status: String,
    owner: Option<String>,
    fingerprint: String,
    data: String,
    created_at: f64,
    updated_at: f64,
}

impl RawWorkflow {
    fn decode(self) -> Result<WorkflowRow> {
        Ok(WorkflowRow {
            status: WorkflowStatus::read(&self.status, &self.workflow_id)?,
            workflow_id: self.workflow_id,
            user_id: self.user_id,
            owner: self.owner,
            fingerprint: self.fingerprint,
            data: parse_json(&self.data)?,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

/// A row of `id, user_id, status, owner, fingerprint, data, created_at, updated_at`.
fn workflow_row(row: &Row<'_>) -> rusqlite::Result<RawWorkflow> {
    Ok(RawWorkflow {
        workflow_id: row.get(0)?,
        user_id: row.get(1)?,
        status: row.get(2)?,
        owner: row.get(3)?,
        fingerprint: row.get(4)?,
        data: row.get(5)?,
        created_at: row.get(6)?,
        updated_at: row.get(7)?,
    })
}

/// A control row as SQLite holds it, before its kind and body are decoded.
struct RawControl {
    id: i64,
    workflow_id: WorkflowId,
    kind: String,
    step_id: String,
    attempt: i32,
    body: String,
    created_by: Option<String>,
    created_at: f64,
    applied: bool,
}

impl RawControl {
    /// The row, or the store error naming a row whose kind no build knows.
    fn decode(self) -> Result<ControlRow> {
        Ok(ControlRow {
            kind: ControlKind::read(&self.kind, &self.workflow_id, self.id)?,
            body: parse_json(&self.body)?,
            id: self.id,
            workflow_id: self.workflow_id,
            step_id: self.step_id,
            attempt: self.attempt,
            created_by: self.created_by,
            created_at: self.created_at,
            applied: self.applied,
        })
    }
}

/// A row of `control_columns!`.
fn control_row(row: &Row<'_>) -> rusqlite::Result<RawControl> {
    Ok(RawControl {
        id: row.get(0)?,
        workflow_id: row.get(1)?,
        kind: row.get(2)?,
        step_id: row.get(3)?,
        attempt: row.get(4)?,
        body: row.get(5)?,
        created_by: row.get(6)?,
        applied: row.get::<_, Option<f64>>(7)?.is_some(),
        created_at: row.get(8)?,
    })
}

/// The columns `control_row` reads, as one literal for `concat!` (SQL is never formatted per call).
macro_rules! control_columns {
    () => {
        "id, workflow, kind, step_id, attempt, body, created_by, applied_at, created_at"
    };
}

impl SqliteStore {
    pub(crate) async fn launch_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> Result<Launch> {
        let owner = owner.to_owned();
        self.write(move |connection| launch(connection, workflow, &owner, lease_ms, limits))
            .await
    }

    pub(crate) async fn retry_workflow(
        &self,
        retry: NewRetry,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> Result<Retry> {
        let owner = owner.to_owned();
        let retried = self
            .write(move |connection| self::retry(connection, retry, &owner, lease_ms, limits))
            .await;
        match retried {
            Err(Error::LimitReached(limit @ crate::Limit::StoredBytes { max, .. })) => {
                Ok(Retry::Refused {
                    limit,
                    max: u64::try_from(max).unwrap_or(0),
                })
            }
            retried => retried,
        }
    }

    pub(crate) async fn put_control(&self, control: NewControl) -> Result<ControlWrite> {
        self.write(move |connection| {
            let inserted = connection
                .prepare_cached(concat!(
                    "INSERT INTO workflow_controls (workflow, kind, step_id, attempt, body,
                                                    created_by, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, unixepoch('subsec'))
                     ON CONFLICT (workflow, kind, step_id, attempt) DO NOTHING
                     RETURNING ",
                    control_columns!()
                ))?
                .query_row(
                    params![
                        control.workflow_id,
                        control.kind,
                        control.step_id,
                        control.attempt,
                        control.body.to_string(),
                        control.created_by
                    ],
                    control_row,
                )
                .optional()?;
            if let Some(row) = inserted {
                wake_if_dormant(connection, &control.workflow_id, None)?;
                return Ok(ControlWrite::Recorded(row.decode()?));
            }
            let existing = connection
                .prepare_cached(concat!(
                    "SELECT ",
                    control_columns!(),
                    " FROM workflow_controls
                      WHERE workflow = ?1 AND kind = ?2 AND step_id = ?3 AND attempt = ?4"
                ))?
                .query_row(
                    params![
                        control.workflow_id,
                        control.kind,
                        control.step_id,
                        control.attempt
                    ],
                    control_row,
                )?;
            let existing = existing.decode()?;
            if crate::workflows::same_answer(&existing, &control) {
                Ok(ControlWrite::Repeated(existing))
            } else {
                Err(crate::workflows::contradiction(&existing))
            }
        })
        .await
    }

    pub(crate) async fn read_controls(&self, workflow_id: &WorkflowId) -> Result<Vec<ControlRow>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| controls_on(connection, &workflow_id))
            .await
    }
}

fn take_over(
    connection: &Connection,
    workflow_id: &WorkflowId,
    owner: &str,
    lease_ms: u64,
    versions: &Versions,
    purpose: crate::workflows::Purpose,
) -> Result<TakeOver> {
    let row = connection
        .prepare_cached("SELECT status, data FROM workflows WHERE id = ?1")?
        .query_row([workflow_id], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })
        .optional()?;
    let Some((status, data)) = row else {
        return Err(Error::NotFound(format!("workflow {workflow_id:?}")));
    };
    let status = WorkflowStatus::read(&status, workflow_id)?;
    let data = parse_json(&data)?;
    let text = |key: &str| data[key].as_str().unwrap_or_default().to_owned();
    let written_under = Versions {
        runtime: text("runtime_version"),
        configuration: text("configuration_version"),
    };
    let cancel_pending: bool = connection
        .prepare_cached(
            "SELECT count(*) > 0 FROM workflow_controls
              WHERE workflow = ?1 AND kind = 'cancel' AND applied_at IS NULL",
        )?
        .query_row([workflow_id], |row| row.get(0))?;
    if let Some(refusal) =
        takeover_refusal(status, &written_under, versions, cancel_pending, purpose)
    {
        return Ok(refusal);
    }
    let taken = connection
        .prepare_cached(
            "UPDATE extension_execution_leases
                SET owner = ?2, epoch = epoch + 1, expires_at = unixepoch('subsec') + ?3
              WHERE resource_id = ?1 AND expires_at <= unixepoch('subsec')
             RETURNING epoch, expires_at",
        )?
        .query_row(params![workflow_id, owner, ttl_seconds(lease_ms)], |row| {
            Ok((row.get::<_, Epoch>(0)?, row.get::<_, f64>(1)?))
        })
        .optional()?;
    let Some((epoch, expires_at)) = taken else {
        return Ok(TakeOver::LeaseHeld);
    };
    connection
        .prepare_cached(
            "UPDATE workflows SET owner = ?2, dormant = 0, wake_at = NULL,
                    updated_at = unixepoch('subsec')
              WHERE id = ?1",
        )?
        .execute(params![workflow_id, owner])?;
    Ok(TakeOver::Taken(Lease {
        resource_id: workflow_id.to_owned(),
        owner: owner.to_owned(),
        epoch,
        expires_at,
    }))
}

impl SqliteStore {
    pub(crate) async fn take_over_workflow(
        &self,
        workflow_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
        versions: &Versions,
        purpose: crate::workflows::Purpose,
    ) -> Result<TakeOver> {
        let (workflow_id, owner, versions) =
            (workflow_id.to_owned(), owner.to_owned(), versions.clone());
        self.write(move |connection| {
            take_over(
                connection,
                &workflow_id,
                &owner,
                lease_ms,
                &versions,
                purpose,
            )
        })
        .await
    }
}

/// See the PostgreSQL backend's `orphans`: the same list, by the same rules, `narrowed` by a
/// predicate ending in `AND` (or `""`).
fn orphans(narrowed: &str) -> String {
    format!(
        "SELECT id, cancel_pending FROM (
             SELECT w.id,
                    w.status = 'cancelling' OR EXISTS (
                        SELECT 1 FROM workflow_controls c
                         WHERE c.workflow = w.id AND c.kind = 'cancel'
                           AND c.applied_at IS NULL
                    ) AS cancel_pending,
                    coalesce(json_extract(w.data, '$.runtime_version'), '') AS runtime,
                    coalesce(json_extract(w.data, '$.configuration_version'), '')
                        AS configuration
               FROM workflows w
               JOIN extension_execution_leases l ON l.resource_id = w.id
              WHERE {narrowed} w.status IN ('running', 'paused', 'waiting_approval', 'cancelling')
                AND l.expires_at <= unixepoch('subsec')
         )
          WHERE cancel_pending OR (runtime = ?2 AND configuration IN ('', ?3))
          ORDER BY random() LIMIT ?1"
    )
}

/// Every orphan this node may take.
static RECOVERABLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| orphans(""));

/// [`RECOVERABLE`]'s list narrowed to dormant workflows whose wake time came.
static DORMANT_DUE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| orphans("w.dormant AND w.wake_at <= unixepoch('subsec') AND"));

impl SqliteStore {
    /// See the PostgreSQL backend's `RECOVERABLE`: the same list, by the same rules.
    pub(crate) async fn recoverable_workflows(
        &self,
        limit: u32,
        versions: &Versions,
    ) -> Result<Vec<Orphaned>> {
        let (runtime, configuration) = (versions.runtime.clone(), versions.configuration.clone());
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(&RECOVERABLE)?;
            let rows = statement.query_map(params![limit, runtime, configuration], |row| {
                Ok(Orphaned {
                    workflow_id: row.get(0)?,
                    cancel_pending: row.get(1)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<Orphaned>>>()?)
        })
        .await
    }

    /// See the PostgreSQL backend's `dormant_workflows`: the same lists, by the same rules.
    pub(crate) async fn dormant_workflows(
        &self,
        limit: u32,
        versions: &Versions,
    ) -> Result<Dormancy> {
        let (runtime, configuration) = (versions.runtime.clone(), versions.configuration.clone());
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(&DORMANT_DUE)?;
            let rows = statement.query_map(params![limit, runtime, configuration], |row| {
                Ok(Orphaned {
                    workflow_id: row.get(0)?,
                    cancel_pending: row.get(1)?,
                })
            })?;
            let due = rows.collect::<rusqlite::Result<Vec<Orphaned>>>()?;
            let next_wake_at: Option<f64> = connection
                .prepare_cached(
                    "SELECT min(wake_at) FROM workflows
                      WHERE dormant AND wake_at > unixepoch('subsec')",
                )?
                .query_row([], |row| row.get(0))?;
            Ok(Dormancy { due, next_wake_at })
        })
        .await
    }

    pub(crate) async fn workflows_with_pending_controls(
        &self,
        owner: &str,
    ) -> Result<Vec<WorkflowId>> {
        let owner = owner.to_owned();
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT DISTINCT c.workflow FROM workflow_controls c
                   JOIN workflows w ON w.id = c.workflow
                  WHERE c.applied_at IS NULL AND w.owner = ?1",
            )?;
            let rows = statement.query_map([&owner], |row| row.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<WorkflowId>>>()?)
        })
        .await
    }

    pub(crate) async fn delete_workflow(&self, workflow_id: &WorkflowId) -> Result<Deletion> {
        let workflow_id = workflow_id.to_owned();
        self.write(move |connection| {
            let status: Option<String> = connection
                .prepare_cached("SELECT status FROM workflows WHERE id = ?1")?
                .query_row([&workflow_id], |row| row.get(0))
                .optional()?;
            let Some(status) = status else {
                return Ok(Deletion::NotFound);
            };
            if !WorkflowStatus::read(&status, &workflow_id)?.is_final() {
                return Ok(Deletion::NotTerminal);
            }
            // Its grant of stored bytes goes back to its owner's quota.
            connection
                .prepare_cached(
                    "UPDATE user_storage SET stored_bytes = stored_bytes -
                            (SELECT granted_bytes FROM workflow_storage WHERE workflow = ?1)
                      WHERE user_id = (SELECT user_id FROM workflow_storage WHERE workflow = ?1)",
                )?
                .execute([&workflow_id])?;
            connection
                .prepare_cached("DELETE FROM workflow_storage WHERE workflow = ?1")?
                .execute([&workflow_id])?;
            // The journal, controls, artifacts and slots go with the row (ON DELETE CASCADE).
            connection
                .prepare_cached("DELETE FROM workflows WHERE id = ?1")?
                .execute([&workflow_id])?;
            connection
                .prepare_cached("DELETE FROM extension_execution_leases WHERE resource_id = ?1")?
                .execute([&workflow_id])?;
            Ok(Deletion::Deleted)
        })
        .await
    }

    pub(crate) async fn list_workflows(&self, filter: ListFilter) -> Result<Vec<ListedWorkflow>> {
        self.read(move |connection| {
            // The four statuses are `COUNTED_STATUSES`.
            let mut statement = connection.prepare_cached(
                "SELECT w.id, w.user_id, w.status, w.owner, w.fingerprint, w.data, w.created_at,
                        w.updated_at,
                        w.status IN ('running', 'paused', 'waiting_approval', 'cancelling')
                          AND (l.expires_at IS NULL OR l.expires_at <= unixepoch('subsec')),
                        w.status = 'running' AND l.expires_at IS NOT NULL
                          AND l.expires_at > unixepoch('subsec') AND EXISTS (
                            SELECT 1 FROM runs r
                             WHERE r.workflow = w.id AND r.status = 'waiting_for_input')
                   FROM workflows w LEFT JOIN extension_execution_leases l ON l.resource_id = w.id
                  WHERE (?1 IS NULL OR w.user_id = ?1) AND (?2 IS NULL OR w.status = ?2)
                    AND (NOT ?6 OR (w.status IN ('running', 'paused', 'waiting_approval', 'cancelling')
                          AND (l.expires_at IS NULL OR l.expires_at <= unixepoch('subsec'))))
                    AND (NOT ?8 OR (w.status = 'running' AND l.expires_at IS NOT NULL
                          AND l.expires_at > unixepoch('subsec')
                          AND EXISTS (SELECT 1 FROM runs r
                                       WHERE r.workflow = w.id AND r.status = 'waiting_for_input')))
                    AND (?9 IS NULL OR (w.status IN ('running', 'paused', 'waiting_approval')
                         AND EXISTS (SELECT 1 FROM workflow_steps s
                                      WHERE s.workflow = w.id AND CASE ?9
                         WHEN 'sleep' THEN s.status = 'running' AND s.kind = 'sleep'
                         WHEN 'event' THEN s.status = 'running' AND s.kind = 'waitForEvent'
                         WHEN 'person' THEN s.status = 'running'
                              AND (s.kind IN ('pause', 'humanCheckpoint')
                                   OR (s.kind = 'agent' AND EXISTS (
                                         SELECT 1 FROM runs r
                                          WHERE r.workflow = s.workflow AND r.step_id = s.step_id
                                            AND r.attempt = s.attempt
                                            AND r.status = 'waiting_for_input')))
                         WHEN 'retry' THEN s.status = 'queued' AND s.kind = 'agent'
                              AND coalesce(json_extract(s.data, '$.retry.due_at_ms'), 0)
                                  > unixepoch('subsec') * 1000
                         ELSE s.status = 'queued' AND s.kind = 'agent'
                              AND coalesce(json_extract(s.data, '$.retry.due_at_ms'), 0)
                                  <= unixepoch('subsec') * 1000
                         END)))
                    AND (?3 IS NULL OR (w.created_at, w.id) < (?3, ?4))
                    AND (?7 IS NULL OR w.request_id = ?7)
                  ORDER BY w.created_at DESC, w.id DESC LIMIT ?5",
            )?;
            let (stored, recoverable, waiting_for_input) = match filter.status {
                None => (None, false, false),
                Some(StatusFilter::Stored(status)) => (Some(status), false, false),
                Some(StatusFilter::Recoverable) => (None, true, false),
                Some(StatusFilter::WaitingForInput) => (None, false, true),
            };
            let (after_created_at, after_id) = filter
                .after
                .map_or((None, None), |c| (Some(c.created_at), Some(c.workflow_id)));
            let rows = statement.query_map(
                params![
                    filter.user_id,
                    stored,
                    after_created_at,
                    after_id,
                    filter.limit,
                    recoverable,
                    filter.request_id,
                    waiting_for_input,
                    filter.waiting_for
                ],
                |row| {
                    Ok((
                        workflow_row(row)?,
                        row.get::<_, bool>(8)?,
                        row.get::<_, bool>(9)?,
                    ))
                },
            )?;
            let mut listed = rows
                .map(|row| {
                    let (workflow, recoverable, waiting_for_input) = row?;
                    Ok(ListedWorkflow {
                        row: workflow.decode()?,
                        recoverable,
                        waiting_for_input,
                        waits: Vec::new(),
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let waiting: Vec<&WorkflowId> = listed
                .iter()
                .filter(|listed| crate::WAITING_STATUSES.contains(&listed.row.status))
                .map(|listed| &listed.row.workflow_id)
                .collect();
            let mut waits = super::page_waits_on(connection, &waiting)?;
            for listed in &mut listed {
                if let Some(found) = waits.remove(&listed.row.workflow_id) {
                    listed.waits = found;
                }
            }
            Ok(listed)
        })
        .await
    }
}

/// Every control of a workflow, oldest first.
pub(super) fn controls_on(
    connection: &Connection,
    workflow_id: &WorkflowId,
) -> Result<Vec<ControlRow>> {
    let mut statement = connection.prepare_cached(concat!(
        "SELECT ",
        control_columns!(),
        " FROM workflow_controls WHERE workflow = ?1 ORDER BY id"
    ))?;
    let rows = statement.query_map([workflow_id], control_row)?;
    rows.map(|row| row?.decode()).collect()
}

/// A control or an `event` of that name was recorded: a dormant workflow's lease expires now, so
/// a node takes it over at once (the lease's release cues `n:` on the change bus), unless the
/// workflow waits for no event of that name. The one writer orders it with the write that made
/// the workflow dormant, whichever came first.
pub(super) fn wake_if_dormant(
    connection: &Connection,
    workflow_id: &WorkflowId,
    event: Option<&str>,
) -> Result<()> {
    let woken = connection
        .prepare_cached(
            "UPDATE workflows SET wake_at = unixepoch('subsec')
              WHERE id = ?1 AND dormant AND wake_at > unixepoch('subsec')
                AND (?2 IS NULL OR wake_on_events IS NULL
                     OR ?2 IN (SELECT value FROM json_each(wake_on_events)))",
        )?
        .execute(params![workflow_id, event])?;
    if woken == 1 {
        connection
            .prepare_cached(
                "UPDATE extension_execution_leases SET expires_at = unixepoch('subsec')
                  WHERE resource_id = ?1 AND expires_at > unixepoch('subsec')",
            )?
            .execute([workflow_id])?;
    }
    Ok(())
}
