//! Running one attempt of a script and capturing what it says.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::prepared::{KeptAttempt, Taken};
use crate::redact::{Redactor, StreamRedactor};
use crate::step::{Attempt, LogSink, Outcome, StepRunner};
use crate::{Launcher, Sandbox, ScriptExecutor};

/// How much of stderr is kept for the error message of a failed attempt.
const STDERR_TAIL_BYTES: usize = 2048;
/// How long to wait for output pipes to close once the process group is gone.
const PIPE_DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest line that goes to the log as one: a longer one is split
/// into pieces of this size, with a line saying so.
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// The longest stdout line that can still be the result object.
const MAX_RESULT_LINE_BYTES: usize = 8 * 1024 * 1024;

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
    /// Takes secret values out of the log and the stderr tail, before
    /// either is cut.
    pub redactor: std::sync::Arc<Redactor>,
    /// The input holds a secret's value: a kept sandbox serves this
    /// attempt alone (`prepared`).
    pub holds_secrets: bool,
    /// Other steps of its workflow may follow it: a sandbox kept for them
    /// is worth keeping.
    pub more_steps: bool,
    /// Who submitted its workflow, when known (`Attempt::party`).
    pub party: Option<std::sync::Arc<str>>,
    /// `ORCHESTRATOR_LOCK_<KEY>` variables: the fencing tokens of the
    /// locks the attempt holds (names the engine made from validated
    /// keys, values numbers).
    pub lock_tokens: Vec<(String, u64)>,
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
    pub async fn run(&self, job: Job<'_>, logs: LogSink, cancel: CancellationToken) -> Outcome {
        let script = match self.resolve(job.script) {
            Ok(script) => script,
            Err(e) => return failed_to_start(e.to_string()),
        };
        if cancel.is_cancelled() {
            return Outcome::Cancelled;
        }
        let work_dir = self.work_dir_of(&job.task_id);
        let result_file = work_dir.join("result.json");

        let (program, script_arg) = match &script.launcher {
            Launcher::Interpreter(program) => (self.on_path(program), Some(&script.path)),
            Launcher::Direct => (script.path.clone(), None),
        };
        if let Sandbox::Bubblewrap(_) = &self.config.sandbox {
            // Inside the sandbox `bwrap` starts the program, and a
            // missing one would read as a script exiting with 1: say
            // it as the spawn would.
            if let Err(e) = std::fs::metadata(&program).and_then(|m| {
                if m.is_file() {
                    Ok(())
                } else {
                    Err(std::io::Error::from(std::io::ErrorKind::NotFound))
                }
            }) {
                return failed_to_start(format!(
                    "could not start `{}` for script `{}`: {e}",
                    program.display(),
                    script.name
                ));
            }
        }
        // A prepared sandbox brings the work dir along (renamed from its
        // own), when the task has none yet.
        let occupant = crate::prepared::Occupant {
            workflow_id: &job.workflow_id,
            party: job.party.as_deref(),
            holds_secrets: job.holds_secrets,
            more_steps: job.more_steps,
        };
        let prepared = self
            .prepared
            .as_ref()
            .and_then(|pool| pool.take(&work_dir, occupant));
        if prepared.is_none()
            && let Err(e) = std::fs::create_dir_all(&work_dir)
        {
            return failed_to_start(format!(
                "cannot create work dir {}: {e}",
                work_dir.display()
            ));
        }
        let _ = std::fs::remove_file(&result_file);

        let env = self.script_env(&job, &work_dir, &result_file);
        let request = crate::wire::Request {
            work_dir: &work_dir,
            program: program.as_os_str(),
            args: script_arg.iter().map(|a| a.as_os_str()).collect(),
            env: [&self.inherited_env, &env],
        };
        let spawned = match prepared {
            Some(Taken::Once(child)) => Ok((Process::Own(child), request.encode())),
            Some(Taken::Kept(mut kept)) => match kept.start(&request.encode()).await {
                Ok(streams) => Ok((Process::Kept(kept, Some(Box::new(streams))), Vec::new())),
                Err(e) => Err(e),
            },
            None => {
                let mut command = match &self.config.sandbox {
                    Sandbox::None => Command::new(&program),
                    Sandbox::Bubblewrap(sandbox) => {
                        let (bwrap, args) = sandbox.script_line(crate::sandbox::Attempt {
                            scripts_dir: &self.config.scripts_dir,
                            state_dir: &self.config.data_dir,
                            work_dir: &work_dir,
                        });
                        let mut command = Command::new(bwrap);
                        command.args(args).arg(&program);
                        command
                    }
                };
                command
                    .args(script_arg)
                    .env_clear()
                    .envs(self.inherited_env.iter().map(|(k, v)| (k, v)))
                    .envs(env.iter().map(|(k, v)| (k, v)));
                crate::sandbox::as_attempt(&mut command)
                    .spawn()
                    .map(|child| (Process::Own(child), Vec::new()))
            }
        };
        let (mut process, request) = match spawned {
            Ok(spawned) => spawned,
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
        let pgid = process.id().map(|id| Pid::from_raw(id as i32));
        let (stdin, stdout, stderr) = process.streams();

        let input = stdin_document(job.input, job.checkpoint);
        if let Some(mut stdin) = stdin {
            // A script that ignores stdin may exit before reading it all;
            // the broken pipe that follows is not an error. A prepared
            // sandbox reads its command first.
            tokio::spawn(async move {
                let _ = stdin.write_all(&request).await;
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            });
        }
        let budget = std::sync::Arc::new(LogBudget::new(self.max_log_bytes));
        let stdout = stdout.map(|out| {
            tokio::spawn(read_lines(
                out,
                logs.clone(),
                budget.clone(),
                LineKeeper::LastJsonObject {
                    last: None,
                    line: Some(Vec::new()),
                },
                job.redactor.clone(),
            ))
        });
        let stderr = stderr.map(|err| {
            tokio::spawn(read_lines(
                err,
                logs,
                budget,
                LineKeeper::Tail(Vec::new()),
                job.redactor.clone(),
            ))
        });

        let ending = tokio::select! {
            status = process.wait() => match status {
                Ok(status) => Ending::Exited(status),
                Err(e) => return failed_to_start(format!("waiting for script `{}`: {e}", script.name)),
            },
            () = tokio::time::sleep(job.timeout) => Ending::TimedOut,
            () = cancel.cancelled() => Ending::Cancelled,
        };
        if !matches!(ending, Ending::Exited(_)) {
            self.terminate(&mut process, pgid).await;
        }
        // Whatever the script left behind in its group goes too (a kept
        // sandbox's helper has ended it already, and the group is the
        // sandbox's own).
        if let (Some(pgid), Process::Own(_)) = (pgid, &process) {
            let _ = killpg(pgid, Signal::SIGKILL);
        }

        let stdout = drain(stdout).await;
        let stderr = drain(stderr).await;
        // A kept sandbox's attempt moves its work dir to the task's path
        // here, and the sandbox goes back to the pool.
        drop(process);
        let stderr_tail = match stderr {
            LineKeeper::Tail(tail) => String::from_utf8_lossy(&tail).trim().to_owned(),
            LineKeeper::LastJsonObject { .. } => String::new(),
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
                    LineKeeper::LastJsonObject { last, .. } => last,
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

    /// The attempt's own environment, set over the service's (less its
    /// settings): the contract's `ORCHESTRATOR_*` variables.
    fn script_env(
        &self,
        job: &Job<'_>,
        work_dir: &Path,
        result_file: &Path,
    ) -> Vec<(OsString, OsString)> {
        let mut env: Vec<(OsString, OsString)> = Vec::new();
        let mut set = |key: &str, value: OsString| env.push((key.into(), value));
        set("ORCHESTRATOR_TASK_ID", job.task_id.clone().into());
        set("ORCHESTRATOR_WORKFLOW_ID", job.workflow_id.clone().into());
        set("ORCHESTRATOR_ATTEMPT", job.attempt.to_string().into());
        set(
            "ORCHESTRATOR_CHECK_MODE",
            if job.check_mode { "true" } else { "false" }.into(),
        );
        set("ORCHESTRATOR_WORK_DIR", work_dir.into());
        set("ORCHESTRATOR_RESULT_FILE", result_file.into());
        set("ORCHESTRATOR_DATA_DIR", self.config.data_dir.clone().into());
        set(
            "ORCHESTRATOR_SCRIPTS_DIR",
            self.config.scripts_dir.clone().into(),
        );
        set(
            "ORCHESTRATOR_CHECKPOINT",
            Value::Object(job.checkpoint.clone()).to_string().into(),
        );
        if let Some(url) = &self.config.service_url {
            set("ORCHESTRATOR_URL", url.into());
        }
        if let Some(token) = &job.token {
            set("ORCHESTRATOR_TOKEN", token.into());
        }
        for (name, token) in &job.lock_tokens {
            set(name, token.to_string().into());
        }
        env
    }

    /// `program` as an absolute path, found on the `PATH` the script gets,
    /// when it is a bare name (`bash`, `nu`, `python3`); as given otherwise,
    /// or when no directory has it (the spawn then reports it missing).
    ///
    /// Why: std spawns a program named by a path with `posix_spawn` (a
    /// vfork, which shares this process's memory until the exec), but a bare
    /// name under a replaced environment with `fork` + `execvp`. A fork
    /// copies the page tables of this whole process, so each spawn got
    /// dearer as the service's memory grew: a third of the service's CPU
    /// went to `copy_page_range` while one workflow of 10,000 steps ran.
    fn on_path(&self, program: &Path) -> std::path::PathBuf {
        if program.components().count() != 1 || program.is_absolute() {
            return program.to_path_buf();
        }
        let path = self
            .inherited_env
            .iter()
            .find(|(key, _)| key == "PATH")
            .map(|(_, value)| value.as_os_str());
        for dir in path.into_iter().flat_map(std::env::split_paths) {
            // A relative entry depends on the script's working directory:
            // leave the search to `execvp`, as before.
            if !dir.is_absolute() {
                break;
            }
            let candidate = dir.join(program);
            if crate::lookup::is_executable(&candidate) {
                return candidate;
            }
        }
        program.to_path_buf()
    }

    fn succeeded(&self, task_id: &str, output: Value) -> Outcome {
        // The scratch dir of a successful attempt has served its purpose;
        // a failed attempt keeps its own for inspection.
        let _ = std::fs::remove_dir_all(self.work_dir_of(task_id));
        Outcome::Succeeded { output }
    }

    /// SIGTERM to the whole group, SIGKILL after the grace period. A
    /// kept sandbox is not reused after it.
    async fn terminate(&self, process: &mut Process, pgid: Option<Pid>) {
        if let Process::Kept(kept, _) = process {
            kept.discard();
        }
        let Some(pgid) = pgid else {
            if let Process::Own(child) = process {
                let _ = child.kill().await;
            }
            return;
        };
        match (&self.config.sandbox, process.id()) {
            // `bwrap` dies of SIGTERM at once, and its sandbox with it
            // (SIGKILL): the script would get no grace. So the SIGTERM
            // goes to the rest of the group; `bwrap` ends when the
            // script does, with its status.
            (Sandbox::Bubblewrap(_), Some(launcher)) => {
                signal_group_but(pgid, Pid::from_raw(launcher as i32), Signal::SIGTERM);
            }
            _ => {
                let _ = killpg(pgid, Signal::SIGTERM);
            }
        }
        if tokio::time::timeout(self.config.kill_grace, process.wait())
            .await
            .is_err()
        {
            let _ = killpg(pgid, Signal::SIGKILL);
            let _ = process.wait().await;
        }
    }
}

/// The process of one attempt: a child of the service (`bwrap`, or the
/// script itself), or an attempt a kept sandbox runs (with its streams
/// until they are taken).
enum Process {
    Own(Child),
    Kept(Box<KeptAttempt>, Option<Box<crate::prepared::Streams>>),
}

type Input = Box<dyn tokio::io::AsyncWrite + Unpin + Send>;
type Output = Box<dyn AsyncRead + Unpin + Send>;

impl Process {
    async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        match self {
            Process::Own(child) => child.wait().await,
            Process::Kept(kept, _) => kept.wait().await,
        }
    }

    /// The first process of the attempt's group.
    fn id(&self) -> Option<u32> {
        match self {
            Process::Own(child) => child.id(),
            Process::Kept(kept, _) => kept.launcher(),
        }
    }

    /// The service's ends of stdin, stdout and stderr.
    fn streams(&mut self) -> (Option<Input>, Option<Output>, Option<Output>) {
        match self {
            Process::Own(child) => (
                child.stdin.take().map(|s| Box::new(s) as Input),
                child.stdout.take().map(|s| Box::new(s) as Output),
                child.stderr.take().map(|s| Box::new(s) as Output),
            ),
            Process::Kept(_, streams) => match streams.take() {
                Some(s) => (
                    Some(Box::new(s.stdin)),
                    Some(Box::new(s.stdout)),
                    Some(Box::new(s.stderr)),
                ),
                None => (None, None, None),
            },
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
    /// stdout: the last line that parsed as a JSON object, and the line
    /// being read while it may still become one (`None` once it cannot:
    /// it does not start with `{`, or it grew past the result's limit).
    LastJsonObject {
        last: Option<Value>,
        line: Option<Vec<u8>>,
    },
    /// stderr: the last bytes, redacted, for the error message.
    Tail(Vec<u8>),
}

/// Sends `signal` to every process of the group `pgid` but `spared`.
/// The sandbox's own first process (its PID namespace's init) ignores a
/// signal it has no handler for, as the kernel has it for every init.
fn signal_group_but(pgid: Pid, spared: Pid, signal: Signal) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .map(Pid::from_raw)
        else {
            continue;
        };
        if pid != spared && nix::unistd::getpgid(Some(pid)) == Ok(pgid) {
            let _ = nix::sys::signal::kill(pid, signal);
        }
    }
}

impl LineKeeper {
    /// Takes the next piece of a line as the step wrote it (the result
    /// is redacted by the engine as a value); `ends` says whether the line
    /// ends with it.
    fn keep(&mut self, piece: &[u8], ends: bool) {
        match self {
            LineKeeper::LastJsonObject { last, line } => {
                if let Some(current) = line {
                    current.extend_from_slice(piece);
                    let start = current.trim_ascii_start();
                    if (!start.is_empty() && start[0] != b'{')
                        || current.len() > MAX_RESULT_LINE_BYTES
                    {
                        *line = None;
                    }
                }
                if ends {
                    if let Some(current) = line.as_ref()
                        && let Ok(value @ Value::Object(_)) =
                            serde_json::from_slice(current.trim_ascii())
                    {
                        *last = Some(value);
                    }
                    *line = Some(Vec::new());
                }
            }
            LineKeeper::Tail(_) => {}
        }
    }

    /// Takes the next bytes of the output once redacted: the tail is cut
    /// from these, so that its cut never halves a secret.
    fn keep_redacted(&mut self, bytes: &[u8]) {
        if let LineKeeper::Tail(tail) = self {
            tail.extend_from_slice(bytes);
            if tail.len() > STDERR_TAIL_BYTES {
                tail.drain(..tail.len() - STDERR_TAIL_BYTES);
            }
        }
    }
}

/// Cuts redacted output into log chunks: whole lines, and pieces of
/// [`MAX_LINE_BYTES`] of a longer line, the first of them followed by a
/// line saying so. It cuts what is already redacted, so a cut never
/// leaves two halves of a secret for no search to find.
#[derive(Default)]
struct LineCutter {
    pending: Vec<u8>,
    /// Whether the current line was split already (one notice per line).
    split: bool,
}

impl LineCutter {
    /// Takes the next redacted bytes; the chunks ready for the log. At the
    /// `end`, whatever is left goes too.
    fn push(&mut self, bytes: Vec<u8>, end: bool) -> Vec<Vec<u8>> {
        // A whole line read as one piece goes on as it is, uncopied.
        if self.pending.is_empty() {
            self.pending = bytes;
        } else {
            self.pending.extend_from_slice(&bytes);
        }
        let mut chunks = Vec::new();
        // Copies and moves of whole slices only: a script may print a
        // gigabyte, and this runs for every byte of it.
        loop {
            let window = &self.pending[..self.pending.len().min(MAX_LINE_BYTES)];
            if let Some(at) = memchr::memchr(b'\n', window) {
                chunks.push(self.take(at + 1));
                self.split = false;
            } else if self.pending.len() >= MAX_LINE_BYTES {
                let mut piece = self.take(MAX_LINE_BYTES);
                piece.push(b'\n');
                if !self.split {
                    piece.extend_from_slice(
                        format!("[orchestrator] the line above was split: lines longer than {MAX_LINE_BYTES} bytes are logged in pieces\n")
                            .as_bytes(),
                    );
                }
                self.split = true;
                chunks.push(piece);
            } else {
                break;
            }
        }
        if end && !self.pending.is_empty() {
            chunks.push(std::mem::take(&mut self.pending));
        }
        chunks
    }

    /// The first `n` pending bytes.
    fn take(&mut self, n: usize) -> Vec<u8> {
        if n == self.pending.len() {
            return std::mem::take(&mut self.pending);
        }
        let taken = self.pending[..n].to_vec();
        self.pending.drain(..n);
        taken
    }
}

/// How much of an attempt's output may still go to its log, shared by its
/// stdout and stderr readers.
struct LogBudget {
    limit: u64,
    left: std::sync::atomic::AtomicU64,
    /// Set by the reader that writes the line saying the log is full.
    announced: std::sync::atomic::AtomicBool,
}

impl LogBudget {
    fn new(limit: u64) -> LogBudget {
        LogBudget {
            limit,
            left: std::sync::atomic::AtomicU64::new(limit),
            announced: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether `bytes` more may be logged (taking them if so). Once a
    /// piece did not fit, nothing more does: the log ends at its notice.
    fn take(&self, bytes: u64) -> bool {
        use std::sync::atomic::Ordering;
        let taken = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(bytes)
            })
            .is_ok();
        if !taken {
            self.left.store(0, Ordering::Release);
        }
        taken
    }

    /// The line that ends a full log, the first time it is asked for.
    fn full_notice(&self) -> Option<Vec<u8>> {
        use std::sync::atomic::Ordering;
        (!self.announced.swap(true, Ordering::AcqRel)).then(|| {
            format!(
                "[orchestrator] this attempt's log reached its limit of {} bytes; the rest of its output is dropped\n",
                self.limit
            )
            .into_bytes()
        })
    }
}

/// Reads a pipe to its end, a line (or a piece of a long one) at a time,
/// into the log while the budget lasts. It keeps reading past the budget,
/// so the script never blocks on a full pipe, and memory stays bounded:
/// one piece of at most [`MAX_LINE_BYTES`] at a time (plus the result line
/// being read, at most [`MAX_RESULT_LINE_BYTES`]).
async fn read_lines(
    pipe: impl AsyncRead + Unpin,
    logs: LogSink,
    budget: std::sync::Arc<LogBudget>,
    mut keeper: LineKeeper,
    redactor: std::sync::Arc<Redactor>,
) -> LineKeeper {
    let mut reader = BufReader::with_capacity(MAX_LINE_BYTES, pipe);
    // Redact first, then cut: see `LineCutter`.
    let mut redacting = StreamRedactor::new(redactor);
    let mut cutter = LineCutter::default();
    loop {
        let mut piece = Vec::new();
        let read = (&mut reader)
            .take(MAX_LINE_BYTES as u64)
            .read_until(b'\n', &mut piece)
            .await;
        let end = matches!(read, Ok(0) | Err(_));
        let redacted = if end {
            redacting.finish()
        } else {
            // Cut by the piece size, not by a newline or the end of the pipe.
            let cut = piece.len() == MAX_LINE_BYTES && piece.last() != Some(&b'\n');
            keeper.keep(&piece, !cut);
            redacting.push_owned(piece)
        };
        keeper.keep_redacted(&redacted);
        for out in cutter.push(redacted, end) {
            // Nobody storing the log any more (`write` is false) is no
            // reason to stop: reading on gets the result and keeps the
            // pipe flowing.
            if budget.take(out.len() as u64) {
                let _ = logs.write(out).await;
            } else if let Some(notice) = budget.full_notice() {
                let _ = logs.write(notice).await;
            }
        }
        if end {
            break;
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

/// `script`, the first step kind: an attempt is a run of the script.
#[async_trait]
impl StepRunner for ScriptExecutor {
    fn name(&self) -> &'static str {
        "script"
    }

    fn check(&self, target: &str) -> Result<(), String> {
        self.resolve(target).map(|_| ()).map_err(|e| e.to_string())
    }

    async fn run(&self, attempt: Attempt<'_>) -> Outcome {
        let job = Job {
            script: attempt.target,
            input: attempt.input,
            task_id: attempt.task_id,
            workflow_id: attempt.workflow_id,
            attempt: attempt.attempt,
            check_mode: attempt.check_mode,
            // The limit as configured, so that a timeout reads "after 5s";
            // it runs from now, a moment after the deadline was set.
            timeout: attempt.timeout,
            checkpoint: attempt.checkpoint,
            token: attempt.token,
            redactor: attempt.redactor,
            holds_secrets: attempt.holds_secrets,
            more_steps: attempt.more_steps,
            party: attempt.party,
            lock_tokens: attempt.lock_tokens,
        };
        ScriptExecutor::run(self, job, attempt.log, attempt.cancel).await
    }

    fn stop_leftovers(&self, task_id: &str) -> usize {
        kill_leftovers(task_id)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::ffi::OsString;
    use std::os::unix::fs::PermissionsExt;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use std::time::Duration;

    use super::{LineCutter, MAX_LINE_BYTES};
    use crate::{ExecutorConfig, KnownSecret, Redactor, ScriptExecutor, StreamRedactor};

    /// A line longer than a log piece with a secret across the cut: the
    /// log shows no half of it, however the pipe delivered the line.
    #[test]
    fn a_long_line_is_cut_after_it_is_redacted() {
        let redactor = Arc::new(Redactor::new([KnownSecret {
            name: "pw".into(),
            value: "s3cret-VALUE".into(),
            origins: Vec::new(),
        }]));
        let line = format!(
            "{}s3cret-VALUE{}\n",
            "x".repeat(MAX_LINE_BYTES - 6),
            "y".repeat(10)
        );
        for size in [MAX_LINE_BYTES, 4096, 7] {
            let mut stream = StreamRedactor::new(redactor.clone());
            let mut cutter = LineCutter::default();
            let mut log = Vec::new();
            for piece in line.as_bytes().chunks(size) {
                log.extend(cutter.push(stream.push(piece), false).concat());
            }
            log.extend(cutter.push(stream.finish(), true).concat());
            let log = String::from_utf8(log).unwrap();
            assert!(log.contains("the line above was split"), "{size}");
            // The cut may fall inside the marker, never inside the secret.
            assert!(log.contains("<redac"), "{size}");
            assert!(!log.contains("s3cret") && !log.contains("VALUE"), "{size}");
        }
    }

    fn executor(dir: &Path, path_var: &str) -> ScriptExecutor {
        let mut executor = ScriptExecutor::new(ExecutorConfig {
            scripts_dir: dir.to_path_buf(),
            work_dir: dir.to_path_buf(),
            data_dir: dir.to_path_buf(),
            kill_grace: Duration::from_secs(1),
            interpreters: HashMap::new(),
            service_url: None,
            sandbox: crate::Sandbox::None,
        })
        .unwrap();
        executor.inherited_env = Arc::new(vec![(OsString::from("PATH"), OsString::from(path_var))]);
        executor
    }

    fn file(path: &Path, mode: u32) {
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A bare interpreter name becomes the first executable of that name on
    /// the script's PATH, so that the spawn is a posix_spawn, not a fork.
    #[test]
    fn a_bare_interpreter_is_found_on_the_scripts_path() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        file(&a.join("tool"), 0o644); // not executable: skipped
        file(&b.join("tool"), 0o755);
        let path_var = format!("{}:{}", a.display(), b.display());
        let exec = executor(dir.path(), &path_var);
        assert_eq!(exec.on_path(Path::new("tool")), b.join("tool"));
        // Not found: the name as given, and the spawn says it is missing.
        assert_eq!(exec.on_path(Path::new("absent")), PathBuf::from("absent"));
        // A path is never searched.
        assert_eq!(exec.on_path(Path::new("./tool")), PathBuf::from("./tool"));
        assert_eq!(exec.on_path(&b.join("tool")), b.join("tool"));
        // A relative entry first: its meaning depends on the working
        // directory, so the search is left to execvp.
        let exec = executor(dir.path(), &format!("rel:{}", b.display()));
        assert_eq!(exec.on_path(Path::new("tool")), PathBuf::from("tool"));
    }
}
