//! The ids of workflows and child runs, each a type of its own so that one cannot be passed
//! where the other is meant. Both are text in the database (`workflows.id`, `runs.run_id`, and
//! every column that names one), bound to SQL and serialized to JSON as that bare text, and shown
//! (`Display`, `Debug`) as the text alone, so messages that quote one read as before. Neither
//! checks its text: an id from a person is checked once at the edge that parses it (the HTTP
//! layer, with `runtime::is_id`); one read back from the database is what was written.
//!
//! A workflow's id where a run's is meant does not compile:
//!
//! ```compile_fail,E0308
//! fn read_run(run_id: &store::RunId) {}
//! read_run(&store::WorkflowId::new("wf-1"));
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};

/// The idempotency key of one attempt of a workflow's step, `workflow/step/attempt`: the one
/// run that attempt may have is admitted under it, and found by it again (a replay's admission,
/// a reconcile's `CloseStepRuns`). Built here only.
pub fn idempotency_key(workflow_id: &WorkflowId, step_id: &str, attempt: i32) -> String {
    format!("{workflow_id}/{step_id}/{attempt}")
}

/// Declares an id type over `String` with what both kinds of id have.
macro_rules! id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id of this text, as written or read back (the edge that took it from a
            /// person has checked it).
            pub fn new(id: impl Into<String>) -> Self {
                $name(id.into())
            }

            /// The text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The text, owned.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_owned())
            }
        }

        /// Compares with text, as tests and a check of what a person typed do.
        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// As the bare text's: a message that quotes an id (`{id:?}`) reads as it always did.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl rusqlite::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                self.0.to_sql()
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(
                value: rusqlite::types::ValueRef<'_>,
            ) -> rusqlite::types::FromSqlResult<Self> {
                String::column_result(value).map($name)
            }
        }

        impl tokio_postgres::types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut tokio_postgres::types::private::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
            {
                self.0.to_sql(ty, out)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <String as tokio_postgres::types::ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }

        impl<'a> tokio_postgres::types::FromSql<'a> for $name {
            fn from_sql(
                ty: &tokio_postgres::types::Type,
                raw: &'a [u8],
            ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                String::from_sql(ty, raw).map($name)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <String as tokio_postgres::types::FromSql>::accepts(ty)
            }
        }
    };
}

id! {
    /// A workflow's id (`workflows.id`): also the resource its lease names
    /// (`extension_execution_leases.resource_id`) and what the HTTP API calls its `run_id`.
    WorkflowId
}

id! {
    /// A child run's id (`runs.run_id`).
    RunId
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_its_bare_text_in_json_and_in_messages() {
        let workflow = WorkflowId::new("wf-1");
        let run = RunId::new("run-1");
        assert_eq!(
            serde_json::to_value((&workflow, &run)).expect("serializes"),
            serde_json::json!(["wf-1", "run-1"])
        );
        let back: RunId = serde_json::from_value(serde_json::json!("run-1")).expect("reads");
        assert_eq!(back, run);
        assert_eq!(
            format!("workflow {workflow:?}, run {run}"),
            r#"workflow "wf-1", run run-1"#
        );
        assert_eq!(workflow.into_string(), "wf-1");
    }
}
