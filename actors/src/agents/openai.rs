//! The `openai` agent: one call to any OpenAI-compatible `/chat/completions` endpoint. The task
//! becomes the user message (a string as is, JSON as its text), after the configured system
//! prompt. The run's output is `{"content", "model", "finish_reason"}` and its token count is the
//! response's `usage.total_tokens`. A 429 or 5xx answer is retried (`retries`, with doubling
//! backoff); any other refusal, a timeout, or a body that is not a chat completion ends the run as
//! `error` with the reason. The API key is read from the named environment variable at run time.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use runtime::policy::{RetryOptions, TimeoutOptions};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use store::CancelAction;
use tokio::sync::watch;

use super::{AgentEnd, AgentRequest, cancelled};

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
    /// The whole call, retries included, at most.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Answers of 429 or 5xx tried again at most this many times.
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

/// The first wait before a retry; it doubles each time.
const RETRY_FIRST_DELAY: Duration = Duration::from_millis(200);

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

/// One attempt's result: retry it, or end the run.
enum Attempt {
    Retry(String),
    Done(AgentEnd),
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
    ) -> AgentEnd {
        let timeout = Duration::from_millis(self.config.timeout_ms);
        tokio::select! {
            end = tokio::time::timeout(timeout, self.call(&request)) => end.unwrap_or_else(|_| {
                failed(format!("the endpoint did not answer within {} ms", self.config.timeout_ms))
            }),
            action = cancelled(&mut cancel) => AgentEnd::Interrupted { action },
        }
    }

    async fn call(&self, request: &AgentRequest) -> AgentEnd {
        let key = match &self.config.api_key_env {
            Some(variable) => match std::env::var(variable) {
                Ok(key) => Some(key),
                Err(_) => {
                    return failed(format!("environment variable {variable} is not set"));
                }
            },
            None => None,
        };
        let body = self.body(&request.task).to_string();
        let mut delay = RETRY_FIRST_DELAY;
        let mut retries_left = self.config.retries;
        loop {
            match self.attempt(key.as_deref(), &body).await {
                Attempt::Done(end) => return end,
                Attempt::Retry(reason) if retries_left > 0 => {
                    tracing::warn!(%reason, retries_left, "chat completion failed; retrying");
                    retries_left -= 1;
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                Attempt::Retry(reason) => return failed(reason),
            }
        }
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

    async fn attempt(&self, key: Option<&str>, body: &str) -> Attempt {
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
        let http_request = match builder.body(Full::new(Bytes::from(body.to_owned()))) {
            Ok(request) => request,
            Err(e) => return Attempt::Done(failed(format!("invalid request to {url:?}: {e}"))),
        };
        let response = match self.client.request(http_request).await {
            Ok(response) => response,
            Err(e) => return Attempt::Retry(format!("cannot reach {url}: {e}")),
        };
        let status = response.status();
        let bytes = match Limited::new(response.into_body(), self.config.response_bytes_max)
            .collect()
            .await
        {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                return Attempt::Done(failed(format!(
                    "reading the response (at most {} bytes): {e}",
                    self.config.response_bytes_max
                )));
            }
        };
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            return Attempt::Retry(refusal(status, &bytes));
        }
        if !status.is_success() {
            return Attempt::Done(failed(refusal(status, &bytes)));
        }
        let completion: Completion = match serde_json::from_slice(&bytes) {
            Ok(completion) => completion,
            Err(e) => {
                return Attempt::Done(failed(format!(
                    "the endpoint's answer is not a chat completion: {e}"
                )));
            }
        };
        let Some(choice) = completion.choices.into_iter().next() else {
            return Attempt::Done(failed("the chat completion has no choices".into()));
        };
        Attempt::Done(AgentEnd::Completed {
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
        })
    }
}

/// The endpoint's own words for a refusal, when it gave any.
fn refusal(status: StatusCode, body: &[u8]) -> String {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    format!("the endpoint answered {status}: {message}")
}

fn failed(message: String) -> AgentEnd {
    AgentEnd::failed(message)
}
