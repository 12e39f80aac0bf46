//! Retention: `POST /prune` (and `orchestrator prune`) and the background
//! sweep under `--retain-finished` delete finished workflows with their
//! tasks and logs, never an unfinished one or the newest revision of a
//! `meta.ref`, and the filesystem store shrinks on disk and reopens.

use std::time::Duration;

use orchestrator_core::retention::Keep;
use serde_json::{Value, json};
use tokio::process::Command;

use crate::harness::{TestService, fixture_settings, output_text};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

async fn submit(service: &TestService, body: Value) -> String {
    let (status, view) = service.post("/workflows", body).await;
    assert_eq!(status, 202, "{view}");
    view["id"].as_str().unwrap().to_owned()
}

async fn finished(service: &TestService, body: Value) -> (String, Vec<String>) {
    let id = submit(service, body).await;
    let view = service.wait_workflow(&id).await;
    assert_eq!(view["status"], "completed", "{view}");
    let tasks = view["tasks"].as_array().unwrap();
    (
        id,
        tasks
            .iter()
            .map(|t| t["id"].as_str().unwrap().to_owned())
            .collect(),
    )
}

async fn status_of(service: &TestService, path: &str) -> u16 {
    service.get(path).await.0
}

fn store_bytes(dir: &std::path::Path, file: &str) -> u64 {
    std::fs::metadata(dir.join(file)).map_or(0, |m| m.len())
}

/// The task logs' packs: `(bytes in all, every byte)`.
fn log_packs(dir: &std::path::Path) -> (u64, Vec<u8>) {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(dir.join("logs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "pack") {
            all.extend(std::fs::read(path).unwrap());
        }
    }
    (all.len() as u64, all)
}

/// Whether a task's id is anywhere in `bytes`, as a log frame names it.
fn names_task(bytes: &[u8], task: &str) -> bool {
    let id = uuid::Uuid::parse_str(task).unwrap();
    bytes.windows(16).any(|w| w == id.as_bytes())
}

#[tokio::test]
async fn prune_deletes_finished_workflows_keeps_the_rest_and_the_store_shrinks_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;

    let (plain, plain_tasks) = finished(&service, json!({"template": "chain"})).await;
    let (another, _) = finished(&service, json!({"template": "chain"})).await;
    let (old_revision, _) = finished(
        &service,
        json!({"template": "chain", "meta": {"ref": "nightly"}}),
    )
    .await;
    let (newest_revision, _) = finished(
        &service,
        json!({"template": "chain", "meta": {"ref": "nightly"}, "vars": {"sleep": 0.01}}),
    )
    .await;
    let (kept_forever, kept_tasks) = finished(
        &service,
        json!({"template": "chain", "meta": {"retain": "forever"}}),
    )
    .await;
    // Not finished: it waits for a start a year away.
    let start = (chrono::Utc::now() + chrono::Duration::days(365)).to_rfc3339();
    let unfinished = submit(
        &service,
        json!({"template": "chain", "schedule": {"when": "at", "start": start}}),
    )
    .await;
    let (logs_before, packed) = log_packs(dir.path());
    assert!(
        names_task(&packed, &plain_tasks[0]) && names_task(&packed, &kept_tasks[0]),
        "every finished step left its log in a pack"
    );

    // A dry run counts and deletes nothing.
    let (status, report) = service
        .post("/prune", json!({"older_than": "0s", "dry_run": true}))
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["dry_run"], true);
    assert_eq!(report["workflows"], 3, "{report}");
    assert_eq!(report["tasks"], 12, "{report}");
    assert_eq!(
        status_of(&service, &format!("/workflows/{plain}")).await,
        200
    );

    // Drop the audit records first: that compacts the store, so the
    // snapshot then holds every workflow.
    let (status, report) = service
        .post("/prune", json!({"audit_older_than": "0s"}))
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["workflows"], 0, "{report}");
    let snapshot_full = store_bytes(dir.path(), "snapshot.jsonl");
    assert!(snapshot_full > 0, "the audit prune compacted the store");

    let (status, report) = service.post("/prune", json!({"older_than": "0s"})).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["dry_run"], false);
    assert_eq!(report["workflows"], 3, "{report}");
    assert_eq!(report["tasks"], 12, "{report}");
    let snapshot_pruned = store_bytes(dir.path(), "snapshot.jsonl");
    assert!(
        snapshot_pruned < snapshot_full,
        "the snapshot shrank: {snapshot_full} -> {snapshot_pruned}"
    );
    assert!(
        store_bytes(dir.path(), "journal.jsonl") < 4096,
        "the journal was compacted away"
    );
    // Twelve of the twenty logs went: more than half the pack, so it was
    // rewritten without them.
    let (logs_after, packed) = log_packs(dir.path());
    assert!(
        logs_after < logs_before,
        "the logs' room was given back: {logs_before} -> {logs_after} bytes"
    );
    assert!(
        !names_task(&packed, &plain_tasks[0]),
        "a pruned task's log is gone from the disk"
    );
    assert!(
        names_task(&packed, &kept_tasks[0]),
        "a kept task's log stays"
    );

    let gone = [plain.as_str(), another.as_str(), old_revision.as_str()];
    let kept = [
        newest_revision.as_str(),
        kept_forever.as_str(),
        unfinished.as_str(),
    ];
    let (gone_task, kept_task) = (plain_tasks[0].as_str(), kept_tasks[0].as_str());
    check(&service, &gone, gone_task, &kept, kept_task).await;

    // The pruned store reopens cleanly, without what was pruned.
    service.stop().await;
    let service = TestService::start(fixture_settings(dir.path())).await;
    check(&service, &gone, gone_task, &kept, kept_task).await;

    // The newest revision still answers a resubmission of the same body.
    let (status, again) = service
        .post(
            "/workflows",
            json!({"template": "chain", "meta": {"ref": "nightly"}, "vars": {"sleep": 0.01}}),
        )
        .await;
    assert!(status == 200 || status == 202, "{again}");
    assert_eq!(again["id"], newest_revision.as_str(), "{again}");
    service.stop().await;
}

/// What a prune of `gone` (and not of `kept`) leaves visible.
async fn check(
    service: &TestService,
    gone: &[&str],
    gone_task: &str,
    kept: &[&str],
    kept_task: &str,
) {
    for id in gone {
        assert_eq!(
            status_of(service, &format!("/workflows/{id}")).await,
            404,
            "{id}"
        );
    }
    assert_eq!(
        status_of(service, &format!("/tasks/{gone_task}")).await,
        404
    );
    for id in kept {
        assert_eq!(
            status_of(service, &format!("/workflows/{id}")).await,
            200,
            "{id}"
        );
    }
    let (status, log) = service.get_text(&format!("/tasks/{kept_task}/logs")).await;
    assert_eq!(status, 200);
    assert!(log.contains("running"), "a kept task keeps its log: {log}");
    let (_, listed) = service.get("/workflows?limit=100").await;
    assert_eq!(listed["total"], kept.len(), "{listed}");
}

#[tokio::test]
async fn prune_refuses_bad_periods_and_the_cli_reports_what_went() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let (status, body) = service.post("/prune", json!({"older_than": "soon"})).await;
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("older_than") && message.contains("soon"),
        "{message}"
    );
    let (status, body) = service
        .post(
            "/workflows",
            json!({"template": "chain", "meta": {"retain": "7x"}}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("meta.retain"),
        "{body}"
    );

    finished(&service, json!({"template": "chain"})).await;
    // The service answers on this test's runtime: the CLI runs beside it.
    let prune = |args: &[&str]| {
        Command::new(BIN)
            .args(["prune", "--url", &service.base])
            .args(args)
            .output()
    };
    let output = prune(&["--older-than", "0s", "--dry-run"]).await.unwrap();
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(
        output_text(&output).contains("would delete 1 finished workflows (4 tasks)"),
        "{}",
        output_text(&output)
    );
    let output = prune(&["--older-than", "0s"]).await.unwrap();
    assert!(output.status.success(), "{}", output_text(&output));
    assert!(output_text(&output).contains("deleted 1 finished workflows (4 tasks)"));
    let output = prune(&[]).await.unwrap();
    assert!(!output.status.success());
    assert!(
        output_text(&output).contains("--older-than"),
        "{}",
        output_text(&output)
    );
    let output = prune(&["--older-than", "tomorrow"]).await.unwrap();
    assert!(!output.status.success());
    assert!(
        output_text(&output).contains("tomorrow"),
        "{}",
        output_text(&output)
    );

    let (_, audit) = service.get("/audit?action=prune.run").await;
    assert!(
        audit["total"].as_u64().unwrap() >= 2,
        "prunes are audited: {audit}"
    );
    service.stop().await;
}

#[tokio::test]
async fn the_background_sweep_applies_retain_finished_and_reports_it_in_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.retain_finished = Keep::For(Duration::ZERO);
    settings.retention_every = Duration::from_millis(100);
    let service = TestService::start(settings).await;
    let id = submit(&service, json!({"template": "chain"})).await;
    // The sweep runs on its own, every 100 ms: the workflow may be gone as
    // soon as it has finished, so wait for it to go, then check it ran.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while status_of(&service, &format!("/workflows/{id}")).await != 404 {
        assert!(tokio::time::Instant::now() < deadline, "never pruned");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let trace = service.trace();
    for step in ["a", "b", "c", "d"] {
        assert!(
            trace
                .iter()
                .any(|line| line.starts_with(&format!("{step} end"))),
            "{step} ran to its end before its workflow went: {trace:?}"
        );
    }
    let (_, metrics) = service.get_text("/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("orchestrator_pruned_workflows_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
    service.stop().await;
}
