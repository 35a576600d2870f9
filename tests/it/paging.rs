//! A workflow's record in pages, through the real binary on both backends (issue 29, item 5: one
//! user's reads of a 10,000-step record starved everyone's requests). The record answers with
//! the first page of steps and of artifact versions (`steps_next`, `artifacts_next`);
//! `GET .../steps` and `GET .../artifacts` give the next pages, each bounded by its
//! configuration key (at the bound 200, past it 400, a cursor no page gave 400); walking every
//! page gives each step and version once, in order. A wait and the inbox see an agent's request
//! on any page, and `reins get` follows the pages. Then many reads of a long record by its owner
//! while another user reads and launches: every page within its bound, the other user answered.

use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::{cli, code, json_of};
use crate::harness::both;
use crate::http_api::{ADMIN, Db, Node, PASSWORD, assert_refused, initialize, launch, wait_for};
use crate::http_client::Api;

const STEPS_PAGE: usize = 4;
const ARTIFACTS_PAGE: usize = 3;

fn paged_node(db: &Db) -> Node {
    Node::start(
        db,
        &[
            ("REINS_HTTP__RECORD_STEPS_PAGE_MAX", STEPS_PAGE.to_string()),
            (
                "REINS_HTTP__RECORD_ARTIFACTS_PAGE_MAX",
                ARTIFACTS_PAGE.to_string(),
            ),
        ],
    )
}

async fn get_json(api: &mut Api, path: &str) -> Value {
    let answer = api.call("GET", path, None).await;
    assert_eq!(answer.status, 200, "{path}: {answer:?}");
    answer.json()
}

fn step_ids(steps: &Value) -> Vec<String> {
    steps
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| s["step_id"].as_str().expect("step_id").to_owned())
        .collect()
}

/// Every step of the record, walking its pages from `steps_next`; each page within its bound.
async fn walk_steps(api: &mut Api, run_id: &str, record: &Value) -> Vec<String> {
    let mut steps = step_ids(&record["steps"]);
    let mut next = record["steps_next"].as_str().map(str::to_owned);
    while let Some(after) = next {
        let page = get_json(
            api,
            &format!("/api/v1/workflows/{run_id}/steps?after={after}"),
        )
        .await;
        assert_eq!(page["run_id"], run_id);
        let ids = step_ids(&page["steps"]);
        assert!(ids.len() <= STEPS_PAGE, "a page of {}: {page}", ids.len());
        steps.extend(ids);
        next = page["next"].as_str().map(str::to_owned);
    }
    steps
}

/// Twelve agent steps (twelve artifact versions), a read and a pause among them.
const LONG: &str = r#"
    for (let i = 0; i < 10; i++) {
        await agent({stepId: `s${i}`, agentRef: "scripted", task: {output: i}});
    }
    await readArtifact({artifactVersion: 1});
    const input = await pause({stepId: "hold"});
    for (let i = 10; i < 12; i++) {
        await agent({stepId: `s${i}`, agentRef: "scripted", task: {output: i}});
    }
    return input;
"#;

both!(a_records_steps_and_artifacts_come_in_bounded_pages_each_once_in_order);
async fn a_records_steps_and_artifacts_come_in_bounded_pages_each_once_in_order(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = paged_node(&db);
    let mut api = initialize(&node).await;
    let run_id = launch(&mut api, LONG).await;

    // A wait answers with the first page once the workflow waits at its pause.
    let waited = get_json(&mut api, &format!("/api/v1/workflows/{run_id}?wait=30s")).await;
    assert_eq!(waited["status"], "paused", "{waited}");
    assert_eq!(step_ids(&waited["steps"]), ["s0", "s1", "s2", "s3"]);
    assert_eq!(waited["steps_next"], "3_1");
    assert_eq!(
        waited["checkpoints"][0]["step_id"], "hold",
        "the checkpoints are whole: {waited}"
    );
    let fingerprint = waited["fingerprint"].as_str().expect("fingerprint");
    let resumed = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/resume"),
            Some(
                json!({"fingerprint": fingerprint, "step_id": "hold", "attempt": 1, "input": "go"}),
            ),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let record = wait_for(&mut api, &run_id, "completed").await;

    let expected: Vec<String> = (0..10)
        .map(|i| format!("s{i}"))
        .chain(["read:10".to_owned()])
        .chain((10..12).map(|i| format!("s{i}")))
        .collect();
    assert_eq!(
        walk_steps(&mut api, &run_id, &record).await,
        expected,
        "every step once, in the order the script made them"
    );
    assert_eq!(
        record["artifacts"].as_array().map(Vec::len),
        Some(ARTIFACTS_PAGE)
    );
    let mut versions: Vec<i64> = record["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .map(|a| a["version"].as_i64().expect("version"))
        .collect();
    let mut next = record["artifacts_next"].as_i64();
    while let Some(after) = next {
        let page = get_json(
            &mut api,
            &format!("/api/v1/workflows/{run_id}/artifacts?after={after}"),
        )
        .await;
        let page_versions = page["artifacts"].as_array().expect("artifacts");
        assert!(page_versions.len() <= ARTIFACTS_PAGE, "{page}");
        versions.extend(
            page_versions
                .iter()
                .map(|a| a["version"].as_i64().expect("v")),
        );
        next = page["next"].as_i64();
    }
    assert_eq!(versions, (1..=12).collect::<Vec<_>>());

    // The bounds at their edge, and cursors no page gave.
    let steps = format!("/api/v1/workflows/{run_id}/steps");
    let at_bound = get_json(&mut api, &format!("{steps}?limit={STEPS_PAGE}")).await;
    assert_eq!(step_ids(&at_bound["steps"]), ["s0", "s1", "s2", "s3"]);
    let one = get_json(&mut api, &format!("{steps}?limit=1&after=3_1")).await;
    assert_eq!(
        (step_ids(&one["steps"]), &one["next"]),
        (vec!["s4".to_owned()], &json!("4_1"))
    );
    for bad in [format!("{}", STEPS_PAGE + 1), "0".into(), "many".into()] {
        let over = api.call("GET", &format!("{steps}?limit={bad}"), None).await;
        assert_refused(&over, 400, "bad_request", "http.record_steps_page_max");
    }
    for bad in [
        "nonsense",
        "3",
        "3_",
        "_1",
        "-1_1",
        "3_1_1",
        "99999999999_1",
    ] {
        let refused = api.call("GET", &format!("{steps}?after={bad}"), None).await;
        assert_refused(&refused, 400, "bad_request", "`after`");
    }
    let artifacts = format!("/api/v1/workflows/{run_id}/artifacts");
    let full = get_json(
        &mut api,
        &format!("{artifacts}?limit={ARTIFACTS_PAGE}&after=9"),
    )
    .await;
    assert_eq!(
        (full["artifacts"].as_array().map(Vec::len), &full["next"]),
        (Some(3), &Value::Null)
    );
    let over = api
        .call(
            "GET",
            &format!("{artifacts}?limit={}", ARTIFACTS_PAGE + 1),
            None,
        )
        .await;
    assert_refused(&over, 400, "bad_request", "http.record_artifacts_page_max");
    for bad in ["-1", "v2", "1.5"] {
        let refused = api
            .call("GET", &format!("{artifacts}?after={bad}"), None)
            .await;
        assert_refused(&refused, 400, "bad_request", "`after`");
    }

    // The compatible `get` answers the same first page; another user finds nothing.
    let compat = api.action("get", json!({"run_id": run_id})).await.json();
    assert_eq!(
        (step_ids(&compat["steps"]), &compat["steps_next"]),
        (step_ids(&record["steps"]), &json!("3_1"))
    );
    crate::users::create(&mut api, "bob@example.com", None).await;
    let mut bob = crate::users::signed_in(&node, "bob@example.com", PASSWORD).await;
    for path in [&steps, &artifacts] {
        assert_refused(
            &bob.call("GET", path, None).await,
            404,
            "not_found",
            &run_id,
        );
    }

    // `reins get` follows the pages: every step and version, and no cursor left.
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let login = cli(home, &node, &["login", "--email", ADMIN]);
    assert_eq!(
        code(&login),
        0,
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let got = cli(home, &node, &["--json", "get", &run_id]);
    assert_eq!(code(&got), 0, "{}", String::from_utf8_lossy(&got.stderr));
    let whole = json_of(&got);
    assert_eq!(step_ids(&whole["steps"]), expected);
    assert_eq!(whole["artifacts"].as_array().map(Vec::len), Some(12));
    assert_eq!(
        (&whole["steps_next"], &whole["artifacts_next"]),
        (&Value::Null, &Value::Null)
    );
    let table = cli(home, &node, &["get", &run_id]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("s11") && table.contains("read:10"),
        "{table}"
    );
}

/// Five agent steps, then one that asks a person: its step is on the third page of two.
const ASKS_LATE: &str = r#"
    for (let i = 0; i < 5; i++) {
        await agent({stepId: `s${i}`, agentRef: "scripted", task: {output: i}});
    }
    const r = await agent({stepId: "ask", agentRef: "scripted", task: {
        ask_approval: {request_id: "late-1", actions: [{tool: "deploy"}]}}});
    return r.approval.answer.decision;
"#;

both!(a_request_on_a_later_page_ends_a_wait_and_is_in_the_inbox);
async fn a_request_on_a_later_page_ends_a_wait_and_is_in_the_inbox(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[("REINS_HTTP__RECORD_STEPS_PAGE_MAX", "2".to_owned())],
    );
    let mut api = initialize(&node).await;
    let run_id = launch(&mut api, ASKS_LATE).await;

    // The wait ends once the agent asks, though the first page shows none of it. (Without
    // that, it would wait out all of its 60 s.)
    let path = format!("/api/v1/workflows/{run_id}?wait=60s");
    let waited = tokio::time::timeout(Duration::from_secs(30), api.call("GET", &path, None))
        .await
        .expect("the wait ended when the agent asked");
    assert_eq!(waited.status, 200, "{waited:?}");
    let waited = waited.json();
    // Its status says so too, though its first page shows none of it (issue 32).
    assert_eq!(
        (&waited["status"], &waited["stored_status"]),
        (&json!("waiting_for_input"), &json!("running")),
        "{waited}"
    );
    assert_eq!(step_ids(&waited["steps"]), ["s0", "s1"]);
    assert!(waited["steps_next"].is_string(), "{waited}");

    let inbox = get_json(&mut api, "/api/v1/inbox").await;
    let items = inbox["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{inbox}");
    assert_eq!(
        (
            &items[0]["kind"],
            &items[0]["step_id"],
            &items[0]["approval"]["request_id"]
        ),
        (&json!("agent_request"), &json!("ask"), &json!("late-1"))
    );

    // `reins get --wait` reads every page, finds the request, and exits 3 (a person's turn).
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let login = cli(home, &node, &["login", "--email", ADMIN]);
    assert_eq!(
        code(&login),
        0,
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let got = cli(home, &node, &["--json", "get", "--wait", &run_id]);
    assert_eq!(code(&got), 3, "{}", String::from_utf8_lossy(&got.stderr));
    let whole = json_of(&got);
    let asked = whole["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find(|s| s["step_id"] == "ask")
        .expect("the last page's step");
    assert_eq!(asked["status"], "waiting_for_input", "{whole}");

    let answered = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/steps/ask/answer"),
            Some(json!({"decision": "approve"})),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let done = wait_for(&mut api, &run_id, "completed").await;
    assert_eq!(done["result"], "approve");
}

/// Steps at once (the cluster's slots allow 32), each with an output of some size.
const MANY: &str = r#"
    const pad = "x".repeat(1000);
    for (let round = 0; round < 8; round++) {
        await parallel(Array.from({length: 32}, (_, i) => () =>
            agent({stepId: `r${round}-${i}`, agentRef: "scripted", task: {output: {i, pad}}})));
    }
    return "done";
"#;

both!(one_users_reads_of_a_long_record_never_hold_up_another_users_get_and_launch);
/// Issue 29, item 5 at a smaller scale: a long record (256 steps of some 1 KB each) read by its
/// owner 200 times at once, on every page, while another user reads their own workflow and
/// launches one. The owner's reads are answered (or told to come back: 429, never 5xx) with at
/// most a page's steps each; the other user's requests are answered 200 and 201.
async fn one_users_reads_of_a_long_record_never_hold_up_another_users_get_and_launch(
    postgres: bool,
) {
    const PAGE: usize = 50;
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[("REINS_HTTP__RECORD_STEPS_PAGE_MAX", PAGE.to_string())],
    );
    let mut owner = initialize(&node).await;
    let run_id = launch(&mut owner, MANY).await;
    let record = wait_for(&mut owner, &run_id, "completed").await;
    let all = walk_pages(&mut owner, &run_id, &record, PAGE).await;
    assert_eq!(all, 256);

    crate::users::create(&mut owner, "bob@example.com", None).await;
    let mut bob = crate::users::signed_in(&node, "bob@example.com", PASSWORD).await;
    let bobs = launch(&mut bob, "return 1;").await;
    wait_for(&mut bob, &bobs, "completed").await;

    // The record, and the position before each further page (call `seq` is the step's place).
    let cursors: Vec<Option<String>> = std::iter::once(None)
        .chain((1..=256 / PAGE).map(|page| Some(format!("{}_1", page * PAGE - 1))))
        .collect();
    let readers: Vec<_> = (0..200)
        .map(|n| {
            let mut api = owner.clone();
            let path = match &cursors[n % cursors.len()] {
                None => format!("/api/v1/workflows/{run_id}"),
                Some(after) => format!("/api/v1/workflows/{run_id}/steps?after={after}"),
            };
            tokio::spawn(async move {
                let answer = api.call("GET", &path, None).await;
                (answer.status, answer.json())
            })
        })
        .collect();

    // Meanwhile the other user reads and launches: answered, not 503.
    let theirs = tokio::time::timeout(Duration::from_secs(60), async {
        let read = bob
            .call("GET", &format!("/api/v1/workflows/{bobs}"), None)
            .await;
        let launched = bob
            .call(
                "POST",
                "/api/v1/workflows",
                Some(json!({"script": "return 2;"})),
            )
            .await;
        (read.status, launched.status)
    })
    .await
    .expect("the other user was answered");
    assert_eq!(theirs, (200, 201));

    let mut answered = 0;
    for reader in readers {
        let (status, body) = reader.await.expect("reader");
        assert!(status == 200 || status == 429, "{status}: {body}");
        if status == 200 {
            answered += 1;
            let steps = body["steps"].as_array().expect("steps").len();
            assert!(steps <= PAGE, "a page held {steps} steps");
        } else {
            assert_eq!(body["error"]["code"], "reads_busy", "{body}");
        }
    }
    assert!(answered > 0);
}

/// How many steps the record's pages hold in all, each page within `page`.
async fn walk_pages(api: &mut Api, run_id: &str, record: &Value, page: usize) -> usize {
    let mut count = record["steps"].as_array().expect("steps").len();
    assert!(count <= page);
    let mut next = record["steps_next"].as_str().map(str::to_owned);
    while let Some(after) = next {
        let current = get_json(
            api,
            &format!("/api/v1/workflows/{run_id}/steps?after={after}"),
        )
        .await;
        let steps = current["steps"].as_array().expect("steps").len();
        assert!(steps <= page, "{steps}");
        count += steps;
        next = current["next"].as_str().map(str::to_owned);
    }
    count
}
