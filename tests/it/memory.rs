//! A finished workflow leaves nothing behind in the node: after a warm-up, thousands more
//! one-step workflows through the real binary's API leave its anonymous resident memory where
//! it was (the drift per workflow is printed). A node that kept a few KiB per finished workflow
//! (a timer, a map entry, an actor cell) would run out of memory in days; `api/benches/soak.rs`
//! runs 100,000 workflows on both backends. `REINS_TEST_MEMORY_WORKFLOWS` sets the measured
//! count (default 4,000).

use std::time::Duration;

use serde_json::json;

use crate::http_api::{Db, Node, initialize};
use crate::http_client::Api;

/// Anonymous resident memory of process `pid`, in bytes (Linux): the heap, without the
/// binary's own pages, which only grow as code is first run.
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

/// Drift a finished workflow may leave, at most. The node's own caches (connections, the
/// allocator's free lists) settle during the warm-up: about 1 KiB per workflow is left of it in
/// a debug build. The leak this guards against kept 7 KiB per workflow (the `timeout_seconds`
/// timer of every finished workflow, holding its supervisor's cell for a day).
const DRIFT_BYTES_MAX: u64 = 3 * 1024;
/// Workflows run before the first measurement.
const WARM_UP: usize = 2_000;
/// Workflows in flight at once.
const CONCURRENCY: usize = 32;

/// Runs `count` one-step workflows, `CONCURRENCY` at a time, each to `completed`.
async fn run_workflows(api: &Api, count: usize) {
    let script = "const r = await agent({stepId: 's', agentRef: 'scripted', task: 'go'}); \
                  return r.output;";
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|worker| {
            let mut api = api.clone();
            let mine = count / CONCURRENCY + usize::from(worker < count % CONCURRENCY);
            tokio::spawn(async move {
                for _ in 0..mine {
                    let answer = api
                        .action("launch", json!({"script": script, "args": {}}))
                        .await;
                    assert_eq!(answer.status, 200, "{answer:?}");
                    let id = answer.json()["run_id"].as_str().expect("run_id").to_owned();
                    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                    loop {
                        let record = api.action("get", json!({"run_id": id})).await.json();
                        match record["status"].as_str() {
                            Some("completed") => break,
                            Some("running") => {}
                            other => panic!("{id} ended {other:?}: {record}"),
                        }
                        assert!(
                            tokio::time::Instant::now() < deadline,
                            "{id} did not complete"
                        );
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
}

/// Waits until the node runs no workflow supervisor (the last ones stop just after their rows
/// say `completed`).
async fn idle(api: &Api) {
    let mut api = api.clone();
    crate::harness::eventually(Duration::from_secs(60), "no supervisor left", async || {
        crate::dormant::supervisors(&mut api).await == 0
    })
    .await;
}

/// On PostgreSQL: a short run on SQLite cannot tell a leak this size from the warm-up of the
/// embedded database's threads (its readers' allocator arenas and page caches grow for tens of
/// thousands of workflows before they settle; the soak bench shows both backends flat after
/// that). What a finished workflow leaves behind is in the node, whatever the backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn finished_workflows_give_their_memory_back() {
    let count: usize = std::env::var("REINS_TEST_MEMORY_WORKFLOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4_000);
    let db = Db::new(true).await;
    let node = Node::start(&db, &[]);
    let pid = node.process.pid();
    let api = initialize(&node).await;

    run_workflows(&api, WARM_UP).await;
    // Idle: the last supervisors stop just after their rows say `completed`.
    idle(&api).await;
    let before = anonymous_resident_bytes(pid);
    run_workflows(&api, count).await;
    idle(&api).await;
    let after = anonymous_resident_bytes(pid);

    let drift = after.saturating_sub(before) / count as u64;
    println!(
        "{count} workflows after {WARM_UP} of warm-up: anonymous resident memory {:.1} -> {:.1} MiB, {:.2} KiB per workflow",
        before as f64 / (1024.0 * 1024.0),
        after as f64 / (1024.0 * 1024.0),
        drift as f64 / 1024.0
    );
    assert!(
        drift <= DRIFT_BYTES_MAX,
        "{drift} bytes per finished workflow stay in the node"
    );
}
