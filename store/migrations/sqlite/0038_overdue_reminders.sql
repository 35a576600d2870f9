-- Reminders: see the PostgreSQL migration 38 of the same name.
CREATE TRIGGER workflow_events_remind AFTER INSERT ON workflow_events
WHEN NEW.kind IN ('pause_waiting', 'checkpoint_waiting')
BEGIN
    INSERT OR IGNORE INTO notify_outbox (id, workflow, seq, kind, event, data, user_id,
                                         user_email, user_role, created_at, due_at)
    SELECT NEW.workflow || ':overdue:' || json_extract(NEW.data, '$.step_id') || ':'
               || json_extract(NEW.data, '$.attempt'),
           NEW.workflow, NEW.seq, 'overdue', NEW.kind,
           json_patch(NEW.data, json_object(
               'title', json_extract(w.data, '$.title'),
               'message', json_extract(s.data, '$.args.message'))),
           w.user_id, u.email, u.role,
           NEW.created_at + json_extract(s.data, '$.args.remindAfterMs') / 1000.0,
           NEW.created_at + json_extract(s.data, '$.args.remindAfterMs') / 1000.0
      FROM workflows w
      JOIN workflow_steps s ON s.workflow = w.id
                           AND s.step_id = json_extract(NEW.data, '$.step_id')
                           AND s.attempt = json_extract(NEW.data, '$.attempt')
      LEFT JOIN users u ON u.id = w.user_id
     WHERE w.id = NEW.workflow
       AND json_type(s.data, '$.args.remindAfterMs') IN ('integer', 'real');
END;

CREATE TRIGGER workflow_events_reminded AFTER INSERT ON workflow_events
WHEN NEW.kind IN ('checkpoint_decided', 'pause_resumed')
BEGIN
    DELETE FROM notify_outbox
     WHERE id = NEW.workflow || ':overdue:' || json_extract(NEW.data, '$.step_id') || ':'
                || json_extract(NEW.data, '$.attempt');
END;
