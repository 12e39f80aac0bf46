//! Bounded work per request: a submission over a limit is refused with a
//! 4xx naming the limit (counted before anything is built), on every
//! route that expands a template; numbers out of range are refused naming
//! the field; and a large allowed submission does not stop `/health`.

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

const ADMIN: &str = "bootstrap-admin-token-for-the-limits-tests-0123456789";

async fn start() -> (tempfile::TempDir, TestService) {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.auth = true;
    settings.rate_limit = 0;
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(ADMIN));
    let service = TestService::start(settings).await;
    (dir, service)
}

/// One request with a bearer token: (status, body).
async fn call(
    service: &TestService,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: &Value,
) -> (u16, Value) {
    let response = service
        .http
        .request(method, format!("{}{path}", service.base))
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn post(service: &TestService, path: &str, token: &str, body: &Value) -> (u16, Value) {
    call(service, reqwest::Method::POST, path, token, body).await
}

async fn token(service: &TestService, role: &str) -> String {
    let (status, body) = post(
        service,
        "/tokens",
        ADMIN,
        &json!({"name": format!("a-{role}"), "role": role}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    body["token"].as_str().unwrap().to_owned()
}

/// Polls a workflow until it has finished (or panics after a minute).
async fn wait_finished(service: &TestService, token: &str, id: &str) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (status, workflow) = call(
            service,
            reqwest::Method::GET,
            &format!("/workflows/{id}"),
            token,
            &Value::Null,
        )
        .await;
        assert_eq!(status, 200, "{workflow}");
        if matches!(
            workflow["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workflow never finished: {workflow}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// A template whose one step runs once per combination of three lists.
fn three_lists() -> Value {
    json!({
        "name": "fan out", "ref_name": "fan-out", "schema_version": 1,
        "inputs": {"a": {"type": "array"}, "b": {"type": "array"}, "c": {"type": "array"}},
        "steps": [{
            "ref_name": "deploy", "script": "servers/create.nu",
            "for_each": {"a": "${workflow.input.a}", "b": "${workflow.input.b}", "c": "${workflow.input.c}"}
        }]
    })
}

fn lists_of(n: usize) -> Value {
    let list: Vec<usize> = (0..n).collect();
    json!({"a": list, "b": list, "c": list})
}

/// A 4xx whose message names the field, the computed number and the
/// limit with its setting.
#[track_caller]
fn assert_refused(status: u16, answer: &Value, parts: &[&str]) {
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    for part in parts {
        assert!(message.contains(part), "`{message}` lacks `{part}`");
    }
}

const INSTANCES_REFUSED: [&str; 2] = [
    "steps.deploy.for_each: 27000000 instances",
    "exceed the limit of 1000 per step (--max-step-instances)",
];

#[tokio::test]
async fn a_viewer_s_validation_of_three_lists_of_300_is_refused_naming_the_limit() {
    let (_dir, service) = start().await;
    let viewer = token(&service, "viewer").await;
    let body = json!({"template": three_lists(), "vars": lists_of(300)});
    let (status, answer) = post(&service, "/workflows/validate", &viewer, &body).await;
    assert_refused(status, &answer, &INSTANCES_REFUSED);
    // The service is whole, and answers.
    let (status, _) = service.get("/health").await;
    assert_eq!(status, 200);
    service.stop().await;
}

#[tokio::test]
async fn submissions_reruns_schedules_and_built_ins_over_a_limit_are_refused() {
    let (_dir, service) = start().await;
    let operator = token(&service, "operator").await;

    // POST /workflows.
    let body = json!({"template": three_lists(), "vars": lists_of(300)});
    let (status, answer) = post(&service, "/workflows", &operator, &body).await;
    assert_refused(status, &answer, &INSTANCES_REFUSED);

    // A rerun whose new inputs make the same expansion.
    let body = json!({"template": three_lists(), "vars": lists_of(1)});
    let (status, submitted) = post(&service, "/workflows", &operator, &body).await;
    assert_eq!(status, 202, "{submitted}");
    let id = submitted["id"].as_str().unwrap().to_owned();
    wait_finished(&service, &operator, &id).await;
    let (status, answer) = post(
        &service,
        &format!("/workflows/{id}/rerun"),
        &operator,
        &json!({"from": "deploy", "vars": lists_of(300)}),
    )
    .await;
    assert_refused(status, &answer, &INSTANCES_REFUSED);

    // A schedule (of a registered template), created or changed.
    let servers: Vec<String> = (0..1001).map(|i| format!("s{i}")).collect();
    let too_many = json!({"infra": "p", "servers": servers});
    let (status, answer) = post(
        &service,
        "/schedules",
        &operator,
        &json!({"template": "servers-create", "cron": "0 2 * * *", "vars": too_many}),
    )
    .await;
    assert_refused(
        status,
        &answer,
        &["vars.servers: 1001 items exceed the limit of 1000 per list (--max-list-items)"],
    );
    let (status, created) = post(
        &service,
        "/schedules",
        &operator,
        &json!({"template": "servers-create", "cron": "0 2 * * *", "vars": {"infra": "p", "servers": ["ok-1"]}}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let (status, answer) = call(
        &service,
        reqwest::Method::PATCH,
        &format!("/schedules/{}", created["id"].as_str().unwrap()),
        &operator,
        &json!({"vars": too_many}),
    )
    .await;
    assert_refused(
        status,
        &answer,
        &["vars.servers: 1001 items", "--max-list-items"],
    );

    // A built-in route with 200,000 names, counted before any is checked.
    // The body is built as text: other tests in this process measure
    // memory.
    let names: Vec<String> = (0..200_000).map(|i| format!("\"s{i}\"")).collect();
    let body = format!(r#"{{"infra": "p", "servers": [{}]}}"#, names.join(","));
    drop(names);
    let response = service
        .http
        .post(format!("{}/workflows/servers/create", service.base))
        .bearer_auth(&operator)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let answer: Value = response.json().await.unwrap();
    assert_refused(
        status,
        &answer,
        &["servers: 200000 items exceed the limit of 1000 per list (--max-list-items)"],
    );
    service.stop().await;
}

#[tokio::test]
async fn a_timeout_past_its_range_is_refused_naming_the_field() {
    let (_dir, service) = start().await;
    let operator = token(&service, "operator").await;
    let template = json!({
        "name": "t", "ref_name": "t", "schema_version": 1,
        "steps": [{"ref_name": "boom", "script": "servers/create.nu", "timeout": u64::MAX}]
    });
    let (status, answer) = post(
        &service,
        "/workflows",
        &operator,
        &json!({"template": template}),
    )
    .await;
    assert_refused(
        status,
        &answer,
        &[
            "template.steps.boom.timeout: 18446744073709551615 is longer than the maximum of 2592000 seconds",
        ],
    );
    // The options of a submission too.
    for (option, value, field) in [
        (
            "timeout_secs",
            json!(2_592_001),
            "timeout_secs: 2592001 is out of range",
        ),
        (
            "parallel_limit",
            json!(100_001),
            "parallel_limit: 100001 is out of range",
        ),
        (
            "max_attempts",
            json!(101),
            "max_attempts: 101 is out of range",
        ),
    ] {
        let mut body =
            json!({"template": "servers-create", "vars": {"infra": "p", "servers": ["ok-1"]}});
        body[option] = value;
        let (status, answer) = post(&service, "/workflows", &operator, &body).await;
        assert_refused(status, &answer, &[field]);
    }
    service.stop().await;
}

/// Planning runs off the async workers: while large (allowed) submissions
/// expand, `/health` keeps answering. Counted by answers, not by time:
/// many health checks must be answered before any of the expansions ends.
#[tokio::test]
async fn health_answers_while_a_large_submission_expands() {
    let (_dir, service) = start().await;
    let viewer = token(&service, "viewer").await;
    // A chain of 5 steps of 1,000 instances each, each instance matched
    // against those of the step before: much work, few tasks (memory
    // other tests in this process measure).
    let steps: Vec<Value> = (0..5)
        .map(|i| {
            let mut step = json!({"ref_name": format!("s{i}"), "script": "servers/create.nu", "for_each": {"x": "${workflow.input.xs}"}});
            if i > 0 {
                step["depends_on"] = json!([format!("s{}", i - 1)]);
            }
            step
        })
        .collect();
    let template = json!({
        "name": "large", "ref_name": "large", "schema_version": 1,
        "inputs": {"xs": {"type": "array"}}, "steps": steps,
    });
    let xs: Vec<usize> = (0..1000).collect();
    let body = json!({"template": template, "vars": {"xs": xs}});
    // As many expansions as the runtime has threads (a test's runtime has
    // one), so that expanding on them would leave none for `/health`.
    let expansions: Vec<_> = (0..1)
        .map(|_| {
            let (base, http, viewer, body) = (
                service.base.clone(),
                service.http.clone(),
                viewer.clone(),
                body.to_string(),
            );
            tokio::spawn(async move {
                http.post(format!("{base}/workflows/validate"))
                    .bearer_auth(viewer)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut answered = 0;
    while answered < 20 {
        assert!(
            expansions.iter().all(|e| !e.is_finished()),
            "an expansion ended before /health answered 20 times (it answered {answered})"
        );
        let (status, _) = service.get("/health").await;
        assert_eq!(status, 200);
        answered += 1;
    }
    for expansion in expansions {
        assert_eq!(
            expansion.await.unwrap(),
            200,
            "the large submission is valid"
        );
    }
    service.stop().await;
}
