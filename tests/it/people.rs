//! What a person reads about a workflow, through the real binary (issue 32, item 6): a launch's
//! title, bounded by `limits.title_chars_max` and shown beside the run id by `get`, the list, the
//! inbox, a retry and the CLI; the `waiting_for_input` status of a workflow whose agent waits
//! for a person, in `get`, `?wait`, the list and its filter; and an agent's requested actions
//! as `reins inbox` and `reins get` print them.

use serde_json::{Value, json};

use crate::cli::{cli, code, json_of};
use crate::harness::both;
use crate::http_api::{ADMIN, Db, Node, assert_refused, initialize, wait_for};
use crate::http_client::Api;

/// A pause with a message for whoever answers it.
const PAUSING: &str = r#"
    const input = await pause({stepId: "go", message: "Check the numbers first"});
    return input;
"#;

/// One agent step that asks to deploy, then returns the answer it got.
const ASKING: &str = r#"
    const r = await agent({stepId: "ask", agentRef: "scripted", task: {
        ask_approval: {request_id: "deploy-1",
                       actions: [{tool: "deploy", args: {target: "prod", version: "1.2"}}]}}});
    return r.approval.answer.decision;
"#;

/// A checkpoint on a captured file, then a pause: still live once the checkpoint is decided.
const REVIEWED_THEN_PAUSED: &str = r#"
    await agent({stepId: "draft", agentRef: "scripted", task: {
        write: [{path: "/mnt/user-data/outputs/r.txt", content: "the draft"}], output: "drafted"}});
    const f = await captureArtifact({stepId: "file", sourceStepId: "draft",
                                     path: "/mnt/user-data/outputs/r.txt"});
    await humanCheckpoint({stepId: "review", sourceStepId: "file",
                           artifactVersion: f.artifactVersion});
    return await pause({stepId: "after"});
"#;

/// Launches `script` titled `title` through REST; the answer as it came.
async fn launch_titled(api: &mut Api, script: &str, title: &str) -> crate::http_client::Answer {
    api.call(
        "POST",
        "/api/v1/workflows",
        Some(json!({"script": script, "title": title})),
    )
    .await
}

fn run_id(answer: &crate::http_client::Answer) -> String {
    assert!(matches!(answer.status, 200 | 201), "{answer:?}");
    answer.json()["run_id"].as_str().expect("run_id").to_owned()
}

/// The lines of a listing, `run_id` to the line.
async fn listed(api: &mut Api, query: &str) -> Vec<Value> {
    let page = api
        .call("GET", &format!("/api/v1/workflows?limit=50{query}"), None)
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    page.json()["workflows"]
        .as_array()
        .expect("workflows")
        .clone()
}

fn line<'a>(lines: &'a [Value], run_id: &str) -> &'a Value {
    lines
        .iter()
        .find(|w| w["run_id"] == run_id)
        .unwrap_or_else(|| panic!("{run_id} is not listed: {lines:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_title_is_bounded_and_shown_beside_the_run_id_by_get_the_list_the_inbox_and_a_retry() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;

    // At its edge: 200 characters (400 bytes of UTF-8) are taken, 201 refused, naming the
    // field and the limit, with nothing launched.
    let edge = "é".repeat(200);
    let paused = run_id(&launch_titled(&mut api, PAUSING, &edge).await);
    let over = launch_titled(&mut api, "return 1;", &"é".repeat(201)).await;
    assert_refused(
        &over,
        400,
        "bad_request",
        "title is refused: it has 201 characters, more than 200 (limits.title_chars_max is 200)",
    );
    for (title, says) in [
        ("two\nlines", "control character U+000A"),
        ("bell\u{7}", "control character U+0007"),
        ("\u{202E}gnp.exe", "control character U+202E"),
        ("   ", "it is empty"),
    ] {
        assert_refused(
            &launch_titled(&mut api, "return 1;", title).await,
            400,
            "bad_request",
            says,
        );
    }
    let compat = api
        .action(
            "launch",
            json!({"script": "return 1;", "title": "x".repeat(201)}),
        )
        .await;
    assert_refused(
        &compat,
        400,
        "bad_request",
        "(limits.title_chars_max is 200)",
    );
    assert_eq!(
        listed(&mut api, "").await.len(),
        1,
        "only the titled pause was launched"
    );

    // `get`, the list and the inbox show it beside the run id; the compatible action takes one.
    let record = wait_for(&mut api, &paused, "paused").await;
    assert_eq!(record["title"], edge.as_str());
    let quarterly = run_id(
        &api.action(
            "launch",
            json!({"script": "return 1;", "title": "Quarterly <report>"}),
        )
        .await,
    );
    let untitled = run_id(&api.action("launch", json!({"script": "return 2;"})).await);
    let lines = listed(&mut api, "").await;
    assert_eq!(line(&lines, &paused)["title"], edge.as_str());
    assert_eq!(line(&lines, &quarterly)["title"], "Quarterly <report>");
    assert_eq!(line(&lines, &untitled)["title"], Value::Null);
    let inbox = api.call("GET", "/api/v1/inbox", None).await.json();
    assert_eq!(inbox["items"][0]["run_id"], paused.as_str(), "{inbox}");
    assert_eq!(inbox["items"][0]["title"], edge.as_str(), "{inbox}");
    assert_eq!(
        inbox["items"][0]["message"], "Check the numbers first",
        "{inbox}"
    );

    // A retry keeps its source's title.
    let failed = run_id(
        &launch_titled(
            &mut api,
            "throw new Error('no numbers');",
            "Nightly numbers",
        )
        .await,
    );
    wait_for(&mut api, &failed, "failed").await;
    let retried = api
        .call("POST", &format!("/api/v1/workflows/{failed}/retry"), None)
        .await;
    let retry = run_id(&retried);
    let record = api
        .call("GET", &format!("/api/v1/workflows/{retry}"), None)
        .await
        .json();
    assert_eq!(
        (&record["title"], &record["retry_of"]),
        (&json!("Nightly numbers"), &json!(failed)),
        "{record}"
    );
}

both!(a_workflow_whose_agent_waits_for_a_person_is_waiting_for_input_in_get_wait_and_the_list);
async fn a_workflow_whose_agent_waits_for_a_person_is_waiting_for_input_in_get_wait_and_the_list(
    postgres: bool,
) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let asking = run_id(&launch_titled(&mut api, ASKING, "Deploy 1.2").await);
    let pausing = run_id(&launch_titled(&mut api, PAUSING, "Numbers").await);
    wait_for(&mut api, &pausing, "paused").await;

    // `?wait` answers once the agent asks, with the status a person reads.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let record = loop {
        let record = api
            .call("GET", &format!("/api/v1/workflows/{asking}?wait=10s"), None)
            .await;
        assert_eq!(record.status, 200, "{record:?}");
        let record = record.json();
        if record["status"] != "running" {
            break record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never asked: {record}"
        );
    };
    assert_eq!(
        (
            &record["status"],
            &record["stored_status"],
            &record["steps"][0]["status"]
        ),
        (
            &json!("waiting_for_input"),
            &json!("running"),
            &json!("waiting_for_input")
        ),
        "{record}"
    );

    let lines = listed(&mut api, "").await;
    assert_eq!(line(&lines, &asking)["status"], "waiting_for_input");
    assert_eq!(line(&lines, &asking)["stored_status"], "running");
    assert_eq!(line(&lines, &pausing)["status"], "paused");
    let waiting = listed(&mut api, "&status=waiting_for_input").await;
    assert_eq!(
        waiting.iter().map(|w| &w["run_id"]).collect::<Vec<_>>(),
        [&json!(asking)]
    );
    // `running` filters on the stored status, which it still is.
    let running = listed(&mut api, "&status=running").await;
    assert_eq!(line(&running, &asking)["status"], "waiting_for_input");
    assert_refused(
        &api.call("GET", "/api/v1/workflows?status=asking", None)
            .await,
        400,
        "bad_request",
        "recoverable, waiting_for_input",
    );
    // It counts in the inbox as before.
    let inbox = api.call("GET", "/api/v1/inbox", None).await.json();
    let mut kinds: Vec<(String, String)> = inbox["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| (item["kind"].to_string(), item["title"].to_string()))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("\"agent_request\"".to_owned(), "\"Deploy 1.2\"".to_owned()),
            ("\"pause\"".to_owned(), "\"Numbers\"".to_owned())
        ]
    );

    let answered = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{asking}/steps/ask/answer"),
            Some(json!({"decision": "approve"})),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let done = wait_for(&mut api, &asking, "completed").await;
    assert_eq!(done["result"], "approve");
    assert!(
        listed(&mut api, "&status=waiting_for_input")
            .await
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_runs_with_a_title_and_shows_it_and_the_agents_request_readably() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    std::fs::write(home.join("asking.js"), ASKING).expect("script");
    std::fs::write(home.join("pausing.js"), PAUSING).expect("script");
    let init = cli(home, &node, &["init", "--email", ADMIN]);
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));

    let run = cli(
        home,
        &node,
        &[
            "run",
            "asking.js",
            "--title",
            "Deploy 1.2",
            "--wait",
            "--json",
        ],
    );
    assert_eq!(
        code(&run),
        3,
        "waits for a person: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let record = json_of(&run);
    assert_eq!(
        (&record["status"], &record["title"]),
        (&json!("waiting_for_input"), &json!("Deploy 1.2"))
    );
    let asking = record["run_id"].as_str().expect("run_id").to_owned();
    let run = cli(
        home,
        &node,
        &["run", "pausing.js", "--title", "Numbers", "--wait"],
    );
    assert_eq!(code(&run), 3, "{}", String::from_utf8_lossy(&run.stderr));
    let too_long = "t".repeat(201);
    let refused = cli(home, &node, &["run", "pausing.js", "--title", &too_long]);
    assert_eq!(code(&refused), 1);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("(limits.title_chars_max is 200)"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    let list = cli(home, &node, &["list", "--status", "waiting_for_input"]);
    assert_eq!(code(&list), 0);
    let list = String::from_utf8_lossy(&list.stdout);
    let rows: Vec<&str> = list.lines().collect();
    assert!(
        rows.len() == 2 && rows[0].ends_with("TITLE") && rows[1].contains(&asking),
        "{list}"
    );
    assert!(
        rows[1].contains("waiting_for_input") && rows[1].ends_with("Deploy 1.2"),
        "{list}"
    );

    let inbox = cli(home, &node, &["inbox"]);
    assert_eq!(
        code(&inbox),
        0,
        "{}",
        String::from_utf8_lossy(&inbox.stderr)
    );
    let inbox = String::from_utf8_lossy(&inbox.stdout);
    for says in [
        format!("Deploy 1.2 ({asking})"),
        "its agent asks for approval at step ask (attempt 1)".to_owned(),
        "    1. deploy: target prod, version 1.2".to_owned(),
        format!("  answer: reins answer {asking} ask --approve (or --reject)"),
        "Numbers (".to_owned(),
        "  message: Check the numbers first".to_owned(),
    ] {
        assert!(inbox.contains(&says), "{says:?} is not in:\n{inbox}");
    }

    // A decision made again is a repeat, which says who made the one that stands and when.
    std::fs::write(home.join("review.js"), REVIEWED_THEN_PAUSED).expect("script");
    let run = cli(home, &node, &["run", "review.js", "--wait", "--json"]);
    assert_eq!(code(&run), 3, "{}", String::from_utf8_lossy(&run.stderr));
    let reviewed = json_of(&run)["run_id"].as_str().expect("run_id").to_owned();
    let approve = cli(home, &node, &["approve", &reviewed, "--comment", "fine"]);
    assert_eq!(
        code(&approve),
        0,
        "{}",
        String::from_utf8_lossy(&approve.stderr)
    );
    let again = cli(
        home,
        &node,
        &[
            "approve",
            &reviewed,
            "--step",
            "review",
            "--comment",
            "still fine",
            "--json",
        ],
    );
    assert_eq!(
        code(&again),
        0,
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let reply = json_of(&again);
    assert_eq!(
        (&reply["repeated"], &reply["recorded_by"]),
        (&json!(true), &json!(ADMIN))
    );
    let recorded_at = reply["recorded_at"].as_f64().expect("recorded_at");
    let again = cli(home, &node, &["approve", &reviewed, "--step", "review"]);
    assert_eq!(
        code(&again),
        0,
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        said.contains(&format!(
            "{reviewed}: already approved by {ADMIN} at {}; this repeat changes nothing",
            store::rfc3339_utc(recorded_at)
        )),
        "{said}"
    );

    let get = cli(home, &node, &["get", &asking]);
    assert_eq!(code(&get), 0);
    let get = String::from_utf8_lossy(&get.stdout);
    for says in [
        "title          Deploy 1.2".to_owned(),
        "status         waiting_for_input".to_owned(),
        format!(
            "ask: its agent asks for approval: answer with `reins answer {asking} ask --approve`"
        ),
        "  1. deploy: target prod, version 1.2".to_owned(),
    ] {
        assert!(get.contains(&says), "{says:?} is not in:\n{get}");
    }
}
