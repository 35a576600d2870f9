//! The node's open HTTP connections, so that strangers cannot hold them all: at most
//! `http.connections_max` are open at once, and one more that arrives at the cap closes the
//! oldest connection that is not running a request (one still sending its head or its body, or
//! idle between requests), so that a fresh `/health` is answered even while slow clients hold
//! every other connection. Only when every open connection is running a request is the new one
//! refused (closed at once). Timeouts (`http.head_timeout_ms`, `http.body_timeout_ms`) close the
//! slow ones on their own; the cap bounds how many can be slow at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// File descriptors kept for everything but HTTP connections (database, log, admin socket,
/// agent pipes, captured files).
pub const FD_RESERVE: u64 = 256;

/// The open connections, oldest first.
pub struct Connections {
    max: usize,
    table: Mutex<Table>,
    /// Notified whenever a connection leaves the table, for [`Connections::admit`] waiting for
    /// room.
    left: Notify,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    /// By id, which grows with each connection: the first entry is the oldest. A connection told
    /// to close stays here until its task has dropped it (and with it its file descriptor).
    open: BTreeMap<u64, Tracked>,
}

struct Tracked {
    running: Arc<AtomicBool>,
    close: Arc<Notify>,
    closing: bool,
}

/// One admitted connection; it leaves the table when this is dropped.
pub struct Admitted {
    id: u64,
    connections: Arc<Connections>,
    /// Set while the connection runs a request (its body read in full), so that it is not the
    /// one closed to make room.
    pub running: Arc<AtomicBool>,
    /// Notified when the connection must close to make room for a new one.
    pub close: Arc<Notify>,
}

/// What the table says about one more connection.
enum Room {
    Free,
    /// Wait for a connection told to close to be gone.
    Closing,
    /// Every open connection runs a request.
    Full,
}

impl Connections {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Connections {
            max,
            table: Mutex::new(Table::default()),
            left: Notify::new(),
        })
    }

    /// Admits one more connection once there is room: past the cap, the oldest connection not
    /// running a request is told to close, and this waits until it is gone, so that no more
    /// than `max` are ever open. `None` when every open connection runs a request.
    pub async fn admit(self: &Arc<Self>) -> Option<Admitted> {
        loop {
            let left = self.left.notified();
            let mut left = std::pin::pin!(left);
            // Registered before the table is read: a connection that leaves in between wakes it.
            left.as_mut().enable();
            match self.room() {
                Room::Free => return Some(self.insert()),
                Room::Full => return None,
                Room::Closing => left.await,
            }
        }
    }

    fn room(&self) -> Room {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if table.open.len() < self.max {
            return Room::Free;
        }
        if table.open.values().any(|tracked| tracked.closing) {
            return Room::Closing;
        }
        let oldest_waiting = table
            .open
            .values_mut()
            .find(|tracked| !tracked.running.load(Ordering::SeqCst));
        match oldest_waiting {
            Some(tracked) => {
                tracked.closing = true;
                tracked.close.notify_one();
                Room::Closing
            }
            None => Room::Full,
        }
    }

    fn insert(self: &Arc<Self>) -> Admitted {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let id = table.next_id;
        table.next_id += 1;
        let running = Arc::new(AtomicBool::new(false));
        let close = Arc::new(Notify::new());
        table.open.insert(
            id,
            Tracked {
                running: Arc::clone(&running),
                close: Arc::clone(&close),
                closing: false,
            },
        );
        Admitted {
            id,
            connections: Arc::clone(self),
            running,
            close,
        }
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .open
            .len()
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut table = self
            .connections
            .table
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        table.open.remove(&self.id);
        drop(table);
        self.connections.left.notify_waiters();
    }
}

/// How many connections `?wait=` requests may hold at most out of `connections_max`: three
/// quarters. A waiting request runs a request, so it is never the connection closed to make
/// room; the last quarter stays for health checks, sign-in and short requests whatever waits.
pub fn waiting_connections_max(connections_max: u64) -> u64 {
    connections_max - connections_max.div_ceil(4)
}

/// The most connections this process can hold open: raises the soft limit on file descriptors
/// towards `connections_max` plus [`FD_RESERVE`] (never past the hard limit), and answers what
/// fits under it.
pub fn connections_that_fit(connections_max: u64) -> u64 {
    let wanted = connections_max.saturating_add(FD_RESERVE);
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes one rlimit struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return connections_max;
    }
    if limit.rlim_cur < wanted {
        let raised = libc::rlimit {
            rlim_cur: wanted.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit(2) reads one rlimit struct we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = raised.rlim_cur;
        }
    }
    connections_max.min(limit.rlim_cur.saturating_sub(FD_RESERVE).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn past_the_cap_the_oldest_waiting_connection_makes_room() {
        let connections = Connections::new(3);
        let first = connections.admit().await.expect("room");
        let second = connections.admit().await.expect("room");
        let third = connections.admit().await.expect("room");
        first.running.store(true, Ordering::SeqCst);
        // The fourth waits until the oldest connection not running a request is gone.
        let fourth = tokio::spawn({
            let connections = Arc::clone(&connections);
            async move { connections.admit().await }
        });
        second.close.notified().await;
        assert!(
            !futures_now(first.close.notified()),
            "the first runs a request"
        );
        assert_eq!(connections.open(), 3, "never more than the cap");
        assert!(!fourth.is_finished());
        drop(second);
        let fourth = fourth
            .await
            .expect("task")
            .expect("room once the second is gone");
        assert_eq!(connections.open(), 3);
        for admitted in [&third, &fourth] {
            admitted.running.store(true, Ordering::SeqCst);
        }
        assert!(
            connections.admit().await.is_none(),
            "every open connection runs a request"
        );
        drop(fourth);
        assert!(connections.admit().await.is_some());
    }

    /// Whether a future is ready at its first poll.
    fn futures_now(future: impl std::future::Future<Output = ()>) -> bool {
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        future.as_mut().poll(&mut context).is_ready()
    }
}
