//! Workflow events through the real binary, on both backends: the whole ordered story of a
//! workflow followed live and replayed, a stream resumed with `Last-Event-ID` on another node,
//! a client that reads nothing cut off at its bound, streams and the feed kept to their owners,
//! and `reins watch`.

use std::time::Duration;

use serde_json::{Value, json};

use crate::http_api::{Db, Node, initialize, launch};
use crate::http_client::{Api, Sse, SseEnd, SseStream};

/// How long an event may take to come: only a stream that never sends it reaches this.
const WAIT: Duration = Duration::from_secs(60);

/// Steps, a capture, a pause, a checkpoint, and a pause where it is cancelled.
const STORY: &str = r#"
    const a = await agent({stepId: "a", agentRef: "scripted", task: {
        write: [{path: "/mnt/user-data/outputs/report.txt", content: "hello report"}],
        output: "drafted", tokens: 42}});
    const f = await captureArtifact({stepId: "file", sourceStepId: "a",
                                     path: "/mnt/user-data/outputs/report.txt"});
    await pause({stepId: "p"});
    await humanCheckpoint({stepId: "review", sourceStepId: "file",
                           artifactVersion: f.artifactVersion});
    await pause({stepId: "last"});
    return "never";
"#;

fn events_path(run_id: &str) -> String {
    format!("/api/v1/workflows/{run_id}/events")
}

/// Reads events until one of `kind` (for `step_id`, when given) has come.
async fn until(stream: &mut SseStream, seen: &mut Vec<Sse>, kind: &str, step_id: Option<&str>) {
    loop {
        let event = stream
            .next(WAIT)
            .await
            .unwrap_or_else(|end| panic!("no {kind} event: {end:?}; saw {seen:#?}"));
        let found = event.event == kind
            && step_id.is_none_or(|step| event.data["step_id"].as_str() == Some(step));
        seen.push(event);
        if found {
            return;
        }
    }
}

/// Reads events until the workflow's status is `status`.
async fn until_status(stream: &mut SseStream, seen: &mut Vec<Sse>, status: &str) {
    loop {
        let event = stream
            .next(WAIT)
            .await
            .unwrap_or_else(|end| panic!("no status {status}: {end:?}; saw {seen:#?}"));
        let found = event.event == "status" && event.data["status"] == status;
        seen.push(event);
        if found {
            return;
        }
    }
}

fn kinds(events: &[Sse]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e.data["step_id"].as_str() {
            Some(step) => format!("{} {step}", e.event),
            None if e.event == "status" => {
                format!("status {}", e.data["status"].as_str().unwrap_or("?"))
            }
            None => e.event.clone(),
        })
        .collect()
}

/// Ids 1, 2, 3, ... in order with no gap, each the same in `id:` and the data.
fn assert_numbered(events: &[Sse]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(event.id, index as i64 + 1, "{events:#?}");
        assert_eq!(event.data["id"], event.id);
        assert_eq!(event.data["kind"], event.event.as_str());
    }
}

/// Drives [`STORY`] through its pause and checkpoint and cancels it at its last pause,
/// reading its stream live as it goes; returns what the stream showed.
async fn story(api: &mut Api) -> (String, Vec<Sse>) {
    let run_id = launch(api, STORY).await;
    let mut stream = api.stream(&events_path(&run_id), &[]).await;
    assert_eq!(stream.status, 200);
    assert_eq!(
        stream
            .headers
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let mut seen = Vec::new();
    until(&mut stream, &mut seen, "pause_waiting", Some("p")).await;
    until_status(&mut stream, &mut seen, "paused").await;
    let fingerprint = fingerprint(api, &run_id).await;
    let resumed = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/resume"),
            Some(json!({"step_id": "p", "attempt": 1, "fingerprint": fingerprint})),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    until(&mut stream, &mut seen, "checkpoint_waiting", Some("review")).await;
    let version = seen.last().map(|e| e.data["artifact_version"].clone());
    until_status(&mut stream, &mut seen, "waiting_approval").await;
    let decided = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/decide"),
            Some(
                json!({"step_id": "review", "attempt": 1, "decision": "approve",
                        "comment": "fine", "artifact_version": version}),
            ),
        )
        .await;
    assert_eq!(decided.status, 200, "{decided:?}");
    until(&mut stream, &mut seen, "pause_waiting", Some("last")).await;
    until_status(&mut stream, &mut seen, "paused").await;
    let cancelled = api
        .call("POST", &format!("/api/v1/workflows/{run_id}/cancel"), None)
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    let (rest, end) = stream.rest(WAIT).await;
    seen.extend(rest);
    assert_eq!(end, SseEnd::Ended, "the stream ends after the final status");
    (run_id, seen)
}

async fn fingerprint(api: &mut Api, run_id: &str) -> Value {
    let record = api
        .call("GET", &format!("/api/v1/workflows/{run_id}"), None)
        .await;
    record.json()["fingerprint"].clone()
}

async fn the_whole_story_in_order(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let (run_id, live) = story(&mut api).await;
    assert_numbered(&live);
    assert_eq!(
        kinds(&live),
        [
            "status running",
            "step_journaled a",
            "step_started a",
            "artifact a",
            "step_finished a",
            "step_journaled file",
            "step_started file",
            "artifact file",
            "step_finished file",
            "step_journaled p",
            "pause_waiting p",
            "status paused",
            "pause_resumed p",
            "step_finished p",
            "status running",
            "step_journaled review",
            "checkpoint_waiting review",
            "status waiting_approval",
            "checkpoint_decided review",
            "step_finished review",
            "status running",
            "step_journaled last",
            "pause_waiting last",
            "status paused",
            "cancel_requested",
            "status cancelling",
            "status cancelled",
        ],
        "{live:#?}"
    );
    let by_kind = |kind: &str, step: &str| {
        live.iter()
            .find(|e| e.event == kind && e.data["step_id"] == step)
            .unwrap_or_else(|| panic!("no {kind} {step}"))
            .data
            .clone()
    };
    let agent = by_kind("step_finished", "a");
    assert_eq!(agent["status"], "completed");
    assert_eq!(agent["total_tokens"], 42);
    assert!(agent["child_run_id"].is_string(), "{agent}");
    assert!(live.iter().all(|e| e.data["run_id"] == run_id.as_str()));
    assert_eq!(agent["output_bytes"], "\"drafted\"".len());
    assert!(
        agent["duration_ms"].as_i64().is_some_and(|ms| ms >= 0),
        "{agent}"
    );
    let file = by_kind("artifact", "file");
    assert_eq!(file["bytes"], "hello report".len());
    assert_eq!(file["name"], "/mnt/user-data/outputs/report.txt");
    let decided = by_kind("checkpoint_decided", "review");
    assert_eq!(decided["decision"], "approve");
    assert_eq!(decided["by"], crate::http_api::ADMIN);
    assert_eq!(decided["comment"], "fine");

    // Replayed from the start, the stream is the same, and it ends again at the final status.
    let mut replay = api.stream(&events_path(&run_id), &[]).await;
    let (replayed, end) = replay.rest(WAIT).await;
    assert_eq!(end, SseEnd::Ended);
    assert_eq!(replayed, live);
    // After the last event there is nothing more, and the stream ends at once.
    let last = live.len().to_string();
    let mut after = api
        .stream(&events_path(&run_id), &[("last-event-id", &last)])
        .await;
    assert_eq!(after.rest(WAIT).await, (Vec::new(), SseEnd::Ended));
    // A delete takes the events with it.
    let deleted = api
        .call("DELETE", &format!("/api/v1/workflows/{run_id}"), None)
        .await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let count = db
        .sql(&format!(
            "SELECT count(*) FROM workflow_events WHERE workflow = '{run_id}'"
        ))
        .await;
    assert_eq!(count.as_deref(), Some("0"));
}

mod the_whole_story_in_order {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::the_whole_story_in_order(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::the_whole_story_in_order(true).await
    }
}

/// A workflow that waits at a pause, then runs three steps and completes.
const PAUSED_THEN_DONE: &str = r#"
    await agent({stepId: "before", agentRef: "scripted", task: {output: "one"}});
    await pause({stepId: "p"});
    for (const step of ["x", "y", "z"]) {
        await agent({stepId: step, agentRef: "scripted", task: {output: step}});
    }
    return "done";
"#;

async fn resume(api: &mut Api, run_id: &str, step_id: &str) {
    let fingerprint = fingerprint(api, run_id).await;
    let resumed = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/resume"),
            Some(json!({"step_id": step_id, "attempt": 1, "fingerprint": fingerprint})),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
}

/// A client that read part of a workflow's events, lost its connection, and comes back with
/// `Last-Event-ID` to `other` (another node of the cluster on PostgreSQL; on the single-node
/// embedded default, the same node) gets exactly the events it missed.
async fn a_resumed_stream_gets_exactly_what_it_missed(postgres: bool) {
    let db = Db::new(postgres).await;
    let first = Node::start(&db, &[]);
    let second = postgres.then(|| Node::start(&db, &[]));
    let mut api = initialize(&first).await;
    let run_id = launch(&mut api, PAUSED_THEN_DONE).await;
    let mut stream = api.stream(&events_path(&run_id), &[]).await;
    let mut before = Vec::new();
    until_status(&mut stream, &mut before, "paused").await;
    drop(stream);

    // Everything after this happens while the client is away, through the other node.
    let mut other = match &second {
        Some(node) => {
            let mut other = node.api();
            other.cookies = api.cookies.clone();
            other
        }
        None => api.clone(),
    };
    resume(&mut other, &run_id, "p").await;
    let last = before.last().map(|e| e.id).expect("events before the drop");
    let mut resumed = other
        .stream(
            &events_path(&run_id),
            &[("last-event-id", &last.to_string())],
        )
        .await;
    assert_eq!(resumed.status, 200);
    let (after, end) = resumed.rest(WAIT).await;
    assert_eq!(end, SseEnd::Ended);
    assert_eq!(after.first().map(|e| e.id), Some(last + 1), "{after:#?}");
    assert_eq!(
        after.last().map(|e| e.data["status"].clone()),
        Some(json!("completed"))
    );

    let mut whole: Vec<Sse> = before.clone();
    whole.extend(after);
    assert_numbered(&whole);
    let (replayed, _) = other
        .stream(&events_path(&run_id), &[])
        .await
        .rest(WAIT)
        .await;
    assert_eq!(whole, replayed, "nothing twice, nothing lost");
    // `?after=` is the same as the header.
    let (from_query, _) = api
        .stream(&format!("{}?after={last}", events_path(&run_id)), &[])
        .await
        .rest(WAIT)
        .await;
    assert_eq!(from_query, whole[before.len()..]);
}

mod a_resumed_stream_gets_exactly_what_it_missed {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::a_resumed_stream_gets_exactly_what_it_missed(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::a_resumed_stream_gets_exactly_what_it_missed(true).await
    }
}

/// A stream on node B of a workflow owned by node A hears A's step events from the change bus:
/// the stream's fallback read (`events.poll_ms`) is an hour, and after the resume the workflow
/// changes no status while its steps start and finish (a second later, then ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_on_another_node_hears_step_events_with_no_fallback_read() {
    let db = Db::new(true).await;
    let hour = [("REINS_EVENTS__POLL_MS", "3600000".to_owned())];
    let owner = Node::start(&db, &hour);
    let other = Node::start(&db, &hour);
    let mut api = initialize(&owner).await;
    let run_id = launch(
        &mut api,
        r#"
        await pause({stepId: "p"});
        await agent({stepId: "quick", agentRef: "scripted", task: {sleep_ms: 1000}});
        await agent({stepId: "slow", agentRef: "scripted", task: {sleep_ms: 600000}});
        return "never";
    "#,
    )
    .await;
    let mut on_other = other.api();
    on_other.cookies = api.cookies.clone();
    let mut stream = on_other.stream(&events_path(&run_id), &[]).await;
    assert_eq!(stream.status, 200);
    let mut seen = Vec::new();
    until_status(&mut stream, &mut seen, "paused").await;
    resume(&mut api, &run_id, "p").await;
    until(&mut stream, &mut seen, "step_finished", Some("quick")).await;
    until(&mut stream, &mut seen, "step_started", Some("slow")).await;
    let cancelled = api
        .call("POST", &format!("/api/v1/workflows/{run_id}/cancel"), None)
        .await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
}

/// A client that reads nothing while its workflow writes hundreds of events is disconnected once
/// its stream's buffer (`events.stream_buffer_bytes_max`) stays full for
/// `events.stream_stall_ms`; the stream's place under `events.streams_max` is given back.
async fn a_client_that_reads_nothing_is_cut_off(postgres: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_EVENTS__STREAM_BUFFER_BYTES_MAX", "4096".into()),
            ("REINS_EVENTS__STREAM_STALL_MS", "1000".into()),
            ("REINS_EVENTS__STREAMS_MAX", "1".into()),
            // hyper's own write buffer follows the head limit (8 KiB at least).
            ("REINS_HTTP__HEAD_BYTES_MAX", "8192".into()),
        ],
    );
    let mut api = initialize(&node).await;
    // Twelve checkpoints, each decided with a comment of 900 KB that its event carries: more than
    // the kernel holds for one connection (loopback's send buffer grows to a few MiB).
    const CHECKPOINTS: usize = 12;
    let run_id = launch(
        &mut api,
        r#"const a = await agent({stepId: "a", agentRef: "scripted", task: {output: "x"}});
           for (let i = 0; i < 12; i++) {
               await humanCheckpoint({stepId: "c" + i, sourceStepId: "a",
                                      artifactVersion: a.artifactVersion});
           }
           return "done";"#,
    )
    .await;
    // A socket whose receive buffer is small, so the kernel holds little for it.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("receive buffer");
    let mut slow = socket.connect(node.addr).await.expect("connect");
    let cookie = api
        .cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ");
    slow.write_all(
        format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\nCookie: {cookie}\r\n\r\n",
            events_path(&run_id),
            node.addr
        )
        .as_bytes(),
    )
    .await
    .expect("request");

    // While it holds the node's only stream, another is refused. It holds it once its answer
    // has begun (looked at, not read: the client still reads nothing).
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let mut head = [0u8; 12];
        let seen = slow.peek(&mut head).await.expect("peek");
        if &head[..seen] == b"HTTP/1.1 200" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream never answered: {:?}",
            String::from_utf8_lossy(&head[..seen])
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let busy = api.stream(&events_path(&run_id), &[]).await;
    assert_eq!(busy.status, 503);

    let comment = "c".repeat(900_000);
    for index in 0..CHECKPOINTS {
        let step_id = format!("c{index}");
        let deadline = tokio::time::Instant::now() + WAIT;
        let decided = loop {
            let decided = api
                .call(
                    "POST",
                    &format!("/api/v1/workflows/{run_id}/decide"),
                    Some(
                        json!({"step_id": step_id, "attempt": 1, "decision": "approve",
                                "artifact_version": 1, "comment": comment}),
                    ),
                )
                .await;
            // 409 until the script has reached the checkpoint.
            if decided.status != 409 || tokio::time::Instant::now() > deadline {
                break decided;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(decided.status, 200, "{decided:?}");
    }
    crate::http_api::wait_for(&mut api, &run_id, "completed").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let metrics = api.call("GET", "/metrics", None).await;
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        if text.contains("reins_event_streams_disconnected_total 1") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not disconnected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // What the kernel held for it arrives, then the connection's end: never the final event.
    let mut received = Vec::new();
    let read = tokio::time::timeout(WAIT, slow.read_to_end(&mut received)).await;
    assert!(read.is_ok(), "the connection was not closed");
    let received = String::from_utf8_lossy(&received);
    assert!(received.starts_with("HTTP/1.1 200"), "{received:.200}");
    let finished =
        format!("\"previous\":\"running\",\"run_id\":\"{run_id}\",\"status\":\"completed\"");
    assert!(
        !received.contains(&finished),
        "the stream was not cut short"
    );
    // Its place is free again.
    let mut again = api.stream(&events_path(&run_id), &[]).await;
    assert_eq!(again.status, 200);
    let (events, end) = again.rest(WAIT).await;
    assert_eq!(end, SseEnd::Ended);
    assert_numbered(&events);
}

mod a_client_that_reads_nothing_is_cut_off {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::a_client_that_reads_nothing_is_cut_off(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::a_client_that_reads_nothing_is_cut_off(true).await
    }
}

/// Another user's workflow stream is 404 (a malformed id 400); a user's feed shows the status changes of their own
/// workflows only, an admin's everyone's.
async fn streams_and_the_feed_belong_to_their_users(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut admin = initialize(&node).await;
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "user@example.com", "password": "another long password"})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let mut user = node.api();
    let signed_in = user
        .login("user@example.com", "another long password")
        .await;
    assert_eq!(signed_in.status, 200, "{signed_in:?}");

    // From now on: the feed without an id starts at the present.
    let mut admin_feed = admin.stream("/api/v1/events", &[]).await;
    assert_eq!(admin_feed.status, 200);
    let mut user_feed = user.stream("/api/v1/events", &[]).await;
    assert_eq!(user_feed.status, 200);

    let admins = launch(&mut admin, "return 1;").await;
    let users = launch(&mut user, "return 2;").await;
    let refused = user.stream(&events_path(&admins), &[]).await;
    assert_eq!(refused.status, 404);
    let unknown = user.stream(&events_path("no-such-workflow"), &[]).await;
    assert_eq!(unknown.status, 404);
    // A path id outside the id grammar is refused before anything is looked up, as on every
    // other workflow route.
    let malformed = user.stream(&events_path("not!an*id"), &[]).await;
    assert_eq!(malformed.status, 400);
    let bad = user
        .stream(&events_path(&users), &[("last-event-id", "-1")])
        .await;
    assert_eq!(bad.status, 400);

    let feed_of = async |feed: &mut SseStream, count: usize| {
        let mut events = Vec::new();
        while events.len() < count {
            events.push(feed.next(WAIT).await.expect("a feed event"));
        }
        // Nothing else comes.
        assert_eq!(
            feed.next(Duration::from_millis(500)).await,
            Err(SseEnd::Quiet)
        );
        events
    };
    let seen = feed_of(&mut user_feed, 2).await;
    assert!(
        seen.iter().all(|e| e.data["run_id"] == users.as_str()),
        "{seen:#?}"
    );
    assert_eq!(
        seen.iter()
            .map(|e| e.data["status"].clone())
            .collect::<Vec<_>>(),
        [json!("running"), json!("completed")]
    );
    let everyone = feed_of(&mut admin_feed, 4).await;
    for run_id in [&admins, &users] {
        assert_eq!(
            everyone
                .iter()
                .filter(|e| e.data["run_id"] == run_id.as_str())
                .count(),
            2,
            "{everyone:#?}"
        );
    }
    // Feed ids increase, and a feed resumed after one of them starts right after it.
    assert!(everyone.windows(2).all(|w| w[0].id < w[1].id));
    let first = everyone[0].id.to_string();
    let mut resumed = admin
        .stream("/api/v1/events", &[("last-event-id", &first)])
        .await;
    let again = feed_of(&mut resumed, 3).await;
    assert_eq!(again, everyone[1..]);
}

mod streams_and_the_feed_belong_to_their_users {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::streams_and_the_feed_belong_to_their_users(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::streams_and_the_feed_belong_to_their_users(true).await
    }
}

/// `reins watch` through the real binary: it prints each event on a line as it commits and
/// exits when the workflow ends, with `run --wait`'s code.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reins_watch_prints_the_events_and_exits_at_the_end() {
    use crate::cli::{cli, code};
    use crate::http_api::ADMIN;

    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let init = cli(home, &node, &["init", "--email", ADMIN]);
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));
    std::fs::write(home.join("flow.js"), PAUSED_THEN_DONE).expect("script");
    let run = cli(home, &node, &["run", "flow.js"]);
    assert_eq!(code(&run), 0, "{}", String::from_utf8_lossy(&run.stderr));
    let run_id = String::from_utf8_lossy(&run.stdout).trim().to_owned();

    let credentials = home.join("credentials.json").display().to_string();
    let watch = crate::harness::reins_command(
        home,
        &[
            ("REINS_CLI_CREDENTIALS", credentials),
            ("REINS_CLI_URL", format!("http://{}", node.addr)),
        ],
    )
    .args(["watch", &run_id])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start reins watch");
    let watching = tokio::task::spawn_blocking(move || watch.wait_with_output());

    let mut api = node.api();
    api.login(ADMIN, crate::http_api::PASSWORD).await;
    crate::http_api::wait_for(&mut api, &run_id, "paused").await;
    let resumed = cli(home, &node, &["resume", &run_id]);
    assert_eq!(
        code(&resumed),
        0,
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );

    let output = tokio::time::timeout(WAIT, watching)
        .await
        .expect("watch exits when the workflow ends")
        .expect("join")
        .expect("output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        code(&output),
        0,
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("   1 ") && lines[0].contains(" status status=running"),
        "{stdout}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" pause_waiting step_id=p ")),
        "{stdout}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains(" step_finished step_id=z status=completed ")),
        "{stdout}"
    );
    let last = lines.last().expect("a line");
    assert!(
        last.contains(" status status=completed previous=running"),
        "{stdout}"
    );
    // Numbered 1, 2, 3, ... one line each; a step that begins to wait is followed by what it
    // waits for, on a line of its own that carries no number.
    let numbered: Vec<usize> = lines
        .iter()
        .filter_map(|line| line.split_whitespace().next()?.parse().ok())
        .collect();
    assert_eq!(
        numbered,
        (1..=numbered.len()).collect::<Vec<_>>(),
        "{stdout}"
    );
    assert!(
        lines.iter().any(|l| l.trim() == "p: waiting for a person"),
        "{stdout}"
    );

    // A failed workflow ends `watch` with 2, and `--json` prints each event's JSON.
    std::fs::write(home.join("fails.js"), "throw new Error('no');").expect("script");
    let run = cli(home, &node, &["run", "fails.js"]);
    let failed_id = String::from_utf8_lossy(&run.stdout).trim().to_owned();
    let watched = cli(home, &node, &["watch", &failed_id, "--json"]);
    assert_eq!(
        code(&watched),
        2,
        "{}",
        String::from_utf8_lossy(&watched.stderr)
    );
    let events: Vec<Value> = String::from_utf8_lossy(&watched.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON event per line"))
        .collect();
    assert_eq!(
        events.last().map(|e| e["status"].clone()),
        Some(json!("failed"))
    );
}

/// A step's agent asking a person and the answer are events of the workflow, with who answered.
async fn an_agents_approval_request_and_its_answer_are_events(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let run_id = launch(
        &mut api,
        r#"const r = await agent({stepId: "ask", agentRef: "scripted", task: {
               ask_approval: {request_id: "deploy-1", actions: [{tool: "deploy"}]}}});
           return r.approval.answer.decision;"#,
    )
    .await;
    let mut stream = api.stream(&events_path(&run_id), &[]).await;
    let mut seen = Vec::new();
    until(&mut stream, &mut seen, "approval_requested", Some("ask")).await;
    let asked = seen.last().expect("the request").data.clone();
    assert_eq!(asked["request_id"], "deploy-1");
    assert_eq!(asked["attempt"], 1);
    let answered = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run_id}/steps/ask/answer"),
            Some(json!({"decision": "approve", "comment": "go"})),
        )
        .await;
    assert_eq!(answered.status, 200, "{answered:?}");
    let (rest, end) = stream.rest(WAIT).await;
    seen.extend(rest);
    assert_eq!(end, SseEnd::Ended);
    assert_numbered(&seen);
    let answer = seen
        .iter()
        .find(|e| e.event == "approval_answered")
        .unwrap_or_else(|| panic!("no answer: {seen:#?}"));
    assert_eq!(answer.data["decision"], "approve");
    assert_eq!(answer.data["by"], crate::http_api::ADMIN);
    assert_eq!(answer.data["child_run_id"], asked["child_run_id"]);
    assert!(seen.iter().all(|e| e.data["run_id"] == run_id.as_str()));
    assert_eq!(
        kinds(&seen),
        [
            "status running",
            "step_journaled ask",
            "step_started ask",
            "approval_requested ask",
            "approval_answered ask",
            "artifact ask",
            "step_finished ask",
            "status completed",
        ]
    );
}

mod an_agents_approval_request_and_its_answer_are_events {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::an_agents_approval_request_and_its_answer_are_events(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::an_agents_approval_request_and_its_answer_are_events(true).await
    }
}

/// `console.log` lines are `log` events, committed with the workflow's next write, within
/// `limits.log_events_per_workflow_max` lines and `limits.log_event_bytes_per_workflow_max`
/// bytes per workflow: the first line over either is one `log_truncated` event.
async fn console_log_lines_are_bounded_events(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_LIMITS__LOG_EVENTS_PER_WORKFLOW_MAX", "3".into()),
            (
                "REINS_LIMITS__LOG_EVENT_BYTES_PER_WORKFLOW_MAX",
                "1000".into(),
            ),
        ],
    );
    let mut api = initialize(&node).await;
    let lines = |events: &[Sse]| -> Vec<String> {
        events
            .iter()
            .filter(|e| e.event.starts_with("log"))
            .map(|e| match e.event.as_str() {
                "log" => e.data["line"].as_str().unwrap_or("?").to_owned(),
                other => other.to_owned(),
            })
            .collect()
    };

    let run_id = launch(
        &mut api,
        r#"console.log("one");
           await agent({stepId: "a", agentRef: "scripted", task: {output: 1}});
           console.log("two", {n: 2});
           console.log("three");
           await agent({stepId: "b", agentRef: "scripted", task: {output: 2}});
           console.log("four");
           console.log("five");
           return "done";"#,
    )
    .await;
    let (events, end) = api
        .stream(&events_path(&run_id), &[])
        .await
        .rest(WAIT)
        .await;
    assert_eq!(end, SseEnd::Ended);
    assert_numbered(&events);
    assert_eq!(
        lines(&events),
        ["one", "two {\"n\":2}", "three", "log_truncated"],
        "{events:#?}"
    );
    let position = |kind: &str, step: &str| {
        events
            .iter()
            .position(|e| e.event == kind && e.data["step_id"] == step)
            .expect("event")
    };
    let first = events.iter().position(|e| e.event == "log").expect("a log");
    assert!(
        first < position("step_journaled", "a"),
        "logged before the step"
    );

    // The byte bound: one long line fits, the next does not.
    let run_id = launch(
        &mut api,
        r#"console.log("x".repeat(900)); console.log("y".repeat(200)); return 1;"#,
    )
    .await;
    let (events, _) = api
        .stream(&events_path(&run_id), &[])
        .await
        .rest(WAIT)
        .await;
    assert_eq!(
        lines(&events),
        ["x".repeat(900), "log_truncated".to_owned()]
    );
}

mod console_log_lines_are_bounded_events {
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn sqlite() {
        super::console_log_lines_are_bounded_events(false).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres() {
        super::console_log_lines_are_bounded_events(true).await
    }
}

/// A stream is one long request: it ends once its caller could no longer make one. A signed-out
/// session's streams, a revoked token's stream and a disabled user's feed end at the next
/// keep-alive; an approver's feed narrows to their own workflows once they are made a user.
async fn a_stream_ends_with_its_callers_credential(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[("REINS_EVENTS__KEEPALIVE_MS", "200".into())]);
    let mut admin = initialize(&node).await;
    let ann = approver(&mut admin, "ann@example.com").await;
    let bob = approver(&mut admin, "bob@example.com").await;
    let signed_in = async |email: &str| {
        let mut api = node.api();
        let answer = api.login(email, "another long password").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        api
    };
    let mut ann_session = signed_in("ann@example.com").await;
    let mut bob_session = signed_in("bob@example.com").await;
    let paused = launch(&mut ann_session, r#"await pause({stepId: "p"}); return 1;"#).await;
    let mut token = {
        let created = ann_session
            .call("POST", "/api/v1/auth/tokens", Some(json!({"name": "t"})))
            .await;
        assert_eq!(created.status, 201, "{created:?}");
        let mut api = node.api();
        api.bearer = Some(created.json()["token"].as_str().expect("token").to_owned());
        api
    };
    let listed = ann_session.call("GET", "/api/v1/auth/tokens", None).await;
    let token_row = listed.json()["tokens"][0]["id"]
        .as_str()
        .expect("token id")
        .to_owned();

    let mut by_session = ann_session.stream(&events_path(&paused), &[]).await;
    let mut by_token = token.stream(&events_path(&paused), &[]).await;
    let mut feed = bob_session.stream("/api/v1/events", &[]).await;
    for stream in [&by_session, &by_token, &feed] {
        assert_eq!(stream.status, 200);
    }
    // Streams that outlive a few keep-alives stay open while their callers may still see.
    let quiet = Duration::from_millis(700);
    for stream in [&mut by_session, &mut by_token] {
        let (_, end) = stream.rest(quiet).await;
        assert_eq!(end, SseEnd::Quiet);
    }

    // Revoked: the token's stream ends; the session's goes on.
    let revoked = ann_session
        .call("DELETE", &format!("/api/v1/auth/tokens/{token_row}"), None)
        .await;
    assert_eq!(revoked.status, 200, "{revoked:?}");
    assert_eq!(by_token.rest(WAIT).await.1, SseEnd::Ended);
    assert_eq!(by_session.rest(quiet).await.1, SseEnd::Quiet);

    // Bob, an approver, sees Ann's workflows in his feed; made a user, he no longer does.
    // (Events of her workflows before it, such as the paused one's, may come first.)
    let anns = launch(&mut ann_session, "return 1;").await;
    loop {
        let seen = feed.next(WAIT).await.expect("an event of Ann's workflow");
        if seen.data["run_id"] == anns.as_str() {
            break;
        }
    }
    let demoted = admin
        .call(
            "PATCH",
            &format!("/api/v1/auth/users/{bob}"),
            Some(json!({"role": "user"})),
        )
        .await;
    assert_eq!(demoted.status, 200, "{demoted:?}");
    // His feed narrows at its next keep-alive. A workflow of Ann's that ended before one of his
    // began has every event before his in the feed: once his has come without hers, the feed
    // is his alone.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let anns = launch(&mut ann_session, "return 1;").await;
        crate::http_api::wait_for(&mut ann_session, &anns, "completed").await;
        let bobs = launch(&mut bob_session, "return 2;").await;
        let mut seen = Vec::new();
        loop {
            let event = feed.next(WAIT).await.expect("an event of Bob's workflow");
            let ended =
                event.data["run_id"] == bobs.as_str() && event.data["status"] == "completed";
            seen.push(event);
            if ended {
                break;
            }
        }
        if seen
            .iter()
            .all(|event| event.data["run_id"] != anns.as_str())
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "Bob's feed still shows Ann's workflows: {seen:#?}"
        );
    }

    // Disabled: Ann's session stream ends.
    let disabled = admin
        .call(
            "PATCH",
            &format!("/api/v1/auth/users/{ann}"),
            Some(json!({"disabled": true})),
        )
        .await;
    assert_eq!(disabled.status, 200, "{disabled:?}");
    assert_eq!(by_session.rest(WAIT).await.1, SseEnd::Ended);
    // Bob signs out: his feed ends too.
    let out = bob_session.call("POST", "/api/v1/auth/logout", None).await;
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(feed.rest(WAIT).await.1, SseEnd::Ended);
}

crate::harness::both!(a_stream_ends_with_its_callers_credential);

/// Creates an approver; returns their id.
async fn approver(admin: &mut Api, email: &str) -> String {
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": email, "password": "another long password",
                        "role": "approver"})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    created.json()["id"].as_str().expect("id").to_owned()
}
