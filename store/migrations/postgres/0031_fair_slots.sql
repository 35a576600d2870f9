-- A share of the cluster's child slots that binds only while another user waits, and runs that
-- wait for a person holding no slot (issue 29 item 7).
--
-- 1. `reins_claim_fair_slot(workflow, step, attempt, max, user_max)` is what this build's
--    admissions call. A step whose workflow's owner holds `p_user_max` slots or more is refused
--    (RS001, as for a full cluster) only while another user waits for a slot below their own
--    share: a step of that user's is `queued` in a live workflow (running, paused or
--    waiting_approval) whose lease holds (a dead owner's workflow asks for nothing until it is
--    taken over), and that user holds fewer than `p_user_max` slots. With nobody else waiting,
--    one user may hold every slot, so a share costs a user alone nothing. A waiting user at or
--    over the share does not bind anybody: two users both over it, each waiting for the other,
--    would otherwise leave free slots unclaimed. The slot is claimed first (a full cluster
--    refuses at once); then, only while some step is queued (the partial index
--    `workflow_steps_queued`; seldom in a cluster that is not full) and another user waits, the
--    owner's count, under the per-user advisory lock of migration 29, so two claims of one user
--    never both see room for one more while another user waits (the refusal rolls the claimed
--    slot back with the transaction). A user alone never takes that lock. The five-argument
--    `reins_claim_slot` of migration 29 stays as it was: a node of the build before calls it
--    during a rolling upgrade (its share then binds always).
--
-- 2. `reins_claim_run_slot(run, owner, max, user_max)`: the slot an answered run needs again
--    before its live agent goes on (a run waiting for a person gives its slot back in the write
--    that records the wait). Claimed under the same rules, for the run's step, only while
--    `p_owner` owns the run, it is `running` without a cancel request (a workflow's end asks
--    every live run to stop, so a late claim cannot outlive it) and its workflow is running,
--    paused or waiting_approval. The run's row is locked first, so such an end waits for the
--    claim, and then gives back the slot with every other. `false`: no such run; RS001: no slot.
--
-- 3. Runs already waiting for a person give their slots back.

CREATE OR REPLACE FUNCTION reins_claim_fair_slot(p_workflow TEXT, p_step TEXT, p_attempt INTEGER,
                                                 p_max BIGINT, p_user_max BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_kept BOOLEAN := false;
    v_user TEXT;
    v_held BIGINT;
BEGIN
    IF p_user_max < p_max THEN
        -- A new attempt of a step keeps the slot the step holds, whatever the share.
        v_kept := EXISTS (SELECT 1 FROM workflow_slots
                           WHERE workflow = p_workflow AND step_id = p_step);
    END IF;
    -- The slot first: a full cluster refuses here, before anything of the share is asked (of
    -- the claims a freed slot wakes, all but one usually find it taken).
    PERFORM reins_claim_slot(p_workflow, p_step, p_attempt, p_max);
    IF p_user_max >= p_max OR v_kept
       OR NOT EXISTS (SELECT 1 FROM workflow_steps WHERE status = 'queued') THEN
        RETURN;
    END IF;
    SELECT user_id INTO v_user FROM workflows WHERE id = p_workflow;
    -- Every look below starts from a small table (the queued steps, by their partial index, or
    -- the slots held) and reaches a workflow or a lease by its key in a scalar subquery, which
    -- the planner cannot turn around into a scan of every workflow a user ever ran. (`OFFSET 0`
    -- keeps each queued step's user looked up once; the owner's own steps stop at the first,
    -- cheapest test.)
    IF v_user IS NULL OR NOT EXISTS (
        SELECT 1
          FROM (SELECT q.workflow,
                       (SELECT w.user_id FROM workflows AS w
                         WHERE w.id = q.workflow
                           AND w.status IN ('running', 'paused', 'waiting_approval')) AS user_id
                  FROM workflow_steps AS q
                 WHERE q.status = 'queued'
                OFFSET 0) AS waiting
         WHERE waiting.user_id <> v_user
           AND (SELECT l.expires_at FROM extension_execution_leases AS l
                 WHERE l.resource_id = waiting.workflow) > reins_now()
           AND waiting.user_id NOT IN (
               SELECT held.user_id
                 FROM (SELECT (SELECT o.user_id FROM workflows AS o
                                WHERE o.id = h.workflow) AS user_id
                         FROM workflow_slots AS h) AS held
                WHERE held.user_id IS NOT NULL
                GROUP BY held.user_id
               HAVING count(*) >= p_user_max)) THEN
        RETURN;
    END IF;
    -- Another user waits: the owner's count, the slot just claimed included, is taken after
    -- the commit of any earlier claim of theirs that held this lock.
    PERFORM pg_advisory_xact_lock(1970496882, hashtext(v_user));
    SELECT count(*) INTO v_held
      FROM workflow_slots AS s
     WHERE (SELECT w.user_id FROM workflows AS w WHERE w.id = s.workflow) = v_user;
    IF v_held > p_user_max THEN
        RAISE EXCEPTION 'user % holds their share of the child slots while another waits',
              v_user USING ERRCODE = 'RS001';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION reins_claim_run_slot(p_run TEXT, p_owner TEXT, p_max BIGINT,
                                                p_user_max BIGINT)
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
    PERFORM reins_claim_fair_slot(v_workflow, v_step, v_attempt, p_max, p_user_max);
    RETURN true;
END
$$;

DELETE FROM workflow_slots AS s USING runs AS r
 WHERE r.status = 'waiting_for_input'
   AND s.workflow = r.workflow AND s.step_id = r.step_id AND s.attempt = r.attempt;
