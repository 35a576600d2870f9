-- Two of a step's statements inside the server made cheaper (each was a statement of some
-- 10 microseconds and more per step, on a server that is CPU-bound at 32 workflows in flight):
--
-- 1. A slot claim that takes the number its own transaction's `ReleaseSlot` freed (migration 22,
--    nearly every admission of a workflow's next step) no longer looks the number up before and
--    after taking its lock: the transaction deleted that row itself, so no other claim can have
--    it before this one commits. The unique index stays the last word.
--
-- 2. An artifact's event is written by its trigger directly, not through `reins_event`: one
--    PL/pgSQL call per artifact instead of two.

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
                -- This transaction deleted the number's row: no other claim can hold it before
                -- this one commits (its insert would wait on the deleted row's unique entry), so
                -- the number needs no look before and after its lock.
                CONTINUE WHEN NOT pg_try_advisory_xact_lock(1936486260, v_n);
            ELSE
                v_n := floor(random() * p_max)::INTEGER;
                CONTINUE WHEN EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no = v_n);
                CONTINUE WHEN NOT pg_try_advisory_xact_lock(1936486260, v_n);
                CONTINUE WHEN EXISTS (SELECT 1 FROM workflow_slots WHERE slot_no = v_n);
            END IF;
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

CREATE OR REPLACE FUNCTION reins_artifact_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n BIGINT;
    v_watched DOUBLE PRECISION;
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow
    RETURNING seq, watched_until INTO n, v_watched;
    IF FOUND THEN
        INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
        VALUES (NEW.workflow, n, 'artifact',
                jsonb_build_object('version', NEW.version, 'bytes', NEW.bytes,
                                   'step_id', NEW.source_step_id, 'name', NEW.path),
                reins_now());
        IF v_watched > reins_now() THEN
            PERFORM pg_notify('reins_changes', 'e:' || NEW.workflow);
        END IF;
    END IF;
    RETURN NULL;
END $$;
