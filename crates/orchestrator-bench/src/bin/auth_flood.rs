//! `auth-flood`: a one-off measurement of a flood of wrong tokens (issue
//! 17): what it costs the store, the memory and a legitimate client.
//!
//! It starts a real `orchestrator serve` (filesystem backend, temporary
//! data dir, default rate limits), then measures a legitimate client (one
//! keep-alive connection from 127.0.0.1 with a valid token, paced below its
//! rate limit) alone, and again while other connections from 127.0.0.2
//! send `--requests` requests with wrong tokens as fast as they are
//! answered. It prints the answers the flood got, the growth of the data
//! dir, the service's RSS before and after, and the legitimate client's
//! latencies. It asserts nothing: docs/benchmarks.md records its output.
//!
//! ```text
//! cargo build --release -p orchestrator -p orchestrator-bench
//! target/release/auth-flood --orchestrator target/release/orchestrator
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::net::TcpSocket;

#[derive(Debug, Parser)]
#[command(
    name = "auth-flood",
    about = "A flood of wrong tokens against a real service"
)]
struct Args {
    /// The `orchestrator` binary.
    #[arg(long)]
    orchestrator: PathBuf,
    /// Requests with wrong tokens.
    #[arg(long, default_value_t = 100_000)]
    requests: u64,
    /// Connections of the flood.
    #[arg(long, default_value_t = 8)]
    connections: u64,
    /// The legitimate client's requests per second (below its limit of 50).
    #[arg(long, default_value_t = 25)]
    rate: u64,
    /// How long the legitimate client is measured alone.
    #[arg(long, default_value_t = 20)]
    baseline_secs: u64,
}

const TOKEN: &str = "auth-flood-admin-token-0123456789abcdef";

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

/// The service under test; killed on drop.
struct Service {
    child: Child,
    addr: SocketAddr,
    data_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(binary: &Path) -> Result<Service> {
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data");
    // No scripts run: the flood and the client only read.
    let scripts = dir.path().join("scripts");
    let templates = dir.path().join("templates");
    std::fs::create_dir_all(&scripts)?;
    std::fs::create_dir_all(&templates)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new(binary)
        .args(["serve", "--port", &port.to_string(), "--workers", "2"])
        .arg("--data-dir")
        .arg(&data_dir)
        .arg("--scripts-dir")
        .arg(&scripts)
        .arg("--templates-dir")
        .arg(&templates)
        .env("ORCHESTRATOR_BOOTSTRAP_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    Ok(Service {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
        data_dir,
        _dir: dir,
    })
}

/// One keep-alive connection from `from`.
async fn connect(
    to: SocketAddr,
    from: IpAddr,
) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from, 0))?;
    let stream = socket.connect(to).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    addr: SocketAddr,
    path: &str,
    token: &str,
) -> Result<u16> {
    sender.ready().await?;
    let request = Request::get(path)
        .header("host", addr.to_string())
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    response.into_body().collect().await?;
    Ok(status)
}

fn bytes_under(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => bytes_under(&entry.path()),
            Ok(meta) => meta.len(),
            Err(_) => 0,
        })
        .sum()
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS for {pid}"))
}

/// The legitimate client: `rate` GETs per second until `until` says stop;
/// the latency of each, in microseconds, and any status but 200.
async fn legitimate(
    addr: SocketAddr,
    rate: u64,
    until: impl Fn() -> bool,
) -> Result<(Vec<u64>, BTreeMap<u16, u64>)> {
    let mut sender = connect(addr, IpAddr::from([127, 0, 0, 1])).await?;
    let mut ticks = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    let mut latencies = Vec::new();
    let mut other = BTreeMap::new();
    while !until() {
        ticks.tick().await;
        let sent = Instant::now();
        let status = get(&mut sender, addr, "/tasks?limit=10", TOKEN).await?;
        latencies.push(sent.elapsed().as_micros() as u64);
        if status != 200 {
            *other.entry(status).or_default() += 1;
        }
    }
    Ok((latencies, other))
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn summary(name: &str, mut latencies: Vec<u64>, other: &BTreeMap<u16, u64>) -> (f64, f64) {
    latencies.sort_unstable();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "{name}: {} requests, p50 {p50:.2} ms, p99 {p99:.2} ms, max {:.2} ms, not 200: {other:?}",
        latencies.len(),
        latencies.last().copied().unwrap_or_default() as f64 / 1000.0
    );
    (p50, p99)
}

async fn run(args: Args) -> Result<()> {
    let service = start(&args.orchestrator)?;
    let addr = service.addr;
    let ready = Instant::now();
    loop {
        let up = async {
            let mut sender = connect(addr, IpAddr::from([127, 0, 0, 1])).await?;
            get(&mut sender, addr, "/health", "-").await
        };
        let answer = up.await;
        if let Ok(200) = answer {
            break;
        }
        if ready.elapsed() > Duration::from_secs(30) {
            bail!("the service did not answer on {addr}: {answer:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let started = Instant::now();
    let baseline = Duration::from_secs(args.baseline_secs);
    let (alone, alone_other) =
        legitimate(addr, args.rate, || started.elapsed() >= baseline).await?;
    let rss_before = rss_kib(service.child.id())?;
    let bytes_before = bytes_under(&service.data_dir);

    let sent = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let flood_started = Instant::now();
    let mut flood = tokio::task::JoinSet::new();
    for c in 0..args.connections {
        let sent = sent.clone();
        let done = done.clone();
        let total = args.requests;
        flood.spawn(async move {
            let mut sender = connect(addr, IpAddr::from([127, 0, 0, 2])).await?;
            let mut statuses = BTreeMap::<u16, u64>::new();
            let mut i = 0u64;
            while sent.fetch_add(1, Ordering::Relaxed) < total {
                let token = format!("wrong-{c}-{i}");
                *statuses
                    .entry(get(&mut sender, addr, "/tasks", &token).await?)
                    .or_default() += 1;
                i += 1;
            }
            done.fetch_add(1, Ordering::Relaxed);
            anyhow::Ok(statuses)
        });
    }
    let connections = args.connections;
    let flooding = done.clone();
    let (during, during_other) = legitimate(addr, args.rate, move || {
        flooding.load(Ordering::Relaxed) >= connections
    })
    .await?;
    let mut statuses = BTreeMap::<u16, u64>::new();
    for result in flood.join_all().await {
        for (status, n) in result? {
            *statuses.entry(status).or_default() += n;
        }
    }
    let flood_secs = flood_started.elapsed().as_secs_f64();
    // The record carrying the count of the flood's first minute falls due
    // a minute after its first refusal, and is written within a quarter
    // of a minute after that; the growth is read once it is.
    let written = flood_started + Duration::from_secs(76);
    tokio::time::sleep(written.saturating_duration_since(Instant::now())).await;
    let rss_after = rss_kib(service.child.id())?;
    let bytes_after = bytes_under(&service.data_dir);

    println!(
        "flood: {} requests with wrong tokens in {flood_secs:.1} s ({:.0}/s), answers: {statuses:?}",
        args.requests,
        args.requests as f64 / flood_secs
    );
    println!(
        "data dir: {bytes_before} -> {bytes_after} bytes (+{} bytes)",
        bytes_after.saturating_sub(bytes_before)
    );
    println!("service RSS: {rss_before} KiB -> {rss_after} KiB");
    let (_, p99_alone) = summary("legitimate client alone", alone, &alone_other);
    let (_, p99_during) = summary("legitimate client during the flood", during, &during_other);
    println!("p99 during / alone: {:.2}", p99_during / p99_alone);
    Ok(())
}
