//! The one error type of the store. Each variant is something a caller can act on: a lost lease
//! fences the caller, a conflict becomes a 409, an unknown outcome must be reconciled, never retried
//! blindly.

/// Everything a store operation can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The caller's `(resource, owner, epoch)` no longer holds the unexpired lease: nothing was
    /// written.
    #[error("lease lost: {owner:?} no longer holds {resource_id:?} at epoch {epoch}")]
    LeaseLost {
        resource_id: crate::WorkflowId,
        owner: String,
        epoch: crate::Epoch,
    },
    /// The row the operation names does not exist: nothing was written.
    #[error("not found: {0}")]
    NotFound(String),
    /// A uniqueness rule refused the write: nothing was written.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A limit refused the write: nothing was written.
    #[error("limit reached: {0}")]
    LimitReached(Limit),
    /// The write may or may not have committed (its acknowledgement never came): re-read and
    /// reconcile, never retry blindly.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The database's disk is full (SQLite `SQLITE_FULL`, PostgreSQL SQLSTATE 53100): the
    /// statement's transaction rolled back, so nothing was written.
    #[error("the database's disk is full: nothing was written ({0})")]
    DiskFull(String),
    /// The database could not be reached, or stayed busy past the bounded retries.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The database URL is not one the store understands.
    #[error("invalid database url {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// Another live node holds the SQLite database.
    #[error(
        "sqlite database {path:?} is in use by another node ({holder}); a cluster needs PostgreSQL"
    )]
    NodeLockHeld { path: String, holder: String },
    /// The database carries a schema version this build does not know.
    #[error("database schema version {found} is newer than this build's {known}")]
    SchemaTooNew { found: i64, known: i64 },
    /// The backend does not do what was asked (a backup through the node on PostgreSQL): nothing
    /// was done.
    #[error("not supported: {0}")]
    Unsupported(String),
    /// A stored value could not be decoded, or the database refused a statement for another
    /// reason.
    #[error("database error: {0}")]
    Database(String),
}

/// A named limit of the store's that can refuse a write. Its text is the configuration key's
/// name, which is what messages and the HTTP answer show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `max_workflows`: the cluster's live workflows.
    Workflows,
    /// `max_workflows_per_owner`: one user's live workflows.
    WorkflowsPerOwner,
    /// `auth.tokens_per_user_max`: one user's live API tokens, at most `max`.
    TokensPerUser { max: u32 },
    /// `limits.user_stored_bytes_max`: the bytes one user's workflows store, at most `max`;
    /// they store `stored` already.
    StoredBytes { stored: i64, max: i64 },
    /// `limits.untaken_events_per_workflow_max`: events a workflow holds that no wait took.
    UntakenEvents { max: i64 },
    /// `limits.untaken_event_bytes_per_workflow_max`: those events' payload bytes; they hold
    /// `held` already.
    UntakenEventBytes { held: i64, max: i64 },
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Workflows => f.write_str("max_workflows"),
            Limit::WorkflowsPerOwner => f.write_str("max_workflows_per_owner"),
            Limit::TokensPerUser { max } => {
                write!(f, "auth.tokens_per_user_max ({max}): revoke a token first")
            }
            Limit::StoredBytes { stored, max } => write!(
                f,
                "limits.user_stored_bytes_max ({max}): the user's workflows store {stored} bytes"
            ),
            Limit::UntakenEvents { max } => write!(
                f,
                "limits.untaken_events_per_workflow_max ({max}): the workflow holds that many \
                 events no waitForEvent has taken"
            ),
            Limit::UntakenEventBytes { held, max } => write!(
                f,
                "limits.untaken_event_bytes_per_workflow_max ({max}): the workflow holds {held} \
                 bytes of events no waitForEvent has taken"
            ),
        }
    }
}

/// The store's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Whether the operation surely wrote nothing and may be tried again after a wait. A full
    /// disk counts: it is no step's fault, and a workflow waits (with backoff, until its deadline)
    /// for an operator to free space rather than failing a step or stopping.
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Unavailable(_) | Error::DiskFull(_))
    }
}

/// SQLite's errors by their (extended) result codes, never by their text: busy or locked is
/// transient, a full disk is `DiskFull`, a foreign key that names no row is `NotFound`, a
/// uniqueness rule is `Conflict`; any other constraint (`CHECK`, `NOT NULL`) is a statement the
/// store should never have sent, as on PostgreSQL.
impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        use rusqlite::ffi;
        let rusqlite::Error::SqliteFailure(failure, _) = &error else {
            return Error::Database(error.to_string());
        };
        match failure.extended_code {
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => Error::NotFound(error.to_string()),
            ffi::SQLITE_CONSTRAINT_UNIQUE
            | ffi::SQLITE_CONSTRAINT_PRIMARYKEY
            | ffi::SQLITE_CONSTRAINT_ROWID => Error::Conflict(error.to_string()),
            _ => match failure.code {
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked => {
                    Error::Unavailable(error.to_string())
                }
                rusqlite::ErrorCode::DiskFull => Error::DiskFull(error.to_string()),
                _ => Error::Database(error.to_string()),
            },
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(error: tokio_postgres::Error) -> Self {
        use tokio_postgres::error::SqlState;
        let Some(code) = error.code() else {
            // No SQLSTATE: the connection failed or closed, so the server refused nothing.
            return Error::Unavailable(with_causes(&error));
        };
        let message = match error.as_db_error() {
            Some(db) => db.message().to_string(),
            None => error.to_string(),
        };
        if code.code() == "RW001" {
            return Error::LimitReached(Limit::Workflows);
        }
        if code.code() == "RW002" {
            return Error::LimitReached(Limit::WorkflowsPerOwner);
        }
        if code.code() == "RQ001" {
            // `reins_take_storage` (migration 30) gives the figures as its detail: "STORED MAX".
            let figures = error
                .as_db_error()
                .and_then(|db| db.detail())
                .and_then(|detail| {
                    let (stored, max) = detail.split_once(' ')?;
                    Some((stored.parse().ok()?, max.parse().ok()?))
                });
            return match figures {
                Some((stored, max)) => Error::LimitReached(Limit::StoredBytes { stored, max }),
                None => Error::Database(message),
            };
        }
        if *code == SqlState::UNIQUE_VIOLATION {
            Error::Conflict(message)
        } else if *code == SqlState::DISK_FULL {
            Error::DiskFull(message)
        } else if *code == SqlState::FOREIGN_KEY_VIOLATION || code.code() == "RN001" {
            Error::NotFound(message)
        } else if [
            SqlState::T_R_SERIALIZATION_FAILURE,
            SqlState::T_R_DEADLOCK_DETECTED,
            SqlState::LOCK_NOT_AVAILABLE,
            SqlState::QUERY_CANCELED,
            SqlState::ADMIN_SHUTDOWN,
            SqlState::CANNOT_CONNECT_NOW,
            SqlState::TOO_MANY_CONNECTIONS,
        ]
        .contains(code)
        {
            Error::Unavailable(message)
        } else {
            Error::Database(message)
        }
    }
}

/// An error's message followed by its causes, on one line.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        match error {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => Error::Unavailable(with_causes(&other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// Real SQLite refusals, each classified by its result code.
    #[test]
    fn sqlite_errors_are_classified_by_their_result_codes() {
        let connection = rusqlite::Connection::open_in_memory().expect("open");
        connection
            .execute_batch(
                "PRAGMA foreign_keys = ON;
                 CREATE TABLE parent (id TEXT PRIMARY KEY);
                 CREATE TABLE child (id INTEGER PRIMARY KEY,
                                     parent TEXT NOT NULL REFERENCES parent (id),
                                     name TEXT UNIQUE,
                                     n INTEGER CHECK (n > 0));
                 INSERT INTO parent VALUES ('p');
                 INSERT INTO child VALUES (1, 'p', 'a', 1);",
            )
            .expect("schema");
        let refused = |sql: &str| Error::from(connection.execute(sql, []).expect_err(sql));
        assert!(matches!(
            refused("INSERT INTO child VALUES (2, 'nobody', 'b', 1)"),
            Error::NotFound(_)
        ));
        assert!(matches!(
            refused("INSERT INTO child VALUES (2, 'p', 'a', 1)"),
            Error::Conflict(_)
        ));
        assert!(matches!(
            refused("INSERT INTO parent VALUES ('p')"),
            Error::Conflict(_)
        ));
        assert!(matches!(
            refused("INSERT INTO child VALUES (1, 'p', 'c', 1)"),
            Error::Conflict(_)
        ));
        assert!(matches!(
            refused("INSERT INTO child VALUES (2, 'p', 'b', 0)"),
            Error::Database(_)
        ));
        assert!(matches!(
            refused("INSERT INTO child VALUES (2, NULL, 'b', 1)"),
            Error::Database(_)
        ));
        assert!(matches!(
            refused("INSERT INTO nowhere VALUES (1)"),
            Error::Database(_)
        ));

        // A second connection finds the first one's write lock: busy, transient.
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("busy.db");
        let holder = rusqlite::Connection::open(&path).expect("open");
        holder
            .execute_batch("CREATE TABLE t (x); BEGIN IMMEDIATE; INSERT INTO t VALUES (1);")
            .expect("hold the write lock");
        let other = rusqlite::Connection::open(&path).expect("open");
        other
            .busy_timeout(std::time::Duration::ZERO)
            .expect("no busy wait");
        let busy = other
            .execute("INSERT INTO t VALUES (2)", [])
            .expect_err("locked");
        assert!(matches!(Error::from(busy), Error::Unavailable(_)));
    }
}
