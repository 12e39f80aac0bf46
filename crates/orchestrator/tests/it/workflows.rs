//! Template workflows over HTTP: dependencies, parallelism, output passing,
//! failure policies, optional steps, retry, cancel, scheduling,
//! idempotency, and validation errors.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

/// A step running the test script `dag/step.py`.
fn step(ref_name: &str, input: Value) -> Value {
    let mut input = input;
    input["name"] = json!(ref_name);
    json!({"ref_name": ref_name, "script": "dag/step.py", "rollback": "dag/undo.py", "input": input})
}

fn inline(on_failure: &str, steps: Vec<Value>) -> Value {
    json!({"name": "t", "ref_name": "t", "schema_version": 1, "on_failure": on_failure, "steps": steps})
}

async fn run(service: &TestService, body: Value) -> Value {
    let (status, view) = service.post("/workflows", body).await;
    assert_eq!(status, 202, "{view}");
    service.wait_workflow(view["id"].as_str().unwrap()).await
}

/// The task of a workflow's step (its first instance), by the step's name.
pub(crate) fn task<'a>(view: &'a Value, name: &str) -> &'a Value {
    view["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["step"]["ref_name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {view}"))
}

/// (start, end) time of each step in the trace.
fn intervals(service: &TestService) -> HashMap<String, (f64, f64)> {
    let mut spans: HashMap<String, (f64, f64)> = HashMap::new();
    for line in service.trace() {
        let parts: Vec<&str> = line.split(' ').collect();
        let time: f64 = parts[2].parse().unwrap();
        let span = spans
            .entry(parts[0].to_owned())
            .or_insert((f64::MAX, f64::MAX));
        match parts[1] {
            "start" => span.0 = span.0.min(time),
            _ => span.1 = time,
        }
    }
    spans
}

fn runs(service: &TestService, name: &str) -> usize {
    std::fs::read_to_string(service.state_dir().join("runs").join(name))
        .map_or(0, |s| s.lines().count())
}

#[tokio::test]
async fn dependencies_order_steps_and_outputs_keep_their_types() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let view = run(
        &service,
        json!({"template": "chain", "vars": {"sleep": 0.3}}),
    )
    .await;
    assert_eq!(view["status"], "completed", "{view}");
    let spans = intervals(&service);
    assert!(spans["a"].1 <= spans["b"].0, "b waits for a (implicit)");
    assert!(spans["b"].1 <= spans["c"].0, "c waits for b (explicit)");
    // a and d are independent branches: each was started (marked running,
    // before its script is spawned) before the other ended. The tasks'
    // own times, not the scripts' trace: on a loaded machine one script
    // may take longer to start than the other takes to run.
    let time = |step: &str, field: &str| -> chrono::DateTime<chrono::Utc> {
        task(&view, step)[field].as_str().unwrap().parse().unwrap()
    };
    assert!(
        time("a", "started_at") < time("d", "finished_at")
            && time("d", "started_at") < time("a", "finished_at"),
        "{view}"
    );

    let b = task(&view, "b");
    assert_eq!(b["input"]["ips"], json!(["10.0.0.1", "10.0.0.2"]));
    assert_eq!(b["input"]["count"], json!(2));
    assert_eq!(b["input"]["zone"], json!("eu"));
    assert_eq!(b["input"]["label"], json!("n=2 in eu"));
    assert_eq!(
        b["output"]["input"]["count"],
        json!(2),
        "the script saw a number"
    );

    // The view has steps, edges and per-step status.
    let edges = view["edges"].as_array().unwrap();
    let id = |n: &str| task(&view, n)["id"].clone();
    assert!(edges.contains(&json!([id("a"), id("b")])));
    assert!(edges.contains(&json!([id("b"), id("c")])));
    assert_eq!(view["steps"].as_array().unwrap().len(), 4);
    assert!(
        view["steps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s["status"] == "completed")
    );
    service.stop().await;
}

#[tokio::test]
async fn for_each_steps_fan_out_and_a_join_consumes_every_output() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let template = json!({
        "name": "fan", "ref_name": "fan", "schema_version": 1,
        "inputs": {"hosts": {"type": "array"}},
        "steps": [
            {"ref_name": "vm", "script": "dag/step.py", "for_each": {"host": "${workflow.input.hosts}"},
             "input": {"name": "vm-${each.host}", "sleep": 0.5, "output": {"ip": "10.1.0.${each.host}"}}},
            {"ref_name": "configure", "script": "dag/step.py", "for_each": {"host": "${workflow.input.hosts}"},
             "input": {"name": "cfg-${each.host}", "ip": "${vm.output.ip}"}},
            {"ref_name": "join", "script": "dag/step.py", "input": {"name": "join", "ips": "${vm.output.ip}"}}
        ]
    });
    let view = run(
        &service,
        json!({"template": template, "vars": {"hosts": [1, 2, 3]}}),
    )
    .await;
    assert_eq!(view["status"], "completed", "{view}");
    let spans = intervals(&service);
    // Three VMs of 0.5 s each ran side by side (4 workers).
    assert!(
        spans["vm-1"].0 < spans["vm-3"].1 && spans["vm-3"].0 < spans["vm-1"].1,
        "{spans:?}"
    );
    let tasks = view["tasks"].as_array().unwrap();
    let cfg2 = tasks
        .iter()
        .find(|t| t["input"]["name"] == "cfg-2")
        .unwrap();
    assert_eq!(
        cfg2["input"]["ip"], "10.1.0.2",
        "each instance gets its own VM's output"
    );
    let join = tasks.iter().find(|t| t["input"]["name"] == "join").unwrap();
    assert_eq!(
        join["input"]["ips"],
        json!(["10.1.0.1", "10.1.0.2", "10.1.0.3"])
    );
    service.stop().await;
}

#[tokio::test]
async fn policy_fail_lets_running_steps_finish_and_starts_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let template = inline(
        "fail",
        vec![
            step("bad", json!({"fail": true})),
            step("slow", json!({"sleep": 1})),
            json!({"ref_name": "after", "script": "dag/step.py", "depends_on": ["slow"], "input": {"name": "after"}}),
        ],
    );
    let view = run(&service, json!({"template": template, "max_attempts": 1})).await;
    assert_eq!(view["status"], "failed");
    assert_eq!(task(&view, "bad")["status"], "failed");
    assert_eq!(
        task(&view, "slow")["status"],
        "completed",
        "running steps finish"
    );
    assert_eq!(task(&view, "after")["status"], "not_started");
    assert!(view["halt"]["reason"].as_str().unwrap().contains("bad"));
    assert_eq!(runs(&service, "after"), 0);
    service.stop().await;
}

#[tokio::test]
async fn policy_continue_runs_everything_that_does_not_depend_on_the_failure() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let template = inline(
        "continue",
        vec![
            step("bad", json!({"fail": true})),
            json!({"ref_name": "needs_bad", "script": "dag/step.py", "depends_on": ["bad"], "input": {"name": "needs_bad"}}),
            step("other", json!({"sleep": 0.2})),
            json!({"ref_name": "after_other", "script": "dag/step.py", "depends_on": ["other"], "input": {"name": "after_other"}}),
        ],
    );
    let view = run(&service, json!({"template": template, "max_attempts": 1})).await;
    assert_eq!(view["status"], "failed");
    assert_eq!(task(&view, "needs_bad")["status"], "skipped");
    assert_eq!(task(&view, "after_other")["status"], "completed");
    service.stop().await;
}

#[tokio::test]
async fn policy_rollback_undoes_completed_steps_in_reverse_order() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let view = run(&service, json!({"template": {
        "name": "rb", "ref_name": "rb", "schema_version": 1, "on_failure": "rollback",
        "steps": [
            step("net", json!({})),
            {"ref_name": "vm", "script": "dag/step.py", "rollback": "dag/undo.py", "depends_on": ["net"], "input": {"name": "vm"}},
            {"ref_name": "dns", "script": "dag/step.py", "rollback": "dag/undo.py", "depends_on": ["vm"], "input": {"name": "dns"}},
            {"ref_name": "app", "script": "dag/step.py", "depends_on": ["dns"], "input": {"name": "app", "fail": true}}
        ]
    }, "max_attempts": 1})).await;
    assert_eq!(view["status"], "failed", "{view}");
    let undo: Vec<String> = service
        .trace()
        .into_iter()
        .filter(|l| l.starts_with("undo-"))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(undo, ["undo-dns", "undo-vm", "undo-net"]);
    let rollbacks: Vec<&Value> = view["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["step"]["rollback_of"].is_string())
        .collect();
    assert_eq!(rollbacks.len(), 3);
    assert!(
        rollbacks
            .iter()
            .all(|t| t["status"] == "completed" && t["output"]["had_output"] == true)
    );
    service.stop().await;
}

#[tokio::test]
async fn an_optional_step_may_fail_without_failing_the_workflow() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let mut flaky = step("flaky", json!({"fail": true}));
    flaky["optional"] = json!(true);
    let template = inline(
        "fail",
        vec![
            flaky,
            json!({"ref_name": "next", "script": "dag/step.py", "input": {"name": "next", "seen": "${flaky.output}"}}),
        ],
    );
    let view = run(&service, json!({"template": template, "max_attempts": 1})).await;
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(task(&view, "flaky")["status"], "failed");
    assert_eq!(task(&view, "next")["status"], "completed");
    assert_eq!(
        task(&view, "next")["input"]["seen"],
        Value::Null,
        "a failed optional step has no output"
    );
    service.stop().await;
}

#[tokio::test]
async fn retry_reruns_only_what_did_not_complete() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    // In the scripts' state dir: what a sandboxed script can see.
    let gate = service.state_dir().join("gate");
    let view = run(
        &service,
        json!({"template": "chain", "vars": {"gate": gate.display().to_string()}}),
    )
    .await;
    assert_eq!(view["status"], "failed", "{view}");
    assert_eq!(task(&view, "c")["status"], "failed");
    assert_eq!(
        (
            runs(&service, "a"),
            runs(&service, "b"),
            runs(&service, "c")
        ),
        (1, 1, 1)
    );
    let a_output = task(&view, "a")["output"].clone();

    std::fs::write(&gate, "").unwrap();
    let (status, retried) = service
        .post(
            &format!("/workflows/{}/retry", view["id"].as_str().unwrap()),
            json!(null),
        )
        .await;
    assert_eq!(status, 200, "{retried}");
    let view = service.wait_workflow(view["id"].as_str().unwrap()).await;
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(
        (
            runs(&service, "a"),
            runs(&service, "b"),
            runs(&service, "c")
        ),
        (1, 1, 2),
        "only c ran again"
    );
    assert_eq!(
        task(&view, "a")["output"],
        a_output,
        "completed steps keep their outputs"
    );
    assert_eq!(task(&view, "c")["reruns"], 1);

    let (status, body) = service
        .post(
            &format!("/workflows/{}/retry", view["id"].as_str().unwrap()),
            json!(null),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    service.stop().await;
}

#[tokio::test]
async fn cancel_stops_running_steps_and_prevents_pending_ones() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let template = inline(
        "fail",
        vec![
            step("long", json!({"sleep": 60})),
            json!({"ref_name": "later", "script": "dag/step.py", "depends_on": ["long"], "input": {"name": "later"}}),
        ],
    );
    let (_, view) = service
        .post("/workflows", json!({"template": template}))
        .await;
    let id = view["id"].as_str().unwrap().to_owned();
    let long_id = task(&view, "long")["id"].as_str().unwrap().to_owned();
    service
        .wait_task(&long_id, |t| t["status"] == "running")
        .await;
    let (status, body) = service
        .post(&format!("/workflows/{id}/cancel"), json!(null))
        .await;
    assert_eq!(status, 200, "{body}");
    let view = service.wait_workflow(&id).await;
    assert_eq!(view["status"], "cancelled");
    assert_eq!(task(&view, "long")["status"], "cancelled");
    assert_eq!(task(&view, "later")["status"], "not_started");
    let (status, _) = service
        .post(&format!("/workflows/{id}/cancel"), json!(null))
        .await;
    assert_eq!(status, 409);
    service.stop().await;
}

#[tokio::test]
async fn a_scheduled_workflow_starts_at_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let start = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let (status, view) = service
        .post(
            "/workflows",
            json!({"template": inline("fail", vec![step("s", json!({}))]),
                                    "schedule": {"when": "at", "start": start.to_rfc3339()}}),
        )
        .await;
    assert_eq!(status, 202, "{view}");
    assert_eq!(view["status"], "scheduled");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(runs(&service, "s"), 0, "nothing runs before the start");
    let view = service.wait_workflow(view["id"].as_str().unwrap()).await;
    assert_eq!(view["status"], "completed");
    let started: chrono::DateTime<chrono::Utc> = task(&view, "s")["started_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(started >= start, "{started} < {start}");
    service.stop().await;
}

#[tokio::test]
async fn parallel_limit_bounds_a_workflow() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let template = inline(
        "fail",
        vec![
            step("p1", json!({"sleep": 0.3})),
            step("p2", json!({"sleep": 0.3})),
            step("p3", json!({"sleep": 0.3})),
        ],
    );
    let view = run(&service, json!({"template": template, "parallel_limit": 1})).await;
    assert_eq!(view["status"], "completed");
    let mut spans: Vec<(f64, f64)> = intervals(&service).into_values().collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    for pair in spans.windows(2) {
        assert!(pair[0].1 <= pair[1].0, "steps overlapped: {spans:?}");
    }
    service.stop().await;
}

#[tokio::test]
async fn resubmissions_are_idempotent_and_changes_make_revisions() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let body = json!({"template": "chain", "vars": {"sleep": 0}});
    let post_with_key = |key: &'static str, body: Value| {
        let service = &service;
        async move {
            let response = service
                .http
                .post(format!("{}/workflows", service.base))
                .header("Idempotency-Key", key)
                .json(&body)
                .send()
                .await
                .unwrap();
            let replayed = response.headers().get("idempotent-replayed").is_some();
            (
                response.status().as_u16(),
                replayed,
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let (s1, r1, first) = post_with_key("k-1", body.clone()).await;
    let (s2, r2, again) = post_with_key("k-1", body.clone()).await;
    assert_eq!((s1, r1, s2, r2), (202, false, 200, true));
    assert_eq!(first["id"], again["id"]);
    let (s3, _, clash) =
        post_with_key("k-1", json!({"template": "chain", "vars": {"sleep": 1}})).await;
    assert_eq!(s3, 409, "{clash}");

    let with_ref = |sleep: f64| json!({"template": "chain", "vars": {"sleep": sleep}, "meta": {"ref": "deploy-42", "trace_id": "t-1"}});
    let (_, one) = service.post("/workflows", with_ref(0.0)).await;
    let (status, same) = service.post("/workflows", with_ref(0.0)).await;
    assert_eq!(status, 200);
    assert_eq!(same["id"], one["id"]);
    let (status, two) = service.post("/workflows", with_ref(0.1)).await;
    assert_eq!(status, 202);
    assert_eq!(two["revision"], 2);
    assert_eq!(two["previous_revision"], one["id"]);
    let (_, listed) = service.get("/workflows?ref=deploy-42").await;
    assert_eq!(listed["total"], 2);
    let (_, traced) = service.get("/workflows?trace_id=t-1&template=chain").await;
    assert_eq!(traced["total"], 2);
    for id in [&first["id"], &one["id"], &two["id"]] {
        service.wait_workflow(id.as_str().unwrap()).await;
    }
    let (_, completed) = service.get("/workflows?status=completed").await;
    assert_eq!(completed["total"], 3);
    service.stop().await;
}

/// `q` finds workflows by a piece of their name, template, reference or
/// an input value, in any case, with the other filters and in the counts;
/// an over-long or control-character search is refused, naming `q`.
#[tokio::test]
async fn the_list_searches_names_templates_references_and_input_values() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let submit = |body: Value| {
        let service = &service;
        async move {
            let (status, view) = service.post("/workflows", body).await;
            assert_eq!(status, 202, "{view}");
            view["id"].as_str().unwrap().to_owned()
        }
    };
    let nightly = submit(json!({"template": "chain", "vars": {"sleep": 0.125},
        "meta": {"name": "Nightly Rebuild", "ref": "search-ref-one"}}))
    .await;
    let other = submit(json!({"template": "chain", "vars": {"sleep": 0},
        "meta": {"name": "other", "ref": "Search-Ref-Two"}}))
    .await;
    for id in [&nightly, &other] {
        service.wait_workflow(id).await;
    }
    let ids = |listed: &Value| -> Vec<String> {
        listed["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["id"].as_str().unwrap().to_owned())
            .collect()
    };
    for (q, expected) in [
        ("nightly%20REBUILD", vec![nightly.clone()]),
        ("SEARCH-REF-two", vec![other.clone()]),
        ("search-ref", vec![other.clone(), nightly.clone()]),
        ("0.125", vec![nightly.clone()]),
        ("CHAIN", vec![other.clone(), nightly.clone()]),
        ("no-such-text", vec![]),
    ] {
        let (status, listed) = service.get(&format!("/workflows?q={q}")).await;
        assert_eq!(status, 200, "{listed}");
        assert_eq!(ids(&listed), expected, "q={q}");
        assert_eq!(listed["total"], expected.len(), "q={q}");
    }
    // With the other filters, and in the counts.
    let (_, both) = service
        .get("/workflows?q=search-ref&ref=search-ref-one")
        .await;
    assert_eq!(ids(&both), vec![nightly.clone()]);
    let (_, counts) = service.get("/workflows/counts?q=nightly").await;
    assert_eq!(counts["total"], 1);
    assert_eq!(counts["counts"]["completed"], 1);
    // Blank is no filter.
    let (_, blank) = service.get("/workflows?q=%20%20").await;
    assert_eq!(blank["total"], 2);
    // Refused, naming the parameter.
    let (status, long) = service
        .get(&format!("/workflows?q={}", "x".repeat(201)))
        .await;
    assert_eq!(status, 400);
    assert_eq!(
        long["error"]["message"],
        "q: 201 characters is more than the maximum of 200"
    );
    let (status, control) = service.get("/workflows/counts?q=a%0Ab").await;
    assert_eq!(status, 400);
    assert_eq!(
        control["error"]["message"],
        "q: the control character '\\n' is not allowed"
    );
    service.stop().await;
}

/// The exact rule of docs/api.md: a key seen before decides alone; an
/// unseen key falls through to `meta.ref`, which compares with the newest
/// revision only.
#[tokio::test]
async fn a_key_decides_first_and_a_ref_compares_with_its_newest_revision_only() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let body =
        |sleep: f64| json!({"template": "chain", "vars": {"sleep": sleep}, "meta": {"ref": "r-1"}});
    let post = |key: Option<&'static str>, body: Value| {
        let service = &service;
        async move {
            let mut request = service.http.post(format!("{}/workflows", service.base));
            if let Some(key) = key {
                request = request.header("Idempotency-Key", key);
            }
            let response = request.json(&body).send().await.unwrap();
            (
                response.status().as_u16(),
                response.json::<Value>().await.unwrap(),
            )
        }
    };
    let (status, a) = post(Some("k-a"), body(0.0)).await;
    assert_eq!(status, 202, "{a}");
    let (status, b) = post(None, body(0.01)).await;
    assert_eq!((status, b["revision"].as_u64()), (202, Some(2)), "{b}");
    // A's body again, under A's key: the key decides, and names A,
    // although A is no longer the newest revision.
    let (status, replay) = post(Some("k-a"), body(0.0)).await;
    assert_eq!((status, &replay["id"]), (200, &a["id"]), "{replay}");
    // A's body again without a key: compared with the newest revision (B)
    // only, so it is a change: revision 3.
    let (status, c) = post(None, body(0.0)).await;
    assert_eq!((status, c["revision"].as_u64()), (202, Some(3)), "{c}");
    assert_eq!(c["previous_revision"], b["id"]);
    // A new key with the newest revision's body: no key matches, the ref
    // does, so it repeats revision 3; the new key is not recorded.
    let (status, same) = post(Some("k-new"), body(0.0)).await;
    assert_eq!((status, &same["id"]), (200, &c["id"]), "{same}");
    let (_, by_key) = service.get("/workflows?limit=10").await;
    assert_eq!(by_key["total"], 3, "{by_key}");
    // A known key with another body is a conflict, whatever the ref says.
    let (status, clash) = post(Some("k-a"), body(0.02)).await;
    assert_eq!(status, 409, "{clash}");
    for id in [&a["id"], &b["id"], &c["id"]] {
        service.wait_workflow(id.as_str().unwrap()).await;
    }
    service.stop().await;
}

#[tokio::test]
async fn invalid_submissions_are_422_naming_the_step_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let cases: Vec<(Value, &str)> = vec![
        (json!({"template": "nope"}), "unknown template `nope`"),
        (
            json!({"template": "chain", "vars": {"sleep": "slow"}}),
            "vars.sleep: expected a number",
        ),
        (
            json!({"template": "chain", "vars": {"nope": 1}}),
            "vars.nope",
        ),
        (
            json!({"template": "chain", "vars": {"steps": {"zz": {}}}}),
            "vars.steps.zz",
        ),
        (
            json!({"template": "chain", "schedule": {"when": "later"}}),
            "schedule",
        ),
        (
            json!({"template": inline("fail", vec![step("a", json!({})), step("a", json!({}))])}),
            "steps[1].ref_name",
        ),
        (
            json!({"template": inline("fail", vec![
            json!({"ref_name": "a", "script": "dag/step.py", "depends_on": ["b"]}),
            json!({"ref_name": "b", "script": "dag/step.py", "input": {"x": "${a.output.y}"}})])}),
            "a -> b -> a",
        ),
        (
            json!({"template": inline("fail", vec![json!({"ref_name": "a", "script": "dag/step.py", "input": {"x": "${ghost.output}"}})])}),
            "steps.a.input.x",
        ),
        (
            json!({"template": inline("fail", vec![json!({"ref_name": "a", "script": "dag/step.py", "input": {"x": "${workflow.input.nope}"}})])}),
            "`nope`",
        ),
        (
            json!({"template": inline("fail", vec![json!({"ref_name": "a", "script": "dag/missing.py"})])}),
            "template.steps.a.script",
        ),
        (
            json!({"template": inline("fail", vec![json!({"ref_name": "a", "script": "../../etc/passwd"})])}),
            "must not contain `..`",
        ),
        (
            json!({"template": inline("fail", vec![json!({"ref_name": "a", "script": "dag/step.py", "depends_on": ["zz"]})])}),
            "steps.a.depends_on[0]",
        ),
        (
            json!({"template": {"name": "t", "ref_name": "t", "schema_version": 1, "steps": [{"ref_name": "a"}]}}),
            "template",
        ),
    ];
    for (body, mentions) in cases {
        let (status, answer) = service.post("/workflows", body.clone()).await;
        assert_eq!(status, 422, "{body} -> {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(mentions),
            "`{message}` should mention `{mentions}`"
        );
        let (status, _) = service.post("/workflows/validate", body).await;
        assert_eq!(status, 422);
    }
    assert_eq!(
        service.get("/workflows").await.1["total"],
        0,
        "nothing was created"
    );
    service.stop().await;
}

#[tokio::test]
async fn templates_are_listed_and_validate_shows_the_dag_without_running() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (_, list) = service.get("/templates").await;
    let names: Vec<&str> = list["templates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["ref_name"].as_str().unwrap())
        .collect();
    for expected in [
        "chain",
        "cluster-create",
        "servers-create",
        "taskserv-create",
    ] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let (status, chain) = service.get("/templates/chain").await;
    assert_eq!(status, 200);
    assert_eq!(chain["steps"].as_array().unwrap().len(), 4);
    assert_eq!(service.get("/templates/nope").await.0, 404);

    let (status, planned) = service
        .post("/workflows/validate", json!({"template": "cluster-create", "vars": {"infra": "p", "cluster": "k", "servers": ["a", "b"], "taskservs": ["x"]}}))
        .await;
    assert_eq!(status, 200, "{planned}");
    assert_eq!(planned["valid"], true);
    assert_eq!(planned["workflow"]["tasks"].as_array().unwrap().len(), 5);
    assert_eq!(
        planned["workflow"]["edges"].as_array().unwrap().len(),
        4 + 2,
        "{planned}"
    );
    assert_eq!(service.get("/workflows").await.1["total"], 0);
    service.stop().await;
}
