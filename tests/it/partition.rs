//! A node partitioned from PostgreSQL, by a real partition (issue 29, items 14 and 15). Node A
//! runs in a network namespace of its own and reaches the test's own PostgreSQL through a second
//! namespace that routes between them; there nftables drops every packet between A and the
//! server, both ways, silently (no reset, no error), while node B, on loopback, keeps its link.
//! Packets are dropped in transit, never at A's own output (TCP takes a local drop for local
//! congestion and tries again every half second, which no real partition does), and no link
//! goes down.
//!
//! Checked: B takes A's workflows over and no step runs twice; once the network heals, A answers
//! database-backed requests within seconds (without `TCP_USER_TIMEOUT` its connections sit
//! behind TCP's doubling retransmission timer: some 25 s after this cut), and takes new work;
//! and the two nodes together counted as many `needs_reconciliation` as the database holds (A,
//! whose writes were refused, none).
//!
//! It needs root (network namespaces) and `ip` and `nft` (iproute2 and nftables, which
//! `tests/run-all.sh` installs); without them it fails, saying what is missing. Everything it
//! makes is named after one random nonce: two namespaces, two veth pairs, and a /29 of
//! 10.213.0.0/16 whose `unreachable` route is added first, so that no packet of the test can
//! leave the machine. All of it is removed when the test ends, however it ends.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{ReinsProcess, free_port, reins_bin};
use crate::http_client::{Answer, Api};
use crate::private_pg::PrivatePg;

const SECRET: &str = "partition-secret-shared-by-both-nodes-0123";
/// Longer than a lease (2 s) many times over, and past TCP's seventh retransmission (25.4 s
/// after a packet's first sending at the 200 ms minimum timeout): without `TCP_USER_TIMEOUT` a
/// connection whose request was cut off then waits for the eighth, some 51 s after its first
/// sending, so about 24 s after the heal.
const CUT: Duration = Duration::from_secs(27);
/// How soon after the heal node A must answer again: far below what it took without the fix,
/// far above what it takes with it (well under a second here), so not a measure of speed.
const BACK_WITHIN: Duration = Duration::from_secs(15);
/// A's pool, small so that the test's own requests take every connection before the cut: a
/// pool with room left would open a fresh connection after the heal and hide stuck ones.
const A_POOL_SIZE: usize = 4;
const AGENT_WORKFLOWS: usize = 3;
const PAUSED_WORKFLOWS: usize = 3;

/// Runs `program` with `args`; panics naming the command and its output if it fails.
fn run(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program} {args:?}: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Whether `program` runs at all.
fn exists(program: &str, version: &str) -> bool {
    Command::new(program)
        .arg(version)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The test's network: node A's namespace, a router namespace between it and this one, and a
/// /29 of private addresses (.1 here and .2 on the router, .5 on the router and .6 in A's).
struct Net {
    /// The /29, as `10.213.x.y`.
    base: [u8; 4],
    node_ns: String,
    router_ns: String,
}

impl Net {
    fn make() -> Net {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the partition test makes network namespaces and needs root (CI runs as root)"
        );
        assert!(
            exists("ip", "-V"),
            "`ip` is missing: install iproute2 (tests/run-all.sh does)"
        );
        assert!(
            exists("nft", "--version"),
            "`nft` is missing: install nftables (tests/run-all.sh does)"
        );
        for _ in 0..50 {
            let nonce = uuid::Uuid::new_v4();
            let bytes = nonce.as_bytes();
            let base = [10, 213, bytes[0], bytes[1] & 0xf8];
            let prefix = format!("{}.{}.{}.{}/29", base[0], base[1], base[2], base[3]);
            let taken = !run("ip", &["-4", "-o", "addr", "show", "to", &prefix]).is_empty()
                || !run(
                    "ip",
                    &["-4", "route", "show", "table", "all", "root", &prefix],
                )
                .is_empty();
            // The unreachable route is first, and claims the /29: a concurrent run that picked
            // the same one fails to add it and picks another.
            if taken
                || !Command::new("ip")
                    .args(["route", "add", "unreachable", &prefix])
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|status| status.success())
            {
                continue;
            }
            let tag = format!("{:02x}{:02x}{:02x}", bytes[2], bytes[3], bytes[4]);
            let net = Net {
                base,
                node_ns: format!("reins-part-node-{tag}"),
                router_ns: format!("reins-part-router-{tag}"),
            };
            net.wire(&tag);
            return net;
        }
        panic!("no free /29 in 10.213.0.0/16 for the partition test");
    }

    fn addr(&self, host: u8) -> String {
        let [a, b, c, d] = self.base;
        format!("{a}.{b}.{c}.{}", d + host)
    }

    /// Where PostgreSQL listens for node A (this namespace's end of the first link).
    fn server(&self) -> String {
        self.addr(1)
    }

    /// Node A's address.
    fn node(&self) -> String {
        self.addr(6)
    }

    fn wire(&self, tag: &str) {
        let (node, router) = (self.node_ns.as_str(), self.router_ns.as_str());
        let (here, router_here) = (format!("rp{tag}h"), format!("rp{tag}r"));
        let (router_node, node_link) = (format!("rp{tag}s"), format!("rp{tag}a"));
        run("ip", &["netns", "add", node]);
        run("ip", &["netns", "add", router]);
        run(
            "ip",
            &[
                "link",
                "add",
                &here,
                "type",
                "veth",
                "peer",
                "name",
                &router_here,
            ],
        );
        run("ip", &["link", "set", &router_here, "netns", router]);
        run(
            "ip",
            &[
                "link",
                "add",
                &router_node,
                "type",
                "veth",
                "peer",
                "name",
                &node_link,
            ],
        );
        run("ip", &["link", "set", &router_node, "netns", router]);
        run("ip", &["link", "set", &node_link, "netns", node]);
        let cidr = |host: u8| format!("{}/30", self.addr(host));
        run("ip", &["addr", "add", &cidr(1), "dev", &here]);
        run("ip", &["link", "set", &here, "up"]);
        run("ip", &["route", "add", &cidr(4), "via", &self.addr(2)]);
        for (address, link) in [(cidr(2), &router_here), (cidr(5), &router_node)] {
            run("ip", &["-n", router, "addr", "add", &address, "dev", link]);
            run("ip", &["-n", router, "link", "set", link, "up"]);
        }
        run("ip", &["-n", router, "link", "set", "lo", "up"]);
        run(
            "ip",
            &[
                "netns",
                "exec",
                router,
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward",
            ],
        );
        run(
            "ip",
            &["-n", node, "addr", "add", &cidr(6), "dev", &node_link],
        );
        run("ip", &["-n", node, "link", "set", &node_link, "up"]);
        run("ip", &["-n", node, "link", "set", "lo", "up"]);
        run(
            "ip",
            &["-n", node, "route", "add", &cidr(0), "via", &self.addr(5)],
        );
        self.nft(&["add", "table", "inet", "partition"]);
        self.nft(&[
            "add",
            "chain",
            "inet",
            "partition",
            "forward",
            "{ type filter hook forward priority 0; policy accept; }",
        ]);
    }

    fn nft(&self, args: &[&str]) {
        let mut all = vec!["netns", "exec", self.router_ns.as_str(), "nft"];
        all.extend_from_slice(args);
        run("ip", &all);
    }

    /// From now on the router drops every packet between node A and the server's `port`.
    fn cut(&self, port: u16) {
        let port = port.to_string();
        let (node, server) = (self.node(), self.server());
        for (from, to, side) in [(&node, &server, "dport"), (&server, &node, "sport")] {
            self.nft(&[
                "add",
                "rule",
                "inet",
                "partition",
                "forward",
                "ip",
                "saddr",
                from,
                "ip",
                "daddr",
                to,
                "tcp",
                side,
                &port,
                "drop",
            ]);
        }
    }

    fn heal(&self) {
        self.nft(&["flush", "chain", "inet", "partition", "forward"]);
    }

    /// `reins serve` in node A's namespace.
    fn serve(
        &self,
        dir: &std::path::Path,
        addr: SocketAddr,
        env: &[(&str, String)],
    ) -> ReinsProcess {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.node_ns])
            .arg(reins_bin())
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null());
        for (key, value) in env {
            command.env(key, value);
        }
        ReinsProcess::serve_command(command, addr)
    }
}

/// Removes everything [`Net::make`] made (deleting a namespace deletes its links and their
/// peers here), the unreachable route last.
impl Drop for Net {
    fn drop(&mut self) {
        for namespace in [&self.node_ns, &self.router_ns] {
            let _ = Command::new("ip")
                .args(["netns", "del", namespace])
                .status();
        }
        let [a, b, c, d] = self.base;
        let _ = Command::new("ip")
            .args([
                "route",
                "del",
                "unreachable",
                &format!("{a}.{b}.{c}.{d}/29"),
            ])
            .status();
    }
}

/// One call that answers within `within` or not at all (`None`).
async fn call(
    api: &Api,
    method: &str,
    path: &str,
    body: Option<Value>,
    within: Duration,
) -> Option<Answer> {
    let mut api = api.clone();
    let bytes = body
        .map(|b| serde_json::to_vec(&b).expect("json"))
        .unwrap_or_default();
    let content_type = (!bytes.is_empty()).then_some("application/json");
    tokio::time::timeout(within, api.try_send(method, path, content_type, bytes, &[]))
        .await
        .ok()
        .and_then(Result::ok)
}

async fn get(api: &Api, id: &str) -> Option<Value> {
    call(
        api,
        "GET",
        &format!("/api/v1/workflows/{id}"),
        None,
        Duration::from_secs(5),
    )
    .await
    .filter(|answer| answer.status == 200)
    .map(|answer| answer.json())
}

/// Polls `condition` every 100 ms until it holds; panics saying `what` after `within`.
async fn until(within: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) -> Duration {
    let started = Instant::now();
    while started.elapsed() < within {
        if condition().await {
            return started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within {within:?}");
}

/// The sum of a counter's samples in a node's `/metrics`.
async fn counter(api: &Api, name: &str) -> f64 {
    let answer = call(api, "GET", "/metrics", None, Duration::from_secs(30))
        .await
        .expect("/metrics answers");
    assert_eq!(answer.status, 200);
    String::from_utf8_lossy(&answer.body)
        .lines()
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cut_off_from_postgresql_answers_again_within_seconds_of_the_heal() {
    let net = Net::make();
    let (server, node) = (net.server(), net.node());
    let pg = {
        let (server, client) = (server.clone(), format!("{node}/32"));
        tokio::task::spawn_blocking(move || PrivatePg::start_on(&[&server], &[&client]))
            .await
            .expect("postgres")
    };
    let workspaces = tempfile::tempdir().expect("workspaces");
    let env = |database: String, addr: SocketAddr, dir: &tempfile::TempDir| {
        vec![
            ("REINS_DATABASE", database),
            ("REINS_LISTEN", addr.to_string()),
            (
                "REINS_DATA_DIR",
                dir.path().join("data").display().to_string(),
            ),
            (
                "REINS_WORKSPACES_DIR",
                workspaces.path().display().to_string(),
            ),
            ("REINS_SECRET", SECRET.to_owned()),
            ("REINS_LEASE_SECONDS", "2".to_owned()),
            ("REINS_RECOVERY", "automatic".to_owned()),
        ]
    };
    let url_on = |host: &str| format!("postgres://postgres@{host}:{}/postgres", pg.port);
    let (b_dir, a_dir) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let b_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let a_addr: SocketAddr = format!("{node}:{}", free_port()).parse().expect("addr");
    let mut b = ReinsProcess::serve(
        b_dir.path(),
        b_addr,
        &env(url_on("127.0.0.1"), b_addr, &b_dir),
    );
    b.wait_ready(Duration::from_secs(60));
    let mut a_env = env(url_on(&server), a_addr, &a_dir);
    a_env.push(("REINS_STORE__POOL_SIZE", A_POOL_SIZE.to_string()));
    let mut a = net.serve(a_dir.path(), a_addr, &a_env);
    a.wait_ready(Duration::from_secs(60));

    let token = crate::http_api::admin_token(b_addr, "partition").await;
    let api = |addr| {
        let mut api = Api::new(addr);
        api.bearer = Some(token.clone());
        api
    };
    let (api_a, api_b) = (api(a_addr), api(b_addr));
    let worker = |api: Api| async move {
        let answer = call(&api, "GET", "/health/ready", None, Duration::from_secs(30))
            .await
            .expect("ready");
        answer.json()["worker_id"]
            .as_str()
            .expect("worker_id")
            .to_owned()
    };
    let (worker_a, worker_b) = (worker(api_a.clone()).await, worker(api_b.clone()).await);

    // On A: workflows whose agent steps run one after another (one is running at the cut),
    // and workflows that wait paused.
    let stepping = r#"for (let i = 0; i < 200; i++) {
                        await agent({stepId: "s" + i, agentRef: "scripted",
                                     task: {sleep_ms: 300, output: i}});
                      }
                      return "done";"#;
    let pausing = r#"const input = await pause({stepId: "p"}); return {input};"#;
    let mut launched = Vec::new();
    for (script, count) in [(stepping, AGENT_WORKFLOWS), (pausing, PAUSED_WORKFLOWS)] {
        for _ in 0..count {
            let answer = call(
                &api_a,
                "POST",
                "/api/v1/workflows",
                Some(json!({"script": script})),
                Duration::from_secs(30),
            )
            .await
            .expect("a launch answers");
            assert_eq!(answer.status, 201, "{answer:?}");
            launched.push((
                answer.json()["run_id"].as_str().expect("run_id").to_owned(),
                script == pausing,
            ));
        }
    }
    for (id, paused) in &launched {
        until(
            Duration::from_secs(60),
            "every workflow under way on A",
            async || {
                get(&api_a, id).await.is_some_and(|record| {
                    record["owner"] == json!(worker_a)
                        && if *paused {
                            record["status"] == "paused"
                        } else {
                            record["steps"]
                                .as_array()
                                .is_some_and(|steps| steps.len() > 1)
                        }
                })
            },
        )
        .await;
    }
    // Take every connection of A's pool (a busy node's pool is in use), and check it is so.
    let burst = |count: usize| {
        let api = api_a.clone();
        (0..count)
            .map(|_| {
                let api = api.clone();
                tokio::spawn(async move {
                    call(
                        &api,
                        "GET",
                        "/api/v1/workflows?limit=50",
                        None,
                        Duration::from_secs(3),
                    )
                    .await
                })
            })
            .collect::<Vec<_>>()
    };
    until(Duration::from_secs(60), "A's pool full", async || {
        for task in burst(32) {
            let _ = task.await;
        }
        let metrics = call(&api_a, "GET", "/metrics", None, Duration::from_secs(5)).await;
        metrics.is_some_and(|answer| {
            String::from_utf8_lossy(&answer.body).lines().any(|line| {
                line == format!("reins_store_pool_connections{{state=\"open\"}} {A_POOL_SIZE}")
            })
        })
    })
    .await;

    net.cut(pg.port);
    let cut_at = Instant::now();
    eprintln!("cut A from PostgreSQL for {CUT:?}");
    // Requests in flight at the cut, as on a busy node: each takes a connection and sends.
    let in_flight = burst(2 * A_POOL_SIZE);

    // B takes every workflow over once A's leases run out.
    let direct = {
        let (client, connection) =
            tokio_postgres::connect(&url_on("127.0.0.1"), tokio_postgres::NoTls)
                .await
                .expect("connect to the test's PostgreSQL");
        tokio::spawn(connection);
        client
    };
    let ids: Vec<String> = launched.iter().map(|(id, _)| id.clone()).collect();
    let taken = until(CUT, "B's takeover of A's workflows", async || {
        let owners: Vec<String> = direct
            .query("SELECT owner FROM workflows WHERE id = ANY($1)", &[&ids])
            .await
            .expect("owners")
            .iter()
            .map(|row| row.get(0))
            .collect();
        owners.len() == ids.len() && owners.iter().all(|owner| *owner == worker_b)
    })
    .await;
    eprintln!("B took every workflow over {taken:?} after the cut");
    tokio::time::sleep(CUT.saturating_sub(cut_at.elapsed())).await;
    net.heal();

    for task in in_flight {
        task.abort();
    }

    // A answers database-backed requests again: readiness (the store's probes) and a read.
    let probe = ids[0].clone();
    let back = until(
        Duration::from_secs(60),
        "A answering after the heal",
        async || {
            let ready = call(&api_a, "GET", "/health/ready", None, Duration::from_secs(3)).await;
            ready.is_some_and(|answer| answer.status == 200) && get(&api_a, &probe).await.is_some()
        },
    )
    .await;
    eprintln!("A answered {back:?} after the heal");
    assert!(
        back <= BACK_WITHIN,
        "A answered database-backed requests only {back:?} after the heal (bound {BACK_WITHIN:?})"
    );

    // A takes new work: a write through it (a resume, which B's supervisor applies) and a
    // workflow of its own, run to its end.
    let (paused_id, _) = launched
        .iter()
        .find(|(_, paused)| *paused)
        .expect("a paused one");
    let record = get(&api_a, paused_id).await.expect("the paused workflow");
    let resumed = call(
        &api_a,
        "POST",
        &format!("/api/v1/workflows/{paused_id}/resume"),
        Some(
            json!({"fingerprint": record["fingerprint"], "step_id": "p", "attempt": 1, "input": 7}),
        ),
        Duration::from_secs(30),
    )
    .await
    .expect("the resume answers");
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let fresh = call(
        &api_a,
        "POST",
        "/api/v1/workflows",
        Some(json!({"script": r#"return (await agent({stepId: "x", agentRef: "scripted", task: {output: 1}})).output;"#})),
        Duration::from_secs(30),
    )
    .await
    .expect("a launch on A answers");
    assert_eq!(fresh.status, 201, "{fresh:?}");
    let fresh = fresh.json()["run_id"].as_str().expect("run_id").to_owned();
    for (id, owner) in [(paused_id, &worker_b), (&fresh, &worker_a)] {
        until(
            Duration::from_secs(60),
            "the resumed and the new workflow completed",
            async || {
                get(&api_b, id).await.is_some_and(|record| {
                    record["status"] == "completed" && record["owner"] == json!(owner)
                })
            },
        )
        .await;
    }

    // No step ran twice: one child run per step attempt.
    let repeated: i64 = direct
        .query_one(
            "SELECT count(*) FROM (SELECT 1 FROM runs GROUP BY workflow, step_id, attempt
                                    HAVING count(*) > 1) AS twice",
            &[],
        )
        .await
        .expect("runs")
        .get(0);
    assert_eq!(repeated, 0, "a step attempt ran more than once");
    let statuses: BTreeSet<String> = direct
        .query("SELECT status FROM workflows WHERE id = ANY($1)", &[&ids])
        .await
        .expect("statuses")
        .iter()
        .map(|row| row.get(0))
        .collect();
    eprintln!("the cut workflows ended as {statuses:?}");

    // Item 15: what the nodes counted is what the database holds; A's writes were refused.
    let waiting: i64 = direct
        .query_one(
            "SELECT count(*) FROM workflows WHERE status = 'needs_reconciliation'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    let (counted_a, counted_b) = (
        counter(&api_a, "reins_reconciliations_needed_total").await,
        counter(&api_b, "reins_reconciliations_needed_total").await,
    );
    eprintln!(
        "needs_reconciliation: {waiting} stored, counted {counted_a} on A and {counted_b} on B"
    );
    assert_eq!(
        counted_a, 0.0,
        "A counted reconciliations the database refused"
    );
    assert_eq!(counted_a + counted_b, waiting as f64);
    drop((a, b));
}
