//! Child runs end to end through the actors of real nodes (in this process) on both backends:
//! the scripted agent's directives, cancellation across nodes, bad input, and the races of
//! terminal commit authority made deterministic with store faults.

use std::sync::Arc;
use std::time::Duration;

use actors::{Admitted, Error, FaultAction, RunEnd, RunRequest};
use serde_json::{Value, json};
use store::{CancelAction, RunRow, RunStatus};
use tokio::sync::{Notify, oneshot};

use crate::harness::{TestNode, eventually, on_both_backends};

const LEASE_MS: u64 = 1_500;

fn request(thread: &str, task: Value) -> RunRequest {
    RunRequest {
        thread_id: thread.to_owned(),
        agent: "scripted".into(),
        task,
        idempotency_key: None,
        step: None,
        run_id: None,
        timeouts: Default::default(),
    }
}

async fn start(node: &TestNode, thread: &str, task: Value) -> (RunRow, oneshot::Receiver<RunEnd>) {
    match node
        .node
        .runs()
        .start(request(thread, task))
        .await
        .expect("start")
    {
        Admitted::Started { row, ended } => (row, ended),
        other => panic!("not started: {other:?}"),
    }
}

/// The run's end; the bound only detects a run that never ends.
async fn ended(ended: oneshot::Receiver<RunEnd>) -> RunEnd {
    tokio::time::timeout(Duration::from_secs(60), ended)
        .await
        .expect("the run ends within 60 s")
        .expect("the run reports its end")
}

async fn row(node: &TestNode, run_id: &store::RunId) -> RunRow {
    node.node
        .runs()
        .get(run_id)
        .await
        .expect("read")
        .expect("row")
}

on_both_backends! {
    async fn the_scripted_agent_carries_out_every_directive(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;

        let (echo, end) = start(&node, "t-echo", json!("hello")).await;
        assert!(matches!(ended(end).await, RunEnd::Persisted(ref o) if o.status == RunStatus::Success));
        let stored = row(&node, &echo.run_id).await;
        assert_eq!((stored.status, stored.output), (RunStatus::Success, Some(json!({"echo": "hello"}))));

        let task = json!({
            "write": [{"path": "/mnt/user-data/outputs/evidence.txt", "content": "v1"}],
            "sleep_ms": 50,
            "output": {"written": true},
            "tokens": 42
        });
        let (writer, end) = start(&node, "t-write", task).await;
        assert!(matches!(ended(end).await, RunEnd::Persisted(_)));
        let stored = row(&node, &writer.run_id).await;
        assert_eq!((stored.output, stored.total_tokens, stored.message_count),
            (Some(json!({"written": true})), 42, 1));
        let file = shared.path().join("workspaces/t-write/user-data/outputs/evidence.txt");
        assert_eq!(std::fs::read_to_string(file).expect("the file was written"), "v1");

        let (failing, end) = start(&node, "t-fail", json!({"fail": "the model refused"})).await;
        assert!(matches!(ended(end).await, RunEnd::Persisted(ref o) if o.status == RunStatus::Error));
        let stored = row(&node, &failing.run_id).await;
        assert_eq!((stored.status, stored.error.as_deref()), (RunStatus::Error, Some("the model refused")));

        let ask = json!({"ask_approval": {"request_id": "approval-1", "actions": [{"tool": "deploy"}]}});
        let (asking, end) = start(&node, "t-ask", ask).await;
        assert_eq!(ended(end).await, RunEnd::WaitingForInput);
        let stored = row(&node, &asking.run_id).await;
        assert_eq!(stored.status, RunStatus::WaitingForInput);
        assert_eq!(store::pending_request_id(&stored.metadata), Some("approval-1"));
        let answer = node.node.runs().answer_approval("t-ask", &["approval-1".into()], &json!({"decision": "approve"})).await.expect("answer");
        assert!(answer.is_some());
        assert_eq!(row(&node, &asking.run_id).await.status, RunStatus::Success);

        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let (held, mut end) = start(&node, "t-hold", json!({"hold_while": "hold_model"})).await;
        eventually(Duration::from_secs(60), "the held run is running", async || {
            row(&node, &held.run_id).await.status == RunStatus::Running
        })
        .await;
        // And stays so while the file exists (a while here: a busy machine only shortens it).
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(end.try_recv(), Err(oneshot::error::TryRecvError::Empty), "ended while the file exists");
        assert_eq!(row(&node, &held.run_id).await.status, RunStatus::Running, "held while the file exists");
        std::fs::remove_file(shared.path().join("faults/hold_model")).expect("release");
        assert!(matches!(ended(end).await, RunEnd::Persisted(ref o) if o.status == RunStatus::Success));
    }
}

on_both_backends! {
    async fn a_cancel_issued_on_a_second_node_reaches_the_agent_within_one_renewal_period(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let (owner, other) = (
            TestNode::start(&db, "owner", LEASE_MS, shared.path()).await,
            TestNode::start(&db, "other", LEASE_MS, shared.path()).await,
        );
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let (run, end) = start(&owner, "t-1", json!({"hold_while": "hold_model", "tokens": 3})).await;
        eventually(Duration::from_secs(60), "the run is running", async || {
            row(&owner, &run.run_id).await.status == RunStatus::Running
        })
        .await;

        let action = other.node.runs().cancel(&run.run_id, CancelAction::Interrupt).await.expect("cancel");
        assert_eq!(action, Some(CancelAction::Interrupt));
        // The run holds for as long as its file exists: only the cancel can end it, and it
        // reaches the owner on the answer of a lease renewal (every third of a lease). A cancel
        // that came any other way (the owner losing its lease, a sweep) shows as a lease lost.
        let end = ended(end).await;
        assert!(matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Interrupted), "{end:?}");
        let metrics = owner.node.metrics();
        assert!(metrics.counter("reins_lease_renewals_total", &[("kind", "run")]) >= 1);
        assert_eq!(metrics.counter("reins_lease_losses_total", &[("kind", "run")]), 0,
            "the cancel came with a lost lease, not with a renewal");
        let stored = row(&other, &run.run_id).await;
        assert_eq!((stored.status, stored.cancel_action), (RunStatus::Interrupted, Some(CancelAction::Interrupt)));
    }
}

on_both_backends! {
    async fn bad_input_gets_a_clear_error_and_writes_nothing(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;
        let runs = node.node.runs();

        let unknown = runs.start(RunRequest { agent: "oracle".into(), ..request("t-1", json!("x")) }).await;
        assert!(matches!(unknown, Err(Error::UnknownAgent { ref name, .. }) if name == "oracle"), "{unknown:?}");
        let big = runs.start(request("t-1", json!("x".repeat(48 * 1024)))).await;
        assert!(matches!(big, Err(Error::TooLarge { limit_name: "frame_bytes_max", .. })), "{big:?}");
        let just_fits = runs.start(request("t-1", json!("x".repeat(48 * 1024 - 2)))).await;
        assert!(matches!(just_fits, Ok(Admitted::Started { .. })), "a task at the limit was refused: {just_fits:?}");
        let thread = runs.start(request("../etc", json!("x"))).await;
        assert!(matches!(thread, Err(Error::InvalidRequest(_))), "{thread:?}");

        let (malformed, end) = start(&node, "t-2", json!({"sleep_ms": "soon"})).await;
        assert!(matches!(ended(end).await, RunEnd::Persisted(ref o) if o.status == RunStatus::Error));
        let stored = row(&node, &malformed.run_id).await;
        assert!(stored.error.as_deref().is_some_and(|e| e.contains("sleep_ms")), "{:?}", stored.error);
        assert_eq!(std::fs::read_dir(shared.path().join("workspaces")).map(|d| d.count()).unwrap_or(0), 0,
            "a refused request created a workspace");
    }
}

on_both_backends! {
    async fn an_identical_row_whose_acknowledgement_was_lost_is_not_our_outcome(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;
        node.faults.add("finalize_run", FaultAction::DropAnswer, 1);
        let (run, end) = start(&node, "t-1", json!({"tokens": 5})).await;
        assert_eq!(ended(end).await, RunEnd::Fenced, "an unacknowledged write counted as persisted");
        let stored = row(&node, &run.run_id).await;
        assert_eq!(stored.status, RunStatus::Success, "the write itself landed");
        assert_eq!(stored.total_tokens, 5, "the token count rides in the outcome's own write");
    }
}

on_both_backends! {
    async fn a_terminal_write_whose_outcome_is_unknown_is_sent_again_and_then_ours(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;
        // What a connection dropped mid-statement answers, for a write that did not land.
        let unknown = store::Error::OutcomeUnknown("connection closed".into());
        node.faults.add("finalize_run", FaultAction::Fail(unknown), 1);
        let (run, end) = start(&node, "t-1", json!({"tokens": 3})).await;
        let end = ended(end).await;
        assert!(matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Success), "{end:?}");
        let stored = row(&node, &run.run_id).await;
        assert_eq!((stored.status, stored.total_tokens), (RunStatus::Success, 3));
    }
}

on_both_backends! {
    async fn a_held_acknowledgement_outlives_a_refused_renewal(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;
        let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        node.faults.add("finalize_run", FaultAction::HoldAnswer {
            reached: Arc::clone(&reached),
            release: Arc::clone(&release),
        }, 1);
        let (run, end) = start(&node, "t-1", json!({"tokens": 7})).await;
        tokio::time::timeout(Duration::from_secs(60), reached.notified()).await.expect("the commit landed");
        eventually(Duration::from_secs(60), "a renewal is refused by the committed row", async || {
            node.node.leases().await.expect("leases").iter().any(|l| l.lease == actors::Leased::Run(run.run_id.clone()) && l.refused)
        })
        .await;
        release.notify_one();
        let end = ended(end).await;
        assert!(matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Success), "{end:?}");
        assert_eq!(row(&node, &run.run_id).await.total_tokens, 7);
    }
}

on_both_backends! {
    async fn a_durable_cancel_reaches_a_run_whose_terminal_write_is_pending(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;
        let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        node.faults.add("finalize_run", FaultAction::HoldBefore {
            reached: Arc::clone(&reached),
            release: Arc::clone(&release),
        }, 1);
        let (run, end) = start(&node, "t-1", json!("done")).await;
        tokio::time::timeout(Duration::from_secs(60), reached.notified()).await.expect("the commit is staged");
        node.node.store().request_run_cancel(&run.run_id, CancelAction::Rollback).await.expect("cancel");
        release.notify_one();
        let end = ended(end).await;
        assert!(matches!(end, RunEnd::Persisted(ref o) if o.status == RunStatus::Interrupted), "{end:?}");
        let stored = row(&node, &run.run_id).await;
        assert_eq!((stored.status, stored.stop_reason.as_deref()), (RunStatus::Interrupted, Some("rollback")));
    }
}

on_both_backends! {
    async fn a_hung_renewal_fences_its_run_at_the_deadline_without_delaying_another(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let (slow, slow_end) = start(&node, "t-slow", json!({"hold_while": "hold_model"})).await;
        let (fast, fast_end) = start(&node, "t-fast", json!({"hold_while": "hold_model"})).await;
        let hung = Arc::new(Notify::new());
        node.faults.add_for("renew_run_lease", slow.run_id.as_str(), FaultAction::HoldBefore {
            reached: Arc::new(Notify::new()),
            release: Arc::clone(&hung),
        }, 1_000);
        node.node.store().request_run_cancel(&fast.run_id, CancelAction::Rollback).await.expect("cancel");

        let fast_end = ended(fast_end).await;
        assert!(matches!(fast_end, RunEnd::Persisted(ref o) if o.status == RunStatus::Interrupted), "{fast_end:?}");
        assert_eq!(ended(slow_end).await, RunEnd::Fenced, "the hung lease was not fenced at its deadline");
        let stored = row(&node, &slow.run_id).await;
        assert!(
            matches!(
                (stored.status, stored.stop_reason.as_deref()),
                (RunStatus::Running, None) | (RunStatus::Error, Some("orphan_recovered"))
            ),
            "a fenced run wrote an outcome: {stored:?}"
        );
        hung.notify_waiters();
    }
}

on_both_backends! {
    async fn a_run_claimed_as_an_orphan_keeps_the_claimers_outcome(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let (owner, peer) = (
            TestNode::start(&db, "owner", LEASE_MS, shared.path()).await,
            TestNode::start(&db, "peer", LEASE_MS, shared.path()).await,
        );
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let (run, end) = start(&owner, "t-1", json!({"hold_while": "hold_model"})).await;
        // The owner's renewals stop reaching the store, as if its network were cut.
        owner.faults.add_for("renew_run_lease", run.run_id.as_str(), FaultAction::Fail(
            store::Error::Unavailable("cut off".into())), 1_000);
        eventually(Duration::from_secs(60), "the peer closed the orphan", async || {
            row(&peer, &run.run_id).await.stop_reason.as_deref() == Some("orphan_recovered")
        })
        .await;
        std::fs::remove_file(shared.path().join("faults/hold_model")).expect("release");
        assert_eq!(ended(end).await, RunEnd::Fenced);
        let stored = row(&peer, &run.run_id).await;
        assert_eq!((stored.status, stored.stop_reason.as_deref()), (RunStatus::Error, Some("orphan_recovered")),
            "the old owner overwrote the claimer's outcome");
    }
}

on_both_backends! {
    /// Issue 31: an attempt's timeout ends its run through the terminal compare-and-set like any
    /// other outcome: here the owner's write is held while its renewals fail and a peer closes
    /// the run as an orphan; released, the timeout's write is refused and the owner is fenced.
    async fn a_timed_out_run_claimed_by_another_node_keeps_the_claimers_outcome(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let (owner, peer) = (
            TestNode::start(&db, "owner", LEASE_MS, shared.path()).await,
            TestNode::start(&db, "peer", LEASE_MS, shared.path()).await,
        );
        let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        owner.faults.add("finalize_run", FaultAction::HoldBefore {
            reached: Arc::clone(&reached),
            release: Arc::clone(&release),
        }, 1);
        let idle = runtime::policy::TimeoutOptions { idle_ms: Some(500), ..Default::default() };
        let silent = RunRequest { timeouts: idle, ..request("t-1", json!({"silent_ms": 600_000})) };
        let Admitted::Started { row: run, ended: end } = owner.node.runs().start(silent).await.expect("start") else {
            panic!("not started");
        };
        tokio::time::timeout(Duration::from_secs(60), reached.notified()).await.expect("the timeout's write is staged");
        owner.faults.add_for("renew_run_lease", run.run_id.as_str(), FaultAction::Fail(
            store::Error::Unavailable("cut off".into())), 1_000);
        eventually(Duration::from_secs(60), "the peer closed the orphan", async || {
            row(&peer, &run.run_id).await.stop_reason.as_deref() == Some("orphan_recovered")
        })
        .await;
        release.notify_one();
        assert_eq!(ended(end).await, RunEnd::Fenced);
        let stored = row(&peer, &run.run_id).await;
        assert_eq!((stored.status, stored.stop_reason.as_deref()), (RunStatus::Error, Some("orphan_recovered")),
            "the timed-out owner overwrote the claimer's outcome");
        assert_eq!(stored.metadata.get("failure"), None);
    }
}

on_both_backends! {
    /// Issue 31: the scripted agent's `silent_ms` sends no progress, so `idle_ms` ends it; an
    /// agent's configured timeouts hold under a request that gives none.
    async fn the_scripted_agents_silence_meets_idle_ms_and_attempt_ms(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let limited = serde_json::from_value::<actors::agents::AgentConfig>(json!({
            "kind": "scripted", "name": "limited", "timeout": {"attempt_ms": 300}
        }))
        .expect("agent");
        // The same limit, long enough that no run ends past it on a busy machine.
        let roomy = serde_json::from_value::<actors::agents::AgentConfig>(json!({
            "kind": "scripted", "name": "roomy", "timeout": {"attempt_ms": 60_000}
        }))
        .expect("agent");
        let node = TestNode::start_with(&db, "a", LEASE_MS, shared.path(),
            &[actors::agents::AgentConfig::scripted("scripted"), limited, roomy]).await;
        let idle = runtime::policy::TimeoutOptions { idle_ms: Some(300), ..Default::default() };
        let silent = RunRequest { timeouts: idle, ..request("t-1", json!({"silent_ms": 600_000})) };
        let Admitted::Started { row: run, ended: end } = node.node.runs().start(silent).await.expect("start") else {
            panic!("not started");
        };
        assert!(matches!(ended(end).await, RunEnd::Persisted(ref o) if o.status == RunStatus::Error));
        let stored = row(&node, &run.run_id).await;
        assert_eq!(stored.error.as_deref(), Some("no progress for 300 ms (timeout.idleMs)"));
        assert_eq!(stored.metadata["failure"]["code"], "idle_timeout");

        let long = RunRequest { agent: "limited".into(), ..request("t-2", json!({"sleep_ms": 600_000})) };
        let Admitted::Started { row: run, ended: end } = node.node.runs().start(long).await.expect("start") else {
            panic!("not started");
        };
        assert!(matches!(ended(end).await, RunEnd::Persisted(ref o) if o.status == RunStatus::Error));
        let stored = row(&node, &run.run_id).await;
        assert_eq!(stored.error.as_deref(), Some("the attempt ran for 300 ms (timeout.attemptMs)"));
        assert_eq!(stored.metadata["failure"],
            json!({"class": "timeout", "code": "attempt_timeout", "retryable": true}));

        // A run that ends before its limit is not touched by it.
        let quick = RunRequest { agent: "roomy".into(), ..request("t-3", json!("hi")) };
        let Admitted::Started { ended: end, .. } = node.node.runs().start(quick).await.expect("start") else {
            panic!("not started");
        };
        assert!(matches!(ended(end).await, RunEnd::Persisted(ref o) if o.status == RunStatus::Success));
    }
}

on_both_backends! {
    async fn two_nodes_answering_one_approval_through_their_actors_have_one_winner(db: TestDb) {
        const ROUNDS: usize = 100;
        let shared = tempfile::tempdir().expect("temp dir");
        let (a, b) = (
            TestNode::start(&db, "a", LEASE_MS, shared.path()).await,
            TestNode::start(&db, "b", LEASE_MS, shared.path()).await,
        );
        let ask = json!({"ask_approval": {"request_id": "approval", "actions": []}});
        for round in 0..ROUNDS {
            let thread = format!("t-{round}");
            let (run, end) = start(&a, &thread, ask.clone()).await;
            assert_eq!(ended(end).await, RunEnd::WaitingForInput);
            let barrier = Arc::new(tokio::sync::Barrier::new(2));
            let answer = |node: &TestNode| {
                let (runs, barrier, thread) = (node.node.runs(), Arc::clone(&barrier), thread.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    runs.answer_approval(&thread, &["approval".into()], &json!({"decision": "approve"})).await
                })
            };
            let (first, second) = (answer(&a), answer(&b));
            let first = first.await.expect("join").expect("answer");
            let second = second.await.expect("join").expect("answer");
            assert_eq!(usize::from(first.is_some()) + usize::from(second.is_some()), 1,
                "round {round}: {first:?} / {second:?}");
            assert_eq!(row(&a, &run.run_id).await.status, RunStatus::Success);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stops_within_its_shutdown_timeout_while_the_store_hangs() {
    let db = crate::harness::TestDb::sqlite().await;
    let shared = tempfile::tempdir().expect("temp dir");
    let node = TestNode::start(&db, "a", LEASE_MS, shared.path()).await;
    std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
    let (_run, _end) = start(&node, "t-1", json!({"hold_while": "hold_model"})).await;
    let (never, renewing) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    for (call, reached) in [
        ("renew_run_lease", Arc::clone(&renewing)),
        ("mark_node_stopped", Arc::new(Notify::new())),
    ] {
        node.faults.add(
            call,
            FaultAction::HoldBefore {
                reached,
                release: Arc::clone(&never),
            },
            1_000,
        );
    }
    tokio::time::timeout(Duration::from_secs(60), renewing.notified())
        .await
        .expect("a renewal hangs in the store");
    // Shutdown waits at most the shutdown timeout (5 s) to record the stop and as long again
    // for the actors; a hung store must not stretch that. The store never answers, so the
    // bound only tells a shutdown that waits for it (forever) from one that gives up.
    let stopped = tokio::time::timeout(Duration::from_secs(60), node.node.shutdown()).await;
    assert!(stopped.is_ok(), "shutdown hung on the store");
}
