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
        Leftovers {
            netns,
            links,
            cgroups: self.cgroups(),
            processes,
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
}

impl Leftovers {
    fn none() -> Leftovers {
        Leftovers {
            netns: vec![],
            links: vec![],
            cgroups: vec![],
            processes: vec![],
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
    let postgres = node_process(
        pg["netns"].as_str().unwrap(),
        &["serve.py", "--service postgres"],
    )
    .expect("postgres runs in node pg");
    // The provider needs CAP_SYS_ADMIN and CAP_NET_ADMIN (here: root's
    // every capability) to make the node; what runs in it holds none.
    let status = std::fs::read_to_string(format!("/proc/{postgres}/status")).unwrap();
    for set in ["CapEff", "CapPrm", "CapAmb", "CapInh", "CapBnd"] {
        let line = status.lines().find(|l| l.starts_with(set)).unwrap();
        assert!(
            line.ends_with("0000000000000000"),
            "a node's service holds {line}"
        );
    }
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

    delete(&service, id).await;
    assert_eq!(tagged.leftovers(), Leftovers::none());
    service.stop().await;
}

/// Whether `taskserv`'s service answers at `address:port` (an HTTP GET,
/// its answer naming the service), from inside the network namespace
/// `netns`, or from the host without one. The answer is checked, not only
/// the connection: a host may have a proxy that accepts any connection.
fn answers_from(netns: Option<&str>, address: &str, port: u16, taskserv: &str) -> bool {
    let probe = format!(
        "import socket,sys\n\
         try:\n    s=socket.create_connection(('{address}', {port}), timeout=2)\n    \
         s.settimeout(2)\n    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n    \
         data=s.makefile('rb').read()\nexcept OSError:\n    sys.exit(1)\n\
         sys.exit(0 if b'\"service\": \"{taskserv}\"' in data else 1)"
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
        json!({"type": "single_taskserv", "taskserv": "etcd", "ttl": "5s"}),
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
    assert_eq!(node_process(&app_netns, &["serve.py"]), None);
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
    assert!(
        listed.contains("kubernetes_3node") && listed.contains("postgres (port 5432)"),
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
            json!({"port": port, "description": format!("{name}: attacks its node (limits test)")})
                .to_string(),
        )
        .unwrap();
        std::fs::write(dir.join("attack.py"), program).unwrap();
        std::fs::write(
            dir.join("check.nu"),
            "const ATTACK = path self attack.py\ndef main [] { ^python3 $ATTACK }\n",
        )
        .unwrap();
    }
    scripts
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
