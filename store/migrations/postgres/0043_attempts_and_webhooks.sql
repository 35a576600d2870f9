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

-- Webhooks carry what the docs say, from the moment they are configured (issue 40 item 6).
--
-- `notify_targets` records when each webhook (`target`: its URL, as `[[notify]]` names it) was
-- first configured: a node's notifier writes it before it claims for the webhook, and the
-- first node to name it sets `since`. A claim for a webhook takes no notification committed
-- before its `since`, so enabling `[[notify]]` on a node with history does not send what was
-- recorded before (rows written while no node had any webhook, kept for their retention). A row
-- leaves the outbox once each of the settling node's webhooks has settled it or was configured
-- after it committed. The webhooks that have delivered anything already are recorded as
-- configured from the start, so an upgraded node loses nothing it would have sent.
CREATE TABLE notify_targets (
    target  TEXT PRIMARY KEY,
    since   DOUBLE PRECISION NOT NULL
);
INSERT INTO notify_targets (target, since)
SELECT DISTINCT target, 0 FROM notify_deliveries;

-- A pause's resume tells what it was resumed with: its control's `input` joins the row's data
-- (a deadline's resume without `onTimeout` has none, and the pause fails). Otherwise the
-- trigger function of migration 36.
CREATE OR REPLACE FUNCTION reins_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO notify_outbox (id, workflow, seq, kind, event, data, user_id, user_email,
                               user_role, created_at, due_at)
    SELECT NEW.workflow || ':' || NEW.seq, NEW.workflow, NEW.seq,
           CASE WHEN NEW.kind IN ('pause_waiting', 'checkpoint_waiting', 'approval_requested')
                    THEN 'entered'
                WHEN NEW.data->>'by' = 'timeout'
                  OR EXISTS (SELECT 1 FROM workflow_controls c
                              WHERE c.workflow = NEW.workflow AND c.kind IN ('decide', 'resume')
                                AND c.step_id = NEW.data->>'step_id'
                                AND c.attempt = (NEW.data->>'attempt')::int
                                AND c.body->>'by' = 'timeout')
                    THEN 'timed_out'
                ELSE 'decided' END,
           NEW.kind,
           NEW.data || jsonb_strip_nulls(jsonb_build_object(
               'title', w.data->'title',
               'message', (SELECT s.data->'args'->'message' FROM workflow_steps s
                            WHERE s.workflow = NEW.workflow
                              AND s.step_id = NEW.data->>'step_id'
                              AND s.attempt = (NEW.data->>'attempt')::int)))
             || coalesce((SELECT jsonb_build_object('input', c.body->'input')
                            FROM workflow_controls c
                           WHERE NEW.kind = 'pause_resumed' AND c.workflow = NEW.workflow
                             AND c.kind = 'resume' AND c.step_id = NEW.data->>'step_id'
                             AND c.attempt = (NEW.data->>'attempt')::int
                             AND c.body ? 'input'
                           LIMIT 1), '{}'::jsonb),
           w.user_id, u.email, u.role, NEW.created_at, NEW.created_at
      FROM workflows w LEFT JOIN users u ON u.id = w.user_id
     WHERE w.id = NEW.workflow;
    RETURN NULL;
END $$;
