//! The lifecycle's decisions, one table or case per move, on records built
//! in memory.

use std::time::Duration;

use chrono::TimeZone;
use orchestrator_core::{MAX_INTERRUPTIONS, Priority};
use serde_json::Value;

use super::*;

fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 1, 1, 12, 0, 0).unwrap()
}

fn task(workflow: &Workflow, step: &str, depends_on: Vec<TaskId>, max_attempts: u32) -> Task {
    Task::new(
        workflow.id,
        TaskSpec {
            name: step.into(),
            script: format!("{step}.sh"),
            input: json!({"given": step}),
            priority: Priority::Normal,
            max_attempts,
            timeout: Duration::from_secs(5),
            check_mode: false,
            depends_on,
            step: StepSettings {
                ref_name: Some(step.into()),
                ..Default::default()
            },
        },
        now(),
    )
}

/// A task of a new workflow in its first attempt, run by node `a`.
fn running(max_attempts: u32) -> Task {
    let mut task = task(
        &Workflow::new("tpl", "wf", now()),
        "s",
        vec![],
        max_attempts,
    );
    task.start(now()).unwrap();
    task.node = Some("a".into());
    task
}

fn failed(error: &str) -> Outcome {
    Outcome::Failed {
        exit_code: Some(3),
        error: error.into(),
    }
}

#[test]
fn an_attempt_ends_as_its_outcome_says() {
    #[track_caller]
    fn check(outcome: Outcome, max_attempts: u32, cancel_requested: bool, expected: TaskStatus) {
        let mut task = running(max_attempts);
        task.cancel_requested = cancel_requested;
        end_attempt(&mut task, &outcome, &RetryPolicy::default(), 1.0, now()).unwrap();
        assert_eq!(task.status, expected, "{outcome:?}");
    }
    let succeeded = || Outcome::Succeeded {
        output: json!({"ip": "10.0.0.1"}),
    };
    let timed_out = || Outcome::TimedOut {
        error: "timed out".into(),
    };
    check(succeeded(), 1, false, TaskStatus::Completed);
    check(failed("exit 3"), 2, false, TaskStatus::RetryWaiting);
    check(failed("exit 3"), 1, false, TaskStatus::Failed);
    check(timed_out(), 2, false, TaskStatus::RetryWaiting);
    check(timed_out(), 1, false, TaskStatus::Failed);
    // A cancel asked for while the step ran: no retry.
    check(failed("killed"), 2, true, TaskStatus::Failed);
    check(Outcome::Cancelled, 1, true, TaskStatus::Cancelled);
    // Stopped by a shutdown, not by a cancel: back in the queue.
    check(Outcome::Cancelled, 1, false, TaskStatus::Queued);
}

#[test]
fn an_ended_attempt_keeps_what_it_produced() {
    let policy = RetryPolicy::default();
    let mut task = running(2);
    end_attempt(&mut task, &failed("exit 3"), &policy, 1.0, now()).unwrap();
    assert_eq!(
        (task.exit_code, task.error.as_deref()),
        (Some(3), Some("exit 3"))
    );
    // The policy's first wait, at full jitter.
    assert_eq!(task.retry_at, Some(now() + chrono::Duration::seconds(1)));

    let mut task = running(1);
    end_attempt(&mut task, &Outcome::Cancelled, &policy, 1.0, now()).unwrap();
    assert_eq!(task.attempts, 0, "an interrupted attempt is given back");
    assert_eq!(
        task.error.as_deref(),
        Some("interrupted: the service shut down during attempt 1")
    );

    let mut task = running(1);
    let output = json!({"ip": "10.0.0.1"});
    let succeeded = Outcome::Succeeded {
        output: output.clone(),
    };
    end_attempt(&mut task, &succeeded, &policy, 1.0, now()).unwrap();
    assert_eq!(task.output, Some(output));

    // Only a running attempt ends.
    let error = end_attempt(&mut task, &failed("late"), &policy, 1.0, now()).unwrap_err();
    assert!(matches!(error, Error::Conflict(_)), "{error}");
}

#[test]
fn an_orphaned_attempt_is_retried_without_using_up_attempts() {
    #[track_caller]
    fn check(interruptions: u32, cancel_requested: bool, expected: TaskStatus) {
        let mut task = running(1);
        // Each interruption began an attempt of its own.
        task.attempts += interruptions;
        task.interruptions = interruptions;
        task.cancel_requested = cancel_requested;
        let error = stopped_during(task.attempts);
        end_orphaned(&mut task, error, &RetryPolicy::default(), 0.0, now()).unwrap();
        assert_eq!(task.status, expected);
    }
    check(0, false, TaskStatus::RetryWaiting);
    check(MAX_INTERRUPTIONS - 1, false, TaskStatus::RetryWaiting);
    // Past the cap the interruption counts, so a step that takes the
    // machine down still ends.
    check(MAX_INTERRUPTIONS, false, TaskStatus::Failed);
    check(0, true, TaskStatus::Cancelled);

    let mut task = running(1);
    end_orphaned(
        &mut task,
        stopped_during(1),
        &RetryPolicy::default(),
        0.0,
        now(),
    )
    .unwrap();
    assert_eq!(
        task.error.as_deref(),
        Some("interrupted: the service stopped during attempt 1")
    );
}

#[test]
fn an_ended_task_is_queued_again_or_followed_up() {
    #[track_caller]
    fn check(status: TaskStatus, expected: AfterEnd) {
        assert_eq!(after_end(status), expected, "{status}");
        assert_eq!(waits_in_queue(status), expected == AfterEnd::Queue);
    }
    check(TaskStatus::RetryWaiting, AfterEnd::Queue);
    check(TaskStatus::Queued, AfterEnd::Queue);
    for status in [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
        TaskStatus::Skipped,
        TaskStatus::NotStarted,
    ] {
        check(status, AfterEnd::FollowUp);
    }
}

#[test]
fn only_the_claimed_attempt_holds_its_task() {
    #[track_caller]
    fn check(change: fn(&mut Task), expected: bool) {
        let claimed = running(3);
        let mut stored = claimed.clone();
        change(&mut stored);
        assert_eq!(holds(&stored, &claimed), expected);
    }
    check(|_| {}, true);
    check(
        |t| {
            t.checkpoint.insert("k".into(), json!(1));
        },
        true,
    );
    // Another node took it over after the lease ran out.
    check(|t| t.node = Some("b".into()), false);
    check(|t| t.attempts += 1, false);
    check(|t| t.status = TaskStatus::RetryWaiting, false);
}

#[test]
fn a_running_task_found_at_start_is_taken_over_if_nobody_else_runs_it() {
    #[track_caller]
    fn check(shared: bool, node: &str, lease: Option<i64>, expected: bool) {
        let mut task = running(1);
        task.node = Some(node.into());
        task.lease_until = lease.map(|secs| now() + chrono::Duration::seconds(secs));
        assert_eq!(is_orphaned(&task, shared, "a", now()), expected);
    }
    // A store of its own: whatever ran it was this node's previous life.
    check(false, "b", Some(60), true);
    check(true, "a", Some(60), true);
    check(true, "b", Some(60), false);
    check(true, "b", Some(-1), true);
    check(true, "b", None, true);
}

/// A workflow with a completed step `make` (output `{"ip": ...}`) and a
/// pending step `conf` after it that reads its output.
fn make_then_conf() -> (Workflow, Task, Task) {
    let workflow = Workflow::new("tpl", "wf", now());
    let mut make = task(&workflow, "make", vec![], 1);
    make.status = TaskStatus::Completed;
    make.output = Some(json!({"ip": "10.0.0.1"}));
    let mut conf = task(&workflow, "conf", vec![make.id], 1);
    conf.step.input_template = Some(json!({"ip": "${make.output.ip}"}));
    (workflow, make, conf)
}

fn by_id<'a>(tasks: &[&'a Task]) -> HashMap<TaskId, &'a Task> {
    tasks.iter().map(|t| (t.id, *t)).collect()
}

#[test]
fn a_release_resolves_the_input_and_waits_for_the_start_time() {
    let (mut workflow, make, conf) = make_then_conf();
    let later = now() + chrono::Duration::hours(1);
    workflow.start_at = Some(later);
    let round = round(
        &workflow,
        vec![Decision::Release(conf.id)],
        &by_id(&[&make, &conf]),
        now(),
    )
    .unwrap();
    assert!(round.workflow.is_none());
    let [(released, before)] = &round.tasks[..] else {
        panic!("{round:?}")
    };
    assert_eq!(released.status, TaskStatus::Queued);
    assert_eq!(released.input, json!({"ip": "10.0.0.1"}));
    assert_eq!(released.not_before, Some(later));
    assert_eq!(before.status, TaskStatus::Pending);

    // A start time already passed does not hold it back.
    workflow.start_at = Some(now());
    let mut task = conf.clone();
    release(&workflow, &mut task, &by_id(&[&make]), now()).unwrap();
    assert_eq!(task.not_before, None);
}

#[test]
fn a_release_whose_input_cannot_be_resolved_fails_the_task() {
    let (workflow, make, mut conf) = make_then_conf();
    conf.step.input_template = Some(json!({"ip": "${make.output.missing.deep}"}));
    release(&workflow, &mut conf, &by_id(&[&make]), now()).unwrap();
    assert_eq!(conf.status, TaskStatus::Failed);
    assert_eq!(conf.attempts, 0);
    let error = conf.error.unwrap_or_default();
    assert!(error.starts_with("cannot resolve input.ip"), "{error}");
}

#[test]
fn task_decisions_become_task_changes() {
    #[track_caller]
    fn check(decision: fn(TaskId) -> Decision, expected: TaskStatus, error: Option<&str>) {
        let (workflow, make, conf) = make_then_conf();
        let round = round(
            &workflow,
            vec![decision(conf.id)],
            &by_id(&[&make, &conf]),
            now(),
        )
        .unwrap();
        let [(task, _)] = &round.tasks[..] else {
            panic!("{round:?}")
        };
        assert_eq!((task.id, task.status), (conf.id, expected));
        assert_eq!(task.error.as_deref(), error);
    }
    check(Decision::Release, TaskStatus::Queued, None);
    check(
        |id| Decision::Skip(id, "make failed".into()),
        TaskStatus::Skipped,
        Some("make failed"),
    );
    check(
        |id| Decision::Abandon(id, "cancelled".into()),
        TaskStatus::NotStarted,
        Some("cancelled"),
    );
}

#[test]
fn a_workflow_decision_ends_the_round() {
    let (workflow, make, conf) = make_then_conf();
    let other = task(&workflow, "other", vec![make.id], 1);
    let halt = Halt {
        reason: "make failed".into(),
        rollback: false,
        rollback_started: false,
    };
    let decisions = vec![
        Decision::Release(conf.id),
        Decision::Halt(halt.clone()),
        Decision::Release(other.id),
    ];
    let round = round(&workflow, decisions, &by_id(&[&make, &conf, &other]), now()).unwrap();
    let ids: Vec<TaskId> = round.tasks.iter().map(|(t, _)| t.id).collect();
    assert_eq!(ids, [conf.id], "the decisions after the halt wait");
    let Some(WorkflowChange::Halt(halted)) = round.workflow else {
        panic!("{:?}", round.workflow)
    };
    assert_eq!(halted.halt, Some(halt));
    assert_eq!(halted.status, workflow.status);
}

#[test]
fn a_finish_stamps_the_workflow() {
    let (mut workflow, make, _) = make_then_conf();
    workflow.status = WorkflowStatus::Running;
    let decisions = vec![Decision::Finish(WorkflowStatus::Completed)];
    let round = round(&workflow, decisions, &by_id(&[&make]), now()).unwrap();
    let Some(WorkflowChange::Finish {
        workflow: finished,
        before,
    }) = round.workflow
    else {
        panic!("{:?}", round.workflow)
    };
    assert_eq!(before, WorkflowStatus::Running);
    assert_eq!(finished.status, WorkflowStatus::Completed);
    assert_eq!(finished.finished_at, Some(now()));
}

#[test]
fn a_rollback_chains_one_undo_task_per_step_that_has_an_undo_script() {
    let mut workflow = Workflow::new("tpl", "wf", now());
    workflow.status = WorkflowStatus::Running;
    workflow.halt = Some(Halt {
        reason: "c failed".into(),
        rollback: true,
        rollback_started: false,
    });
    let mut steps = Vec::new();
    for (name, undo) in [
        ("a", Some("undo-a.sh")),
        ("b", None),
        ("c", Some("undo-c.sh")),
    ] {
        let mut step = task(&workflow, name, vec![], 2);
        step.status = TaskStatus::Completed;
        step.output = Some(json!({"made": name}));
        step.step.rollback = undo.map(str::to_owned);
        steps.push(step);
    }
    workflow.task_ids = steps.iter().map(|t| t.id).collect();
    let undo = vec![steps[2].id, steps[1].id, steps[0].id];
    let by_id: HashMap<TaskId, &Task> = steps.iter().map(|t| (t.id, t)).collect();
    let round = round(&workflow, vec![Decision::Rollback(undo)], &by_id, now()).unwrap();
    let Some(WorkflowChange::Rollback {
        workflow: rolling,
        before,
        tasks,
    }) = round.workflow
    else {
        panic!("{:?}", round.workflow)
    };
    assert_eq!(before, WorkflowStatus::Running);
    assert_eq!(rolling.status, WorkflowStatus::RollingBack);
    assert!(rolling.halt.as_ref().is_some_and(|h| h.rollback_started));
    let summary: Vec<_> = tasks
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.script.as_str(),
                t.status,
                t.step.rollback_of,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "rollback c",
                "undo-c.sh",
                TaskStatus::Queued,
                Some(steps[2].id)
            ),
            (
                "rollback a",
                "undo-a.sh",
                TaskStatus::Pending,
                Some(steps[0].id)
            ),
        ]
    );
    assert_eq!(tasks[1].depends_on, [tasks[0].id]);
    assert_eq!(tasks[1].max_attempts, 2);
    assert_eq!(
        tasks[0].input,
        json!({"step": "c", "each": Value::Null, "input": {"given": "c"}, "output": {"made": "c"}})
    );
    assert_eq!(rolling.task_ids[3..], [tasks[0].id, tasks[1].id]);

    // Nothing with an undo script: the rollback is started and done.
    let only_b: HashMap<TaskId, &Task> = [(steps[1].id, &steps[1])].into_iter().collect();
    let decisions = vec![Decision::Rollback(vec![steps[1].id])];
    let round = super::round(&workflow, decisions, &only_b, now()).unwrap();
    let Some(WorkflowChange::Rollback {
        workflow: rolling,
        tasks,
        ..
    }) = round.workflow
    else {
        panic!("{:?}", round.workflow)
    };
    assert!(tasks.is_empty());
    assert_eq!(rolling.status, WorkflowStatus::Running);
    assert!(rolling.halt.is_some_and(|h| h.rollback_started));
}

#[test]
fn a_cancel_is_asked_once_and_never_of_a_finished_workflow() {
    #[track_caller]
    fn check(status: WorkflowStatus, asked: bool, expected: Option<bool>) {
        let mut workflow = Workflow::new("tpl", "wf", now());
        workflow.status = status;
        workflow.cancel_requested = asked;
        let answer = request_cancel(&mut workflow, now());
        match expected {
            Some(changed) => {
                assert_eq!(answer.unwrap(), changed);
                assert!(workflow.cancel_requested);
            }
            None => assert!(matches!(answer, Err(Error::Conflict(_))), "{answer:?}"),
        }
    }
    check(WorkflowStatus::Running, false, Some(true));
    check(WorkflowStatus::Queued, false, Some(true));
    check(WorkflowStatus::Running, true, Some(false));
    check(WorkflowStatus::Completed, false, None);
    check(WorkflowStatus::Cancelled, true, None);
}

#[test]
fn a_retry_runs_again_what_did_not_complete_and_what_a_rollback_undid() {
    let mut workflow = Workflow::new("tpl", "wf", now());
    workflow.status = WorkflowStatus::Failed;
    workflow.cancel_requested = true;
    workflow.finished_at = Some(now());
    let mut kept = task(&workflow, "kept", vec![], 1);
    kept.status = TaskStatus::Completed;
    let mut undone = task(&workflow, "undone", vec![], 1);
    undone.status = TaskStatus::Completed;
    let mut undo = task(&workflow, "undo", vec![], 1);
    undo.status = TaskStatus::Completed;
    undo.step.rollback_of = Some(undone.id);
    let mut broke = task(&workflow, "broke", vec![kept.id], 1);
    broke.status = TaskStatus::Failed;
    let mut after = task(&workflow, "after", vec![broke.id], 1);
    after.status = TaskStatus::Skipped;
    let tasks = [kept, undone.clone(), undo, broke.clone(), after.clone()];

    let retry = retry(&workflow, &tasks, now()).unwrap();
    let reset: Vec<(TaskId, TaskStatus, TaskStatus)> = retry
        .reset
        .iter()
        .map(|(t, before)| (t.id, before.status, t.status))
        .collect();
    assert_eq!(
        reset,
        [
            (undone.id, TaskStatus::Completed, TaskStatus::Pending),
            (broke.id, TaskStatus::Failed, TaskStatus::Pending),
            (after.id, TaskStatus::Skipped, TaskStatus::Pending),
        ]
    );
    assert_eq!(retry.before, WorkflowStatus::Failed);
    let w = &retry.workflow;
    assert_eq!(w.status, WorkflowStatus::Running);
    assert!(!w.cancel_requested && w.halt.is_none() && w.finished_at.is_none());
}

#[test]
fn a_retry_is_refused_while_running_or_with_nothing_to_run() {
    #[track_caller]
    fn check(status: WorkflowStatus, always_run: bool, refusal: Option<&str>) {
        let mut workflow = Workflow::new("tpl", "wf", now());
        workflow.status = status;
        let mut done = task(&workflow, "done", vec![], 1);
        done.status = TaskStatus::Completed;
        done.step.always_run = always_run;
        let answer = retry(&workflow, &[done], now());
        match refusal {
            None => assert!(answer.is_ok(), "{answer:?}"),
            Some(refusal) => {
                let message = answer.unwrap_err().to_string();
                assert_eq!(message, format!("workflow {} {refusal}", workflow.id));
            }
        }
    }
    check(
        WorkflowStatus::Running,
        false,
        Some("is running; only a finished workflow can be retried"),
    );
    check(
        WorkflowStatus::Completed,
        false,
        Some("completed; it has nothing to retry"),
    );
    check(WorkflowStatus::Completed, true, None);
    check(WorkflowStatus::Cancelled, false, None);
}

#[test]
fn a_stalled_workflow_stays_noted_until_it_is_gone() {
    let gone = Error::NotFound {
        what: "workflow",
        id: "w".into(),
    };
    assert!(!stays_stalled(&gone));
    let unavailable = Error::Storage(orchestrator_storage::Error::Unavailable("down".into()));
    assert!(stays_stalled(&unavailable));
}
