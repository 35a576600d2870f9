-- Notifications delivered to each webhook on its own: see the PostgreSQL migration 42 of the
-- same name.
CREATE TABLE notify_deliveries (
    id                TEXT NOT NULL REFERENCES notify_outbox (id) ON DELETE CASCADE,
    target            TEXT NOT NULL,
    workflow          TEXT NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    due_at            REAL NOT NULL,
    settled           INTEGER NOT NULL DEFAULT 0,
    claim_owner       TEXT,
    claim_epoch       INTEGER NOT NULL DEFAULT 0,
    claim_expires_at  REAL,
    PRIMARY KEY (id, target)
);
CREATE INDEX notify_deliveries_claimed ON notify_deliveries (target, workflow)
    WHERE claim_expires_at IS NOT NULL;

INSERT OR IGNORE INTO notify_deliveries (id, target, workflow, attempts, due_at, settled)
SELECT o.id, t.value, o.workflow, o.attempts, o.due_at, 1
  FROM notify_outbox o, json_each(o.delivered_to) AS t;

ALTER TABLE notify_outbox DROP COLUMN attempts;
ALTER TABLE notify_outbox DROP COLUMN delivered_to;
ALTER TABLE notify_outbox DROP COLUMN claim_owner;
ALTER TABLE notify_outbox DROP COLUMN claim_epoch;
ALTER TABLE notify_outbox DROP COLUMN claim_expires_at;
