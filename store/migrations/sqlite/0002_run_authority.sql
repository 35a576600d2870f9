-- Child runs: why a run stopped (orphan_recovered, ...) and a revision that every write of the row
-- increments, so that a compare-and-set can name the exact version it read.
ALTER TABLE runs ADD COLUMN stop_reason TEXT;
ALTER TABLE runs ADD COLUMN revision INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_by_thread ON runs (thread_id, created_at);
CREATE INDEX runs_live_by_lease ON runs (lease_expires_at) WHERE status IN ('pending', 'running');
