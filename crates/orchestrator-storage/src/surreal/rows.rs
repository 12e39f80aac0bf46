//! Records as rows: the `doc` every record is stored as, the fields
//! queries filter on, and the rows of task logs.

use orchestrator_core::webhook::Delivery;
use orchestrator_core::{Priority, Task, Workflow};
use serde::Serialize;
use serde::de::DeserializeOwned;
use surrealdb::types::{Bytes, RecordId, SurrealValue};

use crate::{Error, Record, RecordKind, Result};

/// Log chunks fetched per round trip when reading a log.
pub(super) const LOG_CHUNKS_PER_READ: i64 = 256;

pub(super) fn from_doc<T: DeserializeOwned>(context: &str, doc: &str) -> Result<T> {
    serde_json::from_str(doc).map_err(|e| Error::Database {
        context: context.to_owned(),
        message: format!("unreadable stored record: {e}"),
    })
}

pub(super) fn to_doc(value: &impl Serialize) -> Result<String> {
    serde_json::to_string(value)
        .map_err(|e| Error::io("serialize record", std::io::Error::other(e)))
}

/// The table that holds records of `kind`.
pub(super) fn table_of(kind: RecordKind) -> &'static str {
    match kind {
        RecordKind::Workflow => "workflow",
        RecordKind::Task => "task",
        RecordKind::Token => "api_token",
        RecordKind::Secret => "secret",
        RecordKind::Audit => "audit",
        RecordKind::Schedule => "schedule",
        RecordKind::ScheduleClaim => "schedule_claim",
        RecordKind::WebhookSubscription => "webhook_subscription",
        RecordKind::WebhookDelivery => "webhook_delivery",
    }
}

/// Whether a record key is made of plain characters only (ids, names),
/// so that it can stand inside `⟨…⟩` in a statement.
pub(super) fn is_plain_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 128
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The stored row of any record: `doc` and the fields queries need.
pub(super) fn row_of(record: &Record) -> Result<serde_json::Value> {
    match record {
        Record::Workflow(w) => workflow_row(w, false),
        Record::Task(t) => task_row(t, false),
        Record::Token(t) => Ok(serde_json::json!({"doc": to_doc(t)?})),
        Record::Secret(s) => Ok(serde_json::json!({"doc": to_doc(s)?})),
        Record::Audit(a) => {
            let mut row = serde_json::json!({
                "doc": to_doc(a)?,
                "time_ms": a.time.timestamp_millis(),
                "actor": a.actor,
                "action": a.action,
            });
            if let Some(target) = &a.target {
                row["target"] = target.clone().into();
            }
            Ok(row)
        }
        Record::Schedule(s) => Ok(serde_json::json!({"doc": to_doc(s)?, "version": s.version})),
        Record::ScheduleClaim(c) => Ok(serde_json::json!({
            "doc": to_doc(c)?,
            "version": c.version,
            "schedule": c.schedule_id.to_string(),
            "due_ms": c.due.timestamp_millis(),
        })),
        Record::WebhookSubscription(s) => Ok(serde_json::json!({"doc": to_doc(s)?})),
        Record::WebhookDelivery(d) => delivery_row(d),
    }
}

/// The `webhook_delivery` row: `doc` and the fields its queries filter on.
pub(super) fn delivery_row(delivery: &Delivery) -> Result<serde_json::Value> {
    Ok(serde_json::json!({
        "doc": to_doc(delivery)?,
        "version": version_param(delivery.version),
        "subscription": delivery.subscription_id,
        "status": delivery.status.as_str(),
        "created_ms": delivery.created_at.timestamp_millis(),
    }))
}

/// Appends to `data` the bytes of `chunks` (`[start, end, bytes]`, in
/// order) from offset `from`, up to `max_bytes` in all; returns the offset
/// reached.
pub(super) fn gather_log(
    chunks: Vec<(i64, i64, Bytes)>,
    mut from: u64,
    max_bytes: usize,
    data: &mut Vec<u8>,
) -> u64 {
    for (start, end, bytes) in chunks {
        let start = u64::try_from(start).unwrap_or(0);
        let skip = usize::try_from(from.saturating_sub(start)).unwrap_or(usize::MAX);
        let rest = bytes.get(skip.min(bytes.len())..).unwrap_or_default();
        let take = rest.len().min(max_bytes - data.len());
        data.extend_from_slice(&rest[..take]);
        from = u64::try_from(end).unwrap_or(from);
        if data.len() >= max_bytes {
            break;
        }
    }
    from
}

/// A `log_chunk` row of a bulk log import.
#[derive(SurrealValue)]
#[surreal(crate = "surrealdb::types")]
pub(super) struct LogChunkRow {
    pub(super) task: String,
    pub(super) start_offset: i64,
    pub(super) end_offset: i64,
    pub(super) data: Bytes,
}

/// A `log_length` row of a bulk log import.
#[derive(SurrealValue)]
#[surreal(crate = "surrealdb::types")]
pub(super) struct LogLengthRow {
    pub(super) id: RecordId,
    pub(super) bytes: i64,
}

pub(super) fn version_param(version: u64) -> i64 {
    i64::try_from(version).unwrap_or(i64::MAX)
}

pub(super) fn to_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(super) fn priority_rank(priority: Priority) -> i64 {
    Priority::ALL
        .iter()
        .position(|p| *p == priority)
        .map_or(0, to_i64)
}

/// A record's key mirrored so that it sorts newest first: each hex digit
/// `0` … `f` becomes `P` … `A`, anything else stays. The same mapping as
/// `fn::newest_first` of migration 0011 (a test checks that the two
/// agree): the stored field of every row (migration 0016), and a cursor's
/// bound.
pub(super) fn newest_first(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '0'..='9' => char::from(b'P' - (c as u8 - b'0')),
            'a'..='f' => char::from(b'F' - (c as u8 - b'a')),
            _ => c,
        })
        .collect()
}

/// The record for a task: the query fields and the whole task as `doc`.
pub(super) fn task_row(task: &Task, with_id: bool) -> Result<serde_json::Value> {
    let id = task.id.to_string();
    let mut row = serde_json::json!({
        "doc": to_doc(task)?,
        "version": task.version,
        "workflow": task.workflow_id.to_string(),
        "status": task.status.as_str(),
        "priority": priority_rank(task.priority),
        "newest_first": newest_first(&id),
    });
    if with_id {
        row["id"] = id.into();
    }
    Ok(row)
}

pub(super) fn workflow_row(workflow: &Workflow, with_id: bool) -> Result<serde_json::Value> {
    let id = workflow.id.to_string();
    let mut row = serde_json::json!({
        "newest_first": newest_first(&id),
        "doc": to_doc(workflow)?,
        "version": workflow.version,
        "status": workflow.status.as_str(),
        "kind": workflow.kind,
        "priority": priority_rank(workflow.priority),
        "revision": workflow.revision,
        "search": crate::workflow_search_text(workflow),
    });
    // Absent, not null: an `option<string>` field holds NONE, which the
    // unique indexes ignore.
    for (field, value) in [
        ("reference", &workflow.reference),
        ("trace_id", &workflow.trace_id),
        ("idempotency_key", &workflow.idempotency_key),
    ] {
        if let Some(value) = value {
            row[field] = value.clone().into();
        }
    }
    if with_id {
        row["id"] = id.into();
    }
    Ok(row)
}
