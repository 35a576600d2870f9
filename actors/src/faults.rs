//! Store faults for tests: a [`StoreFaults`] installed on a node makes chosen store calls hold
//! before they reach the database, hold or lose their answer after they committed, or fail. This
//! is how the races of terminal commit authority are made deterministic instead of timing luck.
//! Rules name an [`Operation`] (by its method's name, checked when the rule is added); each call
//! of the store handle names its operation, so matching is a comparison, not a lookup.
//! Production nodes install none, and then nothing here runs.

use std::sync::{Arc, Mutex};

use store::Operation;
use tokio::sync::Notify;

/// What to do to a matching store call.
#[derive(Clone)]
pub enum FaultAction {
    /// Announce on `reached`, then wait for `release` before the call reaches the store.
    HoldBefore {
        reached: Arc<Notify>,
        release: Arc<Notify>,
    },
    /// Let the call commit, announce on `reached`, then hold its answer until `release`.
    HoldAnswer {
        reached: Arc<Notify>,
        release: Arc<Notify>,
    },
    /// Let the call commit, then lose its answer: the caller sees an unknown outcome.
    DropAnswer,
    /// Fail without reaching the store.
    Fail(store::Error),
}

#[derive(Clone)]
struct Rule {
    call: Operation,
    /// Only calls about this run (or other key); `None` matches every call of that name.
    key: Option<String>,
    action: FaultAction,
    remaining: usize,
}

/// The faults installed on a node, shared by every clone of its store handle.
#[derive(Clone, Default)]
pub struct StoreFaults {
    rules: Arc<Mutex<Vec<Rule>>>,
}

impl std::fmt::Debug for StoreFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rules = self.rules.lock().map(|rules| rules.len()).unwrap_or(0);
        write!(f, "StoreFaults({rules} rules)")
    }
}

impl StoreFaults {
    /// Applies `action` to the next `times` calls of the operation named `call` (the store
    /// method's name, [`Operation::name`]).
    ///
    /// # Panics
    ///
    /// When `call` names no store operation: a fault that could never fire is the test's
    /// mistake, better told at once than found as a test that proves nothing.
    pub fn add(&self, call: &str, action: FaultAction, times: usize) {
        self.push(call, None, action, times);
    }

    /// Like [`StoreFaults::add`], for calls about `key` only (a run id).
    ///
    /// # Panics
    ///
    /// As [`StoreFaults::add`].
    pub fn add_for(&self, call: &str, key: &str, action: FaultAction, times: usize) {
        self.push(call, Some(key.to_owned()), action, times);
    }

    fn push(&self, call: &str, key: Option<String>, action: FaultAction, times: usize) {
        let Some(call) = Operation::parse(call) else {
            panic!("no store operation is named {call:?}");
        };
        if let Ok(mut rules) = self.rules.lock() {
            rules.push(Rule {
                call,
                key,
                action,
                remaining: times,
            });
        }
    }

    /// Removes every rule.
    pub fn clear(&self) {
        if let Ok(mut rules) = self.rules.lock() {
            rules.clear();
        }
    }

    pub(crate) fn take(&self, call: Operation, key: Option<&str>) -> Option<FaultAction> {
        let mut rules = self.rules.lock().ok()?;
        let index = rules.iter().position(|rule| {
            rule.call == call
                && rule.remaining > 0
                && (rule.key.is_none() || rule.key.as_deref() == key)
        })?;
        rules[index].remaining -= 1;
        let action = rules[index].action.clone();
        if rules[index].remaining == 0 {
            rules.remove(index);
        }
        Some(action)
    }
}
