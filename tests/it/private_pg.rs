//! A PostgreSQL server of one test's own, for tests that stop and restart the database under
//! running nodes (the shared cluster of `tests/run-all.sh` must never go away under the other
//! tests). It runs Debian's server binaries from `/usr/lib/postgresql/<newest>/bin` on a free
//! loopback port, in a temporary folder, with fsync off, and is stopped when dropped. As root, the
//! server runs as the `postgres` user, as PostgreSQL requires.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::free_port;

pub struct PrivatePg {
    bin: PathBuf,
    data: PathBuf,
    _dir: tempfile::TempDir,
    pub port: u16,
    /// The addresses the server listens on (`listen_addresses`).
    listen: String,
}

fn as_server_user(program: &Path) -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn run(mut command: Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

impl PrivatePg {
    /// A new, running server with an empty cluster, on loopback.
    pub fn start() -> PrivatePg {
        PrivatePg::start_on(&[], &[])
    }

    /// A new, running server listening on loopback and on `addresses` too (each must exist on
    /// this machine), trusting clients from `clients` (CIDR ranges) besides loopback.
    pub fn start_on(addresses: &[&str], clients: &[&str]) -> PrivatePg {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's server binaries (tests/run-all.sh installs them)")
            .flatten()
            .map(|entry| entry.path().join("bin"))
            .filter(|bin| bin.join("initdb").exists())
            .max_by_key(|bin| {
                bin.parent()
                    .and_then(|v| v.file_name())
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            })
            .expect("a PostgreSQL version under /usr/lib/postgresql");
        let dir = tempfile::tempdir().expect("temp dir");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            run(
                {
                    let mut c = Command::new("chown");
                    c.arg("postgres:").arg(dir.path());
                    c
                },
                "chown the private cluster's folder",
            );
        }
        let data = dir.path().join("data");
        let mut initdb = as_server_user(&bin.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8"]);
        run(initdb, "initdb");
        if !clients.is_empty() {
            let rules: String = clients
                .iter()
                .map(|cidr| format!("host all all {cidr} trust\n"))
                .collect();
            let hba = data.join("pg_hba.conf");
            let mut text = std::fs::read_to_string(&hba).expect("pg_hba.conf");
            text.push_str(&rules);
            std::fs::write(&hba, text).expect("pg_hba.conf");
        }
        let listen = std::iter::once("127.0.0.1")
            .chain(addresses.iter().copied())
            .collect::<Vec<_>>()
            .join(",");
        let pg = PrivatePg {
            bin,
            data,
            port: free_port(),
            _dir: dir,
            listen,
        };
        pg.ctl(&["start"]);
        pg
    }

    fn ctl(&self, action: &[&str]) {
        let options = format!(
            "-c listen_addresses={} -c port={} -c unix_socket_directories={} \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200",
            self.listen,
            self.port,
            self.data.display()
        );
        let mut command = as_server_user(&self.bin.join("pg_ctl"));
        command
            .arg("-D")
            .arg(&self.data)
            .arg("-l")
            .arg(self.data.join("server.log"))
            .args(["-w", "-m", "fast", "-o", &options])
            .args(action);
        run(command, &format!("pg_ctl {action:?}"));
    }

    /// The admin URL of the server (database `postgres`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server (fast mode: sessions are ended, nothing committed is lost).
    pub fn stop(&self) {
        self.ctl(&["stop"]);
    }

    /// Starts the stopped server again on the same port.
    pub fn start_again(&self) {
        self.ctl(&["start"]);
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        let mut command = as_server_user(&self.bin.join("pg_ctl"));
        command
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"]);
        let _ = command.output();
    }
}
