//! The HTTP API against its own OpenAPI description (`GET /api/v1/openapi.json`), with the
//! Python tools of `tests/python-tools` (a venv that `tests/python-tools/install.sh` makes and
//! `tests/run-all.sh` runs): Schemathesis fuzzes every operation with every check, stateful
//! sequences included, as an admin and as a plain user; and a Python client generated from the
//! description by openapi-python-client takes a workflow through a human checkpoint.
//!
//! The venv is `REINS_PYTHON_TOOLS`, by default `target/python-tools`; without it, or made from
//! another requirements file, the tests fail and say which script to run.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::http_api::{Db, Node, PASSWORD, initialize};
use crate::users::{create, signed_in};

const USER: &str = "plain.user@example.com";

/// Schemathesis's seed unless `REINS_FUZZ_SEED` names another.
const FUZZ_SEED: &str = "20261208";

/// `tests/python-tools`, in the repository.
fn python_tools_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python-tools")
}

/// The `bin` folder of the tools' venv, once it is known to be made from this checkout's
/// requirements file.
fn venv_bin() -> PathBuf {
    let venv = std::env::var_os("REINS_PYTHON_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/python-tools"));
    let install = "run tests/python-tools/install.sh (tests/run-all.sh does)";
    let wanted = std::fs::read_to_string(python_tools_dir().join("requirements.txt"))
        .expect("tests/python-tools/requirements.txt");
    // install.sh copies the requirements file in once the install succeeded.
    match std::fs::read_to_string(venv.join("reins-requirements.txt")) {
        Ok(made_from) if made_from == wanted => {}
        Ok(_) => panic!(
            "the Python tools' venv at {} was made from another tests/python-tools/requirements.txt: {install}",
            venv.display()
        ),
        Err(e) => panic!(
            "the Python tools' venv at {} is missing ({e}): {install}, or set REINS_PYTHON_TOOLS to a venv it made",
            venv.display()
        ),
    }
    venv.join("bin")
}

/// What a tool run did: its exit status and everything it wrote, stdout then stderr.
struct Ran {
    success: bool,
    status: String,
    output: String,
    elapsed: Duration,
}

/// Runs `program` (from the venv's `bin`) with `args` in `dir`, with the venv's `bin` first on
/// PATH, killing it if it outlives `within` (a bound that only catches a run that hangs).
async fn run_tool(
    bin: &Path,
    program: &str,
    args: &[&str],
    dir: &Path,
    env: &[(&str, &str)],
    within: Duration,
) -> Ran {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut command = tokio::process::Command::new(bin.join(program));
    command
        .args(args)
        .current_dir(dir)
        .env("PATH", format!("{}:{path}", bin.display()))
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let started = Instant::now();
    let output = tokio::time::timeout(within, command.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} still ran after {within:?}"))
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    Ran {
        success: output.status.success(),
        status: output.status.to_string(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
        elapsed: started.elapsed(),
    }
}

/// A node on SQLite with its first admin and a plain user (role `user`), and an API token of
/// each: `(admin's, user's)`.
async fn node_with_tokens(db: &Db) -> (Node, String, String) {
    let node = Node::start(db, &[]);
    let mut admin = initialize(&node).await;
    let user = create(&mut admin, USER, Some("user")).await;
    assert_eq!(user["role"], "user", "{user}");
    let mut tokens = Vec::new();
    for mut api in [admin, signed_in(&node, USER, PASSWORD).await] {
        let created = api
            .call("POST", "/api/v1/auth/tokens", Some(json!({"name": "fuzz"})))
            .await;
        assert_eq!(created.status, 201, "{created:?}");
        tokens.push(created.json()["token"].as_str().expect("token").to_owned());
    }
    let user_token = tokens.pop().expect("user's token");
    let admin_token = tokens.pop().expect("admin's token");
    (node, admin_token, user_token)
}

/// Schemathesis finds nothing wrong, as either person: every response matches the description
/// (status, content type, headers, schema), schema-valid requests are accepted and invalid ones
/// refused, no request is answered without the token or with a wrong one, and the stateful
/// sequences (create, then read, use, delete) hold. Its size keeps both runs to well under a
/// minute on two cores.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn schemathesis_finds_nothing_as_an_admin_or_as_a_plain_user() {
    let bin = venv_bin();
    let db = Db::new(false).await;
    let (mut node, admin_token, user_token) = node_with_tokens(&db).await;
    let config = python_tools_dir().join("schemathesis.toml");
    let config = config.to_str().expect("utf-8 path");
    let description = format!("http://{}/api/v1/openapi.json", node.addr);
    // A fixed seed by default, so that CI answers the same for the same code (a change to the
    // description or the server changes what is drawn); REINS_FUZZ_SEED draws other cases.
    let seed = std::env::var("REINS_FUZZ_SEED").unwrap_or_else(|_| FUZZ_SEED.to_owned());
    let args = [
        "--config-file",
        config,
        "run",
        description.as_str(),
        "--checks",
        "all",
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        "20",
        "--workers",
        "2",
        "--request-timeout",
        "10",
        "--no-color",
        "--seed",
        seed.as_str(),
    ];
    // The plain user first: the admin's run may disable or delete them, never the other way.
    // Both run even when the first disagrees, so a failure shows everything at once.
    let mut disagreements = Vec::new();
    for (who, token) in [("a plain user", &user_token), ("the admin", &admin_token)] {
        let work = tempfile::tempdir().expect("temp dir");
        let env = [("REINS_FUZZ_TOKEN", token.as_str())];
        let mut ran = run_tool(
            &bin,
            "st",
            &args,
            work.path(),
            &env,
            Duration::from_secs(600),
        )
        .await;
        if !ran.success && only_tool_errors(&ran.output) {
            // Schemathesis failed inside itself (Hypothesis's caches are not thread-safe: a
            // worker's draw can fail as "flaky"), with no check failing: the description and
            // the node were not found to disagree. Once again on one worker; a second error
            // fails the test all the same.
            eprintln!("Schemathesis erred inside itself as {who}; once more on one worker");
            let mut again = args.to_vec();
            let workers = again
                .iter()
                .position(|a| *a == "--workers")
                .expect("--workers");
            again[workers + 1] = "1";
            ran = run_tool(
                &bin,
                "st",
                &again,
                work.path(),
                &env,
                Duration::from_secs(600),
            )
            .await;
        }
        if !ran.success {
            disagreements.push(format!(
                "=== Schemathesis disagrees with the description as {who} ({}, after {:?}):\n\
                 REINS_FUZZ_TOKEN=<{who}'s token> st {}\n\n{}",
                ran.status,
                ran.elapsed,
                args.join(" "),
                ran.output
            ));
        }
    }
    assert!(
        disagreements.is_empty(),
        "{}\n=== the node's log:\n{}",
        disagreements.join("\n"),
        node.process.stderr()
    );
}

/// Whether a failed Schemathesis run failed only inside the tool: its summary lists errors and
/// no failing check.
fn only_tool_errors(output: &str) -> bool {
    let line = |name: &str| output.lines().any(|line| line == name);
    line("Errors:") && !line("Failures:")
}

/// Through a client generated from the description only (no warning from the generator), a
/// plain user launches a workflow that waits for a person at a human checkpoint on a captured
/// artifact, approves it, and sees it complete: `tests/python-tools/client_roundtrip.py`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_generated_python_client_approves_a_checkpoint() {
    let bin = venv_bin();
    let db = Db::new(false).await;
    let (mut node, _, user_token) = node_with_tokens(&db).await;
    let work = tempfile::tempdir().expect("temp dir");
    let description = format!("http://{}/api/v1/openapi.json", node.addr);
    let generated = run_tool(
        &bin,
        "openapi-python-client",
        &[
            "generate",
            "--url",
            &description,
            "--meta",
            "none",
            "--output-path",
            "reins_client",
            "--fail-on-warning",
        ],
        work.path(),
        &[],
        Duration::from_secs(300),
    )
    .await;
    assert!(
        generated.success,
        "openapi-python-client cannot generate a client from {description} ({}):\n{}",
        generated.status, generated.output
    );
    let program = python_tools_dir().join("client_roundtrip.py");
    let url = format!("http://{}", node.addr);
    let work_path = work.path().to_str().expect("utf-8 path");
    let ran = run_tool(
        &bin,
        "python",
        &[program.to_str().expect("utf-8 path")],
        work.path(),
        &[
            ("PYTHONPATH", work_path),
            ("REINS_URL", &url),
            ("REINS_TOKEN", &user_token),
            ("REINS_EMAIL", USER),
        ],
        Duration::from_secs(300),
    )
    .await;
    assert!(
        ran.success,
        "the generated client's round trip failed ({}):\n{}\n--- the node's log ---\n{}",
        ran.status,
        ran.output,
        node.process.stderr()
    );
}

#[test]
fn a_run_that_erred_only_inside_schemathesis_is_told_from_a_disagreement() {
    let erred = "Test Phases:\n  🚫 Coverage\n\nErrors:\n  🚫 Runtime Error: 1\n\nSeed: 1\n";
    let failed = "Failures:\n  ❌ ST202 Schema-valid request rejected: 2\n\nErrors:\n  🚫 Runtime Error: 1\n";
    assert!(only_tool_errors(erred));
    assert!(!only_tool_errors(failed));
    assert!(!only_tool_errors(
        "Failures:\n  ❌ ST201 Schema-violating request accepted: 1\n"
    ));
}
