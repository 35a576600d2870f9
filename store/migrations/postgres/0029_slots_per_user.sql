-- One user's share of the cluster's child slots (`limits.max_active_children_per_user`, issue 29
-- item 7): a `parallel` of one user's agents could hold every slot, and every other user's steps
-- waited `queued`.
--
-- This five-argument `reins_claim_slot` refuses (RS001, as for a full cluster) a slot to a step
-- whose workflow's owner (`workflows.user_id`) already holds `p_user_max` slots with the steps
-- of all their workflows, then claims one under `p_max` with the four-argument function of
-- migration 24, which stays as it was (a node of the build before calls it, and bounds only the
-- cluster). The owner's count and the claim are serialised per user by a transaction-level
-- advisory lock ("user" in ASCII, the hash of the user id), taken after the count of any earlier
-- holder is committed, so two claims of one user cannot both see room for one more. The count
-- joins the held slots (at most `p_max` rows) with their workflows, and is asked only when the
-- share binds (`p_user_max < p_max`); a new attempt of a step keeps the slot it holds, uncounted.
-- A slot this transaction gave back (the step before, carried in the admission) is not counted:
-- its row is deleted already.

CREATE OR REPLACE FUNCTION reins_claim_slot(p_workflow TEXT, p_step TEXT, p_attempt INTEGER,
                                            p_max BIGINT, p_user_max BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_user TEXT;
    v_held BIGINT;
BEGIN
    IF p_user_max < p_max
       AND NOT EXISTS (SELECT 1 FROM workflow_slots
                        WHERE workflow = p_workflow AND step_id = p_step) THEN
        SELECT user_id INTO v_user FROM workflows WHERE id = p_workflow;
        IF v_user IS NOT NULL THEN
            PERFORM pg_advisory_xact_lock(1970496882, hashtext(v_user));
            SELECT count(*) INTO v_held
              FROM workflow_slots AS s JOIN workflows AS w ON w.id = s.workflow
             WHERE w.user_id = v_user;
            IF v_held >= p_user_max THEN
                RAISE EXCEPTION 'every child slot of user % is taken', v_user
                      USING ERRCODE = 'RS001';
            END IF;
        END IF;
    END IF;
    PERFORM reins_claim_slot(p_workflow, p_step, p_attempt, p_max);
END
$$;
