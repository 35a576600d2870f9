-- The write that ends a workflow asks every live child run of it to stop (WriteOp::CancelRuns),
-- so that no child outlives its workflow's end and no slot leaks. Only live runs are indexed:
-- the index stays as small as the number of runs in flight.
CREATE INDEX IF NOT EXISTS runs_live_by_workflow ON runs (workflow)
    WHERE status IN ('pending', 'running', 'waiting_for_input');
