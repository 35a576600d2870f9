//! `reins retry` through the real binary on both backends: a workflow whose third step failed is
//! run again as a new workflow that adopts its first two steps (their child runs are not made
//! again, their randomness and clock replay as they ran), runs the third live and completes, a
//! capture after the adopted agent step still finds its file; the two are linked both ways and
//! the failed one stays failed; a retry asked twice is one; what is not failed, unknown or
//! another user's is refused.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::agent_processes::write_config;
use crate::cli::{cli, code, json_of};
use crate::harness::both;
use crate::http_api::{Db, Node, PASSWORD, assert_refused, initialize, launch, wait_for};
use crate::http_client::Api;

/// Three agent steps and a capture of the first one's file. `two`'s task holds the script's first
/// random number and the clock before any step: a replay with another seed or clock would call
/// it with other arguments and fail as non-deterministic.
pub const SCRIPT: &str = r#"
    const started = Date.now();
    const one = await agent({stepId: "one", agentRef: "scripted", task: {
        write: [{path: "/mnt/user-data/notes/one.txt", content: "written by one"}],
        output: "one"}});
    const two = await agent({stepId: "two", agentRef: "scripted",
                             task: {output: {random: Math.random(), started}}});
    const three = await agent({stepId: "three", agentRef: "gate", task: "go"});
    const kept = await captureArtifact({stepId: "keep", sourceStepId: "one",
                                        path: "/mnt/user-data/notes/one.txt"});
    return {one: one.output, two: two.output, three: three.output, kept: kept.bytes};
"#;

/// A node (with `env`) whose `gate` agent fails while the file `gate` exists in `files`.
pub fn node_with_gate(db: &Db, files: &Path, env: &[(&str, String)]) -> Node {
    let gate = files.join("gate");
    std::fs::write(&gate, b"closed").expect("close the gate");
    let config = write_config(
        files,
        &[(
            "gate",
            "read task\nif [ -e \"$GATE\" ]; then echo 'the gate is closed' >&2; exit 1; fi\n\
             echo '{\"type\": \"output\", \"output\": \"passed\"}'",
            &format!("env = {{ GATE = \"{}\" }}", gate.display()),
        )],
    );
    let mut env = env.to_vec();
    env.push(("REINS_CONFIG", config));
    Node::start(db, &env)
}

/// The child runs of `workflow`, by step.
async fn runs_of(db: &Db, workflow: &str) -> String {
    db.sql(&format!(
        "SELECT coalesce(string_agg(step_id, ',' ORDER BY step_id), '') FROM runs \
         WHERE workflow = '{workflow}'"
    ))
    .await
    .unwrap_or_default()
}

fn retry_path(run_id: &str) -> String {
    format!("/api/v1/workflows/{run_id}/retry")
}

fn step<'a>(record: &'a Value, step_id: &str) -> &'a Value {
    record["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["step_id"] == step_id)
        .unwrap_or_else(|| panic!("no step {step_id}: {record}"))
}

/// A user made by `admin`, signed in.
async fn user(node: &Node, admin: &mut Api, email: &str, role: &str) -> Api {
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": email, "password": PASSWORD, "role": role})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut api = node.api();
    assert_eq!(api.login(email, PASSWORD).await.status, 200);
    api
}

both!(a_workflow_whose_third_step_failed_runs_again_from_it_and_completes);
async fn a_workflow_whose_third_step_failed_runs_again_from_it_and_completes(postgres: bool) {
    let db = Db::new(postgres).await;
    let files = tempfile::tempdir().expect("temp dir");
    let node = node_with_gate(&db, files.path(), &[]);
    let mut api = initialize(&node).await;
    let old = launch(&mut api, SCRIPT).await;
    let failed = wait_for(&mut api, &old, "failed").await;
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("the gate is closed")),
        "{failed}"
    );
    assert_eq!(runs_of(&db, &old).await, "one,three,two");

    // The cause is fixed; the person retries it from the command line.
    std::fs::remove_file(files.path().join("gate")).expect("open the gate");
    let home = tempfile::tempdir().expect("cli home");
    let login = cli(
        home.path(),
        &node,
        &["login", "--email", crate::http_api::ADMIN],
    );
    assert_eq!(
        code(&login),
        0,
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let retried = cli(home.path(), &node, &["retry", &old, "--wait", "--json"]);
    assert_eq!(
        code(&retried),
        0,
        "{}",
        String::from_utf8_lossy(&retried.stderr)
    );
    let done = json_of(&retried);
    let new = done["run_id"].as_str().expect("run_id").to_owned();
    assert_ne!(new, old);
    assert_eq!(done["status"], "completed", "{done}");

    // Steps one and two were adopted, their outcomes as they were (the same random number and
    // clock: the same seed and start); three ran again and the capture found one's file.
    let before = step(&failed, "two")["output"].clone();
    assert_eq!(
        done["result"],
        json!({"one": "one", "two": before, "three": "passed", "kept": 14})
    );
    assert_eq!(
        runs_of(&db, &old).await,
        "one,three,two",
        "the old one ran nothing more"
    );
    assert_eq!(
        runs_of(&db, &new).await,
        "three",
        "nothing before the failed step ran again"
    );
    for adopted in ["one", "two"] {
        assert_eq!(
            step(&done, adopted)["run_id"],
            step(&failed, adopted)["run_id"],
            "{adopted}"
        );
        assert_eq!(step(&done, adopted)["status"], "completed");
    }
    assert_eq!(step(&done, "three")["status"], "completed");
    assert_eq!(done["retry_of"], json!(old));
    assert_eq!(done["retried_by"], Value::Null);

    // The failed workflow stays failed, and names its retry.
    let old_record = api
        .call("GET", &format!("/api/v1/workflows/{old}"), None)
        .await;
    let old_record = old_record.json();
    assert_eq!(
        (&old_record["status"], &old_record["retried_by"]),
        (&json!("failed"), &json!(new))
    );
    assert_eq!(old_record["error"], failed["error"]);

    // Asked again, over HTTP or the command line: that retry, still one.
    let again = api.call("POST", &retry_path(&old), Some(json!({}))).await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(
        again.json(),
        json!({"run_id": new, "retry_of": old, "repeated": true, "status": "completed"})
    );
    let again = cli(home.path(), &node, &["retry", &old]);
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        new,
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let total = db
        .sql("SELECT count(*) FROM workflows")
        .await
        .unwrap_or_default();
    assert_eq!(total, "2");

    // Deleting the failed one leaves its retry whole, artifacts and all.
    let deleted = api
        .call("DELETE", &format!("/api/v1/workflows/{old}"), None)
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let version = &step(&done, "keep")["artifact_version"];
    let kept = api
        .call(
            "GET",
            &format!("/api/v1/workflows/{new}/artifacts/{version}"),
            None,
        )
        .await;
    assert_eq!((kept.status, &kept.body[..]), (200, &b"written by one"[..]));
}

both!(a_retry_is_refused_for_what_did_not_fail_and_to_anyone_but_the_owner_or_an_admin);
async fn a_retry_is_refused_for_what_did_not_fail_and_to_anyone_but_the_owner_or_an_admin(
    postgres: bool,
) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut admin = initialize(&node).await;
    let mut ada = user(&node, &mut admin, "ada@example.com", "user").await;
    let mut bob = user(&node, &mut admin, "bob@example.com", "user").await;
    let mut approver = user(&node, &mut admin, "carol@example.com", "approver").await;

    let failed = launch(&mut ada, r#"throw new Error("after no step");"#).await;
    let source = wait_for(&mut ada, &failed, "failed").await;
    // Another user's workflow does not exist for them; an approver sees it but may not retry it.
    assert_refused(
        &bob.call("POST", &retry_path(&failed), None).await,
        404,
        "not_found",
        &failed,
    );
    assert_refused(
        &approver.call("POST", &retry_path(&failed), None).await,
        403,
        "owner_only",
        "retry",
    );
    // Unknown ids and bad bodies.
    assert_refused(
        &ada.call("POST", &retry_path("nosuchworkflow"), None).await,
        404,
        "not_found",
        "nosuchworkflow",
    );
    assert_refused(
        &ada.call(
            "POST",
            &retry_path(&failed),
            Some(json!({"request_id": "no spaces"})),
        )
        .await,
        400,
        "bad_request",
        "request_id",
    );
    assert_refused(
        &ada.call("POST", &retry_path(&failed), Some(json!({"step": "a"})))
            .await,
        400,
        "bad_request",
        "step",
    );
    // The owner may (with no body at all), and so may an admin, who gets the same retry.
    let made = ada.call("POST", &retry_path(&failed), None).await;
    assert_eq!(made.status, 201, "{made:?}");
    let retry = made.json()["run_id"].as_str().expect("run_id").to_owned();
    let by_admin = admin.call("POST", &retry_path(&failed), None).await;
    assert_eq!(
        (by_admin.status, by_admin.json()["run_id"].clone()),
        (200, json!(retry))
    );
    // It adopted nothing (no step ran) and failed as its source did; it is ada's.
    let retried = wait_for(&mut ada, &retry, "failed").await;
    assert_eq!(
        (&retried["user_id"], &retried["retry_of"]),
        (&source["user_id"], &json!(failed))
    );

    // What did not fail is not retried, and the answer says what it is and what to do.
    let paused = launch(&mut ada, r#"await pause({stepId: "p"}); return 1;"#).await;
    wait_for(&mut ada, &paused, "paused").await;
    assert_refused(
        &ada.call("POST", &retry_path(&paused), None).await,
        409,
        "not_retryable",
        "it is paused: only a failed workflow is retried",
    );
    let done = launch(&mut ada, "return 1;").await;
    wait_for(&mut ada, &done, "completed").await;
    assert_refused(
        &ada.call("POST", &retry_path(&done), None).await,
        409,
        "not_retryable",
        "it completed",
    );
    let cancelled = ada
        .call("POST", &format!("/api/v1/workflows/{paused}/cancel"), None)
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    wait_for(&mut ada, &paused, "cancelled").await;
    assert_refused(
        &ada.call("POST", &retry_path(&paused), None).await,
        409,
        "not_retryable",
        "launch it anew (`reins run`)",
    );
    let workflows = db
        .sql("SELECT count(*) FROM workflows")
        .await
        .unwrap_or_default();
    assert_eq!(workflows, "4", "a refused retry made a workflow");
}

/// A retry's `timeout_seconds` counts from the retry, not from the launch of the workflow it
/// runs again (whose clock it keeps for its replay): a workflow retried after its own timeout
/// would pass runs to completion instead of being cancelled at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_made_after_its_sources_timeout_would_have_passed_runs_its_own_time() {
    const TIMEOUT_SECONDS: f64 = 3.0;
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let node = node_with_gate(
        &db,
        files.path(),
        &[("REINS_LIMITS__TIMEOUT_SECONDS", TIMEOUT_SECONDS.to_string())],
    );
    let mut api = initialize(&node).await;
    let old = launch(
        &mut api,
        r#"await agent({stepId: "one", agentRef: "scripted", task: "x"});
           await agent({stepId: "gated", agentRef: "gate", task: "go"});
           await agent({stepId: "nap", agentRef: "scripted", task: {sleep_ms: 500}});
           return "done";"#,
    )
    .await;
    let failed = wait_for(&mut api, &old, "failed").await;
    std::fs::remove_file(files.path().join("gate")).expect("open the gate");
    // Until the failed workflow's own timeout has passed (by this machine's clock, which the
    // node's is).
    let launched_at = failed["created_at"].as_f64().expect("created_at");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|now| now.as_secs_f64())
        .unwrap_or(0.0)
        <= launched_at + TIMEOUT_SECONDS + 0.5
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the clock never passed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let made = api.call("POST", &retry_path(&old), None).await;
    assert_eq!(made.status, 201, "{made:?}");
    let retry = made.json()["run_id"].as_str().expect("run_id").to_owned();
    let done = wait_for(&mut api, &retry, "completed").await;
    assert_eq!(done["result"], "done", "{done}");
}

/// A retry of the failed `old` is refused with `(status, code, a part of its message)`: the
/// workflow names no retry, and the folders of `workspaces` are what they were (the refused
/// retry's copies removed).
async fn refused_leaves_nothing(
    api: &mut Api,
    workspaces: &Path,
    old: &str,
    (status, code, needle): (u16, &str, &str),
) {
    let folders_before = std::fs::read_dir(workspaces).expect("list").count();
    let refused = api.call("POST", &retry_path(old), Some(json!({}))).await;
    assert_refused(&refused, status, code, needle);
    let record = api
        .call("GET", &format!("/api/v1/workflows/{old}"), None)
        .await
        .json();
    assert_eq!(record["retried_by"], Value::Null, "{record}");
    assert_eq!(
        std::fs::read_dir(workspaces).expect("list").count(),
        folders_before,
        "the refused retry's copies are removed"
    );
}

/// Issue 39, item 3: a retry's workspace copy wrote a sparse file out in full (a `truncate -s 3G`
/// became 3 GB on disk per retry) and nothing bounded what it copied. The copy keeps holes; the
/// data it copies is bounded by `limits.retry_copy_bytes_max`, past which the retry is refused
/// (413, naming the limit), nothing is made and no copy is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_copies_a_workspace_with_its_holes_and_within_its_bound() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let node = node_with_gate(
        &db,
        files.path(),
        &[("REINS_LIMITS__RETRY_COPY_BYTES_MAX", "100000".into())],
    );
    let mut api = initialize(&node).await;
    let workspaces = node.dir.path().join("data/workspaces");
    let workspace_of = |record: &Value| {
        let thread = step(record, "one")["thread_id"].as_str().expect("thread");
        workspaces.join(thread).join("user-data")
    };

    // A sparse file of 3 GiB holding a few bytes, beside what the agent wrote: copied, holes and
    // all, into the retry's own thread.
    let old = launch(&mut api, SCRIPT).await;
    let failed = wait_for(&mut api, &old, "failed").await;
    let sparse = std::fs::File::create(workspace_of(&failed).join("big.bin")).expect("create");
    sparse.set_len(3 << 30).expect("truncate -s 3G");
    sparse.write_all_at(b"data", 2 << 30).expect("write");
    std::fs::remove_file(files.path().join("gate")).expect("open the gate");
    let retried = api.call("POST", &retry_path(&old), Some(json!({}))).await;
    assert_eq!(retried.status, 201, "{retried:?}");
    let new = retried.json()["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    wait_for(&mut api, &new, "completed").await;
    // The retry's own thread: the one folder beside the original that holds the file.
    let original = workspace_of(&failed).join("big.bin");
    let copies: Vec<_> = std::fs::read_dir(&workspaces)
        .expect("list")
        .map(|entry| entry.expect("entry").path().join("user-data/big.bin"))
        .filter(|path| path.exists() && *path != original)
        .collect();
    let [copy] = &copies[..] else {
        panic!("one copy: {copies:?}");
    };
    let metadata = std::fs::metadata(copy).expect("the copy");
    assert_eq!(metadata.len(), 3 << 30);
    assert!(
        metadata.blocks() * 512 < 16 << 20,
        "the copy takes {} bytes on disk",
        metadata.blocks() * 512
    );
    let mut read = [0_u8; 4];
    std::fs::File::open(copy)
        .expect("open")
        .read_exact_at(&mut read, 2 << 30)
        .expect("read");
    assert_eq!(&read, b"data");

    // 200,000 bytes of data, over the bound of 100,000: refused, nothing made, nothing left.
    std::fs::write(files.path().join("gate"), b"closed").expect("close the gate");
    let old = launch(&mut api, SCRIPT).await;
    let failed = wait_for(&mut api, &old, "failed").await;
    std::fs::write(workspace_of(&failed).join("data.bin"), vec![7_u8; 200_000]).expect("write");
    let refusal = (
        413,
        "too_large",
        "more than 100000 bytes of data (`limits.retry_copy_bytes_max`)",
    );
    refused_leaves_nothing(&mut api, &workspaces, &old, refusal).await;
}

/// Issue 39, item 3: a retry's workspace copies were not counted in its owner's quota. The data
/// a retry copies is stored for its owner with the rest of the retry (`copied_bytes` of its
/// grant); a retry whose copies would pass the quota is refused (422, naming it), nothing is made
/// and no copy is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrys_workspace_copies_count_against_its_owners_quota() {
    let db = Db::new(true).await;
    let files = tempfile::tempdir().expect("temp dir");
    let node = node_with_gate(
        &db,
        files.path(),
        &[("REINS_LIMITS__USER_STORED_BYTES_MAX", "150000".into())],
    );
    let mut api = initialize(&node).await;
    let workspaces = node.dir.path().join("data/workspaces");
    let workspace_of = |record: &Value| {
        let thread = step(record, "one")["thread_id"].as_str().expect("thread");
        workspaces.join(thread).join("user-data")
    };
    let stored = async |api: &mut Api| {
        let me = api.call("GET", "/api/v1/auth/me", None).await;
        me.json()["storage"]["stored_bytes"]
            .as_i64()
            .expect("stored bytes")
    };
    let old = launch(&mut api, SCRIPT).await;
    let failed = wait_for(&mut api, &old, "failed").await;
    std::fs::write(workspace_of(&failed).join("data.bin"), vec![7_u8; 60_000]).expect("write");
    let before = stored(&mut api).await;
    std::fs::remove_file(files.path().join("gate")).expect("open the gate");
    let retried = api.call("POST", &retry_path(&old), Some(json!({}))).await;
    assert_eq!(retried.status, 201, "{retried:?}");
    let new = retried.json()["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    wait_for(&mut api, &new, "completed").await;
    // What it copied: the file and what `one` wrote ("written by one", 14 bytes).
    let copied = db
        .sql(&format!(
            "SELECT copied_bytes FROM workflow_storage WHERE workflow = '{new}'"
        ))
        .await
        .expect("copied bytes");
    assert_eq!(copied, "60014");
    let after = stored(&mut api).await;
    assert!(
        after - before >= 60_014,
        "the copy is not counted: {before} then {after}"
    );

    // Another retry copying as much again would pass the quota of 150,000: refused, nothing made.
    std::fs::write(files.path().join("gate"), b"closed").expect("close the gate");
    let old = launch(&mut api, SCRIPT).await;
    let failed = wait_for(&mut api, &old, "failed").await;
    std::fs::write(workspace_of(&failed).join("data.bin"), vec![7_u8; 100_000]).expect("write");
    let refusal = (422, "refused", "limits.user_stored_bytes_max (150000)");
    refused_leaves_nothing(&mut api, &workspaces, &old, refusal).await;
}

/// Issue 39, item 3: four concurrent retries of one workflow made four copies of its workspaces
/// at once. A node makes one retry of a workflow at a time: a second request waits for the first
/// (held here before its copy by the `retry_copy` fault point) and then answers what it made, as
/// `repeated`, with no copy of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_of_one_workflow_make_one_copy() {
    let db = Db::new(false).await;
    let (files, faults) = (
        tempfile::tempdir().expect("temp dir"),
        tempfile::tempdir().expect("fault dir"),
    );
    let node = node_with_gate(
        &db,
        files.path(),
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let mut api = initialize(&node).await;
    let old = launch(&mut api, SCRIPT).await;
    wait_for(&mut api, &old, "failed").await;
    std::fs::remove_file(files.path().join("gate")).expect("open the gate");
    std::fs::write(
        faults.path().join("arm.json"),
        json!({"boundary": "retry_copy"}).to_string(),
    )
    .expect("arm");
    let ask = |mut api: Api, old: String| {
        tokio::spawn(async move { api.call("POST", &retry_path(&old), Some(json!({}))).await })
    };
    let first = ask(api.clone(), old.clone());
    crate::harness::eventually(
        Duration::from_secs(60),
        "the first retry holds",
        async || faults.path().join("reached.json").exists(),
    )
    .await;
    let second = ask(api.clone(), old.clone());
    // A second retry beside the first would copy and answer now (the fault point holds once).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !second.is_finished(),
        "a second retry ran beside the first: {:?}",
        second.await
    );
    std::fs::write(faults.path().join("release"), b"").expect("release");
    let first = first.await.expect("first");
    assert_eq!(first.status, 201, "{first:?}");
    let second = second.await.expect("second");
    assert_eq!(second.status, 200, "{second:?}");
    assert_eq!(second.json()["repeated"], true, "{second:?}");
    assert_eq!(second.json()["run_id"], first.json()["run_id"]);
}

/// Issue 39, item 3: a node killed while copying a retry's workspaces left the copy, a folder
/// of a workflow that does not exist, forever. A node's start removes the thread folders of
/// workflows that do not exist once they are an hour old (a copy in progress is younger), and
/// nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_start_sweeps_old_workspaces_of_workflows_that_do_not_exist() {
    let db = Db::new(false).await;
    let workspaces = tempfile::tempdir().expect("workspaces");
    let folder = |name: &str, age: Duration| {
        let path = workspaces.path().join(name);
        std::fs::create_dir_all(path.join("user-data")).expect("mkdir");
        std::fs::write(path.join("user-data/copy.bin"), b"half a copy").expect("write");
        let changed = std::time::SystemTime::now() - age;
        std::fs::File::open(&path)
            .expect("open")
            .set_modified(changed)
            .expect("age it");
        path
    };
    let hour = Duration::from_secs(3600);
    let orphan = folder(&format!("{}-{}", "a".repeat(32), "b".repeat(16)), 2 * hour);
    let young = folder(
        &format!("{}-{}", "c".repeat(32), "d".repeat(16)),
        Duration::ZERO,
    );
    let other = folder("not-a-workflow-thread", 2 * hour);
    let node = Node::start(
        &db,
        &[(
            "REINS_WORKSPACES_DIR",
            workspaces.path().display().to_string(),
        )],
    );
    initialize(&node).await;
    crate::harness::eventually(
        Duration::from_secs(60),
        "the orphan is removed",
        async || !orphan.exists(),
    )
    .await;
    assert!(young.exists(), "a copy that may be in progress was removed");
    assert!(
        other.exists(),
        "a folder that names no workflow's thread was removed"
    );
}
