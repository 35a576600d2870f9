//! What a waiting workflow waits for (issue 40, item 1), where people meet it: the record's and
//! the listing's `waiting_for` and the listing's `?waiting_for=` filter, the CLI's `list`, `get`
//! and `watch`, and the console's list and workflow page with its "Send event" form. A workflow
//! that sleeps stays `running`; what it waits for is said beside its status.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cli::{cli, code};
use crate::console::{WAIT, sign_in, url};
use crate::harness::{both, reins_command};
use crate::http_api::{ADMIN, Db, Node, PASSWORD, initialize, launch, wait_for};
use crate::http_client::Api;
use crate::webdriver::Browser;

const SLEEPS: &str = r#"await sleep({stepId: "nap", ms: 3600000}); return "rested";"#;
const WAITS_FOR_PAYMENT: &str = r#"
    return await waitForEvent({stepId: "paid", name: "payment.received", timeoutMs: 86400000});
"#;
const PAUSES: &str = r#"return await pause({stepId: "ok", message: "go on?"});"#;
/// Fails its first attempt, and waits ten minutes before the second (longer than the test).
const RETRIES: &str = r#"
    await agent({stepId: "flaky", agentRef: "scripted", task: {fail: "x"},
                 retry: {maxAttempts: 3, initialIntervalMs: 600000}});
"#;
/// With one slot on the node, this agent holds it for ten minutes while `NO_SLOT` waits.
const HOLDS_THE_SLOT: &str =
    r#"await agent({stepId: "long", agentRef: "scripted", task: {sleep_ms: 600000}});"#;
const NO_SLOT: &str = r#"await agent({stepId: "next", agentRef: "scripted", task: "hi"});"#;

/// Polls `get` until the workflow waits for something of `kind`; returns its record.
async fn waits_for(api: &mut Api, run_id: &str, kind: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let record = api
            .call("GET", &format!("/api/v1/workflows/{run_id}"), None)
            .await;
        assert_eq!(record.status, 200, "{record:?}");
        let record = record.json();
        let waiting = record["waiting_for"].as_array().into_iter().flatten();
        if waiting.clone().any(|wait| wait["kind"] == kind) {
            return record;
        }
        assert!(
            Instant::now() < deadline,
            "{run_id} never waited for {kind}: {record}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The journal entry `step_id` at `attempt` of a record's steps.
fn step<'a>(record: &'a Value, step_id: &str, attempt: i64) -> &'a Value {
    record["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|step| step["step_id"] == step_id && step["attempt"] == attempt)
        .unwrap_or_else(|| panic!("no {step_id} attempt {attempt}: {record}"))
}

/// The run ids a listing filtered to `kind` holds.
async fn listed_waiting_for(api: &mut Api, kind: &str) -> Vec<String> {
    let page = api
        .call(
            "GET",
            &format!("/api/v1/workflows?waiting_for={kind}&limit=50"),
            None,
        )
        .await;
    assert_eq!(page.status, 200, "{page:?}");
    let mut ids: Vec<String> = page.json()["workflows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| w["run_id"].as_str().expect("run_id").to_owned())
        .collect();
    ids.sort();
    ids
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Each kind of wait: the record says it beside the unchanged status, the listing says the
/// same, its filter finds each kind alone, and the CLI's `list` and `get` say it in words.
async fn each_wait_is_said_in_the_record_the_listing_and_the_cli(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_LIMITS__MAX_ACTIVE_CHILDREN", "1".to_owned()),
            ("REINS_LIMITS__ACTIVE_CHILDREN_RESERVED", "0".to_owned()),
        ],
    );
    let mut api = initialize(&node).await;
    // The retry first: its attempt needs the slot the last workflow takes for good.
    let retrying = launch(&mut api, RETRIES).await;
    let record = waits_for(&mut api, &retrying, "retry").await;
    let due = step(&record, "flaky", 2)["retry"]["due_at"].clone();
    assert_eq!(
        record["waiting_for"],
        json!([{"kind": "retry", "step_id": "flaky", "at": due, "attempt": 2,
                "max_attempts": 3}]),
        "{record}"
    );
    assert_eq!(record["status"], "running");
    let sleeping = launch(&mut api, SLEEPS).await;
    let paying = launch(&mut api, WAITS_FOR_PAYMENT).await;
    let pausing = launch(&mut api, PAUSES).await;
    let holding = launch(&mut api, HOLDS_THE_SLOT).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while api
        .call("GET", &format!("/api/v1/workflows/{holding}"), None)
        .await
        .json()["steps"][0]["status"]
        != "running"
    {
        assert!(Instant::now() < deadline, "{holding} never took the slot");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let queued = launch(&mut api, NO_SLOT).await;
    let finished = launch(&mut api, "return 1;").await;

    let record = waits_for(&mut api, &sleeping, "sleep").await;
    let wakes_at = step(&record, "nap", 1)["wakes_at"].clone();
    assert!(wakes_at.as_f64().is_some(), "{record}");
    assert_eq!(
        (&record["status"], &record["waiting_for"]),
        (
            &json!("running"),
            &json!([{"kind": "sleep", "step_id": "nap", "until": wakes_at}])
        ),
        "a sleeping workflow is running, and says until when it sleeps"
    );
    let record = waits_for(&mut api, &paying, "event").await;
    let deadline = step(&record, "paid", 1)["deadline_at"].clone();
    assert!(deadline.as_f64().is_some(), "{record}");
    assert_eq!(
        record["waiting_for"],
        json!([{"kind": "event", "step_id": "paid", "name": "payment.received",
                "deadline": deadline}])
    );
    let record = waits_for(&mut api, &pausing, "person").await;
    assert_eq!(
        (&record["status"], &record["waiting_for"]),
        (
            &json!("paused"),
            &json!([{"kind": "person", "step_id": "ok", "call": "pause", "deadline": null}])
        )
    );
    let record = waits_for(&mut api, &queued, "slot").await;
    assert_eq!(
        record["waiting_for"],
        json!([{"kind": "slot", "step_id": "next", "attempt": 1}])
    );
    let record = wait_for(&mut api, &finished, "completed").await;
    assert_eq!(
        record["waiting_for"],
        json!([]),
        "an ended workflow waits for nothing"
    );

    // The listing says what `get` says, row by row.
    let page = api
        .call("GET", "/api/v1/workflows?limit=50", None)
        .await
        .json();
    for row in page["workflows"].as_array().expect("workflows") {
        let id = row["run_id"].as_str().expect("run_id");
        let record = api
            .call("GET", &format!("/api/v1/workflows/{id}"), None)
            .await
            .json();
        assert_eq!(row["waiting_for"], record["waiting_for"], "{id}: {row}");
    }
    // Its filter finds each kind alone.
    for (kind, id) in [
        ("sleep", &sleeping),
        ("event", &paying),
        ("person", &pausing),
        ("slot", &queued),
        ("retry", &retrying),
    ] {
        assert_eq!(
            listed_waiting_for(&mut api, kind).await,
            vec![id.clone()],
            "{kind}"
        );
    }
    let refused = api
        .call("GET", "/api/v1/workflows?waiting_for=nap", None)
        .await;
    crate::http_api::assert_refused(
        &refused,
        400,
        "bad_request",
        "query `waiting_for` \"nap\" is not one of sleep, event, person, slot, retry",
    );

    // The CLI says it in words.
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let login = cli(home, &node, &["login", "--email", ADMIN]);
    assert_eq!(
        code(&login),
        0,
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let table = stdout(&cli(home, &node, &["list"]));
    let line = |id: &str| {
        table
            .lines()
            .find(|line| line.starts_with(id))
            .unwrap_or_else(|| panic!("{id} not listed: {table}"))
            .to_owned()
    };
    assert!(
        table.starts_with("RUN ID") && table.contains("WAITING FOR"),
        "{table}"
    );
    let sleeps = line(&sleeping);
    assert!(
        sleeps.contains(" running ")
            && sleeps.contains("sleeping until ")
            && sleeps.contains(" UTC (in "),
        "{sleeps}"
    );
    assert!(
        line(&paying).contains("waiting for event payment.received (deadline in "),
        "{table}"
    );
    assert!(line(&pausing).contains("waiting for a person"), "{table}");
    assert!(line(&queued).contains("waiting for a slot"), "{table}");
    let retries = line(&retrying);
    assert!(
        retries.contains("retrying at ") && retries.contains(" UTC (attempt 2 of 3)"),
        "{retries}"
    );
    let filtered = stdout(&cli(home, &node, &["list", "--waiting-for", "event"]));
    assert!(
        filtered.contains(&paying) && !filtered.contains(&sleeping),
        "{filtered}"
    );
    let got = stdout(&cli(home, &node, &["get", &sleeping]));
    assert!(
        got.lines()
            .any(|line| line.starts_with("waiting        nap: sleeping until ")),
        "{got}"
    );
    let got = stdout(&cli(home, &node, &["get", &retrying]));
    assert!(
        got.lines().any(
            |line| line.starts_with("waiting        flaky: retrying at ")
                && line.ends_with("(attempt 2 of 3)")
        ),
        "{got}"
    );
}

both!(each_wait_is_said_in_the_record_the_listing_and_the_cli);

/// `reins watch` says what a step that begins to wait waits for, and ends when the event it
/// waits for comes (sent once the watch said it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_says_what_a_step_waits_for() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let paying = launch(&mut api, WAITS_FOR_PAYMENT).await;
    waits_for(&mut api, &paying, "event").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let login = cli(home, &node, &["login", "--email", ADMIN]);
    assert_eq!(
        code(&login),
        0,
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let credentials = home.join("credentials.json").display().to_string();
    let mut watch = reins_command(
        home,
        &[
            ("REINS_CLI_CREDENTIALS", credentials),
            ("REINS_CLI_PASSWORD", PASSWORD.to_owned()),
            ("REINS_CLI_URL", format!("http://{}", node.addr)),
        ],
    )
    .args(["watch", &paying])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("run reins watch");
    let out = watch.stdout.take().expect("stdout");
    let (lines, printed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let said = "     paid: waiting for event payment.received (deadline in ";
    let mut seen = Vec::new();
    while !seen.iter().any(|line: &String| line.starts_with(said)) {
        match printed.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => seen.push(line),
            Err(error) => panic!("watch never said what paid waits for ({error}): {seen:?}"),
        }
    }
    let sent = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{paying}/events"),
            Some(json!({"name": "payment.received", "event_id": "pay-1", "payload": 3})),
        )
        .await;
    assert_eq!(sent.status, 200, "{sent:?}");
    let status = tokio::task::spawn_blocking(move || watch.wait())
        .await
        .expect("watch task")
        .expect("watch ends");
    seen.extend(printed.iter());
    assert_eq!(status.code(), Some(0), "ends with the workflow: {seen:?}");
    assert!(
        seen.iter()
            .any(|line| line.contains("status status=completed")),
        "{seen:?}"
    );
}

/// The console's list and workflow page say what a sleeping workflow and one waiting for an
/// event wait for; the event is sent from the page's "Send event" form (a payload that is not
/// JSON is refused before anything is sent), and the workflow completes with its payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_says_what_a_workflow_waits_for_and_sends_its_event() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let sleeping = launch(&mut api, SLEEPS).await;
    let paying = launch(&mut api, WAITS_FOR_PAYMENT).await;
    waits_for(&mut api, &sleeping, "sleep").await;
    waits_for(&mut api, &paying, "event").await;
    let browser = Browser::start("waiting", 1280, 900);
    sign_in(&browser, &node, ADMIN);

    browser.goto(&url(&node, "#/workflows"));
    let row = |id: &str| format!("tr[data-run='{id}'] .waiting-for li");
    let sleeps = browser.find(&row(&sleeping), WAIT).text();
    assert!(
        sleeps.starts_with("sleeping until ") && sleeps.contains("(in "),
        "{sleeps}"
    );
    let pays = browser.find(&row(&paying), WAIT).text();
    assert!(
        pays.starts_with("waiting for event payment.received (deadline in "),
        "{pays}"
    );
    browser.screenshot("01-workflows-waiting");
    // Filtered to the workflows that wait for an event.
    browser.run(
        "const s = document.querySelector('select[name=waiting_for]'); s.value = 'event'; \
         s.dispatchEvent(new Event('change'));",
        json!([]),
    );
    browser.wait_until(
        "only the workflow waiting for an event listed",
        &format!(
            "const rows = document.querySelectorAll('tbody tr'); \
             return rows.length === 1 && rows[0].dataset.run === '{paying}';"
        ),
        WAIT,
    );

    browser.goto(&url(&node, &format!("#/workflows/{sleeping}")));
    let said = browser
        .find("#waiting-for li[data-wait=sleep]", WAIT)
        .text();
    assert!(said.starts_with("sleeping until "), "{said}");
    assert!(
        browser.all("#send-event").is_empty(),
        "nothing to send to a sleeping workflow"
    );
    browser.screenshot("02-workflow-sleeping");

    browser.goto(&url(&node, &format!("#/workflows/{paying}")));
    let said = browser
        .find("#waiting-for li[data-wait=event]", WAIT)
        .text();
    assert!(
        said.starts_with("waiting for event payment.received"),
        "{said}"
    );
    browser.find("#send-event input[name=name]", WAIT);
    assert_eq!(
        browser.run(
            "return document.querySelector('#send-event input[name=name]').value;",
            json!([])
        ),
        "payment.received",
        "the form names the event it waits for"
    );
    browser
        .find("#send-event textarea[name=payload]", WAIT)
        .type_text("{amount: 3}");
    let id = browser.find("#send-event input[name=event_id]", WAIT);
    id.clear();
    id.type_text("pay-1");
    browser.click_on("#send-event button[data-action=send-event]", WAIT);
    browser.wait_for_text("the payload is not JSON", WAIT);
    let payload = browser.find("#send-event textarea[name=payload]", WAIT);
    payload.clear();
    payload.type_text(r#"{"amount": 3, "note": "<b id=\"pwned-b\">paid</b>"}"#);
    browser.screenshot("03-send-event-form");
    browser.click_on("#send-event button[data-action=send-event]", WAIT);
    let record = wait_for(&mut api, &paying, "completed").await;
    assert_eq!(
        record["result"],
        json!({"amount": 3, "note": "<b id=\"pwned-b\">paid</b>"})
    );
    browser.wait_until(
        "the page turning completed",
        "return document.querySelector('#workflow-status').textContent === 'completed';",
        WAIT,
    );
    assert!(browser.all("#send-event").is_empty() && browser.all("#pwned-b").is_empty());
    browser.screenshot("04-event-sent-completed");
}
