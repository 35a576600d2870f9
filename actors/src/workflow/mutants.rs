//! Bugs a test plants on purpose, to prove that the simulation's oracle finds them: each is
//! named after the rule it breaks, and each has a test in `sim.rs` (its name contains
//! `mutant`) that runs seeds with it planted and asserts the oracle names the broken rule. A
//! mutant the seeds do not find is a gap in the oracle to close, not a test to delete.
//!
//! Only in test builds. A mutant is planted for the current thread (the simulation runs a seed
//! on one thread), so tests running at once on other threads never see it. The bugs of the
//! simulation store itself are [`store::SimMutant`]s, planted through the store.

use std::cell::Cell;

/// A known bug in the workflow's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mutant {
    /// A `complete` reconcile records another output than the one the operator gave.
    ReconcileAltersTheOutput,
    /// A workflow's end keeps its lease: the end's write gives it no longer back.
    LeaseKeptAfterTheEnd,
    /// A child run that ends during a cancellation is never noticed: the cancel never finishes.
    CancelNeverFinishes,
    /// A call queued for a slot is never asked again: neither a freed slot nor the fallback
    /// wakes it.
    QueuedCallNeverWoken,
    /// A child run closed by the orphan sweep is reported as one whose outcome is unknown.
    OrphanReportedAsOutcomeUnknown,
    /// A workflow that ends gives nothing of its grants back: the unused room stays counted
    /// against its owner's quota.
    StorageKeptAfterTheEnd,
    /// An artifact is written with no grant of its owner's quota taken for it.
    ArtifactWithoutGrant,
    /// A journal row's error is written with no grant of its owner's quota taken for it.
    ErrorWithoutGrant,
    /// A durable timer fires as soon as it is armed, before its due time.
    TimerFiresEarly,
    /// A failed attempt is retried whatever its policy's `maxAttempts` says.
    AttemptsUnbounded,
    /// An idempotent agent's run of unknown outcome is taken for closed while it still lives:
    /// the next attempt does not wait for it to be final.
    ClosingNotAwaited,
    /// A `waitForEvent` takes the oldest event whatever its name.
    EventOfAnyName,
    /// A wait's deadline answers it at once, without recording its answer as a control: a
    /// person's answer recorded first is ignored.
    DeadlineDecidesAlone,
    /// A workflow going dormant asks to be woken at once, whatever its journal's due times.
    DormantWakesEarly,
}

thread_local! {
    static PLANTED: Cell<Option<Mutant>> = const { Cell::new(None) };
}

/// Whether `mutant` is planted on this thread.
pub(crate) fn planted(mutant: Mutant) -> bool {
    PLANTED.with(|planted| planted.get() == Some(mutant))
}

/// Plants `mutant` on this thread until the guard is dropped.
pub(crate) fn plant(mutant: Mutant) -> Planted {
    PLANTED.with(|planted| planted.set(Some(mutant)));
    Planted
}

/// Removes the planted mutant when dropped (a failing test must not leave it to the next).
pub(crate) struct Planted;

impl Drop for Planted {
    fn drop(&mut self) {
        PLANTED.with(|planted| planted.set(None));
    }
}
