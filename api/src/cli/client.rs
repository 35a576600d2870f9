//! The CLI's HTTP client: JSON in and out, `Authorization: Bearer` with the saved token, and the
//! server's `{"error": {"code", "message"}}` turned into an error that says what went wrong.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{message} (HTTP {status} {code})")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    #[error("the server answered something that is not JSON: {0}")]
    NotJson(String),
}

/// A server's answer.
pub struct Answer {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: HyperClient<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Client {
    pub fn new(base: &str, token: Option<String>) -> Client {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        Client {
            base: base.trim_end_matches('/').to_owned(),
            token,
            http: HyperClient::builder(TokioExecutor::new()).build(connector),
        }
    }

    pub fn base(&self) -> &str {
        &self.base
    }

    /// One request; `Err` for transport failures only (any status is an answer).
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
    ) -> Result<Answer, Error> {
        let url = format!("{}{path}", self.base);
        let unreachable = |reason: String| Error::Unreachable {
            url: url.clone(),
            reason,
        };
        let mut request = Request::builder().method(method).uri(&url);
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| unreachable(e.to_string()))?;
        self.exchange(&url, request).await
    }

    async fn exchange(&self, url: &str, request: Request<Full<Bytes>>) -> Result<Answer, Error> {
        let unreachable = |reason: String| Error::Unreachable {
            url: url.to_owned(),
            reason,
        };
        let response = self
            .http
            .request(request)
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// A `GET` whose body is read as it comes (an event stream), with `Last-Event-ID` when
    /// resuming. The answer's status is not checked.
    pub async fn stream(
        &self,
        path: &str,
        last_event_id: Option<i64>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, Error> {
        let url = format!("{}{path}", self.base);
        let unreachable = |reason: String| Error::Unreachable {
            url: url.clone(),
            reason,
        };
        let mut request = Request::builder()
            .method("GET")
            .uri(&url)
            .header("accept", "text/event-stream");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let request = request
            .body(Full::new(Bytes::new()))
            .map_err(|e| unreachable(e.to_string()))?;
        self.http
            .request(request)
            .await
            .map_err(|e| unreachable(error_chain(&e)))
    }

    /// A JSON POST made with a browser session (cookie plus CSRF header), as sign-in needs once to
    /// create the API token the CLI keeps.
    pub async fn send_with_csrf(
        &self,
        path: &str,
        body: String,
        cookie: &str,
        csrf: &str,
    ) -> Result<Answer, Error> {
        let url = format!("{}{path}", self.base);
        let request = Request::builder()
            .method("POST")
            .uri(&url)
            .header("content-type", "application/json")
            .header("cookie", cookie)
            .header("x-csrf-token", csrf)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| Error::Unreachable {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        self.exchange(&url, request).await
    }

    /// A JSON request whose success is a JSON reply.
    pub async fn json(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, Error> {
        let (content_type, bytes) = match body {
            Some(body) => (Some("application/json"), body.to_string().into_bytes()),
            None => (None, Vec::new()),
        };
        let answer = self.send(method, path, content_type, bytes).await?;
        checked(&answer)?;
        serde_json::from_slice(&answer.body)
            .map_err(|_| Error::NotJson(String::from_utf8_lossy(&answer.body).into_owned()))
    }
}

/// The answer if it is a success, else the server's error.
pub fn checked(answer: &Answer) -> Result<(), Error> {
    if answer.status < 300 {
        return Ok(());
    }
    let body: Value = serde_json::from_slice(&answer.body).unwrap_or(Value::Null);
    Err(Error::Refused {
        status: answer.status,
        code: body["error"]["code"]
            .as_str()
            .unwrap_or("unknown")
            .to_owned(),
        message: body["error"]["message"].as_str().map_or_else(
            || String::from_utf8_lossy(&answer.body).into_owned(),
            str::to_owned,
        ),
    })
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
