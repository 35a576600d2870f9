//! An attempt's time limits, as pure rules: `timeout.attemptMs` bounds the attempt from its start,
//! `timeout.idleMs` the silence since its agent's latest progress signal. The child-agent actor
//! asks for the next deadline, arms one timer for it, and when it fires tells the clock the
//! latest signal and asks whether the attempt has expired (a run that keeps signalling re-arms
//! the timer and is never stopped for its length). While the agent waits for a person (a live
//! approval request, until the answer is handed to it) neither limit runs: a person's time is not
//! the agent's, and the answer counts as progress. No IO and no clock of its own: the caller
//! passes the time.

use std::time::Duration;

use runtime::policy::TimeoutOptions;
use store::{FailureClass, RunFailure};
use tokio::time::Instant;

/// Which limit an attempt ran out of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expiry {
    /// `timeout.attemptMs`, this many ms.
    Attempt(u64),
    /// `timeout.idleMs`, this many ms.
    Idle(u64),
}

impl Expiry {
    /// The run's error message: what ran out, naming the key and its value.
    pub(crate) fn message(self) -> String {
        match self {
            Expiry::Attempt(ms) => format!("the attempt ran for {ms} ms (timeout.attemptMs)"),
            Expiry::Idle(ms) => format!("no progress for {ms} ms (timeout.idleMs)"),
        }
    }

    /// The failure a run stopped for its time records: a timeout, worth another attempt.
    pub(crate) fn failure(self) -> RunFailure {
        RunFailure {
            class: FailureClass::Timeout,
            code: Some(self.code().into()),
            retryable: Some(true),
            retry_after_ms: None,
        }
    }

    /// The failure's code (and the run's `stop_reason`).
    pub(crate) fn code(self) -> &'static str {
        match self {
            Expiry::Attempt(_) => "attempt_timeout",
            Expiry::Idle(_) => "idle_timeout",
        }
    }
}

/// The time limits of one attempt, and what they have counted so far.
#[derive(Debug, Clone)]
pub(crate) struct AttemptClock {
    attempt_ms: Option<u64>,
    idle_ms: Option<u64>,
    started: Instant,
    /// The waits for a person that have ended, in all: the attempt's deadline moves by them.
    waited: Duration,
    /// Since when the agent waits for a person, while it does.
    waiting_since: Option<Instant>,
    /// The latest progress counted: the start, a signal, an answer handed to the agent.
    progressed: Instant,
}

impl AttemptClock {
    /// The clock of an attempt that starts `now` under `timeouts` (`total_ms` is the workflow's,
    /// not the attempt's).
    pub(crate) fn new(timeouts: &TimeoutOptions, now: Instant) -> Self {
        AttemptClock {
            attempt_ms: timeouts.attempt_ms,
            idle_ms: timeouts.idle_ms,
            started: now,
            waited: Duration::ZERO,
            waiting_since: None,
            progressed: now,
        }
    }

    /// The agent signalled progress at `at` (a signal older than one already counted changes
    /// nothing).
    pub(crate) fn progress(&mut self, at: Instant) {
        self.progressed = self.progressed.max(at);
    }

    /// The agent waits for a person from `now` on: no limit runs until [`Self::answered`].
    pub(crate) fn wait_for_person(&mut self, now: Instant) {
        self.waiting_since.get_or_insert(now);
    }

    /// The person's answer was handed to the agent `now`: the limits run again, and the answer
    /// counts as progress.
    pub(crate) fn answered(&mut self, now: Instant) {
        if let Some(since) = self.waiting_since.take() {
            self.waited += now.saturating_duration_since(since);
        }
        self.progress(now);
    }

    /// When the attempt expires if nothing changes, and by which limit (the earlier one; the
    /// attempt's on a tie). `None` without limits, and while the agent waits for a person.
    pub(crate) fn deadline(&self) -> Option<(Instant, Expiry)> {
        if self.waiting_since.is_some() {
            return None;
        }
        let attempt = self.attempt_ms.map(|ms| {
            (
                self.started + self.waited + Duration::from_millis(ms),
                Expiry::Attempt(ms),
            )
        });
        let idle = self.idle_ms.map(|ms| {
            (
                self.progressed + Duration::from_millis(ms),
                Expiry::Idle(ms),
            )
        });
        match (attempt, idle) {
            (Some(attempt), Some(idle)) if idle.0 < attempt.0 => Some(idle),
            (Some(attempt), _) => Some(attempt),
            (None, idle) => idle,
        }
    }

    /// The limit the attempt has run out of at `now`, if any.
    pub(crate) fn expired(&self, now: Instant) -> Option<Expiry> {
        self.deadline()
            .filter(|(deadline, _)| *deadline <= now)
            .map(|(_, expiry)| expiry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn clock(attempt_ms: Option<u64>, idle_ms: Option<u64>, start: Instant) -> AttemptClock {
        let timeouts = TimeoutOptions {
            attempt_ms,
            idle_ms,
            total_ms: Some(100),
            approval_ms: None,
        };
        AttemptClock::new(&timeouts, start)
    }

    #[test]
    fn without_limits_nothing_expires() {
        let start = Instant::now();
        let clock = clock(None, None, start);
        assert_eq!(clock.deadline(), None);
        assert_eq!(clock.expired(start + ms(86_400_000)), None);
    }

    #[test]
    fn a_silent_attempt_expires_at_its_idle_limit_and_signals_move_it() {
        let start = Instant::now();
        let mut clock = clock(None, Some(1_000), start);
        assert_eq!(clock.expired(start + ms(999)), None);
        assert_eq!(clock.expired(start + ms(1_000)), Some(Expiry::Idle(1_000)));
        clock.progress(start + ms(900));
        assert_eq!(clock.expired(start + ms(1_899)), None);
        assert_eq!(
            clock.deadline(),
            Some((start + ms(1_900), Expiry::Idle(1_000)))
        );
        // An older signal read late changes nothing.
        clock.progress(start + ms(100));
        assert_eq!(clock.expired(start + ms(1_900)), Some(Expiry::Idle(1_000)));
    }

    #[test]
    fn an_attempt_that_keeps_signalling_runs_past_its_idle_limit_until_its_attempt_limit() {
        let start = Instant::now();
        let mut clock = clock(Some(3_000), Some(1_000), start);
        for tick in 1..=9 {
            let now = start + ms(tick * 300);
            assert_eq!(clock.expired(now), None, "at {} ms", tick * 300);
            clock.progress(now);
        }
        assert_eq!(
            clock.deadline(),
            Some((start + ms(3_000), Expiry::Attempt(3_000)))
        );
        assert_eq!(
            clock.expired(start + ms(3_000)),
            Some(Expiry::Attempt(3_000))
        );
    }

    #[test]
    fn a_wait_for_a_person_stops_both_limits_and_the_answer_counts_as_progress() {
        let start = Instant::now();
        let mut clock = clock(Some(2_000), Some(500), start);
        clock.progress(start + ms(400));
        clock.wait_for_person(start + ms(500));
        assert_eq!(clock.deadline(), None);
        assert_eq!(clock.expired(start + ms(60_000)), None);
        clock.answered(start + ms(60_000));
        // 500 ms of the attempt had gone before the wait: its deadline moved by the wait.
        assert_eq!(
            clock.deadline(),
            Some((start + ms(60_500), Expiry::Idle(500)))
        );
        clock.progress(start + ms(60_400));
        clock.progress(start + ms(60_800));
        clock.progress(start + ms(61_200));
        assert_eq!(clock.expired(start + ms(61_499)), None);
        assert_eq!(
            clock.expired(start + ms(61_500)),
            Some(Expiry::Attempt(2_000))
        );
    }

    #[test]
    fn an_expiry_says_its_key_value_and_class() {
        assert_eq!(
            Expiry::Idle(1_000).message(),
            "no progress for 1000 ms (timeout.idleMs)"
        );
        assert_eq!(
            Expiry::Attempt(3_600_000).message(),
            "the attempt ran for 3600000 ms (timeout.attemptMs)"
        );
        let failure = Expiry::Idle(1_000).failure();
        assert_eq!(
            (failure.class, failure.code.as_deref(), failure.retryable),
            (FailureClass::Timeout, Some("idle_timeout"), Some(true))
        );
        assert_eq!(
            Expiry::Attempt(1).failure().code.as_deref(),
            Some("attempt_timeout")
        );
    }
}
