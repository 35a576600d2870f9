//! The `command` agent end to end with real child processes: output, failure with stderr's tail,
//! cancellation reaching a grandchild, programs that print garbage or flood stdout, what a
//! failure says of a retry (error lines, exit codes), and the attempt's time limits.

use std::path::Path;
use std::time::{Duration, Instant};

use actors::agents::{AgentConfig, CommandConfig};
use actors::{Admitted, RunEnd, RunRequest};
use runtime::policy::TimeoutOptions;
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

/// `program`'s agent with these timeouts as its configured ones.
fn timed(agent: AgentConfig, timeout: TimeoutOptions) -> AgentConfig {
    let AgentConfig::Command(command) = agent else {
        panic!("not a command agent");
    };
    AgentConfig::Command(CommandConfig { timeout, ..command })
}

async fn run(node: &TestNode, agent: &str, thread: &str) -> (store::RunId, RunEnd) {
    run_within(node, agent, thread, TimeoutOptions::default()).await
}

/// Runs `agent` on `thread` with the request's `timeouts`, to its end.
async fn run_within(
    node: &TestNode,
    agent: &str,
    thread: &str,
    timeouts: TimeoutOptions,
) -> (store::RunId, RunEnd) {
    let request = RunRequest {
        thread_id: thread.into(),
        agent: agent.into(),
        task: json!({"question": "why"}),
        idempotency_key: None,
        step: None,
        run_id: None,
        timeouts,
    };
    let Admitted::Started { row, ended } = node.node.runs().start(request).await.expect("start")
    else {
        panic!("not started");
    };
    // The bound only detects a run that never ends.
    let end = tokio::time::timeout(Duration::from_secs(60), ended)
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
sh -c 'trap ": > grandchild-got-sigterm; exit 0" TERM; echo started > started; while true; do sleep 0.05; done' &
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
        timeouts: Default::default(),
    };
    let Admitted::Started { row, ended } = node.node.runs().start(request).await.expect("start")
    else {
        panic!("not started");
    };
    // Written by the grandchild once its trap is set.
    let started = workspace.join("started");
    eventually(
        Duration::from_secs(60),
        "the program started its grandchild",
        async || started.exists(),
    )
    .await;
    node.node
        .runs()
        .cancel(&row.run_id, CancelAction::Interrupt)
        .await
        .expect("cancel");
    let end = tokio::time::timeout(Duration::from_secs(60), ended)
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
            timeouts: Default::default(),
        };
        let Admitted::Started { row, ended } = owner.node.runs().start(request).await.expect("start") else {
            panic!("not started");
        };
        eventually(Duration::from_secs(60), "the run waits for approval", async || {
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

        let end = tokio::time::timeout(Duration::from_secs(60), ended).await.expect("ends").expect("end");
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

async fn stored(node: &TestNode, run_id: &store::RunId) -> store::RunRow {
    node.node
        .runs()
        .get(run_id)
        .await
        .expect("read")
        .expect("row")
}

/// Issue 31: an `error` line says whether a retry could help and after how long, whatever the
/// exit status; a failing exit is named by its code (75 asks for a retry); a protocol violation
/// is not worth one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_lines_and_exit_codes_say_what_a_retry_could_do() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    let agents = [
        program(
            shared.path(),
            "refuses",
            r#"read task
echo '{"type": "error", "message": "the quota is spent", "retryable": false, "code": "quota"}'"#,
        ),
        program(
            shared.path(),
            "busy",
            r#"read task
echo '{"type": "error", "message": "busy", "retryable": true, "retry_after_ms": 2500}'
exit 1"#,
        ),
        program(shared.path(), "tempfail", "read task\nexit 75"),
        program(shared.path(), "exits", "read task\nexit 3"),
        program(
            shared.path(),
            "absurd",
            r#"read task
echo '{"type": "error", "message": "later", "retry_after_ms": 86400001}'
sleep 30"#,
        ),
    ];
    let node = node_with(&db, shared.path(), &agents).await;
    for (agent, error, failure) in [
        (
            "refuses",
            "the quota is spent",
            json!({"class": "error", "code": "quota", "retryable": false}),
        ),
        (
            "busy",
            "busy",
            json!({"class": "error", "retryable": true, "retry_after_ms": 2500}),
        ),
        (
            "tempfail",
            "exit status: 75",
            json!({"class": "error", "code": "exit_75", "retryable": true}),
        ),
        (
            "exits",
            "exit status: 3",
            json!({"class": "error", "code": "exit_3"}),
        ),
        (
            "absurd",
            "stdout line 1: retry_after_ms is 86400001: it must be at most 86400000 (a day)",
            json!({"class": "error", "code": "protocol", "retryable": false}),
        ),
    ] {
        let (run_id, end) = run(&node, agent, &format!("t-{agent}")).await;
        assert!(
            matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Error),
            "{agent}: {end:?}"
        );
        let row = stored(&node, &run_id).await;
        let message = row.error.clone().unwrap_or_default();
        assert!(message.contains(error), "{agent}: {message}");
        assert_eq!(row.metadata["failure"], failure, "{agent}");
    }
}

/// Issue 31: a `command` agent that went silent held its slot until the workflow's timeout. With
/// `idle_ms` it is stopped that long after its last line, and its run ends `error` with a
/// failure of class `timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_command_agent_is_stopped_at_its_idle_timeout() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    let agent = program(
        shared.path(),
        "silent",
        r#"read task
echo '{"type": "progress", "stage": "started"}'
sleep 300"#,
    );
    let node = node_with(&db, shared.path(), &[agent]).await;
    let started = Instant::now();
    let idle = TimeoutOptions {
        idle_ms: Some(1_000),
        ..TimeoutOptions::default()
    };
    let (run_id, end) = run_within(&node, "silent", "t-1", idle).await;
    let took = started.elapsed();
    assert!(
        matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Error),
        "{end:?}"
    );
    // Not before its idle limit; that it was the idle limit that stopped it (and not its
    // 300 s of sleep ending) is what the run's error and stop reason say.
    assert!(
        took >= Duration::from_millis(1_000),
        "stopped {took:?} after its start, before idle_ms"
    );
    let row = stored(&node, &run_id).await;
    assert_eq!(
        row.error.as_deref(),
        Some("no progress for 1000 ms (timeout.idleMs)")
    );
    assert_eq!(row.stop_reason.as_deref(), Some("idle_timeout"));
    assert_eq!(
        row.metadata["failure"],
        json!({"class": "timeout", "code": "idle_timeout", "retryable": true})
    );
}

/// Issue 31: an agent that keeps signalling is never stopped for its length by `idle_ms` (its
/// configured one here, 2 s: a line every 0.3 s for 3 s, with room for a busy machine's
/// delays between lines), and it sees its attempt as `REINS_ATTEMPT`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_agent_that_keeps_signalling_runs_past_its_idle_timeout() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    let agent = timed(
        program(
            shared.path(),
            "steady",
            r#"read task
for i in 1 2 3 4 5 6 7 8 9 10; do
  sleep 0.3
  echo "{\"type\": \"progress\", \"step\": $i}"
done
echo "{\"type\": \"output\", \"output\": {\"attempt\": \"$REINS_ATTEMPT\"}}""#,
        ),
        TimeoutOptions {
            idle_ms: Some(2_000),
            ..TimeoutOptions::default()
        },
    );
    let node = node_with(&db, shared.path(), &[agent]).await;
    let started = Instant::now();
    let (run_id, end) = run(&node, "steady", "t-1").await;
    assert!(
        matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Success),
        "{end:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(3_000));
    let row = stored(&node, &run_id).await;
    assert_eq!(row.output, Some(json!({"attempt": "1"})));
    assert_eq!(row.message_count, 10);
}

/// Issue 31: `attempt_ms` bounds an attempt from its start even while its agent keeps
/// signalling (a line every 0.2 s, under an idle limit of 1.5 s: room for a busy machine's
/// delays between lines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_ms_stops_a_command_agent_that_keeps_printing() {
    let (db, shared) = (
        TestDb::sqlite().await,
        tempfile::tempdir().expect("temp dir"),
    );
    let agent = timed(
        program(
            shared.path(),
            "chatty",
            r#"read task
while true; do
  echo '{"type": "progress"}'
  sleep 0.2
done"#,
        ),
        TimeoutOptions {
            attempt_ms: Some(2_000),
            idle_ms: Some(1_500),
            total_ms: None,
            approval_ms: None,
        },
    );
    let node = node_with(&db, shared.path(), &[agent]).await;
    let (run_id, end) = run(&node, "chatty", "t-1").await;
    assert!(
        matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Error),
        "{end:?}"
    );
    let row = stored(&node, &run_id).await;
    assert_eq!(
        row.error.as_deref(),
        Some("the attempt ran for 2000 ms (timeout.attemptMs)")
    );
    assert_eq!(
        row.metadata["failure"],
        json!({"class": "timeout", "code": "attempt_timeout", "retryable": true})
    );
}
