//! The `openai` agent: one request to any OpenAI-compatible `/chat/completions` endpoint per run.
//! The task becomes the user message (a string as is, JSON as its text), after the configured
//! system prompt. The run's output is `{"content", "model", "finish_reason"}` and its token count
//! is the response's `usage.total_tokens`. The API key is read from the named environment
//! variable at run time.
//!
//! A run makes one request: retrying is the step's (its attempts, by [`retry_defaults`] unless
//! configured otherwise). A failed run says what a retry could do ([`RunFailure`]): a 429 or a 5xx
//! answer (`http_<status>`), an endpoint that cannot be reached or drops the answer
//! (`connection`) and no answer within `timeout_ms` (`http_timeout`) are retryable, and a 429's
//! or 5xx's `retry-after-ms` (milliseconds) or `Retry-After` (seconds or an HTTP date) is the wait
//! it asks for, at most [`RETRY_AFTER_MS_MAX`]; any other refusal (`http_<status>`), an answer
//! that is not a chat completion (`bad_response`) and a setting that cannot work
//! (`configuration`: the key's variable unset, a `base_url` that makes no request) are not. The
//! answer's arrival is the run's progress signal.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use runtime::policy::{RetryOptions, TimeoutOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use store::{CancelAction, FailureClass, RunFailure};
use tokio::sync::watch;

use super::{AgentEnd, AgentRequest, Progress, cancelled};

/// An `openai` agent's entry in the configuration.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    pub name: String,
    /// Up to and including `/v1`, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    pub model: String,
    /// The environment variable holding the API key (none: no `Authorization` header).
    #[serde(default)]
    pub api_key_env: Option<String>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// One request, from its sending to the whole answer, at most.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The default of its steps' `retry.max_attempts`, less one (the key from before the retry
    /// policy: retries are the step's attempts).
    #[serde(default = "default_retries")]
    pub retries: u32,
    /// The response body at most.
    #[serde(default = "default_response_bytes_max")]
    pub response_bytes_max: usize,
    /// Its steps' retry policy, unless a call says otherwise (over [`retry_defaults`]).
    #[serde(default, skip_serializing_if = "super::is_default")]
    pub retry: RetryOptions,
    /// Its steps' timeouts, unless a call says otherwise.
    #[serde(default, skip_serializing_if = "super::is_default")]
    pub timeout: TimeoutOptions,
    /// Whether a run of it whose outcome is unknown may run again without a person.
    #[serde(default, skip_serializing_if = "super::is_default")]
    pub idempotent: bool,
}

/// An LLM endpoint's transient errors (429, 5xx, a dropped connection, a timeout) are retried
/// out of the box: `retries` more attempts (the older key, 2 by default), a second apart and
/// doubling, at most 30 s apart.
pub(super) fn retry_defaults(retries: u32) -> RetryOptions {
    RetryOptions {
        max_attempts: Some(retries.saturating_add(1)),
        initial_interval_ms: Some(1_000),
        backoff_coefficient: Some(2.0),
        max_interval_ms: Some(30_000),
        non_retryable: None,
    }
}

fn default_timeout_ms() -> u64 {
    120_000
}
fn default_retries() -> u32 {
    2
}
fn default_response_bytes_max() -> usize {
    4 * 1024 * 1024
}

/// The longest wait before a retry an endpoint's `Retry-After` or `retry-after-ms` may ask for:
/// ten minutes (a longer one is cut to this).
pub const RETRY_AFTER_MS_MAX: u64 = 600_000;

pub struct OpenAiAgent {
    config: OpenAiConfig,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl std::fmt::Debug for OpenAiAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiAgent")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct Completion {
    model: Option<String>,
    choices: Vec<Choice>,
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Message,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    total_tokens: Option<i64>,
}

impl OpenAiAgent {
    pub fn new(config: OpenAiConfig) -> Self {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        OpenAiAgent {
            config,
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }

    pub async fn run(
        &self,
        request: AgentRequest,
        mut cancel: watch::Receiver<Option<CancelAction>>,
        progress: Progress,
    ) -> AgentEnd {
        let timeout = Duration::from_millis(self.config.timeout_ms);
        tokio::select! {
            end = tokio::time::timeout(timeout, self.call(&request, &progress)) => {
                end.unwrap_or_else(|_| failed(
                    format!("the endpoint did not answer within {} ms (timeout_ms)", self.config.timeout_ms),
                    "http_timeout",
                    true,
                ))
            }
            action = cancelled(&mut cancel) => AgentEnd::Interrupted { action },
        }
    }

    async fn call(&self, request: &AgentRequest, progress: &Progress) -> AgentEnd {
        let key = match &self.config.api_key_env {
            Some(variable) => match std::env::var(variable) {
                Ok(key) => Some(key),
                Err(_) => {
                    return failed(
                        format!("environment variable {variable} is not set"),
                        "configuration",
                        false,
                    );
                }
            },
            None => None,
        };
        let body = self.body(&request.task).to_string();
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(&url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(key) = key {
            builder = builder.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        let http_request = match builder.body(Full::new(Bytes::from(body))) {
            Ok(request) => request,
            Err(e) => {
                return failed(
                    format!("invalid request to {url:?}: {e}"),
                    "configuration",
                    false,
                );
            }
        };
        let response = match self.client.request(http_request).await {
            Ok(response) => response,
            Err(e) => return failed(format!("cannot reach {url}: {e}"), "connection", true),
        };
        // The answer is arriving: the endpoint is working on it.
        progress.signal();
        let (head, body) = response.into_parts();
        let bytes = match Limited::new(body, self.config.response_bytes_max)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return failed(
                    format!(
                        "the response is over response_bytes_max ({} bytes)",
                        self.config.response_bytes_max
                    ),
                    "bad_response",
                    false,
                );
            }
            Err(e) => {
                return failed(format!("reading the response: {e}"), "connection", true);
            }
        };
        if !head.status.is_success() {
            return refused(head.status, &head.headers, &bytes, SystemTime::now());
        }
        completed(&bytes)
    }

    fn body(&self, task: &Value) -> Value {
        let user = match task {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        let mut messages = Vec::new();
        if let Some(system) = &self.config.system_prompt {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": user}));
        let mut body = json!({"model": self.config.model, "messages": messages});
        if let Some(temperature) = self.config.temperature {
            body["temperature"] = json!(temperature);
        }
        if let Some(max_tokens) = self.config.max_tokens {
            body["max_tokens"] = json!(max_tokens);
        }
        body
    }
}

/// The run a successful answer ends: its first choice, or `bad_response` for a body that is not
/// a chat completion.
fn completed(bytes: &[u8]) -> AgentEnd {
    let completion: Completion = match serde_json::from_slice(bytes) {
        Ok(completion) => completion,
        Err(e) => {
            return failed(
                format!("the endpoint's answer is not a chat completion: {e}"),
                "bad_response",
                false,
            );
        }
    };
    let Some(choice) = completion.choices.into_iter().next() else {
        return failed(
            "the chat completion has no choices".into(),
            "bad_response",
            false,
        );
    };
    AgentEnd::Completed {
        output: json!({
            "content": choice.message.content,
            "model": completion.model,
            "finish_reason": choice.finish_reason,
        }),
        // A count below zero is no count: recorded as unknown (0), never as negative.
        total_tokens: completion
            .usage
            .and_then(|usage| usage.total_tokens)
            .filter(|tokens| *tokens >= 0)
            .unwrap_or(0),
        message_count: 1,
    }
}

/// The run a refusal ends: `http_<status>`, retryable for a 429 or a 5xx, with the wait the
/// endpoint asks for (read at `now`).
fn refused(status: StatusCode, headers: &HeaderMap, body: &[u8], now: SystemTime) -> AgentEnd {
    let transient = status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error();
    AgentEnd::Failed {
        message: refusal(status, body),
        failure: RunFailure {
            class: FailureClass::Error,
            code: Some(format!("http_{}", status.as_u16())),
            retryable: Some(transient),
            retry_after_ms: if transient {
                retry_after_ms(headers, now)
            } else {
                None
            },
        },
    }
}

/// The wait before a retry an answer asks for at `now`: `retry-after-ms` (milliseconds), else
/// `Retry-After` (whole seconds, or an HTTP date: the time until then, no wait once it passed),
/// at most [`RETRY_AFTER_MS_MAX`]. `None` when neither is there or readable.
fn retry_after_ms(headers: &HeaderMap, now: SystemTime) -> Option<u64> {
    let text = |name| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
    };
    let asked = text("retry-after-ms").and_then(milliseconds).or_else(|| {
        let value = text(RETRY_AFTER.as_str())?;
        seconds(value).or_else(|| until(value, now))
    })?;
    Some(asked.min(RETRY_AFTER_MS_MAX))
}

/// A non-negative number of milliseconds (`1500`, `1500.5`: rounded up), saturating.
fn milliseconds(text: &str) -> Option<u64> {
    let ms: f64 = text.parse().ok()?;
    // A float cast to an integer saturates: an absurd value becomes u64::MAX, then the cap.
    (ms.is_finite() && ms >= 0.0).then(|| ms.ceil() as u64)
}

/// Whole seconds (`Retry-After`'s delta-seconds: digits only) in milliseconds, saturating.
fn seconds(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(text.parse::<u64>().unwrap_or(u64::MAX).saturating_mul(1000))
}

/// The milliseconds from `now` until an HTTP date (RFC 9110: IMF-fixdate, or the obsolete RFC
/// 850 and asctime forms); 0 for a date that has passed.
fn until(text: &str, now: SystemTime) -> Option<u64> {
    let date = httpdate::parse_http_date(text).ok()?;
    let wait = date.duration_since(now).unwrap_or(Duration::ZERO);
    Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
}

/// The endpoint's own words for a refusal, when it gave any.
fn refusal(status: StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    format!("the endpoint answered {status}: {message}")
}

/// A failed run with what it says of a retry.
fn failed(message: String, code: &str, retryable: bool) -> AgentEnd {
    AgentEnd::Failed {
        message,
        failure: RunFailure {
            class: FailureClass::Error,
            code: Some(code.into()),
            retryable: Some(retryable),
            retry_after_ms: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(
                hyper::header::HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        headers
    }

    fn failure(end: AgentEnd) -> RunFailure {
        match end {
            AgentEnd::Failed { failure, .. } => failure,
            other => panic!("not a failure: {other:?}"),
        }
    }

    fn refusal_of(status: u16, pairs: &[(&str, &str)]) -> RunFailure {
        let status = StatusCode::from_u16(status).expect("status");
        failure(refused(
            status,
            &headers(pairs),
            br#"{"error": {"message": "no"}}"#,
            SystemTime::now(),
        ))
    }

    #[test]
    fn a_refusal_is_retryable_for_a_429_or_a_5xx_only() {
        assert_eq!(
            refusal_of(429, &[("retry-after", "1")]),
            RunFailure {
                class: FailureClass::Error,
                code: Some("http_429".into()),
                retryable: Some(true),
                retry_after_ms: Some(1_000),
            }
        );
        for status in [500, 502, 503, 504] {
            let failure = refusal_of(status, &[]);
            assert_eq!(failure.code, Some(format!("http_{status}")));
            assert_eq!(
                (failure.retryable, failure.retry_after_ms),
                (Some(true), None)
            );
        }
        for status in [400, 401, 403, 404, 422, 301] {
            // A wait asked by an answer not worth a retry is not kept.
            let failure = refusal_of(status, &[("retry-after", "5")]);
            assert_eq!(failure.code, Some(format!("http_{status}")));
            assert_eq!(
                (failure.retryable, failure.retry_after_ms),
                (Some(false), None)
            );
        }
        let AgentEnd::Failed { message, .. } = refused(
            StatusCode::BAD_REQUEST,
            &HeaderMap::new(),
            br#"{"error": {"message": "max_tokens is too large"}}"#,
            SystemTime::now(),
        ) else {
            panic!("a refusal fails");
        };
        assert!(message.contains("400") && message.contains("max_tokens is too large"));
    }

    #[test]
    fn retry_after_is_read_in_milliseconds_seconds_or_an_http_date_and_capped() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").expect("date");
        let wait = |pairs: &[(&str, &str)]| retry_after_ms(&headers(pairs), now);
        assert_eq!(wait(&[]), None);
        assert_eq!(wait(&[("retry-after", "0")]), Some(0));
        assert_eq!(wait(&[("retry-after", "2")]), Some(2_000));
        assert_eq!(wait(&[("retry-after-ms", "1500")]), Some(1_500));
        assert_eq!(wait(&[("retry-after-ms", "20.2")]), Some(21));
        // OpenAI's milliseconds win over the seconds when both are there.
        assert_eq!(
            wait(&[("retry-after-ms", "250"), ("retry-after", "9")]),
            Some(250)
        );
        // An unreadable one gives way to the other, or to none.
        assert_eq!(
            wait(&[("retry-after-ms", "soon"), ("retry-after", "3")]),
            Some(3_000)
        );
        for unreadable in ["-1", "1.5", "soon", "", "Sun, 06 Nov 1994"] {
            assert_eq!(wait(&[("retry-after", unreadable)]), None, "{unreadable:?}");
        }
        assert_eq!(wait(&[("retry-after-ms", "-5")]), None);
        assert_eq!(wait(&[("retry-after-ms", "NaN")]), None);
        // An HTTP date, in each of its three forms, is the time until then.
        for date in [
            "Sun, 06 Nov 1994 08:49:45 GMT",
            "Sunday, 06-Nov-94 08:49:45 GMT",
            "Sun Nov  6 08:49:45 1994",
        ] {
            assert_eq!(wait(&[("retry-after", date)]), Some(8_000), "{date}");
        }
        // A date that has passed asks for no wait.
        assert_eq!(
            wait(&[("retry-after", "Sat, 05 Nov 1994 08:49:37 GMT")]),
            Some(0)
        );
        // Absurd waits are cut to ten minutes.
        for absurd in [
            ("retry-after", "86400"),
            ("retry-after", "99999999999999999999999"),
            ("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT"),
            ("retry-after-ms", "1e300"),
            ("retry-after-ms", "600001"),
        ] {
            assert_eq!(wait(&[absurd]), Some(RETRY_AFTER_MS_MAX), "{absurd:?}");
        }
        assert_eq!(RETRY_AFTER_MS_MAX, 600_000);
    }

    #[test]
    fn an_answer_that_is_no_chat_completion_is_a_bad_response() {
        for body in [&b"<html>gateway</html>"[..], br#"{"choices": []}"#] {
            let failure = failure(completed(body));
            assert_eq!(
                (failure.code.as_deref(), failure.retryable),
                (Some("bad_response"), Some(false))
            );
        }
        assert!(matches!(
            completed(br#"{"choices": [{"message": {"content": "hi"}}]}"#),
            AgentEnd::Completed { .. }
        ));
    }
}
