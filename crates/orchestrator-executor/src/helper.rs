//! `orchestrator-sandbox-exec`, the helper inside each sandbox: it
//! refuses the scripts the kernel's keyrings (`syscalls`), then becomes
//! the script of a sandbox made at its start, or of the one attempt that
//! takes a sandbox prepared ahead (`prepared`), or, in a sandbox kept for
//! several attempts, runs them one after another (`kept`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::wire::{Decoded, EXEC_FLAG, KEPT_FLAG, READY_MARK, helper_failed};

/// The helper inside a sandbox. It first refuses itself (and so every
/// script it starts) the kernel's keyrings (`syscalls`). With `--exec`
/// before a command line, in a sandbox made for one attempt at its start,
/// it becomes that command. Else, inside a prepared sandbox, given the
/// sandbox's own dir, it marks it ready, reads one request from stdin
/// (exactly its bytes: the rest is the script's input), links the task's
/// work dir to the sandbox's dir, and becomes the command. Exits 127 with a message when
/// it cannot. With `--kept` before the dir it serves attempts one after
/// another instead (`kept`), and the dirs after it are those to empty
/// between two.
pub fn serve() -> ExitCode {
    use std::os::fd::AsFd;
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os().skip(1).peekable();
    // Before anything of a script's runs: inherited by all it starts.
    if let Err(e) = crate::syscalls::refuse_keyrings() {
        return helper_failed(&e);
    }
    if args.next_if(|a| a == EXEC_FLAG).is_some() {
        let Some(program) = args.next() else {
            return helper_failed("no command given");
        };
        let e = std::process::Command::new(&program).args(args).exec();
        return helper_failed(&format!(
            "could not start `{}`: {e}",
            Path::new(&program).display()
        ));
    }
    let kept = args.next_if(|a| a == KEPT_FLAG).is_some();
    let Some(slot) = args.next().map(PathBuf::from) else {
        return helper_failed("no dir given");
    };
    if kept {
        // The rest: the sandbox's own writable mounts, to empty.
        let private: Vec<PathBuf> = args.map(PathBuf::from).collect();
        return crate::kept::serve(&slot, &private);
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
