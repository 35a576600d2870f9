//! Group commit on PostgreSQL. The writes every step makes (fenced journal writes, admissions,
//! child runs' ends) go to a few writer tasks instead of each taking a connection and a
//! transaction of its own. A writer takes what is waiting, up to `pg_batch_max`, and sends it as
//! one pipelined transaction: `BEGIN`, each write's statements in turn (a fenced write's still
//! led by its own fence), `COMMIT`. One commit, and the server's one wait for its flush, then
//! stand for many writes: measured on a replica of a step's statements, the server's CPU per
//! step fell to some 40% of one transaction per write.
//!
//! A batch is all or nothing, and nothing is guessed:
//! - every statement answered and the commit too: each write gets its own answer;
//! - the server refused any statement (an error with a SQLSTATE: a lost fence, a taken slot, a
//!   conflict, a deadlock), or refused the commit with an `ERROR`: that aborted the whole
//!   transaction, so nothing of the batch was written, and each write is run again alone, exactly
//!   as it would have run without the batch, for its own answer;
//! - an answer that never came (the connection broke), or a session the server ended in the
//!   commit's place (`FATAL`: it may come after the commit is durable): every write of the batch
//!   has an unknown outcome, as a write alone would have had;
//! - no connection, or `BEGIN` failed: each write gets what a write alone gets for that (the
//!   pool's error; `begin_error`).
//!
//! Writes are ordered by the workflow whose rows they lock, so two batches that share
//! workflows lock their rows in the same order.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use deadpool_postgres::{Object, Pool};
use futures_util::future::join_all;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_postgres::Statement;

use super::conn::connection;
use super::run_writes::{
    AdmitAnswers, AdmitStatements, FINALIZE_SQL, Finalize, admit_alone, admit_body, admit_outcome,
    finalize_alone, finalize_body, prepare_admit,
};
use super::{
    FencedStatements, begin_error, fenced_alone, fenced_body, prepare_fenced, session_ended,
};
use crate::batches::BatchCounts;
use crate::lease::Fence;
use crate::runs::{Admission, NewRun};
use crate::write::WriteOp;
use crate::{Error, Result};

/// One write a batch carries, with where its answer goes.
pub(super) enum Job {
    Fenced {
        fence: Fence,
        ops: Vec<WriteOp>,
        reply: oneshot::Sender<Result<()>>,
    },
    /// An admission of a workflow's step (a run of no workflow is never batched).
    Admit {
        run: NewRun,
        reply: oneshot::Sender<Result<Admission>>,
    },
    Finalize {
        end: Finalize,
        reply: oneshot::Sender<Result<bool>>,
    },
}

/// A job's statements, prepared on the batch's connection.
enum Prepared {
    Fenced(FencedStatements),
    Admit(AdmitStatements),
    Finalize(Statement),
}

/// What a job's statements answered inside the batch.
enum Answers {
    Fenced(std::result::Result<(), tokio_postgres::Error>),
    Admit(AdmitAnswers),
    Finalize(std::result::Result<u64, tokio_postgres::Error>),
}

impl Answers {
    fn first_error(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Answers::Fenced(answer) => answer.as_ref().err(),
            Answers::Admit(answers) => answers.first_error(),
            Answers::Finalize(answer) => answer.as_ref().err(),
        }
    }
}

type Body<'a> = Pin<Box<dyn Future<Output = Answers> + Send + 'a>>;

impl Job {
    /// The workflow whose rows the job locks first (a child run's end locks its run's row).
    fn order_key(&self) -> &str {
        match self {
            Job::Fenced { fence, .. } => fence.resource_id.as_str(),
            Job::Admit { run, .. } => run
                .step
                .as_ref()
                .map_or(run.run_id.as_str(), |step| step.workflow_id.as_str()),
            Job::Finalize { end, .. } => end.run_id.as_str(),
        }
    }

    async fn prepare(&self, client: &Object) -> Result<Prepared> {
        Ok(match self {
            Job::Fenced { ops, .. } => Prepared::Fenced(prepare_fenced(client, ops).await?),
            Job::Admit { run, .. } => {
                let step = run.step.as_ref().ok_or_else(|| {
                    Error::Database("an admission of no workflow is never batched".into())
                })?;
                Prepared::Admit(prepare_admit(client, step).await?)
            }
            Job::Finalize { .. } => Prepared::Finalize(client.prepare_cached(FINALIZE_SQL).await?),
        })
    }

    /// Sends the job's statements (the first poll sends them all).
    fn body<'a>(&'a self, client: &'a Object, prepared: &'a Prepared) -> Option<Body<'a>> {
        Some(match (self, prepared) {
            (Job::Fenced { fence, ops, .. }, Prepared::Fenced(statements)) => {
                Box::pin(async move {
                    Answers::Fenced(fenced_body(client, statements, fence, ops).await)
                })
            }
            (Job::Admit { run, .. }, Prepared::Admit(statements)) => {
                let step = run.step.as_ref()?;
                Box::pin(
                    async move { Answers::Admit(admit_body(client, statements, run, step).await) },
                )
            }
            (Job::Finalize { end, .. }, Prepared::Finalize(statement)) => {
                Box::pin(
                    async move { Answers::Finalize(finalize_body(client, statement, end).await) },
                )
            }
            _ => return None,
        })
    }

    /// Answers the job from its committed batch. A write of a committed batch is never answered
    /// as failed: where its answer cannot be read, its outcome is unknown.
    fn committed(self, answers: Answers) {
        match (self, answers) {
            (Job::Fenced { reply, .. }, Answers::Fenced(_)) => {
                let _ = reply.send(Ok(()));
            }
            (Job::Admit { run, reply }, Answers::Admit(answers)) => {
                let answer = match &run.step {
                    Some(step) => admit_outcome(answers, step, Ok(())),
                    None => Err(Error::OutcomeUnknown(
                        "an admission of no workflow in a committed batch".into(),
                    )),
                };
                let _ = reply.send(answer);
            }
            (Job::Finalize { reply, .. }, Answers::Finalize(changed)) => {
                let _ = reply.send(Ok(changed.is_ok_and(|n| n == 1)));
            }
            // Never so (each job's answers come from its own body), and the batch committed:
            // what the job's write did is not known from here.
            (job, _) => job.failed(Error::OutcomeUnknown(
                "a committed batch answered out of order".into(),
            )),
        }
    }

    fn failed(self, error: Error) {
        match self {
            Job::Fenced { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Job::Admit { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            Job::Finalize { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }

    /// Runs the job in a transaction of its own, as it runs without batches.
    async fn alone(self, pool: &Pool) {
        match self {
            Job::Fenced { fence, ops, reply } => {
                let _ = reply.send(fenced_alone(pool, &fence, &ops).await);
            }
            Job::Admit { run, reply } => {
                let _ = reply.send(admit_alone(pool, &run).await);
            }
            Job::Finalize { end, reply } => {
                let _ = reply.send(finalize_alone(pool, &end).await);
            }
        }
    }
}

/// The queue of writes and the writer tasks that empty it.
pub(super) struct Batcher {
    jobs: mpsc::Sender<Job>,
    counts: Arc<BatchCounts>,
}

impl Batcher {
    /// Starts `writers` tasks, each committing up to `batch_max` writes at a time; at most
    /// `queue_max` writes wait before callers are made to wait.
    pub(super) fn start(pool: Pool, writers: usize, batch_max: usize, queue_max: usize) -> Batcher {
        let (jobs, queue) = mpsc::channel(queue_max.max(1));
        let queue = Arc::new(Mutex::new(queue));
        let counts = Arc::new(BatchCounts::default());
        for _ in 0..writers.max(1) {
            tokio::spawn(write(
                pool.clone(),
                Arc::clone(&queue),
                batch_max.max(1),
                Arc::clone(&counts),
            ));
        }
        Batcher { jobs, counts }
    }

    /// Queues the job `make` builds around its reply, and waits for its answer.
    pub(super) async fn submit<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Job,
    ) -> Result<T> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(make(reply))
            .await
            .map_err(|_| Error::Unavailable("the PostgreSQL writers have stopped".into()))?;
        answer.await.map_err(|_| {
            Error::OutcomeUnknown("a PostgreSQL writer stopped before answering".into())
        })?
    }

    /// Batches of more than one write so far, and the writes they carried.
    pub(super) fn counts(&self) -> (u64, u64) {
        self.counts.load()
    }
}

/// A writer: takes the next write, and whatever else waits up to `batch_max`, and commits them.
/// Ends when the store is dropped.
async fn write(
    pool: Pool,
    queue: Arc<Mutex<mpsc::Receiver<Job>>>,
    batch_max: usize,
    counts: Arc<BatchCounts>,
) {
    loop {
        let batch = {
            let mut queue = queue.lock().await;
            let Some(first) = queue.recv().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < batch_max {
                match queue.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            batch
        };
        counts.record(batch.len());
        run(&pool, batch).await;
    }
}

/// Commits `jobs` together (see the module's documentation for what each answer means).
async fn run(pool: &Pool, mut jobs: Vec<Job>) {
    if jobs.len() == 1 {
        if let Some(job) = jobs.pop() {
            job.alone(pool).await;
        }
        return;
    }
    jobs.sort_by(|a, b| a.order_key().cmp(b.order_key()));
    // Nothing is sent before every job's statements are prepared. Without a connection nothing
    // was sent at all: each job gets what it would have got alone.
    let client = match connection(pool).await {
        Ok(client) => client,
        Err(error) => {
            for job in jobs {
                job.failed(error.clone());
            }
            return;
        }
    };
    // A statement that cannot be prepared leaves every job to run alone, for its own answer.
    let mut prepared = Vec::with_capacity(jobs.len());
    for job in &jobs {
        match job.prepare(&client).await {
            Ok(statements) => prepared.push(statements),
            Err(_) => {
                drop(client);
                return each_alone(pool, jobs).await;
            }
        }
    }
    let Some(bodies) = jobs
        .iter()
        .zip(&prepared)
        .map(|(job, statements)| job.body(&client, statements))
        .collect::<Option<Vec<_>>>()
    else {
        drop(client);
        return each_alone(pool, jobs).await;
    };
    let (begun, answers, committed) = tokio::join!(
        client.batch_execute("BEGIN"),
        in_order(bodies),
        client.batch_execute("COMMIT"),
    );
    drop(prepared);
    drop(client);
    if let Err(error) = begun {
        let error = begin_error(error);
        for job in jobs {
            job.failed(error.clone());
        }
        return;
    }
    let unknown = match (answers.iter().find_map(Answers::first_error), &committed) {
        (None, Ok(())) => {
            for (job, answers) in jobs.into_iter().zip(answers) {
                job.committed(answers);
            }
            return;
        }
        // A statement the server refused (any SQLSTATE) aborted the transaction, or ended the
        // session before the COMMIT was read: nothing of the batch was written.
        (Some(error), _) if error.code().is_some() => None,
        // A COMMIT refused with an `ERROR` rolled back; one that ended the session may have
        // committed.
        (None, Err(error)) if error.code().is_some() && !session_ended(error) => None,
        (Some(error), _) | (None, Err(error)) => Some(error.to_string()),
    };
    match unknown {
        None => each_alone(pool, jobs).await,
        Some(why) => {
            let unknown = Error::OutcomeUnknown(format!("a batch's commit went unanswered: {why}"));
            for job in jobs {
                job.failed(unknown.clone());
            }
        }
    }
}

/// Polls every body, in order, each time it is polled, until all are done. A body's first poll
/// sends all its statements, so the batch's statements go out in the jobs' order, between the
/// `BEGIN` polled before and the `COMMIT` polled after, however many jobs there are.
async fn in_order(mut bodies: Vec<Body<'_>>) -> Vec<Answers> {
    let mut answers: Vec<Option<Answers>> = bodies.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (body, answer) in bodies.iter_mut().zip(answers.iter_mut()) {
            if answer.is_none() {
                match body.as_mut().poll(cx) {
                    std::task::Poll::Ready(answered) => *answer = Some(answered),
                    std::task::Poll::Pending => done = false,
                }
            }
        }
        if done {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    answers.into_iter().flatten().collect()
}

/// Runs each job alone, each on a connection of its own.
async fn each_alone(pool: &Pool, jobs: Vec<Job>) {
    join_all(jobs.into_iter().map(|job| job.alone(pool))).await;
}
