//! The workloads of issue 8, each against its baseline.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::service::{Service, clean_env, post_json};
use crate::stats::{median, percentile};
use crate::{Ctx, load};

/// Requests the client keeps in flight while submitting "as fast as it can".
const SUBMITTERS: usize = 8;

fn one_step(script: &str) -> Value {
    json!({
        "template": {
            "name": "bench one step",
            "ref_name": "bench-one-step",
            "schema_version": 1,
            "steps": [{"ref_name": "run", "script": script}],
        },
        "max_attempts": 1,
    })
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ---------------------------------------------------------------- workload 1

pub struct W1 {
    pub n: usize,
    pub orch_s: Vec<f64>,
    pub base_s: Vec<f64>,
    /// Of the orchestrator runs: from first submit to the last answer.
    pub submit_s: Vec<f64>,
    /// RSS of a fresh, empty service before the first submit (KiB).
    pub idle_rss_kib: Vec<u64>,
    pub peak_rss_kib: Vec<u64>,
    pub empty_start_s: Vec<f64>,
}

impl W1 {
    pub fn orch(&self) -> f64 {
        median(&self.orch_s)
    }
    pub fn base(&self) -> f64 {
        median(&self.base_s)
    }
    pub fn ratio(&self) -> f64 {
        self.orch() / self.base()
    }
}

/// N one-step workflows submitted over HTTP, against `xargs -P`.
pub async fn independent(ctx: &Ctx, backend: &str) -> Result<W1> {
    let n = ctx.scaled(2000);
    let mut w = W1 {
        n,
        orch_s: vec![],
        base_s: vec![],
        submit_s: vec![],
        idle_rss_kib: vec![],
        peak_rss_kib: vec![],
        empty_start_s: vec![],
    };
    for run in 0..ctx.runs {
        let t = xargs(ctx, n).await?;
        w.base_s.push(secs(t));
        let dir = ctx.tmp.join(format!("w1-{backend}-{run}"));
        let svc = Service::start(ctx, backend, &dir).await?;
        w.empty_start_s.push(secs(svc.started_in));
        tokio::time::sleep(Duration::from_millis(300)).await;
        w.idle_rss_kib.push(svc.rss_kib()?.0);
        let t0 = Instant::now();
        let next = Arc::new(AtomicUsize::new(0));
        let url = svc.url("/workflows");
        let body = Arc::new(one_step("noop.sh"));
        let mut submitters = Vec::new();
        for _ in 0..SUBMITTERS {
            let (next, url, body, http) =
                (next.clone(), url.clone(), body.clone(), svc.http.clone());
            submitters.push(tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < n {
                    post_json(&http, &url, &body).await?;
                }
                anyhow::Ok(())
            }));
        }
        for s in submitters {
            s.await??;
        }
        w.submit_s.push(secs(t0.elapsed()));
        let done = svc
            .wait_completed(n as u64, Duration::from_secs(300))
            .await?;
        w.orch_s.push(secs(done - t0));
        w.peak_rss_kib.push(svc.rss_kib()?.1);
        svc.stop().await?;
        eprintln!(
            "  w1 run {}: xargs {:.3} s, orchestrator {:.3} s",
            run + 1,
            w.base_s[run],
            w.orch_s[run]
        );
    }
    Ok(w)
}

/// `seq N | xargs -P <workers> -n 1 bash noop.sh`: the floor for N tasks.
async fn xargs(ctx: &Ctx, n: usize) -> Result<Duration> {
    let noop = ctx.scripts.join("noop.sh");
    let mut cmd = Command::new("xargs");
    cmd.arg("-P")
        .arg(ctx.workers.to_string())
        .arg("-n")
        .arg("1")
        .arg("bash")
        .arg(&noop)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true);
    clean_env(&mut cmd);
    let mut input = String::with_capacity(n * 6);
    for i in 0..n {
        let _ = writeln!(input, "{i}");
    }
    let t0 = Instant::now();
    let mut child = cmd.spawn().context("cannot run xargs")?;
    let mut stdin = child.stdin.take().ok_or_else(|| anyhow!("no stdin"))?;
    stdin.write_all(input.as_bytes()).await?;
    drop(stdin);
    let status = tokio::time::timeout(Duration::from_secs(300), child.wait())
        .await
        .map_err(|_| anyhow!("xargs baseline took more than 300 s"))??;
    let t = t0.elapsed();
    if !status.success() {
        bail!("xargs baseline failed: {status}");
    }
    Ok(t)
}

// ---------------------------------------------------------------- workload 2

pub struct W2 {
    pub steps: usize,
    pub orch_s: Vec<f64>,
    pub base_s: Vec<f64>,
}

impl W2 {
    pub fn ratio(&self) -> f64 {
        median(&self.orch_s) / median(&self.base_s)
    }
}

const LAYER_WIDTH: usize = 25;

fn layers(ctx: &Ctx) -> usize {
    (ctx.scaled(1000) / LAYER_WIDTH).max(2)
}

/// Step `i` of layer `l` depends on steps `i` and `i+1` (mod width) of the
/// layer before.
fn dag_deps(l: usize, i: usize) -> Vec<String> {
    if l == 0 {
        return vec![];
    }
    vec![
        format!("l{}_{}", l - 1, i),
        format!("l{}_{}", l - 1, (i + 1) % LAYER_WIDTH),
    ]
}

/// One inline 1,000-step template through `POST /workflows` (with `wait`),
/// against `make -j<workers>` on the same DAG.
pub async fn dag(ctx: &Ctx, backend: &str) -> Result<W2> {
    let layers = layers(ctx);
    let makefile = ctx.tmp.join("dag.mk");
    let noop = ctx.scripts.join("noop.sh");
    let mut mk = String::from("# Generated by orchestrator-bench.\n.PHONY: all");
    let mut steps = Vec::new();
    for l in 0..layers {
        for i in 0..LAYER_WIDTH {
            let _ = write!(mk, " l{l}_{i}");
            let deps = dag_deps(l, i);
            steps.push(
                json!({"ref_name": format!("l{l}_{i}"), "script": "noop.sh", "depends_on": deps}),
            );
        }
    }
    mk.push_str("\nall:");
    for i in 0..LAYER_WIDTH {
        let _ = write!(mk, " l{}_{i}", layers - 1);
    }
    mk.push('\n');
    for l in 0..layers {
        for i in 0..LAYER_WIDTH {
            let _ = write!(
                mk,
                "l{l}_{i}: {}\n\tbash {}\n",
                dag_deps(l, i).join(" "),
                noop.display()
            );
        }
    }
    std::fs::write(&makefile, mk)?;
    let body = json!({
        "template": {
            "name": "bench dag",
            "ref_name": "bench-dag",
            "schema_version": 1,
            "steps": steps,
        },
        "max_attempts": 1,
        "wait": true,
        "wait_timeout_secs": 600,
    });
    let mut w = W2 {
        steps: layers * LAYER_WIDTH,
        orch_s: vec![],
        base_s: vec![],
    };
    for run in 0..ctx.runs {
        let mut cmd = Command::new("make");
        cmd.arg("-s")
            .arg("-f")
            .arg(&makefile)
            .arg(format!("-j{}", ctx.workers))
            .arg("all")
            .stdout(Stdio::null())
            .kill_on_drop(true);
        clean_env(&mut cmd);
        let t0 = Instant::now();
        let status = tokio::time::timeout(Duration::from_secs(300), cmd.status())
            .await
            .map_err(|_| anyhow!("make baseline took more than 300 s"))??;
        if !status.success() {
            bail!("make baseline failed: {status}");
        }
        w.base_s.push(secs(t0.elapsed()));

        let svc =
            Service::start(ctx, backend, &ctx.tmp.join(format!("w2-{backend}-{run}"))).await?;
        let t0 = Instant::now();
        let answer = svc.post_json("/workflows", &body).await?;
        let t = t0.elapsed();
        if answer["status"] != json!("completed") {
            bail!("the DAG workflow ended as {}", answer["status"]);
        }
        w.orch_s.push(secs(t));
        svc.stop().await?;
        eprintln!(
            "  w2 run {}: make {:.3} s, orchestrator {:.3} s",
            run + 1,
            w.base_s[run],
            w.orch_s[run]
        );
    }
    Ok(w)
}

// ------------------------------------------------------- workloads 3 and 4

pub struct Latency {
    pub rate: u32,
    pub secs_per_run: u64,
    pub samples: usize,
    /// Per run: p50, p95, p99 in milliseconds.
    pub runs: Vec<[f64; 3]>,
}

impl Latency {
    pub fn median(&self, k: usize) -> f64 {
        median(&self.runs.iter().map(|r| r[k]).collect::<Vec<_>>())
    }
}

pub struct Reads {
    pub connections: usize,
    pub secs: u64,
    pub by_id: load::LoadResult,
    pub list: load::LoadResult,
    pub stored: usize,
}

pub struct LatencyAndReads {
    /// The rate of the target (100/s, several runs), then a low rate (one run).
    pub latency: Vec<Latency>,
    /// Spawning the same script directly: p50, p95, p99 in milliseconds.
    pub floor: [f64; 3],
    pub reads: Reads,
}

/// Submit → script start at a steady rate, then the read load on the same
/// service (which then holds those tasks).
pub async fn latency_and_reads(ctx: &Ctx, backend: &str) -> Result<LatencyAndReads> {
    let secs_per_run = if ctx.scale < 1.0 { 3 } else { 10 };
    let floor = spawn_floor(ctx).await?;
    let svc = Service::start(ctx, backend, &ctx.tmp.join(format!("w3-{backend}"))).await?;
    let body = Arc::new(one_step("stamp.sh"));
    let url = svc.url("/workflows");
    let mut submitted: HashMap<String, f64> = HashMap::new();
    let mut plan: Vec<(u32, Vec<Vec<String>>)> = vec![(100, vec![]), (20, vec![])];
    for (rate, runs_ids) in plan.iter_mut() {
        let runs = if *rate == 100 { ctx.runs } else { 1 };
        for _ in 0..runs {
            let mut tick =
                tokio::time::interval(Duration::from_micros(1_000_000 / u64::from(*rate)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut handles = Vec::new();
            for _ in 0..(u64::from(*rate) * secs_per_run) {
                tick.tick().await;
                let (http, url, body) = (svc.http.clone(), url.clone(), body.clone());
                handles.push(tokio::spawn(async move {
                    let at = unix_now();
                    let answer = post_json(&http, &url, &body).await?;
                    let id = answer["task_ids"][0]
                        .as_str()
                        .ok_or_else(|| anyhow!("no task id in {answer}"))?
                        .to_owned();
                    anyhow::Ok((id, at))
                }));
            }
            let mut ids = Vec::new();
            for h in handles {
                let (id, at) = h.await??;
                submitted.insert(id.clone(), at);
                ids.push(id);
            }
            runs_ids.push(ids);
            svc.wait_completed(submitted.len() as u64, Duration::from_secs(120))
                .await?;
            // Let the last completions settle before the next run.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let stamps = read_stamps(&svc.data_dir.join("bench-stamps.txt"))?;
    let mut latency = Vec::new();
    for (rate, runs_ids) in &plan {
        let mut runs = Vec::new();
        let mut samples = 0;
        for ids in runs_ids {
            let mut ms: Vec<f64> = Vec::new();
            for id in ids {
                let start = stamps
                    .get(id)
                    .ok_or_else(|| anyhow!("task {id} completed but its script left no stamp"))?;
                ms.push((start - submitted[id]) * 1000.0);
            }
            ms.sort_by(f64::total_cmp);
            samples += ms.len();
            runs.push([
                percentile(&ms, 50.0),
                percentile(&ms, 95.0),
                percentile(&ms, 99.0),
            ]);
        }
        eprintln!("  w3 at {rate}/s: per-run p50/p95/p99 ms: {runs:?}");
        latency.push(Latency {
            rate: *rate,
            secs_per_run,
            samples,
            runs,
        });
    }
    eprintln!("  w3 floor (direct spawn) p50/p95/p99 ms: {floor:?}");

    // Workload 4 on the same service.
    let secs = if ctx.scale < 1.0 { 3 } else { 15 };
    let connections = 16;
    let ids: Vec<String> = submitted.keys().map(|id| format!("/tasks/{id}")).collect();
    let stored = ids.len();
    let addr = svc.addr;
    let window = Duration::from_secs(secs / 3);
    let by_id = tokio::task::spawn_blocking(move || {
        load::run(addr, ids, connections, Duration::from_secs(secs), window)
    })
    .await??;
    let list = tokio::task::spawn_blocking(move || {
        load::run(
            addr,
            vec!["/tasks?limit=50".to_owned()],
            connections,
            Duration::from_secs(secs),
            window,
        )
    })
    .await??;
    eprintln!(
        "  w4: GET /tasks/{{id}} {:.0} rps, GET /tasks?limit=50 {:.0} rps",
        by_id.rps(),
        list.rps()
    );
    svc.stop().await?;
    Ok(LatencyAndReads {
        latency,
        floor,
        reads: Reads {
            connections,
            secs,
            by_id,
            list,
            stored,
        },
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

fn read_stamps(path: &Path) -> Result<HashMap<String, f64>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("no stamps in {}", path.display()))?;
    let mut stamps = HashMap::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if let (Some(id), Some(t)) = (parts.next(), parts.next())
            && let Ok(t) = t.replace(',', ".").parse::<f64>()
        {
            stamps.insert(id.to_owned(), t);
        }
    }
    Ok(stamps)
}

/// The floor of workload 3: from just before spawning `bash stamp.sh`
/// (stdin and stdout piped, as the executor does) to its first line.
async fn spawn_floor(ctx: &Ctx) -> Result<[f64; 3]> {
    let dir = ctx.tmp.join("floor");
    std::fs::create_dir_all(&dir)?;
    let mut at = HashMap::new();
    for i in 0..200 {
        let id = format!("floor-{i}");
        let mut cmd = Command::new("bash");
        cmd.arg(ctx.scripts.join("stamp.sh"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        clean_env(&mut cmd);
        cmd.env("ORCHESTRATOR_TASK_ID", &id)
            .env("ORCHESTRATOR_DATA_DIR", &dir);
        at.insert(id, unix_now());
        let mut child = cmd.spawn()?;
        if let Some(mut stdin) = child.stdin.take() {
            // The script does not read its input; it may be gone already.
            let _ = stdin.write_all(b"{}").await;
        }
        let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
            .await
            .map_err(|_| anyhow!("stamp.sh took more than 10 s"))??;
        if !out.status.success() {
            bail!("stamp.sh failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    let stamps = read_stamps(&dir.join("bench-stamps.txt"))?;
    let mut ms: Vec<f64> = at
        .iter()
        .filter_map(|(id, t)| stamps.get(id).map(|s| (s - t) * 1000.0))
        .collect();
    ms.sort_by(f64::total_cmp);
    Ok([
        percentile(&ms, 50.0),
        percentile(&ms, 95.0),
        percentile(&ms, 99.0),
    ])
}

// ---------------------------------------------------------------- workload 5

pub struct Scale {
    pub tasks: usize,
    pub generate_s: f64,
    pub snapshot_mib: f64,
    pub start_s: Vec<f64>,
    pub rss_loaded_kib: u64,
    pub rss_after_kib: u64,
    pub hwm_after_kib: u64,
    /// (label, p50 ms, p99 ms)
    pub lists: Vec<(String, f64, f64)>,
}

const SEED_OK: usize = 90;
const SEED_FAILED: usize = 10;

/// 100,000 stored tasks (written in the documented snapshot layout from the
/// records of a real run), then start-up, RSS and filtered list latency.
pub async fn scale(ctx: &Ctx) -> Result<Scale> {
    let backend = "filesystem";
    let per_wf = SEED_OK + SEED_FAILED;
    let workflows = ctx.scaled(100_000) / per_wf;
    let t0 = Instant::now();
    let seed_dir = ctx.tmp.join("w5-seed");
    let seed = seed_records(ctx, &seed_dir).await?;
    let dir = ctx.tmp.join("w5-data");
    let snapshot_bytes = crate::dataset::write(&seed, &seed_dir, &dir, workflows)?;
    let generate_s = secs(t0.elapsed());
    let tasks = workflows * per_wf;

    let mut start_s = Vec::new();
    for _ in 0..ctx.runs.saturating_sub(1) {
        let svc = Service::start(ctx, backend, &dir).await?;
        start_s.push(secs(svc.started_in));
        svc.stop().await?;
    }
    let svc = Service::start(ctx, backend, &dir).await?;
    start_s.push(secs(svc.started_in));
    let total = svc.get_json("/tasks?limit=1").await?["total"]
        .as_u64()
        .unwrap_or_default();
    if total != tasks as u64 {
        bail!("the service reports {total} tasks, expected {tasks}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_loaded_kib = svc.rss_kib()?.0;
    let some_workflow = svc.get_json("/workflows?limit=1&offset=10").await?["workflows"][0]["id"]
        .as_str()
        .ok_or_else(|| anyhow!("no workflow listed"))?
        .to_owned();
    let deep = (tasks / 2).min(50_000);
    let queries = [
        (
            format!("/tasks?status=failed&limit=50&offset={}", tasks / 20),
            "status=failed, limit=50, offset=5% (deep page)".to_owned(),
        ),
        (
            "/tasks?status=completed&limit=50".to_owned(),
            "status=completed, limit=50".to_owned(),
        ),
        (
            format!("/tasks?workflow={some_workflow}&limit=50&offset=50"),
            "workflow=<id>, limit=50, offset=50".to_owned(),
        ),
        (
            format!("/tasks?limit=50&offset={deep}"),
            format!("no filter, limit=50, offset={deep}"),
        ),
    ];
    let mut lists = Vec::new();
    for (path, label) in &queries {
        let mut ms = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            let page = svc.get_json(path).await?;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            if page["tasks"].as_array().is_none_or(|a| a.is_empty()) {
                bail!("{path} returned no tasks");
            }
        }
        ms.sort_by(f64::total_cmp);
        lists.push((label.clone(), percentile(&ms, 50.0), percentile(&ms, 99.0)));
    }
    let (rss_after_kib, hwm_after_kib) = svc.rss_kib()?;
    svc.stop().await?;
    eprintln!("  w5: {tasks} tasks, start-up {start_s:?} s, lists {lists:?}");
    Ok(Scale {
        tasks,
        generate_s,
        snapshot_mib: snapshot_bytes as f64 / (1024.0 * 1024.0),
        start_s,
        rss_loaded_kib,
        rss_after_kib,
        hwm_after_kib,
        lists,
    })
}

/// Runs one real workflow of 90 no-op and 10 failing steps, stops the
/// service, and returns its final records.
async fn seed_records(ctx: &Ctx, dir: &Path) -> Result<crate::dataset::Seed> {
    let svc = Service::start(ctx, "filesystem", dir).await?;
    let mut steps = Vec::new();
    for i in 0..SEED_OK {
        steps.push(json!({"ref_name": format!("ok{i:02}"), "script": "noop.sh"}));
    }
    for i in 0..SEED_FAILED {
        steps.push(json!({"ref_name": format!("fail{i}"), "script": "fail.sh", "retries": 0}));
    }
    let answer = svc
        .post_json(
            "/workflows",
            &json!({
                "template": {"name": "bench seed", "ref_name": "bench-seed", "schema_version": 1, "on_failure": "continue", "steps": steps},
                "max_attempts": 1,
                "wait": true,
                "wait_timeout_secs": 300,
            }),
        )
        .await?;
    // `on_failure: continue`: every step ran; the 10 failures fail the workflow.
    if answer["status"] != json!("failed") {
        bail!(
            "the seed workflow ended as {}, expected failed",
            answer["status"]
        );
    }
    svc.stop().await?;
    crate::dataset::read_seed(dir)
}

// ---------------------------------------------------------------- workload 6

/// Whether the binary has a `migrate` subcommand.
pub async fn has_migrate(ctx: &Ctx) -> Result<bool> {
    let out = Command::new(&ctx.orchestrator)
        .arg("--help")
        .output()
        .await?;
    let help = String::from_utf8_lossy(&out.stdout);
    Ok(help
        .lines()
        .any(|l| l.trim_start().starts_with("migrate ") || l.trim() == "migrate"))
}
