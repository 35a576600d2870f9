//! Pooled connections that a call given up on never hands to the next caller.
//!
//! A store call that is abandoned (its deadline passed: see [`crate::bounded`]) is dropped where
//! it stands, possibly with a statement sent and its answer still on the way, or with its
//! request stuck in a socket whose peer stopped acknowledging. Given back to the pool, such a
//! connection would serve the next caller only after that answer, or after TCP's retransmission
//! backoff: tens of seconds after a network partition heals. So every connection a call takes
//! is a [`Conn`], which remembers the call it was taken for; when that call is abandoned, its
//! connections leave the pool for good and are closed (dropping the client aborts its
//! connection task, which closes the socket).
//!
//! A connection whose call failed without an answer from the server (a broken socket, a
//! `TCP_USER_TIMEOUT` that expired) needs nothing from here: tokio-postgres closes it, and the
//! pool's recycling check drops a closed connection before it is handed out again.

use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use deadpool_postgres::{Object, Pool};

use crate::Result;

tokio::task_local! {
    /// Set while a call runs under [`abandonable`]: true once that call is abandoned.
    static ABANDONED: Arc<AtomicBool>;
}

/// A connection out of the pool, for one call.
pub(crate) struct Conn {
    /// Always `Some` until the guard is dropped.
    object: Option<Object>,
    /// The abandonment flag of the call that took it (`None` outside any bounded call: at
    /// start-up, in the batch writers' own tasks).
    abandoned: Option<Arc<AtomicBool>>,
}

/// Takes a connection from `pool` for the call running in this task.
pub(crate) async fn connection(pool: &Pool) -> Result<Conn> {
    let object = pool.get().await?;
    Ok(Conn {
        object: Some(object),
        abandoned: ABANDONED.try_with(Arc::clone).ok(),
    })
}

impl Deref for Conn {
    type Target = Object;

    fn deref(&self) -> &Object {
        self.object
            .as_ref()
            .expect("a connection guard holds its connection until it is dropped")
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Object {
        self.object
            .as_mut()
            .expect("a connection guard holds its connection until it is dropped")
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let abandoned = self
            .abandoned
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::Acquire));
        if abandoned && let Some(object) = self.object.take() {
            // Out of the pool for good (its place is free for a new connection), then closed.
            drop(Object::take(object));
        }
    }
}

/// Runs `call` so that, if it is dropped before it finishes, every connection it holds at that
/// moment is closed instead of given back to the pool.
pub(crate) fn abandonable<F: Future>(call: F) -> impl Future<Output = F::Output> {
    let flag = Arc::new(AtomicBool::new(false));
    Abandonable {
        call: Some(Box::pin(ABANDONED.scope(Arc::clone(&flag), call))),
        flag,
    }
}

/// The call and its flag; see [`abandonable`].
struct Abandonable<F> {
    /// `None` once the call finished.
    call: Option<Pin<Box<F>>>,
    flag: Arc<AtomicBool>,
}

impl<F: Future> Future for Abandonable<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(call) = self.call.as_mut() else {
            // Never polled again after it answered (a `Future`'s contract).
            return Poll::Pending;
        };
        let answer = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(answer)
    }
}

impl<F> Drop for Abandonable<F> {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // Raised before the call (and the connections in it) is dropped, so they see it.
            self.flag.store(true, Ordering::Release);
            drop(call);
        }
    }
}
