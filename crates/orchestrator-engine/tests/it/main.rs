//! The engine against failing storage: a write that fails surfaces as an
//! error and loses nothing that was acknowledged.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

mod ambiguous;
mod events;
mod locks;
mod panics;
mod step_kinds;

use std::collections::HashMap;
use std::time::Duration;

use orchestrator_core::TaskStatus;
use orchestrator_core::template::Template;
use orchestrator_engine::templates::Templates;
use orchestrator_engine::{Engine, EngineConfig, Error, Meta, SubmitRequest, TemplateSource};
use orchestrator_executor::{ExecutorConfig, ScriptExecutor};
use orchestrator_storage::Storage;
use orchestrator_storage::faults::{FaultyBackend, TaskMove};
use orchestrator_storage::fs::{FsBackend, FsOptions};
use serde_json::{Value, json};

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("scripts")).unwrap();
        std::fs::write(
            dir.path().join("scripts/slow.sh"),
            "sleep 1\necho '{\"ok\": true}'\n",
        )
        .unwrap();
        // Notes that it ran, then ends at once.
        std::fs::write(
            dir.path().join("scripts/mark.sh"),
            "echo \"$ORCHESTRATOR_TASK_ID\" >> \"$ORCHESTRATOR_DATA_DIR/../ran.log\"\necho '{}'\n",
        )
        .unwrap();
        // Runs until the test creates `open` next to the data directory
        // (at most 60 s, so that a failing test cannot hang on it).
        std::fs::write(
            dir.path().join("scripts/gate.sh"),
            "for _ in $(seq 1200); do [ -e \"$ORCHESTRATOR_DATA_DIR/../open\" ] && break; sleep 0.05; done\necho '{}'\n",
        )
        .unwrap();
        Setup { dir }
    }

    fn open_gate(&self) {
        std::fs::write(self.dir.path().join("open"), "").unwrap();
    }

    fn ran(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("ran.log")).unwrap_or_default()
    }

    async fn engine(&self, store: Storage) -> Engine {
        self.engine_with_workers(store, 2).await
    }

    async fn engine_with_workers(&self, store: Storage, workers: usize) -> Engine {
        self.engine_with_config(store, |config| config.workers = workers)
            .await
    }

    async fn engine_with_config(
        &self,
        store: Storage,
        configure: impl FnOnce(&mut EngineConfig),
    ) -> Engine {
        let executor = ScriptExecutor::new(ExecutorConfig {
            scripts_dir: self.dir.path().join("scripts"),
            work_dir: self.dir.path().join("work"),
            data_dir: self.dir.path().join("data"),
            kill_grace: Duration::from_millis(200),
            interpreters: HashMap::new(),
            service_url: None,
            sandbox: orchestrator_executor::Sandbox::None,
        })
        .unwrap();
        let mut config = EngineConfig {
            workers: 2,
            ..EngineConfig::default()
        };
        configure(&mut config);
        Engine::start(store, executor, Templates::default(), config)
            .await
            .unwrap()
    }

    async fn fs(&self) -> Storage {
        Storage::new(
            FsBackend::open(&self.dir.path().join("data"), FsOptions::default())
                .await
                .unwrap(),
        )
    }
}

fn request() -> SubmitRequest {
    request_of(json!([{"ref_name": "slow", "script": "slow.sh"}]))
}

fn request_of(steps: Value) -> SubmitRequest {
    let template: Template = serde_json::from_value(json!({
        "name": "t", "ref_name": "t", "schema_version": 1,
        "steps": steps
    }))
    .unwrap();
    SubmitRequest {
        template: TemplateSource::Inline(Box::new(template)),
        vars: serde_json::Map::new(),
        meta: Meta::default(),
        start_at: None,
        check_mode: false,
        priority: Default::default(),
        max_attempts: Some(3),
        timeout: None,
        parallel_limit: None,
        idempotency_key: None,
        body: Value::Null,
    }
}

#[tokio::test]
async fn a_failed_submission_write_is_an_error_and_stores_nothing() {
    let setup = Setup::new();
    let (store, faults) = FaultyBackend::wrap(setup.fs().await);
    let engine = setup.engine(store.clone()).await;
    faults.fail_writes(true);
    let err = engine.submit(request()).await.unwrap_err();
    assert!(matches!(err, Error::Storage(_)), "{err}");
    assert!(err.to_string().contains("injected fault"), "{err}");
    faults.fail_writes(false);
    let all = engine
        .list_tasks(&orchestrator_storage::TaskQuery {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.total, 0, "nothing half-stored");
    // And the engine carries on once storage does.
    let (view, _) = engine.submit(request()).await.unwrap();
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(30))
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_failed_write_during_a_run_is_recovered_not_lost() {
    let setup = Setup::new();
    let id = {
        let (store, faults) = FaultyBackend::wrap(setup.fs().await);
        let engine = setup.engine(store).await;
        let (view, _) = engine.submit(request()).await.unwrap();
        let task_id = view.tasks[0].id;
        // Storage fails while the script runs: its outcome can not be stored.
        while engine.task(task_id).await.unwrap().status != TaskStatus::Running {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        faults.fail_writes(true);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // Nothing pretends the task finished.
        assert_eq!(
            engine.task(task_id).await.unwrap().status,
            TaskStatus::Running
        );
        assert!(
            !engine
                .wait_for_workflow(view.workflow.id, Duration::from_millis(100))
                .await
                .unwrap()
        );
        faults.fail_writes(false);
        engine.shutdown(Duration::from_secs(1)).await;
        view.workflow.id
    };
    // A new engine on the same data finds the task and runs it to the end.
    let engine = setup.engine(setup.fs().await).await;
    assert!(
        engine
            .wait_for_workflow(id, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let view = engine.workflow(id).await.unwrap();
    assert_eq!(view.tasks[0].status, TaskStatus::Completed);
    assert_eq!(
        view.tasks[0].attempts, 2,
        "the unrecorded attempt counts as interrupted"
    );
}

/// A worker is free as soon as its script exits: the next script starts
/// while the previous outcome is still on its way to storage.
#[tokio::test]
async fn the_next_script_starts_before_the_last_outcome_is_stored() {
    let setup = Setup::new();
    let (store, faults) = FaultyBackend::wrap(setup.fs().await);
    let engine = setup.engine_with_workers(store, 1).await;
    faults.hold_task_endings(true);
    let steps = json!([
        {"ref_name": "a", "script": "mark.sh"},
        {"ref_name": "b", "script": "mark.sh"}
    ]);
    let (view, _) = engine.submit(request_of(steps)).await.unwrap();
    let ran = setup.dir.path().join("ran.log");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let lines = loop {
        let lines = std::fs::read_to_string(&ran).unwrap_or_default();
        if lines.lines().count() == 2 {
            break lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "with one worker and the first outcome held back, only {lines:?} ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Both ran on the one worker, and neither outcome is stored yet.
    for task in &view.tasks {
        assert!(lines.contains(&task.id.to_string()), "{lines}");
        assert_eq!(
            engine.task(task.id).await.unwrap().status,
            TaskStatus::Running
        );
    }
    faults.hold_task_endings(false);
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(30))
            .await
            .unwrap()
    );
    for task in &view.tasks {
        assert_eq!(
            engine.task(task.id).await.unwrap().status,
            TaskStatus::Completed
        );
    }
    engine.shutdown(Duration::from_secs(5)).await;
}

/// The service dying during an attempt, again and again, is not the
/// script's failure: a task allowed one attempt survives three crashes of
/// the service, each during its attempt, and completes.
#[tokio::test]
async fn crashes_of_the_service_do_not_use_up_a_tasks_attempts() {
    let setup = Setup::new();
    let (workflow, task_id) = {
        let engine = setup.engine(setup.fs().await).await;
        let mut request = request_of(json!([{"ref_name": "a", "script": "mark.sh"}]));
        request.max_attempts = Some(1);
        // Not before an hour from now: nothing runs until a crash is staged.
        request.start_at = Some(chrono::Utc::now() + chrono::Duration::hours(1));
        let (view, _) = engine.submit(request).await.unwrap();
        engine.shutdown(Duration::from_secs(1)).await;
        (view.workflow.id, view.tasks[0].id)
    };
    for crash in 1..=3 {
        // What a service that died during the attempt leaves in storage:
        // the task claimed and running under its node.
        let store = setup.fs().await;
        let mut task = store.tasks().get_task(task_id).await.unwrap().unwrap();
        let now = chrono::Utc::now();
        task.start(now).unwrap();
        task.node = Some("local".into());
        task.lease_until = Some(now + chrono::Duration::seconds(15));
        store.tasks().update_task(&task).await.unwrap();
        store.close().await.unwrap();
        // The next start finds it and takes it over.
        let engine = setup.engine(setup.fs().await).await;
        let task = engine.task(task_id).await.unwrap();
        assert_eq!(
            (task.status, task.interruptions),
            (TaskStatus::RetryWaiting, crash),
            "crash {crash}: {:?}",
            task.error
        );
        engine.shutdown(Duration::from_secs(1)).await;
    }
    let engine = setup.engine(setup.fs().await).await;
    assert!(
        engine
            .wait_for_workflow(workflow, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let task = engine.task(task_id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed, "{:?}", task.error);
    assert_eq!(task.max_attempts, 1);
    assert_eq!((task.attempts, task.interruptions), (4, 3));
}

/// Waits until this engine's node has sent two heartbeats that began after
/// `since`. Heartbeats and lease checks take turns in one loop, so the
/// second heartbeat means a whole lease check ran in between.
async fn a_lease_check_after(engine: &Engine, since: chrono::DateTime<chrono::Utc>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no heartbeats: {seen:?}"
        );
        for (node, _) in engine.nodes().await.unwrap() {
            if node.last_seen > since && !seen.contains(&node.last_seen) {
                seen.push(node.last_seen);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An attempt is registered before its claim is stored. A lease check
/// that reads the task in between finds it still queued: that is a claim
/// on its way, not a task another node took over, and its step must run
/// as the one attempt it is.
#[tokio::test]
async fn a_claim_slow_to_store_is_not_taken_for_a_lost_lease() {
    let setup = Setup::new();
    let (store, faults) = FaultyBackend::wrap(setup.fs().await);
    // Lease checks every 100 ms.
    let engine = setup
        .engine_with_config(store, |config| config.lease = Duration::from_millis(300))
        .await;
    faults.hold(TaskMove::Claim, true);
    let (view, _) = engine
        .submit(request_of(json!([{"ref_name": "a", "script": "mark.sh"}])))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), faults.faulted(TaskMove::Claim, 1))
        .await
        .expect("the claim reaches the store");
    a_lease_check_after(&engine, chrono::Utc::now()).await;
    faults.hold(TaskMove::Claim, false);
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let task = engine.task(view.tasks[0].id).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed, "{:?}", task.error);
    assert_eq!(
        (task.attempts, task.interruptions, task.history.len()),
        (1, 0, 1),
        "one attempt, never interrupted: {:?}",
        task.history
    );
    assert_eq!(setup.ran().lines().count(), 1, "{}", setup.ran());
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Fails the writes that make `move_` until one has failed, checks that
/// the task at `stuck` (in `steps`) was left `left_as`, lets the writes
/// through, and waits until the same engine, not restarted, finishes the
/// workflow. The stuck task as it ended.
async fn finished_after_a_failed(
    move_: TaskMove,
    steps: Value,
    stuck: usize,
    left_as: TaskStatus,
) -> orchestrator_core::Task {
    let setup = Setup::new();
    let (store, faults) = FaultyBackend::wrap(setup.fs().await);
    let engine = setup.engine(store).await;
    faults.fail(move_, true);
    let (view, _) = engine.submit(request_of(steps)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), faults.faulted(move_, 1))
        .await
        .unwrap_or_else(|_| panic!("no {move_:?} reached the store"));
    let id = view.tasks[stuck].id;
    assert_eq!(engine.task(id).await.unwrap().status, left_as);
    faults.fail(move_, false);
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(30))
            .await
            .unwrap(),
        "the task stayed {left_as} after its {move_:?} failed"
    );
    let task = engine.task(id).await.unwrap();
    engine.shutdown(Duration::from_secs(5)).await;
    task
}

/// A claim that storage refuses leaves the task queued in the store; on
/// a store of one node nothing else would offer it again before a
/// restart, so the engine tries it again itself.
#[tokio::test]
async fn a_claim_that_could_not_be_stored_is_tried_again() {
    let steps = json!([{"ref_name": "a", "script": "mark.sh"}]);
    let task = finished_after_a_failed(TaskMove::Claim, steps, 0, TaskStatus::Queued).await;
    assert_eq!(task.status, TaskStatus::Completed, "{:?}", task.error);
    assert_eq!(task.attempts, 1);
}

/// A follow-up that storage refuses (the next step cannot be released)
/// leaves the workflow with nothing queued; on a store of one node nothing
/// else would advance it before a restart, so the engine does, later.
#[tokio::test]
async fn a_follow_up_that_could_not_be_stored_is_tried_again() {
    let steps = json!([
        {"ref_name": "a", "script": "mark.sh"},
        {"ref_name": "b", "script": "mark.sh", "depends_on": ["a"]}
    ]);
    let b = finished_after_a_failed(TaskMove::Release, steps, 1, TaskStatus::Pending).await;
    assert_eq!(b.status, TaskStatus::Completed, "{:?}", b.error);
}

/// Waits until the task is running, for at most 30 s.
async fn until_running(engine: &Engine, task: orchestrator_core::TaskId) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while engine.task(task).await.unwrap().status != TaskStatus::Running {
        assert!(
            tokio::time::Instant::now() < deadline,
            "task {task} never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// On a shared store another node may end tasks of a workflow this node
/// follows. The engine keeps only an index of the workflow in memory, not
/// a count of what it saw end: a task ended elsewhere still counts
/// towards the workflow's end.
#[tokio::test]
async fn a_step_ended_by_another_node_counts_towards_the_workflows_end() {
    let setup = Setup::new();
    let store = setup.fs().await;
    let engine = setup.engine_with_workers(store.clone(), 1).await;
    let steps = json!([
        {"ref_name": "a", "script": "mark.sh"},
        {"ref_name": "gate", "script": "gate.sh", "depends_on": ["a"]},
        {"ref_name": "c", "script": "mark.sh", "depends_on": ["a"]}
    ]);
    let (view, _) = engine.submit(request_of(steps)).await.unwrap();
    let (a, gate, c) = (view.tasks[0].id, view.tasks[1].id, view.tasks[2].id);
    // The one worker runs the gate; c waits in this node's queue.
    until_running(&engine, gate).await;
    // Another node claims c and completes it, straight in the store.
    let mut task = store.tasks().get_task(c).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued);
    let now = chrono::Utc::now();
    task.start(now).unwrap();
    task.node = Some("other-node".into());
    task.complete(json!({"by": "other-node"}), now).unwrap();
    store.tasks().update_task(&task).await.unwrap();
    setup.open_gate();
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let view = engine.workflow(view.workflow.id).await.unwrap();
    assert_eq!(
        view.workflow.status,
        orchestrator_core::WorkflowStatus::Completed
    );
    let c_task = engine.task(c).await.unwrap();
    assert_eq!(c_task.output, Some(json!({"by": "other-node"})));
    let ran = setup.ran();
    assert!(ran.contains(&a.to_string()), "{ran}");
    assert!(!ran.contains(&c.to_string()), "c ran here too: {ran}");
    engine.shutdown(Duration::from_secs(5)).await;
}

/// What the engine keeps in memory to follow a workflow is rebuilt from
/// the store: a chain interrupted by a restart half-way runs to its end,
/// each step after the one it depends on.
#[tokio::test]
async fn a_chain_interrupted_by_a_restart_runs_to_its_end_in_order() {
    let setup = Setup::new();
    let steps = json!([
        {"ref_name": "a", "script": "mark.sh"},
        {"ref_name": "gate", "script": "gate.sh", "depends_on": ["a"]},
        {"ref_name": "c", "script": "mark.sh", "depends_on": ["gate"]},
        {"ref_name": "d", "script": "mark.sh", "depends_on": ["c"]},
        {"ref_name": "e", "script": "mark.sh", "depends_on": ["c", "d"]}
    ]);
    let view = {
        let engine = setup.engine(setup.fs().await).await;
        let (view, _) = engine.submit(request_of(steps)).await.unwrap();
        until_running(&engine, view.tasks[1].id).await;
        // The gate is interrupted by the shutdown and goes back to the queue.
        engine.shutdown(Duration::from_millis(100)).await;
        view
    };
    setup.open_gate();
    let engine = setup.engine(setup.fs().await).await;
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let done = engine.workflow(view.workflow.id).await.unwrap();
    assert_eq!(
        done.workflow.status,
        orchestrator_core::WorkflowStatus::Completed
    );
    let ran = setup.ran();
    let position = |i: usize| {
        ran.find(&view.tasks[i].id.to_string())
            .unwrap_or_else(|| panic!("step {i} did not run: {ran}"))
    };
    assert!(position(0) < position(2) && position(2) < position(3) && position(3) < position(4));
    engine.shutdown(Duration::from_secs(5)).await;
}
