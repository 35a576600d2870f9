//! The files of the real binary on disk: on the embedded default, the data folder and everything
//! in it (database, secret, admin socket, workspaces and what agents write there) belong to the
//! node's user alone; a capture reads regular files only (a FIFO fails the step, and the node
//! still cancels and stops); deleting a workflow removes its workspaces, and nothing outside.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::agent_processes::write_config;
use crate::harness::{ReinsProcess, free_port, reins_command};
use crate::http_api::{Db, Node, initialize, launch, wait_for};

/// Every path under `root` (itself included) with its permission bits.
fn modes(root: &Path) -> Vec<(String, bool, u32)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path).expect("metadata");
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path).expect("read dir") {
                pending.push(entry.expect("entry").path());
            }
        }
        let name = path
            .strip_prefix(root)
            .expect("under root")
            .display()
            .to_string();
        found.push((
            name,
            metadata.is_dir(),
            metadata.permissions().mode() & 0o777,
        ));
    }
    found
}

/// A node on the embedded default in `dir` (no database, data folder or secret configured:
/// everything in `dir/reins-data`), with the configuration file `config` and `extra`
/// environment overrides.
pub fn embedded(dir: tempfile::TempDir, config: String, extra: &[(&str, String)]) -> Node {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut env = vec![("REINS_LISTEN", addr.to_string()), ("REINS_CONFIG", config)];
    env.extend(extra.iter().cloned());
    let mut command = reins_command(dir.path(), &env);
    command.env_remove("REINS_SECRET");
    let mut process = ReinsProcess::serve_command(command, addr);
    process.wait_ready(Duration::from_secs(30));
    Node { process, addr, dir }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_folder_and_every_file_in_it_are_the_nodes_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        files.path(),
        &[(
            "writer",
            "read task\nmkdir -p outputs\necho 'hello' > outputs/report.txt\n\
             echo '{\"type\": \"output\", \"output\": \"written\"}'",
            "",
        )],
    );
    let node = embedded(dir, config, &[]);
    let mut api = initialize(&node).await;
    let run = launch(
        &mut api,
        r#"await agent({stepId: "w", agentRef: "writer", task: "x"});
           const c = await captureArtifact({stepId: "c", sourceStepId: "w",
                                            path: "/mnt/user-data/outputs/report.txt"});
           return c.artifactVersion;"#,
    )
    .await;
    wait_for(&mut api, &run, "completed").await;

    let found = modes(&node.dir.path().join("reins-data"));
    for expected in [
        "reins.db",
        "reins.db-wal",
        "secret",
        "admin.sock",
        "report.txt",
    ] {
        assert!(
            found.iter().any(|(name, _, _)| name.ends_with(expected)),
            "{expected} is not in the data folder: {found:?}"
        );
    }
    let open: Vec<_> = found
        .iter()
        .filter(|(_, is_dir, mode)| *mode != if *is_dir { 0o700 } else { 0o600 })
        .map(|(name, _, mode)| format!("{name} {mode:o}"))
        .collect();
    assert!(open.is_empty(), "readable by other users: {open:?}");
}

/// A data folder from before (or made by hand) open to other users: the node's own files in it
/// are made private, and the folder, which may hold more than the node's files, is warned about.
#[test]
fn an_existing_data_folders_files_are_made_private_and_its_mode_is_warned_about() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("reins-data");
    std::fs::create_dir(&data).expect("mkdir");
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    rusqlite::Connection::open(data.join("reins.db")).expect("an empty database");
    std::fs::write(data.join("secret"), "s".repeat(40)).expect("secret");
    for file in ["reins.db", "secret"] {
        std::fs::set_permissions(data.join(file), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
    }
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut command = reins_command(dir.path(), &[("REINS_LISTEN", addr.to_string())]);
    command.env_remove("REINS_SECRET");
    let mut process = ReinsProcess::serve_command(command, addr);
    process.wait_ready(Duration::from_secs(30));
    for file in ["reins.db", "secret"] {
        let mode = std::fs::metadata(data.join(file))
            .expect("metadata")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }
    let warning = "other local users may read the node's files";
    let log = process.stderr_with(&[warning], Duration::from_secs(60));
    assert!(log.contains(warning), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capturing_a_fifo_fails_the_step_at_once_and_cancel_and_sigterm_still_work() {
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        files.path(),
        &[(
            "fifo",
            "read task\nmkfifo pipe\necho '{\"type\": \"output\", \"output\": \"made\"}'",
            "",
        )],
    );
    let mut node = Node::start(&db, &[("REINS_CONFIG", config)]);
    let mut api = initialize(&node).await;
    let run = launch(
        &mut api,
        r#"await agent({stepId: "f", agentRef: "fifo", task: "x"});
           try {
               await captureArtifact({stepId: "c", sourceStepId: "f", path: "/mnt/user-data/pipe"});
           } catch (e) {
               console.log("capture refused: " + e.message);
           }
           return await pause({stepId: "p"});"#,
    )
    .await;
    wait_for(&mut api, &run, "paused").await;
    let said = ["capture refused", "a FIFO, not a regular file"];
    let log = node.process.stderr_with(&said, Duration::from_secs(60));
    assert!(said.iter().all(|line| log.contains(line)), "{log}");

    // A capture stuck on the FIFO would hold the cancel (and the stop below) forever: the
    // waits' bounds detect that, however long a busy machine takes to cancel.
    let answer = api
        .call("POST", &format!("/api/v1/workflows/{run}/cancel"), None)
        .await;
    assert!(answer.status < 300, "{answer:?}");
    wait_for(&mut api, &run, "cancelled").await;

    node.signal(libc::SIGTERM);
    let status = node
        .process
        .wait_exit(Duration::from_secs(60))
        .expect("the node exits after SIGTERM");
    assert!(status.success(), "{status}");
}

/// The folders under `workspaces` whose name starts with `prefix`.
fn threads_of(workspaces: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(workspaces)
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.path())
                .filter(|path| {
                    path.file_name()
                        .is_some_and(|name| name.to_string_lossy().starts_with(prefix))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_workflow_removes_its_workspaces_and_nothing_outside_them() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let workspaces = node.dir.path().join("data/workspaces");
    let mut api = initialize(&node).await;
    let script = r#"
        for (const stepId of ["a", "b"]) {
            await agent({stepId, agentRef: "scripted", task: {
                write: [{path: "/mnt/user-data/outputs/report.txt", content: stepId}],
                output: stepId}});
        }
        return "done";"#;
    let deleted = launch(&mut api, script).await;
    let kept = launch(&mut api, script).await;
    for run in [&deleted, &kept] {
        wait_for(&mut api, run, "completed").await;
        assert_eq!(threads_of(&workspaces, run).len(), 2, "{run}");
    }
    // An agent may leave a symlink to anywhere in its workspace: deleting follows none.
    let outside = tempfile::tempdir().expect("temp dir");
    std::fs::write(outside.path().join("precious.txt"), b"keep me").expect("write");
    let thread = threads_of(&workspaces, &deleted).remove(0);
    std::os::unix::fs::symlink(outside.path(), thread.join("user-data/outputs/escape"))
        .expect("symlink");

    let answer = api
        .call("DELETE", &format!("/api/v1/workflows/{deleted}"), None)
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(threads_of(&workspaces, &deleted), Vec::<PathBuf>::new());
    assert_eq!(threads_of(&workspaces, &kept).len(), 2);
    assert!(outside.path().join("precious.txt").exists());
}

/// The POSIX locks process `pid` holds on the file at `path`, as `/proc/locks` lists them.
fn posix_locks(pid: u32, path: &Path) -> usize {
    use std::os::unix::fs::MetadataExt;
    let inode = format!(":{}", std::fs::metadata(path).expect("metadata").ino());
    let pid = pid.to_string();
    std::fs::read_to_string("/proc/locks")
        .expect("/proc/locks")
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.get(1) == Some(&"POSIX") && fields.get(4) == Some(&pid.as_str()))
        .filter(|fields| fields.get(5).is_some_and(|file| file.ends_with(&inode)))
        .count()
}

/// Issue 29, item 1: an agent hard-links the node's database into its workspace and the script
/// captures the link. Opening that inode a second time and closing it would drop SQLite's POSIX
/// locks, after which an outside `sqlite3 .backup` deletes the live write-ahead log. The capture
/// is refused without opening the file, the locks stay, the secret's link is refused too, and
/// `reins admin backup` copies the live database through the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_hard_link_to_the_database_is_refused_and_the_locks_stay() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        files.path(),
        &[(
            "linker",
            "read task\nln ../../../reins.db db\nln ../../../secret s\n\
             echo '{\"type\": \"output\", \"output\": \"linked\"}'",
            "",
        )],
    );
    // Unconfined, as on a kernel without Landlock whose operator chose `agent_confinement =
    // "none"`: the capture's own defence must hold without the agent's confinement, which
    // would refuse these links (see `agent_confinement.rs`).
    let node = embedded(dir, config, &[("REINS_AGENT_CONFINEMENT", "none".into())]);
    let data = node.dir.path().join("reins-data");
    let database = data.join("reins.db");
    let mut api = initialize(&node).await;
    let before = posix_locks(node.process.pid(), &database);
    assert!(
        before >= 1,
        "SQLite holds no POSIX lock on {}",
        database.display()
    );

    let run = launch(
        &mut api,
        r#"await agent({stepId: "l", agentRef: "linker", task: "x"});
           const refused = [];
           for (const path of ["db", "s"]) {
               try {
                   await captureArtifact({stepId: "c-" + path, sourceStepId: "l", path});
                   refused.push("captured " + path);
               } catch (e) {
                   refused.push(e.message);
               }
           }
           return refused;"#,
    )
    .await;
    let record = wait_for(&mut api, &run, "completed").await;
    let refused = record["result"].as_array().expect("two answers").clone();
    assert_eq!(refused.len(), 2, "{record}");
    for answer in &refused {
        assert!(
            answer.as_str().is_some_and(|a| a.contains("2 hard links")),
            "{answer}"
        );
    }
    assert_eq!(
        posix_locks(node.process.pid(), &database),
        before,
        "the capture dropped the node's locks on its database"
    );

    let backup = files.path().join("backup.db");
    let made = crate::operators::admin_json(
        &node.dir.path().join("reins-data/admin.sock"),
        &["backup", backup.to_str().expect("utf-8")],
    );
    assert_eq!(made["path"], backup.display().to_string(), "{made}");
    let copy = rusqlite::Connection::open(&backup).expect("open the backup");
    let copied: String = copy
        .query_row(
            "SELECT status FROM workflows WHERE id = ?1",
            [&run],
            |row| row.get(0),
        )
        .expect("the workflow is in the backup");
    assert_eq!(copied, "completed");
    let mode: String = copy
        .query_row("PRAGMA journal_mode", [], |row| row.get(0))
        .expect("journal mode");
    assert_eq!(mode, "delete", "the backup is one self-contained file");
    let again = crate::operators::admin(
        &node.dir.path().join("reins-data/admin.sock"),
        &["backup", backup.to_str().expect("utf-8")],
    );
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && said.contains("exists already"),
        "{said}"
    );
    assert_eq!(posix_locks(node.process.pid(), &database), before);
}
