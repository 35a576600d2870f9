-- The journal's index on `(workflow, seq, attempt)` served one query, a workflow's journal read
-- in order (`steps_on`), which the primary key `(workflow, step_id, attempt)` finds as well,
-- sorted in memory on the reader (the rows of one workflow). The single writer updated it twice
-- a step (the entry journaled, then finished): one page in twenty-four of those it wrote to
-- the write-ahead log.
DROP INDEX workflow_steps_by_seq;
