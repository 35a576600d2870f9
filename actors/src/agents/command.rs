//! The `command` agent: runs a program with the thread's workspace as its working folder, in a
//! process group of its own. The task goes to stdin as one JSON line,
//! `{"type": "task", "run_id", "thread_id", "task"}`, and stdin is then closed. The program speaks
//! JSON lines on stdout:
//!
//! | line | meaning |
//! | --- | --- |
//! | `{"type": "output", "output": any}` | the run's output (the last one counts) |
//! | `{"type": "progress", ...}` | progress, logged and counted as a message |
//! | `{"type": "usage", "total_tokens": N}` | the token count recorded for the run |
//! | `{"type": "approval_request", "request_id", "actions"}` | pause for approval (see below) |
//! | `{"type": "error", "message", "retryable"?, "retry_after_ms"?, "code"?}` | the run fails (see below) |
//!
//! Every protocol line is a progress signal (what `timeout.idle_ms` measures).
//! An approval request leaves the program running: the run waits in `waiting_for_input` until a
//! human answers (on any node), and the answer comes back on stdin as one line,
//! `{"type": "approval_answer", "request_id", "answer"}`, within one lease renewal. Stdin stays
//! open for these answers, so a program reads its task as one line, not to end of file.
//!
//! Exit status 0 ends the run with the last output; any other exit is `error` with the tail of
//! stderr, and its failure's code is `exit_N` (`signal_N` for a signal), which says nothing of a
//! retry but for 75 (`EX_TEMPFAIL`): retryable. An `error` line decides the run whatever the exit
//! status: it ends `error` with the line's message, and what the line says of a retry
//! (`retryable`, `retry_after_ms` at most a day, a `code` of 1 to 64 of A-Z, a-z, 0-9, `-`, `_`
//! and `.`). A line that is not one of these, a line over `line_bytes_max`, or more than
//! `output_bytes_max` on stdout is a protocol violation: the run ends as `error` (code `protocol`, not retryable) and the program
//! is stopped. Cancellation sends SIGTERM to the whole process group, then SIGKILL after
//! `grace_ms`.
//!
//! The program starts with a clean environment (see [`super::process`]: `PATH`, `HOME`, `LANG`,
//! `TMPDIR`, then `env_pass` and `env`), confined to its workspace, its temporary folder and the
//! system's files (see [`super::confinement`]), under a guard that kills everything it started
//! when its run ends or the node dies. Its
//! stderr is untrusted text: only its last `stderr_tail_bytes` are kept, with control characters
//! escaped, so that it reads as one value wherever the error goes (the run's row, the log).

use std::collections::{BTreeMap, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio_util::codec::{FramedRead, LinesCodec, LinesCodecError};

use runtime::policy::{CODE_GRAMMAR, RetryOptions, TimeoutOptions, is_code};
use store::{CancelAction, FailureClass, RunFailure};
use tokio::sync::{mpsc, watch};

use super::confinement::{self, ConfinementMode, RunPlaces};
use super::process::{self, StopLine};
use super::{AgentControl, AgentEnd, AgentRequest, Progress, cancelled};

/// How often a stopping agent looks for processes left in its group.
const GROUP_POLL: Duration = Duration::from_millis(20);
/// How long past `grace_ms` a stopping agent waits for its guard to have killed what was left
/// of the run before it SIGKILLs the group itself (the guard included).
const GUARD_STOP_MARGIN: Duration = Duration::from_secs(2);
/// The longest wait before a retry an `error` line may ask for: a day.
const RETRY_AFTER_MS_MAX: u64 = 86_400_000;
/// The exit status that says "try again later" (`EX_TEMPFAIL` of sysexits.h).
const EXIT_TEMPFAIL: i32 = 75;

/// A `command` agent's entry in the configuration.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CommandConfig {
    pub name: String,
    /// The program to run (a path, or a name looked up in PATH).
    pub program: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables set in the program's environment (after `env_pass`, so these win).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Variables of the node's environment passed on to the program when set there. Nothing
    /// else of the node's environment is (see [`super::process`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env_pass: Vec<String>,
    /// Folders or files the program may read and execute beneath, besides the system's (see
    /// [`super::confinement`]): a tool's own install, a model cache. Absolute; never the node's
    /// own places.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_paths: Vec<PathBuf>,
    /// Folders or files the program may also write beneath, besides its workspace and its
    /// temporary folder. Absolute; never the node's own places.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_paths: Vec<PathBuf>,
    /// How long the program may take after SIGTERM before SIGKILL.
    #[serde(default = "default_grace_ms")]
    pub grace_ms: u64,
    /// The longest stdout line.
    #[serde(default = "default_line_bytes_max")]
    pub line_bytes_max: usize,
    /// All of stdout at most.
    #[serde(default = "default_output_bytes_max")]
    pub output_bytes_max: usize,
    /// How much of stderr's end an error carries.
    #[serde(default = "default_stderr_tail_bytes")]
    pub stderr_tail_bytes: usize,
    /// Its steps' retry policy, unless a call says otherwise (none: one attempt).
    #[serde(default, skip_serializing_if = "super::is_default")]
    pub retry: RetryOptions,
    /// Its steps' timeouts, unless a call says otherwise (over [`TIMEOUT_DEFAULTS`]).
    #[serde(default, skip_serializing_if = "super::is_default")]
    pub timeout: TimeoutOptions,
    /// Whether a run of it whose outcome is unknown may run again without a person.
    #[serde(default, skip_serializing_if = "super::is_default")]
    pub idempotent: bool,
}

/// A `command` agent's attempt ends after an hour unless configured otherwise: one that hangs
/// gives its slot back. No `idle_ms` by default: the protocol's `progress` lines are optional.
pub(super) const TIMEOUT_DEFAULTS: TimeoutOptions = TimeoutOptions {
    attempt_ms: Some(3_600_000),
    idle_ms: None,
    total_ms: None,
    approval_ms: None,
};

fn default_grace_ms() -> u64 {
    5_000
}
fn default_line_bytes_max() -> usize {
    64 * 1024
}
fn default_output_bytes_max() -> usize {
    1024 * 1024
}
fn default_stderr_tail_bytes() -> usize {
    4 * 1024
}

#[derive(Debug)]
pub struct CommandAgent {
    pub settings: CommandConfig,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Line {
    Output {
        output: Value,
    },
    Progress {
        #[serde(flatten)]
        _rest: serde_json::Map<String, Value>,
    },
    Usage {
        /// Never negative: a line that says so is a protocol error.
        total_tokens: u64,
    },
    ApprovalRequest {
        request_id: String,
        #[serde(default)]
        actions: Vec<Value>,
    },
    Error {
        message: String,
        #[serde(default)]
        retryable: Option<bool>,
        #[serde(default)]
        retry_after_ms: Option<u64>,
        #[serde(default)]
        code: Option<String>,
    },
}

impl CommandAgent {
    pub async fn run(&self, request: AgentRequest, control: AgentControl) -> AgentEnd {
        let AgentControl {
            cancel,
            pauses,
            mut answers,
            progress,
        } = control;
        let settings = &self.settings;
        // The run's temporary folder sits beside its workspace (never captured), fresh for
        // each run and removed after it. Absolute: the program runs in another folder than
        // the node (whose `workspaces_dir` may be relative).
        let tmp = request.workspace.with_file_name("tmp");
        let tmp = std::path::absolute(&tmp).unwrap_or(tmp);
        if let Err(e) = fresh_folders(&request.workspace, &tmp).await {
            return failed(format!("cannot create the workspace: {e}"));
        }
        let environment = process::environment(settings, &tmp, request.attempt, |name| {
            std::env::var_os(name)
        });
        let ruleset = match request.confinement {
            ConfinementMode::None => None,
            ConfinementMode::Landlock => {
                let program = confinement::program_path(
                    &settings.program,
                    environment.get(OsStr::new("PATH")).map(OsString::as_os_str),
                );
                let (settings, workspace, tmp) =
                    (settings.clone(), request.workspace.clone(), tmp.clone());
                let built = tokio::task::spawn_blocking(move || {
                    let places = RunPlaces {
                        program,
                        workspace: &workspace,
                        tmp: &tmp,
                    };
                    confinement::ruleset(&settings, &places)
                })
                .await;
                match built {
                    Ok(Ok(ruleset)) => Some(ruleset),
                    Ok(Err(e)) => return failed(e.to_string()),
                    Err(e) => return failed(format!("cannot confine the agent: {e}")),
                }
            }
        };
        let talk = Talk {
            cancel,
            pauses,
            answers: &mut answers,
            progress,
        };
        let end = self
            .start_and_drive(&request, ruleset, environment, talk)
            .await;
        if let Err(e) = tokio::fs::remove_dir_all(&tmp).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(run_id = %request.run_id, error = %e, "cannot remove the run's temporary folder");
        }
        end
    }

    async fn start_and_drive(
        &self,
        request: &AgentRequest,
        ruleset: Option<OwnedFd>,
        environment: BTreeMap<OsString, OsString>,
        talk: Talk<'_>,
    ) -> AgentEnd {
        let settings = &self.settings;
        let mut command = Command::new(&settings.program);
        command
            .args(&settings.args)
            .env_clear()
            .envs(environment)
            .current_dir(&request.workspace)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            // Dropped, the run pulls its stop line instead: the guard winds everything of the
            // run down, which a SIGKILL of the guard alone would not (tokio reaps it after).
            .kill_on_drop(false);
        let guard = match process::guard(&mut command, settings.grace_ms, ruleset) {
            Ok(guard) => guard,
            Err(e) => return failed(format!("cannot guard {:?}: {e}", settings.program)),
        };
        let spawned = command.spawn();
        let mut stop_line = guard.started();
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => return failed(format!("cannot start {:?}: {e}", settings.program)),
        };
        let group = child.id().and_then(|pid| i32::try_from(pid).ok());
        let records = request.process_records.as_ref();
        if let (Some(records), Some(group)) = (records, group)
            && let Err(e) = records.record(&request.run_id, group).await
        {
            stop(&mut child, Some(group), &mut stop_line, settings.grace_ms).await;
            return failed(format!("cannot record the program's process group: {e}"));
        }
        let end = self
            .drive(request, talk, (&mut child, group, &mut stop_line))
            .await;
        if let Some(records) = records {
            records.forget(&request.run_id).await;
        }
        end
    }

    /// Talks to the started program until its run is decided, and leaves nothing of its group
    /// running.
    async fn drive(
        &self,
        request: &AgentRequest,
        talk: Talk<'_>,
        (child, group, stop_line): (&mut Child, Option<i32>, &mut StopLine),
    ) -> AgentEnd {
        let Talk {
            mut cancel,
            pauses,
            answers,
            progress,
        } = talk;
        let settings = &self.settings;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return failed("the program's pipes were not available".into());
        };
        let task = json!({
            "type": "task",
            "run_id": request.run_id,
            "thread_id": request.thread_id,
            "task": request.task,
        });
        let mut line = task.to_string();
        line.push('\n');
        // A program that never reads its task still gets to run; its exit decides.
        let _ = stdin.write_all(line.as_bytes()).await;

        let stderr_tail = tokio::spawn(read_tail(stderr, settings.stderr_tail_bytes));
        let mut lines = FramedRead::new(
            stdout,
            LinesCodec::new_with_max_length(settings.line_bytes_max),
        );
        let mut state = Said::default();
        let mut exited = None;
        let verdict = loop {
            tokio::select! {
                next = lines.next() => match next {
                    None => break None,
                    Some(Ok(text)) => {
                        state.bytes += text.len() + 1;
                        if state.bytes > settings.output_bytes_max {
                            break Some(protocol_violation(format!(
                                "the program wrote more than output_bytes_max ({} bytes) to stdout",
                                settings.output_bytes_max
                            )));
                        }
                        match state.read(&text) {
                            Ok(None) => progress.signal(),
                            Ok(Some(approval)) => {
                                progress.signal();
                                // The node records the pause; the program waits on stdin.
                                let _ = pauses.send(approval);
                            }
                            Err(message) => break Some(protocol_violation(message)),
                        }
                    }
                    Some(Err(LinesCodecError::MaxLineLengthExceeded)) => {
                        break Some(protocol_violation(format!(
                            "line {} is longer than line_bytes_max ({} bytes)",
                            state.lines + 1,
                            settings.line_bytes_max
                        )));
                    }
                    Some(Err(LinesCodecError::Io(e))) => {
                        break Some(failed(format!("reading stdout: {e}")));
                    }
                },
                status = child.wait(), if exited.is_none() => {
                    // Whatever the program left behind in its group must not hold stdout open
                    // (or run on) after it; the lines already written are still read.
                    stop(child, group, stop_line, settings.grace_ms).await;
                    exited = Some(status);
                }
                Some(answer) = answers.recv() => {
                    let mut line = json!({"type": "approval_answer"});
                    if let (Some(line), Some(answer)) = (line.as_object_mut(), answer.as_object()) {
                        line.extend(answer.clone());
                    }
                    let mut text = line.to_string();
                    text.push('\n');
                    // A program that exited or closed stdin will be judged by its exit.
                    let _ = stdin.write_all(text.as_bytes()).await;
                }
                action = cancelled(&mut cancel) => {
                    stop(child, group, stop_line, settings.grace_ms).await;
                    return AgentEnd::Interrupted { action };
                }
            }
        };
        if let Some(end) = verdict {
            // The run is decided; the program must not outlive it.
            stop(child, group, stop_line, settings.grace_ms).await;
            return end;
        }
        let status = match exited {
            Some(status) => status,
            None => {
                let status = child.wait().await;
                stop(child, group, stop_line, settings.grace_ms).await;
                status
            }
        };
        if let Some((message, failure)) = state.error {
            return AgentEnd::Failed { message, failure };
        }
        let tail = stderr_tail.await.unwrap_or_default();
        match status {
            Ok(status) if status.success() => AgentEnd::Completed {
                output: state.output.unwrap_or(Value::Null),
                total_tokens: state.tokens,
                message_count: state.messages,
            },
            Ok(status) => AgentEnd::Failed {
                message: format!("the program exited with {status}: {tail}"),
                failure: exit_failure(status),
            },
            Err(e) => failed(format!("waiting for the program: {e}")),
        }
    }
}

/// What a running program is given besides its request: how it is stopped, where its approval
/// requests go and their answers come from, and where its protocol lines count as progress.
struct Talk<'a> {
    cancel: watch::Receiver<Option<CancelAction>>,
    pauses: mpsc::UnboundedSender<Value>,
    answers: &'a mut mpsc::UnboundedReceiver<Value>,
    progress: Progress,
}

/// What the program said so far.
#[derive(Default)]
struct Said {
    lines: usize,
    bytes: usize,
    output: Option<Value>,
    tokens: i64,
    messages: i64,
    /// The last `error` line: the run's message and what it says of a retry.
    error: Option<(String, RunFailure)>,
}

impl Said {
    /// Reads one stdout line; `Some` is an approval request to record.
    fn read(&mut self, text: &str) -> Result<Option<Value>, String> {
        self.lines += 1;
        runtime::check_text_depth(text.as_bytes(), &format!("stdout line {}", self.lines))?;
        let line: Line = serde_json::from_str(text).map_err(|e| {
            format!(
                "stdout line {} is not a protocol line ({e}): {:?}",
                self.lines,
                text.chars().take(120).collect::<String>()
            )
        })?;
        match line {
            Line::Output { output } => self.output = Some(output),
            Line::Progress { .. } => self.messages += 1,
            Line::Usage { total_tokens } => {
                self.tokens = i64::try_from(total_tokens).unwrap_or(i64::MAX);
            }
            Line::ApprovalRequest {
                request_id,
                actions,
            } => {
                return Ok(Some(json!({
                    "kind": "hitl_approval",
                    "request_id": request_id,
                    "actions": actions,
                    "attached": true,
                })));
            }
            Line::Error {
                message,
                retryable,
                retry_after_ms,
                code,
            } => {
                let line = self.lines;
                if let Some(ms) = retry_after_ms
                    && ms > RETRY_AFTER_MS_MAX
                {
                    return Err(format!(
                        "stdout line {line}: retry_after_ms is {ms}: it must be at most \
                         {RETRY_AFTER_MS_MAX} (a day)"
                    ));
                }
                if let Some(code) = &code
                    && !is_code(code)
                {
                    return Err(format!(
                        "stdout line {line}: code {:?} ({} bytes) is not a code: {CODE_GRAMMAR}",
                        code.chars().take(80).collect::<String>(),
                        code.len()
                    ));
                }
                let failure = RunFailure {
                    class: FailureClass::Error,
                    code,
                    retryable,
                    retry_after_ms,
                };
                self.error = Some((untrusted_text(&message), failure));
            }
        }
        Ok(None)
    }
}

fn failed(message: String) -> AgentEnd {
    AgentEnd::failed(message)
}

/// A run ended for breaking the protocol: the same program given the same task would break it
/// again, so it is not worth a retry.
fn protocol_violation(message: String) -> AgentEnd {
    AgentEnd::Failed {
        message,
        failure: RunFailure {
            class: FailureClass::Error,
            code: Some("protocol".into()),
            retryable: Some(false),
            retry_after_ms: None,
        },
    }
}

/// What a program's failing exit says of a retry: its code (`exit_N`, or `signal_N`), and
/// nothing more (the policy decides) but for [`EXIT_TEMPFAIL`], which asks for one.
fn exit_failure(status: ExitStatus) -> RunFailure {
    let (code, retryable) = match (status.code(), status.signal()) {
        (Some(EXIT_TEMPFAIL), _) => (format!("exit_{EXIT_TEMPFAIL}"), Some(true)),
        (Some(code), _) => (format!("exit_{code}"), None),
        (None, Some(signal)) => (format!("signal_{signal}"), None),
        (None, None) => ("exit_unknown".to_owned(), None),
    };
    RunFailure {
        class: FailureClass::Error,
        code: Some(code),
        retryable,
        retry_after_ms: None,
    }
}

/// Sends `signal` to the agent's process group, which may already be gone.
fn kill_group(group: Option<i32>, signal: i32) {
    if let Some(group) = group {
        // SAFETY: kill(2) on the process group this agent created; no memory is involved.
        unsafe { libc::kill(-group, signal) };
    }
}

/// Whether any process of the group is left.
fn group_alive(group: Option<i32>) -> bool {
    // SAFETY: kill(2) with signal 0 only checks for existence; no memory is involved.
    group.is_some_and(|group| unsafe { libc::kill(-group, 0) } == 0)
}

/// SIGTERM to the whole process group, and the stop line pulled: the guard gives what is left
/// of the run `grace_ms`, then SIGKILLs it all, and ends. SIGKILL to the group (the guard
/// included) only if the guard has not ended by `grace_ms` + [`GUARD_STOP_MARGIN`].
async fn stop(child: &mut Child, group: Option<i32>, stop_line: &mut StopLine, grace_ms: u64) {
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(grace_ms) + GUARD_STOP_MARGIN;
    kill_group(group, libc::SIGTERM);
    stop_line.pull();
    // Reaping the leader first keeps it from counting as alive while a zombie.
    let _ = tokio::time::timeout_at(deadline, child.wait()).await;
    while group_alive(group) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(GROUP_POLL).await;
    }
    kill_group(group, libc::SIGKILL);
    let _ = child.kill().await;
}

/// Makes the run's workspace (kept across runs) and its temporary folder (new for each run),
/// both mode 0700.
async fn fresh_folders(workspace: &Path, tmp: &Path) -> std::io::Result<()> {
    let mut builder = tokio::fs::DirBuilder::new();
    builder.recursive(true).mode(0o700);
    builder.create(workspace).await?;
    if let Err(e) = tokio::fs::remove_dir_all(tmp).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        return Err(e);
    }
    builder.create(tmp).await
}

/// Keeps the last `limit` bytes of a stream, as untrusted text (see [`untrusted_text`]).
async fn read_tail(mut stream: impl tokio::io::AsyncRead + Unpin, limit: usize) -> String {
    let mut tail = VecDeque::with_capacity(limit);
    let mut buffer = [0u8; 4096];
    while let Ok(read) = stream.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        for &byte in &buffer[..read] {
            if tail.len() == limit {
                tail.pop_front();
            }
            tail.push_back(byte);
        }
    }
    untrusted_text(&String::from_utf8_lossy(
        &tail.into_iter().collect::<Vec<_>>(),
    ))
}

/// A program's text made safe to carry as one value: trimmed, and every control character
/// (newlines, carriage returns, terminal escapes) escaped, so that it cannot start a line of its
/// own or pose as another field in a log.
fn untrusted_text(text: &str) -> String {
    let mut safe = String::with_capacity(text.len());
    for c in text.trim().chars() {
        if c.is_control() {
            safe.extend(c.escape_default());
        } else {
            safe.push(c);
        }
    }
    safe
}

#[cfg(test)]
mod tests {
    use super::*;
    use runtime::policy::CODE_BYTES_MAX;

    /// Issue 29, items 3 and 12: a line nested deeper than the bound, and a negative token
    /// count, are protocol errors that name the line; nothing of them is kept.
    #[test]
    fn a_deep_line_or_a_negative_token_count_is_a_protocol_error() {
        let mut progress = Said::default();
        let deep = format!(
            r#"{{"type": "output", "output": {}{}}}"#,
            "[".repeat(64),
            "]".repeat(64)
        );
        let error = progress.read(&deep).expect_err("too deep");
        assert!(error.contains("stdout line 1 nests 65 levels"), "{error}");
        assert!(progress.output.is_none());
        let error = progress
            .read(r#"{"type": "usage", "total_tokens": -5}"#)
            .expect_err("negative");
        assert!(error.contains("stdout line 2"), "{error}");
        assert_eq!(progress.tokens, 0);
        progress
            .read(r#"{"type": "usage", "total_tokens": 7}"#)
            .expect("a count");
        assert_eq!(progress.tokens, 7);
    }

    /// Issue 31: an `error` line says what the failure means for a retry, each field at its
    /// bound; past a bound it is a protocol error that names the field, and nothing of it is
    /// kept.
    #[test]
    fn an_error_line_carries_its_retry_fields_within_their_bounds() {
        let mut said = Said::default();
        said.read(r#"{"type": "error", "message": "quota\nspent"}"#)
            .expect("a bare error line");
        assert_eq!(
            said.error,
            Some(("quota\\nspent".to_owned(), RunFailure::default()))
        );
        let longest_code = "c".repeat(CODE_BYTES_MAX);
        said.read(&format!(
            r#"{{"type": "error", "message": "busy", "retryable": true,
                 "retry_after_ms": {RETRY_AFTER_MS_MAX}, "code": "{longest_code}"}}"#
        ))
        .expect("every field at its bound");
        assert_eq!(
            said.error,
            Some((
                "busy".to_owned(),
                RunFailure {
                    class: FailureClass::Error,
                    code: Some(longest_code.clone()),
                    retryable: Some(true),
                    retry_after_ms: Some(RETRY_AFTER_MS_MAX),
                }
            ))
        );
        for (line, named) in [
            (
                format!(
                    r#"{{"type": "error", "message": "m", "retry_after_ms": {}}}"#,
                    RETRY_AFTER_MS_MAX + 1
                ),
                "stdout line 3: retry_after_ms is 86400001: it must be at most 86400000 (a day)",
            ),
            (
                r#"{"type": "error", "message": "m", "retry_after_ms": -1}"#.to_owned(),
                "stdout line 4 is not a protocol line",
            ),
            (
                r#"{"type": "error", "message": "m", "code": ""}"#.to_owned(),
                "stdout line 5: code \"\" (0 bytes) is not a code: 1 to 64 of A-Z",
            ),
            (
                format!(r#"{{"type": "error", "message": "m", "code": "{longest_code}c"}}"#),
                "(65 bytes) is not a code: 1 to 64 of A-Z",
            ),
            (
                r#"{"type": "error", "message": "m", "retryable": "yes"}"#.to_owned(),
                "stdout line 7 is not a protocol line",
            ),
            // Issue 39, item 8: a code is shown, logged and named in `nonRetryable` as it is.
            (
                r#"{"type": "error", "message": "m", "code": "busy\u0000\nnow"}"#.to_owned(),
                "stdout line 8: code \"busy\\0\\nnow\" (9 bytes) is not a code",
            ),
            (
                r#"{"type": "error", "message": "m", "code": "rate limited"}"#.to_owned(),
                "stdout line 9: code \"rate limited\" (12 bytes) is not a code",
            ),
        ] {
            let error = said.read(&line).expect_err("out of bounds");
            assert!(error.contains(named), "{error}");
            assert_eq!(said.error.as_ref().map(|(m, _)| m.as_str()), Some("busy"));
        }
    }

    #[test]
    fn a_failing_exit_is_classified_by_its_status() {
        let exited = |code: i32| exit_failure(ExitStatus::from_raw(code << 8));
        assert_eq!(
            exited(3),
            RunFailure {
                class: FailureClass::Error,
                code: Some("exit_3".into()),
                retryable: None,
                retry_after_ms: None,
            }
        );
        let tempfail = exited(75);
        assert_eq!(
            (tempfail.code.as_deref(), tempfail.retryable),
            (Some("exit_75"), Some(true))
        );
        let killed = exit_failure(ExitStatus::from_raw(libc::SIGKILL));
        assert_eq!(
            (killed.code.as_deref(), killed.retryable),
            (Some("signal_9"), None)
        );
        let AgentEnd::Failed { failure, .. } = protocol_violation("garbage".into()) else {
            panic!("a protocol violation is a failure");
        };
        assert_eq!(
            (failure.code.as_deref(), failure.retryable),
            (Some("protocol"), Some(false))
        );
    }

    #[test]
    fn untrusted_text_cannot_start_a_line_or_a_terminal_escape() {
        assert_eq!(
            untrusted_text("  oops\nlevel=INFO run_id=forged\r\u{1b}[2J\t done \n"),
            "oops\\nlevel=INFO run_id=forged\\r\\u{1b}[2J\\t done"
        );
    }
}
