//! The limits every backend puts on a thread, user or message id, checked before anything is read
//! or written. PostgreSQL holds them in `VARCHAR(255)` columns (10xGraph's schema) and stores no
//! U+0000 in text, so there such an id failed inside a statement with the server's own words.
//! SQLite and memory would take them, and a thread that worked there would then fail on
//! PostgreSQL; one rule on all three keeps a thread id portable between backends.

use super::{StoreError, StoreResult, StoredMessage, ThreadRef};

/// The longest id, in characters (`VARCHAR(255)` counts characters, not bytes).
pub const MAX_ID_CHARS: usize = 255;

/// `value` as an id named `field` (`thread_id`, `user_id`, `message_id`), or `StoreError::BadTextId`.
pub fn check_text_id(field: &'static str, value: &str) -> StoreResult<()> {
    check_no_nul(field, value)?;
    let n = value.chars().count();
    if n <= MAX_ID_CHARS {
        return Ok(());
    }
    let reason = format!("must be at most {MAX_ID_CHARS} characters long (it has {n})");
    Err(StoreError::BadTextId { field, value: value.chars().take(80).collect(), reason })
}

/// `value`, a text a store keeps in a `TEXT` column (a run id, the lease's holder), without the
/// NUL PostgreSQL refuses there; no length limit.
pub fn check_no_nul(field: &'static str, value: &str) -> StoreResult<()> {
    if !value.contains('\0') {
        return Ok(());
    }
    let reason = "must not contain the NUL character (U+0000)".to_owned();
    Err(StoreError::BadTextId { field, value: value.chars().take(80).collect(), reason })
}

/// The name a thread gets when its first write creates it: 10xGraph's `"Thread <id>"`, cut to
/// `MAX_ID_CHARS` characters as the `VARCHAR(255)` column holds it, the same on every backend.
pub fn default_thread_name(thread_id: &str) -> String {
    format!("Thread {thread_id}").chars().take(MAX_ID_CHARS).collect()
}

/// A thread's name as given to `put_thread`: at most `MAX_ID_CHARS` characters on every backend
/// (10xGraph's `VARCHAR(255)` column). PostgreSQL refused a longer one with its own words while
/// SQLite and memory kept it, so a name that worked on one backend failed on another.
pub fn check_thread_name(name: Option<&str>) -> StoreResult<()> {
    let Some(name) = name else { return Ok(()) };
    let n = name.chars().count();
    if n <= MAX_ID_CHARS {
        return Ok(());
    }
    Err(StoreError::BadTextId {
        field: "thread_name",
        value: name.chars().take(80).collect(),
        reason: format!("must be at most {MAX_ID_CHARS} characters long (it has {n})"),
    })
}

/// The thread and user of `t`.
pub fn check_ref(t: &ThreadRef) -> StoreResult<()> {
    check_text_id("thread_id", &t.thread_id)?;
    check_text_id("user_id", &t.user_id)
}

/// The ids of messages about to be written.
pub fn check_messages(msgs: &[StoredMessage]) -> StoreResult<()> {
    msgs.iter().try_for_each(|m| check_text_id("message_id", &m.id))
}

#[cfg(test)]
mod tests {
    use super::{MAX_ID_CHARS, check_text_id};

    #[test]
    fn length_counts_characters_and_nul_is_refused() {
        assert!(check_text_id("thread_id", &"x".repeat(MAX_ID_CHARS)).is_ok());
        assert!(check_text_id("thread_id", &"é".repeat(MAX_ID_CHARS)).is_ok(), "510 bytes, 255 characters");
        assert!(check_text_id("thread_id", &"x".repeat(MAX_ID_CHARS + 1)).is_err());
        assert!(check_text_id("thread_id", "a\0b").is_err());
        assert!(check_text_id("thread_id", "").is_ok(), "not this check's concern");
    }
}
