//! Errors of the runtime: why a workflow script could not start.

/// Why a VM could not be started.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The script or its arguments are over a limit; the message names it.
    #[error("{0}")]
    LimitExceeded(String),
    /// The script does not compile.
    #[error("{0}")]
    Script(String),
    /// QuickJS could not be set up.
    #[error("script engine: {0}")]
    Engine(String),
}
