//! SIGKILL at the `cancelling` fault point: a node that took a dead owner's workflow over to
//! cancel it dies mid-cancel. A third node must not replay the body (recover is refused while the
//! cancellation is pending), finishes the cancel itself, and can then delete the workflow.

use std::time::Duration;

use serde_json::json;

use crate::http_api::{ADMIN, Db, Node, PASSWORD, initialize, wait_for};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancel_interrupted_by_sigkill_is_finished_by_another_node_without_replay() {
    let db = Db::new(true).await;
    let lease = ("REINS_LEASE_SECONDS", "1".to_owned());
    let mut owner = Node::start(&db, std::slice::from_ref(&lease));
    let mut api = initialize(&owner).await;
    let launched = api
        .action(
            "launch",
            json!({"script": "await pause({stepId: 'p'}); return 1;"}),
        )
        .await;
    let run = launched.json()["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    wait_for(&mut api, &run, "paused").await;
    owner.process.signal(libc::SIGKILL);
    owner
        .process
        .wait_exit(Duration::from_secs(60))
        .expect("killed");

    let faults = tempfile::tempdir().expect("faults");
    std::fs::write(
        faults.path().join("arm.json"),
        json!({"boundary": "cancelling"}).to_string(),
    )
    .expect("arm");
    let mut canceller = Node::start(
        &db,
        &[
            lease.clone(),
            ("REINS_FAULT_DIR", faults.path().display().to_string()),
        ],
    );
    let mut on_canceller = canceller.api();
    assert_eq!(on_canceller.login(ADMIN, PASSWORD).await.status, 200);
    wait_for(&mut on_canceller, &run, "recoverable").await;
    let mut request = on_canceller.clone();
    let body = json!({"run_id": run});
    let pending = tokio::spawn(async move {
        request
            .try_send(
                "POST",
                "/api/plugins/community.workflows/actions/cancel",
                Some("application/json"),
                body.to_string().into_bytes(),
                &[],
            )
            .await
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !faults.path().join("reached.json").exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cancel never reached its fault point"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stored = format!("SELECT status FROM workflows WHERE id = '{run}'");
    assert_eq!(db.sql(&stored).await.as_deref(), Some("cancelling"));
    canceller.process.signal(libc::SIGKILL);
    canceller
        .process
        .wait_exit(Duration::from_secs(60))
        .expect("killed");
    let answered = pending.await.expect("request task");
    assert!(
        answered.is_err(),
        "the killed node answered the cancel: {answered:?}"
    );

    let heir = Node::start(&db, &[lease]);
    let mut on_heir = heir.api();
    assert_eq!(on_heir.login(ADMIN, PASSWORD).await.status, 200);
    wait_for(&mut on_heir, &run, "recoverable").await;
    let refused = on_heir.action("recover", json!({"run_id": run})).await;
    assert_eq!(refused.status, 422, "{refused:?}");
    assert!(
        refused.json()["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("cancellation is pending")
    );
    let cancelled = on_heir.action("cancel", json!({"run_id": run})).await;
    assert_eq!(
        (cancelled.status, cancelled.json()["status"].clone()),
        (200, json!("cancelled")),
        "{cancelled:?}"
    );
    let deleted = on_heir.action("delete", json!({"run_id": run})).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    assert_eq!(
        db.sql(&format!(
            "SELECT count(*) FROM workflows WHERE id = '{run}'"
        ))
        .await
        .as_deref(),
        Some("0")
    );
}
