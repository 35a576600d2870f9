//! The real binary on the embedded default with its data folder on a small tmpfs that fills up:
//! writes answer 503 `disk_full` and say so, readiness turns 503 while they fail and 200 once one
//! succeeds again, a running workflow waits for the space instead of failing its step, and the
//! database holds nothing half-written.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::agent_processes::write_config;
use crate::harness::{ReinsProcess, free_port, http_get, reins_command};
use crate::http_api::{ADMIN, PASSWORD};
use crate::http_client::Api;

/// A tmpfs of `size` mounted at a folder; unmounted when dropped, also when the test panics.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        // SAFETY: geteuid(2) has no preconditions and touches no memory.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(
            uid, 0,
            "this test mounts a small tmpfs to fill a disk for real, which needs root (or \
             CAP_SYS_ADMIN); it runs as uid {uid}: run the suite as root (as CI does)"
        );
        std::fs::create_dir_all(path).expect("mount point");
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(path)
            .output()
            .expect("run mount");
        assert!(
            mounted.status.success(),
            "mounting a tmpfs at {} failed although the test runs as root (no CAP_SYS_ADMIN in \
             this container?): {}",
            path.display(),
            String::from_utf8_lossy(&mounted.stderr)
        );
        Tmpfs {
            path: path.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(&self.path).status();
        if !matches!(unmounted, Ok(status) if status.success()) {
            // Still busy (a process holding files in it): detach it so it goes once they close.
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
    }
}

/// Writes `path` until the file system has no byte left.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("filler");
    for chunk in [64 * 1024, 4096, 1] {
        let bytes = vec![0u8; chunk];
        loop {
            match file.write(&bytes) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
}

async fn launch(api: &mut Api, script: &str) -> crate::http_client::Answer {
    api.call("POST", "/api/v1/workflows", Some(json!({"script": script})))
        .await
}

const PAUSE: &str = r#"return await pause({stepId: "p"});"#;

async fn status(api: &mut Api, run: &str) -> String {
    let answer = api
        .call("GET", &format!("/api/v1/workflows/{run}"), None)
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.json()["status"].as_str().expect("status").to_owned()
}

/// Waits until `path` exists (the bound only detects a path that never appears).
async fn appears(path: &Path) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `/health/ready` until it answers `status` (at most 60 s); returns its body.
async fn ready_becomes(addr: SocketAddr, status: u16) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (now, body) = http_get(addr, "/health/ready").expect("ready");
        if now == status {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness stayed {now} ({body}), never {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn count(db: &rusqlite::Connection, table: &str) -> i64 {
    db.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
        row.get(0)
    })
    .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_503_disk_full_and_readiness_follows_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("reins-data");
    let tmpfs = Tmpfs::mount(&data, "4M");
    let files = tempfile::tempdir().expect("temp dir");
    // The agent is confined to its workspace: the folder of its signals is granted to it.
    let signals = files.path().join("signals");
    std::fs::create_dir(&signals).expect("signals folder");
    let (started, gate) = (signals.join("started"), signals.join("gate"));
    // An agent that ends only once the test opens its gate, which it does with the disk full.
    let config = write_config(
        files.path(),
        &[(
            "waiter",
            &format!(
                "read task\ntouch {}\nwhile [ ! -e {} ]; do sleep 0.05; done\n\
                 echo '{{\"type\": \"output\", \"output\": \"done\"}}'",
                started.display(),
                gate.display()
            ),
            &format!("write_paths = [{:?}]", signals.display().to_string()),
        )],
    );
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut command = reins_command(
        dir.path(),
        &[("REINS_LISTEN", addr.to_string()), ("REINS_CONFIG", config)],
    );
    command.env_remove("REINS_SECRET");
    let mut process = ReinsProcess::serve_command(command, addr);
    process.wait_ready(Duration::from_secs(30));

    let mut api = Api::new(addr);
    let answer = api
        .call(
            "POST",
            "/api/v1/auth/initialize",
            Some(json!({"email": ADMIN, "password": PASSWORD})),
        )
        .await;
    assert_eq!(answer.status, 201, "{answer:?}");
    let before = launch(
        &mut api,
        r#"const a = await agent({stepId: "a", agentRef: "waiter", task: "x"});
           return a;"#,
    )
    .await;
    assert_eq!(before.status, 201, "{before:?}");
    let running = before.json()["run_id"].as_str().expect("run_id").to_owned();
    appears(&started).await;

    let filler = data.join("filler");
    fill(&filler);
    let full = launch(&mut api, PAUSE).await;
    assert_eq!(full.status, 503, "{full:?}");
    let body = full.json();
    assert_eq!(body["error"]["code"], "disk_full", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("the database's disk is full: nothing was written"),
        "{message}"
    );
    let not_ready = ready_becomes(addr, 503).await;
    assert!(not_ready.contains("disk_full"), "{not_ready}");
    assert_eq!(http_get(addr, "/health").expect("health").0, 200);
    // It stays unready while the disk is full: its probe write keeps failing.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (still, body) = http_get(addr, "/health/ready").expect("ready");
    assert_eq!(still, 503, "{body}");
    // The agent ends while nothing can be written: its workflow waits for the space.
    std::fs::write(&gate, "").expect("open the gate");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(status(&mut api, &running).await, "running");

    std::fs::remove_file(&filler).expect("free the space");
    ready_becomes(addr, 200).await;
    let after = launch(&mut api, PAUSE).await;
    assert_eq!(after.status, 201, "{after:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let now = status(&mut api, &running).await;
        if now == "completed" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the workflow that waited for space is {now}: {}",
            process.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    process.signal(libc::SIGTERM);
    let stopped = process.wait_exit(Duration::from_secs(60));
    assert!(
        matches!(stopped, Some(status) if status.success()),
        "{stopped:?}: {}",
        process.stderr()
    );
    let db = rusqlite::Connection::open(data.join("reins.db")).expect("open");
    let integrity: String = db
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .expect("integrity check");
    assert_eq!(integrity, "ok");
    // The two launches that answered 201 and nothing of the one refused.
    assert_eq!(count(&db, "workflows"), 2);
    drop(db);
    drop(process);
    drop(tmpfs);
}
