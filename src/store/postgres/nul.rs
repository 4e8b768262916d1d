//! U+0000 on its way into PostgreSQL, which stores it in neither text nor jsonb.

use serde_json::Value;

/// Replaces every U+0000 in the strings of `v`, object keys included, with U+FFFD. That changes
/// the data, so it is never silent: a warning and the `nul_replaced` counter. A key was left as
/// it was, and PostgreSQL refused the whole write ("unsupported Unicode escape sequence"): a
/// tool's result `{"a\0": 1}` failed its step, and every resume ran the tool again.
pub(super) fn strip_nul(v: &mut Value) {
    fn walk(v: &mut Value) -> usize {
        match v {
            Value::String(s) if s.contains('\0') => {
                let n = s.matches('\0').count();
                *s = s.replace('\0', "\u{FFFD}");
                n
            }
            Value::Array(a) => a.iter_mut().map(walk).sum(),
            Value::Object(o) => {
                let mut n: usize = o.values_mut().map(walk).sum();
                if o.keys().any(|k| k.contains('\0')) {
                    // Rebuilt in order; a replaced key equal to another key of the object keeps
                    // the later value, as a repeated key of a JSON text does.
                    for (k, val) in std::mem::take(o) {
                        let k = if k.contains('\0') {
                            n += k.matches('\0').count();
                            k.replace('\0', "\u{FFFD}")
                        } else {
                            k
                        };
                        o.insert(k, val);
                    }
                }
                n
            }
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

#[cfg(test)]
mod tests {
    use super::strip_nul;
    use serde_json::json;

    #[test]
    fn nul_is_replaced_in_keys_and_values_in_order() {
        let mut v = json!({"a": 1, "k\u{0}": {"x\u{0}y": "v\u{0}"}, "z": [ "\u{0}" ]});
        strip_nul(&mut v);
        assert_eq!(v.to_string(), json!({"a": 1, "k\u{FFFD}": {"x\u{FFFD}y": "v\u{FFFD}"}, "z": ["\u{FFFD}"]}).to_string());
    }
}
