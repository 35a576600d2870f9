//! How the runs that asked a person are read, on both backends. The rules of child runs
//! (admission, slots, commit authority, cancellation, approvals, orphans) are the store's
//! conformance suite (`store/tests/conformance`).

use crate::harness::{TestDb, on_both_backends};

/// The plan of the read `get` makes of a workflow's runs that asked a person (the statement of
/// `approval_runs_in`/`approval_runs_on`): through `runs_asked_by_workflow`, never a scan of
/// every run ever made (which cost every `get` a read proportional to all history).
async fn plan_of_the_runs_that_asked(db: &TestDb) -> String {
    match db {
        TestDb::Postgres { .. } => {
            let client = db.pg_client().await;
            // The planner would scan a table this small anyway: forbid it, so only a usable
            // index can answer.
            client
                .batch_execute("SET enable_seqscan = off")
                .await
                .expect("set");
            let rows = client
                .query(
                    "EXPLAIN SELECT run_id FROM runs WHERE workflow = $1
                       AND (status = 'waiting_for_input' OR metadata -> 'hitl_answer' IS NOT NULL)
                     ORDER BY created_at, run_id",
                    &[&"w"],
                )
                .await
                .expect("explain");
            rows.iter()
                .map(|row| row.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        }
        TestDb::Sqlite { dir, .. } => {
            let connection = rusqlite::Connection::open(dir.path().join("reins.db")).expect("open");
            let mut statement = connection
                .prepare(
                    "EXPLAIN QUERY PLAN SELECT run_id FROM runs WHERE workflow = ?1
                       AND (status = 'waiting_for_input'
                            OR json_extract(metadata, '$.hitl_answer') IS NOT NULL)
                     ORDER BY created_at, run_id",
                )
                .expect("explain");
            let rows = statement
                .query_map(["w"], |row| row.get::<_, String>(3))
                .expect("plan");
            rows.map(|row| row.expect("row"))
                .collect::<Vec<_>>()
                .join("\n")
        }
    }
}

on_both_backends! {
    async fn the_runs_that_asked_are_read_through_an_index_never_a_scan(db: TestDb) {
        let plan = plan_of_the_runs_that_asked(&db).await;
        assert!(plan.contains("runs_asked_by_workflow"), "{plan}");
    }
}
