//! Queue behaviour through the HTTP API: parallelism, priority, retries,
//! timeouts, cancellation, logs and check mode.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings, task_processes};

#[tokio::test]
async fn servers_are_created_in_parallel() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let started = std::time::Instant::now();
    let (status, body) = service
        .post(
            "/workflows/servers/create",
            json!({"infra": "test", "servers": ["slow-1", "slow-2", "slow-3"], "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "completed");
    assert_eq!(body["finished"], true);
    let tasks = body["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 3);
    for task in tasks {
        assert_eq!(task["status"], "completed");
        assert_eq!(task["attempts"], 1);
        assert_eq!(task["exit_code"], 0);
        assert_eq!(task["output"]["attempt"], 1);
    }
    // All three started before any of them ended: they overlapped in time.
    let trace = service.trace();
    let first_end = trace.iter().position(|l| l.contains(" end ")).unwrap();
    let starts_before = trace[..first_end]
        .iter()
        .filter(|l| l.contains(" start "))
        .count();
    assert_eq!(starts_before, 3, "{trace:?}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "ran one after another"
    );
    for server in ["slow-1", "slow-2", "slow-3"] {
        assert!(
            crate::harness::script_state(dir.path())
                .join("created")
                .join(server)
                .exists()
        );
    }
    service.stop().await;
}

#[tokio::test]
async fn higher_priority_runs_first_and_equal_priority_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.workers = 1;
    let service = TestService::start(settings).await;
    // Occupy the only worker, then queue work of every priority.
    let (_, blocker) = service.create_servers(&["slow-blocker"], json!({})).await;
    service
        .wait_task(&blocker[0], |t| t["status"] == "running")
        .await;
    let mut ids = Vec::new();
    for (server, priority) in [
        ("ok-low", "low"),
        ("ok-normal-a", "normal"),
        ("ok-critical", "critical"),
        ("ok-normal-b", "normal"),
        ("ok-high", "high"),
    ] {
        let (_, task_ids) = service
            .create_servers(&[server], json!({"priority": priority}))
            .await;
        ids.extend(task_ids);
    }
    for id in &ids {
        service.wait_finished(id).await;
    }
    let starts: Vec<String> = service
        .trace()
        .into_iter()
        .filter(|l| l.contains(" start "))
        .map(|l| l.split(' ').next().unwrap().to_owned())
        .collect();
    assert_eq!(
        starts,
        [
            "slow-blocker",
            "ok-critical",
            "ok-high",
            "ok-normal-a",
            "ok-normal-b",
            "ok-low"
        ]
    );
    service.stop().await;
}

#[tokio::test]
async fn a_failing_task_is_retried_until_it_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (_, ids) = service
        .create_servers(&["flaky-1"], json!({"max_attempts": 3}))
        .await;
    let task = service.wait_finished(&ids[0]).await;
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["attempts"], 3);
    assert_eq!(task["output"]["attempt"], 3);
    assert_eq!(task["error"], serde_json::Value::Null);
    let (_, log) = service.get_text(&format!("/tasks/{}/logs", ids[0])).await;
    assert_eq!(log.matches("transient error").count(), 2, "{log}");
    service.stop().await;
}

#[tokio::test]
async fn retries_stop_when_attempts_are_used_up() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (workflow, ids) = service
        .create_servers(&["fail-1"], json!({"max_attempts": 2}))
        .await;
    let task = service.wait_finished(&ids[0]).await;
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(task["attempts"], 2);
    assert_eq!(task["exit_code"], 4);
    let error = task["error"].as_str().unwrap();
    assert!(
        error.contains("code 4") && error.contains("permanent failure for fail-1"),
        "{error}"
    );
    let view = service.wait_workflow(&workflow).await;
    assert_eq!(view["status"], "failed");
    assert_eq!(
        service
            .trace()
            .iter()
            .filter(|l| l.contains("fail-1 start"))
            .count(),
        2
    );
    service.stop().await;
}

/// Waits until no process of the task is left (the script wrote its
/// child's pid, but as its own PID namespace numbers it).
async fn wait_dead(service: &TestService, server: &str, task_id: &str) {
    assert!(service.state_dir().join("pids").join(server).exists());
    for _ in 0..100 {
        if task_processes(task_id).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("processes {:?} are still alive", task_processes(task_id));
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (_, ids) = service
        .create_servers(&["hang-t"], json!({"timeout_secs": 1, "max_attempts": 1}))
        .await;
    let task = service.wait_finished(&ids[0]).await;
    assert_eq!(task["status"], "failed", "{task}");
    assert!(
        task["error"]
            .as_str()
            .unwrap()
            .contains("timed out after 1s"),
        "{task}"
    );
    // The script ignored SIGTERM and left a child behind; both are gone.
    wait_dead(&service, "hang-t", ids[0].as_str()).await;
    service.stop().await;
}

#[tokio::test]
async fn cancel_stops_a_running_task_and_its_children() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (workflow, ids) = service.create_servers(&["hang-c"], json!({})).await;
    service
        .wait_task(&ids[0], |t| t["status"] == "running")
        .await;
    while !service.state_dir().join("pids/hang-c").exists() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, body) = service
        .post(&format!("/tasks/{}/cancel", ids[0]), json!(null))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["cancel_requested"], true);
    let task = service.wait_finished(&ids[0]).await;
    assert_eq!(task["status"], "cancelled", "{task}");
    assert_eq!(task["attempts"], 1);
    wait_dead(&service, "hang-c", ids[0].as_str()).await;
    let view = service.wait_workflow(&workflow).await;
    assert_eq!(view["status"], "cancelled");
    // A finished task can not be cancelled again.
    let (status, body) = service
        .post(&format!("/tasks/{}/cancel", ids[0]), json!(null))
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already finished")
    );
    service.stop().await;
}

#[tokio::test]
async fn cancel_of_a_queued_task_means_it_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.workers = 1;
    let service = TestService::start(settings).await;
    let (_, blocker) = service.create_servers(&["slow-b"], json!({})).await;
    service
        .wait_task(&blocker[0], |t| t["status"] == "running")
        .await;
    let (_, queued) = service.create_servers(&["ok-never"], json!({})).await;
    let (status, body) = service
        .post(&format!("/tasks/{}/cancel", queued[0]), json!(null))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "cancelled");
    assert_eq!(body["attempts"], 0);
    service.wait_finished(&blocker[0]).await;
    // Let the dispatcher pop the cancelled entry before looking.
    let (_, after) = service.create_servers(&["ok-after"], json!({})).await;
    service.wait_finished(&after[0]).await;
    assert!(!service.trace().iter().any(|l| l.starts_with("ok-never")));
    assert_eq!(
        service.get(&format!("/tasks/{}", queued[0])).await.1["status"],
        "cancelled"
    );
    service.stop().await;
}

#[tokio::test]
async fn logs_are_readable_while_running_and_after() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (_, ids) = service.create_servers(&["hang-log"], json!({})).await;
    let path = format!("/tasks/{}/logs", ids[0]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (status, log) = service.get_text(&path).await;
        assert_eq!(status, 200);
        if log.contains("hello from hang-log (attempt 1)") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "log never showed up"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        service.get(&format!("/tasks/{}", ids[0])).await.1["status"],
        "running"
    );
    service
        .post(&format!("/tasks/{}/cancel", ids[0]), json!(null))
        .await;
    service.wait_finished(&ids[0]).await;

    let response = service
        .http
        .get(format!("{}{path}?offset=6", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-task-status"], "cancelled");
    let next: u64 = response.headers()["x-next-offset"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let tail = response.text().await.unwrap();
    assert!(tail.starts_with("from hang-log"), "{tail}");
    assert_eq!(next, 6 + tail.len() as u64);
    service.stop().await;
}

#[tokio::test]
async fn check_mode_reaches_the_script_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (status, body) = service
        .post(
            "/workflows/servers/create",
            json!({"infra": "test", "servers": ["ok-dry"], "check_mode": true, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["tasks"][0]["check_mode"], true);
    assert_eq!(body["tasks"][0]["output"]["check_mode"], true);
    assert_eq!(body["tasks"][0]["input"]["check_mode"], true);
    assert!(
        !crate::harness::script_state(dir.path())
            .join("created/ok-dry")
            .exists()
    );
    service.stop().await;
}

#[tokio::test]
async fn a_cluster_runs_servers_then_taskservs_then_the_join() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (status, body) = service
        .post(
            "/workflows/cluster/create",
            json!({"infra": "test", "cluster": "k", "servers": ["ok-a", "ok-b"],
                   "taskservs": ["containerd", "kubernetes"], "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "completed");
    let trace = service.trace();
    let at = |needle: &str| trace.iter().position(|l| l.starts_with(needle)).unwrap();
    assert!(at("ok-a end") < at("containerd@ok-a"));
    assert!(at("containerd@ok-a") < at("kubernetes@ok-a"));
    assert!(at("ok-b end") < at("containerd@ok-b"));
    let join = at("join start");
    assert!(at("kubernetes@ok-a") < join && at("kubernetes@ok-b") < join);
    service.stop().await;
}

#[tokio::test]
async fn dependents_of_a_failed_server_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (status, body) = service
        .post(
            "/workflows/cluster/create",
            json!({"infra": "test", "cluster": "k", "servers": ["ok-a", "fail-b"],
                   "taskservs": ["containerd"], "max_attempts": 1, "wait": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "failed");
    let by_name = |name: &str| {
        body["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(by_name("install containerd on ok-a")["status"], "completed");
    assert_eq!(by_name("create server fail-b")["status"], "failed");
    let skipped = by_name("install containerd on fail-b");
    assert_eq!(skipped["status"], "skipped");
    assert!(
        skipped["error"]
            .as_str()
            .unwrap()
            .contains("create server fail-b")
    );
    assert_eq!(by_name("join cluster k")["status"], "skipped");
    service.stop().await;
}

#[tokio::test]
async fn listing_filters_by_status_and_workflow_and_pages() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (w1, ids1) = service
        .create_servers(&["ok-1", "ok-2", "ok-3"], json!({"wait": true}))
        .await;
    let (_, ids2) = service
        .create_servers(&["fail-x"], json!({"max_attempts": 1, "wait": true}))
        .await;
    let (_, page) = service
        .get(&format!("/tasks?workflow={w1}&limit=2&offset=1"))
        .await;
    assert_eq!(page["total"], 3);
    let listed: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids1[1].as_str(), ids1[0].as_str()], "newest first");
    let (_, failed) = service.get("/tasks?status=failed").await;
    assert_eq!(failed["total"], 1);
    assert_eq!(failed["tasks"][0]["id"], ids2[0].as_str());
    let (_, all) = service.get("/tasks").await;
    assert_eq!(all["total"], 4);
    assert_eq!(all["limit"], 50);
    assert!(all.get("next_after").is_none(), "one page holds all: {all}");

    // Keyset paging: each page names the next one's `after`, the last
    // names none, and together they are the listing, once each.
    let everything: Vec<Value> = all["tasks"].as_array().unwrap().clone();
    let mut walked = Vec::new();
    let mut path = "/tasks?limit=3".to_owned();
    loop {
        let (status, page) = service.get(&path).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["total"], 4);
        walked.extend(page["tasks"].as_array().unwrap().iter().cloned());
        match page["next_after"].as_str() {
            Some(next) => path = format!("/tasks?limit=3&after={next}"),
            None => break,
        }
    }
    assert_eq!(walked, everything);
    // Past the workflow's newest task, its two older ones.
    let (_, older) = service
        .get(&format!("/tasks?workflow={w1}&after={}", ids1[2]))
        .await;
    let listed: Vec<&str> = older["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [ids1[1].as_str(), ids1[0].as_str()]);
    let (_, workflows) = service.get("/workflows?limit=1").await;
    let next = workflows["next_after"].as_str().unwrap().to_owned();
    let (_, second) = service
        .get(&format!("/workflows?limit=1&after={next}"))
        .await;
    assert_eq!(second["workflows"][0]["id"], w1.as_str(), "{second}");
    assert!(second.get("next_after").is_none(), "{second}");
    // A cursor that is not an id is refused, naming the parameter.
    for path in ["/tasks?after=nope", "/workflows?after=12"] {
        let (status, body) = service.get(path).await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("after"),
            "{body}"
        );
    }
    service.stop().await;
}
