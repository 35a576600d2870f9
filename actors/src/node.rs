//! The node supervisor: the root of a node's supervision tree. It starts the store actor, the
//! lease actor and the child-runs actor linked beneath it, and stops the node if any of them dies:
//! a node that cannot persist or renew must not pretend to run anything. [`Node`] is the handle the
//! binary holds.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use serde::Serialize;
use store::{NodeRecord, Store, WorkflowId};
use tokio::task::JoinHandle;

use crate::Error;
use crate::agents::AgentRegistry;
use crate::child_run::{ChildRuns, ChildRunsArgs, RunsHandle, RunsOptions};
use crate::faults::StoreFaults;
use crate::js_pool::JsPool;
use crate::lease::{LeaseActor, LeaseArgs, LeaseMsg, LeaseView};
use crate::metrics::Metrics;
use crate::notify::{Notifier, NotifierArgs, NotifyOptions};
use crate::store_actor::{StoreActor, StoreArgs, StoreHandle};
use crate::workflow::front_door::{
    EventLimits, Workflows, WorkflowsArgs, WorkflowsHandle, WorkflowsOptions,
};

/// Who this node is. `worker_id` is unique across restarts: host name, process id and a random
/// suffix.
#[derive(Debug, Clone, Serialize)]
pub struct NodeIdentity {
    pub worker_id: String,
    pub host: String,
    pub pid: u32,
}

impl NodeIdentity {
    /// The identity of this process, with `suffix` (random, from the caller) making it unique
    /// across restarts that reuse a process id.
    pub fn of_this_process(suffix: &str) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .map(|h| h.trim().to_owned())
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".to_owned());
        let pid = std::process::id();
        NodeIdentity {
            worker_id: format!("{host}-{pid}-{suffix}"),
            host,
            pid,
        }
    }
}

/// Sizes, timeouts and parts of the node's actors.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// Store requests running at once; more wait in the store actor's mailbox.
    pub store_requests_max: usize,
    /// How long a caller waits for an actor's answer.
    pub call_timeout: Duration,
    /// How long shutdown waits for the actors to stop.
    pub shutdown_timeout: Duration,
    pub runs: RunsOptions,
    pub agents: Arc<AgentRegistry>,
    /// Workflow limits (part of the runtime version) and cluster-wide launch limits.
    pub workflows: WorkflowsOptions,
    /// JS threads that run workflow scripts.
    pub js_threads: usize,
    /// The memory all loaded workflow scripts of the node may use together (parked ones hold
    /// none); see `js_pool`.
    pub js_memory_total_bytes: u64,
    /// Scripts whose bytecode each JS thread keeps (`limits.js_compiled_scripts_max`).
    pub js_compiled_scripts_max: usize,
    /// Test faults on every store call of the node; `None` in production.
    pub faults: Option<StoreFaults>,
    /// Where the node's actors count what happens (rendered by `/metrics`).
    pub metrics: Arc<Metrics>,
    /// The webhooks inbox items are sent to; `None`: no notifier runs on this node.
    pub notify: Option<NotifyOptions>,
}

impl NodeOptions {
    /// Options with default sizes and timeouts.
    pub fn new(runs: RunsOptions, agents: Arc<AgentRegistry>) -> Self {
        let lease_ms = runs.lease_ms;
        let workspaces_dir = runs.workspaces_dir.clone();
        NodeOptions {
            store_requests_max: 256,
            call_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(5),
            runs,
            agents,
            workflows: WorkflowsOptions {
                limits: runtime::Limits::default(),
                workspaces_dir,
                artifact_bytes_max: 16 * 1024 * 1024,
                log_events_max: 1000,
                log_event_bytes_max: 256 * 1024,
                capture_timeout: Duration::from_secs(10),
                node_files: std::sync::Arc::default(),
                launch_limits: store::LaunchLimits::NONE,
                slots_max: 32,
                slots_per_user_max: 32,
                slots_reserved: 0,
                stored_bytes_max: 0,
                retry_copy_bytes_max: 1 << 30,
                event_bounds: store::EventBounds {
                    untaken_max: 1_000,
                    untaken_bytes_max: 8 << 20,
                },
                lease_ms,
                timeout_seconds: 24 * 3600,
                automatic_recovery: false,
                faults: None,
                wake_fallback: Duration::from_secs(1),
                dormant_after: None,
            },
            js_threads: 2,
            js_memory_total_bytes: 512 * 1024 * 1024,
            js_compiled_scripts_max: 32,
            faults: None,
            metrics: Arc::new(Metrics::default()),
            notify: None,
        }
    }
}

/// Stopped-workflow ids kept for a slow [`WorkflowsHandle::stopped`] receiver.
const STOPPED_BACKLOG: usize = 1024;

/// What the node reports about itself.
#[derive(Debug, Clone, Serialize)]
pub struct NodeStatus {
    pub worker_id: String,
    pub version: &'static str,
    pub runtime_version: String,
    /// The digest of this node's agent definitions (what a recovery must match).
    pub configuration_version: String,
    pub uptime_seconds: f64,
}

/// One actor of the live supervision tree, as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct ActorView {
    pub name: String,
    pub id: String,
    pub status: String,
    /// Messages waiting in the mailbox and running in the handler (counted by `mailbox`). For
    /// the store actor, `waiting` also holds the requests waiting for a connection and `running`
    /// the requests the database is serving.
    pub queue: QueueView,
    /// Always 0: no actor is restarted in place. A failed workflow supervisor stops, its lease
    /// lapses, and recovery replays its journal; a failed core actor stops the node.
    pub restarts: u32,
    pub children: Vec<ActorView>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct QueueView {
    pub waiting: u64,
    pub running: u64,
}

/// Messages of the node supervisor.
pub enum NodeMsg {
    Status { reply: RpcReplyPort<NodeStatus> },
    Parts { reply: RpcReplyPort<Parts> },
}

/// The handles of the node's actors.
#[derive(Clone)]
pub struct Parts {
    store: StoreHandle,
    lease: ActorRef<LeaseMsg>,
    runs: RunsHandle,
    workflows: WorkflowsHandle,
    changes: store::Changes,
}

struct NodeSupervisor;

struct NodeArgs {
    identity: NodeIdentity,
    store: Arc<Store>,
    options: NodeOptions,
}

struct NodeState {
    identity: NodeIdentity,
    started_at: Instant,
    parts: Parts,
    /// The replay rules this node runs workflows under.
    runtime_version: String,
    configuration_version: String,
    /// The actors whose end ends the node.
    essential: Vec<ractor::ActorId>,
    /// The task that reads the database's clock again every `clock::SYNC_PERIOD`.
    clock_sync: tokio::task::JoinHandle<()>,
}

impl Drop for NodeState {
    fn drop(&mut self) {
        self.clock_sync.abort();
    }
}

impl Actor for NodeSupervisor {
    type Msg = NodeMsg;
    type State = NodeState;
    type Arguments = NodeArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: NodeArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        let worker_id = args.identity.worker_id.clone();
        let options = args.options;
        let runtime_version = runtime::runtime_version(&options.workflows.limits);
        let configuration_version = options.agents.configuration_version();
        let js = JsPool::new(
            options.js_threads,
            options.js_memory_total_bytes,
            options.js_compiled_scripts_max,
        )?;
        let changes = args.store.changes();
        let (store_actor, _) = Actor::spawn_linked(
            Some(format!("store@{worker_id}")),
            StoreActor,
            StoreArgs {
                store: args.store,
                requests_max: options.store_requests_max,
                metrics: Arc::clone(&options.metrics),
            },
            myself.get_cell(),
        )
        .await?;
        let store = StoreHandle::new(
            store_actor.clone(),
            options.call_timeout,
            options.faults.clone(),
            Arc::clone(&options.metrics),
        );
        // Before any workflow runs here: its timers are measured on the database's clock.
        crate::clock::sync(&store).await;
        let clock_sync = crate::clock::keep_in_sync(store.clone());
        let (lease, _) = Actor::spawn_linked(
            Some(format!("lease@{worker_id}")),
            LeaseActor,
            LeaseArgs {
                store: store.clone(),
                metrics: Arc::clone(&options.metrics),
                worker_id: worker_id.clone(),
                lease_ms: options.runs.lease_ms,
            },
            myself.get_cell(),
        )
        .await?;
        let (child_runs, _) = Actor::spawn_linked(
            Some(format!("child-runs@{worker_id}")),
            ChildRuns,
            ChildRunsArgs {
                store: store.clone(),
                lease: lease.clone(),
                agents: Arc::clone(&options.agents),
                worker_id: worker_id.clone(),
                options: options.runs,
                changes: changes.clone(),
                wake_fallback: options.workflows.wake_fallback,
            },
            myself.get_cell(),
        )
        .await?;
        let runs = RunsHandle::new(child_runs.clone(), store.clone(), options.call_timeout);
        // Not essential: a notifier that stops leaves its claims to lapse, and every other
        // node (or this one after a restart) delivers them; the node's workflows go on.
        if let Some(notify) = options.notify {
            Actor::spawn_linked(
                Some(format!("notifier@{worker_id}")),
                Notifier,
                NotifierArgs {
                    store: store.clone(),
                    metrics: Arc::clone(&options.metrics),
                    worker_id: worker_id.clone(),
                    options: notify,
                },
                myself.get_cell(),
            )
            .await?;
        }
        let stopped = tokio::sync::broadcast::channel(STOPPED_BACKLOG).0;
        let workspaces_dir = options.workflows.workspaces_dir.clone();
        let event_limits = EventLimits {
            payload_bytes_max: options.workflows.limits.frame_bytes_max,
            bounds: options.workflows.event_bounds,
            stored_bytes_max: options.workflows.stored_bytes_max,
        };
        let (workflows, _) = Actor::spawn_linked(
            Some(format!("workflows@{worker_id}")),
            Workflows,
            WorkflowsArgs {
                store: store.clone(),
                runs: runs.clone(),
                js,
                lease: lease.clone(),
                agents: options.agents,
                metrics: options.metrics,
                worker_id,
                options: options.workflows,
                stopped: stopped.clone(),
                changes: changes.clone(),
            },
            myself.get_cell(),
        )
        .await?;
        let essential = vec![
            store_actor.get_id(),
            lease.get_id(),
            child_runs.get_id(),
            workflows.get_id(),
        ];
        Ok(NodeState {
            identity: args.identity,
            started_at: Instant::now(),
            runtime_version,
            configuration_version,
            parts: Parts {
                workflows: WorkflowsHandle::new(
                    workflows,
                    store.clone(),
                    options.call_timeout,
                    stopped,
                    workspaces_dir,
                    event_limits,
                ),
                runs,
                store,
                lease,
                changes,
            },
            essential,
            clock_sync,
        })
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        crate::mailbox::forget(myself.get_id());
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: NodeMsg,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        let _turn = crate::mailbox::turn(&myself);
        match message {
            NodeMsg::Status { reply } => {
                let _ = reply.send(NodeStatus {
                    worker_id: state.identity.worker_id.clone(),
                    version: env!("CARGO_PKG_VERSION"),
                    runtime_version: state.runtime_version.clone(),
                    configuration_version: state.configuration_version.clone(),
                    uptime_seconds: state.started_at.elapsed().as_secs_f64(),
                });
            }
            NodeMsg::Parts { reply } => {
                let _ = reply.send(state.parts.clone());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut NodeState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorTerminated(cell, _, reason)
                if state.essential.contains(&cell.get_id()) =>
            {
                tracing::error!(actor = ?cell.get_name(), ?reason, "an essential actor stopped; stopping the node");
                myself.stop(Some("an essential actor stopped".into()));
            }
            SupervisionEvent::ActorFailed(cell, error)
                if state.essential.contains(&cell.get_id()) =>
            {
                tracing::error!(actor = ?cell.get_name(), %error, "an essential actor failed; stopping the node");
                myself.stop(Some(format!("an essential actor failed: {error}")));
            }
            SupervisionEvent::ActorFailed(cell, error) => {
                tracing::error!(actor = ?cell.get_name(), %error, "an actor failed; the node goes on without it");
            }
            _ => {}
        }
        Ok(())
    }
}

/// A running node: its supervision tree and the handles the rest of the binary uses.
pub struct Node {
    identity: NodeIdentity,
    supervisor: ActorRef<NodeMsg>,
    joined: JoinHandle<()>,
    parts: Parts,
    call_timeout: Duration,
    shutdown_timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Node {
    /// Starts the supervision tree on an opened, migrated store and records the node.
    pub async fn start(
        identity: NodeIdentity,
        store: Arc<Store>,
        options: NodeOptions,
    ) -> Result<Node, Error> {
        let (supervisor, joined) = Actor::spawn(
            Some(format!("node@{}", identity.worker_id)),
            NodeSupervisor,
            NodeArgs {
                identity: identity.clone(),
                store,
                options: options.clone(),
            },
        )
        .await
        .map_err(|e| Error::Spawn {
            actor: "node",
            reason: e.to_string(),
        })?;
        let (call_timeout, shutdown_timeout) = (options.call_timeout, options.shutdown_timeout);
        let parts = match crate::mailbox::call(
            &supervisor,
            |reply| NodeMsg::Parts { reply },
            Some(call_timeout),
        )
        .await
        {
            Ok(ractor::rpc::CallResult::Success(parts)) => parts,
            Ok(_) => {
                return Err(Error::Spawn {
                    actor: "node",
                    reason: "no answer from the node supervisor".into(),
                });
            }
            Err(e) => {
                return Err(Error::Spawn {
                    actor: "node",
                    reason: e.to_string(),
                });
            }
        };
        let store = parts.store.clone();
        store
            .register_node(&NodeRecord {
                worker_id: identity.worker_id.clone(),
                host: identity.host.clone(),
                pid: i64::from(identity.pid),
                version: env!("CARGO_PKG_VERSION").to_owned(),
                started_at: 0.0,
                stopped_at: None,
            })
            .await?;
        tokio::spawn(sweep_orphaned_threads(
            store.clone(),
            options.runs.workspaces_dir.clone(),
        ));
        Ok(Node {
            identity,
            supervisor,
            joined,
            parts,
            call_timeout,
            shutdown_timeout,
            metrics: options.metrics,
        })
    }

    /// This node's identity.
    pub fn identity(&self) -> &NodeIdentity {
        &self.identity
    }

    /// The handle every component uses to reach the database.
    pub fn store(&self) -> StoreHandle {
        self.parts.store.clone()
    }

    /// The change bus: what committed on any node that someone may be waiting for.
    pub fn changes(&self) -> store::Changes {
        self.parts.changes.clone()
    }

    /// The handle that starts and cancels child runs on this node.
    pub fn runs(&self) -> RunsHandle {
        self.parts.runs.clone()
    }

    /// The node's counters and histograms.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// The live supervision tree, from the node supervisor down.
    pub fn actors(&self) -> ActorView {
        self.view(&self.supervisor.get_cell())
    }

    fn view(&self, cell: &ractor::ActorCell) -> ActorView {
        let name = cell.get_name().unwrap_or_else(|| "(unnamed)".to_owned());
        let queue = if name.starts_with("store@") {
            let (waiting, running) = self.metrics.store_queue();
            // Never negative: each is raised before its request is sent.
            QueueView {
                waiting: u64::try_from(waiting).unwrap_or(0),
                running: u64::try_from(running).unwrap_or(0),
            }
        } else {
            let length = crate::mailbox::length(cell.get_id());
            QueueView {
                waiting: length.waiting,
                running: length.running,
            }
        };
        ActorView {
            id: cell.get_id().to_string(),
            status: format!("{:?}", cell.get_status()),
            queue,
            restarts: 0,
            children: cell.get_children().iter().map(|c| self.view(c)).collect(),
            name,
        }
    }

    /// The handle that launches and controls workflows on this node.
    pub fn workflows(&self) -> WorkflowsHandle {
        self.parts.workflows.clone()
    }

    /// The leases this node renews.
    pub async fn leases(&self) -> Result<Vec<LeaseView>, Error> {
        crate::error::ask(&self.parts.lease, "lease", self.call_timeout, |reply| {
            LeaseMsg::Leases { reply }
        })
        .await
    }

    /// The node's own report.
    pub async fn status(&self) -> Result<NodeStatus, Error> {
        crate::error::ask(&self.supervisor, "node", self.call_timeout, |reply| {
            NodeMsg::Status { reply }
        })
        .await
    }

    /// Resolves when the supervision tree has stopped by itself (a fatal failure).
    pub async fn terminated(&mut self) {
        // A join error means the supervisor panicked; the tree is gone either way.
        let _ = (&mut self.joined).await;
    }

    /// Records a clean stop and stops the tree, each step waiting at most the shutdown timeout,
    /// so a hung store cannot hold the process.
    pub async fn shutdown(self) -> Result<(), Error> {
        let recorded = tokio::time::timeout(
            self.shutdown_timeout,
            self.parts.store.mark_node_stopped(&self.identity.worker_id),
        )
        .await
        .unwrap_or_else(|_| {
            Err(store::Error::OutcomeUnknown(
                "recording the clean stop did not finish within the shutdown timeout".into(),
            ))
        });
        // Workflow supervisors stop first, while their child runs still run: a child that ends
        // because its node is going away must not read, to its workflow, as an outcome nobody
        // recorded. The workflows are then left for recovery, as after a crash.
        self.parts
            .workflows
            .stop_supervisors(self.shutdown_timeout)
            .await;
        self.supervisor.stop(Some("shutdown".into()));
        if tokio::time::timeout(self.shutdown_timeout, self.joined)
            .await
            .is_err()
        {
            tracing::warn!("the supervision tree did not stop within the shutdown timeout");
        }
        recorded.map_err(Error::from)
    }
}

/// How old a thread folder of a workflow that does not exist must be before a node's start
/// removes it (see [`crate::workspace::old_workflow_threads`]).
const ORPHANED_THREAD_AGE: Duration = Duration::from_secs(3600);

/// Removes, once at a node's start, the thread folders of workflows that do not exist: what a
/// node killed while copying a retry's workspaces left (the retry was never written), or a
/// deleted workflow's folder whose removal failed. Failures are logged; nothing depends on it.
async fn sweep_orphaned_threads(store: StoreHandle, workspaces_dir: PathBuf) {
    let dir = workspaces_dir.clone();
    let found = tokio::task::spawn_blocking(move || {
        crate::workspace::old_workflow_threads(&dir, ORPHANED_THREAD_AGE)
    })
    .await;
    let candidates = match found {
        Ok(Ok(candidates)) => candidates,
        Ok(Err(error)) => {
            tracing::warn!(%error, "cannot look for orphaned workspaces");
            return;
        }
        Err(error) => {
            tracing::warn!(%error, "looking for orphaned workspaces failed");
            return;
        }
    };
    for (workflow, thread) in candidates {
        match store.read_workflow(&WorkflowId::new(workflow)).await {
            Ok(None) => {
                let dir = workspaces_dir.clone();
                let thread_name = thread.clone();
                let removed = tokio::task::spawn_blocking(move || {
                    crate::workspace::remove_thread(&dir, &thread_name)
                })
                .await;
                match removed {
                    Ok(Ok(())) => {
                        tracing::info!(%thread, "removed the workspace of a workflow that does not exist")
                    }
                    Ok(Err(error)) => {
                        tracing::warn!(%thread, %error, "cannot remove an orphaned workspace")
                    }
                    Err(error) => {
                        tracing::warn!(%thread, %error, "removing an orphaned workspace failed")
                    }
                }
            }
            Ok(Some(_)) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot read a workflow while sweeping workspaces");
                return;
            }
        }
    }
}
