//! Live storage migration: a running service moves to another store while
//! clients keep submitting and reading; crashes in every phase; rollback;
//! refusals.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

/// A one-step workflow; `i` keeps each submission distinct.
fn workflow(i: usize) -> Value {
    json!({
        "template": {
            "name": "moved", "ref_name": format!("moved-{i}"), "schema_version": 1,
            "steps": [{"ref_name": "only", "script": "dag/step.py", "input": {"name": format!("w{i}"), "sleep": 0.01}}],
        },
    })
}

/// Starts a storage move and waits for its end; the final status.
async fn migrate(service: &TestService, target: &str, batch_size: usize) -> Value {
    let (status, started) = service
        .post(
            "/admin/storage/migrations",
            json!({"target": target, "batch_size": batch_size}),
        )
        .await;
    assert_eq!(status, 202, "{started}");
    wait_migration(service, started["id"].as_str().unwrap()).await
}

/// A condition, not a timing: a debug-built SurrealDB target on a busy
/// 2-core machine takes from tens to a few hundred records a second, and
/// the move ends only once its mirror rounds stop (see `mirror`).
async fn wait_migration(service: &TestService, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (status, body) = service
            .get(&format!("/admin/storage/migrations/{id}"))
            .await;
        assert_eq!(status, 200, "{body}");
        if matches!(
            body["phase"].as_str(),
            Some("completed" | "cancelled" | "failed" | "abandoned")
        ) {
            return body;
        }
        assert!(Instant::now() < deadline, "migration never ended: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What a steady client saw.
#[derive(Default)]
#[cfg_attr(not(feature = "surrealdb"), allow(dead_code))] // only the moves to SurrealDB load it
struct Load {
    acknowledged: Vec<String>,
    errors: Vec<String>,
    requests: u64,
    longest: Duration,
}

/// Submits a workflow and reads it back every `every`, until `stop`.
#[cfg_attr(not(feature = "surrealdb"), allow(dead_code))] // only the moves to SurrealDB load it
async fn steady_client(base: String, stop: Arc<AtomicBool>, every: Duration) -> Load {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut load = Load::default();
    let mut tick = tokio::time::interval(every);
    let mut i = 10_000;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        i += 1;
        let started = Instant::now();
        let answer = http
            .post(format!("{base}/workflows"))
            .json(&workflow(i))
            .send()
            .await;
        load.requests += 1;
        let id = match answer {
            Ok(response) if response.status().as_u16() == 202 => {
                let body: Value = response.json().await.unwrap();
                body["id"].as_str().unwrap().to_owned()
            }
            Ok(response) => {
                let status = response.status();
                load.errors.push(format!(
                    "submit: {status} {}",
                    response.text().await.unwrap_or_default()
                ));
                continue;
            }
            Err(e) => {
                load.errors.push(format!("submit: {e}"));
                continue;
            }
        };
        load.longest = load.longest.max(started.elapsed());
        load.acknowledged.push(id.clone());
        let started = Instant::now();
        match http.get(format!("{base}/workflows/{id}")).send().await {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => load
                .errors
                .push(format!("read {id}: {}", response.status())),
            Err(e) => load.errors.push(format!("read {id}: {e}")),
        }
        load.requests += 1;
        load.longest = load.longest.max(started.elapsed());
    }
    load
}

/// Every acknowledged workflow is there and completes.
async fn all_complete(service: &TestService, ids: &[String]) {
    for id in ids {
        let view = service.wait_workflow(id).await;
        assert_eq!(view["status"], "completed", "{id}: {view}");
    }
}

/// Moves a service under a steady load of submissions and reads from its
/// store to `target`, and checks what the issue promises: no client
/// error, every acknowledged submission on the target and finished, and
/// a restart with the same settings on the target.
#[cfg_attr(not(feature = "surrealdb"), allow(dead_code))] // only the moves to SurrealDB load it
async fn move_under_load(
    mut settings: orchestrator::settings::ServeSettings,
    target: &str,
    expect: &str,
    every: Duration,
) {
    settings.workers = 4;
    let service = TestService::start(settings.clone()).await;
    // Something to copy before the load starts.
    let mut before = Vec::new();
    for i in 0..30 {
        let (status, view) = service.post("/workflows", workflow(i)).await;
        assert_eq!(status, 202, "{view}");
        before.push(view["id"].as_str().unwrap().to_owned());
    }
    let stop = Arc::new(AtomicBool::new(false));
    let client = tokio::spawn(steady_client(service.base.clone(), stop.clone(), every));
    // The load runs a moment before, during and after the move.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let moved = migrate(&service, target, 100).await;
    assert_eq!(moved["phase"], "completed", "{moved}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let load = client.await.unwrap();
    assert!(
        load.errors.is_empty(),
        "{} client errors: {:?}",
        load.errors.len(),
        load.errors
    );
    assert!(load.acknowledged.len() >= 3, "the client kept submitting");
    eprintln!(
        "storage move to {target}: {} requests, longest {:.1} ms; stall at the switch {} ms; phases {}",
        load.requests,
        load.longest.as_secs_f64() * 1000.0,
        moved["switch_stall_ms"],
        moved["phases"]
    );
    let (_, health) = service.get("/health").await;
    assert_eq!(health["storage"], expect, "{health}");
    let all: Vec<String> = before.iter().chain(&load.acknowledged).cloned().collect();
    all_complete(&service, &all).await;
    service.stop().await;

    // The same settings, restarted: the data dir's choice opens the target.
    let again = TestService::start(settings).await;
    let (_, health) = again.get("/health").await;
    assert_eq!(health["storage"], expect, "{health}");
    let (_, store) = again.get("/admin/storage").await;
    assert_eq!(store["store"], moved["target"], "{store}");
    for id in &all {
        let (status, view) = again.get(&format!("/workflows/{id}")).await;
        assert_eq!(status, 200, "{id} lost: {view}");
        assert_eq!(view["status"], "completed", "{view}");
    }
    again.stop().await;
}

/// Rollback returns to the store left at the switch, bringing along what
/// was written since, for as long as the service knows every such write;
/// after a restart that followed a write, it is refused with the reason,
/// and a new migration back brings the old store up to date instead.
#[tokio::test]
async fn rollback_brings_the_writes_since_the_switch_and_is_refused_once_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let other = dir.path().join("other");
    let settings = fixture_settings(&data);
    let service = TestService::start(settings.clone()).await;
    let (status, refused) = service.post("/admin/storage/rollback", json!({})).await;
    assert_eq!(status, 409, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("never switched"), "{message}");
    let (_, first) = service.post("/workflows", workflow(1)).await;
    let first = first["id"].as_str().unwrap().to_owned();
    all_complete(&service, std::slice::from_ref(&first)).await;

    let source = format!("filesystem:{}", data.display());
    let target = format!("filesystem:{}", other.display());
    let moved = migrate(&service, &target, 500).await;
    assert_eq!(moved["phase"], "completed", "{moved}");
    let (_, store) = service.get("/admin/storage").await;
    assert_eq!(store["store"], target, "{store}");
    assert_eq!(store["previous"], source, "{store}");
    assert_eq!(store["can_roll_back"], true, "{store}");

    // Written on the target only; the rollback carries it back.
    let (_, second) = service.post("/workflows", workflow(2)).await;
    let second = second["id"].as_str().unwrap().to_owned();
    all_complete(&service, std::slice::from_ref(&second)).await;
    let (_, store) = service.get("/admin/storage").await;
    assert_eq!(store["level"], false, "{store}");
    assert_eq!(store["can_roll_back"], true, "{store}");
    let (status, back) = service.post("/admin/storage/rollback", json!({})).await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["store"], source, "{back}");
    let (_, health) = service.get("/health").await;
    assert_eq!(health["storage"], "filesystem");
    all_complete(&service, &[first.clone(), second.clone()]).await;

    // And forward again, to write once more and restart.
    let (status, forward) = service.post("/admin/storage/rollback", json!({})).await;
    assert_eq!(status, 200, "{forward}");
    assert_eq!(forward["store"], target, "{forward}");
    let (_, third) = service.post("/workflows", workflow(3)).await;
    let third = third["id"].as_str().unwrap().to_owned();
    all_complete(&service, std::slice::from_ref(&third)).await;
    service.stop().await;
    let choice: Value =
        serde_json::from_slice(&std::fs::read(data.join("storage.json")).unwrap()).unwrap();
    assert_eq!(choice["level"], false, "{choice}");
    assert_eq!(choice["store"], target, "{choice}");

    // After the restart the writes since the switch are unknown: refused.
    let service = TestService::start(settings.clone()).await;
    let (_, store) = service.get("/admin/storage").await;
    assert_eq!(store["can_roll_back"], false, "{store}");
    let (status, refused) = service.post("/admin/storage/rollback", json!({})).await;
    assert_eq!(status, 409, "{refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("no longer level"), "{message}");
    assert!(message.contains("storage migrate --to"), "{message}");
    // The CLI's status says so too, with the same reason.
    let base = service.base.clone();
    let shown = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::cli::BIN)
            .args(["--url", &base, "storage", "status"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains(&format!("rollback: refused: {message}")),
        "{shown}"
    );
    let (_, health) = service.get("/health").await;
    assert_eq!(health["storage"], "filesystem");
    let (status, view) = service.get(&format!("/workflows/{third}")).await;
    assert_eq!(status, 200, "{view}");

    // Moving back with a migration resumes into the old store.
    let back = migrate(&service, &source, 500).await;
    assert_eq!(back["phase"], "completed", "{back}");
    all_complete(&service, &[first, second, third]).await;
    service.stop().await;
}

/// A target that holds records, the current store, a malformed or
/// relative spec and a bad batch size are refused, each naming the value;
/// nothing is started.
#[tokio::test]
async fn bad_targets_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let full = dir.path().join("full");
    // A store with records of its own.
    let other = TestService::start(fixture_settings(&full)).await;
    let (_, view) = other.post("/workflows", workflow(1)).await;
    all_complete(&other, &[view["id"].as_str().unwrap().to_owned()]).await;
    other.stop().await;

    let service = TestService::start(fixture_settings(&data)).await;
    let cases = [
        (
            json!({"target": format!("filesystem:{}", full.display())}),
            409,
            "already holds",
        ),
        (
            json!({"target": format!("filesystem:{}", data.display())}),
            422,
            "already works on",
        ),
        (
            json!({"target": "filesystem:relative/dir"}),
            422,
            "must be absolute",
        ),
        (
            json!({"target": "postgres:/x"}),
            422,
            "unknown storage type `postgres`",
        ),
        (
            json!({"target": "nonsense"}),
            422,
            "expected <backend>:<location>",
        ),
        (
            json!({"target": "surrealdb-server:ws://root:pw@127.0.0.1:1"}),
            422,
            "credentials do not belong",
        ),
        (
            json!({"target": format!("filesystem:{}", dir.path().join("x").display()), "batch_size": 0}),
            422,
            "batch_size",
        ),
        (json!({"target": "filesystem:/x", "extra": 1}), 422, "extra"),
    ];
    for (body, want, says) in cases {
        let (status, answer) = service
            .post("/admin/storage/migrations", body.clone())
            .await;
        assert_eq!(status, want, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{body}: {message}");
        assert!(!message.contains("pw@"), "{message}");
    }
    let (_, list) = service.get("/admin/storage/migrations").await;
    assert_eq!(list["migrations"], json!([]), "{list}");
    let (status, missing) = service.get("/admin/storage/migrations/nope").await;
    assert_eq!(status, 404, "{missing}");
    service.stop().await;
}

/// Only an admin moves the store, and each move is audited.
#[tokio::test]
async fn only_an_admin_migrates_and_it_is_audited() {
    const ADMIN: &str = "bootstrap-admin-token-for-the-storage-tests-0123456";
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(&dir.path().join("data"));
    settings.auth = true;
    settings.rate_limit = 0;
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(ADMIN));
    let service = TestService::start(settings).await;
    let http = &service.http;
    let url = |path: &str| format!("{}{path}", service.base);
    let operator: Value = http
        .post(url("/tokens"))
        .bearer_auth(ADMIN)
        .json(&json!({"name": "ops", "role": "operator"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let operator = operator["token"].as_str().unwrap();
    let target = format!("filesystem:{}", dir.path().join("moved").display());
    let body = json!({"target": target});
    for token in [None, Some(operator)] {
        let mut request = http.post(url("/admin/storage/migrations")).json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        assert_eq!(status, if token.is_some() { 403 } else { 401 });
        let text = answer.text().await.unwrap();
        assert!(text.contains("admin") || status == 401, "{text}");
    }
    assert!(
        !dir.path().join("moved").exists(),
        "a refused move made nothing"
    );
    let answer = http
        .post(url("/admin/storage/migrations"))
        .bearer_auth(ADMIN)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 202);
    let started: Value = answer.json().await.unwrap();
    let id = started["id"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let status: Value = http
            .get(url(&format!("/admin/storage/migrations/{id}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if status["phase"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "{status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let audit: Value = http
        .get(url("/audit?action=storage.migrate"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let records = audit["records"].as_array().unwrap();
    let mut seen: Vec<(String, u64)> = records
        .iter()
        .map(|r| {
            (
                r["actor"].as_str().unwrap_or_default().to_owned(),
                r["status"].as_u64().unwrap_or_default(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![("bootstrap".to_owned(), 202), ("ops".to_owned(), 403)],
        "the refused operator and the admin: {audit}"
    );
    service.stop().await;
}

#[cfg(feature = "surrealdb")]
mod surrealdb {
    use orchestrator_storage::{StorageType, SurrealdbConfig};

    use super::*;
    use crate::backends::dev_server::DevServer;
    use crate::cli::Daemon;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn filesystem_to_embedded_under_load() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let target = format!("surrealdb-embedded:{}", data.display());
        // The load stays below what a debug-built SurrealDB takes on a busy
        // 2-core machine (tens of records a second; a one-step workflow
        // writes about seven): above it, the move cannot catch up while the
        // load lasts (see `mirror`).
        move_under_load(
            fixture_settings(&data),
            &target,
            "surrealdb-embedded",
            Duration::from_millis(500),
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn embedded_to_filesystem_under_load() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut settings = fixture_settings(&data);
        settings.storage_type = StorageType::SurrealdbEmbedded;
        let target = format!("filesystem:{}", data.display());
        move_under_load(settings, &target, "filesystem", Duration::from_millis(50)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn filesystem_to_a_surrealdb_server_under_load() {
        let server = DevServer::start_memory();
        let dir = tempfile::tempdir().unwrap();
        let mut settings = fixture_settings(&dir.path().join("data"));
        // The service's own SurrealDB settings sign in to the target.
        // A debug build of the server on a busy machine can take seconds
        // over one batch; a blip beyond that is tried again.
        settings.surrealdb = SurrealdbConfig {
            url: server.url(),
            request_timeout: Duration::from_secs(30),
            ..SurrealdbConfig::default()
        };
        let target = format!(
            "surrealdb-server:{}/moved/db_{}",
            server.url(),
            uuid::Uuid::now_v7().simple()
        );
        // A debug build of the server writes slowly: a lighter load.
        // Below the target's write rate, as for the embedded target.
        move_under_load(
            settings,
            &target,
            "surrealdb-server",
            Duration::from_millis(1000),
        )
        .await;
    }

    /// A store shared with other nodes is not moved live.
    #[tokio::test]
    async fn a_shared_store_is_refused() {
        let server = DevServer::start_memory();
        let dir = tempfile::tempdir().unwrap();
        let mut settings = fixture_settings(&dir.path().join("data"));
        settings.storage_type = StorageType::SurrealdbServer;
        settings.surrealdb = SurrealdbConfig {
            url: server.url(),
            database: format!("shared_{}", uuid::Uuid::now_v7().simple()),
            request_timeout: Duration::from_secs(5),
            ..SurrealdbConfig::default()
        };
        let service = TestService::start(settings).await;
        let target = format!("filesystem:{}", dir.path().join("alone").display());
        let (status, answer) = service
            .post("/admin/storage/migrations", json!({"target": target}))
            .await;
        assert_eq!(status, 409, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("shared store"),
            "{answer}"
        );
        service.stop().await;
    }

    /// The embedded engine this build lacks is named, with its feature.
    #[cfg(not(feature = "surrealdb-rocksdb"))]
    #[tokio::test]
    async fn a_backend_not_compiled_in_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut settings = fixture_settings(&dir.path().join("data"));
        settings.surrealdb.engine = orchestrator_storage::EmbeddedEngine::RocksDb;
        let service = TestService::start(settings).await;
        let target = format!("surrealdb-embedded:{}", dir.path().join("data").display());
        let (status, answer) = service
            .post("/admin/storage/migrations", json!({"target": target}))
            .await;
        assert_eq!(status, 422, "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("surrealdb-rocksdb"), "{message}");
        service.stop().await;
    }

    /// A cancel before the switch leaves the service on its store; the
    /// incomplete target is accepted by a new migration, which completes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_cancel_leaves_the_service_on_its_store_and_a_new_move_continues() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let service = TestService::start(fixture_settings(&data)).await;
        let mut ids = Vec::new();
        for i in 0..40 {
            let (_, view) = service.post("/workflows", workflow(i)).await;
            ids.push(view["id"].as_str().unwrap().to_owned());
        }
        let target = format!("surrealdb-embedded:{}", data.display());
        let (status, started) = service
            .post(
                "/admin/storage/migrations",
                json!({"target": target, "batch_size": 1}),
            )
            .await;
        assert_eq!(status, 202, "{started}");
        let id = started["id"].as_str().unwrap();
        let (status, cancelled) = service
            .post(&format!("/admin/storage/migrations/{id}/cancel"), json!({}))
            .await;
        assert_eq!(status, 202, "{cancelled}");
        let end = wait_migration(&service, id).await;
        assert_eq!(end["phase"], "cancelled", "{end}");
        let (_, health) = service.get("/health").await;
        assert_eq!(health["storage"], "filesystem");
        let (status, again) = service
            .post(&format!("/admin/storage/migrations/{id}/cancel"), json!({}))
            .await;
        assert_eq!(status, 409, "{again}");
        let moved = migrate(&service, &target, 100).await;
        assert_eq!(moved["phase"], "completed", "{moved}");
        all_complete(&service, &ids).await;
        service.stop().await;
    }

    /// Where each crash lands: a seeded random moment of the copy (a
    /// SIGKILL from outside), or a named point (the process aborts there).
    const CRASHES: [&str; 5] = [
        "copying",
        "mirroring",
        "verifying",
        "switch-paused",
        "switch-recorded",
    ];

    /// SIGKILL (or abort) in each phase; after a restart the service runs
    /// on exactly one store, every acknowledged workflow is there and
    /// finishes, and the migration either completed or was abandoned.
    #[test]
    fn a_crash_in_any_phase_loses_nothing() {
        let seed: u64 = std::env::var("ORCHESTRATOR_FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs()
            });
        eprintln!("storage move crash drill: ORCHESTRATOR_FAULT_SEED={seed}");
        for (round, point) in CRASHES.iter().enumerate() {
            crash_at(point, seed.wrapping_add(round as u64));
        }
    }

    fn crash_at(point: &str, seed: u64) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let env: Vec<(&str, &str)> = if point == "copying" {
            Vec::new()
        } else {
            vec![("ORCHESTRATOR_LIVE_MIGRATION_ABORT", point)]
        };
        let daemon = Daemon::start_with_env(&data, &[], &env);
        let mut acknowledged = Vec::new();
        for i in 0..40 {
            let view = crate::cli::submit(&format!("{}/workflows", daemon.url), workflow(i));
            acknowledged.push(view["id"].as_str().unwrap().to_owned());
        }
        let target = format!("surrealdb-embedded:{}", data.display());
        let started = crate::cli::submit(
            &format!("{}/admin/storage/migrations", daemon.url),
            json!({"target": target, "batch_size": 1}),
        );
        let id = started["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{started}"))
            .to_owned();
        // Work acknowledged during the move.
        for i in 100..105 {
            let view = crate::cli::submit(&format!("{}/workflows", daemon.url), workflow(i));
            if let Some(id) = view["id"].as_str() {
                acknowledged.push(id.to_owned());
            }
        }
        if point == "copying" {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let status = daemon.cli_json(&["storage", "status", &id, "--json"]);
                if status["phase"] == "copying" && status["records_copied"].as_u64() > Some(0) {
                    break;
                }
                assert_ne!(
                    status["phase"], "completed",
                    "the copy was too quick to crash in: {status}"
                );
                assert!(Instant::now() < deadline, "{status}");
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(seed % 200));
            daemon.signal("-KILL");
        }
        assert!(!daemon.wait().success(), "{point}: the service crashed");

        let daemon = Daemon::start_with_env(&data, &[], &[]);
        let store = daemon.cli_json(&["storage", "status", "--json"]);
        let migration = store["migrations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["id"] == id.as_str())
            .cloned()
            .unwrap_or_else(|| panic!("{store}"));
        let on_target = point == "switch-recorded";
        let (phase, storage) = if on_target {
            ("completed", "surrealdb-embedded")
        } else {
            ("abandoned", "filesystem")
        };
        assert_eq!(migration["phase"], phase, "{point}: {migration}");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let health: Value = runtime.block_on(async {
            reqwest::get(format!("{}/health", daemon.url))
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        });
        assert_eq!(health["storage"], storage, "{point}: {health}");
        assert_eq!(
            data.join("storage.json").exists(),
            on_target,
            "{point}: the choice file is there exactly when the switch was recorded"
        );
        let views = crate::faults::wait_for_workflows(&daemon, &acknowledged);
        for view in views {
            assert_eq!(view["status"], "completed", "{point}: {view}");
        }
        if !on_target {
            // Abandoned cleanly: a new move takes up the incomplete target.
            let started = crate::cli::submit(
                &format!("{}/admin/storage/migrations", daemon.url),
                json!({"target": target}),
            );
            let id = started["id"]
                .as_str()
                .unwrap_or_else(|| panic!("{started}"))
                .to_owned();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let status = daemon.cli_json(&["storage", "status", &id, "--json"]);
                if status["phase"] == "completed" {
                    break;
                }
                assert!(
                    !matches!(status["phase"].as_str(), Some("failed" | "cancelled")),
                    "{point}: {status}"
                );
                assert!(Instant::now() < deadline, "{point}: {status}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        daemon.signal("-TERM");
        assert!(daemon.wait().success());
    }
}

/// `orchestrator storage`: a relative `--to` is taken from the caller's
/// directory, the move is followed to its end with a line per phase, and
/// status, rollback and a bad cancel say what happened.
#[test]
fn the_cli_moves_follows_and_rolls_back() {
    const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");
    let dir = tempfile::tempdir().unwrap();
    let daemon = crate::cli::Daemon::start(&dir.path().join("data"), &[]);
    let cli = |args: &[&str]| {
        std::process::Command::new(BIN)
            .current_dir(dir.path())
            .arg("--url")
            .arg(&daemon.url)
            .args(args)
            .output()
            .unwrap()
    };
    let moved = cli(&["storage", "migrate", "--to", "filesystem:moved"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&moved.stdout),
        String::from_utf8_lossy(&moved.stderr),
    );
    assert!(moved.status.success(), "{stdout}{stderr}");
    let target = format!("filesystem:{}", dir.path().join("moved").display());
    assert!(
        stdout.contains(&format!("-> {target}: completed")),
        "{stdout}"
    );
    assert!(stdout.contains("writes paused"), "{stdout}");
    assert!(stderr.contains("storage migrate:"), "{stderr}");
    assert!(dir.path().join("moved/journal.jsonl").exists());

    let status = cli(&["storage", "status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains(&format!("store: {target}")), "{text}");
    assert!(text.contains("completed"), "{text}");

    let back = cli(&["storage", "rollback"]);
    let text = String::from_utf8_lossy(&back.stdout);
    assert!(
        back.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&back.stderr)
    );
    assert!(text.contains("rolled back"), "{text}");

    let cancel = cli(&["storage", "cancel", "no-such-id"]);
    assert!(!cancel.status.success());
    let text = String::from_utf8_lossy(&cancel.stderr);
    assert!(text.contains("no storage migration no-such-id"), "{text}");
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}
