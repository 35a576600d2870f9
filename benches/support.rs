//! What the benches share: timing concurrent workers, the fenced-write baseline every figure is
//! compared with, and a fresh PostgreSQL database per bench run. Each bench includes this file
//! with `#[path]`, so it is compiled into the bench binaries only.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use store::{Fence, NewWorkflow, Store, WriteOp};

/// The allocator of the `reins` binary (`api/src/main.rs`), so the benches measure what runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Latencies of every operation and the wall time of the whole run.
pub struct Run {
    pub latencies: Vec<Duration>,
    pub wall: Duration,
}

impl Run {
    pub fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }

    pub fn percentile_ms(&self, p: f64) -> f64 {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let index = ((sorted.len() as f64 * p) as usize).min(sorted.len() - 1);
        sorted[index].as_secs_f64() * 1000.0
    }
}

/// Runs `workers` copies of `work` at once and gathers their latencies.
pub async fn timed<F, Fut>(workers: usize, work: F) -> Run
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Vec<Duration>> + Send + 'static,
{
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers).map(|w| tokio::spawn(work(w))).collect();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("worker task"));
    }
    Run {
        latencies,
        wall: started.elapsed(),
    }
}

/// One workflow (with its lease) per writer, named `{prefix}-{writer}`.
pub async fn workflows(store: &Store, prefix: &str, writers: usize) -> Vec<Fence> {
    let mut fences = Vec::new();
    for writer in 0..writers {
        let lease = store
            .create_workflow(
                NewWorkflow {
                    workflow_id: format!("{prefix}-{writer}").into(),
                    user_id: "bench".into(),
                    request_id: None,
                    fingerprint: "bench".into(),
                    data: json!({}),
                },
                "bench-node",
                600_000,
            )
            .await
            .expect("create workflow");
        fences.push(lease.fence());
    }
    fences
}

/// The baseline: each of `writers` appends `ops` journal entries to a workflow of its own (named
/// after `prefix`), each entry one fenced write.
pub async fn fenced_writes(store: &Arc<Store>, prefix: &str, writers: usize, ops: usize) -> Run {
    let fences = workflows(store, prefix, writers).await;
    timed(writers, move |writer| {
        let store = Arc::clone(store);
        let fence = fences[writer].clone();
        async move {
            let mut latencies = Vec::with_capacity(ops);
            for op in 0..ops {
                let change = WriteOp::PutStep {
                    workflow_id: fence.resource_id.clone(),
                    seq: i32::try_from(op).unwrap_or(i32::MAX),
                    step_id: format!("step-{op}"),
                    attempt: 1,
                    status: store::StepStatus::Completed,
                    record: store::StepRecord::new(store::StepKind::Agent, json!({"output": op})),
                };
                let started = Instant::now();
                store
                    .fenced_write(&fence, vec![change])
                    .await
                    .expect("fenced write");
                latencies.push(started.elapsed());
            }
            latencies
        }
    })
    .await
}

/// Creates (or re-creates) a database named `{name}_{pid}` beside `admin` and returns its URL.
pub async fn fresh_pg_database(admin: &str, name: &str) -> String {
    let name = format!("{name}_{}", std::process::id());
    let (client, connection) = tokio_postgres::connect(admin, tokio_postgres::NoTls)
        .await
        .expect("connect to REINS_BENCH_PG");
    tokio::spawn(connection);
    // CREATE DATABASE cannot share a transaction, so each statement goes alone.
    for statement in [
        format!("DROP DATABASE IF EXISTS {name}"),
        format!("CREATE DATABASE {name}"),
    ] {
        client
            .batch_execute(&statement)
            .await
            .expect("create the bench database");
    }
    let (base, _) = admin.rsplit_once('/').expect("URL names a database");
    format!("{base}/{name}")
}
