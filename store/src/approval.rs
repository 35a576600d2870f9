//! A child run's approval slot, kept in its `metadata`: an agent's request for a person's answer
//! while the run waits, and the answer once given. Read and written here only
//! ([`ApprovalSlot::of`], [`asking`], [`answered`]); the backends, the child-run actor, the
//! workflow's machine and the API read the types.
//!
//! # The stored schema (`runs.metadata`)
//! - `hitl_approval` (while the run waits, status `waiting_for_input`): the agent's request as
//!   it gave it, `{"kind": "hitl_approval", "request_id", "actions", "attached"?, ...}`;
//!   `attached: true` when the agent lives on and waits for its answer (a `command` agent);
//! - `hitl_deadline_at_ms` (a request with the agent's `timeout.approvalMs`): when nobody's answer
//!   is taken as a rejection, epoch milliseconds. **The SQL reads it** (the expired-approval
//!   queries of both backends);
//! - `hitl_answer` (once answered; `hitl_approval` is then gone): `{"request_id", "answer":
//!   {"decision", "comment", "by", "actions"}}`. **The SQL reads whether it is there** (the
//!   record's approval runs of both backends).
//!
//! `tests::the_stored_schema_is_the_documented_one` holds the encoding to this list.

use serde_json::{Value, json};

use crate::RunStatus;

/// The key of a paused run's `metadata` that holds when its approval request is answered by its
/// timeout: see [`crate::Runs::expired_approvals`].
pub const APPROVAL_DEADLINE: &str = "hitl_deadline_at_ms";
const ASKED: &str = "hitl_approval";
const ANSWERED: &str = "hitl_answer";

/// A request that waits for a person's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalAsked<'a> {
    pub request_id: &'a str,
    /// What the agent asks to do.
    pub actions: &'a Value,
    /// The agent lives on and waits for its answer (rather than having ended its run).
    pub attached: bool,
}

/// A request a person answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalAnswered<'a> {
    pub request_id: &'a str,
    /// `{"decision", "comment", "by", "actions"}`.
    pub answer: &'a Value,
}

impl ApprovalAnswered<'_> {
    /// `approve` or `reject`.
    pub fn decision(&self) -> &Value {
        &self.answer["decision"]
    }

    pub fn comment(&self) -> &Value {
        &self.answer["comment"]
    }

    /// Who answered (an email), or `null` for an answer the deadline gave.
    pub fn by(&self) -> &Value {
        &self.answer["by"]
    }

    /// What the agent had asked to do, kept with the answer.
    pub fn actions(&self) -> &Value {
        &self.answer["actions"]
    }
}

/// Where a run's approval stands.
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalSlot<'a> {
    /// The run never asked (or its metadata holds neither key).
    Empty,
    Asked(ApprovalAsked<'a>),
    Answered(ApprovalAnswered<'a>),
}

impl<'a> ApprovalSlot<'a> {
    /// The slot of a run's `metadata`.
    pub fn of(metadata: &'a Value) -> Self {
        if let Some(asked) = metadata.get(ASKED) {
            return ApprovalSlot::Asked(ApprovalAsked {
                request_id: asked["request_id"].as_str().unwrap_or_default(),
                actions: &asked["actions"],
                attached: asked["attached"] == Value::Bool(true),
            });
        }
        match metadata.get(ANSWERED) {
            Some(answered) => ApprovalSlot::Answered(ApprovalAnswered {
                request_id: answered["request_id"].as_str().unwrap_or_default(),
                answer: &answered["answer"],
            }),
            None => ApprovalSlot::Empty,
        }
    }

    /// The request that waits, if one does.
    pub fn asked(&self) -> Option<&ApprovalAsked<'a>> {
        match self {
            ApprovalSlot::Asked(asked) => Some(asked),
            _ => None,
        }
    }

    /// The answer, if one was given.
    pub fn answered(&self) -> Option<&ApprovalAnswered<'a>> {
        match self {
            ApprovalSlot::Answered(answered) => Some(answered),
            _ => None,
        }
    }
}

/// The metadata a run that asks for approval records: the agent's `request`, and when nobody's
/// answer is taken as a rejection, if it has a deadline.
pub fn asking(request: Value, deadline_at_ms: Option<u64>) -> Value {
    let mut metadata = json!({ ASKED: request });
    if let Some(deadline) = deadline_at_ms {
        metadata[APPROVAL_DEADLINE] = deadline.into();
    }
    metadata
}

/// The request id a paused run waits for.
pub fn pending_request_id(metadata: &Value) -> Option<&str> {
    metadata.get(ASKED)?.get("request_id")?.as_str()
}

/// The metadata of an answered run: the request replaced by the answer, everything else kept.
pub(crate) fn answered(metadata: &Value, request_id: &str, answer: &Value) -> Value {
    let mut answered = metadata.clone();
    if let Some(map) = answered.as_object_mut() {
        map.remove(ASKED);
        map.insert(
            ANSWERED.into(),
            json!({"request_id": request_id, "answer": answer}),
        );
    }
    answered
}

/// The status an answer moves a paused run to: an attached agent runs on with its answer, a
/// detached pause ends its run.
pub(crate) fn status_after_answer(metadata: &Value) -> RunStatus {
    match ApprovalSlot::of(metadata) {
        ApprovalSlot::Asked(asked) if asked.attached => RunStatus::Running,
        _ => RunStatus::Success,
    }
}

/// The answer a live agent waits for, as a renewal delivers it.
pub(crate) fn pending_answer(status: RunStatus, metadata: &Value) -> Option<Value> {
    (status == RunStatus::Running)
        .then(|| metadata.get(ANSWERED).cloned())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_schema_is_the_documented_one() {
        let request = json!({"kind": "hitl_approval", "request_id": "r1",
                             "actions": [{"tool": "rm"}], "attached": true});
        let asked = asking(request.clone(), Some(5_000));
        assert_eq!(
            asked,
            json!({"hitl_approval": request, "hitl_deadline_at_ms": 5_000})
        );
        assert_eq!(
            ApprovalSlot::of(&asked),
            ApprovalSlot::Asked(ApprovalAsked {
                request_id: "r1",
                actions: &json!([{"tool": "rm"}]),
                attached: true
            })
        );
        assert_eq!(pending_request_id(&asked), Some("r1"));
        assert_eq!(status_after_answer(&asked), RunStatus::Running);
        let answer = json!({"decision": "approve", "comment": null, "by": "a@b.c",
                            "actions": [{"tool": "rm"}]});
        let done = answered(&asked, "r1", &answer);
        assert_eq!(
            done,
            json!({"hitl_deadline_at_ms": 5_000,
                   "hitl_answer": {"request_id": "r1", "answer": answer}})
        );
        let slot = ApprovalSlot::of(&done);
        let given = slot.answered().expect("answered");
        assert_eq!(
            (given.request_id, given.decision()),
            ("r1", &json!("approve"))
        );
        assert_eq!(given.by(), "a@b.c");
        assert_eq!(pending_request_id(&done), None);
        assert_eq!(
            pending_answer(RunStatus::Running, &done),
            Some(done["hitl_answer"].clone())
        );
        assert_eq!(pending_answer(RunStatus::Success, &done), None);
        let detached = asking(json!({"request_id": "r2"}), None);
        assert_eq!(detached, json!({"hitl_approval": {"request_id": "r2"}}));
        assert_eq!(status_after_answer(&detached), RunStatus::Success);
        assert_eq!(ApprovalSlot::of(&json!({})), ApprovalSlot::Empty);
    }
}
