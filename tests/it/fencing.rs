//! Fenced writes on PostgreSQL, where many nodes write at once: a takeover waits for a fenced
//! write in flight. What every store must do with fenced writes is the store's conformance suite
//! (`store/tests/conformance`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use store::{Error, NewWorkflow, Store, WriteOp};

use crate::harness::{TestDb, eventually};

/// A workflow row (and its first lease, held by `owner`) to write steps into.
async fn workflow(store: &Store, id: &str, owner: &str, lease_ms: u64) -> store::Lease {
    store
        .create_workflow(
            NewWorkflow {
                workflow_id: store::WorkflowId::new(id),
                user_id: "tester".into(),
                request_id: None,
                fingerprint: "fp".into(),
                data: json!({}),
            },
            owner,
            lease_ms,
        )
        .await
        .expect("create workflow")
}

/// A journal entry named `step_id`.
fn step(workflow_id: &str, step_id: &str) -> WriteOp {
    WriteOp::PutStep {
        seq: 0,
        workflow_id: store::WorkflowId::new(workflow_id),
        step_id: step_id.to_owned(),
        attempt: 1,
        status: store::StepStatus::Completed,
        record: store::StepRecord::decode("agent", &json!({"output": step_id}))
            .expect("a step record"),
    }
}

/// PostgreSQL runs fenced writes of many nodes at once, so the fence must hold a lock that a
/// takeover waits for. A fenced write is held in flight after its fence check (a raw session locks
/// the row it updates); a takeover issued meanwhile must wait for it, and once the takeover has
/// committed, the old owner's next write is refused. (SQLite has a single writer, so a takeover can
/// never interleave with a write there.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_takeover_waits_for_a_fenced_write_in_flight() {
    let db = TestDb::postgres().await;
    let (old_store, new_store) = (db.store().await, db.store().await);
    let held = workflow(&old_store, "wf", "old", 1_000).await;
    let mut blocker = db.pg_client().await;
    let blocking = blocker.transaction().await.expect("begin");
    blocking
        .execute("SELECT 1 FROM workflows WHERE id = 'wf' FOR UPDATE", &[])
        .await
        .expect("lock the workflow row");

    let in_flight = {
        let (store, fence) = (Arc::clone(&old_store), held.fence());
        tokio::spawn(async move {
            let done = WriteOp::SetWorkflow {
                workflow_id: "wf".into(),
                status: store::WorkflowStatus::Completed,
                data: json!({"by": "old"}),
            };
            store.fenced_write(&fence, vec![done]).await
        })
    };
    let observer = db.pg_client().await;
    let waiting_sessions = async || -> i64 {
        observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("pg_stat_activity")
            .get(0)
    };
    eventually(
        Duration::from_secs(60),
        "the fenced write waits on the row lock",
        async || waiting_sessions().await == 1,
    )
    .await;
    let expiry = held.expires_at;
    eventually(Duration::from_secs(60), "the lease expired", async || {
        new_store.now().await.expect("now") > expiry
    })
    .await;

    let takeover = {
        let store = Arc::clone(&new_store);
        tokio::spawn(async move {
            store
                .acquire_lease(&store::WorkflowId::from("wf"), "new", 60_000)
                .await
        })
    };
    eventually(
        Duration::from_secs(60),
        "the takeover waits for the fenced write",
        async || waiting_sessions().await == 2,
    )
    .await;
    assert!(
        !takeover.is_finished(),
        "the takeover did not wait for the write in flight"
    );

    blocking.rollback().await.expect("release the row lock");
    in_flight
        .await
        .expect("join")
        .expect("the write checked before the takeover commits");
    let lease = takeover
        .await
        .expect("join")
        .expect("acquire")
        .expect("takeover after the write");
    assert_eq!(lease.epoch, held.epoch.next());
    let stale = old_store
        .fenced_write(&held.fence(), vec![step("wf", "late")])
        .await;
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    assert!(
        new_store
            .read_steps(&store::WorkflowId::from("wf"))
            .await
            .expect("steps")
            .is_empty()
    );
}
