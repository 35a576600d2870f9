//! The notification outbox (migrations 36, 42 and 43): one row per inbox event, written with the
//! event or not at all; each webhook's delivery of it is claimed and settled on its own; a claim
//! has one winner, lapses to another claimant, and only its epoch settles it; a claim takes one
//! notification per workflow, and owners take turns; a webhook takes only what commits after it
//! was first configured.

use serde_json::{Value, json};
use store::{
    ControlKind, Launch, LaunchLimits, NewControl, NewRun, NewWorkflow, Notification,
    NotificationKind, RunStatus, Settlement, WorkflowStep, WriteOp,
};

use crate::harness::{Subject, TestDb, conformance, workflow, workflow_of};

/// The webhook most tests deliver to, and another.
const HOOK: &str = "https://a.example/hook";
const OTHER_HOOK: &str = "https://b.example/hook";

fn put(step_id: &str, kind: &str, data: Value) -> WriteOp {
    put_in("wf", step_id, kind, data)
}

fn put_in(workflow_id: &str, step_id: &str, kind: &str, data: Value) -> WriteOp {
    WriteOp::PutStep {
        workflow_id: workflow_id.into(),
        seq: 0,
        step_id: step_id.to_owned(),
        attempt: 1,
        status: store::StepStatus::Running,
        record: store::StepRecord::decode(kind, &data).expect("a step record"),
    }
}

fn control(kind: ControlKind, step_id: &str, body: Value, by: &str) -> NewControl {
    NewControl {
        workflow_id: "wf".into(),
        kind,
        step_id: step_id.to_owned(),
        attempt: 1,
        body,
        created_by: Some(by.into()),
    }
}

/// A workflow `wf` waiting at a pause `p` (one notification in the outbox).
async fn paused<S: Subject>(store: &S) -> store::Lease {
    let lease = workflow(store, "wf", "node-a", 60_000).await;
    store
        .fenced_write(
            &lease.fence(),
            vec![put("p", "pause", json!({"args": {"message": "look"}}))],
        )
        .await
        .expect("pause");
    lease
}

/// Everything due for [`HOOK`], claimed by `owner` for a minute.
async fn claim_all<S: Subject>(store: &S, owner: &str) -> Vec<Notification> {
    claim_for(store, owner, HOOK, 100).await
}

/// At most `max` due for `target`, claimed by `owner` for a minute.
async fn claim_for<S: Subject>(
    store: &S,
    owner: &str,
    target: &str,
    max: u32,
) -> Vec<Notification> {
    store
        .claim_notifications(owner, target, 60_000, max)
        .await
        .expect("claim")
}

/// Settles `notification`'s delivery to [`HOOK`] (the only webhook) under its claim.
async fn settle<S: Subject>(
    store: &S,
    notification: &Notification,
    settlement: Settlement,
) -> bool {
    store
        .settle_notification(
            &notification.id,
            HOOK,
            notification.claim_epoch,
            settlement,
            &[HOOK.to_owned()],
        )
        .await
        .expect("settle")
}

/// Waits until the database clock is `ms` past now.
async fn wait_ms<S: Subject>(db: &TestDb<S>, store: &S, ms: u64) {
    let now = store.now().await.expect("now");
    db.pass(store, now + ms as f64 / 1000.0).await;
}

conformance! {
    async fn every_inbox_event_writes_one_notification(db) {
        let store = db.store().await;
        let launched = store.launch_workflow(NewWorkflow {
            workflow_id: "wf".into(), user_id: "tester".into(), request_id: None,
            fingerprint: "fp".into(), data: json!({"title": "Quarterly report"}),
        }, "node-a", 60_000, LaunchLimits::NONE).await.expect("launch");
        let Launch::Created { lease, .. } = launched else { panic!("not created: {launched:?}") };
        let fence = lease.fence();
        store.fenced_write(&fence, vec![
            put("p", "pause", json!({"args": {"message": "check the numbers"}})),
            put("h", "humanCheckpoint", json!({"args": {"artifactVersion": 2}})),
            put("t", "humanCheckpoint", json!({"args": {"artifactVersion": 2}})),
        ]).await.expect("wait for people");
        store.put_control(control(ControlKind::Resume, "p", json!({}), "ada")).await.expect("resume");
        store.put_control(control(ControlKind::Decide, "h",
            json!({"decision": "reject", "artifactVersion": 2, "comment": "not yet"}), "ada"))
            .await.expect("decide");
        store.put_control(control(ControlKind::Decide, "t",
            json!({"decision": "reject", "artifactVersion": 2, "by": "timeout"}), "system"))
            .await.expect("timed out");
        let run = NewRun {
            run_id: "run".into(), thread_id: "thread".into(), agent: "echo".into(),
            owner: "node-a".into(), lease_ms: 60_000, idempotency: None, metadata: json!({}),
            step: Some(WorkflowStep {
                workflow_id: "wf".into(), step_id: "s".into(), attempt: 1, slots_max: 8,
                slots_per_user_max: 8, slots_reserved: 0, fence: fence.clone(), journal: Vec::new(),
            }),
        };
        store.admit_run(run).await.expect("admit");
        let asked = json!({"hitl_approval": {"request_id": "r1"}});
        assert!(store.update_run_status(&store::RunId::from("run"), "node-a",
            RunStatus::WaitingForInput, Some(asked)).await.expect("ask"));
        store.answer_approval("thread", &["r1".into()], &json!({"decision": "approve", "by": "bob"}))
            .await.expect("answer").expect("answered");
        // A step that waits for nobody and a cancel write none.
        store.fenced_write(&fence, vec![crate::harness::step("wf", "plain")]).await.expect("step");

        assert_eq!(store.notification_backlog().await.expect("backlog"), 8);
        let claimed = drain(&*store).await;
        let seen: Vec<(&str, NotificationKind, &str)> = claimed.iter()
            .map(|n| (n.event.as_str(), n.kind, n.data.step_id.as_deref().unwrap_or("")))
            .collect();
        assert_eq!(seen, [
            ("pause_waiting", NotificationKind::Entered, "p"),
            ("checkpoint_waiting", NotificationKind::Entered, "h"),
            ("checkpoint_waiting", NotificationKind::Entered, "t"),
            ("pause_resumed", NotificationKind::Decided, "p"),
            ("checkpoint_decided", NotificationKind::Decided, "h"),
            ("checkpoint_decided", NotificationKind::TimedOut, "t"),
            ("approval_requested", NotificationKind::Entered, "s"),
            ("approval_answered", NotificationKind::Decided, "s"),
        ]);
        let events = store.read_events(&"wf".into(), 0, 1_000).await.expect("events").expect("wf");
        for notification in &claimed {
            let event = events.events.iter().find(|event| event.kind == notification.event
                && event.data["step_id"].as_str() == notification.data.step_id.as_deref()).expect("its event");
            assert_eq!(notification.id, format!("wf:{}", event.seq));
            assert_eq!(notification.created_at, event.created_at);
            assert_eq!(notification.workflow_id, store::WorkflowId::from("wf"));
            assert_eq!(notification.user_id.as_deref(), Some("tester"));
            assert_eq!((notification.attempts, notification.claim_epoch), (0, 1));
            assert_eq!(notification.data.title.as_deref(), Some("Quarterly report"));
        }
        assert_eq!(claimed[0].data.message.as_deref(), Some("check the numbers"));
        assert_eq!(claimed[4].data.comment.as_deref(), Some("not yet"));
        assert_eq!(claimed[4].data.decision.as_deref(), Some("reject"));
        assert_eq!(claimed[4].data.by.as_deref(), Some("ada"));
        assert_eq!(claimed[7].data.by.as_deref(), Some("bob"));
        assert_eq!(store.notification_backlog().await.expect("backlog"), 0);
    }
}

conformance! {
    async fn a_fenced_out_write_leaves_no_notification(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 100).await;
        db.pass(&*store, lease.expires_at).await;
        store.acquire_lease(&"wf".into(), "node-b", 60_000).await.expect("acquire").expect("taken over");
        let refused = store.fenced_write(&lease.fence(), vec![put("p", "pause", json!({}))]).await;
        assert!(matches!(refused, Err(store::Error::LeaseLost { .. })), "{refused:?}");
        assert_eq!(store.notification_backlog().await.expect("backlog"), 0);
        assert!(claim_all(&*store, "node-a").await.is_empty());
    }
}

conformance! {
    async fn a_claim_has_one_winner_and_only_its_epoch_settles(db) {
        let (store, other) = (db.store().await, db.store().await);
        paused(&*store).await;
        let (a, b) = tokio::join!(
            store.claim_notifications("node-a", HOOK, 60_000, 10),
            other.claim_notifications("node-b", HOOK, 60_000, 10),
        );
        let (a, b) = (a.expect("claim a"), b.expect("claim b"));
        assert_eq!(a.len() + b.len(), 1, "both claimed: {a:?} {b:?}");
        let (winner, claimed) = if a.is_empty() { (&other, &b[0]) } else { (&store, &a[0]) };
        assert!(claim_all(&*store, "node-c").await.is_empty(), "claimed twice");
        let other_epoch = Notification { claim_epoch: claimed.claim_epoch + 1, ..claimed.clone() };
        assert!(!settle(&*store, &other_epoch, Settlement::Finished).await, "another epoch settled it");
        assert_eq!(store.notification_backlog().await.expect("backlog"), 1);
        assert!(settle(&**winner, claimed, Settlement::Finished).await);
        assert_eq!(store.notification_backlog().await.expect("backlog"), 0);
        assert!(!settle(&**winner, claimed, Settlement::Finished).await, "a settled row settled twice");
    }
}

conformance! {
    async fn a_lapsed_claim_is_delivered_again_by_another(db) {
        let store = db.store().await;
        paused(&*store).await;
        let first = store.claim_notifications("node-a", HOOK, 200, 10).await.expect("claim");
        assert_eq!(first.len(), 1);
        assert!(claim_all(&*store, "node-b").await.is_empty(), "taken while claimed");
        wait_ms(&db, &*store, 200).await;
        let second = claim_all(&*store, "node-b").await;
        assert_eq!(second.len(), 1, "not claimed again after its claim lapsed");
        assert_eq!(second[0].id, first[0].id);
        assert_eq!(second[0].claim_epoch, first[0].claim_epoch + 1);
        assert_eq!(second[0].attempts, 0);
        let retry = Settlement::Retry { after_ms: 60_000 };
        assert!(!settle(&*store, &first[0], retry.clone()).await, "the lapsed claim settled it");
        assert!(settle(&*store, &second[0], retry).await);
        assert!(claim_all(&*store, "node-b").await.is_empty(), "due before its backoff");
    }
}

conformance! {
    async fn a_retry_is_due_after_its_backoff_with_what_was_delivered(db) {
        let store = db.store().await;
        paused(&*store).await;
        let claimed = claim_all(&*store, "node-a").await;
        let retry = Settlement::Retry { after_ms: 300 };
        assert!(settle(&*store, &claimed[0], retry).await);
        assert!(claim_all(&*store, "node-a").await.is_empty(), "due before its backoff");
        wait_ms(&db, &*store, 300).await;
        let again = claim_all(&*store, "node-a").await;
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].attempts, 1);
        assert_eq!(again[0].data, claimed[0].data);
    }
}

conformance! {
    async fn notifications_older_than_their_retention_are_purged(db) {
        let store = db.store().await;
        paused(&*store).await;
        assert_eq!(store.purge_notifications(60_000).await.expect("purge"), 0);
        wait_ms(&db, &*store, 100).await;
        assert_eq!(store.purge_notifications(50).await.expect("purge"), 1);
        assert_eq!(store.notification_backlog().await.expect("backlog"), 0);
    }
}

/// Settles every claimed notification as delivered.
async fn settle_all<S: Subject>(store: &S, claimed: &[Notification]) {
    for notification in claimed {
        assert!(
            settle(store, notification, Settlement::Finished).await,
            "{}",
            notification.id
        );
    }
}

/// Claims and settles as delivered, one claim after another, whatever is due for [`HOOK`]:
/// each claim takes a workflow's next, so this answers them in the order a webhook gets them.
async fn drain<S: Subject>(store: &S) -> Vec<Notification> {
    let mut delivered = Vec::new();
    loop {
        let claimed = claim_all(store, "node-a").await;
        if claimed.is_empty() {
            return delivered;
        }
        settle_all(store, &claimed).await;
        delivered.extend(claimed);
    }
}

conformance! {
    async fn a_wait_with_a_reminder_is_notified_overdue_once_at_its_time_unless_decided_first(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        store.fenced_write(&lease.fence(), vec![
            put("p", "pause", json!({"args": {"message": "look", "remindAfterMs": 400}})),
            put("h", "humanCheckpoint", json!({"args": {"artifactVersion": 1, "remindAfterMs": 400}})),
            put("q", "pause", json!({"args": {"message": "no reminder"}})),
        ]).await.expect("wait for people");
        // Nothing is overdue yet: only the three items entering, and the backlog counts only them.
        assert_eq!(store.notification_backlog().await.expect("backlog"), 3);
        let entered = drain(&*store).await;
        let kinds: Vec<NotificationKind> = entered.iter().map(|n| n.kind).collect();
        assert_eq!(kinds, [NotificationKind::Entered; 3]);
        // The checkpoint is decided before its time: its reminder goes with the decision.
        store.put_control(control(ControlKind::Decide, "h",
            json!({"decision": "approve", "artifactVersion": 1}), "ada")).await.expect("decide");
        let decided = claim_all(&*store, "node-a").await;
        assert_eq!(decided.iter().map(|n| n.kind).collect::<Vec<_>>(), [NotificationKind::Decided]);
        settle_all(&*store, &decided).await;
        assert_eq!(store.notification_backlog().await.expect("backlog"), 0, "a reminder not yet due");

        wait_ms(&db, &*store, 450).await;
        let overdue = claim_all(&*store, "node-a").await;
        assert_eq!(overdue.len(), 1, "{overdue:?}");
        let reminder = &overdue[0];
        assert_eq!((reminder.id.as_str(), reminder.kind), ("wf:overdue:p:1", NotificationKind::Overdue));
        assert_eq!(reminder.event, "pause_waiting");
        assert_eq!((reminder.data.step_id.as_deref(), reminder.data.message.as_deref()), (Some("p"), Some("look")));
        assert_eq!(reminder.user_id.as_deref(), Some("tester"));
        let pause = entered.iter().find(|n| n.data.step_id.as_deref() == Some("p")).expect("the pause entered");
        assert_eq!(reminder.seq, pause.seq, "told of the event that put it into the inbox");
        assert!((reminder.created_at - (pause.created_at + 0.4)).abs() < 0.002,
            "overdue at its reminder's time: {} and {}", reminder.created_at, pause.created_at);
        settle_all(&*store, &overdue).await;
        // Once: resuming it now takes nothing back, and nothing else comes.
        store.put_control(control(ControlKind::Resume, "p", json!({}), "ada")).await.expect("resume");
        let after = claim_all(&*store, "node-a").await;
        assert_eq!(after.iter().map(|n| n.kind).collect::<Vec<_>>(), [NotificationKind::Decided]);
    }
}

conformance! {
    async fn a_reminder_of_a_workflow_that_ended_otherwise_is_never_sent(db) {
        let store = db.store().await;
        let lease = workflow(&*store, "wf", "node-a", 60_000).await;
        store.fenced_write(&lease.fence(), vec![
            put("p", "pause", json!({"args": {"remindAfterMs": 200}})),
        ]).await.expect("pause");
        settle_all(&*store, &claim_all(&*store, "node-a").await).await;
        store.fenced_write(&lease.fence(), vec![WriteOp::SetWorkflow {
            workflow_id: "wf".into(), status: store::WorkflowStatus::Cancelled, data: json!({}),
        }]).await.expect("cancelled");
        wait_ms(&db, &*store, 250).await;
        assert_eq!(claim_all(&*store, "node-a").await, Vec::<Notification>::new());
        assert_eq!(store.notification_backlog().await.expect("backlog"), 0, "deleted, not kept");
    }
}

conformance! {
    async fn each_webhook_claims_and_settles_its_own_delivery(db) {
        let store = db.store().await;
        paused(&*store).await;
        let both = [HOOK.to_owned(), OTHER_HOOK.to_owned()];
        let (a, b) = (claim_for(&*store, "node-a", HOOK, 10).await,
                      claim_for(&*store, "node-a", OTHER_HOOK, 10).await);
        assert_eq!((a.len(), b.len()), (1, 1), "each webhook claims its own delivery");
        assert_eq!(a[0].id, b[0].id);
        assert_eq!((a[0].claim_epoch, b[0].claim_epoch), (1, 1));
        assert!(claim_for(&*store, "node-b", HOOK, 10).await.is_empty(), "claimed twice");
        // The first webhook fails; the second takes it: the row stays for the first alone.
        assert!(store.settle_notification(&a[0].id, HOOK, a[0].claim_epoch,
            Settlement::Retry { after_ms: 300 }, &both).await.expect("retry"));
        assert!(!store.settle_notification(&b[0].id, OTHER_HOOK, b[0].claim_epoch + 1,
            Settlement::Finished, &both).await.expect("settle"), "another epoch settled it");
        assert!(store.settle_notification(&b[0].id, OTHER_HOOK, b[0].claim_epoch,
            Settlement::Finished, &both).await.expect("settle"));
        assert!(!store.settle_notification(&b[0].id, OTHER_HOOK, b[0].claim_epoch,
            Settlement::Finished, &both).await.expect("settle"), "settled twice");
        assert_eq!(store.notification_backlog().await.expect("backlog"), 1);
        wait_ms(&db, &*store, 300).await;
        assert!(claim_for(&*store, "node-a", OTHER_HOOK, 10).await.is_empty(),
            "a webhook that took it is asked again");
        let again = claim_for(&*store, "node-a", HOOK, 10).await;
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].attempts, again[0].claim_epoch), (1, 2), "its own attempts only");
        assert!(store.settle_notification(&again[0].id, HOOK, again[0].claim_epoch,
            Settlement::Finished, &both).await.expect("settle"));
        assert_eq!(store.notification_backlog().await.expect("backlog"), 0, "every webhook settled it");
    }
}

conformance! {
    async fn a_claim_takes_one_per_workflow_and_owners_take_turns(db) {
        let store = db.store().await;
        // Alice's burst: two workflows of three pauses each; then Bob's one pause.
        for id in ["a1", "a2"] {
            let lease = workflow_of(&*store, id, "alice", "node-a", 60_000).await;
            let pauses = ["p1", "p2", "p3"].map(|step| put_in(id, step, "pause", json!({"args": {}})));
            store.fenced_write(&lease.fence(), pauses.to_vec()).await.expect("alice's pauses");
        }
        wait_ms(&db, &*store, 10).await;
        let lease = workflow_of(&*store, "b1", "bob", "node-a", 60_000).await;
        store.fenced_write(&lease.fence(), vec![put_in("b1", "p", "pause", json!({"args": {}}))])
            .await.expect("bob's pause");
        let step = |n: &Notification| (n.workflow_id.as_str().to_owned(),
                                       n.data.step_id.as_deref().unwrap_or("").to_owned());
        let steps = |claimed: &[Notification]| claimed.iter().map(step).collect::<Vec<_>>();
        let pair = |w: &str, s: &str| (w.to_owned(), s.to_owned());

        // Bob's pause, the newest, is in the first two: each owner's oldest first.
        let first = claim_for(&*store, "node-a", HOOK, 2).await;
        assert_eq!(steps(&first), [pair("a1", "p1"), pair("b1", "p")]);
        // One per workflow, none of a workflow in flight: only a2's first is left to take.
        let second = claim_for(&*store, "node-a", HOOK, 10).await;
        assert_eq!(steps(&second), [pair("a2", "p1")]);
        // Another webhook's claims are its own, in the same turns.
        let other = claim_for(&*store, "node-a", OTHER_HOOK, 10).await;
        assert_eq!(steps(&other), [pair("a1", "p1"), pair("b1", "p"), pair("a2", "p1")]);
        // A workflow's next comes once its previous one is settled, in the order they entered.
        settle_all(&*store, &first).await;
        let third = claim_for(&*store, "node-a", HOOK, 10).await;
        assert_eq!(steps(&third), [pair("a1", "p2")]);
        settle_all(&*store, &second).await;
        settle_all(&*store, &third).await;
        let rest = drain(&*store).await;
        assert_eq!(steps(&rest), [pair("a1", "p3"), pair("a2", "p2"), pair("a2", "p3")]);
    }
}

conformance! {
    /// Issue 40: a webhook configured on a node with history was sent everything the outbox
    /// held from before. Registered, it takes only what commits after; the first registration
    /// of a webhook is the one that counts.
    async fn a_webhook_takes_only_what_commits_after_it_was_configured(db) {
        let store = db.store().await;
        let lease = paused(&*store).await;
        wait_ms(&db, &*store, 10).await;
        assert!(store.register_notify_target(HOOK).await.expect("register"));
        assert!(!store.register_notify_target(HOOK).await.expect("register"), "moved its moment");
        assert!(claim_all(&*store, "node-a").await.is_empty(), "sent what came before");
        wait_ms(&db, &*store, 10).await;
        store
            .fenced_write(&lease.fence(), vec![put("q", "pause", json!({"args": {}}))])
            .await
            .expect("pause");
        let claimed = claim_all(&*store, "node-a").await;
        assert_eq!(claimed.len(), 1, "{claimed:?}");
        assert_eq!(claimed[0].data.step_id.as_deref(), Some("q"));
        assert!(settle(&*store, &claimed[0], Settlement::Finished).await);
        // The row from before waits for its retention, owed to no webhook registered later.
        assert_eq!(store.notification_backlog().await.expect("backlog"), 1);
    }
}
