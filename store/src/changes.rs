//! The change bus: a cue, sent only once a change committed, that something a node may be waiting
//! for happened: a control was recorded, a workflow's status changed, a child run began or stopped
//! waiting for a person, a child slot was freed while a step waits for one, a live workflow's
//! lease was given up (or a node stopped), or an event of a workflow some stream watches was
//! written. A change carries ids only, never data: whoever hears it
//! reads the committed rows it cares about. Hearing nothing proves nothing, so every consumer
//! also has a slow fallback timer, and [`Change::Resync`] tells it to re-check everything.
//!
//! On PostgreSQL the changes are `NOTIFY`s on the channel `reins_changes`, sent by triggers
//! (migrations 19 and 21) inside the transaction that makes the change, so they are delivered only if
//! it commits; one dedicated connection per node (`application_name = reins-listen`, never
//! from the pool) `LISTEN`s, reconnects with backoff, and sends `Resync` after every connect; a
//! status change the node's own write committed is also cued to its own subscribers as soon as
//! the commit returns, ahead of (and independent of) its `NOTIFY`. On
//! SQLite the same triggers are temporary ones of the writer's connection that collect payloads
//! in a temporary table; the writer drains it into the batch and broadcasts them after `COMMIT`.
//!
//! The payload is `KIND:ID` (at most 130 bytes, far below `NOTIFY`'s 8,000): `c:WORKFLOW`
//! (a control recorded), `w:WORKFLOW` (status changed), `r:WORKFLOW` (a child run of it began or
//! stopped waiting for input), `s:` (a slot freed while a step is queued), `n:` (a live
//! workflow's lease released, or a node stopped: recovery may find work), `e:WORKFLOW` (events of
//! it committed while an event stream watches it: its streams read again; migration 21).
//! Identical payloads of
//! one transaction arrive once (PostgreSQL collapses them), which loses nothing: each names only
//! what to read again.

use std::time::Duration;

use tokio::sync::broadcast;

use crate::WorkflowId;

/// The statement the listener runs on each connect: the channel the triggers notify.
pub(crate) const CHANGES_CHANNEL_SQL: &str = "LISTEN reins_changes";

/// The `application_name` of the listening connection (operators and tests find it by this).
pub const LISTEN_APPLICATION_NAME: &str = "reins-listen";

/// Changes buffered for a slow subscriber; one that falls further behind hears `Lagged`, which
/// it must take as [`Change::Resync`].
const BACKLOG: usize = 4096;

/// What changed. Consumers read the committed rows it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A control (resume, decide, cancel) or an event was recorded for this workflow: its owner
    /// acts on it.
    Control(WorkflowId),
    /// This workflow's status changed (terminal, waiting for a person, back to running...).
    Status(WorkflowId),
    /// A child run of this workflow began or stopped waiting for a person's answer.
    Input(WorkflowId),
    /// A child slot was freed while some step waits for one.
    SlotFreed,
    /// A live workflow's lease was given up, or a node stopped: recovery may find work.
    Recoverable,
    /// Events of this workflow committed while some event stream watches it
    /// ([`crate::Store::watch_events`]): a step's, a log line, an artifact...
    Event(WorkflowId),
    /// Changes may have been missed (the listener reconnected, a subscriber lagged): re-check
    /// everything that is waited on.
    Resync,
}

impl Change {
    /// Parses a payload; `None` for one this version does not know (a newer node's), which is
    /// ignored.
    pub fn parse(payload: &str) -> Option<Change> {
        let (kind, id) = payload.split_once(':')?;
        let id = WorkflowId::new(id);
        match kind {
            "c" if !id.as_str().is_empty() => Some(Change::Control(id)),
            "w" if !id.as_str().is_empty() => Some(Change::Status(id)),
            "r" if !id.as_str().is_empty() => Some(Change::Input(id)),
            "e" if !id.as_str().is_empty() => Some(Change::Event(id)),
            "s" => Some(Change::SlotFreed),
            "n" => Some(Change::Recoverable),
            _ => None,
        }
    }

    /// The workflow a change is about, if it is about one.
    pub fn workflow_id(&self) -> Option<&WorkflowId> {
        match self {
            Change::Control(id) | Change::Status(id) | Change::Input(id) | Change::Event(id) => {
                Some(id)
            }
            Change::SlotFreed | Change::Recoverable | Change::Resync => None,
        }
    }
}

/// The node's end of the bus: subscribe to hear every change committed from now on.
#[derive(Debug, Clone)]
pub struct Changes {
    sender: broadcast::Sender<Change>,
}

impl Changes {
    pub(crate) fn new() -> Changes {
        Changes {
            sender: broadcast::channel(BACKLOG).0,
        }
    }

    /// Every change from now on. A receiver that lags (`RecvError::Lagged`) must resync.
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.sender.subscribe()
    }

    /// Hands a committed change to every subscriber (nobody listening is fine).
    pub(crate) fn send(&self, change: Change) {
        let _ = self.sender.send(change);
    }

    /// Hands a payload on, if this version knows it.
    pub(crate) fn send_payload(&self, payload: &str) {
        match Change::parse(payload) {
            Some(change) => self.send(change),
            None => tracing::debug!(payload, "unknown change payload ignored"),
        }
    }
}

/// The first wait before the listener connects again; doubled up to [`LISTEN_RETRY_MAX`].
const LISTEN_RETRY_FIRST: Duration = Duration::from_millis(50);
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(2);

/// The wait before reconnect `failures` (1 for the first).
pub(crate) fn listen_backoff(failures: u32) -> Duration {
    LISTEN_RETRY_FIRST
        .saturating_mul(1u32 << failures.saturating_sub(1).min(10))
        .min(LISTEN_RETRY_MAX)
}

/// A task aborted when its handle is dropped (the listener lives as long as its store).
pub(crate) struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse_and_unknown_ones_are_ignored() {
        assert_eq!(
            Change::parse("c:w1"),
            Some(Change::Control(WorkflowId::new("w1")))
        );
        assert_eq!(
            Change::parse("w:w1"),
            Some(Change::Status(WorkflowId::new("w1")))
        );
        assert_eq!(
            Change::parse("r:w1"),
            Some(Change::Input(WorkflowId::new("w1")))
        );
        assert_eq!(
            Change::parse("e:w1"),
            Some(Change::Event(WorkflowId::new("w1")))
        );
        assert_eq!(Change::parse("s:"), Some(Change::SlotFreed));
        assert_eq!(Change::parse("n:"), Some(Change::Recoverable));
        for unknown in ["", "c:", "e:", "x:1", "c", "w"] {
            assert_eq!(Change::parse(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn listen_backoff_doubles_to_its_max() {
        assert_eq!(listen_backoff(1), LISTEN_RETRY_FIRST);
        assert_eq!(listen_backoff(2), LISTEN_RETRY_FIRST * 2);
        assert_eq!(listen_backoff(30), LISTEN_RETRY_MAX);
    }
}
