//! Claiming the admin socket's path: refused while another live node answers on it, taken over
//! when the file is a stale socket left by a killed node, never exposed with a looser mode than
//! 0600, and removed on exit (only if it is still ours).
//!
//! The socket is bound inside a fresh private folder (mode 0700), set to 0600, then hard-linked
//! to its path: `link` fails rather than replace a file, so two nodes racing for one path cannot
//! both win, and nobody can connect before the mode is right.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

/// Why the admin socket could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("admin socket {0:?} is held by another live node (config key `admin_socket`)")]
    InUse(PathBuf),
    #[error("admin socket path {0:?} exists and is not a socket; remove it or set `admin_socket`")]
    NotASocket(PathBuf),
    #[error("admin socket path {path:?} is {bytes} bytes, over the {max} a Unix socket allows")]
    TooLong {
        path: PathBuf,
        bytes: usize,
        max: usize,
    },
    #[error("cannot create admin socket {path:?}: {reason}")]
    Io { path: PathBuf, reason: String },
}

/// The longest socket path Linux accepts (`sun_path` less its terminating NUL).
const PATH_BYTES_MAX: usize = 107;

/// The claimed socket: removes its path when dropped, if the path is still this socket.
pub struct AdminSocket {
    path: PathBuf,
    inode: u64,
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.inode);
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Refuses early (before the node touches anything) when a live node answers on `path`.
pub fn check_free(path: &Path) -> Result<(), Error> {
    let bytes = path.as_os_str().len();
    if bytes > PATH_BYTES_MAX {
        return Err(Error::TooLong {
            path: path.to_owned(),
            bytes,
            max: PATH_BYTES_MAX,
        });
    }
    match std::fs::symlink_metadata(path) {
        Err(_) => Ok(()),
        Ok(metadata) if !metadata.file_type().is_socket() => {
            Err(Error::NotASocket(path.to_owned()))
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Ok(_) => Err(Error::InUse(path.to_owned())),
            // Nobody listens: a stale socket from a node that died.
            Err(_) => Ok(()),
        },
    }
}

/// Claims `path` and listens on it.
pub fn bind(path: &Path) -> Result<(UnixListener, AdminSocket), Error> {
    check_free(path)?;
    let io = |reason: std::io::Error| Error::Io {
        path: path.to_owned(),
        reason: reason.to_string(),
    };
    if std::fs::symlink_metadata(path).is_ok() {
        tracing::warn!(path = %path.display(), "taking over a stale admin socket");
        std::fs::remove_file(path).map_err(io)?;
    }
    let folder = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(folder)
        .map_err(io)?;
    let private = folder.join(format!(".admin-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::create_dir(&private).map_err(io)?;
    let result = bind_privately(path, &private);
    let _ = std::fs::remove_dir_all(&private);
    result
}

fn bind_privately(path: &Path, private: &Path) -> Result<(UnixListener, AdminSocket), Error> {
    let io = |reason: std::io::Error| Error::Io {
        path: path.to_owned(),
        reason: reason.to_string(),
    };
    std::fs::set_permissions(private, std::fs::Permissions::from_mode(0o700)).map_err(io)?;
    let staged = private.join("s");
    let listener = UnixListener::bind(&staged).map_err(io)?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    match std::fs::hard_link(&staged, path) {
        Ok(()) => {}
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Error::InUse(path.to_owned()));
        }
        Err(error) => return Err(io(error)),
    }
    let inode = std::fs::symlink_metadata(path).map_err(io)?.ino();
    Ok((
        listener,
        AdminSocket {
            path: path.to_owned(),
            inode,
        },
    ))
}
