//! Agent backends: what a child run executes. Each configured agent has a name, a kind and a
//! `configuration_version` (a digest of its canonical definition, so a recovery can tell whether a
//! step would run under the same configuration). Backends run off the actor mailbox, in a task,
//! watch a cancel channel and signal their progress (what `timeout.idle_ms` measures); a failure
//! says what it means for a retry ([`RunFailure`]).

mod command;
pub mod confinement;
mod openai;
mod process;
mod scripted;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use runtime::policy::{Names, RetryOptions, TimeoutOptions};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use store::{CancelAction, RunFailure, RunId};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

pub use command::{CommandAgent, CommandConfig};
pub use confinement::ConfinementMode;
pub use openai::{OpenAiAgent, OpenAiConfig};
pub use process::{Leftover, ProcessRecords, records_dir};
pub use scripted::ScriptedAgent;

/// One entry of the configuration's `agents` list: its `kind` and that kind's settings.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum AgentConfig {
    /// Built in and deterministic: directed by its task (see [`ScriptedAgent`]).
    Scripted {
        name: String,
        #[serde(default, skip_serializing_if = "is_default")]
        retry: RetryOptions,
        #[serde(default, skip_serializing_if = "is_default")]
        timeout: TimeoutOptions,
        #[serde(default, skip_serializing_if = "is_default")]
        idempotent: bool,
    },
    /// A program speaking JSON lines (see [`CommandAgent`]).
    Command(CommandConfig),
    /// An OpenAI-compatible chat-completions endpoint (see [`OpenAiAgent`]).
    #[serde(rename = "openai")]
    OpenAi(OpenAiConfig),
}

impl AgentConfig {
    /// A scripted agent with the defaults: no retry, no timeout, not idempotent.
    pub fn scripted(name: impl Into<String>) -> Self {
        AgentConfig::Scripted {
            name: name.into(),
            retry: RetryOptions::default(),
            timeout: TimeoutOptions::default(),
            idempotent: false,
        }
    }

    /// The name steps and requests use to pick this agent.
    pub fn name(&self) -> &str {
        match self {
            AgentConfig::Scripted { name, .. } => name,
            AgentConfig::Command(command) => &command.name,
            AgentConfig::OpenAi(openai) => &openai.name,
        }
    }

    /// What its steps retry, time out and recover by, unless a call says otherwise: the
    /// configured keys over the backend's defaults (see `docs/agents.md`).
    pub fn step_defaults(&self) -> StepDefaults {
        let defaults = self.configured_defaults();
        // Declared idempotent, an agent's lost runs are meant to run again: three attempts
        // unless its configuration says how many.
        let idempotent_attempts = RetryOptions {
            max_attempts: defaults.idempotent.then_some(IDEMPOTENT_ATTEMPTS),
            ..RetryOptions::default()
        };
        StepDefaults {
            retry: defaults.retry.over(&idempotent_attempts),
            ..defaults
        }
    }

    /// The configured keys over the backend's defaults.
    fn configured_defaults(&self) -> StepDefaults {
        match self {
            AgentConfig::Scripted {
                retry,
                timeout,
                idempotent,
                ..
            } => StepDefaults {
                retry: retry.clone(),
                timeout: *timeout,
                idempotent: *idempotent,
            },
            AgentConfig::Command(command) => StepDefaults {
                retry: command.retry.clone(),
                timeout: command.timeout.over(&command::TIMEOUT_DEFAULTS),
                idempotent: command.idempotent,
            },
            AgentConfig::OpenAi(openai) => StepDefaults {
                retry: openai.retry.over(&openai::retry_defaults(openai.retries)),
                timeout: openai.timeout,
                idempotent: openai.idempotent,
            },
        }
    }
}

/// An idempotent agent's attempts when its configuration names none.
pub const IDEMPOTENT_ATTEMPTS: u32 = 3;

/// An agent's step defaults (see [`AgentConfig::step_defaults`]); a call's own keys win.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepDefaults {
    pub retry: RetryOptions,
    pub timeout: TimeoutOptions,
    /// Whether a run whose outcome is unknown (orphaned, or live on a node that is gone) may be
    /// closed and run again as the next attempt without a person.
    pub idempotent: bool,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// What an agent is asked to do.
#[derive(Debug, Clone)]
pub struct AgentRequest {
    pub run_id: RunId,
    pub thread_id: String,
    /// A string (plain text) or JSON.
    pub task: Value,
    /// The thread's `/mnt/user-data/` on disk.
    pub workspace: PathBuf,
    /// `REINS_FAULT_DIR`, where tests leave files agents may wait on.
    pub fault_dir: Option<PathBuf>,
    /// Where a process agent records its process group while it runs (see [`ProcessRecords`]).
    pub process_records: Option<ProcessRecords>,
    /// How a process agent is confined (see [`confinement`]).
    pub confinement: ConfinementMode,
    /// The step's attempt this run is (1 for the first, and for a run of no workflow).
    pub attempt: i32,
}

/// How a running agent is steered, and how it speaks up while it runs.
pub struct AgentControl {
    /// Set when the run must stop, with how.
    pub cancel: watch::Receiver<Option<CancelAction>>,
    /// An agent that stays alive while a human decides sends its approval request here.
    pub pauses: mpsc::UnboundedSender<Value>,
    /// The answers to those requests: `{"request_id", "answer"}`.
    pub answers: mpsc::UnboundedReceiver<Value>,
    /// Where the agent says it is still working (see [`Progress`]).
    pub progress: Progress,
}

impl AgentControl {
    /// Control for an agent nobody will answer (its pauses go nowhere) and nobody times out:
    /// tests and tools.
    pub fn unanswered(cancel: watch::Receiver<Option<CancelAction>>) -> Self {
        let (pauses, _) = mpsc::unbounded_channel();
        let (_, answers) = mpsc::unbounded_channel();
        AgentControl {
            cancel,
            pauses,
            answers,
            progress: Progress::channel().0,
        }
    }
}

/// An agent's progress signals (a `command` agent's stdout lines, the `openai` agent's answer
/// arriving): the time of the latest, which is what `timeout.idle_ms` measures from. A signal
/// only overwrites one value, so a flood of them costs the run nothing; the run reads it when its
/// idle deadline comes.
#[derive(Debug, Clone)]
pub struct Progress(watch::Sender<Instant>);

impl Progress {
    /// A signal, and the reader of its latest time (the run's start until the first signal).
    pub fn channel() -> (Progress, watch::Receiver<Instant>) {
        let (signal, latest) = watch::channel(Instant::now());
        (Progress(signal), latest)
    }

    /// The agent is still working, now.
    pub fn signal(&self) {
        self.0.send_replace(Instant::now());
    }
}

/// How an agent's execution ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEnd {
    Completed {
        output: Value,
        total_tokens: i64,
        message_count: i64,
    },
    Failed {
        message: String,
        /// What the failure says about trying the step again.
        failure: RunFailure,
    },
    /// The agent asks a human to approve an action and ends its run in that pause
    /// (`metadata.hitl_approval`); the answer ends the run.
    WaitingForInput { approval: Value },
    /// A cancel request stopped it.
    Interrupted { action: CancelAction },
}

impl AgentEnd {
    /// A failure that says nothing about retrying (the policy's default holds).
    pub fn failed(message: impl Into<String>) -> Self {
        AgentEnd::Failed {
            message: message.into(),
            failure: RunFailure::default(),
        }
    }
}

/// A configured agent, ready to run.
#[derive(Debug)]
pub struct Agent {
    pub name: String,
    pub configuration_version: String,
    /// What its steps retry, time out and recover by, unless a call says otherwise.
    pub defaults: StepDefaults,
    backend: Backend,
}

#[derive(Debug)]
enum Backend {
    Scripted(ScriptedAgent),
    /// Boxed, like the next: its settings are large, and agents live behind an `Arc` anyway.
    Command(Box<CommandAgent>),
    /// Boxed: the HTTP client is large.
    OpenAi(Box<OpenAiAgent>),
}

impl Agent {
    /// Runs the agent until it ends or is cancelled.
    pub async fn run(&self, request: AgentRequest, control: AgentControl) -> AgentEnd {
        match &self.backend {
            Backend::Scripted(agent) => agent.run(request, control.cancel).await,
            Backend::Command(agent) => agent.run(request, control).await,
            Backend::OpenAi(agent) => agent.run(request, control.cancel, control.progress).await,
        }
    }
}

/// Every configured agent by name.
#[derive(Debug, Default)]
pub struct AgentRegistry {
    agents: BTreeMap<String, Arc<Agent>>,
}

/// Why the `agents` configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum AgentConfigError {
    #[error("agent name {0:?} is used twice")]
    Duplicate(String),
    #[error("agent name {0:?} is invalid: use 1 to 64 letters, digits, '-', '_' or '.'")]
    Name(String),
    #[error("agent {agent:?}: {message}")]
    Environment { agent: String, message: String },
    #[error("agent {agent:?}: {message}")]
    Program { agent: String, message: String },
    #[error("agent {agent:?}: {message}")]
    Policy { agent: String, message: String },
}

impl AgentRegistry {
    /// Builds the registry, refusing duplicate or malformed names.
    pub fn new(configs: &[AgentConfig]) -> Result<Self, AgentConfigError> {
        let mut agents = BTreeMap::new();
        for config in configs {
            let name = config.name();
            let valid = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
            if !valid {
                return Err(AgentConfigError::Name(name.to_owned()));
            }
            let defaults = config.step_defaults();
            defaults
                .retry
                .check(Names::Configuration)
                .and_then(|()| defaults.timeout.check(Names::Configuration))
                .map_err(|message| AgentConfigError::Policy {
                    agent: name.to_owned(),
                    message,
                })?;
            let backend = match config {
                AgentConfig::Scripted { .. } => Backend::Scripted(ScriptedAgent),
                AgentConfig::Command(settings) => {
                    process::check_program(&settings.program).map_err(|message| {
                        AgentConfigError::Program {
                            agent: name.to_owned(),
                            message,
                        }
                    })?;
                    process::check_environment(settings).map_err(|message| {
                        AgentConfigError::Environment {
                            agent: name.to_owned(),
                            message,
                        }
                    })?;
                    Backend::Command(Box::new(CommandAgent {
                        settings: settings.clone(),
                    }))
                }
                AgentConfig::OpenAi(settings) => {
                    Backend::OpenAi(Box::new(OpenAiAgent::new(settings.clone())))
                }
            };
            let agent = Agent {
                name: name.to_owned(),
                configuration_version: configuration_version(config),
                defaults,
                backend,
            };
            if agents.insert(name.to_owned(), Arc::new(agent)).is_some() {
                return Err(AgentConfigError::Duplicate(name.to_owned()));
            }
        }
        Ok(AgentRegistry { agents })
    }

    pub fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.agents.get(name).cloned()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.agents.keys().map(String::as_str)
    }

    /// The settings of every `command` agent (what [`confinement::check`] checks).
    pub fn commands(&self) -> Vec<&CommandConfig> {
        self.agents
            .values()
            .filter_map(|agent| match &agent.backend {
                Backend::Command(command) => Some(&command.settings),
                _ => None,
            })
            .collect()
    }

    /// A digest of every agent's definition (by name): what a workflow launched here records,
    /// and what a node must have to replay it.
    pub fn configuration_version(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut digest = Sha256::new();
        for (name, agent) in &self.agents {
            digest.update(name.as_bytes());
            digest.update([0]);
            digest.update(agent.configuration_version.as_bytes());
            digest.update([0]);
        }
        digest
            .finalize()
            .iter()
            .take(16)
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Resolves once a cancel action is set (never, if the sender is gone without one).
async fn cancelled(cancel: &mut watch::Receiver<Option<CancelAction>>) -> CancelAction {
    let action = cancel
        .wait_for(Option::is_some)
        .await
        .map(|action| action.unwrap_or(CancelAction::Interrupt));
    match action {
        Ok(action) => action,
        Err(_) => std::future::pending().await,
    }
}

/// A digest of the agent's canonical definition: its JSON with keys in a fixed order.
fn configuration_version(config: &AgentConfig) -> String {
    use sha2::{Digest, Sha256};
    // serde_json writes fields in declaration order, so the same definition always gives the
    // same text.
    let canonical = serde_json::to_vec(config).unwrap_or_default();
    let digest = Sha256::digest(&canonical);
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scripted(name: &str) -> AgentConfig {
        AgentConfig::scripted(name)
    }

    #[test]
    fn names_are_unique_and_versions_follow_the_definition() {
        let registry = AgentRegistry::new(&[scripted("echo"), scripted("other")]).expect("valid");
        let (echo, other) = (
            registry.get("echo").expect("echo"),
            registry.get("other").expect("other"),
        );
        assert_ne!(echo.configuration_version, other.configuration_version);
        assert_eq!(
            echo.configuration_version,
            AgentRegistry::new(&[scripted("echo")])
                .expect("valid")
                .get("echo")
                .expect("echo")
                .configuration_version
        );
        assert!(AgentRegistry::new(&[scripted("a"), scripted("a")]).is_err());
        assert!(AgentRegistry::new(&[scripted("no spaces")]).is_err());
    }

    #[test]
    fn step_defaults_come_from_the_configuration_over_the_backends() {
        let openai: AgentConfig = serde_json::from_value(serde_json::json!({
            "kind": "openai", "name": "llm", "base_url": "http://127.0.0.1:1/v1", "model": "m",
            "retries": 4, "retry": {"max_interval_ms": 2_000}, "idempotent": true
        }))
        .expect("valid");
        let defaults = openai.step_defaults();
        let policy = defaults.retry.policy();
        assert_eq!((policy.max_attempts, policy.max_interval_ms), (5, 2_000));
        assert!(defaults.idempotent);
        let command: AgentConfig = serde_json::from_value(serde_json::json!({
            "kind": "command", "name": "c", "program": "/bin/true", "timeout": {"idle_ms": 500}
        }))
        .expect("valid");
        let timeout = command.step_defaults().timeout;
        assert_eq!(
            (timeout.attempt_ms, timeout.idle_ms),
            (Some(3_600_000), Some(500))
        );
        assert_eq!(scripted("s").step_defaults(), StepDefaults::default());
        let idempotent: AgentConfig = serde_json::from_value(serde_json::json!({
            "kind": "scripted", "name": "s", "idempotent": true
        }))
        .expect("valid");
        assert_eq!(idempotent.step_defaults().retry.policy().max_attempts, 3);
        let absurd: AgentConfig = serde_json::from_value(serde_json::json!({
            "kind": "scripted", "name": "s", "retry": {"max_attempts": 1_000_000_000}
        }))
        .expect("parsed");
        let refused = AgentRegistry::new(&[absurd]).expect_err("over the bound");
        assert!(
            refused
                .to_string()
                .contains("retry.max_attempts is 1000000000: it must be 1 to 100"),
            "{refused}"
        );
        let unknown = serde_json::from_value::<AgentConfig>(serde_json::json!({
            "kind": "scripted", "name": "s", "retry": {"attempts": 3}
        }));
        assert!(unknown.is_err_and(|e| e.to_string().contains("attempts")));
    }

    #[test]
    fn a_command_agent_is_read_from_its_kind_with_defaults() {
        let config: AgentConfig = serde_json::from_value(serde_json::json!({
            "kind": "command", "name": "coder", "program": "/bin/true", "args": ["-x"]
        }))
        .expect("valid");
        let AgentConfig::Command(command) = &config else {
            panic!("not a command agent: {config:?}");
        };
        assert_eq!((command.name.as_str(), command.grace_ms), ("coder", 5_000));
        let unknown = serde_json::from_value::<AgentConfig>(serde_json::json!({
            "kind": "command", "name": "coder", "program": "/bin/true", "shell": true
        }));
        assert!(unknown.is_err_and(|e| e.to_string().contains("shell")));
    }

    #[test]
    fn a_relative_program_is_refused_when_the_node_starts() {
        let config: AgentConfig = serde_json::from_value(serde_json::json!({
            "kind": "command", "name": "coder", "program": "agents/coder.sh"
        }))
        .expect("valid");
        let refused = AgentRegistry::new(&[config]);
        assert!(
            matches!(&refused, Err(AgentConfigError::Program { agent, .. }) if agent == "coder"),
            "{refused:?}"
        );
    }
}
