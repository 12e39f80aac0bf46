//! The storage conformance suites: what each trait promises, written once
//! against the trait object and run for each backend, so that backends
//! cannot drift apart. [`suite`] runs every suite on a writable store;
//! [`read_only_bulk_suite`] is the bulk suite of a store opened to be
//! copied from.
//!
//! Each check of the task store starts from an empty store (some count
//! what the store holds); the other suites take one store each.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{Timelike, Utc};
use futures_util::future::join_all;
use orchestrator_core::ScheduleId;
use orchestrator_core::access::{ApiToken, AuditRecord, Role, SecretRecord, SecretScope};
use orchestrator_core::lock::LockRecord;
use orchestrator_core::schedule::{ClaimState, Schedule, ScheduleClaim};
use orchestrator_core::webhook::{Delivery, DeliveryAttempt, DeliveryStatus, Sealed, Subscription};
use orchestrator_core::{
    Priority, Task, TaskId, TaskSpec, TaskStatus, Workflow, WorkflowId, WorkflowStatus,
};
use orchestrator_storage::{
    AccessStore, AuditQuery, BulkTransfer, Error, LockStore, LogPiece, NodeStore, Record,
    RecordKind, ScheduleStore, Storage, TaskQuery, TaskStore, WorkflowQuery,
};
use orchestrator_storage::{DeliveryQuery, WebhookStore};
use serde_json::json;

/// Opens a fresh, empty store.
pub trait Harness {
    async fn open(&self) -> Storage;
}

/// Every suite of a writable store.
pub async fn suite(harness: &impl Harness) {
    task_store_suite(harness).await;
    node_store_suite(harness.open().await.nodes()).await;
    access_store_suite(harness.open().await.access()).await;
    schedule_store_suite(harness.open().await.schedules()).await;
    retention_store_suite(&harness.open().await).await;
    bulk_transfer_suite(harness.open().await.transfer()).await;
    webhook_store_suite(harness.open().await.webhooks()).await;
    lock_store_suite(harness.open().await.locks()).await;
}

/// What [`LockStore`] promises, on an empty store: records by name,
/// changed by compare-and-set only, so racing read-modify-writes each land
/// once (the fencing counter they raise hands out every number once).
pub async fn lock_store_suite(store: &dyn LockStore) {
    locks_are_created_once_and_changed_by_compare_and_set(store).await;
    racing_lock_changes_each_land_once(store).await;
}

async fn locks_are_created_once_and_changed_by_compare_and_set(store: &dyn LockStore) {
    assert_eq!(store.get_lock("env:prod/eu-1").await.unwrap(), None);
    let mut lock = LockRecord::new("env:prod/eu-1");
    lock.fencing = 1;
    let stored = store.put_lock(&lock).await.unwrap();
    assert_eq!(stored.version, 1);
    assert_eq!(
        store.get_lock("env:prod/eu-1").await.unwrap(),
        Some(stored.clone())
    );
    // A second first write, and a stale one, are conflicts.
    assert!(matches!(
        store.put_lock(&lock).await,
        Err(Error::Conflict {
            what: "lock",
            found: 1,
            ..
        })
    ));
    let mut next = stored.clone();
    next.fencing = 2;
    let next = store.put_lock(&next).await.unwrap();
    assert_eq!((next.version, next.fencing), (2, 2));
    assert!(matches!(
        store.put_lock(&stored).await,
        Err(Error::Conflict {
            expected: 1,
            found: 2,
            ..
        })
    ));
    store.put_lock(&LockRecord::new("a-first")).await.unwrap();
    let names: Vec<String> = store
        .locks()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert_eq!(
        names,
        vec!["a-first".to_owned(), "env:prod/eu-1".to_owned()]
    );
}

async fn racing_lock_changes_each_land_once(store: &dyn LockStore) {
    const RACERS: u64 = 6;
    const ROUNDS: u64 = 5;
    let racer = || async {
        let mut tokens = Vec::new();
        for _ in 0..ROUNDS {
            loop {
                let mut lock = store
                    .get_lock("raced")
                    .await
                    .unwrap()
                    .unwrap_or_else(|| LockRecord::new("raced"));
                lock.fencing += 1;
                match store.put_lock(&lock).await {
                    Ok(stored) => {
                        tokens.push(stored.fencing);
                        break;
                    }
                    Err(Error::Conflict { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
        }
        tokens
    };
    let mut all: Vec<u64> = join_all((0..RACERS).map(|_| racer()))
        .await
        .into_iter()
        .flatten()
        .collect();
    all.sort_unstable();
    assert_eq!(all, (1..=RACERS * ROUNDS).collect::<Vec<_>>());
    let lock = store.get_lock("raced").await.unwrap().unwrap();
    assert_eq!(
        (lock.fencing, lock.version),
        (RACERS * ROUNDS, RACERS * ROUNDS)
    );
}

/// What [`TaskStore`] promises: each check on a fresh store from `harness`.
pub async fn task_store_suite(harness: &impl Harness) {
    insert_and_read_back(harness.open().await.tasks()).await;
    compare_and_set_updates(harness.open().await.tasks()).await;
    concurrent_claims_hand_out_each_task_once(harness.open().await.tasks()).await;
    listing_orders_filters_and_pages(harness.open().await.tasks()).await;
    keyset_pages_cover_each_listing_once(harness.open().await.tasks()).await;
    large_and_unicode_payloads(harness.open().await.tasks()).await;
    logs_append_and_read_from_offsets(harness.open().await.tasks()).await;
    log_appends_return_the_new_length(harness.open().await.tasks()).await;
    duplicate_inserts_are_refused(harness.open().await.tasks()).await;
    workflows_update_by_compare_and_set_and_grow_atomically(harness.open().await.tasks()).await;
    idempotency_keys_and_revisions_are_unique(harness.open().await.tasks()).await;
    workflows_filter_by_every_field(harness.open().await.tasks()).await;
    workflows_found_by_text(harness.open().await.tasks()).await;
    racing_workflow_updates_win_or_conflict(harness.open().await.tasks()).await;
    a_workflow_and_its_tasks_change_in_one_write_or_not_at_all(harness.open().await.tasks()).await;
    reads_follow_every_write(harness.open().await.tasks()).await;
}

/// A listing's page and total, and the workflow, after each kind of
/// write, read before it too: a store that keeps what it read must answer
/// with what was written since.
async fn reads_follow_every_write(store: &dyn TaskStore) {
    let listing = |status: Option<TaskStatus>, workflow: Option<WorkflowId>| async move {
        let query = TaskQuery {
            status,
            workflow,
            limit: 10,
            ..TaskQuery::default()
        };
        store.list_tasks(&query).await.unwrap()
    };
    let total = |status, workflow| async move { listing(status, workflow).await.total };
    let (all, running) = (
        total(None, None).await,
        total(Some(TaskStatus::Running), None).await,
    );
    let (workflow, tasks) = workflow_with_tasks(2);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    assert_eq!(total(None, None).await, all + 2, "after an insert");
    let page = listing(None, Some(workflow.id)).await;
    assert_eq!(page.total, 2);
    assert!(
        page.items.iter().all(|t| t.status == tasks[0].status),
        "{:?}",
        page.items
    );
    let mut started = tasks[0].clone();
    started.start(Utc::now()).unwrap();
    let started = store.update_task(&started).await.unwrap();
    assert_eq!(
        total(Some(TaskStatus::Running), None).await,
        running + 1,
        "after an update"
    );
    let page = listing(None, Some(workflow.id)).await;
    let statuses: Vec<_> = page.items.iter().map(|t| (t.id, t.status)).collect();
    assert!(
        statuses.contains(&(started.id, TaskStatus::Running)),
        "the page kept a task as it was before an update: {statuses:?}"
    );
    let stored = store.get_workflow(workflow.id).await.unwrap().unwrap();
    let mut running = stored.clone();
    running.status = WorkflowStatus::Running;
    store.update_workflow(&running, &[]).await.unwrap();
    let stored = store.get_workflow(workflow.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.version, stored.status),
        (running.version + 1, WorkflowStatus::Running),
        "a workflow read before its update"
    );
    let (_, more) = workflow_with_tasks(1);
    let mut more = more[0].clone();
    more.workflow_id = workflow.id;
    let mut grown = stored.clone();
    grown.task_ids.push(more.id);
    store
        .update_workflow(&grown, &[more.clone()])
        .await
        .unwrap();
    let stored = store.get_workflow(workflow.id).await.unwrap().unwrap();
    assert_eq!(stored.task_ids.len(), 3, "a workflow read before it grew");
    let page = listing(None, Some(workflow.id)).await;
    assert_eq!(page.total, 3, "after a workflow grew");
    assert!(
        page.items.iter().any(|t| t.id == more.id),
        "the page missed the task a workflow grew by"
    );
    assert_eq!(total(None, None).await, all + 3);
    let mut finished = started.clone();
    finished.complete(json!("done"), Utc::now()).unwrap();
    let mut halted = store.get_workflow(workflow.id).await.unwrap().unwrap();
    halted.cancel_requested = true;
    store
        .update_workflow_and_tasks(&halted, &[finished.clone()])
        .await
        .unwrap();
    let stored = store.get_workflow(workflow.id).await.unwrap().unwrap();
    assert!(
        stored.cancel_requested && stored.version == halted.version + 1,
        "a workflow read before a write of it and its tasks"
    );
    let page = listing(None, Some(workflow.id)).await;
    assert!(
        page.items
            .iter()
            .any(|t| t.id == finished.id && t.status == TaskStatus::Completed),
        "the page kept a task as it was before a workflow's write"
    );
}

/// What [`NodeStore`] promises.
pub async fn node_store_suite(store: &dyn NodeStore) {
    heartbeats_keep_the_latest_per_node(store).await;
    only_a_shared_store_has_a_change_feed(store);
}

/// What [`AccessStore`] promises, on an empty store.
pub async fn access_store_suite(store: &dyn AccessStore) {
    tokens_secrets_and_audit_records(store).await;
    token_records_are_deleted_by_id(store).await;
}

/// What [`ScheduleStore`] promises, on an empty store: schedules by
/// compare-and-set, and claims that exactly one of racing callers creates.
pub async fn schedule_store_suite(store: &dyn ScheduleStore) {
    schedules_are_stored_and_changed_by_compare_and_set(store).await;
    one_of_racing_claims_wins_and_claims_list_newest_first(store).await;
}

/// What `RetentionStore` promises, on an empty store: a workflow goes
/// with its tasks and logs only while finished at the version given, and
/// audit records go by time.
pub async fn retention_store_suite(storage: &Storage) {
    let (tasks, retention) = (storage.tasks(), storage.retention());
    let finish = |mut workflow: Workflow| {
        workflow.status = WorkflowStatus::Completed;
        workflow.finished_at = Some(Utc::now());
        workflow
    };
    let (done, done_tasks) = workflow_with_tasks(3);
    let (kept, kept_tasks) = workflow_with_tasks(2);
    let (running, running_tasks) = workflow_with_tasks(1);
    tasks
        .insert_workflow(&finish(done.clone()), &done_tasks)
        .await
        .unwrap();
    tasks
        .insert_workflow(&finish(kept.clone()), &kept_tasks)
        .await
        .unwrap();
    tasks
        .insert_workflow(&running, &running_tasks)
        .await
        .unwrap();
    for task in done_tasks.iter().chain(&kept_tasks) {
        tasks.append_log(task.id, b"output\n").await.unwrap();
    }
    // Read first: a store that keeps what it read lately must forget it.
    for task in &done_tasks {
        assert!(tasks.get_task(task.id).await.unwrap().is_some());
    }
    let done_listing = TaskQuery {
        workflow: Some(done.id),
        limit: 10,
        ..TaskQuery::default()
    };
    let listed = tasks.list_tasks(&done_listing).await.unwrap();
    assert_eq!((listed.items.len(), listed.total), (3, 3));
    assert!(tasks.get_workflow(done.id).await.unwrap().is_some());
    // `kept` changed after the decision (a retry): its version moved on.
    let stored = tasks.get_workflow(kept.id).await.unwrap().unwrap();
    tasks.update_workflow(&stored, &[]).await.unwrap();
    let pruned = retention
        .prune_workflows(&[
            (done.id, 0),
            (kept.id, stored.version),
            (running.id, 0),
            (WorkflowId::new(), 0),
        ])
        .await
        .unwrap();
    assert_eq!(
        pruned.workflows,
        vec![done.id],
        "only the finished, unchanged one"
    );
    assert_eq!(pruned.tasks, 3);
    assert!(tasks.get_workflow(done.id).await.unwrap().is_none());
    let listed = tasks.list_tasks(&done_listing).await.unwrap();
    assert_eq!(
        (listed.items.len(), listed.total),
        (0, 0),
        "a page read before the prune"
    );
    for task in &done_tasks {
        assert!(tasks.get_task(task.id).await.unwrap().is_none());
        let log = tasks.read_log(task.id, 0, 1024).await.unwrap();
        assert!(log.data.is_empty(), "the log went with its task");
    }
    assert_eq!(
        tasks.workflow_tasks(done.id).await.unwrap().len(),
        0,
        "no task is left under the pruned workflow"
    );
    for (id, n) in [(kept.id, 2), (running.id, 1)] {
        assert!(tasks.get_workflow(id).await.unwrap().is_some());
        assert_eq!(tasks.workflow_tasks(id).await.unwrap().len(), n);
    }
    let log = tasks.read_log(kept_tasks[0].id, 0, 1024).await.unwrap();
    assert_eq!(log.data, b"output\n");
    let listed = tasks
        .list_workflows(&WorkflowQuery {
            limit: 10,
            ..WorkflowQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.total, 2);
    // Pruning again is harmless.
    let again = retention.prune_workflows(&[(done.id, 0)]).await.unwrap();
    assert!(again.workflows.is_empty());

    let now = Utc::now();
    let access = storage.access();
    for age in [3, 2, 1, 0] {
        let at = now - chrono::TimeDelta::days(age);
        access
            .append_audit(&audit_record("ci", "workflow.submit", None, at))
            .await
            .unwrap();
    }
    let gone = retention
        .prune_audit(now - chrono::TimeDelta::hours(36))
        .await
        .unwrap();
    assert_eq!(gone, 2, "the records of 3 and 2 days ago");
    let left = access
        .list_audit(&AuditQuery {
            limit: 10,
            ..AuditQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(left.total, 2);
    assert!(
        left.items
            .iter()
            .all(|r| r.time >= now - chrono::TimeDelta::days(1))
    );
}

pub fn schedule(name: &str) -> Schedule {
    let now = Utc::now();
    Schedule {
        id: ScheduleId::new(),
        name: name.into(),
        template: "chain".into(),
        template_version: Some(1),
        vars: json!({"env": "nightly", "ünïcode": "✓"})
            .as_object()
            .unwrap()
            .clone(),
        cron: "0 2 * * *".into(),
        timezone: "Europe/Berlin".into(),
        overlap: Default::default(),
        catch_up: Default::default(),
        catch_up_window_secs: 3600,
        start_at: None,
        end_at: Some(now + chrono::TimeDelta::days(30)),
        paused: false,
        submitted_by: Some("scheduler-ops".into()),
        active_since: now,
        created_at: now,
        updated_at: now,
        version: 0,
    }
}

async fn schedules_are_stored_and_changed_by_compare_and_set(store: &dyn ScheduleStore) {
    let first = schedule("first");
    let second = schedule("second");
    store.insert_schedule(&first).await.unwrap();
    store.insert_schedule(&second).await.unwrap();
    let again = store.insert_schedule(&first).await;
    assert!(
        matches!(again, Err(Error::AlreadyExists { .. })),
        "{again:?}"
    );
    assert_eq!(
        store.get_schedule(first.id).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store.schedules().await.unwrap(),
        vec![first.clone(), second.clone()]
    );

    let mut paused = first.clone();
    paused.paused = true;
    let stored = store.update_schedule(&paused).await.unwrap();
    assert_eq!(stored.version, first.version + 1);
    assert_eq!(
        store.get_schedule(first.id).await.unwrap(),
        Some(stored.clone())
    );
    // The same change again is stale: its version is no longer stored.
    let stale = store.update_schedule(&paused).await;
    assert!(matches!(stale, Err(Error::Conflict { .. })), "{stale:?}");
    let unknown = store.update_schedule(&schedule("ghost")).await;
    assert!(
        matches!(unknown, Err(Error::NotFound { .. })),
        "{unknown:?}"
    );

    assert!(store.delete_schedule(first.id).await.unwrap());
    assert!(!store.delete_schedule(first.id).await.unwrap());
    assert_eq!(store.get_schedule(first.id).await.unwrap(), None);
    assert_eq!(store.schedules().await.unwrap(), vec![second.clone()]);
    assert!(store.delete_schedule(second.id).await.unwrap());
}

async fn one_of_racing_claims_wins_and_claims_list_newest_first(store: &dyn ScheduleStore) {
    let id = ScheduleId::new();
    let other = ScheduleId::new();
    let due = Utc::now().with_nanosecond(0).unwrap();
    // Eight nodes claim the same due time at once: one creates the claim.
    let racers: Vec<ScheduleClaim> = (0..8)
        .map(|n| ScheduleClaim::new(id, due, ClaimState::Claimed, format!("node-{n}"), due))
        .collect();
    let won = join_all(racers.iter().map(|c| store.claim(c))).await;
    let winners: Vec<usize> = won
        .into_iter()
        .enumerate()
        .filter_map(|(n, r)| r.unwrap().then_some(n))
        .collect();
    assert_eq!(winners.len(), 1, "{winners:?}");
    let stored = store.claims(id, 10).await.unwrap();
    assert_eq!(stored, vec![racers[winners[0]].clone()]);
    assert!(!store.claim(&racers[0]).await.unwrap(), "claimed already");

    for hours in 1..=3 {
        let later = ScheduleClaim::new(
            id,
            due + chrono::TimeDelta::hours(hours),
            ClaimState::Missed,
            "node-0",
            due,
        );
        assert!(store.claim(&later).await.unwrap());
    }
    let elsewhere = ScheduleClaim::new(other, due, ClaimState::Claimed, "node-0", due);
    assert!(store.claim(&elsewhere).await.unwrap());
    let newest: Vec<_> = store
        .claims(id, 2)
        .await
        .unwrap()
        .iter()
        .map(|c| c.due)
        .collect();
    assert_eq!(
        newest,
        [
            due + chrono::TimeDelta::hours(3),
            due + chrono::TimeDelta::hours(2)
        ]
    );
    assert_eq!(store.claims(id, 100).await.unwrap().len(), 4);
    assert_eq!(store.claims(other, 100).await.unwrap(), vec![elsewhere]);

    let mut started = stored[0].clone();
    started.state = ClaimState::Started;
    started.workflow_id = Some(WorkflowId::new());
    let stored = store.update_claim(&started).await.unwrap();
    assert_eq!(stored.version, started.version + 1);
    let stale = store.update_claim(&started).await;
    assert!(matches!(stale, Err(Error::Conflict { .. })), "{stale:?}");
    assert_eq!(store.claims(id, 100).await.unwrap().last(), Some(&stored));
    let unknown = ScheduleClaim::new(ScheduleId::new(), due, ClaimState::Claimed, "n", due);
    let missing = store.update_claim(&unknown).await;
    assert!(
        matches!(missing, Err(Error::NotFound { .. })),
        "{missing:?}"
    );
}

/// What [`BulkTransfer`] promises, on an empty writable store: records and
/// logs imported come back from every read as they were given, and a
/// second import changes nothing.
pub async fn bulk_transfer_suite(store: &dyn BulkTransfer) {
    let fixture = BulkFixture::new();
    fixture.import_into(store).await;
    bulk_reads_return_what_is_stored(store, &fixture).await;
    imports_replace_and_repeat_harmlessly(store, &fixture).await;
    log_imports_start_exactly_at_the_length(store, &fixture).await;
}

/// What [`BulkTransfer`] promises on a store opened read-only, holding
/// `fixture` (imported through a writable open of the same store): every
/// read, and every write refused.
pub async fn read_only_bulk_suite(store: &dyn BulkTransfer, fixture: &BulkFixture) {
    bulk_reads_return_what_is_stored(store, fixture).await;
    let refused = store.import(&[]).await;
    assert!(matches!(refused, Err(Error::ReadOnly(_))), "{refused:?}");
    let refused = store.import(&fixture.records[..1]).await;
    assert!(matches!(refused, Err(Error::ReadOnly(_))), "{refused:?}");
    let refused = store.import_logs(&fixture.logs[..1]).await;
    assert!(matches!(refused, Err(Error::ReadOnly(_))), "{refused:?}");
    bulk_reads_return_what_is_stored(store, fixture).await;
}

fn only_a_shared_store_has_a_change_feed(store: &dyn NodeStore) {
    // Only a store that several nodes share has changes the engine does not
    // make itself.
    assert_eq!(store.changes().is_some(), store.shared());
}

/// A workflow's tasks as owned records, to compare with what was stored.
pub async fn workflow_tasks(store: &dyn TaskStore, id: orchestrator_core::WorkflowId) -> Vec<Task> {
    store
        .workflow_tasks(id)
        .await
        .unwrap()
        .into_iter()
        .map(std::sync::Arc::unwrap_or_clone)
        .collect()
}

pub fn workflow_with_tasks(n: usize) -> (Workflow, Vec<Task>) {
    let id = WorkflowId::new();
    let now = Utc::now();
    let tasks: Vec<Task> = (0..n)
        .map(|i| {
            let spec = TaskSpec {
                name: format!("task-{i}"),
                script: "noop.sh".into(),
                input: json!({"i": i, "unicode": "héllo wörld ✓ 日本"}),
                priority: Priority::Normal,
                max_attempts: 3,
                timeout: Duration::from_secs(30),
                check_mode: false,
                depends_on: vec![],
                step: Default::default(),
            };
            Task::new(id, spec, now)
        })
        .collect();
    let mut workflow = Workflow::new("test", "conformance", now);
    workflow.id = id;
    workflow.template_version = Some(1);
    workflow.input = json!({"vars": {"k": "v"}}).into();
    workflow.task_ids = tasks.iter().map(|t| t.id).collect();
    (workflow, tasks)
}

/// `update_workflow_and_tasks` is one compare-and-set over all of them:
/// one stale version (the workflow's or any task's) writes nothing.
async fn a_workflow_and_its_tasks_change_in_one_write_or_not_at_all(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(3);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    // Someone else moved the last task on.
    let moved = store.update_task(&tasks[2]).await.unwrap();
    let mut changed = workflow.clone();
    changed.status = WorkflowStatus::Running;
    let reset: Vec<Task> = tasks
        .iter()
        .map(|t| {
            let mut t = t.clone();
            t.input = json!({"reset": true});
            t
        })
        .collect();
    let err = store
        .update_workflow_and_tasks(&changed, &reset)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Conflict { what: "task", id, expected: 0, found: 1 } if *id == tasks[2].id.to_string()),
        "{err}"
    );
    let stored = store.get_workflow(workflow.id).await.unwrap().unwrap();
    assert_eq!((stored.version, stored.status), (0, WorkflowStatus::Queued));
    for task in &tasks[..2] {
        let stored = store.get_task(task.id).await.unwrap().unwrap();
        assert_eq!(stored.version, 0, "no task was written");
        assert_ne!(stored.input, json!({"reset": true}));
    }
    // With every version current, all of it is written.
    let mut reset = reset;
    reset[2].version = moved.version;
    let (stored, stored_tasks) = store
        .update_workflow_and_tasks(&changed, &reset)
        .await
        .unwrap();
    assert_eq!(
        (stored.version, stored.status),
        (1, WorkflowStatus::Running)
    );
    assert_eq!(
        stored_tasks.iter().map(|t| t.version).collect::<Vec<_>>(),
        vec![1, 1, 2]
    );
    for task in &tasks {
        let read = store.get_task(task.id).await.unwrap().unwrap();
        assert_eq!(read.input, json!({"reset": true}));
    }
    assert_eq!(
        store
            .get_workflow(workflow.id)
            .await
            .unwrap()
            .unwrap()
            .status,
        WorkflowStatus::Running
    );
    // A stale workflow version writes nothing either.
    let err = store
        .update_workflow_and_tasks(&changed, &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Conflict {
                what: "workflow",
                ..
            }
        ),
        "{err}"
    );
}

/// Many writers on one workflow at once, as when several steps finish
/// together: each write either lands or is told `Conflict` (and re-reads);
/// none fails for any other reason, and none is lost.
async fn racing_workflow_updates_win_or_conflict(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(1);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    let writers = (0..8).map(|writer| async move {
        for round in 0..5 {
            loop {
                let mut current = store.get_workflow(workflow.id).await.unwrap().unwrap();
                current.description = Some(format!("writer {writer} round {round}"));
                match store.update_workflow(&current, &[]).await {
                    Ok(_) => break,
                    Err(Error::Conflict { .. }) => continue,
                    Err(e) => panic!("writer {writer}: {e}"),
                }
            }
        }
    });
    join_all(writers).await;
    let stored = store.get_workflow(workflow.id).await.unwrap().unwrap();
    assert_eq!(
        stored.version,
        workflow.version + 40,
        "every write landed once"
    );
}

pub fn audit_record(
    actor: &str,
    action: &str,
    target: Option<&str>,
    at: chrono::DateTime<Utc>,
) -> AuditRecord {
    AuditRecord {
        id: uuid::Uuid::now_v7().to_string(),
        time: at,
        actor: actor.into(),
        role: Some(Role::Operator),
        action: action.into(),
        target: target.map(Into::into),
        outcome: "ok".into(),
        status: 202,
        request_id: Some("req-1".into()),
        count: None,
    }
}

/// Ended dashboard sessions are deleted by id: only the records named go,
/// a second deletion finds none, and an unknown id is no error.
async fn token_records_are_deleted_by_id(store: &dyn AccessStore) {
    let now = Utc::now();
    let token = ApiToken::new(
        "0190dd".into(),
        "ui".into(),
        Role::Viewer,
        "orch_0190dd_z",
        now,
    );
    store.put_token(&token).await.unwrap();
    let sessions: Vec<ApiToken> = (0..3)
        .map(|i| {
            ApiToken::session(
                format!("0190dd5{i}"),
                &token,
                now,
                now + chrono::Duration::hours(1),
            )
        })
        .collect();
    for session in &sessions {
        store.put_token(session).await.unwrap();
    }
    let ended = [
        sessions[0].id.clone(),
        sessions[2].id.clone(),
        "absent".into(),
    ];
    assert_eq!(store.delete_tokens(&ended).await.unwrap(), 2);
    let left: Vec<String> = (store.tokens().await.unwrap().into_iter())
        .filter(|t| t.id.starts_with("0190dd"))
        .map(|t| t.id)
        .collect();
    assert_eq!(left, vec![token.id.clone(), sessions[1].id.clone()]);
    assert_eq!(store.delete_tokens(&ended).await.unwrap(), 0);
    assert_eq!(store.delete_tokens(&[]).await.unwrap(), 0);
}

async fn tokens_secrets_and_audit_records(store: &dyn AccessStore) {
    let now = Utc::now();
    let token = ApiToken::new(
        "0190aa".into(),
        "ci".into(),
        Role::Operator,
        "orch_0190aa_x",
        now,
    );
    store.put_token(&token).await.unwrap();
    let mut revoked = token.clone();
    revoked.revoked_at = Some(now);
    revoked.version += 1;
    store.put_token(&revoked).await.unwrap();
    let other = ApiToken::new(
        "0190bb".into(),
        "ops".into(),
        Role::Admin,
        "orch_0190bb_y",
        now,
    );
    store.put_token(&other).await.unwrap();
    assert_eq!(store.tokens().await.unwrap(), vec![revoked, other]);

    let secret = SecretRecord {
        name: "db.password".into(),
        nonce: "bm9uY2U=".into(),
        ciphertext: "Y2lwaGVy".into(),
        created_at: now,
        updated_at: now,
        version: 0,
        scope: SecretScope {
            templates: vec!["deploy".into()],
            origins: vec!["https://vault.example:8200".into()],
        },
    };
    store.put_secret(&secret).await.unwrap();
    assert_eq!(store.secrets().await.unwrap(), vec![secret.clone()]);
    let mut changed = secret.clone();
    changed.ciphertext = "b3RoZXI=".into();
    changed.scope.templates.push("rollout".into());
    changed.version = 1;
    store.put_secret(&changed).await.unwrap();
    assert_eq!(store.secrets().await.unwrap(), vec![changed]);
    assert!(store.delete_secret("db.password").await.unwrap());
    assert!(!store.delete_secret("db.password").await.unwrap());
    assert!(store.secrets().await.unwrap().is_empty());

    let early = now - chrono::Duration::seconds(60);
    let records = [
        audit_record("ci", "workflow.submit", Some("w1"), early),
        audit_record("ci", "task.cancel", Some("t1"), now),
        audit_record("ops", "token.create", Some("0190bb"), now),
    ];
    for record in &records {
        store.append_audit(record).await.unwrap();
    }
    let list = |query: AuditQuery| async move {
        let query = AuditQuery {
            limit: if query.limit == 0 { 10 } else { query.limit },
            ..query
        };
        let page = store.list_audit(&query).await.unwrap();
        (
            page.items.into_iter().map(|r| r.action).collect::<Vec<_>>(),
            page.total,
        )
    };
    assert_eq!(
        list(AuditQuery::default()).await,
        (
            vec![
                "token.create".into(),
                "task.cancel".into(),
                "workflow.submit".into()
            ],
            3
        )
    );
    let by_actor = AuditQuery {
        actor: Some("ci".into()),
        ..Default::default()
    };
    assert_eq!(list(by_actor).await.1, 2);
    let by_action = AuditQuery {
        action: Some("task.cancel".into()),
        ..Default::default()
    };
    assert_eq!(list(by_action).await.0, vec!["task.cancel".to_owned()]);
    let by_target = AuditQuery {
        target: Some("w1".into()),
        ..Default::default()
    };
    assert_eq!(list(by_target).await.0, vec!["workflow.submit".to_owned()]);
    let recent = AuditQuery {
        since: Some(now - chrono::Duration::seconds(1)),
        ..Default::default()
    };
    assert_eq!(list(recent).await.1, 2);
    let old = AuditQuery {
        until: Some(now - chrono::Duration::seconds(1)),
        ..Default::default()
    };
    assert_eq!(list(old).await.0, vec!["workflow.submit".to_owned()]);
    let paged = AuditQuery {
        limit: 1,
        offset: 1,
        ..Default::default()
    };
    assert_eq!(list(paged).await, (vec!["task.cancel".into()], 3));
    let stored = store
        .list_audit(&AuditQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(stored.items[2], records[0], "stored as given");
}

async fn heartbeats_keep_the_latest_per_node(store: &dyn NodeStore) {
    let started = Utc::now();
    let node = |id: &str, seconds: i64| orchestrator_core::Node {
        id: id.to_owned(),
        address: format!("http://{id}:8080"),
        started_at: started,
        last_seen: started + chrono::Duration::seconds(seconds),
    };
    store.heartbeat(&node("node-a", 0)).await.unwrap();
    store.heartbeat(&node("node-b", 1)).await.unwrap();
    store.heartbeat(&node("node-a", 5)).await.unwrap();
    let mut nodes = store.nodes().await.unwrap();
    nodes.retain(|n| n.id == "node-a" || n.id == "node-b");
    nodes.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(nodes, vec![node("node-a", 5), node("node-b", 1)]);
}

async fn insert_and_read_back(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(3);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    assert_eq!(
        store.get_workflow(workflow.id).await.unwrap(),
        Some(workflow.clone())
    );
    for task in &tasks {
        assert_eq!(store.get_task(task.id).await.unwrap().as_ref(), Some(task));
    }
    assert_eq!(workflow_tasks(store, workflow.id).await, tasks);
    assert_eq!(store.unfinished_tasks().await.unwrap(), tasks);
    assert_eq!(
        store
            .get_task(orchestrator_core::TaskId::new())
            .await
            .unwrap(),
        None
    );
}

async fn compare_and_set_updates(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(1);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    // Read before each write: a store that keeps what it read lately must
    // answer with what was written since.
    assert_eq!(
        store.get_task(tasks[0].id).await.unwrap().as_ref(),
        Some(&tasks[0])
    );
    let mut task = tasks[0].clone();
    task.start(Utc::now()).unwrap();
    let stored = store.update_task(&task).await.unwrap();
    assert_eq!(stored.version, task.version + 1);
    assert_eq!(stored.status, TaskStatus::Running);
    assert_eq!(
        store.get_task(task.id).await.unwrap().as_ref(),
        Some(&stored)
    );

    // The same stale copy can not be written twice.
    let err = store.update_task(&task).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Conflict {
                expected: 0,
                found: 1,
                ..
            }
        ),
        "{err}"
    );

    let mut next = stored.clone();
    next.complete(json!({"ok": true}), Utc::now()).unwrap();
    let done = store.update_task(&next).await.unwrap();
    assert_eq!(store.get_task(task.id).await.unwrap(), Some(done));
    assert!(store.unfinished_tasks().await.unwrap().is_empty());

    let (_, strangers) = workflow_with_tasks(1);
    assert!(matches!(
        store.update_task(&strangers[0]).await,
        Err(Error::TaskNotFound(_))
    ));
}

async fn concurrent_claims_hand_out_each_task_once(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(20);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    // Eight claimers race for every task; each claim is a CAS from the
    // version they read.
    let claimers = (0..8).map(|_| async {
        let mut won = Vec::new();
        for task in &tasks {
            let mut claim = task.clone();
            claim.start(Utc::now()).unwrap();
            if store.update_task(&claim).await.is_ok() {
                won.push(task.id);
            }
        }
        won
    });
    let winners: Vec<_> = join_all(claimers).await.into_iter().flatten().collect();
    let unique: HashSet<_> = winners.iter().collect();
    assert_eq!(winners.len(), 20, "every task claimed exactly once");
    assert_eq!(unique.len(), 20);
}

async fn listing_orders_filters_and_pages(store: &dyn TaskStore) {
    let (workflow_a, tasks_a) = workflow_with_tasks(5);
    let (workflow_b, tasks_b) = workflow_with_tasks(4);
    store.insert_workflow(&workflow_a, &tasks_a).await.unwrap();
    store.insert_workflow(&workflow_b, &tasks_b).await.unwrap();
    let mut running = tasks_b[1].clone();
    running.start(Utc::now()).unwrap();
    store.update_task(&running).await.unwrap();

    let all = store
        .list_tasks(&TaskQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(all.total >= 9);
    let ids: Vec<_> = all.items.iter().map(|t| t.id).collect();
    let mut newest_first = ids.clone();
    newest_first.sort_by(|a, b| b.cmp(a));
    assert_eq!(ids, newest_first, "newest first");

    let by_workflow = store
        .list_tasks(&TaskQuery {
            workflow: Some(workflow_a.id),
            limit: 2,
            offset: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(by_workflow.total, 5);
    assert_eq!(
        by_workflow.items.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![tasks_a[3].id, tasks_a[2].id]
    );

    let running_in_b = store
        .list_tasks(&TaskQuery {
            workflow: Some(workflow_b.id),
            status: Some(TaskStatus::Running),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(running_in_b.total, 1);
    assert_eq!(running_in_b.items[0].id, running.id);

    let queued = store
        .list_tasks(&TaskQuery {
            status: Some(TaskStatus::Queued),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(queued.items.iter().all(|t| t.status == TaskStatus::Queued));
    assert!(!queued.items.iter().any(|t| t.id == running.id));

    let past_the_end = store
        .list_tasks(&TaskQuery {
            workflow: Some(workflow_a.id),
            limit: 10,
            offset: 50,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(past_the_end.items.is_empty());
    assert_eq!(past_the_end.total, 5);

    let workflows = store
        .list_workflows(&WorkflowQuery {
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(workflows.items[0].id, workflow_b.id);
}

/// Keyset paging (`after`): every filter shape pages through exactly
/// what one big page holds, in order, with each page starting past the
/// previous page's last record; the total ignores the cursor, and an
/// offset counts from it.
async fn keyset_pages_cover_each_listing_once(store: &dyn TaskStore) {
    let (workflow_a, tasks_a) = workflow_with_tasks(7);
    let (workflow_b, tasks_b) = workflow_with_tasks(3);
    store.insert_workflow(&workflow_a, &tasks_a).await.unwrap();
    store.insert_workflow(&workflow_b, &tasks_b).await.unwrap();
    for task in [&tasks_a[1], &tasks_a[4], &tasks_b[0]] {
        let mut running = task.clone();
        running.start(Utc::now()).unwrap();
        store.update_task(&running).await.unwrap();
    }
    let shapes = [
        (None, None),
        (None, Some(TaskStatus::Running)),
        (Some(workflow_a.id), None),
        (Some(workflow_a.id), Some(TaskStatus::Queued)),
    ];
    for (workflow, status) in shapes {
        let query = TaskQuery {
            workflow,
            status,
            ..Default::default()
        };
        let whole = store
            .list_tasks(&TaskQuery {
                limit: 1000,
                ..query.clone()
            })
            .await
            .unwrap();
        let expected: Vec<_> = whole.items.iter().map(|t| t.id).collect();
        assert!(expected.len() >= 2, "{workflow:?} {status:?}: {expected:?}");
        let mut walked = Vec::new();
        let mut after = None;
        loop {
            let page = store
                .list_tasks(&TaskQuery {
                    after,
                    limit: 2,
                    ..query.clone()
                })
                .await
                .unwrap();
            assert_eq!(page.total, whole.total, "{workflow:?} {status:?}");
            walked.extend(page.items.iter().map(|t| t.id));
            match page.items.last() {
                Some(last) if page.items.len() == 2 => after = Some(last.id),
                _ => break,
            }
        }
        assert_eq!(walked, expected, "{workflow:?} {status:?}");

        // An offset counts from the cursor.
        let skipped = store
            .list_tasks(&TaskQuery {
                after: Some(expected[0]),
                offset: 1,
                limit: 1000,
                ..query.clone()
            })
            .await
            .unwrap();
        let ids: Vec<_> = skipped.items.iter().map(|t| t.id).collect();
        assert_eq!(ids, expected[2..], "{workflow:?} {status:?}");
    }

    // A cursor that names no record still bounds the page: the newest
    // id there is sorts after every stored one, the oldest before.
    let all = store
        .list_tasks(&TaskQuery {
            after: Some(TaskId::new()),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(all.items.iter().any(|t| t.id == tasks_b[2].id));
    let none = store
        .list_tasks(&TaskQuery {
            after: Some(TaskId::from_uuid(uuid::Uuid::nil())),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(none.items.is_empty(), "{:?}", none.items);

    // Workflows page the same way.
    let mut walked = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_workflows(&WorkflowQuery {
                after,
                limit: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        walked.extend(page.items.iter().map(|w| w.id));
        match page.items.last() {
            Some(last) => after = Some(last.id),
            None => break,
        }
    }
    let a = walked.iter().position(|id| *id == workflow_a.id).unwrap();
    let b = walked.iter().position(|id| *id == workflow_b.id).unwrap();
    assert!(b < a, "newest first: {walked:?}");
    assert_eq!(
        walked.len(),
        walked.iter().collect::<HashSet<_>>().len(),
        "no workflow twice: {walked:?}"
    );
}

async fn large_and_unicode_payloads(store: &dyn TaskStore) {
    let (workflow, mut tasks) = workflow_with_tasks(1);
    let big = "ü—🚀".repeat(100_000);
    tasks[0].input = json!({"blob": big, "nested": {"list": [1, 2.5, null, "x"]}});
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    let read = store.get_task(tasks[0].id).await.unwrap().unwrap();
    assert_eq!(read.input, tasks[0].input);
}

async fn logs_append_and_read_from_offsets(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(1);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    let id = tasks[0].id;
    let empty = store.read_log(id, 0, 1024).await.unwrap();
    assert!(empty.data.is_empty());
    store
        .append_log(id, "line one ✓\n".as_bytes())
        .await
        .unwrap();
    store.append_log(id, b"line two\n").await.unwrap();
    let all = store.read_log(id, 0, 1 << 20).await.unwrap();
    assert_eq!(
        String::from_utf8(all.data).unwrap(),
        "line one ✓\nline two\n"
    );
    let tail = store
        .read_log(id, all.next_offset - 9, 1 << 20)
        .await
        .unwrap();
    assert_eq!(tail.data, b"line two\n");
    assert_eq!(tail.next_offset, all.next_offset);
    let limited = store.read_log(id, 0, 4).await.unwrap();
    assert_eq!(limited.data, b"line");
    assert_eq!(limited.next_offset, 4);
}

async fn log_appends_return_the_new_length(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(2);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    let (id, other) = (tasks[0].id, tasks[1].id);
    let log = store;
    assert_eq!(log.append_log(id, "ünï\n".as_bytes()).await.unwrap(), 6);
    assert_eq!(log.append_log(id, b"two\n").await.unwrap(), 10);
    assert_eq!(log.append_log(other, b"x").await.unwrap(), 1, "per task");
    assert_eq!(
        log.append_log(id, b"").await.unwrap(),
        10,
        "nothing appended"
    );
    assert_eq!(log.append_log(other, b"").await.unwrap(), 1);
    let never = orchestrator_core::TaskId::new();
    assert_eq!(log.append_log(never, b"").await.unwrap(), 0, "no log yet");
    // Concurrent appends to one log: each length is where its own chunk
    // ends, so they are all different and the last is the whole log.
    let appends = (0..8).map(|_| store.append_log(id, b"0123456789"));
    let mut lengths: Vec<u64> = join_all(appends)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    lengths.sort_unstable();
    assert_eq!(lengths, (1..=8).map(|n| 10 + 10 * n).collect::<Vec<u64>>());
    let all = log.read_log(id, 0, 1 << 20).await.unwrap();
    assert_eq!(all.next_offset, 90);
}

async fn duplicate_inserts_are_refused(store: &dyn TaskStore) {
    let (workflow, tasks) = workflow_with_tasks(2);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    let err = store.insert_workflow(&workflow, &tasks).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::AlreadyExists {
                what: "workflow",
                ..
            }
        ),
        "{err}"
    );
}

async fn workflows_update_by_compare_and_set_and_grow_atomically(store: &dyn TaskStore) {
    let (mut workflow, tasks) = workflow_with_tasks(1);
    store.insert_workflow(&workflow, &tasks).await.unwrap();
    let (_, extra) = workflow_with_tasks(2);
    let extra: Vec<Task> = extra
        .into_iter()
        .map(|mut t| {
            t.workflow_id = workflow.id;
            t
        })
        .collect();
    workflow.status = WorkflowStatus::RollingBack;
    workflow.task_ids.extend(extra.iter().map(|t| t.id));
    let stored = store.update_workflow(&workflow, &extra).await.unwrap();
    assert_eq!(stored.version, 1);
    assert_eq!(
        store.get_workflow(workflow.id).await.unwrap(),
        Some(stored.clone())
    );
    assert_eq!(store.workflow_tasks(workflow.id).await.unwrap().len(), 3);

    // A stale version is refused and adds nothing.
    let (_, more) = workflow_with_tasks(1);
    let err = store.update_workflow(&workflow, &more).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::Conflict {
                what: "workflow",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(store.get_task(more[0].id).await.unwrap(), None);

    let (stranger, _) = workflow_with_tasks(0);
    assert!(matches!(
        store.update_workflow(&stranger, &[]).await,
        Err(Error::WorkflowNotFound(_))
    ));
}

async fn idempotency_keys_and_revisions_are_unique(store: &dyn TaskStore) {
    let key = format!("key-{}", WorkflowId::new());
    let (mut first, tasks) = workflow_with_tasks(1);
    first.idempotency_key = Some(key.clone());
    store.insert_workflow(&first, &tasks).await.unwrap();
    let (mut second, tasks) = workflow_with_tasks(1);
    second.idempotency_key = Some(key.clone());
    let err = store.insert_workflow(&second, &tasks).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::AlreadyExists {
                what: "idempotency key",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        store.get_task(tasks[0].id).await.unwrap(),
        None,
        "nothing of a refused insert is kept"
    );
    let found = store
        .list_workflows(&WorkflowQuery {
            idempotency_key: Some(key),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(found.items, vec![first]);

    let reference = format!("ref-{}", WorkflowId::new());
    let (mut one, tasks) = workflow_with_tasks(1);
    one.reference = Some(reference.clone());
    store.insert_workflow(&one, &tasks).await.unwrap();
    let (mut clash, tasks) = workflow_with_tasks(1);
    clash.reference = Some(reference.clone());
    let err = store.insert_workflow(&clash, &tasks).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::AlreadyExists {
                what: "workflow revision",
                ..
            }
        ),
        "{err}"
    );
    clash.revision = 2;
    clash.previous_revision = Some(one.id);
    store.insert_workflow(&clash, &tasks).await.unwrap();
    let revisions = store
        .list_workflows(&WorkflowQuery {
            reference: Some(reference),
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(revisions.total, 2);
    assert_eq!(revisions.items[0].revision, 2, "newest first");
}

async fn workflows_filter_by_every_field(store: &dyn TaskStore) {
    let trace = format!("trace-{}", WorkflowId::new());
    let kind = format!("kind-{}", WorkflowId::new());
    let (mut a, tasks_a) = workflow_with_tasks(1);
    a.trace_id = Some(trace.clone());
    a.kind = kind.clone();
    store.insert_workflow(&a, &tasks_a).await.unwrap();
    let (mut b, tasks_b) = workflow_with_tasks(1);
    b.kind = kind.clone();
    b.status = WorkflowStatus::Completed;
    store.insert_workflow(&b, &tasks_b).await.unwrap();

    let query = |q: WorkflowQuery| async move {
        store
            .list_workflows(&WorkflowQuery { limit: 100, ..q })
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|w| w.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(
        query(WorkflowQuery {
            trace_id: Some(trace),
            ..Default::default()
        })
        .await,
        vec![a.id]
    );
    assert_eq!(
        query(WorkflowQuery {
            kind: Some(kind.clone()),
            ..Default::default()
        })
        .await,
        vec![b.id, a.id]
    );
    assert_eq!(
        query(WorkflowQuery {
            kind: Some(kind),
            status: Some(WorkflowStatus::Completed),
            ..Default::default()
        })
        .await,
        vec![b.id]
    );
    let page = store
        .list_workflows(&WorkflowQuery {
            limit: 1,
            offset: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.items.len(), 1);
    assert!(page.total >= 2);
}

/// `text` finds a workflow by a piece of its name, template, reference or
/// an input value (at any depth, a number too), in any case, with the
/// other filters and a page; a field's name or a value of the raw
/// submission outside the inputs is not searched.
async fn workflows_found_by_text(store: &dyn TaskStore) {
    let tag = WorkflowId::new().to_string().replace('-', "");
    let (mut a, tasks_a) = workflow_with_tasks(1);
    a.name = format!("Deploy Alpha-{tag}");
    a.kind = format!("kind-{tag}");
    a.reference = Some(format!("ref-a-{tag}"));
    a.vars = json!({"servers": [{"host": format!("web-{tag}.example")}], "port": 8443});
    store.insert_workflow(&a, &tasks_a).await.unwrap();
    let (mut b, tasks_b) = workflow_with_tasks(1);
    b.name = format!("Deploy Beta-{tag}");
    b.kind = format!("kind-{tag}");
    b.status = WorkflowStatus::Completed;
    b.vars = json!({"note": format!("Quoted \"Zeta\" {tag}")});
    store.insert_workflow(&b, &tasks_b).await.unwrap();

    let found = |text: String, status: Option<WorkflowStatus>| async move {
        let page = store
            .list_workflows(&WorkflowQuery {
                text: Some(text),
                status,
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(page.total, page.items.len());
        page.items.into_iter().map(|w| w.id).collect::<Vec<_>>()
    };
    // The name, in another case; both share the template.
    assert_eq!(found(format!("ALPHA-{tag}"), None).await, vec![a.id]);
    assert_eq!(found(format!("KIND-{tag}"), None).await, vec![b.id, a.id]);
    assert_eq!(
        found(format!("kind-{tag}"), Some(WorkflowStatus::Completed)).await,
        vec![b.id]
    );
    // The reference, a nested input value, a number, a quote.
    assert_eq!(found(format!("ref-a-{tag}"), None).await, vec![a.id]);
    assert_eq!(found(format!("WEB-{tag}.EXAMPLE"), None).await, vec![a.id]);
    assert!(found("8443".into(), None).await.contains(&a.id));
    assert_eq!(found(format!("\"zeta\" {tag}"), None).await, vec![b.id]);
    // Not a field's name, not the raw submission, not another workflow.
    assert!(!found("servers".into(), None).await.contains(&a.id));
    assert!(!found(format!("nothing-{tag}"), None).await.contains(&a.id));
    // A page of the matches, with their total.
    let page = store
        .list_workflows(&WorkflowQuery {
            text: Some(tag.clone()),
            limit: 1,
            offset: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(page.total, 2);
    assert_eq!(
        page.items.iter().map(|w| w.id).collect::<Vec<_>>(),
        vec![a.id]
    );
}

/// Records of every kind, and task logs in pieces, for the bulk suites.
pub struct BulkFixture {
    /// Workflows, then tasks, tokens, secrets, audit records, schedule
    /// claims and schedules, webhook deliveries and subscriptions.
    pub records: Vec<Record>,
    /// Log pieces, two of them for one task.
    pub logs: Vec<LogPiece>,
    /// Each log whole, by task.
    log_of: BTreeMap<TaskId, Vec<u8>>,
    /// A task with no log.
    quiet: TaskId,
}

impl BulkFixture {
    pub fn new() -> BulkFixture {
        let now = Utc::now();
        let (first, first_tasks) = workflow_with_tasks(3);
        let (second, second_tasks) = workflow_with_tasks(2);
        let mut records = vec![Record::Workflow(first), Record::Workflow(second)];
        records.extend(
            first_tasks
                .iter()
                .chain(&second_tasks)
                .cloned()
                .map(Record::Task),
        );
        for (id, name) in [("0190aa", "ci"), ("0190bb", "ops")] {
            let token = ApiToken::new(id.into(), name.into(), Role::Operator, "orch_x", now);
            records.push(Record::Token(token));
        }
        for name in ["api_key", "db.password"] {
            records.push(Record::Secret(SecretRecord {
                name: name.into(),
                nonce: "bm9uY2U=".into(),
                ciphertext: "Y2lwaGVy".into(),
                created_at: now,
                updated_at: now,
                version: 1,
                // A scope moves with its secret.
                scope: SecretScope {
                    templates: vec![format!("uses-{}", name.replace('.', "-"))],
                    origins: vec!["https://vault.example".into()],
                },
            }));
        }
        for action in ["workflow.submit", "task.cancel", "token.create"] {
            records.push(Record::Audit(audit_record("ci", action, Some("w1"), now)));
        }
        let nightly = schedule("nightly");
        for hour in 0..2 {
            let due = now.with_nanosecond(0).unwrap() + chrono::TimeDelta::hours(hour);
            let claim = ScheduleClaim::new(nightly.id, due, ClaimState::Skipped, "node-1", now);
            records.push(Record::ScheduleClaim(claim));
        }
        records.push(Record::Schedule(nightly));
        records.push(Record::Schedule(schedule("hourly")));
        // Webhook subscriptions and deliveries (one sent, with its
        // attempt) move too.
        let hook = subscription("https://hooks.example/a");
        let mut sent = delivery("msg_0190aa", &hook, now);
        sent.version = 2;
        records.push(Record::WebhookDelivery(sent));
        records.push(Record::WebhookDelivery(delivery("msg_0190bb", &hook, now)));
        records.push(Record::WebhookSubscription(hook));
        let piece = |task: &Task, offset: u64, data: &str| LogPiece {
            task: task.id,
            offset,
            data: data.as_bytes().to_vec(),
        };
        let logs = vec![
            piece(&first_tasks[0], 0, "first "),
            piece(&first_tasks[0], 6, "second ✓\n"),
            piece(&second_tasks[1], 0, "only\n"),
        ];
        let mut log_of: BTreeMap<TaskId, Vec<u8>> = BTreeMap::new();
        for piece in &logs {
            log_of
                .entry(piece.task)
                .or_default()
                .extend_from_slice(&piece.data);
        }
        BulkFixture {
            records,
            logs,
            log_of,
            quiet: first_tasks[1].id,
        }
    }

    /// Imports the records and the logs.
    pub async fn import_into(&self, store: &dyn BulkTransfer) {
        store.import(&self.records).await.unwrap();
        store.import_logs(&self.logs).await.unwrap();
    }

    /// The records of `kind` as JSON, by key.
    fn of_kind(&self, kind: RecordKind) -> BTreeMap<String, Vec<u8>> {
        self.records
            .iter()
            .filter(|r| r.kind() == kind)
            .map(|r| (r.key(), r.to_json()))
            .collect()
    }
}

/// A log whole, read through `read_logs` as a migration reads it: on from
/// each answer's `next_offset` until an answer is empty.
async fn read_whole_log(store: &dyn BulkTransfer, task: TaskId) -> Vec<u8> {
    let mut log = Vec::new();
    loop {
        let asks = [(task, log.len() as u64, 1 << 20)];
        let mut answers = store.read_logs(&asks).await.unwrap();
        assert_eq!(answers.len(), 1);
        let answer = answers.remove(0);
        assert_eq!(answer.next_offset, (log.len() + answer.data.len()) as u64);
        if answer.data.is_empty() {
            return log;
        }
        log.extend(answer.data);
    }
}

async fn bulk_reads_return_what_is_stored(store: &dyn BulkTransfer, fixture: &BulkFixture) {
    assert!(!store.name().is_empty());
    for kind in RecordKind::ALL {
        let expected = fixture.of_kind(kind);
        assert_eq!(
            store.count(kind).await.unwrap(),
            expected.len() as u64,
            "{kind}"
        );
        // Batch by batch, each after the last key of the one before.
        let mut scanned = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let batch = store.scan(kind, after.as_deref(), 2).await.unwrap();
            assert!(batch.len() <= 2, "{kind}: at most the limit");
            let Some(last) = batch.last() else { break };
            after = Some(last.key.clone());
            for found in batch {
                scanned.push((found.key, found.record.unwrap().to_json()));
            }
        }
        let in_key_order: Vec<_> = expected.clone().into_iter().collect();
        assert_eq!(scanned, in_key_order, "{kind}: every record, in key order");
        // Asked in any order, with a key that holds nothing: found ones in
        // key order.
        let mut keys: Vec<String> = expected.keys().rev().cloned().collect();
        keys.insert(keys.len() / 2, TaskId::new().to_string());
        let fetched: Vec<_> = store
            .fetch(kind, &keys)
            .await
            .unwrap()
            .into_iter()
            .map(|found| (found.key, found.record.unwrap().to_json()))
            .collect();
        assert_eq!(fetched, in_key_order, "{kind}: fetched by key");
    }

    let (&talkative, whole) = fixture.log_of.iter().next().unwrap();
    let asked: Vec<TaskId> = fixture
        .log_of
        .keys()
        .copied()
        .chain([fixture.quiet, TaskId::new()])
        .collect();
    let mut lengths: Vec<u64> = fixture.log_of.values().map(|l| l.len() as u64).collect();
    lengths.extend([0, 0]);
    assert_eq!(store.log_lengths(&asked).await.unwrap(), lengths);
    for (&task, log) in &fixture.log_of {
        assert_eq!(&read_whole_log(store, task).await, log);
    }
    // Several pieces in one call, answered in the order asked; an answer
    // may stop short, but never says more than the log holds there.
    let asks = [(fixture.quiet, 0, 10), (talkative, 3, 4), (talkative, 0, 2)];
    let answers = store.read_logs(&asks).await.unwrap();
    assert_eq!(answers.len(), asks.len());
    for (answer, &(_, offset, max_bytes)) in answers.iter().zip(&asks) {
        assert_eq!(answer.next_offset, offset + answer.data.len() as u64);
        assert!(answer.data.len() <= max_bytes);
    }
    assert!(answers[0].data.is_empty(), "no log, nothing");
    for (answer, &(_, offset, _)) in answers.iter().zip(&asks).skip(1) {
        let at = usize::try_from(offset).unwrap();
        assert!(!answer.data.is_empty());
        assert_eq!(answer.data, whole[at..at + answer.data.len()]);
    }
}

async fn imports_replace_and_repeat_harmlessly(store: &dyn BulkTransfer, fixture: &BulkFixture) {
    store.import(&[]).await.unwrap();
    store.import(&fixture.records).await.unwrap();
    for kind in RecordKind::ALL {
        assert_eq!(
            store.count(kind).await.unwrap(),
            fixture.of_kind(kind).len() as u64,
            "{kind}: imported twice, stored once"
        );
    }
    let Some(Record::Task(task)) = fixture
        .records
        .iter()
        .find(|r| r.kind() == RecordKind::Task)
    else {
        panic!("the fixture has tasks");
    };
    let mut changed = task.clone();
    changed.name = "renamed".into();
    changed.version += 3;
    store
        .import(&[Record::Task(changed.clone())])
        .await
        .unwrap();
    let found = store
        .fetch(RecordKind::Task, &[changed.id.to_string()])
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(
        found[0].record.as_ref().unwrap(),
        &Record::Task(changed),
        "stored as given, version and all"
    );
}

async fn log_imports_start_exactly_at_the_length(store: &dyn BulkTransfer, fixture: &BulkFixture) {
    let (&task, log) = fixture.log_of.iter().next().unwrap();
    let length = log.len() as u64;
    let piece = |task: TaskId, offset: u64, data: &[u8]| LogPiece {
        task,
        offset,
        data: data.to_vec(),
    };
    let conflict = |result: orchestrator_storage::Result<()>| match result {
        Err(Error::Conflict {
            expected, found, ..
        }) => (expected, found),
        other => panic!("expected Conflict: {other:?}"),
    };
    let overlapping = store
        .import_logs(&[piece(task, length - 1, b"again")])
        .await;
    assert_eq!(conflict(overlapping), (length - 1, length));
    let gap = store.import_logs(&[piece(fixture.quiet, 3, b"x")]).await;
    assert_eq!(conflict(gap), (3, 0));
    // A repeated import never writes a byte twice.
    assert!(store.import_logs(&fixture.logs).await.is_err());
    assert_eq!(
        store.log_lengths(&[task, fixture.quiet]).await.unwrap(),
        vec![length, 0],
        "nothing of a refused import is written"
    );
    store.import_logs(&[]).await.unwrap();
    store
        .import_logs(&[piece(task, length, b"more"), piece(task, length + 4, b"!")])
        .await
        .unwrap();
    assert_eq!(store.log_lengths(&[task]).await.unwrap(), vec![length + 5]);
    let mut grown = log.clone();
    grown.extend_from_slice(b"more!");
    assert_eq!(read_whole_log(store, task).await, grown);
}

/// What [`WebhookStore`] promises, on an empty store: subscriptions,
/// deliveries stored once per id, changed by compare-and-set, listed
/// newest first with filters, and pruned only when no longer pending.
pub async fn webhook_store_suite(store: &dyn WebhookStore) {
    let first = subscription("http://127.0.0.1:9/a");
    let second = subscription("http://127.0.0.1:9/b");
    store.insert_subscription(&first).await.unwrap();
    store.insert_subscription(&second).await.unwrap();
    assert!(matches!(
        store.insert_subscription(&first).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert_eq!(
        store.get_subscription(&first.id).await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(
        store.subscriptions().await.unwrap(),
        vec![first.clone(), second.clone()]
    );

    let now = Utc::now();
    let older = delivery("msg_older", &first, now - chrono::TimeDelta::seconds(10));
    let newer = delivery("msg_newer", &first, now);
    let other = delivery("msg_other", &second, now - chrono::TimeDelta::seconds(5));
    for d in [&older, &newer, &other] {
        assert!(store.insert_delivery(d).await.unwrap());
    }
    // A second node storing the same event's delivery stores nothing.
    let racing = join_all((0..4).map(|_| store.insert_delivery(&newer))).await;
    assert!(racing.into_iter().all(|created| !created.unwrap()));
    assert_eq!(
        store.get_delivery("msg_newer").await.unwrap(),
        Some(newer.clone())
    );

    let mut sent = newer.clone();
    sent.record(
        DeliveryAttempt {
            at: now,
            status_code: Some(500),
            error: Some("answered 500 \"oops\" ✓".into()),
            duration_ms: 12,
        },
        1,
        chrono::TimeDelta::seconds(1),
    );
    let stored = store.update_delivery(&sent).await.unwrap();
    assert_eq!(stored.version, sent.version + 1);
    assert_eq!(
        store.get_delivery("msg_newer").await.unwrap(),
        Some(stored.clone())
    );
    assert!(matches!(
        store.update_delivery(&sent).await,
        Err(Error::Conflict { .. })
    ));
    assert!(matches!(
        store
            .update_delivery(&delivery("msg_ghost", &first, now))
            .await,
        Err(Error::NotFound { .. })
    ));

    let ids = |page: orchestrator_storage::Page<Delivery>| {
        (
            page.items.into_iter().map(|d| d.id).collect::<Vec<_>>(),
            page.total,
        )
    };
    let all = DeliveryQuery {
        limit: 10,
        ..Default::default()
    };
    assert_eq!(
        ids(store.deliveries(&all).await.unwrap()),
        (
            vec!["msg_newer".into(), "msg_other".into(), "msg_older".into()],
            3
        )
    );
    let paged = DeliveryQuery {
        limit: 1,
        offset: 1,
        ..Default::default()
    };
    assert_eq!(
        ids(store.deliveries(&paged).await.unwrap()),
        (vec!["msg_other".into()], 3)
    );
    let of_first = DeliveryQuery {
        subscription: Some(first.id.clone()),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(
        ids(store.deliveries(&of_first).await.unwrap()),
        (vec!["msg_newer".into(), "msg_older".into()], 2)
    );
    let pending = DeliveryQuery {
        status: Some(DeliveryStatus::Pending),
        limit: 10,
        ..Default::default()
    };
    assert_eq!(
        ids(store.deliveries(&pending).await.unwrap()),
        (vec!["msg_other".into(), "msg_older".into()], 2)
    );

    // Pending deliveries stay: they are the outbox.
    let pruned = store
        .prune_deliveries(&["msg_newer".into(), "msg_older".into(), "msg_ghost".into()])
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    assert_eq!(store.get_delivery("msg_newer").await.unwrap(), None);
    assert!(store.get_delivery("msg_older").await.unwrap().is_some());

    assert!(store.delete_subscription(&first.id).await.unwrap());
    assert!(!store.delete_subscription(&first.id).await.unwrap());
    assert_eq!(store.get_subscription(&first.id).await.unwrap(), None);
    assert_eq!(store.subscriptions().await.unwrap(), vec![second]);
}

pub fn subscription(url: &str) -> Subscription {
    Subscription {
        id: uuid::Uuid::now_v7().to_string(),
        url: url.into(),
        events: vec!["workflow.failed".into(), "step.failed".into()],
        body_template: Some(json!({"text": "${event.summary} ✓"})),
        description: Some("ünïcode".into()),
        secret: Sealed {
            nonce: "bm9uY2U=".into(),
            ciphertext: "c2VhbGVk".into(),
        },
        // Stored to the microsecond or finer on every backend.
        created_at: Utc::now().with_nanosecond(0).unwrap(),
    }
}

pub fn delivery(id: &str, subscription: &Subscription, at: chrono::DateTime<Utc>) -> Delivery {
    Delivery::new(
        id.into(),
        subscription,
        "workflow.failed",
        r#"{"text":"workflow `x` failed ✓"}"#.into(),
        at.with_nanosecond(0).unwrap(),
    )
}
