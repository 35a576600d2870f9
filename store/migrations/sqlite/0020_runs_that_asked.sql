-- A workflow's record shows the child runs that asked a person (waiting, or carrying the answer);
-- without an index that read scanned every run ever made, on every `get`. Only runs that asked
-- are indexed, so the index stays as small as the questions. The predicate is the query's own.
CREATE INDEX IF NOT EXISTS runs_asked_by_workflow ON runs (workflow, created_at)
    WHERE status = 'waiting_for_input' OR json_extract(metadata, '$.hitl_answer') IS NOT NULL;
