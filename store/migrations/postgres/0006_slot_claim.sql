-- Claims a child slot for (workflow, step) at an attempt in one call, or raises RS001 when every
-- slot is taken. It takes the slots lock itself (the same key admissions used before, "slots"
-- in ASCII), so an admission that sends it right after inserting its run, and then commits,
-- holds the cluster-wide lock only while the server runs this and the commit, never across the
-- client's round trips.
CREATE OR REPLACE FUNCTION reins_claim_slot(p_workflow TEXT, p_step TEXT, p_attempt INTEGER,
                                            p_max BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(495740482675);
    UPDATE workflow_slots SET attempt = p_attempt
     WHERE workflow = p_workflow AND step_id = p_step;
    IF FOUND THEN
        RETURN;
    END IF;
    IF (SELECT count(*) FROM workflow_slots) >= p_max THEN
        RAISE EXCEPTION 'every child slot is taken' USING ERRCODE = 'RS001';
    END IF;
    INSERT INTO workflow_slots (workflow, step_id, attempt, created_at)
    VALUES (p_workflow, p_step, p_attempt, reins_now());
END
$$;

-- The rules a launch is admitted under, in one call that takes the launch lock itself ("launch"
-- in ASCII): RW003 when the user's request_id launched a workflow before (the caller reads it),
-- RW001 at max_workflows live workflows, RW002 at the user's max_workflows_per_owner. A launch
-- sends it pipelined with its inserts and then commits, so the lock is never held across a wait
-- for the client.
CREATE OR REPLACE FUNCTION reins_launch_guard(p_user TEXT, p_request_id TEXT, p_live TEXT[],
                                              p_max_total BIGINT, p_max_mine BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_total BIGINT;
    v_mine BIGINT;
BEGIN
    PERFORM pg_advisory_xact_lock(119165837796200);
    IF p_request_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM workflows WHERE user_id = p_user AND request_id = p_request_id
    ) THEN
        RAISE EXCEPTION 'request_id launched before' USING ERRCODE = 'RW003';
    END IF;
    SELECT count(*), count(*) FILTER (WHERE user_id = p_user) INTO v_total, v_mine
      FROM workflows WHERE status = ANY(p_live);
    IF v_total >= p_max_total THEN
        RAISE EXCEPTION 'max_workflows' USING ERRCODE = 'RW001';
    END IF;
    IF v_mine >= p_max_mine THEN
        RAISE EXCEPTION 'max_workflows_per_owner' USING ERRCODE = 'RW002';
    END IF;
END
$$;
