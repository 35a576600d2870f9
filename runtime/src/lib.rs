//! The workflow script sandbox. It will run workflow scripts in QuickJS with time and randomness
//! injected and no IO of its own (see the durable-workflows issue). Until then it holds the one
//! thing every node already reports: the version of the replay rules it implements.

/// Identifies everything that changes how a journal replays. A node refuses to recover a workflow
/// whose journal was written under a different runtime version. It changes whenever the script
/// API, the engine build or a replay-relevant limit changes.
pub const RUNTIME_VERSION: &str = "reins-runtime-0";
