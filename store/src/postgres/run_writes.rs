//! A child run's admission and its end on PostgreSQL, as statements prepared on one connection:
//! alone ([`admit_alone`], [`finalize_alone`]) or as one job of a batch of writes
//! (`batch.rs`), which the runs' operations submit (`runs.rs`).

use deadpool_postgres::{Object, Pool};
use serde_json::Value;
use tokio_postgres::{Row, Statement};

use super::conn::connection;
use super::run_rows::{decode, read_by_key};
use super::{FENCE_SQL, begin_error, commit_error, fence_params, fenced_error, op_params, op_sql};
use crate::lease::ttl_seconds;
use crate::runs::run_columns;
use crate::runs::{Admission, NewRun, RunFailure, RunOutcome, WorkflowStep, replay};
use crate::{Error, Result, RunId};

// Admissions with a slot claim a free slot number below `slots_max` in `reins_claim_slot`
// (migration 7): each number is held once (a unique index), so at most `slots_max` slots are held
// across the cluster, and two admissions wait on each other only for the same number. Admissions
// call it through `reins_claim_fair_slot` (migration 31), which then refuses the slot (rolled
// back with the transaction) to a step whose workflow's owner held `slots_per_user_max` slots
// already while another user waits below that share: two admissions of one user wait on each
// other for that count, only while another user waits. The six-argument function of migration
// 41 calls it, then refuses a new slot to a step whose owner held their share already when it
// would leave fewer than `slots_reserved` free, counted under one cluster-wide lock.

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

const CLAIM_SLOT_SQL: &str = "SELECT reins_claim_fair_slot($1, $2, $3, $4, $5, $6)";

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
    let slots_reserved = i64::try_from(step.slots_reserved).unwrap_or(i64::MAX);
    let claim_params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] = [
        &step.workflow_id,
        &step.step_id,
        &step.attempt,
        &slots_max,
        &slots_per_user_max,
        &slots_reserved,
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
                        metadata = CASE WHEN $10::jsonb IS NULL THEN metadata
                                        ELSE jsonb_set(metadata, '{failure}', $10::jsonb) END,
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
                &end.outcome.failure.as_ref().map(RunFailure::to_json),
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
