//! Operations: `GET /metrics` (parsed as Prometheus text, counters that
//! move), the request id in responses.

use std::collections::{BTreeMap, HashMap};

use serde_json::json;

use crate::harness::{TestService, fixture_settings};

/// One sample of the exposition.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text format (0.0.4) strictly enough to catch a
/// malformed line: `# HELP`/`# TYPE` comments, and samples
/// `name{label="value",...} value`, each of a family that has a `TYPE`.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let mut types: HashMap<String, String> = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix("# ") {
            let mut words = comment.splitn(3, ' ');
            match (words.next(), words.next(), words.next()) {
                (Some("TYPE"), Some(name), Some(kind)) => {
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                        "bad TYPE line: {line}"
                    );
                    assert!(
                        types.insert(name.to_owned(), kind.to_owned()).is_none(),
                        "family {name} typed twice"
                    );
                }
                (Some("HELP"), Some(_), _) => {}
                _ => panic!("bad comment line: {line}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("labels end with }");
                (name, parse_labels(body, line))
            }
        };
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                name.strip_suffix(suffix)
                    .filter(|base| types.get(*base).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample without a TYPE: {line}");
        samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    samples
}

fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut chars = body.chars().peekable();
    while chars.peek().is_some() {
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        assert_eq!(chars.next(), Some('"'), "label value unquoted in {line}");
        let mut value = String::new();
        loop {
            match chars
                .next()
                .unwrap_or_else(|| panic!("unterminated label in {line}"))
            {
                '\\' => value.push(chars.next().expect("escape")),
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key, value);
        if chars.peek() == Some(&',') {
            chars.next();
        }
    }
    labels
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|l| l == v))
        })
        .map(|s| s.value)
        .reduce(|a, b| a + b)
}

async fn scrape(service: &TestService) -> Vec<Sample> {
    let response = service
        .http
        .get(format!("{}/metrics", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    parse_exposition(&response.text().await.unwrap())
}

#[tokio::test]
async fn metrics_parse_as_prometheus_text_and_move() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;

    let before = scrape(&service).await;
    // A fresh store: no workflow in any status, nothing queued or running.
    for status in ["queued", "running", "completed", "failed"] {
        assert_eq!(
            value(&before, "orchestrator_workflows", &[("status", status)]),
            Some(0.0),
            "{status}"
        );
    }
    for priority in ["low", "normal", "high", "critical"] {
        assert_eq!(
            value(
                &before,
                "orchestrator_queue_depth",
                &[("priority", priority)]
            ),
            Some(0.0)
        );
    }
    assert_eq!(value(&before, "orchestrator_tasks_running", &[]), Some(0.0));
    assert_eq!(value(&before, "orchestrator_storage_up", &[]), Some(1.0));
    let script = [("script", "servers/create.nu")];
    let attempts_before =
        value(&before, "orchestrator_task_attempts_total", &script).unwrap_or(0.0);

    // One workflow that completes, one task that fails once and is retried.
    let (status, body) = service
        .post(
            "/workflows/servers/create",
            json!({"infra": "metrics", "servers": ["m-01", "m-02"], "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "completed");
    let task = body["task_ids"][0].as_str().unwrap().to_owned();
    let (status, _) = service.get(&format!("/tasks/{task}")).await;
    assert_eq!(status, 200);
    let (status, _) = service.get("/tasks/not-a-uuid").await;
    assert_eq!(status, 400);

    let after = scrape(&service).await;
    assert_eq!(
        value(&after, "orchestrator_workflows", &[("status", "completed")]),
        Some(1.0)
    );
    let attempts_after = value(&after, "orchestrator_task_attempts_total", &script).unwrap();
    assert!(
        attempts_after >= attempts_before + 2.0,
        "{attempts_before} -> {attempts_after}"
    );
    let completed = [("script", "servers/create.nu"), ("outcome", "completed")];
    assert!(
        value(
            &after,
            "orchestrator_task_duration_seconds_count",
            &completed
        )
        .unwrap()
            >= 2.0
    );
    assert!(
        value(
            &after,
            "orchestrator_task_duration_seconds_bucket",
            &[("script", "servers/create.nu"), ("le", "+Inf")]
        )
        .unwrap()
            >= 2.0
    );
    // HTTP requests by route template and status, never by raw path.
    let by_route = |route: &str, status: &str| {
        value(
            &after,
            "orchestrator_http_requests_total",
            &[("method", "GET"), ("route", route), ("status", status)],
        )
        .unwrap_or(0.0)
    };
    assert!(by_route("/tasks/{id}", "200") >= 1.0);
    assert!(by_route("/tasks/{id}", "400") >= 1.0);
    assert!(
        value(
            &after,
            "orchestrator_http_requests_total",
            &[("route", "/workflows/servers/create"), ("status", "200")]
        )
        .unwrap()
            >= 1.0
    );
    assert!(
        after.iter().all(|s| s
            .labels
            .values()
            .all(|v| !v.contains(&task) && v != "/tasks/not-a-uuid")),
        "a raw path leaked into a label"
    );
    // Storage latency by backend and operation.
    for operation in ["insert_workflow", "update_task", "get_task"] {
        let labels = [("backend", "filesystem"), ("operation", operation)];
        assert!(
            value(
                &after,
                "orchestrator_storage_operation_duration_seconds_count",
                &labels
            )
            .unwrap_or(0.0)
                >= 1.0,
            "{operation}"
        );
    }
    service.stop().await;
}

#[tokio::test]
async fn retries_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let labels = [("script", "servers/create.nu")];
    let before = value(
        &scrape(&service).await,
        "orchestrator_task_retries_total",
        &labels,
    )
    .unwrap_or(0.0);
    // A `fail-*` server fails every attempt (see the fixture script).
    let (status, body) = service
        .post(
            "/workflows/servers/create",
            json!({"infra": "metrics", "servers": ["fail-01"], "max_attempts": 2, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "failed");
    let after = scrape(&service).await;
    assert!(value(&after, "orchestrator_task_retries_total", &labels).unwrap() >= before + 1.0);
    assert!(
        value(
            &after,
            "orchestrator_task_duration_seconds_count",
            &[("script", "servers/create.nu"), ("outcome", "failed")]
        )
        .unwrap()
            >= 1.0
    );
    service.stop().await;
}
