//! The ractor supervision tree of one reins node. The node supervisor owns the store actor (the
//! only way actors reach the database), the lease actor (renewals and fencing), the child-runs
//! actor, which supervises one child-agent actor per child run, and the workflows actor, which
//! supervises one workflow supervisor per live workflow. [`metrics::Metrics`] counts what they
//! do. Callers outside this crate use typed handles ([`Node`], [`StoreHandle`],
//! [`WorkflowsHandle`]), never raw `ActorRef`s.

pub mod agents;
pub use clock::skew_for_tests;
mod backoff;
mod child_run;
mod clock;
mod error;
pub mod events;
mod fault_points;
mod faults;
mod ids;
pub mod js_pool;
mod lease;
mod mailbox;
pub mod metrics;
mod node;
pub mod node_files;
pub mod notify;
mod store_actor;
mod workflow;
pub mod workspace;

pub use child_run::agent::RunEnd;
pub use child_run::{Admitted, RunRequest, RunsHandle, RunsOptions};
pub use error::{Error, Takeover};
pub use fault_points::FaultPoints;
pub use faults::{FaultAction, StoreFaults};
pub use lease::{LeaseView, Leased};
pub use node::{ActorView, Node, NodeIdentity, NodeOptions, NodeStatus, QueueView};
pub use store_actor::{StoreHandle, StoreHealth};
pub use workflow::front_door::{Launched, WorkflowView, WorkflowsHandle, WorkflowsOptions};
pub use workflow::requests::{
    Decide, LaunchRequest, ReconcileRequest, Resolution, Resume, RetryRequest, SendEvent,
};
pub use workflow::rules::{TIMEOUT_SECONDS_MAX, fingerprint};
