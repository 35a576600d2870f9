//! How the runs that asked a person are read, on both backends, and that a status or a control
//! kind read back which this build does not know is an error naming its row; on PostgreSQL, which slot number a
//! step takes and that racing claims of one user count each other under a user's share. The
//! rules of child runs (admission, slots, commit authority, cancellation, approvals, orphans)
//! are the store's conformance suite (`store/tests/conformance`).

use serde_json::json;
use store::{Admission, Launch, LaunchLimits, Lease, NewRun, NewWorkflow, Store, WorkflowStep};

use crate::harness::{TestDb, on_both_backends};

/// The plan of the read `get` makes of a workflow's runs that asked a person (the statement of
/// `approval_runs_in`/`approval_runs_on`): through `runs_asked_by_workflow`, never a scan of
/// every run ever made (which cost every `get` a read proportional to all history).
async fn plan_of_the_runs_that_asked(db: &TestDb) -> String {
    match db {
        TestDb::Postgres { .. } => {
            let client = db.pg_client().await;
            // The planner would scan a table this small anyway: forbid it, so only a usable
            // index can answer.
            client
                .batch_execute("SET enable_seqscan = off")
                .await
                .expect("set");
            let rows = client
                .query(
                    "EXPLAIN SELECT run_id FROM runs WHERE workflow = $1
                       AND (status = 'waiting_for_input' OR metadata -> 'hitl_answer' IS NOT NULL)
                     ORDER BY created_at, run_id",
                    &[&"w"],
                )
                .await
                .expect("explain");
            rows.iter()
                .map(|row| row.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        }
        TestDb::Sqlite { dir, .. } => {
            let connection = rusqlite::Connection::open(dir.path().join("reins.db")).expect("open");
            let mut statement = connection
                .prepare(
                    "EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE workflow = ?1
                       AND (status = 'waiting_for_input'
                            OR json_extract(metadata, '$.hitl_answer') IS NOT NULL)
                     ORDER BY created_at, run_id",
                )
                .expect("explain");
            let rows = statement
                .query_map(["w"], |row| row.get::<_, String>(3))
                .expect("plan");
            rows.map(|row| row.expect("row"))
                .collect::<Vec<_>>()
                .join("\n")
        }
    }
}

on_both_backends! {
    async fn the_runs_that_asked_are_read_through_an_index_never_a_scan(db: TestDb) {
        let plan = plan_of_the_runs_that_asked(&db).await;
        assert!(plan.contains("runs_asked_by_workflow"), "{plan}");
    }
}

/// On PostgreSQL a slot is a number; the next step's claim tries first the number its own
/// admission freed (migration 22) instead of probing for a free one: among a thousand numbers the
/// step takes the one the step before held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflows_next_step_takes_the_very_number_its_admission_frees() {
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let client = db.pg_client().await;
    let workflow = NewWorkflow {
        workflow_id: "wf".into(),
        user_id: "ada".into(),
        request_id: None,
        fingerprint: "fp".into(),
        data: json!({}),
    };
    let launched = store
        .launch_workflow(workflow, "node-a", 60_000, LaunchLimits::NONE)
        .await
        .expect("launch");
    let Launch::Created { lease, .. } = launched else {
        panic!("not created: {launched:?}");
    };
    let step = |step_id: &str, journal: Vec<store::WriteOp>| WorkflowStep {
        workflow_id: "wf".into(),
        step_id: step_id.to_owned(),
        attempt: 1,
        slots_max: 1_000,
        slots_per_user_max: 1_000,
        slots_reserved: 0,
        fence: lease.fence(),
        journal,
    };
    let run = |n: u32, journal: Vec<store::WriteOp>| NewRun {
        run_id: format!("run-{n}").into(),
        thread_id: format!("t-{n}"),
        agent: "echo".into(),
        owner: "node-a".into(),
        lease_ms: 60_000,
        idempotency: None,
        metadata: json!({}),
        step: Some(step(&format!("s{n}"), journal)),
    };
    let number = async |step_id: &str| -> i32 {
        client
            .query_one(
                "SELECT slot_no FROM workflow_slots WHERE workflow = 'wf' AND step_id = $1",
                &[&step_id],
            )
            .await
            .expect("slot")
            .get(0)
    };
    let admitted = |admission: Admission| assert!(matches!(admission, Admission::Admitted(_)));
    admitted(store.admit_run(run(0, Vec::new())).await.expect("admit"));
    for n in 1..4 {
        let before = format!("s{}", n - 1);
        let held = number(&before).await;
        let release = store::WriteOp::ReleaseSlot {
            workflow_id: "wf".into(),
            step_id: before,
        };
        admitted(store.admit_run(run(n, vec![release])).await.expect("admit"));
        assert_eq!(
            number(&format!("s{n}")).await,
            held,
            "step {n} took another number"
        );
    }
}

/// Launches `wf` with one running journal entry (`a`, seq 0) and one admitted child run (`run`).
async fn workflow_with_a_step_and_a_run(store: &Store) -> Lease {
    let workflow = NewWorkflow {
        workflow_id: "wf".into(),
        user_id: "ada".into(),
        request_id: None,
        fingerprint: "fp".into(),
        data: json!({}),
    };
    let Launch::Created { lease, .. } = store
        .launch_workflow(workflow, "node-a", 60_000, LaunchLimits::NONE)
        .await
        .expect("launch")
    else {
        panic!("not created");
    };
    let entry = store::WriteOp::PutStep {
        workflow_id: "wf".into(),
        seq: 0,
        step_id: "a".into(),
        attempt: 1,
        status: store::StepStatus::Running,
        record: store::StepRecord::decode("agent", &json!({})).expect("a step record"),
    };
    store
        .fenced_write(&lease.fence(), vec![entry])
        .await
        .expect("journal");
    let run = NewRun {
        run_id: "run".into(),
        thread_id: "t".into(),
        agent: "echo".into(),
        owner: "node-a".into(),
        lease_ms: 60_000,
        idempotency: None,
        metadata: json!({}),
        step: None,
    };
    let admitted = store.admit_run(run).await.expect("admit");
    assert!(matches!(admitted, Admission::Admitted(_)));
    lease
}

/// The message of a store error that a stored value could not be read, or a panic.
fn unreadable<T: std::fmt::Debug>(read: store::Result<T>) -> String {
    match read {
        Err(store::Error::Database(message)) => message,
        other => panic!("read back as {other:?}"),
    }
}

on_both_backends! {
    /// `admitting` is in the schema's list of journal statuses, but nothing writes it: a row
    /// that holds it fails every read of the journal, naming the row, instead of being read as
    /// some other status.
    async fn a_journal_status_this_build_does_not_know_is_an_error_naming_the_row(db: TestDb) {
        let store = db.store().await;
        workflow_with_a_step_and_a_run(&store).await;
        let changed = db
            .tamper(
                "UPDATE workflow_steps SET status = 'admitting' WHERE workflow = $1",
                "UPDATE workflow_steps SET status = 'admitting' WHERE workflow = ?1",
                &["wf"],
            )
            .await;
        assert_eq!(changed, 1);
        let named = r#"journal entry 0 of workflow "wf" has an unknown status "admitting""#;
        assert_eq!(unreadable(store.read_steps(&store::WorkflowId::from("wf")).await), named);
        assert_eq!(unreadable(store.read_snapshot(&store::WorkflowId::from("wf"), 100, 100).await), named);
    }
}

/// Stores a control kind no build knows in every control row of `wf`, behind the engine's back:
/// PostgreSQL's check constraint is dropped, SQLite's is ignored for the statement's connection.
async fn store_an_unknown_control_kind(db: &TestDb) {
    let update = "UPDATE workflow_controls SET kind = 'approve' WHERE workflow = 'wf';";
    match db {
        TestDb::Postgres { .. } => db
            .pg_client()
            .await
            .batch_execute(&format!(
                "ALTER TABLE workflow_controls DROP CONSTRAINT workflow_controls_kind_check; {update}"
            ))
            .await
            .expect("tamper"),
        TestDb::Sqlite { dir, .. } => {
            let connection =
                rusqlite::Connection::open(dir.path().join("reins.db")).expect("open");
            connection
                .busy_timeout(std::time::Duration::from_secs(30))
                .expect("busy timeout");
            connection
                .execute_batch(&format!("PRAGMA ignore_check_constraints = ON; {update}"))
                .expect("tamper");
        }
    }
}

on_both_backends! {
    /// A control row whose kind this build does not know fails every read of the workflow's
    /// controls, naming the row, instead of being read as some other kind (or ignored, which
    /// would leave a cancellation nobody carries out).
    async fn a_control_kind_this_build_does_not_know_is_an_error_naming_the_row(db: TestDb) {
        let store = db.store().await;
        workflow_with_a_step_and_a_run(&store).await;
        let cancel = store::NewControl {
            workflow_id: "wf".into(),
            kind: store::ControlKind::Cancel,
            step_id: String::new(),
            attempt: 0,
            body: json!({}),
            created_by: None,
        };
        let recorded = store.put_control(cancel).await.expect("cancel");
        let store::ControlWrite::Recorded(row) = recorded else {
            panic!("not recorded: {recorded:?}");
        };
        store_an_unknown_control_kind(&db).await;
        let named = format!(r#"control {} of workflow "wf" has an unknown kind "approve""#, row.id);
        let wf = store::WorkflowId::from("wf");
        assert_eq!(unreadable(store.read_controls(&wf).await), named);
        assert_eq!(unreadable(store.read_snapshot(&wf, 100, 100).await), named);
    }
}

/// The same for a workflow's and a child run's status, on PostgreSQL, whose check constraints
/// are dropped to store a status no build knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflow_or_run_status_this_build_does_not_know_is_an_error_naming_the_row() {
    let db = TestDb::postgres().await;
    let store = db.store().await;
    workflow_with_a_step_and_a_run(&store).await;
    db.pg_client()
        .await
        .batch_execute(
            "ALTER TABLE workflows DROP CONSTRAINT workflows_status_check;
             ALTER TABLE runs DROP CONSTRAINT runs_status_check;
             UPDATE workflows SET status = 'asleep' WHERE id = 'wf';
             UPDATE runs SET status = 'asleep' WHERE run_id = 'run';",
        )
        .await
        .expect("tamper");
    let workflow = r#"workflow "wf" has an unknown status "asleep""#;
    assert_eq!(
        unreadable(store.read_workflow(&store::WorkflowId::from("wf")).await),
        workflow
    );
    assert_eq!(
        unreadable(
            store
                .read_snapshot(&store::WorkflowId::from("wf"), 100, 100)
                .await
        ),
        workflow
    );
    assert_eq!(
        unreadable(
            store
                .read_events(&store::WorkflowId::from("wf"), 0, 10)
                .await
        ),
        workflow
    );
    let everyone = store::ListFilter {
        limit: 10,
        ..store::ListFilter::default()
    };
    assert_eq!(unreadable(store.list_workflows(everyone).await), workflow);
    assert_eq!(
        unreadable(store.delete_workflow(&store::WorkflowId::from("wf")).await),
        workflow
    );
    let run = r#"run "run" has an unknown status "asleep""#;
    assert_eq!(
        unreadable(store.read_run(&store::RunId::from("run")).await),
        run
    );
}

/// On PostgreSQL, claims of one user's steps that race while another user waits count each
/// other: each counts the user's slots under the user's advisory lock, held until it commits
/// (migration 31). The racers are held at the worst moment: a deferred trigger this test adds
/// keeps every commit of a slot waiting until the test lets go, so each racer has claimed its
/// slot and counted before any of them commits. Released, they hold exactly the share of one;
/// without the lock, every racer counted only its own slot and each of them kept it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_of_one_user_count_each_other_while_another_user_waits() {
    const RACERS: usize = 24;
    const BARRIER: i64 = 0x736c_6f74;
    let db = TestDb::postgres().await;
    let store = db.store().await;
    let launch = async |id: &str, user_id: &str| -> Lease {
        let workflow = NewWorkflow {
            workflow_id: id.into(),
            user_id: user_id.into(),
            request_id: None,
            fingerprint: "fp".into(),
            data: json!({}),
        };
        match store
            .launch_workflow(workflow, "node-a", 60_000, LaunchLimits::NONE)
            .await
            .expect("launch")
        {
            Launch::Created { lease, .. } => lease,
            other => panic!("not created: {other:?}"),
        }
    };
    let mut leases = Vec::new();
    for n in 0..RACERS {
        leases.push(launch(&format!("wf-ann-{n}"), "ann").await);
    }
    let bob = launch("wf-bob", "bob").await;
    let queued = store::WriteOp::PutStep {
        workflow_id: "wf-bob".into(),
        seq: 0,
        step_id: "b".into(),
        attempt: 1,
        status: store::StepStatus::Queued,
        record: store::StepRecord::decode("agent", &json!({})).expect("a step record"),
    };
    store
        .fenced_write(&bob.fence(), vec![queued])
        .await
        .expect("bob waits");

    let holder = db.pg_client().await;
    holder
        .batch_execute(&format!(
            "CREATE FUNCTION test_hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_advisory_xact_lock_shared({BARRIER}); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER test_hold_commit AFTER INSERT ON workflow_slots
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_hold_commit();
             SELECT pg_advisory_lock({BARRIER});"
        ))
        .await
        .expect("hold commits");
    // Six stores (six nodes' pools) of four writers each, writing each admission in a
    // transaction of its own (a batch's second claim of ann's would see the first and refuse,
    // failing the whole batch), so that every claim runs at once.
    let alone = store::StoreOptions {
        pg_batch_max: 1,
        ..store::StoreOptions::default()
    };
    let url = store::DatabaseUrl::Postgres(db.url());
    let mut stores = Vec::new();
    for _ in 0..6 {
        let store = Store::open(&url, &alone).await.expect("open a store");
        stores.push(std::sync::Arc::new(store));
    }
    let racers: Vec<_> = leases
        .iter()
        .enumerate()
        .map(|(n, lease)| {
            let store = std::sync::Arc::clone(&stores[n % stores.len()]);
            let run = NewRun {
                run_id: format!("run-{n}").into(),
                thread_id: format!("t-{n}"),
                agent: "echo".into(),
                owner: "node-a".into(),
                lease_ms: 60_000,
                idempotency: None,
                metadata: json!({}),
                step: Some(WorkflowStep {
                    workflow_id: lease.fence().resource_id,
                    step_id: "s".into(),
                    attempt: 1,
                    slots_max: 10_000,
                    slots_per_user_max: 1,
                    slots_reserved: 0,
                    fence: lease.fence(),
                    journal: Vec::new(),
                }),
            };
            tokio::spawn(async move { store.admit_run(run).await.expect("admit") })
        })
        .collect();
    // Each racer waits: at its commit for the test, or, counting under ann's lock, for the one
    // racer that holds it.
    let watcher = db.pg_client().await;
    crate::harness::eventually(
        std::time::Duration::from_secs(60),
        "every claim waits",
        async || {
            let waiting: i64 = watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                      WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("activity")
                .get(0);
            waiting == RACERS as i64
        },
    )
    .await;
    holder
        .batch_execute(&format!("SELECT pg_advisory_unlock({BARRIER})"))
        .await
        .expect("let the commits go");
    let mut admitted = 0;
    for racer in racers {
        if matches!(racer.await.expect("join"), Admission::Admitted(_)) {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 1, "ann's share is one slot while bob waits");
    assert_eq!(store.count_slots().await.expect("slots"), 1);
}
