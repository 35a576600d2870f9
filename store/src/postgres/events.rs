//! Reading workflow events and the feed on PostgreSQL.

use deadpool_postgres::Object;
use tokio_postgres::{Row, Statement};

use super::PgStore;
use crate::lease::ttl_seconds;
use crate::{EventPage, EventRow, Result, WorkflowId, WorkflowStatus};

fn event(row: &Row, first: usize) -> EventRow {
    EventRow {
        workflow_id: row.get(first),
        seq: row.get(first + 1),
        kind: row.get(first + 2),
        data: row.get(first + 3),
        created_at: row.get(first + 4),
    }
}

impl PgStore {
    pub(crate) async fn read_events(
        &self,
        workflow_id: &WorkflowId,
        after: i64,
        limit: u32,
    ) -> Result<Option<EventPage>> {
        let client = self.connection().await?;
        // One statement, so the status and the events are of one snapshot.
        let statement = client
            .prepare_cached(
                "SELECT w.status, n.seq, e.workflow, e.seq, e.kind, e.data, e.created_at
                   FROM workflows w
                   JOIN workflow_event_seqs n ON n.workflow = w.id
                   LEFT JOIN LATERAL (SELECT * FROM workflow_events
                                       WHERE workflow = w.id AND seq > $2
                                       ORDER BY seq LIMIT $3) e ON true
                  WHERE w.id = $1
                  ORDER BY e.seq",
            )
            .await?;
        let rows = client
            .query(&statement, &[&workflow_id, &after, &i64::from(limit)])
            .await?;
        let Some(first) = rows.first() else {
            return Ok(None);
        };
        Ok(Some(EventPage {
            status: WorkflowStatus::read(first.get(0), workflow_id)?,
            last_seq: first.get(1),
            events: rows
                .iter()
                .filter(|row| row.get::<_, Option<String>>(2).is_some())
                .map(|row| event(row, 2))
                .collect(),
        }))
    }

    /// Moves the watch forward only: two streams of one workflow keep the later of the two.
    pub(crate) async fn watch_events(&self, workflow_id: &WorkflowId, watch_ms: u64) -> Result<()> {
        let client = self.connection().await?;
        let statement = client
            .prepare_cached(
                "UPDATE workflow_event_seqs
                    SET watched_until = GREATEST(watched_until, reins_now() + $2)
                  WHERE workflow = $1",
            )
            .await?;
        client
            .execute(&statement, &[&workflow_id, &ttl_seconds(watch_ms)])
            .await?;
        Ok(())
    }

    /// Numbers the oldest committed status events that have no feed number yet (at most
    /// `feed_numbering_max`: migrations 25 and 28), then reads: one round trip, two statements,
    /// so the read sees the numbers just given. Events past the bound are numbered by the next
    /// reads, which a stream makes when woken or at its poll.
    pub(crate) async fn read_feed(
        &self,
        after: i64,
        user_id: Option<&str>,
        limit: u32,
    ) -> Result<Vec<EventRow>> {
        let client = self.connection().await?;
        let number = client.prepare_cached(NUMBER_FEED).await?;
        let limit = i64::from(limit);
        let (sql, params): (_, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>) = match &user_id {
            None => (
                "SELECT workflow, feed_seq, kind, data, created_at FROM workflow_events
                  WHERE feed_seq > $1 ORDER BY feed_seq LIMIT $2",
                vec![&after, &limit],
            ),
            Some(user_id) => (
                "SELECT workflow, feed_seq, kind, data, created_at FROM workflow_events
                  WHERE user_id = $1 AND feed_seq > $2 ORDER BY feed_seq LIMIT $3",
                vec![user_id, &after, &limit],
            ),
        };
        let statement = client.prepare_cached(sql).await?;
        let (numbered, rows) = tokio::join!(
            self.number_feed(&client, &number),
            client.query(&statement, &params)
        );
        numbered?;
        Ok(rows?.iter().map(|row| event(row, 0)).collect())
    }

    /// The newest number after one round of numbering: with a backlog beyond
    /// `feed_numbering_max`, status events committed before this read may be numbered after it.
    pub(crate) async fn feed_head(&self) -> Result<i64> {
        let client = self.connection().await?;
        let number = client.prepare_cached(NUMBER_FEED).await?;
        let head = client
            .prepare_cached("SELECT seq FROM event_feed WHERE id = 1")
            .await?;
        let (numbered, head) = tokio::join!(
            self.number_feed(&client, &number),
            client.query_one(&head, &[])
        );
        numbered?;
        Ok(head?.get(0))
    }

    /// One bounded round of numbering (`NUMBER_FEED`), sent when first polled, so that a read
    /// joined after it goes in the same round trip.
    async fn number_feed(
        &self,
        client: &Object,
        number: &Statement,
    ) -> std::result::Result<u64, tokio_postgres::Error> {
        client.execute(number, &[&self.feed_numbering_max]).await
    }
}

/// Gives feed numbers to at most `$1` of the status events committed without one, oldest first,
/// under the feed's lock, in a transaction of its own (migrations 25 and 28); nothing when there
/// is none.
const NUMBER_FEED: &str = "SELECT reins_number_feed($1)";
