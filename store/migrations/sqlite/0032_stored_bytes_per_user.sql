-- A quota on the bytes each user's workflows store (`limits.user_stored_bytes_max`, issue 29 item
-- 9). The same tables as PostgreSQL's migration 32 (see there): a user's `stored_bytes` is the
-- sum of their workflows' grants, a workflow's artifacts fit in its grant, and what a workflow's
-- end gave back waits in its `returned_bytes` until the user's next grant counts it off. The
-- writer's `TakeStorage` and `ReturnStorage` (`sqlite/mod.rs`) and `delete_workflow` keep them;
-- the one writer orders grants.
CREATE TABLE user_storage (
    user_id       TEXT PRIMARY KEY,
    stored_bytes  INTEGER NOT NULL CHECK (stored_bytes >= 0)
) WITHOUT ROWID;

CREATE TABLE workflow_storage (
    workflow        TEXT PRIMARY KEY,
    user_id         TEXT NOT NULL,
    granted_bytes   INTEGER NOT NULL CHECK (granted_bytes >= 0),
    returned_bytes  INTEGER NOT NULL DEFAULT 0
                    CHECK (returned_bytes >= 0 AND returned_bytes <= granted_bytes)
) WITHOUT ROWID;
CREATE INDEX workflow_storage_returned ON workflow_storage (user_id) WHERE returned_bytes > 0;

-- What is stored already: each workflow's grant is its artifacts' bytes.
INSERT INTO workflow_storage (workflow, user_id, granted_bytes)
SELECT a.workflow, w.user_id, sum(a.bytes)
  FROM workflow_artifacts a JOIN workflows w ON w.id = a.workflow
 GROUP BY a.workflow, w.user_id;
INSERT INTO user_storage (user_id, stored_bytes)
SELECT user_id, sum(granted_bytes) FROM workflow_storage GROUP BY user_id;
