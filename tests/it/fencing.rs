//! Fenced writes: all or nothing, and never after a takeover.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use store::{Error, WriteOp};

use crate::harness::{TestDb, eventually, on_both_backends};
use crate::leases::{step, workflow};

on_both_backends! {
    async fn a_failing_change_rolls_back_the_whole_fenced_write(db: TestDb) {
        let store = db.store().await;
        let lease = workflow(&store, "wf", "node-a", 60_000).await;
        let missing = WriteOp::SetWorkflow {
            workflow_id: "no-such-workflow".into(),
            status: "completed".into(),
            data: json!({}),
        };
        let result = store.fenced_write(&lease.fence(), vec![step("wf", "s1"), missing]).await;
        assert!(matches!(result, Err(Error::NotFound(_))), "{result:?}");
        assert!(store.read_steps("wf").await.expect("steps").is_empty(), "half a write landed");

        let done = WriteOp::SetWorkflow {
            workflow_id: "wf".into(),
            status: "completed".into(),
            data: json!({"result": 42}),
        };
        store.fenced_write(&lease.fence(), vec![step("wf", "s1"), done]).await.expect("write");
        let row = store.read_workflow("wf").await.expect("read").expect("row");
        assert_eq!((row.status.as_str(), &row.data), ("completed", &json!({"result": 42})));
        assert_eq!(store.read_steps("wf").await.expect("steps").len(), 1);
    }
}

on_both_backends! {
    async fn no_fenced_write_lands_after_a_takeover(db: TestDb) {
        // The old owner writes as fast as it can on a short lease that it does not renew; the new
        // owner takes over the moment the lease expires. Every write the old owner starts after
        // the takeover returned must be refused, and exactly the acknowledged writes are stored.
        let (old_store, new_store) = (db.store().await, db.store().await);
        let held = workflow(&old_store, "wf", "old", 400).await;
        let taken_over = Arc::new(AtomicBool::new(false));
        let writer = {
            let (store, taken_over, fence) = (Arc::clone(&old_store), Arc::clone(&taken_over), held.fence());
            tokio::spawn(async move {
                let mut log = Vec::new();
                for i in 0..100_000 {
                    let started_after_takeover = taken_over.load(Ordering::SeqCst);
                    let result = store.fenced_write(&fence, vec![step("wf", &format!("old-{i}"))]).await;
                    let lost = matches!(result, Err(Error::LeaseLost { .. }));
                    assert!(lost || result.is_ok(), "write {i}: {result:?}");
                    log.push((format!("old-{i}"), result.is_ok(), started_after_takeover));
                    if lost && started_after_takeover && log.iter().rev().take(20).all(|e| !e.1) {
                        break;
                    }
                }
                log
            })
        };
        let started = Instant::now();
        let lease = loop {
            if let Some(lease) = new_store.acquire_lease("wf", "new", 60_000).await.expect("acquire") {
                break lease;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "no takeover after expiry");
        };
        taken_over.store(true, Ordering::SeqCst);
        new_store.fenced_write(&lease.fence(), vec![step("wf", "new-0")]).await.expect("new owner writes");
        let log = writer.await.expect("writer");

        let late: Vec<_> = log.iter().filter(|(_, ok, after)| *ok && *after).collect();
        assert!(late.is_empty(), "writes acknowledged after the takeover: {late:?}");
        let stored: Vec<String> = new_store.read_steps("wf").await.expect("steps")
            .into_iter().map(|s| s.step_id).collect();
        for (name, ok, _) in &log {
            assert_eq!(stored.contains(name), *ok, "{name}: acknowledged={ok}, stored={}", !ok);
        }
        assert!(log.iter().any(|(_, ok, _)| *ok), "the old owner never wrote: the test proved nothing");
        assert!(stored.contains(&"new-0".to_owned()));
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
                status: "completed".into(),
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
        Duration::from_secs(5),
        "the fenced write waits on the row lock",
        async || waiting_sessions().await == 1,
    )
    .await;
    let expiry = held.expires_at;
    eventually(Duration::from_secs(5), "the lease expired", async || {
        new_store.now().await.expect("now") > expiry
    })
    .await;

    let takeover = {
        let store = Arc::clone(&new_store);
        tokio::spawn(async move { store.acquire_lease("wf", "new", 60_000).await })
    };
    eventually(
        Duration::from_secs(5),
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
    assert_eq!(lease.epoch, held.epoch + 1);
    let stale = old_store
        .fenced_write(&held.fence(), vec![step("wf", "late")])
        .await;
    assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
    assert!(new_store.read_steps("wf").await.expect("steps").is_empty());
}

on_both_backends! {
    async fn a_workflow_that_ends_gives_its_lease_back_in_the_same_write_or_not_at_all(db: TestDb) {
        let store = db.store().await;
        let end = |workflow_id: &str| WriteOp::SetWorkflow {
            workflow_id: workflow_id.into(),
            status: "completed".into(),
            data: json!({"result": 1}),
        };

        // A write that fails keeps the lease: nobody else can take the workflow. (The release
        // comes first in the list, and is still applied last.)
        let held = workflow(&store, "wf", "node-a", 60_000).await;
        let failed = store
            .fenced_write(&held.fence(), vec![WriteOp::ReleaseLease, end("no-such-workflow")])
            .await;
        assert!(matches!(failed, Err(Error::NotFound(_))), "{failed:?}");
        assert!(store.acquire_lease("wf", "node-b", 60_000).await.expect("acquire").is_none(),
            "a failed write released the lease");

        // The end and the release commit together: the lease is free at once.
        store.fenced_write(&held.fence(), vec![end("wf"), WriteOp::ReleaseLease]).await.expect("end");
        assert_eq!(store.read_workflow("wf").await.expect("read").expect("row").status, "completed");
        let next = store.acquire_lease("wf", "node-b", 60_000).await.expect("acquire")
            .expect("the ended workflow's lease is free");
        assert_eq!(next.epoch, held.epoch + 1);

        // The old owner can no longer release (or end) anything: the new lease stands.
        let stale = store.fenced_write(&held.fence(), vec![WriteOp::ReleaseLease]).await;
        assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
        let lease = store.read_lease("wf").await.expect("read lease").expect("lease");
        assert_eq!((lease.owner.as_str(), lease.epoch), ("node-b", next.epoch));
        assert!(store.acquire_lease("wf", "node-c", 60_000).await.expect("acquire").is_none(),
            "a stale release freed the new owner's lease");
    }
}
