//! Events sent to a workflow on SQLite (see `crate::sent_events`). The single writer makes the
//! status check and the insert one step.

use rusqlite::{OptionalExtension, Row, params};

use super::{SqliteStore, parse_json};
use crate::sent_events::resent;
use crate::{Error, EventSend, NewSentEvent, Result, SentEvent, WorkflowId, WorkflowStatus};

/// The columns `sent_event` decodes, as one literal for `concat!`.
macro_rules! event_columns {
    () => {
        "seq, workflow, event_id, name, payload, created_by, created_at, taken_by"
    };
}

/// A row as read, its payload still text.
struct Read {
    event: SentEvent,
    payload: String,
}

fn sent_event(row: &Row) -> rusqlite::Result<Read> {
    Ok(Read {
        event: SentEvent {
            seq: row.get(0)?,
            workflow_id: row.get(1)?,
            event_id: row.get(2)?,
            name: row.get(3)?,
            payload: serde_json::Value::Null,
            created_by: row.get(5)?,
            created_at: row.get(6)?,
            taken_by: row.get(7)?,
        },
        payload: row.get(4)?,
    })
}

impl Read {
    fn decode(self) -> Result<SentEvent> {
        Ok(SentEvent {
            payload: parse_json(&self.payload)?,
            ..self.event
        })
    }
}

impl SqliteStore {
    pub(crate) async fn send_event(&self, new: NewSentEvent) -> Result<EventSend> {
        let payload = new.payload.to_string();
        self.write(move |connection| {
            let status: Option<String> = connection
                .prepare_cached("SELECT status FROM workflows WHERE id = ?1")?
                .query_row([&new.workflow_id], |row| row.get(0))
                .optional()?;
            let Some(status) = status else {
                return Err(Error::NotFound(format!(
                    "workflow {:?}",
                    new.workflow_id.as_str()
                )));
            };
            let status = WorkflowStatus::read(&status, &new.workflow_id)?;
            // A repeat is answered whatever the bounds and whether the workflow ended since: it
            // stores nothing.
            let existing = connection
                .prepare_cached(concat!(
                    "SELECT ",
                    event_columns!(),
                    " FROM sent_events WHERE workflow = ?1 AND event_id = ?2"
                ))?
                .query_row(params![new.workflow_id, new.event_id], sent_event)
                .optional()?;
            if let Some(existing) = existing {
                return resent(existing.decode()?, &new);
            }
            if status.is_final() {
                return Ok(EventSend::Ended(status));
            }
            let (untaken, held): (i64, i64) = connection
                .prepare_cached(
                    "SELECT count(*), coalesce(sum(payload_bytes), 0) FROM sent_events
                      WHERE workflow = ?1 AND taken_by IS NULL",
                )?
                .query_row([&new.workflow_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
            let bytes = new.payload_bytes();
            new.bounds.check(untaken, held, bytes)?;
            let inserted = connection
                .prepare_cached(concat!(
                    "INSERT INTO sent_events (workflow, event_id, name, payload, created_by,
                                              created_at, payload_bytes)
                     VALUES (?1, ?2, ?3, ?4, ?5, unixepoch('subsec'), ?6)
                     RETURNING ",
                    event_columns!()
                ))?
                .query_row(
                    params![
                        new.workflow_id,
                        new.event_id,
                        new.name,
                        payload,
                        new.created_by,
                        bytes
                    ],
                    sent_event,
                )?;
            // Its bytes are its owner's: refused past their quota, the job rolls back whole.
            super::take_storage(connection, &new.workflow_id, bytes, new.stored_bytes_max)?;
            super::workflows::wake_if_dormant(connection, &new.workflow_id, Some(&new.name))?;
            Ok(EventSend::Stored(inserted.decode()?))
        })
        .await
    }

    pub(crate) async fn pending_events(
        &self,
        workflow_id: &WorkflowId,
        names: Vec<String>,
        per_name: u32,
    ) -> Result<Vec<SentEvent>> {
        let workflow_id = workflow_id.to_owned();
        self.read(move |connection| {
            // Each name's oldest untaken rows through `sent_events_untaken_by_name` (migration
            // 40): no other name's row is read.
            let mut statement = connection.prepare_cached(concat!(
                "SELECT ",
                event_columns!(),
                " FROM sent_events WHERE workflow = ?1 AND name = ?2 AND taken_by IS NULL
                   ORDER BY seq LIMIT ?3"
            ))?;
            let mut events = Vec::new();
            for name in &names {
                let rows = statement.query_map(params![workflow_id, name, per_name], sent_event)?;
                for row in rows {
                    events.push(row?.decode()?);
                }
            }
            events.sort_by_key(|event| event.seq);
            Ok(events)
        })
        .await
    }
}
