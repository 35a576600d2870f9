-- Notifications are delivered to each webhook on its own (issue 39 item 4). One user's burst of
-- pauses and one webhook that never answered delayed every notification and flooded the healthy
-- webhooks with duplicates: a claim took a whole row for every webhook, each batch waited for
-- the slowest one, and the claim lapsed before the batch settled, so the rows were taken and
-- posted to every webhook again.
--
-- A delivery is one notification to one webhook (`target`: its URL, as the node's `[[notify]]`
-- names it), with its own attempts, next due time and claim. A claim takes delivery rows of one
-- target (written the first time it is claimed), so a webhook that never answers holds only its
-- own; `settled` marks one delivered, given up, or not taken by that webhook's filters. The
-- outbox row stays until every webhook of the node that settles the last one has settled it,
-- and its deletion takes its deliveries with it. `workflow` is copied from the outbox row so a
-- claim finds a workflow's delivery in flight to that target through an index.
--
-- The rows' per-notification claim and attempt columns go; what a row had delivered already
-- becomes a settled delivery to each webhook it names, so nothing delivered is sent again.
CREATE TABLE notify_deliveries (
    id                TEXT NOT NULL REFERENCES notify_outbox (id) ON DELETE CASCADE,
    target            TEXT NOT NULL,
    workflow          TEXT NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    due_at            DOUBLE PRECISION NOT NULL,
    settled           BOOLEAN NOT NULL DEFAULT false,
    claim_owner       TEXT,
    claim_epoch       BIGINT NOT NULL DEFAULT 0,
    claim_expires_at  DOUBLE PRECISION,
    PRIMARY KEY (id, target)
);
CREATE INDEX notify_deliveries_claimed ON notify_deliveries (target, workflow)
    WHERE claim_expires_at IS NOT NULL;

INSERT INTO notify_deliveries (id, target, workflow, attempts, due_at, settled)
SELECT o.id, t.target, o.workflow, o.attempts, o.due_at, true
  FROM notify_outbox o, jsonb_array_elements_text(o.delivered_to) AS t (target)
ON CONFLICT DO NOTHING;

ALTER TABLE notify_outbox DROP COLUMN attempts, DROP COLUMN delivered_to,
    DROP COLUMN claim_owner, DROP COLUMN claim_epoch, DROP COLUMN claim_expires_at;
