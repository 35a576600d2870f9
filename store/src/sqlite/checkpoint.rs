//! Checkpoints off the writer. SQLite's automatic checkpoint runs inside the commit that crosses
//! its threshold, on the committing connection: on the single writer every write of the node
//! waited while some hundreds of pages were copied into the database file and synced, every
//! seven workflows or so. Here the writer only counts the pages its commits have left in the
//! write-ahead log (SQLite's WAL hook, after each commit) and, every `wal_checkpoint_pages` of
//! them, wakes a checkpointer thread with a connection of its own, which copies them back with a
//! PASSIVE checkpoint while the writer goes on committing.
//!
//! SQLite starts the log over from its beginning only when a write transaction begins with every
//! frame already copied, which a checkpointer racing a busy writer seldom achieves: under
//! constant load the log would grow without limit. So past `wal_pages_max` the writer
//! checkpoints itself, between two batches: it waits for a pass of the checkpointer in progress,
//! then copies what is left (still PASSIVE: it never waits for a reader), and its next
//! transaction restarts the log. A reader holding an old snapshot can keep frames from being
//! copied; the writer then tries again every `wal_checkpoint_pages` more. A checkpoint that fails
//! is logged and never fails a write: the frames stay in the log, which is durable on its own.

use std::cell::Cell;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use rusqlite::Connection;
use rusqlite::hooks::Wal;

use crate::{Error, Result};

thread_local! {
    /// The pages in the write-ahead log after the last commit made on this thread, as the WAL
    /// hook reported them. The hook is a plain function, and only the writer's thread commits
    /// on its connection, so the count lives with the thread.
    static WAL_PAGES: Cell<i32> = const { Cell::new(0) };
}

fn count_pages(_wal: &Wal, pages: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_PAGES.set(pages);
    Ok(())
}

/// What the writer and the checkpointer thread share.
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Held during a checkpoint, so the writer's own waits for a pass of the checkpointer
    /// instead of failing on SQLite's checkpoint lock.
    turn: Mutex<()>,
}

#[derive(Default)]
struct State {
    wanted: bool,
    stop: bool,
}

/// The writer's side: decides after each commit whether a checkpoint is due, and where.
pub(super) struct Checkpoints {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    every_pages: i32,
    max_pages: i32,
    /// The log's size at which the next checkpoint is due.
    next_at_pages: i32,
    /// The log's size after the previous commit: a smaller one means SQLite started it over.
    last_pages: i32,
}

impl Checkpoints {
    /// Turns SQLite's own checkpoints off on `writer`, counts its log instead, and starts the
    /// checkpointer thread with a connection of its own to the database at `path`.
    pub(super) fn start(
        path: &Path,
        writer: &Connection,
        every_pages: u32,
        max_pages: u32,
    ) -> Result<Checkpoints> {
        writer.execute_batch("PRAGMA wal_autocheckpoint = 0;")?;
        writer.wal_hook(Some(count_pages));
        let connection = super::open_connection(path)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            turn: Mutex::new(()),
        });
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("reins-sqlite-checkpoint".into())
            .spawn(move || run_checkpointer(&connection, &theirs))
            .map_err(|e| {
                Error::Unavailable(format!("cannot start the sqlite checkpointer: {e}"))
            })?;
        let every_pages = i32::try_from(every_pages.max(1)).unwrap_or(i32::MAX);
        Ok(Checkpoints {
            shared,
            thread: Some(thread),
            every_pages,
            max_pages: i32::try_from(max_pages.max(1)).unwrap_or(i32::MAX),
            next_at_pages: every_pages,
            last_pages: 0,
        })
    }

    /// Called by the writer after each commit that succeeded.
    pub(super) fn committed(&mut self, writer: &Connection) {
        let pages = WAL_PAGES.get();
        if pages < self.last_pages {
            self.next_at_pages = self.every_pages;
        }
        self.last_pages = pages;
        if pages < self.next_at_pages {
            return;
        }
        self.next_at_pages = pages.saturating_add(self.every_pages);
        if pages < self.max_pages {
            let mut state = lock(&self.shared.state);
            state.wanted = true;
            self.shared.wake.notify_one();
            return;
        }
        let _turn = lock(&self.shared.turn);
        match checkpoint(writer) {
            Ok((log, copied)) if copied < log => tracing::info!(
                log,
                copied,
                "the sqlite write-ahead log is past store.wal_pages_max and a reader keeps \
                 part of it; the writer tries again later"
            ),
            Ok(_) => {}
            Err(error) => tracing::warn!(
                %error,
                "the sqlite writer's checkpoint failed; the write-ahead log keeps growing until \
                 one succeeds"
            ),
        }
    }
}

impl Drop for Checkpoints {
    fn drop(&mut self) {
        lock(&self.shared.state).stop = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            // A checkpointer that panicked has nothing left to clean up.
            let _ = thread.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values stay consistent whatever a panicking holder did.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A PASSIVE checkpoint: the frames in the log and how many of them are in the database file.
fn checkpoint(connection: &Connection) -> Result<(i64, i64)> {
    Ok(connection
        .prepare_cached("PRAGMA wal_checkpoint(PASSIVE)")?
        .query_row([], |row| Ok((row.get(1)?, row.get(2)?)))?)
}

fn run_checkpointer(connection: &Connection, shared: &Shared) {
    loop {
        {
            let mut state = lock(&shared.state);
            while !state.wanted && !state.stop {
                state = shared
                    .wake
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if state.stop {
                return;
            }
            state.wanted = false;
        }
        let _turn = lock(&shared.turn);
        if let Err(error) = checkpoint(connection) {
            tracing::warn!(
                %error,
                "sqlite checkpoint failed; the write-ahead log keeps its frames until one succeeds"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::SqliteStore;
    use crate::StoreOptions;

    const EVERY_PAGES: u32 = 20;
    const MAX_PAGES: u32 = 200;

    /// A log bigger than the bound by more than one batch can add: each write below adds one
    /// page and a batch holds at most `write_batch_max` (64) writes.
    const LOG_PAGES_ALLOWED: u64 = MAX_PAGES as u64 + 2 * 64;

    /// A store with small checkpoint bounds and a table `t` to fill.
    async fn open(dir: &tempfile::TempDir) -> (SqliteStore, PathBuf) {
        let path = dir.path().join("reins.db");
        let options = StoreOptions {
            wal_checkpoint_pages: EVERY_PAGES,
            wal_pages_max: MAX_PAGES,
            ..StoreOptions::default()
        };
        let store = SqliteStore::open(&path, &options).expect("open");
        store
            .write(|c| Ok(c.execute_batch("CREATE TABLE t (x BLOB)")?))
            .await
            .expect("create");
        (store, path)
    }

    fn wal_of(path: &std::path::Path) -> PathBuf {
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        PathBuf::from(wal)
    }

    /// The page size and the frames of the log's current generation: those after the header
    /// that carry its salts (a log started over leaves older frames behind them).
    fn log_frames(path: &std::path::Path) -> (u64, u64) {
        let log = std::fs::read(wal_of(path)).expect("read the log");
        let word = |at: usize| u32::from_be_bytes(log[at..at + 4].try_into().expect("4 bytes"));
        let page = u64::from(word(8));
        let frame = 24 + page as usize;
        let mut frames = 0;
        let mut at = 32;
        while at + frame <= log.len() && word(at + 8) == word(16) && word(at + 12) == word(20) {
            frames += 1;
            at += frame;
        }
        (page, frames)
    }

    /// Writes `count` rows of a page each, 16 writers at once so the writer never idles.
    async fn write_pages(store: &SqliteStore, count: usize) {
        let writers = (0..16).map(|_| async {
            for _ in 0..count / 16 {
                store
                    .write(|c| Ok(c.execute("INSERT INTO t VALUES (randomblob(3000))", [])?))
                    .await
                    .expect("a write");
            }
        });
        futures_util::future::join_all(writers).await;
    }

    /// The rows the writes left, as a reader sees them.
    async fn rows_of(store: &SqliteStore) -> i64 {
        store
            .read(|c| Ok(c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))?))
            .await
            .expect("count")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_write_ahead_log_stays_bounded_under_sustained_writes() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, path) = open(&dir).await;
        write_pages(&store, 3200).await;

        // The file keeps the largest size the log ever had.
        let (page, _) = log_frames(&path);
        let file = std::fs::metadata(wal_of(&path)).expect("log").len();
        let peak = (file - 32) / (24 + page);
        assert!(
            peak <= LOG_PAGES_ALLOWED,
            "the log grew to {peak} pages, past {MAX_PAGES} by more than a batch"
        );
        let rows = rows_of(&store).await;
        assert_eq!(rows, 3200);
        let integrity: String = store
            .read(|c| Ok(c.query_row("PRAGMA integrity_check", [], |r| r.get(0))?))
            .await
            .expect("integrity check");
        assert_eq!(integrity, "ok");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reader_that_keeps_the_log_delays_checkpoints_and_fails_no_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, path) = open(&dir).await;

        // A snapshot held open (as a backup would) keeps every later frame out of the file.
        let reader = rusqlite::Connection::open(&path).expect("reader");
        reader
            .execute_batch("BEGIN; SELECT count(*) FROM t;")
            .expect("hold a snapshot");
        write_pages(&store, 800).await;
        let (_, pinned) = log_frames(&path);
        assert!(
            pinned > LOG_PAGES_ALLOWED,
            "the log should grow past its bound while a reader keeps it, has {pinned} pages"
        );

        reader.execute_batch("COMMIT").expect("end the snapshot");
        write_pages(&store, 800).await;
        let (_, frames) = log_frames(&path);
        assert!(
            frames <= LOG_PAGES_ALLOWED,
            "the log did not start over once the reader was gone: {frames} pages"
        );
        let rows = rows_of(&store).await;
        assert_eq!(rows, 1600);
    }
}
