//! `command` agents as processes of the real binary: they see none of the node's environment but
//! what their configuration names, they die with a node killed by SIGKILL (a grandchild too), and
//! a node that starts kills what a dead node process left behind before it admits anything.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::http_api::{ADMIN, Db, Node, PASSWORD, SECRET, initialize, launch, wait_for};

/// Writes `config.toml` into `dir` with the scripted agent and one `command` agent per entry of
/// `agents`: (name, shell script body, extra TOML keys). Returns the file's path.
pub fn write_config(dir: &Path, agents: &[(&str, &str, &str)]) -> String {
    use std::os::unix::fs::PermissionsExt;
    let mut config = String::from("[[agents]]\nname = \"scripted\"\nkind = \"scripted\"\n");
    for (name, body, extra) in agents {
        let program = dir.join(format!("{name}.sh"));
        std::fs::write(&program, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        config.push_str(&format!(
            "\n[[agents]]\nname = \"{name}\"\nkind = \"command\"\nprogram = \"{}\"\n{extra}\n",
            program.display()
        ));
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, config).expect("write config");
    path.display().to_string()
}

/// The state letter of process `pid` (`R`, `S`, `T` stopped, `Z` ended but not reaped...).
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().next()?.chars().next()
}

/// Whether `pid` runs (a zombie nobody reaped yet does not count).
pub fn alive(pid: i32) -> bool {
    state(pid).is_some_and(|state| state != 'Z')
}

/// Processes a test's agent wrote into files; whatever still runs is killed when dropped.
struct Pids {
    dir: PathBuf,
}

impl Pids {
    fn read(&self, name: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Waits until every file of `names` holds a pid.
    fn wait_for(&self, names: &[&str]) -> Vec<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let pids: Option<Vec<i32>> = names.iter().map(|name| self.read(name)).collect();
            if let Some(pids) = pids {
                return pids;
            }
            assert!(Instant::now() < deadline, "the agent never wrote {names:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Pids {
    fn drop(&mut self) {
        let names: Vec<String> = std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        for name in &names {
            if let Some(pid) = self.read(name).filter(|pid| alive(*pid)) {
                // SAFETY: kill(2) on a process this test's agent started; no memory is involved.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

/// A configuration with agent `sleeper`, which records its guard (its parent), itself and a
/// grandchild in `pids`, then runs for long.
fn sleeper_config(dir: &Path, pids: &Path) -> String {
    // The agent writes its pids outside its workspace: its configuration grants it that folder.
    let extra = format!(
        "env = {{ PIDS = \"{0}\" }}\nwrite_paths = [\"{0}\"]",
        pids.display()
    );
    write_config(
        dir,
        &[(
            "sleeper",
            "read task\necho $PPID > \"$PIDS/guard\"\nsleep 600 &\necho $! > \"$PIDS/child\"\n\
             echo $$ > \"$PIDS/leader\"\nwait",
            &extra,
        )],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_agent_sees_none_of_the_nodes_secrets_and_only_what_its_config_names() {
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        files.path(),
        &[(
            "leaky",
            "read task\nenv >&2\nprintf '\\nFORGED_LINE level=ERROR run_id=forged\\n' >&2\nexit 3",
            "stderr_tail_bytes = 65536\nenv_pass = [\"PASS_ME\", \"NOT_SET\"]\n\
             env = { GREETING = \"hello from config\" }",
        )],
    );
    let mut node = Node::start(
        &db,
        &[
            ("REINS_CONFIG", config),
            ("OPENAI_API_KEY", "sk-test-must-not-leak".into()),
            ("PASS_ME", "passed-value".into()),
        ],
    );
    let mut api = initialize(&node).await;
    let run = launch(
        &mut api,
        r#"return await agent({stepId: "a", agentRef: "leaky", task: "x"});"#,
    )
    .await;
    let record = wait_for(&mut api, &run, "failed").await.to_string();
    for named in [
        "REINS_ATTEMPT=1",
        "GREETING=hello from config",
        "PASS_ME=passed-value",
        "PATH=",
        "HOME=",
        "LANG=",
    ] {
        assert!(record.contains(named), "{named:?} is missing: {record}");
    }
    // The node's own variables never reach it: the one `REINS_` variable it sees is its attempt.
    let record = record.replace("REINS_ATTEMPT=1", "");
    for leak in [
        "REINS_",
        "sk-test-must-not-leak",
        "OPENAI_API_KEY",
        SECRET,
        "NOT_SET",
    ] {
        assert!(!record.contains(leak), "{leak:?} leaked: {record}");
    }
    // The whole log: the node stopped, every line it wrote is in.
    node.process.signal(libc::SIGTERM);
    node.process
        .wait_exit(Duration::from_secs(30))
        .expect("the node stops");
    let log = node.process.stderr();
    assert!(log.contains("step finished"), "{log}");
    for leak in ["sk-test-must-not-leak", SECRET, "REINS_DATABASE="] {
        assert!(!log.contains(leak), "{leak:?} leaked into the log: {log}");
    }
    assert!(
        !log.lines().any(|line| line.starts_with("FORGED_LINE")),
        "the agent's stderr wrote a line of the node's log: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_agent_and_its_children_die_with_a_node_killed_by_sigkill() {
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let pids = Pids {
        dir: files.path().join("pids"),
    };
    std::fs::create_dir(&pids.dir).expect("pids folder");
    let config = sleeper_config(files.path(), &pids.dir);
    let mut node = Node::start(&db, &[("REINS_CONFIG", config)]);
    let mut api = initialize(&node).await;
    launch(
        &mut api,
        r#"return await agent({stepId: "s", agentRef: "sleeper", task: "x"});"#,
    )
    .await;
    let agents = pids.wait_for(&["guard", "leader", "child"]);
    assert!(agents.iter().all(|pid| alive(*pid)), "{agents:?}");
    node.signal(libc::SIGKILL);
    node.process
        .wait_exit(Duration::from_secs(60))
        .expect("the node dies");
    // The agent would sleep for ten minutes: gone well before that, it died with its node (the
    // bound only detects processes that outlive it).
    let died = Instant::now();
    while agents.iter().any(|pid| alive(*pid)) {
        assert!(
            died.elapsed() < Duration::from_secs(60),
            "agent processes outlived their node by a minute: {:?}",
            agents.iter().filter(|pid| alive(**pid)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What no guard could kill (here the guard itself was killed, and the node with it before it
/// could stop the group) is killed by the next node process on the same data folder before it
/// becomes ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starting_node_kills_the_agents_a_dead_node_process_left_running() {
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let pids = Pids {
        dir: files.path().join("pids"),
    };
    std::fs::create_dir(&pids.dir).expect("pids folder");
    let config = sleeper_config(files.path(), &pids.dir);
    let data_dir = files.path().join("data").display().to_string();
    let env = [("REINS_CONFIG", config), ("REINS_DATA_DIR", data_dir)];
    let mut node = Node::start(&db, &env);
    let mut api = initialize(&node).await;
    launch(
        &mut api,
        r#"return await agent({stepId: "s", agentRef: "sleeper", task: "x"});"#,
    )
    .await;
    let agents = pids.wait_for(&["guard", "leader", "child"]);
    let (guard, leader, child) = (agents[0], agents[1], agents[2]);
    let deadline = Instant::now() + Duration::from_secs(60);
    // The node is held still while its agent's guard is killed, so it never stops the group.
    node.signal(libc::SIGSTOP);
    let node_pid = i32::try_from(node.process.pid()).expect("pid");
    while state(node_pid) != Some('T') {
        assert!(Instant::now() < deadline, "the node never stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) on the guard this test's agent reported; no memory is involved.
    assert_eq!(unsafe { libc::kill(guard, libc::SIGKILL) }, 0);
    while alive(guard) || alive(leader) {
        assert!(Instant::now() < deadline, "the program outlived its guard");
        std::thread::sleep(Duration::from_millis(10));
    }
    node.signal(libc::SIGKILL);
    node.process
        .wait_exit(Duration::from_secs(60))
        .expect("the node dies");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(child),
        "nothing should have killed the grandchild yet"
    );

    let _again = Node::start(&db, &env);
    assert!(
        !alive(child),
        "an agent process of a dead node still runs after a restart"
    );
}

/// Issue 29, item 13: an agent's descendants that left its process group (a `setsid` child, and
/// a double fork whose middle process ended at once) die when its run ends, when it is
/// cancelled, and when its node is killed by SIGKILL; a restart on the same data folder finds
/// nothing left either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_descendants_that_left_its_group_die_with_its_run_and_with_its_node() {
    use std::os::unix::fs::PermissionsExt;
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let pids = Pids {
        dir: files.path().join("pids"),
    };
    std::fs::create_dir(&pids.dir).expect("pids folder");
    // Records its pid under the name it is given, then sleeps for long.
    let daemon = files.path().join("daemon.sh");
    std::fs::write(
        &daemon,
        "#!/bin/sh\necho $$ > \"$PIDS/$1\"\nexec sleep 1000\n",
    )
    .expect("write");
    std::fs::set_permissions(&daemon, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let extra = format!(
        "env = {{ PIDS = \"{0}\", DAEMON = \"{1}\" }}\nwrite_paths = [\"{0}\"]\n\
         read_paths = [\"{1}\"]",
        pids.dir.display(),
        daemon.display()
    );
    // The task names the run: its daemons are "<task>-setsid" and "<task>-double". A task
    // "hold" then runs on; any other ends the run.
    let body = r#"read -r line
task=$(printf '%s\n' "$line" | sed -n 's/.*"task":"\([^"\\]*\)".*/\1/p')
setsid "$DAEMON" "$task-setsid" &
sh -c 'setsid "$DAEMON" "$0-double" & exit 0' "$task"
while [ ! -s "$PIDS/$task-setsid" ] || [ ! -s "$PIDS/$task-double" ]; do sleep 0.02; done
if [ "$task" = hold ]; then sleep 1000; fi
echo '{"type": "output", "output": "started"}'"#;
    let config = write_config(files.path(), &[("escaper", body, &extra)]);
    let data_dir = files.path().join("data").display().to_string();
    let env = [("REINS_CONFIG", config), ("REINS_DATA_DIR", data_dir)];
    let mut node = Node::start(&db, &env);
    let mut api = initialize(&node).await;
    let gone = |names: &[&str], what: &str| {
        let escaped = pids.wait_for(names);
        // They would sleep for a thousand seconds: the bound only detects survivors.
        let deadline = Instant::now() + Duration::from_secs(60);
        while escaped.iter().any(|pid| alive(*pid)) {
            assert!(
                Instant::now() < deadline,
                "{what}: descendants outside the agent's group still run: {:?}",
                escaped
                    .iter()
                    .filter(|pid| alive(**pid))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };

    // The program ends on its own.
    let run = launch(
        &mut api,
        r#"return await agent({stepId: "e", agentRef: "escaper", task: "ended"});"#,
    )
    .await;
    wait_for(&mut api, &run, "completed").await;
    gone(&["ended-setsid", "ended-double"], "after the run ended");

    // The run is cancelled.
    let run = launch(
        &mut api,
        r#"return await agent({stepId: "e", agentRef: "escaper", task: "hold"});"#,
    )
    .await;
    let held = pids.wait_for(&["hold-setsid", "hold-double"]);
    let answer = api
        .call("POST", &format!("/api/v1/workflows/{run}/cancel"), None)
        .await;
    assert!(answer.status < 300, "{answer:?}");
    wait_for(&mut api, &run, "cancelled").await;
    gone(
        &["hold-setsid", "hold-double"],
        "after the run was cancelled",
    );
    for name in ["hold-setsid", "hold-double"] {
        std::fs::remove_file(pids.dir.join(name)).expect("forget");
    }
    assert!(held.iter().all(|pid| !alive(*pid)));

    // The node is killed while the run holds.
    launch(
        &mut api,
        r#"return await agent({stepId: "e", agentRef: "escaper", task: "hold"});"#,
    )
    .await;
    pids.wait_for(&["hold-setsid", "hold-double"]);
    node.signal(libc::SIGKILL);
    node.process
        .wait_exit(Duration::from_secs(60))
        .expect("the node dies");
    gone(&["hold-setsid", "hold-double"], "after the node was killed");
    let _again = Node::start(&db, &env);
    gone(&["hold-setsid", "hold-double"], "after the next start");
}

/// Issue 31, "Also found": a node drained by SIGTERM left an agent's grandchild running. Here the
/// grandchild ignores SIGTERM (and would sleep for 300 s), and it must be gone, killed once the
/// agent's `grace_ms` is over, however its run ends: cancelled, timed out by
/// `timeout.attempt_ms`, its node killed by SIGKILL, its node drained by SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grandchild_ignoring_sigterm_dies_however_its_run_or_its_node_stops() {
    let db = Db::new(false).await;
    let files = tempfile::tempdir().expect("temp dir");
    let pids = Pids {
        dir: files.path().join("pids"),
    };
    std::fs::create_dir(&pids.dir).expect("pids folder");
    const GRACE_MS: u64 = 1_000;
    let extra = format!(
        "grace_ms = {GRACE_MS}\nenv = {{ PIDS = \"{0}\" }}\nwrite_paths = [\"{0}\"]",
        pids.dir.display()
    );
    // The task names the grandchild's pid file; the program then waits for it forever.
    let body = r#"read -r line
task=$(printf '%s\n' "$line" | sed -n 's/.*"task":"\([^"\\]*\)".*/\1/p')
sh -c 'trap "" TERM; echo $$ > "$PIDS/$0"; exec sleep 300' "$task" &
wait"#;
    let timed = format!("{extra}\ntimeout = {{ attempt_ms = 1000 }}");
    let config = write_config(
        files.path(),
        &[("stubborn", body, &extra), ("stubborn-timed", body, &timed)],
    );
    let env = [("REINS_CONFIG", config)];
    // Far below the grandchild's own 300 s: the bound only detects one that nothing killed.
    let margin = Duration::from_millis(GRACE_MS) + Duration::from_secs(60);
    let gone_within = |name: &str, since: Instant, within: Duration, what: &str| {
        let pid = pids.read(name).expect("pid");
        while alive(pid) {
            assert!(
                since.elapsed() < within,
                "{what}: the grandchild that ignores SIGTERM ({pid}) still runs after {:?}",
                since.elapsed()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let step = |agent: &str, task: &str| {
        format!(r#"return await agent({{stepId: "s", agentRef: "{agent}", task: "{task}"}});"#)
    };

    let mut node = Node::start(&db, &env);
    let mut api = initialize(&node).await;

    // The run is cancelled.
    let run = launch(&mut api, &step("stubborn", "cancelled")).await;
    pids.wait_for(&["cancelled"]);
    let asked = Instant::now();
    let answer = api
        .call("POST", &format!("/api/v1/workflows/{run}/cancel"), None)
        .await;
    assert!(answer.status < 300, "{answer:?}");
    gone_within("cancelled", asked, margin, "after a cancel");

    // The run is timed out by its agent's timeout.attempt_ms.
    let run = launch(&mut api, &step("stubborn-timed", "timed")).await;
    pids.wait_for(&["timed"]);
    let started = Instant::now();
    gone_within(
        "timed",
        started,
        Duration::from_millis(1_000) + margin,
        "after its attempt timed out",
    );
    let record = wait_for(&mut api, &run, "failed").await.to_string();
    assert!(record.contains("timeout.attemptMs"), "{record}");

    // The node is killed by SIGKILL.
    launch(&mut api, &step("stubborn", "killed")).await;
    pids.wait_for(&["killed"]);
    let killed = Instant::now();
    node.signal(libc::SIGKILL);
    node.process
        .wait_exit(Duration::from_secs(60))
        .expect("the node dies");
    gone_within("killed", killed, margin, "after its node was killed");

    // The node is drained by SIGTERM.
    let mut node = Node::start(&db, &env);
    let mut api = node.api();
    let signed_in = api.login(ADMIN, PASSWORD).await;
    assert!(signed_in.status < 400, "{signed_in:?}");
    launch(&mut api, &step("stubborn", "drained")).await;
    pids.wait_for(&["drained"]);
    let drained = Instant::now();
    node.signal(libc::SIGTERM);
    node.process
        .wait_exit(Duration::from_secs(60))
        .expect("the node stops");
    gone_within("drained", drained, margin, "after its node drained");
}
