//! Server-Sent Events: `GET /api/v1/workflows/{id}/events` (one workflow's events, replayed
//! after `Last-Event-ID` or `?after=`, then followed; the stream ends once the workflow's final
//! status has been sent) and `GET /api/v1/events` (status changes of every workflow the caller
//! may see; it never ends by itself).
//!
//! A stream is a task that reads rows in batches of `events.batch_max` and hands frames to the
//! connection through a buffer of `events.stream_buffer_bytes_max` bytes: a client that leaves
//! it full for `events.stream_stall_ms` is disconnected, so a stream never holds more than that
//! for anyone. It reads again when [`actors::events::EventWakes`] wakes it (a commit of this
//! node, or one of another node that the change bus announced: a workflow stream watches its
//! workflow, so that on PostgreSQL each of its events is announced) or every `events.poll_ms`
//! (the fallback for an announcement lost), and sends a keep-alive comment every
//! `events.keepalive_ms`. At most `events.streams_max` streams run on a node (503 beyond); they
//! end when the node stops serving.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actors::StoreHandle;
use actors::events::EventWakes;
use bytes::Bytes;
use hyper::StatusCode;
use hyper::body::{Frame, SizeHint};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName, HeaderValue};
use store::{EventRow, UserRow, WorkflowId, WorkflowStatus};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::per_user::PerUser;
use super::{ApiError, Credential, Ctx, Reply, ReplyBody};
use crate::config::EventsConfig;

/// The streams of a node: their limits, the permits of `events.streams_max`, and the signal
/// that ends them all when the node stops serving.
pub struct EventStreams {
    config: EventsConfig,
    open: Arc<Semaphore>,
    /// Each user's streams, at most `events.streams_per_user_max`.
    per_user: PerUser,
    stop: CancellationToken,
}

impl EventStreams {
    pub fn new(config: EventsConfig) -> Self {
        let streams_max = usize::try_from(config.streams_max).unwrap_or(usize::MAX);
        EventStreams {
            per_user: PerUser::new(
                "events.streams_per_user_max",
                "streams_busy",
                u64::from(config.streams_per_user_max),
            ),
            config,
            open: Arc::new(Semaphore::new(streams_max)),
            stop: CancellationToken::new(),
        }
    }

    /// Ends every stream (the node stops serving): a stream holds its connection open, so the
    /// drain would otherwise wait for it.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

/// A stream's connection side: the frames its task hands over, each holding its share of the
/// stream's byte budget until the connection takes it.
pub struct EventBody {
    frames: mpsc::UnboundedReceiver<Chunk>,
}

enum Chunk {
    Data(Bytes, OwnedSemaphorePermit),
    /// The client is disconnected: the connection is closed without ending the body cleanly.
    Abort,
}

/// Why a stream's connection was closed under it.
#[derive(Debug, thiserror::Error)]
#[error("the event stream's client read nothing for too long")]
pub struct Disconnected;

impl hyper::body::Body for EventBody {
    type Data = Bytes;
    type Error = Disconnected;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Disconnected>>> {
        match self.frames.poll_recv(cx) {
            Poll::Ready(Some(Chunk::Data(bytes, permit))) => {
                drop(permit);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Poll::Ready(Some(Chunk::Abort)) => Poll::Ready(Some(Err(Disconnected))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What a stream's task writes into: the frames, and the byte budget they are counted against.
struct Sender {
    frames: mpsc::UnboundedSender<Chunk>,
    /// Closes the connection: a client that reads nothing keeps the connection from taking
    /// even the frame that would end it.
    close: Arc<Notify>,
    budget: Arc<Semaphore>,
    budget_bytes: u32,
    stall: Duration,
}

/// Why a stream's task stopped writing.
enum Stop {
    /// The client went away, or the stream ended cleanly.
    Done,
    /// The client left the buffer full past `events.stream_stall_ms`.
    Stalled,
}

impl Sender {
    /// Hands one frame over, waiting for room in the buffer at most `stall`.
    async fn send(&self, bytes: Bytes) -> Result<(), Stop> {
        // A frame larger than the whole budget waits for an empty buffer.
        let wanted = u32::try_from(bytes.len())
            .unwrap_or(u32::MAX)
            .clamp(1, self.budget_bytes);
        let permit = tokio::select! {
            permit = tokio::time::timeout(
                self.stall,
                Arc::clone(&self.budget).acquire_many_owned(wanted),
            ) => match permit {
                Ok(Ok(permit)) => permit,
                Ok(Err(_)) => return Err(Stop::Done),
                Err(_) => return Err(Stop::Stalled),
            },
            () = self.frames.closed() => return Err(Stop::Done),
        };
        self.frames
            .send(Chunk::Data(bytes, permit))
            .map_err(|_| Stop::Done)
    }
}

/// The event id a stream starts after: `Last-Event-ID` (what a reconnecting `EventSource`
/// sends), else `?after=`, else `None`.
fn start_after(ctx: &Ctx<'_>) -> Result<Option<i64>, ApiError> {
    let given = match ctx.headers.get("last-event-id") {
        Some(value) => Some((
            "Last-Event-ID",
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("the Last-Event-ID header is not text"))?
                .trim()
                .to_owned(),
        )),
        None => ctx.query("after").map(|after| ("after", after)),
    };
    let Some((name, text)) = given else {
        return Ok(None);
    };
    match text.parse::<i64>() {
        Ok(after) if after >= 0 => Ok(Some(after)),
        _ => Err(ApiError::bad_request(format!(
            "{name} {text:?} is not an event id (a whole number from 0)"
        ))),
    }
}

/// One event as SSE: `id`, `event` (its kind) and one line of JSON data.
fn frame(event: &EventRow) -> Bytes {
    // The kind's fields first, so that no field can stand for the event's own.
    let mut body = event.data.as_object().cloned().unwrap_or_default();
    body.insert("id".into(), event.seq.into());
    body.insert("run_id".into(), event.workflow_id.as_str().into());
    body.insert("kind".into(), event.kind.clone().into());
    body.insert("at".into(), event.created_at.into());
    let data = serde_json::Value::Object(body).to_string();
    Bytes::from(format!(
        "id: {}\nevent: {}\ndata: {data}\n\n",
        event.seq, event.kind
    ))
}

/// Whether this is the last event a workflow writes.
fn is_final(event: &EventRow) -> bool {
    event.kind == "status"
        && event.data["status"]
            .as_str()
            .and_then(WorkflowStatus::parse)
            .is_some_and(WorkflowStatus::is_final)
}

/// Starts a stream: takes a place under `events.streams_max` (503 without one), and answers
/// with the body its task writes into.
fn open(
    ctx: &Ctx<'_>,
    follow: impl FnOnce(Sender, CancellationToken) -> tokio::task::JoinHandle<()>,
) -> Result<Reply, ApiError> {
    let streams = &ctx.state.streams;
    let users_place = streams.per_user.take(&ctx.principal()?.user.id)?;
    let place = Arc::clone(&streams.open).try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "streams_busy",
            format!(
                "this node serves `events.streams_max` ({}) event streams already",
                streams.config.streams_max
            ),
        )
    })?;
    let (frames, receiver) = mpsc::unbounded_channel();
    let budget_bytes = u32::try_from(streams.config.stream_buffer_bytes_max).unwrap_or(u32::MAX);
    let sender = Sender {
        frames,
        budget: Arc::new(Semaphore::new(budget_bytes as usize)),
        budget_bytes,
        stall: Duration::from_millis(streams.config.stream_stall_ms),
        close: Arc::clone(&ctx.close),
    };
    let task = follow(sender, streams.stop.clone());
    // The place is given back when the stream's task ends, however it ends.
    tokio::spawn(async move {
        let _ = task.await;
        drop((place, users_place));
    });
    let mut reply = Reply::new(ReplyBody::Right(EventBody { frames: receiver }));
    let headers = reply.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // nginx would otherwise hold the events back in its buffer.
    headers.insert(
        HeaderName::from_static("x-accel-buffering"),
        HeaderValue::from_static("no"),
    );
    Ok(reply)
}

/// Who a stream's caller is at a keep-alive.
enum Caller {
    Is(UserRow),
    /// The credential no longer names an enabled user: the stream ends.
    Gone,
    /// The store did not answer: the stream goes on and asks again at the next keep-alive.
    Unchecked,
}

/// What a stream's task needs, taken from the request (the task outlives it).
struct Follow {
    /// The caller's credential, asked again at every keep-alive: a stream ends once its caller
    /// is signed out, revoked or disabled, as the next request would be refused.
    credential: Credential,
    store: StoreHandle,
    wakes: Arc<EventWakes>,
    config: EventsConfig,
    metrics: Arc<actors::metrics::Metrics>,
}

impl Follow {
    fn of(ctx: &Ctx<'_>) -> Result<Self, ApiError> {
        let store = ctx.state.node.store();
        Ok(Follow {
            credential: ctx.principal()?.credential.clone(),
            wakes: Arc::clone(store.event_wakes()),
            store,
            config: ctx.state.streams.config.clone(),
            metrics: ctx.state.node.metrics(),
        })
    }

    /// The caller as the store knows them now.
    async fn caller(&self) -> Caller {
        match self.credential.user(&self.store).await {
            Ok(user) => Caller::Is(user),
            Err(error) if error.status == StatusCode::UNAUTHORIZED => {
                tracing::debug!("event stream's caller is signed out: ended");
                Caller::Gone
            }
            Err(error) => {
                tracing::debug!(message = %error.message, "event stream's caller not checked");
                Caller::Unchecked
            }
        }
    }

    /// Ends a stream that stopped writing: a stalled client is cut off.
    fn stopped(&self, sender: &Sender, why: Stop, stream: &str) {
        if let Stop::Stalled = why {
            tracing::debug!(stream, "event stream client stalled: disconnected");
            self.metrics
                .inc("reins_event_streams_disconnected_total", &[]);
            let _ = sender.frames.send(Chunk::Abort);
            sender.close.notify_one();
        }
    }
}

/// `GET /api/v1/workflows/{id}/events`.
pub async fn workflow_events(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let run_id = WorkflowId::new(super::workflows::path_id(ctx, "id")?);
    let row = super::workflows::owned_row(ctx, &run_id, super::workflows::Act::Read).await?;
    let after = start_after(ctx)?.unwrap_or(0);
    let follow = Follow::of(ctx)?;
    open(ctx, move |sender, stop| {
        tokio::spawn(async move {
            let owner = row.user_id;
            if let Err(why) = follow_workflow(&follow, &sender, &stop, &run_id, &owner, after).await
            {
                follow.stopped(&sender, why, run_id.as_str());
            }
        })
    })
}

async fn follow_workflow(
    follow: &Follow,
    sender: &Sender,
    stop: &CancellationToken,
    run_id: &WorkflowId,
    owner: &str,
    mut after: i64,
) -> Result<(), Stop> {
    let mut wake = follow.wakes.workflow(run_id);
    // Watched before the first read: whatever commits after it is announced to this node.
    watch(follow, run_id).await;
    let mut rewatch = every(WATCH_MS / 3);
    let mut poll = every(follow.config.poll_ms);
    let mut keepalive = every(follow.config.keepalive_ms);
    loop {
        // Read until caught up.
        loop {
            let page = match follow
                .store
                .read_events(run_id, after, follow.config.batch_max)
                .await
            {
                Ok(Some(page)) => page,
                // Deleted: nothing more will come.
                Ok(None) => return Ok(()),
                Err(error) => {
                    tracing::debug!(%error, %run_id, "event stream read failed; trying again");
                    break;
                }
            };
            let full = page.events.len() >= follow.config.batch_max as usize;
            for event in &page.events {
                sender.send(frame(event)).await?;
                after = event.seq;
                if is_final(event) {
                    return Ok(());
                }
            }
            if page.ended(after) {
                return Ok(());
            }
            if !full {
                break;
            }
        }
        // Until something may have committed: renewing the watch or keeping the connection
        // alive reads nothing.
        loop {
            tokio::select! {
                () = wake.changed() => break,
                _ = poll.tick() => break,
                _ = rewatch.tick() => watch(follow, run_id).await,
                _ = keepalive.tick() => {
                    match follow.caller().await {
                        Caller::Is(user) if user.id == owner || user.sees_every_workflow() => {}
                        Caller::Unchecked => {}
                        Caller::Is(_) | Caller::Gone => return Ok(()),
                    }
                    sender.send(Bytes::from_static(b": keep-alive\n\n")).await?;
                }
                () = stop.cancelled() => return Ok(()),
                () = sender.frames.closed() => return Ok(()),
            }
        }
    }
}

/// How long a stream's watch of its workflow's events lasts in the database
/// ([`store::Store::watch_events`]); the stream renews it every third of that while it runs, and
/// one that ends leaves it to lapse.
const WATCH_MS: u64 = 60_000;

/// Tells the database this stream watches `run_id`'s events. Should that fail, the fallback read
/// (`events.poll_ms`) still finds what other nodes commit.
async fn watch(follow: &Follow, run_id: &WorkflowId) {
    if let Err(error) = follow.store.watch_events(run_id, WATCH_MS).await {
        tracing::debug!(%error, %run_id, "watching a workflow's events failed");
    }
}

/// `GET /api/v1/events`: status changes of the workflows the caller may see (an admin's or an approver's: everyone's),
/// from `Last-Event-ID`/`?after=`, or from now.
pub async fn feed(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let principal = ctx.principal()?;
    let user_id = feed_of(&principal.user);
    let follow = Follow::of(ctx)?;
    let after = match start_after(ctx)? {
        Some(after) => after,
        None => follow.store.feed_head().await?,
    };
    open(ctx, move |sender, stop| {
        tokio::spawn(async move {
            if let Err(why) = follow_feed(&follow, &sender, &stop, user_id, after).await {
                follow.stopped(&sender, why, "feed");
            }
        })
    })
}

async fn follow_feed(
    follow: &Follow,
    sender: &Sender,
    stop: &CancellationToken,
    mut user_id: Option<String>,
    mut after: i64,
) -> Result<(), Stop> {
    let mut wake = follow.wakes.feed();
    let mut poll = every(follow.config.poll_ms);
    let mut keepalive = every(follow.config.keepalive_ms);
    loop {
        loop {
            let events = match follow
                .store
                .read_feed(after, user_id.as_deref(), follow.config.batch_max)
                .await
            {
                Ok(events) => events,
                Err(error) => {
                    tracing::debug!(%error, "event feed read failed; trying again");
                    break;
                }
            };
            for event in &events {
                sender.send(frame(event)).await?;
                after = event.seq;
            }
            if events.len() < follow.config.batch_max as usize {
                break;
            }
        }
        tokio::select! {
            _ = wake.changed() => {}
            _ = poll.tick() => {}
            _ = keepalive.tick() => {
                // A role taken away narrows the feed from now on.
                match follow.caller().await {
                    Caller::Is(user) => user_id = feed_of(&user),
                    Caller::Unchecked => {}
                    Caller::Gone => return Ok(()),
                }
                sender.send(Bytes::from_static(b": keep-alive\n\n")).await?;
            }
            () = stop.cancelled() => return Ok(()),
            () = sender.frames.closed() => return Ok(()),
        }
    }
}

/// Whose workflows a user's feed shows: `None` for everyone's.
fn feed_of(user: &UserRow) -> Option<String> {
    (!user.sees_every_workflow()).then(|| user.id.clone())
}

/// A timer whose first tick is one period from now.
fn every(period_ms: u64) -> tokio::time::Interval {
    let period = Duration::from_millis(period_ms);
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_sse_message_with_its_fields_flat() {
        let event = EventRow {
            workflow_id: "w1".into(),
            seq: 7,
            kind: "status".into(),
            data: serde_json::json!({"status": "completed", "previous": "running"}),
            created_at: 12.5,
        };
        let text = String::from_utf8(frame(&event).to_vec()).expect("utf-8");
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("id: 7"));
        assert_eq!(lines.next(), Some("event: status"));
        let data: serde_json::Value = serde_json::from_str(
            lines
                .next()
                .and_then(|line| line.strip_prefix("data: "))
                .expect("data line"),
        )
        .expect("json");
        assert_eq!(
            data,
            serde_json::json!({"id": 7, "run_id": "w1", "kind": "status", "at": 12.5,
                               "status": "completed", "previous": "running"})
        );
        assert!(text.ends_with("\n\n"));
        assert!(is_final(&event));
    }
}
