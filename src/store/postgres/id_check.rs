//! Ids on an int / bigint schema: each id a statement casts to the column's type is checked first,
//! so a bad one is `StoreError::BadId` (STORAGE_CONFIG_002) before anything is read or written,
//! never a cast failing half-way through a statement. Only the canonical decimal of a positive
//! integer in the column's range passes: one thread has one spelling, so its lease, stop key and
//! ledger keys (all keyed by the text) cannot split between "7" and "007". Every id, of any
//! type, first passes `store::id_text` (at most 255 characters, no NUL), the rule of all backends.

use super::PgStore;
use super::options::IdType;
use crate::store::{StoreError, StoreResult, StoredMessage, ThreadRef};

/// `value` as a `kind` id, or the error naming `field`.
pub(super) fn check_id(kind: IdType, field: &'static str, value: &str) -> StoreResult<()> {
    crate::store::id_text::check_text_id(field, value)?;
    let Some(max) = kind.max() else { return Ok(()) };
    let canonical = !value.is_empty() && !value.starts_with('0') && value.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<i64>() {
        Ok(n) if canonical && n >= 1 && n <= max => Ok(()),
        _ => Err(StoreError::BadId { field, value: value.chars().take(80).collect(), id_type: kind.name(), max }),
    }
}

impl PgStore {
    /// The thread and user of `t`.
    pub(super) fn check_thread(&self, t: &ThreadRef) -> StoreResult<()> {
        check_id(self.opts.id_type, "thread_id", &t.thread_id)?;
        check_id(self.opts.user_id_type, "user_id", &t.user_id)
    }

    /// A thread id alone.
    pub(super) fn check_thread_id(&self, thread_id: &str) -> StoreResult<()> {
        check_id(self.opts.id_type, "thread_id", thread_id)
    }

    /// A user id alone.
    pub(super) fn check_user_id(&self, user_id: &str) -> StoreResult<()> {
        check_id(self.opts.user_id_type, "user_id", user_id)
    }

    /// Message ids (they share the thread ids' type, as in 10xGraph).
    pub(super) fn check_messages(&self, msgs: &[StoredMessage]) -> StoreResult<()> {
        msgs.iter().try_for_each(|m| check_id(self.opts.id_type, "message_id", &m.id))
    }

    /// A message id alone.
    pub(super) fn check_message_id(&self, message_id: &str) -> StoreResult<()> {
        check_id(self.opts.id_type, "message_id", message_id)
    }
}

#[cfg(test)]
mod tests {
    use super::{IdType, check_id};

    #[test]
    fn only_canonical_positive_integers_in_range_pass() {
        for ok in ["1", "7", "2147483647"] {
            assert!(check_id(IdType::Int, "thread_id", ok).is_ok(), "{ok}");
        }
        assert!(check_id(IdType::BigInt, "thread_id", "9223372036854775807").is_ok());
        for bad in ["", "0", "-3", "007", " 7", "7 ", "+7", "1.5", "2.0", "True", "1:2", "abc", "1e3", "2147483648"] {
            assert!(check_id(IdType::Int, "thread_id", bad).is_err(), "{bad:?}");
        }
        for bad in ["9223372036854775808", "1180591620717411303424", "-1"] {
            assert!(check_id(IdType::BigInt, "thread_id", bad).is_err(), "{bad:?}");
        }
        assert!(check_id(IdType::String, "thread_id", "anything: 1:2").is_ok());
    }
}
