//! Tests of the comparison of two runs.

use std::collections::{BTreeMap, HashMap};

use chrono::{Duration, Utc};
use serde_json::{Value, json};

use super::*;
use crate::task::test_support::task_of;

struct Side {
    workflow: Workflow,
    tasks: Vec<Task>,
    hashes: BTreeMap<String, String>,
    logs: HashMap<TaskId, LogExcerpt>,
}

fn side(vars: Value) -> Side {
    let mut workflow = Workflow::new("deploy", "deploy", Utc::now());
    workflow.vars = vars;
    Side {
        workflow,
        tasks: Vec::new(),
        hashes: BTreeMap::from([("s.sh".to_owned(), "h1".to_owned())]),
        logs: HashMap::new(),
    }
}

impl Side {
    fn step(&mut self, name: &str, status: TaskStatus, output: Value, log: &str) -> &mut Task {
        let mut task = task_of(self.workflow.id, Some(name), vec![]);
        task.status = status;
        task.output = Some(output);
        let start = Utc::now();
        task.started_at = Some(start);
        task.finished_at = Some(start + Duration::milliseconds(1500));
        self.logs
            .insert(task.id, LogExcerpt::from_read(log.as_bytes().to_vec()));
        self.tasks.push(task);
        self.tasks.last_mut().unwrap()
    }

    fn run(&self) -> Run<'_> {
        Run {
            workflow: &self.workflow,
            tasks: &self.tasks,
            template_revision: "deploy@1 sha256:t".into(),
            script_hashes: &self.hashes,
            logs: &self.logs,
        }
    }
}

#[test]
fn one_changed_input_and_one_changed_output_are_what_differs() {
    let mut a = side(json!({"env": "dev", "size": 1}));
    let mut b = side(json!({"env": "prod", "size": 1}));
    for s in [&mut a, &mut b] {
        s.step(
            "build",
            TaskStatus::Completed,
            json!({"image": "x"}),
            "building\ndone\n",
        );
    }
    a.step(
        "ship",
        TaskStatus::Completed,
        json!({"url": "dev.example", "n": 1}),
        "ship to dev\nok\n",
    );
    b.step(
        "ship",
        TaskStatus::Completed,
        json!({"url": "prod.example", "n": 1}),
        "ship to prod\nok\n",
    );
    let c = compare(&a.run(), &b.run());

    let changed: Vec<_> = c
        .inputs
        .iter()
        .filter(|k| k.change != Change::Same)
        .collect();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].key, "env");
    assert_eq!(changed[0].a, Some(json!("dev")));
    assert_eq!(changed[0].b, Some(json!("prod")));
    // A same input still shows its value, side by side.
    let size = c.inputs.iter().find(|k| k.key == "size").unwrap();
    assert_eq!(
        (size.change, size.a.clone()),
        (Change::Same, Some(json!(1)))
    );

    assert_eq!(c.steps[0].key, "build");
    assert_eq!(c.steps[0].change, Change::Same);
    assert_eq!(c.steps[0].log.as_ref().unwrap().outcome, LogOutcome::Same);
    let ship = &c.steps[1];
    assert_eq!(ship.change, Change::Changed);
    assert!(!ship.status_changed && !ship.script_changed);
    assert_eq!(ship.outputs.len(), 1);
    assert_eq!(ship.outputs[0].key, "url");
    assert_eq!(ship.outputs_same, 1);
    let log = ship.log.as_ref().unwrap();
    assert_eq!(log.outcome, LogOutcome::Differs);
    assert_eq!(log.line, Some(1));
    assert_eq!(log.a.as_deref(), Some("ship to dev"));
    assert_eq!(log.b.as_deref(), Some("ship to prod"));
    assert_eq!(ship.a.as_ref().unwrap().duration_ms, Some(1500));
    assert_eq!(ship.a.as_ref().unwrap().script_hash.as_deref(), Some("h1"));

    assert_eq!(c.summary.inputs_changed, 1);
    assert_eq!(c.summary.steps_differing, 1);
    assert!(!c.summary.same);
    assert!(!c.template_changed);
}

#[test]
fn a_run_against_itself_is_the_same() {
    let mut a = side(json!({"env": "dev"}));
    a.step(
        "build",
        TaskStatus::Completed,
        json!({"image": "x"}),
        "one\ntwo\n",
    );
    let c = compare(&a.run(), &a.run());
    assert!(c.summary.same);
    assert_eq!(c.summary.steps, 1);
}

#[test]
fn steps_in_one_run_only_status_script_and_template_changes_are_found() {
    let mut a = side(json!({}));
    let mut b = side(json!({}));
    a.step("build", TaskStatus::Completed, json!(null), "");
    b.step("build", TaskStatus::Failed, json!(null), "").script = "other.sh".into();
    a.step("gone", TaskStatus::Completed, json!(null), "");
    b.step("new", TaskStatus::Completed, json!(null), "");
    let mut b_run = b.run();
    b_run.template_revision = "deploy@2 sha256:u".into();
    let c = compare(&a.run(), &b_run);
    let build = &c.steps[0];
    assert!(build.status_changed && build.script_changed);
    // `other.sh` has no recorded hash: the path differs anyway.
    assert_eq!(build.b.as_ref().unwrap().script_hash, None);
    assert_eq!(c.steps[1].key, "gone");
    assert_eq!(c.steps[1].change, Change::OnlyA);
    assert!(c.steps[1].log.is_none());
    assert_eq!(c.steps[2].key, "new");
    assert_eq!(c.steps[2].change, Change::OnlyB);
    assert!(c.template_changed);
    assert!(!c.summary.same);
}

#[test]
fn for_each_instances_are_matched_by_their_values() {
    let mut a = side(json!({}));
    let mut b = side(json!({}));
    a.step("host", TaskStatus::Completed, json!({"ip": 1}), "")
        .step
        .each = Some(json!({"h": "x"}));
    a.step("host", TaskStatus::Completed, json!({"ip": 2}), "")
        .step
        .each = Some(json!({"h": "y"}));
    // In the other order in b, with y's output changed.
    b.step("host", TaskStatus::Completed, json!({"ip": 3}), "")
        .step
        .each = Some(json!({"h": "y"}));
    b.step("host", TaskStatus::Completed, json!({"ip": 1}), "")
        .step
        .each = Some(json!({"h": "x"}));
    let c = compare(&a.run(), &b.run());
    assert_eq!(c.steps.len(), 2);
    assert_eq!(c.steps[0].key, r#"host[{"h":"x"}]"#);
    assert_eq!(c.steps[0].change, Change::Same);
    assert_eq!(c.steps[1].key, r#"host[{"h":"y"}]"#);
    assert_eq!(c.steps[1].change, Change::Changed);
}

#[test]
fn a_log_cut_at_the_limit_says_so_and_its_unread_rest_is_no_difference() {
    let long: String = (0..LOG_COMPARE_LINES + 10)
        .map(|i| format!("line {i}\n"))
        .collect();
    let short: String = (0..LOG_COMPARE_LINES - 5)
        .map(|i| format!("line {i}\n"))
        .collect();
    let mut a = side(json!({}));
    let mut b = side(json!({}));
    a.step("s", TaskStatus::Completed, json!(null), &long);
    b.step("s", TaskStatus::Completed, json!(null), &long);
    let c = compare(&a.run(), &b.run());
    let log = c.steps[0].log.as_ref().unwrap();
    assert_eq!(log.outcome, LogOutcome::Same);
    assert!(log.capped);
    assert_eq!(log.lines_compared, LOG_COMPARE_LINES);
    assert_eq!(c.summary.logs_capped, 1);

    // A shorter log against a capped one: the short one ended first, at
    // a line the other has.
    let mut b = side(json!({}));
    b.step("s", TaskStatus::Completed, json!(null), &short);
    let c = compare(&a.run(), &b.run());
    let log = c.steps[0].log.as_ref().unwrap();
    assert_eq!(log.outcome, LogOutcome::Differs);
    assert_eq!(log.line, Some(LOG_COMPARE_LINES - 4));
    assert_eq!(log.b, None);
}

#[test]
fn bytes_past_the_limit_are_cut_at_a_whole_line_and_long_lines_shortened() {
    let excerpt = LogExcerpt::from_read(vec![b'x'; LOG_COMPARE_BYTES + 1]);
    assert!(excerpt.capped);
    assert_eq!(excerpt.bytes.len(), LOG_COMPARE_BYTES);
    let (lines, capped) = lines(&excerpt);
    assert!(lines.is_empty() && capped);

    let a = LogExcerpt::from_read(format!("{}\n", "a".repeat(2000)).into_bytes());
    let b = LogExcerpt::from_read(b"b\n".to_vec());
    let log = compare_logs(Some(&a), Some(&b));
    assert_eq!(log.a.unwrap().chars().count(), LOG_LINE_SHOWN_CHARS + 1);
    assert_eq!(
        compare_logs(None, Some(&b)).outcome,
        LogOutcome::NotCompared
    );
}

#[test]
fn only_steps_in_both_runs_have_their_logs_read() {
    let mut a = side(json!({}));
    let mut b = side(json!({}));
    a.step("both", TaskStatus::Completed, json!(null), "");
    a.step("only_a", TaskStatus::Completed, json!(null), "");
    b.step("both", TaskStatus::Completed, json!(null), "");
    let (x, y) = logs_to_read(&a.tasks, &b.tasks);
    assert_eq!((x.len(), y.len()), (1, 1));
    assert_eq!(x[0].step.ref_name.as_deref(), Some("both"));
}
