//! The notification outbox's rows (migrations 36, 38 and 42) and their deliveries: what a node's
//! notifier claims, delivers and settles, one webhook at a time. A row is written by the
//! database, in the transaction of the event it tells of (`workflow_events`), never by a node
//! that means to notify; each webhook's delivery of it (`notify_deliveries`) has its own
//! attempts, schedule and claim, so a webhook that never answers holds only its own. See
//! `ARCHITECTURE.md`, "Notifications".

use serde_json::Value;

use crate::{Error, Result, WorkflowId};

/// What a notification tells its receivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NotificationKind {
    /// An item entered a person's inbox: a `pause` or a `humanCheckpoint` reached, or an agent's
    /// run asking for approval.
    Entered,
    /// A person decided it: a checkpoint approved or rejected, a pause resumed, an approval
    /// answered.
    Decided,
    /// A deadline decided it: the decision was recorded `"by": "timeout"`.
    TimedOut,
    /// It has waited past its reminder (`remindAfterMs`): a row written with the item's
    /// `entered` one, due at that time, deleted by a decision first (migration 38).
    Overdue,
}

impl NotificationKind {
    /// Every kind, in the order they are documented.
    pub const ALL: [NotificationKind; 4] = [
        NotificationKind::Entered,
        NotificationKind::Decided,
        NotificationKind::TimedOut,
        NotificationKind::Overdue,
    ];

    /// The kind as stored and as sent.
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationKind::Entered => "entered",
            NotificationKind::Decided => "decided",
            NotificationKind::TimedOut => "timed_out",
            NotificationKind::Overdue => "overdue",
        }
    }

    /// The kind a stored or configured name names.
    pub fn parse(name: &str) -> Option<NotificationKind> {
        NotificationKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }

    pub(crate) fn read(name: &str, id: &str) -> Result<NotificationKind> {
        NotificationKind::parse(name).ok_or_else(|| {
            Error::Database(format!("notification {id:?} has an unknown kind {name:?}"))
        })
    }
}

/// What a notification tells of its item, typed: its event's data as the event's trigger wrote
/// it, with the workflow's `title` and the step's `message` where they exist (migrations 36, 38
/// and 42 copy them in). Read here only ([`NotificationData::decode`]); a key of another type
/// than its own is read as absent (the body leaves it out) rather than failing the delivery.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NotificationData {
    pub step_id: Option<String>,
    pub attempt: Option<i64>,
    /// The workflow's title, when its launch gave one.
    pub title: Option<String>,
    /// What a `pause` tells whoever answers it.
    pub message: Option<String>,
    /// The artifact version a checkpoint is about.
    pub artifact_version: Option<i64>,
    /// An agent's run asking for approval, and its request.
    pub child_run_id: Option<String>,
    pub request_id: Option<String>,
    /// `approved`/`rejected` (or `approve`/`reject`, an agent's answer) and its comment.
    pub decision: Option<String>,
    pub comment: Option<String>,
    /// Who decided (an email); absent for an item entered, or a deadline's decision.
    pub by: Option<String>,
    /// What a resumed pause resolves with (`pause_resumed`; `null` is a value): absent when its
    /// deadline failed the pause.
    pub input: Option<Value>,
}

impl NotificationData {
    /// The typed view of a stored notification's `data`.
    pub fn decode(data: &Value) -> Self {
        let text = |key: &str| data.get(key).and_then(Value::as_str).map(str::to_owned);
        let whole = |key: &str| data.get(key).and_then(Value::as_i64);
        NotificationData {
            step_id: text("step_id"),
            attempt: whole("attempt"),
            title: text("title"),
            message: text("message"),
            artifact_version: whole("artifact_version"),
            child_run_id: text("child_run_id"),
            request_id: text("request_id"),
            decision: text("decision"),
            comment: text("comment"),
            by: text("by"),
            input: data.get("input").cloned(),
        }
    }
}

/// One notification claimed for delivery to one webhook.
#[derive(Debug, Clone, PartialEq)]
pub struct Notification {
    /// `<workflow>:<event seq>` (a reminder: `<workflow>:overdue:<step id>:<attempt>`): the same
    /// on every delivery of it, so receivers deduplicate by it.
    pub id: String,
    pub workflow_id: WorkflowId,
    /// Its event's number in the workflow.
    pub seq: i64,
    pub kind: NotificationKind,
    /// The event it was written for (`pause_waiting`, `checkpoint_decided`, ...).
    pub event: String,
    /// What it tells of its item.
    pub data: NotificationData,
    /// The workflow's owner when the event committed, for the sinks' filters.
    pub user_id: Option<String>,
    pub user_email: Option<String>,
    pub user_role: Option<String>,
    /// When the event committed (epoch seconds, database clock).
    pub created_at: f64,
    /// Attempts to deliver it to the claim's webhook settled before this claim.
    pub attempts: u32,
    /// The claim's epoch (of this webhook's delivery): what every write of the claimant names.
    pub claim_epoch: i64,
}

/// How a claimant settles a delivery it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Nothing more to do for this webhook (it took it, its filters do not take it, or the
    /// attempts ran out); once every webhook of the claimant has settled it, the row goes.
    Finished,
    /// The webhook did not take it: released, due again `after_ms` from now (database clock),
    /// with one more attempt counted.
    Retry { after_ms: u64 },
}

/// The statuses of a workflow whose inbox items still wait for a person, as an SQL list: a
/// reminder of any other is never sent, and the `reins_inbox_overdue` gauge counts only these.
pub(crate) const WAITING: &str = "('running', 'paused', 'waiting_approval')";

/// The columns every read of a claimed row selects from the outbox (`o`) and the delivery
/// (`d`), in [`Notification`]'s order.
pub(crate) const COLUMNS: &str = "o.id, o.workflow, o.seq, o.kind, o.event, o.data, o.user_id, \
     o.user_email, o.user_role, o.created_at, d.attempts, d.claim_epoch";
