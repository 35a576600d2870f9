//! The durable timer: a call waits until a time journaled with it (a `sleep`, an `agent`
//! attempt its retry policy queued, or a wait's deadline, `deadline.rs`). The due time is in the journal, so a node that takes the workflow over waits
//! for the same time, not from zero, and a timer that came due while no node ran the workflow
//! fires at once. A workflow that waits only for timers (and people) is parked: its VM is
//! dropped, and it holds no slot (transitions: [`Timer`]).
//!
//! Time is the database's clock as the node reads it (`clock::now_ms`, the `now` each event
//! comes with), as for the workflow's `timeout_seconds` and its leases: nodes whose own clocks
//! disagree still fire a taken-over timer at the journaled time (within the error of reading the
//! database's clock: half a round trip).

use std::time::Duration;

use runtime::{CallId, CallKind};

use super::transitions::{Timer, Transition};
use super::{Effect, Event, Millis, Waiting, WorkflowMachine};

impl WorkflowMachine {
    /// Call `id` waits until `due_at_ms` (the journal holds that time already, or holds it in
    /// the write this decision made).
    pub(super) fn wait_until(
        &mut self,
        out: &mut Vec<Effect>,
        id: CallId,
        due_at_ms: Millis,
        now: Millis,
    ) {
        let Some((_, command)) = self.waiting.remove(&id) else {
            return;
        };
        self.waiting
            .insert(id, (Waiting::Timer(due_at_ms), command));
        self.arm(out, id, due_at_ms, now);
    }

    /// Arms the timer of call `id` for `due_at_ms`: [`Event::TimerDue`] then.
    pub(super) fn arm(&self, out: &mut Vec<Effect>, id: CallId, due_at_ms: Millis, now: Millis) {
        if let Some((_, command)) = self.waiting.get(&id) {
            self.took(&command.step_id, Transition::Timer(Timer::Armed));
        }
        let delay = until(due_at_ms, now);
        #[cfg(test)]
        let delay =
            if crate::workflow::mutants::planted(crate::workflow::mutants::Mutant::TimerFiresEarly)
            {
                Duration::ZERO
            } else {
                delay
            };
        out.push(Effect::After {
            delay,
            event: Event::TimerDue(id),
        });
    }

    /// The timer of call `id` says it is due: the call goes on, unless the time has not come
    /// (a timer posted before its time is armed again). A wait's timer is its deadline.
    pub(super) fn on_timer_due(&mut self, out: &mut Vec<Effect>, id: CallId, now: Millis) {
        let Some((waiting, command)) = self.waiting.get(&id).cloned() else {
            return;
        };
        let due_at_ms = match waiting {
            Waiting::Timer(due_at_ms) => due_at_ms,
            Waiting::Control(_) | Waiting::Event(_) => match self.dues.get(&command.seq) {
                Some(deadline) => *deadline,
                None => return,
            },
            Waiting::Slot | Waiting::Child(_) => return,
        };
        #[cfg(test)]
        let due_at_ms =
            if crate::workflow::mutants::planted(crate::workflow::mutants::Mutant::TimerFiresEarly)
            {
                now
            } else {
                due_at_ms
            };
        if now < due_at_ms {
            self.took(&command.step_id, Transition::Timer(Timer::Early));
            out.push(Effect::After {
                delay: until(due_at_ms, now),
                event: Event::TimerDue(id),
            });
            return;
        }
        self.took(&command.step_id, Transition::Timer(Timer::Fired));
        match command.kind {
            CallKind::Agent => self.next_attempt_due(out, id, now),
            CallKind::Sleep => self.woke(out, id, now),
            CallKind::Pause | CallKind::HumanCheckpoint => self.deadline_passed(out, id, &command),
            CallKind::WaitForEvent => self.event_timed_out(out, id, now),
            // A capture or a read waits for no timer.
            CallKind::CaptureArtifact | CallKind::ReadArtifact => {}
        }
    }
}

/// How long from `now` until `due_at_ms` (none if it has passed).
fn until(due_at_ms: Millis, now: Millis) -> Duration {
    Duration::from_millis(u64::try_from(due_at_ms.saturating_sub(now)).unwrap_or(0))
}
