//! Fault points (spec section 9), for tests and inert in production: when `REINS_FAULT_DIR` is
//! set, the node reads `arm.json` (`{"boundary": NAME}`) there; the first time the workflow code
//! reaches that boundary, it writes `reached.json` and waits until a file `release` appears (or
//! the process is killed). Boundaries: `before_admission`, `admission`, `result_before`, `result`,
//! `approval`, `capture`, `cancelling`, and `retry_copy` (a retry about to copy the workspaces it
//! adopts). What a released stale owner then meets at admission or
//! capture is written to `admission_error` or `capture_error` (`LeaseLost` when it was fenced).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use store::WorkflowId;

/// How often a held boundary looks for its `release` file.
const RELEASE_POLL: Duration = Duration::from_millis(20);

/// The fault points of one node.
#[derive(Debug, Clone)]
pub struct FaultPoints {
    dir: PathBuf,
    /// The armed boundary holds once per process.
    fired: Arc<AtomicBool>,
}

impl FaultPoints {
    pub fn new(dir: PathBuf) -> Self {
        FaultPoints {
            dir,
            fired: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Writes what a write at `point` (`admission_error`, `capture_error`) failed with.
    pub async fn record_error(&self, point: &str, error: &store::Error) {
        let text = match error {
            store::Error::LeaseLost { .. } => "LeaseLost".to_owned(),
            other => other.to_string(),
        };
        if let Err(failure) = tokio::fs::write(self.dir.join(point), text).await {
            tracing::error!(%failure, point, "cannot write the fault record");
        }
    }

    /// Holds here if `boundary` is the armed one and has not held before in this process.
    pub async fn reach(&self, boundary: &str, workflow_id: &WorkflowId) {
        let armed = tokio::fs::read(self.dir.join("arm.json"))
            .await
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|arm| arm["boundary"].as_str().map(str::to_owned));
        if armed.as_deref() != Some(boundary) || self.fired.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::warn!(
            boundary,
            %workflow_id,
            "fault point reached: holding until released"
        );
        let reached = serde_json::json!({
            "boundary": boundary,
            "run_id": workflow_id,
            "pid": std::process::id(),
        });
        if let Err(error) =
            tokio::fs::write(self.dir.join("reached.json"), reached.to_string()).await
        {
            tracing::error!(%error, "cannot write reached.json");
        }
        while !tokio::fs::try_exists(self.dir.join("release"))
            .await
            .unwrap_or(false)
        {
            tokio::time::sleep(RELEASE_POLL).await;
        }
    }
}
