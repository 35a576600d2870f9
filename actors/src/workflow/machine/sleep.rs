//! `sleep` (and `sleepUntil`): the durable timer as a call of its own. Its due time is fixed
//! when the call is first journaled (`ms` after that moment, or the `untilMs` it names) and
//! written with its entry, so a replay on any node waits for the same time; it resolves with
//! `null` once due (transitions: [`Sleep`], and the timer's own, `timer.rs`).

use runtime::{CallId, Command, JournalEntry, Outcome};
use serde_json::Value;
use store::StepCall;

use super::transitions::{Sleep, Transition};
use super::{Effect, Millis, Waiting, WorkflowMachine};

/// When a `sleep` call journaled at `now` is due.
pub(super) fn due_at(entry: &JournalEntry, now: Millis) -> Millis {
    match (entry.args["untilMs"].as_i64(), entry.args["ms"].as_i64()) {
        (Some(until), _) => until,
        (None, Some(ms)) => now.saturating_add(ms),
        // The runtime refused a sleep with neither before it was made.
        (None, None) => now,
    }
}

impl WorkflowMachine {
    /// A `sleep` call: waits for its due time (journaled with it, or read from the journal).
    pub(super) fn begin_sleep(&mut self, out: &mut Vec<Effect>, command: Command, now: Millis) {
        self.took(&command.step_id, Transition::Sleep(Sleep::Begun));
        let due_at_ms = self.dues.get(&command.seq).copied().unwrap_or(now);
        let id = command.id;
        self.waiting
            .insert(id, (Waiting::Timer(due_at_ms), command));
        self.wait_until(out, id, due_at_ms, now);
        self.park_if_only_waiting(out);
    }

    /// The timer of `sleep` call `id` fired: it resolves.
    pub(super) fn woke(&mut self, out: &mut Vec<Effect>, id: CallId, now: Millis) {
        let Some((_, command)) = self.waiting.get(&id) else {
            return;
        };
        self.took(&command.step_id, Transition::Sleep(Sleep::Woke));
        let due_at_ms = self.dues.get(&command.seq).copied();
        let call = StepCall::Sleep { due_at_ms };
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
