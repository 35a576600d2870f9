//! Fenced writes: all or nothing, and never after a takeover, whatever they change.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use store::{Admission, Error, NewControl, NewRun, RunOutcome, RunStatus, WorkflowStep, WriteOp};

use crate::harness::{conformance, step, workflow};

conformance! {
    async fn a_failing_change_rolls_back_the_whole_fenced_write(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let missing = WriteOp::SetWorkflow {
            workflow_id: "no-such-workflow".into(),
            status: store::WorkflowStatus::Completed,
            data: json!({}),
        };
        let result = store.fenced_write(&lease.fence(), vec![step("wf", "s1"), missing]).await;
        assert!(matches!(result, Err(Error::NotFound(_))), "{result:?}");
        assert!(store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps").is_empty(), "half a write landed");

        let artifact = |version: i64| WriteOp::PutArtifact {
            workflow_id: "wf".into(),
            version,
            source_step_id: "s1".into(),
            path: None,
            content: b"bytes".to_vec(),
            sha256: "hash".into(),
        };
        store.fenced_write(&lease.fence(), vec![artifact(1)]).await.expect("artifact 1");
        let again = store.fenced_write(&lease.fence(), vec![step("wf", "s2"), artifact(1)]).await;
        assert!(matches!(again, Err(Error::Conflict(_))), "a version changed: {again:?}");
        assert!(store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps").is_empty(), "half a write landed");
        assert_eq!(store.last_artifact_version(&store::WorkflowId::from("wf")).await.expect("last"), 1);

        let done = WriteOp::SetWorkflow {
            workflow_id: "wf".into(),
            status: store::WorkflowStatus::Completed,
            data: json!({"result": 42}),
        };
        store.fenced_write(&lease.fence(), vec![step("wf", "s1"), done]).await.expect("write");
        let row = store.read_workflow(&store::WorkflowId::from("wf")).await.expect("read").expect("row");
        assert_eq!((row.status.as_str(), &row.data), ("completed", &json!({"result": 42})));
        assert_eq!(store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps").len(), 1);
    }
}

conformance! {
    async fn no_fenced_write_lands_after_a_takeover(db) {
        // The old owner writes as fast as it can on a short lease that it does not renew; the new
        // owner takes over the moment the lease expires. Every write the old owner starts after
        // the takeover returned must be refused, and exactly the acknowledged writes are stored.
        let (old_store, new_store) = (db.store().await, db.store().await);
        let held = workflow(&*old_store, "wf", "old", 400).await;
        let taken_over = Arc::new(AtomicBool::new(false));
        let wrote = Arc::new(tokio::sync::Notify::new());
        let writer = {
            let (store, taken_over, fence) = (Arc::clone(&old_store), Arc::clone(&taken_over), held.fence());
            let wrote = Arc::clone(&wrote);
            tokio::spawn(async move {
                let mut log = Vec::new();
                for i in 0..100_000 {
                    let started_after_takeover = taken_over.load(Ordering::SeqCst);
                    let result = store.fenced_write(&fence, vec![step("wf", &format!("old-{i}"))]).await;
                    let lost = matches!(result, Err(Error::LeaseLost { .. }));
                    assert!(lost || result.is_ok(), "write {i}: {result:?}");
                    if result.is_ok() {
                        wrote.notify_one();
                    }
                    log.push((format!("old-{i}"), result.is_ok(), started_after_takeover));
                    if lost && started_after_takeover && log.iter().rev().take(20).all(|e| !e.1) {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                log
            })
        };
        // The takeover starts once the old owner has written (the simulation's clock would
        // otherwise run its lease out before it wrote at all).
        wrote.notified().await;
        let started = Instant::now();
        let lease = loop {
            if let Some(lease) = new_store.acquire_lease(&store::WorkflowId::from("wf"), "new", 60_000).await.expect("acquire") {
                break lease;
            }
            assert!(started.elapsed() < Duration::from_secs(60), "no takeover after expiry");
            db.tick().await;
        };
        taken_over.store(true, Ordering::SeqCst);
        new_store.fenced_write(&lease.fence(), vec![step("wf", "new-0")]).await.expect("new owner writes");
        let log = writer.await.expect("writer");

        let late: Vec<_> = log.iter().filter(|(_, ok, after)| *ok && *after).collect();
        assert!(late.is_empty(), "writes acknowledged after the takeover: {late:?}");
        let stored: Vec<String> = new_store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps")
            .into_iter().map(|s| s.step_id).collect();
        for (name, ok, _) in &log {
            assert_eq!(stored.contains(name), *ok, "{name}: acknowledged={ok}, stored={}", !ok);
        }
        assert!(log.iter().any(|(_, ok, _)| *ok), "the old owner never wrote: the test proved nothing");
        assert!(stored.contains(&"new-0".to_owned()));
    }
}

conformance! {
    async fn a_workflow_that_ends_gives_its_lease_back_in_the_same_write_or_not_at_all(db) {
        let store = db.store().await;
        let end = |workflow_id: &str| WriteOp::SetWorkflow {
            workflow_id: workflow_id.into(),
            status: store::WorkflowStatus::Completed,
            data: json!({"result": 1}),
        };

        // A write that fails keeps the lease: nobody else can take the workflow. (The release
        // comes first in the list, and is still applied last.)
        let held = workflow(&*store, "wf", "node-a", 60_000).await;
        let failed = store
            .fenced_write(&held.fence(), vec![WriteOp::ReleaseLease, end("no-such-workflow")])
            .await;
        assert!(matches!(failed, Err(Error::NotFound(_))), "{failed:?}");
        assert!(store.acquire_lease(&store::WorkflowId::from("wf"), "node-b", 60_000).await.expect("acquire").is_none(),
            "a failed write released the lease");

        // The release first in the list is still applied after the end: both commit.
        store.fenced_write(&held.fence(), vec![WriteOp::ReleaseLease, end("wf")]).await.expect("end");
        assert_eq!(store.read_workflow(&store::WorkflowId::from("wf")).await.expect("read").expect("row").status, store::WorkflowStatus::Completed);
        let next = store.acquire_lease(&store::WorkflowId::from("wf"), "node-b", 60_000).await.expect("acquire")
            .expect("the ended workflow's lease is free");
        assert_eq!(next.epoch, held.epoch.next());

        // The old owner can no longer release (or end) anything: the new lease stands.
        let stale = store.fenced_write(&held.fence(), vec![WriteOp::ReleaseLease]).await;
        assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
        let lease = store.read_lease(&store::WorkflowId::from("wf")).await.expect("read lease").expect("lease");
        assert_eq!((lease.owner.as_str(), lease.epoch), ("node-b", next.epoch));
        assert!(store.acquire_lease(&store::WorkflowId::from("wf"), "node-c", 60_000).await.expect("acquire").is_none(),
            "a stale release freed the new owner's lease");
    }
}

/// One write of each kind for workflow `wf` (with a live child run of step `s`, attempt 1,
/// control `control_id` and sent event `event_seq`), named by kind. The match has no catch-all: a new kind of write does
/// not compile until it is named here, and so tested for its fence below.
/// Returns once a statement of this test's database waits on the server for a lock (seen by
/// `client`), or panics saying `never` after a minute.
async fn until_a_statement_waits_for_a_lock(client: &tokio_postgres::Client, never: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        if waiting >= 1 {
            return;
        }
        assert!(Instant::now() < deadline, "{never}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn every_kind_of_write(control_id: i64, event_seq: i64) -> Vec<(&'static str, WriteOp)> {
    let wf = || "wf".to_owned();
    let writes = vec![
        WriteOp::SetWorkflow {
            workflow_id: wf().into(),
            status: store::WorkflowStatus::Completed,
            data: json!({"late": true}),
        },
        WriteOp::PutStep {
            workflow_id: wf().into(),
            seq: 9,
            step_id: "late".into(),
            attempt: 1,
            status: store::StepStatus::Completed,
            record: store::StepRecord::decode("agent", &json!({})).expect("a step record"),
        },
        WriteOp::MarkControlApplied { control_id },
        WriteOp::TakeEvent {
            workflow_id: wf().into(),
            seq: event_seq,
            step_id: "wait".into(),
        },
        WriteOp::PutArtifact {
            workflow_id: wf().into(),
            version: 1,
            source_step_id: "s".into(),
            path: Some("out.txt".into()),
            content: b"late".to_vec(),
            sha256: "hash".into(),
        },
        WriteOp::CloseStepRuns {
            workflow_id: wf().into(),
            idempotency_key: store::idempotency_key(&wf().into(), "s", 1),
        },
        WriteOp::CancelRuns {
            workflow_id: wf().into(),
        },
        WriteOp::ReleaseSlot {
            workflow_id: wf().into(),
            step_id: "s".into(),
        },
        WriteOp::ReleaseSlots {
            workflow_id: wf().into(),
        },
        WriteOp::TakePlaces {
            workflow_id: wf().into(),
            user_id: "tester".into(),
            max_workflows: 0,
            max_workflows_per_owner: 0,
        },
        WriteOp::TakeStorage {
            workflow_id: wf().into(),
            bytes: 10,
            bytes_max: 0,
        },
        WriteOp::ReturnStorage {
            workflow_id: wf().into(),
        },
        WriteOp::PutLogs {
            workflow_id: wf().into(),
            lines: vec!["late".into()],
            events_max: 10,
            bytes_max: 100,
        },
        WriteOp::ReleaseLease,
        WriteOp::GoDormant {
            workflow_id: wf().into(),
            wake_at_ms: None,
            event_names: vec![],
        },
    ];
    writes
        .into_iter()
        .map(|op| {
            let kind = match &op {
                WriteOp::SetWorkflow { .. } => "SetWorkflow",
                WriteOp::PutStep { .. } => "PutStep",
                WriteOp::MarkControlApplied { .. } => "MarkControlApplied",
                WriteOp::TakeEvent { .. } => "TakeEvent",
                WriteOp::PutArtifact { .. } => "PutArtifact",
                WriteOp::CloseStepRuns { .. } => "CloseStepRuns",
                WriteOp::CancelRuns { .. } => "CancelRuns",
                WriteOp::ReleaseSlot { .. } => "ReleaseSlot",
                WriteOp::ReleaseSlots { .. } => "ReleaseSlots",
                WriteOp::TakePlaces { .. } => "TakePlaces",
                WriteOp::TakeStorage { .. } => "TakeStorage",
                WriteOp::ReturnStorage { .. } => "ReturnStorage",
                WriteOp::PutLogs { .. } => "PutLogs",
                WriteOp::ReleaseLease => "ReleaseLease",
                WriteOp::GoDormant { .. } => "GoDormant",
            };
            (kind, op)
        })
        .collect()
}

conformance! {
    async fn a_stale_epoch_is_refused_for_every_kind_of_write_and_changes_nothing(db) {
        let (old, new) = (db.store().await, db.store().await);
        let stale = workflow(&*old, "wf", "node-a", 300).await;
        let admitted = old
            .admit_run(NewRun {
                run_id: "run".into(),
                thread_id: "thread".into(),
                agent: "echo".into(),
                owner: "node-a".into(),
                lease_ms: 60_000,
                idempotency: Some(("wf/s/1".into(), json!({}))),
                metadata: json!({}),
                step: Some(WorkflowStep {
                    workflow_id: "wf".into(),
                    step_id: "s".into(),
                    attempt: 1,
                    slots_max: 8,
                    slots_per_user_max: 8,
                    slots_reserved: 0,
                    fence: stale.fence(),
                    journal: vec![step("wf", "s")],
                }),
            })
            .await
            .expect("admit");
        assert!(matches!(admitted, Admission::Admitted(_)), "{admitted:?}");
        let control = NewControl {
            workflow_id: "wf".into(),
            kind: store::ControlKind::Cancel,
            step_id: String::new(),
            attempt: 0,
            body: json!({}),
            created_by: None,
        };
        let control_id = match old.put_control(control).await.expect("control") {
            store::ControlWrite::Recorded(row) => row.id,
            other => panic!("{other:?}"),
        };
        let event = store::NewSentEvent {
            workflow_id: "wf".into(),
            event_id: "e1".into(),
            name: "paid".into(),
            payload: json!({"amount": 3}),
            created_by: None,
            bounds: store::EventBounds::NONE,
            stored_bytes_max: 0,
        };
        let event_seq = match old.send_event(event).await.expect("event") {
            store::EventSend::Stored(row) => row.seq,
            other => panic!("{other:?}"),
        };
        db.pass(&old, stale.expires_at).await;
        let current = new.acquire_lease(&store::WorkflowId::from("wf"), "node-b", 60_000).await.expect("acquire").expect("taken");
        assert_eq!(current.epoch, stale.epoch.next());

        // A grant the stale owner's give-back would free, were it not fenced.
        new.fenced_write(&current.fence(), vec![WriteOp::TakeStorage { workflow_id: "wf".into(), bytes: 10, bytes_max: 0 }])
            .await
            .expect("the current owner takes a grant");
        let stored_before = new.stored_bytes(None).await.expect("stored bytes");
        let before = new.read_snapshot(&store::WorkflowId::from("wf"), 1_000, 1_000).await.expect("snapshot").expect("wf");
        let events_before = new.read_events(&store::WorkflowId::from("wf"), 0, 1_000).await.expect("events").expect("wf");
        for (kind, op) in every_kind_of_write(control_id, event_seq) {
            let refused = old.fenced_write(&stale.fence(), vec![op]).await;
            assert!(matches!(refused, Err(Error::LeaseLost { .. })), "{kind}: {refused:?}");
        }
        let after = new.read_snapshot(&store::WorkflowId::from("wf"), 1_000, 1_000).await.expect("snapshot").expect("wf");
        assert_eq!(after.row, before.row);
        assert_eq!(after.lease, Some(current.clone()), "a stale write moved the lease");
        assert_eq!(after.steps, before.steps);
        assert_eq!(after.checkpoints, before.checkpoints);
        assert_eq!(after.controls, before.controls);
        assert_eq!(after.artifacts, before.artifacts);
        assert_eq!(new.count_slots().await.expect("slots"), 1, "a stale write freed a slot");
        let run = new.read_run(&store::RunId::from("run")).await.expect("read").expect("run");
        assert_eq!((run.status, run.cancel_action), (RunStatus::Running, None));
        let events_after = new.read_events(&store::WorkflowId::from("wf"), 0, 1_000).await.expect("events").expect("wf");
        assert_eq!(events_after, events_before, "a stale write left an event");
        assert_eq!(new.stored_bytes(None).await.expect("stored bytes"), stored_before, "a stale write moved stored bytes");
        let pending = new.pending_events(&store::WorkflowId::from("wf"), vec!["paid".into()], 100).await.expect("events");
        assert_eq!(pending.len(), 1, "a stale write took an event");

        // The current owner's writes of the same kinds land.
        let take = WriteOp::TakeEvent { workflow_id: "wf".into(), seq: event_seq, step_id: "wait".into() };
        new.fenced_write(&current.fence(), vec![WriteOp::MarkControlApplied { control_id }, take])
            .await
            .expect("the current owner writes");
        assert!(new.read_controls(&store::WorkflowId::from("wf")).await.expect("controls")[0].applied);
        assert!(new.pending_events(&store::WorkflowId::from("wf"), vec!["paid".into()], 100).await.expect("events").is_empty());
    }
}

/// Writes of many workflows sent at once, every kind the PostgreSQL writers batch: each gets
/// its own answer, and exactly the writes answered `Ok` are stored. Among them a write under a
/// wrong owner's fence, one that repeats an artifact version, admissions that outnumber the
/// slots, and a child run's end claimed by a node that does not own it.
async fn writes_of_many_workflows_at_once<S: crate::harness::Subject>(store: &S) {
    const WORKFLOWS: usize = 24;
    let id = |n: usize| format!("wf-{n}");
    let mut leases = Vec::new();
    for n in 0..WORKFLOWS {
        leases.push(workflow(store, &id(n), "node-a", 60_000).await);
    }
    let artifact = |n: usize| WriteOp::PutArtifact {
        workflow_id: id(n).into(),
        version: 1,
        source_step_id: "s".into(),
        path: None,
        content: b"bytes".to_vec(),
        sha256: "hash".into(),
    };
    let (stale, repeated) = (3, 7);
    store
        .fenced_write(&leases[repeated].fence(), vec![artifact(repeated)])
        .await
        .expect("artifact 1");
    let fence = |n: usize| match n {
        n if n == stale => store::Fence {
            owner: "intruder".into(),
            ..leases[n].fence()
        },
        n => leases[n].fence(),
    };
    let writes = (0..WORKFLOWS).map(|n| {
        let mut ops = vec![step(&id(n), "s")];
        if n == repeated {
            ops.push(artifact(n));
        }
        let fence = fence(n);
        async move { store.fenced_write(&fence, ops).await }
    });
    let answers = futures_util::future::join_all(writes).await;
    for (n, answer) in answers.iter().enumerate() {
        let steps = store.read_steps(&id(n).into()).await.expect("steps");
        match n {
            n if n == stale => {
                assert!(
                    matches!(answer, Err(Error::LeaseLost { .. })),
                    "{n}: {answer:?}"
                );
                assert!(steps.is_empty(), "a refused write landed");
            }
            n if n == repeated => {
                assert!(matches!(answer, Err(Error::Conflict(_))), "{n}: {answer:?}");
                assert!(steps.is_empty(), "half a write landed");
            }
            n => {
                assert!(answer.is_ok(), "{n}: {answer:?}");
                assert_eq!(steps.len(), 1, "{n}: an acknowledged write is missing");
            }
        }
    }

    // Six admissions at once for three slots, each carrying a journal step.
    const SLOTS: u64 = 3;
    let admissions = (0..6).map(|n| {
        let run = NewRun {
            run_id: format!("run-{n}").into(),
            thread_id: format!("thread-{n}"),
            agent: "echo".into(),
            owner: "node-a".into(),
            lease_ms: 60_000,
            idempotency: Some((format!("{}/a/1", id(n)), json!({}))),
            metadata: json!({}),
            step: Some(WorkflowStep {
                workflow_id: id(n).into(),
                step_id: "a".into(),
                attempt: 1,
                slots_max: SLOTS,
                slots_per_user_max: SLOTS,
                slots_reserved: 0,
                fence: fence(n),
                journal: vec![step(&id(n), "journaled-with-a")],
            }),
        };
        async move { store.admit_run(run).await }
    });
    let admitted = futures_util::future::join_all(admissions).await;
    let mut runs = Vec::new();
    for (n, answer) in admitted.into_iter().enumerate() {
        let journaled = store
            .read_steps(&id(n).into())
            .await
            .expect("steps")
            .iter()
            .any(|s| s.step_id == "journaled-with-a");
        match answer {
            Err(Error::LeaseLost { .. }) if n == stale => assert!(!journaled),
            Ok(Admission::Admitted(row)) => {
                assert!(journaled, "{n}: admitted without its journal");
                runs.push(row.run_id);
            }
            Ok(Admission::Queued) => assert!(!journaled, "{n}: queued, yet its journal landed"),
            other => panic!("{n}: {other:?}"),
        }
    }
    assert!(
        !runs.is_empty() && runs.len() as u64 <= SLOTS,
        "admitted {runs:?} for {SLOTS} slots"
    );
    assert_eq!(store.count_slots().await.expect("slots"), runs.len() as i64);

    // Their ends at once, and one claimed by a node that does not own its run.
    let done = RunOutcome {
        status: RunStatus::Success,
        error: None,
        output: Some(json!({"done": true})),
        stop_reason: None,
        total_tokens: 0,
        message_count: 0,
        failure: None,
    };
    let ends = runs.iter().map(|run_id| {
        let done = &done;
        async move {
            let wrong = store.finalize_run(run_id, "node-b", done, false).await;
            let right = store.finalize_run(run_id, "node-a", done, false).await;
            (wrong, right)
        }
    });
    for (run_id, (wrong, right)) in runs.iter().zip(futures_util::future::join_all(ends).await) {
        assert!(!wrong.expect("the wrong owner's end"), "{run_id}");
        assert!(right.expect("the owner's end"), "{run_id}");
        let row = store.read_run(run_id).await.expect("read").expect("run");
        assert_eq!(row.status, RunStatus::Success);
    }
}

conformance! {
    async fn writes_of_many_workflows_at_once_each_get_their_own_answer(db) {
        writes_of_many_workflows_at_once(&*db.store().await).await;
    }
}

/// On PostgreSQL those writes go out in batches (one writer, so they queue behind each other),
/// with the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_writes_of_many_workflows_commit_in_batches_with_their_own_answers() {
    let (_db, dropping) = crate::harness::TestDb::postgres().await;
    let store = store::Store::open(
        &store::DatabaseUrl::Postgres(dropping.url()),
        &store::StoreOptions {
            pg_writers: 1,
            ..store::StoreOptions::default()
        },
    )
    .await
    .expect("open");
    writes_of_many_workflows_at_once(&store).await;
    let (batches, writes) = store.write_batches();
    assert!(
        batches > 0 && writes > batches,
        "no batch of more than one write: {batches}, {writes}"
    );
    drop(store);
    dropping.drop_database().await;
}

/// A session the server ends while it runs a `COMMIT` may end it after the commit was durable:
/// the writes answer that their outcome is unknown, never that nothing was written, alone and
/// in a batch. (A deferred trigger makes the `COMMIT` sleep; another connection terminates it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_session_ended_during_commit_leaves_the_outcome_unknown() {
    let (_db, dropping) = crate::harness::TestDb::postgres().await;
    let url = dropping.url();
    let (admin, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    admin
        .batch_execute(
            "CREATE FUNCTION test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(30); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER test_slow_commit AFTER INSERT ON workflow_steps
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
               WHEN (NEW.step_id LIKE 'slow%') EXECUTE FUNCTION test_slow_commit();",
        )
        .await
        .expect("a slow commit");
    let store = Arc::new(
        store::Store::open(
            &store::DatabaseUrl::Postgres(url),
            &store::StoreOptions {
                pg_writers: 1,
                ..store::StoreOptions::default()
            },
        )
        .await
        .expect("open"),
    );
    let mut leases = Vec::new();
    for n in 0..3 {
        leases.push(workflow(&*store, &format!("wf-{n}"), "node-a", 60_000).await);
    }
    // Ends the session of the next COMMIT found sleeping in the deferred trigger.
    let terminate_sleeping_commit = async || {
        let started = Instant::now();
        loop {
            let ended: Vec<bool> = admin
                .query(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                      WHERE query = 'COMMIT' AND wait_event = 'PgSleep'",
                    &[],
                )
                .await
                .expect("terminate")
                .iter()
                .map(|row| row.get(0))
                .collect();
            if ended.contains(&true) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no COMMIT sleeping"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let write = |n: usize, step_id: &str| {
        let (store, fence) = (Arc::clone(&store), leases[n].fence());
        let ops = vec![step(&format!("wf-{n}"), step_id)];
        tokio::spawn(async move { store.fenced_write(&fence, ops).await })
    };
    // Alone: the one writer is idle, so the write runs by itself.
    let alone = write(0, "slow-alone");
    terminate_sleeping_commit().await;
    let alone = alone.await.expect("join");
    assert!(
        matches!(alone, Err(Error::OutcomeUnknown(_))),
        "alone: {alone:?}"
    );
    // The pool notices the ended connection before it hands it out again.
    tokio::time::sleep(Duration::from_millis(200)).await;

    // In a batch: a write held at its fence keeps the writer busy while two more queue.
    let (mut locker, connection) = tokio_postgres::connect(&dropping.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let lock = locker.transaction().await.expect("begin");
    lock.execute(
        "SELECT 1 FROM extension_execution_leases WHERE resource_id = 'wf-0' FOR UPDATE",
        &[],
    )
    .await
    .expect("hold wf-0's lease row");
    let held = write(0, "held");
    // The held write is on the server, waiting for the row lock: the writer is busy with it.
    until_a_statement_waits_for_a_lock(&admin, "the held write never waited for the lock").await;
    let (batched, other) = (write(1, "slow-batched"), write(2, "fast"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    lock.commit().await.expect("release");
    held.await.expect("join").expect("the held write");
    terminate_sleeping_commit().await;
    for (name, answer) in [("batched", batched.await), ("other", other.await)] {
        let answer = answer.expect("join");
        assert!(
            matches!(answer, Err(Error::OutcomeUnknown(_))),
            "{name}: {answer:?}"
        );
    }
    let (batches, _) = store.write_batches();
    assert_eq!(batches, 1, "the two writes were not one batch");
    drop(store);
    drop(admin);
    dropping.drop_database().await;
}

/// A workflow's end and an admission of one of its steps in flight at the same moment (a
/// fail-fast `parallel` ends the workflow while a sibling is being admitted): the end waits for
/// the admission's commit and gives back the slot it claimed. Before the end's fence locked the
/// lease row exclusively, the end's `DELETE` of the workflow's slots could not see the
/// admission's uncommitted slot, and a finished workflow held it for good (found by the chaos
/// test, seed 20261201).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_end_gives_back_the_slot_an_admission_in_flight_claims() {
    let (db, dropping) = crate::harness::TestDb::postgres().await;
    let store = db.store().await;
    let lease = workflow(&*store, "wf", "node-a", 60_000).await;
    let url = dropping.url();
    let connect = async || {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
    };
    let (admitting, watcher) = (connect().await, connect().await);
    // The admission's transaction, as the store sends it: the fence, then the slot, not yet
    // committed.
    admitting
        .batch_execute(&format!(
            "BEGIN; SELECT reins_fence('wf', 'node-a', {epoch});
             SELECT reins_claim_fair_slot('wf', 'sibling', 1, 8, 8);",
            epoch = lease.epoch.get()
        ))
        .await
        .expect("an admission in flight");
    let ending = {
        let store = Arc::clone(&store);
        let fence = lease.fence();
        tokio::spawn(async move {
            let end = vec![
                WriteOp::SetWorkflow {
                    workflow_id: "wf".into(),
                    status: store::WorkflowStatus::Failed,
                    data: json!({}),
                },
                WriteOp::ReleaseSlots {
                    workflow_id: "wf".into(),
                },
                WriteOp::ReleaseLease,
            ];
            store.fenced_write(&fence, end).await
        })
    };
    // The end is under way: it waits on the server for the admission's lock.
    until_a_statement_waits_for_a_lock(&watcher, "the end never reached the lease").await;
    admitting.batch_execute("COMMIT").await.expect("admitted");
    ending.await.expect("join").expect("the end");
    let held = store.list_slots(100).await.expect("slots");
    assert_eq!(held, [], "a finished workflow holds a slot");
    drop((store, admitting, watcher));
    dropping.drop_database().await;
}
