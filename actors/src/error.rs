//! Errors of the actor layer.

/// What starting or talking to the node's actors can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] store::Error),
    /// An actor could not be started.
    #[error("cannot start the {actor} actor: {reason}")]
    Spawn { actor: &'static str, reason: String },
    /// An actor did not answer in time or has stopped.
    #[error("the {actor} actor did not answer: {reason}")]
    Unanswered { actor: &'static str, reason: String },
}
