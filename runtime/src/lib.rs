//! The workflow script sandbox. A workflow script runs in QuickJS as the body of an async function
//! with `args` and the script API (`agent`, `pause`, `humanCheckpoint`, `captureArtifact`,
//! `readArtifact`, `parallel`). The runtime performs no IO: every API call becomes a command for
//! its host, answered from the journal on replay or by the host when the step's outcome is known.
//! Time (`Date`, `performance.now()`) and randomness are injected, so a replay sees the same
//! values; `WeakRef`,
//! `FinalizationRegistry`, timers, modules, files and the network are absent.

mod allocator;
mod bytecode;
mod cpu_clock;
mod error;
mod id;
mod journal;
pub mod json_depth;
pub mod policy;
mod vm;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use bytecode::ScriptCache;
pub use error::Error;
pub use id::{ID_CHARS_MAX, ID_GRAMMAR, is_id};
pub use journal::{Activation, CallId, CallKind, Command, JournalEntry, Outcome, Status};
pub use json_depth::{JSON_DEPTH_MAX, check_text_depth};
pub use vm::{CHECKPOINT_ON_TIMEOUT, SLEEP_MS_MAX, Vm, VmOptions, WAIT_TIMEOUT_MS_MAX};

/// The limits a VM enforces (spec section 2), with the spec's defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub script_bytes_max: u64,
    /// Args, and each step's input and output (the old worker's frame size).
    pub frame_bytes_max: u64,
    pub script_memory_bytes_max: u64,
    pub script_stack_bytes_max: u64,
    /// CPU time between two awaits.
    pub script_cpu_ms_max: u64,
    /// CPU time of all the script's activations together, since its runtime started: a replay
    /// runs every earlier activation's code again, so this is what the workflow's JavaScript has
    /// cost over its life, whichever nodes ran it.
    pub script_cpu_ms_total_max: u64,
    pub steps_max: u64,
    pub parallel_max: u64,
    /// `console.log` lines kept per activation; the rest are dropped, and one line says so.
    pub log_lines_per_activation_max: u64,
    /// A `console.log` line's bytes at most; a longer line is cut.
    pub log_line_bytes_max: u64,
    /// `console.log` bytes kept per workflow (on the node that runs it); then lines are dropped.
    pub log_bytes_per_workflow_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            script_bytes_max: 64 * 1024,
            frame_bytes_max: 48 * 1024,
            script_memory_bytes_max: 64 * 1024 * 1024,
            script_stack_bytes_max: 1024 * 1024,
            script_cpu_ms_max: 2_000,
            script_cpu_ms_total_max: 60_000,
            steps_max: 10_000,
            parallel_max: 64,
            log_lines_per_activation_max: 1_000,
            log_line_bytes_max: 4 * 1024,
            log_bytes_per_workflow_max: 1024 * 1024,
        }
    }
}

/// The shape of journal entries and outcomes; bump it when it changes.
const JOURNAL_FORMAT: u32 = 1;

/// A digest of everything that changes how a journal replays: the script API (the prelude), the
/// journal format, the engine, and the limits a replay must see unchanged (a smaller frame or
/// step limit, the CPU a workflow may use over its life, or the JSON depth bound, could fail a
/// replay that once passed). A node refuses to recover a workflow whose
/// journal was written under another runtime version.
pub fn runtime_version(limits: &Limits) -> String {
    let mut digest = Sha256::new();
    // The rules a replay must meet (2: calls in flight bounded by `parallel_max`; 3: a call's
    // unknown options are refused; 4: an agent's retry policy, and `sleep`; 5: `waitForEvent`
    // and the deadlines of waits; 6: `sleepUntil` takes a time on the calendar, at most
    // `SLEEP_MS_MAX` ahead).
    digest.update(b"reins-runtime-6\0rquickjs-0.14\0");
    digest.update(include_str!("prelude.js").as_bytes());
    digest.update(JOURNAL_FORMAT.to_le_bytes());
    digest.update(limits.frame_bytes_max.to_le_bytes());
    digest.update(limits.steps_max.to_le_bytes());
    digest.update(limits.parallel_max.to_le_bytes());
    digest.update(limits.script_cpu_ms_total_max.to_le_bytes());
    // A value that nests deeper than the bound fails a run: a journal written without it could
    // fail its replay.
    digest.update((JSON_DEPTH_MAX as u64).to_le_bytes());
    digest
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests;
