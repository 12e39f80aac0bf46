//! Named locks in the engine: a waiting workflow is told so, a cancelled
//! waiter leaves the line (so it blocks nobody), and the holder's end
//! releases the lock and grants the next waiter, each with its event,
//! after the write.

use std::time::{Duration, Instant};

use orchestrator_core::WorkflowId;
use orchestrator_core::event::{Event, EventKind};
use orchestrator_engine::Engine;
use orchestrator_engine::events::Subscription;
use serde_json::json;

use super::{Setup, request_of};

fn locked(script: &str) -> orchestrator_engine::SubmitRequest {
    let mut request = request_of(json!([{"ref_name": "apply", "script": script}]));
    let orchestrator_engine::TemplateSource::Inline(template) = &mut request.template else {
        unreachable!()
    };
    template.locks = serde_json::from_value(json!({"env": {"name": "env:prod"}})).unwrap();
    request
}

async fn submit(engine: &Engine, script: &str) -> WorkflowId {
    engine.submit(locked(script)).await.unwrap().0.workflow.id
}

/// The next lock event about `workflow`, within a minute.
async fn next_lock_event(events: &mut Subscription, workflow: WorkflowId) -> Event {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let event = tokio::time::timeout(left, events.recv())
            .await
            .expect("no lock event within a minute")
            .unwrap();
        if matches!(
            event.kind,
            EventKind::LockGranted | EventKind::LockReleased | EventKind::LockWaiting
        ) && event.workflow_id == Some(workflow)
        {
            return (*event).clone();
        }
    }
}

#[tokio::test]
async fn waiters_are_told_a_cancelled_waiter_leaves_and_the_next_is_granted() {
    let setup = Setup::new();
    let engine = setup
        .engine_with_config(setup.fs().await, |c| c.lease = Duration::from_secs(1))
        .await;
    let mut events = engine.subscribe();
    let holder = submit(&engine, "gate.sh").await;
    let granted = next_lock_event(&mut events, holder).await;
    assert_eq!(granted.kind, EventKind::LockGranted);
    let lock = granted.lock.unwrap();
    assert_eq!((lock.name.as_str(), lock.token), ("env:prod", Some(1)));

    let cancelled = submit(&engine, "mark.sh").await;
    let waiting = next_lock_event(&mut events, cancelled).await;
    assert_eq!(waiting.kind, EventKind::LockWaiting);
    assert_eq!(waiting.lock.unwrap().position, Some(0));
    let next = submit(&engine, "mark.sh").await;
    assert_eq!(
        next_lock_event(&mut events, next)
            .await
            .lock
            .unwrap()
            .position,
        Some(1)
    );

    // The cancelled waiter leaves the line (the sweep sees it finished).
    engine.cancel_workflow(cancelled).await.unwrap();
    let left = next_lock_event(&mut events, cancelled).await;
    assert_eq!(left.kind, EventKind::LockReleased);
    assert_eq!(left.lock.unwrap().token, None, "it never held the lock");

    setup.open_gate();
    let released = next_lock_event(&mut events, holder).await;
    assert_eq!(released.kind, EventKind::LockReleased);
    let lock = released.lock.unwrap();
    assert_eq!(
        (lock.token, lock.reason.as_deref()),
        (Some(1), Some("ended"))
    );
    let granted = next_lock_event(&mut events, next).await;
    assert_eq!(granted.kind, EventKind::LockGranted);
    assert_eq!(granted.lock.unwrap().token, Some(2));
    assert!(
        engine
            .wait_for_workflow(next, Duration::from_secs(60))
            .await
            .unwrap()
    );
    // Only the holders ran: the cancelled one never started.
    assert_eq!(setup.ran().lines().count(), 1, "{}", setup.ran());
    assert!(
        engine
            .locks()
            .await
            .unwrap()
            .iter()
            .all(|l| l.holders.is_empty())
    );
    engine.shutdown(Duration::from_secs(5)).await;
}
