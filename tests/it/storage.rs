//! The per-user quota on stored bytes (`limits.user_stored_bytes_max`) through the real binary,
//! on both backends: a capture past it fails its step with a `StepError` naming the quota, the
//! user's stored bytes and the limit, with nothing of it stored; another user's workflows go on
//! under their own quota; `me` and the admins' listing show what each user stores; and deleting
//! a workflow gives its bytes back.

use serde_json::{Value, json};

use crate::harness::both;
use crate::http_api::{ADMIN, Db, Node, PASSWORD, assert_refused, initialize, launch, wait_for};
use crate::http_client::Api;

/// An agent step writes a 45,000-byte file (its output, `1`, is an artifact of one byte), then
/// three captures of it: the third is over the quota.
const SCRIPT: &str = r#"
const big = "x".repeat(45000);
await agent({stepId: "write", agentRef: "scripted",
             task: {write: [{path: "/mnt/user-data/big.txt", content: big}], output: 1}});
const kept = [];
for (const n of [1, 2, 3]) {
  try {
    const file = await captureArtifact({stepId: `keep-${n}`, sourceStepId: "write", path: "big.txt"});
    kept.push(file.bytes);
  } catch (e) {
    return {kept, name: e.name, message: e.message, limit: e.limit, bytes: e.bytes,
            storedBytes: e.storedBytes, storedBytesMax: e.storedBytesMax};
  }
}
return {kept};
"#;

/// The agent's output and two captures, exactly: the quota at its edge.
const QUOTA: i64 = 1 + 45_000 + 45_000;

const BOB: &str = "bob@example.com";

/// Runs [`SCRIPT`] for `api`'s user; answers its record.
async fn run(api: &mut Api) -> Value {
    let run_id = launch(api, SCRIPT).await;
    wait_for(api, &run_id, "completed").await
}

/// What `me` shows of the caller's storage.
async fn storage(api: &mut Api) -> Value {
    let me = api.call("GET", "/api/v1/auth/me", None).await;
    assert_eq!(me.status, 200, "{me:?}");
    me.json()["storage"].clone()
}

/// The third capture's failure, as the script caught it.
fn over_the_quota() -> Value {
    json!({
        "kept": [45_000, 45_000],
        "name": "StepError",
        "limit": "limits.user_stored_bytes_max",
        "bytes": 45_000,
        "storedBytes": QUOTA,
        "storedBytesMax": QUOTA,
    })
}

both!(captures_past_a_users_quota_fail_their_step_and_other_users_go_on);
async fn captures_past_a_users_quota_fail_their_step_and_other_users_go_on(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[("REINS_LIMITS__USER_STORED_BYTES_MAX", QUOTA.to_string())],
    );
    let mut admin = initialize(&node).await;
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": BOB, "password": PASSWORD})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut bob = node.api();
    assert_eq!(bob.login(BOB, PASSWORD).await.status, 200);
    assert_eq!(
        storage(&mut admin).await,
        json!({"stored_bytes": 0, "stored_bytes_max": QUOTA})
    );

    // Up to the quota exactly, then the third capture fails naming it, and is not stored.
    let record = run(&mut admin).await;
    let mut result = record["result"].clone();
    let message = result["message"].take();
    let message = message.as_str().expect("a message");
    assert!(
        message.contains("limits.user_stored_bytes_max")
            && message.contains(&QUOTA.to_string())
            && message.contains("45000"),
        "{message}"
    );
    result.as_object_mut().expect("a result").remove("message");
    assert_eq!(result, over_the_quota(), "{record}");
    let stored: Vec<&Value> = record["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .map(|artifact| &artifact["bytes"])
        .collect();
    assert_eq!(stored, [1, 45_000, 45_000], "{record}");
    let failed: Vec<&Value> = record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["status"] == "failed")
        .map(|step| &step["step_id"])
        .collect();
    assert_eq!(failed, ["keep-3"], "{record}");
    // The failure's error is kept past the quota (an error is never refused; it is what says
    // the quota was reached), and counted.
    let error_bytes = |run_id: &Value| {
        let sql = format!(
            "SELECT coalesce(sum(error_bytes), 0) FROM workflow_steps WHERE workflow = '{}'",
            run_id.as_str().expect("run_id")
        );
        let db = &db;
        async move {
            db.sql(&sql)
                .await
                .expect("errors")
                .parse::<i64>()
                .expect("a number")
        }
    };
    let admins_error = error_bytes(&record["run_id"]).await;
    assert!(admins_error > 0, "the failure's error is not counted");
    let full = |error: i64| json!({"stored_bytes": QUOTA + error, "stored_bytes_max": QUOTA});
    assert_eq!(storage(&mut admin).await, full(admins_error));

    // Another user's quota is their own: Bob's captures are kept while the admin's is full.
    let bobs = run(&mut bob).await;
    assert_eq!(bobs["result"]["kept"], json!([45_000, 45_000]), "{bobs}");
    assert_eq!(bobs["result"]["storedBytes"], QUOTA, "{bobs}");
    let listed = admin.call("GET", "/api/v1/auth/users", None).await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let users: Vec<(String, Value)> = listed.json()["users"]
        .as_array()
        .expect("users")
        .iter()
        .map(|user| {
            (
                user["email"].as_str().expect("email").to_owned(),
                user["storage"].clone(),
            )
        })
        .collect();
    let bobs_error = error_bytes(&bobs["run_id"]).await;
    assert_eq!(
        users,
        [
            (ADMIN.to_owned(), full(admins_error)),
            (BOB.to_owned(), full(bobs_error))
        ]
    );

    // Deleting the workflow gives its bytes back: the next one stores as much again.
    let deleted = admin
        .action("delete", json!({"run_id": record["run_id"]}))
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert_eq!(
        storage(&mut admin).await,
        json!({"stored_bytes": 0, "stored_bytes_max": QUOTA})
    );
    let again = run(&mut admin).await;
    assert_eq!(again["result"]["kept"], json!([45_000, 45_000]), "{again}");
}

both!(a_finished_workflow_keeps_only_what_its_artifacts_take);
async fn a_finished_workflow_keeps_only_what_its_artifacts_take(postgres: bool) {
    // The default quota: a workflow's first artifact takes a whole grant (256 KiB), and its end
    // gives back what its artifacts did not use.
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut admin = initialize(&node).await;
    let script = r#"
await agent({stepId: "write", agentRef: "scripted",
             task: {write: [{path: "/mnt/user-data/note.txt", content: "hello"}], output: 1}});
return await captureArtifact({stepId: "keep", sourceStepId: "write", path: "note.txt"});
"#;
    let run_id = launch(&mut admin, script).await;
    let record = wait_for(&mut admin, &run_id, "completed").await;
    assert_eq!(record["result"]["bytes"], 5, "{record}");
    assert_eq!(
        storage(&mut admin).await,
        json!({"stored_bytes": 1 + 5, "stored_bytes_max": 10_u64 << 30})
    );
}

/// What `me` shows the caller's workflows store.
async fn stored_bytes(api: &mut Api) -> i64 {
    storage(api).await["stored_bytes"]
        .as_i64()
        .expect("stored bytes")
}

both!(attempt_errors_and_events_count_against_their_owners_quota);
/// Issue 39, items 1 and 2: failed attempts' errors and events were stored uncounted (a 2 MB quota
/// read 372 bytes while its workflows stored 1.94 GB of errors). Each is stored inside its
/// workflow's grant: once the workflow ends, what its owner stores is exactly what the store's
/// rows hold for it, errors and events included.
async fn attempt_errors_and_events_count_against_their_owners_quota(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[("REINS_LIMITS__USER_STORED_BYTES_MAX", "1000000".into())],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"try {
             await agent({stepId: "fail", agentRef: "scripted", task: {fail: "f".repeat(2000)},
                          retry: {maxAttempts: 3, initialIntervalMs: 0}});
           } catch (e) {}
           return await waitForEvent({stepId: "w", name: "go"});"#,
    )
    .await;
    let events = format!("/api/v1/workflows/{run_id}/events");
    for n in 0..3 {
        // 1,000 bytes each: a JSON string of 998 characters and its quotes.
        let noise =
            json!({"name": "noise", "event_id": format!("n-{n}"), "payload": "x".repeat(998)});
        let sent = api.call("POST", &events, Some(noise)).await;
        assert_eq!(sent.status, 200, "{sent:?}");
    }
    let go = json!({"name": "go", "event_id": "go", "payload": 7});
    assert_eq!(api.call("POST", &events, Some(go)).await.status, 200);
    let record = wait_for(&mut api, &run_id, "completed").await;
    let attempts = record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|step| step["step_id"] == "fail")
        .count();
    assert_eq!(attempts, 3, "{record}");
    let sum = async |sql: String| {
        db.sql(&sql)
            .await
            .expect("sum")
            .parse::<i64>()
            .expect("a number")
    };
    let errors = sum(format!(
        "SELECT coalesce(sum(error_bytes), 0) FROM workflow_steps WHERE workflow = '{run_id}'"
    ))
    .await;
    let event_bytes = sum(format!(
        "SELECT coalesce(sum(payload_bytes), 0) FROM sent_events WHERE workflow = '{run_id}'"
    ))
    .await;
    assert!(errors >= 3 * 2_000, "three errors of 2,000 bytes: {errors}");
    assert_eq!(event_bytes, 3 * 1_000 + 1);
    assert_eq!(stored_bytes(&mut api).await, errors + event_bytes);
    // The retried attempt's reason is its attempt before's error, stored once.
    let second = record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|step| step["step_id"] == "fail" && step["attempt"] == 2)
        .expect("attempt 2");
    assert_eq!(second["retry"]["reason"], "f".repeat(2000));
    let reasons = sum(format!(
        "SELECT count(*) FROM workflow_steps WHERE workflow = '{run_id}' \
          AND CAST(data AS TEXT) LIKE '%\"reason\"%'"
    ))
    .await;
    assert_eq!(reasons, 0, "an error was stored again as a reason");
    // Deleted, the workflow's bytes are its owner's again.
    let deleted = api
        .call("DELETE", &format!("/api/v1/workflows/{run_id}"), None)
        .await;
    assert!(deleted.status < 300, "{deleted:?}");
    assert_eq!(stored_bytes(&mut api).await, 0);
}

/// Issue 39, item 2: an event past its workflow owner's quota is refused (422, naming the quota)
/// with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_past_its_owners_quota_is_refused_with_nothing_written() {
    let db = Db::new(true).await;
    let node = Node::start(
        &db,
        &[("REINS_LIMITS__USER_STORED_BYTES_MAX", "2500".into())],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"return await waitForEvent({stepId: "w", name: "never"});"#,
    )
    .await;
    let events = format!("/api/v1/workflows/{run_id}/events");
    let event = |id: &str| json!({"name": "other", "event_id": id, "payload": "x".repeat(998)});
    for id in ["e1", "e2"] {
        let sent = api.call("POST", &events, Some(event(id))).await;
        assert_eq!(sent.status, 200, "{sent:?}");
    }
    let over = api.call("POST", &events, Some(event("e3"))).await;
    assert_refused(
        &over,
        422,
        "refused",
        "limits.user_stored_bytes_max (2500): the user's workflows store 2000 bytes",
    );
    let stored = db
        .sql(&format!(
            "SELECT count(*) FROM sent_events WHERE workflow = '{run_id}'"
        ))
        .await
        .expect("count");
    assert_eq!(stored, "2", "a refused event was stored");
    assert_eq!(stored_bytes(&mut api).await, 2000);
}
