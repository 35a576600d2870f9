//! Operator reads on PostgreSQL.

use crate::WorkflowId;
use tokio_postgres::Row;

use super::PgStore;
use crate::Result;
use crate::notify::WAITING;
use crate::operators::{SlotRow, StatusCount};

fn status_count(row: &Row) -> StatusCount {
    StatusCount {
        status: row.get(0),
        count: row.get(1),
    }
}

impl PgStore {
    pub(crate) async fn overdue_waits(&self) -> Result<u64> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(&format!(
                "SELECT count(*) FROM workflow_steps s JOIN workflows w ON w.id = s.workflow
                  WHERE s.kind IN ('pause', 'humanCheckpoint') AND s.status = 'running'
                    AND w.status IN {WAITING}
                    AND s.created_at
                        + (s.data->'args'->>'remindAfterMs')::double precision / 1000
                        <= reins_now()"
            ))
            .await?;
        let count: i64 = client.query_one(&statement, &[]).await?.get(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }

    pub(crate) async fn workflow_counts(&self, owner: Option<&str>) -> Result<Vec<StatusCount>> {
        let client = self.connection().await?;
        let rows = client
            .query(
                &client
                    .prepare_cached(
                        "SELECT status, count(*) FROM workflows
                          WHERE $1::text IS NULL OR owner = $1 GROUP BY status ORDER BY status",
                    )
                    .await?,
                &[&owner],
            )
            .await?;
        Ok(rows.iter().map(status_count).collect())
    }

    pub(crate) async fn run_counts(&self, owner: &str) -> Result<Vec<StatusCount>> {
        let client = self.connection().await?;
        let rows = client
            .query(
                &client
                    .prepare_cached(
                        "SELECT status, count(*) FROM runs WHERE owner_worker_id = $1
                  GROUP BY status ORDER BY status",
                    )
                    .await?,
                &[&owner],
            )
            .await?;
        Ok(rows.iter().map(status_count).collect())
    }

    pub(crate) async fn list_slots(&self, limit: u32) -> Result<Vec<SlotRow>> {
        let client = self.connection().await?;
        let rows = client
            .query(
                &client
                    .prepare_cached(
                        "SELECT workflow, step_id, attempt, created_at FROM workflow_slots
                  ORDER BY created_at, workflow, step_id LIMIT $1",
                    )
                    .await?,
                &[&i64::from(limit)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| SlotRow {
                workflow_id: row.get(0),
                step_id: row.get(1),
                attempt: row.get(2),
                created_at: row.get(3),
            })
            .collect())
    }

    pub(crate) async fn waiting_workflows(
        &self,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WorkflowId>> {
        let client = self.connection().await?;
        let rows = client
            .query(
                &client
                    .prepare_cached(
                        "SELECT w.id FROM workflows w
                          WHERE ($1::text IS NULL OR w.user_id = $1)
                            AND w.status IN ('running', 'paused', 'waiting_approval')
                            AND (w.status IN ('paused', 'waiting_approval')
                                 OR EXISTS (SELECT 1 FROM runs r
                                             WHERE r.workflow = w.id
                                               AND r.status = 'waiting_for_input')
                                 OR EXISTS (SELECT 1 FROM workflow_steps s
                                             WHERE s.workflow = w.id
                                               AND s.kind IN ('pause', 'humanCheckpoint')
                                               AND s.status = 'running'))
                          ORDER BY w.created_at, w.id LIMIT $2",
                    )
                    .await?,
                &[&user_id, &i64::from(limit)],
            )
            .await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
