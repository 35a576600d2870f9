//! Versioned schema migrations, one SQL file per backend per version. They run at start-up; on
//! PostgreSQL under a transaction-scoped advisory lock so that nodes starting together apply each
//! version exactly once, on SQLite inside one `IMMEDIATE` transaction.

/// One schema version.
pub(crate) struct Migration {
    pub version: i64,
    pub name: &'static str,
    pub postgres: &'static str,
    pub sqlite: &'static str,
}

/// Every schema version, oldest first. Append only: a released migration never changes.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        postgres: include_str!("../migrations/postgres/0001_initial.sql"),
        sqlite: include_str!("../migrations/sqlite/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "run_authority",
        postgres: include_str!("../migrations/postgres/0002_run_authority.sql"),
        sqlite: include_str!("../migrations/sqlite/0002_run_authority.sql"),
    },
    Migration {
        version: 3,
        name: "workflow_journal",
        postgres: include_str!("../migrations/postgres/0003_workflow_journal.sql"),
        sqlite: include_str!("../migrations/sqlite/0003_workflow_journal.sql"),
    },
    Migration {
        version: 4,
        name: "pending_controls",
        postgres: include_str!("../migrations/postgres/0004_pending_controls.sql"),
        sqlite: include_str!("../migrations/sqlite/0004_pending_controls.sql"),
    },
    Migration {
        version: 5,
        name: "users",
        postgres: include_str!("../migrations/postgres/0005_users.sql"),
        sqlite: include_str!("../migrations/sqlite/0005_users.sql"),
    },
    Migration {
        version: 6,
        name: "slot_claim",
        postgres: include_str!("../migrations/postgres/0006_slot_claim.sql"),
        sqlite: include_str!("../migrations/sqlite/0006_slot_claim.sql"),
    },
    Migration {
        version: 7,
        name: "numbered_slots",
        postgres: include_str!("../migrations/postgres/0007_numbered_slots.sql"),
        sqlite: include_str!("../migrations/sqlite/0007_numbered_slots.sql"),
    },
    Migration {
        version: 8,
        name: "numbered_launches",
        postgres: include_str!("../migrations/postgres/0008_numbered_launches.sql"),
        sqlite: include_str!("../migrations/sqlite/0008_numbered_launches.sql"),
    },
    Migration {
        version: 9,
        name: "sparse_slot_claim",
        postgres: include_str!("../migrations/postgres/0009_sparse_slot_claim.sql"),
        sqlite: include_str!("../migrations/sqlite/0009_sparse_slot_claim.sql"),
    },
    Migration {
        version: 10,
        name: "sparse_launch_numbers",
        postgres: include_str!("../migrations/postgres/0010_sparse_launch_numbers.sql"),
        sqlite: include_str!("../migrations/sqlite/0010_sparse_launch_numbers.sql"),
    },
    Migration {
        version: 11,
        name: "live_counts",
        postgres: include_str!("../migrations/postgres/0011_live_counts.sql"),
        sqlite: include_str!("../migrations/sqlite/0011_live_counts.sql"),
    },
    Migration {
        version: 12,
        name: "unused_run_index",
        postgres: include_str!("../migrations/postgres/0012_unused_run_index.sql"),
        sqlite: include_str!("../migrations/sqlite/0012_unused_run_index.sql"),
    },
    Migration {
        version: 13,
        name: "normalised_emails",
        postgres: include_str!("../migrations/postgres/0013_normalised_emails.sql"),
        sqlite: include_str!("../migrations/sqlite/0013_normalised_emails.sql"),
    },
    Migration {
        version: 14,
        name: "live_runs_by_workflow",
        postgres: include_str!("../migrations/postgres/0014_live_runs_by_workflow.sql"),
        sqlite: include_str!("../migrations/sqlite/0014_live_runs_by_workflow.sql"),
    },
    Migration {
        version: 15,
        name: "reconciliation_holds_no_place",
        postgres: include_str!("../migrations/postgres/0015_reconciliation_holds_no_place.sql"),
        sqlite: include_str!("../migrations/sqlite/0015_reconciliation_holds_no_place.sql"),
    },
    Migration {
        version: 16,
        name: "user_management",
        postgres: include_str!("../migrations/postgres/0016_user_management.sql"),
        sqlite: include_str!("../migrations/sqlite/0016_user_management.sql"),
    },
    Migration {
        version: 17,
        name: "workflows_newest_first",
        postgres: include_str!("../migrations/postgres/0017_workflows_newest_first.sql"),
        sqlite: include_str!("../migrations/sqlite/0017_workflows_newest_first.sql"),
    },
    Migration {
        version: 18,
        name: "workflow_events",
        postgres: include_str!("../migrations/postgres/0018_workflow_events.sql"),
        sqlite: include_str!("../migrations/sqlite/0018_workflow_events.sql"),
    },
    Migration {
        version: 19,
        name: "change_bus",
        postgres: include_str!("../migrations/postgres/0019_change_bus.sql"),
        sqlite: include_str!("../migrations/sqlite/0019_change_bus.sql"),
    },
    Migration {
        version: 20,
        name: "runs_that_asked",
        postgres: include_str!("../migrations/postgres/0020_runs_that_asked.sql"),
        sqlite: include_str!("../migrations/sqlite/0020_runs_that_asked.sql"),
    },
    Migration {
        version: 21,
        name: "event_bus",
        postgres: include_str!("../migrations/postgres/0021_event_bus.sql"),
        sqlite: include_str!("../migrations/sqlite/0021_event_bus.sql"),
    },
    Migration {
        version: 22,
        name: "freed_slot_first",
        postgres: include_str!("../migrations/postgres/0022_freed_slot_first.sql"),
        sqlite: include_str!("../migrations/sqlite/0022_freed_slot_first.sql"),
    },
    Migration {
        version: 23,
        name: "fenced_rows_without_foreign_keys",
        postgres: include_str!("../migrations/postgres/0023_fenced_rows_without_foreign_keys.sql"),
        sqlite: include_str!("../migrations/sqlite/0023_fenced_rows_without_foreign_keys.sql"),
    },
    Migration {
        version: 24,
        name: "cheaper_step_writes",
        postgres: include_str!("../migrations/postgres/0024_cheaper_step_writes.sql"),
        sqlite: include_str!("../migrations/sqlite/0024_cheaper_step_writes.sql"),
    },
    Migration {
        version: 25,
        name: "feed_numbered_after_commit",
        postgres: include_str!("../migrations/postgres/0025_feed_numbered_after_commit.sql"),
        sqlite: include_str!("../migrations/sqlite/0025_feed_numbered_after_commit.sql"),
    },
    Migration {
        version: 26,
        name: "narrow_event_counter",
        postgres: include_str!("../migrations/postgres/0026_narrow_event_counter.sql"),
        sqlite: include_str!("../migrations/sqlite/0026_narrow_event_counter.sql"),
    },
    Migration {
        version: 27,
        name: "journal_without_seq_index",
        postgres: include_str!("../migrations/postgres/0027_journal_without_seq_index.sql"),
        sqlite: include_str!("../migrations/sqlite/0027_journal_without_seq_index.sql"),
    },
    Migration {
        version: 28,
        name: "feed_numbered_in_rounds",
        postgres: include_str!("../migrations/postgres/0028_feed_numbered_in_rounds.sql"),
        sqlite: include_str!("../migrations/sqlite/0028_feed_numbered_in_rounds.sql"),
    },
    Migration {
        version: 29,
        name: "slots_per_user",
        postgres: include_str!("../migrations/postgres/0029_slots_per_user.sql"),
        sqlite: include_str!("../migrations/sqlite/0029_slots_per_user.sql"),
    },
    Migration {
        version: 30,
        name: "checkpoints_by_workflow",
        postgres: include_str!("../migrations/postgres/0030_checkpoints_by_workflow.sql"),
        sqlite: include_str!("../migrations/sqlite/0030_checkpoints_by_workflow.sql"),
    },
    Migration {
        version: 31,
        name: "fair_slots",
        postgres: include_str!("../migrations/postgres/0031_fair_slots.sql"),
        sqlite: include_str!("../migrations/sqlite/0031_fair_slots.sql"),
    },
    Migration {
        version: 32,
        name: "stored_bytes_per_user",
        postgres: include_str!("../migrations/postgres/0032_stored_bytes_per_user.sql"),
        sqlite: include_str!("../migrations/sqlite/0032_stored_bytes_per_user.sql"),
    },
    Migration {
        version: 33,
        name: "attempt_events",
        postgres: include_str!("../migrations/postgres/0033_attempt_events.sql"),
        sqlite: include_str!("../migrations/sqlite/0033_attempt_events.sql"),
    },
    Migration {
        version: 34,
        name: "workflow_retries",
        postgres: include_str!("../migrations/postgres/0034_workflow_retries.sql"),
        sqlite: include_str!("../migrations/sqlite/0034_workflow_retries.sql"),
    },
    Migration {
        version: 35,
        name: "sent_events",
        postgres: include_str!("../migrations/postgres/0035_sent_events.sql"),
        sqlite: include_str!("../migrations/sqlite/0035_sent_events.sql"),
    },
    Migration {
        version: 36,
        name: "notify_outbox",
        postgres: include_str!("../migrations/postgres/0036_notify_outbox.sql"),
        sqlite: include_str!("../migrations/sqlite/0036_notify_outbox.sql"),
    },
    Migration {
        version: 37,
        name: "dormant_workflows",
        postgres: include_str!("../migrations/postgres/0037_dormant_workflows.sql"),
        sqlite: include_str!("../migrations/sqlite/0037_dormant_workflows.sql"),
    },
    Migration {
        version: 38,
        name: "overdue_reminders",
        postgres: include_str!("../migrations/postgres/0038_overdue_reminders.sql"),
        sqlite: include_str!("../migrations/sqlite/0038_overdue_reminders.sql"),
    },
    Migration {
        version: 39,
        name: "untaken_event_bytes",
        postgres: include_str!("../migrations/postgres/0039_untaken_event_bytes.sql"),
        sqlite: include_str!("../migrations/sqlite/0039_untaken_event_bytes.sql"),
    },
    Migration {
        version: 40,
        name: "counted_errors_and_events",
        postgres: include_str!("../migrations/postgres/0040_counted_errors_and_events.sql"),
        sqlite: include_str!("../migrations/sqlite/0040_counted_errors_and_events.sql"),
    },
    Migration {
        version: 41,
        name: "reserved_slots",
        postgres: include_str!("../migrations/postgres/0041_reserved_slots.sql"),
        sqlite: include_str!("../migrations/sqlite/0041_reserved_slots.sql"),
    },
    Migration {
        version: 42,
        name: "notify_deliveries",
        postgres: include_str!("../migrations/postgres/0042_notify_deliveries.sql"),
        sqlite: include_str!("../migrations/sqlite/0042_notify_deliveries.sql"),
    },
    Migration {
        version: 43,
        name: "attempts_and_webhooks",
        postgres: include_str!("../migrations/postgres/0043_attempts_and_webhooks.sql"),
        sqlite: include_str!("../migrations/sqlite/0043_attempts_and_webhooks.sql"),
    },
];

/// The schema version this build expects.
pub const SCHEMA_VERSION: i64 = 43;

/// The advisory-lock key PostgreSQL migrations serialise on ("reins" in ASCII).
pub(crate) const PG_MIGRATION_LOCK: i64 = 0x0072_6569_6e73;

/// What a migration run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// Versions this call applied (empty when another node or an earlier start did).
    pub applied: Vec<i64>,
    /// The schema version after the call.
    pub version: i64,
}

/// The migrations that still have to run given the versions already recorded.
pub(crate) fn pending(recorded: &[i64]) -> crate::Result<Vec<&'static Migration>> {
    if let Some(&found) = recorded.iter().max()
        && found > SCHEMA_VERSION
    {
        return Err(crate::Error::SchemaTooNew {
            found,
            known: SCHEMA_VERSION,
        });
    }
    Ok(MIGRATIONS
        .iter()
        .filter(|m| !recorded.contains(&m.version))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_consecutive_and_end_at_the_schema_version() {
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(migration.version, index as i64 + 1, "{}", migration.name);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let error = pending(&[1, SCHEMA_VERSION + 1]).err();
        assert!(matches!(error, Some(crate::Error::SchemaTooNew { .. })));
        let all: Vec<i64> = (1..=SCHEMA_VERSION).collect();
        assert!(pending(&all).is_ok_and(|p| p.is_empty()));
        assert!(pending(&[1]).is_ok_and(|p| p.len() == MIGRATIONS.len() - 1));
        assert_eq!(pending(&[]).map(|p| p.len()).ok(), Some(MIGRATIONS.len()));
    }
}
