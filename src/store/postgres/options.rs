//! How a Postgres store is configured.

use std::time::Duration;

/// The settings of a `PgStore`; `Default` gives 10xGraph 0.10's defaults.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// The schema holding every table and function (checked by `validate_schema`).
    pub schema: String,
    /// Pool size: at most this many connections are open at once.
    pub max_connections: u32,
    /// How long a query waits for a pooled connection, and a connection attempt for the server,
    /// before failing with `StoreError::Transient`.
    pub acquire_timeout: Duration,
    /// State rows kept per thread (older ones are deleted by each step); 0 or less keeps all.
    pub state_history_limit: i32,
    /// Threads are private to the user who created them: another user reads nothing and writes
    /// fail with `StoreError::Forbidden`.
    pub enforce_user_isolation: bool,
    /// Connection attempts before `TransientStorageError` (with 0.2 s, 0.4 s, ... backoff).
    pub connect_retries: u32,
    /// The longest one statement (a transaction: each of its statements, BEGIN and COMMIT) waits
    /// for the server's answer before `StoreError::Transient` (STORAGE_TRANSIENT_001); the
    /// server is also asked to end a statement after it (`statement_timeout`), to give up a lock
    /// wait after `lock_wait` (`lock_timeout`), and to end a session idle in a transaction for
    /// this long (`idle_in_transaction_session_timeout`: a frozen client's locks go with it).
    pub statement_deadline: Duration,
    /// How long a statement waits for a row or advisory lock (`lock_timeout`): a lease row held
    /// by a frozen session then means "busy", not "wait for ever".
    pub lock_wait: Duration,
    /// The type of thread and message ids (10xGraph's `id_type`), for a database this store
    /// creates; an existing database keeps the types it was created with (`migrate`).
    pub id_type: IdType,
    /// The type of user ids (10xGraph's `user_id_type`), likewise.
    pub user_id_type: IdType,
}

/// An id column type, as 10xGraph 0.10's `PgCheckpointer` creates it. The store's bind
/// parameters stay text: statements cast them to the column's type (`cast`) and read the column
/// back as text (`text`), so a string schema runs exactly the statements it always did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdType {
    /// `VARCHAR(255)`.
    #[default]
    String,
    /// `SERIAL` (a 32-bit integer with a sequence as default).
    Int,
    /// `BIGSERIAL` (a 64-bit integer with a sequence as default).
    BigInt,
}

impl IdType {
    /// From 10xGraph's option value: `"string"`, `"int"` or `"bigint"`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "string" => Some(IdType::String),
            "int" => Some(IdType::Int),
            "bigint" => Some(IdType::BigInt),
            _ => None,
        }
    }

    /// The option value this type is named by.
    pub fn name(self) -> &'static str {
        match self {
            IdType::String => "string",
            IdType::Int => "int",
            IdType::BigInt => "bigint",
        }
    }

    /// The column type in `CREATE TABLE`, 10xGraph's `ID_TYPE_MAP`.
    pub(super) fn column(self) -> &'static str {
        match self {
            IdType::String => "VARCHAR(255)",
            IdType::Int => "SERIAL",
            IdType::BigInt => "BIGSERIAL",
        }
    }

    /// Appended to a text bind parameter compared with or written to such a column.
    pub(super) fn cast(self) -> &'static str {
        match self {
            IdType::String => "",
            IdType::Int => "::INTEGER",
            IdType::BigInt => "::BIGINT",
        }
    }

    /// Appended to such a column read back (or compared with a text column).
    pub(super) fn text(self) -> &'static str {
        match self {
            IdType::String => "",
            _ => "::text",
        }
    }

    /// From `information_schema.columns.data_type`.
    pub(super) fn from_data_type(t: &str) -> Option<Self> {
        match t {
            "character varying" | "text" => Some(IdType::String),
            "integer" => Some(IdType::Int),
            "bigint" => Some(IdType::BigInt),
            _ => None,
        }
    }

    /// The largest id the column holds (ids are positive).
    pub fn max(self) -> Option<i64> {
        match self {
            IdType::String => None,
            IdType::Int => Some(i32::MAX as i64),
            IdType::BigInt => Some(i64::MAX),
        }
    }
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: "public".into(),
            max_connections: 10,
            acquire_timeout: Duration::from_secs(10),
            state_history_limit: 20,
            enforce_user_isolation: true,
            connect_retries: 3,
            statement_deadline: Duration::from_secs(30),
            lock_wait: Duration::from_secs(5),
            id_type: IdType::String,
            user_id_type: IdType::String,
        }
    }
}
