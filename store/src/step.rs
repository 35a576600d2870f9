//! A journal entry's record, typed: what the script asked (its call kind, one variant each,
//! with what only that kind has), its arguments, its outcome, when it settled, and an
//! operator's reconcile. Encoded and decoded here only ([`StepRecord::encode`],
//! [`StepRecord::decode`]); the workflow's machine, the front door's rules, the API's record
//! and the simulation store read the type.
//!
//! # The stored schema (`workflow_steps.kind`, `workflow_steps.data`)
//! `kind` is the call's name as the script spells it ([`StepKind::as_str`]). `data` is a JSON
//! object with these keys, and no other:
//! - `args` (always): the call's arguments as the script gave them (replay compares them);
//! - `outcome` (always, `null` until settled): `{"outcome": "resolved" | "rejected", "value"}`;
//! - `settled_at_ms` (always, `null` until settled): epoch milliseconds, a whole number;
//! - `run_id`, `thread_id`, `configuration_version` (an `agent` step whose attempt was admitted:
//!   its child run, the thread it ran on, the agents' configuration it ran under);
//! - `previous_run_id` (an `agent` attempt a reconcile's or its policy's retry queued: the run
//!   it replaces);
//! - `retry` (an `agent` attempt its retry policy queued): `{"due_at_ms", "first_at_ms",
//!   "reason", "max_attempts"}`: when it may be admitted (the durable timer), when the step's
//!   first attempt began (its `totalMs` counts from there), why the attempt before is run again,
//!   and the policy's attempts at most (shown as "attempt 3 of 5");
//! - `detached: true` (an `agent` attempt a failed `parallel` left behind, journaled
//!   `cancelled`), `run_status` (an `agent` attempt a cancellation ended: its run's status);
//! - `closing: true` (an idempotent agent's attempt whose run of unknown outcome it asked to
//!   stop, to run the next attempt once that run is final);
//! - `due_at_ms` (a `sleep`): when its timer is due, epoch milliseconds;
//! - `deadline_at_ms` (a `pause`, `humanCheckpoint` or `waitForEvent` with a `timeoutMs`): when
//!   its deadline passes, epoch milliseconds;
//! - `event_seq` (a `waitForEvent` an event answered): the `sent_events` row it took;
//! - `reconciled` (an attempt an operator reconciled): `{"by", "reason", "resolution"}`.
//!
//! The event triggers of migrations 18, 21 and 26 read `args.artifactVersion` (a checkpoint's
//! `step_waiting` event), `run_id`, and `outcome.value.runId` and `outcome.value.artifactVersion`
//! (a step's `step_finished` event); `tests::the_stored_schema_is_the_documented_one` holds the
//! encoding to this list.

use std::fmt;

use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use crate::status::stored_text;
use crate::{Error, Result, RunId, RunStatus};

// The one list of call kinds, shared with the runtime's `CallKind` (see that file).
include!("../../runtime/src/call_kinds.rs");

macro_rules! step_kind {
    ($($(#[$doc:meta])* $kind:ident = $name:literal,)*) => {
        /// A step's call kind as stored (`workflow_steps.kind`): the script API's name for it
        /// (declared once, in `runtime/src/call_kinds.rs`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum StepKind {
            $($(#[$doc])* $kind,)*
        }

        impl StepKind {
            /// Every kind.
            pub const ALL: &'static [StepKind] = &[$(StepKind::$kind,)*];

            /// The stored text.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(StepKind::$kind => $name,)*
                }
            }

            /// The kind as a `'static` reference (a statement's parameter).
            pub const fn as_static(self) -> &'static StepKind {
                match self {
                    $(StepKind::$kind => &StepKind::$kind,)*
                }
            }
        }
    };
}

with_call_kinds!(step_kind);

stored_text!(StepKind);

/// How a step's call ended, as the script saw it: resolved with a value, or rejected with an
/// error object (`{"message", "status", ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "value", rename_all = "snake_case")]
pub enum StepOutcome {
    Resolved(Value),
    Rejected(Value),
}

impl StepOutcome {
    /// The value resolved or the error rejected.
    pub fn value(&self) -> &Value {
        match self {
            StepOutcome::Resolved(value) | StepOutcome::Rejected(value) => value,
        }
    }
}

/// The child run an `agent` attempt was admitted with.
#[derive(Debug, Clone, PartialEq)]
pub struct StepChild {
    pub run_id: RunId,
    /// The thread (workspace) it ran on.
    pub thread_id: String,
    /// The agents' configuration version it ran under (none when its agent is not configured).
    pub configuration_version: Option<String>,
}

/// What a step is, by call kind, with what only that kind records.
#[derive(Debug, Clone, PartialEq)]
pub enum StepCall {
    Agent {
        /// Its child run, once the attempt was admitted.
        child: Option<Box<StepChild>>,
        /// The run of the attempt before, when a reconcile's retry queued this one.
        previous_run_id: Option<RunId>,
        /// Left behind by a failed `parallel`: the script no longer awaited it.
        detached: bool,
        /// Its run's status when a cancellation ended it.
        run_status: Option<RunStatus>,
        /// Queued by the step's retry policy: when, and why (boxed: rare, and a write's ops
        /// stay small).
        retry: Option<Box<RetryWait>>,
        /// Its run's outcome was unknown and its idempotent agent's step asked it to stop, to
        /// run the next attempt once it is final: an interruption then is the step's own doing.
        closing: bool,
    },
    /// A wait for a `resume`; its deadline, when it has one (journaled with the call).
    Pause {
        deadline_at_ms: Option<i64>,
    },
    /// A wait for a decision; its deadline, when it has one (journaled with the call).
    HumanCheckpoint {
        deadline_at_ms: Option<i64>,
    },
    CaptureArtifact,
    ReadArtifact,
    /// A durable timer: when it is due, in epoch milliseconds (journaled with the call).
    Sleep {
        due_at_ms: Option<i64>,
    },
    /// A wait for an event of a name: its deadline, when it has one, and the event it took.
    WaitForEvent {
        deadline_at_ms: Option<i64>,
        event_seq: Option<i64>,
    },
}

impl StepCall {
    /// A call of `kind` with nothing recorded yet.
    pub fn new(kind: StepKind) -> StepCall {
        match kind {
            StepKind::Agent => StepCall::Agent {
                child: None,
                previous_run_id: None,
                detached: false,
                run_status: None,
                retry: None,
                closing: false,
            },
            StepKind::Pause => StepCall::Pause {
                deadline_at_ms: None,
            },
            StepKind::HumanCheckpoint => StepCall::HumanCheckpoint {
                deadline_at_ms: None,
            },
            StepKind::CaptureArtifact => StepCall::CaptureArtifact,
            StepKind::ReadArtifact => StepCall::ReadArtifact,
            StepKind::Sleep => StepCall::Sleep { due_at_ms: None },
            StepKind::WaitForEvent => StepCall::WaitForEvent {
                deadline_at_ms: None,
                event_seq: None,
            },
        }
    }

    pub fn kind(&self) -> StepKind {
        match self {
            StepCall::Agent { .. } => StepKind::Agent,
            StepCall::Pause { .. } => StepKind::Pause,
            StepCall::HumanCheckpoint { .. } => StepKind::HumanCheckpoint,
            StepCall::CaptureArtifact => StepKind::CaptureArtifact,
            StepCall::ReadArtifact => StepKind::ReadArtifact,
            StepCall::Sleep { .. } => StepKind::Sleep,
            StepCall::WaitForEvent { .. } => StepKind::WaitForEvent,
        }
    }

    /// When a wait's deadline passes, if it has one.
    pub fn deadline_at_ms(&self) -> Option<i64> {
        match self {
            StepCall::Pause { deadline_at_ms }
            | StepCall::HumanCheckpoint { deadline_at_ms }
            | StepCall::WaitForEvent { deadline_at_ms, .. } => *deadline_at_ms,
            _ => None,
        }
    }
}

/// An `agent` attempt its step's retry policy queued: the durable timer it waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryWait {
    /// When it may be admitted, in epoch milliseconds.
    pub due_at_ms: i64,
    /// When the step's first attempt began (its `totalMs` counts from there).
    pub first_at_ms: i64,
    /// Why the attempt before is run again when that is not its error (the unknown outcome of an
    /// idempotent agent's run); `None`: its error, which is stored once, on that attempt's row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The step's `maxAttempts` when it was queued, so that a record can say "attempt 3 of 5"
    /// (the policy merges the call's, the agent's and the defaults: nothing else keeps it).
    /// `None` in a journal written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
}

/// An operator's reconcile of a step's attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reconciled {
    pub by: String,
    pub reason: String,
    /// `retry`, `fail` or `complete`.
    pub resolution: String,
}

/// One journal entry's record (see the module documentation for how it is stored).
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    pub call: StepCall,
    /// The call's arguments as the script gave them.
    pub args: Value,
    pub outcome: Option<StepOutcome>,
    /// When it settled, in epoch milliseconds.
    pub settled_at_ms: Option<i64>,
    pub reconciled: Option<Reconciled>,
}

impl StepRecord {
    /// A call of `kind` with `args`, not settled.
    pub fn new(kind: StepKind, args: Value) -> StepRecord {
        StepRecord {
            call: StepCall::new(kind),
            args,
            outcome: None,
            settled_at_ms: None,
            reconciled: None,
        }
    }

    pub fn kind(&self) -> StepKind {
        self.call.kind()
    }

    /// The child run of an admitted `agent` attempt.
    pub fn child(&self) -> Option<&StepChild> {
        match &self.call {
            StepCall::Agent { child, .. } => child.as_deref(),
            _ => None,
        }
    }

    /// The run id of an admitted `agent` attempt.
    pub fn run_id(&self) -> Option<&RunId> {
        self.child().map(|child| &child.run_id)
    }

    /// The artifact version a `humanCheckpoint` reviews or a `readArtifact` reads.
    pub fn artifact_version(&self) -> Option<i64> {
        match self.call {
            StepCall::HumanCheckpoint { .. } | StepCall::ReadArtifact => {
                self.args["artifactVersion"].as_i64()
            }
            _ => None,
        }
    }

    /// The step whose workspace a `captureArtifact` reads.
    pub fn source_step_id(&self) -> Option<&str> {
        match self.call {
            StepCall::CaptureArtifact => self.args["sourceStepId"].as_str(),
            _ => None,
        }
    }

    /// The child run a `step_finished` event names: the attempt's own, or else the one its
    /// outcome names (`outcome.value.runId`).
    pub fn finished_run_id(&self) -> Option<&str> {
        self.run_id()
            .map(RunId::as_str)
            .or_else(|| self.outcome.as_ref()?.value()["runId"].as_str())
    }

    /// The bytes its error takes, as its owner's quota counts them: a rejected outcome's value
    /// as JSON text (the message in it cut at ingest to `limits.error_bytes_max`); 0 for any
    /// other row.
    pub fn error_bytes(&self) -> i64 {
        match &self.outcome {
            Some(StepOutcome::Rejected(error)) => {
                i64::try_from(error.to_string().len()).unwrap_or(i64::MAX)
            }
            _ => 0,
        }
    }

    /// The artifact version its outcome made (`outcome.value.artifactVersion`: an agent's
    /// output, a capture).
    pub fn output_version(&self) -> Option<i64> {
        self.outcome.as_ref()?.value()["artifactVersion"].as_i64()
    }

    /// The stored `data` document.
    pub fn encode(&self) -> Value {
        let mut data = Map::new();
        data.insert("args".into(), self.args.clone());
        data.insert(
            "outcome".into(),
            self.outcome
                .as_ref()
                .and_then(|outcome| serde_json::to_value(outcome).ok())
                .unwrap_or(Value::Null),
        );
        data.insert("settled_at_ms".into(), self.settled_at_ms.into());
        if let StepCall::Agent {
            child,
            previous_run_id,
            detached,
            run_status,
            retry,
            closing,
        } = &self.call
        {
            if *closing {
                data.insert("closing".into(), true.into());
            }
            if let Some(retry) = retry {
                data.insert(
                    "retry".into(),
                    serde_json::to_value(retry).unwrap_or(Value::Null),
                );
            }
            if let Some(child) = child {
                data.insert("run_id".into(), child.run_id.as_str().into());
                data.insert("thread_id".into(), child.thread_id.clone().into());
                data.insert(
                    "configuration_version".into(),
                    child.configuration_version.clone().into(),
                );
            }
            if let Some(previous) = previous_run_id {
                data.insert("previous_run_id".into(), previous.as_str().into());
            }
            if *detached {
                data.insert("detached".into(), true.into());
            }
            if let Some(status) = run_status {
                data.insert("run_status".into(), status.as_str().into());
            }
        }
        if let StepCall::Sleep {
            due_at_ms: Some(due),
        } = &self.call
        {
            data.insert("due_at_ms".into(), (*due).into());
        }
        if let Some(deadline) = self.call.deadline_at_ms() {
            data.insert("deadline_at_ms".into(), deadline.into());
        }
        if let StepCall::WaitForEvent {
            event_seq: Some(seq),
            ..
        } = &self.call
        {
            data.insert("event_seq".into(), (*seq).into());
        }
        if let Some(reconciled) = &self.reconciled {
            data.insert(
                "reconciled".into(),
                serde_json::to_value(reconciled).unwrap_or(Value::Null),
            );
        }
        Value::Object(data)
    }

    /// The record a stored `kind` and `data` hold. A text no kind names, or a document whose
    /// keys hold what they cannot, is a store error naming what is wrong, never a default.
    pub fn decode(kind: &str, data: &Value) -> Result<StepRecord> {
        let invalid = |what: String| Error::Database(format!("stored step is invalid: {what}"));
        let kind = StepKind::parse(kind).ok_or_else(|| invalid(format!("kind {kind:?}")))?;
        let text = |key: &str| -> Result<Option<String>> {
            match &data[key] {
                Value::Null => Ok(None),
                Value::String(text) => Ok(Some(text.clone())),
                other => Err(invalid(format!("{key} {other}"))),
            }
        };
        let outcome = match &data["outcome"] {
            Value::Null => None,
            outcome => Some(
                serde_json::from_value(outcome.clone())
                    .map_err(|e| invalid(format!("its outcome: {e}")))?,
            ),
        };
        let settled_at_ms = match &data["settled_at_ms"] {
            Value::Null => None,
            at => Some(
                at.as_i64()
                    .ok_or_else(|| invalid(format!("settled_at_ms {at} is not a whole number")))?,
            ),
        };
        let reconciled = match &data["reconciled"] {
            Value::Null => None,
            record => Some(
                serde_json::from_value(record.clone())
                    .map_err(|e| invalid(format!("its reconcile: {e}")))?,
            ),
        };
        let whole = |key: &str| -> Result<Option<i64>> {
            match &data[key] {
                Value::Null => Ok(None),
                at => Ok(Some(at.as_i64().ok_or_else(|| {
                    invalid(format!("{key} {at} is not a whole number"))
                })?)),
            }
        };
        let call = match kind {
            StepKind::Agent => {
                let child = match text("run_id")? {
                    Some(run_id) => Some(Box::new(StepChild {
                        run_id: RunId::from(run_id),
                        thread_id: text("thread_id")?.unwrap_or_default(),
                        configuration_version: text("configuration_version")?,
                    })),
                    None => None,
                };
                let run_status = match text("run_status")? {
                    Some(status) => Some(
                        RunStatus::parse(&status)
                            .ok_or_else(|| invalid(format!("run_status {status:?}")))?,
                    ),
                    None => None,
                };
                StepCall::Agent {
                    child,
                    previous_run_id: text("previous_run_id")?.map(RunId::from),
                    detached: data["detached"] == Value::Bool(true),
                    run_status,
                    closing: data["closing"] == Value::Bool(true),
                    retry: match &data["retry"] {
                        Value::Null => None,
                        wait => Some(
                            serde_json::from_value(wait.clone())
                                .map_err(|e| invalid(format!("its retry: {e}")))?,
                        ),
                    },
                }
            }
            StepKind::Sleep => StepCall::Sleep {
                due_at_ms: whole("due_at_ms")?,
            },
            StepKind::Pause => StepCall::Pause {
                deadline_at_ms: whole("deadline_at_ms")?,
            },
            StepKind::HumanCheckpoint => StepCall::HumanCheckpoint {
                deadline_at_ms: whole("deadline_at_ms")?,
            },
            StepKind::WaitForEvent => StepCall::WaitForEvent {
                deadline_at_ms: whole("deadline_at_ms")?,
                event_seq: whole("event_seq")?,
            },
            kind => StepCall::new(kind),
        };
        Ok(StepRecord {
            call,
            args: data["args"].clone(),
            outcome,
            settled_at_ms,
            reconciled,
        })
    }
}

/// Binds as the stored JSON document (`jsonb`), or, where a statement asks for a `bigint`, as the
/// bytes of its error ([`StepRecord::error_bytes`]), so that a journal row's statement takes
/// both from one borrowed record.
impl tokio_postgres::types::ToSql for StepRecord {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> std::result::Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
    {
        if *ty == tokio_postgres::types::Type::INT8 {
            self.error_bytes().to_sql(ty, out)
        } else {
            self.encode().to_sql(ty, out)
        }
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <Value as tokio_postgres::types::ToSql>::accepts(ty)
            || *ty == tokio_postgres::types::Type::INT8
    }

    tokio_postgres::types::to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn admitted() -> StepRecord {
        StepRecord {
            call: StepCall::Agent {
                child: Some(Box::new(StepChild {
                    run_id: RunId::from("run-1"),
                    thread_id: "t-1".into(),
                    configuration_version: Some("c-1".into()),
                })),
                previous_run_id: Some(RunId::from("run-0")),
                detached: true,
                run_status: Some(RunStatus::Interrupted),
                retry: Some(Box::new(RetryWait {
                    due_at_ms: 4_000,
                    first_at_ms: 1_000,
                    reason: Some("boom".into()),
                    max_attempts: Some(5),
                })),
                closing: true,
            },
            args: json!({"agentRef": "a", "task": "t"}),
            outcome: Some(StepOutcome::Resolved(
                json!({"runId": "run-1", "artifactVersion": 2}),
            )),
            settled_at_ms: Some(5_000),
            reconciled: Some(Reconciled {
                by: "ops@example.com".into(),
                reason: "checked".into(),
                resolution: "complete".into(),
            }),
        }
    }

    #[test]
    fn the_stored_schema_is_the_documented_one() {
        assert_eq!(
            admitted().encode(),
            json!({
                "args": {"agentRef": "a", "task": "t"},
                "outcome": {"outcome": "resolved", "value": {"runId": "run-1", "artifactVersion": 2}},
                "settled_at_ms": 5_000,
                "run_id": "run-1",
                "thread_id": "t-1",
                "configuration_version": "c-1",
                "previous_run_id": "run-0",
                "retry": {"due_at_ms": 4_000, "first_at_ms": 1_000, "reason": "boom",
                          "max_attempts": 5},
                "closing": true,
                "detached": true,
                "run_status": "interrupted",
                "reconciled": {"by": "ops@example.com", "reason": "checked", "resolution": "complete"},
            })
        );
        let checkpoint = StepRecord::new(StepKind::HumanCheckpoint, json!({"artifactVersion": 3}));
        assert_eq!(
            checkpoint.encode(),
            json!({"args": {"artifactVersion": 3}, "outcome": null, "settled_at_ms": null})
        );
        assert_eq!(checkpoint.artifact_version(), Some(3));
        let wait = StepRecord {
            call: StepCall::WaitForEvent {
                deadline_at_ms: Some(9_000),
                event_seq: Some(4),
            },
            ..StepRecord::new(StepKind::WaitForEvent, json!({"name": "paid"}))
        };
        assert_eq!(
            wait.encode(),
            json!({"args": {"name": "paid"}, "outcome": null, "settled_at_ms": null,
                   "deadline_at_ms": 9_000, "event_seq": 4})
        );
        assert_eq!(
            StepRecord::decode("waitForEvent", &wait.encode()).expect("decode"),
            wait
        );
    }

    #[test]
    fn every_kind_reads_back_what_it_wrote() {
        let record = admitted();
        assert_eq!(
            StepRecord::decode("agent", &record.encode()).expect("decode"),
            record
        );
        for &kind in StepKind::ALL {
            let record = StepRecord::new(kind, json!({"n": 1}));
            assert_eq!(
                StepRecord::decode(kind.as_str(), &record.encode()).expect("decode"),
                record
            );
            assert_eq!(StepKind::parse(kind.as_str()), Some(kind));
        }
    }

    #[test]
    fn a_stored_step_that_holds_what_it_cannot_is_an_error_naming_it() {
        let bad = |kind: &str, data: Value| {
            let Err(Error::Database(message)) = StepRecord::decode(kind, &data) else {
                panic!("{kind} {data} decoded");
            };
            message
        };
        assert!(bad("teleport", json!({})).contains("kind \"teleport\""));
        assert!(bad("pause", json!({"settled_at_ms": 1.5})).contains("settled_at_ms 1.5"));
        assert!(bad("pause", json!({"outcome": {"x": 1}})).contains("its outcome"));
        assert!(bad("agent", json!({"run_id": 7})).contains("run_id 7"));
    }
}
