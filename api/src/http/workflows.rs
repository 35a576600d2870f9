//! The workflow operations, the same for both surfaces: REST takes the workflow id from the path,
//! the compatible action endpoint from `run_id` in the body. A user sees and controls only their
//! own workflows (another user's is 404, as if it did not exist); an admin sees and controls
//! all; an approver sees all and may resume, decide and answer on any, but cancels, recovers,
//! retries, deletes and sends events to only their own (403 `owner_only` for another's, which
//! they can see anyway).

use std::time::Duration;

use actors::{
    Decide, LaunchRequest, ReconcileRequest, Resolution, Resume, RetryRequest, SendEvent,
    WorkflowView,
};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use hyper::header::{
    ACCEPT_RANGES, CONTENT_DISPOSITION, CONTENT_RANGE, CONTENT_TYPE, ETAG, HeaderValue, RANGE,
};
use hyper::{Response, StatusCode};
use store::{ControlWrite, WorkflowId, WorkflowRow, WorkflowStatus};

use super::downloads::{disposition, served};
use super::error::ApiError;
use super::record;
use super::routes::{self, Surface};
use super::wire::*;
use super::{Ctx, Reply, json_reply, wait};

/// A `get_artifact` chunk's bytes at most.
pub const CHUNK_BYTES_MAX: u64 = 1024 * 1024;
/// Workflows per page unless the caller asks for another number.
const PAGE_SIZE_DEFAULT: u32 = 50;

/// Ids follow the runtime's one grammar, which a script's step ids follow too.
fn check_id(what: &str, id: &str) -> Result<(), ApiError> {
    if runtime::is_id(id) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{what} {id:?} is not an id ({})",
            runtime::ID_GRAMMAR
        )))
    }
}

/// A launch's title: a line of 1 to `max` characters (`limits.title_chars_max`; see
/// [`super::rules::check_line`]). Refused with 400 naming the field; nothing is launched.
fn check_title(title: &str, max: u64) -> Result<(), ApiError> {
    super::rules::check_line(title, max).map_err(|why| {
        ApiError::bad_request(format!(
            "title is refused: {why} (limits.title_chars_max is {max})"
        ))
    })
}

/// A checked id from the path.
pub fn path_id(ctx: &Ctx<'_>, name: &str) -> Result<String, ApiError> {
    let id = ctx
        .param(name)
        .ok_or_else(|| ApiError::bad_request(format!("the path has no {name}")))?;
    check_id(name, id)?;
    Ok(id.to_owned())
}

/// The workflow a request is about: the path's id (REST), or the compatible body's `run_id`,
/// which `compat::lift` made a path parameter.
fn run_id(ctx: &Ctx<'_>) -> Result<WorkflowId, ApiError> {
    path_id(ctx, "id").map(WorkflowId::new)
}

/// What a caller wants to do with a workflow, which decides who may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Act {
    /// Read it: get, list, its artifacts.
    Read,
    /// Resume a pause, decide a checkpoint, answer an agent: an approver may on anyone's.
    Answer,
    /// Cancel, recover, reconcile, retry, delete, send an event: its owner or an admin only.
    /// (An event is the workflow's input from its owner's integrations, each `event_id` theirs
    /// to choose: a person who only answers for the workflow may not take an id first.)
    Control,
}

/// The workflow's row, if the caller may `act` on it.
pub(super) async fn owned_row(
    ctx: &Ctx<'_>,
    run_id: &WorkflowId,
    act: Act,
) -> Result<WorkflowRow, ApiError> {
    let row = ctx.state.node.store().read_workflow(run_id).await?;
    visible(ctx, row, run_id, act)
}

fn visible<T: Owned>(
    ctx: &Ctx<'_>,
    found: Option<T>,
    run_id: &WorkflowId,
    act: Act,
) -> Result<T, ApiError> {
    visible_to(&ctx.principal()?.user, found, run_id, act)
}

/// [`visible`] for `user` as the store has them now.
fn visible_to<T: Owned>(
    user: &store::UserRow,
    found: Option<T>,
    run_id: &WorkflowId,
    act: Act,
) -> Result<T, ApiError> {
    let Some(found) = found else {
        return Err(ApiError::no_workflow(run_id));
    };
    if user.is_admin() || found.user_id() == user.id {
        return Ok(found);
    }
    match (user.sees_every_workflow(), act) {
        (true, Act::Read | Act::Answer) => Ok(found),
        (true, Act::Control) => Err(ApiError::forbidden(
            "owner_only",
            format!(
                "workflow {run_id:?} is another user's: only its owner or an admin may cancel, \
                 recover, reconcile, retry or delete it, or send it events"
            ),
        )),
        (false, _) => Err(ApiError::no_workflow(run_id)),
    }
}

trait Owned {
    fn user_id(&self) -> &str;
}

impl Owned for WorkflowRow {
    fn user_id(&self) -> &str {
        &self.user_id
    }
}

impl Owned for WorkflowView {
    fn user_id(&self) -> &str {
        &self.row.user_id
    }
}

fn refuse_while_draining(ctx: &Ctx<'_>) -> Result<(), ApiError> {
    if ctx.state.draining() {
        Err(ApiError::draining())
    } else {
        Ok(())
    }
}

fn by(ctx: &Ctx<'_>) -> Result<String, ApiError> {
    Ok(ctx.principal()?.user.email.clone())
}

pub fn plugins() -> PluginsReply {
    PluginsReply {
        plugins: vec![PluginReply {
            id: routes::PLUGIN_ID.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            actions: routes::ROUTES
                .iter()
                .filter(|r| r.surface == Surface::Compat)
                .filter_map(|r| r.path.rsplit('/').next())
                .map(str::to_owned)
                .collect(),
        }],
    }
}

/// How long a request asks to wait: `?wait=DURATION` on REST, `wait_ms` in the compatible
/// action's body, at most `http.wait_max_ms`. `None`: answer at once.
fn asked_wait(ctx: &Ctx<'_>) -> Result<Option<Duration>, ApiError> {
    let asked = match (ctx.route.surface, ctx.query("wait"), ctx.param("wait_ms")) {
        (Surface::Rest, Some(text), _) => wait::parse_duration(&text)?,
        (Surface::Compat, _, Some(ms)) => {
            // Checked as the body was read (`compat::lift`).
            Duration::from_millis(ms.parse().map_err(|_| {
                ApiError::bad_request(format!("body field `wait_ms`: {ms:?} is not a number"))
            })?)
        }
        _ => return Ok(None),
    };
    Ok(Some(
        asked.min(Duration::from_millis(ctx.state.http.wait_max_ms)),
    ))
}

/// How many steps and artifact versions a page of a record holds at most.
pub(super) fn page_max(ctx: &Ctx<'_>) -> record::PageMax {
    record::PageMax {
        steps: ctx.state.http.record_steps_page_max,
        artifacts: ctx.state.http.record_artifacts_page_max,
    }
}

/// A workflow's record (its first page of steps and of artifact versions: see
/// [`record::PageMax::read`]), read in one of the caller's places (see [`super::reads`]).
pub(super) async fn read_record(
    ctx: &Ctx<'_>,
    run_id: &WorkflowId,
) -> Result<Result<Option<actors::WorkflowView>, actors::Error>, ApiError> {
    let user_id = &ctx.principal()?.user.id;
    let (steps_max, artifacts_max) = page_max(ctx).read();
    let workflows = ctx.state.node.workflows();
    ctx.state
        .record_reads
        .read(user_id, workflows.get(run_id, steps_max, artifacts_max))
        .await
}

/// Reads the record until the workflow ends or waits for a person, or `wait` has passed (then
/// the record as it is). Between reads the request is parked on the change bus: no query runs
/// while nothing happens to the workflow.
async fn wait_for(
    ctx: &Ctx<'_>,
    run_id: &WorkflowId,
    wait: Duration,
    _permit: wait::Permit,
) -> Result<WorkflowRecord, ApiError> {
    let deadline = tokio::time::Instant::now() + wait;
    // Watched before the first read, so a change committed after it is heard.
    let mut watch = ctx.state.waiters.watch(run_id);
    let (mut over, mut waited) = (false, false);
    loop {
        // Every read a waiter makes is counted: a parked waiter makes none (the quiet-period
        // test reads this counter).
        ctx.state
            .node
            .metrics()
            .inc("reins_http_wait_reads_total", &[]);
        let view = read_record(ctx, run_id).await??;
        let view = visible(ctx, view, run_id, Act::Read)?;
        if over || wait::settled(&view) {
            let record = record::record(&view, page_max(ctx));
            if waited {
                // The caller's access may have changed while the request waited (a role taken
                // away, a token revoked, a session ended): it is asked again before anything is
                // answered.
                let store = ctx.state.node.store();
                let user = ctx.principal()?.credential.user(&store).await?;
                visible_to(&user, Some(view), run_id, Act::Read)?;
            }
            return Ok(record);
        }
        over = !watch.changed(deadline).await;
        waited = true;
    }
}

pub async fn launch(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    refuse_while_draining(ctx)?;
    let body: LaunchBody = ctx.json()?;
    if let Some(title) = &body.title {
        check_title(title, ctx.state.title_chars_max)?;
    }
    let wait = asked_wait(ctx)?;
    // A waiter's place is taken before anything is launched: a refusal launches nothing.
    let user_id = &ctx.principal()?.user.id;
    let permit = wait.map(|_| ctx.state.waiters.admit(user_id)).transpose()?;
    let launched = ctx
        .state
        .node
        .workflows()
        .launch(LaunchRequest {
            user_id: ctx.principal()?.user.id.clone(),
            request_id: body.request_id.map(Id::into_string),
            title: body.title,
            timeout_seconds: body.timeout_seconds,
            script: body.script,
            args: body.args,
        })
        .await?;
    let status = match ctx.route.surface {
        Surface::Rest if launched.created => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    let row = launched.row;
    if let (Some(wait), Some(permit)) = (wait, permit) {
        let record = wait_for(ctx, &row.workflow_id, wait, permit).await?;
        return Ok(json_reply(
            status,
            LaunchAnswer::Waited(Box::new(LaunchedRecord {
                record,
                created: launched.created,
            })),
        ));
    }
    // Answered from the row the store answered the launch with: no read of it again.
    Ok(json_reply(
        status,
        LaunchAnswer::Launched(LaunchReply {
            status: row.status.as_str().to_owned(),
            run_id: row.workflow_id.into_string(),
            created: launched.created,
        }),
    ))
}

pub async fn list(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let principal = ctx.principal()?;
    let status = match ctx.query("status") {
        None => None,
        Some(status) if status == "recoverable" => Some(store::StatusFilter::Recoverable),
        Some(status) if status == record::WAITING_FOR_INPUT => {
            Some(store::StatusFilter::WaitingForInput)
        }
        Some(status) => match WorkflowStatus::parse(&status) {
            Some(stored) => Some(store::StatusFilter::Stored(stored)),
            None => {
                return Err(ApiError::bad_request(format!(
                    "query `status` {status:?} is not one of {}, recoverable, {}",
                    WorkflowStatus::ALL.map(WorkflowStatus::as_str).join(", "),
                    record::WAITING_FOR_INPUT
                )));
            }
        },
    };
    let waiting_for = match ctx.query("waiting_for") {
        None => None,
        Some(kind) => Some(store::WaitKind::parse(&kind).ok_or_else(|| {
            ApiError::bad_request(format!(
                "query `waiting_for` {kind:?} is not one of {}",
                store::WaitKind::ALL.map(store::WaitKind::as_str).join(", ")
            ))
        })?),
    };
    let after = ctx.query("after").map(|c| parse_cursor(&c)).transpose()?;
    let request_id = ctx.query("request_id");
    if let Some(request_id) = &request_id {
        check_id("request_id", request_id)?;
    }
    // Whose: a user's own always; one who sees every workflow may name an owner. The name is
    // checked either way (a malformed query is refused whoever sends it).
    let named = ctx.query("user_id");
    if let Some(user_id) = &named {
        check_id("user_id", user_id)?;
    }
    let user_id = if principal.user.sees_every_workflow() {
        named
    } else {
        Some(principal.user.id.clone())
    };
    let page_size_max = ctx.state.http.page_size_max;
    let limit = match ctx.query("limit") {
        None => PAGE_SIZE_DEFAULT.min(page_size_max),
        Some(limit) => match limit.parse::<u32>() {
            Ok(limit) if (1..=page_size_max).contains(&limit) => limit,
            _ => {
                return Err(ApiError::bad_request(format!(
                    "query `limit` {limit:?} is not a number from 1 to {page_size_max} \
                     (`http.page_size_max`)"
                )));
            }
        },
    };
    let mut rows = ctx
        .state
        .node
        .workflows()
        .list(store::ListFilter {
            user_id,
            status,
            waiting_for,
            request_id,
            after,
            limit: limit + 1,
        })
        .await?;
    let more = rows.len() > limit as usize;
    rows.truncate(limit as usize);
    let next = more
        .then(|| rows.last().map(|listed| cursor(&listed.row)))
        .flatten();
    Ok(json_reply(
        StatusCode::OK,
        WorkflowPage {
            workflows: rows.iter().map(record::summary).collect(),
            next_after: next.clone(),
            next,
        },
    ))
}

/// A listing's position after `row`: `<created_at>_<run_id>`, the creation time written as the
/// shortest decimal that reads back as the same number (so the position is exact).
fn cursor(row: &WorkflowRow) -> String {
    format!("{}_{}", row.created_at, row.workflow_id)
}

fn parse_cursor(text: &str) -> Result<store::ListCursor, ApiError> {
    let refused = || {
        ApiError::bad_request(format!(
            "query `after` {text:?} is not a position a listing gave as `next`"
        ))
    };
    if !super::rules::LIST_CURSOR.is_match(text) {
        return Err(refused());
    }
    let (created_at, workflow_id) = text.split_once('_').ok_or_else(refused)?;
    let created_at: f64 = created_at.parse().map_err(|_| refused())?;
    if !created_at.is_finite() || !runtime::is_id(workflow_id) {
        return Err(refused());
    }
    Ok(store::ListCursor {
        created_at,
        workflow_id: WorkflowId::new(workflow_id),
    })
}

pub async fn get(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    if ctx.route.surface == Surface::Compat {
        let EmptyBody {} = ctx.json()?;
    }
    let run_id = run_id(ctx)?;
    if let Some(wait) = asked_wait(ctx)? {
        let permit = ctx.state.waiters.admit(&ctx.principal()?.user.id)?;
        let record = wait_for(ctx, &run_id, wait, permit).await?;
        return Ok(json_reply(StatusCode::OK, record));
    }
    let view = read_record(ctx, &run_id).await??;
    let view = visible(ctx, view, &run_id, Act::Read)?;
    Ok(json_reply(
        StatusCode::OK,
        record::record(&view, page_max(ctx)),
    ))
}

/// A page's length: query `limit`, 1 to `max` (the configuration key `key`), `max` when absent.
fn page_limit(ctx: &Ctx<'_>, max: u32, key: &str) -> Result<u32, ApiError> {
    match ctx.query("limit") {
        None => Ok(max),
        Some(limit) => match limit.parse::<u32>() {
            Ok(limit) if (1..=max).contains(&limit) => Ok(limit),
            _ => Err(ApiError::bad_request(format!(
                "query `limit` {limit:?} is not a number from 1 to {max} (`{key}`)"
            ))),
        },
    }
}

/// `GET /api/v1/workflows/{id}/steps?after=&limit=`: the steps after a position a record gave
/// as `steps_next` (or a page as `next`), in journal order, read in one of the caller's places.
pub async fn steps(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let run_id = run_id(ctx)?;
    let max = ctx.state.http.record_steps_page_max;
    let limit = page_limit(ctx, max, "http.record_steps_page_max")?;
    let after = match ctx.query("after") {
        Some(cursor) => record::parse_step_cursor(&cursor)?,
        None => store::StepPosition::START,
    };
    let row = owned_row(ctx, &run_id, Act::Read).await?;
    let store = ctx.state.node.store();
    let user_id = &ctx.principal()?.user.id;
    let page = ctx
        .state
        .record_reads
        .read(
            user_id,
            store.read_step_page(&run_id, after, limit.saturating_add(1)),
        )
        .await??;
    let (mut steps, next) = record::step_page(&page.steps, &page.approval_runs, limit);
    // On every page as on the record's first: the uncertain attempt is not `running`.
    if let Some(why) = record::reconciliation(&row) {
        record::mark_uncertain(&mut steps, &why);
    }
    Ok(json_reply(
        StatusCode::OK,
        StepPageReply {
            run_id: run_id.into_string(),
            steps,
            next,
        },
    ))
}

/// `GET /api/v1/workflows/{id}/artifacts?after=&limit=`: the artifact versions above `after` (a
/// version a record gave as `artifacts_next`, or a page as `next`), oldest first, without their
/// bytes, read in one of the caller's places.
pub async fn artifacts(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let run_id = run_id(ctx)?;
    let max = ctx.state.http.record_artifacts_page_max;
    let limit = page_limit(ctx, max, "http.record_artifacts_page_max")?;
    let after = match ctx.query("after") {
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|version| *version >= 0)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "query `after` {text:?} is not an artifact version (a record's \
                     `artifacts_next`, or a page's `next`)"
                ))
            })?,
        None => 0,
    };
    owned_row(ctx, &run_id, Act::Read).await?;
    let store = ctx.state.node.store();
    let user_id = &ctx.principal()?.user.id;
    let infos = ctx
        .state
        .record_reads
        .read(
            user_id,
            store.read_artifact_page(&run_id, after, limit.saturating_add(1)),
        )
        .await??;
    let (artifacts, next) = record::artifact_page(&infos, limit);
    Ok(json_reply(
        StatusCode::OK,
        ArtifactPageReply {
            run_id: run_id.into_string(),
            artifacts,
            next,
        },
    ))
}

fn control_reply(run_id: WorkflowId, status: &str, written: &ControlWrite) -> ControlReply {
    let (ControlWrite::Recorded(row) | ControlWrite::Repeated(row)) = written;
    ControlReply {
        run_id: run_id.into_string(),
        status: status.to_owned(),
        repeated: matches!(written, ControlWrite::Repeated(_)),
        recorded_by: row.created_by.clone(),
        recorded_at: row.created_at,
    }
}

pub async fn resume(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: ResumeBody = ctx.json()?;
    let run_id = run_id(ctx)?;
    owned_row(ctx, &run_id, Act::Answer).await?;
    let written = ctx
        .state
        .node
        .workflows()
        .resume(
            Resume {
                workflow_id: run_id.clone(),
                fingerprint: Some(body.fingerprint),
                step_id: body.step_id.into_string(),
                attempt: body.attempt,
                input: body.input,
            },
            &by(ctx)?,
        )
        .await?;
    Ok(json_reply(
        StatusCode::OK,
        control_reply(run_id, "resumed", &written),
    ))
}

pub async fn decide(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: DecideBody = ctx.json()?;
    let run_id = run_id(ctx)?;
    owned_row(ctx, &run_id, Act::Answer).await?;
    let status = body.decision.outcome();
    let written = ctx
        .state
        .node
        .workflows()
        .decide(
            Decide {
                workflow_id: run_id.clone(),
                step_id: body.step_id.into_string(),
                attempt: body.attempt,
                artifact_version: body.artifact_version,
                decision: body.decision.as_str().to_owned(),
                comment: body.comment,
            },
            &by(ctx)?,
        )
        .await?;
    Ok(json_reply(
        StatusCode::OK,
        control_reply(run_id, status, &written),
    ))
}

/// Sends an event to a live workflow (its `waitForEvent` of that name takes it, now or later):
/// 200 `stored`, or `repeated` when this `event_id` holds the same event already; 409 when it
/// holds another; 422 when the workflow has ended.
pub async fn send_event(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: SendEventBody = ctx.json()?;
    let run_id = run_id(ctx)?;
    if body.payload.is_null() {
        return Err(ApiError::bad_request(
            "an event's `payload` may not be null: a waitForEvent resolves with null when its \
             deadline passes, so an event that carries nothing sends {} or true",
        ));
    }
    owned_row(ctx, &run_id, Act::Control).await?;
    let sent = ctx
        .state
        .node
        .workflows()
        .send_event(
            SendEvent {
                workflow_id: run_id.clone(),
                event_id: body.event_id.into_string(),
                name: body.name.into_string(),
                payload: body.payload,
            },
            &by(ctx)?,
        )
        .await?;
    let (event, status) = match sent {
        store::EventSend::Stored(event) => (event, "stored"),
        store::EventSend::Repeated(event) => (event, "repeated"),
        store::EventSend::Ended(status) => {
            return Err(ApiError::refused(format!(
                "refused: workflow {:?} is {status}: an ended workflow takes no events",
                run_id.as_str()
            )));
        }
    };
    Ok(json_reply(
        StatusCode::OK,
        EventReply {
            run_id: run_id.into_string(),
            status: status.to_owned(),
            repeated: status == "repeated",
            event_id: event.event_id,
            name: event.name,
            sent_by: event.created_by,
            taken_by: event.taken_by,
        },
    ))
}

/// Answers the newest pending approval request of a step's agent: one answer wins across the
/// cluster (the store's compare-and-set); the same answer again is a repeat, a different one a
/// conflict. A detached pause ends the child run, an attached one goes back to running and the
/// agent gets the answer at its owner's next lease renewal; either way the workflow goes on.
pub async fn answer(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: AnswerBody = ctx.json()?;
    let run_id = run_id(ctx)?;
    let step_id = path_id(ctx, "step")?;
    let status = body.decision.outcome();
    owned_row(ctx, &run_id, Act::Answer).await?;
    let store = ctx.state.node.store();
    let step = store
        .read_steps(&run_id)
        .await?
        .into_iter()
        .filter(|s| s.kind() == Some(store::StepKind::Agent) && s.step_id == step_id)
        .max_by_key(|s| s.attempt)
        .ok_or_else(|| {
            ApiError::not_found(format!("workflow {run_id:?} has no agent step {step_id:?}"))
        })?;
    let not_waiting = || {
        ApiError::refused(format!(
            "step {step_id:?} of workflow {run_id:?} does not wait for input"
        ))
    };
    let child_run_id = step
        .record()
        .and_then(store::StepRecord::run_id)
        .cloned()
        .ok_or_else(not_waiting)?;
    let child = store
        .read_run(&child_run_id)
        .await?
        .filter(|run| run.workflow.as_ref() == Some(&run_id))
        .ok_or_else(not_waiting)?;
    let pending = store::pending_request_id(&child.metadata)
        .filter(|_| child.status == store::RunStatus::WaitingForInput)
        .map(str::to_owned);
    let request_id = body
        .request_id
        .clone()
        .map(Id::into_string)
        .or(pending.clone());
    let given = serde_json::json!({
        "decision": body.decision.as_str(),
        "comment": body.comment,
        "by": by(ctx)?,
        "actions": store::ApprovalSlot::of(&child.metadata)
            .asked()
            .map_or(serde_json::Value::Null, |asked| asked.actions.clone()),
    });
    if let Some(request_id) = &request_id
        && pending.as_ref() == Some(request_id)
        && ctx
            .state
            .node
            .runs()
            .answer_approval(&child.thread_id, std::slice::from_ref(request_id), &given)
            .await?
            .is_some()
    {
        return Ok(answer_reply(run_id, step_id, request_id, status, false));
    }
    // Not ours to answer: someone answered first, or nothing waits. The row tells which.
    let now = store
        .read_run(&child_run_id)
        .await?
        .ok_or_else(not_waiting)?;
    let slot = store::ApprovalSlot::of(&now.metadata);
    let Some(recorded) = slot.answered() else {
        return Err(if now.status == store::RunStatus::WaitingForInput {
            ApiError::conflict(format!(
                "step {step_id:?} waits for request {:?}, not {:?}",
                store::pending_request_id(&now.metadata).unwrap_or_default(),
                request_id.unwrap_or_default()
            ))
        } else {
            not_waiting()
        });
    };
    let recorded_id = recorded.request_id;
    if request_id.as_deref().is_some_and(|id| id != recorded_id) {
        return Err(not_waiting());
    }
    let same = *recorded.decision() == given["decision"] && *recorded.comment() == given["comment"];
    if same {
        Ok(answer_reply(run_id, step_id, recorded_id, status, true))
    } else {
        Err(ApiError::conflict(format!(
            "request {recorded_id:?} of step {step_id:?} was already answered: {}",
            recorded.decision()
        )))
    }
}

fn answer_reply(
    run_id: WorkflowId,
    step_id: String,
    request_id: &str,
    status: &str,
    repeated: bool,
) -> Reply {
    json_reply(
        StatusCode::OK,
        AnswerReply {
            run_id: run_id.into_string(),
            step_id,
            request_id: request_id.to_owned(),
            status: status.to_owned(),
            repeated,
        },
    )
}

/// The workflow of a route whose body names only it: the REST route has none, the compatible
/// action's is `run_id` alone (lifted), so any other field is refused.
fn run_body(ctx: &Ctx<'_>) -> Result<WorkflowId, ApiError> {
    if ctx.route.surface == Surface::Compat {
        let EmptyBody {} = ctx.json()?;
    }
    run_id(ctx)
}

/// Records the cancel, then waits up to `http.cancel_wait_ms` for the workflow to settle and
/// answers with the status it sees (`cancelling` while children are still being interrupted).
pub async fn cancel(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let run_id = run_body(ctx)?;
    let row = owned_row(ctx, &run_id, Act::Control).await?;
    match row.status {
        WorkflowStatus::Cancelled => return Ok(status_reply(run_id, row.status.as_str())),
        WorkflowStatus::Completed | WorkflowStatus::Failed => {
            return Err(ApiError::refused(format!(
                "the workflow is {}: there is nothing to cancel",
                row.status
            )));
        }
        _ => {}
    }
    let workflows = ctx.state.node.workflows();
    // Watched before the cancel is recorded: the status changes it causes are all heard.
    let mut watch = ctx.state.waiters.watch(&run_id);
    workflows.cancel(&run_id, &by(ctx)?).await?;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(ctx.state.http.cancel_wait_ms);
    let store = ctx.state.node.store();
    let mut over = false;
    loop {
        let status = store.read_workflow(&run_id).await?.map(|row| row.status);
        let settled = status.is_none_or(|status| {
            status.is_final() || status == WorkflowStatus::NeedsReconciliation
        });
        if settled || over {
            return Ok(status_reply(
                run_id,
                status.map_or("deleted", WorkflowStatus::as_str),
            ));
        }
        over = !watch.changed(deadline).await;
    }
}

fn status_reply(run_id: WorkflowId, status: &str) -> Reply {
    json_reply(
        StatusCode::OK,
        StatusReply {
            run_id: run_id.into_string(),
            status: status.to_owned(),
        },
    )
}

pub async fn recover(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    refuse_while_draining(ctx)?;
    let run_id = run_body(ctx)?;
    owned_row(ctx, &run_id, Act::Control).await?;
    ctx.state.node.workflows().recover(&run_id).await?;
    let row = owned_row(ctx, &run_id, Act::Control).await?;
    Ok(status_reply(run_id, row.status.as_str()))
}

/// Runs a failed workflow again from its failed step, as a new workflow on this node: 201 with
/// the new workflow, or 200 `repeated` with the retry made before (by anyone, on any node).
pub async fn retry(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    refuse_while_draining(ctx)?;
    let run_id = run_id(ctx)?;
    let body: RetryBody = ctx.json()?;
    owned_row(ctx, &run_id, Act::Control).await?;
    let retried = ctx
        .state
        .node
        .workflows()
        .retry(RetryRequest {
            workflow_id: run_id.clone(),
            request_id: body.request_id.map(Id::into_string),
        })
        .await?;
    let status = if retried.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(json_reply(
        status,
        RetryReply {
            run_id: retried.row.workflow_id.into_string(),
            retry_of: run_id.into_string(),
            repeated: !retried.created,
            status: retried.row.status.as_str().to_owned(),
        },
    ))
}

pub async fn reconcile(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    refuse_while_draining(ctx)?;
    let body: ReconcileBody = ctx.json()?;
    let run_id = run_id(ctx)?;
    let resolution = match (body.resolution, body.output) {
        (super::wire::Resolution::Retry, None) => Resolution::Retry,
        (super::wire::Resolution::Fail, None) => Resolution::Fail,
        (super::wire::Resolution::Complete, Some(output)) => Resolution::Complete(output),
        (super::wire::Resolution::Complete, None) => {
            return Err(ApiError::bad_request(
                "body field `output`: `complete` needs the step's output",
            ));
        }
        (super::wire::Resolution::Retry | super::wire::Resolution::Fail, Some(_)) => {
            return Err(ApiError::bad_request(
                "body field `output`: only `complete` takes an output",
            ));
        }
    };
    owned_row(ctx, &run_id, Act::Control).await?;
    ctx.state
        .node
        .workflows()
        .reconcile(ReconcileRequest {
            workflow_id: run_id.clone(),
            step_id: body.step_id.into_string(),
            resolution,
            reason: body.reason,
            by: by(ctx)?,
        })
        .await?;
    let row = owned_row(ctx, &run_id, Act::Control).await?;
    Ok(status_reply(run_id, row.status.as_str()))
}

pub async fn delete(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let run_id = run_body(ctx)?;
    owned_row(ctx, &run_id, Act::Control).await?;
    match ctx.state.node.workflows().delete(&run_id).await? {
        store::Deletion::Deleted => Ok(json_reply(
            StatusCode::OK,
            DeletedReply {
                run_id: run_id.into_string(),
                deleted: true,
            },
        )),
        store::Deletion::NotTerminal => Err(ApiError::refused(
            "only a completed, failed or cancelled workflow can be deleted; cancel it first",
        )),
        store::Deletion::NotFound => Err(ApiError::no_workflow(&run_id)),
    }
}

async fn artifact_row(
    ctx: &Ctx<'_>,
    run_id: &WorkflowId,
    version: i64,
) -> Result<store::ArtifactRow, ApiError> {
    owned_row(ctx, run_id, Act::Read).await?;
    ctx.state
        .node
        .store()
        .read_artifact(run_id, version)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "workflow {run_id:?} has no artifact version {version}"
            ))
        })
}

/// One base64 chunk of an artifact (at most [`CHUNK_BYTES_MAX`]).
pub async fn artifact_chunk(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let body: ArtifactChunkBody = ctx.json()?;
    let run_id = run_id(ctx)?;
    let artifact = artifact_row(ctx, &run_id, body.version).await?;
    let total = artifact.content.len() as u64;
    let offset = body.offset.unwrap_or(0);
    if offset > total {
        return Err(ApiError::refused(format!(
            "offset {offset} is past the artifact's end ({total} bytes)"
        )));
    }
    let length = body.length.unwrap_or(CHUNK_BYTES_MAX).min(CHUNK_BYTES_MAX);
    let end = offset.saturating_add(length).min(total);
    // Both bounds are within `content`, whose length fits in usize.
    let chunk = &artifact.content[offset as usize..end as usize];
    Ok(json_reply(
        StatusCode::OK,
        ArtifactChunkReply {
            version: artifact.version,
            content_base64: STANDARD.encode(chunk),
            offset,
            total_bytes: total,
            sha256: artifact.sha256,
        },
    ))
}

/// An artifact's bytes, whole or the one range asked for.
pub async fn artifact(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let run_id = WorkflowId::new(path_id(ctx, "id")?);
    let version_text = ctx.param("version").unwrap_or_default();
    let version: i64 = version_text.parse().map_err(|_| {
        ApiError::bad_request(format!("artifact version {version_text:?} is not a number"))
    })?;
    let artifact = artifact_row(ctx, &run_id, version).await?;
    let total = artifact.content.len() as u64;
    let served = served(artifact.path.as_deref(), artifact.source_step_id.is_some());
    let range = ctx
        .headers
        .get(RANGE)
        .and_then(|v| v.to_str().ok())
        .map(|v| parse_range(v, total));
    let (status, start, end) = match range {
        None | Some(Range::Ignored) => (StatusCode::OK, 0, total),
        Some(Range::Bytes(start, end)) => (StatusCode::PARTIAL_CONTENT, start, end),
        Some(Range::Unsatisfiable) => {
            let mut reply = super::error_reply(&ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("the artifact has {total} bytes"),
            ));
            if let Ok(value) = HeaderValue::try_from(format!("bytes */{total}")) {
                reply.headers_mut().insert(CONTENT_RANGE, value);
            }
            return Ok(reply);
        }
    };
    // `start <= end <= total`, and `total` is the length of `content`.
    let bytes = Bytes::copy_from_slice(&artifact.content[start as usize..end as usize]);
    let mut reply = Response::new(super::full(bytes));
    *reply.status_mut() = status;
    let headers = reply.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(served.content_type));
    // The name keeps only characters that are valid in a header.
    if let Ok(value) = HeaderValue::try_from(disposition(
        &served,
        artifact.path.as_deref(),
        artifact.version,
    )) {
        headers.insert(CONTENT_DISPOSITION, value);
    }
    headers.insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(etag) = HeaderValue::try_from(format!("\"{}\"", artifact.sha256)) {
        headers.insert(ETAG, etag);
    }
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(value) = HeaderValue::try_from(format!("bytes {start}-{}/{total}", end - 1))
    {
        headers.insert(CONTENT_RANGE, value);
    }
    Ok(reply)
}

/// What a `Range` header asks for, over `total` bytes.
#[derive(Debug, PartialEq, Eq)]
enum Range {
    /// `[start, end)`.
    Bytes(u64, u64),
    /// Syntactically a range, but outside the content: 416.
    Unsatisfiable,
    /// Not a single byte range we serve (several ranges, other units): the whole content.
    Ignored,
}

fn parse_range(header: &str, total: u64) -> Range {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return Range::Ignored;
    };
    if spec.contains(',') {
        return Range::Ignored;
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Range::Ignored;
    };
    let (first, last) = (first.trim(), last.trim());
    match (first.parse::<u64>(), last.parse::<u64>()) {
        // bytes=-N: the last N bytes.
        (Err(_), Ok(suffix)) if first.is_empty() => {
            if suffix == 0 || total == 0 {
                Range::Unsatisfiable
            } else {
                Range::Bytes(total.saturating_sub(suffix), total)
            }
        }
        (Ok(start), Err(_)) if last.is_empty() => {
            if start >= total {
                Range::Unsatisfiable
            } else {
                Range::Bytes(start, total)
            }
        }
        (Ok(start), Ok(end)) if start <= end => {
            if start >= total {
                Range::Unsatisfiable
            } else {
                Range::Bytes(start, end.saturating_add(1).min(total))
            }
        }
        _ => Range::Ignored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_follow_rfc_9110() {
        assert_eq!(parse_range("bytes=0-3", 10), Range::Bytes(0, 4));
        assert_eq!(parse_range("bytes=4-", 10), Range::Bytes(4, 10));
        assert_eq!(parse_range("bytes=-3", 10), Range::Bytes(7, 10));
        assert_eq!(parse_range("bytes=-30", 10), Range::Bytes(0, 10));
        assert_eq!(parse_range("bytes=5-100", 10), Range::Bytes(5, 10));
        assert_eq!(parse_range("bytes=10-", 10), Range::Unsatisfiable);
        assert_eq!(parse_range("bytes=-0", 10), Range::Unsatisfiable);
        assert_eq!(parse_range("bytes=0-1,4-5", 10), Range::Ignored);
        assert_eq!(parse_range("items=0-1", 10), Range::Ignored);
        assert_eq!(parse_range("bytes=3-1", 10), Range::Ignored);
    }

    #[test]
    fn ids_are_checked_before_they_reach_the_store() {
        assert!(check_id("run_id", "0f3a-b_c.d").is_ok());
        for bad in [
            "",
            "a/b",
            "a b",
            "é",
            &"x".repeat(runtime::ID_CHARS_MAX + 1),
        ] {
            assert!(check_id("run_id", bad).is_err(), "{bad:?}");
        }
    }
}
