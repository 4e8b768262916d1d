//! U+0000 on its way into PostgreSQL, which stores it in neither text nor jsonb.

use serde_json::Value;

/// Replaces every U+0000 in the strings of `v` with U+FFFD. That changes the data, so it is never
/// silent: a warning and the `nul_replaced` counter.
pub(super) fn strip_nul(v: &mut Value) {
    fn walk(v: &mut Value) -> usize {
        match v {
            Value::String(s) if s.contains('\0') => {
                let n = s.matches('\0').count();
                *s = s.replace('\0', "\u{FFFD}");
                n
            }
            Value::Array(a) => a.iter_mut().map(walk).sum(),
            Value::Object(o) => o.values_mut().map(walk).sum(),
            _ => 0,
        }
    }
    let replaced = walk(v);
    if replaced > 0 {
        crate::metrics::inc(&crate::metrics::metrics().nul_replaced);
        tracing::warn!(
            event = "nul_replaced",
            "{replaced} NUL character(s) stored as U+FFFD: PostgreSQL cannot store U+0000 in text or jsonb"
        );
    }
}
