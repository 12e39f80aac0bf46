//! Workload 10 (issue 28): test environments in Linux namespaces, made by
//! a real `orchestrator serve` with the repo's taskserv scripts and
//! topologies, measured through the HTTP API as a user sees them: one
//! real redis from create to `ready`, and the three-member etcd cluster
//! from create through its checks to deleted.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::Ctx;
use crate::service::{Join, Service};

/// Issue 28's targets, in seconds.
pub const REDIS_TARGET_S: f64 = 2.0;
pub const ETCD_TARGET_S: f64 = 15.0;

/// The checks `etcd_cluster` has: each member's own, and from each the
/// other two.
const ETCD_CHECKS: usize = 6;

/// A condition, not a timing: on a healthy machine each holds in seconds;
/// past this the run has failed.
const GIVE_UP: Duration = Duration::from_secs(300);

/// How often the environment is read while waiting: fine enough for
/// figures of seconds, light enough not to load the service.
const POLL: Duration = Duration::from_millis(10);

/// The daemons the two figures run on the host's binaries.
const DAEMONS: [&str; 2] = ["redis-server", "etcd"];

pub enum Outcome {
    Measured(TestEnvs),
    /// Why nothing was measured (no root, no daemon binary).
    Skipped(String),
}

pub struct TestEnvs {
    /// `single_taskserv` redis: create → `ready`, seconds, one per run.
    pub redis_ready: Vec<f64>,
    pub etcd: Vec<EtcdRun>,
}

/// One `etcd_cluster` run, each phase in seconds.
pub struct EtcdRun {
    /// Create → `ready`.
    pub ready: f64,
    /// Run → every check passed.
    pub checks: f64,
    /// Delete → `deleted`.
    pub teardown: f64,
}

impl EtcdRun {
    pub fn total(&self) -> f64 {
        self.ready + self.checks + self.teardown
    }
}

/// Why workload 10 cannot run on this host, if it cannot.
fn unmet() -> Option<String> {
    let missing = orchestrator_testenv::caps::missing();
    if !missing.is_empty() {
        return Some(format!(
            "needs root (this process lacks {})",
            missing.join(", ")
        ));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let absent: Vec<&str> = DAEMONS
        .into_iter()
        .filter(|name| !std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
        .collect();
    if !absent.is_empty() {
        return Some(format!(
            "no {} on PATH (the Debian packages `redis-server`, `etcd-server`)",
            absent.join(", ")
        ));
    }
    None
}

pub async fn test_environments(ctx: &Ctx) -> Result<Outcome> {
    if let Some(why) = unmet() {
        return Ok(Outcome::Skipped(why));
    }
    let repo = std::fs::canonicalize(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .context("the repository's directory")?;
    let join = Join {
        // An etcd member's start waits for quorum, so two of the three
        // start steps must run at once (docs/test-environments.md).
        workers: Some(ctx.workers.max(2)),
        scripts_dir: Some(repo.join("scripts")),
        templates_dir: Some(repo.join("templates")),
        ..Join::default()
    };
    let service = Service::start_with(ctx, "filesystem", &ctx.tmp.join("w10-data"), &join).await?;
    let measured = measure(ctx, &service).await;
    let stopped = service.stop().await;
    let measured = measured?;
    stopped?;
    Ok(Outcome::Measured(measured))
}

async fn measure(ctx: &Ctx, service: &Service) -> Result<TestEnvs> {
    let mut redis_ready = Vec::new();
    let mut etcd = Vec::new();
    for run in 1..=ctx.runs {
        let took = redis(service)
            .await
            .with_context(|| format!("redis, run {run}"))?;
        eprintln!("  redis run {run}: ready in {took:.3} s");
        redis_ready.push(took);
    }
    for run in 1..=ctx.runs {
        let r = etcd_cluster(service)
            .await
            .with_context(|| format!("etcd_cluster, run {run}"))?;
        eprintln!(
            "  etcd_cluster run {run}: {:.3} s (ready {:.3} s, checks {:.3} s, teardown {:.3} s)",
            r.total(),
            r.ready,
            r.checks,
            r.teardown
        );
        etcd.push(r);
    }
    Ok(TestEnvs { redis_ready, etcd })
}

/// Create → `ready` of one redis; then deleted, unmeasured.
async fn redis(service: &Service) -> Result<f64> {
    let t0 = Instant::now();
    let id = create(
        service,
        json!({"type": "single_taskserv", "taskserv": "redis"}),
    )
    .await?;
    let ready = wait_for(service, &id, "ready").await;
    let took = t0.elapsed().as_secs_f64();
    let deleted = delete(service, &id).await;
    ready?;
    deleted?;
    Ok(took)
}

/// Create → `ready` → every check passed → `deleted`.
async fn etcd_cluster(service: &Service) -> Result<EtcdRun> {
    let t0 = Instant::now();
    let id = create(
        service,
        json!({"type": "cluster", "topology": "etcd_cluster"}),
    )
    .await?;
    let phases = async {
        let ready_at = wait_for(service, &id, "ready").await?;
        service
            .post_json(&format!("/test/environments/{id}/run"), &json!({}))
            .await?;
        let passed_at = wait_for_checks(service, &id).await?;
        Ok::<_, anyhow::Error>((ready_at, passed_at))
    }
    .await;
    let delete_at = Instant::now();
    let deleted = delete(service, &id).await;
    let (ready_at, passed_at) = phases?;
    let deleted_at = deleted?;
    Ok(EtcdRun {
        ready: (ready_at - t0).as_secs_f64(),
        checks: (passed_at - ready_at).as_secs_f64(),
        teardown: (deleted_at - delete_at).as_secs_f64(),
    })
}

/// `POST /test/environments/create` (`ttl` 10 minutes, so that one left
/// behind by a crashed bench goes by itself); the new environment's id.
async fn create(service: &Service, body: Value) -> Result<String> {
    let mut body = body;
    body["ttl"] = json!("10m");
    let env = service
        .post_json("/test/environments/create", &body)
        .await?;
    env["id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow!("no id in the created environment: {env}"))
}

/// Polls `GET /test/environments/{id}` until its status is `want`; fails
/// on a status it cannot leave for `want`, with the environment's logs.
async fn wait_for(service: &Service, id: &str, want: &str) -> Result<Instant> {
    let t0 = Instant::now();
    loop {
        let env = service
            .get_json(&format!("/test/environments/{id}"))
            .await?;
        let status = env["status"].as_str().unwrap_or_default();
        if status == want {
            return Ok(Instant::now());
        }
        // A teardown may start from any status; making one can only end
        // in `ready`.
        let stuck = match want {
            "deleted" => status == "delete_failed",
            _ => matches!(
                status,
                "failed" | "cancelled" | "deleting" | "deleted" | "delete_failed"
            ),
        };
        if stuck {
            bail!(
                "environment {id} is {status}, not {want}: {}",
                failed_steps(service, id).await
            );
        }
        if t0.elapsed() > GIVE_UP {
            bail!("environment {id} still {status}, not {want}, after {GIVE_UP:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Polls the environment until its run has ended; fails unless every one
/// of `etcd_cluster`'s checks passed.
async fn wait_for_checks(service: &Service, id: &str) -> Result<Instant> {
    let t0 = Instant::now();
    loop {
        let env = service
            .get_json(&format!("/test/environments/{id}"))
            .await?;
        let run = &env["last_run"];
        match run["status"].as_str() {
            Some("passed") => {
                let checks = run["checks"].as_array().map_or(0, Vec::len);
                if checks != ETCD_CHECKS {
                    bail!("{checks} checks ran, not {ETCD_CHECKS}: {run}");
                }
                return Ok(Instant::now());
            }
            Some("failed") => bail!("a check failed: {run}"),
            _ => {}
        }
        if t0.elapsed() > GIVE_UP {
            bail!("the checks of {id} had not ended after {GIVE_UP:?}: {run}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `DELETE /test/environments/{id}`, then polls until it is `deleted`.
async fn delete(service: &Service, id: &str) -> Result<Instant> {
    let path = format!("/test/environments/{id}");
    let r = service.http.delete(service.url(&path)).send().await?;
    let status = r.status();
    if !status.is_success() {
        bail!("DELETE {path}: {status}: {}", r.text().await?);
    }
    wait_for(service, id, "deleted").await
}

/// The steps of the environment that did not complete, with their
/// errors, for a failure's message.
async fn failed_steps(service: &Service, id: &str) -> String {
    match service
        .get_json(&format!("/test/environments/{id}/logs"))
        .await
    {
        Ok(logs) => {
            let failed: Vec<String> = logs["entries"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["status"] != "completed")
                .map(|e| {
                    format!(
                        "{} `{}`: {} {}",
                        e["workflow"].as_str().unwrap_or_default(),
                        e["step"].as_str().unwrap_or_default(),
                        e["status"].as_str().unwrap_or_default(),
                        e["error"].as_str().unwrap_or_default()
                    )
                })
                .collect();
            if failed.is_empty() {
                format!(
                    "see {}",
                    service.data_dir.with_extension("service.log").display()
                )
            } else {
                failed.join("; ")
            }
        }
        Err(e) => format!("its logs could not be read: {e:#}"),
    }
}
