//! Sandboxes prepared ahead of need.
//!
//! Setting up a bubblewrap sandbox (namespaces, a dozen mounts,
//! `pivot_root`) takes about 5 ms of wall time on a small VM, but little
//! CPU: mostly the kernel waits. Paid at each start, it was most of a
//! task's start latency and a third of its cost (docs/benchmarks.md). So
//! the executor keeps a few sandboxes ready: each is a `bwrap` with every
//! mount of an attempt made, running a small helper binary
//! (`orchestrator-sandbox-exec`, [`serve`]) that waits on its stdin for
//! the one command it is to become. An attempt takes a ready sandbox, sends its command,
//! and a replacement is prepared in the background.
//!
//! Nothing is shared between attempts: a sandbox serves one attempt and
//! ends with it, as one made at the start does. The one difference is
//! the work dir. A sandbox is made before its task is known, so it binds
//! an empty dir of its own (`<work>/.prepared-…`); the attempt that takes
//! it renames that dir to the task's work dir, and inside, the helper
//! links `<work>/<task-id>` to it, so the script finds its work dir where
//! `ORCHESTRATOR_WORK_DIR` says. The link needs `<work>` to be a private
//! tmpfs of the sandbox (the service's data dir, hidden, holds it); in any
//! other layout, and for an attempt whose work dir exists already (a retry
//! finds the last attempt's files), the sandbox is made at the start.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::sandbox::{Attempt, Bubblewrap};

/// The helper's program, a small binary of its own beside `orchestrator`
/// (or in `/usr/libexec/orchestrator/`): started in each prepared
/// sandbox, it must cost little more than the script's own exec.
pub const HELPER_NAME: &str = "orchestrator-sandbox-exec";

/// How a prepared sandbox's own dir is named, in the work dir.
const SLOT_PREFIX: &str = ".prepared-";

/// What the helper leaves in its sandbox's dir once it runs: every mount
/// is made. Taken away before the script starts.
pub(crate) const READY_MARK: &str = ".ready";

/// The largest request the helper reads: a command line and environment.
const MAX_REQUEST_BYTES: usize = 4 << 20;

/// Sandboxes ready for the next attempts.
#[derive(Debug)]
pub(crate) struct Pool {
    bwrap: Bubblewrap,
    /// The helper ([`HELPER_NAME`]).
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
    ready: Vec<Ready>,
    /// Being made: counted so that fills running at once make no more
    /// than are missing.
    making: usize,
    /// Kept sandboxes serving an attempt, which come back after it.
    in_use: usize,
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
}

/// A sandbox an attempt took.
#[derive(Debug)]
pub(crate) enum Taken {
    /// Serves this attempt and ends with it: the helper becomes the
    /// script once it reads its request on stdin.
    Once(Child),
    /// Serves this attempt, then may serve the next.
    Kept(KeptAttempt),
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
        helper: PathBuf,
        config: &crate::ExecutorConfig,
        env: Arc<Vec<(OsString, OsString)>>,
        size: usize,
        attempts: u32,
    ) -> Option<Pool> {
        let attempt = Attempt {
            scripts_dir: &config.scripts_dir,
            state_dir: &config.data_dir,
            work_dir: &config.work_dir.join(SLOT_PREFIX),
        };
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
            ready: Mutex::new(Queue::default()),
            made: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        })
    }

    /// A ready sandbox for the attempt whose work dir is `work_dir`, or
    /// `None` (none ready, or `work_dir` exists): the caller makes its own.
    /// Refills either way.
    pub(crate) fn take(self: &Arc<Pool>, work_dir: &Path) -> Option<Taken> {
        if self.broken.load(Ordering::Relaxed) || work_dir.exists() {
            return None;
        }
        let taken = self.pop_ready();
        let pool = self.clone();
        tokio::spawn(async move { pool.fill() });
        let mut ready = taken?;
        if ready.socket.is_some() {
            return self.take_kept(ready, work_dir);
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
    fn take_kept(self: &Arc<Pool>, mut ready: Ready, work_dir: &Path) -> Option<Taken> {
        let inside = crate::kept::inside(ready.slot.as_deref()?, work_dir);
        if let Err(e) = std::fs::create_dir(&inside) {
            tracing::warn!(dir = %inside.display(), error = %e, "cannot make a work dir in a kept sandbox");
            return None;
        }
        ready.served += 1;
        self.ready.lock().unwrap_or_else(|e| e.into_inner()).in_use += 1;
        Some(Taken::Kept(KeptAttempt {
            pool: self.clone(),
            sandbox: Some(ready),
            inside,
            work_dir: work_dir.to_path_buf(),
            clean: false,
        }))
    }

    /// A kept sandbox back from an attempt: ready for the next, unless it
    /// served its last, or its attempt did not end cleanly (a timeout, a
    /// cancel, a helper that could not empty the sandbox or is gone), when
    /// it ends and another is made.
    fn give_back(self: &Arc<Pool>, sandbox: Ready, clean: bool) {
        let mut queue = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        queue.in_use -= 1;
        if clean && sandbox.served < self.attempts && !self.broken.load(Ordering::Relaxed) {
            queue.ready.push(sandbox);
            return;
        }
        drop(queue);
        drop(sandbox);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let pool = self.clone();
            runtime.spawn(async move { pool.fill() });
        }
    }

    /// The oldest sandbox whose helper runs (so every mount is made), its
    /// readiness mark taken away.
    fn pop_ready(&self) -> Option<Ready> {
        let mut guard = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        let queue = &mut guard.ready;
        let mut i = 0;
        while i < queue.len() {
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
            let marked = ready
                .slot
                .as_deref()
                .is_some_and(|slot| std::fs::remove_file(slot.join(READY_MARK)).is_ok());
            if marked {
                return Some(queue.remove(i));
            }
            i += 1;
        }
        None
    }

    /// Prepares sandboxes until `size` are ready or being made.
    pub(crate) fn fill(&self) {
        loop {
            {
                let mut queue = self.ready.lock().unwrap_or_else(|e| e.into_inner());
                if self.broken.load(Ordering::Relaxed)
                    || queue.ready.len() + queue.making + queue.in_use >= self.size
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
        let (program, mut args) = self.bwrap.command_line(Attempt {
            scripts_dir: &self.scripts_dir,
            state_dir: &self.state_dir,
            work_dir: &slot,
        });
        // The helper in view, read-only, wherever it is (a build tree in
        // `/tmp` would be under the sandbox's own): last, over the rest.
        let end = args.pop();
        debug_assert_eq!(end.as_deref(), Some(OsStr::new("--")));
        let helper = self.helper.as_os_str().to_owned();
        args.extend(["--ro-bind".into(), helper.clone(), helper]);
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
            command.arg(crate::kept::KEPT_FLAG);
        }
        command
            .arg(&slot)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        // Dropped from here on, the slot goes with it.
        let mut ready = Ready {
            child: None,
            slot: Some(slot),
            socket: None,
            served: 0,
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
        let socket = self.socket()?;
        crate::kept::send(
            socket,
            [
                stdin_read.as_fd(),
                stdout_write.as_fd(),
                stderr_write.as_fd(),
            ],
            request,
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
        if let Some(report) = crate::kept::report(self.socket()?).await {
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
            self.pool.give_back(sandbox, self.clean);
        }
    }
}

/// Renames `from` to `to`, never over an existing `to`.
fn move_work_dir(from: &Path, to: &Path) -> nix::Result<()> {
    renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE)
}

/// What a prepared sandbox is to run.
pub(crate) struct Request<'a> {
    /// The task's work dir, linked inside to the sandbox's own dir.
    pub work_dir: &'a Path,
    pub program: &'a OsStr,
    pub args: Vec<&'a OsStr>,
    /// The service's environment, then the attempt's own variables.
    pub env: [&'a [(OsString, OsString)]; 2],
}

impl Request<'_> {
    /// The bytes the helper reads: a big-endian length, then NUL-ended
    /// fields (no field can hold a NUL: they are paths, arguments and
    /// environment entries).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut fields: Vec<&[u8]> = vec![
            self.work_dir.as_os_str().as_bytes(),
            self.program.as_bytes(),
        ];
        let argc = self.args.len().to_string();
        fields.push(argc.as_bytes());
        fields.extend(self.args.iter().map(|a| a.as_bytes()));
        let entries: Vec<Vec<u8>> = self
            .env
            .iter()
            .flat_map(|part| part.iter())
            .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
            .collect();
        fields.extend(entries.iter().map(Vec::as_slice));
        let body: Vec<u8> = fields.iter().flat_map(|f| [*f, b"\0"].concat()).collect();
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend(body);
        out
    }
}

/// The helper inside a prepared sandbox, given the sandbox's own dir:
/// marks it ready, reads one request from stdin (exactly its bytes: the
/// rest is the script's input), links the task's work dir to the
/// sandbox's dir, and becomes the command. Exits 127 with a message when
/// it cannot. With `--kept` before the dir it serves attempts one after
/// another instead (`kept`).
pub fn serve() -> ExitCode {
    use std::os::fd::AsFd;
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os().skip(1).peekable();
    let kept = args.next_if(|a| a == crate::kept::KEPT_FLAG).is_some();
    let Some(slot) = args.next().map(PathBuf::from) else {
        return helper_failed("no dir given");
    };
    if kept {
        return crate::kept::serve(&slot);
    }
    if let Err(e) = std::fs::write(slot.join(READY_MARK), b"") {
        return helper_failed(&format!("cannot mark {} ready: {e}", slot.display()));
    }
    // Unbuffered: a buffered read would take some of the script's input.
    let mut stdin = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => return helper_failed(&format!("stdin: {e}")),
    };
    let request = match Decoded::read(&mut stdin) {
        Ok(request) => request,
        Err(e) => return helper_failed(&e),
    };
    drop(stdin);
    let target = slot.file_name().unwrap_or(slot.as_os_str());
    if let Err(e) = std::os::unix::fs::symlink(target, &request.work_dir) {
        return helper_failed(&format!(
            "cannot link the work dir {}: {e}",
            request.work_dir.display()
        ));
    }
    let e = request.command().exec();
    helper_failed(&format!(
        "could not start `{}`: {e}",
        Path::new(&request.program).display()
    ))
}

/// What the helper says before it gives up (exit code 127, as a shell's
/// "cannot run").
pub(crate) fn helper_failed(what: &str) -> ExitCode {
    eprintln!("{HELPER_NAME}: {what}");
    ExitCode::from(127)
}

/// A [`Request`] as the helper reads it.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub work_dir: PathBuf,
    pub program: OsString,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

impl Decoded {
    /// Reads exactly one request's bytes from `input`.
    pub(crate) fn read(input: &mut impl Read) -> Result<Decoded, String> {
        let mut len = [0u8; 4];
        input
            .read_exact(&mut len)
            .map_err(|e| format!("no request: {e}"))?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_REQUEST_BYTES {
            return Err(format!(
                "a request of {len} bytes, above {MAX_REQUEST_BYTES}"
            ));
        }
        let mut body = vec![0u8; len];
        input
            .read_exact(&mut body)
            .map_err(|e| format!("a cut request: {e}"))?;
        let mut fields = body
            .split(|b| *b == 0)
            .map(|f| OsString::from_vec(f.to_vec()));
        let (Some(work_dir), Some(program), Some(argc)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err("a request without its command".into());
        };
        let argc = argc
            .to_str()
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or("a request without its argument count")?;
        let args: Vec<OsString> = fields.by_ref().take(argc).collect();
        let env = fields
            .filter(|entry| !entry.is_empty())
            .filter_map(|entry| {
                let bytes = entry.as_bytes();
                let at = bytes.iter().position(|b| *b == b'=')?;
                Some((
                    OsString::from_vec(bytes[..at].to_vec()),
                    OsString::from_vec(bytes[at + 1..].to_vec()),
                ))
            })
            .collect();
        Ok(Decoded {
            work_dir: PathBuf::from(work_dir),
            program,
            args,
            env,
        })
    }

    /// The request's command line and environment, nothing inherited.
    pub(crate) fn command(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.program);
        command
            .args(&self.args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_its_fields_each_ended_by_nul_after_their_length() {
        let env = vec![("A".into(), "x=y".into())];
        let own = vec![("B".into(), "1".into())];
        let request = Request {
            work_dir: Path::new("/d/work/t1"),
            program: OsStr::new("/bin/sh"),
            args: vec![OsStr::new("s.sh")],
            env: [&env, &own],
        };
        let bytes = request.encode();
        let body: Vec<u8> = ["/d/work/t1", "/bin/sh", "1", "s.sh", "A=x=y", "B=1"]
            .iter()
            .flat_map(|field| [field.as_bytes(), b"\0"].concat())
            .collect();
        assert_eq!(&bytes[..4], &(body.len() as u32).to_be_bytes());
        assert_eq!(&bytes[4..], &body[..]);
    }

    #[test]
    fn the_helper_reads_back_the_request_the_service_encodes() {
        let env = vec![("A".into(), "x=y".into())];
        let own = vec![("B".into(), "".into())];
        let request = Request {
            work_dir: Path::new("/d/work/t1"),
            program: OsStr::new("/bin/sh"),
            args: vec![OsStr::new("s.sh"), OsStr::new("")],
            env: [&env, &own],
        };
        let mut bytes = request.encode();
        bytes.extend_from_slice(b"the script's input");
        let mut reader = &bytes[..];
        let decoded = Decoded::read(&mut reader).unwrap();
        assert_eq!(decoded.work_dir, Path::new("/d/work/t1"));
        assert_eq!(decoded.program, "/bin/sh");
        assert_eq!(
            decoded.args,
            vec![OsString::from("s.sh"), OsString::from("")]
        );
        assert_eq!(
            decoded.env,
            vec![("A".into(), "x=y".into()), ("B".into(), "".into())]
        );
        // Exactly the request: what follows is the script's.
        assert_eq!(reader, b"the script's input");
    }

    #[test]
    fn a_request_above_its_limit_or_cut_short_is_refused() {
        let mut too_big: &[u8] = &((MAX_REQUEST_BYTES + 1) as u32).to_be_bytes();
        assert!(Decoded::read(&mut too_big).unwrap_err().contains("above"));
        let mut cut: &[u8] = &[0, 0, 0, 9, b'x'];
        assert!(Decoded::read(&mut cut).unwrap_err().contains("cut"));
    }
}
