//! A small HTTP client for the control plane, the way a browser uses it: a cookie jar, and the
//! `csrf_token` cookie repeated in `X-CSRF-Token` on every request (as the reference client does),
//! or a bearer token for machine access. Keep-alive connections through hyper's pooled client.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{HeaderMap, Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// One answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }
}

#[derive(Clone)]
pub struct Api {
    pub addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    pub cookies: BTreeMap<String, String>,
    pub bearer: Option<String>,
    /// Send `X-CSRF-Token` from the cookie jar (turned off to test the refusal).
    pub send_csrf: bool,
}

impl Api {
    pub fn new(addr: SocketAddr) -> Api {
        Api {
            addr,
            client: Client::builder(TokioExecutor::new()).build_http(),
            cookies: BTreeMap::new(),
            bearer: None,
            send_csrf: true,
        }
    }

    /// A request with raw body bytes and extra headers.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Answer {
        self.try_send(method, path, content_type, body, headers)
            .await
            .expect("HTTP request")
    }

    /// [`Api::send`], with a transport failure as an error instead of a panic.
    pub async fn try_send(
        &mut self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Vec<u8>,
        headers: &[(&str, &str)],
    ) -> Result<Answer, String> {
        let mut request = Request::builder()
            .method(Method::from_bytes(method.as_bytes()).expect("method"))
            .uri(format!("http://{}{path}", self.addr));
        if !self.cookies.is_empty() {
            let cookie = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ");
            request = request.header("cookie", cookie);
        }
        if self.send_csrf
            && let Some(csrf) = self.cookies.get("csrf_token")
        {
            request = request.header("x-csrf-token", csrf);
        }
        if let Some(token) = &self.bearer {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        for (name, value) in headers {
            request = request.header(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        let request = request.body(Full::new(Bytes::from(body))).expect("request");
        let response = self
            .client
            .request(request)
            .await
            .map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        for set in headers.get_all("set-cookie") {
            let set = set.to_str().expect("cookie text");
            let (pair, attributes) = set.split_once(';').unwrap_or((set, ""));
            let (name, value) = pair.split_once('=').expect("name=value");
            if attributes.contains("Max-Age=0") {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.to_owned(), value.to_owned());
            }
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("{e:?}"))?
            .to_bytes();
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    pub async fn call(&mut self, method: &str, path: &str, body: Option<Value>) -> Answer {
        match body {
            Some(body) => {
                let bytes = serde_json::to_vec(&body).expect("json");
                self.send(method, path, Some("application/json"), bytes, &[])
                    .await
            }
            None => self.send(method, path, None, Vec::new(), &[]).await,
        }
    }

    /// A compatible action.
    pub async fn action(&mut self, name: &str, body: Value) -> Answer {
        let path = format!("/api/plugins/community.workflows/actions/{name}");
        self.call("POST", &path, Some(body)).await
    }

    /// Signs in with the local form.
    pub async fn login(&mut self, email: &str, password: &str) -> Answer {
        self.cookies.clear();
        let form = format!(
            "username={}&password={}",
            email.replace('@', "%40"),
            password
        );
        self.send(
            "POST",
            "/api/v1/auth/login/local",
            Some("application/x-www-form-urlencoded"),
            form.into_bytes(),
            &[],
        )
        .await
    }
}

/// One Server-Sent Event as a test reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    pub id: i64,
    pub event: String,
    pub data: Value,
}

/// An open event stream, read as it comes.
pub struct SseStream {
    pub status: u16,
    pub headers: HeaderMap,
    body: hyper::body::Incoming,
    buffer: Vec<u8>,
    /// How much of `buffer` holds no message end: large events arrive in many frames, and
    /// scanning each again from the start would keep a slow debug build from reading on time.
    scanned: usize,
    /// Comments seen (keep-alives).
    pub comments: usize,
}

/// How reading a stream stopped.
#[derive(Debug, PartialEq)]
pub enum SseEnd {
    /// The body ended cleanly.
    Ended,
    /// The connection failed under it.
    Failed(String),
    /// Nothing came within the time asked.
    Quiet,
}

impl SseStream {
    /// The next event, or how the stream stopped.
    pub async fn next(&mut self, within: std::time::Duration) -> Result<Sse, SseEnd> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let found = self.buffer[self.scanned..]
                .windows(2)
                .position(|w| w == b"\n\n")
                .map(|at| self.scanned + at);
            self.scanned = self.buffer.len().saturating_sub(1);
            if let Some(end) = found {
                let message: Vec<u8> = self.buffer.drain(..end + 2).collect();
                self.scanned = 0;
                let text = String::from_utf8(message).expect("utf-8 event");
                let (mut id, mut event, mut data) = (None, String::new(), None);
                let mut comment = false;
                for line in text.lines() {
                    if let Some(value) = line.strip_prefix("id: ") {
                        id = Some(value.parse().expect("numeric id"));
                    } else if let Some(value) = line.strip_prefix("event: ") {
                        event = value.to_owned();
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data = Some(serde_json::from_str(value).expect("JSON data"));
                    } else if line.starts_with(':') {
                        comment = true;
                    }
                }
                if comment && id.is_none() {
                    self.comments += 1;
                    continue;
                }
                return Ok(Sse {
                    id: id.expect("an id"),
                    event,
                    data: data.expect("data"),
                });
            }
            let frame = match tokio::time::timeout_at(deadline, self.body.frame()).await {
                Err(_) => return Err(SseEnd::Quiet),
                Ok(None) => return Err(SseEnd::Ended),
                Ok(Some(Err(error))) => return Err(SseEnd::Failed(format!("{error:?}"))),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }

    /// Every event until the stream ends (each within `within`), and how it ended.
    pub async fn rest(&mut self, within: std::time::Duration) -> (Vec<Sse>, SseEnd) {
        let mut events = Vec::new();
        loop {
            match self.next(within).await {
                Ok(event) => events.push(event),
                Err(end) => return (events, end),
            }
        }
    }
}

impl Api {
    /// Opens an event stream (`GET`), with extra headers such as `Last-Event-ID`.
    pub async fn stream(&mut self, path: &str, headers: &[(&str, &str)]) -> SseStream {
        let mut request = Request::builder()
            .method(Method::GET)
            .uri(format!("http://{}{path}", self.addr))
            .header("accept", "text/event-stream");
        if let Some(token) = &self.bearer {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        if !self.cookies.is_empty() {
            let cookie = self
                .cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ");
            request = request.header("cookie", cookie);
        }
        for (name, value) in headers {
            request = request.header(
                HeaderName::from_bytes(name.as_bytes()).expect("name"),
                HeaderValue::from_str(value).expect("value"),
            );
        }
        let request = request.body(Full::new(Bytes::new())).expect("request");
        let response = self.client.request(request).await.expect("stream request");
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        SseStream {
            status,
            headers,
            body: response.into_body(),
            buffer: Vec::new(),
            scanned: 0,
            comments: 0,
        }
    }
}
