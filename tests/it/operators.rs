//! What operators have: the admin socket (every command against a real node with workflows
//! running, paused and parked), its exclusivity and mode, `/metrics` as Prometheus text whose
//! counters move, and logs and metrics that a replay after a restart does not repeat.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{ReinsProcess, free_port, reins_command};
use crate::http_api::{Db, Node, initialize, launch, wait_for};
use crate::http_client::Api;

pub fn admin(socket: &Path, args: &[&str]) -> Output {
    let dir = socket.parent().expect("socket folder");
    reins_command(dir, &[])
        .arg("admin")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run reins admin")
}

pub fn admin_json(socket: &Path, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let output = admin(socket, &all);
    assert!(
        output.status.success(),
        "reins admin {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

fn count(counts: &Value, status: &str) -> i64 {
    counts
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["status"] == status)
        .and_then(|c| c["count"].as_i64())
        .unwrap_or(0)
}

/// The names in the actor tree; every actor must report its queue and restarts.
fn names(actor: &Value, out: &mut Vec<String>) {
    out.push(actor["name"].as_str().unwrap_or_default().to_owned());
    assert!(
        actor["queue"]["waiting"].is_u64() && actor["queue"]["running"].is_u64(),
        "{actor}"
    );
    assert_eq!(actor["restarts"], 0, "{actor}");
    for child in actor["children"].as_array().into_iter().flatten() {
        names(child, out);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_admin_command_answers_about_running_paused_and_parked_workflows() {
    let db = Db::new(false).await;
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_model"), b"").expect("hold");
    let node = Node::start(
        &db,
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let socket = node.admin_socket();
    let mut api = initialize(&node).await;
    let running = launch(&mut api, "return await agent({stepId: 'held', agentRef: 'scripted', task: {hold_while: 'hold_model'}});").await;
    let paused = launch(&mut api, "await pause({stepId: 'p'}); return 1;").await;
    let parked = launch(&mut api, "const a = await agent({stepId: 'a', agentRef: 'scripted', task: 'x'}); \
        await humanCheckpoint({stepId: 'review', sourceStepId: 'a', artifactVersion: a.artifactVersion}); return 2;").await;
    wait_for(&mut api, &paused, "paused").await;
    wait_for(&mut api, &parked, "waiting_approval").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while api.action("get", json!({"run_id": running})).await.json()["steps"][0]["status"]
        != "running"
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the held child never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let status = admin_json(&socket, &["status"]);
    assert!(
        status["worker_id"].as_str().is_some_and(|w| !w.is_empty()),
        "{status}"
    );
    assert_eq!(status["backend"], "sqlite");
    assert!(status["runtime_version"].is_string() && status["configuration_version"].is_string());
    assert_eq!(status["draining"], false);
    for (state, expected) in [("running", 1), ("paused", 1), ("waiting_approval", 1)] {
        assert_eq!(
            count(&status["workflows"], state),
            expected,
            "{state}: {status}"
        );
    }
    assert_eq!(count(&status["child_runs"], "running"), 1, "{status}");
    let human = admin(&socket, &["status"]);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("worker_id"),
        "{human:?}"
    );

    let workflows = admin_json(&socket, &["workflows"]);
    let owned: BTreeMap<String, Value> = workflows
        .as_array()
        .expect("a list")
        .iter()
        .map(|w| {
            (
                w["run_id"].as_str().unwrap_or_default().to_owned(),
                w.clone(),
            )
        })
        .collect();
    for id in [&running, &paused, &parked] {
        let workflow = owned
            .get(id.as_str())
            .unwrap_or_else(|| panic!("{id} missing: {workflows}"));
        assert_eq!(workflow["epoch"], 1);
        assert!(
            workflow["lease_remaining_ms"]
                .as_u64()
                .is_some_and(|ms| ms > 0),
            "{workflow}"
        );
    }
    assert_eq!(owned[&paused]["status"], "paused");

    let leases = admin_json(&socket, &["leases"]);
    let kinds: Vec<&str> = leases
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|l| l["kind"].as_str())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "workflow").count(),
        3,
        "{leases}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "run").count(),
        1,
        "the held child's lease: {leases}"
    );

    let slots = admin_json(&socket, &["slots"]);
    assert_eq!(slots["held"], 1, "{slots}");
    assert_eq!(slots["slots"][0]["workflow_id"], json!(running));
    assert_eq!(slots["max_active_children"], 32);

    let actors = admin_json(&socket, &["actors"]);
    let mut all = Vec::new();
    names(&actors, &mut all);
    assert!(all[0].starts_with("node@"), "{all:?}");
    for part in ["store@", "lease@", "child-runs@", "workflows@"] {
        assert!(
            all.iter().any(|n| n.starts_with(part)),
            "{part} missing: {all:?}"
        );
    }

    let config = admin_json(&socket, &["config"]);
    assert_eq!(config["secret"], "<redacted>");
    assert_eq!(config["lease_seconds"], 30);
    assert!(
        !config.to_string().contains(crate::http_api::SECRET),
        "the secret leaked"
    );

    // fence: the paused workflow's lease is given up now; another recover takes it (epoch 2).
    let fenced = admin_json(&socket, &["fence", &paused]);
    assert_eq!(fenced["released_epoch"], 1, "{fenced}");
    assert_eq!(wait_for(&mut api, &paused, "recoverable").await["epoch"], 1);
    let recovered = api.action("recover", json!({"run_id": paused})).await;
    assert_eq!(recovered.status, 200, "{recovered:?}");
    assert_eq!(wait_for(&mut api, &paused, "paused").await["epoch"], 2);
    let unknown = admin(&socket, &["fence", "no-such-workflow"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("not supervised on this node"));

    // drain: launches and recoveries are refused from now on; reads still work.
    assert_eq!(admin_json(&socket, &["drain"])["draining"], true);
    let refused = api.action("launch", json!({"script": "return 1;"})).await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(admin_json(&socket, &["status"])["draining"], true);
    assert_eq!(
        api.action("get", json!({"run_id": parked})).await.status,
        200
    );
    std::fs::remove_file(faults.path().join("hold_model")).expect("release the child");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_admin_socket_is_private_exclusive_and_taken_over_when_stale() {
    let shared = tempfile::tempdir().expect("temp dir");
    let socket = shared.path().join("admin.sock");
    let socket_env = ("REINS_ADMIN_SOCKET", socket.display().to_string());
    let first_db = Db::new(false).await;
    let mut first = Node::start(&first_db, std::slice::from_ref(&socket_env));
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");

    // A second node pointed at the same socket refuses to start, naming it.
    let second_db = Db::new(false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let addr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut second = ReinsProcess::serve(
        dir.path(),
        addr,
        &[
            (
                "REINS_DATABASE",
                format!("sqlite:{}", dir.path().join("r.db").display()),
            ),
            ("REINS_LISTEN", addr.to_string()),
            socket_env.clone(),
        ],
    );
    let exited = second
        .wait_exit(Duration::from_secs(60))
        .expect("the second node exits");
    assert!(!exited.success());
    let said = second.stderr();
    assert!(
        said.contains("held by another live node") && said.contains("admin.sock"),
        "{said}"
    );
    assert_eq!(
        admin_json(&socket, &["status"])["backend"],
        "sqlite",
        "the first node still answers"
    );

    // Killed, the first node leaves its socket file behind; a new node takes it over.
    first.process.signal(libc::SIGKILL);
    first
        .process
        .wait_exit(Duration::from_secs(60))
        .expect("killed");
    assert!(socket.exists(), "SIGKILL leaves the socket file");
    let mut third = Node::start(&second_db, &[socket_env]);
    let status = admin_json(&socket, &["status"]);
    assert!(
        status["uptime_seconds"].as_f64().is_some_and(|s| s < 30.0),
        "{status}"
    );
    // A clean stop removes it.
    third.process.signal(libc::SIGTERM);
    assert!(
        third
            .process
            .wait_exit(Duration::from_secs(60))
            .expect("stopped")
            .success()
    );
    assert!(!socket.exists(), "a clean stop removes the socket");
}

/// Parses Prometheus text: `name{labels}` to value; panics on any line that is not a comment,
/// blank, or a sample.
fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.split_whitespace().collect();
            assert!(
                matches!(words.first(), Some(&"HELP" | &"TYPE")),
                "bad comment {line:?}"
            );
            if words[0] == "TYPE" {
                assert!(
                    matches!(words.get(2), Some(&"counter" | &"gauge" | &"histogram")),
                    "{line:?}"
                );
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad sample {line:?}"));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        if name_end < series.len() {
            assert!(series.ends_with('}'), "bad labels in {line:?}");
        }
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        samples.insert(series.to_owned(), value);
    }
    samples
}

pub async fn scrape(api: &mut Api) -> BTreeMap<String, f64> {
    let answer = api.call("GET", "/metrics", None).await;
    assert_eq!(answer.status, 200);
    assert!(
        answer.headers["content-type"]
            .to_str()
            .unwrap_or_default()
            .starts_with("text/plain")
    );
    parse_metrics(&String::from_utf8_lossy(&answer.body))
}

pub fn value(samples: &BTreeMap<String, f64>, series: &str) -> f64 {
    samples.get(series).copied().unwrap_or(0.0)
}

/// `/metrics` needs no sign-in, so it is for the private network only (judged on the client
/// address a trusted proxy forwards), and however often it is asked the database counts its
/// workflows at most once per `http.metrics_refresh_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_are_for_the_private_network_and_count_the_database_once_a_period() {
    let db = Db::new(false).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_HTTP__TRUSTED_PROXIES", r#"["127.0.0.1"]"#.into()),
            ("REINS_HTTP__METRICS_REFRESH_MS", "3600000".into()),
        ],
    );
    let mut api = initialize(&node).await;
    let from = async |api: &mut Api, address: &str| {
        api.send(
            "GET",
            "/metrics",
            None,
            Vec::new(),
            &[("x-forwarded-for", address)],
        )
        .await
    };
    for stranger in ["203.0.113.9", "2001:db8::1", "172.32.0.1"] {
        let refused = from(&mut api, stranger).await;
        assert_eq!(refused.status, 403, "{stranger}: {refused:?}");
        assert_eq!(refused.json()["error"]["code"], "metrics_forbidden");
    }
    for private in ["10.1.2.3", "192.168.0.7", "172.16.5.5", "fd00::5"] {
        assert_eq!(from(&mut api, private).await.status, 200, "{private}");
    }
    let paused = "reins_workflows{status=\"paused\"}";
    assert_eq!(value(&scrape(&mut api).await, paused), 0.0);
    let id = launch(&mut api, "await pause({stepId: 'p'}); return 1;").await;
    wait_for(&mut api, &id, "paused").await;
    let cached = scrape(&mut api).await;
    assert_eq!(
        value(&cached, paused),
        0.0,
        "counted again within the period"
    );
    assert_eq!(
        value(&cached, "reins_steps_started_total{kind=\"pause\"}"),
        1.0,
        "the node's own counters are always fresh"
    );
    assert!(
        cached.contains_key("reins_store_write_batches_total")
            && cached.contains_key("reins_store_batched_writes_total"),
        "SQLite's group commit is counted too: {cached:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn metrics_parse_as_prometheus_text_and_move_as_workflows_run() {
    let db = Db::new(true).await;
    // The database's gauges are counted afresh at every scrape.
    let node = Node::start(&db, &[("REINS_HTTP__METRICS_REFRESH_MS", "1".into())]);
    let mut api = initialize(&node).await;
    let before = scrape(&mut api).await;
    for name in [
        "reins_steps_started_total",
        "reins_lease_losses_total",
        "reins_fenced_writes_rejected_total",
        "reins_journal_write_seconds_count",
        "reins_store_requests{state=\"waiting\"}",
    ] {
        assert!(
            before.contains_key(name),
            "{name} is missing before anything ran: {before:?}"
        );
    }
    let id = launch(&mut api, "await agent({stepId: 'a', agentRef: 'scripted', task: 'x'}); \
        await agent({stepId: 'b', agentRef: 'scripted', task: 'y'}); await pause({stepId: 'p'}); return 1;").await;
    wait_for(&mut api, &id, "paused").await;
    let after = scrape(&mut api).await;
    assert_eq!(
        value(&after, "reins_steps_started_total{kind=\"agent\"}"),
        2.0,
        "{after:?}"
    );
    assert_eq!(
        value(
            &after,
            "reins_steps_finished_total{kind=\"agent\",outcome=\"completed\"}"
        ),
        2.0
    );
    assert_eq!(
        value(&after, "reins_steps_started_total{kind=\"pause\"}"),
        1.0
    );
    assert_eq!(value(&after, "reins_child_runs_started_total"), 2.0);
    assert_eq!(
        value(
            &after,
            "reins_child_runs_finished_total{status=\"success\"}"
        ),
        2.0
    );
    assert!(
        value(&after, "reins_journal_write_seconds_count")
            > value(&before, "reins_journal_write_seconds_count")
    );
    assert_eq!(value(&after, "reins_workflows{status=\"paused\"}"), 1.0);
    assert!(
        value(&after, "reins_store_pool_connections{state=\"open\"}") >= 1.0,
        "PostgreSQL pool: {after:?}"
    );
    assert!(
        after.contains_key("reins_store_write_batches_total")
            && after.contains_key("reins_store_batched_writes_total"),
        "PostgreSQL write batches: {after:?}"
    );
    let launches = "reins_http_requests_total{method=\"POST\",route=\"/api/plugins/community.workflows/actions/launch\",status=\"200\"}";
    assert_eq!(value(&after, launches), 1.0, "{after:?}");
    assert!(
        after.keys().all(|k| !k.contains(&id)),
        "a workflow id leaked into a label"
    );
}

/// The JSON log lines of a node (the format `--log-format json` writes).
fn json_lines(stderr: &str) -> Vec<Value> {
    stderr
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn step_lines<'a>(lines: &'a [Value], message: &str, step_id: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["fields"]["message"] == message && l["fields"]["step_id"] == step_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restart_replays_without_logging_or_counting_the_steps_that_ran_before() {
    let db = Db::new(false).await;
    let env = [
        ("REINS_LOG_FORMAT", "json".to_owned()),
        ("REINS_LEASE_SECONDS", "1".to_owned()),
        ("REINS_RECOVERY", "automatic".to_owned()),
    ];
    let mut first = Node::start(&db, &env);
    let mut api = initialize(&first).await;
    let id = launch(
        &mut api,
        "console.log('begin'); await agent({stepId: 'a', agentRef: 'scripted', task: 'x'}); \
        await pause({stepId: 'p'}); console.log('resumed'); \
        return await agent({stepId: 'b', agentRef: 'scripted', task: 'y'});",
    )
    .await;
    let paused = wait_for(&mut api, &id, "paused").await;
    first.process.signal(libc::SIGKILL);
    first
        .process
        .wait_exit(Duration::from_secs(60))
        .expect("killed");
    let before = json_lines(&first.process.stderr());
    assert_eq!(
        step_lines(&before, "step started", "a").len(),
        1,
        "the first run logs step a once"
    );
    for line in step_lines(&before, "step started", "a") {
        assert_eq!(line["span"]["run_id"], json!(id), "{line}");
        assert_eq!(line["span"]["epoch"], 1, "{line}");
    }

    // A second node recovers it automatically (replaying a and p), then it is resumed.
    let mut second = Node::start(&db, &env);
    let mut api = Api::new(second.addr);
    api.cookies = initialize_again(&second).await;
    let recovered = wait_for(&mut api, &id, "paused").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut record = recovered;
    while record["epoch"] != 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never recovered: {record}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        record = api.action("get", json!({"run_id": id})).await.json();
    }
    let resumed = api
        .action(
            "resume",
            json!({"run_id": id, "fingerprint": paused["fingerprint"],
        "step_id": "p", "attempt": 1}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_for(&mut api, &id, "completed").await;
    let metrics = scrape(&mut api).await;
    assert_eq!(
        value(&metrics, "reins_steps_started_total{kind=\"agent\"}"),
        1.0,
        "only b ran here: {metrics:?}"
    );
    assert_eq!(
        value(&metrics, "reins_steps_started_total{kind=\"pause\"}"),
        0.0
    );
    assert_eq!(value(&metrics, "reins_child_runs_started_total"), 1.0);
    second.process.signal(libc::SIGTERM);
    second
        .process
        .wait_exit(Duration::from_secs(60))
        .expect("stopped");
    let after = json_lines(&second.process.stderr());
    assert!(!after.is_empty(), "JSON log lines");
    assert!(
        step_lines(&after, "step started", "a").is_empty(),
        "the replay logged step a again"
    );
    assert!(
        step_lines(&after, "step started", "p").is_empty(),
        "the replay logged the pause again"
    );
    let b = step_lines(&after, "step started", "b");
    assert_eq!(b.len(), 1);
    assert_eq!(
        (
            b[0]["span"]["run_id"].clone(),
            b[0]["span"]["epoch"].clone()
        ),
        (json!(id), json!(2))
    );
    let scripts: Vec<&str> = after
        .iter()
        .filter_map(|l| l["fields"]["script_log"].as_str())
        .collect();
    assert_eq!(
        scripts,
        vec!["resumed"],
        "console.log before the restart point is not repeated"
    );
}

/// Signs in on a node of a cluster whose admin exists already.
async fn initialize_again(node: &Node) -> BTreeMap<String, String> {
    let mut api = node.api();
    let answer = api
        .login(crate::http_api::ADMIN, crate::http_api::PASSWORD)
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    api.cookies
}
