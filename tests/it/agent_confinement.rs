//! Issue 29, item 2: a `command` agent of the real binary, run as the node's user, reaches
//! nothing of the node's: not its data folder by `../..` or by absolute path, not the database or
//! the secret by hard link, not another thread's workspace, not `/proc/<node pid>/` (even where
//! the agent's configuration grants `/proc`), not the admin socket, and it cannot signal the
//! node; inside its own workspace and temporary folder it reads and writes as before.

use serde_json::Value;

use crate::agent_processes::write_config;
use crate::harness::reins_bin;
use crate::http_api::{initialize, launch, wait_for};
use crate::node_files::embedded;

/// Defines `attempt NAME COMMAND...`, which runs the command and adds `"NAME": exit status` to
/// the output the agent prints at the end (`finish`). The task is `NODE_PID OTHER_PATH`.
const PROBE_PRELUDE: &str = r#"read -r line
task=$(printf '%s\n' "$line" | sed -n 's/.*"task":"\([^"\\]*\)".*/\1/p')
node=${task%% *}
other=${task#* }
results=""
attempt() {
  name=$1; shift
  if "$@" >/dev/null 2>&1; then code=0; else code=$?; fi
  results="$results\"$name\":$code,"
}
finish() {
  echo "{\"type\":\"output\",\"output\":{${results%,}}}"
}
"#;

/// What the agent tries outside its workspace (each must fail) and inside it (each must work).
const PROBE: &str = r#"
attempt read_secret_relative cat ../../../secret
attempt list_data_relative ls ../../..
attempt list_workspaces_relative ls ../..
attempt read_database cat "$DATA/reins.db"
attempt read_secret cat "$DATA/secret"
attempt link_secret ln "$DATA/secret" linked-secret
attempt link_database_relative ln ../../../reins.db linked-db
attempt write_data_dir sh -c 'echo planted > "$DATA/planted"'
attempt append_database sh -c 'echo x >> "$DATA/reins.db"'
attempt truncate_secret truncate -s 0 "$DATA/secret"
attempt read_other_thread cat "$other"
attempt list_agent_records ls "$DATA/agents"
attempt node_environ cat "/proc/$node/environ"
attempt node_fds ls "/proc/$node/fd"
attempt signal_node kill -CONT "$node"
attempt admin_socket "$REINS" admin --socket "$DATA/admin.sock" status
attempt own_workspace sh -c 'echo mine > own.txt && test "$(cat "$PWD/own.txt")" = mine'
attempt own_tmp sh -c 'echo t > "$TMPDIR/t" && cat "$TMPDIR/t"'
attempt system_tools sh -c 'ls /usr/bin >/dev/null && date >/dev/null && echo x | sed s/x/y/'
finish
"#;

/// With `/proc` granted: still nothing of the node's process.
const PROC_PROBE: &str = r#"
attempt own_status cat /proc/self/status
attempt node_environ cat "/proc/$node/environ"
attempt node_fd_read cat "/proc/$node/fd/0"
attempt node_fd_link readlink "/proc/$node/fd/0"
attempt node_maps cat "/proc/$node/maps"
attempt node_cwd ls "/proc/$node/cwd/"
attempt node_root_secret cat "/proc/$node/root$DATA/secret"
finish
"#;

/// The probe's answers: every attempt but those in `allowed` failed, those succeeded.
fn assert_confined(answers: &Value, allowed: &[&str]) {
    let answers = answers.as_object().expect("an object of exit statuses");
    assert!(answers.len() > allowed.len(), "{answers:?}");
    assert!(
        answers.values().all(|code| code.as_i64().is_some())
            && allowed.iter().all(|name| answers.contains_key(*name)),
        "not the probe's answers: {answers:?}"
    );
    let wrong: Vec<String> = answers
        .iter()
        .filter(|(name, code)| (code.as_i64() == Some(0)) != allowed.contains(&name.as_str()))
        .map(|(name, code)| format!("{name}: exit {code}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "the agent reached what it must not, or missed its own: {wrong:?} (all: {answers:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_agent_reaches_nothing_of_the_node_but_its_own_workspace() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("reins-data");
    let env = format!(
        "env = {{ DATA = \"{}\", REINS = \"{}\" }}\nread_paths = [\"{}\"]",
        data.display(),
        reins_bin().display(),
        reins_bin().display()
    );
    let proc_env = format!(
        "env = {{ DATA = \"{}\" }}\nread_paths = [\"/proc\"]",
        data.display()
    );
    let config = write_config(
        files.path(),
        &[
            ("prober", &format!("{PROBE_PRELUDE}{PROBE}"), &env),
            (
                "proc_prober",
                &format!("{PROBE_PRELUDE}{PROC_PROBE}"),
                &proc_env,
            ),
        ],
    );
    let node = embedded(dir, config, &[]);
    let secret = std::fs::read(data.join("secret")).expect("the secret");
    let mut api = initialize(&node).await;

    // Another thread's workspace holds a file.
    let planter = launch(
        &mut api,
        r#"return await agent({stepId: "p", agentRef: "scripted", task: {
               write: [{path: "/mnt/user-data/planted.txt", content: "another thread's"}],
               output: "planted"}});"#,
    )
    .await;
    wait_for(&mut api, &planter, "completed").await;
    let other = std::fs::read_dir(data.join("workspaces"))
        .expect("workspaces")
        .flatten()
        .map(|entry| entry.path().join("user-data/planted.txt"))
        .find(|path| path.exists())
        .expect("the planted file");

    let task = format!("{} {}", node.process.pid(), other.display());
    let run = launch(
        &mut api,
        &format!(
            r#"const task = {task:?};
               return {{
                   probe: await agent({{stepId: "probe", agentRef: "prober", task}}),
                   proc: await agent({{stepId: "proc", agentRef: "proc_prober", task}}),
               }};"#
        ),
    )
    .await;
    let record = wait_for(&mut api, &run, "completed").await;
    assert_confined(
        &record["result"]["probe"]["output"],
        &["own_workspace", "own_tmp", "system_tools"],
    );
    assert_confined(&record["result"]["proc"]["output"], &["own_status"]);

    // Nothing of the node's changed, and nothing of it was linked in.
    assert_eq!(std::fs::read(data.join("secret")).expect("secret"), secret);
    assert!(!data.join("planted").exists());
    let workspaces: Vec<_> = std::fs::read_dir(data.join("workspaces"))
        .expect("workspaces")
        .flatten()
        .map(|entry| entry.path().join("user-data"))
        .collect();
    for workspace in &workspaces {
        for linked in ["linked-secret", "linked-db"] {
            assert!(!workspace.join(linked).exists(), "{}", workspace.display());
        }
    }
    assert!(
        workspaces.iter().any(|w| w.join("own.txt").exists()),
        "the agent's own file is not in its workspace: {workspaces:?}"
    );
}
