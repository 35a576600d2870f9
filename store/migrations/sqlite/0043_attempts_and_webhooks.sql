-- Attempts tell the truth (issue 40 item 2): a `step_finished` event's `duration_ms` counts from
-- the attempt's run's start (its child run's `created_at`; a step without one, from its
-- journaling), no longer including the backoff before a retry, and `waited_ms` says what came
-- before; see the PostgreSQL migration of the same number. The triggers are migration 33's
-- otherwise.
DROP TRIGGER workflow_steps_inserted_events;
DROP TRIGGER workflow_steps_updated_events;

CREATE TRIGGER workflow_steps_inserted_events AFTER INSERT ON workflow_steps
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.workflow AND (1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT workflow, seq, 'step_journaled', json_patch(json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                       'seq', NEW.seq),
               json_object('retry_due_at_ms', json_extract(NEW.data, '$.retry.due_at_ms'),
                           'retry_reason', json_extract(NEW.data, '$.retry.reason'))), unixepoch('subsec')
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
    SELECT workflow, seq, 'step_finished', json_patch(json_object(
               'step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
               'status', NEW.status,
               'child_run_id', coalesce(json_extract(NEW.data, '$.run_id'),
                                  json_extract(NEW.data, '$.outcome.value.runId')),
               'duration_ms', CAST(round((NEW.updated_at - max(NEW.created_at, coalesce(
                   (SELECT created_at FROM runs WHERE run_id = json_extract(NEW.data, '$.run_id')),
                   NEW.created_at))) * 1000) AS INTEGER),
               'waited_ms', CAST(round((max(NEW.created_at, coalesce(
                   (SELECT created_at FROM runs WHERE run_id = json_extract(NEW.data, '$.run_id')),
                   NEW.created_at)) - NEW.created_at) * 1000) AS INTEGER),
               'output_bytes', (SELECT bytes FROM workflow_artifacts
                                 WHERE workflow = NEW.workflow
                                   AND version = json_extract(NEW.data,
                                                              '$.outcome.value.artifactVersion')),
               'total_tokens', (SELECT total_tokens FROM runs
                                 WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                         json_extract(NEW.data, '$.outcome.value.runId'))),
               'message_count', (SELECT message_count FROM runs
                                  WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                          json_extract(NEW.data, '$.outcome.value.runId')))),
               CASE WHEN NEW.status = 'failed' THEN
                   json_object('error', json_extract(NEW.data, '$.outcome.value.message'),
                               'error_status', json_extract(NEW.data, '$.outcome.value.status'))
               ELSE '{}' END), unixepoch('subsec')
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
    SELECT workflow, seq, 'step_finished', json_patch(json_object(
               'step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
               'status', NEW.status,
               'child_run_id', coalesce(json_extract(NEW.data, '$.run_id'),
                                  json_extract(NEW.data, '$.outcome.value.runId')),
               'duration_ms', CAST(round((NEW.updated_at - max(NEW.created_at, coalesce(
                   (SELECT created_at FROM runs WHERE run_id = json_extract(NEW.data, '$.run_id')),
                   NEW.created_at))) * 1000) AS INTEGER),
               'waited_ms', CAST(round((max(NEW.created_at, coalesce(
                   (SELECT created_at FROM runs WHERE run_id = json_extract(NEW.data, '$.run_id')),
                   NEW.created_at)) - NEW.created_at) * 1000) AS INTEGER),
               'output_bytes', (SELECT bytes FROM workflow_artifacts
                                 WHERE workflow = NEW.workflow
                                   AND version = json_extract(NEW.data,
                                                              '$.outcome.value.artifactVersion')),
               'total_tokens', (SELECT total_tokens FROM runs
                                 WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                         json_extract(NEW.data, '$.outcome.value.runId'))),
               'message_count', (SELECT message_count FROM runs
                                  WHERE run_id = coalesce(json_extract(NEW.data, '$.run_id'),
                                                          json_extract(NEW.data, '$.outcome.value.runId')))),
               CASE WHEN NEW.status = 'failed' THEN
                   json_object('error', json_extract(NEW.data, '$.outcome.value.message'),
                               'error_status', json_extract(NEW.data, '$.outcome.value.status'))
               ELSE '{}' END), unixepoch('subsec')
      FROM workflow_event_seqs WHERE workflow = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
END;
