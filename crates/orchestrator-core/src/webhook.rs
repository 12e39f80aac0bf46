//! Notifications as data: webhook subscriptions, the event types they
//! name, the fields an event carries, the body template that turns those
//! fields into a payload, and the outbox record of one delivery with its
//! log of attempts (see `docs/notifications.md`).
//!
//! Sending, signing and storing happen elsewhere; here is what a
//! delivery is and how it moves on after an attempt, decided from the
//! attempt's result and `now` given in.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::template::limits::{
    MAX_LOGGED_DELIVERY_ATTEMPTS, MAX_WEBHOOK_EVENT_TYPES, MAX_WEBHOOK_TEMPLATE_BYTES,
    MAX_WEBHOOK_URL_CHARS,
};

/// The event types a subscription may name. Adding a type is one line
/// here (and the code that emits it).
pub const EVENT_TYPES: &[&str] = &[
    "workflow.completed",
    "workflow.failed",
    "workflow.cancelled",
    "step.failed",
    "schedule.missed",
    "approval.requested",
];

/// The fields of an event, by the name a body template uses
/// (`${event.<name>}`), each with what it holds. A field that does not
/// apply to an event type (`step` of a workflow event) is empty.
pub const EVENT_FIELDS: &[(&str, &str)] = &[
    ("id", "the delivery's id, also sent as `webhook-id`"),
    ("type", "the event type, e.g. `workflow.failed`"),
    ("timestamp", "when the event happened (RFC 3339)"),
    (
        "summary",
        "one line for people, e.g. \"workflow `deploy` failed\"",
    ),
    ("workflow_id", "the workflow's id"),
    ("workflow_name", "the workflow's name"),
    ("workflow_kind", "the template it runs (`ref_name`)"),
    ("workflow_status", "the workflow's status"),
    (
        "step",
        "the template step of a failed step or of an approval gate",
    ),
    ("task_id", "the step's task id"),
    ("error", "why it failed (secret values redacted)"),
    ("schedule_id", "the schedule's id"),
    ("schedule_name", "the schedule's name"),
    ("missed", "how many due times were missed"),
    ("node", "the service node that saw the event"),
];

/// One event's field values, by field name (a name of [`EVENT_FIELDS`]).
pub type EventFields = BTreeMap<&'static str, String>;

/// Why a subscription is refused; `field` names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SubscriptionError {
    pub field: String,
    pub message: String,
}

fn refuse(field: impl Into<String>, message: impl Into<String>) -> SubscriptionError {
    SubscriptionError {
        field: field.into(),
        message: message.into(),
    }
}

/// Checks the event types of a new subscription: known,
/// at least one, at most [`MAX_WEBHOOK_EVENT_TYPES`], no repeats.
pub fn check_event_types(events: &[String]) -> Result<(), SubscriptionError> {
    if events.is_empty() {
        return Err(refuse(
            "events",
            format!(
                "name at least one event type (one of {})",
                EVENT_TYPES.join(", ")
            ),
        ));
    }
    if events.len() > MAX_WEBHOOK_EVENT_TYPES {
        return Err(refuse(
            "events",
            format!(
                "{} event types is more than the maximum of {MAX_WEBHOOK_EVENT_TYPES}",
                events.len()
            ),
        ));
    }
    for (i, event) in events.iter().enumerate() {
        if !EVENT_TYPES.contains(&event.as_str()) {
            return Err(refuse(
                format!("events[{i}]"),
                format!(
                    "unknown event type `{event}` (expected one of {})",
                    EVENT_TYPES.join(", ")
                ),
            ));
        }
        if events[..i].contains(event) {
            return Err(refuse(
                format!("events[{i}]"),
                format!("event type `{event}` is named twice"),
            ));
        }
    }
    Ok(())
}

/// Checks a target URL's length; whether the host may be reached is the
/// HTTP allowlist's decision, made by the sender.
pub fn check_url(url: &str) -> Result<(), SubscriptionError> {
    if url.is_empty() {
        return Err(refuse("url", "must not be empty"));
    }
    // Counted in characters, as the API document's `maxLength` is.
    let length = url.chars().count();
    if length > MAX_WEBHOOK_URL_CHARS {
        return Err(refuse(
            "url",
            format!("{length} characters is more than the maximum of {MAX_WEBHOOK_URL_CHARS}"),
        ));
    }
    Ok(())
}

/// Checks a body template: at most [`MAX_WEBHOOK_TEMPLATE_BYTES`] as
/// compact JSON, and every `${...}` in its strings an `${event.<field>}`
/// of a known field. The error names the JSON path and the placeholder.
pub fn check_body_template(template: &Value) -> Result<(), SubscriptionError> {
    let size = serde_json::to_vec(template).map_or(usize::MAX, |b| b.len());
    if size > MAX_WEBHOOK_TEMPLATE_BYTES {
        return Err(refuse(
            "body_template",
            format!("{size} bytes is more than the maximum of {MAX_WEBHOOK_TEMPLATE_BYTES}"),
        ));
    }
    check_strings(template, "body_template".to_owned())
}

fn check_strings(value: &Value, path: String) -> Result<(), SubscriptionError> {
    match value {
        Value::String(text) => placeholders(text).try_for_each(|found| match found {
            Ok((_, name)) if field_known(name) => Ok(()),
            Ok((whole, _)) | Err(whole) => Err(refuse(
                path.clone(),
                format!(
                    "unknown placeholder `{whole}` (expected ${{event.<field>}} with a \
                         field of {})",
                    field_names().join(", ")
                ),
            )),
        }),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_strings(item, format!("{path}[{i}]"))),
        Value::Object(fields) => fields
            .iter()
            .try_for_each(|(key, item)| check_strings(item, format!("{path}.{key}"))),
        _ => Ok(()),
    }
}

fn field_known(name: &str) -> bool {
    EVENT_FIELDS.iter().any(|(known, _)| *known == name)
}

fn field_names() -> Vec<&'static str> {
    EVENT_FIELDS.iter().map(|(name, _)| *name).collect()
}

/// Each `${...}` of `text`: `Ok((whole, field))` for `${event.<field>}`,
/// `Err(whole)` for any other (an unclosed one included).
fn placeholders(text: &str) -> impl Iterator<Item = Result<(&str, &str), &str>> {
    let mut rest = text;
    std::iter::from_fn(move || {
        let start = rest.find("${")?;
        let after = &rest[start..];
        let Some(end) = after.find('}') else {
            rest = "";
            return Some(Err(after));
        };
        let whole = &after[..=end];
        rest = &after[end + 1..];
        Some(
            whole[2..end]
                .strip_prefix("event.")
                .map(|field| (whole, field))
                .ok_or(whole),
        )
    })
}

/// The body a subscription sends for an event: its template with every
/// `${event.<field>}` replaced by the field's value, or, without a
/// template, the Standard Webhooks shape `{"type", "timestamp", "data"}`
/// with every non-empty field in `data`. Values are put into JSON
/// strings, so serializing the result escapes them.
pub fn render_body(template: Option<&Value>, fields: &EventFields) -> Value {
    match template {
        Some(template) => substitute(template, fields),
        None => {
            let data: Map<String, Value> = fields
                .iter()
                .filter(|(name, value)| {
                    !value.is_empty() && !matches!(**name, "type" | "timestamp")
                })
                .map(|(name, value)| ((*name).to_owned(), Value::String(value.clone())))
                .collect();
            let field = |name: &str| fields.get(name).cloned().unwrap_or_default();
            serde_json::json!({
                "type": field("type"),
                "timestamp": field("timestamp"),
                "data": data,
            })
        }
    }
}

fn substitute(value: &Value, fields: &EventFields) -> Value {
    match value {
        Value::String(text) => {
            let mut out = String::with_capacity(text.len());
            let mut rest = text.as_str();
            while let Some(start) = rest.find("${") {
                out.push_str(&rest[..start]);
                let after = &rest[start..];
                let Some(end) = after.find('}') else {
                    break;
                };
                let whole = &after[..=end];
                match whole[2..end].strip_prefix("event.") {
                    Some(field) => out.push_str(fields.get(field).map_or("", String::as_str)),
                    // Refused at creation; kept as written if it got in.
                    None => out.push_str(whole),
                }
                rest = &after[end + 1..];
            }
            out.push_str(rest);
            Value::String(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| substitute(v, fields)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, v)| (key.clone(), substitute(v, fields)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A value sealed with the service's key (as secrets are): the nonce and
/// the ciphertext with its tag, base64. Never shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    pub nonce: String,
    pub ciphertext: String,
}

/// A webhook subscription: where to send which events, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscription {
    /// A UUIDv7, so ids sort by creation.
    pub id: String,
    pub url: String,
    /// Names of [`EVENT_TYPES`].
    pub events: Vec<String>,
    /// The body to send, with `${event.<field>}` placeholders; the
    /// Standard Webhooks shape when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_template: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The signing secret's bytes, sealed.
    pub secret: Sealed,
    pub created_at: DateTime<Utc>,
}

impl Subscription {
    pub fn wants(&self, event_type: &str) -> bool {
        self.events.iter().any(|e| e == event_type)
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum DeliveryStatus {
    /// In the outbox: to be sent at `next_attempt_at`.
    Pending,
    /// A 2xx answer came back.
    Delivered,
    /// Every attempt of its round failed (or the outbox was full).
    Failed,
}

crate::named_variants!(DeliveryStatus, "delivery status", [
    Pending => "pending",
    Delivered => "delivered",
    Failed => "failed",
]);

/// One attempt to send a delivery, as its log shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryAttempt {
    pub at: DateTime<Utc>,
    /// The answer's status code, when one came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u16>,
    /// Why no answer came, or why the answer is not a success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: u64,
}

impl DeliveryAttempt {
    pub fn succeeded(&self) -> bool {
        self.status_code
            .is_some_and(|code| (200..300).contains(&code))
    }
}

/// One message to one subscription: a record of the outbox until it is
/// delivered or given up, then of the delivery log until retention
/// deletes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Delivery {
    /// `msg_` and 32 hex digits, derived from the subscription and the
    /// event, so that nodes that each see the event store it once. Sent
    /// as `webhook-id`: the same on every attempt and re-send.
    pub id: String,
    pub subscription_id: String,
    pub event_type: String,
    /// The target, as the subscription said when the event came.
    pub url: String,
    /// The body as sent and signed, secret values redacted.
    pub body: String,
    pub status: DeliveryStatus,
    /// Attempts of the current round (since creation or the last
    /// re-send), which the bound on attempts counts.
    pub round_attempts: u32,
    /// The newest attempts, oldest first, at most
    /// [`MAX_LOGGED_DELIVERY_ATTEMPTS`].
    pub attempts: Vec<DeliveryAttempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Compare-and-set version, as on tasks.
    pub version: u64,
}

impl Delivery {
    /// A new delivery in the outbox, due now.
    pub fn new(
        id: String,
        subscription: &Subscription,
        event_type: &str,
        body: String,
        now: DateTime<Utc>,
    ) -> Delivery {
        Delivery {
            id,
            subscription_id: subscription.id.clone(),
            event_type: event_type.to_owned(),
            url: subscription.url.clone(),
            body,
            status: DeliveryStatus::Pending,
            round_attempts: 0,
            attempts: Vec::new(),
            next_attempt_at: Some(now),
            created_at: now,
            updated_at: now,
            version: 0,
        }
    }

    /// Records an attempt: delivered on a 2xx; otherwise pending again
    /// after `retry_in`, or failed once the round has had `max_attempts`.
    pub fn record(
        &mut self,
        attempt: DeliveryAttempt,
        max_attempts: u32,
        retry_in: chrono::Duration,
    ) {
        let now = attempt.at;
        let succeeded = attempt.succeeded();
        self.round_attempts = self.round_attempts.saturating_add(1);
        self.attempts.push(attempt);
        let excess = self
            .attempts
            .len()
            .saturating_sub(MAX_LOGGED_DELIVERY_ATTEMPTS);
        self.attempts.drain(..excess);
        self.updated_at = now;
        if succeeded {
            self.status = DeliveryStatus::Delivered;
            self.next_attempt_at = None;
        } else if self.round_attempts >= max_attempts {
            self.status = DeliveryStatus::Failed;
            self.next_attempt_at = None;
        } else {
            self.status = DeliveryStatus::Pending;
            self.next_attempt_at = Some(now + retry_in);
        }
    }

    /// Puts the delivery back in the outbox for a new round of attempts,
    /// due now (a re-send). Its log keeps the earlier attempts.
    pub fn resend(&mut self, now: DateTime<Utc>) {
        self.status = DeliveryStatus::Pending;
        self.round_attempts = 0;
        self.next_attempt_at = Some(now);
        self.updated_at = now;
    }

    /// Gives the delivery up without an attempt (the outbox is full).
    pub fn give_up(&mut self, reason: String, now: DateTime<Utc>) {
        self.status = DeliveryStatus::Failed;
        self.next_attempt_at = None;
        self.updated_at = now;
        self.attempts.push(DeliveryAttempt {
            at: now,
            status_code: None,
            error: Some(reason),
            duration_ms: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> EventFields {
        let mut fields = EventFields::new();
        fields.insert("type", "workflow.failed".into());
        fields.insert("timestamp", "2026-01-01T00:00:00Z".into());
        fields.insert("workflow_name", "deploy \"prod\"\nline two \\ end".into());
        fields.insert("step", String::new());
        fields
    }

    #[test]
    fn placeholders_are_replaced_and_escaped_by_serialization() {
        let template = serde_json::json!({
            "text": "${event.type}: ${event.workflow_name} (${event.step})",
            "blocks": [{"n": 1, "t": "${event.timestamp}"}],
            "literal": "cost $5 {not a placeholder}",
        });
        check_body_template(&template).unwrap();
        let body = render_body(Some(&template), &fields());
        let text = serde_json::to_string(&body).unwrap();
        assert!(
            text.contains(r#""text":"workflow.failed: deploy \"prod\"\nline two \\ end ()""#),
            "{text}"
        );
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["blocks"][0]["t"], "2026-01-01T00:00:00Z");
        assert_eq!(back["blocks"][0]["n"], 1);
        assert_eq!(back["literal"], "cost $5 {not a placeholder}");
    }

    #[test]
    fn without_a_template_the_body_has_the_standard_shape() {
        let body = render_body(None, &fields());
        assert_eq!(body["type"], "workflow.failed");
        assert_eq!(body["timestamp"], "2026-01-01T00:00:00Z");
        assert_eq!(
            body["data"]["workflow_name"],
            "deploy \"prod\"\nline two \\ end"
        );
        assert!(
            body["data"].get("step").is_none(),
            "empty fields are left out"
        );
        assert!(body["data"].get("type").is_none());
    }

    #[test]
    fn unknown_placeholders_are_refused_with_their_path() {
        let check = |template: Value| check_body_template(&template).unwrap_err().to_string();
        let error = check(serde_json::json!({"a": [{"b": "x ${event.nope} y"}]}));
        assert!(
            error.starts_with("body_template.a[0].b: unknown placeholder `${event.nope}`"),
            "{error}"
        );
        let error = check(serde_json::json!({"a": "${workflow.input.x}"}));
        assert!(error.contains("`${workflow.input.x}`"), "{error}");
        let error = check(serde_json::json!("open ${event.type"));
        assert!(error.contains("`${event.type`"), "{error}");
        let big = Value::String("x".repeat(MAX_WEBHOOK_TEMPLATE_BYTES));
        assert!(check(big).contains("more than the maximum"));
    }

    #[test]
    fn event_types_are_checked() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        check_event_types(&names(&["workflow.failed", "step.failed"])).unwrap();
        let error = |n: &[&str]| check_event_types(&names(n)).unwrap_err().to_string();
        assert!(error(&[]).starts_with("events: name at least one"));
        assert!(
            error(&["workflow.exploded"])
                .starts_with("events[0]: unknown event type `workflow.exploded`")
        );
        check_event_types(&names(&["approval.requested"])).unwrap();
        assert!(
            error(&["step.failed", "step.failed"])
                .starts_with("events[1]: event type `step.failed` is named twice")
        );
    }

    #[test]
    fn attempts_move_a_delivery_on_and_the_log_is_bounded() {
        let now: DateTime<Utc> = "2026-01-01T00:00:00Z".parse().unwrap();
        let subscription = Subscription {
            id: "s".into(),
            url: "http://127.0.0.1:1/".into(),
            events: vec!["workflow.failed".into()],
            body_template: None,
            description: None,
            secret: Sealed {
                nonce: String::new(),
                ciphertext: String::new(),
            },
            created_at: now,
        };
        let mut delivery = Delivery::new(
            "msg_1".into(),
            &subscription,
            "workflow.failed",
            "{}".into(),
            now,
        );
        let attempt = |code: u16| DeliveryAttempt {
            at: now,
            status_code: Some(code),
            error: None,
            duration_ms: 1,
        };
        let retry = chrono::Duration::seconds(5);
        delivery.record(attempt(500), 3, retry);
        assert_eq!(delivery.status, DeliveryStatus::Pending);
        assert_eq!(delivery.next_attempt_at, Some(now + retry));
        delivery.record(attempt(500), 3, retry);
        delivery.record(attempt(500), 3, retry);
        assert_eq!(delivery.status, DeliveryStatus::Failed);
        assert_eq!(delivery.next_attempt_at, None);
        delivery.resend(now);
        assert_eq!(
            (delivery.status, delivery.round_attempts),
            (DeliveryStatus::Pending, 0)
        );
        delivery.record(attempt(204), 3, retry);
        assert_eq!(delivery.status, DeliveryStatus::Delivered);
        assert_eq!(delivery.attempts.len(), 4);
        for _ in 0..2 * MAX_LOGGED_DELIVERY_ATTEMPTS {
            delivery.record(attempt(500), u32::MAX, retry);
        }
        assert_eq!(delivery.attempts.len(), MAX_LOGGED_DELIVERY_ATTEMPTS);
    }
}
