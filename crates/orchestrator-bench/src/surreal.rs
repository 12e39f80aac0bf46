//! The SurrealDB server of the `surrealdb-server` backend: the workspace's
//! `surreal-dev-server` (the official server crate), in memory, on a free
//! loopback port, for as long as the bench runs.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};

pub struct SurrealServer {
    child: Child,
    pub pid: u32,
    port: u16,
}

impl SurrealServer {
    /// Starts `<binary> start --bind 127.0.0.1:<free port> memory` and
    /// waits until it is ready to serve queries.
    pub async fn start(binary: &Path) -> Result<SurrealServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let bind = format!("127.0.0.1:{port}");
        let mut child = Command::new(binary)
            .args(["start", "--bind", &bind, "--user", "root", "--pass", "root"])
            .arg("memory")
            .env("SURREAL_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let pid = child.id().context("the SurrealDB server exited at once")?;
        // The server listens before its start-up work is done, and refuses
        // queries with 503 until then: wait for `GET /ready`, not the port.
        let ready = format!("http://{bind}/ready");
        let http = reqwest::Client::new();
        let t0 = Instant::now();
        while !http
            .get(&ready)
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            if let Some(status) = child.try_wait()? {
                bail!("the SurrealDB server exited at start with {status}");
            }
            if t0.elapsed() > Duration::from_secs(60) {
                bail!("the SurrealDB server was not ready on {bind} within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(SurrealServer { child, pid, port })
    }

    pub fn url(&self) -> String {
        format!("ws://127.0.0.1:{}", self.port)
    }

    pub fn cpu_secs(&self) -> Result<f64> {
        crate::service::cpu_secs(self.pid)
    }

    /// `VmRSS` in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .context("no VmRSS for the SurrealDB server")
    }

    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }
}
