//! The HTTP control plane (hyper, HTTP/1.1). For now: `GET /health` (the process is alive) and
//! `GET /health/ready` (the database answers and its schema is current; 503 otherwise, and while
//! draining). Every error is JSON `{"error": {"code", "message"}}`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actors::Node;
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long readiness waits for the database before answering 503.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// What request handlers share.
pub struct AppState {
    pub node: Node,
    /// Set when the node starts draining: readiness then answers 503 so balancers move away.
    pub draining: AtomicBool,
}

type Reply = Response<Full<Bytes>>;

/// Serves connections from `listener` until `stop` turns true, then stops accepting and waits up to
/// `drain_timeout` for open connections to finish.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    drain_timeout: Duration,
) {
    let graceful = GracefulShutdown::new();
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
                let state = Arc::clone(&state);
                let service = service_fn(move |request| {
                    let state = Arc::clone(&state);
                    async move { Ok::<_, Infallible>(route(&state, request).await) }
                });
                let connection = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%peer, %error, "connection ended with an error");
                    }
                });
            }
            () = stopped(&mut stop) => break,
        }
    }
    drop(listener);
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

async fn route(state: &AppState, request: Request<Incoming>) -> Reply {
    let response = match (request.method(), request.uri().path()) {
        (&Method::GET, "/health") => json_reply(StatusCode::OK, json!({"status": "ok"})),
        (&Method::GET, "/health/ready") => ready(state).await,
        (_, "/health" | "/health/ready") => error_reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            &format!("{} is not allowed here", request.method()),
        ),
        (_, path) => error_reply(
            StatusCode::NOT_FOUND,
            "not_found",
            &format!("no route for {path:?}"),
        ),
    };
    tracing::debug!(method = %request.method(), path = request.uri().path(),
        status = response.status().as_u16(), "request");
    response
}

async fn ready(state: &AppState) -> Reply {
    if state.draining.load(Ordering::SeqCst) {
        return error_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "draining",
            "the node is draining",
        );
    }
    let worker_id = &state.node.identity().worker_id;
    match tokio::time::timeout(READY_TIMEOUT, state.node.store().health()).await {
        Ok(Ok(health)) if health.schema_current => json_reply(
            StatusCode::OK,
            json!({
                "status": "ready",
                "worker_id": worker_id,
                "backend": health.backend,
                "schema_version": health.schema_version,
            }),
        ),
        Ok(Ok(health)) => error_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "schema_not_current",
            &format!(
                "the database schema is at version {}, this build needs {}",
                health.schema_version,
                store::SCHEMA_VERSION
            ),
        ),
        Ok(Err(error)) => error_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            &error.to_string(),
        ),
        Err(_) => error_reply(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            &format!(
                "the database did not answer within {} ms",
                READY_TIMEOUT.as_millis()
            ),
        ),
    }
}

fn json_reply(status: StatusCode, body: serde_json::Value) -> Reply {
    let mut response = Response::new(Full::new(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The one error shape of the API.
pub fn error_reply(status: StatusCode, code: &str, message: &str) -> Reply {
    json_reply(status, json!({"error": {"code": code, "message": message}}))
}
