//! The markdown table, and `docs/benchmarks.md`: one latest table between
//! markers, and a dated history list of one line per run.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::stats::{median, percentile};
use crate::workloads::{OneWorkflow, Shape, W7_WIDTH};
use crate::{Ctx, Results, live, peers, scaleout, testenvs};

const LATEST_START: &str = "<!-- bench:latest:start -->";
const LATEST_END: &str = "<!-- bench:latest:end -->";
const HISTORY_START: &str = "<!-- bench:history:start -->";
const HISTORY_END: &str = "<!-- bench:history:end -->";
const HISTORY_KEEP: usize = 20;

pub struct Environment {
    pub date: String,
    pub cpu: String,
    pub cores: usize,
    pub memory: String,
    pub kernel: String,
    pub fs: String,
    /// `/proc/loadavg` when the benchmark started: other work on the
    /// machine skews every figure.
    pub load_at_start: String,
    pub version: String,
    pub commit: String,
    pub took: Duration,
}

impl Environment {
    pub async fn collect(
        ctx: &Ctx,
        tmp_parent: &Path,
        took: Duration,
        load_at_start: String,
    ) -> Environment {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned())
            .unwrap_or_else(|| "unknown CPU".into());
        let memory = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            })
            .map(|kib| format!("{:.0} GiB", kib / 1024.0 / 1024.0))
            .unwrap_or_else(|| "?".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "?".into());
        let fs = output("stat", &["-f", "-c", "%T", &tmp_parent.to_string_lossy()]).await;
        let version = output(&ctx.orchestrator.to_string_lossy(), &["--version"]).await;
        let mut commit = output("git", &["rev-parse", "--short", "HEAD"]).await;
        let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"]).await;
        if !dirty.is_empty() && commit != "?" {
            commit.push_str(" + uncommitted changes");
        }
        Environment {
            date: chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
            cpu,
            cores: ctx.workers,
            memory,
            kernel,
            fs,
            load_at_start,
            version,
            commit,
            took,
        }
    }
}

async fn output(cmd: &str, args: &[&str]) -> String {
    match tokio::process::Command::new(cmd).args(args).output().await {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => "?".into(),
    }
}

fn s(v: f64) -> String {
    format!("{v:.3} s")
}

fn ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.2} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn thousands(v: f64) -> String {
    let n = v.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "met", or by how much a target of "at most `target`" was missed.
fn at_most(value: f64, target: f64) -> String {
    if value <= target {
        "met".into()
    } else {
        format!(
            "**missed** by {:.2}× ({:+.0} %)",
            value / target,
            (value / target - 1.0) * 100.0
        )
    }
}

fn at_least(value: f64, target: f64) -> String {
    if value >= target {
        "met".into()
    } else {
        format!(
            "**missed**: {:.0} % of the target ({:.2}× short)",
            value / target * 100.0,
            target / value
        )
    }
}

/// Whether peak memory stayed bounded: at most 2× for 10× the records.
fn bounded(growth: f64) -> String {
    if growth <= 2.0 {
        "met".into()
    } else {
        format!(
            "**missed**: grows {:.2}× (target ≤ 2×; {:.2}× over)",
            growth,
            growth / 2.0
        )
    }
}

fn short(backend: &str) -> &str {
    match backend {
        "filesystem" => "fs",
        "surrealdb-embedded" => "embedded",
        "surrealdb-server" => "server",
        other => other,
    }
}

fn spread(values: &[f64], unit: impl Fn(f64) -> String) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if values.len() < 2 {
        String::new()
    } else {
        format!(" (runs: {}–{})", unit(min), unit(max))
    }
}

/// Every run that failed, as text.
pub fn failures(r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    for b in &r.backends {
        for (name, err) in [
            ("workload 1", b.w1.as_ref().and_then(|x| x.as_ref().err())),
            ("workload 2", b.w2.as_ref().and_then(|x| x.as_ref().err())),
            (
                "workloads 3/4",
                b.w3.as_ref().and_then(|x| x.as_ref().err()),
            ),
            ("workload 7", b.w7.as_ref().and_then(|x| x.as_ref().err())),
        ] {
            if let Some(e) = err {
                out.push(format!("[{}] {name}: {e}", b.backend));
            }
        }
    }
    for (backend, scale) in &r.scale {
        if let Err(e) = scale {
            out.push(format!("[{backend}] workload 5: {e}"));
        }
    }
    if let Some(Err(e)) = &r.migrate {
        out.push(format!("workload 6: {e}"));
    }
    if let Some(Err(e)) = &r.live {
        out.push(format!("workload 8: {e}"));
    }
    match &r.scale_out {
        Some(Err(e)) => out.push(format!("workload 9: {e}")),
        Some(Ok(w)) => {
            if let Err(e) = &w.takeover {
                out.push(format!("workload 9, takeover: {e}"));
            }
        }
        None => {}
    }
    if let Some(Err(e)) = &r.testenvs {
        out.push(format!("workload 10: {e}"));
    }
    if let Some(Err(e)) = &r.peers {
        out.push(format!("workload 11: {e}"));
    }
    out
}

pub fn render(ctx: &Ctx, env: &Environment, r: &Results) -> String {
    let mut t = String::new();
    let backends: Vec<&str> = r.backends.iter().map(|b| b.backend.as_str()).collect();
    let _ = writeln!(
        t,
        "Run on {} · {} · load average at start {} · `{}` at commit {} · backend(s): {} · {} workers · median of {} runs · the whole benchmark took {:.0} s.\n",
        env.date,
        format_args!(
            "{} cores of {}, {} RAM, Linux {}, data dirs on {}",
            env.cores, env.cpu, env.memory, env.kernel, env.fs
        ),
        env.load_at_start,
        env.version,
        env.commit,
        backends.join(", "),
        ctx.workers,
        ctx.runs,
        env.took.as_secs_f64()
    );
    if ctx.scale != 1.0 {
        let _ = writeln!(t, "**Scaled run ({}×): not comparable.**\n", ctx.scale);
    }
    if !ctx.sandbox_flags.is_empty() {
        let _ = writeln!(
            t,
            "**Script sandboxes not as by default: `{}`.**\n",
            ctx.sandbox_flags.join(" ")
        );
    }
    t.push_str("| # | workload | measure | orchestrator | baseline | ratio | target | result |\n");
    t.push_str("|---|---|---|---|---|---|---|---|\n");
    let mut row = |cells: [&str; 8]| {
        let _ = writeln!(t, "| {} |", cells.join(" | "));
    };
    for b in &r.backends {
        let be = b.backend.as_str();
        // Issue 8's targets; the server's is issue 18's (one node).
        let target1 = match be {
            "filesystem" => 1.3,
            "surrealdb-server" => 2.5,
            _ => 1.6,
        };
        match &b.w1 {
            Some(Ok(w)) => {
                let per_task = (w.orch() - w.base()) / w.n as f64 * 1000.0;
                row([
                    "1",
                    &format!(
                        "{} independent no-op tasks, one `POST /workflows` each ({be})",
                        thousands(w.n as f64)
                    ),
                    "first submit → last completion",
                    &format!(
                        "{} = {} tasks/s{}",
                        s(w.orch()),
                        thousands(w.n as f64 / w.orch()),
                        spread(&w.orch_s, s)
                    ),
                    &format!(
                        "{} = {} tasks/s, `xargs -P {}`{}",
                        s(w.base()),
                        thousands(w.n as f64 / w.base()),
                        ctx.workers,
                        spread(&w.base_s, s)
                    ),
                    &format!("{:.2}", w.ratio()),
                    &format!("≤ {target1}"),
                    &at_most(w.ratio(), target1),
                ]);
                row([
                    "1",
                    "",
                    "orchestration overhead per task (wall-time difference ÷ N)",
                    &format!(
                        "{} (submitting alone took {})",
                        ms(per_task),
                        s(median(&w.submit_s))
                    ),
                    "",
                    "",
                    "< 1 ms",
                    &at_most(per_task, 1.0),
                ]);
            }
            Some(Err(e)) => failed(&mut row, "1", &format!("independent tasks ({be})"), e),
            None => {}
        }
        match &b.w2 {
            Some(Ok(w)) => {
                let o = median(&w.orch_s);
                let m = median(&w.base_s);
                row([
                    "2",
                    &format!(
                        "DAG of {} steps, {} layers × 25, 2 deps each, one inline template ({be})",
                        thousands(w.steps as f64),
                        w.steps / 25
                    ),
                    "submit (`wait`) → workflow completed",
                    &format!(
                        "{} = {} per step{}",
                        s(o),
                        ms(o / w.steps as f64 * 1000.0),
                        spread(&w.orch_s, s)
                    ),
                    &format!(
                        "{} = {} per step, `make -j{}`{}",
                        s(m),
                        ms(m / w.steps as f64 * 1000.0),
                        ctx.workers,
                        spread(&w.base_s, s)
                    ),
                    &format!("{:.2}", w.ratio()),
                    "≤ 1.3",
                    &at_most(w.ratio(), 1.3),
                ]);
            }
            Some(Err(e)) => failed(&mut row, "2", &format!("DAG ({be})"), e),
            None => {}
        }
        match &b.w7 {
            Some(Ok(w)) => {
                for shape in [Shape::Independent, Shape::Dag] {
                    let rows: Vec<&OneWorkflow> =
                        w.rows.iter().filter(|r| r.shape == shape).collect();
                    let Some(first) = rows.first() else { continue };
                    let (first_ms, _) = first.per_step_ms();
                    for r in &rows {
                        let (o, b) = r.per_step_ms();
                        let (what, floor) = match shape {
                            Shape::Independent => (
                                format!("{} independent no-op steps", thousands(r.steps as f64)),
                                format!("`xargs -P {}`", ctx.workers),
                            ),
                            Shape::Dag => (
                                format!(
                                    "DAG of {} steps, {} layers × {}, 2 deps each",
                                    thousands(r.steps as f64),
                                    r.steps / W7_WIDTH,
                                    W7_WIDTH
                                ),
                                format!("`make -j{}`", ctx.workers),
                            ),
                        };
                        let runs = if r.orch_s.len() == 1 {
                            " (1 run)".to_owned()
                        } else {
                            spread(&r.orch_s, s)
                        };
                        row([
                            "7",
                            &format!("one workflow: {what}, one inline template ({be})"),
                            "submit (`wait`) → workflow completed, per step",
                            &format!("{} per step = {}{runs}", ms(o), s(median(&r.orch_s))),
                            &format!("{} per step, {floor}", ms(b)),
                            &format!("{:.2}", r.ratio()),
                            &format!("≤ 1.5 × {} per step", ms(first_ms)),
                            &at_most(o / first_ms, 1.5),
                        ]);
                    }
                }
            }
            Some(Err(e)) => failed(&mut row, "7", &format!("one workflow of N steps ({be})"), e),
            None => {}
        }
        match &b.w3 {
            Some(Ok(w3)) => {
                let reads = &w3.reads;
                for lat in &w3.latency {
                    let p99 = lat.median(2);
                    let main = lat.rate == 100;
                    row([
                        "3",
                        &format!(
                            "submit → script start, {}/s for {} s × {} run(s), {} samples ({be})",
                            lat.rate,
                            lat.secs_per_run,
                            lat.runs.len(),
                            thousands(lat.samples as f64)
                        ),
                        "p50 / p95 / p99",
                        &format!(
                            "{} / {} / {}",
                            ms(lat.median(0)),
                            ms(lat.median(1)),
                            ms(p99)
                        ),
                        &format!(
                            "{} / {} / {}: spawning the same script directly (spawn → its first line)",
                            ms(w3.floor[0]),
                            ms(w3.floor[1]),
                            ms(w3.floor[2])
                        ),
                        "",
                        if main { "p99 ≤ 10 ms" } else { "(context)" },
                        &if main {
                            at_most(p99, 10.0)
                        } else {
                            String::new()
                        },
                    ]);
                }
                for (name, res, target) in [
                    ("`GET /tasks/{id}`", &reads.by_id, Some(15_000.0)),
                    ("`GET /tasks?limit=50`", &reads.list, None),
                ] {
                    let mut lat: Vec<u32> = res.latencies_us.clone();
                    lat.sort_unstable();
                    let rps = res.median_window_rps();
                    row([
                        "4",
                        &format!(
                            "{name}, {} connections, {} s, {} stored tasks ({be})",
                            reads.connections,
                            reads.secs,
                            thousands(reads.stored as f64)
                        ),
                        "requests/s (median of 5 s windows), p99",
                        &format!(
                            "{} req/s, p99 {}",
                            thousands(rps),
                            ms(f64::from(percentile(&lat, 99.0)) / 1000.0)
                        ),
                        "",
                        "",
                        if target.is_some() {
                            "≥ 15,000 req/s"
                        } else {
                            ""
                        },
                        &target.map(|t| at_least(rps, t)).unwrap_or_default(),
                    ]);
                }
            }
            Some(Err(e)) => failed(&mut row, "3–4", &format!("latency and reads ({be})"), e),
            None => {}
        }
    }
    for b in &r.backends {
        if let Some(Ok(w)) = &b.w1 {
            let idle = median(&w.idle_rss_kib.iter().map(|&k| k as f64).collect::<Vec<_>>()) as u64;
            let anon = median(
                &w.idle_anon_kib
                    .iter()
                    .map(|&k| k as f64)
                    .collect::<Vec<_>>(),
            ) as u64;
            let peak = median(&w.peak_rss_kib.iter().map(|&k| k as f64).collect::<Vec<_>>()) as u64;
            let done = median(&w.done_rss_kib.iter().map(|&k| k as f64).collect::<Vec<_>>()) as u64;
            let per_1000 = done.saturating_sub(idle) as f64 / w.n.max(1) as f64 * 1000.0;
            row([
                "5",
                &format!("idle service, empty data dir ({})", b.backend),
                "RSS",
                &format!(
                    "{} ({} of it anonymous, the rest the binary's pages; after workload 1's {} finished: {}, {} per 1,000; peak {})",
                    mib(idle),
                    mib(anon),
                    thousands(w.n as f64),
                    mib(done),
                    mib(per_1000 as u64),
                    mib(peak)
                ),
                "",
                "",
                "< 30 MB",
                &at_most(idle as f64 * 1024.0, 30e6),
            ]);
        }
    }
    match &r.history {
        Some(Ok(h)) => {
            let above = h.loaded_rss_kib.saturating_sub(h.empty_rss_kib);
            row([
                "5",
                &format!(
                    "{} finished one-step workflows at rest (filesystem; {:.0} MiB snapshot)",
                    thousands(h.workflows as f64),
                    h.snapshot_bytes as f64 / 1048576.0
                ),
                "RSS idle after start-up, above the same service on an empty data dir",
                &format!(
                    "+{} ({} against {}; start-up {})",
                    mib(above),
                    mib(h.loaded_rss_kib),
                    mib(h.empty_rss_kib),
                    s(h.start_s)
                ),
                "",
                "",
                "≤ +40 MiB",
                &at_most(above as f64, 40.0 * 1024.0),
            ]);
        }
        Some(Err(e)) => failed(&mut row, "5", "finished history at rest (filesystem)", e),
        None => {}
    }
    for (be, scale) in &r.scale {
        let sc = match scale {
            Ok(sc) => sc,
            Err(e) => {
                failed(&mut row, "5", &format!("100k stored tasks ({be})"), e);
                continue;
            }
        };
        let start = median(&sc.start_s);
        let empty = r
            .backends
            .iter()
            .find(|b| &b.backend == be)
            .and_then(|b| b.w1.as_ref())
            .and_then(|w| w.as_ref().ok())
            .map(|w| median(&w.empty_start_s));
        let stored = match sc.converted_s {
            None => format!("{:.0} MiB snapshot", sc.data_mib),
            Some(took) => format!(
                "converted from the filesystem data set by `orchestrator migrate` in {}; {:.0} MiB on disk",
                s(took),
                sc.data_mib
            ),
        };
        row([
            "5",
            &format!(
                "{} stored tasks, {} logs ({be}; {stored})",
                thousands(sc.tasks as f64),
                thousands(sc.logs as f64)
            ),
            "start-up: spawn → first `200` from `/health`",
            &format!("{}{}", s(start), spread(&sc.start_s, s)),
            &empty
                .map(|e| format!("{} with an empty data dir", s(e)))
                .unwrap_or_default(),
            "",
            "< 2 s",
            &at_most(start, 2.0),
        ]);
        row([
            "5",
            &format!("{} stored tasks ({be})", thousands(sc.tasks as f64)),
            "RSS idle after loading; after the list queries (peak)",
            &format!(
                "{}; {} ({})",
                mib(sc.rss_loaded_kib),
                mib(sc.rss_after_kib),
                mib(sc.hwm_after_kib)
            ),
            "",
            "",
            "",
            "",
        ]);
        for l in &sc.lists {
            row([
                "5",
                &format!("`GET /tasks` {} ({be})", l.label),
                &format!("p50 / p99 of {} sequential requests", l.samples),
                &format!("{} / {}", ms(l.p50_ms), ms(l.p99_ms)),
                "",
                "",
                "",
                "",
            ]);
        }
    }
    match &r.migrate {
        Some(Ok(m)) => {
            for d in &m.directions {
                let fs_only = d.from == d.to;
                let what = if fs_only {
                    format!(
                        "migration {} → {} (SurrealDB not in this run's backends: stands in for fs ↔ embedded)",
                        d.from, d.to
                    )
                } else {
                    format!("migration {} → {}", d.from, d.to)
                };
                let rate = d.rate();
                row([
                    "6",
                    &format!(
                        "{what}: {} workflows + {} tasks, {} logs ({:.0} MiB), into a new store",
                        thousands(m.workflows as f64),
                        thousands(m.tasks as f64),
                        thousands(m.logs as f64),
                        m.log_bytes as f64 / (1024.0 * 1024.0)
                    ),
                    &format!(
                        "records/s: (workflows + tasks) ÷ wall time of the `orchestrator migrate` process, {} {}",
                        d.runs.len(),
                        match (d.runs.len(), d.runs.len() < ctx.runs) {
                            (1, true) => "run (not median of 3: the time budget allows one)",
                            (_, true) => "runs (time budget)",
                            (1, false) => "run",
                            _ => "runs, median",
                        }
                    ),
                    &format!(
                        "{} records/s = {} for {} records{}; CPU {}",
                        thousands(rate),
                        s(median(&d.wall_s())),
                        thousands(d.runs[0].records() as f64),
                        spread(&d.rates(), |v| format!("{} records/s", thousands(v))),
                        s(d.cpu_s())
                    ),
                    "",
                    "",
                    "≥ 20,000 records/s",
                    &at_least(rate, 20_000.0),
                ]);
                let peak = d.maxrss_kib();
                let (measure, value, result) = match (&d.small, m.small_tasks) {
                    (Some(small), Some(small_tasks)) => {
                        let growth = peak as f64 / small.maxrss_kib.max(1) as f64;
                        let tenfold = m.tasks as f64 / small_tasks as f64;
                        (
                            format!(
                                "peak RSS (`ru_maxrss`) at {} and at {} tasks",
                                thousands(small_tasks as f64),
                                thousands(m.tasks as f64)
                            ),
                            format!(
                                "{} → {} ({:.2}× for {:.0}× the records; {:.0} KiB per 1,000 extra records)",
                                mib(small.maxrss_kib),
                                mib(peak),
                                growth,
                                tenfold,
                                (peak as f64 - small.maxrss_kib as f64).max(0.0)
                                    / ((m.tasks + m.workflows) as f64 - small.records() as f64)
                                        .max(1.0)
                                    * 1000.0
                            ),
                            bounded(growth),
                        )
                    }
                    _ => (
                        "peak RSS (`ru_maxrss`)".to_owned(),
                        mib(peak),
                        "n/a".to_owned(),
                    ),
                };
                row([
                    "6",
                    "",
                    &measure,
                    &value,
                    "",
                    "",
                    "memory bounded: ≤ 2× for 10× the records",
                    &result,
                ]);
            }
        }
        Some(Err(e)) => failed(&mut row, "6", "migration", e),
        None => {}
    }
    match &r.scale_out {
        Some(Ok(w)) => scale_out_rows(w, &mut row),
        Some(Err(e)) => failed(&mut row, "9", "scale-out", e),
        None => {}
    }
    match &r.live {
        Some(Ok(l)) => live_rows(l, &mut row),
        Some(Err(e)) => failed(&mut row, "8", "storage move", e),
        None => {}
    }
    match &r.testenvs {
        Some(Ok(testenvs::Outcome::Measured(w))) => testenv_rows(w, &mut row),
        Some(Ok(testenvs::Outcome::Skipped(why))) => row([
            "10",
            "test environments, namespace provider",
            "",
            &format!("skipped: {why}"),
            "",
            "",
            "",
            "not run",
        ]),
        Some(Err(e)) => failed(&mut row, "10", "test environments", e),
        None => {}
    }
    match &r.peers {
        Some(Ok(peers::Outcome::Measured(p))) => peer_rows(p, ctx.workers, &mut row),
        Some(Ok(peers::Outcome::Skipped(why))) => row([
            "11",
            "peers: the same workflows through Luigi",
            "",
            &format!("skipped: {why}"),
            "",
            "",
            "",
            "not run",
        ]),
        Some(Err(e)) => failed(&mut row, "11", "peers (Luigi)", e),
        None => {}
    }
    t
}

/// Workload 11's rows: per shape, the orchestrator against the floor, then
/// Luigi against the same floor and against the orchestrator.
fn peer_rows(p: &peers::Peers, workers: usize, row: &mut impl FnMut([&str; 8])) {
    for r in &p.rows {
        let floor = match r.graph.shape {
            Shape::Independent => format!("`xargs -P {workers}`"),
            Shape::Dag => format!("`make -j{workers}`"),
        };
        let base = format!("{}, {floor}{}", s(median(&r.base_s)), spread(&r.base_s, s));
        row([
            "11",
            &format!(
                "peers: one workflow, {}, one inline template ({}); the floor, this and Luigi in turn",
                r.graph.describe(),
                p.backend
            ),
            "this orchestrator: submit (`wait`) → workflow completed",
            &format!("{}{}", s(median(&r.orch_s)), spread(&r.orch_s, s)),
            &base,
            &format!("{:.2}", r.orch_ratio()),
            "",
            "",
        ]);
        row([
            "11",
            "",
            &format!(
                "Luigi {} (`--workers {workers} --local-scheduler`, a `bash noop.sh` per task): spawn → exit of `peers/luigi_dag.py`",
                p.luigi_version
            ),
            &format!(
                "Luigi: {}{} (in `luigi.build`: {}) = {:.2}× this orchestrator",
                s(median(&r.luigi_s)),
                spread(&r.luigi_s, s),
                s(median(&r.luigi_build_s)),
                r.luigi_ratio() / r.orch_ratio()
            ),
            &base,
            &format!("{:.2}", r.luigi_ratio()),
            "",
            "",
        ]);
    }
}

/// Workload 10's rows.
fn testenv_rows(w: &testenvs::TestEnvs, row: &mut impl FnMut([&str; 8])) {
    let redis = median(&w.redis_ready);
    row([
        "10",
        "test environment `single_taskserv` redis (real `redis-server`), namespace provider",
        "create → `ready` (`POST /test/environments/create` until `GET` says ready)",
        &format!("{}{}", s(redis), spread(&w.redis_ready, s)),
        "",
        "",
        &format!("≤ {:.0} s", testenvs::REDIS_TARGET_S),
        &at_most(redis, testenvs::REDIS_TARGET_S),
    ]);
    let totals: Vec<f64> = w.etcd.iter().map(testenvs::EtcdRun::total).collect();
    let phase =
        |f: fn(&testenvs::EtcdRun) -> f64| s(median(&w.etcd.iter().map(f).collect::<Vec<_>>()));
    let total = median(&totals);
    row([
        "10",
        "`etcd_cluster`: three real etcd members, namespace provider",
        &format!(
            "create → all 6 checks passed → deleted (medians: ready {}, checks {}, teardown {})",
            phase(|r| r.ready),
            phase(|r| r.checks),
            phase(|r| r.teardown)
        ),
        &format!("{}{}", s(total), spread(&totals, s)),
        "",
        "",
        &format!("≤ {:.0} s", testenvs::ETCD_TARGET_S),
        &at_most(total, testenvs::ETCD_TARGET_S),
    ]);
}

/// The row of a workload that failed: what it was, and why.
fn failed(row: &mut impl FnMut([&str; 8]), number: &str, what: &str, error: &str) {
    row([
        number,
        what,
        "",
        &format!("FAILED: {error}"),
        "",
        "",
        "",
        "",
    ]);
}

/// "met", or the count when a target of zero was missed.
fn none(count: usize, what: &str) -> String {
    if count == 0 {
        "met".into()
    } else {
        format!("**missed**: {count} {what}")
    }
}

/// p50 / p99 / max of one stretch of workload 8's load.
fn p50_p99_max(l: &live::Latency) -> String {
    format!("{} / {} / {}", ms(l.p50_ms), ms(l.p99_ms), ms(l.max_ms))
}

/// ` (first: a; b)` after a count, naming the first few at fault; nothing
/// when there are none.
fn first_of(examples: &[String]) -> String {
    if examples.is_empty() {
        String::new()
    } else {
        format!(" (first: {})", examples.join("; "))
    }
}

/// Workload 8's rows.
fn live_rows(l: &live::LiveMigration, row: &mut impl FnMut([&str; 8])) {
    let p = &l.phases;
    let secs = |v: u64| s(v as f64 / 1000.0);
    row([
        "8",
        &format!(
            "storage move {} → {} of {} workflows + {} tasks, {} logs, batch size {} (the default), while {} one-step submissions/s arrive, each read back",
            short_spec(&l.source),
            short_spec(&l.target),
            thousands(l.workflows as f64),
            thousands(l.tasks as f64),
            thousands(l.logs as f64),
            live::DEFAULT_BATCH,
            live::RATE
        ),
        "time per phase (the status's `phases`)",
        &format!(
            "copying {}, mirroring {}, verifying {}, switching {}; the whole move {}",
            secs(p.copying_ms),
            secs(p.mirroring_ms),
            secs(p.verifying_ms),
            secs(p.switching_ms),
            s(p.move_s)
        ),
        "",
        "",
        "",
        "",
    ]);
    row([
        "8",
        "",
        "copy rate: `records_total` ÷ copying time (the status's `rate`)",
        &format!(
            "{} records/s = {} records in {} (status: {} records/s); then {} mirrored, {} verified",
            thousands(l.copy_rate()),
            thousands(p.records_total as f64),
            secs(p.copying_ms),
            thousands(p.rate),
            thousands(p.records_mirrored as f64),
            thousands(p.records_verified as f64)
        ),
        "",
        "",
        "≥ 20,000 records/s",
        &at_least(l.copy_rate(), 20_000.0),
    ]);
    let d = &l.during;
    row([
        "8",
        "",
        &format!(
            "request latency during the move (sent between `started_at` and `finished_at`): {} submits + {} reads, p50 / p99 / max",
            thousands(d.submits.count as f64),
            thousands(d.reads.count as f64)
        ),
        &format!(
            "all {}; submits {}; reads {}",
            p50_p99_max(&d.all),
            p50_p99_max(&d.submits),
            p50_p99_max(&d.reads)
        ),
        &format!(
            "before the move ({} requests): {}; after the switch ({}): {}",
            thousands(l.before.all.count as f64),
            p50_p99_max(&l.before.all),
            thousands(l.after.all.count as f64),
            p50_p99_max(&l.after.all)
        ),
        &if l.before.all.p99_ms > 0.0 {
            format!("p99 {:.2}", d.all.p99_ms / l.before.all.p99_ms)
        } else {
            String::new()
        },
        "",
        "",
    ]);
    row([
        "8",
        "",
        "stall at the switch (`switch_stall_ms`: writes paused)",
        &ms(p.switch_stall_ms),
        "",
        "",
        "≤ 200 ms",
        &at_most(p.switch_stall_ms, 200.0),
    ]);
    let examples = first_of(&l.errors);
    row([
        "8",
        "",
        "failed requests (a status other than 2xx, a connection error, a timeout of 30 s), over the whole load",
        &format!(
            "{} of {}{examples}",
            thousands(l.failures as f64),
            thousands(l.requests as f64)
        ),
        "",
        "",
        "0",
        &none(l.failures, "failed"),
    ]);
    let lost = l.acknowledged - l.completed.min(l.acknowledged);
    let examples = first_of(&l.not_completed);
    row([
        "8",
        "",
        "acknowledged submissions present and completed after the move (`GET /workflows/{id}` each)",
        &format!(
            "{} of {} present, {} completed{examples}",
            thousands(l.present as f64),
            thousands(l.acknowledged as f64),
            thousands(l.completed as f64)
        ),
        "",
        "",
        "all",
        &if l.acknowledged == 0 {
            "n/a: no submission was acknowledged".to_owned()
        } else {
            none(lost, "not present or not completed")
        },
    ]);
}

/// Workload 9's rows.
fn scale_out_rows(w: &scaleout::ScaleOut, row: &mut impl FnMut([&str; 8])) {
    let Some(one) = w.one_node() else { return };
    let base = one.tasks_per_s();
    let ideal = scaleout::NODE_WORKERS as f64 * 1000.0 / scaleout::STEP_MS as f64;
    for c in &w.configs {
        let rate = c.tasks_per_s();
        let ratio = rate / base;
        let spread_rate = spread(&c.secs, |secs| format!("{:.1}", c.tasks as f64 / secs));
        let what = if c.nodes == 1 {
            format!(
                "scale-out: {} one-step workflows of a {} ms sleep, 1 node × {} workers on one SurrealDB server (in memory)",
                thousands(w.tasks as f64),
                scaleout::STEP_MS,
                scaleout::NODE_WORKERS
            )
        } else {
            format!(
                "scale-out: {} nodes, submissions {}",
                c.nodes,
                c.pattern.describe()
            )
        };
        let started: Vec<String> = c
            .started_by_node
            .iter()
            .map(|n| thousands(*n as f64))
            .collect();
        row([
            "9",
            &what,
            "first submit → last completion; CPU per task (server, all nodes); starts per node over the runs",
            &format!(
                "{:.1} tasks/s{spread_rate}; CPU {} + {}; starts {}",
                rate,
                ms(median(&c.server_cpu_ms)),
                ms(median(&c.nodes_cpu_ms)),
                started.join(" / ")
            ),
            &if c.nodes == 1 {
                format!("the nodes' limit: {ideal:.0} tasks/s per node")
            } else {
                format!("1 node: {base:.1} tasks/s")
            },
            &format!("{ratio:.2}×"),
            if c.nodes == 3 {
                "≥ 2.85× at 3 nodes"
            } else {
                ""
            },
            &if c.nodes == 3 {
                at_least(ratio, 2.85)
            } else {
                String::new()
            },
        ]);
    }
    for c in w
        .configs
        .iter()
        .filter(|c| c.pattern == scaleout::Pattern::EveryNode && c.nodes != 2)
    {
        let runs_tasks = (c.tasks * c.secs.len()).max(1) as f64;
        let ops: Vec<String> = c
            .storage
            .by_time()
            .into_iter()
            .take(8)
            .map(|(op, calls, secs)| {
                format!(
                    "`{op}` {:.2} calls, {}",
                    calls / runs_tasks,
                    ms(secs / runs_tasks * 1000.0)
                )
            })
            .collect();
        let (calls, secs) = c
            .storage
            .0
            .values()
            .fold((0.0, 0.0), |(a, b), (calls, secs)| (a + calls, b + secs));
        row([
            "9",
            "",
            &format!(
                "storage calls per task, {} node(s), all nodes together (`/metrics`): the 8 operations that took longest",
                c.nodes
            ),
            &format!(
                "{:.1} calls, {} in all; {}",
                calls / runs_tasks,
                ms(secs / runs_tasks * 1000.0),
                ops.join("; ")
            ),
            "",
            "",
            "",
            "",
        ]);
    }
    let doubles: usize = w.configs.iter().map(|c| c.double_runs).sum();
    row([
        "9",
        "",
        "double runs: starts in the nodes' ledgers beyond one per task and its recorded interruptions, every run above",
        &thousands(doubles as f64),
        "",
        "",
        "0",
        &none(doubles, "double runs"),
    ]);
    match &w.takeover {
        Ok(t) => {
            let limit = scaleout::LEASE_SECS as f64 + 2.0;
            row([
                "9",
                &format!(
                    "takeover: 3 nodes, node {} SIGKILLed after {} of {} completions (lease {} s)",
                    scaleout::KILLED,
                    thousands(t.completed_at_kill as f64),
                    thousands(w.tasks as f64),
                    scaleout::LEASE_SECS
                ),
                "SIGKILL → every task it held running on (or finished by) another node; then all completed, double runs",
                &format!(
                    "{} for {} held task(s); {} of {} completed, {} interrupted, {} double run(s)",
                    s(t.takeover_s),
                    t.held,
                    thousands(t.completed as f64),
                    thousands(w.tasks as f64),
                    t.interrupted,
                    t.double_runs
                ),
                "",
                "",
                &format!("≤ lease + 2 s = {limit:.0} s; none lost"),
                &if t.completed < w.tasks {
                    format!("**missed**: {} lost", w.tasks - t.completed)
                } else if t.double_runs > 0 {
                    none(t.double_runs, "double runs")
                } else {
                    at_most(t.takeover_s, limit)
                },
            ]);
        }
        Err(e) => failed(row, "9", "takeover", e),
    }
}

/// `filesystem:/tmp/…/w8-target` → `filesystem`: the directories are
/// temporary.
fn short_spec(spec: &str) -> &str {
    short(spec.split_once(':').map_or(spec, |(backend, _)| backend))
}

/// One line of the history list.
pub fn history_line(env: &Environment, r: &Results) -> String {
    let mut parts = vec![format!("{} · {} · `{}`", env.date, env.commit, env.version)];
    for b in &r.backends {
        let mut p = vec![b.backend.clone()];
        if let Some(Ok(w)) = &b.w1 {
            p.push(format!("w1 {:.2}× ({})", w.ratio(), s(w.orch())));
        }
        if let Some(Ok(w)) = &b.w2 {
            p.push(format!("w2 {:.2}×", w.ratio()));
        }
        if let Some(Ok(w)) = &b.w7 {
            for r in &w.rows {
                let shape = match r.shape {
                    Shape::Independent => "flat",
                    Shape::Dag => "dag",
                };
                p.push(format!(
                    "w7 {shape} {} {}/step ({:.1}×)",
                    thousands(r.steps as f64),
                    ms(r.per_step_ms().0),
                    r.ratio()
                ));
            }
        }
        if let Some(Ok(w3)) = &b.w3 {
            if let Some(lat) = w3.latency.first() {
                p.push(format!("p99 {}", ms(lat.median(2))));
            }
            p.push(format!(
                "get {} req/s",
                thousands(w3.reads.by_id.median_window_rps())
            ));
        }
        parts.push(p.join(", "));
    }
    for (backend, sc) in &r.scale {
        if let Ok(sc) = sc {
            parts.push(format!(
                "100k ({backend}) start-up {}, RSS {}",
                s(median(&sc.start_s)),
                mib(sc.rss_loaded_kib)
            ));
        }
    }
    if let Some(Ok(m)) = &r.migrate {
        let dirs: Vec<String> = m
            .directions
            .iter()
            .map(|d| {
                format!(
                    "{}→{} {} records/s, peak {}",
                    short(&d.from),
                    short(&d.to),
                    thousands(d.rate()),
                    mib(d.maxrss_kib())
                )
            })
            .collect();
        parts.push(format!("migrate {}", dirs.join(", ")));
    }
    if let Some(Ok(l)) = &r.live {
        parts.push(format!(
            "live {}→{} copy {} records/s, stall {}, p99 {} max {} during the move, {} failed",
            short_spec(&l.source),
            short_spec(&l.target),
            thousands(l.copy_rate()),
            ms(l.phases.switch_stall_ms),
            ms(l.during.all.p99_ms),
            ms(l.during.all.max_ms),
            l.failures
        ));
    }
    if let Some(Ok(w)) = &r.scale_out {
        let rates: Vec<String> = w
            .configs
            .iter()
            .map(|c| {
                let p = match c.pattern {
                    scaleout::Pattern::EveryNode => "",
                    scaleout::Pattern::OneNode => " one",
                };
                format!("{}n{p} {:.1}/s", c.nodes, c.tasks_per_s())
            })
            .collect();
        let takeover = match &w.takeover {
            Ok(t) => format!("takeover {}", s(t.takeover_s)),
            Err(_) => "takeover failed".into(),
        };
        parts.push(format!("scale-out {}, {takeover}", rates.join(", ")));
    }
    if let Some(Ok(testenvs::Outcome::Measured(w))) = &r.testenvs {
        let totals: Vec<f64> = w.etcd.iter().map(testenvs::EtcdRun::total).collect();
        parts.push(format!(
            "testenv redis ready {}, etcd_cluster {}",
            s(median(&w.redis_ready)),
            s(median(&totals))
        ));
    }
    if let Some(Ok(peers::Outcome::Measured(p))) = &r.peers {
        let rows: Vec<String> = p
            .rows
            .iter()
            .map(|r| {
                let shape = match r.graph.shape {
                    Shape::Independent => "flat",
                    Shape::Dag => "dag",
                };
                format!(
                    "{shape} {} this {:.1}× Luigi {:.1}×",
                    r.graph.steps(),
                    r.orch_ratio(),
                    r.luigi_ratio()
                )
            })
            .collect();
        parts.push(format!("w11 ({}) {}", short(&p.backend), rows.join(", ")));
    }
    parts.push(format!("took {:.0} s", env.took.as_secs_f64()));
    format!("- {}", parts.join(" · "))
}

const SKELETON: &str = "# Benchmarks\n\nRun `make bench`.\n\n## Latest results\n\n<!-- bench:latest:start -->\n<!-- bench:latest:end -->\n\n## History\n\n<!-- bench:history:start -->\n<!-- bench:history:end -->\n";

/// Replaces the latest table and prepends a history line; everything
/// outside the markers is kept as written.
pub fn write_doc(path: &Path, table: &str, history: &str) -> Result<()> {
    let doc = std::fs::read_to_string(path).unwrap_or_else(|_| SKELETON.to_owned());
    let doc = replace_between(&doc, LATEST_START, LATEST_END, &format!("\n{table}\n"))?;
    let old = between(&doc, HISTORY_START, HISTORY_END)?;
    let mut lines: Vec<&str> = vec![history];
    lines.extend(
        old.lines()
            .filter(|l| l.starts_with("- "))
            .take(HISTORY_KEEP - 1),
    );
    let doc = replace_between(
        &doc,
        HISTORY_START,
        HISTORY_END,
        &format!("\n{}\n", lines.join("\n")),
    )?;
    std::fs::write(path, doc)?;
    Ok(())
}

fn between<'a>(doc: &'a str, start: &str, end: &str) -> Result<&'a str> {
    let (Some(a), Some(b)) = (doc.find(start), doc.find(end)) else {
        bail!("the document lacks the markers {start} … {end}");
    };
    if b < a {
        bail!("{end} comes before {start}");
    }
    Ok(&doc[a + start.len()..b])
}

fn replace_between(doc: &str, start: &str, end: &str, with: &str) -> Result<String> {
    let inner = between(doc, start, end)?;
    let a = doc.find(start).unwrap_or_default() + start.len();
    Ok(format!("{}{with}{}", &doc[..a], &doc[a + inner.len()..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_doc_keeps_its_text_and_a_bounded_history() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.md");
        std::fs::write(
            &path,
            SKELETON.replace("Run `make bench`.", "Hand-written notes."),
        )
        .unwrap();
        for i in 0..25 {
            write_doc(&path, &format!("table {i}"), &format!("- run {i}")).unwrap();
        }
        let doc = std::fs::read_to_string(&path).unwrap();
        assert!(doc.contains("Hand-written notes."));
        assert!(doc.contains("table 24") && !doc.contains("table 23"));
        assert!(doc.contains("- run 24\n- run 23"));
        assert_eq!(doc.matches("- run ").count(), HISTORY_KEEP);
    }

    #[test]
    fn targets_say_by_how_much_they_were_missed() {
        assert_eq!(at_most(1.2, 1.3), "met");
        assert_eq!(at_most(2.6, 1.3), "**missed** by 2.00× (+100 %)");
        assert_eq!(
            at_least(7_500.0, 15_000.0),
            "**missed**: 50 % of the target (2.00× short)"
        );
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(none(0, "failed"), "met");
        assert_eq!(none(3, "failed"), "**missed**: 3 failed");
    }

    #[test]
    fn peer_rows_give_luigi_beside_the_floor_and_the_orchestrator() {
        let p = peers::Peers {
            backend: "filesystem".into(),
            luigi_version: "3.8.1".into(),
            rows: vec![peers::Row {
                graph: peers::Graph {
                    shape: Shape::Dag,
                    layers: 20,
                    width: 25,
                    fan_in: 2,
                },
                base_s: vec![0.5, 0.4, 0.6],
                orch_s: vec![1.0, 1.2, 1.1],
                luigi_s: vec![4.0, 3.0, 3.5],
                luigi_build_s: vec![3.5, 2.5, 3.0],
            }],
        };
        let mut rows = Vec::new();
        peer_rows(&p, 2, &mut |cells: [&str; 8]| {
            rows.push(cells.map(str::to_owned));
        });
        assert_eq!(rows.len(), 2);
        assert!(rows[0][1].contains("DAG of 500 steps, 20 layers × 25, 2 deps each"));
        assert_eq!(rows[0][3], "1.100 s (runs: 1.000 s–1.200 s)");
        assert_eq!(rows[0][4], "0.500 s, `make -j2` (runs: 0.400 s–0.600 s)");
        assert_eq!(rows[0][5], "2.20");
        assert!(rows[1][2].starts_with("Luigi 3.8.1 (`--workers 2 --local-scheduler`"));
        assert_eq!(
            rows[1][3],
            "Luigi: 3.500 s (runs: 3.000 s–4.000 s) (in `luigi.build`: 3.000 s) = 3.18× this orchestrator"
        );
        assert_eq!(rows[1][5], "7.00");
    }

    #[test]
    fn test_environment_rows_grade_the_medians_against_2_s_and_15_s() {
        let w = testenvs::TestEnvs {
            // Median 2.5 s: over the 2 s target, though one run was under.
            redis_ready: vec![1.5, 2.5, 3.0],
            etcd: vec![
                testenvs::EtcdRun {
                    ready: 5.0,
                    checks: 1.0,
                    teardown: 1.0,
                },
                testenvs::EtcdRun {
                    ready: 9.0,
                    checks: 2.0,
                    teardown: 2.0,
                },
                testenvs::EtcdRun {
                    ready: 6.0,
                    checks: 1.0,
                    teardown: 1.0,
                },
            ],
        };
        let mut rows = Vec::new();
        testenv_rows(&w, &mut |cells: [&str; 8]| {
            rows.push(cells.map(str::to_owned));
        });
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][3], "2.500 s (runs: 1.500 s–3.000 s)");
        assert_eq!(rows[0][7], "**missed** by 1.25× (+25 %)");
        assert_eq!(rows[1][3], "8.000 s (runs: 7.000 s–13.000 s)");
        assert!(rows[1][2].contains("ready 6.000 s, checks 1.000 s, teardown 1.000 s"));
        assert_eq!(rows[1][7], "met");
    }

    #[test]
    fn live_migration_rows_name_the_backends_without_the_temporary_dirs() {
        assert_eq!(
            short_spec("filesystem:/tmp/orchestrator-bench-x/w8-target"),
            "fs"
        );
        assert_eq!(short_spec("surrealdb-embedded:/tmp/x"), "embedded");
    }
}
