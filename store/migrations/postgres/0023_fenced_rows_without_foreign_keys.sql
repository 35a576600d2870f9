-- The rows an owner writes under its fence no longer check a foreign key to `workflows`. Every
-- insert into a table that referenced `workflows` ran `SELECT 1 FROM workflows ... FOR KEY SHARE`,
-- which writes a lock into the workflow's row (93 checks and 13 lock records of WAL per 10-step
-- workflow: the journal, the artifacts, the slots and every event). The fence already proves the
-- workflow is there: its lease row is born with the workflow, deleted with it, and held
-- `FOR SHARE` by the writing transaction, so a delete waits for the write and a write after a
-- delete is refused.
--
-- Deleting a workflow deletes these rows itself (store/src/postgres/workflows.rs), in an order
-- that waits for any writer first: the lease row (fenced writers), the event counter (event
-- writers that are not fenced: an approval answered, a control recorded), then the rows.
-- `workflow_controls` keeps its foreign key: any node records a control, without a fence.
ALTER TABLE workflow_steps DROP CONSTRAINT workflow_steps_workflow_fkey;
ALTER TABLE workflow_slots DROP CONSTRAINT workflow_slots_workflow_fkey;
ALTER TABLE workflow_artifacts DROP CONSTRAINT workflow_artifacts_workflow_fkey;
ALTER TABLE workflow_events DROP CONSTRAINT workflow_events_workflow_fkey;
ALTER TABLE workflow_event_seqs DROP CONSTRAINT workflow_event_seqs_workflow_fkey;
