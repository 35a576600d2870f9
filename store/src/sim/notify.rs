//! The notification outbox in the simulation: a row per inbox event (and a reminder, due later,
//! for a wait with `remindAfterMs`), written where the real stores' triggers write them
//! (`State::event`), claimed, settled and purged as they do.

use serde_json::{Value, json};

use super::{SimStore, State};
use crate::lease::ttl_seconds;
use crate::{Notification, NotificationKind, Result, Settlement, WorkflowId, WorkflowStatus};

/// The events that put an item into a person's inbox.
const ENTERING: [&str; 3] = ["pause_waiting", "checkpoint_waiting", "approval_requested"];
/// The events that take it out.
const LEAVING: [&str; 3] = ["checkpoint_decided", "pause_resumed", "approval_answered"];

/// The events that put an item with a reminder (`remindAfterMs`) into the inbox, and those that
/// take it out before its time.
const REMINDED: [&str; 2] = ["pause_waiting", "checkpoint_waiting"];
const REMINDER_ENDS: [&str; 2] = ["checkpoint_decided", "pause_resumed"];

/// One row of the outbox with its claim and schedule.
#[derive(Debug, Clone)]
pub(super) struct OutboxRow {
    notification: Notification,
    due_at: f64,
    claim_expires_at: Option<f64>,
}

impl State {
    /// The outbox row an event writes, if it is one that enters or leaves the inbox (as the
    /// trigger of migration 36 does, in the same change).
    pub(super) fn outbox_event(
        &mut self,
        workflow_id: &WorkflowId,
        seq: i64,
        kind: &str,
        data: &Value,
        now: f64,
    ) {
        let reminder = reminder_id(workflow_id, data);
        if REMINDER_ENDS.contains(&kind) {
            self.outbox.remove(&reminder);
        }
        let notification_kind = if ENTERING.contains(&kind) {
            NotificationKind::Entered
        } else if LEAVING.contains(&kind) {
            if data["by"] == "timeout" || self.decided_by_timeout(workflow_id, data) {
                NotificationKind::TimedOut
            } else {
                NotificationKind::Decided
            }
        } else {
            return;
        };
        let Some(workflow) = self.workflows.get(workflow_id) else {
            return;
        };
        let mut data = data.clone();
        let step = data["step_id"]
            .as_str()
            .zip(data["attempt"].as_i64())
            .and_then(|(step_id, attempt)| {
                workflow
                    .steps
                    .get(&(step_id.to_owned(), i32::try_from(attempt).ok()?))
            });
        let record = step.and_then(|step| step.row.record());
        let message = record.map(|record| record.args["message"].clone());
        let remind_after_ms = record
            .filter(|_| REMINDED.contains(&kind))
            .and_then(|record| record.args["remindAfterMs"].as_f64());
        for (key, value) in [
            ("title", Some(workflow.row.data["title"].clone())),
            ("message", message),
        ] {
            if let Some(value) = value.filter(|value| !value.is_null()) {
                data[key] = value;
            }
        }
        let user_id = workflow.row.user_id.clone();
        let user = self.people.user(&user_id);
        let id = format!("{workflow_id}:{seq}");
        let row = OutboxRow {
            notification: Notification {
                id: id.clone(),
                workflow_id: workflow_id.to_owned(),
                seq,
                kind: notification_kind,
                event: kind.to_owned(),
                data,
                user_email: user.map(|user| user.email.clone()),
                user_role: user.map(|user| user.role.as_str().to_owned()),
                user_id: Some(user_id),
                created_at: now,
                attempts: 0,
                delivered_to: Vec::new(),
                claim_epoch: 0,
            },
            due_at: now,
            claim_expires_at: None,
        };
        if let Some(after_ms) = remind_after_ms {
            // Due at the reminder's time, as migration 38's trigger writes it.
            let at = now + after_ms / 1000.0;
            let mut overdue = row.clone();
            overdue.notification.id = reminder.clone();
            overdue.notification.kind = NotificationKind::Overdue;
            overdue.notification.created_at = at;
            overdue.due_at = at;
            self.outbox.entry(reminder).or_insert(overdue);
        }
        self.outbox.insert(id, row);
    }

    /// Whether `workflow_id` still waits for people (a reminder of any other is never sent).
    fn still_waiting(&self, workflow_id: &WorkflowId) -> bool {
        self.workflows.get(workflow_id).is_some_and(|workflow| {
            matches!(
                workflow.row.status,
                WorkflowStatus::Running | WorkflowStatus::Paused | WorkflowStatus::WaitingApproval
            )
        })
    }

    /// Whether the control an event tells of says `"by": "timeout"`.
    fn decided_by_timeout(&self, workflow_id: &WorkflowId, data: &Value) -> bool {
        self.controls.values().any(|control| {
            control.workflow_id == *workflow_id
                && json!(control.step_id) == data["step_id"]
                && json!(control.attempt) == data["attempt"]
                && control.body["by"] == "timeout"
        })
    }
}

/// The id of the reminder of the inbox item an event tells of, as migration 38 names it.
fn reminder_id(workflow_id: &WorkflowId, data: &Value) -> String {
    let attempt = data["attempt"].as_i64().unwrap_or_default();
    let step_id = data["step_id"].as_str().unwrap_or_default();
    format!("{workflow_id}:overdue:{step_id}:{attempt}")
}

impl crate::Notifications for SimStore {
    async fn claim_notifications(
        &self,
        owner: &str,
        claim_ms: u64,
        max: u32,
    ) -> Result<Vec<Notification>> {
        let _ = owner;
        self.write(|state, now| {
            let stale: Vec<String> = state
                .outbox
                .values()
                .filter(|row| {
                    row.notification.kind == NotificationKind::Overdue
                        && row.due_at <= now
                        && !state.still_waiting(&row.notification.workflow_id)
                })
                .map(|row| row.notification.id.clone())
                .collect();
            for id in stale {
                state.outbox.remove(&id);
            }
            let mut due: Vec<&mut OutboxRow> = state
                .outbox
                .values_mut()
                .filter(|row| {
                    row.due_at <= now && row.claim_expires_at.is_none_or(|expires| expires <= now)
                })
                .collect();
            due.sort_by(|a, b| a.due_at.total_cmp(&b.due_at));
            let mut claimed: Vec<Notification> = due
                .into_iter()
                .take(max as usize)
                .map(|row| {
                    row.notification.claim_epoch += 1;
                    row.claim_expires_at = Some(now + ttl_seconds(claim_ms));
                    row.notification.clone()
                })
                .collect();
            crate::notify::in_event_order(&mut claimed);
            Ok(claimed)
        })
    }

    async fn settle_notification(
        &self,
        id: &str,
        epoch: i64,
        settlement: Settlement,
    ) -> Result<bool> {
        self.write(|state, now| {
            let Some(row) = state
                .outbox
                .get_mut(id)
                .filter(|row| row.notification.claim_epoch == epoch)
            else {
                return Ok(false);
            };
            match settlement {
                Settlement::Finished => {
                    state.outbox.remove(id);
                }
                Settlement::Retry {
                    delivered_to,
                    after_ms,
                } => {
                    row.notification.delivered_to = delivered_to;
                    row.notification.attempts += 1;
                    row.due_at = now + ttl_seconds(after_ms);
                    row.claim_expires_at = None;
                }
            }
            Ok(true)
        })
    }

    async fn purge_notifications(&self, retention_ms: u64) -> Result<u64> {
        self.write(|state, now| {
            let before = state.outbox.len();
            state
                .outbox
                .retain(|_, row| row.notification.created_at >= now - ttl_seconds(retention_ms));
            Ok((before - state.outbox.len()) as u64)
        })
    }

    async fn notification_backlog(&self) -> Result<u64> {
        self.read(|state, now| {
            let backlog = state.outbox.values().filter(|row| {
                row.notification.kind != NotificationKind::Overdue || row.due_at <= now
            });
            Ok(backlog.count() as u64)
        })
    }
}
