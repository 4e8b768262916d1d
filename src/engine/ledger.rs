//! The tool ledger's key and envelope rules. One place, so the key format (part of the stored
//! data) cannot drift between the lookup and the record.

use serde_json::Value;

/// `"<issuing assistant message_id>:<tool_call_id>"`, or None when either part is missing: a
/// wrong key could skip a tool that never ran, so without both parts the ledger is not used.
pub fn ledger_key(origin_message_id: Option<&str>, tool_call_id: Option<&str>) -> Option<String> {
    match (origin_message_id, tool_call_id) {
        (Some(m), Some(c)) if !m.is_empty() && !c.is_empty() => Some(format!("{m}:{c}")),
        _ => None,
    }
}

/// Only a well-formed envelope counts as a record; anything else means "run the tool".
pub fn is_valid_envelope(v: &Value) -> bool {
    let Some(obj) = v.as_object() else { return false };
    matches!(obj.get("__kind__").and_then(Value::as_str), Some("message" | "raw")) && obj.contains_key("value")
}

/// A key for the tool to pass to payment or email APIs: stable across replays of one call,
/// distinct for every thread and call. UUIDv5 (SHA-1) of the thread and the ledger key.
pub fn idempotency_key(thread_id: &str, ledger_key: &str) -> String {
    const NS: uuid::Uuid = uuid::Uuid::from_u128(0x7e2f_1c9a_4b3d_4e8f_9a6b_10c0_ffee_0001);
    let name = format!("{thread_id}\u{0}{ledger_key}");
    format!("tenx-{}", uuid::Uuid::new_v5(&NS, name.as_bytes()).simple())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_needs_both_parts() {
        assert_eq!(ledger_key(Some("m1"), Some("call_1")).as_deref(), Some("m1:call_1"));
        assert_eq!(ledger_key(None, Some("call_1")), None);
        assert_eq!(ledger_key(Some("m1"), Some("")), None);
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
