//! The change feed of a shared SurrealDB server: two `Storage` handles on
//! one database stand for two nodes; what one commits, the other's feed
//! delivers, each change once, and a feed that broke says so.
//!
//! The server does not keep the order of notifications of separate
//! transactions (each commit's are flushed by a task of their own), so the
//! tests order changes as a reader must: by `version` (tasks, workflows)
//! and `length` (logs).

use std::time::{Duration, Instant};

use chrono::Utc;
use orchestrator_core::{TaskId, WorkflowStatus};
use orchestrator_storage::{Change, ChangeFeed, Error, Storage, StorageConfig};

use crate::conformance::workflow_with_tasks;
use crate::dev_server::DevServer;
use crate::surreal::server_config;

async fn open(config: &StorageConfig) -> Storage {
    orchestrator_storage::open(config).await.unwrap()
}

/// A feed from `store` that follows the server already.
async fn following(store: &Storage) -> ChangeFeed {
    let mut feed = store.nodes().changes().expect("a server has a feed");
    let followed = tokio::time::timeout(Duration::from_secs(20), feed.following()).await;
    assert_eq!(followed.ok(), Some(true), "the feed never followed");
    feed
}

/// The next change, within a deadline.
async fn next(feed: &mut ChangeFeed) -> Change {
    tokio::time::timeout(Duration::from_secs(20), feed.recv())
        .await
        .expect("no change within 20 s")
        .expect("the feed ended")
}

/// What a change says, short enough to compare in order.
#[derive(Debug, PartialEq)]
enum Seen {
    Task(TaskId, bool, u64),
    Workflow(bool, u64, WorkflowStatus),
    Log(TaskId, u64),
    Lost,
}

fn seen(change: Change) -> Seen {
    match change {
        Change::Task { created, task } => Seen::Task(task.id, created, task.version),
        Change::Workflow { created, workflow } => {
            Seen::Workflow(created, workflow.version, workflow.status)
        }
        Change::Log { task, length } => Seen::Log(task, length),
        Change::Lost { .. } => Seen::Lost,
    }
}

#[tokio::test]
async fn a_feed_delivers_each_change_another_node_commits_once_with_what_orders_it() {
    let server = DevServer::start_memory();
    let config = server_config(&server);
    let (a, b) = (open(&config).await, open(&config).await);
    let mut feed = following(&b).await;

    let (workflow, tasks) = workflow_with_tasks(2);
    a.tasks().insert_workflow(&workflow, &tasks).await.unwrap();
    let mut claim = tasks[0].clone();
    claim.start(Utc::now()).unwrap();
    let claimed = a.tasks().update_task(&claim).await.unwrap();
    assert_eq!(
        a.tasks().append_log(tasks[0].id, b"hello").await.unwrap(),
        5
    );
    let mut running = workflow.clone();
    running.status = WorkflowStatus::Running;
    a.tasks().update_workflow(&running, &[]).await.unwrap();
    let mut done = claimed.clone();
    done.complete(serde_json::json!({"ok": true}), Utc::now())
        .unwrap();
    a.tasks().update_task(&done).await.unwrap();
    assert_eq!(
        a.tasks().append_log(tasks[0].id, b" world").await.unwrap(),
        11
    );
    assert_eq!(a.tasks().append_log(tasks[1].id, b"!").await.unwrap(), 1);

    let (mut task_changes, mut workflow_changes, mut log_changes) = (vec![], vec![], vec![]);
    while task_changes.len() < 4 || workflow_changes.len() < 2 || log_changes.len() < 3 {
        match seen(next(&mut feed).await) {
            s @ Seen::Task(..) => task_changes.push(s),
            s @ Seen::Workflow(..) => workflow_changes.push(s),
            s @ Seen::Log(..) => log_changes.push(s),
            Seen::Lost => panic!("nothing was lost"),
        }
    }
    let (t0, t1) = (tasks[0].id, tasks[1].id);
    // In the order of each record's versions and each log's lengths.
    let order = |s: &Seen| match s {
        Seen::Task(id, _, version) => (Some(*id), *version),
        Seen::Workflow(_, version, _) => (None, *version),
        Seen::Log(id, length) => (Some(*id), *length),
        Seen::Lost => (None, 0),
    };
    for changes in [&mut task_changes, &mut workflow_changes, &mut log_changes] {
        changes.sort_by_key(order);
    }
    let mut expected_tasks = vec![
        Seen::Task(t0, true, 0),
        Seen::Task(t0, false, 1),
        Seen::Task(t0, false, 2),
        Seen::Task(t1, true, 0),
    ];
    expected_tasks.sort_by_key(order);
    assert_eq!(task_changes, expected_tasks);
    assert_eq!(
        workflow_changes,
        vec![
            Seen::Workflow(true, 0, WorkflowStatus::Queued),
            Seen::Workflow(false, 1, WorkflowStatus::Running),
        ]
    );
    let mut expected_logs = vec![Seen::Log(t0, 5), Seen::Log(t0, 11), Seen::Log(t1, 1)];
    expected_logs.sort_by_key(order);
    assert_eq!(log_changes, expected_logs);
    // Nothing more: each change came once.
    let more = tokio::time::timeout(Duration::from_millis(500), feed.recv()).await;
    assert!(more.is_err(), "{more:?}");

    // A second feed is a feed of its own; closing the store ends both.
    let mut other = following(&b).await;
    a.tasks().append_log(t1, b"?").await.unwrap();
    assert_eq!(seen(next(&mut other).await), Seen::Log(t1, 2));
    assert_eq!(seen(next(&mut feed).await), Seen::Log(t1, 2));
    b.close().await.unwrap();
    for feed in [&mut feed, &mut other] {
        let end = tokio::time::timeout(Duration::from_secs(10), feed.recv()).await;
        assert_eq!(end.ok(), Some(None), "a closed store's feed ends");
    }
    // A feed asked for after the close ends at once.
    let mut late = b.nodes().changes().unwrap();
    let end = tokio::time::timeout(Duration::from_millis(100), late.recv()).await;
    assert_eq!(end.ok(), Some(None));
    a.close().await.unwrap();
}

#[tokio::test]
async fn a_reader_that_falls_behind_gets_one_lost_and_then_the_changes_after_it() {
    let server = DevServer::start_memory();
    let config = server_config(&server);
    let (a, b) = (open(&config).await, open(&config).await);
    let mut feed = following(&b).await;
    let (workflow, tasks) = workflow_with_tasks(1);
    a.tasks().insert_workflow(&workflow, &tasks).await.unwrap();
    // More changes than the feed holds, none of them read meanwhile.
    let id = tasks[0].id;
    let appends = 1100u64;
    for _ in 0..appends {
        a.tasks().append_log(id, b"x").await.unwrap();
    }
    // The feed holds what it had room for, then says one gap...
    let mut lengths = Vec::new();
    loop {
        match seen(next(&mut feed).await) {
            Seen::Log(_, length) => lengths.push(length),
            Seen::Lost => break,
            _ => {}
        }
    }
    assert!(!lengths.is_empty() && lengths.len() < appends as usize);
    let received = lengths.len();
    lengths.sort_unstable();
    lengths.dedup();
    assert_eq!(lengths.len(), received, "each at most once");
    // ...and goes on with what comes after it.
    a.tasks().append_log(id, b"y").await.unwrap();
    loop {
        match seen(next(&mut feed).await) {
            Seen::Log(_, length) if length == appends + 1 => break,
            Seen::Log(_, length) => assert!(length <= appends, "{length}"),
            other => panic!("one Lost for the one gap, then {other:?}"),
        }
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test]
async fn a_feed_cut_off_by_a_server_restart_says_lost_and_follows_again() {
    let data = tempfile::tempdir().unwrap();
    let mut server = DevServer::start_persistent(data.path());
    let mut config = server_config(&server);
    config.surrealdb.request_timeout = Duration::from_secs(2);
    let (a, b) = (open(&config).await, open(&config).await);
    let mut feed = following(&b).await;
    let (workflow, tasks) = workflow_with_tasks(1);
    a.tasks().insert_workflow(&workflow, &tasks).await.unwrap();
    assert!(matches!(
        seen(next(&mut feed).await),
        Seen::Workflow(..) | Seen::Task(..)
    ));

    server.kill();
    server.restart();
    // The feed re-subscribes on its own, then says what happened.
    loop {
        match next(&mut feed).await {
            Change::Lost { reason } => {
                assert!(reason.contains(&config.surrealdb.url), "{reason}");
                break;
            }
            // What was committed before the cut may still arrive.
            Change::Task { .. } | Change::Workflow { .. } => {}
            other => panic!("{other:?}"),
        }
    }
    assert!(feed.following().await);
    // And it follows again: a write made once `a` is back is seen.
    let id = tasks[0].id;
    let deadline = Instant::now() + Duration::from_secs(30);
    let length = loop {
        match a.tasks().append_log(id, b"after").await {
            Ok(length) => break length,
            Err(Error::Unavailable(e)) if Instant::now() < deadline => {
                eprintln!("waiting for the server: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    loop {
        match seen(next(&mut feed).await) {
            Seen::Log(task, at) if task == id && at == length => break,
            Seen::Log(..) | Seen::Lost => {}
            other => panic!("{other:?}"),
        }
    }
    a.close().await.unwrap();
    b.close().await.unwrap();
}

#[tokio::test]
async fn a_dropped_feed_ends_its_live_queries() {
    let server = DevServer::start_memory();
    let config = server_config(&server);
    let store = open(&config).await;
    let db = crate::surreal::raw(&config).await;
    let lives = || async {
        let mut response = db.query("INFO FOR TABLE task").await.unwrap();
        let info: Option<serde_json::Value> = response.take(0).unwrap();
        info.and_then(|i| i["lives"].as_object().map(|l| l.len()))
            .unwrap_or(0)
    };
    assert_eq!(lives().await, 0);
    let feed = following(&store).await;
    assert_eq!(lives().await, 1);
    drop(feed);
    let deadline = Instant::now() + Duration::from_secs(10);
    while lives().await != 0 {
        assert!(
            Instant::now() < deadline,
            "the live query outlived its feed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    store.close().await.unwrap();
}

/// One transaction of many records floods the feed: the server closes a
/// connection whose queue of notifications fills (100 by default), however
/// fast the client reads. The feed has a connection of its own, so only
/// the feed breaks: the store's requests, in flight and after, go on, and
/// the feed follows again, says what it lost, and delivers what comes next.
#[tokio::test]
async fn a_burst_of_changes_breaks_at_most_the_feed_never_the_stores_requests() {
    let server = DevServer::start_memory();
    let mut config = server_config(&server);
    // 600 records: six times the server's queue, in one transaction, so
    // the feed surely breaks; more only makes a debug server slower (1,500
    // once took over a minute on a loaded machine).
    config.surrealdb.request_timeout = Duration::from_secs(60);
    let store = open(&config).await;
    let mut feed = following(&store).await;

    let (workflow, tasks) = workflow_with_tasks(600);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .expect("the insert that floods the feed");
    // Requests right after the burst, while the server may be closing the
    // feed's connection: every one is answered.
    for task in tasks.iter().step_by(100) {
        assert!(store.tasks().get_task(task.id).await.unwrap().is_some());
    }
    let mut claim = tasks[0].clone();
    claim.start(Utc::now()).unwrap();
    let claimed = store.tasks().update_task(&claim).await.unwrap();

    // The feed delivers the claim: after every create, or after saying it
    // lost some of them and following again.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut creates = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the claim never came ({creates} creates)"
        );
        match seen(next(&mut feed).await) {
            // (Notifications of separate transactions keep no order, so
            // the claim may overtake some creates.)
            Seen::Task(id, false, version) if id == claimed.id && version == claimed.version => {
                return;
            }
            Seen::Task(_, true, _) => creates += 1,
            Seen::Lost => {
                eprintln!("the feed lost changes after {creates} creates, and followed again");
                // The claim may have been among what it lost: a write now
                // must come through the feed that follows again.
                let mut again = store.tasks().get_task(claimed.id).await.unwrap().unwrap();
                again.updated_at = Utc::now();
                let again = store.tasks().update_task(&again).await.unwrap();
                return expect_version(&mut feed, claimed.id, again.version, deadline).await;
            }
            _ => {}
        }
    }
}

/// Reads the feed until it shows `task` at `version`.
async fn expect_version(feed: &mut ChangeFeed, task: TaskId, version: u64, deadline: Instant) {
    loop {
        assert!(
            Instant::now() < deadline,
            "version {version} of {task} never came"
        );
        if let Seen::Task(id, _, v) = seen(next(feed).await)
            && id == task
            && v >= version
        {
            return;
        }
    }
}
