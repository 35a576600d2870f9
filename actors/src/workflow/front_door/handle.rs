//! [`WorkflowsHandle`]: the Rust API the HTTP layer calls (launch, get, list, resume, decide,
//! send an event, cancel, delete, recover, reconcile, retry, fence, drain), and what it answers.

use std::time::Duration;

use ractor::{ActorRef, RpcReplyPort};
use runtime::CallKind;
use serde_json::{Value, json};
use store::{
    ControlKind, ControlRow, ControlWrite, Epoch, NewControl, StepRow, WorkflowId, WorkflowRow,
};
use tokio::sync::broadcast;

use super::actor::WorkflowsMsg;
use super::launch::Launched;
use super::not_found;
use crate::error::Error;
use crate::mailbox::Post;
use crate::store_actor::StoreHandle;
use crate::workflow::requests::{
    Decide, LaunchRequest, ReconcileRequest, Resume, RetryRequest, SendEvent,
};
use crate::workflow::rules;

/// A workflow as stored: its row, lease, controls and checkpoints, and the first page of its
/// steps and of its artifact versions (see [`store::Snapshot`]).
#[derive(Debug, Clone)]
pub struct WorkflowView {
    pub row: WorkflowRow,
    /// The first steps of its journal, in journal order (see [`store::Snapshot::steps`]).
    pub steps: Vec<StepRow>,
    /// Its pauses and human checkpoints, whole (see [`store::Snapshot::checkpoints`]).
    pub checkpoints: Vec<StepRow>,
    pub controls: Vec<ControlRow>,
    pub lease: Option<store::Lease>,
    /// The child runs that asked a person for approval (see [`store::Snapshot::approval_runs`]).
    pub approval_runs: Vec<store::RunRow>,
    /// The first artifact versions, without their bytes (see [`store::Snapshot::artifacts`]).
    pub artifacts: Vec<store::ArtifactInfo>,
    /// Live by its stored status, with its lease expired on the database clock: `recover` may
    /// take it over. Derived on every read, never stored.
    pub recoverable: bool,
    /// The workflow that runs this one again from its failed step, if one does.
    pub retried_by: Option<WorkflowId>,
    /// Its waits, whichever page their steps are on (see [`store::Snapshot::waits`]).
    pub waits: Vec<StepRow>,
}

/// A cheap, cloneable way to launch and control workflows on this node.
#[derive(Clone)]
pub struct WorkflowsHandle {
    actor: ActorRef<WorkflowsMsg>,
    store: StoreHandle,
    timeout: Duration,
    stopped: broadcast::Sender<WorkflowId>,
    /// Where the threads of workflows' agent steps live (removed with their workflow).
    workspaces_dir: std::path::PathBuf,
    events: EventLimits,
}

/// What bounds the events sent to workflows.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EventLimits {
    /// The largest payload of one, as JSON (`limits.frame_bytes_max`).
    pub payload_bytes_max: u64,
    /// The events a workflow holds untaken at most, and their bytes.
    pub bounds: store::EventBounds,
    /// The owner's quota, which every event's payload counts against
    /// (`limits.user_stored_bytes_max`; 0: none).
    pub stored_bytes_max: u64,
}

impl WorkflowsHandle {
    pub(crate) fn new(
        actor: ActorRef<WorkflowsMsg>,
        store: StoreHandle,
        timeout: Duration,
        stopped: broadcast::Sender<WorkflowId>,
        workspaces_dir: std::path::PathBuf,
        events: EventLimits,
    ) -> Self {
        WorkflowsHandle {
            actor,
            store,
            timeout,
            stopped,
            workspaces_dir,
            events,
        }
    }

    /// The ids of workflows whose supervisor on this node stops from now on: it finished,
    /// needs reconciliation, was fenced or given up. A cue to read the workflow, not a record:
    /// a receiver that falls more than `STOPPED_BACKLOG` (1,024) ids behind misses some
    /// (`RecvError::Lagged`) and reads the rows it waits for instead.
    pub fn stopped(&self) -> broadcast::Receiver<WorkflowId> {
        self.stopped.subscribe()
    }

    async fn call<T: Send + 'static>(
        &self,
        message: impl FnOnce(RpcReplyPort<T>) -> WorkflowsMsg,
    ) -> Result<T, Error> {
        crate::error::ask(&self.actor, "workflows", self.timeout, message).await
    }

    /// Launches a workflow on this node.
    pub async fn launch(&self, request: LaunchRequest) -> Result<Launched, Error> {
        self.call(|reply| WorkflowsMsg::Launch { request, reply })
            .await?
    }

    /// Runs a failed workflow again from its failed step, as a new workflow supervised on this
    /// node (see `rules::retry`); a workflow retried before answers its retry (`created:
    /// false`).
    ///
    /// A retry that does not answer within the call's timeout (a large copy, a slow store) goes
    /// on: that is an unknown outcome, never "nothing was written". Asking again is safe: a
    /// workflow is retried once, and the retry made answers it.
    pub async fn retry(&self, request: RetryRequest) -> Result<Launched, Error> {
        let source = request.workflow_id.clone();
        match self
            .call(|reply| WorkflowsMsg::Retry { request, reply })
            .await
        {
            Ok(answer) => answer,
            Err(Error::Unanswered { reason, .. }) => {
                Err(Error::Store(store::Error::OutcomeUnknown(format!(
                    "the retry of {:?} did not answer ({reason}); it may still be made: ask \
                     again (a workflow is retried once) or read its retried_by",
                    source.as_str()
                ))))
            }
            Err(error) => Err(error),
        }
    }

    /// A workflow with its lease, controls, checkpoints, first `steps_max` steps and first
    /// `artifacts_max` artifact versions, if it exists.
    pub async fn get(
        &self,
        workflow_id: &WorkflowId,
        steps_max: u32,
        artifacts_max: u32,
    ) -> Result<Option<WorkflowView>, Error> {
        let Some(snapshot) = self
            .store
            .read_snapshot(workflow_id, steps_max, artifacts_max)
            .await?
        else {
            return Ok(None);
        };
        let row = snapshot.row;
        let recoverable = row.status.holds_place()
            && snapshot
                .lease
                .as_ref()
                .is_none_or(|lease| lease.expires_at <= snapshot.db_now);
        Ok(Some(WorkflowView {
            row,
            steps: snapshot.steps,
            checkpoints: snapshot.checkpoints,
            controls: snapshot.controls,
            lease: snapshot.lease,
            approval_runs: snapshot.approval_runs,
            artifacts: snapshot.artifacts,
            recoverable,
            retried_by: snapshot.retried_by,
            waits: snapshot.waits,
        }))
    }

    /// Records a `resume` of a pause (any node; the owner carries it out). Refused as a conflict
    /// when the fingerprint is stale or the step is not a pause of this workflow at that attempt.
    pub async fn resume(&self, request: Resume, by: &str) -> Result<ControlWrite, Error> {
        if let Some(fingerprint) = &request.fingerprint {
            let row = self
                .store
                .read_workflow(&request.workflow_id)
                .await?
                .ok_or_else(|| not_found(&request.workflow_id))?;
            rules::same_script(&row, fingerprint)?;
        }
        self.journaled_step(
            &request.workflow_id,
            &request.step_id,
            CallKind::Pause,
            request.attempt,
        )
        .await?;
        self.control_at(
            &request.workflow_id,
            ControlKind::Resume,
            &request.step_id,
            request.attempt,
            json!({ "input": request.input }),
            by,
        )
        .await
    }

    /// Records an event sent to a live workflow, once per `event_id` (see
    /// [`store::Store::send_event`]): kept until a `waitForEvent` of its name takes it. Its
    /// payload is bounded as a step's input is (`limits.frame_bytes_max`), checked before
    /// anything is written; its bytes count against the workflow owner's quota.
    pub async fn send_event(&self, event: SendEvent, by: &str) -> Result<store::EventSend, Error> {
        let bytes = event.payload.to_string().len();
        let limit = usize::try_from(self.events.payload_bytes_max).unwrap_or(usize::MAX);
        if bytes > limit {
            return Err(Error::TooLarge {
                what: "the event's payload",
                bytes,
                limit_name: "limits.frame_bytes_max",
                limit,
            });
        }
        let sent = store::NewSentEvent {
            workflow_id: event.workflow_id,
            event_id: event.event_id,
            name: event.name,
            payload: event.payload,
            created_by: Some(by.to_owned()),
            bounds: self.events.bounds,
            stored_bytes_max: i64::try_from(self.events.stored_bytes_max).unwrap_or(i64::MAX),
        };
        Ok(self.store.send_event(sent).await?)
    }

    /// Records a decision on a checkpoint, once: an identical decision again is the same row; a
    /// different one, or one about another artifact version, is refused as a conflict.
    pub async fn decide(&self, request: Decide, by: &str) -> Result<ControlWrite, Error> {
        rules::valid_decision(&request)?;
        let step = self
            .journaled_step(
                &request.workflow_id,
                &request.step_id,
                CallKind::HumanCheckpoint,
                request.attempt,
            )
            .await?;
        let body = rules::decision(&request, &step)?;
        self.control_at(
            &request.workflow_id,
            ControlKind::Decide,
            &request.step_id,
            request.attempt,
            body,
            by,
        )
        .await
    }

    /// The journal entry a control answers (see [`rules::answered_step`]), of a workflow that
    /// exists.
    async fn journaled_step(
        &self,
        workflow_id: &WorkflowId,
        step_id: &str,
        kind: CallKind,
        attempt: i32,
    ) -> Result<StepRow, Error> {
        let steps = self.store.read_steps(workflow_id).await?;
        if steps.is_empty() && self.store.read_workflow(workflow_id).await?.is_none() {
            return Err(not_found(workflow_id));
        }
        rules::answered_step(steps, step_id, kind, attempt)
    }

    async fn control_at(
        &self,
        workflow_id: &WorkflowId,
        kind: ControlKind,
        step_id: &str,
        attempt: i32,
        body: Value,
        by: &str,
    ) -> Result<ControlWrite, Error> {
        Ok(self
            .store
            .put_control(NewControl {
                workflow_id: workflow_id.to_owned(),
                kind,
                step_id: step_id.to_owned(),
                attempt,
                body,
                created_by: Some(by.to_owned()),
            })
            .await?)
    }

    /// Asks a workflow to stop, durably: the owner interrupts its child runs and ends it
    /// `cancelled` (or `needs_reconciliation` if a child's fate cannot be observed in time).
    /// Cancelling again is the same request.
    pub async fn cancel(&self, workflow_id: &WorkflowId, by: &str) -> Result<ControlWrite, Error> {
        let recorded = self
            .control_at(workflow_id, ControlKind::Cancel, "", 0, json!({}), by)
            .await?;
        // If the owner is gone, this node finishes the cancellation (without replaying the body);
        // if it is alive, the takeover is refused and the owner's poll finds the request. An
        // owner that died with its lease still valid is looked at again once it may have run out.
        let _ = self.actor.post(WorkflowsMsg::TakeOverToCancel {
            workflow_id: workflow_id.to_owned(),
            tries: 0,
            done: None,
        });
        Ok(recorded)
    }

    /// Deletes a terminal workflow with everything it holds: its rows, then the workspaces of
    /// its agent steps' threads (see [`crate::workspace::remove_thread`]). The journal is read
    /// first, since it is what names those threads.
    pub async fn delete(&self, workflow_id: &WorkflowId) -> Result<store::Deletion, Error> {
        let steps = self.store.read_steps(workflow_id).await?;
        let deletion = self.store.delete_workflow(workflow_id).await?;
        if deletion != store::Deletion::Deleted {
            return Ok(deletion);
        }
        let threads: std::collections::BTreeSet<String> = steps
            .iter()
            .filter(|step| step.kind() == Some(store::StepKind::Agent))
            .map(|step| crate::workflow::thread_for(workflow_id, &step.step_id))
            .collect();
        let workspaces_dir = self.workspaces_dir.clone();
        let removed = tokio::task::spawn_blocking(move || {
            threads
                .iter()
                .map(|thread| crate::workspace::remove_thread(&workspaces_dir, thread))
                .find_map(Result::err)
        })
        .await;
        // The workflow is gone either way; what is left on disk is only logged.
        match removed {
            Ok(None) => {}
            Ok(Some(error)) => {
                tracing::warn!(%workflow_id, %error, "cannot remove a deleted workflow's workspace");
            }
            Err(error) => {
                tracing::warn!(%workflow_id, %error, "removing a deleted workflow's workspaces failed");
            }
        }
        Ok(deletion)
    }

    /// A page of workflows, newest first.
    pub async fn list(
        &self,
        filter: store::ListFilter,
    ) -> Result<Vec<store::ListedWorkflow>, Error> {
        Ok(self.store.list_workflows(filter).await?)
    }

    /// Takes over a recoverable workflow (live, its owner's lease expired) with epoch + 1 and
    /// replays it on this node. Refused, with the lease untouched, when this node's runtime
    /// version differs or a cancellation is pending.
    pub async fn recover(&self, workflow_id: &WorkflowId) -> Result<WorkflowId, Error> {
        let workflow_id = workflow_id.to_owned();
        self.call(|reply| WorkflowsMsg::Recover { workflow_id, reply })
            .await?
    }

    /// Settles the uncertain step of a workflow in `needs_reconciliation` (retry it as a new
    /// attempt, fail it, or complete it with an output) and resumes the workflow here by replay.
    pub async fn reconcile(&self, request: ReconcileRequest) -> Result<WorkflowId, Error> {
        self.call(|reply| WorkflowsMsg::Reconcile {
            request: Box::new(request),
            reply,
        })
        .await?
    }

    /// Stops every workflow supervisor of this node and waits for them (node shutdown). Each
    /// first gives its lease up after its last write (fenced on its epoch; the release wakes
    /// automatic recovery on the other nodes), so another node takes the workflow over at once
    /// instead of when the lease would have run out; one whose child run is in flight keeps it.
    pub(crate) async fn stop_supervisors(&self, timeout: Duration) {
        let give_up = async {
            let live = self.live().await.unwrap_or_default();
            let given_up = futures_util::future::join_all(live.into_iter().map(|workflow_id| {
                self.call(|reply| WorkflowsMsg::Fence {
                    workflow_id,
                    shutdown: true,
                    reply,
                })
            }))
            .await;
            for failed in given_up
                .into_iter()
                .filter_map(|given| given.and_then(|r| r).err())
            {
                // A workflow that ended meanwhile holds nothing, one with a child run in flight
                // keeps its lease (refused both); any other's lease runs out by itself, as after
                // a crash.
                if !matches!(
                    failed,
                    Error::NotSupervised { .. } | Error::ChildInFlight { .. }
                ) {
                    tracing::warn!(error = %failed, "a workflow's lease was not given up at shutdown");
                }
            }
        };
        if tokio::time::timeout(timeout, give_up).await.is_err() {
            tracing::warn!("giving the leases up did not finish within the shutdown timeout");
        }
        self.actor
            .stop_children_and_wait(Some("shutdown".into()), Some(timeout))
            .await;
    }

    /// Stops taking recoveries on this node (manual and automatic).
    pub fn drain(&self) {
        let _ = self.actor.post(WorkflowsMsg::Drain);
    }

    /// Gives up one workflow's lease now: its supervisor stops writing, then releases the lease,
    /// so another node can recover it at once. Answers the epoch that was given up.
    pub async fn fence(&self, workflow_id: &WorkflowId) -> Result<Epoch, Error> {
        let workflow_id = workflow_id.to_owned();
        self.call(|reply| WorkflowsMsg::Fence {
            workflow_id,
            shutdown: false,
            reply,
        })
        .await?
    }

    /// The workflows supervised on this node.
    pub async fn live(&self) -> Result<Vec<WorkflowId>, Error> {
        self.call(|reply| WorkflowsMsg::Live { reply }).await
    }
}
