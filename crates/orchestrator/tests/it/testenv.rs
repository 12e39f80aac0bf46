//! Test environments in real Linux namespaces, made by the real service
//! and its real scripts (Nushell, python3), checked and torn down through
//! the API. They need root (CAP_SYS_ADMIN and CAP_NET_ADMIN); without it
//! each test says so loudly and passes without running. Each test's
//! service has its own node id, so its own tag in every name it gives: a
//! guard removes whatever carries that tag when the test ends, failed or
//! not, and the counts before and after are of that tag only.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use orchestrator::settings::ServeSettings;
use orchestrator_testenv::cgroup::Hierarchy;
use orchestrator_testenv::model::service_tag;
use serde_json::{Value, json};

use crate::harness::{TestService, real_scripts, spawn_serve};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");

/// Whether this process may make namespaces; if not, says so loudly.
fn privileged(test: &str) -> bool {
    let missing = orchestrator_testenv::caps::missing();
    if missing.is_empty() {
        return true;
    }
    eprintln!(
        "\n**************** SKIPPED {test}: test environments need root \
         (this test process lacks {}); `make test` runs as root in CI ****************\n",
        missing.join(", ")
    );
    false
}

fn templates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates")
}

/// The names a service with this node id gives, and the guard that
/// removes them when the test ends.
struct Tagged {
    node_id: String,
    tag: String,
}

impl Tagged {
    fn new(test: &str) -> Tagged {
        let node_id = format!("testenv-{test}-{}", uuid::Uuid::now_v7().simple());
        let tag = service_tag(&node_id);
        Tagged { node_id, tag }
    }

    fn netns_prefix(&self) -> String {
        format!("te-{}-", self.tag)
    }

    /// The nodes' cgroups that carry the tag (none where the host has no
    /// hierarchy for them: then no node is made either).
    fn cgroups(&self) -> Vec<String> {
        Hierarchy::detect()
            .map(|h| h.names())
            .unwrap_or_default()
            .into_iter()
            .filter(|n| n.starts_with(&self.netns_prefix()))
            .collect()
    }

    /// What carries the tag on this host: namespaces, links, cgroups,
    /// processes.
    fn leftovers(&self) -> Leftovers {
        let netns: Vec<String> = lines("ip", &["netns", "list"])
            .into_iter()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|n| n.starts_with(&self.netns_prefix()))
            .collect();
        let links: Vec<String> = lines("ip", &["-o", "link", "show"])
            .into_iter()
            .filter_map(|l| {
                l.split(": ")
                    .nth(1)
                    .map(|n| n.split('@').next().unwrap_or(n).to_owned())
            })
            .filter(|n| n.starts_with(&format!("te{}", self.tag)))
            .collect();
        let mark = format!("ORCHESTRATOR_TESTENV={}", self.netns_prefix());
        let processes: Vec<i32> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
            .filter(|pid| {
                std::fs::read(format!("/proc/{pid}/environ"))
                    .map(|env| String::from_utf8_lossy(&env).contains(&mark))
                    .unwrap_or(false)
            })
            .collect();
        // A node's mounts (its root, its /proc, ...) are in its own mount
        // namespace: the host's table never shows them, running or not.
        let env_dirs = format!("/testenv/{}-", self.tag);
        let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&env_dirs))
            .map(str::to_owned)
            .collect();
        Leftovers {
            netns,
            links,
            cgroups: self.cgroups(),
            processes,
            mounts,
        }
    }

    fn settings(&self, data_dir: &Path) -> ServeSettings {
        let mut settings = ServeSettings::new(data_dir.to_path_buf(), real_scripts());
        settings.templates_dir = templates();
        settings.port = 0;
        settings.workers = 6;
        settings.auth = false;
        settings.node_id = Some(self.node_id.clone());
        settings.retry.base_delay = Duration::from_millis(50);
        settings.retry.max_delay = Duration::from_millis(200);
        settings.shutdown_grace = Duration::from_secs(5);
        // The service runs inside this test binary: each node's init is
        // the real binary's.
        settings.node_init_program = Some(BIN.into());
        settings
    }
}

impl Drop for Tagged {
    fn drop(&mut self) {
        let left = self.leftovers();
        for pid in &left.processes {
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        for ns in &left.netns {
            for pid in lines("ip", &["netns", "pids", ns]) {
                let _ = Command::new("kill")
                    .args(["-9", pid.trim()])
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        for link in &left.links {
            let _ = Command::new("ip")
                .args(["link", "del", link])
                .stderr(Stdio::null())
                .status();
        }
        if let Ok(hierarchy) = Hierarchy::detect() {
            for cgroup in &left.cgroups {
                for dir in hierarchy.dirs(cgroup) {
                    let _ = std::fs::remove_dir(dir);
                }
            }
        }
    }
}

#[derive(Debug, PartialEq)]
struct Leftovers {
    netns: Vec<String>,
    links: Vec<String>,
    cgroups: Vec<String>,
    processes: Vec<i32>,
    mounts: Vec<String>,
}

impl Leftovers {
    fn none() -> Leftovers {
        Leftovers {
            netns: vec![],
            links: vec![],
            cgroups: vec![],
            processes: vec![],
            mounts: vec![],
        }
    }
}

fn lines(program: &str, args: &[&str]) -> Vec<String> {
    let output = Command::new(program).args(args).output().unwrap();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Polls `done` until it holds; fails after two minutes (a condition,
/// not a timing: on a healthy machine it holds in seconds).
async fn wait_until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn env_status(service: &TestService, id: &str) -> String {
    let (_, env) = service.get(&format!("/test/environments/{id}")).await;
    env["status"].as_str().unwrap_or_default().to_owned()
}

/// Waits until the environment is deleted; on giving up, shows it and
/// its logs (which step of which workflow did not end as it should).
async fn wait_deleted(service: &TestService, id: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while env_status(service, id).await != "deleted" {
        if tokio::time::Instant::now() >= deadline {
            let (status, env) = service.get(&format!("/test/environments/{id}")).await;
            let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
            panic!("gave up waiting for {id} to be torn down: {status} {env:#}\nlogs: {logs:#}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create(service: &TestService, body: Value) -> Value {
    let mut body = body;
    body["wait"] = json!(true);
    let (status, env) = service.post("/test/environments/create", body).await;
    assert_eq!(status, 201, "{env}");
    if env["status"] != "ready" {
        let id = env["id"].as_str().unwrap_or_default();
        let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
        panic!("environment not ready: {env}\nlogs: {logs:#}");
    }
    env
}

async fn run(service: &TestService, id: &str) -> Value {
    let (status, env) = service
        .post(&format!("/test/environments/{id}/run?wait=true"), json!({}))
        .await;
    assert_eq!(status, 202, "{env}");
    env["last_run"].clone()
}

async fn delete(service: &TestService, id: &str) {
    let (status, env) = service
        .delete(&format!("/test/environments/{id}?wait=true"))
        .await;
    assert_eq!(status, 202, "{env}");
    assert_eq!(env["status"], "deleted", "{env}");
}

/// Create, run (every check passes), logs, delete.
async fn lifecycle(service: &TestService, body: Value, checks: usize) {
    let env = create(service, body.clone()).await;
    let id = env["id"].as_str().unwrap();
    let run = run(service, id).await;
    assert_eq!(run["status"], "passed", "{body}: {run}");
    let results = run["checks"].as_array().unwrap();
    assert_eq!(results.len(), checks, "{body}: {run}");
    assert!(results.iter().all(|c| c["status"] == "passed"), "{run}");

    // Every step's and check's output; a check's log says what it reached.
    let (status, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
    assert_eq!(status, 200, "{logs}");
    let entries = logs["entries"].as_array().unwrap();
    assert!(
        entries.iter().any(
            |e| e["workflow"] == "create" && e["step"].as_str().unwrap().starts_with("install")
        )
    );
    let check_logs: Vec<&Value> = entries.iter().filter(|e| e["workflow"] == "run").collect();
    assert_eq!(check_logs.len(), checks, "{logs}");
    assert!(
        check_logs
            .iter()
            .all(|e| e["log"].as_str().unwrap().contains("ok: ")),
        "{logs}"
    );

    // The environment's workflows are workflows like any other (the
    // dashboard lists them).
    let (status, workflow) = service
        .get(&format!(
            "/workflows/{}",
            env["create_workflow"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200, "{workflow}");
    assert_eq!(workflow["kind"], "testenv-create", "{workflow}");

    delete(service, id).await;
}

#[tokio::test]
async fn every_type_and_every_topology_is_made_checked_and_torn_down() {
    if !privileged("every_type_and_every_topology_is_made_checked_and_torn_down") {
        return;
    }
    let tagged = Tagged::new("all");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    assert_eq!(tagged.leftovers(), Leftovers::none());

    // The topology templates, as the API lists them.
    let (status, listed) = service.get("/test/topologies").await;
    assert_eq!(status, 200, "{listed}");
    let names: Vec<&str> = listed["topologies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "containerd_test",
            "etcd_cluster",
            "kubernetes_3node",
            "kubernetes_single",
            "postgres_redis"
        ]
    );

    // Which taskservs are real, which stand-ins.
    let simulated: Vec<(&str, bool)> = listed["taskservs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["simulated"] == true))
        .collect();
    assert_eq!(
        simulated,
        [
            ("containerd", true),
            ("etcd", false),
            ("kubernetes", true),
            ("postgres", false),
            ("redis", false)
        ]
    );

    // Seven environments at once (the most is eight): checks per
    // taskserv on its node, plus the topology's across nodes.
    let cluster = |topology: &str| json!({"type": "cluster", "topology": topology});
    tokio::join!(
        lifecycle(
            &service,
            json!({"type": "single_taskserv", "taskserv": "postgres"}),
            1
        ),
        lifecycle(
            &service,
            json!({"type": "server", "server": "web-01", "taskservs": ["containerd", "redis"]}),
            2
        ),
        lifecycle(&service, cluster("containerd_test"), 1),
        lifecycle(&service, cluster("kubernetes_single"), 3),
        lifecycle(&service, cluster("etcd_cluster"), 6),
        lifecycle(&service, cluster("kubernetes_3node"), 13),
        lifecycle(&service, cluster("postgres_redis"), 4),
    );
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

/// The pid, as the host sees it, of a node's process whose command line
/// contains all of `words`.
fn node_process(netns: &str, words: &[&str]) -> Option<i32> {
    lines("ip", &["netns", "pids", netns])
        .iter()
        .filter_map(|p| p.trim().parse::<i32>().ok())
        .find(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
                .unwrap_or_default();
            // The service itself, not the `nsenter` that started it.
            !cmdline.starts_with("nsenter") && words.iter().all(|w| cmdline.contains(w))
        })
}

#[tokio::test]
async fn a_check_fails_when_a_nodes_service_is_stopped() {
    if !privileged("a_check_fails_when_a_nodes_service_is_stopped") {
        return;
    }
    let tagged = Tagged::new("stop");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let env = create(
        &service,
        json!({"type": "cluster", "topology": "postgres_redis"}),
    )
    .await;
    let id = env["id"].as_str().unwrap();
    let pg = env["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "pg")
        .unwrap();
    let postgres = node_process(pg["netns"].as_str().unwrap(), &["bin/postgres", "-D"])
        .expect("postgres runs in node pg");
    // The provider needs CAP_SYS_ADMIN and CAP_NET_ADMIN (here: root's
    // every capability) to make the node; what runs in it holds Docker's
    // default set at most (its bounding set), and postgres runs as its own
    // user, not root, with none of them in effect.
    let status = std::fs::read_to_string(format!("/proc/{postgres}/status")).unwrap();
    let set = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    assert_eq!(
        set("CapBnd"),
        u64::from_str_radix(NODE_CAPABILITIES, 16).unwrap(),
        "{status}"
    );
    assert_eq!(set("CapEff"), 0, "{status}");
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(!uid.split_whitespace().skip(1).any(|id| id == "0"), "{uid}");
    assert!(
        Command::new("kill")
            .args(["-9", &postgres.to_string()])
            .status()
            .unwrap()
            .success()
    );

    let run = run(&service, id).await;
    assert_eq!(run["status"], "failed", "{run}");
    let status_of = |name: &str| {
        run["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {run}"))["status"]
            .clone()
    };
    assert_eq!(status_of("postgres@pg"), "failed");
    assert_eq!(status_of("postgres-from-redis"), "failed");
    assert_eq!(status_of("redis@redis"), "passed");
    assert_eq!(status_of("redis-from-postgres"), "passed");
    assert_eq!(run["passed"], 2, "{run}");
    assert_eq!(run["failed"], 2, "{run}");
    let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
    let failed_log = logs["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["step"] == "check postgres-from-redis")
        .unwrap()["log"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        failed_log.contains("postgres on pg does not answer"),
        "{failed_log}"
    );
    // The environment's page says it too: the check's error, and its log's
    // tail with psql's own reason.
    let check = run["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "postgres-from-redis")
        .unwrap();
    let tail = check["log_tail"].as_str().unwrap_or_default();
    assert!(
        tail.contains("postgres on pg does not answer at pg:5432 from redis")
            && tail.contains("Connection refused"),
        "{check}"
    );
    assert!(check.get("output").is_none(), "{check}");

    delete(&service, id).await;
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

/// Docker's default capability set less mknod (chown, dac_override,
/// fowner, fsetid, kill, setgid, setuid, setpcap, net_bind_service,
/// net_raw, sys_chroot, audit_write, setfcap), as `/proc/<pid>/status`
/// shows it.
const NODE_CAPABILITIES: &str = "00000000a00425fb";

/// A node's root process holds [`NODE_CAPABILITIES`] at most, never
/// CAP_SYS_ADMIN (bit 21), and none to pass on.
fn assert_node_capabilities(status: &str) {
    let set = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .trim()
            .to_owned()
    };
    for name in ["CapEff:", "CapPrm:", "CapBnd:"] {
        assert_eq!(set(name), NODE_CAPABILITIES, "{name} of a node's process");
    }
    for name in ["CapInh:", "CapAmb:"] {
        assert_eq!(set(name), "0000000000000000", "{name} of a node's process");
    }
    let bounding = u64::from_str_radix(&set("CapBnd:"), 16).unwrap();
    assert_eq!(
        bounding & (1 << 21),
        0,
        "a node's process holds CAP_SYS_ADMIN"
    );
}

/// Whether `taskserv`'s server answers at `address:port` by its own
/// protocol (redis: `PING` gets `+PONG`; postgres: an SSLRequest gets `N`
/// or `S`), from inside the network namespace `netns`, or from the host
/// without one. The answer is checked, not only the connection: a host
/// may have a proxy that accepts any connection.
fn answers_from(netns: Option<&str>, address: &str, port: u16, taskserv: &str) -> bool {
    let (ask, expect) = match taskserv {
        "redis" => ("b'PING\\r\\n'", "data.startswith(b'+PONG')"),
        "postgres" => (
            "bytes([0, 0, 0, 8, 4, 210, 22, 47])",
            "data[:1] in (b'N', b'S')",
        ),
        other => panic!("no probe for {other}"),
    };
    let probe = format!(
        "import socket,sys\n\
         try:\n    s=socket.create_connection(('{address}', {port}), timeout=2)\n    \
         s.settimeout(2)\n    s.sendall({ask})\n    data=s.recv(64)\nexcept OSError:\n    sys.exit(1)\n\
         sys.exit(0 if {expect} else 1)"
    );
    let mut command = match netns {
        Some(netns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", netns, "python3"]);
            c
        }
        None => Command::new("python3"),
    };
    command.args(["-c", &probe]).status().unwrap().success()
}

#[tokio::test]
async fn two_environments_at_once_cannot_reach_each_other() {
    if !privileged("two_environments_at_once_cannot_reach_each_other") {
        return;
    }
    let tagged = Tagged::new("isolation");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let (a, b) = tokio::join!(
        create(
            &service,
            json!({"type": "single_taskserv", "taskserv": "redis"})
        ),
        create(
            &service,
            json!({"type": "cluster", "topology": "postgres_redis"})
        ),
    );
    let node = |env: &Value, i: usize| {
        let n = &env["nodes"][i];
        (
            n["netns"].as_str().unwrap().to_owned(),
            n["address"].as_str().unwrap().to_owned(),
        )
    };
    let (a_ns, a_addr) = node(&a, 0);
    let (b_pg_ns, b_pg_addr) = node(&b, 0);
    let (b_redis_ns, b_redis_addr) = node(&b, 1);
    // Within an environment, across its bridge: yes.
    assert!(answers_from(
        Some(&b_redis_ns),
        &b_pg_addr,
        5432,
        "postgres"
    ));
    assert!(answers_from(Some(&b_pg_ns), &b_redis_addr, 6379, "redis"));
    // Between environments: never, either way, though both listen.
    assert!(answers_from(Some(&a_ns), &a_addr, 6379, "redis"));
    assert!(!answers_from(Some(&a_ns), &b_redis_addr, 6379, "redis"));
    assert!(!answers_from(Some(&a_ns), &b_pg_addr, 5432, "postgres"));
    assert!(!answers_from(Some(&b_redis_ns), &a_addr, 6379, "redis"));
    assert!(!answers_from(Some(&b_pg_ns), &a_addr, 6379, "redis"));
    // Nor the host: it has no address on any environment's bridge.
    assert!(!answers_from(None, &a_addr, 6379, "redis"));
    assert!(!answers_from(None, &b_pg_addr, 5432, "postgres"));

    for env in [&a, &b] {
        delete(&service, env["id"].as_str().unwrap()).await;
    }
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

#[tokio::test]
async fn an_expired_ttl_and_auto_cleanup_tear_environments_down() {
    if !privileged("an_expired_ttl_and_auto_cleanup_tear_environments_down") {
        return;
    }
    let tagged = Tagged::new("ttl");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let expiring = create(
        &service,
        json!({"type": "single_taskserv", "taskserv": "containerd", "ttl": "5s"}),
    )
    .await;
    // Not started by its create: its run starts it, then checks it.
    let cleaned = create(
        &service,
        json!({"type": "server", "server": "app", "taskservs": ["redis", "postgres"],
               "auto_cleanup": true, "auto_start": false}),
    )
    .await;
    let app_netns = cleaned["nodes"][0]["netns"].as_str().unwrap().to_owned();
    assert_eq!(node_process(&app_netns, &["redis-server"]), None);
    assert_eq!(node_process(&app_netns, &["bin/postgres"]), None);
    // Still there before its first run.
    assert_eq!(
        env_status(&service, cleaned["id"].as_str().unwrap()).await,
        "ready"
    );
    assert!(!tagged.leftovers().netns.is_empty());
    let run = run(&service, cleaned["id"].as_str().unwrap()).await;
    assert_eq!(run["status"], "passed", "{run}");
    assert_eq!(run["passed"], 2, "{run}");

    for env in [&expiring, &cleaned] {
        let id = env["id"].as_str().unwrap().to_owned();
        wait_deleted(&service, &id).await;
    }
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

#[tokio::test]
async fn requests_are_checked_and_bounded() {
    let tagged = Tagged::new("bounds");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    for (body, field) in [
        (
            json!({"type": "cluster", "topology": "no_such"}),
            "topology: unknown topology `no_such`",
        ),
        (json!({"type": "cluster"}), "topology: is required"),
        (
            json!({"type": "single_taskserv", "taskserv": "mysql"}),
            "taskserv: unknown taskserv `mysql`",
        ),
        (
            json!({"type": "single_taskserv", "taskserv": "../etc"}),
            "taskserv: \"../etc\" is not a valid name",
        ),
        (
            json!({"type": "single_taskserv", "taskserv": "redis", "server": "x"}),
            "server: is not taken",
        ),
        (
            json!({"type": "server", "server": "web"}),
            "taskservs: a server needs",
        ),
        (
            json!({"type": "single_taskserv", "taskserv": "redis", "ttl": "3d"}),
            "ttl: ",
        ),
        (
            json!({"type": "single_taskserv", "taskserv": "redis", "ttl": 1}),
            "ttl: 1 s is out of bounds",
        ),
        (json!({"type": "vm"}), "type"),
        (
            json!({"type": "cluster", "topology": {"name": "big", "nodes": (0..9).map(|i| json!({"name": format!("n{i}"), "taskservs": ["redis"]})).collect::<Vec<_>>()}}),
            "topology.nodes: 9 nodes; an environment has at most 8",
        ),
        (
            json!({"type": "cluster", "topology": {"name": "dup", "nodes": [{"name": "a", "taskservs": ["redis"]}, {"name": "a", "taskservs": ["redis"]}]}}),
            "topology.nodes[1].name: node `a` appears twice",
        ),
        (
            json!({"type": "cluster", "topology": {"name": "chk", "nodes": [{"name": "a", "taskservs": ["redis"]}], "checks": [{"name": "x", "from": "a", "taskserv": "redis", "to": ["b"]}]}}),
            "topology.checks[0].to: no node `b`",
        ),
    ] {
        let (status, answer) = service
            .post("/test/environments/create", body.clone())
            .await;
        assert_eq!(status, 422, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    let (status, answer) = service.get("/test/environments/not-a-uuid").await;
    assert_eq!(status, 400, "{answer}");
    let unknown = "0190f0a0-0000-7000-8000-000000000000";
    for (status, answer) in [
        service.get(&format!("/test/environments/{unknown}")).await,
        service
            .post(&format!("/test/environments/{unknown}/run"), json!({}))
            .await,
        service
            .delete(&format!("/test/environments/{unknown}"))
            .await,
    ] {
        assert_eq!(status, 404, "{answer}");
    }
    let (status, _) = service.get("/test/topologies/no_such").await;
    assert_eq!(status, 404);
    // A testenv step submitted by hand must carry a plan this service
    // made; a teardown naming anything else is refused before it is stored.
    let (status, answer) = service
        .post(
            "/workflows",
            json!({"template": {"name": "x", "ref_name": "by-hand", "schema_version": 1, "steps": [
                {"ref_name": "down", "kind": "testenv", "script": "testenv/teardown",
                 "input": {"env": {"id": "x", "netns": "someone-elses"}}}]}}),
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("bad input of a testenv step"), "{message}");
    // Nothing refused was recorded.
    let (_, listed) = service.get("/test/environments").await;
    assert_eq!(listed["environments"], json!([]));

    if privileged("requests_are_checked_and_bounded (the bound on environments)") {
        let mut ids = Vec::new();
        for _ in 0..8 {
            let (status, env) = service
                .post(
                    "/test/environments/create",
                    json!({"type": "single_taskserv", "taskserv": "redis"}),
                )
                .await;
            assert_eq!(status, 201, "{env}");
            ids.push(env["id"].as_str().unwrap().to_owned());
        }
        let (status, answer) = service
            .post(
                "/test/environments/create",
                json!({"type": "single_taskserv", "taskserv": "redis"}),
            )
            .await;
        assert_eq!(status, 409, "{answer}");
        assert_eq!(answer["error"]["code"], "limit_exceeded", "{answer}");
        for id in &ids {
            delete(&service, id).await;
        }
        assert_eq!(tagged.leftovers(), Leftovers::none());
    }
    service.stop().await;
}

/// `orchestrator serve` as a process of its own (to be killed, or run
/// with fewer privileges), on a free port, with the real scripts.
struct Daemon {
    child: Child,
    client: TestService,
}

impl Daemon {
    fn start(data_dir: &Path, node_id: &str, wrapper: &[&str]) -> Daemon {
        let (program, first) = match wrapper.split_first() {
            Some((program, rest)) => (
                program.to_string(),
                rest.iter()
                    .map(|s| s.to_string())
                    .chain([BIN.to_owned()])
                    .collect(),
            ),
            None => (BIN.to_owned(), Vec::new()),
        };
        let mut command = Command::new(program);
        command
            .args(first)
            .args([
                "serve",
                "--port",
                "0",
                "--no-auth",
                "--node-id",
                node_id,
                "--data-dir",
            ])
            .arg(data_dir)
            .arg("--scripts-dir")
            .arg(real_scripts())
            .arg("--templates-dir")
            .arg(templates());
        let (child, base) = spawn_serve(command, Duration::from_secs(60));
        Daemon {
            child,
            client: TestService {
                handle: None,
                base,
                http: reqwest::Client::new(),
                data_dir: data_dir.to_path_buf(),
            },
        }
    }

    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        assert!(self.child.wait().unwrap().success());
    }
}

/// A test that fails before `kill9` or `stop` must not leave its service
/// running for the rest of the suite.
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_service_killed_mid_create_cleans_up_after_its_restart() {
    if !privileged("a_service_killed_mid_create_cleans_up_after_its_restart") {
        return;
    }
    let tagged = Tagged::new("kill");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    assert_eq!(tagged.leftovers(), Leftovers::none());
    let daemon = Daemon::start(&data, &tagged.node_id, &[]);
    let (status, env) = daemon
        .client
        .post(
            "/test/environments/create",
            json!({"type": "cluster", "topology": "kubernetes_3node"}),
        )
        .await;
    assert_eq!(status, 201, "{env}");
    let id = env["id"].as_str().unwrap().to_owned();
    // SIGKILL once the nodes are being made (a node's cgroup is made as
    // soon as its namespace has a first process).
    wait_until("a node's cgroup exists", || async {
        !tagged.leftovers().cgroups.is_empty()
    })
    .await;
    daemon.kill9();
    let left = tagged.leftovers();
    assert!(!left.netns.is_empty(), "{left:?}");
    assert!(!left.cgroups.is_empty(), "{left:?}");

    // The restarted service finds the environment it recorded and finishes
    // it; deleting it then leaves nothing.
    let daemon = Daemon::start(&data, &tagged.node_id, &[]);
    let client = &daemon.client;
    wait_until("the environment is made again", || {
        let id = id.clone();
        async move { matches!(env_status(client, &id).await.as_str(), "ready" | "failed") }
    })
    .await;
    delete(client, &id).await;
    assert_eq!(tagged.leftovers(), Leftovers::none());
    daemon.stop();
}

#[tokio::test]
async fn without_the_capabilities_create_is_refused_and_nothing_is_made() {
    if !privileged("without_the_capabilities_create_is_refused_and_nothing_is_made") {
        return;
    }
    let tagged = Tagged::new("nocaps");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Root, but with both capabilities out of its bounding set: after the
    // exec it holds neither.
    let daemon = Daemon::start(
        &data,
        &tagged.node_id,
        &[
            "setpriv",
            "--bounding-set",
            "-sys_admin,-net_admin",
            "--inh-caps",
            "-sys_admin,-net_admin",
        ],
    );
    let client = &daemon.client;
    let (status, answer) = client
        .post(
            "/test/environments/create",
            json!({"type": "cluster", "topology": "etcd_cluster"}),
        )
        .await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "missing_capability", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("lacks CAP_SYS_ADMIN, CAP_NET_ADMIN")
            && message.contains("nothing was made"),
        "{message}"
    );
    // Nothing half-made: no record, no workflow, no namespace, no link.
    let (_, listed) = client.get("/test/environments").await;
    assert_eq!(listed["environments"], json!([]));
    let (_, workflows) = client.get("/workflows").await;
    assert_eq!(workflows["total"], 0, "{workflows}");
    assert_eq!(tagged.leftovers(), Leftovers::none());
    daemon.stop();
}

#[tokio::test]
async fn the_cli_runs_a_quick_test_and_each_env_command() {
    if !privileged("the_cli_runs_a_quick_test_and_each_env_command") {
        return;
    }
    let tagged = Tagged::new("cli");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let cli = |args: &[&str]| {
        let base = service.base.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || {
                Command::new(BIN)
                    .arg("--url")
                    .arg(base)
                    .args(args)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };
    let listed = cli(&["test", "topology", "list"]).await;
    assert!(listed.status.success());
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains("kubernetes_3node"), "{listed}");
    // Each taskserv says whether it is real; each topology which of its
    // taskservs are simulated.
    let row = |first: &str| {
        listed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(first))
            .unwrap_or_else(|| panic!("no row {first}: {listed}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    for (taskserv, port, kind) in [
        ("postgres", "5432", "real"),
        ("redis", "6379", "real"),
        ("etcd", "2379", "real"),
        ("kubernetes", "6443", "simulated"),
        ("containerd", "10010", "simulated"),
    ] {
        assert_eq!(row(taskserv)[1..3], [port, kind], "{listed}");
    }
    assert_eq!(row("etcd_cluster")[3], "none", "{listed}");
    assert_eq!(
        row("kubernetes_3node")[3],
        "containerd,kubernetes",
        "{listed}"
    );

    let quick = cli(&["test", "quick", "etcd_cluster"]).await;
    let stdout = String::from_utf8_lossy(&quick.stdout).into_owned();
    assert!(
        quick.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&quick.stderr)
    );
    assert!(
        stdout.contains("members-from-etcd1") && stdout.contains("PASS"),
        "{stdout}"
    );
    assert!(stdout.contains("passed: 6 passed, 0 failed"), "{stdout}");
    assert!(!stdout.contains("FAIL"), "{stdout}");
    // Cleaned up.
    let (_, listed) = service.get("/test/environments").await;
    assert!(
        listed["environments"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["status"] == "deleted"),
        "{listed}"
    );
    assert_eq!(tagged.leftovers(), Leftovers::none());

    // The same, step by step: a single postgres with auto-start.
    let created = cli(&[
        "test",
        "env",
        "create",
        "--type",
        "single_taskserv",
        "--taskserv",
        "postgres",
        "--ttl",
        "10m",
        "--wait",
        "--json",
    ])
    .await;
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let env: Value = serde_json::from_slice(&created.stdout).unwrap();
    assert_eq!(env["status"], "ready", "{env}");
    let id = env["id"].as_str().unwrap().to_owned();
    let listed = cli(&["test", "env", "list"]).await;
    let listed = String::from_utf8_lossy(&listed.stdout).into_owned();
    assert!(listed.contains(&id) && listed.contains("ready"), "{listed}");
    let ran = cli(&["test", "env", "run", &id]).await;
    let table = String::from_utf8_lossy(&ran.stdout).into_owned();
    assert!(ran.status.success(), "{table}");
    assert!(
        table.contains("postgres@postgres") && table.contains("PASS"),
        "{table}"
    );
    let shown = cli(&["test", "env", "show", &id]).await;
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(
        shown.contains("10.") && shown.contains("passed: 1 passed, 0 failed"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("postgres {}", host_version("postgres")))
            && shown.contains("running"),
        "{shown}"
    );
    let logs = cli(&["test", "env", "logs", &id]).await;
    let logs = String::from_utf8_lossy(&logs.stdout).into_owned();
    assert!(
        logs.contains("== create / install postgres on postgres [completed]"),
        "{logs}"
    );
    assert!(logs.contains("ok: postgres on postgres answers"), "{logs}");
    let deleted = cli(&["test", "env", "delete", &id]).await;
    let deleted = String::from_utf8_lossy(&deleted.stdout).into_owned();
    assert!(deleted.contains("deleted"), "{deleted}");
    assert_eq!(tagged.leftovers(), Leftovers::none());

    let unknown = cli(&["test", "quick", "mysql"]).await;
    assert!(!unknown.status.success());
    let stderr = String::from_utf8_lossy(&unknown.stderr).into_owned();
    assert!(
        stderr.contains("`mysql` is neither a topology nor a taskserv"),
        "{stderr}"
    );
    service.stop().await;
}

#[tokio::test]
async fn a_starting_service_removes_its_own_leftovers_and_nothing_else() {
    if !privileged("a_starting_service_removes_its_own_leftovers_and_nothing_else") {
        return;
    }
    let tagged = Tagged::new("sweep");
    let other = Tagged::new("sweep-other");
    // What a dead life of this service left for an environment it never
    // recorded (or deleted), and what another service made.
    let ours_ns = format!("te-{}-abcdef-00", tagged.tag);
    let ours_link = format!("te{}abcdefb", tagged.tag);
    let theirs_ns = format!("te-{}-abcdef-00", other.tag);
    let theirs_link = format!("te{}abcdefb", other.tag);
    for args in [
        vec!["netns", "add", ours_ns.as_str()],
        vec!["link", "add", ours_link.as_str(), "type", "bridge"],
        vec!["netns", "add", theirs_ns.as_str()],
        vec!["link", "add", theirs_link.as_str(), "type", "bridge"],
    ] {
        assert!(
            Command::new("ip").args(&args).status().unwrap().success(),
            "ip {args:?}"
        );
    }
    // A cgroup alone is found too (its name carries tag and key).
    let hierarchy = Hierarchy::detect().expect("a cgroup hierarchy for the nodes' limits");
    let ours_cgroup = format!("te-{}-fedcba-01", tagged.tag);
    let theirs_cgroup = format!("te-{}-fedcba-01", other.tag);
    for dir in hierarchy
        .dirs(&ours_cgroup)
        .into_iter()
        .chain(hierarchy.dirs(&theirs_cgroup))
    {
        std::fs::create_dir_all(&dir).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let ours_dir = dir.path().join(format!("testenv/{}-abcdef", tagged.tag));
    std::fs::create_dir_all(ours_dir.join("n1")).unwrap();
    assert_eq!(tagged.leftovers().netns, [ours_ns]);
    assert_eq!(tagged.leftovers().cgroups, [ours_cgroup]);

    let service = TestService::start(tagged.settings(dir.path())).await;
    wait_until("the sweep removed this service's leftovers", || async {
        tagged.leftovers() == Leftovers::none() && !ours_dir.exists()
    })
    .await;
    // Another service's are untouched.
    assert_eq!(other.leftovers().netns, [theirs_ns]);
    assert_eq!(other.leftovers().links, [theirs_link]);
    assert_eq!(other.leftovers().cgroups, [theirs_cgroup]);
    service.stop().await;
}

/// A copy of the real scripts with taskservs of this test's own, whose
/// checks attack their node: `forkbomb` forks until a fork is refused,
/// `memhog` allocates until it is killed. Each stops by itself (a bound
/// on forks and bytes, and 30 s) and then *passes*: on a node whose
/// limits do not hold, their checks pass and the test fails.
/// `cgescape` writes its pid to every hierarchy's root `cgroup.procs`
/// that the node sees (no capability is needed for that, as root): it
/// fails if one write works.
fn scripts_with_attackers(dir: &Path) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap().flatten() {
            let target = to.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), &target).unwrap();
            }
        }
    }
    let scripts = dir.join("scripts");
    copy(&real_scripts(), &scripts);
    let attackers = [
        (
            "forkbomb",
            7101,
            "import os, signal, sys, time\n\
             kids, code = [], 0\n\
             deadline = time.monotonic() + 30\n\
             try:\n\
             \x20   while time.monotonic() < deadline and len(kids) < 2000:\n\
             \x20       pid = os.fork()\n\
             \x20       if pid == 0:\n\
             \x20           time.sleep(60)\n\
             \x20           os._exit(0)\n\
             \x20       kids.append(pid)\n\
             \x20   print(f'forked {len(kids)} times, never refused', file=sys.stderr)\n\
             except BlockingIOError:\n\
             \x20   print(f'a fork was refused after {len(kids)}', file=sys.stderr)\n\
             \x20   code = 1\n\
             for kid in kids:\n\
             \x20   os.kill(kid, signal.SIGKILL)\n\
             \x20   os.waitpid(kid, 0)\n\
             sys.exit(code)\n",
        ),
        (
            "memhog",
            7102,
            "import sys, time\n\
             chunks = []\n\
             deadline = time.monotonic() + 30\n\
             while time.monotonic() < deadline and len(chunks) < 128:\n\
             \x20   chunks.append(bytearray(16 * 1024 * 1024))\n\
             print(f'allocated {16 * len(chunks)} MiB, never killed', file=sys.stderr)\n",
        ),
        (
            "cgescape",
            7103,
            "import glob, os, sys\n\
             files = glob.glob('/sys/fs/cgroup/cgroup.procs') + glob.glob('/sys/fs/cgroup/*/cgroup.procs')\n\
             if not files:\n\
             \x20   print('no cgroup file system in the node', file=sys.stderr)\n\
             for name in files:\n\
             \x20   try:\n\
             \x20       with open(name, 'w') as f:\n\
             \x20           f.write(str(os.getpid()))\n\
             \x20   except OSError as e:\n\
             \x20       print(f'{name}: {e.strerror}', file=sys.stderr)\n\
             \x20       continue\n\
             \x20   sys.exit(f'left the node cgroup through {name}')\n\
             print(f'refused: {len(files)} cgroup.procs files', file=sys.stderr)\n",
        ),
    ];
    for (name, port, program) in attackers {
        let dir = scripts.join("taskservs").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("testenv.json"),
            json!({"port": port, "simulated": true, "description": format!("{name}: attacks its node (limits test)")})
                .to_string(),
        )
        .unwrap();
        write_simulated_start(&dir, name);
        std::fs::write(dir.join("attack.py"), program).unwrap();
        std::fs::write(
            dir.join("check.nu"),
            "const ATTACK = path self attack.py\ndef main [] { ^python3 $ATTACK }\n",
        )
        .unwrap();
    }
    scripts
}

/// A test's own taskserv `name` in `dir` starts as the simulated ones do:
/// `testenv/serve.py` answers on its port.
fn write_simulated_start(dir: &Path, name: &str) {
    std::fs::write(
        dir.join("start.py"),
        std::fs::read_to_string(real_scripts().join("taskservs/kubernetes/start.py"))
            .unwrap()
            .replace("\"kubernetes\"", &format!("{name:?}")),
    )
    .unwrap();
}

/// A topology template with limits on the topology and on two nodes.
fn templates_with_limits(dir: &Path) -> PathBuf {
    let templates = dir.join("templates");
    std::fs::create_dir_all(templates.join("topologies")).unwrap();
    std::fs::write(
        templates.join("topologies/under_attack.yaml"),
        "name: under_attack\n\
         description: two attackers and a bystander, each with its limits\n\
         limits: {memory_mib: 192, pids: 128, cpus: 0.5}\n\
         nodes:\n\
         \x20 - {name: bomb, taskservs: [forkbomb], limits: {pids: 48}}\n\
         \x20 - {name: hog, taskservs: [memhog], limits: {memory_mib: 128}}\n\
         \x20 - {name: calm, taskservs: [redis, cgescape]}\n",
    )
    .unwrap();
    templates
}

/// The value the kernel holds in a node's cgroup file.
fn cgroup_value(netns: &str, file: &str) -> String {
    let hierarchy = Hierarchy::detect().unwrap();
    let dir = hierarchy
        .dirs(netns)
        .into_iter()
        .find(|d| d.join(file).exists())
        .unwrap_or_else(|| panic!("no {file} for {netns}"));
    std::fs::read_to_string(dir.join(file))
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_fork_bomb_and_a_memory_hog_are_stopped_inside_their_nodes() {
    if !privileged("a_fork_bomb_and_a_memory_hog_are_stopped_inside_their_nodes") {
        return;
    }
    let tagged = Tagged::new("limits");
    let dir = tempfile::tempdir().unwrap();
    let mut settings = tagged.settings(dir.path());
    settings.scripts_dir = scripts_with_attackers(dir.path());
    settings.templates_dir = templates_with_limits(dir.path());
    let service = TestService::start(settings).await;
    let (_, listed) = service.get("/test/environments").await;
    let enforced = listed["limits"]["enforced_by"].as_str().unwrap_or_default();
    assert!(enforced.starts_with("cgroup v"), "{listed}");

    // A bystander environment, its limits from the request.
    let bystander = create(
        &service,
        json!({"type": "single_taskserv", "taskserv": "redis",
               "limits": {"memory_mib": 64, "pids": 100, "cpus": 0.25}}),
    )
    .await;
    assert_eq!(
        bystander["nodes"][0]["limits"],
        json!({"memory_mib": 64, "pids": 100, "cpus": 0.25}),
        "{bystander}"
    );
    // What the page says is what the kernel holds.
    let netns = bystander["nodes"][0]["netns"].as_str().unwrap();
    let (memory, pids, cpu) = match Hierarchy::detect().unwrap() {
        Hierarchy::V2 { .. } => (
            cgroup_value(netns, "memory.max"),
            cgroup_value(netns, "pids.max"),
            cgroup_value(netns, "cpu.max"),
        ),
        Hierarchy::V1 { .. } => (
            cgroup_value(netns, "memory.limit_in_bytes"),
            cgroup_value(netns, "pids.max"),
            cgroup_value(netns, "cpu.cfs_quota_us") + " 100000",
        ),
    };
    assert_eq!(
        (memory.as_str(), pids.as_str(), cpu.as_str()),
        ("67108864", "100", "25000 100000")
    );

    // The attackers' environment: the topology's limits, and its nodes'.
    let attacked = create(
        &service,
        json!({"type": "cluster", "topology": "under_attack"}),
    )
    .await;
    let limits: Vec<&Value> = attacked["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| &n["limits"])
        .collect();
    assert_eq!(
        limits,
        [
            &json!({"memory_mib": 192, "pids": 48, "cpus": 0.5}),
            &json!({"memory_mib": 128, "pids": 128, "cpus": 0.5}),
            &json!({"memory_mib": 192, "pids": 128, "cpus": 0.5}),
        ],
        "{attacked}"
    );
    let attacked_id = attacked["id"].as_str().unwrap();
    let run = run(&service, attacked_id).await;
    let check = |name: &str| {
        run["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no check {name}: {run}"))
            .clone()
    };
    // Each attack was stopped inside its node, and its check says by what.
    let bomb = check("forkbomb@bomb");
    assert_eq!(bomb["status"], "failed", "{run}");
    let error = bomb["error"].as_str().unwrap();
    assert!(
        error.contains("node bomb hit its pids limit (48): the kernel refused"),
        "{error}"
    );
    let hog = check("memhog@hog");
    assert_eq!(hog["status"], "failed", "{run}");
    let error = hog["error"].as_str().unwrap();
    assert!(
        error.contains("node hog hit its memory limit (128 MiB): the kernel killed"),
        "{error}"
    );
    // The node beside them, checked while they attacked, still works; and
    // its processes cannot leave their cgroup (the cgroup file systems
    // are read-only in a node).
    assert_eq!(check("redis@calm")["status"], "passed", "{run}");
    assert_eq!(check("cgescape@calm")["status"], "passed", "{run}");

    // The service answers, and the other environment passes its checks.
    let (status, _) = service
        .get(&format!("/test/environments/{attacked_id}"))
        .await;
    assert_eq!(status, 200);
    let bystander_id = bystander["id"].as_str().unwrap();
    let calm_run = self::run(&service, bystander_id).await;
    assert_eq!(calm_run["status"], "passed", "{calm_run}");

    for id in [attacked_id, bystander_id] {
        delete(&service, id).await;
    }
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

#[tokio::test]
async fn limits_out_of_bounds_are_refused_naming_the_field_and_the_bound() {
    let tagged = Tagged::new("limit-bounds");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let redis =
        |limits: Value| json!({"type": "single_taskserv", "taskserv": "redis", "limits": limits});
    for (body, message) in [
        (
            redis(json!({"memory_mib": 8})),
            "limits.memory_mib: 8 MiB is out of bounds: between 32 and 16384 MiB",
        ),
        (
            redis(json!({"pids": 100000})),
            "limits.pids: 100000 is out of bounds: between 16 and 32768",
        ),
        (
            redis(json!({"cpus": 0.01})),
            "limits.cpus: 0.01 is out of bounds: between 0.1 and",
        ),
        (
            redis(json!({"cpus": 4096.0})),
            "limits.cpus: 4096 is out of bounds",
        ),
        (redis(json!({"swap": 1})), "unknown field `swap`"),
        (
            json!({"type": "cluster", "topology": {"name": "t", "limits": {"pids": 1},
                   "nodes": [{"name": "a", "taskservs": ["redis"]}]}}),
            "topology.limits.pids: 1 is out of bounds",
        ),
        (
            json!({"type": "cluster", "topology": {"name": "t",
                   "nodes": [{"name": "a", "taskservs": ["redis"], "limits": {"memory_mib": 1}}]}}),
            "topology.nodes[0].limits.memory_mib: 1 MiB is out of bounds",
        ),
    ] {
        let (status, answer) = service
            .post("/test/environments/create", body.clone())
            .await;
        assert!(status == 422 || status == 400, "{body}: {status} {answer}");
        let text = answer["error"]["message"].as_str().unwrap();
        assert!(text.contains(message), "{body}: {text}");
    }
    let (_, listed) = service.get("/test/environments").await;
    assert_eq!(listed["environments"], json!([]));
    service.stop().await;
}

/// The version of a real taskserv's binary on this host, read as its
/// start script reads it in a node (`etcd --version`, ...).
fn host_version(taskserv: &str) -> String {
    let (program, pattern): (String, &str) = match taskserv {
        "etcd" => ("etcd".into(), "etcd Version: "),
        "redis" => ("redis-server".into(), "v="),
        "postgres" => {
            // Debian's newest versioned server, as the start script picks it.
            let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
                .expect("postgresql is installed")
                .flatten()
                .filter_map(|e| {
                    let version = e.file_name().to_str()?.parse().ok()?;
                    Some((version, e.path().join("bin/postgres")))
                })
                .collect();
            dirs.sort();
            let (_, path) = dirs.pop().expect("a postgresql server is installed");
            (path.display().to_string(), "(PostgreSQL) ")
        }
        other => panic!("no version for {other}"),
    };
    let output = Command::new(&program).arg("--version").output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let at = text
        .find(pattern)
        .unwrap_or_else(|| panic!("{program}: {text}"))
        + pattern.len();
    text[at..].split_whitespace().next().unwrap().to_owned()
}

/// Runs a client inside a node's network namespace (as a person would
/// from the host, beside the service): its stdout, or a panic naming it.
fn in_netns(netns: &str, program: &str, args: &[&str]) -> String {
    let output = Command::new("ip")
        .args(["netns", "exec", netns, program])
        .args(args)
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{program} {args:?} in {netns}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A node of an environment's page, by name.
fn env_node<'a>(env: &'a Value, name: &str) -> &'a Value {
    env["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .unwrap_or_else(|| panic!("no node {name}: {env}"))
}

/// A check of a run, by name.
fn run_check<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name}: {run}"))
}

#[tokio::test]
async fn etcd_cluster_forms_one_three_member_cluster() {
    if !privileged("etcd_cluster_forms_one_three_member_cluster") {
        return;
    }
    let tagged = Tagged::new("etcd");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let env = create(
        &service,
        json!({"type": "cluster", "topology": "etcd_cluster"}),
    )
    .await;
    let id = env["id"].as_str().unwrap();
    let members = ["etcd1", "etcd2", "etcd3"];
    // Each node runs a real member, of the host's etcd.
    let version = host_version("etcd");
    let (_, env) = service.get(&format!("/test/environments/{id}")).await;
    for name in members {
        let node = env_node(&env, name);
        assert_eq!(node["status"], "running", "{node}");
        let etcd = &node["services"][0];
        assert_eq!(etcd["name"], "etcd", "{node}");
        assert_eq!(etcd["simulated"], false, "{node}");
        assert_eq!(etcd["version"], version.as_str(), "{node}");
        assert_eq!(
            etcd["started"]["client_url"],
            format!("http://{}:2379", node["address"].as_str().unwrap()),
            "{node}"
        );
    }

    let run = run(&service, id).await;
    assert_eq!(run["status"], "passed", "{run}");
    assert_eq!(run["passed"], 6, "{run}");
    for (i, from) in members.iter().enumerate() {
        let check = run_check(&run, &format!("members-from-{from}"));
        let output = &check["output"];
        assert_eq!(output["from"], *from, "{check}");
        let others: Vec<&str> = members
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, m)| *m)
            .collect();
        // From each node, each other member sees all three, healthy.
        for (reached, target) in output["reached"].as_array().unwrap().iter().zip(&others) {
            assert_eq!(reached["target"], *target, "{check}");
            assert_eq!(reached["members"], json!(members), "{check}");
            assert_eq!(reached["healthy"].as_array().unwrap().len(), 3, "{check}");
        }
        // A key put through one member is read through another.
        assert_eq!(output["put_through"], others[0], "{check}");
        assert_eq!(output["read_through"], json!(others), "{check}");
        assert!(
            check["log_tail"]
                .as_str()
                .unwrap()
                .contains(&format!("ok: etcd on {}", others[1])),
            "{check}"
        );
    }

    // The same, asked with etcdctl from beside the service: a key put
    // through etcd1 in etcd1's namespace is read through etcd3 in etcd3's.
    let node = |name: &str| {
        let n = env_node(&env, name);
        (
            n["netns"].as_str().unwrap().to_owned(),
            format!("http://{}:2379", n["address"].as_str().unwrap()),
        )
    };
    let ((ns1, url1), (ns3, url3)) = (node("etcd1"), node("etcd3"));
    let listed = in_netns(&ns3, "etcdctl", &["--endpoints", &url3, "member", "list"]);
    for name in members {
        assert!(listed.contains(&format!(", {name}, ")), "{listed}");
    }
    let value = uuid::Uuid::now_v7().to_string();
    assert_eq!(
        in_netns(
            &ns1,
            "etcdctl",
            &["--endpoints", &url1, "put", "from-etcd1", &value]
        ),
        "OK"
    );
    assert_eq!(
        in_netns(
            &ns3,
            "etcdctl",
            &[
                "--endpoints",
                &url3,
                "get",
                "from-etcd1",
                "--print-value-only"
            ]
        ),
        value
    );

    delete(&service, id).await;
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

/// The host's System V shared memory segments that no process holds,
/// by key (`ipcs -m`): what a killed PostgreSQL would leave behind.
fn unattached_segments() -> std::collections::BTreeSet<String> {
    lines("ipcs", &["-m"])
        .iter()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            // key shmid owner perms bytes nattch [status]
            (cells.len() >= 6 && cells[0].starts_with("0x") && cells[5] == "0")
                .then(|| cells[0].to_owned())
        })
        .collect()
}

#[tokio::test]
async fn postgres_and_redis_answer_across_nodes_with_the_hosts_versions() {
    if !privileged("postgres_and_redis_answer_across_nodes_with_the_hosts_versions") {
        return;
    }
    let tagged = Tagged::new("pgredis");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let segments = unattached_segments();
    let (env, single, simulated) = tokio::join!(
        create(
            &service,
            json!({"type": "cluster", "topology": "postgres_redis"}),
        ),
        create(
            &service,
            json!({"type": "single_taskserv", "taskserv": "redis"}),
        ),
        create(
            &service,
            json!({"type": "single_taskserv", "taskserv": "kubernetes"}),
        ),
    );
    // The page names each node's taskservs with the versions of the
    // binaries they run: the host's, since a node's root is the host's.
    let taskserv = |env: &Value, node: &str| env_node(env, node)["services"][0].clone();
    for (env, node, name) in [
        (&env, "pg", "postgres"),
        (&env, "redis", "redis"),
        (&single, "redis", "redis"),
    ] {
        let started = taskserv(env, node);
        assert_eq!(started["name"], name, "{env}");
        assert_eq!(started["version"], host_version(name).as_str(), "{env}");
        assert_eq!(started["simulated"], false, "{env}");
        assert_eq!(env_node(env, node)["status"], "running", "{env}");
    }
    let fake = taskserv(&simulated, "kubernetes");
    assert_eq!(fake["simulated"], true, "{simulated}");
    assert_eq!(fake["version"], "simulated", "{simulated}");

    let id = env["id"].as_str().unwrap();
    let last = run(&service, id).await;
    assert_eq!(last["status"], "passed", "{last}");
    assert_eq!(last["passed"], 4, "{last}");
    // SQL from the redis node to postgres on pg; PING, SET, GET from pg
    // to redis on redis.
    let sql = &run_check(&last, "postgres-from-redis")["output"];
    assert_eq!(sql["from"], "redis", "{sql}");
    assert_eq!(sql["reached"][0]["target"], "pg", "{sql}");
    assert!(
        sql["reached"][0]["server_version"]
            .as_str()
            .unwrap()
            .starts_with(&host_version("postgres")),
        "{sql}"
    );
    assert_eq!(
        sql["reached"][0]["server_address"],
        env_node(&env, "pg")["address"],
        "{sql}"
    );
    let kv = &run_check(&last, "redis-from-postgres")["output"];
    assert_eq!(kv["from"], "pg", "{kv}");
    assert_eq!(kv["reached"][0]["target"], "redis", "{kv}");
    let single_run = run(&service, single["id"].as_str().unwrap()).await;
    assert_eq!(single_run["status"], "passed", "{single_run}");

    // The same, asked with the clients from beside the service.
    let ns = |node: &str| env_node(&env, node)["netns"].as_str().unwrap().to_owned();
    let addr = |node: &str| env_node(&env, node)["address"].as_str().unwrap().to_owned();
    assert_eq!(
        in_netns(
            &ns("redis"),
            "psql",
            &[
                "-h",
                &addr("pg"),
                "-U",
                "postgres",
                "-XAtc",
                "select 40 + 2"
            ]
        ),
        "42"
    );
    let value = uuid::Uuid::now_v7().to_string();
    assert_eq!(
        in_netns(
            &ns("pg"),
            "redis-cli",
            &["-h", &addr("redis"), "SET", "k", &value]
        ),
        "OK"
    );
    assert_eq!(
        in_netns(&ns("redis"), "redis-cli", &["-h", "127.0.0.1", "GET", "k"]),
        value
    );

    for env in [&env, &single, &simulated] {
        delete(&service, env["id"].as_str().unwrap()).await;
    }
    assert_eq!(tagged.leftovers(), Leftovers::none());
    // PostgreSQL, killed by the teardown, left its System V segment in its
    // node's IPC namespace, gone with the node: none on the host.
    let left: Vec<String> = unattached_segments()
        .difference(&segments)
        .cloned()
        .collect();
    assert_eq!(left, Vec::<String>::new(), "left on the host");
    service.stop().await;
}

#[tokio::test]
async fn a_second_start_replaces_the_daemon_it_finds_and_never_adopts_it() {
    if !privileged("a_second_start_replaces_the_daemon_it_finds_and_never_adopts_it") {
        return;
    }
    let tagged = Tagged::new("restart");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    // Not started by its create: each run starts it again, then checks it.
    let env = create(
        &service,
        json!({"type": "single_taskserv", "taskserv": "redis", "auto_start": false}),
    )
    .await;
    let id = env["id"].as_str().unwrap();
    let netns = env["nodes"][0]["netns"].as_str().unwrap().to_owned();
    assert_eq!(env["nodes"][0]["status"], "installed", "{env}");
    assert_eq!(node_process(&netns, &["redis-server"]), None);

    let first = run(&service, id).await;
    assert_eq!(first["status"], "passed", "{first}");
    let before = node_process(&netns, &["redis-server"]).expect("redis runs");
    let second = run(&service, id).await;
    assert_eq!(second["status"], "passed", "{second}");
    let after = node_process(&netns, &["redis-server"]).expect("redis runs again");
    assert_ne!(before, after, "the second start adopted the first daemon");
    // The first is gone (at most a zombie no one reaps): one redis runs.
    let running: Vec<i32> = lines("ip", &["netns", "pids", &netns])
        .iter()
        .filter_map(|p| p.trim().parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("redis-server"))
        })
        .collect();
    assert_eq!(running, [after], "{running:?}");
    let (_, env) = service.get(&format!("/test/environments/{id}")).await;
    assert_eq!(env["nodes"][0]["status"], "running", "{env}");
    let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
    assert!(
        logs.to_string().contains("stopping redis-server (pid"),
        "{logs}"
    );

    delete(&service, id).await;
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

/// What the `probe` taskserv's check (`probe.py`) saw in its node, from the
/// last log of `check probe@<node>` in `logs`.
fn probe_report(logs: &Value, node: &str) -> Value {
    let step = format!("check probe@{node}");
    let log = logs["entries"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["step"] == step)
        .unwrap_or_else(|| panic!("no {step} in {logs:#}"))["log"]
        .as_str()
        .unwrap()
        .to_owned();
    let line = log
        .lines()
        .find_map(|l| l.split_once("probe: ").map(|(_, json)| json))
        .unwrap_or_else(|| panic!("no report in {log}"));
    serde_json::from_str(line).unwrap()
}

/// The real scripts, copied under `dir`, with a taskserv `probe` whose
/// check writes into its node's root (on node `writer` only) and reports
/// what its node shows: the files written, the service's files named in
/// `probe.json` (written by the test), `/dev`, whether `mount` and `umount` work, its
/// capabilities.
fn scripts_with_probe(dir: &Path) -> PathBuf {
    let scripts = dir.join("scripts");
    assert!(
        Command::new("cp")
            .arg("-r")
            .arg(real_scripts())
            .arg(&scripts)
            .status()
            .unwrap()
            .success()
    );
    let probe = scripts.join("taskservs/probe");
    std::fs::create_dir_all(&probe).unwrap();
    std::fs::write(
        probe.join("testenv.json"),
        r#"{"port": 7070, "simulated": true, "description": "writes into its node's root and reports what it sees"}"#,
    )
    .unwrap();
    write_simulated_start(&probe, "probe");
    std::fs::write(
        probe.join("check.nu"),
        "const PROBE = path self probe.py\ndef main [] { ^python3 $PROBE }\n",
    )
    .unwrap();
    std::fs::write(
        probe.join("probe.py"),
        r#"import json, os, socket, stat, subprocess
here = socket.gethostname()
config = json.load(open(os.path.join(os.path.dirname(__file__), "probe.json")))
written = ["/etc/probe", "/usr/local/bin/x", "/var/lib/x"]
def read(path):
    try:
        return open(path).read()
    except OSError:
        return None
seen = {path: read(path) for path in written}
wrote = False
if here == "writer" and seen["/etc/probe"] is None:
    for path in written:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(here + "\n")
    wrote = True
def fails(args):
    return subprocess.run(args, capture_output=True).returncode != 0
def mknod_fails():
    try:
        os.mknod("/tmp/disk", stat.S_IFBLK | 0o600, os.makedev(253, 0))
        return False
    except OSError:
        return True
status = open("/proc/self/status").read()
report = {
    "node": here,
    "seen": seen,
    "wrote": wrote,
    "read_back": {path: read(path) for path in written},
    "hidden_seen": [p for p in config["hidden"] if os.path.exists(p)],
    "data_dir_files": [os.path.join(d, f) for d, _, files in os.walk(config["data_dir"]) for f in files],
    "dev": sorted(os.listdir("/dev")),
    "mount_fails": fails(["mount", "-t", "tmpfs", "none", "/mnt"]),
    "umount_fails": fails(["umount", "/tmp"]),
    "mknod_fails": mknod_fails(),
    "hostname_file": read("/etc/hostname"),
    "hosts": read("/etc/hosts"),
    "pid1": read("/proc/1/cmdline"),
    "cwd": os.getcwd(),
    "data_dir": os.environ.get("ORCHESTRATOR_DATA_DIR"),
    "caps": [l for l in status.splitlines() if l.startswith("Cap")],
}
print("probe: " + json.dumps(report), flush=True)
"#,
    )
    .unwrap();
    scripts
}

#[tokio::test]
async fn a_nodes_root_is_its_own_and_shows_nothing_of_the_service() {
    if !privileged("a_nodes_root_is_its_own_and_shows_nothing_of_the_service") {
        return;
    }
    let written = ["/etc/probe", "/usr/local/bin/x", "/var/lib/x"];
    for path in written {
        assert!(
            !Path::new(path).exists(),
            "{path} exists on this host already"
        );
    }
    let tagged = Tagged::new("rootfs");
    // The data dir on the host's root filesystem (a node's /tmp is its
    // own: there it would be hidden whatever the masks); the scripts under
    // /tmp, which a node shows only through a bind of them.
    let data = tempfile::tempdir_in("/var/tmp").unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let mut settings = tagged.settings(data.path());
    settings.scripts_dir = scripts_with_probe(scratch.path());
    let service = TestService::start(settings).await;
    // What the service keeps in its data dir once started (its key, its
    // store): a node sees none of it.
    let hidden: Vec<PathBuf> = std::fs::read_dir(data.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| !p.ends_with("testenv"))
        .collect();
    assert!(
        hidden.contains(&data.path().join("secret.key")),
        "{hidden:?}"
    );
    std::fs::write(
        scratch.path().join("scripts/taskservs/probe/probe.json"),
        json!({"hidden": hidden, "data_dir": data.path()}).to_string(),
    )
    .unwrap();
    let env = create(
        &service,
        json!({"type": "cluster", "topology": {"name": "roots", "nodes": [
            {"name": "writer", "taskservs": ["probe"]},
            {"name": "reader", "taskservs": ["probe"]}]}}),
    )
    .await;
    let id = env["id"].as_str().unwrap().to_owned();
    // Every mount of the nodes is in their own namespaces.
    assert_eq!(tagged.leftovers().mounts, Vec::<String>::new());

    let first = run(&service, &id).await;
    assert_eq!(first["status"], "passed", "{first}");
    let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
    let writer = probe_report(&logs, "writer");
    let reader = probe_report(&logs, "reader");
    for path in written {
        assert_eq!(writer["seen"][path], Value::Null, "{writer}");
        assert_eq!(writer["read_back"][path], "writer\n", "{writer}");
        // Not on the host, nor in the other node.
        assert!(!Path::new(path).exists(), "{path} was written on the host");
        assert_eq!(reader["read_back"][path], Value::Null, "{reader}");
    }
    assert_eq!(writer["wrote"], true, "{writer}");
    for report in [&writer, &reader] {
        let node = report["node"].as_str().unwrap();
        assert_eq!(report["hidden_seen"], json!([]), "{report}");
        // Nothing of the data dir: no file of the store, no key, no other
        // node's layer.
        assert_eq!(report["data_dir_files"], json!([]), "{report}");
        assert_eq!(
            report["dev"],
            json!([
                "fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout",
                "tty", "urandom", "zero"
            ]),
            "{report}"
        );
        assert_eq!(report["mount_fails"], true, "{report}");
        assert_eq!(report["umount_fails"], true, "{report}");
        assert_eq!(report["mknod_fails"], true, "{report}");
        assert_eq!(report["hostname_file"], format!("{node}\n"), "{report}");
        let hosts = report["hosts"].as_str().unwrap();
        assert!(
            hosts.contains("\twriter\n") && hosts.contains("\treader\n"),
            "{report}"
        );
        assert!(
            report["pid1"]
                .as_str()
                .unwrap()
                .contains("testenv-node-init"),
            "{report}"
        );
        assert_eq!(report["cwd"], "/var/lib/orchestrator-node", "{report}");
        assert_eq!(report["data_dir"], "/var/lib/orchestrator-node", "{report}");
        let caps = report["caps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        assert_node_capabilities(&caps);
    }

    // The writer's files stay in its root: read back on the next run.
    let second = run(&service, &id).await;
    assert_eq!(second["status"], "passed", "{second}");
    let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
    let writer = probe_report(&logs, "writer");
    let reader = probe_report(&logs, "reader");
    assert_eq!(writer["wrote"], false, "{writer}");
    for path in written {
        assert_eq!(writer["seen"][path], "writer\n", "{writer}");
        assert_eq!(reader["seen"][path], Value::Null, "{reader}");
    }

    // Teardown removes the layers with the nodes' dirs.
    let env_dir = std::fs::read_dir(data.path().join("testenv"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("{}-", tagged.tag))
        })
        .expect("the environment's dir");
    let upper = env_dir.join("writer/upper/etc/probe");
    assert_eq!(std::fs::read_to_string(&upper).unwrap(), "writer\n");
    delete(&service, &id).await;
    assert!(!upper.exists() && !env_dir.exists());
    assert_eq!(tagged.leftovers(), Leftovers::none());
    for path in written {
        assert!(!Path::new(path).exists(), "{path} was written on the host");
    }
    service.stop().await;
}

/// The next `environment_changed` event of `id` on a stream filtered to
/// that kind, as its status.
async fn next_env_status(stream: &mut crate::live::Stream, id: &str) -> String {
    next_env_event(stream, id).await["status"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn next_env_event(stream: &mut crate::live::Stream, id: &str) -> Value {
    loop {
        let sse = stream.next().await;
        if sse.event != "change" {
            continue;
        }
        assert_eq!(sse.data["kind"], "environment_changed", "{:?}", sse.data);
        if sse.data["environment_id"] == id {
            return sse.data;
        }
    }
}

#[tokio::test]
async fn an_environments_changes_are_events_on_the_one_stream() {
    if !privileged("an_environments_changes_are_events_on_the_one_stream") {
        return;
    }
    let tagged = Tagged::new("events");
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(tagged.settings(dir.path())).await;
    let mut stream = crate::live::Stream::open(&service, "?kind=environment_changed", None).await;
    assert_eq!(stream.next().await.event, "snapshot");

    // Created without waiting: its events say `creating`, then `ready`
    // once its create workflow is stored as completed.
    let (status, env) = service
        .post(
            "/test/environments/create",
            json!({"type": "cluster", "topology": "containerd_test"}),
        )
        .await;
    assert_eq!(status, 201, "{env}");
    let id = env["id"].as_str().unwrap().to_owned();
    assert_eq!(next_env_status(&mut stream, &id).await, "creating");
    let mut seen = vec!["creating".to_owned()];
    while seen.last().unwrap() != "ready" {
        let status = next_env_status(&mut stream, &id).await;
        assert!(
            ["creating", "ready"].contains(&status.as_str()),
            "{status} after {seen:?}"
        );
        seen.push(status);
    }
    // When the event comes, the API shows the same.
    assert_eq!(env_status(&service, &id).await, "ready");

    // A run changes no status, but its checks: announced, still `ready`.
    let before_run = chrono::Utc::now();
    let run = run(&service, &id).await;
    assert_eq!(run["status"], "passed", "{run}");
    loop {
        let event = next_env_event(&mut stream, &id).await;
        assert_eq!(event["status"], "ready", "{event}");
        let at: chrono::DateTime<chrono::Utc> = event["time"].as_str().unwrap().parse().unwrap();
        if at > before_run {
            break;
        }
    }

    // Deleted: `deleting` (unless the teardown outran the gathering),
    // then `deleted`, and nothing else.
    let (status, deleting) = service.delete(&format!("/test/environments/{id}")).await;
    assert_eq!(status, 202, "{deleting}");
    let mut statuses = Vec::new();
    loop {
        let status = next_env_status(&mut stream, &id).await;
        let done = status == "deleted";
        statuses.push(status);
        if done {
            break;
        }
    }
    assert!(
        statuses
            .iter()
            .all(|s| ["ready", "deleting", "deleted"].contains(&s.as_str())),
        "{statuses:?}"
    );
    assert_eq!(env_status(&service, &id).await, "deleted");
    assert_eq!(tagged.leftovers(), Leftovers::none());

    // An unknown kind is still refused by name.
    let (status, body) = service.get("/events?kind=environment_chnged").await;
    assert_eq!(status, 400, "{body}");
    service.stop().await;
}
