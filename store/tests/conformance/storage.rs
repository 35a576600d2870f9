//! The per-user quota on stored bytes (`limits.user_stored_bytes_max`): a grant over it is
//! refused with nothing of its write stored, racing grants of one user from two nodes never pass
//! it, and a workflow's end and its deletion give its bytes back.

use std::sync::Arc;

use serde_json::json;
use store::{Deletion, Error, Limit, WorkflowId, WriteOp};

use crate::harness::{Subject, conformance, step, workflow_of};

/// A grant of `bytes` to `workflow` under a quota of `bytes_max`.
fn take(workflow: &str, bytes: i64, bytes_max: i64) -> WriteOp {
    WriteOp::TakeStorage {
        workflow_id: workflow.into(),
        bytes,
        bytes_max,
    }
}

/// Artifact `version` of `workflow`, `bytes` long.
fn artifact(workflow: &str, version: i64, bytes: usize) -> WriteOp {
    WriteOp::PutArtifact {
        workflow_id: workflow.into(),
        version,
        source_step_id: "s".into(),
        path: Some("out.bin".into()),
        content: vec![b'x'; bytes],
        sha256: "hash".into(),
    }
}

/// What `user` stores (0 when they never stored anything).
async fn stored<S: Subject>(store: &S, user: &str) -> i64 {
    let all = store.stored_bytes(Some(user)).await.expect("stored bytes");
    assert!(all.iter().all(|row| row.user_id == user), "{all:?}");
    all.first().map_or(0, |row| row.stored_bytes)
}

fn end(workflow: &str) -> WriteOp {
    WriteOp::SetWorkflow {
        workflow_id: workflow.into(),
        status: store::WorkflowStatus::Completed,
        data: json!({"result": 1}),
    }
}

conformance! {
    async fn a_grant_over_the_quota_is_refused_and_nothing_of_its_write_is_stored(db) {
        let store = db.store().await;
        let ada = workflow_of(&*store, "ada-wf", "ada", "node", 60_000).await;
        let bob = workflow_of(&*store, "bob-wf", "bob", "node", 60_000).await;
        let wf = WorkflowId::from("ada-wf");

        store.fenced_write(&ada.fence(), vec![step("ada-wf", "s1"), take("ada-wf", 60, 100), artifact("ada-wf", 1, 60)])
            .await.expect("within the quota");
        assert_eq!(stored(&*store, "ada").await, 60);

        // One byte over: the grant, the journal entry and the artifact of that write are refused
        // together, and the refusal names what is stored and the quota.
        let over = store.fenced_write(&ada.fence(), vec![step("ada-wf", "s2"), take("ada-wf", 41, 100), artifact("ada-wf", 2, 41)]).await;
        assert!(matches!(over, Err(Error::LimitReached(Limit::StoredBytes { stored: 60, max: 100 }))), "{over:?}");
        let steps: Vec<String> = store.read_steps(&wf).await.expect("steps").into_iter().map(|s| s.step_id).collect();
        assert_eq!(steps, ["s1"], "half a refused write landed");
        assert_eq!(store.last_artifact_version(&wf).await.expect("last"), 1);
        assert_eq!(stored(&*store, "ada").await, 60);

        // Two grants of one write are counted together: the second is over, so neither is taken.
        let both = store.fenced_write(&ada.fence(), vec![take("ada-wf", 20, 100), take("ada-wf", 21, 100)]).await;
        assert!(matches!(both, Err(Error::LimitReached(Limit::StoredBytes { max: 100, .. }))), "{both:?}");
        assert_eq!(stored(&*store, "ada").await, 60);

        // Exactly the quota is allowed; one byte more is not.
        store.fenced_write(&ada.fence(), vec![take("ada-wf", 40, 100), artifact("ada-wf", 2, 40)])
            .await.expect("up to the quota");
        assert_eq!(stored(&*store, "ada").await, 100);
        let full = store.fenced_write(&ada.fence(), vec![take("ada-wf", 1, 100)]).await;
        assert!(matches!(full, Err(Error::LimitReached(Limit::StoredBytes { stored: 100, max: 100 }))), "{full:?}");

        // Another user's quota is their own.
        store.fenced_write(&bob.fence(), vec![take("bob-wf", 100, 100)]).await.expect("bob's own quota");
        assert_eq!((stored(&*store, "ada").await, stored(&*store, "bob").await), (100, 100));
        let everyone = store.stored_bytes(None).await.expect("every user");
        let everyone: Vec<(String, i64)> = everyone.into_iter().map(|row| (row.user_id, row.stored_bytes)).collect();
        assert_eq!(everyone, [("ada".to_owned(), 100), ("bob".to_owned(), 100)]);
        assert_eq!(stored(&*store, "carol").await, 0, "a user who stored nothing");

        // A quota of 0 is none.
        store.fenced_write(&ada.fence(), vec![take("ada-wf", 1_000, 0)]).await.expect("no quota");
        assert_eq!(stored(&*store, "ada").await, 1_100);

        // A grant to a workflow that does not exist is refused like any change of one.
        let missing = store.fenced_write(&ada.fence(), vec![take("no-such-workflow", 1, 0)]).await;
        assert!(matches!(missing, Err(Error::NotFound(_))), "{missing:?}");
        assert_eq!(stored(&*store, "ada").await, 1_100);
    }
}

conformance! {
    async fn racing_grants_of_one_user_from_many_nodes_never_pass_the_quota(db) {
        // Six nodes (six pools on PostgreSQL, so few grants share a transaction) grant to twelve
        // workflows of one user at once, three grants each: 36 grants of 10 bytes for a quota
        // of 100. Exactly ten may be taken. Eight users in turn, for eight races at the edge.
        const NODES: usize = 6;
        const WORKFLOWS: usize = 12;
        let mut nodes = Vec::new();
        for _ in 0..NODES {
            nodes.push(db.store().await);
        }
        for user in 0..8 {
            let user = format!("user-{user}");
            let mut workflows = Vec::new();
            for n in 0..WORKFLOWS {
                let id = format!("{user}-wf-{n}");
                let lease = workflow_of(&*nodes[0], &id, &user, "node", 60_000).await;
                workflows.push((id, lease.fence()));
            }
            let mut grants = Vec::new();
            for round in 0..3 {
                for (n, (id, fence)) in workflows.iter().enumerate() {
                    let store = Arc::clone(&nodes[(n + round) % NODES]);
                    let (id, fence) = (id.clone(), fence.clone());
                    grants.push(tokio::spawn(async move {
                        store.fenced_write(&fence, vec![take(&id, 10, 100)]).await
                    }));
                }
            }
            let mut taken = 0;
            for grant in grants {
                match grant.await.expect("grant task") {
                    Ok(()) => taken += 1,
                    Err(Error::LimitReached(Limit::StoredBytes { stored, max: 100 })) => {
                        assert!(stored + 10 > 100, "{user}: refused with room left: {stored}");
                    }
                    Err(other) => panic!("{user}: {other:?}"),
                }
            }
            assert_eq!(taken, 10, "{user}: grants taken");
            assert_eq!(stored(&*nodes[1], &user).await, 100, "{user}");
        }
    }
}

conformance! {
    async fn a_workflows_end_gives_back_its_unused_grant_and_its_deletion_the_rest(db) {
        let store = db.store().await;
        let first = workflow_of(&*store, "first", "ada", "node", 60_000).await;
        let second = workflow_of(&*store, "second", "ada", "node", 60_000).await;
        store.fenced_write(&first.fence(), vec![take("first", 100, 1_000), artifact("first", 1, 30)])
            .await.expect("grant and artifact");
        store.fenced_write(&first.fence(), vec![artifact("first", 2, 20)]).await.expect("inside the grant");
        store.fenced_write(&second.fence(), vec![take("second", 50, 1_000), artifact("second", 1, 50)])
            .await.expect("a grant used up");
        assert_eq!(stored(&*store, "ada").await, 150);

        // Its end keeps what its artifacts take (50 bytes) and gives back the rest of its grant.
        store.fenced_write(&first.fence(), vec![end("first"), WriteOp::ReturnStorage { workflow_id: "first".into() }, WriteOp::ReleaseLease])
            .await.expect("end");
        assert_eq!(stored(&*store, "ada").await, 100);
        // A grant used up has nothing to give back, and giving back twice gives nothing more.
        store.fenced_write(&second.fence(), vec![end("second"), WriteOp::ReturnStorage { workflow_id: "second".into() }])
            .await.expect("end");
        store.fenced_write(&second.fence(), vec![WriteOp::ReturnStorage { workflow_id: "second".into() }])
            .await.expect("again");
        assert_eq!(stored(&*store, "ada").await, 100);

        // The room given back is the user's again: 900 more fit a quota of 1,000 only without it.
        let third = workflow_of(&*store, "third", "ada", "node", 60_000).await;
        store.fenced_write(&third.fence(), vec![take("third", 900, 1_000)]).await.expect("the room given back");
        assert_eq!(stored(&*store, "ada").await, 1_000);
        let over = store.fenced_write(&third.fence(), vec![take("third", 1, 1_000)]).await;
        assert!(matches!(over, Err(Error::LimitReached(Limit::StoredBytes { stored: 1_000, max: 1_000 }))), "{over:?}");

        // Deletion gives back what the workflow's artifacts took.
        assert_eq!(store.delete_workflow(&WorkflowId::from("first")).await.expect("delete"), Deletion::Deleted);
        assert_eq!(stored(&*store, "ada").await, 950);
        assert_eq!(store.delete_workflow(&WorkflowId::from("second")).await.expect("delete"), Deletion::Deleted);
        assert_eq!(stored(&*store, "ada").await, 900);
        store.fenced_write(&third.fence(), vec![end("third"), WriteOp::ReturnStorage { workflow_id: "third".into() }])
            .await.expect("end");
        assert_eq!(stored(&*store, "ada").await, 0, "a grant never used");
        assert_eq!(store.delete_workflow(&WorkflowId::from("third")).await.expect("delete"), Deletion::Deleted);
        assert_eq!(stored(&*store, "ada").await, 0);

        // A workflow that never stored anything ends and goes without changing anyone's bytes.
        let plain = workflow_of(&*store, "plain", "ada", "node", 60_000).await;
        store.fenced_write(&plain.fence(), vec![end("plain"), WriteOp::ReturnStorage { workflow_id: "plain".into() }])
            .await.expect("end");
        assert_eq!(store.delete_workflow(&WorkflowId::from("plain")).await.expect("delete"), Deletion::Deleted);
        assert_eq!(stored(&*store, "ada").await, 0);

        // All of it is the user's again.
        let last = workflow_of(&*store, "last", "ada", "node", 60_000).await;
        store.fenced_write(&last.fence(), vec![take("last", 1_000, 1_000)]).await.expect("the whole quota again");
    }
}

/// Workflows of two users with artifacts written before migration 32 existed (no grants), and
/// one without any: what the migration must count.
async fn stored_before_the_quota(store: &store::Store) {
    for (id, user, sizes) in [
        ("a1", "ada", &[100, 20][..]),
        ("a2", "ada", &[3]),
        ("b1", "bob", &[7]),
        ("c1", "carol", &[]),
    ] {
        let lease = workflow_of(store, id, user, "node", 60_000).await;
        let artifacts = sizes
            .iter()
            .zip(1..)
            .map(|(bytes, version)| artifact(id, version, *bytes))
            .collect();
        store
            .fenced_write(&lease.fence(), artifacts)
            .await
            .expect("artifacts");
    }
}

/// What migration 32 counted: every user's stored bytes.
async fn counted(store: &store::Store) -> Vec<(String, i64)> {
    let rows = store.stored_bytes(None).await.expect("stored bytes");
    rows.into_iter()
        .map(|row| (row.user_id, row.stored_bytes))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migration_32_counts_the_bytes_stored_before_it() {
    let (db, dropping) = crate::harness::TestDb::postgres().await;
    let store = db.store().await;
    stored_before_the_quota(&store).await;
    let (client, connection) = tokio_postgres::connect(&dropping.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let connection = tokio::spawn(connection);
    client
        .batch_execute(
            "DROP FUNCTION reins_take_storage(TEXT, BIGINT, BIGINT);
             DROP FUNCTION reins_return_storage(TEXT);
             DROP TABLE user_storage, workflow_storage;
             DELETE FROM schema_migrations WHERE version = 32;",
        )
        .await
        .expect("back to the schema before migration 32");
    drop(client);
    let _ = connection.await;
    assert_eq!(store.migrate().await.expect("migrate").applied, [32]);
    assert_eq!(
        counted(&store).await,
        [("ada".to_owned(), 123), ("bob".to_owned(), 7)]
    );
    // Deleting a workflow stored before the quota gives its bytes back like any other.
    store
        .fenced_write(
            &store::Fence {
                resource_id: "a1".into(),
                owner: "node".into(),
                epoch: store::Epoch::FIRST,
            },
            vec![end("a1")],
        )
        .await
        .expect("end");
    assert_eq!(
        store
            .delete_workflow(&WorkflowId::from("a1"))
            .await
            .expect("delete"),
        Deletion::Deleted
    );
    assert_eq!(
        counted(&store).await,
        [("ada".to_owned(), 3), ("bob".to_owned(), 7)]
    );
    drop(store);
    dropping.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_migration_32_counts_the_bytes_stored_before_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = store::DatabaseUrl::Sqlite(dir.path().join("reins.db"));
    let open = || async {
        let store = store::Store::open(&url, &store::StoreOptions::default())
            .await
            .expect("open");
        let applied = store.migrate().await.expect("migrate").applied;
        (store, applied)
    };
    let (store, _) = open().await;
    stored_before_the_quota(&store).await;
    drop(store);
    rusqlite::Connection::open(dir.path().join("reins.db"))
        .expect("open")
        .execute_batch(
            "DROP TABLE user_storage; DROP TABLE workflow_storage;
             DELETE FROM schema_migrations WHERE version = 32;",
        )
        .expect("back to the schema before migration 32");
    let (store, applied) = open().await;
    assert_eq!(applied, [32]);
    assert_eq!(
        counted(&store).await,
        [("ada".to_owned(), 123), ("bob".to_owned(), 7)]
    );
}

/// Attempt `attempt` of step `step_id` of `workflow`, failed with `message`.
fn failed(workflow: &str, step_id: &str, attempt: i32, message: &str) -> WriteOp {
    let mut record = store::StepRecord::new(store::StepKind::Agent, json!({}));
    record.outcome = Some(store::StepOutcome::Rejected(json!({"message": message})));
    WriteOp::PutStep {
        workflow_id: workflow.into(),
        seq: 0,
        step_id: step_id.into(),
        attempt,
        status: store::StepStatus::Failed,
        record,
    }
}

conformance! {
    /// A journal row's error is stored inside its workflow's grant: the end keeps its bytes
    /// (`StepRecord::error_bytes`), rewriting the row counts it once, and deletion gives it back.
    async fn a_workflows_errors_are_kept_inside_its_grant(db) {
        let store = db.store().await;
        let lease = workflow_of(&*store, "wf", "ada", "node", 60_000).await;
        let one = failed("wf", "s", 1, "boom");
        let bytes = match &one { WriteOp::PutStep { record, .. } => record.error_bytes(), _ => unreachable!() };
        assert_eq!(bytes, r#"{"message":"boom"}"#.len() as i64);
        assert_eq!(store::error_bytes(&[one.clone(), failed("wf", "s", 2, "boom"), step("wf", "ok")]), 2 * bytes);
        store.fenced_write(&lease.fence(), vec![take("wf", 100, 1_000), one.clone(), failed("wf", "s", 2, "boom")])
            .await.expect("two failed attempts");
        store.fenced_write(&lease.fence(), vec![one]).await.expect("a row written again");
        store.fenced_write(&lease.fence(), vec![end("wf"), WriteOp::ReturnStorage { workflow_id: "wf".into() }])
            .await.expect("end");
        assert_eq!(stored(&*store, "ada").await, 2 * bytes, "the end keeps what the errors take");
        assert_eq!(store.delete_workflow(&WorkflowId::from("wf")).await.expect("delete"), Deletion::Deleted);
        assert_eq!(stored(&*store, "ada").await, 0);
    }
}
