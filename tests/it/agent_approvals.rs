//! An agent's own approval request, through the real binary: the workflow record shows it on the
//! step that asked, `answer` (REST, the compatible action, the CLI) answers it once across the
//! cluster, and the workflow goes on with the answer.

use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::{cli, code, json_of};
use crate::harness::both;
use crate::http_api::{ADMIN, Db, Node, PASSWORD, assert_refused, initialize, launch, wait_for};
use crate::http_client::Api;

/// One agent step that asks to deploy, then returns the answer it got.
const ASKING: &str = r#"
    const r = await agent({stepId: "ask", agentRef: "scripted", task: {
        ask_approval: {request_id: "deploy-1", actions: [{tool: "deploy"}]}}});
    return {decision: r.approval.answer.decision, comment: r.approval.answer.comment};
"#;

fn answer_path(run_id: &str) -> String {
    format!("/api/v1/workflows/{run_id}/steps/ask/answer")
}

/// Polls `get` until step `ask` waits for input, and returns that step's record.
async fn wait_for_request(api: &mut Api, run_id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let record = api.action("get", json!({"run_id": run_id})).await;
        assert_eq!(record.status, 200, "{record:?}");
        let record = record.json();
        if let Some(step) = record["steps"]
            .as_array()
            .and_then(|steps| steps.iter().find(|s| s["step_id"] == "ask"))
            && step["status"] == "waiting_for_input"
        {
            return step.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{run_id} never waited for input: {record}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

both!(an_agents_request_is_shown_answered_once_and_the_workflow_goes_on_with_it);
async fn an_agents_request_is_shown_answered_once_and_the_workflow_goes_on_with_it(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let run_id = launch(&mut api, ASKING).await;

    let step = wait_for_request(&mut api, &run_id).await;
    let approval = &step["approval"];
    assert_eq!(approval["status"], "waiting", "{step}");
    assert_eq!(approval["request_id"], "deploy-1");
    assert_eq!(approval["actions"], json!([{"tool": "deploy"}]));
    assert_eq!(approval["run_id"], step["run_id"]);
    assert!(approval["asked_at"].as_f64().is_some(), "{step}");

    // Another user's workflow does not exist for them, on both surfaces.
    let created = api
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "bob@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut bob = node.api();
    assert_eq!(bob.login("bob@example.com", PASSWORD).await.status, 200);
    let approve = json!({"decision": "approve", "comment": "ship it"});
    assert_refused(
        &bob.call("POST", &answer_path(&run_id), Some(approve.clone()))
            .await,
        404,
        "not_found",
        &run_id,
    );
    assert_refused(
        &bob.action(
            "answer",
            json!({"run_id": run_id, "step_id": "ask", "decision": "approve"}),
        )
        .await,
        404,
        "not_found",
        &run_id,
    );
    assert_refused(
        &api.call(
            "POST",
            &answer_path("nosuchworkflow"),
            Some(approve.clone()),
        )
        .await,
        404,
        "not_found",
        "nosuchworkflow",
    );
    assert_refused(
        &api.call(
            "POST",
            &answer_path(&run_id),
            Some(json!({"decision": "maybe"})),
        )
        .await,
        400,
        "bad_request",
        "maybe",
    );

    let first = api
        .call("POST", &answer_path(&run_id), Some(approve.clone()))
        .await;
    assert_eq!(first.status, 200, "{first:?}");
    let first = first.json();
    assert_eq!(
        (&first["status"], &first["request_id"], &first["repeated"]),
        (&json!("approved"), &json!("deploy-1"), &json!(false))
    );
    let again = api
        .call("POST", &answer_path(&run_id), Some(approve.clone()))
        .await;
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.json()["repeated"], true);
    assert_refused(
        &api.action(
            "answer",
            json!({"run_id": run_id, "step_id": "ask", "decision": "reject"}),
        )
        .await,
        409,
        "conflict",
        "already answered",
    );

    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(
        record["result"],
        json!({"decision": "approve", "comment": "ship it"})
    );
    let step = &record["steps"][0];
    assert_eq!(step["status"], "completed", "{record}");
    assert_eq!(step["approval"]["status"], "answered", "{record}");
    assert_eq!(step["approval"]["answer"]["decision"], "approve");
    assert_eq!(step["approval"]["answer"]["by"], ADMIN);
    assert_eq!(step["approval"]["actions"], json!([{"tool": "deploy"}]));
    // Issue 29, item 12: the approved run has no output; its artifact is the JSON document
    // `null`, not 0 bytes (which no preview can read).
    let artifact = api
        .call(
            "GET",
            &format!("/api/v1/workflows/{run_id}/artifacts/1"),
            None,
        )
        .await;
    assert_eq!(artifact.status, 200, "{artifact:?}");
    assert_eq!(artifact.body.as_ref(), b"null");

    // A step that never asked, or an unknown step, waits for nothing.
    let plain = launch(
        &mut api,
        "await agent({stepId: 'ask', agentRef: 'scripted', task: 'hi'}); return 1;",
    )
    .await;
    wait_for(&mut api, &plain, "completed").await;
    assert_refused(
        &api.call("POST", &answer_path(&plain), Some(approve.clone()))
            .await,
        422,
        "refused",
        "does not wait for input",
    );
    assert_refused(
        &api.call(
            "POST",
            &format!("/api/v1/workflows/{plain}/steps/other/answer"),
            Some(approve),
        )
        .await,
        404,
        "not_found",
        "other",
    );
}

/// Rounds of two nodes answering the same request at once, with different answers.
const ROUNDS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_answering_one_request_at_once_have_one_winner_and_the_workflow_takes_it() {
    let db = Db::new(true).await;
    let a = Node::start(&db, &[]);
    let b = Node::start(&db, &[]);
    let mut on_a = initialize(&a).await;
    let mut on_b = b.api();
    on_b.cookies = on_a.cookies.clone();

    // One round at a time: each workflow is answered before the next is launched.
    let mut runs = Vec::new();
    let mut winners = Vec::new();
    for _ in 0..ROUNDS {
        let run_id = launch(&mut on_a, ASKING).await;
        wait_for_request(&mut on_b, &run_id).await;
        let path = answer_path(&run_id);
        let (mut from_a, mut from_b) = (on_a.clone(), on_b.clone());
        let (by_a, by_b) = tokio::join!(
            from_a.call("POST", &path, Some(json!({"decision": "approve"}))),
            from_b.call("POST", &path, Some(json!({"decision": "reject"}))),
        );
        let winner = match (by_a.status, by_b.status) {
            (200, 409) => "approve",
            (409, 200) => "reject",
            other => panic!("not one winner for {run_id}: {other:?}\n{by_a:?}\n{by_b:?}"),
        };
        winners.push(winner);
        runs.push(run_id);
    }
    for (run_id, winner) in runs.iter().zip(&winners) {
        let record = wait_for(&mut on_a, run_id, "completed").await;
        assert_eq!(record["result"]["decision"], *winner, "{record}");
        let answered = db
            .sql(&format!(
                "SELECT count(*) FROM runs WHERE workflow = '{run_id}' \
                 AND metadata -> 'hitl_answer' IS NOT NULL"
            ))
            .await;
        assert_eq!(answered.as_deref(), Some("1"), "one run for {run_id}");
    }
    let approvals = winners.iter().filter(|w| **w == "approve").count();
    eprintln!(
        "{ROUNDS} rounds: node a won {approvals}, node b won {}",
        ROUNDS - approvals
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_wait_exits_3_while_an_agent_asks_and_the_cli_answers_it() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    std::fs::write(home.join("ask.js"), ASKING).expect("script");
    let init = cli(home, &node, &["init", "--email", ADMIN]);
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));

    let run = cli(home, &node, &["run", "ask.js", "--wait", "--json"]);
    assert_eq!(code(&run), 3, "{}", String::from_utf8_lossy(&run.stderr));
    let record = json_of(&run);
    assert_eq!(
        record["steps"][0]["status"], "waiting_for_input",
        "{record}"
    );
    let run_id = record["run_id"].as_str().expect("run_id").to_owned();

    let neither = cli(home, &node, &["answer", &run_id, "ask"]);
    assert_eq!(code(&neither), 2, "clap refuses a missing decision");
    let answer = cli(
        home,
        &node,
        &[
            "answer",
            &run_id,
            "ask",
            "--reject",
            "--comment",
            "not today",
            "--json",
        ],
    );
    assert_eq!(
        code(&answer),
        0,
        "{}",
        String::from_utf8_lossy(&answer.stderr)
    );
    assert_eq!(json_of(&answer)["status"], "rejected");
    let other = cli(home, &node, &["answer", &run_id, "ask", "--approve"]);
    assert_eq!(code(&other), 1, "a different second answer is refused");

    let mut api = node.api();
    assert_eq!(api.login(ADMIN, PASSWORD).await.status, 200);
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(
        record["result"],
        json!({"decision": "reject", "comment": "not today"})
    );
}

both!(a_live_command_agent_gets_the_answer_on_stdin_and_its_step_completes_with_it);
async fn a_live_command_agent_gets_the_answer_on_stdin_and_its_step_completes_with_it(
    postgres: bool,
) {
    let db = Db::new(postgres).await;
    let programs = tempfile::tempdir().expect("temp dir");
    let config = crate::agent_processes::write_config(
        programs.path(),
        &[(
            "careful",
            r#"read task
echo '{"type": "approval_request", "request_id": "deploy-1", "actions": [{"tool": "deploy"}]}'
read answer
printf '{"type": "output", "output": %s}\n' "$answer""#,
            "",
        )],
    );
    let node = Node::start(&db, &[("REINS_CONFIG", config)]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        "const r = await agent({stepId: 'ask', agentRef: 'careful', task: 'ship'}); \
         return {...r.output.answer, approval: r.approval};",
    )
    .await;
    let step = wait_for_request(&mut api, &run_id).await;
    assert_eq!(step["approval"]["request_id"], "deploy-1", "{step}");
    let answered = api
        .call(
            "POST",
            &answer_path(&run_id),
            Some(json!({"decision": "reject", "comment": "not yet", "request_id": "deploy-1"})),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let record = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(record["result"]["decision"], "reject", "{record}");
    assert_eq!(record["result"]["comment"], "not yet", "{record}");
    assert_eq!(record["result"]["by"], ADMIN, "{record}");
    // The step's result carries the answer as it would after a takeover (read from the row).
    let approval = &record["result"]["approval"];
    assert_eq!(approval["request_id"], "deploy-1", "{record}");
    assert_eq!(approval["answer"]["decision"], "reject", "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_still_waits_for_its_answer_after_the_workflow_changes_hands() {
    let db = Db::new(true).await;
    let quick = [
        ("REINS_LEASE_SECONDS", "2".to_owned()),
        ("REINS_RECOVERY", "automatic".to_owned()),
    ];
    let a = Node::start(&db, &quick);
    let b = Node::start(&db, &quick);
    let mut on_a = initialize(&a).await;
    let mut on_b = b.api();
    on_b.cookies = on_a.cookies.clone();
    let run_id = launch(&mut on_a, ASKING).await;
    wait_for_request(&mut on_b, &run_id).await;
    let owner = on_b.action("get", json!({"run_id": run_id})).await.json()["owner"].clone();
    let (dead, mut survivor) = if owner
        .as_str()
        .is_some_and(|o| o.contains(&a.process.pid().to_string()))
    {
        (a, on_b)
    } else {
        (b, on_a)
    };
    dead.signal(libc::SIGKILL);
    // Taken over by the survivor, the step still waits for a person: before the fix the
    // replayed admission found the waiting run and sent the workflow to needs_reconciliation.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let record = survivor
            .action("get", json!({"run_id": run_id}))
            .await
            .json();
        assert_ne!(record["status"], "needs_reconciliation", "{record}");
        if record["owner"] != owner && record["epoch"].as_i64() >= Some(2) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never taken over: {record}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_for_request(&mut survivor, &run_id).await;
    let answered = survivor
        .call(
            "POST",
            &answer_path(&run_id),
            Some(json!({"decision": "approve", "comment": "go"})),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let done = wait_for(&mut survivor, &run_id, "completed").await;
    assert_eq!(
        done["result"],
        json!({"decision": "approve", "comment": "go"})
    );
}

/// The status of step `step_id` in workflow `run_id`'s record.
async fn step_status(api: &mut Api, run_id: &str, step_id: &str) -> String {
    let record = api.action("get", json!({"run_id": run_id})).await;
    assert_eq!(record.status, 200, "{record:?}");
    let record = record.json();
    record["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["step_id"] == step_id))
        .and_then(|step| step["status"].as_str())
        .unwrap_or_default()
        .to_owned()
}

/// The slots held across the cluster, as an admin reads them.
async fn slots_held(admin: &mut Api) -> Value {
    let slots = admin.call("GET", "/api/v1/admin/slots", None).await;
    assert_eq!(slots.status, 200, "{slots:?}");
    slots.json()
}

both!(agents_waiting_for_a_person_hold_no_slot_and_an_answered_one_waits_for_a_slot_to_go_on);
/// Two live `command` agents of the admin's wait for a person: they hold none of the cluster's
/// two slots, so Bob's two steps run meanwhile (before, the waiting agents held both slots and
/// Bob's steps waited `queued` for the person: issue 29, item 7). An answer given while Bob holds
/// both slots is kept from its agent until a slot frees; then the agent goes on with it, and
/// nothing holds a slot once everything ended.
async fn agents_waiting_for_a_person_hold_no_slot_and_an_answered_one_waits_for_a_slot_to_go_on(
    postgres: bool,
) {
    let db = Db::new(postgres).await;
    let programs = tempfile::tempdir().expect("temp dir");
    let config = crate::agent_processes::write_config(
        programs.path(),
        &[(
            "careful",
            r#"read task
echo '{"type": "approval_request", "request_id": "deploy-1", "actions": [{"tool": "deploy"}]}'
read answer
printf '{"type": "output", "output": %s}\n' "$answer""#,
            "",
        )],
    );
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_bob"), b"").expect("hold");
    let mut node = Node::start(
        &db,
        &[
            ("REINS_CONFIG", config),
            ("REINS_LIMITS__MAX_ACTIVE_CHILDREN", "2".to_owned()),
            // The share alone: with a slot kept for others, the admin's two agents could not
            // both hold one.
            ("REINS_LIMITS__ACTIVE_CHILDREN_RESERVED", "0".to_owned()),
            ("REINS_FAULT_DIR", faults.path().display().to_string()),
            // Renewals, which carry an answer to its live agent, every second.
            ("REINS_LEASE_SECONDS", "3".to_owned()),
        ],
    );
    let mut admin = initialize(&node).await;
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "bob@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut bob = node.api();
    assert_eq!(bob.login("bob@example.com", PASSWORD).await.status, 200);

    let asking = launch(
        &mut admin,
        r#"const rs = await parallel([1, 2].map((i) => () => agent({stepId: "ask" + i,
               agentRef: "careful", task: "ship"})));
           return rs.map((r) => r.output.answer.decision);"#,
    )
    .await;
    crate::harness::eventually(Duration::from_secs(30), "both agents ask", async || {
        step_status(&mut admin, &asking, "ask1").await == "waiting_for_input"
            && step_status(&mut admin, &asking, "ask2").await == "waiting_for_input"
    })
    .await;
    let slots = slots_held(&mut admin).await;
    assert_eq!(
        slots["held"], 0,
        "agents waiting for a person hold slots: {slots}"
    );

    let holding = launch(
        &mut bob,
        r#"return await parallel([1, 2].map((i) => () => agent({stepId: "b" + i,
               agentRef: "scripted", task: {hold_while: "hold_bob"}})));"#,
    )
    .await;
    crate::harness::eventually(Duration::from_secs(30), "bob's steps run", async || {
        step_status(&mut bob, &holding, "b1").await == "running"
            && step_status(&mut bob, &holding, "b2").await == "running"
    })
    .await;

    let answered = admin
        .call(
            "POST",
            &format!("/api/v1/workflows/{asking}/steps/ask1/answer"),
            Some(json!({"decision": "approve"})),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let waits = "the answered run waits for a slot before its agent goes on";
    let log = node.process.stderr_with(&[waits], Duration::from_secs(30));
    assert!(
        log.contains(waits),
        "the answered run never waited for a slot:\n{log}"
    );
    assert_ne!(step_status(&mut admin, &asking, "ask1").await, "completed");
    let slots = slots_held(&mut admin).await;
    assert_eq!(slots["held"], 2, "{slots}");
    assert!(
        slots["slots"]
            .as_array()
            .is_some_and(|held| held.iter().all(|slot| slot["run_id"] == holding)),
        "{slots}"
    );

    std::fs::remove_file(faults.path().join("hold_bob")).expect("end bob's steps");
    wait_for(&mut bob, &holding, "completed").await;
    crate::harness::eventually(
        Duration::from_secs(30),
        "the answered agent goes on",
        async || step_status(&mut admin, &asking, "ask1").await == "completed",
    )
    .await;
    let answered = admin
        .call(
            "POST",
            &format!("/api/v1/workflows/{asking}/steps/ask2/answer"),
            Some(json!({"decision": "reject"})),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let record = wait_for(&mut admin, &asking, "completed").await;
    assert_eq!(record["result"], json!(["approve", "reject"]), "{record}");
    let slots = slots_held(&mut admin).await;
    assert_eq!(slots["held"], 0, "{slots}");
}
