//! How much group commit gathers, on either backend: the transactions that carried more than one
//! write, and how many writes they carried (`reins_store_write_batches_total`,
//! `reins_store_batched_writes_total`).

use std::sync::atomic::{AtomicU64, Ordering};

/// Batches of more than one write so far, and the writes they carried.
#[derive(Debug, Default)]
pub(crate) struct BatchCounts {
    batches: AtomicU64,
    writes: AtomicU64,
}

impl BatchCounts {
    /// Counts a transaction of `writes` writes (one alone is no batch).
    pub(crate) fn record(&self, writes: usize) {
        if writes > 1 {
            self.batches.fetch_add(1, Ordering::Relaxed);
            self.writes.fetch_add(writes as u64, Ordering::Relaxed);
        }
    }

    /// `(batches, writes)` so far.
    pub(crate) fn load(&self) -> (u64, u64) {
        (
            self.batches.load(Ordering::Relaxed),
            self.writes.load(Ordering::Relaxed),
        )
    }
}
