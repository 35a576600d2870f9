//! Every operation of the store, declared once: one trait per concern (what it governs), and
//! [`Operation`] (each operation's name, whether it writes), which the store actor's test faults
//! and its unanswered-request rule read instead of strings typed per call. The list is data
//! ([`with_operations`]): this module declares the traits from it, and `backends.rs` implements
//! them for the PostgreSQL and SQLite backends (calling their inherent methods, which hold the
//! SQL) and the [`crate::Store`] façade (which picks the backend and retries transient
//! failures); the in-memory simulation store (`SimStore`, with the `sim` feature) implements
//! them by hand. This contract names no backend.
//!
//! Each trait's documentation is the contract the conformance suite (`store/tests/conformance`)
//! checks on all three stores.

use std::future::Future;

use serde_json::Value;

use crate::{
    Admission, ApprovalAnswer, ArtifactInfo, ArtifactRow, BackupReport, CancelAction, ControlRow,
    ControlWrite, Deletion, Dormancy, EventPage, EventRow, EventSend, ExpiredApproval, Fence,
    Launch, LaunchLimits, Lease, ListFilter, ListedWorkflow, MigrationReport, NewControl, NewRetry,
    NewRun, NewSentEvent, NewToken, NewUser, NewWorkflow, NodeRecord, Notification, Orphaned,
    Purpose, Result, Retry, RunId, RunOutcome, RunRenewal, RunRow, RunSlot, RunStatus, SentEvent,
    Settlement, SlotRow, Snapshot, StatusCount, StepPage, StepPosition, StepRow, TakeOver,
    TokenRow, UserChange, UserChanged, UserDeletion, UserRow, UserStorage, Versions, WorkflowId,
    WorkflowRow, WriteOp,
};

/// Whether an operation may change the database.
macro_rules! writes {
    (read) => {
        false
    };
    (probe) => {
        false
    };
    (write) => {
        true
    };
    (write_probe) => {
        true
    };
}

macro_rules! declare {
    ($(
        $(#[$trait_doc:meta])*
        trait $trait:ident {
            $(
                $(#[$doc:meta])*
                $effect:ident $variant:ident:
                fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty
                $(=> |$store:ident| $call:expr)?;
            )*
        }
    )*) => {
        $(
            $(#[$trait_doc])*
            pub trait $trait: Send + Sync {
                $(
                    $(#[$doc])*
                    fn $name(&self $(, $arg: $ty)*) -> impl Future<Output = Result<$ret>> + Send;
                )*
            }

        )*

        /// Every operation of the store, by the name of its method.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Operation {
            $($($variant,)*)*
        }

        impl Operation {
            /// Every operation, in the order of their traits.
            pub const ALL: &[Operation] = &[$($(Operation::$variant,)*)*];

            /// The method's name (`fenced_write`): what test faults are installed by.
            pub fn name(self) -> &'static str {
                match self {
                    $($(Operation::$variant => stringify!($name),)*)*
                }
            }

            /// Whether it may change the database, so that an unanswered call's outcome is
            /// unknown rather than failed.
            pub fn writes(self) -> bool {
                match self {
                    $($(Operation::$variant => writes!($effect),)*)*
                }
            }

            /// The operation a method name names.
            pub fn parse(name: &str) -> Option<Operation> {
                Operation::ALL.iter().copied().find(|operation| operation.name() == name)
            }
        }
    };
}

/// The list of every operation, handed to the macro `$then`: the traits here, the
/// implementations in `backends.rs` and the actors' `StoreHandle` methods are made from it, so
/// none can miss one. Its types are named as `store` exports them (and `Value`, serde_json's):
/// a caller outside this crate invokes it where those names are in scope.
#[macro_export]
macro_rules! with_operations {
    ($then:ident) => {
        $then! {
            /// The schema and whether the database can write (migrations, readiness).
            trait Schema {
                /// Applies every migration this database has not seen, safely when nodes start together.
                write Migrate: fn migrate(&self) -> MigrationReport;
                /// The newest schema version recorded in the database (0 for an empty one).
                probe SchemaVersion: fn schema_version(&self) -> i64;
                /// Writes one small row unchanged and commits it: whether the database can write right
                /// now (a full disk fails writes, never reads). Fails with [`crate::Error::DiskFull`]
                /// while it cannot.
                write_probe WriteProbe: fn write_probe(&self) -> ();
                /// Copies the whole database, as of one moment, into a new file at `destination` (an
                /// absolute path that must not exist yet), through the node's own connection: SQLite's
                /// online backup API. Only the embedded backend does it; the others answer
                /// [`crate::Error::Unsupported`] and create nothing.
                probe Backup: fn backup(&self, destination: &std::path::Path) -> BackupReport;
            }

            /// Leases judged by the database clock, and the fenced writes they allow: the primitives
            /// every ownership-dependent change is built from.
            trait Leases {
                /// The database clock, in epoch seconds.
                probe Now: fn now(&self) -> f64;
                /// Takes `resource_id` for `owner` if its lease is free or expired, with epoch + 1.
                /// Returns `None` while another holder's lease is still valid.
                write AcquireLease:
                fn acquire_lease(&self, resource_id: &WorkflowId, owner: &str, lease_ms: u64) -> Option<Lease>;
                /// Extends a lease still held by `fence` to `lease_ms` from now; never moves it
                /// backwards. Fails with [`crate::Error::LeaseLost`] if the lease expired or was taken
                /// over. Also returns the database clock at the renewal, so the caller can derive its
                /// local deadline.
                write RenewLease: fn renew_lease(&self, fence: &Fence, lease_ms: u64) -> (Lease, f64);
                /// Ends a lease now so another node may take it at once. Returns whether it was still
                /// held.
                write ReleaseLease: fn release_lease(&self, fence: &Fence) -> bool;
                /// The current lease row of a resource, if it ever had one.
                read ReadLease: fn read_lease(&self, resource_id: &WorkflowId) -> Option<Lease>;
                /// Applies `ops` atomically if and only if `fence` still holds its unexpired lease,
                /// checked in the same transaction in a way that conflicts with a concurrent takeover.
                /// Otherwise writes nothing and fails with [`crate::Error::LeaseLost`]. A
                /// [`WriteOp::ReleaseLease`] is applied after every other change, wherever it stands.
                write FencedWrite: fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> ()
                    => |store| store.fenced_write(fence, $crate::write::ordered(ops));
            }

            /// Workflows: launching under cluster-wide limits, taking over, listing and reading them.
            trait Workflows {
                /// Launches a workflow: `running`, owned by `owner`, with its first lease (epoch 1), in
                /// one transaction that also enforces `limits` over the live workflows of the whole
                /// cluster and the idempotency of (user, `request_id`): the same request again is the
                /// same workflow, a different one under the same `request_id` is a conflict.
                write LaunchWorkflow: fn launch_workflow(
                    &self,
                    workflow: NewWorkflow,
                    owner: &str,
                    lease_ms: u64,
                    limits: LaunchLimits
                ) -> Launch;
                /// Runs a failed workflow again from its failed step: launches [`NewRetry::workflow`]
                /// as `launch_workflow` does (limits, idempotency of (user, `request_id`); the same
                /// request id used for another workflow is a conflict), linked to the workflow it
                /// retries, with that workflow's journal below [`NewRetry::adopted_calls`] and the
                /// artifact versions those calls made copied in, their bytes a grant of the new
                /// workflow under its owner's quota, all in one transaction. The workflow retried is
                /// read, never written: only a `failed` one is retried, and once (a retry of it that
                /// exists is the answer again).
                write RetryWorkflow: fn retry_workflow(
                    &self,
                    retry: NewRetry,
                    owner: &str,
                    lease_ms: u64,
                    limits: LaunchLimits
                ) -> Retry;
                /// Takes over a `recoverable` workflow (live status, expired lease) for `owner` with
                /// epoch + 1, in one transaction that first refuses, writing nothing, when the workflow
                /// was written under other [`Versions`] (runtime or agent configuration) or a
                /// cancellation is pending (only `cancel` may finish it). `purpose` sets the rules (see
                /// [`Purpose`]): a reconcile takes only a workflow that needs reconciliation, which a
                /// recover refuses; a cancel takes only a workflow with a cancellation pending, under
                /// any runtime version, since it never replays the body.
                write TakeOverWorkflow: fn take_over_workflow(
                    &self,
                    workflow_id: &WorkflowId,
                    owner: &str,
                    lease_ms: u64,
                    versions: &Versions,
                    purpose: Purpose
                ) -> TakeOver;
                /// Up to `limit` live workflows whose owner's lease expired, in a random order, that a
                /// node running `versions` may take: what automatic recovery claims (each claim still
                /// goes through the takeover's rules). A workflow with a pending cancellation is listed
                /// whatever its versions, flagged, since only a cancel takeover may finish it.
                read RecoverableWorkflows:
                fn recoverable_workflows(&self, limit: u32, versions: &Versions) -> Vec<Orphaned>;
                /// Dormant workflows (see [`WriteOp::GoDormant`]): up to `limit` whose wake time has
                /// come (their lease expired), in a random order, that a node running `versions` may
                /// take (a pending cancellation flagged and listed whatever its versions, as
                /// [`Self::recoverable_workflows`] lists them), and the soonest wake time of the
                /// others (epoch seconds). A node under manual recovery claims these, and every node
                /// plans its next claim for that time.
                read DormantWorkflows:
                fn dormant_workflows(&self, limit: u32, versions: &Versions) -> Dormancy;
                /// Deletes a terminal workflow with its journal, controls, artifacts, slots and lease, and
                /// gives its grant of stored bytes back to its owner's quota.
                write DeleteWorkflow: fn delete_workflow(&self, workflow_id: &WorkflowId) -> Deletion;
                /// A page of workflows, newest first.
                read ListWorkflows: fn list_workflows(&self, filter: ListFilter) -> Vec<ListedWorkflow>;
                /// One workflow row, without its journal.
                read ReadWorkflow: fn read_workflow(&self, workflow_id: &WorkflowId) -> Option<WorkflowRow>;
                /// A workflow's journal, in the order it was written.
                read ReadSteps: fn read_steps(&self, workflow_id: &WorkflowId) -> Vec<StepRow>;
                /// A workflow with its lease, the database clock, its checkpoints, controls and the
                /// runs that asked a person, its first `steps_max` steps and its first `artifacts_max`
                /// artifact versions, read as of one moment (what `get` shows; see [`Snapshot`]).
                read ReadSnapshot: fn read_snapshot(
                    &self,
                    workflow_id: &WorkflowId,
                    steps_max: u32,
                    artifacts_max: u32
                ) -> Option<Snapshot>;
                /// At most `limit` of a workflow's steps after `after` (every entry but a checkpoint), in
                /// journal order, with the runs that asked a person (see [`StepPage`]), as of one moment.
                /// A workflow that does not exist has no steps.
                read ReadStepPage: fn read_step_page(
                    &self,
                    workflow_id: &WorkflowId,
                    after: StepPosition,
                    limit: u32
                ) -> StepPage;
                /// At most `limit` of a workflow's artifact versions above `after`, oldest first, without
                /// their bytes.
                read ReadArtifactPage: fn read_artifact_page(
                    &self,
                    workflow_id: &WorkflowId,
                    after: i64,
                    limit: u32
                ) -> Vec<ArtifactInfo>;
                /// One artifact version of a workflow.
                read ReadArtifact:
                fn read_artifact(&self, workflow_id: &WorkflowId, version: i64) -> Option<ArtifactRow>;
                /// The newest artifact version of a workflow (0 when it has none).
                read LastArtifactVersion: fn last_artifact_version(&self, workflow_id: &WorkflowId) -> i64;
            }

            /// Controls: durable requests (resume, decide, cancel) any node records and the owner
            /// carries out, once.
            trait Controls {
                /// Records a control for a workflow, once: an identical control again is `Repeated`
                /// (still one row), a different one for the same step attempt is a conflict. Any node
                /// may write it; the owner carries it out.
                write PutControl: fn put_control(&self, control: NewControl) -> ControlWrite;
                /// Every control of a workflow, oldest first.
                read ReadControls: fn read_controls(&self, workflow_id: &WorkflowId) -> Vec<ControlRow>;
                /// The workflows owned by `owner` that have controls not yet carried out: one query for
                /// a whole node, however many workflows it runs.
                read PendingControls: fn workflows_with_pending_controls(&self, owner: &str) -> Vec<WorkflowId>;
                /// Records an event sent to a live workflow, once per `event_id`: the same event
                /// again is `Repeated` (still one row), another under the same id a conflict; a
                /// workflow that ended is `Ended` with nothing written (checked in the same
                /// transaction). Any node may write it; the owner's `waitForEvent` takes it.
                write SendEvent: fn send_event(&self, event: NewSentEvent) -> EventSend;
                /// A workflow's untaken events of each of `names`, the oldest `per_name` of each at
                /// most, in the order they were sent: found through an index by name, no other
                /// event's row or payload is read.
                read PendingEvents: fn pending_events(&self, workflow_id: &WorkflowId, names: Vec<String>, per_name: u32) -> Vec<SentEvent>;
            }

            /// Child runs: admission under slots and idempotency keys, leases of their own, the
            /// terminal compare-and-set, approvals with a single winner.
            trait Runs {
                /// Admits a child run: the `runs` row (owned by `run.owner`, leased), checked against
                /// the idempotency key, the thread's one active run, and, for a workflow step, the
                /// workflow's fence and a free `workflow_slots` slot, all in one transaction.
                write AdmitRun: fn admit_run(&self, run: NewRun) -> Admission
                    => |store| store.admit_run($crate::write::ordered_run(run));
                /// One child run.
                read ReadRun: fn read_run(&self, run_id: &RunId) -> Option<RunRow>;
                /// Extends a live run's lease if `owner` still owns it and its lease has not expired;
                /// the answer carries any durable cancel request and any approval answer its live agent
                /// waits for. When refused, returns the row as it is now.
                write RenewRunLease: fn renew_run_lease(
                    &self,
                    run_id: &RunId,
                    owner: &str,
                    lease_ms: u64
                ) -> Result<RunRenewal, Option<RunRow>>;
                /// Records a durable cancel request on a live run (the first action asked for stands);
                /// a run waiting for input, which nobody runs, is interrupted at once. Returns the
                /// action in force, or `None` when the run already has an outcome.
                write RequestRunCancel:
                fn request_run_cancel(&self, run_id: &RunId, action: CancelAction) -> Option<CancelAction>;
                /// Moves a run `owner` still owns from `pending`/`running` to another live status
                /// (`running`, `waiting_for_input`), optionally replacing its metadata. A run that now
                /// waits for a person gives back the slot its step held in the same write: nobody runs
                /// while a person decides. A run asked to stop never starts waiting for a person
                /// (`false`): nobody would end it (its workflow's end asked it to stop before it
                /// asked; the orphan sweep closes it once its lease lapses).
                write UpdateRunStatus: fn update_run_status(
                    &self,
                    run_id: &RunId,
                    owner: &str,
                    status: RunStatus,
                    metadata: Option<Value>
                ) -> bool;
                /// The terminal compare-and-set: records `outcome` only if `owner` still owns the row,
                /// it is still live, and (with `require_not_cancelled`) nobody asked to cancel it.
                /// `true` means this call's own write was acknowledged.
                write FinalizeRun: fn finalize_run(
                    &self,
                    run_id: &RunId,
                    owner: &str,
                    outcome: &RunOutcome,
                    require_not_cancelled: bool
                ) -> bool;
                /// Answers the newest pause of `thread_id` if it waits for one of `request_ids`: a
                /// single-winner compare-and-set across nodes that records `answer` in
                /// `metadata.hitl_answer`. A detached pause ends its run `success`; an attached one (its
                /// agent still alive) goes back to `running`, and the owner's next renewal hands the
                /// answer to the agent. `None` when there is no such pause or another answer won.
                write AnswerApproval: fn answer_approval(
                    &self,
                    thread_id: &str,
                    request_ids: &[String],
                    answer: &Value
                ) -> Option<ApprovalAnswer>;
                /// Claims a slot again for the step of `run_id`, an answered run whose live agent goes on
                /// only with one (its pause gave the slot back), under the rules of an admission:
                /// `slots_max` across the cluster, the share `slots_per_user_max` of its workflow's
                /// owner ([`crate::WorkflowStep::slots_per_user_max`]) and the slots kept for other
                /// users ([`crate::WorkflowStep::slots_reserved`]). Only while `owner` owns the run,
                /// it is `running` without a cancel request, and its workflow is running, paused or
                /// waiting_approval; a slot the step holds already is kept.
                write ClaimRunSlot: fn claim_run_slot(
                    &self,
                    run_id: &RunId,
                    owner: &str,
                    slots_max: u64,
                    slots_per_user_max: u64,
                    slots_reserved: u64
                ) -> RunSlot;
                /// Runs waiting for a person whose approval request's deadline
                /// ([`crate::APPROVAL_DEADLINE`]) has passed by the database's clock, at most
                /// `limit`: what the sweep answers `reject` by `timeout`.
                read ExpiredApprovals: fn expired_approvals(&self, limit: u32) -> Vec<ExpiredApproval>;
                /// Undoes an answer, only if nothing was committed on the run since.
                write RestoreApproval: fn restore_approval(&self, answer: &ApprovalAnswer) -> bool;
                /// Claims up to `limit` live runs whose lease expired (their node is gone) and closes
                /// them as `error` with `stop_reason = orphan_recovered`. Returns the run ids it closed.
                write ClaimOrphanRuns: fn claim_orphan_runs(&self, claimer: &str, limit: u32) -> Vec<RunId>;
                /// Slots taken in `workflow_slots` across the cluster.
                read CountSlots: fn count_slots(&self) -> i64;
            }

            /// A workflow's events and the feed of every workflow's status changes.
            trait Events {
                /// A workflow's events numbered after `after`, at most `limit`, with its status; `None`
                /// when there is no such workflow.
                read ReadEvents:
                fn read_events(&self, workflow_id: &WorkflowId, after: i64, limit: u32) -> Option<EventPage>;
                /// Status changes of every workflow (or of `user_id`'s) whose feed number is after
                /// `after`, at most `limit`, oldest first; each with its feed number as `seq`.
                read ReadFeed:
                fn read_feed(&self, after: i64, user_id: Option<&str>, limit: u32) -> Vec<EventRow>;
                /// The feed's newest number (0 before any launch).
                read FeedHead: fn feed_head(&self) -> i64;
                /// An event stream watches `workflow_id`'s events for the next `watch_ms`: until then,
                /// on PostgreSQL, every commit that writes events of it announces `Change::Event` to
                /// every node (an unwatched workflow's step events notify nobody, which keeps the
                /// cluster-wide `NOTIFY` lock out of ordinary steps). Watch before reading, so an event
                /// that commits after the read is announced. On SQLite (one node, whose own writes wake
                /// its streams) and in the simulation there is nothing to do. An unknown workflow is no
                /// error (a stream then finds nothing).
                write WatchEvents: fn watch_events(&self, workflow_id: &WorkflowId, watch_ms: u64) -> ();
            }

            /// The notification outbox (migrations 36 and 42): rows the database writes with the
            /// inbox events they tell of, which nodes deliver to each webhook (`target`, its URL)
            /// on its own. A claim is a lease on one webhook's delivery of a row: one claimant at
            /// a time, and only the claim's epoch settles it.
            trait Notifications {
                /// Records that `target` is configured, from now (database clock), the first time
                /// any node names it; `true` when this call recorded it. A claim for a recorded
                /// target takes no notification committed before that moment: a webhook added to
                /// a node with history starts from its configuration (migration 43).
                write RegisterNotifyTarget: fn register_notify_target(&self, target: &str) -> bool;
                /// Claims for `owner`, until `claim_ms` from now, at most `max` notifications
                /// whose delivery to `target` is due, not settled and not claimed (or whose claim
                /// lapsed), each with its delivery's epoch + 1. At most one per workflow, and none
                /// of a workflow whose delivery of another to `target` is claimed, so a
                /// workflow's notifications reach a webhook one after the other; owners take
                /// turns (each one's first, oldest owner's first; then each one's second, ...),
                /// and within an owner, their workflows. Two claims at once never take the same
                /// delivery.
                write ClaimNotifications:
                fn claim_notifications(&self, owner: &str, target: &str, claim_ms: u64, max: u32) -> Vec<Notification>;
                /// Settles a claimed delivery if `epoch` is still its claim's (finished: settled
                /// for good, and the row deleted once each of `targets` has settled it or was
                /// registered after it committed; retry:
                /// released with one more attempt, due `after_ms` from now). `false`: another
                /// claim took it, or it is gone, and nothing was written.
                write SettleNotification:
                fn settle_notification(&self, id: &str, target: &str, epoch: i64, settlement: Settlement, targets: &[String]) -> bool;
                /// Deletes every row whose event is older than `retention_ms`, claimed or not;
                /// answers how many.
                write PurgeNotifications: fn purge_notifications(&self, retention_ms: u64) -> u64;
                /// Rows in the outbox: notifications not yet settled by every webhook.
                read NotificationBacklog: fn notification_backlog(&self) -> u64;
            }

            /// Users, their sessions and API tokens.
            trait Users {
                /// Creates a user; with `only_if_first`, only while no user exists at all (the first
                /// admin), atomically across nodes. `false`: nothing was written. A taken email is a
                /// conflict.
                write CreateUser: fn create_user(&self, user: NewUser, only_if_first: bool) -> bool;
                /// The user with this email.
                read UserByEmail: fn user_by_email(&self, email: &str) -> Option<UserRow>;
                /// The user with this id.
                read UserById: fn user_by_id(&self, user_id: &str) -> Option<UserRow>;
                /// Every user, oldest first.
                read ListUsers: fn list_users(&self) -> Vec<UserRow>;
                /// Changes a user's role or disables or enables them, unless that would leave no
                /// enabled admin (checked and changed atomically across nodes). Disabling ends every
                /// session of the user in the same transaction.
                write ChangeUser: fn change_user(&self, user_id: &str, change: UserChange) -> UserChanged;
                /// Sets a user's password hash and, in the same transaction, ends their sessions: every
                /// one, or every one but `keep_session` (the caller's own, when they change their
                /// password). `false`: no such user.
                write SetPassword: fn set_password(
                    &self,
                    user_id: &str,
                    password_hash: &str,
                    keep_session: Option<&str>
                ) -> bool;
                /// Ends a user's sessions: every one (and every cookie minted for them, by bumping
                /// `token_version`), or every one but `keep_session`. API tokens are not sessions and
                /// stay. `false`: no such user.
                write EndSessions:
                fn end_sessions(&self, user_id: &str, keep_session: Option<&str>) -> bool;
                /// Deletes a user with their sessions and API tokens, unless they own a live workflow or
                /// are the last enabled admin. Their finished workflows stay (an admin still sees them).
                write DeleteUser: fn delete_user(&self, user_id: &str) -> UserDeletion;
                /// Opens a session for `user_id` that expires `session_seconds` from now on the database
                /// clock, and records the sign-in as the user's `last_login_at`. The user's ended
                /// sessions are deleted, and their oldest live ones beyond `sessions_max` (this one
                /// included) end.
                write OpenSession: fn open_session(
                    &self,
                    session_id: &str,
                    user_id: &str,
                    session_seconds: u64,
                    sessions_max: u32
                ) -> ();
                /// The enabled user of a session that is neither revoked nor expired.
                read SessionUser: fn session_user(&self, session_id: &str) -> Option<UserRow>;
                /// Revokes one session (logout). `false` when no such session exists.
                write RevokeSession: fn revoke_session(&self, session_id: &str) -> bool;
                /// Records an API token (its hash only). The user's revoked and expired tokens are
                /// deleted first; one more than `token.live_max` live ones is refused
                /// ([`crate::Error::LimitReached`]).
                write CreateToken: fn create_token(&self, token: NewToken) -> TokenRow;
                /// A token that is neither revoked nor expired, with its user, who is not disabled.
                read TokenUser: fn token_user(&self, token_id: &str) -> Option<(TokenRow, UserRow)>;
                /// A token that expired (by the database's clock), neither revoked nor its user
                /// disabled: what tells a caller whose token no longer works that it expired.
                read ExpiredToken: fn expired_token(&self, token_id: &str) -> Option<TokenRow>;
                /// A user's tokens, revoked ones included, oldest first.
                read ListTokens: fn list_tokens(&self, user_id: &str) -> Vec<TokenRow>;
                /// Revokes one of a user's tokens. `false` when it does not exist or was revoked before.
                write RevokeToken: fn revoke_token(&self, user_id: &str, token_id: &str) -> bool;
                /// The bytes `user_id`'s workflows store, or every user's who stores any, by user id:
                /// what [`WriteOp::TakeStorage`] holds to a quota. A user who never stored anything has
                /// no entry.
                read StoredBytes: fn stored_bytes(&self, user_id: Option<&str>) -> Vec<UserStorage>;
            }

            /// What operators and metrics read, and the nodes that started on this database.
            trait Operators {
                /// Workflows by status: this node's (`owner`), or everyone's.
                read WorkflowCounts: fn workflow_counts(&self, owner: Option<&str>) -> Vec<StatusCount>;
                /// The pauses and human checkpoints of live workflows still waiting past their
                /// `remindAfterMs` (by the database's clock): the inbox's overdue items.
                read OverdueWaits: fn overdue_waits(&self) -> u64;
                /// Child runs owned by `owner`, by status.
                read RunCounts: fn run_counts(&self, owner: &str) -> Vec<StatusCount>;
                /// The live workflows that wait for a person (a pause or a human checkpoint without its
                /// control, or a step whose agent asked for approval), `user_id`'s or everyone's, oldest
                /// first, at most `limit`.
                read WaitingWorkflows:
                fn waiting_workflows(&self, user_id: Option<&str>, limit: u32) -> Vec<WorkflowId>;
                /// The child slots held, oldest first, at most `limit`.
                read ListSlots: fn list_slots(&self, limit: u32) -> Vec<SlotRow>;
                /// Records a node that has started.
                write RegisterNode: fn register_node(&self, node: &NodeRecord) -> ();
                /// Records that a node stopped cleanly.
                write MarkNodeStopped: fn mark_node_stopped(&self, worker_id: &str) -> ();
                /// The nodes that started on this database, newest first, at most `limit`.
                read ListNodes: fn list_nodes(&self, limit: u32) -> Vec<NodeRecord>;
            }
        }
    };
}

with_operations!(declare);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_operation_has_its_own_name() {
        for operation in Operation::ALL {
            assert_eq!(Operation::parse(operation.name()), Some(*operation));
        }
        assert_eq!(Operation::FencedWrite.name(), "fenced_write");
        assert!(Operation::FinalizeRun.writes());
        assert!(!Operation::ReadRun.writes());
        assert_eq!(Operation::parse("no_such_call"), None);
    }
}
