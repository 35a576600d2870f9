//! Reading workflow events and the feed on SQLite.

use rusqlite::{OptionalExtension, Row, params};

use super::{SqliteStore, parse_json};
use crate::{EventPage, EventRow, Result, WorkflowId, WorkflowStatus};

/// An event's columns from `first` on, its data still text.
fn event(row: &Row, first: usize) -> rusqlite::Result<(EventRow, String)> {
    Ok((
        EventRow {
            workflow_id: row.get(first)?,
            seq: row.get(first + 1)?,
            kind: row.get(first + 2)?,
            data: serde_json::Value::Null,
            created_at: row.get(first + 4)?,
        },
        row.get(first + 3)?,
    ))
}

fn feed_event(row: &Row) -> rusqlite::Result<(EventRow, String)> {
    event(row, 0)
}

fn decoded((mut event, data): (EventRow, String)) -> Result<EventRow> {
    event.data = parse_json(&data)?;
    Ok(event)
}

impl SqliteStore {
    pub(crate) async fn read_events(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> Result<Option<EventPage>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| {
            // One statement, so the status and the events are of one snapshot.
            let mut statement = connection.prepare_cached(
                "SELECT w.status, n.seq, e.workflow, e.seq, e.kind, e.data, e.created_at
                   FROM workflows w
                   JOIN workflow_event_seqs n ON n.workflow = w.id
                   LEFT JOIN (SELECT * FROM workflow_events
                               WHERE workflow = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3) e
                     ON e.workflow = w.id
                  WHERE w.id = ?1
                  ORDER BY e.seq",
            )?;
            let mut rows = statement.query(params![workflow_id, after, limit])?;
            let mut page: Option<EventPage> = None;
            while let Some(row) = rows.next()? {
                let page = match &mut page {
                    Some(page) => page,
                    None => page.insert(EventPage {
                        events: Vec::new(),
                        status: WorkflowStatus::read(&row.get::<_, String>(0)?, &workflow_id)?,
                        last_seq: row.get(1)?,
                    }),
                };
                if row.get::<_, Option<String>>(2)?.is_some() {
                    page.events.push(decoded(event(row, 2)?)?);
                }
            }
            Ok(page)
        })
        .await
    }

    pub(crate) async fn read_feed(
        &self,
        after: i64,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EventRow>> {
        let user_id = user_id.map(str::to_owned);
        self.read(move |connection| {
            let mut statement = match &user_id {
                None => connection.prepare_cached(
                    "SELECT workflow, feed_seq, kind, data, created_at FROM workflow_events
                      WHERE feed_seq > ?1 ORDER BY feed_seq LIMIT ?2",
                )?,
                Some(_) => connection.prepare_cached(
                    "SELECT workflow, feed_seq, kind, data, created_at FROM workflow_events
                      WHERE user_id = ?3 AND feed_seq > ?1 ORDER BY feed_seq LIMIT ?2",
                )?,
            };
            let rows = match &user_id {
                None => statement.query_map(params![after, limit], feed_event)?,
                Some(user_id) => statement.query_map(params![after, limit, user_id], feed_event)?,
            };
            rows.map(|row| decoded(row?)).collect()
        })
        .await
    }

    /// One node, whose own writes wake its streams: nothing to watch.
    pub(crate) async fn watch_events(
        &self,
        _workflow_id: &WorkflowId,
        _watch_ms: u64,
    ) -> Result<()> {
        Ok(())
    }

    pub(crate) async fn feed_head(&self) -> Result<i64> {
        self.read(|connection| {
            Ok(connection
                .prepare_cached("SELECT seq FROM event_feed WHERE id = 1")?
                .query_row([], |row| row.get(0))?)
        })
        .await
    }
}

/// Appends `console.log` lines as `log` events within the workflow's durable bounds (see
/// [`crate::WriteOp::PutLogs`]); the same rules as `reins_log` on PostgreSQL.
pub(super) fn put_logs(
    connection: &rusqlite::Connection,
    workflow_id: &WorkflowId,
    lines: &[String],
    events_max: i64,
    bytes_max: i64,
) -> Result<()> {
    let Some((mut kept, mut bytes, mut dropped)) = connection
        .prepare_cached("SELECT log_events, log_bytes, log_dropped FROM workflows WHERE id = ?1")?
        .query_row([workflow_id], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, i64>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .optional()?
    else {
        return Err(crate::Error::NotFound(format!("workflow {workflow_id:?}")));
    };
    for line in lines {
        let size = i64::try_from(line.len()).unwrap_or(i64::MAX);
        let event = if dropped == 0 && kept < events_max && bytes.saturating_add(size) <= bytes_max
        {
            kept += 1;
            bytes += size;
            Some(("log", serde_json::json!({ "line": line })))
        } else {
            dropped += 1;
            (dropped == 1).then(|| {
                (
                    "log_truncated",
                    serde_json::json!({
                        "events_max": events_max,
                        "bytes_max": bytes_max,
                    }),
                )
            })
        };
        if let Some((kind, data)) = event {
            connection
                .prepare_cached("UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = ?1")?
                .execute([workflow_id])?;
            connection
                .prepare_cached(
                    "INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
                     SELECT workflow, seq, ?2, ?3, unixepoch('subsec')
                       FROM workflow_event_seqs WHERE workflow = ?1",
                )?
                .execute(params![workflow_id, kind, data.to_string()])?;
        }
    }
    connection
        .prepare_cached(
            "UPDATE workflows SET log_events = ?2, log_bytes = ?3, log_dropped = ?4 WHERE id = ?1",
        )?
        .execute(params![workflow_id, kept, bytes, dropped])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::{DatabaseUrl, Store, StoreOptions, WorkflowId};

    /// Migration 26 moves the event counter of workflows that already have events off their
    /// rows: their numbers go on from where they were, never from 1 again, and the events
    /// written before the upgrade are read back as they were.
    #[tokio::test]
    async fn an_upgraded_database_numbers_events_on_from_where_they_were() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("reins.db");
        {
            let connection = crate::sqlite::database_before(&path, 26);
            connection
                .execute_batch(
                    "INSERT INTO workflows (id, user_id, status, fingerprint, data, created_at,
                                            updated_at)
                     VALUES ('wf', 'ada', 'running', 'fp', '{}', 0, 0);
                     UPDATE workflows SET status = 'paused' WHERE id = 'wf';",
                )
                .expect("a workflow with two events, before the upgrade");
        }
        let store = Store::open(&DatabaseUrl::Sqlite(path.clone()), &StoreOptions::default())
            .await
            .expect("open");
        assert_eq!(
            store.migrate().await.expect("migrate").applied,
            (26..=crate::SCHEMA_VERSION).collect::<Vec<_>>()
        );
        let id = WorkflowId::from("wf");
        let before = store
            .read_events(&id, 0, 10)
            .await
            .expect("read")
            .expect("wf");
        assert_eq!(before.last_seq, 2);
        assert_eq!(
            before.events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2]
        );

        drop(store);
        rusqlite::Connection::open(&path)
            .expect("open")
            .execute(
                "UPDATE workflows SET status = 'running' WHERE id = 'wf'",
                [],
            )
            .expect("a status change after the upgrade");
        // The dropped store's writer thread lets the node lock go once it has closed its
        // connection, a moment after the drop.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let store = loop {
            match Store::open(&DatabaseUrl::Sqlite(path.clone()), &StoreOptions::default()).await {
                Err(crate::Error::NodeLockHeld { .. }) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                opened => break opened.expect("open again"),
            }
        };
        let after = store
            .read_events(&id, 2, 10)
            .await
            .expect("read")
            .expect("wf");
        assert_eq!(after.last_seq, 3, "{after:?}");
        assert_eq!(after.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [3]);
    }
}
