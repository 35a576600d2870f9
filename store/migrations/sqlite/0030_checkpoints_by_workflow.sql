-- A workflow's record pages its steps (issue 29, item 5) but lists its checkpoints whole: the
-- pauses and human checkpoints, which wait for people and stay few. Without an index they cost a
-- visit of every entry of the workflow, on every read of its record. This index holds the
-- checkpoints only, so the single writer updates it for them alone (unlike the index by `seq`
-- that migration 27 dropped); its predicate is the query's own (`checkpoints_on`).
CREATE INDEX IF NOT EXISTS workflow_steps_checkpoints ON workflow_steps (workflow, seq, attempt)
    WHERE kind IN ('pause', 'humanCheckpoint');
