//! `reins admin backup FILE`: a copy of the embedded database made by the node itself, through
//! SQLite's online backup API on one of the node's own read connections. A copy made by another
//! program (`sqlite3 reins.db .backup`) is unsafe beside a live node: should the node's POSIX
//! locks ever be gone, that program believes it is the last user and deletes the live
//! write-ahead log. Inside the node, SQLite knows every connection of the process.
//!
//! The copy is taken in one step, so it is the database as of one moment (a read transaction
//! of the node's, which never blocks the writer in WAL mode). It is written into a new file
//! `FILE.partial` created with `O_EXCL` (an existing file, or a link planted at its path, is
//! never opened or overwritten), in rollback-journal mode so that it is one self-contained file,
//! checked with `PRAGMA quick_check`, synced, and only then linked as `FILE` (which fails rather
//! than replace a file that appeared meanwhile). So `FILE` exists only once the backup is whole,
//! even when the caller stopped waiting for the answer; a failed backup leaves no file.

use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use crate::{BackupReport, Error, Result};

/// Copies the database `source` reads into a new file at `destination`.
pub(super) fn copy(source: &Connection, destination: &Path) -> Result<BackupReport> {
    let refused = |reason: &str| {
        Err(Error::Unsupported(format!(
            "backup destination {}: {reason}",
            destination.display()
        )))
    };
    if !destination.is_absolute() {
        return refused("not an absolute path");
    }
    if std::fs::symlink_metadata(destination).is_ok() {
        return refused("it exists already; name a new file");
    }
    let mut partial = destination.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    let io = |path: &Path, e: std::io::Error| {
        Error::Unavailable(format!("cannot write {}: {e}", path.display()))
    };
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .map_err(|e| io(&partial, e))?;
    let made = write_copy(source, &partial).and_then(|bytes| {
        std::fs::hard_link(&partial, destination).map_err(|e| io(destination, e))?;
        Ok(bytes)
    });
    for suffix in [
        ".partial",
        ".partial-journal",
        ".partial-wal",
        ".partial-shm",
    ] {
        let mut path = destination.as_os_str().to_owned();
        path.push(suffix);
        let _ = std::fs::remove_file(path);
    }
    let bytes = made?;
    if let Some(folder) = destination.parent() {
        std::fs::File::open(folder)
            .and_then(|folder| folder.sync_all())
            .map_err(|e| io(folder, e))?;
    }
    Ok(BackupReport {
        path: destination.to_path_buf(),
        bytes,
        schema_version: schema_version(destination)?,
    })
}

/// The schema version the finished copy records.
fn schema_version(copy: &Path) -> Result<i64> {
    let connection = Connection::open_with_flags(copy, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    Ok(connection.query_row(
        "SELECT coalesce(max(version), 0) FROM schema_migrations",
        [],
        |row| row.get(0),
    )?)
}

/// Writes the copy into `partial` and syncs it; answers its size in bytes.
fn write_copy(source: &Connection, partial: &Path) -> Result<u64> {
    let mut target = Connection::open_with_flags(
        partial,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    {
        let backup = rusqlite::backup::Backup::new(source, &mut target)?;
        match backup.step(-1)? {
            rusqlite::backup::StepResult::Done => {}
            other => {
                return Err(Error::Unavailable(format!(
                    "the backup did not finish in one step ({other:?}); try again"
                )));
            }
        }
    }
    target.pragma_update(None, "journal_mode", "DELETE")?;
    let check: String = target.query_row("PRAGMA quick_check", [], |row| row.get(0))?;
    if check != "ok" {
        return Err(Error::Database(format!(
            "the copy failed its quick_check: {check}"
        )));
    }
    target.close().map_err(|(_, e)| Error::from(e))?;
    let file = std::fs::File::open(partial)
        .and_then(|file| file.sync_all().and_then(|()| file.metadata()))
        .map_err(|e| Error::Unavailable(format!("cannot sync {}: {e}", partial.display())))?;
    Ok(file.len())
}
