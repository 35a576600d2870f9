//! Many paused workflows on one real node hold no JavaScript runtime: the node's resident memory
//! grows by a bounded amount per parked workflow (the figure is printed), and any one of them
//! still resumes by replay. The node is its own process, so the figure is its memory alone.
//! `REINS_TEST_PARKED` sets how many (default 10,000, the figure).

use std::time::Duration;

use serde_json::json;

use crate::http_api::{Db, Node, initialize, wait_for};

/// Resident set size of process `pid`, in bytes (Linux).
fn resident_bytes(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    // SAFETY: sysconf has no preconditions; it only reads a system value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

/// Memory a parked workflow may cost at most. The bench measures about 21 KiB (release); a
/// debug build about 36 KiB. A JavaScript runtime kept per workflow would cost hundreds of KiB.
const PARKED_BYTES_MAX: u64 = 96 * 1024;
/// Launches in flight at once.
const CONCURRENCY: usize = 32;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_paused_workflows_stay_small_and_any_of_them_resumes() {
    let count: usize = std::env::var("REINS_TEST_PARKED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let db = Db::new(false).await;
    let node = Node::start(
        &db,
        &[
            // Long leases: renewing ten thousand of them is not what this test is about.
            ("REINS_LEASE_SECONDS", "300".to_owned()),
            ("REINS_LIMITS__MAX_WORKFLOWS", "1000000".to_owned()),
            (
                "REINS_LIMITS__MAX_WORKFLOWS_PER_OWNER",
                "1000000".to_owned(),
            ),
        ],
    );
    let pid = node.process.pid();
    let mut api = initialize(&node).await;
    let script = "const input = await pause({stepId: 'p'}); return {input, n: args.n};";
    let launch = |api: &mut crate::http_client::Api, n: usize| {
        let mut api = api.clone();
        async move {
            let answer = api
                .action("launch", json!({"script": script, "args": {"n": n}}))
                .await;
            assert_eq!(answer.status, 200, "{answer:?}");
            answer.json()["run_id"].as_str().expect("run_id").to_owned()
        }
    };
    // Warm up (connections, the JS pool, the store) before measuring.
    let warm = launch(&mut api, usize::MAX).await;
    wait_for(&mut api, &warm, "paused").await;
    let before = resident_bytes(pid);

    let mut ids = Vec::with_capacity(count);
    for batch in (0..count).collect::<Vec<_>>().chunks(CONCURRENCY) {
        let launches: Vec<_> = batch.iter().map(|n| launch(&mut api, *n)).collect();
        ids.extend(futures_util::future::join_all(launches).await);
    }
    let paused = "SELECT count(*) FROM workflows WHERE status = 'paused'";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while db.sql(paused).await.and_then(|n| n.parse::<usize>().ok()) != Some(count + 1) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every workflow paused"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let grown = resident_bytes(pid).saturating_sub(before);
    let per_workflow = grown / count as u64;
    println!(
        "{count} paused workflows: node resident memory +{:.1} MiB, {:.1} KiB per parked workflow",
        grown as f64 / (1024.0 * 1024.0),
        per_workflow as f64 / 1024.0
    );
    assert!(
        per_workflow <= PARKED_BYTES_MAX,
        "{per_workflow} bytes per parked workflow"
    );

    let chosen = ids[count * 7 / 10].clone();
    let record = api.action("get", json!({"run_id": chosen})).await.json();
    let resumed = api
        .action(
            "resume",
            json!({"run_id": chosen, "fingerprint": record["fingerprint"],
                                 "step_id": "p", "attempt": 1, "input": "go"}),
        )
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let done = wait_for(&mut api, &chosen, "completed").await;
    assert_eq!(done["result"], json!({"input": "go", "n": count * 7 / 10}));
}
