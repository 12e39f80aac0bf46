//! Test environments on the Docker Engine API provider, against Podman's
//! Docker-compatible socket: the real `orchestrator serve
//! --testenv-provider docker` makes, checks and deletes environments
//! through its API, and the containers and networks are counted before
//! and after.
//!
//! Each test starts its own `podman system service` (runc, its own
//! `containers.conf` and `storage.conf`, storage and run roots in a temp
//! dir) and stops it in `Drop`, removing its containers first. The image
//! (a debootstrap root, `scripts/testenv/build-image.sh`) is built once
//! and imported once into a store under `~/.cache`, which every test's
//! podman reads as an additional image store: nothing is imported per
//! test, and no test's state is shared. Without root, podman, runc or
//! debootstrap each test says so loudly and passes without running.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use orchestrator_testenv::model::service_tag;
use serde_json::{Value, json};

use crate::harness::{TestService, real_scripts, spawn_serve};

const BIN: &str = env!("CARGO_BIN_EXE_orchestrator");
const LABEL_TAG: &str = orchestrator_testenv::docker::LABEL_TAG;

/// Whether podman can run here; if not, says so loudly.
fn podman_available(test: &str) -> bool {
    let missing: Vec<&str> = ["podman", "runc", "debootstrap"]
        .into_iter()
        .filter(|tool| {
            !Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .collect();
    let root = nix::unistd::Uid::effective().is_root();
    if missing.is_empty() && root {
        return true;
    }
    eprintln!(
        "\n**************** SKIPPED {test}: the docker provider's tests need root and \
         podman, runc, debootstrap (missing: {}); `.ci/run` installs them ****************\n",
        if root {
            missing.join(", ")
        } else {
            "root".to_owned()
        }
    );
    false
}

fn templates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../templates")
}

fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache/orchestrator-testenv-podman")
}

/// Builds and imports the image into the shared `store`, once per
/// machine. The store's podman state records its run root and temp dir,
/// so those are fixed too (beside it), not the test's.
fn build_image(store: &Path) -> std::process::Output {
    let cache = cache_dir();
    let conf = cache.join("containers.conf");
    // Written aside and renamed: tests running at once never read half.
    let written = cache.join(format!("containers.conf.{}", uuid::Uuid::now_v7().simple()));
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(
        &written,
        format!(
            "[containers]\ndefault_ulimits = []\n\n\
             [engine]\nruntime = \"runc\"\ntmp_dir = \"{0}/store-tmp\"\nevents_logger = \"file\"\n\
             cgroup_manager = \"cgroupfs\"\n",
            cache.display()
        ),
    )
    .unwrap();
    std::fs::rename(&written, &conf).unwrap();
    Command::new(real_scripts().join("testenv/build-image.sh"))
        .arg("--root")
        .arg(store)
        .arg("--runroot")
        .arg(cache.join("store-run"))
        .env("CONTAINERS_CONF", &conf)
        .output()
        .unwrap()
}

/// `podman system service` on a socket of its own; stopped, with every
/// container it made, when dropped.
struct Podman {
    dir: tempfile::TempDir,
    service: Child,
}

impl Podman {
    fn socket(&self) -> PathBuf {
        self.dir.path().join("api.sock")
    }

    fn host(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// Writes the configuration, makes sure the image is in the shared
    /// store (built and imported at most once per machine), starts the
    /// service and waits until it answers.
    fn start() -> Podman {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let root = root.as_path();
        let store = cache_dir().join("store");
        std::fs::create_dir_all(&store).unwrap();
        // This VM's cgroup layout needs runc (crun refuses it) and no
        // default ulimits; the CNI configs, the engine's state and its
        // storage stay in the test's dir, so nothing global changes.
        std::fs::write(
            root.join("containers.conf"),
            format!(
                "[containers]\ndefault_ulimits = []\n\n\
                 [engine]\nruntime = \"runc\"\ntmp_dir = \"{0}/tmp\"\nevents_logger = \"file\"\n\
                 cgroup_manager = \"cgroupfs\"\n\n\
                 [network]\nnetwork_config_dir = \"{0}/cni\"\n",
                root.display()
            ),
        )
        .unwrap();
        std::fs::write(
            root.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{0}/storage\"\nrunroot = \"{0}/run\"\n\n\
                 [storage.options]\nadditionalimagestores = [\"{1}\"]\n",
                root.display(),
                store.display()
            ),
        )
        .unwrap();
        let build = build_image(&store);
        assert!(
            build.status.success(),
            "build-image.sh failed: {}",
            String::from_utf8_lossy(&build.stderr)
        );
        let socket = root.join("api.sock");
        let service = Command::new("podman")
            .args(["--runtime", "runc", "system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .env("CONTAINERS_CONF", root.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", root.join("storage.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(root.join("service.log")).unwrap())
            .spawn()
            .unwrap();
        let podman = Podman { dir, service };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !podman.answers() {
            assert!(
                Instant::now() < deadline,
                "podman system service did not answer on {}: {}",
                socket.display(),
                std::fs::read_to_string(root.join("service.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        podman
    }

    /// `GET /_ping` answers `OK`.
    fn answers(&self) -> bool {
        let Ok(mut stream) = UnixStream::connect(self.socket()) else {
            return false;
        };
        let mut answer = String::new();
        stream
            .write_all(b"GET /_ping HTTP/1.0\r\nHost: podman\r\n\r\n")
            .and_then(|()| stream.read_to_string(&mut answer))
            .is_ok()
            && answer.ends_with("OK")
    }

    /// The podman client, on this service.
    fn remote(&self, args: &[&str]) -> Vec<String> {
        let output = Command::new("podman")
            .args(["--remote", "--url", &self.host()])
            .args(args)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "podman {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// The containers and networks that carry `tag`.
    fn leftovers(&self, tag: &str) -> (Vec<String>, Vec<String>) {
        let filter = format!("label={LABEL_TAG}={tag}");
        (
            self.remote(&["ps", "-a", "--filter", &filter, "--format", "{{.Names}}"]),
            self.remote(&[
                "network",
                "ls",
                "--filter",
                &filter,
                "--format",
                "{{.Name}}",
            ]),
        )
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Containers outlive the service (conmon keeps them): removed
        // first, with their networks.
        let host = self.host();
        for args in [
            &["rm", "--all", "--force"][..],
            &["network", "prune", "--force"][..],
        ] {
            let _ = Command::new("podman")
                .args(["--remote", "--url", &host])
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.service.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.service.wait();
        // What podman left of exec sessions in removed containers (their
        // conmon waits minutes before it goes): by pid, those whose
        // command line names this test's dir.
        let mark = self.dir.path().to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&mark) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        forget_cni_isolation_rules();
        // The storage's own mounts go with `podman system reset`-like
        // cleanup: unmount what is left under the dir before removing it.
        let storage = self.dir.path().join("storage");
        let _ = Command::new("umount")
            .args(["-R", "-l"])
            .arg(storage.join("overlay"))
            .stderr(Stdio::null())
            .status();
    }
}

/// Podman 4 with CNI (Debian 12) leaves, per network, the two iptables
/// rules of the CNI firewall plugin's `ingressPolicy: same-bridge` after
/// the network and its bridge are gone (a bug of the plugin; netavark
/// has none): the rules of environment bridges (`te…`) that no longer
/// exist are deleted, by number, highest first.
fn forget_cni_isolation_rules() {
    for chain in ["CNI-ISOLATION-STAGE-1", "CNI-ISOLATION-STAGE-2"] {
        let Ok(listed) = Command::new("iptables")
            .args(["-L", chain, "-v", "-n", "--line-numbers"])
            .output()
        else {
            return;
        };
        let mut stale: Vec<u32> = String::from_utf8_lossy(&listed.stdout)
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let number = fields.first()?.parse::<u32>().ok()?;
                let bridge = [fields.get(6)?, fields.get(7)?]
                    .into_iter()
                    .map(|f| f.trim_start_matches('!'))
                    .find(|f| f.starts_with("te"))?;
                let gone = !Command::new("ip")
                    .args(["link", "show", bridge])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                gone.then_some(number)
            })
            .collect();
        stale.sort_unstable_by(|a, b| b.cmp(a));
        for number in stale {
            let _ = Command::new("iptables")
                .args(["-D", chain, &number.to_string()])
                .status();
        }
    }
}

/// `orchestrator serve --testenv-provider docker` as a process of its own.
struct Daemon {
    child: Child,
    client: TestService,
}

impl Daemon {
    fn start(data_dir: &Path, node_id: &str, docker_host: &str) -> Daemon {
        let mut command = Command::new(BIN);
        command
            .args(["serve", "--port", "0", "--no-auth", "--node-id", node_id])
            .args(["--testenv-provider", "docker", "--docker-host", docker_host])
            .arg("--data-dir")
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
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn node_id(test: &str) -> String {
    format!("docker-{test}-{}", uuid::Uuid::now_v7().simple())
}

async fn env_status(service: &TestService, id: &str) -> String {
    let (_, env) = service.get(&format!("/test/environments/{id}")).await;
    env["status"].as_str().unwrap_or_default().to_owned()
}

/// Polls `done` until it holds; fails after five minutes (a condition,
/// not a timing).
async fn wait_until<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "gave up waiting: {what}"
        );
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
        panic!("not ready: {env:#}\nlogs: {logs:#}");
    }
    env
}

async fn delete(service: &TestService, id: &str) {
    let (status, env) = service
        .delete(&format!("/test/environments/{id}?wait=true"))
        .await;
    assert_eq!(status, 202, "{env}");
    assert_eq!(env["status"], "deleted", "{env}");
}

/// Create, run (every check passes, each through its check script),
/// delete; the containers and networks of the environment exist while it
/// does.
async fn lifecycle(podman: &Podman, service: &TestService, tag: &str, body: Value, checks: usize) {
    let env = create(service, body.clone()).await;
    let id = env["id"].as_str().unwrap();
    assert_eq!(env["provider"], "docker", "{env}");
    let nodes = env["nodes"].as_array().unwrap().len();
    let (containers, networks) = podman.leftovers(tag);
    assert!(containers.len() >= nodes, "{containers:?}");
    assert!(!networks.is_empty(), "{networks:?}");
    // Each container holds its node's limits, as the page shows them:
    // memory with swap included, processes, CPU time.
    for node in env["nodes"].as_array().unwrap() {
        let limits = &node["limits"];
        let memory = limits["memory_mib"].as_u64().unwrap() * 1024 * 1024;
        let nano_cpus = (limits["cpus"].as_f64().unwrap() * 1e9) as u64;
        assert_eq!(
            podman.remote(&[
                "inspect",
                node["netns"].as_str().unwrap(),
                "--format",
                "{{.HostConfig.Memory}} {{.HostConfig.MemorySwap}} {{.HostConfig.PidsLimit}} {{.HostConfig.NanoCpus}}",
            ]),
            [format!("{memory} {memory} {} {nano_cpus}", limits["pids"])],
            "{node}"
        );
    }

    let (status, ran) = service
        .post(&format!("/test/environments/{id}/run?wait=true"), json!({}))
        .await;
    assert_eq!(status, 202, "{ran}");
    let run = &ran["last_run"];
    if run["status"] != "passed" {
        let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
        panic!("{body}: {run:#}\nlogs: {logs:#}");
    }
    let results = run["checks"].as_array().unwrap();
    assert_eq!(results.len(), checks, "{body}: {run}");
    let (_, logs) = service.get(&format!("/test/environments/{id}/logs")).await;
    let check_logs: Vec<&Value> = logs["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["workflow"] == "run")
        .collect();
    assert_eq!(check_logs.len(), checks, "{logs}");
    assert!(
        check_logs
            .iter()
            .all(|e| e["log"].as_str().unwrap().contains("ok: ")),
        "{logs}"
    );
    delete(service, id).await;
}

#[tokio::test]
async fn the_docker_provider_makes_checks_and_deletes_environments() {
    if !podman_available("the_docker_provider_makes_checks_and_deletes_environments") {
        return;
    }
    let podman = Podman::start();
    let node_id = node_id("all");
    let tag = service_tag(&node_id);
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&dir.path().join("data"), &node_id, &podman.host());
    let service = &daemon.client;
    assert_eq!(podman.leftovers(&tag), (vec![], vec![]));

    lifecycle(
        &podman,
        service,
        &tag,
        json!({"type": "single_taskserv", "taskserv": "redis"}),
        1,
    )
    .await;
    assert_eq!(podman.leftovers(&tag), (vec![], vec![]));

    // The figure of issue 28: a three-node cluster made, every check
    // passed, deleted (printed, not asserted).
    let started = Instant::now();
    lifecycle(
        &podman,
        service,
        &tag,
        json!({"type": "cluster", "topology": "etcd_cluster"}),
        6,
    )
    .await;
    eprintln!(
        "FIGURE docker provider: etcd_cluster create -> checks passed -> deleted in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(podman.leftovers(&tag), (vec![], vec![]));

    // The same real taskservs as on the namespace provider: SQL and redis
    // across nodes.
    lifecycle(
        &podman,
        service,
        &tag,
        json!({"type": "cluster", "topology": "postgres_redis"}),
        4,
    )
    .await;
    assert_eq!(podman.leftovers(&tag), (vec![], vec![]));
    daemon.stop();
}

#[tokio::test]
async fn an_engine_that_does_not_answer_is_a_503_naming_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let host = format!("unix://{}/nothing-listens.sock", dir.path().display());
    let daemon = Daemon::start(&dir.path().join("data"), &node_id("none"), &host);
    let (status, answer) = daemon
        .client
        .post(
            "/test/environments/create",
            json!({"type": "single_taskserv", "taskserv": "redis"}),
        )
        .await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "provider_unavailable", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains(&host), "{message}");
    // Nothing was recorded.
    let (status, listed) = daemon.client.get("/test/environments").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["environments"], json!([]), "{listed}");
    daemon.stop();
}

#[tokio::test]
async fn a_bad_provider_or_docker_host_stops_the_start_naming_the_setting() {
    for (flags, named) in [
        (&["--testenv-provider", "vm"][..], "--testenv-provider"),
        (
            &[
                "--testenv-provider",
                "docker",
                "--docker-host",
                "tcp://127.0.0.1:2375",
            ][..],
            "--docker-host",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new(BIN)
            .args(["serve", "--print-config", "--data-dir"])
            .arg(dir.path())
            .args(flags)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{flags:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--print-config", "--data-dir"])
        .arg(dir.path())
        .args([
            "--testenv-provider",
            "docker",
            "--docker-host",
            "unix:///run/podman.sock",
        ])
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{printed}");
    assert!(
        printed.contains("testenv_provider = \"docker\""),
        "{printed}"
    );
    assert!(
        printed.contains("docker_host = \"unix:///run/podman.sock\""),
        "{printed}"
    );
}

#[tokio::test]
async fn a_service_killed_mid_create_leaves_no_container_once_deleted() {
    if !podman_available("a_service_killed_mid_create_leaves_no_container_once_deleted") {
        return;
    }
    let podman = Podman::start();
    let node_id = node_id("kill");
    let tag = service_tag(&node_id);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let daemon = Daemon::start(&data, &node_id, &podman.host());
    let (status, env) = daemon
        .client
        .post(
            "/test/environments/create",
            json!({"type": "cluster", "topology": "etcd_cluster"}),
        )
        .await;
    assert_eq!(status, 201, "{env}");
    let id = env["id"].as_str().unwrap().to_owned();
    // SIGKILL once the containers are being made.
    wait_until("a container exists", || async {
        !podman.leftovers(&tag).0.is_empty()
    })
    .await;
    daemon.kill9();
    assert!(!podman.leftovers(&tag).0.is_empty());

    // The restarted service finds the environment it recorded and finishes
    // it; deleting it then leaves no container and no network.
    let daemon = Daemon::start(&data, &node_id, &podman.host());
    let client = &daemon.client;
    wait_until("the environment is made again", || {
        let id = id.clone();
        async move { matches!(env_status(client, &id).await.as_str(), "ready" | "failed") }
    })
    .await;
    delete(client, &id).await;
    assert_eq!(podman.leftovers(&tag), (vec![], vec![]));
    daemon.stop();
}

/// The provider's seam, on its own: a program in a node gets its stdin to
/// its end and gives its stdout, stderr and exit code; a killed program
/// and what it started are gone; `kill_matching` finds by command line;
/// `destroy` removes everything and is idempotent; `existing` finds an
/// environment by its labels.
#[tokio::test]
async fn a_program_in_a_container_node_is_fed_read_waited_for_and_killed() {
    use orchestrator_testenv::{Catalog, CreateRequest, DockerProvider, EnvPlan, Provider};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    if !podman_available("a_program_in_a_container_node_is_fed_read_waited_for_and_killed") {
        return;
    }
    let podman = Podman::start();
    let tag = service_tag(&node_id("seam"));
    let catalog = Catalog::load(&real_scripts(), Some(&templates())).unwrap();
    let request: CreateRequest =
        serde_json::from_value(json!({"type": "single_taskserv", "taskserv": "redis"})).unwrap();
    let plan = EnvPlan::new(
        &request,
        &catalog,
        uuid::Uuid::now_v7(),
        &tag,
        chrono::Utc::now(),
    )
    .unwrap();
    let node = &plan.nodes[0];
    let root = tempfile::tempdir().unwrap();
    let provider = DockerProvider::new(
        &podman.host(),
        orchestrator_testenv::docker::DEFAULT_IMAGE,
        &real_scripts(),
    )
    .unwrap();
    provider.health().await.unwrap();
    provider.create(&plan, root.path()).await.unwrap();
    assert_eq!(
        provider.existing(&tag, root.path()).await.unwrap(),
        [plan.names()]
    );

    // Fed to the end of its input, read on both streams, its exit code.
    let python = Path::new("python3");
    let echo = "import sys; d = sys.stdin.read(); print(d.upper()); \
                print('to stderr', file=sys.stderr); sys.exit(3)";
    let env = [("GREETING".to_owned(), "hello".to_owned())];
    let mut process = provider
        .spawn(
            &plan,
            node,
            root.path(),
            python,
            &["-c".to_owned(), echo.to_owned()],
            &env,
        )
        .await
        .unwrap();
    let mut stdin = process.stdin.take().unwrap();
    stdin.write_all(b"some input").await.unwrap();
    stdin.shutdown().await.unwrap();
    let (mut out, mut err) = (String::new(), String::new());
    let mut stdout = process.stdout.take().unwrap();
    let mut stderr = process.stderr.take().unwrap();
    let (read_out, read_err) = tokio::join!(
        stdout.read_to_string(&mut out),
        stderr.read_to_string(&mut err)
    );
    read_out.unwrap();
    read_err.unwrap();
    let exit = process.wait().await.unwrap();
    assert_eq!((out.trim(), err.trim()), ("SOME INPUT", "to stderr"));
    assert_eq!(exit.code, Some(3), "{exit}");

    // Its environment: the node's, and what the caller added.
    let show = "import os; print(os.environ['GREETING'], os.environ['ORCHESTRATOR_DATA_DIR'], os.getcwd())";
    let mut process = provider
        .spawn(
            &plan,
            node,
            root.path(),
            python,
            &["-c".to_owned(), show.to_owned()],
            &env,
        )
        .await
        .unwrap();
    drop(process.stdin.take());
    let mut out = String::new();
    process
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    assert!(process.wait().await.unwrap().success());
    let node_dir = plan.names().dir(root.path()).join(&node.name);
    let node_dir = node_dir.to_string_lossy();
    assert_eq!(out.trim(), format!("hello {node_dir} {node_dir}"));

    // Killed, with the program it started.
    let spawner = "import subprocess, sys; subprocess.Popen(['sleep', '1001']); \
                   print('started', flush=True); subprocess.run(['sleep', '1002'])";
    let mut process = provider
        .spawn(
            &plan,
            node,
            root.path(),
            python,
            &["-c".to_owned(), spawner.to_owned()],
            &[],
        )
        .await
        .unwrap();
    drop(process.stdin.take());
    let mut stdout = process.stdout.take().unwrap();
    let mut started = [0u8; 7];
    stdout.read_exact(&mut started).await.unwrap();
    let sleeping = |words: &'static str| {
        let list = podman.remote(&["exec", &node.netns, "ps", "-e", "-o", "args="]);
        list.iter().any(|l| l.trim() == words)
    };
    wait_until("both sleeps run", || async {
        sleeping("sleep 1001") && sleeping("sleep 1002")
    })
    .await;
    process.kill().await.unwrap();
    let exit = process.wait().await.unwrap();
    assert!(!exit.success(), "{exit}");
    wait_until("both sleeps are gone", || async {
        !sleeping("sleep 1001") && !sleeping("sleep 1002")
    })
    .await;

    // Everything goes, once.
    assert!(provider.destroy(&plan.names(), root.path()).await.unwrap() >= 3);
    assert_eq!(podman.leftovers(&tag), (vec![], vec![]));
    assert_eq!(
        provider.destroy(&plan.names(), root.path()).await.unwrap(),
        0
    );
    assert!(
        provider
            .existing(&tag, root.path())
            .await
            .unwrap()
            .is_empty()
    );
}
