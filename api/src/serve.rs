//! `reins serve`: the composition root. The order matters: everything that can be refused
//! (configuration, the listening port, the database) is checked before anything is created on
//! disk, and every refusal is one line naming its cause.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actors::{Node, NodeIdentity, NodeOptions, RunsOptions, WorkflowsOptions};
use anyhow::Context;
use store::{DatabaseUrl, LaunchLimits, Store};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::admin;
use crate::config::{Config, LogFormat};
use crate::http::{self, AppState};

/// Options of `reins serve` given on the command line.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Configuration file (TOML); `REINS_*` environment variables override its keys.
    #[arg(long, env = "REINS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log line format; overrides the configuration's `log_format`.
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
}

/// Runs a node until SIGTERM or Ctrl-C, then drains and returns.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    // Everything the node creates (database, secret, workspaces, agents' files) is its own: no
    // other local user may read a password hash or a result.
    // SAFETY: umask(2) only sets this process's file mode mask; no memory is involved.
    unsafe { libc::umask(0o077) };
    // No other process of the node's user (its agents included) may read the node's memory,
    // environment or descriptors through `/proc/<pid>/` or attach to it: a process that is not
    // dumpable is reachable that way only with CAP_SYS_PTRACE. (Also: no core dumps.)
    // SAFETY: prctl(2) with PR_SET_DUMPABLE only sets a flag of this process.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let checked = Config::load(args.config.as_deref(), std::env::vars())?;
    let config = checked.config;
    // Flushes what is still buffered when `run` returns, whatever the way.
    let _log_writer = init_logging(args.log_format.unwrap_or(config.log_format));
    for warning in &checked.warnings {
        tracing::warn!("{warning}");
    }

    let listener = http::bind(checked.listen)
        .with_context(|| format!("cannot listen on {} (config key `listen`)", checked.listen))?;
    // What the node tells people is where it listens, port 0 included.
    let listen = listener
        .local_addr()
        .context("cannot read the listening address")?;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let identity = NodeIdentity::of_this_process(&suffix[..8]);
    let store = Store::open(
        &checked.database,
        &config.store_options(&identity.worker_id),
    )
    .await
    .context("cannot open the database (config key `database`)")?;
    // After the store: a second node on one SQLite file hears about the database (the real
    // conflict) rather than about the socket they would also share.
    let admin_path = config.admin_socket();
    admin::socket_free(&admin_path)?;
    let migrated = store
        .migrate()
        .await
        .context("cannot migrate the database")?;
    private_dir(&config.data_dir)?;
    private_dir(&config.workspaces_dir())?;
    if let DatabaseUrl::Sqlite(database) = &checked.database {
        // Made by an older node, or by hand, they may still be open to other users.
        for suffix in ["", "-wal", "-shm", ".node-lock"] {
            let mut file = database.clone().into_os_string();
            file.push(suffix);
            private_file(std::path::Path::new(&file))?;
        }
    }
    private_file(&config.data_dir.join("secret"))?;
    confine_agents(
        &config,
        &checked.database,
        &checked.agents,
        args.config.as_deref(),
    )?;
    let agent_records_dir = actors::agents::records_dir(&config.data_dir);
    // Before anything is admitted: no agent a dead node process started on this host may run on
    // beside what this node is about to recover or retry.
    let leftovers = actors::agents::ProcessRecords::new(agent_records_dir.clone())
        .kill_leftovers()
        .with_context(|| format!("cannot clean up {}", agent_records_dir.display()))?;
    for leftover in leftovers {
        tracing::warn!(run_id = %leftover.run_id, group = leftover.group,
            processes = leftover.processes, "killed an agent left by a node process that is gone");
    }
    let secret = match &config.secret {
        Some(secret) => secret.clone(),
        None => local_secret(&config.data_dir)?,
    };
    let node_files = Arc::new(node_files(
        &config,
        &checked.database,
        args.config.as_deref(),
    ));
    let lease_ms = config.lease_seconds * 1000;
    let fault_dir = fault_dir()?;
    timing_hooks()?;
    let runs = RunsOptions {
        lease_ms,
        workspaces_dir: config.workspaces_dir(),
        fault_dir: fault_dir.clone(),
        agent_records_dir: Some(agent_records_dir),
        agent_confinement: config.agent_confinement,
        task_bytes_max: usize::try_from(config.limits.frame_bytes_max).unwrap_or(usize::MAX),
        error_bytes_max: usize::try_from(config.limits.error_bytes_max).unwrap_or(usize::MAX),
        orphan_sweep: Duration::from_millis(lease_ms),
    };
    let node = Node::start(
        identity,
        Arc::new(store),
        NodeOptions {
            store_requests_max: config.store.requests_max,
            call_timeout: Duration::from_millis(config.store.call_timeout_ms),
            shutdown_timeout: Duration::from_millis(config.shutdown.drain_timeout_ms),
            workflows: WorkflowsOptions {
                limits: config.limits.workflow(),
                workspaces_dir: config.workspaces_dir(),
                artifact_bytes_max: config.limits.artifact_bytes_max,
                log_events_max: config.limits.log_events_per_workflow_max,
                log_event_bytes_max: config.limits.log_event_bytes_per_workflow_max,
                capture_timeout: Duration::from_millis(config.limits.capture_timeout_ms),
                node_files,
                launch_limits: LaunchLimits {
                    max_workflows: config.limits.max_workflows,
                    max_workflows_per_owner: config.limits.max_workflows_per_owner,
                },
                slots_max: config.limits.max_active_children,
                slots_per_user_max: config.limits.active_children_per_user(),
                slots_reserved: config.limits.active_children_reserved,
                stored_bytes_max: config.limits.user_stored_bytes_max,
                retry_copy_bytes_max: config.limits.retry_copy_bytes_max,
                event_bounds: store::EventBounds {
                    untaken_max: i64::try_from(config.limits.untaken_events_per_workflow_max)
                        .unwrap_or(i64::MAX),
                    untaken_bytes_max: i64::try_from(
                        config.limits.untaken_event_bytes_per_workflow_max,
                    )
                    .unwrap_or(i64::MAX),
                },
                lease_ms,
                timeout_seconds: config.limits.timeout_seconds,
                automatic_recovery: config.recovery == crate::config::Recovery::Automatic,
                faults: fault_dir.map(actors::FaultPoints::new),
                wake_fallback: Duration::from_millis(config.wake_fallback_ms),
                dormant_after: (config.dormant_after_ms > 0)
                    .then(|| Duration::from_millis(config.dormant_after_ms)),
            },
            js_memory_total_bytes: config.limits.js_memory_total_bytes,
            js_compiled_scripts_max: usize::try_from(config.limits.js_compiled_scripts_max)
                .unwrap_or(usize::MAX),
            notify: checked.notify,
            ..NodeOptions::new(runs, Arc::new(checked.agents))
        },
    )
    .await
    .context("cannot start the node")?;

    let worker_id = node.identity().worker_id.clone();
    tracing::info!(
        %worker_id,
        %listen,
        backend = ?checked.database.backend(),
        schema_version = migrated.version,
        applied = ?migrated.applied,
        "node ready"
    );
    println!(
        "reins {} listening on http://{} (node {worker_id}, {})",
        env!("CARGO_PKG_VERSION"),
        listen,
        describe(&checked.database)
    );
    // The first-time hint only while it is true: once any user exists, `init` is refused.
    let no_user_yet = node
        .store()
        .list_users()
        .await
        .is_ok_and(|users| users.is_empty());
    if no_user_yet {
        println!(
            "first time? create the admin: reins init --url http://{listen} --email you@example.com"
        );
    } else {
        println!("sign in: reins login --url http://{listen} --email you@example.com");
    }
    println!(
        "then: reins run script.js --wait   (API description: http://{listen}/api/v1/openapi.json)"
    );

    let state = Arc::new(AppState::new(
        node,
        &secret,
        config.http.clone(),
        config.auth.clone(),
        config.events.clone(),
        &config.limits,
    ));
    // Watched before the first request can be answered: a node that has said it is ready
    // drains on SIGTERM, never dies of the signal's default action (which a supervisor that
    // stops it as soon as it is ready, as the tests do, would meet under load).
    let mut terminate = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot watch SIGINT")?;
    let (stop, stopping) = watch::channel(false);
    let drain_timeout = Duration::from_millis(config.shutdown.drain_timeout_ms);
    let (admin_listener, admin_socket) = admin::bind(&admin_path)?;
    let admin_server = tokio::spawn(admin::serve(
        admin_listener,
        Arc::new(admin::AdminContext {
            app: Arc::clone(&state),
            config: config.redacted(),
            max_active_children: config.limits.max_active_children,
            backup_timeout: Duration::from_millis(config.store.call_timeout_ms)
                + Duration::from_secs(5),
        }),
        stopping.clone(),
    ));
    let server = tokio::spawn(http::serve(
        listener,
        Arc::clone(&state),
        stopping,
        drain_timeout,
    ));

    tokio::select! {
        _ = terminate.recv() => tracing::info!("SIGTERM: draining"),
        _ = interrupt.recv() => tracing::info!("interrupt: draining"),
    }
    state.draining.store(true, Ordering::SeqCst);
    state.node.workflows().drain();
    let grace = Duration::from_millis(config.shutdown.drain_grace_ms);
    if !grace.is_zero() {
        tracing::info!(
            grace_ms = config.shutdown.drain_grace_ms,
            "draining: still serving"
        );
        tokio::time::sleep(grace).await;
    }
    // Waiting requests answer now rather than be cut off with their connections.
    state.stop_waiters();
    // The receiver lives in the server task; if it has ended, there is nothing left to stop.
    let _ = stop.send(true);
    server.await.context("the HTTP server task failed")?;
    admin_server.await.context("the admin socket task failed")?;
    drop(admin_socket);
    let state =
        Arc::into_inner(state).context("a request still holds the node after the drain timeout")?;
    state.node.shutdown().await.context("clean shutdown")?;
    tracing::info!(%worker_id, "stopped");
    Ok(())
}

/// Checks that `command` agents can be confined as configured, with no grant that reaches one of
/// the node's own places, and says in the log what they will be confined by.
fn confine_agents(
    config: &Config,
    database: &DatabaseUrl,
    agents: &actors::agents::AgentRegistry,
    config_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use actors::agents::confinement::{self, Protected};
    let mut protected = vec![
        Protected {
            what: "data_dir",
            path: config.data_dir.clone(),
        },
        Protected {
            what: "workspaces_dir",
            path: config.workspaces_dir(),
        },
        Protected {
            what: "admin_socket",
            path: config.admin_socket(),
        },
    ];
    if let DatabaseUrl::Sqlite(database) = database {
        protected.push(Protected {
            what: "database",
            path: database.clone(),
        });
    }
    if let Some(file) = config_file {
        protected.push(Protected {
            what: "the configuration file",
            path: std::path::absolute(file).unwrap_or_else(|_| file.to_owned()),
        });
    }
    let commands = agents.commands();
    match confinement::check(config.agent_confinement, &commands, &protected)? {
        Some(abi) => tracing::info!(
            agents = commands.len(),
            "command agents are confined: {}",
            confinement::describe(abi)
        ),
        None if !commands.is_empty() => tracing::warn!(
            agents = commands.len(),
            "command agents run unconfined (agent_confinement = \"none\"): they can read and \
             write every file of the node's user, the node's own included"
        ),
        None => {}
    }
    Ok(())
}

/// The node's own files, which no capture may open (see [`actors::node_files`]): those directly
/// in the data folder and in the embedded database's folder, and the configuration file.
fn node_files(
    config: &Config,
    database: &DatabaseUrl,
    config_file: Option<&std::path::Path>,
) -> actors::node_files::NodeFiles {
    let mut folders = vec![config.data_dir.clone()];
    if let DatabaseUrl::Sqlite(path) = database {
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
        folders.push(folder.unwrap_or(std::path::Path::new(".")).to_path_buf());
    }
    actors::node_files::NodeFiles::new(folders, config_file.into_iter().map(Into::into).collect())
}

/// The folder of the test hooks (`REINS_FAULT_DIR`): the fault points a test arms, and the
/// files the scripted agent's `hold_while` waits on. Only a build with the `fault-points`
/// feature reads it (the test suite's: `cargo build --workspace --bins`); any other build
/// refuses to start when it is set, rather than run without what a test asked for.
fn fault_dir() -> anyhow::Result<Option<PathBuf>> {
    let dir = std::env::var_os("REINS_FAULT_DIR").map(PathBuf::from);
    if dir.is_some() && !cfg!(feature = "fault-points") {
        anyhow::bail!(
            "REINS_FAULT_DIR is set, but this build has no fault points: they are for the test \
             suite's build (`cargo build --workspace --bins`, whose tests crate asks for the \
             `fault-points` feature)"
        );
    }
    Ok(dir)
}

/// The value of the test hook `variable` (a whole number), if it is set. Refused, as
/// `REINS_FAULT_DIR` is, by a build without the `fault-points` feature.
fn test_hook<T: std::str::FromStr>(variable: &str) -> anyhow::Result<Option<T>> {
    let Some(value) = std::env::var_os(variable) else {
        return Ok(None);
    };
    if !cfg!(feature = "fault-points") {
        anyhow::bail!(
            "{variable} is set, but this build has no fault points (the test suite's build has \
             them)"
        );
    }
    value
        .to_str()
        .and_then(|value| value.parse().ok())
        .map(Some)
        .ok_or_else(|| anyhow::anyhow!("{variable} is not a whole number of ms"))
}

/// The test hooks of a node's timing: `REINS_FAULT_CLOCK_SKEW_MS`, this node's own clock read
/// this many ms off, as a host whose clock is wrong would read it (timers must follow the
/// database's clock, not it); `REINS_FAULT_WAITER_POLL_MS`, every request that waits (`?wait=`)
/// also reads its workflow again this often, as a waiter that polls would (the planted mutant
/// of the quiet-period test).
fn timing_hooks() -> anyhow::Result<()> {
    if let Some(skew) = test_hook::<i64>("REINS_FAULT_CLOCK_SKEW_MS")? {
        actors::skew_for_tests(skew);
    }
    if let Some(poll) = test_hook::<u64>("REINS_FAULT_WAITER_POLL_MS")? {
        http::wait::poll_for_tests(poll);
    }
    Ok(())
}

/// The embedded default's secret when none is configured: made once, kept in `<data_dir>/secret`
/// (mode 0600) so that sessions survive a restart. A cluster configures one instead.
fn local_secret(data_dir: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join("secret");
    match std::fs::read_to_string(&path) {
        Ok(secret) if secret.trim().len() >= crate::config::SECRET_CHARS_MIN => {
            return Ok(secret.trim().to_owned());
        }
        Ok(_) => anyhow::bail!(
            "{} holds no usable secret; remove it to make a new one",
            path.display()
        ),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", path.display())),
    }
    let secret = http::new_secret().map_err(|e| anyhow::anyhow!("{}", e.message))?;
    private_dir(data_dir)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(secret.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(secret)
}

/// Takes group and other permissions away from the node's own file `file`, if it exists with
/// any.
fn private_file(file: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = match std::fs::metadata(file) {
        Ok(metadata) => metadata.permissions().mode(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", file.display())),
    };
    if mode & 0o077 != 0 {
        let private = mode & 0o700;
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(private))
            .with_context(|| format!("cannot make {} private", file.display()))?;
        tracing::warn!(file = %file.display(), was = format!("{:o}", mode & 0o777),
            now = format!("{private:o}"), "other local users could read this file: made it private");
    }
    Ok(())
}

/// Creates `dir` (and its missing parents) with mode 0700. One that exists is left as it is,
/// with a warning when other users may enter it.
fn private_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{:o}", mode & 0o777),
            "other local users may read the node's files: chmod 700 this folder");
    }
    Ok(())
}

fn describe(database: &DatabaseUrl) -> String {
    match database {
        DatabaseUrl::Sqlite(path) => format!("embedded SQLite at {}", path.display()),
        DatabaseUrl::Postgres(_) => "PostgreSQL".to_owned(),
    }
}

/// Log lines buffered for the writer thread at most; past it, lines are dropped rather than
/// blocking the node.
const LOG_LINES_BUFFERED_MAX: usize = 128 * 1024;

/// Logs go to stderr through a writer thread: a node whose stderr is slow or stuck (a full pipe,
/// a stalled log shipper) must keep renewing its leases, so a log write never blocks a runtime
/// thread. The returned guard flushes on drop.
fn init_logging(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = tracing_subscriber::EnvFilter::try_from_env("REINS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_LINES_BUFFERED_MAX)
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    guard
}
