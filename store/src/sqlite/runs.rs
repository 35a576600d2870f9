//! Child runs on SQLite. Every write runs on the single writer, so each compare-and-set below is
//! also serialised against every other write of the node.

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::{Encoded, SqliteStore, apply, check_fence, parse_json};
use crate::approval::{answered, pending_answer, pending_request_id, status_after_answer};
use crate::lease::ttl_seconds;
use crate::runs::{
    Admission, ApprovalAnswer, CancelAction, NewRun, RunOutcome, RunRenewal, RunRow, RunSlot,
    replay, run_columns,
};
use crate::write::{StepPosition, WriteOp};
use crate::{Error, ExpiredApproval, Result, RunId, RunStatus, WorkflowId};

fn run_row(row: &Row<'_>) -> rusqlite::Result<RawRun> {
    Ok(RawRun {
        run_id: row.get(0)?,
        thread_id: row.get(1)?,
        workflow: row.get(2)?,
        step_id: row.get(3)?,
        attempt: row.get(4)?,
        agent: row.get(5)?,
        status: row.get(6)?,
        owner_worker_id: row.get(7)?,
        lease_expires_at: row.get(8)?,
        cancel_action: row.get(9)?,
        error: row.get(10)?,
        output: row.get(11)?,
        idempotency_key: row.get(12)?,
        idempotency_request: row.get(13)?,
        metadata: row.get(14)?,
        total_tokens: row.get(15)?,
        message_count: row.get(16)?,
        stop_reason: row.get(17)?,
        revision: row.get(18)?,
        created_at: row.get(19)?,
        updated_at: row.get(20)?,
    })
}

/// A run row as SQLite stores it (JSON as text), before decoding.
struct RawRun {
    run_id: RunId,
    thread_id: String,
    workflow: Option<WorkflowId>,
    step_id: Option<String>,
    attempt: Option<i32>,
    agent: String,
    status: String,
    owner_worker_id: Option<String>,
    lease_expires_at: Option<f64>,
    cancel_action: Option<String>,
    error: Option<String>,
    output: Option<String>,
    idempotency_key: Option<String>,
    idempotency_request: Option<String>,
    metadata: String,
    total_tokens: i64,
    message_count: i64,
    stop_reason: Option<String>,
    revision: i64,
    created_at: f64,
    updated_at: f64,
}

impl RawRun {
    fn decode(self) -> Result<RunRow> {
        Ok(RunRow {
            status: RunStatus::read(&self.status, &self.run_id)?,
            run_id: self.run_id,
            thread_id: self.thread_id,
            workflow: self.workflow,
            step_id: self.step_id,
            attempt: self.attempt,
            agent: self.agent,
            owner_worker_id: self.owner_worker_id,
            lease_expires_at: self.lease_expires_at,
            cancel_action: self
                .cancel_action
                .as_deref()
                .map(CancelAction::parse)
                .transpose()?,
            error: self.error,
            output: self.output.as_deref().map(parse_json).transpose()?,
            idempotency_key: self.idempotency_key,
            idempotency_request: self
                .idempotency_request
                .as_deref()
                .map(parse_json)
                .transpose()?,
            metadata: parse_json(&self.metadata)?,
            total_tokens: self.total_tokens,
            message_count: self.message_count,
            stop_reason: self.stop_reason,
            revision: self.revision,
            created_at: self.created_at,
            updated_at: self.updated_at,
        })
    }
}

fn read_run(connection: &Connection, run_id: &RunId) -> Result<Option<RunRow>> {
    connection
        .prepare_cached(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE run_id = ?1"
        ))?
        .query_row([run_id], run_row)
        .optional()?
        .map(RawRun::decode)
        .transpose()
}

/// The workflow's child runs that asked for approval: every one waiting for the answer, and
/// those that carry it of the steps of a page (see `step_page!`), oldest first. The partial
/// index `runs_asked_by_workflow` (migration 20, whose predicate is the first condition's) finds
/// them.
pub(super) fn approval_runs_on(
    connection: &Connection,
    workflow_id: &WorkflowId,
    after: StepPosition,
    limit: u32,
) -> Result<Vec<RunRow>> {
    let mut statement = connection.prepare_cached(concat!(
        "SELECT ",
        run_columns!(),
        " FROM runs WHERE workflow = ?1
            AND (status = 'waiting_for_input' OR json_extract(metadata, '$.hitl_answer') IS NOT NULL)
            AND (status = 'waiting_for_input'
                 OR (step_id, attempt) IN (SELECT step_id, attempt FROM workflow_steps ",
        step_page!(),
        " ORDER BY seq, attempt LIMIT ?4))
          ORDER BY created_at, run_id"
    ))?;
    let rows = statement.query_map(
        params![workflow_id, after.seq, after.attempt, limit],
        run_row,
    )?;
    rows.map(|row| row?.decode()).collect()
}

fn read_run_by_key(connection: &Connection, key: &str) -> Result<Option<RunRow>> {
    connection
        .prepare_cached(concat!(
            "SELECT ",
            run_columns!(),
            " FROM runs WHERE idempotency_key = ?1"
        ))?
        .query_row([key], run_row)
        .optional()?
        .map(RawRun::decode)
        .transpose()
}

/// An admission made ready for the writer on the caller's thread: its JSON is text and its
/// journal is encoded, so the single writer only binds them.
struct Ready {
    /// The run, without its metadata document and its step's journal (both below).
    run: NewRun,
    metadata: String,
    request: Option<String>,
    journal: Vec<Encoded>,
}

impl Ready {
    fn new(mut run: NewRun) -> Ready {
        let journal = run
            .step
            .as_mut()
            .map(|step| std::mem::take(&mut step.journal))
            .unwrap_or_default();
        Ready {
            metadata: std::mem::take(&mut run.metadata).to_string(),
            request: run
                .idempotency
                .as_ref()
                .map(|(_, request)| request.to_string()),
            journal: journal.into_iter().map(Encoded::new).collect(),
            run,
        }
    }
}

/// Slots held now that `journal` releases when it is applied, below, in the admission's own
/// transaction (the outcome of the workflow's step before carries its `ReleaseSlot`): they count
/// as free, or a workflow going from one step to the next would be refused the place it holds
/// (with as many workflows as slots, every other admission was refused and queued).
fn released_by(connection: &Connection, journal: &[Encoded]) -> Result<i64> {
    let mut steps = std::collections::BTreeSet::new();
    for encoded in journal {
        match &encoded.op {
            WriteOp::ReleaseSlot {
                workflow_id,
                step_id,
            } => {
                steps.insert((workflow_id, step_id));
            }
            // Every slot of the workflow: nothing else of the journal can release more.
            WriteOp::ReleaseSlots { workflow_id } => {
                return Ok(connection
                    .prepare_cached("SELECT count(*) FROM workflow_slots WHERE workflow = ?1")?
                    .query_row(params![workflow_id], |row| row.get(0))?);
            }
            _ => {}
        }
    }
    let mut released = 0;
    for (workflow_id, step_id) in steps {
        released += connection
            .prepare_cached(
                "SELECT count(*) FROM workflow_slots WHERE workflow = ?1 AND step_id = ?2",
            )?
            .query_row(params![workflow_id, step_id], |row| row.get::<_, i64>(0))?;
    }
    Ok(released)
}

/// The slot a step claims, and the rules it claims it under.
struct SlotPlace<'a> {
    workflow_id: &'a WorkflowId,
    step_id: &'a str,
    attempt: i32,
    slots_max: u64,
    slots_per_user_max: u64,
    slots_reserved: u64,
}

/// Claims a slot for `place` in the writer's transaction: `false` (nothing written) when every
/// slot is taken, when the workflow's owner holds their share while another user waits below
/// theirs, or when they hold their share and the slot is one of those kept for others. A step that holds a slot already keeps it for its new attempt. `released` slots,
/// which the transaction gives back before it commits (the owner's own: the carried journal is
/// the workflow's), count as free.
fn claim_slot(connection: &Connection, place: &SlotPlace<'_>, released: i64) -> Result<bool> {
    let held = connection
        .prepare_cached(
            "UPDATE workflow_slots SET attempt = ?3 WHERE workflow = ?1 AND step_id = ?2",
        )?
        .execute(params![place.workflow_id, place.step_id, place.attempt])?;
    if held > 0 {
        return Ok(true);
    }
    let taken: i64 = connection
        .prepare_cached("SELECT count(*) FROM workflow_slots")?
        .query_row([], |row| row.get(0))?;
    let taken = u64::try_from(taken - released).unwrap_or(u64::MAX);
    if taken >= place.slots_max
        || (taken >= place.slots_per_user_max && share_binds(connection, place, released)?)
        || reserve_binds(connection, place, taken, released)?
    {
        return Ok(false);
    }
    connection
        .prepare_cached(
            "INSERT INTO workflow_slots (workflow, step_id, attempt, created_at)
             VALUES (?1, ?2, ?3, unixepoch('subsec'))",
        )?
        .execute(params![place.workflow_id, place.step_id, place.attempt])?;
    Ok(true)
}

/// Whether the share of the step's workflow's owner refuses it a slot: they hold it already
/// while another user waits below theirs (a step of theirs `queued` in a live workflow whose
/// lease holds). Asked only while the cluster holds a share's worth of slots (fewer cannot all
/// be the owner's), and nothing more while no step at all is queued: this runs on the one writer
/// thread. Whether another user waits is asked before the owner's count, which a user alone then
/// never pays; that look walks the queued steps (the owner's own too), the count the slots held,
/// each looking their workflows up (`CROSS JOIN` keeps SQLite to that order), never every live
/// workflow or every workflow of a user.
fn share_binds(connection: &Connection, place: &SlotPlace<'_>, released: i64) -> Result<bool> {
    if place.slots_per_user_max >= place.slots_max {
        return Ok(false);
    }
    let queued: bool = connection
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM workflow_steps WHERE status = 'queued')")?
        .query_row([], |row| row.get(0))?;
    if !queued {
        return Ok(false);
    }
    let Some(user_id) = owner_of(connection, place.workflow_id)? else {
        return Ok(false);
    };
    let share = i64::try_from(place.slots_per_user_max).unwrap_or(i64::MAX);
    let another_waits: bool = connection
        .prepare_cached(
            "SELECT EXISTS (
                 SELECT 1 FROM workflow_steps AS q
                  CROSS JOIN workflows AS w
                  CROSS JOIN extension_execution_leases AS l
                  WHERE q.status = 'queued' AND w.id = q.workflow AND w.user_id <> ?1
                    AND l.resource_id = q.workflow
                    AND w.status IN ('running', 'paused', 'waiting_approval')
                    AND l.expires_at > unixepoch('subsec')
                    AND w.user_id NOT IN (SELECT o.user_id
                                            FROM workflow_slots AS h CROSS JOIN workflows AS o
                                           WHERE o.id = h.workflow
                                           GROUP BY o.user_id HAVING count(*) >= ?2))",
        )?
        .query_row(params![user_id, share], |row| row.get(0))?;
    if !another_waits {
        return Ok(false);
    }
    Ok(slots_of(connection, &user_id)? - released >= share)
}

/// Whether the slots kept for other users refuse the step one: with `taken` slots held (less
/// what the transaction gives back), this one would leave fewer than `slots_reserved` free, and
/// its workflow's owner holds their share already (less `released`, their own). The owner's
/// count is asked only at that edge, so a cluster with room to spare pays nothing for it.
fn reserve_binds(
    connection: &Connection,
    place: &SlotPlace<'_>,
    taken: u64,
    released: i64,
) -> Result<bool> {
    if place.slots_reserved == 0
        || place.slots_per_user_max >= place.slots_max
        || taken.saturating_add(place.slots_reserved) < place.slots_max
    {
        return Ok(false);
    }
    let Some(user_id) = owner_of(connection, place.workflow_id)? else {
        return Ok(false);
    };
    let share = i64::try_from(place.slots_per_user_max).unwrap_or(i64::MAX);
    Ok(slots_of(connection, &user_id)? - released >= share)
}

/// The owner of `workflow_id`, if it exists.
fn owner_of(connection: &Connection, workflow_id: &WorkflowId) -> Result<Option<String>> {
    Ok(connection
        .prepare_cached("SELECT user_id FROM workflows WHERE id = ?1")?
        .query_row(params![workflow_id], |row| row.get::<_, String>(0))
        .optional()?)
}

/// The slots the steps of `user_id`'s workflows hold, each slot looking its workflow up.
fn slots_of(connection: &Connection, user_id: &str) -> Result<i64> {
    Ok(connection
        .prepare_cached(
            "SELECT count(*) FROM workflow_slots AS s CROSS JOIN workflows AS w
              WHERE w.id = s.workflow AND w.user_id = ?1",
        )?
        .query_row(params![user_id], |row| row.get(0))?)
}

/// What the writer answers an admission with: a run it inserted goes back as stored, so its JSON
/// is decoded on the caller's thread rather than the single writer's.
enum Admitted {
    Inserted(RawRun),
    Other(Admission),
}

fn admit(connection: &Connection, ready: &Ready) -> Result<Admitted> {
    let run = &ready.run;
    if let Some(step) = &run.step {
        check_fence(connection, &step.fence)?;
    }
    if let Some((key, request)) = &run.idempotency
        && let Some(existing) = read_run_by_key(connection, key)?
    {
        return replay(existing, request).map(Admitted::Other);
    }
    if let Some(step) = &run.step {
        let place = SlotPlace {
            workflow_id: &step.workflow_id,
            step_id: &step.step_id,
            attempt: step.attempt,
            slots_max: step.slots_max,
            slots_per_user_max: step.slots_per_user_max,
            slots_reserved: step.slots_reserved,
        };
        if !claim_slot(connection, &place, released_by(connection, &ready.journal)?)? {
            return Ok(Admitted::Other(Admission::Queued));
        }
    }
    let key = run.idempotency.as_ref().map(|(key, _)| key.as_str());
    let inserted = connection
        .prepare_cached(concat!(
            "INSERT INTO runs (run_id, thread_id, workflow, step_id, attempt, agent, status,
                               owner_worker_id, lease_expires_at, idempotency_key,
                               idempotency_request, metadata, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7, unixepoch('subsec') + ?8, ?9, ?10,
                     ?11, unixepoch('subsec'), unixepoch('subsec'))
             RETURNING ",
            run_columns!()
        ))?
        .query_row(
            params![
                run.run_id,
                run.thread_id,
                run.step.as_ref().map(|s| &s.workflow_id),
                run.step.as_ref().map(|s| &s.step_id),
                run.step.as_ref().map(|s| s.attempt),
                run.agent,
                run.owner,
                ttl_seconds(run.lease_ms),
                key,
                ready.request,
                ready.metadata,
            ],
            run_row,
        );
    let inserted = match inserted {
        Ok(inserted) => inserted,
        Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::ConstraintViolation) => {
            return Err(Error::Conflict(format!(
                "thread {:?} already has an active run",
                run.thread_id
            )));
        }
        Err(e) => return Err(e.into()),
    };
    // The fence was checked in this transaction, and this writer is the only one. (A journal
    // comes only with a workflow step.)
    if let Some(step) = &run.step {
        for op in &ready.journal {
            apply(connection, &step.fence, op)?;
        }
    }
    Ok(Admitted::Inserted(inserted))
}

impl SqliteStore {
    pub(crate) async fn admit_run(&self, run: NewRun) -> Result<Admission> {
        let ready = Ready::new(run);
        match self
            .write(move |connection| admit(connection, &ready))
            .await?
        {
            // The row holds what `Ready` encoded a moment ago and the status just inserted, so
            // decoding it should not fail; if it does, the admission has already committed, and
            // only recovery's read of the store may say what exists: never a plain failure.
            Admitted::Inserted(row) => row.decode().map(Admission::Admitted).map_err(|e| {
                Error::OutcomeUnknown(format!(
                    "the run was admitted, but its stored row does not decode: {e}"
                ))
            }),
            Admitted::Other(admission) => Ok(admission),
        }
    }

    pub(crate) async fn read_run(&self, run_id: &RunId) -> Result<Option<RunRow>> {
        let run_id = run_id.to_owned();
        self.read(move |connection| read_run(connection, &run_id))
            .await
    }

    pub(crate) async fn renew_run_lease(
        &self,
        run_id: &RunId,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Result<RunRenewal, Option<RunRow>>> {
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.write(move |connection| {
            let renewed = connection
                .prepare_cached(
                    "UPDATE runs SET lease_expires_at =
                            max(coalesce(lease_expires_at, 0), unixepoch('subsec') + ?3)
                      WHERE run_id = ?1 AND owner_worker_id = ?2
                        AND status IN ('pending', 'running', 'waiting_for_input')
                        AND lease_expires_at > unixepoch('subsec')
                     RETURNING lease_expires_at, unixepoch('subsec'), cancel_action, status,
                               metadata",
                )?
                .query_row(params![run_id, owner, ttl_seconds(lease_ms)], |row| {
                    Ok((
                        row.get(0)?,
                        row.get(1)?,
                        row.get::<_, Option<String>>(2)?,
                        row.get::<_, String>(3)?,
                        row.get::<_, String>(4)?,
                    ))
                })
                .optional()?;
            match renewed {
                Some((expires_at, now, cancel, status, metadata)) => Ok(Ok(RunRenewal {
                    expires_at,
                    now,
                    cancel_action: cancel.as_deref().map(CancelAction::parse).transpose()?,
                    answer: pending_answer(
                        RunStatus::read(&status, &run_id)?,
                        &parse_json(&metadata)?,
                    ),
                })),
                None => Ok(Err(read_run(connection, &run_id)?)),
            }
        })
        .await
    }

    pub(crate) async fn request_run_cancel(
        &self,
        run_id: &RunId,
        action: CancelAction,
    ) -> Result<Option<CancelAction>> {
        let run_id = run_id.to_owned();
        self.write(move |connection| {
            let effective: Option<String> = connection
                .prepare_cached(
                    "UPDATE runs SET cancel_action = coalesce(cancel_action, ?2),
                            status = CASE status WHEN 'waiting_for_input' THEN 'interrupted'
                                                 ELSE status END,
                            revision = revision + 1, updated_at = unixepoch('subsec')
                      WHERE run_id = ?1 AND status IN ('pending', 'running', 'waiting_for_input')
                     RETURNING cancel_action",
                )?
                .query_row(params![run_id, action.as_str()], |row| row.get(0))
                .optional()?;
            effective.as_deref().map(CancelAction::parse).transpose()
        })
        .await
    }

    pub(crate) async fn update_run_status(
        &self,
        run_id: &RunId,
        owner: &str,
        status: RunStatus,
        metadata: Option<Value>,
    ) -> Result<bool> {
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.write(move |connection| {
            let changed = connection
                .prepare_cached(
                    "UPDATE runs SET status = ?3, metadata = coalesce(?4, metadata),
                            revision = revision + 1, updated_at = unixepoch('subsec')
                      WHERE run_id = ?1 AND owner_worker_id = ?2
                        AND status IN ('pending', 'running')
                        AND (?3 <> 'waiting_for_input' OR cancel_action IS NULL)",
                )?
                .execute(params![
                    run_id,
                    owner,
                    status.as_str(),
                    metadata.map(|m| m.to_string())
                ])?;
            if changed == 1 && status == RunStatus::WaitingForInput {
                // Nobody runs while a person decides: the step's slot is given back in the
                // same transaction (its delete cues the steps waiting for one).
                connection
                    .prepare_cached(
                        "DELETE FROM workflow_slots
                          WHERE (workflow, step_id, attempt) =
                                (SELECT workflow, step_id, attempt FROM runs WHERE run_id = ?1)",
                    )?
                    .execute(params![run_id])?;
            }
            Ok(changed == 1)
        })
        .await
    }

    pub(crate) async fn finalize_run(
        &self,
        run_id: &RunId,
        owner: &str,
        outcome: &RunOutcome,
        require_not_cancelled: bool,
    ) -> Result<bool> {
        let (run_id, owner, outcome) = (run_id.to_owned(), owner.to_owned(), outcome.clone());
        self.write(move |connection| {
            let changed = connection
                .prepare_cached(
                    "UPDATE runs SET status = ?3, error = ?4, output = ?5, stop_reason = ?6,
                            total_tokens = ?8, message_count = ?9,
                            metadata = CASE WHEN ?10 IS NULL THEN metadata
                                            ELSE json_set(metadata, '$.failure', json(?10)) END,
                            revision = revision + 1, updated_at = unixepoch('subsec')
                      WHERE run_id = ?1 AND owner_worker_id = ?2
                        AND status IN ('pending', 'running', 'waiting_for_input')
                        AND (?7 = 0 OR cancel_action IS NULL)",
                )?
                .execute(params![
                    run_id,
                    owner,
                    outcome.status.as_str(),
                    outcome.error,
                    outcome.output.as_ref().map(Value::to_string),
                    outcome.stop_reason,
                    require_not_cancelled,
                    outcome.total_tokens,
                    outcome.message_count,
                    outcome
                        .failure
                        .as_ref()
                        .map(|failure| failure.to_json().to_string()),
                ])?;
            Ok(changed == 1)
        })
        .await
    }

    pub(crate) async fn answer_approval(
        &self,
        thread_id: &str,
        request_ids: &[String],
        answer: &Value,
    ) -> Result<Option<ApprovalAnswer>> {
        let (thread_id, request_ids, answer) =
            (thread_id.to_owned(), request_ids.to_vec(), answer.clone());
        self.write(move |connection| {
            let newest = connection
                .prepare_cached(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE thread_id = ?1 ORDER BY created_at DESC, rowid DESC LIMIT 1"
                ))?
                .query_row([&thread_id], run_row)
                .optional()?
                .map(RawRun::decode)
                .transpose()?;
            let Some(paused) = newest.filter(|run| run.status == RunStatus::WaitingForInput) else {
                return Ok(None);
            };
            let request_id = match pending_request_id(&paused.metadata) {
                Some(id) if request_ids.iter().any(|r| r == id) => id.to_owned(),
                _ => return Ok(None),
            };
            let status = status_after_answer(&paused.metadata);
            let revision: Option<i64> = connection
                .prepare_cached(
                    "UPDATE runs SET status = ?4, metadata = ?3, revision = revision + 1,
                            updated_at = unixepoch('subsec')
                      WHERE run_id = ?1 AND status = 'waiting_for_input' AND revision = ?2
                     RETURNING revision",
                )?
                .query_row(
                    params![
                        paused.run_id,
                        paused.revision,
                        answered(&paused.metadata, &request_id, &answer).to_string(),
                        status.as_str(),
                    ],
                    |row| row.get(0),
                )
                .optional()?;
            Ok(revision.map(|revision| ApprovalAnswer {
                run_id: paused.run_id,
                thread_id,
                previous_metadata: paused.metadata,
                revision,
                status,
            }))
        })
        .await
    }

    pub(crate) async fn restore_approval(&self, answer: &ApprovalAnswer) -> Result<bool> {
        let answer = answer.clone();
        self.write(move |connection| {
            let changed = connection
                .prepare_cached(
                    "UPDATE runs SET status = 'waiting_for_input', metadata = ?3,
                            revision = revision + 1, updated_at = unixepoch('subsec')
                      WHERE run_id = ?1 AND revision = ?2",
                )?
                .execute(params![
                    answer.run_id,
                    answer.revision,
                    answer.previous_metadata.to_string()
                ])?;
            Ok(changed == 1)
        })
        .await
    }

    pub(crate) async fn claim_run_slot(
        &self,
        run_id: &RunId,
        owner: &str,
        slots_max: u64,
        slots_per_user_max: u64,
        slots_reserved: u64,
    ) -> Result<RunSlot> {
        let (run_id, owner) = (run_id.to_owned(), owner.to_owned());
        self.write(move |connection| {
            let step = connection
                .prepare_cached(
                    "SELECT r.workflow, r.step_id, r.attempt
                       FROM runs AS r JOIN workflows AS w ON w.id = r.workflow
                      WHERE r.run_id = ?1 AND r.owner_worker_id = ?2 AND r.status = 'running'
                        AND r.cancel_action IS NULL AND r.step_id IS NOT NULL
                        AND w.status IN ('running', 'paused', 'waiting_approval')",
                )?
                .query_row(params![run_id, owner], |row| {
                    Ok((
                        row.get::<_, WorkflowId>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, i32>(2)?,
                    ))
                })
                .optional()?;
            let Some((workflow_id, step_id, attempt)) = step else {
                return Ok(RunSlot::Refused);
            };
            let place = SlotPlace {
                workflow_id: &workflow_id,
                step_id: &step_id,
                attempt,
                slots_max,
                slots_per_user_max,
                slots_reserved,
            };
            Ok(if claim_slot(connection, &place, 0)? {
                RunSlot::Held
            } else {
                RunSlot::Queued
            })
        })
        .await
    }

    pub(crate) async fn expired_approvals(&self, limit: u32) -> Result<Vec<ExpiredApproval>> {
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE status = 'waiting_for_input'
                     AND json_extract(metadata, '$.hitl_deadline_at_ms')
                         <= unixepoch('subsec') * 1000
                   LIMIT ?1"
            ))?;
            let rows = statement
                .query_map([limit], run_row)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut expired = Vec::with_capacity(rows.len());
            for row in rows {
                expired.extend(ExpiredApproval::of(&row.decode()?, f64::MAX));
            }
            Ok(expired)
        })
        .await
    }

    pub(crate) async fn claim_orphan_runs(&self, claimer: &str, limit: u32) -> Result<Vec<RunId>> {
        let claimer = claimer.to_owned();
        self.write(move |connection| {
            let mut statement = connection.prepare_cached(
                "UPDATE runs SET status = 'error', stop_reason = 'orphan_recovered',
                        error = 'the node running it stopped renewing its lease',
                        owner_worker_id = ?1, revision = revision + 1,
                        updated_at = unixepoch('subsec')
                  WHERE run_id IN (SELECT run_id FROM runs
                                    WHERE status IN ('pending', 'running')
                                      AND lease_expires_at <= unixepoch('subsec')
                                    LIMIT ?2)
                 RETURNING run_id, workflow, step_id, attempt",
            )?;
            let claimed = statement
                .query_map(params![claimer, limit], |row| {
                    Ok((
                        row.get::<_, RunId>(0)?,
                        row.get::<_, Option<WorkflowId>>(1)?,
                        row.get::<_, Option<String>>(2)?,
                        row.get::<_, Option<i64>>(3)?,
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            // A closed run is no longer live, so the workflow slot its step held is given back
            // in the same transaction: a dead node's children never keep slots.
            let mut free = connection.prepare_cached(
                "DELETE FROM workflow_slots WHERE workflow = ?1 AND step_id = ?2 AND attempt = ?3",
            )?;
            for (_, workflow, step_id, attempt) in &claimed {
                if let (Some(workflow), Some(step_id), Some(attempt)) = (workflow, step_id, attempt)
                {
                    free.execute(params![workflow, step_id, attempt])?;
                }
            }
            Ok(claimed.into_iter().map(|(run_id, ..)| run_id).collect())
        })
        .await
    }

    pub(crate) async fn count_slots(&self) -> Result<i64> {
        self.read(|connection| {
            Ok(connection
                .prepare_cached("SELECT count(*) FROM workflow_slots")?
                .query_row([], |row| row.get(0))?)
        })
        .await
    }
}
