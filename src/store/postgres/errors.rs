//! What a Postgres failure becomes: our RAISE codes as their `StoreError` variants, connection
//! trouble as `Transient`, and never a password in the text.

use crate::store::{StoreError, ThreadRef};

/// Maps sqlx errors: connection trouble is transient, our RAISE codes become their variants.
pub(super) fn map_err(op: &'static str, e: sqlx::Error, t: Option<&ThreadRef>) -> StoreError {
    let tid = || t.map(|t| t.thread_id.clone()).unwrap_or_default();
    if let Some(db) = e.as_database_error() {
        let detail = || {
            db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                .and_then(|p| p.detail().map(str::to_owned))
                .unwrap_or_default()
        };
        match db.code().as_deref() {
            Some("TX001") => {
                let detail = detail();
                let mut parts = detail.split(',').map(|x| x.trim().parse::<i64>().unwrap_or(-1));
                let (expected, current) = (parts.next().unwrap_or(-1), parts.next().unwrap_or(-1));
                return StoreError::Stale { thread_id: tid(), expected, current };
            }
            Some("TX002") => return StoreError::Forbidden { thread_id: tid() },
            Some("TX003") => return StoreError::MessageInOtherThread { message_id: String::new() },
            Some("TX004") => {
                let detail = detail();
                let mut parts = detail.split(',').map(|x| x.trim().parse::<i64>().ok());
                let token = parts.next().flatten().unwrap_or(-1);
                return StoreError::Fenced { thread_id: tid(), token, current: parts.next().flatten() };
            }
            _ => {}
        }
    }
    // The checkpointer was released (`arelease`, or `aclose` of a graph compiled with it): no
    // retry will ever pass, so not transient (a caller that retries transient errors, as the docs
    // tell it to, looped for ever on "the database is unreachable").
    if matches!(e, sqlx::Error::PoolClosed) {
        return StoreError::Backend {
            op,
            source: "the checkpointer was closed (arelease(), or aclose() of a graph compiled with it); \
                     open a new one"
                .into(),
        };
    }
    // Every connection of the pool is in use: the server may be fine (say so, a retry can pass).
    if matches!(e, sqlx::Error::PoolTimedOut) {
        return StoreError::Transient {
            op,
            message: "no connection of the pool became free within its timeout (pool_config max_size / timeout): \
                      every connection is in use or the database is unreachable"
                .into(),
        };
    }
    // 55P03: lock_timeout. The server is fine: another session held what the statement needed.
    if e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "55P03") {
        return StoreError::LockWait {
            op,
            message: format!(
                "another session held a lock this statement needed past lock_timeout; nothing was written, \
                 a retry can pass: {}",
                redact(&e.to_string())
            ),
        };
    }
    // The server is up but ended the statement or the session: said as such, so an operator
    // looks at timeouts and at who terminates sessions, not at the network.
    let code = e.as_database_error().and_then(|d| d.code());
    let code = code.as_deref();
    let server_ended = match code {
        Some("57014") => Some("the server cancelled the statement (statement_timeout, or pg_cancel_backend)"),
        Some("57P01" | "57P02" | "57P03") => {
            Some("the server ended the session (pg_terminate_backend, a restart or a shutdown)")
        }
        _ => None,
    };
    if let Some(what) = server_ended {
        return StoreError::Transient { op, message: format!("{what}; a retry can pass: {}", redact(&e.to_string())) };
    }
    // 25P03: the server ended a session idle in a transaction: the server or a peer stopped
    // answering, a retry later can pass.
    if matches!(e, sqlx::Error::Io(_) | sqlx::Error::Tls(_))
        || code.is_some_and(|c| c.starts_with("08") || c == "25P03")
    {
        return StoreError::Transient {
            op,
            message: format!("the database is unreachable: {}", redact(&e.to_string())),
        };
    }
    // Nothing of the statement was written, and the same call again can pass: said so, instead
    // of a generic STORAGE_001 that tells a caller not to retry.
    if lost_a_conflict(&e) {
        return StoreError::Transient {
            op,
            message: format!(
                "the database aborted the statement to resolve a conflict with another transaction; \
                 nothing was written, a retry can pass: {}",
                redact(&e.to_string())
            ),
        };
    }
    // 25006: the session is read-only (a standby after a failover, or read-only by the server's
    // setting): nothing was written, and the connections opened before now are retired so that a
    // retry once the server takes writes again opens a session that can write (read_only.rs).
    if code == Some("25006") {
        super::read_only::note_refusal();
        return StoreError::Transient {
            op,
            message: format!(
                "the server refused the write: the session is read-only (a standby after a failover, or \
                 default_transaction_read_only on the server); nothing was written, and a retry reconnects \
                 and can pass once the server takes writes: {}",
                redact(&e.to_string())
            ),
        };
    }
    // 53xxx: the server is out of a resource (53300 too many connections, 53100 disk full, 53200
    // out of memory, 53400 a configured limit): nothing was written, a retry later can pass.
    if code.is_some_and(|c| c.starts_with("53")) {
        return StoreError::Transient {
            op,
            message: format!(
                "the server is out of a resource (connections, disk, memory or a configured limit); nothing \
                 was written, a retry later can pass: {}",
                redact(&e.to_string())
            ),
        };
    }
    if code.is_some_and(|c| c.starts_with("22") || c.starts_with("54")) {
        return StoreError::Refused { op, message: redact(&e.to_string()) };
    }
    StoreError::Backend { op, source: with_pooler_hint(&e).into() }
}

/// 40P01: the server broke a deadlock by aborting this statement; 40001: a serialization
/// failure. Either way the statement wrote nothing.
pub(super) fn lost_a_conflict(e: &sqlx::Error) -> bool {
    e.as_database_error().and_then(|d| d.code()).is_some_and(|c| matches!(c.as_ref(), "40P01" | "40001"))
}

/// How many times a run's commit the server aborted to break a lock cycle is sent.
const VICTIM_TRIES: u32 = 3;

/// `send`'s statement, sent again while the server aborts it to break a lock cycle (up to
/// `VICTIM_TRIES` in all): it wrote nothing, and a lost commit for a cycle with a transaction
/// that is not ours (a 10xGraph process, an operator's job) would fail the run. Ours take their
/// locks in one order (the lease row, then the thread row); the warning makes a cycle of ours
/// visible.
pub(super) async fn sent_again_if_aborted<T, F, Fut>(what: &str, t: &ThreadRef, mut send: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    let mut tries = 1;
    loop {
        match send().await {
            Err(e) if tries < VICTIM_TRIES && lost_a_conflict(&e) => {
                tracing::warn!(
                    "{what} of thread {:?} was aborted by the database to resolve a lock conflict (attempt {tries}); \
                     nothing was written, trying again: {e}",
                    t.thread_id
                );
                tries += 1;
            }
            r => return r,
        }
    }
}

/// The error's text, redacted, with what to do about it in front when a connection pooler in
/// transaction mode stands between us and the server: its server connections change between
/// our statements, so a prepared statement is found twice (42P05) or not at all (26000).
pub(super) fn with_pooler_hint(e: &sqlx::Error) -> String {
    let text = redact(&e.to_string());
    match e.as_database_error().and_then(|d| d.code()).as_deref() {
        Some("42P05" | "26000") => format!(
            "a connection pooler in transaction mode is between tenxgraph and PostgreSQL (PgBouncer before 1.21, \
             or without max_prepared_statements): use session pooling, PgBouncer 1.21 or later with \
             max_prepared_statements > 0, or connect directly (docs/postgres.md): {text}"
        ),
        _ => text,
    }
}

/// Returns `text` with the password of every `scheme://user:password@host` in it replaced by
/// `***` (a password may hold spaces or `@`): no DSN password reaches a message or a log line.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        out.push_str(&rest[..i + 3]);
        rest = &rest[i + 3..];
        // The credentials run to the last '@' of the line, not to the first space: a password
        // may hold spaces or '@' (unencoded, as users paste them), and the host never has '@'.
        let line_end = rest.find('\n').unwrap_or(rest.len());
        let end = match rest[..line_end].rfind('@') {
            Some(at) => {
                at + rest[at..line_end]
                    .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
                    .unwrap_or(line_end - at)
            }
            None => rest.find(|c: char| c.is_whitespace() || c == '"' || c == '\'').unwrap_or(rest.len()),
        };
        let token = &rest[..end];
        match token.rfind('@') {
            Some(at) => {
                let cred = &token[..at];
                match cred.find(':') {
                    Some(colon) => {
                        out.push_str(&cred[..colon]);
                        out.push_str(":***");
                    }
                    None => out.push_str(cred),
                }
                out.push_str(&token[at..]);
            }
            None => out.push_str(token),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::{map_err, redact};
    use crate::store::StoreError;
    use std::borrow::Cow;

    /// A server error with only its SQLSTATE, as sqlx hands one over.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "server error {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            "server error"
        }
        fn code(&self) -> Option<Cow<'_, str>> {
            Some(Cow::Borrowed(self.0))
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    #[test]
    fn a_deadlock_or_serialization_victim_is_transient_and_other_server_errors_are_not() {
        for code in ["40P01", "40001"] {
            let e = map_err("delete thread", sqlx::Error::Database(Box::new(Coded(code))), None);
            assert!(
                matches!(&e, StoreError::Transient { message, .. } if message.contains("retry can pass")),
                "{code}: {e:?}"
            );
        }
        let e = map_err("delete thread", sqlx::Error::Database(Box::new(Coded("55P03"))), None);
        assert!(matches!(&e, StoreError::LockWait { message, .. } if message.contains("lock_timeout")), "{e:?}");
        let e = map_err("delete thread", sqlx::Error::Database(Box::new(Coded("42P01"))), None);
        assert!(matches!(e, StoreError::Backend { .. }), "{e:?}");
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(redact("postgresql://app:s3cret@db:5432/x failed"), "postgresql://app:***@db:5432/x failed");
        assert_eq!(redact("redis://:pw@h:6379/0"), "redis://:***@h:6379/0");
        assert_eq!(redact("no url here"), "no url here");
        assert_eq!(redact("postgresql://app@db/x"), "postgresql://app@db/x");
        assert_eq!(redact("postgresql://app:pa ss@db/x failed"), "postgresql://app:***@db/x failed");
        assert_eq!(redact("postgresql://app:p@ss w@db/x: bad"), "postgresql://app:***@db/x: bad");
    }
}
