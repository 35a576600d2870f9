//! The change bus on SQLite (see `crate::changes`): the triggers of migration 19's PostgreSQL side
//! as temporary triggers of the writer's connection, which collect payloads in a temporary
//! table (in memory: the writer's `temp_store`). A job's savepoint rolled back takes its
//! payloads with it; the writer drains the rest into its batch just before `COMMIT` and hands
//! them on only once the commit returned. Temporary objects belong to the one connection, so
//! the database file gains no trigger another program would have to know about.

use rusqlite::Connection;

use crate::Result;

/// The table of payloads, created when the writer opens (it needs no schema).
pub(super) const TABLE: &str =
    "CREATE TEMP TABLE IF NOT EXISTS reins_changes (payload TEXT PRIMARY KEY) WITHOUT ROWID;";

/// The triggers, installed once the schema is migrated (they name its tables).
pub(super) const TRIGGERS: &str = "
CREATE TEMP TRIGGER IF NOT EXISTS workflow_controls_notify
    AFTER INSERT ON main.workflow_controls
BEGIN
    INSERT OR IGNORE INTO reins_changes VALUES ('c:' || NEW.workflow);
END;
CREATE TEMP TRIGGER IF NOT EXISTS sent_events_notify
    AFTER INSERT ON main.sent_events
BEGIN
    INSERT OR IGNORE INTO reins_changes VALUES ('c:' || NEW.workflow);
END;
CREATE TEMP TRIGGER IF NOT EXISTS workflows_notify_status
    AFTER UPDATE OF status ON main.workflows WHEN OLD.status IS NOT NEW.status
BEGIN
    INSERT OR IGNORE INTO reins_changes VALUES ('w:' || NEW.id);
END;
CREATE TEMP TRIGGER IF NOT EXISTS runs_notify_input
    AFTER UPDATE OF status ON main.runs
    WHEN NEW.workflow IS NOT NULL
     AND (OLD.status = 'waiting_for_input') IS NOT (NEW.status = 'waiting_for_input')
BEGIN
    INSERT OR IGNORE INTO reins_changes VALUES ('r:' || NEW.workflow);
END;
CREATE TEMP TRIGGER IF NOT EXISTS workflow_slots_notify
    AFTER DELETE ON main.workflow_slots
    WHEN EXISTS (SELECT 1 FROM main.workflow_steps WHERE status = 'queued')
BEGIN
    INSERT OR IGNORE INTO reins_changes VALUES ('s:');
END;
CREATE TEMP TRIGGER IF NOT EXISTS leases_notify_released
    AFTER UPDATE OF expires_at ON main.extension_execution_leases
    WHEN NEW.expires_at < OLD.expires_at AND EXISTS (
        SELECT 1 FROM main.workflows WHERE id = NEW.resource_id
           AND status IN ('running', 'paused', 'waiting_approval', 'cancelling'))
BEGIN
    INSERT OR IGNORE INTO reins_changes VALUES ('n:');
END;
CREATE TEMP TRIGGER IF NOT EXISTS nodes_notify_stopped
    AFTER UPDATE OF stopped_at ON main.nodes
    WHEN NEW.stopped_at IS NOT NULL AND OLD.stopped_at IS NULL
BEGIN
    INSERT OR IGNORE INTO reins_changes VALUES ('n:');
END;
";

/// Takes the payloads the batch's transaction collected (inside it, before its `COMMIT`).
pub(super) fn drain(connection: &Connection) -> Result<Vec<String>> {
    let mut statement =
        connection.prepare_cached("DELETE FROM temp.reins_changes RETURNING payload")?;
    let payloads = statement
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<Vec<String>>>()?;
    Ok(payloads)
}
