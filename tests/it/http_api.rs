//! The HTTP control plane of the real `reins` binary, on both backends: every action through both
//! surfaces (REST and the compatible action endpoint) with every error status, sessions shared by
//! nodes through the secret and revoked everywhere at once, API tokens, and a fuzz pass.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::harness::both;
use crate::harness::{ReinsProcess, TestDb, free_port};
use crate::http_client::{Answer, Api};

/// A node's database: a private SQLite file, or a fresh PostgreSQL database.
pub enum Db {
    Sqlite(TempDir),
    Postgres(TestDb),
}

impl Db {
    pub async fn new(postgres: bool) -> Db {
        if postgres {
            Db::Postgres(TestDb::postgres().await)
        } else {
            Db::Sqlite(tempfile::tempdir().expect("temp dir"))
        }
    }

    fn url(&self) -> String {
        match self {
            Db::Sqlite(dir) => format!("sqlite:{}", dir.path().join("reins.db").display()),
            Db::Postgres(db) => db.url(),
        }
    }

    fn sqlite_path(&self) -> Option<PathBuf> {
        match self {
            Db::Sqlite(dir) => Some(dir.path().join("reins.db")),
            Db::Postgres(_) => None,
        }
    }

    /// Runs one statement and returns the first column of the first row as text.
    pub async fn sql(&self, statement: &str) -> Option<String> {
        match self {
            Db::Postgres(db) => {
                let client = db.pg_client().await;
                let rows = client.simple_query(statement).await.expect("sql");
                rows.iter().find_map(|message| match message {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
                    _ => None,
                })
            }
            Db::Sqlite(_) => {
                let path = self.sqlite_path().expect("sqlite");
                let statement = statement.to_owned();
                tokio::task::spawn_blocking(move || {
                    let connection = rusqlite::Connection::open(path).expect("open");
                    connection
                        .busy_timeout(Duration::from_secs(30))
                        .expect("busy timeout");
                    let mut prepared = connection.prepare(&statement).expect("prepare");
                    let mut rows = prepared.query([]).expect("query");
                    rows.next().expect("row").map(|row| {
                        let value: rusqlite::types::Value = row.get(0).expect("column");
                        match value {
                            rusqlite::types::Value::Integer(n) => n.to_string(),
                            rusqlite::types::Value::Text(t) => t,
                            other => format!("{other:?}"),
                        }
                    })
                })
                .await
                .expect("sqlite task")
            }
        }
    }
}

/// One real node.
pub struct Node {
    pub process: ReinsProcess,
    pub addr: SocketAddr,
    /// The node's working folder; its `data_dir` is `data` in it.
    pub dir: TempDir,
}

pub const SECRET: &str = "test-secret-shared-by-the-nodes-0123456789";

impl Node {
    pub fn start(db: &Db, extra: &[(&str, String)]) -> Node {
        let dir = tempfile::tempdir().expect("temp dir");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut env = vec![
            ("REINS_DATABASE", db.url()),
            ("REINS_LISTEN", addr.to_string()),
            (
                "REINS_DATA_DIR",
                dir.path().join("data").display().to_string(),
            ),
            ("REINS_SECRET", SECRET.to_owned()),
        ];
        for (key, value) in extra {
            env.retain(|(k, _)| k != key);
            env.push((key, value.clone()));
        }
        let mut process = ReinsProcess::serve(dir.path(), addr, &env);
        process.wait_ready(Duration::from_secs(60));
        Node { process, addr, dir }
    }

    pub fn api(&self) -> Api {
        Api::new(self.addr)
    }

    pub fn signal(&self, signal: i32) {
        self.process.signal(signal);
    }

    /// The node's admin socket (the default, in its data folder).
    pub fn admin_socket(&self) -> PathBuf {
        self.dir.path().join("data/admin.sock")
    }
}

pub const ADMIN: &str = "admin@example.com";
pub const PASSWORD: &str = "correct horse battery";

/// Creates the first admin on the node at `addr` and returns an API token of theirs named `name`.
pub async fn admin_token(addr: SocketAddr, name: &str) -> String {
    let mut admin = Api::new(addr);
    let created = admin
        .call(
            "POST",
            "/api/v1/auth/initialize",
            Some(json!({"email": ADMIN, "password": PASSWORD})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let token = admin
        .call("POST", "/api/v1/auth/tokens", Some(json!({"name": name})))
        .await;
    token.json()["token"].as_str().expect("token").to_owned()
}

/// Creates the first admin on `node` and returns a client signed in as them.
pub async fn initialize(node: &Node) -> Api {
    let mut api = node.api();
    let answer = api
        .call(
            "POST",
            "/api/v1/auth/initialize",
            Some(json!({"email": ADMIN, "password": PASSWORD})),
        )
        .await;
    assert_eq!(answer.status, 201, "{answer:?}");
    assert!(api.cookies.contains_key("reins_session") && api.cookies.contains_key("csrf_token"));
    api
}

/// Polls `get` until the workflow has `status`; the bound only detects one that never gets
/// there.
pub async fn wait_for(api: &mut Api, run_id: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let record = api.action("get", json!({"run_id": run_id})).await;
        assert_eq!(record.status, 200, "{record:?}");
        let record = record.json();
        if record["status"] == status {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{run_id} never became {status}: {record}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Launches `script` through the compatible action and returns its run id.
pub async fn launch(api: &mut Api, script: &str) -> String {
    let answer = api.action("launch", json!({"script": script})).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()["run_id"].as_str().expect("run_id").to_owned()
}

pub fn assert_refused(answer: &Answer, status: u16, code: &str, says: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    let body = answer.json();
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(says), "{message:?} does not say {says:?}");
}

const SCRIPT: &str = r#"
    const a = await agent({stepId: "a", agentRef: "scripted", task: {
        write: [{path: "/mnt/user-data/outputs/report.txt", content: "hello report"}],
        output: "drafted"}});
    const f = await captureArtifact({stepId: "file", sourceStepId: "a",
                                     path: "/mnt/user-data/outputs/report.txt"});
    const resumed = await pause({stepId: "p"});
    const review = await humanCheckpoint({stepId: "review", sourceStepId: "file",
                                          artifactVersion: f.artifactVersion});
    return {version: f.artifactVersion, resumed, decision: review.decision};
"#;

both!(every_action_works_and_fails_the_same_through_rest_and_actions);
async fn every_action_works_and_fails_the_same_through_rest_and_actions(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_HTTP__BODY_BYTES_MAX", "200000".into()),
            ("REINS_LIMITS__MAX_WORKFLOWS_PER_OWNER", "3".into()),
        ],
    );
    let mut anonymous = node.api();
    assert_refused(
        &anonymous.call("GET", "/api/v1/workflows", None).await,
        401,
        "unauthorized",
        "sign in",
    );
    let mut api = initialize(&node).await;
    let again = anonymous
        .call(
            "POST",
            "/api/v1/auth/initialize",
            Some(json!({"email": "x@y.z", "password": PASSWORD})),
        )
        .await;
    assert_refused(&again, 409, "conflict", "already initialized");
    assert_eq!(
        api.call("GET", "/api/v1/auth/me", None).await.json()["email"],
        ADMIN
    );

    // Launch: idempotent per request id; a different body under it is a conflict.
    let launch = json!({"request_id": "r-1", "script": SCRIPT, "args": {"n": 1}});
    let first = api
        .call("POST", "/api/v1/workflows", Some(launch.clone()))
        .await;
    assert_eq!(first.status, 201, "{first:?}");
    let run = first.json()["run_id"].as_str().expect("run_id").to_owned();
    let repeated = api.action("launch", launch.clone()).await;
    assert_eq!(
        (
            repeated.status,
            repeated.json()["run_id"].clone(),
            repeated.json()["created"].clone()
        ),
        (200, json!(run), json!(false))
    );
    let changed = api
        .call(
            "POST",
            "/api/v1/workflows",
            Some(json!({"request_id": "r-1", "script": "return 2;"})),
        )
        .await;
    assert_refused(&changed, 409, "conflict", "r-1");

    // Malformed bodies: 400 naming the field; over the limits: 413.
    let garbage = api
        .send(
            "POST",
            "/api/v1/workflows",
            Some("application/json"),
            b"{not json".to_vec(),
            &[],
        )
        .await;
    assert_refused(&garbage, 400, "bad_request", "invalid body");
    let unknown = api
        .action("launch", json!({"script": "return 1;", "colour": "red"}))
        .await;
    assert_refused(&unknown, 400, "bad_request", "colour");
    let missing = api.action("launch", json!({"args": {}})).await;
    assert_refused(&missing, 400, "bad_request", "script");
    let wrong_type = api
        .action(
            "decide",
            json!({"run_id": run, "step_id": "review", "attempt": "one",
        "artifact_version": 2, "decision": "approve"}),
        )
        .await;
    assert_refused(&wrong_type, 400, "bad_request", "attempt");
    let big_script = format!("return 1; //{}", "x".repeat(64 * 1024));
    let over = api.action("launch", json!({"script": big_script})).await;
    assert_refused(&over, 413, "too_large", "script_bytes_max");
    let huge = api
        .action("launch", json!({"script": "x".repeat(300_000)}))
        .await;
    assert_refused(&huge, 413, "too_large", "http.body_bytes_max");
    let bad_id = api.call("GET", "/api/v1/workflows/a%20b", None).await;
    assert_refused(&bad_id, 400, "bad_request", "is not an id");
    assert_refused(
        &api.call("GET", "/api/v1/workflows/nope", None).await,
        404,
        "not_found",
        "nope",
    );
    assert_refused(
        &api.action("get", json!({"run_id": "nope"})).await,
        404,
        "not_found",
        "nope",
    );
    let wrong = api.call("PUT", "/api/v1/workflows", None).await;
    assert_refused(&wrong, 405, "method_not_allowed", "GET, POST");
    assert_eq!(
        wrong.headers.get("allow").and_then(|v| v.to_str().ok()),
        Some("GET, POST"),
        "405 names the methods in Allow (RFC 9110)"
    );

    // Resume: a stale fingerprint is refused, the right one resolves the pause.
    let paused = wait_for(&mut api, &run, "paused").await;
    assert_eq!(paused["checkpoints"][0]["status"], "waiting");
    assert_eq!(
        paused["steps"].as_array().map(Vec::len),
        Some(2),
        "the agent and the capture: {paused}"
    );
    assert_eq!(paused["steps"][0]["status"], "completed");
    assert!(
        paused["steps"][0]["configuration_version"].is_string(),
        "{paused}"
    );
    assert!(paused["configuration_version"].is_string() && paused["runtime_version"].is_string());
    let stale = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run}/resume"),
            Some(json!({"fingerprint": "0".repeat(64), "step_id": "p", "attempt": 1})),
        )
        .await;
    assert_refused(&stale, 409, "conflict", "stale");
    let not_reached = api
        .action(
            "resume",
            json!({"run_id": run, "fingerprint": paused["fingerprint"],
        "step_id": "later", "attempt": 1}),
        )
        .await;
    assert_refused(&not_reached, 409, "conflict", "later");
    let resumed = api
        .action(
            "resume",
            json!({"run_id": run, "fingerprint": paused["fingerprint"],
        "step_id": "p", "attempt": 1, "input": "go"}),
        )
        .await;
    assert_eq!(
        (resumed.status, resumed.json()["status"].clone()),
        (200, json!("resumed")),
        "{resumed:?}"
    );

    // Decide: another version is refused; identical decisions through both surfaces at once
    // both answer approved and leave one control row; a different one afterwards conflicts.
    let waiting = wait_for(&mut api, &run, "waiting_approval").await;
    let version = waiting["checkpoints"][1]["artifact_version"]
        .as_i64()
        .expect("version");
    let decide = json!({"step_id": "review", "attempt": 1, "artifact_version": version, "decision": "approve"});
    let mut wrong = decide.clone();
    wrong["artifact_version"] = json!(version + 7);
    let wrong = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run}/decide"),
            Some(wrong),
        )
        .await;
    assert_refused(&wrong, 409, "conflict", "artifact version");
    let mut compat = decide.clone();
    compat["run_id"] = json!(run);
    let (mut a, mut b) = (api.clone(), api.clone());
    let rest_path = format!("/api/v1/workflows/{run}/decide");
    let (x, y) = tokio::join!(
        a.call("POST", &rest_path, Some(decide.clone())),
        b.action("decide", compat)
    );
    for answer in [&x, &y] {
        assert_eq!(
            (answer.status, answer.json()["status"].clone()),
            (200, json!("approved")),
            "{answer:?}"
        );
    }
    let controls = db
        .sql(&format!(
            "SELECT count(*) FROM workflow_controls WHERE workflow = '{run}' AND kind = 'decide'"
        ))
        .await;
    assert_eq!(controls.as_deref(), Some("1"));
    // The same decision with a comment of its own is the same decision: 200, repeated, and
    // who made the one that stands, and when (issue 32).
    let mut commented = decide.clone();
    commented["comment"] = json!("fine by me too");
    let again = api.call("POST", &rest_path, Some(commented)).await;
    assert_eq!(
        (
            again.status,
            again.json()["repeated"].clone(),
            again.json()["recorded_by"].clone()
        ),
        (200, json!(true), json!(ADMIN)),
        "{again:?}"
    );
    let recorded_at = again.json()["recorded_at"].as_f64().expect("recorded_at");
    let first_at = x.json()["recorded_at"].as_f64().expect("recorded_at");
    assert_eq!(
        recorded_at, first_at,
        "the repeat names the first decision's time"
    );
    let mut reject = decide.clone();
    reject["decision"] = json!("reject");
    assert_refused(
        &api.call("POST", &rest_path, Some(reject)).await,
        409,
        "conflict",
        &format!(
            "was already decided approve (artifact version {version}) by {ADMIN} at {};",
            store::rfc3339_utc(recorded_at)
        ),
    );
    let done = wait_for(&mut api, &run, "completed").await;
    assert_eq!(
        done["result"],
        json!({"version": version, "resumed": "go", "decision": "approve"})
    );
    assert_eq!(done["checkpoints"][1]["status"], "approved");
    assert_eq!(done["checkpoints"][1]["decided_by"], ADMIN);

    // Artifacts: raw bytes with Range, and base64 chunks.
    let path = format!("/api/v1/workflows/{run}/artifacts/{version}");
    let whole = api.call("GET", &path, None).await;
    assert_eq!((whole.status, &whole.body[..]), (200, &b"hello report"[..]));
    assert_eq!(whole.headers["content-type"], "text/plain; charset=utf-8");
    let part = api
        .send("GET", &path, None, Vec::new(), &[("range", "bytes=0-4")])
        .await;
    assert_eq!((part.status, &part.body[..]), (206, &b"hello"[..]));
    assert_eq!(part.headers["content-range"], "bytes 0-4/12");
    let tail = api
        .send("GET", &path, None, Vec::new(), &[("range", "bytes=-6")])
        .await;
    assert_eq!((tail.status, &tail.body[..]), (206, &b"report"[..]));
    let past = api
        .send("GET", &path, None, Vec::new(), &[("range", "bytes=50-")])
        .await;
    assert_eq!(
        (past.status, past.headers["content-range"].to_str().ok()),
        (416, Some("bytes */12"))
    );
    assert_refused(
        &api.call(
            "GET",
            &format!("/api/v1/workflows/{run}/artifacts/99"),
            None,
        )
        .await,
        404,
        "not_found",
        "99",
    );
    let chunk = api
        .action(
            "get_artifact",
            json!({"run_id": run, "version": version, "offset": 6, "length": 3}),
        )
        .await
        .json();
    assert_eq!(
        base64::engine::general_purpose::STANDARD
            .decode(chunk["content_base64"].as_str().expect("b64"))
            .expect("decode"),
        b"rep"
    );
    assert_eq!(
        (chunk["total_bytes"].clone(), chunk["offset"].clone()),
        (json!(12), json!(6))
    );

    // CSRF: a cookie session without the header, or with a wrong one, is refused.
    let mut no_csrf = api.clone();
    no_csrf.send_csrf = false;
    assert_refused(
        &no_csrf.action("get", json!({"run_id": run})).await,
        403,
        "csrf",
        "missing",
    );
    let forged = no_csrf
        .send(
            "POST",
            "/api/plugins/community.workflows/actions/get",
            Some("application/json"),
            serde_json::to_vec(&json!({"run_id": run})).expect("json"),
            &[("x-csrf-token", "forged")],
        )
        .await;
    assert_refused(&forged, 403, "csrf", "does not match");

    // Another user sees none of it, and may not reconcile; their own limit is theirs.
    let created = api
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "bob@example.com", "password": PASSWORD})),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let taken = api
        .call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "bob@example.com", "password": PASSWORD})),
        )
        .await;
    assert_refused(&taken, 409, "conflict", "bob@example.com");
    let mut bob = node.api();
    assert_eq!(bob.login("bob@example.com", PASSWORD).await.status, 200);
    assert_refused(
        &bob.call("GET", &format!("/api/v1/workflows/{run}"), None)
            .await,
        404,
        "not_found",
        &run,
    );
    assert_refused(
        &bob.action("cancel", json!({"run_id": run})).await,
        404,
        "not_found",
        &run,
    );
    assert_refused(&bob.call("GET", &path, None).await, 404, "not_found", &run);
    assert_eq!(
        bob.call("GET", "/api/v1/workflows", None).await.json()["workflows"],
        json!([])
    );
    let reconcile = bob
        .call(
            "POST",
            &format!("/api/v1/workflows/{run}/reconcile"),
            Some(json!({"step_id": "a", "resolution": "fail", "reason": "x"})),
        )
        .await;
    assert_refused(&reconcile, 403, "admin_only", "admin");
    assert_refused(
        &bob.call(
            "POST",
            "/api/v1/auth/users",
            Some(json!({"email": "c@d.e", "password": PASSWORD})),
        )
        .await,
        403,
        "admin_only",
        "admin",
    );
    let mut bobs = Vec::new();
    for _ in 0..3 {
        let launched = bob
            .action(
                "launch",
                json!({"script": "await pause({stepId: 'p'}); return 1;"}),
            )
            .await;
        assert_eq!(launched.status, 200, "{launched:?}");
        bobs.push(launched.json()["run_id"].as_str().expect("id").to_owned());
    }
    let fourth = bob.action("launch", json!({"script": "return 1;"})).await;
    assert_refused(&fourth, 422, "refused", "max_workflows_per_owner");
    let page = api
        .call("GET", "/api/v1/workflows?limit=2", None)
        .await
        .json();
    assert_eq!(
        page["workflows"].as_array().map(Vec::len),
        Some(2),
        "an admin sees everyone's: {page}"
    );
    let next = page["next_after"].as_str().expect("a next page");
    let rest = api
        .call(
            "GET",
            &format!("/api/v1/workflows?limit=2&after={next}"),
            None,
        )
        .await
        .json();
    assert_eq!(
        rest["workflows"].as_array().map(Vec::len),
        Some(2),
        "{rest}"
    );
    assert_eq!(rest["next_after"], Value::Null);
    let completed = api
        .call("GET", "/api/v1/workflows?status=completed", None)
        .await
        .json();
    assert_eq!(completed["workflows"][0]["run_id"], json!(run));
    assert_refused(
        &api.call("GET", "/api/v1/workflows?status=bogus", None)
            .await,
        400,
        "bad_request",
        "bogus",
    );
    assert_refused(
        &api.call("GET", "/api/v1/workflows?limit=0", None).await,
        400,
        "bad_request",
        "limit",
    );

    // Cancel, recover, delete: wrong states are refused with 422, nothing changes.
    let victim = bobs[0].clone();
    wait_for(&mut bob, &victim, "paused").await;
    assert_refused(
        &bob.action("recover", json!({"run_id": victim})).await,
        422,
        "refused",
        "",
    );
    assert_refused(
        &bob.call("DELETE", &format!("/api/v1/workflows/{victim}"), None)
            .await,
        422,
        "refused",
        "cancel it first",
    );
    let cancelled = bob
        .call("POST", &format!("/api/v1/workflows/{victim}/cancel"), None)
        .await;
    assert_eq!(
        (cancelled.status, cancelled.json()["status"].clone()),
        (200, json!("cancelled")),
        "{cancelled:?}"
    );
    let again = bob.action("cancel", json!({"run_id": victim})).await;
    assert_eq!(again.json()["status"], "cancelled");
    assert_refused(
        &api.action("cancel", json!({"run_id": run})).await,
        422,
        "refused",
        "completed",
    );
    let deleted = bob.action("delete", json!({"run_id": victim})).await;
    assert_eq!(
        (deleted.status, deleted.json()["deleted"].clone()),
        (200, json!(true))
    );
    assert_refused(
        &bob.action("get", json!({"run_id": victim})).await,
        404,
        "not_found",
        &victim,
    );

    // The plugin listing and the description.
    let plugins = anonymous.call("GET", "/api/plugins", None).await.json();
    assert_eq!(plugins["plugins"][0]["id"], "community.workflows");
    assert!(
        plugins["plugins"][0]["actions"]
            .as_array()
            .expect("actions")
            .contains(&json!("get_artifact"))
    );
    let openapi = anonymous
        .call("GET", "/api/v1/openapi.json", None)
        .await
        .json();
    assert_eq!(openapi["openapi"], "3.1.0");
    assert!(openapi["paths"]["/api/v1/workflows/{id}/resume"]["post"].is_object());
}

/// The sessions' database, for poking at `users` directly.
async fn bump_token_versions(db: &Db) {
    db.sql("UPDATE users SET token_version = token_version + 1")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_is_good_on_every_node_with_the_secret_and_revoked_everywhere_at_once() {
    let db = Db::new(true).await;
    let a = Node::start(&db, &[]);
    let b = Node::start(&db, &[]);
    let stranger = Node::start(
        &db,
        &[(
            "REINS_SECRET",
            "another-secret-of-another-cluster-xyz".into(),
        )],
    );
    let mut on_a = initialize(&a).await;
    let cookies = on_a.cookies.clone();
    let mut on_b = b.api();
    on_b.cookies = cookies.clone();
    let mut on_stranger = stranger.api();
    on_stranger.cookies = cookies.clone();
    let run = on_a
        .action(
            "launch",
            json!({"script": "await pause({stepId: 'p'}); return 1;"}),
        )
        .await
        .json()["run_id"]
        .clone();
    assert_eq!(
        on_b.action("get", json!({"run_id": run})).await.status,
        200,
        "a cookie from a works on b"
    );
    assert_refused(
        &on_stranger.action("get", json!({"run_id": run})).await,
        401,
        "unauthorized",
        "not signed",
    );

    bump_token_versions(&db).await;
    for api in [&mut on_a, &mut on_b] {
        assert_refused(
            &api.action("get", json!({"run_id": run})).await,
            401,
            "unauthorized",
            "ended",
        );
    }
    // Signing in again works; signing out ends that session on every node.
    assert_eq!(on_b.login(ADMIN, PASSWORD).await.status, 200);
    on_a.cookies = on_b.cookies.clone();
    assert_eq!(on_a.action("get", json!({"run_id": run})).await.status, 200);
    let mut other_session = a.api();
    assert_eq!(other_session.login(ADMIN, PASSWORD).await.status, 200);
    assert_eq!(
        on_b.call("POST", "/api/v1/auth/logout", None).await.status,
        200
    );
    assert!(on_b.cookies.is_empty(), "logout clears the cookies");
    assert_refused(
        &on_a.action("get", json!({"run_id": run})).await,
        401,
        "unauthorized",
        "ended",
    );
    assert_eq!(
        other_session
            .action("get", json!({"run_id": run}))
            .await
            .status,
        200,
        "only that session ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_expire_tokens_skip_csrf_until_revoked_and_sign_in_is_throttled() {
    let db = Db::new(false).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_AUTH__SESSION_SECONDS", "2".into()),
            ("REINS_AUTH__LOGIN_FAILURES_MAX", "3".into()),
            ("REINS_AUTH__LOGIN_ADDRESS_FAILURES_MAX", "4".into()),
        ],
    );
    let mut api = initialize(&node).await;
    let created = api
        .call("POST", "/api/v1/auth/tokens", Some(json!({"name": "ci"})))
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let created = created.json();
    let token = created["token"].as_str().expect("token").to_owned();
    let listed = api.call("GET", "/api/v1/auth/tokens", None).await;
    assert!(
        !String::from_utf8_lossy(&listed.body).contains(&token),
        "a listing never shows the secret"
    );

    // A machine: bearer token, no cookies, no CSRF header.
    let mut machine = node.api();
    machine.bearer = Some(token.clone());
    let launched = machine
        .action("launch", json!({"script": "return 5;"}))
        .await;
    assert_eq!(launched.status, 200, "{launched:?}");
    // The scheme is case-insensitive, as HTTP says.
    for scheme in ["bearer", "BEARER"] {
        let header = format!("{scheme} {token}");
        let answer = node
            .api()
            .send(
                "GET",
                "/api/v1/auth/me",
                None,
                Vec::new(),
                &[("authorization", &header)],
            )
            .await;
        assert_eq!(answer.status, 200, "{scheme}: {answer:?}");
    }
    let mut forged = node.api();
    forged.bearer = Some(format!("{}x", &token[..token.len() - 1]));
    assert_refused(
        &forged.call("GET", "/api/v1/auth/me", None).await,
        401,
        "unauthorized",
        "unknown or revoked",
    );

    // Issue 32: once it expired, its holder is told so, and how to get another; a caller
    // without its secret learns nothing more than before.
    db.sql("UPDATE api_tokens SET expires_at = 1").await;
    assert_refused(
        &machine.call("GET", "/api/v1/auth/me", None).await,
        401,
        "unauthorized",
        "the API token expired: sign in again",
    );
    assert_refused(
        &forged.call("GET", "/api/v1/auth/me", None).await,
        401,
        "unauthorized",
        "unknown or revoked",
    );
    db.sql("UPDATE api_tokens SET expires_at = NULL").await;

    // The session expires on its own (database clock).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_refused(
        &api.call("GET", "/api/v1/auth/me", None).await,
        401,
        "unauthorized",
        "ended",
    );
    let id = created["id"].as_str().expect("id");
    let revoked = machine
        .call("DELETE", &format!("/api/v1/auth/tokens/{id}"), None)
        .await;
    assert_eq!(
        (revoked.status, revoked.json()["revoked"].clone()),
        (200, json!(true))
    );
    assert_refused(
        &machine.call("GET", "/api/v1/auth/me", None).await,
        401,
        "unauthorized",
        "revoked",
    );

    // Sign-in: wrong passwords count per address and account; past the limit even the right
    // one waits. Another account from the same address has its own budget, until the address
    // has spent its own.
    let mut guesser = node.api();
    for _ in 0..3 {
        assert_refused(
            &guesser.login(ADMIN, "wrong password").await,
            401,
            "unauthorized",
            "wrong email or password",
        );
    }
    let throttled = guesser.login(ADMIN, PASSWORD).await;
    assert_refused(&throttled, 429, "too_many_attempts", "try again");
    assert!(throttled.headers.contains_key("retry-after"));
    assert_refused(
        &guesser.login("nobody@example.com", PASSWORD).await,
        401,
        "unauthorized",
        "wrong email or password",
    );
    assert_refused(
        &guesser.login("somebody@example.com", PASSWORD).await,
        429,
        "too_many_attempts",
        "this address",
    );
}

/// Writes raw bytes to the node and reads whatever comes back (status line only).
fn raw_exchange(addr: SocketAddr, request: &[u8]) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream.write_all(request).ok()?;
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    text.split_whitespace().nth(1).and_then(|s| s.parse().ok())
}

/// A tiny deterministic generator (xorshift), so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fuzz_pass_over_every_route_finds_no_5xx_and_leaves_the_node_healthy() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[("REINS_HTTP__BODY_BYTES_MAX", "65536".into())]);
    let mut api = initialize(&node).await;
    let run = launch(&mut api, "await pause({stepId: 'p'}); return 1;").await;
    // Every route with its own method, so that most requests get past routing.
    let routes: Vec<(&str, String)> = [
        ("GET", "/health"),
        ("GET", "/health/ready"),
        ("GET", "/api/plugins"),
        ("GET", "/api/v1/openapi.json"),
        ("POST", "/api/v1/auth/initialize"),
        ("POST", "/api/v1/auth/login/local"),
        ("POST", "/api/v1/auth/logout"),
        ("GET", "/api/v1/auth/me"),
        ("POST", "/api/v1/auth/users"),
        ("GET", "/api/v1/auth/users"),
        ("PATCH", "/api/v1/auth/users/x"),
        ("DELETE", "/api/v1/auth/users/x"),
        ("POST", "/api/v1/auth/users/x/password"),
        ("POST", "/api/v1/auth/users/x/sign-out"),
        ("POST", "/api/v1/auth/me/password"),
        ("POST", "/api/v1/auth/tokens"),
        ("GET", "/api/v1/auth/tokens"),
        ("DELETE", "/api/v1/auth/tokens/x"),
        ("POST", "/api/v1/workflows"),
        ("GET", "/api/v1/workflows"),
        ("GET", "/api/v1/workflows?status=paused&limit=3&after=%ff"),
        ("GET", "/api/v1/workflows/{id}"),
        ("DELETE", "/api/v1/workflows/{id}"),
        ("POST", "/api/v1/workflows/{id}/resume"),
        ("POST", "/api/v1/workflows/{id}/decide"),
        ("POST", "/api/v1/workflows/{id}/cancel"),
        ("POST", "/api/v1/workflows/{id}/recover"),
        ("POST", "/api/v1/workflows/{id}/reconcile"),
        ("GET", "/api/v1/workflows/{id}/artifacts/1"),
        ("GET", "/api/v1/workflows/{id}/artifacts/-1"),
        ("GET", "/api/v1/workflows/%00/artifacts/x"),
        ("POST", "/api/plugins/community.workflows/actions/launch"),
        ("POST", "/api/plugins/community.workflows/actions/get"),
        ("POST", "/api/plugins/community.workflows/actions/resume"),
        ("POST", "/api/plugins/community.workflows/actions/decide"),
        ("POST", "/api/plugins/community.workflows/actions/cancel"),
        ("POST", "/api/plugins/community.workflows/actions/recover"),
        ("POST", "/api/plugins/community.workflows/actions/delete"),
        (
            "POST",
            "/api/plugins/community.workflows/actions/get_artifact",
        ),
    ]
    .iter()
    .map(|(m, p)| (*m, p.replace("{id}", &run)))
    .collect();
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"{}".to_vec(),
        b"null".to_vec(),
        b"[]".to_vec(),
        b"{\"run_id\": 5}".to_vec(),
        format!(
            "{{\"run_id\": \"{run}\", \"step_id\": \"p\", \"attempt\": -1, \"fingerprint\": \"\"}}"
        )
        .into_bytes(),
        format!("{{\"run_id\": \"{run}\", \"version\": -9, \"offset\": 18446744073709551615}}")
            .into_bytes(),
        b"{\"script\": \"while(true){}\", \"args\": {\"a\": [[[[[[[[[[]]]]]]]]]]}}".to_vec(),
        b"{\"run_id\": \"\xff\xfe\"}".to_vec(),
        b"\xc3\x28\xa0\xa1".to_vec(),
        b"{\"email\": \"a@b\", \"password\": \"\"}".to_vec(),
        b"username=%ff&password=%".to_vec(),
        "{\"x\":".repeat(2000).into_bytes(),
        vec![b'['; 100_000],
    ];
    let methods = ["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"];
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut requests = 0u32;
    let mut statuses = std::collections::BTreeMap::new();
    for round in 0..2000 {
        let (own_method, path) = &routes[rng.below(routes.len())];
        let method = if rng.below(5) == 0 {
            methods[rng.below(methods.len())]
        } else {
            own_method
        };
        // The signed-in client keeps its session (signing out would turn the rest into 401s).
        let anonymous = round % 3 == 0 || path.ends_with("/logout");
        let body = match rng.below(4) {
            0 => {
                let length = rng.below(300);
                rng.bytes(length)
            }
            _ => bodies[rng.below(bodies.len())].clone(),
        };
        let content_type = [
            "application/json",
            "application/x-www-form-urlencoded",
            "text/plain",
        ][rng.below(3)];
        let over_limit = body.len() > 65536;
        let sent = if anonymous {
            let mut plain = node.api();
            plain
                .try_send(method, path, Some(content_type), body, &[])
                .await
        } else {
            api.try_send(method, path, Some(content_type), body, &[])
                .await
        };
        requests += 1;
        // A body over the limit is refused before it is read, and the connection closed: the
        // client may see that as the connection ending while it still writes.
        let answer = match sent {
            Ok(answer) => answer,
            Err(error) if over_limit => {
                *statuses.entry(0).or_insert(0u32) += 1;
                let _ = error;
                continue;
            }
            Err(error) => panic!("{method} {path} failed: {error}"),
        };
        *statuses.entry(answer.status).or_insert(0u32) += 1;
        assert!(answer.status < 500, "{method} {path} answered {answer:?}");
    }
    // Malformed at the HTTP level: huge headers, bad UTF-8 in the head, truncated requests.
    let addr = node.addr;
    let raw: Vec<Vec<u8>> = vec![
        format!(
            "GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: {}\r\n\r\n",
            "a".repeat(200_000)
        )
        .into_bytes(),
        format!(
            "GET /health HTTP/1.1\r\nHost: localhost\r\n{}\r\n",
            "X-Many: 1\r\n".repeat(500)
        )
        .into_bytes(),
        b"GET /\xff\xfe HTTP/1.1\r\nHost: localhost\r\n\r\n".to_vec(),
        b"POST /api/v1/workflows HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n\r\n{\"scr".to_vec(),
        b"POST /api/v1/workflows HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n"
            .to_vec(),
        b"GET /health HTTP/1.1\r\nHost".to_vec(),
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03".to_vec(),
        b"GET /health HTTP/9.9\r\n\r\n".to_vec(),
        b"POST /api/v1/auth/login/local HTTP/1.1\r\nHost: localhost\r\nContent-Length: 99999999999\r\n\r\n"
            .to_vec(),
    ];
    for request in raw {
        let bytes = request.clone();
        let status = tokio::task::spawn_blocking(move || raw_exchange(addr, &bytes))
            .await
            .expect("raw");
        requests += 1;
        assert!(
            status.is_none_or(|s| s < 500),
            "{:?} answered {status:?}",
            String::from_utf8_lossy(&request[..request.len().min(80)])
        );
    }
    let health = api.call("GET", "/health/ready", None).await;
    assert_eq!(health.status, 200, "the node is still healthy");
    // The pass may have cancelled or deleted its workflow: a new one still runs to the end.
    let after = launch(&mut api, "return 42;").await;
    assert_eq!(wait_for(&mut api, &after, "completed").await["result"], 42);
    println!("fuzz: {requests} requests, statuses {statuses:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_node_refuses_launches_and_recoveries_with_503_and_still_answers_reads() {
    let db = Db::new(false).await;
    // The node drains for longer than the test looks at it (the test kills it when done): its
    // answers while draining must not race the end of a 4 s grace on a busy machine.
    let node = Node::start(&db, &[("REINS_SHUTDOWN__DRAIN_GRACE_MS", "600000".into())]);
    let mut api = initialize(&node).await;
    let run = launch(&mut api, "await pause({stepId: 'p'}); return 1;").await;
    wait_for(&mut api, &run, "paused").await;
    node.signal(libc::SIGTERM);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while api.call("GET", "/health/ready", None).await.status != 503 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness never turned 503"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_refused(
        &api.action("launch", json!({"script": "return 1;"})).await,
        503,
        "draining",
        "draining",
    );
    assert_refused(
        &api.action("recover", json!({"run_id": run})).await,
        503,
        "draining",
        "draining",
    );
    assert_eq!(
        api.action("get", json!({"run_id": run})).await.status,
        200,
        "reads are still served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_recovers_and_reconciles_an_uncertain_step_through_rest() {
    let db = Db::new(false).await;
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_model"), b"").expect("hold");
    let node = Node::start(
        &db,
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let mut api = initialize(&node).await;
    let script = "const r = await agent({stepId: 'held', agentRef: 'scripted', \
                  task: {hold_while: 'hold_model', output: 'real'}}); return r.output;";
    let run = api.action("launch", json!({"script": script})).await.json()["run_id"]
        .as_str()
        .expect("id")
        .to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while api
        .call("GET", &format!("/api/v1/workflows/{run}"), None)
        .await
        .json()["steps"][0]["status"]
        != "running"
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the child never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The operator moves the workflow away; its child run goes on, its outcome unknown to
    // whoever recovers the workflow.
    crate::operators::admin_json(&node.admin_socket(), &["fence", &run]);
    wait_for(&mut api, &run, "recoverable").await;
    let recovered = api
        .call("POST", &format!("/api/v1/workflows/{run}/recover"), None)
        .await;
    assert_eq!(recovered.status, 200, "{recovered:?}");
    let uncertain = wait_for(&mut api, &run, "needs_reconciliation").await;
    assert_eq!(
        uncertain["steps"].as_array().map(Vec::len),
        Some(1),
        "no second child run"
    );
    // Why it waits is on record: which step, which child run, what is unknown.
    let why = &uncertain["reconciliation"];
    assert_eq!(why["reason"], "child_outcome_unknown", "{uncertain}");
    assert_eq!(why["step_id"], "held");
    assert_eq!(why["run_id"], uncertain["steps"][0]["run_id"]);
    assert!(
        why["message"]
            .as_str()
            .is_some_and(|m| m.contains("no outcome")),
        "{why}"
    );
    let listed = crate::operators::admin_json(&node.admin_socket(), &["reconciliations"]);
    assert_eq!(listed[0]["run_id"], run.as_str(), "{listed}");
    assert_eq!(
        listed[0]["reconciliation"]["reason"],
        "child_outcome_unknown"
    );
    let metrics = crate::operators::scrape(&mut api).await;
    assert_eq!(
        crate::operators::value(
            &metrics,
            "reins_reconciliations_needed_total{reason=\"child_outcome_unknown\"}"
        ),
        1.0
    );
    let again = api
        .call("POST", &format!("/api/v1/workflows/{run}/recover"), None)
        .await;
    assert_refused(&again, 422, "refused", "reconcil");
    let bad = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run}/reconcile"),
            Some(json!({"step_id": "held", "resolution": "complete", "reason": "checked"})),
        )
        .await;
    assert_refused(&bad, 400, "bad_request", "output");
    let settled = api
        .call(
            "POST",
            &format!("/api/v1/workflows/{run}/reconcile"),
            Some(
                json!({"step_id": "held", "resolution": "complete", "output": "settled by hand",
                    "reason": "the report exists"}),
            ),
        )
        .await;
    assert_eq!(settled.status, 200, "{settled:?}");
    let done = wait_for(&mut api, &run, "completed").await;
    assert_eq!(done["result"], "settled by hand");
    assert_eq!(
        done["reconciliation"],
        Value::Null,
        "settled: no reason any more"
    );
    let runs = db
        .sql(&format!(
            "SELECT count(*) FROM runs WHERE workflow = '{run}'"
        ))
        .await;
    assert_eq!(
        runs.as_deref(),
        Some("1"),
        "the old child run stays on record, alone"
    );
    std::fs::remove_file(faults.path().join("hold_model")).expect("release");
}
