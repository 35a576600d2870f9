-- A workflow in needs_reconciliation holds no place under max_workflows or
-- max_workflows_per_owner (spec section 3's live set is running, paused, waiting_approval,
-- cancelling): nobody is locked out by workflows only an operator can settle. Its numbers are
-- given back when it gets there; a reconcile takes them again (WriteOp::TakePlaces) or is
-- refused. store::COUNTED_STATUSES is the set below.
DROP TRIGGER workflows_free_numbers ON workflows;
CREATE TRIGGER workflows_free_numbers BEFORE UPDATE OF status ON workflows
    FOR EACH ROW
    WHEN (NEW.status NOT IN ('running', 'paused', 'waiting_approval', 'cancelling'))
    EXECUTE FUNCTION reins_free_numbers();
UPDATE workflows SET live_no = NULL, owner_no = NULL WHERE status = 'needs_reconciliation';
