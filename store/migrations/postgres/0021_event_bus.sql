-- Two changes to the events of migration 18.
--
-- 1. A workflow's event counter moves off its `workflows` row into a narrow row of its own
--    (`workflow_event_seqs`). Every event bumped the counter on the workflow's row: a new
--    version of a row of some 700 bytes (its data, its script), two or three times a step, and
--    one in eight of them did not fit its page and went into all nine indexes of `workflows`. The counter's row
--    keeps what migration 18 relied on: its lock, held until the transaction ends, makes a
--    workflow's event numbers commit in order.
--
-- 2. Every committed event cues the event streams of every node (store/src/changes.rs): a
--    NOTIFY `e:WORKFLOW` in the transaction that writes the event, so it is heard only if that
--    commits. A notifying commit holds a cluster-wide lock until it is flushed (32 workflows at
--    once ran a quarter to a third fewer steps a second when every step notified), so only a
--    workflow some stream watches notifies: a stream sets `watched_until` on the counter's row
--    (`Store::watch_events`) before it reads, and renews it while it runs. The counter's update
--    returns it, so an unwatched workflow pays nothing. A status change needs no `e:`: its `w:`
--    (migration 19) wakes the streams already, and so do a control's `c:` and a child run's `r:`.
--    Identical payloads of one transaction arrive once, so a step notifies at most once.

CREATE TABLE workflow_event_seqs (
    workflow       TEXT PRIMARY KEY REFERENCES workflows (id) ON DELETE CASCADE,
    seq            BIGINT NOT NULL,
    -- Until when (reins_now() seconds) some event stream watches this workflow's events.
    watched_until  DOUBLE PRECISION NOT NULL DEFAULT 0
);
INSERT INTO workflow_event_seqs (workflow, seq) SELECT id, event_seq FROM workflows;

CREATE OR REPLACE FUNCTION reins_event(p_workflow TEXT, p_kind TEXT, p_data JSONB) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    n BIGINT;
    v_watched DOUBLE PRECISION;
BEGIN
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = p_workflow
    RETURNING seq, watched_until INTO n, v_watched;
    IF FOUND THEN
        INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
        VALUES (p_workflow, n, p_kind, p_data, reins_now());
        IF v_watched > reins_now() THEN
            PERFORM pg_notify('reins_changes', 'e:' || p_workflow);
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION reins_status_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    feed BIGINT;
    n BIGINT;
BEGIN
    IF NEW.status IS NOT DISTINCT FROM OLD.status THEN
        RETURN NEW;
    END IF;
    UPDATE workflow_event_seqs SET seq = seq + 1 WHERE workflow = NEW.id RETURNING seq INTO n;
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1 RETURNING seq INTO feed;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    VALUES (NEW.id, n, 'status',
            jsonb_build_object('status', NEW.status, 'previous', OLD.status),
            reins_now(), feed, NEW.user_id);
    RETURN NEW;
END $$;

-- The launch's event is still number 1; the counter's row is born with it.
DROP TRIGGER workflows_launch_seq ON workflows;
DROP FUNCTION reins_launch_seq();

CREATE OR REPLACE FUNCTION reins_launch_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    feed BIGINT;
BEGIN
    INSERT INTO workflow_event_seqs (workflow, seq) VALUES (NEW.id, 1);
    UPDATE event_feed SET seq = seq + 1 WHERE id = 1 RETURNING seq INTO feed;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at, feed_seq, user_id)
    VALUES (NEW.id, 1, 'status',
            jsonb_build_object('status', NEW.status, 'previous', NULL),
            reins_now(), feed, NEW.user_id);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION reins_step_events() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_kinds TEXT[] := '{}';
    v_data JSONB[] := '{}';
    v_run TEXT;
    v_version BIGINT;
    v_tokens BIGINT;
    v_messages BIGINT;
    v_last BIGINT;
    v_watched DOUBLE PRECISION;
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
    -- One update of the counter for all of this row's events (one or two).
    UPDATE workflow_event_seqs SET seq = seq + cardinality(v_kinds) WHERE workflow = NEW.workflow
    RETURNING seq, watched_until INTO v_last, v_watched;
    INSERT INTO workflow_events (workflow, seq, kind, data, created_at)
    SELECT NEW.workflow, v_last - cardinality(v_kinds) + e.n, e.kind, v_data[e.n], reins_now()
      FROM unnest(v_kinds) WITH ORDINALITY AS e(kind, n);
    IF v_watched > reins_now() THEN
        PERFORM pg_notify('reins_changes', 'e:' || NEW.workflow);
    END IF;
    RETURN NULL;
END $$;

ALTER TABLE workflows DROP COLUMN event_seq;
