-- The events a workflow holds untaken are bounded (issue 39, item 2: 2,000 events of 48 KB sent
-- to a workflow that waited for another name were all kept, uncounted, until it was deleted):
-- in number (`limits.untaken_events_per_workflow_max`) and in payload bytes
-- (`limits.untaken_event_bytes_per_workflow_max`), checked when one is sent. Each row keeps its
-- payload's size as JSON text, so the check sums a column over the workflow's untaken rows (the
-- partial index of migration 35) and never reads a payload.
ALTER TABLE sent_events ADD COLUMN payload_bytes BIGINT NOT NULL DEFAULT 0;
UPDATE sent_events SET payload_bytes = octet_length(payload::text);
