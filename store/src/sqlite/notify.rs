//! The notification outbox on SQLite (migrations 36, 42 and 43): claims of one webhook's
//! deliveries (none committed before the webhook was first configured), settlements and
//! retention. Every statement reads the database clock
//! (`unixepoch('subsec')`), as leases do; the one writer connection orders claims and
//! settlements, so a claim's choice and its writes see nothing in between.

use rusqlite::{OptionalExtension, Row, params};

use super::{SqliteStore, parse_json};
use crate::lease::ttl_seconds;
use crate::notify::{
    COLUMNS, Notification, NotificationData, NotificationKind, Settlement, WAITING,
};
use crate::{Error, Result};

/// A claimed row, its JSON still text.
struct Claimed {
    notification: Notification,
    data: String,
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
            data: NotificationData::default(),
            user_id: row.get(6)?,
            user_email: row.get(7)?,
            user_role: row.get(8)?,
            created_at: row.get(9)?,
            attempts: row.get(10)?,
            claim_epoch: row.get(11)?,
        },
        kind: row.get(3)?,
        data: row.get(5)?,
    })
}

fn decoded(claimed: Claimed) -> Result<Notification> {
    let mut notification = claimed.notification;
    notification.kind = NotificationKind::read(&claimed.kind, &notification.id)?;
    notification.data = NotificationData::decode(&parse_json(&claimed.data)?);
    Ok(notification)
}

/// The ids of the notifications a claim for the webhook `?1` takes, at most `?2`, in turns
/// (see `Notifications::claim_notifications`): the oldest open delivery of each workflow with
/// none in flight to it, ranked within its owner, then by age.
const CHOSEN: &str = "
    WITH open AS (
        SELECT o.id, o.workflow, o.user_id, o.created_at, o.seq
          FROM notify_outbox o
          LEFT JOIN notify_deliveries d ON d.id = o.id AND d.target = ?1
         WHERE o.due_at <= unixepoch('subsec')
           AND o.created_at >= coalesce(
                   (SELECT t.since FROM notify_targets t WHERE t.target = ?1), -1e308)
           AND (d.id IS NULL
                OR (NOT d.settled AND d.due_at <= unixepoch('subsec')
                    AND (d.claim_expires_at IS NULL
                         OR d.claim_expires_at <= unixepoch('subsec'))))
           AND NOT EXISTS (SELECT 1 FROM notify_deliveries b
                            WHERE b.target = ?1 AND b.workflow = o.workflow
                              AND b.claim_expires_at > unixepoch('subsec'))),
    heads AS (
        SELECT id, workflow, user_id, created_at,
               row_number() OVER (PARTITION BY workflow ORDER BY created_at, seq) AS nth
          FROM open),
    turns AS (
        SELECT id, created_at,
               row_number() OVER (PARTITION BY user_id ORDER BY created_at, workflow) AS turn
          FROM heads WHERE nth = 1)
    SELECT id FROM turns ORDER BY turn, created_at, id LIMIT ?2";

impl SqliteStore {
    pub(crate) async fn register_notify_target(&self, target: &str) -> Result<bool> {
        let target = target.to_owned();
        self.write(move |connection| {
            let added = connection
                .prepare_cached(
                    "INSERT INTO notify_targets (target, since) VALUES (?1, unixepoch('subsec'))
                     ON CONFLICT (target) DO NOTHING",
                )?
                .execute([target])?;
            Ok(added == 1)
        })
        .await
    }

    pub(crate) async fn claim_notifications(
        &self,
        owner: &str,
        target: &str,
        claim_ms: u64,
        max: u32,
    ) -> Result<Vec<Notification>> {
        let (owner, target) = (owner.to_owned(), target.to_owned());
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
            let chosen = connection
                .prepare_cached(CHOSEN)?
                .query_map(params![target, max], |row| row.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            let mut claimed = Vec::with_capacity(chosen.len());
            for id in chosen {
                connection
                    .prepare_cached(
                        "INSERT INTO notify_deliveries (id, target, workflow, due_at, claim_owner,
                                                        claim_epoch, claim_expires_at)
                         SELECT id, ?2, workflow, unixepoch('subsec'), ?3, 1,
                                unixepoch('subsec') + ?4
                           FROM notify_outbox WHERE id = ?1
                         ON CONFLICT (id, target) DO UPDATE
                            SET claim_owner = excluded.claim_owner,
                                claim_epoch = notify_deliveries.claim_epoch + 1,
                                claim_expires_at = excluded.claim_expires_at",
                    )?
                    .execute(params![id, target, owner, ttl_seconds(claim_ms)])?;
                let row = connection
                    .prepare_cached(&format!(
                        "SELECT {COLUMNS} FROM notify_outbox o
                           JOIN notify_deliveries d ON d.id = o.id AND d.target = ?2
                          WHERE o.id = ?1"
                    ))?
                    .query_row(params![id, target], self::claimed)
                    .optional()?;
                if let Some(row) = row {
                    claimed.push(decoded(row)?);
                }
            }
            Ok(claimed)
        })
        .await
    }

    pub(crate) async fn settle_notification(
        &self,
        id: &str,
        target: &str,
        epoch: i64,
        settlement: Settlement,
        targets: &[String],
    ) -> Result<bool> {
        let (id, target) = (id.to_owned(), target.to_owned());
        let targets = serde_json::to_string(targets).map_err(|e| Error::Database(e.to_string()))?;
        self.write(move |connection| {
            // Only the claim that holds the delivery settles it: a settled or released one holds
            // no claim, so a second settlement under the same epoch changes nothing.
            let held = "id = ?1 AND target = ?2 AND claim_epoch = ?3
                        AND claim_expires_at IS NOT NULL";
            let changed = match settlement {
                Settlement::Finished => {
                    let changed = connection
                        .prepare_cached(&format!(
                            "UPDATE notify_deliveries
                                SET settled = 1, claim_owner = NULL, claim_expires_at = NULL
                              WHERE {held}"
                        ))?
                        .execute(params![id, target, epoch])?;
                    if changed == 1 {
                        connection
                            .prepare_cached(
                                // A webhook configured after the row committed never
                                // takes it, so it waits for none of those.
                                "DELETE FROM notify_outbox
                                  WHERE id = ?1
                                    AND NOT EXISTS (
                                        SELECT 1 FROM json_each(?2) t
                                         WHERE NOT EXISTS (
                                             SELECT 1 FROM notify_deliveries d
                                              WHERE d.id = ?1 AND d.target = t.value
                                                AND d.settled)
                                           AND NOT EXISTS (
                                             SELECT 1 FROM notify_targets n
                                              WHERE n.target = t.value
                                                AND n.since > notify_outbox.created_at))",
                            )?
                            .execute(params![id, targets])?;
                    }
                    changed
                }
                Settlement::Retry { after_ms } => connection
                    .prepare_cached(&format!(
                        "UPDATE notify_deliveries
                            SET attempts = attempts + 1, due_at = unixepoch('subsec') + ?4,
                                claim_owner = NULL, claim_expires_at = NULL
                          WHERE {held}"
                    ))?
                    .execute(params![id, target, epoch, ttl_seconds(after_ms)])?,
            };
            Ok(changed == 1)
        })
        .await
    }

    pub(crate) async fn purge_notifications(&self, retention_ms: u64) -> Result<u64> {
        self.write(move |connection| {
            // Their deliveries go with them (`ON DELETE CASCADE`).
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

#[cfg(test)]
mod tests {
    use crate::{DatabaseUrl, Store, StoreOptions};

    /// Migration 42 moves what a row had delivered to its deliveries: an upgraded node never
    /// posts a notification again to a webhook that took it, and still owes it to the others.
    #[tokio::test]
    async fn an_upgraded_outbox_keeps_what_each_webhook_took() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("reins.db");
        {
            let connection = crate::sqlite::database_before(&path, 42);
            connection
                .execute_batch(
                    r#"INSERT INTO notify_outbox (id, workflow, seq, kind, event, data, created_at,
                                                  due_at, attempts, delivered_to)
                       VALUES ('wf:1', 'wf', 1, 'entered', 'pause_waiting', '{}', 0, 0, 2,
                               '["https://a.example/hook"]'),
                              ('wf2:1', 'wf2', 1, 'entered', 'pause_waiting', '{}', 0, 0, 0, '[]')"#,
                )
                .expect("two rows before the upgrade, one taken by the first webhook");
        }
        let store = Store::open(&DatabaseUrl::Sqlite(path.clone()), &StoreOptions::default())
            .await
            .expect("open");
        store.migrate().await.expect("migrate");
        let ids = |claimed: Vec<crate::Notification>| {
            let mut ids: Vec<String> = claimed.into_iter().map(|n| n.id).collect();
            ids.sort();
            ids
        };
        let first = store
            .claim_notifications("node", "https://a.example/hook", 60_000, 10)
            .await
            .expect("claim");
        assert_eq!(ids(first), ["wf2:1"]);
        let second = store
            .claim_notifications("node", "https://b.example/hook", 60_000, 10)
            .await
            .expect("claim");
        assert_eq!(ids(second), ["wf2:1", "wf:1"]);
    }
}
