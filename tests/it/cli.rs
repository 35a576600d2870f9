//! The `reins` command line against a real node, the way a person uses it (the README's example):
//! create the admin, run a script that waits for approval, approve it, download the captured
//! artifact and check its bytes; exit codes and `--json` output checked.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use serde_json::Value;

use crate::harness::reins_command;
use crate::http_api::{ADMIN, Db, Node, PASSWORD};

/// The example the README runs.
fn example() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/review.js")
}

pub fn cli(dir: &Path, node: &Node, args: &[&str]) -> Output {
    let credentials = dir.join("credentials.json").display().to_string();
    reins_command(
        dir,
        &[
            ("REINS_CLI_CREDENTIALS", credentials),
            ("REINS_CLI_PASSWORD", PASSWORD.to_owned()),
            ("REINS_CLI_URL", format!("http://{}", node.addr)),
        ],
    )
    .args(args)
    .output()
    .expect("run reins")
}

pub fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

pub fn code(output: &Output) -> i32 {
    output.status.code().expect("exit code")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_person_runs_approves_and_downloads_through_the_cli() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    std::fs::copy(example(), home.join("review.js")).expect("the README's example");

    let init = cli(home, &node, &["init", "--email", ADMIN]);
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));
    let mode = std::fs::metadata(home.join("credentials.json"))
        .expect("saved")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is the user's alone");
    let again = cli(home, &node, &["init", "--email", ADMIN]);
    assert_eq!(code(&again), 1);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already initialized"));

    let run = cli(
        home,
        &node,
        &[
            "run",
            "review.js",
            "--args",
            r#"{"topic": "cli"}"#,
            "--wait",
            "--json",
        ],
    );
    assert_eq!(
        code(&run),
        3,
        "waits for a person: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let record = json_of(&run);
    assert_eq!(record["status"], "waiting_approval");
    let id = record["run_id"].as_str().expect("run_id").to_owned();
    let version = record["checkpoints"][0]["artifact_version"]
        .as_i64()
        .expect("version");

    let table = cli(home, &node, &["list"]);
    assert_eq!(code(&table), 0);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.starts_with("RUN ID") && table.contains(&id) && table.contains("waiting_approval"),
        "{table}"
    );

    // Issue 32: a command for another kind of wait says what the workflow waits for and
    // which command answers it.
    let resume = cli(home, &node, &["resume", &id]);
    assert_eq!(code(&resume), 1);
    let said = String::from_utf8_lossy(&resume.stderr);
    assert!(
        said.contains("waits at no pause")
            && said.contains(&format!("answer it with `reins approve {id} --step review")),
        "{said}"
    );

    let approve = cli(home, &node, &["approve", &id]);
    assert_eq!(
        code(&approve),
        0,
        "{}",
        String::from_utf8_lossy(&approve.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&approve.stdout).trim(),
        format!("{id}: approved")
    );

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let done = loop {
        let get = cli(home, &node, &["get", &id, "--json"]);
        assert_eq!(code(&get), 0);
        let record = json_of(&get);
        if record["status"] == "completed" {
            break record;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never completed: {record}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(done["result"]["decision"], "approve");
    // A rejection after the approval says who decided the checkpoint already, and when.
    let reject = cli(home, &node, &["reject", &id]);
    assert_eq!(code(&reject), 1);
    let said = String::from_utf8_lossy(&reject.stderr);
    let decided_at = done["checkpoints"][0]["decided_at"]
        .as_f64()
        .expect("decided_at");
    assert!(
        said.contains(&format!(
            "humanCheckpoint \"review\" was already approved by {ADMIN} at {}",
            store::rfc3339_utc(decided_at)
        )),
        "{said}"
    );
    assert_eq!(
        done["result"]["summary"],
        serde_json::json!({"echo": "the evidence\n"})
    );
    assert_eq!(done["checkpoints"][0]["status"], "approved");

    let saved = home.join("evidence.txt");
    let download = cli(
        home,
        &node,
        &[
            "artifact",
            &id,
            &version.to_string(),
            "-o",
            saved.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(
        code(&download),
        0,
        "{}",
        String::from_utf8_lossy(&download.stderr)
    );
    assert_eq!(
        std::fs::read(&saved).expect("downloaded"),
        b"the evidence\n"
    );

    // Piped into a reader that is gone (as `reins list | head` leaves it): a quiet end by SIGPIPE,
    // never a panic.
    let credentials = home.join("credentials.json").display().to_string();
    let mut piped = reins_command(
        home,
        &[
            ("REINS_CLI_CREDENTIALS", credentials),
            ("REINS_CLI_URL", format!("http://{}", node.addr)),
        ],
    )
    .args(["get", &id])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("run reins");
    drop(piped.stdout.take());
    let ended = piped.wait_with_output().expect("wait");
    let said = String::from_utf8_lossy(&ended.stderr);
    assert!(!said.contains("panicked"), "{said}");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&ended.status),
        Some(libc::SIGPIPE)
    );

    let missing = cli(home, &node, &["get", "no-such-run"]);
    assert_eq!(code(&missing), 1);
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no workflow"),
        "{missing:?}"
    );
    let key = cli(home, &node, &["keygen"]);
    assert_eq!(code(&key), 0);
    assert!(String::from_utf8_lossy(&key.stdout).trim().len() >= 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_lists_and_reconciles_every_uncertain_workflow_with_one_command() {
    let db = Db::new(false).await;
    let faults = tempfile::tempdir().expect("fault dir");
    std::fs::write(faults.path().join("hold_model"), b"").expect("hold");
    let node = Node::start(
        &db,
        &[("REINS_FAULT_DIR", faults.path().display().to_string())],
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    assert_eq!(code(&cli(home, &node, &["init", "--email", ADMIN])), 0);
    let script = home.join("held.js");
    std::fs::write(
        &script,
        "return (await agent({stepId: 'held', agentRef: 'scripted', \
         task: {hold_while: 'hold_model', output: 'real'}})).output;",
    )
    .expect("script");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let run = cli(home, &node, &["run", "held.js", "--json"]);
        assert_eq!(code(&run), 0, "{}", String::from_utf8_lossy(&run.stderr));
        ids.push(json_of(&run)["run_id"].as_str().expect("id").to_owned());
    }
    // Each is moved away from its owner while its child runs, then recovered: its child's
    // outcome is unknown, so it waits for an operator.
    for id in &ids {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let get = json_of(&cli(home, &node, &["get", id, "--json"]));
            if get["steps"][0]["status"] == "running" {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the child never ran: {get}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        crate::operators::admin_json(&node.admin_socket(), &["fence", id]);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let recovered = cli(home, &node, &["recover", id]);
            let get = json_of(&cli(home, &node, &["get", id, "--json"]));
            if get["status"] == "needs_reconciliation" {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never needed reconciliation: {get} {}",
                String::from_utf8_lossy(&recovered.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    let dry = cli(
        home,
        &node,
        &[
            "reconcile",
            "--all",
            "--retry",
            "--reason",
            "checked",
            "--dry-run",
            "--json",
        ],
    );
    assert_eq!(code(&dry), 0, "{}", String::from_utf8_lossy(&dry.stderr));
    let listed = json_of(&dry);
    assert_eq!(listed.as_array().map(Vec::len), Some(2), "{listed}");
    assert_eq!(listed[0]["step_id"], "held");
    assert_eq!(listed[0]["reason"], "child_outcome_unknown");
    for id in &ids {
        let get = json_of(&cli(home, &node, &["get", id, "--json"]));
        assert_eq!(
            get["status"], "needs_reconciliation",
            "a dry run changed {id}"
        );
    }
    let bad = cli(home, &node, &["reconcile", &ids[0], "--reason", "checked"]);
    assert_ne!(code(&bad), 0, "no resolution given");
    // Issue 40: `get` says why it waits, the command that settles it, and the uncertain step's
    // status as the record gives it (its row still says `running`).
    let get = cli(home, &node, &["get", &ids[0]]);
    let shown = String::from_utf8_lossy(&get.stdout);
    assert!(
        shown.contains("why            child_outcome_unknown: "),
        "{shown}"
    );
    assert!(
        shown.contains(&format!(
            "settle with    reins reconcile {} --step held --retry|--fail|--complete JSON",
            ids[0]
        )),
        "{shown}"
    );
    let held = shown
        .lines()
        .find(|line| line.starts_with("held "))
        .unwrap_or_else(|| panic!("no step line: {shown}"));
    assert!(held.contains(" needs_reconciliation "), "{held}");
    assert!(!held.contains(" running "), "{held}");
    // So does every further page of steps, not only the record's first.
    let mut api = node.api();
    assert_eq!(api.login(ADMIN, PASSWORD).await.status, 200);
    let page = api
        .call("GET", &format!("/api/v1/workflows/{}/steps", ids[0]), None)
        .await
        .json();
    let paged = page["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|step| step["step_id"] == "held")
        .unwrap_or_else(|| panic!("no held step: {page}"));
    assert_eq!(paged["status"], "needs_reconciliation", "{page}");

    std::fs::remove_file(faults.path().join("hold_model")).expect("release the model");
    let settled = cli(
        home,
        &node,
        &[
            "reconcile",
            "--all",
            "--retry",
            "--reason",
            "checked the model's log",
            "--json",
        ],
    );
    assert_eq!(
        code(&settled),
        0,
        "{}",
        String::from_utf8_lossy(&settled.stderr)
    );
    for id in &ids {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let get = json_of(&cli(home, &node, &["get", id, "--json"]));
            if get["status"] == "completed" {
                assert_eq!(get["result"], "real");
                // The reconcile's reason stays with the attempt it settled.
                assert_eq!(
                    get["steps"][0]["reconciled"],
                    serde_json::json!({"by": ADMIN, "reason": "checked the model's log",
                                       "resolution": "retry"}),
                    "{get}"
                );
                let shown = cli(home, &node, &["get", id]);
                let shown = String::from_utf8_lossy(&shown.stdout);
                assert!(
                    shown.contains(&format!(
                        "held attempt 1: reconciled by {ADMIN} (retry): checked the model's log"
                    )),
                    "{shown}"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never completed: {get}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// Issue 40, item 4: `reins login` through one node of a cluster left every other node of it
/// "not signed in". A node says which cluster it belongs to (`GET /health`'s `cluster`, the same
/// on every node that shares the secret); the CLI signed in through one node uses its token with
/// any node of the same cluster, and still refuses a node of another cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_sign_in_serves_every_node_of_the_cluster() {
    let db = Db::new(true).await;
    let first = Node::start(&db, &[]);
    let second = Node::start(&db, &[]);
    let other_db = Db::new(false).await;
    let other = Node::start(
        &other_db,
        &[(
            "REINS_SECRET",
            "another-cluster-secret-0123456789abcdef".into(),
        )],
    );
    let cluster = |node: &Node| {
        let (status, body) = crate::harness::http_get(node.addr, "/health").expect("health");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).expect("JSON")["cluster"]
            .as_str()
            .expect("a cluster")
            .to_owned()
    };
    assert_eq!(cluster(&first), cluster(&second));
    assert_ne!(cluster(&first), cluster(&other));
    let home = tempfile::tempdir().expect("home");
    let init = cli(home.path(), &first, &["init", "--email", ADMIN]);
    assert_eq!(code(&init), 0, "{}", String::from_utf8_lossy(&init.stderr));
    let url = |node: &Node| format!("http://{}", node.addr);
    let listed = cli(home.path(), &first, &["list", "--url", &url(&second)]);
    assert_eq!(
        code(&listed),
        0,
        "another node of the cluster: {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let refused = cli(home.path(), &first, &["list", "--url", &url(&other)]);
    assert_eq!(code(&refused), 1);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("not signed in to") && said.contains("not of the cluster"),
        "{said}"
    );
}

/// Issue 40: `list` and `get` name the owner (the person) apart from the node, and `reins inbox`
/// tells what the console tells: an item past its reminder is overdue
/// (with when), one with a `timeoutMs` names its deadline, and one whose workflow no node runs
/// (recoverable) warns that an answer is only recorded until a node takes the workflow over;
/// which is what happens: the answer given then is the one the workflow resumes with once it is
/// recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_cli_names_owner_and_node_and_its_inbox_says_overdue_deadline_and_recoverable() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    assert_eq!(code(&cli(home, &node, &["init", "--email", ADMIN])), 0);
    std::fs::write(
        home.join("late.js"),
        "return await pause({stepId: 'p', timeoutMs: 86400000, remindAfterMs: 1});",
    )
    .expect("script");
    let run = cli(home, &node, &["run", "late.js", "--wait", "--json"]);
    assert_eq!(code(&run), 3, "{}", String::from_utf8_lossy(&run.stderr));
    let id = json_of(&run)["run_id"].as_str().expect("id").to_owned();

    // OWNER is the person (as the console names them), NODE the node that runs it.
    let list = String::from_utf8_lossy(&cli(home, &node, &["list"]).stdout).into_owned();
    let header: Vec<&str> = list
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "RUN", "ID", "STATUS", "WAITING", "FOR", "OWNER", "NODE", "CREATED", "TITLE"
        ],
        "{list}"
    );
    let line = list
        .lines()
        .find(|line| line.starts_with(&id))
        .unwrap_or_else(|| panic!("not listed: {list}"));
    assert!(line.contains(ADMIN), "{line}");
    let get = String::from_utf8_lossy(&cli(home, &node, &["get", &id]).stdout).into_owned();
    assert!(get.contains(&format!("owner          {ADMIN}\n")), "{get}");
    assert!(get.contains("node           "), "{get}");

    let inbox = cli(home, &node, &["inbox"]);
    let shown = String::from_utf8_lossy(&inbox.stdout).into_owned();
    assert!(shown.contains(&format!("{id} [overdue]")), "{shown}");
    assert!(shown.contains("  overdue since "), "{shown}");
    assert!(
        shown.contains("  deadline ") && shown.contains("its timeout decides it"),
        "{shown}"
    );
    assert!(!shown.contains("no node runs"), "{shown}");

    crate::operators::admin_json(&node.admin_socket(), &["fence", &id]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let shown = loop {
        let shown = String::from_utf8_lossy(&cli(home, &node, &["inbox"]).stdout).into_owned();
        if shown.contains("no node runs") {
            break shown;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never warned: {shown}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(
        shown.contains(&format!(
            "warning: no node runs this workflow (recoverable): an answer is recorded now and \
             applied when a node takes it over (reins recover {id})"
        )),
        "{shown}"
    );
    let items = json_of(&cli(home, &node, &["inbox", "--json"]));
    assert_eq!(items["items"][0]["recoverable"], true, "{items}");
    assert!(items["items"][0]["deadline_at"].is_f64(), "{items}");

    let resume = cli(
        home,
        &node,
        &["resume", &id, "--input", "\"late but here\""],
    );
    assert_eq!(
        code(&resume),
        0,
        "{}",
        String::from_utf8_lossy(&resume.stderr)
    );
    let recover = cli(home, &node, &["recover", &id]);
    assert_eq!(
        code(&recover),
        0,
        "{}",
        String::from_utf8_lossy(&recover.stderr)
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let get = json_of(&cli(home, &node, &["get", &id, "--json"]));
        if get["status"] == "completed" {
            assert_eq!(get["result"], "late but here", "{get}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the recorded answer was never applied: {get}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
