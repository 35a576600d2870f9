//! The compare-and-set rules of child runs: admission (idempotency, one active
//! run per thread, slots), terminal commit authority, durable cancellation, approval answers and
//! orphan claims.

use std::sync::Arc;

use serde_json::{Value, json};
use store::{
    Admission, CancelAction, Error, NewRun, RunId, RunOutcome, RunSlot, RunStatus, StepStatus,
    WorkflowStep, WriteOp,
};
use tokio::sync::Barrier;

use crate::harness::{Subject, conformance, workflow, workflow_of};
use store::Lease;

/// A run of `agent` on `thread`, owned by `owner`.
pub fn new_run(run_id: &str, thread: &str, owner: &str) -> NewRun {
    NewRun {
        run_id: store::RunId::new(run_id),
        thread_id: thread.to_owned(),
        agent: "echo".into(),
        owner: owner.to_owned(),
        lease_ms: 60_000,
        idempotency: None,
        metadata: json!({}),
        step: None,
    }
}

fn outcome(status: RunStatus) -> RunOutcome {
    RunOutcome {
        status,
        error: None,
        output: Some(json!({"done": true})),
        stop_reason: None,
        total_tokens: 0,
        message_count: 0,
        failure: None,
    }
}

async fn admitted<S: Subject>(store: &S, run: NewRun) -> store::RunRow {
    match store.admit_run(run).await.expect("admit") {
        Admission::Admitted(row) => row,
        other => panic!("not admitted: {other:?}"),
    }
}

fn approve() -> Value {
    json!({"decision": "approve", "by": "ada"})
}

/// The metadata of a run once `request_id` was answered with [`approve`].
fn answered_metadata(request_id: &str) -> Value {
    json!({"retained": true, "hitl_answer": {"request_id": request_id, "answer": approve()}})
}

fn paused_metadata(request_id: &str) -> Value {
    json!({
        "hitl_approval": {
            "request_id": request_id,
            "actions": [{"tool_call_id": "call-1", "request_id": request_id}],
        },
        "retained": true,
    })
}

/// A run on `thread` paused for approval `request_id`.
async fn paused<S: Subject>(store: &S, run_id: &str, thread: &str, request_id: &str) {
    let run = NewRun {
        metadata: paused_metadata(request_id),
        ..new_run(run_id, thread, "node-a")
    };
    admitted(store, run).await;
    assert!(
        store
            .update_run_status(
                &store::RunId::new(run_id),
                "node-a",
                RunStatus::WaitingForInput,
                None
            )
            .await
            .expect("pause")
    );
}

conformance! {
    // Found by the simulation (seed 7072933 of the scarce-slot mix with every fault): a
    // workflow's end asked its live runs to stop, then a scripted agent's run asked a person and
    // was recorded waiting; nobody ends such a run, and it outlived its cancelled workflow.
    async fn a_run_asked_to_stop_never_starts_waiting_for_a_person(db) {
        let store = db.store().await;
        admitted(&*store, new_run("run-1", "thread-1", "node-a")).await;
        let run_id = store::RunId::from("run-1");
        assert_eq!(store.request_run_cancel(&run_id, CancelAction::Interrupt).await.expect("cancel"),
            Some(CancelAction::Interrupt));
        let asked = store.update_run_status(&run_id, "node-a", RunStatus::WaitingForInput,
            Some(paused_metadata("q-1"))).await.expect("ask");
        assert!(!asked, "a run asked to stop was recorded waiting for a person");
        let row = store.read_run(&run_id).await.expect("read").expect("run");
        assert_eq!((row.status, row.cancel_action), (RunStatus::Running, Some(CancelAction::Interrupt)));
        // Its other moves are untouched: it may still say it runs.
        assert!(store.update_run_status(&run_id, "node-a", RunStatus::Running, None).await.expect("run"));
    }
}

conformance! {
    // A failed run keeps what its failure says about a retry beside its metadata, written by
    // the same compare-and-set as its end; a run's other metadata is kept.
    async fn a_failed_runs_retry_hint_is_kept_in_its_metadata(db) {
        let store = db.store().await;
        admitted(&*store, new_run("run-1", "thread-1", "node-a")).await;
        let run_id = store::RunId::from("run-1");
        assert!(store.update_run_status(&run_id, "node-a", RunStatus::Running,
            Some(json!({"kept": 1}))).await.expect("metadata"));
        let failure = store::RunFailure {
            class: store::FailureClass::Timeout,
            code: Some("idle_timeout".into()),
            retryable: Some(true),
            retry_after_ms: Some(1_500),
        };
        let failed = store::RunOutcome {
            error: Some("silent for 1000 ms".into()),
            failure: Some(failure.clone()),
            ..outcome(RunStatus::Error)
        };
        assert!(store.finalize_run(&run_id, "node-a", &failed, true).await.expect("finalize"));
        let row = store.read_run(&run_id).await.expect("read").expect("run");
        assert_eq!(store::RunFailure::of(&row.metadata), Some(failure));
        assert_eq!(row.metadata["kept"], 1);
        // An end without one leaves the metadata as it was.
        admitted(&*store, new_run("run-2", "thread-2", "node-a")).await;
        let other = store::RunId::from("run-2");
        assert!(store.finalize_run(&other, "node-a", &outcome(RunStatus::Error), true).await.expect("finalize"));
        let row = store.read_run(&other).await.expect("read").expect("run");
        assert_eq!(store::RunFailure::of(&row.metadata), None);
    }
}

conformance! {
    async fn admission_is_idempotent_per_key_and_keeps_one_active_run_per_thread(db) {
        let store = db.store().await;
        let keyed = |run_id: &str, request: Value| NewRun {
            idempotency: Some(("key-1".into(), request)),
            ..new_run(run_id, "thread-1", "node-a")
        };
        let first = admitted(&*store, keyed("run-1", json!({"task": "a"}))).await;
        assert_eq!((first.status, first.owner_worker_id.as_deref()), (RunStatus::Running, Some("node-a")));
        assert_eq!(first.idempotency_request, Some(json!({"task": "a"})));

        match store.admit_run(keyed("run-2", json!({"task": "a"}))).await.expect("replay") {
            Admission::Existing(row) => assert_eq!(row.run_id, "run-1"),
            other => panic!("the same request made {other:?}"),
        }
        let reused = store.admit_run(keyed("run-3", json!({"task": "b"}))).await;
        assert!(matches!(reused, Err(Error::Conflict(_))), "{reused:?}");
        let busy = store.admit_run(new_run("run-4", "thread-1", "node-a")).await;
        assert!(matches!(busy, Err(Error::Conflict(ref m)) if m.contains("thread-1")), "{busy:?}");
        for absent in ["run-2", "run-3", "run-4"] {
            assert_eq!(store.read_run(&store::RunId::new(absent)).await.expect("read"), None, "{absent} was written");
        }

        assert!(store.finalize_run(&store::RunId::from("run-1"), "node-a", &outcome(RunStatus::Success), true).await.expect("finalize"));
        admitted(&*store, new_run("run-5", "thread-1", "node-a")).await;
    }
}

conformance! {
    /// A step's admission carries the release of the slot of the workflow's step before: that
    /// slot is free for it. Claimed before the release was applied, it was still counted, and
    /// with as many workflows as slots every other admission was refused and queued.
    async fn a_workflows_next_step_takes_the_slot_its_admission_releases(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let step = |step_id: &str, journal: Vec<store::WriteOp>| WorkflowStep {
            workflow_id: "wf".into(),
            step_id: step_id.to_owned(),
            attempt: 1,
            slots_max: 1,
            slots_per_user_max: 1,
            slots_reserved: 0,
            fence: lease.fence(),
            journal,
        };
        let first = NewRun { step: Some(step("s1", Vec::new())), ..new_run("run-1", "t-1", "node-a") };
        admitted(&*store, first).await;
        let release = store::WriteOp::ReleaseSlot { workflow_id: "wf".into(), step_id: "s1".into() };
        let next = NewRun { step: Some(step("s2", vec![release])), ..new_run("run-2", "t-2", "node-a") };
        admitted(&*store, next).await;
        assert_eq!(store.count_slots().await.expect("slots"), 1);
        // Without a release the only slot is still taken.
        let third = NewRun { step: Some(step("s3", Vec::new())), ..new_run("run-3", "t-3", "node-a") };
        assert_eq!(store.admit_run(third).await.expect("admit"), Admission::Queued);
        assert_eq!(store.count_slots().await.expect("slots"), 1);
    }
}

/// The admission of step `step_id` of the workflow `lease` holds, with `slots_max` slots in the
/// cluster and a share of `share`, carrying `journal`.
fn step_of(
    lease: &Lease,
    step_id: &str,
    slots_max: u64,
    share: u64,
    journal: Vec<WriteOp>,
) -> NewRun {
    reserving_step_of(lease, step_id, [slots_max, share, 0], journal)
}

/// The admission of step `step_id` of the workflow `lease` holds, under `[slots_max, share,
/// reserved]`, carrying `journal`.
fn reserving_step_of(
    lease: &Lease,
    step_id: &str,
    [slots_max, share, reserved]: [u64; 3],
    journal: Vec<WriteOp>,
) -> NewRun {
    let workflow_id = lease.fence().resource_id;
    NewRun {
        step: Some(WorkflowStep {
            workflow_id: workflow_id.clone(),
            step_id: step_id.to_owned(),
            attempt: 1,
            slots_max,
            slots_per_user_max: share,
            slots_reserved: reserved,
            fence: lease.fence(),
            journal,
        }),
        ..new_run(
            &format!("run-{workflow_id}-{step_id}"),
            &format!("t-{workflow_id}-{step_id}"),
            "node-a",
        )
    }
}

/// The journal entry of step `step_id` of the workflow `lease` holds, as `status`.
fn entry(lease: &Lease, step_id: &str, status: StepStatus) -> WriteOp {
    WriteOp::PutStep {
        workflow_id: lease.fence().resource_id,
        seq: 0,
        step_id: step_id.to_owned(),
        attempt: 1,
        status,
        record: store::StepRecord::new(store::StepKind::Agent, json!({})),
    }
}

/// Gives back the slot of step `step_id` of the workflow `lease` holds.
fn release(lease: &Lease, step_id: &str) -> WriteOp {
    WriteOp::ReleaseSlot {
        workflow_id: lease.fence().resource_id,
        step_id: step_id.into(),
    }
}

conformance! {
    /// A user's share binds only while another user waits below theirs: alone, Ann's steps take
    /// every slot; once Bob's step is queued, Ann (over her share) is queued with a slot free,
    /// and Bob's step takes it. A waiting user over the share, or one whose workflow's lease
    /// lapsed (nobody asks for its step), binds nobody. Before, the share bound always: Ann's
    /// third step waited with two slots free and nobody else waiting.
    async fn a_users_share_binds_only_while_another_user_waits_below_theirs(db) {
        let store = db.store().await;
        let ann_1 = workflow_of(&*store, "wf-ann-1", "ann", "node-a", 60_000).await;
        let ann_2 = workflow_of(&*store, "wf-ann-2", "ann", "node-a", 60_000).await;
        let bob = workflow_of(&*store, "wf-bob", "bob", "node-a", 60_000).await;
        let step = |lease: &Lease, step_id: &str| step_of(lease, step_id, 4, 2, Vec::new());
        // Alone, Ann's steps in two workflows take all four slots, twice her share.
        for (lease, step_id) in [(&ann_1, "s1"), (&ann_2, "s1"), (&ann_1, "s2"), (&ann_2, "s2")] {
            admitted(&*store, step(lease, step_id)).await;
        }
        assert_eq!(store.count_slots().await.expect("slots"), 4);
        // Bob's step finds the cluster full: it waits, journaled `queued` as the workflow does.
        let bobs = step_of(&bob, "b1", 4, 2, vec![entry(&bob, "b1", StepStatus::Running)]);
        assert_eq!(store.admit_run(bobs.clone()).await.expect("admit"), Admission::Queued);
        store.fenced_write(&bob.fence(), vec![entry(&bob, "b1", StepStatus::Queued)]).await.expect("queued");
        // A slot of Ann's frees: she holds three, over her share, while Bob waits with none.
        store.fenced_write(&ann_1.fence(), vec![release(&ann_1, "s1")]).await.expect("release");
        let anns = step(&ann_1, "s3");
        assert_eq!(store.admit_run(anns.clone()).await.expect("admit"), Admission::Queued);
        assert_eq!(store.read_run(&RunId::from("run-wf-ann-1-s3")).await.expect("read"), None);
        assert_eq!(store.count_slots().await.expect("slots"), 3);
        // The free slot is Bob's; his admission journals his step running.
        admitted(&*store, bobs).await;
        assert_eq!(store.count_slots().await.expect("slots"), 4);
        // Nobody waits any more: Ann's step takes the next free slot, over her share.
        store.fenced_write(&ann_2.fence(), vec![release(&ann_2, "s1")]).await.expect("release");
        admitted(&*store, anns).await;
        assert_eq!(store.count_slots().await.expect("slots"), 4);

        // Bob at his share with a step queued does not bind Ann at hers: a slot of five is free.
        store.fenced_write(&ann_1.fence(), vec![release(&ann_1, "s2")]).await.expect("release");
        admitted(&*store, step_of(&bob, "b2", 5, 2, Vec::new())).await;
        store.fenced_write(&bob.fence(), vec![entry(&bob, "b3", StepStatus::Queued)]).await.expect("queued");
        admitted(&*store, step_of(&ann_1, "s4", 5, 2, Vec::new())).await;
        assert_eq!(store.count_slots().await.expect("slots"), 5);

        // Cid's queued step binds Ann while his workflow's lease holds, not once it lapsed.
        let cid = workflow_of(&*store, "wf-cid", "cid", "node-a", 60_000).await;
        store.fenced_write(&cid.fence(), vec![entry(&cid, "c1", StepStatus::Queued)]).await.expect("queued");
        let anns = step_of(&ann_2, "s5", 8, 2, Vec::new());
        assert_eq!(store.admit_run(anns.clone()).await.expect("admit"), Admission::Queued);
        assert!(store.release_lease(&cid.fence()).await.expect("release the lease"));
        admitted(&*store, anns).await;
        assert_eq!(store.count_slots().await.expect("slots"), 6);
    }
}

conformance! {
    /// The slots kept for others: a user who holds their share takes a slot only while
    /// `slots_reserved` stay free beyond it, whether or not anybody waits, and a user below
    /// their share takes a kept one. Before, alone, Ann's steps took every slot, and Bob's first
    /// step waited for one of her agents to end.
    async fn a_user_over_their_share_leaves_the_reserved_slots_to_others(db) {
        let store = db.store().await;
        let ann = workflow_of(&*store, "wf-ann", "ann", "node-a", 60_000).await;
        let bob = workflow_of(&*store, "wf-bob", "bob", "node-a", 60_000).await;
        // Four slots, a share of two, one kept: alone, Ann takes three (the third leaves exactly
        // the one kept free), and her fourth waits with nobody else waiting.
        let rules = [4, 2, 1];
        for step_id in ["s1", "s2", "s3"] {
            admitted(&*store, reserving_step_of(&ann, step_id, rules, Vec::new())).await;
        }
        let fourth = reserving_step_of(&ann, "s4", rules, Vec::new());
        assert_eq!(store.admit_run(fourth).await.expect("admit"), Admission::Queued);
        assert_eq!(store.read_run(&RunId::from("run-wf-ann-s4")).await.expect("read"), None);
        assert_eq!(store.count_slots().await.expect("slots"), 3);
        // Carrying the release of her own slot, her step leaves one free: admitted.
        admitted(&*store, reserving_step_of(&ann, "s4", rules, vec![release(&ann, "s3")])).await;
        assert_eq!(store.count_slots().await.expect("slots"), 3);
        // Bob, below his share, takes the kept slot at once.
        admitted(&*store, reserving_step_of(&bob, "b1", rules, Vec::new())).await;
        assert_eq!(store.count_slots().await.expect("slots"), 4);

        // Two kept of six: Bob, below his share, takes kept slots; Ann at hers does not.
        let rules = [6, 2, 2];
        let anns = reserving_step_of(&ann, "s5", rules, Vec::new());
        assert_eq!(store.admit_run(anns).await.expect("admit"), Admission::Queued);
        admitted(&*store, reserving_step_of(&bob, "b2", rules, Vec::new())).await;
        assert_eq!(store.count_slots().await.expect("slots"), 5);
        // With the share off (every slot), the reserve binds nobody.
        admitted(&*store, reserving_step_of(&ann, "s5", [6, 6, 2], Vec::new())).await;
        assert_eq!(store.count_slots().await.expect("slots"), 6);
    }
}

conformance! {
    /// A step of Ann's that gives back her own slot in its admission keeps her place under the
    /// share while another user waits: the slot it releases is not counted as hers.
    async fn a_step_carrying_the_release_of_its_users_slot_keeps_their_place_under_the_share(db) {
        let store = db.store().await;
        let ann = workflow_of(&*store, "wf-ann", "ann", "node-a", 60_000).await;
        let bob = workflow_of(&*store, "wf-bob", "bob", "node-a", 60_000).await;
        admitted(&*store, step_of(&ann, "s1", 4, 1, Vec::new())).await;
        store.fenced_write(&bob.fence(), vec![entry(&bob, "b1", StepStatus::Queued)]).await.expect("queued");
        assert_eq!(store.admit_run(step_of(&ann, "s2", 4, 1, Vec::new())).await.expect("admit"), Admission::Queued);
        admitted(&*store, step_of(&ann, "s2", 4, 1, vec![release(&ann, "s1")])).await;
        assert_eq!(store.count_slots().await.expect("slots"), 1);
    }
}

conformance! {
    async fn a_step_without_a_free_slot_is_queued_and_a_stale_fence_admits_nothing(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let step = |step_id: &str| WorkflowStep {
            workflow_id: "wf".into(),
            step_id: step_id.to_owned(),
            attempt: 1,
            slots_max: 2,
            slots_per_user_max: 2,
            slots_reserved: 0,
            fence: lease.fence(),
            journal: Vec::new(),
        };
        for (n, step_id) in ["s1", "s2"].into_iter().enumerate() {
            let run = NewRun { step: Some(step(step_id)), ..new_run(&format!("run-{n}"), &format!("t-{n}"), "node-a") };
            admitted(&*store, run).await;
        }
        let third = NewRun { step: Some(step("s3")), ..new_run("run-3", "t-3", "node-a") };
        assert_eq!(store.admit_run(third.clone()).await.expect("admit"), Admission::Queued);
        assert_eq!(store.read_run(&store::RunId::from("run-3")).await.expect("read"), None);
        assert_eq!(store.count_slots().await.expect("slots"), 2);

        store
            .fenced_write(&lease.fence(), vec![store::WriteOp::ReleaseSlot {
                workflow_id: "wf".into(),
                step_id: "s1".into(),
            }])
            .await
            .expect("release a slot");
        admitted(&*store, third).await;
        assert_eq!(store.count_slots().await.expect("slots"), 2);

        assert!(store.release_lease(&lease.fence()).await.expect("release"));
        let stale = NewRun { step: Some(step("s4")), ..new_run("run-4", "t-4", "node-a") };
        let refused = store.admit_run(stale).await;
        assert!(matches!(refused, Err(Error::LeaseLost { .. })), "{refused:?}");
        assert_eq!(store.read_run(&store::RunId::from("run-4")).await.expect("read"), None);
        assert_eq!(store.count_slots().await.expect("slots"), 2);
    }
}

conformance! {
    async fn a_steps_journal_writes_are_committed_with_its_admission_and_only_then(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        let put = |step_id: &str, status: &str| store::WriteOp::PutStep {
            workflow_id: "wf".into(),
            seq: 0,
            step_id: step_id.to_owned(),
            attempt: 1,
            status: store::StepStatus::parse(status).expect("a step status"),
            record: store::StepRecord::decode("agent", &json!({"run": step_id})).expect("a step record"),
        };
        let step = |step_id: &str, slots_max: u64| WorkflowStep {
            workflow_id: "wf".into(),
            step_id: step_id.to_owned(),
            attempt: 1,
            slots_max,
            slots_per_user_max: slots_max,
            slots_reserved: 0,
            fence: lease.fence(),
            journal: vec![put(step_id, "running")],
        };
        let keyed = |run_id: &str, step_id: &str, slots_max: u64| NewRun {
            idempotency: Some((format!("wf/{step_id}/1"), json!({"step": step_id}))),
            step: Some(step(step_id, slots_max)),
            ..new_run(run_id, &format!("t-{step_id}"), "node-a")
        };
        let journaled = || async {
            let steps = store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps");
            steps.into_iter().map(|s| s.step_id).collect::<Vec<_>>()
        };

        admitted(&*store, keyed("run-a", "a", 1)).await;
        assert_eq!(journaled().await, ["a"]);
        // No slot: queued, and its journal write is not made.
        assert_eq!(store.admit_run(keyed("run-b", "b", 1)).await.expect("admit"), Admission::Queued);
        assert_eq!(journaled().await, ["a"]);
        // The same request again finds its run; the journal write is the caller's to make.
        store
            .fenced_write(&lease.fence(), vec![put("a", "completed")])
            .await
            .expect("complete a");
        let again = store.admit_run(keyed("run-a2", "a", 1)).await.expect("admit");
        assert!(matches!(again, Admission::Existing(ref row) if row.run_id == "run-a"), "{again:?}");
        let steps = store.read_steps(&store::WorkflowId::from("wf")).await.expect("steps");
        assert_eq!(steps[0].status, store::StepStatus::Completed, "the repeated admission rewrote the journal");
        // A stale fence writes nothing at all.
        assert!(store.release_lease(&lease.fence()).await.expect("release"));
        let stale = store.admit_run(keyed("run-c", "c", 8)).await;
        assert!(matches!(stale, Err(Error::LeaseLost { .. })), "{stale:?}");
        assert_eq!(journaled().await, ["a"]);
        assert_eq!(store.read_run(&store::RunId::from("run-c")).await.expect("read"), None);
    }
}

conformance! {
    async fn racing_admissions_never_hold_more_slots_than_the_max_even_after_it_is_lowered(db) {
        let store = db.store().await;
        let mut fences = Vec::new();
        for n in 0..24 {
            fences.push(workflow(&*store, &format!("wf-{n}"), "node-a", 60_000).await.fence());
        }
        let step = |n: usize, slots_max: u64| WorkflowStep {
            workflow_id: format!("wf-{n}").into(),
            step_id: "s".into(),
            attempt: 1,
            slots_max,
            slots_per_user_max: slots_max,
            slots_reserved: 0,
            fence: fences[n].clone(),
            journal: Vec::new(),
        };
        let run = |n: usize, slots_max: u64| NewRun {
            step: Some(step(n, slots_max)),
            ..new_run(&format!("run-{n}"), &format!("t-{n}"), "node-a")
        };
        let start = Arc::new(Barrier::new(24));
        let racers: Vec<_> = (0..24)
            .map(|n| {
                let (store, start, run) = (Arc::clone(&store), Arc::clone(&start), run(n, 8));
                tokio::spawn(async move {
                    start.wait().await;
                    store.admit_run(run).await.expect("admit")
                })
            })
            .collect();
        let mut held = Vec::new();
        for (n, racer) in racers.into_iter().enumerate() {
            if matches!(racer.await.expect("join"), Admission::Admitted(_)) {
                held.push(n);
            }
        }
        assert_eq!(held.len(), 8, "admitted: {held:?}");
        assert_eq!(store.count_slots().await.expect("slots"), 8);

        // The max is lowered to 4 while 8 are held: nothing is admitted until fewer than 4 are.
        let waiting: Vec<usize> = (0..24).filter(|n| !held.contains(n)).collect();
        assert_eq!(store.admit_run(run(waiting[0], 4)).await.expect("admit"), Admission::Queued);
        for n in &held[..5] {
            store
                .fenced_write(&fences[*n], vec![store::WriteOp::ReleaseSlot {
                    workflow_id: format!("wf-{n}").into(),
                    step_id: "s".into(),
                }])
                .await
                .expect("release");
        }
        assert_eq!(store.count_slots().await.expect("slots"), 3);
        admitted(&*store, run(waiting[0], 4)).await;
        assert_eq!(store.admit_run(run(waiting[1], 4)).await.expect("admit"), Admission::Queued);
        assert_eq!(store.count_slots().await.expect("slots"), 4);
    }
}

conformance! {
    /// Racing admissions of one user's workflows, with slots to spare while another user waits,
    /// hold exactly the user's share: two claims of one user never both see room for one more.
    /// Once nobody else waits, the same admissions take every slot.
    async fn racing_admissions_of_one_user_hold_exactly_their_share_while_another_waits(db) {
        let store = db.store().await;
        let mut fences = Vec::new();
        for n in 0..12 {
            fences.push(workflow(&*store, &format!("wf-{n}"), "node-a", 60_000).await.fence());
        }
        let bob = workflow_of(&*store, "wf-bob", "bob", "node-a", 60_000).await;
        store.fenced_write(&bob.fence(), vec![entry(&bob, "b1", StepStatus::Queued)]).await.expect("queued");
        let run = |n: usize| NewRun {
            step: Some(WorkflowStep {
                workflow_id: format!("wf-{n}").into(),
                step_id: "s".into(),
                attempt: 1,
                slots_max: 12,
                slots_per_user_max: 3,
                slots_reserved: 0,
                fence: fences[n].clone(),
                journal: Vec::new(),
            }),
            ..new_run(&format!("run-{n}"), &format!("t-{n}"), "node-a")
        };
        let race = |runs: Vec<NewRun>| {
            let start = Arc::new(Barrier::new(runs.len()));
            let racers: Vec<_> = runs
                .into_iter()
                .map(|run| {
                    let (store, start) = (Arc::clone(&store), Arc::clone(&start));
                    tokio::spawn(async move {
                        start.wait().await;
                        (run.clone(), store.admit_run(run).await.expect("admit"))
                    })
                })
                .collect();
            async move {
                let mut queued = Vec::new();
                for racer in racers {
                    match racer.await.expect("join") {
                        (_, Admission::Admitted(_)) => {}
                        (run, Admission::Queued) => queued.push(run),
                        (_, other) => panic!("unexpected {other:?}"),
                    }
                }
                queued
            }
        };
        let queued = race((0..12).map(run).collect()).await;
        assert_eq!(queued.len(), 9);
        assert_eq!(store.count_slots().await.expect("slots"), 3);
        // Bob's step is taken back out of the queue (his workflow goes on without it).
        store.fenced_write(&bob.fence(), vec![entry(&bob, "b1", StepStatus::Cancelled)]).await.expect("cancelled");
        assert!(race(queued).await.is_empty());
        assert_eq!(store.count_slots().await.expect("slots"), 12);
    }
}

conformance! {
    /// Racing admissions of two users, each over their share, never take the slots kept for
    /// others: two claims never both see the last slot above the reserve free. Twelve slots, a
    /// share of three, two kept: whatever the order, each user's first three are below their
    /// share, and the claims over it stop once ten slots are held.
    async fn racing_admissions_over_their_share_leave_exactly_the_reserved_slots_free(db) {
        let store = db.store().await;
        let mut leases = Vec::new();
        for user in ["ann", "cid"] {
            for n in 0..6 {
                let id = format!("wf-{user}-{n}");
                leases.push(workflow_of(&*store, &id, user, "node-a", 60_000).await);
            }
        }
        let start = Arc::new(Barrier::new(leases.len()));
        let racers: Vec<_> = leases
            .iter()
            .map(|lease| {
                let run = reserving_step_of(lease, "s", [12, 3, 2], Vec::new());
                let (store, start) = (Arc::clone(&store), Arc::clone(&start));
                tokio::spawn(async move {
                    start.wait().await;
                    store.admit_run(run).await.expect("admit")
                })
            })
            .collect();
        let mut queued = 0;
        for racer in racers {
            match racer.await.expect("join") {
                Admission::Admitted(_) => {}
                Admission::Queued => queued += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((queued, store.count_slots().await.expect("slots")), (2, 10));
    }
}

conformance! {
    /// A run whose agent waits for a person gives its step's slot back in the write that records
    /// the wait (before, it kept it until the step ended, even with its node gone). Answered, its
    /// live agent's run claims a slot again under the same rules as an admission: queued while
    /// the cluster is full, then held (once: a second claim keeps it); only by its owner, and
    /// not once it was asked to stop.
    async fn a_run_waiting_for_a_person_holds_no_slot_and_claims_one_again_once_answered(db) {
        let store = db.store().await;
        let ann = workflow_of(&*store, "wf-ann", "ann", "node-a", 60_000).await;
        let bob = workflow_of(&*store, "wf-bob", "bob", "node-a", 60_000).await;
        let asking = admitted(&*store, step_of(&ann, "ask", 2, 1, Vec::new())).await.run_id;
        let attached = json!({"hitl_approval": {"request_id": "r1", "attached": true}});
        assert!(store.update_run_status(&asking, "node-a", RunStatus::WaitingForInput, Some(attached)).await.expect("pause"));
        assert_eq!(store.count_slots().await.expect("slots"), 0);
        // Bob's steps take both slots meanwhile, over his share: nobody else waits for one.
        admitted(&*store, step_of(&bob, "b1", 2, 1, Vec::new())).await;
        admitted(&*store, step_of(&bob, "b2", 2, 1, Vec::new())).await;

        let thread = "t-wf-ann-ask";
        let answer = store.answer_approval(thread, &["r1".into()], &approve()).await.expect("answer");
        assert_eq!(answer.map(|a| a.status), Some(RunStatus::Running));
        let claim = |owner: &'static str| {
            let (store, asking) = (Arc::clone(&store), asking.clone());
            async move { store.claim_run_slot(&asking, owner, 2, 1, 0).await.expect("claim") }
        };
        assert_eq!(claim("node-a").await, RunSlot::Queued);
        store.fenced_write(&bob.fence(), vec![release(&bob, "b1")]).await.expect("release");
        assert_eq!(claim("node-b").await, RunSlot::Refused, "another node claimed its slot");
        assert_eq!(store.count_slots().await.expect("slots"), 1);
        assert_eq!(claim("node-a").await, RunSlot::Held);
        assert_eq!(claim("node-a").await, RunSlot::Held);
        assert_eq!(store.count_slots().await.expect("slots"), 2);
        let slots = store.list_slots(10).await.expect("slots");
        assert!(slots.iter().any(|slot| slot.workflow_id == "wf-ann" && slot.step_id == "ask"), "{slots:?}");

        // A run asked to stop claims nothing; neither does a run of no workflow.
        store.fenced_write(&ann.fence(), vec![release(&ann, "ask")]).await.expect("release");
        assert_eq!(store.request_run_cancel(&asking, CancelAction::Interrupt).await.expect("cancel"), Some(CancelAction::Interrupt));
        assert_eq!(claim("node-a").await, RunSlot::Refused);
        let plain = admitted(&*store, new_run("plain", "t-plain", "node-a")).await.run_id;
        assert_eq!(store.claim_run_slot(&plain, "node-a", 2, 1, 0).await.expect("claim"), RunSlot::Refused);
        assert_eq!(store.count_slots().await.expect("slots"), 1);
    }
}

conformance! {
    async fn a_max_of_zero_admits_none_and_racing_admissions_fill_a_wide_max_exactly(db) {
        // With 40 of 48 numbers free at first, claims take random numbers; the last ones find
        // them taken and count. Either way exactly the max is held.
        let store = db.store().await;
        let racers = 48;
        let max = 40;
        let mut fences = Vec::new();
        for n in 0..racers {
            fences.push(workflow(&*store, &format!("wide-{n}"), "node-a", 60_000).await.fence());
        }
        let run = |n: usize, slots_max: u64| NewRun {
            step: Some(WorkflowStep {
                workflow_id: format!("wide-{n}").into(),
                step_id: "s".into(),
                attempt: 1,
                slots_max,
                slots_per_user_max: slots_max,
                slots_reserved: 0,
                fence: fences[n].clone(),
                journal: Vec::new(),
            }),
            ..new_run(&format!("wide-run-{n}"), &format!("wide-t-{n}"), "node-a")
        };
        // A max of zero admits nothing, even with every number free.
        assert_eq!(store.admit_run(run(0, 0)).await.expect("admit"), Admission::Queued);
        assert_eq!(store.count_slots().await.expect("slots"), 0);
        let start = Arc::new(Barrier::new(racers));
        let tasks: Vec<_> = (0..racers)
            .map(|n| {
                let (store, start, run) = (Arc::clone(&store), Arc::clone(&start), run(n, max));
                tokio::spawn(async move {
                    start.wait().await;
                    store.admit_run(run).await.expect("admit")
                })
            })
            .collect();
        let mut admitted_count = 0;
        for task in tasks {
            match task.await.expect("join") {
                Admission::Admitted(_) => admitted_count += 1,
                Admission::Queued => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(admitted_count, 40);
        assert_eq!(store.count_slots().await.expect("slots"), 40);
    }
}

conformance! {
    async fn only_the_owner_of_a_live_row_records_its_outcome_once(db) {
        let store = db.store().await;
        admitted(&*store, new_run("run-1", "thread-1", "node-a")).await;
        assert!(!store.finalize_run(&store::RunId::from("run-1"), "node-b", &outcome(RunStatus::Success), true).await.expect("cas"),
            "another node recorded an outcome");
        let counted = RunOutcome { total_tokens: 17, message_count: 2, ..outcome(RunStatus::Success) };
        assert!(store.finalize_run(&store::RunId::from("run-1"), "node-a", &counted, true).await.expect("cas"));
        let conflicting = RunOutcome { error: Some("late".into()), ..outcome(RunStatus::Error) };
        assert!(!store.finalize_run(&store::RunId::from("run-1"), "node-a", &conflicting, false).await.expect("cas"),
            "a second outcome overwrote the first");
        assert!(!store.update_run_status(&store::RunId::from("run-1"), "node-a", RunStatus::Running, None).await.expect("cas"),
            "a live status resurrected a finished run");

        let row = store.read_run(&store::RunId::from("run-1")).await.expect("read").expect("row");
        assert_eq!((row.status, row.error, row.total_tokens, row.message_count),
            (RunStatus::Success, None, 17, 2));
        let renewal = store.renew_run_lease(&store::RunId::from("run-1"), "node-a", 60_000).await.expect("renew");
        assert!(matches!(renewal, Err(Some(ref row)) if row.status == RunStatus::Success), "{renewal:?}");
    }
}

conformance! {
    async fn a_durable_cancel_reaches_the_owner_at_renewal_and_blocks_a_plain_success(db) {
        let store = db.store().await;
        admitted(&*store, new_run("run-1", "thread-1", "node-a")).await;
        let renewed = store.renew_run_lease(&store::RunId::from("run-1"), "node-a", 60_000).await.expect("renew").expect("renewed");
        assert_eq!(renewed.cancel_action, None);
        assert!(renewed.expires_at > renewed.now);

        assert_eq!(store.request_run_cancel(&store::RunId::from("run-1"), CancelAction::Rollback).await.expect("cancel"),
            Some(CancelAction::Rollback));
        assert_eq!(store.request_run_cancel(&store::RunId::from("run-1"), CancelAction::Interrupt).await.expect("cancel"),
            Some(CancelAction::Rollback), "the first action asked for stands");
        let renewed = store.renew_run_lease(&store::RunId::from("run-1"), "node-a", 60_000).await.expect("renew").expect("renewed");
        assert_eq!(renewed.cancel_action, Some(CancelAction::Rollback));

        assert!(!store.finalize_run(&store::RunId::from("run-1"), "node-a", &outcome(RunStatus::Success), true).await.expect("cas"),
            "a success was recorded over a cancel request");
        let interrupted = RunOutcome { error: Some("rolled back".into()), ..outcome(RunStatus::Interrupted) };
        assert!(store.finalize_run(&store::RunId::from("run-1"), "node-a", &interrupted, false).await.expect("cas"));
        assert_eq!(store.request_run_cancel(&store::RunId::from("run-1"), CancelAction::Interrupt).await.expect("cancel"), None);
        assert_eq!(store.read_run(&store::RunId::from("run-1")).await.expect("read").map(|r| r.status), Some(RunStatus::Interrupted));

        paused(&*store, "run-2", "thread-2", "approval-1").await;
        store.request_run_cancel(&store::RunId::from("run-2"), CancelAction::Interrupt).await.expect("cancel");
        assert_eq!(store.read_run(&store::RunId::from("run-2")).await.expect("read").map(|r| r.status),
            Some(RunStatus::Interrupted), "a paused run, which nobody runs, ends at once");
    }
}

conformance! {
    async fn an_expired_run_is_claimed_as_an_orphan_and_its_old_owner_is_fenced(db) {
        let store = db.store().await;
        admitted(&*store, NewRun { lease_ms: 200, ..new_run("brief", "thread-1", "dead-node") }).await;
        admitted(&*store, new_run("alive", "thread-2", "node-a")).await;
        let deadline = store.read_run(&store::RunId::from("brief")).await.expect("read").and_then(|r| r.lease_expires_at).expect("lease");
        db.pass(&store, deadline).await;
        let renewal = store.renew_run_lease(&store::RunId::from("brief"), "dead-node", 60_000).await.expect("renew");
        assert!(matches!(renewal, Err(Some(_))), "an expired run lease was renewed: {renewal:?}");

        assert_eq!(store.claim_orphan_runs("node-b", 10).await.expect("claim"), vec![store::RunId::new("brief")]);
        assert!(store.claim_orphan_runs("node-b", 10).await.expect("claim").is_empty());
        let row = store.read_run(&store::RunId::from("brief")).await.expect("read").expect("row");
        assert_eq!((row.status, row.stop_reason.as_deref(), row.owner_worker_id.as_deref()),
            (RunStatus::Error, Some("orphan_recovered"), Some("node-b")));
        assert!(!store.finalize_run(&store::RunId::from("brief"), "dead-node", &outcome(RunStatus::Success), true).await.expect("cas"));
        assert_eq!(store.read_run(&store::RunId::from("alive")).await.expect("read").map(|r| r.status), Some(RunStatus::Running));
    }
}

conformance! {
    async fn an_answer_to_an_older_pause_never_consumes_a_newer_one(db) {
        let (owner, peer) = (db.store().await, db.store().await);
        paused(&*owner, "run-1", "thread", "approval-1").await;
        let first = owner.answer_approval("thread", &["approval-1".into()], &approve()).await.expect("answer")
            .expect("the first pause is answered");
        let row = owner.read_run(&store::RunId::from("run-1")).await.expect("read").expect("row");
        assert_eq!((row.status, &row.metadata), (RunStatus::Success, &answered_metadata("approval-1")));
        assert_eq!((first.previous_metadata, first.status), (paused_metadata("approval-1"), RunStatus::Success));

        paused(&*owner, "run-2", "thread", "approval-2").await;
        assert_eq!(peer.answer_approval("thread", &["approval-1".into()], &approve()).await.expect("answer"), None,
            "a stale answer consumed the newer pause");
        assert_eq!(peer.read_run(&store::RunId::from("run-2")).await.expect("read").map(|r| r.metadata),
            Some(paused_metadata("approval-2")));

        let second = peer.answer_approval("thread", &["approval-2".into()], &approve()).await.expect("answer")
            .expect("the current pause is answered");
        assert!(peer.restore_approval(&second).await.expect("restore"));
        let restored = peer.read_run(&store::RunId::from("run-2")).await.expect("read").expect("row");
        assert_eq!((restored.status, restored.metadata), (RunStatus::WaitingForInput, paused_metadata("approval-2")));
        assert!(!peer.restore_approval(&second).await.expect("restore"), "an answer was restored twice");

        // Restoring is refused once anything newer was committed on the run: here a second answer
        // of the restored pause.
        owner.answer_approval("thread", &["approval-2".into()], &approve()).await.expect("answer")
            .expect("the restored pause is answered again");
        assert!(!owner.restore_approval(&second).await.expect("restore"),
            "a restore overwrote a newer commit");
        assert_eq!(owner.read_run(&store::RunId::from("run-2")).await.expect("read").map(|r| r.status), Some(RunStatus::Success));

    }
}

conformance! {
    async fn two_nodes_answering_the_same_approval_have_exactly_one_winner(db) {
        const ROUNDS: usize = 100;
        let (a, b) = (db.store().await, db.store().await);
        for round in 0..ROUNDS {
            let thread = format!("thread-{round}");
            paused(&*a, &format!("run-{round}"), &thread, "approval").await;
            let barrier = Arc::new(Barrier::new(2));
            let answer = |store: Arc<S>| {
                let (barrier, thread) = (Arc::clone(&barrier), thread.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.answer_approval(&thread, &["approval".into()], &approve()).await
                })
            };
            let (first, second) = (answer(Arc::clone(&a)), answer(Arc::clone(&b)));
            let first = first.await.expect("join").expect("answer");
            let second = second.await.expect("join").expect("answer");
            assert_eq!(
                usize::from(first.is_some()) + usize::from(second.is_some()),
                1,
                "round {round}: {first:?} / {second:?}"
            );
            let row = a.read_run(&format!("run-{round}").into()).await.expect("read").expect("row");
            assert_eq!((row.status, row.metadata), (RunStatus::Success, answered_metadata("approval")));
        }
    }
}

conformance! {
    // An approval request whose deadline passed is listed for the sweep, one still due is not,
    // and one answered (by a person, first) is no longer listed.
    async fn an_approval_request_past_its_deadline_is_listed_until_it_is_answered(db) {
        let store = db.store().await;
        let deadline = |ms: f64| {
            let mut metadata = paused_metadata("q-1");
            metadata[store::APPROVAL_DEADLINE] = json!(ms);
            metadata
        };
        let now_ms = store.now().await.expect("now") * 1000.0;
        for (run, thread, due) in [("past", "t-past", now_ms - 1.0), ("later", "t-later", now_ms + 600_000.0)] {
            admitted(&*store, new_run(run, thread, "node-a")).await;
            assert!(store
                .update_run_status(&store::RunId::new(run), "node-a", RunStatus::WaitingForInput, Some(deadline(due)))
                .await
                .expect("pause"));
        }
        let expired = store.expired_approvals(10).await.expect("read");
        assert_eq!(expired.len(), 1, "{expired:?}");
        assert_eq!(
            (expired[0].run_id.as_str(), expired[0].thread_id.as_str(), expired[0].request_id.as_str()),
            ("past", "t-past", "q-1")
        );
        assert_eq!(expired[0].actions, paused_metadata("q-1")["hitl_approval"]["actions"]);
        assert!(store.answer_approval("t-past", &["q-1".into()], &approve()).await.expect("answer").is_some());
        assert!(store.expired_approvals(10).await.expect("read").is_empty(), "an answered request is still listed");
    }
}
