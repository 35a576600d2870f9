-- A failed workflow run again from its failed step (`reins retry`): the same table as
-- PostgreSQL's migration 34 (see there). One row per retry, naming the workflow it retries; a
-- workflow is retried at most once while its retry exists; the row goes with either workflow.
CREATE TABLE workflow_retries (
    retry_of    TEXT PRIMARY KEY REFERENCES workflows (id) ON DELETE CASCADE,
    workflow    TEXT NOT NULL UNIQUE REFERENCES workflows (id) ON DELETE CASCADE
) WITHOUT ROWID;
