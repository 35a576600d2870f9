-- Attempt errors, events and a retry's workspace copies count against their owner's quota,
-- inside their workflow's grant (see PostgreSQL's migration 40; `return_storage` in
-- `sqlite/mod.rs` subtracts them all).
ALTER TABLE workflow_steps ADD COLUMN error_bytes INTEGER NOT NULL DEFAULT 0
    CHECK (error_bytes >= 0);
ALTER TABLE workflow_storage ADD COLUMN copied_bytes INTEGER NOT NULL DEFAULT 0
    CHECK (copied_bytes >= 0);
-- A dormant workflow's waited event names as a JSON array; NULL: any event wakes it.
ALTER TABLE workflows ADD COLUMN wake_on_events TEXT;
CREATE INDEX sent_events_untaken_by_name ON sent_events (workflow, name, seq)
    WHERE taken_by IS NULL;
DROP INDEX sent_events_untaken;
