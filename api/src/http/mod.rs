//! The HTTP control plane (hyper, HTTP/1.1): the REST API under `/api/v1`, the compatible action
//! endpoint, sign-in, `/health`, `/health/ready` and `/api/v1/openapi.json`; and the files of
//! the browser console ([`crate::console`]), answered before the route table with their own
//! headers.
//!
//! Every request goes the same way: the route table ([`routes`]) finds the route (404/405), the
//! body is read up to `http.body_bytes_max` (413) within `http.body_timeout_ms` (408), the
//! caller is identified (401) and, for a state-changing request made with a session cookie, its
//! CSRF token is checked (403); then the route's operation runs. Every refusal is JSON
//! `{"error": {"code", "message"}}` ([`error`]), and every reply carries headers that keep it
//! from running as a page ([`harden`]). Connections are capped and their slow clients closed
//! ([`connections`]).

mod auth;
mod compat;
mod connections;
mod downloads;
mod error;
mod events;
pub(crate) mod host;
mod inbox;
mod openapi;
mod per_user;
mod reads;
pub(crate) mod record;
mod routes;
mod rules;
mod users;
pub(crate) mod wait;
mod wire;
mod workflows;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use actors::{Node, StoreHandle};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{
    AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE, COOKIE, HeaderMap, HeaderName, HeaderValue,
};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde::Serialize;
use serde::de::DeserializeOwned;
use store::UserRow;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::Instrument;

pub use auth::new_secret;
pub use error::ApiError;

use crate::config::{AddressRange, AuthConfig, EventsConfig, HttpConfig, Limits};
use crate::console;
use auth::{LoginBudgets, LoginThrottle, PasswordHashing, Secret};
use connections::Connections;
use routes::{Access, Found, Route};

/// The `Content-Security-Policy` of every reply: a sandboxed document with no sources at all.
const CONTENT_SECURITY_POLICY: &str = "sandbox; default-src 'none'; frame-ancestors 'none'";
/// How long readiness waits for the database before answering 503.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// What request handlers share.
pub struct AppState {
    pub node: Node,
    /// Set when the node starts draining: readiness then answers 503 so balancers move away, and
    /// launches and recoveries are refused.
    pub draining: AtomicBool,
    secret: Secret,
    http: HttpConfig,
    auth: AuthConfig,
    throttle: LoginThrottle,
    /// Bounds the password hashing of the whole node.
    hashing: PasswordHashing,
    /// Requests waiting for a workflow (`?wait=`), bounded by `http.waiters_max`.
    waiters: wait::Waiters,
    /// Record reads, bounded per user by `http.record_reads_per_user_max`.
    record_reads: reads::RecordReads,
    /// The event streams: their limits and places.
    streams: events::EventStreams,
    /// The database's part of `/metrics` and when it was counted (see `http.metrics_refresh_ms`).
    database_gauges: tokio::sync::Mutex<Option<(Instant, String)>>,
    /// `limits.user_stored_bytes_max`, which `me` and the users' listing show beside what each
    /// user stores (the workflows' grants are checked against it).
    stored_bytes_max: u64,
    /// `limits.title_chars_max`: the longest title a launch takes, in characters.
    title_chars_max: u64,
    /// `openapi.json`, with this node's configured bounds.
    openapi: serde_json::Value,
}

impl AppState {
    pub fn new(
        node: Node,
        secret: &str,
        http: HttpConfig,
        auth: AuthConfig,
        events: EventsConfig,
        limits: &Limits,
    ) -> Self {
        let throttle = LoginThrottle::new(LoginBudgets {
            pair_failures_max: auth.login_failures_max,
            address_failures_max: auth.login_address_failures_max,
            account_failures_max: auth.login_account_failures_max,
            window: Duration::from_secs(auth.login_window_seconds),
        });
        let hashing =
            PasswordHashing::new(usize::try_from(auth.password_hashes_max).unwrap_or(usize::MAX));
        let waiters_max = http.waiters_max.min(connections::waiting_connections_max(
            connections::connections_that_fit(http.connections_max),
        ));
        let waiters = wait::Waiters::new(&node.changes(), waiters_max, http.waiters_per_user_max);
        let record_reads =
            reads::RecordReads::new(http.record_reads_per_user_max, http.record_read_wait_ms);
        let openapi = openapi::document(&openapi::Bounds {
            title_chars_max: limits.title_chars_max,
            token_days_max: auth.token_days_max,
            page_size_max: http.page_size_max,
            record_steps_page_max: http.record_steps_page_max,
            record_artifacts_page_max: http.record_artifacts_page_max,
        });
        AppState {
            openapi,
            record_reads,
            node,
            draining: AtomicBool::new(false),
            secret: Secret::new(secret),
            http,
            auth,
            throttle,
            hashing,
            waiters,
            streams: events::EventStreams::new(events),
            database_gauges: tokio::sync::Mutex::new(None),
            stored_bytes_max: limits.user_stored_bytes_max,
            title_chars_max: limits.title_chars_max,
        }
    }

    /// Answers every waiting request now with what it sees (the node stops serving).
    pub fn stop_waiters(&self) {
        self.waiters.stop();
    }

    fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// A reply's body: whole, or an event stream that its task writes as events commit.
pub type ReplyBody = http_body_util::Either<Full<Bytes>, events::EventBody>;

pub type Reply = Response<ReplyBody>;

/// A whole body.
fn full(bytes: impl Into<Bytes>) -> ReplyBody {
    http_body_util::Either::Left(Full::new(bytes.into()))
}

/// Connections the kernel may hold for the node before it accepts them (capped by
/// `net.core.somaxconn`). Past it, new connections' handshakes are dropped and retried after a
/// second, so a burst of connections larger than the queue would delay a `/health` probe.
const LISTEN_BACKLOG: u32 = 4096;

/// Listens on `address` with a queue of [`LISTEN_BACKLOG`] connections.
pub fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Serves connections from `listener` until `stop` turns true, then stops accepting and waits up to
/// `drain_timeout` for open connections to finish.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    drain_timeout: Duration,
) {
    let graceful = GracefulShutdown::new();
    let head_bytes_max = usize::try_from(state.http.head_bytes_max).unwrap_or(usize::MAX);
    let head_timeout = Duration::from_millis(state.http.head_timeout_ms);
    let connections_max = connections::connections_that_fit(state.http.connections_max);
    if connections_max < state.http.connections_max {
        tracing::warn!(
            connections_max,
            "`http.connections_max` ({}) is more than the file descriptor limit allows",
            state.http.connections_max
        );
    }
    let connections = Connections::new(usize::try_from(connections_max).unwrap_or(usize::MAX));
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Running out of file descriptors is the usual cause; back off briefly.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(admitted) = connections.admit().await else {
                    tracing::debug!(%peer, "refused a connection: every open one runs a request");
                    continue;
                };
                let state = Arc::clone(&state);
                let running = Arc::clone(&admitted.running);
                let close = Arc::clone(&admitted.close);
                let service = service_fn(move |request| {
                    let state = Arc::clone(&state);
                    let running = Arc::clone(&running);
                    let close = Arc::clone(&close);
                    async move {
                        let reply = handle(&state, request, peer, &running, close).await;
                        running.store(false, Ordering::SeqCst);
                        Ok::<_, Infallible>(reply)
                    }
                });
                let connection = http1::Builder::new()
                    .timer(TokioTimer::new())
                    // hyper starts this timer again as soon as a connection waits for its next
                    // request, so it is the idle keep-alive timeout as well.
                    .header_read_timeout(head_timeout)
                    .max_header_size(head_bytes_max)
                    // hyper refuses buffers under 8 KiB.
                    .max_buf_size(head_bytes_max.max(8192))
                    .serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    tokio::select! {
                        ended = connection => {
                            if let Err(error) = ended {
                                tracing::debug!(%peer, %error, "connection ended with an error");
                            }
                        }
                        () = admitted.close.notified() => {
                            tracing::debug!(%peer, "closed to make room for a new connection");
                        }
                    }
                    drop(admitted);
                });
            }
            () = stopped(&mut stop) => break,
        }
    }
    drop(listener);
    // Event streams never end by themselves; the drain would wait for them.
    state.streams.stop();
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("open connections did not finish within the drain timeout");
    }
}

/// Resolves once `stop` turns true (or its sender is gone, which also means stop).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopping| *stopping).await.map(|_| ());
}

/// Who is calling, once identified.
#[derive(Debug, Clone)]
pub struct Principal {
    pub user: UserRow,
    /// How the caller proved who they are.
    pub credential: Credential,
}

/// One request on its way to its operation.
pub struct Ctx<'a> {
    pub state: &'a AppState,
    pub route: &'static Route,
    params: Vec<(&'static str, String)>,
    query: Option<String>,
    headers: HeaderMap,
    body: Bytes,
    /// The client's address: the peer's, or from `X-Forwarded-For` when the peer is a trusted
    /// proxy.
    client: IpAddr,
    principal: Option<Principal>,
    /// Closes the request's connection (an event stream's client that reads nothing).
    close: Arc<tokio::sync::Notify>,
}

impl Ctx<'_> {
    /// The caller; routes that are not public always have one.
    fn principal(&self) -> Result<&Principal, ApiError> {
        self.principal
            .as_ref()
            .ok_or_else(|| ApiError::unauthorized("sign in first"))
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The request body as `T`; errors name the field.
    fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let body: &[u8] = if self.body.iter().all(u8::is_ascii_whitespace) {
            b"{}"
        } else {
            &self.body
        };
        runtime::check_text_depth(body, "the body").map_err(ApiError::bad_request)?;
        let mut deserializer = serde_json::Deserializer::from_slice(body);
        let value = serde_path_to_error::deserialize(&mut deserializer).map_err(field_error)?;
        deserializer
            .end()
            .map_err(|e| ApiError::bad_request(format!("the body is not one JSON value: {e}")))?;
        Ok(value)
    }

    /// The request body as a form.
    fn form<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        let mut fields = serde_json::Map::new();
        for (key, value) in form_urlencoded::parse(&self.body) {
            if fields
                .insert(key.to_string(), value.to_string().into())
                .is_some()
            {
                return Err(ApiError::bad_request(format!(
                    "form field `{key}` is given twice"
                )));
            }
        }
        serde_path_to_error::deserialize(serde_json::Value::Object(fields)).map_err(field_error)
    }

    /// The query string's value of `name`.
    fn query(&self, name: &str) -> Option<String> {
        let query = self.query.as_deref()?;
        form_urlencoded::parse(query.as_bytes())
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.into_owned())
    }
}

/// Refuses a query parameter the route does not take, or one given twice (400), as a body's
/// unknown or repeated field is refused: a misspelt filter must not silently list everything.
fn known_query(route: &Route, query: Option<&str>) -> Result<(), ApiError> {
    let Some(query) = query else {
        return Ok(());
    };
    let mut seen: Vec<String> = Vec::new();
    for (name, _) in form_urlencoded::parse(query.as_bytes()) {
        if !route.query.iter().any(|q| q.name == name) {
            let takes: Vec<&str> = route.query.iter().map(|q| q.name).collect();
            return Err(ApiError::bad_request(if takes.is_empty() {
                format!("query parameter `{name}`: this route takes none")
            } else {
                format!(
                    "query parameter `{name}`: unknown here (this route takes {})",
                    takes.join(", ")
                )
            }));
        }
        if seen.iter().any(|s| *s == name) {
            return Err(ApiError::bad_request(format!(
                "query parameter `{name}` is given twice"
            )));
        }
        seen.push(name.into_owned());
    }
    Ok(())
}

/// Refuses a request a browser sent from another site: an `Origin` (`null` included) whose
/// host and port are not the request's `Host`. Requests without `Origin` (not from a browser's
/// cross-site form or script) pass.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(hyper::header::ORIGIN) else {
        return Ok(());
    };
    let cross_site = |why: String| {
        ApiError::forbidden(
            "cross_origin",
            format!("sign-in is accepted from this site only: {why}"),
        )
    };
    let origin = origin
        .to_str()
        .map_err(|_| cross_site("the Origin header is not text".into()))?
        .to_ascii_lowercase();
    let host = headers
        .get(hyper::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let (scheme, authority) = origin
        .split_once("://")
        .ok_or_else(|| cross_site(format!("origin {origin:?} names no site")))?;
    let default_port = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => return Err(cross_site(format!("origin {origin:?} is not http(s)"))),
    };
    let without_default = |authority: &str| -> String {
        authority
            .strip_suffix(default_port)
            .unwrap_or(authority)
            .to_owned()
    };
    if without_default(authority) != without_default(&host) {
        return Err(cross_site(format!(
            "origin {origin:?} is not this host ({host:?})"
        )));
    }
    Ok(())
}

fn field_error<E: std::fmt::Display>(error: serde_path_to_error::Error<E>) -> ApiError {
    let path = error.path().to_string();
    if path == "." || path == "?" {
        ApiError::bad_request(format!("invalid body: {}", error.inner()))
    } else {
        ApiError::bad_request(format!("body field `{path}`: {}", error.inner()))
    }
}

async fn handle(
    state: &AppState,
    request: Request<Incoming>,
    peer: SocketAddr,
    running: &AtomicBool,
    close: Arc<tokio::sync::Notify>,
) -> Reply {
    let method = request.method().as_str().to_owned();
    let path = request.uri().path().to_owned();
    if let Err(error) = host::check(request.headers(), &state.http.allowed_hosts) {
        let mut reply = error_reply(&error);
        harden(&mut reply);
        state.node.metrics().inc(
            "reins_http_requests_total",
            &[
                ("method", known_method(&method)),
                ("route", "(unknown host)"),
                ("status", reply.status().as_str()),
            ],
        );
        return reply;
    }
    if matches!(method.as_str(), "GET" | "HEAD") && console::owns(&path) {
        return console_reply(state, &method, &path);
    }
    let span = tracing::info_span!("request", %method, %path);
    let found = routes::find(&method, &path);
    // Counted by route template, never by raw path: ids would make the label set unbounded.
    let route = match &found {
        Found::Route(route, _) => route.path,
        Found::WrongMethod(_) => "(method not allowed)",
        Found::Nothing => "(no route)",
    };
    async move {
        let mut reply = match respond(state, request, found, peer.ip(), running, close).await {
            Ok(reply) => reply,
            Err(error) => error_reply(&error),
        };
        harden(&mut reply);
        let status = reply.status();
        tracing::debug!(status = status.as_u16(), "request");
        state.node.metrics().inc(
            "reins_http_requests_total",
            &[
                ("method", known_method(&method)),
                ("route", route),
                ("status", status.as_str()),
            ],
        );
        reply
    }
    .instrument(span)
    .await
}

/// A file of the browser console (its own headers: [`console::CONTENT_SECURITY_POLICY`]), or a
/// 404 under the API's hardened headers for a console path that names no file.
fn console_reply(state: &AppState, method: &str, path: &str) -> Reply {
    let (reply, route) = match console::asset(path) {
        Some(asset) => {
            let mut reply = Response::new(full(Bytes::from_static(asset.body)));
            let headers = reply.headers_mut();
            for (name, value) in [
                ("content-type", asset.content_type),
                ("content-security-policy", console::CONTENT_SECURITY_POLICY),
                ("x-content-type-options", "nosniff"),
                ("referrer-policy", "no-referrer"),
                ("x-frame-options", "DENY"),
                ("cross-origin-opener-policy", "same-origin"),
                // A new binary may bring new files under the same names.
                ("cache-control", "no-cache"),
            ] {
                headers.insert(
                    HeaderName::from_static(name),
                    HeaderValue::from_static(value),
                );
            }
            (reply, "(console)")
        }
        None => {
            let mut reply = error_reply(&ApiError::not_found(format!(
                "the console has no file {path:?}"
            )));
            harden(&mut reply);
            (reply, "(no route)")
        }
    };
    state.node.metrics().inc(
        "reins_http_requests_total",
        &[
            ("method", known_method(method)),
            ("route", route),
            ("status", reply.status().as_str()),
        ],
    );
    reply
}

/// Headers on every reply so that no answer of this origin (an artifact's stored bytes above
/// all) can run as a page, be sniffed into a runnable type or be framed by another site. The API
/// serves no page of its own, so the policy allows nothing.
fn harden(reply: &mut Reply) {
    let headers = reply.headers_mut();
    headers.insert(
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    );
}

/// The method as a label: the ones the API uses, anything else as `other`.
fn known_method(method: &str) -> &'static str {
    match method {
        "GET" => "GET",
        "POST" => "POST",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

async fn respond(
    state: &AppState,
    request: Request<Incoming>,
    found: Found,
    peer: IpAddr,
    running: &AtomicBool,
    close: Arc<tokio::sync::Notify>,
) -> Result<Reply, ApiError> {
    let (parts, body) = request.into_parts();
    // Read first, whatever the route: a connection whose request body was left unread cannot
    // carry the next request. A body that takes longer than its timeout is refused (408) and its
    // connection closed, so that a client sending a byte now and then cannot hold it.
    let body_timeout = Duration::from_millis(state.http.body_timeout_ms);
    let body = tokio::time::timeout(
        body_timeout,
        read_body(&parts.headers, body, state.http.body_bytes_max),
    )
    .await
    .map_err(|_| {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            format!(
                "the request body did not arrive within `http.body_timeout_ms` ({} ms)",
                state.http.body_timeout_ms
            ),
        )
    })??;
    running.store(true, Ordering::SeqCst);
    let (route, mut params) = match found {
        Found::Route(route, params) => (route, params),
        Found::WrongMethod(allowed) => {
            return Err(ApiError::method_not_allowed(parts.method.as_str(), allowed));
        }
        Found::Nothing => {
            return Err(ApiError::not_found(format!(
                "no route for {:?}",
                parts.uri.path()
            )));
        }
    };
    let client = client_address(peer, &parts.headers, &state.http.trusted_proxies);
    let principal = match route.access {
        Access::Public => None,
        Access::User | Access::Admin => {
            let principal = authenticate(state, &parts.headers, parts.method.as_str()).await?;
            if route.access == Access::Admin && !principal.user.is_admin() {
                return Err(ApiError::forbidden(
                    "admin_only",
                    "only an admin may do this",
                ));
            }
            Some(principal)
        }
    };
    known_query(route, parts.uri.query())?;
    let (lifted, body) = compat::lift(route, &body)?;
    params.extend(lifted);
    let ctx = Ctx {
        state,
        route,
        params,
        query: parts.uri.query().map(str::to_owned),
        headers: parts.headers,
        body,
        client,
        principal,
        close,
    };
    dispatch(&ctx).await
}

async fn dispatch(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    use routes::Op;
    match ctx.route.op {
        Op::Health => Ok(json_reply(
            StatusCode::OK,
            &wire::HealthReply {
                status: "ok".into(),
                cluster: ctx.state.secret.cluster_id(),
            },
        )),
        Op::Ready => ready(ctx.state).await,
        Op::Metrics => metrics(ctx).await,
        Op::OpenApi => Ok(json_reply(StatusCode::OK, &ctx.state.openapi)),
        Op::Plugins => Ok(json_reply(StatusCode::OK, workflows::plugins())),
        Op::Initialize => users::initialize(ctx).await,
        Op::Login => users::login(ctx).await,
        Op::Logout => users::logout(ctx).await,
        Op::Me => users::me(ctx).await,
        Op::CreateUser => users::create_user(ctx).await,
        Op::ListUsers => users::list_users(ctx).await,
        Op::ChangeUser => users::change_user(ctx).await,
        Op::ResetPassword => users::reset_password(ctx).await,
        Op::SignOutUser => users::sign_out_user(ctx).await,
        Op::DeleteUser => users::delete_user(ctx).await,
        Op::ChangePassword => users::change_password(ctx).await,
        Op::SignOutEverywhere => users::sign_out_everywhere(ctx).await,
        Op::CreateToken => users::create_token(ctx).await,
        Op::ListTokens => users::list_tokens(ctx).await,
        Op::RevokeToken => users::revoke_token(ctx).await,
        Op::Launch => workflows::launch(ctx).await,
        Op::List => workflows::list(ctx).await,
        Op::Get => workflows::get(ctx).await,
        Op::Resume => workflows::resume(ctx).await,
        Op::SendEvent => workflows::send_event(ctx).await,
        Op::Decide => workflows::decide(ctx).await,
        Op::Answer => workflows::answer(ctx).await,
        Op::Cancel => workflows::cancel(ctx).await,
        Op::Recover => workflows::recover(ctx).await,
        Op::Retry => workflows::retry(ctx).await,
        Op::Reconcile => workflows::reconcile(ctx).await,
        Op::Delete => workflows::delete(ctx).await,
        Op::Steps => workflows::steps(ctx).await,
        Op::Artifacts => workflows::artifacts(ctx).await,
        Op::Artifact => workflows::artifact(ctx).await,
        Op::ArtifactChunk => workflows::artifact_chunk(ctx).await,
        Op::WorkflowEvents => events::workflow_events(ctx).await,
        Op::Events => events::feed(ctx).await,
        Op::Inbox => inbox::inbox(ctx).await,
        Op::Nodes => inbox::nodes(ctx).await,
        Op::Slots => inbox::slots(ctx).await,
    }
}

/// Reads the whole body, refusing one over `limit` bytes (413) before reading it when its length
/// is declared.
async fn read_body(headers: &HeaderMap, body: Incoming, limit: u64) -> Result<Bytes, ApiError> {
    let too_large = |declared: Option<u64>| {
        let size = match declared {
            Some(declared) => format!("{declared} bytes"),
            // Sent without a length (chunked): refused as soon as it passed the limit.
            None => "longer than that".to_owned(),
        };
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the request body is over `http.body_bytes_max` ({limit} bytes): it is {size}"),
        )
    };
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(declared) = declared
        && declared > limit
    {
        return Err(too_large(Some(declared)));
    }
    let limit_bytes = usize::try_from(limit).unwrap_or(usize::MAX);
    match Limited::new(body, limit_bytes).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large(None)),
        Err(error) => Err(ApiError::bad_request(format!(
            "the request body could not be read: {error}"
        ))),
    }
}

/// The client's address. A request from a trusted proxy is from the right-most address of
/// `X-Forwarded-For` that is not itself a trusted proxy (each proxy appends the address it was
/// called from, so entries to the left of an untrusted one may be forged); anything else is from
/// its peer.
fn client_address(peer: IpAddr, headers: &HeaderMap, trusted: &[AddressRange]) -> IpAddr {
    let is_trusted = |address: IpAddr| trusted.iter().any(|range| range.contains(address));
    let peer = peer.to_canonical();
    if !is_trusted(peer) {
        return peer;
    }
    let forwarded: Vec<&str> = headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .collect();
    let mut client = peer;
    for entry in forwarded.iter().rev() {
        let Ok(address) = entry.trim().parse::<IpAddr>() else {
            break;
        };
        client = address.to_canonical();
        if !is_trusted(client) {
            break;
        }
    }
    client
}

/// Identifies the caller by API token or session cookie; checks CSRF for cookie sessions.
async fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    method: &str,
) -> Result<Principal, ApiError> {
    let credential = Credential::of(state, headers)?;
    let user = credential.user(&state.node.store()).await?;
    if let Credential::Session(claim) = &credential
        && !matches!(method, "GET" | "HEAD" | "OPTIONS")
    {
        let expected = state.secret.csrf_token(&claim.session_id);
        let header = headers
            .get(auth::CSRF_HEADER)
            .ok_or_else(|| ApiError::forbidden("csrf", "the X-CSRF-Token header is missing"))?
            .to_str()
            .unwrap_or_default();
        let cookies = cookie_header(headers);
        let cookie = auth::cookie(&cookies, auth::CSRF_COOKIE).unwrap_or_default();
        if !(auth::same(header, &expected) && auth::same(cookie, &expected)) {
            return Err(ApiError::forbidden(
                "csrf",
                "the X-CSRF-Token header does not match this session's csrf_token cookie",
            ));
        }
    }
    Ok(Principal { user, credential })
}

/// What a request proves its caller with: an API token, or a session cookie whose signature
/// was checked. Kept by a request that outlives its start (an event stream), which asks again
/// whether it still names a user.
#[derive(Clone)]
pub enum Credential {
    Token { token_id: String, secret: String },
    Session(auth::SessionClaim),
}

/// Never prints a token's secret.
impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Token { token_id, .. } => write!(f, "Token({token_id})"),
            Credential::Session(claim) => write!(f, "Session({})", claim.session_id),
        }
    }
}

impl Credential {
    fn of(state: &AppState, headers: &HeaderMap) -> Result<Self, ApiError> {
        if let Some(value) = headers.get(AUTHORIZATION) {
            let value = value
                .to_str()
                .map_err(|_| ApiError::unauthorized("the Authorization header is not text"))?;
            // The scheme is case-insensitive (RFC 9110): `bearer` and `BEARER` are `Bearer`.
            let token = value
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, token)| token)
                .ok_or_else(|| ApiError::unauthorized("Authorization must be `Bearer <token>`"))?;
            let (token_id, secret) = auth::parse_token(token.trim()).ok_or_else(|| {
                ApiError::unauthorized("the bearer token is not a reins API token")
            })?;
            return Ok(Credential::Token {
                token_id: token_id.to_owned(),
                secret: secret.to_owned(),
            });
        }
        let cookies = cookie_header(headers);
        let value = auth::cookie(&cookies, auth::SESSION_COOKIE).ok_or_else(|| {
            ApiError::unauthorized("sign in first: the request has no session cookie or API token")
        })?;
        auth::verify_session_cookie(&state.secret, value)
            .map(Credential::Session)
            .ok_or_else(|| {
                ApiError::unauthorized("the session cookie was not signed by this cluster's secret")
            })
    }

    /// The user this credential names now: unauthorized once the token is revoked or expired,
    /// the session signed out, expired or revoked, or the user disabled.
    pub async fn user(&self, store: &StoreHandle) -> Result<UserRow, ApiError> {
        match self {
            Credential::Token { token_id, secret } => {
                let unknown = || ApiError::unauthorized("the API token is unknown or revoked");
                let Some((row, user)) = store.token_user(token_id).await? else {
                    // Said only to whoever holds the token's secret.
                    let expired = store
                        .expired_token(token_id)
                        .await?
                        .filter(|expired| auth::token_matches(secret, &expired.token_hash));
                    return Err(match expired {
                        Some(_) => ApiError::unauthorized(
                            "the API token expired: sign in again (`reins login`, or the \
                             console) and make a new token",
                        ),
                        None => unknown(),
                    });
                };
                if !auth::token_matches(secret, &row.token_hash) {
                    return Err(unknown());
                }
                Ok(user)
            }
            Credential::Session(claim) => store
                .session_user(&claim.session_id)
                .await?
                .filter(|user| {
                    user.id == claim.user_id && user.token_version == claim.token_version
                })
                .ok_or_else(|| {
                    ApiError::unauthorized("the session has ended (signed out, expired or revoked)")
                }),
        }
    }

    /// The session, when the caller signed in with a cookie (not an API token).
    pub fn session_id(&self) -> Option<&str> {
        match self {
            Credential::Session(claim) => Some(&claim.session_id),
            Credential::Token { .. } => None,
        }
    }
}

/// Every `Cookie` header of a request, joined.
fn cookie_header(headers: &HeaderMap) -> String {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The node's counters plus what the database says (counted at most once every
/// `http.metrics_refresh_ms`), for the clients `http.metrics_from` names.
async fn metrics(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let state = ctx.state;
    if !state
        .http
        .metrics_from
        .iter()
        .any(|range| range.contains(ctx.client))
    {
        return Err(ApiError::forbidden(
            "metrics_forbidden",
            format!(
                "{} is not in `http.metrics_from`: metrics are served to the private network",
                ctx.client
            ),
        ));
    }
    let mut text = state.node.metrics().render();
    let mut database = state.database_gauges.lock().await;
    let refresh = Duration::from_millis(state.http.metrics_refresh_ms);
    match &*database {
        Some((counted, gauges)) if counted.elapsed() < refresh => text.push_str(gauges),
        _ => {
            let gauges = database_gauges(state).await?;
            text.push_str(&gauges);
            *database = Some((Instant::now(), gauges));
        }
    }
    drop(database);
    let mut reply = Response::new(full(text));
    reply.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(reply)
}

/// Workflows by stored status (the whole cluster) and the store pool, as Prometheus text.
async fn database_gauges(state: &AppState) -> Result<String, ApiError> {
    let mut text = String::new();
    let store = state.node.store();
    let counts = store.workflow_counts(None).await?;
    let samples: Vec<_> = counts
        .iter()
        .map(|c| (vec![("status", c.status.as_str())], c.count as f64))
        .collect();
    actors::metrics::render_gauge(
        &mut text,
        "reins_workflows",
        "Workflows in the database, by stored status.",
        &samples,
    );
    let overdue = store.overdue_waits().await?;
    actors::metrics::render_gauge(
        &mut text,
        "reins_inbox_overdue",
        "Pauses and checkpoints still waiting past their remindAfterMs (the whole cluster).",
        &[(Vec::new(), overdue as f64)],
    );
    let backlog = store.notification_backlog().await?;
    actors::metrics::render_gauge(
        &mut text,
        "reins_notify_outbox_backlog",
        "Notifications in the outbox (the whole cluster): not yet delivered to every webhook.",
        &[(Vec::new(), backlog as f64)],
    );
    let health = store.health().await?;
    let (batches, writes) = health.write_batches;
    actors::metrics::render_counter(
        &mut text,
        "reins_store_write_batches_total",
        "Transactions that committed (or tried) more than one write together.",
        batches as f64,
    );
    actors::metrics::render_counter(
        &mut text,
        "reins_store_batched_writes_total",
        "Writes those batches carried.",
        writes as f64,
    );
    if let Some((size, idle)) = health.pool {
        actors::metrics::render_gauge(
            &mut text,
            "reins_store_pool_connections",
            "PostgreSQL pool connections open, and idle among them.",
            &[
                (vec![("state", "open")], size as f64),
                (vec![("state", "idle")], idle as f64),
            ],
        );
    }
    Ok(text)
}

async fn ready(state: &AppState) -> Result<Reply, ApiError> {
    if state.draining() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "the node is draining",
        ));
    }
    let worker_id = &state.node.identity().worker_id;
    let unavailable =
        |code, message: String| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message);
    match tokio::time::timeout(READY_TIMEOUT, state.node.store().health()).await {
        Ok(Ok(health)) if health.disk_full => Err(unavailable(
            "disk_full",
            "the database's disk is full: writes fail until space is freed".into(),
        )),
        Ok(Ok(health)) if health.schema_current => Ok(json_reply(
            StatusCode::OK,
            serde_json::json!({
                "status": "ready",
                "worker_id": worker_id,
                "backend": health.backend,
                "schema_version": health.schema_version,
            }),
        )),
        Ok(Ok(health)) => Err(unavailable(
            "schema_not_current",
            format!(
                "the database schema is at version {}, this build needs {}",
                health.schema_version,
                store::SCHEMA_VERSION
            ),
        )),
        Ok(Err(error)) => Err(unavailable("database_unavailable", error.to_string())),
        Err(_) => Err(unavailable(
            "database_unavailable",
            format!(
                "the database did not answer within {} ms",
                READY_TIMEOUT.as_millis()
            ),
        )),
    }
}

fn json_reply(status: StatusCode, body: impl Serialize) -> Reply {
    let bytes = match serde_json::to_vec(&body) {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::error!(%error, "a reply did not serialize");
            return error_reply(&ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "the reply could not be written",
            ));
        }
    };
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The one error shape of the API.
pub fn error_reply(error: &ApiError) -> Reply {
    let mut response = json_reply(error.status, error.body());
    if matches!(
        error.status,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT
    ) {
        // The rest of the body is not read: this connection cannot carry another request.
        response
            .headers_mut()
            .insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(seconds) = error.retry_after_seconds {
        response
            .headers_mut()
            .insert(hyper::header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    if let Some(allow) = error
        .allow
        .as_deref()
        .and_then(|allow| HeaderValue::from_str(allow).ok())
    {
        response.headers_mut().insert(hyper::header::ALLOW, allow);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(*name, HeaderValue::from_str(value).expect("value"));
        }
        headers
    }

    fn ranges(texts: &[&str]) -> Vec<AddressRange> {
        texts
            .iter()
            .map(|t| AddressRange::try_from((*t).to_owned()).expect("range"))
            .collect()
    }

    #[test]
    fn the_client_is_the_right_most_untrusted_forwarded_address() {
        let trusted = ranges(&["10.0.0.0/8", "127.0.0.1"]);
        let proxy: IpAddr = [10, 1, 1, 1].into();
        let forwarded = headers(&[("x-forwarded-for", "6.6.6.6, 1.2.3.4, 10.2.2.2")]);
        assert_eq!(
            client_address(proxy, &forwarded, &trusted),
            IpAddr::from([1, 2, 3, 4])
        );
        let split = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(
            client_address(proxy, &split, &trusted),
            IpAddr::from([1, 2, 3, 4])
        );
        // From anyone else the header is not believed.
        let stranger: IpAddr = [8, 8, 8, 8].into();
        assert_eq!(client_address(stranger, &forwarded, &trusted), stranger);
        // Garbage stops the walk at the last address known good.
        let garbage = headers(&[("x-forwarded-for", "1.2.3.4, junk, 10.2.2.2")]);
        assert_eq!(
            client_address(proxy, &garbage, &trusted),
            IpAddr::from([10, 2, 2, 2])
        );
        assert_eq!(client_address(proxy, &HeaderMap::new(), &trusted), proxy);
        assert_eq!(client_address(proxy, &forwarded, &[]), proxy);
    }

    #[test]
    fn only_an_origin_naming_the_host_may_sign_in() {
        let host = ("host", "reins.example.com");
        assert!(same_origin(&headers(&[host])).is_ok());
        for good in [
            "https://reins.example.com",
            "https://reins.example.com:443",
            "http://REINS.example.com",
        ] {
            assert!(
                same_origin(&headers(&[host, ("origin", good)])).is_ok(),
                "{good}"
            );
        }
        for bad in [
            "https://evil.example",
            "null",
            "https://reins.example.com:8443",
            "file://reins.example.com",
        ] {
            let error = same_origin(&headers(&[host, ("origin", bad)])).expect_err(bad);
            assert_eq!(error.status, StatusCode::FORBIDDEN, "{bad}");
        }
        let with_port = ("host", "127.0.0.1:7420");
        assert!(same_origin(&headers(&[with_port, ("origin", "http://127.0.0.1:7420")])).is_ok());
        assert!(same_origin(&headers(&[with_port, ("origin", "http://127.0.0.1")])).is_err());
    }
}
