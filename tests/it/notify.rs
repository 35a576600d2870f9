//! Notifications (issue 32 item 4) through the real binary: a loopback webhook receiver gets one
//! signed POST per inbox item as it enters and as it is decided, in reins' shape and Slack's;
//! again, with the same id, after the node that was sending it is killed mid-delivery; after a
//! retry when it first answers 500; and a receiver that never answers does not hold a workflow.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::net::TcpListener;

use crate::harness::{both, eventually, http_get};
use crate::http_api::{Db, Node, PASSWORD, initialize, wait_for};

const HOOK_SECRET: &str = "hook-secret-for-the-receiver";

/// How the receiver answers.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// 200 to everything.
    Take,
    /// 500 to the first request, 200 after.
    FailFirst,
    /// Never answers the first request (holds it open); 200 after.
    HoldFirst,
    /// Never answers any.
    HoldAll,
    /// Holds every request until [`Receiver::open`], then answers 200 (and 200 at once after).
    Gated,
}

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    timestamp: String,
    signature: String,
    id: String,
    body: Bytes,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// Whether `X-Reins-Signature` is the HMAC-SHA256 of `timestamp.body` under the secret.
    fn verifies(&self) -> bool {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(HOOK_SECRET.as_bytes()).expect("any key length");
        mac.update(self.timestamp.as_bytes());
        mac.update(b".");
        mac.update(&self.body);
        let hex: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        self.signature == format!("sha256={hex}")
    }
}

/// A webhook receiver on loopback that records every request.
struct Receiver {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Received>>>,
    /// What [`Mode::Gated`] waits for.
    gate: tokio::sync::watch::Sender<bool>,
    _task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start(mode: Mode) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
        let recorded = Arc::clone(&seen);
        let (gate, opened) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let recorded = Arc::clone(&recorded);
                let opened = opened.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let recorded = Arc::clone(&recorded);
                        let mut opened = opened.clone();
                        async move {
                            let header = |name: &str| {
                                request
                                    .headers()
                                    .get(name)
                                    .and_then(|value| value.to_str().ok())
                                    .unwrap_or("")
                                    .to_owned()
                            };
                            let (timestamp, signature, id) = (
                                header("x-reins-timestamp"),
                                header("x-reins-signature"),
                                header("x-reins-id"),
                            );
                            let body = request.into_body().collect().await?.to_bytes();
                            let index = {
                                let mut seen = recorded.lock().expect("lock");
                                seen.push(Received {
                                    timestamp,
                                    signature,
                                    id,
                                    body,
                                });
                                seen.len()
                            };
                            let status = match mode {
                                Mode::Take => 200,
                                Mode::FailFirst if index == 1 => 500,
                                Mode::FailFirst => 200,
                                Mode::HoldFirst if index > 1 => 200,
                                Mode::HoldFirst | Mode::HoldAll => {
                                    std::future::pending::<()>().await;
                                    200
                                }
                                Mode::Gated => {
                                    let _ = opened.wait_for(|open| *open).await;
                                    200
                                }
                            };
                            let mut response = Response::new(Full::new(Bytes::from_static(b"ok")));
                            *response.status_mut() =
                                hyper::StatusCode::from_u16(status).expect("a status");
                            Ok::<_, hyper::Error>(response)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Receiver {
            addr,
            seen,
            gate,
            _task: task,
        }
    }

    /// Answers the requests a [`Mode::Gated`] receiver holds, and every later one at once.
    fn open(&self) {
        self.gate.send_replace(true);
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    fn seen(&self) -> Vec<Received> {
        self.seen.lock().expect("lock").clone()
    }

    /// Waits until the receiver has got `count` requests; answers them.
    async fn wait_for(&self, count: usize) -> Vec<Received> {
        eventually(
            Duration::from_secs(30),
            "the webhook's requests",
            async || self.seen().len() >= count,
        )
        .await;
        self.seen()
    }
}

/// A configuration file in `dir` with these webhooks (`(url, format)`) and bounds.
fn config(dir: &Path, hooks: &[(String, &str)], bounds: &str) -> String {
    let mut text = format!("[notifications]\npublic_url = \"https://reins.example\"\n{bounds}\n");
    for (url, format) in hooks {
        text.push_str(&format!(
            "[[notify]]\nurl = \"{url}\"\nsecret = \"{HOOK_SECRET}\"\nformat = \"{format}\"\n"
        ));
    }
    let path = dir.join("notify.toml");
    std::fs::write(&path, text).expect("write the configuration");
    path.display().to_string()
}

/// The rows still in the outbox.
async fn outbox(db: &Db) -> i64 {
    db.sql("SELECT count(*) FROM notify_outbox")
        .await
        .and_then(|count| count.parse().ok())
        .expect("a count")
}

const PAUSED: &str = "await pause({stepId: 'p', message: 'check the figures'}); return 1;";

both!(each_inbox_item_is_notified_once_as_it_enters_and_as_it_is_decided);
async fn each_inbox_item_is_notified_once_as_it_enters_and_as_it_is_decided(postgres: bool) {
    let db = Db::new(postgres).await;
    let (reins, slack) = (
        Receiver::start(Mode::Take).await,
        Receiver::start(Mode::Take).await,
    );
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(
        files.path(),
        &[(reins.url(), "reins"), (slack.url(), "slack")],
        "",
    );
    let node = Node::start(&db, &[("REINS_CONFIG", path)]);
    let mut api = initialize(&node).await;
    let launched = api.action("launch", json!({"script": PAUSED})).await;
    let run = launched.json()["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    let paused = wait_for(&mut api, &run, "paused").await;

    let entered = reins.wait_for(1).await;
    let body = entered[0].json();
    assert!(entered[0].verifies(), "the signature does not verify");
    assert_eq!(entered[0].id, body["id"].as_str().expect("id"));
    assert_eq!(body["kind"], "entered");
    assert_eq!(body["workflow_id"], run.as_str());
    assert_eq!(
        (&body["step_id"], &body["attempt"], &body["waits_for"]),
        (&json!("p"), &json!(1), &json!("pause"))
    );
    assert_eq!(body["message"], "check the figures");
    assert_eq!(
        body["link"],
        format!("https://reins.example/#/workflows/{run}")
    );
    assert!(
        body["at"].as_str().is_some_and(|at| at.ends_with('Z')),
        "{body}"
    );

    let resumed = api
        .action(
            "resume",
            json!({"run_id": run, "fingerprint": paused["fingerprint"],
                   "step_id": "p", "attempt": 1, "input": {"figures": "checked"}}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_for(&mut api, &run, "completed").await;
    let both = reins.wait_for(2).await;
    let decided = both[1].json();
    assert!(both[1].verifies());
    assert_eq!(
        (&decided["kind"], &decided["step_id"], &decided["waits_for"]),
        (&json!("decided"), &json!("p"), &json!("pause"))
    );
    assert!(decided["by"].is_string(), "{decided}");
    // Issue 40: a pause's decision carries what it was resumed with.
    assert_eq!(decided["input"], json!({"figures": "checked"}), "{decided}");
    assert_ne!(decided["id"], body["id"]);

    let slack = slack.wait_for(2).await;
    for received in &slack {
        assert!(received.verifies());
        let text = received.json();
        assert_eq!(text.as_object().map(|o| o.len()), Some(1), "{text}");
        assert!(
            text["text"]
                .as_str()
                .is_some_and(|t| t.contains(&run) && t.contains("`p`")),
            "{text}"
        );
    }
    assert!(
        slack[0].json()["text"]
            .as_str()
            .is_some_and(|t| t.contains("check the figures"))
    );

    eventually(Duration::from_secs(60), "the outbox to empty", async || {
        outbox(&db).await == 0
    })
    .await;
    assert_eq!(
        reins.seen().len(),
        2,
        "more than one notification per change"
    );
    let (status, metrics) = http_get(node.addr, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("reins_notifications_delivered_total{kind=\"entered\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("reins_notify_outbox_backlog"), "{metrics}");
}

both!(a_notification_whose_node_was_killed_mid_delivery_is_delivered_again_with_its_id);
async fn a_notification_whose_node_was_killed_mid_delivery_is_delivered_again_with_its_id(
    postgres: bool,
) {
    let db = Db::new(postgres).await;
    let receiver = Receiver::start(Mode::HoldFirst).await;
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(
        files.path(),
        &[(receiver.url(), "reins")],
        "request_timeout_ms = 3000",
    );
    let mut sender = Node::start(&db, &[("REINS_CONFIG", path.clone())]);
    let mut api = initialize(&sender).await;
    let run = crate::http_api::launch(&mut api, PAUSED).await;
    let held = receiver.wait_for(1).await;
    // The request is held open: the node that sent it dies before it hears an answer. On
    // PostgreSQL another node delivers it; on SQLite (one node per file) the node started again.
    sender.signal(libc::SIGKILL);
    assert!(
        sender.process.wait_exit(Duration::from_secs(60)).is_some(),
        "not killed"
    );
    let other = Node::start(&db, &[("REINS_CONFIG", path)]);
    let again = receiver.wait_for(2).await;
    assert_eq!(again[1].id, held[0].id, "not the same notification");
    assert_eq!(again[1].json()["id"], held[0].json()["id"]);
    assert_eq!(again[1].json()["workflow_id"], run.as_str());
    assert!(again[1].verifies());
    eventually(Duration::from_secs(60), "the outbox to empty", async || {
        outbox(&db).await == 0
    })
    .await;
    drop(other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_answering_500_gets_it_again_after_a_backoff() {
    let db = Db::new(false).await;
    let receiver = Receiver::start(Mode::FailFirst).await;
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(
        files.path(),
        &[(receiver.url(), "reins")],
        "backoff_first_ms = 200",
    );
    let node = Node::start(&db, &[("REINS_CONFIG", path)]);
    let mut api = initialize(&node).await;
    crate::http_api::launch(&mut api, PAUSED).await;
    let seen = receiver.wait_for(2).await;
    assert_eq!(seen[0].id, seen[1].id);
    assert_eq!(seen[0].body, seen[1].body, "a retry sends the same body");
    eventually(Duration::from_secs(60), "the outbox to empty", async || {
        outbox(&db).await == 0
    })
    .await;
    let (_, metrics) = http_get(node.addr, "/metrics").expect("metrics");
    for line in [
        "reins_notification_attempts_failed_total{kind=\"entered\"} 1",
        "reins_notifications_delivered_total{kind=\"entered\"} 1",
    ] {
        assert!(metrics.contains(line), "no {line:?} in {metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_that_never_answers_does_not_hold_a_workflow() {
    let db = Db::new(false).await;
    let receiver = Receiver::start(Mode::HoldAll).await;
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(
        files.path(),
        &[(receiver.url(), "reins")],
        "request_timeout_ms = 600000",
    );
    let node = Node::start(&db, &[("REINS_CONFIG", path)]);
    let mut api = initialize(&node).await;
    let run = crate::http_api::launch(&mut api, PAUSED).await;
    let paused = wait_for(&mut api, &run, "paused").await;
    receiver.wait_for(1).await;
    let resumed = api
        .action(
            "resume",
            json!({"run_id": run, "fingerprint": paused["fingerprint"],
                                 "step_id": "p", "attempt": 1}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_for(&mut api, &run, "completed").await;
    assert!(outbox(&db).await >= 1, "the pending notifications are kept");
    drop(node);
}

/// A pause whose deadline answered it: notified as it entered, then as `timed_out` (by
/// `timeout`), not as a person's decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_its_deadline_answered_is_notified_as_timed_out() {
    let db = Db::new(false).await;
    let receiver = Receiver::start(Mode::Take).await;
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(files.path(), &[(receiver.url(), "reins")], "");
    let node = Node::start(&db, &[("REINS_CONFIG", path)]);
    let mut api = initialize(&node).await;
    let run = crate::http_api::launch(
        &mut api,
        "return await pause({stepId: 'p', timeoutMs: 300, onTimeout: {resume: 'late'}});",
    )
    .await;
    wait_for(&mut api, &run, "completed").await;
    let seen = receiver.wait_for(2).await;
    let kinds: Vec<Value> = seen
        .iter()
        .map(|received| received.json()["kind"].clone())
        .collect();
    assert_eq!(kinds, [json!("entered"), json!("timed_out")]);
    assert_eq!(seen[1].json()["step_id"], "p");
    // Issue 40: it says who decided and what the pause resumed with.
    assert_eq!(
        (&seen[1].json()["by"], &seen[1].json()["input"]),
        (&json!("timeout"), &json!("late"))
    );
}

both!(a_checkpoint_its_deadline_decided_says_by_timeout_and_what_was_decided);
/// Issue 40: a checkpoint its deadline decided was notified `timed_out` without `by` (an agent
/// approval's had it), and its Slack text did not say what was decided.
async fn a_checkpoint_its_deadline_decided_says_by_timeout_and_what_was_decided(postgres: bool) {
    let db = Db::new(postgres).await;
    let (reins, slack) = (
        Receiver::start(Mode::Take).await,
        Receiver::start(Mode::Take).await,
    );
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(
        files.path(),
        &[(reins.url(), "reins"), (slack.url(), "slack")],
        "",
    );
    let node = Node::start(&db, &[("REINS_CONFIG", path)]);
    let mut api = initialize(&node).await;
    let run = crate::http_api::launch(
        &mut api,
        r#"const draft = await agent({stepId: "draft", agentRef: "scripted", task: {output: "x"}});
           const review = await humanCheckpoint({stepId: "review", sourceStepId: "draft",
             artifactVersion: draft.artifactVersion, timeoutMs: 300, onReject: "return"});
           return review.decision;"#,
    )
    .await;
    wait_for(&mut api, &run, "completed").await;
    let seen = reins.wait_for(2).await;
    let timed_out = seen[1].json();
    assert_eq!(
        (&timed_out["kind"], &timed_out["by"], &timed_out["decision"]),
        (&json!("timed_out"), &json!("timeout"), &json!("reject")),
        "{timed_out}"
    );
    let texts = slack.wait_for(2).await;
    let text = texts[1].json()["text"].as_str().unwrap_or("").to_owned();
    assert!(
        text.contains("`review` (checkpoint) timed out: its deadline decided reject"),
        "{text}"
    );
}

/// Issue 40: enabling `[[notify]]` on a node with history sent every notification recorded
/// before it was configured. A node without webhooks records a pause; a node of the same
/// cluster then starts with one: the webhook is sent the pause that comes after, and its
/// decision, never the one from before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_webhook_is_sent_what_comes_after_it_was_configured_not_what_came_before() {
    let db = Db::new(true).await;
    let quiet = Node::start(&db, &[]);
    let mut api = initialize(&quiet).await;
    let old = crate::http_api::launch(&mut api, PAUSED).await;
    wait_for(&mut api, &old, "paused").await;
    assert_eq!(outbox(&db).await, 1, "the old pause is in the outbox");

    let receiver = Receiver::start(Mode::Take).await;
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(files.path(), &[(receiver.url(), "reins")], "");
    let notifying = Node::start(&db, &[("REINS_CONFIG", path)]);
    eventually(
        Duration::from_secs(30),
        "the webhook to be configured",
        async || {
            db.sql("SELECT count(*) FROM notify_targets")
                .await
                .as_deref()
                == Some("1")
        },
    )
    .await;
    let new = crate::http_api::launch(&mut api, PAUSED).await;
    let paused = wait_for(&mut api, &new, "paused").await;
    let resumed = api
        .action(
            "resume",
            json!({"run_id": new, "fingerprint": paused["fingerprint"],
                   "step_id": "p", "attempt": 1}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_for(&mut api, &new, "completed").await;
    // The oldest notification is claimed first: had the old pause been the webhook's, it would
    // have come before both of these.
    let seen = receiver.wait_for(2).await;
    let sent: Vec<(Value, Value)> = seen
        .iter()
        .map(|received| {
            (
                received.json()["workflow_id"].clone(),
                received.json()["kind"].clone(),
            )
        })
        .collect();
    assert_eq!(
        sent,
        [
            (json!(new), json!("entered")),
            (json!(new), json!("decided"))
        ]
    );
    drop(notifying);
}

/// A pause with `remindAfterMs` is notified again as `overdue` at its time, while it is dormant
/// (nothing wakes it for that), once; then as decided when a person resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_past_its_reminder_is_notified_overdue_once_even_while_dormant() {
    let db = Db::new(false).await;
    let receiver = Receiver::start(Mode::Take).await;
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(files.path(), &[(receiver.url(), "reins")], "");
    let node = Node::start(
        &db,
        &[
            ("REINS_CONFIG", path),
            ("REINS_DORMANT_AFTER_MS", "200".to_owned()),
        ],
    );
    let mut api = initialize(&node).await;
    let launched_at = std::time::Instant::now();
    let run = crate::http_api::launch(
        &mut api,
        "return await pause({stepId: 'p', message: 'sign here', remindAfterMs: 1500});",
    )
    .await;
    let paused = wait_for(&mut api, &run, "paused").await;
    crate::dormant::goes_dormant(&db, &mut api, &run).await;
    let seen = receiver.wait_for(2).await;
    assert!(
        launched_at.elapsed() >= Duration::from_millis(1_500),
        "overdue before its time"
    );
    let overdue = seen[1].json();
    assert_eq!(
        (&overdue["kind"], &overdue["step_id"], &overdue["message"]),
        (&json!("overdue"), &json!("p"), &json!("sign here"))
    );
    assert_eq!(overdue["id"], format!("{run}:overdue:p:1"));
    assert!(seen[1].verifies());
    // Still dormant: the reminder woke nothing.
    crate::dormant::goes_dormant(&db, &mut api, &run).await;

    let resumed = api
        .action(
            "resume",
            json!({"run_id": run, "fingerprint": paused["fingerprint"],
                   "step_id": "p", "attempt": 1}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    wait_for(&mut api, &run, "completed").await;
    receiver.wait_for(3).await;
    // Two notifier polls more: nothing else comes.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let kinds: Vec<Value> = receiver
        .seen()
        .iter()
        .map(|received| received.json()["kind"].clone())
        .collect();
    assert_eq!(
        kinds,
        [json!("entered"), json!("overdue"), json!("decided")]
    );
}

/// How many `pause_waiting` events the database holds: inbox items entered, so notified.
async fn entered(db: &Db) -> i64 {
    db.sql("SELECT count(*) FROM workflow_events WHERE kind = 'pause_waiting'")
        .await
        .and_then(|count| count.parse().ok())
        .expect("a count")
}

/// Issue 39 item 4: one user's burst of pauses and a webhook that never answers delayed another
/// user's notification behind the whole burst (every batch took the oldest rows and waited for
/// the hung webhook), and flooded the healthy webhook with duplicates (a batch's claim lapsed
/// before it settled, and the rows were taken and posted again). Here alice's two workflows
/// enter 24 pauses while the healthy webhook holds its first requests; bob's one pause enters
/// after them; then the healthy webhook answers. Bob's notification reaches it among the first
/// few (owners and workflows take turns), each id reaches it exactly once, and the hung
/// webhook's failed attempts and retries (it gets bob's id again) cost it nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_users_burst_and_a_hung_webhook_delay_nobody_and_duplicate_nothing() {
    const PAUSES: i64 = 12;
    let db = Db::new(false).await;
    let (healthy, hung) = (
        Receiver::start(Mode::Gated).await,
        Receiver::start(Mode::HoldAll).await,
    );
    let files = tempfile::tempdir().expect("temp dir");
    let path = config(
        files.path(),
        &[(healthy.url(), "reins"), (hung.url(), "reins")],
        "request_timeout_ms = 10000\nbackoff_first_ms = 200\nbatch_max = 4",
    );
    let node = Node::start(&db, &[("REINS_CONFIG", path)]);
    let mut alice = initialize(&node).await;
    crate::users::create(&mut alice, "bob@example.com", None).await;
    let mut bob = crate::users::signed_in(&node, "bob@example.com", PASSWORD).await;
    let burst = format!(
        "await parallel(Array.from({{length: {PAUSES}}}, (_, i) => () => \
         pause({{stepId: 'p' + i}}))); return 1;"
    );
    for _ in 0..2 {
        crate::http_api::launch(&mut alice, &burst).await;
    }
    eventually(
        Duration::from_secs(60),
        "alice's burst to enter",
        async || entered(&db).await == 2 * PAUSES,
    )
    .await;
    let bobs = crate::http_api::launch(&mut bob, PAUSED).await;
    eventually(
        Duration::from_secs(60),
        "bob's pause to enter",
        async || entered(&db).await == 2 * PAUSES + 1,
    )
    .await;
    healthy.open();

    // Bob's notification reaches the healthy webhook among the first few, long before the burst
    // is through (it came after the whole burst, and after its duplicates, before).
    eventually(
        Duration::from_secs(60),
        "bob's notification, or eight others, to reach the healthy webhook",
        async || {
            let seen = healthy.seen();
            seen.len() >= 8 || seen.iter().any(|received| received.id.starts_with(&bobs))
        },
    )
    .await;
    let order: Vec<String> = healthy
        .seen()
        .iter()
        .map(|received| received.id.clone())
        .collect();
    let bobs_place = order.iter().position(|id| id.starts_with(&bobs));
    assert!(
        bobs_place.is_some_and(|place| place < 4),
        "bob's notification came after more of alice's burst than her first few: {order:?}"
    );

    let total = usize::try_from(2 * PAUSES + 1).expect("a small count");
    let ids = |seen: &[Received]| {
        let mut ids: Vec<String> = seen.iter().map(|received| received.id.clone()).collect();
        ids.sort();
        ids.dedup();
        ids
    };
    eventually(
        Duration::from_secs(60),
        "every notification to reach the healthy webhook",
        async || ids(&healthy.seen()).len() >= total,
    )
    .await;
    // The hung webhook is asked bob's notification again: its attempt failed and was settled
    // (attempts advance), and it was retried after its backoff.
    eventually(
        Duration::from_secs(60),
        "the hung webhook to be asked bob's notification again",
        async || {
            hung.seen()
                .iter()
                .filter(|received| received.id.starts_with(&bobs))
                .count()
                >= 2
        },
    )
    .await;

    let seen = healthy.seen();
    let order: Vec<&str> = seen.iter().map(|received| received.id.as_str()).collect();
    assert_eq!(
        seen.len(),
        total,
        "the healthy webhook got duplicates: {order:?}"
    );
    assert_eq!(ids(&seen).len(), total);
    assert!(seen.iter().all(Received::verifies));
}
