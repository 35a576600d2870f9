//! Durable workflows end to end on one node (both backends): a script with agent steps in
//! sequence and in parallel, a pause, a human checkpoint, completion; controls from the API;
//! exactly one child run per agent step.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actors::{Decide, FaultAction, LaunchRequest, Resume, WorkflowView};
use serde_json::json;
use store::ControlWrite;
use tokio::sync::Notify;

use crate::harness::{TestDb, TestNode, eventually, on_both_backends};

const SCRIPT: &str = r#"
    const draft = await agent({stepId: "draft", agentRef: "scripted", task: {
        write: [{path: "/mnt/user-data/outputs/evidence.txt", content: "evidence v1"}],
        output: {text: "v1"}, tokens: 3}});
    const [left, right] = await parallel([
        () => agent({stepId: "left", agentRef: "scripted", task: "l"}),
        () => agent({stepId: "right", agentRef: "scripted", task: "r"}),
    ]);
    const captured = await captureArtifact({stepId: "cap", sourceStepId: "draft",
                                            path: "/mnt/user-data/outputs/evidence.txt"});
    const resumed = await pause({stepId: "hold"});
    const text = await readArtifact({artifactVersion: captured.artifactVersion});
    const review = await humanCheckpoint({stepId: "review", sourceStepId: "cap",
                                          artifactVersion: captured.artifactVersion});
    console.log("reviewed", review.decision);
    return {draft: draft.output, draftVersion: draft.artifactVersion, left: left.output,
            right: right.output, captured: [captured.artifactVersion, captured.bytes], text,
            resumed, decision: review.decision, by: review.decidedBy, hasTime: Date.now() > 0};
"#;

/// The one file named `name` under the shared workspaces folder.
fn find_file(root: &std::path::Path, name: &str) -> std::path::PathBuf {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                folders.push(path);
            } else if path.file_name().is_some_and(|n| n == name) {
                found.push(path);
            }
        }
    }
    assert_eq!(found.len(), 1, "{found:?}");
    found.remove(0)
}

fn resume(id: &str, step_id: &str, input: serde_json::Value) -> Resume {
    Resume {
        workflow_id: id.into(),
        fingerprint: None,
        step_id: step_id.into(),
        attempt: 1,
        input,
    }
}

/// The workflow as stored, with its whole journal in `steps` (checkpoints among the steps, in
/// journal order), as the tests look at it: the record's paging is `tests/it/paging.rs`'s.
pub(crate) async fn view(node: &TestNode, id: &str) -> WorkflowView {
    let mut view = node
        .node
        .workflows()
        .get(&store::WorkflowId::new(id), u32::MAX, u32::MAX)
        .await
        .expect("get")
        .expect("exists");
    view.steps.append(&mut view.checkpoints);
    view.steps.sort_by_key(store::StepPosition::of);
    view
}

/// Waits until the workflow has `status`, and answers it as it is then.
pub(crate) async fn wait_for_status(node: &TestNode, id: &str, status: &str) -> WorkflowView {
    let what = format!("workflow {id} reaches {status}");
    eventually(Duration::from_secs(60), &what, async || {
        view(node, id).await.row.status.as_str() == status
    })
    .await;
    view(node, id).await
}

on_both_backends! {
    async fn a_workflow_runs_agents_pauses_waits_for_a_decision_and_completes(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        let workflows = node.node.workflows();
        let request = LaunchRequest {
            user_id: "ada".into(),
            request_id: Some("req-1".into()),
            title: None, timeout_seconds: None,
            script: SCRIPT.into(),
            args: json!({"topic": "x"}),
        };
        let launched = workflows.launch(request.clone()).await.expect("launch");
        assert!(launched.created);
        // The row the store wrote, which the HTTP launch answers from without reading it again.
        assert_eq!((launched.row.status, launched.row.user_id.as_str()), (store::WorkflowStatus::Running, "ada"));
        let again = workflows.launch(request).await.expect("launch again");
        assert_eq!((&again.row.workflow_id, again.created), (&launched.row.workflow_id, false));
        let id = launched.row.workflow_id;

        wait_for_status(&node, id.as_str(), "paused").await;
        // The source changes after the capture; the captured version must not.
        let evidence = find_file(&shared.path().join("workspaces"), "evidence.txt");
        assert_eq!(std::fs::read_to_string(&evidence).expect("evidence"), "evidence v1");
        std::fs::write(&evidence, "tampered").expect("overwrite");
        let resumed = workflows.resume(resume(id.as_str(), "hold", json!({"go": true})), "ada").await.expect("resume");
        assert!(matches!(resumed, ControlWrite::Recorded(_)));
        let repeated = workflows.resume(resume(id.as_str(), "hold", json!({"go": true})), "ada").await.expect("again");
        assert!(matches!(repeated, ControlWrite::Repeated(_)), "a repeated resume made a second row");

        wait_for_status(&node, id.as_str(), "waiting_approval").await;
        let decide = |artifact_version| Decide {
            workflow_id: id.clone(), step_id: "review".into(), attempt: 1, artifact_version,
            decision: "approve".into(), comment: None,
        };
        let stale = workflows.decide(decide(1), "bob").await.expect_err("version 1 is not under review");
        assert!(matches!(stale, actors::Error::StaleArtifactVersion { under_review: Some(4), given: 1, .. }), "{stale}");
        let stale = Resume { fingerprint: Some("0".repeat(64)), ..resume(id.as_str(), "hold", json!(null)) };
        let stale = workflows.resume(stale, "ada").await.expect_err("stale fingerprint");
        assert!(matches!(stale, actors::Error::StaleFingerprint { .. }), "{stale}");
        workflows.decide(decide(4), "bob").await.expect("decide");
        wait_for_status(&node, id.as_str(), "completed").await;

        let done = view(&node, id.as_str()).await;
        assert_eq!(done.row.data["result"], json!({
            "draft": {"text": "v1"},
            "draftVersion": 1,
            "left": {"echo": "l"},
            "right": {"echo": "r"},
            "captured": [4, 11],
            "text": "evidence v1",
            "resumed": {"go": true},
            "decision": "approve",
            "by": "bob",
            "hasTime": true,
        }));
        let artifact = node.node.store().read_artifact(&id, 4).await.expect("read").expect("v4");
        assert_eq!(artifact.content, b"evidence v1");
        let steps: Vec<(i32, &str, &str, &str)> = done.steps.iter()
            .map(|s| (s.seq, s.step_id.as_str(), s.kind_name(), s.status.as_str())).collect();
        assert_eq!(steps, vec![
            (0, "draft", "agent", "completed"),
            (1, "left", "agent", "completed"),
            (2, "right", "agent", "completed"),
            (3, "cap", "captureArtifact", "completed"),
            (4, "hold", "pause", "completed"),
            (5, "read:5", "readArtifact", "completed"),
            (6, "review", "humanCheckpoint", "completed"),
        ]);
        let run_ids: HashSet<&str> = done.steps.iter().filter_map(|s| Some(s.record()?.run_id()?.as_str())).collect();
        assert_eq!(run_ids.len(), 3, "one child run per agent step");
        assert!(done.controls.iter().all(|c| c.applied));
        assert_eq!(node.node.store().read_lease(&id).await.expect("lease").map(|l| l.epoch.get()), Some(1));
        assert!(node.node.workflows().live().await.expect("live").is_empty(), "a finished workflow keeps no supervisor");
    }
}

on_both_backends! {
    async fn a_failing_step_fails_the_workflow_unless_the_script_catches_it(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        let workflows = node.node.workflows();
        let launch = |script: &str| LaunchRequest {
            user_id: "ada".into(),
            request_id: None,
            title: None, timeout_seconds: None,
            script: script.into(),
            args: json!({}),
        };
        let failing = workflows.launch(launch(
            r#"await agent({stepId: "a", agentRef: "scripted", task: {fail: "the model refused"}}); return 1;"#,
        )).await.expect("launch").row.workflow_id;
        let catching = workflows.launch(launch(
            r#"try { await agent({stepId: "a", agentRef: "oracle", task: "x"}); }
               catch (e) { return e.message; }"#,
        )).await.expect("launch").row.workflow_id;
        wait_for_status(&node, failing.as_str(), "failed").await;
        let error = view(&node, failing.as_str()).await.row.data["error"].as_str().unwrap_or_default().to_owned();
        assert!(error.contains("the model refused"), "{error}");
        wait_for_status(&node, catching.as_str(), "completed").await;
        let result = view(&node, catching.as_str()).await.row.data["result"].clone();
        assert!(result.as_str().is_some_and(|m| m.contains("oracle")), "{result}");
    }
}

/// Stops `node` (a workflow with a child run in flight keeps its lease, as after a crash; any
/// other gives it up at the clean stop), and waits, watching through `survivor`, until the
/// workflow's lease has expired by the database clock.
/// The owner dies; `heir` recovers a workflow whose step's child run `run_id` has no known end:
/// the workflow waits for an operator, still with that one run.
async fn recovery_leaves_the_one_run_to_an_operator(
    owner: TestNode,
    heir: &TestNode,
    id: &str,
    run_id: &str,
) {
    crash_and_wait_for_expiry(owner, heir, id).await;
    heir.node
        .workflows()
        .recover(&store::WorkflowId::new(id))
        .await
        .expect("recover");
    wait_for_status(heir, id, "needs_reconciliation").await;
    let done = view(heir, id).await;
    assert_eq!(
        done.steps[0].encoded()["run_id"].as_str(),
        Some(run_id),
        "recovery admitted a second child run"
    );
}

async fn crash_and_wait_for_expiry(node: TestNode, survivor: &TestNode, id: &str) {
    let store = survivor.node.store();
    // Read after the stop: a renewal just before it would move the expiry past one read earlier.
    node.node.shutdown().await.expect("stop");
    let lease = store
        .read_lease(&store::WorkflowId::new(id))
        .await
        .expect("lease")
        .expect("leased");
    eventually(
        Duration::from_secs(60),
        "the dead owner's lease expired",
        async || {
            store
                .read_lease(&store::WorkflowId::new(id))
                .await
                .ok()
                .flatten()
                .is_some_and(|l| l.epoch == lease.epoch)
                && crate::harness::db_now(&store).await > lease.expires_at
        },
    )
    .await;
}

const RECOVERABLE: &str = r#"
    const first = await agent({stepId: "first", agentRef: "scripted", task: "one"});
    const input = await pause({stepId: "hold"});
    const second = await agent({stepId: "second", agentRef: "scripted", task: "two"});
    return {first: first.output, input, second: second.output, firstRun: first.runId};
"#;

/// Replaces a workflow's stored script behind the engine's back (what a tampered or wrongly
/// migrated row would look like).
async fn edit_stored_script(db: &TestDb, id: &str, script: &str) {
    let changed = db
        .tamper(
            "UPDATE workflows SET data = jsonb_set(data, '{script}', to_jsonb($2::text)) WHERE id = $1",
            "UPDATE workflows SET data = json_set(data, '$.script', ?2) WHERE id = ?1",
            &[id, script],
        )
        .await;
    assert_eq!(changed, 1);
}

on_both_backends! {
    async fn an_unreadable_journal_row_stops_the_replay_and_names_the_row(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None,
            title: None, timeout_seconds: None,
            script: RECOVERABLE.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        wait_for_status(&owner, id.as_str(), "paused").await;
        crash_and_wait_for_expiry(owner, &heir, id.as_str()).await;
        let changed = db
            .tamper(
                "UPDATE workflow_steps SET data = jsonb_set(data, '{outcome}', '42')
                  WHERE workflow = $1 AND step_id = $2",
                "UPDATE workflow_steps SET data = json_set(data, '$.outcome', 42)
                  WHERE workflow = ?1 AND step_id = ?2",
                &[id.as_str(), "first"],
            )
            .await;
        assert_eq!(changed, 1);
        heir.node.workflows().recover(&id).await.expect("recover");
        wait_for_status(&heir, id.as_str(), "needs_reconciliation").await;
        let data = view(&heir, id.as_str()).await.row.data;
        let why = &data["reconciliation"];
        assert_eq!(why["reason"], "journal_unreadable");
        assert_eq!(why["step_id"], "first");
        let message = why["message"].as_str().unwrap_or_default();
        assert!(message.contains("call 0") && message.contains("\"first\""), "{message}");
        // The journal is what it was at the crash, the agent's row read back as `unreadable`
        // (its record cannot be decoded): nothing was run again around it.
        let steps: Vec<(String, &str)> = view(&heir, id.as_str()).await.steps.iter()
            .map(|s| (s.step_id.clone(), s.kind_name())).collect();
        assert_eq!(steps, [("first".to_owned(), "unreadable"), ("hold".to_owned(), "pause")],
            "nothing was run again around the unreadable row");
        // A cancel replays nothing, so it ends the workflow whatever its journal holds.
        heir.node.workflows().cancel(&id, "ada").await.expect("cancel");
        wait_for_status(&heir, id.as_str(), "cancelled").await;
    }
}

on_both_backends! {
    async fn a_replay_that_meets_a_different_call_fails_the_workflow_naming_both_sides(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None,
            title: None, timeout_seconds: None,
            script: RECOVERABLE.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        wait_for_status(&owner, id.as_str(), "paused").await;
        crash_and_wait_for_expiry(owner, &heir, id.as_str()).await;
        edit_stored_script(&db, id.as_str(), &RECOVERABLE.replace(r#"stepId: "first""#, r#"stepId: "renamed""#)).await;
        heir.node.workflows().recover(&id).await.expect("recover");
        wait_for_status(&heir, id.as_str(), "failed").await;
        let error = view(&heir, id.as_str()).await.row.data["error"].as_str().unwrap_or_default().to_owned();
        assert!(error.contains("non-determinism") && error.contains("\"first\"") && error.contains("\"renamed\""),
            "{error}");
        let agents = view(&heir, id.as_str()).await.steps.iter().filter(|s| s.kind_name() == "agent").count();
        assert_eq!(agents, 1, "the diverging call ran nothing");
    }
}

on_both_backends! {
    async fn a_workflow_recovered_on_another_node_replays_without_running_a_step_twice(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        let request = LaunchRequest {
            user_id: "ada".into(),
            request_id: None,
            title: None, timeout_seconds: None,
            script: RECOVERABLE.into(),
            args: json!({}),
        };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        wait_for_status(&owner, id.as_str(), "paused").await;
        let first_run = view(&owner, id.as_str()).await.steps[0].encoded()["run_id"].clone();

        let early = heir.node.workflows().recover(&id).await;
        assert!(matches!(early, Err(actors::Error::LeaseHeld { action: actors::Takeover::Recover })), "{early:?}");

        crash_and_wait_for_expiry(owner, &heir, id.as_str()).await;
        let recovered = heir.node.workflows().recover(&id).await.expect("recover");
        assert_eq!(recovered, id);
        assert_eq!(heir.node.store().read_lease(&id).await.expect("lease").map(|l| l.epoch.get()), Some(2));
        heir.node.workflows().resume(resume(id.as_str(), "hold", json!("go")), "ada").await.expect("resume");
        wait_for_status(&heir, id.as_str(), "completed").await;

        let done = view(&heir, id.as_str()).await;
        assert_eq!(done.row.data["result"]["first"], json!({"echo": "one"}));
        assert_eq!(done.row.data["result"]["second"], json!({"echo": "two"}));
        assert_eq!(done.row.data["result"]["firstRun"], first_run, "the first step ran again");
        assert_eq!(done.steps[0].encoded()["run_id"], first_run);
        assert_eq!(done.row.owner.as_deref().map(|o| o.starts_with("heir")), Some(true));
    }
}

on_both_backends! {
    async fn a_step_whose_child_outcome_is_unknown_sends_the_recovered_workflow_to_reconciliation(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let script = r#"const r = await agent({stepId: "slow", agentRef: "scripted",
                                              task: {hold_while: "hold_model"}}); return r.output;"#;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the child run started", async || {
            view(&owner, id.as_str()).await.steps.first().is_some_and(|s| s.status.as_str() == "running")
        })
        .await;
        let run_id = view(&owner, id.as_str()).await.steps[0].encoded()["run_id"].as_str().expect("run").to_owned();
        recovery_leaves_the_one_run_to_an_operator(owner, &heir, id.as_str(), &run_id).await;
        // The supervisor stops just after the status it wrote became visible.
        eventually(Duration::from_secs(60), "the heir's supervisor stopped", async || {
            heir.node.workflows().live().await.expect("live").is_empty()
        })
        .await;
    }
}

on_both_backends! {
    async fn an_admission_whose_answer_is_lost_is_left_to_recovery_not_failed(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        // The admission commits (with the step's journal entry) and its answer never comes.
        owner.faults.add("admit_run", actors::FaultAction::DropAnswer, 1);
        let script = r#"const r = await agent({stepId: "only", agentRef: "scripted", task: "x"});
                        return r.output;"#;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the supervisor stopped", async || {
            owner.node.workflows().live().await.expect("live").is_empty()
        })
        .await;
        let stopped = view(&owner, id.as_str()).await;
        assert_eq!(stopped.row.status.as_str(), "running", "the step was judged without knowing its outcome");
        let run_id = stopped.steps[0].encoded()["run_id"].as_str().expect("journaled with its run").to_owned();
        recovery_leaves_the_one_run_to_an_operator(owner, &heir, id.as_str(), &run_id).await;
    }
}

on_both_backends! {
    async fn recovery_under_another_runtime_version_is_refused_with_the_lease_untouched(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let scripted = actors::agents::AgentConfig::scripted("scripted");
        let other = TestNode::start_custom(&db, "other", 1_500, shared.path(), &[scripted], |options| {
            options.workflows.limits.frame_bytes_max = 1_000;
        })
        .await;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None,
            title: None, timeout_seconds: None,
            script: RECOVERABLE.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        wait_for_status(&owner, id.as_str(), "paused").await;
        crash_and_wait_for_expiry(owner, &other, id.as_str()).await;
        let before = other.node.store().read_lease(&id).await.expect("lease").expect("leased");
        let refused = other.node.workflows().recover(&id).await;
        assert!(matches!(refused, Err(actors::Error::TakeoverRefused { ref reason }) if reason.contains("runtime")), "{refused:?}");
        let after = other.node.store().read_lease(&id).await.expect("lease").expect("leased");
        assert_eq!(after, before, "a refused recovery touched the lease");
    }
}

on_both_backends! {
    async fn recovery_under_another_agent_configuration_is_refused_and_the_same_one_recovers(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let agents = [
            actors::agents::AgentConfig::scripted("scripted"),
            actors::agents::AgentConfig::scripted("added"),
        ];
        let reconfigured = TestNode::start_with(&db, "reconfigured", 1_500, shared.path(), &agents).await;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None,
            title: None, timeout_seconds: None,
            script: RECOVERABLE.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        wait_for_status(&owner, id.as_str(), "paused").await;
        let recorded = view(&owner, id.as_str()).await.row.data["configuration_version"].clone();
        assert!(recorded.as_str().is_some_and(|v| !v.is_empty()), "launch records the configuration: {recorded}");
        crash_and_wait_for_expiry(owner, &reconfigured, id.as_str()).await;
        let before = reconfigured.node.store().read_lease(&id).await.expect("lease").expect("leased");
        let refused = reconfigured.node.workflows().recover(&id).await;
        assert!(matches!(refused, Err(actors::Error::TakeoverRefused { ref reason }) if reason.contains("configuration")), "{refused:?}");
        let after = reconfigured.node.store().read_lease(&id).await.expect("lease").expect("leased");
        assert_eq!(after, before, "a refused recovery touched the lease");
        let same = TestNode::start(&db, "same", 1_500, shared.path()).await;
        same.node.workflows().recover(&id).await.expect("the same configuration recovers");
        let recovered = same.node.store().read_lease(&id).await.expect("lease").expect("leased");
        assert_eq!(recovered.epoch, before.epoch.next());
    }
}

on_both_backends! {
    async fn cancel_interrupts_the_child_runs_then_cancels_and_a_terminal_workflow_can_be_deleted(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 1_500, shared.path()).await;
        let workflows = node.node.workflows();
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let script = r#"await agent({stepId: "slow", agentRef: "scripted", task: {hold_while: "hold_model"}});
                        return "never";"#;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
        let id = workflows.launch(request).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the child run started", async || {
            view(&node, id.as_str()).await.steps.first().is_some_and(|s| s.status.as_str() == "running")
        })
        .await;
        let run_id = view(&node, id.as_str()).await.steps[0].encoded()["run_id"].as_str().expect("run").to_owned();
        let busy = workflows.delete(&id).await.expect("delete");
        assert_eq!(busy, store::Deletion::NotTerminal, "a live workflow was deleted");

        assert!(matches!(workflows.cancel(&id, "ada").await.expect("cancel"), ControlWrite::Recorded(_)));
        assert!(matches!(workflows.cancel(&id, "ada").await.expect("again"), ControlWrite::Repeated(_)));
        wait_for_status(&node, id.as_str(), "cancelled").await;
        let run = node.node.runs().get(&store::RunId::new(run_id)).await.expect("read").expect("run");
        assert_eq!(run.status, store::RunStatus::Interrupted);
        let done = view(&node, id.as_str()).await;
        assert_eq!(done.steps[0].status.as_str(), "cancelled");
        assert!(done.controls.iter().all(|c| c.applied));
        assert_eq!(node.node.store().health().await.map(|h| h.schema_current).ok(), Some(true));

        assert_eq!(workflows.delete(&id).await.expect("delete"), store::Deletion::Deleted);
        assert!(workflows.get(&id, 1, 1).await.expect("get").is_none());
        assert_eq!(node.node.store().read_lease(&id).await.expect("lease"), None);
        assert_eq!(workflows.delete(&id).await.expect("delete"), store::Deletion::NotFound);
    }
}

on_both_backends! {
    async fn a_paused_workflow_cancels_at_once_and_listing_is_per_user_and_paged(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 1_500, shared.path()).await;
        let workflows = node.node.workflows();
        let launch = |user: &str| LaunchRequest {
            user_id: user.into(),
            request_id: None,
            title: None, timeout_seconds: None,
            script: r#"await pause({stepId: "p"}); return 1;"#.into(),
            args: json!({}),
        };
        let mut ada = Vec::new();
        for _ in 0..3 {
            ada.push(workflows.launch(launch("ada")).await.expect("launch").row.workflow_id);
        }
        let bob = workflows.launch(launch("bob")).await.expect("launch").row.workflow_id;
        wait_for_status(&node, ada[0].as_str(), "paused").await;
        workflows.cancel(&ada[0], "ada").await.expect("cancel");
        wait_for_status(&node, ada[0].as_str(), "cancelled").await;

        let filter = |after: Option<store::ListCursor>| store::ListFilter {
            user_id: Some("ada".into()), status: None, waiting_for: None, request_id: None, after,
            limit: 2,
        };
        let first = workflows.list(filter(None)).await.expect("list");
        let cursor = first.last().map(|w| store::ListCursor {
            created_at: w.row.created_at, workflow_id: w.row.workflow_id.clone() });
        let second = workflows.list(filter(cursor)).await.expect("list");
        let listed: Vec<store::WorkflowId> = first.iter().chain(&second).map(|w| w.row.workflow_id.clone()).collect();
        // Pages follow (created_at, id); launches within one clock tick may come in any order.
        let (mut sorted, mut expected) = (listed.clone(), ada.clone());
        sorted.sort();
        expected.sort();
        assert_eq!((first.len(), sorted), (2, expected), "two pages covering exactly ada's, no repeats");
        assert!(!listed.contains(&bob));
        let cancelled = workflows.list(store::ListFilter {
            status: Some(store::StatusFilter::Stored(store::WorkflowStatus::Cancelled)), limit: 10,
            ..Default::default() }).await.expect("list");
        assert_eq!(cancelled.iter().map(|w| w.row.workflow_id.as_str()).collect::<Vec<_>>(), vec![ada[0].as_str()]);
    }
}

on_both_backends! {
    async fn an_operator_reconciles_an_uncertain_step_by_retry_or_by_completing_it(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let script = r#"const r = await agent({stepId: "slow", agentRef: "scripted",
                                              task: {hold_while: "hold_model", output: "done"}});
                        return {output: r.output, run: r.runId};"#;
        let launch = |workflows: actors::WorkflowsHandle| async move {
            let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
            workflows.launch(request).await.expect("launch").row.workflow_id
        };
        let retried = launch(owner.node.workflows()).await;
        let completed = launch(owner.node.workflows()).await;
        for id in [&retried, &completed] {
            eventually(Duration::from_secs(60), "the child run started", async || {
                view(&owner, id.as_str()).await.steps.first().is_some_and(|s| s.status.as_str() == "running")
            })
            .await;
        }
        let first_run = view(&owner, retried.as_str()).await.steps[0].encoded()["run_id"].clone();
        crash_and_wait_for_expiry(owner, &heir, retried.as_str()).await;
        for id in [&retried, &completed] {
            heir.node.workflows().recover(id).await.expect("recover");
            wait_for_status(&heir, id.as_str(), "needs_reconciliation").await;
        }
        let again = heir.node.workflows().recover(&retried).await;
        assert!(matches!(again, Err(actors::Error::TakeoverRefused { ref reason }) if reason.contains("reconcil")), "{again:?}");

        std::fs::remove_file(shared.path().join("faults/hold_model")).expect("release");
        let request = |id: &str, resolution| actors::ReconcileRequest {
            workflow_id: store::WorkflowId::new(id),
            step_id: "slow".into(),
            resolution,
            reason: "checked the agent's effects".into(),
            by: "root".into(),
        };
        heir.node.workflows().reconcile(request(retried.as_str(), actors::Resolution::Retry)).await.expect("retry");
        heir.node.workflows()
            .reconcile(request(completed.as_str(), actors::Resolution::Complete(json!("by hand")))).await.expect("complete");

        wait_for_status(&heir, retried.as_str(), "completed").await;
        wait_for_status(&heir, completed.as_str(), "completed").await;

        let done = view(&heir, retried.as_str()).await;
        let attempts: Vec<(i32, String)> = done.steps.iter().map(|s| (s.attempt, s.status.as_str().to_owned())).collect();
        assert_eq!(attempts, vec![(1, "cancelled".to_owned()), (2, "completed".to_owned())],
            "the old attempt stays on record beside the new one, closed");
        assert_eq!(done.row.data["result"]["output"], json!("done"));
        assert_ne!(done.row.data["result"]["run"], first_run, "the retry is a new child run");
        assert_eq!(done.steps[0].encoded()["run_id"], first_run, "the old child run stays on record");

        let settled = view(&heir, completed.as_str()).await;
        assert_eq!(settled.row.data["result"]["output"], json!("by hand"));
        assert_eq!(settled.steps[0].encoded()["reconciled"]["by"], "root");
        let not_now = heir.node.workflows().reconcile(request(completed.as_str(), actors::Resolution::Fail)).await;
        assert!(matches!(not_now, Err(actors::Error::NotLive { action: actors::Takeover::Reconcile, .. })), "{not_now:?}");
    }
}

on_both_backends! {
    async fn a_workflow_past_its_timeout_is_cancelled_with_reason_timeout(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let scripted = actors::agents::AgentConfig::scripted("scripted");
        let node = TestNode::start_custom(&db, "a", 1_500, shared.path(), &[scripted], |options| {
            options.workflows.timeout_seconds = 1;
        })
        .await;
        let request = LaunchRequest {
            user_id: "ada".into(),
            request_id: None,
            title: None, timeout_seconds: None,
            script: r#"await pause({stepId: "forever"}); return 1;"#.into(),
            args: json!({}),
        };
        let id = node.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        wait_for_status(&node, id.as_str(), "cancelled").await;
        let done = view(&node, id.as_str()).await;
        let cancel = done.controls.iter().find(|c| c.kind == store::ControlKind::Cancel).expect("a cancel control");
        assert_eq!((cancel.body["reason"].as_str(), cancel.applied), (Some("timeout"), true));
    }
}

on_both_backends! {
    async fn children_beyond_max_active_children_queue_and_run_when_a_slot_frees(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let scripted = actors::agents::AgentConfig::scripted("scripted");
        let node = TestNode::start_custom(&db, "a", 3_000, shared.path(), &[scripted], |options| {
            options.workflows.slots_max = 4;
            options.workflows.slots_per_user_max = 4;
            options.workflows.launch_limits = store::LaunchLimits {
                max_workflows: 100,
                max_workflows_per_owner: 4,
            };
        })
        .await;
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let script = r#"
            const [a, b] = await parallel([
                () => agent({stepId: "a", agentRef: "scripted", task: {hold_while: "hold_model", output: 1}}),
                () => agent({stepId: "b", agentRef: "scripted", task: {hold_while: "hold_model", output: 2}}),
            ]);
            return a.output + b.output;"#;
        let workflows = node.node.workflows();
        let mut ids = Vec::new();
        for _ in 0..3 {
            let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
            ids.push(workflows.launch(request).await.expect("launch").row.workflow_id);
        }
        let statuses = async || {
            let mut all = Vec::new();
            for id in &ids {
                all.extend(view(&node, id.as_str()).await.steps.into_iter().map(|s| s.status));
            }
            all
        };
        eventually(Duration::from_secs(60), "four children run and two queue", async || {
            let all = statuses().await;
            all.iter().filter(|s| **s == store::StepStatus::Running).count() == 4
                && all.iter().filter(|s| **s == store::StepStatus::Queued).count() == 2
        })
        .await;
        // A sequential call is journaled by its admission; with no slot free it is journaled
        // queued by itself, with the outcome before it, and admitted later.
        let sequential = LaunchRequest { user_id: "bob".into(), request_id: None, title: None, timeout_seconds: None, args: json!({}),
            script: r#"
                const first = await agent({stepId: "first", agentRef: "scripted", task: {output: 10}});
                const second = await agent({stepId: "second", agentRef: "scripted", task: {output: 20}});
                return first.output + second.output;"#.into() };
        let bob = workflows.launch(sequential).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the sequential call queues", async || {
            view(&node, bob.as_str()).await.steps.iter().any(|s| s.step_id == "first" && s.status.as_str() == "queued")
        })
        .await;
        // Over the per-owner limit while those three are live: two more launches, one refused.
        let mut refused = 0;
        for _ in 0..2 {
            let request = LaunchRequest { user_id: "ada".into(), request_id: None,
                title: None, timeout_seconds: None,
                script: r#"await pause({stepId: "p"}); return 0;"#.into(), args: json!({}) };
            match workflows.launch(request).await {
                Ok(_) => {}
                Err(actors::Error::LimitReached { limit: store::Limit::WorkflowsPerOwner, max: 4 }) => refused += 1,
                Err(other) => panic!("{other:?}"),
            }
        }
        assert_eq!(refused, 1, "exactly max_workflows_per_owner live workflows are accepted");

        std::fs::remove_file(shared.path().join("faults/hold_model")).expect("release");
        for id in &ids {
            wait_for_status(&node, id.as_str(), "completed").await;
            assert_eq!(view(&node, id.as_str()).await.row.data["result"], json!(3));
        }
        wait_for_status(&node, bob.as_str(), "completed").await;
        let done = view(&node, bob.as_str()).await;
        assert_eq!(done.row.data["result"], json!(30));
        let steps: Vec<_> = done.steps.iter()
            .map(|s| (s.step_id.as_str(), s.status.as_str(), s.encoded()["run_id"].is_string()))
            .collect();
        assert_eq!(steps, [("first", "completed", true), ("second", "completed", true)]);
    }
}

on_both_backends! {
    async fn bad_arguments_to_the_script_api_reject_with_clear_messages(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let node = TestNode::start(&db, "a", 3_000, shared.path()).await;
        let script = r#"
            const errors = [];
            const attempt = async (call) => { try { await call(); } catch (e) { errors.push(e.message); } };
            await attempt(() => agent({agentRef: "scripted", task: "x"}));
            await attempt(() => agent({stepId: "a", agentRef: "oracle", task: "x"}));
            await agent({stepId: "b", agentRef: "scripted", task: "x"});
            await attempt(() => agent({stepId: "b", agentRef: "scripted", task: "again"}));
            await attempt(() => readArtifact({artifactVersion: 99}));
            await attempt(() => humanCheckpoint({stepId: "h", sourceStepId: "b"}));
            await attempt(() => captureArtifact({stepId: "c", sourceStepId: "b", path: "/etc/passwd"}));
            await attempt(() => captureArtifact({stepId: "d", sourceStepId: "b", path: "missing.txt"}));
            return errors;
        "#;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
        let id = node.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        wait_for_status(&node, id.as_str(), "completed").await;
        let errors = view(&node, id.as_str()).await.row.data["result"].clone();
        let errors: Vec<String> = serde_json::from_value(errors).expect("messages");
        assert_eq!(errors.len(), 7, "{errors:?}");
        for (message, expected) in errors.iter().zip([
            "needs a stepId",
            "unknown agent \"oracle\"",
            "stepId \"b\" is used twice",
            "artifact version 99 does not exist",
            "needs an artifactVersion",
            "outside /mnt/user-data/",
            "cannot capture \"missing.txt\"",
        ]) {
            assert!(message.contains(expected), "{message:?} does not say {expected:?}");
        }
    }
}

on_both_backends! {
    async fn a_cancel_asked_after_the_owner_died_is_finished_by_another_node_without_replay(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        // The heir runs another runtime version: a cancellation replays nothing, so it may finish it.
        let scripted = actors::agents::AgentConfig::scripted("scripted");
        let heir = TestNode::start_custom(&db, "heir", 1_500, shared.path(), &[scripted], |options| {
            options.workflows.limits.frame_bytes_max = 1_000;
        })
        .await;
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let script = r#"await agent({stepId: "slow", agentRef: "scripted", task: {hold_while: "hold_model"}});
                        return "never";"#;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the child run started", async || {
            view(&owner, id.as_str()).await.steps.first().is_some_and(|s| s.status.as_str() == "running")
        })
        .await;
        let run_id = view(&owner, id.as_str()).await.steps[0].encoded()["run_id"].as_str().expect("run").to_owned();
        crash_and_wait_for_expiry(owner, &heir, id.as_str()).await;

        let refused = heir.node.workflows().recover(&id).await;
        assert!(matches!(refused, Err(actors::Error::TakeoverRefused { ref reason }) if reason.contains("runtime")), "{refused:?}");
        heir.node.workflows().cancel(&id, "ada").await.expect("cancel");
        wait_for_status(&heir, id.as_str(), "cancelled").await;
        let done = view(&heir, id.as_str()).await;
        assert_eq!(done.steps.len(), 1, "the body ran again");
        assert_eq!(done.steps[0].status.as_str(), "cancelled");
        assert!(done.controls.iter().all(|c| c.applied));
        let run = heir.node.runs().get(&store::RunId::new(run_id)).await.expect("read").expect("run");
        assert!(run.status.is_final(), "{run:?}");
    }
}

on_both_backends! {
    async fn a_recover_held_in_the_store_delays_no_launch_and_refuses_a_second_recover(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let owner = TestNode::start(&db, "owner", 1_500, shared.path()).await;
        let heir = TestNode::start(&db, "heir", 1_500, shared.path()).await;
        let request = |script: &str| LaunchRequest { user_id: "ada".into(), request_id: None,
            title: None, timeout_seconds: None,
            script: script.into(), args: json!({}) };
        let id = owner.node.workflows().launch(request(RECOVERABLE)).await.expect("launch").row.workflow_id;
        wait_for_status(&owner, id.as_str(), "paused").await;
        crash_and_wait_for_expiry(owner, &heir, id.as_str()).await;

        // The recover's read of the workflow it has taken over waits in the store until released.
        let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        heir.faults.add("read_workflow", FaultAction::HoldBefore {
            reached: Arc::clone(&reached),
            release: Arc::clone(&release),
        }, 1);
        let workflows = heir.node.workflows();
        let recovering = tokio::spawn({
            let (workflows, id) = (workflows.clone(), id.clone());
            async move { workflows.recover(&id).await }
        });
        tokio::time::timeout(Duration::from_secs(60), reached.notified()).await.expect("the recover reads");
        let launched = workflows.launch(request("return 1;")).await.expect("a launch while the recover waits");
        wait_for_status(&heir, launched.row.workflow_id.as_str(), "completed").await;
        // A second recover of it on this node is refused at once: one takeover at a time, so
        // never two supervisors of one workflow on a node.
        let again = workflows.recover(&id).await;
        assert!(matches!(again, Err(actors::Error::Supervised { ref workflow_id }) if *workflow_id == id), "{again:?}");
        assert!(!recovering.is_finished(), "the recover ended before its read was released");

        release.notify_one();
        recovering.await.expect("join").expect("recover");
        workflows.resume(resume(id.as_str(), "hold", json!("go")), "ada").await.expect("resume");
        wait_for_status(&heir, id.as_str(), "completed").await;
    }
}

on_both_backends! {
    async fn a_cancel_asks_every_child_run_to_stop_at_once(db: TestDb) {
        let shared = tempfile::tempdir().expect("temp dir");
        let scripted = actors::agents::AgentConfig::scripted("scripted");
        // A held store call gives up after the call timeout: longer than this test waits, so a
        // cancel request that waits for another one's answer never reaches the store in time.
        let node = TestNode::start_custom(&db, "a", 1_500, shared.path(), &[scripted], |options| {
            options.call_timeout = Duration::from_secs(120);
        })
        .await;
        let workflows = node.node.workflows();
        std::fs::write(shared.path().join("faults/hold_model"), b"").expect("hold");
        let script = r#"await parallel(["a", "b", "c"].map((stepId) => () =>
                            agent({stepId, agentRef: "scripted", task: {hold_while: "hold_model"}})));
                        return "never";"#;
        let request = LaunchRequest { user_id: "ada".into(), request_id: None, title: None, timeout_seconds: None, script: script.into(), args: json!({}) };
        let id = workflows.launch(request).await.expect("launch").row.workflow_id;
        eventually(Duration::from_secs(60), "the three child runs started", async || {
            let steps = view(&node, id.as_str()).await.steps;
            steps.len() == 3 && steps.iter().all(|s| s.status.as_str() == "running")
        })
        .await;
        let mut held = Vec::new();
        for step in view(&node, id.as_str()).await.steps {
            let run_id = step.encoded()["run_id"].as_str().expect("run").to_owned();
            let (reached, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
            node.faults.add_for("request_run_cancel", &run_id, FaultAction::HoldBefore {
                reached: Arc::clone(&reached),
                release: Arc::clone(&release),
            }, 1);
            held.push((run_id, reached, release));
        }

        workflows.cancel(&id, "ada").await.expect("cancel");
        for (run_id, reached, _) in &held {
            tokio::time::timeout(Duration::from_secs(30), reached.notified())
                .await
                .unwrap_or_else(|_| panic!("the cancel request of {run_id} waited for another one's answer"));
        }
        for (_, _, release) in &held {
            release.notify_one();
        }
        wait_for_status(&node, id.as_str(), "cancelled").await;
    }
}
