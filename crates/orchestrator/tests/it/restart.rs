//! Restarting on the same data dir: nothing submitted is lost.

use serde_json::json;

use crate::harness::{TestService, fixture_settings};

#[tokio::test]
async fn a_restarted_service_shows_the_same_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    service
        .create_servers(&["ok-1", "ok-2"], json!({"wait": true}))
        .await;
    service
        .create_servers(&["fail-1"], json!({"wait": true, "max_attempts": 1}))
        .await;
    let (_, before) = service.get("/tasks").await;
    let (_, workflows_before) = service.get("/workflows").await;
    service.stop().await;

    let service = TestService::start(fixture_settings(dir.path())).await;
    let (_, after) = service.get("/tasks").await;
    assert_eq!(after, before);
    assert_eq!(after["total"], 3);
    assert_eq!(service.get("/workflows").await.1, workflows_before);
    service.stop().await;
}

#[tokio::test]
async fn queued_and_interrupted_work_resumes_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.workers = 1;
    settings.shutdown_grace = std::time::Duration::from_millis(200);
    let service = TestService::start(settings.clone()).await;
    let (_, running) = service.create_servers(&["slow-r"], json!({})).await;
    service
        .wait_task(&running[0], |t| t["status"] == "running")
        .await;
    let (_, queued) = service.create_servers(&["ok-q1", "ok-q2"], json!({})).await;
    // The grace period is shorter than the running script: it is stopped
    // and goes back to the queue without using up an attempt.
    service.stop().await;

    let service = TestService::start(settings).await;
    for id in running.iter().chain(&queued) {
        let task = service.wait_finished(id).await;
        assert_eq!(task["status"], "completed", "{task}");
        assert_eq!(task["attempts"], 1, "{task}");
    }
    service.stop().await;
}

#[tokio::test]
async fn during_the_shutdown_grace_the_api_answers_but_refuses_new_work() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (_, running) = service.create_servers(&["slow-g"], json!({})).await;
    service
        .wait_task(&running[0], |t| t["status"] == "running")
        .await;
    let TestService {
        handle,
        base,
        http,
        data_dir,
    } = service;
    let stopping = tokio::spawn(handle.unwrap().shutdown());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let probe = TestService {
        handle: None,
        base,
        http,
        data_dir,
    };
    let (status, body) = probe
        .post(
            "/workflows/servers/create",
            json!({"infra": "test", "servers": ["ok-late"]}),
        )
        .await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "shutting_down");
    // The running script is still visible, and finishes within the grace.
    let (status, task) = probe.get(&format!("/tasks/{}", running[0])).await;
    assert_eq!(status, 200, "{task}");
    stopping.await.unwrap().unwrap();

    let service = TestService::start(fixture_settings(dir.path())).await;
    let task = service.get(&format!("/tasks/{}", running[0])).await.1;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["attempts"], 1);
    service.stop().await;
}
