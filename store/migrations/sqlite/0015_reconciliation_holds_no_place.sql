-- A workflow in needs_reconciliation holds no place under max_workflows or
-- max_workflows_per_owner (spec section 3's live set is running, paused, waiting_approval,
-- cancelling): nobody is locked out by workflows only an operator can settle. The counts of
-- migration 11 are kept over that set from now on (store::COUNTED_STATUSES); a reconcile checks
-- them before the workflow counts again (WriteOp::TakePlaces).
DROP TRIGGER live_workflows_inserted;
DROP TRIGGER live_workflows_deleted;
DROP TRIGGER live_workflows_updated;
UPDATE live_workflows_total
   SET live = (SELECT count(*) FROM workflows
                WHERE status IN ('running', 'paused', 'waiting_approval', 'cancelling'))
 WHERE id = 1;
DELETE FROM live_workflows_by_user;
INSERT INTO live_workflows_by_user (user_id, live)
SELECT user_id, count(*) FROM workflows
 WHERE status IN ('running', 'paused', 'waiting_approval', 'cancelling')
 GROUP BY user_id;

CREATE TRIGGER live_workflows_inserted AFTER INSERT ON workflows
WHEN NEW.status IN ('running', 'paused', 'waiting_approval', 'cancelling')
BEGIN
    UPDATE live_workflows_total SET live = live + 1 WHERE id = 1;
    INSERT INTO live_workflows_by_user (user_id, live) VALUES (NEW.user_id, 1)
        ON CONFLICT (user_id) DO UPDATE SET live = live + 1;
END;

CREATE TRIGGER live_workflows_deleted AFTER DELETE ON workflows
WHEN OLD.status IN ('running', 'paused', 'waiting_approval', 'cancelling')
BEGIN
    UPDATE live_workflows_total SET live = live - 1 WHERE id = 1;
    UPDATE live_workflows_by_user SET live = live - 1 WHERE user_id = OLD.user_id;
END;

-- Only a change that moves a workflow in or out of the counted set (or to another user) counts.
CREATE TRIGGER live_workflows_updated AFTER UPDATE OF status, user_id ON workflows
WHEN (OLD.status IN ('running', 'paused', 'waiting_approval', 'cancelling'))
     <> (NEW.status IN ('running', 'paused', 'waiting_approval', 'cancelling'))
  OR OLD.user_id <> NEW.user_id
BEGIN
    UPDATE live_workflows_total
       SET live = live
           - (OLD.status IN ('running', 'paused', 'waiting_approval', 'cancelling'))
           + (NEW.status IN ('running', 'paused', 'waiting_approval', 'cancelling'))
     WHERE id = 1;
    UPDATE live_workflows_by_user SET live = live - 1
     WHERE user_id = OLD.user_id
       AND OLD.status IN ('running', 'paused', 'waiting_approval', 'cancelling');
    INSERT INTO live_workflows_by_user (user_id, live)
    SELECT NEW.user_id, 1
     WHERE NEW.status IN ('running', 'paused', 'waiting_approval', 'cancelling')
        ON CONFLICT (user_id) DO UPDATE SET live = live + 1;
END;
