//! Child runs per second with the scripted agent (admit, mark running, run, terminal
//! compare-and-set, completion data) through a real node's actors, at 1 and 32 concurrent runs,
//! beside the store's fenced-write baseline measured in the same process on the same database.
//!
//! SQLite always runs (in a temp folder); PostgreSQL runs when `REINS_BENCH_PG` names an admin URL
//! (`tests/run-all.sh bench` sets it). `REINS_BENCH_RUNS` sets the runs per measurement (default
//! 640).

#[path = "../../benches/support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actors::agents::{AgentConfig, AgentRegistry};
use actors::{Admitted, Node, NodeIdentity, NodeOptions, RunEnd, RunRequest, RunsOptions};
use serde_json::json;
use store::{DatabaseUrl, Store, StoreOptions};
use support::{Run, fenced_writes, fresh_pg_database, timed};

const CONCURRENCY: [usize; 2] = [1, 32];

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let total: usize = std::env::var("REINS_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(640);
    println!(
        "{:<9} {:>5} {:<13} {:>9} {:>9} {:>9} {:>7}",
        "backend", "conc", "kind", "ops/s", "p50 ms", "p99 ms", "ratio"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = DatabaseUrl::Sqlite(dir.path().join("bench.db"));
    measure("sqlite", &sqlite, dir.path(), total).await;
    match std::env::var("REINS_BENCH_PG") {
        Ok(admin) => {
            let url = fresh_pg_database(&admin, "reins_bench_runs").await;
            measure("postgres", &DatabaseUrl::Postgres(url), dir.path(), total).await;
        }
        Err(_) => println!("postgres: skipped (REINS_BENCH_PG is not set)"),
    }
}

async fn measure(backend: &str, url: &DatabaseUrl, dir: &std::path::Path, total: usize) {
    let options = StoreOptions {
        pool_size: 40,
        ..StoreOptions::default()
    };
    let store = Arc::new(Store::open(url, &options).await.expect("open"));
    store.migrate().await.expect("migrate");
    let agents = AgentRegistry::new(&[AgentConfig::scripted("scripted")]).expect("agents");
    let runs = RunsOptions {
        lease_ms: 30_000,
        workspaces_dir: dir.join(format!("{backend}-workspaces")),
        fault_dir: None,
        agent_records_dir: None,
        agent_confinement: actors::agents::ConfinementMode::Landlock,
        task_bytes_max: 48 * 1024,
        error_bytes_max: 4 * 1024,
        orphan_sweep: Duration::from_secs(30),
    };
    let identity = NodeIdentity {
        worker_id: format!("bench-{backend}"),
        host: "bench".into(),
        pid: std::process::id(),
    };
    let node = Node::start(
        identity,
        Arc::clone(&store),
        NodeOptions::new(runs, Arc::new(agents)),
    )
    .await
    .expect("node");
    for concurrency in CONCURRENCY {
        let baseline = fenced_writes(
            &store,
            &format!("wf-{backend}-{concurrency}"),
            concurrency,
            total / concurrency,
        )
        .await;
        let child_runs = child_runs(&node, backend, concurrency, total).await;
        report(backend, concurrency, "fenced write", &baseline, None);
        let ratio = child_runs.per_second() / baseline.per_second();
        report(backend, concurrency, "child run", &child_runs, Some(ratio));
    }
    node.shutdown().await.expect("shutdown");
}

fn report(backend: &str, concurrency: usize, kind: &str, run: &Run, ratio: Option<f64>) {
    let ratio = ratio.map(|r| format!("{r:.2}")).unwrap_or_default();
    println!(
        "{backend:<9} {concurrency:>5} {kind:<13} {:>9.0} {:>9.3} {:>9.3} {ratio:>7}",
        run.per_second(),
        run.percentile_ms(0.50),
        run.percentile_ms(0.99),
    );
}

async fn child_runs(node: &Node, backend: &str, concurrency: usize, total: usize) -> Run {
    let per_worker = total / concurrency;
    timed(concurrency, |worker| {
        let runs = node.runs();
        let prefix = format!("{backend}-{concurrency}-{worker}");
        async move {
            let mut latencies = Vec::with_capacity(per_worker);
            for n in 0..per_worker {
                let begun = Instant::now();
                let request = RunRequest {
                    thread_id: format!("{prefix}-{n}"),
                    agent: "scripted".into(),
                    task: json!("ping"),
                    idempotency_key: None,
                    step: None,
                    run_id: None,
                    timeouts: Default::default(),
                };
                let Ok(Admitted::Started { ended, .. }) = runs.start(request).await else {
                    panic!("a bench run was not started");
                };
                match ended.await {
                    Ok(RunEnd::Persisted(_)) => {}
                    other => panic!("a bench run ended {other:?}"),
                }
                latencies.push(begun.elapsed());
            }
            latencies
        }
    })
    .await
}
