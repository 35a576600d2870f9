//! The JS worker pool: a few OS threads that own the QuickJS runtimes of active workflows. A VM is
//! not `Send`, so each workflow's VM lives on one thread (chosen by its id) for its whole life, and
//! actors talk to it through messages: no JavaScript ever runs in an actor handler. A workflow
//! that parks (waits for a human, a slot, a control) drops its VM here; waking it replays the
//! journal once.
//!
//! The pool bounds the memory of all its VMs together (`js_memory_total_bytes`). A loaded VM
//! holds what it used at the end of its last activation; a running activation holds what it may
//! grow to (its grant: `script_memory_bytes_max`, or less when the total is nearly taken); a
//! parked VM holds nothing. A VM that cannot get the memory to start fails its workflow with a
//! message naming the limit, rather than waiting: the memory it would wait for may be held by
//! workflows that wait on it (for a slot, say), and a wait nobody sees is how a node wedges.
//!
//! A thread serves its jobs fairly between users: every job carries its workflow's owner, and the
//! thread takes one job of each user with work waiting in turn, so that one user's queue of
//! expensive activations (each up to `script_cpu_ms_max`) delays another user's by at most one
//! activation per user ahead of it, not by the whole queue. A workflow's own jobs keep their order.
//!
//! Each thread keeps the bytecode of the last `js_compiled_scripts_max` scripts it compiled
//! (`runtime::ScriptCache`): a launch's compile check and the VM starts of the same script on that
//! thread (the check runs on the thread of the workflow it launches) load it instead of parsing
//! the script again.

use std::collections::{HashMap, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, mpsc};

use runtime::{Activation, CallId, JournalEntry, Limits, Outcome, ScriptCache, Vm, VmOptions};
use serde_json::Value;
use store::WorkflowId;
use tokio::sync::oneshot;

/// What starting a VM needs.
#[derive(Debug, Clone)]
pub struct StartSpec {
    pub script: String,
    pub args: Value,
    pub options: VmOptions,
}

/// An outcome to hand to a VM.
#[derive(Debug, Clone)]
pub struct Settle {
    pub id: CallId,
    pub outcome: Outcome,
    pub at_ms: i64,
}

/// What an activation produced, with the journal entries its settles completed.
#[derive(Debug)]
pub struct Activated {
    pub activation: Activation,
    pub settled: Vec<JournalEntry>,
}

/// Why an activation could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JsError {
    /// The VM could not start (the message names the limit or the compile error).
    #[error("{0}")]
    Start(#[from] runtime::Error),
    /// No VM is loaded for the workflow and no start was given.
    #[error("workflow {0:?} has no runtime loaded")]
    NotLoaded(WorkflowId),
    /// The JS thread panicked while running the workflow; its VM was dropped.
    #[error("the script engine failed while running workflow {0:?}")]
    Crashed(WorkflowId),
    /// The pool has stopped.
    #[error("the JS worker pool has stopped")]
    Stopped,
    /// The node's scripts together hold so much of `js_memory_total_bytes` that another VM
    /// cannot start.
    #[error(
        "no memory for this workflow's script: the node's scripts hold {held} bytes of \
         js_memory_total_bytes ({total}), and a script needs {needed} bytes to start"
    )]
    OutOfMemory { held: u64, total: u64, needed: u64 },
}

/// What a new VM needs at least to install the script API and compile a script (a fresh VM
/// holds about 150 KiB).
pub const VM_START_BYTES_MIN: u64 = 2 * 1024 * 1024;

/// The memory all VMs of the pool may use together.
#[derive(Debug)]
struct MemoryBudget {
    total: u64,
    held: Mutex<u64>,
}

impl MemoryBudget {
    /// Takes up to `wanted` bytes more; returns how many it took.
    fn take(&self, wanted: u64) -> u64 {
        let mut held = self.lock();
        let taken = wanted.min(self.total.saturating_sub(*held));
        *held += taken;
        taken
    }

    fn give(&self, bytes: u64) {
        let mut held = self.lock();
        *held = held.saturating_sub(bytes);
    }

    fn held(&self) -> u64 {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        // A number is never left half-written: a poisoned lock still holds a good one.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A VM on its thread, with the memory it holds of the budget.
struct Loaded {
    vm: Vm,
    held: u64,
    /// Its `script_memory_bytes_max`.
    memory_max: u64,
}

enum Job {
    Activate {
        /// The workflow's owner: whose turn this job takes.
        user: String,
        workflow_id: WorkflowId,
        start: Option<Box<StartSpec>>,
        settles: Vec<Settle>,
        reply: oneshot::Sender<Result<Activated, JsError>>,
    },
    Park {
        user: String,
        workflow_id: WorkflowId,
    },
    Loaded {
        reply: oneshot::Sender<usize>,
    },
    Check {
        user: String,
        script: String,
        limits: Box<Limits>,
        reply: oneshot::Sender<Result<(), runtime::Error>>,
    },
}

/// A handle to the pool; cloning shares the threads.
#[derive(Clone)]
pub struct JsPool {
    workers: Vec<mpsc::Sender<Job>>,
    memory: Arc<MemoryBudget>,
}

impl JsPool {
    /// Starts `threads` JS threads (at least one), whose VMs together use at most
    /// `memory_total_bytes`, each keeping the bytecode of at most `compiled_scripts_max` scripts.
    pub fn new(
        threads: usize,
        memory_total_bytes: u64,
        compiled_scripts_max: usize,
    ) -> std::io::Result<Self> {
        let memory = Arc::new(MemoryBudget {
            total: memory_total_bytes,
            held: Mutex::new(0),
        });
        let mut workers = Vec::new();
        for n in 0..threads.max(1) {
            let (sender, receiver) = mpsc::channel();
            let memory = Arc::clone(&memory);
            std::thread::Builder::new()
                .name(format!("reins-js-{n}"))
                .spawn(move || {
                    serve(
                        receiver,
                        &memory,
                        &mut ScriptCache::new(compiled_scripts_max),
                    )
                })?;
            workers.push(sender);
        }
        Ok(JsPool { workers, memory })
    }

    /// Bytes of `js_memory_total_bytes` the loaded VMs hold now.
    pub fn memory_held_bytes(&self) -> u64 {
        self.memory.held()
    }

    /// Checks that `script` compiles, without running it, on the JS thread of `workflow_id`
    /// (a compile is short and bounded by `script_bytes_max`; no actor's turn waits on it).
    pub async fn check(
        &self,
        workflow_id: &WorkflowId,
        user_id: &str,
        script: String,
        limits: Limits,
    ) -> Result<(), JsError> {
        let (reply, answer) = oneshot::channel();
        self.worker(workflow_id)
            .send(Job::Check {
                user: user_id.to_owned(),
                script,
                limits: Box::new(limits),
                reply,
            })
            .map_err(|_| JsError::Stopped)?;
        Ok(answer.await.map_err(|_| JsError::Stopped)??)
    }

    fn worker(&self, workflow_id: &WorkflowId) -> &mpsc::Sender<Job> {
        let mut hasher = DefaultHasher::new();
        workflow_id.hash(&mut hasher);
        let index = usize::try_from(hasher.finish() % self.workers.len() as u64).unwrap_or(0);
        &self.workers[index]
    }

    /// Hands `settles` to the VM of `workflow_id`, owned by `user_id` (starting it from `start`
    /// if none is loaded) and runs one activation.
    pub async fn activate(
        &self,
        workflow_id: &WorkflowId,
        user_id: &str,
        start: Option<StartSpec>,
        settles: Vec<Settle>,
    ) -> Result<Activated, JsError> {
        let (reply, answer) = oneshot::channel();
        self.worker(workflow_id)
            .send(Job::Activate {
                user: user_id.to_owned(),
                workflow_id: workflow_id.to_owned(),
                start: start.map(Box::new),
                settles,
                reply,
            })
            .map_err(|_| JsError::Stopped)?;
        answer.await.map_err(|_| JsError::Stopped)?
    }

    /// Drops the VM of `workflow_id`, owned by `user_id`; the next activation must start
    /// (replay) it again.
    pub fn park(&self, workflow_id: &WorkflowId, user_id: &str) {
        // A stopped pool holds no VM to drop.
        let _ = self.worker(workflow_id).send(Job::Park {
            user: user_id.to_owned(),
            workflow_id: workflow_id.to_owned(),
        });
    }

    /// How many VMs are loaded across the pool.
    pub async fn loaded(&self) -> usize {
        let mut total = 0;
        for worker in &self.workers {
            let (reply, answer) = oneshot::channel();
            if worker.send(Job::Loaded { reply }).is_ok() {
                total += answer.await.unwrap_or(0);
            }
        }
        total
    }
}

impl Job {
    /// Whose turn the job takes; the pool's own questions (`Loaded`) take a turn of their own.
    fn user(&self) -> &str {
        match self {
            Job::Activate { user, .. } | Job::Park { user, .. } | Job::Check { user, .. } => user,
            Job::Loaded { .. } => "",
        }
    }
}

/// The jobs a thread has received and not yet run, one queue per user, served in turn.
#[derive(Default)]
struct FairQueues {
    by_user: HashMap<String, VecDeque<Job>>,
    /// The users with jobs waiting, in the order their turns come.
    turns: VecDeque<String>,
}

impl FairQueues {
    fn push(&mut self, job: Job) {
        let queue = self.by_user.entry(job.user().to_owned()).or_default();
        if queue.is_empty() {
            self.turns.push_back(job.user().to_owned());
        }
        queue.push_back(job);
    }

    /// The next user's oldest job; that user, if more of theirs wait, goes to the back.
    fn pop(&mut self) -> Option<Job> {
        let user = self.turns.pop_front()?;
        let queue = self.by_user.get_mut(&user)?;
        let job = queue.pop_front();
        if queue.is_empty() {
            self.by_user.remove(&user);
        } else {
            self.turns.push_back(user);
        }
        job
    }
}

/// One JS thread: owns the VMs of the workflows hashed to it, and serves its jobs fairly between
/// users (see the module's documentation).
fn serve(jobs: mpsc::Receiver<Job>, memory: &MemoryBudget, scripts: &mut ScriptCache) {
    let mut vms: HashMap<WorkflowId, Loaded> = HashMap::new();
    let mut waiting = FairQueues::default();
    loop {
        if waiting.turns.is_empty() {
            match jobs.recv() {
                Ok(job) => waiting.push(job),
                Err(_) => return,
            }
        }
        // Everything already sent joins the queues before the next turn is chosen.
        while let Ok(job) = jobs.try_recv() {
            waiting.push(job);
        }
        let Some(job) = waiting.pop() else {
            continue;
        };
        match job {
            Job::Activate {
                user: _,
                workflow_id,
                start,
                settles,
                reply,
            } => {
                let result = catch_unwind(AssertUnwindSafe(|| {
                    activate(&mut vms, memory, scripts, &workflow_id, start, settles)
                }))
                .unwrap_or_else(|_| {
                    if let Some(loaded) = vms.remove(&workflow_id) {
                        memory.give(loaded.held);
                    }
                    Err(JsError::Crashed(workflow_id.clone()))
                });
                // The caller may have gone away; the VM stays loaded for its next activation.
                let _ = reply.send(result);
            }
            Job::Park {
                user: _,
                workflow_id,
            } => {
                if let Some(loaded) = vms.remove(&workflow_id) {
                    memory.give(loaded.held);
                }
            }
            Job::Loaded { reply } => {
                let _ = reply.send(vms.len());
            }
            Job::Check {
                user: _,
                script,
                limits,
                reply,
            } => {
                let result = catch_unwind(AssertUnwindSafe(|| scripts.check(&script, &limits)))
                    .unwrap_or_else(|_| Err(runtime::Error::Engine("the compiler failed".into())));
                let _ = reply.send(result);
            }
        }
    }
}

fn activate(
    vms: &mut HashMap<WorkflowId, Loaded>,
    memory: &MemoryBudget,
    scripts: &mut ScriptCache,
    workflow_id: &WorkflowId,
    start: Option<Box<StartSpec>>,
    settles: Vec<Settle>,
) -> Result<Activated, JsError> {
    if let Some(loaded) = vms.get_mut(workflow_id) {
        // Room to grow in this activation, as far as the budget allows.
        loaded.held += memory.take(loaded.memory_max.saturating_sub(loaded.held));
        loaded.vm.set_memory_grant(loaded.held);
    } else {
        let spec = start.ok_or_else(|| JsError::NotLoaded(workflow_id.to_owned()))?;
        let memory_max = spec.options.limits.script_memory_bytes_max;
        let granted = memory.take(memory_max);
        let needed = VM_START_BYTES_MIN.min(memory_max);
        if granted < needed {
            memory.give(granted);
            return Err(JsError::OutOfMemory {
                held: memory.held(),
                total: memory.total,
                needed,
            });
        }
        let vm = match Vm::start_within(&spec.script, &spec.args, spec.options, granted, scripts) {
            Ok(vm) => vm,
            Err(error) => {
                memory.give(granted);
                return Err(error.into());
            }
        };
        vms.insert(
            workflow_id.to_owned(),
            Loaded {
                vm,
                held: granted,
                memory_max,
            },
        );
    }
    let loaded = vms
        .get_mut(workflow_id)
        .ok_or_else(|| JsError::NotLoaded(workflow_id.to_owned()))?;
    let settled = settles
        .into_iter()
        .filter_map(|settle| loaded.vm.settle(settle.id, settle.outcome, settle.at_ms))
        .collect();
    let activation = loaded.vm.run();
    if activation.status == runtime::Status::Waiting {
        // Between activations the VM holds what it uses: it allocates nothing until it runs.
        let used = loaded.vm.memory_bytes();
        let kept = used.min(loaded.held);
        memory.give(loaded.held - kept);
        loaded.held = kept;
    } else if let Some(loaded) = vms.remove(workflow_id) {
        // A finished run needs its runtime no more.
        memory.give(loaded.held);
    }
    Ok(Activated {
        activation,
        settled,
    })
}

#[cfg(test)]
mod tests {
    use runtime::{Limits, Status};
    use serde_json::json;

    use super::*;

    fn spec(journal: Vec<JournalEntry>) -> StartSpec {
        StartSpec {
            script: r#"const a = await agent({stepId: "a", agentRef: "x", task: args.n});
                       return a.v + 1;"#
                .into(),
            args: json!({"n": 1}),
            options: VmOptions {
                limits: Limits::default(),
                seed: 1,
                started_at_ms: 0,
                journal,
                logged_bytes: 0,
            },
        }
    }

    #[tokio::test]
    async fn a_vm_lives_on_its_thread_between_activations_and_parking_drops_it() {
        let pool = JsPool::new(2, 1 << 30, 8).expect("pool");
        let first = pool
            .activate(&WorkflowId::from("wf"), "u", Some(spec(vec![])), vec![])
            .await
            .expect("start");
        assert_eq!(first.activation.status, Status::Waiting);
        let command = first.activation.commands[0].clone();
        assert_eq!(pool.loaded().await, 1);

        let settle = Settle {
            id: command.id,
            outcome: Outcome::Resolved(json!({"v": 41})),
            at_ms: 5,
        };
        let done = pool
            .activate(&WorkflowId::from("wf"), "u", None, vec![settle.clone()])
            .await
            .expect("run");
        assert_eq!(done.activation.status, Status::Completed(json!(42)));
        assert_eq!(done.settled.len(), 1);
        assert_eq!(pool.loaded().await, 0, "a finished run keeps no runtime");

        // Parked in the middle, then woken: the journal replays and nothing runs twice.
        let again = pool
            .activate(&WorkflowId::from("wf-2"), "u", Some(spec(vec![])), vec![])
            .await
            .expect("start");
        pool.park(&WorkflowId::from("wf-2"), "u");
        assert_eq!(pool.loaded().await, 0);
        assert_eq!(
            pool.activate(&WorkflowId::from("wf-2"), "u", None, vec![])
                .await
                .err(),
            Some(JsError::NotLoaded("wf-2".into()))
        );
        let mut journal = again.activation.journal;
        journal[0].outcome = Some(Outcome::Resolved(json!({"v": 1})));
        journal[0].settled_at_ms = Some(9);
        let woken = pool
            .activate(&WorkflowId::from("wf-2"), "u", Some(spec(journal)), vec![])
            .await
            .expect("replay");
        assert!(woken.activation.commands.is_empty(), "a replay ran a step");
        assert_eq!(woken.activation.status, Status::Completed(json!(2)));
    }

    fn park_of(user: &str, workflow: &str) -> Job {
        Job::Park {
            user: user.into(),
            workflow_id: WorkflowId::from(workflow),
        }
    }

    fn workflow_of(job: &Job) -> String {
        match job {
            Job::Park { workflow_id, .. } => workflow_id.to_string(),
            _ => String::new(),
        }
    }

    /// Issue 29, item 8: one user's queue of jobs no longer goes ahead of another user's job in
    /// full: users take turns, and each user's jobs keep their order.
    #[test]
    fn users_take_turns_and_each_users_jobs_keep_their_order() {
        let mut queues = FairQueues::default();
        for n in 1..=4 {
            queues.push(park_of("a", &format!("a{n}")));
        }
        queues.push(park_of("b", "b1"));
        queues.push(park_of("c", "c1"));
        queues.push(park_of("b", "b2"));
        let order: Vec<_> = std::iter::from_fn(|| queues.pop())
            .map(|job| workflow_of(&job))
            .collect();
        assert_eq!(order, ["a1", "b1", "c1", "a2", "b2", "a3", "a4"]);
        assert!(queues.by_user.is_empty() && queues.turns.is_empty());
    }

    /// Through a real JS thread: while one user's long activation runs, four more of theirs and
    /// one of another user's queue up; the other user's runs right after the running one.
    #[tokio::test]
    async fn another_users_activation_does_not_wait_for_a_users_whole_queue() {
        let pool = JsPool::new(1, 1 << 30, 8).expect("pool");
        let busy = r#"let x = 0; for (let i = 0; i < 3000000; i++) { x += i % 7; } return x;"#;
        let (done, mut finished) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        let start = |name: &'static str, user: &'static str, body: &'static str| {
            let (pool, done) = (pool.clone(), done.clone());
            tokio::spawn(async move {
                let activated = pool
                    .activate(&WorkflowId::from(name), user, Some(script(body)), vec![])
                    .await
                    .expect("activation");
                assert!(matches!(activated.activation.status, Status::Completed(_)));
                done.send(name).expect("order");
            })
        };
        tasks.push(start("a0", "alice", busy));
        // The first activation is running on the thread before the rest are sent.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        for name in ["a1", "a2", "a3", "a4"] {
            tasks.push(start(name, "alice", busy));
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        tasks.push(start("b0", "bob", "return 1;"));
        for task in tasks {
            task.await.expect("task");
        }
        drop(done);
        let mut order = Vec::new();
        while let Some(name) = finished.recv().await {
            order.push(name);
        }
        let bob = order
            .iter()
            .position(|name| *name == "b0")
            .expect("bob ran");
        assert!(
            bob <= 2,
            "bob's activation waited for alice's queue: {order:?}"
        );
    }

    #[tokio::test]
    async fn a_script_over_a_limit_is_refused_at_start() {
        let pool = JsPool::new(1, 1 << 30, 8).expect("pool");
        let mut too_big = spec(vec![]);
        too_big.options.limits.script_bytes_max = 10;
        let refused = pool
            .activate(&WorkflowId::from("wf"), "u", Some(too_big), vec![])
            .await;
        assert!(
            matches!(&refused, Err(JsError::Start(e)) if e.to_string().contains("script_bytes_max")),
            "{refused:?}"
        );
    }

    fn script(script: &str) -> StartSpec {
        StartSpec {
            script: script.into(),
            ..spec(vec![])
        }
    }

    #[tokio::test]
    async fn the_pools_scripts_together_stay_within_the_memory_total() {
        const MIB: u64 = 1024 * 1024;
        let pool = JsPool::new(2, 13 * MIB / 2, 8).expect("pool");
        // About 5 MiB held while it waits for its agent: the array's 4 MB, the engine's own
        // quarter MiB, and the allocator's arenas around them (bytes allocated, not estimated).
        let hungry = r#"const big = new Array(250000).fill(1.5);
                        await agent({stepId: "a", agentRef: "x", task: 1});
                        return big.length;"#;
        let first = pool
            .activate(&WorkflowId::from("a"), "u", Some(script(hungry)), vec![])
            .await
            .expect("a");
        assert_eq!(first.activation.status, Status::Waiting);
        let held = pool.memory_held_bytes();
        assert!((4 * MIB..11 * MIB / 2).contains(&held), "{held}");

        // Less than a start needs is left: refused, naming the limit, and nothing is held for it.
        let small = r#"await agent({stepId: "a", agentRef: "x", task: 1});
                       const more = new Array(250000).fill(2.5);
                       return more.length;"#;
        let refused = pool
            .activate(&WorkflowId::from("b"), "u", Some(script(small)), vec![])
            .await;
        assert!(
            matches!(&refused, Err(e @ JsError::OutOfMemory { .. }) if e.to_string().contains("js_memory_total_bytes")),
            "{refused:?}"
        );
        assert_eq!(pool.memory_held_bytes(), held);

        // A parked VM holds nothing: now it starts.
        pool.park(&WorkflowId::from("a"), "u");
        assert_eq!(pool.loaded().await, 0);
        assert_eq!(pool.memory_held_bytes(), 0);
        let b = pool
            .activate(&WorkflowId::from("b"), "u", Some(script(small)), vec![])
            .await
            .expect("b");
        // a comes back and holds its 5 MiB again; b, woken, can grow only into what is left.
        let a = pool
            .activate(&WorkflowId::from("a"), "u", Some(script(hungry)), vec![])
            .await
            .expect("a again");
        assert_eq!(a.activation.status, Status::Waiting);
        let settle = Settle {
            id: b.activation.commands[0].id,
            outcome: Outcome::Resolved(json!({"v": 1})),
            at_ms: 5,
        };
        let grown = pool
            .activate(&WorkflowId::from("b"), "u", None, vec![settle])
            .await
            .expect("b runs");
        assert!(
            matches!(&grown.activation.status, Status::Failed(m) if m.contains("js_memory_total_bytes")),
            "{:?}",
            grown.activation.status
        );
        // Everything given back when the runs end.
        let settle = Settle {
            id: a.activation.commands[0].id,
            outcome: Outcome::Resolved(json!({"v": 1})),
            at_ms: 5,
        };
        let done = pool
            .activate(&WorkflowId::from("a"), "u", None, vec![settle])
            .await
            .expect("a ends");
        assert_eq!(done.activation.status, Status::Completed(json!(250000)));
        assert_eq!(pool.memory_held_bytes(), 0);
    }
}
