-- A quota on the bytes each user's workflows store (`limits.user_stored_bytes_max`, issue 29 item
-- 9). The same tables as PostgreSQL's migration 30 (see there): a user's `stored_bytes` is the
-- sum of their workflows' grants, and a workflow's artifacts fit in its grant. The writer's
-- `TakeStorage` and `ReturnStorage` (`sqlite/mod.rs`) and `delete_workflow` keep them; the one
-- writer orders grants.
CREATE TABLE user_storage (
    user_id       TEXT PRIMARY KEY,
    stored_bytes  INTEGER NOT NULL CHECK (stored_bytes >= 0)
) WITHOUT ROWID;

CREATE TABLE workflow_storage (
    workflow       TEXT PRIMARY KEY,
    granted_bytes  INTEGER NOT NULL CHECK (granted_bytes >= 0)
) WITHOUT ROWID;

-- What is stored already: each workflow's grant is its artifacts' bytes.
INSERT INTO workflow_storage (workflow, granted_bytes)
SELECT a.workflow, sum(a.bytes) FROM workflow_artifacts a JOIN workflows w ON w.id = a.workflow
 GROUP BY a.workflow;
INSERT INTO user_storage (user_id, stored_bytes)
SELECT w.user_id, sum(s.granted_bytes) FROM workflow_storage s JOIN workflows w ON w.id = s.workflow
 GROUP BY w.user_id;
