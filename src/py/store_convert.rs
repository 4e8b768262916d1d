//! The conversions `NativeStore`'s methods share: JSON text in, rows and tuples out, and the
//! awaitable every method returns (polled on the awaiting loop: src/py/driver.rs).

use super::errors::store_err;
use crate::store::{
    ChangeMark, Checkpointer, LedgerRow, MESSAGES_CHANGED, StoreError, StoredMessage, ThreadRef, ThreadRow,
    shared_json_from_text,
};
use pyo3::BoundObject;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::Value;
use std::future::Future;

/// `ttl_seconds` as every store can hold it: None or 0 is no expiry, a longer one (infinity
/// included) is cut to `MAX_CACHE_TTL_SECONDS`, NaN or a negative is refused. Postgres could not hold
/// `NOW() + 1e15 s` (STORAGE_001 "timestamp out of range") and Redis refused such a `PX` (and was
/// marked down for it), while memory and SQLite stored the value.
pub(super) fn cache_ttl(ttl: Option<f64>) -> PyResult<Option<f64>> {
    match ttl {
        Some(t) if t.is_nan() || t < 0.0 => Err(PyValueError::new_err(format!("ttl_seconds must be >= 0, got {t}"))),
        Some(t) if t > 0.0 => Ok(Some(t.min(crate::store::MAX_CACHE_TTL_SECONDS))),
        Some(_) | None => Ok(None),
    }
}

pub(super) type ThreadTuple = (String, String, Option<String>, String, f64, f64);

pub(super) fn awaitable<'py, T, F>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, StoreError>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let driver = super::driver::drive(py, fut, |py, r| match r {
        Ok(v) => Ok(v.into_pyobject(py).map_err(Into::into)?.into_any().unbind()),
        Err(e) => Err(store_err(py, e)),
    })?;
    Ok(driver.into_bound(py).into_any())
}

/// One ledger row; `late` as `ledger_put` says (the thread must exist, no token checked).
pub(super) async fn put_one(
    s: &dyn Checkpointer,
    t: &ThreadRef,
    row: LedgerRow,
    late: bool,
) -> Result<bool, StoreError> {
    let fence = late.then_some(crate::store::THREAD_MUST_EXIST);
    Ok(s.ledger_put_many(t, &[row], fence).await? > 0)
}

pub(super) fn json_in(s: &str) -> PyResult<Value> {
    serde_json::from_str(s).map_err(|e| PyValueError::new_err(format!("not valid JSON: {e}")))
}

/// A ledger row from the host: its text is checked to be one JSON value, and kept as it is.
pub(super) fn row_in(key: String, json: String) -> PyResult<LedgerRow> {
    Ok((key, shared_json_from_text(json).map_err(|e| PyValueError::new_err(format!("not valid JSON: {e}")))?))
}

pub(super) fn messages_in(msgs: Vec<(String, String)>) -> PyResult<Vec<StoredMessage>> {
    msgs.into_iter()
        .map(|(id, d)| {
            StoredMessage::from_text(id, d).map_err(|e| PyValueError::new_err(format!("not valid JSON: {e}")))
        })
        .collect()
}

pub(super) fn thread_out(r: ThreadRow) -> ThreadTuple {
    (r.thread_id, r.user_id, r.thread_name, r.meta.to_string(), r.created_at, r.updated_at)
}

pub(super) fn t(thread_id: String, user_id: String) -> ThreadRef {
    ThreadRef::new(thread_id, user_id)
}

/// `(seen, mark)` from the host as a `ChangeMark`. The mark must be one `messages_changed_mark`
/// could have made: a commit's mark left by a message write would let a process that holds that
/// commit's live state skip loading the messages the write changed.
pub(super) fn change_mark(after: Option<(String, String)>) -> PyResult<Option<ChangeMark>> {
    let Some((seen, mark)) = after else { return Ok(None) };
    if !mark.strip_prefix(MESSAGES_CHANGED).is_some_and(|rest| rest.starts_with('-') && rest.len() > 1) {
        return Err(PyValueError::new_err(format!("a message write's mark must begin with {MESSAGES_CHANGED:?}-")));
    }
    Ok(Some(ChangeMark { seen, mark }))
}
