//! A small closed-loop HTTP load generator: a fixed number of keep-alive
//! HTTP/1.1 connections, each sending the next GET as soon as the previous
//! answer has been read in full, for a fixed time. It runs on one thread of
//! its own, so on a 2-core machine the service keeps at least one core.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;

pub struct LoadResult {
    pub requests: u64,
    pub elapsed: Duration,
    /// Requests finished in each window of `window` length.
    pub per_window: Vec<u64>,
    pub window: Duration,
    /// Latency of every request, in microseconds.
    pub latencies_us: Vec<u32>,
}

impl LoadResult {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// Median of the per-window request rates.
    pub fn median_window_rps(&self) -> f64 {
        let rates: Vec<f64> = self
            .per_window
            .iter()
            .map(|&n| n as f64 / self.window.as_secs_f64())
            .collect();
        crate::stats::median(&rates)
    }
}

/// Sends GETs of `paths` (round robin, each connection from its own start)
/// over `connections` connections for `duration`. Any answer but `200` is
/// an error.
pub fn run(
    addr: SocketAddr,
    paths: Vec<String>,
    connections: usize,
    duration: Duration,
    window: Duration,
) -> Result<LoadResult> {
    let handle = std::thread::spawn(move || -> Result<LoadResult> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(drive(addr, paths, connections, duration, window))
    });
    handle
        .join()
        .map_err(|_| anyhow!("load generator thread panicked"))?
}

async fn drive(
    addr: SocketAddr,
    paths: Vec<String>,
    connections: usize,
    duration: Duration,
    window: Duration,
) -> Result<LoadResult> {
    if paths.is_empty() {
        bail!("no paths to request");
    }
    let paths = std::sync::Arc::new(paths);
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for c in 0..connections {
        let paths = paths.clone();
        tasks.push(tokio::spawn(async move {
            connection(addr, &paths, c * 7919, start, deadline, window).await
        }));
    }
    let windows = duration.as_millis().div_ceil(window.as_millis()) as usize;
    let mut per_window = vec![0u64; windows];
    let mut latencies_us = Vec::new();
    for t in tasks {
        let (lat, win) = t.await??;
        latencies_us.extend(lat);
        for (w, n) in win.into_iter().enumerate() {
            if let Some(slot) = per_window.get_mut(w) {
                *slot += n;
            }
        }
    }
    let elapsed = start.elapsed();
    Ok(LoadResult {
        requests: latencies_us.len() as u64,
        elapsed,
        per_window,
        window,
        latencies_us,
    })
}

async fn connection(
    addr: SocketAddr,
    paths: &[String],
    first: usize,
    start: Instant,
    deadline: Instant,
    window: Duration,
) -> Result<(Vec<u32>, Vec<u64>)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let host = addr.to_string();
    let mut latencies = Vec::with_capacity(1 << 16);
    let mut windows: Vec<u64> = Vec::new();
    let mut i = first;
    loop {
        let sent = Instant::now();
        if sent >= deadline {
            break;
        }
        let path = &paths[i % paths.len()];
        i += 1;
        let req = Request::get(path.as_str())
            .header(hyper::header::HOST, host.as_str())
            .body(Empty::<Bytes>::new())?;
        sender.ready().await?;
        let res = sender.send_request(req).await?;
        let status = res.status();
        let body = res.into_body().collect().await?.to_bytes();
        if status != hyper::StatusCode::OK {
            bail!(
                "GET {path}: {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            );
        }
        let done = Instant::now();
        latencies.push(u32::try_from((done - sent).as_micros()).unwrap_or(u32::MAX));
        let w = ((done - start).as_millis() / window.as_millis()) as usize;
        if windows.len() <= w {
            windows.resize(w + 1, 0);
        }
        windows[w] += 1;
    }
    Ok((latencies, windows))
}
