//! `orchestrator migrate` through the real binary: stores written by a real
//! service, copied, checked, interrupted and resumed, damaged and tampered
//! with; and a migration away from a service that keeps taking work.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use chrono::DurationRound;
use serde_json::{Value, json};

use crate::harness::{TestService, fixture_settings};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

fn migrate(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(BIN)
        .arg("migrate")
        .args(args)
        .envs(env.iter().copied())
        .env_remove("ORCHESTRATOR_CONFIG")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    crate::harness::output_text(output)
}

/// Runs a migration that must succeed, with `--json`; returns the summary.
fn migrate_ok(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let output = migrate(&all, &[]);
    assert!(output.status.success(), "{}", text(&output));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&output)))
}

fn fs(dir: &Path) -> String {
    format!("filesystem:{}", dir.display())
}

/// A store written by a real service: finished and failed work with logs.
/// Returns the workflow ids.
async fn seed(dir: &Path) -> Vec<String> {
    let service = TestService::start(fixture_settings(dir)).await;
    let mut workflows = Vec::new();
    for batch in [&["ok-1", "ok-2"][..], &["ok-3"], &["fail-1"]] {
        let (workflow, ids) = service
            .create_servers(batch, json!({"max_attempts": 1}))
            .await;
        for id in &ids {
            service.wait_finished(id).await;
        }
        workflows.push(workflow);
    }
    // A schedule with one claim: the three due times a (pretend) outage
    // missed, in ten days.
    let start = (chrono::Utc::now() + chrono::TimeDelta::days(10))
        .duration_trunc(chrono::TimeDelta::hours(1))
        .unwrap();
    let (status, schedule) = service
        .post(
            "/schedules",
            json!({"template": "chain", "cron": "0 * * * *", "start_at": start}),
        )
        .await;
    assert_eq!(status, 201, "{schedule}");
    let engine = service.handle.as_ref().unwrap().engine.clone();
    let later = start + chrono::TimeDelta::minutes(130);
    engine.tick_schedules(later).await.unwrap();
    service.stop().await;
    workflows
}

fn kind<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["copy"]["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kind"] == name)
        .unwrap()
}

#[tokio::test]
async fn a_dry_run_counts_everything_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let source = root.path().join("source");
    seed(&source).await;
    let target = root.path().join("target");
    let summary = migrate_ok(&["--from", &fs(&source), "--to", &fs(&target), "--dry-run"]);
    assert_eq!(summary["copy"]["dry_run"], true);
    assert_eq!(kind(&summary, "workflow")["read"], 3, "{summary}");
    assert_eq!(kind(&summary, "task")["read"], 4, "{summary}");
    assert_eq!(kind(&summary, "task")["written"], 0, "{summary}");
    assert_eq!(summary["copy"]["logs"], 4, "{summary}");
    assert_eq!(kind(&summary, "schedule")["read"], 1, "{summary}");
    assert_eq!(kind(&summary, "schedule_claim")["read"], 1, "{summary}");
    assert!(!target.exists(), "a dry run created the target");
}

#[tokio::test]
async fn a_copy_verifies_and_a_second_one_needs_resume_and_writes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let source = root.path().join("source");
    seed(&source).await;
    let target = root.path().join("target");
    let args = ["--from", &fs(&source), "--to", &fs(&target)];

    let summary = migrate_ok(&[&args[..], &["--verify"]].concat());
    assert_eq!(kind(&summary, "task")["written"], 4, "{summary}");
    assert_eq!(summary["verify"]["mismatch_count"], 0, "{summary}");

    let refused = migrate(&args, &[]);
    assert!(!refused.status.success());
    let message = text(&refused);
    assert!(
        message.contains("already holds 3 workflows and 4 tasks") && message.contains("--resume"),
        "{message}"
    );

    let again = migrate_ok(&[&args[..], &["--resume"]].concat());
    assert_eq!(kind(&again, "task")["written"], 0, "{again}");
    assert_eq!(kind(&again, "task")["unchanged"], 4, "{again}");
    assert_eq!(again["copy"]["log_bytes_written"], 0, "{again}");

    let same = migrate(&["--from", &fs(&source), "--to", &fs(&source)], &[]);
    assert!(
        text(&same).contains("name the same store"),
        "{}",
        text(&same)
    );
    let missing = migrate(
        &[
            "--from",
            &fs(&root.path().join("nope")),
            "--to",
            &fs(&target),
        ],
        &[],
    );
    assert!(!missing.status.success());
    assert!(
        text(&missing).contains("holds no filesystem store"),
        "{}",
        text(&missing)
    );
}

#[tokio::test]
async fn a_migration_killed_at_any_point_resumes_to_an_exact_copy() {
    let root = tempfile::tempdir().unwrap();
    let source = root.path().join("source");
    seed(&source).await;
    for writes in ["1", "3", "6"] {
        let target = root.path().join(format!("target-{writes}"));
        let args = [
            "--from",
            &fs(&source),
            "--to",
            &fs(&target),
            "--batch-size",
            "1",
        ];
        let killed = migrate(
            &args,
            &[("ORCHESTRATOR_MIGRATE_CRASH_AFTER_WRITES", writes)],
        );
        assert!(
            !killed.status.success() && killed.status.code().is_none(),
            "expected death by signal after {writes} writes: {}",
            text(&killed)
        );
        let summary = migrate_ok(&[&args[..], &["--resume", "--verify"]].concat());
        assert_eq!(summary["verify"]["mismatch_count"], 0, "{summary}");
    }

    // And a real SIGKILL, once the copy is under way.
    let target = root.path().join("target-sigkill");
    let mut child = Command::new(BIN)
        .args([
            "migrate",
            "--from",
            &fs(&source),
            "--to",
            &fs(&target),
            "--batch-size",
            "1",
        ])
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    for line in stderr.lines() {
        if line.unwrap().starts_with("migrate: workflows") {
            break;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let verify = migrate(
        &["verify", "--from", &fs(&source), "--to", &fs(&target)],
        &[],
    );
    assert!(
        !verify.status.success(),
        "the kill came too late to test anything"
    );
    let summary = migrate_ok(&[
        "--from",
        &fs(&source),
        "--to",
        &fs(&target),
        "--resume",
        "--verify",
    ]);
    assert_eq!(summary["verify"]["mismatch_count"], 0, "{summary}");
}

#[tokio::test]
async fn a_damaged_source_record_stops_the_copy_by_name_unless_skipped() {
    let root = tempfile::tempdir().unwrap();
    let source = root.path().join("source");
    seed(&source).await;
    // Damage the last journal line that writes the first workflow (an
    // earlier one would be superseded by it), as a bad disk would.
    let journal = source.join("journal.jsonl");
    let content = std::fs::read_to_string(&journal).unwrap();
    let lines: Vec<Value> = content
        .lines()
        .map(|l| serde_json::from_str(&l[9..]).unwrap())
        .collect();
    let workflow = lines[0]["data"]["workflow"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let last = lines
        .iter()
        .rposition(|l| {
            l["data"]["id"] == workflow.as_str() || l["data"]["workflow"]["id"] == workflow.as_str()
        })
        .unwrap();
    assert!(
        last + 1 < lines.len(),
        "not the journal's last line (that one counts as torn)"
    );
    let line_start: usize = content.lines().take(last).map(|l| l.len() + 1).sum();
    let at = line_start + content[line_start..].find("\"status\":\"").unwrap() + 10;
    let mut bytes = content.into_bytes();
    bytes[at] ^= 0x20;
    std::fs::write(&journal, bytes).unwrap();
    let damaged_line = format!("journal.jsonl line {}", last + 1);

    let target = root.path().join("target");
    let stopped = migrate(&["--from", &fs(&source), "--to", &fs(&target)], &[]);
    assert!(!stopped.status.success());
    let message = text(&stopped);
    assert!(
        message.contains(&format!("source workflow {workflow} is unreadable"))
            && message.contains(&format!("{damaged_line}: checksum mismatch"))
            && message.contains("--skip-unreadable"),
        "{message}"
    );

    // A dry run lists it, and fails as the real run would.
    let output = migrate(
        &[
            "--from",
            &fs(&source),
            "--to",
            &fs(&target),
            "--dry-run",
            "--json",
        ],
        &[],
    );
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("1 source records are unreadable"),
        "{}",
        text(&output)
    );
    let dry: Value = serde_json::from_slice(&output.stdout).unwrap();
    let unreadable = dry["copy"]["unreadable"].as_array().unwrap();
    assert!(
        unreadable.iter().any(|u| u["key"] == workflow.as_str()),
        "{dry}"
    );

    let summary = migrate_ok(&[
        "--from",
        &fs(&source),
        "--to",
        &fs(&target),
        "--resume",
        "--skip-unreadable",
    ]);
    assert_eq!(summary["copy"]["unreadable"], dry["copy"]["unreadable"]);
    // Everything else arrived.
    let copied = kind(&summary, "workflow")["written"].as_u64().unwrap();
    assert_eq!(copied, 2, "{summary}");
    let plain = migrate(
        &[
            "--from",
            &fs(&source),
            "--to",
            &fs(&root.path().join("t2")),
            "--skip-unreadable",
        ],
        &[],
    );
    assert!(plain.status.success(), "{}", text(&plain));
    assert!(
        text(&plain).contains(&format!("workflow {workflow}: {damaged_line}")),
        "{}",
        text(&plain)
    );
}

/// Appends a journal line that replaces task `task` (same version) with
/// one whose name is changed, checksummed like a real one.
fn tamper_task(dir: &Path, task: &str) {
    let journal = dir.join("journal.jsonl");
    let content = std::fs::read_to_string(&journal).unwrap();
    let stored = content
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(&l[9..]).ok())
        .flat_map(|line| match line["type"].as_str() {
            Some("task") => vec![line["data"].clone()],
            Some("submission") => line["data"]["tasks"].as_array().unwrap().clone(),
            _ => vec![],
        })
        .rfind(|t| t["id"] == task)
        .unwrap();
    let mut changed = stored;
    changed["name"] = json!("tampered");
    let json = json!({"type": "task", "data": changed}).to_string();
    let line = format!("{:08x} {json}\n", crc32fast::hash(json.as_bytes()));
    std::fs::write(&journal, content + &line).unwrap();
}

/// The task of each frame of a log pack, in order, up to its seal.
fn pack_frames(pack: &[u8]) -> Vec<String> {
    const HEADER: usize = 36;
    let (mut at, mut tasks) = (0, Vec::new());
    while at + HEADER <= pack.len() {
        let task = uuid::Uuid::from_slice(&pack[at + 4..at + 20]).unwrap();
        if task.is_nil() {
            break;
        }
        tasks.push(task.to_string());
        at += HEADER + u32::from_le_bytes(pack[at + 28..at + 32].try_into().unwrap()) as usize;
    }
    tasks
}

#[tokio::test]
async fn verify_names_tampered_records_and_logs() {
    let root = tempfile::tempdir().unwrap();
    let source = root.path().join("source");
    seed(&source).await;
    let target = root.path().join("target");
    migrate_ok(&["--from", &fs(&source), "--to", &fs(&target)]);
    let verify = ["verify", "--from", &fs(&source), "--to", &fs(&target)];
    let clean = migrate(&verify, &[]);
    assert!(clean.status.success(), "{}", text(&clean));
    assert!(
        text(&clean).contains("every record matches"),
        "{}",
        text(&clean)
    );

    // The target's logs are in one pack (docs/storage.md, "Task logs"):
    // its first log's task is tampered with, and its last log's bytes.
    let pack = target.join("logs").join("00000001.pack");
    let frames = pack_frames(&std::fs::read(&pack).unwrap());
    let logs = [frames[0].clone(), frames[frames.len() - 1].clone()];
    assert_ne!(logs[0], logs[1]);
    tamper_task(&target, &logs[0]);
    let found = migrate(&verify, &[]);
    assert!(!found.status.success());
    let message = text(&found);
    assert!(
        message.contains(&format!("task {}: content differs: field `name`", logs[0])),
        "{message}"
    );

    let mut bytes = std::fs::read(&pack).unwrap();
    *bytes.last_mut().unwrap() ^= 0x20;
    std::fs::write(&pack, bytes).unwrap();
    let output = migrate(&[&verify[..], &["--json"]].concat(), &[]);
    assert!(!output.status.success());
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["mismatch_count"], 2, "{report}");
    assert!(
        report["mismatches"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["kind"] == "log" && m["key"] == logs[1].as_str()),
        "{report}"
    );
}

#[test]
fn bad_specs_and_missing_backends_exit_non_zero_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let from = fs(dir.path());
    for (to, expected) in [
        ("mysql:./x", "unknown storage type `mysql`"),
        ("./x", "expected <backend>:<location>"),
        (
            "surrealdb-server:ws://root:hunter2@127.0.0.1:1",
            "credentials do not belong in a spec",
        ),
    ] {
        let output = migrate(&["--from", &from, "--to", to], &[]);
        assert!(!output.status.success(), "{to}");
        let message = text(&output);
        assert!(message.contains(expected), "{to}: {message}");
        assert!(!message.contains("hunter2"), "{message}");
    }
    let output = migrate(&["--to", &from], &[]);
    assert!(!output.status.success());
    assert!(text(&output).contains("--from"), "{}", text(&output));
    let output = migrate(
        &[
            "--from",
            &from,
            "--to",
            "filesystem:x",
            "--dry-run",
            "--verify",
        ],
        &[],
    );
    assert!(!output.status.success());
    assert!(
        text(&output).contains("cannot be used with"),
        "{}",
        text(&output)
    );
    #[cfg(not(feature = "surrealdb"))]
    {
        let output = migrate(&["--from", &from, "--to", "surrealdb-embedded:./x"], &[]);
        assert!(
            text(&output).contains("--features surrealdb"),
            "{}",
            text(&output)
        );
    }
}

#[cfg(feature = "surrealdb")]
mod surrealdb {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use orchestrator_storage::StorageType;

    use super::*;
    use crate::backends::dev_server::DevServer;

    /// fs -> embedded -> server -> fs through the CLI, each hop verified,
    /// and the end equal to the start; then a service runs on the copy.
    #[tokio::test]
    async fn every_backend_round_trip_ends_equal_to_the_start() {
        let root = tempfile::tempdir().unwrap();
        let server = DevServer::start_memory();
        let start = root.path().join("start");
        let workflows = seed(&start).await;
        let server_spec = format!("surrealdb-server:{}/orchestrator/migrated", server.url());
        let embedded_spec = format!(
            "surrealdb-embedded:{}",
            root.path().join("embedded").display()
        );
        let end = root.path().join("end");
        let hops = [
            (fs(&start), embedded_spec.clone()),
            (embedded_spec.clone(), server_spec.clone()),
            (server_spec.clone(), fs(&end)),
        ];
        for (from, to) in &hops {
            let summary = migrate_ok(&["--from", from, "--to", to, "--verify"]);
            assert_eq!(
                kind(&summary, "task")["written"],
                4,
                "{from} -> {to}: {summary}"
            );
            assert_eq!(summary["verify"]["mismatch_count"], 0, "{summary}");
        }
        let verify = migrate(
            &["verify", "--from", &fs(&start), "--to", &fs(&end), "--json"],
            &[],
        );
        assert!(verify.status.success(), "{}", text(&verify));
        let report: Value = serde_json::from_slice(&verify.stdout).unwrap();
        for kind in report["kinds"].as_array().unwrap() {
            assert_eq!(kind["source_checksum"], kind["target_checksum"], "{report}");
        }
        // The reverse directions, into fresh stores.
        let back_embedded = format!(
            "surrealdb-embedded:{}",
            root.path().join("embedded-2").display()
        );
        let back_server = format!("surrealdb-server:{}/orchestrator/back", server.url());
        for (from, to) in [
            (fs(&end), back_server.clone()),
            (back_server.clone(), back_embedded.clone()),
            (back_embedded.clone(), fs(&root.path().join("end-2"))),
        ] {
            let summary = migrate_ok(&["--from", &from, "--to", &to, "--verify"]);
            assert_eq!(summary["verify"]["mismatch_count"], 0, "{summary}");
        }

        // The service runs on a migrated store and sees all the work.
        let mut settings = fixture_settings(&root.path().join("embedded"));
        settings.storage_type = StorageType::SurrealdbEmbedded;
        let service = TestService::start(settings).await;
        for workflow in &workflows {
            let (status, body) = service.get(&format!("/workflows/{workflow}")).await;
            assert_eq!(status, 200, "{body}");
        }
        // The schedule moved with its claim: it knows what it missed.
        let (_, schedules) = service.get("/schedules").await;
        let id = schedules["schedules"][0]["id"].as_str().unwrap();
        let (_, schedule) = service.get(&format!("/schedules/{id}")).await;
        assert_eq!(schedule["runs"][0]["state"], "missed", "{schedule}");
        assert_eq!(schedule["runs"][0]["missed"], 3, "{schedule}");
        service.stop().await;
    }

    #[tokio::test]
    async fn a_wrong_password_is_refused_without_echoing_it() {
        let root = tempfile::tempdir().unwrap();
        let server = DevServer::start_memory();
        let source = root.path().join("source");
        seed(&source).await;
        let to = format!("surrealdb-server:{}/orchestrator/x", server.url());
        let output = migrate(
            &["--from", &fs(&source), "--to", &to],
            &[("ORCHESTRATOR_MIGRATE_TO_PASSWORD", "not-the-password")],
        );
        assert!(!output.status.success());
        let message = text(&output);
        assert!(message.contains("cannot sign in"), "{message}");
        assert!(message.contains("--to-password"), "{message}");
        assert!(!message.contains("not-the-password"), "{message}");

        // A source namespace or database with nothing in it is a typo, not
        // a store to set up.
        let from = format!("surrealdb-server:{}/orchestrator/typo", server.url());
        let output = migrate(&["--from", &from, "--to", &fs(&root.path().join("t"))], &[]);
        assert!(!output.status.success());
        assert!(
            text(&output).contains("there is no orchestrator store"),
            "{}",
            text(&output)
        );
    }

    /// The zero-downtime procedure of docs/migration.md: copy while the
    /// service takes submissions, catch up, stop, final pass, start on the
    /// new store. Every workflow submitted at any point is there, and the
    /// work left unfinished at the switch finishes on the new store.
    #[tokio::test]
    async fn work_submitted_during_a_live_migration_is_not_lost() {
        let root = tempfile::tempdir().unwrap();
        let old = root.path().join("old");
        let new = root.path().join("new");
        let service = Arc::new(TestService::start(fixture_settings(&old)).await);
        let stop = Arc::new(AtomicBool::new(false));
        let submitter = {
            let service = service.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut submitted = Vec::new();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let name = format!("ok-{n}");
                    let (workflow, _) = service.create_servers(&[name.as_str()], json!({})).await;
                    submitted.push(workflow);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                submitted
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let to = format!("surrealdb-embedded:{}", new.display());
        let bulk = tokio::task::spawn_blocking({
            let (from, to) = (fs(&old), to.clone());
            move || migrate_ok(&["--from", &from, "--to", &to])
        })
        .await
        .unwrap();
        assert!(
            kind(&bulk, "workflow")["written"].as_u64().unwrap() > 0,
            "{bulk}"
        );
        let catch_up = tokio::task::spawn_blocking({
            let (from, to) = (fs(&old), to.clone());
            move || migrate_ok(&["--from", &from, "--to", &to, "--resume"])
        })
        .await
        .unwrap();
        stop.store(true, Ordering::SeqCst);
        let submitted = submitter.await.unwrap();
        assert!(
            kind(&catch_up, "workflow")["written"].as_u64().unwrap() > 0,
            "submissions went on during the bulk copy: {catch_up}"
        );
        // The switch: the service stops (persisting everything), one last
        // pass, and the service starts on the new store.
        Arc::into_inner(service).unwrap().stop().await;
        let last = migrate_ok(&["--from", &fs(&old), "--to", &to, "--resume", "--verify"]);
        assert_eq!(last["verify"]["mismatch_count"], 0, "{last}");

        let mut settings = fixture_settings(&new);
        settings.storage_type = StorageType::SurrealdbEmbedded;
        let service = TestService::start(settings).await;
        for workflow in &submitted {
            let finished = service.wait_workflow(workflow).await;
            assert_eq!(finished["status"], "completed", "{finished}");
        }
        let (_, listed) = service.get("/workflows?limit=1").await;
        assert_eq!(listed["total"], submitted.len(), "{listed}");
        service.stop().await;
    }
}
