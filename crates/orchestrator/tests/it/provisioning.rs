//! The real provisioning scripts in `scripts/`, run by real Nushell.

use serde_json::json;

use crate::harness::{TestService, real_scripts};
use orchestrator::settings::ServeSettings;

fn settings(data_dir: &std::path::Path) -> ServeSettings {
    let mut settings = ServeSettings::new(data_dir.to_path_buf(), real_scripts());
    settings.port = 0;
    settings.workers = 2;
    // Tokens are tested in auth.rs; these tests are about the scripts.
    settings.auth = false;
    settings
}

fn require_nu() {
    let found = std::process::Command::new("nu")
        .arg("--version")
        .output()
        .is_ok();
    assert!(
        found,
        "these tests need Nushell's `nu` on PATH; run them with `make test`"
    );
}

#[tokio::test]
async fn a_cluster_is_provisioned_by_the_real_scripts() {
    require_nu();
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(settings(dir.path())).await;
    let (status, body) = service
        .post(
            "/workflows/cluster/create",
            json!({"infra": "production", "cluster": "k8s", "servers": ["cp-01", "wk-01"],
                   "taskservs": ["containerd", "kubernetes"], "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "completed", "{body}");
    let tasks = body["tasks"].as_array().unwrap();
    let join = tasks.last().unwrap();
    let members = join["output"]["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    let server_ip = |name: &str| {
        tasks
            .iter()
            .find(|t| t["name"] == format!("create server {name}"))
            .unwrap()["output"]["ip"]
            .clone()
    };
    assert_eq!(members[0]["ip"], server_ip("cp-01"));
    assert_eq!(members[1]["ip"], server_ip("wk-01"));
    assert_ne!(server_ip("cp-01"), server_ip("wk-01"));
    let infra = crate::harness::script_state(dir.path()).join("infra/production");
    assert!(infra.join("servers/cp-01/server.json").exists());
    assert!(
        infra
            .join("servers/wk-01/taskservs/kubernetes.json")
            .exists()
    );
    assert!(infra.join("clusters/k8s.json").exists());

    // Creating the same servers again changes nothing and keeps the IPs.
    let (_, again) = service
        .post(
            "/workflows/servers/create",
            json!({"infra": "production", "servers": ["cp-01"], "wait": true}),
        )
        .await;
    assert_eq!(again["tasks"][0]["output"]["changed"], false);
    assert_eq!(again["tasks"][0]["output"]["ip"], server_ip("cp-01"));
    service.stop().await;
}

#[tokio::test]
async fn check_mode_runs_the_whole_cluster_and_writes_nothing() {
    require_nu();
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(settings(dir.path())).await;
    let (status, body) = service
        .post(
            "/workflows/cluster/create",
            json!({"infra": "staging", "cluster": "c", "servers": ["a-01"], "taskservs": ["postgres"],
                   "check_mode": true, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "completed", "{body}");
    for task in body["tasks"].as_array().unwrap() {
        assert_eq!(task["output"]["check_mode"], true, "{task}");
        assert_eq!(task["output"]["changed"], false, "{task}");
    }
    assert!(
        !crate::harness::script_state(dir.path())
            .join("infra")
            .exists()
    );
    service.stop().await;
}

#[tokio::test]
async fn a_taskserv_on_a_missing_server_fails_with_the_scripts_reason() {
    require_nu();
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(settings(dir.path())).await;
    let (status, body) = service
        .post(
            "/workflows/taskserv/create",
            json!({"infra": "production", "servers": ["ghost"], "taskservs": ["containerd"],
                   "max_attempts": 1, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let task = &body["tasks"][0];
    assert_eq!(task["status"], "failed");
    assert_eq!(task["exit_code"], 1);
    assert!(task["error"].as_str().unwrap().contains("ghost"), "{task}");
    service.stop().await;
}
