//! `waitForEvent`: takes the oldest event of its name sent to the workflow and not taken yet,
//! in the fenced write that journals its outcome ([`WriteOp::TakeEvent`]), so an event is
//! delivered to one wait at most, and a wait whose write is lost takes it again on replay. An
//! event sent before the wait is kept by the store until a wait takes it. A sent event wakes
//! the owner as a control does (the change bus, then [`Event::Poll`]); a wait with a deadline
//! resolves with `null` once it passes (transitions: [`EventWait`]).

use std::collections::{BTreeMap, VecDeque};

use runtime::{CallId, Command, Outcome};
use serde_json::Value;
use store::{SentEvent, StepCall, WriteOp};

use super::transitions::{EventWait, Transition};
use super::{Effect, Event, Millis, Then, Waiting, WorkflowMachine};
use crate::backoff::store_backoff;

impl WorkflowMachine {
    /// A new wait: reads the events already sent (a poll), and waits for its deadline, if it
    /// has one.
    pub(super) fn begin_wait_for_event(
        &mut self,
        out: &mut Vec<Effect>,
        command: Command,
        now: Millis,
    ) {
        self.took(&command.step_id, Transition::EventWait(EventWait::Begun));
        let name = command.args["name"].as_str().unwrap_or_default().to_owned();
        let id = command.id;
        self.arm_deadline(out, &command, now);
        self.waiting.insert(id, (Waiting::Event(name), command));
        self.park_if_only_waiting(out);
        // Through the mailbox: the events are read once this batch (a park among it) is done,
        // so an event found at once starts the script again after the park, not before it.
        out.push(Effect::Post(Event::Poll));
    }

    /// The read of the events some call waits for, if one does: the oldest untaken events of
    /// each name waited for, as many of each as there are waits for it, and as many more as
    /// this workflow took in writes not yet committed (a read may still return those).
    pub(super) fn events_to_read(&self) -> Option<Effect> {
        let mut waits: BTreeMap<&str, u32> = BTreeMap::new();
        for (waiting, _) in self.waiting.values() {
            if let Waiting::Event(name) = waiting {
                *waits.entry(name.as_str()).or_default() += 1;
            }
        }
        let most = waits.values().copied().max()?;
        let taken = u32::try_from(self.taken_events.len()).unwrap_or(u32::MAX);
        Some(Effect::ReadEvents {
            names: waits.keys().map(|name| (*name).to_owned()).collect(),
            per_name: most.saturating_add(taken),
        })
    }

    /// The workflow's untaken events, read as asked.
    pub(super) fn on_events(
        &mut self,
        out: &mut Vec<Effect>,
        result: Result<Vec<SentEvent>, store::Error>,
        now: Millis,
    ) {
        match result {
            Ok(events) => self.deliver_events(out, events.into(), now),
            Err(error) => {
                tracing::warn!(parent: &self.span, %error, "reading the workflow's events failed");
                let waiting = self.waiting.values().find_map(|(waiting, command)| {
                    matches!(waiting, Waiting::Event(_)).then(|| command.step_id.clone())
                });
                if let Some(step_id) = waiting {
                    self.took(&step_id, Transition::EventWait(EventWait::ReadRetried));
                    self.read_tries += 1;
                    out.push(Effect::After {
                        delay: store_backoff(self.read_tries),
                        event: Event::Poll,
                    });
                }
            }
        }
    }

    /// Hands the first event some wait takes to the oldest such wait; the rest go on after its
    /// activation (as controls do).
    pub(super) fn deliver_events(
        &mut self,
        out: &mut Vec<Effect>,
        mut events: VecDeque<SentEvent>,
        now: Millis,
    ) {
        let waits: Vec<(CallId, String)> = self
            .waiting
            .iter()
            .filter_map(|(id, (waiting, _))| match waiting {
                Waiting::Event(name) => Some((*id, name.clone())),
                _ => None,
            })
            .collect();
        #[cfg(test)]
        let any_name =
            crate::workflow::mutants::planted(crate::workflow::mutants::Mutant::EventOfAnyName);
        #[cfg(not(test))]
        let any_name = false;
        for (id, name) in waits {
            let Some(place) = events.iter().position(|event| {
                (any_name || event.name == name) && !self.taken_events.contains(&event.seq)
            }) else {
                continue;
            };
            let Some(event) = events.remove(place) else {
                continue;
            };
            let Some((_, command)) = self.waiting.get(&id) else {
                continue;
            };
            self.took(
                &command.step_id,
                Transition::EventWait(EventWait::Delivered),
            );
            let take = WriteOp::TakeEvent {
                workflow_id: self.config.workflow_id.clone(),
                seq: event.seq,
                step_id: command.step_id.clone(),
            };
            let call = StepCall::WaitForEvent {
                deadline_at_ms: self.dues.get(&command.seq).copied(),
                event_seq: Some(event.seq),
            };
            self.taken_events.insert(event.seq);
            self.conclude(
                out,
                id,
                Outcome::Resolved(event.payload),
                vec![take],
                Some(call),
                now,
            );
            out.push(Effect::Then(Then::Events(events)));
            return;
        }
    }

    /// The deadline of the wait of call `id` passed with no event: it resolves with `null`.
    pub(super) fn event_timed_out(&mut self, out: &mut Vec<Effect>, id: CallId, now: Millis) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        self.took(&command.step_id, Transition::EventWait(EventWait::TimedOut));
        let call = StepCall::WaitForEvent {
            deadline_at_ms: self.dues.get(&command.seq).copied(),
            event_seq: None,
        };
        self.conclude(
            out,
            id,
            Outcome::Resolved(Value::Null),
            Vec::new(),
            Some(call),
            now,
        );
    }
}
