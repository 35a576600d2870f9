//! Child runs on PostgreSQL. Each compare-and-set is one `UPDATE ... WHERE` on the row's owner,
//! status or revision: under READ COMMITTED a concurrent writer of the same row makes the second
//! statement wait and re-check its condition on the new version, so exactly one of two racing
//! writers wins.

use deadpool_postgres::{Object, Pool};
use serde_json::Value;
use tokio_postgres::{Row, Statement};

use super::batch::Job;
use super::conn::connection;
use super::{
    FENCE_SQL, PgStore, begin_error, commit_error, fence_params, fenced_error, op_params, op_sql,
    status_changes,
};
use crate::lease::ttl_seconds;
use crate::runs::run_columns;
use crate::runs::{
    Admission, ApprovalAnswer, CancelAction, NewRun, RunOutcome, RunRenewal, RunRow, RunSlot,
    WorkflowStep, answered, pending_answer, pending_request_id, replay, status_after_answer,
};
use crate::{Error, Result, RunId, RunStatus};

/// `SELECT <run columns> FROM runs` followed by the given clauses (literals, or macros that
/// expand to one), as one literal (SQL is never formatted per call).
macro_rules! select_run {
    ($($clause:tt)+) => {
        concat!("SELECT ", run_columns!(), " FROM runs ", $($clause)+)
    };
}

// Admissions with a slot claim a free slot number below `slots_max` in `reins_claim_slot`
// (migration 7): each number is held once (a unique index), so at most `slots_max` slots are held
// across the cluster, and two admissions wait on each other only for the same number. Admissions
// call it through `reins_claim_fair_slot` (migration 31), which then refuses the slot (rolled
// back with the transaction) to a step whose workflow's owner held `slots_per_user_max` slots
// already while another user waits below that share: two admissions of one user wait on each
// other for that count, only while another user waits.

pub(super) fn decode(row: &Row) -> Result<RunRow> {
    let run_id: RunId = row.get(0);
    Ok(RunRow {
        status: RunStatus::read(row.get(6), &run_id)?,
        run_id,
        thread_id: row.get(1),
        workflow: row.get(2),
        step_id: row.get(3),
        attempt: row.get(4),
        agent: row.get(5),
        owner_worker_id: row.get(7),
        lease_expires_at: row.get(8),
        cancel_action: row
            .get::<_, Option<&str>>(9)
            .map(CancelAction::parse)
            .transpose()?,
        error: row.get(10),
        output: row.get(11),
        idempotency_key: row.get(12),
        idempotency_request: row.get(13),
        metadata: row.get(14),
        total_tokens: row.get(15),
        message_count: row.get(16),
        stop_reason: row.get(17),
        revision: row.get(18),
        created_at: row.get(19),
        updated_at: row.get(20),
    })
}

/// The workflow's child runs that asked for approval: every one waiting for the answer, and
/// those that carry it of the steps of a page (the parameters of `step_page!`), oldest first.
/// The partial index `runs_asked_by_workflow` (migration 20, whose predicate is the first
/// condition's) finds them.
pub(super) const APPROVAL_RUNS_SQL: &str = select_run!(
    "WHERE workflow = $1
       AND (status = 'waiting_for_input' OR metadata -> 'hitl_answer' IS NOT NULL)
       AND (status = 'waiting_for_input'
            OR (step_id, attempt) IN (SELECT step_id, attempt FROM workflow_steps ",
    step_page!(),
    " ORDER BY seq, attempt LIMIT $4))
     ORDER BY created_at, run_id"
);

async fn read_by_key(client: &Object, key: &str) -> Result<Option<RunRow>> {
    let statement = client
        .prepare_cached(select_run!("WHERE idempotency_key = $1"))
        .await?;
    client
        .query_opt(&statement, &[&key])
        .await?
        .as_ref()
        .map(decode)
        .transpose()
}

/// The statements of an admission with a workflow step, prepared on one connection.
pub(super) struct AdmitStatements {
    insert: Statement,
    fence: Statement,
    claim: Statement,
    journal: Vec<Statement>,
}

/// What each statement of an admission's body answered, in the order they were sent.
pub(super) struct AdmitAnswers {
    fenced: std::result::Result<u64, tokio_postgres::Error>,
    inserted: std::result::Result<Row, tokio_postgres::Error>,
    journaled: Vec<std::result::Result<u64, tokio_postgres::Error>>,
    claimed: std::result::Result<u64, tokio_postgres::Error>,
}

impl AdmitAnswers {
    /// The first statement that failed, in the order they were sent: the statements after it
    /// only report the aborted transaction.
    pub(super) fn first_error(&self) -> Option<&tokio_postgres::Error> {
        self.fenced
            .as_ref()
            .err()
            .or_else(|| self.inserted.as_ref().err())
            .or_else(|| self.journaled.iter().find_map(|r| r.as_ref().err()))
            .or_else(|| self.claimed.as_ref().err())
    }
}

const INSERT_RUN_SQL: &str = concat!(
    "INSERT INTO runs (run_id, thread_id, workflow, step_id, attempt, agent, status,
                       owner_worker_id, lease_expires_at, idempotency_key,
                       idempotency_request, metadata, created_at, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, 'running', $7, reins_now() + $8, $9, $10, $11,
             reins_now(), reins_now())
     RETURNING ",
    run_columns!()
);

const CLAIM_SLOT_SQL: &str = "SELECT reins_claim_fair_slot($1, $2, $3, $4, $5)";

pub(super) async fn prepare_admit(client: &Object, step: &WorkflowStep) -> Result<AdmitStatements> {
    let insert = client.prepare_cached(INSERT_RUN_SQL).await?;
    let fence = client.prepare_cached(FENCE_SQL).await?;
    let claim = client.prepare_cached(CLAIM_SLOT_SQL).await?;
    let mut journal = Vec::with_capacity(step.journal.len());
    for op in &step.journal {
        journal.push(client.prepare_cached(op_sql(op)).await?);
    }
    Ok(AdmitStatements {
        insert,
        fence,
        claim,
        journal,
    })
}

/// The values of [`INSERT_RUN_SQL`]'s parameters that are not fields of the run as they are.
struct InsertValues<'a> {
    key: Option<&'a String>,
    request: Option<&'a Value>,
    workflow_id: Option<&'a crate::WorkflowId>,
    step_id: Option<&'a String>,
    attempt: Option<i32>,
    lease_seconds: f64,
}

impl<'a> InsertValues<'a> {
    fn of(run: &'a NewRun) -> Self {
        InsertValues {
            key: run.idempotency.as_ref().map(|(key, _)| key),
            request: run.idempotency.as_ref().map(|(_, request)| request),
            workflow_id: run.step.as_ref().map(|s| &s.workflow_id),
            step_id: run.step.as_ref().map(|s| &s.step_id),
            attempt: run.step.as_ref().map(|s| s.attempt),
            lease_seconds: ttl_seconds(run.lease_ms),
        }
    }

    /// The parameters of [`INSERT_RUN_SQL`], in order.
    fn params(&'a self, run: &'a NewRun) -> [&'a (dyn tokio_postgres::types::ToSql + Sync); 11] {
        [
            &run.run_id,
            &run.thread_id,
            &self.workflow_id,
            &self.step_id,
            &self.attempt,
            &run.agent,
            &run.owner,
            &self.lease_seconds,
            &self.key,
            &self.request,
            &run.metadata,
        ]
    }
}

/// Sends an admission's statements, without `BEGIN` or `COMMIT`: every future is polled once,
/// in this order, before any answer is awaited, so the statements go out together and in order
/// behind whatever the caller sent before. The fence comes first and holds the lease row until
/// the commit, so the journal's changes after it check nothing more (`op_sql`). The slot is
/// claimed last: after the journal, which releases the slot of the workflow's step before (its
/// outcome's `ReleaseSlot` is carried here), so a workflow going from one step to the next keeps
/// its place under `slots_max` (claimed first, that slot still counted: with as many workflows as
/// slots, every other admission was refused and queued); and the claim's lock is held only for
/// the server's work and the commit.
pub(super) async fn admit_body(
    client: &Object,
    statements: &AdmitStatements,
    run: &NewRun,
    step: &WorkflowStep,
) -> AdmitAnswers {
    let values = InsertValues::of(run);
    let insert_params = values.params(run);
    let fenced_by = fence_params(&step.fence);
    let journal_params: Vec<_> = step
        .journal
        .iter()
        .map(|op| op_params(&step.fence, op))
        .collect();
    let slots_max = i64::try_from(step.slots_max).unwrap_or(i64::MAX);
    let slots_per_user_max = i64::try_from(step.slots_per_user_max).unwrap_or(i64::MAX);
    let claim_params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &step.workflow_id,
        &step.step_id,
        &step.attempt,
        &slots_max,
        &slots_per_user_max,
    ];
    let (fenced, inserted, journaled, claimed) = tokio::join!(
        client.execute(&statements.fence, &fenced_by),
        client.query_one(&statements.insert, &insert_params),
        futures_util::future::join_all(
            statements
                .journal
                .iter()
                .zip(&journal_params)
                .map(|(statement, params)| client.execute(statement, params)),
        ),
        client.execute(&statements.claim, &claim_params),
    );
    AdmitAnswers {
        fenced,
        inserted,
        journaled,
        claimed,
    }
}

/// What an admission's answers mean, the transaction's `COMMIT` answered by `committed`: the
/// first statement that failed decides (the statements after it only report the aborted
/// transaction), then the commit.
pub(super) fn admit_outcome(
    answers: AdmitAnswers,
    step: &WorkflowStep,
    committed: std::result::Result<(), tokio_postgres::Error>,
) -> Result<Admission> {
    answers.fenced.map_err(|e| fenced_error(&step.fence, e))?;
    // A refused insert (the thread's one active run, a repeated key): the caller looks for the
    // key's run.
    let inserted = answers.inserted.map_err(|e| fenced_error(&step.fence, e))?;
    if let Some(e) = answers.journaled.into_iter().find_map(|r| r.err()) {
        return Err(fenced_error(&step.fence, e));
    }
    match answers.claimed {
        // Every slot is taken: the pipelined COMMIT rolled the insert and the journal back.
        Err(error) if error.code().is_some_and(|c| c.code() == "RS001") => {
            return Ok(Admission::Queued);
        }
        claimed => {
            claimed.map_err(|e| fenced_error(&step.fence, e))?;
        }
    }
    committed.map_err(commit_error)?;
    Ok(Admission::Admitted(decode(&inserted)?))
}

/// One admission in a transaction of its own, in one round trip.
async fn admit_pipelined(client: &Object, run: &NewRun) -> Result<Admission> {
    let Some(step) = &run.step else {
        let insert = client.prepare_cached(INSERT_RUN_SQL).await?;
        let values = InsertValues::of(run);
        let insert_params = values.params(run);
        // One statement is its own transaction; without an answer, its commit is unknown.
        let inserted = client
            .query_one(&insert, &insert_params)
            .await
            .map_err(commit_error)?;
        return Ok(Admission::Admitted(decode(&inserted)?));
    };
    let statements = prepare_admit(client, step).await?;
    let (begun, answers, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        admit_body(client, &statements, run, step),
        client.batch_execute("COMMIT"),
    );
    if let Err(e) = begun {
        return Err(begin_error(e));
    }
    admit_outcome(answers, step, committed)
}

/// Admits `run` on a connection of its own, as one transaction: what a batch falls back to.
pub(super) async fn admit_alone(pool: &Pool, run: &NewRun) -> Result<Admission> {
    let client = connection(pool).await?;
    match admit_pipelined(&client, run).await {
        Err(Error::Conflict(_)) => {
            // The key admitted a run before (or a racing admission with it won): the same
            // request gets its run; anything else is a conflict on the key or on the thread's
            // one active run.
            if let Some((key, request)) = &run.idempotency
                && let Some(existing) = read_by_key(&client, key).await?
            {
                return replay(existing, request);
            }
            Err(Error::Conflict(format!(
                "thread {:?} already has an active run",
                run.thread_id
            )))
        }
        other => other,
    }
}

/// The terminal compare-and-set of a child run.
pub(super) const FINALIZE_SQL: &str =
    "UPDATE runs SET status = $3, error = $4, output = $5, stop_reason = $6,
                        total_tokens = $8, message_count = $9,
                        revision = revision + 1, updated_at = reins_now()
                  WHERE run_id = $1 AND owner_worker_id = $2
                    AND status IN ('pending', 'running', 'waiting_for_input')
                    AND (NOT $7 OR cancel_action IS NULL)";

/// A child run's end, as the batcher carries it.
#[derive(Debug, Clone)]
pub(super) struct Finalize {
    pub(super) run_id: RunId,
    pub(super) owner: String,
    pub(super) outcome: RunOutcome,
    pub(super) require_not_cancelled: bool,
}

/// Sends [`FINALIZE_SQL`] for `end`; its answer is the rows changed.
pub(super) async fn finalize_body(
    client: &Object,
    statement: &Statement,
    end: &Finalize,
) -> std::result::Result<u64, tokio_postgres::Error> {
    client
        .execute(
            statement,
            &[
                &end.run_id,
                &end.owner,
                &end.outcome.status.as_str(),
                &end.outcome.error,
                &end.outcome.output,
                &end.outcome.stop_reason,
                &end.require_not_cancelled,
                &end.outcome.total_tokens,
                &end.outcome.message_count,
            ],
        )
        .await
}

/// Records a child run's end as a statement of its own (its own transaction): what a batch
/// falls back to.
pub(super) async fn finalize_alone(pool: &Pool, end: &Finalize) -> Result<bool> {
    let client = connection(pool).await?;
    let statement = client.prepare_cached(FINALIZE_SQL).await?;
    let changed = finalize_body(&client, &statement, end)
        .await
        .map_err(commit_error)?;
    Ok(changed == 1)
}

impl PgStore {
    pub(crate) async fn admit_run(&self, run: NewRun) -> Result<Admission> {
        let Some(step) = &run.step else {
            // A run of no workflow is one statement: nothing to gain from a batch.
            return admit_alone(&self.pool, &run).await;
        };
        let statuses = status_changes(&step.journal);
        let admitted = self.batcher.submit(|reply| Job::Admit { run, reply }).await;
        if let Ok(Admission::Admitted(_)) = &admitted {
            self.cue_committed(statuses);
        }
        admitted
    }

    pub(crate) async fn read_run(&self, run_id: &RunId) -> Result<Option<RunRow>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(select_run!("WHERE run_id = $1"))
            .await?;
        client
            .query_opt(&statement, &[&run_id])
            .await?
            .as_ref()
            .map(decode)
            .transpose()
    }

    pub(crate) async fn renew_run_lease(
        &self,
        run_id: &RunId,
        owner: &str,
        lease_ms: u64,
    ) -> Result<Result<RunRenewal, Option<RunRow>>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "UPDATE runs SET lease_expires_at =
                        GREATEST(coalesce(lease_expires_at, 0), reins_now() + $3)
                  WHERE run_id = $1 AND owner_worker_id = $2
                    AND status IN ('pending', 'running', 'waiting_for_input')
                    AND lease_expires_at > reins_now()
                 RETURNING lease_expires_at, reins_now(), cancel_action, status, metadata",
            )
            .await?;
        let renewed = client
            .query_opt(&statement, &[&run_id, &owner, &ttl_seconds(lease_ms)])
            .await?;
        match renewed {
            Some(row) => Ok(Ok(RunRenewal {
                expires_at: row.get(0),
                now: row.get(1),
                cancel_action: row
                    .get::<_, Option<&str>>(2)
                    .map(CancelAction::parse)
                    .transpose()?,
                answer: pending_answer(
                    RunStatus::read(row.get(3), run_id)?,
                    &row.get::<_, Value>(4),
                ),
            })),
            None => {
                drop(client);
                Ok(Err(self.read_run(run_id).await?))
            }
        }
    }

    pub(crate) async fn request_run_cancel(
        &self,
        run_id: &RunId,
        action: CancelAction,
    ) -> Result<Option<CancelAction>> {
        let client = self.connection().await?;
        let row = client
            .query_opt(
                &client
                    .prepare_cached(
                        "UPDATE runs SET cancel_action = coalesce(cancel_action, $2),
                        status = CASE status WHEN 'waiting_for_input' THEN 'interrupted'
                                             ELSE status END,
                        revision = revision + 1, updated_at = reins_now()
                  WHERE run_id = $1 AND status IN ('pending', 'running', 'waiting_for_input')
                 RETURNING cancel_action",
                    )
                    .await?,
                &[&run_id, &action.as_str()],
            )
            .await
            .map_err(commit_error)?;
        row.map(|row| CancelAction::parse(row.get(0))).transpose()
    }

    pub(crate) async fn update_run_status(
        &self,
        run_id: &RunId,
        owner: &str,
        status: RunStatus,
        metadata: Option<Value>,
    ) -> Result<bool> {
        let client = self.connection().await?;
        // A run that now waits for a person gives its step's slot back in the same statement
        // (its `DELETE` cues the steps waiting for one).
        let statement = client
            .prepare_cached(
                "WITH changed AS (
                     UPDATE runs SET status = $3, metadata = coalesce($4, metadata),
                            revision = revision + 1, updated_at = reins_now()
                      WHERE run_id = $1 AND owner_worker_id = $2
                        AND status IN ('pending', 'running')
                     RETURNING workflow, step_id, attempt, status),
                 freed AS (
                     DELETE FROM workflow_slots s USING changed c
                      WHERE c.status = 'waiting_for_input' AND s.workflow = c.workflow
                        AND s.step_id = c.step_id AND s.attempt = c.attempt)
                 SELECT count(*) FROM changed",
            )
            .await?;
        let changed: i64 = client
            .query_one(&statement, &[&run_id, &owner, &status.as_str(), &metadata])
            .await
            .map_err(commit_error)?
            .get(0);
        Ok(changed == 1)
    }

    pub(crate) async fn claim_run_slot(
        &self,
        run_id: &RunId,
        owner: &str,
        slots_max: u64,
        slots_per_user_max: u64,
    ) -> Result<RunSlot> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached("SELECT reins_claim_run_slot($1, $2, $3, $4)")
            .await?;
        let slots_max = i64::try_from(slots_max).unwrap_or(i64::MAX);
        let slots_per_user_max = i64::try_from(slots_per_user_max).unwrap_or(i64::MAX);
        match client
            .query_one(
                &statement,
                &[&run_id, &owner, &slots_max, &slots_per_user_max],
            )
            .await
        {
            Ok(row) if row.get::<_, bool>(0) => Ok(RunSlot::Held),
            Ok(_) => Ok(RunSlot::Refused),
            // No slot: the statement's transaction rolled back with nothing written.
            Err(error) if error.code().is_some_and(|c| c.code() == "RS001") => Ok(RunSlot::Queued),
            Err(error) => Err(commit_error(error)),
        }
    }

    pub(crate) async fn finalize_run(
        &self,
        run_id: &RunId,
        owner: &str,
        outcome: &RunOutcome,
        require_not_cancelled: bool,
    ) -> Result<bool> {
        let end = Finalize {
            run_id: run_id.clone(),
            owner: owner.to_owned(),
            outcome: outcome.clone(),
            require_not_cancelled,
        };
        self.batcher
            .submit(|reply| Job::Finalize { end, reply })
            .await
    }

    pub(crate) async fn answer_approval(
        &self,
        thread_id: &str,
        request_ids: &[String],
        answer: &Value,
    ) -> Result<Option<ApprovalAnswer>> {
        let client = self.connection().await?;
        let newest = client
            .query_opt(
                &client
                    .prepare_cached(select_run!(
                        "WHERE thread_id = $1 ORDER BY created_at DESC, run_id DESC LIMIT 1"
                    ))
                    .await?,
                &[&thread_id],
            )
            .await?
            .as_ref()
            .map(decode)
            .transpose()?;
        let Some(paused) = newest.filter(|run| run.status == RunStatus::WaitingForInput) else {
            return Ok(None);
        };
        let request_id = match pending_request_id(&paused.metadata) {
            Some(id) if request_ids.iter().any(|r| r == id) => id.to_owned(),
            _ => return Ok(None),
        };
        let status = status_after_answer(&paused.metadata);
        let row = client
            .query_opt(
                &client
                    .prepare_cached(
                        "UPDATE runs SET status = $4, metadata = $3, revision = revision + 1,
                        updated_at = reins_now()
                  WHERE run_id = $1 AND status = 'waiting_for_input' AND revision = $2
                 RETURNING revision",
                    )
                    .await?,
                &[
                    &paused.run_id,
                    &paused.revision,
                    &answered(&paused.metadata, &request_id, answer),
                    &status.as_str(),
                ],
            )
            .await
            .map_err(commit_error)?;
        Ok(row.map(|row| ApprovalAnswer {
            run_id: paused.run_id,
            thread_id: thread_id.to_owned(),
            previous_metadata: paused.metadata,
            revision: row.get(0),
            status,
        }))
    }

    pub(crate) async fn restore_approval(&self, answer: &ApprovalAnswer) -> Result<bool> {
        let client = self.connection().await?;
        let changed = client
            .execute(
                &client
                    .prepare_cached(
                        "UPDATE runs SET status = 'waiting_for_input', metadata = $3,
                        revision = revision + 1, updated_at = reins_now()
                  WHERE run_id = $1 AND revision = $2",
                    )
                    .await?,
                &[&answer.run_id, &answer.revision, &answer.previous_metadata],
            )
            .await
            .map_err(commit_error)?;
        Ok(changed == 1)
    }

    pub(crate) async fn claim_orphan_runs(&self, claimer: &str, limit: u32) -> Result<Vec<RunId>> {
        let client = self.connection().await?;
        let rows = client
            .query(
                // A closed run is no longer live, so the workflow slot its step held is given
                // back in the same statement: a dead node's children never keep slots.
                &client
                    .prepare_cached(
                        "WITH closed AS (
                     UPDATE runs SET status = 'error', stop_reason = 'orphan_recovered',
                            error = 'the node running it stopped renewing its lease',
                            owner_worker_id = $1, revision = revision + 1,
                            updated_at = reins_now()
                      WHERE run_id IN (SELECT run_id FROM runs
                                        WHERE status IN ('pending', 'running')
                                          AND lease_expires_at <= reins_now()
                                        LIMIT $2 FOR UPDATE SKIP LOCKED)
                        AND status IN ('pending', 'running') AND lease_expires_at <= reins_now()
                     RETURNING run_id, workflow, step_id, attempt),
                 freed AS (
                     DELETE FROM workflow_slots s USING closed c
                      WHERE s.workflow = c.workflow AND s.step_id = c.step_id
                        AND s.attempt = c.attempt)
                 SELECT run_id FROM closed",
                    )
                    .await?,
                &[&claimer, &i64::from(limit)],
            )
            .await
            .map_err(commit_error)?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    pub(crate) async fn count_slots(&self) -> Result<i64> {
        let client = self.connection().await?;
        Ok(client
            .query_one(
                &client
                    .prepare_cached("SELECT count(*) FROM workflow_slots")
                    .await?,
                &[],
            )
            .await?
            .get(0))
    }
}
