-- A live workflow holds a number below max_workflows (live_no) and one below its owner's
-- max_workflows_per_owner (owner_no), each held once by a unique index, so that a launch takes
-- free numbers under their own advisory locks instead of counting under one cluster-wide lock
-- held through its commit (which let one launch commit per WAL flush, cluster-wide).
--
-- Safety does not rest on the locks: the unique indexes hold each number once, and only
-- numbers below the launcher's max are taken, so at most max live workflows hold numbers. The
-- locks only keep two launchers from reaching for the same number: a number is checked free
-- again after its lock is taken, by a statement whose snapshot comes after any holder's commit.
ALTER TABLE workflows ADD COLUMN live_no INTEGER, ADD COLUMN owner_no INTEGER;
UPDATE workflows AS w
   SET live_no = numbered.live_no, owner_no = numbered.owner_no
  FROM (SELECT id,
               (row_number() OVER (ORDER BY created_at, id) - 1)::INTEGER AS live_no,
               (row_number() OVER (PARTITION BY user_id ORDER BY created_at, id) - 1)::INTEGER
                   AS owner_no
          FROM workflows
         WHERE status IN ('running', 'paused', 'waiting_approval', 'cancelling',
                          'needs_reconciliation')) AS numbered
 WHERE w.id = numbered.id;
-- Partial: they hold the live workflows only, so counting a user's numbers never walks the
-- user's finished workflows.
CREATE UNIQUE INDEX workflows_live_no ON workflows (live_no) WHERE live_no IS NOT NULL;
CREATE UNIQUE INDEX workflows_owner_no ON workflows (user_id, owner_no) WHERE owner_no IS NOT NULL;

-- Every way a workflow leaves the live statuses (store::LIVE_STATUSES) gives its numbers back;
-- terminal statuses are final, so a number is never needed again.
CREATE FUNCTION reins_free_numbers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.live_no := NULL;
    NEW.owner_no := NULL;
    RETURN NEW;
END
$$;
CREATE TRIGGER workflows_free_numbers BEFORE UPDATE OF status ON workflows
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('running', 'paused', 'waiting_approval', 'cancelling',
                             'needs_reconciliation'))
    EXECUTE FUNCTION reins_free_numbers();

-- A free number below p_max: the cluster's (p_user NULL) or p_user's. The lowest free number is
-- at most the count held, so the search starts at a random place in that count plus 64 (the
-- launches in flight), then, if every number there is taken or being taken, in all of p_max.
CREATE FUNCTION reins_take_number(p_user TEXT, p_max BIGINT) RETURNS INTEGER
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

CREATE FUNCTION reins_number_held(p_user TEXT, p_n INTEGER) RETURNS BOOLEAN
LANGUAGE plpgsql AS $$
BEGIN
    IF p_user IS NULL THEN
        RETURN EXISTS (SELECT 1 FROM workflows WHERE live_no = p_n);
    END IF;
    RETURN EXISTS (SELECT 1 FROM workflows WHERE user_id = p_user AND owner_no = p_n);
END
$$;

-- The rules a launch is admitted under, now answering with the numbers the new row holds: RW003
-- when the user's request_id launched a workflow before (a racing twin is caught by the unique
-- index on (user_id, request_id)), RW001 with no number free below max_workflows, RW002 below the
-- user's max_workflows_per_owner. Numbers at or over a max (it was lowered, or nodes disagree)
-- do not bound the count: then the counts are taken under the launch lock, as before.
DROP FUNCTION reins_launch_guard(TEXT, TEXT, TEXT[], BIGINT, BIGINT);
CREATE FUNCTION reins_launch_guard(p_user TEXT, p_request_id TEXT, p_live TEXT[],
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
    IF EXISTS (SELECT 1 FROM workflows w WHERE w.live_no >= p_max_total)
       OR EXISTS (SELECT 1 FROM workflows w WHERE w.user_id = p_user AND w.owner_no >= p_max_mine)
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
