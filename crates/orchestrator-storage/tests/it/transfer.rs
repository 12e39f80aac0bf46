//! Copying and verifying between stores (`orchestrator migrate`'s engine),
//! through the storage trait: every direction between the filesystem,
//! embedded SurrealDB and a real SurrealDB server, resumption after a
//! failed write, damaged source records, and a tampered target.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use chrono::Utc;
use orchestrator_core::access::{ApiToken, Role, SecretRecord};
use orchestrator_core::{AttemptRecord, Task, TaskId, TaskStatus};
use orchestrator_storage::faults::{FaultSwitch, FaultyBackend};
use orchestrator_storage::fs::{FsBackend, FsOptions};
use orchestrator_storage::transfer::{self, CopyOptions, Progress, Silent, TransferError};
use orchestrator_storage::{
    BulkTransfer, Error, RecordKind, Storage, StorageConfig, StorageType, TransferStore,
};
use serde_json::json;

use crate::conformance::workflow_with_tasks;

/// Everything a store holds, as it would be compared byte for byte:
/// each record's JSON by kind and key, and each task's log.
#[derive(Debug, PartialEq)]
pub(crate) struct Dump {
    records: BTreeMap<(RecordKind, String), Vec<u8>>,
    logs: BTreeMap<String, Vec<u8>>,
}

/// The bulk side of an open store, whichever way it was opened.
pub(crate) trait Bulk {
    fn bulk(&self) -> &dyn BulkTransfer;
}

impl Bulk for Storage {
    fn bulk(&self) -> &dyn BulkTransfer {
        self.transfer()
    }
}

impl Bulk for TransferStore {
    fn bulk(&self) -> &dyn BulkTransfer {
        &**self
    }
}

impl Bulk for &dyn BulkTransfer {
    fn bulk(&self) -> &dyn BulkTransfer {
        *self
    }
}

pub(crate) async fn dump(store: &impl Bulk) -> Dump {
    let store = store.bulk();
    let mut records = BTreeMap::new();
    let mut logs = BTreeMap::new();
    for kind in RecordKind::ALL {
        let mut after: Option<String> = None;
        loop {
            let batch = store.scan(kind, after.as_deref(), 7).await.unwrap();
            let Some(last) = batch.last() else { break };
            after = Some(last.key.clone());
            for scanned in batch {
                let record = scanned.record.unwrap();
                if let orchestrator_storage::Record::Task(task) = &record {
                    let log = read_whole_log(store, task.id).await;
                    if !log.is_empty() {
                        logs.insert(scanned.key.clone(), log);
                    }
                }
                records.insert((kind, scanned.key), record.to_json());
            }
        }
    }
    Dump { records, logs }
}

/// A task's whole log, read through the bulk side.
async fn read_whole_log(store: &dyn BulkTransfer, task: TaskId) -> Vec<u8> {
    let mut log = Vec::new();
    loop {
        let asks = [(task, log.len() as u64, usize::MAX >> 1)];
        let chunk = store.read_logs(&asks).await.unwrap().remove(0);
        if chunk.data.is_empty() {
            return log;
        }
        log.extend(chunk.data);
    }
}

/// A store with what real use leaves behind: finished and failed tasks
/// with attempts, checkpoints and outputs; idempotency keys and revisions;
/// logs in several chunks, one larger than a transfer chunk.
pub(crate) async fn fill(store: &Storage) {
    let now = Utc::now();
    for round in 0..3u32 {
        let (mut workflow, tasks) = workflow_with_tasks(4);
        workflow.idempotency_key = Some(format!("key-{round}"));
        workflow.reference = Some("nightly".into());
        workflow.revision = round + 1;
        store
            .tasks()
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        for (i, task) in tasks.into_iter().enumerate() {
            let mut task: Task = task;
            task.start(now).unwrap();
            let mut checkpoint = serde_json::Map::new();
            checkpoint.insert("step".into(), json!(i));
            task.save_checkpoint(checkpoint, now).unwrap();
            task.history.push(AttemptRecord {
                attempt: 1,
                node: Some("node-a".into()),
                started_at: Some(now),
                ended_at: now,
                outcome: TaskStatus::Completed,
                error: None,
            });
            task.complete(json!({"ip": format!("10.0.{round}.{i}"), "ünï": "✓"}), now)
                .unwrap();
            let task = store.tasks().update_task(&task).await.unwrap();
            store
                .tasks()
                .append_log(task.id, format!("starting {}\n", task.name).as_bytes())
                .await
                .unwrap();
            store.tasks().append_log(task.id, b"done\n").await.unwrap();
        }
    }
    // Tokens, a secret and audit records move too.
    let token = ApiToken::new(
        "0190cc".into(),
        "ci".into(),
        Role::Viewer,
        "orch_0190cc_z",
        now,
    );
    store.access().put_token(&token).await.unwrap();
    store
        .access()
        .put_secret(&SecretRecord {
            name: "api_key".into(),
            nonce: "bm9uY2U=".into(),
            ciphertext: "c2VhbGVk".into(),
            created_at: now,
            updated_at: now,
            version: 2,
            scope: orchestrator_core::access::SecretScope {
                templates: vec!["deploy".into()],
                origins: vec!["https://vault.example".into()],
            },
        })
        .await
        .unwrap();
    for action in ["workflow.submit", "token.create"] {
        let record = crate::conformance::audit_record("ops", action, None, now);
        store.access().append_audit(&record).await.unwrap();
    }
    // A webhook subscription with a delivery: a move must neither lose
    // the subscription nor send the delivery again.
    let hook = crate::conformance::subscription("https://hooks.example/fill");
    store.webhooks().insert_subscription(&hook).await.unwrap();
    let delivery = crate::conformance::delivery("msg_0190fill", &hook, now);
    assert!(store.webhooks().insert_delivery(&delivery).await.unwrap());
    // One log over a megabyte, so it moves in more than one chunk.
    let (workflow, tasks) = workflow_with_tasks(1);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let big: Vec<u8> = (0..1_300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    store.tasks().append_log(tasks[0].id, &big).await.unwrap();
}

pub(crate) async fn open_fs(dir: &Path) -> Storage {
    Storage::new(FsBackend::open(dir, FsOptions::default()).await.unwrap())
}

pub(crate) async fn read_only(config: &StorageConfig) -> TransferStore {
    orchestrator_storage::open_read_only(config).await.unwrap()
}

pub(crate) fn fs_config(dir: &Path) -> StorageConfig {
    StorageConfig {
        storage_type: StorageType::Filesystem,
        data_dir: dir.to_path_buf(),
        surrealdb: Default::default(),
    }
}

/// Copies `source` into the empty `target`, checks they hold the same
/// and that verify agrees; returns the target's dump.
async fn copy_and_check(source: &impl Bulk, target: &impl Bulk) -> Dump {
    let (source, target) = (source.bulk(), target.bulk());
    let report = transfer::copy(source, target, &CopyOptions::default(), &Silent)
        .await
        .unwrap();
    assert!(report.unreadable.is_empty());
    let expected = dump(&source).await;
    let copied = dump(&target).await;
    assert_eq!(copied, expected, "{} -> {}", source.name(), target.name());
    let verified = transfer::verify(source, target, 5, &Silent).await.unwrap();
    assert!(verified.matches(), "{verified:?}");
    for compared in &verified.kinds[..RecordKind::ALL.len()] {
        let kind = RecordKind::ALL
            .into_iter()
            .find(|k| k.plural() == compared.kind)
            .unwrap();
        let stored = expected.records.keys().filter(|(k, _)| *k == kind).count();
        assert_eq!(compared.source, stored as u64, "{}", compared.kind);
    }
    copied
}

#[tokio::test]
async fn filesystem_to_filesystem_copies_everything_and_resumes_as_a_no_op() {
    let root = tempfile::tempdir().unwrap();
    let source = open_fs(&root.path().join("a")).await;
    fill(&source).await;
    let target = open_fs(&root.path().join("b")).await;
    let copied = copy_and_check(&source, &target).await;
    assert_eq!(copied.logs.len(), 13);

    // A non-empty target is refused without --resume...
    let refused = transfer::copy(
        source.transfer(),
        target.transfer(),
        &CopyOptions::default(),
        &Silent,
    )
    .await;
    assert!(
        matches!(
            refused,
            Err(TransferError::TargetNotEmpty {
                workflows: 4,
                tasks: 13
            })
        ),
        "{refused:?}"
    );
    // ...and with it, finds nothing left to write.
    let resume = CopyOptions {
        resume: true,
        ..CopyOptions::default()
    };
    let again = transfer::copy(source.transfer(), target.transfer(), &resume, &Silent)
        .await
        .unwrap();
    assert!(again.kinds.iter().all(|k| k.written == 0), "{again:?}");
    assert_eq!(again.log_bytes_written, 0);
}

/// Counts durable writes and turns the target's fault switch on after `n`.
struct FailAfter {
    n: usize,
    seen: Mutex<usize>,
    switch: FaultSwitch,
}

impl Progress for FailAfter {
    fn phase(&self, _: RecordKind, _: u64) {}
    fn advance(&self, _: u64) {}
    fn wrote(&self) {
        let mut seen = self.seen.lock().unwrap();
        *seen += 1;
        if *seen == self.n {
            self.switch.fail_writes(true);
        }
    }
}

#[tokio::test]
async fn a_copy_cut_short_at_any_write_resumes_to_the_same_end() {
    let root = tempfile::tempdir().unwrap();
    let source = open_fs(&root.path().join("source")).await;
    fill(&source).await;
    let expected = dump(&source).await;
    let options = CopyOptions {
        batch_size: 3,
        ..CopyOptions::default()
    };
    for cut_after in [1, 2, 5, 9] {
        let dir = root.path().join(format!("target-{cut_after}"));
        let (target, switch) = FaultyBackend::wrap(open_fs(&dir).await);
        let progress = FailAfter {
            n: cut_after,
            seen: Mutex::new(0),
            switch: switch.clone(),
        };
        let cut = transfer::copy(source.transfer(), target.transfer(), &options, &progress).await;
        assert!(matches!(cut, Err(TransferError::Target(_))), "{cut:?}");
        switch.fail_writes(false);
        let resume = CopyOptions {
            resume: true,
            ..options.clone()
        };
        transfer::copy(source.transfer(), target.transfer(), &resume, &Silent)
            .await
            .unwrap();
        assert_eq!(
            dump(&target).await,
            expected,
            "cut after {cut_after} writes"
        );
    }
}

#[tokio::test]
async fn a_filesystem_store_is_read_while_its_service_writes_and_never_written() {
    let root = tempfile::tempdir().unwrap();
    let live = open_fs(root.path()).await;
    fill(&live).await;
    // The live store holds the lock; a read-only open does not need it.
    let source = read_only(&fs_config(root.path())).await;
    assert_eq!(dump(&source).await, dump(&live).await);
    // A read-only store has no task writes to refuse: `TransferStore` has
    // only the bulk side (a `compile_fail` doctest on it shows this).
    let (workflow, tasks) = workflow_with_tasks(1);
    let refused = source.import(&[]).await;
    assert!(matches!(refused, Err(Error::ReadOnly(_))), "{refused:?}");
    // Written after the read-only open: seen by the next open.
    live.tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let later = read_only(&fs_config(root.path())).await;
    assert_eq!(later.count(RecordKind::Task).await.unwrap(), 14);
    assert!(!root.path().join("nothing").exists());
    let missing =
        orchestrator_storage::open_read_only(&fs_config(&root.path().join("nothing"))).await;
    assert!(
        matches!(&missing, Err(Error::Layout(m)) if m.contains("holds no filesystem store")),
        "{:?}",
        missing.map(|_| ())
    );
    assert!(
        !root.path().join("nothing").exists(),
        "a read-only open creates nothing"
    );
}

/// Flips one byte inside the JSON of the journal line holding `needle`.
fn damage_line(path: &Path, needle: &str) {
    let mut bytes = std::fs::read(path).unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    let at = text.find(needle).unwrap();
    bytes[at + 1] ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test]
async fn damaged_source_records_are_named_and_skipped_only_when_asked() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("source");
    let (workflow, tasks) = workflow_with_tasks(3);
    {
        let store = open_fs(&dir).await;
        store
            .tasks()
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        let mut task = tasks[1].clone();
        task.start(Utc::now()).unwrap();
        store.tasks().update_task(&task).await.unwrap();
        // A later line, so the damaged one is not the journal's last.
        let (other, other_tasks) = workflow_with_tasks(1);
        store
            .tasks()
            .insert_workflow(&other, &other_tasks)
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    // The task's latest version is the damaged one: an older version must
    // not be copied in its place.
    damage_line(&dir.join("journal.jsonl"), "\"status\":\"running\"");
    let source = read_only(&fs_config(&dir)).await;
    let damaged = tasks[1].id.to_string();

    let target = open_fs(&root.path().join("target")).await;
    let stopped = transfer::copy(
        &*source,
        target.transfer(),
        &CopyOptions::default(),
        &Silent,
    )
    .await;
    match stopped {
        Err(TransferError::Unreadable { kind, key, reason }) => {
            assert_eq!(kind, RecordKind::Task);
            assert_eq!(key, damaged);
            assert!(
                reason.contains("journal.jsonl line 2: checksum mismatch"),
                "{reason}"
            );
        }
        other => panic!("expected the damaged task to stop the copy: {other:?}"),
    }

    let skip = CopyOptions {
        skip_unreadable: true,
        resume: true,
        ..CopyOptions::default()
    };
    let report = transfer::copy(&*source, target.transfer(), &skip, &Silent)
        .await
        .unwrap();
    assert_eq!(report.unreadable.len(), 1);
    assert_eq!(report.unreadable[0].key, damaged);
    assert_eq!(target.transfer().count(RecordKind::Task).await.unwrap(), 3);
    assert!(
        target
            .tasks()
            .get_task(tasks[1].id)
            .await
            .unwrap()
            .is_none()
    );

    let verified = transfer::verify(&*source, target.transfer(), 100, &Silent)
        .await
        .unwrap();
    assert_eq!(verified.mismatch_count, 1, "{verified:?}");
    assert_eq!(verified.mismatches[0].key, damaged);
    assert!(
        verified.mismatches[0]
            .problem
            .contains("unreadable in the source")
    );
}

#[tokio::test]
async fn verify_names_a_tampered_record_and_a_tampered_log() {
    let root = tempfile::tempdir().unwrap();
    let source = open_fs(&root.path().join("a")).await;
    fill(&source).await;
    let target = open_fs(&root.path().join("b")).await;
    copy_and_check(&source, &target).await;

    let page = target
        .tasks()
        .list_tasks(&orchestrator_storage::TaskQuery {
            limit: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut tampered = page.items[0].clone();
    tampered.output = Some(json!({"ip": "6.6.6.6"}));
    target.tasks().update_task(&tampered).await.unwrap();
    target
        .tasks()
        .append_log(page.items[1].id, b"extra")
        .await
        .unwrap();

    let report = transfer::verify(source.transfer(), target.transfer(), 4, &Silent)
        .await
        .unwrap();
    assert_eq!(report.mismatch_count, 2, "{report:?}");
    let problems: BTreeMap<String, String> = report
        .mismatches
        .iter()
        .map(|m| (format!("{} {}", m.kind, m.key), m.problem.clone()))
        .collect();
    assert!(
        problems[&format!("task {}", tampered.id)].contains("field `output`"),
        "{problems:?}"
    );
    assert!(
        problems[&format!("log {}", page.items[1].id)].contains("in the target"),
        "{problems:?}"
    );
    let tasks = &report.kinds[1];
    assert_ne!(tasks.source_checksum, tasks.target_checksum);
}

#[tokio::test]
async fn a_target_changed_since_its_copy_is_never_rolled_back() {
    let root = tempfile::tempdir().unwrap();
    let source = open_fs(&root.path().join("a")).await;
    fill(&source).await;
    let resume = CopyOptions {
        resume: true,
        ..CopyOptions::default()
    };
    let newest = |store: Storage| async move {
        let query = orchestrator_storage::TaskQuery {
            limit: 1,
            ..Default::default()
        };
        store
            .tasks()
            .list_tasks(&query)
            .await
            .unwrap()
            .items
            .remove(0)
    };

    // A record written on the target after the copy.
    let target = open_fs(&root.path().join("b")).await;
    copy_and_check(&source, &target).await;
    let mut task = newest(target.clone()).await;
    task.name = "renamed on the target".into();
    let stored = target.tasks().update_task(&task).await.unwrap();
    let refused = transfer::copy(source.transfer(), target.transfer(), &resume, &Silent).await;
    match refused {
        Err(TransferError::TargetNewer {
            key,
            target_version,
            ..
        }) => {
            assert_eq!(key, task.id.to_string());
            assert_eq!(target_version, stored.version);
        }
        other => panic!("expected TargetNewer: {other:?}"),
    }
    assert_eq!(
        target.tasks().get_task(task.id).await.unwrap().unwrap(),
        stored
    );

    // A log that grew on the target after the copy.
    let target = open_fs(&root.path().join("c")).await;
    copy_and_check(&source, &target).await;
    let task = newest(target.clone()).await;
    target.tasks().append_log(task.id, b"later").await.unwrap();
    let refused = transfer::copy(source.transfer(), target.transfer(), &resume, &Silent).await;
    assert!(
        matches!(refused, Err(TransferError::LogDiverged { task: t, .. }) if t == task.id),
        "{refused:?}"
    );
}

/// A filesystem target opened for import (`orchestrator migrate`'s) keeps
/// only where its records are: it takes the lock, drops a torn last
/// journal line and refuses damage elsewhere, as the service does, and a
/// copy into it, resumed or not, opens in the service as the source.
#[tokio::test]
async fn a_filesystem_import_target_is_a_store_the_service_opens() {
    let root = tempfile::tempdir().unwrap();
    let source = open_fs(&root.path().join("source")).await;
    fill(&source).await;
    let dir = root.path().join("target");
    let config = fs_config(&dir);
    let target = orchestrator_storage::open_for_import(&config)
        .await
        .unwrap();
    let locked = orchestrator_storage::open_for_import(&config).await;
    assert!(matches!(locked, Err(Error::Locked { .. })), "{locked:?}");
    copy_and_check(&source, &target).await;
    target.close().await.unwrap();

    // A write torn by a crash is dropped; the copy resumes as a no-op.
    let journal = dir.join("journal.jsonl");
    let mut torn = std::fs::read(&journal).unwrap();
    let complete = torn.len();
    torn.extend_from_slice(b"00000000 {\"type\":\"task\",\"da");
    std::fs::write(&journal, &torn).unwrap();
    let target = orchestrator_storage::open_for_import(&config)
        .await
        .unwrap();
    assert_eq!(std::fs::metadata(&journal).unwrap().len(), complete as u64);
    let resume = CopyOptions {
        resume: true,
        ..CopyOptions::default()
    };
    let report = transfer::copy(source.transfer(), &*target, &resume, &Silent)
        .await
        .unwrap();
    assert!(report.kinds.iter().all(|k| k.written == 0), "{report:?}");
    target.close().await.unwrap();
    let reopened = open_fs(&dir).await;
    assert_eq!(dump(&reopened).await, dump(&source).await);
    reopened.close().await.unwrap();

    // Damage before the last line is refused, not skipped.
    damage_line(&journal, "\"type\":\"workflow\"");
    let refused = orchestrator_storage::open_for_import(&config).await;
    assert!(matches!(refused, Err(Error::Corrupt { .. })), "{refused:?}");
}

#[cfg(feature = "surrealdb")]
mod surreal {
    use std::time::Duration;

    use super::*;
    use crate::dev_server::DevServer;

    use crate::surreal::embedded_config as embedded;

    /// As the SurrealDB tests' config, with room for megabyte log chunks
    /// on a debug server.
    fn server(server: &DevServer) -> StorageConfig {
        let mut config = crate::surreal::server_config(server);
        config.surrealdb.request_timeout = Duration::from_secs(10);
        config
    }

    async fn open(config: &StorageConfig) -> Storage {
        orchestrator_storage::open(config).await.unwrap()
    }

    /// fs -> embedded -> server -> fs, then back the other way round:
    /// every direction, and the end equals the start byte for byte.
    #[tokio::test]
    async fn round_trips_through_every_backend_end_equal_to_the_start() {
        let root = tempfile::tempdir().unwrap();
        let dev = DevServer::start_memory();
        let start = open_fs(&root.path().join("start")).await;
        fill(&start).await;
        let original = dump(&start).await;

        let forward = [
            embedded(&root.path().join("embedded-1")),
            server(&dev),
            fs_config(&root.path().join("end-1")),
        ];
        let backward = [
            server(&dev),
            embedded(&root.path().join("embedded-2")),
            fs_config(&root.path().join("end-2")),
        ];
        for hops in [forward, backward] {
            let mut opened = vec![start.clone()];
            for config in hops {
                let target = open(&config).await;
                let source = opened.last().unwrap();
                let copied = copy_and_check(source, &target).await;
                assert_eq!(copied, original, "into {}", config.storage_type);
                opened.push(target);
            }
            for store in opened.drain(1..) {
                store.close().await.unwrap();
            }
        }
    }

    /// The bulk writes of a SurrealDB target: a resumed copy replaces the
    /// records that changed (a renamed workflow keeps its unique keys) and
    /// continues the logs that grew; a log import at the wrong length
    /// writes nothing of its batch and names the log.
    #[tokio::test]
    async fn a_surrealdb_target_is_brought_level_and_never_writes_a_log_byte_twice() {
        let root = tempfile::tempdir().unwrap();
        let source = open_fs(&root.path().join("source")).await;
        fill(&source).await;
        let target = open(&embedded(&root.path().join("embedded"))).await;
        copy_and_check(&source, &target).await;

        // The source moves on: a task changes, its log and a new one grow,
        // a workflow changes its idempotency key.
        let query = orchestrator_storage::TaskQuery {
            limit: 2,
            ..Default::default()
        };
        let tasks = source.tasks().list_tasks(&query).await.unwrap().items;
        let mut changed = tasks[0].clone();
        changed.name = "renamed".into();
        source.tasks().update_task(&changed).await.unwrap();
        source
            .tasks()
            .append_log(changed.id, b"more\n")
            .await
            .unwrap();
        source
            .tasks()
            .append_log(tasks[1].id, b"more too\n")
            .await
            .unwrap();
        let mut workflow = source
            .tasks()
            .get_workflow(changed.workflow_id)
            .await
            .unwrap()
            .unwrap();
        workflow.idempotency_key = Some("another-key".into());
        source
            .tasks()
            .update_workflow(&workflow, &[])
            .await
            .unwrap();
        let resume = CopyOptions {
            resume: true,
            ..CopyOptions::default()
        };
        let report = transfer::copy(source.transfer(), target.transfer(), &resume, &Silent)
            .await
            .unwrap();
        assert_eq!(report.kinds[0].written, 1, "{report:?}");
        assert_eq!(report.kinds[1].written, 1, "{report:?}");
        assert_eq!(report.log_bytes_written, 14, "{report:?}");
        assert_eq!(dump(&target).await, dump(&source).await);
        let verified = transfer::verify(source.transfer(), target.transfer(), 5, &Silent)
            .await
            .unwrap();
        assert!(verified.matches(), "{verified:?}");

        // Two pieces of one log in one import, then a batch with one piece
        // at a wrong length: refused whole.
        let (workflow, fresh) = workflow_with_tasks(2);
        target
            .tasks()
            .insert_workflow(&workflow, &fresh)
            .await
            .unwrap();
        let piece = |task: &Task, offset: u64, data: &[u8]| orchestrator_storage::LogPiece {
            task: task.id,
            offset,
            data: data.to_vec(),
        };
        target
            .transfer()
            .import_logs(&[piece(&fresh[0], 0, b"one "), piece(&fresh[0], 4, b"two")])
            .await
            .unwrap();
        let refused = target
            .transfer()
            .import_logs(&[piece(&fresh[1], 0, b"new"), piece(&fresh[0], 3, b"again")])
            .await;
        match refused {
            Err(Error::Conflict {
                id,
                expected,
                found,
                ..
            }) => {
                assert_eq!(id, fresh[0].id.to_string());
                assert_eq!((expected, found), (3, 7));
            }
            other => panic!("expected Conflict: {other:?}"),
        }
        let lengths = target
            .transfer()
            .log_lengths(&[fresh[0].id, fresh[1].id])
            .await
            .unwrap();
        assert_eq!(lengths, vec![7, 0]);
        let log = target.tasks().read_log(fresh[0].id, 0, 100).await.unwrap();
        assert_eq!(log.data, b"one two");
        target.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_surrealdb_source_opens_read_only_and_reports_unreadable_docs() {
        let root = tempfile::tempdir().unwrap();
        let dev = DevServer::start_memory();
        let config = server(&dev);
        let store = open(&config).await;
        let (workflow, tasks) = workflow_with_tasks(2);
        store
            .tasks()
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        store.close().await.unwrap();
        let db = crate::surreal::raw(&config).await;
        db.query("UPDATE type::record('task', $id) SET doc = '{not json'")
            .bind(("id", tasks[0].id.to_string()))
            .await
            .unwrap()
            .check()
            .unwrap();

        let source = read_only(&config).await;
        let refused = source.import(&[]).await;
        assert!(matches!(refused, Err(Error::ReadOnly(_))), "{refused:?}");
        let target = open_fs(&root.path().join("target")).await;
        let stopped = transfer::copy(
            &*source,
            target.transfer(),
            &CopyOptions::default(),
            &Silent,
        )
        .await;
        assert!(
            matches!(&stopped, Err(TransferError::Unreadable { key, .. }) if *key == tasks[0].id.to_string()),
            "{stopped:?}"
        );
        let dry = CopyOptions {
            dry_run: true,
            ..CopyOptions::default()
        };
        let report = transfer::copy(&*source, target.transfer(), &dry, &Silent)
            .await
            .unwrap();
        assert_eq!(report.unreadable.len(), 1);
        assert_eq!(report.kinds[1].read, 2);
        // A missing embedded store is not created by a read-only open.
        let missing = root.path().join("missing");
        assert!(
            orchestrator_storage::open_read_only(&embedded(&missing))
                .await
                .is_err()
        );
        assert!(!missing.join("surrealdb").exists());
    }
}
