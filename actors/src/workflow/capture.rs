//! Reading the file a `captureArtifact` names, without ever letting the file hold up the
//! workflow or reach anything of the node's. A workspace is written by agents, so the file may be
//! anything: a FIFO (whose open waits for a writer forever), a device, a symlink swapped in after
//! the path was checked, a hard link to (or the moved inode of) one of the node's own files, a
//! file that grows while it is read.
//!
//! So the path is first opened with `O_PATH | O_NOFOLLOW`, which pins the inode without opening
//! the file itself (closing such a descriptor releases no POSIX lock, unlike closing a real one:
//! a second real descriptor on the embedded database would drop SQLite's locks). That inode must
//! be a regular file with exactly one link, none of the node's own files ([`NodeFiles`], by
//! device and inode), and really under the workspace root. Only then is it opened for reading,
//! through `/proc/self/fd` (the same inode, whatever the path names by then), and at most
//! `bytes_max + 1` bytes are read.
//!
//! Every filesystem call runs on a thread of its own, not on an actor's turn nor on tokio's
//! blocking pool (a runtime that stops waits for that pool, so one stuck read would hold up a
//! node's exit); the caller awaits the answer for at most `timeout`, and a read that is still
//! stuck then is abandoned to its thread. At most [`CAPTURE_THREADS_MAX`] such threads exist at
//! once, so stuck reads cannot pile up threads without bound.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::node_files::NodeFiles;
use crate::workspace;

/// Capture reads in flight (or stuck) on this node at most; past it a capture fails at once.
pub const CAPTURE_THREADS_MAX: usize = 64;

static CAPTURE_THREADS: AtomicUsize = AtomicUsize::new(0);

/// What a capture reads: `path` (under `/mnt/user-data/`) of the workspace at `root`.
#[derive(Debug, Clone)]
pub struct CaptureRequest {
    pub root: PathBuf,
    pub path: String,
    /// The step whose workspace it is, for messages.
    pub source_step_id: String,
    pub bytes_max: u64,
    pub timeout: Duration,
    /// The node's own files, which a capture never opens.
    pub node_files: Arc<NodeFiles>,
}

/// Reads the file `request` names; the error is the message the script sees.
pub async fn read(request: CaptureRequest) -> Result<Vec<u8>, String> {
    let (path, source, timeout) = (
        request.path.clone(),
        request.source_step_id.clone(),
        request.timeout,
    );
    if CAPTURE_THREADS.fetch_add(1, Ordering::SeqCst) >= CAPTURE_THREADS_MAX {
        CAPTURE_THREADS.fetch_sub(1, Ordering::SeqCst);
        return Err(format!(
            "cannot capture {path:?} from step {source:?}: {CAPTURE_THREADS_MAX} captures are \
             already being read on this node"
        ));
    }
    let (answer, answered) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("reins-capture".into())
        .spawn(move || {
            let _ = answer.send(read_now(&request));
            CAPTURE_THREADS.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(error) = spawned {
        CAPTURE_THREADS.fetch_sub(1, Ordering::SeqCst);
        return Err(format!(
            "cannot capture {path:?} from step {source:?}: {error}"
        ));
    }
    match tokio::time::timeout(timeout, answered).await {
        Ok(Ok(read)) => read,
        Ok(Err(_)) => Err(format!(
            "cannot capture {path:?} from step {source:?}: the read ended without an answer"
        )),
        Err(_) => Err(format!(
            "cannot capture {path:?} from step {source:?}: not read within capture_timeout_ms \
             ({} ms)",
            timeout.as_millis()
        )),
    }
}

/// The blocking part, on the capture's own thread.
fn read_now(request: &CaptureRequest) -> Result<Vec<u8>, String> {
    let (path, source) = (&request.path, &request.source_step_id);
    let refuse = |reason: String| format!("cannot capture {path:?} from step {source:?}: {reason}");
    let file_path = workspace::resolve(&request.root, path).map_err(|e| e.to_string())?;
    // Pins the inode without opening the file (see the module's documentation). With
    // `O_NOFOLLOW`, a final symlink is pinned itself, and refused below as not a regular file.
    let pinned = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(&file_path)
        .map_err(|e| refuse(e.to_string()))?;
    let metadata = pinned.metadata().map_err(|e| refuse(e.to_string()))?;
    check_pinned(&metadata, request).map_err(refuse)?;
    check_inside(&pinned, &request.root).map_err(refuse)?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", pinned.as_raw_fd()))
        .map_err(|e| refuse(e.to_string()))?;
    let opened = file.metadata().map_err(|e| refuse(e.to_string()))?;
    // The kernel reopens the inode the pinned descriptor refers to, never a path; should it
    // ever be another, nothing is read from it.
    if (opened.dev(), opened.ino()) != (metadata.dev(), metadata.ino()) {
        return Err(refuse("it changed while it was opened".into()));
    }
    let too_large = |bytes: u64| {
        format!(
            "{path:?} is {bytes} bytes, over artifact_bytes_max ({})",
            request.bytes_max
        )
    };
    if opened.len() > request.bytes_max {
        return Err(too_large(opened.len()));
    }
    let mut content = Vec::new();
    file.take(request.bytes_max.saturating_add(1))
        .read_to_end(&mut content)
        .map_err(|e| refuse(e.to_string()))?;
    let read = u64::try_from(content.len()).unwrap_or(u64::MAX);
    if read > request.bytes_max {
        // It grew while it was read.
        return Err(too_large(read));
    }
    Ok(content)
}

/// What the pinned inode must be before it is opened: a regular file of one link that is none
/// of the node's own files.
fn check_pinned(metadata: &std::fs::Metadata, request: &CaptureRequest) -> Result<(), String> {
    let file_type = metadata.file_type();
    if file_type.is_symlink() {
        return Err("it is a symbolic link; capture the file it points to".into());
    }
    if !file_type.is_file() {
        return Err(format!(
            "it is {}, not a regular file",
            describe(&file_type)
        ));
    }
    if metadata.nlink() != 1 {
        return Err(format!(
            "it has {} hard links; only a file with one link (a file of the workspace's own) \
             is captured",
            metadata.nlink()
        ));
    }
    if request.node_files.holds((metadata.dev(), metadata.ino())) {
        return Err("it is one of the node's own files".into());
    }
    Ok(())
}

/// The pinned file must lie under the workspace root: a folder of its path may have been
/// swapped for a symlink after [`workspace::resolve`] checked it.
fn check_inside(file: &std::fs::File, root: &Path) -> Result<(), String> {
    let opened = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| format!("cannot tell where the opened file is: {e}"))?;
    let root = root
        .canonicalize()
        .map_err(|e| format!("cannot resolve the workspace: {e}"))?;
    if opened.starts_with(&root) {
        Ok(())
    } else {
        Err(format!("it is outside {}", workspace::VIRTUAL_ROOT))
    }
}

fn describe(file_type: &std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a folder"
    } else if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_char_device() || file_type.is_block_device() {
        "a device"
    } else {
        "a special file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(root: &Path, path: &str, bytes_max: u64) -> CaptureRequest {
        CaptureRequest {
            root: root.to_path_buf(),
            path: path.into(),
            source_step_id: "s".into(),
            bytes_max,
            timeout: Duration::from_secs(10),
            node_files: Arc::new(NodeFiles::default()),
        }
    }

    /// The POSIX locks this process holds on the inode of `path`, as `/proc/locks` lists them.
    fn locks_held(path: &Path) -> usize {
        let metadata = std::fs::metadata(path).expect("metadata");
        let ino = format!(":{}", metadata.ino());
        let pid = format!(" {} ", std::process::id());
        std::fs::read_to_string("/proc/locks")
            .expect("/proc/locks")
            .lines()
            .filter(|line| line.contains("POSIX") && line.contains(&pid))
            .filter(|line| {
                line.split_whitespace()
                    .nth(5)
                    .is_some_and(|f| f.ends_with(&ino))
            })
            .count()
    }

    #[tokio::test]
    async fn a_hard_link_or_the_moved_inode_of_a_node_file_is_refused_and_its_locks_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let root = data.join("workspaces/t/user-data");
        std::fs::create_dir_all(&root).expect("mkdir");
        let database = data.join("reins.db");
        std::fs::write(&database, b"the node's database").expect("write");
        std::fs::write(data.join("secret"), b"the node's secret").expect("write");
        // The node holds a POSIX lock on its database, as SQLite does.
        let held = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&database)
            .expect("open");
        let lock = libc::flock {
            l_type: libc::F_RDLCK as libc::c_short,
            l_whence: libc::SEEK_SET as libc::c_short,
            l_start: 0,
            l_len: 1,
            l_pid: 0,
        };
        // SAFETY: fcntl(2) F_SETLK with a valid descriptor and a valid flock.
        assert_eq!(
            unsafe { libc::fcntl(held.as_raw_fd(), libc::F_SETLK, &lock) },
            0
        );
        assert_eq!(locks_held(&database), 1);
        std::fs::hard_link(&database, root.join("hl")).expect("ln");
        let node_files = Arc::new(NodeFiles::new(vec![data.clone()], Vec::new()));
        let with_node_files = |path: &str, bytes_max: u64| CaptureRequest {
            node_files: Arc::clone(&node_files),
            ..request(&root, path, bytes_max)
        };

        // Refused, over its size or not, and the lock is still held.
        for bytes_max in [4, 1000] {
            let linked = read(with_node_files("hl", bytes_max)).await;
            assert!(
                linked.as_ref().is_err_and(|e| e.contains("2 hard links")),
                "{linked:?}"
            );
            assert_eq!(
                locks_held(&database),
                1,
                "the capture dropped the node's lock"
            );
        }
        // The secret moved into the workspace: one link, but the node's by its inode.
        std::fs::rename(data.join("secret"), root.join("s")).expect("mv");
        let moved = read(with_node_files("s", 1000)).await;
        assert!(
            moved
                .as_ref()
                .is_err_and(|e| e.contains("one of the node's own files")),
            "{moved:?}"
        );
        drop(held);
    }

    #[tokio::test]
    async fn only_regular_files_inside_the_root_are_read_up_to_the_limit() {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("t/user-data");
        std::fs::create_dir_all(&root).expect("mkdir");
        std::fs::write(root.join("a.txt"), b"four").expect("write");
        std::fs::write(dir.path().join("outside.txt"), b"secret").expect("write");
        std::os::unix::fs::symlink("a.txt", root.join("link")).expect("symlink");
        let fifo = std::ffi::CString::new(root.join("pipe").to_str().expect("utf-8")).expect("c");
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);

        assert_eq!(read(request(&root, "a.txt", 4)).await, Ok(b"four".to_vec()));
        let over = read(request(&root, "a.txt", 3)).await.expect_err("over");
        assert!(over.contains("over artifact_bytes_max (3)"), "{over}");
        let fifo = read(request(&root, "/mnt/user-data/pipe", 4)).await;
        assert!(
            fifo.as_ref()
                .is_err_and(|e| e.contains("a FIFO, not a regular file")),
            "{fifo:?}"
        );
        let folder = read(request(&root, "/mnt/user-data/", 4)).await;
        assert!(folder.is_err(), "{folder:?}");
        let link = read(request(&root, "link", 4)).await;
        assert!(
            link.as_ref().is_err_and(|e| e.contains("symbolic link")),
            "{link:?}"
        );
        let missing = read(request(&root, "nope.txt", 4)).await;
        assert!(
            missing.as_ref().is_err_and(|e| e.contains("No such file")),
            "{missing:?}"
        );
        assert!(read(request(&root, "../../outside.txt", 10)).await.is_err());
    }
}
