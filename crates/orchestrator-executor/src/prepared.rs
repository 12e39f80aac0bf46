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
use std::process::ExitCode;
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
const READY_MARK: &str = ".ready";

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
    /// How many to keep ready: one per worker.
    size: usize,
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
}

/// A sandbox waiting for its command, and its dir.
#[derive(Debug)]
struct Ready {
    child: Option<Child>,
    slot: Option<PathBuf>,
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
    ) -> Option<Pool> {
        let attempt = Attempt {
            scripts_dir: &config.scripts_dir,
            state_dir: &config.data_dir,
            work_dir: &config.work_dir.join(SLOT_PREFIX),
        };
        if size == 0 || !bwrap.is_private(&config.work_dir, attempt) {
            return None;
        }
        // Slots a crash left behind: nothing but empty dirs of ours.
        if let Ok(entries) = std::fs::read_dir(&config.work_dir) {
            for entry in entries.flatten() {
                if entry
                    .file_name()
                    .as_bytes()
                    .starts_with(SLOT_PREFIX.as_bytes())
                {
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
            ready: Mutex::new(Queue::default()),
            made: AtomicU64::new(0),
            broken: AtomicBool::new(false),
        })
    }

    /// A ready sandbox whose dir is now `work_dir`, or `None` (none ready,
    /// or `work_dir` exists): the caller makes its own. Refills either way.
    pub(crate) fn take(self: &Arc<Pool>, work_dir: &Path) -> Option<Child> {
        if self.broken.load(Ordering::Relaxed) || work_dir.exists() {
            return None;
        }
        let taken = self.pop_ready();
        let pool = self.clone();
        tokio::spawn(async move { pool.fill() });
        let mut ready = taken?;
        let slot = ready.slot.as_deref()?;
        // Never over a work dir an earlier attempt left: it keeps its files.
        if let Err(e) = renameat2(
            AT_FDCWD,
            slot,
            AT_FDCWD,
            work_dir,
            RenameFlags::RENAME_NOREPLACE,
        ) {
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
        ready.child.take()
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
                    || queue.ready.len() + queue.making >= self.size
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
        args.extend(["--ro-bind".into(), helper.clone(), helper, "--".into()]);
        let mut command = Command::new(program);
        command
            .args(args)
            .arg(&self.helper)
            .arg(&slot)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        // Dropped from here on, the slot goes with it.
        let mut ready = Ready {
            child: None,
            slot: Some(slot),
        };
        ready.child = Some(crate::sandbox::as_attempt(&mut command).spawn()?);
        Ok(ready)
    }
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
/// it cannot.
pub fn serve() -> ExitCode {
    use std::os::fd::AsFd;
    use std::os::unix::process::CommandExt;
    let fail = |what: String| {
        eprintln!("{HELPER_NAME}: {what}");
        ExitCode::from(127)
    };
    let Some(slot) = std::env::args_os().nth(1).map(PathBuf::from) else {
        return fail("no dir given".into());
    };
    if let Err(e) = std::fs::write(slot.join(READY_MARK), b"") {
        return fail(format!("cannot mark {} ready: {e}", slot.display()));
    }
    // Unbuffered: a buffered read would take some of the script's input.
    let mut stdin = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) => return fail(format!("stdin: {e}")),
    };
    let mut len = [0u8; 4];
    if let Err(e) = stdin.read_exact(&mut len) {
        return fail(format!("no request: {e}"));
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_REQUEST_BYTES {
        return fail(format!(
            "a request of {len} bytes, above {MAX_REQUEST_BYTES}"
        ));
    }
    let mut body = vec![0u8; len];
    if let Err(e) = stdin.read_exact(&mut body) {
        return fail(format!("a cut request: {e}"));
    }
    drop(stdin);
    let mut fields = body
        .split(|b| *b == 0)
        .map(|f| OsString::from_vec(f.to_vec()));
    let (Some(work_dir), Some(program), Some(argc)) = (fields.next(), fields.next(), fields.next())
    else {
        return fail("a request without its command".into());
    };
    let Some(argc) = argc.to_str().and_then(|n| n.parse::<usize>().ok()) else {
        return fail("a request without its argument count".into());
    };
    let args: Vec<OsString> = fields.by_ref().take(argc).collect();
    let env: Vec<(OsString, OsString)> = fields
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
    let target = slot.file_name().unwrap_or(slot.as_os_str());
    if let Err(e) = std::os::unix::fs::symlink(target, &work_dir) {
        return fail(format!(
            "cannot link the work dir {}: {e}",
            Path::new(&work_dir).display()
        ));
    }
    let e = std::process::Command::new(&program)
        .args(&args)
        .env_clear()
        .envs(env)
        .exec();
    fail(format!(
        "could not start `{}`: {e}",
        Path::new(&program).display()
    ))
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
}
