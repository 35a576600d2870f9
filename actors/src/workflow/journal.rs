//! The journal as a takeover reads it: every stored step row parsed, the newest attempt of each
//! call kept, and the calls numbered 0, 1, 2, ... with none missing. A row that cannot be read is
//! named, never dropped: dropping it would shift every later call onto the wrong outcome.

use std::collections::BTreeMap;

use runtime::{CallKind, JournalEntry, Outcome};
use store::{StepKind, StepOutcome};

/// A journal row that cannot be replayed: the workflow is never replayed around it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("journal call {seq} (step {step_id:?}, attempt {attempt}): {problem}")]
pub(crate) struct UnreadableJournal {
    seq: i32,
    /// The step of the row (empty when the call is missing).
    pub(super) step_id: String,
    attempt: i32,
    problem: String,
}

/// The newest attempt of each call, and the journal they make: read whole, every row parsed and
/// the calls numbered 0, 1, 2, ... with none missing, or the first row that breaks this named.
/// Dropping a row would shift every later call onto the wrong outcome.
pub(super) fn newest_attempts(
    steps: Vec<store::StepRow>,
) -> (
    BTreeMap<u32, store::StepRow>,
    Result<Vec<JournalEntry>, UnreadableJournal>,
) {
    let unreadable = |step: &store::StepRow, problem: String| UnreadableJournal {
        seq: step.seq,
        step_id: step.step_id.clone(),
        attempt: step.attempt,
        problem,
    };
    let mut newest: BTreeMap<u32, store::StepRow> = BTreeMap::new();
    let mut out_of_range = None;
    for step in steps {
        let Ok(seq) = u32::try_from(step.seq) else {
            out_of_range.get_or_insert_with(|| {
                unreadable(&step, "its call number is out of range".to_owned())
            });
            continue;
        };
        if newest
            .get(&seq)
            .is_none_or(|known| known.attempt < step.attempt)
        {
            newest.insert(seq, step);
        }
    }
    let journal = match out_of_range {
        Some(error) => Err(error),
        None => (0u32..)
            .zip(&newest)
            .map(|(expected, (seq, step))| {
                if *seq != expected {
                    return Err(UnreadableJournal {
                        // Invariant: `expected` is below `seq`, which came from an `i32`.
                        seq: i32::try_from(expected).unwrap_or(i32::MAX),
                        step_id: String::new(),
                        attempt: 0,
                        problem: format!("missing (the next call journaled is {seq})"),
                    });
                }
                journal_entry(*seq, step).map_err(|problem| unreadable(step, problem))
            })
            .collect(),
    };
    (newest, journal)
}

/// A stored step as the runtime's journal entry.
fn journal_entry(seq: u32, step: &store::StepRow) -> Result<JournalEntry, String> {
    let record = step.record.as_ref().map_err(Clone::clone)?;
    Ok(JournalEntry {
        seq,
        kind: call_kind(record.kind()),
        step_id: step.step_id.clone(),
        args: record.args.clone(),
        outcome: record.outcome.clone().map(outcome),
        settled_at_ms: record.settled_at_ms,
    })
}

// The one list of call kinds, which `CallKind` and `StepKind` are both generated from.
include!("../../../runtime/src/call_kinds.rs");

macro_rules! kind_maps {
    ($($(#[$doc:meta])* $kind:ident = $name:literal,)*) => {
        /// The runtime's call kind of a stored step kind: the same variant.
        pub(crate) fn call_kind(kind: StepKind) -> CallKind {
            match kind {
                $(StepKind::$kind => CallKind::$kind,)*
            }
        }

        /// The stored step kind of the runtime's call kind: the same variant.
        pub(crate) fn step_kind(kind: CallKind) -> StepKind {
            match kind {
                $(CallKind::$kind => StepKind::$kind,)*
            }
        }
    };
}

with_call_kinds!(kind_maps);

/// The runtime's outcome of a stored one, and back.
pub(crate) fn outcome(stored: StepOutcome) -> Outcome {
    match stored {
        StepOutcome::Resolved(value) => Outcome::Resolved(value),
        StepOutcome::Rejected(value) => Outcome::Rejected(value),
    }
}

pub(crate) fn step_outcome(outcome: Outcome) -> StepOutcome {
    match outcome {
        Outcome::Resolved(value) => StepOutcome::Resolved(value),
        Outcome::Rejected(value) => StepOutcome::Rejected(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn row(seq: i32, step_id: &str, attempt: i32, data: Value) -> store::StepRow {
        stored(seq, step_id, attempt, "agent", data)
    }

    fn stored(seq: i32, step_id: &str, attempt: i32, kind: &str, data: Value) -> store::StepRow {
        let status = store::StepStatus::Completed;
        store::StepRow::decoded(seq, step_id.to_owned(), attempt, status, (kind, &data), 0.0)
    }

    fn settled(value: i64) -> Value {
        json!({"args": {}, "outcome": {"outcome": "resolved", "value": value}, "settled_at_ms": 7})
    }

    #[test]
    fn the_journal_is_the_newest_attempt_of_each_call_in_order() {
        let (newest, journal) = newest_attempts(vec![
            row(1, "b", 1, settled(2)),
            row(0, "a", 1, settled(1)),
            row(1, "b", 2, json!({"args": {}})),
        ]);
        let journal = journal.expect("readable");
        assert_eq!(newest[&1].attempt, 2);
        assert_eq!(journal.len(), 2);
        assert_eq!(journal[0].outcome, Some(Outcome::Resolved(json!(1))));
        assert_eq!(journal[0].settled_at_ms, Some(7));
        assert_eq!((journal[1].seq, journal[1].outcome.clone()), (1, None));
    }

    #[test]
    fn a_missing_call_is_named_never_skipped() {
        let error = newest_attempts(vec![row(0, "a", 1, settled(1)), row(2, "c", 1, settled(3))])
            .1
            .expect_err("a gap");
        assert_eq!((error.seq, error.step_id.as_str()), (1, ""));
        assert!(
            error.to_string().contains("next call journaled is 2"),
            "{error}"
        );
    }

    #[test]
    fn an_unreadable_row_is_named_never_dropped() {
        let bad_outcome = json!({"args": {}, "outcome": 42});
        let error = newest_attempts(vec![
            row(0, "a", 1, settled(1)),
            row(1, "b", 3, bad_outcome),
        ])
        .1
        .expect_err("unreadable outcome");
        assert_eq!(
            (error.seq, error.step_id.as_str(), error.attempt),
            (1, "b", 3)
        );
        let bad_kind = stored(0, "a", 1, "teleport", settled(1));
        assert!(newest_attempts(vec![bad_kind]).1.is_err());
        let bad_time = json!({"args": {}, "settled_at_ms": "noon"});
        assert!(newest_attempts(vec![row(0, "a", 1, bad_time)]).1.is_err());
        let (newest, journal) = newest_attempts(vec![row(-1, "z", 1, settled(1))]);
        assert!(newest.is_empty() && journal.is_err());
    }
}
