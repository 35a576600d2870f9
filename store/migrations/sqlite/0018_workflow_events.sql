-- What happens to a workflow, as events derived from what commits: triggers on the workflow, its
-- journal, its controls, its artifacts and its child runs write them in the transaction of the
-- change itself, so an event exists exactly when its change does. Events go with their workflow
-- (ON DELETE CASCADE). The single writer commits transactions one after another, so numbers
-- taken from `workflows.event_seq` and `event_feed` commit in order. The events and their JSON
-- are those of the PostgreSQL migration of the same number.
ALTER TABLE workflows ADD COLUMN event_seq INTEGER NOT NULL DEFAULT 0;
-- `console.log` lines kept as events, their bytes, and lines dropped over the bounds.
ALTER TABLE workflows ADD COLUMN log_events INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflows ADD COLUMN log_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workflows ADD COLUMN log_dropped INTEGER NOT NULL DEFAULT 0;

CREATE TABLE event_feed (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  INTEGER NOT NULL
);
INSERT INTO event_feed (id, seq) VALUES (1, 0);

CREATE TABLE workflow_events (
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    data        TEXT NOT NULL,
    created_at  REAL NOT NULL,
    feed_seq    INTEGER,
    user_id     TEXT,
    PRIMARY KEY (workflow, seq)
);
CREATE UNIQUE INDEX workflow_events_feed ON workflow_events (feed_seq) WHERE feed_seq IS NOT NULL;
CREATE INDEX workflow_events_feed_by_user ON workflow_events (user_id, feed_seq)
    WHERE feed_seq IS NOT NULL;

-- A launch and a status change: an event of the workflow and of the feed.
CREATE TRIGGER workflows_launch_event AFTER INSERT ON workflows
BEGIN
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1;
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.id;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    SELECT w.id, w.event_seq, 'status', json_object('status', NEW.status, 'previous', NULL),
           unixepoch('subsec'), f.seq, NEW.user_id
      FROM workflows w, event_feed f WHERE w.id = NEW.id AND f.id = 1;
END;

CREATE TRIGGER workflows_status_event AFTER UPDATE OF status ON workflows
WHEN OLD.status <> NEW.status
BEGIN
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1;
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.id;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    SELECT w.id, w.event_seq, 'status', json_object('status', NEW.status, 'previous', OLD.status),
           unixepoch('subsec'), f.seq, NEW.user_id
      FROM workflows w, event_feed f WHERE w.id = NEW.id AND f.id = 1;
END;

-- The journal: journaled; started (a pause or a checkpoint: waiting for a person); finished.
CREATE TRIGGER workflow_steps_inserted_events AFTER INSERT ON workflow_steps
BEGIN
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, 'step_journaled', json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                       'seq', NEW.seq), unixepoch('subsec')
      FROM workflows WHERE id = NEW.workflow AND (1);
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (NEW.status = 'running');
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, CASE NEW.kind WHEN 'pause' THEN 'pause_waiting' WHEN 'humanCheckpoint' THEN 'checkpoint_waiting' ELSE 'step_started' END, CASE NEW.kind WHEN 'humanCheckpoint' THEN
               json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                           'artifact_version', json_extract(NEW.data, '$.args.artifactVersion'))
           ELSE json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind) END, unixepoch('subsec')
      FROM workflows WHERE id = NEW.workflow AND (NEW.status = 'running');
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, 'step_finished', json_object(
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
      FROM workflows WHERE id = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
END;

CREATE TRIGGER workflow_steps_updated_events AFTER UPDATE OF status ON workflow_steps
WHEN OLD.status <> NEW.status
BEGIN
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (NEW.status = 'running');
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, CASE NEW.kind WHEN 'pause' THEN 'pause_waiting' WHEN 'humanCheckpoint' THEN 'checkpoint_waiting' ELSE 'step_started' END, CASE NEW.kind WHEN 'humanCheckpoint' THEN
               json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                           'artifact_version', json_extract(NEW.data, '$.args.artifactVersion'))
           ELSE json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind) END, unixepoch('subsec')
      FROM workflows WHERE id = NEW.workflow AND (NEW.status = 'running');
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, 'step_finished', json_object(
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
      FROM workflows WHERE id = NEW.workflow AND (NEW.status IN ('completed', 'failed', 'cancelled'));
END;

-- Controls, as recorded: a checkpoint decided, a pause resumed, a cancel asked.
CREATE TRIGGER workflow_controls_event AFTER INSERT ON workflow_controls
BEGIN
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, CASE NEW.kind WHEN 'decide' THEN 'checkpoint_decided' WHEN 'resume' THEN 'pause_resumed' ELSE 'cancel_requested' END, CASE NEW.kind
               WHEN 'decide' THEN
                   json_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                               'decision', json_extract(NEW.body, '$.decision'),
                               'artifact_version', json_extract(NEW.body, '$.artifactVersion'),
                               'comment', json_extract(NEW.body, '$.comment'),
                               'by', NEW.created_by)
               WHEN 'resume' THEN
                   json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'by', NEW.created_by)
               ELSE json_object('by', NEW.created_by) END, unixepoch('subsec')
      FROM workflows WHERE id = NEW.workflow AND (1);
END;

-- An artifact version stored: a captured file (with its name) or an agent's output.
CREATE TRIGGER workflow_artifacts_event AFTER INSERT ON workflow_artifacts
BEGIN
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (1);
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, 'artifact', json_object('version', NEW.version, 'bytes', NEW.bytes, 'step_id', NEW.source_step_id,
                       'name', NEW.path), unixepoch('subsec')
      FROM workflows WHERE id = NEW.workflow AND (1);
END;

-- A workflow step's agent asking a person for approval, and the answer.
CREATE TRIGGER runs_approval_event AFTER UPDATE OF status, metadata ON runs
WHEN NEW.workflow IS NOT NULL
 AND ((NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input')
      OR (json_extract(NEW.metadata, '$.hitl_answer') IS NOT NULL
          AND json_extract(NEW.metadata, '$.hitl_answer')
              IS NOT json_extract(OLD.metadata, '$.hitl_answer')))
BEGIN
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input');
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, 'approval_requested', json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'child_run_id', NEW.run_id,
                           'request_id', json_extract(NEW.metadata, '$.hitl_approval.request_id')), unixepoch('subsec')
      FROM workflows WHERE id = NEW.workflow AND (NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input');
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = NEW.workflow AND (json_extract(NEW.metadata, '$.hitl_answer') IS NOT NULL
                     AND json_extract(NEW.metadata, '$.hitl_answer')
                         IS NOT json_extract(OLD.metadata, '$.hitl_answer'));
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT id, event_seq, 'approval_answered', json_object('step_id', NEW.step_id, 'attempt', NEW.attempt, 'child_run_id', NEW.run_id,
                           'request_id', json_extract(NEW.metadata, '$.hitl_answer.request_id'),
                           'decision', json_extract(NEW.metadata, '$.hitl_answer.answer.decision'),
                           'by', json_extract(NEW.metadata, '$.hitl_answer.answer.by')), unixepoch('subsec')
      FROM workflows WHERE id = NEW.workflow AND (json_extract(NEW.metadata, '$.hitl_answer') IS NOT NULL
                     AND json_extract(NEW.metadata, '$.hitl_answer')
                         IS NOT json_extract(OLD.metadata, '$.hitl_answer'));
END;
