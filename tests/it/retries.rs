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
/// attempt: another node, started 10 s before the attempt is due, takes the workflow over and
/// runs that attempt when it is due: not early, and not 30 s from its takeover (at least 20 s
/// late), which is far from what a busy machine's start and lease cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_during_a_backoff_leaves_the_next_attempt_to_another_node_on_schedule() {
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
    // Nothing runs meanwhile (no node): the next one starts 10 s before the attempt is due.
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64()
            * 1000.0
    };
    while now_ms() < due_at_ms - 10_000.0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let second = Node::start(&db, &env);
    let mut api = second.api();
    let signed_in = api.login(ADMIN, PASSWORD).await;
    assert_eq!(signed_in.status, 200, "{signed_in:?}");
    let record = wait_for_long(&mut api, &run_id, "completed", Duration::from_secs(90)).await;
    assert_eq!(record["result"], 2);
    let runs = runs_of(&db, &run_id, "a").await;
    let [(1, _), (2, started_ms)] = runs[..] else {
        panic!("two attempts, one run each: {runs:?}");
    };
    // Not early: by the database's clock, as a node reads it (to within half the round trip of
    // its reading, milliseconds on a loaded machine: once 9 ms here). A second is far more than
    // that, and far less than an attempt run at the takeover, 10 s before it was due.
    assert!(
        started_ms >= due_at_ms - 1_000.0,
        "attempt 2 started {} ms before it was due",
        due_at_ms - started_ms
    );
    assert!(
        started_ms < due_at_ms + 20_000.0,
        "attempt 2 started {} ms after it was due: its backoff began again at the takeover",
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

/// Writes a configuration with the `scripted` agent and `extra` agents (TOML) into `dir`.
/// A configuration with the scripted agent and `llm`, an `openai` agent of `stand_in`.
fn llm_config(dir: &std::path::Path, stand_in: &crate::openai_agent::StandIn) -> String {
    config_with(
        dir,
        &format!(
            "[[agents]]\nname = \"llm\"\nkind = \"openai\"\nbase_url = \"http://{}/v1\"\n\
             model = \"gpt-test\"\n",
            stand_in.addr
        ),
    )
}

fn config_with(dir: &std::path::Path, extra: &str) -> String {
    let path = dir.join("config.toml");
    std::fs::write(
        &path,
        format!("[[agents]]\nname = \"scripted\"\nkind = \"scripted\"\n\n{extra}"),
    )
    .expect("write the configuration");
    path.display().to_string()
}

/// An OpenAI-compatible endpoint that asks twice to come back in a second (429 with
/// `Retry-After: 1`), then answers: the step completes on attempt 3, two waits of the asked
/// second later, and `get` shows the three attempts. A 400 fails the step at once, not
/// retryable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_asks_to_come_back_later_is_retried_after_the_wait_it_asks_for() {
    use crate::openai_agent::{Reply, StandIn, completion};
    let busy = Reply::Headed(
        429,
        &[("retry-after", "1")],
        json!({"error": {"message": "slow down"}}),
    );
    let stand_in = StandIn::start(vec![
        busy.clone(),
        busy,
        Reply::Json(200, completion("done", 7)),
        Reply::Json(400, json!({"error": {"message": "bad request"}})),
    ])
    .await;
    let files = tempfile::tempdir().expect("temp dir");
    let config = llm_config(files.path(), &stand_in);
    let db = Db::new(false).await;
    let node = Node::start(&db, &[("REINS_CONFIG", config)]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const r = await agent({stepId: "ask", agentRef: "llm", task: "hi"});
           return r.attempts;"#,
    )
    .await;
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], 3);
    let attempts = attempts_of(&record, "ask");
    let statuses: Vec<&Value> = attempts.iter().map(|a| &a["status"]).collect();
    assert_eq!(statuses, ["failed", "failed", "completed"], "{record}");
    assert_eq!(attempts[0]["error_status"], "error");
    // Each attempt is a run of its own: the third began two asked waits after the first.
    let runs = runs_of(&db, &run_id, "ask").await;
    let [(1, first_ms), (2, _), (3, last_ms)] = runs[..] else {
        panic!("three attempts, one run each: {runs:?}");
    };
    assert!(
        last_ms - first_ms >= 2_000.0,
        "attempt 3 began {} ms after attempt 1",
        last_ms - first_ms
    );
    for retried in &attempts[1..] {
        let failed_at = attempts[0]["finished_at"].as_f64().expect("finished_at");
        assert!(retried["retry"]["due_at"].as_f64().expect("due_at") >= failed_at + 1.0);
    }

    let refused = launch(
        &mut api,
        r#"try { await agent({stepId: "ask", agentRef: "llm", task: "hi"}); }
           catch (e) { return [e.attempts, e.retryable, e.code]; }"#,
    )
    .await;
    let record = wait_for(&mut api, &refused, "completed").await;
    assert_eq!(record["result"], json!([1, false, "http_400"]));
}

/// A `command` agent that goes silent on its first attempt is stopped at its `idleMs` (within
/// a second of it) and run again; the second attempt answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_command_agent_is_stopped_at_its_idle_timeout_and_retried() {
    use std::os::unix::fs::PermissionsExt;
    let files = tempfile::tempdir().expect("temp dir");
    let program = files.path().join("moody.sh");
    std::fs::write(
        &program,
        "#!/bin/sh\nread task\n\
         if [ \"$REINS_ATTEMPT\" = 1 ]; then sleep 300; fi\n\
         echo '{\"type\": \"output\", \"output\": \"answered\"}'\n",
    )
    .expect("write the agent");
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let config = config_with(
        files.path(),
        &format!(
            "[[agents]]\nname = \"moody\"\nkind = \"command\"\nprogram = \"{}\"\ngrace_ms = 200\n",
            program.display()
        ),
    );
    let db = Db::new(false).await;
    let node = Node::start(&db, &[("REINS_CONFIG", config)]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const r = await agent({stepId: "work", agentRef: "moody", task: "go",
                                 timeout: {idleMs: 1000}, retry: {maxAttempts: 2, initialIntervalMs: 100}});
           return [r.output, r.attempts];"#,
    )
    .await;
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], json!(["answered", 2]));
    let attempts = attempts_of(&record, "work");
    assert_eq!(attempts[0]["error_status"], "timeout", "{record}");
    assert_eq!(
        attempts[0]["error"],
        "no progress for 1000 ms (timeout.idleMs)"
    );
    let took_ms = db
        .sql(&format!(
            "SELECT CAST((updated_at - created_at) * 1000 AS INTEGER) FROM runs \
             WHERE workflow = '{run_id}' AND attempt = 1"
        ))
        .await
        .expect("attempt 1's run")
        .parse::<i64>()
        .expect("milliseconds");
    // Not before its idle limit; that the idle limit stopped it (its program sleeps 300 s) is
    // what its error says.
    assert!(
        took_ms >= 1_000,
        "attempt 1 was stopped {took_ms} ms after its start"
    );
}

/// The first 2,000 bytes of `text`'s form: what an assertion may print of a value that could be
/// megabytes when it fails.
fn head(text: impl ToString) -> String {
    let text = text.to_string();
    text[..text.floor_char_boundary(2_000)].to_owned()
}

/// The longest line `log` holds, in bytes.
fn longest_line(log: &str) -> usize {
    log.lines().map(str::len).max().unwrap_or(0)
}

/// Issue 39, item 1: an agent's error was stored whole, twice, in every attempt (a hostile
/// endpoint's 4 MB message made the record 200 MB and log lines of over a megabyte). It is cut at
/// ingest to `limits.error_bytes_max`, so the run's row, each attempt's error, the next attempt's
/// retry reason and the log line are bounded, whichever agent failed: an error of exactly the
/// bound is kept whole, a longer one is its head and a note of its length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_error_is_kept_to_error_bytes_max_wherever_it_goes() {
    use crate::openai_agent::{Reply, StandIn};
    let huge = "e".repeat(1_000_000);
    let failing = || Reply::Json(500, json!({"error": {"message": huge.clone()}}));
    let stand_in = StandIn::start(vec![failing(), failing(), failing()]).await;
    let files = tempfile::tempdir().expect("temp dir");
    let config = llm_config(files.path(), &stand_in);
    let db = Db::new(false).await;
    let mut node = Node::start(
        &db,
        &[
            ("REINS_CONFIG", config),
            ("REINS_LIMITS__ERROR_BYTES_MAX", "512".into()),
        ],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const sizes = [];
           for (const [stepId, task] of [["whole", {fail: "w".repeat(512)}],
                                         ["long", {fail: "é".repeat(22500)}]]) {
             try { await agent({stepId, agentRef: "scripted", task}); }
             catch (e) { sizes.push(e.message.length); }
           }
           try {
             await agent({stepId: "hostile", agentRef: "llm", task: "hi",
                          retry: {maxAttempts: 3, initialIntervalMs: 0}});
           } catch (e) { sizes.push(e.attempts); }
           return sizes;"#,
    )
    .await;
    let record = wait_for(&mut api, &run_id, "completed").await;
    // 512 bytes whole; the cut one is at most 512 bytes ("é" is two), its note included.
    let sizes = record["result"].as_array().expect("sizes");
    assert_eq!(sizes[0], 512, "{}", head(&record));
    assert!(
        sizes[1].as_u64().is_some_and(|chars| chars < 512),
        "{}",
        head(&record)
    );
    assert_eq!(sizes[2], 3, "{}", head(&record));
    assert_eq!(attempts_of(&record, "whole")[0]["error"], "w".repeat(512));
    let note = "cut to limits.error_bytes_max)";
    let long = attempts_of(&record, "long")[0]["error"]
        .as_str()
        .expect("error");
    assert!(
        long.len() <= 512 && long.starts_with("éé"),
        "{}",
        head(long)
    );
    assert!(
        long.ends_with(&format!("(an error of 45000 bytes, {note}")),
        "{}",
        head(long)
    );
    let hostile = attempts_of(&record, "hostile");
    assert_eq!(hostile.len(), 3, "{}", head(&record));
    for (n, attempt) in hostile.iter().enumerate() {
        let error = attempt["error"].as_str().expect("error");
        assert!(
            error.len() <= 512 && error.ends_with(note),
            "{}",
            head(error)
        );
        if n > 0 {
            let reason = attempt["retry"]["reason"].as_str().expect("reason");
            assert!(
                reason.len() <= 512 && reason.ends_with(note),
                "{}",
                head(reason)
            );
        }
    }
    // The record holds three attempts of the hostile step, not three megabytes.
    assert!(
        record.to_string().len() < 64 * 1024,
        "{} bytes",
        record.to_string().len()
    );
    let stored = db
        .sql("SELECT max(length(CAST(error AS BLOB))) FROM runs")
        .await
        .expect("the runs' errors");
    assert!(stored.parse::<usize>().expect("bytes") <= 512, "{stored}");
    let log = node
        .process
        .stderr_with(&["attempt failed"], Duration::from_secs(30));
    assert!(
        longest_line(&log) < 4 * 1024,
        "a log line of {} bytes",
        longest_line(&log)
    );
}

/// Issue 39, item 1: attempts did not count against `steps_max`, so a workflow of 64 steps of
/// 100 attempts each kept 6,400 rows whatever the limit said. Each attempt is a row of the
/// record, as a journal entry is, and together they stop at `steps_max`: here 8 rows, three
/// calls whose policies would allow 30 attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempts_count_against_steps_max() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[("REINS_LIMITS__STEPS_MAX", "8".into())]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const calls = ["a", "b", "c"].map((stepId) =>
             agent({stepId, agentRef: "scripted", task: {fail: "busy"},
                    retry: {maxAttempts: 10, initialIntervalMs: 0}}));
           const ended = await Promise.allSettled(calls);
           return ended.map((end) => end.reason.attempts);"#,
    )
    .await;
    let record = wait_for(&mut api, &run_id, "completed").await;
    let attempts: Vec<u64> = record["result"]
        .as_array()
        .expect("attempts")
        .iter()
        .map(|n| n.as_u64().expect("a count"))
        .collect();
    assert_eq!(attempts.iter().sum::<u64>(), 8, "{attempts:?}");
    let rows = db
        .sql(&format!(
            "SELECT count(*) FROM workflow_steps WHERE workflow = '{run_id}'"
        ))
        .await
        .expect("rows");
    assert_eq!(rows, "8");
}
