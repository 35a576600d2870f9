-- The journal's order: each step attempt carries the sequence number of the call that made it, so
-- a replay reads the journal in the order the script made its calls.
ALTER TABLE workflow_steps ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX workflow_steps_by_seq ON workflow_steps (workflow, seq, attempt);
CREATE INDEX workflows_live_by_user ON workflows (user_id)
    WHERE status IN ('running', 'paused', 'waiting_approval', 'cancelling', 'needs_reconciliation');
