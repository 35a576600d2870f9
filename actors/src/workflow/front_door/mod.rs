//! The workflows actor: the front door for workflows on this node and the supervisor of their
//! workflow supervisors. Launch checks the script and arguments against their limits, launches
//! through the store (idempotent per user and request id, under the cluster-wide limits), and
//! starts a linked supervisor for a new workflow. [`WorkflowsHandle`] is the Rust API the HTTP
//! layer calls: launch, get, resume, decide.
//!
//! `actor.rs` holds the actor, its state and messages, and dispatches each message to the file
//! that handles it: `launch.rs` (launch and retry), `takeover.rs` (recover, reconcile, a dead
//! owner's cancel, taking back, claims of recoverable and dormant workflows), `controls.rs`
//! (the controls poll, fence, drain), `changes.rs` (the change bus and the slot waiters);
//! `handle.rs` is the public handle. The decisions they act on are in
//! [`rules`](super::rules).

mod actor;
mod changes;
mod controls;
mod handle;
mod launch;
mod takeover;

use std::time::Duration;

use store::{LaunchLimits, WorkflowId};

use crate::error::Error;
use actor::WorkflowsState;

pub(crate) use actor::{Workflows, WorkflowsArgs, WorkflowsMsg};
pub(crate) use handle::EventLimits;
pub use handle::{WorkflowView, WorkflowsHandle};
pub use launch::Launched;

/// Supervisors woken per freed slot (a cue may stand for several slots freed in one write);
/// those refused again wait for the next cue, or their fallback.
pub(super) const SLOT_WAKES_MAX: usize = 16;

/// Limits and sizes the workflows actor works with.
#[derive(Debug, Clone)]
pub struct WorkflowsOptions {
    pub limits: runtime::Limits,
    /// Where thread workspaces live (captures read files there).
    pub workspaces_dir: std::path::PathBuf,
    /// An artifact's bytes at most.
    pub artifact_bytes_max: u64,
    /// `console.log` lines a workflow keeps as events at most, whichever nodes ran it.
    pub log_events_max: u64,
    /// The bytes of those lines at most.
    pub log_event_bytes_max: u64,
    /// How long a capture's read may take before the capture fails.
    pub capture_timeout: Duration,
    /// The node's own files (database, secret, configuration), which no capture opens.
    pub node_files: std::sync::Arc<crate::node_files::NodeFiles>,
    pub launch_limits: LaunchLimits,
    pub slots_max: u64,
    /// The slots the steps of one user's workflows hold at most, across the cluster.
    pub slots_per_user_max: u64,
    /// The slots kept free for other users than one who holds their share already
    /// (`limits.active_children_reserved`).
    pub slots_reserved: u64,
    /// The bytes one user's workflows store at most (`limits.user_stored_bytes_max`; 0: no
    /// quota).
    pub stored_bytes_max: u64,
    /// The bytes of data a retry copies at most from the workspaces of the steps it adopts
    /// (`limits.retry_copy_bytes_max`; a file's holes do not count).
    pub retry_copy_bytes_max: u64,
    /// The events one workflow holds untaken at most, and their payload bytes
    /// (`limits.untaken_events_per_workflow_max`, `limits.untaken_event_bytes_per_workflow_max`).
    pub event_bounds: store::EventBounds,
    pub lease_ms: u64,
    /// The life limit of a workflow launched here without its own (`limits.timeout_seconds`;
    /// 0: none), and of one launched before launches recorded theirs (then a day when 0).
    pub timeout_seconds: u64,
    /// `recovery: automatic`: this node claims recoverable workflows itself, every lease period.
    pub automatic_recovery: bool,
    /// `REINS_FAULT_DIR` fault points (tests only; inert when `None`).
    pub faults: Option<crate::fault_points::FaultPoints>,
    /// The slow fallback of every wake-up the change bus brings (`cluster.wake_fallback_ms`):
    /// how often controls are looked for, and how long a step without a slot or a step whose
    /// agent waits for a person waits before it looks again, should a cue be lost.
    pub wake_fallback: Duration,
    /// How long a parked workflow waits before it goes dormant (`dormant_after_ms`; `None`:
    /// never).
    pub dormant_after: Option<Duration>,
}

/// The versions this node replays journals under.
fn our_versions(state: &WorkflowsState) -> store::Versions {
    store::Versions {
        runtime: runtime::runtime_version(&state.args.options.limits),
        configuration: state.args.agents.configuration_version(),
    }
}

fn not_found(workflow_id: &WorkflowId) -> Error {
    Error::NoWorkflow {
        workflow_id: workflow_id.to_owned(),
    }
}
