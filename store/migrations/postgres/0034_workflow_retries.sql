-- A failed workflow run again from its failed step (`reins retry`, issue 31 item 6) is a new
-- workflow that adopts the old one's journal up to that step; the old one stays `failed`. This
-- table links the two: one row per retry, naming the workflow it retries. A workflow is retried
-- at most once while its retry exists (the primary key): asking again answers that retry. The
-- retry's own document records `retry_of` too, which outlives the row when the old workflow is
-- deleted; this row is the index `get` reads `retried_by` through, and goes with either workflow
-- (the foreign keys cascade: written once per retry, never by a step, unlike the fenced rows of
-- migration 23).
CREATE TABLE workflow_retries (
    retry_of    TEXT PRIMARY KEY REFERENCES workflows (id) ON DELETE CASCADE,
    workflow    TEXT NOT NULL UNIQUE REFERENCES workflows (id) ON DELETE CASCADE
);
