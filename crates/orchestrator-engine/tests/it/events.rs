//! Events: every transition of a real workflow is announced, in order,
//! and only once its write is durable; a subscriber that stalls costs
//! bounded memory and is told to resync.

use std::sync::Arc;
use std::time::Duration;

use orchestrator_core::event::{AttemptOutcome, Event, EventKind};
use orchestrator_core::{TaskId, WorkflowId};
use orchestrator_engine::events::Subscription;
use orchestrator_storage::faults::FaultyBackend;
use orchestrator_storage::{Record, RecordKind, TransferStore};

use serde_json::json;

use super::{Setup, request_of};

impl Setup {
    fn script(&self, name: &str, body: &str) {
        std::fs::write(self.dir.path().join("scripts").join(name), body).unwrap();
    }

    /// The store as its files on disk say, read by a second, independent
    /// reader: what is there survived, whatever the service holds in memory.
    async fn on_disk(&self) -> TransferStore {
        orchestrator_storage::open_read_only(&orchestrator_storage::StorageConfig {
            storage_type: orchestrator_storage::StorageType::Filesystem,
            data_dir: self.dir.path().join("data"),
            surrealdb: Default::default(),
        })
        .await
        .unwrap()
    }
}

/// The record an event is about, as it is on disk right now.
async fn on_disk(setup: &Setup, event: &Event) -> Option<Record> {
    let (kind, key) = match event.task_id {
        Some(task) => (RecordKind::Task, task.to_string()),
        None => (RecordKind::Workflow, event.workflow_id?.to_string()),
    };
    let found = setup.on_disk().await.fetch(kind, &[key]).await.unwrap();
    found.into_iter().next()?.record.ok()
}

/// Whether the change an event announces is on disk. Later changes may
/// have landed since, but never an earlier state: terminal statuses are
/// there exactly, attempts at least as far as announced.
fn shows(record: &Record, event: &Event) -> bool {
    let terminal = matches!(
        event.status.as_deref(),
        Some("completed" | "failed" | "cancelled" | "skipped" | "not_started")
    );
    match record {
        Record::Task(task) => {
            (!terminal || Some(task.status.as_str()) == event.status.as_deref())
                && event.attempt.is_none_or(|a| {
                    // A retry announces the attempt to come.
                    let announced = if event.kind == EventKind::RetryScheduled {
                        a - 1
                    } else {
                        a
                    };
                    task.attempts >= announced
                })
        }
        Record::Workflow(workflow) => {
            !terminal || Some(workflow.status.as_str()) == event.status.as_deref()
        }
        _ => false,
    }
}

/// Receives until `done` says so, checking each stored change against the
/// files on disk as it arrives.
async fn collect_until(
    setup: &Setup,
    events: &mut Subscription,
    mut done: impl FnMut(&Event) -> bool,
) -> Vec<Arc<Event>> {
    let mut seen = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(30), events.recv())
            .await
            .expect("an event within 30 s")
            .expect("the bus is open");
        assert_ne!(event.kind, EventKind::Resync, "nothing is lost here");
        if !matches!(event.kind, EventKind::Started | EventKind::LogAppended) {
            let record = on_disk(setup, &event).await;
            assert!(
                record.as_ref().is_some_and(|r| shows(r, &event)),
                "{:?} ({:?}) announced before it was on disk: {record:?}",
                event.kind,
                event.status
            );
        }
        let finished = done(&event);
        seen.push(event);
        if finished {
            return seen;
        }
    }
}

fn kinds_of(events: &[Arc<Event>], task: TaskId) -> Vec<EventKind> {
    events
        .iter()
        .filter(|e| e.task_id == Some(task) && e.kind != EventKind::LogAppended)
        .map(|e| e.kind)
        .collect()
}

fn finished(workflow: WorkflowId) -> impl FnMut(&Event) -> bool {
    move |e| {
        e.workflow_id == Some(workflow)
            && e.task_id.is_none()
            && e.kind == EventKind::WorkflowStatusChanged
            && matches!(
                e.status.as_deref(),
                Some("completed" | "failed" | "cancelled")
            )
    }
}

#[tokio::test]
async fn every_transition_of_a_real_workflow_is_announced_in_order_once_durable() {
    use EventKind::*;
    let setup = Setup::new();
    setup.script("ok.sh", "echo working\necho '{\"ok\": true}'\n");
    // Fails its first attempt only.
    setup.script(
        "flaky.sh",
        "if [ \"$ORCHESTRATOR_ATTEMPT\" = 1 ]; then echo first >&2; exit 3; fi\necho '{}'\n",
    );
    setup.script("broken.sh", "echo broken >&2\nexit 1\n");
    let engine = setup.engine(setup.fs().await).await;
    let mut events = engine.subscribe();
    let mut request = request_of(json!([
        {"ref_name": "ok", "script": "ok.sh"},
        {"ref_name": "flaky", "script": "flaky.sh", "retries": 1},
        {"ref_name": "broken", "script": "broken.sh", "retries": 0},
        {"ref_name": "after", "script": "ok.sh", "depends_on": ["broken"]}
    ]));
    request.template = match request.template {
        orchestrator_engine::TemplateSource::Inline(mut template) => {
            template.on_failure = orchestrator_core::FailurePolicy::Continue;
            orchestrator_engine::TemplateSource::Inline(template)
        }
        other => other,
    };
    let (view, _) = engine.submit(request).await.unwrap();
    let workflow = view.workflow.id;
    let seen = collect_until(&setup, &mut events, finished(workflow)).await;
    let task = |step: &str| {
        view.tasks
            .iter()
            .find(|t| t.step.ref_name.as_deref() == Some(step))
            .unwrap()
            .id
    };
    assert_eq!(
        kinds_of(&seen, task("ok")),
        [Submitted, Claimed, Started, AttemptEnded, Completed]
    );
    assert_eq!(
        kinds_of(&seen, task("flaky")),
        [
            Submitted,
            Claimed,
            Started,
            AttemptEnded,
            RetryScheduled,
            Claimed,
            Started,
            AttemptEnded,
            Completed
        ]
    );
    assert_eq!(
        kinds_of(&seen, task("broken")),
        [Submitted, Claimed, Started, AttemptEnded, Failed]
    );
    assert_eq!(kinds_of(&seen, task("after")), [Submitted, Skipped]);
    let outcomes: Vec<_> = seen
        .iter()
        .filter(|e| e.task_id == Some(task("flaky")) && e.kind == AttemptEnded)
        .map(|e| (e.attempt, e.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [
            (Some(1), Some(AttemptOutcome::Failed)),
            (Some(2), Some(AttemptOutcome::Succeeded))
        ]
    );
    let workflow_events: Vec<_> = seen
        .iter()
        .filter(|e| e.task_id.is_none())
        .map(|e| (e.kind, e.status.clone().unwrap()))
        .collect();
    assert_eq!(
        workflow_events,
        [
            (Submitted, "queued".to_owned()),
            (WorkflowStatusChanged, "running".to_owned()),
            (WorkflowStatusChanged, "failed".to_owned())
        ]
    );
    // The log's growth is announced too, with its length, never its text:
    // the last announcement is the whole log.
    let log = seen
        .iter()
        .rfind(|e| e.task_id == Some(task("ok")) && e.kind == LogAppended)
        .expect("a log event");
    let stored = engine
        .store()
        .tasks()
        .read_log(task("ok"), 0, 1 << 20)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&stored.data).starts_with("working\n"));
    assert_eq!(log.log_length, Some(stored.data.len() as u64));
    // One node numbers its events one by one.
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert!(seen.iter().all(|e| e.node == "local"));
}

#[tokio::test]
async fn a_cancel_is_announced_from_request_to_end() {
    use EventKind::*;
    let setup = Setup::new();
    setup.script("long.sh", "echo started\nsleep 30\n");
    let engine = setup.engine(setup.fs().await).await;
    let mut events = engine.subscribe();
    let (view, _) = engine
        .submit(request_of(
            json!([{"ref_name": "long", "script": "long.sh"}]),
        ))
        .await
        .unwrap();
    let task = view.tasks[0].id;
    collect_until(&setup, &mut events, |e| {
        e.task_id == Some(task) && e.kind == LogAppended
    })
    .await;
    engine.cancel_task(task).await.unwrap();
    let seen = collect_until(&setup, &mut events, finished(view.workflow.id)).await;
    assert_eq!(
        kinds_of(&seen, task),
        [CancelRequested, AttemptEnded, Cancelled]
    );
    let ended = seen.iter().find(|e| e.kind == AttemptEnded).unwrap();
    assert_eq!(ended.outcome, Some(AttemptOutcome::Cancelled));
}

/// The write that ends a task is held back in storage: its events wait
/// for it, and come once it is through.
#[tokio::test]
async fn no_event_runs_ahead_of_its_write() {
    let setup = Setup::new();
    let (store, faults) = FaultyBackend::wrap(setup.fs().await);
    let engine = setup.engine(store).await;
    let mut events = engine.subscribe();
    faults.hold_task_endings(true);
    let (view, _) = engine
        .submit(request_of(json!([{"ref_name": "a", "script": "mark.sh"}])))
        .await
        .unwrap();
    let task = view.tasks[0].id;
    let ran = setup.dir.path().join("ran.log");
    while !std::fs::read_to_string(&ran)
        .unwrap_or_default()
        .contains(&task.to_string())
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The script is done; its ending is held. Drain what is announced.
    let mut early = Vec::new();
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(300), events.recv()).await
    {
        early.push(event.kind);
    }
    assert!(
        !early.contains(&EventKind::Completed) && !early.contains(&EventKind::AttemptEnded),
        "announced before the write: {early:?}"
    );
    faults.hold_task_endings(false);
    let seen = collect_until(&setup, &mut events, finished(view.workflow.id)).await;
    assert_eq!(
        kinds_of(&seen, task),
        [EventKind::AttemptEnded, EventKind::Completed]
    );
}

#[tokio::test]
async fn a_stalled_subscriber_neither_blocks_the_engine_nor_grows_and_is_told_to_resync() {
    let setup = Setup::new();
    let engine = setup
        .engine_with_config(setup.fs().await, |config| config.event_capacity = 16)
        .await;
    let mut stalled = engine.subscribe();
    let steps: Vec<_> = (0..20)
        .map(|i| json!({"ref_name": format!("s{i}"), "script": "mark.sh"}))
        .collect();
    let (view, _) = engine.submit(request_of(json!(steps))).await.unwrap();
    // The engine finishes the whole workflow while nobody reads.
    assert!(
        engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(60))
            .await
            .unwrap()
    );
    let published = engine.last_event_seq();
    assert!(published > 100, "{published}");
    // What was held for it is the newest 16 and no more: the rest were
    // dropped, and it is told how many.
    let first = stalled.recv().await.unwrap();
    assert_eq!(first.kind, EventKind::Resync);
    let missed = first.missed.unwrap();
    assert_eq!(
        published - missed,
        16,
        "held {} of {published}",
        published - missed
    );
    let mut held = Vec::new();
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(200), stalled.recv()).await
    {
        held.push(event.seq);
    }
    assert_eq!(held, ((missed + 1)..=published).collect::<Vec<_>>());
    // A subscriber resuming from a seq that is long gone also resyncs.
    let mut resumed = engine.subscribe_after(1);
    assert_eq!(resumed.recv().await.unwrap().kind, EventKind::Resync);
}
