//! A workflow's document (`workflows.data`), typed: what its launch (or retry) recorded, and how
//! it ended. Encoded and decoded here only ([`WorkflowDoc::encode`], [`WorkflowDoc::decode`]);
//! the workflow's machine, the front door's rules and the API's record read the type.
//!
//! # The stored schema (`workflows.data`)
//! A JSON object with these keys; a key this build does not know (a later build's) is kept as it
//! is through every write ([`WorkflowDoc::extra`]):
//! - `script`, `args`, `seed`, `started_at_ms` (always): the program, its arguments, the seed of
//!   its randomness, and where its clock starts (a retry keeps its source's);
//! - `timeout_ms` (a launch since limits were recorded): its life limit in milliseconds, `null`
//!   for none; absent on documents from before, which keep the node's ([`LifeLimit`]);
//! - `launched_at_ms` (a retry): when it was launched, which its life limit counts from (a launch
//!   counts from `started_at_ms`);
//! - `runtime_version`, `configuration_version` (always since they were recorded): the runtime
//!   and agents' configuration it runs under. **The SQL reads these two** (the recover check of
//!   both backends and the simulation store, the listing of takeover candidates);
//! - `title` (a launch that gave one; a retry keeps it);
//! - `retry_of` (a retry): the failed workflow it runs again;
//! - `result` (completed), `error` (failed): how it ended;
//! - `reconciliation` (needs_reconciliation): `{"reason", "message", "step_id", "run_id",
//!   "at_ms"}`, why an operator must settle it.
//!
//! `tests::the_stored_schema_is_the_documented_one` holds the encoding to this list.

use serde_json::{Map, Value, json};

use crate::{Error, Result, WorkflowId};

/// How long a workflow may live from its launch (`timeout_seconds`, recorded as `timeout_ms`):
/// past it, it is cancelled with reason `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LifeLimit {
    /// This many milliseconds.
    Millis(u64),
    /// No limit: neither its launch nor the node's configuration set one.
    Unlimited,
    /// Launched before launches recorded their limit: it keeps the node's.
    Unrecorded,
}

/// Why a workflow waits for an operator (`reconciliation`).
#[derive(Debug, Clone, PartialEq)]
pub struct DocReconciliation {
    /// `cancel_window_passed` or `journal_unreadable` (`None`: recorded before reasons were).
    pub reason: Option<String>,
    /// What is unknown, in a sentence (`None`: recorded before messages were).
    pub message: Option<String>,
    pub step_id: String,
    /// The child run whose effects an operator must check; empty when none.
    pub run_id: String,
    /// When it was recorded (epoch ms, the owner's clock).
    pub at_ms: Option<i64>,
}

/// A workflow's document.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkflowDoc {
    pub script: String,
    pub args: Value,
    pub seed: u64,
    /// Where the workflow's clock starts (`Date.now()` before any step settled): its launch, or,
    /// for a retry, its source's, so that the journal it adopted replays as it ran.
    pub started_at_ms: i64,
    /// When a retry was launched (`None`: a launch, launched at `started_at_ms`).
    pub launched_at: Option<i64>,
    pub life: LifeLimit,
    pub runtime_version: Option<String>,
    pub configuration_version: Option<String>,
    pub title: Option<String>,
    pub retry_of: Option<String>,
    /// What it returned (completed; `null` is a value).
    pub result: Option<Value>,
    /// Why it failed.
    pub error: Option<String>,
    pub reconciliation: Option<DocReconciliation>,
    /// Keys this build does not know, kept as they are.
    pub extra: Map<String, Value>,
}

/// Every key this build reads and writes.
const KEYS: [&str; 13] = [
    "script",
    "args",
    "seed",
    "started_at_ms",
    "timeout_ms",
    "launched_at_ms",
    "runtime_version",
    "configuration_version",
    "title",
    "retry_of",
    "result",
    "error",
    "reconciliation",
];

impl WorkflowDoc {
    /// The document a launch writes. The title, if any, is for people only: nothing of the
    /// workflow's run reads it.
    #[allow(
        clippy::too_many_arguments,
        reason = "each field of the launch's document, named once here"
    )]
    pub fn launched(
        script: String,
        args: Value,
        title: Option<String>,
        seed: u64,
        started_at_ms: i64,
        timeout_ms: Option<u64>,
        runtime_version: String,
        configuration_version: String,
    ) -> Self {
        WorkflowDoc {
            script,
            args,
            seed,
            started_at_ms,
            launched_at: None,
            life: timeout_ms.map_or(LifeLimit::Unlimited, LifeLimit::Millis),
            runtime_version: Some(runtime_version),
            configuration_version: Some(configuration_version),
            title,
            retry_of: None,
            result: None,
            error: None,
            reconciliation: None,
            extra: Map::new(),
        }
    }

    /// The document of a retry of `source`, launched at `launched_at_ms`: its source's script,
    /// arguments, seed, clock, life limit and title, this node's versions, and the workflow it
    /// retries.
    pub fn retried(
        source: &WorkflowDoc,
        retry_of: &WorkflowId,
        launched_at_ms: i64,
        runtime_version: String,
        configuration_version: String,
    ) -> Self {
        WorkflowDoc {
            script: source.script.clone(),
            args: source.args.clone(),
            seed: source.seed,
            started_at_ms: source.started_at_ms,
            launched_at: Some(launched_at_ms),
            life: source.life,
            runtime_version: Some(runtime_version),
            configuration_version: Some(configuration_version),
            title: source.title.clone(),
            retry_of: Some(retry_of.as_str().to_owned()),
            result: None,
            error: None,
            reconciliation: None,
            extra: Map::new(),
        }
    }

    /// When it was launched: its life limit counts from here.
    pub fn launched_at_ms(&self) -> i64 {
        self.launched_at.unwrap_or(self.started_at_ms)
    }

    /// When its life limit passes, in epoch ms, if it has one; `node_timeout_ms` is the node's
    /// `timeout_seconds`, which a document from before launches recorded their limit keeps.
    pub fn deadline_ms(&self, node_timeout_ms: u64) -> Option<i64> {
        let limit_ms = match self.life {
            LifeLimit::Millis(ms) => ms,
            LifeLimit::Unlimited => return None,
            LifeLimit::Unrecorded => node_timeout_ms,
        };
        let limit_ms = i64::try_from(limit_ms).unwrap_or(i64::MAX);
        Some(self.launched_at_ms().saturating_add(limit_ms))
    }

    /// The stored form.
    pub fn encode(&self) -> Value {
        let mut data = self.extra.clone();
        let mut put = |key: &str, value: Value| {
            data.insert(key.to_owned(), value);
        };
        put("script", json!(self.script));
        put("args", self.args.clone());
        put("seed", json!(self.seed));
        put("started_at_ms", json!(self.started_at_ms));
        match self.life {
            LifeLimit::Millis(ms) => put("timeout_ms", json!(ms)),
            LifeLimit::Unlimited => put("timeout_ms", Value::Null),
            LifeLimit::Unrecorded => {}
        }
        let optional = [
            ("launched_at_ms", self.launched_at.map(|ms| json!(ms))),
            (
                "runtime_version",
                self.runtime_version.as_ref().map(|v| json!(v)),
            ),
            (
                "configuration_version",
                self.configuration_version.as_ref().map(|v| json!(v)),
            ),
            ("title", self.title.as_ref().map(|v| json!(v))),
            ("retry_of", self.retry_of.as_ref().map(|v| json!(v))),
            ("result", self.result.clone()),
            ("error", self.error.as_ref().map(|v| json!(v))),
            (
                "reconciliation",
                self.reconciliation.as_ref().map(|why| {
                    json!({"reason": why.reason, "message": why.message, "step_id": why.step_id,
                           "run_id": why.run_id, "at_ms": why.at_ms})
                }),
            ),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                put(key, value);
            }
        }
        Value::Object(data)
    }

    /// Reads the stored document of `workflow_id`. A document without a field its launch wrote,
    /// or with one of another type, is a stored value that cannot be decoded (a database error,
    /// 500), never a caller's bad request: no request of the caller's wrote it.
    pub fn decode(workflow_id: &WorkflowId, data: &Value) -> Result<Self> {
        let broken = |what: &str| {
            Error::Database(format!(
                "workflow {workflow_id:?}: its stored document has no {what}"
            ))
        };
        let object = data.as_object().ok_or_else(|| broken("object"))?;
        let text = |key: &str| -> Result<Option<String>> {
            match object.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => Err(broken(&format!("{key} as text"))),
            }
        };
        let whole = |key: &str| -> Result<Option<i64>> {
            match object.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(value) => value
                    .as_i64()
                    .map(Some)
                    .ok_or_else(|| broken(&format!("{key} as a whole number"))),
            }
        };
        let script = text("script")?.ok_or_else(|| broken("script"))?;
        let seed = object
            .get("seed")
            .and_then(Value::as_u64)
            .ok_or_else(|| broken("seed"))?;
        let started_at_ms = whole("started_at_ms")?.ok_or_else(|| broken("started_at_ms"))?;
        let life = match object.get("timeout_ms") {
            None => LifeLimit::Unrecorded,
            Some(Value::Null) => LifeLimit::Unlimited,
            Some(ms) => LifeLimit::Millis(
                ms.as_u64()
                    .ok_or_else(|| broken("timeout_ms as a whole number"))?,
            ),
        };
        Ok(WorkflowDoc {
            script,
            args: object.get("args").cloned().unwrap_or(Value::Null),
            seed,
            started_at_ms,
            launched_at: whole("launched_at_ms")?,
            life,
            runtime_version: text("runtime_version")?,
            configuration_version: text("configuration_version")?,
            title: text("title")?,
            retry_of: text("retry_of")?,
            result: object.get("result").cloned(),
            error: text("error")?,
            reconciliation: WorkflowDoc::reconciliation_of(data),
            extra: object
                .iter()
                .filter(|(key, _)| !KEYS.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
        })
    }

    /// A stored document's `reconciliation`, read without decoding the rest (every page of a
    /// workflow's steps marks its uncertain attempt with it).
    pub fn reconciliation_of(data: &Value) -> Option<DocReconciliation> {
        match data.get("reconciliation") {
            None | Some(Value::Null) => None,
            Some(why) => Some(DocReconciliation {
                reason: why["reason"].as_str().map(str::to_owned),
                message: why["message"].as_str().map(str::to_owned),
                step_id: why["step_id"].as_str().unwrap_or_default().to_owned(),
                run_id: why["run_id"].as_str().unwrap_or_default().to_owned(),
                at_ms: why["at_ms"].as_i64(),
            }),
        }
    }

    /// A stored document's title, read without decoding the rest (a listing shows one a row).
    pub fn title_of(data: &Value) -> Option<&str> {
        data.get("title").and_then(Value::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> WorkflowId {
        WorkflowId::new("wf-1")
    }

    fn everything() -> WorkflowDoc {
        let mut doc = WorkflowDoc::retried(
            &WorkflowDoc::launched(
                "return 1;".into(),
                json!({"a": 1}),
                Some("Report".into()),
                7,
                1_000,
                Some(60_000),
                "r-1".into(),
                "c-1".into(),
            ),
            &id(),
            2_000,
            "r-2".into(),
            "c-2".into(),
        );
        doc.result = Some(json!({"done": true}));
        doc.error = Some("it failed".into());
        doc.reconciliation = Some(DocReconciliation {
            reason: Some("cancel_window_passed".into()),
            message: Some("unknown".into()),
            step_id: "s".into(),
            run_id: "run-1".into(),
            at_ms: Some(3_000),
        });
        doc
    }

    #[test]
    fn the_stored_schema_is_the_documented_one() {
        let data = everything().encode();
        let mut keys: Vec<&str> = data
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        let mut documented = KEYS.to_vec();
        documented.sort_unstable();
        assert_eq!(keys, documented);
        // What the SQL of every backend reads.
        assert_eq!(data["runtime_version"], "r-2");
        assert_eq!(data["configuration_version"], "c-2");
        assert_eq!(
            data["reconciliation"],
            json!({"reason": "cancel_window_passed", "message": "unknown", "step_id": "s",
                   "run_id": "run-1", "at_ms": 3_000})
        );
    }

    #[test]
    fn every_document_reads_back_as_written_and_keeps_keys_it_does_not_know() {
        let doc = everything();
        assert_eq!(
            WorkflowDoc::decode(&id(), &doc.encode()).expect("read"),
            doc
        );
        let mut data = doc.encode();
        data["a_later_key"] = json!([1, 2]);
        let read = WorkflowDoc::decode(&id(), &data).expect("read");
        assert_eq!(read.extra.get("a_later_key"), Some(&json!([1, 2])));
        assert_eq!(read.encode(), data);
        let launched = WorkflowDoc::launched(
            "x".into(),
            Value::Null,
            None,
            1,
            5,
            None,
            "r".into(),
            "c".into(),
        );
        let data = launched.encode();
        assert_eq!(data["timeout_ms"], Value::Null);
        assert!(data.get("launched_at_ms").is_none() && data.get("title").is_none());
        assert_eq!(launched.launched_at_ms(), 5);
    }

    #[test]
    fn a_document_missing_what_its_launch_wrote_is_a_database_error() {
        for (data, says) in [
            (json!({"seed": 1, "started_at_ms": 1}), "no script"),
            (json!({"script": "x", "started_at_ms": 1}), "no seed"),
            (json!({"script": "x", "seed": 1}), "no started_at_ms"),
            (
                json!({"script": "x", "seed": 1, "started_at_ms": 1, "timeout_ms": "soon"}),
                "timeout_ms as a whole number",
            ),
            (
                json!({"script": "x", "seed": 1, "started_at_ms": 1, "title": 3}),
                "title as text",
            ),
            (json!([]), "no object"),
        ] {
            let error = WorkflowDoc::decode(&id(), &data).expect_err(says);
            assert!(
                matches!(&error, Error::Database(message) if message.contains(says)),
                "{error}"
            );
        }
        let old = json!({"script": "x", "args": null, "seed": 1, "started_at_ms": 1});
        let read = WorkflowDoc::decode(&id(), &old).expect("read");
        assert_eq!(read.life, LifeLimit::Unrecorded);
        assert_eq!(read.deadline_ms(10), Some(11));
        assert_eq!(read.encode(), old);
    }
}
