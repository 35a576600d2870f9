//! The notification outbox in the simulation: a row per inbox event (and a reminder, due later,
//! for a wait with `remindAfterMs`), written where the real stores' triggers write them
//! (`State::event`), with each webhook's delivery of it claimed, settled and purged as they do
//! (migration 42), none committed before the webhook was first configured (migration 43).

use std::collections::BTreeMap;

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

/// One row of the outbox with each webhook's delivery of it.
#[derive(Debug, Clone)]
pub(super) struct OutboxRow {
    /// The row as a claim reads it; its `attempts` and `claim_epoch` are a delivery's.
    notification: Notification,
    due_at: f64,
    /// By webhook (`notify_deliveries`), written the first time one is claimed.
    deliveries: BTreeMap<String, Delivery>,
}

/// One webhook's delivery of a row: its attempts, schedule and claim.
#[derive(Debug, Clone, Default)]
struct Delivery {
    attempts: u32,
    due_at: f64,
    settled: bool,
    claim_epoch: i64,
    claim_expires_at: Option<f64>,
}

impl Delivery {
    /// Whether a claim may take it at `now`.
    fn open(&self, now: f64) -> bool {
        !self.settled && self.due_at <= now && self.claim_expires_at.is_none_or(|at| at <= now)
    }

    /// Whether a claim holds it at `now`.
    fn in_flight(&self, now: f64) -> bool {
        self.claim_expires_at.is_some_and(|at| at > now)
    }
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
        // What a pause was resumed with, as migration 43's trigger adds it: the control's
        // `input`, when it has one (a deadline's without `onTimeout` has none).
        let input = (kind == "pause_resumed")
            .then(|| {
                self.controls.values().find(|control| {
                    control.workflow_id == *workflow_id
                        && control.kind == crate::ControlKind::Resume
                        && json!(control.step_id) == data["step_id"]
                        && json!(control.attempt) == data["attempt"]
                })
            })
            .flatten()
            .and_then(|control| control.body.get("input").cloned());
        let Some(workflow) = self.workflows.get(workflow_id) else {
            return;
        };
        let mut data = data.clone();
        if let Some(input) = input {
            data["input"] = input;
        }
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
            (
                "title",
                crate::WorkflowDoc::title_of(&workflow.row.data).map(Value::from),
            ),
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
                data: crate::NotificationData::decode(&data),
                user_email: user.map(|user| user.email.clone()),
                user_role: user.map(|user| user.role.as_str().to_owned()),
                user_id: Some(user_id),
                created_at: now,
                attempts: 0,
                claim_epoch: 0,
            },
            due_at: now,
            deliveries: BTreeMap::new(),
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
    async fn register_notify_target(&self, target: &str) -> Result<bool> {
        self.write(|state, now| {
            if state.notify_targets.contains_key(target) {
                return Ok(false);
            }
            state.notify_targets.insert(target.to_owned(), now);
            Ok(true)
        })
    }

    async fn claim_notifications(
        &self,
        owner: &str,
        target: &str,
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
            let busy: Vec<&WorkflowId> = state
                .outbox
                .values()
                .filter(|row| {
                    row.deliveries
                        .get(target)
                        .is_some_and(|delivery| delivery.in_flight(now))
                })
                .map(|row| &row.notification.workflow_id)
                .collect();
            // None committed before the webhook was first configured.
            let since = state
                .notify_targets
                .get(target)
                .copied()
                .unwrap_or(f64::NEG_INFINITY);
            // Each free workflow's oldest open delivery, by (created_at, seq).
            let mut heads: BTreeMap<&WorkflowId, &OutboxRow> = BTreeMap::new();
            for row in state.outbox.values() {
                let open = row.due_at <= now
                    && row.notification.created_at >= since
                    && row
                        .deliveries
                        .get(target)
                        .is_none_or(|delivery| delivery.open(now));
                let workflow = &row.notification.workflow_id;
                if !open || busy.contains(&workflow) {
                    continue;
                }
                let older = |head: &&OutboxRow| {
                    (head.notification.created_at, head.notification.seq)
                        <= (row.notification.created_at, row.notification.seq)
                };
                if !heads.get(workflow).is_some_and(older) {
                    heads.insert(workflow, row);
                }
            }
            // Owners take turns: each one's n-th oldest head ranks n.
            let mut by_owner: BTreeMap<&Option<String>, Vec<&OutboxRow>> = BTreeMap::new();
            for row in heads.into_values() {
                by_owner
                    .entry(&row.notification.user_id)
                    .or_default()
                    .push(row);
            }
            let mut turns: Vec<(usize, f64, String)> = Vec::new();
            for mut rows in by_owner.into_values() {
                rows.sort_by(|a, b| {
                    a.notification
                        .created_at
                        .total_cmp(&b.notification.created_at)
                        .then_with(|| a.notification.workflow_id.cmp(&b.notification.workflow_id))
                });
                for (turn, row) in rows.into_iter().enumerate() {
                    turns.push((
                        turn,
                        row.notification.created_at,
                        row.notification.id.clone(),
                    ));
                }
            }
            turns.sort_by(|a, b| {
                a.0.cmp(&b.0)
                    .then_with(|| a.1.total_cmp(&b.1))
                    .then_with(|| a.2.cmp(&b.2))
            });
            let mut claimed = Vec::new();
            for (_, _, id) in turns.into_iter().take(max as usize) {
                let Some(row) = state.outbox.get_mut(&id) else {
                    continue;
                };
                let delivery = row.deliveries.entry(target.to_owned()).or_default();
                delivery.claim_epoch += 1;
                delivery.claim_expires_at = Some(now + ttl_seconds(claim_ms));
                let mut notification = row.notification.clone();
                notification.attempts = delivery.attempts;
                notification.claim_epoch = delivery.claim_epoch;
                claimed.push(notification);
            }
            Ok(claimed)
        })
    }

    async fn settle_notification(
        &self,
        id: &str,
        target: &str,
        epoch: i64,
        settlement: Settlement,
        targets: &[String],
    ) -> Result<bool> {
        self.write(|state, now| {
            let Some(row) = state.outbox.get_mut(id) else {
                return Ok(false);
            };
            let Some(delivery) = row.deliveries.get_mut(target).filter(|delivery| {
                delivery.claim_epoch == epoch && delivery.claim_expires_at.is_some()
            }) else {
                return Ok(false);
            };
            delivery.claim_expires_at = None;
            match settlement {
                Settlement::Finished => {
                    delivery.settled = true;
                    // A webhook configured after the row committed never takes it.
                    let everyone = targets.iter().all(|target| {
                        row.deliveries
                            .get(target)
                            .is_some_and(|delivery| delivery.settled)
                            || state
                                .notify_targets
                                .get(target)
                                .is_some_and(|since| *since > row.notification.created_at)
                    });
                    if everyone {
                        state.outbox.remove(id);
                    }
                }
                Settlement::Retry { after_ms } => {
                    delivery.attempts += 1;
                    delivery.due_at = now + ttl_seconds(after_ms);
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
