-- Each event keeps its payload's size, which bounds a workflow's untaken events (see
-- PostgreSQL's migration 39).
ALTER TABLE sent_events ADD COLUMN payload_bytes INTEGER NOT NULL DEFAULT 0;
UPDATE sent_events SET payload_bytes = length(CAST(payload AS BLOB));
