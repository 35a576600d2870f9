//! Launching workflows and recording controls: idempotency per user and
//! request id, cluster-wide limits counted atomically, one control row per decision, the journal
//! read in call order.

use std::sync::Arc;

use serde_json::json;
use store::{
    ControlKind, ControlWrite, Epoch, Error, Launch, LaunchLimits, NewControl, NewWorkflow, WriteOp,
};
use tokio::sync::Barrier;

use crate::harness::{Subject, conformance};

fn new_workflow(id: &str, user: &str, request: Option<&str>, fingerprint: &str) -> NewWorkflow {
    NewWorkflow {
        workflow_id: store::WorkflowId::new(id),
        user_id: user.to_owned(),
        request_id: request.map(str::to_owned),
        fingerprint: fingerprint.to_owned(),
        data: json!({"script": "return 1;"}),
    }
}

/// A workflow launched without limits, with its first lease.
async fn created<S: Subject>(store: &S, workflow: NewWorkflow) -> store::Lease {
    match store
        .launch_workflow(workflow, "node", 60_000, LaunchLimits::NONE)
        .await
        .expect("launch")
    {
        Launch::Created { lease, .. } => lease,
        other => panic!("not created: {other:?}"),
    }
}

fn decide(workflow: &str, body: serde_json::Value) -> NewControl {
    NewControl {
        workflow_id: store::WorkflowId::new(workflow),
        kind: ControlKind::Decide,
        step_id: "review".into(),
        attempt: 1,
        body,
        created_by: Some("ada".into()),
    }
}

conformance! {
    async fn a_launch_is_idempotent_per_user_and_request_id(db) {
        let store = db.store().await;
        let launch = |id: &str, user: &str, fingerprint: &str| {
            store.launch_workflow(new_workflow(id, user, Some("req-1"), fingerprint), "node-a", 60_000,
                LaunchLimits::NONE)
        };
        // A launch answers the row it wrote, as any read gives it, and its lease.
        let Launch::Created { row: written, lease } = launch("wf-1", "ada", "fp-1").await.expect("launch")
        else { panic!("not created") };
        let read = store.read_workflow(&store::WorkflowId::new("wf-1")).await.expect("read");
        assert_eq!(Some(&written), read.as_ref());
        assert_eq!((written.status, written.owner.as_deref()), (store::WorkflowStatus::Running, Some("node-a")));
        assert_eq!((lease.resource_id.as_str(), lease.epoch), ("wf-1", Epoch::FIRST));
        match launch("wf-2", "ada", "fp-1").await.expect("launch") {
            Launch::Existing(row) => assert_eq!(Some(row), read),
            other => panic!("the same request made {other:?}"),
        }
        let different = launch("wf-3", "ada", "fp-2").await;
        assert!(matches!(different, Err(Error::Conflict(ref m)) if m.contains("req-1")), "{different:?}");
        assert!(matches!(launch("wf-4", "bob", "fp-2").await.expect("launch"), Launch::Created { .. }),
            "request ids are per user");
        for absent in ["wf-2", "wf-3"] {
            assert_eq!(store.read_workflow(&store::WorkflowId::new(absent)).await.expect("read"), None);
        }
    }
}

conformance! {
    async fn concurrent_launches_never_exceed_the_per_owner_and_cluster_limits(db) {
        let limits = LaunchLimits { max_workflows: 6, max_workflows_per_owner: 4 };
        let stores: Vec<Arc<S>> = vec![db.store().await, db.store().await];
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
                Launch::Created { .. } => created += 1,
                Launch::Refused { limit, max } => refused.push((limit, max)),
                Launch::Existing(row) => panic!("no request was repeated: {row:?}"),
            }
        }
        assert_eq!(created, 4, "exactly max_workflows_per_owner launches are accepted");
        assert_eq!(refused, vec![(store::Limit::WorkflowsPerOwner, 4)]);

        let store = &stores[0];
        for n in 0..2 {
            let workflow = new_workflow(&format!("bob-{n}"), "bob", None, "fp");
            assert!(matches!(store.launch_workflow(workflow, "node", 60_000, limits).await.expect("launch"),
                Launch::Created { .. }));
        }
        let over = store.launch_workflow(new_workflow("carol-0", "carol", None, "fp"), "node", 60_000, limits)
            .await.expect("launch");
        assert_eq!(over, Launch::Refused { limit: store::Limit::Workflows, max: 6 });
        assert_eq!(store.read_workflow(&store::WorkflowId::from("carol-0")).await.expect("read"), None);
    }
}

conformance! {
    async fn limits_of_zero_launch_nothing_and_wide_limits_fill_exactly(db) {
        let store = db.store().await;
        for (limits, refused) in [
            (LaunchLimits { max_workflows: 0, max_workflows_per_owner: 5 }, store::Limit::Workflows),
            (LaunchLimits { max_workflows: 5, max_workflows_per_owner: 0 }, store::Limit::WorkflowsPerOwner),
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
                Launch::Created { .. } => created += 1,
                Launch::Refused { limit: store::Limit::Workflows, max: 40 } => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(created, 40);
    }
}

conformance! {
    async fn every_counted_status_holds_a_place_and_reconciliation_or_an_end_gives_it_back(db) {
        let store = db.store().await;
        let limits = LaunchLimits { max_workflows: 1, max_workflows_per_owner: 1 };
        let set = |id: &str, status: &str| WriteOp::SetWorkflow {
            workflow_id: store::WorkflowId::new(id), status: store::WorkflowStatus::parse(status).expect("a status"), data: json!({}),
        };
        let terminals = store::WorkflowStatus::ALL.into_iter().filter(|status| status.is_final());
        for (n, terminal) in terminals.map(store::WorkflowStatus::as_str).enumerate() {
            let id = format!("held-{n}");
            let fence = match store.launch_workflow(new_workflow(&id, "ada", None, "fp"), "node", 60_000, limits)
                .await.expect("launch")
            {
                Launch::Created { lease, .. } => lease.fence(),
                other => panic!("{terminal}: the place was not given back: {other:?}"),
            };
            for live in store::COUNTED_STATUSES {
                store.fenced_write(&fence, vec![set(&id, live)]).await.expect("set");
                let other = new_workflow(&format!("other-{n}-{live}"), "bob", None, "fp");
                assert_eq!(store.launch_workflow(other, "node", 60_000, limits).await.expect("launch"),
                    Launch::Refused { limit: store::Limit::Workflows, max: 1 }, "{live} gave its place away");
                let same_owner = LaunchLimits { max_workflows: 2, max_workflows_per_owner: 1 };
                let mine = new_workflow(&format!("mine-{n}-{live}"), "ada", None, "fp");
                assert_eq!(store.launch_workflow(mine, "node", 60_000, same_owner).await.expect("launch"),
                    Launch::Refused { limit: store::Limit::WorkflowsPerOwner, max: 1 });
            }
            // Waiting for an operator holds no place: another workflow may launch meanwhile.
            store.fenced_write(&fence, vec![set(&id, "needs_reconciliation")]).await.expect("set");
            let meanwhile = new_workflow(&format!("meanwhile-{n}"), "ada", None, "fp");
            let Launch::Created { lease, .. } = store.launch_workflow(meanwhile, "node", 60_000, limits)
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
            Launch::Created { .. }));
    }
}

conformance! {
    async fn a_finished_workflow_gives_its_place_back_and_a_lowered_limit_counts_what_is_live(db) {
        let store = db.store().await;
        let limits = LaunchLimits { max_workflows: 3, max_workflows_per_owner: 3 };
        let mut fences = Vec::new();
        for n in 0..3 {
            match store.launch_workflow(new_workflow(&format!("wf-{n}"), "ada", None, "fp"), "node", 60_000, limits)
                .await.expect("launch")
            {
                Launch::Created { lease, .. } => fences.push(lease.fence()),
                other => panic!("{other:?}"),
            }
        }
        let fourth = || new_workflow("wf-3", "ada", None, "fp");
        assert_eq!(store.launch_workflow(fourth(), "node", 60_000, limits).await.expect("launch"),
            Launch::Refused { limit: store::Limit::Workflows, max: 3 });
        let finish = |n: usize| WriteOp::SetWorkflow {
            workflow_id: format!("wf-{n}").into(), status: store::WorkflowStatus::Completed, data: json!({}),
        };
        store.fenced_write(&fences[0], vec![finish(0)]).await.expect("finish");
        assert!(matches!(store.launch_workflow(fourth(), "node", 60_000, limits).await.expect("launch"),
            Launch::Created { .. }), "a finished workflow's place was not given back");

        // The limit drops to 2 with 3 live: nothing more until fewer than 2 are.
        let lowered = LaunchLimits { max_workflows: 2, max_workflows_per_owner: 2 };
        let next = |id: &str| new_workflow(id, "bob", None, "fp");
        assert_eq!(store.launch_workflow(next("bob-0"), "node", 60_000, lowered).await.expect("launch"),
            Launch::Refused { limit: store::Limit::Workflows, max: 2 });
        store.fenced_write(&fences[1], vec![finish(1)]).await.expect("finish");
        store.fenced_write(&fences[2], vec![finish(2)]).await.expect("finish");
        assert!(matches!(store.launch_workflow(next("bob-1"), "node", 60_000, lowered).await.expect("launch"),
            Launch::Created { .. }));
        assert_eq!(store.launch_workflow(next("bob-2"), "node", 60_000, lowered).await.expect("launch"),
            Launch::Refused { limit: store::Limit::Workflows, max: 2 });

        // Twins with one request_id at once, through two pools: one workflow, and every twin is
        // told about it.
        let stores = [store, db.store().await];
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
                Launch::Created { lease, .. } => created.push(lease.resource_id),
                Launch::Existing(row) => existing.push(row.workflow_id),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(created.len(), 1, "{created:?}");
        assert!(existing.iter().all(|id| *id == created[0]), "{existing:?} vs {created:?}");
    }
}

conformance! {
    async fn identical_decisions_leave_one_control_row_and_a_different_one_conflicts(db) {
        let stores = [db.store().await, db.store().await];
        created(&*stores[0], new_workflow("wf", "ada", None, "fp")).await;
        let approve = json!({"decision": "approve", "artifactVersion": 1});
        let before = stores[0].now().await.expect("now");
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
        let mut recorded = Vec::new();
        for write in writes {
            match write.await.expect("join").expect("put") {
                ControlWrite::Recorded(row) => recorded.push(row),
                ControlWrite::Repeated(row) => assert_eq!(row.body, approve),
            }
        }
        assert_eq!(recorded.len(), 1, "exactly one writer recorded the decision");
        let after = stores[0].now().await.expect("now");
        let controls = stores[0].read_controls(&store::WorkflowId::from("wf")).await.expect("controls");
        assert_eq!(controls, recorded, "read back as recorded");
        assert!(!controls[0].applied);
        // Issue 32: a control says when it was recorded, on the database clock.
        let recorded_at = controls[0].created_at;
        assert!(before <= recorded_at && recorded_at <= after, "{before} <= {recorded_at} <= {after}");

        let other = stores[0].put_control(decide("wf", json!({"decision": "approve", "artifactVersion": 2}))).await;
        assert!(matches!(other, Err(Error::Conflict(_))), "{other:?}");
        // Issue 32: the same decision with another comment is a repeat, answered with the
        // first; another decision is refused saying who decided what.
        let commented = NewControl {
            body: json!({"decision": approve["decision"], "artifactVersion": approve["artifactVersion"],
                         "comment": "looks fine"}),
            created_by: Some("bob".into()),
            ..decide("wf", approve.clone())
        };
        match stores[0].put_control(commented).await.expect("a repeat") {
            ControlWrite::Repeated(row) => {
                assert_eq!(row.body, approve);
                assert_eq!(row.created_by, decide("wf", approve.clone()).created_by);
                assert_eq!(row.created_at, recorded_at, "a repeat says when the first was recorded");
            }
            written => panic!("{written:?}"),
        }
        let contrary = stores[0].put_control(decide("wf", json!({"decision": "reject",
            "artifactVersion": approve["artifactVersion"]}))).await;
        let when = format!(" by ada at {};", store::rfc3339_utc(recorded_at));
        assert!(matches!(&contrary, Err(Error::Conflict(m))
            if m.contains("was already decided approve") && m.contains(&when)), "{contrary:?} {when}");
        let unknown = stores[0].put_control(decide("no-such-workflow", approve.clone())).await;
        assert!(matches!(unknown, Err(Error::NotFound(_))), "{unknown:?}");
    }
}

conformance! {
    async fn the_journal_reads_back_in_call_order_and_controls_are_applied_under_the_fence(db) {
        let store = db.store().await;
        let lease = created(&*store, new_workflow("wf", "ada", None, "fp")).await;
        let step = |seq: i32, step_id: &str| WriteOp::PutStep {
            workflow_id: "wf".into(),
            seq,
            step_id: step_id.into(),
            attempt: 1,
            status: store::StepStatus::Running,
            record: store::StepRecord::decode("agent", &json!({})).expect("a step record"),
        };
        // Step ids sort otherwise than the calls: the journal's key is not its order.
        store.fenced_write(&lease.fence(), vec![step(2, "a")]).await.expect("a");
        store.fenced_write(&lease.fence(), vec![step(0, "z"), step(1, "m")]).await.expect("z, m");
        let order: Vec<(i32, String)> = store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps")
            .into_iter().map(|s| (s.seq, s.step_id)).collect();
        assert_eq!(order, vec![(0, "z".into()), (1, "m".into()), (2, "a".into())]);

        let ControlWrite::Recorded(control) = store.put_control(decide("wf", json!({"decision": "approve"})))
            .await.expect("put") else { panic!("not recorded") };
        assert!(store.release_lease(&lease.fence()).await.expect("release"));
        let stale = store.fenced_write(&lease.fence(), vec![WriteOp::MarkControlApplied { control_id: control.id }]).await;
        assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
        assert!(!store.read_controls(&store::WorkflowId::from("wf")).await.expect("controls")[0].applied);
        let lease = store.acquire_lease(&store::WorkflowId::from("wf"), "node-b", 60_000).await.expect("acquire").expect("taken");
        store.fenced_write(&lease.fence(), vec![WriteOp::MarkControlApplied { control_id: control.id }])
            .await.expect("applied");
        assert!(store.read_controls(&store::WorkflowId::from("wf")).await.expect("controls")[0].applied);
    }
}

/// Sets a workflow's status (and its data) under `lease`.
async fn set<S: Subject>(store: &S, lease: &store::Lease, status: &str, data: serde_json::Value) {
    store
        .fenced_write(
            &lease.fence(),
            vec![WriteOp::SetWorkflow {
                workflow_id: lease.resource_id.clone(),
                status: store::WorkflowStatus::parse(status).expect("a status"),
                data,
            }],
        )
        .await
        .expect("set status");
}

conformance! {
    async fn a_takeover_follows_its_rules_and_steps_the_epoch(db) {
        use store::{Purpose, TakeOver, Versions};
        let store = db.store().await;
        let ours = Versions { runtime: "rt-1".into(), configuration: "cfg-1".into() };
        let written = json!({"runtime_version": "rt-1", "configuration_version": "cfg-1"});
        let missing = store.take_over_workflow(&store::WorkflowId::from("nope"), "node-b", 60_000, &ours, Purpose::Recover).await;
        assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");

        let mut workflow = new_workflow("wf", "ada", None, "fp");
        workflow.data = written.clone();
        let held = match store.launch_workflow(workflow, "node-a", 300, LaunchLimits::NONE).await.expect("launch") {
            Launch::Created { lease, .. } => lease,
            other => panic!("{other:?}"),
        };
        assert_eq!(store.take_over_workflow(&store::WorkflowId::from("wf"), "node-b", 60_000, &ours, Purpose::Recover).await.expect("take"),
            TakeOver::LeaseHeld);
        assert!(store.recoverable_workflows(10, &ours).await.expect("list").is_empty());
        db.pass(&store, held.expires_at).await;
        assert_eq!(store.recoverable_workflows(10, &ours).await.expect("list"),
            vec![store::Orphaned { workflow_id: "wf".into(), cancel_pending: false }]);
        let theirs = Versions { runtime: "rt-2".into(), configuration: "cfg-1".into() };
        assert!(store.recoverable_workflows(10, &theirs).await.expect("list").is_empty());
        assert!(matches!(
            store.take_over_workflow(&store::WorkflowId::from("wf"), "node-b", 60_000, &theirs, Purpose::Recover).await.expect("take"),
            TakeOver::Refused(_)));
        assert!(matches!(
            store.take_over_workflow(&store::WorkflowId::from("wf"), "node-b", 60_000, &ours, Purpose::Reconcile).await.expect("take"),
            TakeOver::Refused(_)));
        assert!(matches!(
            store.take_over_workflow(&store::WorkflowId::from("wf"), "node-b", 60_000, &ours, Purpose::Cancel).await.expect("take"),
            TakeOver::Refused(_)));
        assert_eq!(store.read_lease(&store::WorkflowId::from("wf")).await.expect("lease").map(|l| l.epoch), Some(Epoch::FIRST),
            "a refused takeover touched the lease");

        let TakeOver::Taken(taken) =
            store.take_over_workflow(&store::WorkflowId::from("wf"), "node-b", 60_000, &ours, Purpose::Recover).await.expect("take")
        else { panic!("not taken") };
        assert_eq!((taken.owner.as_str(), taken.epoch), ("node-b", Epoch::new(2)));
        assert_eq!(store.read_workflow(&store::WorkflowId::from("wf")).await.expect("read").and_then(|w| w.owner), Some("node-b".into()));
        assert_eq!(store.take_over_workflow(&store::WorkflowId::from("wf"), "node-c", 60_000, &ours, Purpose::Recover).await.expect("take"),
            TakeOver::LeaseHeld);

        // A pending cancellation: only a cancel takeover, under any runtime, may finish it.
        store.put_control(NewControl {
            workflow_id: "wf".into(), kind: ControlKind::Cancel, step_id: String::new(), attempt: 0,
            body: json!({}), created_by: None,
        }).await.expect("cancel");
        store.fenced_write(&taken.fence(), vec![WriteOp::ReleaseLease]).await.expect("release");
        assert_eq!(store.recoverable_workflows(10, &theirs).await.expect("list"),
            vec![store::Orphaned { workflow_id: "wf".into(), cancel_pending: true }]);
        assert!(matches!(
            store.take_over_workflow(&store::WorkflowId::from("wf"), "node-c", 60_000, &ours, Purpose::Recover).await.expect("take"),
            TakeOver::Refused(_)));
        let TakeOver::Taken(cancelling) =
            store.take_over_workflow(&store::WorkflowId::from("wf"), "node-c", 60_000, &theirs, Purpose::Cancel).await.expect("take")
        else { panic!("a cancel takeover was refused") };
        assert_eq!(cancelling.epoch, Epoch::new(3));

        set(&*store, &cancelling, "cancelled", written).await;
        store.fenced_write(&cancelling.fence(), vec![WriteOp::ReleaseLease]).await.expect("release");
        assert!(matches!(
            store.take_over_workflow(&store::WorkflowId::from("wf"), "node-d", 60_000, &ours, Purpose::Recover).await.expect("take"),
            TakeOver::NotRecoverable(_)));
        assert!(store.recoverable_workflows(10, &ours).await.expect("list").is_empty());
    }
}

conformance! {
    async fn listings_are_newest_first_by_page_and_filter(db) {
        use store::{ListCursor, ListFilter, StatusFilter};
        let store = db.store().await;
        let mut leases = Vec::new();
        for n in 0..5 {
            let user = if n % 2 == 0 { "ada" } else { "bob" };
            let request = format!("r-{n}");
            let workflow = new_workflow(&format!("wf-{n}"), user, Some(&request), "fp");
            leases.push(created(&*store, workflow).await);
            db.tick().await;
        }
        set(&*store, &leases[1], "completed", json!({})).await;
        store.fenced_write(&leases[2].fence(), vec![WriteOp::ReleaseLease]).await.expect("release");

        let ids = |listed: &[store::ListedWorkflow]| {
            listed.iter().map(|w| w.row.workflow_id.clone()).collect::<Vec<_>>()
        };
        let all = store.list_workflows(ListFilter { limit: 10, ..ListFilter::default() }).await.expect("list");
        assert_eq!(ids(&all).len(), 5);
        let created_at: Vec<f64> = all.iter().map(|w| w.row.created_at).collect();
        assert!(created_at.windows(2).all(|pair| pair[0] >= pair[1]), "not newest first: {created_at:?}");

        // Pages of two, each after the last of the previous one, see every workflow once.
        let mut paged = Vec::new();
        let mut after = None;
        loop {
            let page = store.list_workflows(ListFilter { limit: 2, after: after.clone(), ..ListFilter::default() })
                .await.expect("page");
            if page.is_empty() {
                break;
            }
            let last = &page[page.len() - 1].row;
            after = Some(ListCursor { created_at: last.created_at, workflow_id: last.workflow_id.clone() });
            paged.extend(ids(&page));
        }
        assert_eq!(paged, ids(&all));

        let adas = store.list_workflows(ListFilter { user_id: Some("ada".into()), limit: 10, ..ListFilter::default() })
            .await.expect("list");
        let mut adas = ids(&adas);
        adas.sort();
        assert_eq!(adas, ["wf-0", "wf-2", "wf-4"]);
        let done = store.list_workflows(ListFilter {
            status: Some(StatusFilter::Stored(store::WorkflowStatus::Completed)), limit: 10, ..ListFilter::default()
        }).await.expect("list");
        assert_eq!(ids(&done), ["wf-1"]);
        let recoverable = store.list_workflows(ListFilter {
            status: Some(StatusFilter::Recoverable), limit: 10, ..ListFilter::default()
        }).await.expect("list");
        assert_eq!(ids(&recoverable), ["wf-2"]);
        assert!(recoverable[0].recoverable);
        assert!(all.iter().filter(|w| w.row.workflow_id != "wf-2").all(|w| !w.recoverable));
        let by_request = store.list_workflows(ListFilter {
            user_id: Some("bob".into()), request_id: Some("r-3".into()), limit: 10, ..ListFilter::default()
        }).await.expect("list");
        assert_eq!(ids(&by_request), ["wf-3"]);
    }
}

conformance! {
    async fn a_running_workflow_whose_agent_waits_for_a_person_is_listed_waiting_for_input(db) {
        use store::{ListFilter, NewRun, RunStatus, StatusFilter, WorkflowStep};
        let store = db.store().await;
        let mut leases = Vec::new();
        for n in 0..4 {
            leases.push(created(&*store, new_workflow(&format!("wf-{n}"), "ada", None, "fp")).await);
            db.tick().await;
        }
        // wf-0 .. wf-2 each run one agent step; wf-3 runs none.
        for (n, lease) in leases.iter().enumerate().take(3) {
            let workflow_id = store::WorkflowId::new(format!("wf-{n}"));
            let run = NewRun {
                run_id: format!("run-{n}").into(), thread_id: format!("thread-{n}"), agent: "echo".into(),
                owner: "node".into(), lease_ms: 60_000, idempotency: None, metadata: json!({}),
                step: Some(WorkflowStep {
                    workflow_id: workflow_id.clone(), step_id: "s".into(), attempt: 1, slots_max: 8,
                    slots_per_user_max: 8, slots_reserved: 0, fence: lease.fence(),
                    journal: vec![WriteOp::PutStep {
                        workflow_id, seq: 0, step_id: "s".into(), attempt: 1,
                        status: store::StepStatus::Running,
                        record: store::StepRecord::decode("agent", &json!({})).expect("a step record"),
                    }],
                }),
            };
            store.admit_run(run).await.expect("admit");
        }
        let listed = |status: Option<StatusFilter>| {
            let store = &store;
            async move {
                let mut listed: Vec<(String, bool)> = store
                    .list_workflows(ListFilter { status, limit: 10, ..ListFilter::default() })
                    .await.expect("list").into_iter()
                    .map(|w| (w.row.workflow_id.into_string(), w.waiting_for_input)).collect();
                listed.sort();
                listed
            }
        };
        assert!(listed(Some(StatusFilter::WaitingForInput)).await.is_empty(), "nobody asks yet");
        for n in 0..3 {
            assert!(store.update_run_status(&store::RunId::from(format!("run-{n}").as_str()), "node",
                RunStatus::WaitingForInput, None).await.expect("ask"));
        }
        // wf-1 is cancelling: only a running workflow's status shows its agent's question.
        set(&*store, &leases[1], "cancelling", json!({})).await;
        // wf-2's owner is gone: recoverable is what it shows, and what an operator does first.
        store.fenced_write(&leases[2].fence(), vec![WriteOp::ReleaseLease]).await.expect("release");
        assert_eq!(listed(None).await, [("wf-0".into(), true), ("wf-1".into(), false),
            ("wf-2".into(), false), ("wf-3".into(), false)]);
        assert_eq!(listed(Some(StatusFilter::WaitingForInput)).await, [("wf-0".into(), true)]);
        // Still `running` as stored: the stored filter finds it, and nothing was written for it.
        let running = listed(Some(StatusFilter::Stored(store::WorkflowStatus::Running))).await;
        assert_eq!(running, [("wf-0".into(), true), ("wf-2".into(), false), ("wf-3".into(), false)]);
        let recoverable = listed(Some(StatusFilter::Recoverable)).await;
        assert_eq!(recoverable, [("wf-2".into(), false)]);
    }
}

conformance! {
    async fn only_a_finished_workflow_is_deleted_and_with_everything_it_had(db) {
        use store::{Deletion, NewRun, WorkflowStep};
        let store = db.store().await;
        let lease = created(&*store, new_workflow("wf", "ada", None, "fp")).await;
        let run = NewRun {
            run_id: "run".into(), thread_id: "thread".into(), agent: "echo".into(),
            owner: "node".into(), lease_ms: 60_000, idempotency: None, metadata: json!({}),
            step: Some(WorkflowStep {
                workflow_id: "wf".into(), step_id: "s".into(), attempt: 1, slots_max: 8, slots_per_user_max: 8, slots_reserved: 0,
                fence: lease.fence(),
                journal: vec![WriteOp::PutStep {
                    workflow_id: "wf".into(), seq: 0, step_id: "s".into(), attempt: 1,
                    status: store::StepStatus::Running, record: store::StepRecord::decode("agent", &json!({})).expect("a step record"),
                }],
            }),
        };
        store.admit_run(run).await.expect("admit");
        store.fenced_write(&lease.fence(), vec![WriteOp::PutArtifact {
            workflow_id: "wf".into(), version: 1, source_step_id: "s".into(), path: None,
            content: b"output".to_vec(), sha256: "h".into(),
        }]).await.expect("artifact");
        store.put_control(decide("wf", json!({"decision": "approve"}))).await.expect("decide");
        assert_eq!(store.delete_workflow(&store::WorkflowId::from("wf")).await.expect("delete"), Deletion::NotTerminal);
        assert_eq!(store.count_slots().await.expect("slots"), 1);

        set(&*store, &lease, "completed", json!({})).await;
        assert_eq!(store.delete_workflow(&store::WorkflowId::from("wf")).await.expect("delete"), Deletion::Deleted);
        assert_eq!(store.read_workflow(&store::WorkflowId::from("wf")).await.expect("read"), None);
        assert!(store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps").is_empty());
        assert!(store.read_controls(&store::WorkflowId::from("wf")).await.expect("controls").is_empty());
        assert_eq!(store.read_lease(&store::WorkflowId::from("wf")).await.expect("lease"), None);
        assert_eq!(store.read_events(&store::WorkflowId::from("wf"), 0, 10).await.expect("events"), None);
        assert_eq!(store.count_slots().await.expect("slots"), 0);
        let wf = store::WorkflowId::from("wf");
        assert_eq!(store.read_artifact(&wf, 1).await.expect("artifact"), None);
        assert_eq!(store.last_artifact_version(&wf).await.expect("version"), 0);
        assert_eq!(store.delete_workflow(&wf).await.expect("delete"), Deletion::NotFound);
        // The id is free again, and a workflow launched with it starts with nothing of the old one.
        created(&*store, new_workflow("wf", "ada", None, "fp")).await;
        assert!(store.read_steps(&wf).await.expect("steps").is_empty());
        assert_eq!(store.last_artifact_version(&wf).await.expect("version"), 0);
        let page = store.read_events(&wf, 0, 10).await.expect("events").expect("launched");
        assert_eq!(page.events.iter().map(|e| (e.seq, e.kind.as_str())).collect::<Vec<_>>(),
            [(1, "status")]);
    }
}

conformance! {
    async fn a_snapshot_reads_everything_a_get_shows_and_pending_controls_are_found_by_owner(db) {
        use store::{NewRun, RunStatus, WorkflowStep};
        let store = db.store().await;
        let lease = created(&*store, new_workflow("wf", "ada", None, "fp")).await;
        assert_eq!(store.workflows_with_pending_controls("node").await.expect("pending"), Vec::<store::WorkflowId>::new());
        store.fenced_write(&lease.fence(), vec![
            WriteOp::PutStep {
                workflow_id: "wf".into(), seq: 0, step_id: "review".into(), attempt: 1,
                status: store::StepStatus::Running, record: store::StepRecord::decode("humanCheckpoint", &json!({"n": 1})).expect("a step record"),
            },
            WriteOp::PutArtifact {
                workflow_id: "wf".into(), version: 1, source_step_id: "draft".into(), path: None,
                content: b"draft".to_vec(), sha256: "h1".into(),
            },
        ]).await.expect("journal");
        let ControlWrite::Recorded(control) = store.put_control(decide("wf", json!({"decision": "approve"})))
            .await.expect("decide") else { panic!("not recorded") };
        assert_eq!(store.workflows_with_pending_controls("node").await.expect("pending"), ["wf"]);
        assert!(store.workflows_with_pending_controls("other-node").await.expect("pending").is_empty());
        let run = NewRun {
            run_id: "run".into(), thread_id: "thread".into(), agent: "echo".into(),
            owner: "node".into(), lease_ms: 60_000, idempotency: None, metadata: json!({}),
            step: Some(WorkflowStep {
                workflow_id: "wf".into(), step_id: "ask".into(), attempt: 1, slots_max: 8, slots_per_user_max: 8, slots_reserved: 0,
                fence: lease.fence(), journal: Vec::new(),
            }),
        };
        store.admit_run(run).await.expect("admit");
        let snapshot = store.read_snapshot(&store::WorkflowId::from("wf"), 100, 100).await.expect("snapshot").expect("wf");
        assert!(snapshot.approval_runs.is_empty(), "a run that asked nothing is listed");
        store.update_run_status(&store::RunId::from("run"), "node", RunStatus::WaitingForInput,
            Some(json!({"hitl_approval": {"request_id": "r"}}))).await.expect("ask");

        let snapshot = store.read_snapshot(&store::WorkflowId::from("wf"), 100, 100).await.expect("snapshot").expect("wf");
        assert_eq!(snapshot.row, store.read_workflow(&store::WorkflowId::from("wf")).await.expect("read").expect("row"));
        assert_eq!(snapshot.lease, Some(lease.clone()));
        assert!(snapshot.db_now < lease.expires_at);
        assert!(snapshot.steps.is_empty(), "a checkpoint is not a step");
        assert_eq!(snapshot.checkpoints, store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps"));
        assert_eq!(snapshot.controls, vec![control.clone()]);
        assert_eq!(snapshot.approval_runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), ["run"]);
        let artifact = &snapshot.artifacts[0];
        assert_eq!((artifact.version, artifact.bytes, artifact.path.as_deref(), artifact.sha256.as_str()),
            (1, 5, None, "h1"));
        assert_eq!(store.read_artifact(&store::WorkflowId::from("wf"), 1).await.expect("artifact").map(|a| a.content), Some(b"draft".to_vec()));
        assert_eq!(store.read_artifact(&store::WorkflowId::from("wf"), 2).await.expect("artifact"), None);

        store.fenced_write(&lease.fence(), vec![WriteOp::MarkControlApplied { control_id: control.id }])
            .await.expect("applied");
        assert!(store.workflows_with_pending_controls("node").await.expect("pending").is_empty());
    }
}

conformance! {
    async fn steps_and_artifacts_are_read_a_page_at_a_time_in_journal_order(db) {
        use store::{NewRun, RunStatus, StepPosition, WorkflowStep};
        let store = db.store().await;
        let wf = store::WorkflowId::from("wf");
        let lease = created(&*store, new_workflow("wf", "ada", None, "fp")).await;
        // (seq, step, attempt, kind): checkpoints between the steps, a step tried twice, and
        // written backwards, so that only the journal's order can put them in order.
        let journal = [
            (0, "s0", 1, "agent"), (1, "s1", 1, "agent"), (2, "p2", 1, "pause"),
            (3, "s3", 1, "agent"), (3, "s3", 2, "agent"), (4, "s4", 1, "captureArtifact"),
            (5, "read:5", 1, "readArtifact"), (6, "c6", 1, "humanCheckpoint"),
            (7, "s7", 1, "agent"), (8, "s8", 1, "agent"), (9, "s9", 1, "agent"),
            (10, "s10", 1, "agent"), (11, "s11", 1, "agent"),
        ];
        let mut ops: Vec<WriteOp> = journal.iter().rev().map(|&(seq, step_id, attempt, kind)| WriteOp::PutStep {
            workflow_id: "wf".into(), seq, step_id: step_id.into(), attempt,
            status: store::StepStatus::Completed,
            record: store::StepRecord::decode(kind, &json!({"seq": seq})).expect("a step record"),
        }).collect();
        ops.extend((1..=7_i64).rev().map(|version| WriteOp::PutArtifact {
            workflow_id: "wf".into(), version, source_step_id: "s0".into(), path: None,
            content: vec![b'x'; 3], sha256: format!("h{version}"),
        }));
        store.fenced_write(&lease.fence(), ops).await.expect("journal");
        // s1's agent asked and was answered; s10's waits for its answer.
        for (step_id, thread) in [("s1", "t1"), ("s10", "t10")] {
            store.admit_run(NewRun {
                run_id: format!("run-{step_id}").into(), thread_id: thread.into(), agent: "echo".into(),
                owner: "node".into(), lease_ms: 60_000, idempotency: None, metadata: json!({}),
                step: Some(WorkflowStep {
                    workflow_id: "wf".into(), step_id: step_id.into(), attempt: 1, slots_max: 8,
                    slots_per_user_max: 8, slots_reserved: 0, fence: lease.fence(), journal: Vec::new(),
                }),
            }).await.expect("admit");
        }
        store.update_run_status(&store::RunId::from("run-s1"), "node", RunStatus::Running,
            Some(json!({"hitl_answer": {"request_id": "q1", "answer": {"decision": "approve"}}})))
            .await.expect("answered");
        store.update_run_status(&store::RunId::from("run-s10"), "node", RunStatus::WaitingForInput,
            Some(json!({"hitl_approval": {"request_id": "q10"}}))).await.expect("asks");

        let expected: Vec<(i32, i32)> = journal.iter()
            .filter(|(_, _, _, kind)| !store::CHECKPOINT_KINDS.iter().any(|checkpoint| checkpoint.as_str() == *kind))
            .map(|&(seq, _, attempt, _)| (seq, attempt)).collect();
        let (mut walked, mut pages, mut after) = (Vec::new(), Vec::new(), StepPosition::START);
        loop {
            let page = store.read_step_page(&wf, after, 3).await.expect("page");
            assert!(page.steps.len() <= 3, "a page of 3 held {}", page.steps.len());
            let runs: Vec<&str> = page.approval_runs.iter().map(|r| r.run_id.as_str()).collect();
            pages.push((page.steps.iter().map(|s| s.step_id.clone()).collect::<Vec<_>>(), runs.join(",")));
            let Some(last) = page.steps.last() else { break };
            after = StepPosition::of(last);
            walked.extend(page.steps.iter().map(|s| (s.seq, s.attempt)));
        }
        assert_eq!(walked, expected, "every step once, in journal order, and no checkpoint");
        assert_eq!(pages, [
            (vec!["s0".to_owned(), "s1".into(), "s3".into()], "run-s1,run-s10".to_owned()),
            (vec!["s3".to_owned(), "s4".into(), "read:5".into()], "run-s10".to_owned()),
            (vec!["s7".to_owned(), "s8".into(), "s9".into()], "run-s10".to_owned()),
            (vec!["s10".to_owned(), "s11".into()], "run-s10".to_owned()),
            (vec![], "run-s10".to_owned()),
        ], "an answered run comes with its step's page, a waiting one with every page");
        let whole = store.read_step_page(&wf, StepPosition::START, 11).await.expect("page");
        assert_eq!(whole.steps.len(), 11);
        assert!(store.read_step_page(&store::WorkflowId::from("nothing"), StepPosition::START, 3)
            .await.expect("page").steps.is_empty());

        let snapshot = store.read_snapshot(&wf, 3, 2).await.expect("snapshot").expect("wf");
        assert_eq!(snapshot.steps.iter().map(|s| s.step_id.as_str()).collect::<Vec<_>>(), ["s0", "s1", "s3"]);
        assert_eq!(snapshot.checkpoints.iter().map(|s| s.step_id.as_str()).collect::<Vec<_>>(), ["p2", "c6"],
            "the checkpoints are whole, whatever the page");
        assert_eq!(snapshot.approval_runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), ["run-s1", "run-s10"]);
        assert_eq!(snapshot.artifacts.iter().map(|a| a.version).collect::<Vec<_>>(), [1, 2]);
        let later = store.read_snapshot(&wf, 1, 1).await.expect("snapshot").expect("wf");
        assert_eq!(later.approval_runs.iter().map(|r| r.run_id.as_str()).collect::<Vec<_>>(), ["run-s10"],
            "s1's answer is not on a page of s0 alone");

        let mut versions = Vec::new();
        let mut after = 0;
        loop {
            let page = store.read_artifact_page(&wf, after, 3).await.expect("artifacts");
            assert!(page.len() <= 3);
            let Some(last) = page.last() else { break };
            after = last.version;
            versions.extend(page.iter().map(|a| (a.version, a.bytes, a.sha256.clone())));
        }
        assert_eq!(versions, (1..=7).map(|v| (v, 3, format!("h{v}"))).collect::<Vec<_>>());
        assert!(store.read_artifact_page(&wf, 7, 3).await.expect("artifacts").is_empty());
    }
}

conformance! {
    async fn a_snapshot_is_one_moment_even_while_a_writer_commits_around_it(db) {
        use std::sync::atomic::{AtomicBool, Ordering};
        let store = db.store().await;
        let lease = created(&*store, new_workflow("wf", "ada", None, "fp")).await;
        let wf = store::WorkflowId::from("wf");
        let writing = AtomicBool::new(true);
        // Each write adds a step and an artifact in one transaction: a read that saw two moments
        // (its queries on both sides of a commit) would count one more of either.
        let writer = async {
            for n in 1..=150_i32 {
                store.fenced_write(&lease.fence(), vec![
                    WriteOp::PutStep {
                        workflow_id: "wf".into(), seq: n, step_id: format!("s{n}"), attempt: 1,
                        status: store::StepStatus::Completed, record: store::StepRecord::decode("agent", &json!({"n": n})).expect("a step record"),
                    },
                    WriteOp::PutArtifact {
                        workflow_id: "wf".into(), version: i64::from(n), source_step_id: format!("s{n}"),
                        path: None, content: n.to_string().into_bytes(), sha256: format!("h{n}"),
                    },
                ]).await.expect("write");
                // The simulation answers at once: let the reader in between.
                tokio::task::yield_now().await;
            }
            writing.store(false, Ordering::SeqCst);
        };
        let reader = async {
            let mut reads = 0;
            while writing.load(Ordering::SeqCst) {
                let snapshot = store.read_snapshot(&wf, 1_000, 1_000).await.expect("snapshot").expect("wf");
                assert_eq!(snapshot.steps.len(), snapshot.artifacts.len(),
                    "a snapshot saw a step without its artifact, or the reverse");
                reads += 1;
                tokio::task::yield_now().await;
            }
            reads
        };
        let ((), reads) = tokio::join!(writer, reader);
        assert!(reads > 0);
        let last = store.read_snapshot(&wf, 1_000, 1_000).await.expect("snapshot").expect("wf");
        assert_eq!((last.steps.len(), last.artifacts.len()), (150, 150));
    }
}

/// A status change this node commits cues its own subscribers at once, not only through the
/// `NOTIFY` its listening connection would hear: with that connection killed and kept out, a
/// waiter on the node that made the change still hears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_status_change_cues_this_nodes_subscribers_with_its_listener_down() {
    use std::time::Duration;
    use store::{Change, WorkflowStatus};
    let (_db, dropping) = crate::harness::TestDb::postgres().await;
    let url = dropping.url();
    let store = store::Store::open(
        &store::DatabaseUrl::Postgres(url.clone()),
        &store::StoreOptions::default(),
    )
    .await
    .expect("open");
    let mut changes = store.changes().subscribe();
    async fn next(
        changes: &mut tokio::sync::broadcast::Receiver<Change>,
    ) -> Result<Change, tokio::time::error::Elapsed> {
        tokio::time::timeout(Duration::from_secs(30), changes.recv())
            .await
            .map(|change| change.expect("the bus is open"))
    }
    // The listener's first connect ends with a resync: it listens from then on.
    assert_eq!(next(&mut changes).await, Ok(Change::Resync));
    let lease = created(&store, new_workflow("wf", "ada", None, "fp")).await;
    let wf = store::WorkflowId::from("wf");

    let (server, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let database: String = server
        .query_one("SELECT current_database()", &[])
        .await
        .expect("name")
        .get(0);
    let (admin, connection) = tokio_postgres::connect(
        &std::env::var("REINS_TEST_PG").expect("REINS_TEST_PG"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the cluster");
    tokio::spawn(connection);
    admin
        .execute(
            &format!("ALTER DATABASE {database} ALLOW_CONNECTIONS false"),
            &[],
        )
        .await
        .expect("keep new connections out");
    let killed: bool = server
        .query_one(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND application_name = $1",
            &[&store::LISTEN_APPLICATION_NAME],
        )
        .await
        .expect("terminate the listener")
        .get(0);
    assert!(killed, "the listener was found");

    // The pool's connection is still open: the change commits, and it is heard here at once.
    store
        .fenced_write(
            &lease.fence(),
            vec![WriteOp::SetWorkflow {
                workflow_id: wf.clone(),
                status: WorkflowStatus::Paused,
                data: json!({}),
            }],
        )
        .await
        .expect("paused");
    assert_eq!(next(&mut changes).await, Ok(Change::Status(wf.clone())));

    admin
        .execute(
            &format!("ALTER DATABASE {database} ALLOW_CONNECTIONS true"),
            &[],
        )
        .await
        .expect("let connections in");
    drop((store, server));
    dropping.drop_database().await;
}

/// A call given up on (`store::bounded`, what the store actor does past `store.call_timeout_ms`)
/// leaves its connection to nobody: with one connection in the pool and the abandoned call's
/// statement still waiting on the server, the next call gets a connection of its own and
/// answers at once, instead of queueing behind that statement (or, across a partition, behind
/// TCP's retransmissions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_abandoned_calls_connection_is_closed_not_reused() {
    use std::time::Duration;
    let (_db, dropping) = crate::harness::TestDb::postgres().await;
    let url = dropping.url();
    let options = store::StoreOptions {
        pool_size: 1,
        ..store::StoreOptions::default()
    };
    let store = store::Store::open(&store::DatabaseUrl::Postgres(url.clone()), &options)
        .await
        .expect("open");
    let lease = created(&store, new_workflow("wf", "ada", None, "fp")).await;
    let wf = store::WorkflowId::from("wf");
    // Another session locks the lease row: a renewal waits for it on the server.
    let (holder, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM extension_execution_leases WHERE resource_id = 'wf' FOR UPDATE",
        )
        .await
        .expect("lock the lease row");

    let abandoned = store::bounded(
        Duration::from_millis(300),
        store::Operation::RenewLease,
        store.renew_lease(&lease.fence(), 60_000),
    )
    .await;
    assert!(
        matches!(abandoned, Err(Error::OutcomeUnknown(_))),
        "{abandoned:?}"
    );
    assert_eq!(
        store.pool_status(),
        Some((0, 0)),
        "the abandoned call's connection left the pool"
    );
    // Queued behind the abandoned statement, the read would wait until the lock below is
    // released: the bound only tells that from a read on a fresh connection.
    let read = tokio::time::timeout(Duration::from_secs(60), store.read_lease(&wf)).await;
    assert!(matches!(read, Ok(Ok(Some(_)))), "{read:?}");
    assert_eq!(store.pool_status(), Some((1, 1)));

    holder.batch_execute("ROLLBACK").await.expect("unlock");
    drop((store, holder));
    dropping.drop_database().await;
}

/// Issue 29, item 5: on PostgreSQL, reads hold at most `pg_read_connections_max` of the pool's
/// connections. With a read on every one of those, each waiting on the server for a lock
/// another session holds, and one more read waiting for a place, a launch still gets a
/// connection of the pool and commits, while every read still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reads_never_take_the_connections_writes_need() {
    use std::sync::Arc;
    use std::time::Duration;
    let (_db, dropping) = crate::harness::TestDb::postgres().await;
    let url = dropping.url();
    let options = store::StoreOptions {
        pool_size: 4,
        pg_read_connections_max: 3,
        // Long enough that the read waiting for a place outlasts the test, and that no read
        // waiting on the server gives up.
        pool_wait_timeout: Duration::from_secs(60),
        lock_timeout: Duration::from_secs(300),
        statement_timeout: Duration::from_secs(300),
        ..store::StoreOptions::default()
    };
    let store = Arc::new(
        store::Store::open(&store::DatabaseUrl::Postgres(url.clone()), &options)
            .await
            .expect("open"),
    );
    created(&*store, new_workflow("wf", "ada", None, "fp")).await;
    // Another session holds the artifacts' table: a snapshot's read of it waits on the server
    // (preparing its statement already does).
    let (holder, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    holder
        .batch_execute("BEGIN; LOCK TABLE workflow_artifacts IN ACCESS EXCLUSIVE MODE")
        .await
        .expect("lock the artifacts");
    // The store's sessions are watched from one of their own, outside any transaction: inside
    // the holder's, `pg_stat_activity` would stay as its first look found it (under load, one or
    // two reads on the lock, never three).
    let (observer, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let on_the_lock = async || -> usize {
        let sessions: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'reins'
                    AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        usize::try_from(sessions).expect("a count")
    };
    // As many reads as the pool has connections: without a bound of their own, they take all.
    let reads: Vec<_> = (0..options.pool_size)
        .map(|_| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                store
                    .read_snapshot(&store::WorkflowId::from("wf"), 10, 10)
                    .await
            })
        })
        .collect();
    // Every place for reads taken, each by a read waiting on the server for the lock (so on a
    // connection of the pool), and the last read waiting for a place.
    let places_max = options.pg_read_connections_max;
    let settled = (places_max, Some((places_max, 1)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = (on_the_lock().await, store.read_places());
        assert!(
            seen.0 <= places_max,
            "more reads than their places wait on the server: {seen:?}"
        );
        if seen == settled {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reads never settled on their places and the lock: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let launched = store
        .launch_workflow(
            new_workflow("wf-2", "bob", None, "fp"),
            "node",
            60_000,
            LaunchLimits::NONE,
        )
        .await;
    assert!(
        matches!(launched, Ok(Launch::Created { .. })),
        "{launched:?}"
    );
    assert!(
        reads.iter().all(|read| !read.is_finished()),
        "the launch committed while every read still waited"
    );
    assert_eq!(
        (on_the_lock().await, store.read_places()),
        settled,
        "the reads still hold their places, and the last still waits for one"
    );

    holder.batch_execute("ROLLBACK").await.expect("unlock");
    for read in reads {
        let snapshot = read.await.expect("the read's task");
        assert!(matches!(snapshot, Ok(Some(_))), "{snapshot:?}");
    }
    drop((store, holder, observer));
    dropping.drop_database().await;
}
