//! Reading workflow events and the feed on SQLite.

use rusqlite::{Row, params};

use super::{SqliteStore, parse_json};
use crate::{EventPage, EventRow, Result};

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
        workflow_id: &str,
        after: i64,
        limit: u32,
    ) -> Result<Option<EventPage>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| {
            // One statement, so the status and the events are of one snapshot.
            let mut statement = connection.prepare_cached(
                "SELECT w.status, w.event_seq, e.workflow, e.seq, e.kind, e.data, e.created_at
                   FROM workflows w
                   LEFT JOIN (SELECT * FROM workflow_events
                               WHERE workflow = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3) e
                     ON e.workflow = w.id
                  WHERE w.id = ?1
                  ORDER BY e.seq",
            )?;
            let mut rows = statement.query(params![workflow_id, after, limit])?;
            let mut page: Option<EventPage> = None;
            while let Some(row) = rows.next()? {
                let page = page.get_or_insert(EventPage {
                    events: Vec::new(),
                    status: row.get(0)?,
                    last_seq: row.get(1)?,
                });
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

    pub(crate) async fn feed_head(&self) -> Result<i64> {
        self.read(|connection| {
            Ok(connection
                .prepare_cached("SELECT seq FROM event_feed WHERE id = 1")?
                .query_row([], |row| row.get(0))?)
        })
        .await
    }
}
