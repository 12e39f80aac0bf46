//! The filesystem backend: the conformance suite, reopening, torn writes,
//! compaction and the lock.

use std::io::Write;

use chrono::Utc;
use orchestrator_core::{Task, TaskStatus};
use orchestrator_storage::fs::{FsBackend, FsOptions};
use orchestrator_storage::{BulkTransfer, Error, Record, RecordKind, Storage, TaskQuery};
use serde_json::json;

use crate::conformance::{self, Harness, workflow_with_tasks};

struct FsHarness {
    root: tempfile::TempDir,
    options: FsOptions,
}

impl Harness for FsHarness {
    async fn open(&self) -> Storage {
        let dir = self.root.path().join(uuid_dir());
        Storage::new(FsBackend::open(&dir, self.options.clone()).await.unwrap())
    }
}

fn uuid_dir() -> String {
    orchestrator_core::TaskId::new().to_string()
}

#[tokio::test]
async fn filesystem_passes_the_conformance_suite() {
    let harness = FsHarness {
        root: tempfile::tempdir().unwrap(),
        options: FsOptions::default(),
    };
    conformance::suite(&harness).await;
}

#[tokio::test]
async fn filesystem_passes_the_suite_while_compacting_constantly() {
    let harness = FsHarness {
        root: tempfile::tempdir().unwrap(),
        options: FsOptions {
            compact_after_bytes: 1,
            ..FsOptions::default()
        },
    };
    conformance::suite(&harness).await;
}

/// Every record read back from its line, as finished work is: the suite
/// with nothing kept in memory once durable, then again while compacting
/// constantly (which moves those lines into the snapshot).
#[tokio::test]
async fn filesystem_passes_the_suite_reading_every_record_back_from_disk() {
    for compact_after_bytes in [u64::MAX, 1] {
        let harness = FsHarness {
            root: tempfile::tempdir().unwrap(),
            options: FsOptions {
                compact_after_bytes,
                evict_unfinished: true,
            },
        };
        conformance::suite(&harness).await;
    }
}

/// The bulk suite on the stores `orchestrator migrate` opens: a target
/// opened for import, and a source opened read-only (while the service's
/// store is open).
#[tokio::test]
async fn filesystem_import_targets_and_read_only_sources_pass_the_bulk_suite() {
    let root = tempfile::tempdir().unwrap();
    let config = |dir: &std::path::Path| orchestrator_storage::StorageConfig {
        storage_type: orchestrator_storage::StorageType::Filesystem,
        data_dir: dir.to_path_buf(),
        surrealdb: Default::default(),
    };
    let target = orchestrator_storage::open_for_import(&config(&root.path().join("target")))
        .await
        .unwrap();
    conformance::bulk_transfer_suite(&*target).await;
    target.close().await.unwrap();

    let dir = root.path().join("source");
    let live = open(&dir, FsOptions::default()).await;
    let fixture = conformance::BulkFixture::new();
    fixture.import_into(live.transfer()).await;
    let source = orchestrator_storage::open_read_only(&config(&dir))
        .await
        .unwrap();
    conformance::read_only_bulk_suite(&*source, &fixture).await;
    live.close().await.unwrap();
}

async fn open(dir: &std::path::Path, options: FsOptions) -> Storage {
    Storage::new(FsBackend::open(dir, options).await.unwrap())
}

#[tokio::test]
async fn reopening_restores_every_task_with_its_status() {
    for compact_after_bytes in [1, u64::MAX] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_path_buf();
        let options = FsOptions {
            compact_after_bytes,
            ..FsOptions::default()
        };
        let (workflow, tasks) = workflow_with_tasks(10);
        let expected = {
            let store = open(&dir, options.clone()).await;
            store
                .tasks()
                .insert_workflow(&workflow, &tasks)
                .await
                .unwrap();
            let mut task = tasks[3].clone();
            task.start(Utc::now()).unwrap();
            let task = store.tasks().update_task(&task).await.unwrap();
            let mut done = task.clone();
            done.complete(json!({"ip": "10.0.0.3"}), Utc::now())
                .unwrap();
            store.tasks().update_task(&done).await.unwrap();
            store.tasks().append_log(task.id, b"hello\n").await.unwrap();
            let all = store
                .tasks()
                .list_tasks(&TaskQuery {
                    limit: 100,
                    ..Default::default()
                })
                .await
                .unwrap();
            store.close().await.unwrap();
            all
        };
        let store = open(&dir, options).await;
        let again = store
            .tasks()
            .list_tasks(&TaskQuery {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(again, expected);
        let task = store.tasks().get_task(tasks[3].id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Completed);
        assert_eq!(task.output, Some(json!({"ip": "10.0.0.3"})));
        assert_eq!(
            store.tasks().read_log(task.id, 0, 100).await.unwrap().data,
            b"hello\n"
        );
        assert_eq!(
            store.tasks().get_workflow(workflow.id).await.unwrap(),
            Some(workflow.clone())
        );
    }
}

#[tokio::test]
async fn a_torn_journal_tail_is_dropped_and_everything_before_it_kept() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_path_buf();
    let (workflow, tasks) = workflow_with_tasks(2);
    {
        let store = open(&dir, FsOptions::default()).await;
        store
            .tasks()
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    // A crash in the middle of the next append leaves half a line.
    let journal = dir.join("journal.jsonl");
    let before = std::fs::metadata(&journal).unwrap().len();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)
        .unwrap();
    file.write_all(b"0badc0de {\"type\":\"task\",\"data\":{\"id\"")
        .unwrap();
    drop(file);

    let store = open(&dir, FsOptions::default()).await;
    assert_eq!(
        crate::conformance::workflow_tasks(store.tasks(), workflow.id).await,
        tasks
    );
    assert_eq!(std::fs::metadata(&journal).unwrap().len(), before);
    // And the store keeps working after the repair.
    let mut task = tasks[0].clone();
    task.start(Utc::now()).unwrap();
    store.tasks().update_task(&task).await.unwrap();
}

#[tokio::test]
async fn damage_in_the_middle_of_the_journal_is_refused_with_its_line() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_path_buf();
    {
        let store = open(&dir, FsOptions::default()).await;
        for _ in 0..3 {
            let (workflow, tasks) = workflow_with_tasks(2);
            store
                .tasks()
                .insert_workflow(&workflow, &tasks)
                .await
                .unwrap();
        }
        store.close().await.unwrap();
    }
    let journal = dir.join("journal.jsonl");
    let text = std::fs::read_to_string(&journal).unwrap();
    let damaged = text.replacen("task-0", "task-X", 2);
    std::fs::write(&journal, damaged).unwrap();
    let err = FsBackend::open(&dir, FsOptions::default())
        .await
        .err()
        .expect("refused");
    match err {
        Error::Corrupt { line, .. } => assert_eq!(line, 1),
        other => panic!("unexpected {other}"),
    }
}

fn fs_config(dir: &std::path::Path) -> orchestrator_storage::StorageConfig {
    orchestrator_storage::StorageConfig {
        storage_type: orchestrator_storage::StorageType::Filesystem,
        data_dir: dir.to_path_buf(),
        surrealdb: Default::default(),
    }
}

/// The task under `id` as a store opened by `orchestrator migrate` reads
/// it: the read-only source, or the import target.
async fn task_read_in_bulk(store: &dyn BulkTransfer, task: &Task) -> Task {
    let found = store
        .fetch(RecordKind::Task, &[task.id.to_string()])
        .await
        .unwrap();
    match found.into_iter().next().map(|scanned| scanned.record) {
        Some(Ok(Record::Task(task))) => task,
        other => panic!("task {} read as {other:?}", task.id),
    }
}

/// The rule for a write torn by a crash, cut at every byte of the
/// journal's last record: the service, a migration's read-only source and
/// its import target all open the store with exactly the records before
/// it, and a store opened to be written cuts the tail off, so that what
/// it appends next is read back after a reopen.
#[tokio::test]
async fn a_journal_cut_at_every_byte_of_its_last_record_opens_with_the_records_before_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_path_buf();
    let (workflow, tasks) = workflow_with_tasks(2);
    let mut started = tasks[0].clone();
    started.start(Utc::now()).unwrap();
    let updated = {
        let store = open(&dir, FsOptions::default()).await;
        let tasks_store = store.tasks();
        tasks_store
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        let updated = tasks_store.update_task(&started).await.unwrap();
        store.close().await.unwrap();
        updated
    };
    let journal = dir.join("journal.jsonl");
    let whole = std::fs::read(&journal).unwrap();
    assert!(whole.ends_with(b"\n"));
    // The last record is the update's line; it starts after the previous
    // line's newline.
    let start = whole[..whole.len() - 1]
        .iter()
        .rposition(|&b| b == b'\n')
        .unwrap()
        + 1;
    // Every cut from nothing of the last line to all of it but its newline,
    // then the whole line as the control.
    for cut in start..=whole.len() {
        let context = format!("journal cut at {cut} of {}", whole.len());
        let complete = cut == whole.len();
        let expected = if complete { &updated } else { &tasks[0] };
        std::fs::write(&journal, &whole[..cut]).unwrap();

        let source = orchestrator_storage::open_read_only(&fs_config(&dir))
            .await
            .unwrap();
        assert_eq!(
            &task_read_in_bulk(&*source, &tasks[0]).await,
            expected,
            "{context}"
        );
        let scanned = source.scan(RecordKind::Task, None, 10).await.unwrap();
        assert_eq!(scanned.len(), 2, "{context}");
        assert!(
            scanned.iter().all(|s| s.record.is_ok()),
            "{context}: {scanned:?}"
        );
        source.close().await.unwrap();
        assert_eq!(
            std::fs::read(&journal).unwrap(),
            &whole[..cut],
            "{context}: read only"
        );

        let target = orchestrator_storage::open_for_import(&fs_config(&dir))
            .await
            .unwrap();
        assert_eq!(
            &task_read_in_bulk(&*target, &tasks[0]).await,
            expected,
            "{context}"
        );
        target.close().await.unwrap();
        let kept = if complete { whole.len() } else { start };
        assert_eq!(
            std::fs::read(&journal).unwrap(),
            &whole[..kept],
            "{context}: import"
        );

        std::fs::write(&journal, &whole[..cut]).unwrap();
        let store = open(&dir, FsOptions::default()).await;
        let tasks_store = store.tasks();
        assert_eq!(
            crate::conformance::workflow_tasks(tasks_store, workflow.id).await,
            [expected.clone(), tasks[1].clone()],
            "{context}"
        );
        assert_eq!(
            std::fs::read(&journal).unwrap(),
            &whole[..kept],
            "{context}: service"
        );
        // An append after the repair follows the last good line.
        let mut next = expected.clone();
        next.input = json!({"after": cut});
        let next = tasks_store.update_task(&next).await.unwrap();
        store.close().await.unwrap();
        let store = open(&dir, FsOptions::default()).await;
        assert_eq!(
            store.tasks().get_task(next.id).await.unwrap(),
            Some(next),
            "{context}"
        );
        store.close().await.unwrap();
    }
}

/// A corrupt line before the journal's last is damage, never a torn write:
/// the service and an import refuse the store, naming the file and line,
/// and change nothing; a migration's source reads past it.
#[tokio::test]
async fn a_corrupt_line_in_the_middle_is_refused_by_every_writer_and_named_by_the_reader() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_path_buf();
    let (workflow, tasks) = workflow_with_tasks(1);
    {
        let store = open(&dir, FsOptions::default()).await;
        store
            .tasks()
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        let mut started = tasks[0].clone();
        started.start(Utc::now()).unwrap();
        let started = store.tasks().update_task(&started).await.unwrap();
        let mut finished = started.clone();
        finished.input = json!({"last": true});
        store.tasks().update_task(&finished).await.unwrap();
        store.close().await.unwrap();
    }
    // Flip one byte of the second of three lines, as a bad disk would.
    let journal = dir.join("journal.jsonl");
    let mut bytes = std::fs::read(&journal).unwrap();
    let second = bytes.iter().position(|&b| b == b'\n').unwrap() + 1;
    let third = second + bytes[second..].iter().position(|&b| b == b'\n').unwrap() + 1;
    bytes[(second + third) / 2] ^= 0x01;
    std::fs::write(&journal, &bytes).unwrap();

    let expected = format!(
        "{}:2: corrupt record: checksum mismatch or unreadable record in the middle of the file; \
         restore the data dir from a backup",
        journal.display()
    );
    let refused = FsBackend::open(&dir, FsOptions::default())
        .await
        .err()
        .expect("the service refuses it");
    assert!(
        matches!(refused, Error::Corrupt { line: 2, .. }),
        "{refused}"
    );
    assert_eq!(refused.to_string(), expected);
    let refused = orchestrator_storage::open_for_import(&fs_config(&dir))
        .await
        .expect_err("an import refuses it");
    assert_eq!(refused.to_string(), expected);
    assert_eq!(std::fs::read(&journal).unwrap(), bytes, "nothing was cut");

    // A migration's source reads past it: the record's last line is good.
    let source = orchestrator_storage::open_read_only(&fs_config(&dir))
        .await
        .unwrap();
    let task = task_read_in_bulk(&*source, &tasks[0]).await;
    assert_eq!(task.input, json!({"last": true}));
}

/// The snapshot is only ever replaced whole: a cut in its last line is
/// damage, not a torn write, and is refused rather than dropped.
#[tokio::test]
async fn a_snapshot_cut_short_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_path_buf();
    let compacting = FsOptions {
        compact_after_bytes: 1,
        ..FsOptions::default()
    };
    let (workflow, tasks) = workflow_with_tasks(2);
    {
        let store = open(&dir, compacting).await;
        store
            .tasks()
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        store.close().await.unwrap();
    }
    let snapshot = dir.join("snapshot.jsonl");
    let mut bytes = std::fs::read(&snapshot).unwrap();
    assert_eq!(
        std::fs::metadata(dir.join("journal.jsonl")).unwrap().len(),
        0
    );
    bytes.truncate(bytes.len() - 1);
    std::fs::write(&snapshot, &bytes).unwrap();
    let refused = FsBackend::open(&dir, FsOptions::default())
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(refused, Error::Corrupt { line: 3, .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains("incomplete line"), "{refused}");
    assert_eq!(std::fs::read(&snapshot).unwrap(), bytes, "nothing was cut");
}

#[tokio::test]
async fn a_second_process_on_the_same_dir_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().to_path_buf();
    let _first = open(&dir, FsOptions::default()).await;
    let err = FsBackend::open(&dir, FsOptions::default())
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, Error::Locked { .. }), "{err}");
    assert!(err.to_string().contains("in use"), "{err}");
}

#[tokio::test]
async fn a_newer_layout_is_refused_clearly() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("layout.json"), r#"{"layout_version": 99}"#).unwrap();
    let err = FsBackend::open(root.path(), FsOptions::default())
        .await
        .err()
        .expect("refused");
    let message = err.to_string();
    assert!(message.contains("layout version 99"), "{message}");
}

// With the `surrealdb` feature these backends are compiled in; the
// SurrealDB tests check the RocksDB engine's feature message instead.
#[cfg(not(feature = "surrealdb"))]
#[tokio::test]
async fn backends_not_compiled_in_name_the_feature() {
    use orchestrator_storage::{StorageConfig, StorageType};
    for storage_type in [StorageType::SurrealdbEmbedded, StorageType::SurrealdbServer] {
        let config = StorageConfig {
            storage_type,
            data_dir: tempfile::tempdir().unwrap().path().to_path_buf(),
            surrealdb: Default::default(),
        };
        let err = orchestrator_storage::open(&config)
            .await
            .expect_err("not compiled");
        let message = err.to_string();
        assert!(message.contains(storage_type.as_str()), "{message}");
        assert!(message.contains("--features surrealdb"), "{message}");
    }
    let err = "postgres".parse::<StorageType>().unwrap_err();
    assert!(err.contains("postgres"));
}

#[tokio::test]
async fn health_is_ok_until_closed() {
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), FsOptions::default()).await;
    store.health().await.unwrap();
    store.close().await.unwrap();
    assert!(matches!(store.health().await, Err(Error::Closed)));
}

/// The outbox survives a restart: subscriptions, deliveries as last
/// changed and prunes are there after reopening, from the journal alone
/// and from a snapshot.
#[tokio::test]
async fn reopening_restores_webhook_subscriptions_and_the_outbox() {
    use orchestrator_core::webhook::DeliveryStatus;
    use orchestrator_storage::DeliveryQuery;
    for compact_after_bytes in [1, u64::MAX] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_path_buf();
        let options = FsOptions {
            compact_after_bytes,
            ..FsOptions::default()
        };
        let kept = conformance::subscription("http://127.0.0.1:9/kept");
        let gone = conformance::subscription("http://127.0.0.1:9/gone");
        let (pending, failed) = {
            let store = open(&dir, options.clone()).await;
            let webhooks = store.webhooks();
            webhooks.insert_subscription(&kept).await.unwrap();
            webhooks.insert_subscription(&gone).await.unwrap();
            webhooks.delete_subscription(&gone.id).await.unwrap();
            let pending = conformance::delivery("msg_pending", &kept, Utc::now());
            webhooks.insert_delivery(&pending).await.unwrap();
            let mut failed = conformance::delivery("msg_failed", &kept, Utc::now());
            webhooks.insert_delivery(&failed).await.unwrap();
            failed.give_up("outbox full".into(), Utc::now());
            let failed = webhooks.update_delivery(&failed).await.unwrap();
            let pruned = conformance::delivery("msg_pruned", &kept, Utc::now());
            let mut pruned_done = pruned.clone();
            webhooks.insert_delivery(&pruned).await.unwrap();
            pruned_done.give_up("x".into(), Utc::now());
            webhooks.update_delivery(&pruned_done).await.unwrap();
            assert_eq!(
                webhooks
                    .prune_deliveries(&["msg_pruned".into()])
                    .await
                    .unwrap(),
                1
            );
            store.close().await.unwrap();
            (pending, failed)
        };
        let store = open(&dir, options).await;
        let webhooks = store.webhooks();
        assert_eq!(webhooks.subscriptions().await.unwrap(), vec![kept]);
        assert_eq!(
            webhooks.get_delivery("msg_pending").await.unwrap(),
            Some(pending)
        );
        assert_eq!(
            webhooks.get_delivery("msg_failed").await.unwrap(),
            Some(failed)
        );
        assert_eq!(webhooks.get_delivery("msg_pruned").await.unwrap(), None);
        let outbox = DeliveryQuery {
            status: Some(DeliveryStatus::Pending),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(webhooks.deliveries(&outbox).await.unwrap().total, 1);
        store.close().await.unwrap();
    }
}

/// A deleted token record stays deleted across a reopen, from the journal
/// and then from the snapshot a compaction wrote.
#[tokio::test]
async fn deleted_token_records_stay_deleted_after_a_reopen() {
    use orchestrator_core::access::{ApiToken, Role};
    for compact_after_bytes in [u64::MAX, 1] {
        let root = tempfile::tempdir().unwrap();
        let options = FsOptions {
            compact_after_bytes,
            ..FsOptions::default()
        };
        let store = open(root.path(), options.clone()).await;
        let now = Utc::now();
        let token = ApiToken::new("01aa".into(), "ui".into(), Role::Viewer, "orch_01aa_z", now);
        let session = ApiToken::session("01ab".into(), &token, now, now);
        store.access().put_token(&token).await.unwrap();
        store.access().put_token(&session).await.unwrap();
        assert_eq!(
            store
                .access()
                .delete_tokens(&["01ab".into()])
                .await
                .unwrap(),
            1
        );
        store.close().await.unwrap();
        drop(store);
        let store = open(root.path(), options).await;
        let ids: Vec<String> = (store.access().tokens().await.unwrap().into_iter())
            .map(|t| t.id)
            .collect();
        assert_eq!(
            ids,
            vec!["01aa".to_owned()],
            "compact_after_bytes {compact_after_bytes}"
        );
    }
}

#[tokio::test]
async fn locks_survive_a_reopen() {
    let root = tempfile::tempdir().unwrap();
    let store = open(root.path(), FsOptions::default()).await;
    let mut lock = orchestrator_core::lock::LockRecord::new("env:prod");
    lock.fencing = 7;
    let stored = store.locks().put_lock(&lock).await.unwrap();
    store.close().await.unwrap();
    drop(store);
    let store = open(root.path(), FsOptions::default()).await;
    assert_eq!(
        store.locks().get_lock("env:prod").await.unwrap(),
        Some(stored)
    );
}

/// What has finished lives on disk: once its last write is durable, a
/// finished workflow and its tasks leave memory, and stay out across a
/// reopen and compactions, while running work stays in memory. Every read
/// returns what the writes stored, and a write to a finished record still
/// compares versions.
#[tokio::test]
async fn finished_work_leaves_memory_and_reads_back_unchanged() {
    use orchestrator_core::WorkflowStatus;
    use orchestrator_storage::fs::InMemory;
    use orchestrator_storage::{AccessStore, AuditQuery, RetentionStore, TaskStore, WorkflowQuery};

    for compact_after_bytes in [u64::MAX, 1] {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().to_path_buf();
        let options = FsOptions {
            compact_after_bytes,
            ..FsOptions::default()
        };
        let store = FsBackend::open(&dir, options.clone()).await.unwrap();
        let mut finished = Vec::new();
        for n in 0..3 {
            let (mut workflow, tasks) = workflow_with_tasks(2);
            workflow.idempotency_key = Some(format!("key-{n}"));
            store.insert_workflow(&workflow, &tasks).await.unwrap();
            let done: Vec<Task> = tasks
                .iter()
                .map(|task| {
                    let mut task = task.clone();
                    task.start(Utc::now()).unwrap();
                    task.complete(json!({"n": n}), Utc::now()).unwrap();
                    task
                })
                .collect();
            workflow.status = WorkflowStatus::Completed;
            finished.push(
                store
                    .update_workflow_and_tasks(&workflow, &done)
                    .await
                    .unwrap(),
            );
        }
        let (running, running_tasks) = workflow_with_tasks(2);
        store
            .insert_workflow(&running, &running_tasks)
            .await
            .unwrap();
        // The audit log is history too.
        let submitted =
            conformance::audit_record("ops", "workflow.submit", Some("wf-1"), Utc::now());
        let cancelled =
            conformance::audit_record("ops", "workflow.cancel", Some("wf-2"), Utc::now());
        store.append_audit(&submitted).await.unwrap();
        store.append_audit(&cancelled).await.unwrap();
        let only_running = InMemory {
            workflows: 1,
            tasks: 2,
            audit: 0,
        };
        assert_eq!(store.records_in_memory(), only_running);

        let reads_back_unchanged = async |store: &FsBackend| {
            for (workflow, tasks) in &finished {
                let stored = store.get_workflow(workflow.id).await.unwrap();
                assert_eq!(stored.as_ref(), Some(workflow));
                let read: Vec<Task> = conformance::workflow_tasks(store, workflow.id).await;
                assert_eq!(&read, tasks);
                for task in tasks {
                    assert_eq!(store.get_task(task.id).await.unwrap().as_ref(), Some(task));
                }
            }
            let completed = store
                .list_workflows(&WorkflowQuery {
                    status: Some(WorkflowStatus::Completed),
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(completed.total, 3);
            let newest_first: Vec<_> = finished.iter().rev().map(|(w, _)| w.clone()).collect();
            assert_eq!(completed.items, newest_first);
            let by_key = store
                .list_workflows(&WorkflowQuery {
                    idempotency_key: Some("key-1".into()),
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(by_key.items, vec![finished[1].0.clone()]);
            let done_tasks = store
                .list_tasks(&TaskQuery {
                    status: Some(TaskStatus::Completed),
                    limit: 10,
                    ..Default::default()
                })
                .await
                .unwrap();
            assert_eq!(done_tasks.total, 6);
            let audit = |query: AuditQuery| async move {
                store
                    .list_audit(&AuditQuery { limit: 10, ..query })
                    .await
                    .unwrap()
            };
            let all = audit(AuditQuery::default()).await;
            assert_eq!(all.items, vec![cancelled.clone(), submitted.clone()]);
            let by_action = audit(AuditQuery {
                action: Some("workflow.cancel".into()),
                ..Default::default()
            })
            .await;
            assert_eq!(
                (by_action.total, by_action.items),
                (1, vec![cancelled.clone()])
            );
            let by_target = audit(AuditQuery {
                target: Some("wf-1".into()),
                ..Default::default()
            })
            .await;
            assert_eq!(
                (by_target.total, by_target.items),
                (1, vec![submitted.clone()])
            );
        };
        reads_back_unchanged(&store).await;
        store.close().await.unwrap();
        drop(store);

        let store = FsBackend::open(&dir, options.clone()).await.unwrap();
        assert_eq!(store.records_in_memory(), only_running, "after a reopen");
        reads_back_unchanged(&store).await;

        // A finished task is still written by compare-and-set: a stale
        // version conflicts, the stored one lands (and is read back).
        let (_, tasks) = &finished[0];
        let mut stale = tasks[0].clone();
        stale.version -= 1;
        assert!(matches!(
            store.update_task(&stale).await,
            Err(Error::Conflict { .. })
        ));
        let mut note = tasks[0].clone();
        note.output = Some(json!({"n": 0, "noted": true}));
        let noted = store.update_task(&note).await.unwrap();
        assert_eq!(store.get_task(noted.id).await.unwrap(), Some(noted));
        assert_eq!(store.records_in_memory(), only_running);

        // Pruned, a finished workflow frees its idempotency key.
        let (workflow, _) = &finished[2];
        let pruned = store
            .prune_workflows(&[(workflow.id, workflow.version)])
            .await
            .unwrap();
        assert_eq!(pruned.tasks, 2);
        assert_eq!(store.get_workflow(workflow.id).await.unwrap(), None);
        let (mut again, again_tasks) = workflow_with_tasks(1);
        again.idempotency_key = Some("key-2".into());
        store.insert_workflow(&again, &again_tasks).await.unwrap();
        store.close().await.unwrap();
    }
}
