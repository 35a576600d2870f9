-- Dormant workflows (issue 32 item 5): a workflow that has only waited (a sleep, a pause, a
-- checkpoint, an event, a retry's backoff) for `workflows.dormant_after_ms` is left in the store
-- alone: no node runs a supervisor for it or renews its lease. `dormant` marks it; `wake_at`
-- (epoch seconds, as leases keep time) is when its lease expires: its earliest journaled due
-- time, or 9999-12-31 when only a control or an event wakes it, or the moment one of those was
-- recorded. The workflow's lease row expires at the same time, so no node may take it over
-- before; the takeover that wakes it clears both. The partial index answers "which dormant
-- workflow wakes next" and "which are due" without reading the others.

ALTER TABLE workflows ADD COLUMN dormant BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE workflows ADD COLUMN wake_at DOUBLE PRECISION;
CREATE INDEX workflows_dormant_by_wake ON workflows (wake_at) WHERE dormant;
