//! Events sent to a workflow in the simulation store (see `crate::sent_events`).

use super::State;
use crate::sent_events::resent;
use crate::{Error, EventSend, NewSentEvent, Result, SentEvent, WorkflowId};

impl State {
    pub(super) fn send_event(&mut self, new: NewSentEvent, now: f64) -> Result<EventSend> {
        let Some(workflow) = self.workflows.get(&new.workflow_id) else {
            return Err(Error::NotFound(format!(
                "workflow {:?}",
                new.workflow_id.as_str()
            )));
        };
        // A repeat is answered whether or not the workflow ended since.
        if let Some(existing) = self
            .sent_events
            .values()
            .find(|row| row.workflow_id == new.workflow_id && row.event_id == new.event_id)
        {
            return resent(existing.clone(), &new);
        }
        if workflow.row.status.is_final() {
            return Ok(EventSend::Ended(workflow.row.status));
        }
        let (untaken, held) = self
            .sent_events
            .values()
            .filter(|row| row.workflow_id == new.workflow_id && row.taken_by.is_none())
            .fold((0_i64, 0_i64), |(count, bytes), row| {
                let size = i64::try_from(row.payload.to_string().len()).unwrap_or(i64::MAX);
                (count + 1, bytes.saturating_add(size))
            });
        new.bounds.check(untaken, held, new.payload_bytes())?;
        if self.mutant != Some(super::Mutant::EventNotCounted) {
            self.take_storage(&new.workflow_id, new.payload_bytes(), new.stored_bytes_max)?;
        }
        self.last_event_seq += 1;
        let row = SentEvent {
            seq: self.last_event_seq,
            workflow_id: new.workflow_id,
            event_id: new.event_id,
            name: new.name,
            payload: new.payload,
            created_by: new.created_by,
            created_at: now,
            taken_by: None,
        };
        self.sent_events.insert(row.seq, row.clone());
        self.wake_if_dormant(&row.workflow_id, Some(&row.name), now);
        Ok(EventSend::Stored(row))
    }

    pub(super) fn pending_events(
        &self,
        workflow_id: &WorkflowId,
        names: &[String],
        per_name: u32,
    ) -> Vec<SentEvent> {
        let mut found: std::collections::BTreeMap<&str, u32> = std::collections::BTreeMap::new();
        self.sent_events
            .values()
            .filter(|event| {
                event.workflow_id == *workflow_id
                    && event.taken_by.is_none()
                    && (names.contains(&event.name)
                        || self.mutant == Some(super::Mutant::PendingOfAnyName))
            })
            .filter(|event| {
                let count = found.entry(event.name.as_str()).or_default();
                *count += 1;
                *count <= per_name
            })
            .cloned()
            .collect()
    }

    /// Refuses [`crate::WriteOp::TakeEvent`] of event `seq` unless it is `workflow_id`'s and
    /// untaken, or taken by `step_id` already.
    pub(super) fn check_take(
        &self,
        workflow_id: &WorkflowId,
        seq: i64,
        step_id: &str,
    ) -> Result<()> {
        match self.sent_events.get(&seq) {
            Some(event)
                if event.workflow_id == *workflow_id
                    && event
                        .taken_by
                        .as_deref()
                        .is_none_or(|taken| taken == step_id) =>
            {
                Ok(())
            }
            _ => Err(Error::NotFound(format!(
                "event {seq} of workflow {workflow_id:?} untaken"
            ))),
        }
    }

    /// Every event sent to any workflow, oldest first: what the simulation's oracle reads.
    pub(super) fn all_sent_events(&self) -> Vec<SentEvent> {
        self.sent_events.values().cloned().collect()
    }
}
