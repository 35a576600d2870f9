-- No query reads runs by (workflow, step_id, attempt): a step finds its run by idempotency key,
-- and a reconcile closes a run by its id. The index cost a write on every run insert.
DROP INDEX IF EXISTS runs_by_step;
