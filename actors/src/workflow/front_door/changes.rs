//! The change bus and the slot waiters: what a committed change wakes on this node.

use ractor::ActorRef;
use store::{Change, WorkflowId};
use tokio::sync::broadcast;

use super::SLOT_WAKES_MAX;
use super::actor::{WorkflowsMsg, WorkflowsState};
use crate::mailbox::Post;
use crate::workflow::WorkflowMsg;
use crate::workflow::rules;

/// Hands every change the bus announces to the actor, as a message; a receiver that fell
/// behind has missed some, which is a resync.
pub(super) fn listen(
    myself: &ActorRef<WorkflowsMsg>,
    mut changes: broadcast::Receiver<Change>,
) -> crate::mailbox::Task {
    let me = myself.clone();
    crate::mailbox::Task::spawn(async move {
        loop {
            let change = match changes.recv().await {
                Ok(change) => change,
                Err(broadcast::error::RecvError::Lagged(_)) => Change::Resync,
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if me.post(WorkflowsMsg::Changed(change)).is_err() {
                return;
            }
        }
    })
}

/// What a committed change means for this node: a control for a workflow it runs wakes that
/// supervisor; an answer to a child's request wakes the supervisor that waits for it; a freed
/// slot wakes the oldest steps waiting for one; released leases wake automatic recovery; a
/// resync does all of it. Each of these changes but a freed slot and a released lease also
/// wakes this node's event streams of its workflow (its events committed with it); a status
/// change wakes the feed's streams too. On PostgreSQL, an event of a workflow that some stream
/// watches is announced by itself (`Change::Event`), whichever node wrote it.
pub(super) fn changed(myself: &ActorRef<WorkflowsMsg>, state: &mut WorkflowsState, change: Change) {
    let wakes = state.args.store.event_wakes();
    match &change {
        Change::Status(workflow_id) => wakes.committed(workflow_id, true),
        Change::Control(workflow_id) | Change::Input(workflow_id) | Change::Event(workflow_id) => {
            wakes.committed(workflow_id, false);
        }
        Change::Resync => wakes.resync(),
        Change::SlotFreed | Change::Recoverable => {}
    }
    match change {
        Change::Control(workflow_id) => {
            if let Some(supervisor) = state.live.get(&workflow_id) {
                let _ = supervisor.post(WorkflowMsg::Poll);
            }
        }
        Change::Input(workflow_id) => {
            if let Some(supervisor) = state.live.get(&workflow_id) {
                let _ = supervisor.post(WorkflowMsg::InputChanged);
            }
        }
        Change::SlotFreed => wake_slot_waiters(state, SLOT_WAKES_MAX),
        // A dormant workflow woken by a control or an event is claimed in either mode.
        Change::Recoverable => {
            let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
        }
        Change::Status(_) | Change::Event(_) => {}
        Change::Resync => {
            let _ = myself.post(WorkflowsMsg::PollControls);
            wake_slot_waiters(state, usize::MAX);
            for supervisor in state.live.values() {
                let _ = supervisor.post(WorkflowMsg::InputChanged);
                // An event's cue may be among those missed: a waiting `waitForEvent` reads.
                let _ = supervisor.post(WorkflowMsg::Poll);
            }
            let _ = myself.post(WorkflowsMsg::ClaimRecoverable);
        }
    }
}

/// Tells up to `count` of the oldest supervisors waiting for a slot to ask again; those refused
/// again say so anew.
fn wake_slot_waiters(state: &mut WorkflowsState, count: usize) {
    let picked = rules::waiters_to_wake(&state.slot_waiters, count, |workflow_id| {
        state.live_users.get(workflow_id).map(String::as_str)
    });
    let mut woken = Vec::with_capacity(picked.len());
    // Highest place first, so that each removal leaves the places still to remove as they were.
    for place in picked.into_iter().rev() {
        if let Some(workflow_id) = state.slot_waiters.remove(place) {
            woken.push(workflow_id);
        }
    }
    for workflow_id in woken.into_iter().rev() {
        if let Some(supervisor) = state.live.get(&workflow_id) {
            let _ = supervisor.post(WorkflowMsg::SlotFreed);
        }
    }
}

/// A supervisor of this node has a step waiting for a child slot: it is woken when one frees,
/// oldest first, each once.
pub(super) fn slot_wanted(state: &mut WorkflowsState, workflow_id: WorkflowId) {
    if !state.slot_waiters.contains(&workflow_id) {
        state.slot_waiters.push_back(workflow_id);
    }
}
