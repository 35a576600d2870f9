//! Leases and fences: who owns a resource (a workflow, a child run) and the proof a writer shows
//! to be allowed to write it.

use serde::Serialize;

/// A lease row as stored in `extension_execution_leases`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lease {
    pub resource_id: String,
    pub owner: String,
    /// Incremented by every takeover; the fence every ownership-dependent write carries.
    pub epoch: i64,
    /// Epoch seconds by the database clock.
    pub expires_at: f64,
}

impl Lease {
    /// The fence a holder of this lease writes with.
    pub fn fence(&self) -> Fence {
        Fence {
            resource_id: self.resource_id.clone(),
            owner: self.owner.clone(),
            epoch: self.epoch,
        }
    }
}

/// What a writer claims to hold. A fenced write happens only if the lease row still matches it
/// and has not expired, checked in the same transaction as the write.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Fence {
    pub resource_id: String,
    pub owner: String,
    pub epoch: i64,
}

impl Fence {
    pub(crate) fn lost(&self) -> crate::Error {
        crate::Error::LeaseLost {
            resource_id: self.resource_id.clone(),
            owner: self.owner.clone(),
            epoch: self.epoch,
        }
    }
}

/// The time a lease is granted for, in milliseconds.
pub(crate) fn ttl_seconds(lease_ms: u64) -> f64 {
    // A lease is at most days long; u64 milliseconds fit in f64 without loss at that size.
    lease_ms as f64 / 1000.0
}
