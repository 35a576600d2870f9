//! `GET /api/v1/workflows` and `reins list` through the real binary, on both backends: newest
//! first, paged by a position (`next`, passed back as `after`) so that a walk over every page
//! sees each workflow once even while workflows are launched and deleted meanwhile; the page
//! size bounded by `http.page_size_max`; and `?status=recoverable` meaning what `get` shows.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::cli::{cli, code};
use crate::harness::both;
use crate::http_api::{Db, Node, assert_refused, initialize, launch, wait_for};
use crate::http_client::Api;

const PAGE: usize = 5;

async fn page(api: &mut Api, query: &str) -> Value {
    let answer = api
        .call("GET", &format!("/api/v1/workflows?{query}"), None)
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()
}

fn ids(page: &Value) -> Vec<String> {
    page["workflows"]
        .as_array()
        .expect("workflows")
        .iter()
        .map(|w| w["run_id"].as_str().expect("run_id").to_owned())
        .collect()
}

both!(a_walk_over_every_page_sees_each_workflow_once_newest_first);
async fn a_walk_over_every_page_sees_each_workflow_once_newest_first(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[("REINS_HTTP__PAGE_SIZE_MAX", PAGE.to_string())]);
    let mut api = initialize(&node).await;
    let mut launched = Vec::new();
    for _ in 0..(2 * PAGE + 2) {
        launched.push(launch(&mut api, "return 1;").await);
    }

    // The limit at its edge.
    assert_eq!(
        ids(&page(&mut api, &format!("limit={PAGE}")).await).len(),
        PAGE
    );
    let over = api
        .call(
            "GET",
            &format!("/api/v1/workflows?limit={}", PAGE + 1),
            None,
        )
        .await;
    assert_refused(&over, 400, "bad_request", "http.page_size_max");
    let garbage = api
        .call("GET", "/api/v1/workflows?after=nonsense", None)
        .await;
    assert_refused(&garbage, 400, "bad_request", "`after`");

    // Walk every page; meanwhile launch a newer workflow and delete the last one seen.
    let mut walked: Vec<Value> = Vec::new();
    let mut query = format!("limit={PAGE}");
    let mut pages = 0;
    let mut newer = None;
    loop {
        let current = page(&mut api, &query).await;
        pages += 1;
        walked.extend(current["workflows"].as_array().expect("workflows").clone());
        assert_eq!(current["next"], current["next_after"]);
        let Some(next) = current["next"].as_str() else {
            break;
        };
        if pages == 1 {
            newer = Some(launch(&mut api, "return 2;").await);
            let last = walked.last().expect("a line")["run_id"]
                .as_str()
                .expect("id")
                .to_owned();
            wait_for(&mut api, &last, "completed").await;
            let deleted = api
                .call("DELETE", &format!("/api/v1/workflows/{last}"), None)
                .await;
            assert_eq!(deleted.status, 200, "{deleted:?}");
        }
        query = format!("limit={PAGE}&after={next}");
    }
    assert_eq!(pages, 3, "{walked:?}");
    let seen: Vec<String> = walked
        .iter()
        .map(|w| w["run_id"].as_str().expect("id").to_owned())
        .collect();
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "nothing twice: {seen:?}");
    let mut expected = launched.clone();
    expected.sort();
    let mut got = seen.clone();
    got.sort();
    assert_eq!(
        got, expected,
        "nothing missed, and nothing launched after the walk began"
    );
    let newer = newer.expect("launched during the walk");
    assert!(!seen.contains(&newer));
    // Newest first: (created_at, id) descending.
    let keys: Vec<(f64, String)> = walked
        .iter()
        .map(|w| {
            (
                w["created_at"].as_f64().expect("created_at"),
                w["run_id"].as_str().expect("id").to_owned(),
            )
        })
        .collect();
    for pair in keys.windows(2) {
        assert!(
            pair[0].0 > pair[1].0 || (pair[0].0 == pair[1].0 && pair[0].1 > pair[1].1),
            "not newest first: {pair:?}"
        );
    }
    assert_eq!(ids(&page(&mut api, "limit=1").await), vec![newer.clone()]);

    // The command line: a table, then a `more:` line that gives the next page.
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let login = cli(home, &node, &["login", "--email", crate::http_api::ADMIN]);
    assert_eq!(
        code(&login),
        0,
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let mut args: Vec<String> = vec!["list".into(), "--limit".into(), PAGE.to_string()];
    let mut listed = Vec::new();
    loop {
        let output = cli(
            home,
            &node,
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert_eq!(
            code(&output),
            0,
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        listed.extend(
            text.lines()
                .skip(1)
                .filter(|line| !line.starts_with("more:"))
                .filter_map(|line| line.split_whitespace().next().map(str::to_owned)),
        );
        let Some(more) = text
            .lines()
            .find_map(|line| line.strip_prefix("more: reins "))
        else {
            break;
        };
        args = more.split_whitespace().map(str::to_owned).collect();
    }
    assert_eq!(listed.len(), 2 * PAGE + 2, "{listed:?}");
    assert_eq!(listed[0], newer);
}

both!(the_recoverable_filter_finds_what_get_calls_recoverable);
async fn the_recoverable_filter_finds_what_get_calls_recoverable(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let script = "await pause({stepId: 'p'}); return 1;";
    let kept = launch(&mut api, script).await;
    let fenced = launch(&mut api, script).await;
    wait_for(&mut api, &kept, "paused").await;
    wait_for(&mut api, &fenced, "paused").await;
    crate::operators::admin_json(&node.admin_socket(), &["fence", &fenced]);
    let record = wait_for(&mut api, &fenced, "recoverable").await;
    assert_eq!(record["stored_status"], "paused");

    let recoverable = page(&mut api, "status=recoverable").await;
    assert_eq!(ids(&recoverable), vec![fenced.clone()]);
    let line = &recoverable["workflows"][0];
    assert_eq!(
        (
            &line["status"],
            &line["stored_status"],
            &line["recoverable"]
        ),
        (&json!("recoverable"), &json!("paused"), &json!(true))
    );
    // A stored status keeps filtering by what is stored; each line says what `get` would.
    let paused = page(&mut api, "status=paused").await;
    let mut both = ids(&paused);
    both.sort();
    let mut expected = vec![kept.clone(), fenced.clone()];
    expected.sort();
    assert_eq!(both, expected);
    for line in paused["workflows"].as_array().expect("workflows") {
        let shown = if line["run_id"] == fenced.as_str() {
            "recoverable"
        } else {
            "paused"
        };
        assert_eq!(line["status"], shown, "{line}");
    }
    let unknown = api
        .call("GET", "/api/v1/workflows?status=asleep", None)
        .await;
    assert_refused(&unknown, 400, "bad_request", "recoverable");

    // Recovered, it is no longer listed as recoverable.
    let recovered = api
        .call("POST", &format!("/api/v1/workflows/{fenced}/recover"), None)
        .await;
    assert_eq!(recovered.status, 200, "{recovered:?}");
    wait_for(&mut api, &fenced, "paused").await;
    assert_eq!(
        ids(&page(&mut api, "status=recoverable").await),
        Vec::<String>::new()
    );
}
