//! Migrations: several nodes starting at once against one fresh PostgreSQL all come up, and the
//! schema is applied exactly once.

use std::net::SocketAddr;
use std::time::Duration;

use crate::harness::{ReinsProcess, TestDb, free_port, http_get};

const TABLES: &[&str] = &[
    "api_tokens",
    "event_feed",
    "extension_execution_leases",
    "nodes",
    "notify_deliveries",
    "notify_outbox",
    "notify_targets",
    "runs",
    "schema_migrations",
    "sent_events",
    "user_sessions",
    "user_storage",
    "users",
    "workflow_artifacts",
    "workflow_controls",
    "workflow_event_seqs",
    "workflow_events",
    "workflow_retries",
    "workflow_slots",
    "workflow_steps",
    "workflow_storage",
    "workflows",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_migrate_one_fresh_postgres_at_once() {
    let db = TestDb::postgres_empty().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut nodes: Vec<ReinsProcess> = (0..3)
        .map(|n| {
            let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
            // Nodes on one host each keep their own folder (and admin socket).
            let data_dir = dir.path().join(format!("node-{n}"));
            ReinsProcess::serve(
                dir.path(),
                addr,
                &[
                    ("REINS_DATABASE", db.url()),
                    ("REINS_LISTEN", addr.to_string()),
                    ("REINS_DATA_DIR", data_dir.display().to_string()),
                ],
            )
        })
        .collect();
    for node in &mut nodes {
        node.wait_ready(Duration::from_secs(30));
    }

    let client = db.pg_client().await;
    let versions: Vec<i64> = client
        .query(
            "SELECT version FROM schema_migrations ORDER BY version",
            &[],
        )
        .await
        .expect("schema_migrations")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(versions, (1..=store::SCHEMA_VERSION).collect::<Vec<_>>());
    let tables: Vec<String> = client
        .query(
            "SELECT table_name::text FROM information_schema.tables
              WHERE table_schema = 'public' ORDER BY table_name",
            &[],
        )
        .await
        .expect("tables")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(tables, TABLES);
    let registered: i64 = client
        .query_one("SELECT count(*) FROM nodes WHERE stopped_at IS NULL", &[])
        .await
        .expect("nodes")
        .get(0);
    assert_eq!(registered, 3);

    for node in &nodes {
        node.signal(libc::SIGTERM);
    }
    for node in &mut nodes {
        let status = node
            .wait_exit(Duration::from_secs(60))
            .expect("exits after SIGTERM");
        assert!(status.success(), "exit status {status}");
    }
    let stopped: i64 = client
        .query_one(
            "SELECT count(*) FROM nodes WHERE stopped_at IS NOT NULL",
            &[],
        )
        .await
        .expect("nodes")
        .get(0);
    assert_eq!(stopped, 3, "every node records its clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_503_once_the_schema_is_not_the_one_this_build_needs() {
    let db = TestDb::postgres().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut node = ReinsProcess::serve(
        dir.path(),
        addr,
        &[
            ("REINS_DATABASE", db.url()),
            ("REINS_LISTEN", addr.to_string()),
        ],
    );
    node.wait_ready(Duration::from_secs(30));

    // A newer node migrated the shared database past this build's schema.
    let client = db.pg_client().await;
    client
        .execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, 'from the future')",
            &[&(store::SCHEMA_VERSION + 1)],
        )
        .await
        .expect("insert");
    let (status, body) = http_get(addr, "/health/ready").expect("ready");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("schema_not_current"), "{body}");
    assert_eq!(
        http_get(addr, "/health").expect("health").0,
        200,
        "alive all the same"
    );
}
