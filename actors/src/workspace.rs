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

/// Removes the folder of `thread_id` with all it holds. Symlinks in it are removed, never
/// followed (`std::fs::remove_dir_all` opens every level relative to its parent without
/// following links), and a thread folder that is itself a symlink loses only the link. A thread
/// with no folder is fine.
pub fn remove_thread(workspaces_dir: &Path, thread_id: &str) -> Result<(), WorkspaceError> {
    check_thread_id(thread_id)?;
    let folder = workspaces_dir.join(thread_id);
    let io = |e: std::io::Error| WorkspaceError::Io {
        path: folder.display().to_string(),
        reason: e.to_string(),
    };
    let removed = match std::fs::symlink_metadata(&folder) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(e)),
        Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(&folder),
        Ok(_) => std::fs::remove_file(&folder),
    };
    removed.map_err(io)
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
    fn removing_a_thread_never_follows_a_symlink_out() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (workspaces, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        std::fs::create_dir_all(workspaces.join("t1/user-data/deep")).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(outside.join("keep.txt"), b"keep").expect("write");
        std::os::unix::fs::symlink(&outside, workspaces.join("t1/user-data/deep/out"))
            .expect("symlink");
        std::os::unix::fs::symlink(&outside, workspaces.join("t2")).expect("symlink");
        remove_thread(&workspaces, "t1").expect("remove t1");
        remove_thread(&workspaces, "t2").expect("remove t2");
        remove_thread(&workspaces, "t3").expect("nothing to remove");
        assert!(!workspaces.join("t1").exists() && !workspaces.join("t2").exists());
        assert!(outside.join("keep.txt").exists());
        assert!(remove_thread(&workspaces, "../outside").is_err());
    }

    #[test]
    fn thread_ids_are_checked() {
        assert!(check_thread_id("thread-1_a").is_ok());
        for bad in ["", "../x", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_thread_id(bad).is_err(), "{bad:?}");
        }
    }
}
