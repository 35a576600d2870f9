//! Launching workflows and recording controls, on both backends: idempotency per user and
//! request id, cluster-wide limits counted atomically, one control row per decision, the journal
//! read in call order.

use std::sync::Arc;

use serde_json::json;
use store::{ControlWrite, Error, Launch, LaunchLimits, NewControl, NewWorkflow, Store, WriteOp};
use tokio::sync::Barrier;

use crate::harness::on_both_backends;

fn new_workflow(id: &str, user: &str, request: Option<&str>, fingerprint: &str) -> NewWorkflow {
    NewWorkflow {
        workflow_id: id.to_owned(),
        user_id: user.to_owned(),
        request_id: request.map(str::to_owned),
        fingerprint: fingerprint.to_owned(),
        data: json!({"script": "return 1;"}),
    }
}

fn decide(workflow: &str, body: serde_json::Value) -> NewControl {
    NewControl {
        workflow_id: workflow.to_owned(),
        kind: "decide".into(),
        step_id: "review".into(),
        attempt: 1,
        body,
        created_by: Some("ada".into()),
    }
}

on_both_backends! {
    async fn a_launch_is_idempotent_per_user_and_request_id(db: TestDb) {
        let store = db.store().await;
        let launch = |id: &str, user: &str, fingerprint: &str| {
            store.launch_workflow(new_workflow(id, user, Some("req-1"), fingerprint), "node-a", 60_000,
                LaunchLimits::NONE)
        };
        assert!(matches!(launch("wf-1", "ada", "fp-1").await.expect("launch"), Launch::Created(_)));
        match launch("wf-2", "ada", "fp-1").await.expect("launch") {
            Launch::Existing(row) => assert_eq!(row.workflow_id, "wf-1"),
            other => panic!("the same request made {other:?}"),
        }
        let different = launch("wf-3", "ada", "fp-2").await;
        assert!(matches!(different, Err(Error::Conflict(ref m)) if m.contains("req-1")), "{different:?}");
        assert!(matches!(launch("wf-4", "bob", "fp-2").await.expect("launch"), Launch::Created(_)),
            "request ids are per user");
        for absent in ["wf-2", "wf-3"] {
            assert_eq!(store.read_workflow(absent).await.expect("read"), None);
        }
    }
}

on_both_backends! {
    async fn concurrent_launches_never_exceed_the_per_owner_and_cluster_limits(db: TestDb) {
        let limits = LaunchLimits { max_workflows: 6, max_workflows_per_owner: 4 };
        let stores: Vec<Arc<Store>> = vec![db.store().await, db.store().await];
        let barrier = Arc::new(Barrier::new(5));
        let launches: Vec<_> = (0..5)
            .map(|n| {
                let (store, barrier) = (Arc::clone(&stores[n % 2]), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    let workflow = new_workflow(&format!("wf-{n}"), "ada", Some(&format!("r-{n}")), "fp");
                    store.launch_workflow(workflow, "node", 60_000, limits).await
                })
            })
            .collect();
        let mut created = 0;
        let mut refused = Vec::new();
        for launch in launches {
            match launch.await.expect("join").expect("launch") {
                Launch::Created(_) => created += 1,
                Launch::Refused { limit, max } => refused.push((limit, max)),
                Launch::Existing(row) => panic!("no request was repeated: {row:?}"),
            }
        }
        assert_eq!(created, 4, "exactly max_workflows_per_owner launches are accepted");
        assert_eq!(refused, vec![("max_workflows_per_owner", 4)]);

        let store = &stores[0];
        for n in 0..2 {
            let workflow = new_workflow(&format!("bob-{n}"), "bob", None, "fp");
            assert!(matches!(store.launch_workflow(workflow, "node", 60_000, limits).await.expect("launch"),
                Launch::Created(_)));
        }
        let over = store.launch_workflow(new_workflow("carol-0", "carol", None, "fp"), "node", 60_000, limits)
            .await.expect("launch");
        assert_eq!(over, Launch::Refused { limit: "max_workflows", max: 6 });
        assert_eq!(store.read_workflow("carol-0").await.expect("read"), None);
    }
}

on_both_backends! {
    async fn limits_of_zero_launch_nothing_and_wide_limits_fill_exactly(db: TestDb) {
        let store = Arc::new(db.store().await);
        for (limits, refused) in [
            (LaunchLimits { max_workflows: 0, max_workflows_per_owner: 5 }, "max_workflows"),
            (LaunchLimits { max_workflows: 5, max_workflows_per_owner: 0 }, "max_workflows_per_owner"),
        ] {
            let launch = store.launch_workflow(new_workflow("none", "ada", None, "fp"), "node", 60_000, limits)
                .await.expect("launch");
            assert_eq!(launch, Launch::Refused { limit: refused, max: 0 });
        }
        // 48 users racing for 40 places: the first take random free numbers, the last find them
        // taken and count; either way exactly 40 launch.
        let limits = LaunchLimits { max_workflows: 40, max_workflows_per_owner: 40 };
        let barrier = Arc::new(Barrier::new(48));
        let launches: Vec<_> = (0..48)
            .map(|n| {
                let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    let workflow = new_workflow(&format!("wide-{n}"), &format!("user-{n}"), None, "fp");
                    store.launch_workflow(workflow, "node", 60_000, limits).await.expect("launch")
                })
            })
            .collect();
        let mut created = 0;
        for launch in launches {
            match launch.await.expect("join") {
                Launch::Created(_) => created += 1,
                Launch::Refused { limit: "max_workflows", max: 40 } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(created, 40);
    }
}

on_both_backends! {
    async fn every_counted_status_holds_a_place_and_reconciliation_or_an_end_gives_it_back(db: TestDb) {
        let store = db.store().await;
        let limits = LaunchLimits { max_workflows: 1, max_workflows_per_owner: 1 };
        let set = |id: &str, status: &str| WriteOp::SetWorkflow {
            workflow_id: id.to_owned(), status: status.to_owned(), data: json!({}),
        };
        for (n, terminal) in store::TERMINAL_STATUSES.iter().enumerate() {
            let id = format!("held-{n}");
            let fence = match store.launch_workflow(new_workflow(&id, "ada", None, "fp"), "node", 60_000, limits)
                .await.expect("launch")
            {
                Launch::Created(lease) => lease.fence(),
                other => panic!("{terminal}: the place was not given back: {other:?}"),
            };
            for live in store::COUNTED_STATUSES {
                store.fenced_write(&fence, vec![set(&id, live)]).await.expect("set");
                let other = new_workflow(&format!("other-{n}-{live}"), "bob", None, "fp");
                assert_eq!(store.launch_workflow(other, "node", 60_000, limits).await.expect("launch"),
                    Launch::Refused { limit: "max_workflows", max: 1 }, "{live} gave its place away");
                let same_owner = LaunchLimits { max_workflows: 2, max_workflows_per_owner: 1 };
                let mine = new_workflow(&format!("mine-{n}-{live}"), "ada", None, "fp");
                assert_eq!(store.launch_workflow(mine, "node", 60_000, same_owner).await.expect("launch"),
                    Launch::Refused { limit: "max_workflows_per_owner", max: 1 });
            }
            // Waiting for an operator holds no place: another workflow may launch meanwhile.
            store.fenced_write(&fence, vec![set(&id, "needs_reconciliation")]).await.expect("set");
            let meanwhile = new_workflow(&format!("meanwhile-{n}"), "ada", None, "fp");
            let Launch::Created(lease) = store.launch_workflow(meanwhile, "node", 60_000, limits)
                .await.expect("launch")
            else {
                panic!("needs_reconciliation kept its place");
            };
            store.fenced_write(&lease.fence(), vec![set(&format!("meanwhile-{n}"), terminal)])
                .await.expect("end it");
            store.fenced_write(&fence, vec![set(&id, terminal)]).await.expect("set");
        }
        let last = new_workflow("last", "bob", None, "fp");
        assert!(matches!(store.launch_workflow(last, "node", 60_000, limits).await.expect("launch"),
            Launch::Created(_)));
    }
}

on_both_backends! {
    async fn a_finished_workflow_gives_its_place_back_and_a_lowered_limit_counts_what_is_live(db: TestDb) {
        let store = db.store().await;
        let limits = LaunchLimits { max_workflows: 3, max_workflows_per_owner: 3 };
        let mut fences = Vec::new();
        for n in 0..3 {
            match store.launch_workflow(new_workflow(&format!("wf-{n}"), "ada", None, "fp"), "node", 60_000, limits)
                .await.expect("launch")
            {
                Launch::Created(lease) => fences.push(lease.fence()),
                other => panic!("{other:?}"),
            }
        }
        let fourth = || new_workflow("wf-3", "ada", None, "fp");
        assert_eq!(store.launch_workflow(fourth(), "node", 60_000, limits).await.expect("launch"),
            Launch::Refused { limit: "max_workflows", max: 3 });
        let finish = |n: usize| WriteOp::SetWorkflow {
            workflow_id: format!("wf-{n}"), status: "completed".into(), data: json!({}),
        };
        store.fenced_write(&fences[0], vec![finish(0)]).await.expect("finish");
        assert!(matches!(store.launch_workflow(fourth(), "node", 60_000, limits).await.expect("launch"),
            Launch::Created(_)), "a finished workflow's place was not given back");

        // The limit drops to 2 with 3 live: nothing more until fewer than 2 are.
        let lowered = LaunchLimits { max_workflows: 2, max_workflows_per_owner: 2 };
        let next = |id: &str| new_workflow(id, "bob", None, "fp");
        assert_eq!(store.launch_workflow(next("bob-0"), "node", 60_000, lowered).await.expect("launch"),
            Launch::Refused { limit: "max_workflows", max: 2 });
        store.fenced_write(&fences[1], vec![finish(1)]).await.expect("finish");
        store.fenced_write(&fences[2], vec![finish(2)]).await.expect("finish");
        assert!(matches!(store.launch_workflow(next("bob-1"), "node", 60_000, lowered).await.expect("launch"),
            Launch::Created(_)));
        assert_eq!(store.launch_workflow(next("bob-2"), "node", 60_000, lowered).await.expect("launch"),
            Launch::Refused { limit: "max_workflows", max: 2 });

        // Twins with one request_id at once, through two pools: one workflow, and every twin is
        // told about it.
        let stores = [Arc::new(store), Arc::new(db.store().await)];
        let barrier = Arc::new(Barrier::new(16));
        let twins: Vec<_> = (0..16)
            .map(|n| {
                let (store, barrier) = (Arc::clone(&stores[n % 2]), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    let twin = new_workflow(&format!("twin-{n}"), "carol", Some("once"), "fp");
                    store.launch_workflow(twin, "node", 60_000, LaunchLimits::NONE).await.expect("launch")
                })
            })
            .collect();
        let mut created = Vec::new();
        let mut existing = Vec::new();
        for twin in twins {
            match twin.await.expect("join") {
                Launch::Created(lease) => created.push(lease.resource_id),
                Launch::Existing(row) => existing.push(row.workflow_id),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(created.len(), 1, "{created:?}");
        assert!(existing.iter().all(|id| *id == created[0]), "{existing:?} vs {created:?}");
    }
}

on_both_backends! {
    async fn identical_decisions_leave_one_control_row_and_a_different_one_conflicts(db: TestDb) {
        let stores = [db.store().await, db.store().await];
        stores[0].create_workflow(new_workflow("wf", "ada", None, "fp"), "node", 60_000).await.expect("wf");
        let approve = json!({"decision": "approve", "artifactVersion": 1});
        let barrier = Arc::new(Barrier::new(8));
        let writes: Vec<_> = (0..8)
            .map(|n| {
                let (store, barrier, body) = (Arc::clone(&stores[n % 2]), Arc::clone(&barrier), approve.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.put_control(decide("wf", body)).await
                })
            })
            .collect();
        let mut recorded = 0;
        for write in writes {
            match write.await.expect("join").expect("put") {
                ControlWrite::Recorded(_) => recorded += 1,
                ControlWrite::Repeated(row) => assert_eq!(row.body, approve),
            }
        }
        assert_eq!(recorded, 1, "exactly one writer recorded the decision");
        let controls = stores[0].read_controls("wf").await.expect("controls");
        assert_eq!(controls.len(), 1);
        assert!(!controls[0].applied);

        let other = stores[0].put_control(decide("wf", json!({"decision": "approve", "artifactVersion": 2}))).await;
        assert!(matches!(other, Err(Error::Conflict(_))), "{other:?}");
        let unknown = stores[0].put_control(decide("no-such-workflow", approve.clone())).await;
        assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    }
}

on_both_backends! {
    async fn the_journal_reads_back_in_call_order_and_controls_are_applied_under_the_fence(db: TestDb) {
        let store = db.store().await;
        let lease = store.create_workflow(new_workflow("wf", "ada", None, "fp"), "node", 60_000).await.expect("wf");
        let step = |seq: i32, step_id: &str| WriteOp::PutStep {
            workflow_id: "wf".into(),
            seq,
            step_id: step_id.into(),
            attempt: 1,
            kind: "agent".into(),
            status: "running".into(),
            data: json!({}),
        };
        store.fenced_write(&lease.fence(), vec![step(2, "c")]).await.expect("c");
        store.fenced_write(&lease.fence(), vec![step(0, "a"), step(1, "b")]).await.expect("a, b");
        let order: Vec<(i32, String)> = store.read_steps("wf").await.expect("steps")
            .into_iter().map(|s| (s.seq, s.step_id)).collect();
        assert_eq!(order, vec![(0, "a".into()), (1, "b".into()), (2, "c".into())]);

        let ControlWrite::Recorded(control) = store.put_control(decide("wf", json!({"decision": "approve"})))
            .await.expect("put") else { panic!("not recorded") };
        assert!(store.release_lease(&lease.fence()).await.expect("release"));
        let stale = store.fenced_write(&lease.fence(), vec![WriteOp::MarkControlApplied { control_id: control.id }]).await;
        assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
        assert!(!store.read_controls("wf").await.expect("controls")[0].applied);
        let lease = store.acquire_lease("wf", "node-b", 60_000).await.expect("acquire").expect("taken");
        store.fenced_write(&lease.fence(), vec![WriteOp::MarkControlApplied { control_id: control.id }])
            .await.expect("applied");
        assert!(store.read_controls("wf").await.expect("controls")[0].applied);
    }
}
