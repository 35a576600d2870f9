//! Every transition a call can take, by call kind: the table each kind's module implements,
//! one variant a row (what the call was waiting for, what came, what it does next). The
//! machine names each transition as it takes it ([`WorkflowMachine::took`], a `debug` line of
//! the workflow's span), and the tests check that every row here is taken by some test
//! (`tests::every_transition_is_covered_by_a_test`, after Temporal's `transition_coverage.rs`).
//! A new call kind is declared in `runtime/src/call_kinds.rs`, then one module of `machine/`
//! and one table here (ARCHITECTURE.md has the whole recipe).

use std::cell::RefCell;
use std::collections::BTreeSet;

use super::WorkflowMachine;

macro_rules! table {
    ($(#[$meta:meta])* $name:ident { $($(#[$doc:meta])* $row:ident,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        pub(crate) enum $name {
            $($(#[$doc])* $row,)*
        }

        impl $name {
            /// Every row of the table.
            #[cfg(test)]
            pub(crate) const ALL: &'static [$name] = &[$($name::$row,)*];
        }
    };
}

table! {
    /// `agent`: a child run admitted under the step's idempotency key, followed to its end.
    Agent {
        /// New call: asks for its admission (a slot, and the run).
        Begun,
        /// Admitted: follows the new run (journaled `running`, naming it).
        Admitted,
        /// No slot: journaled `queued`, waits for a freed slot's cue or the fallback.
        Queued,
        /// A cue or the fallback came while queued: asks for the admission again.
        WokenForSlot,
        /// The store wrote nothing: asks again after a backoff (the key finds the same run).
        AdmissionRetried,
        /// Refused (say, an unknown agent): the step fails.
        Refused,
        /// Refused for a lost lease: the workflow stops here, nothing written.
        Fenced,
        /// The admission's outcome is unknown: the owner stops, recovery reads what exists.
        AdmissionUnknown,
        /// A run of this attempt exists and the orphan sweep closed it: an operator decides.
        FoundOrphaned,
        /// A run of this attempt exists and ended: its outcome is the step's.
        FoundEnded,
        /// A run of this attempt exists and waits for a person: followed as the first owner did.
        FoundWaiting,
        /// A run of this attempt exists with no outcome: an operator decides.
        FoundLive,
        /// The run ended with its outcome recorded: the step concludes with it.
        Ended,
        /// The run waits for a person's answer: waits for the answer's cue or the fallback.
        WaitsForAnswer,
        /// The answer's cue or the fallback came: the run's row is read again.
        AnswerCue,
        /// The run's row could not be read (the database is unreachable): read again later.
        ReadRetried,
        /// The run ended without its node recording the end: an operator decides.
        EndUnrecorded,
        /// The script no longer awaits the call (its `parallel` failed): its run is asked to
        /// stop.
        Detached,
        /// A detached call's run ended: journaled `cancelled`, its slot given back.
        DetachedEnded,
        /// The attempt failed and its policy retries it: journaled `failed`, its slot given
        /// back, the next attempt journaled `queued` behind its durable timer (`retry.rs`).
        RetryScheduled,
        /// The next attempt's timer fired: its admission is asked for (a new run).
        RetryDue,
        /// An idempotent agent's run has no outcome anyone can vouch for: it is asked to stop
        /// and followed until final, then the step goes on from its row.
        Closing,
        /// The run being closed is not final yet: its row is read again after a while.
        StillClosing,
    }
}

table! {
    /// `sleep`: waits for its durable timer, due at the time journaled with the call.
    Sleep {
        /// New (or replayed) call: waits until its due time.
        Begun,
        /// Due: resolves with `null`.
        Woke,
    }
}

table! {
    /// The durable timer a call waits for (`timer.rs`): a sleep, or an agent's next attempt.
    Timer {
        /// The call waits until its journaled due time.
        Armed,
        /// Woken before its time (a takeover's replay, a timer posted early): armed again.
        Early,
        /// Due: the call goes on.
        Fired,
    }
}

table! {
    /// `pause`: waits for a `resume` control of its step.
    Pause {
        /// New call: waits for its control.
        Begun,
        /// A `resume` came: resolves with its input.
        Resumed,
        /// Its deadline's `resume` came with no `onTimeout`: the step fails, status `timeout`.
        TimedOut,
    }
}

table! {
    /// `humanCheckpoint`: waits for a `decide` control bound to the artifact version it reviews.
    Checkpoint {
        /// New call: waits for its control.
        Begun,
        /// A decision came: resolves with it, who made it and when.
        Decided,
        /// Its deadline's decision was `fail`: the step fails, status `timeout`.
        TimedOut,
    }
}

table! {
    /// The deadline of a `pause` or `humanCheckpoint` (`deadline.rs`): its default answer is
    /// recorded as a control, through the same unique row a person's answer takes, so exactly
    /// one of them is the step's.
    Deadline {
        /// The deadline passed: its answer is recorded (unless one is already).
        Passed,
        /// Recorded, or a person's answer was there first: the controls are read and the one
        /// recorded is applied.
        Recorded,
        /// The store wrote nothing: the deadline fires again after a backoff.
        Retried,
    }
}

table! {
    /// `waitForEvent`: takes the oldest untaken event of its name (`event.rs`).
    EventWait {
        /// New call: reads the workflow's events (one sent before the wait is there).
        Begun,
        /// An event of its name: taken in the fenced write that journals the outcome.
        Delivered,
        /// Its deadline passed first: resolves with `null`.
        TimedOut,
        /// The events could not be read: read again after a backoff.
        ReadRetried,
    }
}

table! {
    /// `captureArtifact`: reads a file of the source step's workspace into the next artifact
    /// version.
    Capture {
        /// New call: the capture is carried out from the mailbox.
        Begun,
        /// The file was read: the next artifact version, written with the outcome.
        Captured,
        /// The file cannot be captured: the step fails, saying why.
        Failed,
    }
}

table! {
    /// `readArtifact`: reads an artifact version of the workflow.
    Read {
        /// New call: the read is carried out from the mailbox.
        Begun,
        /// The version exists: resolves with its content.
        Found,
        /// No such version: the step fails.
        Missing,
        /// The database is unreachable: read again after a backoff.
        Retried,
        /// Any other failure of the read: the workflow stops here.
        Failed,
    }
}

table! {
    /// The owner's storage quota, at any call whose outcome stores an artifact (`capture`,
    /// `agent`): see `storage.rs`.
    Storage {
        /// The artifact fits the room this workflow holds: the outcome goes on at once.
        WithinRoom,
        /// Written under a new grant: the outcome goes on once that write committed.
        Granted,
        /// The quota refused a whole grant: asked again for the artifact's own bytes.
        AskedOwnBytes,
        /// The quota refused the artifact's own bytes: the step fails naming the quota.
        Refused,
    }
}

table! {
    /// Dormancy (`dormant.rs`): the check armed when the VM was parked, `dormant_after` later.
    Dormant {
        /// Parked since and nothing under way: one fenced write leaves the workflow dormant in
        /// the store, and the supervisor stops.
        Left,
        /// Something is under way (a write, a read, a slot or a child): looks again later.
        Busy,
        /// The workflow was woken since (or is being cancelled): nothing to do.
        Woken,
    }
}

/// One transition of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Transition {
    Agent(Agent),
    Pause(Pause),
    Checkpoint(Checkpoint),
    Capture(Capture),
    Read(Read),
    Storage(Storage),
    Sleep(Sleep),
    Timer(Timer),
    Deadline(Deadline),
    EventWait(EventWait),
    Dormant(Dormant),
}

impl Transition {
    /// Every row of every table.
    #[cfg(test)]
    pub(crate) fn all() -> Vec<Transition> {
        let mut all: Vec<Transition> = Agent::ALL.iter().map(|&t| Transition::Agent(t)).collect();
        all.extend(Pause::ALL.iter().map(|&t| Transition::Pause(t)));
        all.extend(Checkpoint::ALL.iter().map(|&t| Transition::Checkpoint(t)));
        all.extend(Capture::ALL.iter().map(|&t| Transition::Capture(t)));
        all.extend(Read::ALL.iter().map(|&t| Transition::Read(t)));
        all.extend(Storage::ALL.iter().map(|&t| Transition::Storage(t)));
        all.extend(Sleep::ALL.iter().map(|&t| Transition::Sleep(t)));
        all.extend(Timer::ALL.iter().map(|&t| Transition::Timer(t)));
        all.extend(Deadline::ALL.iter().map(|&t| Transition::Deadline(t)));
        all.extend(EventWait::ALL.iter().map(|&t| Transition::EventWait(t)));
        all.extend(Dormant::ALL.iter().map(|&t| Transition::Dormant(t)));
        all
    }
}

thread_local! {
    /// The transitions taken on this thread, while a test records them.
    static TAKEN: RefCell<Option<BTreeSet<Transition>>> = const { RefCell::new(None) };
}

/// Runs `body` and answers the transitions taken on this thread meanwhile.
#[cfg(test)]
pub(crate) fn recorded(body: impl FnOnce()) -> BTreeSet<Transition> {
    TAKEN.with(|taken| *taken.borrow_mut() = Some(BTreeSet::new()));
    body();
    TAKEN.with(|taken| taken.borrow_mut().take().unwrap_or_default())
}

impl WorkflowMachine {
    /// Names a transition the machine takes for call `step_id`.
    pub(super) fn took(&self, step_id: &str, transition: Transition) {
        tracing::debug!(parent: &self.span, step_id, ?transition, "call transition");
        TAKEN.with(|taken| {
            if let Some(taken) = taken.borrow_mut().as_mut() {
                taken.insert(transition);
            }
        });
    }
}
