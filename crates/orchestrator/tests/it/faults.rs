//! The fault-injection drill: start the service, submit workflows, kill it
//! with SIGKILL at random moments, restart, and repeat; then check that
//! every promise of docs/reliability.md held.
//!
//! Seedable and bounded: `ORCHESTRATOR_FAULT_SEED` picks the moments,
//! `ORCHESTRATOR_FAULT_ROUNDS` the number of crashes (3 in `make test`,
//! many in `make soak`).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cli::Daemon;

/// A small deterministic generator (xorshift64*), so that a seed replays
/// the same crash schedule.
struct Moments(u64);

impl Moments {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % below.max(1)
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// POSTs a drill workflow; `Some(id)` only for an acknowledged submission.
fn try_submit(url: &str, tag: &str) -> Option<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .ok()?;
    runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(format!("{url}/workflows"))
            .json(&json!({"template": "fault-drill", "vars": {"tag": tag}}))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        let body: Value = response.json().await.ok()?;
        body["id"].as_str().map(str::to_owned)
    })
}

struct LedgerEntry {
    attempt: u32,
    event: String,
    time: f64,
}

fn read_ledger(path: &std::path::Path) -> HashMap<String, Vec<LedgerEntry>> {
    let mut by_task: HashMap<String, Vec<LedgerEntry>> = HashMap::new();
    for line in std::fs::read_to_string(path).unwrap_or_default().lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        if let [task, attempt, event, time] = parts[..] {
            by_task
                .entry(task.to_owned())
                .or_default()
                .push(LedgerEntry {
                    attempt: attempt.parse().unwrap(),
                    event: event.to_owned(),
                    time: time.parse().unwrap(),
                });
        }
    }
    by_task
}

#[test]
fn crash_restart_drill_keeps_every_promise() {
    let seed = env_number("ORCHESTRATOR_FAULT_SEED", 20_261_122);
    let rounds = env_number("ORCHESTRATOR_FAULT_ROUNDS", 3);
    eprintln!("fault drill: seed {seed}, {rounds} crash rounds");
    let mut moments = Moments(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut acknowledged: Vec<String> = Vec::new();
    for round in 0..rounds {
        let daemon = Daemon::start(&data, &["--workers", "2"]);
        for i in 0..1 + moments.next(3) {
            if let Some(id) = try_submit(&daemon.url, &format!("r{round}-{i}")) {
                acknowledged.push(id);
            }
            std::thread::sleep(Duration::from_millis(moments.next(300)));
        }
        // Crash while something runs, at a random point of it.
        let busy_by = Instant::now() + Duration::from_secs(5);
        while daemon.cli_json(&["tasks", "--status", "running", "--json"])["total"] == 0
            && Instant::now() < busy_by
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(moments.next(800)));
        daemon.signal("-KILL");
        assert!(!daemon.wait().success());
    }

    let daemon = Daemon::start(&data, &[]);
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut views = Vec::new();
    for id in &acknowledged {
        let view = loop {
            let view = daemon.cli_json(&["workflow", "status", id, "--json"]);
            if matches!(
                view["status"].as_str(),
                Some("completed" | "failed" | "cancelled")
            ) {
                break view;
            }
            assert!(
                Instant::now() < deadline,
                "workflow {id} never finished: {view}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        views.push(view);
    }

    // Nothing acknowledged is missing, and every workflow finished well.
    let listed = daemon.cli_json(&["workflow", "list", "--limit", "1000", "--json"]);
    let listed: HashSet<&str> = listed["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    for (id, view) in acknowledged.iter().zip(&views) {
        assert!(listed.contains(id.as_str()), "workflow {id} is missing");
        assert_eq!(view["status"], "completed", "{view}");
    }

    let ledger = read_ledger(&data.join("ledger.log"));
    let jobs = std::fs::read_to_string(data.join("jobs.log")).unwrap_or_default();
    let mut jobs_by_task: HashMap<&str, HashSet<&str>> = HashMap::new();
    for line in jobs.lines() {
        let (task, job) = line.split_once(' ').unwrap();
        jobs_by_task.entry(task).or_default().insert(job);
    }
    for view in &views {
        for task in view["tasks"].as_array().unwrap() {
            let id = task["id"].as_str().unwrap();
            let attempts = task["attempts"].as_u64().unwrap() as u32;
            let entries = ledger.get(id).map(Vec::as_slice).unwrap_or_default();
            // No completed step ran again: nothing ran after the recorded attempt.
            assert!(
                entries.iter().all(|e| e.attempt <= attempts),
                "task {id} ran after it completed"
            );
            // No attempt outlived its successor: left-overs were killed.
            for later in entries.iter().filter(|e| e.event == "start") {
                assert!(
                    !entries.iter().any(|e| e.attempt < later.attempt
                        && e.event == "done"
                        && e.time > later.time),
                    "an old attempt of task {id} finished after attempt {} started",
                    later.attempt
                );
            }
            // A checkpointing step launched its external job once.
            if task["step"]["ref_name"] == "external" {
                let launched = jobs_by_task.get(id).map_or(0, HashSet::len);
                assert_eq!(
                    launched, 1,
                    "task {id} launched {launched} jobs; checkpoint {}",
                    task["checkpoint"]
                );
            }
        }
    }
    // The drill did crash in the middle of work.
    let interrupted = ledger.values().flatten().filter(|e| e.attempt > 1).count();
    assert!(
        rounds == 0 || interrupted > 0,
        "no attempt was ever interrupted: the drill tested nothing"
    );
    eprintln!(
        "fault drill: {} workflows survived {rounds} crashes ({interrupted} ledger entries from re-run attempts)",
        acknowledged.len()
    );
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}
