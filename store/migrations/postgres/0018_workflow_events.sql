-- What happens to a workflow, as events derived from what commits: triggers on the workflow, its
-- journal, its controls, its artifacts and its child runs write them in the transaction of the
-- change itself, so an event exists exactly when its change does (a rolled back or fenced-out
-- write leaves none). Events go with their workflow (ON DELETE CASCADE).
--
-- Order: `workflows.event_seq` counts a workflow's events. Each event takes the next number by
-- updating that row, whose lock is then held until the transaction ends, so a workflow's event
-- numbers commit in order: a reader that sees number n sees every number below it. Status changes
-- also take a number of the cluster-wide feed (`event_feed`, one row, locked the same way), so the
-- feed's numbers commit in order too.
ALTER TABLE workflows ADD COLUMN event_seq BIGINT NOT NULL DEFAULT 0;
-- `console.log` lines kept as events, their bytes, and lines dropped over the bounds.
ALTER TABLE workflows ADD COLUMN log_events BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflows ADD COLUMN log_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflows ADD COLUMN log_dropped BIGINT NOT NULL DEFAULT 0;

CREATE TABLE event_feed (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    seq  BIGINT NOT NULL
);
INSERT INTO event_feed (id, seq) VALUES (1, 0);

CREATE TABLE workflow_events (
    workflow    TEXT NOT NULL REFERENCES workflows (id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    kind        TEXT NOT NULL,
    data        JSONB NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    -- The feed's number, for status changes only; with the workflow's user, so that a user's
    -- feed is read through one index.
    feed_seq    BIGINT,
    user_id     TEXT,
    PRIMARY KEY (workflow, seq)
);
CREATE UNIQUE INDEX workflow_events_feed ON workflow_events (feed_seq) WHERE feed_seq IS NOT NULL;
CREATE INDEX workflow_events_feed_by_user ON workflow_events (user_id, feed_seq)
    WHERE feed_seq IS NOT NULL;

-- Appends one event of a workflow with its next number.
CREATE FUNCTION reins_event(p_workflow TEXT, p_kind TEXT, p_data JSONB) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    n BIGINT;
BEGIN
    UPDATE workflows SET event_seq = event_seq + 1 WHERE id = p_workflow RETURNING event_seq INTO n;
    IF FOUND THEN
        INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
        VALUES (p_workflow, n, p_kind, p_data, reins_now());
    END IF;
END $$;

-- A status change (and a launch) is an event of the workflow and of the feed.
CREATE FUNCTION reins_status_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    feed BIGINT;
BEGIN
    IF NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NEW;
    END IF;
    NEW.event_seq := NEW.event_seq + 1;
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1 RETURNING seq INTO feed;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    VALUES (NEW.id, NEW.event_seq, 'status',
            jsonb_build_object('status', NEW.status, 'previous', OLD.status),
            reins_now(), feed, NEW.user_id);
    RETURN NEW;
END $$;

-- A launch's event is number 1; it is written once the row exists.
CREATE FUNCTION reins_launch_seq() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.event_seq := 1;
    RETURN NEW;
END $$;

CREATE FUNCTION reins_launch_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    feed BIGINT;
BEGIN
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1 RETURNING seq INTO feed;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    VALUES (NEW.id, NEW.event_seq, 'status',
            jsonb_build_object('status', NEW.status, 'previous', NULL),
            reins_now(), feed, NEW.user_id);
    RETURN NULL;
END $$;

CREATE TRIGGER workflows_status_event BEFORE UPDATE OF status ON workflows
    FOR EACH ROW EXECUTE FUNCTION reins_status_event();
CREATE TRIGGER workflows_launch_seq BEFORE INSERT ON workflows
    FOR EACH ROW EXECUTE FUNCTION reins_launch_seq();
CREATE TRIGGER workflows_launch_event AFTER INSERT ON workflows
    FOR EACH ROW EXECUTE FUNCTION reins_launch_event();

-- The journal: a step journaled; started (or, for a pause or a checkpoint, waiting for a person);
-- finished, with how long since it was journaled, the size of the artifact its outcome names (an
-- agent's output, a captured file) and its child run's token counts.
CREATE FUNCTION reins_step_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_kinds TEXT[] := '{}';
    v_data JSONB[] := '{}';
    v_run TEXT;
    v_version BIGINT;
    v_tokens BIGINT;
    v_messages BIGINT;
    v_last BIGINT;
BEGIN
    IF TG_OP = 'INSERT' THEN
        v_kinds := v_kinds || 'step_journaled'::text;
        v_data := v_data || jsonb_build_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                                               'step_kind', NEW.kind, 'seq', NEW.seq);
    ELSIF NEW.status = OLD.status THEN
        RETURN NULL;
    END IF;
    IF NEW.status = 'running' THEN
        v_kinds := v_kinds || CASE NEW.kind WHEN 'pause' THEN 'pause_waiting'
                                            WHEN 'humanCheckpoint' THEN 'checkpoint_waiting'
                                            ELSE 'step_started' END;
        v_data := v_data || CASE NEW.kind WHEN 'humanCheckpoint' THEN
                jsonb_build_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                                   'step_kind', NEW.kind,
                                   'artifact_version', NEW.data->'args'->'artifactVersion')
            ELSE jsonb_build_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                                    'step_kind', NEW.kind) END;
    ELSIF NEW.status IN ('completed', 'failed', 'cancelled') THEN
        v_run := coalesce(NEW.data->>'run_id', NEW.data->'outcome'->'value'->>'runId');
        v_version := (NEW.data->'outcome'->'value'->>'artifactVersion')::bigint;
        SELECT total_tokens, message_count INTO v_tokens, v_messages
          FROM runs WHERE run_id = v_run;
        v_kinds := v_kinds || 'step_finished'::text;
        v_data := v_data || jsonb_build_object(
                'step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                'status', NEW.status, 'child_run_id', v_run,
                'duration_ms', round((NEW.updated_at - NEW.created_at) * 1000)::bigint,
                'output_bytes', (SELECT bytes FROM workflow_artifacts
                                  WHERE workflow = NEW.workflow AND version = v_version),
                'total_tokens', v_tokens, 'message_count', v_messages);
    END IF;
    IF cardinality(v_kinds) = 0 THEN
        RETURN NULL;
    END IF;
    -- One update of the workflow's row for all of this row's events (one or two).
    UPDATE workflows SET event_seq = event_seq + cardinality(v_kinds) WHERE id = NEW.workflow
    RETURNING event_seq INTO v_last;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT NEW.workflow, v_last - cardinality(v_kinds) + e.n, e.kind, v_data[e.n], reins_now()
      FROM unnest(v_kinds) WITH ORDINALITY AS e(kind, n);
    RETURN NULL;
END $$;

CREATE TRIGGER workflow_steps_events AFTER INSERT OR UPDATE OF status ON workflow_steps
    FOR EACH ROW EXECUTE FUNCTION reins_step_events();

-- Controls, as recorded by any node: a checkpoint decided, a pause resumed, a cancel asked.
CREATE FUNCTION reins_control_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM reins_event(NEW.workflow,
        CASE NEW.kind WHEN 'decide' THEN 'checkpoint_decided'
                      WHEN 'resume' THEN 'pause_resumed'
                      ELSE 'cancel_requested' END,
        CASE NEW.kind
            WHEN 'decide' THEN
                jsonb_build_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                                   'decision', NEW.body->'decision',
                                   'artifact_version', NEW.body->'artifactVersion',
                                   'comment', NEW.body->'comment', 'by', NEW.created_by)
            WHEN 'resume' THEN
                jsonb_build_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                                   'by', NEW.created_by)
            ELSE jsonb_build_object('by', NEW.created_by) END);
    RETURN NULL;
END $$;

CREATE TRIGGER workflow_controls_event AFTER INSERT ON workflow_controls
    FOR EACH ROW EXECUTE FUNCTION reins_control_event();

-- An artifact version stored: a captured file (with its name) or an agent's output.
CREATE FUNCTION reins_artifact_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM reins_event(NEW.workflow, 'artifact',
        jsonb_build_object('version', NEW.version, 'bytes', NEW.bytes,
                           'step_id', NEW.source_step_id, 'name', NEW.path));
    RETURN NULL;
END $$;

CREATE TRIGGER workflow_artifacts_event AFTER INSERT ON workflow_artifacts
    FOR EACH ROW EXECUTE FUNCTION reins_artifact_event();

-- A workflow step's agent asking a person for approval, and the answer. Lease renewals and
-- every other change of a run are left out by the WHEN clause before any function runs.
CREATE FUNCTION reins_approval_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input' THEN
        PERFORM reins_event(NEW.workflow, 'approval_requested',
            jsonb_build_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                               'child_run_id', NEW.run_id,
                               'request_id', NEW.metadata->'hitl_approval'->'request_id'));
    END IF;
    IF NEW.metadata->'hitl_answer' IS NOT NULL
       AND NEW.metadata->'hitl_answer' IS DISTINCT FROM OLD.metadata->'hitl_answer' THEN
        PERFORM reins_event(NEW.workflow, 'approval_answered',
            jsonb_build_object('step_id', NEW.step_id, 'attempt', NEW.attempt,
                               'child_run_id', NEW.run_id,
                               'request_id', NEW.metadata->'hitl_answer'->'request_id',
                               'decision', NEW.metadata->'hitl_answer'->'answer'->'decision',
                               'by', NEW.metadata->'hitl_answer'->'answer'->'by'));
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER runs_approval_event AFTER UPDATE OF status, metadata ON runs
    FOR EACH ROW
    WHEN (NEW.workflow IS NOT NULL
          AND ((NEW.status = 'waiting_for_input' AND OLD.status <> 'waiting_for_input')
               OR (NEW.metadata->'hitl_answer' IS NOT NULL
                   AND NEW.metadata->'hitl_answer' IS DISTINCT FROM OLD.metadata->'hitl_answer')))
    EXECUTE FUNCTION reins_approval_event();

-- `console.log` lines as `log` events, at most p_events_max lines and p_bytes_max bytes of
-- lines per workflow; the first line over either becomes one `log_truncated` event, and the
-- later ones are dropped (counted in `log_dropped`).
CREATE FUNCTION reins_log(p_workflow TEXT, p_lines TEXT[], p_events_max BIGINT,
                          p_bytes_max BIGINT) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_kept BIGINT;
    v_bytes BIGINT;
    v_dropped BIGINT;
    v_line TEXT;
BEGIN
    SELECT log_events, log_bytes, log_dropped INTO v_kept, v_bytes, v_dropped
      FROM workflows WHERE id = p_workflow;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'RN001', MESSAGE = 'workflow ' || p_workflow;
    END IF;
    FOREACH v_line IN ARRAY p_lines LOOP
        IF v_dropped = 0 AND v_kept < p_events_max
           AND v_bytes + octet_length(v_line) <= p_bytes_max THEN
            v_kept := v_kept + 1;
            v_bytes := v_bytes + octet_length(v_line);
            PERFORM reins_event(p_workflow, 'log', jsonb_build_object('line', v_line));
        ELSE
            v_dropped := v_dropped + 1;
            IF v_dropped = 1 THEN
                PERFORM reins_event(p_workflow, 'log_truncated',
                    jsonb_build_object('events_max', p_events_max, 'bytes_max', p_bytes_max));
            END IF;
        END IF;
    END LOOP;
    UPDATE workflows SET log_events = v_kept, log_bytes = v_bytes, log_dropped = v_dropped
     WHERE id = p_workflow;
END $$;
