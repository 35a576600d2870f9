//! Leases: one winner per takeover, strictly increasing epochs, renewal that is refused once the
//! lease is lost and never shortens a lease.

use std::sync::Arc;

use store::{Epoch, Error, Fence};
use tokio::sync::Barrier;

use crate::harness::{conformance, step, workflow};

conformance! {
    async fn two_contenders_race_for_an_expired_lease_and_exactly_one_wins(db) {
        const ROUNDS: usize = 200;
        let (store_a, store_b) = (db.store().await, db.store().await);
        let first = workflow(&*store_a, "wf", "seed", 60_000).await;
        assert!(store_a.release_lease(&first.fence()).await.expect("release"));
        let mut stale: Fence = first.fence();
        let mut last_epoch = first.epoch;
        for round in 0..ROUNDS {
            let barrier = Arc::new(Barrier::new(2));
            let contend = |store: Arc<S>, name: &'static str| {
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.acquire_lease(&store::WorkflowId::from("wf"), name, 60_000).await
                })
            };
            let a = contend(Arc::clone(&store_a), "node-a");
            let b = contend(Arc::clone(&store_b), "node-b");
            let (a, b) = (a.await.expect("join").expect("a"), b.await.expect("join").expect("b"));
            let winner = match (a, b) {
                (Some(lease), None) | (None, Some(lease)) => lease,
                (a, b) => panic!("round {round}: winners {a:?} and {b:?}"),
            };
            assert_eq!(winner.epoch, last_epoch.next(), "round {round}: epochs must step by one");
            last_epoch = winner.epoch;

            let refused = store_a.fenced_write(&stale, vec![step("wf", &format!("stale-{round}"))]).await;
            assert!(matches!(refused, Err(Error::LeaseLost { .. })), "round {round}: {refused:?}");
            store_b
                .fenced_write(&winner.fence(), vec![step("wf", &format!("won-{round}"))])
                .await
                .expect("the winner writes");
            assert!(store_a.release_lease(&winner.fence()).await.expect("release"));
            stale = winner.fence();
        }
        let steps = store_a.read_steps(&store::WorkflowId::from("wf")).await.expect("steps");
        assert!(steps.iter().all(|s| s.step_id.starts_with("won-")), "a stale write left a trace");
        assert_eq!(steps.len(), ROUNDS);
    }
}

conformance! {
    async fn renewal_is_refused_after_a_takeover_and_never_shortens_a_lease(db) {
        let (store_a, store_b) = (db.store().await, db.store().await);
        let held = workflow(&*store_a, "wf", "node-a", 60_000).await;

        let (long, _) = store_a.renew_lease(&held.fence(), 120_000).await.expect("renew long");
        assert!(long.expires_at >= held.expires_at);
        let (short, _) = store_a.renew_lease(&held.fence(), 10).await.expect("renew short");
        assert_eq!(short.expires_at, long.expires_at, "a renewal moved expires_at backwards");
        assert_eq!(store_a.read_lease(&store::WorkflowId::from("wf")).await.expect("read").map(|l| l.expires_at), Some(long.expires_at));
        assert_eq!(store_b.acquire_lease(&store::WorkflowId::from("wf"), "node-b", 60_000).await.expect("acquire"), None,
            "a valid lease was taken over");

        // A short lease that runs out: renewal after the deadline is refused even before anyone
        // takes over, and stays refused after the takeover.
        let brief = workflow(&*store_a, "wf-brief", "node-a", 300).await;
        db.pass(&store_a, brief.expires_at).await;
        let late = store_a.renew_lease(&brief.fence(), 60_000).await;
        assert!(matches!(late, Err(Error::LeaseLost { .. })), "{late:?}");
        let taken = store_b.acquire_lease(&store::WorkflowId::from("wf-brief"), "node-b", 60_000).await.expect("acquire")
            .expect("an expired lease can be taken over");
        assert_eq!(taken.epoch, brief.epoch.next());
        let renewed = store_a.renew_lease(&brief.fence(), 60_000).await;
        assert!(matches!(renewed, Err(Error::LeaseLost { .. })), "{renewed:?}");
        assert!(!store_a.release_lease(&brief.fence()).await.expect("release"),
            "a lost lease was released");
        store_b.renew_lease(&taken.fence(), 60_000).await.expect("the new owner renews");
        let lease = store_a.read_lease(&store::WorkflowId::from("wf-brief")).await.expect("read").expect("row");
        assert_eq!((lease.owner.as_str(), lease.epoch), ("node-b", taken.epoch));
    }
}

conformance! {
    async fn a_free_resource_is_leased_at_epoch_one_and_a_released_one_at_once(db) {
        let store = db.store().await;
        assert_eq!(store.read_lease(&store::WorkflowId::from("job")).await.expect("read"), None);
        let first = store.acquire_lease(&store::WorkflowId::from("job"), "node-a", 60_000).await.expect("acquire").expect("free");
        assert_eq!((first.owner.as_str(), first.epoch), ("node-a", Epoch::FIRST));
        assert!(first.expires_at > store.now().await.expect("now"));
        assert_eq!(store.acquire_lease(&store::WorkflowId::from("job"), "node-b", 60_000).await.expect("acquire"), None);
        assert!(store.release_lease(&first.fence()).await.expect("release"));
        assert!(!store.release_lease(&first.fence()).await.expect("release"), "released twice");
        let second = store.acquire_lease(&store::WorkflowId::from("job"), "node-b", 60_000).await.expect("acquire")
            .expect("a released lease is free at once");
        assert_eq!((second.owner.as_str(), second.epoch), ("node-b", Epoch::new(2)));
        assert_eq!(store.read_lease(&store::WorkflowId::from("job")).await.expect("read"), Some(second));
    }
}
