//! `orchestrator backup` and `orchestrator restore` through the real
//! binary, on every backend, while a workflow runs: back up, restore into a
//! new store, start a service on it, and find every finished workflow as it
//! was and the unfinished one carried on to its end.

use std::path::Path;
use std::time::Duration;

use orchestrator::settings::ServeSettings;
use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

/// Runs the binary (asynchronously: the services under test answer on
/// this runtime meanwhile); returns whether it succeeded and its output.
async fn orchestrator(args: &[String]) -> (bool, String) {
    let output = tokio::process::Command::new(BIN)
        .args(args)
        .env_remove("ORCHESTRATOR_CONFIG")
        .output()
        .await
        .unwrap();
    let text = crate::harness::output_text(&output);
    (output.status.success(), text)
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

/// What the round trip compares: each finished workflow with its tasks, and
/// their logs.
async fn finished_state(service: &TestService, workflows: &[String]) -> Vec<Value> {
    let mut state = Vec::new();
    for id in workflows {
        let (status, workflow) = service.get(&format!("/workflows/{id}")).await;
        assert_eq!(status, 200, "{workflow}");
        for task in workflow["tasks"].as_array().unwrap() {
            let task_id = task["id"].as_str().unwrap();
            let (_, log) = service.get_text(&format!("/tasks/{task_id}/logs")).await;
            state.push(json!({"task": task_id, "log": log}));
        }
        state.push(workflow);
    }
    state
}

/// The whole round trip. `source` and `restored` are settings for a fresh
/// store each; `store_args` name the source store to `orchestrator
/// backup`, given the running service's port; `restore_to` is the spec of
/// `restored`'s store.
async fn round_trip(
    source: ServeSettings,
    store_args: impl Fn(u16) -> Vec<String>,
    restore_to: &str,
    restored: ServeSettings,
    archive: &Path,
) -> String {
    let service = TestService::start(source.clone()).await;
    let (ok, _) = service
        .create_servers(&["ok-1", "ok-2"], json!({"wait": true}))
        .await;
    let (failed, tasks) = service
        .create_servers(&["fail-1"], json!({"max_attempts": 1}))
        .await;
    service.wait_finished(&tasks[0]).await;
    service.wait_workflow(&failed).await;
    let response = service
        .http
        .put(format!("{}/secrets/api_key", service.base))
        .json(&json!({"value": "backed-up", "templates": ["deploy"],
                      "origins": ["https://vault.example:8200"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let finished = vec![ok, failed];
    let before = finished_state(&service, &finished).await;

    // Steps a and d sleep while the backup is taken; b and c wait for a.
    let (status, running) = service
        .post(
            "/workflows",
            json!({"template": "chain", "vars": {"sleep": 6}}),
        )
        .await;
    assert_eq!(status, 202, "{running}");
    let running = running["id"].as_str().unwrap().to_owned();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, view) = service.get(&format!("/workflows/{running}")).await;
        let started = view["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["status"] == "running");
        if started {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ran: {view}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    let port = service.handle.as_ref().unwrap().addr.port();
    let mut args = strings(&["backup", "--to", archive.to_str().unwrap()]);
    args.extend(store_args(port));
    let (done, backed_up) = orchestrator(&args).await;
    assert!(done, "{backed_up}");
    let (_, view) = service.get(&format!("/workflows/{running}")).await;
    assert_eq!(
        view["status"], "running",
        "the backup outlasted the workflow: {view}"
    );
    assert!(
        backed_up.contains("its 1 secrets are sealed"),
        "{backed_up}"
    );

    let restore = strings(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--to",
        restore_to,
    ]);
    let (done, restored_text) = orchestrator(&restore).await;
    assert!(done, "{restored_text}");
    assert!(
        restored_text.contains("verified it record by record"),
        "{restored_text}"
    );
    // Into a store that now holds records: refused, and nothing changes.
    let (done, again) = orchestrator(&restore).await;
    assert!(!done, "{again}");
    assert!(
        again.contains("restore only into an empty store"),
        "{again}"
    );

    // The cancel ends the source's sleeping steps at once, so it stops fast.
    service
        .post(&format!("/workflows/{running}/cancel"), json!({}))
        .await;
    service.stop().await;

    // The secrets open with the old store's key, which travels apart.
    std::fs::create_dir_all(&restored.data_dir).unwrap();
    std::fs::copy(
        source.data_dir.join("secret.key"),
        restored.data_dir.join("secret.key"),
    )
    .unwrap();
    let service = TestService::start(restored).await;
    assert_eq!(finished_state(&service, &finished).await, before);
    let (_, secrets) = service.get("/secrets").await;
    assert_eq!(secrets["secrets"][0]["name"], "api_key", "{secrets}");
    // Its scope travels with it.
    assert_eq!(
        secrets["secrets"][0]["scope"],
        json!({"templates": ["deploy"], "origins": ["https://vault.example:8200"]}),
        "{secrets}"
    );
    let resumed = service.wait_workflow(&running).await;
    assert_eq!(resumed["status"], "completed", "{resumed}");
    service.stop().await;
    backed_up
}

#[tokio::test]
async fn a_filesystem_store_backed_up_while_it_runs_restores_whole() {
    let root = tempfile::tempdir().unwrap();
    let source = root.path().join("source");
    let store = source.clone();
    let archive = root.path().join("backups/fs.tar.zst");
    std::fs::create_dir_all(archive.parent().unwrap()).unwrap();
    let target = root.path().join("restored");
    let text = round_trip(
        fixture_settings(&source),
        move |_| strings(&["--data-dir", store.to_str().unwrap()]),
        &format!("filesystem:{}", target.display()),
        fixture_settings(&target),
        &archive,
    )
    .await;
    assert!(text.contains("pass 2 found nothing changed"), "{text}");
    // The archive is for its owner only, and nothing else was left behind.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&archive).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let left: Vec<_> = std::fs::read_dir(archive.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, [std::ffi::OsString::from("fs.tar.zst")]);
}

#[tokio::test]
async fn a_backup_never_overwrites_and_a_damaged_archive_is_refused_by_name() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    let service = TestService::start(fixture_settings(&data)).await;
    service
        .create_servers(&["ok-1"], json!({"wait": true}))
        .await;
    let archive = root.path().join("b.tar.zst");
    let backup = strings(&[
        "backup",
        "--to",
        archive.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let (done, text) = orchestrator(&backup).await;
    assert!(done, "{text}");
    let (done, text) = orchestrator(&backup).await;
    assert!(!done && text.contains("the file exists"), "{text}");
    service.stop().await;

    // Cut short: the compressed stream ends early.
    let bytes = std::fs::read(&archive).unwrap();
    let cut = root.path().join("cut.tar.zst");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let target = root.path().join("target");
    let restore = |from: &Path| {
        strings(&[
            "restore",
            "--from",
            from.to_str().unwrap(),
            "--to",
            &format!("filesystem:{}", target.display()),
        ])
    };
    let (done, text) = orchestrator(&restore(&cut)).await;
    assert!(!done, "{text}");
    assert!(text.contains("damaged"), "{text}");
    assert!(!target.exists(), "a damaged archive touched the target");

    // Not an archive at all.
    let foreign = root.path().join("notes.txt");
    std::fs::write(&foreign, "hello").unwrap();
    let (done, text) = orchestrator(&restore(&foreign)).await;
    assert!(
        !done && text.contains("not a zstd-compressed tar file"),
        "{text}"
    );
}

#[cfg(feature = "surrealdb")]
mod surrealdb {
    use orchestrator_storage::{StorageType, SurrealdbConfig};

    use super::*;
    use crate::backends::dev_server::DevServer;

    #[tokio::test]
    async fn an_embedded_store_held_by_its_service_is_backed_up_through_it() {
        let root = tempfile::tempdir().unwrap();
        let source = root.path().join("source");
        let target = root.path().join("restored");
        let mut settings = fixture_settings(&source);
        settings.storage_type = StorageType::SurrealdbEmbedded;
        let mut restored = fixture_settings(&target);
        restored.storage_type = StorageType::SurrealdbEmbedded;
        let store = source.clone();
        let text = round_trip(
            settings,
            move |port| {
                strings(&[
                    "--storage-type",
                    "surrealdb-embedded",
                    "--data-dir",
                    store.to_str().unwrap(),
                    "--port",
                    &port.to_string(),
                ])
            },
            &format!("surrealdb-embedded:{}", target.display()),
            restored,
            &root.path().join("embedded.tar.zst"),
        )
        .await;
        assert!(text.contains("through the running service"), "{text}");
    }

    #[tokio::test]
    async fn a_store_on_a_surrealdb_server_is_backed_up_while_it_runs() {
        let root = tempfile::tempdir().unwrap();
        let server = DevServer::start_memory();
        let database = |name: &str| format!("{name}_{}", uuid::Uuid::now_v7().simple());
        let (source_db, restored_db) = (database("source"), database("restored"));
        let on_server = |dir: &Path, db: &str| {
            let mut settings = fixture_settings(dir);
            settings.storage_type = StorageType::SurrealdbServer;
            settings.surrealdb = SurrealdbConfig {
                url: server.url(),
                database: db.to_owned(),
                request_timeout: Duration::from_secs(3),
                ..SurrealdbConfig::default()
            };
            settings
        };
        let url = server.url();
        let db = source_db.clone();
        round_trip(
            on_server(&root.path().join("source"), &source_db),
            move |_| {
                strings(&[
                    "--storage-type",
                    "surrealdb-server",
                    "--surrealdb-url",
                    &url,
                    "--surrealdb-database",
                    &db,
                ])
            },
            &format!(
                "surrealdb-server:{}/orchestrator/{restored_db}",
                server.url()
            ),
            on_server(&root.path().join("restored"), &restored_db),
            &root.path().join("server.tar.zst"),
        )
        .await;
    }
}
