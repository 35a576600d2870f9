//! The node's own files (the embedded database with its write-ahead log and shared memory, the
//! secret, the lock file, the configuration), known by device and inode so that nothing the
//! node does for an agent or a script ever opens one of them. Opening a second descriptor on the
//! database's inode and closing it would drop every POSIX lock SQLite holds on it in this
//! process (fcntl locks belong to the process and the inode, not to the descriptor), after which
//! another program sees an unlocked database and may delete its live write-ahead log.
//!
//! The set is read twice: once when the node starts (so a file moved away later is still known
//! by its inode) and again at each check (so a file created since, such as a new write-ahead
//! log, is known too).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A file's identity: (device, inode).
pub type FileId = (u64, u64);

/// The node's own files.
#[derive(Debug, Clone, Default)]
pub struct NodeFiles {
    /// Folders whose every direct entry that is not a folder is the node's (the data folder,
    /// the embedded database's folder).
    folders: Vec<PathBuf>,
    /// Single files of the node's elsewhere (the configuration file).
    files: Vec<PathBuf>,
    /// What those held when the node started.
    at_start: BTreeSet<FileId>,
}

impl NodeFiles {
    /// The files directly inside `folders` (not their subfolders, which hold workspaces) and
    /// `files`, read now and again at each [`NodeFiles::holds`].
    pub fn new(folders: Vec<PathBuf>, files: Vec<PathBuf>) -> Self {
        let mut node_files = NodeFiles {
            folders,
            files,
            at_start: BTreeSet::new(),
        };
        node_files.at_start = node_files.current();
        node_files
    }

    /// Whether `id` is one of the node's files, as they were at start or are now.
    pub fn holds(&self, id: FileId) -> bool {
        self.at_start.contains(&id) || self.current().contains(&id)
    }

    /// The identities the folders and files have now. Entries are read with `lstat`, never
    /// opened.
    fn current(&self) -> BTreeSet<FileId> {
        let mut ids = BTreeSet::new();
        for folder in &self.folders {
            let Ok(entries) = std::fs::read_dir(folder) else {
                continue;
            };
            for entry in entries.flatten() {
                if let Ok(metadata) = std::fs::symlink_metadata(entry.path())
                    && !metadata.is_dir()
                {
                    ids.insert((metadata.dev(), metadata.ino()));
                }
            }
        }
        for file in &self.files {
            if let Some(id) = identity(file) {
                ids.insert(id);
            }
        }
        ids
    }
}

/// The identity of the file `path` names (following a final symlink, as an open would).
fn identity(path: &Path) -> Option<FileId> {
    std::fs::metadata(path)
        .ok()
        .map(|metadata| (metadata.dev(), metadata.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_of_the_folders_are_held_even_once_moved_away_and_new_ones_too() {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("workspaces/t/user-data")).expect("mkdir");
        std::fs::write(data.join("reins.db"), b"db").expect("write");
        std::fs::write(dir.path().join("reins.toml"), b"x").expect("write");
        std::fs::write(data.join("workspaces/t/user-data/a.txt"), b"a").expect("write");
        let files = NodeFiles::new(vec![data.clone()], vec![dir.path().join("reins.toml")]);
        let id = |path: &Path| identity(path).expect("identity");

        assert!(files.holds(id(&data.join("reins.db"))));
        assert!(files.holds(id(&dir.path().join("reins.toml"))));
        assert!(!files.holds(id(&data.join("workspaces/t/user-data/a.txt"))));
        // Moved into a workspace: still the node's by its inode.
        std::fs::rename(
            data.join("reins.db"),
            data.join("workspaces/t/user-data/db"),
        )
        .expect("mv");
        assert!(files.holds(id(&data.join("workspaces/t/user-data/db"))));
        // Created after the start (a new write-ahead log).
        std::fs::write(data.join("reins.db-wal"), b"wal").expect("write");
        assert!(files.holds(id(&data.join("reins.db-wal"))));
    }
}
