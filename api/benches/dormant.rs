//! Waiting costs nothing: the real binary on the embedded default (SQLite), its workflows
//! dormant after `dormant_after_ms` (100 ms for the memory, 5 s for the timers and wakes: a
//! dormant timer is woken `dormant_after_ms` before its due time).
//!
//! - memory: `REINS_BENCH_DORMANT` paused workflows (default 10,000), launched 32 at a time; once
//!   every one is dormant (the node runs no supervisor), the node's anonymous resident memory
//!   grown since before the first, per workflow. Beside it `REINS_BENCH_PARKED` of them
//!   (default 10,000) with dormancy off (`dormant_after_ms = 0`): parked, each keeping its
//!   supervisor and lease.
//! - timers: `REINS_BENCH_TIMERS` workflows (default 1,000) that `sleepUntil` the same second,
//!   all dormant before it: each sleep's lateness (its step's `finished_at`, the database clock,
//!   minus its `wakes_at`), p50 and p99.
//! - wake: `REINS_BENCH_WAKES` dormant paused workflows (default 200) among the others, each
//!   resumed and waited for (`GET ?wait=30s`), one at a time: from sending the resume to the
//!   answer, p50 and p99.

#[path = "../../benches/support.rs"]
#[allow(dead_code, reason = "this bench reads latencies only")]
mod support;

#[allow(dead_code, reason = "this bench starts its nodes with `start_with`")]
mod server;

use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use server::{Http, send, start_with, token, wait_ready};
use support::Run;

const CONCURRENCY: usize = 32;
const PAUSED: &str = "return await pause({stepId: 'p'});";

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Anonymous resident memory of process `pid`, in bytes (Linux).
fn anonymous_resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("RssAnon:"))
        .and_then(|value| value.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .expect("RssAnon");
    kib * 1024
}

async fn json_of(
    http: &Http,
    addr: SocketAddr,
    token: &str,
    (method, path, body): (&str, &str, Option<Value>),
) -> Value {
    let (status, reply) = send(http, addr, method, path, Some(token), body.as_ref()).await;
    assert!(
        (200..300).contains(&status),
        "{method} {path}: {status} {reply:?}"
    );
    serde_json::from_slice(&reply).expect("json")
}

/// Launches `script` `count` times, 32 at a time; their run ids.
async fn launch_many(
    http: &Http,
    addr: SocketAddr,
    token: &str,
    script: &str,
    count: usize,
) -> Vec<String> {
    let mut ids = Vec::with_capacity(count);
    for batch in (0..count).collect::<Vec<_>>().chunks(CONCURRENCY) {
        let launches = batch.iter().map(|_| {
            json_of(
                http,
                addr,
                token,
                ("POST", "/api/v1/workflows", Some(json!({"script": script}))),
            )
        });
        for record in futures_util::future::join_all(launches).await {
            ids.push(record["run_id"].as_str().expect("run_id").to_owned());
        }
    }
    ids
}

/// The node's `reins_workflow_supervisors` gauge.
async fn supervisors(http: &Http, addr: SocketAddr) -> u64 {
    let (_, body) = send(http, addr, "GET", "/metrics", None, None).await;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|line| line.strip_prefix("reins_workflow_supervisors "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(u64::MAX, |value| value as u64)
}

/// Waits until the node runs at most `left` supervisors (at most ten minutes).
async fn supervisors_fall_to(http: &Http, addr: SocketAddr, left: u64) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while supervisors(http, addr).await > left {
        assert!(Instant::now() < deadline, "the supervisors never stopped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until every workflow of `ids` has `status` (in the list, a page at a time).
async fn all_reach(http: &Http, addr: SocketAddr, token: &str, ids: &[String], status: &str) {
    let deadline = Instant::now() + Duration::from_secs(600);
    for id in ids {
        loop {
            let record = json_of(
                http,
                addr,
                token,
                ("GET", &format!("/api/v1/workflows/{id}?wait=30s"), None),
            )
            .await;
            if record["status"] == status {
                break;
            }
            assert!(Instant::now() < deadline, "{id} never {status}: {record}");
        }
    }
}

/// Paused workflows, `dormant_after_ms` as given: anonymous memory per workflow once they
/// settled (dormant, or parked).
async fn memory(count: usize, dormant_after_ms: &str) -> f64 {
    let node = start_with(None, &[("REINS_DORMANT_AFTER_MS", dormant_after_ms)]);
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    wait_ready(&http, node.addr).await;
    let token = token(&http, node.addr).await;
    // Warm up (connections, the JS pool, the store) before measuring.
    let warm = launch_many(&http, node.addr, &token, PAUSED, CONCURRENCY).await;
    all_reach(&http, node.addr, &token, &warm, "paused").await;
    if dormant_after_ms != "0" {
        supervisors_fall_to(&http, node.addr, 0).await;
    }
    let before = anonymous_resident_bytes(node.pid());
    let ids = launch_many(&http, node.addr, &token, PAUSED, count).await;
    all_reach(&http, node.addr, &token, &ids[ids.len() - 1..], "paused").await;
    if dormant_after_ms != "0" {
        supervisors_fall_to(&http, node.addr, 0).await;
    }
    // Whatever the node frees once the burst is over.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let grown = anonymous_resident_bytes(node.pid()).saturating_sub(before);
    grown as f64 / count as f64
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// `count` dormant timers due in the same second; their lateness.
async fn timers(http: &Http, addr: SocketAddr, token: &str, count: usize) -> Run {
    let started = Instant::now();
    // Far enough ahead for every one to be launched and dormant (5 s after it parked) first.
    let at = now_ms() + 25_000 + i64::try_from(count).unwrap_or(0) * 10;
    let script = format!("await sleepUntil({{stepId: 's', at: {at}}}); return 1;");
    let ids = launch_many(http, addr, token, &script, count).await;
    supervisors_fall_to(http, addr, 0).await;
    assert!(now_ms() < at, "the timers came due before all were dormant");
    all_reach(http, addr, token, &ids, "completed").await;
    let mut latencies = Vec::with_capacity(count);
    for id in &ids {
        let record = json_of(
            http,
            addr,
            token,
            ("GET", &format!("/api/v1/workflows/{id}"), None),
        )
        .await;
        let step = &record["steps"][0];
        let late = step["finished_at"].as_f64().expect("finished_at")
            - step["wakes_at"].as_f64().expect("wakes_at");
        assert!(late >= 0.0, "{id} woke {} s early", -late);
        latencies.push(Duration::from_secs_f64(late));
    }
    Run {
        latencies,
        wall: started.elapsed(),
    }
}

/// `count` dormant paused workflows, each resumed and waited for, one at a time.
async fn wakes(http: &Http, addr: SocketAddr, token: &str, count: usize) -> Run {
    let started = Instant::now();
    let ids = launch_many(http, addr, token, PAUSED, count).await;
    all_reach(http, addr, token, &ids[ids.len() - 1..], "paused").await;
    supervisors_fall_to(http, addr, 0).await;
    let mut latencies = Vec::with_capacity(count);
    for id in &ids {
        let record = json_of(
            http,
            addr,
            token,
            ("GET", &format!("/api/v1/workflows/{id}"), None),
        )
        .await;
        let resume = json!({"fingerprint": record["fingerprint"], "step_id": "p", "attempt": 1,
                            "input": "go"});
        let sent = Instant::now();
        json_of(
            http,
            addr,
            token,
            (
                "POST",
                &format!("/api/v1/workflows/{id}/resume"),
                Some(resume),
            ),
        )
        .await;
        let done = json_of(
            http,
            addr,
            token,
            ("GET", &format!("/api/v1/workflows/{id}?wait=30s"), None),
        )
        .await;
        latencies.push(sent.elapsed());
        assert_eq!(done["status"], "completed", "{done}");
    }
    Run {
        latencies,
        wall: started.elapsed(),
    }
}

#[tokio::main]
async fn main() {
    let count = env("REINS_BENCH_DORMANT", 10_000);
    let dormant = memory(count, "100").await;
    println!(
        "sqlite: {count} dormant paused workflows: anonymous resident memory {:.2} KiB each",
        dormant / 1024.0
    );
    let count = env("REINS_BENCH_PARKED", 10_000);
    if count > 0 {
        let parked = memory(count, "0").await;
        println!(
            "sqlite: {count} parked paused workflows (dormancy off): anonymous resident memory \
             {:.2} KiB each",
            parked / 1024.0
        );
    }

    let node = start_with(None, &[("REINS_DORMANT_AFTER_MS", "5000")]);
    let http: Http = Client::builder(TokioExecutor::new()).build_http();
    wait_ready(&http, node.addr).await;
    let token = token(&http, node.addr).await;
    let count = env("REINS_BENCH_TIMERS", 1_000);
    let late = timers(&http, node.addr, &token, count).await;
    println!(
        "sqlite: {count} dormant timers due in the same second: lateness p50 {:.1} ms, p99 {:.1} ms",
        late.percentile_ms(0.50),
        late.percentile_ms(0.99)
    );
    let count = env("REINS_BENCH_WAKES", 200);
    let woken = wakes(&http, node.addr, &token, count).await;
    println!(
        "sqlite: {count} dormant pauses resumed one at a time: resume to `?wait` answer p50 \
         {:.1} ms, p99 {:.1} ms",
        woken.percentile_ms(0.50),
        woken.percentile_ms(0.99)
    );
}
