//! The built-in `scripted` agent: deterministic, for demos and tests. A plain-text task (a JSON
//! string, or anything that is not an object) is echoed as `{"echo": task}`. An object is a list of
//! directives, carried out in this order:
//!
//! | directive | effect |
//! | --- | --- |
//! | `"write": [{"path", "content"}]` | writes files into the thread's workspace (`/mnt/user-data/...`) |
//! | `"sleep_ms": N` | waits N ms (at most 600000), stopping early on cancel |
//! | `"hold_while": "NAME"` | waits while the file NAME exists in `REINS_FAULT_DIR` |
//! | `"ask_approval": {"request_id", "actions"}` | pauses the run in `waiting_for_input` |
//! | `"fail": "message"` | ends the run as `error` with that message |
//! | `"output": any` | the run's output (default `{"echo": task}`) |
//! | `"tokens": N` | the token count recorded for the run |
//!
//! Any other key is refused with an error naming it, before anything is done.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};
use store::CancelAction;
use tokio::sync::watch;

use super::{AgentEnd, AgentRequest, cancelled};
use crate::workspace;

/// The longest `sleep_ms` a task may ask for.
const SLEEP_MS_MAX: u64 = 600_000;
/// How often `hold_while` looks for its file.
const HOLD_POLL: Duration = Duration::from_millis(20);

#[derive(Debug)]
pub struct ScriptedAgent;

#[derive(Debug, Default)]
struct Directives {
    write: Vec<WriteFile>,
    sleep_ms: Option<u64>,
    hold_while: Option<String>,
    ask_approval: Option<Approval>,
    fail: Option<String>,
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
        "hold_while",
        "ask_approval",
        "fail",
        "output",
        "tokens",
    ];

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
        Ok(Directives {
            write: field(map, "write")?.unwrap_or_default(),
            sleep_ms: field(map, "sleep_ms")?,
            hold_while: field(map, "hold_while")?,
            ask_approval: field(map, "ask_approval")?,
            fail: field(map, "fail")?,
            output: map.get("output").cloned(),
            tokens: field(map, "tokens")?,
        })
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
        if let Some(sleep_ms) = directives.sleep_ms {
            if sleep_ms > SLEEP_MS_MAX {
                return AgentEnd::failed(format!(
                    "sleep_ms {sleep_ms} is over the limit of {SLEEP_MS_MAX}"
                ));
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(sleep_ms)) => {}
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
        if let Some(message) = directives.fail {
            return AgentEnd::failed(message);
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
    }
}
