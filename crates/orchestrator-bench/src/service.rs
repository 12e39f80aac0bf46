//! One `orchestrator serve` process on a free loopback port with its own
//! data directory, and the HTTP calls the workloads make to it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

use crate::Ctx;

/// How long a service may take to start, and to stop gracefully.
const START_LIMIT: Duration = Duration::from_secs(60);
const STOP_LIMIT: Duration = Duration::from_secs(30);

pub struct Service {
    child: Child,
    pub pid: u32,
    pub addr: SocketAddr,
    pub base: String,
    pub data_dir: PathBuf,
    /// From spawning the process to the first `200` of `GET /health`.
    pub started_in: Duration,
    ready_at: Instant,
    log_path: PathBuf,
    pub http: reqwest::Client,
}

/// How a service joins its store, beyond `--storage-type`: what only a node
/// of several (workload 9) sets.
#[derive(Default)]
pub struct Join {
    /// The SurrealDB database on the bench's server that the nodes share;
    /// unset, each service gets a fresh one named after its data directory.
    pub database: Option<String>,
    /// Instead of `ctx.workers`.
    pub workers: Option<usize>,
    /// More `serve` flags (`--node-id`, `--lease-secs`, ...).
    pub flags: Vec<String>,
    /// Instead of the bench's no-op scripts (workload 10: the repo's
    /// taskserv scripts).
    pub scripts_dir: Option<PathBuf>,
    /// Instead of an empty templates dir (workload 10: the repo's
    /// topologies).
    pub templates_dir: Option<PathBuf>,
}

impl Service {
    /// Starts `orchestrator serve --port 0` and waits until `/health` answers.
    pub async fn start(ctx: &Ctx, backend: &str, data_dir: &Path) -> Result<Service> {
        Service::start_with(ctx, backend, data_dir, &Join::default()).await
    }

    /// [`Service::start`] with the settings of `join`.
    pub async fn start_with(
        ctx: &Ctx,
        backend: &str,
        data_dir: &Path,
        join: &Join,
    ) -> Result<Service> {
        std::fs::create_dir_all(data_dir)?;
        let data_dir = std::path::absolute(data_dir)?;
        let log_path = data_dir.with_extension("service.log");
        let templates_dir = match &join.templates_dir {
            Some(dir) => dir.clone(),
            None => {
                let empty = ctx.tmp.join("no-templates");
                std::fs::create_dir_all(&empty)?;
                empty
            }
        };
        let mut cmd = Command::new(&ctx.orchestrator);
        // Loopback and no tokens: the benchmark measures the work, and its
        // clients carry no token (a token check is a hash and a map lookup).
        cmd.arg("serve")
            .arg("--no-auth")
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--port")
            .arg("0")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--scripts-dir")
            .arg(join.scripts_dir.as_ref().unwrap_or(&ctx.scripts))
            .arg("--templates-dir")
            .arg(&templates_dir)
            .arg("--workers")
            .arg(join.workers.unwrap_or(ctx.workers).to_string())
            .arg("--storage-type")
            .arg(backend)
            .args(&join.flags)
            .current_dir(&ctx.tmp)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Only when asked: a service built before the settings still runs.
        cmd.args(&ctx.sandbox_flags);
        if backend == "surrealdb-server" {
            let server = ctx.surreal.as_ref().ok_or_else(|| {
                anyhow!("the surrealdb-server backend needs the bench's SurrealDB server, which was not started")
            })?;
            let database = match &join.database {
                Some(d) => d.clone(),
                None => database_name(&data_dir),
            };
            cmd.arg("--surrealdb-url")
                .arg(server.url())
                .arg("--surrealdb-database")
                .arg(database);
        }
        clean_env(&mut cmd);
        let t0 = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", ctx.orchestrator.display()))?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow!("service exited at once"))?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow!("no stderr"))?;
        let (addr_tx, addr_rx) = tokio::sync::oneshot::channel::<SocketAddr>();
        let log_file = tokio::fs::File::create(&log_path).await?;
        // Drains the service's log into a file for as long as it runs, and
        // picks the bound address out of the "listening" line.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stderr).lines();
            let mut out = tokio::io::BufWriter::new(log_file);
            let mut addr_tx = Some(addr_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if addr_tx.is_some()
                    && let Some(addr) = listening_addr(&line)
                    && let Some(tx) = addr_tx.take()
                {
                    let _ = tx.send(addr);
                }
                let _ = out.write_all(line.as_bytes()).await;
                let _ = out.write_all(b"\n").await;
            }
            let _ = out.flush().await;
        });
        let addr = match tokio::time::timeout(START_LIMIT, addr_rx).await {
            Ok(Ok(addr)) => addr,
            _ => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                tokio::time::sleep(Duration::from_millis(50)).await;
                bail!(
                    "service did not start; its log ({}) ends with:\n{}",
                    log_path.display(),
                    tail(&log_path)
                );
            }
        };
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .build()?;
        let base = format!("http://{addr}");
        loop {
            if let Ok(r) = http.get(format!("{base}/health")).send().await
                && r.status().is_success()
            {
                break;
            }
            if t0.elapsed() > START_LIMIT {
                bail!("{base}/health did not answer within {START_LIMIT:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let started_in = t0.elapsed();
        Ok(Service {
            child,
            pid,
            addr,
            base,
            data_dir,
            started_in,
            ready_at: Instant::now(),
            log_path,
            http,
        })
    }

    /// `VmRSS` and `VmHWM` (peak) in KiB.
    pub fn rss_kib(&self) -> Result<(u64, u64)> {
        let [rss, peak] = self.status_kib(["VmRSS:", "VmHWM:"])?;
        Ok((rss, peak))
    }

    /// `RssAnon` in KiB: the resident memory that is the process's own
    /// (heap, stacks), without the pages of its binary and libraries mapped
    /// from files, which `VmRSS` also counts.
    pub fn anon_rss_kib(&self) -> Result<u64> {
        let [anon] = self.status_kib(["RssAnon:"])?;
        Ok(anon)
    }

    fn status_kib<const N: usize>(&self, names: [&str; N]) -> Result<[u64; N]> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        let mut values = [0; N];
        for (value, name) in values.iter_mut().zip(names) {
            *value = status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| anyhow!("no {name} in /proc/{}/status", self.pid))?;
        }
        Ok(values)
    }

    /// User + system CPU time the process has used so far.
    pub fn cpu_secs(&self) -> Result<f64> {
        cpu_secs(self.pid)
    }

    /// SIGKILL, as in a crash: no shutdown, leases left to expire.
    pub async fn kill(mut self) -> Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }

    /// SIGTERM, then a graceful-shutdown wait; SIGKILL if it overruns.
    pub async fn stop(mut self) -> Result<()> {
        // The service installs its SIGTERM handler only after it starts
        // answering; a signal in that gap would end it without a graceful
        // shutdown, so never stop a service in its first half second.
        let up = self.ready_at.elapsed();
        if up < Duration::from_millis(500) {
            tokio::time::sleep(Duration::from_millis(500) - up).await;
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid)?);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        match tokio::time::timeout(STOP_LIMIT, self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!(
                        "service exited with {status}; its log ({}) ends with:\n{}",
                        self.log_path.display(),
                        tail(&self.log_path)
                    );
                }
                Ok(())
            }
            Err(_) => {
                let _ = self.child.start_kill();
                let _ = self.child.wait().await;
                bail!("service did not stop within {STOP_LIMIT:?} of SIGTERM")
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn get_json(&self, path: &str) -> Result<Value> {
        Ok(serde_json::from_str(&self.get_text(path).await?)?)
    }

    pub async fn get_text(&self, path: &str) -> Result<String> {
        let r = self.http.get(self.url(path)).send().await?;
        let status = r.status();
        let text = r.text().await?;
        if !status.is_success() {
            bail!("GET {path}: {status}: {text}");
        }
        Ok(text)
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value> {
        post_json(&self.http, &self.url(path), body).await
    }

    /// `total` of `GET /tasks?status=<status>`.
    pub async fn count(&self, status: &str) -> Result<u64> {
        let page = self
            .get_json(&format!("/tasks?status={status}&limit=1"))
            .await?;
        page["total"]
            .as_u64()
            .ok_or_else(|| anyhow!("no total in {page}"))
    }

    /// Polls until `want` tasks completed; fails on a failed task or after
    /// `limit`. The pause between polls is a quarter of the time the rate
    /// so far says is left, between 10 and 100 ms: the end is still seen
    /// within 10 ms, while the polls (each a count in the store, on a
    /// SurrealDB server a query of its own) cost the service under test
    /// little (every 10 ms, they were a tenth of the server's work per
    /// task in workload 9).
    pub async fn wait_completed(&self, want: u64, limit: Duration) -> Result<Instant> {
        let t0 = Instant::now();
        let mut polls = 0u64;
        loop {
            let done = self.count("completed").await?;
            if done >= want {
                return Ok(Instant::now());
            }
            polls += 1;
            if polls.is_multiple_of(50) {
                let failed = self.count("failed").await?;
                if failed > 0 {
                    bail!("{failed} task(s) failed; see {}", self.log_path.display());
                }
            }
            if t0.elapsed() > limit {
                bail!("only {done} of {want} tasks completed within {limit:?}");
            }
            tokio::time::sleep(poll_pause(done, want, t0.elapsed())).await;
        }
    }
}

/// How long to wait before counting again, `done` of `want` after
/// `elapsed`: a quarter of the time left at the rate so far, 10 to 100 ms.
fn poll_pause(done: u64, want: u64, elapsed: Duration) -> Duration {
    const FINE: Duration = Duration::from_millis(10);
    const COARSE: Duration = Duration::from_millis(100);
    if done == 0 {
        return FINE;
    }
    let left = elapsed.mul_f64(want.saturating_sub(done) as f64 / done as f64);
    (left / 4).clamp(FINE, COARSE)
}

pub async fn post_json(http: &reqwest::Client, url: &str, body: &Value) -> Result<Value> {
    let r = http
        .post(url)
        .json(body)
        .timeout(Duration::from_secs(600))
        .send()
        .await?;
    let status = r.status();
    let text = r.text().await?;
    if !status.is_success() {
        bail!(
            "POST {url}: {status}: {}",
            text.chars().take(500).collect::<String>()
        );
    }
    Ok(serde_json::from_str(&text)?)
}

/// No inherited `ORCHESTRATOR_*` setting, log filter or make job server
/// may change what is measured.
pub fn clean_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let k = key.to_string_lossy();
        if k.starts_with("ORCHESTRATOR_")
            || matches!(
                k.as_ref(),
                "RUST_LOG" | "MAKEFLAGS" | "MFLAGS" | "MAKELEVEL" | "MAKEFILES"
            )
        {
            cmd.env_remove(&key);
        }
    }
    cmd.env("LC_ALL", "C");
}

/// A SurrealDB database name for a service's data directory: its file
/// name, with anything but ASCII letters and digits as `_`.
fn database_name(data_dir: &Path) -> String {
    let name = data_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let clean: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("bench_{clean}")
}

/// User + system CPU seconds of process `pid`, from `/proc/<pid>/stat`.
pub fn cpu_secs(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold spaces;
    // utime and stime are fields 14 and 15, so the 12th and 13th after it.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("unexpected /proc/{pid}/stat"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| -> Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| anyhow!("no CPU time in /proc/{pid}/stat"))
    };
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Ok((ticks(11)? + ticks(12)?) as f64 / hz)
}

fn listening_addr(line: &str) -> Option<SocketAddr> {
    let rest = &line[line.find("listening on http://")? + "listening on http://".len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '[' | ']')))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_address_in_a_pretty_log_line() {
        let line = "\u{1b}[2m2026-01-01T00:00:00Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m orchestrator::service: orchestrator listening on http://127.0.0.1:40123 \u{1b}[3maddr\u{1b}[0m=127.0.0.1:40123";
        assert_eq!(
            listening_addr(line),
            Some("127.0.0.1:40123".parse().unwrap())
        );
    }

    #[test]
    fn polls_are_sparse_far_from_the_end_and_fine_near_it() {
        let ms = Duration::from_millis;
        assert_eq!(poll_pause(0, 600, ms(500)), ms(10));
        // 100 of 600 in 1 s: 5 s left, so the coarsest pause.
        assert_eq!(poll_pause(100, 600, ms(1000)), ms(100));
        // 580 of 600 in 6 s: about 0.2 s left, a quarter of it.
        assert_eq!(poll_pause(580, 600, ms(5800)), ms(50));
        assert_eq!(poll_pause(599, 600, ms(6000)), ms(10));
    }
}
