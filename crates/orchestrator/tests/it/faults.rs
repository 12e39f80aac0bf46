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
pub(crate) fn try_submit(url: &str, tag: &str) -> Option<String> {
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

pub(crate) struct LedgerEntry {
    attempt: u32,
    event: String,
    time: f64,
}

/// The drill's ledger, merged from every node's data dir.
pub(crate) fn read_ledger(paths: &[std::path::PathBuf]) -> HashMap<String, Vec<LedgerEntry>> {
    let mut by_task: HashMap<String, Vec<LedgerEntry>> = HashMap::new();
    let text: String = paths
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    for line in text.lines() {
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
    drill(&[]);
}

#[cfg(feature = "surrealdb")]
#[test]
fn crash_restart_drill_on_embedded_surrealdb() {
    drill(&["--storage-type", "surrealdb-embedded"]);
}

#[cfg(feature = "surrealdb")]
#[test]
fn crash_restart_drill_on_a_surrealdb_server() {
    let server = crate::backends::dev_server::DevServer::start_memory();
    let url = server.url();
    let database = format!("drill_{}", uuid::Uuid::now_v7().simple());
    drill(&[
        "--storage-type",
        "surrealdb-server",
        "--surrealdb-url",
        &url,
        "--surrealdb-database",
        &database,
    ]);
}

/// Crashes a service on the given store `ORCHESTRATOR_FAULT_ROUNDS` times
/// in the middle of work, then checks every promise.
fn drill(store_args: &[&str]) {
    let seed = env_number("ORCHESTRATOR_FAULT_SEED", 20_261_122);
    let rounds = env_number("ORCHESTRATOR_FAULT_ROUNDS", 3);
    eprintln!("fault drill {store_args:?}: seed {seed}, {rounds} crash rounds");
    let mut moments = Moments(seed | 1);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut acknowledged: Vec<String> = Vec::new();
    for round in 0..rounds {
        let mut args = vec!["--workers", "2"];
        args.extend_from_slice(store_args);
        let daemon = Daemon::start(&data, &args);
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

    let daemon = Daemon::start(&data, store_args);
    let views = wait_for_workflows(&daemon, &acknowledged);

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

    let state = crate::harness::script_state(&data);
    let ledger = read_ledger(&[state.join("ledger.log")]);
    let jobs = std::fs::read_to_string(state.join("jobs.log")).unwrap_or_default();
    check_promises(&views, &ledger, &jobs);
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

/// Polls until every workflow finished (three minutes at most); returns
/// their final views.
pub(crate) fn wait_for_workflows(daemon: &Daemon, ids: &[String]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(180);
    ids.iter()
        .map(|id| {
            loop {
                let view = daemon.cli_json(&["workflow", "status", id, "--json"]);
                if matches!(
                    view["status"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                ) {
                    return view;
                }
                assert!(
                    Instant::now() < deadline,
                    "workflow {id} never finished: {view}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .collect()
}

/// What every drill asserts about finished workflows, from the ledger the
/// steps wrote and the external jobs they launched.
pub(crate) fn check_promises(
    views: &[Value],
    ledger: &HashMap<String, Vec<LedgerEntry>>,
    jobs: &str,
) {
    let mut jobs_by_task: HashMap<&str, HashSet<&str>> = HashMap::new();
    for line in jobs.lines() {
        let (task, job) = line.split_once(' ').unwrap();
        jobs_by_task.entry(task).or_default().insert(job);
    }
    for view in views {
        assert_eq!(view["status"], "completed", "{view}");
        for task in view["tasks"].as_array().unwrap() {
            let id = task["id"].as_str().unwrap();
            let attempts = task["attempts"].as_u64().unwrap() as u32;
            let entries = ledger.get(id).map(Vec::as_slice).unwrap_or_default();
            // No completed step ran again: nothing ran after the recorded attempt.
            assert!(
                entries.iter().all(|e| e.attempt <= attempts),
                "task {id} ran after it completed"
            );
            // No attempt ran twice (on one node or two).
            let starts: Vec<u32> = entries
                .iter()
                .filter(|e| e.event == "start")
                .map(|e| e.attempt)
                .collect();
            let unique: HashSet<u32> = starts.iter().copied().collect();
            assert_eq!(
                starts.len(),
                unique.len(),
                "task {id} ran an attempt twice: {starts:?}"
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
}

#[cfg(feature = "surrealdb")]
pub(crate) mod nodes {
    use super::*;
    use crate::backends::dev_server::DevServer;

    /// A SurrealDB server with a fresh database, and the `serve` flags that
    /// put nodes on it; each node gets its own data dir under `dir`.
    pub(crate) struct SharedStore {
        _server: DevServer,
        pub(crate) dir: tempfile::TempDir,
        flags: Vec<String>,
    }

    impl SharedStore {
        pub(crate) fn new(extra: &[&str]) -> SharedStore {
            let server = DevServer::start_memory();
            let database = format!("nodes_{}", uuid::Uuid::now_v7().simple());
            let mut flags: Vec<String> = [
                "--storage-type",
                "surrealdb-server",
                "--surrealdb-url",
                &server.url(),
                "--surrealdb-database",
                &database,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            flags.extend(extra.iter().map(|s| s.to_string()));
            SharedStore {
                _server: server,
                dir: tempfile::tempdir().unwrap(),
                flags,
            }
        }

        /// The store the nodes share, for a test to open it itself.
        pub(crate) fn store_config(&self) -> orchestrator_storage::StorageConfig {
            let flag = |name: &str| {
                let at = self.flags.iter().position(|f| f == name).unwrap();
                self.flags[at + 1].clone()
            };
            orchestrator_storage::StorageConfig {
                storage_type: orchestrator_storage::StorageType::SurrealdbServer,
                data_dir: self.dir.path().join("direct"),
                surrealdb: orchestrator_storage::SurrealdbConfig {
                    url: flag("--surrealdb-url"),
                    database: flag("--surrealdb-database"),
                    ..Default::default()
                },
            }
        }

        pub(crate) fn args(&self) -> Vec<&str> {
            self.flags.iter().map(String::as_str).collect()
        }

        /// [`SharedStore::args`], with a node's own worker count.
        pub(crate) fn args_with_workers<'a>(&'a self, workers: &'a str) -> Vec<&'a str> {
            let mut args = self.args();
            args.extend(["--workers", workers]);
            args
        }
    }

    /// A workflow's `parallel_limit` holds across the nodes that share the
    /// store, not per node: counted from the tasks' own start and end, no
    /// more than the limit ever ran at once, while both nodes took part.
    ///
    /// A has one worker, so it never fills both slots itself and B always
    /// finds a free one (through the change feed, or its poll: the workflow
    /// takes 8 x 0.4 s on A alone, B polls every second); B has four, so a
    /// limit kept per node would let B and A together run three.
    #[test]
    fn parallel_limit_holds_across_nodes() {
        let cluster = SharedStore::new(&["--lease-secs", "5"]);
        let dir = &cluster.dir;
        let a = Daemon::start(&dir.path().join("a"), &cluster.args_with_workers("1"));
        let b = Daemon::start(&dir.path().join("b"), &cluster.args_with_workers("4"));
        let steps: Vec<Value> = (0..8)
            .map(|i| json!({"ref_name": format!("s{i}"), "script": "dag/step.py", "input": {"sleep": 0.4}}))
            .collect();
        let body = json!({
            "template": {"name": "limited", "ref_name": "limited", "schema_version": 1, "steps": steps},
            "parallel_limit": 2,
        });
        let submitted = crate::cli::submit(&format!("{}/workflows", a.url), body);
        let id = submitted["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{submitted}"))
            .to_owned();
        let view = wait_for_workflows(&a, &[id]).remove(0);
        assert_eq!(view["status"], "completed", "{view}");
        let tasks = view["tasks"].as_array().unwrap();
        let time = |t: &Value, field: &str| -> chrono::DateTime<chrono::Utc> {
            t[field].as_str().unwrap().parse().unwrap()
        };
        // Starts before ends at the same instant: an end frees its slot
        // for a start stamped after it.
        let mut edges: Vec<(chrono::DateTime<chrono::Utc>, i32)> = tasks
            .iter()
            .flat_map(|t| [(time(t, "started_at"), 1), (time(t, "finished_at"), -1)])
            .collect();
        edges.sort_by_key(|&(at, delta)| (at, delta));
        let (mut running, mut most) = (0, 0);
        for (_, delta) in edges {
            running += delta;
            most = most.max(running);
        }
        assert!(
            most <= 2,
            "{most} steps ran at once under a limit of 2: {view}"
        );
        let nodes: HashSet<&str> = tasks.iter().filter_map(|t| t["node"].as_str()).collect();
        assert_eq!(nodes.len(), 2, "both nodes took part: {nodes:?} {view}");
        drop((a, b));
    }

    /// Work accepted by one node reaches another through the store's
    /// change feed, not its poll: with polls an hour apart, the node that
    /// did not accept the workflow runs a step of it (here A has one worker
    /// for two steps; B may even claim both first).
    #[test]
    fn work_spreads_through_the_change_feed() {
        let cluster = SharedStore::new(&["--lease-secs", "60", "--poll-ms", "3600000"]);
        let dir = &cluster.dir;
        let a = Daemon::start(&dir.path().join("a"), &cluster.args_with_workers("1"));
        let b = Daemon::start(&dir.path().join("b"), &cluster.args_with_workers("2"));
        let steps: Vec<Value> = (0..2)
            .map(|i| json!({"ref_name": format!("s{i}"), "script": "dag/step.py", "input": {"sleep": 1.5}}))
            .collect();
        let submitted = crate::cli::submit(
            &format!("{}/workflows", a.url),
            json!({"template": {"name": "spread", "ref_name": "spread", "schema_version": 1, "steps": steps}}),
        );
        let id = submitted["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{submitted}"))
            .to_owned();
        let view = wait_for_workflows(&a, &[id]).remove(0);
        assert_eq!(view["status"], "completed", "{view}");
        let b_id = std::fs::read_to_string(dir.path().join("b/node-id")).unwrap();
        let ran_on_b = view["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["node"] == b_id.trim())
            .count();
        assert!(ran_on_b >= 1, "B ({b_id}) heard of the work: {view}");
        drop((a, b));
    }

    /// A node that dies between storing a step's end and deciding what
    /// follows leaves a workflow that no task's end will move on; the
    /// periodic look of the other nodes advances it. Staged by ending the
    /// first step straight in the store, as such a node would have, in a
    /// workflow that starts in an hour (so nothing else runs it): the look
    /// releases the second step, queued until the start.
    #[test]
    fn a_workflow_a_dead_node_left_undecided_is_advanced_by_another() {
        let cluster = SharedStore::new(&["--poll-ms", "100"]);
        let node = Daemon::start(&cluster.dir.path().join("a"), &cluster.args());
        let start = chrono::Utc::now() + chrono::Duration::hours(1);
        let submitted = crate::cli::submit(
            &format!("{}/workflows", node.url),
            json!({
                "template": {"name": "undecided", "ref_name": "undecided", "schema_version": 1, "steps": [
                    {"ref_name": "first", "script": "dag/step.py"},
                    {"ref_name": "second", "script": "dag/step.py", "depends_on": ["first"]},
                ]},
                "schedule": {"when": "at", "start": start.to_rfc3339()},
            }),
        );
        let id = submitted["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{submitted}"));
        let view = node.cli_json(&["workflow", "status", id, "--json"]);
        let task_of = |name: &str| -> orchestrator_core::TaskId {
            let task = view["tasks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["name"] == name)
                .unwrap_or_else(|| panic!("no {name}: {view}"));
            task["id"].as_str().unwrap().parse().unwrap()
        };
        let (first, second) = (task_of("first"), task_of("second"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = orchestrator_storage::open(&cluster.store_config())
                .await
                .unwrap();
            let mut task = store.tasks().get_task(first).await.unwrap().unwrap();
            let now = chrono::Utc::now();
            task.start(now).unwrap();
            task.node = Some("node-that-died".into());
            task.complete(json!({}), now).unwrap();
            store.tasks().update_task(&task).await.unwrap();
            store.close().await.unwrap();
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let task = node.cli_json(&["task", &second.to_string(), "--json"]);
            if task["status"] == "queued" {
                break;
            }
            assert_eq!(task["status"], "pending", "{task}");
            assert!(
                Instant::now() < deadline,
                "the second step was never released: {task}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `node` is running a task of one of `steps` on itself.
    fn wait_until_running_on(node: &Daemon, node_id: &str, steps: &[&str]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let running = node.cli_json(&["tasks", "--status", "running", "--json"]);
            let found =
                running["tasks"].as_array().unwrap().iter().any(|t| {
                    t["node"] == node_id && steps.iter().any(|s| t["step"]["ref_name"] == *s)
                });
            if found {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {node_id} never ran any of {steps:?}: {running}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Two nodes on one SurrealDB server share the work; when one dies
    /// with SIGKILL, the other takes its running tasks over once their
    /// leases expire, and every promise still holds.
    #[test]
    fn a_node_takes_over_the_work_of_a_dead_one() {
        // A lease long enough that A renews it in time on a loaded
        // machine: the restart of B below must find it alive (a lapsed
        // lease is a dead node's, rightly taken over).
        let cluster = SharedStore::new(&["--lease-secs", "5", "--workers", "2"]);
        let (dir, args) = (&cluster.dir, cluster.args());
        let a = Daemon::start(&dir.path().join("a"), &args);
        let b = Daemon::start(&dir.path().join("b"), &args);

        let mut acknowledged = Vec::new();
        for i in 0..4 {
            acknowledged.extend(try_submit(&a.url, &format!("a{i}")));
        }
        for i in 0..2 {
            acknowledged.extend(try_submit(&b.url, &format!("b{i}")));
        }
        assert_eq!(acknowledged.len(), 6);

        // A restart of B must not take A's running tasks: they are A's,
        // and A's lease is alive.
        let a_id = std::fs::read_to_string(dir.path().join("a/node-id")).unwrap();
        wait_until_running_on(&a, &a_id, &["plain", "external", "after"]);
        b.signal("-TERM");
        assert!(b.wait().success());
        let b = Daemon::start(&dir.path().join("b"), &args);

        // Kill A while it runs something of its own. B's restart may
        // have outlasted A's first work (the drill failed so in CI), so
        // there is more, and A is killed inside a step that sleeps for
        // 0.4 s or more: the kill lands mid-attempt.
        for i in 4..8 {
            acknowledged.extend(try_submit(&a.url, &format!("a{i}")));
        }
        assert_eq!(acknowledged.len(), 10);
        wait_until_running_on(&a, &a_id, &["plain", "external"]);
        a.signal("-KILL");
        assert!(!a.wait().success());

        let views = wait_for_workflows(&b, &acknowledged);
        let ledger = read_ledger(&[
            crate::harness::script_state(&dir.path().join("a")).join("ledger.log"),
            crate::harness::script_state(&dir.path().join("b")).join("ledger.log"),
        ]);
        let jobs: String = ["a", "b"]
            .iter()
            .map(|n| {
                std::fs::read_to_string(
                    crate::harness::script_state(&dir.path().join(n)).join("jobs.log"),
                )
                .unwrap_or_default()
            })
            .collect();
        check_promises(&views, &ledger, &jobs);

        // B finished what A had started: the history says who ran what.
        let b_id = std::fs::read_to_string(dir.path().join("b/node-id")).unwrap();
        let taken_over = views
            .iter()
            .flat_map(|v| v["tasks"].as_array().unwrap().iter())
            .any(|t| {
                let history = t["history"].as_array().unwrap();
                history.iter().any(|h| {
                    h["node"] == a_id.as_str()
                        && h["error"]
                            .as_str()
                            .is_some_and(|e| e.contains("stopped renewing its lease"))
                }) && history.last().is_some_and(|h| h["node"] == b_id.as_str())
            });
        assert!(
            taken_over,
            "no task shows A's interrupted attempt followed by B's"
        );
        let stolen = views
            .iter()
            .flat_map(|v| v["tasks"].as_array().unwrap().iter())
            .any(|t| {
                t["history"].as_array().unwrap().iter().any(|h| {
                    h["node"] == a_id.as_str()
                        && h["error"]
                            .as_str()
                            .is_some_and(|e| e.contains("the service stopped"))
                })
            });
        assert!(
            !stolen,
            "B's restart interrupted an attempt that A was running"
        );

        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listed: Value = runtime.block_on(async {
            reqwest::get(format!("{}/cluster/nodes", b.url))
                .await
                .unwrap()
                .json()
                .await
                .unwrap()
        });
        let alive = |id: &str| {
            listed["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["id"] == id)
                .map(|n| n["alive"].clone())
        };
        assert_eq!(alive(&a_id), Some(json!(false)), "{listed}");
        assert_eq!(alive(&b_id), Some(json!(true)), "{listed}");
        b.signal("-TERM");
        assert!(b.wait().success());
    }

    /// A cancel sent to one node stops the script that another node runs.
    #[test]
    fn a_cancel_through_any_node_stops_the_script() {
        let cluster = SharedStore::new(&["--lease-secs", "3"]);
        let (dir, args) = (&cluster.dir, cluster.args());
        let a = Daemon::start(&dir.path().join("a"), &args);
        let b = Daemon::start(&dir.path().join("b"), &args);
        let created = crate::cli::submit(
            &format!("{}/workflows/servers/create", a.url),
            json!({"infra": "x", "servers": ["hang-remote"]}),
        );
        let id = created["task_ids"][0].as_str().unwrap().to_owned();
        let pid_file = |node: &str| {
            crate::harness::script_state(&dir.path().join(node)).join("pids/hang-remote")
        };
        let started_by = Instant::now() + Duration::from_secs(30);
        while !pid_file("a").exists() && !pid_file("b").exists() {
            assert!(Instant::now() < started_by, "the script never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Cancel through the node that does not run it.
        let runner = if pid_file("a").exists() { "a" } else { "b" };
        let other = if runner == "a" { &b } else { &a };
        assert!(other.cli(&["cancel", &id]).status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        let task = loop {
            let task = other.cli_json(&["task", &id, "--json"]);
            if task["status"] == "cancelled" {
                break task;
            }
            assert!(Instant::now() < deadline, "never cancelled: {task}");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(task["attempts"], 1);
        assert!(pid_file(runner).exists());
        let gone_by = Instant::now() + Duration::from_secs(10);
        while !crate::harness::task_processes(&id).is_empty() {
            assert!(
                Instant::now() < gone_by,
                "the script's processes {:?} survived the cancel",
                crate::harness::task_processes(&id)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        for node in [a, b] {
            node.signal("-TERM");
            assert!(node.wait().success());
        }
    }
}
