//! What the runtime and its host exchange: the calls a script makes, the journal that records
//! them with their outcomes, and what an activation hands back.

use serde::{Deserialize, Serialize};
use serde_json::Value;

include!("call_kinds.rs");

macro_rules! call_kind {
    ($($(#[$doc:meta])* $kind:ident = $name:literal,)*) => {
        /// The script API calls that are steps (declared once, in `call_kinds.rs`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum CallKind {
            $($(#[$doc])* #[serde(rename = $name)] $kind,)*
        }

        impl CallKind {
            /// Every kind, in the order of their declaration.
            pub const ALL: &'static [CallKind] = &[$(CallKind::$kind,)*];

            pub fn parse(name: &str) -> Option<Self> {
                match name {
                    $($name => Some(CallKind::$kind),)*
                    _ => None,
                }
            }

            /// The script's name for it, which the journal stores.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(CallKind::$kind => $name,)*
                }
            }
        }
    };
}

with_call_kinds!(call_kind);

impl CallKind {
    /// Whether the call names its own step (`readArtifact` reads; it has no `stepId`).
    pub fn has_step_id(self) -> bool {
        self != CallKind::ReadArtifact
    }
}

/// How a call ended: resolved with a value, or rejected with an error object
/// (`{"message", "status", ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "value", rename_all = "snake_case")]
pub enum Outcome {
    Resolved(Value),
    Rejected(Value),
}

/// One call of a run, in the order the script made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// 0, 1, 2, ... in call order; replay matches calls by it.
    pub seq: u32,
    pub kind: CallKind,
    /// The call's `stepId` (for `readArtifact`, `read:<seq>`).
    pub step_id: String,
    pub args: Value,
    /// `None` while the call is in flight.
    pub outcome: Option<Outcome>,
    /// Workflow time (epoch ms) when the outcome was recorded: what `Date.now()` shows after it.
    pub settled_at_ms: Option<i64>,
}

/// Identifies a call within one VM's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct CallId(pub u32);

/// A call the host must carry out: a step that is not in the journal with an outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Command {
    pub id: CallId,
    pub seq: u32,
    pub kind: CallKind,
    pub step_id: String,
    pub args: Value,
    /// The journal already has this call without an outcome (it was in flight when the previous
    /// owner stopped): the host decides whether to adopt, admit or reconcile it.
    pub in_flight_in_journal: bool,
}

/// Where a run stands after an activation.
#[derive(Debug, Clone, PartialEq)]
pub enum Status {
    /// Waiting for the outcomes of the commands handed out (this time or before).
    Waiting,
    /// The script returned this value.
    Completed(Value),
    /// The script threw, a limit was exceeded, or the replay diverged from the journal.
    Failed(String),
}

/// What one activation produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Activation {
    /// New calls for the host, in call order.
    pub commands: Vec<Command>,
    /// Calls to stop: a `parallel` failed and these siblings are still outstanding.
    pub cancels: Vec<CallId>,
    /// New journal entries (calls made this activation), for the host to persist before acting.
    pub journal: Vec<JournalEntry>,
    pub status: Status,
    /// Lines the script logged (`console.log`).
    pub logs: Vec<String>,
}
