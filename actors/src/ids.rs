//! Identifiers of workflows and child runs.

/// A new workflow or run id: 32 hex digits of a UUIDv7, so ids sort by creation time.
///
/// Every index keyed by one (runs by id, by idempotency key, by thread; steps, slots and artifacts
/// by workflow) then grows at its right edge: the rows live workflows write share a few recent
/// index pages instead of dirtying a random page each, which is most of what a commit writes.
/// The 74 random bits keep ids unguessable and unique across nodes.
pub(crate) fn new_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
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
