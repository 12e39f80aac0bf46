//! The step-kind seam: one attempt of one step, whatever kind of step it
//! is. The engine hands the [`StepRunner`] of the step's kind an [`Attempt`] (the resolved input,
//! the checkpoint and a way to save it, the stop tokens, the deadline and
//! a log sink) and gets back an [`Outcome`]; it never learns what ran.
//! `script` is the first kind ([`ScriptExecutor`]); `http` lives in its own
//! crate (`orchestrator-http`).

use std::time::Duration;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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

/// Where an attempt's output goes, a chunk (usually a line) at a time. The
/// engine stores it as the task's log, redacted, in order. The channel is
/// bounded: a step that writes faster than the log is stored waits, so
/// output never piles up in memory (a script is held at its pipe).
#[derive(Debug, Clone)]
pub struct LogSink(mpsc::Sender<Vec<u8>>);

impl LogSink {
    /// A sink holding at most `chunks` chunks not yet stored, and the
    /// receiving end for whoever stores them.
    pub fn channel(chunks: usize) -> (LogSink, mpsc::Receiver<Vec<u8>>) {
        let (sender, receiver) = mpsc::channel(chunks.max(1));
        (LogSink(sender), receiver)
    }

    /// Writes a chunk, waiting while the log is behind; `false` once
    /// nobody stores the log any more.
    pub async fn write(&self, chunk: Vec<u8>) -> bool {
        self.0.send(chunk).await.is_ok()
    }
}

/// Saves a running task's checkpoint for the attempt that holds it. A
/// kind that starts work elsewhere saves what identifies that work here
/// before it depends on it, so that the next attempt resumes it instead
/// of starting it again.
#[async_trait]
pub trait CheckpointSink: Send + Sync {
    /// Merges `entries` into the checkpoint; durable when it returns `Ok`.
    /// An error (storage down, or the task no longer held by this
    /// attempt) says why nothing was saved.
    async fn save(&self, entries: Map<String, Value>) -> Result<(), String>;
}

impl std::fmt::Debug for dyn CheckpointSink + '_ {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CheckpointSink")
    }
}

/// Why `check_input` refused a step: where in the step's input (`.launch.url`,
/// relative to the template field the input comes from) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputRefusal {
    pub at: String,
    pub message: String,
}

/// One attempt of one step, as the engine hands it over.
#[derive(Debug)]
pub struct Attempt<'a> {
    pub task_id: String,
    pub workflow_id: String,
    /// 1-based.
    pub attempt: u32,
    /// What the kind runs: for `script`, the script path under the scripts
    /// dir.
    pub target: &'a str,
    /// The input with every reference resolved, secrets included: it must
    /// reach the step and nothing else (never a log, never an error).
    pub input: &'a Value,
    /// `input` holds a secret's value: what runs it shares nothing with
    /// another attempt, before or after (a kept script sandbox serves it
    /// alone).
    pub holds_secrets: bool,
    /// Other steps of its workflow may run after this attempt (`false`:
    /// the workflow is known to have this step alone). A hint: what a
    /// kind keeps for the workflow's next attempt it need not keep.
    pub more_steps: bool,
    /// Who submitted its workflow, as far as sharing goes: what a kind
    /// keeps from one attempt (a script sandbox) may serve attempts of
    /// other workflows of the same party. The token's name, or one party
    /// for every caller of a service without auth; `None` when unknown
    /// (no token on the service when it was submitted): its own
    /// workflow's attempts only.
    pub party: Option<std::sync::Arc<str>>,
    /// What earlier attempts saved; empty on a first attempt.
    pub checkpoint: &'a Map<String, Value>,
    /// Saves to the checkpoint, for this attempt only.
    pub checkpoints: &'a dyn CheckpointSink,
    /// Dry run: the step is told to change nothing.
    pub check_mode: bool,
    /// Fires when the attempt must stop: the task is cancelled, the
    /// service shuts down, or another node took the task over.
    pub cancel: CancellationToken,
    /// Fires (with `cancel`) only when the task itself is cancelled. Work
    /// a step started elsewhere is stopped then; when only this attempt
    /// stops, it is left running for the next attempt to resume.
    pub task_cancel: CancellationToken,
    /// The attempt's time limit, as configured (what messages state).
    pub timeout: Duration,
    /// When the attempt times out: `timeout` after it was handed over.
    pub deadline: Instant,
    pub log: LogSink,
    /// Takes every secret value out of what the step writes: a kind that
    /// cuts text (a long line, an error's tail, a body excerpt) redacts
    /// before it cuts. Also says where each secret may be sent.
    pub redactor: std::sync::Arc<crate::Redactor>,
    /// The task's own API token, which may save its checkpoint and nothing
    /// else.
    pub token: Option<String>,
    /// The fencing tokens of the named locks the attempt holds, each with
    /// the environment variable a script reads it from
    /// (`ORCHESTRATOR_LOCK_<KEY>`).
    pub lock_tokens: Vec<(String, u64)>,
}

/// Runs the steps of one kind (`script`, ...). Implementations must never panic on anything the
/// outside world does: every failure is an [`Outcome`].
#[async_trait]
pub trait StepRunner: Send + Sync {
    /// The kind's name, as templates write it (`kind: script`): the
    /// engine registers the runner under it. A lowercase letter, then
    /// lowercase letters, digits, `_` or `-`, at most 32 bytes.
    fn name(&self) -> &'static str;

    /// The template field a step of this kind takes its task's input
    /// from, and that errors about the input name: `input`, or `http` for
    /// a kind that reads the template's `http` block.
    fn input_field(&self) -> &'static str {
        "input"
    }

    /// Whether `target` can be run at all, checked when a template is
    /// loaded or submitted: the reason if not.
    fn check(&self, target: &str) -> Result<(), String>;

    /// Whether a step's input can run, as far as it is known: when a
    /// template is loaded (references unresolved) and for each task at
    /// submission (workflow inputs resolved; step outputs and secrets are
    /// still `${...}`). Most kinds have nothing to check here.
    fn check_input(&self, input: &Value) -> Result<(), InputRefusal> {
        let _ = input;
        Ok(())
    }

    /// Runs one attempt to its end: success, failure, timeout at the
    /// deadline, or cancel.
    async fn run(&self, attempt: Attempt<'_>) -> Outcome;

    /// Stops whatever a previous life of this service left running for the
    /// task (its runner is gone); how many things were stopped. Left-overs
    /// are stopped, never adopted: a new attempt must not run beside an old
    /// one.
    fn stop_leftovers(&self, task_id: &str) -> usize;
}
