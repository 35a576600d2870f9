//! The `command` agent end to end with real child processes: output, failure with stderr's tail,
//! cancellation reaching a grandchild, and programs that print garbage or flood stdout.

use std::path::Path;
use std::time::Duration;

use actors::agents::{AgentConfig, CommandConfig};
use actors::{Admitted, RunEnd, RunRequest};
use serde_json::json;
use store::{CancelAction, RunStatus};

use crate::harness::{TestDb, TestNode, eventually, on_both_backends};

const LEASE_MS: u64 = 3_000;

/// Writes an executable shell script and returns its agent entry.
fn program(dir: &Path, name: &str, body: &str) -> AgentConfig {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(format!("{name}.sh"));
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    AgentConfig::Command(CommandConfig {
        name: name.into(),
        program: path,
        args: vec![],
        env: Default::default(),
        env_pass: vec![],
        read_paths: vec![],
        write_paths: vec![],
        grace_ms: 2_000,
        line_bytes_max: 1024,
        output_bytes_max: 64 * 1024,
        stderr_tail_bytes: 256,
        retry: Default::default(),
        timeout: Default::default(),
        idempotent: false,
    })
}

async fn node_with(db: &TestDb, shared: &Path, agents: &[AgentConfig]) -> TestNode {
    TestNode::start_with(db, "a", LEASE_MS, shared, agents).await
}

async fn run(node: &TestNode, agent: &str, thread: &str) -> (store::RunId, RunEnd) {
    let request = RunRequest {
        thread_id: thread.into(),
        agent: agent.into(),
        task: json!({"question": "why"}),
        idempotency_key: None,
        step: None,
        run_id: None,
    };
    let Admitted::Started { row, ended } = node.node.runs().start(request).await.expect("start")
    else {
        panic!("not started");
    };
    let end = tokio::time::timeout(Duration::from_secs(20), ended)
        .await
        .expect("ends")
        .expect("end");
    (row.run_id, end)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_reads_its_task_and_reports_output_usage_and_progress() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    let agent = program(
        shared.path(),
        "answer",
        r#"
read task
echo '{"type": "progress", "note": "thinking"}'
echo '{"type": "usage", "total_tokens": 9}'
printf '{"type": "output", "output": {"task": %s, "cwd": "%s"}}\n' "$task" "$(pwd)"
"#,
    );
    let node = node_with(&db, shared.path(), &[agent]).await;
    let (run_id, end) = run(&node, "answer", "t-1").await;
    assert!(
        matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Success),
        "{end:?}"
    );
    let row = node
        .node
        .runs()
        .get(&run_id)
        .await
        .expect("read")
        .expect("row");
    let output = row.output.expect("output");
    assert_eq!(output["task"]["type"], "task");
    assert_eq!(output["task"]["task"], json!({"question": "why"}));
    let workspace = shared.path().join("workspaces/t-1/user-data");
    assert_eq!(
        output["cwd"],
        json!(workspace.canonicalize().expect("workspace").to_str())
    );
    assert_eq!((row.total_tokens, row.message_count), (9, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_program_ends_the_run_as_error_with_the_tail_of_stderr() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    let agent = program(
        shared.path(),
        "broken",
        "echo 'first words' >&2\necho 'the disk is full' >&2\nexit 3",
    );
    let node = node_with(&db, shared.path(), &[agent]).await;
    let (run_id, end) = run(&node, "broken", "t-1").await;
    assert!(
        matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Error),
        "{end:?}"
    );
    let error = node
        .node
        .runs()
        .get(&run_id)
        .await
        .expect("read")
        .expect("row")
        .error
        .expect("error");
    assert!(
        error.contains("exit status: 3") && error.contains("the disk is full"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_sends_sigterm_to_the_whole_process_group_including_grandchildren() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    // Both files are written in the run's workspace (its working folder): a confined agent can
    // write nowhere else.
    let workspace = shared.path().join("workspaces/t-1/user-data");
    let marker = workspace.join("grandchild-got-sigterm");
    let agent = program(
        shared.path(),
        "stubborn",
        r#"
sh -c 'trap "touch grandchild-got-sigterm; exit 0" TERM; while true; do sleep 0.05; done' &
echo started > started
wait
"#,
    );
    let node = node_with(&db, shared.path(), &[agent]).await;
    let request = RunRequest {
        thread_id: "t-1".into(),
        agent: "stubborn".into(),
        task: json!("go"),
        idempotency_key: None,
        step: None,
        run_id: None,
    };
    let Admitted::Started { row, ended } = node.node.runs().start(request).await.expect("start")
    else {
        panic!("not started");
    };
    let started = workspace.join("started");
    eventually(
        Duration::from_secs(10),
        "the program started its grandchild",
        async || started.exists(),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    node.node
        .runs()
        .cancel(&row.run_id, CancelAction::Interrupt)
        .await
        .expect("cancel");
    let end = tokio::time::timeout(Duration::from_secs(20), ended)
        .await
        .expect("ends")
        .expect("end");
    assert!(
        matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Interrupted),
        "{end:?}"
    );
    assert!(marker.exists(), "the grandchild never received SIGTERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_long_lines_and_floods_on_stdout_end_the_run_with_a_clear_error() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    let agents = [
        program(
            shared.path(),
            "garbage",
            "echo 'hello, I am not JSON'\nsleep 30",
        ),
        program(
            shared.path(),
            "long",
            "head -c 5000 /dev/zero | tr '\\0' 'x'; echo\nsleep 30",
        ),
        program(
            shared.path(),
            "flood",
            "while true; do echo '{\"type\": \"progress\"}'; done",
        ),
    ];
    let node = node_with(&db, shared.path(), &agents).await;
    for (agent, expected) in [
        ("garbage", "not a protocol line"),
        ("long", "line_bytes_max"),
        ("flood", "output_bytes_max"),
    ] {
        let (run_id, end) = run(&node, agent, &format!("t-{agent}")).await;
        assert!(
            matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Error),
            "{agent}: {end:?}"
        );
        let error = node
            .node
            .runs()
            .get(&run_id)
            .await
            .expect("read")
            .expect("row")
            .error
            .expect("error");
        assert!(error.contains(expected), "{agent}: {error}");
    }
}

on_both_backends! {
    async fn a_live_program_pauses_for_approval_and_gets_the_answer_from_another_node_on_stdin(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let agent = program(shared.path(), "careful", r#"
read task
echo '{"type": "approval_request", "request_id": "deploy-1", "actions": [{"tool": "deploy"}]}'
read answer
printf '{"type": "output", "output": %s}\n' "$answer"
"#);
        let owner = TestNode::start_with(&db, "owner", LEASE_MS, shared.path(), std::slice::from_ref(&agent)).await;
        let other = TestNode::start_with(&db, "other", LEASE_MS, shared.path(), &[agent]).await;
        let request = RunRequest {
            thread_id: "t-1".into(),
            agent: "careful".into(),
            task: json!("ship it"),
            idempotency_key: None,
            step: None,
            run_id: None,
        };
        let Admitted::Started { row, ended } = owner.node.runs().start(request).await.expect("start") else {
            panic!("not started");
        };
        eventually(Duration::from_secs(10), "the run waits for approval", async || {
            let row = other.node.runs().get(&row.run_id).await.expect("read").expect("row");
            row.status == RunStatus::WaitingForInput && store::pending_request_id(&row.metadata) == Some("deploy-1")
        })
        .await;
        let stale = other.node.runs().answer_approval("t-1", &["deploy-0".into()], &json!({"decision": "approve"})).await;
        assert_eq!(stale.expect("answer"), None, "an answer to another request consumed the pause");
        let answered = other.node.runs()
            .answer_approval("t-1", &["deploy-1".into()], &json!({"decision": "approve", "by": "ada"}))
            .await
            .expect("answer")
            .expect("the pause is answered");
        assert_eq!(answered.status, RunStatus::Running, "the live program runs on");

        let end = tokio::time::timeout(Duration::from_secs(20), ended).await.expect("ends").expect("end");
        assert!(matches!(end, RunEnd::PersistedAnswered(ref o) if o.status == RunStatus::Success), "{end:?}");
        let stored = owner.node.runs().get(&row.run_id).await.expect("read").expect("row");
        assert_eq!(stored.output, Some(json!({
            "type": "approval_answer",
            "request_id": "deploy-1",
            "answer": {"decision": "approve", "by": "ada"}
        })));
        assert_eq!(stored.metadata["hitl_answer"]["request_id"], "deploy-1", "the decision is on record");
    }
}
