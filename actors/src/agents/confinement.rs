//! What a `command` agent may reach on the node's host. An agent runs as the node's user, so
//! without more the node's files (its database, its signing secret, its admin socket, the other
//! threads' workspaces, the configuration file) would be its files too. reins confines every
//! `command` agent with Landlock (the kernel's unprivileged sandbox, through the `landlock`
//! crate of its maintainers); `agent_confinement = "none"` in the configuration turns that off.
//!
//! **Rules.** The ruleset is built in the node for each run, before the fork, and the program's
//! process only applies it (`landlock_restrict_self`) between fork and exec, after setting
//! `no_new_privs` and emptying its capability sets (a node run as root must not hand root's
//! capabilities to its agents). What the agent may do, and nothing else:
//! - everything beneath its run's workspace (`<workspaces_dir>/<thread>/user-data`, its working
//!   folder) and its run's temporary folder (`<workspaces_dir>/<thread>/tmp`, its `TMPDIR`,
//!   emptied when the run ends);
//! - read and execute beneath the system's folders [`SYSTEM_READ_DIRS`], the few files of `/etc`
//!   that name resolution, TLS and the dynamic loader read ([`SYSTEM_READ_FILES`]: not `/etc`
//!   itself, which may hold the node's configuration), and its own program file;
//! - read `/dev/null`, `/dev/zero`, `/dev/full`, `/dev/random`, `/dev/urandom`, and write the
//!   first three;
//! - what its agent's `read_paths` (read and execute) and `write_paths` (everything) name.
//!
//! `/proc` is not granted: another process's `/proc/<pid>/` cannot be opened or listed (and
//! Landlock refuses ptrace-like access to processes outside the sandbox even where `/proc` is
//! granted). Hard links and renames out of a granted folder into the workspace are refused
//! (`EXDEV`, Landlock's `REFER` rule): a link may not give a file rights it lacks where it is.
//!
//! **Scopes.** On Landlock ABI 6 and later the agent cannot signal a process outside its
//! sandbox (the node, its guard, other agents) nor connect to an abstract Unix socket made
//! outside it; on ABI 9 and later it cannot connect to a pathname Unix socket it was not granted
//! (the admin socket, a local PostgreSQL's socket).
//!
//! **ABI levels.** ABI 3 (Linux 6.2) is the least a node accepts for `agent_confinement =
//! "landlock"`: reading, writing, making and removing files are confined from ABI 1, but before
//! ABI 3 `truncate(2)` of any path is allowed, so an agent could empty the database. Later
//! rights are used when the kernel has them (best effort): device ioctls (5), signal and
//! abstract-socket scopes (6), pathname Unix sockets (9). A node whose kernel is below ABI 3
//! refuses to start when it has `command` agents, naming `agent_confinement` (see
//! [`ConfinementError::Unavailable`]).
//!
//! **What Landlock leaves visible** (documented in `docs/operating.md`, "Security model"): the
//! metadata of any path whose name the agent knows (`stat`, and `chmod`, `chown`, `utime`,
//! extended attributes: Landlock governs none of these before a future ABI), connecting to
//! pathname Unix sockets before ABI 9, signals before ABI 6, and the network.

use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use serde::{Deserialize, Serialize};

use super::CommandConfig;

/// How a node confines its `command` agents (the configuration's `agent_confinement`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfinementMode {
    /// Landlock, ABI 3 or later, or the node refuses to start with `command` agents.
    #[default]
    Landlock,
    /// No confinement: an agent can read and write everything the node's user can, the node's
    /// own files included. Only for a kernel without Landlock, knowingly.
    None,
}

/// The least Landlock ABI a confined node accepts (see the module's doc).
pub const LANDLOCK_ABI_MIN: ABI = ABI::V3;
/// The newest Landlock ABI whose rights reins asks for (when the kernel has them).
const LANDLOCK_ABI_USED: ABI = ABI::V9;
/// The scopes reins asks for (signals, abstract Unix sockets), from ABI 6.
const LANDLOCK_SCOPE_ABI: ABI = ABI::V6;

/// Folders every confined agent may read and execute beneath (those missing on a host are
/// skipped).
pub const SYSTEM_READ_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Files and folders of `/etc` every confined agent may read: the dynamic loader's cache, user
/// and host name resolution, time zones, TLS roots. Not `/etc` itself: the node's configuration
/// file (with its database URL and maybe its secret) usually lives there.
pub const SYSTEM_READ_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/resolv.conf",
    "/etc/gai.conf",
    "/etc/services",
    "/etc/protocols",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/mime.types",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/pki",
    "/etc/crypto-policies",
    "/etc/alternatives",
];

/// Devices every confined agent may read.
const DEVICES_READ: &[&str] = &["/dev/random", "/dev/urandom", "/dev/zero"];
/// Devices every confined agent may also write (and truncate: a shell's `>` opens with
/// `O_TRUNC`).
const DEVICES_WRITE: &[&str] = &["/dev/null", "/dev/full"];

/// Why agents cannot be confined as configured.
#[derive(Debug, thiserror::Error)]
pub enum ConfinementError {
    #[error(
        "this kernel cannot confine `command` agents: Landlock is {status} (ABI 3, Linux 6.2, \
         or later is needed); unconfined, an agent could read and write the node's own files. \
         Set `agent_confinement = \"none\"` to run them unconfined anyway"
    )]
    Unavailable { status: String },
    #[error(
        "{what} {protected:?} lies beneath {grant:?}, which every `command` agent may read: \
         move it out of the system's folders"
    )]
    SystemGrant {
        what: &'static str,
        protected: PathBuf,
        grant: PathBuf,
    },
    #[error("agent {agent:?}: `{key}` entry {grant:?} {relation} {what} {protected:?}")]
    AgentGrant {
        agent: String,
        key: &'static str,
        grant: PathBuf,
        relation: &'static str,
        what: &'static str,
        protected: PathBuf,
    },
    #[error("agent {agent:?}: `{key}` entry {grant:?} is not an absolute path")]
    Relative {
        agent: String,
        key: &'static str,
        grant: PathBuf,
    },
    #[error("cannot confine the agent: {0}")]
    Ruleset(String),
}

/// One of the node's own places no agent may reach, and what it is (for messages).
#[derive(Debug, Clone)]
pub struct Protected {
    pub what: &'static str,
    pub path: PathBuf,
}

/// The Landlock ABI of the running kernel, for the log: `Err` says why there is none.
pub fn kernel_abi() -> Result<i32, String> {
    // SAFETY: with a null attribute, size 0 and LANDLOCK_CREATE_RULESET_VERSION the call only
    // returns the ABI version (or an error); no memory is read or written.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if version > 0 {
        return i32::try_from(version).map_err(|e| e.to_string());
    }
    Err(match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EOPNOTSUPP) => "built in but not enabled (add it to the `lsm=` boot option)",
        _ => "not built into this kernel",
    }
    .to_owned())
}

/// What Landlock confines on a kernel of ABI `abi`, in words, for the node's log.
pub fn describe(abi: i32) -> String {
    let mut covered = vec!["files (read, write, execute, links, truncation)"];
    if abi >= 5 {
        covered.push("device ioctls");
    }
    if abi >= 6 {
        covered.push("signals and abstract Unix sockets outside the sandbox");
    }
    if abi >= 9 {
        covered.push("pathname Unix sockets");
    }
    let mut open = Vec::new();
    if abi < 6 {
        open.push("signals to the node's processes");
    }
    if abi < 9 {
        open.push("connecting to pathname Unix sockets");
    }
    let open = if open.is_empty() {
        String::new()
    } else {
        format!("; not confined on this kernel: {}", open.join(", "))
    };
    format!("Landlock ABI {abi}: {}{open}", covered.join(", "))
}

/// Checks, once as the node starts, that agents can be confined as `mode` asks and that no
/// grant reaches a `protected` place: `Ok(Some(abi))` when they will be confined, `Ok(None)`
/// when they will not (no `command` agent, or `mode` is `None`).
pub fn check(
    mode: ConfinementMode,
    agents: &[&CommandConfig],
    protected: &[Protected],
) -> Result<Option<i32>, ConfinementError> {
    if mode == ConfinementMode::None || agents.is_empty() {
        return Ok(None);
    }
    check_grants(agents, protected)?;
    let abi = kernel_abi().map_err(|status| ConfinementError::Unavailable { status })?;
    if abi < LANDLOCK_ABI_MIN as i32 {
        return Err(ConfinementError::Unavailable {
            status: format!("at ABI {abi}"),
        });
    }
    Ok(Some(abi))
}

/// Refuses a node place beneath the system's grants, and an agent's grant that holds a node
/// place or lies inside one.
fn check_grants(
    agents: &[&CommandConfig],
    protected: &[Protected],
) -> Result<(), ConfinementError> {
    let protected: Vec<(&'static str, PathBuf)> =
        protected.iter().map(|p| (p.what, real(&p.path))).collect();
    let system = SYSTEM_READ_DIRS.iter().chain(SYSTEM_READ_FILES);
    for grant in system.map(|grant| real(Path::new(grant))) {
        if let Some((what, path)) = protected.iter().find(|(_, path)| path.starts_with(&grant)) {
            return Err(ConfinementError::SystemGrant {
                what,
                protected: path.clone(),
                grant,
            });
        }
    }
    for agent in agents {
        let keys = [
            ("read_paths", &agent.read_paths),
            ("write_paths", &agent.write_paths),
        ];
        for (key, grants) in keys {
            for grant in grants {
                check_grant(agent, key, grant, &protected)?;
            }
        }
    }
    Ok(())
}

fn check_grant(
    agent: &CommandConfig,
    key: &'static str,
    grant: &Path,
    protected: &[(&'static str, PathBuf)],
) -> Result<(), ConfinementError> {
    if !grant.is_absolute() {
        return Err(ConfinementError::Relative {
            agent: agent.name.clone(),
            key,
            grant: grant.to_owned(),
        });
    }
    let real_grant = real(grant);
    for (what, path) in protected {
        let relation = if path.starts_with(&real_grant) {
            "holds"
        } else if real_grant.starts_with(path) {
            "lies inside"
        } else {
            continue;
        };
        return Err(ConfinementError::AgentGrant {
            agent: agent.name.clone(),
            key,
            grant: grant.to_owned(),
            relation,
            what,
            protected: path.clone(),
        });
    }
    Ok(())
}

/// `path` with its symlinks resolved where it exists (a grant follows them), else made absolute
/// (a relative `data_dir` and a socket not bound yet must still compare with absolute grants).
fn real(path: &Path) -> PathBuf {
    path.canonicalize()
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_owned())
}

/// One run's places: what its ruleset grants besides the system's.
pub(super) struct RunPlaces<'a> {
    /// The program as it will be executed (resolved in `PATH` when a bare name).
    pub program: Option<PathBuf>,
    pub workspace: &'a Path,
    pub tmp: &'a Path,
}

/// Builds the Landlock ruleset of one run (blocking: it opens every granted path) and returns
/// its descriptor, which the program's process applies before exec.
pub(super) fn ruleset(
    settings: &CommandConfig,
    places: &RunPlaces<'_>,
) -> Result<OwnedFd, ConfinementError> {
    let failed = |e: &dyn std::fmt::Display| ConfinementError::Ruleset(e.to_string());
    let all = AccessFs::from_all(LANDLOCK_ABI_USED);
    let read = AccessFs::from_read(LANDLOCK_ABI_USED);
    let device_write = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(LANDLOCK_ABI_MIN))
        .map_err(|e| failed(&e))?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(all)
        .map_err(|e| failed(&e))?
        .scope(Scope::from_all(LANDLOCK_SCOPE_ABI))
        .map_err(|e| failed(&e))?
        .create()
        .map_err(|e| failed(&e))?;
    // The system's places: skipped where this host has none.
    let system = SYSTEM_READ_DIRS
        .iter()
        .chain(SYSTEM_READ_FILES)
        .chain(DEVICES_READ)
        .map(|path| (*path, read))
        .chain(DEVICES_WRITE.iter().map(|path| (*path, device_write)));
    for (path, access) in system {
        if let Ok(fd) = PathFd::new(path) {
            ruleset = ruleset
                .add_rule(PathBeneath::new(fd, access))
                .map_err(|e| failed(&e))?;
        }
    }
    // What this run needs: each must exist.
    let mut granted: Vec<(&Path, landlock::BitFlags<AccessFs>)> =
        vec![(places.workspace, all), (places.tmp, all)];
    if let Some(program) = &places.program {
        granted.push((program, read));
    }
    granted.extend(
        settings
            .read_paths
            .iter()
            .map(|path| (path.as_path(), read)),
    );
    granted.extend(
        settings
            .write_paths
            .iter()
            .map(|path| (path.as_path(), all)),
    );
    for (path, access) in granted {
        let fd = PathFd::new(path).map_err(|e| failed(&e))?;
        ruleset = ruleset
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|e| failed(&e))?;
    }
    let fd: Option<OwnedFd> = ruleset.into();
    fd.ok_or_else(|| ConfinementError::Ruleset("this kernel has no Landlock".into()))
}

/// Where a bare program name is found in the agent's `PATH` (the first regular file); an
/// absolute program as it is.
pub(super) fn program_path(
    program: &Path,
    path_variable: Option<&std::ffi::OsStr>,
) -> Option<PathBuf> {
    if program.is_absolute() {
        return Some(program.to_owned());
    }
    std::env::split_paths(path_variable?)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Applies ruleset `ruleset` to this process: no new privileges, no capabilities, then
/// Landlock. Returns the failed call's error.
///
/// # Safety
/// Only between fork and exec, in the program's process: async-signal-safe system calls only,
/// nothing allocated.
pub(super) unsafe fn restrict_self(ruleset: RawFd) -> std::io::Result<()> {
    // SAFETY (whole function): raw system calls on integers and on stack memory of this frame.
    unsafe {
        // The capability bounding set first (that needs CAP_SETPCAP; a node without it has no
        // capability to hand down anyway), so that no exec can give any back.
        for capability in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let none = [CapData::default(); 2];
        if libc::syscall(libc::SYS_capset, &header, none.as_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit capability sets in two halves.
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// `struct __user_cap_header_struct` of `capset(2)`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct` of `capset(2)`: one half of each set.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(read: &[&str], write: &[&str]) -> CommandConfig {
        CommandConfig {
            name: "a".into(),
            program: "/bin/true".into(),
            args: vec![],
            env: Default::default(),
            env_pass: vec![],
            read_paths: read.iter().map(PathBuf::from).collect(),
            write_paths: write.iter().map(PathBuf::from).collect(),
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
    fn a_grant_that_holds_or_lies_inside_a_node_place_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("workspaces")).expect("mkdir");
        let protected = [Protected {
            what: "data_dir",
            path: data.clone(),
        }];
        let check = |agent: &CommandConfig| check_grants(&[agent], &protected);
        let fine = agent(
            &["/opt/tools"],
            &[dir.path().join("elsewhere").to_str().expect("utf-8")],
        );
        assert!(check(&fine).is_ok(), "{:?}", check(&fine));
        let holds = agent(&[dir.path().to_str().expect("utf-8")], &[]);
        assert!(
            matches!(
                check(&holds),
                Err(ConfinementError::AgentGrant {
                    relation: "holds",
                    ..
                })
            ),
            "{:?}",
            check(&holds)
        );
        let inside = agent(&[], &[data.join("workspaces").to_str().expect("utf-8")]);
        assert!(
            matches!(
                check(&inside),
                Err(ConfinementError::AgentGrant {
                    relation: "lies inside",
                    ..
                })
            ),
            "{:?}",
            check(&inside)
        );
        let relative = agent(&["tools"], &[]);
        assert!(matches!(
            check(&relative),
            Err(ConfinementError::Relative { .. })
        ));
        // Through a symlink too: a grant follows it.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&data, &link).expect("symlink");
        let linked = agent(&[link.to_str().expect("utf-8")], &[]);
        assert!(check(&linked).is_err());
    }

    #[test]
    fn a_node_place_beneath_the_systems_folders_is_refused() {
        let protected = [Protected {
            what: "data_dir",
            path: "/usr/local/var/reins".into(),
        }];
        let refused = check_grants(&[&agent(&[], &[])], &protected);
        assert!(
            matches!(
                &refused,
                Err(ConfinementError::SystemGrant {
                    what: "data_dir",
                    ..
                })
            ),
            "{refused:?}"
        );
        // Nothing to confine: nothing checked.
        assert!(matches!(
            check(ConfinementMode::None, &[&agent(&[], &[])], &protected),
            Ok(None)
        ));
        assert!(matches!(
            check(ConfinementMode::Landlock, &[], &protected),
            Ok(None)
        ));
    }

    #[test]
    fn a_bare_program_is_found_in_path() {
        let path = std::ffi::OsString::from("relative:/nonexistent:/bin:/usr/bin");
        let found = program_path(Path::new("sh"), Some(&path)).expect("sh is in /bin or /usr/bin");
        assert!(found.is_absolute() && found.ends_with("sh"), "{found:?}");
        assert_eq!(
            program_path(Path::new("/opt/x"), None),
            Some(PathBuf::from("/opt/x"))
        );
        assert_eq!(
            program_path(Path::new("no-such-program-here"), Some(&path)),
            None
        );
    }

    #[test]
    fn a_kernel_without_landlock_is_refused_naming_the_key_that_opts_out() {
        let refusal = ConfinementError::Unavailable {
            status: "not built into this kernel".into(),
        }
        .to_string();
        assert!(
            refusal.contains("agent_confinement = \"none\"") && refusal.contains("ABI 3"),
            "{refusal}"
        );
    }

    #[test]
    fn the_log_says_what_this_kernel_confines() {
        assert!(describe(3).contains("signals to the node's processes"));
        assert!(describe(7).contains("pathname Unix sockets"));
        assert!(!describe(9).contains("not confined"));
    }
}
