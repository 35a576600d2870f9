//! Events sent to a workflow (`send_event`, `pending_events`, `WriteOp::TakeEvent`): stored once
//! per `event_id`, kept until a wait takes them, in the order sent, taken once; an ended
//! workflow takes none and nothing is written; the untaken ones are bounded in number and bytes.

use serde_json::{Value, json};
use store::{
    Error, EventBounds, EventSend, Limit, NewSentEvent, WorkflowId, WorkflowStatus, WriteOp,
};

use crate::harness::{conformance, workflow};

fn event(event_id: &str, name: &str, payload: Value) -> NewSentEvent {
    NewSentEvent {
        workflow_id: "wf".into(),
        event_id: event_id.into(),
        name: name.into(),
        payload,
        created_by: Some("ada".into()),
        bounds: EventBounds::NONE,
        stored_bytes_max: 0,
    }
}

/// Every name these tests send.
fn names() -> Vec<String> {
    vec!["paid".into(), "shipped".into()]
}

fn take(seq: i64, step_id: &str) -> WriteOp {
    WriteOp::TakeEvent {
        workflow_id: "wf".into(),
        seq,
        step_id: step_id.into(),
    }
}

conformance! {
    async fn an_event_is_stored_once_per_id_and_kept_in_order_until_taken(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let first = match store.send_event(event("e1", "paid", json!({"n": 1}))).await.expect("send") {
            EventSend::Stored(row) => row,
            other => panic!("{other:?}"),
        };
        assert_eq!((first.name.as_str(), &first.payload, first.created_by.as_deref()), ("paid", &json!({"n": 1}), Some("ada")));
        assert!(first.taken_by.is_none());
        // The same event again is a repeat naming the first row; another under its id, a conflict.
        match store.send_event(event("e1", "paid", json!({"n": 1}))).await.expect("resend") {
            EventSend::Repeated(row) => assert_eq!(row.seq, first.seq),
            other => panic!("{other:?}"),
        }
        let refused = store.send_event(event("e1", "paid", json!({"n": 2}))).await;
        assert!(matches!(&refused, Err(Error::Conflict(message)) if message.contains("\"e1\"")), "{refused:?}");
        let refused = store.send_event(event("e1", "shipped", json!({"n": 1}))).await;
        assert!(matches!(refused, Err(Error::Conflict(_))), "{refused:?}");
        store.send_event(event("e2", "shipped", json!({"n": 2}))).await.expect("send");
        store.send_event(event("e3", "paid", json!({"n": 3}))).await.expect("send");
        let pending = store.pending_events(&WorkflowId::from("wf"), names(), 100).await.expect("pending");
        let ids: Vec<&str> = pending.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2", "e3"], "in the order sent");
        assert!(pending.windows(2).all(|pair| pair[0].seq < pair[1].seq));

        // Taken by a step, an event is no longer pending; the same step again is a repeat.
        store.fenced_write(&lease.fence(), vec![take(first.seq, "wait-1")]).await.expect("take");
        store.fenced_write(&lease.fence(), vec![take(first.seq, "wait-1")]).await.expect("the same step again");
        let ids: Vec<String> = store.pending_events(&WorkflowId::from("wf"), names(), 100).await.expect("pending")
            .into_iter().map(|e| e.event_id).collect();
        assert_eq!(ids, ["e2", "e3"]);

        // Another step cannot take it: the whole write is refused, its step with it.
        let refused = store
            .fenced_write(&lease.fence(), vec![crate::harness::step("wf", "wait-2"), take(first.seq, "wait-2")])
            .await;
        assert!(matches!(refused, Err(Error::NotFound(_))), "{refused:?}");
        let steps = store.read_snapshot(&WorkflowId::from("wf"), 100, 100).await.expect("read").expect("wf").steps;
        assert!(steps.iter().all(|step| step.step_id != "wait-2"), "a refused take left its step");
        // Nor can any step take an event that does not exist.
        let refused = store.fenced_write(&lease.fence(), vec![take(first.seq + 1000, "wait-3")]).await;
        assert!(matches!(refused, Err(Error::NotFound(_))), "{refused:?}");
    }
}

conformance! {
    async fn an_ended_workflow_takes_no_event_and_an_unknown_one_is_not_found(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        store.send_event(event("early", "paid", json!(1))).await.expect("send");
        let end = WriteOp::SetWorkflow {
            workflow_id: "wf".into(),
            status: WorkflowStatus::Completed,
            data: json!({"script": "s"}),
        };
        store.fenced_write(&lease.fence(), vec![end, WriteOp::ReleaseLease]).await.expect("end");
        let refused = store.send_event(event("late", "paid", json!(null))).await.expect("send");
        assert_eq!(refused, EventSend::Ended(WorkflowStatus::Completed));
        let ids: Vec<String> = store.pending_events(&WorkflowId::from("wf"), names(), 100).await.expect("pending")
            .into_iter().map(|e| e.event_id).collect();
        assert_eq!(ids, ["early"], "an ended workflow stored an event");
        // A sender retrying after the end learns its event was stored, as before the end.
        let again = store.send_event(event("early", "paid", json!(1))).await.expect("send");
        assert!(matches!(again, EventSend::Repeated(ref row) if row.event_id == "early"), "{again:?}");
        let missing = store
            .send_event(NewSentEvent { workflow_id: "nope".into(), ..event("e", "paid", json!(null)) })
            .await;
        assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
    }
}

conformance! {
    /// Issue 39, item 2: a workflow kept every event sent to it that no wait took, uncounted.
    /// Its untaken events are bounded in number and in payload bytes: past either a new one is
    /// refused naming the limit, with nothing written, while a repeat of a stored one is still
    /// answered; a taken event makes room.
    async fn untaken_events_are_bounded_in_number_and_bytes(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let bounded = |event_id: &str, payload: Value| NewSentEvent {
            bounds: EventBounds { untaken_max: 3, untaken_bytes_max: 30 },
            ..event(event_id, "paid", payload)
        };
        let ten = || json!("12345678");
        let first = match store.send_event(bounded("e1", ten())).await.expect("send") {
            EventSend::Stored(row) => row,
            other => panic!("{other:?}"),
        };
        store.send_event(bounded("e2", ten())).await.expect("20 bytes");
        // 20 bytes held: 11 more would pass 30.
        let over = store.send_event(bounded("e3", json!("123456789"))).await;
        assert!(
            matches!(over, Err(Error::LimitReached(Limit::UntakenEventBytes { held: 20, max: 30 }))),
            "{over:?}"
        );
        store.send_event(bounded("e3", ten())).await.expect("30 bytes: at the bound");
        let over = store.send_event(bounded("e4", json!(1))).await;
        assert!(matches!(over, Err(Error::LimitReached(Limit::UntakenEvents { max: 3 }))), "{over:?}");
        let message = over.map(|_| ()).expect_err("refused").to_string();
        assert!(message.contains("limits.untaken_events_per_workflow_max (3)"), "{message}");
        // Full, a repeat is still a repeat; nothing was written by the refusals.
        assert!(matches!(store.send_event(bounded("e1", ten())).await, Ok(EventSend::Repeated(_))));
        let pending = store.pending_events(&WorkflowId::from("wf"), names(), 100).await.expect("pending");
        let ids: Vec<&str> = pending.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2", "e3"]);
        // Taken, an event no longer counts.
        store.fenced_write(&lease.fence(), vec![take(first.seq, "wait-1")]).await.expect("take");
        store.send_event(bounded("e4", json!(1))).await.expect("room again");
        assert!(matches!(store.send_event(bounded("e1", ten())).await, Ok(EventSend::Repeated(_))), "a taken event's repeat");
    }
}

conformance! {
    /// A wait reads only the oldest untaken events of the names it asks for, as many of each as
    /// it asks.
    async fn pending_events_are_read_by_name_oldest_first(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        for (id, name) in [("n1", "noise"), ("p1", "paid"), ("n2", "noise"), ("s1", "shipped"), ("p2", "paid"), ("p3", "paid")] {
            store.send_event(event(id, name, json!(id))).await.expect("send");
        }
        let read = |names: &[&str], per_name: u32| {
            let store = &store;
            let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
            async move {
                store.pending_events(&WorkflowId::from("wf"), names, per_name).await.expect("pending")
                    .into_iter().map(|e| e.event_id).collect::<Vec<_>>()
            }
        };
        assert_eq!(read(&["paid"], 1).await, ["p1"]);
        assert_eq!(read(&["paid", "shipped"], 2).await, ["p1", "s1", "p2"], "in the order sent");
        assert_eq!(read(&["paid"], 10).await, ["p1", "p2", "p3"]);
        assert!(read(&["never"], 10).await.is_empty());
        assert!(read(&[], 10).await.is_empty());
        let first = store.pending_events(&WorkflowId::from("wf"), vec!["paid".into()], 1).await.expect("pending");
        store.fenced_write(&lease.fence(), vec![take(first[0].seq, "wait-1")]).await.expect("take");
        assert_eq!(read(&["paid"], 1).await, ["p2"], "a taken event is not pending");
    }
}

conformance! {
    /// Every event's payload counts against its workflow owner's quota, taken or not: one past
    /// the quota is refused with nothing written, and the workflow's end keeps what its events
    /// take.
    async fn events_count_against_the_owners_quota(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let user = store.read_workflow(&WorkflowId::from("wf")).await.expect("read").expect("row").user_id;
        let stored = || {
            let store = &store;
            let user = user.clone();
            async move {
                store.stored_bytes(Some(&user)).await.expect("stored").first().map_or(0, |row| row.stored_bytes)
            }
        };
        let quota = |event_id: &str, payload: Value| NewSentEvent { stored_bytes_max: 30, ..event(event_id, "paid", payload) };
        // `"12345678"` is 10 bytes of JSON.
        store.send_event(quota("e1", json!("12345678"))).await.expect("10 bytes");
        store.send_event(quota("e2", json!("12345678"))).await.expect("20 bytes");
        assert_eq!(stored().await, 20);
        // A repeat stores nothing and is not counted again.
        assert!(matches!(store.send_event(quota("e2", json!("12345678"))).await, Ok(EventSend::Repeated(_))));
        assert_eq!(stored().await, 20);
        let over = store.send_event(quota("e3", json!("123456789"))).await;
        assert!(matches!(over, Err(Error::LimitReached(Limit::StoredBytes { stored: 20, max: 30 }))), "{over:?}");
        assert_eq!(store.pending_events(&WorkflowId::from("wf"), names(), 10).await.expect("pending").len(), 2, "nothing of it was stored");
        store.send_event(quota("e3", json!("12345678"))).await.expect("exactly the quota");
        assert_eq!(stored().await, 30);
        // Taken, an event is still stored; the end keeps its bytes.
        let first = store.pending_events(&WorkflowId::from("wf"), names(), 1).await.expect("pending");
        store.fenced_write(&lease.fence(), vec![
            take(first[0].seq, "wait-1"),
            WriteOp::SetWorkflow { workflow_id: "wf".into(), status: WorkflowStatus::Completed, data: json!({}) },
            WriteOp::ReturnStorage { workflow_id: "wf".into() },
        ]).await.expect("end");
        assert_eq!(stored().await, 30);
        assert_eq!(store.delete_workflow(&WorkflowId::from("wf")).await.expect("delete"), store::Deletion::Deleted);
        assert_eq!(stored().await, 0, "deleted, its events are no longer counted");
    }
}
