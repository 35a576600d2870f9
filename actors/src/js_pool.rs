//! The JS worker pool: a few OS threads that own the QuickJS runtimes of active workflows. A VM is
//! not `Send`, so each workflow's VM lives on one thread (chosen by its id) for its whole life, and
//! actors talk to it through messages: no JavaScript ever runs in an actor handler. A workflow
//! that parks (waits for a human, a slot, a control) drops its VM here; waking it replays the
//! journal once.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc;

use runtime::{Activation, CallId, JournalEntry, Outcome, Vm, VmOptions};
use serde_json::Value;
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
    NotLoaded(String),
    /// The JS thread panicked while running the workflow; its VM was dropped.
    #[error("the script engine failed while running workflow {0:?}")]
    Crashed(String),
    /// The pool has stopped.
    #[error("the JS worker pool has stopped")]
    Stopped,
}

enum Job {
    Activate {
        workflow_id: String,
        start: Option<Box<StartSpec>>,
        settles: Vec<Settle>,
        reply: oneshot::Sender<Result<Activated, JsError>>,
    },
    Park {
        workflow_id: String,
    },
    Loaded {
        reply: oneshot::Sender<usize>,
    },
}

/// A handle to the pool; cloning shares the threads.
#[derive(Clone)]
pub struct JsPool {
    workers: Vec<mpsc::Sender<Job>>,
}

impl JsPool {
    /// Starts `threads` JS threads (at least one).
    pub fn new(threads: usize) -> std::io::Result<Self> {
        let mut workers = Vec::new();
        for n in 0..threads.max(1) {
            let (sender, receiver) = mpsc::channel();
            std::thread::Builder::new()
                .name(format!("reins-js-{n}"))
                .spawn(move || serve(receiver))?;
            workers.push(sender);
        }
        Ok(JsPool { workers })
    }

    fn worker(&self, workflow_id: &str) -> &mpsc::Sender<Job> {
        let mut hasher = DefaultHasher::new();
        workflow_id.hash(&mut hasher);
        let index = usize::try_from(hasher.finish() % self.workers.len() as u64).unwrap_or(0);
        &self.workers[index]
    }

    /// Hands `settles` to the workflow's VM (starting it from `start` if none is loaded) and runs
    /// one activation.
    pub async fn activate(
        &self,
        workflow_id: &str,
        start: Option<StartSpec>,
        settles: Vec<Settle>,
    ) -> Result<Activated, JsError> {
        let (reply, answer) = oneshot::channel();
        self.worker(workflow_id)
            .send(Job::Activate {
                workflow_id: workflow_id.to_owned(),
                start: start.map(Box::new),
                settles,
                reply,
            })
            .map_err(|_| JsError::Stopped)?;
        answer.await.map_err(|_| JsError::Stopped)?
    }

    /// Drops the workflow's VM; the next activation must start (replay) it again.
    pub fn park(&self, workflow_id: &str) {
        // A stopped pool holds no VM to drop.
        let _ = self.worker(workflow_id).send(Job::Park {
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

/// One JS thread: owns the VMs of the workflows hashed to it.
fn serve(jobs: mpsc::Receiver<Job>) {
    let mut vms: HashMap<String, Vm> = HashMap::new();
    while let Ok(job) = jobs.recv() {
        match job {
            Job::Activate {
                workflow_id,
                start,
                settles,
                reply,
            } => {
                let result = catch_unwind(AssertUnwindSafe(|| {
                    activate(&mut vms, &workflow_id, start, settles)
                }))
                .unwrap_or_else(|_| {
                    vms.remove(&workflow_id);
                    Err(JsError::Crashed(workflow_id.clone()))
                });
                // The caller may have gone away; the VM stays loaded for its next activation.
                let _ = reply.send(result);
            }
            Job::Park { workflow_id } => {
                vms.remove(&workflow_id);
            }
            Job::Loaded { reply } => {
                let _ = reply.send(vms.len());
            }
        }
    }
}

fn activate(
    vms: &mut HashMap<String, Vm>,
    workflow_id: &str,
    start: Option<Box<StartSpec>>,
    settles: Vec<Settle>,
) -> Result<Activated, JsError> {
    if !vms.contains_key(workflow_id) {
        let spec = start.ok_or_else(|| JsError::NotLoaded(workflow_id.to_owned()))?;
        let vm = Vm::start(&spec.script, &spec.args, spec.options)?;
        vms.insert(workflow_id.to_owned(), vm);
    }
    let vm = vms
        .get_mut(workflow_id)
        .ok_or_else(|| JsError::NotLoaded(workflow_id.to_owned()))?;
    let settled = settles
        .into_iter()
        .filter_map(|settle| vm.settle(settle.id, settle.outcome, settle.at_ms))
        .collect();
    let activation = vm.run();
    if activation.status != runtime::Status::Waiting {
        // A finished run needs its runtime no more.
        vms.remove(workflow_id);
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
            },
        }
    }

    #[tokio::test]
    async fn a_vm_lives_on_its_thread_between_activations_and_parking_drops_it() {
        let pool = JsPool::new(2).expect("pool");
        let first = pool
            .activate("wf", Some(spec(vec![])), vec![])
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
            .activate("wf", None, vec![settle.clone()])
            .await
            .expect("run");
        assert_eq!(done.activation.status, Status::Completed(json!(42)));
        assert_eq!(done.settled.len(), 1);
        assert_eq!(pool.loaded().await, 0, "a finished run keeps no runtime");

        // Parked in the middle, then woken: the journal replays and nothing runs twice.
        let again = pool
            .activate("wf-2", Some(spec(vec![])), vec![])
            .await
            .expect("start");
        pool.park("wf-2");
        assert_eq!(pool.loaded().await, 0);
        assert_eq!(
            pool.activate("wf-2", None, vec![]).await.err(),
            Some(JsError::NotLoaded("wf-2".into()))
        );
        let mut journal = again.activation.journal;
        journal[0].outcome = Some(Outcome::Resolved(json!({"v": 1})));
        journal[0].settled_at_ms = Some(9);
        let woken = pool
            .activate("wf-2", Some(spec(journal)), vec![])
            .await
            .expect("replay");
        assert!(woken.activation.commands.is_empty(), "a replay ran a step");
        assert_eq!(woken.activation.status, Status::Completed(json!(2)));
    }

    #[tokio::test]
    async fn a_script_over_a_limit_is_refused_at_start() {
        let pool = JsPool::new(1).expect("pool");
        let mut too_big = spec(vec![]);
        too_big.options.limits.script_bytes_max = 10;
        let refused = pool.activate("wf", Some(too_big), vec![]).await;
        assert!(
            matches!(&refused, Err(JsError::Start(e)) if e.to_string().contains("script_bytes_max")),
            "{refused:?}"
        );
    }
}
