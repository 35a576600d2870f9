//! Fenced writes per second and their latency, beside a plain single-row insert-and-commit
//! baseline measured in the same process on the same database, at 1 and 16 concurrent writers.
//! Both write the same journal row (`workflow_steps`) of a workflow of their own; the baseline is a
//! plain `INSERT` in autocommit, the fenced write adds the lease check and lock. The ratio is
//! therefore the price of fencing, not of the table.
//!
//! SQLite always runs (in a temp folder); PostgreSQL runs when `REINS_BENCH_PG` names an admin URL
//! (`tests/run-all.sh bench` starts a private cluster and sets it). Each PostgreSQL run creates a
//! fresh database. `REINS_BENCH_OPS` sets the writes per writer (default 400).
//!
//! The baseline on PostgreSQL is one connection per writer, each `INSERT` prepared and autocommitted.
//! SQLite admits one writer at a time, so its fairest plain baseline is one connection shared by all
//! writers (no busy-waiting), each `INSERT` its own transaction.

#[path = "../../benches/support.rs"]
mod support;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde_json::json;
use store::{DatabaseUrl, Fence, Store, StoreOptions};
use support::{Run, fenced_writes, fresh_pg_database, timed, workflows};

const WRITERS: [usize; 2] = [1, 16];

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let ops: usize = std::env::var("REINS_BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    println!(
        "{:<9} {:>7} {:<9} {:>10} {:>9} {:>9} {:>8}",
        "backend", "writers", "kind", "writes/s", "p50 ms", "p99 ms", "ratio"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("bench.db");
    let sqlite = open(&DatabaseUrl::Sqlite(path.clone())).await;
    let shared = Arc::new(Mutex::new(
        rusqlite::Connection::open(&path).expect("open the sqlite baseline connection"),
    ));
    shared
        .lock()
        .expect("lock")
        .execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;
             PRAGMA foreign_keys = ON;",
        )
        .expect("baseline connection settings");
    for writers in WRITERS {
        let workflows = workflows(&sqlite, &format!("baseline-{writers}"), writers).await;
        let baseline = sqlite_baseline(Arc::clone(&shared), workflows, ops).await;
        let fenced = fenced_writes(&sqlite, &format!("sqlite-{writers}"), writers, ops).await;
        report("sqlite", writers, &baseline, &fenced);
    }
    drop(sqlite);

    match std::env::var("REINS_BENCH_PG") {
        Ok(admin) => {
            let url = fresh_pg_database(&admin, "reins_bench").await;
            let postgres = open(&DatabaseUrl::Postgres(url.clone())).await;
            for writers in WRITERS {
                let workflows = workflows(&postgres, &format!("baseline-{writers}"), writers).await;
                let baseline = pg_baseline(&url, workflows, ops).await;
                let fenced =
                    fenced_writes(&postgres, &format!("postgres-{writers}"), writers, ops).await;
                report("postgres", writers, &baseline, &fenced);
            }
        }
        Err(_) => println!("postgres: skipped (REINS_BENCH_PG is not set)"),
    }
}

fn report(backend: &str, writers: usize, baseline: &Run, fenced: &Run) {
    let ratio = fenced.per_second() / baseline.per_second();
    for (kind, run, shown) in [
        ("baseline", baseline, String::new()),
        ("fenced", fenced, format!("{ratio:.2}")),
    ] {
        println!(
            "{backend:<9} {writers:>7} {kind:<9} {:>10.0} {:>9.3} {:>9.3} {shown:>8}",
            run.per_second(),
            run.percentile_ms(0.50),
            run.percentile_ms(0.99),
        );
    }
}

async fn open(url: &DatabaseUrl) -> Arc<Store> {
    let options = StoreOptions {
        pool_size: 32,
        ..StoreOptions::default()
    };
    let store = Store::open(url, &options).await.expect("open the store");
    store.migrate().await.expect("migrate");
    Arc::new(store)
}

async fn sqlite_baseline(
    connection: Arc<Mutex<rusqlite::Connection>>,
    workflows: Vec<Fence>,
    ops: usize,
) -> Run {
    timed(workflows.len(), move |writer| {
        let connection = Arc::clone(&connection);
        let workflow = workflows[writer].resource_id.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let mut latencies = Vec::with_capacity(ops);
                for op in 0..ops {
                    let started = Instant::now();
                    connection
                        .lock()
                        .expect("lock")
                        .prepare_cached(
                            "INSERT INTO workflow_steps (workflow, step_id, attempt, kind, status,
                                                         data, created_at, updated_at)
                             VALUES (?1, ?2, 1, 'agent', 'completed', ?3,
                                     unixepoch('subsec'), unixepoch('subsec'))",
                        )
                        .expect("prepare")
                        .execute((
                            &workflow,
                            format!("step-{op}"),
                            format!("{{\"output\":{op}}}"),
                        ))
                        .expect("insert");
                    latencies.push(started.elapsed());
                }
                latencies
            })
            .await
            .expect("baseline writer")
        }
    })
    .await
}

async fn pg_baseline(url: &str, workflows: Vec<Fence>, ops: usize) -> Run {
    let mut clients = Vec::new();
    for _ in 0..workflows.len() {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        clients.push(Arc::new(client));
    }
    timed(workflows.len(), move |writer| {
        let client = Arc::clone(&clients[writer]);
        let workflow = workflows[writer].resource_id.clone();
        async move {
            let insert = client
                .prepare(
                    "INSERT INTO workflow_steps (workflow, step_id, attempt, kind, status, data,
                                                 created_at, updated_at)
                     VALUES ($1, $2, 1, 'agent', 'completed', $3, reins_now(), reins_now())",
                )
                .await
                .expect("prepare");
            let mut latencies = Vec::with_capacity(ops);
            for op in 0..ops {
                let started = Instant::now();
                client
                    .execute(
                        &insert,
                        &[&workflow, &format!("step-{op}"), &json!({"output": op})],
                    )
                    .await
                    .expect("insert");
                latencies.push(started.elapsed());
            }
            latencies
        }
    })
    .await
}
