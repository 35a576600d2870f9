//! Chaos on real processes: three `reins serve` nodes on one PostgreSQL of the test's own, with
//! automatic recovery, 3 s leases and 24 child slots, run a seeded mix of workflows (sequential
//! steps, a parallel fan-out, pause and resume, capture and approval, a caught failure, a
//! fail-fast `parallel`) while a seeded schedule SIGKILLs and restarts nodes, SIGSTOPs them for
//! up to 6 s, restarts PostgreSQL, cancels a workflow while killing its owner, and sends the same
//! or conflicting decisions through two nodes at once. Then everything heals, the test answers
//! whatever still waits for a person, waits for quiescence and checks the invariants:
//!
//! - at most one child run per (workflow, step, attempt);
//! - every workflow terminal, or `needs_reconciliation` with a recorded reason;
//! - every completed result equal to the one its script must give;
//! - every decision applied once, the one that was accepted, about the artifact version shown;
//! - no slot, lease or live child run held by a terminal workflow;
//! - no two runs of one step live at once (an attempt's run ended before the next one began);
//! - no panic in any node's log.
//!
//! It runs twice: with the `scripted` agent as configured by default (not idempotent: a step
//! whose run died with its node waits for an operator, honestly), and declared idempotent with
//! a few attempts, where no workflow may end in `needs_reconciliation`: every lost run is
//! closed and run again as the step's next attempt. Both print their counts by status.
//!
//! `REINS_CHAOS_SEED` picks the schedule (a failing run prints its seed) and
//! `REINS_CHAOS_SECONDS` its length (CI runs the default, 45 s). A long run:
//! `REINS_CHAOS_SECONDS=600 REINS_CHAOS_SEED=7 cargo test -p tests --test it chaos -- --nocapture`
//! (with `REINS_TEST_PG` unset: the test starts its own PostgreSQL).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use crate::harness::{ReinsProcess, free_port};
use crate::http_client::{Answer, Api};
use crate::private_pg::PrivatePg;

const SECRET: &str = "chaos-secret-shared-by-the-three-nodes-0123456789";
/// How long one HTTP call may take before the test treats its outcome as unknown.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How many workflows the test keeps alive while the faults go on.
const ALIVE: usize = 24;

/// A small, seeded, reproducible stream of choices (xorshift64*).
struct Dice(u64);

impl Dice {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(from + self.below(to - from + 1))
    }
}

/// The kinds of workflow in the mix.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Sequential,
    FanOut,
    PauseResume,
    Review,
    CaughtFailure,
    FailFast,
}

const KINDS: [Kind; 6] = [
    Kind::Sequential,
    Kind::FanOut,
    Kind::PauseResume,
    Kind::Review,
    Kind::CaughtFailure,
    Kind::FailFast,
];

impl Kind {
    fn script(self) -> &'static str {
        match self {
            Kind::Sequential => {
                r#"const out = [];
                   for (const s of ["s1", "s2", "s3"]) {
                     out.push((await agent({stepId: s, agentRef: "scripted",
                       task: {sleep_ms: args.ms, output: s + "-" + args.n}})).output);
                   }
                   return out;"#
            }
            Kind::FanOut => {
                r#"const r = await parallel([1, 2, 3, 4].map(i => () => agent({stepId: "f" + i,
                     agentRef: "scripted", task: {sleep_ms: args.ms, output: i * args.n}})));
                   return r.map(x => x.output);"#
            }
            Kind::PauseResume => {
                r#"const a = await agent({stepId: "a", agentRef: "scripted",
                     task: {sleep_ms: args.ms, output: args.n}});
                   const input = await pause({stepId: "hold"});
                   return {a: a.output, input};"#
            }
            Kind::Review => {
                r#"await agent({stepId: "draft", agentRef: "scripted", task: {sleep_ms: args.ms,
                     write: [{path: "/mnt/user-data/outputs/r.txt", content: "report " + args.n}],
                     output: "drafted"}});
                   const f = await captureArtifact({stepId: "file", sourceStepId: "draft",
                     path: "/mnt/user-data/outputs/r.txt"});
                   const text = await readArtifact({artifactVersion: f.artifactVersion});
                   const review = await humanCheckpoint({stepId: "review", sourceStepId: "file",
                     artifactVersion: f.artifactVersion, onReject: "return"});
                   return {text, decision: review.decision, version: f.artifactVersion};"#
            }
            Kind::CaughtFailure => {
                r#"try {
                     await agent({stepId: "bad", agentRef: "scripted",
                       task: {sleep_ms: args.ms, fail: "nope"}});
                   } catch (e) { return "caught " + args.n; }
                   return "not caught";"#
            }
            Kind::FailFast => {
                r#"await parallel([
                     () => agent({stepId: "slow", agentRef: "scripted",
                       task: {sleep_ms: 3000, output: 1}}),
                     () => agent({stepId: "bad", agentRef: "scripted",
                       task: {sleep_ms: args.ms, fail: "boom"}}),
                   ]);
                   return "unreachable";"#
            }
        }
    }

    /// The result a completed run must have given (`None`: it must not complete).
    fn expected(self, n: u64, workflow: &Tracked) -> Option<Value> {
        match self {
            Kind::Sequential => Some(json!([
                format!("s1-{n}"),
                format!("s2-{n}"),
                format!("s3-{n}")
            ])),
            Kind::FanOut => Some(json!([n, 2 * n, 3 * n, 4 * n])),
            Kind::PauseResume => Some(json!({"a": n, "input": {"go": n}})),
            // The decision is checked against what was accepted, separately.
            Kind::Review => Some(json!({"text": format!("report {n}"), "version": 2,
                                        "decision": workflow.decision_seen.clone()})),
            Kind::CaughtFailure => Some(json!(format!("caught {n}"))),
            Kind::FailFast => None,
        }
    }
}

/// What the test knows about one workflow it launched.
struct Tracked {
    kind: Kind,
    n: u64,
    /// A cancel was asked for (its outcome may be `cancelled` or whatever came first).
    cancelled: bool,
    /// Decisions the nodes accepted (200), and decisions whose answer never came.
    decisions_accepted: BTreeSet<String>,
    decisions_unknown: BTreeSet<String>,
    /// Filled in at the end from the result, for the comparison.
    decision_seen: Value,
}

/// One node: its process (absent while killed), where it listens, its folder.
struct ChaosNode {
    process: Option<ReinsProcess>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    stopped: bool,
    /// Everything earlier processes of this node wrote to stderr.
    logs: String,
}

struct Cluster {
    /// The configuration file every node reads, when the test gives one.
    config: Option<String>,
    pg: std::sync::Arc<PrivatePg>,
    nodes: Vec<ChaosNode>,
    workspaces: tempfile::TempDir,
    token: String,
}

impl Cluster {
    fn env(&self, node: usize) -> Vec<(&'static str, String)> {
        let data = self.nodes[node].dir.path().join("data");
        let config = self
            .config
            .iter()
            .map(|config| ("REINS_CONFIG", config.clone()));
        config
            .chain([
                ("REINS_DATABASE", self.pg.url()),
                ("REINS_LISTEN", self.nodes[node].addr.to_string()),
                ("REINS_DATA_DIR", data.display().to_string()),
                (
                    "REINS_WORKSPACES_DIR",
                    self.workspaces.path().display().to_string(),
                ),
                ("REINS_SECRET", SECRET.to_owned()),
                ("REINS_LEASE_SECONDS", "3".to_owned()),
                ("REINS_RECOVERY", "automatic".to_owned()),
                ("REINS_LIMITS__MAX_ACTIVE_CHILDREN", "24".to_owned()),
            ])
            .collect()
    }

    async fn start(&mut self, node: usize) {
        let env = self.env(node);
        let (dir, addr) = (
            self.nodes[node].dir.path().to_path_buf(),
            self.nodes[node].addr,
        );
        let process = tokio::task::spawn_blocking(move || {
            let mut process = ReinsProcess::serve(&dir, addr, &env);
            process.wait_ready(Duration::from_secs(60));
            process
        })
        .await
        .expect("start a node");
        self.nodes[node].process = Some(process);
        self.nodes[node].stopped = false;
    }

    fn kill(&mut self, node: usize) {
        if let Some(mut process) = self.nodes[node].process.take() {
            process.signal(libc::SIGKILL);
            process.wait_exit(Duration::from_secs(10));
            let log = process.stderr();
            self.nodes[node].logs.push_str(&log);
        }
        self.nodes[node].stopped = false;
    }

    fn up(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|n| self.nodes[*n].process.is_some() && !self.nodes[*n].stopped)
            .collect()
    }

    fn api(&self, node: usize) -> Api {
        let mut api = Api::new(self.nodes[node].addr);
        api.bearer = Some(self.token.clone());
        api
    }

    /// The node whose process has this pid (a worker id is `host-pid-suffix`).
    fn node_of_worker(&self, worker_id: &str) -> Option<usize> {
        (0..self.nodes.len()).find(|n| {
            self.nodes[*n]
                .process
                .as_ref()
                .is_some_and(|p| worker_id.split('-').any(|part| part == p.pid().to_string()))
        })
    }
}

/// One call with a deadline; `None` when the answer never came (its outcome is unknown).
async fn call(api: &mut Api, method: &str, path: &str, body: Option<Value>) -> Option<Answer> {
    let bytes = body
        .map(|b| serde_json::to_vec(&b).expect("json"))
        .unwrap_or_default();
    let content_type = (!bytes.is_empty()).then_some("application/json");
    tokio::time::timeout(
        CALL_TIMEOUT,
        api.try_send(method, path, content_type, bytes, &[]),
    )
    .await
    .ok()
    .and_then(Result::ok)
}

fn seed() -> u64 {
    std::env::var("REINS_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_201)
}

fn seconds() -> u64 {
    std::env::var("REINS_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(45)
}

async fn launch(cluster: &Cluster, dice: &mut Dice, tracked: &mut BTreeMap<String, Tracked>) {
    let up = cluster.up();
    if up.is_empty() {
        return;
    }
    let node = up[dice.below(up.len() as u64) as usize];
    let kind = KINDS[dice.below(KINDS.len() as u64) as usize];
    let n = 1 + dice.below(1_000_000);
    let ms = 50 + dice.below(400);
    let body = json!({"script": kind.script(), "args": {"n": n, "ms": ms},
                      "request_id": format!("chaos-{n}-{}", dice.next())});
    let mut api = cluster.api(node);
    for _ in 0..2 {
        // A launch whose answer never came is asked again with the same request id: the
        // same workflow answers.
        if let Some(answer) = call(&mut api, "POST", "/api/v1/workflows", Some(body.clone())).await
            && answer.status == 201
            && let Some(id) = answer.json()["run_id"].as_str()
        {
            tracked.insert(
                id.to_owned(),
                Tracked {
                    kind,
                    n,
                    cancelled: false,
                    decisions_accepted: BTreeSet::new(),
                    decisions_unknown: BTreeSet::new(),
                    decision_seen: Value::Null,
                },
            );
            return;
        }
    }
}

/// Reads a workflow through any node that answers.
async fn get(cluster: &Cluster, dice: &mut Dice, id: &str) -> Option<Value> {
    let up = cluster.up();
    for _ in 0..up.len() {
        let node = up[dice.below(up.len() as u64) as usize];
        let mut api = cluster.api(node);
        if let Some(answer) = call(&mut api, "GET", &format!("/api/v1/workflows/{id}"), None).await
            && answer.status == 200
        {
            return Some(answer.json());
        }
    }
    None
}

/// Answers a workflow that waits for a person, through one node or (sometimes) two at once,
/// with the same or the opposite decision.
async fn answer(
    cluster: &Cluster,
    dice: &mut Dice,
    id: &str,
    record: &Value,
    workflow: &mut Tracked,
) {
    let up = cluster.up();
    if up.is_empty() {
        return;
    }
    let first = up[dice.below(up.len() as u64) as usize];
    let second = up[dice.below(up.len() as u64) as usize];
    match record["stored_status"].as_str() {
        Some("paused") => {
            let body = json!({"step_id": "hold", "attempt": 1, "input": {"go": workflow.n},
                              "fingerprint": record["fingerprint"]});
            let mut api = cluster.api(first);
            let _ = call(
                &mut api,
                "POST",
                &format!("/api/v1/workflows/{id}/resume"),
                Some(body),
            )
            .await;
        }
        Some("waiting_approval") => {
            let Some(version) = record["checkpoints"].as_array().and_then(|c| {
                c.iter()
                    .find(|c| c["step_id"] == "review")
                    .and_then(|c| c["artifact_version"].as_u64())
            }) else {
                return;
            };
            let decision = if dice.below(2) == 0 {
                "approve"
            } else {
                "reject"
            };
            let other = if decision == "approve" {
                "reject"
            } else {
                "approve"
            };
            let twice = dice.below(3) == 0;
            let conflicting = twice && dice.below(2) == 0;
            let body = |decision: &str| {
                json!({"step_id": "review", "attempt": 1,
                "artifact_version": version, "decision": decision})
            };
            let path = format!("/api/v1/workflows/{id}/decide");
            let (mut a, mut b) = (cluster.api(first), cluster.api(second));
            let second_decision = if conflicting { other } else { decision };
            let (one, two) = if twice {
                tokio::join!(call(&mut a, "POST", &path, Some(body(decision))), async {
                    Some(call(&mut b, "POST", &path, Some(body(second_decision))).await)
                },)
            } else {
                (
                    call(&mut a, "POST", &path, Some(body(decision))).await,
                    None,
                )
            };
            let mut record_answer = |decision: &str, answer: Option<Answer>| match answer {
                Some(answer) if answer.status == 200 => {
                    workflow.decisions_accepted.insert(decision.to_owned());
                }
                Some(_) => {}
                None => {
                    workflow.decisions_unknown.insert(decision.to_owned());
                }
            };
            record_answer(decision, one);
            if let Some(two) = two {
                record_answer(second_decision, two);
            }
            if conflicting {
                assert!(
                    workflow.decisions_accepted.len() <= 1,
                    "{id}: two conflicting decisions were both accepted"
                );
            }
        }
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_on_three_nodes_and_a_restarting_postgresql_keeps_every_invariant() {
    chaos(None).await;
}

/// The same chaos with the `scripted` agent declared idempotent: a run lost with its node is
/// closed and run again as the step's next attempt, so nothing waits for an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos_with_an_idempotent_agent_needs_no_operator() {
    let files = tempfile::tempdir().expect("temp dir");
    let config = files.path().join("config.toml");
    std::fs::write(
        &config,
        "[[agents]]\nname = \"scripted\"\nkind = \"scripted\"\nidempotent = true\n\
         retry = { max_attempts = 6, initial_interval_ms = 100, max_interval_ms = 400 }\n",
    )
    .expect("write the configuration");
    let by_status = chaos(Some(config.display().to_string())).await;
    assert_eq!(
        by_status.get("needs_reconciliation"),
        None,
        "an idempotent agent's workflow waits for an operator: {by_status:?}"
    );
}

/// Runs the chaos (every node reading `config`, when given) and answers how many workflows
/// ended in each status.
async fn chaos(config: Option<String>) -> BTreeMap<String, usize> {
    let seed = seed();
    eprintln!("chaos seed {seed} (REINS_CHAOS_SEED={seed} reproduces this schedule)");
    let mut dice = Dice(seed.max(1));
    let pg = tokio::task::spawn_blocking(PrivatePg::start)
        .await
        .expect("postgres");
    let mut cluster = Cluster {
        config,
        pg: std::sync::Arc::new(pg),
        nodes: (0..3)
            .map(|_| ChaosNode {
                process: None,
                addr: format!("127.0.0.1:{}", free_port()).parse().expect("addr"),
                dir: tempfile::tempdir().expect("temp dir"),
                stopped: false,
                logs: String::new(),
            })
            .collect(),
        workspaces: tempfile::tempdir().expect("workspaces"),
        token: String::new(),
    };
    for node in 0..3 {
        cluster.start(node).await;
    }
    cluster.token = crate::http_api::admin_token(cluster.nodes[0].addr, "chaos").await;

    let mut tracked: BTreeMap<String, Tracked> = BTreeMap::new();
    let mut faults: Vec<String> = Vec::new();
    let end = Instant::now() + Duration::from_secs(seconds());
    let mut next_fault = Instant::now() + dice.millis(1_000, 3_000);
    let mut stopped_until: BTreeMap<usize, Instant> = BTreeMap::new();
    while Instant::now() < end {
        // Nodes whose stop is over go on.
        for (node, until) in stopped_until.clone() {
            if Instant::now() >= until {
                if let Some(process) = &cluster.nodes[node].process {
                    process.signal(libc::SIGCONT);
                }
                cluster.nodes[node].stopped = false;
                stopped_until.remove(&node);
            }
        }
        // Keep the mix alive.
        let mut alive = 0;
        let ids: Vec<String> = tracked.keys().cloned().collect();
        for id in ids {
            let Some(record) = get(&cluster, &mut dice, &id).await else {
                continue;
            };
            let status = record["stored_status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if ["running", "paused", "waiting_approval", "cancelling"].contains(&status.as_str()) {
                alive += 1;
            }
            if let Some(workflow) = tracked.get_mut(&id)
                && dice.below(2) == 0
            {
                answer(&cluster, &mut dice, &id, &record, workflow).await;
            }
        }
        for _ in alive..ALIVE {
            launch(&cluster, &mut dice, &mut tracked).await;
        }
        if Instant::now() >= next_fault {
            next_fault = Instant::now() + dice.millis(2_000, 5_000);
            let up = cluster.up();
            match dice.below(5) {
                0 if up.len() > 1 => {
                    let node = up[dice.below(up.len() as u64) as usize];
                    faults.push(format!("SIGKILL node {node}, restart"));
                    cluster.kill(node);
                    tokio::time::sleep(dice.millis(200, 2_000)).await;
                    cluster.start(node).await;
                }
                1 if up.len() > 1 => {
                    let node = up[dice.below(up.len() as u64) as usize];
                    let stop = dice.millis(0, 6_000);
                    faults.push(format!("SIGSTOP node {node} for {stop:?}"));
                    if let Some(process) = &cluster.nodes[node].process {
                        process.signal(libc::SIGSTOP);
                    }
                    cluster.nodes[node].stopped = true;
                    stopped_until.insert(node, Instant::now() + stop);
                }
                2 => {
                    let down = dice.millis(300, 1_500);
                    faults.push(format!("PostgreSQL restart, down {down:?}"));
                    let pg = std::sync::Arc::clone(&cluster.pg);
                    tokio::task::spawn_blocking(move || {
                        pg.stop();
                        std::thread::sleep(down);
                        pg.start_again();
                    })
                    .await
                    .expect("restart postgres");
                }
                3 => {
                    // Cancel a live workflow and kill its owner at once.
                    let ids: Vec<String> = tracked.keys().cloned().collect();
                    if let Some(id) = ids.get(dice.below(ids.len() as u64) as usize).cloned()
                        && let Some(record) = get(&cluster, &mut dice, &id).await
                        && let Some(owner) = record["owner"]
                            .as_str()
                            .and_then(|o| cluster.node_of_worker(o))
                        && up.len() > 1
                    {
                        let via = up[dice.below(up.len() as u64) as usize];
                        faults.push(format!(
                            "cancel {id} through node {via}, SIGKILL its owner {owner}"
                        ));
                        if let Some(workflow) = tracked.get_mut(&id) {
                            workflow.cancelled = true;
                        }
                        let mut api = cluster.api(via);
                        let path = format!("/api/v1/workflows/{id}/cancel");
                        let (_, ()) = tokio::join!(call(&mut api, "POST", &path, None), async {
                            cluster.kill(owner)
                        },);
                        tokio::time::sleep(dice.millis(200, 1_500)).await;
                        cluster.start(owner).await;
                    }
                }
                _ => faults.push("quiet".to_owned()),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Heal: every node up, then answer what waits for a person until nothing is live.
    stopped_until.clear();
    for node in 0..3 {
        if cluster.nodes[node].stopped
            && let Some(process) = &cluster.nodes[node].process
        {
            process.signal(libc::SIGCONT);
        }
        cluster.nodes[node].stopped = false;
        if cluster.nodes[node].process.is_none() {
            cluster.start(node).await;
        }
    }
    let quiet_by = Instant::now() + Duration::from_secs(120);
    let mut records: BTreeMap<String, Value> = BTreeMap::new();
    loop {
        let mut live = Vec::new();
        let ids: Vec<String> = tracked.keys().cloned().collect();
        for id in ids {
            let Some(record) = get(&cluster, &mut dice, &id).await else {
                live.push(id);
                continue;
            };
            let status = record["stored_status"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if ["running", "paused", "waiting_approval", "cancelling"].contains(&status.as_str()) {
                if let Some(workflow) = tracked.get_mut(&id) {
                    answer(&cluster, &mut dice, &id, &record, workflow).await;
                }
                live.push(id.clone());
            }
            records.insert(id, record);
        }
        if live.is_empty() {
            break;
        }
        assert!(
            Instant::now() < quiet_by,
            "seed {seed}: never quiet; still live: {:?}\nfaults: {faults:?}",
            live.iter()
                .map(|id| (id, records.get(id).map(|r| r["status"].clone())))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let mut violations = Vec::new();
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for (id, workflow) in tracked.iter_mut() {
        let record = &records[id];
        let status = record["status"].as_str().unwrap_or_default().to_owned();
        *by_status.entry(status.clone()).or_default() += 1;
        match status.as_str() {
            "completed" => {
                if workflow.kind == Kind::Review {
                    workflow.decision_seen = record["result"]["decision"].clone();
                    let seen = workflow
                        .decision_seen
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    let possible = if workflow.decisions_accepted.is_empty() {
                        workflow.decisions_unknown.contains(&seen)
                    } else {
                        workflow.decisions_accepted.contains(&seen)
                    };
                    if !possible {
                        violations.push(format!(
                            "{id}: decision {seen:?} was never accepted \
                            ({:?}, unknown {:?})",
                            workflow.decisions_accepted, workflow.decisions_unknown
                        ));
                    }
                }
                let expected = workflow.kind.expected(workflow.n, workflow);
                if expected.as_ref() != Some(&record["result"]) {
                    violations.push(format!(
                        "{id} ({:?}): result {} where {expected:?} was due",
                        workflow.kind, record["result"]
                    ));
                }
            }
            "failed" if workflow.kind == Kind::FailFast => {}
            "cancelled" if workflow.cancelled => {}
            "needs_reconciliation" => {
                if record["reconciliation"]["reason"].as_str().is_none() {
                    violations.push(format!("{id}: needs_reconciliation without a reason"));
                }
            }
            other => violations.push(format!(
                "{id} ({:?}, cancelled: {}): ended {other}: {}",
                workflow.kind, workflow.cancelled, record["error"]
            )),
        }
    }

    let (client, connection) = tokio_postgres::connect(&cluster.pg.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    let count = |sql: &'static str| {
        let client = &client;
        async move {
            client
                .query_one(sql, &[])
                .await
                .expect(sql)
                .get::<_, i64>(0)
        }
    };
    for (what, sql) in [
        ("step attempts with more than one child run",
         "SELECT count(*) FROM (SELECT workflow, step_id, attempt FROM runs
            WHERE workflow IS NOT NULL GROUP BY 1, 2, 3 HAVING count(*) > 1) d"),
        ("slots held by terminal workflows",
         "SELECT count(*) FROM workflow_slots s JOIN workflows w ON w.id = s.workflow
           WHERE w.status IN ('completed', 'failed', 'cancelled')"),
        ("leases held by terminal workflows",
         "SELECT count(*) FROM extension_execution_leases l JOIN workflows w ON w.id = l.resource_id
           WHERE w.status IN ('completed', 'failed', 'cancelled') AND l.expires_at > reins_now()"),
        ("decisions recorded twice for one checkpoint",
         "SELECT count(*) FROM (SELECT workflow, step_id, attempt FROM workflow_controls
            WHERE kind = 'decide' GROUP BY 1, 2, 3 HAVING count(*) > 1) d"),
        ("steps with two runs live at once (an attempt begun before the one before ended)",
         "SELECT count(*) FROM runs a JOIN runs b
             ON a.workflow = b.workflow AND a.step_id = b.step_id AND a.attempt < b.attempt
          WHERE b.created_at < a.updated_at"),
    ] {
        let found = count(sql).await;
        if found != 0 {
            violations.push(format!("{found} {what}"));
        }
    }
    // Children of ended workflows were asked to stop in the end's own write; they stop within
    // a lease or two (a stopped node's children when it goes on).
    let live_children = "SELECT count(*) FROM runs r JOIN workflows w ON w.id = r.workflow
        WHERE w.status IN ('completed', 'failed', 'cancelled')
          AND r.status IN ('pending', 'running', 'waiting_for_input')";
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(live_children).await != 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let found = count(live_children).await;
    if found != 0 {
        violations.push(format!(
            "{found} child runs still live under terminal workflows"
        ));
    }
    for node in 0..3 {
        let mut log = std::mem::take(&mut cluster.nodes[node].logs);
        if let Some(process) = cluster.nodes[node].process.as_mut() {
            log.push_str(&process.stderr());
        }
        if let Some(line) = log.lines().find(|line| line.contains("panicked")) {
            violations.push(format!("node {node} panicked: {line}"));
        }
    }
    let retried = count("SELECT count(*) FROM runs WHERE attempt > 1").await;
    let lost = count(
        "SELECT count(*) FROM workflow_steps WHERE data->'retry'->>'reason' LIKE '%idempotent%'",
    )
    .await;
    eprintln!(
        "chaos seed {seed}: {} workflows {by_status:?}; {retried} runs of later attempts, \
         {lost} of them for a run lost with its node; faults: {faults:?}",
        tracked.len()
    );
    assert!(
        violations.is_empty(),
        "seed {seed}: {} violations:\n{}\nfaults: {faults:?}",
        violations.len(),
        violations.join("\n")
    );
    by_status
}
