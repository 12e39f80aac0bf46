//! Starting services and talking to them over HTTP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use orchestrator::service::{self, ServiceHandle};
use orchestrator::settings::ServeSettings;
use serde_json::Value;

/// The test doubles of the provisioning scripts (bash, see their header).
pub fn fixture_scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/scripts")
}

/// The real provisioning scripts shipped in `scripts/`.
pub fn real_scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// Test templates (next to the fixture scripts they run).
pub fn fixture_templates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates")
}

/// Settings for a test service on port 0 running the fixture scripts.
pub fn fixture_settings(data_dir: &Path) -> ServeSettings {
    let mut settings = ServeSettings::new(data_dir.to_path_buf(), fixture_scripts());
    settings.templates_dir = fixture_templates();
    settings.port = 0;
    settings.workers = 4;
    settings.retry.base_delay = Duration::from_millis(50);
    settings.retry.max_delay = Duration::from_millis(200);
    settings.kill_grace = Duration::from_millis(500);
    settings.shutdown_grace = Duration::from_secs(5);
    settings.interpreters.insert("nu".into(), "bash".into());
    // Most tests are about the work, not the door: auth has its own tests.
    settings.auth = false;
    settings
}

pub struct TestService {
    pub handle: Option<ServiceHandle>,
    pub base: String,
    pub http: reqwest::Client,
    pub data_dir: PathBuf,
}

impl TestService {
    pub async fn start(settings: ServeSettings) -> TestService {
        Self::start_with_store(settings, |storage| storage).await
    }

    /// A service whose store goes through `wrap` (a fault-injection layer).
    pub async fn start_with_store(
        settings: ServeSettings,
        wrap: impl FnOnce(orchestrator_storage::Storage) -> orchestrator_storage::Storage,
    ) -> TestService {
        let data_dir = settings.data_dir.clone();
        let handle = service::start_with_store(settings, wrap)
            .await
            .expect("service starts");
        TestService {
            base: format!("http://{}", handle.addr),
            handle: Some(handle),
            http: reqwest::Client::new(),
            data_dir,
        }
    }

    pub async fn stop(mut self) {
        if let Some(handle) = self.handle.take() {
            handle.shutdown().await.expect("clean shutdown");
        }
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn patch(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .patch(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn delete(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .delete(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// Submits a server-create workflow; returns its task ids.
    pub async fn create_servers(&self, servers: &[&str], extra: Value) -> (String, Vec<String>) {
        let mut body = serde_json::json!({"infra": "test", "servers": servers});
        if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        let (status, response) = self.post("/workflows/servers/create", body).await;
        assert!(status == 202 || status == 200, "{status} {response}");
        let ids = response["task_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        (response["workflow_id"].as_str().unwrap().to_owned(), ids)
    }

    /// Polls a task until `done` holds for it (or panics after a minute).
    pub async fn wait_task(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, task) = self.get(&format!("/tasks/{id}")).await;
            assert_eq!(status, 200, "{task}");
            if done(&task) {
                return task;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "task never got there: {task}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    pub async fn wait_finished(&self, id: &str) -> Value {
        self.wait_task(id, |t| {
            matches!(
                t["status"].as_str(),
                Some("completed" | "failed" | "cancelled" | "skipped")
            )
        })
        .await
    }

    /// Polls a workflow until it reaches a terminal status.
    pub async fn wait_workflow(&self, id: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, workflow) = self.get(&format!("/workflows/{id}")).await;
            assert_eq!(status, 200, "{workflow}");
            if matches!(
                workflow["status"].as_str(),
                Some("completed" | "failed" | "cancelled")
            ) {
                return workflow;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "workflow never finished: {workflow}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Where the scripts keep their state (their `ORCHESTRATOR_DATA_DIR`):
    /// the one part of the data dir the sandbox lets them reach.
    pub fn state_dir(&self) -> std::path::PathBuf {
        script_state(&self.data_dir)
    }

    /// Lines of the fixture scripts' trace file.
    pub fn trace(&self) -> Vec<String> {
        std::fs::read_to_string(self.state_dir().join("trace.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// What a run of the binary printed: stdout, then stderr.
pub fn output_text(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The scripts' state dir of a service on `data_dir`.
pub fn script_state(data_dir: &Path) -> std::path::PathBuf {
    data_dir.join("script-state")
}

/// The live processes (host pids) of a task's attempts: every process
/// whose environment holds `ORCHESTRATOR_TASK_ID=<task_id>`. A script
/// cannot say its own host pid from inside its PID namespace.
pub fn task_processes(task_id: &str) -> Vec<i32> {
    let needle = format!("ORCHESTRATOR_TASK_ID={task_id}");
    std::fs::read_dir("/proc")
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .filter(|pid| pid_alive(*pid))
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/environ"))
                        .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn pid_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

/// Spawns `orchestrator serve` (on `--port 0`) and waits up to `wait` for
/// the address it prints; its stderr is drained from then on, so the
/// service never blocks on a full pipe.
pub fn spawn_serve(
    mut command: std::process::Command,
    wait: Duration,
) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = command
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let pid = child.id();
    let (found, url) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // The service's warnings and errors go with the test's output
            // (shown when it fails): what went wrong in the process.
            if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("[orchestrator serve {pid}] {line}");
            }
            if !sent && let Some(at) = line.find("listening on http://") {
                let url = line[at + "listening on ".len()..]
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .to_owned();
                let _ = found.send(url);
                sent = true;
            }
        }
    });
    let url = url
        .recv_timeout(wait)
        .expect("the service printed its address");
    (child, url)
}
