//! The storage conformance suite: everything the [`Backend`] trait promises,
//! written once against `Storage` and run for each backend.

use std::collections::HashSet;
use std::time::Duration;

use chrono::Utc;
use orchestrator_core::access::{ApiToken, AuditRecord, Role, SecretRecord};
use orchestrator_core::{
    Priority, Task, TaskSpec, TaskStatus, Workflow, WorkflowId, WorkflowStatus,
};
use orchestrator_storage::{AuditQuery, Error, Storage, TaskQuery, WorkflowQuery};
use serde_json::json;

/// A workflow's tasks as owned records, to compare with what was stored.
pub async fn workflow_tasks(store: &Storage, id: orchestrator_core::WorkflowId) -> Vec<Task> {
    store
        .tasks()
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

/// Opens a fresh, empty store and the means to reopen it on the same data.
pub trait Harness {
    async fn open(&self) -> Storage;
}

pub async fn suite(harness: &impl Harness) {
    insert_and_read_back(&harness.open().await).await;
    compare_and_set_updates(&harness.open().await).await;
    concurrent_claims_hand_out_each_task_once(&harness.open().await).await;
    listing_orders_filters_and_pages(&harness.open().await).await;
    large_and_unicode_payloads(&harness.open().await).await;
    logs_append_and_read_from_offsets(&harness.open().await).await;
    log_appends_return_the_new_length(&harness.open().await).await;
    duplicate_inserts_are_refused(&harness.open().await).await;
    workflows_update_by_compare_and_set_and_grow_atomically(&harness.open().await).await;
    idempotency_keys_and_revisions_are_unique(&harness.open().await).await;
    workflows_filter_by_every_field(&harness.open().await).await;
    heartbeats_keep_the_latest_per_node(&harness.open().await).await;
    tokens_secrets_and_audit_records(&harness.open().await).await;
    racing_workflow_updates_win_or_conflict(&harness.open().await).await;
}

/// Many writers on one workflow at once, as when several steps finish
/// together: each write either lands or is told `Conflict` (and re-reads);
/// none fails for any other reason, and none is lost.
async fn racing_workflow_updates_win_or_conflict(store: &Storage) {
    let (workflow, tasks) = workflow_with_tasks(1);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let writers: Vec<_> = (0..8)
        .map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                for round in 0..5 {
                    loop {
                        let mut current = store
                            .tasks()
                            .get_workflow(workflow.id)
                            .await
                            .unwrap()
                            .unwrap();
                        current.description = Some(format!("writer {writer} round {round}"));
                        match store.tasks().update_workflow(&current, &[]).await {
                            Ok(_) => break,
                            Err(Error::Conflict { .. }) => continue,
                            Err(e) => panic!("writer {writer}: {e}"),
                        }
                    }
                }
            })
        })
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let stored = store
        .tasks()
        .get_workflow(workflow.id)
        .await
        .unwrap()
        .unwrap();
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
    }
}

async fn tokens_secrets_and_audit_records(store: &Storage) {
    let now = Utc::now();
    let token = ApiToken::new(
        "0190aa".into(),
        "ci".into(),
        Role::Operator,
        "orch_0190aa_x",
        now,
    );
    store.access().put_token(&token).await.unwrap();
    let mut revoked = token.clone();
    revoked.revoked_at = Some(now);
    revoked.version += 1;
    store.access().put_token(&revoked).await.unwrap();
    let other = ApiToken::new(
        "0190bb".into(),
        "ops".into(),
        Role::Admin,
        "orch_0190bb_y",
        now,
    );
    store.access().put_token(&other).await.unwrap();
    assert_eq!(store.access().tokens().await.unwrap(), vec![revoked, other]);

    let secret = SecretRecord {
        name: "db.password".into(),
        nonce: "bm9uY2U=".into(),
        ciphertext: "Y2lwaGVy".into(),
        created_at: now,
        updated_at: now,
        version: 0,
    };
    store.access().put_secret(&secret).await.unwrap();
    let mut changed = secret.clone();
    changed.ciphertext = "b3RoZXI=".into();
    changed.version = 1;
    store.access().put_secret(&changed).await.unwrap();
    assert_eq!(store.access().secrets().await.unwrap(), vec![changed]);
    assert!(store.access().delete_secret("db.password").await.unwrap());
    assert!(!store.access().delete_secret("db.password").await.unwrap());
    assert!(store.access().secrets().await.unwrap().is_empty());

    let early = now - chrono::Duration::seconds(60);
    let records = [
        audit_record("ci", "workflow.submit", Some("w1"), early),
        audit_record("ci", "task.cancel", Some("t1"), now),
        audit_record("ops", "token.create", Some("0190bb"), now),
    ];
    for record in &records {
        store.access().append_audit(record).await.unwrap();
    }
    let list = |query: AuditQuery| async move {
        let query = AuditQuery {
            limit: if query.limit == 0 { 10 } else { query.limit },
            ..query
        };
        let page = store.access().list_audit(&query).await.unwrap();
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
        .access()
        .list_audit(&AuditQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(stored.items[2], records[0], "stored as given");
}

async fn heartbeats_keep_the_latest_per_node(store: &Storage) {
    let started = Utc::now();
    let node = |id: &str, seconds: i64| orchestrator_core::Node {
        id: id.to_owned(),
        address: format!("http://{id}:8080"),
        started_at: started,
        last_seen: started + chrono::Duration::seconds(seconds),
    };
    store.nodes().heartbeat(&node("node-a", 0)).await.unwrap();
    store.nodes().heartbeat(&node("node-b", 1)).await.unwrap();
    store.nodes().heartbeat(&node("node-a", 5)).await.unwrap();
    let mut nodes = store.nodes().nodes().await.unwrap();
    nodes.retain(|n| n.id == "node-a" || n.id == "node-b");
    nodes.sort_by(|x, y| x.id.cmp(&y.id));
    assert_eq!(nodes, vec![node("node-a", 5), node("node-b", 1)]);
}

async fn insert_and_read_back(store: &Storage) {
    let (workflow, tasks) = workflow_with_tasks(3);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    assert_eq!(
        store.tasks().get_workflow(workflow.id).await.unwrap(),
        Some(workflow.clone())
    );
    for task in &tasks {
        assert_eq!(
            store.tasks().get_task(task.id).await.unwrap().as_ref(),
            Some(task)
        );
    }
    assert_eq!(workflow_tasks(store, workflow.id).await, tasks);
    assert_eq!(store.tasks().unfinished_tasks().await.unwrap(), tasks);
    assert_eq!(
        store
            .tasks()
            .get_task(orchestrator_core::TaskId::new())
            .await
            .unwrap(),
        None
    );
}

async fn compare_and_set_updates(store: &Storage) {
    let (workflow, tasks) = workflow_with_tasks(1);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let mut task = tasks[0].clone();
    task.start(Utc::now()).unwrap();
    let stored = store.tasks().update_task(&task).await.unwrap();
    assert_eq!(stored.version, task.version + 1);
    assert_eq!(stored.status, TaskStatus::Running);

    // The same stale copy can not be written twice.
    let err = store.tasks().update_task(&task).await.unwrap_err();
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
    let done = store.tasks().update_task(&next).await.unwrap();
    assert_eq!(store.tasks().get_task(task.id).await.unwrap(), Some(done));
    assert!(store.tasks().unfinished_tasks().await.unwrap().is_empty());

    let (_, strangers) = workflow_with_tasks(1);
    assert!(matches!(
        store.tasks().update_task(&strangers[0]).await,
        Err(Error::TaskNotFound(_))
    ));
}

async fn concurrent_claims_hand_out_each_task_once(store: &Storage) {
    let (workflow, tasks) = workflow_with_tasks(20);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    // Eight claimers race for every task; each claim is a CAS from the
    // version they read.
    let mut handles = Vec::new();
    for _ in 0..8 {
        let store = store.clone();
        let tasks = tasks.clone();
        handles.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for task in tasks {
                let mut claim = task.clone();
                claim.start(Utc::now()).unwrap();
                if store.tasks().update_task(&claim).await.is_ok() {
                    won.push(task.id);
                }
            }
            won
        }));
    }
    let mut winners = Vec::new();
    for handle in handles {
        winners.extend(handle.await.unwrap());
    }
    let unique: HashSet<_> = winners.iter().collect();
    assert_eq!(winners.len(), 20, "every task claimed exactly once");
    assert_eq!(unique.len(), 20);
}

async fn listing_orders_filters_and_pages(store: &Storage) {
    let (workflow_a, tasks_a) = workflow_with_tasks(5);
    let (workflow_b, tasks_b) = workflow_with_tasks(4);
    store
        .tasks()
        .insert_workflow(&workflow_a, &tasks_a)
        .await
        .unwrap();
    store
        .tasks()
        .insert_workflow(&workflow_b, &tasks_b)
        .await
        .unwrap();
    let mut running = tasks_b[1].clone();
    running.start(Utc::now()).unwrap();
    store.tasks().update_task(&running).await.unwrap();

    let all = store
        .tasks()
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
        .tasks()
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
        .tasks()
        .list_tasks(&TaskQuery {
            workflow: Some(workflow_b.id),
            status: Some(TaskStatus::Running),
            limit: 10,
            offset: 0,
        })
        .await
        .unwrap();
    assert_eq!(running_in_b.total, 1);
    assert_eq!(running_in_b.items[0].id, running.id);

    let queued = store
        .tasks()
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
        .tasks()
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
        .tasks()
        .list_workflows(&WorkflowQuery {
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(workflows.items[0].id, workflow_b.id);
}

async fn large_and_unicode_payloads(store: &Storage) {
    let (workflow, mut tasks) = workflow_with_tasks(1);
    let big = "ü—🚀".repeat(100_000);
    tasks[0].input = json!({"blob": big, "nested": {"list": [1, 2.5, null, "x"]}});
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let read = store.tasks().get_task(tasks[0].id).await.unwrap().unwrap();
    assert_eq!(read.input, tasks[0].input);
}

async fn logs_append_and_read_from_offsets(store: &Storage) {
    let (workflow, tasks) = workflow_with_tasks(1);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let id = tasks[0].id;
    let empty = store.tasks().read_log(id, 0, 1024).await.unwrap();
    assert!(empty.data.is_empty());
    store
        .tasks()
        .append_log(id, "line one ✓\n".as_bytes())
        .await
        .unwrap();
    store.tasks().append_log(id, b"line two\n").await.unwrap();
    let all = store.tasks().read_log(id, 0, 1 << 20).await.unwrap();
    assert_eq!(
        String::from_utf8(all.data).unwrap(),
        "line one ✓\nline two\n"
    );
    let tail = store
        .tasks()
        .read_log(id, all.next_offset - 9, 1 << 20)
        .await
        .unwrap();
    assert_eq!(tail.data, b"line two\n");
    assert_eq!(tail.next_offset, all.next_offset);
    let limited = store.tasks().read_log(id, 0, 4).await.unwrap();
    assert_eq!(limited.data, b"line");
    assert_eq!(limited.next_offset, 4);
}

async fn log_appends_return_the_new_length(store: &Storage) {
    let (workflow, tasks) = workflow_with_tasks(2);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let (id, other) = (tasks[0].id, tasks[1].id);
    let log = store.tasks();
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
    let appends: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.tasks().append_log(id, b"0123456789").await })
        })
        .collect();
    let mut lengths = Vec::new();
    for append in appends {
        lengths.push(append.await.unwrap().unwrap());
    }
    lengths.sort_unstable();
    assert_eq!(lengths, (1..=8).map(|n| 10 + 10 * n).collect::<Vec<u64>>());
    let all = log.read_log(id, 0, 1 << 20).await.unwrap();
    assert_eq!(all.next_offset, 90);
    assert_eq!(
        store.transfer().log_lengths(&[id, other]).await.unwrap(),
        vec![90, 1]
    );
}

async fn duplicate_inserts_are_refused(store: &Storage) {
    let (workflow, tasks) = workflow_with_tasks(2);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let err = store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap_err();
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

async fn workflows_update_by_compare_and_set_and_grow_atomically(store: &Storage) {
    let (mut workflow, tasks) = workflow_with_tasks(1);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
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
    let stored = store
        .tasks()
        .update_workflow(&workflow, &extra)
        .await
        .unwrap();
    assert_eq!(stored.version, 1);
    assert_eq!(
        store.tasks().get_workflow(workflow.id).await.unwrap(),
        Some(stored.clone())
    );
    assert_eq!(
        store
            .tasks()
            .workflow_tasks(workflow.id)
            .await
            .unwrap()
            .len(),
        3
    );

    // A stale version is refused and adds nothing.
    let (_, more) = workflow_with_tasks(1);
    let err = store
        .tasks()
        .update_workflow(&workflow, &more)
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
    assert_eq!(store.tasks().get_task(more[0].id).await.unwrap(), None);

    let (stranger, _) = workflow_with_tasks(0);
    assert!(matches!(
        store.tasks().update_workflow(&stranger, &[]).await,
        Err(Error::WorkflowNotFound(_))
    ));
}

async fn idempotency_keys_and_revisions_are_unique(store: &Storage) {
    let key = format!("key-{}", WorkflowId::new());
    let (mut first, tasks) = workflow_with_tasks(1);
    first.idempotency_key = Some(key.clone());
    store.tasks().insert_workflow(&first, &tasks).await.unwrap();
    let (mut second, tasks) = workflow_with_tasks(1);
    second.idempotency_key = Some(key.clone());
    let err = store
        .tasks()
        .insert_workflow(&second, &tasks)
        .await
        .unwrap_err();
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
        store.tasks().get_task(tasks[0].id).await.unwrap(),
        None,
        "nothing of a refused insert is kept"
    );
    let found = store
        .tasks()
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
    store.tasks().insert_workflow(&one, &tasks).await.unwrap();
    let (mut clash, tasks) = workflow_with_tasks(1);
    clash.reference = Some(reference.clone());
    let err = store
        .tasks()
        .insert_workflow(&clash, &tasks)
        .await
        .unwrap_err();
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
    store.tasks().insert_workflow(&clash, &tasks).await.unwrap();
    let revisions = store
        .tasks()
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

async fn workflows_filter_by_every_field(store: &Storage) {
    let trace = format!("trace-{}", WorkflowId::new());
    let kind = format!("kind-{}", WorkflowId::new());
    let (mut a, tasks_a) = workflow_with_tasks(1);
    a.trace_id = Some(trace.clone());
    a.kind = kind.clone();
    store.tasks().insert_workflow(&a, &tasks_a).await.unwrap();
    let (mut b, tasks_b) = workflow_with_tasks(1);
    b.kind = kind.clone();
    b.status = WorkflowStatus::Completed;
    store.tasks().insert_workflow(&b, &tasks_b).await.unwrap();

    let query = |q: WorkflowQuery| async move {
        store
            .tasks()
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
        .tasks()
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
