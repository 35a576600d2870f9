//! A small W3C WebDriver client for the console's tests: Debian's `chromedriver` started by the
//! test on a loopback port, driving a headless `chromium` of its own profile, over plain
//! HTTP/1.1 and JSON (one connection per command). Missing browser packages fail the test with a
//! message that says what to install; nothing is skipped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::harness::free_port;

/// The key of an element reference in WebDriver answers.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long a command may take before the test gives up on the driver.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// Finds a program on `PATH` or in the usual Debian places.
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(["/usr/bin", "/usr/lib/chromium"])
        .map(|dir| Path::new(dir).join(name))
        .find(|candidate| candidate.is_file())
}

/// A chromedriver process and one browser session on it; both end when this is dropped.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: String,
    /// The browser's profile folder.
    _profile: TempDir,
    /// Where screenshots go.
    pub shots: PathBuf,
}

impl Browser {
    /// Starts chromedriver and a headless chromium with a `width`×`height` window; screenshots
    /// go to `target/test-output/console/<test>/`.
    pub fn start(test: &str, width: u32, height: u32) -> Browser {
        let missing = "the console's tests need Debian's `chromium` and `chromium-driver` \
                       (tests/run-all.sh installs them: apt-get install chromium chromium-driver)";
        let chromium = program("chromium").unwrap_or_else(|| panic!("no chromium: {missing}"));
        let chromedriver =
            program("chromedriver").unwrap_or_else(|| panic!("no chromedriver: {missing}"));
        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("chromedriver did not start ({e}): {missing}"));
        let profile = tempfile::tempdir().expect("profile dir");
        let shots = shots_dir(test);
        let mut browser = Browser {
            driver,
            addr,
            session: String::new(),
            _profile: profile,
            shots,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while browser.raw("GET", "/status", None).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not answer on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut args = vec![
            "--headless=new".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--no-first-run".to_owned(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", browser._profile.path().display()),
        ];
        // Chromium's sandbox refuses to run as root (CI containers).
        // SAFETY: geteuid(2) has no preconditions and touches no memory.
        if unsafe { libc::geteuid() } == 0 {
            args.push("--no-sandbox".to_owned());
        }
        let created = browser
            .raw(
                "POST",
                "/session",
                Some(json!({"capabilities": {"alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": chromium, "args": args},
                }}})),
            )
            .unwrap_or_else(|e| panic!("no browser session: {e}"));
        browser.session = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session id in {created}"))
            .to_owned();
        browser
    }

    /// One command; a WebDriver error is an `Err` with its message.
    fn raw(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let mut stream = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))
            .map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(COMMAND_TIMEOUT))
            .map_err(|e| e.to_string())?;
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .map_err(|e| e.to_string())?;
        // chromedriver keeps the connection open whatever the request says: read the head,
        // then exactly the body its length (or its chunks) announce.
        let mut response = Vec::new();
        let mut chunk = [0u8; 16 * 1024];
        let split = loop {
            if let Some(split) = response.windows(4).position(|w| w == b"\r\n\r\n") {
                break split;
            }
            let read = stream.read(&mut chunk).map_err(|e| e.to_string())?;
            if read == 0 {
                return Err(format!(
                    "not HTTP: {:?}",
                    String::from_utf8_lossy(&response)
                ));
            }
            response.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
        let mut raw_body = response.split_off(split + 4);
        let length = head.lines().find_map(|line| {
            let (name, value) = line.split_once(':')?;
            (name.trim() == "content-length")
                .then(|| value.trim().parse::<usize>().ok())
                .flatten()
        });
        let chunked = head.contains("transfer-encoding: chunked")
            || head.contains("transfer-encoding:chunked");
        loop {
            let complete = match length {
                Some(length) => raw_body.len() >= length,
                None if chunked => raw_body.ends_with(b"0\r\n\r\n"),
                None => false,
            };
            if complete {
                break;
            }
            let read = stream.read(&mut chunk).map_err(|e| e.to_string())?;
            if read == 0 {
                break;
            }
            raw_body.extend_from_slice(&chunk[..read]);
        }
        let body = if chunked {
            dechunk(&raw_body)
        } else {
            raw_body
        };
        let body = String::from_utf8_lossy(&body);
        let value: Value =
            serde_json::from_str(&body).map_err(|e| format!("not JSON ({e}): {body:?}"))?;
        let value = value["value"].clone();
        if let Some(error) = value.get("error").and_then(Value::as_str) {
            return Err(format!(
                "{error}: {}",
                value["message"].as_str().unwrap_or_default()
            ));
        }
        Ok(value)
    }

    /// One command of this session; panics on a WebDriver error.
    fn command(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.raw(method, &path, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn goto(&self, url: &str) {
        self.command("POST", "/url", Some(json!({"url": url})));
    }

    pub fn title(&self) -> String {
        self.command("GET", "/title", None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs `script` (a function body; `arguments` are `args`) in the page and answers its
    /// return value.
    pub fn run(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
    }

    /// Runs `script` whose last argument is the callback to call with the result.
    pub fn run_async(&self, script: &str, args: Value) -> Value {
        self.command(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": args})),
        )
    }

    /// The elements `css` selects right now.
    pub fn all(&self, css: &str) -> Vec<Element<'_>> {
        let found = self.command(
            "POST",
            "/elements",
            Some(json!({"using": "css selector", "value": css})),
        );
        found
            .as_array()
            .map(|elements| {
                elements
                    .iter()
                    .filter_map(|e| e[ELEMENT_KEY].as_str())
                    .map(|id| Element {
                        browser: self,
                        id: id.to_owned(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Waits up to `within` for an element `css` selects, and answers the first.
    pub fn find(&self, css: &str, within: Duration) -> Element<'_> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(element) = self.all(css).into_iter().next() {
                return element;
            }
            assert!(
                Instant::now() < deadline,
                "nothing matched {css:?} within {within:?}; the page shows: {}",
                self.page_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `within` for an element `css` selects and clicks it. The page re-renders on
    /// live updates, so an element found may be replaced before the click lands: a stale one is
    /// found again.
    pub fn click_on(&self, css: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let element = self.find(css, within);
            let path = format!("/session/{}/element/{}/click", self.session, element.id);
            match self.raw("POST", &path, Some(json!({}))) {
                Ok(_) => return,
                Err(error) if error.starts_with("stale element reference") => {
                    assert!(
                        Instant::now() < deadline,
                        "{css:?} kept going stale: {error}"
                    );
                }
                Err(error) => panic!("POST {path}: {error}"),
            }
        }
    }

    /// Waits up to `within` for `condition` (a script answering a boolean) to hold.
    pub fn wait_until(&self, what: &str, condition: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.run(condition, json!([])) == Value::Bool(true) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what} did not happen within {within:?}; the page shows: {}",
                self.page_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits up to `within` until the page's text contains `text`.
    pub fn wait_for_text(&self, text: &str, within: Duration) {
        let deadline = Instant::now() + within;
        while !self.page_text().contains(text) {
            assert!(
                Instant::now() < deadline,
                "the page never showed {text:?} within {within:?}; it shows: {}",
                self.page_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Everything the page shows as text.
    pub fn page_text(&self) -> String {
        self.run("return document.body.innerText;", json!([]))
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Saves a PNG of the viewport as `<name>.png` in this test's output folder; answers its path.
    pub fn screenshot(&self, name: &str) -> PathBuf {
        let data = self.command("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or_default())
            .expect("screenshot is base64");
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// Types `keys` on the keyboard into whatever has the focus (`\u{E004}` is Tab, `\u{E007}`
    /// Enter).
    pub fn keys(&self, keys: &str) {
        let actions: Vec<Value> = keys
            .chars()
            .flat_map(|c| {
                let key = c.to_string();
                [
                    json!({"type": "keyDown", "value": key}),
                    json!({"type": "keyUp", "value": key}),
                ]
            })
            .collect();
        self.command(
            "POST",
            "/actions",
            Some(json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]})),
        );
    }

    /// Resizes the window (for the phone-sized screenshots).
    pub fn resize(&self, width: u32, height: u32) {
        self.command(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        );
    }

    /// Opens a new tab and answers its handle (the current tab stays current).
    pub fn new_tab(&self) -> String {
        self.command("POST", "/window/new", Some(json!({"type": "tab"})))["handle"]
            .as_str()
            .expect("window handle")
            .to_owned()
    }

    pub fn current_tab(&self) -> String {
        self.command("GET", "/window", None)
            .as_str()
            .expect("window handle")
            .to_owned()
    }

    pub fn switch_to(&self, handle: &str) {
        self.command("POST", "/window", Some(json!({"handle": handle})));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.raw("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// One element of the page.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Element<'_> {
    /// Types `text` into the element (after what it holds).
    pub fn type_text(&self, text: &str) {
        self.browser.command(
            "POST",
            &format!("/element/{}/value", self.id),
            Some(json!({"text": text})),
        );
    }

    pub fn clear(&self) {
        self.browser.command(
            "POST",
            &format!("/element/{}/clear", self.id),
            Some(json!({})),
        );
    }

    pub fn text(&self) -> String {
        self.browser
            .command("GET", &format!("/element/{}/text", self.id), None)
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

/// `target/test-output/console/<test>/`, made empty.
fn shots_dir(test: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/it-<hash> -> target/test-output
    let target = exe
        .ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .expect("target folder");
    let dir = target.join("test-output").join("console").join(test);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    dir
}

/// The body of a chunked reply.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let after = &rest[end + 2..];
        match size {
            Some(size) if size > 0 && after.len() >= size => {
                out.extend_from_slice(&after[..size]);
                rest = after[size..]
                    .strip_prefix(b"\r\n")
                    .unwrap_or(&after[size..]);
            }
            _ => break,
        }
    }
    out
}
