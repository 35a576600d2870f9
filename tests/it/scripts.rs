//! The edges of the script sandbox, through the real binary: values a script cannot hand over end
//! its workflow at once, a script that does not compile is refused at launch with its own line and
//! column, an unknown agent or a step id the control plane would refuse fails at the call, and
//! `console.log` stays within its limits in the node's log.

use std::time::Duration;

use serde_json::{Value, json};

use crate::http_api::{Db, Node, initialize, launch, wait_for};
use crate::http_client::Api;

/// Polls `get` until the workflow is terminal; returns its record. The bound only detects a
/// workflow that never ends.
async fn ended(api: &mut Api, run_id: &str) -> Value {
    let within = Duration::from_secs(60);
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let record = api.action("get", json!({"run_id": run_id})).await.json();
        if matches!(
            record["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{run_id} did not end within {within:?}: {record}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_value_the_script_cannot_hand_over_fails_its_workflow_at_once() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    for (script, says) in [
        (
            "return () => 1;",
            "the result cannot be encoded as JSON: a function",
        ),
        (
            "return 10n;",
            "the result cannot be encoded as JSON: TypeError",
        ),
        (
            "return {toJSON() { throw 1; }};",
            "the result cannot be encoded as JSON: 1",
        ),
        (
            "JSON.stringify = () => 5; return 10n;",
            "the result cannot be encoded as JSON",
        ),
        (
            "throw {toString() { throw 1; }};",
            "a thrown object that cannot be converted to text",
        ),
        (
            "await agent({stepId: 'a', agentRef: 'scripted', task: 10n});",
            "the arguments of agent cannot be encoded as JSON",
        ),
        (
            "await parallel([() => { throw {toString() { throw 1; }}; }]);",
            "a thrown object that cannot be converted to text",
        ),
        ("await new Promise(() => {});", "nothing can settle"),
    ] {
        let id = launch(&mut api, script).await;
        let record = ended(&mut api, &id).await;
        assert_eq!(record["status"], "failed", "{script}: {record}");
        // At once: failed by the supervisor that ran it (not after a crash, a takeover or a
        // retry; it used to be "within a second", which a busy machine can miss).
        assert_eq!(record["epoch"], 1, "{script}: {record}");
        let error = record["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(says),
            "{script}: {error:?} does not say {says:?}"
        );
    }
    // The script's own JSON.stringify is not the one its result is encoded with.
    let id = launch(&mut api, "JSON.stringify = () => 5; return {a: [1]};").await;
    let record = wait_for(&mut api, &id, "completed").await;
    assert_eq!(record["result"], json!({"a": [1]}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_script_that_does_not_compile_is_refused_at_launch_with_its_own_line_and_column() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    for (script, says) in [
        ("return 1 +;", "(line 1, column 11)"),
        (
            "const a = 1;\nconst b = ;\nreturn a;",
            "(line 2, column 11)",
        ),
    ] {
        let answer = api
            .call("POST", "/api/v1/workflows", Some(json!({"script": script})))
            .await;
        assert_eq!(answer.status, 422, "{answer:?}");
        let message = answer.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(
            message.contains("the script does not compile: SyntaxError") && message.contains(says),
            "{message:?}"
        );
        let action = api.action("launch", json!({"script": script})).await;
        assert_eq!(action.status, 422, "{action:?}");
    }
    let listed = api.call("GET", "/api/v1/workflows", None).await.json();
    assert_eq!(
        listed["workflows"],
        json!([]),
        "a refused launch wrote nothing"
    );
    // Compiled, never run: a body that would loop forever is launched (and fails by its limit).
    let answer = api
        .call(
            "POST",
            "/api/v1/workflows",
            Some(json!({"script": "}); while (true) {} (function () {"})),
        )
        .await;
    assert_eq!(answer.status, 201, "{answer:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_agent_fails_its_step_at_once_naming_the_configured_agents() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let id = launch(
        &mut api,
        "await agent({stepId: 'a', agentRef: 'nope', task: 1});",
    )
    .await;
    let record = ended(&mut api, &id).await;
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("unknown agent \"nope\"; configured: scripted"),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_id_the_control_plane_refuses_is_refused_when_the_script_makes_the_call() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let caught = launch(
        &mut api,
        "try { await pause({stepId: 'ok?'}); } catch (e) { return e.message; }",
    )
    .await;
    let record = wait_for(&mut api, &caught, "completed").await;
    assert_eq!(
        record["result"],
        json!("pause stepId \"ok?\" is not an id (1 to 128 of A-Z, a-z, 0-9, '-', '_', '.')")
    );
    assert_eq!(record["checkpoints"], json!([]), "nothing was journaled");
    // Every id the script accepts, the control plane answers.
    let id = launch(&mut api, "return await pause({stepId: 'ok.1_-'});").await;
    let paused = wait_for(&mut api, &id, "paused").await;
    let resumed = api
        .action(
            "resume",
            json!({"run_id": id, "fingerprint": paused["fingerprint"], "step_id": "ok.1_-",
                   "attempt": 1, "input": 7}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    assert_eq!(wait_for(&mut api, &id, "completed").await["result"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_log_stays_within_its_limits_in_the_nodes_log() {
    let db = Db::new(false).await;
    let mut node = Node::start(
        &db,
        &[
            ("REINS_LOG_FORMAT", "json".to_owned()),
            ("REINS_LIMITS__LOG_LINES_PER_ACTIVATION_MAX", "5".to_owned()),
            ("REINS_LIMITS__LOG_LINE_BYTES_MAX", "100".to_owned()),
        ],
    );
    let mut api = initialize(&node).await;
    let id = launch(
        &mut api,
        "for (let i = 0; i < 20000; i++) console.log('spam ' + 'x'.repeat(1000)); return 1;",
    )
    .await;
    wait_for(&mut api, &id, "completed").await;
    node.signal(libc::SIGTERM);
    node.process
        .wait_exit(Duration::from_secs(60))
        .expect("stopped");
    let stderr = node.process.stderr();
    let lines: Vec<String> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|line| line["fields"]["script_log"].as_str().map(str::to_owned))
        .collect();
    let cut = format!(
        "spam {} [cut: over log_line_bytes_max (100)]",
        "x".repeat(95)
    );
    assert_eq!(
        lines,
        vec![
            cut.clone(),
            cut.clone(),
            cut.clone(),
            cut.clone(),
            cut,
            "19995 console.log lines dropped: over log_lines_per_activation_max (5)".to_owned()
        ]
    );
    assert!(stderr.len() < 100_000, "{} bytes of log", stderr.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_script_that_cannot_get_memory_within_the_nodes_total_fails_naming_the_limit() {
    const TOTAL: u64 = 6 * 1024 * 1024;
    let db = Db::new(false).await;
    let node = Node::start(
        &db,
        &[("REINS_LIMITS__JS_MEMORY_TOTAL_BYTES", TOTAL.to_string())],
    );
    let mut api = initialize(&node).await;
    // About 4.9 MiB held while its agent sleeps: less than the 2 MiB a script needs to start is
    // left of the total.
    let holding = launch(
        &mut api,
        "const big = new Array(300000).fill(1.5);
         await agent({stepId: 'a', agentRef: 'scripted', task: {sleep_ms: 600000}});
         return big.length;",
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let record = api.action("get", json!({"run_id": holding})).await.json();
        if record["steps"][0]["status"] == "running" {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{record}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let starved = launch(&mut api, "return 1;").await;
    let record = ended(&mut api, &starved).await;
    assert_eq!(record["status"], "failed", "{record}");
    let error = record["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("no memory for this workflow's script")
            && error.contains(&format!("js_memory_total_bytes ({TOTAL})")),
        "{error:?}"
    );
    // The holder's memory comes back when it ends; then a script starts again.
    let cancelled = api
        .call("POST", &format!("/api/v1/workflows/{holding}/cancel"), None)
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    wait_for(&mut api, &holding, "cancelled").await;
    let after = launch(&mut api, "return 1;").await;
    wait_for(&mut api, &after, "completed").await;
}
