//! The ractor supervision tree of one reins node. The node supervisor owns the store actor (the
//! only way actors reach the database), the lease actor (renewals and fencing), the child-runs
//! actor, which supervises one child-agent actor per child run, and the workflows actor, which
//! supervises one workflow supervisor per live workflow. [`metrics::Metrics`] counts what they
//! do. Callers outside this crate use typed handles ([`Node`], [`StoreHandle`],
//! [`WorkflowsHandle`]), never raw `ActorRef`s.

pub mod agents;
mod capture;
mod child_agent;
mod child_runs;
pub mod commit;
mod error;
pub mod events;
mod fault_points;
mod faults;
mod ids;
pub mod js_pool;
mod lease_actor;
mod mailbox;
pub mod metrics;
mod node;
mod store_actor;
mod workflow;
mod workflows;
pub mod workspace;

pub use child_agent::RunEnd;
pub use child_runs::{Admitted, RunRequest, RunsHandle, RunsOptions};
pub use error::{Error, Takeover};
pub use fault_points::FaultPoints;
pub use faults::{FaultAction, StoreFaults};
pub use lease_actor::{LeaseKind, LeaseView};
pub use node::{ActorView, Node, NodeIdentity, NodeOptions, NodeStatus, QueueView};
pub use store_actor::{StoreHandle, StoreHealth};
pub use workflow::{ControlKind, WorkflowStatus};
pub use workflows::{
    Decide, LaunchRequest, Launched, ReconcileRequest, Resolution, Resume, WorkflowView,
    WorkflowsHandle, WorkflowsOptions, fingerprint,
};
