//! The owner's storage quota (`limits.user_stored_bytes_max`): every artifact an outcome
//! stores fits room granted from it. The machine keeps `storage_room`, what the grants this
//! supervisor took hold unused (none at its start: an earlier owner's room is given back at the
//! end). An outcome whose artifact fits is handed to the script at once and journaled with the
//! next write; one that does not is written at once under a new grant (`WriteOp::TakeStorage`),
//! and reaches the script only once that write commits, since the quota may refuse it.
//!
//! A journal row's error (a failed attempt's, a failed step's) is stored inside the grant too,
//! counted as [`store::StepRecord::error_bytes`]: out of the room held, or under a grant of the
//! bytes beyond it that the quota does not refuse ([`WorkflowMachine::error_grant`]). An error is
//! what tells the owner what went wrong, so it is never dropped for the quota; what it can pass
//! the quota by is bounded: each error is cut at ingest to `limits.error_bytes_max`, and a
//! workflow has at most `limits.steps_max` rows.

use runtime::{CallId, Outcome};
use serde_json::json;
use store::{StepCall, WriteOp};

use super::transitions::{Storage, Transition};
use super::{Effect, InFlight, Millis, WorkflowMachine};
use crate::workflow::unwritten::Unwritten;

/// The room a workflow asks its owner's quota for when an artifact does not fit the room it
/// holds: one grant (a write that waits for the owner's other grants on every node) serves many
/// small artifacts, and a running workflow keeps at most this much unused, given back when it
/// ends. A bigger artifact asks for its own bytes.
pub(super) const STORAGE_GRANT_BYTES: i64 = 256 * 1024;

/// What an outcome's artifacts take beyond the room held: the grant its write asks for.
#[derive(Debug)]
pub(super) struct Grant {
    /// The step whose outcome stores the artifacts.
    step_id: String,
    /// The artifacts' bytes, the grant asked for, and the least grant that fits them (their
    /// bytes beyond the room the workflow held).
    bytes: i64,
    asked: i64,
    short: i64,
    /// How many of the write's ops and events came before this outcome's own.
    before_ops: usize,
    before_events: usize,
}

/// An outcome waiting for the write that stores its artifact under a new grant.
#[derive(Debug)]
pub(super) struct Storing {
    id: CallId,
    outcome: Outcome,
    /// What the step's kind records, kept to journal its failure should the quota refuse the
    /// grant.
    call: Option<StepCall>,
    now: Millis,
    grant: Grant,
}

impl WorkflowMachine {
    /// Spends room on the artifacts among `extra` (an outcome's ops), or, when the room held
    /// cannot take them, adds the grant that can to the unwritten ops (before the outcome's own)
    /// and answers it.
    pub(super) fn grant_for(&mut self, step_id: &str, extra: &[WriteOp]) -> Option<Grant> {
        let bytes: i64 = extra
            .iter()
            .map(|op| match op {
                WriteOp::PutArtifact { content, .. } => {
                    i64::try_from(content.len()).unwrap_or(i64::MAX)
                }
                _ => 0,
            })
            .sum();
        let short = bytes - self.storage_room;
        #[cfg(test)]
        if crate::workflow::mutants::planted(crate::workflow::mutants::Mutant::ArtifactWithoutGrant)
        {
            return None;
        }
        if short <= 0 {
            if bytes > 0 {
                self.took(step_id, Transition::Storage(Storage::WithinRoom));
            }
            self.storage_room -= bytes;
            return None;
        }
        let grant = Grant {
            step_id: step_id.to_owned(),
            bytes,
            asked: short.max(STORAGE_GRANT_BYTES),
            short,
            before_ops: self.unwritten.ops.len(),
            before_events: self.unwritten.events.len(),
        };
        self.unwritten.ops.push(WriteOp::TakeStorage {
            workflow_id: self.config.workflow_id.clone(),
            bytes: grant.asked,
            bytes_max: i64::try_from(self.config.stored_bytes_max).unwrap_or(i64::MAX),
        });
        Some(grant)
    }

    /// The grant the errors of the journal rows among `ops` need beyond the room held, if they
    /// need one: one of the bytes short, which the quota does not refuse (module docs).
    pub(super) fn error_grant(&mut self, ops: &[WriteOp]) -> Option<WriteOp> {
        let bytes = store::error_bytes(ops);
        #[cfg(test)]
        if crate::workflow::mutants::planted(crate::workflow::mutants::Mutant::ErrorWithoutGrant) {
            return None;
        }
        let short = bytes - self.storage_room;
        if short <= 0 {
            self.storage_room -= bytes;
            return None;
        }
        self.storage_room = 0;
        Some(WriteOp::TakeStorage {
            workflow_id: self.config.workflow_id.clone(),
            bytes: short,
            bytes_max: 0,
        })
    }

    /// Writes everything unwritten at once, the outcome of call `id` last, under `grant`: the
    /// outcome reaches the script once the write commits ([`WorkflowMachine::stored`]).
    pub(super) fn store_then_hand_over(
        &mut self,
        out: &mut Vec<Effect>,
        storing: (CallId, Outcome, Option<StepCall>, Millis),
        grant: Grant,
    ) {
        let (id, outcome, call, now) = storing;
        self.write(out, Vec::new());
        if let Some(in_flight) = self.writes.back_mut() {
            in_flight.storing = Some(Storing {
                id,
                outcome,
                call,
                now,
                grant,
            });
        }
    }

    /// The write that took a grant committed: its room beyond the artifact is this workflow's,
    /// and the outcome goes to the script.
    pub(super) fn stored(&mut self, out: &mut Vec<Effect>, storing: Storing) {
        if self.is_halted() {
            return;
        }
        self.took(
            &storing.grant.step_id,
            Transition::Storage(Storage::Granted),
        );
        self.storage_room += storing.grant.asked - storing.grant.bytes;
        self.hand_over(out, storing.id, storing.outcome, storing.now);
    }

    /// Whether `error` is the owner's quota refusing the one write in flight, which took a
    /// grant: then handled here ([`WorkflowMachine::storage_refused`]).
    pub(super) fn quota_refused(&mut self, out: &mut Vec<Effect>, error: &store::Error) -> bool {
        let store::Error::LimitReached(store::Limit::StoredBytes { stored, max }) = *error else {
            return false;
        };
        if self.writes.len() != 1 || !self.unwritten.ops.is_empty() {
            return false;
        }
        let Some(front) = self.writes.pop_front() else {
            return false;
        };
        let InFlight {
            written,
            storing: Some(storing),
            ..
        } = front
        else {
            self.writes.push_front(front);
            return false;
        };
        self.storage_refused(out, written, storing, stored, max);
        true
    }

    /// The owner's quota refused the grant of `written`, which stored the artifact of
    /// `storing`'s outcome: nothing of it was written. A grant of more room than the artifact
    /// needs is asked again for the artifact's bytes alone; refused that too, the call fails
    /// naming the quota, and what the write carried before the outcome waits for the next.
    fn storage_refused(
        &mut self,
        out: &mut Vec<Effect>,
        mut written: Unwritten,
        mut storing: Storing,
        stored: i64,
        max: i64,
    ) {
        let grant = &mut storing.grant;
        if grant.asked > grant.short {
            self.took(&grant.step_id, Transition::Storage(Storage::AskedOwnBytes));
            grant.asked = grant.short;
            for op in &mut written.ops {
                // The artifact's grant, the one the quota refused; an error's grant asks no
                // quota (`error_grant`) and stays what it was.
                if let WriteOp::TakeStorage {
                    bytes, bytes_max, ..
                } = op
                    && *bytes_max > 0
                {
                    *bytes = grant.short;
                }
            }
            out.push(Effect::Write(written.ops.clone()));
            self.writes.push_back(InFlight {
                written,
                tries: 0,
                storing: Some(storing),
            });
            return;
        }
        self.took(&grant.step_id, Transition::Storage(Storage::Refused));
        let own = written.ops.split_off(grant.before_ops);
        written.events.truncate(grant.before_events);
        self.unwritten.restore(written);
        let mut kept = Vec::new();
        for op in own {
            match op {
                WriteOp::PutArtifact { .. } => self.artifacts -= 1,
                WriteOp::TakeStorage { .. } | WriteOp::PutStep { .. } => {}
                op => kept.push(op),
            }
        }
        let Storing {
            id,
            outcome,
            call,
            now,
            grant,
        } = storing;
        let bytes = grant.bytes;
        tracing::info!(parent: &self.span, stored, max, bytes,
            "an artifact is over the owner's limits.user_stored_bytes_max; its step fails");
        let mut failure = json!({
            "message": format!(
                "limits.user_stored_bytes_max ({max} bytes) refuses this step's {bytes} bytes: \
                 the owner's workflows store {stored}; nothing of it was stored"
            ),
            "status": "error",
            "limit": "limits.user_stored_bytes_max",
            "bytes": bytes,
            "storedBytes": stored,
            "storedBytesMax": max,
        });
        if let (Outcome::Resolved(value), Some(map)) = (&outcome, failure.as_object_mut())
            && let Some(run_id) = value.get("runId")
        {
            map.insert("runId".into(), run_id.clone());
        }
        self.settle(out, id, Outcome::Rejected(failure), kept, call, now);
    }
}
