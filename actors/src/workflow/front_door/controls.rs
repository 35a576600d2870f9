//! Controls and the node's own orders: the look for pending controls of this node's workflows
//! (the change bus's fallback), a fence of one workflow's lease, and draining.

use ractor::{ActorRef, RpcReplyPort};
use store::{Epoch, WorkflowId};

use super::actor::{WorkflowsMsg, WorkflowsState};
use crate::error::Error;
use crate::mailbox::Post;
use crate::workflow::WorkflowMsg;

/// Looks, in a task, for the workflows of this node with controls to carry out: the answer
/// comes back as [`WorkflowsMsg::PendingControls`].
pub(super) fn poll(myself: &ActorRef<WorkflowsMsg>, state: &mut WorkflowsState) {
    // One poll at a time: a slow store must not pile them up.
    if state.live.is_empty() || state.polling {
        return;
    }
    state.polling = true;
    let (store, me) = (state.args.store.clone(), myself.clone());
    let owner = state.args.worker_id.clone();
    tokio::spawn(async move {
        let pending = store
            .workflows_with_pending_controls(&owner)
            .await
            .unwrap_or_else(|error| {
                tracing::warn!(%error, "looking for controls failed");
                Vec::new()
            });
        let _ = me.post(WorkflowsMsg::PendingControls(pending));
    });
}

/// Wakes the supervisor of each workflow with controls to carry out.
pub(super) fn pending(state: &mut WorkflowsState, pending: Vec<WorkflowId>) {
    state.polling = false;
    for workflow_id in pending {
        if let Some(supervisor) = state.live.get(&workflow_id) {
            // A supervisor that stopped meanwhile needs no poll.
            let _ = supervisor.post(WorkflowMsg::Poll);
        }
    }
}

/// Stops taking recoveries (manual and automatic).
pub(super) fn drain(state: &mut WorkflowsState) {
    tracing::info!("draining: no more recoveries");
    state.draining = true;
}

/// Gives one workflow's lease up through its supervisor, which answers once it has stopped
/// writing and let the lease go.
pub(super) fn fence(
    state: &WorkflowsState,
    workflow_id: WorkflowId,
    shutdown: bool,
    reply: RpcReplyPort<Result<Epoch, Error>>,
) {
    match state.live.get(&workflow_id) {
        Some(supervisor) => {
            let _ = supervisor.post(WorkflowMsg::GiveUp { shutdown, reply });
        }
        None => {
            let _ = reply.send(Err(Error::NotSupervised { workflow_id }));
        }
    }
}
