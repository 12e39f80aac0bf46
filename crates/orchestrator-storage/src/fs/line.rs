//! One line of the journal or the snapshot: its framing and the records it
//! holds. Both files are made of these lines, and this is their only
//! definition (see `docs/storage.md`, "Records").
//!
//! A line is `<crc32 of the JSON, 8 lowercase hex digits> <JSON>\n`; the
//! JSON is a [`Line`], `{"type": ..., "data": ...}`.

use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use orchestrator_core::webhook::{Delivery, Subscription};
use orchestrator_core::{Task, TaskId, Workflow, WorkflowId};
use serde::{Deserialize, Serialize};

use crate::{Record, RecordKind};

/// Frames `json` as one line, newline included, onto `out`.
pub(super) fn encode_line(json: &[u8], out: &mut Vec<u8>) {
    let crc = crc32fast::hash(json);
    out.extend_from_slice(format!("{crc:08x} ").as_bytes());
    out.extend_from_slice(json);
    out.push(b'\n');
}

/// The JSON payload of a line (given without its newline), if its checksum
/// holds.
pub(super) fn decode_line(line: &[u8]) -> Option<&[u8]> {
    if line.len() < 10 || line[8] != b' ' {
        return None;
    }
    let crc = u32::from_str_radix(std::str::from_utf8(&line[..8]).ok()?, 16).ok()?;
    let json = &line[9..];
    (crc32fast::hash(json) == crc).then_some(json)
}

/// One journal or snapshot line: a record, or several written as one.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", content = "data", rename_all = "snake_case")]
pub(super) enum Line {
    Workflow(Workflow),
    Task(Task),
    /// A workflow with the tasks it gained (all of them when it is new) in
    /// one checksummed line, so a torn write keeps all of it or none.
    Submission {
        workflow: Workflow,
        tasks: Vec<Task>,
    },
    Token(ApiToken),
    Secret(SecretRecord),
    SecretDeleted {
        name: String,
    },
    Audit(AuditRecord),
    Schedule(Schedule),
    ScheduleDeleted {
        id: String,
    },
    ScheduleClaim(ScheduleClaim),
    /// Records deleted by retention: workflows with their tasks (listed,
    /// so that a reader of lines alone knows them), audit records, and
    /// token records of ended dashboard sessions (a build that predates
    /// `tokens` reads the line without them, and keeps those sessions,
    /// which it refuses anyway).
    Pruned {
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        workflows: Vec<WorkflowId>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tasks: Vec<TaskId>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        audit: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tokens: Vec<String>,
    },
    WebhookSubscription(Subscription),
    WebhookSubscriptionDeleted {
        id: String,
    },
    /// A delivery, new or moved on (the outbox and the delivery log).
    WebhookDelivery(Delivery),
    /// Deliveries deleted by retention.
    WebhookDeliveriesPruned {
        ids: Vec<String>,
    },
}

impl Line {
    /// The line that stores `record`.
    pub(super) fn of(record: Record) -> Line {
        match record {
            Record::Workflow(w) => Line::Workflow(w),
            Record::Task(t) => Line::Task(t),
            Record::Token(t) => Line::Token(t),
            Record::Secret(s) => Line::Secret(s),
            Record::Audit(a) => Line::Audit(a),
            Record::Schedule(s) => Line::Schedule(s),
            Record::ScheduleClaim(c) => Line::ScheduleClaim(c),
            Record::WebhookSubscription(s) => Line::WebhookSubscription(s),
            Record::WebhookDelivery(d) => Line::WebhookDelivery(d),
        }
    }
}

impl Line {
    /// The records this line writes.
    pub(super) fn keys(&self) -> Vec<(RecordKind, String)> {
        match self {
            Line::Workflow(w) => vec![(RecordKind::Workflow, w.id.to_string())],
            Line::Task(t) => vec![(RecordKind::Task, t.id.to_string())],
            Line::Submission { workflow, tasks } => {
                std::iter::once((RecordKind::Workflow, workflow.id.to_string()))
                    .chain(tasks.iter().map(|t| (RecordKind::Task, t.id.to_string())))
                    .collect()
            }
            Line::Token(t) => vec![(RecordKind::Token, t.id.clone())],
            Line::Secret(s) => vec![(RecordKind::Secret, s.name.clone())],
            Line::SecretDeleted { name } => vec![(RecordKind::Secret, name.clone())],
            Line::Audit(a) => vec![(RecordKind::Audit, a.id.clone())],
            Line::Schedule(s) => vec![(RecordKind::Schedule, s.id.to_string())],
            Line::ScheduleDeleted { id } => vec![(RecordKind::Schedule, id.clone())],
            Line::ScheduleClaim(c) => vec![(RecordKind::ScheduleClaim, c.key())],
            Line::Pruned {
                workflows,
                tasks,
                audit,
                tokens,
            } => (workflows
                .iter()
                .map(|w| (RecordKind::Workflow, w.to_string())))
            .chain(tasks.iter().map(|t| (RecordKind::Task, t.to_string())))
            .chain(audit.iter().map(|a| (RecordKind::Audit, a.clone())))
            .chain(tokens.iter().map(|t| (RecordKind::Token, t.clone())))
            .collect(),
            Line::WebhookSubscription(s) => vec![(RecordKind::WebhookSubscription, s.id.clone())],
            Line::WebhookSubscriptionDeleted { id } => {
                vec![(RecordKind::WebhookSubscription, id.clone())]
            }
            Line::WebhookDelivery(d) => vec![(RecordKind::WebhookDelivery, d.id.clone())],
            Line::WebhookDeliveriesPruned { ids } => ids
                .iter()
                .map(|id| (RecordKind::WebhookDelivery, id.clone()))
                .collect(),
        }
    }

    /// The records a damaged line seems to name, read as loosely as
    /// possible: a flipped byte in a value should still name its record.
    pub(super) fn keys_in_damaged(payload: &[u8]) -> Vec<(RecordKind, String)> {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
            return Vec::new();
        };
        let id = |v: &serde_json::Value| v.get("id").and_then(|id| id.as_str()).map(str::to_owned);
        let data = &value["data"];
        let mut keys = Vec::new();
        match value["type"].as_str() {
            Some("workflow") => keys.extend(id(data).map(|k| (RecordKind::Workflow, k))),
            Some("task") => keys.extend(id(data).map(|k| (RecordKind::Task, k))),
            Some("submission") => {
                keys.extend(id(&data["workflow"]).map(|k| (RecordKind::Workflow, k)));
                let tasks = data["tasks"].as_array().into_iter().flatten();
                keys.extend(tasks.filter_map(id).map(|k| (RecordKind::Task, k)));
            }
            Some("token") => keys.extend(id(data).map(|k| (RecordKind::Token, k))),
            Some("audit") => keys.extend(id(data).map(|k| (RecordKind::Audit, k))),
            Some("schedule" | "schedule_deleted") => {
                keys.extend(id(data).map(|k| (RecordKind::Schedule, k)));
            }
            Some("schedule_claim") => keys.extend(
                serde_json::from_value::<ScheduleClaim>(data.clone())
                    .ok()
                    .map(|c| (RecordKind::ScheduleClaim, c.key())),
            ),
            Some("pruned") => {
                let listed = |field: &str| {
                    data[field]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect::<Vec<_>>()
                };
                keys.extend(
                    listed("workflows")
                        .into_iter()
                        .map(|k| (RecordKind::Workflow, k)),
                );
                keys.extend(listed("tasks").into_iter().map(|k| (RecordKind::Task, k)));
                keys.extend(listed("audit").into_iter().map(|k| (RecordKind::Audit, k)));
            }
            Some("secret" | "secret_deleted") => keys.extend(
                data.get("name")
                    .and_then(|n| n.as_str())
                    .map(|n| (RecordKind::Secret, n.to_owned())),
            ),
            Some("webhook_subscription" | "webhook_subscription_deleted") => {
                keys.extend(id(data).map(|k| (RecordKind::WebhookSubscription, k)));
            }
            Some("webhook_delivery") => {
                keys.extend(id(data).map(|k| (RecordKind::WebhookDelivery, k)));
            }
            _ => {}
        }
        keys
    }

    /// The records this line stores.
    pub(super) fn into_records(self) -> Vec<Record> {
        match self {
            Line::Workflow(w) => vec![Record::Workflow(w)],
            Line::Task(t) => vec![Record::Task(t)],
            Line::Submission { workflow, tasks } => std::iter::once(Record::Workflow(workflow))
                .chain(tasks.into_iter().map(Record::Task))
                .collect(),
            Line::Token(t) => vec![Record::Token(t)],
            Line::Secret(s) => vec![Record::Secret(s)],
            Line::SecretDeleted { .. } => Vec::new(),
            Line::Audit(a) => vec![Record::Audit(a)],
            Line::Schedule(s) => vec![Record::Schedule(s)],
            Line::ScheduleDeleted { .. } | Line::Pruned { .. } => Vec::new(),
            Line::ScheduleClaim(c) => vec![Record::ScheduleClaim(c)],
            Line::WebhookSubscription(s) => vec![Record::WebhookSubscription(s)],
            Line::WebhookDelivery(d) => vec![Record::WebhookDelivery(d)],
            Line::WebhookSubscriptionDeleted { .. } | Line::WebhookDeliveriesPruned { .. } => {
                Vec::new()
            }
        }
    }

    /// Appends this line, framed, to `out`: the bytes the journal and the
    /// snapshot hold.
    pub(super) fn encode_into(&self, out: &mut Vec<u8>) -> serde_json::Result<()> {
        encode_line(&serde_json::to_vec(self)?, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip_and_detect_damage() {
        let mut out = Vec::new();
        encode_line(br#"{"a":1}"#, &mut out);
        // The framing is the on-disk format: pinned byte for byte.
        assert_eq!(out, b"561bacaf {\"a\":1}\n");
        let line = &out[..out.len() - 1];
        assert_eq!(decode_line(line), Some(&br#"{"a":1}"#[..]));
        let mut damaged = line.to_vec();
        damaged[12] = b'2';
        assert_eq!(decode_line(&damaged), None);
        assert_eq!(decode_line(&line[..line.len() - 2]), None);
        assert_eq!(decode_line(b"short"), None);
    }
}
