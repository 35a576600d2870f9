// The script API's calls that are steps, declared once: `(Variant = "name", ...)`, each the
// script's name for the call, which is also how a journal row stores its kind. Both crates that
// name kinds include this file, `runtime` (`journal.rs`, `CallKind`) and `store` (`step.rs`,
// `StepKind`), since neither depends on the other; each expands the list with a macro of its own.
// A new kind is a line here first; `tests/it/call_kinds.rs` fails naming every place it is
// still missing (the machine's module and table, the API's waits, the script API's document).
macro_rules! with_call_kinds {
    ($then:ident) => {
        $then! {
            /// An agent's run (`agent`).
            Agent = "agent",
            /// A pause a person resolves (`pause`).
            Pause = "pause",
            /// A person's decision on an artifact version (`humanCheckpoint`).
            HumanCheckpoint = "humanCheckpoint",
            /// A file of a step's workspace captured as an artifact (`captureArtifact`).
            CaptureArtifact = "captureArtifact",
            /// An artifact's text read back (`readArtifact`).
            ReadArtifact = "readArtifact",
            /// A durable timer (`sleep`, `sleepUntil`).
            Sleep = "sleep",
            /// A wait for an event sent to the workflow (`waitForEvent`).
            WaitForEvent = "waitForEvent",
        }
    };
}
