//! Wake-ups through the real binary: how long a workflow takes to go on after a person's
//! `resume`, and what the wait API costs.
//!
//! - `launch+wait`: `POST /api/v1/workflows?wait=30s` of a one-step agent workflow, one at a
//!   time: the request–response path of a user who wants the result (launch, the step, the end,
//!   the waiter woken).
//! - `resume`: a workflow paused on node A is resumed through node B, and a `GET ?wait=30s` on
//!   B answers once A, woken by the change bus, has carried the script on to its end: from
//!   sending the resume to that answer. Beside it the same with resume and wait on A (one node),
//!   the floor of the cross-node figure.
//!
//! SQLite always (one node: no cross-node figure); PostgreSQL as well when `REINS_BENCH_PG`
//! names an admin URL. `REINS_BENCH_WAKE_SAMPLES` sets the samples per figure (default 200).

#[path = "../../benches/support.rs"]
#[allow(
    dead_code,
    reason = "this bench's floor is the same path on one node, not the fenced-write baseline"
)]
mod support;

#[allow(
    dead_code,
    reason = "the soak bench reads the process id, this one does not"
)]
mod server;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use server::{Http, send, start, token, wait_ready};
use support::{Run, fresh_pg_database};

const PAUSED: &str = "await pause({stepId: 'p'}); return 'resumed';";
const ONE_STEP: &str = "return await agent({stepId: 'a', agentRef: 'scripted', task: 'x'});";

async fn json_of(
    http: &Http,
    addr: SocketAddr,
    token: &str,
    (method, path, body): (&str, &str, Option<Value>),
    expect: u16,
) -> Value {
    let (status, reply) = send(http, addr, method, path, Some(token), body.as_ref()).await;
    assert_eq!(status, expect, "{method} {path}: {reply:?}");
    serde_json::from_slice(&reply).expect("json")
}

fn run(latencies: Vec<Duration>, started: Instant) -> Run {
    Run {
        latencies,
        wall: started.elapsed(),
    }
}

fn report(name: &str, run: &Run, floor: Option<&Run>) {
    let ratio = floor.map_or_else(String::new, |floor| {
        format!(
            "  ({:.2}x the one-node p50)",
            run.percentile_ms(0.50) / floor.percentile_ms(0.50)
        )
    });
    println!(
        "  {name:<22} p50 {:>6.2} ms  p99 {:>6.2} ms{ratio}",
        run.percentile_ms(0.50),
        run.percentile_ms(0.99),
    );
}

/// `samples` one-step workflows launched and waited for, one at a time.
async fn launch_and_wait(http: &Http, addr: SocketAddr, token: &str, samples: usize) -> Run {
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let sent = Instant::now();
        let body = json!({"script": ONE_STEP});
        let record = json_of(
            http,
            addr,
            token,
            ("POST", "/api/v1/workflows?wait=30s", Some(body)),
            201,
        )
        .await;
        latencies.push(sent.elapsed());
        assert_eq!(record["status"], "completed", "{record}");
    }
    run(latencies, started)
}

/// `samples` paused workflows launched on `owner`, each resumed and waited for on `other`.
async fn resume_across(
    http: &Http,
    (owner, other): (SocketAddr, SocketAddr),
    token: &str,
    samples: usize,
) -> Run {
    let started = Instant::now();
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let body = json!({"script": PAUSED});
        let paused = json_of(
            http,
            owner,
            token,
            ("POST", "/api/v1/workflows?wait=30s", Some(body)),
            201,
        )
        .await;
        assert_eq!(paused["status"], "paused", "{paused}");
        let id = paused["run_id"].as_str().expect("run_id");
        let resume = json!({"fingerprint": paused["fingerprint"], "step_id": "p", "attempt": 1});
        let sent = Instant::now();
        json_of(
            http,
            other,
            token,
            (
                "POST",
                &format!("/api/v1/workflows/{id}/resume"),
                Some(resume),
            ),
            200,
        )
        .await;
        let done = json_of(
            http,
            other,
            token,
            ("GET", &format!("/api/v1/workflows/{id}?wait=30s"), None),
            200,
        )
        .await;
        latencies.push(sent.elapsed());
        assert_eq!(done["status"], "completed", "{done}");
    }
    run(latencies, started)
}

async fn bench(label: &str, database: Option<String>, samples: usize) {
    let cluster = database.is_some();
    let a = start(database.clone());
    let b = cluster.then(|| start(database));
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    wait_ready(&http, a.addr).await;
    if let Some(b) = &b {
        wait_ready(&http, b.addr).await;
    }
    let token = token(&http, a.addr).await;
    // Warm both nodes' connections and caches.
    launch_and_wait(&http, a.addr, &token, 10).await;
    resume_across(&http, (a.addr, a.addr), &token, 10).await;
    println!("{label}: one at a time, {samples} samples each");
    let launched = launch_and_wait(&http, a.addr, &token, samples).await;
    report("launch+wait (1 step)", &launched, None);
    let one_node = resume_across(&http, (a.addr, a.addr), &token, samples).await;
    report("resume, one node", &one_node, None);
    if let Some(b) = &b {
        resume_across(&http, (a.addr, b.addr), &token, 10).await;
        let across = resume_across(&http, (a.addr, b.addr), &token, samples).await;
        report("resume on B, owner A", &across, Some(&one_node));
    }
}

#[tokio::main]
async fn main() {
    let samples = std::env::var("REINS_BENCH_WAKE_SAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    bench("sqlite", None, samples).await;
    if let Ok(admin) = std::env::var("REINS_BENCH_PG") {
        let url = fresh_pg_database(&admin, "reins_bench_wake").await;
        bench("postgres", Some(url), samples).await;
    }
}
