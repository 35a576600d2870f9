//! Wakes a node's event streams when events may have committed, so a stream re-reads its
//! workflow's events at once instead of at its next fallback read.
//!
//! This is the one seam between the event streams and whatever learns of commits: the
//! [`crate::StoreHandle`] calls [`EventWakes::committed`] after each write of this node that may
//! have written events (a launch, a fenced write, an admission, a control, a takeover), and a
//! change bus that hears of commits on other nodes calls the same method. A wake is a hint: a
//! stream always reads the rows, so a spurious wake costs one query and a missed one costs the
//! fallback read's delay (`events.poll_ms`), never an event.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use store::WorkflowId;
use tokio::sync::watch;

/// One sender per workflow some stream of this node follows, and one for the feed.
pub struct EventWakes {
    workflows: Mutex<HashMap<WorkflowId, watch::Sender<u64>>>,
    feed: watch::Sender<u64>,
}

impl Default for EventWakes {
    fn default() -> Self {
        EventWakes {
            workflows: Mutex::new(HashMap::new()),
            feed: watch::Sender::new(0),
        }
    }
}

impl EventWakes {
    /// Something that may have written events of `workflow_id` committed; with
    /// `status_changed`, maybe a status change too, which the feed streams show.
    pub fn committed(&self, workflow_id: &WorkflowId, status_changed: bool) {
        let workflows = self
            .workflows
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = workflows.get(workflow_id) {
            sender.send_modify(|count| *count = count.wrapping_add(1));
        }
        drop(workflows);
        if status_changed {
            self.feed
                .send_modify(|count| *count = count.wrapping_add(1));
        }
    }

    /// Commits may have been missed (the change bus reconnected, or fell behind): every stream
    /// of this node reads again.
    pub fn resync(&self) {
        let workflows = self
            .workflows
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for sender in workflows.values() {
            sender.send_modify(|count| *count = count.wrapping_add(1));
        }
        drop(workflows);
        self.feed
            .send_modify(|count| *count = count.wrapping_add(1));
    }

    /// Wakes for one workflow's events, until dropped.
    pub fn workflow(self: &Arc<Self>, workflow_id: &WorkflowId) -> WorkflowWake {
        let mut workflows = self
            .workflows
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let receiver = workflows
            .entry(workflow_id.to_owned())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe();
        WorkflowWake {
            wakes: Arc::clone(self),
            workflow_id: workflow_id.to_owned(),
            receiver,
        }
    }

    /// Wakes for the feed.
    pub fn feed(&self) -> watch::Receiver<u64> {
        self.feed.subscribe()
    }

    /// Workflows some stream of this node follows (for tests and metrics).
    pub fn followed(&self) -> usize {
        self.workflows
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// A stream's wake for one workflow; the workflow's sender goes when its last wake does.
pub struct WorkflowWake {
    wakes: Arc<EventWakes>,
    workflow_id: WorkflowId,
    receiver: watch::Receiver<u64>,
}

impl WorkflowWake {
    /// Resolves at the next wake after the previous call (at once if one came meanwhile).
    pub async fn changed(&mut self) {
        // The sender lives in the map while this receiver does, so this never fails; if it
        // did, waiting forever would be right (the fallback read still runs).
        if self.receiver.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for WorkflowWake {
    fn drop(&mut self) {
        let mut workflows = self
            .wakes
            .workflows
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // This wake's own receiver still counts until the fields are dropped.
        if workflows
            .get(&self.workflow_id)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            workflows.remove(&self.workflow_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_commit_wakes_that_workflows_streams_and_the_last_one_cleans_up() {
        let wakes = Arc::new(EventWakes::default());
        let mut first = wakes.workflow(&WorkflowId::from("a"));
        let mut second = wakes.workflow(&WorkflowId::from("a"));
        let mut other = wakes.workflow(&WorkflowId::from("b"));
        let mut feed = wakes.feed();
        wakes.committed(&WorkflowId::from("a"), false);
        first.changed().await;
        second.changed().await;
        assert!(!other.receiver.has_changed().unwrap_or(true));
        assert!(!feed.has_changed().unwrap_or(true));
        wakes.committed(&WorkflowId::from("b"), true);
        other.changed().await;
        assert!(feed.changed().await.is_ok());
        drop(first);
        assert_eq!(wakes.followed(), 2);
        drop(second);
        drop(other);
        assert_eq!(wakes.followed(), 0);
    }
}
