//! The `reins` command: `reins serve` runs a node; `reins keygen` prints a secret for a cluster;
//! the other commands are the HTTP client a person uses (see `api::cli`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's allocator: a node allocates and frees small objects on every thread
/// (actor messages, journal documents, tasks), and with glibc that was two fifths of the async
/// workers' time in the workflows bench.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "reins",
    version,
    about = "A durable orchestrator for AI-agent workflows",
    after_help = "Exit codes: 0 done; 1 failed; with `run --wait`: 2 the workflow failed or was \
                  cancelled, 3 it waits for a person, 4 it needs reconciliation."
)]
struct Cli {
    #[command(flatten)]
    common: api::cli::Common,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node: the HTTP control plane and the workflows it owns.
    Serve(api::serve::ServeArgs),
    /// Print a new random secret for `secret` (every node of a cluster needs the same one).
    Keygen,
    /// Ask a running node on this host, over its admin socket.
    Admin(api::admin::client::AdminArgs),
    #[command(flatten)]
    Client(api::cli::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
        // A client command piped into `head` should end quietly when the reader goes away,
        // like other Unix tools; a node keeps ignoring SIGPIPE (a closed socket is an error to
        // handle, not a reason to die).
        // SAFETY: setting a signal's disposition to its default before any thread exists.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("reins: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => api::serve::run(args).await.map(|()| 0),
            Command::Keygen => api::http::new_secret()
                .map(|secret| {
                    println!("{secret}");
                    0
                })
                .map_err(|e| anyhow::anyhow!("{}", e.message)),
            Command::Admin(args) => api::admin::client::run(args, cli.common.json).await,
            Command::Client(command) => api::cli::run(cli.common, command).await,
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            eprintln!("reins: {error:#}");
            ExitCode::FAILURE
        }
    }
}
