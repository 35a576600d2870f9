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

#[allow(
    dead_code,
    reason = "the soak bench reads the process id, this one does not"
)]
mod server;

use std::net::SocketAddr;
use std::time::Instant;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use server::{Http, send, start, token, wait_ready};
use support::{Run, fresh_pg_database, timed};

const CONNECTIONS: usize = 64;

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
