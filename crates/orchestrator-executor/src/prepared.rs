//! Sandboxes prepared ahead of need.
//!
//! Setting up a bubblewrap sandbox (namespaces, a dozen mounts,
//! `pivot_root`) takes about 5 ms of wall time on a small VM, 2.3 ms of it
//! CPU. Paid at each start, it was most of a task's start latency
//! (docs/benchmarks.md). So the executor keeps a few sandboxes ready: each
//! is a `bwrap` with every mount of an attempt made, running a small
//! helper binary (`orchestrator-sandbox-exec`, `helper`) that waits on its
//! stdin for the one command it is to become. An attempt takes a ready
//! sandbox, sends its command, and a replacement is prepared in the
//! background.
//!
//! A sandbox serves one attempt and ends with it, as one made at the
//! start does, unless it is kept for several (`kept`, and [`KeptAttempt`]
//! here): then it serves attempts in a row of workflows one token
//! submitted (of one workflow, or of any, as [`SandboxReuse`] says),
//! never one whose input holds a secret (that one gets a fresh sandbox,
//! which ends with it). The one
//! difference is the work dir. A sandbox is made before its task is known,
//! so it binds an empty dir of its own (`<work>/.prepared-…`); the attempt
//! that takes it renames that dir to the task's work dir, and inside, the
//! helper links `<work>/<task-id>` to it, so the script finds its work dir
//! where `ORCHESTRATOR_WORK_DIR` says. The link needs `<work>` to be a
//! private tmpfs of the sandbox (the service's data dir, hidden, holds
//! it); in any other layout, and for an attempt whose work dir exists
//! already (a retry finds the last attempt's files), the sandbox is made
//! at the start.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::sandbox::{Attempt, Bubblewrap, HostView};
use crate::wire::{KEPT_FLAG, READY_MARK};

/// How a prepared sandbox's own dir is named, in the work dir.
const SLOT_PREFIX: &str = ".prepared-";

/// Which attempts may follow one another in a kept sandbox
/// (`--script-sandbox-reuse`). Whatever its helper's cleaning between
/// two attempts misses, one attempt could leave for the next: this says
/// whose attempts may be that next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxReuse {
    /// Attempts of one workflow: what a step could leave behind reaches
    /// only later steps of its own submission.
    Workflow,
    /// Attempts of workflows of one party (`Attempt::party`: the token
    /// that submitted them), and of one workflow where it has none: what
    /// a step could leave behind reaches only work its submitter could
    /// have run and read anyway.
    #[default]
    Submitter,
    /// Attempts of any workflow.
    Any,
}

impl SandboxReuse {
    /// Whether attempts of other workflows than `occupant`'s may follow it
    /// in its sandbox.
    fn beyond_its_workflow(self, occupant: Occupant) -> bool {
        match self {
            SandboxReuse::Workflow => false,
            SandboxReuse::Submitter => occupant.party.is_some(),
            SandboxReuse::Any => true,
        }
    }

    /// Whether `occupant` may follow, in one sandbox, an attempt of
    /// `workflow` (of `party`): never with a secret.
    fn may_follow(self, workflow: &str, party: Option<&str>, occupant: Occupant) -> bool {
        !occupant.holds_secrets
            && (workflow == occupant.workflow_id
                || (self.beyond_its_workflow(occupant)
                    && (self == SandboxReuse::Any || party == occupant.party)))
    }
}

/// An attempt, as far as taking a kept sandbox goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Occupant<'a> {
    pub workflow_id: &'a str,
    /// Who submitted its workflow, when known: attempts of one party's
    /// workflows may share a sandbox under [`SandboxReuse::Submitter`].
    pub party: Option<&'a str>,
    /// Its input holds a secret's value: it shares a sandbox with no
    /// attempt, before or after.
    pub holds_secrets: bool,
    /// Later attempts of its workflow may come: worth keeping the sandbox
    /// for, when only they may use it.
    pub more_steps: bool,
}

/// Sandboxes ready for the next attempts.
#[derive(Debug)]
pub(crate) struct Pool {
    bwrap: Bubblewrap,
    /// The helper ([`crate::HELPER_NAME`]), in every sandbox.
    helper: PathBuf,
    scripts_dir: PathBuf,
    state_dir: PathBuf,
    work_dir: PathBuf,
    /// What `bwrap` and the helper run with; the script gets its own.
    env: Arc<Vec<(OsString, OsString)>>,
    /// How many to keep, ready or in use: one per worker.
    size: usize,
    /// How many attempts one sandbox serves, one after another: 1, or
    /// more for sandboxes kept (`kept`).
    attempts: u32,
    /// Which attempts a kept sandbox serves in a row.
    reuse: SandboxReuse,
    /// The ready ones, and how many are being made. Why a std mutex:
    /// held only to count, push or pop, never across an await.
    ready: Mutex<Queue>,
    /// For unique slot names.
    made: AtomicU64,
    /// Set once a ready sandbox was found dead (the helper cannot start
    /// in it, say): from then on every attempt makes its own.
    broken: AtomicBool,
}

#[derive(Debug, Default)]
struct Queue {
    /// Fresh ones and kept ones back from an attempt, oldest first. Up to
    /// `size` of each: a kept one waits for a later attempt it may serve,
    /// while fresh ones serve the others.
    ready: Vec<Ready>,
    /// Being made: counted so that fills running at once make no more
    /// than are missing.
    making: usize,
    /// Kept sandboxes serving an attempt, which come back after it.
    in_use: usize,
}

impl Queue {
    fn fresh(&self) -> usize {
        self.ready.iter().filter(|r| r.served == 0).count()
    }
}

/// A sandbox waiting for its command, and its dir.
#[derive(Debug)]
struct Ready {
    child: Option<Child>,
    slot: Option<PathBuf>,
    /// A kept sandbox's socket to its helper (`kept`).
    socket: Option<tokio::net::UnixStream>,
    /// Attempts it has served.
    served: u32,
    /// The workflow of the attempts a kept sandbox served.
    workflow: Option<String>,
    /// Their party ([`Occupant::party`]), when known.
    party: Option<String>,
    /// The host it was made from: once the host differs, it is stale.
    host: HostView,
}

/// A sandbox an attempt took.
#[derive(Debug)]
pub(crate) enum Taken {
    /// Serves this attempt and ends with it: the helper becomes the
    /// script once it reads its request on stdin.
    Once(Child),
    /// Serves this attempt, then may serve the next.
    Kept(Box<KeptAttempt>),
}

impl Drop for Ready {
    fn drop(&mut self) {
        // The whole group: a `bwrap` killed while it sets up has not yet
        // told its child to die with it.
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
        if let Some(slot) = &self.slot {
            let _ = std::fs::remove_file(slot.join(READY_MARK));
            let _ = std::fs::remove_dir(slot);
        }
    }
}

impl Pool {
    /// A pool for attempts of this executor, or `None` when its layout
    /// does not allow one (see the module's comment).
    pub(crate) fn new(
        bwrap: &Bubblewrap,
        config: &crate::ExecutorConfig,
        env: Arc<Vec<(OsString, OsString)>>,
        size: usize,
        attempts: u32,
        reuse: SandboxReuse,
    ) -> Option<Pool> {
        let attempt = Attempt {
            scripts_dir: &config.scripts_dir,
            state_dir: &config.data_dir,
            work_dir: &config.work_dir.join(SLOT_PREFIX),
        };
        let helper = bwrap.helper()?.to_path_buf();
        if size == 0 || !bwrap.is_private(&config.work_dir, attempt) {
            return None;
        }
        // Slots a crash left behind: empty dirs of ours, but for the work
        // dirs of attempts a kept sandbox was running, which go where their
        // tasks' retries find them.
        if let Ok(entries) = std::fs::read_dir(&config.work_dir) {
            for entry in entries.flatten() {
                if entry
                    .file_name()
                    .as_bytes()
                    .starts_with(SLOT_PREFIX.as_bytes())
                {
                    for task in std::fs::read_dir(entry.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                    {
                        if task.file_type().is_ok_and(|kind| kind.is_dir()) {
                            let _ = move_work_dir(
                                &task.path(),
                                &config.work_dir.join(task.file_name()),
                            );
                        }
                    }
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Some(Pool {
            bwrap: bwrap.clone(),
            helper,
            scripts_dir: config.scripts_dir.clone(),
            state_dir: config.data_dir.clone(),
            work_dir: config.work_dir.clone(),
            env,
            size,
            attempts: attempts.max(1),
            reuse,
            ready: Mutex::new(Queue::default()),
            made: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        })
    }

    /// A ready sandbox for `occupant`, whose work dir is `work_dir`, or
    /// `None` (none ready that may serve it, or `work_dir` exists): the
    /// caller makes its own. Refills either way.
    pub(crate) fn take(self: &Arc<Pool>, work_dir: &Path, occupant: Occupant) -> Option<Taken> {
        if self.broken.load(Ordering::Relaxed) || work_dir.exists() {
            return None;
        }
        let taken = self.pop_ready(occupant);
        let pool = self.clone();
        tokio::spawn(async move { pool.fill() });
        let mut ready = taken?;
        if ready.socket.is_some() {
            return self.take_kept(ready, work_dir, occupant);
        }
        let slot = ready.slot.as_deref()?;
        // Never over a work dir an earlier attempt left: it keeps its files.
        if let Err(e) = move_work_dir(slot, work_dir) {
            if e == nix::errno::Errno::EINVAL {
                tracing::warn!(
                    dir = %self.work_dir.display(),
                    "the work dir's file system cannot rename without replacing; every \
                     attempt now makes its own sandbox at its start"
                );
                self.broken.store(true, Ordering::Relaxed);
            }
            return None;
        }
        ready.slot = None;
        ready.child.take().map(Taken::Once)
    }

    /// A kept sandbox for one more attempt, its work dir made in the
    /// sandbox's own dir; counted in use until it comes back.
    fn take_kept(
        self: &Arc<Pool>,
        mut ready: Ready,
        work_dir: &Path,
        occupant: Occupant,
    ) -> Option<Taken> {
        let inside = inside(ready.slot.as_deref()?, work_dir);
        if let Err(e) = std::fs::create_dir(&inside) {
            tracing::warn!(dir = %inside.display(), error = %e, "cannot make a work dir in a kept sandbox");
            return None;
        }
        ready.served += 1;
        if ready.workflow.as_deref() != Some(occupant.workflow_id) {
            ready.workflow = Some(occupant.workflow_id.to_owned());
        }
        if ready.party.as_deref() != occupant.party {
            ready.party = occupant.party.map(str::to_owned);
        }
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).in_use += 1;
        Some(Taken::Kept(Box::new(KeptAttempt {
            pool: self.clone(),
            sandbox: Some(ready),
            inside,
            work_dir: work_dir.to_path_buf(),
            clean: false,
            // A sandbox no later attempt may use ends with this one.
            alone: occupant.holds_secrets
                || (!occupant.more_steps && !self.reuse.beyond_its_workflow(occupant)),
        })))
    }

    /// Whether `ready` may serve `occupant`: a fresh sandbox any attempt,
    /// a kept one only a later attempt its reuse allows.
    fn may_serve(&self, ready: &Ready, occupant: Occupant) -> bool {
        match &ready.workflow {
            None => true,
            Some(workflow) => self
                .reuse
                .may_follow(workflow, ready.party.as_deref(), occupant),
        }
    }

    /// A kept sandbox back from an attempt: ready for the next, unless it
    /// served its last, or its attempt did not end cleanly (a timeout, a
    /// cancel, a helper that could not empty the sandbox or is gone) or
    /// held a secret, when it ends and another is made. The oldest kept
    /// one waiting ends when more than `size` wait.
    fn give_back(self: &Arc<Pool>, sandbox: Ready, clean: bool) {
        let mut queue = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        queue.in_use -= 1;
        let mut ended = None;
        if clean && sandbox.served < self.attempts && !self.broken.load(Ordering::Relaxed) {
            queue.ready.push(sandbox);
            if queue.ready.len() - queue.fresh() > self.size
                && let Some(oldest) = queue.ready.iter().position(|r| r.served > 0)
            {
                ended = Some(queue.ready.remove(oldest));
            }
        } else {
            ended = Some(sandbox);
        }
        drop(queue);
        // Killed outside the lock.
        drop(ended);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = self.clone();
            runtime.spawn(async move { pool.fill() });
        }
    }

    /// A sandbox whose helper runs (so every mount is made) and that may
    /// serve `occupant`, its readiness mark taken away: the oldest kept
    /// one it may follow, else the oldest fresh.
    fn pop_ready(&self, occupant: Occupant) -> Option<Ready> {
        // Looked at before the lock: a few `stat`s.
        let host = self.bwrap.host_view(Attempt {
            scripts_dir: &self.scripts_dir,
            state_dir: &self.state_dir,
            work_dir: &self.work_dir,
        });
        // Declared before the lock's guard, so dropped (killed) after it.
        let mut stale = Vec::new();
        let mut guard = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        let queue = &mut guard.ready;
        let mut i = 0;
        let mut fits = Vec::new();
        while i < queue.len() {
            if queue[i].host != host {
                // A path its view hides or binds appeared or went since it
                // was made (a control socket, a `--script-writable` dir):
                // it ends, and the refill makes one of the host as it is.
                tracing::debug!("the host changed under a prepared script sandbox; it ends");
                stale.push(queue.remove(i));
                continue;
            }
            let ready = &mut queue[i];
            let alive = ready
                .child
                .as_mut()
                .is_some_and(|child| matches!(child.try_wait(), Ok(None)));
            if !alive && ready.served > 0 {
                // A kept sandbox whose helper died after it came back.
                queue.remove(i);
                continue;
            }
            if !alive {
                tracing::warn!(
                    helper = %self.helper.display(),
                    "a prepared script sandbox ended before its use; every attempt now \
                     makes its own sandbox at its start"
                );
                self.broken.store(true, Ordering::Relaxed);
                queue.remove(i);
                continue;
            }
            if self.may_serve(ready, occupant) {
                fits.push(i);
            }
            i += 1;
        }
        // Kept ones first: a fresh one serves any attempt.
        fits.sort_by_key(|&i| queue[i].served == 0);
        let taken = fits.into_iter().find(|&i| {
            queue[i]
                .slot
                .as_deref()
                .is_some_and(|slot| std::fs::remove_file(slot.join(READY_MARK)).is_ok())
        })?;
        Some(queue.remove(taken))
    }

    /// Prepares sandboxes until `size` are ready or being made.
    pub(crate) fn fill(&self) {
        loop {
            {
                let mut queue = self.ready.lock().unwrap_or_else(|e| e.into_inner());
                if self.broken.load(Ordering::Relaxed)
                    || queue.fresh() + queue.making + queue.in_use >= self.size
                {
                    return;
                }
                queue.making += 1;
            }
            let made = self.prepare();
            let mut queue = self.ready.lock().unwrap_or_else(|e| e.into_inner());
            queue.making -= 1;
            match made {
                Ok(ready) => queue.ready.push(ready),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot prepare a script sandbox");
                    self.broken.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    fn prepare(&self) -> std::io::Result<Ready> {
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        let slot = self
            .work_dir
            .join(format!("{SLOT_PREFIX}{}-{n}", std::process::id()));
        std::fs::create_dir_all(&slot)?;
        let attempt = Attempt {
            scripts_dir: &self.scripts_dir,
            state_dir: &self.state_dir,
            work_dir: &slot,
        };
        let (program, mut args, host) = self.bwrap.command_line_seen(attempt);
        let end = args.pop();
        debug_assert_eq!(end.as_deref(), Some(OsStr::new("--")));
        if self.attempts > 1 {
            // A kept sandbox's helper is its PID namespace's init: no
            // `bwrap` init beside it whose descriptors (the helper's
            // socket) a script could take with `pidfd_getfd`, and no
            // signal of a script reaches it.
            args.push("--as-pid-1".into());
        }
        args.push("--".into());
        let mut command = Command::new(program);
        command.args(args).arg(&self.helper);
        if self.attempts > 1 {
            command.arg(KEPT_FLAG);
        }
        command.arg(&slot);
        if self.attempts > 1 {
            command.args(self.bwrap.private_dirs(attempt));
        }
        command
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        // Dropped from here on, the slot goes with it.
        let mut ready = Ready {
            child: None,
            slot: Some(slot),
            socket: None,
            served: 0,
            workflow: None,
            party: None,
            host,
        };
        crate::sandbox::as_attempt(&mut command);
        if self.attempts > 1 {
            // Each attempt brings its own streams over the socket, and the
            // helper says what goes wrong on the attempt's stderr. Nothing
            // of the service's own (its log) is passed in: a script could
            // take it from a process of the sandbox.
            let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
            ours.set_nonblocking(true)?;
            ready.socket = Some(tokio::net::UnixStream::from_std(ours)?);
            command
                .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                    theirs,
                )))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
        }
        ready.child = Some(command.spawn()?);
        Ok(ready)
    }
}

/// One attempt in a kept sandbox, from the service's side. Dropped, it
/// moves the attempt's work dir to the task's path and gives the sandbox
/// back to the pool.
#[derive(Debug)]
pub(crate) struct KeptAttempt {
    pool: Arc<Pool>,
    sandbox: Option<Ready>,
    /// The attempt's work dir as the host sees it while the attempt runs.
    inside: PathBuf,
    /// The task's work dir, where the attempt's files end.
    work_dir: PathBuf,
    /// The helper reported the attempt's end, and the sandbox as clean.
    clean: bool,
    /// The sandbox ends with the attempt: it held a secret, or no later
    /// attempt may use the sandbox.
    alone: bool,
}

/// The service's ends of an attempt's streams.
pub(crate) struct Streams {
    pub stdin: tokio::net::unix::pipe::Sender,
    pub stdout: tokio::net::unix::pipe::Receiver,
    pub stderr: tokio::net::unix::pipe::Receiver,
}

impl KeptAttempt {
    /// Hands the attempt to the helper: its streams and its request.
    pub(crate) async fn start(&mut self, request: &[u8]) -> std::io::Result<Streams> {
        use std::os::fd::AsFd;
        let (stdin_read, stdin_write) = std::io::pipe()?;
        let (stdout_read, stdout_write) = std::io::pipe()?;
        let (stderr_read, stderr_write) = std::io::pipe()?;
        let last = self.alone
            || self
                .sandbox
                .as_ref()
                .is_some_and(|sandbox| sandbox.served >= self.pool.attempts);
        let socket = self.socket()?;
        crate::wire::send(
            socket,
            [
                stdin_read.as_fd(),
                stdout_write.as_fd(),
                stderr_write.as_fd(),
            ],
            request,
            last,
        )
        .await?;
        // The helper holds its copies now: ours of its ends close here, so
        // that the service sees the end of the script's output.
        drop((stdin_read, stdout_write, stderr_write));
        use std::os::fd::OwnedFd;
        Ok(Streams {
            stdin: tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(stdin_write))?,
            stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stdout_read))?,
            stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(OwnedFd::from(stderr_read))?,
        })
    }

    fn socket(&mut self) -> std::io::Result<&mut tokio::net::UnixStream> {
        self.sandbox
            .as_mut()
            .and_then(|sandbox| sandbox.socket.as_mut())
            .ok_or_else(|| std::io::Error::other("a kept sandbox without its socket"))
    }

    /// The attempt's wait status, once the helper has cleaned up after it.
    /// When the helper is gone instead (it crashed), `bwrap`'s own status,
    /// and the sandbox is not reused.
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(report) = crate::wire::report(self.socket()?).await {
            self.clean = report.reusable;
            return Ok(report.status);
        }
        match self
            .sandbox
            .as_mut()
            .and_then(|sandbox| sandbox.child.as_mut())
        {
            Some(child) => child.wait().await,
            None => Err(std::io::Error::other("a kept sandbox without its process")),
        }
    }

    /// The sandbox's `bwrap`: the process group of the attempt.
    pub(crate) fn launcher(&self) -> Option<u32> {
        self.sandbox.as_ref()?.child.as_ref()?.id()
    }

    /// Ends the attempt here: the sandbox is not reused.
    pub(crate) fn discard(&mut self) {
        self.clean = false;
    }
}

impl Drop for KeptAttempt {
    fn drop(&mut self) {
        if let Err(e) = move_work_dir(&self.inside, &self.work_dir) {
            tracing::warn!(
                from = %self.inside.display(),
                to = %self.work_dir.display(),
                error = %e,
                "cannot move an attempt's work dir out of its kept sandbox"
            );
        }
        if let Some(sandbox) = self.sandbox.take() {
            self.pool.give_back(sandbox, self.clean && !self.alone);
        }
    }
}

/// Where an attempt in a kept sandbox keeps its work dir while it runs:
/// in the sandbox's own dir, named as the task's.
fn inside(slot: &Path, work_dir: &Path) -> PathBuf {
    slot.join(work_dir.file_name().unwrap_or_default())
}

/// Renames `from` to `to`, never over an existing `to`.
fn move_work_dir(from: &Path, to: &Path) -> nix::Result<()> {
    renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occupant<'a>(workflow_id: &'a str, party: Option<&'a str>) -> Occupant<'a> {
        Occupant {
            workflow_id,
            party,
            holds_secrets: false,
            more_steps: true,
        }
    }

    #[test]
    fn which_attempts_may_follow_one_another_in_a_kept_sandbox() {
        use SandboxReuse::{Any, Submitter, Workflow};
        let alice = Some("alice");
        // Its own workflow's next step, whoever submitted it.
        for reuse in [Workflow, Submitter, Any] {
            assert!(reuse.may_follow("w1", alice, occupant("w1", alice)));
            assert!(reuse.may_follow("w1", None, occupant("w1", None)));
        }
        // Another workflow of the same token: by default.
        assert!(!Workflow.may_follow("w1", alice, occupant("w2", alice)));
        assert!(Submitter.may_follow("w1", alice, occupant("w2", alice)));
        assert!(Any.may_follow("w1", alice, occupant("w2", alice)));
        // Another token's workflow: only with `any`.
        assert!(!Submitter.may_follow("w1", alice, occupant("w2", Some("bob"))));
        assert!(Any.may_follow("w1", alice, occupant("w2", Some("bob"))));
        // A workflow of no known token (none on the service) shares with no
        // other workflow, nor one with it, even another of no token.
        assert!(!Submitter.may_follow("w1", None, occupant("w2", None)));
        assert!(!Submitter.may_follow("w1", alice, occupant("w2", None)));
        assert!(!Submitter.may_follow("w1", None, occupant("w2", alice)));
        // A secret's attempt follows nothing, not even its own workflow.
        for reuse in [Workflow, Submitter, Any] {
            let secret = Occupant {
                holds_secrets: true,
                ..occupant("w1", alice)
            };
            assert!(!reuse.may_follow("w1", alice, secret));
        }
    }

    #[test]
    fn a_one_step_workflow_s_sandbox_waits_only_where_another_workflow_may_use_it() {
        use SandboxReuse::{Any, Submitter, Workflow};
        assert!(!Workflow.beyond_its_workflow(occupant("w1", Some("alice"))));
        assert!(Submitter.beyond_its_workflow(occupant("w1", Some("alice"))));
        assert!(!Submitter.beyond_its_workflow(occupant("w1", None)));
        assert!(Any.beyond_its_workflow(occupant("w1", None)));
    }
}
