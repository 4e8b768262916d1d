//! The database file a store opened, so a write can tell when the path no longer names it.
//!
//! A file deleted (a cleanup job, `rm` to reset) or replaced by a rename while a process has it
//! open stays readable and writable through the open descriptors: every later turn committed
//! into the unlinked inode, reported success, and was gone for every other process and for this
//! one after a restart. Each write transaction compares the path with the inode opened first.

use super::StoreError;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub(super) struct FileId {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The file at `path` now (just after the pool opened and created it).
    pub(super) fn of(path: &str) -> Result<Self, StoreError> {
        // Absolute, as SQLite made it when it opened the file: a relative path checked after the
        // process changed its directory would name another file, or none.
        let path = std::path::absolute(path).map_err(|e| StoreError::backend("open", e))?;
        let meta = std::fs::metadata(&path).map_err(|e| StoreError::backend("open", e))?;
        Ok(FileId { dev: meta.dev(), ino: meta.ino(), path })
    }

    /// Fails when `path` no longer names the file opened: what this process would write could
    /// not be read back by anyone.
    pub(super) fn check(&self, op: &'static str) -> Result<(), StoreError> {
        let same = std::fs::metadata(&self.path).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino);
        if same {
            return Ok(());
        }
        // Deleted, the pool may already have made an empty file there for a new connection:
        // the two cases cannot be told apart, and need the same remedy.
        Err(StoreError::backend(
            op,
            std::io::Error::other(format!(
                "the SQLite database {} is no longer the file this process opened (it was deleted, or replaced \
                 by another file, while open): nothing more is written to the old file; restart the process (or \
                 open a new SqliteCheckpointer) to use the file now at that path",
                self.path.display()
            )),
        ))
    }
}
