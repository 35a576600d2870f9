-- The feed's numbers are given after commit, by its readers, instead of inside every status
-- change. A status change (and a launch) took `event_feed.seq + 1` in its own transaction and
-- held that one row's lock until its commit was flushed: every status-changing transaction of
-- the cluster waited for the one before it (some 40 ms of lock wait per workflow with 32 in
-- flight, two thirds of all the time PostgreSQL spent executing a workflow's statements).
--
-- Now a status event is written without a feed number (`feed_seq` NULL, `user_id` set) and
-- `reins_number_feed()`, which every feed read calls first, numbers the status events that
-- have committed: under the `event_feed` row's lock, held to its own commit, it gives the
-- next numbers to every committed status event without one, in the order of their times. So
-- the numbers still commit in order: a reader that sees number n sees every number below it,
-- and a number, once seen, never changes and is never given again. Nobody reads the feed:
-- nothing is numbered, and a status change costs no more than its event's row.
CREATE INDEX workflow_events_unnumbered ON workflow_events (created_at, workflow, seq)
    WHERE feed_seq IS NULL AND user_id IS NOT NULL;

CREATE OR REPLACE FUNCTION reins_number_feed() RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_head BIGINT;
    v_last BIGINT;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM workflow_events WHERE feed_seq IS NULL AND user_id IS NOT NULL)
    THEN
        RETURN;
    END IF;
    -- The lock that orders the numbers. Each statement below takes its snapshot after it was
    -- granted, so it sees every number the holder before gave, and every event committed since.
    SELECT seq INTO v_head FROM event_feed WHERE id = 1 FOR UPDATE;
    WITH todo AS (
        SELECT workflow, seq, row_number() OVER (ORDER BY created_at, workflow, seq) AS n
          FROM workflow_events
         WHERE feed_seq IS NULL AND user_id IS NOT NULL
    ), numbered AS (
        UPDATE workflow_events e SET feed_seq = v_head + todo.n
          FROM todo
         WHERE e.workflow = todo.workflow AND e.seq = todo.seq
        RETURNING e.feed_seq
    )
    SELECT max(feed_seq) INTO v_last FROM numbered;
    -- An event deleted meanwhile (its workflow was) leaves its number unused: a gap, as a
    -- deleted workflow's numbered events leave one.
    IF v_last IS NOT NULL THEN
        UPDATE event_feed SET seq = v_last WHERE id = 1;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION reins_status_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n BIGINT;
BEGIN
    IF NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NEW;
    END IF;
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.id RETURNING seq INTO n;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, user_id)
    VALUES (NEW.id, n, 'status',
            jsonb_build_object('status', NEW.status, 'previous', OLD.status),
            reins_now(), NEW.user_id);
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION reins_launch_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workflow_event_seqs (workflow, seq) VALUES (NEW.id, 1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, user_id)
    VALUES (NEW.id, 1, 'status',
            jsonb_build_object('status', NEW.status, 'previous', NULL),
            reins_now(), NEW.user_id);
    RETURN NULL;
END $$;
