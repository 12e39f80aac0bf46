//! Applying what changed on the source to the target: each noted record
//! is read afresh from the source and written to the target as it is
//! there now, or deleted from the target if the source no longer has it.
//! Reading the latest state, rather than replaying each write, makes the
//! order of writes irrelevant and a second application harmless.

use std::collections::{BTreeMap, HashMap};

use orchestrator_core::TaskId;

use super::switch::Changed;
use crate::transfer::{self, TransferError};
use crate::{Record, RecordKind, Storage};

/// Applies `changed` from `source` to `target`, `batch` keys at a time;
/// the records written or deleted in the target.
pub(crate) async fn apply(
    source: &Storage,
    target: &Storage,
    changed: &Changed,
    batch: usize,
) -> Result<u64, TransferError> {
    let mut applied = 0;
    let mut by_kind: BTreeMap<RecordKind, Vec<String>> = BTreeMap::new();
    for (kind, key) in &changed.records {
        by_kind.entry(*kind).or_default().push(key.clone());
    }
    // In `RecordKind` order: a workflow before its tasks.
    for (kind, keys) in by_kind {
        for chunk in keys.chunks(batch.max(1)) {
            apply_records(source, target, kind, chunk, &mut applied).await?;
        }
    }
    let logs: Vec<TaskId> = changed.logs.iter().copied().collect();
    for chunk in logs.chunks(batch.max(1)) {
        transfer::sync_logs(source.transfer(), target.transfer(), chunk).await?;
    }
    if let Some(before) = changed.audit_pruned_before {
        target
            .retention()
            .prune_audit(before)
            .await
            .map_err(TransferError::Target)?;
    }
    Ok(applied)
}

/// One batch of keys of one kind: what the source holds is written as it
/// is (a noted key almost always changed, so the target is not read to
/// compare); a key the source no longer has is looked up in the target
/// and deleted there.
async fn apply_records(
    source: &Storage,
    target: &Storage,
    kind: RecordKind,
    keys: &[String],
    applied: &mut u64,
) -> Result<(), TransferError> {
    let mut writes = Vec::with_capacity(keys.len());
    let mut present = std::collections::HashSet::with_capacity(keys.len());
    for scanned in source
        .transfer()
        .fetch(kind, keys)
        .await
        .map_err(TransferError::Source)?
    {
        match scanned.record {
            Ok(record) => {
                present.insert(scanned.key);
                writes.push(record);
            }
            Err(reason) => {
                return Err(TransferError::Unreadable {
                    kind,
                    key: scanned.key,
                    reason,
                });
            }
        }
    }
    if !writes.is_empty() {
        target
            .transfer()
            .import(&writes)
            .await
            .map_err(TransferError::Target)?;
        *applied += writes.len() as u64;
    }
    let gone: Vec<String> = keys
        .iter()
        .filter(|k| !present.contains(*k))
        .cloned()
        .collect();
    if gone.is_empty() {
        return Ok(());
    }
    let held: HashMap<String, Record> = target
        .transfer()
        .fetch(kind, &gone)
        .await
        .map_err(TransferError::Target)?
        .into_iter()
        .filter_map(|s| Some((s.key, s.record.ok()?)))
        .collect();
    for old in held.values() {
        delete(target, old).await?;
        *applied += 1;
    }
    Ok(())
}

/// Deletes from the target a record the source no longer has, the way
/// the source lost it.
async fn delete(target: &Storage, record: &Record) -> Result<(), TransferError> {
    let gone = match record {
        // Retention deleted it, with its tasks and logs.
        Record::Workflow(w) => target
            .retention()
            .prune_workflows(&[(w.id, w.version)])
            .await
            .map(drop),
        Record::Secret(s) => target.access().delete_secret(&s.name).await.map(drop),
        // An ended dashboard session, removed once nothing accepts it.
        Record::Token(t) => target
            .access()
            .delete_tokens(std::slice::from_ref(&t.id))
            .await
            .map(drop),
        Record::Schedule(s) => target.schedules().delete_schedule(s.id).await.map(drop),
        Record::WebhookSubscription(s) => {
            target.webhooks().delete_subscription(&s.id).await.map(drop)
        }
        Record::WebhookDelivery(d) => target
            .webhooks()
            .prune_deliveries(std::slice::from_ref(&d.id))
            .await
            .map(drop),
        // Tasks go with their workflow; audit records by an audit prune,
        // applied as such. Claims are never deleted.
        Record::Task(_) | Record::Audit(_) | Record::ScheduleClaim(_) => Ok(()),
    };
    gone.map_err(TransferError::Target)
}

/// The records and logs of `changed` that still differ between the two
/// stores, as `kind key`: what a switch checks after its last application.
pub(crate) async fn differences(
    source: &Storage,
    target: &Storage,
    changed: &Changed,
    batch: usize,
) -> Result<Vec<String>, TransferError> {
    let mut differ = Vec::new();
    let mut by_kind: BTreeMap<RecordKind, Vec<String>> = BTreeMap::new();
    for (kind, key) in &changed.records {
        by_kind.entry(*kind).or_default().push(key.clone());
    }
    let contents = |scanned: Vec<crate::Scanned>| -> HashMap<String, Vec<u8>> {
        scanned
            .into_iter()
            .map(|s| {
                let json = s
                    .record
                    .map(|r| r.to_json())
                    .unwrap_or_else(String::into_bytes);
                (s.key, json)
            })
            .collect()
    };
    for (kind, keys) in by_kind {
        // Audit records a prune removed from both are not compared.
        for chunk in keys.chunks(batch.max(1)) {
            let left = contents(
                source
                    .transfer()
                    .fetch(kind, chunk)
                    .await
                    .map_err(TransferError::Source)?,
            );
            let right = contents(
                target
                    .transfer()
                    .fetch(kind, chunk)
                    .await
                    .map_err(TransferError::Target)?,
            );
            for key in chunk {
                if left.get(key) != right.get(key) {
                    differ.push(format!("{kind} {key}"));
                }
            }
        }
    }
    let logs: Vec<TaskId> = changed.logs.iter().copied().collect();
    for chunk in logs.chunks(batch.max(1)) {
        let left = source
            .transfer()
            .log_lengths(chunk)
            .await
            .map_err(TransferError::Source)?;
        let right = target
            .transfer()
            .log_lengths(chunk)
            .await
            .map_err(TransferError::Target)?;
        for ((task, a), b) in chunk.iter().zip(left).zip(right) {
            if a != b {
                differ.push(format!(
                    "log {task}: {a} bytes in the source, {b} in the target"
                ));
            }
        }
    }
    Ok(differ)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly by design

    use chrono::Utc;
    use orchestrator_core::access::{ApiToken, Role};

    use super::*;
    use crate::fs::{FsBackend, FsOptions};

    /// A token record the source deleted (an ended dashboard session) is
    /// deleted from the target too, and one it changed is written there.
    #[tokio::test]
    async fn a_token_record_the_source_deleted_leaves_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            let path = dir.path().join(name);
            async move { Storage::new(FsBackend::open(&path, FsOptions::default()).await.unwrap()) }
        };
        let (source, target) = (open("source").await, open("target").await);
        let now = Utc::now();
        let token = ApiToken::new("t1".into(), "ui".into(), Role::Viewer, "orch_t1_x", now);
        let session = ApiToken::session("s1".into(), &token, now, now);
        for store in [&source, &target] {
            store.access().put_token(&token).await.unwrap();
            store.access().put_token(&session).await.unwrap();
        }
        source.access().delete_tokens(&["s1".into()]).await.unwrap();
        let mut revoked = token.clone();
        revoked.revoked_at = Some(now);
        revoked.version += 1;
        source.access().put_token(&revoked).await.unwrap();

        let mut changed = Changed::default();
        for id in ["s1", "t1"] {
            changed.records.insert((RecordKind::Token, id.to_owned()));
        }
        assert_eq!(apply(&source, &target, &changed, 10).await.unwrap(), 2);
        assert_eq!(target.access().tokens().await.unwrap(), vec![revoked]);
        assert!(
            differences(&source, &target, &changed, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }
}
