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
    }
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
        let pending = store.pending_events(&WorkflowId::from("wf")).await.expect("pending");
        let ids: Vec<&str> = pending.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2", "e3"], "in the order sent");
        assert!(pending.windows(2).all(|pair| pair[0].seq < pair[1].seq));

        // Taken by a step, an event is no longer pending; the same step again is a repeat.
        store.fenced_write(&lease.fence(), vec![take(first.seq, "wait-1")]).await.expect("take");
        store.fenced_write(&lease.fence(), vec![take(first.seq, "wait-1")]).await.expect("the same step again");
        let ids: Vec<String> = store.pending_events(&WorkflowId::from("wf")).await.expect("pending")
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
        let end = WriteOp::SetWorkflow {
            workflow_id: "wf".into(),
            status: WorkflowStatus::Completed,
            data: json!({"script": "s"}),
        };
        store.fenced_write(&lease.fence(), vec![end, WriteOp::ReleaseLease]).await.expect("end");
        let refused = store.send_event(event("late", "paid", json!(null))).await.expect("send");
        assert_eq!(refused, EventSend::Ended(WorkflowStatus::Completed));
        assert!(store.pending_events(&WorkflowId::from("wf")).await.expect("pending").is_empty(), "an ended workflow stored an event");
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
        let pending = store.pending_events(&WorkflowId::from("wf")).await.expect("pending");
        let ids: Vec<&str> = pending.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["e1", "e2", "e3"]);
        // Taken, an event no longer counts.
        store.fenced_write(&lease.fence(), vec![take(first.seq, "wait-1")]).await.expect("take");
        store.send_event(bounded("e4", json!(1))).await.expect("room again");
        assert!(matches!(store.send_event(bounded("e1", ten())).await, Ok(EventSend::Repeated(_))), "a taken event's repeat");
    }
}
