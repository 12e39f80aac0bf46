//! Ambiguous storage faults: a write that commits and then reports an
//! error, as when a connection drops after the database committed. The
//! engine cannot tell it from a write that never landed. Whichever it was,
//! no acknowledged work is lost, and a step whose every write committed
//! runs exactly once: an ambiguous write is never a reason to run a step
//! again (only a write that did not land is, within the at-least-once
//! window of docs/reliability.md).

use std::collections::HashMap;
use std::time::Duration;

use orchestrator_core::TaskStatus;
use orchestrator_storage::faults::{AmbiguousOdds, FaultyBackend, TaskMove};
use serde_json::json;

use crate::{Setup, request_of};

/// Submits until the engine acknowledges, under one idempotency key, as a
/// client that got an error would: a submission whose write committed is
/// found again, not stored twice.
async fn submit_until_acknowledged(
    engine: &orchestrator_engine::Engine,
    request: impl Fn() -> orchestrator_engine::SubmitRequest,
) -> orchestrator_core::WorkflowId {
    for _ in 0..50 {
        let mut attempt = request();
        attempt.idempotency_key = Some("ambiguous-drill".into());
        match engine.submit(attempt).await {
            Ok((view, _)) => return view.workflow.id,
            Err(e) => assert!(e.to_string().contains("injected fault"), "{e}"),
        }
    }
    panic!("50 submissions in a row failed");
}

/// Each task id of `ran.log` with the number of runs.
fn runs(log: &str) -> HashMap<&str, usize> {
    let mut runs = HashMap::new();
    for line in log.lines() {
        *runs.entry(line).or_default() += 1;
    }
    runs
}

/// Random ambiguous writes, one in four task-store writes, over a
/// workflow that fans out and joins: every task completes, each script
/// ran exactly once. Seedable: ORCHESTRATOR_FAULT_SEED replays a run.
#[tokio::test]
async fn random_ambiguous_writes_lose_nothing_and_run_no_step_twice() {
    let seed = std::env::var("ORCHESTRATOR_FAULT_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("ORCHESTRATOR_FAULT_SEED={seed}");
    let setup = Setup::new();
    let (store, faults) = FaultyBackend::wrap(setup.fs().await);
    // A short lease: a claim whose answer was lost is taken over soon.
    let engine = setup
        .engine_with_config(store.clone(), |config| {
            config.workers = 3;
            config.lease = Duration::from_millis(600);
        })
        .await;
    faults.ambiguous_at_random(Some(AmbiguousOdds { one_in: 4, seed }));
    let steps = json!([
        {"ref_name": "first", "script": "mark.sh"},
        {"ref_name": "fan", "script": "mark.sh", "for_each": {"i": [1, 2, 3, 4, 5, 6]},
         "depends_on": ["first"]},
        {"ref_name": "side", "script": "mark.sh", "depends_on": ["first"]},
        {"ref_name": "join", "script": "mark.sh", "depends_on": ["fan", "side"]},
        {"ref_name": "last", "script": "mark.sh", "depends_on": ["join"]}
    ]);
    let id = submit_until_acknowledged(&engine, || request_of(steps.clone())).await;
    let finished = engine
        .wait_for_workflow(id, Duration::from_secs(90))
        .await
        .unwrap();
    let ambiguous = faults.ambiguous_writes();
    faults.ambiguous_at_random(None);
    let view = engine.workflow(id).await.unwrap();
    let states: Vec<_> = view
        .tasks
        .iter()
        .map(|t| {
            (
                t.step.ref_name.clone(),
                t.status,
                t.attempts,
                t.error.clone(),
            )
        })
        .collect();
    assert!(
        finished,
        "seed {seed}: not finished: {:?} {states:?}",
        view.workflow.status
    );
    assert_eq!(view.tasks.len(), 10);
    let log = setup.ran();
    let runs = runs(&log);
    for task in &view.tasks {
        assert_eq!(
            task.status,
            TaskStatus::Completed,
            "seed {seed}: {} {:?}",
            task.id,
            task.error
        );
        assert_eq!(
            runs.get(task.id.to_string().as_str()),
            Some(&1),
            "seed {seed}: task {} ({:?}) ran {:?} times",
            task.id,
            task.step.ref_name,
            runs.get(task.id.to_string().as_str())
        );
    }
    assert!(ambiguous > 0, "seed {seed}: no write was made ambiguous");
    println!("{ambiguous} ambiguous writes");
    engine.shutdown(Duration::from_secs(5)).await;
}

/// Each kind of move made ambiguous on its own, the first two times it is
/// made: the claim (stored, but the worker believes it failed), the
/// release of a dependent, and the end of an attempt.
#[tokio::test]
async fn an_ambiguous_claim_release_or_end_is_neither_lost_nor_run_again() {
    for move_ in [TaskMove::Claim, TaskMove::Release, TaskMove::End] {
        let setup = Setup::new();
        let (store, faults) = FaultyBackend::wrap(setup.fs().await);
        let engine = setup
            .engine_with_config(store, |config| {
                config.lease = Duration::from_millis(600);
            })
            .await;
        faults.ambiguous(move_, 2);
        let steps = json!([
            {"ref_name": "a", "script": "mark.sh"},
            {"ref_name": "b", "script": "mark.sh", "depends_on": ["a"]}
        ]);
        let (view, _) = engine.submit(request_of(steps)).await.unwrap();
        let finished = engine
            .wait_for_workflow(view.workflow.id, Duration::from_secs(20))
            .await
            .unwrap();
        let view = engine.workflow(view.workflow.id).await.unwrap();
        assert!(finished, "{move_:?}: {:?}", view.tasks);
        let log = setup.ran();
        let runs = runs(&log);
        for task in &view.tasks {
            assert_eq!(task.status, TaskStatus::Completed, "{move_:?}: {:?}", task);
            assert_eq!(
                runs.get(task.id.to_string().as_str()),
                Some(&1),
                "{move_:?}: {:?} ran {:?} times",
                task.step.ref_name,
                runs.get(task.id.to_string().as_str())
            );
        }
        faults.faulted(move_, 1).await;
        engine.shutdown(Duration::from_secs(5)).await;
    }
}
