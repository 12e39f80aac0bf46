//! `make bench`: measures what orchestration costs on top of running the
//! scripts themselves (issue 8), against real `orchestrator serve`
//! processes on loopback, and writes the table to `docs/benchmarks.md`.
//!
//! It exits non-zero only when a run failed, never because a target was
//! missed.

mod dataset;
mod live;
mod load;
mod peers;
mod report;
mod rusage;
mod scaleout;
mod service;
mod stats;
mod surreal;
mod testenvs;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "orchestrator-bench",
    about = "Benchmark the orchestrator against spawning the scripts directly"
)]
struct Args {
    /// The `orchestrator` binary [default: next to this one].
    #[arg(long)]
    orchestrator: Option<PathBuf>,
    /// Storage backends to measure, comma-separated: filesystem,
    /// surrealdb-embedded, surrealdb-server (both need a binary built with
    /// `--features surrealdb`; surrealdb-server also needs `--surreal`, and
    /// adds workload 9).
    #[arg(long, env = "BENCH_BACKENDS", default_value = "filesystem")]
    backends: String,
    /// The SurrealDB server binary for the surrealdb-server backend
    /// [default: `surreal-dev-server` next to this one].
    #[arg(long)]
    surreal: Option<PathBuf>,
    /// Write the results into this markdown file (latest table + history).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Runs per figure; each figure is the median.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Scale every task count by this factor (for quick trials and
    /// profiling; a scaled run never writes `--out`).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Workers of the service and parallelism of the baselines
    /// [default: number of CPUs].
    #[arg(long)]
    workers: Option<usize>,
    /// Every service's `--script-sandbox-attempts` (a run that sets it
    /// never writes `--out`) [default: the service's].
    #[arg(long)]
    sandbox_attempts: Option<u32>,
    /// Every service's `--script-sandbox-reuse`: `submitter`, `workflow` or `any` (a
    /// run that sets it never writes `--out`) [default: the service's].
    #[arg(long)]
    sandbox_reuse: Option<String>,
    /// Only these workloads, comma-separated: w1,w2,w3,w5,w6,w7,w8,w9,w10,w11
    /// (w3 includes w4; w9 runs only with the surrealdb-server backend;
    /// w10 needs root and the host's etcd and redis-server, and w11
    /// `--luigi-python`, else their rows say they were skipped).
    #[arg(long, default_value = ALL_WORKLOADS)]
    only: String,
    /// The Python of a venv with Luigi (`make bench`: .tools/bench-venv),
    /// for workload 11's peer rows; without it they are skipped.
    #[arg(long)]
    luigi_python: Option<PathBuf>,
    /// Where the temporary data directories go [default: the system temp dir].
    #[arg(long)]
    tmp_dir: Option<PathBuf>,
    /// Keep the temporary directory (service logs, data dirs) afterwards.
    #[arg(long)]
    keep: bool,
}

/// Every workload; a run of all of them is the only one recorded in
/// `--out`.
const ALL_WORKLOADS: &str = "w1,w2,w3,w5,w6,w7,w8,w9,w10,w11";

/// What every workload needs.
pub struct Ctx {
    pub orchestrator: PathBuf,
    pub scripts: PathBuf,
    pub workers: usize,
    pub runs: usize,
    pub scale: f64,
    /// The service's flags from `--sandbox-attempts` and
    /// `--sandbox-reuse`: none for its defaults.
    pub sandbox_flags: Vec<String>,
    pub tmp: PathBuf,
    /// `--keep`: leave every data directory in place.
    pub keep: bool,
    /// The SurrealDB server, with `surrealdb-server` among the backends.
    pub surreal: Option<surreal::SurrealServer>,
}

impl Ctx {
    pub fn scaled(&self, n: usize) -> usize {
        ((n as f64 * self.scale).round() as usize).max(1)
    }
}

/// Every result of one invocation; `None` where a workload was not run,
/// `Err` text where it failed.
#[derive(Default)]
pub struct Results {
    pub backends: Vec<BackendResults>,
    /// Workload 5, per backend.
    pub scale: Vec<(String, Result<workloads::Scale, String>)>,
    /// Workload 5: finished history on the filesystem.
    pub history: Option<Result<workloads::History, String>>,
    pub migrate: Option<Result<workloads::Migration, String>>,
    /// Workload 8.
    pub live: Option<Result<live::LiveMigration, String>>,
    /// Workload 9.
    pub scale_out: Option<Result<scaleout::ScaleOut, String>>,
    /// Workload 10.
    pub testenvs: Option<Result<testenvs::Outcome, String>>,
    /// Workload 11.
    pub peers: Option<Result<peers::Outcome, String>>,
}

pub struct BackendResults {
    pub backend: String,
    pub w1: Option<Result<workloads::W1, String>>,
    pub w2: Option<Result<workloads::W2, String>>,
    pub w3: Option<Result<workloads::LatencyAndReads, String>>,
    pub w7: Option<Result<workloads::W7, String>>,
}

fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == rusage::WRAP) {
        return rusage::reap(&argv[2..]);
    }
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn flatten<T>(r: Result<T>) -> Option<Result<T, String>> {
    Some(r.map_err(|e| format!("{e:#}")))
}

async fn run(args: Args) -> Result<bool> {
    let started = Instant::now();
    let load_at_start = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into());
    let orchestrator = binary(
        args.orchestrator,
        "orchestrator",
        "build it first (`cargo build --release -p orchestrator`) or pass --orchestrator",
    )?;
    let scripts = std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts"))
        .context("the bench scripts directory")?;
    let workers = args.workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(2)
    });
    let tmp_parent = args.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp = tempfile::Builder::new()
        .prefix("orchestrator-bench-")
        .tempdir_in(&tmp_parent)?;
    let only: Vec<&str> = args.only.split(',').map(str::trim).collect();
    let backends: Vec<String> = args
        .backends
        .split(',')
        .map(|b| b.trim().to_owned())
        .filter(|b| !b.is_empty())
        .collect();
    let server_backend = backends.iter().any(|b| b == "surrealdb-server");
    let surreal = if server_backend {
        let binary = binary(
            args.surreal,
            "surreal-dev-server",
            "the surrealdb-server backend needs a SurrealDB server; build it (`cargo build --release -p surreal-dev-server`) or pass --surreal",
        )?;
        Some(surreal::SurrealServer::start(&binary).await?)
    } else {
        None
    };
    let ctx = Ctx {
        orchestrator: std::fs::canonicalize(&orchestrator)?,
        scripts,
        workers,
        runs: args.runs.max(1),
        scale: args.scale,
        sandbox_flags: args
            .sandbox_attempts
            .map(|n| ["--script-sandbox-attempts".to_owned(), n.to_string()])
            .into_iter()
            .chain(
                args.sandbox_reuse
                    .clone()
                    .map(|reuse| ["--script-sandbox-reuse".to_owned(), reuse]),
            )
            .flatten()
            .collect(),
        tmp: tmp.path().to_path_buf(),
        keep: args.keep,
        surreal,
    };
    eprintln!(
        "orchestrator-bench: {} with {workers} workers, {} run(s) per figure, backends {backends:?}, data in {}",
        ctx.orchestrator.display(),
        ctx.runs,
        ctx.tmp.display()
    );

    let mut results = Results::default();
    for backend in &backends {
        let mut b = BackendResults {
            backend: backend.clone(),
            w1: None,
            w2: None,
            w3: None,
            w7: None,
        };
        if only.contains(&"w1") {
            eprintln!("[{backend}] workload 1: independent tasks");
            b.w1 = flatten(workloads::independent(&ctx, backend).await);
        }
        if only.contains(&"w2") {
            eprintln!("[{backend}] workload 2: DAG");
            b.w2 = flatten(workloads::dag(&ctx, backend).await);
        }
        if only.contains(&"w7") && backend == "surrealdb-server" {
            // Minutes per size on a shared server; workload 9 measures
            // that backend.
            eprintln!("[{backend}] workload 7: not run on this backend");
        } else if only.contains(&"w7") {
            eprintln!("[{backend}] workload 7: one workflow of N steps");
            b.w7 = flatten(workloads::one_workflow(&ctx, backend).await);
        }
        if only.contains(&"w3") || only.contains(&"w4") {
            eprintln!("[{backend}] workloads 3 and 4: latency and reads");
            b.w3 = flatten(workloads::latency_and_reads(&ctx, backend).await);
        }
        results.backends.push(b);
    }
    if only.contains(&"w11") {
        // Luigi and the floor do not depend on the backend: the
        // orchestrator's side runs on the first one only.
        let backend = backends.first().map_or("filesystem", String::as_str);
        eprintln!(
            "[{backend}] workload 11: peers, the same workflows through the floor, the orchestrator and Luigi"
        );
        results.peers = flatten(peers::peers(&ctx, backend, args.luigi_python.as_deref()).await);
        if let Some(Ok(peers::Outcome::Skipped(why))) = &results.peers {
            eprintln!("workload 11: skipped: {why}");
        }
    }
    let (want5, want6) = (only.contains(&"w5"), only.contains(&"w6"));
    let want8 = only.contains(&"w8");
    let embedded = backends.iter().any(|b| b == "surrealdb-embedded");
    if want5 || want6 || want8 {
        eprintln!("workloads 5, 6 and 8: generating the 100k-task data sets");
        let mut sizes = Vec::new();
        if want5 || want6 {
            sizes.push(("w5-data", 100_000));
        }
        if want6 {
            // For how peak memory of a migration grows with the store.
            sizes.push(("w6-small-data", 10_000));
        }
        if want8 {
            // A copy of its own: the storage move leaves its data dir
            // switched to another store, with the load's workflows in it.
            sizes.push(("w8-data", 100_000));
        }
        match workloads::datasets(&ctx, &sizes).await {
            Err(e) => {
                let e = format!("generating the data set: {e:#}");
                if want5 {
                    results.scale.push(("filesystem".into(), Err(e.clone())));
                }
                if want6 {
                    results.migrate = Some(Err(e.clone()));
                }
                if want8 {
                    results.live = Some(Err(e));
                }
            }
            Ok(sets) => {
                let named = |name: &str| sets.iter().find(|s| s.dir.ends_with(name));
                if let Some(data) = named("w5-data") {
                    scale_and_migration(
                        &ctx,
                        &mut results,
                        data,
                        named("w6-small-data"),
                        (want5, want6),
                        embedded,
                    )
                    .await;
                }
                if want8 {
                    // Filesystem → filesystem only, whatever the backends:
                    // a move into embedded SurrealDB is not written yet
                    // (it needs the SurrealDB build to try it on).
                    eprintln!(
                        "workload 8: storage move filesystem → filesystem under {}/s submissions",
                        live::RATE
                    );
                    let r = match named("w8-data") {
                        Some(data) => live::live_migration(&ctx, data).await,
                        None => Err(anyhow!("the w8 data set was not generated")),
                    };
                    results.live = flatten(r);
                }
            }
        }
    }

    if only.contains(&"w9") && server_backend {
        eprintln!(
            "workload 9: scale-out, 1-3 nodes on one SurrealDB server, {} x {} ms steps",
            ctx.scaled(scaleout::TASKS),
            scaleout::STEP_MS
        );
        results.scale_out = flatten(scaleout::scale_out(&ctx).await);
    }

    if only.contains(&"w10") {
        eprintln!(
            "workload 10: test environments (namespace provider): redis ready, etcd_cluster created, checked, deleted"
        );
        results.testenvs = flatten(testenvs::test_environments(&ctx).await);
        if let Some(Ok(testenvs::Outcome::Skipped(why))) = &results.testenvs {
            eprintln!("workload 10: skipped: {why}");
        }
    }

    let env =
        report::Environment::collect(&ctx, &tmp_parent, started.elapsed(), load_at_start).await;
    let table = report::render(&ctx, &env, &results);
    println!("{table}");
    let failures = report::failures(&results);
    for f in &failures {
        eprintln!("FAILED: {f}");
    }
    if let Some(out) = &args.out {
        if !failures.is_empty() {
            eprintln!("not writing {} because a run failed", out.display());
        } else if ctx.scale != 1.0
            || !ctx.sandbox_flags.is_empty()
            || !ALL_WORKLOADS.split(',').all(|w| only.contains(&w))
        {
            eprintln!(
                "not writing {}: only a full run (scale 1, every workload, the default sandbox) is recorded",
                out.display()
            );
        } else {
            report::write_doc(out, &table, &report::history_line(&env, &results))?;
            eprintln!("wrote {}", out.display());
        }
    }
    if let Some(server) = ctx.surreal {
        server.stop().await;
    }
    if args.keep {
        let kept = tmp.keep();
        eprintln!("kept {}", kept.display());
    }
    eprintln!("bench took {:.0} s", started.elapsed().as_secs_f64());
    Ok(failures.is_empty())
}

/// `given`, or the binary `name` next to this one; `hint` says what to do
/// when it is not there.
fn binary(given: Option<PathBuf>, name: &str, hint: &str) -> Result<PathBuf> {
    let path = match given {
        Some(path) => path,
        None => std::env::current_exe()?
            .parent()
            .ok_or_else(|| anyhow!("no directory for the current executable"))?
            .join(name),
    };
    if !path.is_file() {
        bail!("{} not found: {hint}", path.display());
    }
    Ok(path)
}

/// Workloads 5 and 6 on the 100k data set `data` (`small`: workload 6's
/// 10k one), as `want` = (workload 5, workload 6) asks.
async fn scale_and_migration(
    ctx: &Ctx,
    results: &mut Results,
    data: &workloads::DataSet,
    small: Option<&workloads::DataSet>,
    (want5, want6): (bool, bool),
    embedded: bool,
) {
    if want5 {
        eprintln!("[filesystem] workload 5: 100k stored tasks");
        let r = workloads::scale(ctx, "filesystem", data, &data.dir, None).await;
        results
            .scale
            .push(("filesystem".into(), r.map_err(|e| format!("{e:#}"))));
        eprintln!(
            "[filesystem] workload 5: {} finished one-step workflows at rest",
            ctx.scaled(workloads::HISTORY_WORKFLOWS)
        );
        results.history = flatten(workloads::history(ctx).await);
    }
    let mut converted = None;
    if want6 {
        let other = if embedded {
            "surrealdb-embedded"
        } else {
            "filesystem"
        };
        eprintln!("workload 6: migration filesystem → {other} → filesystem");
        let r = workloads::migration(ctx, data, small, other).await;
        if let Ok(m) = &r {
            converted.clone_from(&m.embedded);
        }
        results.migrate = flatten(r);
    }
    if want5 && embedded {
        let backend = "surrealdb-embedded";
        eprintln!(
            "[{backend}] workload 5: 100k stored tasks, converted with `orchestrator migrate`"
        );
        let r = async {
            let (dir, took) = match converted {
                Some(c) => c,
                None => workloads::convert(ctx, data, backend).await?,
            };
            workloads::scale(ctx, backend, data, &dir, Some(took)).await
        }
        .await;
        results
            .scale
            .push((backend.into(), r.map_err(|e| format!("{e:#}"))));
    }
}
