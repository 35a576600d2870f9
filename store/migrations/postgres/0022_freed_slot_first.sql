-- A step's admission carries the release of the slot of the workflow's step before, and claims
-- after it (store/src/postgres/runs.rs). With as many workflows in flight as slots, that freed
-- number was then about the only free one, and the claim found it by probing: four random
-- numbers, a count of the table, then number after number from a random start (some twenty
-- statements). The release now leaves the number it freed in a transaction-local setting
-- (`reins.freed_slot`), and the claim tries it first, with the same checks as any other number:
-- below the max, free, its lock taken, free again, and the unique index last.
CREATE OR REPLACE FUNCTION reins_claim_slot(p_workflow TEXT, p_step TEXT, p_attempt INTEGER,
                                            p_max BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_held BIGINT;
    v_window BIGINT;
    v_start BIGINT;
    v_n INTEGER;
    v_freed TEXT;
BEGIN
    -- A new attempt of a step keeps the slot the step holds.
    UPDATE workflow_slots SET attempt = p_attempt
     WHERE workflow = p_workflow AND step_id = p_step;
    IF FOUND THEN
        RETURN;
    END IF;
    -- Numbers are INTEGERs; a max beyond them bounds nothing more.
    p_max := LEAST(p_max, 2147483647);
    IF p_max < 1 THEN
        RAISE EXCEPTION 'every child slot is taken' USING ERRCODE = 'RS001';
    END IF;
    -- Slots numbered at or over this max were taken under a larger one (the max was lowered, or
    -- nodes disagree): then numbers alone do not bound the count, so count, as before, under the
    -- cluster-wide lock of migration 6.
    IF (SELECT coalesce(max(slot_no), -1) FROM workflow_slots) >= p_max THEN
        PERFORM pg_advisory_xact_lock(495740482675);
        SELECT count(*) INTO v_held FROM workflow_slots;
        IF v_held >= p_max THEN
            RAISE EXCEPTION 'every child slot is taken' USING ERRCODE = 'RS001';
        END IF;
    ELSE
        -- The number this transaction freed, if any, then a few random numbers over the whole
        -- range. A number is checked free again once its lock is taken, by a statement whose
        -- snapshot comes after any earlier holder's commit.
        v_freed := current_setting('reins.freed_slot', true);
        FOR v_i IN 0 .. 4 LOOP
            IF v_i = 0 THEN
                CONTINUE WHEN coalesce(v_freed, '') = '';
                CONTINUE WHEN v_freed::BIGINT >= p_max;
                v_n := v_freed::INTEGER;
            ELSE
                v_n := floor(random() * p_max)::INTEGER;
            END IF;
            CONTINUE WHEN EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no = v_n);
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(1936486260, v_n);
            CONTINUE WHEN EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no = v_n);
            INSERT INTO workflow_slots (workflow, step_id, attempt, created_at, slot_no)
            VALUES (p_workflow, p_step, p_attempt, reins_now(), v_n)
            ON CONFLICT (slot_no) DO NOTHING;
            IF FOUND THEN
                RETURN;
            END IF;
        END LOOP;
        SELECT count(*) INTO v_held FROM workflow_slots;
        IF v_held >= p_max THEN
            RAISE EXCEPTION 'every child slot is taken' USING ERRCODE = 'RS001';
        END IF;
    END IF;
    -- Crowded: the lowest free number is at most the count held, so the search starts at a
    -- random place in that count plus 64 (the claims in flight), then, if every number there is
    -- taken or being taken, in all of p_max.
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
