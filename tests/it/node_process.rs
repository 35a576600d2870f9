//! The real binary on the embedded default: it starts with no configuration at all, is ready,
//! stops cleanly on SIGTERM, keeps its data across a restart, and keeps a second node out.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::harness::{ReinsProcess, free_port, http_get};

#[test]
fn with_no_configuration_a_node_serves_the_embedded_default_and_restarts_with_its_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let default: SocketAddr = "127.0.0.1:7420".parse().expect("addr");

    let mut first = ReinsProcess::serve(dir.path(), default, &[]);
    first.wait_ready(Duration::from_secs(20));
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
        .wait_exit(Duration::from_secs(10))
        .expect("the second node exits");
    assert!(!status.success());
    let stderr = second.stderr();
    assert!(stderr.contains("a cluster needs PostgreSQL"), "{stderr}");

    let stopping = Instant::now();
    first.signal(libc::SIGTERM);
    let status = first
        .wait_exit(Duration::from_secs(5))
        .expect("exits within 5 s of SIGTERM");
    assert!(status.success(), "exit status {status}: {}", first.stderr());
    assert!(stopping.elapsed() < Duration::from_secs(5));

    let mut again = ReinsProcess::serve(dir.path(), default, &[]);
    again.wait_ready(Duration::from_secs(20));
    again.signal(libc::SIGTERM);
    let status = again.wait_exit(Duration::from_secs(5)).expect("exits");
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
    node.wait_ready(Duration::from_secs(20));
    node.signal(libc::SIGINT);
    let status = node
        .wait_exit(Duration::from_secs(5))
        .expect("exits within 5 s");
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
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(addr, "/health/ready"), Ok((200, _))) {
        assert!(Instant::now() < deadline, "the node never got ready");
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
