//! The workloads of issue 8, each against its baseline.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
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
    /// The anonymous part of `idle_rss_kib`.
    pub idle_anon_kib: Vec<u64>,
    pub peak_rss_kib: Vec<u64>,
    /// RSS once every workflow has finished (and a second has passed): what
    /// their history costs a running service.
    pub done_rss_kib: Vec<u64>,
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
        idle_anon_kib: vec![],
        peak_rss_kib: vec![],
        done_rss_kib: vec![],
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
        w.idle_anon_kib.push(svc.anon_rss_kib()?);
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
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (done_rss, peak_rss) = svc.rss_kib()?;
        w.done_rss_kib.push(done_rss);
        w.peak_rss_kib.push(peak_rss);
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
pub async fn xargs(ctx: &Ctx, n: usize) -> Result<Duration> {
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

// ---------------------------------------------------------------- workload 7

/// Workload 7's sizes: steps in one workflow.
const W7_SIZES: [usize; 4] = [250, 1_000, 4_000, 10_000];
/// Width of workload 7's DAG layers: 4,000 steps are 80 layers × 50.
pub const W7_WIDTH: usize = 50;
/// Above this many steps, a size runs once instead of `--runs` times, so
/// that the whole workload stays within about two minutes.
const W7_MEDIAN_UP_TO: usize = 1_000;

/// The shape of workload 7's workflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// N steps without dependencies, against `xargs -P`.
    Independent,
    /// N / 50 layers of 50, as workload 2, against `make -j`.
    Dag,
}

/// One shape at one size.
pub struct OneWorkflow {
    pub shape: Shape,
    pub steps: usize,
    pub orch_s: Vec<f64>,
    pub base_s: Vec<f64>,
}

impl OneWorkflow {
    /// Milliseconds per step, orchestrator and baseline (medians).
    pub fn per_step_ms(&self) -> (f64, f64) {
        let n = self.steps as f64;
        (
            median(&self.orch_s) / n * 1000.0,
            median(&self.base_s) / n * 1000.0,
        )
    }
    pub fn ratio(&self) -> f64 {
        median(&self.orch_s) / median(&self.base_s)
    }
}

/// Workload 7: one workflow of N steps, for each shape and size.
pub struct W7 {
    pub rows: Vec<OneWorkflow>,
}

impl W7 {
    /// Per-step overhead at the largest size over that at the smallest,
    /// per shape: the target is at most 1.5.
    pub fn growth(&self, shape: Shape) -> Option<f64> {
        let rows: Vec<&OneWorkflow> = self.rows.iter().filter(|r| r.shape == shape).collect();
        let (first, last) = (rows.first()?, rows.last()?);
        Some(last.per_step_ms().0 / first.per_step_ms().0)
    }
}

/// Step `i` of layer `l` of workload 7's DAG depends on steps `i` and
/// `i+1` (mod width) of the layer before, as in workload 2.
fn w7_deps(shape: Shape, l: usize, i: usize) -> Vec<String> {
    if shape == Shape::Independent || l == 0 {
        return vec![];
    }
    vec![
        format!("s{}_{}", l - 1, i),
        format!("s{}_{}", l - 1, (i + 1) % W7_WIDTH),
    ]
}

/// One workflow of N no-op steps (one inline template, `wait`), for N in
/// `W7_SIZES`, without and with dependencies: whether the cost per step
/// stays flat as the workflow grows (issue 18).
pub async fn one_workflow(ctx: &Ctx, backend: &str) -> Result<W7> {
    let mut w = W7 { rows: Vec::new() };
    for shape in [Shape::Independent, Shape::Dag] {
        for size in W7_SIZES {
            let layers = (ctx.scaled(size) / W7_WIDTH).max(1);
            let steps = layers * W7_WIDTH;
            let runs = if size <= W7_MEDIAN_UP_TO { ctx.runs } else { 1 };
            let mut row = OneWorkflow {
                shape,
                steps,
                orch_s: vec![],
                base_s: vec![],
            };
            let makefile = ctx.tmp.join(format!("w7-{steps}.mk"));
            let noop = ctx.scripts.join("noop.sh");
            let mut template_steps = Vec::with_capacity(steps);
            let mut mk = String::from("# Generated by orchestrator-bench.\n");
            for l in 0..layers {
                for i in 0..W7_WIDTH {
                    let deps = w7_deps(shape, l, i);
                    let _ = write!(
                        mk,
                        "s{l}_{i}: {}\n\tbash {}\n",
                        deps.join(" "),
                        noop.display()
                    );
                    template_steps.push(
                        json!({"ref_name": format!("s{l}_{i}"), "script": "noop.sh", "depends_on": deps}),
                    );
                }
            }
            mk.push_str("all:");
            for i in 0..W7_WIDTH {
                let _ = write!(mk, " s{}_{i}", layers - 1);
            }
            mk.push('\n');
            if shape == Shape::Dag {
                std::fs::write(&makefile, mk)?;
            }
            let body = json!({
                "template": {
                    "name": "bench one workflow",
                    "ref_name": "bench-one-workflow",
                    "schema_version": 1,
                    "steps": template_steps,
                },
                "max_attempts": 1,
                "wait": true,
                "wait_timeout_secs": 600,
            });
            for run in 0..runs {
                let base = match shape {
                    Shape::Independent => xargs(ctx, steps).await?,
                    Shape::Dag => make(ctx, &makefile).await?,
                };
                row.base_s.push(secs(base));
                let dir = ctx
                    .tmp
                    .join(format!("w7-{backend}-{shape:?}-{steps}-{run}"));
                let svc = Service::start(ctx, backend, &dir).await?;
                let t0 = Instant::now();
                let answer = svc.post_json("/workflows", &body).await?;
                let t = t0.elapsed();
                if answer["status"] != json!("completed") {
                    bail!(
                        "the {steps}-step workflow ({shape:?}) ended as {}",
                        answer["status"]
                    );
                }
                row.orch_s.push(secs(t));
                svc.stop().await?;
                if !ctx.keep {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                eprintln!(
                    "  w7 {shape:?} {steps} steps, run {}: baseline {:.3} s, orchestrator {:.3} s",
                    run + 1,
                    row.base_s[run],
                    row.orch_s[run]
                );
            }
            w.rows.push(row);
        }
    }
    Ok(w)
}

/// `make -s -f <makefile> -j<workers> all`: the floor for a DAG.
pub async fn make(ctx: &Ctx, makefile: &Path) -> Result<Duration> {
    let mut cmd = Command::new("make");
    cmd.arg("-s")
        .arg("-f")
        .arg(makefile)
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
    Ok(t0.elapsed())
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
    // The scripts' state dir: their ORCHESTRATOR_DATA_DIR.
    let stamps = read_stamps(&svc.data_dir.join("script-state").join("bench-stamps.txt"))?;
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

/// A generated data directory in the filesystem layout, with task logs.
pub struct DataSet {
    pub dir: PathBuf,
    pub workflows: usize,
    pub tasks: usize,
    pub snapshot_bytes: u64,
    pub logs: usize,
    pub log_bytes: u64,
}

const SEED_OK: usize = 90;
const SEED_FAILED: usize = 10;
const PER_WORKFLOW: usize = SEED_OK + SEED_FAILED;

/// The data sets of workloads 5 and 6, one per `(directory name, tasks)`
/// (scaled), all copied from the records of one real seed run.
pub async fn datasets(ctx: &Ctx, sizes: &[(&str, usize)]) -> Result<Vec<DataSet>> {
    let t0 = Instant::now();
    let seed_dir = ctx.tmp.join("w5-seed");
    let seed = seed_records(ctx, &seed_dir).await?;
    let mut sets = Vec::new();
    for (name, tasks) in sizes {
        let workflows = (ctx.scaled(*tasks) / PER_WORKFLOW).max(1);
        let dir = ctx.tmp.join(name);
        let written = crate::dataset::write(&seed, &seed_dir, &dir, workflows)?;
        sets.push(DataSet {
            dir,
            workflows,
            tasks: workflows * PER_WORKFLOW,
            snapshot_bytes: written.snapshot_bytes,
            logs: written.logs,
            log_bytes: written.log_bytes,
        });
    }
    eprintln!(
        "  data sets {:?} generated in {:.1} s",
        sizes.iter().map(|(name, _)| name).collect::<Vec<_>>(),
        secs(t0.elapsed())
    );
    Ok(sets)
}

pub struct ListLatency {
    pub label: String,
    pub samples: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

pub struct Scale {
    pub backend: String,
    pub tasks: usize,
    pub logs: usize,
    /// The stored data: the snapshot (filesystem) or the database directory.
    pub data_mib: f64,
    /// How long `orchestrator migrate` took to convert the generated data
    /// set into this backend (`None`: the data set itself).
    pub converted_s: Option<f64>,
    pub start_s: Vec<f64>,
    pub rss_loaded_kib: u64,
    pub rss_after_kib: u64,
    pub hwm_after_kib: u64,
    pub lists: Vec<ListLatency>,
}

/// The path of a list query's `i`-th request.
type PathOf = Box<dyn Fn(usize) -> String>;

/// Requests per list query, unless [`LIST_LIMIT`] passes first.
const LIST_REQUESTS: usize = 200;
const LIST_LIMIT: Duration = Duration::from_secs(10);

/// The stored tasks of `data` (in `dir`, in `backend`'s layout): start-up,
/// RSS and filtered list latency.
pub async fn scale(
    ctx: &Ctx,
    backend: &str,
    data: &DataSet,
    dir: &Path,
    converted_s: Option<f64>,
) -> Result<Scale> {
    let tasks = data.tasks;
    let data_bytes = if backend == "filesystem" {
        data.snapshot_bytes
    } else {
        dir_size(dir)
    };
    let mut start_s = Vec::new();
    for _ in 0..ctx.runs.saturating_sub(1) {
        let svc = Service::start(ctx, backend, dir).await?;
        start_s.push(secs(svc.started_in));
        svc.stop().await?;
    }
    let svc = Service::start(ctx, backend, dir).await?;
    start_s.push(secs(svc.started_in));
    let total = svc.get_json("/tasks?limit=1").await?["total"]
        .as_u64()
        .unwrap_or_default();
    if total != tasks as u64 {
        bail!("the service reports {total} tasks, expected {tasks}");
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_loaded_kib = svc.rss_kib()?.0;
    let listed = svc
        .get_json(&format!("/workflows?limit={LIST_REQUESTS}&offset=10"))
        .await?;
    let workflows: Vec<String> = listed["workflows"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|w| w["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    // 1,000 workflows at full scale: each request reads another one (a
    // scaled run may go round them).
    if workflows.is_empty() {
        bail!("no workflow listed");
    }
    let deep = (tasks / 2).min(50_000);
    // Each request of a query asks for a page of its own, one task further
    // on (offset + i, or the cursor of the i-th task): a store may keep the
    // pages it answered lately (the embedded one does, until a write), and
    // this measures answering one, not recalling it.
    // The keyset cursors that reach the same pages as the deep offsets:
    // the ids just before each.
    let svc_ref = &svc;
    let cursors = |path: String| async move {
        let page = svc_ref.get_json(&path).await?;
        let ids: Vec<String> = page["tasks"]
            .as_array()
            .map(|tasks| {
                tasks
                    .iter()
                    .filter_map(|t| t["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        if ids.len() < LIST_REQUESTS {
            bail!("{path} listed {} tasks, not {LIST_REQUESTS}", ids.len());
        }
        Ok(ids)
    };
    let failed_after = cursors(format!(
        "/tasks?status=failed&limit={LIST_REQUESTS}&offset={}",
        (tasks / 20).saturating_sub(1)
    ))
    .await?;
    let deep_after = cursors(format!(
        "/tasks?limit={LIST_REQUESTS}&offset={}",
        deep.saturating_sub(1)
    ))
    .await?;
    let failed_deep = tasks / 20;
    let queries: Vec<(PathOf, String)> = vec![
        (
            Box::new(move |i| format!("/tasks?status=failed&limit=50&offset={}", failed_deep + i)),
            "status=failed, limit=50, offset=5% (deep page)".to_owned(),
        ),
        (
            Box::new(|i| format!("/tasks?status=completed&limit=50&offset={i}")),
            "status=completed, limit=50, first pages (offset 0–199)".to_owned(),
        ),
        (
            Box::new(move |i| {
                format!(
                    "/tasks?workflow={}&limit=50&offset=50",
                    workflows[i % workflows.len()]
                )
            }),
            "workflow=<id>, limit=50, offset=50 (another workflow each time)".to_owned(),
        ),
        (
            Box::new(move |i| format!("/tasks?limit=50&offset={}", deep + i)),
            format!("no filter, limit=50, offset={deep}"),
        ),
        (
            Box::new(move |i| format!("/tasks?status=failed&limit=50&after={}", failed_after[i])),
            "status=failed, limit=50, after=<the deep page's cursor> (keyset)".to_owned(),
        ),
        (
            Box::new(move |i| format!("/tasks?limit=50&after={}", deep_after[i])),
            format!("no filter, limit=50, after=<the cursor at {deep}> (keyset)"),
        ),
    ];
    let mut lists = Vec::new();
    for (path_of, label) in &queries {
        let mut ms = Vec::new();
        let t0 = Instant::now();
        while ms.len() < LIST_REQUESTS && (ms.len() < 5 || t0.elapsed() < LIST_LIMIT) {
            let path = path_of(ms.len());
            let t = Instant::now();
            let page = svc.get_json(&path).await?;
            ms.push(t.elapsed().as_secs_f64() * 1000.0);
            if page["tasks"].as_array().is_none_or(|a| a.is_empty()) {
                bail!("{path} returned no tasks");
            }
        }
        ms.sort_by(f64::total_cmp);
        lists.push(ListLatency {
            label: label.clone(),
            samples: ms.len(),
            p50_ms: percentile(&ms, 50.0),
            p99_ms: percentile(&ms, 99.0),
        });
    }
    let (rss_after_kib, hwm_after_kib) = svc.rss_kib()?;
    svc.stop().await?;
    eprintln!(
        "  w5 ({backend}): {tasks} tasks, start-up {start_s:?} s, lists {:?}",
        lists
            .iter()
            .map(|l| (l.samples, l.p50_ms, l.p99_ms))
            .collect::<Vec<_>>()
    );
    Ok(Scale {
        backend: backend.to_owned(),
        tasks,
        logs: data.logs,
        data_mib: data_bytes as f64 / (1024.0 * 1024.0),
        converted_s,
        start_s,
        rss_loaded_kib,
        rss_after_kib,
        hwm_after_kib,
        lists,
    })
}

/// Bytes of every file under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_size(&e.path()),
            Ok(_) => e.metadata().map(|m| m.len()).unwrap_or_default(),
            Err(_) => 0,
        })
        .sum()
}

/// Runs one real workflow of 90 no-op and 10 failing steps, stops the
/// service, and returns its final records.
async fn seed_records(ctx: &Ctx, dir: &Path) -> Result<crate::dataset::Seed> {
    // `on_failure: continue`: every step runs; the failures fail the workflow.
    seed_run(ctx, dir, SEED_OK, SEED_FAILED, "failed").await
}

/// One real workflow of `ok` no-op steps and `failed` failing ones, which
/// must end `status`; its final records, read back from `dir`.
async fn seed_run(
    ctx: &Ctx,
    dir: &Path,
    ok: usize,
    failed: usize,
    status: &str,
) -> Result<crate::dataset::Seed> {
    let svc = Service::start(ctx, "filesystem", dir).await?;
    let mut steps = Vec::new();
    for i in 0..ok {
        steps.push(json!({"ref_name": format!("ok{i:02}"), "script": "noop.sh"}));
    }
    for i in 0..failed {
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
    if answer["status"] != json!(status) {
        bail!(
            "the seed workflow ended as {}, expected {status}",
            answer["status"]
        );
    }
    svc.stop().await?;
    crate::dataset::read_seed(dir)
}

/// Finished one-step workflows at rest in a filesystem store, against an
/// empty one: what finished history costs in memory.
pub struct History {
    pub workflows: usize,
    pub snapshot_bytes: u64,
    pub empty_rss_kib: u64,
    pub loaded_rss_kib: u64,
    pub start_s: f64,
}

/// How many finished one-step workflows [`history`] stores (scaled).
pub const HISTORY_WORKFLOWS: usize = 100_000;

/// Copies of one real one-step workflow (with its task's log), as a store
/// left them; the service's RSS once it has loaded them, and on an empty
/// data dir, measured alike.
pub async fn history(ctx: &Ctx) -> Result<History> {
    let seed_dir = ctx.tmp.join("w5-history-seed");
    let seed = seed_run(ctx, &seed_dir, 1, 0, "completed").await?;
    let workflows = ctx.scaled(HISTORY_WORKFLOWS).max(1);
    let dir = ctx.tmp.join("w5-history");
    let written = crate::dataset::write(&seed, &seed_dir, &dir, workflows)?;
    let rss_at_rest = async |svc: &Service| -> Result<u64> {
        // What start-up allocated and freed settles first.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(svc.rss_kib()?.0)
    };
    let empty = Service::start(ctx, "filesystem", &ctx.tmp.join("w5-history-empty")).await?;
    let empty_rss_kib = rss_at_rest(&empty).await?;
    empty.stop().await?;
    let svc = Service::start(ctx, "filesystem", &dir).await?;
    let start_s = secs(svc.started_in);
    let total = svc.get_json("/workflows?limit=1").await?["total"]
        .as_u64()
        .unwrap_or_default();
    if total != workflows as u64 {
        bail!("the service reports {total} workflows, expected {workflows}");
    }
    let loaded_rss_kib = rss_at_rest(&svc).await?;
    svc.stop().await?;
    if !ctx.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(History {
        workflows,
        snapshot_bytes: written.snapshot_bytes,
        empty_rss_kib,
        loaded_rss_kib,
        start_s,
    })
}

// ---------------------------------------------------------------- workload 6

/// One `orchestrator migrate` process.
#[derive(Clone)]
pub struct MoveRun {
    pub workflows: u64,
    pub tasks: u64,
    pub logs: u64,
    pub log_bytes: u64,
    /// Spawn → exit of the process.
    pub wall_s: f64,
    /// User + system CPU time of the process.
    pub cpu_s: f64,
    /// Peak RSS (`ru_maxrss` of the reaped process).
    pub maxrss_kib: u64,
}

impl MoveRun {
    pub fn records(&self) -> u64 {
        self.workflows + self.tasks
    }
    pub fn rate(&self) -> f64 {
        self.records() as f64 / self.wall_s
    }
}

/// The runs of one direction.
pub struct Direction {
    pub from: String,
    pub to: String,
    pub runs: Vec<MoveRun>,
    /// One run on the small data set, to see whether memory grows with it.
    pub small: Option<MoveRun>,
}

impl Direction {
    pub fn rates(&self) -> Vec<f64> {
        self.runs.iter().map(MoveRun::rate).collect()
    }
    pub fn rate(&self) -> f64 {
        median(&self.rates())
    }
    pub fn wall_s(&self) -> Vec<f64> {
        self.runs.iter().map(|r| r.wall_s).collect()
    }
    pub fn cpu_s(&self) -> f64 {
        median(&self.runs.iter().map(|r| r.cpu_s).collect::<Vec<_>>())
    }
    pub fn maxrss_kib(&self) -> u64 {
        median(
            &self
                .runs
                .iter()
                .map(|r| r.maxrss_kib as f64)
                .collect::<Vec<_>>(),
        ) as u64
    }
}

pub struct Migration {
    pub workflows: usize,
    pub tasks: usize,
    pub logs: usize,
    pub log_bytes: u64,
    pub small_tasks: Option<usize>,
    pub directions: Vec<Direction>,
    /// The embedded store of the first filesystem → embedded run, kept for
    /// workload 5, and how long that migration took.
    pub embedded: Option<(PathBuf, f64)>,
}

/// Further runs of workload 6 start only while it has taken less than this.
const MIGRATION_BUDGET: Duration = Duration::from_secs(150);
/// One `orchestrator migrate` may take this long before it counts as failed.
const MIGRATE_LIMIT: Duration = Duration::from_secs(900);

fn spec(backend: &str, dir: &Path) -> String {
    format!("{backend}:{}", dir.display())
}

/// Filesystem → `other` into a fresh store, then back into a fresh
/// filesystem directory, each a timed `orchestrator migrate` process.
/// Up to `ctx.runs` rounds while [`MIGRATION_BUDGET`] lasts, then one round
/// on the small data set (for how peak memory grows with the store).
pub async fn migration(
    ctx: &Ctx,
    data: &DataSet,
    small: Option<&DataSet>,
    other: &str,
) -> Result<Migration> {
    if !has_migrate(ctx).await? {
        bail!("{} has no `migrate` command", ctx.orchestrator.display());
    }
    let mut there = Direction {
        from: "filesystem".to_owned(),
        to: other.to_owned(),
        runs: vec![],
        small: None,
    };
    let mut back = Direction {
        from: other.to_owned(),
        to: "filesystem".to_owned(),
        runs: vec![],
        small: None,
    };
    let mut embedded = None;
    let t0 = Instant::now();
    for run in 0..ctx.runs {
        let a = ctx.tmp.join(format!("w6-{run}-{other}"));
        let b = ctx.tmp.join(format!("w6-{run}-back"));
        let r1 = migrate(ctx, ("filesystem", &data.dir), (other, &a), data).await?;
        let r2 = migrate(ctx, (other, &a), ("filesystem", &b), data).await?;
        eprintln!(
            "  w6 run {}: filesystem → {other} {:.3} s ({:.0} records/s, peak RSS {} KiB), back {:.3} s ({:.0} records/s, peak RSS {} KiB)",
            run + 1,
            r1.wall_s,
            r1.rate(),
            r1.maxrss_kib,
            r2.wall_s,
            r2.rate(),
            r2.maxrss_kib
        );
        if run == 0 && other != "filesystem" {
            embedded = Some((a.clone(), r1.wall_s));
        } else if !ctx.keep {
            let _ = std::fs::remove_dir_all(&a);
        }
        if !ctx.keep {
            let _ = std::fs::remove_dir_all(&b);
        }
        there.runs.push(r1);
        back.runs.push(r2);
        if t0.elapsed() > MIGRATION_BUDGET {
            break;
        }
    }
    if let Some(small) = small {
        let a = ctx.tmp.join(format!("w6-small-{other}"));
        let b = ctx.tmp.join("w6-small-back");
        let r1 = migrate(ctx, ("filesystem", &small.dir), (other, &a), small).await?;
        let r2 = migrate(ctx, (other, &a), ("filesystem", &b), small).await?;
        eprintln!(
            "  w6 small ({} tasks): peak RSS {} KiB there, {} KiB back",
            small.tasks, r1.maxrss_kib, r2.maxrss_kib
        );
        there.small = Some(r1);
        back.small = Some(r2);
    }
    Ok(Migration {
        workflows: data.workflows,
        tasks: data.tasks,
        logs: data.logs,
        log_bytes: data.log_bytes,
        small_tasks: small.map(|s| s.tasks),
        directions: vec![there, back],
        embedded,
    })
}

/// Converts `data` into a fresh embedded store, for workload 5 when
/// workload 6 did not leave one. Returns the data dir and the time taken.
pub async fn convert(ctx: &Ctx, data: &DataSet, backend: &str) -> Result<(PathBuf, f64)> {
    let dir = ctx.tmp.join(format!("w5-{backend}"));
    let run = migrate(ctx, ("filesystem", &data.dir), (backend, &dir), data).await?;
    Ok((dir, run.wall_s))
}

/// One `orchestrator migrate --from … --to … --json` into a store that does
/// not exist yet, run under `orchestrator-bench`'s own reaper (see
/// `rusage.rs`) for its wall time, CPU time and peak RSS. Fails unless it
/// read and wrote every record and log of `expect`.
async fn migrate(
    ctx: &Ctx,
    from: (&str, &Path),
    to: (&str, &Path),
    expect: &DataSet,
) -> Result<MoveRun> {
    let usage_path = to.1.with_extension("rusage.json");
    let log_path = to.1.with_extension("migrate.log");
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg(crate::rusage::WRAP)
        .arg(&usage_path)
        .arg(&ctx.orchestrator)
        .arg("migrate")
        .arg("--from")
        .arg(spec(from.0, from.1))
        .arg("--to")
        .arg(spec(to.0, to.1))
        .arg("--json")
        .current_dir(&ctx.tmp)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log_path)?)
        .kill_on_drop(true);
    clean_env(&mut cmd);
    let what = format!("orchestrator migrate {} → {}", from.0, to.0);
    let out = tokio::time::timeout(MIGRATE_LIMIT, cmd.output())
        .await
        .map_err(|_| anyhow!("{what} took more than {MIGRATE_LIMIT:?}"))??;
    if !out.status.success() {
        bail!(
            "{what} failed ({}); its log ({}) ends with:\n{}",
            out.status,
            log_path.display(),
            tail_of(&log_path)
        );
    }
    let usage = crate::rusage::Usage::read(&usage_path)?;
    let summary: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{what}: the --json summary"))?;
    let kind = |name: &str, field: &str| {
        summary["copy"]["kinds"]
            .as_array()
            .and_then(|kinds| kinds.iter().find(|k| k["kind"] == json!(name)))
            .and_then(|k| k[field].as_u64())
            .ok_or_else(|| anyhow!("{what}: no copy.kinds[{name}].{field} in {summary}"))
    };
    let run = MoveRun {
        workflows: kind("workflow", "read")?,
        tasks: kind("task", "read")?,
        logs: summary["copy"]["logs"].as_u64().unwrap_or_default(),
        log_bytes: summary["copy"]["log_bytes"].as_u64().unwrap_or_default(),
        wall_s: usage.wall_s,
        cpu_s: usage.user_s + usage.sys_s,
        maxrss_kib: usage.maxrss_kib,
    };
    let written = (kind("workflow", "written")?, kind("task", "written")?);
    let unreadable = summary["copy"]["unreadable"].as_array().map_or(0, Vec::len);
    if (run.workflows, run.tasks) != (expect.workflows as u64, expect.tasks as u64)
        || written != (run.workflows, run.tasks)
        || run.logs != expect.logs as u64
        || run.log_bytes != expect.log_bytes
        || unreadable != 0
    {
        bail!(
            "{what} did not copy everything: expected {} workflows, {} tasks, {} logs of {} bytes; the summary says {summary}",
            expect.workflows,
            expect.tasks,
            expect.logs,
            expect.log_bytes
        );
    }
    Ok(run)
}

pub fn tail_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// Whether the binary has a `migrate` subcommand.
async fn has_migrate(ctx: &Ctx) -> Result<bool> {
    let out = Command::new(&ctx.orchestrator)
        .arg("--help")
        .output()
        .await?;
    let help = String::from_utf8_lossy(&out.stdout);
    Ok(help
        .lines()
        .any(|l| l.trim_start().starts_with("migrate ") || l.trim() == "migrate"))
}
