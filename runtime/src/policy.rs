//! A step's retry policy and timeouts: what an `agent` call (`retry`, `timeout`, `idempotent`,
//! camelCase) or an agent's configuration (the same keys in snake_case) may say, each value
//! checked against a named bound, and how they merge: the call's keys over the agent's over the
//! defaults.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `maxAttempts` at most.
pub const MAX_ATTEMPTS_MAX: u32 = 100;
/// `initialIntervalMs` and `maxIntervalMs` at most: a day.
pub const INTERVAL_MS_MAX: u64 = 86_400_000;
/// `backoffCoefficient` at most (and at least 1).
pub const BACKOFF_COEFFICIENT_MAX: f64 = 10.0;
/// `nonRetryable` codes at most, and each code's bytes at most.
pub const NON_RETRYABLE_MAX: usize = 32;
pub const CODE_BYTES_MAX: usize = 64;
/// What a failure's code is made of, as a policy's `nonRetryable` names it.
pub const CODE_GRAMMAR: &str = "1 to 64 of A-Z, a-z, 0-9, '-', '_', '.'";

/// Whether `code` is a failure code: an id ([`crate::is_id`]) of at most [`CODE_BYTES_MAX`]
/// bytes, so that it can be named in `nonRetryable`, shown and logged as it is (no control
/// character, no newline, no NUL).
pub fn is_code(code: &str) -> bool {
    code.len() <= CODE_BYTES_MAX && crate::is_id(code)
}
/// A timeout at least and at most (`attemptMs`, `idleMs`, `totalMs`): 100 ms to 7 days.
pub const TIMEOUT_MS_MIN: u64 = 100;
pub const TIMEOUT_MS_MAX: u64 = 7 * 86_400_000;

/// The retry keys a call or an agent gave; each one it left out comes from under it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_coefficient: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub non_retryable: Option<Vec<String>>,
}

/// The timeout keys a call or an agent gave.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<u64>,
    /// How long an approval the agent asks for waits for a person: then it is answered
    /// `reject`, by `timeout` (the agent's `timeout.approval_ms`, a call's `approvalMs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_ms: Option<u64>,
}

/// What one `agent` call says of its retries, timeouts and idempotence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallPolicy {
    pub retry: RetryOptions,
    pub timeout: TimeoutOptions,
    /// `idempotent: false` narrows an idempotent agent for this call; `true` cannot widen one
    /// that is not (only its configuration can say so).
    pub idempotent: Option<bool>,
}

/// The retry policy in force for a step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub initial_interval_ms: u64,
    pub backoff_coefficient: f64,
    pub max_interval_ms: u64,
    pub non_retryable: Vec<String>,
}

/// The timeouts in force for a step (`None`: no bound).
pub type Timeouts = TimeoutOptions;

impl Default for RetryPolicy {
    /// One attempt: nothing is retried unless the call or its agent asks.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 1,
            initial_interval_ms: 1_000,
            backoff_coefficient: 2.0,
            max_interval_ms: 60_000,
            non_retryable: Vec::new(),
        }
    }
}

impl RetryPolicy {
    /// The wait before attempt `next` (2 or more): the initial interval grown by the
    /// coefficient for each attempt since the second, at most `max_interval_ms`. A wait the
    /// failure asks for (`retry_after_ms`, a provider's `Retry-After`) may lengthen it, never
    /// shorten it (a provider that asks for no wait, or a time past, cannot make a step spend
    /// its attempts at once), also at most `max_interval_ms`.
    pub fn delay_before(&self, next: u32, asked_ms: Option<u64>) -> u64 {
        let backoff = self.backoff_before(next);
        asked_ms.map_or(backoff, |asked| {
            asked.min(self.max_interval_ms).max(backoff)
        })
    }

    /// The policy's own wait before attempt `next`.
    fn backoff_before(&self, next: u32) -> u64 {
        let grown = self.initial_interval_ms as f64
            * self
                .backoff_coefficient
                .powi(i32::try_from(next.saturating_sub(2)).unwrap_or(i32::MAX));
        // Invariant: a finite non-negative float below `max_interval_ms` fits a u64.
        if grown.is_finite() && grown < self.max_interval_ms as f64 {
            grown as u64
        } else {
            self.max_interval_ms
        }
    }

    /// Whether a failure with `code` is one the policy never retries.
    pub fn refuses(&self, code: Option<&str>) -> bool {
        code.is_some_and(|code| self.non_retryable.iter().any(|listed| listed == code))
    }
}

impl RetryOptions {
    /// These keys over `under`'s.
    pub fn over(&self, under: &RetryOptions) -> RetryOptions {
        RetryOptions {
            max_attempts: self.max_attempts.or(under.max_attempts),
            initial_interval_ms: self.initial_interval_ms.or(under.initial_interval_ms),
            backoff_coefficient: self.backoff_coefficient.or(under.backoff_coefficient),
            max_interval_ms: self.max_interval_ms.or(under.max_interval_ms),
            non_retryable: self
                .non_retryable
                .clone()
                .or_else(|| under.non_retryable.clone()),
        }
    }

    /// The policy these keys make, the defaults filling what they leave out.
    pub fn policy(&self) -> RetryPolicy {
        let default = RetryPolicy::default();
        RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(default.max_attempts),
            initial_interval_ms: self
                .initial_interval_ms
                .unwrap_or(default.initial_interval_ms),
            backoff_coefficient: self
                .backoff_coefficient
                .unwrap_or(default.backoff_coefficient),
            max_interval_ms: self.max_interval_ms.unwrap_or(default.max_interval_ms),
            non_retryable: self.non_retryable.clone().unwrap_or_default(),
        }
    }

    /// Checks each key against its bound; `names` says how the keys are spelled to the reader
    /// (camelCase in a script, snake_case in the configuration).
    pub fn check(&self, names: Names) -> Result<(), String> {
        let name = |camel: &'static str| names.spell(camel);
        if let Some(n) = self.max_attempts
            && !(1..=MAX_ATTEMPTS_MAX).contains(&n)
        {
            return Err(format!(
                "retry.{} is {n}: it must be 1 to {MAX_ATTEMPTS_MAX}",
                name("maxAttempts")
            ));
        }
        for (key, value) in [
            ("initialIntervalMs", self.initial_interval_ms),
            ("maxIntervalMs", self.max_interval_ms),
        ] {
            if let Some(ms) = value
                && ms > INTERVAL_MS_MAX
            {
                return Err(format!(
                    "retry.{} is {ms}: it must be 0 to {INTERVAL_MS_MAX} (a day)",
                    name(key)
                ));
            }
        }
        if let Some(c) = self.backoff_coefficient
            && !(1.0..=BACKOFF_COEFFICIENT_MAX).contains(&c)
        {
            return Err(format!(
                "retry.{} is {c}: it must be 1 to {BACKOFF_COEFFICIENT_MAX}",
                name("backoffCoefficient")
            ));
        }
        if let Some(codes) = &self.non_retryable {
            let key = name("nonRetryable");
            if codes.len() > NON_RETRYABLE_MAX {
                return Err(format!(
                    "retry.{key} has {} codes: at most {NON_RETRYABLE_MAX}",
                    codes.len()
                ));
            }
            if let Some(code) = codes.iter().find(|code| !is_code(code)) {
                return Err(format!(
                    "retry.{key} holds {code:?}: a code is {CODE_GRAMMAR}"
                ));
            }
        }
        Ok(())
    }

    /// Reads a call's `retry` object (camelCase keys), naming what is wrong.
    fn from_call(value: &Value) -> Result<Self, String> {
        let object = value
            .as_object()
            .ok_or("retry must be an object: {maxAttempts, initialIntervalMs, backoffCoefficient, maxIntervalMs, nonRetryable}")?;
        let mut options = RetryOptions::default();
        for (key, value) in object {
            match key.as_str() {
                "maxAttempts" => {
                    options.max_attempts = Some(
                        whole(value)
                            .and_then(|n| u32::try_from(n).ok())
                            .ok_or_else(|| {
                                format!(
                                    "retry.maxAttempts is {value}: it must be 1 to {MAX_ATTEMPTS_MAX}"
                                )
                            })?,
                    );
                }
                "initialIntervalMs" | "maxIntervalMs" => {
                    let ms = whole(value).ok_or_else(|| {
                        format!("retry.{key} is {value}: it must be 0 to {INTERVAL_MS_MAX} (a day)")
                    })?;
                    if key == "initialIntervalMs" {
                        options.initial_interval_ms = Some(ms);
                    } else {
                        options.max_interval_ms = Some(ms);
                    }
                }
                "backoffCoefficient" => {
                    options.backoff_coefficient =
                        Some(value.as_f64().ok_or_else(|| {
                            format!("retry.backoffCoefficient is {value}: it must be 1 to {BACKOFF_COEFFICIENT_MAX}")
                        })?);
                }
                "nonRetryable" => {
                    let codes = value
                        .as_array()
                        .and_then(|codes| {
                            codes
                                .iter()
                                .map(|code| code.as_str().map(str::to_owned))
                                .collect::<Option<Vec<_>>>()
                        })
                        .ok_or("retry.nonRetryable must be a list of strings (failure codes)")?;
                    options.non_retryable = Some(codes);
                }
                other => {
                    return Err(format!(
                        "retry does not take {other}: it takes maxAttempts, initialIntervalMs, \
                         backoffCoefficient, maxIntervalMs, nonRetryable"
                    ));
                }
            }
        }
        options.check(Names::Script)?;
        Ok(options)
    }
}

impl TimeoutOptions {
    /// These keys over `under`'s.
    pub fn over(&self, under: &TimeoutOptions) -> TimeoutOptions {
        TimeoutOptions {
            attempt_ms: self.attempt_ms.or(under.attempt_ms),
            idle_ms: self.idle_ms.or(under.idle_ms),
            total_ms: self.total_ms.or(under.total_ms),
            approval_ms: self.approval_ms.or(under.approval_ms),
        }
    }

    /// Checks each key against its bounds (see [`RetryOptions::check`] for `names`).
    pub fn check(&self, names: Names) -> Result<(), String> {
        for (key, value) in [
            ("attemptMs", self.attempt_ms),
            ("idleMs", self.idle_ms),
            ("totalMs", self.total_ms),
            ("approvalMs", self.approval_ms),
        ] {
            if let Some(ms) = value
                && !(TIMEOUT_MS_MIN..=TIMEOUT_MS_MAX).contains(&ms)
            {
                return Err(format!(
                    "timeout.{} is {ms}: it must be {TIMEOUT_MS_MIN} to {TIMEOUT_MS_MAX} (7 days)",
                    names.spell(key)
                ));
            }
        }
        Ok(())
    }

    /// Reads a call's `timeout` object (camelCase keys), naming what is wrong.
    fn from_call(value: &Value) -> Result<Self, String> {
        let object = value
            .as_object()
            .ok_or("timeout must be an object: {attemptMs, idleMs, totalMs, approvalMs}")?;
        let mut options = TimeoutOptions::default();
        for (key, value) in object {
            let slot = match key.as_str() {
                "attemptMs" => &mut options.attempt_ms,
                "idleMs" => &mut options.idle_ms,
                "totalMs" => &mut options.total_ms,
                "approvalMs" => &mut options.approval_ms,
                other => {
                    return Err(format!(
                        "timeout does not take {other}: it takes attemptMs, idleMs, totalMs, \
                         approvalMs"
                    ));
                }
            };
            *slot = Some(whole(value).ok_or_else(|| {
                format!(
                    "timeout.{key} is {value}: it must be {TIMEOUT_MS_MIN} to {TIMEOUT_MS_MAX} (7 days)"
                )
            })?);
        }
        options.check(Names::Script)?;
        Ok(options)
    }
}

impl CallPolicy {
    /// Reads an `agent` call's `retry`, `timeout` and `idempotent`, naming what is wrong.
    pub fn from_call(args: &Value) -> Result<Self, String> {
        let retry = match args.get("retry") {
            None | Some(Value::Null) => RetryOptions::default(),
            Some(value) => RetryOptions::from_call(value)?,
        };
        let timeout = match args.get("timeout") {
            None | Some(Value::Null) => TimeoutOptions::default(),
            Some(value) => TimeoutOptions::from_call(value)?,
        };
        let idempotent = match args.get("idempotent") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(idempotent)) => Some(*idempotent),
            Some(other) => return Err(format!("idempotent is {other}: it must be true or false")),
        };
        Ok(CallPolicy {
            retry,
            timeout,
            idempotent,
        })
    }
}

/// How keys are spelled to whoever wrote them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// A script's call: camelCase.
    Script,
    /// The configuration: snake_case.
    Configuration,
}

impl Names {
    fn spell(self, camel: &'static str) -> String {
        match self {
            Names::Script => camel.to_owned(),
            Names::Configuration => camel.chars().fold(String::new(), |mut snake, c| {
                if c.is_ascii_uppercase() {
                    snake.push('_');
                    snake.push(c.to_ascii_lowercase());
                } else {
                    snake.push(c);
                }
                snake
            }),
        }
    }
}

/// A JSON number that is a whole, non-negative number (`3` or `3.0`), as a u64.
fn whole(value: &Value) -> Option<u64> {
    value.as_u64().or_else(|| {
        value
            .as_f64()
            .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
            .map(|f| f as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_calls_keys_are_read_and_checked_at_their_edges() {
        let policy = CallPolicy::from_call(&json!({
            "retry": {"maxAttempts": 100, "initialIntervalMs": 0, "backoffCoefficient": 1,
                      "maxIntervalMs": INTERVAL_MS_MAX, "nonRetryable": ["http_400"]},
            "timeout": {"attemptMs": TIMEOUT_MS_MIN, "idleMs": TIMEOUT_MS_MAX},
            "idempotent": false,
        }))
        .expect("within every bound");
        assert_eq!(policy.retry.max_attempts, Some(100));
        assert_eq!(policy.timeout.idle_ms, Some(TIMEOUT_MS_MAX));
        assert_eq!(policy.idempotent, Some(false));
        for (args, named) in [
            (
                json!({"retry": {"maxAttempts": 101}}),
                "retry.maxAttempts is 101: it must be 1 to 100",
            ),
            (
                json!({"retry": {"maxAttempts": 0}}),
                "retry.maxAttempts is 0",
            ),
            (
                json!({"retry": {"maxAttempts": 1e9}}),
                "retry.maxAttempts is 1000000000: it must be 1 to 100",
            ),
            (
                json!({"retry": {"maxAttempts": -1}}),
                "retry.maxAttempts is -1",
            ),
            (
                json!({"retry": {"initialIntervalMs": INTERVAL_MS_MAX + 1}}),
                "retry.initialIntervalMs is 86400001",
            ),
            (
                json!({"retry": {"backoffCoefficient": 0.5}}),
                "retry.backoffCoefficient is 0.5",
            ),
            (
                json!({"retry": {"nonRetryable": "http_400"}}),
                "retry.nonRetryable must be a list of strings",
            ),
            (
                json!({"retry": {"nonRetryable": [4]}}),
                "retry.nonRetryable must be a list of strings",
            ),
            (
                json!({"retry": {"nonRetryable": ["rate limited"]}}),
                "retry.nonRetryable holds \"rate limited\": a code is 1 to 64 of A-Z",
            ),
            (
                json!({"retry": {"maxAttempt": 3}}),
                "retry does not take maxAttempt",
            ),
            (json!({"retry": 3}), "retry must be an object"),
            (
                json!({"timeout": {"attemptMs": 99}}),
                "timeout.attemptMs is 99: it must be 100 to",
            ),
            (
                json!({"timeout": {"totalMs": TIMEOUT_MS_MAX + 1}}),
                "timeout.totalMs is 604800001",
            ),
            (
                json!({"timeout": {"idle": 5}}),
                "timeout does not take idle",
            ),
            (json!({"timeout": 1000}), "timeout must be an object"),
            (json!({"idempotent": "yes"}), "idempotent is \"yes\""),
        ] {
            let error = CallPolicy::from_call(&args).expect_err(&args.to_string());
            assert!(error.contains(named), "{args}: {error}");
        }
    }

    #[test]
    fn the_configuration_is_told_in_its_own_spelling() {
        let options = RetryOptions {
            max_attempts: Some(0),
            ..RetryOptions::default()
        };
        let error = options.check(Names::Configuration).expect_err("0 attempts");
        assert!(error.starts_with("retry.max_attempts is 0"), "{error}");
        let timeouts = TimeoutOptions {
            idle_ms: Some(1),
            ..TimeoutOptions::default()
        };
        let error = timeouts.check(Names::Configuration).expect_err("1 ms");
        assert!(error.starts_with("timeout.idle_ms is 1"), "{error}");
    }

    #[test]
    fn the_calls_keys_win_over_the_agents_over_the_defaults() {
        let agent = RetryOptions {
            max_attempts: Some(4),
            initial_interval_ms: Some(500),
            ..RetryOptions::default()
        };
        let call = RetryOptions {
            max_attempts: Some(2),
            ..RetryOptions::default()
        };
        let policy = call.over(&agent).policy();
        assert_eq!(
            (
                policy.max_attempts,
                policy.initial_interval_ms,
                policy.max_interval_ms
            ),
            (2, 500, 60_000)
        );
    }

    #[test]
    fn backoff_grows_to_its_cap_and_an_asked_wait_only_lengthens_it() {
        let policy = RetryPolicy {
            max_attempts: 10,
            initial_interval_ms: 1_000,
            backoff_coefficient: 2.0,
            max_interval_ms: 5_000,
            non_retryable: vec!["http_400".into()],
        };
        let waits: Vec<u64> = (2..=6)
            .map(|next| policy.delay_before(next, None))
            .collect();
        assert_eq!(waits, [1_000, 2_000, 4_000, 5_000, 5_000]);
        // Asked for more than the policy's wait: the asked wait, within the cap.
        assert_eq!(policy.delay_before(2, Some(1_500)), 1_500);
        assert_eq!(policy.delay_before(2, Some(60_000)), 5_000);
        // Asked for less, or nothing (a `Retry-After` already past): the policy's wait.
        assert_eq!(policy.delay_before(2, Some(30)), 1_000);
        assert_eq!(policy.delay_before(4, Some(0)), 4_000);
        assert!(policy.refuses(Some("http_400")));
        assert!(!policy.refuses(Some("http_429")) && !policy.refuses(None));
    }
}
