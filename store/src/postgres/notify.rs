//! The notification outbox on PostgreSQL (migrations 36, 42 and 43): claims of one webhook's
//! deliveries (none committed before the webhook was first configured), settlements and
//! retention. A claim writes its deliveries with one `INSERT ... ON
//! CONFLICT DO UPDATE` whose update is conditioned on the delivery being free, so of two claims
//! at once only one takes it: the other waits for the first to commit, finds it claimed, and
//! takes nothing. Times are the database clock (`reins_now()`).

use tokio_postgres::Row;

use super::PgStore;
use crate::Result;
use crate::lease::ttl_seconds;
use crate::notify::{
    COLUMNS, Notification, NotificationData, NotificationKind, Settlement, WAITING,
};

fn notification(row: &Row) -> Result<Notification> {
    let id: String = row.get(0);
    let kind = NotificationKind::read(row.get(3), &id)?;
    let attempts: i32 = row.get(10);
    Ok(Notification {
        workflow_id: row.get(1),
        seq: row.get(2),
        kind,
        event: row.get(4),
        data: NotificationData::decode(&row.get::<_, serde_json::Value>(5)),
        user_id: row.get(6),
        user_email: row.get(7),
        user_role: row.get(8),
        created_at: row.get(9),
        attempts: u32::try_from(attempts).unwrap_or(0),
        claim_epoch: row.get(11),
        id,
    })
}

impl PgStore {
    pub(crate) async fn register_notify_target(&self, target: &str) -> Result<bool> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "INSERT INTO notify_targets (target, since) VALUES ($1, reins_now())
                 ON CONFLICT (target) DO NOTHING",
            )
            .await?;
        Ok(client.execute(&statement, &[&target]).await? == 1)
    }

    pub(crate) async fn claim_notifications(
        &self,
        owner: &str,
        target: &str,
        claim_ms: u64,
        max: u32,
    ) -> Result<Vec<Notification>> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(&format!(
                // A reminder whose workflow no longer waits (it ended another way than a
                // decision) is never sent: deleted, and not claimed in the same snapshot. Of
                // the open deliveries (due, not settled, not claimed), each workflow's oldest
                // goes unless another of it is in flight to this webhook; owners take turns.
                "WITH stale AS (
                     DELETE FROM notify_outbox s
                      WHERE s.kind = 'overdue' AND s.due_at <= reins_now()
                        AND NOT EXISTS (SELECT 1 FROM workflows w
                                         WHERE w.id = s.workflow AND w.status IN {WAITING})),
                 open AS (
                     SELECT o.id, o.workflow, o.user_id, o.created_at, o.seq
                       FROM notify_outbox o
                       LEFT JOIN notify_deliveries d ON d.id = o.id AND d.target = $2
                      WHERE o.due_at <= reins_now()
                        AND o.created_at >= coalesce(
                                (SELECT t.since FROM notify_targets t WHERE t.target = $2),
                                '-infinity'::float8)
                        AND (d.id IS NULL
                             OR (NOT d.settled AND d.due_at <= reins_now()
                                 AND (d.claim_expires_at IS NULL
                                      OR d.claim_expires_at <= reins_now())))
                        AND (o.kind <> 'overdue'
                             OR EXISTS (SELECT 1 FROM workflows w
                                         WHERE w.id = o.workflow AND w.status IN {WAITING}))
                        AND NOT EXISTS (SELECT 1 FROM notify_deliveries b
                                         WHERE b.target = $2 AND b.workflow = o.workflow
                                           AND b.claim_expires_at > reins_now())),
                 heads AS (
                     SELECT id, workflow, user_id, created_at,
                            row_number() OVER (PARTITION BY workflow
                                               ORDER BY created_at, seq) AS nth
                       FROM open),
                 turns AS (
                     SELECT id, workflow, created_at,
                            row_number() OVER (PARTITION BY user_id
                                               ORDER BY created_at, workflow) AS turn
                       FROM heads WHERE nth = 1),
                 chosen AS (
                     SELECT id, workflow, turn, created_at FROM turns
                      ORDER BY turn, created_at, id LIMIT $4::bigint),
                 claimed AS (
                     INSERT INTO notify_deliveries AS d (id, target, workflow, due_at, claim_owner,
                                                         claim_epoch, claim_expires_at)
                     SELECT id, $2, workflow, reins_now(), $1, 1, reins_now() + $3::float8
                       FROM chosen
                     ON CONFLICT (id, target) DO UPDATE
                        SET claim_owner = EXCLUDED.claim_owner,
                            claim_epoch = d.claim_epoch + 1,
                            claim_expires_at = EXCLUDED.claim_expires_at
                      WHERE NOT d.settled AND d.due_at <= reins_now()
                        AND (d.claim_expires_at IS NULL OR d.claim_expires_at <= reins_now())
                     RETURNING d.id, d.attempts, d.claim_epoch)
                 SELECT {COLUMNS} FROM claimed d JOIN notify_outbox o ON o.id = d.id
                   JOIN chosen c ON c.id = d.id
                  ORDER BY c.turn, c.created_at, c.id"
            ))
            .await?;
        let rows = client
            .query(
                &statement,
                &[&owner, &target, &ttl_seconds(claim_ms), &i64::from(max)],
            )
            .await?;
        rows.iter().map(notification).collect()
    }

    pub(crate) async fn settle_notification(
        &self,
        id: &str,
        target: &str,
        epoch: i64,
        settlement: Settlement,
        targets: &[String],
    ) -> Result<bool> {
        let mut client = self.connection().await?;
        // Only the claim that holds the delivery settles it: a settled or released one holds no
        // claim, so a second settlement under the same epoch changes nothing.
        let held = "id = $1 AND target = $2 AND claim_epoch = $3 AND claim_expires_at IS NOT NULL";
        let changed = match settlement {
            Settlement::Finished => {
                let transaction = client.transaction().await?;
                // Two webhooks' settlements of one row take turns here, so the second sees the
                // first's and deletes the row once both have settled it. `NO KEY UPDATE` lets a
                // claim of another webhook (which only reads the row's key) go on meanwhile.
                transaction
                    .execute(
                        &transaction
                            .prepare_cached(
                                "SELECT 1 FROM notify_outbox WHERE id = $1 FOR NO KEY UPDATE",
                            )
                            .await?,
                        &[&id],
                    )
                    .await?;
                let changed = transaction
                    .execute(
                        &transaction
                            .prepare_cached(&format!(
                                "UPDATE notify_deliveries
                                    SET settled = true, claim_owner = NULL, claim_expires_at = NULL
                                  WHERE {held}"
                            ))
                            .await?,
                        &[&id, &target, &epoch],
                    )
                    .await?;
                if changed == 1 {
                    transaction
                        .execute(
                            &transaction
                                .prepare_cached(
                                    // A webhook configured after the row committed
                                    // never takes it, so it waits for none of those.
                                    "DELETE FROM notify_outbox o
                                      WHERE o.id = $1
                                        AND NOT EXISTS (
                                            SELECT 1 FROM unnest($2::text[]) AS t (target)
                                             WHERE NOT EXISTS (
                                                 SELECT 1 FROM notify_deliveries d
                                                  WHERE d.id = $1 AND d.target = t.target
                                                    AND d.settled)
                                               AND NOT EXISTS (
                                                 SELECT 1 FROM notify_targets n
                                                  WHERE n.target = t.target
                                                    AND n.since > o.created_at))",
                                )
                                .await?,
                            &[&id, &targets],
                        )
                        .await?;
                }
                transaction.commit().await?;
                changed
            }
            Settlement::Retry { after_ms } => {
                let statement = client
                    .prepare_cached(&format!(
                        "UPDATE notify_deliveries
                            SET attempts = attempts + 1, due_at = reins_now() + $4::float8,
                                claim_owner = NULL, claim_expires_at = NULL
                          WHERE {held}"
                    ))
                    .await?;
                client
                    .execute(&statement, &[&id, &target, &epoch, &ttl_seconds(after_ms)])
                    .await?
            }
        };
        Ok(changed == 1)
    }

    pub(crate) async fn purge_notifications(&self, retention_ms: u64) -> Result<u64> {
        let client = self.connection().await?;
        // Their deliveries go with them (`ON DELETE CASCADE`).
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
