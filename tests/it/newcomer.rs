//! What a newcomer meets first, through the real binary: a record that shows every step the
//! script made (captures and reads too) and every artifact version; `reins artifact` writing to
//! standard output; a start-up banner that suggests `reins init` only while no user exists;
//! `reins admin config` naming the paths the node really uses; and a too-large body refused
//! with the limit's name and value.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cli::{cli, code};
use crate::harness::both;
use crate::harness::{free_port, reins_command};
use crate::http_api::{ADMIN, Db, Node, initialize, launch, wait_for};

const REPORT: &str = "hello report";

both!(the_record_shows_captures_reads_and_every_artifact);
async fn the_record_shows_captures_reads_and_every_artifact(postgres: bool) {
    let db = Db::new(postgres).await;
    let node = Node::start(&db, &[]);
    let mut api = initialize(&node).await;
    let script = format!(
        r#"
        await agent({{stepId: "a", agentRef: "scripted", task: {{
            write: [{{path: "/mnt/user-data/outputs/report.txt", content: "{REPORT}"}}],
            output: "drafted"}}}});
        const f = await captureArtifact({{stepId: "file", sourceStepId: "a",
                                         path: "/mnt/user-data/outputs/report.txt"}});
        const text = await readArtifact({{artifactVersion: f.artifactVersion}});
        return {{version: f.artifactVersion, text}};
    "#
    );
    let run = launch(&mut api, &script).await;
    let record = wait_for(&mut api, &run, "completed").await;
    let version = record["result"]["version"].as_i64().expect("version");
    assert_eq!(record["result"]["text"], REPORT);

    let steps: Vec<(&str, &str, &str)> = record["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .map(|s| {
            (
                s["kind"].as_str().expect("kind"),
                s["step_id"].as_str().expect("step_id"),
                s["status"].as_str().expect("status"),
            )
        })
        .collect();
    assert_eq!(
        &steps[..2],
        [
            ("agent", "a", "completed"),
            ("captureArtifact", "file", "completed")
        ]
    );
    assert_eq!((steps[2].0, steps[2].2), ("readArtifact", "completed"));
    assert_eq!(record["steps"][1]["artifact_version"], version);
    assert_eq!(record["steps"][2]["artifact_version"], version);
    assert_eq!(record["steps"][1]["output"], Value::Null);

    let artifacts = record["artifacts"].as_array().expect("artifacts");
    assert_eq!(
        artifacts.len(),
        2,
        "the agent's output and the file: {record}"
    );
    let output = &artifacts[0];
    assert_eq!(
        (
            &output["step_id"],
            &output["path"],
            &output["media_type"],
            &output["name"]
        ),
        (
            &json!("a"),
            &Value::Null,
            &json!("application/json"),
            &json!(format!("artifact-{}", output["version"]))
        )
    );
    let file = &artifacts[1];
    assert_eq!(file["version"], version);
    assert_eq!(file["step_id"], "file");
    assert_eq!(file["path"], "/mnt/user-data/outputs/report.txt");
    assert_eq!(file["name"], "report.txt");
    assert_eq!(file["bytes"], REPORT.len());
    assert_eq!(file["media_type"], "text/plain; charset=utf-8");
    assert_eq!(file["sha256"].as_str().map(str::len), Some(64));
    assert!(
        file["created_at"].as_f64().is_some_and(|t| t > 1e9),
        "{file}"
    );

    // `reins get` shows them; `reins artifact` writes the bytes to standard output without
    // `-o` (a pipe here, as in a script), with `-o -`, or to a file.
    let dir = tempfile::tempdir().expect("temp dir");
    let home = dir.path();
    let login = cli(home, &node, &["login", "--email", ADMIN]);
    assert_eq!(
        code(&login),
        0,
        "{}",
        String::from_utf8_lossy(&login.stderr)
    );
    let get = cli(home, &node, &["get", &run]);
    let shown = String::from_utf8_lossy(&get.stdout).to_string();
    assert!(
        shown.contains("captureArtifact") && shown.contains("report.txt"),
        "{shown}"
    );
    let version = version.to_string();
    for args in [
        vec!["artifact", run.as_str(), version.as_str()],
        vec!["artifact", run.as_str(), version.as_str(), "-o", "-"],
    ] {
        let printed = cli(home, &node, &args);
        assert_eq!(
            code(&printed),
            0,
            "{}",
            String::from_utf8_lossy(&printed.stderr)
        );
        assert_eq!(printed.stdout, REPORT.as_bytes(), "{args:?}");
    }
    let saved = cli(
        home,
        &node,
        &["artifact", &run, &version, "-o", "saved.txt"],
    );
    assert_eq!(
        code(&saved),
        0,
        "{}",
        String::from_utf8_lossy(&saved.stderr)
    );
    assert!(saved.stdout.is_empty());
    assert_eq!(
        std::fs::read(home.join("saved.txt")).expect("saved"),
        REPORT.as_bytes()
    );
}

/// Starts `reins serve` with its standard output read, and returns what it printed before it
/// was ready, once it is; then stops it.
fn banner(dir: &std::path::Path, env: &[(&str, String)]) -> String {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut env = env.to_vec();
    env.push(("REINS_LISTEN", addr.to_string()));
    let mut child = reins_command(dir, &env)
        .arg("serve")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start reins");
    let stdout = child.stdout.take().expect("stdout");
    let (lines, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut printed = Vec::new();
    // The banner's last line starts with "then:".
    while !printed.iter().any(|l: &String| l.starts_with("then:")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => printed.push(line),
            Err(_) => panic!("no banner within 30 s: {printed:?}"),
        }
    }
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) on the child this function started and still holds.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let _ = child.wait();
    printed.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_banner_suggests_init_only_while_no_user_exists() {
    let db = Db::new(false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    let env = [
        (
            "REINS_DATABASE",
            format!("sqlite:{}", data.join("reins.db").display()),
        ),
        ("REINS_DATA_DIR", data.display().to_string()),
    ];
    let first = banner(dir.path(), &env);
    assert!(
        first.contains("first time? create the admin: reins init"),
        "{first}"
    );

    let node = Node::start(
        &db,
        &[
            ("REINS_DATABASE", env[0].1.clone()),
            ("REINS_DATA_DIR", env[1].1.clone()),
        ],
    );
    initialize(&node).await;
    let mut node = node;
    node.signal(libc::SIGTERM);
    assert!(node.process.wait_exit(Duration::from_secs(30)).is_some());
    let again = banner(dir.path(), &env);
    assert!(!again.contains("first time?"), "{again}");
    assert!(again.contains("reins login --url"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_config_names_the_paths_the_node_uses() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let config = crate::operators::admin_json(&node.admin_socket(), &["config"]);
    let data = node.dir.path().join("data");
    assert_eq!(
        config["admin_socket"],
        json!(data.join("admin.sock").display().to_string()),
        "{config}"
    );
    assert_eq!(
        config["workspaces_dir"],
        json!(data.join("workspaces").display().to_string()),
        "{config}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_body_over_the_limit_without_a_length_is_refused_naming_the_limit() {
    let db = Db::new(false).await;
    let node = Node::start(&db, &[("REINS_HTTP__BODY_BYTES_MAX", "1024".to_owned())]);
    let mut stream = TcpStream::connect(node.addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let chunk = "x".repeat(2048);
    let request = format!(
        "POST /api/v1/workflows HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    stream.write_all(request.as_bytes()).expect("send");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let message: Value = serde_json::from_str(body).expect("a JSON error");
    let message = message["error"]["message"].as_str().expect("message");
    assert_eq!(
        message,
        "the request body is over `http.body_bytes_max` (1024 bytes): it is longer than that"
    );
}
