-- A quota on the bytes each user's workflows store (`limits.user_stored_bytes_max`, issue 29 item
-- 9): 2,000 captures of a 45 KB file added 88 MB in 10 s, and nothing bounded a user's total.
--
-- What counts is artifact bytes: captured files and agent outputs. A workflow stores its
-- artifacts inside a grant of its own (`workflow_storage.granted_bytes`), and a user's
-- `user_storage.stored_bytes` is the sum of their workflows' grants. Growing a grant is the one
-- write that checks the quota (`reins_take_storage`, refused with RQ001): it updates the user's
-- row, so two grants of one user on any nodes wait for each other and the second sees the first,
-- while an artifact inside its workflow's grant shares no lock with the user's other workflows.
-- A workflow's end gives back what its grant holds beyond its artifacts
-- (`reins_return_storage`), and its deletion the whole grant (`delete_workflow`). Neither table
-- has a foreign key: the rows live and die with their workflow's, as migration 23's do.
CREATE TABLE user_storage (
    user_id       TEXT PRIMARY KEY,
    stored_bytes  BIGINT NOT NULL CHECK (stored_bytes >= 0)
);

CREATE TABLE workflow_storage (
    workflow       TEXT PRIMARY KEY,
    granted_bytes  BIGINT NOT NULL CHECK (granted_bytes >= 0)
);

-- What is stored already: each workflow's grant is its artifacts' bytes.
INSERT INTO workflow_storage (workflow, granted_bytes)
SELECT a.workflow, sum(a.bytes) FROM workflow_artifacts a JOIN workflows w ON w.id = a.workflow
 GROUP BY a.workflow;
INSERT INTO user_storage (user_id, stored_bytes)
SELECT w.user_id, sum(s.granted_bytes) FROM workflow_storage s JOIN workflows w ON w.id = s.workflow
 GROUP BY w.user_id;

-- Grows `p_workflow`'s grant by `p_bytes`, taken from its owner's quota `p_max` (0: none). Over
-- the quota it raises RQ001 with the owner's stored bytes and the quota as the detail
-- ("STORED MAX"), and nothing is taken.
CREATE FUNCTION reins_take_storage(p_workflow TEXT, p_bytes BIGINT, p_max BIGINT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_user TEXT;
    v_stored BIGINT;
BEGIN
    SELECT user_id INTO v_user FROM workflows WHERE id = p_workflow;
    IF v_user IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'RN001', MESSAGE = 'workflow ' || p_workflow;
    END IF;
    INSERT INTO user_storage (user_id, stored_bytes) VALUES (v_user, 0)
        ON CONFLICT (user_id) DO NOTHING;
    -- The row lock orders grants of one user; a grant that waited is checked against the row
    -- its predecessor committed.
    UPDATE user_storage SET stored_bytes = stored_bytes + p_bytes
     WHERE user_id = v_user AND (p_max = 0 OR stored_bytes + p_bytes <= p_max)
    RETURNING stored_bytes INTO v_stored;
    IF NOT FOUND THEN
        SELECT stored_bytes INTO v_stored FROM user_storage WHERE user_id = v_user;
        RAISE EXCEPTION 'user % stores % bytes: % more would pass the quota of %',
                        v_user, v_stored, p_bytes, p_max
              USING ERRCODE = 'RQ001', DETAIL = v_stored || ' ' || p_max;
    END IF;
    INSERT INTO workflow_storage AS s (workflow, granted_bytes) VALUES (p_workflow, p_bytes)
        ON CONFLICT (workflow) DO UPDATE SET granted_bytes = s.granted_bytes + p_bytes;
END
$$;

-- Gives back to `p_workflow`'s owner what its grant holds beyond its artifacts' bytes.
CREATE FUNCTION reins_return_storage(p_workflow TEXT)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_spare BIGINT;
BEGIN
    SELECT s.granted_bytes - coalesce((SELECT sum(a.bytes) FROM workflow_artifacts a
                                        WHERE a.workflow = p_workflow), 0)
      INTO v_spare FROM workflow_storage s WHERE s.workflow = p_workflow;
    IF v_spare > 0 THEN
        UPDATE workflow_storage SET granted_bytes = granted_bytes - v_spare
         WHERE workflow = p_workflow;
        UPDATE user_storage SET stored_bytes = stored_bytes - v_spare
         WHERE user_id = (SELECT user_id FROM workflows WHERE id = p_workflow);
    END IF;
END
$$;
