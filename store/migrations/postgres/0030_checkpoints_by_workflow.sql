-- A workflow's record pages its steps (issue 29, item 5) but lists its checkpoints whole: the
-- pauses and human checkpoints, which wait for people and stay few. Found through the journal's
-- index by `(workflow, seq, attempt)`, they cost a visit of every entry of the workflow, on every
-- read of its record (10,000 for a long workflow). This index holds the checkpoints only, so it
-- costs a step write nothing; its predicate is the query's own (`CHECKPOINTS_SQL`).
CREATE INDEX IF NOT EXISTS workflow_steps_checkpoints ON workflow_steps (workflow, seq, attempt)
    WHERE kind IN ('pause', 'humanCheckpoint');
