//! Approval gates through the running service: plan → approval → apply,
//! decisions bound to a digest, who may decide, a script changed under an
//! approval, a restart while a gate waits, timeouts, and the CLI.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::auth::{ADMIN, call, create_token, with_auth};
use crate::harness::{TestService, fixture_scripts, fixture_settings};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

/// A scripts dir of its own (a test changes a script in it): `plan.py`
/// and `apply.py`, both the fixture `dag/step.py`.
fn scripts_dir(dir: &Path) -> std::path::PathBuf {
    let scripts = dir.join("scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    for name in ["plan.py", "apply.py"] {
        std::fs::copy(fixture_scripts().join("dag/step.py"), scripts.join(name)).unwrap();
    }
    scripts
}

fn template(approval: Value) -> Value {
    json!({
        "name": "Approved apply",
        "ref_name": "approved-apply",
        "schema_version": 1,
        "inputs": {"env": {"type": "string", "default": "prod"}},
        "steps": [
            {"ref_name": "plan", "script": "plan.py",
             "input": {"name": "plan", "output": {"summary": "2 to add"}}},
            {"ref_name": "approve", "kind": "approval", "depends_on": ["plan"],
             "approval": approval},
            {"ref_name": "apply", "script": "apply.py", "depends_on": ["approve"],
             "input": {"name": "apply", "env": "${workflow.input.env}"}},
        ]
    })
}

async fn submit(service: &TestService, token: Option<&str>, approval: Value) -> String {
    let (status, body) = call(
        service,
        "POST",
        "/workflows",
        token,
        Some(json!({"template": template(approval)})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

/// Polls `GET /workflows/{id}/approval` until `done` holds for the gate.
async fn wait_gate(service: &TestService, workflow: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (status, gate) = call(
            service,
            "GET",
            &format!("/workflows/{workflow}/approval"),
            Some(ADMIN),
            None,
        )
        .await;
        if status == 200 && done(&gate) {
            return gate;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the gate never got there: {status} {gate}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn task_of_step(service: &TestService, workflow: &str, step: &str) -> Value {
    let (_, view) = call(
        service,
        "GET",
        &format!("/workflows/{workflow}"),
        Some(ADMIN),
        None,
    )
    .await;
    let id = view["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["ref_name"] == step)
        .unwrap_or_else(|| panic!("no step {step} in {view}"))["task_ids"][0]
        .as_str()
        .unwrap()
        .to_owned();
    call(service, "GET", &format!("/tasks/{id}"), Some(ADMIN), None)
        .await
        .1
}

async fn decide(
    service: &TestService,
    token: Option<&str>,
    workflow: &str,
    verb: &str,
    body: Value,
) -> (u16, Value) {
    call(
        service,
        "POST",
        &format!("/workflows/{workflow}/{verb}"),
        token,
        Some(body),
    )
    .await
}

async fn wait_workflow(service: &TestService, workflow: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, view) = call(
            service,
            "GET",
            &format!("/workflows/{workflow}"),
            Some(ADMIN),
            None,
        )
        .await;
        if matches!(
            view["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workflow never finished: {view}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_waiting_gate_holds_back_the_apply_until_an_allowed_token_approves_its_digest() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    settings.scripts_dir = scripts_dir(dir.path());
    settings.templates_dir = dir.path().join("no-templates");
    // One worker: a gate that held it would stop everything else.
    settings.workers = 1;
    let service = TestService::start(settings).await;
    let sam = create_token(&service, "sam", "operator").await;
    let olga = create_token(&service, "olga", "operator").await;
    let vic = create_token(&service, "vic", "viewer").await;
    let workflow = submit(
        &service,
        Some(&sam),
        json!({"approvers": {"role": "operator"}, "covers": ["plan"]}),
    )
    .await;
    let gate = wait_gate(&service, &workflow, |_| true).await;
    let digest = gate["digest"].as_str().unwrap().to_owned();
    assert_eq!(gate["submitter"], "sam");
    assert!(gate["covers"]["scripts"]["apply.py"].is_string(), "{gate}");
    assert!(gate["covers"]["outputs"]["plan"].is_string(), "{gate}");
    let (status, listed) = call(&service, "GET", "/approvals", Some(&vic), None).await;
    assert_eq!(status, 200);
    assert_eq!(listed["items"][0]["workflow_id"], workflow.as_str());
    assert_eq!(listed["items"][0]["digest"], digest.as_str());
    // The single worker is free: another workflow runs meanwhile.
    let other = submit(
        &service,
        Some(&sam),
        json!({"approvers": {"role": "admin"}}),
    )
    .await;
    wait_gate(&service, &other, |_| true).await;
    assert_eq!(
        task_of_step(&service, &workflow, "apply").await["status"],
        "pending"
    );

    let body = json!({"digest": digest, "comment": "looks right"});
    let (status, refused) = decide(&service, Some(&sam), &workflow, "approve", body.clone()).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("token `sam` submitted this workflow"),
        "{refused}"
    );
    let (status, refused) = decide(&service, Some(&vic), &workflow, "approve", body.clone()).await;
    assert_eq!(status, 403, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("needs the operator role"),
        "{refused}"
    );
    let stale = "ab".repeat(32);
    let (status, refused) = decide(
        &service,
        Some(&olga),
        &workflow,
        "approve",
        json!({"digest": stale}),
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&stale) && message.contains(&digest),
        "{message}"
    );

    let (status, decided) = decide(&service, Some(&olga), &workflow, "approve", body.clone()).await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["status"], "completed");
    assert_eq!(decided["digest"], digest.as_str());
    // Decided once.
    let (status, again) = decide(&service, Some(&olga), &workflow, "approve", body).await;
    assert_eq!(status, 409, "{again}");

    let view = wait_workflow(&service, &workflow).await;
    assert_eq!(view["status"], "completed", "{view}");
    let gate_task = task_of_step(&service, &workflow, "approve").await;
    assert_eq!(gate_task["output"]["digest"], digest.as_str());
    assert_eq!(gate_task["approval"]["approvals"][0]["by"], "olga");
    assert_eq!(gate_task["attempts"], 0, "a gate never runs: {gate_task}");

    let (_, audit) = call(
        &service,
        "GET",
        "/audit?action=workflow.approve",
        Some(ADMIN),
        None,
    )
    .await;
    let records = audit["records"].as_array().unwrap();
    assert!(
        records.iter().any(|r| r["actor"] == "olga"
            && r["outcome"] == "ok"
            && r["target"].as_str().unwrap().contains(&digest)),
        "{audit}"
    );
    assert!(
        records
            .iter()
            .any(|r| r["actor"] == "sam" && r["status"] == 403),
        "{audit}"
    );
    service.stop().await;
}

#[tokio::test]
async fn a_rejection_skips_the_gated_steps_and_the_workflow_ends_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.scripts_dir = scripts_dir(dir.path());
    settings.templates_dir = dir.path().join("no-templates");
    let service = TestService::start(settings).await;
    let workflow = submit(&service, None, json!({"approvers": {"role": "operator"}})).await;
    let gate = wait_gate(&service, &workflow, |_| true).await;
    let (status, decided) = decide(
        &service,
        None,
        &workflow,
        "reject",
        json!({"digest": gate["digest"], "comment": "not on a friday"}),
    )
    .await;
    assert_eq!(status, 200, "{decided}");
    let view = wait_workflow(&service, &workflow).await;
    assert_eq!(view["status"], "cancelled", "{view}");
    let gate_task = task_of_step(&service, &workflow, "approve").await;
    assert_eq!(gate_task["status"], "cancelled");
    assert_eq!(gate_task["error"], "rejected by local: not on a friday");
    assert_eq!(
        task_of_step(&service, &workflow, "apply").await["status"],
        "skipped"
    );
    service.stop().await;
}

#[tokio::test]
async fn a_script_changed_on_disk_after_an_approval_invalidates_it_and_the_gate_waits_again() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    let scripts = scripts_dir(dir.path());
    settings.scripts_dir = scripts.clone();
    settings.templates_dir = dir.path().join("no-templates");
    let service = TestService::start(settings).await;
    let ann = create_token(&service, "ann", "operator").await;
    let bob = create_token(&service, "bob", "operator").await;
    let workflow = submit(
        &service,
        Some(ADMIN),
        json!({"approvers": {"tokens": ["ann", "bob"]}, "required": 2}),
    )
    .await;
    let before = wait_gate(&service, &workflow, |_| true).await;
    let (status, counted) = decide(
        &service,
        Some(&ann),
        &workflow,
        "approve",
        json!({"digest": before["digest"]}),
    )
    .await;
    assert_eq!(status, 200, "{counted}");
    assert_eq!(counted["status"], "pending");

    // A script no gated step runs is not covered: `plan` ran already.
    std::fs::write(scripts.join("plan.py"), "raise SystemExit(1)\n").unwrap();
    let (_, same) = call(
        &service,
        "GET",
        &format!("/workflows/{workflow}/approval"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(same["digest"], before["digest"], "{same}");

    let apply = scripts.join("apply.py");
    let mut text = std::fs::read_to_string(&apply).unwrap();
    text.push_str("\n# changed after the approval\n");
    std::fs::write(&apply, text).unwrap();

    // The service notices by itself: the approval stops counting.
    let after = wait_gate(&service, &workflow, |g| {
        g["approvals"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert_ne!(after["digest"], before["digest"]);
    let gate_task = task_of_step(&service, &workflow, "approve").await;
    assert_eq!(gate_task["status"], "pending");
    assert_eq!(
        gate_task["approval"]["invalidated_because"],
        "script apply.py changed"
    );
    // bob reviewed the old digest: refused.
    let (status, _) = decide(
        &service,
        Some(&bob),
        &workflow,
        "approve",
        json!({"digest": before["digest"]}),
    )
    .await;
    assert_eq!(status, 409);
    for token in [&bob, &ann] {
        let (status, body) = decide(
            &service,
            Some(token),
            &workflow,
            "approve",
            json!({"digest": after["digest"]}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let view = wait_workflow(&service, &workflow).await;
    assert_eq!(view["status"], "completed", "{view}");
    service.stop().await;
}

#[tokio::test]
async fn a_gate_waiting_across_a_restart_still_waits_and_the_cli_approves_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.scripts_dir = scripts_dir(dir.path());
    settings.templates_dir = dir.path().join("no-templates");
    let service = TestService::start(settings.clone()).await;
    let workflow = submit(&service, None, json!({"approvers": {"role": "operator"}})).await;
    let gate = wait_gate(&service, &workflow, |_| true).await;
    service.stop().await;

    let service = TestService::start(settings).await;
    let again = wait_gate(&service, &workflow, |_| true).await;
    assert_eq!(again["digest"], gate["digest"]);
    assert_eq!(again["opened_at"], gate["opened_at"]);
    assert_eq!(
        task_of_step(&service, &workflow, "apply").await["status"],
        "pending"
    );
    // The service answers on this test's runtime: the CLI is awaited, not
    // waited for on the thread.
    let listed = tokio::process::Command::new(BIN)
        .args(["--url", &service.base, "approvals"])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        text.contains(&workflow) && text.contains(gate["digest"].as_str().unwrap()),
        "{text}"
    );
    let approved = tokio::process::Command::new(BIN)
        .args(["--url", &service.base, "approve", &workflow])
        .args([
            "--comment",
            "ok",
            "--digest",
            gate["digest"].as_str().unwrap(),
        ])
        .output()
        .await
        .unwrap();
    assert!(approved.status.success(), "{approved:?}");
    assert!(
        String::from_utf8_lossy(&approved.stdout).contains("approved gate approve"),
        "{approved:?}"
    );
    let view = wait_workflow(&service, &workflow).await;
    assert_eq!(view["status"], "completed", "{view}");
    service.stop().await;
}

#[tokio::test]
async fn a_gate_without_a_decision_times_out_as_it_says() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.scripts_dir = scripts_dir(dir.path());
    settings.templates_dir = dir.path().join("no-templates");
    let service = TestService::start(settings).await;
    let rejected = submit(
        &service,
        None,
        json!({"approvers": {"role": "operator"}, "timeout": 1, "on_timeout": "reject"}),
    )
    .await;
    let failed = submit(
        &service,
        None,
        json!({"approvers": {"role": "operator"}, "timeout": 1, "on_timeout": "fail"}),
    )
    .await;
    let view = wait_workflow(&service, &rejected).await;
    assert_eq!(view["status"], "cancelled", "{view}");
    let gate = task_of_step(&service, &rejected, "approve").await;
    assert!(
        gate["error"]
            .as_str()
            .unwrap()
            .starts_with("rejected: no decision within"),
        "{gate}"
    );
    assert_eq!(gate["approval"]["ended"], "timed_out");
    let view = wait_workflow(&service, &failed).await;
    assert_eq!(view["status"], "failed", "{view}");
    assert_eq!(
        task_of_step(&service, &failed, "apply").await["status"],
        "not_started"
    );
    service.stop().await;
}

#[tokio::test]
async fn a_bad_approval_block_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.scripts_dir = scripts_dir(dir.path());
    settings.templates_dir = dir.path().join("no-templates");
    let service = TestService::start(settings).await;
    for (approval, field) in [
        (
            json!({"approvers": {"role": "viewer"}}),
            "template.steps.approve.approval.approvers.role",
        ),
        (
            json!({"approvers": {"role": "operator"}, "required": 99}),
            "template.steps.approve.approval.required",
        ),
        (
            json!({"approvers": {"role": "operator"}, "covers": ["apply"]}),
            "template.steps.approve.approval.covers[0]",
        ),
        (
            json!({"approvers": {"role": "operator"}, "on_timeout": "explode"}),
            "template.steps.approve.approval",
        ),
    ] {
        let (status, body) = call(
            &service,
            "POST",
            "/workflows",
            None,
            Some(json!({"template": template(approval)})),
        )
        .await;
        assert_eq!(status, 422, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{message} should name {field}");
    }
    service.stop().await;
}

#[tokio::test]
async fn the_shipped_approved_apply_example_plans_waits_and_applies_once_approved() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.scripts_dir = crate::harness::real_scripts();
    settings.templates_dir = crate::harness::real_scripts().join("../templates");
    let service = TestService::start(settings).await;
    let (status, body) = call(
        &service,
        "POST",
        "/workflows",
        None,
        Some(json!({"template": "approved-apply", "vars": {"env": "gated", "vm_count": 1}})),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let workflow = body["id"].as_str().unwrap().to_owned();
    let gate = wait_gate(&service, &workflow, |_| true).await;
    assert!(
        gate["covers"]["scripts"]["examples/provision_infra.py"].is_string(),
        "{gate}"
    );
    assert!(gate["covers"]["outputs"]["plan"].is_string(), "{gate}");
    assert_eq!(
        task_of_step(&service, &workflow, "apply").await["status"],
        "pending"
    );
    let (status, decided) = decide(
        &service,
        None,
        &workflow,
        "approve",
        json!({"digest": gate["digest"]}),
    )
    .await;
    assert_eq!(status, 200, "{decided}");
    let view = wait_workflow(&service, &workflow).await;
    assert_eq!(view["status"], "completed", "{view}");
    let apply = task_of_step(&service, &workflow, "apply").await;
    assert_eq!(apply["output"]["check_mode"], false, "{apply}");
    service.stop().await;
}

#[tokio::test]
async fn of_two_concurrent_decisions_one_is_stored_and_the_other_gets_409() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = with_auth(dir.path());
    settings.scripts_dir = scripts_dir(dir.path());
    settings.templates_dir = dir.path().join("no-templates");
    let service = TestService::start(settings).await;
    let ann = create_token(&service, "ann", "operator").await;
    let bob = create_token(&service, "bob", "operator").await;
    let workflow = submit(
        &service,
        Some(ADMIN),
        json!({"approvers": {"role": "operator"}}),
    )
    .await;
    let gate = wait_gate(&service, &workflow, |_| true).await;
    let body = json!({"digest": gate["digest"]});
    let (approve, reject) = tokio::join!(
        decide(&service, Some(&ann), &workflow, "approve", body.clone()),
        decide(&service, Some(&bob), &workflow, "reject", body),
    );
    let mut statuses = [approve.0, reject.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "{approve:?} {reject:?}");
    let view = wait_workflow(&service, &workflow).await;
    let expected = if approve.0 == 200 {
        "completed"
    } else {
        "cancelled"
    };
    assert_eq!(view["status"], expected, "{view}");
    service.stop().await;
}

/// A gate waits in the store, not in a node: with the node that ran the
/// plan killed (-9), the other node of a shared SurrealDB server lists
/// the gate, takes the decision and runs the gated step.
#[cfg(feature = "surrealdb")]
#[test]
fn a_waiting_gate_outlives_its_node_and_is_decided_on_another() {
    use crate::cli::Daemon;
    use crate::faults::nodes::SharedStore;
    let cluster = SharedStore::new(&["--lease-secs", "3"]);
    let dir = &cluster.dir;
    let a = Daemon::start(&dir.path().join("a"), &cluster.args());
    let b = Daemon::start(&dir.path().join("b"), &cluster.args());
    let created = crate::cli::submit(
        &format!("{}/workflows", a.url),
        json!({"template": {
            "name": "gated", "ref_name": "gated", "schema_version": 1,
            "steps": [
                {"ref_name": "plan", "script": "dag/step.py", "input": {"name": "plan"}},
                // No auth on these nodes: the submitter and the approver
                // are one local caller.
                {"ref_name": "approve", "kind": "approval", "depends_on": ["plan"],
                 "approval": {"approvers": {"role": "operator"},
                              "allow_submitter": true, "covers": ["plan"]}},
                {"ref_name": "apply", "script": "dag/step.py", "depends_on": ["approve"],
                 "input": {"name": "apply"}},
            ]
        }}),
    );
    let workflow = created["id"].as_str().expect("submitted").to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let listed = b.cli_json(&["approvals", "--json"]);
        if listed.to_string().contains(&workflow) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node b never listed the gate: {listed}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    a.signal("-KILL");
    assert!(!a.wait().success());
    let approved = b.cli(&["approve", &workflow, "--comment", "after the takeover"]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stderr)
    );
    let views = crate::faults::wait_for_workflows(&b, std::slice::from_ref(&workflow));
    assert_eq!(views[0]["status"], "completed", "{}", views[0]);
}
