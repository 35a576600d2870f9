-- Reminders (issue 32 item 3): a pause or checkpoint with `remindAfterMs` notifies again, as
-- `overdue`, when it has waited that long. The `overdue` row is written by the trigger with the
-- event that put the item into the inbox, in that event's transaction, due at the reminder's
-- time (`due_at` = `created_at` = the event's time + remindAfterMs): nothing sweeps the
-- workflows for it and a dormant workflow is not woken for it. The decision that takes the item
-- out (a person's or a deadline's) deletes the row in its own transaction, so a reminder never
-- follows a decision recorded before its time; a claim deletes the due reminders of workflows
-- that ended otherwise (cancelled, failed). Its id, `<workflow>:overdue:<step id>:<attempt>`,
-- is what a receiver deduplicates by, and what the decision deletes by.
CREATE FUNCTION reins_notify_remind() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.kind IN ('pause_waiting', 'checkpoint_waiting') THEN
        INSERT INTO notify_outbox (id, workflow, seq, kind, event, data, user_id, user_email,
                                   user_role, created_at, due_at)
        SELECT NEW.workflow || ':overdue:' || (NEW.data->>'step_id') || ':'
                   || (NEW.data->>'attempt'),
               NEW.workflow, NEW.seq, 'overdue', NEW.kind,
               NEW.data || jsonb_strip_nulls(jsonb_build_object(
                   'title', w.data->'title', 'message', s.data->'args'->'message')),
               w.user_id, u.email, u.role,
               NEW.created_at + (s.data->'args'->>'remindAfterMs')::double precision / 1000,
               NEW.created_at + (s.data->'args'->>'remindAfterMs')::double precision / 1000
          FROM workflows w
          JOIN workflow_steps s ON s.workflow = w.id
                               AND s.step_id = NEW.data->>'step_id'
                               AND s.attempt = (NEW.data->>'attempt')::int
          LEFT JOIN users u ON u.id = w.user_id
         WHERE w.id = NEW.workflow
           AND jsonb_typeof(s.data->'args'->'remindAfterMs') = 'number'
        ON CONFLICT (id) DO NOTHING;
    ELSE
        DELETE FROM notify_outbox
         WHERE id = NEW.workflow || ':overdue:' || (NEW.data->>'step_id') || ':'
                    || (NEW.data->>'attempt');
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER workflow_events_remind AFTER INSERT ON workflow_events
FOR EACH ROW
WHEN (NEW.kind IN ('pause_waiting', 'checkpoint_waiting', 'checkpoint_decided', 'pause_resumed'))
EXECUTE FUNCTION reins_notify_remind();
