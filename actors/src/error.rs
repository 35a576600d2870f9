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
    /// The request names no configured agent.
    #[error("unknown agent {name:?}; configured: {known}")]
    UnknownAgent { name: String, known: String },
    /// A request value is over its configured limit.
    #[error("{what} is {bytes} bytes, over `{limit_name}` ({limit} bytes)")]
    TooLarge {
        what: &'static str,
        bytes: usize,
        limit_name: &'static str,
        limit: usize,
    },
    /// A rule refused the request (wrong state, incompatible runtime, pending cancel); nothing
    /// was changed.
    #[error("refused: {0}")]
    Refused(String),
    /// A cluster-wide limit refused the request.
    #[error("refused by `{limit}` ({max})")]
    LimitReached { limit: &'static str, max: u64 },
    /// A request is malformed.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// An actor did not answer in time or has stopped.
    #[error("the {actor} actor did not answer: {reason}")]
    Unanswered { actor: &'static str, reason: String },
}
