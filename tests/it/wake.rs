//! Wake-ups instead of timers: the change bus of the store (a cue after each commit, ids only),
//! the nodes that act on it across a cluster, and the wait API (`?wait=`) that answers as soon
//! as a workflow ends or waits for a person, on both backends.

use std::time::Duration;

use serde_json::json;
use store::{Change, Fence, NewControl, NewWorkflow, WriteOp};
use tokio::sync::broadcast;

use crate::harness::on_both_backends;

/// The next change that is not a resync, within a generous bound.
async fn next_change(changes: &mut broadcast::Receiver<Change>) -> Change {
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match changes.recv().await {
                Ok(Change::Resync) => continue,
                Ok(change) => return change,
                Err(error) => panic!("the bus failed: {error}"),
            }
        }
    })
    .await
    .expect("a change within 10 s")
}

/// Waits until the bus is listening (PostgreSQL announces its first connect with a resync).
async fn listening(store: &store::Store, changes: &mut broadcast::Receiver<Change>) {
    if store.backend() == store::Backend::Postgres {
        let first = tokio::time::timeout(Duration::from_secs(10), changes.recv()).await;
        assert!(matches!(first, Ok(Ok(Change::Resync))), "{first:?}");
    }
}

on_both_backends! {
    async fn committed_changes_are_announced_by_id_and_rolled_back_ones_never(db: TestDb) {
        let store = db.store().await;
        let mut changes = store.changes().subscribe();
        listening(&store, &mut changes).await;
        let lease = store
            .create_workflow(
                NewWorkflow {
                    workflow_id: "wf-bus".into(),
                    user_id: "ada".into(),
                    request_id: None,
                    fingerprint: "fp".into(),
                    data: json!({"script": "return 1;"}),
                },
                "node-a",
                60_000,
            )
            .await
            .expect("launch");
        store
            .put_control(NewControl {
                workflow_id: "wf-bus".into(),
                kind: "cancel".into(),
                step_id: String::new(),
                attempt: 0,
                body: json!({}),
                created_by: Some("ada".into()),
            })
            .await
            .expect("control");
        assert_eq!(next_change(&mut changes).await, Change::Control("wf-bus".into()));

        // A write the fence refuses changes nothing, so it announces nothing: the next change
        // heard is the one after it.
        let stale = Fence { epoch: lease.epoch + 1, ..lease.fence() };
        let set = |status: &str| WriteOp::SetWorkflow {
            workflow_id: "wf-bus".into(),
            status: status.into(),
            data: json!({"script": "return 1;"}),
        };
        assert!(store.fenced_write(&stale, vec![set("paused")]).await.is_err());
        store.fenced_write(&lease.fence(), vec![set("completed")]).await.expect("end");
        assert_eq!(next_change(&mut changes).await, Change::Status("wf-bus".into()));
    }
}
