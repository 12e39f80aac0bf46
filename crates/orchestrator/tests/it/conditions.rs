//! `when:` conditions and pause/resume, through the real binary: steps a
//! condition skips (with their dependents, and the reason on the task), a
//! condition over an upstream output, a condition refused at submission,
//! and a paused workflow that starts nothing new, stays paused across a
//! restart and completes once resumed.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::Daemon;
use crate::harness::script_state;

/// POSTs JSON; the status and the body.
fn post(url: &str, body: &Value) -> (u16, Value) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(url)
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    })
}

/// A step running the test script `dag/step.py`.
fn step(ref_name: &str, input: Value, extra: Value) -> Value {
    let mut input = input;
    input["name"] = json!(ref_name);
    let mut step = json!({"ref_name": ref_name, "script": "dag/step.py", "input": input});
    if let (Value::Object(step), Value::Object(extra)) = (&mut step, extra) {
        step.extend(extra);
    }
    step
}

fn template(inputs: Value, steps: Vec<Value>) -> Value {
    json!({"name": "t", "ref_name": "t", "schema_version": 1, "inputs": inputs, "steps": steps})
}

fn submit(daemon: &Daemon, body: Value) -> String {
    let (status, view) = post(&format!("{}/workflows", daemon.url), &body);
    assert_eq!(status, 202, "{view}");
    view["id"].as_str().unwrap().to_owned()
}

fn status(daemon: &Daemon, id: &str) -> Value {
    daemon.cli_json(&["workflow", "status", id, "--json"])
}

/// Reads the workflow until `done` holds for it (a minute at most).
fn wait_until(daemon: &Daemon, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..1200 {
        let view = status(daemon, id);
        if done(&view) {
            return view;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("workflow {id} never got there: {}", status(daemon, id));
}

fn finished(view: &Value) -> bool {
    matches!(
        view["status"].as_str(),
        Some("completed" | "failed" | "cancelled")
    )
}

/// The task of a workflow's step, by the step's name.
fn task<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"]["ref_name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {view}"))
}

fn runs(data_dir: &Path, name: &str) -> usize {
    std::fs::read_to_string(script_state(data_dir).join("runs").join(name))
        .map_or(0, |s| s.lines().count())
}

/// plan → apply (when: plan's changes > 0) → verify; and `prod_only`,
/// which runs only for env `prod`.
fn plan_and_apply(env: &str, changes: u64) -> Value {
    let steps = vec![
        step(
            "plan",
            json!({"output": {"changes": "${workflow.input.changes}"}}),
            json!({}),
        ),
        step(
            "apply",
            json!({}),
            json!({"depends_on": ["plan"], "when": "plan.output.changes > 0"}),
        ),
        step("verify", json!({}), json!({"depends_on": ["apply"]})),
        step(
            "prod_only",
            json!({}),
            json!({"when": "workflow.input.env == 'prod'"}),
        ),
    ];
    json!({
        "template": template(json!({"env": {"type": "string"}, "changes": {"type": "integer"}}), steps),
        "vars": {"env": env, "changes": changes},
    })
}

#[test]
fn a_false_condition_skips_the_step_and_its_dependents_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let daemon = Daemon::start(&data, &[]);

    let id = submit(&daemon, plan_and_apply("staging", 0));
    let view = wait_until(&daemon, &id, finished);
    // Skipped by a condition is no failure.
    assert_eq!(view["status"], "completed", "{view}");
    let apply = task(&view, "apply");
    assert_eq!(apply["status"], "skipped", "{view}");
    assert_eq!(
        apply["condition"],
        json!({"expression": "plan.output.changes > 0", "value": false})
    );
    assert_eq!(
        apply["error"],
        "skipped: when `plan.output.changes > 0` is false"
    );
    let verify = task(&view, "verify");
    assert_eq!(verify["status"], "skipped", "{view}");
    assert!(
        verify["error"]
            .as_str()
            .unwrap()
            .contains("dependency apply"),
        "{verify}"
    );
    assert_eq!(task(&view, "prod_only")["status"], "skipped");
    for name in ["apply", "verify", "prod_only"] {
        assert_eq!(runs(&data, name), 0, "{name} never ran");
    }
    // The task itself says why.
    let shown = daemon.cli_json(&["task", apply["id"].as_str().unwrap(), "--json"]);
    assert_eq!(shown["condition"]["value"], false);

    // A condition over an upstream output that holds: the step runs.
    let id = submit(&daemon, plan_and_apply("prod", 3));
    let view = wait_until(&daemon, &id, finished);
    assert_eq!(view["status"], "completed", "{view}");
    let apply = task(&view, "apply");
    assert_eq!(apply["status"], "completed", "{view}");
    assert_eq!(apply["condition"]["value"], true);
    assert_eq!(task(&view, "verify")["status"], "completed");
    assert_eq!(task(&view, "prod_only")["status"], "completed");
    assert_eq!(runs(&data, "apply"), 1);

    // A condition that can not be evaluated (a key the output lacks)
    // fails its step, saying why.
    let id = submit(
        &daemon,
        json!({"template": template(json!({}), vec![
            step("plan", json!({}), json!({})),
            step("check", json!({}), json!({"depends_on": ["plan"], "when": "plan.output.missing == 1"})),
        ])}),
    );
    let view = wait_until(&daemon, &id, finished);
    assert_eq!(view["status"], "failed", "{view}");
    let check = task(&view, "check");
    assert_eq!(check["status"], "failed");
    assert_eq!(
        check["error"],
        "when `plan.output.missing == 1`: column 1: `plan.output.missing`: the output of step `plan` has no such key"
    );
    assert_eq!(runs(&data, "check"), 0);

    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

#[test]
fn a_bad_condition_is_refused_at_submission_naming_the_step_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&dir.path().join("data"), &[]);
    let cases = [
        (
            "plan.output.changes >",
            "steps.apply.when: column 22: expected a value, found the end",
        ),
        (
            "workflow.input.nope == 1",
            "steps.apply.when: column 1: `workflow.input.nope` reads an input",
        ),
        (
            "other.output.x == 1",
            "step `other` is not upstream of step `apply`",
        ),
    ];
    for (when, message) in cases {
        let body = json!({"template": template(json!({}), vec![
            step("plan", json!({}), json!({})),
            step("other", json!({}), json!({})),
            step("apply", json!({}), json!({"depends_on": ["plan"], "when": when})),
        ])});
        for path in ["/workflows", "/workflows/validate"] {
            let (code, answer) = post(&format!("{}{path}", daemon.url), &body);
            assert_eq!(code, 422, "{when}: {answer}");
            let text = answer["error"]["message"].as_str().unwrap();
            assert!(text.contains(message), "`{text}` should say `{message}`");
        }
    }
    let list = daemon.cli_json(&["workflow", "list", "--json"]);
    assert_eq!(list["total"], 0, "nothing was created");
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

/// a (waits for the file `gate`) → b → c.
fn gated_chain() -> Value {
    json!({"template": template(json!({}), vec![
        step("a", json!({"wait_for": "gate"}), json!({})),
        step("b", json!({}), json!({"depends_on": ["a"]})),
        step("c", json!({}), json!({"depends_on": ["b"]})),
    ])})
}

/// A one-step workflow run to its end: with one worker and FIFO order
/// within a priority, whatever was queued before it would have run first.
fn run_another(daemon: &Daemon, name: &str) {
    let id = submit(
        daemon,
        json!({"template": template(json!({}), vec![step(name, json!({}), json!({}))])}),
    );
    let view = wait_until(daemon, &id, finished);
    assert_eq!(view["status"], "completed", "{view}");
}

#[test]
fn a_paused_workflow_starts_nothing_new_survives_a_restart_and_completes_when_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let one_worker = ["--workers", "1"];
    let daemon = Daemon::start(&data, &one_worker);
    let id = submit(&daemon, gated_chain());
    wait_until(&daemon, &id, |v| task(v, "a")["status"] == "running");

    let paused = daemon.cli_json(&["workflow", "pause", &id, "--json"]);
    assert_eq!(paused["paused"], true, "{paused}");
    // Twice is the same.
    let again = daemon.cli_json(&["workflow", "pause", &id, "--json"]);
    assert_eq!(again["paused"], true);
    let shown = daemon.cli(&["workflow", "status", &id]);
    assert!(String::from_utf8_lossy(&shown.stdout).contains("paused:"));

    // The running step finishes; the next one is released but not started.
    std::fs::write(script_state(&data).join("gate"), "").unwrap();
    let view = wait_until(&daemon, &id, |v| task(v, "b")["status"] != "pending");
    assert_eq!(task(&view, "b")["status"], "queued", "{view}");
    assert_eq!(task(&view, "a")["status"], "completed");
    run_another(&daemon, "other-1");
    let view = status(&daemon, &id);
    assert_eq!(task(&view, "b")["status"], "queued", "{view}");
    assert_eq!(task(&view, "b")["attempts"], 0);
    assert_eq!(view["status"], "running");

    // A restart keeps it paused.
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
    let daemon = Daemon::start(&data, &one_worker);
    let view = status(&daemon, &id);
    assert_eq!(view["paused"], true, "{view}");
    run_another(&daemon, "other-2");
    let view = status(&daemon, &id);
    assert_eq!(task(&view, "b")["status"], "queued", "{view}");
    assert_eq!(runs(&data, "b"), 0);

    let resumed = daemon.cli_json(&["workflow", "resume", &id, "--json"]);
    assert!(
        resumed.get("paused").is_none_or(|p| p == false),
        "{resumed}"
    );
    let view = wait_until(&daemon, &id, finished);
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(runs(&data, "c"), 1);

    // A finished workflow can not be paused: 409, naming its status.
    let (code, answer) = post(&format!("{}/workflows/{id}/pause", daemon.url), &json!({}));
    assert_eq!(code, 409, "{answer}");
    let text = answer["error"]["message"].as_str().unwrap();
    assert!(text.contains("already finished as completed"), "{text}");
    let refused = daemon.cli(&["workflow", "pause", &id]);
    assert!(!refused.status.success());

    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

#[test]
fn a_paused_workflow_can_be_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let daemon = Daemon::start(&data, &[]);
    let id = submit(&daemon, gated_chain());
    wait_until(&daemon, &id, |v| task(v, "a")["status"] == "running");
    daemon.cli_json(&["workflow", "pause", &id, "--json"]);
    let cancel = daemon.cli(&["workflow", "cancel", &id]);
    assert!(cancel.status.success());
    let view = wait_until(&daemon, &id, finished);
    assert_eq!(view["status"], "cancelled", "{view}");
    assert_eq!(task(&view, "a")["status"], "cancelled");
    assert_eq!(task(&view, "c")["status"], "not_started");
    assert_eq!(
        view.get("paused"),
        None,
        "a finished workflow is not paused"
    );
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}
