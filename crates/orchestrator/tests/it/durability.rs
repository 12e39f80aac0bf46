//! What a power cut could undo unless the service syncs it: seen from
//! outside, in the system calls of a real process (strace).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

/// A new journal's name lives in the data dir: the directory is fsynced
/// after the journal is created, before anything written to the journal
/// is acknowledged (else a power cut could lose the file, and with it
/// every append acknowledged as durable).
#[test]
fn a_new_journal_s_directory_entry_is_synced() {
    if Command::new("strace").arg("-V").output().is_err() {
        panic!("this test needs strace (apt-get install strace; .ci/run installs it)");
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let trace = dir.path().join("trace.txt");
    // The local token command opens (and so creates) the store, writes one
    // token and one audit record, and exits.
    let output = Command::new("strace")
        .args(["-f", "-e", "trace=openat,fsync,fdatasync,write", "-o"])
        .arg(&trace)
        .arg(BIN)
        .args([
            "token",
            "create",
            "--local",
            "--name",
            "rescue",
            "--role",
            "admin",
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stderr.contains("PTRACE") || stderr.contains("ptrace") {
        // A sandbox that forbids ptrace: nothing here can be traced.
        eprintln!("SKIPPED: strace cannot trace in this environment: {stderr}");
        return;
    }
    assert!(output.status.success(), "{stderr}");
    let calls = std::fs::read_to_string(&trace).unwrap();
    let journal = format!("\"{}\"", data.join("journal.jsonl").display());
    let data_dir = format!("\"{}\"", data.display());
    let lines: Vec<&str> = calls.lines().collect();
    let fd_of = |line: &str| {
        line.rsplit("= ")
            .next()
            .and_then(|fd| fd.trim().parse::<i32>().ok())
    };
    let created = lines
        .iter()
        .position(|l| l.contains(&journal) && l.contains("O_CREAT"))
        .unwrap_or_else(|| panic!("the journal was never created:\n{calls}"));
    let journal_fd = fd_of(lines[created]).expect("the journal's descriptor");
    let rest = &lines[created + 1..];
    let dir_fd = rest
        .iter()
        .find(|l| l.contains(&format!("openat(AT_FDCWD, {data_dir}, ")))
        .and_then(|l| fd_of(l))
        .unwrap_or_else(|| {
            panic!("the data dir was not opened after the journal's creation:\n{calls}")
        });
    let synced = rest
        .iter()
        .position(|l| l.contains(&format!("fsync({dir_fd})")))
        .unwrap_or_else(|| panic!("the data dir was not fsynced:\n{calls}"));
    let first_write = rest
        .iter()
        .position(|l| l.contains(&format!("write({journal_fd},")))
        .unwrap_or_else(|| panic!("nothing was written to the journal:\n{calls}"));
    assert!(
        synced < first_write,
        "the directory was synced before the journal's first line:\n{calls}"
    );
}
