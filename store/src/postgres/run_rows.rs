//! A child run's row on PostgreSQL: the columns every read selects ([`select_run!`]), their
//! decoding, and the reads the admissions and the snapshot share.

use deadpool_postgres::Object;
use tokio_postgres::Row;

use crate::runs::run_columns;
use crate::runs::{CancelAction, RunRow};
use crate::{Result, RunId, RunStatus};

/// `SELECT <run columns> FROM runs` followed by the given clauses (literals, or macros that
/// expand to one), as one literal (SQL is never formatted per call).
macro_rules! select_run {
    ($($clause:tt)+) => {
        concat!("SELECT ", run_columns!(), " FROM runs ", $($clause)+)
    };
}
pub(super) use select_run;

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

pub(super) async fn read_by_key(client: &Object, key: &str) -> Result<Option<RunRow>> {
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
