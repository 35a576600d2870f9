//! The one error model of the control plane: every refusal is `{"error": {"code", "message"}}`
//! with the status of spec section 4, mapped here from the actor and store errors in one place.

use hyper::StatusCode;
use store::WorkflowId;

use super::wire::{ErrorBody, ErrorReply};

/// A refused request: its status, a stable code and a message for people.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {code}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Sent as `Retry-After` (throttled sign-ins).
    pub retry_after_seconds: Option<u64>,
    /// Sent as `Allow` (a method the path does not take): the methods it takes.
    pub allow: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after_seconds: None,
            allow: None,
        }
    }

    /// 405 with `Allow`: the path takes `allowed` (sorted), not `method`.
    pub fn method_not_allowed(method: &str, mut allowed: Vec<&str>) -> Self {
        allowed.sort_unstable();
        let allowed = allowed.join(", ");
        ApiError {
            allow: Some(allowed.clone()),
            ..ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{method} is not allowed here; allowed: {allowed}"),
            )
        }
    }

    /// 429 with `Retry-After`.
    pub fn too_many_attempts(
        retry_after_seconds: u64,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            retry_after_seconds: Some(retry_after_seconds),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, code, message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, "conflict", message)
    }

    pub fn refused(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "refused", message)
    }

    pub fn draining() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "the node is draining: it takes no new launches or recoveries",
        )
    }

    /// The workflow does not exist, or belongs to someone else (the same answer, so that ids
    /// cannot be probed).
    pub fn no_workflow(run_id: &WorkflowId) -> Self {
        ApiError::not_found(format!("no workflow {run_id:?}"))
    }

    pub fn body(&self) -> ErrorReply {
        ErrorReply {
            error: ErrorBody {
                code: self.code.to_owned(),
                message: self.message.clone(),
            },
        }
    }
}

impl From<store::Error> for ApiError {
    fn from(error: store::Error) -> Self {
        let message = error.to_string();
        match error {
            store::Error::NotFound(_) => ApiError::not_found(message),
            store::Error::LimitReached(_) => ApiError::refused(message),
            store::Error::Conflict(_) => ApiError::conflict(message),
            store::Error::LeaseLost { .. } => {
                ApiError::new(StatusCode::CONFLICT, "lease_lost", message)
            }
            store::Error::OutcomeUnknown(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "outcome_unknown",
                format!("{message}; read the workflow again before retrying"),
            ),
            store::Error::Unavailable(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
            store::Error::DiskFull(_) => {
                tracing::error!(%message, "the database's disk is full");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "disk_full", message)
            }
            store::Error::InvalidUrl { .. }
            | store::Error::NodeLockHeld { .. }
            | store::Error::SchemaTooNew { .. }
            | store::Error::Unsupported(_)
            | store::Error::Database(_) => {
                tracing::error!(%message, "store error behind a request");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

impl From<actors::Error> for ApiError {
    fn from(error: actors::Error) -> Self {
        let message = error.to_string();
        match error {
            actors::Error::Store(error) => error.into(),
            actors::Error::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
            }
            actors::Error::NoWorkflow { .. } | actors::Error::NoStep { .. } => {
                ApiError::not_found(message)
            }
            actors::Error::StaleFingerprint { .. }
            | actors::Error::StepNotReached { .. }
            | actors::Error::WrongStepKind { .. }
            | actors::Error::WrongAttempt { .. }
            | actors::Error::StaleArtifactVersion { .. } => ApiError::conflict(message),
            actors::Error::NotRetryable { .. } => {
                ApiError::new(StatusCode::CONFLICT, "not_retryable", message)
            }
            actors::Error::UnknownAgent { .. }
            | actors::Error::NotLive { .. }
            | actors::Error::LeaseHeld { .. }
            | actors::Error::TakeoverRefused { .. }
            | actors::Error::Supervised { .. }
            | actors::Error::NotSupervised { .. }
            | actors::Error::ChildInFlight { .. }
            | actors::Error::LimitReached { .. } => ApiError::refused(message),
            // A recover that raced the HTTP layer's own check: the same answer as that check.
            actors::Error::Draining => ApiError::draining(),
            actors::Error::InvalidRequest(_) => ApiError::bad_request(message),
            actors::Error::ScriptInvalid(_) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "script_invalid", message)
            }
            actors::Error::Unanswered { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
            }
            actors::Error::Workspace(actors::workspace::WorkspaceError::TooLarge { .. }) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
            }
            actors::Error::Spawn { .. } | actors::Error::Workspace(_) => {
                tracing::error!(%message, "actor error behind a request");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actors::{Error, Takeover};

    fn mapped(error: Error) -> (u16, &'static str, String) {
        let api = ApiError::from(error);
        (api.status.as_u16(), api.code, api.message)
    }

    /// The rules of the actors layer answer with the statuses, codes and messages their clients
    /// had while they came through as made-up database errors (`store::Error::NotFound`,
    /// `Conflict`) or as one `Refused(String)`.
    #[test]
    fn every_rule_of_the_actors_layer_keeps_its_status_code_and_message() {
        let id = || WorkflowId::new("w1");
        let step = || "review".to_owned();
        let cases = [
            (
                Error::NoWorkflow { workflow_id: id() },
                (404, "not_found", r#"not found: workflow "w1""#),
            ),
            (
                Error::NoStep {
                    workflow_id: id(),
                    step_id: step(),
                },
                (
                    404,
                    "not_found",
                    r#"not found: step "review" of workflow "w1""#,
                ),
            ),
            (
                Error::StaleFingerprint {
                    given: "ab".into(),
                    current: "cd".into(),
                },
                (
                    409,
                    "conflict",
                    r#"conflict: fingerprint "ab" is stale: the workflow's is "cd""#,
                ),
            ),
            (
                Error::StepNotReached { step_id: step() },
                (
                    409,
                    "conflict",
                    r#"conflict: the workflow has not reached a step "review""#,
                ),
            ),
            (
                Error::WrongStepKind {
                    step_id: step(),
                    kind: "pause".into(),
                    expected: "humanCheckpoint",
                },
                (
                    409,
                    "conflict",
                    r#"conflict: step "review" is a pause call, not a humanCheckpoint"#,
                ),
            ),
            (
                Error::WrongAttempt {
                    step_id: step(),
                    current: 2,
                    given: 1,
                },
                (
                    409,
                    "conflict",
                    r#"conflict: step "review" is at attempt 2, not 1"#,
                ),
            ),
            (
                Error::StaleArtifactVersion {
                    step_id: step(),
                    under_review: Some(4),
                    given: 1,
                },
                (
                    409,
                    "conflict",
                    r#"conflict: checkpoint "review" is about artifact version 4, not 1"#,
                ),
            ),
            (
                Error::StaleArtifactVersion {
                    step_id: step(),
                    under_review: None,
                    given: 1,
                },
                (
                    409,
                    "conflict",
                    r#"conflict: checkpoint "review" is about artifact version none, not 1"#,
                ),
            ),
            (
                Error::NotLive {
                    action: Takeover::Recover,
                    reason: "the workflow is completed".into(),
                },
                (
                    422,
                    "refused",
                    "refused: not recoverable: the workflow is completed",
                ),
            ),
            (
                Error::LeaseHeld {
                    action: Takeover::Reconcile,
                },
                (
                    422,
                    "refused",
                    "refused: cannot reconcile: its owner's lease is still valid",
                ),
            ),
            (
                Error::TakeoverRefused {
                    reason: "no cancellation was asked for".into(),
                },
                (422, "refused", "refused: no cancellation was asked for"),
            ),
            (
                Error::Supervised { workflow_id: id() },
                (
                    422,
                    "refused",
                    r#"refused: workflow "w1" is supervised on this node, or being taken over by it"#,
                ),
            ),
            (
                Error::Draining,
                (
                    503,
                    "draining",
                    "the node is draining: it takes no new launches or recoveries",
                ),
            ),
            (
                Error::NotRetryable {
                    workflow_id: id(),
                    reason: "it is running: only a failed workflow is retried".into(),
                },
                (
                    409,
                    "not_retryable",
                    r#"conflict: workflow "w1" cannot be retried: it is running: only a failed workflow is retried"#,
                ),
            ),
            (
                Error::NotSupervised { workflow_id: id() },
                (
                    422,
                    "refused",
                    r#"refused: workflow "w1" is not supervised on this node"#,
                ),
            ),
        ];
        for (error, (status, code, message)) in cases {
            assert_eq!(mapped(error), (status, code, message.to_owned()));
        }
    }
}
