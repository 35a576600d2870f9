//! Thread workspaces. An agent sees its thread's workspace as the virtual root `/mnt/user-data/`;
//! on disk it is `<workspaces_dir>/<thread_id>/user-data/`. Every path an agent or a script names
//! is confined to that root: `..`, absolute paths elsewhere, and symlinks that lead out are refused.
//! A thread's folder is removed with its workflow ([`remove_thread`]) and copied into a retry that
//! adopts its step ([`copy_thread`]).

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
    /// A retry would copy more data than `limits.retry_copy_bytes_max` (holes not counted).
    #[error(
        "the workspaces a retry adopts hold more than {bytes_max} bytes of data \
         (`limits.retry_copy_bytes_max`): nothing is copied and the retry is not made"
    )]
    TooLarge { bytes_max: u64 },
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

/// The folders of `workspaces_dir` that name a workflow's thread (`<workflow id>-<16 hex>`, as
/// every agent step's thread is named) and were last changed more than `older_than` ago, with
/// the workflow each names: what a sweep asks the store about. A retry's copy in progress (on
/// any node sharing the folder) changes its folder as it goes and is written long before that
/// age, so only a copy whose node died before its workflow was written, or a thread whose
/// removal failed, is old and unowned.
pub fn old_workflow_threads(
    workspaces_dir: &Path,
    older_than: std::time::Duration,
) -> std::io::Result<Vec<(String, String)>> {
    let is_hex =
        |text: &str, len: usize| text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit());
    let entries = match std::fs::read_dir(workspaces_dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other?,
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Some((workflow, suffix)) = name.split_once('-') else {
            continue;
        };
        if !is_hex(workflow, 32) || !is_hex(suffix, 16) {
            continue;
        }
        let metadata = entry.metadata()?;
        let age = metadata
            .modified()
            .ok()
            .and_then(|changed| changed.elapsed().ok());
        if metadata.is_dir() && age.is_some_and(|age| age > older_than) {
            found.push((workflow.to_owned(), name));
        }
    }
    Ok(found)
}

/// What [`copy_thread`] copied, and what it left out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copied {
    /// Regular files copied.
    pub files: u64,
    /// Entries left out: anything but a folder, a regular file with one link, or a symlink.
    pub skipped: u64,
    /// Bytes of data copied (a file's holes are not data: they stay holes in the copy).
    pub bytes: u64,
}

/// Copies the folder of thread `from` into a new folder for thread `to`, which must not exist
/// yet: folders, regular files (their bytes and permission bits) and symlinks (as links, never
/// followed), as the agent left them. What else a workspace may hold is left out and counted: a
/// FIFO, a socket or a device (whose open could block or act), and a file with more than one hard
/// link (which a capture refuses anyway: it may be one of the node's own files an unconfined
/// agent linked in). Nothing is copied when `from` has no folder, or when its folder is a
/// symlink. `from` must no longer be written to: its runs ended. Each file is opened without
/// following a link and without blocking, and checked once open, so an entry swapped meanwhile
/// is never read through. A file's holes stay holes (a sparse file of gigabytes that holds
/// nothing copies nothing), and at most `bytes_max` bytes of data are copied: past them the copy
/// stops with [`WorkspaceError::TooLarge`]. On an error, what was copied stays: the caller
/// removes `to`.
pub fn copy_thread(
    workspaces_dir: &Path,
    from: &str,
    to: &str,
    bytes_max: u64,
) -> Result<Copied, WorkspaceError> {
    check_thread_id(from)?;
    check_thread_id(to)?;
    let (source, target) = (workspaces_dir.join(from), workspaces_dir.join(to));
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |e: std::io::Error| WorkspaceError::Io {
            path,
            reason: e.to_string(),
        }
    };
    let mut copied = Copied::default();
    match std::fs::symlink_metadata(&source) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(copied),
        Err(e) => return Err(io(&source)(e)),
        Ok(metadata) if !metadata.is_dir() => return Ok(copied),
        Ok(_) => {}
    }
    std::fs::create_dir(&target).map_err(io(&target))?;
    let mut folders = vec![(source, target)];
    while let Some((from_folder, to_folder)) = folders.pop() {
        for entry in std::fs::read_dir(&from_folder).map_err(io(&from_folder))? {
            let entry = entry.map_err(io(&from_folder))?;
            let (path, copy) = (entry.path(), to_folder.join(entry.file_name()));
            let kind = entry.file_type().map_err(io(&path))?;
            if kind.is_dir() {
                std::fs::create_dir(&copy).map_err(io(&copy))?;
                folders.push((path, copy));
            } else if kind.is_symlink() {
                let points_to = std::fs::read_link(&path).map_err(io(&path))?;
                std::os::unix::fs::symlink(points_to, &copy).map_err(io(&copy))?;
            } else if kind.is_file() {
                let left = bytes_max.saturating_sub(copied.bytes);
                match copy_file(&path, &copy, left).map_err(io(&path))? {
                    FileCopy::Copied { bytes } => {
                        copied.files += 1;
                        copied.bytes += bytes;
                    }
                    FileCopy::Skipped => copied.skipped += 1,
                    FileCopy::OverBudget => return Err(WorkspaceError::TooLarge { bytes_max }),
                }
            } else {
                copied.skipped += 1;
            }
        }
    }
    Ok(copied)
}

/// What [`copy_file`] did with one file.
enum FileCopy {
    Copied {
        bytes: u64,
    },
    /// Not a regular file with one link once open: nothing was created.
    Skipped,
    /// It holds more data than the copy had left: what was written of it stays.
    OverBudget,
}

/// Copies the regular file at `path` to a new file `copy`, its data extents only (its holes
/// stay holes, see [`data_extents`]), unless what is open there is not a regular file with one
/// link, or it holds more than `bytes_left` bytes of data.
fn copy_file(path: &Path, copy: &Path, bytes_left: u64) -> std::io::Result<FileCopy> {
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    let source = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let metadata = source.metadata()?;
    if !metadata.is_file() || metadata.nlink() != 1 {
        return Ok(FileCopy::Skipped);
    }
    let target = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(metadata.mode() & 0o777)
        .open(copy)?;
    let mut buffer = vec![0_u8; 64 * 1024];
    let mut bytes = 0_u64;
    for (start, end) in data_extents(&source, metadata.len())? {
        let mut at = start;
        while at < end {
            // The file may have shrunk since its extents were read: what is gone is not copied.
            let want = usize::try_from(end - at).map_or(buffer.len(), |n| n.min(buffer.len()));
            let read = source.read_at(&mut buffer[..want], at)?;
            if read == 0 {
                break;
            }
            bytes += read as u64;
            if bytes > bytes_left {
                return Ok(FileCopy::OverBudget);
            }
            target.write_all_at(&buffer[..read], at)?;
            at += read as u64;
        }
    }
    target.set_len(metadata.len())?;
    Ok(FileCopy::Copied { bytes })
}

/// The `(start, end)` byte ranges of `file` (of length `len`) that hold data, from
/// `lseek(SEEK_DATA)` and `lseek(SEEK_HOLE)`; a file system that does not tell holes apart
/// answers the whole file as one range.
fn data_extents(file: &std::fs::File, len: u64) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    let seek = |offset: u64, whence: libc::c_int| -> std::io::Result<Option<u64>> {
        let offset = libc::off_t::try_from(offset).map_err(std::io::Error::other)?;
        // SAFETY: lseek(2) on a descriptor this function borrows open; no memory is involved.
        let found = unsafe { libc::lseek(file.as_raw_fd(), offset, whence) };
        if found >= 0 {
            return Ok(u64::try_from(found).ok());
        }
        let error = std::io::Error::last_os_error();
        // ENXIO: no data at or after the offset.
        if error.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(error)
        }
    };
    let mut extents = Vec::new();
    let mut offset = 0;
    while offset < len {
        let Some(start) = seek(offset, libc::SEEK_DATA)? else {
            break;
        };
        let end = seek(start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        if end <= start {
            break;
        }
        extents.push((start, end));
        offset = end;
    }
    Ok(extents)
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
    fn a_thread_is_copied_with_its_links_as_links_and_without_what_a_capture_refuses() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let (workspaces, outside) = (dir.path().join("ws"), dir.path().join("outside"));
        let root = workspaces.join("t1/user-data");
        std::fs::create_dir_all(root.join("outputs/deep")).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        std::fs::write(outside.join("secret"), b"node").expect("write");
        std::fs::write(root.join("outputs/deep/report.txt"), b"report").expect("write");
        std::fs::write(root.join("run.sh"), b"#!/bin/sh").expect("write");
        std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        std::os::unix::fs::symlink("outputs/deep", root.join("latest")).expect("symlink");
        std::os::unix::fs::symlink(&outside, root.join("escape")).expect("symlink");
        std::fs::hard_link(outside.join("secret"), root.join("linked")).expect("hard link");
        let fifo = std::process::Command::new("mkfifo")
            .arg(root.join("pipe"))
            .status()
            .expect("mkfifo");
        assert!(fifo.success(), "mkfifo");

        let copied = copy_thread(&workspaces, "t1", "t2", u64::MAX).expect("copy");
        assert_eq!(
            copied,
            Copied {
                files: 2,
                skipped: 2,
                bytes: 15,
            }
        );
        let copy = workspaces.join("t2/user-data");
        let read = |path: &str| std::fs::read(copy.join(path)).expect("read");
        assert_eq!(read("outputs/deep/report.txt"), b"report");
        assert_eq!(
            read("latest/report.txt"),
            b"report",
            "a link inside, still inside"
        );
        let mode = std::fs::metadata(copy.join("run.sh"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(
            std::fs::read_link(copy.join("escape")).expect("link"),
            outside
        );
        assert!(
            resolve(&copy, "escape/secret").is_err(),
            "a link out is still refused"
        );
        assert!(!copy.join("linked").exists() && !copy.join("pipe").exists());
        // The source is as it was; a copy never replaces a thread.
        assert_eq!(
            std::fs::read(root.join("outputs/deep/report.txt")).expect("read"),
            b"report"
        );
        assert!(copy_thread(&workspaces, "t1", "t2", u64::MAX).is_err());
        // A thread without a folder, or whose folder is a link, copies nothing.
        assert_eq!(
            copy_thread(&workspaces, "none", "t3", u64::MAX),
            Ok(Copied::default())
        );
        std::os::unix::fs::symlink(&outside, workspaces.join("t4")).expect("symlink");
        assert_eq!(
            copy_thread(&workspaces, "t4", "t5", u64::MAX),
            Ok(Copied::default())
        );
        assert!(!workspaces.join("t3").exists() && !workspaces.join("t5").exists());
        assert!(copy_thread(&workspaces, "t1", "../t6", u64::MAX).is_err());
    }

    /// Issue 39, item 3: a sparse file of gigabytes became gigabytes on disk in every retry's
    /// copy. Its holes stay holes, only its data counts against the copy's bound, and a copy
    /// past the bound stops saying which limit.
    #[test]
    fn a_copy_keeps_holes_and_stops_at_its_bound_of_data() {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let dir = tempfile::tempdir().expect("temp dir");
        let workspaces = dir.path().join("ws");
        let root = workspaces.join("t1/user-data");
        std::fs::create_dir_all(&root).expect("mkdir");
        let sparse = std::fs::File::create(root.join("big.bin")).expect("create");
        sparse.set_len(3 << 30).expect("truncate -s 3G");
        sparse.write_all_at(b"middle", 1 << 30).expect("write");
        sparse.write_all_at(b"end", (3 << 30) - 3).expect("write");
        std::fs::write(root.join("small.txt"), vec![b'x'; 10_000]).expect("write");

        let copied = copy_thread(&workspaces, "t1", "t2", 1 << 20).expect("copy");
        assert_eq!((copied.files, copied.skipped), (2, 0));
        // What the file system's blocks hold, not 3 GiB.
        assert!(copied.bytes < 1 << 20, "{} bytes", copied.bytes);
        let copy = workspaces.join("t2/user-data/big.bin");
        let metadata = std::fs::metadata(&copy).expect("stat");
        assert_eq!(metadata.len(), 3 << 30);
        assert!(
            metadata.blocks() * 512 < 16 << 20,
            "{} bytes on disk",
            metadata.blocks() * 512
        );
        let copy = std::fs::File::open(&copy).expect("open");
        let mut read = [0_u8; 6];
        copy.read_exact_at(&mut read, 1 << 30).expect("read");
        assert_eq!(&read, b"middle");
        copy.read_exact_at(&mut read[..3], (3 << 30) - 3)
            .expect("read");
        assert_eq!(&read[..3], b"end");

        // 10,000 bytes of data with 9,999 to spare: refused, naming the limit.
        let refused = copy_thread(&workspaces, "t1", "t3", 9_999 + copied.bytes - 10_000)
            .expect_err("over the bound");
        assert!(
            refused.to_string().contains("limits.retry_copy_bytes_max"),
            "{refused}"
        );
    }

    #[test]
    fn thread_ids_are_checked() {
        assert!(check_thread_id("thread-1_a").is_ok());
        for bad in ["", "../x", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_thread_id(bad).is_err(), "{bad:?}");
        }
    }
}
