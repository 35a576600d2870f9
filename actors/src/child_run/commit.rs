//! Terminal commit authority of one child run: the pure rules that decide, from what this node
//! wrote and what the store answered, whether the run's outcome is persisted, still pending, or
//! lost. No IO, no clock: the child-agent actor feeds it events and acts on its verdicts.
//!
//! The rules (spec section 6):
//! - An outcome counts as persisted only when this node's own compare-and-set was acknowledged.
//!   A matching row written by someone else is not an acknowledgement.
//! - A rejected compare-and-set has no fallback: with nothing else in flight, the run is fenced.
//! - A write whose answer never came is unknown: it fences at the lease deadline, or as soon as a
//!   renewal shows the row changed under it, and a late answer never revives the run.
//! - A write the store answered "outcome unknown" (its connection dropped mid-statement) is
//!   re-read and reconciled, never guessed: the same compare-and-set is sent again, and it can
//!   write only a row still live and ours. If the first did commit, the second is refused and the
//!   run is fenced: the workflow reads the outcome the row holds.
//! - An acknowledgement confirms exactly the outcome its own attempt carried, never a newer local
//!   decision; once an outcome is acknowledged, later local decisions are ignored.
//! - A durable cancel request still reaches a run whose terminal write is pending.

use std::collections::BTreeMap;

use store::{CancelAction, RunOutcome};

/// Identifies one compare-and-set sent to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AttemptId(u64);

/// A compare-and-set the caller must send.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempt {
    pub id: AttemptId,
    pub outcome: RunOutcome,
}

/// What the store said about a lease renewal of the run.
#[derive(Debug, Clone, PartialEq)]
pub enum Renewal {
    /// Renewed; a durable cancel request may ride along.
    Renewed { cancel: Option<CancelAction> },
    /// Refused: the row is no longer live and ours (terminal, claimed by another node, expired).
    Refused,
}

/// What the caller must do after an event.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Nothing to do yet.
    Wait,
    /// The outcome is persisted by this node's own acknowledged write: stop renewing, report it.
    Persisted(RunOutcome),
    /// Ownership is lost: stop the run's writes at once; its fate is not this node's to report.
    Fenced,
    /// A durable cancel request arrived: stop the agent with this action.
    Cancel(CancelAction),
}

/// The authority's state for one run.
#[derive(Debug, Default)]
pub struct TerminalAuthority {
    /// The outcome this node decided on most recently, if any.
    decided: Option<RunOutcome>,
    /// Compare-and-sets sent and not yet answered.
    in_flight: BTreeMap<AttemptId, RunOutcome>,
    /// The outcome this node's own write was acknowledged for.
    acknowledged: Option<RunOutcome>,
    /// An attempt was abandoned without an answer: the row may have changed under us.
    unknown: bool,
    fenced: bool,
    /// The cancel action already handed to the agent, so a renewal does not repeat it.
    cancel_delivered: Option<CancelAction>,
    next_attempt: u64,
}

/// `acknowledged`, `is_pending`, `may_record_usage` and `stage` exist for the reference
/// scenarios below: the child-agent actor asks `decide`, `on_answer`, `on_renewal` and the like.
impl TerminalAuthority {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether ownership was lost.
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// The acknowledged outcome, if any.
    #[cfg(test)]
    pub fn acknowledged(&self) -> Option<&RunOutcome> {
        self.acknowledged.as_ref()
    }

    /// Whether a commit is staged or in flight without an acknowledgement.
    #[cfg(test)]
    pub fn is_pending(&self) -> bool {
        self.acknowledged.is_none() && !self.fenced && self.decided.is_some()
    }

    /// Whether token counts and other completion data may be written: only after this node's own
    /// acknowledged outcome, so they can never terminalise or recreate a row.
    #[cfg(test)]
    pub fn may_record_usage(&self) -> bool {
        self.acknowledged.is_some() && !self.fenced
    }

    /// Records the outcome this node decided on and returns the compare-and-set to send for it,
    /// or `None` when an outcome is already acknowledged or ownership is lost (a late decision
    /// never replaces a persisted outcome).
    pub fn decide(&mut self, outcome: RunOutcome) -> Option<Attempt> {
        if self.fenced || self.acknowledged.is_some() {
            return None;
        }
        self.decided = Some(outcome.clone());
        let id = AttemptId(self.next_attempt);
        self.next_attempt += 1;
        self.in_flight.insert(id, outcome.clone());
        Some(Attempt { id, outcome })
    }

    /// Records a decision without sending it yet (the commit is staged).
    #[cfg(test)]
    pub fn stage(&mut self, outcome: RunOutcome) {
        if !self.fenced && self.acknowledged.is_none() {
            self.decided = Some(outcome);
        }
    }

    /// The store answered attempt `id`: `finalized` says whether this node's compare-and-set wrote
    /// the row.
    pub fn on_answer(&mut self, id: AttemptId, finalized: bool) -> Verdict {
        let Some(outcome) = self.in_flight.remove(&id) else {
            return Verdict::Wait;
        };
        if self.fenced {
            // A late acknowledgement cannot revive a fenced run.
            return Verdict::Fenced;
        }
        if finalized {
            // The row holds exactly this attempt's outcome, written by this node; no later
            // compare-and-set can overwrite it, so this is the outcome whatever was decided since.
            self.acknowledged = Some(outcome.clone());
            self.decided = Some(outcome.clone());
            return Verdict::Persisted(outcome);
        }
        if self.acknowledged.is_some() || !self.in_flight.is_empty() {
            // Another attempt of ours holds (or may hold) the row: settle on its answer.
            return Verdict::Wait;
        }
        self.fenced = true;
        Verdict::Fenced
    }

    /// Attempt `id` will never be answered (the caller gave up, the acknowledgement was lost):
    /// its outcome is unknown.
    pub fn on_unknown(&mut self, id: AttemptId) -> Verdict {
        if self.in_flight.remove(&id).is_some() {
            self.unknown = true;
        }
        Verdict::Wait
    }

    /// The store answered that it cannot tell whether attempt `id` wrote the row. Returns the
    /// outcome to send again after a wait, as the reconciling read: the same compare-and-set,
    /// which writes only if the first did not. When the run is fenced, an outcome is
    /// acknowledged or another attempt of ours is in flight (its answer settles the row), the
    /// attempt counts as abandoned instead ([`TerminalAuthority::on_unknown`]).
    pub fn on_unknown_answer(&mut self, id: AttemptId) -> Option<RunOutcome> {
        if !self.in_flight.contains_key(&id) {
            return None;
        }
        if self.fenced || self.acknowledged.is_some() || self.in_flight.len() > 1 {
            self.on_unknown(id);
            return None;
        }
        self.in_flight.remove(&id);
        self.decided.clone()
    }

    /// Attempt `id` surely wrote nothing (the store proved it: the database was unreachable).
    /// Returns the outcome to send again, after a wait: the decided one, unless ownership was
    /// lost, an outcome is acknowledged, or another attempt of ours is in flight and will settle.
    pub fn on_not_written(&mut self, id: AttemptId) -> Option<RunOutcome> {
        self.in_flight.remove(&id)?;
        if self.fenced || self.acknowledged.is_some() || !self.in_flight.is_empty() {
            return None;
        }
        self.decided.clone()
    }

    /// The lease actor renewed the run's lease, or was refused.
    pub fn on_renewal(&mut self, renewal: Renewal) -> Verdict {
        if self.fenced {
            return Verdict::Fenced;
        }
        match renewal {
            Renewal::Renewed { cancel } => {
                if self.acknowledged.is_none()
                    && self.decided.is_some()
                    && self.in_flight.is_empty()
                    && self.unknown
                {
                    // Our write was abandoned and nothing of ours is in flight: nothing can ever
                    // acknowledge the decision, so keeping the lease would hold the row forever.
                    self.fenced = true;
                    return Verdict::Fenced;
                }
                match cancel {
                    Some(action) if self.cancel_delivered != Some(action) => {
                        self.cancel_delivered = Some(action);
                        Verdict::Cancel(action)
                    }
                    _ => Verdict::Wait,
                }
            }
            Renewal::Refused => {
                if let Some(outcome) = &self.acknowledged {
                    return Verdict::Persisted(outcome.clone());
                }
                if !self.in_flight.is_empty() {
                    // The row may hold our own commit whose acknowledgement is on its way: a
                    // matching durable row cannot replace it, so wait for it (or the deadline).
                    return Verdict::Wait;
                }
                self.fenced = true;
                Verdict::Fenced
            }
        }
    }

    /// The lease's confirmed deadline passed without an acknowledged renewal.
    pub fn on_deadline(&mut self) -> Verdict {
        if let Some(outcome) = &self.acknowledged {
            return Verdict::Persisted(outcome.clone());
        }
        self.fenced = true;
        Verdict::Fenced
    }
}

#[cfg(test)]
mod tests {
    //! The reference scenarios of terminal commit authority, as pure event sequences.

    use store::RunStatus;

    use super::*;

    fn outcome(status: RunStatus, error: Option<&str>) -> RunOutcome {
        RunOutcome {
            status,
            error: error.map(str::to_owned),
            output: None,
            stop_reason: None,
            total_tokens: 0,
            message_count: 0,
            failure: None,
        }
    }

    fn success() -> RunOutcome {
        outcome(RunStatus::Success, None)
    }

    fn sent(authority: &mut TerminalAuthority, outcome: RunOutcome) -> AttemptId {
        authority.decide(outcome).expect("an attempt to send").id
    }

    #[test]
    fn a_write_that_surely_wrote_nothing_is_sent_again_until_acknowledged() {
        let mut authority = TerminalAuthority::new();
        let first = sent(&mut authority, success());
        assert_eq!(authority.on_not_written(first), Some(success()));
        assert_eq!(authority.on_not_written(first), None, "answered once");
        // Nothing of ours is in flight and nothing was lost: a renewal keeps the run.
        assert_eq!(
            authority.on_renewal(Renewal::Renewed { cancel: None }),
            Verdict::Wait
        );
        let second = authority.decide(success()).expect("sent again").id;
        assert_eq!(
            authority.on_answer(second, true),
            Verdict::Persisted(success())
        );
    }

    #[test]
    fn a_write_that_wrote_nothing_is_not_sent_again_once_fenced_or_superseded() {
        let mut authority = TerminalAuthority::new();
        let first = sent(&mut authority, success());
        assert_eq!(authority.on_deadline(), Verdict::Fenced);
        assert_eq!(authority.on_not_written(first), None);

        let mut authority = TerminalAuthority::new();
        let first = sent(&mut authority, success());
        let interrupted = outcome(RunStatus::Interrupted, Some("cancelled"));
        let second = sent(&mut authority, interrupted.clone());
        assert_eq!(
            authority.on_not_written(first),
            None,
            "the newer attempt settles"
        );
        assert_eq!(
            authority.on_answer(second, true),
            Verdict::Persisted(interrupted)
        );
    }

    #[test]
    fn an_identical_row_written_by_a_peer_is_not_our_acknowledgement() {
        let mut authority = TerminalAuthority::new();
        authority.stage(success());
        // A peer finalised the row with the same status; our renewal is refused.
        assert_eq!(authority.on_renewal(Renewal::Refused), Verdict::Fenced);
        assert!(authority.acknowledged().is_none());
    }

    #[test]
    fn a_rejected_compare_and_set_fences_with_no_fallback() {
        let mut authority = TerminalAuthority::new();
        let id = sent(&mut authority, success());
        assert_eq!(authority.on_answer(id, false), Verdict::Fenced);
        assert!(
            !authority.may_record_usage(),
            "no completion write after a rejection"
        );
        assert_eq!(
            authority.decide(success()),
            None,
            "no second try after fencing"
        );
    }

    #[test]
    fn completion_data_waits_for_an_acknowledged_outcome_and_cannot_change_it() {
        let mut authority = TerminalAuthority::new();
        authority.stage(success());
        assert!(!authority.may_record_usage());
        let id = sent(&mut authority, success());
        assert_eq!(authority.on_answer(id, true), Verdict::Persisted(success()));
        assert!(authority.may_record_usage());
        assert_eq!(
            authority.decide(outcome(RunStatus::Error, Some("different outcome"))),
            None
        );
        assert_eq!(authority.acknowledged(), Some(&success()));
    }

    #[test]
    fn a_committed_attempt_waits_for_its_acknowledgement_after_a_refused_renewal() {
        let mut authority = TerminalAuthority::new();
        let id = sent(&mut authority, success());
        // The commit landed, its acknowledgement is held; the renewal sees a terminal row.
        assert_eq!(authority.on_renewal(Renewal::Refused), Verdict::Wait);
        assert!(authority.is_pending());
        assert_eq!(authority.on_answer(id, true), Verdict::Persisted(success()));
        assert!(!authority.is_fenced());
        assert_eq!(
            authority.on_renewal(Renewal::Refused),
            Verdict::Persisted(success())
        );
    }

    #[test]
    fn an_abandoned_attempt_has_no_positive_proof() {
        let mut authority = TerminalAuthority::new();
        let id = sent(&mut authority, success());
        assert_eq!(authority.on_unknown(id), Verdict::Wait);
        assert_eq!(authority.on_renewal(Renewal::Refused), Verdict::Fenced);
        assert!(authority.acknowledged().is_none());
    }

    #[test]
    fn an_answer_that_cannot_tell_is_settled_by_the_same_compare_and_set_sent_again() {
        let mut authority = TerminalAuthority::new();
        let first = sent(&mut authority, success());
        assert_eq!(authority.on_unknown_answer(first), Some(success()));
        assert_eq!(authority.on_unknown_answer(first), None, "answered once");
        // While the second is on its way the run keeps its lease: something will settle it.
        assert_eq!(
            authority.on_renewal(Renewal::Renewed { cancel: None }),
            Verdict::Wait
        );
        // The first wrote nothing: the second writes the row, and that is our acknowledgement.
        let second = sent(&mut authority, success());
        assert_eq!(
            authority.on_answer(second, true),
            Verdict::Persisted(success())
        );
    }

    #[test]
    fn an_unknown_answer_whose_write_landed_fences_when_it_is_sent_again() {
        let mut authority = TerminalAuthority::new();
        let first = sent(&mut authority, success());
        let again = authority.on_unknown_answer(first).expect("sent again");
        // The first did commit: the row is final, so the second compare-and-set is refused.
        let second = sent(&mut authority, again);
        assert_eq!(authority.on_answer(second, false), Verdict::Fenced);
        assert!(
            authority.acknowledged().is_none(),
            "a row we cannot prove ours"
        );
    }

    #[test]
    fn an_unknown_answer_beside_another_attempt_waits_for_that_one() {
        let mut authority = TerminalAuthority::new();
        let first = sent(&mut authority, success());
        let other = sent(&mut authority, outcome(RunStatus::Error, Some("cancelled")));
        assert_eq!(authority.on_unknown_answer(first), None);
        assert_eq!(
            authority.on_answer(other, true),
            Verdict::Persisted(outcome(RunStatus::Error, Some("cancelled")))
        );
    }

    #[test]
    fn an_abandoned_attempt_fences_even_if_the_row_stayed_live() {
        let mut authority = TerminalAuthority::new();
        let id = sent(&mut authority, success());
        authority.on_unknown(id);
        assert_eq!(
            authority.on_renewal(Renewal::Renewed { cancel: None }),
            Verdict::Fenced,
            "an exited, unconfirmed writer must not keep renewing forever"
        );
    }

    #[test]
    fn different_attempts_settle_without_borrowing_each_others_acknowledgement() {
        let mut authority = TerminalAuthority::new();
        let success_attempt = sent(&mut authority, success());
        let failure_attempt = sent(&mut authority, outcome(RunStatus::Error, Some("losing")));
        // The failure's compare-and-set finds the row already terminal (the success committed).
        assert_eq!(authority.on_answer(failure_attempt, false), Verdict::Wait);
        assert!(authority.is_pending());
        assert_eq!(
            authority.on_answer(success_attempt, true),
            Verdict::Persisted(success())
        );
        assert!(!authority.is_fenced());
    }

    #[test]
    fn an_unknown_commit_fences_at_the_deadline_and_a_late_acknowledgement_cannot_revive() {
        let mut authority = TerminalAuthority::new();
        let id = sent(&mut authority, success());
        assert_eq!(authority.on_deadline(), Verdict::Fenced);
        assert_eq!(authority.on_answer(id, true), Verdict::Fenced);
        assert!(authority.acknowledged().is_none());
        assert!(!authority.may_record_usage());
    }

    #[test]
    fn a_staged_terminal_still_receives_a_durable_cancellation_once() {
        let mut authority = TerminalAuthority::new();
        let _in_flight = sent(&mut authority, success());
        let cancel = Renewal::Renewed {
            cancel: Some(CancelAction::Rollback),
        };
        assert_eq!(
            authority.on_renewal(cancel.clone()),
            Verdict::Cancel(CancelAction::Rollback)
        );
        assert_eq!(authority.on_renewal(cancel), Verdict::Wait);
        assert!(!authority.is_fenced());
    }

    #[test]
    fn an_older_acknowledgement_confirms_only_its_own_outcome() {
        let mut authority = TerminalAuthority::new();
        let interrupted = sent(&mut authority, outcome(RunStatus::Interrupted, None));
        let rolled_back = sent(
            &mut authority,
            outcome(RunStatus::Error, Some("rolled back by user")),
        );
        // The newer decision's compare-and-set wins the row; the older one is refused.
        assert_eq!(
            authority.on_answer(rolled_back, true),
            Verdict::Persisted(outcome(RunStatus::Error, Some("rolled back by user")))
        );
        assert_eq!(authority.on_answer(interrupted, false), Verdict::Wait);
        assert_eq!(
            authority.acknowledged(),
            Some(&outcome(RunStatus::Error, Some("rolled back by user")))
        );
        assert!(!authority.is_fenced());
    }

    #[test]
    fn an_acknowledged_outcome_rejects_late_conflicting_local_decisions() {
        let mut authority = TerminalAuthority::new();
        let id = sent(&mut authority, success());
        authority.on_answer(id, true);
        assert_eq!(
            authority.decide(outcome(RunStatus::Error, Some("late cancellation"))),
            None
        );
        authority.stage(outcome(RunStatus::Error, Some("late failure")));
        assert_eq!(authority.acknowledged(), Some(&success()));
        assert_eq!(authority.on_deadline(), Verdict::Persisted(success()));
    }

    #[test]
    fn the_barrier_opens_only_on_our_own_acknowledgement() {
        let mut authority = TerminalAuthority::new();
        authority.stage(success());
        assert!(authority.is_pending());
        let id = sent(&mut authority, success());
        assert!(authority.is_pending());
        authority.on_answer(id, true);
        assert!(!authority.is_pending());
    }
}
