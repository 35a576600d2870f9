//! `GET /api/v1/openapi.json`: an OpenAPI 3.1 description generated from the route table and the
//! wire types it names (never written by hand beside them), with this node's configured bounds.
//!
//! The contract it states: a request that follows it is never answered 400 (a value outside a
//! rule is refused by the same declaration that states the rule); what depends on the state of
//! the workflows, users or limits answers 404, 409, 422 or 429; every status an operation answers
//! is declared on it. Schemathesis holds the server to this in the test suite.

use std::collections::BTreeSet;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::routes::{Access, Body, Lift, Op, PageOf, ROUTES, Route, Surface, Takes};
use super::rules;
use super::wire::{ErrorReply, Id, line_schema};

/// The configured bounds the description states (each named by its configuration key).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// `limits.title_chars_max`.
    pub title_chars_max: u64,
    /// `auth.token_days_max`.
    pub token_days_max: u32,
    /// `http.page_size_max`.
    pub page_size_max: u32,
    /// `http.record_steps_page_max`.
    pub record_steps_page_max: u32,
    /// `http.record_artifacts_page_max`.
    pub record_artifacts_page_max: u32,
}

/// The description of a node with `bounds`.
pub fn document(bounds: &Bounds) -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    let mut generator = settings.into_generator();
    let error = Value::from(generator.subschema_for::<ErrorReply>());
    let id = Value::from(generator.subschema_for::<Id>());
    let mut actions = Vec::new();
    let mut paths = Map::new();
    for route in ROUTES {
        let mut parameters: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| {
                let schema = if name == "version" {
                    json!({"type": "integer", "minimum": 1, "maximum": i64::MAX})
                } else {
                    id.clone()
                };
                json!({"name": name, "in": "path", "required": true, "schema": schema})
            })
            .collect();
        parameters.extend(route.query.iter().map(|query| {
            json!({"name": query.name, "in": "query", "required": false,
                   "description": query.description, "schema": query_schema(query.takes, bounds)})
        }));
        let mut operation = json!({
            "operationId": operation_id(route),
            "summary": route.summary,
            "tags": [match route.surface { Surface::Rest => "rest", Surface::Compat => "compatible" }],
            "parameters": parameters,
            "security": match route.access {
                Access::Public => json!([]),
                Access::User | Access::Admin => json!([{"session": []}, {"token": []}]),
            },
        });
        let request = match route.body {
            Body::None => None,
            Body::Json(schema) => {
                let mut schema = Value::from(schema(&mut generator));
                if !route.lifts.is_empty() {
                    // The compatible body: its REST body with the path's ids as fields.
                    let name = format!("{}Action", pascal(action_name(route)));
                    actions.push((name.clone(), schema, route.lifts));
                    schema = json!({"$ref": format!("#/components/schemas/{name}")});
                }
                Some(("application/json", schema))
            }
            Body::Form(schema) => Some((
                "application/x-www-form-urlencoded",
                Value::from(schema(&mut generator)),
            )),
        };
        if let Some((media, schema)) = request {
            operation["requestBody"] =
                json!({"required": true, "content": {media: {"schema": schema}}});
        }
        let reply = route
            .reply
            .map(|schema| Value::from(schema(&mut generator)));
        let mut responses = Map::new();
        for status in successes(route) {
            let mut success = json!({"description": "success"});
            if let Some(reply) = &reply {
                success["content"] = json!({"application/json": {"schema": reply}});
            }
            if let Some(links) = links(route) {
                success["links"] = links;
            }
            responses.insert(status.to_string(), success);
        }
        for status in refusals(route) {
            let mut refusal = json!({"description": refusal_description(status)});
            // 431 is the HTTP parser's, before any route: it has no body.
            if status != 431 {
                refusal["content"] = json!({"application/json": {"schema": error.clone()}});
            }
            responses.insert(status.to_string(), refusal);
        }
        operation["responses"] = Value::Object(responses);
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| json!({}));
        entry[route.method.to_ascii_lowercase()] = operation;
    }
    let mut schemas = generator.take_definitions(true);
    apply_bounds(&mut schemas, bounds);
    for (name, body, lifts) in actions {
        let action = compatible_body(&schemas, &body, lifts, &id);
        schemas.insert(name, action);
    }
    let mut schemas = Value::Object(schemas);
    integer_ranges(&mut schemas);
    any_value_as_object(&mut schemas);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "reins control plane",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Durable AI-agent workflows: launch, observe and control them. A request \
                that follows this description is never refused with 400; 404, 409, 422 and 429 \
                depend on the state of the workflows, users and limits.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "session": {"type": "apiKey", "in": "cookie", "name": super::auth::SESSION_COOKIE,
                            "description": "state-changing requests also send X-CSRF-Token"},
                "token": {"type": "http", "scheme": "bearer"},
            },
        },
    })
}

/// What a query parameter takes, as a schema.
fn query_schema(takes: Takes, bounds: &Bounds) -> Value {
    match takes {
        Takes::Duration => json!({"type": "string", "pattern": rules::DURATION.source}),
        Takes::Limit(page) => {
            let max = match page {
                PageOf::Workflows => bounds.page_size_max,
                PageOf::Steps => bounds.record_steps_page_max,
                PageOf::Artifacts => bounds.record_artifacts_page_max,
            };
            json!({"type": "integer", "minimum": 1, "maximum": max})
        }
        Takes::Status => {
            let mut statuses: Vec<&str> = store::WorkflowStatus::ALL
                .iter()
                .map(|status| status.as_str())
                .collect();
            statuses.extend(["recoverable", super::record::WAITING_FOR_INPUT]);
            json!({"type": "string", "enum": statuses})
        }
        Takes::WaitingFor => {
            let kinds: Vec<&str> = store::WaitKind::ALL.iter().map(|k| k.as_str()).collect();
            json!({"type": "string", "enum": kinds})
        }
        Takes::Id => json!({"type": "string", "pattern": rules::ID_PATTERN,
                            "minLength": 1, "maxLength": runtime::ID_CHARS_MAX}),
        Takes::ListCursor => json!({"type": "string", "pattern": rules::LIST_CURSOR.source}),
        Takes::StepCursor => json!({"type": "string", "pattern": rules::STEP_CURSOR.source}),
        Takes::Position => json!({"type": "integer", "minimum": 0, "maximum": i64::MAX}),
    }
}

/// A compatible action's body: the REST body's definition with each lifted id required beside
/// its own fields, and `wait_ms` where the REST route takes `?wait=`.
fn compatible_body(
    schemas: &Map<String, Value>,
    body: &Value,
    lifts: &[Lift],
    id: &Value,
) -> Value {
    let mut action = body["$ref"]
        .as_str()
        .and_then(|r| r.rsplit('/').next())
        .and_then(|name| schemas.get(name))
        .cloned()
        .unwrap_or_else(|| json!({"type": "object", "additionalProperties": false}));
    let required: Vec<Value> = lifts
        .iter()
        .filter_map(|lift| match lift {
            Lift::Id(field, _) => Some(Value::from(*field)),
            Lift::WaitMs => None,
        })
        .chain(action["required"].as_array().cloned().unwrap_or_default())
        .collect();
    for lift in lifts {
        match lift {
            Lift::Id(field, _) => action["properties"][*field] = id.clone(),
            Lift::WaitMs => {
                action["properties"]["wait_ms"] = json!({
                    "type": ["integer", "null"], "minimum": 0, "maximum": u64::MAX,
                    "description": "Wait up to this many milliseconds (at most \
                        `http.wait_max_ms`) for the workflow to end or wait for a person, and \
                        answer with its record (REST: `?wait=DURATION`)"})
            }
        }
    }
    action["required"] = Value::Array(required);
    if let Some(description) = action.get_mut("description") {
        *description = format!(
            "{} The compatible action names its workflow by `run_id` in the body.",
            description.as_str().unwrap_or_default()
        )
        .into();
    }
    action
}

/// The node's configured bounds, where a body's field has one.
fn apply_bounds(schemas: &mut Map<String, Value>, bounds: &Bounds) {
    if let Some(launch) = schemas.get_mut("LaunchBody") {
        let mut title = line_schema(bounds.title_chars_max);
        title["type"] = json!(["string", "null"]);
        title["description"] = launch["properties"]["title"]["description"].clone();
        launch["properties"]["title"] = title;
    }
    if let Some(token) = schemas.get_mut("NewTokenBody") {
        let days = &mut token["properties"]["expires_in_days"];
        days["minimum"] = json!(1);
        days["maximum"] = json!(bounds.token_days_max);
    }
}

/// Every integer with a machine type states that type's range (a generated client, and a
/// fuzzer, otherwise sends numbers the server cannot read).
fn integer_ranges(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            let integer = match object.get("type") {
                Some(Value::String(t)) => t == "integer",
                Some(Value::Array(types)) => types.iter().any(|t| t == "integer"),
                _ => false,
            };
            if integer {
                let range = match object.get("format").and_then(Value::as_str) {
                    Some("int32") => Some((json!(i32::MIN), json!(i32::MAX))),
                    Some("uint32") => Some((json!(0), json!(u32::MAX))),
                    Some("int64") => Some((json!(i64::MIN), json!(i64::MAX))),
                    Some("uint64") => Some((json!(0), json!(u64::MAX))),
                    Some("uint16") => Some((json!(0), json!(u16::MAX))),
                    Some("uint8") => Some((json!(0), json!(u8::MAX))),
                    _ => None,
                };
                if let Some((min, max)) = range {
                    object.entry("minimum").or_insert(min);
                    object.entry("maximum").or_insert(max);
                }
            }
            object.values_mut().for_each(integer_ranges);
        }
        Value::Array(items) => items.iter_mut().for_each(integer_ranges),
        _ => {}
    }
}

/// Any JSON value (`args`, a result, an output) as the schema `{}` rather than `true`: they mean
/// the same, and some client generators read only the first.
fn any_value_as_object(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            for (key, value) in object.iter_mut() {
                if matches!(key.as_str(), "properties" | "$defs")
                    && let Value::Object(members) = value
                {
                    for member in members.values_mut().filter(|m| **m == Value::Bool(true)) {
                        *member = json!({});
                    }
                }
                any_value_as_object(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(any_value_as_object),
        _ => {}
    }
}

/// The success statuses of a route.
fn successes(route: &Route) -> Vec<u16> {
    match (route.op, route.surface) {
        // The same request again: 200 with what it made before.
        (Op::Launch | Op::Retry, Surface::Rest) => vec![200, 201],
        // A `Range` request.
        (Op::Artifact, _) => vec![200, 206],
        _ => vec![route.success],
    }
}

/// The refusals a route answers: those of every route, of its access, of its path, and of its
/// operation.
fn refusals(route: &Route) -> BTreeSet<u16> {
    // Any request: a malformed query, path or body (400), a body too slow (408) or too large
    // (413), a Host the node does not serve (421), a head too large (431).
    let mut statuses = BTreeSet::from([400, 408, 413, 421, 431]);
    if route.access != Access::Public {
        statuses.extend([401, 403]);
    }
    if route.path.contains('{') || !route.lifts.is_empty() {
        statuses.insert(404);
    }
    let (state, busy, unavailable): (&[u16], &[u16], bool) = match route.op {
        Op::Health | Op::OpenApi | Op::Plugins => (&[], &[], false),
        Op::Ready | Op::Metrics | Op::Me | Op::Logout | Op::SignOutEverywhere => (&[], &[], true),
        Op::ListUsers | Op::ListTokens | Op::Nodes | Op::Slots | Op::Inbox => (&[], &[], true),
        Op::SignOutUser | Op::RevokeToken => (&[], &[], true),
        Op::Initialize | Op::CreateUser => (&[409, 422], &[429], true),
        Op::Login => (&[401, 403, 415], &[429], true),
        Op::ChangeUser | Op::DeleteUser => (&[409], &[], true),
        Op::ResetPassword => (&[422], &[429], true),
        Op::ChangePassword => (&[422], &[429], true),
        Op::CreateToken => (&[422], &[], true),
        Op::Launch => (&[409, 422], &[429], true),
        Op::List | Op::Steps | Op::Artifacts => (&[], &[429], true),
        Op::Get => (&[], &[429], true),
        Op::Resume | Op::Decide | Op::Answer | Op::SendEvent => (&[409, 422], &[], true),
        Op::Cancel | Op::Delete => (&[409, 422], &[], true),
        Op::Recover | Op::Reconcile | Op::Retry => (&[409, 422], &[], true),
        Op::Artifact => (&[416], &[], true),
        Op::ArtifactChunk => (&[422], &[], true),
        Op::WorkflowEvents | Op::Events => (&[], &[429], true),
    };
    statuses.extend(state);
    statuses.extend(busy);
    if unavailable {
        statuses.insert(503);
    }
    statuses
}

fn refusal_description(status: u16) -> &'static str {
    match status {
        400 => "malformed: a value breaks this description (the message names it)",
        401 => "not signed in, or the session or token is no longer valid",
        403 => "not allowed: another user's, admins only, or a missing CSRF token",
        404 => "unknown (or another user's)",
        408 => "the body did not arrive within `http.body_timeout_ms`",
        409 => "stale or conflicting with what is recorded",
        413 => "too large (`http.body_bytes_max`, or a limit the message names)",
        415 => "not the media type this route takes",
        416 => "the range is outside the artifact",
        421 => "the Host is not one this node serves (`http.allowed_hosts`)",
        431 => "the request's head is over `http.head_bytes_max`",
        422 => "refused by a rule: a limit, the workflow's state, a script that does not compile",
        429 => "too many at once for this user or client: try again after `Retry-After`",
        503 => {
            "draining, not ready, or the database is unavailable (the outcome may be unknown: read again)"
        }
        _ => "refused",
    }
}

/// Links from what a route makes to the operations that take it, so that clients and stateful
/// fuzzers follow them without guessing.
fn links(route: &Route) -> Option<Value> {
    let (field, targets): (&str, &[(&str, &str)]) = match (route.op, route.surface) {
        (Op::Launch | Op::Retry, Surface::Rest) => (
            "run_id",
            &[
                ("GET", "/api/v1/workflows/{id}"),
                ("GET", "/api/v1/workflows/{id}/steps"),
                ("GET", "/api/v1/workflows/{id}/artifacts"),
                ("GET", "/api/v1/workflows/{id}/events"),
                ("POST", "/api/v1/workflows/{id}/cancel"),
                ("POST", "/api/v1/workflows/{id}/events"),
                ("POST", "/api/v1/workflows/{id}/retry"),
                ("DELETE", "/api/v1/workflows/{id}"),
            ],
        ),
        (Op::CreateToken, _) => ("id", &[("DELETE", "/api/v1/auth/tokens/{id}")]),
        (Op::CreateUser, _) => (
            "id",
            &[
                ("PATCH", "/api/v1/auth/users/{id}"),
                ("POST", "/api/v1/auth/users/{id}/password"),
                ("POST", "/api/v1/auth/users/{id}/sign-out"),
                ("DELETE", "/api/v1/auth/users/{id}"),
            ],
        ),
        _ => return None,
    };
    let mut links = Map::new();
    for (method, path) in targets {
        let target = ROUTES
            .iter()
            .find(|r| r.method == *method && r.path == *path)?;
        links.insert(
            pascal(&operation_id(target)),
            json!({"operationId": operation_id(target),
                   "parameters": {"id": format!("$response.body#/{field}")}}),
        );
    }
    Some(Value::Object(links))
}

/// The name of a compatible action: the last segment of its path.
fn action_name(route: &Route) -> &'static str {
    route.path.rsplit('/').next().unwrap_or(route.path)
}

/// `get_artifact` → `GetArtifact`.
fn pascal(text: &str) -> String {
    text.split(['_', '-'])
        .map(|word| {
            let mut chars = word.chars();
            chars
                .next()
                .map(|first| first.to_uppercase().chain(chars).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

/// `POST /api/v1/workflows/{id}/resume` → `post_api_v1_workflows_id_resume`.
fn operation_id(route: &Route) -> String {
    let mut id = route.method.to_ascii_lowercase();
    for part in route.path.split(['/', '.']).filter(|p| !p.is_empty()) {
        id.push('_');
        id.push_str(part.trim_matches(['{', '}']));
    }
    id.replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        title_chars_max: 200,
        token_days_max: 365,
        page_size_max: 500,
        record_steps_page_max: 100,
        record_artifacts_page_max: 500,
    };

    #[test]
    fn every_route_is_described_with_its_body_and_reply_types() {
        let document = document(&BOUNDS);
        for route in ROUTES {
            let operation = &document["paths"][route.path][route.method.to_ascii_lowercase()];
            assert!(
                operation.is_object(),
                "{} {} is missing",
                route.method,
                route.path
            );
            assert_eq!(operation["summary"], route.summary);
            assert!(
                operation["responses"].get("default").is_none(),
                "every status is declared"
            );
        }
        let launch = &document["paths"]["/api/v1/workflows"]["post"];
        let body = &launch["requestBody"]["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(body, "#/components/schemas/LaunchBody");
        let schemas = &document["components"]["schemas"];
        assert_eq!(schemas["LaunchBody"]["additionalProperties"], false);
        assert!(schemas["WorkflowRecord"]["properties"]["checkpoints"].is_object());
        assert_eq!(schemas["WorkflowRecord"]["properties"]["args"], json!({}));
    }

    #[test]
    fn compatible_bodies_require_the_ids_their_rest_paths_name() {
        let document = document(&BOUNDS);
        let schemas = &document["components"]["schemas"];
        let answer = &schemas["AnswerAction"];
        let required = answer["required"].as_array().expect("required");
        for field in ["run_id", "step_id", "decision"] {
            assert!(required.contains(&json!(field)), "{field}: {answer}");
        }
        assert_eq!(answer["additionalProperties"], false);
        assert!(schemas["AnswerBody"]["properties"].get("run_id").is_none());
        assert!(schemas["DecideBody"]["properties"].get("run_id").is_none());
        let cancel = &document["paths"]["/api/plugins/community.workflows/actions/cancel"]["post"];
        assert_eq!(
            cancel["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/CancelAction"
        );
    }

    #[test]
    fn configured_bounds_and_machine_ranges_are_stated() {
        let document = document(&Bounds {
            title_chars_max: 7,
            token_days_max: 9,
            page_size_max: 11,
            ..BOUNDS
        });
        let schemas = &document["components"]["schemas"];
        assert_eq!(schemas["LaunchBody"]["properties"]["title"]["maxLength"], 7);
        assert_eq!(
            schemas["NewTokenBody"]["properties"]["expires_in_days"]["maximum"],
            9
        );
        let timeout = &schemas["LaunchBody"]["properties"]["timeout_seconds"];
        assert_eq!(
            (&timeout["minimum"], &timeout["maximum"]),
            (&json!(1), &json!(31_536_000))
        );
        assert_eq!(
            schemas["LaunchAction"]["properties"]["wait_ms"]["maximum"],
            json!(u64::MAX)
        );
        assert!(schemas["LaunchBody"]["properties"].get("wait_ms").is_none());
        let list = &document["paths"]["/api/v1/workflows"]["get"]["parameters"];
        let limit = list
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == "limit")
            .expect("limit");
        assert_eq!(limit["schema"]["maximum"], 11);
    }

    #[test]
    fn a_launch_links_to_what_takes_its_run_id() {
        let document = document(&BOUNDS);
        let created = &document["paths"]["/api/v1/workflows"]["post"]["responses"]["201"];
        let get = &created["links"]["GetApiV1WorkflowsId"];
        assert_eq!(get["operationId"], "get_api_v1_workflows_id");
        assert_eq!(get["parameters"]["id"], "$response.body#/run_id");
        assert_eq!(
            created["links"].as_object().map(Map::len),
            Some(8),
            "{created}"
        );
    }
}
