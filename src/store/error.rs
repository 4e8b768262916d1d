use thiserror::Error;

/// Storage failures. The Python layer maps each variant to one exception class and error code.
#[derive(Debug, Error)]
pub enum StoreError {
    /// Another execution committed after this run read the thread (STORAGE_CONFLICT_001).
    #[error("State was modified by another execution (expected version {expected}, found {current})")]
    Stale {
        /// The thread written.
        thread_id: String,
        /// The version the run read and wrote against.
        expected: i64,
        /// The version the thread is at now.
        current: i64,
    },
    /// The thread's messages were written or deleted outside a step after the caller read the
    /// state it writes over (`StepWrite::expected_mark`; STORAGE_CONFLICT_001, as `Stale`).
    #[error(
        "State was modified by another execution (version {version}: the thread's messages were written or \
         deleted after it was read; read it again)"
    )]
    StaleMessages {
        /// The thread written.
        thread_id: String,
        /// The version read, still the latest.
        version: i64,
    },
    /// The thread belongs to another user and isolation is on (STORAGE_FORBIDDEN_001).
    #[error("Thread '{thread_id}' belongs to another user")]
    Forbidden {
        /// The other user's thread.
        thread_id: String,
    },
    /// A message id already used by another thread (STORAGE_FORBIDDEN_002).
    #[error("{}", if message_id.is_empty() {
        "A message id of this step belongs to another thread (PostgreSQL does not say which)".to_owned()
    } else {
        format!("Message '{message_id}' belongs to another thread")
    })]
    MessageInOtherThread {
        /// The id that is taken.
        message_id: String,
    },
    /// An id that the database's id type cannot hold (a thread, user or message id that is not
    /// the decimal of a positive integer in range on an int / bigint schema), refused before
    /// anything was read or written (STORAGE_CONFIG_002).
    #[error("{field} must be a positive integer (id_type={id_type:?}, at most {max}), got {value:?}")]
    BadId {
        /// Which id: `thread_id`, `user_id` or `message_id`.
        field: &'static str,
        /// The id as given.
        value: String,
        /// The column's id type (`int`, `bigint`).
        id_type: &'static str,
        /// The largest id the column holds.
        max: i64,
    },
    /// A thread, user or message id longer than `store::MAX_ID_CHARS` characters or holding
    /// U+0000, refused by every backend before anything was read or written (STORAGE_CONFIG_002).
    #[error("{field} {reason}, got {value:?}")]
    BadTextId {
        /// Which id: `thread_id`, `user_id` or `message_id`.
        field: &'static str,
        /// The id as given (its first 80 characters).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A bad argument (schema name, DSN, URL) refused before anything was written; the text says which.
    #[error("{0}")]
    InvalidInput(String),
    /// The run's lease on the thread was taken over by another execution: this write, and every
    /// later one of this run, is refused (STORAGE_FENCED_001).
    #[error(
        "thread '{thread_id}' lease token {token} {}; this run no longer owns the thread and wrote nothing",
        match current {
            Some(c) => format!("was superseded (current token {c})"),
            // No newer holder: the lease could not be renewed in time, or the thread was deleted
            // while this run held it.
            None => "is no longer valid (the lease could not be renewed, or the thread was deleted)".to_owned(),
        }
    )]
    Fenced {
        /// The thread written.
        thread_id: String,
        /// The token this run held.
        token: i64,
        /// The token that holds the thread now (None: no lease row).
        current: Option<i64>,
    },
    /// The backend failed (STORAGE_001); the text says which operation.
    #[error("{op} failed: {source}")]
    Backend {
        /// The operation that failed.
        op: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The database refused the data itself (PostgreSQL's data exceptions and program limits,
    /// SQLSTATE classes 22 and 54: a value it cannot hold, a row too large): the same write fails
    /// the same way on every retry (STORAGE_001, as `Backend`).
    #[error("{op} failed: {message}")]
    Refused {
        /// The operation that failed.
        op: &'static str,
        /// The database's message, password redacted.
        message: String,
    },
    /// The database could not be reached (after retries), gave no answer in time, or was locked
    /// by another writer for longer than the wait allows: TransientStorageError (a later retry
    /// can pass). The message says which.
    #[error("{op} failed: {message}")]
    Transient {
        /// The operation that could not reach the database.
        op: &'static str,
        /// The driver's last error, password redacted.
        message: String,
    },
    /// Another session or process held a lock the operation needed past the wait allowed
    /// (PostgreSQL's `lock_timeout`, SQLite's busy wait); nothing was written. A
    /// TransientStorageError as `Transient`, told apart so a run told to wait for a busy thread
    /// (`on_busy="wait"`) waits on through it, up to its `busy_timeout`, as it does for a held
    /// lease: a holder frozen inside a transaction holds the lease row's lock, not the lease.
    #[error("{op} failed: {message}")]
    LockWait {
        /// The operation that waited.
        op: &'static str,
        /// What held it, password redacted.
        message: String,
    },
    /// A failpoint armed with `raise` fired inside the transaction (nothing was committed).
    #[error("{0}")]
    Failpoint(String),
    /// A schema migration failed; nothing of it was applied (one transaction).
    #[error("migration failed: {0}")]
    Schema(String),
}

impl StoreError {
    /// The store refused what the write holds, so the same write fails the same way on every
    /// retry (a message id of another thread, a bad id, a value the database cannot hold). Not a
    /// conflict, a fence, isolation, an unreachable database or any other backend failure (a
    /// deadlock or a full disk may pass).
    pub fn refuses_the_data(&self) -> bool {
        matches!(
            self,
            StoreError::MessageInOtherThread { .. }
                | StoreError::Refused { .. }
                | StoreError::BadId { .. }
                | StoreError::BadTextId { .. }
                | StoreError::InvalidInput(_)
        )
    }

    /// A `Backend` error for operation `op`, keeping `e` as its source.
    pub fn backend(op: &'static str, e: impl std::error::Error + Send + Sync + 'static) -> Self {
        StoreError::Backend { op, source: Box::new(e) }
    }
}

/// Every store operation's result.
pub type StoreResult<T> = Result<T, StoreError>;
