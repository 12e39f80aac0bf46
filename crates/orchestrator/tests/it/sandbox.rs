//! A hostile script against a real `orchestrator serve`: it tries to read
//! the service's environment (the secret key in `ORCHESTRATOR_SECRET_KEY`),
//! every process's environment, the data dir (the key file, the store's
//! journal), the config file and the key file, and reports its own
//! capabilities. Nothing of it may be reachable.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::cli::{BIN, Daemon, submit, submit_as, wait_all_finished};
use crate::harness::fixture_scripts;

/// A key no script may ever see (64 hex digits).
const KEY: &str = "5ec2e7ca7e5ec2e7ca7e5ec2e7ca7e5ec2e7ca7e5ec2e7ca7e5ec2e7ca7e0001";
/// In the config file only.
const CONFIG_MARKER: &str = "config-file-marker-a1b2c3";

/// Runs `hostile/reach.py` as a step of `daemon` and returns its report
/// and the task's log.
fn reach(daemon: &Daemon, data_dir: &Path, files: &[&Path]) -> (Value, String) {
    let created = submit(
        &format!("{}/workflows", daemon.url),
        json!({"template": {
            "name": "hostile", "ref_name": "hostile", "schema_version": 1,
            "steps": [{"ref_name": "reach", "script": "hostile/reach.py",
                       "input": {"data_dir": data_dir, "files": files}}],
        }, "max_attempts": 1}),
    );
    let id = created["task_ids"][0]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    for _ in 0..600 {
        let task = daemon.cli_json(&["task", &id, "--json"]);
        match task["status"].as_str() {
            Some("completed") => {
                let log = daemon.cli(&["logs", &id]);
                return (
                    task["output"].clone(),
                    String::from_utf8_lossy(&log.stdout).into_owned(),
                );
            }
            Some("failed" | "cancelled") => panic!("the hostile step did not run: {task}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    panic!("task {id} never finished");
}

/// What the report must not hold, whatever the service's setup.
fn assert_nothing_reached(report: &Value, log: &str, data_dir: &Path, secrets: &[&str]) {
    let text = report.to_string();
    for secret in secrets {
        assert!(!text.contains(secret), "the script read {secret}: {text}");
        assert!(!log.contains(secret), "the log shows {secret}: {log}");
    }
    assert!(
        !text.contains("ORCHESTRATOR_SECRET_KEY"),
        "the script read the service's environment: {text}"
    );
    let data = data_dir.display().to_string();
    let read = report["read"].as_object().unwrap();
    assert!(
        read.keys().all(|path| !path.starts_with(&data)),
        "the script read files of the data dir: {:?}",
        read.keys().collect::<Vec<_>>()
    );
    // All it sees of the data dir: its own dirs (the mount points of its
    // state dir and its work dir), nothing of the service's.
    let listed = report["listed"][&data].as_array().unwrap();
    let own = [
        data_dir.join("script-state").display().to_string(),
        data_dir.join("work").display().to_string(),
    ];
    assert!(
        listed.iter().all(|p| own
            .iter()
            .any(|o| p.as_str().unwrap().starts_with(o.as_str()))),
        "the script listed the data dir: {listed:?}"
    );
    // Only its own sandbox's processes: the sandbox's init and itself.
    let environs = read.keys().filter(|p| p.ends_with("/environ")).count();
    assert!(environs <= 2, "it read {environs} environments: {text}");
    for set in ["CapEff", "CapPrm", "CapAmb", "CapInh"] {
        assert_eq!(
            report["caps"][set], "0000000000000000",
            "the script holds capabilities: {}",
            report["caps"]
        );
    }
    assert_eq!(
        report["connected"],
        json!([]),
        "the script reached a socket of the service's: {text}"
    );
    // Root without capabilities could still write most kernel settings
    // by their file modes, were they not read-only.
    assert_eq!(
        report["writable"],
        json!([]),
        "the script could write kernel settings or /dev: {text}"
    );
}

fn config_file(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!("workers = 1\nno_auth = true\nsurrealdb_password = \"{CONFIG_MARKER}\"\n"),
    )
    .unwrap();
    config
}

/// As CI runs it (and as many do by hand): the service as root, the key
/// in its environment.
#[test]
fn a_script_cannot_reach_the_key_the_store_or_root_s_capabilities() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let config = config_file(dir.path());
    // The test environments' container engine, as far as scripts can
    // tell: a socket that answers. Root on its host, for real. Outside
    // /tmp, which scripts see as their own.
    let engine_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let engine = engine_dir.path().join("engine.sock");
    let listener = std::os::unix::net::UnixListener::bind(&engine).unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--port", "0", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--scripts-dir")
        .arg(fixture_scripts())
        .args(["--testenv-provider", "docker", "--docker-host"])
        .arg(format!("unix://{}", engine.display()))
        .env("ORCHESTRATOR_SECRET_KEY", KEY);
    let daemon = Daemon::spawn(command);
    // In a sandbox prepared ahead, as most attempts run.
    wait_for_a_prepared_sandbox(&data_dir);
    let (report, log) = reach(&daemon, &data_dir, &[&config, &engine]);
    assert_nothing_reached(&report, &log, &data_dir, &[KEY, CONFIG_MARKER]);
    // (The service itself may have used it: only the script's own
    // report says whether the script could.)
    drop(listener);
    // The store is there and has the workflow: the script could not see it.
    assert!(data_dir.join("journal.jsonl").exists() || data_dir.join("snapshot.jsonl").exists());
}

/// A service as an unprivileged user (`nobody`) holding CAP_SYS_ADMIN and
/// CAP_NET_ADMIN as ambient capabilities, as the Debian unit with the
/// test-environment drop-in runs it, with `extra` arguments. The key is
/// in a file (`--secret-key-file`), or with `key_in_env` in
/// `ORCHESTRATOR_SECRET_KEY`.
struct Unprivileged {
    dir: tempfile::TempDir,
    daemon: Daemon,
}

impl Unprivileged {
    fn start(extra: &[&str], key_in_env: bool) -> Unprivileged {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // `nobody` must reach the binary, the scripts and its own dirs.
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = root.join("orchestrator");
        std::fs::copy(BIN, &bin).unwrap();
        // With the helper of prepared sandboxes beside it, as built.
        std::fs::copy(
            env!("CARGO_BIN_EXE_orchestrator-sandbox-exec"),
            root.join("orchestrator-sandbox-exec"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("scripts/hostile")).unwrap();
        std::fs::copy(
            fixture_scripts().join("hostile/reach.py"),
            root.join("scripts/hostile/reach.py"),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::write(root.join("secret-key"), KEY).unwrap();
        let config = config_file(root);
        for name in ["data", "secret-key", "config.toml"] {
            let status = Command::new("chown")
                .arg("65534:65534")
                .arg(root.join(name))
                .status()
                .unwrap();
            assert!(status.success(), "these tests run as root, as CI does");
        }
        for name in ["secret-key", "config.toml"] {
            std::fs::set_permissions(root.join(name), std::fs::Permissions::from_mode(0o600))
                .unwrap();
        }
        let mut command = Command::new("setpriv");
        command
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=+sys_admin,+net_admin",
                "--ambient-caps=+sys_admin,+net_admin",
                "--",
            ])
            .arg(&bin)
            .args(["serve", "--port", "0", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(root.join("data"))
            .arg("--scripts-dir")
            .arg(root.join("scripts"))
            .args(extra)
            .current_dir(root);
        if key_in_env {
            command.env("ORCHESTRATOR_SECRET_KEY", KEY);
        } else {
            command
                .arg("--secret-key-file")
                .arg(root.join("secret-key"));
        }
        let daemon = Daemon::spawn(command);
        Unprivileged { dir, daemon }
    }

    fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.path().join(name)
    }
}

/// The capabilities of the drop-in stay with the service (its
/// test-environment helpers); scripts get none, and the key file, the
/// config and the data dir stay out of reach.
#[test]
fn a_script_gets_none_of_the_capabilities_of_the_test_environment_drop_in() {
    let service = Unprivileged::start(&[], false);
    let (data_dir, config, key) = (
        service.path("data"),
        service.path("config.toml"),
        service.path("secret-key"),
    );
    wait_for_a_prepared_sandbox(&data_dir);
    let (report, log) = reach(&service.daemon, &data_dir, &[&config, &key]);
    assert_nothing_reached(&report, &log, &data_dir, &[KEY, CONFIG_MARKER]);
}

/// Even unsandboxed, a script of the same user cannot read the service's
/// environment: the service is not dumpable.
#[test]
fn the_service_s_environment_is_unreadable_even_without_the_sandbox() {
    let service = Unprivileged::start(&["--script-sandbox", "none"], true);
    let data_dir = service.path("data");
    let (report, log) = reach(&service.daemon, &data_dir, &[]);
    let text = report.to_string();
    assert!(!text.contains(KEY), "the script read the key: {text}");
    assert!(!log.contains(KEY));
    assert!(
        report["refused"]
            .as_object()
            .unwrap()
            .keys()
            .any(|path| path.ends_with("/environ")),
        "{text}"
    );
}

/// `orchestrator serve` with one worker, the fixture scripts, `data_dir`
/// and `extra` arguments.
fn one_worker(data_dir: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--port", "0", "--no-auth", "--workers", "1"])
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--scripts-dir")
        .arg(fixture_scripts());
    command
}

/// Waits until the service has a sandbox prepared for the next attempt
/// (its dir is in the work dir, with the mark its helper leaves once every
/// mount is made), so that the attempt takes it.
fn wait_for_a_prepared_sandbox(data_dir: &Path) {
    for _ in 0..1200 {
        let ready = std::fs::read_dir(data_dir.join("work")).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                e.file_name().to_string_lossy().starts_with(".prepared-")
                    && e.path().join(".ready").exists()
            })
        });
        if ready {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("no sandbox was prepared in {}", data_dir.display());
}

/// Runs `sandbox/probe.py` with `input` and returns the finished task.
fn probe(daemon: &Daemon, input: Value, max_attempts: u32) -> Value {
    let id = submit_probe(daemon, input, json!({"max_attempts": max_attempts}));
    wait_all_finished(daemon, &[id]).remove(0)
}

/// Submits `sandbox/probe.py` with `input` and the submission's `options`
/// (`max_attempts`, `timeout_secs`, ...), and returns its task's id.
fn submit_probe(daemon: &Daemon, input: Value, options: Value) -> String {
    let mut body = json!({"template": {
        "name": "probe", "ref_name": "probe", "schema_version": 1,
        "steps": [{"ref_name": "probe", "script": "sandbox/probe.py", "input": input}],
    }});
    body.as_object_mut()
        .unwrap()
        .extend(options.as_object().unwrap().clone());
    let created = submit(&format!("{}/workflows", daemon.url), body);
    created["task_ids"][0].as_str().unwrap().to_owned()
}

/// A sandbox prepared ahead of its attempt serves that attempt alone, as
/// one made at the start would: the script reads all of its input, finds
/// its work dir at the path it is told, sees no earlier script's `/tmp`
/// nor processes; its work dir goes after a success and stays for the
/// retry after a failure.
#[test]
fn a_prepared_sandbox_serves_one_attempt_as_a_fresh_one_would() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let daemon = Daemon::spawn(one_worker(&data_dir, &["--script-sandbox-attempts", "1"]));

    // More input than a pipe holds: the helper must leave all of it.
    let blob = "b".repeat(300_000);
    let mut reports = Vec::new();
    for _ in 0..2 {
        wait_for_a_prepared_sandbox(&data_dir);
        let task = probe(&daemon, json!({"blob": blob, "keys": true}), 1);
        assert_eq!(task["status"], "completed", "{task}");
        let report = task["output"].clone();
        assert_eq!(report["prepared"], true, "not a prepared sandbox: {report}");
        assert_eq!(report["blob_len"], blob.len(), "{report}");
        assert_eq!(report["earlier_tmp"], false, "a /tmp shared: {report}");
        // The helper's seccomp filter: EPERM for a key, none found; EPERM
        // too for the same calls through the x32 ABI (ENOSYS here without
        // the filter's rules for them, as this kernel has no x32).
        assert_eq!(report["add_key_errno"], json!([1, 1]), "{report}");
        assert_eq!(report["x32_errno"], json!([1, 1, 1]), "{report}");
        assert_eq!(report["earlier_session_key"], false, "{report}");
        assert_eq!(report["earlier_user_key"], false, "{report}");
        assert_eq!(report["dev_writable"], false, "{report}");
        assert_eq!(report["pids"], json!([1, 2]), "other processes: {report}");
        let work_dir = data_dir.join("work").join(task["id"].as_str().unwrap());
        assert_eq!(report["work_dir"], work_dir.display().to_string());
        assert!(!work_dir.exists(), "a successful attempt's work dir stays");
        reports.push(report);
    }

    // A failed attempt's work dir (with what it wrote through its path)
    // is the task's, where its retry finds it.
    wait_for_a_prepared_sandbox(&data_dir);
    let task = probe(&daemon, json!({"fail_first": true, "keys": true}), 2);
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["output"]["attempt"], 2, "{task}");
    // That retry's sandbox was made at its start: through the helper too.
    assert_eq!(task["output"]["prepared"], false, "{task}");
    assert_eq!(task["output"]["add_key_errno"], json!([1, 1]), "{task}");
    assert_eq!(task["output"]["x32_errno"], json!([1, 1, 1]), "{task}");
    assert_eq!(
        task["output"]["found_mark"], true,
        "the retry lost the work dir: {task}"
    );

    // Nothing prepared outlives the service, even one killed with -9.
    wait_for_a_prepared_sandbox(&data_dir);
    drop(daemon);
    assert_nothing_outlives(&data_dir);
}

/// No process started for the service with `data_dir` (a sandbox, its
/// helper, a script) outlives it.
fn assert_nothing_outlives(data_dir: &Path) {
    let data = data_dir.display().to_string();
    let left = || -> Vec<String> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&data))
            .collect()
    };
    for _ in 0..600 {
        if left().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("prepared sandboxes outlived the service: {:?}", left());
}

/// With `--script-sandbox-attempts 3 --script-sandbox-reuse any` one
/// sandbox serves three attempts (of three workflows) in a row, and each
/// finds it as a fresh one would be: no process, no
/// file in `/tmp` or `/dev/shm`, no System V segment of the attempt
/// before, and its helper's memory and environment out of reach. Then a
/// new sandbox serves the next three. One its helper cannot empty is
/// made anew. The hostile script reaches nothing of the service from one.
/// A retry, a timeout and the service's end behave as with sandboxes of
/// one attempt.
#[test]
fn a_kept_sandbox_serves_attempts_in_a_row_emptied_between_them() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut command = one_worker(
        &data_dir,
        &[
            "--script-sandbox-attempts",
            "3",
            "--script-sandbox-reuse",
            "any",
            "--kill-grace",
            "1",
        ],
    );
    command.env("ORCHESTRATOR_SECRET_KEY", KEY);
    let daemon = Daemon::spawn(command);
    let state_file = data_dir.join("script-state").join("kept");
    std::fs::write(&state_file, "the state dir is not scratch").unwrap();

    let blob = "b".repeat(300_000);
    let mut reports = Vec::new();
    for _ in 0..4 {
        wait_for_a_prepared_sandbox(&data_dir);
        let task = probe(&daemon, json!({"blob": blob, "leave": true}), 1);
        assert_eq!(task["status"], "completed", "{task}");
        let report = task["output"].clone();
        assert_eq!(report["prepared"], true, "not a prepared sandbox: {report}");
        assert_eq!(report["blob_len"], blob.len(), "{report}");
        let work_dir = data_dir.join("work").join(task["id"].as_str().unwrap());
        assert_eq!(report["work_dir"], work_dir.display().to_string());
        assert!(!work_dir.exists(), "a successful attempt's work dir stays");
        assert_eq!(
            report["parent_environ_readable"], false,
            "the helper is readable: {report}"
        );
        assert_eq!(
            report["init_stdin_taken"], false,
            "the helper's socket can be taken: {report}"
        );
        reports.push(report);
    }
    for (i, report) in reports.iter().enumerate() {
        // The first of each sandbox sees what bwrap made; the others see
        // it emptied after the attempts before them.
        assert_eq!(report["earlier_tmp"], false, "attempt {i}: {report}");
        assert_eq!(report["earlier_shm"], false, "attempt {i}: {report}");
        assert_eq!(report["earlier_hidden"], false, "attempt {i}: {report}");
        assert_eq!(report["earlier_mq"], false, "attempt {i}: {report}");
        assert_eq!(report["dev_writable"], false, "attempt {i}: {report}");
        // The keyrings are refused: nothing left there, nothing found.
        assert_eq!(
            report["add_key_errno"],
            json!([1, 1]),
            "attempt {i}: {report}"
        );
        assert_eq!(
            report["x32_errno"],
            json!([1, 1, 1]),
            "attempt {i}: {report}"
        );
        assert_eq!(
            report["earlier_session_key"], false,
            "attempt {i}: {report}"
        );
        assert_eq!(report["earlier_user_key"], false, "attempt {i}: {report}");
        assert_eq!(report["sysv_segments"], 0, "attempt {i}: {report}");
        // Its helper (the sandbox's init) and itself.
        assert_eq!(
            report["pids"],
            json!([1, report["me"]]),
            "attempt {i} sees other processes: {report}"
        );
    }
    assert!(
        same(&reports[0], &reports[1]) && same(&reports[1], &reports[2]),
        "{reports:?}"
    );
    assert!(
        !same(&reports[2], &reports[3]),
        "a sandbox served a fourth attempt: {reports:?}"
    );
    assert!(
        state_file.exists(),
        "the state dir was emptied with the scratch dirs"
    );
    // (The hostile script must find nothing in the data dir to read.)
    std::fs::remove_file(&state_file).unwrap();

    // A sandbox its helper cannot empty serves no other attempt: the
    // attempt's log says why, and the next attempt gets a new sandbox.
    let task = probe(&daemon, json!({"lock_tmp": true}), 1);
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["output"]["sandbox"], reports[3]["sandbox"], "{task}");
    let log = daemon.cli(&["logs", task["id"].as_str().unwrap()]);
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(
        log.contains("cannot serve another attempt") && log.contains("/tmp/locked"),
        "{log}"
    );
    wait_for_a_prepared_sandbox(&data_dir);
    let task = probe(&daemon, json!({}), 1);
    assert_eq!(task["status"], "completed", "{task}");
    assert_ne!(task["output"]["sandbox"], reports[3]["sandbox"], "{task}");
    assert_eq!(task["output"]["earlier_tmp"], false, "{task}");

    // The hostile script in a sandbox that served an attempt before it.
    let (report, log) = reach(&daemon, &data_dir, &[]);
    assert_nothing_reached(&report, &log, &data_dir, &[KEY]);

    // A retry finds what its failed attempt left in its work dir.
    wait_for_a_prepared_sandbox(&data_dir);
    let task = probe(&daemon, json!({"fail_first": true}), 2);
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(
        task["output"]["found_mark"], true,
        "the retry lost the work dir: {task}"
    );

    // A timeout ends the attempt, and its sandbox: the next attempt gets a
    // fresh one, with nothing of the one that timed out.
    wait_for_a_prepared_sandbox(&data_dir);
    let id = submit_probe(
        &daemon,
        json!({"leave": true, "sleep": 30}),
        json!({"max_attempts": 1, "timeout_secs": 1}),
    );
    let task = wait_all_finished(&daemon, &[id]).remove(0);
    assert_eq!(task["status"], "failed", "{task}");
    assert!(
        task["error"]
            .as_str()
            .unwrap_or_default()
            .contains("timed out"),
        "{task}"
    );
    wait_for_a_prepared_sandbox(&data_dir);
    let task = probe(&daemon, json!({}), 1);
    let report = &task["output"];
    assert_eq!(report["earlier_tmp"], false, "{report}");
    assert_eq!(report["pids"], json!([1, report["me"]]), "{report}");

    wait_for_a_prepared_sandbox(&data_dir);
    drop(daemon);
    assert_nothing_outlives(&data_dir);
}

/// Four probes in a row, the third given a secret.
const PROBES: &str = "name: Probes
ref_name: probes
schema_version: 1
steps:
  - {ref_name: first, script: sandbox/probe.py, input: {leave: true}}
  - {ref_name: second, script: sandbox/probe.py, depends_on: [first], input: {leave: true}}
  - {ref_name: given, script: sandbox/probe.py, depends_on: [second],
     input: {leave: true, password: '${secrets.probe_password}'}}
  - {ref_name: after, script: sandbox/probe.py, depends_on: [given], input: {leave: true}}
";

/// `orchestrator token create --local` into the store at `data_dir`,
/// while no service runs: the new token.
fn local_token(data_dir: &Path, name: &str, role: &str) -> String {
    let output = Command::new(BIN)
        .args(["token", "create", "--local", "--data-dir"])
        .arg(data_dir)
        .args(["--name", name, "--role", role])
        .env_remove("ORCHESTRATOR_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout.lines().last().unwrap().trim().to_owned()
}

/// A service of one worker with tokens (`admin`, `alice` and `bob`, the
/// last two operators), the [`PROBES`] template and the secret its third
/// step is given; the tokens, in that order.
fn with_tokens_and_probes(dir: &Path, extra: &[&str]) -> (Daemon, [String; 3]) {
    let data_dir = dir.join("data");
    let templates = dir.join("templates");
    std::fs::create_dir(&templates).unwrap();
    std::fs::write(templates.join("probes.yaml"), PROBES).unwrap();
    let tokens = [
        local_token(&data_dir, "admin", "admin"),
        local_token(&data_dir, "alice", "operator"),
        local_token(&data_dir, "bob", "operator"),
    ];
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--port", "0", "--workers", "1", "--data-dir"])
        .arg(&data_dir)
        .arg("--scripts-dir")
        .arg(fixture_scripts())
        .arg("--templates-dir")
        .arg(&templates)
        .args(extra)
        .env("ORCHESTRATOR_SECRET_KEY", KEY);
    let daemon = Daemon::spawn(command);
    let mut put = Command::new(BIN)
        .args(["--url", &daemon.url, "--token", &tokens[0]])
        .args(["secret", "put", "probe_password", "--templates", "probes"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    put.stdin
        .take()
        .unwrap()
        .write_all(b"a-probe-password-0042")
        .unwrap();
    assert!(put.wait().unwrap().success());
    (daemon, tokens)
}

/// Submits `body` with `token`, once a sandbox is prepared for it, and
/// waits for its tasks: the new workflow, and what each step's probe
/// reported, by step name.
fn run_as(
    daemon: &Daemon,
    data_dir: &Path,
    token: &str,
    body: Value,
) -> (Value, Vec<(String, Value)>) {
    wait_for_a_prepared_sandbox(data_dir);
    let created = submit_as(&format!("{}/workflows", daemon.url), Some(token), body);
    let ids = created["task_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("{created}"));
    let steps = ids
        .iter()
        .map(|id| {
            let id = id.as_str().unwrap();
            for _ in 0..600 {
                let output = daemon.cli(&["--token", token, "task", id, "--json"]);
                assert!(output.status.success(), "{output:?}");
                let task: Value = serde_json::from_slice(&output.stdout).unwrap();
                if task["status"] == "completed" {
                    return (
                        task["name"].as_str().unwrap().to_owned(),
                        task["output"].clone(),
                    );
                }
                assert!(
                    matches!(task["status"].as_str(), Some("queued" | "running")),
                    "{task}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("task {id} never finished");
        })
        .collect();
    (created, steps)
}

/// A probe's report, fresh: the script's PID in its sandbox tells a fresh
/// sandbox (its first process after the helper) from one that served
/// before.
fn fresh(report: &Value) -> bool {
    report["me"] == 2
}

/// Two reports from one sandbox.
fn same(a: &Value, b: &Value) -> bool {
    a["sandbox"] == b["sandbox"] && a["pid_ns"] == b["pid_ns"]
}

/// Nothing an earlier attempt left in a shared sandbox reached `report`'s.
fn assert_emptied(step: &str, report: &Value) {
    assert_eq!(report["earlier_tmp"], false, "{step}: {report}");
    assert_eq!(report["earlier_shm"], false, "{step}: {report}");
    assert_eq!(report["earlier_mq"], false, "{step}: {report}");
    assert_eq!(report["pids"], json!([1, report["me"]]), "{step}: {report}");
}

/// The four probes of one [`PROBES`] workflow: its steps share one
/// sandbox, emptied between them, but for the step given a secret, which
/// gets a fresh one that serves no attempt after it.
fn assert_probes_share_but_the_secret(data_dir: &Path, steps: &[(String, Value)]) -> Value {
    let report = |name: &str| -> Value {
        steps
            .iter()
            .find(|(step, _)| step == name)
            .unwrap_or_else(|| panic!("no step {name}: {steps:?}"))
            .1
            .clone()
    };
    let (first, second, given, after) = (
        report("first"),
        report("second"),
        report("given"),
        report("after"),
    );
    assert!(fresh(&first), "{first}");
    assert!(
        same(&first, &second) && !fresh(&second),
        "the workflow's second step got another sandbox: {first} {second}"
    );
    // The first's sandbox waits for the workflow meanwhile: a fresh one.
    assert!(
        fresh(&given) && !same(&first, &given),
        "the step given a secret shared a sandbox: {first} {given}"
    );
    // After it: the workflow's kept sandbox, or a fresh one; never the
    // secret's, which ended with its attempt (its dir goes with it).
    assert!(
        same(&after, &first) || fresh(&after),
        "the secret's sandbox served another attempt: {given} {after}"
    );
    assert_ended(data_dir, &given, "the step given a secret");
    for (step, r) in [("second", &second), ("given", &given), ("after", &after)] {
        assert_emptied(step, r);
    }
    after
}

/// By default a sandbox serves, in a row, attempts of the workflows one
/// token submitted, and only those: a workflow's steps share one, and
/// so do the token's next workflows; an attempt whose input holds a
/// secret gets a fresh one, which serves no attempt after it; another
/// token's workflow gets another sandbox.
#[test]
fn by_default_a_sandbox_serves_one_token_s_workflows_and_a_secret_gets_one_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (daemon, [_, alice, bob]) = with_tokens_and_probes(dir.path(), &[]);
    let probes = json!({"template": "probes", "max_attempts": 1});
    let (created, steps) = run_as(&daemon, &data_dir, &alice, probes);
    // The workflow says whose it is: what the sandboxes go by.
    assert_eq!(created["submitted_by"], "alice", "{created}");
    let kept = assert_probes_share_but_the_secret(&data_dir, &steps);

    // Alice's next workflow, of one step: her kept sandbox, emptied.
    let one_step = json!({"template": {
        "name": "probe", "ref_name": "probe", "schema_version": 1,
        "steps": [{"ref_name": "probe", "script": "sandbox/probe.py", "input": {"leave": true}}],
    }});
    let alice_next = run_as(&daemon, &data_dir, &alice, one_step.clone())
        .1
        .remove(0)
        .1;
    assert!(
        same(&alice_next, &kept) && !fresh(&alice_next),
        "the token's next workflow got another sandbox: {kept} {alice_next}"
    );
    assert_emptied("alice's next", &alice_next);

    // Bob's: never Alice's sandbox. A fresh one, which then serves his
    // next workflow.
    let bob_first = run_as(&daemon, &data_dir, &bob, one_step.clone())
        .1
        .remove(0)
        .1;
    assert!(
        fresh(&bob_first) && !same(&bob_first, &kept),
        "another token's workflow shared a sandbox: {kept} {bob_first}"
    );
    let bob_next = run_as(&daemon, &data_dir, &bob, one_step).1.remove(0).1;
    assert!(
        same(&bob_next, &bob_first) && !fresh(&bob_next),
        "{bob_first} {bob_next}"
    );
    assert_emptied("bob's next", &bob_next);
}

/// With `--script-sandbox-reuse workflow` a sandbox serves the attempts of
/// one workflow alone: the token's next workflow gets a fresh one, and a
/// one-step workflow's sandbox ends with its attempt, as no later attempt
/// may use it.
#[test]
fn with_reuse_workflow_a_sandbox_serves_one_workflow_alone() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let (daemon, [_, alice, _]) =
        with_tokens_and_probes(dir.path(), &["--script-sandbox-reuse", "workflow"]);
    let probes = json!({"template": "probes", "max_attempts": 1});
    let (_, steps) = run_as(&daemon, &data_dir, &alice, probes);
    let kept = assert_probes_share_but_the_secret(&data_dir, &steps);

    let one_step = json!({"template": {
        "name": "probe", "ref_name": "probe", "schema_version": 1,
        "steps": [{"ref_name": "probe", "script": "sandbox/probe.py", "input": {}}],
    }});
    let other = run_as(&daemon, &data_dir, &alice, one_step).1.remove(0).1;
    assert!(fresh(&other) && !same(&other, &kept), "{kept} {other}");
    assert_ended(&data_dir, &other, "a one-step workflow");
}

/// A sandbox made ahead shows the host as it was when made. Once a path
/// its view hides or binds has appeared (here a `--script-writable` dir;
/// a control socket alike, which it would otherwise leave in reach), it
/// serves no attempt: the next one gets a sandbox of the host as it is,
/// and writes there.
#[test]
fn a_sandbox_made_before_a_path_of_its_view_appeared_serves_no_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let later = dir.path().join("later");
    let daemon = Daemon::spawn(one_worker(
        &data_dir,
        &["--script-writable", later.to_str().unwrap()],
    ));
    wait_for_a_prepared_sandbox(&data_dir);
    // Its sandbox is kept for the next attempt, and a fresh one is made.
    let first = probe(&daemon, json!({}), 1);
    assert_eq!(first["status"], "completed", "{first}");
    wait_for_a_prepared_sandbox(&data_dir);

    std::fs::create_dir(&later).unwrap();
    let second = probe(&daemon, json!({"write_to": later}), 1);
    assert_eq!(second["status"], "completed", "{second}");
    assert_eq!(second["output"]["wrote"], true, "{second}");
    assert!(later.join("from-a-script").exists(), "{second}");
    assert!(
        !same(&first["output"], &second["output"]),
        "the sandbox made before the dir served: {first} {second}"
    );
}

/// Waits until the sandbox `report` ran in has ended (its dir goes with
/// it), instead of waiting for another attempt.
fn assert_ended(data_dir: &Path, report: &Value, whose: &str) {
    let dir = data_dir.join("work").join(
        report["sandbox"]
            .as_str()
            .unwrap_or_else(|| panic!("{report}")),
    );
    for _ in 0..1200 {
        if !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("the sandbox of {whose} still waits for another attempt: {report}");
}

/// An attempt a kept sandbox was running when the service was killed with
/// -9 keeps what it wrote in its work dir: at the next start the dir
/// goes to the task's path, where the retry finds it.
#[test]
fn a_kept_sandbox_s_attempt_keeps_its_work_dir_across_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let start = || Daemon::spawn(one_worker(&data_dir, &["--script-sandbox-attempts", "3"]));
    let daemon = start();
    wait_for_a_prepared_sandbox(&data_dir);
    let id = submit_probe(
        &daemon,
        json!({"sleep_first": 60}),
        json!({"max_attempts": 2}),
    );
    // The attempt wrote its file in the kept sandbox's own dir.
    let written = || {
        std::fs::read_dir(data_dir.join("work"))
            .unwrap()
            .flatten()
            .any(|slot| slot.path().join(&id).join("mine").exists())
    };
    for _ in 0..1200 {
        if written() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(written(), "the attempt never wrote in its work dir");
    drop(daemon);
    assert_nothing_outlives(&data_dir);

    let daemon = start();
    let task = wait_all_finished(&daemon, std::slice::from_ref(&id)).remove(0);
    assert_eq!(task["status"], "completed", "{task}");
    assert_eq!(task["output"]["attempt"], 2, "{task}");
    assert_eq!(
        task["output"]["found_mine"], true,
        "the retry lost what the killed attempt wrote: {task}"
    );
}
