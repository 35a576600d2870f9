//! Memory over a long run: 100,000 workflows of three sequential scripted-agent steps through
//! the real `reins` binary's API, 32 in flight, and the node's anonymous resident memory (the
//! heap, from `/proc/<pid>/status`) after every tenth of them, measured idle. The first tenth
//! is the warm-up (the database's page caches, the allocator's free lists, the runtime's pools);
//! after it the memory must stay flat: the bench fails when the drift is 1 KiB per workflow or
//! more, since whatever a finished workflow leaves behind adds up to gigabytes a day.
//!
//! SQLite always runs; PostgreSQL when `REINS_BENCH_PG` names an admin URL.
//! `REINS_BENCH_SOAK_WORKFLOWS` sets the count (default 100000).

mod server;
#[path = "../../benches/support.rs"]
#[allow(
    dead_code,
    reason = "this bench measures memory, not against the fenced-write baseline"
)]
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use server::{Http, send, start, token, wait_ready};
use support::fresh_pg_database;

const CONCURRENCY: usize = 32;
/// Drift after the warm-up that fails the bench, per workflow.
const DRIFT_BYTES_MAX: f64 = 1024.0;

const SCRIPT: &str = "let r = null;
for (const n of [1, 2, 3]) {
  r = await agent({stepId: 's' + n, agentRef: 'scripted', task: 'step ' + n});
}
return r.output;";

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

/// Launches a workflow and waits for it to complete (polling its record, 5 ms doubling to
/// 50 ms).
async fn run_one(http: &Http, addr: SocketAddr, token: &str) {
    let body = json!({"script": SCRIPT});
    let (status, reply) = send(
        http,
        addr,
        "POST",
        "/api/v1/workflows",
        Some(token),
        Some(&body),
    )
    .await;
    assert_eq!(status, 201, "{reply:?}");
    let launched: Value = serde_json::from_slice(&reply).expect("json");
    let path = format!(
        "/api/v1/workflows/{}",
        launched["run_id"].as_str().expect("id")
    );
    let mut pause = Duration::from_millis(5);
    loop {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
        let (status, reply) = send(http, addr, "GET", &path, Some(token), None).await;
        assert_eq!(status, 200, "{reply:?}");
        let record: Value = serde_json::from_slice(&reply).expect("json");
        match record["status"].as_str() {
            Some("completed") => return,
            Some("running") => {}
            other => panic!("a soak workflow ended {other:?}: {record}"),
        }
    }
}

/// Runs `count` workflows, [`CONCURRENCY`] at a time.
async fn run_many(http: &Http, addr: SocketAddr, token: &str, count: usize) {
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|worker| {
            let (http, token) = (http.clone(), token.to_owned());
            let mine = count / CONCURRENCY + usize::from(worker < count % CONCURRENCY);
            tokio::spawn(async move {
                for _ in 0..mine {
                    run_one(&http, addr, &token).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
}

async fn soak(label: &str, database: Option<String>, count: usize) {
    let server = start(database);
    let addr = server.addr;
    let http: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CONCURRENCY)
        .build_http();
    wait_ready(&http, addr).await;
    let token = token(&http, addr).await;
    let round = (count / 10).max(1);
    let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let mut warm = None;
    let mut last = anonymous_resident_bytes(server.pid());
    println!(
        "{label}: {count} workflows of 3 steps, {CONCURRENCY} in flight; anonymous resident memory at start {:.1} MiB",
        mib(last)
    );
    for done in (round..=count).step_by(round) {
        let started = std::time::Instant::now();
        run_many(&http, addr, &token, round).await;
        let per_second = round as f64 / started.elapsed().as_secs_f64();
        // Idle: the last supervisors stop just after their records say `completed`.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = anonymous_resident_bytes(server.pid());
        println!(
            "  after {done:>7}: {:>7.1} MiB ({:+.2} KiB per workflow over the last {round}; {per_second:.0} workflows/s)",
            mib(now),
            (now as f64 - last as f64) / 1024.0 / round as f64
        );
        last = now;
        warm.get_or_insert((done, now));
    }
    let (warm_done, warm_bytes) = warm.expect("at least one round");
    let measured = count - warm_done;
    if measured == 0 {
        println!("{label}: too few workflows to measure after the warm-up");
        return;
    }
    let drift = (last as f64 - warm_bytes as f64) / measured as f64;
    println!(
        "{label}: drift after the warm-up {:.2} KiB per workflow over {measured} (limit {:.2} KiB)",
        drift / 1024.0,
        DRIFT_BYTES_MAX / 1024.0
    );
    assert!(
        drift < DRIFT_BYTES_MAX,
        "{label}: the node keeps {drift:.0} bytes per finished workflow"
    );
}

#[tokio::main]
async fn main() {
    let count = std::env::var("REINS_BENCH_SOAK_WORKFLOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    soak("sqlite", None, count).await;
    if let Ok(admin) = std::env::var("REINS_BENCH_PG") {
        let url = fresh_pg_database(&admin, "reins_bench_soak").await;
        soak("postgres", Some(url), count).await;
    }
}
