//! The notification outbox on SQLite (migration 36): claims, settlements and retention. Every
//! statement reads the database clock (`unixepoch('subsec')`), as leases do.

use rusqlite::{Row, params};

use super::{SqliteStore, parse_json};
use crate::lease::ttl_seconds;
use crate::notify::{COLUMNS, Notification, NotificationKind, Settlement, WAITING, in_event_order};
use crate::{Error, Result};

/// A claimed row, its JSON still text.
struct Claimed {
    notification: Notification,
    data: String,
    delivered_to: String,
    kind: String,
}

fn claimed(row: &Row) -> rusqlite::Result<Claimed> {
    Ok(Claimed {
        notification: Notification {
            id: row.get(0)?,
            workflow_id: row.get(1)?,
            seq: row.get(2)?,
            kind: NotificationKind::Entered,
            event: row.get(4)?,
            data: serde_json::Value::Null,
            user_id: row.get(6)?,
            user_email: row.get(7)?,
            user_role: row.get(8)?,
            created_at: row.get(9)?,
            attempts: row.get(10)?,
            delivered_to: Vec::new(),
            claim_epoch: row.get(12)?,
        },
        kind: row.get(3)?,
        data: row.get(5)?,
        delivered_to: row.get(11)?,
    })
}

fn decoded(claimed: Claimed) -> Result<Notification> {
    let mut notification = claimed.notification;
    notification.kind = NotificationKind::read(&claimed.kind, &notification.id)?;
    notification.data = parse_json(&claimed.data)?;
    notification.delivered_to = serde_json::from_str(&claimed.delivered_to)
        .map_err(|e| Error::Database(format!("stored delivered_to is invalid: {e}")))?;
    Ok(notification)
}

impl SqliteStore {
    pub(crate) async fn claim_notifications(
        &self,
        owner: &str,
        claim_ms: u64,
        max: u32,
    ) -> Result<Vec<Notification>> {
        let owner = owner.to_owned();
        self.write(move |connection| {
            // A reminder whose workflow no longer waits (it ended another way than a decision)
            // is never sent.
            connection
                .prepare_cached(&format!(
                    "DELETE FROM notify_outbox
                      WHERE kind = 'overdue' AND due_at <= unixepoch('subsec')
                        AND NOT EXISTS (SELECT 1 FROM workflows w
                                         WHERE w.id = notify_outbox.workflow
                                           AND w.status IN {WAITING})"
                ))?
                .execute([])?;
            let mut statement = connection.prepare_cached(&format!(
                "UPDATE notify_outbox
                    SET claim_owner = ?1, claim_epoch = claim_epoch + 1,
                        claim_expires_at = unixepoch('subsec') + ?2
                  WHERE id IN (SELECT id FROM notify_outbox
                                WHERE due_at <= unixepoch('subsec')
                                  AND (claim_expires_at IS NULL
                                       OR claim_expires_at <= unixepoch('subsec'))
                                ORDER BY due_at LIMIT ?3)
                  RETURNING {COLUMNS}"
            ))?;
            let rows = statement
                .query_map(params![owner, ttl_seconds(claim_ms), max], claimed)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut claimed: Vec<Notification> =
                rows.into_iter().map(decoded).collect::<Result<_>>()?;
            in_event_order(&mut claimed);
            Ok(claimed)
        })
        .await
    }

    pub(crate) async fn settle_notification(
        &self,
        id: &str,
        epoch: i64,
        settlement: Settlement,
    ) -> Result<bool> {
        let id = id.to_owned();
        self.write(move |connection| {
            let changed = match settlement {
                Settlement::Finished => connection
                    .prepare_cached("DELETE FROM notify_outbox WHERE id = ?1 AND claim_epoch = ?2")?
                    .execute(params![id, epoch])?,
                Settlement::Retry {
                    delivered_to,
                    after_ms,
                } => {
                    let delivered_to = serde_json::to_string(&delivered_to)
                        .map_err(|e| Error::Database(e.to_string()))?;
                    connection
                        .prepare_cached(
                            "UPDATE notify_outbox
                                SET delivered_to = ?3, attempts = attempts + 1,
                                    due_at = unixepoch('subsec') + ?4,
                                    claim_owner = NULL, claim_expires_at = NULL
                              WHERE id = ?1 AND claim_epoch = ?2",
                        )?
                        .execute(params![id, epoch, delivered_to, ttl_seconds(after_ms)])?
                }
            };
            Ok(changed == 1)
        })
        .await
    }

    pub(crate) async fn purge_notifications(&self, retention_ms: u64) -> Result<u64> {
        self.write(move |connection| {
            let purged = connection
                .prepare_cached(
                    "DELETE FROM notify_outbox WHERE created_at < unixepoch('subsec') - ?1",
                )?
                .execute(params![ttl_seconds(retention_ms)])?;
            Ok(purged as u64)
        })
        .await
    }

    pub(crate) async fn notification_backlog(&self) -> Result<u64> {
        self.read(|connection| {
            let count: i64 = connection
                .prepare_cached(
                    "SELECT count(*) FROM notify_outbox
                      WHERE kind <> 'overdue' OR due_at <= unixepoch('subsec')",
                )?
                .query_row([], |row| row.get(0))?;
            Ok(u64::try_from(count).unwrap_or(0))
        })
        .await
    }
}
