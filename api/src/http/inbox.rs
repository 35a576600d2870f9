//! What waits for people, and what operators look at from the console: the inbox (every pause,
//! human checkpoint and agent's approval request of the workflows the caller may see, overdue
//! first, then oldest first) and the admin lists of nodes and child slots.

use hyper::StatusCode;

use super::error::ApiError;
use super::record;
use super::wire::{InboxItem, InboxReply, NodeReply, NodesReply, SlotReply, SlotsReply};
use super::{Ctx, Reply, json_reply};

/// The inbox: the store names the live workflows that wait for a person (at most
/// `http.inbox_workflows_max`, oldest first); each is read as `get` reads it, and its waiting
/// checkpoints and agents' requests become items, sorted by how long they have waited. A user
/// sees their own workflows, an approver and an admin everyone's.
pub async fn inbox(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let principal = ctx.principal()?;
    let limit = ctx.state.http.inbox_workflows_max;
    let sees_all = principal.user.sees_every_workflow();
    let user_id = (!sees_all).then_some(principal.user.id.as_str());
    let mut run_ids = ctx
        .state
        .node
        .store()
        .waiting_workflows(user_id, limit.saturating_add(1))
        .await?;
    let more = run_ids.len() > limit as usize;
    run_ids.truncate(limit as usize);
    let (mut items, mut unreadable) = (Vec::new(), Vec::new());
    for run_id in run_ids {
        let view = match super::workflows::read_record(ctx, &run_id).await? {
            Ok(Some(view)) => view,
            // Deleted or ended since the store named it: nothing waits there any more.
            Ok(None) => continue,
            // One record that cannot be decoded never takes everyone's inbox down with it.
            Err(actors::Error::Store(store::Error::Database(error))) => {
                tracing::error!(%run_id, %error, "a waiting workflow's record cannot be read; the inbox leaves it out");
                unreadable.push(run_id.to_string());
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        if !sees_all && view.row.user_id != principal.user.id {
            continue;
        }
        items.extend(waiting_items(&view));
    }
    // Overdue first (what someone should have answered already), then oldest first.
    items.sort_by(|a, b| b.overdue.cmp(&a.overdue).then(a.since.total_cmp(&b.since)));
    Ok(json_reply(
        StatusCode::OK,
        InboxReply {
            items,
            more,
            unreadable,
        },
    ))
}

/// The questions a workflow waits for: its checkpoints nobody answered, and its agents'
/// requests, whichever page of its record their steps are on.
fn waiting_items(view: &actors::WorkflowView) -> Vec<InboxItem> {
    let row = &view.row;
    let item = |kind: &str, step_id: &str, attempt: i32, since: f64| InboxItem {
        kind: kind.to_owned(),
        run_id: row.workflow_id.as_str().to_owned(),
        title: record::title(row),
        step_id: step_id.to_owned(),
        attempt,
        user_id: row.user_id.clone(),
        fingerprint: row.fingerprint.clone(),
        since,
        artifact_version: None,
        source_step_id: None,
        message: None,
        remind_at: None,
        overdue: false,
        deadline_at: None,
        recoverable: view.recoverable,
        approval: None,
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |now| now.as_secs_f64());
    let checkpoints = record::waiting_checkpoints(view).map(|step| {
        let c = record::checkpoint(step, &view.controls);
        let remind_at = step
            .record()
            .and_then(|record| record.args["remindAfterMs"].as_f64())
            .map(|ms| c.started_at + ms / 1000.0);
        InboxItem {
            artifact_version: c.artifact_version,
            source_step_id: c.source_step_id.clone(),
            message: c.message.clone(),
            remind_at,
            overdue: remind_at.is_some_and(|at| at <= now),
            deadline_at: c.deadline_at,
            ..item(&c.kind, &c.step_id, c.attempt, c.started_at)
        }
    });
    let requests = record::waiting_requests(view).map(|(step_id, attempt, approval)| {
        // A waiting request always says when it was asked (its run's last change).
        let since = approval.asked_at.unwrap_or(row.updated_at);
        InboxItem {
            approval: Some(approval),
            ..item("agent_request", step_id, attempt, since)
        }
    });
    checkpoints.chain(requests).collect()
}

/// The nodes that started on this database, newest first (admins).
pub async fn nodes(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let rows = ctx
        .state
        .node
        .store()
        .list_nodes(ctx.state.http.page_size_max)
        .await?;
    let nodes = rows
        .into_iter()
        .map(|n| NodeReply {
            worker_id: n.worker_id,
            host: n.host,
            pid: n.pid,
            version: n.version,
            started_at: n.started_at,
            stopped_at: n.stopped_at,
        })
        .collect();
    Ok(json_reply(StatusCode::OK, NodesReply { nodes }))
}

/// The child slots held across the cluster, oldest first (admins).
pub async fn slots(ctx: &Ctx<'_>) -> Result<Reply, ApiError> {
    let store = ctx.state.node.store();
    let held = store.count_slots().await?;
    let slots = store
        .list_slots(ctx.state.http.page_size_max)
        .await?
        .into_iter()
        .map(|s| SlotReply {
            run_id: s.workflow_id.into_string(),
            step_id: s.step_id,
            attempt: s.attempt,
            created_at: s.created_at,
        })
        .collect();
    Ok(json_reply(StatusCode::OK, SlotsReply { held, slots }))
}
