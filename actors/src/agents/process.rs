//! The operating-system side of a `command` agent: the environment it starts with, the guard
//! that makes it and everything it starts die with its run and with its node, and the records a
//! restarted node uses to kill what a dead one left behind. (What it may reach on disk is
//! [`super::confinement`]'s.)
//!
//! **Environment.** An agent starts with a clean environment: `PATH`, `HOME` and `LANG` (the
//! node's, or safe defaults), `TMPDIR` (its run's temporary folder), then the variables its
//! `env_pass` names (from the node's environment, when set there), then its `env` values, then
//! `REINS_ATTEMPT` (its step's attempt, 1 for the first: the node's word, which no setting
//! overrides).
//! Nothing else of the node's environment (its database URL, its secret, API keys) reaches the
//! program.
//!
//! **Guard.** `PR_SET_PDEATHSIG` alone is not enough to make an agent die with its node: it fires
//! when the *thread* that forked exits (tokio's threads come and go), and it reaches only the
//! process it is set on, while an agent is often a script whose real work runs in its children.
//! So the node's fork becomes a small guard, the leader of the agent's process group, which forks
//! again and lets the second child exec the program. The guard holds the read end of the node's
//! *lifeline*, a pipe whose write end only the node process holds and never writes: when the node
//! dies, for any reason, the kernel closes it, the guard sees the hang-up and kills everything of
//! the run, itself included. While the node lives, the guard ignores SIGTERM, SIGINT and SIGHUP
//! (they are for the program: the node's cancel signals the whole group), waits for the program
//! and ends the way it ended (same exit code or same signal), so the node sees the program's own
//! end. The program has `PR_SET_PDEATHSIG(SIGKILL)` against its guard (a single-threaded process,
//! so the thread caveat does not apply), so killing the guard alone kills it too. The guard runs
//! between fork and exec of a multi-threaded process: only async-signal-safe system calls, no
//! allocation.
//!
//! **Nothing outlives its run.** A process group is easy to leave (`setsid`, `setpgid`, a shell's
//! job control), so the guard is also a *child subreaper*: a descendant whose parent ends is
//! adopted by the guard instead of init, so every process the program started stays below the
//! guard, and the guard lists its children in `/proc/thread-self/children`. When the program
//! ends, or the node pulls the run's *stop line* (a pipe per run whose write end the node drops
//! to stop the run; its death drops it too), the guard winds the run down: SIGTERM to its group
//! and to every child it adopted, the agent's `grace_ms` for them to end, then SIGKILL to each
//! child, layer by layer (a killed child's children are adopted next), until it has no child
//! left; only then does it end. When the lifeline hangs up it skips the grace. Only a guard
//! killed from outside (SIGKILL by someone else; on a kernel below Landlock ABI 6 that may be
//! the agent itself) leaves what left the group to run on: the program still dies, and so does
//! its group at the next start (see Records).
//!
//! **Records.** Each agent's group (the guard's pid and start time, with the node process's own)
//! is written to a file of `<data_dir>/agents/` while it runs. A node that starts kills, before
//! anything is admitted, every group recorded there by a process that is gone (same boot and pid
//! namespace, every member started no earlier than the recorded leader, the leader itself if
//! alive started at the recorded time: a reused pid is never signalled) and removes the records.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use store::RunId;

use super::CommandConfig;

/// `PATH` for an agent when the node has none.
const PATH_DEFAULT: &str = "/usr/local/bin:/usr/bin:/bin";
/// `HOME` for an agent when the node has none.
const HOME_DEFAULT: &str = "/";
/// `LANG` for an agent when the node has none.
const LANG_DEFAULT: &str = "C.UTF-8";

/// How long a starting node waits for a leftover group it killed to be gone.
const LEFTOVER_GONE_WAIT: Duration = Duration::from_secs(2);
const LEFTOVER_POLL: Duration = Duration::from_millis(20);

/// The environment an agent starts with; `tmp` is its run's temporary folder (`TMPDIR`),
/// `attempt` its step's attempt (`REINS_ATTEMPT`), and `node` looks a variable up in the node's
/// environment.
pub(super) fn environment(
    settings: &CommandConfig,
    tmp: &Path,
    attempt: i32,
    node: impl Fn(&str) -> Option<OsString>,
) -> BTreeMap<OsString, OsString> {
    let mut environment = BTreeMap::new();
    for (name, default) in [
        ("PATH", PATH_DEFAULT),
        ("HOME", HOME_DEFAULT),
        ("LANG", LANG_DEFAULT),
    ] {
        let value = node(name).unwrap_or_else(|| default.into());
        environment.insert(OsString::from(name), value);
    }
    environment.insert(OsString::from("TMPDIR"), tmp.as_os_str().to_owned());
    for name in &settings.env_pass {
        if let Some(value) = node(name) {
            environment.insert(OsString::from(name), value);
        }
    }
    for (name, value) in &settings.env {
        environment.insert(OsString::from(name), OsString::from(value));
    }
    environment.insert(
        OsString::from("REINS_ATTEMPT"),
        OsString::from(attempt.to_string()),
    );
    if let Some(path) = environment.get_mut(OsStr::new("PATH")) {
        *path = absolute_entries(path);
    }
    environment
}

/// Why a `program` was refused: a relative path (`bin/agent`) would be looked up from the
/// step's workspace, which agents write, so an agent could choose what the next one runs.
pub(super) fn check_program(program: &Path) -> Result<(), String> {
    let bare = program.components().count() == 1
        && matches!(program.components().next(), Some(Component::Normal(_)));
    if program.is_absolute() || bare {
        return Ok(());
    }
    Err(format!(
        "program {program:?} is a relative path, which would be looked up from the step's \
         workspace: give an absolute path or a bare name found in PATH"
    ))
}

/// `PATH` without its relative entries (`.`, an empty one, `bin`): those would be looked up from
/// the step's workspace, which agents write.
fn absolute_entries(path: &OsStr) -> OsString {
    let entries = std::env::split_paths(path).filter(|entry| entry.is_absolute());
    std::env::join_paths(entries).unwrap_or_default()
}

/// Why an `env` or `env_pass` entry was refused: what the name or value breaks.
pub(super) fn check_environment(settings: &CommandConfig) -> Result<(), String> {
    let names = settings
        .env
        .keys()
        .map(String::as_str)
        .chain(settings.env_pass.iter().map(String::as_str));
    for name in names {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(format!(
                "environment variable name {name:?} is invalid: it must be non-empty, \
                 without '=' or NUL"
            ));
        }
    }
    if let Some((name, _)) = settings.env.iter().find(|(_, value)| value.contains('\0')) {
        return Err(format!(
            "the value of environment variable {name:?} contains NUL"
        ));
    }
    Ok(())
}

/// The node's lifeline: the read end goes to every guard, the write end stays in this process
/// (never written, never closed) so that it closes exactly when the process dies.
struct Lifeline {
    read: RawFd,
    write: RawFd,
}

static LIFELINE: OnceLock<Result<Lifeline, String>> = OnceLock::new();

fn lifeline() -> io::Result<&'static Lifeline> {
    LIFELINE
        .get_or_init(open_lifeline)
        .as_ref()
        .map_err(|message| io::Error::other(message.clone()))
}

fn open_lifeline() -> Result<Lifeline, String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!(
            "cannot make the lifeline pipe: {}",
            io::Error::last_os_error()
        ));
    }
    // Above the standard descriptors, which a guard replaces with the program's pipes.
    let mut moved = [0; 2];
    for (from, to) in fds.iter().zip(moved.iter_mut()) {
        // SAFETY: duplicating a descriptor this function owns; the original is closed after.
        *to = unsafe { libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, 3) };
        // SAFETY: closing a descriptor this function owns and no longer uses.
        unsafe { libc::close(*from) };
        if *to < 0 {
            return Err(format!(
                "cannot move the lifeline pipe: {}",
                io::Error::last_os_error()
            ));
        }
    }
    Ok(Lifeline {
        read: moved[0],
        write: moved[1],
    })
}

/// The wait status of a process killed by SIGKILL (the signal's number in the low bits).
const KILLED: libc::c_int = libc::SIGKILL;
/// How long the guard sleeps at most between two looks for ended processes it adopted (an
/// orphan of the agent's stays a zombie at most this long).
const GUARD_REAP_PERIOD_MS: libc::c_int = 1000;
/// How often a winding-down guard looks whether what it signalled has ended.
const GUARD_STOP_POLL_MS: libc::c_int = 10;
/// The most bytes of `/proc/thread-self/children` one look reads (about 500 pids); a guard with
/// more children kills them over several looks.
const CHILDREN_LIST_BYTES_MAX: usize = 4096;

/// What the node keeps of one guard it is about to start: its end of the run's stop line, and
/// until the program has started, the descriptors the guard and the program need.
pub(super) struct Guard {
    stop_write: OwnedFd,
    stop_read: OwnedFd,
    ruleset: Option<OwnedFd>,
}

/// The node's end of one run's *stop line*, a pipe whose read end only the run's guard holds:
/// pulling it (closing it, which the node's death also does) makes the guard wind the run down
/// (SIGTERM to everything left of it, `grace_ms`, then SIGKILL) and end.
pub(super) struct StopLine(Option<OwnedFd>);

impl StopLine {
    pub(super) fn pull(&mut self) {
        self.0.take();
    }
}

impl Guard {
    /// Called once the program has started: the node's copies of what the guard and the
    /// program needed are closed; the stop line is what remains.
    pub(super) fn started(self) -> StopLine {
        drop(self.stop_read);
        drop(self.ruleset);
        StopLine(Some(self.stop_write))
    }
}

/// `fd` moved above the standard descriptors (which the fork replaces with the program's pipes),
/// close-on-exec.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: duplicating a descriptor this function owns; the copy is owned by the result.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `moved` is a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// Makes the spawned process the guard of the agent's process group (see the module's doc);
/// `ruleset`, when given, is the Landlock ruleset the program's process applies before exec
/// (see [`super::confinement`]). The command must also be given `process_group(0)`.
pub(super) fn guard(
    command: &mut tokio::process::Command,
    grace_ms: u64,
    ruleset: Option<OwnedFd>,
) -> io::Result<Guard> {
    let lifeline = lifeline()?;
    let (read, write) = (lifeline.read, lifeline.write);
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and are owned by nothing else.
    let (stop_read, stop_write) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let stop_read = above_stdio(stop_read)?;
    let ruleset = ruleset.map(above_stdio).transpose()?;
    let stop = stop_read.as_raw_fd();
    let confine = ruleset.as_ref().map_or(-1, |fd| fd.as_raw_fd());
    let grace_ms = i64::try_from(grace_ms).unwrap_or(i64::MAX);
    // SAFETY: the closure runs in the forked child before exec and only makes async-signal-safe
    // system calls on integers it captured by value; it allocates nothing.
    unsafe {
        command.pre_exec(move || become_guard(read, write, stop, confine, grace_ms));
    }
    Ok(Guard {
        stop_write,
        stop_read,
        ruleset,
    })
}

/// Runs in the forked child: forks the program's process and becomes its guard. Returns only in
/// the program's process, confined by `ruleset` when it is a descriptor, which then execs.
///
/// # Safety
/// Only between fork and exec; async-signal-safe calls only.
unsafe fn become_guard(
    lifeline: RawFd,
    lifeline_write: RawFd,
    stop: RawFd,
    ruleset: RawFd,
    grace_ms: i64,
) -> io::Result<()> {
    // SAFETY (whole function): raw system calls on descriptors and pids of this process.
    unsafe {
        libc::close(lifeline_write);
        // Whatever the program starts is the guard's to end: an orphan of the agent's (a
        // double fork, a `setsid` daemon whose parent ended) is adopted by the guard rather
        // than by init, so that the guard can find it and kill it.
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        let guard = libc::getpid();
        let program = libc::fork();
        if program < 0 {
            return Err(io::Error::last_os_error());
        }
        if program == 0 {
            // The program: it must not outlive its guard, whatever kills the guard.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::getppid() != guard {
                libc::_exit(1);
            }
            if ruleset >= 0 {
                super::confinement::restrict_self(ruleset)?;
            }
            return Ok(());
        }
        guard_loop(program, lifeline, stop, grace_ms)
    }
}

/// The guard: waits for the program, for the node's death or for the node to pull the run's
/// stop line, whichever comes first, and leaves nothing of the run behind.
///
/// # Safety
/// Only in the guard process made by [`become_guard`].
unsafe fn guard_loop(program: libc::pid_t, lifeline: RawFd, stop: RawFd, grace_ms: i64) -> ! {
    // SAFETY (whole function): raw system calls on descriptors and pids of this process.
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(signal, libc::SIG_IGN);
        }
        // Nothing of the node stays open in the guard but the lifeline and the stop line: not
        // the program's pipes (their readers must see the program's end), not the node's
        // sockets and files.
        for fd in 0..3 {
            libc::close(fd);
        }
        let (low, high) = (lifeline.min(stop), lifeline.max(stop));
        close_range(3, low - 1);
        close_range(low + 1, high - 1);
        close_range(high + 1, libc::c_int::MAX);
        let pidfd = libc::syscall(libc::SYS_pidfd_open, program, 0) as libc::c_int;
        let mut watched = [
            libc::pollfd {
                fd: lifeline,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: pidfd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // Without pidfd (kernels before 5.3), the program's end is looked for every 50 ms.
        let (count, timeout_ms) = if pidfd >= 0 {
            (3, GUARD_REAP_PERIOD_MS)
        } else {
            (2, 50)
        };
        let mut status = None;
        loop {
            if !reap(program, &mut status) && status.is_none() {
                // The program cannot be waited for (it is not this guard's child any more):
                // nothing is left to guard but its group.
                sweep(program, &mut status);
                libc::kill(0, libc::SIGKILL);
                libc::_exit(127);
            }
            if let Some(ended) = status {
                // What the program left behind gets what a stopped run gets.
                wind_down(program, lifeline, grace_ms, &mut status);
                end_like(ended);
            }
            let ready = libc::poll(watched.as_mut_ptr(), count, timeout_ms);
            if ready > 0 && watched[0].revents != 0 {
                // The node is gone: nothing it started may run on.
                sweep(program, &mut status);
                libc::kill(0, libc::SIGKILL);
                libc::_exit(137);
            }
            if ready > 0 && watched[1].revents != 0 {
                // The node stops the run.
                wind_down(program, lifeline, grace_ms, &mut status);
                end_like(status.unwrap_or(KILLED));
            }
            watched[2].revents = 0;
        }
    }
}

/// Reaps every ended child of the guard (the program's status goes into `status`); `false`
/// when the guard has no child left.
///
/// # Safety
/// Only in the guard process.
unsafe fn reap(program: libc::pid_t, status: &mut Option<libc::c_int>) -> bool {
    // SAFETY: waitpid(2) on this process's children, into a local.
    unsafe {
        loop {
            let mut ended = 0;
            match libc::waitpid(-1, &mut ended, libc::WNOHANG) {
                0 => return true,
                pid if pid == program => *status = Some(ended),
                pid if pid > 0 => {}
                _ if *libc::__errno_location() == libc::EINTR => {}
                _ => return false,
            }
        }
    }
}

/// SIGTERM to everything left of the run (its process group, and what the guard adopted from
/// outside it), `grace_ms` for it to end, then [`sweep`]; sooner if the node dies meanwhile.
///
/// # Safety
/// Only in the guard process (which ignores SIGTERM itself).
unsafe fn wind_down(
    program: libc::pid_t,
    lifeline: RawFd,
    grace_ms: i64,
    status: &mut Option<libc::c_int>,
) {
    // SAFETY (whole function): raw system calls on pids and descriptors of this process.
    unsafe {
        libc::kill(0, libc::SIGTERM);
        signal_children(libc::SIGTERM);
        let deadline = now_ms().saturating_add(grace_ms);
        while reap(program, status) && now_ms() < deadline {
            let mut node = libc::pollfd {
                fd: lifeline,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut node, 1, GUARD_STOP_POLL_MS) > 0 && node.revents != 0 {
                break;
            }
        }
        sweep(program, status);
    }
}

/// SIGKILLs every descendant of the guard and reaps them, layer by layer: each killed child's
/// children are adopted by the guard (a subreaper) and killed in the next round. Gives up only
/// when the guard's children cannot be listed (no `/proc`); then the node's kill of the group
/// is what is left.
///
/// # Safety
/// Only in the guard process.
unsafe fn sweep(program: libc::pid_t, status: &mut Option<libc::c_int>) {
    // SAFETY (whole function): raw system calls on pids of this process.
    unsafe {
        while signal_children(libc::SIGKILL) && reap(program, status) {
            libc::poll(std::ptr::null_mut(), 0, GUARD_STOP_POLL_MS);
        }
    }
}

/// Sends `signal` to every child of the guard, as `/proc/thread-self/children` lists them;
/// `false` if they cannot be listed. Allocates nothing.
///
/// # Safety
/// Only in the guard process (single-threaded, so its thread's children are all of them).
unsafe fn signal_children(signal: libc::c_int) -> bool {
    // SAFETY (whole function): raw system calls on a stack buffer and pids read from the kernel.
    unsafe {
        let fd = libc::open(
            c"/proc/thread-self/children".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let mut list = [0u8; CHILDREN_LIST_BYTES_MAX];
        let read = libc::read(fd, list.as_mut_ptr().cast(), list.len());
        libc::close(fd);
        let Ok(read) = usize::try_from(read) else {
            return false;
        };
        // "pid pid pid ": a number counts once the space after it is read (a full buffer may
        // end inside one; the next look reads it whole).
        let mut pid: libc::pid_t = 0;
        for &byte in &list[..read] {
            if byte.is_ascii_digit() {
                pid = pid
                    .saturating_mul(10)
                    .saturating_add(libc::pid_t::from(byte - b'0'));
            } else {
                if pid > 0 {
                    libc::kill(pid, signal);
                }
                pid = 0;
            }
        }
        true
    }
}

/// The monotonic clock in milliseconds.
///
/// # Safety
/// Async-signal-safe; usable in the guard process.
unsafe fn now_ms() -> i64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes into the local it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec
        .saturating_mul(1000)
        .saturating_add(now.tv_nsec / 1_000_000)
}

/// Closes descriptors `first..=last`, if any.
///
/// # Safety
/// Only in the guard process.
unsafe fn close_range(first: libc::c_int, last: libc::c_int) {
    if first > last {
        return;
    }
    // SAFETY: closing descriptors of this process; nothing uses them after.
    unsafe {
        if libc::syscall(libc::SYS_close_range, first, last, 0) != 0 {
            let limit = libc::sysconf(libc::_SC_OPEN_MAX).clamp(1024, 65536) as libc::c_int;
            for fd in first..=last.min(limit) {
                libc::close(fd);
            }
        }
    }
}

/// Ends the guard the way the program ended: its exit code, or its signal (without a core).
///
/// # Safety
/// Only in the guard process.
unsafe fn end_like(status: libc::c_int) -> ! {
    // SAFETY: resetting this process's own limits and dispositions, then ending it.
    unsafe {
        if libc::WIFSIGNALED(status) {
            let signal = libc::WTERMSIG(status);
            let no_core = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &no_core);
            libc::signal(signal, libc::SIG_DFL);
            libc::kill(libc::getpid(), signal);
            libc::_exit(128 + signal);
        }
        libc::_exit(libc::WEXITSTATUS(status));
    }
}

/// One agent group as recorded in a file of the records folder.
#[derive(Debug, Clone, PartialEq)]
struct Record {
    /// The node process that started it, and when (so a live node's records are left alone).
    owner_pid: i32,
    owner_started: u64,
    /// The group (the guard's pid) and when its leader started, in clock ticks since boot.
    group: i32,
    leader_started: u64,
    /// The boot and the pid namespace these pids belong to (see [`pid_space`]).
    pid_space: String,
}

impl Record {
    fn encode(&self) -> String {
        format!(
            "{} {} {} {} {}\n",
            self.owner_pid, self.owner_started, self.group, self.leader_started, self.pid_space
        )
    }

    fn decode(text: &str) -> Option<Record> {
        let mut parts = text.split_whitespace();
        let record = Record {
            owner_pid: parts.next()?.parse().ok()?,
            owner_started: parts.next()?.parse().ok()?,
            group: parts.next()?.parse().ok()?,
            leader_started: parts.next()?.parse().ok()?,
            pid_space: parts.next()?.to_owned(),
        };
        parts.next().is_none().then_some(record)
    }
}

/// What `/proc/PID/stat` says of a process: its group and its start time, and whether it has
/// ended and waits to be reaped.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Stat {
    group: i32,
    started: u64,
    zombie: bool,
}

fn parse_stat(text: &str) -> Option<Stat> {
    // The command name (field 2) may hold anything, parentheses included: fields are counted
    // after its last ')'. There, index 0 is the state (field 3), 2 the group (field 5) and 19
    // the start time (field 22).
    let fields: Vec<&str> = text
        .get(text.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    Some(Stat {
        group: fields.get(2)?.parse().ok()?,
        started: fields.get(19)?.parse().ok()?,
        zombie: *fields.first()? == "Z",
    })
}

fn stat_of(pid: i32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// What the pids of this process belong to: this boot of the kernel and this pid namespace. A
/// pid recorded under another (before a reboot, in a container since restarted) names nothing
/// here, whatever runs under it now.
fn pid_space() -> io::Result<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")?;
    let namespace = std::fs::read_link("/proc/self/ns/pid")?;
    Ok(format!("{}/{}", boot.trim(), namespace.display()).replace(char::is_whitespace, ""))
}

/// Where this node keeps the records of its agents' groups.
#[derive(Debug, Clone)]
pub struct ProcessRecords {
    dir: PathBuf,
}

/// An agent group left by a node that is gone, killed by a starting node.
#[derive(Debug, Clone, PartialEq)]
pub struct Leftover {
    pub run_id: RunId,
    pub group: i32,
    /// How many of its processes were alive.
    pub processes: usize,
}

impl ProcessRecords {
    pub fn new(dir: PathBuf) -> Self {
        ProcessRecords { dir }
    }

    fn path(&self, run_id: &RunId) -> PathBuf {
        self.dir.join(run_id.as_str())
    }

    /// Records the group `group` of run `run_id`; `false` if its leader has already ended (the
    /// agent then cleans up its group itself, and nothing is left to record).
    pub(super) async fn record(&self, run_id: &RunId, group: i32) -> io::Result<bool> {
        let own_pid = i32::try_from(std::process::id()).map_err(io::Error::other)?;
        let Some(leader) = stat_of(group) else {
            return Ok(false);
        };
        let owner = stat_of(own_pid).ok_or_else(|| io::Error::other("cannot read /proc/self"))?;
        let record = Record {
            owner_pid: own_pid,
            owner_started: owner.started,
            group,
            leader_started: leader.started,
            pid_space: pid_space()?,
        };
        tokio::fs::write(self.path(run_id), record.encode()).await?;
        Ok(true)
    }

    /// Forgets run `run_id`'s group once nothing of it runs.
    pub(super) async fn forget(&self, run_id: &RunId) {
        if let Err(error) = tokio::fs::remove_file(self.path(run_id)).await
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(%run_id, %error, "cannot remove the agent's process record");
        }
    }

    /// Kills every recorded group whose node process is gone and removes its record; waits (a
    /// little) until those groups are gone. Called once as a node starts, before it admits
    /// anything. Creates the folder (mode 0700) if it is missing.
    pub fn kill_leftovers(&self) -> io::Result<Vec<Leftover>> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let space = pid_space()?;
        let mut killed = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let run_id = RunId::new(entry.file_name().to_string_lossy());
            let record = std::fs::read_to_string(entry.path())
                .ok()
                .and_then(|text| Record::decode(&text));
            if let Some(record) = &record {
                let owner_alive = stat_of(record.owner_pid)
                    .is_some_and(|owner| owner.started == record.owner_started);
                if owner_alive && record.pid_space == space {
                    continue;
                }
                if record.pid_space == space {
                    let processes = kill_group_if_ours(record);
                    if processes > 0 {
                        killed.push(Leftover {
                            run_id,
                            group: record.group,
                            processes,
                        });
                    }
                }
            }
            std::fs::remove_file(entry.path())?;
        }
        let deadline = Instant::now() + LEFTOVER_GONE_WAIT;
        while killed.iter().any(|leftover| group_exists(leftover.group))
            && Instant::now() < deadline
        {
            std::thread::sleep(LEFTOVER_POLL);
        }
        Ok(killed)
    }
}

/// The pids and start times of the processes in group `group` that have not ended.
fn members(group: i32) -> Vec<(i32, Stat)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, stat_of(pid)?)))
        .filter(|(_, stat)| stat.group == group && !stat.zombie)
        .collect()
}

/// SIGKILLs the recorded group if what runs under its id is the group that was recorded: its
/// leader (if still alive) started at the recorded time, and no member started before it (a
/// group id is a pid, and a pid is reused only once nothing holds it). Returns how many
/// processes it signalled.
fn kill_group_if_ours(record: &Record) -> usize {
    let members = members(record.group);
    let ours = members.iter().all(|(pid, stat)| {
        stat.started >= record.leader_started
            && (*pid != record.group || stat.started == record.leader_started)
    });
    if !ours || members.is_empty() {
        return 0;
    }
    // SAFETY: kill(2) on a process group checked above; no memory is involved.
    unsafe { libc::kill(-record.group, libc::SIGKILL) };
    members.len()
}

fn group_exists(group: i32) -> bool {
    !members(group).is_empty()
}

/// Where a node keeps its agents' records, under its data folder.
pub fn records_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("agents")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(env: &[(&str, &str)], env_pass: &[&str]) -> CommandConfig {
        CommandConfig {
            name: "a".into(),
            program: "/bin/true".into(),
            args: vec![],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            env_pass: env_pass.iter().map(|s| s.to_string()).collect(),
            read_paths: vec![],
            write_paths: vec![],
            grace_ms: 1,
            line_bytes_max: 1,
            output_bytes_max: 1,
            stderr_tail_bytes: 1,
            retry: Default::default(),
            timeout: Default::default(),
            idempotent: false,
        }
    }

    #[test]
    fn an_agent_sees_only_the_base_variables_and_what_its_config_names() {
        let node = |name: &str| match name {
            "PATH" => Some(OsString::from("/node/bin")),
            "REINS_SECRET" => Some("s3cret".into()),
            "PASSED" => Some("from-node".into()),
            "BOTH" => Some("node".into()),
            _ => None,
        };
        let got = environment(
            &config(
                &[
                    ("GREETING", "hi"),
                    ("BOTH", "config"),
                    ("REINS_ATTEMPT", "9"),
                ],
                &["PASSED", "BOTH", "UNSET"],
            ),
            Path::new("/ws/t/tmp"),
            2,
            node,
        );
        let expected: BTreeMap<OsString, OsString> = [
            ("BOTH", "config"),
            ("GREETING", "hi"),
            ("HOME", HOME_DEFAULT),
            ("LANG", LANG_DEFAULT),
            ("PASSED", "from-node"),
            ("PATH", "/node/bin"),
            ("REINS_ATTEMPT", "2"),
            ("TMPDIR", "/ws/t/tmp"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn a_program_is_an_absolute_path_or_a_bare_name() {
        for good in ["/usr/bin/agent", "agent", "my-agent.sh"] {
            assert_eq!(check_program(Path::new(good)), Ok(()), "{good}");
        }
        for bad in ["bin/agent", "./agent", "../agent", "", ".", ".."] {
            let refused = check_program(Path::new(bad));
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|e| e.contains("looked up from the step's workspace")),
                "{bad}: {refused:?}"
            );
        }
    }

    #[test]
    fn the_programs_path_keeps_only_absolute_entries() {
        let settings = |env: &[(&str, &str)]| config(env, &[]);
        let path_of = |settings: &CommandConfig, node: &'static str| {
            environment(settings, Path::new("/tmp"), 1, |name| {
                (name == "PATH").then(|| node.into())
            })
            .get(OsStr::new("PATH"))
            .cloned()
        };
        assert_eq!(
            path_of(&settings(&[]), ".:/usr/bin::bin:/bin"),
            Some(OsString::from("/usr/bin:/bin"))
        );
        assert_eq!(
            path_of(&settings(&[("PATH", "tools:/opt/x/bin")]), "/usr/bin"),
            Some(OsString::from("/opt/x/bin"))
        );
    }

    #[test]
    fn environment_names_are_checked() {
        assert!(check_environment(&config(&[("OK_1", "x")], &["ALSO"])).is_ok());
        for bad in [
            config(&[("A=B", "x")], &[]),
            config(&[], &[""]),
            config(&[("A", "\0")], &[]),
        ] {
            assert!(check_environment(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let text = "4242 (a) b (c)) S 1 4240 4240 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                group: 4240,
                started: 98765,
                zombie: false,
            })
        );
        let own = stat_of(i32::try_from(std::process::id()).expect("pid")).expect("own stat");
        assert!(own.started > 0);
    }

    /// A process group of its own running `sleep`, killed when dropped.
    struct Sleeper(std::process::Child);

    impl Sleeper {
        fn start() -> Sleeper {
            use std::os::unix::process::CommandExt;
            let child = std::process::Command::new("sleep")
                .arg("30")
                .process_group(0)
                .spawn()
                .expect("sleep");
            Sleeper(child)
        }

        fn group(&self) -> i32 {
            i32::try_from(self.0.id()).expect("pid")
        }

        fn alive(&mut self) -> bool {
            matches!(self.0.try_wait(), Ok(None))
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn write_record(dir: &Path, run_id: &RunId, record: &Record) {
        std::fs::write(dir.join(run_id.as_str()), record.encode()).expect("record");
    }

    #[test]
    fn leftovers_of_a_gone_node_are_killed_and_nothing_else() {
        let dir = tempfile::tempdir().expect("temp dir");
        let records = ProcessRecords::new(dir.path().to_path_buf());
        let own_pid = i32::try_from(std::process::id()).expect("pid");
        let own = stat_of(own_pid).expect("own stat");
        let space = pid_space().expect("pid space");
        let (mut gone, mut live, mut reused, mut elsewhere) = (
            Sleeper::start(),
            Sleeper::start(),
            Sleeper::start(),
            Sleeper::start(),
        );
        let record = |group: i32, owner_started: u64, leader_started: u64| Record {
            owner_pid: own_pid,
            owner_started,
            group,
            leader_started,
            pid_space: space.clone(),
        };
        let started = |sleeper: &Sleeper| stat_of(sleeper.group()).expect("stat").started;
        // A node process that is gone (same pid, another start time) left `gone`.
        write_record(
            dir.path(),
            &RunId::from("gone"),
            &record(gone.group(), own.started + 1, started(&gone)),
        );
        // This live process owns `live`.
        write_record(
            dir.path(),
            &RunId::from("live"),
            &record(live.group(), own.started, started(&live)),
        );
        // The recorded leader started earlier than what now runs under its pid: a reused pid.
        let earlier = started(&reused) - 1;
        write_record(
            dir.path(),
            &RunId::from("reused"),
            &record(reused.group(), own.started + 1, earlier),
        );
        // Recorded in another pid namespace (or before a reboot): its pids name nothing here.
        let other_space = Record {
            pid_space: "another-boot/pid:[1]".into(),
            ..record(elsewhere.group(), own.started + 1, started(&elsewhere))
        };
        write_record(dir.path(), &RunId::from("elsewhere"), &other_space);

        let killed = records.kill_leftovers().expect("kill leftovers");
        assert_eq!(
            killed,
            vec![Leftover {
                run_id: "gone".into(),
                group: gone.group(),
                processes: 1
            }]
        );
        assert!(!gone.alive() && live.alive() && reused.alive() && elsewhere.alive());
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|entry| {
                entry
                    .expect("entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        left.sort();
        assert_eq!(left, vec!["live".to_owned()]);
    }

    #[test]
    fn records_round_trip() {
        let record = Record {
            owner_pid: 1,
            owner_started: 2,
            group: 3,
            leader_started: 4,
            pid_space: "b".into(),
        };
        assert_eq!(Record::decode(&record.encode()), Some(record));
        assert_eq!(Record::decode("1 2 3"), None);
    }
}
