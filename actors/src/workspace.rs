//! Thread workspaces. An agent sees its thread's workspace as the virtual root `/mnt/user-data/`;
//! on disk it is `<workspaces_dir>/<thread_id>/user-data/`. Every path an agent or a script names
//! is confined to that root: `..`, absolute paths elsewhere, and symlinks that lead out are refused.

use std::path::{Component, Path, PathBuf};

/// The root every workspace path is written against.
pub const VIRTUAL_ROOT: &str = "/mnt/user-data/";

/// Thread ids: what may name a folder on every file system.
const THREAD_ID_BYTES_MAX: usize = 128;

/// Why a workspace path was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkspaceError {
    #[error("invalid thread id {0:?}: use 1 to 128 letters, digits, '-' or '_'")]
    ThreadId(String),
    #[error("path {0:?} is outside {VIRTUAL_ROOT}")]
    Outside(String),
    #[error("path {path:?} cannot be used: {reason}")]
    Io { path: String, reason: String },
}

/// Checks a thread id before it names a folder.
pub fn check_thread_id(thread_id: &str) -> Result<(), WorkspaceError> {
    let valid = !thread_id.is_empty()
        && thread_id.len() <= THREAD_ID_BYTES_MAX
        && thread_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if valid {
        Ok(())
    } else {
        Err(WorkspaceError::ThreadId(thread_id.to_owned()))
    }
}

/// The folder `/mnt/user-data/` of `thread_id` maps to.
pub fn thread_root(workspaces_dir: &Path, thread_id: &str) -> Result<PathBuf, WorkspaceError> {
    check_thread_id(thread_id)?;
    Ok(workspaces_dir.join(thread_id).join("user-data"))
}

/// Maps `path` (under `/mnt/user-data/`, or relative to it) into `root`, refusing anything that
/// would leave it, including through a symlink among the parts that already exist.
pub fn resolve(root: &Path, path: &str) -> Result<PathBuf, WorkspaceError> {
    let outside = || WorkspaceError::Outside(path.to_owned());
    let relative = match path.strip_prefix(VIRTUAL_ROOT) {
        Some(rest) => rest,
        None if path.starts_with('/') => return Err(outside()),
        None => path,
    };
    let mut resolved = root.to_path_buf();
    for component in Path::new(relative).components() {
        match component {
            Component::Normal(part) => resolved.push(part),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(outside());
            }
        }
    }
    if resolved == root {
        return Err(outside());
    }
    // The deepest part that exists inside the root must still be inside it once symlinks are
    // followed. (When the root itself does not exist yet, nothing inside it can be a symlink.)
    let existing = resolved.ancestors().find(|ancestor| ancestor.exists());
    if let Some(existing) = existing.filter(|e| e.starts_with(root)) {
        let io = |e: std::io::Error| WorkspaceError::Io {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let real_root = root.canonicalize().map_err(io)?;
        if !existing.canonicalize().map_err(io)?.starts_with(real_root) {
            return Err(outside());
        }
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_root_only() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("t1/user-data");
        std::fs::create_dir_all(root.join("outputs")).expect("mkdir");
        assert_eq!(
            resolve(&root, "/mnt/user-data/outputs/a.txt"),
            Ok(root.join("outputs/a.txt"))
        );
        assert_eq!(
            resolve(&root, "outputs/b.txt"),
            Ok(root.join("outputs/b.txt"))
        );
        for bad in [
            "/etc/passwd",
            "/mnt/user-data/../secret",
            "../x",
            "outputs/../../x",
            "/mnt/user-data/",
            "",
        ] {
            assert!(resolve(&root, bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn a_symlink_out_of_the_root_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("t1/user-data");
        std::fs::create_dir_all(&root).expect("mkdir");
        std::os::unix::fs::symlink(dir.path(), root.join("escape")).expect("symlink");
        assert!(resolve(&root, "escape/file.txt").is_err());
    }

    #[test]
    fn thread_ids_are_checked() {
        assert!(check_thread_id("thread-1_a").is_ok());
        for bad in ["", "../x", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_thread_id(bad).is_err(), "{bad:?}");
        }
    }
}
