//! Dormant workflows (`WriteOp::GoDormant`, `dormant_workflows`): a workflow left to wait in the
//! store alone is held by no fence and taken over by nobody before its wake time, unless a
//! control or an event recorded for it (before or after it went dormant) wakes it at once; the
//! takeover that wakes it makes it an ordinary workflow again.

use serde_json::json;
use store::{
    ControlKind, Epoch, Error, Launch, LaunchLimits, Lease, NewControl, NewSentEvent, NewWorkflow,
    Orphaned, Purpose, TakeOver, Versions, WorkflowId, WriteOp,
};

use crate::harness::{Subject, conformance};

fn ours() -> Versions {
    Versions {
        runtime: "rt-1".into(),
        configuration: "cfg-1".into(),
    }
}

async fn launched<S: Subject>(store: &S, id: &str) -> Lease {
    let workflow = NewWorkflow {
        workflow_id: WorkflowId::new(id),
        user_id: "ada".into(),
        request_id: None,
        fingerprint: "fp".into(),
        data: json!({"runtime_version": "rt-1", "configuration_version": "cfg-1"}),
    };
    match store
        .launch_workflow(workflow, "node-a", 60_000, LaunchLimits::NONE)
        .await
    {
        Ok(Launch::Created { lease, .. }) => lease,
        other => panic!("{other:?}"),
    }
}

fn dormant(id: &str, wake_at_ms: Option<i64>, event_names: &[&str]) -> WriteOp {
    WriteOp::GoDormant {
        workflow_id: WorkflowId::new(id),
        wake_at_ms,
        event_names: event_names.iter().map(|name| (*name).to_owned()).collect(),
    }
}

fn resume(id: &str) -> NewControl {
    NewControl {
        workflow_id: WorkflowId::new(id),
        kind: ControlKind::Resume,
        step_id: "wait".into(),
        attempt: 1,
        body: json!({"input": 1}),
        created_by: Some("ada".into()),
    }
}

fn event(id: &str, event_id: &str, name: &str) -> NewSentEvent {
    NewSentEvent {
        workflow_id: WorkflowId::new(id),
        event_id: event_id.into(),
        name: name.into(),
        payload: json!({}),
        created_by: Some("ada".into()),
        bounds: store::EventBounds::NONE,
        stored_bytes_max: 0,
    }
}

async fn take<S: Subject>(store: &S, id: &str) -> TakeOver {
    store
        .take_over_workflow(
            &WorkflowId::new(id),
            "node-b",
            60_000,
            &ours(),
            Purpose::Recover,
        )
        .await
        .expect("take over")
}

fn orphan(id: &str) -> Orphaned {
    Orphaned {
        workflow_id: WorkflowId::new(id),
        cancel_pending: false,
    }
}

conformance! {
    async fn a_dormant_workflow_is_held_by_nobody_and_taken_only_once_its_time_came(db) {
        let store = db.store().await;
        let lease = launched(&*store, "wf").await;
        let wake_at_ms = (store.now().await.expect("now") * 1000.0) as i64 + 400;
        store.fenced_write(&lease.fence(), vec![dormant("wf", Some(wake_at_ms), &["paid"])]).await.expect("dormant");

        // The owner's fence holds nothing any more: a stale write is refused.
        let stale = store.fenced_write(&lease.fence(), vec![WriteOp::ReleaseLease]).await;
        assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
        // Nobody takes it before its time, nor lists it.
        assert_eq!(take(&*store, "wf").await, TakeOver::LeaseHeld);
        assert!(store.recoverable_workflows(10, &ours()).await.expect("list").is_empty());
        let dormancy = store.dormant_workflows(10, &ours()).await.expect("dormant");
        assert!(dormancy.due.is_empty(), "{dormancy:?}");
        let next = dormancy.next_wake_at.expect("a wake time");
        assert!((next * 1000.0 - wake_at_ms as f64).abs() < 2.0, "{next} for {wake_at_ms}");

        // Its time comes: recovery lists it, and the takeover wakes it (epoch + 1).
        db.pass(&*store, next).await;
        assert_eq!(store.recoverable_workflows(10, &ours()).await.expect("list"), vec![orphan("wf")]);
        let dormancy = store.dormant_workflows(10, &ours()).await.expect("dormant");
        assert_eq!((dormancy.due, dormancy.next_wake_at), (vec![orphan("wf")], None));
        let TakeOver::Taken(taken) = take(&*store, "wf").await else { panic!("not taken") };
        assert_eq!((taken.owner.as_str(), taken.epoch), ("node-b", Epoch::new(2)));
        let dormancy = store.dormant_workflows(10, &ours()).await.expect("dormant");
        assert_eq!((dormancy.due, dormancy.next_wake_at), (vec![], None), "the takeover woke it");
        store.fenced_write(&taken.fence(), vec![WriteOp::ReleaseLease]).await.expect("the new owner writes");
    }
}

conformance! {
    async fn a_control_or_an_event_wakes_a_dormant_workflow_at_once(db) {
        let store = db.store().await;
        for id in ["resumed", "sent"] {
            let lease = launched(&*store, id).await;
            store.fenced_write(&lease.fence(), vec![dormant(id, None, &["paid"])]).await.expect("dormant");
            assert_eq!(take(&*store, id).await, TakeOver::LeaseHeld, "{id} woke by itself");
        }
        let forever = store.dormant_workflows(10, &ours()).await.expect("dormant");
        assert_eq!(forever.next_wake_at, Some(store::DORMANT_FOREVER_S));

        store.put_control(resume("resumed")).await.expect("resume");
        // An event of a name it does not wait for leaves it asleep (2,000 of them once woke a
        // workflow 2,000 times); one of a name it waits for wakes it.
        store.send_event(event("sent", "e1", "other")).await.expect("send");
        assert_eq!(take(&*store, "sent").await, TakeOver::LeaseHeld, "woken by an event of another name");
        store.send_event(event("sent", "e2", "paid")).await.expect("send");
        for id in ["resumed", "sent"] {
            assert!(matches!(take(&*store, id).await, TakeOver::Taken(_)), "{id} not woken");
        }
    }
}

conformance! {
    async fn what_was_recorded_before_the_dormant_write_wakes_it_at_once(db) {
        let store = db.store().await;
        let resumed = launched(&*store, "resumed").await;
        store.put_control(resume("resumed")).await.expect("resume");
        store.fenced_write(&resumed.fence(), vec![dormant("resumed", None, &[])]).await.expect("dormant");
        assert!(matches!(take(&*store, "resumed").await, TakeOver::Taken(_)), "a pending control left it dormant");

        // An untaken event wakes it only if it is of a name the workflow waits for.
        let waited = launched(&*store, "waited").await;
        let unwaited = launched(&*store, "unwaited").await;
        store.send_event(event("waited", "e1", "paid")).await.expect("send");
        store.send_event(event("unwaited", "e1", "shipped")).await.expect("send");
        store.fenced_write(&waited.fence(), vec![dormant("waited", None, &["paid"])]).await.expect("dormant");
        store.fenced_write(&unwaited.fence(), vec![dormant("unwaited", None, &["paid"])]).await.expect("dormant");
        assert!(matches!(take(&*store, "waited").await, TakeOver::Taken(_)), "an untaken event left it dormant");
        assert_eq!(take(&*store, "unwaited").await, TakeOver::LeaseHeld);

        // A wake time already passed: at once too.
        let late = launched(&*store, "late").await;
        let past_ms = (store.now().await.expect("now") * 1000.0) as i64 - 1_000;
        store.fenced_write(&late.fence(), vec![dormant("late", Some(past_ms), &[])]).await.expect("dormant");
        assert!(matches!(take(&*store, "late").await, TakeOver::Taken(_)));
    }
}
