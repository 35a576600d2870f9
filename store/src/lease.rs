//! Leases and fences: who owns a resource (a workflow, a child run) and the proof a writer shows
//! to be allowed to write it.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::WorkflowId;

/// The generation of a lease: 1 when a resource is first leased, one more at every takeover.
/// A writer proves it still owns a resource by the epoch it holds; stored and serialized as the
/// bare number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Epoch(i64);

impl Epoch {
    /// The epoch of a resource's first lease.
    pub const FIRST: Epoch = Epoch(1);

    /// The epoch as stored (`extension_execution_leases.epoch`).
    pub fn new(epoch: i64) -> Self {
        Epoch(epoch)
    }

    /// The stored number.
    pub fn get(self) -> i64 {
        self.0
    }

    /// The epoch a takeover grants.
    pub fn next(self) -> Self {
        Epoch(self.0 + 1)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl rusqlite::ToSql for Epoch {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(self.0.into())
    }
}

impl rusqlite::types::FromSql for Epoch {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        i64::column_result(value).map(Epoch)
    }
}

impl tokio_postgres::types::ToSql for Epoch {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut tokio_postgres::types::private::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <i64 as tokio_postgres::types::ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

impl<'a> tokio_postgres::types::FromSql<'a> for Epoch {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        i64::from_sql(ty, raw).map(Epoch)
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <i64 as tokio_postgres::types::FromSql>::accepts(ty)
    }
}

/// A lease row as stored in `extension_execution_leases`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lease {
    pub resource_id: WorkflowId,
    pub owner: String,
    /// Incremented by every takeover; the fence every ownership-dependent write carries.
    pub epoch: Epoch,
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
    pub resource_id: WorkflowId,
    pub owner: String,
    pub epoch: Epoch,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_reaches_json_as_the_bare_number_it_is_stored_as() {
        let lease = Lease {
            resource_id: WorkflowId::new("wf"),
            owner: "node-a".to_owned(),
            epoch: Epoch::FIRST.next(),
            expires_at: 1.5,
        };
        let json = serde_json::to_value(&lease).expect("serializes");
        assert_eq!(json["epoch"], serde_json::json!(2));
        let back: Epoch = serde_json::from_value(json["epoch"].clone()).expect("deserializes");
        assert_eq!((back, back.to_string()), (Epoch::new(2), "2".to_owned()));
    }
}
