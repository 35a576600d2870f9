//! A failed workflow run again from its failed step (`retry_workflow`): a new workflow that
//! adopts the journal below the call it names and the artifact versions those calls made, its
//! bytes a grant under its owner's quota, linked to the workflow it retries, which is never
//! written; one retry per workflow, and every refusal writes nothing.

use serde_json::json;
use store::{
    Error, Launch, LaunchLimits, Lease, Limit, NewRetry, NewWorkflow, Retry, StepStatus,
    WorkflowId, WorkflowStatus, WriteOp,
};

use crate::harness::{Subject, conformance, workflow_of};

/// Journal entry `seq` of `workflow`: call `step_id` at `attempt`, with `status`.
fn entry(workflow: &str, seq: i32, step_id: &str, attempt: i32, status: StepStatus) -> WriteOp {
    WriteOp::PutStep {
        workflow_id: workflow.into(),
        seq,
        step_id: step_id.to_owned(),
        attempt,
        status,
        record: store::StepRecord::decode(
            "agent",
            &json!({"args": {"stepId": step_id}, "outcome": {"outcome": "resolved", "value": seq}}),
        )
        .expect("a step record"),
    }
}

/// Artifact `version` of `workflow`, made by `step_id`, `bytes` long.
fn artifact(workflow: &str, version: i64, step_id: &str, bytes: usize) -> WriteOp {
    WriteOp::PutArtifact {
        workflow_id: workflow.into(),
        version,
        source_step_id: step_id.into(),
        path: Some(format!("{step_id}.txt")),
        content: vec![b'a' + u8::try_from(version).unwrap_or(0); bytes],
        sha256: format!("hash-{version}"),
    }
}

/// The end of a workflow at `status`, as a supervisor writes it.
fn end(workflow: &str, status: WorkflowStatus) -> Vec<WriteOp> {
    vec![
        WriteOp::SetWorkflow {
            workflow_id: workflow.into(),
            status,
            data: json!({"script": "s", "error": "d failed"}),
        },
        WriteOp::ReturnStorage {
            workflow_id: workflow.into(),
        },
        WriteOp::ReleaseLease,
    ]
}

/// A workflow of ada's that failed at its call 3 (`d`): `a`, `b` (a second attempt after a
/// failed first) and `c` completed, with artifacts from `a`, `c` and `d`.
async fn failed<S: Subject>(store: &S, id: &str) -> Lease {
    let lease = workflow_of(store, id, "ada", "node", 60_000).await;
    let ops = vec![
        WriteOp::TakeStorage {
            workflow_id: id.into(),
            bytes: 100,
            bytes_max: 0,
        },
        artifact(id, 1, "a", 10),
        entry(id, 0, "a", 1, StepStatus::Completed),
        entry(id, 1, "b", 1, StepStatus::Failed),
        entry(id, 1, "b", 2, StepStatus::Completed),
        artifact(id, 2, "c", 20),
        entry(id, 2, "c", 1, StepStatus::Completed),
        artifact(id, 3, "d", 5),
        entry(id, 3, "d", 1, StepStatus::Failed),
    ];
    store
        .fenced_write(&lease.fence(), ops)
        .await
        .expect("journal");
    store
        .fenced_write(&lease.fence(), end(id, WorkflowStatus::Failed))
        .await
        .expect("failed");
    lease
}

/// A retry of `source` as `id`, adopting the calls below `adopted_calls`.
fn retry(id: &str, source: &str, adopted_calls: i32, request_id: Option<&str>) -> NewRetry {
    NewRetry {
        workflow: NewWorkflow {
            workflow_id: id.into(),
            user_id: "ada".into(),
            request_id: request_id.map(str::to_owned),
            fingerprint: "fp".into(),
            data: json!({"retry_of": source}),
        },
        retry_of: source.into(),
        adopted_calls,
        stored_bytes_max: 1_000,
        copied_bytes: 0,
    }
}

/// What `user` stores (0 when they never stored anything).
async fn stored<S: Subject>(store: &S, user: &str) -> i64 {
    let all = store.stored_bytes(Some(user)).await.expect("stored bytes");
    all.first().map_or(0, |row| row.stored_bytes)
}

/// A workflow's journal as `(seq, step, attempt, status)` with each entry's record.
async fn journal<S: Subject>(
    store: &S,
    id: &str,
) -> Vec<((i32, String, i32, StepStatus), Option<store::StepRecord>)> {
    let steps = store.read_steps(&id.into()).await.expect("steps");
    steps
        .into_iter()
        .map(|s| {
            let record = s.record().cloned();
            ((s.seq, s.step_id, s.attempt, s.status), record)
        })
        .collect()
}

async fn retried_by<S: Subject>(store: &S, id: &str) -> Option<WorkflowId> {
    store
        .read_snapshot(&id.into(), 10, 10)
        .await
        .expect("snapshot")
        .expect("exists")
        .retried_by
}

conformance! {
    async fn a_retry_adopts_the_journal_below_its_call_with_its_artifacts_and_leaves_the_source_as_it_was(db) {
        let store = db.store().await;
        failed(&*store, "old").await;
        let before = store.read_workflow(&"old".into()).await.expect("read").expect("old");
        assert_eq!(stored(&*store, "ada").await, 35, "the failed workflow keeps its artifacts' bytes");

        let retried = store.retry_workflow(retry("new", "old", 3, Some("again")), "node-b", 60_000, LaunchLimits::NONE)
            .await.expect("retry");
        let Retry::Created { row, lease } = retried else { panic!("not created: {retried:?}") };
        assert_eq!((row.workflow_id.as_str(), row.status, row.user_id.as_str(), row.owner.as_deref()),
                   ("new", WorkflowStatus::Running, "ada", Some("node-b")));
        assert_eq!((lease.epoch, lease.owner.as_str()), (store::Epoch::FIRST, "node-b"));
        assert_eq!(row.data, json!({"retry_of": "old"}));

        // Every entry of the calls below 3 (both attempts of `b`), as they were; `d` is not.
        let adopted = journal(&*store, "new").await;
        let source: Vec<_> = journal(&*store, "old").await.into_iter().filter(|((seq, ..), _)| *seq < 3).collect();
        assert_eq!(adopted, source);
        assert_eq!(adopted.len(), 4);
        // The artifacts of `a` and `c` under their own numbers, bytes and all; not `d`'s.
        let new: WorkflowId = "new".into();
        assert_eq!(store.last_artifact_version(&new).await.expect("last"), 2);
        for version in [1, 2] {
            let copied = store.read_artifact(&new, version).await.expect("read").expect("copied");
            let original = store.read_artifact(&"old".into(), version).await.expect("read").expect("original");
            assert_eq!(copied, original);
        }
        assert_eq!(store.read_artifact(&new, 3).await.expect("read"), None);
        // Its adopted bytes are a grant of its own under ada's quota.
        assert_eq!(stored(&*store, "ada").await, 65);
        let kinds: Vec<String> = store.read_events(&new, 0, 100).await.expect("events").expect("new")
            .events.into_iter().map(|e| e.kind).collect();
        assert!(kinds.iter().filter(|k| *k == "artifact").count() == 2 && kinds.contains(&"step_journaled".to_owned()), "{kinds:?}");

        // Linked both ways; the source is not written.
        assert_eq!(retried_by(&*store, "old").await, Some(new.clone()));
        assert_eq!(retried_by(&*store, "new").await, None);
        assert_eq!(store.read_workflow(&"old".into()).await.expect("read"), Some(before));

        // Asked again, under any id: that retry, still one.
        let again = store.retry_workflow(retry("newer", "old", 3, None), "node-c", 60_000, LaunchLimits::NONE)
            .await.expect("retry again");
        assert!(matches!(&again, Retry::Existing(row) if row.workflow_id == new), "{again:?}");
        assert_eq!(store.read_workflow(&"newer".into()).await.expect("read"), None);
        assert_eq!(stored(&*store, "ada").await, 65);

        // The new workflow lives its own life: it writes under its lease, and ends.
        store.fenced_write(&lease.fence(), vec![entry("new", 3, "d", 1, StepStatus::Completed)])
            .await.expect("the failed call runs again");
        store.fenced_write(&lease.fence(), end("new", WorkflowStatus::Failed)).await.expect("ends");
        // A retry of the retry adopts from it.
        let Retry::Created { .. } = store.retry_workflow(retry("third", "new", 4, None), "node", 60_000, LaunchLimits::NONE)
            .await.expect("retry the retry") else { panic!("not created") };
        assert_eq!(journal(&*store, "third").await.len(), 5);

        // Deleting a retry takes its link with it: the source may be retried again.
        store.fenced_write(&store::Fence { resource_id: "third".into(), owner: "node".into(), epoch: store::Epoch::FIRST },
                           end("third", WorkflowStatus::Failed)).await.expect("ends");
        assert_eq!(store.delete_workflow(&"third".into()).await.expect("delete"), store::Deletion::Deleted);
        assert_eq!(retried_by(&*store, "new").await, None);
        assert_eq!(store.delete_workflow(&"old".into()).await.expect("delete"), store::Deletion::Deleted);
        assert!(store.read_workflow(&new).await.expect("read").is_some(), "deleting a source deleted its retry");
    }
}

conformance! {
    async fn only_a_failed_workflow_is_retried_and_a_refused_retry_writes_nothing(db) {
        let store = db.store().await;
        let limits = LaunchLimits::NONE;
        let refused = async |retry: NewRetry, limits: LaunchLimits| {
            let id = retry.workflow.workflow_id.clone();
            let answer = store.retry_workflow(retry, "node", 60_000, limits).await;
            assert_eq!(store.read_workflow(&id).await.expect("read"), None, "{answer:?} wrote the retry");
            answer
        };
        assert_eq!(refused(retry("r0", "nobody", 0, None), limits).await.expect("answer"), Retry::NotFound);

        let live = workflow_of(&*store, "live", "ada", "node", 60_000).await;
        assert_eq!(refused(retry("r1", "live", 0, None), limits).await.expect("answer"), Retry::NotFailed(WorkflowStatus::Running));
        store.fenced_write(&live.fence(), end("live", WorkflowStatus::Completed)).await.expect("completed");
        assert_eq!(refused(retry("r2", "live", 0, None), limits).await.expect("answer"), Retry::NotFailed(WorkflowStatus::Completed));

        failed(&*store, "old").await;
        // The adopted artifacts (30 bytes) do not fit beside the 35 stored: refused, named.
        let tight = NewRetry { stored_bytes_max: 64, ..retry("r3", "old", 3, None) };
        assert_eq!(refused(tight, limits).await.expect("answer"),
                   Retry::Refused { limit: Limit::StoredBytes { stored: 35, max: 64 }, max: 64 });
        // At the edge it fits.
        let edge = NewRetry { stored_bytes_max: 65, ..retry("fits", "old", 3, None) };
        assert!(matches!(store.retry_workflow(edge, "node", 60_000, limits).await.expect("answer"), Retry::Created { .. }));
        store.fenced_write(&store::Fence { resource_id: "fits".into(), owner: "node".into(), epoch: store::Epoch::FIRST },
                           end("fits", WorkflowStatus::Failed)).await.expect("ends");
        assert_eq!(store.delete_workflow(&"fits".into()).await.expect("delete"), store::Deletion::Deleted);
        assert_eq!(stored(&*store, "ada").await, 35, "the deleted retry gave its grant back");

        // A launch limit refuses it as it refuses a launch.
        let full = LaunchLimits { max_workflows: 100, max_workflows_per_owner: 0 };
        assert_eq!(refused(retry("r4", "old", 3, None), full).await.expect("answer"),
                   Retry::Refused { limit: Limit::WorkflowsPerOwner, max: 0 });
        // A request id another workflow of the owner's was launched with is a conflict.
        let other = store.launch_workflow(NewWorkflow { workflow_id: "other".into(), user_id: "ada".into(),
            request_id: Some("taken".into()), fingerprint: "fp".into(), data: json!({}) }, "node", 60_000, limits)
            .await.expect("launch");
        assert!(matches!(other, Launch::Created { .. }));
        let conflict = refused(retry("r5", "old", 3, Some("taken")), limits).await;
        assert!(matches!(conflict, Err(Error::Conflict(_))), "{conflict:?}");

        assert_eq!(retried_by(&*store, "old").await, None, "a refused retry left a link");
        assert_eq!(stored(&*store, "ada").await, 35);
        assert_eq!(journal(&*store, "old").await.len(), 5);
    }
}

conformance! {
    async fn two_retries_of_one_workflow_at_once_make_one(db) {
        let (first, second) = (db.store().await, db.store().await);
        failed(&*first, "old").await;
        let (a, b) = tokio::join!(
            first.retry_workflow(retry("by-a", "old", 3, None), "node-a", 60_000, LaunchLimits::NONE),
            second.retry_workflow(retry("by-b", "old", 3, None), "node-b", 60_000, LaunchLimits::NONE),
        );
        let (a, b) = (a.expect("a"), b.expect("b"));
        let made = |answer: &Retry| match answer {
            Retry::Created { row, .. } | Retry::Existing(row) => row.workflow_id.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(made(&a), made(&b), "{a:?} / {b:?}");
        assert_eq!(
            [&a, &b].iter().filter(|answer| matches!(answer, Retry::Created { .. })).count(),
            1
        );
        assert_eq!(retried_by(&*first, "old").await, Some(made(&a)));
    }
}
