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
-- No foreign key to `workflows`: a notification outlives a deleted workflow until it is
-- delivered or its retention ends, and the workflow's writes take no lock for it.
CREATE TABLE notify_outbox (
    id                TEXT PRIMARY KEY,
    workflow          TEXT NOT NULL,
    seq               BIGINT NOT NULL,
    kind              TEXT NOT NULL CHECK (kind IN ('entered', 'decided', 'timed_out', 'overdue')),
    event             TEXT NOT NULL,
    data              JSONB NOT NULL,
    user_id           TEXT,
    user_email        TEXT,
    user_role         TEXT,
    created_at        DOUBLE PRECISION NOT NULL,
    due_at            DOUBLE PRECISION NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    delivered_to      JSONB NOT NULL DEFAULT '[]',
    claim_owner       TEXT,
    claim_epoch       BIGINT NOT NULL DEFAULT 0,
    claim_expires_at  DOUBLE PRECISION
);
CREATE INDEX notify_outbox_due ON notify_outbox (due_at);
CREATE INDEX notify_outbox_by_age ON notify_outbox (created_at);

CREATE FUNCTION reins_notify_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
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
                              AND s.attempt = (NEW.data->>'attempt')::int))),
           w.user_id, u.email, u.role, NEW.created_at, NEW.created_at
      FROM workflows w LEFT JOIN users u ON u.id = w.user_id
     WHERE w.id = NEW.workflow;
    RETURN NULL;
END $$;

CREATE TRIGGER workflow_events_notify AFTER INSERT ON workflow_events
FOR EACH ROW
WHEN (NEW.kind IN ('pause_waiting', 'checkpoint_waiting', 'approval_requested',
                   'checkpoint_decided', 'pause_resumed', 'approval_answered'))
EXECUTE FUNCTION reins_notify_outbox();
