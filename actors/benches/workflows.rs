//! Workflows of 10 sequential scripted-agent steps through a real node: (a) one at a time, p50/p99
//! per workflow and per step; (b) many at once (concurrency 32), workflows/s and steps/s; beside
//! the store's fenced-write baseline at the same concurrency in the same process; and the memory a
//! parked (paused) workflow costs, from the process's resident set.
//!
//! SQLite always runs; PostgreSQL when `REINS_BENCH_PG` names an admin URL. `REINS_BENCH_WORKFLOWS`
//! sets the workflows of (b) (default 1000), `REINS_BENCH_PARKED` the parked ones (default 10000).
//! `REINS_BENCH_SLOTS` caps the node's agent slots (`max_active_children`, default 10000) and
//! `REINS_BENCH_SLOTS_PER_USER` sets the one user's share of them (default: all of them), so a
//! share can be measured against none in the same build, and `REINS_BENCH_SLOTS_RESERVED` the
//! slots kept for other users (`active_children_reserved`, default 0).

#[path = "../../benches/support.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actors::agents::{AgentConfig, AgentRegistry};
use actors::{LaunchRequest, Node, NodeIdentity, NodeOptions, RunsOptions, WorkflowsHandle};
use serde_json::json;
use store::{
    Admission, DatabaseUrl, Launch, LaunchLimits, NewRun, NewWorkflow, RunId, RunOutcome,
    RunStatus, Store, StoreOptions, WorkflowId, WorkflowStep, WriteOp,
};
use support::{Run, fenced_writes, fresh_pg_database};

const STEPS: usize = 10;
/// The grant a workflow's first artifact takes (the node's `STORAGE_GRANT_BYTES`).
const STORAGE_GRANT_BYTES: i64 = 256 * 1024;
const CONCURRENCY: usize = 32;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn script() -> String {
    let mut body = String::new();
    for n in 0..STEPS {
        body.push_str(&format!(
            "await agent({{stepId: \"s{n}\", agentRef: \"scripted\", task: \"t{n}\"}});\n"
        ));
    }
    body.push_str("return 1;");
    body
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let many = env("REINS_BENCH_WORKFLOWS", 1000);
    let parked = env("REINS_BENCH_PARKED", 10_000);
    let dir = tempfile::tempdir().expect("temp dir");
    measure(
        "sqlite",
        &DatabaseUrl::Sqlite(dir.path().join("bench.db")),
        dir.path(),
        many,
        parked,
    )
    .await;
    match std::env::var("REINS_BENCH_PG") {
        Ok(admin) => {
            let url = fresh_pg_database(&admin, "reins_bench_workflows").await;
            measure(
                "postgres",
                &DatabaseUrl::Postgres(url),
                dir.path(),
                many,
                parked,
            )
            .await;
        }
        Err(_) => println!("postgres: skipped (REINS_BENCH_PG is not set)"),
    }
}

async fn measure(
    backend: &str,
    url: &DatabaseUrl,
    dir: &std::path::Path,
    many: usize,
    parked: usize,
) {
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
    let mut node_options = NodeOptions::new(runs, Arc::new(agents));
    let slots_max = env("REINS_BENCH_SLOTS", 10_000);
    let slots_per_user_max = env("REINS_BENCH_SLOTS_PER_USER", slots_max);
    node_options.workflows.slots_max = u64::try_from(slots_max).unwrap_or(u64::MAX);
    node_options.workflows.slots_per_user_max =
        u64::try_from(slots_per_user_max).unwrap_or(u64::MAX);
    let slots_reserved = env("REINS_BENCH_SLOTS_RESERVED", 0);
    node_options.workflows.slots_reserved = u64::try_from(slots_reserved).unwrap_or(0);
    println!(
        "{backend}: {slots_max} agent slots, a share of {slots_per_user_max}, \
         {slots_reserved} kept for others"
    );
    let identity = NodeIdentity {
        worker_id: format!("bench-{backend}"),
        host: "bench".into(),
        pid: std::process::id(),
    };
    let node = Node::start(identity, Arc::clone(&store), node_options)
        .await
        .expect("node");
    let workflows = node.workflows();

    // (a) one at a time
    let started = Instant::now();
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let begun = Instant::now();
        run_one(&workflows, &store).await;
        latencies.push(begun.elapsed());
    }
    let one_at_a_time = Run {
        latencies,
        wall: started.elapsed(),
    };
    println!(
        "{backend:<9} one at a time: per workflow p50 {:.2} ms p99 {:.2} ms; per step p50 {:.2} ms",
        one_at_a_time.percentile_ms(0.5),
        one_at_a_time.percentile_ms(0.99),
        one_at_a_time.percentile_ms(0.5) / STEPS as f64
    );

    // (b) many at once, beside fenced writes at the same concurrency, measured just before and
    // just after (their mean is the baseline: on a busy 2-core machine one short run drifts)
    let per_writer = (many * STEPS / 2 / CONCURRENCY).max(1);
    let before = fenced_writes(
        &store,
        &format!("baseline-before-{backend}"),
        CONCURRENCY,
        per_writer,
    )
    .await
    .per_second();
    let started = Instant::now();
    let per_worker = many / CONCURRENCY;
    let workers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (workflows, store) = (workflows.clone(), Arc::clone(&store));
            tokio::spawn(async move {
                for _ in 0..per_worker {
                    run_one(&workflows, &store).await;
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("worker");
    }
    let wall = started.elapsed().as_secs_f64();
    let after = fenced_writes(
        &store,
        &format!("baseline-after-{backend}"),
        CONCURRENCY,
        per_writer,
    )
    .await
    .per_second();
    let baseline = (before + after) / 2.0;
    let done = (per_worker * CONCURRENCY) as f64;
    let steps_per_second = done * STEPS as f64 / wall;
    println!(
        "{backend:<9} {CONCURRENCY} at once: {:.0} workflows/s, {:.0} steps/s; fenced writes {:.0}/s (before {before:.0}, after {after:.0}); steps/fenced = {:.2}",
        done / wall,
        steps_per_second,
        baseline,
        steps_per_second / baseline
    );

    // (c) the store's part alone: the writes these workflows made, straight to the store
    let floor = store_writes_of_workflows(&store, backend, many).await;
    same_rows_as_the_node(&workflows, &store, backend).await;
    println!(
        "{backend:<9} {CONCURRENCY} at once, the store's writes alone: {floor:.0} steps/s; floor/fenced = {:.2}, node/floor = {:.2}",
        floor / baseline,
        steps_per_second / floor
    );

    // memory per parked workflow
    let before = resident_bytes();
    let pause = "await pause({stepId: \"p\"}); return 1;";
    let mut ids = Vec::new();
    for _ in 0..parked {
        let request = LaunchRequest {
            user_id: "bench".into(),
            request_id: None,
            title: None,
            timeout_seconds: None,
            script: pause.into(),
            args: json!({}),
        };
        ids.push(
            workflows
                .launch(request)
                .await
                .expect("launch")
                .row
                .workflow_id,
        );
    }
    while let Some(last) = ids.last()
        && store
            .read_workflow(last)
            .await
            .ok()
            .flatten()
            .is_none_or(|row| row.status != store::WorkflowStatus::Paused)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = resident_bytes();
    println!(
        "{backend:<9} {parked} parked workflows: resident memory +{:.1} MiB, {:.1} KiB per parked workflow",
        (after.saturating_sub(before)) as f64 / (1024.0 * 1024.0),
        (after.saturating_sub(before)) as f64 / 1024.0 / parked.max(1) as f64
    );
    node.shutdown().await.expect("shutdown");
}

/// Launches one 10-step workflow and waits for it to complete: its supervisor's stop is the cue
/// to read the row, so waiting costs the node nothing (polling the row would compete with the
/// workflows for the store).
async fn run_one(workflows: &WorkflowsHandle, store: &Store) -> WorkflowId {
    let mut stopped = workflows.stopped();
    let request = LaunchRequest {
        user_id: "bench".into(),
        request_id: None,
        title: None,
        timeout_seconds: None,
        script: script(),
        args: json!({}),
    };
    let id = workflows
        .launch(request)
        .await
        .expect("launch")
        .row
        .workflow_id;
    loop {
        match tokio::time::timeout(Duration::from_secs(1), stopped.recv()).await {
            Ok(Ok(other)) if other != id => continue,
            Ok(Err(tokio::sync::broadcast::error::RecvError::Closed)) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Ours, a lagged receiver, or a second without news: read the row.
            _ => {}
        }
        match store.read_workflow(&id).await.expect("read") {
            Some(row) if row.status == store::WorkflowStatus::Completed => return id,
            Some(row) if row.status == store::WorkflowStatus::Failed => {
                panic!("a bench workflow failed: {:?}", row.data)
            }
            _ => {}
        }
    }
}

/// Steps per second when only the store works: `many` workflows at concurrency 32, each making
/// the very writes a node makes for a 10-step scripted workflow (launch; per step an admission
/// that carries the previous step's outcome, its artifact and slot release and the new step's
/// entry, then the child's outcome compare-and-set; the first output, which takes the
/// workflow's grant of stored bytes, in a write of its own; the end, which gives the unused
/// grant and the lease back in the same write), with no
/// actors, no JavaScript and no agent. The node can never beat this figure; the distance to it
/// is what the node itself costs.
async fn store_writes_of_workflows(store: &Arc<Store>, backend: &str, many: usize) -> f64 {
    let per_worker = many / CONCURRENCY;
    let run = support::timed(CONCURRENCY, |_| {
        let store = Arc::clone(store);
        let owner = format!("floor-{backend}");
        async move {
            let mut latencies = Vec::with_capacity(per_worker);
            for _ in 0..per_worker {
                let begun = Instant::now();
                store_writes_of_one(&store, &owner, &new_id()).await;
                latencies.push(begun.elapsed());
            }
            latencies
        }
    })
    .await;
    run.per_second() * STEPS as f64
}

async fn store_writes_of_one(store: &Store, owner: &str, workflow_id: &str) {
    let workflow = NewWorkflow {
        workflow_id: workflow_id.into(),
        user_id: "bench".into(),
        request_id: None,
        fingerprint: "0".repeat(64),
        data: json!({"script": script(), "args": {}, "seed": 1, "started_at_ms": 0,
                     "runtime_version": "0".repeat(64), "configuration_version": "0".repeat(64)}),
    };
    let Launch::Created { lease, .. } = store
        .launch_workflow(workflow, owner, 30_000, LaunchLimits::NONE)
        .await
        .expect("launch")
    else {
        panic!("a bench workflow was not created");
    };
    let fence = lease.fence();
    let step = |n: usize, status: store::StepStatus, run_id: &str| {
        let mut data = json!({"args": {"stepId": format!("s{n}"), "agentRef": "scripted", "task": format!("t{n}")},
                              "outcome": null, "settled_at_ms": null,
                              "run_id": run_id, "thread_id": format!("{workflow_id}-{n:016x}"),
                              "configuration_version": "0".repeat(64)});
        if status == store::StepStatus::Completed {
            data["outcome"] = json!({"outcome": "resolved",
                                     "value": {"output": format!("t{n}"), "artifactVersion": n + 1,
                                               "threadId": format!("{workflow_id}-{n:016x}"),
                                               "runId": run_id, "status": "success"}});
            data["settled_at_ms"] = json!(1);
        }
        WriteOp::PutStep {
            workflow_id: workflow_id.into(),
            seq: i32::try_from(n).unwrap_or(i32::MAX),
            step_id: format!("s{n}"),
            attempt: 1,
            status,
            record: store::StepRecord::decode("agent", &data).expect("a step record"),
        }
    };
    let ended = |n: usize, run_id: &str| {
        vec![
            step(n, store::StepStatus::Completed, run_id),
            WriteOp::PutArtifact {
                workflow_id: workflow_id.into(),
                version: i64::try_from(n + 1).unwrap_or(i64::MAX),
                source_step_id: format!("s{n}"),
                path: None,
                content: format!("\"t{n}\"").into_bytes(),
                sha256: "0".repeat(64),
            },
            WriteOp::ReleaseSlot {
                workflow_id: workflow_id.into(),
                step_id: format!("s{n}"),
            },
        ]
    };
    let mut previous: Option<RunId> = None;
    for n in 0..STEPS {
        let run_id = RunId::new(new_id());
        let mut journal = match &previous {
            // The first output is stored under the workflow's first grant of its owner's
            // quota, in a write of its own, before the script sees it.
            Some(first) if n == 1 => {
                let mut ops = vec![WriteOp::TakeStorage {
                    workflow_id: workflow_id.into(),
                    bytes: STORAGE_GRANT_BYTES,
                    bytes_max: 0,
                }];
                ops.extend(ended(0, first.as_str()));
                store
                    .fenced_write(&fence, ops)
                    .await
                    .expect("the first output");
                Vec::new()
            }
            Some(previous) => ended(n - 1, previous.as_str()),
            None => Vec::new(),
        };
        journal.push(step(n, store::StepStatus::Running, run_id.as_str()));
        let run = NewRun {
            run_id: run_id.clone(),
            thread_id: format!("{workflow_id}-{n:016x}"),
            agent: "scripted".into(),
            owner: owner.into(),
            lease_ms: 30_000,
            idempotency: Some((
                format!("{workflow_id}/s{n}/1"),
                json!({"agent": "scripted", "task": format!("t{n}")}),
            )),
            metadata: json!({}),
            step: Some(WorkflowStep {
                workflow_id: workflow_id.into(),
                step_id: format!("s{n}"),
                attempt: 1,
                slots_max: 10_000,
                slots_per_user_max: 10_000,
                slots_reserved: 0,
                fence: fence.clone(),
                journal,
            }),
        };
        let Admission::Admitted(_) = store.admit_run(run).await.expect("admit") else {
            panic!("a bench step was not admitted");
        };
        let outcome = RunOutcome {
            status: RunStatus::Success,
            error: None,
            output: Some(json!(format!("t{n}"))),
            stop_reason: None,
            total_tokens: 0,
            message_count: 0,
            failure: None,
        };
        assert!(
            store
                .finalize_run(&run_id, owner, &outcome, true)
                .await
                .expect("finalize"),
            "a bench outcome was refused"
        );
        previous = Some(run_id);
    }
    let mut last = ended(STEPS - 1, previous.as_ref().map_or("", RunId::as_str));
    last.push(WriteOp::SetWorkflow {
        workflow_id: workflow_id.into(),
        status: store::WorkflowStatus::Completed,
        data: json!({"result": 1}),
    });
    last.push(WriteOp::ReturnStorage {
        workflow_id: workflow_id.into(),
    });
    last.push(WriteOp::ReleaseLease);
    store.fenced_write(&fence, last).await.expect("finish");
}

/// Checks that the floor still makes the rows a node makes (a floor that wrote less would flatter
/// it): one workflow each way, compared by status, journal, artifacts and lease.
async fn same_rows_as_the_node(workflows: &WorkflowsHandle, store: &Store, backend: &str) {
    let by_node = run_one(workflows, store).await;
    let by_floor = new_id();
    store_writes_of_one(store, &format!("floor-{backend}"), &by_floor).await;
    let by_floor = WorkflowId::new(by_floor);
    let (node, floor) = (
        rows_of(store, &by_node).await,
        rows_of(store, &by_floor).await,
    );
    assert_eq!(
        node, floor,
        "the floor no longer writes what the node writes: update store_writes_of_one"
    );
    assert_eq!(
        store.count_slots().await.expect("slots"),
        0,
        "a finished workflow still holds a slot"
    );
}

/// What a finished workflow left: its status, its journal (step, kind, status, whether it names
/// a child run, whether it has an outcome), its newest artifact version, and whether its lease
/// was given back.
async fn rows_of(store: &Store, workflow_id: &WorkflowId) -> impl PartialEq + std::fmt::Debug {
    let status = store
        .read_workflow(workflow_id)
        .await
        .expect("read")
        .map(|row| row.status);
    let steps: Vec<_> = store
        .read_steps(workflow_id)
        .await
        .expect("steps")
        .into_iter()
        .map(|step| {
            (
                step.seq,
                step.step_id.clone(),
                step.kind(),
                step.status,
                step.record().and_then(store::StepRecord::run_id).is_some(),
                step.record().and_then(store::StepRecord::output_version),
            )
        })
        .collect();
    let artifacts = store
        .last_artifact_version(workflow_id)
        .await
        .expect("artifacts");
    let now = store.now().await.expect("clock");
    let released = store
        .read_lease(workflow_id)
        .await
        .expect("lease")
        .map(|lease| lease.expires_at <= now);
    (status, steps, artifacts, released)
}

/// An id as the node makes them (time-ordered, so rows land where the node's would).
fn new_id() -> String {
    uuid::Uuid::now_v7().simple().to_string()
}

/// The process's resident set, in bytes (Linux).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    pages * 4096
}
