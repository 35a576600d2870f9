//! A workflow's events, written in the transaction of the change they describe: their kinds, their
//! fields and their order, and the feed of status changes.

use serde_json::{Value, json};
use store::{
    ControlKind, ControlWrite, EventRow, NewControl, NewRun, RunStatus, WorkflowStep, WriteOp,
};

use crate::harness::{Subject, conformance, workflow};

fn put(step_id: &str, kind: &str, status: &str, data: Value) -> WriteOp {
    WriteOp::PutStep {
        workflow_id: "wf".into(),
        seq: 0,
        step_id: step_id.to_owned(),
        attempt: 1,
        status: store::StepStatus::parse(status).expect("a step status"),
        record: store::StepRecord::decode(kind, &data).expect("a step record"),
    }
}

fn control(kind: ControlKind, step_id: &str, body: Value) -> NewControl {
    NewControl {
        workflow_id: "wf".into(),
        kind,
        step_id: step_id.to_owned(),
        attempt: if step_id.is_empty() { 0 } else { 1 },
        body,
        created_by: Some("ada".into()),
    }
}

async fn events<S: Subject>(store: &S) -> Vec<EventRow> {
    let page = store
        .read_events(&store::WorkflowId::from("wf"), 0, 1_000)
        .await
        .expect("events")
        .expect("wf");
    let numbers: Vec<i64> = page.events.iter().map(|event| event.seq).collect();
    assert_eq!(
        numbers,
        (1..=page.last_seq).collect::<Vec<_>>(),
        "numbers with gaps"
    );
    page.events
}

fn kinds(events: &[EventRow]) -> Vec<&str> {
    events.iter().map(|event| event.kind.as_str()).collect()
}

conformance! {
    async fn a_workflows_events_follow_its_changes_in_order(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let fence = lease.fence();
        store.fenced_write(&fence, vec![put("a", "agent", "running", json!({}))]).await.expect("run a");
        store.fenced_write(&fence, vec![put("a", "agent", "completed", json!({"outcome": {"outcome": "resolved", "value": 1}}))])
            .await.expect("a done");
        store.fenced_write(&fence, vec![put("a", "agent", "completed", json!({"again": true}))])
            .await.expect("same status");
        store.fenced_write(&fence, vec![put("q", "agent", "queued", json!({}))]).await.expect("queued");
        store.put_control(control(ControlKind::Cancel, "", json!({}))).await.expect("cancel");
        store.fenced_write(&fence, vec![WriteOp::PutArtifact {
            workflow_id: "wf".into(), version: 1, source_step_id: "a".into(),
            path: Some("out.txt".into()), content: b"hello".to_vec(), sha256: "h".into(),
        }]).await.expect("artifact");
        store.fenced_write(&fence, vec![WriteOp::SetWorkflow {
            workflow_id: "wf".into(), status: store::WorkflowStatus::Completed, data: json!({}),
        }]).await.expect("end");

        let events = events(&*store).await;
        assert_eq!(kinds(&events), [
            "status", "step_journaled", "step_started", "step_finished", "step_journaled",
            "cancel_requested", "artifact", "status",
        ]);
        assert_eq!(events[0].data, json!({"status": "running", "previous": null}));
        assert_eq!(events[1].data, json!({"step_id": "a", "attempt": 1, "step_kind": "agent", "seq": 0}));
        assert_eq!(events[2].data, json!({"step_id": "a", "attempt": 1, "step_kind": "agent"}));
        let mut finished = events[3].data.clone();
        assert!(finished["duration_ms"].is_i64(), "{finished}");
        finished["duration_ms"] = json!(0);
        assert_eq!(finished, json!({
            "step_id": "a", "attempt": 1, "step_kind": "agent", "status": "completed",
            "child_run_id": null, "duration_ms": 0, "waited_ms": 0, "output_bytes": null,
            "total_tokens": null, "message_count": null,
        }));
        assert_eq!(events[5].data, json!({"by": "ada"}));
        assert_eq!(events[6].data, json!({"version": 1, "bytes": 5, "step_id": "a", "name": "out.txt"}));
        assert_eq!(events[7].data, json!({"status": "completed", "previous": "running"}));
        assert!(events.iter().all(|event| event.workflow_id == "wf"));

        let page = store.read_events(&store::WorkflowId::from("wf"), 3, 2).await.expect("events").expect("wf");
        assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);
        assert_eq!((page.status.as_str(), page.last_seq), ("completed", 8));
        assert!(!page.ended(3));
        let last = store.read_events(&store::WorkflowId::from("wf"), 8, 10).await.expect("events").expect("wf");
        assert!(last.events.is_empty() && last.ended(8));
        assert_eq!(store.read_events(&store::WorkflowId::from("no-such-workflow"), 0, 10).await.expect("events"), None);
    }
}

conformance! {
    // Issue 31: `reins watch` shows every attempt: a failed attempt's `step_finished` says its
    // error, and the attempt a retry policy queued says when it is due and why.
    async fn an_attempts_events_say_its_error_and_when_the_next_is_due(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let fence = lease.fence();
        store.fenced_write(&fence, vec![put("a", "agent", "running", json!({}))]).await.expect("run a");
        let failed = put("a", "agent", "failed", json!({"outcome": {"outcome": "rejected",
            "value": {"message": "no progress for 1000 ms (timeout.idleMs)", "status": "timeout"}}}));
        let WriteOp::PutStep { record, .. } = put("a", "agent", "queued", json!({
            "previous_run_id": "run-1",
            "retry": {"due_at_ms": 1_700_000_002_000_i64, "first_at_ms": 1_700_000_000_000_i64,
                      "reason": "no progress for 1000 ms (timeout.idleMs)"}})) else { unreachable!() };
        let queued = WriteOp::PutStep {
            workflow_id: "wf".into(), seq: 0, step_id: "a".into(), attempt: 2,
            status: store::StepStatus::Queued, record,
        };
        store.fenced_write(&fence, vec![failed, queued]).await.expect("retry");
        let events = events(&*store).await;
        assert_eq!(kinds(&events), ["status", "step_journaled", "step_started", "step_finished", "step_journaled"]);
        assert_eq!(events[3].data["error"], "no progress for 1000 ms (timeout.idleMs)");
        assert_eq!(events[3].data["error_status"], "timeout");
        assert_eq!(events[4].data, json!({"step_id": "a", "attempt": 2, "step_kind": "agent", "seq": 0,
            "retry_due_at_ms": 1_700_000_002_000_i64,
            "retry_reason": "no progress for 1000 ms (timeout.idleMs)"}));
    }
}

conformance! {
    async fn the_feed_numbers_status_changes_across_workflows_per_user(db) {
        let store = db.store().await;
        assert_eq!(store.feed_head().await.expect("head"), 0);
        let a = workflow(&*store, "wf", "node-a", 60_000).await;
        let b = store.launch_workflow(store::NewWorkflow {
            workflow_id: "other".into(), user_id: "bob".into(), request_id: None,
            fingerprint: "fp".into(), data: json!({}),
        }, "node-a", 60_000, store::LaunchLimits::NONE).await.expect("launch");
        let store::Launch::Created { lease: b, .. } = b else { panic!("{b:?}") };
        for (lease, status) in [(&a, "paused"), (&b, "failed"), (&a, "completed")] {
            store.fenced_write(&lease.fence(), vec![WriteOp::SetWorkflow {
                workflow_id: lease.resource_id.clone(), status: store::WorkflowStatus::parse(status).expect("a status"), data: json!({}),
            }]).await.expect("status");
        }
        // Setting the same status again is no change.
        store.fenced_write(&a.fence(), vec![WriteOp::SetWorkflow {
            workflow_id: "wf".into(), status: store::WorkflowStatus::Completed, data: json!({"n": 2}),
        }]).await.expect("same status");

        let feed = store.read_feed(0, None, 100).await.expect("feed");
        let seen: Vec<(i64, &str, &str)> = feed.iter()
            .map(|e| (e.seq, e.workflow_id.as_str(), e.data["status"].as_str().unwrap_or_default()))
            .collect();
        assert_eq!(seen, [
            (1, "wf", "running"), (2, "other", "running"), (3, "wf", "paused"),
            (4, "other", "failed"), (5, "wf", "completed"),
        ]);
        assert!(feed.iter().all(|e| e.kind == "status"));
        assert_eq!(store.feed_head().await.expect("head"), 5);
        let bobs: Vec<i64> = store.read_feed(0, Some("bob"), 100).await.expect("feed")
            .iter().map(|e| e.seq).collect();
        assert_eq!(bobs, [2, 4]);
        let page: Vec<i64> = store.read_feed(2, None, 2).await.expect("feed").iter().map(|e| e.seq).collect();
        assert_eq!(page, [3, 4]);
    }
}

conformance! {
    async fn pauses_checkpoints_and_approvals_are_events(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let fence = lease.fence();
        store.fenced_write(&fence, vec![
            put("p", "pause", "running", json!({})),
            put("h", "humanCheckpoint", "running", json!({"args": {"artifactVersion": 2}})),
        ]).await.expect("wait for people");
        store.put_control(control(ControlKind::Resume, "p", json!({}))).await.expect("resume");
        let decided = store.put_control(control(ControlKind::Decide, "h",
            json!({"decision": "approve", "artifactVersion": 2, "comment": "fine"}))).await.expect("decide");
        assert!(matches!(decided, ControlWrite::Recorded(_)));

        let run = NewRun {
            run_id: "run".into(), thread_id: "thread".into(), agent: "echo".into(),
            owner: "node-a".into(), lease_ms: 60_000, idempotency: None, metadata: json!({}),
            step: Some(WorkflowStep {
                workflow_id: "wf".into(), step_id: "s".into(), attempt: 1, slots_max: 8, slots_per_user_max: 8, slots_reserved: 0,
                fence: fence.clone(), journal: Vec::new(),
            }),
        };
        store.admit_run(run).await.expect("admit");
        let asked = json!({"hitl_approval": {"request_id": "r1"}});
        assert!(store.update_run_status(&store::RunId::from("run"), "node-a", RunStatus::WaitingForInput, Some(asked))
            .await.expect("ask"));
        store.answer_approval("thread", &["r1".into()], &json!({"decision": "approve", "by": "bob"}))
            .await.expect("answer").expect("answered");

        let events = events(&*store).await;
        assert_eq!(kinds(&events), [
            "status", "step_journaled", "pause_waiting", "step_journaled", "checkpoint_waiting",
            "pause_resumed", "checkpoint_decided", "approval_requested", "approval_answered",
        ]);
        assert_eq!(events[2].data, json!({"step_id": "p", "attempt": 1, "step_kind": "pause"}));
        assert_eq!(events[4].data, json!({
            "step_id": "h", "attempt": 1, "step_kind": "humanCheckpoint", "artifact_version": 2,
        }));
        assert_eq!(events[5].data, json!({"step_id": "p", "attempt": 1, "by": "ada"}));
        assert_eq!(events[6].data, json!({
            "step_id": "h", "attempt": 1, "decision": "approve", "artifact_version": 2,
            "comment": "fine", "by": "ada",
        }));
        assert_eq!(events[7].data, json!({
            "step_id": "s", "attempt": 1, "child_run_id": "run", "request_id": "r1",
        }));
        assert_eq!(events[8].data, json!({
            "step_id": "s", "attempt": 1, "child_run_id": "run", "request_id": "r1",
            "decision": "approve", "by": "bob",
        }));
    }
}

conformance! {
    async fn console_log_lines_are_kept_within_their_bounds(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let logs = |lines: &[&str]| WriteOp::PutLogs {
            workflow_id: "wf".into(),
            lines: lines.iter().map(|line| (*line).to_owned()).collect(),
            events_max: 3,
            bytes_max: 5,
        };
        store.fenced_write(&lease.fence(), vec![logs(&["a", "bb"])]).await.expect("logs");
        store.fenced_write(&lease.fence(), vec![logs(&["ccc", "d"])]).await.expect("logs");
        store.fenced_write(&lease.fence(), vec![logs(&["e"])]).await.expect("logs");
        let events = events(&*store).await;
        assert_eq!(kinds(&events), ["status", "log", "log", "log_truncated"]);
        assert_eq!(events[2].data, json!({"line": "bb"}));
        assert_eq!(events[3].data, json!({"events_max": 3, "bytes_max": 5}));
        let missing = store.fenced_write(&lease.fence(), vec![WriteOp::PutLogs {
            workflow_id: "no-such-workflow".into(), lines: vec!["x".into()], events_max: 3, bytes_max: 5,
        }]).await;
        assert!(matches!(missing, Err(store::Error::NotFound(_))), "{missing:?}");
    }
}

/// PostgreSQL only: the feed's numbers are given after commit (migration 25), so a status change
/// does not wait for another workflow's status change to commit, and the numbers still come out
/// in order, each once: an event that commits later gets a later number than every one already
/// read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_status_changes_do_not_wait_for_each_other_and_the_feed_stays_in_order() {
    use std::time::Duration;

    let (db, dropping) = crate::harness::TestDb::postgres().await;
    let store = db.store().await;
    let a = workflow(&*store, "a", "node", 60_000).await;
    let b = workflow(&*store, "b", "node", 60_000).await;
    let (client, connection) = tokio_postgres::connect(&dropping.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let connection = tokio::spawn(connection);
    // a's status change, not committed yet.
    client.batch_execute("BEGIN").await.expect("begin");
    client
        .execute(
            "UPDATE workflows SET status = 'paused' WHERE id = $1",
            &[&a.resource_id],
        )
        .await
        .expect("pause a");

    let paused = WriteOp::SetWorkflow {
        workflow_id: b.resource_id.clone(),
        status: store::WorkflowStatus::Paused,
        data: json!({}),
    };
    tokio::time::timeout(
        Duration::from_secs(30),
        store.fenced_write(&b.fence(), vec![paused]),
    )
    .await
    .expect("b's status change waited for a's commit")
    .expect("pause b");
    let seen = |feed: Vec<EventRow>| -> Vec<(i64, String, String)> {
        feed.iter()
            .map(|e| {
                (
                    e.seq,
                    e.workflow_id.as_str().to_owned(),
                    e.data["status"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    let before = seen(store.read_feed(0, None, 100).await.expect("feed"));
    assert_eq!(
        before,
        [
            (1, "a".to_owned(), "running".to_owned()),
            (2, "b".to_owned(), "running".to_owned()),
            (3, "b".to_owned(), "paused".to_owned()),
        ]
    );
    assert_eq!(store.feed_head().await.expect("head"), 3);

    client.batch_execute("COMMIT").await.expect("commit");
    // Committed after number 3 was read: number 4, and nothing before it moves.
    assert_eq!(
        seen(store.read_feed(3, None, 100).await.expect("feed")),
        [(4, "a".to_owned(), "paused".to_owned())]
    );
    let all = seen(store.read_feed(0, None, 100).await.expect("feed"));
    assert_eq!(all[..3], before[..]);
    assert_eq!(all.len(), 4);
    assert_eq!(store.feed_head().await.expect("head"), 4);

    drop(client);
    let _ = connection.await;
    dropping.drop_database().await;
}

/// PostgreSQL only: one read of the feed numbers at most `feed_numbering_max` of the status
/// events waiting for a number (migration 28), the oldest first, so a backlog never makes a read
/// outlast the statement timeout; the next reads number the rest, in order, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_feed_read_numbers_a_bounded_round_and_the_next_reads_the_rest() {
    let (_db, dropping) = crate::harness::TestDb::postgres().await;
    let options = store::StoreOptions {
        feed_numbering_max: 3,
        ..store::StoreOptions::default()
    };
    let store = store::Store::open(&store::DatabaseUrl::Postgres(dropping.url()), &options)
        .await
        .expect("open");
    let names = ["a", "b", "c", "d", "e", "f", "g"];
    for name in names {
        workflow(&store, name, "node", 60_000).await;
    }
    let read = |after| {
        let store = &store;
        async move {
            let feed = store.read_feed(after, None, 100).await.expect("feed");
            feed.iter()
                .map(|event| (event.seq, event.workflow_id.as_str().to_owned()))
                .collect::<Vec<_>>()
        }
    };
    let numbered = |count: usize| -> Vec<(i64, String)> {
        names[..count]
            .iter()
            .zip(1..)
            .map(|(name, seq)| (seq, (*name).to_owned()))
            .collect()
    };
    assert_eq!(read(0).await, numbered(3), "the first round");
    assert_eq!(read(3).await, numbered(6)[3..], "the second round");
    assert_eq!(read(0).await, numbered(7), "the last round");
    assert_eq!(read(0).await, numbered(7), "nothing numbered twice");
    assert_eq!(store.feed_head().await.expect("head"), 7);
    drop(store);
    dropping.drop_database().await;
}
