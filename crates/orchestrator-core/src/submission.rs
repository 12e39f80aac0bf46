//! What makes two submissions "the same request": a digest of the body's
//! canonical text, so that key order and whitespace do not make a repeat
//! look like a change (`Idempotency-Key` and `meta.ref` compare digests).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Hex SHA-256 of the body's canonical text. How long the caller waits for
/// the answer (`wait`, `wait_timeout_secs`) is not part of what it asks for.
pub fn submission_digest(body: &Value) -> String {
    let mut text = String::new();
    match body {
        Value::Object(map) => {
            let mut asked = map.clone();
            asked.remove("wait");
            asked.remove("wait_timeout_secs");
            canonical(&Value::Object(asked), &mut text);
        }
        other => canonical(other, &mut text),
    }
    crate::access::hex(&Sha256::digest(text.as_bytes()))
}

/// JSON with object keys sorted and no white space.
pub(crate) fn canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                canonical(&map[key], out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn key_order_and_waiting_do_not_change_the_digest() {
        let a = submission_digest(
            &json!({"template": "t", "vars": {"a": 1, "b": [1, {"y": 2, "x": 1}]}}),
        );
        let b = submission_digest(
            &json!({"vars": {"b": [1, {"x": 1, "y": 2}], "a": 1}, "wait": true, "template": "t", "wait_timeout_secs": 5}),
        );
        assert_eq!(a, b);
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn any_other_difference_does() {
        let a = submission_digest(&json!({"template": "t", "vars": {"a": 1}}));
        assert_ne!(
            a,
            submission_digest(&json!({"template": "t", "vars": {"a": 2}}))
        );
        assert_ne!(
            a,
            submission_digest(&json!({"template": "t", "vars": {"a": "1"}}))
        );
        assert_ne!(
            a,
            submission_digest(&json!({"template": "t", "vars": {"a": [1]}}))
        );
    }
}
