//! Events and the deadlines of waits through the real binary: an event sent before its wait is
//! kept and delivered, once per `event_id`; a wait with a deadline and no event resolves `null`;
//! a checkpoint's deadline decides `by: timeout` on the node that took the workflow over, and a
//! person's decision recorded first wins over it.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http_api::{ADMIN, Db, Node, PASSWORD, assert_refused, initialize, launch, wait_for};
use crate::http_client::{Answer, Api};

async fn send(api: &mut Api, run_id: &str, body: Value) -> Answer {
    api.call(
        "POST",
        &format!("/api/v1/workflows/{run_id}/events"),
        Some(body),
    )
    .await
}

/// Step `step_id` of `record`: among its steps, or its checkpoints (pauses and checkpoints).
fn step<'a>(record: &'a Value, step_id: &str) -> &'a Value {
    ["steps", "checkpoints"]
        .iter()
        .flat_map(|list| record[list].as_array().into_iter().flatten())
        .find(|step| step["step_id"] == step_id)
        .unwrap_or_else(|| panic!("no step {step_id}: {record}"))
}

/// Polls `get` until step `step_id` (or checkpoint) has `status`.
async fn step_reaches(api: &mut Api, run_id: &str, step_id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let record = api.action("get", json!({"run_id": run_id})).await.json();
        let found = ["steps", "checkpoints"]
            .iter()
            .flat_map(|list| record[list].as_array().into_iter().flatten())
            .any(|step| step["step_id"] == step_id && step["status"] == status);
        if found {
            return record;
        }
        assert!(
            Instant::now() < deadline,
            "{step_id} never {status}: {record}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn events_are_kept_until_a_wait_takes_them_once(postgres: bool) {
    let db = Db::new(postgres).await;
    // The script's first step holds until the test removes `hold_busy`.
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_busy"), b"").expect("hold");
    let node = Node::start(
        &db,
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"await agent({stepId: "busy", agentRef: "scripted", task: {hold_while: "hold_busy"}});
           const first = await waitForEvent({stepId: "w1", name: "paid"});
           const none = await waitForEvent({stepId: "w2", name: "paid", timeoutMs: 1000});
           const later = await waitForEvent({stepId: "w3", name: "shipped", timeoutMs: 60000});
           return [first, none, later];"#,
    )
    .await;
    // Sent while the script is held before its wait; sent again, it is one event.
    let paid = json!({"name": "paid", "event_id": "pay-1", "payload": {"amount": 3}});
    let sent = send(&mut api, &run_id, paid.clone()).await;
    assert_eq!(sent.status, 200, "{sent:?}");
    assert_eq!(
        (
            sent.json()["status"].as_str(),
            sent.json()["sent_by"].as_str()
        ),
        (Some("stored"), Some(ADMIN))
    );
    let again = send(&mut api, &run_id, paid).await;
    assert_eq!(
        (again.status, again.json()["status"].as_str()),
        (200, Some("repeated")),
        "{again:?}"
    );
    let other = json!({"name": "paid", "event_id": "pay-1", "payload": {"amount": 4}});
    assert_refused(
        &send(&mut api, &run_id, other).await,
        409,
        "conflict",
        "\"pay-1\"",
    );
    // Bad input is refused naming its field, with nothing stored.
    let bad_name = json!({"name": "pay ment", "event_id": "x", "payload": 1});
    assert_refused(
        &send(&mut api, &run_id, bad_name).await,
        400,
        "bad_request",
        "body field `name`: \"pay ment\" is not an id",
    );
    let bad_id = json!({"name": "paid", "event_id": "", "payload": 1});
    assert_refused(
        &send(&mut api, &run_id, bad_id).await,
        400,
        "bad_request",
        "body field `event_id`: \"\" is not an id",
    );
    let huge = json!({"name": "paid", "event_id": "big", "payload": "x".repeat(48 * 1024)});
    assert_refused(
        &send(&mut api, &run_id, huge).await,
        413,
        "too_large",
        "limits.frame_bytes_max",
    );

    // w2 finds no second `paid` (pay-1 was taken once) and resolves null at its deadline.
    std::fs::remove_file(faults.path().join("hold_busy")).expect("release the script");
    step_reaches(&mut api, &run_id, "w3", "running").await;
    let shipped = json!({"name": "shipped", "event_id": "ship-1", "payload": "parcel"});
    assert_eq!(send(&mut api, &run_id, shipped).await.status, 200);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], json!([{"amount": 3}, null, "parcel"]));
    let w2 = step(&record, "w2");
    let waited =
        w2["finished_at"].as_f64().expect("finished") - w2["started_at"].as_f64().expect("started");
    // Not before its deadline; that the deadline ended it is its null (no event came).
    assert!(
        waited >= 0.99,
        "w2 waited {waited} s for its 1 s deadline: {w2}"
    );
    assert!(w2["deadline_at"].as_f64().is_some(), "{w2}");
    let taken = db
        .sql(&format!(
            "SELECT string_agg(event_id || '=' || taken_by, ',' ORDER BY seq) FROM sent_events \
             WHERE workflow = '{run_id}'"
        ))
        .await;
    assert_eq!(
        taken.as_deref(),
        Some("pay-1=w1,ship-1=w3"),
        "one row per event, each taken once"
    );

    // An ended workflow takes no event, and says what it is.
    let late = json!({"name": "paid", "event_id": "pay-2", "payload": 1});
    assert_refused(
        &send(&mut api, &run_id, late).await,
        422,
        "refused",
        "is completed",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_events_are_kept_until_a_wait_takes_them_once() {
    events_are_kept_until_a_wait_takes_them_once(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_events_are_kept_until_a_wait_takes_them_once() {
    events_are_kept_until_a_wait_takes_them_once(true).await;
}

const REVIEWED: &str = r#"
    const a = await agent({stepId: "a", agentRef: "scripted", task: {output: "v"}});
    return await humanCheckpoint({stepId: "look", sourceStepId: "a",
                                  artifactVersion: a.artifactVersion,
                                  timeoutMs: 2000, onTimeout: "reject", onReject: "return"});
"#;

/// The owner of a checkpoint with a 2 s deadline is SIGKILLed while it waits: the node that
/// takes the workflow over rejects it `by: timeout`, not before the deadline, and a person who
/// answers after is told who decided. A person's approval recorded before the deadline is the
/// checkpoint's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_deadline_decides_on_the_node_that_took_it_over_unless_a_person_did_first() {
    const LEASE_S: f64 = 1.0;
    let db = Db::new(true).await;
    let env = [
        ("REINS_RECOVERY", "automatic".to_owned()),
        ("REINS_LEASE_SECONDS", "1".to_owned()),
    ];
    let first = Node::start(&db, &env);
    let mut api = initialize(&first).await;
    let run_id = launch(&mut api, REVIEWED).await;
    let record = step_reaches(&mut api, &run_id, "look", "waiting").await;
    let deadline_at = step(&record, "look")["deadline_at"]
        .as_f64()
        .expect("deadline_at");
    first.signal(libc::SIGKILL);
    let second = Node::start(&db, &env);
    let mut api = second.api();
    assert_eq!(api.login(ADMIN, PASSWORD).await.status, 200);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(
        (
            record["result"]["decision"].as_str(),
            record["result"]["decidedBy"].as_str()
        ),
        (Some("reject"), Some("timeout")),
        "{record}"
    );
    let look = step(&record, "look");
    assert_eq!(
        (look["status"].as_str(), look["decided_by"].as_str()),
        (Some("rejected"), Some("timeout")),
        "{look}"
    );
    let decided_at = look["decided_at"].as_f64().expect("decided_at");
    assert!(
        decided_at >= deadline_at - 0.001,
        "decided {} s early",
        deadline_at - decided_at
    );
    // The heir decides at the journaled deadline, or at its takeover if that came later: a
    // node's start and a lease, seconds on a busy machine. The bound only catches a decision
    // left to something much later.
    assert!(
        decided_at <= deadline_at + LEASE_S + 30.0,
        "decided {} s after the deadline",
        decided_at - deadline_at
    );
    let version = record["checkpoints"][0]["artifact_version"].clone();
    let late = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/decide"),
            Some(
                json!({"step_id": "look", "attempt": 1, "artifact_version": version,
                        "decision": "approve"}),
            ),
        )
        .await;
    assert_refused(&late, 409, "conflict", "by its timeout");

    // A person first: the deadline's answer finds the row taken, and the person's stands.
    let run_id = launch(&mut api, REVIEWED).await;
    let record = step_reaches(&mut api, &run_id, "look", "waiting").await;
    let version = record["checkpoints"][0]["artifact_version"].clone();
    let approved = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/decide"),
            Some(
                json!({"step_id": "look", "attempt": 1, "artifact_version": version,
                        "decision": "approve", "comment": "fine"}),
            ),
        )
        .await;
    assert_eq!(approved.status, 200, "{approved:?}");
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(
        (
            record["result"]["decision"].as_str(),
            record["result"]["decidedBy"].as_str()
        ),
        (Some("approve"), Some(ADMIN)),
        "{record}"
    );
}

/// A workflow lives as long as it needs unless its launch (or the node) sets a life limit: one
/// launched with `timeout_seconds: 1` is cancelled for its timeout while it waits, one launched
/// beside it without waits on; a limit out of range launches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_sets_its_own_life_limit_and_none_is_the_default() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let launch_with = |timeout: Value| json!({"script": "return await pause({stepId: 'p'});", "timeout_seconds": timeout});
    let limited = api
        .call("POST", "/api/v1/workflows", Some(launch_with(json!(1))))
        .await;
    assert_eq!(limited.status, 201, "{limited:?}");
    let limited = limited.json()["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    let unlimited = launch(&mut api, "return await pause({stepId: 'p'});").await;
    let record = wait_for(&mut api, &limited, "cancelled").await;
    let created = record["created_at"].as_f64().expect("created_at");
    let ended = record["updated_at"].as_f64().expect("updated_at");
    assert!(
        ended - created >= 0.99,
        "cancelled {} s after its launch",
        ended - created
    );
    let waiting = api.action("get", json!({"run_id": unlimited})).await.json();
    assert_eq!(waiting["status"], "paused", "{waiting}");
    for refused in [json!(0), json!(365 * 86_400 + 1)] {
        let answer = api
            .call("POST", "/api/v1/workflows", Some(launch_with(refused)))
            .await;
        assert_refused(&answer, 400, "bad_request", "timeout_seconds is");
    }
    let count = db.sql("SELECT count(*) FROM workflows").await;
    assert_eq!(
        count.as_deref(),
        Some("2"),
        "a refused launch wrote a workflow"
    );
}

/// An agent's approval request nobody answers is answered `reject` by `timeout` once its
/// `approvalMs` passed (by whichever node's sweep comes first), and the agent's step goes on
/// with that answer; a person who answers after is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_approval_request_nobody_answers_is_rejected_by_its_timeout() {
    let db = Db::new(true).await;
    let node = Node::start(&db, &[("REINS_LEASE_SECONDS", "1".to_owned())]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const r = await agent({stepId: "deploy", agentRef: "scripted", task: {
             ask_approval: {request_id: "deploy-1", actions: [{tool: "deploy", env: "prod"}]}},
             timeout: {approvalMs: 500}});
           return r.approval.answer;"#,
    )
    .await;
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(
        (
            record["result"]["decision"].as_str(),
            record["result"]["by"].as_str()
        ),
        (Some("reject"), Some("timeout")),
        "{record}"
    );
    let late = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/steps/deploy/answer"),
            Some(json!({"decision": "approve"})),
        )
        .await;
    assert!(late.status == 409 || late.status == 422, "{late:?}");
}

/// A nap on its way: a workflow sleeping 3 s launched on a node started with `first_env`, that
/// node SIGKILLed `kill_after` into the sleep, and a node started with `second_env` that takes
/// it over. Answers when it began (by the test's clock), its record while it slept, and its
/// record once completed.
async fn a_nap_across_a_kill(
    first_env: &[(&str, String)],
    second_env: &[(&str, String)],
    kill_after: Duration,
) -> (Instant, Value, Value) {
    let db = Db::new(false).await;
    let first = Node::start(&db, first_env);
    let mut api = initialize(&first).await;
    let began = Instant::now();
    let run_id = launch(
        &mut api,
        r#"await sleep({stepId: "nap", ms: 3000}); return "woke";"#,
    )
    .await;
    let sleeping = step_reaches(&mut api, &run_id, "nap", "running").await;
    tokio::time::sleep(kill_after).await;
    first.signal(libc::SIGKILL);
    drop(first);
    let second = Node::start(&db, second_env);
    let mut api = second.api();
    assert_eq!(api.login(ADMIN, PASSWORD).await.status, 200);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], "woke");
    (began, sleeping, record)
}

/// One node's environment for the naps: automatic recovery, a lease of a second.
fn nap_env() -> Vec<(&'static str, String)> {
    vec![
        ("REINS_RECOVERY", "automatic".to_owned()),
        ("REINS_LEASE_SECONDS", "1".to_owned()),
    ]
}

/// A workflow sleeping 3 s whose only node is SIGKILLed a second in, then started again, wakes
/// no earlier than its journaled due time (and not much later: the node's start and the lease
/// can take seconds on a busy machine; when a replayed sleep's timer fires is the workflow
/// machine's unit tests').
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_whose_node_is_killed_and_started_again_wakes_on_time() {
    const LEASE_S: f64 = 1.0;
    let (_, sleeping, record) =
        a_nap_across_a_kill(&nap_env(), &nap_env(), Duration::from_secs(1)).await;
    let wakes_at = step(&sleeping, "nap")["wakes_at"]
        .as_f64()
        .expect("wakes_at");
    let woke_at = step(&record, "nap")["finished_at"]
        .as_f64()
        .expect("finished_at");
    assert!(woke_at >= wakes_at, "woke {} s early", wakes_at - woke_at);
    assert!(
        woke_at <= wakes_at + LEASE_S + 30.0,
        "woke {} s after it was due",
        woke_at - wakes_at
    );
}

/// Timers follow the database's clock, not a node's: a node whose own clock is 4 s slow
/// journals a 3 s sleep and is killed; a node with a right clock takes the workflow over and
/// wakes it no earlier than 3 s after it began (by its node's clock, the sleep would have been
/// due a second before it began).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_journaled_by_a_node_whose_clock_is_slow_is_not_cut_short_by_another() {
    let mut slow = nap_env();
    slow.push(("REINS_FAULT_CLOCK_SKEW_MS", "-4000".to_owned()));
    let (began, _, _) = a_nap_across_a_kill(&slow, &nap_env(), Duration::from_millis(500)).await;
    assert!(
        began.elapsed() >= Duration::from_millis(3_000),
        "the sleep ended {:?} after it began",
        began.elapsed()
    );
}

/// Issue 39, item 2: a workflow that waited for one name kept every event of another name sent
/// to it (2,000 of 48 KB each), uncounted. Its untaken events are bounded in number and in bytes
/// by named limits: past either, a send is refused (422, naming it) and nothing is stored, while
/// the same event sent again is still answered as a repeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workflows_untaken_events_are_bounded_in_number_and_bytes() {
    let db = Db::new(true).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_LIMITS__UNTAKEN_EVENTS_PER_WORKFLOW_MAX", "3".into()),
            (
                "REINS_LIMITS__UNTAKEN_EVENT_BYTES_PER_WORKFLOW_MAX",
                "3000".into(),
            ),
        ],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"return await waitForEvent({stepId: "w", name: "never"});"#,
    )
    .await;
    step_reaches(&mut api, &run_id, "w", "running").await;
    let event = |event_id: &str, bytes: usize| json!({"name": "other", "event_id": event_id, "payload": "x".repeat(bytes - 2)});
    // 1,000 bytes each (a JSON string of 998 characters and its quotes).
    for event_id in ["e1", "e2"] {
        let sent = send(&mut api, &run_id, event(event_id, 1_000)).await;
        assert_eq!(sent.status, 200, "{sent:?}");
    }
    let over = send(&mut api, &run_id, event("e3", 1_001)).await;
    assert_refused(
        &over,
        422,
        "refused",
        "limits.untaken_event_bytes_per_workflow_max (3000): the workflow holds 2000 bytes",
    );
    let sent = send(&mut api, &run_id, event("e3", 10)).await;
    assert_eq!(sent.status, 200, "{sent:?}");
    let over = send(&mut api, &run_id, event("e4", 10)).await;
    assert_refused(
        &over,
        422,
        "refused",
        "limits.untaken_events_per_workflow_max (3)",
    );
    let again = send(&mut api, &run_id, event("e1", 1_000)).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.json()["repeated"], true, "{again:?}");
    let stored = db
        .sql(&format!(
            "SELECT count(*) FROM sent_events WHERE workflow = '{run_id}'"
        ))
        .await
        .expect("count");
    assert_eq!(stored, "3", "a refused event was stored");
}

/// Issue 40, item 5: an event sent without a payload resolved its wait with `null`, as a
/// deadline does, and a repeated `reins send` said "already repeated by an earlier request at -".
/// A payload may not be `null` (400, naming why), `reins send` without `--payload` sends `{}`,
/// and its repeat says who sent the event first and whether a wait took it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_never_carries_null_and_a_repeated_send_says_what_was_sent() {
    use crate::cli::{cli, code};
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const first = await waitForEvent({stepId: "a", name: "go"});
           const late = await waitForEvent({stepId: "b", name: "never", timeoutMs: 10});
           return [first, late];"#,
    )
    .await;
    for body in [
        json!({"name": "go", "event_id": "e1"}),
        json!({"name": "go", "event_id": "e1", "payload": null}),
    ] {
        let refused = send(&mut api, &run_id, body).await;
        assert_eq!(refused.status, 400, "{refused:?}");
    }
    let refused = send(
        &mut api,
        &run_id,
        json!({"name": "go", "event_id": "e1", "payload": null}),
    )
    .await;
    assert_refused(&refused, 400, "bad_request", "may not be null");
    let home = tempfile::tempdir().expect("home");
    let init = cli(home.path(), &node, &["login", "--email", ADMIN]);
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));
    let sent = cli(home.path(), &node, &["send", &run_id, "go", "--id", "e1"]);
    assert_eq!(code(&sent), 0, "{}", String::from_utf8_lossy(&sent.stderr));
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], json!([{}, null]), "{record}");
    let again = cli(home.path(), &node, &["send", &run_id, "go", "--id", "e1"]);
    assert_eq!(code(&again), 0);
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        said.contains(&format!(
            "event e1 was sent already by {ADMIN}, and step a took it; this repeat changes nothing"
        )),
        "{said}"
    );
}
