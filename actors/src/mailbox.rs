//! Queue lengths for every actor.
//!
//! ractor keeps no count of the messages in a mailbox, so this crate counts them itself: every
//! send goes through [`Post`], which adds the message to the receiving actor's [`Queue`] before
//! it is delivered, and every handler opens a [`turn`] as it takes a message. Clippy's
//! `disallowed-methods` (`clippy.toml`) refuses ractor's own send methods, so a new send site
//! cannot skip the count.
//!
//! The queues live in one process-wide table keyed by [`ActorId`] (ractor's ids are unique in the
//! process, across nodes), so a message can be counted from anywhere that holds an `ActorRef`.
//! An actor's entry is removed when it stops ([`forget`], called from every `post_stop`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use ractor::concurrency::JoinHandle;
use ractor::rpc::CallResult;
use ractor::{ActorCell, ActorId, ActorRef, DerivedActorRef, Message, MessagingErr, RpcReplyPort};

/// The messages sent to one actor, taken by its handler, and finished.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    sent: AtomicU64,
    taken: AtomicU64,
    finished: AtomicU64,
}

/// How many messages wait in an actor's mailbox, and how many its handler is running (0 or 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueLength {
    pub waiting: u64,
    pub running: u64,
}

impl Queue {
    fn sent(&self) {
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    fn length(&self) -> QueueLength {
        // Read in the reverse order of the updates so that no figure goes below zero.
        let finished = self.finished.load(Ordering::Relaxed);
        let taken = self.taken.load(Ordering::Relaxed);
        let sent = self.sent.load(Ordering::Relaxed);
        QueueLength {
            waiting: sent.saturating_sub(taken),
            running: taken.saturating_sub(finished),
        }
    }
}

static QUEUES: LazyLock<Mutex<HashMap<ActorId, Arc<Queue>>>> = LazyLock::new(Default::default);

fn queue(id: ActorId) -> Arc<Queue> {
    // The table holds counters only; a panic elsewhere cannot leave one half-written.
    let mut queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    Arc::clone(queues.entry(id).or_default())
}

/// The queue length of the actor `id`, if it has ever been sent a message.
pub(crate) fn length(id: ActorId) -> QueueLength {
    let queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    queues.get(&id).map_or(
        QueueLength {
            waiting: 0,
            running: 0,
        },
        |queue| queue.length(),
    )
}

/// Drops the queue of a stopped actor.
pub(crate) fn forget(id: ActorId) {
    let mut queues = QUEUES.lock().unwrap_or_else(PoisonError::into_inner);
    queues.remove(&id);
}

/// A handler's hold on the message it took; finished when dropped.
pub(crate) struct Turn(Arc<Queue>);

/// Marks the message `myself` is about to handle as taken from its mailbox.
pub(crate) fn turn(myself: &ActorCell) -> Turn {
    let queue = queue(myself.get_id());
    queue.taken.fetch_add(1, Ordering::Relaxed);
    Turn(queue)
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counted sends: the only way this crate sends to an actor.
pub(crate) trait Post<M: Message> {
    /// Sends `message` now.
    fn post(&self, message: M) -> Result<(), MessagingErr<M>>;
}

/// Counts a message for actor `id`, then sends it with `send`.
fn counted<M>(
    id: ActorId,
    send: impl FnOnce() -> Result<(), MessagingErr<M>>,
) -> Result<(), MessagingErr<M>> {
    queue(id).sent();
    let sent = send();
    if sent.is_err() {
        // Only a stopped actor refuses a message: its queue goes with it.
        forget(id);
    }
    sent
}

#[allow(clippy::disallowed_methods)] // The counted wrappers around ractor's sends.
impl<M: Message> Post<M> for ActorRef<M> {
    fn post(&self, message: M) -> Result<(), MessagingErr<M>> {
        counted(self.get_id(), || self.send_message(message))
    }
}

#[allow(clippy::disallowed_methods)]
impl<M: Message> Post<M> for DerivedActorRef<M> {
    fn post(&self, message: M) -> Result<(), MessagingErr<M>> {
        counted(self.get_cell().get_id(), || self.send_message(message))
    }
}

/// Sends the message `build` makes and waits up to `timeout` for its answer.
#[allow(clippy::disallowed_methods)]
pub(crate) async fn call<M, T>(
    actor: &ActorRef<M>,
    build: impl FnOnce(RpcReplyPort<T>) -> M,
    timeout: Option<Duration>,
) -> Result<CallResult<T>, MessagingErr<M>>
where
    M: Message,
    T: Send + 'static,
{
    let queue = queue(actor.get_id());
    queue.sent();
    let answer = actor.call(build, timeout).await;
    if answer.is_err() {
        forget(actor.get_id());
    }
    answer
}

/// Sends the message `build` makes to `actor` after `delay`. The timer's task holds the actor's
/// cell (with its channels) until it fires, whether the actor still runs or not: a timer that
/// may outlive its actor by long is a [`Timer`].
#[allow(clippy::disallowed_methods)]
pub(crate) fn post_after<M, F>(
    actor: &ActorRef<M>,
    delay: Duration,
    build: F,
) -> JoinHandle<Result<(), MessagingErr<M>>>
where
    M: Message,
    F: FnOnce() -> M + Send + 'static,
{
    let queue = queue(actor.get_id());
    actor.send_after(delay, move || {
        // Counted as it is made, just before ractor delivers it; if the actor has stopped by
        // then, its queue is gone with it.
        queue.sent();
        build()
    })
}

/// A [`post_after`] timer that is cancelled when dropped. Kept in the state of the actor it
/// wakes, it goes with that state however the actor stops, and so does its hold on the actor.
pub(crate) struct Timer<M: Message>(JoinHandle<Result<(), MessagingErr<M>>>);

impl<M: Message> Timer<M> {
    /// Sends the message `build` makes to `actor` after `delay`, unless dropped first.
    pub(crate) fn after<F>(actor: &ActorRef<M>, delay: Duration, build: F) -> Timer<M>
    where
        F: FnOnce() -> M + Send + 'static,
    {
        Timer(post_after(actor, delay, build))
    }
}

impl<M: Message> Drop for Timer<M> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A task that feeds an actor (a subscription turned into messages), aborted when dropped: kept
/// in the actor's state, it ends with that state however the actor stops.
pub(crate) struct Task(tokio::task::JoinHandle<()>);

impl Task {
    pub(crate) fn spawn(future: impl Future<Output = ()> + Send + 'static) -> Task {
        Task(tokio::spawn(future))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Sends the message `build` makes to `actor` every `period`, for as long as it runs.
#[allow(clippy::disallowed_methods)]
pub(crate) fn post_every<M, F>(actor: &ActorRef<M>, period: Duration, build: F) -> JoinHandle<()>
where
    M: Message,
    F: Fn() -> M + Send + 'static,
{
    let queue = queue(actor.get_id());
    actor.send_interval(period, move || {
        queue.sent();
        build()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ractor::{Actor, ActorProcessingErr};
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    /// Handles each message only when the test lets it.
    struct Gate;

    enum GateMsg {
        Work,
        Ask(RpcReplyPort<()>),
    }

    impl Actor for Gate {
        type Msg = GateMsg;
        type State = Arc<Semaphore>;
        type Arguments = Arc<Semaphore>;

        async fn pre_start(
            &self,
            _myself: ActorRef<GateMsg>,
            gate: Arc<Semaphore>,
        ) -> Result<Arc<Semaphore>, ActorProcessingErr> {
            Ok(gate)
        }

        async fn handle(
            &self,
            myself: ActorRef<GateMsg>,
            message: GateMsg,
            gate: &mut Arc<Semaphore>,
        ) -> Result<(), ActorProcessingErr> {
            let _turn = turn(&myself);
            gate.acquire().await?.forget();
            if let GateMsg::Ask(reply) = message {
                let _ = reply.send(());
            }
            Ok(())
        }

        async fn post_stop(
            &self,
            myself: ActorRef<GateMsg>,
            _state: &mut Arc<Semaphore>,
        ) -> Result<(), ActorProcessingErr> {
            forget(myself.get_id());
            Ok(())
        }
    }

    /// The queue's length once it is `want`, or as it is after 30 s (a failure detector: a
    /// busy machine can take longer than the second this used to allow).
    async fn settle(id: ActorId, want: QueueLength) -> QueueLength {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while length(id) != want && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        length(id)
    }

    #[tokio::test]
    async fn every_kind_of_send_is_counted_until_handled() {
        let gate = Arc::new(Semaphore::new(0));
        let (actor, task) = Actor::spawn(None, Gate, Arc::clone(&gate))
            .await
            .expect("spawn");
        let id = actor.get_id();
        let idle = QueueLength {
            waiting: 0,
            running: 0,
        };
        assert_eq!(length(id), idle);

        for _ in 0..3 {
            actor.post(GateMsg::Work).expect("post");
        }
        post_after(&actor, Duration::from_millis(1), || GateMsg::Work);
        let asked = {
            let actor = actor.clone();
            tokio::spawn(async move { call(&actor, GateMsg::Ask, None).await })
        };
        // One message is being handled (held at the gate), four wait behind it.
        let held = QueueLength {
            waiting: 4,
            running: 1,
        };
        assert_eq!(settle(id, held).await, held);

        gate.add_permits(5);
        let answer = asked.await.expect("join").expect("delivered");
        assert!(matches!(answer, CallResult::Success(())));
        assert_eq!(settle(id, idle).await, idle);

        actor.stop(None);
        task.await.expect("stopped");
        assert!(!QUEUES.lock().expect("lock").contains_key(&id));
        // A send to a stopped actor fails and leaves nothing behind.
        assert!(actor.post(GateMsg::Work).is_err());
        assert!(!QUEUES.lock().expect("lock").contains_key(&id));
    }

    #[tokio::test]
    async fn a_dropped_timer_never_fires_and_lets_go_of_what_it_holds() {
        let gate = Arc::new(Semaphore::new(0));
        let (actor, task) = Actor::spawn(None, Gate, Arc::clone(&gate))
            .await
            .expect("spawn");
        // The timer's task holds what its message is built from, as it holds the actor.
        let held = Arc::new(());
        let timer = {
            let held = Arc::clone(&held);
            Timer::after(&actor, Duration::from_millis(50), move || {
                drop(held);
                GateMsg::Work
            })
        };
        assert_eq!(Arc::strong_count(&held), 2);
        drop(timer);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while Arc::strong_count(&held) != 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(Arc::strong_count(&held), 1, "the aborted task let go");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let idle = QueueLength {
            waiting: 0,
            running: 0,
        };
        assert_eq!(length(actor.get_id()), idle, "nothing was sent");
        actor.stop(None);
        task.await.expect("stopped");
    }
}
