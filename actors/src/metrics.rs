//! The node's counters and histograms, rendered in the Prometheus text format. Actors count what
//! happened once, where it became durable (a step journaled for the first time, an outcome
//! recorded), so a replay after a restart never counts a step again. Gauges that describe the
//! database (workflows by status) are read at scrape time by the caller, not kept here.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 12] = [
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0,
];

/// Every metric recorded here: name, type, help.
#[rustfmt::skip]
const DESCRIPTIONS: &[(&str, &str, &str)] = &[
    ("reins_steps_started_total", "counter", "Workflow steps journaled for the first time, by kind."),
    ("reins_steps_finished_total", "counter", "Workflow steps whose outcome was journaled, by kind and outcome."),
    ("reins_child_runs_started_total", "counter", "Child runs admitted for workflow steps."),
    ("reins_child_runs_finished_total", "counter", "Child runs whose terminal outcome a workflow recorded, by status."),
    ("reins_step_attempts_total", "counter", "Agent step attempts that ended, by agent and outcome (completed, error, timeout, interrupted)."),
    ("reins_step_retries_scheduled_total", "counter", "Agent step attempts a retry policy queued behind a durable timer, by agent."),
    ("reins_workflows_finished_total", "counter", "Workflows that reached a final or waiting-for-an-operator status on this node, by status."),
    ("reins_reconciliations_needed_total", "counter", "Workflows this node sent to needs_reconciliation, by reason."),
    ("reins_lease_renewals_total", "counter", "Lease renewals acknowledged, by kind (run or workflow)."),
    ("reins_lease_losses_total", "counter", "Leases lost (renewal refused or deadline passed), by kind."),
    ("reins_fenced_writes_rejected_total", "counter", "Fenced writes the database refused because the lease was lost."),
    ("reins_journal_write_seconds", "histogram", "Latency of a workflow's fenced journal writes."),
    ("reins_http_requests_total", "counter", "HTTP requests answered, by route and status."),
    ("reins_http_wait_reads_total", "counter", "Reads of a workflow by requests that wait for it (?wait=): one as each begins, one per wake-up."),
    ("reins_notifications_delivered_total", "counter", "Notifications a webhook took (answered 2xx), by kind; one per sink."),
    ("reins_notification_attempts_failed_total", "counter", "Webhook POSTs of notifications that failed (no answer in time, refused, or not 2xx), by kind."),
    ("reins_notifications_abandoned_total", "counter", "Notifications given up after notifications.attempts_max attempts, by kind."),
    ("reins_notifications_expired_total", "counter", "Notifications deleted undelivered past notifications.outbox_retention_ms."),
    ("reins_event_streams_disconnected_total", "counter", "Event streams cut off because their client left a full buffer unread for events.stream_stall_ms."),
    ("reins_workflows_dormant_total", "counter", "Workflows this node left dormant in the store after they waited for workflows.dormant_after_ms."),
];

#[derive(Default, Debug)]
struct Histogram {
    /// Observations at or under each bound of [`BUCKETS`] (not cumulative; summed on render).
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The node's metrics. Cheap to update from any actor or task.
#[derive(Default, Debug)]
pub struct Metrics {
    /// `(name, rendered labels)` to value.
    counters: Mutex<BTreeMap<(&'static str, String), u64>>,
    histograms: Mutex<BTreeMap<&'static str, Histogram>>,
    /// Store requests sent and not yet running: the store actor's queue.
    pub store_requests_waiting: AtomicI64,
    /// Store requests running against the database.
    pub store_requests_running: AtomicI64,
    /// Workflow supervisors running on this node (a dormant workflow has none).
    pub workflow_supervisors: AtomicI64,
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(key, value)| {
            let value = value
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{key}=\"{value}\"")
        })
        .collect();
    if inner.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", inner.join(","))
    }
}

impl Metrics {
    /// Adds one to counter `name` with these labels.
    pub fn inc(&self, name: &'static str, pairs: &[(&str, &str)]) {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        *counters.entry((name, labels(pairs))).or_insert(0) += 1;
    }

    /// Adds `count` to counter `name` with these labels.
    pub fn add(&self, name: &'static str, pairs: &[(&str, &str)], count: u64) {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        *counters.entry((name, labels(pairs))).or_insert(0) += count;
    }

    /// Records one observation of histogram `name`.
    pub fn observe(&self, name: &'static str, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let mut histograms = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        let histogram = histograms.entry(name).or_default();
        if let Some(index) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            histogram.buckets[index] += 1;
        }
        histogram.count += 1;
        histogram.sum += seconds;
    }

    /// The value of a counter (tests and the admin socket).
    pub fn counter(&self, name: &str, pairs: &[(&str, &str)]) -> u64 {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        counters
            .iter()
            .find(|((n, l), _)| *n == name && *l == labels(pairs))
            .map_or(0, |(_, value)| *value)
    }

    /// `(waiting, running)` store requests right now.
    pub fn store_queue(&self) -> (i64, i64) {
        (
            self.store_requests_waiting.load(Ordering::Relaxed),
            self.store_requests_running.load(Ordering::Relaxed),
        )
    }

    /// Everything recorded, in the Prometheus text format (every described metric appears, even
    /// before its first event, so a scrape always sees the same names).
    pub fn render(&self) -> String {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let histograms = self.histograms.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for (name, kind, help) in DESCRIPTIONS {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            if *kind == "histogram" {
                let empty = Histogram::default();
                let histogram = histograms.get(name).unwrap_or(&empty);
                let mut cumulative = 0;
                for (bound, count) in BUCKETS.iter().zip(histogram.buckets) {
                    cumulative += count;
                    let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
                }
                let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", histogram.count);
                let _ = writeln!(out, "{name}_sum {}", histogram.sum);
                let _ = writeln!(out, "{name}_count {}", histogram.count);
                continue;
            }
            let mut any = false;
            for ((metric, rendered), value) in counters.iter() {
                if metric == name {
                    let _ = writeln!(out, "{name}{rendered} {value}");
                    any = true;
                }
            }
            if !any {
                let _ = writeln!(out, "{name} 0");
            }
        }
        render_gauge(
            &mut out,
            "reins_workflow_supervisors",
            "Workflow supervisors running on this node (parked ones included, dormant ones not).",
            &[(
                vec![],
                self.workflow_supervisors.load(Ordering::Relaxed) as f64,
            )],
        );
        let (waiting, running) = self.store_queue();
        render_gauge(
            &mut out,
            "reins_store_requests",
            "Store requests queued for the store actor (waiting) and running on the database.",
            &[
                (vec![("state", "waiting")], waiting as f64),
                (vec![("state", "running")], running as f64),
            ],
        );
        out
    }
}

/// Writes one gauge family (help, type, one line per label set) in the text format.
pub fn render_gauge(
    out: &mut String,
    name: &str,
    help: &str,
    samples: &[(Vec<(&str, &str)>, f64)],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
    for (pairs, value) in samples {
        let _ = writeln!(out, "{name}{} {value}", labels(pairs));
    }
}

/// Writes one counter without labels (help, type, value) in the text format.
pub fn render_counter(out: &mut String, name: &str, help: &str, value: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_render_as_prometheus_text() {
        let metrics = Metrics::default();
        metrics.inc("reins_steps_started_total", &[("kind", "agent")]);
        metrics.inc("reins_steps_started_total", &[("kind", "agent")]);
        metrics.observe("reins_journal_write_seconds", Duration::from_millis(3));
        let text = metrics.render();
        assert!(
            text.contains("reins_steps_started_total{kind=\"agent\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("reins_journal_write_seconds_bucket{le=\"0.002\"} 0\n"),
            "{text}"
        );
        assert!(
            text.contains("reins_journal_write_seconds_bucket{le=\"0.005\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("reins_journal_write_seconds_count 1\n"),
            "{text}"
        );
        assert!(
            text.contains("reins_lease_losses_total 0\n"),
            "an unseen counter shows 0: {text}"
        );
        assert_eq!(
            metrics.counter("reins_steps_started_total", &[("kind", "agent")]),
            2
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(labels(&[("a", "x\"y\\z")]), "{a=\"x\\\"y\\\\z\"}");
    }
}
