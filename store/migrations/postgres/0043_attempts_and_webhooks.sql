-- Attempts tell the truth (issue 40 item 2): a `step_finished` event's `duration_ms` counted
-- from when the attempt was journaled, so a retry's included the backoff before it (2 s shown for
-- a run of 10 ms). It now counts from the attempt's run's start (its child run's `created_at`;
-- a step without one, from its journaling), and `waited_ms` says what came before. The trigger
-- function is migration 33's otherwise.
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
    v_started DOUBLE PRECISION;
BEGIN
    IF TG_OP = 'INSERT' THEN
        v_kinds := v_kinds || 'step_journaled'::text;
        v_data := v_data || jsonb_strip_nulls(jsonb_build_object(
                'step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                'seq', NEW.seq, 'retry_due_at_ms', NEW.data->'retry'->'due_at_ms',
                'retry_reason', NEW.data->'retry'->'reason'));
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
        -- The attempt's own run began it (an adopted outcome's run did not); a step with none
        -- began when it was journaled.
        SELECT total_tokens, message_count,
               CASE WHEN run_id = NEW.data->>'run_id' THEN created_at END
          INTO v_tokens, v_messages, v_started
          FROM runs WHERE run_id = v_run;
        v_started := coalesce(v_started, NEW.created_at);
        v_kinds := v_kinds || 'step_finished'::text;
        v_data := v_data || (jsonb_build_object(
                'step_id', NEW.step_id, 'attempt', NEW.attempt, 'step_kind', NEW.kind,
                'status', NEW.status, 'child_run_id', v_run,
                'duration_ms', round((NEW.updated_at - greatest(v_started, NEW.created_at))
                                     * 1000)::bigint,
                'waited_ms', round((greatest(v_started, NEW.created_at) - NEW.created_at)
                                   * 1000)::bigint,
                'output_bytes', (SELECT bytes FROM workflow_artifacts
                                  WHERE workflow = NEW.workflow AND version = v_version),
                'total_tokens', v_tokens, 'message_count', v_messages)
            || CASE WHEN NEW.status = 'failed' THEN jsonb_strip_nulls(jsonb_build_object(
                'error', NEW.data->'outcome'->'value'->'message',
                'error_status', NEW.data->'outcome'->'value'->'status'))
               ELSE '{}'::jsonb END);
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
