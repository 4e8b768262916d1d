//! The tool ledger's key and envelope rules. One place, so the key format (part of the stored
//! data) cannot drift between the lookup and the record.
//!
//! A key is the JSON array `[<message id>, <call id>]`, with the ids as the model gave them (a
//! string or an integer, so `123` and `"123"` stay apart) and no separator that an id could
//! contain. A call id repeated within one message gets its occurrence as a third element; a call
//! without an id is keyed by its position, `[<message id>, null, <position>]`. Distinct calls
//! therefore never share a key. 10xGraph 0.10 wrote `"<message id>:<call id>"`; those rows are
//! still read (`legacy_key`, `legacy_row_matches`) but never written.

use serde_json::{Value, json};

/// How one call of an assistant message is identified, as the host read it from the message.
#[derive(Debug, Clone, PartialEq)]
pub struct CallKey<'a> {
    /// The issuing message's id: a JSON string or number; None (or "") when it has none.
    pub message_id: Option<&'a Value>,
    /// The call's id; None (or "") when the model gave none.
    pub call_id: Option<&'a Value>,
    /// The call's position in the message's list of calls.
    pub position: usize,
    /// How many earlier calls of the same message carry the same call id.
    pub occurrence: usize,
}

/// The longest key stored verbatim: 10xGraph's column is VARCHAR(255). Longer keys are stored as
/// a digest of themselves (`#` and a UUIDv5), which no verbatim key can equal.
const MAX_KEY_CHARS: usize = 255;

fn present(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !(v.is_null() || v.as_str() == Some("")))
}

/// The call's ledger key, or None when the message has no id: without the issuing message a key
/// could name a call of another turn (models reuse `call_1`), so such a call has no ledger.
pub fn ledger_key(k: &CallKey<'_>) -> Option<String> {
    let mid = present(k.message_id)?;
    let key = match present(k.call_id) {
        Some(cid) if k.occurrence == 0 => json!([mid, cid]),
        Some(cid) => json!([mid, cid, k.occurrence]),
        None => json!([mid, null, k.position]),
    }
    .to_string();
    if key.chars().count() <= MAX_KEY_CHARS {
        return Some(key);
    }
    const NS: uuid::Uuid = uuid::Uuid::from_u128(0x7e2f_1c9a_4b3d_4e8f_9a6b_10c0_ffee_0002);
    Some(format!("#{}", uuid::Uuid::new_v5(&NS, key.as_bytes()).simple()))
}

/// An id as 10xGraph's f-string wrote it.
fn text(v: &Value) -> String {
    v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
}

/// The key 10xGraph 0.10 wrote for this call (`"<message id>:<call id>"`), read so a thread that
/// 10xGraph left mid-tool-node does not run its finished calls again. None where 10xGraph could
/// not have written a row for this call (no ids, or a repeated call id after its first).
pub fn legacy_key(k: &CallKey<'_>) -> Option<String> {
    let (mid, cid) = (present(k.message_id)?, present(k.call_id)?);
    (k.occurrence == 0).then(|| format!("{}:{}", text(mid), text(cid)))
}

/// Whether a row found under `legacy_key` belongs to this call. `"a:b:c"` is both `("a:b", "c")`
/// and `("a", "b:c")`, so a row is taken only when the split is unique (one `:` in all) or the
/// recorded tool message names this call's id.
pub fn legacy_row_matches(k: &CallKey<'_>, row: &Value) -> bool {
    let (Some(mid), Some(cid)) = (present(k.message_id), present(k.call_id)) else { return false };
    let (mid, cid) = (text(mid), text(cid));
    if !mid.contains(':') && !cid.contains(':') {
        return true;
    }
    let Some(msg) = row.get("value").filter(|_| row.get("__kind__").and_then(Value::as_str) == Some("message")) else {
        return false;
    };
    let named = |v: Option<&Value>| v.is_some_and(|v| text(v) == cid);
    named(msg.pointer("/metadata/tool_call_id"))
        || msg
            .get("content")
            .and_then(Value::as_array)
            .is_some_and(|blocks| blocks.iter().any(|b| named(b.get("call_id"))))
}

/// The stored keys a user's key may name, most literal first: the key itself, then, for a key
/// in 10xGraph's `"<message id>:<call id>"` form, each reading of it in today's format (so
/// `aget_tool_result(config, f"{mid}:{cid}")` finds rows recorded under the new keys).
pub fn lookup_keys(user_key: &str) -> Vec<String> {
    let mut out = vec![user_key.to_owned()];
    let forms = |s: &str| -> Vec<Value> {
        let mut v = vec![Value::from(s)];
        if let Ok(n) = s.parse::<i64>()
            && n.to_string() == s
        {
            v.push(Value::from(n));
        }
        v
    };
    for (i, _) in user_key.match_indices(':') {
        let (m, c) = (&user_key[..i], &user_key[i + 1..]);
        for mid in forms(m) {
            for cid in forms(c) {
                let k = CallKey { message_id: Some(&mid), call_id: Some(&cid), position: 0, occurrence: 0 };
                if let Some(key) = ledger_key(&k)
                    && !out.contains(&key)
                {
                    out.push(key);
                }
            }
        }
    }
    out
}

/// Only a well-formed envelope counts as a record; anything else means "run the tool".
pub fn is_valid_envelope(v: &Value) -> bool {
    let Some(obj) = v.as_object() else { return false };
    matches!(obj.get("__kind__").and_then(Value::as_str), Some("message" | "raw")) && obj.contains_key("value")
}

/// A key for the tool to pass to payment or email APIs: stable across replays of one call,
/// distinct for every thread and call. UUIDv5 (SHA-1) of the thread and the ledger key (a key
/// never contains NUL: it is JSON or a digest, so the pair splits one way only).
pub fn idempotency_key(thread_id: &str, ledger_key: &str) -> String {
    const NS: uuid::Uuid = uuid::Uuid::from_u128(0x7e2f_1c9a_4b3d_4e8f_9a6b_10c0_ffee_0001);
    let name = format!("{thread_id}\u{0}{ledger_key}");
    format!("tenx-{}", uuid::Uuid::new_v5(&NS, name.as_bytes()).simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(mid: Value, cid: Value, position: usize, occurrence: usize) -> Option<String> {
        ledger_key(&CallKey { message_id: Some(&mid), call_id: Some(&cid), position, occurrence })
    }

    #[test]
    fn key_needs_the_message_id_and_falls_back_to_the_position_without_a_call_id() {
        assert_eq!(key(json!("m1"), json!("call_1"), 0, 0).as_deref(), Some(r#"["m1","call_1"]"#));
        assert_eq!(
            ledger_key(&CallKey { message_id: None, call_id: Some(&json!("c")), position: 0, occurrence: 0 }),
            None
        );
        assert_eq!(key(json!(""), json!("c"), 0, 0), None);
        assert_eq!(key(json!("m1"), json!(""), 2, 0).as_deref(), Some(r#"["m1",null,2]"#));
        assert_eq!(key(json!("m1"), Value::Null, 3, 0).as_deref(), Some(r#"["m1",null,3]"#));
    }

    #[test]
    fn distinct_calls_never_share_a_key() {
        let keys = [
            key(json!("msg-1:a"), json!("b"), 0, 0),
            key(json!("msg-1"), json!("a:b"), 0, 0),
            key(json!(123), json!("c"), 0, 0),
            key(json!("123"), json!("c"), 0, 0),
            key(json!("m"), json!(7), 0, 0),
            key(json!("m"), json!("7"), 0, 0),
            key(json!("m"), json!("dup"), 0, 0),
            key(json!("m"), json!("dup"), 1, 1),
            key(json!("m"), json!("dup"), 2, 2),
            key(json!("m"), Value::Null, 0, 0),
            key(json!("m"), Value::Null, 1, 0),
            key(json!("x".repeat(300)), json!("c"), 0, 0),
            key(json!("x".repeat(301)), json!("c"), 0, 0),
        ];
        let set: std::collections::HashSet<_> = keys.iter().map(|k| k.clone().unwrap()).collect();
        assert_eq!(set.len(), keys.len());
        assert!(keys.iter().all(|k| k.as_ref().unwrap().chars().count() <= MAX_KEY_CHARS));
    }

    #[test]
    fn legacy_keys_are_read_only_where_unambiguous() {
        let k = |m: Value, c: Value| (m, c);
        let (m, c) = k(json!("msg-1"), json!("a:b"));
        let call = CallKey { message_id: Some(&m), call_id: Some(&c), position: 0, occurrence: 0 };
        assert_eq!(legacy_key(&call).as_deref(), Some("msg-1:a:b"));
        let theirs = json!({"__kind__": "message", "value": {"content": [{"type": "tool_result", "call_id": "b"}]}});
        let ours = json!({"__kind__": "message", "value": {"content": [{"type": "tool_result", "call_id": "a:b"}]}});
        assert!(!legacy_row_matches(&call, &theirs));
        assert!(legacy_row_matches(&call, &ours));
        assert!(!legacy_row_matches(&call, &json!({"__kind__": "raw", "value": 1})));
        let (m, c) = k(json!(5), json!("c1"));
        let plain = CallKey { message_id: Some(&m), call_id: Some(&c), position: 0, occurrence: 0 };
        assert_eq!(legacy_key(&plain).as_deref(), Some("5:c1"));
        assert!(legacy_row_matches(&plain, &json!({"__kind__": "raw", "value": 1})));
        assert_eq!(legacy_key(&CallKey { occurrence: 1, ..plain.clone() }), None);
    }

    #[test]
    fn a_user_key_in_the_old_form_finds_the_new_rows() {
        let keys = lookup_keys("m1:call_1");
        assert_eq!(keys[0], "m1:call_1");
        assert!(keys.contains(&key(json!("m1"), json!("call_1"), 0, 0).unwrap()));
        let keys = lookup_keys("12:3");
        assert!(keys.contains(&key(json!(12), json!("3"), 0, 0).unwrap()));
        assert!(keys.contains(&key(json!("12"), json!(3), 0, 0).unwrap()));
        assert!(lookup_keys("a:b:c").contains(&key(json!("a:b"), json!("c"), 0, 0).unwrap()));
        assert!(lookup_keys("a:b:c").contains(&key(json!("a"), json!("b:c"), 0, 0).unwrap()));
    }

    #[test]
    fn envelopes() {
        assert!(is_valid_envelope(&json!({"__kind__": "raw", "value": 1})));
        assert!(is_valid_envelope(&json!({"__kind__": "message", "value": {}})));
        assert!(!is_valid_envelope(&json!({"__kind__": "other", "value": 1})));
        assert!(!is_valid_envelope(&json!({"__kind__": "raw"})));
        assert!(!is_valid_envelope(&json!("raw")));
    }

    #[test]
    fn idempotency_keys_are_stable_and_distinct() {
        let a = idempotency_key("t1", "m1:call_1");
        assert_eq!(a, idempotency_key("t1", "m1:call_1"));
        assert_ne!(a, idempotency_key("t2", "m1:call_1"));
        assert_ne!(a, idempotency_key("t1", "m9:call_1"));
    }
}
