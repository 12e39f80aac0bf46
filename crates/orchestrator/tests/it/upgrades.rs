//! Upgrades: a store written by the previous release opens with this build
//! and keeps everything; a store written by a newer release is refused by
//! every command, with what to do, and left as it is.
//!
//! `tests/fixtures/stores/layout-1` is a filesystem store as orchestrator
//! 0.1.0 wrote it before schedules, in layout 1 (see `make-layout-1.sh`
//! beside it): two finished workflows with their logs, tokens, a secret and
//! the audit log.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use orchestrator_storage::fs::LAYOUT_VERSION;
use serde_json::{Value, json};

use crate::harness::{TestService, fixture_scripts, fixture_settings};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");
/// The fixture's admin token (`ORCHESTRATOR_BOOTSTRAP_TOKEN` when it was made).
const ADMIN_TOKEN: &str = "fixture-bootstrap-token-0123456789abcdef";

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/stores")
        .join(name)
}

/// A copy of a fixture store to open: the one in the repository is never
/// written.
fn copy_of(name: &str, to: &Path) {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    copy(&fixture(name), to);
}

async fn get_ok(service: &TestService, path: &str) -> reqwest::Response {
    let response = service
        .http
        .get(format!("{}{path}", service.base))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "GET {path}");
    response
}

async fn get(service: &TestService, path: &str) -> Value {
    get_ok(service, path).await.json().await.unwrap()
}

/// Checks that each task's log says hello from its server.
async fn each_log_says_hello(service: &TestService, tasks: &Value) {
    for task in tasks["tasks"].as_array().unwrap() {
        let (id, server) = (
            task["id"].as_str().unwrap(),
            task["input"]["server"].as_str().unwrap(),
        );
        let log = get_ok(service, &format!("/tasks/{id}/logs"))
            .await
            .text()
            .await
            .unwrap();
        assert!(
            log.contains(&format!("hello from {server}")),
            "{server}: {log}"
        );
    }
}

#[tokio::test]
async fn a_store_of_the_previous_release_opens_with_everything_in_it() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    copy_of("layout-1", &data);
    // Read as it is, never upgraded by a reader: nothing converts from 1.
    let archive = root.path().join("before-upgrade.tar.zst");
    let output = Command::new(BIN)
        .args(["backup", "--to", archive.to_str().unwrap(), "--data-dir"])
        .arg(&data)
        .env_remove("ORCHESTRATOR_CONFIG")
        .output()
        .unwrap();
    let text = crate::harness::output_text(&output);
    assert!(output.status.success(), "{text}");
    assert!(text.contains("records: 2 workflows, 3 tasks,"), "{text}");
    assert!(text.contains("logs: 3 tasks' logs"), "{text}");
    assert_eq!(
        orchestrator_storage::fs::layout_version(&data).unwrap(),
        Some(1)
    );
    let mut settings = fixture_settings(&data);
    settings.auth = true;
    let service = TestService::start(settings.clone()).await;

    let workflows = get(&service, "/workflows").await;
    assert_eq!(workflows["total"], 2, "{workflows}");
    let mut statuses: Vec<&str> = workflows["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["status"].as_str().unwrap())
        .collect();
    statuses.sort_unstable();
    assert_eq!(statuses, ["completed", "failed"]);
    let tasks = get(&service, "/tasks").await;
    assert_eq!(tasks["total"], 3, "{tasks}");
    each_log_says_hello(&service, &tasks).await;
    // The old tokens still open the door, the secret is still sealed with
    // the old key, and the audit log goes on.
    let tokens = get(&service, "/tokens").await;
    let names: Vec<&str> = tokens["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"bootstrap") && names.contains(&"ci"),
        "{tokens}"
    );
    let secrets = get(&service, "/secrets").await;
    assert_eq!(secrets["secrets"][0]["name"], "api_key", "{secrets}");
    let audit = get(&service, "/audit?action=token.create").await;
    assert_eq!(audit["total"], 1, "{audit}");

    // New work on the upgraded store, kept across a restart.
    let response = service
        .http
        .post(format!("{}/workflows/servers/create", service.base))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"infra": "fixture", "servers": ["ok-9"], "wait": true}))
        .send()
        .await
        .unwrap();
    let view: Value = response.json().await.unwrap();
    assert_eq!(view["status"], "completed", "{view}");
    service.stop().await;
    assert_eq!(
        orchestrator_storage::fs::layout_version(&data).unwrap(),
        Some(LAYOUT_VERSION)
    );
    // The upgrade packed the old log files (layout 4), and the logs read
    // back from the pack after the restart below.
    let logs: Vec<String> = std::fs::read_dir(data.join("logs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        logs.iter().all(|name| name.ends_with(".pack")) && !logs.is_empty(),
        "{logs:?}"
    );
    let service = TestService::start(settings).await;
    assert_eq!(get(&service, "/workflows").await["total"], 3);
    each_log_says_hello(&service, &get(&service, "/tasks?limit=10").await).await;
    service.stop().await;
}

/// Runs the binary, which must exit (with a failure) within a minute: a
/// `serve` that started would not.
fn refused(args: &[&str]) -> String {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("ORCHESTRATOR_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("`orchestrator {}` did not refuse the store", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    let text = crate::harness::output_text(&output);
    assert!(!output.status.success(), "{text}");
    text
}

#[test]
fn a_store_written_by_a_newer_release_is_refused_and_left_alone() {
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    copy_of("layout-1", &data);
    let newer = format!(
        r#"{{"layout_version": {}, "written_by": "99.0.0"}}"#,
        LAYOUT_VERSION + 1
    );
    std::fs::write(data.join("layout.json"), &newer).unwrap();
    let journal = std::fs::read(data.join("journal.jsonl")).unwrap();
    let dir = data.to_str().unwrap();
    let scripts = fixture_scripts();

    let text = refused(&[
        "serve",
        "--data-dir",
        dir,
        "--port",
        "0",
        "--scripts-dir",
        scripts.to_str().unwrap(),
    ]);
    let expected = format!(
        "has layout version {} (written by orchestrator 99.0.0), newer than this build (orchestrator {})",
        LAYOUT_VERSION + 1,
        env!("CARGO_PKG_VERSION")
    );
    assert!(text.contains(&expected), "{text}");
    assert!(text.contains("run that version or a newer one"), "{text}");

    let text = refused(&["db", "status", "--data-dir", dir]);
    assert!(text.contains("unknown to this build"), "{text}");
    let archive = root.path().join("b.tar.zst");
    let text = refused(&[
        "backup",
        "--to",
        archive.to_str().unwrap(),
        "--data-dir",
        dir,
    ]);
    assert!(text.contains(&expected), "{text}");
    assert!(!archive.exists());
    let target = format!("filesystem:{}", root.path().join("copy").display());
    let text = refused(&[
        "migrate",
        "--from",
        &format!("filesystem:{dir}"),
        "--to",
        &target,
    ]);
    assert!(text.contains(&expected), "{text}");

    assert_eq!(
        std::fs::read_to_string(data.join("layout.json")).unwrap(),
        newer
    );
    assert_eq!(std::fs::read(data.join("journal.jsonl")).unwrap(), journal);
}

#[cfg(feature = "surrealdb")]
#[tokio::test]
async fn an_embedded_store_migrated_by_a_newer_release_is_refused() {
    use orchestrator_storage::surreal::SurrealBackend;
    use orchestrator_storage::surreal::schema_migrations::{MIGRATIONS, Migration};
    use orchestrator_storage::{Backend, StorageConfig, StorageType};

    let root = tempfile::tempdir().unwrap();
    let config = StorageConfig {
        storage_type: StorageType::SurrealdbEmbedded,
        data_dir: root.path().to_path_buf(),
        surrealdb: Default::default(),
    };
    let mut newer = MIGRATIONS.to_vec();
    newer.push(Migration {
        version: 9999,
        name: "from_a_newer_release",
        sql: "DEFINE TABLE from_the_future SCHEMALESS;",
    });
    SurrealBackend::open_with_migrations(&config, &newer)
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    let dir = root.path().to_str().unwrap().to_owned();
    let scripts = fixture_scripts();
    let text = tokio::task::spawn_blocking(move || {
        refused(&[
            "serve",
            "--storage-type",
            "surrealdb-embedded",
            "--data-dir",
            &dir,
            "--port",
            "0",
            "--scripts-dir",
            scripts.to_str().unwrap(),
        ])
    })
    .await
    .unwrap();
    assert!(text.contains("9999_from_a_newer_release.surql"), "{text}");
    assert!(text.contains("a newer orchestrator migrated it"), "{text}");
}
