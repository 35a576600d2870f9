//! Places one user holds at once on this node (requests that wait, event streams), so that one
//! user, however many requests they send, cannot take every place of the node from the others.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use hyper::StatusCode;

use super::error::ApiError;

/// The places of every user under one limit.
pub struct PerUser {
    /// The configuration key of the limit, for the refusal's message.
    key: &'static str,
    /// The refusal's error code.
    code: &'static str,
    limit: usize,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One place of one user, given back when dropped.
pub struct Place {
    user_id: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl PerUser {
    pub fn new(key: &'static str, code: &'static str, limit: u64) -> Self {
        PerUser {
            key,
            code,
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            held: Arc::default(),
        }
    }

    /// Takes one of `user_id`'s places, or refuses with 429 when they hold them all.
    pub fn take(&self, user_id: &str) -> Result<Place, ApiError> {
        let mut held = lock(&self.held);
        let count = held.entry(user_id.to_owned()).or_insert(0);
        if *count >= self.limit {
            return Err(ApiError {
                retry_after_seconds: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    self.code,
                    format!(
                        "you hold {} of these on this node already (`{}`): end one first",
                        self.limit, self.key
                    ),
                )
            });
        }
        *count += 1;
        Ok(Place {
            user_id: user_id.to_owned(),
            held: Arc::clone(&self.held),
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = lock(&self.held);
        if let Some(count) = held.get_mut(&self.user_id) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.user_id);
            }
        }
    }
}

/// The counts stay right even if a holder panicked: each change is one statement.
fn lock(held: &Mutex<HashMap<String, usize>>) -> MutexGuard<'_, HashMap<String, usize>> {
    held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_holds_at_most_the_limit_and_a_dropped_place_comes_back() {
        let places = PerUser::new("x.per_user_max", "busy", 2);
        let first = places.take("ann").expect("first");
        let _second = places.take("ann").expect("second");
        let refused = places.take("ann").err().expect("refused");
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused.message.contains("`x.per_user_max`"),
            "{}",
            refused.message
        );
        let _other = places.take("bob").expect("another user's own places");
        drop(first);
        assert!(places.take("ann").is_ok());
    }
}
