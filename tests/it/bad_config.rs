//! Bad configuration stops start-up with one line naming the key or the cause, and leaves nothing
//! on disk.

use std::net::TcpListener;
use std::path::Path;

use crate::harness::{free_port, reins_command};

/// Runs `reins serve` in a fresh folder holding only `files`; returns its stderr after checking
/// that it failed with one line and created nothing.
fn refused(files: &[(&str, &str)], args: &[&str], env: &[(&str, String)]) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write file");
    }
    let before = listing(dir.path());
    let output = reins_command(dir.path(), env)
        .arg("serve")
        .args(args)
        .output()
        .expect("run reins");
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_owned();
    assert!(!output.status.success(), "accepted; stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr}");
    assert_eq!(listing(dir.path()), before, "a refused start created files");
    stderr
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn an_unknown_key_in_the_file_is_named_with_its_line() {
    let stderr = refused(
        &[("reins.toml", "lease_seconds = 5\nleese_seconds = 5\n")],
        &["--config", "reins.toml"],
        &[],
    );
    assert!(
        stderr.contains("leese_seconds") && stderr.contains("line 2"),
        "{stderr}"
    );
}

#[test]
fn an_unknown_environment_variable_is_a_warning_naming_it_not_a_refusal() {
    // A wrapper script's own REINS_* variable must not stop the node; a typo is named with the
    // key it was probably meant to be (an unknown key in the file stays fatal, above).
    let dir = tempfile::tempdir().expect("temp dir");
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut node = crate::harness::ReinsProcess::serve(
        dir.path(),
        addr,
        &[
            ("REINS_LISTEN", addr.to_string()),
            (
                "REINS_DATA_DIR",
                dir.path().join("data").display().to_string(),
            ),
            ("REINS_LEASE_SECS", "5".into()),
            ("REINS_BIN", "/usr/local/bin/reins".into()),
        ],
    );
    node.wait_ready(std::time::Duration::from_secs(30));
    node.signal(libc::SIGTERM);
    node.wait_exit(std::time::Duration::from_secs(30));
    let stderr = node.stderr();
    assert!(
        stderr.contains("REINS_LEASE_SECS")
            && stderr.contains("did you mean `REINS_LEASE_SECONDS`"),
        "{stderr}"
    );
    assert!(stderr.contains("REINS_BIN"), "{stderr}");
}

#[test]
fn a_malformed_database_url_is_named() {
    for url in [
        "postgres://host:notaport/db",
        "mysql://localhost/reins",
        "sqlite:",
    ] {
        let stderr = refused(&[], &[], &[("REINS_DATABASE", url.into())]);
        assert!(stderr.contains("`database`"), "{url}: {stderr}");
    }
}

#[test]
fn a_port_in_use_is_named() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let stderr = refused(&[], &[], &[("REINS_LISTEN", addr.clone())]);
    assert!(
        stderr.contains(&addr) && stderr.contains("in use"),
        "{stderr}"
    );
}

#[test]
fn an_unreachable_database_is_named() {
    let port = free_port();
    let stderr = refused(
        &[],
        &[],
        &[(
            "REINS_DATABASE",
            format!("postgres://reins@127.0.0.1:{port}/reins"),
        )],
    );
    assert!(
        stderr.contains("database") && stderr.contains("refused"),
        "{stderr}"
    );
}

#[test]
fn a_missing_config_file_is_named() {
    let stderr = refused(&[], &["--config", "absent.toml"], &[]);
    assert!(stderr.contains("absent.toml"), "{stderr}");
}

#[test]
fn a_command_agents_malformed_environment_is_named() {
    let stderr = refused(
        &[(
            "reins.toml",
            "[[agents]]\nname = \"coder\"\nkind = \"command\"\nprogram = \"/bin/true\"\n\
             env = { \"A=B\" = \"x\" }\n",
        )],
        &["--config", "reins.toml"],
        &[],
    );
    assert!(
        stderr.contains("`agents`") && stderr.contains("\"coder\"") && stderr.contains("A=B"),
        "{stderr}"
    );
}

#[test]
fn a_webhook_that_is_not_http_or_https_is_refused_naming_the_field() {
    for url in [
        "ftp://hooks.example/x",
        "file:///etc/passwd",
        "hooks.example/x",
    ] {
        let stderr = refused(
            &[(
                "reins.toml",
                &format!("[[notify]]\nurl = \"{url}\"\nsecret = \"s3cret\"\n"),
            )],
            &["--config", "reins.toml"],
            &[],
        );
        assert!(
            stderr.contains("notify.url") && stderr.contains(url),
            "{stderr}"
        );
    }
}
