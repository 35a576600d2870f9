-- Events sent to a workflow (`POST /api/v1/workflows/{id}/events`, `reins send`; issue 32, item
-- 2): any node records one, without a fence, as it records a control; the owner's
-- `waitForEvent` takes it, in the fenced write that journals the wait's outcome. An event is kept
-- until a wait takes it, so one sent before the script reaches its wait is not lost.
--
-- `seq` orders a workflow's events as they were sent (a wait takes the oldest untaken one of its
-- name); `event_id` is the sender's, unique per workflow, so the same event sent twice is stored
-- once. `taken_by` names the step that took it (a step id, unique in a workflow's journal):
-- once set it never changes, so an event is delivered to one wait at most. The row goes with its
-- workflow (the foreign key cascades: any node writes it, unlike the fenced rows of migration 23).
CREATE TABLE sent_events (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    event_id    TEXT NOT NULL,
    name        TEXT NOT NULL,
    payload     JSONB NOT NULL,
    created_by  TEXT,
    created_at  DOUBLE PRECISION NOT NULL,
    taken_by    TEXT,
    taken_at    DOUBLE PRECISION,
    UNIQUE (workflow, event_id)
);

-- What a wait reads: a workflow's untaken events, oldest first.
CREATE INDEX sent_events_untaken ON sent_events (workflow, seq) WHERE taken_by IS NULL;

-- An event wakes its workflow's owner as a control does (the change bus, migration 19): the
-- owner reads its events when it waits for one.
CREATE TRIGGER sent_events_notify AFTER INSERT ON sent_events
    FOR EACH ROW EXECUTE FUNCTION reins_notify_control();
