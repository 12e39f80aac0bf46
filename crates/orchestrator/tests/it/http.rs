//! `kind: http` steps against real HTTP servers on loopback: the fake AWX
//! and Terraform Cloud of `fakes.rs`, and a second real orchestrator as
//! the tier-1 target. Launch, poll, outputs, failures, timeouts and
//! cancels, the allowlist, secrets, and a launch that stays single across
//! `kill -9` and a node takeover.

use std::path::Path;
use std::time::Duration;

use orchestrator::settings::ServeSettings;
use serde_json::{Value, json};

use crate::cli::{Daemon, submit};
use crate::fakes::{Fake, Flavor, Plan};
use crate::faults::wait_for_workflows;
use crate::harness::{TestService, fixture_settings, real_scripts};
use crate::workflows::task;
use orchestrator_storage::faults::{FaultyBackend, TaskMove};

/// The test service's settings, allowing the given ports on loopback.
fn allowing(data_dir: &Path, ports: &[u16]) -> ServeSettings {
    let mut settings = fixture_settings(data_dir);
    settings.http_allow =
        orchestrator_http::Allowlist::parse(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .unwrap();
    settings
}

/// An http step that drives the fake AWX at `base`: job template 7 with
/// the workflow's `env` as extra vars, polled every 100 ms.
fn awx_step(base: &str) -> Value {
    json!({
        "ref_name": "awx",
        "kind": "http",
        "retries": 0,
        "http": {
            "launch": {
                "url": format!("{base}/api/v2/job_templates/7/launch/"),
                "body": {"extra_vars": {"env": "${workflow.input.env}"}},
                "expect": [201]
            },
            "job_id": "/job",
            "poll": {
                "url": format!("{base}/api/v2/jobs/${{job.id}}/"),
                "interval": "100ms",
                "status": "/status",
                "status_map": {
                    "success": ["successful"],
                    "running": ["new", "pending", "waiting", "running"],
                    "failure": ["failed", "error", "canceled"]
                }
            },
            "outputs": {"vm_ips": "/artifacts/vm_ips"},
            "cancel": {"url": format!("{base}/api/v2/jobs/${{job.id}}/cancel/"), "expect": [202]}
        }
    })
}

/// A script step after `awx` that receives its output.
fn report_step() -> Value {
    json!({
        "ref_name": "report",
        "script": "dag/step.py",
        "input": {"name": "report", "ips": "${awx.output.vm_ips}"}
    })
}

/// A submission of an inline template with these steps and an `env` input.
fn submission(steps: Vec<Value>) -> Value {
    json!({
        "template": {
            "name": "drive AWX", "ref_name": "drive-awx", "schema_version": 1,
            "inputs": {"env": {"type": "string", "default": "staging"}},
            "steps": steps
        }
    })
}

async fn submit_async(service: &TestService, body: Value) -> String {
    let (status, created) = service.post("/workflows", body).await;
    assert_eq!(status, 202, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

/// Stores a secret that the registered `templates` may use and send to
/// `origins`.
async fn put_secret(
    service: &TestService,
    name: &str,
    value: &str,
    templates: &[&str],
    origins: &[&str],
) {
    let response = service
        .http
        .put(format!("{}/secrets/{name}", service.base))
        .json(&json!({"value": value, "templates": templates, "origins": origins}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
}

/// A finished `awx` → `report` workflow, with the fake AWX it drove and
/// the service that ran it.
struct Run {
    fake: Fake,
    service: TestService,
    view: Value,
    _dir: tempfile::TempDir,
}

/// Runs `awx` → `report` against a fake AWX whose job follows `plan`.
async fn awx_then_report(plan: Plan) -> Run {
    let fake = Fake::start(Flavor::Awx, plan);
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(allowing(dir.path(), &[fake.port])).await;
    let id = submit_async(
        &service,
        submission(vec![awx_step(&fake.base), report_step()]),
    )
    .await;
    let view = service.wait_workflow(&id).await;
    Run {
        fake,
        service,
        view,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_job_is_launched_once_polled_to_success_and_its_outputs_feed_the_next_step() {
    let Run {
        fake,
        service,
        view,
        _dir,
    } = awx_then_report(Plan::ending("successful", Duration::from_millis(300))).await;
    assert_eq!(view["status"], "completed", "{view}");

    let awx = task(&view, "awx");
    assert_eq!(awx["script"], "http:awx");
    assert_eq!(awx["output"], json!({"vm_ips": ["10.1.0.11", "10.1.0.12"]}));
    assert_eq!(
        task(&view, "report")["output"]["input"]["ips"],
        json!(["10.1.0.11", "10.1.0.12"])
    );
    // The workflow's outputs by step, as a caller one level up reads them.
    assert_eq!(view["outputs"]["awx"]["vm_ips"][1], "10.1.0.12");

    assert_eq!(fake.launches(), 1);
    let launch = fake.seen(|s| s.launches[0].clone());
    assert_eq!(launch.body, json!({"extra_vars": {"env": "staging"}}));
    // The key rides on the launch, and was saved before it; the job id
    // after it.
    let checkpoint = &awx["checkpoint"];
    assert_eq!(checkpoint["job_id"], 1);
    assert_eq!(
        launch.idempotency_key.as_deref(),
        checkpoint["launch_key"].as_str()
    );
    assert!(fake.seen(|s| s.polls_of("1")) >= 2, "pending, then success");

    let (_, log) = service
        .get_text(&format!("/tasks/{}/logs", awx["id"].as_str().unwrap()))
        .await;
    for line in [
        &format!("> POST {}/api/v2/job_templates/7/launch/", fake.base),
        "headers: accept, content-type, idempotency-key",
        "< 201 Created",
        "job 1 launched; its id is saved as the task's checkpoint",
        &format!("> GET {}/api/v2/jobs/1/", fake.base),
        "job 1 is `pending`",
        "job 1 ended `successful`",
    ] {
        assert!(log.contains(line), "the log lacks {line:?}:\n{log}");
    }
    service.stop().await;
}

/// Storage that commits a checkpoint write and then reports an error (the
/// answer lost after the commit), first for the launch key, then for the
/// job id. Each of those attempts fails; the next one reads what was
/// committed after all, and the job is launched once.
#[tokio::test]
async fn ambiguous_checkpoint_writes_never_launch_a_job_twice() {
    let fake = Fake::start(
        Flavor::Awx,
        Plan::ending("successful", Duration::from_millis(200)),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut switch = None;
    let service = TestService::start_with_store(allowing(dir.path(), &[fake.port]), |storage| {
        let (storage, faults) = FaultyBackend::wrap(storage);
        faults.ambiguous(TaskMove::Checkpoint, 2);
        switch = Some(faults);
        storage
    })
    .await;
    let faults = switch.unwrap();
    let mut awx = awx_step(&fake.base);
    awx["retries"] = json!(3);
    let id = submit_async(&service, submission(vec![awx, report_step()])).await;
    let view = service.wait_workflow(&id).await;
    assert_eq!(view["status"], "completed", "{view}");
    faults.faulted(TaskMove::Checkpoint, 2).await;
    assert_eq!(fake.launches(), 1, "the job was launched again: {view}");
    let awx = task(&view, "awx");
    let errors: Vec<&str> = awx["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|attempt| attempt["error"].as_str())
        .collect();
    assert_eq!(errors.len(), 2, "{awx}");
    assert!(errors[0].starts_with("not launching:"), "{errors:?}");
    assert!(errors[1].starts_with("launched job 1, but"), "{errors:?}");
    assert_eq!(awx["checkpoint"]["job_id"], 1);
    service.stop().await;
}

#[tokio::test]
async fn a_failed_status_fails_the_step_and_an_unknown_one_is_named() {
    for (end, expected) in [
        ("failed", "job 1 ended `failed`"),
        (
            "exploded",
            "job 1 has the status `exploded`, which the status map does not list",
        ),
    ] {
        let Run {
            fake,
            service,
            view,
            _dir,
        } = awx_then_report(Plan::ending(end, Duration::from_millis(200))).await;
        assert_eq!(view["status"], "failed", "{view}");
        let awx = task(&view, "awx");
        assert_eq!(awx["status"], "failed");
        let error = awx["error"].as_str().unwrap();
        assert!(error.contains(expected), "{error}");
        assert_eq!(task(&view, "report")["status"], "not_started");
        assert_eq!(fake.launches(), 1);
        service.stop().await;
    }
}

#[tokio::test]
async fn a_timeout_or_a_cancel_sends_the_cancel_request() {
    let fake = Fake::start(
        Flavor::Awx,
        Plan::ending("successful", Duration::from_secs(600)),
    );
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(allowing(dir.path(), &[fake.port])).await;

    let mut step = awx_step(&fake.base);
    step["timeout"] = json!(1);
    let id = submit_async(&service, submission(vec![step])).await;
    let view = service.wait_workflow(&id).await;
    let error = task(&view, "awx")["error"].as_str().unwrap().to_owned();
    assert!(
        error.contains("timed out after 1s; job 1 was cancelled (202 Accepted)"),
        "{error}"
    );
    fake.until("the cancel of job 1", |s| s.cancels == ["1"])
        .await;

    // A cancel through the API does the same.
    let id = submit_async(&service, submission(vec![awx_step(&fake.base)])).await;
    fake.until("a poll of job 2", |s| s.polls_of("2") > 0).await;
    let (_, view) = service.get(&format!("/workflows/{id}")).await;
    let task_id = task(&view, "awx")["id"].as_str().unwrap().to_owned();
    let (status, _) = service
        .post(&format!("/tasks/{task_id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200);
    let cancelled = service.wait_finished(&task_id).await;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    fake.until("the cancel of job 2", |s| s.cancels == ["1", "2"])
        .await;
    assert_eq!(fake.launches(), 2);
    service.stop().await;
}

#[tokio::test]
async fn a_refused_connection_fails_the_attempt_and_the_retry_launches() {
    // A port with nothing behind it, for now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(allowing(dir.path(), &[port])).await;
    let mut step = awx_step(&base);
    step["retries"] = json!(60);
    let id = submit_async(&service, submission(vec![step, report_step()])).await;
    let (_, view) = service.get(&format!("/workflows/{id}")).await;
    let task_id = task(&view, "awx")["id"].as_str().unwrap().to_owned();
    let first = service
        .wait_task(&task_id, |t| {
            t["history"].as_array().is_some_and(|h| !h.is_empty())
        })
        .await;
    let error = first["history"][0]["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{first}"));
    assert!(
        error.contains(&format!(
            "launch: POST {base}/api/v2/job_templates/7/launch/: cannot connect"
        )),
        "{error}"
    );

    let fake = Fake::start_on(
        Flavor::Awx,
        Plan::ending("successful", Duration::from_millis(100)),
        port,
    );
    let view = service.wait_workflow(&id).await;
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(fake.launches(), 1);
    service.stop().await;
}

#[tokio::test]
async fn the_allowlist_refuses_a_host_it_does_not_name() {
    let fake = Fake::start(Flavor::Awx, Plan::ending("successful", Duration::ZERO));
    let dir = tempfile::tempdir().unwrap();
    // Another port than the fake's is allowed.
    let service = TestService::start(allowing(dir.path(), &[fake.port + 1])).await;
    let host = format!("127.0.0.1:{}", fake.port);

    // Written in the template: refused when the template is checked.
    let (status, body) = service
        .post("/workflows", submission(vec![awx_step(&fake.base)]))
        .await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("template.steps.awx.http.launch.url: host `")
            && message.contains(&host)
            && message.contains("--http-allow"),
        "{message}"
    );

    // Given by the submission: refused when the submission is planned.
    let mut body = submission(vec![awx_step("${workflow.input.base}")]);
    body["template"]["inputs"]["base"] = json!({"type": "string"});
    body["vars"] = json!({"base": fake.base});
    let (status, answer) = service.post("/workflows", body).await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("steps.awx.http.launch.url: host `") && message.contains(&host),
        "{message}"
    );

    // Known only when the step runs (another step's output): refused then.
    let first = json!({"ref_name": "where", "script": "dag/step.py",
                       "input": {"name": "where", "output": {"base": fake.base}}});
    let mut step = awx_step("${where.output.base}");
    step["http"]["poll"]["url"] = json!("${where.output.base}/api/v2/jobs/${job.id}/");
    step["http"]["cancel"]["url"] = json!("${where.output.base}/api/v2/jobs/${job.id}/cancel/");
    let id = submit_async(&service, submission(vec![first, step])).await;
    let view = service.wait_workflow(&id).await;
    let error = task(&view, "awx")["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("host `{host}` is not in the HTTP allowlist")),
        "{error}"
    );
    assert_eq!(fake.launches(), 0, "nothing reached the fake");
    service.stop().await;
}

#[tokio::test]
async fn a_secret_in_a_header_never_shows_in_logs_outputs_events_or_errors() {
    const TOKEN: &str = "awx-token-4c1f9e7b2d";
    let dir = tempfile::tempdir().unwrap();
    // The second job's status is the token itself: the error that names
    // the unknown status must not show it either.
    let plans = [
        Plan::ending("successful", Duration::from_millis(200)),
        Plan::ending(TOKEN, Duration::from_millis(200)),
    ];
    let fakes: Vec<Fake> = plans
        .into_iter()
        .map(|plan| {
            let fake = Fake::start(Flavor::Awx, plan);
            // It answers only with the token, and echoes it back.
            fake.require_token(TOKEN, true);
            fake
        })
        .collect();
    let ports: Vec<u16> = fakes.iter().map(|f| f.port).collect();
    // A secret is used by registered templates only: one per fake.
    let templates = tempfile::tempdir().unwrap();
    for (i, fake) in fakes.iter().enumerate() {
        let mut step = awx_step(&fake.base);
        step["http"]["headers"] = json!({"Authorization": "Bearer ${secrets.awx_token}"});
        step["http"]["outputs"]["artifacts"] = json!("/artifacts");
        let mut template = submission(vec![step])["template"].clone();
        template["ref_name"] = json!(format!("drive-awx-{i}"));
        std::fs::write(
            templates.path().join(format!("drive-awx-{i}.json")),
            template.to_string(),
        )
        .unwrap();
    }
    let mut settings = allowing(dir.path(), &ports);
    settings.templates_dir = templates.path().to_path_buf();
    let service = TestService::start(settings).await;
    let bases: Vec<&str> = fakes.iter().map(|f| f.base.as_str()).collect();
    put_secret(
        &service,
        "awx_token",
        TOKEN,
        &["drive-awx-0", "drive-awx-1"],
        &bases,
    )
    .await;
    let engine = service.handle.as_ref().unwrap().engine.clone();
    let mut events = engine.subscribe();

    let mut seen = String::new();
    for (i, expected) in ["completed", "failed"].into_iter().enumerate() {
        let id = submit_async(&service, json!({"template": format!("drive-awx-{i}")})).await;
        let view = service.wait_workflow(&id).await;
        assert_eq!(view["status"], expected, "{view}");
        let awx = task(&view, "awx");
        let task_id = awx["id"].as_str().unwrap();
        assert_eq!(
            awx["input"]["headers"]["Authorization"],
            "Bearer ${secrets.awx_token}"
        );
        seen.push_str(&view.to_string());
        for path in [
            format!("/tasks/{task_id}"),
            format!("/tasks/{task_id}/logs"),
            format!("/tasks/{task_id}/checkpoint"),
            "/tasks?limit=10".to_owned(),
        ] {
            seen.push_str(&service.get_text(&path).await.1);
        }
        if expected == "completed" {
            assert_eq!(
                awx["output"]["artifacts"]["seen_token"], "<redacted>",
                "{awx}"
            );
        } else {
            let error = awx["error"].as_str().unwrap();
            assert!(error.contains("the status `<redacted>`"), "{error}");
        }
    }
    // The token was sent: every request was let in.
    for fake in &fakes {
        assert_eq!(fake.seen(|s| s.unauthorized), 0);
        assert_eq!(fake.launches(), 1);
    }
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(200), events.recv()).await
    {
        seen.push_str(&serde_json::to_string(&*event).unwrap());
    }
    assert!(seen.contains("<redacted>"), "the echoes were looked at");
    assert!(!seen.contains(TOKEN), "the token shows somewhere: {seen}");
    service.stop().await;
}

/// The shipped templates load with the default (empty) allowlist: their
/// hosts come from the submission, which is refused until they are
/// allowed. Allowed, the AWX and Terraform Cloud presets drive the fakes.
#[tokio::test]
async fn the_presets_load_with_nothing_allowed_and_drive_the_fakes_once_allowed() {
    let awx = Fake::start(Flavor::Awx, Plan(vec![("successful", Duration::ZERO)]));
    let tfc = Fake::start(
        Flavor::Terraform,
        Plan(vec![
            ("planning", Duration::from_millis(100)),
            ("planned", Duration::from_millis(100)),
            ("applied", Duration::ZERO),
        ]),
    );
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates");
    let dir = tempfile::tempdir().unwrap();
    let preset_settings = |ports: &[u16]| {
        let mut settings = allowing(dir.path(), ports);
        settings.scripts_dir = real_scripts();
        settings.templates_dir = shipped.clone();
        settings
    };
    let awx_job = json!({"template": "awx-job-launch", "vars": {
        "awx_url": awx.base, "job_template_id": 7, "extra_vars": {"vm_count": 2}}});

    let service = TestService::start(preset_settings(&[])).await;
    let (status, answer) = service.post("/workflows", awx_job.clone()).await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("host `127.0.0.1:{}`", awx.port)),
        "{message}"
    );
    service.stop().await;

    let service = TestService::start(preset_settings(&[awx.port, tfc.port])).await;
    put_secret(
        &service,
        "awx_token",
        "awx-secret-token",
        &["awx-job-launch"],
        &[&awx.base],
    )
    .await;
    put_secret(
        &service,
        "tfc_token",
        "tfc-secret-token",
        &["terraform-cloud-run"],
        &[&tfc.base],
    )
    .await;
    let id = submit_async(&service, awx_job).await;
    let view = service.wait_workflow(&id).await;
    assert_eq!(view["status"], "completed", "{view}");
    let output = &view["tasks"][0]["output"];
    assert_eq!(output["job_id"], 1, "{output}");
    assert_eq!(output["status"], "successful");
    assert_eq!(output["artifacts"]["vm_ips"][0], "10.1.0.11");
    let launch = awx.seen(|s| s.launches[0].body.clone());
    assert_eq!(launch, json!({"extra_vars": {"vm_count": 2}}));

    let id = submit_async(
        &service,
        json!({"template": "terraform-cloud-run", "vars": {
            "tfc_url": tfc.base, "workspace_id": "ws-123", "message": "from a test"}}),
    )
    .await;
    let view = service.wait_workflow(&id).await;
    assert_eq!(view["status"], "completed", "{view}");
    let output = &view["tasks"][0]["output"];
    assert_eq!(output["run_id"], "run-0001", "{output}");
    assert_eq!(output["status"], "applied");
    let launch = tfc.seen(|s| s.launches[0].body.clone());
    assert_eq!(
        launch["data"]["relationships"]["workspace"]["data"]["id"],
        "ws-123"
    );
    assert_eq!(launch["data"]["attributes"]["auto-apply"], true);
    // `planned` was passed through on the way to `applied`.
    assert!(tfc.seen(|s| s.polls.len()) >= 2);
    service.stop().await;
}

/// Tier 2 → tier 1: a workflow on this orchestrator submits a workflow to
/// another one with its API token (a secret), polls it to its end, and
/// gets its step outputs back.
#[tokio::test]
async fn a_workflow_runs_a_workflow_on_another_orchestrator_and_gets_its_outputs() {
    const TIER1_TOKEN: &str = "tier1-admin-token-0123456789abcdef0123";
    let tier1_dir = tempfile::tempdir().unwrap();
    let mut tier1_settings = fixture_settings(tier1_dir.path());
    tier1_settings.auth = true;
    tier1_settings.bootstrap_token = Some(orchestrator_storage::Secret::new(TIER1_TOKEN));
    let tier1 = TestService::start(tier1_settings).await;
    let tier1_port = tier1.handle.as_ref().unwrap().addr.port();

    let dir = tempfile::tempdir().unwrap();
    let mut settings = allowing(dir.path(), &[tier1_port]);
    settings.scripts_dir = real_scripts();
    settings.templates_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates");
    let tier2 = TestService::start(settings).await;
    put_secret(
        &tier2,
        "orchestrator_token",
        TIER1_TOKEN,
        &["remote-workflow"],
        &[&tier1.base],
    )
    .await;
    let id = submit_async(
        &tier2,
        json!({"template": "remote-workflow", "vars": {
            "orchestrator_url": tier1.base, "template": "chain", "vars": {"sleep": 0.2}}}),
    )
    .await;
    let view = tier2.wait_workflow(&id).await;
    assert_eq!(view["status"], "completed", "{view}");
    let output = &view["tasks"][0]["output"];
    assert_eq!(output["status"], "completed", "{output}");
    // Tier 1's step outputs, passed back by step name.
    assert_eq!(
        output["outputs"]["a"]["ips"],
        json!(["10.0.0.1", "10.0.0.2"])
    );
    assert_eq!(output["outputs"]["b"]["input"]["label"], "n=2 in eu");

    // Tier 1 ran it once, and knows it by the launch's idempotency key.
    let remote = output["workflow_id"].as_str().unwrap();
    let answer = tier1
        .http
        .get(format!("{}/workflows/{remote}", tier1.base))
        .bearer_auth(TIER1_TOKEN)
        .send()
        .await
        .unwrap();
    let remote_view: Value = answer.json().await.unwrap();
    let key = view["tasks"][0]["checkpoint"]["launch_key"]
        .as_str()
        .unwrap();
    assert_eq!(remote_view["idempotency_key"], key);
    let listed = tier1
        .http
        .get(format!("{}/workflows?template=chain", tier1.base))
        .bearer_auth(TIER1_TOKEN)
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(listed["total"], 1, "{listed}");
    tier2.stop().await;
    tier1.stop().await;
}

/// Submits `awx` → `report` to the service at `url` and waits until its
/// job is being polled; the workflow's answer.
fn submit_and_wait_for_polling(url: &str, fake: &Fake) -> Value {
    let mut step = awx_step(&fake.base);
    step["retries"] = json!(3);
    let created = submit(
        &format!("{url}/workflows"),
        submission(vec![step, report_step()]),
    );
    fake.until_blocking("a poll of job 1", |s| s.polls_of("1") > 0);
    created
}

/// After a crash during the polls: the workflow completed on one launch,
/// job 1 was polled again, and its outputs reached the next step. The
/// `awx` task's attempt history.
fn assert_resumed(fake: &Fake, view: &Value, polls_before: usize) -> Vec<Value> {
    assert_eq!(view["status"], "completed", "{view}");
    assert_eq!(fake.launches(), 1, "the job was launched again");
    assert!(
        fake.seen(|s| s.polls_of("1")) > polls_before,
        "job 1 was not polled again"
    );
    assert_eq!(
        task(view, "report")["output"]["input"]["ips"],
        json!(["10.1.0.11", "10.1.0.12"])
    );
    task(view, "awx")["history"].as_array().unwrap().clone()
}

/// The real binary, killed with SIGKILL while its http step polls: the
/// restarted service polls the same job, and the fake saw one launch.
fn kill_while_polling(store_args: &[&str]) {
    let fake = Fake::start(
        Flavor::Awx,
        Plan::ending("successful", Duration::from_secs(4)),
    );
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let allow = format!("127.0.0.1:{}", fake.port);
    let mut args = vec!["--http-allow", allow.as_str()];
    args.extend_from_slice(store_args);
    let daemon = Daemon::start(&data, &args);
    let created = submit_and_wait_for_polling(&daemon.url, &fake);
    daemon.signal("-KILL");
    assert!(!daemon.wait().success());
    let polls_before = fake.seen(|s| s.polls_of("1"));

    let daemon = Daemon::start(&data, &args);
    let view = wait_for_workflows(&daemon, &[created["id"].as_str().unwrap().to_owned()]).remove(0);
    let history = assert_resumed(&fake, &view, polls_before);
    let interrupted = history[0]["error"].as_str().unwrap();
    assert!(interrupted.contains("the service stopped"), "{interrupted}");
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

#[test]
fn a_killed_service_resumes_polling_without_launching_again() {
    kill_while_polling(&[]);
}

#[cfg(feature = "surrealdb")]
#[test]
fn a_killed_service_resumes_polling_on_embedded_surrealdb() {
    kill_while_polling(&["--storage-type", "surrealdb-embedded"]);
}

/// Two nodes on a SurrealDB server: the one polling is killed, the other
/// takes the task over when its lease expires and polls the same job.
#[cfg(feature = "surrealdb")]
#[test]
fn a_node_takes_over_the_polling_without_launching_again() {
    let fake = Fake::start(
        Flavor::Awx,
        Plan::ending("successful", Duration::from_secs(6)),
    );
    let allow = format!("127.0.0.1:{}", fake.port);
    let cluster =
        crate::faults::nodes::SharedStore::new(&["--lease-secs", "2", "--http-allow", &allow]);
    let (dir, args) = (cluster.dir.path(), cluster.args());
    let a = Daemon::start(&dir.join("a"), &args);
    let b = Daemon::start(&dir.join("b"), &args);
    let created = submit_and_wait_for_polling(&a.url, &fake);

    // Kill whichever node polls.
    let task_id = task(&created, "awx")["id"].as_str().unwrap().to_owned();
    let runner = a.cli_json(&["task", &task_id, "--json"])["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let a_id = std::fs::read_to_string(dir.join("a/node-id")).unwrap();
    let (dead, survivor) = if runner == a_id { (a, b) } else { (b, a) };
    dead.signal("-KILL");
    assert!(!dead.wait().success());
    let polls_before = fake.seen(|s| s.polls_of("1"));

    let view =
        wait_for_workflows(&survivor, &[created["id"].as_str().unwrap().to_owned()]).remove(0);
    let history = assert_resumed(&fake, &view, polls_before);
    assert!(
        history[0]["node"] == runner.as_str()
            && history[0]["error"]
                .as_str()
                .is_some_and(|e| e.contains("stopped renewing its lease")),
        "{history:?}"
    );
    assert_ne!(
        history.last().unwrap()["node"],
        runner.as_str(),
        "{history:?}"
    );
    survivor.signal("-TERM");
    assert!(survivor.wait().success());
}
