//! Wake-ups instead of timers: the change bus of the store (a cue after each commit, ids only),
//! the nodes that act on it across a cluster, and the wait API (`?wait=`) that answers as soon
//! as a workflow ends or waits for a person, on both backends.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use store::{Change, Fence, NewControl, NewWorkflow, WriteOp};
use tokio::sync::broadcast;

use crate::harness::both;
use crate::harness::{eventually, on_both_backends};
use crate::http_api::{Db, Node, PASSWORD, assert_refused, initialize, launch};
use crate::http_client::{Answer, Api};

/// The next change that is not a resync, within a generous bound.
async fn next_change(changes: &mut broadcast::Receiver<Change>) -> Change {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            match changes.recv().await {
                Ok(Change::Resync) => continue,
                Ok(change) => return change,
                Err(error) => panic!("the bus failed: {error}"),
            }
        }
    })
    .await
    .expect("a change within 30 s")
}

/// Waits until the bus is listening (PostgreSQL announces its first connect with a resync).
async fn listening(store: &store::Store, changes: &mut broadcast::Receiver<Change>) {
    if store.backend() == store::Backend::Postgres {
        let first = tokio::time::timeout(Duration::from_secs(30), changes.recv()).await;
        assert!(matches!(first, Ok(Ok(Change::Resync))), "{first:?}");
    }
}

on_both_backends! {
    async fn committed_changes_are_announced_by_id_and_rolled_back_ones_never(db: TestDb) {
        let store = db.store().await;
        let mut changes = store.changes().subscribe();
        listening(&store, &mut changes).await;
        let lease = store
            .create_workflow(
                NewWorkflow {
                    workflow_id: "wf-bus".into(),
                    user_id: "ada".into(),
                    request_id: None,
                    fingerprint: "fp".into(),
                    data: json!({"script": "return 1;"}),
                },
                "node-a",
                60_000,
            )
            .await
            .expect("launch");

        // A write the fence refuses changes nothing, so it announces nothing: the next change
        // heard is the control recorded after it.
        let stale = Fence { epoch: lease.epoch.next(), ..lease.fence() };
        let set = |status: &str| WriteOp::SetWorkflow {
            workflow_id: "wf-bus".into(),
            status: store::WorkflowStatus::parse(status).expect("a status"),
            data: json!({"script": "return 1;"}),
        };
        assert!(store.fenced_write(&stale, vec![set("paused")]).await.is_err());
        // Nor does a write that changed the status and then failed: it all rolled back.
        let artifact = WriteOp::PutArtifact {
            workflow_id: "wf-bus".into(),
            version: 1,
            source_step_id: "a".into(),
            path: None,
            content: b"x".to_vec(),
            sha256: "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881".into(),
        };
        let failed = store
            .fenced_write(&lease.fence(), vec![set("paused"), artifact.clone(), artifact])
            .await;
        assert!(failed.is_err(), "a second version 1 was written");
        store
            .put_control(NewControl {
                workflow_id: "wf-bus".into(),
                kind: store::ControlKind::Cancel,
                step_id: String::new(),
                attempt: 0,
                body: json!({}),
                created_by: Some("ada".into()),
            })
            .await
            .expect("control");
        assert_eq!(next_change(&mut changes).await, Change::Control("wf-bus".into()));
        store.fenced_write(&lease.fence(), vec![set("completed")]).await.expect("end");
        assert_eq!(next_change(&mut changes).await, Change::Status("wf-bus".into()));
    }
}

/// The fallback of every wake-up, an hour: a test that passes with it proves no timer is
/// involved.
const NO_FALLBACK: (&str, &str) = ("REINS_WAKE_FALLBACK_MS", "3600000");

/// Waits of up to an hour (`http.wait_max_ms`), asked for with [`AN_HOUR`]: no such wait runs
/// out within a test, so one answered came from a wake-up, whatever the machine's load.
const LONG_WAITS: (&str, &str) = ("REINS_HTTP__WAIT_MAX_MS", "3600000");
const AN_HOUR: &str = "60m";

/// The answer of a wait of an hour (see [`LONG_WAITS`]) that something must wake: the bound
/// only detects a waiter nothing woke.
async fn woken(wait: impl std::future::Future<Output = (Answer, Duration)>) -> Answer {
    tokio::time::timeout(Duration::from_secs(60), wait)
        .await
        .expect("nothing woke the waiter: its wait of an hour did not answer within 60 s")
        .0
}

fn env(pairs: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    pairs.iter().map(|(k, v)| (*k, (*v).to_owned())).collect()
}

/// A workflow that waits at a checkpoint about its agent's output.
const CHECKPOINT: &str = r#"
    const a = await agent({stepId: "a", agentRef: "scripted", task: {output: "draft"}});
    const review = await humanCheckpoint({stepId: "review", sourceStepId: "a",
                                          artifactVersion: a.artifactVersion});
    return review.decision;
"#;

/// One agent step of about `ms` milliseconds.
fn sleeping(ms: u64) -> String {
    format!(
        r#"const a = await agent({{stepId: "a", agentRef: "scripted", task: {{sleep_ms: {ms}, output: "slept"}}}});
           return a.output;"#
    )
}

/// Launches through REST with `?wait=`, answering the reply and how long it took.
async fn launch_waiting(api: &mut Api, script: &str, wait: &str) -> (Answer, Duration) {
    let started = Instant::now();
    let answer = api
        .call(
            "POST",
            &format!("/api/v1/workflows?wait={wait}"),
            Some(json!({"script": script})),
        )
        .await;
    (answer, started.elapsed())
}

async fn get_waiting(api: &mut Api, run_id: &str, wait: &str) -> (Answer, Duration) {
    let started = Instant::now();
    let answer = api
        .call(
            "GET",
            &format!("/api/v1/workflows/{run_id}?wait={wait}"),
            None,
        )
        .await;
    (answer, started.elapsed())
}

/// Approves the checkpoint `review` of `record`'s workflow through `api`.
async fn approve(api: &mut Api, record: &Value) {
    let run_id = record["run_id"].as_str().expect("run_id");
    let checkpoint = record["checkpoints"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["step_id"] == "review"))
        .expect("the checkpoint");
    let decided = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/decide"),
            Some(
                json!({"step_id": "review", "attempt": checkpoint["attempt"],
                        "artifact_version": checkpoint["artifact_version"],
                        "decision": "approve"}),
            ),
        )
        .await;
    assert_eq!(decided.status, 200, "{decided:?}");
}

async fn waits_answer_at_the_end_at_a_checkpoint_and_at_the_deadline(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &env(&[NO_FALLBACK, LONG_WAITS]));
    let mut api = initialize(&node).await;

    // A ~50 ms workflow: the launch answers with its result as soon as it completes.
    let done = woken(launch_waiting(&mut api, &sleeping(50), AN_HOUR)).await;
    assert_eq!(done.status, 201, "{done:?}");
    let done = done.json();
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["result"], "slept");
    assert_eq!(
        done["created"], true,
        "the launch's own fields stay: {done}"
    );
    let step = &done["steps"][0];
    let (started, finished) = (step["started_at"].as_f64(), step["finished_at"].as_f64());
    assert!(
        matches!((started, finished), (Some(s), Some(f)) if f >= s && f - s < 60.0),
        "a step carries when it started and finished: {step}"
    );

    // At a checkpoint the wait ends too; a decision wakes a second waiter at the end.
    let waiting = woken(launch_waiting(&mut api, CHECKPOINT, AN_HOUR)).await;
    assert_eq!(waiting.status, 201, "{waiting:?}");
    let waiting = waiting.json();
    assert_eq!(waiting["status"], "waiting_approval", "{waiting}");
    // Decided: the checkpoint waits for nobody any more, so a wait goes on until the owner,
    // woken by the decision (no timer: the fallback is an hour), has carried it out.
    approve(&mut api, &waiting).await;
    let run_id = waiting["run_id"].as_str().expect("run_id").to_owned();
    let ended = woken(get_waiting(&mut api, &run_id, AN_HOUR)).await;
    assert_eq!(ended.status, 200, "{ended:?}");
    assert_eq!(ended.json()["status"], "completed", "{:?}", ended.json());
    assert_eq!(ended.json()["result"], "approve");

    // Nothing happens: the deadline answers 200 with the record as it is.
    let held = launch(&mut api, &sleeping(600_000)).await;
    let (running, took) = get_waiting(&mut api, &held, "500ms").await;
    assert_eq!(running.status, 200, "{running:?}");
    assert_eq!(running.json()["status"], "running");
    assert!(
        took >= Duration::from_millis(500),
        "answered before its deadline: {took:?}"
    );

    // The compatible surface takes `wait_ms`.
    let compat = api
        .action("get", json!({"run_id": held, "wait_ms": 300}))
        .await;
    assert_eq!(compat.status, 200, "{compat:?}");
    assert_eq!(compat.json()["status"], "running");
    let launched = api
        .action("launch", json!({"script": sleeping(10), "wait_ms": 30_000}))
        .await;
    assert_eq!(launched.status, 200, "{launched:?}");
    assert_eq!(
        launched.json()["status"],
        "completed",
        "{:?}",
        launched.json()
    );

    // A wait that is not a duration is refused, naming it; another user's workflow is 404.
    for bad in ["soon", "30", "1.5s", "-1s", "1h"] {
        let (refused, _) = get_waiting(&mut api, &held, bad).await;
        assert_refused(&refused, 400, "bad_request", &format!("{bad:?}"));
    }
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
    let (hidden, _) = get_waiting(&mut bob, &held, "5s").await;
    assert_refused(&hidden, 404, "not_found", &held);
}

both!(waits_answer_at_the_end_at_a_checkpoint_and_at_the_deadline);

/// Sends a waiting `GET` on a raw connection and returns it unanswered (dropping it is a
/// client that went away).
fn raw_waiter(node: &Node, api: &Api, run_id: &str) -> std::net::TcpStream {
    use std::io::Write;
    let cookies: Vec<String> = api
        .cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut stream = std::net::TcpStream::connect(node.addr).expect("connect");
    write!(
        stream,
        "GET /api/v1/workflows/{run_id}?wait=60s HTTP/1.1\r\nHost: {}\r\nCookie: {}\r\n\r\n",
        node.addr,
        cookies.join("; ")
    )
    .expect("send");
    stream
}

/// A raw waiter that holds a waiter's place (the node's last one, or its user's last one):
/// known to hold it once another wait of its user is refused while it is still unanswered. It
/// is sent again whenever it was answered (it met the place taken, by such a probe).
async fn parked_waiter(node: &Node, api: &Api, run_id: &str) -> std::net::TcpStream {
    let mut probe = api.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stream = raw_waiter(node, api, run_id);
    stream.set_nonblocking(true).expect("nonblocking");
    loop {
        let mut byte = [0u8; 1];
        match stream.peek(&mut byte) {
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                let (probed, _) = get_waiting(&mut probe, run_id, "10ms").await;
                let unanswered = matches!(
                    stream.peek(&mut byte),
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock
                );
                if matches!(probed.status, 429 | 503) && unanswered {
                    return stream;
                }
            }
            _ => {
                stream = raw_waiter(node, api, run_id);
                stream.set_nonblocking(true).expect("nonblocking");
            }
        }
        assert!(
            Instant::now() < deadline,
            "the raw waiter never held a place"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn waits_are_capped_and_counted_and_a_gone_client_frees_its_place(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &env(&[
            NO_FALLBACK,
            ("REINS_HTTP__WAIT_MAX_MS", "1000"),
            ("REINS_HTTP__WAITERS_MAX", "1"),
        ]),
    );
    let mut api = initialize(&node).await;
    let held = launch(&mut api, &sleeping(600_000)).await;

    // Ten minutes asked, `http.wait_max_ms` given.
    let (capped, took) = get_waiting(&mut api, &held, "10m").await;
    assert_eq!(capped.status, 200, "{capped:?}");
    assert_eq!(capped.json()["status"], "running");
    // Not before the cap; the upper bound only detects a wait that was not capped.
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(60),
        "a 10m wait capped at 1000 ms took {took:?}"
    );

    // One waiter at most: a second is 503 with Retry-After, and a launch that would wait
    // launches nothing.
    let parked = parked_waiter(&node, &api, &held).await;
    let (busy, _) = get_waiting(&mut api, &held, "10ms").await;
    assert_refused(&busy, 503, "waiters_busy", "http.waiters_max");
    assert_eq!(
        busy.headers.get("retry-after").map(|v| v.to_str().ok()),
        Some(Some("1"))
    );
    let before = api.call("GET", "/api/v1/workflows", None).await.json()["workflows"]
        .as_array()
        .map(Vec::len);
    let (refused, _) = launch_waiting(&mut api, &sleeping(1), "5s").await;
    assert_refused(&refused, 503, "waiters_busy", "http.waiters_max");
    let after = api.call("GET", "/api/v1/workflows", None).await.json()["workflows"]
        .as_array()
        .map(Vec::len);
    assert_eq!(before, after, "a refused waiting launch launched something");

    // The client goes away: its place is free again.
    drop(parked);
    eventually(
        Duration::from_secs(60),
        "the gone client's place came back",
        async || get_waiting(&mut api, &held, "10ms").await.0.status == 200,
    )
    .await;
}

both!(waits_are_capped_and_counted_and_a_gone_client_frees_its_place);

/// One user cannot take every place of a node: past `http.waiters_per_user_max` their next
/// wait, and past `events.streams_per_user_max` their next stream, is 429, while another user
/// still waits and streams; a place given back is theirs again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_user_cannot_take_every_wait_or_stream_of_a_node() {
    let db = Db::new(false).await;
    let node = Node::start(
        &db,
        &env(&[
            NO_FALLBACK,
            ("REINS_HTTP__WAITERS_PER_USER_MAX", "1"),
            ("REINS_EVENTS__STREAMS_PER_USER_MAX", "1"),
        ]),
    );
    let mut admin = initialize(&node).await;
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "bob@example.com", "password": PASSWORD, "role": "approver"})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut bob = node.api();
    assert_eq!(bob.login("bob@example.com", PASSWORD).await.status, 200);
    let held = launch(&mut admin, &sleeping(600_000)).await;

    let parked = parked_waiter(&node, &admin, &held).await;
    let (busy, _) = get_waiting(&mut admin, &held, "10ms").await;
    assert_refused(&busy, 429, "waiters_busy", "http.waiters_per_user_max");
    let (refused, _) = launch_waiting(&mut admin, &sleeping(1), "5s").await;
    assert_refused(&refused, 429, "waiters_busy", "http.waiters_per_user_max");
    assert_eq!(get_waiting(&mut bob, &held, "10ms").await.0.status, 200);
    drop(parked);
    eventually(
        Duration::from_secs(60),
        "the gone client's place came back",
        async || get_waiting(&mut admin, &held, "10ms").await.0.status == 200,
    )
    .await;

    let feed = admin.stream("/api/v1/events", &[]).await;
    assert_eq!(feed.status, 200);
    let second = admin.stream("/api/v1/events", &[]).await;
    assert_eq!(second.status, 429);
    assert_eq!(bob.stream("/api/v1/events", &[]).await.status, 200);
    drop(feed);
    eventually(
        Duration::from_secs(60),
        "the closed stream's place came back",
        async || admin.stream("/api/v1/events", &[]).await.status == 200,
    )
    .await;
}

/// Two real nodes on one PostgreSQL database, both signed in as the first admin.
async fn two_nodes(extra: &[(&'static str, &str)]) -> (Db, Node, Api, Node, Api) {
    let db = Db::new(true).await;
    let a = Node::start(&db, &env(extra));
    let b = Node::start(&db, &env(extra));
    let api_a = initialize(&a).await;
    let mut api_b = b.api();
    assert_eq!(
        api_b.login(crate::http_api::ADMIN, PASSWORD).await.status,
        200
    );
    (db, a, api_a, b, api_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_decision_on_one_node_resumes_a_workflow_owned_by_another_with_no_timer() {
    let (_db, _a, mut api_a, _b, mut api_b) = two_nodes(&[NO_FALLBACK, LONG_WAITS]).await;
    let waiting = woken(launch_waiting(&mut api_a, CHECKPOINT, AN_HOUR)).await;
    let waiting = waiting.json();
    assert_eq!(waiting["status"], "waiting_approval", "{waiting}");
    let run_id = waiting["run_id"].as_str().expect("run_id").to_owned();
    // Decided on B, waited for on B: A (the owner) hears the control, B hears the end.
    approve(&mut api_b, &waiting).await;
    let ended = woken(get_waiting(&mut api_b, &run_id, AN_HOUR)).await;
    assert_eq!(ended.json()["status"], "completed", "{:?}", ended.json());
    assert_eq!(
        ended.json()["owner"],
        waiting["owner"],
        "the workflow stayed on its owner"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_freed_on_one_node_admits_a_step_queued_on_another_with_no_timer() {
    let (_db, _a, mut api_a, _b, mut api_b) = two_nodes(&[
        NO_FALLBACK,
        LONG_WAITS,
        ("REINS_LIMITS__MAX_ACTIVE_CHILDREN", "1"),
    ])
    .await;
    // A holds the only slot for a second; B's step queues behind it.
    let first = launch(&mut api_a, &sleeping(1000)).await;
    eventually(
        Duration::from_secs(60),
        "A's step holds the slot",
        async || {
            let record = api_a
                .call("GET", &format!("/api/v1/workflows/{first}"), None)
                .await
                .json();
            record["steps"][0]["status"] == "running"
        },
    )
    .await;
    // Queued, admitted when A's step frees the slot (no timer), completed: each wakes the
    // next, and the waiting launch.
    let second = woken(launch_waiting(&mut api_b, &sleeping(10), AN_HOUR)).await;
    let second = second.json();
    assert_eq!(second["status"], "completed", "{second}");
    let first = woken(get_waiting(&mut api_a, &first, AN_HOUR)).await;
    assert_eq!(first.json()["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_listen_connection_reconnects_and_its_resync_catches_what_it_missed() {
    let db = Db::new(true).await;
    let node = Node::start(&db, &env(&[NO_FALLBACK, LONG_WAITS]));
    let mut api = initialize(&node).await;
    let waiting = woken(launch_waiting(&mut api, CHECKPOINT, AN_HOUR)).await;
    let waiting = waiting.json();
    assert_eq!(waiting["status"], "waiting_approval", "{waiting}");
    let run_id = waiting["run_id"].as_str().expect("run_id").to_owned();
    let Db::Postgres(test_db) = &db else {
        unreachable!("a PostgreSQL database")
    };
    let admin = test_db.pg_client().await;
    let name: String = admin
        .query_one("SELECT current_database()", &[])
        .await
        .expect("database")
        .get(0);
    let listener = || async {
        admin
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND application_name = $2",
                &[&name, &store::LISTEN_APPLICATION_NAME],
            )
            .await
            .expect("activity")
            .map(|row| row.get::<_, i32>(0))
    };
    let killed = listener().await.expect("the node listens");
    // ALTER DATABASE runs from another database than the one it changes.
    let (server, connection) = tokio_postgres::connect(
        &std::env::var("REINS_TEST_PG").expect("REINS_TEST_PG"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect to the server");
    tokio::spawn(connection);

    // The listener is killed and kept out while a decision commits: the node cannot hear it.
    server
        .execute(
            &format!("ALTER DATABASE {name} ALLOW_CONNECTIONS false"),
            &[],
        )
        .await
        .expect("keep new connections out");
    let terminated: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&killed])
        .await
        .expect("terminate")
        .get(0);
    assert!(terminated);
    approve(&mut api, &waiting).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let missed = api
        .call("GET", &format!("/api/v1/workflows/{run_id}"), None)
        .await
        .json();
    assert_eq!(
        missed["status"], "waiting_approval",
        "the decision was heard without a listener"
    );
    server
        .execute(
            &format!("ALTER DATABASE {name} ALLOW_CONNECTIONS true"),
            &[],
        )
        .await
        .expect("let connections in");

    // It reconnects, and its resync finds the decision: no timer (the fallback is an hour).
    let ended = woken(get_waiting(&mut api, &run_id, AN_HOUR)).await;
    assert_eq!(ended.json()["status"], "completed", "{:?}", ended.json());
    let again = listener().await.expect("the node listens again");
    assert_ne!(again, killed);
}

/// Reads of a workflow that requests waiting for it (`?wait=`) made so far: the node's own
/// count, so that nothing else a node does (lease renewals, clock reads, another test's load)
/// is counted with them.
async fn wait_reads(api: &mut Api) -> u64 {
    let text = api.call("GET", "/metrics", None).await;
    String::from_utf8_lossy(&text.body)
        .lines()
        .filter(|line| line.starts_with("reins_http_wait_reads_total"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// `waiters` requests waiting for the workflows `held` (which go on running) park, then what
/// they read in a quiet period of 5 s: a fixed window, but what it counts is the waiters' own
/// reads, which a loaded machine can only make fewer. Answers the waiters' tasks.
async fn quiet_period_reads(
    api: &mut Api,
    held: &[String],
    waiters: usize,
) -> (u64, Vec<tokio::task::JoinHandle<(Answer, Duration)>>) {
    let before = wait_reads(api).await;
    let tasks: Vec<_> = (0..waiters)
        .map(|i| {
            let (mut api, id) = (api.clone(), held[i % held.len()].clone());
            tokio::spawn(async move { get_waiting(&mut api, &id, "10m").await })
        })
        .collect();
    // Every waiter has read its workflow once: it is parked.
    let target = before + u64::try_from(waiters).expect("a count");
    let mut reads = before;
    eventually(
        Duration::from_secs(120),
        "every waiter's first read",
        async || {
            reads = wait_reads(api).await;
            reads >= target
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let parked = tasks.iter().filter(|task| !task.is_finished()).count();
    assert_eq!(parked, waiters, "waiters answered before anything happened");
    (wait_reads(api).await - reads, tasks)
}

/// A node on PostgreSQL with four workflows whose agent steps run for ten minutes, and room for
/// a thousand waiters; `extra` adds to its environment.
async fn four_long_workflows(db: &Db, extra: &[(&'static str, &str)]) -> (Node, Api, Vec<String>) {
    let mut vars = vec![
        NO_FALLBACK,
        ("REINS_HTTP__CONNECTIONS_MAX", "4096"),
        ("REINS_HTTP__WAITERS_MAX", "2048"),
        ("REINS_HTTP__WAITERS_PER_USER_MAX", "4096"),
        ("REINS_HTTP__WAIT_MAX_MS", "600000"),
    ];
    vars.extend_from_slice(extra);
    let node = Node::start(db, &env(&vars));
    let mut api = initialize(&node).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(launch(&mut api, &sleeping(600_000)).await);
    }
    for id in &held {
        eventually(Duration::from_secs(60), "the step runs", async || {
            let record = api
                .call("GET", &format!("/api/v1/workflows/{id}"), None)
                .await
                .json();
            record["steps"][0]["status"] == "running"
        })
        .await;
    }
    (node, api, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_parked_waiters_run_no_query_while_nothing_happens() {
    const WAITERS: usize = 1000;
    let db = Db::new(true).await;
    let (_node, mut api, held) = four_long_workflows(&db, &[]).await;
    let (reads, waiters) = quiet_period_reads(&mut api, &held, WAITERS).await;
    assert_eq!(
        reads, 0,
        "{WAITERS} parked waiters read their workflows {reads} times in a quiet period"
    );

    // A change wakes them: each answers with the record.
    let cancelled = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{}/cancel", held[0]),
            None,
        )
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    let mut answered = 0;
    for (i, waiter) in waiters.into_iter().enumerate() {
        if i % held.len() == 0 {
            let (answer, _) = waiter.await.expect("waiter");
            assert_eq!(answer.json()["status"], "cancelled", "{:?}", answer.json());
            answered += 1;
        } else {
            waiter.abort();
        }
    }
    assert_eq!(answered, WAITERS / held.len());
}

/// The planted mutant that proves the test above can fail: waiters that poll (every second,
/// through the `fault-points` build's hook) are caught by the same measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_quiet_period_test_catches_waiters_that_poll() {
    const WAITERS: usize = 40;
    let db = Db::new(true).await;
    let (_node, mut api, held) =
        four_long_workflows(&db, &[("REINS_FAULT_WAITER_POLL_MS", "1000")]).await;
    let (reads, waiters) = quiet_period_reads(&mut api, &held, WAITERS).await;
    assert!(
        reads >= u64::try_from(WAITERS).expect("a count"),
        "{WAITERS} waiters polling every second read only {reads} times in 5 s"
    );
    for waiter in waiters {
        waiter.abort();
    }
}

/// `GET /api/v1/workflows/{id}` requests the node answered so far.
async fn gets_answered(api: &mut Api) -> u64 {
    let text = api.call("GET", "/metrics", None).await;
    String::from_utf8_lossy(&text.body)
        .lines()
        .filter(|line| {
            line.starts_with("reins_http_requests_total{")
                && line.contains("method=\"GET\"")
                && line.contains("route=\"/api/v1/workflows/{id}\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reins_run_and_get_wait_on_the_server_and_never_poll() {
    use crate::cli::{cli, code, json_of};
    let db = Db::new(false).await;
    // The server waits at most a second: a 2.5 s workflow takes the client a few waits.
    let node = Node::start(
        &db,
        &env(&[NO_FALLBACK, ("REINS_HTTP__WAIT_MAX_MS", "1000")]),
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    std::fs::write(home.join("slow.js"), sleeping(2500)).expect("script");
    std::fs::write(home.join("review.js"), CHECKPOINT).expect("script");
    let init = cli(home, &node, &["init", "--email", crate::http_api::ADMIN]);
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));
    let mut api = node.api();
    let gets_before = gets_answered(&mut api).await;

    let started = Instant::now();
    let run = cli(home, &node, &["run", "slow.js", "--wait", "--json"]);
    let took = started.elapsed();
    assert_eq!(code(&run), 0, "{}", String::from_utf8_lossy(&run.stderr));
    let record = json_of(&run);
    assert_eq!(record["status"], "completed", "{record}");
    assert_eq!(record["result"], "slept");
    // Every get but the last waited its second on the server: at most one get per second the
    // client waited, and one more (a poll would take many; a slow machine takes longer, and
    // gets as many more).
    let gets = gets_answered(&mut api).await - gets_before;
    let allowed = took.as_secs() + 1;
    assert!(
        (1..=allowed).contains(&gets),
        "a 2.5 s workflow under a 1 s server wait took {gets} gets in {took:?} (a poll would \
         take many)"
    );

    let launched = cli(home, &node, &["run", "review.js", "--json"]);
    assert_eq!(
        code(&launched),
        0,
        "{}",
        String::from_utf8_lossy(&launched.stderr)
    );
    let run_id = json_of(&launched)["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    let waited = cli(home, &node, &["get", &run_id, "--wait", "--json"]);
    assert_eq!(
        code(&waited),
        3,
        "waits for a person: {}",
        String::from_utf8_lossy(&waited.stderr)
    );
    assert_eq!(json_of(&waited)["status"], "waiting_approval");
}

/// A node stopped with SIGTERM gives the leases of the workflows it stops up, after its last
/// write: another node takes them over at once (the lease is ten minutes, the fallback an hour),
/// and nothing runs twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_clean_stop_hands_its_workflows_to_another_node_at_once() {
    let (db, mut a, mut api_a, _b, mut api_b) = two_nodes(&[
        NO_FALLBACK,
        ("REINS_LEASE_SECONDS", "600"),
        ("REINS_RECOVERY", "automatic"),
    ])
    .await;
    let (waiting, _) = launch_waiting(&mut api_a, CHECKPOINT, "30s").await;
    let waiting = waiting.json();
    assert_eq!(waiting["status"], "waiting_approval", "{waiting}");
    let run_id = waiting["run_id"].as_str().expect("run_id").to_owned();
    let owner_a = waiting["owner"].clone();

    a.signal(libc::SIGTERM);
    assert!(
        a.process.wait_exit(Duration::from_secs(60)).is_some(),
        "A exits after SIGTERM"
    );
    // Its lease would run ten minutes: the bound only detects a takeover that waited for it.
    let mut taken = Value::Null;
    eventually(
        Duration::from_secs(60),
        "B takes the workflow over",
        async || {
            taken = api_b
                .call("GET", &format!("/api/v1/workflows/{run_id}"), None)
                .await
                .json();
            taken["owner"] != owner_a && taken["status"] == "waiting_approval"
        },
    )
    .await;

    approve(&mut api_b, &taken).await;
    let (ended, _) = get_waiting(&mut api_b, &run_id, "30s").await;
    assert_eq!(ended.json()["status"], "completed", "{:?}", ended.json());
    let runs = db
        .sql(&format!(
            "SELECT count(*) FROM runs WHERE workflow = '{run_id}'"
        ))
        .await;
    assert_eq!(runs.as_deref(), Some("1"), "the agent step ran once");
}
