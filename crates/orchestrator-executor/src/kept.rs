//! Sandboxes kept for several attempts, one after another
//! (`--script-sandbox-attempts N`, default 100): making a sandbox costs
//! more than a short script. Which attempts may follow one another is the
//! pool's choice (`prepared`): by default those of the workflows one token
//! submitted, never one whose input holds a secret.
//!
//! A prepared sandbox (`prepared`) serves one attempt: its helper becomes
//! the script. A kept one's helper stays, and runs each attempt as its
//! child. What the attempt gets is what a fresh sandbox gives, but for
//! the sandbox's namespaces, which it shares with the attempts before and
//! after it (never at once). So that nothing of one attempt reaches the
//! next, the helper, between two attempts:
//! - kills every process left in the sandbox's PID namespace, whose init it
//!   is (`bwrap --as-pid-1`), and reaps them;
//! - empties every file system of the sandbox's own that a script can
//!   write (`Bubblewrap::private_dirs`: the tmpfs of `/tmp`, `/var/tmp`
//!   and of each hidden dir, `/dev/shm`, the POSIX message queues), and
//!   removes the System V IPC objects; `/dev` itself is read-only;
//! - is not dumpable, so a script (the same user, without capabilities)
//!   can neither trace it, nor read its memory, nor take its socket
//!   (`pidfd_getfd`), where the next attempt's request passes; and as the
//!   namespace's init it gets no signal from a script.
//!
//! If any of it fails, the helper reports the attempt and exits, and the
//! sandbox is made anew. A timeout or a cancel ends the sandbox too.
//!
//! Each attempt's streams are pipes of its own, passed to the helper with
//! its request over a socket (`SCM_RIGHTS`); the helper answers with the
//! wait status. The attempt's work dir is made in the sandbox's own dir
//! (bound into it), linked from the task's path inside, and moved to the
//! task's path outside when the attempt ends.

use std::ffi::OsStr;
use std::io::{IoSliceMut, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;
use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};

use crate::wire::{Decoded, HELPER_NAME, LAST_ATTEMPT, READY_MARK, Report, STREAMS, helper_failed};

/// The wait status of an attempt the helper could not start (exit 127).
const CANNOT_START: i32 = 127 << 8;

/// The helper of a kept sandbox, its socket on stdin: serves attempts
/// until the socket closes (exit 0) or the sandbox cannot be made clean.
/// `private` are the sandbox's own writable mounts, where a script may
/// leave files that the next attempt would see.
pub(crate) fn serve(slot: &Path, private: &[PathBuf]) -> ExitCode {
    // Not dumpable: scripts run as this user, and a dumpable helper could
    // be traced, or its memory read through /proc, by one attempt's script
    // to see the next attempt's request (its input, token and secrets).
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        return helper_failed(&format!("cannot stop being dumpable: {e}"));
    }
    // A timeout sends SIGTERM to the whole group but `bwrap`; the helper
    // must outlive its script to report it, so it blocks the signal (std
    // unblocks every signal in a child before its exec).
    if let Err(e) = SigSet::from(Signal::SIGTERM).thread_block() {
        return helper_failed(&format!("cannot block SIGTERM: {e}"));
    }
    let mut socket = match std::io::stdin().as_fd().try_clone_to_owned() {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => return helper_failed(&format!("stdin: {e}")),
    };
    let mark = || {
        std::fs::write(slot.join(READY_MARK), b"")
            .map_err(|e| format!("cannot mark {} ready: {e}", slot.display()))
    };
    if let Err(e) = mark() {
        return helper_failed(&e);
    }
    loop {
        let (streams, last) = match receive_streams(&socket) {
            Ok(Some(received)) => received,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => return helper_failed(&e),
        };
        let request = match Decoded::read(&mut socket) {
            Ok(request) => request,
            Err(e) => return helper_failed(&e),
        };
        // The attempt's stderr, for what the helper has to say about it;
        // held until the sandbox is clean, so that the service reads it
        // before the status.
        let mut message = streams[2].try_clone().map(std::fs::File::from).ok();
        let mut say = |what: String| {
            if let Some(message) = &mut message {
                let _ = writeln!(message, "{HELPER_NAME}: {what}");
            }
        };
        let status = run(slot, &request, streams, &mut say);
        if last {
            // The sandbox ends with this attempt: what the script left
            // dies with the helper, the namespace's init, as it exits.
            drop(message);
            let _ = socket.write_all(&Report::encode(status, false));
            return ExitCode::SUCCESS;
        }
        // Marked ready again before the status goes: the service may hand
        // the next attempt over as soon as it has the status.
        let cleaned = end_leftovers()
            .and_then(|()| empty_private(private))
            .and_then(|()| mark());
        if let Err(e) = &cleaned {
            let _ = std::fs::remove_file(slot.join(READY_MARK));
            say(format!("this sandbox cannot serve another attempt: {e}"));
        }
        drop(message);
        if socket
            .write_all(&Report::encode(status, cleaned.is_ok()))
            .is_err()
            || cleaned.is_err()
        {
            return ExitCode::from(1);
        }
    }
}

/// One attempt: links its work dir, runs its command with its streams,
/// and returns the wait status (127 with a message on its stderr when the
/// command cannot start).
fn run(
    slot: &Path,
    request: &Decoded,
    [stdin, stdout, stderr]: [OwnedFd; STREAMS],
    say: &mut dyn FnMut(String),
) -> i32 {
    let task = request.work_dir.file_name().unwrap_or(OsStr::new(""));
    let inside = Path::new(slot.file_name().unwrap_or_default()).join(task);
    let _ = std::fs::remove_file(&request.work_dir);
    if let Err(e) = std::os::unix::fs::symlink(&inside, &request.work_dir) {
        say(format!(
            "cannot link the work dir {}: {e}",
            request.work_dir.display()
        ));
        return CANNOT_START;
    }
    let mut command = request.command();
    command
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    let status = match command.spawn().and_then(|mut child| child.wait()) {
        Ok(status) => status.into_raw(),
        Err(e) => {
            say(format!(
                "could not start `{}`: {e}",
                Path::new(&request.program).display()
            ));
            CANNOT_START
        }
    };
    let _ = std::fs::remove_file(&request.work_dir);
    status
}

/// The next attempt's streams, and whether it is the sandbox's last
/// ([`LAST_ATTEMPT`]); `None` once the service closed the socket.
fn receive_streams(socket: &UnixStream) -> Result<Option<([OwnedFd; STREAMS], bool)>, String> {
    let mut byte = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut byte)];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(STREAMS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let message = loop {
        match rustix::net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Err(rustix::io::Errno::INTR) => continue,
            other => break other.map_err(|e| format!("cannot receive an attempt: {e}"))?,
        }
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    for cmsg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = cmsg {
            fds.extend(received);
        }
    }
    if message.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    let last = message.bytes == 1 && byte[0] == LAST_ATTEMPT;
    fds.try_into()
        .map(|streams| Some((streams, last)))
        .map_err(|fds: Vec<OwnedFd>| {
            format!("an attempt with {} streams, not {STREAMS}", fds.len())
        })
}

/// Kills every process of the sandbox but the helper (the namespace's
/// init, to which what a script leaves running comes back), and reaps
/// them, until none is left: a process forking while it is killed is
/// caught by the next round.
fn end_leftovers() -> Result<(), String> {
    loop {
        let killed = kill(Pid::from_raw(-1), Signal::SIGKILL);
        loop {
            match waitpid(Pid::from_raw(-1), None) {
                Ok(_) => continue,
                Err(Errno::ECHILD) => break,
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(format!("cannot reap what a script left: {e}")),
            }
        }
        match killed {
            Err(Errno::ESRCH) => return Ok(()),
            Ok(()) => continue,
            Err(e) => return Err(format!("cannot kill what a script left: {e}")),
        }
    }
}

/// Empties the sandbox's own writable mounts and removes the System V
/// IPC objects.
fn empty_private(private: &[PathBuf]) -> Result<(), String> {
    for dir in private {
        let Ok(root) = std::fs::symlink_metadata(dir) else {
            continue;
        };
        empty(dir, root.dev())
            .map_err(|(path, e)| format!("cannot remove {}: {e}", path.display()))?;
    }
    // Rare, so a program of util-linux (no unsafe call here) rather than
    // one per attempt: only when one of the lists names an object.
    let listed = ["shm", "sem", "msg"].iter().any(|kind| {
        std::fs::read_to_string(format!("/proc/sysvipc/{kind}"))
            .is_ok_and(|text| text.lines().skip(1).any(|line| !line.trim().is_empty()))
    });
    if listed {
        let removed = std::process::Command::new(IPCRM)
            .arg("--all")
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("cannot run {IPCRM}: {e}"))?;
        if !removed.success() {
            return Err(format!("{IPCRM} --all failed ({removed})"));
        }
    }
    Ok(())
}

/// Removes what `dir` holds on the file system `dev`. Never crosses into
/// another: the mounts beneath a private dir (the work dir, the state
/// dir, the scripts dir, the helper) are shared with the host, and what
/// leads to them stays.
fn empty(dir: &Path, dev: u64) -> Result<(), (PathBuf, std::io::Error)> {
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |e| (path, e)
    };
    for entry in std::fs::read_dir(dir).map_err(failed(dir))? {
        let path = entry.map_err(failed(dir))?.path();
        let meta = std::fs::symlink_metadata(&path).map_err(failed(&path))?;
        // A mount point (a bound dir or file): the host's.
        if meta.dev() != dev {
            continue;
        }
        if !meta.is_dir() {
            std::fs::remove_file(&path).map_err(failed(&path))?;
            continue;
        }
        empty(&path, dev)?;
        match std::fs::remove_dir(&path) {
            // It leads to one of the sandbox's mounts.
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOTEMPTY) => {}
            other => other.map_err(failed(&path))?,
        }
    }
    Ok(())
}

/// Removes System V IPC objects (util-linux, in every Debian system).
const IPCRM: &str = "/usr/bin/ipcrm";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emptying_a_scratch_dir_removes_everything_in_it_on_its_file_system() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/b/c/file"), "x").unwrap();
        std::fs::write(root.join("top"), "x").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        let dev = std::fs::metadata(root).unwrap().dev();
        empty(root, dev).unwrap();
        assert_eq!(std::fs::read_dir(root).unwrap().count(), 0);
        // What a link pointed at is not followed.
        assert!(Path::new("/etc").is_dir());
    }

    #[test]
    fn what_is_on_another_file_system_is_left_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("mount/inside")).unwrap();
        std::fs::write(root.join("mount/inside/file"), "x").unwrap();
        std::fs::write(root.join("bound-file"), "x").unwrap();
        // A device number no entry here has: each counts as a mount point
        // (a bound dir, or a bound file such as the helper).
        let dev = std::fs::metadata(root).unwrap().dev() + 1;
        empty(root, dev).unwrap();
        assert!(root.join("mount/inside/file").exists());
        assert!(root.join("bound-file").exists());
    }
}
