//! The `orchestrator` binary itself: `serve`, the client subcommands,
//! signals, and `kill -9` in the middle of work.

use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{fixture_scripts, fixture_templates, spawn_serve};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

pub(crate) struct Daemon {
    child: Child,
    pub(crate) url: String,
}

impl Daemon {
    /// Starts `orchestrator serve` on a free port with the fixture scripts.
    pub(crate) fn start(data_dir: &Path, extra: &[&str]) -> Daemon {
        Daemon::start_with_env(data_dir, extra, &[])
    }

    /// [`Daemon::start`], with variables of its own.
    pub(crate) fn start_with_env(data_dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let config = data_dir.with_extension("toml");
        std::fs::write(
            &config,
            // Auth has tests of its own (auth.rs); here it would only be noise.
            "workers = 2\nretry_base_ms = 50\nno_auth = true\n[interpreters]\nnu = \"bash\"\n",
        )
        .unwrap();
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--port", "0", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--scripts-dir")
            .arg(fixture_scripts())
            .arg("--templates-dir")
            .arg(fixture_templates())
            .args(extra)
            .envs(env.iter().copied());
        let (child, url) = spawn_serve(command, Duration::from_secs(30));
        Daemon { child, url }
    }

    /// Starts a service from a prepared `orchestrator serve --port 0`.
    pub(crate) fn spawn(command: Command) -> Daemon {
        let (child, url) = spawn_serve(command, Duration::from_secs(30));
        Daemon { child, url }
    }

    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
            .arg("--url")
            .arg(&self.url)
            .args(args)
            .output()
            .unwrap()
    }

    pub(crate) fn cli_json(&self, args: &[&str]) -> Value {
        let output = self.cli(args);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    pub(crate) fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the service to exit (a minute at most: a service asked to
    /// crash at a point of a slow migration may take a while to get there).
    pub(crate) fn wait(mut self) -> std::process::ExitStatus {
        for _ in 0..1200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("service did not exit");
    }
}

/// A `Child` handle does not stop its process when dropped: without this,
/// every service a test started (and every one a failed assertion left
/// behind) would keep running, and polling, for the rest of the suite.
impl Drop for Daemon {
    fn drop(&mut self) {
        // Fails harmlessly when the service already exited and was reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// POSTs JSON through a throwaway runtime, so that these tests stay
/// synchronous like the processes they drive.
pub(crate) fn submit(url: &str, body: Value) -> Value {
    submit_as(url, None, body)
}

/// [`submit`] with a token.
pub(crate) fn submit_as(url: &str, token: Option<&str>, body: Value) -> Value {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut request = reqwest::Client::new().post(url).json(&body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        request.send().await.unwrap().json().await.unwrap()
    })
}

pub(crate) fn wait_all_finished(daemon: &Daemon, ids: &[String]) -> Vec<Value> {
    ids.iter()
        .map(|id| {
            for _ in 0..600 {
                let task = daemon.cli_json(&["task", id, "--json"]);
                if matches!(
                    task["status"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                ) {
                    return task;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("task {id} never finished");
        })
        .collect()
}

fn ids_of(response: &Value) -> Vec<String> {
    response["task_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn client_commands_and_graceful_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let daemon = Daemon::start(&data, &[]);
    let created = submit(
        &format!("{}/workflows/servers/create", daemon.url),
        json!({"infra": "cli", "servers": ["ok-1", "hang-1"]}),
    );
    let ids = ids_of(&created);

    let list = daemon.cli_json(&["tasks", "--json"]);
    assert_eq!(list["total"], 2);
    let table = daemon.cli(&[
        "tasks",
        "--workflow",
        created["workflow_id"].as_str().unwrap(),
    ]);
    let table = String::from_utf8(table.stdout).unwrap();
    assert!(table.starts_with("ID"), "{table}");
    assert!(
        table.contains("create server ok-1") && table.contains("create server hang-1"),
        "{table}"
    );
    // A page of one names the next; following it shows the other task.
    let first = String::from_utf8(daemon.cli(&["tasks", "--limit", "1"]).stdout).unwrap();
    let next = first
        .lines()
        .find_map(|l| l.strip_prefix("next page: --after "))
        .unwrap_or_else(|| panic!("no next page named: {first}"))
        .to_owned();
    let second = daemon.cli_json(&["tasks", "--limit", "1", "--after", &next, "--json"]);
    assert_eq!(second["tasks"][0]["id"], ids[0].as_str(), "{second}");
    assert!(second.get("next_after").is_none(), "{second}");

    let done = wait_all_finished(&daemon, &ids[..1]);
    assert_eq!(done[0]["status"], "completed");
    let shown = String::from_utf8(daemon.cli(&["task", &ids[0]]).stdout).unwrap();
    assert!(
        shown.contains("completed") && shown.contains("\"server\": \"ok-1\""),
        "{shown}"
    );
    let logs = daemon.cli(&["logs", &ids[0]]);
    assert!(String::from_utf8_lossy(&logs.stdout).contains("hello from ok-1"));

    let cancel = daemon.cli(&["cancel", &ids[1]]);
    assert!(
        cancel.status.success(),
        "{}",
        String::from_utf8_lossy(&cancel.stderr)
    );
    let followed = daemon.cli(&["logs", "--follow", &ids[1]]);
    assert!(String::from_utf8_lossy(&followed.stdout).contains("hello from hang-1"));
    assert_eq!(
        wait_all_finished(&daemon, &ids[1..])[0]["status"],
        "cancelled"
    );

    let unknown = daemon.cli(&["task", "01900000-0000-7000-8000-000000000000"]);
    assert!(!unknown.status.success());
    let message = String::from_utf8_lossy(&unknown.stderr);
    assert!(
        message.contains("01900000-0000-7000-8000-000000000000") && message.contains("404"),
        "{message}"
    );

    daemon.signal("-TERM");
    assert!(daemon.wait().success(), "SIGTERM is a clean exit");
    assert!(data.join("journal.jsonl").exists());
}

#[test]
fn kill_9_loses_no_submitted_work() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let daemon = Daemon::start(&data, &["--workers", "1"]);
    let created = submit(
        &format!("{}/workflows/servers/create", daemon.url),
        json!({"infra": "crash", "servers": ["slow-1", "ok-2", "ok-3", "ok-4"]}),
    );
    let ids = ids_of(&created);
    // Wait for the first script to be mid-run, then pull the plug.
    for _ in 0..200 {
        if daemon.cli_json(&["task", &ids[0], "--json"])["status"] == "running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    daemon.signal("-KILL");
    assert!(!daemon.wait().success());

    let daemon = Daemon::start(&data, &[]);
    let tasks = wait_all_finished(&daemon, &ids);
    for task in &tasks {
        assert_eq!(task["status"], "completed", "{task}");
    }
    // The interrupted attempt counts, and says what happened to it.
    assert_eq!(tasks[0]["attempts"], 2, "{}", tasks[0]);
    // Every log reads back from the packs the killed service appended to,
    // the retried task's with its second attempt's output after the first's.
    for (id, server) in ids.iter().zip(["slow-1", "ok-2", "ok-3", "ok-4"]) {
        let log = String::from_utf8_lossy(&daemon.cli(&["logs", id]).stdout).into_owned();
        assert!(
            log.contains(&format!("hello from {server}")),
            "{server}: {log}"
        );
    }
    let retried = String::from_utf8_lossy(&daemon.cli(&["logs", &ids[0]]).stdout).into_owned();
    assert!(
        retried.contains("hello from slow-1 (attempt 2)"),
        "{retried}"
    );
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

#[test]
fn startup_errors_exit_non_zero_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    // A backend this build lacks, and the cargo feature that adds it.
    #[cfg(not(feature = "surrealdb"))]
    let missing_backend: (&[&str], &str) = (
        &[
            "serve",
            "--storage-type",
            "surrealdb-embedded",
            "--port",
            "0",
        ],
        "--features surrealdb",
    );
    #[cfg(all(feature = "surrealdb", not(feature = "surrealdb-rocksdb")))]
    let missing_backend: (&[&str], &str) = (
        &[
            "serve",
            "--storage-type",
            "surrealdb-embedded",
            "--surrealdb-engine",
            "rocksdb",
            "--port",
            "0",
        ],
        "--features surrealdb-rocksdb",
    );
    // Everything is compiled in: an unknown engine stands in.
    #[cfg(feature = "surrealdb-rocksdb")]
    let missing_backend: (&[&str], &str) = (
        &["serve", "--surrealdb-engine", "leveldb", "--port", "0"],
        "unknown embedded engine `leveldb`",
    );
    let cases: &[(&[&str], &str)] = &[
        missing_backend,
        (
            &["serve", "--storage-type", "mongodb", "--port", "0"],
            "unknown storage type `mongodb`",
        ),
        (
            &[
                "serve",
                "--scripts-dir",
                "/nonexistent/scripts",
                "--port",
                "0",
            ],
            "/nonexistent/scripts",
        ),
        (
            &["serve", "--config", "/nonexistent/orchestrator.toml"],
            "/nonexistent/orchestrator.toml",
        ),
        (
            &["--url", "http://127.0.0.1:9", "tasks"],
            "cannot reach the orchestrator",
        ),
    ];
    for (args, expected) in cases {
        let output = Command::new(BIN)
            .args(*args)
            .arg("--data-dir")
            .arg(dir.path().join("d"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        // `tasks` has no --data-dir: clap refuses it, which is also an error exit.
        assert!(!output.status.success(), "{args:?}");
        if args[0] == "serve" {
            assert!(stderr.contains(expected), "{args:?}: {stderr}");
            // Each reason once, not again as the cause of itself.
            let error = stderr
                .lines()
                .find(|l| l.starts_with("error:"))
                .unwrap_or("");
            if let Some((_, reason)) = error.rsplit_once(": ") {
                assert_eq!(error.matches(reason).count(), 1, "{args:?}: {stderr}");
            }
        }
    }
    let output = Command::new(BIN)
        .args(["--url", "http://127.0.0.1:9", "tasks"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot reach the orchestrator"));
}

#[test]
fn workflow_commands_submit_follow_render_and_list() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&dir.path().join("data"), &[]);
    let submitted = daemon.cli(&[
        "workflow",
        "submit",
        "chain",
        "-i",
        "sleep=0.1",
        "--ref",
        "cli-1",
        "--wait",
    ]);
    let stdout = String::from_utf8_lossy(&submitted.stdout);
    let stderr = String::from_utf8_lossy(&submitted.stderr);
    assert!(submitted.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("[completed]"), "{stdout}");
    assert!(stderr.contains("completed"), "progress lines: {stderr}");

    let list = daemon.cli_json(&["workflow", "list", "--ref", "cli-1", "--json"]);
    assert_eq!(list["total"], 1);
    let found = daemon.cli_json(&["workflow", "list", "--search", "CLI-1", "--json"]);
    assert_eq!(found["workflows"], list["workflows"], "search ignores case");
    let id = list["workflows"][0]["id"].as_str().unwrap().to_owned();
    let status = daemon.cli(&["workflow", "status", &id]);
    let rendered = String::from_utf8_lossy(&status.stdout);
    // Four steps, dependents indented under what they wait for.
    assert!(rendered.contains("✔ a "), "{rendered}");
    assert!(rendered.contains("\n  ✔ b "), "{rendered}");
    assert!(rendered.contains("\n    ✔ c "), "{rendered}");
    assert!(rendered.contains("← b"), "{rendered}");

    // A failing run exits non-zero; retry then reports the rerun.
    // In the scripts' state dir: what a sandboxed script can see.
    let gate = crate::harness::script_state(&dir.path().join("data")).join("gate");
    let failed = daemon.cli(&[
        "workflow",
        "submit",
        "chain",
        "-i",
        &format!("gate={}", gate.display()),
        "--wait",
    ]);
    assert!(!failed.status.success());
    assert!(String::from_utf8_lossy(&failed.stderr).contains("ended failed"));
    let failed_id = daemon.cli_json(&["workflow", "list", "--status", "failed", "--json"])["workflows"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::write(&gate, "").unwrap();
    assert!(
        daemon
            .cli(&["workflow", "retry", &failed_id])
            .status
            .success()
    );
    for _ in 0..200 {
        if daemon.cli_json(&["workflow", "status", &failed_id, "--json"])["status"] == "completed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        daemon.cli_json(&["workflow", "status", &failed_id, "--json"])["status"],
        "completed"
    );

    let unknown = daemon.cli(&["workflow", "submit", "no-such-template"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("unknown template `no-such-template`")
    );
    let bad_input = daemon.cli(&["workflow", "submit", "chain", "-i", "novalue"]);
    assert!(String::from_utf8_lossy(&bad_input.stderr).contains("expected KEY=VALUE"));

    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

#[test]
fn template_validate_checks_a_file_offline() {
    let dir = tempfile::tempdir().unwrap();
    let good = fixture_templates().join("chain.yaml");
    let scripts = fixture_scripts();
    let output = Command::new(BIN)
        .args(["template", "validate"])
        .arg(&good)
        .arg("--scripts-dir")
        .arg(&scripts)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("chain@1 is valid (4 steps)"));

    let cases = [
        (
            "steps:\n- {ref_name: a, script: dag/step.py, depends_on: [b]}\n- {ref_name: b, script: dag/step.py, depends_on: [a]}\n",
            "a -> b -> a",
        ),
        (
            "steps:\n- {ref_name: a, script: dag/nope.py}\n",
            "steps.a.script",
        ),
        (
            "steps:\n- {ref_name: a, script: dag/step.py, input: {x: '${b.output}'}}\n",
            "steps.a.input.x",
        ),
    ];
    for (steps, expected) in cases {
        let file = dir.path().join("t.yaml");
        std::fs::write(
            &file,
            format!("name: t\nref_name: t\nschema_version: 1\n{steps}"),
        )
        .unwrap();
        let output = Command::new(BIN)
            .args(["template", "validate"])
            .arg(&file)
            .arg("--scripts-dir")
            .arg(&scripts)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{steps}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{stderr}");
    }
}

#[test]
fn checkpoints_are_saved_for_running_tasks_only() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&dir.path().join("data"), &[]);
    let created = submit(
        &format!("{}/workflows/servers/create", daemon.url),
        json!({"infra": "cp", "servers": ["hang-cp"]}),
    );
    let id = ids_of(&created).remove(0);
    for _ in 0..200 {
        if daemon.cli_json(&["task", &id, "--json"])["status"] == "running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let set = daemon.cli(&["checkpoint", "set", "job", "42", "--task", &id]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let set = daemon.cli(&["checkpoint", "set", "phase", "polling", "--task", &id]);
    assert!(set.status.success());
    let job = daemon.cli(&["checkpoint", "get", "job", "--task", &id]);
    assert_eq!(String::from_utf8_lossy(&job.stdout).trim(), "42");
    assert_eq!(
        daemon.cli_json(&["checkpoint", "get", "--task", &id]),
        json!({"job": 42, "phase": "polling"})
    );
    assert_eq!(
        daemon.cli_json(&["task", &id, "--json"])["checkpoint"],
        json!({"job": 42, "phase": "polling"})
    );

    assert!(daemon.cli(&["cancel", &id]).status.success());
    wait_all_finished(&daemon, std::slice::from_ref(&id));
    let refused = daemon.cli(&["checkpoint", "set", "job", "43", "--task", &id]);
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(
        message.contains("only a running task") && message.contains("409"),
        "{message}"
    );
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

/// `workflow status --watch` draws the DAG, draws it again as the event
/// stream announces changes, and returns once the workflow has ended.
#[test]
fn workflow_status_watch_redraws_until_the_workflow_ends() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&dir.path().join("data"), &[]);
    let submitted = daemon.cli_json(&["workflow", "submit", "chain", "-i", "sleep=0.5", "--json"]);
    let id = submitted["id"].as_str().unwrap().to_owned();
    let watched = daemon.cli(&["workflow", "status", &id, "--watch"]);
    let stdout = String::from_utf8_lossy(&watched.stdout);
    assert!(
        watched.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&watched.stderr)
    );
    // Drawn more than once, and last as completed.
    let drawings: Vec<&str> = stdout.split(&format!("workflow {id}")).skip(1).collect();
    assert!(
        drawings.len() >= 2,
        "drawn {} times:\n{stdout}",
        drawings.len()
    );
    assert!(drawings.last().unwrap().contains("[completed]"), "{stdout}");
    assert!(!drawings[0].contains("[completed]"), "{stdout}");
}

#[test]
fn rerun_and_schedule_commands() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&dir.path().join("data"), &[]);
    let first = daemon.cli(&[
        "workflow",
        "submit",
        "chain",
        "--ref",
        "cli-rerun",
        "--wait",
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let list = daemon.cli_json(&["workflow", "list", "--ref", "cli-rerun", "--json"]);
    let id = list["workflows"][0]["id"].as_str().unwrap().to_owned();
    let rerun = daemon.cli(&["workflow", "rerun", &id, "--from", "c", "--wait"]);
    let stdout = String::from_utf8_lossy(&rerun.stdout);
    assert!(
        rerun.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    assert!(stdout.contains("[completed]"), "{stdout}");
    let list = daemon.cli_json(&["workflow", "list", "--ref", "cli-rerun", "--json"]);
    assert_eq!(list["total"], 2);
    let unknown = daemon.cli(&["workflow", "rerun", &id, "--from", "zz"]);
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr)
            .contains("from: template `chain` has no step `zz`")
    );

    let created = daemon.cli_json(&[
        "schedule",
        "create",
        "chain",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Berlin",
        "--name",
        "nightly",
        "-i",
        "sleep=0",
        "--overlap",
        "queue",
        "--json",
    ]);
    let schedule = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["overlap"], "queue");
    assert_eq!(created["vars"]["sleep"], 0);
    let listed = String::from_utf8_lossy(&daemon.cli(&["schedule", "list"]).stdout).into_owned();
    assert!(
        listed.contains("nightly") && listed.contains("Europe/Berlin"),
        "{listed}"
    );
    let paused = daemon.cli_json(&["schedule", "pause", &schedule, "--json"]);
    assert_eq!(paused["paused"], true);
    let shown =
        String::from_utf8_lossy(&daemon.cli(&["schedule", "show", &schedule]).stdout).into_owned();
    assert!(
        shown.contains("[paused]") && shown.contains("next due: -"),
        "{shown}"
    );
    let resumed = daemon.cli_json(&["schedule", "resume", &schedule, "--json"]);
    assert!(resumed["next_due"].is_string(), "{resumed}");
    let bad = daemon.cli(&[
        "schedule",
        "create",
        "chain",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Atlantis",
    ]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr)
            .contains("timezone: `Atlantis` is not an IANA time zone")
    );
    assert!(
        daemon
            .cli(&["schedule", "delete", &schedule])
            .status
            .success()
    );
    assert!(
        !daemon
            .cli(&["schedule", "show", &schedule])
            .status
            .success()
    );

    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}
