//! Events sent to a workflow on PostgreSQL (see `crate::sent_events`).

use tokio_postgres::Row;

use super::{PgStore, commit_error};
use crate::sent_events::resent;
use crate::{Error, EventSend, NewSentEvent, Result, SentEvent, WorkflowId, WorkflowStatus};

/// The columns `sent_event` decodes, as one literal for `concat!`.
macro_rules! event_columns {
    () => {
        "seq, workflow, event_id, name, payload, created_by, created_at, taken_by"
    };
}

fn sent_event(row: &Row) -> SentEvent {
    SentEvent {
        seq: row.get(0),
        workflow_id: row.get(1),
        event_id: row.get(2),
        name: row.get(3),
        payload: row.get(4),
        created_by: row.get(5),
        created_at: row.get(6),
        taken_by: row.get(7),
    }
}

/// The row stored under `new`'s `event_id`, if one is.
async fn stored_under_id(
    transaction: &deadpool_postgres::Transaction<'_>,
    new: &NewSentEvent,
) -> Result<Option<Row>> {
    Ok(transaction
        .query_opt(
            &transaction
                .prepare_cached(concat!(
                    "SELECT ",
                    event_columns!(),
                    " FROM sent_events WHERE workflow = $1 AND event_id = $2"
                ))
                .await?,
            &[&new.workflow_id, &new.event_id],
        )
        .await?)
}

impl PgStore {
    pub(crate) async fn send_event(&self, new: NewSentEvent) -> Result<EventSend> {
        let mut client = self.connection().await?;
        let transaction = client.transaction().await?;
        super::workflows::hold_off_dormancy(&transaction, &new.workflow_id).await?;
        // `FOR SHARE` waits for a write that ends the workflow, and holds off the next one: an
        // event is stored while the workflow is live, or refused.
        let status = transaction
            .query_opt(
                &transaction
                    .prepare_cached("SELECT status FROM workflows WHERE id = $1 FOR SHARE")
                    .await?,
                &[&new.workflow_id],
            )
            .await?
            .ok_or_else(|| Error::NotFound(format!("workflow {:?}", new.workflow_id.as_str())))?;
        let status = WorkflowStatus::read(status.get(0), &new.workflow_id)?;
        if status.is_final() {
            // A repeat of an event stored while it was live is still answered as one.
            return match stored_under_id(&transaction, &new).await? {
                Some(row) => resent(sent_event(&row), &new),
                None => Ok(EventSend::Ended(status)),
            };
        }
        // One send of a workflow's at a time, so that the bounds below count what the others
        // committed (two sends to two workflows share nothing but a rare hash collision).
        transaction
            .execute(
                &transaction
                    .prepare_cached(
                        "SELECT pg_advisory_xact_lock(hashtextextended('sent_events:' || $1, 0))",
                    )
                    .await?,
                &[&new.workflow_id],
            )
            .await?;
        let bytes = new.payload_bytes();
        let counted = transaction
            .query_one(
                &transaction
                    .prepare_cached(
                        "SELECT count(*), coalesce(sum(payload_bytes), 0)::bigint,
                                bool_or(event_id = $2)
                           FROM sent_events
                          WHERE workflow = $1 AND (taken_by IS NULL OR event_id = $2)",
                    )
                    .await?,
                &[&new.workflow_id, &new.event_id],
            )
            .await?;
        // A repeat (its row found above, taken or not) is answered below whatever the bounds.
        if !counted.get::<_, Option<bool>>(2).unwrap_or(false) {
            new.bounds.check(counted.get(0), counted.get(1), bytes)?;
        }
        let inserted = transaction
            .query_opt(
                &transaction
                    .prepare_cached(concat!(
                        "INSERT INTO sent_events (workflow, event_id, name, payload, created_by,
                                                  created_at, payload_bytes)
                         VALUES ($1, $2, $3, $4, $5, reins_now(), $6)
                         ON CONFLICT (workflow, event_id) DO NOTHING
                         RETURNING ",
                        event_columns!()
                    ))
                    .await?,
                &[
                    &new.workflow_id,
                    &new.event_id,
                    &new.name,
                    &new.payload,
                    &new.created_by,
                    &bytes,
                ],
            )
            .await?;
        let answer = match inserted {
            Some(row) => {
                // Its bytes are its owner's: refused past their quota, this rolls back whole.
                transaction
                    .execute(
                        &transaction
                            .prepare_cached("SELECT reins_take_storage($1, $2, $3)")
                            .await?,
                        &[&new.workflow_id, &bytes, &new.stored_bytes_max],
                    )
                    .await?;
                super::workflows::wake_if_dormant(&transaction, &new.workflow_id, Some(&new.name))
                    .await?;
                EventSend::Stored(sent_event(&row))
            }
            None => {
                let existing = stored_under_id(&transaction, &new).await?.ok_or_else(|| {
                    Error::Database(format!(
                        "event {:?} of workflow {:?} was neither inserted nor found",
                        new.event_id,
                        new.workflow_id.as_str()
                    ))
                })?;
                resent(sent_event(&existing), &new)?
            }
        };
        transaction.commit().await.map_err(commit_error)?;
        Ok(answer)
    }

    pub(crate) async fn pending_events(
        &self,
        workflow_id: &WorkflowId,
        names: Vec<String>,
        per_name: u32,
    ) -> Result<Vec<SentEvent>> {
        let client = self.connection().await?;
        // Each name's oldest untaken rows through `sent_events_untaken_by_name` (migration 40):
        // no other name's row is read.
        let rows = client
            .query(
                &client
                    .prepare_cached(concat!(
                        "SELECT e.* FROM unnest($2::text[]) AS waited(name)
                          CROSS JOIN LATERAL (
                              SELECT ",
                        event_columns!(),
                        " FROM sent_events
                                WHERE workflow = $1 AND name = waited.name AND taken_by IS NULL
                                ORDER BY seq LIMIT $3) e
                          ORDER BY e.seq"
                    ))
                    .await?,
                &[workflow_id, &names, &i64::from(per_name)],
            )
            .await?;
        Ok(rows.iter().map(sent_event).collect())
    }
}
