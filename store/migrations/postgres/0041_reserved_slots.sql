-- Slots kept free for other users (`limits.active_children_reserved`, issue 39 item 5): the
-- share of migration 31 decides who gets a freed slot, but a user who took every slot while
-- alone kept them for as long as their agents ran, and another user's first step waited for one
-- of those agents to end.
--
-- 1. `reins_claim_fair_slot(workflow, step, attempt, max, user_max, reserved)` is what this
--    build's admissions call. It claims under the rules of the five-argument function of
--    migration 31, then refuses (RS001, as for a full cluster) a new slot to a step whose
--    workflow's owner held `p_user_max` slots already when it would leave fewer than
--    `p_reserved` slots free, whether or not anybody waits: a user below their share, such as
--    another user's first step, finds a slot at once. The count is exact under concurrency:
--    every claim of a new slot that the reserve could refuse takes a cluster-wide
--    transaction-level advisory lock ("keep" in ASCII) before it counts the owner's slots and
--    all of them, so it sees every earlier such claim committed, and two claims cannot both take
--    the last slot above the reserve. That lock is taken only while the reserve and the share
--    are on (`p_reserved > 0`, `p_user_max < p_max`) and only for a new slot (a new attempt of a
--    step keeps the slot it holds): such claims then commit one after another, the price of an
--    exact count. Every claim takes its locks in one order: slot numbers (try-locks only), the
--    cluster-wide lock of migration 6 (rare), the per-user lock of migration 29 (while another
--    user waits), then "keep", so two claims alone never wait on each other in a cycle. The five-argument
--    function stays as it was: a node of the build before calls it during a rolling upgrade
--    (its claims then keep no slots for others).
--
-- 2. `reins_claim_run_slot(run, owner, max, user_max, reserved)`: migration 31's claim of the
--    slot an answered run needs again, under the same rules with the reserve.

CREATE OR REPLACE FUNCTION reins_claim_fair_slot(p_workflow TEXT, p_step TEXT, p_attempt INTEGER,
                                                 p_max BIGINT, p_user_max BIGINT,
                                                 p_reserved BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_kept BOOLEAN := true;
    v_user TEXT;
    v_held BIGINT;
    v_taken BIGINT;
BEGIN
    IF p_reserved > 0 AND p_user_max < p_max THEN
        v_kept := EXISTS (SELECT 1 FROM workflow_slots
                           WHERE workflow = p_workflow AND step_id = p_step);
    END IF;
    -- The slot and the share first, as migration 31 claims them (a full cluster refuses at
    -- once); then, for a new slot, the reserve, counted under the lock, whose statements see
    -- every earlier holder's commit.
    PERFORM reins_claim_fair_slot(p_workflow, p_step, p_attempt, p_max, p_user_max);
    IF v_kept THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(1801807216);
    SELECT user_id INTO v_user FROM workflows WHERE id = p_workflow;
    IF v_user IS NULL THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_held
      FROM workflow_slots AS s
     WHERE (SELECT w.user_id FROM workflows AS w WHERE w.id = s.workflow) = v_user;
    -- Both counts include the slot just claimed: over the share, the owner held it already.
    IF v_held > p_user_max THEN
        SELECT count(*) INTO v_taken FROM workflow_slots;
        IF v_taken + p_reserved > p_max THEN
            RAISE EXCEPTION 'user % holds their share, and the free child slots are kept for others',
                  v_user USING ERRCODE = 'RS001';
        END IF;
    END IF;
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
