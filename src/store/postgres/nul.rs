//! U+0000 on its way into PostgreSQL, which stores it in neither text nor jsonb.

use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;

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
    report(walk(v));
}

/// The same replacement in a JSON text, escape by escape: `\u0000` (the only way a JSON text
/// holds U+0000) becomes `\ufffd`, and nothing else of the text changes, so no number is
/// rounded by a decode. None when the text holds no NUL.
pub(super) fn strip_nul_text(text: &str) -> Option<String> {
    const NUL: &[u8] = b"\\u0000";
    if !text.contains("\\u0000") {
        return None;
    }
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len() + 8);
    let (mut i, mut replaced) = (0, 0);
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
        } else if b[i..].starts_with(NUL) {
            out.extend_from_slice(b"\\ufffd");
            replaced += 1;
            i += NUL.len();
        } else {
            // Any other escape is two bytes (`\\` included, so its second backslash never
            // starts an escape of its own); a `\uXXXX` is copied on from its `u`.
            out.extend_from_slice(&b[i..(i + 2).min(b.len())]);
            i += 2;
        }
    }
    if replaced == 0 {
        return None;
    }
    report(replaced);
    // Only ASCII escapes were swapped for ASCII: still UTF-8.
    Some(String::from_utf8(out).expect("ASCII swapped for ASCII keeps UTF-8"))
}

/// `strip_nul_text` of a JSON document kept as text: the same document when it holds no NUL.
pub(super) fn nul_free_json(v: &RawValue) -> Cow<'_, RawValue> {
    match strip_nul_text(v.get()) {
        // Replacing one escape by another inside a string keeps the text one JSON value.
        Some(text) => {
            Cow::Owned(RawValue::from_string(text).expect("an escape swapped inside a string stays valid JSON"))
        }
        None => Cow::Borrowed(v),
    }
}

fn report(replaced: usize) {
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
    use super::{strip_nul, strip_nul_text};
    use serde_json::json;

    #[test]
    fn nul_escapes_are_replaced_in_the_text_and_nothing_else() {
        let text = r#"{"k\u0000":"a\u0000b","esc":"\\u0000","n":18446744073709551617,"u":"\u00e9"}"#;
        let got = strip_nul_text(text).unwrap();
        assert_eq!(got, r#"{"k\ufffd":"a\ufffdb","esc":"\\u0000","n":18446744073709551617,"u":"\u00e9"}"#);
        assert_eq!(strip_nul_text(r#"{"esc":"\\u0000"}"#), None);
        assert_eq!(strip_nul_text(r#"{"a":"b"}"#), None);
    }

    #[test]
    fn nul_is_replaced_in_keys_and_values_in_order() {
        let mut v = json!({"a": 1, "k\u{0}": {"x\u{0}y": "v\u{0}"}, "z": [ "\u{0}" ]});
        strip_nul(&mut v);
        assert_eq!(
            v.to_string(),
            json!({"a": 1, "k\u{FFFD}": {"x\u{FFFD}y": "v\u{FFFD}"}, "z": ["\u{FFFD}"]}).to_string()
        );
    }
}
