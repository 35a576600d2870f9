//! The command line a person uses against a running node, through the HTTP API like any other
//! client: `reins init` and `reins login` (which save an API token), `run`, `get`, `list`,
//! `inbox`, `resume`, `approve`, `reject`, `answer`, `cancel`, `recover`, `retry`, `delete`,
//! `artifact`, `watch`,
//! and user management (`users ...`, `password`, in [`users`]). Tables for people, `--json` for
//! scripts.
//!
//! Exit codes: 0 done; 1 the command failed (bad input, refused, unreachable); with `run --wait`
//! (and `retry --wait`),
//! 2 the workflow failed or was cancelled, 3 it waits for a person (paused, waiting for
//! approval, or a step's agent waits for an answer), 4 it needs reconciliation; `watch` ends
//! with the same codes when the workflow ends (0, 2) or needs reconciliation (4).

mod artifact;
mod cells;
mod client;
mod control;
mod credentials;
mod inbox;
mod launch;
mod list;
mod reconcile;
mod record;
mod users;
mod waits;
mod watch;

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::{Value, json};

use client::Client;
use credentials::Credentials;

/// Exit codes of `run --wait` beyond success and failure.
pub const EXIT_WORKFLOW_FAILED: u8 = 2;
pub const EXIT_WAITING_FOR_PERSON: u8 = 3;
pub const EXIT_NEEDS_RECONCILIATION: u8 = 4;

/// The wait each request of `--wait` asks the server for. The server answers as soon as the
/// workflow ends or waits for a person, or at its own `http.wait_max_ms`, after which the client
/// asks again: it never polls.
const WAIT_PER_REQUEST: &str = "10m";

/// Options every client command takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Common {
    /// The node's URL (default: the one saved by `reins login`).
    #[arg(long, global = true, env = "REINS_CLI_URL")]
    pub url: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Create the first admin on a new node and sign in as them.
    Init {
        #[arg(long)]
        email: String,
    },
    /// Sign in and save an API token for the next commands.
    Login {
        #[arg(long)]
        email: String,
    },
    /// Launch a workflow script.
    Run {
        /// The script (the body of an async JavaScript function).
        file: PathBuf,
        /// The script's `args`, as JSON.
        #[arg(long, default_value = "{}")]
        args: String,
        /// Idempotency key: the same request again gives the same workflow.
        #[arg(long)]
        request_id: Option<String>,
        /// What people call it: shown beside its run id in lists, the inbox and the console
        /// (at most `limits.title_chars_max` characters, one line).
        #[arg(long)]
        title: Option<String>,
        /// Its life limit: cancelled this many seconds after its launch (default: the
        /// server's `limits.timeout_seconds`, none unless set).
        #[arg(long)]
        timeout_seconds: Option<u64>,
        /// Wait until the workflow ends or waits for a person.
        #[arg(long)]
        wait: bool,
    },
    /// Show one workflow.
    Get {
        id: String,
        /// Wait until the workflow ends or waits for a person (exit codes as `run --wait`).
        #[arg(long)]
        wait: bool,
    },
    /// Print a workflow's events as they happen, until it ends.
    Watch { id: String },
    /// List workflows, newest first, a page at a time.
    List {
        /// A stored status, `recoverable`, or `waiting_for_input`.
        #[arg(long)]
        status: Option<String>,
        /// Only workflows with a call that waits for this: `sleep`, `event`, `person`, `slot`
        /// or `retry`.
        #[arg(long, value_name = "KIND")]
        waiting_for: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Start after this position (the `more:` line of the previous page).
        #[arg(long)]
        after: Option<String>,
    },
    /// What waits for you (an approver or admin: for anyone), oldest first, and the command
    /// that answers each.
    Inbox,
    /// Resolve the workflow's pause.
    Resume {
        id: String,
        /// The pause's step (default: the one it waits at).
        #[arg(long)]
        step: Option<String>,
        /// What the pause resolves to, as JSON.
        #[arg(long)]
        input: Option<String>,
    },
    /// Send an event to the workflow: its `waitForEvent` of this name takes it, now or later.
    Send {
        id: String,
        /// The event's name (what `waitForEvent` names).
        name: String,
        /// What the wait resolves to, as JSON, never null (default: {}).
        #[arg(long)]
        payload: Option<String>,
        /// Your id for this event: sending it again with the same id delivers it once.
        #[arg(long = "id")]
        event_id: String,
    },
    /// Approve the artifact a checkpoint waits on.
    Approve {
        id: String,
        #[arg(long)]
        step: Option<String>,
        #[arg(long)]
        comment: Option<String>,
    },
    /// Reject the artifact a checkpoint waits on.
    Reject {
        id: String,
        #[arg(long)]
        step: Option<String>,
        #[arg(long)]
        comment: Option<String>,
    },
    /// Answer what a step's agent asked to do (its pending approval request).
    Answer {
        id: String,
        /// The step whose agent asked.
        step: String,
        /// Let the agent do it.
        #[arg(long, group = "decision", required = true)]
        approve: bool,
        /// Refuse it.
        #[arg(long, group = "decision", required = true)]
        reject: bool,
        #[arg(long)]
        comment: Option<String>,
    },
    /// Cancel a workflow (durably; idempotent).
    Cancel { id: String },
    /// Take over a recoverable workflow on this node and replay it.
    Recover { id: String },
    /// Run a failed workflow again from its failed step: a new workflow that adopts the steps
    /// before it (prints the new workflow's id; a workflow retried before answers its retry).
    Retry {
        id: String,
        /// Idempotency key, as `run`'s.
        #[arg(long)]
        request_id: Option<String>,
        /// Wait until the new workflow ends or waits for a person (exit codes as `run --wait`).
        #[arg(long)]
        wait: bool,
    },
    /// Settle the uncertain step of a workflow that needs reconciliation (admins), after
    /// checking what its child run really did; `--all` settles every such workflow the same way.
    Reconcile {
        /// The workflow (not with `--all`).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        id: Option<String>,
        /// The uncertain step (default: the one the workflow's record names).
        #[arg(long, conflicts_with = "all")]
        step: Option<String>,
        /// Run the step again as a new attempt (its live runs are closed first).
        #[arg(long, group = "resolution")]
        retry: bool,
        /// Fail the step.
        #[arg(long, group = "resolution")]
        fail: bool,
        /// Complete the step with this output (JSON).
        #[arg(
            long,
            group = "resolution",
            value_name = "JSON",
            conflicts_with = "all"
        )]
        complete: Option<String>,
        /// Why: what the operator checked (kept in the step's record).
        #[arg(long)]
        reason: String,
        /// Every workflow that needs reconciliation.
        #[arg(long)]
        all: bool,
        /// List what would be done, and do nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete a finished workflow and everything it holds.
    Delete { id: String },
    /// Download an artifact version: to standard output (like curl) unless that is a
    /// terminal, or to a file.
    Artifact {
        id: String,
        version: i64,
        /// Where to write it (`-`: standard output, even a terminal).
        #[arg(short, long)]
        output: Option<PathBuf>,
    },
    /// Manage users (admins).
    Users {
        #[command(subcommand)]
        command: users::UsersCommand,
    },
    /// Change your own password (current, then new, from standard input); your other
    /// sessions end.
    Password,
}

/// Runs one client command; the number is the process's exit code.
pub async fn run(common: Common, command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Init { email } => sign_in(&common, &email, true).await,
        Command::Login { email } => sign_in(&common, &email, false).await,
        command => {
            let client = signed_in_client(&common).await?;
            run_signed_in(&common, &client, command).await
        }
    }
}

/// A client of `--url` (else the saved sign-in's node) with the saved token: also for another
/// node's URL, when that node says it belongs to the cluster signed in to.
async fn signed_in_client(common: &Common) -> anyhow::Result<Client> {
    let saved = Credentials::load()?;
    let url = common
        .url
        .clone()
        .or_else(|| saved.as_ref().map(|c| c.url.clone()))
        .context(
            "no server: pass --url, or sign in first with `reins login --url URL --email E`",
        )?;
    let Some(saved) = saved else {
        bail!("not signed in to {url}: run `reins login --url {url} --email E`");
    };
    if saved.url.trim_end_matches('/') == url.trim_end_matches('/') {
        return Ok(Client::new(&url, Some(saved.token)));
    }
    let cluster = cluster_of(&Client::new(&url, None)).await;
    match (&saved.cluster, cluster) {
        (Some(signed_in), Some(theirs)) if *signed_in == theirs => {
            Ok(Client::new(&url, Some(saved.token)))
        }
        _ => bail!(
            "not signed in to {url}, which is not of the cluster signed in to through {}: \
             run `reins login --url {url} --email E`",
            saved.url
        ),
    }
}

/// The cluster a node says it belongs to (`GET /health`), if it says.
async fn cluster_of(client: &Client) -> Option<String> {
    let health = client.json("GET", "/health", None).await.ok()?;
    health["cluster"].as_str().map(str::to_owned)
}

/// `init` and `login`: a session from the password, then an API token saved for later commands.
async fn sign_in(common: &Common, email: &str, first_admin: bool) -> anyhow::Result<u8> {
    let url = common
        .url
        .clone()
        .context("pass --url, for example --url http://127.0.0.1:7420")?;
    let password = read_password_from("REINS_CLI_PASSWORD", "password")?;
    let client = Client::new(&url, None);
    let answer = open_session(&client, email, &password, first_admin).await?;
    client::checked(&answer)?;
    let token = create_token(&client, &answer).await?;
    let path = Credentials {
        url: client.base().to_owned(),
        email: email.to_owned(),
        token,
        cluster: cluster_of(&client).await,
    }
    .save()?;
    if common.json {
        println!(
            "{}",
            json!({"url": client.base(), "email": email, "credentials": path})
        );
    } else {
        println!(
            "signed in to {} as {email}; token saved in {}",
            client.base(),
            path.display()
        );
    }
    Ok(0)
}

/// The answer that opens a session: `init` creates the first admin, `login` signs in with the
/// password.
async fn open_session(
    client: &Client,
    email: &str,
    password: &str,
    first_admin: bool,
) -> anyhow::Result<client::Answer> {
    if first_admin {
        let body = json!({"email": email, "password": password}).to_string();
        return Ok(client
            .send(
                "POST",
                "/api/v1/auth/initialize",
                Some("application/json"),
                body.into_bytes(),
            )
            .await?);
    }
    let form: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("username", email)
        .append_pair("password", password)
        .finish();
    Ok(client
        .send(
            "POST",
            "/api/v1/auth/login/local",
            Some("application/x-www-form-urlencoded"),
            form.into_bytes(),
        )
        .await?)
}

/// An API token named for this machine, created with the session `session` set (its cookies,
/// and its CSRF token echoed in a header).
async fn create_token(client: &Client, session: &client::Answer) -> anyhow::Result<String> {
    let cookies: Vec<String> = session
        .headers
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .map(str::to_owned)
        .collect();
    let csrf = cookies
        .iter()
        .find_map(|c| c.strip_prefix("csrf_token="))
        .context("the server set no csrf_token cookie")?
        .to_owned();
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "this machine".into());
    let body = json!({"name": format!("reins cli on {host}")}).to_string();
    let cookie = cookies.join("; ");
    let created = client
        .send_with_csrf("/api/v1/auth/tokens", body, &cookie, &csrf)
        .await?;
    client::checked(&created)?;
    let created: Value = serde_json::from_slice(&created.body).context("token reply")?;
    let token = created["token"].as_str().context("no token in the reply")?;
    Ok(token.to_owned())
}

/// A password from the environment variable `variable`, or else a line of standard input
/// (prompted with `what` on a terminal).
fn read_password_from(variable: &str, what: &str) -> anyhow::Result<String> {
    if let Ok(password) = std::env::var(variable) {
        return Ok(password);
    }
    if std::io::stdin().is_terminal() {
        eprint!("{what}: ");
        let _ = std::io::stderr().flush();
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .with_context(|| format!("cannot read the {what} from standard input"))?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    if password.is_empty() {
        bail!("no {what} given (standard input, or {variable})");
    }
    Ok(password)
}

/// Runs a command that needs the saved sign-in: one function per command.
async fn run_signed_in(common: &Common, client: &Client, command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Init { .. } | Command::Login { .. } => unreachable!("handled before"),
        Command::Users { command } => users::run(common, client, command).await,
        Command::Password => users::change_own_password(common, client).await,
        Command::Run {
            file,
            args,
            request_id,
            title,
            timeout_seconds,
            wait,
        } => {
            let launch = launch::Launch {
                file,
                args,
                request_id,
                title,
                timeout_seconds,
            };
            launch::run_script(common, client, launch, wait).await
        }
        Command::Get { id, wait } => show_workflow(common, client, &id, wait).await,
        Command::Watch { id } => watch::watch(client, &id, common.json).await,
        Command::Inbox => inbox::inbox(common, client).await,
        Command::List {
            status,
            waiting_for,
            limit,
            after,
        } => list::list(common, client, status, waiting_for, limit, after).await,
        Command::Resume { id, step, input } => {
            control::resume(common, client, &id, step, input).await
        }
        Command::Send {
            id,
            name,
            payload,
            event_id,
        } => control::send_event(common, client, &id, &name, payload, &event_id).await,
        Command::Approve { id, step, comment } => {
            control::decide(common, client, &id, step, comment, "approve").await
        }
        Command::Reject { id, step, comment } => {
            control::decide(common, client, &id, step, comment, "reject").await
        }
        Command::Answer {
            id,
            step,
            approve,
            reject: _,
            comment,
        } => control::answer(common, client, &id, &step, approve, comment).await,
        Command::Cancel { id } => control::post(common, client, &id, "cancel", &json!({})).await,
        Command::Recover { id } => control::post(common, client, &id, "recover", &json!({})).await,
        Command::Retry {
            id,
            request_id,
            wait,
        } => launch::retry(common, client, &id, request_id, wait).await,
        Command::Reconcile {
            id,
            step,
            retry,
            fail,
            complete,
            reason,
            // `--all` is the absence of an id (clap makes them exclusive).
            all: _,
            dry_run,
        } => {
            let resolution = reconcile::resolution(retry, fail, complete.as_deref())?;
            let step = step.as_deref();
            reconcile::reconcile(common, client, id, step, &resolution, &reason, dry_run).await
        }
        Command::Delete { id } => control::delete(common, client, &id).await,
        Command::Artifact {
            id,
            version,
            output,
        } => artifact::download(common, client, &id, version, output).await,
    }
}

/// `reins get`: the whole record, or with `--wait` the record once the workflow ends or waits
/// for a person (exit codes as `run --wait`).
async fn show_workflow(
    common: &Common,
    client: &Client,
    id: &str,
    wait: bool,
) -> anyhow::Result<u8> {
    if wait {
        let record = get_waiting(client, id).await?;
        return wait_for_rest(common, client, id, record).await;
    }
    let record = whole(client, id, get(client, id).await?).await?;
    show_record(common, client, &record).await;
    Ok(0)
}

/// A workflow's record (its first page of steps and artifact versions).
async fn get(client: &Client, id: &str) -> anyhow::Result<Value> {
    Ok(client
        .json("GET", &format!("/api/v1/workflows/{}", encode(id)), None)
        .await?)
}

/// `record` with every step and artifact version: the server answers a record with the first
/// page of each, and `steps_next` and `artifacts_next` lead to the next; each page that follows
/// is appended, until a page says there is no more.
async fn whole(client: &Client, id: &str, mut record: Value) -> anyhow::Result<Value> {
    let mut after = record["steps_next"].as_str().map(str::to_owned);
    while let Some(cursor) = after {
        let path = format!(
            "/api/v1/workflows/{}/steps?after={}",
            encode(id),
            encode(&cursor)
        );
        let page = client.json("GET", &path, None).await?;
        extend(&mut record["steps"], &page["steps"]);
        after = page["next"].as_str().map(str::to_owned);
    }
    let mut after = record["artifacts_next"].as_i64();
    while let Some(version) = after {
        let path = format!("/api/v1/workflows/{}/artifacts?after={version}", encode(id));
        let page = client.json("GET", &path, None).await?;
        extend(&mut record["artifacts"], &page["artifacts"]);
        after = page["next"].as_i64();
    }
    record["steps_next"] = Value::Null;
    record["artifacts_next"] = Value::Null;
    Ok(record)
}

/// Appends the items of the array `more` to the array `list`.
fn extend(list: &mut Value, more: &Value) {
    if let (Some(list), Some(more)) = (list.as_array_mut(), more.as_array()) {
        list.extend(more.iter().cloned());
    }
}

/// The record once the workflow ends or waits for a person, or as it is when the server's wait
/// ran out.
async fn get_waiting(client: &Client, id: &str) -> anyhow::Result<Value> {
    let path = format!("/api/v1/workflows/{}?wait={WAIT_PER_REQUEST}", encode(id));
    Ok(client.json("GET", &path, None).await?)
}

/// `run --wait`, `get --wait`: asks the server to wait (`?wait=`) until the workflow ends or
/// waits for a person, again whenever the server's wait runs out first, with a progress line.
async fn wait_for_rest(
    common: &Common,
    client: &Client,
    run_id: &str,
    mut record: Value,
) -> anyhow::Result<u8> {
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal() && !common.json;
    let mut last_status = String::new();
    loop {
        // A step that waits for an answer may be on any page of the record.
        record = whole(client, run_id, record).await?;
        let status = text(&record["status"]);
        let code = match status.as_str() {
            "completed" => Some(0),
            "failed" | "cancelled" => Some(EXIT_WORKFLOW_FAILED),
            "paused" | "waiting_approval" | "waiting_for_input" => Some(EXIT_WAITING_FOR_PERSON),
            "needs_reconciliation" => Some(EXIT_NEEDS_RECONCILIATION),
            _ if agent_waits(&record) => Some(EXIT_WAITING_FOR_PERSON),
            _ => None,
        };
        if terminal {
            let steps = record["steps"].as_array().map_or(0, Vec::len);
            eprint!(
                "\r{run_id} {status}, {steps} steps, {:.1}s   ",
                started.elapsed().as_secs_f64()
            );
        } else if status != last_status && !common.json {
            eprintln!("{run_id}: {status}");
        }
        last_status = status;
        if let Some(code) = code {
            if terminal {
                eprintln!();
            }
            show_record(common, client, &record).await;
            return Ok(code);
        }
        record = get_waiting(client, run_id).await?;
    }
}

/// Whether a step's agent waits for a person's answer to its approval request.
fn agent_waits(record: &Value) -> bool {
    record["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["status"] == "waiting_for_input")
}

fn print_value(common: &Common, value: &Value, human: impl FnOnce()) {
    if common.json {
        println!("{value}");
    } else {
        human();
    }
}

/// A record as `--json` or as text, its owner named by email where the caller may.
async fn show_record(common: &Common, client: &Client, record: &Value) {
    let names = if common.json {
        Default::default()
    } else {
        cells::owner_names(client).await
    };
    print_value(common, record, || record::print_record(record, &names));
}

/// A table's rows: `row` of each item of the array `list` (none when it is not an array).
fn rows(list: &Value, row: impl Fn(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    list.as_array().into_iter().flatten().map(row).collect()
}

pub(crate) fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn encode(segment: &str) -> String {
    form_urlencoded::byte_serialize(segment.as_bytes()).collect()
}

/// Epoch seconds as RFC 3339 in UTC, to the second (`-` for none).
fn format_time(value: &Value) -> String {
    value
        .as_f64()
        .map_or_else(|| "-".to_owned(), store::rfc3339_utc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_print_as_utc_dates() {
        assert_eq!(format_time(&json!(0.0)), "1970-01-01T00:00:00Z");
        assert_eq!(format_time(&json!(1_796_003_447.5)), "2026-11-30T01:50:47Z");
        assert_eq!(format_time(&Value::Null), "-");
    }
}
