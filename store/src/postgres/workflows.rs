//! Launching workflows and recording controls on PostgreSQL. Launches serialise on an advisory
//! lock, so that counting live workflows and inserting one are atomic across the cluster; the
//! request-id check runs after the lock, so two nodes launching the same request at once agree on
//! one workflow.

use std::collections::HashMap;

use deadpool_postgres::Transaction;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{PgStore, commit_error};
use crate::lease::ttl_seconds;
use crate::workflows::takeover_refusal;
use crate::workflows::{
    COUNTED, ControlKind, ControlRow, ControlWrite, Deletion, Dormancy, Launch, LaunchLimits,
    ListFilter, ListedWorkflow, NewControl, NewRetry, Orphaned, Retry, StatusFilter, TakeOver,
    Versions,
};
use crate::{
    COUNTED_STATUSES, Epoch, Error, Lease, NewWorkflow, Result, WAITING_STATUSES, WorkflowId,
    WorkflowRow, WorkflowStatus,
};

// Launches serialise on the advisory lock "launch" (0x6c61_756e_6368), taken by
// `reins_launch_guard` (migration 6).

/// The columns `control` decodes, as one literal for `concat!` (SQL is never formatted per call).
macro_rules! control_columns {
    () => {
        "id, workflow, kind, step_id, attempt, body, created_by, applied_at IS NOT NULL, created_at"
    };
}

/// A row of `control_columns!`, or the store error naming a row whose kind no build knows.
pub(super) fn control(row: &Row) -> Result<ControlRow> {
    let (id, workflow_id): (i64, WorkflowId) = (row.get(0), row.get(1));
    Ok(ControlRow {
        kind: ControlKind::read(row.get(2), &workflow_id, id)?,
        id,
        workflow_id,
        step_id: row.get(3),
        attempt: row.get(4),
        body: row.get(5),
        created_by: row.get(6),
        created_at: row.get(8),
        applied: row.get(7),
    })
}

/// The workflow a user's `request_id` launched, if any.
async fn launched_by_request(
    client: &impl deadpool_postgres::GenericClient,
    user_id: &str,
    request_id: &str,
) -> Result<Option<WorkflowRow>> {
    let row = client
        .query_opt(
            &client
                .prepare_cached(
                    "SELECT id, user_id, status, owner, fingerprint, data, created_at, updated_at
               FROM workflows WHERE user_id = $1 AND request_id = $2",
                )
                .await?,
            &[&user_id, &request_id],
        )
        .await?;
    row.as_ref().map(workflow_row).transpose()
}

/// A row of `id, user_id, status, owner, fingerprint, data, created_at, updated_at`.
fn workflow_row(row: &Row) -> Result<WorkflowRow> {
    let workflow_id: WorkflowId = row.get(0);
    Ok(WorkflowRow {
        status: WorkflowStatus::read(row.get(2), &workflow_id)?,
        workflow_id,
        user_id: row.get(1),
        owner: row.get(3),
        fingerprint: row.get(4),
        data: row.get(5),
        created_at: row.get(6),
        updated_at: row.get(7),
    })
}

/// What a launch under `reins_launch_guard` came to.
enum Guarded {
    /// Inserted at the times the database gave it (`created_at`, `updated_at`: two readings of
    /// its clock), with its lease.
    Created { at: (f64, f64), lease: Lease },
    /// A limit refused it.
    Refused { limit: crate::Limit, max: u64 },
    /// The request was launched before: read it after this transaction.
    Repeated,
}

async fn launch_in(
    transaction: &Transaction<'_>,
    workflow: &NewWorkflow,
    owner: &str,
    lease_ms: u64,
    limits: LaunchLimits,
) -> Result<Guarded> {
    let live: Vec<&str> = COUNTED_STATUSES.to_vec();
    let clamp = |limit: u64| i64::try_from(limit).unwrap_or(i64::MAX);
    let (max_total, max_mine) = (
        clamp(limits.max_workflows),
        clamp(limits.max_workflows_per_owner),
    );
    let lease_seconds = ttl_seconds(lease_ms);
    let insert_params: [&(dyn ToSql + Sync); 9] = [
        &workflow.workflow_id,
        &workflow.user_id,
        &workflow.request_id,
        &owner,
        &workflow.fingerprint,
        &workflow.data,
        &live,
        &max_total,
        &max_mine,
    ];
    let lease_params: [&(dyn ToSql + Sync); 3] = [&workflow.workflow_id, &owner, &lease_seconds];
    // One round trip: the guard runs inside the insert (it answers with the numbers the row
    // holds), and the lease insert is pipelined after it; when the guard refuses, the
    // transaction is aborted and the lease insert does nothing.
    let insert = transaction
        .prepare_cached(
            "INSERT INTO workflows (id, user_id, request_id, status, owner, fingerprint, data,
                                    created_at, updated_at, live_no, owner_no)
             SELECT $1, $2, $3, 'running', $4, $5, $6, reins_now(), reins_now(),
                    guard.live_no, guard.owner_no
               FROM reins_launch_guard($2, $3, $7, $8, $9) AS guard
             RETURNING created_at, updated_at",
        )
        .await?;
    let lease = transaction
        .prepare_cached(
            "INSERT INTO extension_execution_leases (resource_id, owner, epoch, expires_at)
             VALUES ($1, $2, 1, reins_now() + $3) RETURNING expires_at",
        )
        .await?;
    let (inserted, leased) = futures_util::join!(
        transaction.query_one(&insert, &insert_params),
        transaction.query_one(&lease, &lease_params),
    );
    match inserted.as_ref().map_err(|e| e.code().map(|c| c.code())) {
        Err(Some("RW003")) => return Ok(Guarded::Repeated),
        // A twin launch with the same request_id committed first (the unique index).
        Err(Some("23505")) if workflow.request_id.is_some() => return Ok(Guarded::Repeated),
        Err(Some("RW001")) => {
            return Ok(Guarded::Refused {
                limit: crate::Limit::Workflows,
                max: limits.max_workflows,
            });
        }
        Err(Some("RW002")) => {
            return Ok(Guarded::Refused {
                limit: crate::Limit::WorkflowsPerOwner,
                max: limits.max_workflows_per_owner,
            });
        }
        _ => {}
    }
    let inserted = inserted?;
    let at = (inserted.get(0), inserted.get(1));
    Ok(Guarded::Created {
        at,
        lease: Lease {
            resource_id: workflow.workflow_id.clone(),
            owner: owner.to_owned(),
            epoch: Epoch::FIRST,
            expires_at: leased?.get(0),
        },
    })
}

/// [`PgStore::retry_workflow`] inside its transaction: the workflow retried is locked first
/// (`FOR UPDATE`: two retries of it queue, and the second finds the first's link), then the
/// launch's own statements run, then the link, the adopted artifacts (before the steps, whose
/// `step_finished` events name their bytes), the adopted steps and the grant. Only `Created`
/// is to be committed.
async fn retry_in(
    transaction: &Transaction<'_>,
    retry: &NewRetry,
    owner: &str,
    lease_ms: u64,
    limits: LaunchLimits,
) -> Result<Retry> {
    let source = &retry.retry_of;
    let status = transaction
        .query_opt(
            &transaction
                .prepare_cached("SELECT status FROM workflows WHERE id = $1 FOR UPDATE")
                .await?,
            &[source],
        )
        .await?;
    let Some(status) = status else {
        return Ok(Retry::NotFound);
    };
    let existing = transaction
        .query_opt(
            &transaction
                .prepare_cached(
                    "SELECT w.id, w.user_id, w.status, w.owner, w.fingerprint, w.data,
                            w.created_at, w.updated_at
                       FROM workflow_retries r JOIN workflows w ON w.id = r.workflow
                      WHERE r.retry_of = $1",
                )
                .await?,
            &[source],
        )
        .await?;
    if let Some(existing) = existing {
        return Ok(Retry::Existing(workflow_row(&existing)?));
    }
    let status = WorkflowStatus::read(status.get(0), source)?;
    if status != WorkflowStatus::Failed {
        return Ok(Retry::NotFailed(status));
    }
    let (at, lease) = match launch_in(transaction, &retry.workflow, owner, lease_ms, limits).await?
    {
        Guarded::Created { at, lease } => (at, lease),
        Guarded::Refused { limit, max } => return Ok(Retry::Refused { limit, max }),
        // The request id names another workflow: the retry of this one would have been found.
        Guarded::Repeated => {
            return Err(Error::Conflict(format!(
                "request_id {:?} was used for a different workflow",
                retry.workflow.request_id.as_deref().unwrap_or_default()
            )));
        }
    };
    let new = &retry.workflow.workflow_id;
    let adopted = &retry.adopted_calls;
    for sql in [
        "INSERT INTO workflow_retries (retry_of, workflow) VALUES ($2, $1)",
        "INSERT INTO workflow_artifacts (workflow, version, source_step_id, path, content, bytes,
                                         sha256, created_at)
         SELECT $1, a.version, a.source_step_id, a.path, a.content, a.bytes, a.sha256, a.created_at
           FROM workflow_artifacts a
          WHERE a.workflow = $2
            AND a.source_step_id IN (SELECT s.step_id FROM workflow_steps s
                                      WHERE s.workflow = $2 AND s.seq < $3)",
        "INSERT INTO workflow_steps (workflow, step_id, attempt, kind, status, data, created_at,
                                     updated_at, seq, error_bytes)
         SELECT $1, step_id, attempt, kind, status, data, created_at, updated_at, seq, error_bytes
           FROM workflow_steps WHERE workflow = $2 AND seq < $3
          ORDER BY seq, attempt",
    ] {
        let params: [&(dyn ToSql + Sync); 3] = [new, source, adopted];
        let params = if sql.contains("$3") {
            &params[..]
        } else {
            &params[..2]
        };
        transaction
            .execute(&transaction.prepare_cached(sql).await?, params)
            .await?;
    }
    // One grant for everything the retry stores: the adopted artifacts and errors, and the
    // workspaces copied for it.
    transaction
        .execute(
            &transaction
                .prepare_cached(
                    "SELECT reins_take_storage($1, adopted.bytes, $2::bigint)
                       FROM (SELECT (coalesce((SELECT sum(bytes) FROM workflow_artifacts
                                                WHERE workflow = $1), 0)
                                   + coalesce((SELECT sum(error_bytes) FROM workflow_steps
                                                WHERE workflow = $1), 0)
                                   + $3::bigint)::bigint AS bytes) adopted
                      WHERE adopted.bytes > 0",
                )
                .await?,
            &[new, &retry.stored_bytes_max, &retry.copied_bytes],
        )
        .await?;
    if retry.copied_bytes > 0 {
        transaction
            .execute(
                &transaction
                    .prepare_cached(
                        "UPDATE workflow_storage SET copied_bytes = $2 WHERE workflow = $1",
                    )
                    .await?,
                &[new, &retry.copied_bytes],
            )
            .await?;
    }
    Ok(Retry::Created {
        row: retry.workflow.clone().created(owner, at),
        lease,
    })
}

impl PgStore {
    pub(crate) async fn launch_workflow(
        &self,
        workflow: NewWorkflow,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> Result<Launch> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        match launch_in(&transaction, &workflow, owner, lease_ms, limits).await? {
            Guarded::Created { at, lease } => {
                transaction.commit().await.map_err(commit_error)?;
                Ok(Launch::Created {
                    row: workflow.created(owner, at),
                    lease,
                })
            }
            Guarded::Refused { limit, max } => Ok(Launch::Refused { limit, max }),
            Guarded::Repeated => {
                drop(transaction);
                let request_id = workflow.request_id.as_deref().unwrap_or_default();
                let existing = launched_by_request(&*client, &workflow.user_id, request_id)
                    .await?
                    .ok_or_else(|| {
                        Error::Database(format!("request_id {request_id:?} vanished"))
                    })?;
                if existing.fingerprint == workflow.fingerprint {
                    Ok(Launch::Existing(existing))
                } else {
                    Err(Error::Conflict(format!(
                        "request_id {request_id:?} was used for a different workflow"
                    )))
                }
            }
        }
    }

    pub(crate) async fn put_control(&self, new: NewControl) -> Result<ControlWrite> {
        let mut client = self.connection().await?;
        let client = client.transaction().await?;
        hold_off_dormancy(&client, &new.workflow_id).await?;
        let inserted = client
            .query_opt(
                &client
                    .prepare_cached(concat!(
                        "INSERT INTO workflow_controls (workflow, kind, step_id, attempt, body,
                                                        created_by, created_at)
                         VALUES ($1, $2, $3, $4, $5, $6, reins_now())
                         ON CONFLICT (workflow, kind, step_id, attempt) DO NOTHING
                         RETURNING ",
                        control_columns!()
                    ))
                    .await?,
                &[
                    &new.workflow_id,
                    &new.kind,
                    &new.step_id,
                    &new.attempt,
                    &new.body,
                    &new.created_by,
                ],
            )
            .await
            .map_err(commit_error)?;
        if let Some(row) = inserted {
            let recorded = control(&row)?;
            wake_if_dormant(&client, &new.workflow_id, None).await?;
            client.commit().await.map_err(commit_error)?;
            return Ok(ControlWrite::Recorded(recorded));
        }
        let existing = client
            .query_one(
                &client
                    .prepare_cached(concat!(
                        "SELECT ",
                        control_columns!(),
                        " FROM workflow_controls
                          WHERE workflow = $1 AND kind = $2 AND step_id = $3 AND attempt = $4"
                    ))
                    .await?,
                &[&new.workflow_id, &new.kind, &new.step_id, &new.attempt],
            )
            .await?;
        let existing = control(&existing)?;
        if crate::workflows::same_answer(&existing, &new) {
            Ok(ControlWrite::Repeated(existing))
        } else {
            Err(crate::workflows::contradiction(&existing))
        }
    }

    pub(crate) async fn read_controls(&self, workflow_id: &WorkflowId) -> Result<Vec<ControlRow>> {
        let client = self.connection().await?;
        controls_in(&*client, workflow_id).await
    }
}

/// Holds off a write that makes the workflow dormant until this transaction ends (that write
/// locks the lease row `FOR UPDATE` first, which `FOR KEY SHARE` conflicts with, and nothing
/// else: the owner's fenced writes and renewals go on). Taken before a control or an event is
/// recorded, so either that write commits first and [`wake_if_dormant`] (a later statement,
/// with a later snapshot) finds the workflow dormant, or this one commits first and that
/// write finds what it recorded: no wake is missed.
pub(super) async fn hold_off_dormancy(
    transaction: &Transaction<'_>,
    workflow_id: &WorkflowId,
) -> Result<()> {
    transaction
        .query_opt(
            &transaction
                .prepare_cached(
                    "SELECT 1 FROM extension_execution_leases WHERE resource_id = $1
                        FOR KEY SHARE",
                )
                .await?,
            &[workflow_id],
        )
        .await?;
    Ok(())
}

/// A control or an `event` of that name was recorded: a dormant workflow's lease expires now,
/// so a node takes it over at once (the lease's release cues `n:` on the change bus), unless the
/// workflow waits for no event of that name.
pub(super) async fn wake_if_dormant(
    transaction: &Transaction<'_>,
    workflow_id: &WorkflowId,
    event: Option<&str>,
) -> Result<()> {
    transaction
        .execute(
            &transaction
                .prepare_cached(
                    "WITH woken AS (
                         UPDATE workflows SET wake_at = reins_now()
                          WHERE id = $1 AND dormant AND wake_at > reins_now()
                            AND ($2::text IS NULL OR wake_on_events IS NULL
                                 OR $2::text = ANY(wake_on_events))
                         RETURNING 1)
                     UPDATE extension_execution_leases SET expires_at = reins_now()
                      WHERE resource_id = $1 AND expires_at > reins_now()
                        AND (SELECT count(*) FROM woken) = 1",
                )
                .await?,
            &[workflow_id, &event],
        )
        .await?;
    Ok(())
}

async fn take_over_in(
    transaction: &Transaction<'_>,
    workflow_id: &WorkflowId,
    owner: &str,
    lease_ms: u64,
    versions: &Versions,
    purpose: crate::workflows::Purpose,
) -> Result<TakeOver> {
    let row = transaction
        .query_opt(
            &transaction
                .prepare_cached(
                    "SELECT status, data->>'runtime_version', data->>'configuration_version'
               FROM workflows WHERE id = $1 FOR UPDATE",
                )
                .await?,
            &[&workflow_id],
        )
        .await?;
    let Some(row) = row else {
        return Err(Error::NotFound(format!("workflow {workflow_id:?}")));
    };
    let status = WorkflowStatus::read(row.get(0), workflow_id)?;
    let written_under = Versions {
        runtime: row.get::<_, Option<String>>(1).unwrap_or_default(),
        configuration: row.get::<_, Option<String>>(2).unwrap_or_default(),
    };
    let cancel_pending: bool = transaction
        .query_one(
            &transaction
                .prepare_cached(
                    "SELECT count(*) > 0 FROM workflow_controls
              WHERE workflow = $1 AND kind = 'cancel' AND applied_at IS NULL",
                )
                .await?,
            &[&workflow_id],
        )
        .await?
        .get(0);
    if let Some(refusal) =
        takeover_refusal(status, &written_under, versions, cancel_pending, purpose)
    {
        return Ok(refusal);
    }
    let taken = transaction
        .query_opt(
            &transaction
                .prepare_cached(
                    "UPDATE extension_execution_leases
                SET owner = $2, epoch = epoch + 1, expires_at = reins_now() + $3
              WHERE resource_id = $1 AND expires_at <= reins_now()
             RETURNING epoch, expires_at",
                )
                .await?,
            &[&workflow_id, &owner, &ttl_seconds(lease_ms)],
        )
        .await?;
    let Some(taken) = taken else {
        return Ok(TakeOver::LeaseHeld);
    };
    transaction
        .execute(
            &transaction
                .prepare_cached(
                    "UPDATE workflows SET owner = $2, dormant = false, wake_at = NULL,
                            updated_at = reins_now()
                      WHERE id = $1",
                )
                .await?,
            &[&workflow_id, &owner],
        )
        .await?;
    Ok(TakeOver::Taken(Lease {
        resource_id: workflow_id.to_owned(),
        owner: owner.to_owned(),
        epoch: taken.get(0),
        expires_at: taken.get(1),
    }))
}

impl PgStore {
    pub(crate) async fn take_over_workflow(
        &self,
        workflow_id: &WorkflowId,
        owner: &str,
        lease_ms: u64,
        versions: &Versions,
        purpose: crate::workflows::Purpose,
    ) -> Result<TakeOver> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let outcome = take_over_in(
            &transaction,
            workflow_id,
            owner,
            lease_ms,
            versions,
            purpose,
        )
        .await?;
        // A refusal writes nothing: the transaction is dropped, which rolls it back.
        if matches!(outcome, TakeOver::Taken(_)) {
            transaction.commit().await.map_err(commit_error)?;
        }
        Ok(outcome)
    }
}

impl PgStore {
    pub(crate) async fn recoverable_workflows(
        &self,
        limit: u32,
        versions: &Versions,
    ) -> Result<Vec<Orphaned>> {
        let client = self.connection().await?;
        let statement = client.prepare_cached(&RECOVERABLE).await?;
        let rows = client
            .query(
                &statement,
                &[
                    &i64::from(limit),
                    &versions.runtime,
                    &versions.configuration,
                ],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| Orphaned {
                workflow_id: row.get(0),
                cancel_pending: row.get(1),
            })
            .collect())
    }

    pub(crate) async fn dormant_workflows(
        &self,
        limit: u32,
        versions: &Versions,
    ) -> Result<Dormancy> {
        let client = self.connection().await?;
        let due = client.prepare_cached(&DORMANT_DUE).await?;
        let next = client
            .prepare_cached(
                "SELECT min(wake_at) FROM workflows WHERE dormant AND wake_at > reins_now()",
            )
            .await?;
        let rows = client
            .query(
                &due,
                &[
                    &i64::from(limit),
                    &versions.runtime,
                    &versions.configuration,
                ],
            )
            .await?;
        let next_wake_at: Option<f64> = client.query_one(&next, &[]).await?.get(0);
        Ok(Dormancy {
            due: rows
                .iter()
                .map(|row| Orphaned {
                    workflow_id: row.get(0),
                    cancel_pending: row.get(1),
                })
                .collect(),
            next_wake_at,
        })
    }

    pub(crate) async fn workflows_with_pending_controls(
        &self,
        owner: &str,
    ) -> Result<Vec<WorkflowId>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "SELECT DISTINCT c.workflow FROM workflow_controls c
                   JOIN workflows w ON w.id = c.workflow
                  WHERE c.applied_at IS NULL AND w.owner = $1",
            )
            .await?;
        let rows = client.query(&statement, &[&owner]).await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    pub(crate) async fn retry_workflow(
        &self,
        retry: NewRetry,
        owner: &str,
        lease_ms: u64,
        limits: LaunchLimits,
    ) -> Result<Retry> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let retried = match retry_in(&transaction, &retry, owner, lease_ms, limits).await {
            Err(Error::LimitReached(limit @ crate::Limit::StoredBytes { max, .. })) => {
                return Ok(Retry::Refused {
                    limit,
                    max: u64::try_from(max).unwrap_or(0),
                });
            }
            retried => retried?,
        };
        if let Retry::Created { .. } = retried {
            transaction.commit().await.map_err(commit_error)?;
        }
        Ok(retried)
    }

    pub(crate) async fn delete_workflow(&self, workflow_id: &WorkflowId) -> Result<Deletion> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        let status = transaction
            .query_opt(
                &transaction
                    .prepare_cached("SELECT status FROM workflows WHERE id = $1 FOR UPDATE")
                    .await?,
                &[&workflow_id],
            )
            .await?
            .map(|row| WorkflowStatus::read(row.get(0), workflow_id))
            .transpose()?;
        let Some(status) = status else {
            return Ok(Deletion::NotFound);
        };
        if !status.is_final() {
            return Ok(Deletion::NotTerminal);
        }
        // The rows written under the workflow's fence have no foreign key (migration 23): they
        // are deleted here. The lease row first, which waits for any fenced write in flight and
        // refuses every later one; then the event counter, which waits for an event written
        // without the fence (an approval answered); then the rows, each statement seeing what
        // those committed. The controls go with the workflow's row (ON DELETE CASCADE). The
        // workflow's grant of stored bytes goes back to its owner's quota.
        for sql in [
            "DELETE FROM extension_execution_leases WHERE resource_id = $1",
            "DELETE FROM workflow_event_seqs WHERE workflow = $1",
            "DELETE FROM workflow_events WHERE workflow = $1",
            "DELETE FROM workflow_steps WHERE workflow = $1",
            "DELETE FROM workflow_artifacts WHERE workflow = $1",
            "DELETE FROM workflow_slots WHERE workflow = $1",
            "UPDATE user_storage u SET stored_bytes = u.stored_bytes - s.granted_bytes
               FROM workflow_storage s WHERE s.workflow = $1 AND u.user_id = s.user_id",
            "DELETE FROM workflow_storage WHERE workflow = $1",
            "DELETE FROM workflows WHERE id = $1",
        ] {
            transaction
                .execute(&transaction.prepare_cached(sql).await?, &[&workflow_id])
                .await?;
        }
        transaction.commit().await.map_err(commit_error)?;
        Ok(Deletion::Deleted)
    }

    pub(crate) async fn list_workflows(&self, filter: ListFilter) -> Result<Vec<ListedWorkflow>> {
        let client = self.connection().await?;
        let statement = client
            // Whether an agent asks is a `LATERAL` probe of the live runs' index, one per row the
            // page reads (none for a workflow that is not running). Two shapes measured worse at
            // 100,000 workflows, 20,000 of them running: a subquery computing the flags (with
            // the volatile `reins_now()` in it, PostgreSQL does not pull it up, and sorted every
            // workflow: 0.2 ms became 357 ms), and an `EXISTS` in the select list (hashed over
            // every waiting run: 8 ms).
            .prepare_cached(
                "SELECT w.id, w.user_id, w.status, w.owner, w.fingerprint, w.data, w.created_at,
                        w.updated_at,
                        w.status = ANY($7) AND (l.expires_at IS NULL OR l.expires_at <= reins_now()),
                        coalesce(a.asks AND l.expires_at > reins_now(), false)
                   FROM workflows w
                   LEFT JOIN extension_execution_leases l ON l.resource_id = w.id
                   LEFT JOIN LATERAL (SELECT true AS asks FROM runs r
                                       WHERE w.status = 'running' AND r.workflow = w.id
                                         AND r.status = 'waiting_for_input'
                                       LIMIT 1) a ON true
                  WHERE ($1::text IS NULL OR w.user_id = $1)
                    AND ($2::text IS NULL OR w.status = $2)
                    AND (NOT $6 OR (w.status = ANY($7)
                                    AND (l.expires_at IS NULL OR l.expires_at <= reins_now())))
                    AND (NOT $9 OR (a.asks AND l.expires_at > reins_now()))
                    AND ($10::text IS NULL OR (w.status IN ('running', 'paused', 'waiting_approval')
                         AND EXISTS (SELECT 1 FROM workflow_steps s
                                      WHERE s.workflow = w.id AND CASE $10
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
                              AND coalesce((s.data->'retry'->>'due_at_ms')::float8, 0)
                                  > reins_now() * 1000
                         ELSE s.status = 'queued' AND s.kind = 'agent'
                              AND coalesce((s.data->'retry'->>'due_at_ms')::float8, 0)
                                  <= reins_now() * 1000
                         END)))
                    AND ($3::float8 IS NULL OR (w.created_at, w.id) < ($3, $4::text))
                    AND ($8::text IS NULL OR w.request_id = $8)
                  ORDER BY w.created_at DESC, w.id DESC LIMIT $5",
            )
            .await?;
        let (stored, recoverable, waiting_for_input) = match filter.status {
            None => (None, false, false),
            Some(StatusFilter::Stored(status)) => (Some(status), false, false),
            Some(StatusFilter::Recoverable) => (None, true, false),
            Some(StatusFilter::WaitingForInput) => (None, false, true),
        };
        let (after_created_at, after_id) = filter
            .after
            .map_or((None, None), |c| (Some(c.created_at), Some(c.workflow_id)));
        let rows = client
            .query(
                &statement,
                &[
                    &filter.user_id,
                    &stored,
                    &after_created_at,
                    &after_id,
                    &i64::from(filter.limit),
                    &recoverable,
                    &COUNTED,
                    &filter.request_id,
                    &waiting_for_input,
                    &filter.waiting_for,
                ],
            )
            .await?;
        let mut listed = rows
            .iter()
            .map(|row| {
                Ok(ListedWorkflow {
                    row: workflow_row(row)?,
                    recoverable: row.get(8),
                    waiting_for_input: row.get(9),
                    waits: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let waiting: Vec<&WorkflowId> = listed
            .iter()
            .filter(|listed| WAITING_STATUSES.contains(&listed.row.status))
            .map(|listed| &listed.row.workflow_id)
            .collect();
        if waiting.is_empty() {
            return Ok(listed);
        }
        let statement = client.prepare_cached(super::PAGE_WAITS_SQL).await?;
        let rows = client.query(&statement, &[&waiting]).await?;
        let mut waits: HashMap<WorkflowId, Vec<tokio_postgres::Row>> = HashMap::new();
        for row in rows {
            waits.entry(row.get(7)).or_default().push(row);
        }
        for listed in &mut listed {
            if let Some(rows) = waits.get(&listed.row.workflow_id) {
                listed.waits = super::steps_from(rows, &listed.row.workflow_id)?;
            }
        }
        Ok(listed)
    }
}

/// Every control of a workflow, oldest first.
pub(super) const CONTROLS_SQL: &str = concat!(
    "SELECT ",
    control_columns!(),
    " FROM workflow_controls WHERE workflow = $1 ORDER BY id"
);

pub(super) async fn controls_in(
    client: &impl deadpool_postgres::GenericClient,
    workflow_id: &WorkflowId,
) -> Result<Vec<ControlRow>> {
    let statement = client.prepare_cached(CONTROLS_SQL).await?;
    let rows = client.query(&statement, &[&workflow_id]).await?;
    rows.iter().map(control).collect()
}

/// Live workflows whose owner's lease ran out, in a random order (so that nodes claiming at once
/// spread over them, and none that is refused for long can starve the others), with whether a
/// cancellation is pending. Only what this node may take is listed: a pending cancellation
/// (which any runtime may finish), or a journal written under this node's runtime and agent
/// configuration (the takeover's rules, `takeover_refusal`). `narrowed` is a predicate ending
/// in `AND` that lists fewer (or `""`).
fn orphans(narrowed: &str) -> String {
    format!(
        "SELECT id, cancel_pending FROM (
             SELECT w.id,
                    w.status = 'cancelling' OR EXISTS (
                        SELECT 1 FROM workflow_controls c
                         WHERE c.workflow = w.id AND c.kind = 'cancel' AND c.applied_at IS NULL
                    ) AS cancel_pending,
                    coalesce(w.data->>'runtime_version', '') AS runtime,
                    coalesce(w.data->>'configuration_version', '') AS configuration
               FROM workflows w
               JOIN extension_execution_leases l ON l.resource_id = w.id
              WHERE {narrowed} w.status IN ('running', 'paused', 'waiting_approval', 'cancelling')
                AND l.expires_at <= reins_now()
         ) orphaned
          WHERE cancel_pending OR (runtime = $2 AND configuration IN ('', $3))
          ORDER BY random() LIMIT $1"
    )
}

/// Every orphan this node may take.
static RECOVERABLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| orphans(""));

/// [`RECOVERABLE`]'s list narrowed to dormant workflows whose wake time came (the partial index
/// `workflows_dormant_by_wake` finds them).
static DORMANT_DUE: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| orphans("w.dormant AND w.wake_at <= reins_now() AND"));
