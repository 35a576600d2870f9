//! `GET /api/v1/openapi.json`: an OpenAPI 3.1 description generated from the route table and the
//! wire types it names (never written by hand beside them).

use std::sync::OnceLock;

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::routes::{Access, Body, ROUTES, Surface};
use super::wire::ErrorReply;

/// The description, built once.
pub fn document() -> &'static Value {
    static DOCUMENT: OnceLock<Value> = OnceLock::new();
    DOCUMENT.get_or_init(build)
}

fn build() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    let mut generator = settings.into_generator();
    let error = Value::from(generator.subschema_for::<ErrorReply>());
    let mut paths = Map::new();
    for route in ROUTES {
        let mut parameters: Vec<Value> = route
            .path
            .split('/')
            .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        parameters.extend(route.query.iter().map(|(name, description)| {
            json!({"name": name, "in": "query", "required": false, "description": description,
                   "schema": {"type": "string"}})
        }));
        let mut operation = json!({
            "operationId": operation_id(route.method, route.path),
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
            Body::Json(schema) => Some(("application/json", schema(&mut generator))),
            Body::Form(schema) => {
                Some(("application/x-www-form-urlencoded", schema(&mut generator)))
            }
        };
        if let Some((media, schema)) = request {
            operation["requestBody"] =
                json!({"required": true, "content": {media: {"schema": Value::from(schema)}}});
        }
        let success = match route.reply {
            Some(schema) => json!({"description": "success", "content": {
                "application/json": {"schema": Value::from(schema(&mut generator))}}}),
            None => json!({"description": "success"}),
        };
        operation["responses"] = json!({
            route.success.to_string(): success,
            "default": {"description": "an error", "content": {
                "application/json": {"schema": error.clone()}}},
        });
        let entry = paths
            .entry(route.path.to_owned())
            .or_insert_with(|| json!({}));
        entry[route.method.to_ascii_lowercase()] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "reins control plane",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Durable AI-agent workflows: launch, observe and control them.",
        },
        "paths": paths,
        "components": {
            "schemas": generator.take_definitions(true),
            "securitySchemes": {
                "session": {"type": "apiKey", "in": "cookie", "name": super::auth::SESSION_COOKIE,
                            "description": "state-changing requests also send X-CSRF-Token"},
                "token": {"type": "http", "scheme": "bearer"},
            },
        },
    })
}

/// `POST /api/v1/workflows/{id}/resume` → `post_api_v1_workflows_id_resume`.
fn operation_id(method: &str, path: &str) -> String {
    let mut id = method.to_ascii_lowercase();
    for part in path.split(['/', '.']).filter(|p| !p.is_empty()) {
        id.push('_');
        id.push_str(part.trim_matches(['{', '}']));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_with_its_body_and_reply_types() {
        let document = document();
        for route in ROUTES {
            let operation = &document["paths"][route.path][route.method.to_ascii_lowercase()];
            assert!(
                operation.is_object(),
                "{} {} is missing",
                route.method,
                route.path
            );
            assert_eq!(operation["summary"], route.summary);
        }
        let launch = &document["paths"]["/api/v1/workflows"]["post"];
        let body = &launch["requestBody"]["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(body, "#/components/schemas/LaunchBody");
        let schemas = &document["components"]["schemas"];
        assert_eq!(schemas["LaunchBody"]["additionalProperties"], false);
        assert!(schemas["WorkflowRecord"]["properties"]["checkpoints"].is_object());
    }
}
