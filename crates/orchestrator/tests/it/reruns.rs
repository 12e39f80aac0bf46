//! Re-running a finished workflow from a step (`POST /workflows/{id}/rerun`):
//! a new revision where upstream steps keep their outputs and never run
//! again, counted by the side effects the scripts leave.

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

/// How many times the fixture script ran under `name` (its run counter).
fn runs(service: &TestService, name: &str) -> usize {
    std::fs::read_to_string(service.state_dir().join("runs").join(name))
        .map_or(0, |s| s.lines().count())
}

fn counts(service: &TestService) -> [usize; 4] {
    ["a", "b", "c", "d"].map(|name| runs(service, name))
}

fn task<'a>(view: &'a Value, step: &str) -> &'a Value {
    view["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"]["ref_name"] == step)
        .unwrap_or_else(|| panic!("no {step} in {view}"))
}

async fn rerun(service: &TestService, id: &str, body: Value) -> Value {
    let (status, view) = service.post(&format!("/workflows/{id}/rerun"), body).await;
    assert_eq!(status, 202, "{view}");
    service.wait_workflow(view["id"].as_str().unwrap()).await
}

#[tokio::test]
async fn a_rerun_runs_the_step_and_its_downstream_again_and_keeps_upstream_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    // chain: a -> b -> c, and d beside them.
    let (status, first) = service
        .post(
            "/workflows",
            json!({"template": "chain", "meta": {"ref": "nightly"}}),
        )
        .await;
    assert_eq!(status, 202, "{first}");
    let first_id = first["id"].as_str().unwrap().to_owned();
    let first = service.wait_workflow(&first_id).await;
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(counts(&service), [1, 1, 1, 1]);

    // From b: b and c (downstream) run again; a and d keep their outputs.
    let second = rerun(&service, &first_id, json!({"from": "b"})).await;
    assert_eq!(second["status"], "completed", "{second}");
    assert_eq!(counts(&service), [1, 2, 2, 1], "a and d ran once in total");
    assert_eq!(second["revision"], 2);
    assert_eq!(second["previous_revision"], first_id);
    assert_eq!(second["reference"], "nightly");
    for step in ["a", "d"] {
        let kept = task(&second, step);
        assert_eq!(kept["status"], "completed");
        assert_eq!(kept["kept_from"], task(&first, step)["id"], "{kept}");
        assert_eq!(kept["output"], task(&first, step)["output"]);
    }
    for step in ["b", "c"] {
        assert!(task(&second, step).get("kept_from").is_none());
    }
    // b read a's kept output.
    assert_eq!(
        task(&second, "b")["input"]["ips"],
        json!(["10.0.0.1", "10.0.0.2"])
    );
    let second_id = second["id"].as_str().unwrap().to_owned();

    // Without its downstream, only b runs; c keeps what it had.
    let third = rerun(
        &service,
        &second_id,
        json!({"from": "b", "include_downstream": false}),
    )
    .await;
    assert_eq!(third["status"], "completed", "{third}");
    assert_eq!(counts(&service), [1, 3, 2, 1]);
    assert_eq!(third["revision"], 3);

    // New inputs reach the steps that run again, checked like a
    // submission's: c fails on purpose this time.
    let fourth = rerun(
        &service,
        third["id"].as_str().unwrap(),
        json!({"from": "c", "vars": {"fail_c": true}}),
    )
    .await;
    assert_eq!(fourth["status"], "failed", "{fourth}");
    assert_eq!(counts(&service), [1, 3, 3, 1]);
    assert_eq!(fourth["vars"]["fail_c"], true);

    // The history keeps every revision, each with its report.
    let (_, listed) = service.get("/workflows?ref=nightly").await;
    let revisions: Vec<u64> = listed["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(revisions, [4, 3, 2, 1]);
    let (_, first_again) = service.get(&format!("/workflows/{first_id}")).await;
    assert_eq!(first_again["status"], "completed");
    assert_eq!(
        first_again["tasks"], first["tasks"],
        "the first revision is untouched"
    );
    service.stop().await;
}

#[tokio::test]
async fn a_rerun_is_refused_while_running_and_names_a_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (status, running) = service
        .post(
            "/workflows",
            json!({"template": "chain", "vars": {"sleep": 2}}),
        )
        .await;
    assert_eq!(status, 202, "{running}");
    let id = running["id"].as_str().unwrap().to_owned();
    let path = format!("/workflows/{id}/rerun");

    let (status, body) = service.post(&path, json!({"from": "b"})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("only a finished workflow can be re-run"),
        "{body}"
    );
    service.wait_workflow(&id).await;

    for (body, field) in [
        (
            json!({"from": "zz"}),
            "from: template `chain` has no step `zz`",
        ),
        (json!({"from": "b", "vars": {"colour": 1}}), "vars.colour:"),
        (
            json!({"from": "b", "vars": {"sleep": "long"}}),
            "vars.sleep:",
        ),
        (
            json!({"from": "b", "vars": {"steps": {"a": {"x": 1}}}}),
            "vars.steps.a: step `a` is not re-run",
        ),
        (json!({"form": "b"}), "form"),
        (json!({}), "from"),
    ] {
        let (status, answer) = service.post(&path, body.clone()).await;
        assert_eq!(status, 422, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    let (status, _) = service
        .post(
            "/workflows/0190f0a0-0000-7000-8000-000000000000/rerun",
            json!({"from": "b"}),
        )
        .await;
    assert_eq!(status, 404);
    service.stop().await;
}
