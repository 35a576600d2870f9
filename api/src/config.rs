//! The node's configuration: one TOML file plus `REINS_*` environment overrides, checked in full
//! before anything touches the disk or the network. Every error names the key (and, for the file,
//! the line) it is about.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

mod notify;

use actors::agents::{AgentConfig, AgentRegistry, ConfinementMode};
pub use notify::{FormatConfig, NotificationsConfig, NotifyConfig};
use serde::{Deserialize, Serialize};
use store::{DatabaseUrl, StoreOptions};

/// The port `reins serve` listens on when nothing else is configured.
pub const DEFAULT_PORT: u16 = 7420;

/// Environment variables that start with `REINS_` but are not configuration keys.
const NOT_CONFIG: &[&str] = &["REINS_CONFIG", "REINS_FAULT_DIR", "REINS_LOG"];
/// Prefixes of variables that belong to the test and bench harnesses, never to a node,
/// and of the command-line client (`REINS_CLI_*`).
const HARNESS_PREFIXES: &[&str] = &["REINS_TEST_", "REINS_BENCH_", "REINS_CLI_"];

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read config file {path:?}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path:?}{line}: {message}")]
    File {
        path: PathBuf,
        line: String,
        message: String,
    },
    #[error("environment override {variable}: {message}")]
    Environment { variable: String, message: String },
    #[error("config key `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
}

/// The fallback period of the change bus's wake-ups by default, and its bounds: below a second
/// the fallback would be polling again; above a day it would not be a fallback.
const WAKE_FALLBACK_MS_DEFAULT: u64 = 1000;
const WAKE_FALLBACK_MS_MIN: u64 = 1000;
const WAKE_FALLBACK_MS_MAX: u64 = 86_400_000;

/// How long a parked workflow waits before it goes dormant by default, and its bounds (0: never).
/// Under 100 ms a workflow that waits a moment between two steps would be taken over and
/// replayed for nothing; over a day it would hold its supervisor and lease for a day.
const DORMANT_AFTER_MS_DEFAULT: u64 = 30_000;
const DORMANT_AFTER_MS_MIN: u64 = 100;
const DORMANT_AFTER_MS_MAX: u64 = 86_400_000;

/// The most PostgreSQL batch writers a node starts (each is a task that may hold a pooled
/// connection) and the most writes one batch carries (its statements go out in one pipeline).
const PG_WRITERS_MAX: usize = 256;
const PG_BATCH_MAX_MAX: usize = 1024;

/// The bounds of the PostgreSQL connections' TCP timeouts. Below a second of unacknowledged data a
/// congested but live link would lose its connections; past ten minutes the timeout would no
/// longer bring a node back soon after a partition heals. The kernel counts keepalive times in
/// whole seconds, from one second to two hours of idleness (its own default) and up to ten
/// minutes between probes.
const PG_TCP_USER_TIMEOUT_MS_MIN: u64 = 1_000;
const PG_TCP_USER_TIMEOUT_MS_MAX: u64 = 600_000;
const PG_KEEPALIVES_IDLE_SECONDS_MAX: u64 = 7_200;
const PG_KEEPALIVES_INTERVAL_SECONDS_MAX: u64 = 600;

/// The whole configuration of a node.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the HTTP control plane listens on.
    pub listen: String,
    /// `sqlite:PATH` (embedded, single node) or a `postgres://` URL (cluster); unset, the
    /// embedded database in `<data_dir>/reins.db`.
    pub database: Option<String>,
    /// Folder for the node's own files: the embedded database, the secret, thread workspaces
    /// and the admin socket unless they are configured elsewhere.
    pub data_dir: PathBuf,
    /// How long a workflow lease lasts without renewal; renewed every third of it.
    pub lease_seconds: u64,
    /// `manual` or `automatic` recovery of workflows whose owner died.
    pub recovery: Recovery,
    /// Controls, freed slots and answered approvals wake the node that waits for them through
    /// the change bus; this is the slow fallback period after which it looks anyway, should a
    /// cue have been lost (1,000 to 86,400,000).
    pub wake_fallback_ms: u64,
    /// How long a workflow that only waits (a sleep, a pause, a checkpoint, an event, a retry's
    /// backoff) stays on its node before it goes dormant: its supervisor stops, its lease is
    /// no longer renewed, and the store alone holds it until a control, an event or its
    /// earliest due time (less as much again, to be loaded on time) wakes it on any node (0:
    /// never; otherwise 100 to 86,400,000).
    pub dormant_after_ms: u64,
    /// `text` (default) or `json` log lines.
    pub log_format: LogFormat,
    /// Thread workspaces (default `<data_dir>/workspaces`). A cluster needs one shared folder.
    pub workspaces_dir: Option<PathBuf>,
    /// The admin socket (default `<data_dir>/admin.sock`); one per node.
    pub admin_socket: Option<PathBuf>,
    /// The agents child runs can use, each with a `name` and a `kind`.
    pub agents: Vec<AgentConfig>,
    /// How `command` agents are confined: `landlock` (default: to their workspace and the
    /// system's files; a node whose kernel cannot refuses to start with `command` agents) or
    /// `none` (they can read and write everything the node's user can, the node's own files
    /// included). See `actors::agents::confinement`.
    pub agent_confinement: ConfinementMode,
    /// Signs session cookies; every node of a cluster needs the same one (`reins keygen` prints
    /// a new one). Unset on the embedded default: generated once into `<data_dir>/secret`.
    pub secret: Option<String>,
    pub limits: Limits,
    pub store: StoreConfig,
    pub shutdown: ShutdownConfig,
    pub http: HttpConfig,
    pub auth: AuthConfig,
    pub events: EventsConfig,
    /// Webhooks told when an item enters a person's inbox or leaves it (`[[notify]]`).
    pub notify: Vec<NotifyConfig>,
    pub notifications: NotificationsConfig,
}

/// Event streams: `GET /api/v1/workflows/{id}/events` and `GET /api/v1/events`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// How often a stream reads its events again when nothing woke it: the fallback for commits
    /// this node does not hear of (those of other nodes, until a change bus tells it).
    pub poll_ms: u64,
    /// How often a stream sends a keep-alive comment.
    pub keepalive_ms: u64,
    /// Events one read of a stream fetches at most.
    pub batch_max: u32,
    /// Bytes of events a stream holds for its client at most; past it the stream waits for
    /// the client to read.
    pub stream_buffer_bytes_max: u64,
    /// How long a stream waits for a client that reads nothing while its buffer is full before
    /// it disconnects it.
    pub stream_stall_ms: u64,
    /// Streams open at once on a node at most (503 `streams_busy` beyond).
    pub streams_max: u32,
    /// Event streams one user holds open at once on a node at most (429 `streams_busy`).
    pub streams_per_user_max: u32,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            poll_ms: 1000,
            keepalive_ms: 15_000,
            batch_max: 100,
            stream_buffer_bytes_max: 256 * 1024,
            stream_stall_ms: 10_000,
            streams_max: 1024,
            streams_per_user_max: 64,
        }
    }
}

/// Limits of the HTTP control plane.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// A request body's bytes at most (413 beyond).
    pub body_bytes_max: u64,
    /// A request head's bytes at most (request line and headers; 431 beyond).
    pub head_bytes_max: u64,
    /// Workflows per page of a listing at most (also the rows of the admin nodes and slots
    /// lists).
    pub page_size_max: u32,
    /// Workflows the inbox reads at most (one snapshot each); more waiting is shown as `more`.
    pub inbox_workflows_max: u32,
    /// How long `cancel` waits for the workflow to settle before it answers with what it sees.
    pub cancel_wait_ms: u64,
    /// The longest a `?wait=` (or `wait_ms`) request waits for a workflow to end or wait for a
    /// person; a longer wait asked for is cut to this.
    pub wait_max_ms: u64,
    /// Requests waiting (`?wait=`) at once on this node at most; one more is answered 503 with
    /// `Retry-After`. Never more than three quarters of `connections_max`, whatever this says:
    /// the last quarter stays for health checks, sign-in and short requests.
    pub waiters_max: u64,
    /// Requests of one user waiting at once on this node at most (429 `waiters_busy`).
    pub waiters_per_user_max: u64,
    /// Workflow records (`get`, each read of a waiting `get`, each of the inbox's) one user
    /// reads at once on this node at most; more wait their turn.
    pub record_reads_per_user_max: u64,
    /// How long a record read waits for one of its user's places before it is answered 429
    /// `reads_busy`.
    pub record_read_wait_ms: u64,
    /// Steps one page of a workflow's record holds at most (`get`, and each page of
    /// `GET /api/v1/workflows/{id}/steps`): a read holds a page, never the whole journal.
    pub record_steps_page_max: u32,
    /// Artifact versions (without their bytes) one page of a workflow's record holds at most
    /// (`get`, and each page of `GET /api/v1/workflows/{id}/artifacts`).
    pub record_artifacts_page_max: u32,
    /// How long a connection may take to send a request's head, counted from when it opens or
    /// finishes its previous request (so also how long an idle keep-alive connection stays).
    pub head_timeout_ms: u64,
    /// How long a request's body may take to arrive in full (408 and the connection closed).
    pub body_timeout_ms: u64,
    /// Connections open at once at most. One more closes the oldest that is not running a
    /// request (or is refused when all are); lowered at start to what the file descriptor limit
    /// allows.
    pub connections_max: u64,
    /// Proxies whose `X-Forwarded-For` is believed (addresses or CIDR ranges): a request from
    /// one of them is from the right-most address of that header that is not a trusted proxy.
    pub trusted_proxies: Vec<AddressRange>,
    /// The names clients (and the proxy in front) use for this node, besides its IP addresses
    /// and `localhost`: a request whose `Host` names anything else is answered 421, which keeps
    /// DNS rebinding out (at most 64 plain DNS names, no ports).
    pub allowed_hosts: Vec<String>,
    /// Who may read `GET /metrics` (addresses or CIDR ranges, judged on the client address);
    /// anyone else gets 403. Loopback and the private networks by default.
    pub metrics_from: Vec<AddressRange>,
    /// How long the database's part of `/metrics` (workflows by status, the pool) is reused:
    /// however often `/metrics` is asked, the database counts at most once in this period.
    pub metrics_refresh_ms: u64,
}

/// Loopback and the private networks (RFC 1918, RFC 4193 unique local addresses).
fn private_networks() -> Vec<AddressRange> {
    [
        "127.0.0.0/8",
        "::1/128",
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "fc00::/7",
    ]
    .into_iter()
    .filter_map(|range| AddressRange::try_from(range.to_owned()).ok())
    .collect()
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            body_bytes_max: 1024 * 1024,
            head_bytes_max: 64 * 1024,
            page_size_max: 500,
            inbox_workflows_max: 100,
            cancel_wait_ms: 5000,
            wait_max_ms: 60_000,
            waiters_max: 768,
            waiters_per_user_max: 512,
            record_reads_per_user_max: 8,
            record_read_wait_ms: 10_000,
            record_steps_page_max: 100,
            record_artifacts_page_max: 500,
            head_timeout_ms: 10_000,
            body_timeout_ms: 30_000,
            connections_max: 1024,
            trusted_proxies: Vec::new(),
            allowed_hosts: Vec::new(),
            metrics_from: private_networks(),
            metrics_refresh_ms: 1000,
        }
    }
}

/// An IP address or a CIDR range (`10.0.0.0/8`, `fd00::/8`), written as text in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(try_from = "String", into = "String")]
pub struct AddressRange {
    network: IpAddr,
    prefix_bits: u8,
}

impl AddressRange {
    /// Whether `address` is in the range (an IPv4-mapped IPv6 address counts as its IPv4 one).
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, address.to_canonical()) {
            (IpAddr::V4(network), IpAddr::V4(address)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_bits))
                    .unwrap_or(0);
                u32::from(network) & mask == u32::from(address) & mask
            }
            (IpAddr::V6(network), IpAddr::V6(address)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_bits))
                    .unwrap_or(0);
                u128::from(network) & mask == u128::from(address) & mask
            }
            _ => false,
        }
    }
}

impl TryFrom<String> for AddressRange {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.as_str(), None),
        };
        let network: IpAddr = address
            .trim()
            .parse()
            .map_err(|_| format!("{text:?} is not an IP address or CIDR range"))?;
        let network = network.to_canonical();
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix_bits = match prefix {
            None => width,
            Some(prefix) => prefix
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|bits| *bits <= width)
                .ok_or_else(|| format!("{text:?} has a prefix outside 0..={width}"))?,
        };
        Ok(AddressRange {
            network,
            prefix_bits,
        })
    }
}

impl From<AddressRange> for String {
    fn from(range: AddressRange) -> String {
        format!("{}/{}", range.network, range.prefix_bits)
    }
}

/// Sessions and sign-in.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// A session lasts this long from sign-in (judged by the database clock).
    pub session_seconds: u64,
    /// Failed sign-ins of one client address on one account within `login_window_seconds`
    /// before further attempts of that pair are refused with 429 until the window passes.
    pub login_failures_max: u32,
    /// Failed sign-ins of one client address on any accounts within the window.
    pub login_address_failures_max: u32,
    /// Failed sign-ins on one account from any addresses within the window.
    pub login_account_failures_max: u32,
    pub login_window_seconds: u64,
    /// Password hashes (sign-in checks, new users) the whole node computes at once; each holds
    /// argon2id's 19 MiB. A sign-in that finds them all busy is refused at once with 429.
    pub password_hashes_max: u32,
    /// Mark cookies `Secure` (sent over HTTPS only): set it when a TLS proxy fronts the nodes.
    pub secure_cookies: bool,
    /// The longest life an API token may be given with `expires_in_days`, in days.
    pub token_days_max: u32,
    /// A user's live API tokens at most; creating one more is refused (422) until one is revoked.
    pub tokens_per_user_max: u32,
    /// A user's live sessions at most; signing in once more ends their oldest session.
    pub sessions_per_user_max: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            session_seconds: 12 * 3600,
            login_failures_max: 10,
            login_address_failures_max: 100,
            login_account_failures_max: 50,
            login_window_seconds: 60,
            password_hashes_max: 4,
            secure_cookies: false,
            token_days_max: 365,
            tokens_per_user_max: 100,
            sessions_per_user_max: 100,
        }
    }
}

/// The shortest secret accepted, in characters.
pub const SECRET_CHARS_MIN: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Recovery {
    Manual,
    Automatic,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Limits of workflows (spec section 2 and 7), with the spec's defaults.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub script_bytes_max: u64,
    pub frame_bytes_max: u64,
    pub artifact_bytes_max: u64,
    /// How long reading a captured file may take before the capture fails.
    pub capture_timeout_ms: u64,
    pub script_memory_bytes_max: u64,
    pub script_stack_bytes_max: u64,
    pub script_cpu_ms_max: u64,
    /// CPU time of a workflow's JavaScript over its life (a replay counts what it runs again).
    pub script_cpu_ms_total_max: u64,
    pub steps_max: u64,
    pub parallel_max: u64,
    pub max_workflows: u64,
    pub max_workflows_per_owner: u64,
    pub max_active_children: u64,
    /// The share of the cluster's slots the agent steps of one user's workflows are sure of:
    /// beyond it, a user's step waits while another user waits below theirs, so that one user
    /// cannot keep every slot from the others. With nobody else waiting, one user may hold every
    /// slot. 0 (the default) is half of `max_active_children`, rounded up; `max_active_children`
    /// turns the share off. See [`Limits::active_children_per_user`].
    pub max_active_children_per_user: u64,
    /// The slots kept free for users other than one who holds their share already: such a user's
    /// step waits rather than leave fewer free, whether or not anybody else waits, so that another
    /// user's step starts at once even while one user's long agents hold every other slot. A user
    /// below their share may take them. The price: a user alone runs at most
    /// `max_active_children` less this many agents at once (or their share, if more). 0 keeps
    /// none; below `max_active_children`; it binds only while the share does.
    pub active_children_reserved: u64,
    /// The bytes one user's workflows store at most: their artifacts (captured files and agent
    /// outputs) and the room their running workflows hold for artifacts to come. A step whose
    /// artifact would pass it fails naming it; 0 is no quota.
    pub user_stored_bytes_max: u64,
    /// A workflow's life limit when its launch sets none: cancelled this many seconds after its
    /// launch; 0 (the default) is no limit. Workflows keep the limit they were launched with.
    pub timeout_seconds: u64,
    /// The memory all loaded scripts of the node may use together (parked ones hold none).
    pub js_memory_total_bytes: u64,
    /// Scripts whose compiled bytecode each JS thread keeps, so that a script already compiled
    /// (by its launch's check, or another workflow's start) is not parsed again; 0 keeps none.
    pub js_compiled_scripts_max: u64,
    pub log_lines_per_activation_max: u64,
    pub log_line_bytes_max: u64,
    pub log_bytes_per_workflow_max: u64,
    /// `console.log` lines a workflow keeps as durable `log` events at most, whichever nodes
    /// ran it.
    pub log_events_per_workflow_max: u64,
    /// The bytes of the lines a workflow keeps as `log` events at most.
    pub log_event_bytes_per_workflow_max: u64,
    /// The longest `title` a launch takes, in characters (Unicode scalar values).
    pub title_chars_max: u64,
    /// The bytes of an agent's error text that are kept: a longer one is cut at ingest (its
    /// head, and a note of its length), before any copy of it is stored, sent or logged.
    pub error_bytes_max: u64,
    /// The bytes of data a retry copies at most from the workspaces of the steps it adopts (a
    /// sparse file's holes do not count); a retry whose workspaces hold more is refused (413).
    pub retry_copy_bytes_max: u64,
    /// Events a workflow holds that no `waitForEvent` has taken yet, at most: a send past it is
    /// refused (422) with nothing written.
    pub untaken_events_per_workflow_max: u64,
    /// Those events' payload bytes (as JSON text) at most.
    pub untaken_event_bytes_per_workflow_max: u64,
}

/// `limits.error_bytes_max` at least (room for the note a cut error ends with) and at most.
pub const ERROR_BYTES_MIN: u64 = 256;
pub const ERROR_BYTES_MAX: u64 = 64 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            script_bytes_max: 64 * 1024,
            frame_bytes_max: 48 * 1024,
            artifact_bytes_max: 16 * 1024 * 1024,
            capture_timeout_ms: 10_000,
            script_memory_bytes_max: 64 * 1024 * 1024,
            script_stack_bytes_max: 1024 * 1024,
            script_cpu_ms_max: 2000,
            script_cpu_ms_total_max: 60_000,
            steps_max: 10_000,
            parallel_max: 64,
            max_workflows: 1000,
            max_workflows_per_owner: 100,
            max_active_children: 32,
            max_active_children_per_user: 0,
            active_children_reserved: 1,
            user_stored_bytes_max: 10 * 1024 * 1024 * 1024,
            timeout_seconds: 0,
            js_memory_total_bytes: 512 * 1024 * 1024,
            js_compiled_scripts_max: 32,
            log_lines_per_activation_max: 1_000,
            log_line_bytes_max: 4 * 1024,
            log_bytes_per_workflow_max: 1024 * 1024,
            log_events_per_workflow_max: 1000,
            log_event_bytes_per_workflow_max: 256 * 1024,
            title_chars_max: 200,
            error_bytes_max: 4 * 1024,
            retry_copy_bytes_max: 1024 * 1024 * 1024,
            untaken_events_per_workflow_max: 1_000,
            untaken_event_bytes_per_workflow_max: 8 * 1024 * 1024,
        }
    }
}

/// The store's pool sizes and timeouts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    pub pool_size: usize,
    pub pool_wait_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub lock_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub requests_max: usize,
    pub call_timeout_ms: u64,
    pub write_batch_max: usize,
    pub pg_writers: usize,
    pub pg_batch_max: usize,
    /// PostgreSQL: the pool's connections reads hold at once at most (at most `pool_size - 1`
    /// of them), so that heavy reads never take the connections writes need.
    pub pg_read_connections_max: usize,
    /// PostgreSQL: how long sent data may go unacknowledged before a connection is dropped.
    pub pg_tcp_user_timeout_ms: u64,
    /// PostgreSQL: idle time before a keepalive probe, and the time between probes.
    pub pg_keepalives_idle_seconds: u64,
    pub pg_keepalives_interval_seconds: u64,
    pub wal_checkpoint_pages: u32,
    pub wal_pages_max: u32,
    pub feed_numbering_max: u32,
}

impl Default for StoreConfig {
    fn default() -> Self {
        let defaults = StoreOptions::default();
        StoreConfig {
            pool_size: defaults.pool_size,
            pool_wait_timeout_ms: millis(defaults.pool_wait_timeout),
            connect_timeout_ms: millis(defaults.connect_timeout),
            lock_timeout_ms: millis(defaults.lock_timeout),
            statement_timeout_ms: millis(defaults.statement_timeout),
            requests_max: 256,
            call_timeout_ms: 30_000,
            write_batch_max: defaults.write_batch_max,
            pg_writers: defaults.pg_writers,
            pg_batch_max: defaults.pg_batch_max,
            pg_read_connections_max: defaults.pg_read_connections_max,
            pg_tcp_user_timeout_ms: millis(defaults.pg_tcp_user_timeout),
            pg_keepalives_idle_seconds: defaults.pg_keepalives_idle.as_secs(),
            pg_keepalives_interval_seconds: defaults.pg_keepalives_interval.as_secs(),
            wal_checkpoint_pages: defaults.wal_checkpoint_pages,
            wal_pages_max: defaults.wal_pages_max,
            feed_numbering_max: defaults.feed_numbering_max,
        }
    }
}

/// How long a stopping node waits for open connections and its actors.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    /// After SIGTERM, how long the node keeps serving while readiness, launches and recoveries
    /// answer 503, so that a balancer moves new work away before connections close.
    pub drain_grace_ms: u64,
    pub drain_timeout_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig {
            drain_grace_ms: 0,
            drain_timeout_ms: 3000,
        }
    }
}

impl Limits {
    /// The share of the cluster's agent slots one user's steps are sure of: the configured
    /// `max_active_children_per_user`, or for 0 half of `max_active_children`, rounded up. Half,
    /// because the share binds only while another user waits: two users then end up with half
    /// each, and among more users, none holds more than half while another waits below it; a
    /// user alone still takes every slot.
    pub fn active_children_per_user(&self) -> u64 {
        match self.max_active_children_per_user {
            0 => self.max_active_children.div_ceil(2),
            per_user => per_user,
        }
    }

    /// The limits workflow scripts run under.
    pub fn workflow(&self) -> runtime::Limits {
        runtime::Limits {
            script_bytes_max: self.script_bytes_max,
            frame_bytes_max: self.frame_bytes_max,
            script_memory_bytes_max: self.script_memory_bytes_max,
            script_stack_bytes_max: self.script_stack_bytes_max,
            script_cpu_ms_max: self.script_cpu_ms_max,
            script_cpu_ms_total_max: self.script_cpu_ms_total_max,
            steps_max: self.steps_max,
            parallel_max: self.parallel_max,
            log_lines_per_activation_max: self.log_lines_per_activation_max,
            log_line_bytes_max: self.log_line_bytes_max,
            log_bytes_per_workflow_max: self.log_bytes_per_workflow_max,
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: format!("127.0.0.1:{DEFAULT_PORT}"),
            database: None,
            data_dir: "reins-data".into(),
            lease_seconds: 30,
            recovery: Recovery::Manual,
            wake_fallback_ms: WAKE_FALLBACK_MS_DEFAULT,
            dormant_after_ms: DORMANT_AFTER_MS_DEFAULT,
            log_format: LogFormat::Text,
            workspaces_dir: None,
            admin_socket: None,
            agents: vec![AgentConfig::scripted("scripted")],
            agent_confinement: ConfinementMode::Landlock,
            secret: None,
            limits: Limits::default(),
            store: StoreConfig::default(),
            shutdown: ShutdownConfig::default(),
            http: HttpConfig::default(),
            auth: AuthConfig::default(),
            events: EventsConfig::default(),
            notify: Vec::new(),
            notifications: NotificationsConfig::default(),
        }
    }
}

/// A configuration that passed every check, with its parsed parts.
#[derive(Debug)]
pub struct Checked {
    pub config: Config,
    pub listen: SocketAddr,
    pub database: DatabaseUrl,
    pub agents: AgentRegistry,
    /// The notifier's webhooks and bounds; `None` when no `[[notify]]` is configured.
    pub notify: Option<actors::notify::NotifyOptions>,
    /// `REINS_*` variables that name no configuration key: ignored, each with a line that names
    /// it (and the closest key). A stray variable in a wrapper's environment must not stop a
    /// node; an unknown key in the file still does.
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads `file` (if any), applies the `REINS_*` overrides from `environment`, and checks
    /// every value. Touches nothing but the file it reads.
    pub fn load(
        file: Option<&Path>,
        environment: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Checked, Error> {
        let mut table = match file {
            Some(path) => read_file(path)?,
            None => toml::Table::new(),
        };
        let mut warnings = Vec::new();
        for (variable, value) in environment {
            if let Some(warning) = apply_override(&mut table, &variable, &value)? {
                warnings.push(warning);
            }
        }
        let config =
            Config::deserialize(toml::Value::Table(table)).map_err(|e| Error::Environment {
                variable: "REINS_*".into(),
                message: e.message().to_owned(),
            })?;
        let mut checked = config.check()?;
        checked.warnings = warnings;
        Ok(checked)
    }

    /// Checks every section in turn: the node's own keys, `[store]`, `[limits]`, `[http]`,
    /// `[events]`, `[auth]`, the agents and the webhooks.
    fn check(self) -> Result<Checked, Error> {
        let (listen, database) = self.check_node()?;
        self.store.check()?;
        self.limits.check()?;
        self.http.check()?;
        self.events.check()?;
        self.auth.check()?;
        let agents =
            AgentRegistry::new(&self.agents).map_err(|e| invalid("agents", e.to_string()))?;
        let notify = notify::check(&self.notify, &self.notifications, &listen)?;
        Ok(Checked {
            config: self,
            listen,
            database,
            agents,
            notify,
            warnings: Vec::new(),
        })
    }

    /// The node's own keys: `listen`, `data_dir`, `database`, the lease, the wake fallback, the
    /// dormancy delay and `secret`; the address and database they name.
    fn check_node(&self) -> Result<(SocketAddr, DatabaseUrl), Error> {
        let listen: SocketAddr = self
            .listen
            .parse()
            .map_err(|e| invalid("listen", format!("{:?} is not HOST:PORT: {e}", self.listen)))?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty".into()));
        }
        let database = match &self.database {
            Some(url) => DatabaseUrl::parse(url).map_err(|e| invalid("database", e.to_string()))?,
            None => DatabaseUrl::Sqlite(self.data_dir.join("reins.db")),
        };
        within("lease_seconds", self.lease_seconds, 1..=3600)?;
        within(
            "wake_fallback_ms",
            self.wake_fallback_ms,
            WAKE_FALLBACK_MS_MIN..=WAKE_FALLBACK_MS_MAX,
        )?;
        if self.dormant_after_ms != 0
            && !(DORMANT_AFTER_MS_MIN..=DORMANT_AFTER_MS_MAX).contains(&self.dormant_after_ms)
        {
            return Err(invalid(
                "dormant_after_ms",
                format!(
                    "{} is outside {DORMANT_AFTER_MS_MIN}..={DORMANT_AFTER_MS_MAX} (0: never)",
                    self.dormant_after_ms
                ),
            ));
        }
        self.check_secret(&database)?;
        Ok((listen, database))
    }

    /// `secret`: long enough when set, and set on PostgreSQL (every node of a cluster needs the
    /// same one).
    fn check_secret(&self, database: &DatabaseUrl) -> Result<(), Error> {
        match &self.secret {
            Some(secret) if secret.chars().count() < SECRET_CHARS_MIN => Err(invalid(
                "secret",
                format!(
                    "is {} characters, fewer than {SECRET_CHARS_MIN}; `reins keygen` prints one",
                    secret.chars().count()
                ),
            )),
            None if matches!(database, DatabaseUrl::Postgres(_)) => Err(invalid(
                "secret",
                "a cluster on PostgreSQL needs one secret shared by every node; \
                 `reins keygen` prints one"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// Where thread workspaces live.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.workspaces_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("workspaces"))
    }

    /// Where the admin socket lives.
    pub fn admin_socket(&self) -> PathBuf {
        self.admin_socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join("admin.sock"))
    }

    /// The configuration as operators may see it: secrets replaced, the database URL without
    /// its password, and the paths that default from `data_dir` as the node uses them.
    pub fn redacted(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if self.secret.is_some() {
            value["secret"] = serde_json::json!("<redacted>");
        }
        for (index, sink) in self.notify.iter().enumerate() {
            if sink.secret.is_some() {
                value["notify"][index]["secret"] = serde_json::json!("<redacted>");
            }
        }
        if let Some(Ok(url)) = self.database.as_deref().map(DatabaseUrl::parse) {
            value["database"] = serde_json::json!(url.redacted());
        }
        // What the node uses, defaults included, rather than the unset option.
        value["admin_socket"] = serde_json::json!(self.admin_socket());
        value["workspaces_dir"] = serde_json::json!(self.workspaces_dir());
        value
    }

    /// The store options this configuration asks for.
    pub fn store_options(&self, holder: &str) -> StoreOptions {
        StoreOptions {
            pool_size: self.store.pool_size,
            pool_wait_timeout: Duration::from_millis(self.store.pool_wait_timeout_ms),
            connect_timeout: Duration::from_millis(self.store.connect_timeout_ms),
            lock_timeout: Duration::from_millis(self.store.lock_timeout_ms),
            statement_timeout: Duration::from_millis(self.store.statement_timeout_ms),
            write_batch_max: self.store.write_batch_max,
            pg_writers: self.store.pg_writers,
            pg_batch_max: self.store.pg_batch_max,
            pg_read_connections_max: self.store.pg_read_connections_max,
            pg_tcp_user_timeout: Duration::from_millis(self.store.pg_tcp_user_timeout_ms),
            pg_keepalives_idle: Duration::from_secs(self.store.pg_keepalives_idle_seconds),
            pg_keepalives_interval: Duration::from_secs(self.store.pg_keepalives_interval_seconds),
            wal_checkpoint_pages: self.store.wal_checkpoint_pages,
            wal_pages_max: self.store.wal_pages_max,
            feed_numbering_max: self.store.feed_numbering_max,
            holder: holder.to_owned(),
            ..StoreOptions::default()
        }
    }
}

impl StoreConfig {
    /// `[store]`: the PostgreSQL writers and batches within their bounds, the connection's
    /// timeouts within their ranges, and every size and time over 0.
    fn check(&self) -> Result<(), Error> {
        for (key, value, max) in [
            ("store.pg_writers", self.pg_writers, PG_WRITERS_MAX),
            ("store.pg_batch_max", self.pg_batch_max, PG_BATCH_MAX_MAX),
        ] {
            if value > max {
                return Err(invalid(key, format!("{value} is over {max}")));
            }
        }
        within(
            "store.pg_tcp_user_timeout_ms",
            self.pg_tcp_user_timeout_ms,
            PG_TCP_USER_TIMEOUT_MS_MIN..=PG_TCP_USER_TIMEOUT_MS_MAX,
        )?;
        within(
            "store.pg_keepalives_idle_seconds",
            self.pg_keepalives_idle_seconds,
            1..=PG_KEEPALIVES_IDLE_SECONDS_MAX,
        )?;
        within(
            "store.pg_keepalives_interval_seconds",
            self.pg_keepalives_interval_seconds,
            1..=PG_KEEPALIVES_INTERVAL_SECONDS_MAX,
        )?;
        all_positive(&[
            ("store.pool_size", self.pool_size as u64),
            ("store.requests_max", self.requests_max as u64),
            ("store.write_batch_max", self.write_batch_max as u64),
            ("store.pg_writers", self.pg_writers as u64),
            ("store.pg_batch_max", self.pg_batch_max as u64),
            (
                "store.pg_read_connections_max",
                self.pg_read_connections_max as u64,
            ),
            (
                "store.wal_checkpoint_pages",
                u64::from(self.wal_checkpoint_pages),
            ),
            ("store.wal_pages_max", u64::from(self.wal_pages_max)),
            (
                "store.feed_numbering_max",
                u64::from(self.feed_numbering_max),
            ),
            ("store.connect_timeout_ms", self.connect_timeout_ms),
            ("store.call_timeout_ms", self.call_timeout_ms),
        ])
    }
}

impl Limits {
    /// `[limits]`: every size and time over 0, the children's shares within the cluster's
    /// slots, an error's size within its range, and room for one script to start.
    fn check(&self) -> Result<(), Error> {
        all_positive(&[
            ("limits.script_bytes_max", self.script_bytes_max),
            ("limits.frame_bytes_max", self.frame_bytes_max),
            ("limits.capture_timeout_ms", self.capture_timeout_ms),
            (
                "limits.script_cpu_ms_total_max",
                self.script_cpu_ms_total_max,
            ),
            ("limits.log_line_bytes_max", self.log_line_bytes_max),
            ("limits.title_chars_max", self.title_chars_max),
            ("limits.retry_copy_bytes_max", self.retry_copy_bytes_max),
            (
                "limits.untaken_events_per_workflow_max",
                self.untaken_events_per_workflow_max,
            ),
            (
                "limits.untaken_event_bytes_per_workflow_max",
                self.untaken_event_bytes_per_workflow_max,
            ),
        ])?;
        self.check_children()?;
        within(
            "limits.error_bytes_max",
            self.error_bytes_max,
            ERROR_BYTES_MIN..=ERROR_BYTES_MAX,
        )?;
        if self.js_memory_total_bytes < actors::js_pool::VM_START_BYTES_MIN {
            return Err(invalid(
                "limits.js_memory_total_bytes",
                format!(
                    "must be at least {} (what one script needs to start)",
                    actors::js_pool::VM_START_BYTES_MIN
                ),
            ));
        }
        Ok(())
    }

    /// The child runs' slots: one user's share no more than the cluster's, and the reserve
    /// below the cluster's when the share binds.
    fn check_children(&self) -> Result<(), Error> {
        if self.max_active_children_per_user > self.max_active_children {
            return Err(invalid(
                "limits.max_active_children_per_user",
                format!(
                    "{} is over limits.max_active_children ({})",
                    self.max_active_children_per_user, self.max_active_children
                ),
            ));
        }
        // With the share off the reserve binds nothing, so a cluster of one slot keeps the
        // default of one.
        if self.active_children_reserved >= self.max_active_children
            && self.active_children_per_user() < self.max_active_children
        {
            return Err(invalid(
                "limits.active_children_reserved",
                format!(
                    "{} is not below limits.max_active_children ({})",
                    self.active_children_reserved, self.max_active_children
                ),
            ));
        }
        Ok(())
    }
}

impl HttpConfig {
    /// `[http]`: the allowed host names (how many, and each one's form), and every size, count
    /// and time over 0.
    fn check(&self) -> Result<(), Error> {
        if self.allowed_hosts.len() > crate::http::host::ALLOWED_HOSTS_MAX {
            return Err(invalid(
                "http.allowed_hosts",
                format!(
                    "{} names, more than {}",
                    self.allowed_hosts.len(),
                    crate::http::host::ALLOWED_HOSTS_MAX
                ),
            ));
        }
        for name in &self.allowed_hosts {
            crate::http::host::check_allowed_name(name)
                .map_err(|message| invalid("http.allowed_hosts", message))?;
        }
        all_positive(&[
            ("http.body_bytes_max", self.body_bytes_max),
            ("http.head_bytes_max", self.head_bytes_max),
            ("http.page_size_max", u64::from(self.page_size_max)),
            (
                "http.inbox_workflows_max",
                u64::from(self.inbox_workflows_max),
            ),
            ("http.head_timeout_ms", self.head_timeout_ms),
            ("http.body_timeout_ms", self.body_timeout_ms),
            ("http.connections_max", self.connections_max),
            ("http.wait_max_ms", self.wait_max_ms),
            ("http.waiters_max", self.waiters_max),
            ("http.waiters_per_user_max", self.waiters_per_user_max),
            (
                "http.record_reads_per_user_max",
                self.record_reads_per_user_max,
            ),
            ("http.record_read_wait_ms", self.record_read_wait_ms),
            (
                "http.record_steps_page_max",
                u64::from(self.record_steps_page_max),
            ),
            (
                "http.record_artifacts_page_max",
                u64::from(self.record_artifacts_page_max),
            ),
            ("http.metrics_refresh_ms", self.metrics_refresh_ms),
        ])
    }
}

impl EventsConfig {
    /// `[events]`: every count, size and time over 0.
    fn check(&self) -> Result<(), Error> {
        all_positive(&[
            ("events.poll_ms", self.poll_ms),
            ("events.keepalive_ms", self.keepalive_ms),
            ("events.batch_max", u64::from(self.batch_max)),
            (
                "events.stream_buffer_bytes_max",
                self.stream_buffer_bytes_max,
            ),
            ("events.stream_stall_ms", self.stream_stall_ms),
            ("events.streams_max", u64::from(self.streams_max)),
            (
                "events.streams_per_user_max",
                u64::from(self.streams_per_user_max),
            ),
        ])
    }
}

impl AuthConfig {
    /// `[auth]`: every count and time over 0.
    fn check(&self) -> Result<(), Error> {
        all_positive(&[
            ("auth.session_seconds", self.session_seconds),
            (
                "auth.login_failures_max",
                u64::from(self.login_failures_max),
            ),
            (
                "auth.login_address_failures_max",
                u64::from(self.login_address_failures_max),
            ),
            (
                "auth.login_account_failures_max",
                u64::from(self.login_account_failures_max),
            ),
            ("auth.login_window_seconds", self.login_window_seconds),
            (
                "auth.password_hashes_max",
                u64::from(self.password_hashes_max),
            ),
            ("auth.token_days_max", u64::from(self.token_days_max)),
            (
                "auth.tokens_per_user_max",
                u64::from(self.tokens_per_user_max),
            ),
            (
                "auth.sessions_per_user_max",
                u64::from(self.sessions_per_user_max),
            ),
        ])
    }
}

/// The error that says `key` is not valid, and why.
fn invalid(key: &'static str, message: String) -> Error {
    Error::Invalid { key, message }
}

/// `value` of `key` within `range`, else the error that says it is outside.
fn within<T>(key: &'static str, value: T, range: std::ops::RangeInclusive<T>) -> Result<(), Error>
where
    T: PartialOrd + std::fmt::Display,
{
    if range.contains(&value) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("{value} is outside {}..={}", range.start(), range.end()),
    ))
}

/// The first of `values` that is 0, as the error that says it must be greater than 0.
fn all_positive(values: &[(&'static str, u64)]) -> Result<(), Error> {
    match values.iter().find(|(_, value)| *value == 0) {
        Some((key, _)) => Err(invalid(key, "must be greater than 0".into())),
        None => Ok(()),
    }
}

fn read_file(path: &Path) -> Result<toml::Table, Error> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Read {
        path: path.to_owned(),
        reason: e.to_string(),
    })?;
    // Deserializing the file alone first gives errors with their line; the table is then merged
    // with the environment.
    if let Err(e) = toml::from_str::<Config>(&text) {
        let line = e
            .span()
            .map(|span| format!(" line {}", text[..span.start].matches('\n').count() + 1))
            .unwrap_or_default();
        return Err(Error::File {
            path: path.to_owned(),
            line,
            message: e.message().trim().to_owned(),
        });
    }
    toml::from_str(&text).map_err(|e: toml::de::Error| Error::File {
        path: path.to_owned(),
        line: String::new(),
        message: e.message().trim().to_owned(),
    })
}

/// Sets the key a `REINS_*` variable names: `REINS_LEASE_SECONDS` is `lease_seconds`,
/// `REINS_STORE__POOL_SIZE` is `store.pool_size`. Values are read as TOML when they parse as a
/// number, boolean or array (`REINS_HTTP__TRUSTED_PROXIES='["10.0.0.0/8"]'`), and as strings
/// otherwise. A variable that names no key is ignored and answered with a warning naming it.
fn apply_override(
    table: &mut toml::Table,
    variable: &str,
    value: &str,
) -> Result<Option<String>, Error> {
    let Some(name) = variable.strip_prefix("REINS_") else {
        return Ok(None);
    };
    if NOT_CONFIG.contains(&variable) || HARNESS_PREFIXES.iter().any(|p| variable.starts_with(p)) {
        return Ok(None);
    }
    let path: Vec<String> = name.split("__").map(|part| part.to_lowercase()).collect();
    if !is_known_key(&path) {
        let key = path.join(".");
        let hint = closest_key(&key)
            .map(|close| {
                let variable = format!("REINS_{}", close.replace('.', "__").to_uppercase());
                format!("; did you mean `{variable}` (`{close}`)?")
            })
            .unwrap_or_default();
        return Ok(Some(format!(
            "ignoring `{variable}`: `{key}` is not a configuration key{hint}"
        )));
    }
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !matches!(v, toml::Value::Table(_)))
        .unwrap_or_else(|| toml::Value::String(value.to_owned()));
    let (last, parents) = path.split_last().ok_or_else(|| Error::Environment {
        variable: variable.to_owned(),
        message: "names no key".into(),
    })?;
    let mut target = table;
    for parent in parents {
        let entry = target
            .entry(parent.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        target = entry.as_table_mut().ok_or_else(|| Error::Environment {
            variable: variable.to_owned(),
            message: format!("`{parent}` is not a section"),
        })?;
    }
    target.insert(last.clone(), parsed);
    Ok(None)
}

/// Keys whose default is "not set", so the serialized defaults do not show them.
const OPTIONAL_KEYS: &[&str] = &["database", "workspaces_dir", "secret", "admin_socket"];

/// Whether a dotted key path names a field of [`Config`], judged from the serialized defaults.
/// Every configuration key, dotted (`store.pool_size`).
fn known_keys() -> Vec<String> {
    fn walk(table: &toml::Table, prefix: &str, keys: &mut Vec<String>) {
        for (name, value) in table {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match value {
                toml::Value::Table(inner) => walk(inner, &key, keys),
                _ => keys.push(key),
            }
        }
    }
    let mut keys: Vec<String> = OPTIONAL_KEYS.iter().map(|k| (*k).to_owned()).collect();
    if let Ok(toml::Value::Table(defaults)) = toml::Value::try_from(Config::default()) {
        walk(&defaults, "", &mut keys);
    }
    keys
}

/// The key closest to `key` by edit distance, when it is close (a typo, not another word).
fn closest_key(key: &str) -> Option<String> {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut previous = row[0];
            row[0] = i + 1;
            for (j, cb) in b.iter().enumerate() {
                let substituted = previous + usize::from(ca != *cb);
                previous = row[j + 1];
                row[j + 1] = substituted.min(row[j] + 1).min(row[j + 1] + 1);
            }
        }
        row[b.len()]
    };
    known_keys()
        .into_iter()
        .map(|known| (distance(key, &known), known))
        .filter(|(d, known)| *d <= 3.max(known.len() / 4) && *d < known.len())
        .min_by_key(|(d, _)| *d)
        .map(|(_, known)| known)
}

fn is_known_key(path: &[String]) -> bool {
    if let [key] = path
        && OPTIONAL_KEYS.contains(&key.as_str())
    {
        return true;
    }
    let Ok(toml::Value::Table(defaults)) = toml::Value::try_from(Config::default()) else {
        return false;
    };
    let mut current = &defaults;
    for (index, part) in path.iter().enumerate() {
        match current.get(part) {
            Some(toml::Value::Table(inner)) if index + 1 < path.len() => current = inner,
            Some(_) if index + 1 == path.len() => return true,
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// What `reins serve` with nothing configured runs on (the README's first command; the
    /// process test runs it on a free port, since another node may hold this one).
    #[test]
    fn with_nothing_configured_a_node_listens_on_7420_with_sqlite_in_reins_data() {
        let checked = Config::load(None, env(&[])).expect("no configuration");
        assert_eq!(
            checked.listen,
            "127.0.0.1:7420".parse().expect("an address")
        );
        assert_eq!(
            checked.database,
            DatabaseUrl::Sqlite(PathBuf::from("reins-data/reins.db"))
        );
        assert!(checked.warnings.is_empty(), "{:?}", checked.warnings);
    }

    #[test]
    fn an_error_bound_leaves_room_for_its_note_and_is_bounded() {
        let at = |value: u64| {
            Config::load(
                None,
                env(&[("REINS_LIMITS__ERROR_BYTES_MAX", &value.to_string())]),
            )
        };
        at(ERROR_BYTES_MIN).expect("at the least");
        at(ERROR_BYTES_MAX).expect("at the most");
        for outside in [ERROR_BYTES_MIN - 1, ERROR_BYTES_MAX + 1] {
            let refused = at(outside).expect_err("outside").to_string();
            assert!(refused.contains("limits.error_bytes_max"), "{refused}");
        }
    }

    #[test]
    fn a_cluster_needs_a_secret_and_a_secret_needs_its_length() {
        let cluster = ("REINS_DATABASE", "postgres://reins@127.0.0.1:5/reins");
        let refused = Config::load(None, env(&[cluster])).expect_err("no secret");
        assert!(refused.to_string().contains("`secret`"), "{refused}");
        let short = Config::load(None, env(&[("REINS_SECRET", "short")])).expect_err("short");
        assert!(short.to_string().contains("fewer than 32"), "{short}");
        let exact = "s".repeat(SECRET_CHARS_MIN);
        Config::load(None, env(&[cluster, ("REINS_SECRET", &exact)])).expect("at the minimum");
    }

    #[test]
    fn the_postgresql_batch_writers_and_batches_are_bounded() {
        for (variable, key, max) in [
            (
                "REINS_STORE__PG_WRITERS",
                "store.pg_writers",
                PG_WRITERS_MAX,
            ),
            (
                "REINS_STORE__PG_BATCH_MAX",
                "store.pg_batch_max",
                PG_BATCH_MAX_MAX,
            ),
        ] {
            let at = |value: usize| Config::load(None, env(&[(variable, &value.to_string())]));
            at(max).expect("at the bound");
            let refused = at(max + 1).expect_err("over the bound").to_string();
            assert!(refused.contains(key), "{refused}");
        }
    }

    #[test]
    fn the_postgresql_tcp_timeouts_are_bounded_at_both_ends() {
        for (variable, key, least, most) in [
            (
                "REINS_STORE__PG_TCP_USER_TIMEOUT_MS",
                "store.pg_tcp_user_timeout_ms",
                PG_TCP_USER_TIMEOUT_MS_MIN,
                PG_TCP_USER_TIMEOUT_MS_MAX,
            ),
            (
                "REINS_STORE__PG_KEEPALIVES_IDLE_SECONDS",
                "store.pg_keepalives_idle_seconds",
                1,
                PG_KEEPALIVES_IDLE_SECONDS_MAX,
            ),
            (
                "REINS_STORE__PG_KEEPALIVES_INTERVAL_SECONDS",
                "store.pg_keepalives_interval_seconds",
                1,
                PG_KEEPALIVES_INTERVAL_SECONDS_MAX,
            ),
        ] {
            let at = |value: u64| Config::load(None, env(&[(variable, &value.to_string())]));
            for edge in [least, most] {
                at(edge).expect("at the bound");
            }
            for outside in [least - 1, most + 1] {
                let refused = at(outside).expect_err("outside the bounds").to_string();
                assert!(refused.contains(key), "{refused}");
            }
        }
        let options = Config::load(
            None,
            env(&[
                ("REINS_STORE__PG_TCP_USER_TIMEOUT_MS", "2500"),
                ("REINS_STORE__PG_KEEPALIVES_IDLE_SECONDS", "30"),
                ("REINS_STORE__PG_KEEPALIVES_INTERVAL_SECONDS", "3"),
            ]),
        )
        .expect("valid")
        .config
        .store_options("test");
        assert_eq!(options.pg_tcp_user_timeout, Duration::from_millis(2500));
        assert_eq!(options.pg_keepalives_idle, Duration::from_secs(30));
        assert_eq!(options.pg_keepalives_interval, Duration::from_secs(3));
    }

    #[test]
    fn a_users_share_of_the_slots_is_half_the_slots_by_default_and_bounded_by_the_cluster() {
        let load = |vars: &[(&str, &str)]| Config::load(None, env(vars));
        let share = |vars: &[(&str, &str)]| {
            load(vars)
                .expect("valid")
                .config
                .limits
                .active_children_per_user()
        };
        assert_eq!(share(&[]), 16);
        let cluster = "REINS_LIMITS__MAX_ACTIVE_CHILDREN";
        assert_eq!(share(&[(cluster, "3")]), 2, "half, rounded up");
        assert_eq!(share(&[(cluster, "1")]), 1);
        let per_user = "REINS_LIMITS__MAX_ACTIVE_CHILDREN_PER_USER";
        assert_eq!(share(&[(per_user, "0")]), 16, "0 stands for the default");
        for edge in ["1", "32"] {
            assert_eq!(share(&[(per_user, edge)]).to_string(), edge);
        }
        let refused = load(&[(per_user, "33")]).expect_err("33").to_string();
        assert!(
            refused.contains("limits.max_active_children_per_user"),
            "{refused}"
        );
    }

    #[test]
    fn one_slot_is_kept_for_others_by_default_and_the_reserve_stays_below_the_slots() {
        let load = |vars: &[(&str, &str)]| Config::load(None, env(vars));
        let reserved = |vars: &[(&str, &str)]| {
            load(vars)
                .expect("valid")
                .config
                .limits
                .active_children_reserved
        };
        assert_eq!(reserved(&[]), 1);
        let key = "REINS_LIMITS__ACTIVE_CHILDREN_RESERVED";
        let cluster = "REINS_LIMITS__MAX_ACTIVE_CHILDREN";
        assert_eq!(reserved(&[(key, "0")]), 0, "0 keeps none");
        assert_eq!(reserved(&[(key, "31")]), 31, "one below the slots");
        let refused = load(&[(key, "32")]).expect_err("32").to_string();
        assert!(
            refused.contains("limits.active_children_reserved"),
            "{refused}"
        );
        // One slot: the share (all of it) is off, and the default reserve binds nothing.
        assert_eq!(reserved(&[(cluster, "1")]), 1);
    }

    #[test]
    fn a_users_stored_bytes_are_ten_gib_by_default_and_zero_is_no_quota() {
        let load = |vars: &[(&str, &str)]| Config::load(None, env(vars));
        let quota = |vars: &[(&str, &str)]| {
            load(vars)
                .expect("valid")
                .config
                .limits
                .user_stored_bytes_max
        };
        assert_eq!(quota(&[]), 10 * 1024 * 1024 * 1024);
        let key = "REINS_LIMITS__USER_STORED_BYTES_MAX";
        // Up to what the store counts in (a TOML integer cannot be more).
        for edge in ["0", "1", "9223372036854775807"] {
            assert_eq!(quota(&[(key, edge)]).to_string(), edge);
        }
        let refused = load(&[(key, "9223372036854775808")]).expect_err("over i64");
        assert!(refused.to_string().contains("REINS_"), "{refused}");
        assert!(load(&[(key, "-1")]).is_err(), "a negative quota");
    }

    #[test]
    fn dormancy_comes_after_a_bounded_wait_or_never() {
        let after = |ms: &str| Config::load(None, env(&[("REINS_DORMANT_AFTER_MS", ms)]));
        assert_eq!(Config::default().dormant_after_ms, 30_000);
        for edge in ["0", "100", "86400000"] {
            assert_eq!(
                after(edge).expect(edge).config.dormant_after_ms.to_string(),
                edge
            );
        }
        for outside in ["1", "99", "86400001"] {
            let refused = after(outside).expect_err(outside);
            assert!(
                refused.to_string().contains("dormant_after_ms"),
                "{refused}"
            );
        }
    }

    #[test]
    fn the_wake_fallback_is_a_slow_fallback_and_the_wait_limits_are_positive() {
        let fallback = |ms: &str| Config::load(None, env(&[("REINS_WAKE_FALLBACK_MS", ms)]));
        for edge in ["1000", "86400000"] {
            assert_eq!(
                fallback(edge)
                    .expect(edge)
                    .config
                    .wake_fallback_ms
                    .to_string(),
                edge
            );
        }
        for outside in ["999", "86400001"] {
            let refused = fallback(outside).expect_err(outside);
            assert!(
                refused.to_string().contains("wake_fallback_ms"),
                "{refused}"
            );
        }
        for key in ["REINS_HTTP__WAIT_MAX_MS", "REINS_HTTP__WAITERS_MAX"] {
            let refused = Config::load(None, env(&[(key, "0")])).expect_err(key);
            assert!(refused.to_string().contains("greater than 0"), "{refused}");
            Config::load(None, env(&[(key, "1")])).expect("one is enough");
        }
    }

    #[test]
    fn no_file_and_no_environment_is_the_embedded_default() {
        let checked = Config::load(None, env(&[])).expect("defaults are valid");
        assert_eq!(checked.listen.port(), DEFAULT_PORT);
        assert!(checked.listen.ip().is_loopback());
        assert_eq!(
            checked.database,
            DatabaseUrl::Sqlite("reins-data/reins.db".into())
        );
    }

    #[test]
    fn the_embedded_database_follows_data_dir_unless_set() {
        let moved = Config::load(None, env(&[("REINS_DATA_DIR", "/srv/reins")])).expect("valid");
        assert_eq!(
            moved.database,
            DatabaseUrl::Sqlite("/srv/reins/reins.db".into())
        );
        let set = Config::load(
            None,
            env(&[
                ("REINS_DATA_DIR", "/srv/reins"),
                ("REINS_DATABASE", "sqlite:/elsewhere/r.db"),
            ]),
        )
        .expect("valid");
        assert_eq!(set.database, DatabaseUrl::Sqlite("/elsewhere/r.db".into()));
    }

    #[test]
    fn environment_overrides_reach_nested_keys_with_types() {
        let checked = Config::load(
            None,
            env(&[
                ("REINS_LEASE_SECONDS", "9"),
                ("REINS_STORE__POOL_SIZE", "3"),
                ("REINS_DATABASE", "postgres://reins@127.0.0.1:5/reins"),
                ("REINS_SECRET", "a-secret-long-enough-for-the-check-1234"),
                ("REINS_FAULT_DIR", "/tmp/x"),
                ("REINS_CLI_URL", "http://elsewhere"),
                ("REINS_WORKSPACES_DIR", "/srv/shared/workspaces"),
                ("REINS_TEST_PG", "anything"),
                ("PATH", "/bin"),
            ]),
        )
        .expect("overrides are valid");
        assert_eq!(checked.config.lease_seconds, 9);
        assert_eq!(checked.config.store.pool_size, 3);
        assert_eq!(
            checked.config.workspaces_dir(),
            PathBuf::from("/srv/shared/workspaces")
        );
        assert!(matches!(checked.database, DatabaseUrl::Postgres(_)));
    }

    #[test]
    fn an_unknown_environment_variable_is_a_warning_naming_it_and_the_closest_key() {
        let checked = Config::load(
            None,
            env(&[("REINS_LEASE_SECOND", "9"), ("REINS_BIN", "/usr/bin/reins")]),
        )
        .expect("a stray variable does not stop the node");
        let warnings = checked.warnings.join("\n");
        assert!(
            warnings.contains("`REINS_LEASE_SECOND`")
                && warnings.contains("did you mean `REINS_LEASE_SECONDS`"),
            "{warnings}"
        );
        assert!(warnings.contains("`REINS_BIN`"), "{warnings}");
        assert_eq!(checked.warnings.len(), 2);
        assert_eq!(
            checked.config.lease_seconds,
            Config::default().lease_seconds
        );
    }

    #[test]
    fn an_unknown_file_key_is_named_with_its_line() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("reins.toml");
        std::fs::write(&path, "lease_seconds = 5\nbogus = 1\n").expect("write");
        let error = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(
            error.contains("bogus") && error.contains("line 2"),
            "{error}"
        );
        assert_eq!(error.lines().count(), 1, "{error}");
    }

    #[test]
    fn agents_are_read_with_their_kind_and_checked() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("reins.toml");
        std::fs::write(&path, "[[agents]]\nname = \"echo\"\nkind = \"scripted\"\n").expect("write");
        let checked = Config::load(Some(&path), env(&[])).expect("valid");
        assert!(checked.agents.get("echo").is_some());
        assert!(
            checked.agents.get("scripted").is_none(),
            "the list replaces the default"
        );

        std::fs::write(&path, "[[agents]]\nname = \"x\"\nkind = \"telepathy\"\n").expect("write");
        let error = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(error.contains("telepathy"), "{error}");
        std::fs::write(
            &path,
            "[[agents]]\nname = \"x\"\nkind = \"scripted\"\n[[agents]]\nname = \"x\"\nkind = \"scripted\"\n",
        )
        .expect("write");
        let error = Config::load(Some(&path), env(&[])).unwrap_err().to_string();
        assert!(
            error.contains("`agents`") && error.contains("twice"),
            "{error}"
        );
    }

    #[test]
    fn the_default_workflow_limits_are_the_runtimes_own() {
        assert_eq!(Limits::default().workflow(), runtime::Limits::default());
    }

    #[test]
    fn the_example_configuration_in_deploy_is_valid() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/reins.example.toml");
        let checked = Config::load(Some(&example), env(&[])).expect("the example parses");
        assert!(checked.agents.get("scripted").is_some());
        assert_eq!(checked.listen.port(), DEFAULT_PORT);
    }

    #[test]
    fn allowed_hosts_are_plain_names_at_most_64() {
        let checked = Config::load(
            None,
            env(&[("REINS_HTTP__ALLOWED_HOSTS", r#"["reins.example.com"]"#)]),
        )
        .expect("valid");
        assert_eq!(checked.config.http.allowed_hosts, ["reins.example.com"]);
        let many = format!(
            "[{}]",
            (0..=64)
                .map(|n| format!("\"h{n}.example.com\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        for bad in [
            r#"["reins.example.com:443"]"#,
            r#"["*.example.com"]"#,
            &many,
        ] {
            let error = Config::load(None, env(&[("REINS_HTTP__ALLOWED_HOSTS", bad)]))
                .expect_err(bad)
                .to_string();
            assert!(error.contains("http.allowed_hosts"), "{error}");
        }
        let at_most = format!(
            "[{}]",
            (0..64)
                .map(|n| format!("\"h{n}.example.com\""))
                .collect::<Vec<_>>()
                .join(",")
        );
        assert!(Config::load(None, env(&[("REINS_HTTP__ALLOWED_HOSTS", &at_most)])).is_ok());
    }

    #[test]
    fn trusted_proxies_are_addresses_or_ranges() {
        let checked = Config::load(
            None,
            env(&[(
                "REINS_HTTP__TRUSTED_PROXIES",
                r#"["10.0.0.0/8", "127.0.0.1", "fd00::/8"]"#,
            )]),
        )
        .expect("valid");
        let proxies = &checked.config.http.trusted_proxies;
        let contains = |address: &str| {
            let address: IpAddr = address.parse().expect("address");
            proxies.iter().any(|range| range.contains(address))
        };
        assert!(contains("10.200.3.4"));
        assert!(contains("127.0.0.1"));
        assert!(contains("::ffff:127.0.0.1"));
        assert!(contains("fd12::1"));
        assert!(!contains("127.0.0.2"));
        assert!(!contains("11.0.0.1"));
        assert!(!contains("fe80::1"));
        let all = AddressRange::try_from("0.0.0.0/0".to_owned()).expect("valid");
        assert!(all.contains("8.8.8.8".parse().expect("address")));
        for bad in [r#"["10.0.0.0/33"]"#, r#"["nowhere"]"#, r#"["::/129"]"#] {
            let error = Config::load(None, env(&[("REINS_HTTP__TRUSTED_PROXIES", bad)]))
                .expect_err(bad)
                .to_string();
            assert!(
                error.contains("CIDR") || error.contains("prefix"),
                "{error}"
            );
        }
    }

    #[test]
    fn bad_values_name_their_key() {
        for (variable, value, key) in [
            ("REINS_DATABASE", "mysql://x", "database"),
            ("REINS_LISTEN", "nowhere", "listen"),
            ("REINS_LEASE_SECONDS", "0", "lease_seconds"),
            ("REINS_STORE__POOL_SIZE", "0", "store.pool_size"),
            ("REINS_STORE__PG_WRITERS", "0", "store.pg_writers"),
            ("REINS_STORE__PG_BATCH_MAX", "0", "store.pg_batch_max"),
            (
                "REINS_LIMITS__LOG_LINE_BYTES_MAX",
                "0",
                "limits.log_line_bytes_max",
            ),
        ] {
            let error = Config::load(None, env(&[(variable, value)])).unwrap_err();
            assert!(error.to_string().contains(key), "{error}");
        }
    }

    #[test]
    fn the_js_memory_total_has_room_for_at_least_one_script() {
        let least = actors::js_pool::VM_START_BYTES_MIN;
        let at = |bytes: u64| {
            Config::load(
                None,
                env(&[("REINS_LIMITS__JS_MEMORY_TOTAL_BYTES", &bytes.to_string())]),
            )
        };
        let checked = at(least).expect("the least total is valid");
        assert_eq!(checked.config.limits.js_memory_total_bytes, least);
        let error = at(least - 1).unwrap_err().to_string();
        assert!(
            error.contains("limits.js_memory_total_bytes") && error.contains(&least.to_string()),
            "{error}"
        );
    }
}
