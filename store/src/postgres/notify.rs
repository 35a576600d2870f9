//! The notification outbox on PostgreSQL (migration 36): claims, settlements and retention. A
//! claim locks the rows it takes with `FOR UPDATE SKIP LOCKED`, so two nodes claiming at once
//! take different rows, and the row's condition is checked again once locked, so a row another
//! claim took meanwhile is not taken twice. Times are the database clock (`reins_now()`).

use serde_json::Value;
use tokio_postgres::Row;

use super::PgStore;
use crate::lease::ttl_seconds;
use crate::notify::{COLUMNS, Notification, NotificationKind, Settlement, WAITING, in_event_order};
use crate::{Error, Result};

fn notification(row: &Row) -> Result<Notification> {
    let id: String = row.get(0);
    let kind = NotificationKind::read(row.get(3), &id)?;
    let attempts: i32 = row.get(10);
    let delivered_to: Value = row.get(11);
    let delivered_to = serde_json::from_value(delivered_to)
        .map_err(|e| Error::Database(format!("stored delivered_to is invalid: {e}")))?;
    Ok(Notification {
        workflow_id: row.get(1),
        seq: row.get(2),
        kind,
        event: row.get(4),
        data: row.get(5),
        user_id: row.get(6),
        user_email: row.get(7),
        user_role: row.get(8),
        created_at: row.get(9),
        attempts: u32::try_from(attempts).unwrap_or(0),
        delivered_to,
        claim_epoch: row.get(12),
        id,
    })
}

impl PgStore {
    pub(crate) async fn claim_notifications(
        &self,
        owner: &str,
        claim_ms: u64,
        max: u32,
    ) -> Result<Vec<Notification>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(&format!(
                // A reminder whose workflow no longer waits (it ended another way than a
                // decision) is never sent: deleted, and not claimed in the same snapshot.
                "WITH stale AS (
                     DELETE FROM notify_outbox s
                      WHERE s.kind = 'overdue' AND s.due_at <= reins_now()
                        AND NOT EXISTS (SELECT 1 FROM workflows w
                                         WHERE w.id = s.workflow AND w.status IN {WAITING}))
                 UPDATE notify_outbox o
                    SET claim_owner = $1, claim_epoch = o.claim_epoch + 1,
                        claim_expires_at = reins_now() + $2::float8
                   FROM (SELECT n.id FROM notify_outbox n
                          WHERE n.due_at <= reins_now()
                            AND (n.claim_expires_at IS NULL
                                 OR n.claim_expires_at <= reins_now())
                            AND (n.kind <> 'overdue'
                                 OR EXISTS (SELECT 1 FROM workflows w
                                             WHERE w.id = n.workflow
                                               AND w.status IN {WAITING}))
                          ORDER BY n.due_at LIMIT $3::bigint
                          FOR UPDATE OF n SKIP LOCKED) due
                  WHERE o.id = due.id
                  RETURNING {}",
                COLUMNS
                    .split(", ")
                    .map(|column| format!("o.{column}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
            .await?;
        let rows = client
            .query(
                &statement,
                &[&owner, &ttl_seconds(claim_ms), &i64::from(max)],
            )
            .await?;
        let mut claimed: Vec<Notification> =
            rows.iter().map(notification).collect::<Result<_>>()?;
        in_event_order(&mut claimed);
        Ok(claimed)
    }

    pub(crate) async fn settle_notification(
        &self,
        id: &str,
        epoch: i64,
        settlement: Settlement,
    ) -> Result<bool> {
        let client = self.connection().await?;
        let changed = match settlement {
            Settlement::Finished => {
                let statement = client
                    .prepare_cached("DELETE FROM notify_outbox WHERE id = $1 AND claim_epoch = $2")
                    .await?;
                client.execute(&statement, &[&id, &epoch]).await?
            }
            Settlement::Retry {
                delivered_to,
                after_ms,
            } => {
                let statement = client
                    .prepare_cached(
                        "UPDATE notify_outbox
                            SET delivered_to = $3, attempts = attempts + 1,
                                due_at = reins_now() + $4::float8,
                                claim_owner = NULL, claim_expires_at = NULL
                          WHERE id = $1 AND claim_epoch = $2",
                    )
                    .await?;
                let delivered_to = serde_json::json!(delivered_to);
                client
                    .execute(
                        &statement,
                        &[&id, &epoch, &delivered_to, &ttl_seconds(after_ms)],
                    )
                    .await?
            }
        };
        Ok(changed == 1)
    }

    pub(crate) async fn purge_notifications(&self, retention_ms: u64) -> Result<u64> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached("DELETE FROM notify_outbox WHERE created_at < reins_now() - $1::float8")
            .await?;
        Ok(client
            .execute(&statement, &[&ttl_seconds(retention_ms)])
            .await?)
    }

    pub(crate) async fn notification_backlog(&self) -> Result<u64> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "SELECT count(*) FROM notify_outbox
                  WHERE kind <> 'overdue' OR due_at <= reins_now()",
            )
            .await?;
        let count: i64 = client.query_one(&statement, &[]).await?.get(0);
        Ok(u64::try_from(count).unwrap_or(0))
    }
}
