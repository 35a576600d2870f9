//! How long to wait before asking the store again after it proved it wrote nothing (the
//! database was unreachable): one schedule for every caller (a workflow's writes, reads and
//! admissions, and a child agent's terminal write), so that none of them hammers a database
//! that is coming back.

use std::time::Duration;

/// The first wait; each further try waits twice as long, up to [`STORE_RETRY_MAX`].
pub(crate) const STORE_RETRY_FIRST: Duration = Duration::from_millis(50);
const STORE_RETRY_MAX: Duration = Duration::from_secs(2);

/// The wait before try `attempt` (1 for the first retry) of a store call that wrote nothing.
pub(crate) fn store_backoff(attempt: u32) -> Duration {
    STORE_RETRY_FIRST
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(10))
        .min(STORE_RETRY_MAX)
}
