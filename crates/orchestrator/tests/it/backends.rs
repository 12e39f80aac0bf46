//! The whole service on each storage backend: submit over HTTP, watch the
//! work finish, restart on the same store and find it all again. The
//! SurrealDB backends run against a real server (`surreal-dev-server`).

use std::path::Path;
use std::process::Command;

use orchestrator::settings::ServeSettings;
use serde_json::json;

use crate::harness::{TestService, fixture_settings};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

/// Submits, finishes, restarts, and compares: the same flow for every
/// backend. `settings` must point at a fresh, empty store.
async fn full_flow(settings: ServeSettings) {
    let backend = settings.storage_type.as_str();
    let service = TestService::start(settings.clone()).await;
    let (status, health) = service.get("/health").await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["storage"], backend);

    let (workflow, ids) = service
        .create_servers(&["ok-1", "ok-2"], json!({"wait": true}))
        .await;
    for id in &ids {
        assert_eq!(service.wait_finished(id).await["status"], "completed");
    }
    let (failing_workflow, failing) = service
        .create_servers(&["fail-1"], json!({"max_attempts": 1}))
        .await;
    assert_eq!(service.wait_finished(&failing[0]).await["status"], "failed");
    // The workflow settles just after its last task: wait for that too, so
    // the listing compared across the restart is final, not mid-update.
    assert_eq!(
        service.wait_workflow(&failing_workflow).await["status"],
        "failed"
    );
    let (status, log) = service.get_text(&format!("/tasks/{}/logs", ids[0])).await;
    assert_eq!(status, 200);
    assert!(!log.is_empty(), "the script's output was stored");

    let (_, tasks) = service.get("/tasks").await;
    assert_eq!(tasks["total"], 3, "{tasks}");
    let one = service.wait_workflow(&workflow).await;
    assert_eq!(one["status"], "completed", "{one}");
    let (_, workflows) = service.get("/workflows").await;
    service.stop().await;

    let service = TestService::start(settings).await;
    assert_eq!(service.get("/tasks").await.1, tasks, "{backend}");
    assert_eq!(service.get("/workflows").await.1, workflows, "{backend}");
    assert_eq!(
        service.get_text(&format!("/tasks/{}/logs", ids[0])).await.1,
        log
    );
    service.stop().await;
}

#[tokio::test]
async fn the_service_runs_on_the_filesystem() {
    let dir = tempfile::tempdir().unwrap();
    full_flow(fixture_settings(dir.path())).await;
}

/// `orchestrator db status` for a store, through the real binary.
fn db_status(args: &[&str], data_dir: &Path) -> (bool, String) {
    let output = Command::new(BIN)
        .args(["db", "status", "--data-dir"])
        .arg(data_dir)
        .args(args)
        .output()
        .unwrap();
    let text = crate::harness::output_text(&output);
    (output.status.success(), text)
}

#[test]
fn db_status_shows_the_filesystem_layout_version() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, text) = db_status(&[], dir.path());
    assert!(ok, "{text}");
    assert!(text.contains("storage: filesystem"), "{text}");
    assert!(text.contains("layout version 1  pending"), "{text}");
}

#[cfg(feature = "surrealdb")]
#[path = "../../../orchestrator-storage/tests/it/dev_server.rs"]
pub(crate) mod dev_server;

#[cfg(feature = "surrealdb")]
mod surrealdb {
    use std::time::{Duration, Instant};

    use orchestrator_storage::{StorageType, SurrealdbConfig};

    use super::dev_server::{DevServer, free_port};
    use super::*;

    /// The STATE column of `db status`'s row for a migration (the columns
    /// are as wide as their longest name).
    fn migration_state<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines().find_map(|line| {
            let mut columns = line.split_whitespace();
            let _version = columns.next()?;
            (columns.next()? == name).then(|| columns.next()).flatten()
        })
    }

    fn server_settings(data_dir: &Path, server: &DevServer) -> ServeSettings {
        let mut settings = fixture_settings(data_dir);
        settings.storage_type = StorageType::SurrealdbServer;
        settings.surrealdb = SurrealdbConfig {
            url: server.url(),
            database: format!("test_{}", uuid::Uuid::now_v7().simple()),
            request_timeout: Duration::from_secs(3),
            ..SurrealdbConfig::default()
        };
        settings
    }

    #[tokio::test]
    async fn the_service_runs_on_embedded_surrealdb() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = fixture_settings(dir.path());
        settings.storage_type = StorageType::SurrealdbEmbedded;
        full_flow(settings).await;
        assert!(dir.path().join("surrealdb").is_dir());

        let (ok, text) = db_status(&["--storage-type", "surrealdb-embedded"], dir.path());
        assert!(ok, "{text}");
        assert!(
            migration_state(&text, "workflows_and_tasks") == Some("applied"),
            "{text}"
        );
        // Every migration the repository ships, whatever their number.
        let shipped = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "surql"))
            })
            .count();
        assert!(
            text.contains(&format!("{shipped} applied, 0 pending")),
            "{text}"
        );
    }

    #[tokio::test]
    async fn the_service_runs_on_a_surrealdb_server() {
        let dir = tempfile::tempdir().unwrap();
        let server = DevServer::start_memory();
        let settings = server_settings(dir.path(), &server);
        let database = settings.surrealdb.database.clone();
        full_flow(settings).await;

        let (ok, text) = db_status(
            &[
                "--storage-type",
                "surrealdb-server",
                "--surrealdb-url",
                &server.url(),
                "--surrealdb-database",
                &database,
            ],
            dir.path(),
        );
        assert!(ok, "{text}");
        assert!(
            migration_state(&text, "task_logs") == Some("applied"),
            "{text}"
        );
    }

    /// Waits on a node's event stream until both workflows have finished,
    /// and returns what it heard about them.
    async fn heard(
        events: &mut orchestrator_engine::events::Subscription,
        workflows: &[&str],
    ) -> Vec<(String, String, Option<String>)> {
        let mut heard = Vec::new();
        let mut finished = std::collections::HashSet::new();
        while finished.len() < workflows.len() {
            let event = tokio::time::timeout(Duration::from_secs(60), events.recv())
                .await
                .expect("an event within a minute")
                .expect("the bus is open");
            let Some(workflow) = event.workflow_id.map(|w| w.to_string()) else {
                continue;
            };
            if !workflows.contains(&workflow.as_str()) {
                continue;
            }
            if event.task_id.is_none() && event.status.as_deref() == Some("completed") {
                finished.insert(workflow.clone());
            }
            heard.push((workflow, event.kind.to_string(), event.status.clone()));
        }
        heard
    }

    /// Each node hears the other's changes, through the server's live
    /// queries: a submission made through one node is announced on both.
    #[tokio::test]
    async fn two_nodes_on_one_server_hear_each_others_events() {
        let server = DevServer::start_memory();
        let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let settings_a = server_settings(dir_a.path(), &server);
        let mut settings_b = server_settings(dir_b.path(), &server);
        settings_b.surrealdb.database = settings_a.surrealdb.database.clone();
        let a = TestService::start(settings_a).await;
        let b = TestService::start(settings_b).await;
        let engine = |s: &TestService| s.handle.as_ref().unwrap().engine.clone();
        let mut on_a = engine(&a).subscribe();
        let mut on_b = engine(&b).subscribe();
        let (from_a, _) = a.create_servers(&["from-a"], json!({})).await;
        let (from_b, _) = b.create_servers(&["from-b"], json!({})).await;
        let workflows = [from_a.as_str(), from_b.as_str()];
        for (node, events) in [("a", &mut on_a), ("b", &mut on_b)] {
            let heard = heard(events, &workflows).await;
            for workflow in workflows {
                let kinds: Vec<&str> = heard
                    .iter()
                    .filter(|(w, _, _)| w == workflow)
                    .map(|(_, kind, _)| kind.as_str())
                    .collect();
                for expected in [
                    "submitted",
                    "claimed",
                    "completed",
                    "workflow_status_changed",
                ] {
                    assert!(
                        kinds.contains(&expected),
                        "node {node} did not hear `{expected}` of {workflow}: {kinds:?}"
                    );
                }
                let submitted = kinds.iter().position(|k| *k == "submitted").unwrap();
                let completed = kinds.iter().position(|k| *k == "completed").unwrap();
                assert!(submitted < completed, "node {node}: {kinds:?}");
            }
        }
        a.stop().await;
        b.stop().await;
    }

    #[tokio::test]
    async fn health_reports_a_lost_server_and_its_return() {
        let dir = tempfile::tempdir().unwrap();
        let server_data = tempfile::tempdir().unwrap();
        let mut server = DevServer::start_persistent(server_data.path());
        let service = TestService::start(server_settings(dir.path(), &server)).await;
        let (_, ids) = service
            .create_servers(&["ok-1"], json!({"wait": true}))
            .await;

        server.kill();
        let (status, health) = service.get("/health").await;
        assert_eq!(status, 503, "{health}");
        assert_eq!(health["status"], "unhealthy");
        assert!(
            health["reason"].as_str().unwrap().contains(&server.url()),
            "{health}"
        );
        // A submission that cannot be stored is refused, not dropped.
        let (status, body) = service
            .post(
                "/workflows/servers/create",
                json!({"infra": "test", "servers": ["ok-2"]}),
            )
            .await;
        assert_eq!(status, 503, "{body}");

        server.restart();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, health) = service.get("/health").await;
            if status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "never reconnected: {health}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(service.wait_finished(&ids[0]).await["status"], "completed");
        let (_, more) = service
            .create_servers(&["ok-3"], json!({"wait": true}))
            .await;
        assert_eq!(service.wait_finished(&more[0]).await["status"], "completed");
        service.stop().await;
    }

    /// Runs `serve` with `args` and expects it to give up, quickly and
    /// clearly, with a non-zero exit.
    fn serve_fails(args: &[&str], expected: &str, secret: Option<&str>) {
        let dir = tempfile::tempdir().unwrap();
        let started = Instant::now();
        let output = Command::new(BIN)
            .args(["serve", "--port", "0", "--data-dir"])
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(started.elapsed() < Duration::from_secs(20), "{args:?}");
        if let Some(secret) = secret {
            assert!(!stderr.contains(secret), "the password leaked: {stderr}");
        }
    }

    #[test]
    fn an_unreachable_server_or_a_wrong_password_stops_the_start() {
        let nowhere = format!("ws://127.0.0.1:{}", free_port());
        serve_fails(
            &[
                "--storage-type",
                "surrealdb-server",
                "--surrealdb-url",
                &nowhere,
                "--surrealdb-connect-timeout",
                "2",
            ],
            "cannot connect to the SurrealDB server",
            None,
        );
        let server = DevServer::start_memory();
        serve_fails(
            &[
                "--storage-type",
                "surrealdb-server",
                "--surrealdb-url",
                &server.url(),
                "--surrealdb-password",
                "s3cr3t-but-wrong",
            ],
            "cannot sign in",
            Some("s3cr3t-but-wrong"),
        );
    }
}
