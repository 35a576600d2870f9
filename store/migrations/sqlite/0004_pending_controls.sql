-- Controls not yet carried out, found by one query per node (not one per workflow).
CREATE INDEX workflow_controls_pending ON workflow_controls (workflow) WHERE applied_at IS NULL;
CREATE INDEX workflows_by_owner ON workflows (owner);
