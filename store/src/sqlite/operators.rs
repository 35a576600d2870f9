//! Operator reads on SQLite.

use crate::WorkflowId;
use rusqlite::Row;

use super::SqliteStore;
use crate::Result;
use crate::notify::WAITING;
use crate::operators::{SlotRow, StatusCount};

fn status_count(row: &Row<'_>) -> rusqlite::Result<StatusCount> {
    Ok(StatusCount {
        status: row.get(0)?,
        count: row.get(1)?,
    })
}

impl SqliteStore {
    pub(crate) async fn overdue_waits(&self) -> Result<u64> {
        self.read(move |connection| {
            let count: i64 = connection
                .prepare_cached(&format!(
                    "SELECT count(*) FROM workflow_steps s JOIN workflows w ON w.id = s.workflow
                      WHERE s.kind IN ('pause', 'humanCheckpoint') AND s.status = 'running'
                        AND w.status IN {WAITING}
                        AND s.created_at
                            + json_extract(s.data, '$.args.remindAfterMs') / 1000.0
                            <= unixepoch('subsec')"
                ))?
                .query_row([], |row| row.get(0))?;
            Ok(u64::try_from(count).unwrap_or(0))
        })
        .await
    }

    pub(crate) async fn workflow_counts(&self, owner: Option<&str>) -> Result<Vec<StatusCount>> {
        let owner = owner.map(str::to_owned);
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT status, count(*) FROM workflows WHERE ?1 IS NULL OR owner = ?1
                  GROUP BY status ORDER BY status",
            )?;
            let rows = statement.query_map([&owner], status_count)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn run_counts(&self, owner: &str) -> Result<Vec<StatusCount>> {
        let owner = owner.to_owned();
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT status, count(*) FROM runs WHERE owner_worker_id = ?1
                  GROUP BY status ORDER BY status",
            )?;
            let rows = statement.query_map([&owner], status_count)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn list_slots(&self, limit: u32) -> Result<Vec<SlotRow>> {
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT workflow, step_id, attempt, created_at FROM workflow_slots
                  ORDER BY created_at, workflow, step_id LIMIT ?1",
            )?;
            let rows = statement.query_map([limit], |row| {
                Ok(SlotRow {
                    workflow_id: row.get(0)?,
                    step_id: row.get(1)?,
                    attempt: row.get(2)?,
                    created_at: row.get(3)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn waiting_workflows(
        &self,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<WorkflowId>> {
        let user_id = user_id.map(str::to_owned);
        self.read(move |connection| {
            let mut statement = connection.prepare_cached(
                "SELECT w.id FROM workflows w
                  WHERE (?1 IS NULL OR w.user_id = ?1)
                    AND w.status IN ('running', 'paused', 'waiting_approval')
                    AND (w.status IN ('paused', 'waiting_approval')
                         OR EXISTS (SELECT 1 FROM runs r
                                     WHERE r.workflow = w.id AND r.status = 'waiting_for_input')
                         OR EXISTS (SELECT 1 FROM workflow_steps s
                                     WHERE s.workflow = w.id
                                       AND s.kind IN ('pause', 'humanCheckpoint')
                                       AND s.status = 'running'))
                  ORDER BY w.created_at, w.id LIMIT ?2",
            )?;
            let rows = statement.query_map(rusqlite::params![user_id, limit], |row| row.get(0))?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }
}
