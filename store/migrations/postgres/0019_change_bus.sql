-- The change bus (store/src/changes.rs): triggers send a NOTIFY on channel reins_changes inside
-- the transaction that makes the change, so a listener hears it only if that transaction
-- committed. A payload is "KIND:ID", ids only, never data. A notifying commit holds a
-- cluster-wide lock until it is flushed, so only what someone may wait for notifies, never an
-- ordinary step write: a control, a status change, a child run entering or leaving
-- waiting_for_input, a slot freed while a step is queued, a live workflow's lease released and
-- a node's clean stop.

-- Steps waiting for a slot; the slot trigger asks whether there is any.
CREATE INDEX IF NOT EXISTS workflow_steps_queued ON workflow_steps (workflow)
    WHERE status = 'queued';

CREATE OR REPLACE FUNCTION reins_notify_control() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('reins_changes', 'c:' || NEW.workflow);
    RETURN NULL;
END $$;
CREATE TRIGGER workflow_controls_notify AFTER INSERT ON workflow_controls
    FOR EACH ROW EXECUTE FUNCTION reins_notify_control();

CREATE OR REPLACE FUNCTION reins_notify_status() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('reins_changes', 'w:' || NEW.id);
    RETURN NULL;
END $$;
CREATE TRIGGER workflows_notify_status AFTER UPDATE OF status ON workflows
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION reins_notify_status();

CREATE OR REPLACE FUNCTION reins_notify_input() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('reins_changes', 'r:' || NEW.workflow);
    RETURN NULL;
END $$;
CREATE TRIGGER runs_notify_input AFTER UPDATE OF status ON runs
    FOR EACH ROW WHEN (NEW.workflow IS NOT NULL
        AND (OLD.status = 'waiting_for_input') IS DISTINCT FROM (NEW.status = 'waiting_for_input'))
    EXECUTE FUNCTION reins_notify_input();

CREATE OR REPLACE FUNCTION reins_notify_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM workflow_steps WHERE status = 'queued') THEN
        PERFORM pg_notify('reins_changes', 's:');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER workflow_slots_notify AFTER DELETE ON workflow_slots
    FOR EACH STATEMENT EXECUTE FUNCTION reins_notify_slot();

CREATE OR REPLACE FUNCTION reins_notify_released() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM workflows WHERE id = NEW.resource_id
                  AND status IN ('running', 'paused', 'waiting_approval', 'cancelling')) THEN
        PERFORM pg_notify('reins_changes', 'n:');
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER leases_notify_released AFTER UPDATE OF expires_at ON extension_execution_leases
    FOR EACH ROW WHEN (NEW.expires_at < OLD.expires_at)
    EXECUTE FUNCTION reins_notify_released();

CREATE OR REPLACE FUNCTION reins_notify_stopped() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('reins_changes', 'n:');
    RETURN NULL;
END $$;
CREATE TRIGGER nodes_notify_stopped AFTER UPDATE OF stopped_at ON nodes
    FOR EACH ROW WHEN (NEW.stopped_at IS NOT NULL AND OLD.stopped_at IS NULL)
    EXECUTE FUNCTION reins_notify_stopped();
