//! The compatible action endpoint's bodies: each is its REST route's body with what the REST path
//! names (`run_id`, and `step_id` for `answer`) as required fields beside its own, and `wait_ms`
//! for the REST query's `?wait=` (launch, get). They are taken out here, checked, and become
//! parameters (`wait_ms` a parameter of that name); the rest is the body the operation reads, so
//! that one handler serves both surfaces and both refuse the same bodies.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::routes::{Lift, Route};
use super::wire::whole;

/// Parameters by name, as the router finds them in a path.
pub type Params = Vec<(&'static str, String)>;

/// The lifted fields as parameters, and the body without them.
pub fn lift(route: &'static Route, body: &Bytes) -> Result<(Params, Bytes), ApiError> {
    if route.lifts.is_empty() {
        return Ok((Vec::new(), body.clone()));
    }
    runtime::check_text_depth(body, "the body").map_err(ApiError::bad_request)?;
    let mut fields: Map<String, Value> = if body.iter().all(u8::is_ascii_whitespace) {
        Map::new()
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?
    };
    let mut params = Vec::with_capacity(route.lifts.len());
    for lift in route.lifts {
        let (field, param) = match *lift {
            Lift::Id(field, param) => (field, param),
            Lift::WaitMs => {
                if let Some(value) = fields.remove("wait_ms").filter(|v| !v.is_null()) {
                    let ms: u64 = whole(value)
                        .map_err(|e| ApiError::bad_request(format!("body field `wait_ms`: {e}")))?;
                    params.push(("wait_ms", ms.to_string()));
                }
                continue;
            }
        };
        let value = match fields.remove(field) {
            Some(Value::String(value)) if runtime::is_id(&value) => value,
            Some(Value::String(value)) => {
                return Err(ApiError::bad_request(format!(
                    "body field `{field}`: {value:?} is not an id ({})",
                    runtime::ID_GRAMMAR
                )));
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "body field `{field}`: {other} is not an id (a string)"
                )));
            }
            None => {
                return Err(ApiError::bad_request(format!(
                    "body field `{field}`: missing"
                )));
            }
        };
        params.push((param, value));
    }
    let rest = serde_json::to_vec(&Value::Object(fields))
        .map_err(|e| ApiError::bad_request(format!("invalid body: {e}")))?;
    Ok((params, Bytes::from(rest)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::routes::{Found, find};

    fn action(name: &str) -> &'static Route {
        let path = format!("/api/plugins/community.workflows/actions/{name}");
        match find("POST", &path) {
            Found::Route(route, _) => route,
            _ => panic!("no action {name}"),
        }
    }

    #[test]
    fn ids_come_out_of_the_body_and_the_rest_stays() {
        let body =
            Bytes::from_static(br#"{"run_id": "w1", "step_id": "s", "decision": "approve"}"#);
        let (params, rest) = lift(action("answer"), &body).expect("lifted");
        assert_eq!(
            params,
            vec![("id", "w1".to_owned()), ("step", "s".to_owned())]
        );
        assert_eq!(
            serde_json::from_slice::<Value>(&rest).expect("json"),
            serde_json::json!({"decision": "approve"})
        );
        let launch = Bytes::from_static(br#"{"script": "return 1", "wait_ms": 250.0}"#);
        let (params, rest) = lift(action("launch"), &launch).expect("lifted");
        assert_eq!(params, vec![("wait_ms", "250".to_owned())]);
        assert_eq!(&rest[..], br#"{"script":"return 1"}"#);
    }

    #[test]
    fn a_missing_or_malformed_id_is_refused_naming_its_field() {
        for (body, says) in [
            (r#"{}"#, "body field `run_id`: missing"),
            (
                r#"{"run_id": null}"#,
                "body field `run_id`: null is not an id",
            ),
            (
                r#"{"run_id": ""}"#,
                "body field `run_id`: \"\" is not an id",
            ),
            (
                r#"{"run_id": "w", "step_id": 7}"#,
                "body field `step_id`: 7",
            ),
            (r#"[1]"#, "invalid body"),
        ] {
            let route = if body.contains("step_id") {
                action("answer")
            } else {
                action("cancel")
            };
            let error = lift(route, &Bytes::from(body)).expect_err(body);
            assert!(error.message.starts_with(says), "{body}: {}", error.message);
        }
    }
}
