//! The documentation cannot drift from the binary: every workflow in `examples/` runs to the end
//! its header documents (through the CLI, as the header says, on the examples' configuration; the
//! `openai` one against a local stand-in of the endpoint), every runnable JavaScript example of
//! `docs/script-api.md` ends as the line after it says, the `command` agent program printed in
//! `docs/agents.md` is the one in `examples/agents/`, `deploy/nginx.conf` passes `nginx -t`,
//! every file `ARCHITECTURE.md` names exists, and `docs/getting-started.md` runs as written and
//! prints what it shows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::{cli, code, json_of};
use crate::http_api::{ADMIN, Db, Node, initialize};
use crate::http_client::Api;
use crate::openai_agent::{Reply, StandIn, completion};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository's root")
}

fn read(relative: &str) -> String {
    let path = repository().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// ARCHITECTURE.md

/// Every file of the repository (its path from the root), but what git leaves out of it.
fn repository_files(root: &Path, dir: &Path, files: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a folder entry").path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("");
        if name == "target" || name == ".git" {
            continue;
        }
        if path.is_dir() {
            repository_files(root, &path, files);
        } else if let Ok(relative) = path.strip_prefix(root) {
            files.push(relative.to_string_lossy().into_owned());
        }
    }
}

/// The map of the code names files by their path from the root (`actors/src/node.rs`), or, in
/// a list under a folder, by their path in it (`postgres/conn.rs`, `machine.rs`): each must be
/// a file of the repository, so a file moved or deleted without the map fails here.
#[test]
fn every_file_the_architecture_map_names_exists() {
    let root = repository();
    let mut files = Vec::new();
    repository_files(&root, &root, &mut files);
    let map = read("ARCHITECTURE.md");
    let extensions = [
        ".rs", ".md", ".sql", ".js", ".sh", ".toml", ".html", ".css", ".conf",
    ];
    let named: Vec<&str> = map
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            !span.starts_with("../")
                && !span.starts_with('/')
                && extensions.iter().any(|extension| span.ends_with(extension))
                && span
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_./-".contains(c))
        })
        .collect();
    assert!(named.len() > 100, "the map names {} files", named.len());
    let missing: Vec<&str> = named
        .into_iter()
        .filter(|span| {
            !files
                .iter()
                .any(|file| file == span || file.ends_with(&format!("/{span}")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names files that do not exist: {missing:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// examples/

/// `cli`, asserting the exit code; the output's stdout as text.
fn reins(home: &Path, node: &Node, args: &[&str], exit: i32) -> std::process::Output {
    let output = cli(home, node, args);
    assert_eq!(
        code(&output),
        exit,
        "reins {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Polls `reins get ID --json` until `ready` holds for the record, and returns it.
fn wait_until(
    home: &Path,
    node: &Node,
    id: &str,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let record = json_of(&reins(home, node, &["get", id, "--json"], 0));
        if ready(&record) {
            return record;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{id} never got to {what}: {record}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn completed(home: &Path, node: &Node, id: &str) -> Value {
    let record = wait_until(home, node, id, "an end", |r| {
        matches!(
            r["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        )
    });
    assert_eq!(record["status"], "completed", "{record}");
    record["result"].clone()
}

/// `reins run EXAMPLE --wait --json` with `args`, expecting exit code `exit`; the record.
fn run_example(home: &Path, node: &Node, example: &str, args: &str, exit: i32) -> Value {
    let path = repository().join("examples").join(example);
    let path = path.display().to_string();
    json_of(&reins(
        home,
        node,
        &["run", &path, "--args", args, "--wait", "--json"],
        exit,
    ))
}

fn run_id(record: &Value) -> String {
    record["run_id"].as_str().expect("run_id").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_example_runs_to_its_documented_end() {
    let examples: Vec<String> = std::fs::read_dir(repository().join("examples"))
        .expect("examples/")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".js"))
        .collect();
    let mut driven = vec![
        "review.js",
        "fan-out.js",
        "command-agent.js",
        "openai.js",
        "retry-until-approved.js",
        "tool-approval.js",
    ];
    let mut found: Vec<&str> = examples.iter().map(String::as_str).collect();
    found.sort_unstable();
    driven.sort_unstable();
    assert_eq!(found, driven, "every example in examples/ is run here");

    // The examples' configuration, made the way examples/reins.toml says, with the openai
    // agent pointed at a stand-in of the endpoint.
    let stand_in = StandIn::start(vec![Reply::Json(
        200,
        completion("A workflow that survives the death of its node.", 12),
    )])
    .await;
    let config = read("examples/reins.toml");
    let openai = "base_url = \"https://api.openai.com/v1\"";
    assert!(
        config.contains(openai),
        "examples/reins.toml names OpenAI's endpoint"
    );
    let config = config
        .replace("/path/to/reins", &repository().display().to_string())
        .replace(
            openai,
            &format!("base_url = \"http://{}/v1\"", stand_in.addr),
        );
    let dir = tempfile::tempdir().expect("temp dir");
    let config_path = dir.path().join("examples.toml");
    std::fs::write(&config_path, config).expect("examples.toml");

    let db = Db::new(false).await;
    let node = Node::start(
        &db,
        &[
            ("REINS_CONFIG", config_path.display().to_string()),
            ("OPENAI_API_KEY", "test-key".to_owned()),
        ],
    );
    let home = dir.path();
    reins(home, &node, &["init", "--email", ADMIN], 0);

    // review.js: waits at "review"; the artifact is the file; approved, it completes.
    let record = run_example(home, &node, "review.js", "{}", 3);
    assert_eq!(record["status"], "waiting_approval");
    let id = run_id(&record);
    let artifact = reins(home, &node, &["artifact", &id, "2", "-o", "-"], 0);
    assert_eq!(String::from_utf8_lossy(&artifact.stdout), "the evidence\n");
    reins(
        home,
        &node,
        &["approve", &id, "--comment", "looks right"],
        0,
    );
    assert_eq!(
        completed(home, &node, &id),
        json!({"decision": "approve", "by": ADMIN, "summary": {"echo": "the evidence\n"}})
    );

    // fan-out.js: three at once, then the join.
    let record = run_example(
        home,
        &node,
        "fan-out.js",
        r#"{"text": "reins keeps a journal"}"#,
        0,
    );
    assert_eq!(
        record["result"],
        json!({"angles": ["clarity", "accuracy", "tone"],
               "summary": "clarity: fine; accuracy: fine; tone: fine (reins keeps a journal)"})
    );

    // command-agent.js: the sh program wrote the file the script captured.
    let record = run_example(
        home,
        &node,
        "command-agent.js",
        r#"{"text": "three small words"}"#,
        0,
    );
    assert_eq!(
        record["result"],
        json!({"words": 3, "artifactVersion": 2, "bytes": 18}),
        "{record}"
    );
    let artifact = reins(
        home,
        &node,
        &["artifact", &run_id(&record), "2", "-o", "-"],
        0,
    );
    assert_eq!(
        String::from_utf8_lossy(&artifact.stdout),
        "three small words\n"
    );

    // openai.js: one chat completion, with the key from the node's environment.
    let record = run_example(
        home,
        &node,
        "openai.js",
        r#"{"question": "What is a durable workflow?"}"#,
        0,
    );
    assert_eq!(
        record["result"],
        json!({"answer": "A workflow that survives the death of its node.", "model": "gpt-test"}),
        "{record}"
    );
    let received = stand_in.received();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].path, "/v1/chat/completions");
    assert_eq!(
        received[0].authorization.as_deref(),
        Some("Bearer test-key")
    );
    assert_eq!(received[0].body["model"], "gpt-4o-mini");
    assert_eq!(
        received[0].body["messages"][0]["content"],
        "What is a durable workflow?"
    );

    // retry-until-approved.js: rejected once with a comment, approved the second time.
    let record = run_example(home, &node, "retry-until-approved.js", "{}", 3);
    let id = run_id(&record);
    reins(
        home,
        &node,
        &["reject", &id, "--comment", "shorter, please"],
        0,
    );
    wait_until(home, &node, &id, "review-2", |r| {
        r["checkpoints"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["step_id"] == "review-2" && c["status"] == "waiting")
        })
    });
    reins(home, &node, &["approve", &id], 0);
    assert_eq!(
        completed(home, &node, &id),
        json!({"approvedRound": 2, "artifactVersion": 4, "feedback": ["shorter, please"]})
    );
    let artifact = reins(home, &node, &["artifact", &id, "4", "-o", "-"], 0);
    assert_eq!(
        String::from_utf8_lossy(&artifact.stdout),
        "draft 2 (after: shorter, please)\n"
    );

    // tool-approval.js: the program asks, `reins answer` approves, the program publishes.
    let record = run_example(home, &node, "tool-approval.js", "{}", 3);
    let id = run_id(&record);
    let record = wait_until(home, &node, &id, "the agent's question", |r| {
        r["steps"][0]["status"] == "waiting_for_input"
    });
    assert_eq!(
        record["steps"][0]["approval"]["actions"],
        json!([{"tool": "publish", "target": "notes.txt"}])
    );
    reins(
        home,
        &node,
        &[
            "answer",
            &id,
            "publish",
            "--approve",
            "--comment",
            "go ahead",
        ],
        0,
    );
    assert_eq!(
        completed(home, &node, &id),
        json!({"published": true, "target": "notes.txt"})
    );
    let record = json_of(&reins(home, &node, &["get", &id, "--json"], 0));
    assert_eq!(
        record["steps"][0]["approval"]["answer"]["comment"],
        "go ahead"
    );
}

#[test]
fn the_command_agent_program_in_the_docs_is_the_one_in_examples() {
    let program = read("examples/agents/notes.sh");
    assert!(
        read("docs/agents.md").contains(&format!("```sh\n{program}```")),
        "docs/agents.md prints examples/agents/notes.sh verbatim"
    );
}

// ---------------------------------------------------------------------------------------------
// docs/script-api.md

/// What a person does while a snippet's workflow waits.
#[derive(Debug)]
enum Then {
    Resume {
        step: String,
        input: Value,
    },
    Decide {
        step: String,
        decision: String,
        comment: Option<String>,
    },
    Answer {
        step: String,
        decision: String,
        comment: Option<String>,
    },
    /// `send NAME JSON`: an event, sent at once (it is kept until a wait takes it).
    Send {
        name: String,
        payload: Value,
    },
}

#[derive(Debug)]
enum Expect {
    Completed(Value),
    Failed(String),
}

#[derive(Debug)]
struct Snippet {
    /// The line of the opening fence, for messages.
    line: usize,
    script: String,
    args: Option<Value>,
    then: Vec<Then>,
    expect: Expect,
}

/// `STEP` and an optional JSON string (a comment).
fn step_and_comment(rest: &str) -> (String, Option<String>) {
    let (step, comment) = rest.split_once(' ').unwrap_or((rest, ""));
    let comment = (!comment.trim().is_empty()).then(|| {
        serde_json::from_str::<String>(comment.trim())
            .unwrap_or_else(|e| panic!("comment {comment:?} is not a JSON string: {e}"))
    });
    (step.to_owned(), comment)
}

fn parse_then(text: &str) -> Then {
    let (verb, rest) = text.split_once(' ').expect("`then: VERB STEP ...`");
    match verb {
        "resume" => {
            let (step, input) = rest.split_once(' ').expect("`resume STEP JSON`");
            Then::Resume {
                step: step.to_owned(),
                input: serde_json::from_str(input).expect("resume input is JSON"),
            }
        }
        "approve" | "reject" => {
            let (step, comment) = step_and_comment(rest);
            Then::Decide {
                step,
                decision: verb.to_owned(),
                comment,
            }
        }
        "answer" => {
            let (step, rest) = rest.split_once(' ').expect("`answer STEP approve|reject`");
            let (decision, comment) = step_and_comment(rest);
            Then::Answer {
                step: step.to_owned(),
                decision,
                comment,
            }
        }
        "send" => {
            let (name, payload) = rest.split_once(' ').expect("`send NAME JSON`");
            Then::Send {
                name: name.to_owned(),
                payload: serde_json::from_str(payload).expect("send payload is JSON"),
            }
        }
        other => panic!("unknown `then:` verb {other:?}"),
    }
}

/// The fenced `js` blocks of a Markdown text: the runnable ones, and how many were `no-run`.
fn snippets(markdown: &str) -> (Vec<Snippet>, usize) {
    let mut found = Vec::new();
    let mut skipped = 0;
    let mut lines = markdown.lines().enumerate();
    while let Some((index, line)) = lines.next() {
        assert!(
            !line.contains("```") || line.starts_with("```"),
            "line {}: a fence that does not open its line is not a fence",
            index + 1
        );
        let Some(info) = line.strip_prefix("```js") else {
            continue;
        };
        let block: Vec<&str> = lines
            .by_ref()
            .map(|(_, line)| line)
            .take_while(|line| *line != "```")
            .collect();
        match info.trim() {
            "" => {}
            "no-run" => {
                skipped += 1;
                continue;
            }
            other => panic!("line {}: unknown js fence option {other:?}", index + 1),
        }
        let directive = |prefix: &'static str| {
            block
                .iter()
                .filter_map(move |line| line.trim().strip_prefix(prefix))
                .map(str::trim)
        };
        let expect = directive("// => ")
            .next()
            .unwrap_or_else(|| panic!("line {}: a js block without `// => `", index + 1));
        let expect = match expect.split_once(' ') {
            Some(("completed", json)) => Expect::Completed(
                serde_json::from_str(json)
                    .unwrap_or_else(|e| panic!("line {}: {json:?}: {e}", index + 1)),
            ),
            Some(("failed", text)) => Expect::Failed(text.to_owned()),
            _ => panic!(
                "line {}: `// => completed JSON` or `// => failed TEXT`",
                index + 1
            ),
        };
        found.push(Snippet {
            line: index + 1,
            script: block.join("\n"),
            args: directive("// args: ")
                .next()
                .map(|json| serde_json::from_str(json).expect("args are JSON")),
            then: directive("// then: ").map(parse_then).collect(),
            expect,
        });
    }
    (found, skipped)
}

fn find<'a>(record: &'a Value, list: &str, step: &str, status: &str) -> Option<&'a Value> {
    record[list]
        .as_array()?
        .iter()
        .find(|item| item["step_id"] == step && item["status"] == status)
}

/// Does `then` if its step waits for it now; whether it was done.
async fn act(api: &mut Api, run_id: &str, record: &Value, then: &Then) -> Result<bool, String> {
    let base = format!("/api/v1/workflows/{run_id}");
    let (path, body) = match then {
        Then::Resume { step, input } => {
            let Some(pause) = find(record, "checkpoints", step, "waiting") else {
                return Ok(false);
            };
            (
                format!("{base}/resume"),
                json!({"fingerprint": record["fingerprint"], "step_id": step,
                       "attempt": pause["attempt"], "input": input}),
            )
        }
        Then::Decide {
            step,
            decision,
            comment,
        } => {
            let Some(checkpoint) = find(record, "checkpoints", step, "waiting") else {
                return Ok(false);
            };
            (
                format!("{base}/decide"),
                json!({"step_id": step, "attempt": checkpoint["attempt"],
                       "artifact_version": checkpoint["artifact_version"],
                       "decision": decision, "comment": comment}),
            )
        }
        Then::Answer {
            step,
            decision,
            comment,
        } => {
            if find(record, "steps", step, "waiting_for_input").is_none() {
                return Ok(false);
            }
            (
                format!("{base}/steps/{step}/answer"),
                json!({"decision": decision, "comment": comment}),
            )
        }
        Then::Send { name, payload } => (
            format!("{base}/events"),
            json!({"name": name, "event_id": format!("{name}-doc"), "payload": payload}),
        ),
    };
    let answer = api.call("POST", &path, Some(body)).await;
    match answer.status {
        200 => Ok(true),
        // The workflow moved since the record was read (a stale fingerprint): read it again.
        409 => Ok(false),
        _ => Err(format!("{then:?}: {answer:?}")),
    }
}

/// Launches one snippet, does its `then:` steps, and checks how it ended.
async fn check(mut api: Api, snippet: Snippet) -> Result<(), String> {
    let mut body = json!({"script": snippet.script});
    if let Some(args) = &snippet.args {
        body["args"] = args.clone();
    }
    let launched = api.call("POST", "/api/v1/workflows", Some(body)).await;
    if launched.status != 201 {
        return Err(format!("launch: {launched:?}"));
    }
    let run_id = launched.json()["run_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let mut then = snippet.then.iter().peekable();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let record = loop {
        let record = api
            .call("GET", &format!("/api/v1/workflows/{run_id}"), None)
            .await
            .json();
        if matches!(
            record["status"].as_str(),
            Some("completed" | "failed" | "cancelled" | "needs_reconciliation")
        ) {
            break record;
        }
        if let Some(next) = then.peek()
            && act(&mut api, &run_id, &record, next).await?
        {
            then.next();
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("never ended: {record}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if let Some(left) = then.next() {
        return Err(format!("ended before {left:?}: {record}"));
    }
    match &snippet.expect {
        Expect::Completed(result)
            if record["status"] == "completed" && record["result"] == *result =>
        {
            Ok(())
        }
        Expect::Failed(text)
            if record["status"] == "failed"
                && record["error"]
                    .as_str()
                    .is_some_and(|e| e.contains(text.as_str())) =>
        {
            Ok(())
        }
        expect => Err(format!(
            "expected {expect:?}, ended {} with result {} and error {}",
            record["status"], record["result"], record["error"]
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_script_api_example_ends_as_the_doc_says() {
    let (snippets, skipped) = snippets(&read("docs/script-api.md"));
    assert!(
        snippets.len() >= 20,
        "only {} runnable examples",
        snippets.len()
    );
    let db = Db::new(false).await;
    let node = Node::start(&db, &[]);
    let api = initialize(&node).await;
    let lines: Vec<usize> = snippets.iter().map(|s| s.line).collect();
    let checks: Vec<_> = snippets
        .into_iter()
        .map(|snippet| tokio::spawn(check(api.clone(), snippet)))
        .collect();
    let mut failures = Vec::new();
    for (line, handle) in lines.iter().zip(checks) {
        if let Err(why) = handle.await.expect("a check") {
            failures.push(format!("docs/script-api.md:{line}: {why}"));
        }
    }
    println!(
        "docs/script-api.md: {} examples ran, {skipped} marked no-run",
        lines.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// deploy/nginx.conf

#[test]
fn the_nginx_example_passes_nginx_t() {
    let nginx = crate::cluster::nginx_binary();
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    let (cert, key) = (root.join("fullchain.pem"), root.join("privkey.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=reins.example.com", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian's ca-certificates brings it) makes a test certificate");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );

    // The example as shipped, with the certificate paths pointed at the test's own.
    let site = read("deploy/nginx.conf");
    for path in ["/etc/ssl/reins/fullchain.pem", "/etc/ssl/reins/privkey.pem"] {
        assert!(site.contains(path), "deploy/nginx.conf names {path}");
    }
    let site = site
        .replace("/etc/ssl/reins/fullchain.pem", &cert.display().to_string())
        .replace("/etc/ssl/reins/privkey.pem", &key.display().to_string());
    std::fs::write(root.join("reins.conf"), site).expect("reins.conf");
    let r = root.display();
    let main = format!(
        "pid {r}/nginx.pid; error_log {r}/error.log;
         events {{}}
         http {{
           access_log off;
           client_body_temp_path {r}/body; proxy_temp_path {r}/proxy;
           fastcgi_temp_path {r}/fastcgi; uwsgi_temp_path {r}/uwsgi; scgi_temp_path {r}/scgi;
           include {r}/reins.conf;
         }}"
    );
    std::fs::write(root.join("nginx.conf"), main).expect("nginx.conf");
    let tested = Command::new(nginx)
        .arg("-t")
        .arg("-c")
        .arg(root.join("nginx.conf"))
        .arg("-p")
        .arg(root)
        .output()
        .expect("nginx -t");
    let said = String::from_utf8_lossy(&tested.stderr);
    assert!(
        tested.status.success(),
        "nginx -t refused deploy/nginx.conf: {said}"
    );
    assert!(said.contains("syntax is ok"), "{said}");
}

// ---------------------------------------------------------------------------------------------
// Links

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(markdown: &str) -> Vec<String> {
    let mut fenced = false;
    let mut found = Vec::new();
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.push(anchor(line.trim_start_matches('#')));
        }
    }
    found
}

#[test]
fn every_relative_link_of_the_docs_leads_somewhere() {
    let root = repository();
    let mut pages = vec![root.join("README.md"), root.join("examples/README.md")];
    for entry in std::fs::read_dir(root.join("docs")).expect("docs/") {
        pages.push(entry.expect("entry").path());
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("a page");
        for (_, rest) in text
            .match_indices("](")
            .map(|(at, _)| text.split_at(at + 2))
        {
            let Some(target) = rest.split(')').next() else {
                continue;
            };
            if target.starts_with("http") || target.contains(' ') {
                continue;
            }
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let file = if file.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a folder").join(file)
            };
            checked += 1;
            if !file.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
            } else if !fragment.is_empty() {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&text).iter().any(|a| a == fragment) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(checked > 30, "only {checked} links found");
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// docs/getting-started.md

/// One fenced block of shell commands of the tutorial, and the output block printed after it.
#[derive(Debug)]
struct Shown {
    commands: String,
    output: Option<String>,
}

/// The tutorial's ```sh blocks, each with the plain ``` block that follows it, if one does.
fn shown_blocks(text: &str) -> Vec<Shown> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(language) = line.strip_prefix("```") else {
            continue;
        };
        let body: Vec<&str> = lines.by_ref().take_while(|l| *l != "```").collect();
        blocks.push((language.to_owned(), body.join("\n")));
    }
    let mut shown = Vec::new();
    let mut blocks = blocks.into_iter().peekable();
    while let Some((language, body)) = blocks.next() {
        if language != "sh" {
            continue;
        }
        let output = blocks
            .next_if(|(language, _)| language.is_empty())
            .map(|(_, output)| output);
        shown.push(Shown {
            commands: body,
            output,
        });
    }
    shown
}

/// `text` with its times made `<time>`: epoch seconds (ten digits or more, and their fraction)
/// and UTC times as `2026-12-07T09:12:41Z`.
fn times_out(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let digit = |at: usize| chars.get(at).is_some_and(char::is_ascii_digit);
    let iso = |at: usize| {
        "dddd-dd-ddTdd:dd:ddZ"
            .chars()
            .enumerate()
            .all(|(n, shape)| match shape {
                'd' => digit(at + n),
                c => chars.get(at + n) == Some(&c),
            })
    };
    let mut out = String::new();
    let mut at = 0;
    while at < chars.len() {
        if at > 0 && (chars[at - 1].is_ascii_alphanumeric()) {
            out.push(chars[at]);
            at += 1;
            continue;
        }
        if iso(at) {
            out.push_str("<time>");
            at += 20;
            continue;
        }
        let run = (at..chars.len()).take_while(|n| digit(*n)).count();
        if run >= 10 {
            at += run;
            if chars.get(at) == Some(&'.') && digit(at + 1) {
                at += 1;
                while digit(at) {
                    at += 1;
                }
            }
            out.push_str("<time>");
            continue;
        }
        out.push(chars[at]);
        at += 1;
    }
    out
}

/// What varies from run to run, made the same on both sides: ids of 32 hex digits, times, the
/// node's address, and runs of spaces (a table's columns follow its widest cell).
fn normalized(text: &str, addr: &str) -> Vec<String> {
    let text = times_out(&text.replace(addr, "127.0.0.1:7420"));
    text.lines()
        .map(|line| {
            let words: Vec<String> = line
                .split_whitespace()
                .map(|word| {
                    let mut out = String::new();
                    let mut hex = String::new();
                    for c in word.chars().chain(std::iter::once(' ')) {
                        if c.is_ascii_hexdigit() && !c.is_ascii_uppercase() {
                            hex.push(c);
                            continue;
                        }
                        if hex.len() == 32 {
                            out.push_str("<id>");
                        } else {
                            out.push_str(&hex);
                        }
                        hex.clear();
                        if c != ' ' {
                            out.push(c);
                        }
                    }
                    out
                })
                .collect();
            // Durations (`18 ms`, `2.5 s`) vary from run to run too.
            let mut kept: Vec<String> = Vec::new();
            for word in words {
                let unit = ["ms", "s", "min", "h"].contains(&word.as_str());
                if unit && kept.last().is_some_and(|n| n.parse::<f64>().is_ok()) {
                    kept.pop();
                    kept.push("<duration>".to_owned());
                } else {
                    kept.push(word);
                }
            }
            kept.join(" ")
        })
        .filter(|line| !line.is_empty())
        .collect()
}

/// Whether `actual` shows `expected`'s lines in order, where a line `...` stands for any lines.
fn shows(expected: &[String], actual: &[String]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first == "..." => {
            (0..=actual.len()).any(|skip| shows(rest, &actual[skip..]))
        }
        Some((first, rest)) => actual
            .split_first()
            .is_some_and(|(line, more)| line == first && shows(rest, more)),
    }
}

/// A `reins serve` of the test's own, stopped when dropped.
struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The tutorial's commands, one per item, a line ending in `\` joined to the next.
fn commands_of(block: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        current.push_str(line);
        if let Some(joined) = current.strip_suffix('\\') {
            current = format!("{joined} ");
            continue;
        }
        commands.push(std::mem::take(&mut current));
    }
    commands
}

/// Whether a block only reads (a reader runs it again until it shows what the document says,
/// as the workflow moves on).
fn only_reads(commands: &[String]) -> bool {
    commands.iter().all(|command| {
        ["reins get", "reins list", "reins inbox", "reins artifact"]
            .iter()
            .any(|read| command.starts_with(read))
    })
}

/// Every command of docs/getting-started.md runs, in order, as a reader types it: `reins serve`
/// in a folder of its own (on a free port, which stands for 127.0.0.1:7420 in every command and
/// output), then each command in one shell state (`RUN_ID`, `TOKEN`; `RUN_ID=` takes the run id
/// the reader's last `reins run` printed), and each prints what the document shows after it
/// (ids, the node's name and the port aside; `...` stands for any lines). A block that only
/// reads is run again until it shows it, as a reader would once the workflow moved on. Not run:
/// the build (this test runs the build's binary).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn getting_started_runs_as_written() {
    use std::io::BufRead;
    let home = tempfile::tempdir().expect("home");
    let work = tempfile::tempdir().expect("the node's folder");
    let bin = crate::harness::reins_bin();
    let bin_dir = bin.parent().expect("the binary's folder").to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let addr = format!("127.0.0.1:{}", crate::harness::free_port());
    let mut child = Command::new(&bin)
        .arg("serve")
        .current_dir(work.path())
        .env_clear()
        .env("PATH", &path)
        .env("HOME", home.path())
        .env("REINS_LISTEN", &addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("reins serve");
    let stdout = child.stdout.take().expect("its stdout");
    let served = Served(child);
    let mut banner = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.expect("a line of the banner");
        let last = line.starts_with("then:");
        banner.push(line);
        if last {
            break;
        }
    }
    let banner = banner.join("\n");
    // The node's name, as its banner prints it, stands for the document's.
    let node_name = banner
        .split("(node ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_default()
        .to_owned();
    let document = read("docs/getting-started.md");
    // And the name of the node the document shows, wherever it shows it.
    let documents_node = document
        .split("(node ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_default()
        .to_owned();
    let normal = |text: &str| {
        let text = text.replace(&node_name, "NODE");
        let text = text.replace(&documents_node, "NODE");
        normalized(&text, &addr)
    };
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut last_run = String::new();
    let mut failures = Vec::new();
    for shown in shown_blocks(&document) {
        let commands: Vec<String> = commands_of(&shown.commands)
            .into_iter()
            .filter(|line| !line.starts_with("cargo build") && !line.starts_with("export PATH"))
            .collect();
        let printed = if commands == ["reins serve"] {
            banner.clone()
        } else {
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            loop {
                let mut printed = String::new();
                for command in &commands {
                    let command = command.replace("127.0.0.1:7420", &addr);
                    let command = if command.starts_with("RUN_ID=") {
                        format!("RUN_ID={last_run}")
                    } else {
                        command
                    };
                    let prelude: String = vars
                        .iter()
                        .map(|(name, value)| format!("{name}='{value}'\n"))
                        .collect();
                    let full = format!(
                        "exec 2>&1\n{prelude}{command}\necho \"__vars__ RUN_ID=$RUN_ID TOKEN=$TOKEN\""
                    );
                    let output = Command::new("bash")
                        .arg("-c")
                        .arg(&full)
                        .current_dir(repository())
                        .env_clear()
                        .env("PATH", &path)
                        .env("HOME", home.path())
                        .env("REINS_CLI_PASSWORD", crate::http_api::PASSWORD)
                        .stdin(std::process::Stdio::null())
                        .output()
                        .expect("bash");
                    let text = String::from_utf8_lossy(&output.stdout).into_owned();
                    let (out, state) = text.rsplit_once("__vars__ ").unwrap_or((&text, ""));
                    for pair in state.split_whitespace() {
                        if let Some((name, value)) = pair.split_once('=')
                            && !value.is_empty()
                        {
                            vars.retain(|(known, _)| known != name);
                            vars.push((name.to_owned(), value.to_owned()));
                        }
                    }
                    if command.starts_with("reins run") {
                        last_run = out
                            .split(|c: char| !c.is_ascii_hexdigit())
                            .find(|word| word.len() == 32)
                            .unwrap_or_default()
                            .to_owned();
                    }
                    printed.push_str(out);
                    printed.push('\n');
                }
                let settled = shown
                    .output
                    .as_deref()
                    .is_none_or(|expected| shows(&normal(expected), &normal(&printed)));
                if settled || !only_reads(&commands) || std::time::Instant::now() >= deadline {
                    break printed;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        let Some(expected) = &shown.output else {
            continue;
        };
        let (expected, actual) = (normal(expected), normal(&printed));
        if !shows(&expected, &actual) {
            failures.push(format!(
                "{}\nprinted:\n{}\nthe document shows:\n{}",
                shown.commands,
                actual.join("\n"),
                expected.join("\n")
            ));
        }
    }
    drop(served);
    assert!(
        failures.is_empty(),
        "docs/getting-started.md drifted from the program:\n\n{}",
        failures.join("\n\n")
    );
}
