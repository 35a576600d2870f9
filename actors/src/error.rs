//! Errors of the actor layer.

use store::WorkflowId;

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

/// What a takeover was asked for, as its refusals say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// `recover`: replay the workflow here after its owner died.
    Recover,
    /// `reconcile`: settle the uncertain step, then replay here.
    Reconcile,
    /// Finish a dead owner's cancellation without replaying the body.
    Cancel,
}

impl std::fmt::Display for Takeover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Takeover::Recover => "not recoverable",
            Takeover::Reconcile => "cannot reconcile",
            Takeover::Cancel => "cannot finish the cancellation",
        })
    }
}

/// What starting or talking to the node's actors can fail with. The store's own refusals come
/// through as [`Error::Store`]; every rule of this layer has a kind of its own, so a caller (the
/// HTTP mapping) reads the rule, never a database error made up for it. The messages begin with
/// `not found:`, `conflict:` or `refused:` as the clients of the HTTP API have always read them.
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
    /// The workflow the request names does not exist (or was deleted meanwhile).
    #[error("not found: workflow {workflow_id:?}")]
    NoWorkflow { workflow_id: WorkflowId },
    /// The step the request names is not in the workflow's journal.
    #[error("not found: step {step_id:?} of workflow {workflow_id:?}")]
    NoStep {
        workflow_id: WorkflowId,
        step_id: String,
    },
    /// A control named a digest of script and args that is not the workflow's: its caller saw
    /// another workflow than this one.
    #[error("conflict: fingerprint {given:?} is stale: the workflow's is {current:?}")]
    StaleFingerprint { given: String, current: String },
    /// A control names a step the script has not reached.
    #[error("conflict: the workflow has not reached a step {step_id:?}")]
    StepNotReached { step_id: String },
    /// A control names a step that is another kind of call than the control answers.
    #[error("conflict: step {step_id:?} is a {kind} call, not a {expected}")]
    WrongStepKind {
        step_id: String,
        kind: String,
        expected: &'static str,
    },
    /// A control names another attempt of the step than the one the workflow is at.
    #[error("conflict: step {step_id:?} is at attempt {current}, not {given}")]
    WrongAttempt {
        step_id: String,
        current: i32,
        given: i32,
    },
    /// A decision about another artifact version than the one its checkpoint shows.
    #[error(
        "conflict: checkpoint {step_id:?} is about artifact version {}, not {given}",
        under_review.map_or_else(|| "none".to_owned(), |v| v.to_string())
    )]
    StaleArtifactVersion {
        step_id: String,
        under_review: Option<u64>,
        given: u64,
    },
    /// A takeover of a workflow that is no longer live (it ended): nothing was changed.
    #[error("refused: {action}: {reason}")]
    NotLive { action: Takeover, reason: String },
    /// A takeover while the owner's lease is still valid: nothing was changed; asking again
    /// once it has run out may succeed.
    #[error("refused: {action}: its owner's lease is still valid")]
    LeaseHeld { action: Takeover },
    /// The store's takeover rules refused it (another runtime or agent configuration, a
    /// pending cancel, the wrong status for this takeover): nothing was changed.
    #[error("refused: {reason}")]
    TakeoverRefused { reason: String },
    /// A takeover of a workflow this node supervises already, or is taking over already: a
    /// node never runs two supervisors of one workflow.
    #[error(
        "refused: workflow {workflow_id:?} is supervised on this node, or being taken over by it"
    )]
    Supervised { workflow_id: WorkflowId },
    /// This node is draining: it takes no recoveries.
    #[error("refused: this node is draining: it takes no recoveries")]
    Draining,
    /// An operator's fence of a workflow this node does not supervise.
    #[error("refused: workflow {workflow_id:?} is not supervised on this node")]
    NotSupervised { workflow_id: WorkflowId },
    /// At the node's clean stop, a workflow with a child run in flight keeps its lease: the
    /// child stops with the node while its run is still leased.
    #[error("refused: workflow {workflow_id:?} keeps its lease: a child run of it is in flight")]
    ChildInFlight { workflow_id: WorkflowId },
    /// A retry of a workflow that is not (or not only) failed, or whose journal cannot be
    /// adopted: nothing was written, and `reason` says what to do instead.
    #[error("conflict: workflow {workflow_id:?} cannot be retried: {reason}")]
    NotRetryable {
        workflow_id: WorkflowId,
        reason: String,
    },
    /// A thread workspace could not be read or written (a retry's copy of the workspace of a
    /// step it adopts).
    #[error("workspace: {0}")]
    Workspace(#[from] crate::workspace::WorkspaceError),
    /// A cluster-wide limit refused the request.
    #[error("refused by `{limit}` ({max})")]
    LimitReached { limit: store::Limit, max: u64 },
    /// A request is malformed.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A launch's script does not compile (the message says where and why). Its own error: the
    /// request is well formed, the program it carries is not (HTTP 422, not 400).
    #[error("{0}")]
    ScriptInvalid(String),
    /// An actor did not answer in time or has stopped.
    #[error("the {actor} actor did not answer: {reason}")]
    Unanswered { actor: &'static str, reason: String },
}
