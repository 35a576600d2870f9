//! The route table: every route's method, path, operation, who may call it, and the types of its
//! body and reply. The router matches requests against this table and `openapi.json` is
//! generated from it, so the two cannot disagree.

use schemars::{JsonSchema, Schema, SchemaGenerator};

use super::wire::*;

/// Produces the JSON Schema of a body or reply type.
pub type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Anyone.
    Public,
    /// A signed-in user or an API token.
    User,
    /// An admin.
    Admin,
}

/// What a route's request body is.
#[derive(Clone, Copy)]
pub enum Body {
    None,
    Json(SchemaFn),
    /// `application/x-www-form-urlencoded`.
    Form(SchemaFn),
}

/// What a route does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Health,
    Ready,
    Metrics,
    OpenApi,
    Plugins,
    Initialize,
    Login,
    Logout,
    Me,
    CreateUser,
    ListUsers,
    /// Change a user's role, or disable or enable them.
    ChangeUser,
    /// An admin sets a user's password.
    ResetPassword,
    /// An admin ends every session of a user.
    SignOutUser,
    DeleteUser,
    /// A user changes their own password.
    ChangePassword,
    SignOutEverywhere,
    CreateToken,
    ListTokens,
    RevokeToken,
    Launch,
    List,
    Get,
    Resume,
    Decide,
    /// Send an event to a workflow's `waitForEvent`.
    SendEvent,
    /// Answer a step's agent's approval request.
    Answer,
    Cancel,
    Recover,
    Reconcile,
    /// Run a failed workflow again from its failed step, as a new workflow.
    Retry,
    Delete,
    /// A page of a workflow's steps.
    Steps,
    /// A page of a workflow's artifact versions (without their bytes).
    Artifacts,
    /// The raw bytes of an artifact version (REST, with `Range`).
    Artifact,
    /// One base64 chunk of an artifact (the compatible `get_artifact` action).
    ArtifactChunk,
    /// A workflow's events (Server-Sent Events).
    WorkflowEvents,
    /// Status changes of every workflow the caller may see (Server-Sent Events).
    Events,
    /// Everything that waits for the caller.
    Inbox,
    Nodes,
    Slots,
}

/// Where a route's workflow id comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// REST: the id is in the path.
    Rest,
    /// The compatible action endpoint: the id is `run_id` in the body.
    Compat,
}

/// One route.
#[derive(Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    /// Segments in braces are parameters: `/api/v1/workflows/{id}`.
    pub path: &'static str,
    pub op: Op,
    pub surface: Surface,
    pub access: Access,
    pub summary: &'static str,
    pub body: Body,
    /// The success status and its reply type (`None`: not JSON).
    pub success: u16,
    pub reply: Option<SchemaFn>,
    /// The query parameters it takes; any other is refused (400), as a body's unknown field is.
    pub query: &'static [Query],
    /// The compatible action's body fields that stand for what its REST route takes in the path
    /// or the query (`compat.rs`).
    pub lifts: &'static [Lift],
}

/// A compatible action's body field that stands for what the REST route takes elsewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lift {
    /// Required: an id the REST path names, `(field, path parameter)`: `run_id` is `{id}`.
    Id(&'static str, &'static str),
    /// Optional: `wait_ms`, a whole number of milliseconds, the REST route's `?wait=`.
    WaitMs,
}

/// A query parameter.
#[derive(Debug, Clone, Copy)]
pub struct Query {
    pub name: &'static str,
    pub description: &'static str,
    pub takes: Takes,
}

/// What a query parameter takes (the description states it; the handler checks it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takes {
    /// A duration: `500ms`, `30s`, `2m` ([`super::rules::DURATION`]).
    Duration,
    /// A page length from 1 to a configured maximum.
    Limit(PageOf),
    /// A listing's status filter.
    Status,
    /// A listing's wait filter.
    WaitingFor,
    /// An id.
    Id,
    /// A listing's position ([`super::rules::LIST_CURSOR`]).
    ListCursor,
    /// A position in a journal ([`super::rules::STEP_CURSOR`]).
    StepCursor,
    /// A whole number from 0: an artifact version or an event id.
    Position,
}

/// Which page a `limit` is of (each has its configured maximum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageOf {
    Workflows,
    Steps,
    Artifacts,
}

const fn query(name: &'static str, takes: Takes, description: &'static str) -> Query {
    Query {
        name,
        description,
        takes,
    }
}

/// A workflow's id, as the REST paths name it.
const RUN: &[Lift] = &[Lift::Id("run_id", "id")];

/// The compatible surface's plugin id.
pub const PLUGIN_ID: &str = "community.workflows";

const REST: &str = "/api/v1/workflows";

/// The path of a compatible action.
macro_rules! action_path {
    ($name:literal) => {
        concat!("/api/plugins/community.workflows/actions/", $name)
    };
}

#[allow(clippy::too_many_arguments)]
const fn route(
    method: &'static str,
    path: &'static str,
    op: Op,
    access: Access,
    summary: &'static str,
    body: Body,
    success: u16,
    reply: Option<SchemaFn>,
) -> Route {
    Route {
        method,
        path,
        op,
        surface: Surface::Rest,
        access,
        summary,
        body,
        success,
        reply,
        query: &[],
        lifts: &[],
    }
}

const fn action(
    path: &'static str,
    op: Op,
    summary: &'static str,
    lifts: &'static [Lift],
    body: SchemaFn,
    reply: SchemaFn,
) -> Route {
    Route {
        method: "POST",
        path,
        op,
        surface: Surface::Compat,
        access: Access::User,
        summary,
        body: Body::Json(body),
        success: 200,
        reply: Some(reply),
        query: &[],
        lifts,
    }
}

/// Every route of the control plane.
#[rustfmt::skip]
pub static ROUTES: &[Route] = &[
    route("GET", "/health", Op::Health, Access::Public, "The process is alive", Body::None, 200, Some(schema::<HealthReply>)),
    route("GET", "/health/ready", Op::Ready, Access::Public, "The database answers, its schema is this build's, and the node is not draining", Body::None, 200, None),
    route("GET", "/metrics", Op::Metrics, Access::Public, "Prometheus metrics (text format)", Body::None, 200, None),
    route("GET", "/api/v1/openapi.json", Op::OpenApi, Access::Public, "This description", Body::None, 200, None),
    route("GET", "/api/plugins", Op::Plugins, Access::Public, "The plugins offered (the compatible surface)", Body::None, 200, Some(schema::<PluginsReply>)),
    route("POST", "/api/v1/auth/initialize", Op::Initialize, Access::Public, "Create the first admin and sign in (409 once any user exists)", Body::Json(schema::<InitializeBody>), 201, Some(schema::<UserReply>)),
    route("POST", "/api/v1/auth/login/local", Op::Login, Access::Public, "Sign in with email and password; sets the session and CSRF cookies", Body::Form(schema::<LoginForm>), 200, Some(schema::<UserReply>)),
    route("POST", "/api/v1/auth/logout", Op::Logout, Access::User, "End this session", Body::None, 200, Some(schema::<UserReply>)),
    route("GET", "/api/v1/auth/me", Op::Me, Access::User, "Who is signed in", Body::None, 200, Some(schema::<UserReply>)),
    route("POST", "/api/v1/auth/users", Op::CreateUser, Access::Admin, "Create a user (admins)", Body::Json(schema::<NewUserBody>), 201, Some(schema::<UserReply>)),
    route("GET", "/api/v1/auth/users", Op::ListUsers, Access::Admin, "Every user, oldest first (admins)", Body::None, 200, Some(schema::<UsersReply>)),
    route("PATCH", "/api/v1/auth/users/{id}", Op::ChangeUser, Access::Admin, "Change a user's role, or disable (ends their sessions, refuses their API tokens) or enable them (admins; 409 last_admin)", Body::Json(schema::<UserChangeBody>), 200, Some(schema::<UserReply>)),
    route("DELETE", "/api/v1/auth/users/{id}", Op::DeleteUser, Access::Admin, "Delete a user with their sessions and API tokens (admins; 409 for yourself or a user with a live workflow)", Body::None, 200, Some(schema::<DeletedUserReply>)),
    route("POST", "/api/v1/auth/users/{id}/password", Op::ResetPassword, Access::Admin, "Set a user's password and end their sessions (admins)", Body::Json(schema::<PasswordResetBody>), 200, Some(schema::<UserReply>)),
    route("POST", "/api/v1/auth/users/{id}/sign-out", Op::SignOutUser, Access::Admin, "End every session of a user (admins)", Body::None, 200, Some(schema::<UserReply>)),
    route("POST", "/api/v1/auth/me/password", Op::ChangePassword, Access::User, "Change your own password; your other sessions end", Body::Json(schema::<PasswordChangeBody>), 200, Some(schema::<UserReply>)),
    route("POST", "/api/v1/auth/sign-out-everywhere", Op::SignOutEverywhere, Access::User, "End every session of yours, this one too", Body::None, 200, Some(schema::<UserReply>)),
    route("POST", "/api/v1/auth/tokens", Op::CreateToken, Access::User, "Create an API token; its secret is shown only in this reply", Body::Json(schema::<NewTokenBody>), 201, Some(schema::<NewTokenReply>)),
    route("GET", "/api/v1/auth/tokens", Op::ListTokens, Access::User, "The signed-in user's API tokens (never their secrets)", Body::None, 200, Some(schema::<TokensReply>)),
    route("DELETE", "/api/v1/auth/tokens/{id}", Op::RevokeToken, Access::User, "Revoke one of the user's API tokens", Body::None, 200, Some(schema::<TokenReply>)),
    Route {
        query: &[query("wait", Takes::Duration, "wait this long (500ms, 30s, 2m; at most `http.wait_max_ms`) for the workflow to end or wait for a person, and answer with its record")],
        ..route("POST", REST, Op::Launch, Access::User, "Launch a workflow (201; 200 when the same request launched it before)", Body::Json(schema::<LaunchBody>), 201, Some(schema::<LaunchAnswer>))
    },
    Route {
        query: &[
            query("status", Takes::Status, "only workflows with this status as `get` shows it: a stored status, `recoverable` (live, the owner's lease expired) or `waiting_for_input`"),
            query("waiting_for", Takes::WaitingFor, "only workflows with a call that waits for this (what their `waiting_for` shows)"),
            query("after", Takes::ListCursor, "the page starts after this position: the previous page's `next`"),
            query("limit", Takes::Limit(PageOf::Workflows), "workflows per page (default 50, at most `http.page_size_max`)"),
            query("request_id", Takes::Id, "only the workflow launched with this request_id"),
            query("user_id", Takes::Id, "only this user's workflows (for those who see everyone's; ignored for others)"),
        ],
        ..route("GET", REST, Op::List, Access::User, "A page of workflows, newest first (admins and approvers see everyone's)", Body::None, 200, Some(schema::<WorkflowPage>))
    },
    Route {
        query: &[query("wait", Takes::Duration, "wait this long (500ms, 30s, 2m; at most `http.wait_max_ms`) for the workflow to end or wait for a person; then 200 with the record as it is")],
        ..route("GET", "/api/v1/workflows/{id}", Op::Get, Access::User, "A workflow with its checkpoints and the first page of its steps and of its artifact versions (`steps_next`, `artifacts_next` lead on)", Body::None, 200, Some(schema::<WorkflowRecord>))
    },
    Route {
        query: &[
            query("after", Takes::StepCursor, "the page starts after this position: the record's `steps_next`, or the previous page's `next`"),
            query("limit", Takes::Limit(PageOf::Steps), "steps per page (default and at most `http.record_steps_page_max`)"),
        ],
        ..route("GET", "/api/v1/workflows/{id}/steps", Op::Steps, Access::User, "A page of a workflow's steps, in journal order", Body::None, 200, Some(schema::<StepPageReply>))
    },
    Route {
        query: &[
            query("after", Takes::Position, "the page starts above this version: the record's `artifacts_next`, or the previous page's `next`"),
            query("limit", Takes::Limit(PageOf::Artifacts), "versions per page (default and at most `http.record_artifacts_page_max`)"),
        ],
        ..route("GET", "/api/v1/workflows/{id}/artifacts", Op::Artifacts, Access::User, "A page of a workflow's artifact versions, oldest first, without their bytes", Body::None, 200, Some(schema::<ArtifactPageReply>))
    },
    route("POST", "/api/v1/workflows/{id}/resume", Op::Resume, Access::User, "Resolve a pause", Body::Json(schema::<ResumeBody>), 200, Some(schema::<ControlReply>)),
    route("POST", "/api/v1/workflows/{id}/events", Op::SendEvent, Access::User, "Send an event to a live workflow: kept until a `waitForEvent` of its name takes it, once per `event_id` (200 `repeated` for the same event again, 409 for another under the same id, 422 once the workflow ended)", Body::Json(schema::<SendEventBody>), 200, Some(schema::<EventReply>)),
    route("POST", "/api/v1/workflows/{id}/decide", Op::Decide, Access::User, "Approve or reject a checkpoint's artifact version, once", Body::Json(schema::<DecideBody>), 200, Some(schema::<ControlReply>)),
    route("POST", "/api/v1/workflows/{id}/steps/{step}/answer", Op::Answer, Access::User, "Approve or reject what a step's agent asked to do (its newest pending request), once", Body::Json(schema::<AnswerBody>), 200, Some(schema::<AnswerReply>)),
    route("POST", "/api/v1/workflows/{id}/cancel", Op::Cancel, Access::User, "Cancel durably (idempotent)", Body::None, 200, Some(schema::<StatusReply>)),
    route("POST", "/api/v1/workflows/{id}/recover", Op::Recover, Access::User, "Take over a recoverable workflow here and replay it", Body::None, 200, Some(schema::<StatusReply>)),
    route("POST", "/api/v1/workflows/{id}/reconcile", Op::Reconcile, Access::Admin, "Settle the uncertain step of a workflow in needs_reconciliation (admins)", Body::Json(schema::<ReconcileBody>), 200, Some(schema::<StatusReply>)),
    route("POST", "/api/v1/workflows/{id}/retry", Op::Retry, Access::User, "Run a failed workflow again from its failed step, as a new workflow that adopts the steps before it (201; 200 `repeated` with the retry made before; its owner or an admin)", Body::Json(schema::<RetryBody>), 201, Some(schema::<RetryReply>)),
    route("DELETE", "/api/v1/workflows/{id}", Op::Delete, Access::User, "Delete a terminal workflow and everything it holds", Body::None, 200, Some(schema::<DeletedReply>)),
    Route {
        query: &[query("after", Takes::Position, "replay the events after this id (the `Last-Event-ID` header wins)")],
        ..route("GET", "/api/v1/workflows/{id}/events", Op::WorkflowEvents, Access::User, "The workflow's events as Server-Sent Events (text/event-stream): replayed after an id, then followed; the stream ends after the final status", Body::None, 200, None)
    },
    Route {
        query: &[query("after", Takes::Position, "replay the status changes after this id (the `Last-Event-ID` header wins); without either, from now")],
        ..route("GET", "/api/v1/events", Op::Events, Access::User, "Status changes of every workflow the caller may see (an admin: everyone's) as Server-Sent Events", Body::None, 200, None)
    },
    route("GET", "/api/v1/inbox", Op::Inbox, Access::User, "Every pause, checkpoint and agent's request waiting for the caller (an approver or admin: for anyone), oldest first", Body::None, 200, Some(schema::<InboxReply>)),
    route("GET", "/api/v1/admin/nodes", Op::Nodes, Access::Admin, "The nodes that started on this database, newest first (admins)", Body::None, 200, Some(schema::<NodesReply>)),
    route("GET", "/api/v1/admin/slots", Op::Slots, Access::Admin, "The child slots held across the cluster, oldest first (admins)", Body::None, 200, Some(schema::<SlotsReply>)),
    route("GET", "/api/v1/workflows/{id}/artifacts/{version}", Op::Artifact, Access::User, "An artifact's bytes (HTTP Range supported)", Body::None, 200, None),
    action(action_path!("launch"), Op::Launch, "launch", &[Lift::WaitMs], schema::<LaunchBody>, schema::<LaunchAnswer>),
    action(action_path!("get"), Op::Get, "get", &[Lift::Id("run_id", "id"), Lift::WaitMs], schema::<EmptyBody>, schema::<WorkflowRecord>),
    action(action_path!("resume"), Op::Resume, "resume", RUN, schema::<ResumeBody>, schema::<ControlReply>),
    action(action_path!("decide"), Op::Decide, "decide", RUN, schema::<DecideBody>, schema::<ControlReply>),
    action(action_path!("answer"), Op::Answer, "answer", &[Lift::Id("run_id", "id"), Lift::Id("step_id", "step")], schema::<AnswerBody>, schema::<AnswerReply>),
    action(action_path!("cancel"), Op::Cancel, "cancel", RUN, schema::<EmptyBody>, schema::<StatusReply>),
    action(action_path!("recover"), Op::Recover, "recover", RUN, schema::<EmptyBody>, schema::<StatusReply>),
    action(action_path!("delete"), Op::Delete, "delete", RUN, schema::<EmptyBody>, schema::<DeletedReply>),
    action(action_path!("get_artifact"), Op::ArtifactChunk, "get_artifact: chunks of at most 1 MiB", RUN, schema::<ArtifactChunkBody>, schema::<ArtifactChunkReply>),
];

/// What the router found for a request.
pub enum Found {
    Route(&'static Route, Vec<(&'static str, String)>),
    /// The path exists, not with this method.
    WrongMethod(Vec<&'static str>),
    Nothing,
}

/// The route for `method` and `path`, with its path parameters.
pub fn find(method: &str, path: &str) -> Found {
    let mut methods = Vec::new();
    for route in ROUTES {
        let Some(params) = matches(route.path, path) else {
            continue;
        };
        if route.method == method {
            return Found::Route(route, params);
        }
        methods.push(route.method);
    }
    if methods.is_empty() {
        Found::Nothing
    } else {
        Found::WrongMethod(methods)
    }
}

fn matches(pattern: &'static str, path: &str) -> Option<Vec<(&'static str, String)>> {
    let mut params = Vec::new();
    let mut given = path.split('/');
    for expected in pattern.split('/') {
        let segment = given.next()?;
        match expected.strip_prefix('{').and_then(|e| e.strip_suffix('}')) {
            Some(name) if !segment.is_empty() => params.push((name, segment.to_owned())),
            Some(_) => return None,
            None if expected == segment => {}
            None => return None,
        }
    }
    given.next().is_none().then_some(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_with_parameters_and_methods_are_told_apart() {
        let Found::Route(route, params) = find("GET", "/api/v1/workflows/abc/artifacts/3") else {
            panic!("no route");
        };
        assert_eq!(route.op, Op::Artifact);
        assert_eq!(
            params,
            vec![("id", "abc".to_owned()), ("version", "3".to_owned())]
        );
        assert!(matches!(
            find("PUT", "/api/v1/workflows/abc"),
            Found::WrongMethod(_)
        ));
        assert!(matches!(
            find("GET", "/api/v1/workflows/abc/extra/x/y"),
            Found::Nothing
        ));
        assert!(matches!(find("GET", "/api/v1/workflows//"), Found::Nothing));
        let Found::Route(route, _) = find(
            "POST",
            "/api/plugins/community.workflows/actions/get_artifact",
        ) else {
            panic!("no action route");
        };
        assert_eq!(
            (route.op, route.surface),
            (Op::ArtifactChunk, Surface::Compat)
        );
    }

    #[test]
    fn no_two_routes_share_a_method_and_path() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {}",
                    a.method,
                    a.path
                );
            }
        }
    }
}
