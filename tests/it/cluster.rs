//! Two real nodes on one PostgreSQL behind a real nginx that balances round robin with no
//! affinity: a session made through one node works through the other, and a workflow launched
//! on one is read, resumed and cancelled through whichever node the balancer picks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::harness::free_port;
use crate::http_api::{Db, Node, initialize, wait_for};

/// A private nginx in a temporary folder, stopped on drop.
struct Nginx {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers (after SIGKILL they would live on, orphaned).
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on a pid this test started and has not reaped.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn nginx_binary() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .expect("nginx is not installed: run the suite with tests/run-all.sh, which installs it")
}

impl Nginx {
    fn balancing(upstreams: &[SocketAddr]) -> Nginx {
        let dir = tempfile::tempdir().expect("temp dir");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let servers: String = upstreams.iter().map(|u| format!("server {u}; ")).collect();
        let root = dir.path().display();
        let config = format!(
            "daemon off; worker_processes 1; pid {root}/nginx.pid; error_log {root}/error.log;
             events {{}}
             http {{
               access_log off;
               client_body_temp_path {root}/body; proxy_temp_path {root}/proxy;
               fastcgi_temp_path {root}/fastcgi; uwsgi_temp_path {root}/uwsgi;
               scgi_temp_path {root}/scgi;
               upstream nodes {{ {servers} }}
               server {{
                 listen {addr};
                 location / {{
                   proxy_pass http://nodes;
                   proxy_set_header Host $http_host;
                   proxy_buffering off;
                   add_header X-Upstream $upstream_addr always;
                 }}
               }}
             }}"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, config).expect("nginx.conf");
        let child = Command::new(nginx_binary())
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let nginx = Nginx {
            child,
            addr,
            _dir: dir,
        };
        nginx.wait_listening();
        nginx
    }

    fn wait_listening(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(self.addr).is_err() {
            let log = self._dir.path().join("error.log");
            assert!(
                std::time::Instant::now() < deadline,
                "nginx did not listen: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The upstream port that answered (nginx lists every attempt; the last one answered).
fn upstream(headers: &hyper::HeaderMap) -> u16 {
    let value = headers["x-upstream"].to_str().expect("text");
    let last = value.rsplit(',').next().expect("an upstream").trim();
    last.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_nodes_behind_nginx_share_sessions_and_control_workflows_without_affinity() {
    let db = Db::new(true).await;
    let a = Node::start(&db, &[]);
    let b = Node::start(&db, &[]);
    let proxy = Nginx::balancing(&[a.addr, b.addr]);
    let ports = [a.addr.port(), b.addr.port()];

    // Sign in on node a directly; the session then travels through the balancer.
    let signed_in = initialize(&a).await;
    let mut api = crate::http_client::Api::new(proxy.addr);
    api.cookies = signed_in.cookies.clone();

    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let answer = api.call("GET", "/api/plugins", None).await;
        assert_eq!(answer.status, 200);
        seen.insert(upstream(&answer.headers));
    }
    assert_eq!(
        seen,
        ports.into_iter().collect(),
        "round robin reaches both nodes"
    );

    let script = "await pause({stepId: 'p'}); return await agent({stepId: 'child', agentRef: 'scripted', task: 'hello'});";
    let launched = api
        .action(
            "launch",
            json!({"request_id": "via-proxy", "script": script}),
        )
        .await;
    assert_eq!(launched.status, 200, "{launched:?}");
    let run = launched.json()["run_id"]
        .as_str()
        .expect("run_id")
        .to_owned();
    let mut served_by = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let answer = api.action("get", json!({"run_id": run})).await;
        assert_eq!(
            (answer.status, answer.json()["run_id"].clone()),
            (200, json!(run))
        );
        served_by.insert(upstream(&answer.headers));
    }
    assert_eq!(
        served_by,
        ports.into_iter().collect(),
        "both nodes serve the workflow"
    );

    let paused = wait_for(&mut api, &run, "paused").await;
    let resumed = api
        .action("resume", json!({"run_id": run, "fingerprint": paused["fingerprint"], "step_id": "p", "attempt": 1}))
        .await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    let done = wait_for(&mut api, &run, "completed").await;
    assert_eq!(done["result"]["output"], json!({"echo": "hello"}));
    assert_eq!(done["steps"].as_array().map(Vec::len), Some(1));
    assert!(done["steps"][0]["configuration_version"].is_string());

    let second = api
        .action(
            "launch",
            json!({"script": "await pause({stepId: 'p'}); return 1;"}),
        )
        .await;
    let second = second.json()["run_id"].as_str().expect("run_id").to_owned();
    wait_for(&mut api, &second, "paused").await;
    let cancelled = api.action("cancel", json!({"run_id": second})).await;
    assert_eq!(cancelled.status, 200, "{cancelled:?}");
    wait_for(&mut api, &second, "cancelled").await;
    let runs = db
        .sql(&format!(
            "SELECT count(*) FROM runs WHERE workflow = '{run}'"
        ))
        .await;
    assert_eq!(
        runs.as_deref(),
        Some("1"),
        "one child run for the one agent step"
    );
}
