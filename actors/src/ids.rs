//! Identifiers of workflows and child runs.

use store::{RunId, WorkflowId};

/// A new workflow or run id: 32 hex digits of a UUIDv7, so ids sort by creation time.
///
/// Every index keyed by one (runs by id, by idempotency key, by thread; steps, slots and artifacts
/// by workflow) then grows at its right edge: the rows live workflows write share a few recent
/// index pages instead of dirtying a random page each, which is most of what a commit writes.
/// The 74 random bits keep ids unguessable and unique across nodes.
fn new_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// A new workflow id ([`new_id`]).
pub(crate) fn new_workflow_id() -> WorkflowId {
    WorkflowId::new(new_id())
}

/// A new child run id ([`new_id`]).
pub(crate) fn new_run_id() -> RunId {
    RunId::new(new_id())
}

#[cfg(test)]
mod tests {
    use super::new_id;

    #[test]
    fn ids_are_unique_and_sort_by_creation() {
        let ids: Vec<String> = (0..1000).map(|_| new_id()).collect();
        assert!(ids.iter().all(|id| id.len() == 32));
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted, ids,
            "ids made one after another are distinct and ascending"
        );
    }
}
