//! The store calls a workflow's effects make, and the event each answers: one definition for
//! the supervisor's shell (`mod.rs`, over the store actor) and the simulation (over the
//! simulation store), so that what the machine hears of a write or a read is the same in both.
//! The simulation injects its faults around [`StoreCall::perform`].

use runtime::CallId;
use store::{
    ArtifactRow, ControlRow, ControlWrite, Fence, NewControl, RunId, RunRow, SentEvent, StepRow,
    WorkflowId, WriteOp,
};

use super::machine::deadline::ControlBy;
use super::machine::{ControlsFor, Effect, Event, RunReadFor};

/// What a workflow's supervisor needs of the store: the store actor's handle in a node, the
/// simulation store in the simulation.
pub(crate) trait WorkflowStore {
    fn fenced_write(
        &self,
        fence: &Fence,
        ops: Vec<WriteOp>,
    ) -> impl Future<Output = store::Result<()>>;
    fn last_artifact_version(
        &self,
        workflow_id: &WorkflowId,
    ) -> impl Future<Output = store::Result<i64>>;
    fn read_steps(
        &self,
        workflow_id: &WorkflowId,
    ) -> impl Future<Output = store::Result<Vec<StepRow>>>;
    fn read_run(&self, run_id: &RunId) -> impl Future<Output = store::Result<Option<RunRow>>>;
    fn read_controls(
        &self,
        workflow_id: &WorkflowId,
    ) -> impl Future<Output = store::Result<Vec<ControlRow>>>;
    fn put_control(&self, control: NewControl)
    -> impl Future<Output = store::Result<ControlWrite>>;
    fn pending_events(
        &self,
        workflow_id: &WorkflowId,
        names: Vec<String>,
        per_name: u32,
    ) -> impl Future<Output = store::Result<Vec<SentEvent>>>;
    fn read_artifact(
        &self,
        workflow_id: &WorkflowId,
        version: i64,
    ) -> impl Future<Output = store::Result<Option<ArtifactRow>>>;
}

/// An effect that is a store call.
#[derive(Debug, Clone)]
pub(crate) enum StoreCall {
    ReadJournal,
    Write(Vec<WriteOp>),
    ReadRun {
        id: CallId,
        run_id: RunId,
        purpose: RunReadFor,
    },
    ReadControls(ControlsFor),
    ReadEvents {
        names: Vec<String>,
        per_name: u32,
    },
    PutControl {
        control: NewControl,
        by: ControlBy,
    },
    ReadArtifact {
        id: CallId,
        version: i64,
    },
}

/// An effect, told apart: a store call, or any other (which its performer carries out itself).
#[allow(
    clippy::large_enum_variant,
    reason = "built and taken apart at once, as large as the effect it holds; a box would allocate for every effect"
)]
pub(crate) enum Routed {
    Store(StoreCall),
    Other(Effect),
}

impl StoreCall {
    /// The store call `effect` is, or the effect back when it is none.
    pub(crate) fn of(effect: Effect) -> Routed {
        Routed::Store(match effect {
            Effect::ReadJournal => StoreCall::ReadJournal,
            Effect::Write(ops) => StoreCall::Write(ops),
            Effect::ReadRun {
                id,
                run_id,
                purpose,
            } => StoreCall::ReadRun {
                id,
                run_id,
                purpose,
            },
            Effect::ReadControls(purpose) => StoreCall::ReadControls(purpose),
            Effect::ReadEvents { names, per_name } => StoreCall::ReadEvents { names, per_name },
            Effect::PutControl { control, by } => StoreCall::PutControl { control, by },
            Effect::ReadArtifact { id, version } => StoreCall::ReadArtifact { id, version },
            other => return Routed::Other(other),
        })
    }

    /// Makes the call on `store`, for the workflow `fence` names; answers its event.
    pub(crate) async fn perform(self, store: &impl WorkflowStore, fence: &Fence) -> Event {
        let workflow_id = &fence.resource_id;
        match self {
            StoreCall::ReadJournal => {
                let read = match store.last_artifact_version(workflow_id).await {
                    Ok(version) => store
                        .read_steps(workflow_id)
                        .await
                        .map(|steps| (version, steps)),
                    Err(error) => Err(error),
                };
                Event::JournalRead(read)
            }
            StoreCall::Write(ops) => match store.fenced_write(fence, ops).await {
                Ok(()) => Event::Written,
                Err(error) => Event::WriteFailed(error),
            },
            StoreCall::ReadRun {
                id,
                run_id,
                purpose,
            } => {
                let result = store.read_run(&run_id).await;
                Event::RunRead {
                    id,
                    run_id,
                    purpose,
                    result,
                }
            }
            StoreCall::ReadControls(purpose) => Event::Controls {
                purpose,
                result: store.read_controls(workflow_id).await,
            },
            StoreCall::ReadEvents { names, per_name } => {
                Event::EventsRead(store.pending_events(workflow_id, names, per_name).await)
            }
            StoreCall::PutControl { control, by } => Event::ControlRecorded {
                by,
                result: store.put_control(control).await,
            },
            StoreCall::ReadArtifact { id, version } => Event::ArtifactRead {
                id,
                version,
                result: store
                    .read_artifact(workflow_id, version)
                    .await
                    .map(|artifact| artifact.map(|artifact| artifact.content)),
            },
        }
    }
}

impl WorkflowStore for crate::store_actor::StoreHandle {
    async fn fenced_write(&self, fence: &Fence, ops: Vec<WriteOp>) -> store::Result<()> {
        crate::store_actor::StoreHandle::fenced_write(self, fence, ops).await
    }
    async fn last_artifact_version(&self, workflow_id: &WorkflowId) -> store::Result<i64> {
        crate::store_actor::StoreHandle::last_artifact_version(self, workflow_id).await
    }
    async fn read_steps(&self, workflow_id: &WorkflowId) -> store::Result<Vec<StepRow>> {
        crate::store_actor::StoreHandle::read_steps(self, workflow_id).await
    }
    async fn read_run(&self, run_id: &RunId) -> store::Result<Option<RunRow>> {
        crate::store_actor::StoreHandle::read_run(self, run_id).await
    }
    async fn read_controls(&self, workflow_id: &WorkflowId) -> store::Result<Vec<ControlRow>> {
        crate::store_actor::StoreHandle::read_controls(self, workflow_id).await
    }
    async fn put_control(&self, control: NewControl) -> store::Result<ControlWrite> {
        crate::store_actor::StoreHandle::put_control(self, control).await
    }
    async fn pending_events(
        &self,
        workflow_id: &WorkflowId,
        names: Vec<String>,
        per_name: u32,
    ) -> store::Result<Vec<SentEvent>> {
        crate::store_actor::StoreHandle::pending_events(self, workflow_id, names, per_name).await
    }
    async fn read_artifact(
        &self,
        workflow_id: &WorkflowId,
        version: i64,
    ) -> store::Result<Option<ArtifactRow>> {
        crate::store_actor::StoreHandle::read_artifact(self, workflow_id, version).await
    }
}
