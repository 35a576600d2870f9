-- Migration 31 of PostgreSQL adds the claim functions of a share that binds only while another
-- user waits; SQLite decides the same in the admission's transaction (`sqlite/runs.rs`). Here,
-- as there, runs already waiting for a person give their slots back.
DELETE FROM workflow_slots
 WHERE EXISTS (SELECT 1 FROM runs AS r
                WHERE r.status = 'waiting_for_input' AND r.workflow = workflow_slots.workflow
                  AND r.step_id = workflow_slots.step_id AND r.attempt = workflow_slots.attempt);
