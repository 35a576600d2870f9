-- Slots kept free for other users (`limits.active_children_reserved`, issue 39 item 5): the
-- share of migration 31 decides who gets a freed slot, but a user who took every slot while
-- alone kept them for as long as their agents ran, and another user's first step waited for one
-- of those agents to end.
--
-- 1. `reins_claim_fair_slot(workflow, step, attempt, max, user_max, reserved)` is what this
--    build's admissions call. It claims under the rules of the five-argument function of
--    migration 31, and refuses (RS001, as for a full cluster) a new slot to a step whose
--    workflow's owner holds `p_user_max` slots already when fewer than `p_reserved` would stay
--    free, whether or not anybody waits: a user below their share, such as another user's first
--    step, finds a slot at once.
--
--    Without serialising every claim: the slots numbered below `p_max - p_reserved` are the
--    unreserved ones. While none numbered above is held, a claim of one of them can leave no
--    fewer than `p_reserved` free, so it needs no count: it claims there (migration 31's
--    function over the lower numbers) inside a subtransaction, holding the cluster-wide
--    advisory lock "keep" (1801807216) in shared mode, which other claims share. Only when
--    those numbers are all taken (the subtransaction's RS001 rolls it back, its locks with it)
--    or a reserved number is held does a claim count: first without a lock (what is committed
--    refusing it refuses it, so a user alone who fills the unreserved slots is refused at
--    once), then under "keep" in exclusive mode, which waits for every claim in flight to
--    commit, so the owner's count and the cluster's are exact: a user at their share is refused while the free slots are the reserved ones, and
--    anyone else claims over the whole range. A cluster whose unreserved slots have room never
--    takes "keep" exclusively. A subtransaction never holds "keep" when it asks for it
--    exclusively, so no claim upgrades a lock another holds. Lock order: "keep", then the
--    slot numbers (try-locks only), the cluster-wide lock of migration 6 (rare), the per-user
--    lock of migration 29 (while another user waits). The five-argument function stays as it
--    was: a node of the build before calls it during a rolling upgrade (its claims then keep no
--    slots for others).
--
-- 2. `reins_claim_run_slot(run, owner, max, user_max, reserved)`: migration 31's claim of the
--    slot an answered run needs again, under the same rules with the reserve.

CREATE OR REPLACE FUNCTION reins_claim_fair_slot(p_workflow TEXT, p_step TEXT, p_attempt INTEGER,
                                                 p_max BIGINT, p_user_max BIGINT,
                                                 p_reserved BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_user TEXT;
    v_held BIGINT;
    v_taken BIGINT;
BEGIN
    -- No reserve, no share, or a new attempt of a step that keeps the slot it holds: as
    -- migration 31 claims.
    IF p_reserved <= 0 OR p_user_max >= p_max OR p_reserved >= p_max
       OR EXISTS (SELECT 1 FROM workflow_slots WHERE workflow = p_workflow AND step_id = p_step)
    THEN
        PERFORM reins_claim_fair_slot(p_workflow, p_step, p_attempt, p_max, p_user_max);
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no >= p_max - p_reserved) THEN
        BEGIN
            PERFORM pg_advisory_xact_lock_shared(1801807216);
            PERFORM reins_claim_fair_slot(p_workflow, p_step, p_attempt, p_max - p_reserved,
                                          p_user_max);
            RETURN;
        EXCEPTION WHEN SQLSTATE 'RS001' THEN
            -- The unreserved slots are taken (or the share binds): nothing of the try stays.
            NULL;
        END;
    END IF;
    SELECT user_id INTO v_user FROM workflows WHERE id = p_workflow;
    -- Counted first without the lock: what is committed already refusing the claim refuses it
    -- (a slot given back meanwhile cues the queued step to claim again), so a user alone who
    -- fills every unreserved slot is refused without waiting for anyone; only a claim the
    -- committed rows would let through waits for the claims in flight and counts again.
    FOR v_i IN 1 .. 2 LOOP
        IF v_i = 2 THEN
            PERFORM pg_advisory_xact_lock(1801807216);
        END IF;
        EXIT WHEN v_user IS NULL;
        SELECT count(*) INTO v_held
          FROM workflow_slots AS s
         WHERE (SELECT w.user_id FROM workflows AS w WHERE w.id = s.workflow) = v_user;
        IF v_held >= p_user_max THEN
            SELECT count(*) INTO v_taken FROM workflow_slots;
            IF v_taken + p_reserved >= p_max THEN
                RAISE EXCEPTION 'user % holds their share, and the free child slots are kept for others',
                      v_user USING ERRCODE = 'RS001';
            END IF;
        END IF;
    END LOOP;
    PERFORM reins_claim_fair_slot(p_workflow, p_step, p_attempt, p_max, p_user_max);
END
$$;

CREATE OR REPLACE FUNCTION reins_claim_run_slot(p_run TEXT, p_owner TEXT, p_max BIGINT,
                                                p_user_max BIGINT, p_reserved BIGINT)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    v_workflow TEXT;
    v_step TEXT;
    v_attempt INTEGER;
BEGIN
    SELECT r.workflow, r.step_id, r.attempt INTO v_workflow, v_step, v_attempt
      FROM runs AS r JOIN workflows AS w ON w.id = r.workflow
     WHERE r.run_id = p_run AND r.owner_worker_id = p_owner AND r.status = 'running'
       AND r.cancel_action IS NULL AND r.step_id IS NOT NULL
       AND w.status IN ('running', 'paused', 'waiting_approval')
       FOR UPDATE OF r;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM reins_claim_fair_slot(v_workflow, v_step, v_attempt, p_max, p_user_max, p_reserved);
    RETURN true;
END
$$;
