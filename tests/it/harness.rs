//! What the integration tests share: a fresh database per test on either backend, the real
//! `reins` binary started on loopback, and a minimal HTTP client.
//!
//! PostgreSQL tests need `REINS_TEST_PG` (an admin URL of a running cluster; `tests/run-all.sh`
//! starts one). Each test gets its own database in that cluster, so tests run in parallel and
//! never see each other's rows.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use store::{DatabaseUrl, Store, StoreOptions};
use tempfile::TempDir;

/// A database of its own for one test.
pub enum TestDb {
    Sqlite { dir: TempDir, store: Arc<Store> },
    Postgres { url: String },
}

/// A passing test's PostgreSQL database is dropped (a failed one's stays, to be looked at): the
/// suite makes hundreds, and a developer's cluster would otherwise keep every one.
impl Drop for TestDb {
    fn drop(&mut self) {
        let TestDb::Postgres { url } = self else {
            return;
        };
        if std::thread::panicking() {
            return;
        }
        // Only a database this harness made in the test cluster (not a private server's).
        let (Ok(admin), Some((base, name))) =
            (std::env::var("REINS_TEST_PG"), url.rsplit_once('/'))
        else {
            return;
        };
        if !(admin.starts_with(base) && name.starts_with("reins_test_")) {
            return;
        }
        let name = name.to_owned();
        // Drop cannot await, and may run on a runtime's thread: a thread with its own runtime.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database");
            runtime.block_on(async {
                let (client, connection) =
                    tokio_postgres::connect(&admin, tokio_postgres::NoTls).await?;
                let connection = tokio::spawn(connection);
                let dropped = client
                    .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .await;
                drop(client);
                let _ = connection.await;
                dropped
            })
        })
        .join();
        if let Ok(Err(error)) = dropped {
            eprintln!("the test database was not dropped: {error}");
        }
    }
}

impl TestDb {
    /// A fresh embedded database in a temporary folder, opened and migrated.
    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = DatabaseUrl::Sqlite(dir.path().join("reins.db"));
        let store = open_migrated(&url).await;
        TestDb::Sqlite {
            dir,
            store: Arc::new(store),
        }
    }

    /// A fresh, empty PostgreSQL database in the test cluster (not migrated).
    pub async fn postgres_empty() -> TestDb {
        let admin = std::env::var("REINS_TEST_PG").expect(
            "REINS_TEST_PG is not set: run the suite with tests/run-all.sh, which starts PostgreSQL",
        );
        let name = format!("reins_test_{}", uuid::Uuid::new_v4().simple());
        let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
            .await
            .expect("connect to the test cluster");
        let connection = tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create the test database");
        drop(client);
        let _ = connection.await;
        let (base, _) = admin.rsplit_once('/').expect("admin URL names a database");
        TestDb::Postgres {
            url: format!("{base}/{name}"),
        }
    }

    /// A fresh PostgreSQL database, migrated.
    pub async fn postgres() -> TestDb {
        let db = TestDb::postgres_empty().await;
        drop(db.store().await);
        db
    }

    /// The database URL a node would be configured with.
    pub fn url(&self) -> String {
        match self {
            TestDb::Sqlite { dir, .. } => {
                format!("sqlite:{}", dir.path().join("reins.db").display())
            }
            TestDb::Postgres { url } => url.clone(),
        }
    }

    /// A store on this database as one node would have it. On PostgreSQL every call opens a new
    /// pool (a separate node); SQLite admits one node, so every call shares the same store.
    pub async fn store(&self) -> Arc<Store> {
        match self {
            TestDb::Sqlite { store, .. } => Arc::clone(store),
            TestDb::Postgres { url } => {
                Arc::new(open_migrated(&DatabaseUrl::Postgres(url.clone())).await)
            }
        }
    }

    /// Changes rows behind the engine's back (what a tampered row, or a crash at an awkward
    /// moment, leaves): `postgres` or `sqlite` runs with the text parameters `params` ($1 or
    /// ?1 onwards). Answers how many rows changed.
    pub async fn tamper(&self, postgres: &str, sqlite: &str, params: &[&str]) -> u64 {
        match self {
            TestDb::Postgres { .. } => {
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
                    .iter()
                    .map(|p| p as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                self.pg_client()
                    .await
                    .execute(postgres, &params)
                    .await
                    .expect("tamper")
            }
            TestDb::Sqlite { dir, .. } => {
                let connection =
                    rusqlite::Connection::open(dir.path().join("reins.db")).expect("open");
                connection
                    .busy_timeout(Duration::from_secs(30))
                    .expect("busy timeout");
                let changed = connection
                    .execute(sqlite, rusqlite::params_from_iter(params.iter()))
                    .expect("tamper");
                u64::try_from(changed).expect("a row count")
            }
        }
    }

    /// A raw PostgreSQL client on this database (PostgreSQL only).
    pub async fn pg_client(&self) -> tokio_postgres::Client {
        let TestDb::Postgres { url } = self else {
            panic!("pg_client on a SQLite test database");
        };
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .expect("connect to the test database");
        tokio::spawn(connection);
        client
    }
}

async fn open_migrated(url: &DatabaseUrl) -> Store {
    let store = Store::open(url, &StoreOptions::default())
        .await
        .expect("open the test store");
    store.migrate().await.expect("migrate the test store");
    store
}

/// Declares one test per backend from one async body taking a [`TestDb`].
macro_rules! on_both_backends {
    ($(#[$meta:meta])* async fn $name:ident($db:ident: TestDb) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $(#[$meta])*
            async fn body($db: $crate::harness::TestDb) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                body($crate::harness::TestDb::sqlite().await).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                body($crate::harness::TestDb::postgres().await).await
            }
        }
    };
}
pub(crate) use on_both_backends;

/// Two tests, `sqlite` and `postgres`, from one async function `$name(postgres: bool)` of the
/// calling module (the shape of the tests that start the real binary).
macro_rules! both {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                super::$name(false).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                super::$name(true).await
            }
        }
    };
}
pub(crate) use both;

/// The `reins` binary built from this workspace.
pub fn reins_bin() -> PathBuf {
    if let Ok(path) = std::env::var("REINS_TEST_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/it-<hash> -> target/<profile>/reins
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("reins"))
        .expect("target folder");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build --workspace --bins` first (tests/run-all.sh does)",
        bin.display()
    );
    bin
}

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A `reins` process started by a test; killed if the test drops it while it still runs.
pub struct ReinsProcess {
    child: Child,
    pub addr: SocketAddr,
    /// Everything the process wrote to stderr so far, drained by a thread as it comes: a pipe
    /// nobody reads fills up, and a node whose log writes block stops answering.
    stderr: Arc<std::sync::Mutex<Vec<u8>>>,
    drained: Option<std::thread::JoinHandle<()>>,
}

impl ReinsProcess {
    /// Starts `reins serve` in `dir` with exactly `env` as its environment (plus PATH).
    pub fn serve(dir: &Path, addr: SocketAddr, env: &[(&str, String)]) -> ReinsProcess {
        ReinsProcess::serve_command(reins_command(dir, env), addr)
    }

    /// Starts `reins serve` from `command` (as [`reins_command`] makes it, then adjusted).
    pub fn serve_command(mut command: Command, addr: SocketAddr) -> ReinsProcess {
        let mut child = command
            .arg("serve")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start reins");
        let stderr = Arc::new(std::sync::Mutex::new(Vec::new()));
        let drained = child.stderr.take().map(|mut pipe| {
            let sink = Arc::clone(&stderr);
            std::thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(read) = pipe.read(&mut chunk) {
                    if read == 0 {
                        break;
                    }
                    sink.lock()
                        .expect("stderr buffer")
                        .extend_from_slice(&chunk[..read]);
                }
            })
        });
        ReinsProcess {
            child,
            addr,
            stderr,
            drained,
        }
    }

    /// Waits until `/health/ready` answers 200, or panics with the process's output.
    pub fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("reins exited early with {status}: {}", self.stderr());
            }
            if matches!(http_get(self.addr, "/health/ready"), Ok((200, _))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("reins at {} was not ready within {within:?}", self.addr);
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: i32) {
        let pid = i32::try_from(self.child.id()).expect("pid fits i32");
        // SAFETY: kill(2) with a pid this test started and still holds; no memory is involved.
        let rc = unsafe { libc::kill(pid, signal) };
        assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
    }

    /// Waits for the process to exit, at most `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// What the process wrote to stderr once it holds every one of `needles`, or all of it so
    /// far after `within`: a line reaches the pipe through the node's log writer, some time
    /// after the event that logged it.
    pub fn stderr_with(&mut self, needles: &[&str], within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let log = self.stderr();
            if needles.iter().all(|needle| log.contains(needle)) || Instant::now() >= deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Everything the process wrote to stderr (all of it once the process has exited).
    pub fn stderr(&mut self) -> String {
        if let Ok(Some(_)) = self.child.try_wait()
            && let Some(drained) = self.drained.take()
        {
            let _ = drained.join();
        }
        String::from_utf8_lossy(&self.stderr.lock().expect("stderr buffer")).into_owned()
    }
}

impl Drop for ReinsProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `reins` in `dir` with a clean environment: only PATH and `env`.
pub fn reins_command(dir: &Path, env: &[(&str, String)]) -> Command {
    let mut command = Command::new(reins_bin());
    command
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .stdin(Stdio::null());
    // A cluster on PostgreSQL needs a shared secret; tests that care pass their own.
    if !env.iter().any(|(key, _)| *key == "REINS_SECRET") {
        command.env("REINS_SECRET", "integration-test-secret-0123456789abcdef");
    }
    for (key, value) in env {
        command.env(key, value);
    }
    command
}

/// One HTTP/1.1 GET on a fresh connection: `(status, body)`. Its timeouts only detect a
/// server that never answers: a loaded machine can take seconds to answer a loopback request.
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {response:?}")))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((status, body))
}

/// Polls `condition` every 20 ms until it holds, or panics after `within`.
pub async fn eventually(within: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if condition().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{what} did not happen within {within:?}");
}

/// A node started in this test process on a test database.
pub struct TestNode {
    pub node: actors::Node,
    pub faults: actors::StoreFaults,
}

impl TestNode {
    /// Starts a node named `name` on `db` whose leases last `lease_ms`; workspaces and the fault
    /// folder live in `shared`, as nodes of one cluster share them.
    pub async fn start(db: &TestDb, name: &str, lease_ms: u64, shared: &Path) -> TestNode {
        let scripted = actors::agents::AgentConfig::scripted("scripted");
        TestNode::start_with(db, name, lease_ms, shared, &[scripted]).await
    }

    /// [`TestNode::start`] with these agents.
    pub async fn start_with(
        db: &TestDb,
        name: &str,
        lease_ms: u64,
        shared: &Path,
        agents: &[actors::agents::AgentConfig],
    ) -> TestNode {
        TestNode::start_custom(db, name, lease_ms, shared, agents, |_| {}).await
    }

    /// [`TestNode::start_with`], letting `adjust` change the node's options.
    pub async fn start_custom(
        db: &TestDb,
        name: &str,
        lease_ms: u64,
        shared: &Path,
        agents: &[actors::agents::AgentConfig],
        adjust: impl FnOnce(&mut actors::NodeOptions),
    ) -> TestNode {
        let faults = actors::StoreFaults::default();
        let agents = actors::agents::AgentRegistry::new(agents).expect("agents");
        let runs = actors::RunsOptions {
            lease_ms,
            workspaces_dir: shared.join("workspaces"),
            fault_dir: Some(shared.join("faults")),
            agent_records_dir: None,
            agent_confinement: actors::agents::ConfinementMode::Landlock,
            task_bytes_max: 48 * 1024,
            error_bytes_max: 4 * 1024,
            orphan_sweep: Duration::from_millis(lease_ms),
        };
        std::fs::create_dir_all(shared.join("faults")).expect("fault dir");
        let identity = actors::NodeIdentity {
            worker_id: format!("{name}-{}", uuid::Uuid::new_v4().simple()),
            host: "test".into(),
            pid: std::process::id(),
        };
        let mut options = actors::NodeOptions {
            faults: Some(faults.clone()),
            call_timeout: Duration::from_secs(10),
            ..actors::NodeOptions::new(runs, Arc::new(agents))
        };
        adjust(&mut options);
        let node = actors::Node::start(identity, db.store().await, options)
            .await
            .expect("start node");
        TestNode { node, faults }
    }
}

/// The database clock, through a node's store handle.
pub async fn db_now(store: &actors::StoreHandle) -> f64 {
    store.now().await.expect("database clock")
}
