//! Faults at the points where a real cluster meets them, on one in-process node (both backends):
//! store calls that fail as if the database were gone for a while, workflows that end with
//! children still running, reconciles of runs the journal never named, and values that must
//! come back bit for bit.

use std::time::Duration;

use actors::{FaultAction, LaunchRequest};
use serde_json::{Value, json};

use crate::harness::{TestDb, TestNode, eventually, on_both_backends};
use crate::workflows::{view, wait_for_status};

fn launch(script: &str, args: Value) -> LaunchRequest {
    LaunchRequest {
        user_id: "ada".into(),
        request_id: None,
        title: None,
        timeout_seconds: None,
        script: script.into(),
        args,
    }
}

/// Doubles spread over many magnitudes, from a fixed xorshift stream: about one in ten of such
/// numbers came back one ULP off before the JSON parser was made exact.
fn awkward_doubles(count: usize) -> Vec<f64> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let value = f64::from_bits(state);
        if value.is_finite() {
            out.push(value);
        }
        out.push((state >> 11) as f64 / (1u64 << 53) as f64);
    }
    out.truncate(count);
    out
}

on_both_backends! {
    async fn floats_round_trip_exactly_through_args_agents_journal_and_result(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        let numbers = awkward_doubles(400);
        let script = r#"
            const echoed = await agent({stepId: "echo", agentRef: "scripted",
                                        task: {output: {xs: args.xs}}});
            return {args: args.xs, agent: echoed.output.xs};
        "#;
        let id = node.node.workflows().launch(launch(script, json!({"xs": numbers})))
            .await.expect("launch").row.workflow_id;
        let done = wait_for_status(&node, id.as_str(), "completed").await;
        for field in ["args", "agent"] {
            let back: Vec<f64> = serde_json::from_value(done.row.data["result"][field].clone())
                .expect("numbers");
            let differing: Vec<(f64, f64)> = numbers.iter().zip(&back)
                .filter(|(sent, got)| sent.to_bits() != got.to_bits())
                .map(|(sent, got)| (*sent, *got))
                .take(3)
                .collect();
            assert_eq!(back.len(), numbers.len());
            assert!(differing.is_empty(), "{field}: sent vs got {differing:?}");
        }
    }
}

fn unavailable() -> FaultAction {
    FaultAction::Fail(store::Error::Unavailable(
        "the test took the database away".into(),
    ))
}

/// The child runs of a workflow's steps, as the store holds them.
async fn child_runs(db: &TestDb, workflow_id: &str) -> Vec<(String, i64, String)> {
    let store = db.store().await;
    let steps = store
        .read_steps(&store::WorkflowId::new(workflow_id))
        .await
        .expect("steps");
    let mut runs = Vec::new();
    for step in steps {
        if let Some(run_id) = step.encoded()["run_id"].as_str()
            && let Some(run) = store
                .read_run(&store::RunId::new(run_id))
                .await
                .expect("run")
        {
            runs.push((
                step.step_id.clone(),
                i64::from(step.attempt),
                run.status.as_str().to_owned(),
            ));
        }
    }
    runs
}

const TWO_STEPS: &str = r#"
    const a = await agent({stepId: "a", agentRef: "scripted", task: "one"});
    const b = await agent({stepId: "b", agentRef: "scripted", task: "two"});
    return [a.output, b.output];
"#;

on_both_backends! {
    async fn an_admission_that_finds_the_database_unavailable_waits_and_carries_on(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        // Every admission of the next second or so finds the database gone: before the fix the
        // first one failed its step, and the workflow with it.
        node.faults.add("admit_run", unavailable(), 5);
        let id = node.node.workflows().launch(launch(TWO_STEPS, json!({})))
            .await.expect("launch").row.workflow_id;
        let done = wait_for_status(&node, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"], json!([{"echo": "one"}, {"echo": "two"}]));
        assert_eq!(done.lease.expect("lease").epoch, store::Epoch::FIRST, "the outage cost a takeover");
        let runs = child_runs(&db, id.as_str()).await;
        assert_eq!(runs.len(), 2, "{runs:?}");
    }
}

on_both_backends! {
    async fn journal_writes_that_find_the_database_unavailable_are_retried_under_the_same_lease(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        node.faults.add("fenced_write", unavailable(), 5);
        let script = r#"
            await pause({stepId: "hold"});
            return await agent({stepId: "a", agentRef: "scripted", task: "one"});
        "#;
        let id = node.node.workflows().launch(launch(script, json!({})))
            .await.expect("launch").row.workflow_id;
        wait_for_status(&node, id.as_str(), "paused").await;
        node.faults.add("fenced_write", unavailable(), 5);
        node.node.workflows().resume(actors::Resume {
            workflow_id: id.clone(), fingerprint: None, step_id: "hold".into(), attempt: 1,
            input: json!(null),
        }, "ada").await.expect("resume");
        let done = wait_for_status(&node, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"]["output"], json!({"echo": "one"}));
        assert_eq!(done.lease.expect("lease").epoch, store::Epoch::FIRST, "the outage cost a takeover");
    }
}

on_both_backends! {
    async fn a_child_outcome_that_finds_the_database_unavailable_is_recorded_once_it_is_back(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        // Before the fix an unwritten outcome counted as a lost answer: the run was fenced at
        // its deadline and the workflow sent to needs_reconciliation.
        node.faults.add("finalize_run", unavailable(), 5);
        let id = node.node.workflows().launch(launch(TWO_STEPS, json!({})))
            .await.expect("launch").row.workflow_id;
        let done = wait_for_status(&node, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"], json!([{"echo": "one"}, {"echo": "two"}]));
        let runs = child_runs(&db, id.as_str()).await;
        assert!(runs.iter().all(|(_, _, status)| status == "success"), "{runs:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgresql_restart_costs_workflows_time_not_their_outcome() {
    let pg = crate::private_pg::PrivatePg::start();
    let db = TestDb::Postgres { url: pg.url() };
    let shared = tempfile::tempdir().expect("temp dir");
    let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
    let script = r#"
        const out = [];
        for (const step of ["a", "b", "c", "d"]) {
            out.push((await agent({stepId: step, agentRef: "scripted",
                                   task: {sleep_ms: 150, output: step}})).output);
        }
        return out;
    "#;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let launched = node
            .node
            .workflows()
            .launch(launch(script, json!({})))
            .await;
        ids.push(launched.expect("launch").row.workflow_id);
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    // About a second without the database, with steps running and admissions on their way.
    let pg = tokio::task::spawn_blocking(move || {
        pg.stop();
        std::thread::sleep(Duration::from_millis(600));
        pg.start_again();
        pg
    })
    .await
    .expect("restart the database");
    for id in &ids {
        let done = wait_for_status(&node, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"], json!(["a", "b", "c", "d"]), "{id}");
        let runs = child_runs(&db, id.as_str()).await;
        assert_eq!(runs.len(), 4, "one child run per step: {runs:?}");
    }
    drop(pg);
}

/// The slots the workflow holds, by step.
async fn slots_of(db: &TestDb, workflow_id: &str) -> Vec<String> {
    let slots = db.store().await.list_slots(1_000).await.expect("slots");
    slots
        .into_iter()
        .filter(|slot| slot.workflow_id == workflow_id)
        .map(|slot| slot.step_id)
        .collect()
}

/// The status of the child run of `step_id`, found by its idempotency key's attempt 1.
async fn run_of_step(db: &TestDb, workflow_id: &str, step_id: &str) -> Option<store::RunRow> {
    let store = db.store().await;
    for step in store
        .read_steps(&store::WorkflowId::new(workflow_id))
        .await
        .expect("steps")
    {
        if step.step_id == step_id
            && let Some(run_id) = step.encoded()["run_id"].as_str()
        {
            return store
                .read_run(&store::RunId::new(run_id))
                .await
                .expect("run");
        }
    }
    None
}

const FAIL_FAST: &str = r#"
    await parallel([
        () => agent({stepId: "slow", agentRef: "scripted", task: {sleep_ms: 60000, output: "late"}}),
        () => agent({stepId: "bad", agentRef: "scripted", task: {sleep_ms: 300, fail: "no"}}),
    ]);
"#;

on_both_backends! {
    async fn a_workflow_that_fails_stops_the_children_it_left_running_and_frees_their_slots(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        let id = node.node.workflows().launch(launch(FAIL_FAST, json!({})))
            .await.expect("launch").row.workflow_id;
        wait_for_status(&node, id.as_str(), "failed").await;
        assert_eq!(slots_of(&db, id.as_str()).await, Vec::<String>::new(), "the end gives every slot back");
        eventually(Duration::from_secs(60), "the sibling's child run is interrupted", async || {
            run_of_step(&db, id.as_str(), "slow").await
                .is_some_and(|run| run.status == store::RunStatus::Interrupted)
        }).await;
    }
}

on_both_backends! {
    async fn a_caught_fail_fast_stops_the_sibling_and_frees_its_slot_while_the_workflow_goes_on(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        let script = format!(
            "try {{ {FAIL_FAST} }} catch (e) {{ }}\nawait pause({{stepId: \"hold\"}});\nreturn 1;"
        );
        let id = node.node.workflows().launch(launch(&script, json!({})))
            .await.expect("launch").row.workflow_id;
        wait_for_status(&node, id.as_str(), "paused").await;
        eventually(Duration::from_secs(60), "the sibling is interrupted and its slot free", async || {
            let stopped = run_of_step(&db, id.as_str(), "slow").await
                .is_some_and(|run| run.status == store::RunStatus::Interrupted);
            stopped && slots_of(&db, id.as_str()).await.is_empty()
        }).await;
        let steps = db.store().await.read_steps(&id).await.expect("steps");
        let slow = steps.iter().find(|step| step.step_id == "slow").expect("slow journaled");
        assert_eq!(slow.status.as_str(), "cancelled", "{:?}", slow.encoded());
        node.node.workflows().resume(actors::Resume {
            workflow_id: id.clone(), fingerprint: None, step_id: "hold".into(), attempt: 1,
            input: json!(null),
        }, "ada").await.expect("resume");
        let done = wait_for_status(&node, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"], json!(1));
    }
}

/// Makes a step's journal entry look as it does when the step was journaled `queued` and its
/// run admitted later, with the owner gone before it could journal the run's id.
async fn forget_the_run_in_the_journal(db: &TestDb, workflow_id: &str, step_id: &str) {
    let changed = db
        .tamper(
            "UPDATE workflow_steps SET status = 'queued', data = data - 'run_id'
              WHERE workflow = $1 AND step_id = $2",
            "UPDATE workflow_steps SET status = 'queued', data = json_remove(data, '$.run_id')
              WHERE workflow = ?1 AND step_id = ?2",
            &[workflow_id, step_id],
        )
        .await;
    assert_eq!(changed, 1);
}

on_both_backends! {
    async fn a_reconcile_retry_closes_the_attempts_live_run_even_when_the_journal_never_named_it(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        let hold = shared.path().join("faults/hold_model");
        std::fs::write(&hold, b"").expect("hold");
        let script = r#"const r = await agent({stepId: "slow", agentRef: "scripted",
                            task: {hold_while: "hold_model", output: "done"}});
                        return r.output;"#;
        let id = owner.node.workflows().launch(launch(script, json!({}))).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the child run started", async || {
            view(&owner, id.as_str()).await.steps.first().is_some_and(|s| s.status.as_str() == "running")
        }).await;
        let old_run = view(&owner, id.as_str()).await.steps[0].encoded()["run_id"].as_str().expect("run").to_owned();
        // The owner loses the workflow's lease; its child run lives on, still renewed.
        owner.node.workflows().fence(&id).await.expect("fence");
        forget_the_run_in_the_journal(&db, id.as_str(), "slow").await;
        heir.node.workflows().recover(&id).await.expect("recover");
        let waiting = wait_for_status(&heir, id.as_str(), "needs_reconciliation").await;
        let why = &waiting.row.data["reconciliation"];
        assert_eq!(
            (why["reason"].as_str(), why["step_id"].as_str(), why["run_id"].as_str()),
            (Some("child_outcome_unknown"), Some("slow"), Some(old_run.as_str())),
            "{why}"
        );

        heir.node.workflows().reconcile(actors::ReconcileRequest {
            workflow_id: id.clone(), step_id: "slow".into(), resolution: actors::Resolution::Retry,
            reason: "the operator checked: nothing happened".into(), by: "op".into(),
        }).await.expect("reconcile");
        let old = db.store().await.read_run(&store::RunId::new(old_run)).await.expect("read").expect("old run");
        assert_eq!((old.status, old.stop_reason.as_deref()),
                   (store::RunStatus::Interrupted, Some("reconciled")), "the old run was left live");
        std::fs::remove_file(&hold).expect("release the model");
        let done = wait_for_status(&heir, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"], json!("done"));
        assert_eq!(done.row.data.get("reconciliation"), None, "settled: no reason any more");
        let attempts: Vec<(i32, String)> = done.steps.iter()
            .map(|step| (step.attempt, step.status.as_str().to_owned())).collect();
        assert_eq!(attempts, vec![(1, "cancelled".to_owned()), (2, "completed".to_owned())]);
        assert_eq!(slots_of(&db, id.as_str()).await, Vec::<String>::new());
    }
}

/// Stops `node` (a clean stop: a workflow with a child run in flight keeps its lease until it
/// runs out, as after a crash; any other gives its lease up).
async fn crash(node: TestNode) {
    node.node.shutdown().await.expect("stop");
}

async fn heir_with_automatic_recovery(db: &TestDb, shared: &std::path::Path) -> TestNode {
    let scripted = actors::agents::AgentConfig::scripted("scripted");
    TestNode::start_custom(db, "heir", 1_500, shared, &[scripted], |options| {
        options.workflows.automatic_recovery = true;
    })
    .await
}

const HOLD: &str = r#"await pause({stepId: "hold"}); return "resumed";"#;

on_both_backends! {
    async fn a_cancel_asked_while_a_dead_owners_lease_is_still_valid_is_finished_once_it_runs_out(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        // No automatic recovery: only the cancel itself can finish the job.
        let other = TestNode::start(&db, "other", 1_500, shared.path()).await;
        let id = owner.node.workflows().launch(launch(HOLD, json!({}))).await.expect("launch").row.workflow_id;
        wait_for_status(&owner, id.as_str(), "paused").await;
        crash(owner).await;
        // The dead owner's lease is still valid: the first takeover to cancel is refused.
        other.node.workflows().cancel(&id, "ada").await.expect("cancel");
        let done = wait_for_status(&other, id.as_str(), "cancelled").await;
        assert!(done.controls.iter().all(|control| control.applied));
    }
}

on_both_backends! {
    async fn automatic_recovery_finishes_dead_owners_cancels_and_none_it_cannot_take_starves_the_rest(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let workflows = owner.node.workflows();
        // The oldest 20 will have a pending cancel (before the fix: never finished, and the
        // oldest 16 were all a claim ever looked at); then 20 to recover.
        let mut cancelled = Vec::new();
        let mut recovered = Vec::new();
        for n in 0..40 {
            let id = workflows.launch(launch(HOLD, json!({}))).await.expect("launch").row.workflow_id;
            if n < 20 { cancelled.push(id) } else { recovered.push(id) }
        }
        for id in cancelled.iter().chain(&recovered) {
            wait_for_status(&owner, id.as_str(), "paused").await;
        }
        crash(owner).await;
        let store = db.store().await;
        for id in &cancelled {
            // Recorded the way any node records it, with nobody to carry it out.
            store.put_control(store::NewControl {
                workflow_id: id.clone(), kind: store::ControlKind::Cancel, step_id: String::new(),
                attempt: 0, body: json!({}), created_by: Some("ada".into()),
            }).await.expect("cancel");
        }
        let heir = heir_with_automatic_recovery(&db, shared.path()).await;
        for id in &cancelled {
            wait_for_status(&heir, id.as_str(), "cancelled").await;
        }
        for id in &recovered {
            eventually(Duration::from_secs(30), "recovered by the heir", async || {
                view(&heir, id.as_str()).await.row.owner.is_some_and(|owner| owner.starts_with("heir"))
            }).await;
            assert_eq!(view(&heir, id.as_str()).await.row.status.as_str(), "paused");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn automatic_recovery_takes_over_any_number_of_orphans_within_a_claim_period_or_two() {
    let db = TestDb::sqlite().await;
    let shared = tempfile::tempdir().expect("temp dir");
    let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
    let mut ids = Vec::new();
    for _ in 0..100 {
        ids.push(
            owner
                .node
                .workflows()
                .launch(launch(HOLD, json!({})))
                .await
                .expect("launch")
                .row
                .workflow_id,
        );
    }
    for id in &ids {
        wait_for_status(&owner, id.as_str(), "paused").await;
    }
    let store = owner.node.store();
    let newest_expiry = {
        let mut latest = 0.0f64;
        for id in &ids {
            latest = latest.max(
                store
                    .read_lease(id)
                    .await
                    .expect("lease")
                    .expect("leased")
                    .expires_at,
            );
        }
        latest
    };
    crash(owner).await;
    let heir = heir_with_automatic_recovery(&db, shared.path()).await;
    // A liveness bound, not a speed figure: claims of 16 per lease period needed seven periods
    // (over 10 s) for these; a claim per second that goes on while batches are full needs one
    // or two.
    let store = heir.node.store();
    eventually(
        Duration::from_secs(60),
        "every orphan is taken over",
        async || {
            let mut taken = 0;
            for id in &ids {
                if store
                    .read_lease(id)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|lease| lease.epoch.get() == 2)
                {
                    taken += 1;
                }
            }
            taken == ids.len()
        },
    )
    .await;
    let after_expiry = crate::harness::db_now(&store).await - newest_expiry;
    eprintln!("100 orphans taken over {after_expiry:.2} s after the last lease ran out");
    assert!(
        after_expiry < 5.0,
        "the last orphan was taken {after_expiry:.1} s after its lease ran out"
    );
}

on_both_backends! {
    async fn the_orphan_sweep_gives_back_the_slot_of_a_dead_nodes_child(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let script = r#"return (await agent({stepId: "slow", agentRef: "scripted",
                            task: {hold_while: "hold_model"}})).output;"#;
        let id = owner.node.workflows().launch(launch(script, json!({}))).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the child run started", async || {
            view(&owner, id.as_str()).await.steps.first().is_some_and(|s| s.status.as_str() == "running")
        }).await;
        assert_eq!(slots_of(&db, id.as_str()).await, vec!["slow".to_owned()]);
        crash(owner).await;
        // Before the fix the slot stayed held until an operator reconciled the workflow.
        eventually(Duration::from_secs(60), "the sweep closes the run and frees its slot", async || {
            let closed = run_of_step(&db, id.as_str(), "slow").await
                .is_some_and(|run| run.stop_reason.as_deref() == Some("orphan_recovered"));
            closed && slots_of(&db, id.as_str()).await.is_empty()
        }).await;
        heir.node.workflows().recover(&id).await.expect("recover");
        let waiting = wait_for_status(&heir, id.as_str(), "needs_reconciliation").await;
        assert_eq!(waiting.row.data["reconciliation"]["reason"], "orphaned_child");
        assert!(slots_of(&db, id.as_str()).await.is_empty());
        std::fs::remove_file(shared.path().join("faults/hold_model")).expect("release");
    }
}

on_both_backends! {
    async fn a_workflow_waiting_for_reconciliation_holds_no_place_under_the_limits(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let scripted = || vec![actors::agents::AgentConfig::scripted("scripted")];
        let one_each = |options: &mut actors::NodeOptions| {
            options.workflows.launch_limits.max_workflows_per_owner = 1;
        };
        let owner = TestNode::start_custom(&db, "owner", 1_500, shared.path(), &scripted(), one_each).await;
        let heir = TestNode::start_custom(&db, "heir", 1_500, shared.path(), &scripted(), one_each).await;
        let hold = shared.path().join("faults/hold_model");
        std::fs::write(&hold, b"").expect("hold");
        let uncertain = r#"return (await agent({stepId: "slow", agentRef: "scripted",
                               task: {hold_while: "hold_model", output: "done"}})).output;"#;
        let id = owner.node.workflows().launch(launch(uncertain, json!({}))).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the child run started", async || {
            view(&owner, id.as_str()).await.steps.first().is_some_and(|s| s.status.as_str() == "running")
        }).await;
        owner.node.workflows().fence(&id).await.expect("fence");
        heir.node.workflows().recover(&id).await.expect("recover");
        wait_for_status(&heir, id.as_str(), "needs_reconciliation").await;

        // Before the fix this launch was refused: the uncertain workflow held the user's one place.
        let other = heir.node.workflows().launch(launch(HOLD, json!({}))).await
            .expect("a workflow only an operator can settle holds no place").row.workflow_id;
        wait_for_status(&heir, other.as_str(), "paused").await;
        let request = || actors::ReconcileRequest {
            workflow_id: id.clone(), step_id: "slow".into(), resolution: actors::Resolution::Retry,
            reason: "checked".into(), by: "op".into(),
        };
        // Its place is taken now: the reconcile is refused, and nothing is written.
        let refused = heir.node.workflows().reconcile(request()).await;
        assert!(matches!(refused, Err(actors::Error::LimitReached { limit: store::Limit::WorkflowsPerOwner, .. })),
            "{refused:?}");
        assert_eq!(view(&heir, id.as_str()).await.row.status.as_str(), "needs_reconciliation");
        heir.node.workflows().cancel(&other, "ada").await.expect("cancel");
        wait_for_status(&heir, other.as_str(), "cancelled").await;
        std::fs::remove_file(&hold).expect("release the model");
        heir.node.workflows().reconcile(request()).await.expect("a place is free again");
        let done = wait_for_status(&heir, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"], json!("done"));
        // And it counted while it ran: the user's one place is free once more.
        let again = heir.node.workflows().launch(launch(HOLD, json!({}))).await.expect("launch");
        wait_for_status(&heir, again.row.workflow_id.as_str(), "paused").await;
    }
}

on_both_backends! {
    async fn a_node_takes_back_what_an_outage_longer_than_its_lease_made_it_drop(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        // Manual recovery: nobody else would ever take the workflow over.
        let node = TestNode::start(&db, "a", 1_500, shared.path()).await;
        let script = r#"const input = await pause({stepId: "hold"});
                        const a = await agent({stepId: "a", agentRef: "scripted", task: "one"});
                        return [input, a.output];"#;
        let id = node.node.workflows().launch(launch(script, json!({}))).await.expect("launch").row.workflow_id;
        wait_for_status(&node, id.as_str(), "paused").await;
        // The database is gone for longer than the lease: renewals fail, and so does the
        // resumed workflow's next write until the lease has run out.
        node.faults.add("renew_lease", unavailable(), 8);
        node.faults.add("fenced_write", unavailable(), 6);
        node.node.workflows().resume(actors::Resume {
            workflow_id: id.clone(), fingerprint: None, step_id: "hold".into(), attempt: 1,
            input: json!("go"),
        }, "ada").await.expect("resume");
        // Before the fix the workflow stayed recoverable until an operator recovered it.
        let done = wait_for_status(&node, id.as_str(), "completed").await;
        assert_eq!(done.row.data["result"], json!(["go", {"echo": "one"}]));
        assert_eq!(done.lease.expect("lease").epoch.get(), 2, "taken back under a new epoch");
        let runs = child_runs(&db, id.as_str()).await;
        assert_eq!(runs.len(), 1, "{runs:?}");
    }
}
