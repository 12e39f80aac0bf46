//! Comparing two runs (`GET /workflows/{a}/compare/{b}` and `orchestrator
//! workflow diff`): two runs of one template that differ in one input and
//! one output, a re-run, and the refusals.

use serde_json::{Value, json};

use crate::cli::Daemon;
use crate::harness::{TestService, fixture_settings};

/// Two steps: `build` is the same whatever the input; `ship` names the
/// `env` input in its output (`target`) and its second log line.
fn submission(env: &str) -> Value {
    json!({
        "template": {
            "name": "Compare", "ref_name": "cmp", "schema_version": 1,
            "inputs": {"env": {"type": "string"}, "size": {"type": "number", "default": 1}},
            "steps": [
                {"ref_name": "build", "script": "ui/ticker.py", "input": {"ticks": 2, "interval": 0}},
                {"ref_name": "ship", "script": "ui/ship.py", "depends_on": ["build"],
                 "input": {"target": "${workflow.input.env}"}},
            ],
        },
        "vars": {"env": env},
        "meta": {"ref": format!("cmp-{env}")},
    })
}

async fn run(service: &TestService, body: Value) -> String {
    let (status, view) = service.post("/workflows", body).await;
    assert_eq!(status, 202, "{view}");
    let id = view["id"].as_str().unwrap().to_owned();
    let done = service.wait_workflow(&id).await;
    assert_eq!(done["status"], "completed", "{done}");
    id
}

fn step<'a>(comparison: &'a Value, key: &str) -> &'a Value {
    comparison["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"] == key)
        .unwrap_or_else(|| panic!("no step {key} in {comparison}"))
}

#[tokio::test]
async fn two_runs_that_differ_in_one_input_show_that_input_one_output_and_the_log_line() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let a = run(&service, submission("dev")).await;
    let b = run(&service, submission("prod")).await;

    let (status, c) = service.get(&format!("/workflows/{a}/compare/{b}")).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["a"]["id"], a.as_str());
    assert_eq!(c["b"]["id"], b.as_str());
    assert_eq!(c["template_changed"], false);
    assert_eq!(c["revisions"], false, "two references");
    let changed: Vec<&Value> = c["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|k| k["change"] != "same")
        .collect();
    assert_eq!(changed.len(), 1, "{c}");
    assert_eq!(changed[0]["key"], "env");
    assert_eq!(
        (&changed[0]["a"], &changed[0]["b"]),
        (&json!("dev"), &json!("prod"))
    );

    let build = step(&c, "build");
    assert_eq!(build["change"], "same", "{build}");
    assert_eq!(build["log"]["outcome"], "same");
    assert_eq!(build["a"]["script"], "ui/ticker.py");
    assert_eq!(build["a"]["script_hash"], build["b"]["script_hash"]);
    assert_eq!(build["a"]["script_hash"].as_str().unwrap().len(), 64);

    let ship = step(&c, "ship");
    assert_eq!(ship["change"], "changed");
    assert_eq!(ship["status_changed"], false);
    assert_eq!(ship["outputs"].as_array().unwrap().len(), 1, "{ship}");
    assert_eq!(ship["outputs"][0]["key"], "target");
    assert_eq!(ship["outputs"][0]["a"], "dev");
    assert_eq!(ship["outputs"][0]["b"], "prod");
    assert_eq!(ship["outputs_same"], 1, "region");
    let log = &ship["log"];
    assert_eq!(log["outcome"], "differs", "{log}");
    assert_eq!(log["line"], 2);
    assert_eq!(log["a"], "shipping to dev");
    assert_eq!(log["b"], "shipping to prod");
    assert_eq!(log["capped"], false);

    assert_eq!(c["summary"]["inputs_changed"], 1);
    assert_eq!(c["summary"]["steps_differing"], 1);
    assert_eq!(c["summary"]["same"], false);
    assert_eq!(c["limits"]["log_bytes_per_step"], 65536);

    // A run against itself: nothing differs.
    let (status, same) = service.get(&format!("/workflows/{a}/compare/{a}")).await;
    assert_eq!(status, 200);
    assert_eq!(same["summary"]["same"], true, "{same}");
}

#[tokio::test]
async fn a_rerun_is_compared_with_the_revision_it_re_ran_and_kept_steps_read_the_old_log() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let first = run(&service, submission("dev")).await;
    let (status, view) = service
        .post(
            &format!("/workflows/{first}/rerun"),
            json!({"from": "ship", "vars": {"env": "prod"}}),
        )
        .await;
    assert_eq!(status, 202, "{view}");
    let second = view["id"].as_str().unwrap().to_owned();
    assert_eq!(service.wait_workflow(&second).await["status"], "completed");

    let (status, c) = service
        .get(&format!("/workflows/{first}/compare/{second}"))
        .await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["revisions"], true);
    assert_eq!(c["b"]["revision"], 2);
    assert_eq!(c["b"]["previous_revision"], first.as_str());
    // build was kept: its log is the first revision's, so the same.
    let build = step(&c, "build");
    assert!(build["b"]["kept_from"].is_string(), "{build}");
    assert_eq!(build["change"], "same", "{build}");
    assert_eq!(build["log"]["outcome"], "same");
    let ship = step(&c, "ship");
    assert_eq!(ship["outputs"][0]["key"], "target");
    assert_eq!(ship["log"]["line"], 2);
}

#[tokio::test]
async fn runs_of_different_templates_are_refused_and_unknown_ids_are_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let a = run(&service, submission("dev")).await;
    let b = run(&service, json!({"template": "chain"})).await;

    let (status, body) = service.get(&format!("/workflows/{a}/compare/{b}")).await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`chain`") && message.contains("`cmp`"),
        "{message}"
    );
    assert!(message.contains("only runs of one template"), "{message}");

    let unknown = uuid::Uuid::new_v4();
    let (status, body) = service
        .get(&format!("/workflows/{a}/compare/{unknown}"))
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&unknown.to_string())
    );
    let (status, _) = service
        .get(&format!("/workflows/{unknown}/compare/{a}"))
        .await;
    assert_eq!(status, 404);
    let (status, body) = service.get(&format!("/workflows/{a}/compare/nope")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`nope`")
    );
}

#[test]
fn workflow_diff_prints_what_differs_and_its_json_is_the_api_s_answer() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &[]);
    let ids: Vec<String> = ["dev", "prod"]
        .iter()
        .map(|env| {
            let mut body = submission(env);
            body["wait"] = json!(true);
            let view = crate::cli::submit(&format!("{}/workflows", daemon.url), body);
            assert_eq!(view["status"], "completed", "{view}");
            view["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let output = daemon.cli(&["workflow", "diff", &ids[0], &ids[1]]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("* input"), "{text}");
    assert!(text.contains("env"), "{text}");
    assert!(
        text.contains("* output") && text.contains("ship.target"),
        "{text}"
    );
    assert!(text.contains("* log line 2"), "{text}");
    // Only what differs: the same step and the same input are not listed.
    assert!(!text.contains("build"), "{text}");
    assert!(!text.contains("size"), "{text}");
    assert!(
        text.trim_end()
            .ends_with("1 input differs; 1 of 2 steps differs"),
        "{text}"
    );
    let all = daemon.cli(&["workflow", "diff", "--all", &ids[0], &ids[1]]);
    let all = String::from_utf8(all.stdout).unwrap();
    assert!(all.contains("build") && all.contains("size"), "{all}");

    let json = daemon.cli_json(&["workflow", "diff", &ids[0], &ids[1], "--json"]);
    assert_eq!(json["summary"]["inputs_changed"], 1);
    assert_eq!(json["steps"].as_array().unwrap().len(), 2);

    let refused = daemon.cli(&[
        "workflow",
        "diff",
        &ids[0],
        "7d6c1e0e-0000-4000-8000-000000000000",
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not found"));
}
