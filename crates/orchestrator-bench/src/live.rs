//! Workload 8: a storage move of the 100k-task data set while
//! submissions keep arriving at a steady rate.
//!
//! The service moves itself to another store while it serves
//! (`POST /admin/storage/migrations`), so what a user sees of the move is
//! the latency of the requests they send meanwhile, whether any of them
//! fails, and whether everything the service acknowledged is still there
//! afterwards. The client runs open loop: a request that waits (at the
//! switch, say) does not delay the ones after it, so a stall shows up as
//! latency instead of as fewer requests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::Ctx;
use crate::service::Service;
use crate::stats::percentile;
use crate::workloads::DataSet;

/// Submissions per second while the store moves (the figure).
pub const RATE: u32 = 50;
/// The batch size the service uses when the request names none (the
/// storage crate's `live::DEFAULT_BATCH`; this crate depends on none of
/// ours); sent as no `batch_size` at all, so that the default is what is
/// measured.
pub const DEFAULT_BATCH: usize = 2000;
/// Load before the migration starts: the same requests without a move,
/// for comparison.
const BEFORE: Duration = Duration::from_secs(3);
/// Load after the switch: requests served by the new store.
const AFTER: Duration = Duration::from_secs(3);
/// One request may take this long before it counts as failed.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);
/// The whole move may take this long before the run counts as failed.
const MOVE_LIMIT: Duration = Duration::from_secs(900);
/// How often the migration's status is read.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// How long the acknowledged submissions may take to finish after the
/// load stopped.
const FINISH_LIMIT: Duration = Duration::from_secs(180);
/// Errors kept as examples (the count is of all of them).
const ERRORS_KEPT: usize = 5;

fn one_step() -> Value {
    json!({
        "template": {
            "name": "bench storage move",
            "ref_name": "bench-live-migration",
            "schema_version": 1,
            "steps": [{"ref_name": "run", "script": "noop.sh"}],
        },
        "max_attempts": 1,
    })
}

/// One request of the load.
struct Sample {
    /// The client's clock just before sending.
    sent: DateTime<Utc>,
    latency_ms: f64,
    /// Why it failed (a status other than 2xx, a connection error, a
    /// timeout, an answer without a workflow id).
    error: Option<String>,
}

/// A submission and, if it was acknowledged, the read of it.
struct Exchange {
    submit: Sample,
    read: Option<Sample>,
    /// The workflow id of an acknowledged submission.
    id: Option<String>,
}

/// Latency of a set of requests.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    fn of(samples: &[&Sample]) -> Latency {
        let mut ms: Vec<f64> = samples.iter().map(|s| s.latency_ms).collect();
        ms.sort_by(f64::total_cmp);
        Latency {
            count: ms.len(),
            p50_ms: percentile(&ms, 50.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms.last().copied().unwrap_or_default(),
        }
    }
}

/// Latency of submits, reads, and both, over one stretch of the load.
#[derive(Debug, Clone, Default)]
pub struct Stretch {
    pub all: Latency,
    pub submits: Latency,
    pub reads: Latency,
}

/// What the migration's own status said at its end.
#[derive(Debug, Clone)]
pub struct Phases {
    pub copying_ms: u64,
    pub mirroring_ms: u64,
    pub verifying_ms: u64,
    pub switching_ms: u64,
    pub switch_stall_ms: f64,
    pub records_total: u64,
    pub records_copied: u64,
    pub records_mirrored: u64,
    pub records_verified: u64,
    /// The status's `rate`: records per second of the copy.
    pub rate: f64,
    /// `started_at` → `finished_at` of the status.
    pub move_s: f64,
}

pub struct LiveMigration {
    pub source: String,
    pub target: String,
    pub workflows: usize,
    pub tasks: usize,
    pub logs: usize,
    pub phases: Phases,
    /// Load before the migration started, during the move (sent between
    /// its `started_at` and `finished_at`), and after the switch.
    pub before: Stretch,
    pub during: Stretch,
    pub after: Stretch,
    /// Requests sent, submits and reads, over the whole load.
    pub requests: usize,
    pub failures: usize,
    pub errors: Vec<String>,
    /// Submissions answered with a workflow id.
    pub acknowledged: usize,
    /// Of those, found by `GET /workflows/{id}` after the move, and found
    /// completed.
    pub present: usize,
    pub completed: usize,
    /// A few ids that were acknowledged but are missing or did not
    /// complete, with what was found.
    pub not_completed: Vec<String>,
}

impl LiveMigration {
    /// (workflows + tasks + every other record) ÷ the copy phase's time.
    pub fn copy_rate(&self) -> f64 {
        self.phases.records_total as f64 / (self.phases.copying_ms.max(1) as f64 / 1000.0)
    }
}

/// Starts a service on `data` (filesystem), sends [`RATE`] one-step
/// submissions per second (each read back once acknowledged), moves the
/// service to a new filesystem store under that load, and checks every
/// acknowledged submission afterwards.
pub async fn live_migration(ctx: &Ctx, data: &DataSet) -> Result<LiveMigration> {
    let target_dir = std::path::absolute(ctx.tmp.join("w8-target"))?;
    let target = format!("filesystem:{}", target_dir.display());
    let svc = Service::start(ctx, "filesystem", &data.dir).await?;
    let health = svc.get_json("/health").await?;
    if health["storage"] != json!("filesystem") {
        bail!(
            "/health reports storage {} before the move",
            health["storage"]
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(steady_load(
        svc.http.clone(),
        svc.base.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(BEFORE).await;

    let outcome = migrate(&svc, &target).await;
    // The load runs on after the switch (or stops at once if the move
    // failed, so that the error is reported without waiting).
    if outcome.is_ok() {
        tokio::time::sleep(AFTER).await;
    }
    stop.store(true, Ordering::Relaxed);
    let exchanges = load.await.context("the load task")?;
    let status = outcome?;

    let store = svc.get_json("/admin/storage").await?;
    let status_target = status["target"].as_str().unwrap_or_default();
    if store["store"].as_str() != Some(status_target) {
        bail!("after the move the service works on {store}, expected {status_target}");
    }

    let started = timestamp(&status, "started_at")?;
    let finished = timestamp(&status, "finished_at")?;
    let stretch = |pick: &dyn Fn(&DateTime<Utc>) -> bool| {
        let submits: Vec<&Sample> = exchanges
            .iter()
            .map(|e| &e.submit)
            .filter(|s| pick(&s.sent))
            .collect();
        let reads: Vec<&Sample> = exchanges
            .iter()
            .filter_map(|e| e.read.as_ref())
            .filter(|s| pick(&s.sent))
            .collect();
        let all: Vec<&Sample> = submits.iter().chain(reads.iter()).copied().collect();
        Stretch {
            all: Latency::of(&all),
            submits: Latency::of(&submits),
            reads: Latency::of(&reads),
        }
    };
    let before = stretch(&|t| *t < started);
    let during = stretch(&|t| *t >= started && *t < finished);
    let after = stretch(&|t| *t >= finished);

    let samples = exchanges
        .iter()
        .flat_map(|e| std::iter::once(&e.submit).chain(e.read.as_ref()));
    let (mut requests, mut failures, mut errors) = (0, 0, Vec::new());
    for s in samples {
        requests += 1;
        if let Some(e) = &s.error {
            failures += 1;
            if errors.len() < ERRORS_KEPT {
                errors.push(e.clone());
            }
        }
    }
    let ids: Vec<&str> = exchanges.iter().filter_map(|e| e.id.as_deref()).collect();
    let check = check_submissions(&svc, &ids).await?;
    svc.stop().await?;

    let phase = |name: &str| status["phases"][name].as_u64().unwrap_or_default();
    let count = |name: &str| status[name].as_u64().unwrap_or_default();
    let phases = Phases {
        copying_ms: phase("copying_ms"),
        mirroring_ms: phase("mirroring_ms"),
        verifying_ms: phase("verifying_ms"),
        switching_ms: phase("switching_ms"),
        switch_stall_ms: status["switch_stall_ms"]
            .as_f64()
            .ok_or_else(|| anyhow!("no switch_stall_ms in the completed status {status}"))?,
        records_total: count("records_total"),
        records_copied: count("records_copied"),
        records_mirrored: count("records_mirrored"),
        records_verified: count("records_verified"),
        rate: status["rate"].as_f64().unwrap_or_default(),
        move_s: (finished - started).as_seconds_f64(),
    };
    eprintln!(
        "  w8: copying {} ms, mirroring {} ms, verifying {} ms, switching {} ms (stall {:.1} ms); \
         {} records; during the move p99 {:.1} ms, max {:.1} ms; {failures} of {requests} requests failed; \
         {} of {} acknowledged submissions completed",
        phases.copying_ms,
        phases.mirroring_ms,
        phases.verifying_ms,
        phases.switching_ms,
        phases.switch_stall_ms,
        phases.records_total,
        during.all.p99_ms,
        during.all.max_ms,
        check.completed,
        ids.len(),
    );
    if !ctx.keep {
        let _ = std::fs::remove_dir_all(&target_dir);
    }
    Ok(LiveMigration {
        source: status["source"].as_str().unwrap_or_default().to_owned(),
        target: status_target.to_owned(),
        workflows: data.workflows,
        tasks: data.tasks,
        logs: data.logs,
        phases,
        before,
        during,
        after,
        requests,
        failures,
        errors,
        acknowledged: ids.len(),
        present: check.present,
        completed: check.completed,
        not_completed: check.examples,
    })
}

fn timestamp(status: &Value, field: &str) -> Result<DateTime<Utc>> {
    let text = status[field]
        .as_str()
        .ok_or_else(|| anyhow!("no {field} in the migration's status {status}"))?;
    Ok(DateTime::parse_from_rfc3339(text)
        .with_context(|| format!("{field} of the migration's status: {text}"))?
        .with_timezone(&Utc))
}

/// Starts the move to `target` and polls its status until it ends; the
/// final status, or an error if it did not complete.
async fn migrate(svc: &Service, target: &str) -> Result<Value> {
    let r = svc
        .http
        .post(svc.url("/admin/storage/migrations"))
        .json(&json!({"target": target}))
        .timeout(REQUEST_LIMIT)
        .send()
        .await
        .context("POST /admin/storage/migrations")?;
    let code = r.status();
    let location = r
        .headers()
        .get(reqwest::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = r.text().await?;
    if code != reqwest::StatusCode::ACCEPTED {
        bail!("POST /admin/storage/migrations: {code}: {text}");
    }
    let location = location
        .ok_or_else(|| anyhow!("POST /admin/storage/migrations answered without a Location"))?;
    let t0 = Instant::now();
    let mut last_phase = String::new();
    loop {
        let status = svc.get_json(&location).await?;
        let phase = status["phase"].as_str().unwrap_or_default().to_owned();
        if phase != last_phase {
            eprintln!(
                "  w8: {phase} at {:.1} s ({} of {} records copied)",
                t0.elapsed().as_secs_f64(),
                status["records_copied"],
                status["records_total"]
            );
            last_phase.clone_from(&phase);
        }
        match phase.as_str() {
            "completed" => return Ok(status),
            "copying" | "mirroring" | "verifying" | "switching" => {}
            _ => bail!("the storage move ended as {phase}: {status}"),
        }
        if t0.elapsed() > MOVE_LIMIT {
            bail!("the storage move did not end within {MOVE_LIMIT:?}: {status}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// [`RATE`] submissions per second on a fixed schedule until `stop`,
/// each read back once acknowledged; every exchange, in the order sent.
async fn steady_load(http: reqwest::Client, base: String, stop: Arc<AtomicBool>) -> Vec<Exchange> {
    let body = Arc::new(one_step());
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / u64::from(RATE)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut handles = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let (http, base, body) = (http.clone(), base.clone(), body.clone());
        handles.push(tokio::spawn(
            async move { exchange(&http, &base, &body).await },
        ));
    }
    let mut exchanges = Vec::with_capacity(handles.len());
    for h in handles {
        match h.await {
            Ok(e) => exchanges.push(e),
            // A request task cannot panic short of a bug; count it as a
            // failed submit rather than lose it.
            Err(e) => exchanges.push(Exchange {
                submit: Sample {
                    sent: Utc::now(),
                    latency_ms: 0.0,
                    error: Some(format!("request task: {e}")),
                },
                read: None,
                id: None,
            }),
        }
    }
    exchanges
}

async fn exchange(http: &reqwest::Client, base: &str, body: &Value) -> Exchange {
    let (submit, answer) = timed(http.post(format!("{base}/workflows")).json(body)).await;
    // The answer is the workflow itself (`WorkflowView`): its `id`.
    let id = answer.and_then(|a| a["id"].as_str().map(str::to_owned));
    let mut submit = submit;
    if submit.error.is_none() && id.is_none() {
        submit.error = Some("POST /workflows: an answer without an id".into());
    }
    let read = match &id {
        Some(id) => Some(timed(http.get(format!("{base}/workflows/{id}"))).await.0),
        None => None,
    };
    Exchange { submit, read, id }
}

/// Sends one request and reads its answer in full; the latency covers
/// both. Any status but 2xx, and any error on the way, is a failure.
async fn timed(request: reqwest::RequestBuilder) -> (Sample, Option<Value>) {
    let sent = Utc::now();
    let t0 = Instant::now();
    let result = async {
        let r = request.timeout(REQUEST_LIMIT).send().await?;
        let code = r.status();
        let text = r.text().await?;
        if !code.is_success() {
            bail!("{code}: {}", text.chars().take(300).collect::<String>());
        }
        Ok(serde_json::from_str::<Value>(&text)?)
    }
    .await;
    let latency_ms = t0.elapsed().as_secs_f64() * 1000.0;
    match result {
        Ok(answer) => (
            Sample {
                sent,
                latency_ms,
                error: None,
            },
            Some(answer),
        ),
        Err(e) => (
            Sample {
                sent,
                latency_ms,
                error: Some(format!("{e:#}")),
            },
            None,
        ),
    }
}

struct Check {
    present: usize,
    completed: usize,
    examples: Vec<String>,
}

/// Reads every acknowledged workflow from the service until each has
/// ended (or [`FINISH_LIMIT`] passed): how many are there, and how many
/// completed.
async fn check_submissions(svc: &Service, ids: &[&str]) -> Result<Check> {
    let t0 = Instant::now();
    let mut pending: Vec<&str> = ids.to_vec();
    let (mut present, mut completed, mut examples) = (0, 0, Vec::new());
    let mut note = |what: String| {
        if examples.len() < ERRORS_KEPT {
            examples.push(what);
        }
    };
    while !pending.is_empty() {
        let mut still = Vec::new();
        for id in pending {
            let path = format!("/workflows/{id}");
            let r = svc
                .http
                .get(svc.url(&path))
                .timeout(REQUEST_LIMIT)
                .send()
                .await
                .with_context(|| format!("GET {path} after the move"))?;
            let code = r.status();
            if code == reqwest::StatusCode::NOT_FOUND {
                note(format!("{id}: missing (404)"));
                continue;
            }
            let text = r.text().await?;
            if !code.is_success() {
                bail!("GET {path} after the move: {code}: {text}");
            }
            let workflow: Value = serde_json::from_str(&text)
                .with_context(|| format!("GET {path} after the move"))?;
            match workflow["status"].as_str() {
                Some("completed") => {
                    present += 1;
                    completed += 1;
                }
                Some(s @ ("failed" | "cancelled")) => {
                    present += 1;
                    note(format!("{id}: {s}"));
                }
                _ if t0.elapsed() > FINISH_LIMIT => {
                    present += 1;
                    note(format!(
                        "{id}: still {} after {FINISH_LIMIT:?}",
                        workflow["status"]
                    ));
                }
                _ => still.push(id),
            }
        }
        pending = still;
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(Check {
        present,
        completed,
        examples,
    })
}
