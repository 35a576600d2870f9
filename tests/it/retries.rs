//! A step's retry policy through the real binary: each attempt is a new child run, journaled as
//! its own row and shown by `get`; the wait between attempts is durable, so a node killed during
//! it leaves the next attempt to another node, on schedule; a policy out of its bounds is refused
//! before anything is admitted.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http_api::{ADMIN, Db, Node, PASSWORD, initialize, launch, wait_for};

/// The child runs of a workflow's step, oldest first: `(attempt, created_at in epoch ms)`.
async fn runs_of(db: &Db, run_id: &str, step_id: &str) -> Vec<(i64, f64)> {
    let listed = db
        .sql(&format!(
            "SELECT coalesce(string_agg(attempt || ':' || created_at, ',' ORDER BY attempt), '') \
             FROM runs WHERE workflow = '{run_id}' AND step_id = '{step_id}'"
        ))
        .await
        .unwrap_or_default();
    listed
        .split(',')
        .filter(|run| !run.is_empty())
        .map(|run| {
            let (attempt, at) = run.split_once(':').expect("attempt:created_at");
            (
                attempt.parse().expect("attempt"),
                at.parse::<f64>().expect("created_at") * 1000.0,
            )
        })
        .collect()
}

fn attempts_of<'a>(record: &'a Value, step_id: &str) -> Vec<&'a Value> {
    record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["step_id"] == step_id)
        .collect()
}

async fn every_attempt_is_a_new_run_and_get_shows_each(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"try {
             await agent({stepId: "a", agentRef: "scripted", task: {fail: "busy"},
                          retry: {maxAttempts: 3, initialIntervalMs: 200, backoffCoefficient: 2}});
           } catch (e) {
             return [e.attempts, e.status, e.retryable, e.message];
           }"#,
    )
    .await;
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], json!([3, "error", true, "busy"]));
    let attempts = attempts_of(&record, "a");
    assert_eq!(attempts.len(), 3, "{record}");
    for (n, attempt) in attempts.iter().enumerate() {
        assert_eq!(attempt["attempt"], n + 1, "{attempt}");
        assert_eq!(
            (
                &attempt["status"],
                &attempt["error"],
                &attempt["error_status"]
            ),
            (&json!("failed"), &json!("busy"), &json!("error")),
            "{attempt}"
        );
    }
    // Each retried attempt says when it was due: its backoff after the failure before it.
    for (before, after, backoff) in [(0, 1, 0.2), (1, 2, 0.4)] {
        let failed_at = attempts[before]["finished_at"]
            .as_f64()
            .expect("finished_at");
        let due_at = attempts[after]["retry"]["due_at"].as_f64().expect("due_at");
        assert!(due_at - failed_at >= backoff - 0.001, "{attempts:?}");
        assert_eq!(attempts[after]["retry"]["reason"], "busy");
    }
    let runs = runs_of(&db, &run_id, "a").await;
    assert_eq!(
        runs.iter().map(|(attempt, _)| *attempt).collect::<Vec<_>>(),
        [1, 2, 3],
        "one new run per attempt"
    );

    // A policy out of its bounds fails the step when the script makes the call: nothing is
    // journaled or admitted.
    let refused = launch(
        &mut api,
        r#"await agent({stepId: "b", agentRef: "scripted", task: 1,
                        retry: {maxAttempts: 1e9}, timeout: {idleMs: 5}});"#,
    )
    .await;
    let record = wait_for(&mut api, &refused, "failed").await;
    let error = record["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("retry.maxAttempts is 1000000000: it must be 1 to 100"),
        "{error}"
    );
    assert_eq!(record["steps"], json!([]), "{record}");
    assert_eq!(runs_of(&db, &refused, "b").await, []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_every_attempt_is_a_new_run_and_get_shows_each() {
    every_attempt_is_a_new_run_and_get_shows_each(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_every_attempt_is_a_new_run_and_get_shows_each() {
    every_attempt_is_a_new_run_and_get_shows_each(true).await;
}

/// The node that owns a workflow dies (SIGKILL) while its step waits 30 s for its next
/// attempt: another node takes the workflow over and runs that attempt when it is due, not
/// from zero and not early (within the lease and a second of the due time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_during_a_backoff_leaves_the_next_attempt_to_another_node_on_schedule() {
    const LEASE_MS: f64 = 1_000.0;
    let db = Db::new(true).await;
    let env = [
        ("REINS_RECOVERY", "automatic".to_owned()),
        ("REINS_LEASE_SECONDS", "1".to_owned()),
    ];
    let first = Node::start(&db, &env);
    let mut api = initialize(&first).await;
    let run_id = launch(
        &mut api,
        r#"try {
             await agent({stepId: "a", agentRef: "scripted", task: {fail: "busy"},
                          retry: {maxAttempts: 2, initialIntervalMs: 30000}});
           } catch (e) {
             return e.attempts;
           }"#,
    )
    .await;
    // Attempt 1 failed and attempt 2 is queued with its due time.
    let deadline = Instant::now() + Duration::from_secs(30);
    let due_at_ms = loop {
        let due = db
            .sql(&format!(
                "SELECT data->'retry'->>'due_at_ms' FROM workflow_steps \
                 WHERE workflow = '{run_id}' AND attempt = 2"
            ))
            .await;
        if let Some(due) = due {
            break due.parse::<f64>().expect("due_at_ms");
        }
        assert!(Instant::now() < deadline, "attempt 2 was never queued");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    first.signal(libc::SIGKILL);
    let second = Node::start(&db, &env);
    let mut api = second.api();
    let signed_in = api.login(ADMIN, PASSWORD).await;
    assert_eq!(signed_in.status, 200, "{signed_in:?}");
    let record = wait_for_long(&mut api, &run_id, "completed", Duration::from_secs(60)).await;
    assert_eq!(record["result"], 2);
    let runs = runs_of(&db, &run_id, "a").await;
    let [(1, _), (2, started_ms)] = runs[..] else {
        panic!("two attempts, one run each: {runs:?}");
    };
    assert!(
        started_ms >= due_at_ms - 1.0,
        "attempt 2 started {} ms before it was due",
        due_at_ms - started_ms
    );
    assert!(
        started_ms <= due_at_ms + LEASE_MS + 1_000.0,
        "attempt 2 started {} ms after it was due",
        started_ms - due_at_ms
    );
}

/// Polls `get` until the workflow has `status`, for as long as `within`.
async fn wait_for_long(
    api: &mut crate::http_client::Api,
    run_id: &str,
    status: &str,
    within: Duration,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let record = api.action("get", json!({"run_id": run_id})).await.json();
        if record["status"] == status {
            return record;
        }
        assert!(
            Instant::now() < deadline,
            "{run_id} never became {status}: {record}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
