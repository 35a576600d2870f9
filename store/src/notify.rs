//! The notification outbox's rows (migrations 36 and 38): what a node's notifier claims, delivers and
//! settles. A row is written by the database, in the transaction of the event it tells of
//! (`workflow_events`), never by a node that means to notify; see `ARCHITECTURE.md`,
//! "Notifications".

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

/// One claimed row of the outbox.
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
    /// The event's data, with the workflow's `title` and the step's `message` when they exist.
    pub data: Value,
    /// The workflow's owner when the event committed, for the sinks' filters.
    pub user_id: Option<String>,
    pub user_email: Option<String>,
    pub user_role: Option<String>,
    /// When the event committed (epoch seconds, database clock).
    pub created_at: f64,
    /// Attempts settled before this claim.
    pub attempts: u32,
    /// Sinks that took it already (by their key), so a retry asks only the others.
    pub delivered_to: Vec<String>,
    /// The claim's epoch: what every write of the claimant names.
    pub claim_epoch: i64,
}

/// How a claimant settles a notification it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Nothing more to do (every sink took it, or the attempts ran out): the row goes.
    Finished,
    /// Some sinks have not taken it: released, due again `after_ms` from now (database clock),
    /// with `delivered_to` those that have and one more attempt counted.
    Retry {
        delivered_to: Vec<String>,
        after_ms: u64,
    },
}

/// The statuses of a workflow whose inbox items still wait for a person, as an SQL list: a
/// reminder of any other is never sent, and the `reins_inbox_overdue` gauge counts only these.
pub(crate) const WAITING: &str = "('running', 'paused', 'waiting_approval')";

/// The columns every read of a claimed row selects, in [`Notification`]'s order.
pub(crate) const COLUMNS: &str = "id, workflow, seq, kind, event, data, user_id, user_email, \
     user_role, created_at, attempts, delivered_to, claim_epoch";

/// Claimed rows in the order of their events: by time, then by workflow and number (one
/// transaction's events share a time on the simulated clock).
pub(crate) fn in_event_order(claimed: &mut [Notification]) {
    claimed.sort_by(|a, b| {
        a.created_at
            .total_cmp(&b.created_at)
            .then_with(|| a.workflow_id.cmp(&b.workflow_id))
            .then_with(|| a.seq.cmp(&b.seq))
    });
}
