//! The store's clock as this node reads it: the `now` of every workflow event, due time and
//! deadline. Leases expire by the database's clock; timers, deadlines and dormant wakes are
//! measured on it too, so nodes whose own clocks disagree still agree on when a timer is due: a
//! due time journaled by one node is honoured by another, never early by their skew.
//!
//! A node reads the database's clock (`Store::now`) when it starts and every [`SYNC_PERIOD`],
//! and keeps the difference from its own clock, taken at the middle of the round trip (so its
//! error is at most half of one). One node per process: the difference is the process's.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store_actor::StoreHandle;

/// How often the node reads the database's clock again.
pub(crate) const SYNC_PERIOD: Duration = Duration::from_secs(60);

/// A difference past this is logged as a warning: the host's clock wants fixing.
const SKEW_WARNING_MS: i64 = 1_000;

/// The database's clock minus this node's, in ms.
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// A test's skew of this node's own clock (the `fault-points` build's
/// `REINS_FAULT_CLOCK_SKEW_MS`), to prove that timers do not follow it.
static SKEW_MS: AtomicI64 = AtomicI64::new(0);

/// Skews this node's own clock by `ms`, as a host whose clock is off would be. For the test
/// suite's build only.
pub fn skew_for_tests(ms: i64) {
    SKEW_MS.store(ms, Ordering::Relaxed);
}

/// This node's own clock, in epoch ms.
fn local_ms() -> i64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    now.saturating_add(SKEW_MS.load(Ordering::Relaxed))
}

/// The store's clock, in epoch milliseconds: the `now` every event of a workflow comes with.
pub(crate) fn now_ms() -> i64 {
    local_ms().saturating_add(OFFSET_MS.load(Ordering::Relaxed))
}

/// Reads the database's clock once and keeps its difference from this node's.
pub(crate) async fn sync(store: &StoreHandle) {
    let before = local_ms();
    let database = match store.now().await {
        Ok(seconds) => (seconds * 1000.0).round() as i64,
        Err(error) => {
            tracing::warn!(%error, "cannot read the database's clock; keeping the last difference");
            return;
        }
    };
    let after = local_ms();
    let offset = database - before / 2 - after / 2;
    let previous = OFFSET_MS.swap(offset, Ordering::Relaxed);
    if offset.abs() > SKEW_WARNING_MS && (offset - previous).abs() > SKEW_WARNING_MS / 10 {
        tracing::warn!(
            offset_ms = offset,
            "this host's clock differs from the database's; timers and deadlines follow the database's"
        );
    }
}

/// Reads the database's clock every [`SYNC_PERIOD`] until aborted.
pub(crate) fn keep_in_sync(store: StoreHandle) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(SYNC_PERIOD).await;
            sync(&store).await;
        }
    })
}
