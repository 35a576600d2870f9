-- Child slots are numbered 0 .. max_active_children - 1, and a claim takes a free number under
-- its own advisory lock (two-key form: "slot" in ASCII, then the number) instead of counting the
-- taken slots under one cluster-wide lock. Before, every admission in the cluster waited for the
-- one before it to commit; now two claims wait on each other only when they reach for the same
-- number at once, and one of them moves on to the next.
--
-- Safety does not rest on the locks: the unique index on slot_no lets each number be held once,
-- and only numbers below the claimer's max are taken, so at most max slots are ever held. The
-- locks keep two claimers from reaching for the same number.
ALTER TABLE workflow_slots ADD COLUMN slot_no INTEGER;
UPDATE workflow_slots AS w
   SET slot_no = numbered.n
  FROM (SELECT workflow, step_id,
               (row_number() OVER (ORDER BY created_at, workflow, step_id) - 1)::INTEGER AS n
          FROM workflow_slots) AS numbered
 WHERE w.workflow = numbered.workflow AND w.step_id = numbered.step_id;
ALTER TABLE workflow_slots ALTER COLUMN slot_no SET NOT NULL;
CREATE UNIQUE INDEX workflow_slots_slot_no ON workflow_slots (slot_no);

CREATE OR REPLACE FUNCTION reins_claim_slot(p_workflow TEXT, p_step TEXT, p_attempt INTEGER,
                                            p_max BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_held BIGINT;
    v_window BIGINT;
    v_start BIGINT;
    v_n INTEGER;
BEGIN
    -- A new attempt of a step keeps the slot the step holds.
    UPDATE workflow_slots SET attempt = p_attempt
     WHERE workflow = p_workflow AND step_id = p_step;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Numbers are INTEGERs; a max beyond them bounds nothing more.
    p_max := LEAST(p_max, 2147483647);
    SELECT count(*) INTO v_held FROM workflow_slots;
    -- Slots numbered at or over this max were taken under a larger one (the max was lowered, or
    -- nodes disagree): then numbers alone do not bound the count, so count, as before, under the
    -- cluster-wide lock of migration 6.
    IF EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no >= p_max) THEN
        PERFORM pg_advisory_xact_lock(495740482675);
        SELECT count(*) INTO v_held FROM workflow_slots;
    END IF;
    IF v_held >= p_max THEN
        RAISE EXCEPTION 'every child slot is taken' USING ERRCODE = 'RS001';
    END IF;
    -- The lowest free number is at most the count held, so the search starts at a random place
    -- in that count plus 64 (the claims in flight), then, if every number there is taken or
    -- being taken, in all of p_max. A number is checked free again once its lock is taken, by a
    -- statement whose snapshot comes after any earlier holder's commit.
    FOREACH v_window IN ARRAY ARRAY[LEAST(p_max, v_held + 64), p_max] LOOP
        v_start := floor(random() * v_window);
        FOR v_i IN 0 .. v_window - 1 LOOP
            v_n := ((v_start + v_i) % v_window)::INTEGER;
            CONTINUE WHEN EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no = v_n);
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(1936486260, v_n);
            CONTINUE WHEN EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no = v_n);
            -- The unique index is the last word should a number still be taken.
            INSERT INTO workflow_slots (workflow, step_id, attempt, created_at, slot_no)
            VALUES (p_workflow, p_step, p_attempt, reins_now(), v_n)
            ON CONFLICT (slot_no) DO NOTHING;
            IF FOUND THEN
                RETURN;
            END IF;
        END LOOP;
        EXIT WHEN v_window >= p_max;
    END LOOP;
    RAISE EXCEPTION 'every child slot is taken' USING ERRCODE = 'RS001';
END
$$;
