//! What the benches of the real binary share: a `reins serve` process on loopback, one HTTP
//! request, and an API token. Included by `http.rs` and `soak.rs` as `mod server`.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};

pub type Http = Client<HttpConnector, Full<Bytes>>;

/// A `reins serve` process, killed when dropped.
pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Server {
    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the release binary on a free loopback port, on SQLite in a temporary folder unless
/// `database` names one.
pub fn start(database: Option<String>) -> Server {
    start_with(database, &[])
}

/// [`start`] with more configuration (`REINS_*` variables).
pub fn start_with(database: Option<String>, extra: &[(&str, &str)]) -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let mut command = Command::new(env!("CARGO_BIN_EXE_reins"));
    command
        .arg("serve")
        .current_dir(dir.path())
        .env_clear()
        .env("REINS_LISTEN", addr.to_string())
        .env("REINS_SECRET", "bench-secret-0123456789abcdefghijklmnop")
        .env("REINS_LIMITS__MAX_WORKFLOWS", "100000000")
        .env("REINS_LIMITS__MAX_WORKFLOWS_PER_OWNER", "100000000")
        .env("REINS_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(database) = database {
        command.env("REINS_DATABASE", database);
    }
    for (key, value) in extra {
        command.env(key, value);
    }
    let child = command.spawn().expect("start reins");
    Server {
        child,
        addr,
        _dir: dir,
    }
}

/// One request; its status and body.
pub async fn send(
    http: &Http,
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Bytes) {
    let mut request = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let bytes = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            Bytes::from(body.to_string())
        }
        None => Bytes::new(),
    };
    let response = http
        .request(request.body(Full::new(bytes)).expect("request"))
        .await
        .expect("HTTP request");
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, body)
}

/// Waits until `/health/ready` answers 200 (at most a minute).
pub async fn wait_ready(http: &Http, addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let request = Request::get(format!("http://{addr}/health/ready"))
            .body(Full::new(Bytes::new()))
            .expect("request");
        if let Ok(response) = http.request(request).await
            && response.status() == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "the node did not get ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Signs in as a new admin and returns an API token.
pub async fn token(http: &Http, addr: SocketAddr) -> String {
    let body = json!({"email": "bench@example.com", "password": "bench password"});
    let request = Request::post(format!("http://{addr}/api/v1/auth/initialize"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let response = http.request(request).await.expect("initialize");
    let cookies: Vec<String> = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok()?.split(';').next().map(str::to_owned))
        .collect();
    let csrf = cookies
        .iter()
        .find_map(|c| c.strip_prefix("csrf_token="))
        .expect("csrf cookie")
        .to_owned();
    let request = Request::post(format!("http://{addr}/api/v1/auth/tokens"))
        .header("content-type", "application/json")
        .header("cookie", cookies.join("; "))
        .header("x-csrf-token", csrf)
        .body(Full::new(Bytes::from(json!({"name": "bench"}).to_string())))
        .expect("request");
    let response = http.request(request).await.expect("token");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let body: Value = serde_json::from_slice(&body).expect("json");
    body["token"].as_str().expect("token").to_owned()
}
