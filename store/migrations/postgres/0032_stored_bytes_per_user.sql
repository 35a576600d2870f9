-- A quota on the bytes each user's workflows store (`limits.user_stored_bytes_max`, issue 29 item
-- 9): 2,000 captures of a 45 KB file added 88 MB in 10 s, and nothing bounded a user's total.
--
-- What counts is artifact bytes: captured files and agent outputs. A workflow stores its
-- artifacts inside a grant of its own (`workflow_storage.granted_bytes`), and a user's
-- `user_storage.stored_bytes` is the sum of their workflows' grants. Growing a grant is the one
-- write that checks the quota (`reins_take_storage`, refused with RQ001): it updates the user's
-- row, so two grants of one user on any nodes wait for each other and the second sees the first,
-- while an artifact inside its workflow's grant shares no lock with the user's other workflows.
-- A workflow's end gives back what its grant holds beyond its artifacts (`reins_return_storage`)
-- by marking it `returned_bytes` on its own row: every workflow ends, and writing the user's row
-- there would order all of a user's ends across the cluster. The user's row counts the returned
-- bytes off at their next grant (which holds that row anyway), and reads subtract what is still
-- marked, so what a user stores is `stored_bytes` less their workflows' `returned_bytes`. A
-- deletion gives back the whole grant (`delete_workflow`). Neither table has a foreign key: the
-- rows live and die with their workflow's, as migration 23's do.
CREATE TABLE user_storage (
    user_id       TEXT PRIMARY KEY,
    -- The sum of the user's workflows' grants.
    stored_bytes  BIGINT NOT NULL CHECK (stored_bytes >= 0)
);

CREATE TABLE workflow_storage (
    workflow        TEXT PRIMARY KEY,
    user_id         TEXT NOT NULL,
    granted_bytes   BIGINT NOT NULL CHECK (granted_bytes >= 0),
    -- What the workflow's end gave back of its grant, not yet counted off its owner's row.
    returned_bytes  BIGINT NOT NULL DEFAULT 0
                    CHECK (returned_bytes >= 0 AND returned_bytes <= granted_bytes)
);
CREATE INDEX workflow_storage_returned ON workflow_storage (user_id) WHERE returned_bytes > 0;

-- What is stored already: each workflow's grant is its artifacts' bytes.
INSERT INTO workflow_storage (workflow, user_id, granted_bytes)
SELECT a.workflow, w.user_id, sum(a.bytes)
  FROM workflow_artifacts a JOIN workflows w ON w.id = a.workflow
 GROUP BY a.workflow, w.user_id;
INSERT INTO user_storage (user_id, stored_bytes)
SELECT user_id, sum(granted_bytes) FROM workflow_storage GROUP BY user_id;

-- Grows `p_workflow`'s grant by `p_bytes`, taken from its owner's quota `p_max` (0: none), after
-- counting off the owner's row what their ended workflows gave back. Over the quota it raises
-- RQ001 with what the owner stores and the quota as the detail ("STORED MAX"), and nothing of
-- it is written.
CREATE FUNCTION reins_take_storage(p_workflow TEXT, p_bytes BIGINT, p_max BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_user TEXT;
    v_stored BIGINT;
    v_returned BIGINT;
BEGIN
    SELECT user_id INTO v_user FROM workflows WHERE id = p_workflow;
    IF v_user IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'RN001', MESSAGE = 'workflow ' || p_workflow;
    END IF;
    INSERT INTO user_storage (user_id, stored_bytes) VALUES (v_user, 0)
        ON CONFLICT (user_id) DO NOTHING;
    -- The user's row first: its lock orders one user's grants on every node, and a grant that
    -- waited reads the row its predecessor committed.
    SELECT stored_bytes INTO v_stored FROM user_storage WHERE user_id = v_user FOR UPDATE;
    -- What ended workflows gave back, in one statement (one snapshot): the rows it sums are the
    -- rows it clears.
    WITH marked AS (
        SELECT workflow, returned_bytes FROM workflow_storage
         WHERE user_id = v_user AND returned_bytes > 0
           FOR UPDATE
    ), cleared AS (
        UPDATE workflow_storage s
           SET granted_bytes = s.granted_bytes - m.returned_bytes, returned_bytes = 0
          FROM marked m
         WHERE s.workflow = m.workflow
        RETURNING m.returned_bytes
    )
    SELECT coalesce(sum(returned_bytes), 0) INTO v_returned FROM cleared;
    v_stored := v_stored - v_returned;
    IF p_max > 0 AND v_stored + p_bytes > p_max THEN
        RAISE EXCEPTION 'user % stores % bytes: % more would pass the quota of %',
                        v_user, v_stored, p_bytes, p_max
              USING ERRCODE = 'RQ001', DETAIL = v_stored || ' ' || p_max;
    END IF;
    UPDATE user_storage SET stored_bytes = v_stored + p_bytes WHERE user_id = v_user;
    INSERT INTO workflow_storage AS s (workflow, user_id, granted_bytes)
    VALUES (p_workflow, v_user, p_bytes)
        ON CONFLICT (workflow) DO UPDATE SET granted_bytes = s.granted_bytes + p_bytes;
END
$$;

-- Marks what `p_workflow`'s grant holds beyond its artifacts' bytes as given back. Only the
-- workflow's own row is written.
CREATE FUNCTION reins_return_storage(p_workflow TEXT)
RETURNS void LANGUAGE sql AS $$
    UPDATE workflow_storage
       SET returned_bytes = greatest(granted_bytes - coalesce(
               (SELECT sum(a.bytes) FROM workflow_artifacts a WHERE a.workflow = p_workflow), 0), 0)
     WHERE workflow = p_workflow;
$$;
