//! One behavioural test, three stores: every test of the suite is an async body generic over the
//! store's traits, run by [`conformance!`] against PostgreSQL (a database of its own in the test
//! cluster named by `REINS_TEST_PG`, dropped once the test passed), SQLite (a temporary folder)
//! and the simulation store (on a clock the test moves). Where they disagree, the real stores are the truth.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use store::{
    Controls, DatabaseUrl, Events, Launch, LaunchLimits, Lease, Leases, NewWorkflow, Notifications,
    Operators, Runs, Schema, SimClock, SimStore, Store, StoreOptions, Users, Workflows, WriteOp,
};
use tempfile::TempDir;

/// Every trait of the store.
pub trait Subject:
    Schema
    + Leases
    + Workflows
    + Controls
    + Runs
    + Events
    + Users
    + Operators
    + Notifications
    + Send
    + Sync
    + 'static
{
}

impl<S> Subject for S where
    S: Schema
        + Leases
        + Workflows
        + Controls
        + Runs
        + Events
        + Users
        + Operators
        + Notifications
        + Send
        + Sync
        + 'static
{
}

type Opening<S> = Pin<Box<dyn Future<Output = Arc<S>> + Send>>;

/// A store of its own for one test.
pub struct TestDb<S> {
    /// Opens the store as one more node would have it: on PostgreSQL a new pool (another node);
    /// SQLite admits one node and the simulation is one state, so both hand out the same store.
    open: Box<dyn Fn() -> Opening<S> + Send + Sync>,
    /// The simulation's clock; `None` on the real stores, whose clock is the database's.
    clock: Option<SimClock>,
    _dir: Option<TempDir>,
}

/// A PostgreSQL test database, dropped by [`Dropping::drop_database`] once its test passed (a
/// failed test's stays, to be looked at).
pub struct Dropping {
    admin: String,
    name: String,
}

impl Dropping {
    /// The test database's URL, for a test that needs a connection of its own.
    pub fn url(&self) -> String {
        let (base, _) = self
            .admin
            .rsplit_once('/')
            .expect("admin URL names a database");
        format!("{base}/{}", self.name)
    }

    pub async fn drop_database(self) {
        let (client, connection) = tokio_postgres::connect(&self.admin, tokio_postgres::NoTls)
            .await
            .expect("connect to the test cluster");
        let connection = tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .await
            .expect("drop the test database");
        drop(client);
        let _ = connection.await;
    }
}

impl TestDb<Store> {
    /// A fresh embedded database in a temporary folder, opened and migrated.
    pub async fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let store =
            Arc::new(open_migrated(&DatabaseUrl::Sqlite(dir.path().join("reins.db"))).await);
        TestDb {
            open: Box::new(move || {
                let store = Arc::clone(&store);
                Box::pin(async move { store })
            }),
            clock: None,
            _dir: Some(dir),
        }
    }

    /// A fresh PostgreSQL database in the test cluster, migrated, and how to drop it.
    pub async fn postgres() -> (Self, Dropping) {
        let admin = std::env::var("REINS_TEST_PG").expect(
            "REINS_TEST_PG is not set: the conformance suite needs a PostgreSQL cluster \
             (tests/run-all.sh starts one)",
        );
        let name = database_name();
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
        let url = DatabaseUrl::Postgres(format!("{base}/{name}"));
        drop(open_migrated(&url).await);
        let db = TestDb {
            open: Box::new(move || {
                let url = url.clone();
                Box::pin(async move { Arc::new(open_migrated(&url).await) })
            }),
            clock: None,
            _dir: None,
        };
        (db, Dropping { admin, name })
    }
}

impl TestDb<SimStore> {
    /// A fresh simulation store on a clock of its own.
    pub async fn sim() -> Self {
        let clock = SimClock::at(1_700_000_000_000);
        let store = Arc::new(SimStore::new(clock.clone()));
        TestDb {
            open: Box::new(move || {
                let store = Arc::clone(&store);
                Box::pin(async move { store })
            }),
            clock: Some(clock),
            _dir: None,
        }
    }
}

impl<S: Subject> TestDb<S> {
    /// The store as one node has it.
    pub async fn store(&self) -> Arc<S> {
        (self.open)().await
    }

    /// Waits until the database clock is past `deadline` (epoch seconds): on the simulation the
    /// clock is moved there, on a real store the test polls its clock.
    pub async fn pass(&self, store: &S, deadline: f64) {
        if let Some(clock) = &self.clock {
            let now = clock.seconds();
            if now <= deadline {
                // Whole milliseconds past the deadline.
                clock.advance(((deadline - now) * 1000.0).ceil() as u64 + 1);
            }
            return;
        }
        let started = Instant::now();
        while store.now().await.expect("now") <= deadline {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the database clock did not pass {deadline}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A moment of a loop that waits for time to pass: the simulation's clock moves 10 ms, a
    /// real store's moves by itself.
    pub async fn tick(&self) {
        match &self.clock {
            Some(clock) => clock.advance(10),
            None => tokio::task::yield_now().await,
        }
    }
}

async fn open_migrated(url: &DatabaseUrl) -> Store {
    let store = Store::open(url, &StoreOptions::default())
        .await
        .expect("open the test store");
    store.migrate().await.expect("migrate the test store");
    store
}

/// A database name no other test (of this or another process) uses.
fn database_name() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "reins_conformance_{}_{}_{nanos}",
        std::process::id(),
        COUNT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Declares one test per store from one async body taking a `TestDb<S>`.
macro_rules! conformance {
    ($(#[$meta:meta])* async fn $name:ident($db:ident) $body:block) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            $(#[$meta])*
            async fn body<S: $crate::harness::Subject>($db: $crate::harness::TestDb<S>) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sqlite() {
                body($crate::harness::TestDb::sqlite().await).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                let (db, dropping) = $crate::harness::TestDb::postgres().await;
                body(db).await;
                dropping.drop_database().await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sim() {
                body($crate::harness::TestDb::sim().await).await
            }
        }
    };
}
pub(crate) use conformance;

/// A workflow launched without limits (and its first lease, held by `owner`).
pub async fn workflow<S: Subject>(store: &S, id: &str, owner: &str, lease_ms: u64) -> Lease {
    workflow_of(store, id, "tester", owner, lease_ms).await
}

/// A running workflow of `user_id`, leased by `owner`.
pub async fn workflow_of<S: Subject>(
    store: &S,
    id: &str,
    user_id: &str,
    owner: &str,
    lease_ms: u64,
) -> Lease {
    let launched = store
        .launch_workflow(
            NewWorkflow {
                workflow_id: store::WorkflowId::new(id),
                user_id: user_id.into(),
                request_id: None,
                fingerprint: "fp".into(),
                data: json!({}),
            },
            owner,
            lease_ms,
            LaunchLimits::NONE,
        )
        .await
        .expect("launch");
    match launched {
        Launch::Created { lease, .. } => lease,
        other => panic!("workflow {id:?} was not created: {other:?}"),
    }
}

/// A completed journal entry named `step_id`.
pub fn step(workflow_id: &str, step_id: &str) -> WriteOp {
    WriteOp::PutStep {
        seq: 0,
        workflow_id: store::WorkflowId::new(workflow_id),
        step_id: step_id.to_owned(),
        attempt: 1,
        status: store::StepStatus::Completed,
        record: store::StepRecord::decode("agent", &json!({"output": step_id}))
            .expect("a step record"),
    }
}
