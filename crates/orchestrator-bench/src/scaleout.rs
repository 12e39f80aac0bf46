//! Workload 9 (issue 18): throughput of 1, 2 and 3 `orchestrator serve`
//! nodes on one SurrealDB server, with I/O-bound steps, a ledger of every
//! start, and a node SIGKILLed halfway through.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::Ctx;
use crate::service::{Join, Service, post_json};
use crate::stats::median;

/// One-step workflows per run.
pub const TASKS: usize = 600;
/// Workers of each node: with 200 ms steps, one node can run at most
/// 8 / 0.2 = 40 tasks/s, and the nodes, not the 2 cores, are the limit.
pub const NODE_WORKERS: usize = 8;
/// `sleep.sh`'s sleep.
pub const STEP_MS: u64 = 200;
/// Short, so the takeover drill does not wait 15 s; the target is relative
/// to it (lease + 2 s).
pub const LEASE_SECS: u64 = 5;
const SUBMITTERS: usize = 8;
pub const KILLED: usize = 2;

/// Where the submissions go.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Pattern {
    /// Submission `i` to node `i mod n`.
    EveryNode,
    /// All to the first node; the others must find the work themselves.
    OneNode,
}

impl Pattern {
    pub fn describe(self) -> &'static str {
        match self {
            Pattern::EveryNode => "to every node in turn",
            Pattern::OneNode => "all to one node",
        }
    }
}

/// One configuration, over `ctx.runs` runs.
pub struct Config {
    /// One-step workflows per run.
    pub tasks: usize,
    pub nodes: usize,
    pub pattern: Pattern,
    /// First submit → the last completion, per run.
    pub secs: Vec<f64>,
    /// CPU (user + system) per task of the SurrealDB server and of all the
    /// nodes together, per run, in ms.
    pub server_cpu_ms: Vec<f64>,
    pub nodes_cpu_ms: Vec<f64>,
    /// Tasks each node started, summed over the runs (from the ledgers).
    pub started_by_node: Vec<usize>,
    /// Starts beyond one per task (and beyond the task's own recorded
    /// interruptions), over every run: must be 0.
    pub double_runs: usize,
    /// Storage calls of all nodes, by operation, summed over the runs
    /// (from each node's `/metrics`): where the coordination goes.
    pub storage: StorageCalls,
}

/// Per storage operation: (calls, seconds), summed.
#[derive(Default)]
pub struct StorageCalls(pub HashMap<String, (f64, f64)>);

impl StorageCalls {
    /// Adds a node's `orchestrator_storage_operation_duration_seconds`
    /// counts and sums.
    fn add(&mut self, metrics: &str) {
        const NAME: &str = "orchestrator_storage_operation_duration_seconds";
        for line in metrics.lines() {
            let (is_count, rest) = if let Some(rest) = line.strip_prefix(&format!("{NAME}_count{{"))
            {
                (true, rest)
            } else if let Some(rest) = line.strip_prefix(&format!("{NAME}_sum{{")) {
                (false, rest)
            } else {
                continue;
            };
            let Some((labels, value)) = rest.split_once("} ") else {
                continue;
            };
            let Some(op) = labels
                .split(',')
                .find_map(|l| l.strip_prefix("operation=\""))
                .map(|v| v.trim_end_matches('"'))
            else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let entry = self.0.entry(op.to_owned()).or_default();
            if is_count {
                entry.0 += value;
            } else {
                entry.1 += value;
            }
        }
    }

    /// The operations by time spent, most first: (name, calls, seconds).
    pub fn by_time(&self) -> Vec<(&str, f64, f64)> {
        let mut ops: Vec<(&str, f64, f64)> = self
            .0
            .iter()
            .map(|(op, (calls, secs))| (op.as_str(), *calls, *secs))
            .collect();
        ops.sort_by(|a, b| b.2.total_cmp(&a.2));
        ops
    }
}

impl Config {
    pub fn tasks_per_s(&self) -> f64 {
        self.tasks as f64 / median(&self.secs)
    }
}

pub struct Takeover {
    /// Completed tasks when the node was killed.
    pub completed_at_kill: u64,
    /// Tasks the killed node held (running) when it died.
    pub held: usize,
    /// SIGKILL → the last of those running on (or finished by) another node.
    pub takeover_s: f64,
    pub completed: usize,
    pub double_runs: usize,
    /// Tasks with an interruption recorded, over all of them.
    pub interrupted: usize,
}

pub struct ScaleOut {
    pub tasks: usize,
    pub configs: Vec<Config>,
    pub takeover: Result<Takeover, String>,
}

impl ScaleOut {
    pub fn one_node(&self) -> Option<&Config> {
        self.configs.iter().find(|c| c.nodes == 1)
    }
}

pub async fn scale_out(ctx: &Ctx) -> Result<ScaleOut> {
    let server = ctx
        .surreal
        .as_ref()
        .ok_or_else(|| anyhow!("workload 9 needs the SurrealDB server"))?;
    let tasks = ctx.scaled(TASKS);
    let mut configs = Vec::new();
    for (nodes, pattern) in [
        (1, Pattern::EveryNode),
        (2, Pattern::EveryNode),
        (3, Pattern::EveryNode),
        (2, Pattern::OneNode),
        (3, Pattern::OneNode),
    ] {
        let mut c = Config {
            tasks,
            nodes,
            pattern,
            secs: vec![],
            server_cpu_ms: vec![],
            nodes_cpu_ms: vec![],
            started_by_node: vec![0; nodes],
            double_runs: 0,
            storage: StorageCalls::default(),
        };
        for run in 0..ctx.runs {
            let tag = format!("w9-n{nodes}-{pattern:?}-{run}").to_lowercase();
            let cluster = start_cluster(ctx, nodes, &tag).await?;
            let (server0, nodes0) = (server.cpu_secs()?, cpu(&cluster)?);
            let t0 = Instant::now();
            submit(&cluster, pattern, tasks).await?;
            cluster[0]
                .wait_completed(tasks as u64, Duration::from_secs(300))
                .await?;
            let took = t0.elapsed().as_secs_f64();
            let per_task = |d: f64| d / tasks as f64 * 1000.0;
            c.server_cpu_ms.push(per_task(server.cpu_secs()? - server0));
            c.nodes_cpu_ms.push(per_task(cpu(&cluster)? - nodes0));
            c.secs.push(took);
            let ledger = Ledger::read(&cluster)?;
            let stored = all_tasks(&cluster[0], tasks).await?;
            c.double_runs += ledger.double_runs(&stored);
            for (i, n) in ledger.started_by_node().into_iter().enumerate() {
                c.started_by_node[i] += n;
            }
            for svc in &cluster {
                c.storage.add(&svc.get_text("/metrics").await?);
            }
            for svc in cluster {
                svc.stop().await?;
            }
            eprintln!(
                "  w9 {nodes} node(s), {}, run {}: {:.3} s = {:.1} tasks/s",
                pattern.describe(),
                run + 1,
                took,
                tasks as f64 / took
            );
        }
        configs.push(c);
    }
    eprintln!("  w9 takeover: 3 nodes, node {KILLED} SIGKILLed halfway");
    let takeover = takeover(ctx, tasks).await.map_err(|e| format!("{e:#}"));
    Ok(ScaleOut {
        tasks,
        configs,
        takeover,
    })
}

/// Starts `n` nodes on a fresh database, one after the other (the first
/// defines the schema).
async fn start_cluster(ctx: &Ctx, n: usize, tag: &str) -> Result<Vec<Service>> {
    let database = format!("bench_{}", tag.replace('-', "_"));
    let mut nodes = Vec::new();
    for i in 0..n {
        let join = Join {
            database: Some(database.clone()),
            workers: Some(NODE_WORKERS),
            flags: vec![
                "--node-id".into(),
                format!("node-{i}"),
                "--lease-secs".into(),
                LEASE_SECS.to_string(),
            ],
            ..Join::default()
        };
        let dir = ctx.tmp.join(format!("{tag}-node{i}"));
        nodes.push(Service::start_with(ctx, "surrealdb-server", &dir, &join).await?);
    }
    Ok(nodes)
}

fn cpu(cluster: &[Service]) -> Result<f64> {
    cluster.iter().map(Service::cpu_secs).sum()
}

fn sleep_step() -> Value {
    json!({
        "template": {
            "name": "bench sleep",
            "ref_name": "bench-sleep",
            "schema_version": 1,
            "steps": [{"ref_name": "run", "script": "sleep.sh"}],
        },
        "max_attempts": 1,
    })
}

/// `n` one-step workflows from `SUBMITTERS` concurrent loops, as fast as
/// the nodes answer.
async fn submit(cluster: &[Service], pattern: Pattern, n: usize) -> Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let urls: Arc<Vec<String>> = Arc::new(cluster.iter().map(|s| s.url("/workflows")).collect());
    let body = Arc::new(sleep_step());
    let mut loops = Vec::new();
    for _ in 0..SUBMITTERS {
        let (next, urls, body, http) = (
            next.clone(),
            urls.clone(),
            body.clone(),
            cluster[0].http.clone(),
        );
        loops.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                let url = match pattern {
                    Pattern::EveryNode => &urls[i % urls.len()],
                    Pattern::OneNode => &urls[0],
                };
                post_json(&http, url, &body).await?;
            }
        }));
    }
    for l in loops {
        l.await??;
    }
    Ok(())
}

/// What the store says of one task.
struct Stored {
    completed: bool,
    interruptions: u64,
}

/// Every task of the run, from one node (the store is shared).
async fn all_tasks(node: &Service, want: usize) -> Result<HashMap<String, Stored>> {
    let mut out = HashMap::new();
    let mut offset = 0;
    loop {
        let page = node
            .get_json(&format!("/tasks?limit=1000&offset={offset}"))
            .await?;
        let tasks = page["tasks"]
            .as_array()
            .ok_or_else(|| anyhow!("no tasks in {page}"))?;
        for t in tasks {
            let id = t["id"].as_str().context("a task without an id")?;
            out.insert(
                id.to_owned(),
                Stored {
                    completed: t["status"] == "completed",
                    interruptions: t["interruptions"].as_u64().unwrap_or(0),
                },
            );
        }
        offset += tasks.len();
        if tasks.is_empty() || offset >= page["total"].as_u64().unwrap_or(0) as usize {
            break;
        }
    }
    if out.len() != want {
        bail!("the store holds {} tasks, {want} were submitted", out.len());
    }
    Ok(out)
}

/// Every start of `sleep.sh`: each node's scripts append "<task id> <time>"
/// to `bench-ledger.txt` in that node's scripts' state directory.
struct Ledger {
    /// Per node, the task ids it started, in order.
    starts: Vec<Vec<String>>,
}

impl Ledger {
    fn read(cluster: &[Service]) -> Result<Ledger> {
        let starts = cluster
            .iter()
            .map(|svc| Ledger::read_dir(&svc.data_dir))
            .collect::<Result<_>>()?;
        Ok(Ledger { starts })
    }

    /// The task ids started by the node of `data_dir`.
    fn read_dir(data_dir: &Path) -> Result<Vec<String>> {
        // The scripts' state dir: their ORCHESTRATOR_DATA_DIR.
        let path = data_dir.join("script-state").join("bench-ledger.txt");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e).with_context(|| path.display().to_string()),
        };
        Ok(text
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(str::to_owned)
            .collect())
    }

    fn started_by_node(&self) -> Vec<usize> {
        self.starts.iter().map(Vec::len).collect()
    }

    /// Starts beyond the first of each task that its record does not
    /// explain: a task interrupted by a node's death is started once more
    /// per interruption, and that is the takeover, not a double run. A
    /// task that never started, or did not complete, is a double run's
    /// opposite and fails the run elsewhere; here it counts too.
    fn double_runs(&self, stored: &HashMap<String, Stored>) -> usize {
        let mut count: HashMap<&str, u64> = HashMap::new();
        for id in self.starts.iter().flatten() {
            *count.entry(id.as_str()).or_default() += 1;
        }
        let mut doubles = 0;
        for (id, n) in &count {
            let allowed = 1 + stored.get(*id).map_or(0, |s| s.interruptions);
            doubles += n.saturating_sub(allowed) as usize;
        }
        doubles
    }
}

/// 3 nodes, submissions to every node in turn; once half the tasks have
/// completed, node `KILLED` gets SIGKILL. Measures how long until every
/// task it held runs elsewhere, and that every task completes once.
async fn takeover(ctx: &Ctx, tasks: usize) -> Result<Takeover> {
    let mut cluster = start_cluster(ctx, 3, "w9-takeover").await?;
    submit(&cluster, Pattern::EveryNode, tasks).await?;
    let half = (tasks / 2) as u64;
    cluster[0]
        .wait_completed(half, Duration::from_secs(300))
        .await?;
    let completed_at_kill = cluster[0].count("completed").await?;
    let victim = cluster.remove(KILLED);
    let victim_dir = victim.data_dir.clone();
    let victim_id = format!("node-{KILLED}");
    victim.kill().await?;
    let killed_at = Instant::now();
    // Dead, it writes nothing more: what the store shows running on it now
    // is exactly what it held.
    let held: Vec<String> = running(&cluster[0])
        .await?
        .into_iter()
        .filter(|(_, node)| node == &victim_id)
        .map(|(id, _)| id)
        .collect();
    let lease = Duration::from_secs(LEASE_SECS);
    let mut waiting = held.clone();
    while !waiting.is_empty() {
        let mut still = Vec::new();
        for id in waiting {
            let t = cluster[0].get_json(&format!("/tasks/{id}")).await?;
            let moved = t["node"].as_str() != Some(victim_id.as_str())
                && matches!(t["status"].as_str(), Some("running" | "completed"));
            if !moved {
                still.push(id);
            }
        }
        waiting = still;
        if killed_at.elapsed() > lease * 4 + Duration::from_secs(30) {
            bail!(
                "{} task(s) of the killed node were not taken over within {:?}",
                waiting.len(),
                killed_at.elapsed()
            );
        }
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let takeover_s = killed_at.elapsed().as_secs_f64();
    cluster[0]
        .wait_completed(tasks as u64, Duration::from_secs(300))
        .await?;
    let stored = all_tasks(&cluster[0], tasks).await?;
    let mut ledger = Ledger::read(&cluster)?;
    ledger.starts.push(Ledger::read_dir(&victim_dir)?);
    let completed = stored.values().filter(|s| s.completed).count();
    let interrupted = stored.values().filter(|s| s.interruptions > 0).count();
    let double_runs = ledger.double_runs(&stored);
    for svc in cluster {
        svc.stop().await?;
    }
    eprintln!(
        "  w9 takeover: {} held task(s) running elsewhere {takeover_s:.2} s after SIGKILL; {completed}/{tasks} completed, {double_runs} double run(s)",
        held.len()
    );
    Ok(Takeover {
        completed_at_kill,
        held: held.len(),
        takeover_s: if held.is_empty() { 0.0 } else { takeover_s },
        completed,
        double_runs,
        interrupted,
    })
}

/// `(task id, node)` of every running task.
async fn running(node: &Service) -> Result<Vec<(String, String)>> {
    let page = node.get_json("/tasks?status=running&limit=1000").await?;
    let tasks = page["tasks"]
        .as_array()
        .ok_or_else(|| anyhow!("no tasks in {page}"))?;
    Ok(tasks
        .iter()
        .filter_map(|t| {
            Some((
                t["id"].as_str()?.to_owned(),
                t["node"].as_str().unwrap_or_default().to_owned(),
            ))
        })
        .collect())
}
