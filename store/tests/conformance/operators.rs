//! What operators read: counts by status, held slots, the workflows that wait for a person, and
//! the nodes that started.

use serde_json::json;
use store::{NewRun, NodeRecord, RunStatus, StatusCount, WorkflowStep, WriteOp};

use crate::harness::{conformance, workflow};

fn counted(pairs: &[(&str, i64)]) -> Vec<StatusCount> {
    pairs
        .iter()
        .map(|(status, count)| StatusCount {
            status: (*status).to_owned(),
            count: *count,
        })
        .collect()
}

fn put(workflow_id: &str, step_id: &str, kind: &str) -> WriteOp {
    WriteOp::PutStep {
        workflow_id: store::WorkflowId::new(workflow_id),
        seq: 0,
        step_id: step_id.to_owned(),
        attempt: 1,
        status: store::StepStatus::Running,
        record: store::StepRecord::decode(kind, &json!({})).expect("a step record"),
    }
}

conformance! {
    async fn counts_slots_and_the_workflows_that_wait_for_a_person(db) {
        let store = db.store().await;
        let mut leases = Vec::new();
        for (n, owner) in ["node-a", "node-a", "node-b", "node-a"].into_iter().enumerate() {
            leases.push(workflow(&*store, &format!("wf-{n}"), owner, 60_000).await);
            db.tick().await;
        }
        let set = |n: usize, status: &str| WriteOp::SetWorkflow {
            workflow_id: format!("wf-{n}").into(), status: store::WorkflowStatus::parse(status).expect("a status"), data: json!({}),
        };
        store.fenced_write(&leases[0].fence(), vec![set(0, "paused")]).await.expect("pause");
        store.fenced_write(&leases[1].fence(), vec![put("wf-1", "check", "humanCheckpoint")]).await.expect("ask");
        store.fenced_write(&leases[2].fence(), vec![set(2, "completed")]).await.expect("end");
        let run = NewRun {
            run_id: "run".into(), thread_id: "thread".into(), agent: "echo".into(),
            owner: "node-a".into(), lease_ms: 60_000, idempotency: None, metadata: json!({}),
            step: Some(WorkflowStep {
                workflow_id: "wf-3".into(), step_id: "s".into(), attempt: 1, slots_max: 8, slots_per_user_max: 8, slots_reserved: 0,
                fence: leases[3].fence(), journal: vec![put("wf-3", "s", "agent")],
            }),
        };
        store.admit_run(run).await.expect("admit");

        assert_eq!(store.workflow_counts(None).await.expect("counts"),
            counted(&[("completed", 1), ("paused", 1), ("running", 2)]));
        assert_eq!(store.workflow_counts(Some("node-a")).await.expect("counts"),
            counted(&[("paused", 1), ("running", 2)]));
        assert_eq!(store.run_counts("node-a").await.expect("counts"), counted(&[("running", 1)]));
        assert!(store.run_counts("node-b").await.expect("counts").is_empty());
        let slots = store.list_slots(10).await.expect("slots");
        assert_eq!(slots.iter().map(|s| (s.workflow_id.as_str(), s.step_id.as_str(), s.attempt)).collect::<Vec<_>>(),
            [("wf-3", "s", 1)]);

        assert_eq!(store.waiting_workflows(None, 10).await.expect("waiting"), ["wf-0", "wf-1"]);
        assert!(store.update_run_status(&store::RunId::from("run"), "node-a", RunStatus::WaitingForInput, None).await.expect("ask"));
        assert_eq!(store.waiting_workflows(None, 10).await.expect("waiting"), ["wf-0", "wf-1", "wf-3"]);
        assert_eq!(store.waiting_workflows(None, 2).await.expect("waiting"), ["wf-0", "wf-1"]);
        assert!(store.waiting_workflows(Some("someone-else"), 10).await.expect("waiting").is_empty());
    }
}

conformance! {
    async fn nodes_are_listed_newest_first_with_when_they_stopped(db) {
        let store = db.store().await;
        let node = |name: &str| NodeRecord {
            worker_id: name.to_owned(), host: "host".into(), pid: 7, version: "1".into(),
            started_at: 0.0, stopped_at: None,
        };
        store.register_node(&node("node-1")).await.expect("register");
        db.tick().await;
        store.register_node(&node("node-2")).await.expect("register");
        let again = store.register_node(&node("node-2")).await;
        assert!(matches!(again, Err(store::Error::Conflict(_))), "{again:?}");
        store.mark_node_stopped("node-1").await.expect("stop");
        store.mark_node_stopped("no-such-node").await.expect("stopping a stranger is no error");
        let nodes = store.list_nodes(10).await.expect("nodes");
        let mut names: Vec<&str> = nodes.iter().map(|n| n.worker_id.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["node-1", "node-2"]);
        assert!(nodes.windows(2).all(|pair| pair[0].started_at >= pair[1].started_at));
        let first = nodes.iter().find(|n| n.worker_id == "node-1").expect("node-1");
        assert!(first.stopped_at.is_some_and(|at| at >= first.started_at));
        assert!(first.started_at > 0.0, "the start is the database's clock, not the caller's");
        assert_eq!(store.list_nodes(1).await.expect("nodes").len(), 1);
    }
}

conformance! {
    async fn a_backup_is_a_whole_new_file_or_nothing(db) {
        let store = db.store().await;
        workflow(&*store, "wf-backed-up", "node-a", 60_000).await;
        let dir = tempfile::tempdir().expect("temp dir");
        let destination = dir.path().join("copy.db");
        let relative = store.backup(std::path::Path::new("copy.db")).await;
        assert!(matches!(relative, Err(store::Error::Unsupported(_))), "{relative:?}");
        match store.backup(&destination).await {
            Ok(report) => {
                assert_eq!(report.path, destination);
                assert_eq!(report.schema_version, store::SCHEMA_VERSION);
                let copy = rusqlite::Connection::open(&destination).expect("open the copy");
                let found: i64 = copy
                    .query_row("SELECT count(*) FROM workflows WHERE id = 'wf-backed-up'", [], |row| row.get(0))
                    .expect("read the copy");
                assert_eq!(found, 1);
                let again = store.backup(&destination).await;
                assert!(
                    matches!(&again, Err(store::Error::Unsupported(m)) if m.contains("exists already")),
                    "{again:?}"
                );
            }
            Err(store::Error::Unsupported(_)) => {}
            Err(other) => panic!("a backup fails only as unsupported here: {other}"),
        }
        let left: Vec<_> = std::fs::read_dir(dir.path()).expect("read dir").flatten()
            .map(|entry| entry.file_name())
            .filter(|name| name != "copy.db")
            .collect();
        assert!(left.is_empty(), "a backup left {left:?}");
    }
}

conformance! {
    // A waiting pause or checkpoint past its `remindAfterMs` is counted overdue; one not yet
    // due, one without a reminder, and one whose workflow ended are not.
    async fn waits_past_their_reminder_are_counted_overdue(db) {
        let store = db.store().await;
        let waiting = |workflow: &str, step: &str, kind: &str, remind: Option<u64>| WriteOp::PutStep {
            workflow_id: store::WorkflowId::new(workflow),
            seq: 0,
            step_id: step.to_owned(),
            attempt: 1,
            status: store::StepStatus::Running,
            record: store::StepRecord::decode(kind, &json!({"args": {"remindAfterMs": remind}}))
                .expect("a step record"),
        };
        let (due, later, ended) = (
            workflow(&*store, "due", "node-a", 60_000).await,
            workflow(&*store, "later", "node-a", 60_000).await,
            workflow(&*store, "ended", "node-a", 60_000).await,
        );
        store.fenced_write(&due.fence(), vec![waiting("due", "p", "pause", Some(1)),
            waiting("due", "q", "humanCheckpoint", None)]).await.expect("wait");
        store.fenced_write(&later.fence(), vec![waiting("later", "c", "humanCheckpoint", Some(600_000))])
            .await.expect("wait");
        store.fenced_write(&ended.fence(), vec![waiting("ended", "p", "pause", Some(1)),
            WriteOp::SetWorkflow { workflow_id: "ended".into(), status: store::WorkflowStatus::Cancelled,
                data: json!({}) }]).await.expect("end");
        let now = store.now().await.expect("now");
        db.pass(&*store, now + 0.01).await;
        assert_eq!(store.overdue_waits().await.expect("count"), 1);
    }
}
