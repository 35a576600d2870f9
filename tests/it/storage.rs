//! The per-user quota on stored bytes (`limits.user_stored_bytes_max`) through the real binary,
//! on both backends: a capture past it fails its step with a `StepError` naming the quota, the
//! user's stored bytes and the limit, with nothing of it stored; another user's workflows go on
//! under their own quota; `me` and the admins' listing show what each user stores; and deleting
//! a workflow gives its bytes back.

use serde_json::{Value, json};

use crate::harness::both;
use crate::http_api::{ADMIN, Db, Node, PASSWORD, initialize, launch, wait_for};
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
    assert_eq!(
        storage(&mut admin).await,
        json!({"stored_bytes": QUOTA, "stored_bytes_max": QUOTA})
    );

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
    let full = json!({"stored_bytes": QUOTA, "stored_bytes_max": QUOTA});
    assert_eq!(
        users,
        [(ADMIN.to_owned(), full.clone()), (BOB.to_owned(), full)]
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
