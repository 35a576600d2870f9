//! A stale owner that wakes up (SIGSTOP, takeover by another real node, SIGCONT) can neither
//! admit a child nor write an artifact: held at a fault point while the other node recovers its
//! workflow, then released, it meets `LeaseLost` (written to `admission_error` or
//! `capture_error`), and the database holds exactly what the new owner wrote.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::http_api::{Db, Node, initialize, wait_for};
use crate::http_client::Api;

/// Polls until `path` exists.
async fn appears(path: &Path, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

struct Pair {
    db: Db,
    stale: Node,
    heir: Node,
    stale_faults: tempfile::TempDir,
    _shared: tempfile::TempDir,
}

/// Two real nodes sharing a database and a workspaces folder, leases of 1 s; only the heir
/// recovers automatically.
async fn pair() -> Pair {
    let db = Db::new(true).await;
    let shared = tempfile::tempdir().expect("shared");
    let stale_faults = tempfile::tempdir().expect("faults");
    let heir_faults = tempfile::tempdir().expect("faults");
    let workspaces = ("REINS_WORKSPACES_DIR", shared.path().display().to_string());
    let lease = ("REINS_LEASE_SECONDS", "1".to_owned());
    let stale = Node::start(
        &db,
        &[
            workspaces.clone(),
            lease.clone(),
            ("REINS_FAULT_DIR", stale_faults.path().display().to_string()),
        ],
    );
    let heir = Node::start(
        &db,
        &[
            workspaces,
            lease,
            ("REINS_RECOVERY", "automatic".to_owned()),
            ("REINS_FAULT_DIR", heir_faults.path().display().to_string()),
        ],
    );
    Pair {
        db,
        stale,
        heir,
        stale_faults,
        _shared: shared,
    }
}

impl Pair {
    fn arm(&self, boundary: &str) {
        std::fs::write(
            self.stale_faults.path().join("arm.json"),
            json!({"boundary": boundary}).to_string(),
        )
        .expect("arm");
    }

    /// Launches on the stale node, stops it at the armed boundary, and waits until the heir
    /// owns the workflow (epoch 2) and it reached `status` there.
    async fn stale_then_taken_over(&mut self, script: &str, status: &str) -> (Api, String) {
        let mut api = initialize(&self.stale).await;
        let launched = api.action("launch", json!({"script": script})).await;
        assert_eq!(launched.status, 200, "{launched:?}");
        let run = launched.json()["run_id"].as_str().expect("id").to_owned();
        appears(
            &self.stale_faults.path().join("reached.json"),
            Duration::from_secs(60),
        )
        .await;
        self.stale.signal(libc::SIGSTOP);
        let mut on_heir = Api::new(self.heir.addr);
        on_heir.cookies = api.cookies.clone();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let record = on_heir.action("get", json!({"run_id": run})).await.json();
            if record["epoch"] == 2 && record["status"] == status {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the heir never took over: {record}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (on_heir, run)
    }

    /// Lets the stale node go on from its fault point and returns what it recorded at `point`.
    async fn wake(&self, point: &str) -> String {
        std::fs::write(self.stale_faults.path().join("release"), b"").expect("release");
        self.stale.signal(libc::SIGCONT);
        let record = self.stale_faults.path().join(point);
        appears(&record, Duration::from_secs(60)).await;
        std::fs::read_to_string(record).expect("record")
    }

    async fn workflow_data(&self, run: &str) -> Option<String> {
        self.db
            .sql(&format!(
                "SELECT data::text FROM workflows WHERE id = '{run}'"
            ))
            .await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_owner_woken_after_a_takeover_cannot_admit_a_child() {
    let mut pair = pair().await;
    pair.arm("before_admission");
    let script = "return await agent({stepId: 'first', agentRef: 'scripted', task: 'stale'});";
    let (mut api, run) = pair.stale_then_taken_over(script, "completed").await;
    let runs = format!("SELECT count(*) FROM runs WHERE workflow = '{run}'");
    assert_eq!(
        pair.db.sql(&runs).await.as_deref(),
        Some("1"),
        "the heir admitted the one child"
    );
    let before = pair.workflow_data(&run).await;

    assert_eq!(pair.wake("admission_error").await, "LeaseLost");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        pair.db.sql(&runs).await.as_deref(),
        Some("1"),
        "the stale owner admitted a child"
    );
    assert_eq!(
        pair.workflow_data(&run).await,
        before,
        "the stale owner changed the workflow"
    );
    assert_eq!(
        wait_for(&mut api, &run, "completed").await["result"]["output"],
        json!({"echo": "stale"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_owner_woken_after_a_takeover_cannot_write_an_artifact() {
    let mut pair = pair().await;
    pair.arm("capture");
    let script = "await agent({stepId: 'writer', agentRef: 'scripted', task: {write: [{path: \
        '/mnt/user-data/outputs/evidence.txt', content: 'evidence'}]}}); \
        const f = await captureArtifact({stepId: 'file', sourceStepId: 'writer', \
        path: '/mnt/user-data/outputs/evidence.txt'}); \
        await humanCheckpoint({stepId: 'review', sourceStepId: 'file', artifactVersion: f.artifactVersion}); \
        return 31;";
    let (mut api, run) = pair.stale_then_taken_over(script, "waiting_approval").await;
    let artifacts = format!(
        "SELECT string_agg(version || ':' || encode(content, 'escape'), ',' ORDER BY version) \
         FROM workflow_artifacts WHERE workflow = '{run}'"
    );
    let before = (
        pair.workflow_data(&run).await,
        pair.db.sql(&artifacts).await,
    );
    assert!(
        before.1.as_deref().is_some_and(|a| a.contains("evidence")),
        "{before:?}"
    );

    assert_eq!(pair.wake("capture_error").await, "LeaseLost");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = (
        pair.workflow_data(&run).await,
        pair.db.sql(&artifacts).await,
    );
    assert_eq!(after, before, "the stale owner wrote");

    let record: Value = wait_for(&mut api, &run, "waiting_approval").await;
    let checkpoint = &record["checkpoints"][0];
    let decided = api
        .action(
            "decide",
            json!({"run_id": run, "step_id": "review", "attempt": 1,
        "artifact_version": checkpoint["artifact_version"], "decision": "approve"}),
        )
        .await;
    assert_eq!(decided.status, 200, "{decided:?}");
    assert_eq!(wait_for(&mut api, &run, "completed").await["result"], 31);
}
