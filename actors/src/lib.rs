//! The ractor supervision tree of one reins node. The node supervisor owns the store actor (the
//! only way actors reach the database); later issues add the lease actor, one supervisor per live
//! workflow and the child-agent actors beneath them. Callers outside this crate use typed handles
//! ([`Node`], [`StoreHandle`]), never raw `ActorRef`s.

mod error;
mod node;
mod store_actor;

pub use error::Error;
pub use node::{Node, NodeIdentity, NodeOptions, NodeStatus};
pub use store_actor::{StoreHandle, StoreHealth};
