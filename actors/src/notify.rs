//! The notifier: delivers the notification outbox (migrations 36 and 42) to the configured
//! webhooks. What to send comes from rows the database wrote with the inbox events they tell
//! of, never from what a node means to do, so a notification exists exactly when its event
//! committed. Each webhook is delivered on its own: the actor claims, for one webhook at a time,
//! due deliveries (a claim is a lease on one webhook's delivery of a row, with an epoch), posts
//! each once, and settles it with the claim's epoch: finished once the webhook answered 2xx (or
//! its filters do not take it, or its attempts ran out), otherwise released with backoff and
//! jitter. So a webhook that never answers holds only its own `batch_max` places, and its
//! retries never post to another webhook again.
//!
//! A claim cannot lapse while its delivery runs: it lasts twice the request timeout, the POST
//! must end within the first (counted from before the claim was asked for) and the settlement's
//! answer is waited for within the second. A node that dies mid-delivery
//! leaves its claim to lapse, and the delivery is made again, by it after a restart or by
//! another node: at least once, with the same `id`.
//!
//! Nothing here touches a workflow: claims, posts and settlements run as tasks whose end comes
//! back as a message.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use bytes::Bytes;
use hmac::{Hmac, Mac};
use http_body_util::Full;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde_json::{Value, json};
use sha2::Sha256;
use store::{Notification, NotificationKind, Settlement};
use tokio::task::JoinSet;

use crate::mailbox::Post;
use crate::metrics::Metrics;
use crate::store_actor::StoreHandle;

/// How often the notifier deletes rows past their retention.
const PURGE_PERIOD: Duration = Duration::from_secs(60);

/// What a receiver is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotifyFormat {
    /// reins' own JSON body (documented in `docs/operating.md`).
    Reins,
    /// `{"text": ...}`: what Slack-compatible incoming webhooks accept.
    Slack,
}

/// One configured webhook (`[[notify]]`).
#[derive(Debug, Clone)]
pub struct NotifySink {
    /// Where to POST: an `http` or `https` URL. Also the webhook's key (`target`) in the
    /// outbox's deliveries.
    pub url: String,
    /// The HMAC-SHA256 key of `X-Reins-Signature`.
    pub secret: Vec<u8>,
    /// Only items of workflows whose owner has one of these roles (empty: any).
    pub roles: Vec<String>,
    /// Only items of workflows whose owner is one of these users, by email or id (empty: any).
    pub users: Vec<String>,
    pub format: NotifyFormat,
    /// The kinds it is sent (all of them by default).
    pub kinds: Vec<NotificationKind>,
}

impl NotifySink {
    /// Whether this sink is sent `notification`.
    fn takes(&self, notification: &Notification) -> bool {
        let owner_is = |names: &[String], value: &Option<String>| {
            value.as_ref().is_some_and(|value| names.contains(value))
        };
        self.kinds.contains(&notification.kind)
            && (self.roles.is_empty() || owner_is(&self.roles, &notification.user_role))
            && (self.users.is_empty()
                || owner_is(&self.users, &notification.user_email)
                || owner_is(&self.users, &notification.user_id))
    }
}

/// The notifier's sinks and bounds (`[notifications]` of the configuration).
#[derive(Debug, Clone)]
pub struct NotifyOptions {
    pub sinks: Vec<NotifySink>,
    /// The console's address as people reach it, without a trailing slash: links are
    /// `{public_url}/#/workflows/{id}`.
    pub public_url: String,
    /// How long one POST may take, answer included.
    pub request_timeout: Duration,
    /// Attempts per notification and webhook before that webhook's delivery is given up
    /// (counted, logged).
    pub attempts_max: u32,
    /// The wait after the first failed attempt; each next one waits twice as long, up to
    /// `backoff_max`, and each wait is jittered down by up to a half.
    pub backoff_first: Duration,
    pub backoff_max: Duration,
    /// The largest body sent: longer texts (message, comment, title) are cut to fit.
    pub body_bytes_max: usize,
    /// How long an undelivered notification is kept, whatever its attempts.
    pub retention: Duration,
    /// How often the outbox is looked at.
    pub poll: Duration,
    /// Notifications delivered at once to each webhook at most.
    pub batch_max: u32,
}

impl NotifyOptions {
    /// How long a claim lasts: its POST ends within the request timeout of the moment the claim
    /// was asked for (before the database's clock started it), and its settlement is waited for
    /// one request timeout more. So a receiver, however slow, cannot make it lapse.
    fn claim(&self) -> Duration {
        self.request_timeout.saturating_mul(2)
    }

    /// The wait before attempt `attempts + 1`, jittered by `random` (any value; its low bits
    /// pick a point in the upper half of the wait).
    fn backoff(&self, attempts: u32, random: u64) -> Duration {
        let full = self
            .backoff_first
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(20))
            .min(self.backoff_max);
        let half = full / 2;
        let millis = u64::try_from(half.as_millis()).unwrap_or(u64::MAX);
        half + Duration::from_millis(random % millis.saturating_add(1))
    }
}

/// Messages of the notifier. A webhook is named by its index in [`NotifyOptions::sinks`].
pub enum NotifyMsg {
    /// Time to look at the outbox (`poll`) for every webhook.
    Tick,
    /// A claim's answer for one webhook; `asked_at` is when it was asked for, which its
    /// deliveries' deadlines count from.
    Claimed {
        sink: usize,
        asked: u32,
        asked_at: Instant,
        claimed: store::Result<Vec<Notification>>,
    },
    /// One delivery to a webhook and its settlement ended.
    Delivered { sink: usize },
    /// Time to purge rows past their retention.
    Purge,
    /// The purge ended.
    Purged,
}

pub(crate) struct Notifier;

pub(crate) struct NotifierArgs {
    pub store: StoreHandle,
    pub metrics: Arc<Metrics>,
    pub worker_id: String,
    pub options: NotifyOptions,
}

/// What every delivery task shares.
struct Shared {
    store: StoreHandle,
    metrics: Arc<Metrics>,
    worker_id: String,
    options: NotifyOptions,
    /// Every webhook's URL: a row goes once each has settled its delivery.
    targets: Vec<String>,
    /// By webhook: whether the store has it recorded as configured (see
    /// [`store::Store::register_notify_target`]); it claims nothing until then, so it never
    /// takes what was recorded before it was configured.
    registered: Vec<AtomicBool>,
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

/// One webhook's deliveries on this node.
#[derive(Debug, Default)]
struct SinkState {
    /// Deliveries running (each holds one of `batch_max` places).
    in_flight: u32,
    claiming: bool,
}

pub(crate) struct NotifierState {
    shared: Arc<Shared>,
    /// By webhook, in the order of [`NotifyOptions::sinks`].
    sinks: Vec<SinkState>,
    purging: bool,
    /// The tasks of deliveries, claims and purges, aborted with the actor.
    tasks: JoinSet<()>,
    _ticks: tokio::task::JoinHandle<()>,
    _purges: tokio::task::JoinHandle<()>,
}

impl Drop for NotifierState {
    fn drop(&mut self) {
        self._ticks.abort();
        self._purges.abort();
    }
}

impl Actor for Notifier {
    type Msg = NotifyMsg;
    type State = NotifierState;
    type Arguments = NotifierArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<NotifyMsg>,
        args: NotifierArgs,
    ) -> Result<NotifierState, ActorProcessingErr> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_webpki_roots()
            .https_or_http()
            .enable_http1()
            .build();
        let poll = args.options.poll;
        let _ = myself.post(NotifyMsg::Tick);
        let _ = myself.post(NotifyMsg::Purge);
        let targets = args
            .options
            .sinks
            .iter()
            .map(|sink| sink.url.clone())
            .collect();
        let sinks = args
            .options
            .sinks
            .iter()
            .map(|_| SinkState::default())
            .collect();
        Ok(NotifierState {
            shared: Arc::new(Shared {
                store: args.store,
                metrics: args.metrics,
                worker_id: args.worker_id,
                registered: args
                    .options
                    .sinks
                    .iter()
                    .map(|_| AtomicBool::new(false))
                    .collect(),
                options: args.options,
                targets,
                client: Client::builder(TokioExecutor::new()).build(connector),
            }),
            sinks,
            purging: false,
            tasks: JoinSet::new(),
            _ticks: crate::mailbox::post_every(&myself, poll, || NotifyMsg::Tick),
            _purges: crate::mailbox::post_every(&myself, PURGE_PERIOD, || NotifyMsg::Purge),
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<NotifyMsg>,
        _state: &mut NotifierState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<NotifyMsg>,
        message: NotifyMsg,
        state: &mut NotifierState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        while state.tasks.try_join_next().is_some() {}
        match message {
            NotifyMsg::Tick => {
                for sink in 0..state.sinks.len() {
                    claim(&myself, state, sink);
                }
            }
            NotifyMsg::Claimed {
                sink,
                asked,
                asked_at,
                claimed,
            } => {
                state.sinks[sink].claiming = false;
                match claimed {
                    Ok(claimed) => {
                        let full = u32::try_from(claimed.len()).unwrap_or(u32::MAX) >= asked;
                        // A claim takes at most one notification per workflow, so each goes
                        // side by side with the others; the deadline counts from before the
                        // claim began, which keeps the POST within the claim.
                        let deadline = asked_at + state.shared.options.request_timeout;
                        for notification in claimed {
                            state.sinks[sink].in_flight += 1;
                            let shared = Arc::clone(&state.shared);
                            let myself = myself.clone();
                            state.tasks.spawn(async move {
                                deliver(&shared, sink, notification, deadline).await;
                                let _ = myself.post(NotifyMsg::Delivered { sink });
                            });
                        }
                        if full {
                            claim(&myself, state, sink);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, url = %state.shared.options.sinks[sink].url,
                            "cannot claim notifications; trying again at the next poll");
                    }
                }
            }
            NotifyMsg::Delivered { sink } => {
                state.sinks[sink].in_flight = state.sinks[sink].in_flight.saturating_sub(1);
                // The next notification of the workflow just delivered may be due now.
                claim(&myself, state, sink);
            }
            NotifyMsg::Purge if !state.purging => {
                state.purging = true;
                let shared = Arc::clone(&state.shared);
                let myself = myself.clone();
                state.tasks.spawn(async move {
                    let retention_ms =
                        u64::try_from(shared.options.retention.as_millis()).unwrap_or(u64::MAX);
                    match shared.store.purge_notifications(retention_ms).await {
                        Ok(0) => {}
                        Ok(purged) => {
                            shared
                                .metrics
                                .add("reins_notifications_expired_total", &[], purged);
                            tracing::warn!(
                                purged,
                                "notifications past their retention were deleted undelivered"
                            );
                        }
                        Err(error) => tracing::warn!(%error, "cannot purge notifications"),
                    }
                    let _ = myself.post(NotifyMsg::Purged);
                });
            }
            NotifyMsg::Purge => {}
            NotifyMsg::Purged => state.purging = false,
        }
        Ok(())
    }
}

/// Starts a claim for the webhook `sink`'s places left, unless one runs or none is left.
fn claim(myself: &ActorRef<NotifyMsg>, state: &mut NotifierState, sink: usize) {
    let asked = state
        .shared
        .options
        .batch_max
        .saturating_sub(state.sinks[sink].in_flight);
    if state.sinks[sink].claiming || asked == 0 {
        return;
    }
    state.sinks[sink].claiming = true;
    let shared = Arc::clone(&state.shared);
    let myself = myself.clone();
    state.tasks.spawn(async move {
        let claim_ms = u64::try_from(shared.options.claim().as_millis()).unwrap_or(u64::MAX);
        let asked_at = Instant::now();
        let url = &shared.options.sinks[sink].url;
        let claimed = match register(&shared, sink).await {
            Ok(()) => {
                shared
                    .store
                    .claim_notifications(&shared.worker_id, url, claim_ms, asked)
                    .await
            }
            Err(error) => Err(error),
        };
        let _ = myself.post(NotifyMsg::Claimed {
            sink,
            asked,
            asked_at,
            claimed,
        });
    });
}

/// Records the webhook `sink` as configured before its first claim (once per start; the first
/// node that names it sets the moment it is delivered from).
async fn register(shared: &Shared, sink: usize) -> store::Result<()> {
    if shared.registered[sink].load(Ordering::Acquire) {
        return Ok(());
    }
    let url = &shared.options.sinks[sink].url;
    if shared.store.register_notify_target(url).await? {
        tracing::info!(%url, "a webhook is configured for the first time: it is sent what is \
            recorded from now on, nothing from before");
    }
    shared.registered[sink].store(true, Ordering::Release);
    Ok(())
}

/// Posts `notification` to the webhook `sink` if its filters take it, by `deadline`, then
/// settles that delivery.
#[tracing::instrument(skip_all, fields(notification = %notification.id, url = %shared.options.sinks[sink].url, attempt = notification.attempts + 1))]
async fn deliver(shared: &Shared, sink: usize, notification: Notification, deadline: Instant) {
    let options = &shared.options;
    let webhook = &options.sinks[sink];
    let kind = notification.kind.as_str();
    let settlement = if !webhook.takes(&notification) {
        Settlement::Finished
    } else {
        let body = body(&notification, &options.public_url, options.body_bytes_max);
        match post(shared, webhook, &notification.id, &body, deadline).await {
            Ok(()) => {
                shared
                    .metrics
                    .inc("reins_notifications_delivered_total", &[("kind", kind)]);
                Settlement::Finished
            }
            Err(reason) => {
                shared.metrics.inc(
                    "reins_notification_attempts_failed_total",
                    &[("kind", kind)],
                );
                tracing::warn!(%reason, "a webhook did not take a notification");
                let attempts = notification.attempts + 1;
                if attempts >= options.attempts_max {
                    shared
                        .metrics
                        .inc("reins_notifications_abandoned_total", &[("kind", kind)]);
                    tracing::warn!(
                        attempts,
                        "a notification is given up for a webhook after its last attempt"
                    );
                    Settlement::Finished
                } else {
                    let wait = options.backoff(attempts, uuid::Uuid::new_v4().as_u64_pair().0);
                    Settlement::Retry {
                        after_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                    }
                }
            }
        }
    };
    // Past the second half of the claim the answer no longer matters: the delivery is made
    // again either way once the claim lapses (the settlement may still commit, and then it
    // is not).
    let settled = tokio::time::timeout(
        options.request_timeout,
        shared.store.settle_notification(
            &notification.id,
            &webhook.url,
            notification.claim_epoch,
            settlement,
            &shared.targets,
        ),
    )
    .await;
    match settled {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => tracing::info!(
            "a notification's claim lapsed before it was settled: another claim delivers it again"
        ),
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot settle a notification: it is delivered again once its claim lapses")
        }
        Err(_) => tracing::warn!(
            "a notification's settlement was not answered within its claim: unless it committed, \
             it is delivered again once its claim lapses"
        ),
    }
}

/// One POST of `body` (in the sink's format) to a sink, signed, answered by `deadline` (the
/// request timeout from before its claim was asked for).
async fn post(
    shared: &Shared,
    sink: &NotifySink,
    id: &str,
    body: &Value,
    deadline: Instant,
) -> Result<(), String> {
    let payload = match sink.format {
        NotifyFormat::Reins => body.to_string(),
        NotifyFormat::Slack => json!({"text": slack_text(body)}).to_string(),
    };
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
        .to_string();
    let request = Request::builder()
        .method(Method::POST)
        .uri(&sink.url)
        .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
        .header("x-reins-id", id)
        .header("x-reins-timestamp", &timestamp)
        .header(
            "x-reins-signature",
            signature(&sink.secret, &timestamp, payload.as_bytes()),
        )
        .body(Full::new(Bytes::from(payload)))
        .map_err(|e| format!("cannot build the request: {e}"))?;
    let answer = tokio::time::timeout_at(deadline, shared.client.request(request))
        .await
        .map_err(|_| {
            format!(
                "no answer within {} ms",
                shared.options.request_timeout.as_millis()
            )
        })?
        .map_err(|e| e.to_string())?;
    if answer.status().is_success() {
        Ok(())
    } else {
        Err(format!("answered {}", answer.status()))
    }
}

/// `sha256=<hex HMAC-SHA256 of "{timestamp}.{body}">`.
fn signature(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256={hex}")
}

/// What an item waits for, by the event that told of it.
fn waits_for(event: &str) -> &'static str {
    match event {
        "approval_requested" | "approval_answered" => "approval",
        "pause_waiting" | "pause_resumed" => "pause",
        _ => "checkpoint",
    }
}

/// The body of the `reins` format, its texts cut to keep it within `bytes_max`.
fn body(notification: &Notification, public_url: &str, bytes_max: usize) -> Value {
    let data = &notification.data;
    let mut body = json!({
        "id": notification.id,
        "kind": notification.kind.as_str(),
        "workflow_id": notification.workflow_id,
        "step_id": data.step_id,
        "attempt": data.attempt,
        "waits_for": waits_for(&notification.event),
        "link": format!("{public_url}/#/workflows/{}", notification.workflow_id),
        "at": store::rfc3339_utc_millis(notification.created_at),
    });
    for (key, text) in [
        ("title", &data.title),
        ("message", &data.message),
        ("child_run_id", &data.child_run_id),
        ("request_id", &data.request_id),
        ("decision", &data.decision),
        ("comment", &data.comment),
    ] {
        if let Some(text) = text {
            body[key] = json!(text);
        }
    }
    if let Some(version) = data.artifact_version {
        body["artifact_version"] = json!(version);
    }
    if notification.kind != NotificationKind::Entered
        && let Some(by) = &data.by
    {
        body["by"] = json!(by);
    }
    if notification.kind == NotificationKind::TimedOut {
        // A deadline decided it, whatever the event recorded as its author (a checkpoint's
        // deadline writes its control with no person).
        body["by"] = json!(BY_TIMEOUT);
    }
    if notification.event == "pause_resumed" {
        // What the pause resolves with: the person's input, or the deadline's `onTimeout`
        // resume; absent when the deadline failed the pause.
        if let Some(input) = &data.input {
            body["input"] = input.clone();
        }
    }
    cut_to_fit(body, bytes_max)
}

/// Who a deadline's decision is by.
const BY_TIMEOUT: &str = "timeout";

/// Cuts the free texts of `body` (message, comment, title) until it serializes within
/// `bytes_max`, marking it `"truncated": true`. The rest (ids, link, time) is bounded by the
/// id grammar and kept whole.
fn cut_to_fit(mut body: Value, bytes_max: usize) -> Value {
    let size = |body: &Value| body.to_string().len();
    if size(&body) <= bytes_max {
        return body;
    }
    body["truncated"] = json!(true);
    // A pause's input is data, not text: it is not cut but left out whole (it is in the
    // workflow's record), before any text is cut.
    if let Some(fields) = body.as_object_mut()
        && fields.remove("input").is_some()
    {
        body["input_omitted"] = json!(true);
        if size(&body) <= bytes_max {
            return body;
        }
    }
    for key in ["message", "comment", "title"] {
        let over = size(&body).saturating_sub(bytes_max);
        if over == 0 {
            break;
        }
        let Some(text) = body[key].as_str() else {
            continue;
        };
        // Escapes make the JSON longer than the text: cut by what the JSON is over.
        let mut keep = text.len().saturating_sub(over + '…'.len_utf8());
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        body[key] = json!(format!("{}…", &text[..keep]));
    }
    body
}

/// What a deadline decided, as a timed-out notification's Slack text says it.
fn decided_by_deadline(body: &Value) -> String {
    match (body["decision"].as_str(), body.get("input")) {
        (Some(decision), _) => format!("its deadline decided {decision}"),
        (None, Some(input)) => format!("its deadline resumed it with {input}"),
        (None, None) if body["input_omitted"] == json!(true) => {
            "its deadline resumed it (the input is in the workflow)".to_owned()
        }
        (None, None) if body["waits_for"] == "pause" => {
            "its deadline failed the pause (no onTimeout resume)".to_owned()
        }
        (None, None) => "its deadline decided it".to_owned(),
    }
}

/// One line for a Slack-compatible receiver.
fn slack_text(body: &Value) -> String {
    let workflow = match body["title"].as_str() {
        Some(title) => format!("{title} ({})", body["workflow_id"].as_str().unwrap_or("")),
        None => body["workflow_id"].as_str().unwrap_or("").to_owned(),
    };
    let step = body["step_id"].as_str().unwrap_or("");
    let what = body["waits_for"].as_str().unwrap_or("");
    let by = body["by"].as_str().unwrap_or("someone");
    let mut text = match body["kind"].as_str() {
        Some("entered") => format!("{workflow}: step `{step}` waits for a person ({what})"),
        Some("timed_out") => format!(
            "{workflow}: step `{step}` ({what}) timed out: {}",
            decided_by_deadline(body)
        ),
        Some("overdue") => format!("{workflow}: step `{step}` ({what}) is overdue"),
        _ => format!(
            "{workflow}: step `{step}` ({what}) was answered by {by}{}",
            match (body["decision"].as_str(), body.get("input")) {
                (Some(decision), _) => format!(": {decision}"),
                (None, Some(input)) => format!(": resumed with {input}"),
                (None, None) => String::new(),
            }
        ),
    };
    for key in ["message", "comment"] {
        if let Some(value) = body[key].as_str() {
            text.push_str(&format!("\n> {value}"));
        }
    }
    text.push_str(&format!(
        "\n<{}|Open in reins>",
        body["link"].as_str().unwrap_or("")
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notification(kind: NotificationKind, event: &str, data: Value) -> Notification {
        Notification {
            id: "wf-1:3".into(),
            workflow_id: "wf-1".into(),
            seq: 3,
            kind,
            event: event.into(),
            data: store::NotificationData::decode(&data),
            user_id: Some("u1".into()),
            user_email: Some("ada@example.com".into()),
            user_role: Some("approver".into()),
            created_at: 1_700_000_000.25,
            attempts: 0,
            claim_epoch: 1,
        }
    }

    fn sink() -> NotifySink {
        NotifySink {
            url: "http://127.0.0.1:9/hook".into(),
            secret: b"s".to_vec(),
            roles: Vec::new(),
            users: Vec::new(),
            format: NotifyFormat::Reins,
            kinds: NotificationKind::ALL.to_vec(),
        }
    }

    fn options() -> NotifyOptions {
        NotifyOptions {
            sinks: vec![sink()],
            public_url: "https://reins.example".into(),
            request_timeout: Duration::from_secs(10),
            attempts_max: 10,
            backoff_first: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            body_bytes_max: 4096,
            retention: Duration::from_secs(86_400),
            poll: Duration::from_secs(1),
            batch_max: 8,
        }
    }

    #[test]
    fn a_pause_entering_the_inbox_says_what_it_waits_for_and_links_the_console() {
        let data = json!({"step_id": "p", "attempt": 1, "step_kind": "pause",
                          "message": "check it", "title": "Report"});
        let body = body(
            &notification(NotificationKind::Entered, "pause_waiting", data),
            "https://reins.example",
            4096,
        );
        assert_eq!(
            body,
            json!({
                "id": "wf-1:3", "kind": "entered", "workflow_id": "wf-1", "title": "Report",
                "step_id": "p", "attempt": 1, "waits_for": "pause", "message": "check it",
                "link": "https://reins.example/#/workflows/wf-1",
                "at": "2023-11-14T22:13:20.250Z",
            })
        );
    }

    #[test]
    fn a_decision_says_who_decided_and_their_comment() {
        let data = json!({"step_id": "h", "attempt": 1, "decision": "reject",
                          "artifact_version": 2, "comment": "not yet", "by": "ada"});
        let body = body(
            &notification(NotificationKind::Decided, "checkpoint_decided", data),
            "http://x",
            4096,
        );
        assert_eq!(body["waits_for"], "checkpoint");
        assert_eq!(
            (&body["decision"], &body["by"], &body["comment"]),
            (&json!("reject"), &json!("ada"), &json!("not yet"))
        );
        assert_eq!(body["artifact_version"], 2);
        assert!(slack_text(&body).contains("answered by ada: reject\n> not yet"));
    }

    /// Issue 40: a checkpoint's deadline records its control without a person, yet its
    /// `timed_out` body says `by: "timeout"` as an approval's does, and its Slack text what
    /// was decided.
    #[test]
    fn a_timed_out_checkpoint_says_by_timeout_and_what_its_deadline_decided() {
        let data = json!({"step_id": "h", "attempt": 1, "decision": "reject",
                          "artifact_version": 2, "by": null});
        let body = body(
            &notification(NotificationKind::TimedOut, "checkpoint_decided", data),
            "http://x",
            4096,
        );
        assert_eq!(
            (&body["by"], &body["decision"]),
            (&json!("timeout"), &json!("reject"))
        );
        assert!(
            slack_text(&body).contains("(checkpoint) timed out: its deadline decided reject"),
            "{}",
            slack_text(&body)
        );
    }

    /// Issue 40: a pause's `decided` body carries what it was resumed with; a deadline's
    /// resume says it in Slack, and one without `onTimeout` says the pause failed.
    #[test]
    fn a_resumed_pause_carries_its_input() {
        let resumed = json!({"step_id": "p", "attempt": 1, "by": "ada",
                             "input": {"go": true}});
        let decided = body(
            &notification(NotificationKind::Decided, "pause_resumed", resumed),
            "http://x",
            4096,
        );
        assert_eq!(decided["input"], json!({"go": true}));
        assert!(slack_text(&decided).contains("answered by ada: resumed with {\"go\":true}"));
        let late = json!({"step_id": "p", "attempt": 1, "input": "nobody came"});
        let timed_out = body(
            &notification(NotificationKind::TimedOut, "pause_resumed", late),
            "http://x",
            4096,
        );
        assert_eq!(
            (&timed_out["by"], &timed_out["input"]),
            (&json!("timeout"), &json!("nobody came"))
        );
        assert!(
            slack_text(&timed_out)
                .contains("timed out: its deadline resumed it with \"nobody came\"")
        );
        let failed = body(
            &notification(
                NotificationKind::TimedOut,
                "pause_resumed",
                json!({"step_id": "p"}),
            ),
            "http://x",
            4096,
        );
        assert!(failed.get("input").is_none(), "{failed}");
        assert!(slack_text(&failed).contains("its deadline failed the pause"));
        let big = json!({"step_id": "p", "attempt": 1, "by": "ada", "input": "x".repeat(5000)});
        let cut = body(
            &notification(NotificationKind::Decided, "pause_resumed", big),
            "http://x",
            1024,
        );
        assert!(
            cut.get("input").is_none() && cut["input_omitted"] == true,
            "{cut}"
        );
    }

    #[test]
    fn a_body_over_its_bound_has_its_texts_cut_to_fit() {
        let long = "é".repeat(3000);
        let data = json!({"step_id": "p", "attempt": 1, "message": long, "title": "t"});
        let notification = notification(NotificationKind::Entered, "pause_waiting", data);
        let body = body(&notification, "http://x", 1024);
        assert!(body.to_string().len() <= 1024, "{}", body.to_string().len());
        assert_eq!(body["truncated"], true);
        assert!(body["message"].as_str().is_some_and(|m| m.ends_with('…')));
        let whole = super::body(&notification, "http://x", 1 << 20);
        assert!(whole.get("truncated").is_none());
    }

    #[test]
    fn filters_take_only_their_roles_users_and_kinds() {
        let entered = notification(NotificationKind::Entered, "pause_waiting", json!({}));
        assert!(sink().takes(&entered));
        let roles = NotifySink {
            roles: vec!["admin".into()],
            ..sink()
        };
        assert!(!roles.takes(&entered));
        let users = NotifySink {
            users: vec!["ada@example.com".into()],
            ..sink()
        };
        assert!(users.takes(&entered));
        let by_id = NotifySink {
            users: vec!["u1".into()],
            ..sink()
        };
        assert!(by_id.takes(&entered));
        let decided_only = NotifySink {
            kinds: vec![NotificationKind::Decided],
            ..sink()
        };
        assert!(!decided_only.takes(&entered));
    }

    #[test]
    fn the_signature_is_the_hmac_of_the_timestamp_and_the_body() {
        // Python: hmac.new(b"Jefe", b'1700000000.{"id":"wf:1"}', hashlib.sha256).hexdigest()
        assert_eq!(
            signature(b"Jefe", "1700000000", br#"{"id":"wf:1"}"#),
            "sha256=3fc607ba6934b5dfff0204fbae48f1b4b633118fac6bcedd2c60c6eeaef680d1"
        );
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_jitters_within_the_upper_half() {
        let options = options();
        assert_eq!(options.backoff(1, 0), Duration::from_millis(500));
        assert_eq!(options.backoff(1, 500), Duration::from_millis(1000));
        assert_eq!(options.backoff(3, 0), Duration::from_secs(2));
        assert_eq!(options.backoff(30, 0), Duration::from_secs(30));
        assert!(options.backoff(30, u64::MAX) <= Duration::from_secs(60));
    }

    #[test]
    fn a_claim_lasts_a_post_and_a_settlement() {
        assert_eq!(options().claim(), Duration::from_secs(20));
        let longest = NotifyOptions {
            request_timeout: Duration::MAX,
            ..options()
        };
        assert_eq!(longest.claim(), Duration::MAX, "saturates, never wraps");
    }
}
