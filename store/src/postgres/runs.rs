//! Child runs on PostgreSQL. Each compare-and-set is one `UPDATE ... WHERE` on the row's owner,
//! status or revision: under READ COMMITTED a concurrent writer of the same row makes the second
//! statement wait and re-check its condition on the new version, so exactly one of two racing
//! writers wins.

use serde_json::Value;

use super::batch::Job;
use super::run_rows::{decode, select_run};
use super::run_writes::{Finalize, admit_alone};
use super::{PgStore, commit_error, status_changes};
use crate::approval::{answered, pending_answer, pending_request_id, status_after_answer};
use crate::lease::ttl_seconds;
use crate::runs::run_columns;
use crate::runs::{
    Admission, ApprovalAnswer, CancelAction, NewRun, RunOutcome, RunRenewal, RunRow, RunSlot,
};
use crate::{ExpiredApproval, Result, RunId, RunStatus};

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

    pub(crate) async fn expired_approvals(&self, limit: u32) -> Result<Vec<ExpiredApproval>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(select_run!(
                "WHERE status = 'waiting_for_input'
                   AND (metadata->>'hitl_deadline_at_ms')::double precision <= reins_now() * 1000
                 LIMIT $1"
            ))
            .await?;
        let rows = client.query(&statement, &[&i64::from(limit)]).await?;
        let mut expired = Vec::with_capacity(rows.len());
        for row in &rows {
            expired.extend(ExpiredApproval::of(&decode(row)?, f64::MAX));
        }
        Ok(expired)
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
                        AND ($3 <> 'waiting_for_input' OR cancel_action IS NULL)
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
        slots_reserved: u64,
    ) -> Result<RunSlot> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached("SELECT reins_claim_run_slot($1, $2, $3, $4, $5)")
            .await?;
        let slots_max = i64::try_from(slots_max).unwrap_or(i64::MAX);
        let slots_per_user_max = i64::try_from(slots_per_user_max).unwrap_or(i64::MAX);
        let slots_reserved = i64::try_from(slots_reserved).unwrap_or(i64::MAX);
        match client
            .query_one(
                &statement,
                &[
                    &run_id,
                    &owner,
                    &slots_max,
                    &slots_per_user_max,
                    &slots_reserved,
                ],
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
