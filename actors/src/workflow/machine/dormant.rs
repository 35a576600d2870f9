//! Dormancy: a workflow whose script has waited only for timers, events and people for
//! `dormant_after` (`workflows.dormant_after_ms`) holds nothing on any node. One fenced write
//! (`WriteOp::GoDormant`) marks it dormant in the store and moves its lease, which then names no
//! owner, to expire at its earliest journaled due time (a sleep's due time, a wait's deadline, a
//! retry's due time, the workflow's `timeout_seconds`) less `dormant_after`, so that the node
//! that takes it over has replayed it and armed its timer in memory when the time comes (a
//! workflow due within `dormant_after` stays where it is), or never when only a control or an
//! event can wake it; then the supervisor stops, not abandoned: nothing is to be taken back. Whoever
//! records a control or an event for it expires that lease at once, in the same transaction, and
//! the change bus cues every node; a node takes it over as automatic recovery takes a workflow
//! over (epoch + 1) and replays its journal, which holds every due time. Only a workflow that
//! has nothing under way goes dormant: no child run, no call waiting for a slot, no write,
//! admission, capture or read in flight, nothing decided and unwritten.
//!
//! Transitions: [`Dormant`].

use store::WriteOp;

use super::transitions::{Dormant, Transition};
use super::{Effect, Event, Millis, Phase, Waiting, WorkflowMachine};

impl WorkflowMachine {
    /// Drops the VM of a script that only waits, and arms the check that leaves the workflow
    /// dormant if it is still parked `dormant_after` from now.
    pub(super) fn park(&mut self, out: &mut Vec<Effect>) {
        out.push(Effect::Park);
        self.set_loaded(false);
        self.parks += 1;
        self.arm_dormant_check(out);
    }

    fn arm_dormant_check(&self, out: &mut Vec<Effect>) {
        if let Some(delay) = self.config.dormant_after {
            out.push(Effect::After {
                delay,
                event: Event::DormantCheck { parked: self.parks },
            });
        }
    }

    /// The check armed at park number `parked`: the workflow goes dormant if it has stayed
    /// parked since and nothing of it is under way (then it looks again `dormant_after` later).
    pub(super) fn on_dormant_check(&mut self, out: &mut Vec<Effect>, parked: u64, now: Millis) {
        if parked != self.parks || !matches!(self.phase, Phase::Live { loaded: false, .. }) {
            self.took_dormant(Dormant::Woken);
            return;
        }
        let Some((wake_at_ms, event_names)) = self.dormancy(now) else {
            self.took_dormant(Dormant::Busy);
            self.arm_dormant_check(out);
            return;
        };
        #[cfg(test)]
        let wake_at_ms = if crate::workflow::mutants::planted(
            crate::workflow::mutants::Mutant::DormantWakesEarly,
        ) {
            Some(0)
        } else {
            wake_at_ms
        };
        self.took_dormant(Dormant::Left);
        self.dormant = true;
        tracing::info!(parent: &self.span, wake_at_ms, "dormant: the workflow waits in the store");
        self.write(
            out,
            vec![WriteOp::GoDormant {
                workflow_id: self.config.workflow_id.clone(),
                wake_at_ms,
                event_names,
            }],
        );
        out.push(Effect::Count {
            name: "reins_workflows_dormant_total",
            labels: Vec::new(),
        });
        self.halt(out, false);
    }

    /// When the parked workflow is to be woken (`dormant_after` before its earliest due time;
    /// `None`: only a control or an event wakes it) and the names of the events it waits for;
    /// `None` while anything of it is under way, or its due time is that close.
    fn dormancy(&self, now: Millis) -> Option<(Option<Millis>, Vec<String>)> {
        let settled = self.unwritten.ops.is_empty()
            && self.unwritten.events.is_empty()
            && self.writes.is_empty()
            && self.carried.is_none()
            && self.detached.is_empty()
            && self.closing.is_empty()
            && self.slot_waits.is_empty()
            && self.answer_waits.is_empty()
            && !self.capturing;
        if !settled || self.waiting.is_empty() {
            return None;
        }
        let mut wake_at_ms = self.deadline_ms();
        let mut event_names = Vec::new();
        for (waiting, command) in self.waiting.values() {
            let due = match waiting {
                Waiting::Timer(due_at_ms) => Some(*due_at_ms),
                Waiting::Control(_) => self.dues.get(&command.seq).copied(),
                Waiting::Event(name) => {
                    event_names.push(name.clone());
                    self.dues.get(&command.seq).copied()
                }
                Waiting::Slot | Waiting::Child(_) => return None,
            };
            wake_at_ms = match (wake_at_ms, due) {
                (Some(at), Some(due)) => Some(at.min(due)),
                (at, due) => at.or(due),
            };
        }
        let lead = self.config.dormant_after.map_or(0, |after| {
            Millis::try_from(after.as_millis()).unwrap_or(Millis::MAX)
        });
        match wake_at_ms {
            Some(due) if due.saturating_sub(now) < lead => None,
            due => Some((due.map(|due| due - lead), event_names)),
        }
    }

    /// Whether this owner left the workflow dormant (its halt is no end and no abandonment).
    pub(crate) fn is_dormant(&self) -> bool {
        self.dormant
    }

    fn took_dormant(&self, transition: Dormant) {
        self.took("", Transition::Dormant(transition));
    }
}
