//! Peak RSS and CPU time of one child process, measured robustly.
//!
//! `orchestrator-bench __reap <usage.json> <program> [args…]` runs the
//! program as its only child, waits for it, and writes its wall time and
//! `getrusage(RUSAGE_CHILDREN)`: the kernel's own peak RSS (`ru_maxrss`)
//! and CPU times of the reaped child, with nothing missed between two polls
//! and nothing from other children of the benchmark mixed in. It exits with
//! the child's exit code.

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, anyhow};
use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeVal;
use serde_json::json;

/// The hidden first argument of the reaper mode.
pub const WRAP: &str = "__reap";

pub struct Usage {
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    pub maxrss_kib: u64,
}

impl Usage {
    pub fn read(path: &Path) -> Result<Usage> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("no usage in {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let f = |name: &str| {
            v[name]
                .as_f64()
                .ok_or_else(|| anyhow!("no {name} in {}", path.display()))
        };
        Ok(Usage {
            wall_s: f("wall_s")?,
            user_s: f("user_s")?,
            sys_s: f("sys_s")?,
            maxrss_kib: f("maxrss_kib")? as u64,
        })
    }
}

fn seconds(t: TimeVal) -> f64 {
    t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6
}

/// The reaper mode; `args` follow [`WRAP`].
pub fn reap(args: &[OsString]) -> ExitCode {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("orchestrator-bench {WRAP}: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[OsString]) -> Result<ExitCode> {
    let [out, program, rest @ ..] = args else {
        anyhow::bail!("usage: {WRAP} <usage.json> <program> [args…]");
    };
    let t0 = Instant::now();
    let status = std::process::Command::new(program)
        .args(rest)
        .status()
        .with_context(|| format!("cannot run {}", program.to_string_lossy()))?;
    let wall_s = t0.elapsed().as_secs_f64();
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN)?;
    let summary = json!({
        "wall_s": wall_s,
        "user_s": seconds(usage.user_time()),
        "sys_s": seconds(usage.system_time()),
        // Linux reports kilobytes (KiB).
        "maxrss_kib": usage.max_rss(),
    });
    std::fs::write(out, summary.to_string())?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reaper_reports_the_child_and_its_exit_code() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("usage.json");
        let args: Vec<OsString> = [
            out.as_os_str(),
            "sh".as_ref(),
            "-c".as_ref(),
            "exit 3".as_ref(),
        ]
        .iter()
        .map(|a| a.to_os_string())
        .collect();
        assert_eq!(run(&args).unwrap(), ExitCode::from(3));
        let usage = Usage::read(&out).unwrap();
        assert!(usage.maxrss_kib > 0 && usage.wall_s > 0.0);
    }
}
