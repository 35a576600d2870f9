-- Notifications (issue 32 item 4): the durable outbox a node's notifier delivers webhooks from.
-- A row is written by a trigger on `workflow_events`, in the transaction of the event, for the
-- events that put an item into a person's inbox (a pause or a checkpoint reached, an agent's run
-- asking for approval) or take it out (a decision, a resume, an approval's answer). So a
-- notification exists exactly when its event committed: a fenced-out write leaves none, and a
-- node that dies after the commit leaves the row for another to deliver.
--
-- `id` is `<workflow>:<event seq>`: stable across redeliveries, what a receiver deduplicates by.
-- `kind` is what a receiver is told: `entered`, `decided`, `timed_out` (a decision recorded by a
-- deadline: a control whose body says `"by": "timeout"`, or an approval answered by `timeout`)
-- or `overdue` (kept for reminders, which no event produces yet). `data` is the event's own data
-- with the workflow's `title` and the waiting step's `message` when they have one. The owner's
-- id, email and role are copied for the sinks' filters.
--
-- Deliveries are claimed per row: a claim takes `claim_epoch + 1` until `claim_expires_at`
-- (the database clock), and every later write of the claimant names that epoch, so a node whose
-- claim lapsed and was taken cannot settle the row. `due_at` is when the next attempt may start;
-- `delivered_to` lists the sinks that answered 2xx already, so a retry asks only the others.
CREATE TABLE notify_outbox (
    id                TEXT PRIMARY KEY,
    workflow          TEXT NOT NULL,
    seq               INTEGER NOT NULL,
    kind              TEXT NOT NULL CHECK (kind IN ('entered', 'decided', 'timed_out', 'overdue')),
    event             TEXT NOT NULL,
    data              TEXT NOT NULL,
    user_id           TEXT,
    user_email        TEXT,
    user_role         TEXT,
    created_at        REAL NOT NULL,
    due_at            REAL NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    delivered_to      TEXT NOT NULL DEFAULT '[]',
    claim_owner       TEXT,
    claim_epoch       INTEGER NOT NULL DEFAULT 0,
    claim_expires_at  REAL
);
CREATE INDEX notify_outbox_due ON notify_outbox (due_at);
CREATE INDEX notify_outbox_by_age ON notify_outbox (created_at);

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
           json_patch(NEW.data, json_object(
               'title', json_extract(w.data, '$.title'),
               'message', (SELECT json_extract(s.data, '$.args.message') FROM workflow_steps s
                            WHERE s.workflow = NEW.workflow
                              AND s.step_id = json_extract(NEW.data, '$.step_id')
                              AND s.attempt = json_extract(NEW.data, '$.attempt')))),
           w.user_id, u.email, u.role, NEW.created_at, NEW.created_at
      FROM workflows w LEFT JOIN users u ON u.id = w.user_id
     WHERE w.id = NEW.workflow;
END;
