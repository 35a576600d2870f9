-- The change bus (store/src/changes.rs). On SQLite its triggers are temporary ones of the
-- writer's connection (store/src/sqlite/changes.rs); the schema only gains the index the slot
-- trigger asks: steps waiting for a slot.
CREATE INDEX IF NOT EXISTS workflow_steps_queued ON workflow_steps (workflow)
    WHERE status = 'queued';
