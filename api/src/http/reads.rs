//! Heavy reads: a workflow's record (its row, checkpoints, controls, and a page of its steps
//! and of its artifact versions) and the further pages of its steps and artifacts, each up to
//! megabytes to read, hold and encode. One user's reads must never hold up another's, so each
//! user reads at most `http.record_reads_per_user_max` of them at once on a node: more wait
//! their turn for up to `http.record_read_wait_ms`, then are answered 429 `reads_busy` (with
//! `Retry-After`). Another user's read never queues behind them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;

/// Every user's places for record reads.
pub struct RecordReads {
    per_user_max: usize,
    wait: Duration,
    users: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

/// One user's place, given back when dropped; the user's entry goes when nobody holds or waits.
struct ReadPlace {
    user_id: String,
    places: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    users: Arc<Mutex<HashMap<String, Arc<Semaphore>>>>,
}

impl RecordReads {
    pub fn new(per_user_max: u64, wait_ms: u64) -> Self {
        RecordReads {
            per_user_max: usize::try_from(per_user_max).unwrap_or(usize::MAX),
            wait: Duration::from_millis(wait_ms),
            users: Arc::default(),
        }
    }

    /// Runs `read` for `user_id` once one of their places is free, holding the place until it
    /// has answered. The outer error is the refusal of a place; the inner one the read's own.
    pub async fn read<T>(
        &self,
        user_id: &str,
        read: impl Future<Output = T>,
    ) -> Result<T, ApiError> {
        let _place = self.enter(user_id).await?;
        Ok(read.await)
    }

    async fn enter(&self, user_id: &str) -> Result<ReadPlace, ApiError> {
        let places = Arc::clone(
            lock(&self.users)
                .entry(user_id.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_user_max))),
        );
        let mut place = ReadPlace {
            user_id: user_id.to_owned(),
            places: Arc::clone(&places),
            permit: None,
            users: Arc::clone(&self.users),
        };
        match tokio::time::timeout(self.wait, places.acquire_owned()).await {
            Ok(Ok(permit)) => {
                place.permit = Some(permit);
                Ok(place)
            }
            // Never closed; a timeout is a user with every place busy for the whole wait.
            Ok(Err(_)) | Err(_) => Err(ApiError {
                retry_after_seconds: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "reads_busy",
                    format!(
                        "your {} record reads on this node (`http.record_reads_per_user_max`) \
                         stayed busy for {} ms (`http.record_read_wait_ms`): ask again",
                        self.per_user_max,
                        self.wait.as_millis()
                    ),
                )
            }),
        }
    }
}

impl Drop for ReadPlace {
    fn drop(&mut self) {
        let mut users = lock(&self.users);
        drop(self.permit.take());
        // The map's reference and this place's: nobody else holds or waits for one.
        if Arc::strong_count(&self.places) == 2 {
            users.remove(&self.user_id);
        }
    }
}

/// Each change under the lock is one statement, so a poisoned lock is used as it is.
fn lock(
    users: &Mutex<HashMap<String, Arc<Semaphore>>>,
) -> MutexGuard<'_, HashMap<String, Arc<Semaphore>>> {
    users
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_user_holds_at_most_their_places_and_others_never_wait_for_them() {
        let reads = RecordReads::new(2, 50);
        let first = reads.enter("a").await.expect("a place");
        let second = reads.enter("a").await.expect("a place");
        let refused = reads.enter("a").await.err().expect("every place is busy");
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(refused.message.contains("http.record_reads_per_user_max"));
        let other = reads.enter("b").await.expect("another user's place");
        drop(first);
        let again = reads.enter("a").await.expect("a place given back");
        drop((second, again, other));
        assert!(
            lock(&reads.users).is_empty(),
            "entries go with their last place"
        );
    }
}
