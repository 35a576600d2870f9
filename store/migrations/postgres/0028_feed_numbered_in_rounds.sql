-- `reins_number_feed()` (migration 25) numbered every committed status event without a feed
-- number in one statement. A backlog (a cluster whose feed nobody read for a long time: each
-- workflow leaves three or four status events) could outlast `statement_timeout`; the
-- statement then rolled back having numbered nothing, and every later read of the feed met the
-- same backlog and the same timeout, for good.
--
-- Now a call numbers at most `p_max` of the oldest such events (under the same lock, in the
-- same order); the next reads number the next ones. The numbers still commit in order, each
-- given once.
CREATE FUNCTION reins_number_feed(p_max INTEGER) RETURNS void LANGUAGE plpgsql AS $$
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
    WITH oldest AS (
        SELECT workflow, seq, created_at
          FROM workflow_events
         WHERE feed_seq IS NULL AND user_id IS NOT NULL
         ORDER BY created_at, workflow, seq
         LIMIT p_max
    ), todo AS (
        SELECT workflow, seq, row_number() OVER (ORDER BY created_at, workflow, seq) AS n
          FROM oldest
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

-- Nodes of this version call the bounded function only. A node of the version before, still
-- running while this one migrates, fails its feed reads (each stream retries) until it is
-- restarted on this version; its workflows are not affected.
DROP FUNCTION reins_number_feed();
