//! The control plane through HTTP: requests per second and p50/p99 latency of `get` (one workflow
//! record) and `launch` (a one-step workflow), with keep-alive at 64 concurrent connections,
//! beside `GET /health` in the same run as the floor (same server, same client, no database).
//! Requests authenticate with an API token, so each `get` and `launch` also reads the token row.
//!
//! The real `reins` binary is started on loopback: SQLite always; PostgreSQL as well when
//! `REINS_BENCH_PG` names an admin URL. `REINS_BENCH_REQUESTS` sets the requests per figure
//! (default 20000 for health and get, a tenth of it for launch).

#[path = "../../benches/support.rs"]
#[allow(
    dead_code,
    reason = "this bench's floor is /health, not the fenced-write baseline"
)]
mod support;

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use support::{Run, fresh_pg_database, timed};

const CONNECTIONS: usize = 64;

type Http = Client<HttpConnector, Full<Bytes>>;

struct Server {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(database: Option<String>) -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_reins"));
    command
        .arg("serve")
        .current_dir(dir.path())
        .env_clear()
        .env("REINS_LISTEN", addr.to_string())
        .env("REINS_SECRET", "bench-secret-0123456789abcdefghijklmnop")
        .env("REINS_LIMITS__MAX_WORKFLOWS", "100000000")
        .env("REINS_LIMITS__MAX_WORKFLOWS_PER_OWNER", "100000000")
        .env("REINS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(database) = database {
        command.env("REINS_DATABASE", database);
    }
    let child = command.spawn().expect("start reins");
    Server {
        child,
        addr,
        _dir: dir,
    }
}

async fn send(
    http: &Http,
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Bytes) {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let bytes = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            Bytes::from(body.to_string())
        }
        None => Bytes::new(),
    };
    let response = http
        .request(request.body(Full::new(bytes)).expect("request"))
        .await
        .expect("HTTP request");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, body)
}

async fn wait_ready(http: &Http, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let request = Request::get(format!("http://{addr}/health/ready"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        if let Ok(response) = http.request(request).await
            && response.status() == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "the node did not get ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Signs in as a new admin and returns an API token.
async fn token(http: &Http, addr: SocketAddr) -> String {
    let body = json!({"email": "bench@example.com", "password": "bench password"});
    let request = Request::post(format!("http://{addr}/api/v1/auth/initialize"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let response = http.request(request).await.expect("initialize");
    let cookies: Vec<String> = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split(';').next().map(str::to_owned))
        .collect();
    let csrf = cookies
        .iter()
        .find_map(|c| c.strip_prefix("csrf_token="))
        .expect("csrf cookie")
        .to_owned();
    let request = Request::post(format!("http://{addr}/api/v1/auth/tokens"))
        .header("content-type", "application/json")
        .header("cookie", cookies.join("; "))
        .header("x-csrf-token", csrf)
        .body(Full::new(Bytes::from(json!({"name": "bench"}).to_string())))
        .expect("request");
    let response = http.request(request).await.expect("token");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).expect("json");
    body["token"].as_str().expect("token").to_owned()
}

/// `requests` requests of one kind over [`CONNECTIONS`] workers.
async fn load(
    http: &Http,
    addr: SocketAddr,
    token: Option<&str>,
    requests: usize,
    (method, path, body): (&'static str, &str, Option<Value>),
    expect: u16,
) -> Run {
    let per_worker = requests.div_ceil(CONNECTIONS);
    let token = token.map(str::to_owned);
    let path = path.to_owned();
    timed(CONNECTIONS, |_| {
        let (http, token, path, body) = (http.clone(), token.clone(), path.clone(), body.clone());
        async move {
            let mut latencies = Vec::with_capacity(per_worker);
            for _ in 0..per_worker {
                let started = Instant::now();
                let (status, reply) =
                    send(&http, addr, method, &path, token.as_deref(), body.as_ref()).await;
                latencies.push(started.elapsed());
                assert_eq!(status, expect, "{method} {path}: {reply:?}");
            }
            latencies
        }
    })
    .await
}

fn report(name: &str, run: &Run, floor: &Run) {
    println!(
        "  {name:<8} {:>9.0} req/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({:.2} of /health)",
        run.per_second(),
        run.percentile_ms(0.50),
        run.percentile_ms(0.99),
        run.per_second() / floor.per_second()
    );
}

async fn bench(label: &str, database: Option<String>, requests: usize) {
    let server = start(database);
    let addr = server.addr;
    let http: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CONNECTIONS)
        .build_http();
    wait_ready(&http, addr).await;
    let token = token(&http, addr).await;
    let one_step =
        json!({"script": "return await agent({stepId: 'a', agentRef: 'scripted', task: 'x'});"});
    let (status, body) = send(
        &http,
        addr,
        "POST",
        "/api/v1/workflows",
        Some(&token),
        Some(&one_step),
    )
    .await;
    assert_eq!(status, 201, "{body:?}");
    let launched: Value = serde_json::from_slice(&body).expect("json");
    let path = format!(
        "/api/v1/workflows/{}",
        launched["run_id"].as_str().expect("id")
    );

    // Warm the connections and the server.
    let health_request = ("GET", "/health", None);
    load(
        &http,
        addr,
        None,
        CONNECTIONS * 4,
        health_request.clone(),
        200,
    )
    .await;
    let health = load(&http, addr, None, requests, health_request, 200).await;
    let get = load(
        &http,
        addr,
        Some(&token),
        requests,
        ("GET", &path, None),
        200,
    )
    .await;
    let launch_request = ("POST", "/api/v1/workflows", Some(one_step));
    let launch = load(
        &http,
        addr,
        Some(&token),
        requests / 10,
        launch_request,
        201,
    )
    .await;
    println!("{label}: {CONNECTIONS} keep-alive connections");
    report("/health", &health, &health);
    report("get", &get, &health);
    report("launch", &launch, &health);
}

#[tokio::main]
async fn main() {
    let requests = std::env::var("REINS_BENCH_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    bench("sqlite", None, requests).await;
    if let Ok(admin) = std::env::var("REINS_BENCH_PG") {
        let url = fresh_pg_database(&admin, "reins_bench_http").await;
        bench("postgres", Some(url), requests).await;
    }
}
