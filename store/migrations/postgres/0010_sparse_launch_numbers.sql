-- A launch used to count the live workflows (and the owner's) before it looked for a free number:
-- with 10,000 workflows parked, every launch read 10,000 index entries and their rows. Its test
-- for a lowered max was a range test on a parameter, planned once for any max, which could scan
-- the table. As for slots in migration 9: a few random numbers below the max are tried first,
-- the count runs only when they are all taken, and the lowered-max test reads the highest
-- number from its index. The bound is unchanged: each number is held once by its unique index,
-- numbers are below the launcher's max, and a lowered max still counts under the launch lock.
CREATE OR REPLACE FUNCTION reins_take_number(p_user TEXT, p_max BIGINT) RETURNS INTEGER
LANGUAGE plpgsql AS $$
DECLARE
    v_key INTEGER := CASE WHEN p_user IS NULL THEN 2003792491 ELSE hashtext(p_user) END;
    v_held BIGINT;
    v_window BIGINT;
    v_start BIGINT;
    v_n INTEGER;
BEGIN
    -- Numbers are INTEGERs; a max beyond them bounds nothing more.
    p_max := LEAST(p_max, 2147483647);
    IF p_max < 1 THEN
        RETURN NULL;
    END IF;
    FOR v_i IN 1 .. 4 LOOP
        v_n := floor(random() * p_max)::INTEGER;
        CONTINUE WHEN reins_number_held(p_user, v_n);
        CONTINUE WHEN NOT pg_try_advisory_xact_lock(v_key, v_n);
        CONTINUE WHEN reins_number_held(p_user, v_n);
        RETURN v_n;
    END LOOP;
    -- Crowded: the lowest free number is at most the count held, so the search starts at a
    -- random place in that count plus 64 (the launches in flight), then, if every number there
    -- is taken or being taken, in all of p_max.
    IF p_user IS NULL THEN
        SELECT count(*) INTO v_held FROM workflows WHERE live_no IS NOT NULL;
    ELSE
        SELECT count(*) INTO v_held FROM workflows WHERE user_id = p_user AND owner_no IS NOT NULL;
    END IF;
    IF v_held >= p_max THEN
        RETURN NULL;
    END IF;
    FOREACH v_window IN ARRAY ARRAY[LEAST(p_max, v_held + 64), p_max] LOOP
        v_start := floor(random() * v_window);
        FOR v_i IN 0 .. v_window - 1 LOOP
            v_n := ((v_start + v_i) % v_window)::INTEGER;
            CONTINUE WHEN reins_number_held(p_user, v_n);
            CONTINUE WHEN NOT pg_try_advisory_xact_lock(v_key, v_n);
            CONTINUE WHEN reins_number_held(p_user, v_n);
            RETURN v_n;
        END LOOP;
        EXIT WHEN v_window >= p_max;
    END LOOP;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION reins_launch_guard(p_user TEXT, p_request_id TEXT, p_live TEXT[],
                                              p_max_total BIGINT, p_max_mine BIGINT)
RETURNS TABLE (live_no INTEGER, owner_no INTEGER) LANGUAGE plpgsql AS $$
DECLARE
    v_live INTEGER;
    v_mine INTEGER;
BEGIN
    IF p_request_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM workflows w WHERE w.user_id = p_user AND w.request_id = p_request_id
    ) THEN
        RAISE EXCEPTION 'request_id launched before' USING ERRCODE = 'RW003';
    END IF;
    IF (SELECT coalesce(max(w.live_no), -1) FROM workflows w) >= p_max_total
       OR (SELECT coalesce(max(w.owner_no), -1) FROM workflows w WHERE w.user_id = p_user)
          >= p_max_mine
    THEN
        PERFORM pg_advisory_xact_lock(119165837796200);
        IF (SELECT count(*) FROM workflows w WHERE w.status = ANY(p_live)) >= p_max_total THEN
            RAISE EXCEPTION 'max_workflows' USING ERRCODE = 'RW001';
        END IF;
        IF (SELECT count(*) FROM workflows w
             WHERE w.status = ANY(p_live) AND w.user_id = p_user) >= p_max_mine THEN
            RAISE EXCEPTION 'max_workflows_per_owner' USING ERRCODE = 'RW002';
        END IF;
    END IF;
    v_live := reins_take_number(NULL, p_max_total);
    IF v_live IS NULL THEN
        RAISE EXCEPTION 'max_workflows' USING ERRCODE = 'RW001';
    END IF;
    v_mine := reins_take_number(p_user, p_max_mine);
    IF v_mine IS NULL THEN
        RAISE EXCEPTION 'max_workflows_per_owner' USING ERRCODE = 'RW002';
    END IF;
    RETURN QUERY SELECT v_live, v_mine;
END
$$;
