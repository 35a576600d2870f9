//! The real binary on the embedded default: it starts with no configuration but its port, is
//! ready, stops cleanly on SIGTERM, keeps its data across a restart, and keeps a second node out.
//! (The default port, 7420, is the configuration's unit test: another node on this machine may
//! hold it.) Bounds on a stop are hang detectors, generous for a loaded machine: how fast a node
//! stops is not what these tests say.

use std::net::SocketAddr;
use std::time::Duration;

use crate::harness::{ReinsProcess, free_port, http_get};

/// Long enough for a drain (3 s), recording the stop and the supervision tree's end on a
/// machine whose cores are busy; a node that hangs still fails.
const STOPS_WITHIN: Duration = Duration::from_secs(60);

#[test]
fn with_no_configuration_but_its_port_a_node_serves_the_embedded_default_and_restarts_with_its_data()
 {
    let dir = tempfile::tempdir().expect("temp dir");
    let default: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let listen = [("REINS_LISTEN", default.to_string())];

    let mut first = ReinsProcess::serve(dir.path(), default, &listen);
    first.wait_ready(Duration::from_secs(60));
    let (status, body) = http_get(default, "/health/ready").expect("ready");
    assert_eq!(status, 200, "{body}");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(ready["backend"], "sqlite");
    let first_worker = ready["worker_id"].as_str().expect("worker_id").to_owned();
    assert_eq!(http_get(default, "/health").expect("health").0, 200);
    assert_eq!(http_get(default, "/nope").expect("404").0, 404);
    assert!(dir.path().join("reins-data/reins.db").exists());

    // A second node on the same SQLite database is refused, naming PostgreSQL.
    let other: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut second = ReinsProcess::serve(dir.path(), other, &[("REINS_LISTEN", other.to_string())]);
    let status = second
        .wait_exit(STOPS_WITHIN)
        .expect("the second node exits");
    assert!(!status.success());
    let stderr = second.stderr();
    assert!(stderr.contains("a cluster needs PostgreSQL"), "{stderr}");

    first.signal(libc::SIGTERM);
    let status = first.wait_exit(STOPS_WITHIN).expect("exits after SIGTERM");
    assert!(status.success(), "exit status {status}: {}", first.stderr());

    // Stopped the moment it is ready: the signal is watched before anything is answered.
    let mut again = ReinsProcess::serve(dir.path(), default, &listen);
    again.wait_ready(Duration::from_secs(60));
    again.signal(libc::SIGTERM);
    let status = again.wait_exit(STOPS_WITHIN).expect("exits");
    assert!(status.success(), "exit status {status}: {}", again.stderr());

    let db = rusqlite::Connection::open(dir.path().join("reins-data/reins.db")).expect("open");
    let nodes: Vec<(String, Option<f64>)> = db
        .prepare("SELECT worker_id, stopped_at FROM nodes ORDER BY started_at")
        .expect("prepare")
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    assert_eq!(
        nodes.len(),
        2,
        "the restart kept the first node's row: {nodes:?}"
    );
    assert_eq!(nodes[0].0, first_worker);
    assert!(
        nodes.iter().all(|(_, stopped)| stopped.is_some()),
        "{nodes:?}"
    );
    let versions: i64 = db
        .query_row("SELECT count(*) FROM schema_migrations", [], |row| {
            row.get(0)
        })
        .expect("migrations");
    assert_eq!(
        versions,
        store::SCHEMA_VERSION,
        "the restart re-applied a migration"
    );
}

#[test]
fn sigint_drains_like_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut node = ReinsProcess::serve(dir.path(), addr, &[("REINS_LISTEN", addr.to_string())]);
    node.wait_ready(Duration::from_secs(60));
    node.signal(libc::SIGINT);
    let status = node.wait_exit(STOPS_WITHIN).expect("exits after SIGINT");
    assert!(status.success(), "exit status {status}");
    assert!(
        http_get(addr, "/health").is_err(),
        "still listening after exit"
    );
}

/// A node whose stderr nobody reads (a full pipe, a stuck log shipper) keeps answering: log
/// lines are dropped rather than blocking the threads that renew leases and serve requests.
#[test]
fn a_node_whose_stderr_is_never_read_keeps_serving() {
    let dir = tempfile::tempdir().expect("temp dir");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut child = crate::harness::reins_command(
        dir.path(),
        &[
            ("REINS_LISTEN", addr.to_string()),
            // Every request logs a line: far more than a 64 KiB pipe holds.
            ("REINS_LOG", "debug".into()),
        ],
    )
    .arg("serve")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start reins");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !matches!(http_get(addr, "/health/ready"), Ok((200, _))) {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never got ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for n in 0..3000 {
        let answer = http_get(addr, &format!("/no/such/route/{n}/{}", "x".repeat(200)));
        assert!(matches!(answer, Ok((404, _))), "request {n}: {answer:?}");
    }
    assert_eq!(http_get(addr, "/health").expect("health").0, 200);
    let _ = child.kill();
    let _ = child.wait();
}
