//! Errors of the actor layer.

/// Calls `actor` with a timeout and turns every way it can fail to answer into
/// [`Error::Unanswered`] naming the actor.
pub(crate) async fn ask<M, T>(
    actor: &ractor::ActorRef<M>,
    name: &'static str,
    timeout: std::time::Duration,
    message: impl FnOnce(ractor::RpcReplyPort<T>) -> M,
) -> Result<T, Error>
where
    M: ractor::Message,
    T: Send + 'static,
{
    let unanswered = |reason: String| Error::Unanswered {
        actor: name,
        reason,
    };
    match crate::mailbox::call(actor, message, Some(timeout)).await {
        Ok(ractor::rpc::CallResult::Success(answer)) => Ok(answer),
        Ok(ractor::rpc::CallResult::Timeout) => Err(unanswered(format!(
            "no answer within {} ms",
            timeout.as_millis()
        ))),
        Ok(ractor::rpc::CallResult::SenderError) => {
            Err(unanswered("the request was dropped".into()))
        }
        Err(e) => Err(unanswered(e.to_string())),
    }
}

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
