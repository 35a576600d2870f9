//! Reading the file a `captureArtifact` names, without ever letting the file hold up the
//! workflow. A workspace is written by agents, so the file may be anything: a FIFO (whose open
//! waits for a writer forever), a device, a symlink swapped in after the path was checked, a file
//! that grows while it is read. So only a regular file is read: it is opened with `O_NONBLOCK`
//! (a FIFO's open returns at once) and `O_NOFOLLOW`, the *opened* descriptor is checked (regular
//! file, really under the workspace root), and at most `bytes_max + 1` bytes are read.
//!
//! Every filesystem call runs on a thread of its own, not on an actor's turn nor on tokio's
//! blocking pool (a runtime that stops waits for that pool, so one stuck read would hold up a
//! node's exit); the caller awaits the answer for at most `timeout`, and a read that is still
//! stuck then is abandoned to its thread. At most [`CAPTURE_THREADS_MAX`] such threads exist at
//! once, so stuck reads cannot pile up threads without bound.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

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
    let cannot = |e: std::io::Error| format!("cannot capture {path:?} from step {source:?}: {e}");
    let file_path = workspace::resolve(&request.root, path).map_err(|e| e.to_string())?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(&file_path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => format!(
                "cannot capture {path:?} from step {source:?}: it is a symbolic link; capture \
                 the file it points to"
            ),
            _ => cannot(e),
        })?;
    let metadata = file.metadata().map_err(cannot)?;
    if !metadata.file_type().is_file() {
        return Err(format!(
            "cannot capture {path:?} from step {source:?}: it is {}, not a regular file",
            describe(&metadata.file_type())
        ));
    }
    check_inside(&file, &request.root)
        .map_err(|reason| format!("cannot capture {path:?} from step {source:?}: {reason}"))?;
    let too_large = |bytes: u64| {
        format!(
            "{path:?} is {bytes} bytes, over artifact_bytes_max ({})",
            request.bytes_max
        )
    };
    if metadata.len() > request.bytes_max {
        return Err(too_large(metadata.len()));
    }
    let mut content = Vec::new();
    file.take(request.bytes_max.saturating_add(1))
        .read_to_end(&mut content)
        .map_err(cannot)?;
    let read = u64::try_from(content.len()).unwrap_or(u64::MAX);
    if read > request.bytes_max {
        // It grew while it was read.
        return Err(too_large(read));
    }
    Ok(content)
}

/// The opened file must lie under the workspace root: a folder of its path may have been
/// swapped for a symlink after [`workspace::resolve`] checked it.
fn check_inside(file: &std::fs::File, root: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
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
        }
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
