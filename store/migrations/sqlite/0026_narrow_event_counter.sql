-- A workflow's event counter moves off its `workflows` row into a narrow table of its own, as
-- PostgreSQL's migration 21 did. Every event (three or four a step) rewrote the workflow's
-- row (its script, its data: some 700 bytes, and the page it sits on) only to count; now it
-- rewrites a row of a few bytes in a table whose pages hold a hundred workflows' counters, so a
-- batch of the single writer touches fewer pages. The triggers are those of migration 18 with
-- the counter read from the new table; the single writer still commits one transaction at a
-- time, so the numbers commit in order.
CREATE TABLE workflow_event_seqs (
    workflow  TEXT PRIMARY KEY REFERENCES workflows (id) ON DELETE CASCADE,
    seq       INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO workflow_event_seqs (workflow, seq) SELECT id, event_seq FROM workflows;

DROP TRIGGER workflows_launch_event;
DROP TRIGGER workflows_status_event;
DROP TRIGGER workflow_steps_inserted_events;
DROP TRIGGER workflow_steps_updated_events;
DROP TRIGGER workflow_controls_event;
DROP TRIGGER workflow_artifacts_event;
DROP TRIGGER runs_approval_event;

CREATE TRIGGER workflows_launch_event AFTER INSERT ON workflows
BEGIN
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1;
    INSERT INTO workflow_event_seqs (workflow, seq) VALUES (NEW.id, 1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    SELECT w.workflow, w.seq, 'status', json_object('status', NEW.status, 'previous', NULL),
           unixepoch('subsec'), f.seq, NEW.user_id
      FROM workflow_event_seqs w, event_feed f WHERE w.workflow = NEW.id AND f.id = 1;
END;

CREATE TRIGGER workflows_status_event AFTER UPDATE OF status ON workflows
WHEN OLD.status <> NEW.status
BEGIN
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1;
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.id;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    SELECT w.workflow, w.seq, 'status', json_object('status', NEW.status, 'previous', OLD.status),
           unixepoch('subsec'), f.seq, NEW.user_id
      FROM workflow_event_seqs w, event_feed f WHERE w.workflow = NEW.id AND f.id = 1;
END;

CREATE TRIGGER workflow_steps_inserted_events AFTER INSERT ON workflow_steps
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, 'step_journaled', json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                       'seq', NEW.seq), unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (1);
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (NEW.status = 'running');
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, CASE NEW.kind WHEN 'pause' THEN 'pause_waiting' WHEN 'humanCheckpoint' THEN 'checkpoint_waiting' ELSE 'step_started' END, CASE NEW.kind WHEN 'humanCheckpoint' THEN
               json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                           'artifact_version', json_extract(NEW.data, '$.args.artifactVersion'))
           ELSE json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind) END, unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (NEW.status = 'running');
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, 'step_finished', json_object(
               'step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
               'status', NEW.status,
               'child_run_id', coalesce(json_extract(NEW.data, '$.run_id'),
                                  json_extract(NEW.data, '$.outcome.value.runId')),
               'duration_ms', CAST(round((NEW.updated_at - NEW.created_at) * 1000) AS INTEGER),
               'output_bytes', (SELECT bytes FROM workflow_artifacts
                                 WHERE workflow = NEW.workflow
                                   AND version = json_extract(NEW.data,
                                                              '$.outcome.value.artifactVersion')),
               'total_tokens', (SELECT total_tokens FROM runs
                                 WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                         json_extract(NEW.data, '$.outcome.value.runId'))),
               'message_count', (SELECT message_count FROM runs
                                  WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                          json_extract(NEW.data, '$.outcome.value.runId')))), unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
END;

CREATE TRIGGER workflow_steps_updated_events AFTER UPDATE OF status ON workflow_steps
WHEN OLD.status <> NEW.status
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (NEW.status = 'running');
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, CASE NEW.kind WHEN 'pause' THEN 'pause_waiting' WHEN 'humanCheckpoint' THEN 'checkpoint_waiting' ELSE 'step_started' END, CASE NEW.kind WHEN 'humanCheckpoint' THEN
               json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                           'artifact_version', json_extract(NEW.data, '$.args.artifactVersion'))
           ELSE json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind) END, unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (NEW.status = 'running');
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, 'step_finished', json_object(
               'step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
               'status', NEW.status,
               'child_run_id', coalesce(json_extract(NEW.data, '$.run_id'),
                                  json_extract(NEW.data, '$.outcome.value.runId')),
               'duration_ms', CAST(round((NEW.updated_at - NEW.created_at) * 1000) AS INTEGER),
               'output_bytes', (SELECT bytes FROM workflow_artifacts
                                 WHERE workflow = NEW.workflow
                                   AND version = json_extract(NEW.data,
                                                              '$.outcome.value.artifactVersion')),
               'total_tokens', (SELECT total_tokens FROM runs
                                 WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                         json_extract(NEW.data, '$.outcome.value.runId'))),
               'message_count', (SELECT message_count FROM runs
                                  WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                          json_extract(NEW.data, '$.outcome.value.runId')))), unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
END;

CREATE TRIGGER workflow_controls_event AFTER INSERT ON workflow_controls
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, CASE NEW.kind WHEN 'decide' THEN 'checkpoint_decided' WHEN 'resume' THEN 'pause_resumed' ELSE 'cancel_requested' END, CASE NEW.kind
               WHEN 'decide' THEN
                   json_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                               'decision', json_extract(NEW.body, '$.decision'),
                               'artifact_version', json_extract(NEW.body, '$.artifactVersion'),
                               'comment', json_extract(NEW.body, '$.comment'),
                               'by', NEW.created_by)
               WHEN 'resume' THEN
                   json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'by', NEW.created_by)
               ELSE json_object('by', NEW.created_by) END, unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (1);
END;

CREATE TRIGGER workflow_artifacts_event AFTER INSERT ON workflow_artifacts
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, 'artifact', json_object('version', NEW.version, 'bytes', NEW.bytes, 'step_id', NEW.source_step_id,
                       'name', NEW.path), unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (1);
END;

CREATE TRIGGER runs_approval_event AFTER UPDATE OF status, metadata ON runs
WHEN NEW.workflow IS NOT NULL
 AND ((NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input')
      OR (json_extract(NEW.metadata, '$.hitl_answer') IS NOT NULL
          AND json_extract(NEW.metadata, '$.hitl_answer')
              IS NOT json_extract(OLD.metadata, '$.hitl_answer')))
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input');
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, 'approval_requested', json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'child_run_id', NEW.run_id,
                           'request_id', json_extract(NEW.metadata, '$.hitl_approval.request_id')), unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input');
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (json_extract(NEW.metadata, '$.hitl_answer') IS NOT NULL
                     AND json_extract(NEW.metadata, '$.hitl_answer')
                         IS NOT json_extract(OLD.metadata, '$.hitl_answer'));
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, 'approval_answered', json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'child_run_id', NEW.run_id,
                           'request_id', json_extract(NEW.metadata, '$.hitl_answer.request_id'),
                           'decision', json_extract(NEW.metadata, '$.hitl_answer.answer.decision'),
                           'by', json_extract(NEW.metadata, '$.hitl_answer.answer.by')), unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (json_extract(NEW.metadata, '$.hitl_answer') IS NOT NULL
                     AND json_extract(NEW.metadata, '$.hitl_answer')
                         IS NOT json_extract(OLD.metadata, '$.hitl_answer'));
END;

ALTER TABLE workflows DROP COLUMN event_seq;
