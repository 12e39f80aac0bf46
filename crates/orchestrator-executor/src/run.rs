//! Running one attempt of a script and capturing what it says.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::{Launcher, ScriptExecutor};

/// How much of stderr is kept for the error message of a failed attempt.
const STDERR_TAIL_BYTES: usize = 2048;
/// How long to wait for output pipes to close once the process group is gone.
const PIPE_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// One attempt to run.
#[derive(Debug, Clone)]
pub struct Job<'a> {
    pub script: &'a str,
    pub input: &'a Value,
    pub task_id: String,
    pub workflow_id: String,
    /// 1-based attempt number.
    pub attempt: u32,
    pub check_mode: bool,
    pub timeout: Duration,
    /// What earlier attempts saved; empty on a first attempt.
    pub checkpoint: &'a Map<String, Value>,
    /// The script's `ORCHESTRATOR_TOKEN`: it may save this task's
    /// checkpoint through the API, and do nothing else.
    pub token: Option<String>,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Exit 0. `output` is the result object (`{}` when the script printed none).
    Succeeded { output: Value },
    /// A non-zero exit, a signal, a bad result, or a script that could not start.
    Failed {
        exit_code: Option<i32>,
        error: String,
    },
    /// The timeout passed; the process group was terminated.
    TimedOut { error: String },
    /// The cancel token fired; the process group was terminated.
    Cancelled,
}

enum Ending {
    Exited(ExitStatus),
    TimedOut,
    Cancelled,
}

impl ScriptExecutor {
    /// The scratch dir of a task; the script sees it as `ORCHESTRATOR_WORK_DIR`.
    pub fn work_dir_of(&self, task_id: &str) -> std::path::PathBuf {
        self.config.work_dir.join(task_id)
    }

    /// Runs one attempt. Every line the script prints goes to `logs` as it
    /// arrives. Never panics on anything the script does.
    pub async fn run(
        &self,
        job: Job<'_>,
        logs: UnboundedSender<Vec<u8>>,
        cancel: CancellationToken,
    ) -> Outcome {
        let script = match self.resolve(job.script) {
            Ok(script) => script,
            Err(e) => return failed_to_start(e.to_string()),
        };
        if cancel.is_cancelled() {
            return Outcome::Cancelled;
        }
        let work_dir = self.work_dir_of(&job.task_id);
        let result_file = work_dir.join("result.json");
        if let Err(e) = std::fs::create_dir_all(&work_dir) {
            return failed_to_start(format!(
                "cannot create work dir {}: {e}",
                work_dir.display()
            ));
        }
        let _ = std::fs::remove_file(&result_file);

        let mut command = match &script.launcher {
            Launcher::Interpreter(program) => {
                let mut command = Command::new(program);
                command.arg(&script.path);
                command
            }
            Launcher::Direct => Command::new(&script.path),
        };
        command
            .env_clear()
            .envs(self.inherited_env.iter().map(|(k, v)| (k, v)))
            .env("ORCHESTRATOR_TASK_ID", &job.task_id)
            .env("ORCHESTRATOR_WORKFLOW_ID", &job.workflow_id)
            .env("ORCHESTRATOR_ATTEMPT", job.attempt.to_string())
            .env(
                "ORCHESTRATOR_CHECK_MODE",
                if job.check_mode { "true" } else { "false" },
            )
            .env("ORCHESTRATOR_WORK_DIR", &work_dir)
            .env("ORCHESTRATOR_RESULT_FILE", &result_file)
            .env("ORCHESTRATOR_DATA_DIR", &self.config.data_dir)
            .env("ORCHESTRATOR_SCRIPTS_DIR", &self.config.scripts_dir)
            .env(
                "ORCHESTRATOR_CHECKPOINT",
                Value::Object(job.checkpoint.clone()).to_string(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group, so a timeout or cancel can stop the
            // script together with everything it started.
            .process_group(0)
            .kill_on_drop(true);

        if let Some(url) = &self.config.service_url {
            command.env("ORCHESTRATOR_URL", url);
        }
        if let Some(token) = &job.token {
            command.env("ORCHESTRATOR_TOKEN", token);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => {
                let program = match &script.launcher {
                    Launcher::Interpreter(p) => p.display().to_string(),
                    Launcher::Direct => script.path.display().to_string(),
                };
                return failed_to_start(format!(
                    "could not start `{program}` for script `{}`: {e}",
                    script.name
                ));
            }
        };
        let pgid = child.id().map(|id| Pid::from_raw(id as i32));

        let input = stdin_document(job.input, job.checkpoint);
        if let Some(mut stdin) = child.stdin.take() {
            // A script that ignores stdin may exit before reading it all;
            // the broken pipe that follows is not an error.
            tokio::spawn(async move {
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            });
        }
        let stdout = child.stdout.take().map(|out| {
            tokio::spawn(read_lines(
                out,
                logs.clone(),
                LineKeeper::LastJsonObject(None),
            ))
        });
        let stderr = child
            .stderr
            .take()
            .map(|err| tokio::spawn(read_lines(err, logs, LineKeeper::Tail(Vec::new()))));

        let ending = tokio::select! {
            status = child.wait() => match status {
                Ok(status) => Ending::Exited(status),
                Err(e) => return failed_to_start(format!("waiting for script `{}`: {e}", script.name)),
            },
            () = tokio::time::sleep(job.timeout) => Ending::TimedOut,
            () = cancel.cancelled() => Ending::Cancelled,
        };
        if !matches!(ending, Ending::Exited(_)) {
            self.terminate(&mut child, pgid).await;
        }
        // Whatever the script left behind in its group goes too.
        if let Some(pgid) = pgid {
            let _ = killpg(pgid, Signal::SIGKILL);
        }

        let stdout = drain(stdout).await;
        let stderr = drain(stderr).await;
        let stderr_tail = match stderr {
            LineKeeper::Tail(tail) => String::from_utf8_lossy(&tail).trim().to_owned(),
            LineKeeper::LastJsonObject(_) => String::new(),
        };

        match ending {
            Ending::TimedOut => Outcome::TimedOut {
                error: with_tail(
                    format!(
                        "timed out after {}s; process group terminated",
                        job.timeout.as_secs_f64()
                    ),
                    &stderr_tail,
                ),
            },
            Ending::Cancelled => Outcome::Cancelled,
            Ending::Exited(status) if status.success() => {
                let from_stdout = match stdout {
                    LineKeeper::LastJsonObject(object) => object,
                    LineKeeper::Tail(_) => None,
                };
                match read_result_file(&result_file) {
                    Ok(Some(output)) => self.succeeded(&job.task_id, output),
                    Ok(None) => self.succeeded(
                        &job.task_id,
                        from_stdout.unwrap_or_else(|| Value::Object(Default::default())),
                    ),
                    Err(error) => Outcome::Failed {
                        exit_code: Some(0),
                        error,
                    },
                }
            }
            Ending::Exited(status) => {
                use std::os::unix::process::ExitStatusExt;
                let error = match (status.code(), status.signal()) {
                    (Some(code), _) => format!("script exited with code {code}"),
                    (None, Some(signal)) => format!("script was killed by signal {signal}"),
                    (None, None) => "script ended abnormally".to_owned(),
                };
                Outcome::Failed {
                    exit_code: status.code(),
                    error: with_tail(error, &stderr_tail),
                }
            }
        }
    }

    fn succeeded(&self, task_id: &str, output: Value) -> Outcome {
        // The scratch dir of a successful attempt has served its purpose;
        // a failed attempt keeps its own for inspection.
        let _ = std::fs::remove_dir_all(self.work_dir_of(task_id));
        Outcome::Succeeded { output }
    }

    /// SIGTERM to the whole group, SIGKILL after the grace period.
    async fn terminate(&self, child: &mut Child, pgid: Option<Pid>) {
        let Some(pgid) = pgid else {
            let _ = child.kill().await;
            return;
        };
        let _ = killpg(pgid, Signal::SIGTERM);
        if tokio::time::timeout(self.config.kill_grace, child.wait())
            .await
            .is_err()
        {
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = child.wait().await;
        }
    }
}

/// The input as the script reads it: an object input also carries the
/// checkpoint under `checkpoint`, unless it has a field of that name itself
/// (the checkpoint is in `ORCHESTRATOR_CHECKPOINT` either way).
fn stdin_document(input: &Value, checkpoint: &Map<String, Value>) -> Vec<u8> {
    match input {
        Value::Object(fields) if !fields.contains_key("checkpoint") => {
            let mut fields = fields.clone();
            fields.insert("checkpoint".into(), Value::Object(checkpoint.clone()));
            serde_json::to_vec(&Value::Object(fields))
        }
        other => serde_json::to_vec(other),
    }
    .unwrap_or_else(|_| b"null".to_vec())
}

fn failed_to_start(error: String) -> Outcome {
    Outcome::Failed {
        exit_code: None,
        error,
    }
}

fn with_tail(message: String, stderr_tail: &str) -> String {
    if stderr_tail.is_empty() {
        message
    } else {
        format!("{message}: {stderr_tail}")
    }
}

/// What a pipe reader keeps besides forwarding lines to the log.
enum LineKeeper {
    /// stdout: the last line that parsed as a JSON object.
    LastJsonObject(Option<Value>),
    /// stderr: the last bytes, for the error message.
    Tail(Vec<u8>),
}

impl LineKeeper {
    fn keep(&mut self, line: &[u8]) {
        match self {
            LineKeeper::LastJsonObject(last) => {
                let trimmed = line.trim_ascii();
                if trimmed.first() == Some(&b'{')
                    && let Ok(value @ Value::Object(_)) = serde_json::from_slice(trimmed)
                {
                    *last = Some(value);
                }
            }
            LineKeeper::Tail(tail) => {
                tail.extend_from_slice(line);
                if tail.len() > STDERR_TAIL_BYTES {
                    tail.drain(..tail.len() - STDERR_TAIL_BYTES);
                }
            }
        }
    }
}

async fn read_lines(
    pipe: impl AsyncRead + Unpin,
    logs: UnboundedSender<Vec<u8>>,
    mut keeper: LineKeeper,
) -> LineKeeper {
    let mut reader = BufReader::new(pipe);
    loop {
        let mut line = Vec::new();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                keeper.keep(&line);
                let _ = logs.send(line);
            }
        }
    }
    keeper
}

async fn drain(reader: Option<tokio::task::JoinHandle<LineKeeper>>) -> LineKeeper {
    let empty = LineKeeper::Tail(Vec::new());
    let Some(mut reader) = reader else {
        return empty;
    };
    // A process that escaped the group (setsid) may hold the pipe open;
    // stop waiting for it after a bounded time.
    match tokio::time::timeout(PIPE_DRAIN_TIMEOUT, &mut reader).await {
        Ok(Ok(keeper)) => keeper,
        _ => {
            reader.abort();
            empty
        }
    }
}

fn read_result_file(path: &Path) -> Result<Option<Value>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read result file {}: {e}", path.display())),
    };
    match serde_json::from_slice(&bytes) {
        Ok(value @ Value::Object(_)) => Ok(Some(value)),
        Ok(_) => Err(format!(
            "result file {} must hold a JSON object",
            path.display()
        )),
        Err(e) => Err(format!(
            "result file {} is not valid JSON: {e}",
            path.display()
        )),
    }
}

/// Kills what is left of an attempt whose service died: every process whose
/// environment carries `ORCHESTRATOR_TASK_ID=<task_id>` (scripts inherit it,
/// and so do their children), with its process group. Returns how many
/// processes were found. Left-overs are killed, never adopted: a new attempt
/// must not run beside an old one.
pub fn kill_leftovers(task_id: &str) -> usize {
    let needle = format!("ORCHESTRATOR_TASK_ID={task_id}");
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut found = 0;
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        // Unreadable (another user's process, or already gone): not ours.
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if !environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes())
        {
            continue;
        }
        found += 1;
        let pid = Pid::from_raw(pid as i32);
        if let Ok(pgid) = nix::unistd::getpgid(Some(pid)) {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }
    found
}
