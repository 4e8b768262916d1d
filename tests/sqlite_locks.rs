//! The SQLite store's file locks are open-file-description locks (src/store/sqlite_locks.rs):
//! visible to POSIX locks taken by this very process (another SQLite library would take those),
//! not dropped when another descriptor of the file closes, and released with the store.
#![cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]

mod common;
use serde_json::json;
use std::os::fd::AsRawFd;
use std::path::Path;
use tenxgraph::store::{Checkpointer, SqliteStore, StepWrite, StoredMessage, ThreadRef};

/// SQLite's SHARED range in the database file and the dead-man-switch byte of the -shm file.
const SHARED_FIRST: i64 = 0x4000_0002;
const SHARED_SIZE: i64 = 510;
const SHM_DMS: i64 = 128;

/// Whether a write lock on the range would conflict with a lock someone holds, asked with a
/// classic POSIX F_GETLK through a descriptor of our own: the kernel never reports this process's
/// own POSIX locks, so only an OFD lock (or another process) shows up.
fn locked(path: &Path, start: i64, len: i64) -> bool {
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = libc::F_WRLCK as _;
    l.l_whence = libc::SEEK_SET as _;
    l.l_start = start;
    l.l_len = len;
    assert_eq!(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut l) }, 0);
    i32::from(l.l_type) != libc::F_UNLCK
}

/// Descriptors this process holds on `dir`'s files.
fn open_fds_under(dir: &Path) -> Vec<String> {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|t| t.starts_with(dir))
        .map(|t| t.display().to_string())
        .collect()
}

#[tokio::test]
async fn our_locks_are_seen_by_posix_lockers_in_this_process_and_survive_their_close() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locks.db");
    let shm = dir.path().join("locks.db-shm");
    let store = SqliteStore::open(db.to_str().unwrap(), false, false).await.unwrap();
    store.setup().await.unwrap();
    let t = ThreadRef::new("th", "u");
    let state = json!({"n": 1});
    let msgs = [StoredMessage::new("m1", &json!({"message_id": "m1", "role": "user", "content": []}))];
    let (state_text, mark) = common::state_text(&state);
    let step = StepWrite {
        expected_version: 0,
        state: state_text,
        mark,
        new_messages: &msgs,
        replace_messages: false,
        fence: None,
        release_lease: false,
        in_tx: None,
        previous_mark: None,
        expected_mark: None,
    };
    store.put_step(&t, step).await.unwrap();

    // Idle pooled connections in WAL mode keep a SHARED lock on the database and the -shm DMS.
    assert!(locked(&db, SHARED_FIRST, SHARED_SIZE), "the store's SHARED lock is invisible to this process");
    assert!(locked(&shm, SHM_DMS, 1), "the store's -shm lock is invisible to this process");
    // `locked` opened and closed descriptors of both files: with POSIX locks that close dropped
    // every lock the process held on them.
    assert!(locked(&db, SHARED_FIRST, SHARED_SIZE), "closing another descriptor dropped the store's lock");
    assert!(locked(&shm, SHM_DMS, 1), "closing another descriptor dropped the store's -shm lock");
    assert!(store.load(&t).await.unwrap().is_some());

    store.release().await.unwrap();
    // Released with the store: no lock left, and no descriptor (our per-inode dups included).
    assert!(!locked(&db, SHARED_FIRST, SHARED_SIZE), "a lock outlived the store");
    assert_eq!(open_fds_under(dir.path()), Vec::<String>::new());
}
