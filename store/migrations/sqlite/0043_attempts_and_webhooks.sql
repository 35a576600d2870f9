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

-- Webhooks carry what the docs say, from the moment they are configured (issue 40 item 6); see
-- the PostgreSQL migration of the same number. `notify_targets` records when each webhook was
-- first configured, and a claim for it takes no notification committed before; a pause's
-- resume adds its control's `input` to the row's data. The trigger is migration 36's otherwise.
CREATE TABLE notify_targets (
    target  TEXT PRIMARY KEY,
    since   REAL NOT NULL
);
INSERT INTO notify_targets (target, since)
SELECT DISTINCT target, 0 FROM notify_deliveries;

DROP TRIGGER workflow_events_notify;
CREATE TRIGGER workflow_events_notify AFTER INSERT ON workflow_events
WHEN NEW.kind IN ('pause_waiting', 'checkpoint_waiting', 'approval_requested',
                  'checkpoint_decided', 'pause_resumed', 'approval_answered')
BEGIN
    INSERT INTO notify_outbox (id, workflow, seq, kind, event, data, user_id, user_email,
                               user_role, created_at, due_at)
    SELECT NEW.workflow || ':' || NEW.seq, NEW.workflow, NEW.seq,
           CASE WHEN NEW.kind IN ('pause_waiting', 'checkpoint_waiting', 'approval_requested')
                    THEN 'entered'
                WHEN json_extract(NEW.data, '$.by') = 'timeout'
                  OR EXISTS (SELECT 1 FROM workflow_controls c
                              WHERE c.workflow = NEW.workflow AND c.kind IN ('decide', 'resume')
                                AND c.step_id = json_extract(NEW.data, '$.step_id')
                                AND c.attempt = json_extract(NEW.data, '$.attempt')
                                AND json_extract(c.body, '$.by') = 'timeout')
                    THEN 'timed_out'
                ELSE 'decided' END,
           NEW.kind,
           -- `->` gives the input as JSON text (a JSON `null` too, a missing one SQL NULL),
           -- which `json()` hands to `json_set` as JSON; `json_patch` would drop a `null`.
           CASE WHEN (SELECT c.body -> '$.input' FROM workflow_controls c
                 WHERE NEW.kind = 'pause_resumed' AND c.workflow = NEW.workflow
                   AND c.kind = 'resume' AND c.step_id = json_extract(NEW.data, '$.step_id')
                   AND c.attempt = json_extract(NEW.data, '$.attempt')
                 LIMIT 1) IS NULL THEN
               json_patch(NEW.data, json_object(
                   'title', json_extract(w.data, '$.title'),
                   'message', (SELECT json_extract(s.data, '$.args.message') FROM workflow_steps s
                                WHERE s.workflow = NEW.workflow
                                  AND s.step_id = json_extract(NEW.data, '$.step_id')
                                  AND s.attempt = json_extract(NEW.data, '$.attempt'))))
           ELSE json_set(
               json_patch(NEW.data, json_object(
                   'title', json_extract(w.data, '$.title'),
                   'message', (SELECT json_extract(s.data, '$.args.message') FROM workflow_steps s
                                WHERE s.workflow = NEW.workflow
                                  AND s.step_id = json_extract(NEW.data, '$.step_id')
                                  AND s.attempt = json_extract(NEW.data, '$.attempt')))),
               '$.input', json((SELECT c.body -> '$.input' FROM workflow_controls c
                 WHERE NEW.kind = 'pause_resumed' AND c.workflow = NEW.workflow
                   AND c.kind = 'resume' AND c.step_id = json_extract(NEW.data, '$.step_id')
                   AND c.attempt = json_extract(NEW.data, '$.attempt')
                 LIMIT 1)))
           END,
           w.user_id, u.email, u.role, NEW.created_at, NEW.created_at
      FROM workflows w LEFT JOIN users u ON u.id = w.user_id
     WHERE w.id = NEW.workflow;
END;
