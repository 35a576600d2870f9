//! The real `reins` binary killed with SIGKILL at every journal boundary of a workflow that uses
//! every script API call, then a second process recovering it (automatic recovery): it completes
//! with the result of an uninterrupted run and exactly one child run per step attempt, and a
//! captured artifact stays as captured even when its source file changes after the capture. At
//! `admission` (a child admitted, not yet journaled) the child's fate is unknown: the workflow
//! waits for an operator in `needs_reconciliation`, still with one child run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use store::{ControlKind, Launch, LaunchLimits, NewControl, NewWorkflow};

use crate::harness::{ReinsProcess, TestDb, free_port};

const SCRIPT: &str = r#"
    const draft = await agent({stepId: "draft", agentRef: "scripted", task: {
        write: [{path: "/mnt/user-data/outputs/evidence.txt", content: "evidence v1"}],
        hold_while: "hold_model", output: "drafted"}});
    const cap = await captureArtifact({stepId: "cap", sourceStepId: "draft",
                                       path: "/mnt/user-data/outputs/evidence.txt"});
    const review = await humanCheckpoint({stepId: "review", sourceStepId: "cap",
                                          artifactVersion: cap.artifactVersion});
    const resumed = await pause({stepId: "hold"});
    const text = await readArtifact({artifactVersion: cap.artifactVersion});
    const done = await agent({stepId: "final", agentRef: "scripted", task: "finish"});
    return {draft: draft.output, text, decision: review.decision, resumed, done: done.output,
            versions: [draft.artifactVersion, cap.artifactVersion]};
"#;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(0))
        .unwrap_or(0)
}

/// What a run ended as, and how many child runs each agent step had.
struct Ended {
    status: String,
    result: Value,
    runs: Vec<(String, i64)>,
}

fn env(db: &TestDb, shared: &Path, addr: SocketAddr) -> Vec<(&'static str, String)> {
    vec![
        ("REINS_DATABASE", db.url()),
        ("REINS_LISTEN", addr.to_string()),
        ("REINS_RECOVERY", "automatic".into()),
        ("REINS_LEASE_SECONDS", "1".into()),
        (
            "REINS_FAULT_DIR",
            shared.join("faults").display().to_string(),
        ),
        ("REINS_DATA_DIR", shared.join("data").display().to_string()),
        (
            "REINS_WORKSPACES_DIR",
            shared.join("workspaces").display().to_string(),
        ),
    ]
}

fn address() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().expect("addr")
}

fn find_evidence(root: &Path) -> Option<PathBuf> {
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.file_name().is_some_and(|n| n == "evidence.txt") {
                return Some(path);
            }
        }
    }
    None
}

/// Launches the workflow as a node that dies at once, runs it on a real node killed at
/// `boundary` (none: not killed), and lets a second real node recover it. With `hold_draft`, the
/// first agent is still running when the node dies. With `tamper`, the captured file changes
/// while no node runs.
async fn run(boundary: Option<&str>, hold_draft: bool, tamper: bool) -> Ended {
    let db = TestDb::postgres().await;
    let shared = tempfile::tempdir().expect("temp dir");
    std::fs::create_dir_all(shared.path().join("faults")).expect("faults");
    if hold_draft {
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
    }
    let id = format!("crash-{}", boundary.unwrap_or("none"));
    {
        let store = db.store().await;
        let workflow = NewWorkflow {
            workflow_id: store::WorkflowId::from(id.clone()),
            user_id: "ada".into(),
            request_id: None,
            fingerprint: "fp".into(),
            data: json!({
                "script": SCRIPT,
                "args": {},
                "seed": 7,
                "started_at_ms": now_ms(),
                "runtime_version": runtime::runtime_version(&runtime::Limits::default()),
            }),
        };
        // The launching node "dies" at once: its lease lasts 1 ms.
        let launched = store
            .launch_workflow(workflow, "launcher", 1, LaunchLimits::NONE)
            .await;
        assert!(
            matches!(launched, Ok(Launch::Created { .. })),
            "{launched:?}"
        );
        for (kind, step_id, body) in [
            (
                ControlKind::Decide,
                "review",
                json!({"decision": "approve", "artifactVersion": 2}),
            ),
            (ControlKind::Resume, "hold", json!({"input": "go"})),
        ] {
            let control = NewControl {
                workflow_id: store::WorkflowId::from(id.clone()),
                kind,
                step_id: step_id.into(),
                attempt: 1,
                body,
                created_by: Some("ada".into()),
            };
            store.put_control(control).await.expect("control");
        }
    }
    if let Some(boundary) = boundary {
        std::fs::write(
            shared.path().join("faults/arm.json"),
            json!({"boundary": boundary}).to_string(),
        )
        .expect("arm");
        let addr = address();
        let mut first = ReinsProcess::serve(shared.path(), addr, &env(&db, shared.path(), addr));
        let reached = shared.path().join("faults/reached.json");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !reached.exists() {
            assert!(
                Instant::now() < deadline,
                "{boundary} was never reached: {}",
                first.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        first.signal(libc::SIGKILL);
        assert!(
            first.wait_exit(Duration::from_secs(60)).is_some(),
            "SIGKILL did not end the node"
        );
        std::fs::remove_file(shared.path().join("faults/arm.json")).expect("disarm");
        // A later change to the captured file must not change the captured version.
        if tamper {
            let evidence = find_evidence(&shared.path().join("workspaces")).expect("evidence");
            std::fs::write(evidence, "tampered after the capture").expect("tamper");
        }
    }
    let addr = address();
    let mut second = ReinsProcess::serve(shared.path(), addr, &env(&db, shared.path(), addr));
    let client = db.pg_client().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (status, result) = loop {
        let row = client
            .query_one("SELECT status, data FROM workflows WHERE id = $1", &[&id])
            .await
            .expect("workflow");
        let (status, data): (String, Value) = (row.get(0), row.get(1));
        if ["completed", "failed", "needs_reconciliation"].contains(&status.as_str()) {
            break (status, data["result"].clone());
        }
        assert!(
            Instant::now() < deadline,
            "stuck in {status}: {}",
            second.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let runs = client
        .query(
            "SELECT step_id, count(*) FROM runs WHERE workflow = $1 GROUP BY step_id ORDER BY step_id",
            &[&id],
        )
        .await
        .expect("runs")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    second.signal(libc::SIGTERM);
    second.wait_exit(Duration::from_secs(60));
    Ended {
        status,
        result,
        runs,
    }
}

fn one_run_each() -> Vec<(String, i64)> {
    vec![("draft".into(), 1), ("final".into(), 1)]
}

async fn completes_like_an_uninterrupted_run(boundary: &str, tamper: bool) {
    let reference = run(None, false, false).await;
    assert_eq!(reference.status, "completed");
    assert_eq!(reference.result["text"], "evidence v1");
    let crashed = run(Some(boundary), false, tamper).await;
    assert_eq!(crashed.status, "completed", "{boundary}");
    assert_eq!(
        crashed.result, reference.result,
        "{boundary}: a different result after the crash"
    );
    assert_eq!(
        crashed.runs,
        one_run_each(),
        "{boundary}: not exactly one child run per step"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_before_admission_then_recovery_completes() {
    completes_like_an_uninterrupted_run("before_admission", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_a_finished_child_not_yet_journaled_then_recovery_adopts_it() {
    completes_like_an_uninterrupted_run("result_before", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_a_result_is_journaled_then_recovery_completes() {
    completes_like_an_uninterrupted_run("result", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_a_capture_then_recovery_captures_once() {
    completes_like_an_uninterrupted_run("capture", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_an_approval_then_recovery_completes_with_the_captured_bytes() {
    // The capture is journaled before the approval: the file changing now changes nothing stored.
    completes_like_an_uninterrupted_run("approval", true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_after_admission_leaves_the_unknown_child_to_an_operator() {
    let crashed = run(Some("admission"), true, false).await;
    assert_eq!(crashed.status, "needs_reconciliation");
    assert_eq!(
        crashed.runs,
        vec![("draft".to_owned(), 1)],
        "recovery admitted a second child run"
    );
}
