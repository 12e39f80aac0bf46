//! Runs provisioning scripts as child processes under the script contract
//! (`docs/scripts.md`): JSON input on stdin, `ORCHESTRATOR_*` environment
//! variables, output captured as the log, the result as the last JSON-object
//! line of stdout (or a result file), and the exit code deciding success.
//!
//! The [`StepRunner`] trait is the seam between the engine and what a step
//! runs; a script is the first kind.
//!
//! No shell is ever involved: the interpreter (or the script itself) is
//! executed directly with the script path as its only argument, and user
//! input reaches the script through stdin alone.

mod error;
mod helper;
mod kept;
mod lookup;
mod prepared;
mod redact;
mod resolve;
mod run;
mod sandbox;
mod step;
mod syscalls;
mod wire;

pub use error::ScriptError;
pub use helper::serve as serve_prepared_sandbox;
pub use prepared::SandboxReuse;
pub use redact::{KnownSecret, MIN_REDACTED_LEN, REDACTED, Redactor, StreamRedactor, is_sensitive};
pub use resolve::{Launcher, ResolvedScript};
pub use run::{Job, kill_leftovers};
pub use sandbox::{BUBBLEWRAP_PACKAGE, Bubblewrap, Sandbox, capability_set};
pub use step::{Attempt, CheckpointSink, InputRefusal, LogSink, Outcome, StepRunner};
pub use wire::HELPER_NAME;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// Where scripts live and how they are run.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// Root of all runnable scripts; nothing outside it ever runs.
    pub scripts_dir: PathBuf,
    /// Parent of the per-task scratch dirs.
    pub work_dir: PathBuf,
    /// Where scripts keep their own state, passed to them as
    /// `ORCHESTRATOR_DATA_DIR`; writable in the sandbox. Never the
    /// service's own data dir when the sandbox is on: that one is hidden.
    pub data_dir: PathBuf,
    /// How long a script may take to exit after SIGTERM before SIGKILL.
    pub kill_grace: Duration,
    /// Interpreter per file extension, overriding the built-in `nu`,
    /// `bash` and `python3` (for example a `nu` outside `PATH`).
    pub interpreters: HashMap<String, PathBuf>,
    /// Base URL of the service's API, passed to scripts as `ORCHESTRATOR_URL`
    /// so that they can save checkpoints (`orchestrator checkpoint set`).
    pub service_url: Option<String>,
    /// How scripts are kept from the service (see `sandbox`).
    pub sandbox: Sandbox,
}

/// Runs scripts. Cheap to share: it holds configuration only.
#[derive(Debug, Clone)]
pub struct ScriptExecutor {
    config: ExecutorConfig,
    /// The environment scripts inherit, read once: the service's own,
    /// less its `ORCHESTRATOR_*` settings (not the script's business, and
    /// possibly credentials). Walking the process environment on every
    /// spawn was a measurable share of the per-task cost.
    inherited_env: std::sync::Arc<Vec<(std::ffi::OsString, std::ffi::OsString)>>,
    /// The most of one attempt's output that goes to its log; the rest is
    /// read and dropped, after one line saying so.
    max_log_bytes: u64,
    /// Sandboxes made ahead of the attempts that take them, when
    /// [`ScriptExecutor::prepare_sandboxes`] was called and the layout
    /// allows (see `prepared`); shared by the clones.
    prepared: Option<std::sync::Arc<prepared::Pool>>,
}

/// The default of [`ScriptExecutor::with_max_log_bytes`]: 64 MiB.
pub const DEFAULT_MAX_LOG_BYTES: u64 = 64 * 1024 * 1024;

impl ScriptExecutor {
    /// Fails if the scripts dir does not exist.
    pub fn new(mut config: ExecutorConfig) -> Result<ScriptExecutor, ScriptError> {
        config.scripts_dir =
            config
                .scripts_dir
                .canonicalize()
                .map_err(|error| ScriptError::ScriptsDir {
                    dir: config.scripts_dir.clone(),
                    error,
                })?;
        let inherited_env = std::env::vars_os()
            .filter(|(key, _)| !key.to_string_lossy().starts_with("ORCHESTRATOR_"))
            .collect();
        Ok(ScriptExecutor {
            config,
            inherited_env: std::sync::Arc::new(inherited_env),
            max_log_bytes: DEFAULT_MAX_LOG_BYTES,
            prepared: None,
        })
    }

    /// Caps the log of each attempt at `bytes` (at least 1 KiB).
    pub fn with_max_log_bytes(mut self, bytes: u64) -> ScriptExecutor {
        self.max_log_bytes = bytes.max(1024);
        self
    }

    /// Starts every script through `helper` (see `syscalls`), and keeps
    /// `count` sandboxes ready for the next attempts (one per
    /// worker), each running `helper` ([`HELPER_NAME`], whose `main` is
    /// [`serve_prepared_sandbox`]) until an attempt gives it its command;
    /// each serves up to `attempts` attempts one after another, of whom
    /// `reuse` says (1: each attempt its own sandbox; more: see `kept`).
    /// Does nothing without the
    /// bubblewrap sandbox; prepares none when the work dir is not hidden
    /// from scripts.
    pub fn prepare_sandboxes(
        mut self,
        helper: PathBuf,
        count: usize,
        attempts: u32,
        reuse: SandboxReuse,
    ) -> ScriptExecutor {
        if let Sandbox::Bubblewrap(bwrap) = &mut self.config.sandbox {
            // Every script starts through the helper, prepared or not.
            bwrap.set_helper(helper);
        }
        if let Sandbox::Bubblewrap(bwrap) = &self.config.sandbox {
            self.prepared = prepared::Pool::new(
                bwrap,
                &self.config,
                self.inherited_env.clone(),
                count,
                attempts,
                reuse,
            )
            .map(std::sync::Arc::new);
        }
        // Ready for the first attempts too, when there is a runtime to
        // prepare them on (else the first attempt starts the filling).
        if let (Some(pool), Ok(runtime)) = (&self.prepared, tokio::runtime::Handle::try_current()) {
            let pool = pool.clone();
            runtime.spawn(async move { pool.fill() });
        }
        self
    }

    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }
}
