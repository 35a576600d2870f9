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
use crate::http_api::{Db, Node, initialize, wait_for};

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
    _task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start(mode: Mode) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen: Arc<Mutex<Vec<Received>>> = Arc::default();
        let recorded = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let recorded = Arc::clone(&recorded);
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                        let recorded = Arc::clone(&recorded);
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
            _task: task,
        }
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
                                 "step_id": "p", "attempt": 1}),
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
