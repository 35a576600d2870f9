//! The JSON shapes of the control plane: request bodies (unknown fields refused) and replies. The
//! route table names these types, and `openapi.json` is generated from them, so the description
//! cannot drift from what the server parses.
//!
//! A body names no workflow or step: the REST routes take them from the path, and the compatible
//! action endpoint from `run_id` (and `step_id`) beside the body's own fields (`compat.rs`).
//! Values with a rule are typed ([`Id`], [`Decision`], ranges), so that a body that breaks a rule
//! is refused as it is read, naming the field, by the same declaration the description states.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::rules;

/// An id (the one grammar: 1 to 128 of `A-Z a-z 0-9 - _ .`), refused as the body is read when
/// it is not one.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Id(String);

impl Id {
    pub fn into_string(self) -> String {
        self.0
    }
}

impl TryFrom<String> for Id {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        if runtime::is_id(&text) {
            Ok(Id(text))
        } else {
            Err(format!("{text:?} is not an id ({})", runtime::ID_GRAMMAR))
        }
    }
}

impl JsonSchema for Id {
    fn schema_name() -> Cow<'static, str> {
        "Id".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": rules::ID_PATTERN,
            "minLength": 1,
            "maxLength": runtime::ID_CHARS_MAX,
            "description": "An id: 1 to 128 of A-Z, a-z, 0-9, '-', '_', '.'",
        })
    }
}

/// A person's decision on a checkpoint or an agent's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Approve,
    Reject,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Approve => "approve",
            Decision::Reject => "reject",
        }
    }

    /// What the decision makes of what it decides.
    pub fn outcome(self) -> &'static str {
        match self {
            Decision::Approve => "approved",
            Decision::Reject => "rejected",
        }
    }
}

/// How an operator settles an uncertain step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Resolution {
    /// Run it again (attempt + 1).
    Retry,
    /// Fail it.
    Fail,
    /// Complete it with `output`.
    Complete,
}

/// The schema of a line of text of 1 to `max` characters (see [`rules::check_line`]); the
/// description carries the node's configured `max`.
pub fn line_schema(max: u64) -> Value {
    serde_json::json!({"type": "string", "minLength": 1, "maxLength": max,
                       "pattern": rules::line_pattern()})
}

/// A workflow's life limit at most: a year.
pub const TIMEOUT_SECONDS_MAX: u64 = actors::TIMEOUT_SECONDS_MAX;

/// A whole number for an integer field: also one written with a zero fraction (`258.0`), which
/// JSON Schema's `integer` takes (a client that writes every number as a float is not refused).
pub fn whole<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i128>,
{
    let number = serde_json::Number::deserialize(deserializer)?;
    let value = number
        .as_i64()
        .map(i128::from)
        .or_else(|| number.as_u64().map(i128::from))
        .or_else(|| {
            // An f64 this large is beyond every integer field's range anyway.
            number
                .as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e30)
                .map(|f| f as i128)
        });
    value
        .and_then(|value| T::try_from(value).ok())
        .ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{number} is not a whole number in the field's range"
            ))
        })
}

/// [`whole`] for an optional field (`null` is leaving it out).
pub fn whole_or_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i128>,
{
    #[derive(Deserialize)]
    struct Whole<T: TryFrom<i128>>(#[serde(deserialize_with = "whole")] T);
    Ok(Option::<Whole<T>>::deserialize(deserializer)?.map(|Whole(value)| value))
}

/// `launch`: start a workflow, idempotently per (user, `request_id`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchBody {
    /// The caller's idempotency key: the same request again returns the same `run_id`.
    pub request_id: Option<Id>,
    /// What people call the workflow, shown beside its run id wherever it is listed: 1 to
    /// `limits.title_chars_max` characters, one line (no control or bidirectional formatting
    /// character), not blank. A retry keeps it.
    pub title: Option<String>,
    /// Its life limit: cancelled this many seconds after its launch (1 to a year). Without it,
    /// the node's `limits.timeout_seconds`; none when that is 0 (the default).
    #[serde(default, deserialize_with = "whole_or_null")]
    #[schemars(range(min = 1, max = TIMEOUT_SECONDS_MAX))]
    pub timeout_seconds: Option<u64>,
    /// The workflow script: the body of an async JavaScript function.
    pub script: String,
    /// The script's `args` (JSON).
    #[serde(default)]
    pub args: Value,
}

/// A body with no fields of its own (a compatible action's that names only its workflow).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyBody {}

/// `retry`: run a failed workflow again from its failed step, as a new workflow.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryBody {
    /// The caller's idempotency key, as a launch's: the retry is the failed workflow's owner's
    /// workflow under this id. A workflow is retried once anyway: asking again answers its retry.
    pub request_id: Option<Id>,
}

/// `resume`: resolve the `pause` of a step.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResumeBody {
    /// The workflow's `fingerprint` as the caller saw it; a stale one is refused (409).
    pub fingerprint: String,
    pub step_id: Id,
    #[serde(deserialize_with = "whole")]
    #[schemars(range(min = 1))]
    pub attempt: i32,
    /// What the `pause` call resolves to.
    #[serde(default)]
    pub input: Value,
}

/// An event for a workflow's `waitForEvent`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendEventBody {
    /// What a `waitForEvent` names.
    pub name: Id,
    /// The sender's id for this event: sending it again is a repeat.
    pub event_id: Id,
    /// What the `waitForEvent` call resolves to (at most `limits.frame_bytes_max` as JSON); never
    /// `null`, which is what a wait resolves to when its deadline passes.
    #[schemars(schema_with = "not_null")]
    pub payload: Value,
}

/// `decide`: approve or reject the artifact version a checkpoint is about.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    pub step_id: Id,
    #[serde(deserialize_with = "whole")]
    #[schemars(range(min = 1))]
    pub attempt: i32,
    /// The version the checkpoint is about; another is refused (409).
    #[serde(deserialize_with = "whole")]
    #[schemars(range(min = 1))]
    pub artifact_version: u64,
    pub decision: Decision,
    pub comment: Option<String>,
}

/// `answer`: approve or reject what a step's agent asked to do (its newest pending request).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerBody {
    pub decision: Decision,
    pub comment: Option<String>,
    /// The request answered; the step's pending one when absent.
    pub request_id: Option<Id>,
}

/// `reconcile` (admins): settle the uncertain step of a workflow in `needs_reconciliation`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("anyOf" = [
    {"properties": {"resolution": {"enum": ["retry", "fail"]}, "output": {"type": "null"}}},
    {"required": ["output"],
     "properties": {"resolution": {"const": "complete"}, "output": {"not": {"type": "null"}}}},
]))]
pub struct ReconcileBody {
    pub step_id: Id,
    pub resolution: Resolution,
    /// The step's output: with `complete` only, and required with it.
    pub output: Option<Value>,
    /// Why: what the operator checked. Kept with the workflow.
    pub reason: String,
}

/// `get_artifact`: one chunk of an artifact's bytes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactChunkBody {
    #[serde(deserialize_with = "whole")]
    #[schemars(range(min = 1))]
    pub version: i64,
    /// The first byte (default 0).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub offset: Option<u64>,
    /// Bytes wanted (default and at most 1 MiB).
    #[serde(default, deserialize_with = "whole_or_null")]
    pub length: Option<u64>,
}

/// `initialize`: the first admin.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InitializeBody {
    #[schemars(schema_with = "email")]
    pub email: String,
    #[schemars(schema_with = "password")]
    pub password: String,
}

/// Any JSON value but `null`.
fn not_null(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"not": {"type": "null"}})
}

/// A new user's email ([`rules::EMAIL`]).
fn email(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "pattern": rules::EMAIL.source,
                  "maxLength": rules::EMAIL_CHARS_MAX})
}

/// A password: 12 to 256 characters (not the email, nor its part before the `@`: refused 422).
fn password(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "minLength": super::auth::PASSWORD_CHARS_MIN,
                  "maxLength": super::auth::PASSWORD_CHARS_MAX})
}

/// What a user may do: `user` (their own workflows), `approver` (also see every workflow and
/// resume, decide and answer on any), `admin` (everything, users included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RoleName {
    User,
    Approver,
    Admin,
}

impl From<RoleName> for store::Role {
    fn from(role: RoleName) -> Self {
        match role {
            RoleName::User => store::Role::User,
            RoleName::Approver => store::Role::Approver,
            RoleName::Admin => store::Role::Admin,
        }
    }
}

impl From<store::Role> for RoleName {
    fn from(role: store::Role) -> Self {
        match role {
            store::Role::User => RoleName::User,
            store::Role::Approver => RoleName::Approver,
            store::Role::Admin => RoleName::Admin,
        }
    }
}

/// A new user (admins only).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("not" = {"anyOf": [
    {"required": ["role", "is_admin"],
     "properties": {"role": {"const": "admin"}, "is_admin": {"const": false}}},
    {"required": ["role", "is_admin"],
     "properties": {"role": {"enum": ["user", "approver"]}, "is_admin": {"const": true}}},
]}))]
pub struct NewUserBody {
    #[schemars(schema_with = "email")]
    pub email: String,
    #[schemars(schema_with = "password")]
    pub password: String,
    /// The older way to say `"role": "admin"`; when both are given they must agree.
    #[serde(default)]
    pub is_admin: Option<bool>,
    /// Default `user` (`admin` with `is_admin: true`).
    pub role: Option<RoleName>,
}

/// What an admin changes about a user; at least one field (neither may be `null`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(extend("minProperties" = 1))]
pub struct UserChangeBody {
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "RoleName")]
    pub role: Option<RoleName>,
    /// `true` ends the user's sessions and makes their API tokens refuse (401) until enabled.
    #[serde(default, deserialize_with = "present")]
    #[schemars(with = "bool")]
    pub disabled: Option<bool>,
}

/// A field that may be left out but not given as `null`.
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// An admin sets a user's password (their sessions end).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PasswordResetBody {
    #[schemars(schema_with = "password")]
    pub password: String,
}

/// A user changes their own password (their other sessions end).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PasswordChangeBody {
    pub current_password: String,
    #[schemars(schema_with = "password")]
    pub new_password: String,
}

/// A new API token for the signed-in user.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTokenBody {
    /// What the token is for, as the user will recognise it in a listing: one line of 1 to 100
    /// characters, not blank.
    #[schemars(schema_with = "token_name")]
    pub name: String,
    /// The token stops working this many days after it is made (1 to `auth.token_days_max`);
    /// without it the token lasts until revoked.
    #[serde(default, deserialize_with = "whole_or_null")]
    pub expires_in_days: Option<u32>,
}

/// A token's name at most, in characters.
pub const TOKEN_NAME_CHARS_MAX: u64 = 100;

fn token_name(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "minLength": 1, "maxLength": TOKEN_NAME_CHARS_MAX,
                  "pattern": rules::line_pattern()})
}

/// The local sign-in form (`application/x-www-form-urlencoded`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginForm {
    /// The user's email.
    pub username: String,
    pub password: String,
}

/// A user as the API shows it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct UserReply {
    pub id: String,
    pub email: String,
    pub role: RoleName,
    /// `role == "admin"` (kept for older clients).
    pub is_admin: bool,
    pub disabled: bool,
    /// Epoch seconds (database clock).
    pub created_at: f64,
    /// The last sign-in that opened a session; `null` before the first.
    pub last_login_at: Option<f64>,
    /// What the user's workflows store against their quota: in `me` and the admins' listing
    /// only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageReply>,
}

/// The bytes a user's workflows store, and their quota (`limits.user_stored_bytes_max`).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StorageReply {
    /// Their artifacts' bytes (captured files and agent outputs, until their workflow is
    /// deleted), and the room their running workflows hold for artifacts to come (at most
    /// 256 KiB each, given back when each ends).
    pub stored_bytes: i64,
    /// A step whose artifact would take the stored bytes past this fails; `null`: no quota.
    pub stored_bytes_max: Option<u64>,
}

/// Every user, oldest first (admins).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct UsersReply {
    pub users: Vec<UserReply>,
}

/// A user was deleted.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DeletedUserReply {
    pub id: String,
    pub deleted: bool,
}

/// A new API token: the only time its secret is shown.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NewTokenReply {
    pub id: String,
    pub name: String,
    /// Send as `Authorization: Bearer <token>`. It is not shown again.
    pub token: String,
    /// When it stops working (epoch seconds, database clock); `null`: never.
    pub expires_at: Option<f64>,
}

/// An API token as listed.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TokenReply {
    pub id: String,
    pub name: String,
    pub created_at: f64,
    pub revoked: bool,
    /// When it stops working (epoch seconds, database clock); `null`: never.
    pub expires_at: Option<f64>,
}

/// The signed-in user's tokens.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct TokensReply {
    pub tokens: Vec<TokenReply>,
}

/// What `launch` did.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LaunchReply {
    pub run_id: String,
    /// `false` when the same request had launched it before.
    pub created: bool,
    pub status: String,
}

/// What `retry` did.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RetryReply {
    /// The retry: a new workflow (201), or the one that retried it before (200, `repeated`).
    pub run_id: String,
    /// The failed workflow it runs again.
    pub retry_of: String,
    /// `true` when the workflow had been retried before: this is that retry.
    pub repeated: bool,
    pub status: String,
}

/// A launch that waited (`?wait=`, `wait_ms`): the workflow's record as the wait ended, with
/// the launch's own `created` beside `run_id` and `status`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct LaunchedRecord {
    #[serde(flatten)]
    pub record: WorkflowRecord,
    /// `false` when the same request had launched it before.
    pub created: bool,
}

/// What a launch answers: the launch alone, or the record once the wait ended.
#[derive(Debug, Clone, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum LaunchAnswer {
    // The record first: a client that tries each in turn would read a record as the launch
    // alone (it has the launch's fields too) and lose the rest.
    Waited(Box<LaunchedRecord>),
    Launched(LaunchReply),
}

/// A control was recorded (or an identical one was already).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ControlReply {
    pub run_id: String,
    /// `resumed`, `approved` or `rejected`.
    pub status: String,
    /// `true` when the same answer had been recorded before (a decision's comment aside): it
    /// counts once, as first recorded.
    pub repeated: bool,
    /// Who recorded the answer that stands (on a repeat, the first one).
    pub recorded_by: Option<String>,
    /// When the answer that stands was recorded (epoch seconds, database clock).
    pub recorded_at: f64,
}

/// An event was stored (or the same one was already).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct EventReply {
    pub run_id: String,
    /// `stored`, or `repeated` when this `event_id` held the same event already.
    pub status: String,
    pub repeated: bool,
    pub event_id: String,
    pub name: String,
    /// Who sent it first.
    pub sent_by: Option<String>,
    /// The step that took it, once a `waitForEvent` did.
    pub taken_by: Option<String>,
}

/// What `answer` recorded.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AnswerReply {
    pub run_id: String,
    pub step_id: String,
    /// The agent's request that was answered.
    pub request_id: String,
    /// `approved` or `rejected`.
    pub status: String,
    /// `true` when the same answer had been given before (it counts once).
    pub repeated: bool,
}

/// The workflow's status after an action.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StatusReply {
    pub run_id: String,
    pub status: String,
}

/// A workflow was deleted.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DeletedReply {
    pub run_id: String,
    pub deleted: bool,
}

/// One chunk of an artifact.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ArtifactChunkReply {
    pub version: i64,
    pub content_base64: String,
    pub offset: u64,
    pub total_bytes: u64,
    pub sha256: String,
}

/// One step of a workflow record: an `agent` call, a `captureArtifact` or a `readArtifact`, in
/// the order the script made them.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StepRecord {
    pub step_id: String,
    /// `agent`, `captureArtifact` or `readArtifact`.
    pub kind: String,
    pub attempt: i32,
    /// `queued`, `admitting`, `running`, `waiting_for_input` (its agent asked for approval and
    /// waits for a person's `answer`), `needs_reconciliation` (the attempt whose outcome an
    /// operator's reconcile settles), `completed`, `failed` or `cancelled`.
    pub status: String,
    pub thread_id: Option<String>,
    /// The child run, once admitted.
    pub run_id: Option<String>,
    pub configuration_version: Option<String>,
    /// An agent's output (a capture's and a read's result are in `artifacts`).
    pub output: Option<Value>,
    /// The version an agent's output or a capture became, or the version a read read.
    pub artifact_version: Option<i64>,
    pub error: Option<String>,
    /// How a failed attempt failed: `error`, `timeout`, `interrupted` or `cancelled` (the
    /// script's `StepError.status`).
    pub error_status: Option<String>,
    /// An attempt its step's retry policy queued: when it may start, and why the attempt
    /// before is run again.
    pub retry: Option<RetryRecord>,
    /// A `sleep`: when its timer is due (epoch seconds, the owner's clock).
    pub wakes_at: Option<f64>,
    /// A `pause`, `humanCheckpoint` or `waitForEvent` with a `timeoutMs`: when its deadline
    /// passes (epoch seconds, the owner's clock).
    pub deadline_at: Option<f64>,
    /// The agent's newest approval request, when it asked one.
    pub approval: Option<ApprovalRecord>,
    /// When the call was journaled (epoch seconds, database clock; for a step that waited for
    /// a slot, when it began to wait; for an attempt its retry policy queued, when the attempt
    /// before ended).
    pub started_at: f64,
    /// When it began to run (epoch seconds, database clock): an `agent` attempt's child run's
    /// admission, any other step's journaling; `null` while it has not begun.
    pub run_started_at: Option<f64>,
    /// Milliseconds from `started_at` to `run_started_at`: the wait before it ran (its retry's
    /// backoff, a wait for a slot), never counted in `ran_ms`.
    pub waited_ms: Option<i64>,
    /// Milliseconds from `run_started_at` to `finished_at`: how long it ran, once it ended.
    pub ran_ms: Option<i64>,
    /// When its outcome was recorded (epoch seconds, the owner's clock), once it has one.
    pub finished_at: Option<f64>,
    /// An operator's reconcile that settled this attempt.
    pub reconciled: Option<ReconciledRecord>,
}

/// An operator's reconcile of an attempt whose outcome was unknown.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReconciledRecord {
    /// The admin who settled it.
    pub by: String,
    /// Why, as they wrote it (what they checked).
    pub reason: String,
    /// `retry`, `fail` or `complete`.
    pub resolution: String,
}

/// An attempt its step's retry policy queued behind a durable timer.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RetryRecord {
    /// When it may start (epoch seconds, the owner's clock): the wait before it is this less
    /// the attempt before's `finished_at`.
    pub due_at: f64,
    /// Why the attempt before is run again: its error, or why its outcome was unknown.
    pub reason: String,
}

/// An agent's request for a person's approval, and its answer.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ApprovalRecord {
    /// The child run that asked.
    pub run_id: String,
    pub request_id: String,
    /// What the agent asks to do, as it described it.
    pub actions: Value,
    /// `waiting` or `answered`.
    pub status: String,
    /// When the run paused (epoch seconds, database clock), while it waits.
    pub asked_at: Option<f64>,
    /// The answer given: `{"decision", "comment", "by"}`.
    pub answer: Option<Value>,
}

/// One place where the workflow waits for a person: a `pause` or a `humanCheckpoint`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CheckpointRecord {
    pub step_id: String,
    /// `pause` or `humanCheckpoint`.
    pub kind: String,
    pub attempt: i32,
    pub source_step_id: Option<String>,
    pub artifact_version: Option<i64>,
    /// `waiting`, then `approved` or `rejected` (a decision) or `resumed` (a pause).
    pub status: String,
    /// Who answered: a person, or `timeout` (the wait's deadline decided).
    pub decided_by: Option<String>,
    pub decided_at: Option<f64>,
    /// When its `timeoutMs` passes, if it has one (epoch seconds, the owner's clock).
    pub deadline_at: Option<f64>,
    /// What a `pause` tells whoever answers it (its `message`).
    pub message: Option<String>,
    /// The comment the person who answered gave with their decision.
    pub comment: Option<String>,
    /// When the workflow began to wait here (epoch seconds, database clock).
    pub started_at: f64,
}

/// One call a live workflow waits on, and what for (`kind`), read from its journal: its status
/// stays the stored one (`running` while it sleeps).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum WaitRecord {
    /// A `sleep` or `sleepUntil`, until its due time (`until`, epoch seconds).
    Sleep { step_id: String, until: f64 },
    /// A `waitForEvent`, for an event `name`, until its `deadline` if it has one (epoch
    /// seconds).
    Event {
        step_id: String,
        name: String,
        deadline: Option<f64>,
    },
    /// A person's answer: to a `pause` or a `humanCheckpoint` (`call`; until its `deadline`, if
    /// it has one) or to an agent's approval request (`call` `agent`).
    Person {
        step_id: String,
        call: String,
        deadline: Option<f64>,
    },
    /// An agent attempt that waits for a slot (or for the attempt before's run to end).
    Slot { step_id: String, attempt: i32 },
    /// An agent attempt its retry policy queued, until its backoff ends (`at`, epoch seconds):
    /// attempt `attempt` of `max_attempts` (`null` in a journal written before it was kept).
    Retry {
        step_id: String,
        at: f64,
        attempt: i32,
        max_attempts: Option<u32>,
    },
}

/// A workflow as `get` shows it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WorkflowRecord {
    pub run_id: String,
    /// The launch's `title`, if it gave one.
    pub title: Option<String>,
    /// The stored status; or `recoverable` when it is live and its owner's lease has expired;
    /// or `waiting_for_input` when it is `running` and a step's agent waits for a person's
    /// answer to its approval request.
    pub status: String,
    /// The status as stored (differs from `status` when `recoverable` or `waiting_for_input`).
    pub stored_status: String,
    /// What it waits for: one entry per call that waits (several under `parallel`), in journal
    /// order; empty unless it is `running`, `paused` or `waiting_approval` and waits.
    pub waiting_for: Vec<WaitRecord>,
    pub recoverable: bool,
    pub user_id: String,
    pub owner: Option<String>,
    pub epoch: Option<i64>,
    /// When the owner's lease runs out (epoch seconds, database clock).
    pub lease_expires_at: Option<f64>,
    pub script: String,
    pub args: Value,
    pub fingerprint: String,
    pub runtime_version: Option<String>,
    pub configuration_version: Option<String>,
    /// The first steps in journal order, at most `http.record_steps_page_max`.
    pub steps: Vec<StepRecord>,
    /// Where the steps go on: pass as `after` to `GET /api/v1/workflows/{id}/steps`; `null` when
    /// `steps` holds every step.
    pub steps_next: Option<String>,
    /// Every pause and human checkpoint, in journal order.
    pub checkpoints: Vec<CheckpointRecord>,
    /// The first artifact versions, oldest first, at most `http.record_artifacts_page_max` (the
    /// bytes at `.../artifacts/{version}`).
    pub artifacts: Vec<ArtifactRecord>,
    /// Where the artifact versions go on: pass as `after` to
    /// `GET /api/v1/workflows/{id}/artifacts`; `null` when `artifacts` holds every version.
    pub artifacts_next: Option<i64>,
    pub result: Option<Value>,
    pub error: Option<String>,
    /// Why the workflow waits for an operator's `reconcile` (only in `needs_reconciliation`).
    pub reconciliation: Option<ReconciliationRecord>,
    /// The failed workflow this one runs again from its failed step (`retry`), if it is a retry.
    pub retry_of: Option<String>,
    /// The workflow that runs this one again from its failed step, if it was retried.
    pub retried_by: Option<String>,
    pub created_at: f64,
    pub updated_at: f64,
}

/// An artifact version as a record lists it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ArtifactRecord {
    pub version: i64,
    /// The step that made it: the agent whose output it is, or the `captureArtifact`.
    pub step_id: Option<String>,
    /// The captured file's path in the workspace (`null` for an agent's output).
    pub path: Option<String>,
    /// The file name a download gets.
    pub name: String,
    pub bytes: i64,
    /// The `Content-Type` it is served with.
    pub media_type: String,
    pub sha256: String,
    /// Epoch seconds.
    pub created_at: f64,
}

/// Why a workflow needs reconciliation: which step, which child run, and what is unknown.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ReconciliationRecord {
    /// `orphaned_child`, `child_outcome_unknown`, `child_end_unrecorded`,
    /// `cancel_window_passed` or `journal_unreadable`.
    pub reason: String,
    /// What is unknown, in a sentence.
    pub message: String,
    pub step_id: String,
    /// The child run whose effects an operator must check.
    pub run_id: String,
    /// When it was recorded (epoch seconds, the owner's clock).
    pub at: Option<f64>,
}

/// A workflow as a listing shows it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WorkflowSummary {
    pub run_id: String,
    /// The launch's `title`, if it gave one.
    pub title: Option<String>,
    /// As `get` shows it: the stored status, `recoverable` when it is live and its owner's
    /// lease has expired, or `waiting_for_input` when a step's agent waits for a person.
    pub status: String,
    pub stored_status: String,
    /// What it waits for, as `get` shows it.
    pub waiting_for: Vec<WaitRecord>,
    pub recoverable: bool,
    pub user_id: String,
    pub owner: Option<String>,
    pub fingerprint: String,
    pub created_at: f64,
    pub updated_at: f64,
}

/// A page of a workflow's steps, in journal order.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StepPageReply {
    pub run_id: String,
    pub steps: Vec<StepRecord>,
    /// Pass as `after` for the next page; `null` on the last one. A position in the journal,
    /// not an offset: steps journaled meanwhile come on later pages, none twice.
    pub next: Option<String>,
}

/// A page of a workflow's artifact versions, oldest first.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ArtifactPageReply {
    pub run_id: String,
    pub artifacts: Vec<ArtifactRecord>,
    /// Pass as `after` for the next page (the last version of this one); `null` on the last.
    pub next: Option<i64>,
}

/// A page of workflows, newest first.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WorkflowPage {
    pub workflows: Vec<WorkflowSummary>,
    /// Pass as `after` for the next page; `null` on the last one. A position, not an offset:
    /// workflows launched meanwhile do not shift the pages that follow.
    pub next: Option<String>,
    /// The same as `next` (for older clients).
    pub next_after: Option<String>,
}

/// Everything that waits for the caller: pauses, checkpoints and agents' requests of the
/// workflows they may see, oldest first.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InboxReply {
    pub items: Vec<InboxItem>,
    /// `true` when more workflows wait than `http.inbox_workflows_max`: the items are those of
    /// the oldest ones.
    pub more: bool,
    /// Workflows that wait but whose record cannot be read (a stored value the node cannot
    /// decode): left out of `items` so that the rest can be answered, named here so that an
    /// admin can look at them (the node's log says why).
    pub unreadable: Vec<String>,
}

/// One question waiting for a person.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct InboxItem {
    /// `pause` (answer with `resume`), `humanCheckpoint` (`decide`) or `agent_request`
    /// (`answer`).
    pub kind: String,
    pub run_id: String,
    /// The workflow's `title`, if its launch gave one.
    pub title: Option<String>,
    pub step_id: String,
    pub attempt: i32,
    /// The workflow's owner (a user id).
    pub user_id: String,
    /// The workflow's fingerprint, which `resume` takes.
    pub fingerprint: String,
    /// Since when it waits (epoch seconds, database clock).
    pub since: f64,
    /// The artifact version a checkpoint is about.
    pub artifact_version: Option<i64>,
    pub source_step_id: Option<String>,
    /// What a `pause` tells whoever answers it (its `message`).
    pub message: Option<String>,
    /// When it becomes overdue (its call's `remindAfterMs` after `since`), if it has a reminder.
    pub remind_at: Option<f64>,
    /// Whether `remind_at` has passed (by the answering node's clock).
    pub overdue: bool,
    /// When its deadline (its call's `timeoutMs`) decides it, if it has one (epoch seconds, the
    /// owner's clock).
    pub deadline_at: Option<f64>,
    /// No node runs its workflow (its owner's lease ran out): an answer is recorded now and
    /// applied when a node takes the workflow over (`recover`).
    pub recoverable: bool,
    /// What the agent asks (an `agent_request`).
    pub approval: Option<ApprovalRecord>,
}

/// A node as `GET /api/v1/admin/nodes` lists it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NodeReply {
    pub worker_id: String,
    pub host: String,
    pub pid: i64,
    pub version: String,
    pub started_at: f64,
    /// Absent while it runs (or if it died without recording its stop).
    pub stopped_at: Option<f64>,
}

/// The nodes that started on this database, newest first.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NodesReply {
    pub nodes: Vec<NodeReply>,
}

/// A held child slot.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SlotReply {
    pub run_id: String,
    pub step_id: String,
    pub attempt: i32,
    pub created_at: f64,
}

/// The child slots held across the cluster.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct SlotsReply {
    /// Slots held in all.
    pub held: i64,
    /// The oldest of them.
    pub slots: Vec<SlotReply>,
}

/// The plugins this server offers (the compatible surface).
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PluginsReply {
    pub plugins: Vec<PluginReply>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PluginReply {
    pub id: String,
    pub version: String,
    pub actions: Vec<String>,
}

/// Liveness.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct HealthReply {
    pub status: String,
    /// The cluster the node belongs to: the same on every node of it (they share a secret), so
    /// the CLI recognises a cluster it signed in to through another node.
    pub cluster: String,
}

/// The one error shape.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorReply {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorBody {
    /// Stable, machine-readable: `not_found`, `conflict`, `csrf`, ...
    pub code: String,
    /// For people: names the field, limit or rule.
    pub message: String,
}
