//! The built-in `scripted` agent: deterministic, for demos and tests. A plain-text task (a JSON
//! string, or anything that is not an object) is echoed as `{"echo": task}`. An object is a list of
//! directives, carried out in this order:
//!
//! | directive | effect |
//! | --- | --- |
//! | `"write": [{"path", "content"}]` | writes files into the thread's workspace (`/mnt/user-data/...`) |
//! | `"sleep_ms": N` | waits N ms (at most 600000), stopping early on cancel |
//! | `"silent_ms": N` | waits N ms more (at most 600000), stopping early on cancel |
//! | `"hold_while": "NAME"` | waits while the file NAME exists in `REINS_FAULT_DIR` |
//! | `"ask_approval": {"request_id", "actions"}` | pauses the run in `waiting_for_input` |
//! | `"fail": "message"` | ends the run as `error` with that message |
//! | `"fail_attempts": N` | `fail` only on the step's attempts 1 to N; later ones go on as without it |
//! | `"retryable": bool`, `"retry_after_ms": N`, `"code": "..."` | what the failure says of a retry |
//! | `"output": any` | the run's output (default `{"echo": task}`) |
//! | `"tokens": N` | the token count recorded for the run |
//!
//! The agent sends no progress signal, ever: with `timeout.idle_ms` its waits (`sleep_ms`,
//! `silent_ms`, `hold_while`) are silences. Any other key is refused with an error naming it, as
//! is a retry key without `fail` or out of its bounds, before anything is done.

use std::path::PathBuf;
use std::time::Duration;

use runtime::policy::{CODE_GRAMMAR, is_code};
use serde::Deserialize;
use serde_json::{Value, json};
use store::{CancelAction, FailureClass, RunFailure};
use tokio::sync::watch;

use super::{AgentEnd, AgentRequest, cancelled};
use crate::workspace;

/// The longest `sleep_ms` (and `silent_ms`) a task may ask for.
const SLEEP_MS_MAX: u64 = 600_000;
/// The longest `retry_after_ms` a task may give its failure: a day.
const RETRY_AFTER_MS_MAX: u64 = 86_400_000;
/// How often `hold_while` looks for its file.
const HOLD_POLL: Duration = Duration::from_millis(20);

#[derive(Debug)]
pub struct ScriptedAgent;

#[derive(Debug, Default)]
struct Directives {
    write: Vec<WriteFile>,
    sleep_ms: Option<u64>,
    silent_ms: Option<u64>,
    hold_while: Option<String>,
    ask_approval: Option<Approval>,
    fail: Option<String>,
    /// `fail` holds for the step's attempts 1 to this one only (all of them without it).
    fail_attempts: Option<i32>,
    /// What the failure says of a retry.
    failure: RunFailure,
    output: Option<Value>,
    /// A token count is never negative.
    tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteFile {
    path: String,
    content: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Approval {
    request_id: String,
    #[serde(default)]
    actions: Vec<Value>,
}

impl Directives {
    const KNOWN: &[&str] = &[
        "write",
        "sleep_ms",
        "silent_ms",
        "hold_while",
        "ask_approval",
        "fail",
        "fail_attempts",
        "retryable",
        "retry_after_ms",
        "code",
        "output",
        "tokens",
    ];
    /// The keys that only say something of a `fail`.
    const OF_FAIL: &[&str] = &["fail_attempts", "retryable", "retry_after_ms", "code"];

    /// Reads the directives, naming the key of anything unknown or of the wrong type.
    fn parse(map: &serde_json::Map<String, Value>) -> Result<Self, String> {
        if let Some(unknown) = map.keys().find(|key| !Self::KNOWN.contains(&key.as_str())) {
            return Err(format!(
                "unknown directive `{unknown}`; known: {}",
                Self::KNOWN.join(", ")
            ));
        }
        fn field<T: serde::de::DeserializeOwned>(
            map: &serde_json::Map<String, Value>,
            key: &str,
        ) -> Result<Option<T>, String> {
            map.get(key)
                .map(|value| T::deserialize(value).map_err(|e| format!("`{key}`: {e}")))
                .transpose()
        }
        if !map.contains_key("fail")
            && let Some(key) = Self::OF_FAIL.iter().find(|key| map.contains_key(**key))
        {
            return Err(format!(
                "`{key}` says something of a failure: it needs `fail`"
            ));
        }
        let directives = Directives {
            write: field(map, "write")?.unwrap_or_default(),
            sleep_ms: field(map, "sleep_ms")?,
            silent_ms: field(map, "silent_ms")?,
            hold_while: field(map, "hold_while")?,
            ask_approval: field(map, "ask_approval")?,
            fail: field(map, "fail")?,
            fail_attempts: field(map, "fail_attempts")?,
            failure: RunFailure {
                class: FailureClass::Error,
                code: field(map, "code")?,
                retryable: field(map, "retryable")?,
                retry_after_ms: field(map, "retry_after_ms")?,
            },
            output: map.get("output").cloned(),
            tokens: field(map, "tokens")?,
        };
        directives.check()?;
        Ok(directives)
    }

    /// Checks the numbers and codes against their bounds.
    fn check(&self) -> Result<(), String> {
        for (key, value) in [("sleep_ms", self.sleep_ms), ("silent_ms", self.silent_ms)] {
            if let Some(ms) = value
                && ms > SLEEP_MS_MAX
            {
                return Err(format!("`{key}` {ms} is over the limit of {SLEEP_MS_MAX}"));
            }
        }
        if let Some(ms) = self.failure.retry_after_ms
            && ms > RETRY_AFTER_MS_MAX
        {
            return Err(format!(
                "`retry_after_ms` {ms} is over the limit of {RETRY_AFTER_MS_MAX} (a day)"
            ));
        }
        if let Some(code) = &self.failure.code
            && !is_code(code)
        {
            return Err(format!("`code` {code:?} must be {CODE_GRAMMAR}"));
        }
        if let Some(attempts) = self.fail_attempts
            && attempts < 0
        {
            return Err(format!("`fail_attempts` {attempts} must be 0 or more"));
        }
        Ok(())
    }
}

impl ScriptedAgent {
    pub async fn run(
        &self,
        request: AgentRequest,
        mut cancel: watch::Receiver<Option<CancelAction>>,
    ) -> AgentEnd {
        let directives = match &request.task {
            Value::Object(map) => match Directives::parse(map) {
                Ok(directives) => directives,
                Err(message) => {
                    return AgentEnd::failed(format!("scripted task is malformed: {message}"));
                }
            },
            _ => Directives::default(),
        };
        for file in &directives.write {
            if let Err(message) = write_file(&request, file).await {
                return AgentEnd::failed(message);
            }
        }
        for wait_ms in [directives.sleep_ms, directives.silent_ms]
            .into_iter()
            .flatten()
        {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(wait_ms)) => {}
                action = cancelled(&mut cancel) => return AgentEnd::Interrupted { action },
            }
        }
        if let Some(name) = &directives.hold_while {
            let Some(path) = hold_file(&request, name) else {
                return AgentEnd::failed(format!(
                    "hold_while {name:?} needs REINS_FAULT_DIR and a plain file name"
                ));
            };
            while tokio::fs::try_exists(&path).await.unwrap_or(false) {
                tokio::select! {
                    () = tokio::time::sleep(HOLD_POLL) => {}
                    action = cancelled(&mut cancel) => return AgentEnd::Interrupted { action },
                }
            }
        }
        if let Some(action) = *cancel.borrow() {
            return AgentEnd::Interrupted { action };
        }
        if let Some(approval) = directives.ask_approval {
            return AgentEnd::WaitingForInput {
                approval: json!({
                    "kind": "hitl_approval",
                    "request_id": approval.request_id,
                    "actions": approval.actions,
                }),
            };
        }
        let failing = directives
            .fail_attempts
            .is_none_or(|attempts| request.attempt <= attempts);
        if let Some(message) = directives.fail.filter(|_| failing) {
            return AgentEnd::Failed {
                message,
                failure: directives.failure,
            };
        }
        AgentEnd::Completed {
            output: directives
                .output
                .unwrap_or_else(|| json!({ "echo": request.task })),
            total_tokens: directives
                .tokens
                .map_or(0, |tokens| i64::try_from(tokens).unwrap_or(i64::MAX)),
            message_count: 1,
        }
    }
}

fn hold_file(request: &AgentRequest, name: &str) -> Option<PathBuf> {
    let plain = !name.is_empty() && !name.contains('/') && name != "." && name != "..";
    plain.then(|| request.fault_dir.as_ref().map(|dir| dir.join(name)))?
}

/// Writes `file` into the workspace as a new inode: the content goes to a fresh file made with
/// `O_CREAT | O_EXCL` beside the target, which is then renamed over it. An existing file at the
/// path is never opened, so a hard link an agent planted there (to the node's database, say) is
/// replaced, not written through.
async fn write_file(request: &AgentRequest, file: &WriteFile) -> Result<(), String> {
    let path = workspace::resolve(&request.workspace, &file.path).map_err(|e| e.to_string())?;
    let cannot = |e: std::io::Error| format!("cannot write {}: {e}", file.path);
    let parent = path
        .parent()
        .ok_or_else(|| format!("cannot write {}: it names no file", file.path))?;
    tokio::fs::create_dir_all(parent)
        .await
        .map_err(|e| format!("cannot create {}: {e}", file.path))?;
    let fresh = parent.join(format!(".reins-write-{}", uuid::Uuid::new_v4().simple()));
    let written = async {
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create_new(true);
        let mut out = options.open(&fresh).await?;
        tokio::io::AsyncWriteExt::write_all(&mut out, file.content.as_bytes()).await?;
        // tokio's file hands writes to a blocking thread: only a flush says they reached the
        // file, so the rename below never publishes a file still being written.
        tokio::io::AsyncWriteExt::flush(&mut out).await?;
        tokio::fs::rename(&fresh, &path).await
    }
    .await;
    if written.is_err() {
        let _ = tokio::fs::remove_file(&fresh).await;
    }
    written.map_err(cannot)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(task: Value, workspace: PathBuf, fault_dir: Option<PathBuf>) -> AgentRequest {
        AgentRequest {
            run_id: "run".into(),
            thread_id: "thread".into(),
            task,
            workspace,
            fault_dir,
            process_records: None,
            confinement: crate::agents::ConfinementMode::Landlock,
            attempt: 1,
        }
    }

    async fn run(task: Value) -> AgentEnd {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_cancel, watch) = watch::channel(None);
        ScriptedAgent
            .run(request(task, dir.path().join("ws"), None), watch)
            .await
    }

    #[tokio::test]
    async fn plain_text_is_echoed() {
        assert_eq!(
            run(json!("hello")).await,
            AgentEnd::Completed {
                output: json!({"echo": "hello"}),
                total_tokens: 0,
                message_count: 1
            }
        );
    }

    #[tokio::test]
    async fn directives_write_fail_and_ask() {
        let dir = tempfile::tempdir().expect("temp dir");
        let workspace = dir.path().join("ws");
        let (_cancel, watch) = watch::channel(None);
        let task = json!({
            "write": [{"path": "/mnt/user-data/outputs/e.txt", "content": "evidence"}],
            "output": {"ok": true},
            "tokens": 12
        });
        let end = ScriptedAgent
            .run(request(task, workspace.clone(), None), watch.clone())
            .await;
        assert_eq!(
            end,
            AgentEnd::Completed {
                output: json!({"ok": true}),
                total_tokens: 12,
                message_count: 1
            }
        );
        assert_eq!(
            std::fs::read_to_string(workspace.join("outputs/e.txt")).expect("written"),
            "evidence"
        );
        assert_eq!(run(json!({"fail": "boom"})).await, AgentEnd::failed("boom"));
        assert!(matches!(
            run(json!({"ask_approval": {"request_id": "r1", "actions": ["deploy"]}})).await,
            AgentEnd::WaitingForInput { approval } if approval["request_id"] == "r1"
        ));
    }

    #[tokio::test]
    async fn a_write_replaces_a_planted_hard_link_and_never_writes_through_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let workspace = dir.path().join("t/user-data");
        std::fs::create_dir_all(workspace.join("outputs")).expect("mkdir");
        let node_file = dir.path().join("reins.db");
        std::fs::write(&node_file, b"the node's database").expect("write");
        std::fs::hard_link(&node_file, workspace.join("outputs/e.txt")).expect("ln");
        let task = json!({"write": [{"path": "outputs/e.txt", "content": "evidence"}]});
        let (_cancel, watch) = watch::channel(None);
        let end = ScriptedAgent
            .run(request(task, workspace.clone(), None), watch)
            .await;
        assert!(matches!(end, AgentEnd::Completed { .. }), "{end:?}");
        assert_eq!(
            std::fs::read(&node_file).expect("read"),
            b"the node's database"
        );
        assert_eq!(
            std::fs::read(workspace.join("outputs/e.txt")).expect("read"),
            b"evidence"
        );
    }

    #[tokio::test]
    async fn bad_directives_are_named_and_nothing_is_done() {
        let dir = tempfile::tempdir().expect("temp dir");
        let workspace = dir.path().join("ws");
        let (_cancel, watch) = watch::channel(None);
        let task = json!({"write": [{"path": "a.txt", "content": "x"}], "explode": true});
        let end = ScriptedAgent
            .run(request(task, workspace.clone(), None), watch)
            .await;
        assert!(
            matches!(&end, AgentEnd::Failed { message, .. } if message.contains("explode")),
            "{end:?}"
        );
        assert!(!workspace.join("a.txt").exists());
        assert!(matches!(
            run(json!({"write": [{"path": "../escape", "content": "x"}]})).await,
            AgentEnd::Failed { message, .. } if message.contains("outside")
        ));
    }

    async fn run_attempt(task: Value, attempt: i32) -> AgentEnd {
        let dir = tempfile::tempdir().expect("temp dir");
        let (_cancel, watch) = watch::channel(None);
        let request = AgentRequest {
            attempt,
            ..request(task, dir.path().join("ws"), None)
        };
        ScriptedAgent.run(request, watch).await
    }

    /// Issue 31: a flaky agent for the retry tests, failing its first attempts with what the
    /// failure says of a retry.
    #[tokio::test]
    async fn a_failure_may_hold_for_the_first_attempts_and_say_what_a_retry_could_do() {
        let task = json!({"fail": "flaky", "fail_attempts": 2, "retryable": true,
                          "retry_after_ms": 1_500, "code": "flaky_upstream", "output": "done"});
        let expected = AgentEnd::Failed {
            message: "flaky".into(),
            failure: RunFailure {
                class: FailureClass::Error,
                code: Some("flaky_upstream".into()),
                retryable: Some(true),
                retry_after_ms: Some(1_500),
            },
        };
        assert_eq!(run_attempt(task.clone(), 1).await, expected);
        assert_eq!(run_attempt(task.clone(), 2).await, expected);
        assert_eq!(
            run_attempt(task, 3).await,
            AgentEnd::Completed {
                output: json!("done"),
                total_tokens: 0,
                message_count: 1
            }
        );
        // Without fail_attempts, every attempt fails.
        assert_eq!(
            run_attempt(json!({"fail": "always", "retryable": false}), 7).await,
            AgentEnd::Failed {
                message: "always".into(),
                failure: RunFailure {
                    retryable: Some(false),
                    ..RunFailure::default()
                },
            }
        );
    }

    #[tokio::test]
    async fn retry_keys_need_a_fail_and_stay_within_their_bounds() {
        for (task, named) in [
            (
                json!({"retryable": true}),
                "`retryable` says something of a failure: it needs `fail`",
            ),
            (
                json!({"fail_attempts": 1, "output": 1}),
                "`fail_attempts` says something",
            ),
            (
                json!({"fail": "x", "retry_after_ms": 86_400_001}),
                "`retry_after_ms` 86400001 is over the limit of 86400000 (a day)",
            ),
            (
                json!({"fail": "x", "code": ""}),
                "`code` \"\" must be 1 to 64 of A-Z, a-z, 0-9, '-', '_', '.'",
            ),
            (
                json!({"fail": "x", "code": "c".repeat(65)}),
                "must be 1 to 64 of A-Z",
            ),
            (
                json!({"fail": "x", "code": "busy\nnow"}),
                "`code` \"busy\\nnow\" must be 1 to 64 of A-Z",
            ),
            (
                json!({"fail": "x", "fail_attempts": -1}),
                "`fail_attempts` -1 must be 0 or more",
            ),
            (json!({"fail": "x", "retryable": "yes"}), "`retryable`"),
            (
                json!({"silent_ms": 600_001}),
                "`silent_ms` 600001 is over the limit of 600000",
            ),
            (
                json!({"sleep_ms": 600_001}),
                "`sleep_ms` 600001 is over the limit of 600000",
            ),
        ] {
            let end = run(task.clone()).await;
            assert!(
                matches!(&end, AgentEnd::Failed { message, .. } if message.contains(named)),
                "{task}: {end:?}"
            );
        }
        let edge = json!({"fail": "x", "retry_after_ms": 86_400_000, "code": "c".repeat(64),
                          "silent_ms": 1, "sleep_ms": 1});
        assert!(matches!(
            run(edge).await,
            AgentEnd::Failed {
                failure: RunFailure {
                    retry_after_ms: Some(86_400_000),
                    ..
                },
                ..
            }
        ));
    }

    #[tokio::test]
    async fn sleep_and_hold_stop_on_cancel() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("hold_model"), b"").expect("hold file");
        let (cancel, watch) = watch::channel(None);
        let task = json!({"hold_while": "hold_model"});
        let held = tokio::spawn(async move {
            ScriptedAgent
                .run(
                    request(task, dir.path().join("ws"), Some(dir.path().to_path_buf())),
                    watch,
                )
                .await
        });
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!held.is_finished(), "the hold ended while its file exists");
        cancel.send_replace(Some(CancelAction::Rollback));
        assert_eq!(
            held.await.expect("join"),
            AgentEnd::Interrupted {
                action: CancelAction::Rollback
            }
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let (cancel, watch) = watch::channel(None);
        let silent = tokio::spawn(async move {
            ScriptedAgent
                .run(
                    request(json!({"silent_ms": 600_000}), dir.path().join("ws"), None),
                    watch,
                )
                .await
        });
        cancel.send_replace(Some(CancelAction::Interrupt));
        assert_eq!(
            silent.await.expect("join"),
            AgentEnd::Interrupted {
                action: CancelAction::Interrupt
            }
        );
    }
}
