-- Every byte a user causes counts against their quota (issue 39): not only artifacts but the
-- error of each failed attempt, each event sent to their workflows and the workspace a retry
-- copies. All of it lives inside the workflow's grant (`workflow_storage.granted_bytes`,
-- migration 32), so a user's `stored_bytes` stays the sum of their workflows' grants and a
-- workflow's end gives back only what its grant holds beyond everything it stores.
--
-- Each journal row keeps the bytes of its error (its rejected outcome as JSON text, cut at
-- ingest to `limits.error_bytes_max`), written with the row; rows written before this migration
-- count 0, as they were not granted.
ALTER TABLE workflow_steps ADD COLUMN error_bytes BIGINT NOT NULL DEFAULT 0
    CHECK (error_bytes >= 0);
-- The bytes of data a retry copied from the workspaces of the steps it adopted.
ALTER TABLE workflow_storage ADD COLUMN copied_bytes BIGINT NOT NULL DEFAULT 0
    CHECK (copied_bytes >= 0);

-- What a dormant workflow's waits are for: an event of another name does not wake it (2,000
-- events of another name woke it 2,000 times, each a takeover and a replay). NULL (a workflow
-- that went dormant before this migration): any event wakes it.
ALTER TABLE workflows ADD COLUMN wake_on_events TEXT[];

-- A wait finds the oldest untaken event of its name through this index, never reading the
-- others; the bounds of migration 39 count a workflow's untaken rows through its prefix.
CREATE INDEX sent_events_untaken_by_name ON sent_events (workflow, name, seq)
    WHERE taken_by IS NULL;
DROP INDEX sent_events_untaken;

-- Marks what `p_workflow`'s grant holds beyond what it stores (artifacts, errors, events and
-- copied workspaces) as given back. Only the workflow's own row is written.
CREATE OR REPLACE FUNCTION reins_return_storage(p_workflow TEXT)
RETURNS void LANGUAGE sql AS $$
    UPDATE workflow_storage
       SET returned_bytes = greatest(granted_bytes - copied_bytes
               - coalesce((SELECT sum(a.bytes) FROM workflow_artifacts a
                            WHERE a.workflow = p_workflow), 0)
               - coalesce((SELECT sum(s.error_bytes) FROM workflow_steps s
                            WHERE s.workflow = p_workflow), 0)
               - coalesce((SELECT sum(e.payload_bytes) FROM sent_events e
                            WHERE e.workflow = p_workflow), 0), 0)
     WHERE workflow = p_workflow;
$$;
