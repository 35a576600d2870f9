//! Dormant workflows through the real binary (`dormant_after_ms`): a workflow that only waits
//! leaves its node (no supervisor, its lease held by nobody) and is woken on any node by a
//! control, an event, or its earliest due time, also when that time came while no node ran.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http_api::{ADMIN, Db, Node, PASSWORD, initialize, launch, wait_for};
use crate::http_client::Api;

/// Parked workflows go dormant after 200 ms on these nodes.
fn dormant_after() -> (&'static str, String) {
    ("REINS_DORMANT_AFTER_MS", "200".to_owned())
}

/// The node's `reins_workflow_supervisors` gauge.
pub(crate) async fn supervisors(api: &mut Api) -> u64 {
    let metrics = api.call("GET", "/metrics", None).await;
    assert_eq!(metrics.status, 200, "{metrics:?}");
    String::from_utf8_lossy(&metrics.body)
        .lines()
        .find_map(|line| line.strip_prefix("reins_workflow_supervisors "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .expect("the supervisors gauge")
}

/// Polls until the store holds `run_id` dormant, its lease held by nobody, and the node behind
/// `api` runs no supervisor.
pub(crate) async fn goes_dormant(db: &Db, api: &mut Api, run_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let row = db
            .sql(&format!(
                "SELECT CASE WHEN w.dormant AND l.owner = '' THEN 'dormant' ELSE 'live' END \
                 FROM workflows w JOIN extension_execution_leases l ON l.resource_id = w.id \
                 WHERE w.id = '{run_id}'"
            ))
            .await;
        if row.as_deref() == Some("dormant") && supervisors(api).await == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{run_id} never went dormant");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn step<'a>(record: &'a Value, step_id: &str) -> &'a Value {
    ["steps", "checkpoints"]
        .iter()
        .flat_map(|list| record[list].as_array().into_iter().flatten())
        .find(|step| step["step_id"] == step_id)
        .unwrap_or_else(|| panic!("no step {step_id}: {record}"))
}

/// A pause goes dormant on the node that ran it and is resumed through the API of another node
/// under manual recovery (a wake is no crash recovery): that node takes it over and it
/// completes with the input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dormant_pause_is_resumed_through_another_node_and_completes() {
    let db = Db::new(true).await;
    let env = [dormant_after()];
    let mut first = Node::start(&db, &env);
    let mut second = Node::start(&db, &env);
    let mut api = initialize(&first).await;
    let run_id = launch(
        &mut api,
        r#"const input = await pause({stepId: "go", message: "go?"}); return input;"#,
    )
    .await;
    wait_for(&mut api, &run_id, "paused").await;
    goes_dormant(&db, &mut api, &run_id).await;
    // Still paused for the people who look at it: dormancy is the node's business.
    assert_eq!(
        api.action("get", json!({"run_id": run_id})).await.json()["status"],
        "paused"
    );

    let mut other = second.api();
    assert_eq!(other.login(ADMIN, PASSWORD).await.status, 200);
    let record = other.action("get", json!({"run_id": run_id})).await.json();
    let resumed = other
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/resume"),
            Some(
                json!({"step_id": "go", "attempt": 1, "fingerprint": record["fingerprint"],
                        "input": {"n": 7}}),
            ),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let record = wait_for(&mut other, &run_id, "completed").await;
    assert_eq!(record["result"], json!({"n": 7}));
    let epoch = db
        .sql(&format!(
            "SELECT epoch FROM extension_execution_leases WHERE resource_id = '{run_id}'"
        ))
        .await;
    assert_eq!(
        epoch.as_deref(),
        Some("2"),
        "one takeover woke it: {}\n{}",
        first.process.stderr(),
        second.process.stderr()
    );
}

async fn a_dormant_sleep_wakes_on_time(postgres: bool) {
    let db = Db::new(postgres).await;
    let env = [dormant_after()];
    let node = Node::start(&db, &env);
    let mut api = initialize(&node).await;
    let script = r#"await sleep({stepId: "nap", ms: 3000}); return "rested";"#;
    let run_id = launch(&mut api, script).await;
    goes_dormant(&db, &mut api, &run_id).await;
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], "rested");
    let nap = step(&record, "nap");
    let wakes_at = nap["wakes_at"].as_f64().expect("wakes_at");
    let finished_at = nap["finished_at"].as_f64().expect("finished_at");
    assert!(
        finished_at >= wakes_at,
        "woke {} s early",
        wakes_at - finished_at
    );

    // Its due time comes while no node runs: the first node that starts wakes it.
    let run_id = launch(&mut api, script).await;
    goes_dormant(&db, &mut api, &run_id).await;
    let record = api.action("get", json!({"run_id": run_id})).await.json();
    let wakes_at = step(&record, "nap")["wakes_at"].as_f64().expect("wakes_at");
    node.signal(libc::SIGKILL);
    drop(node);
    let deadline = Instant::now() + Duration::from_secs(30);
    while (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64())
        <= wakes_at
    {
        assert!(Instant::now() < deadline, "the due time never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let node = Node::start(&db, &env);
    let mut api = node.api();
    assert_eq!(api.login(ADMIN, PASSWORD).await.status, 200);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], "rested");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_a_dormant_sleep_wakes_on_time_also_when_no_node_ran_at_its_due_time() {
    a_dormant_sleep_wakes_on_time(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dormant_sleep_wakes_on_time_also_when_no_node_ran_at_its_due_time() {
    a_dormant_sleep_wakes_on_time(true).await;
}

/// An event sent to a dormant `waitForEvent` wakes it at once and is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_wakes_a_dormant_wait_for_event() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[dormant_after()]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"return await waitForEvent({stepId: "paid", name: "payment.received"});"#,
    )
    .await;
    goes_dormant(&db, &mut api, &run_id).await;
    let sent = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/events"),
            Some(json!({"name": "payment.received", "event_id": "p-1", "payload": {"eur": 12}})),
        )
        .await;
    assert_eq!(sent.status, 200, "{sent:?}");
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], json!({"eur": 12}));
}

/// Issue 39, item 2: every event sent to a dormant workflow woke it (a takeover and a replay),
/// whatever its name, so 2,000 events of another name kept it from ever staying dormant. An
/// event of a name it does not wait for leaves it asleep: the one it waits for wakes it with one
/// takeover, its epoch one past the dormant one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_other_names_leave_a_dormant_wait_asleep() {
    let db = Db::new(true).await;
    let node = Node::start(&db, &[dormant_after()]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"return await waitForEvent({stepId: "paid", name: "payment.received"});"#,
    )
    .await;
    goes_dormant(&db, &mut api, &run_id).await;
    let epoch = async || {
        db.sql(&format!(
            "SELECT epoch FROM extension_execution_leases WHERE resource_id = '{run_id}'"
        ))
        .await
        .expect("epoch")
        .parse::<i64>()
        .expect("a number")
    };
    let dormant_epoch = epoch().await;
    let events = format!("/api/v1/workflows/{run_id}/events");
    for n in 0..20 {
        let noise =
            json!({"name": "noise", "event_id": format!("n-{n}"), "payload": "x".repeat(1000)});
        let sent = api.call("POST", &events, Some(noise)).await;
        assert_eq!(sent.status, 200, "{sent:?}");
    }
    // Its wake time is still "never": no event woke it (a wake sets it to the moment of the
    // send, and the next takeover follows).
    let asleep = db
        .sql(&format!(
            "SELECT CASE WHEN wake_at > 2e11 THEN 'asleep' ELSE 'woken' END FROM workflows \
             WHERE id = '{run_id}'"
        ))
        .await
        .expect("wake time");
    assert_eq!(asleep, "asleep");
    let paid = json!({"name": "payment.received", "event_id": "p-1", "payload": {"eur": 12}});
    let sent = api.call("POST", &events, Some(paid)).await;
    assert_eq!(sent.status, 200, "{sent:?}");
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"], json!({"eur": 12}));
    assert_eq!(
        epoch().await,
        dormant_epoch + 1,
        "woken more than once: by events it does not wait for"
    );
}

/// A checkpoint whose workflow went dormant is rejected by its deadline, no earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_deadline_decides_for_a_dormant_workflow() {
    let db = Db::new(true).await;
    let node = Node::start(&db, &[dormant_after()]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const a = await agent({stepId: "a", agentRef: "scripted", task: {output: "v"}});
           return await humanCheckpoint({stepId: "look", sourceStepId: "a",
                                         artifactVersion: a.artifactVersion,
                                         timeoutMs: 4000, onTimeout: "reject",
                                         onReject: "return"});"#,
    )
    .await;
    goes_dormant(&db, &mut api, &run_id).await;
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
    let (deadline_at, decided_at) = (
        look["deadline_at"].as_f64().expect("deadline_at"),
        look["decided_at"].as_f64().expect("decided_at"),
    );
    assert!(
        decided_at >= deadline_at - 0.001,
        "decided {} s early",
        deadline_at - decided_at
    );
}
