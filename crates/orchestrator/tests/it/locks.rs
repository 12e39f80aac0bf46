//! Named resource locks through the real service: grants in the order
//! asked with fencing tokens that grow, the token in a script's
//! environment and input and in an http step's request, `GET /locks` and
//! `orchestrator locks`, bad declarations refused naming the field, and
//! `kill -9` drills (one node on the filesystem store; two nodes on a
//! SurrealDB server) with no overlapping holders, no leaked lock, and
//! tokens that only grow.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cli::{BIN, Daemon, submit};
use crate::fakes::{Fake, Flavor, Plan};
use crate::harness::{TestService, fixture_settings};

/// A workflow of one step that holds `env:<env>` until the file `gate`
/// exists in the scripts' state dir (or `hold_ms` passed, without one).
fn locked(env: &str, gate: Option<&str>, hold_ms: u64) -> Value {
    json!({
        "template": {
            "name": "locked", "ref_name": "locked", "schema_version": 1,
            "inputs": {"env": {"type": "string"}},
            "locks": {"env": {"name": "env:${workflow.input.env}"}},
            "steps": [{
                "ref_name": "apply",
                "script": "locks/hold.py",
                "retries": 3,
                "input": {
                    "var": "ORCHESTRATOR_LOCK_ENV",
                    "resource": env,
                    "gate": gate,
                    "hold_ms": hold_ms,
                    "fence": "${locks.env.token}"
                }
            }]
        },
        "vars": {"env": env}
    })
}

async fn submit_to(service: &TestService, body: Value) -> String {
    let (status, created) = service.post("/workflows", body).await;
    assert_eq!(status, 202, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

/// Polls `GET /locks` until `ready` holds for the lock named `name`
/// (`null` when nobody holds or waits for it).
async fn wait_lock(service: &TestService, name: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, list) = service.get("/locks").await;
        assert_eq!(status, 200, "{list}");
        let lock = list["locks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
            .unwrap_or(Value::Null);
        if ready(&lock) {
            return lock;
        }
        assert!(
            Instant::now() < deadline,
            "lock {name} never got there: {list}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn holder_is(lock: &Value, workflow: &str) -> bool {
    lock["holders"]
        .as_array()
        .is_some_and(|h| h.len() == 1 && h[0]["workflow_id"] == workflow)
}

/// The log the hold script wrote for `resource`, as (event, token) pairs.
fn lock_log(state: &Path, resource: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(state.join(format!("locks-{resource}.log")))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let mut parts = line.split(' ');
            (
                parts.next().unwrap().to_owned(),
                parts.next().unwrap().to_owned(),
            )
        })
        .collect()
}

// Several threads: the test runs the CLI, a blocking child process, while
// the service it asks runs on the same runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_are_granted_in_order_with_growing_tokens_and_shown() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let state = service.state_dir();

    let a = submit_to(&service, locked("prod", Some("gate-a"), 0)).await;
    wait_lock(&service, "env:prod", |l| holder_is(l, &a)).await;
    let b = submit_to(&service, locked("prod", Some("gate-b"), 0)).await;
    let c = submit_to(&service, locked("prod", Some("gate-c"), 0)).await;
    // Another environment is another lock: it is granted at once.
    let dev = submit_to(&service, locked("dev", None, 0)).await;
    let lock = wait_lock(&service, "env:prod", |l| {
        l["waiters"].as_array().is_some_and(|w| w.len() == 2)
    })
    .await;
    assert_eq!(lock["holders"][0]["token"], 1, "{lock}");
    assert_eq!(lock["holders"][0]["step"], "apply", "{lock}");
    assert_eq!(lock["fencing"], 1, "{lock}");
    let waiting: Vec<&str> = lock["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["workflow_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        waiting,
        vec![b.as_str(), c.as_str()],
        "waiters in the order asked"
    );
    let dev_view = service.wait_workflow(&dev).await;
    assert_eq!(dev_view["status"], "completed", "{dev_view}");

    // A waiting step holds no worker and stays queued.
    let (_, b_view) = service.get(&format!("/workflows/{b}")).await;
    assert_eq!(b_view["tasks"][0]["status"], "queued", "{b_view}");

    // The CLI shows the same, through the typed client.
    let out = std::process::Command::new(BIN)
        .args(["--url", &service.base, "locks", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    let prod = shown["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "env:prod")
        .unwrap();
    assert_eq!(prod["holders"][0]["workflow_id"], a.as_str());
    let text = std::process::Command::new(BIN)
        .args(["--url", &service.base, "locks"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("env:prod") && text.contains("held    token 1"),
        "{text}"
    );

    for (gate, next) in [("gate-a", Some(&b)), ("gate-b", Some(&c)), ("gate-c", None)] {
        std::fs::write(state.join(gate), "").unwrap();
        if let Some(next) = next {
            wait_lock(&service, "env:prod", |l| holder_is(l, next)).await;
        }
    }
    for id in [&a, &b, &c] {
        let view = service.wait_workflow(id).await;
        assert_eq!(view["status"], "completed", "{view}");
    }
    // Released at the end: nobody holds or waits.
    wait_lock(&service, "env:prod", Value::is_null).await;

    let log = lock_log(&state, "prod");
    let expected: Vec<(String, String)> = ["1", "2", "3"]
        .iter()
        .flat_map(|t| {
            [
                ("enter".to_owned(), t.to_string()),
                ("exit".to_owned(), t.to_string()),
            ]
        })
        .collect();
    assert_eq!(log, expected, "one holder at a time, tokens in order");
    // The token reached the script's input too.
    let (_, b_view) = service.get(&format!("/workflows/{b}")).await;
    assert_eq!(b_view["outputs"]["apply"]["fencing"], "2", "{b_view}");
    assert_eq!(b_view["outputs"]["apply"]["fence"], "2", "{b_view}");
    service.stop().await;
}

#[tokio::test]
async fn an_http_step_sends_its_fencing_token() {
    let fake = Fake::start(
        Flavor::Awx,
        Plan::ending("successful", Duration::from_millis(100)),
    );
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.http_allow =
        orchestrator_http::Allowlist::parse([format!("127.0.0.1:{}", fake.port)]).unwrap();
    let service = TestService::start(settings).await;
    let base = &fake.base;
    let body = json!({
        "template": {
            "name": "fenced", "ref_name": "fenced", "schema_version": 1,
            "locks": {"awx-env": {"name": "awx:prod"}},
            "steps": [{
                "ref_name": "awx",
                "kind": "http",
                "http": {
                    "launch": {
                        "url": format!("{base}/api/v2/job_templates/7/launch/"),
                        "headers": {"X-Fencing-Token": "${locks.awx-env.token}"},
                        "body": {"extra_vars": {"fence": "${locks.awx-env.token}"}},
                        "expect": [201]
                    },
                    "job_id": "/job",
                    "poll": {
                        "url": format!("{base}/api/v2/jobs/${{job.id}}/"),
                        "interval": "100ms",
                        "status": "/status",
                        "status_map": {
                            "success": ["successful"],
                            "running": ["new", "pending", "waiting", "running"],
                            "failure": ["failed", "error", "canceled"]
                        }
                    }
                }
            }]
        }
    });
    for expected in ["1", "2"] {
        let id = submit_to(&service, body.clone()).await;
        let view = service.wait_workflow(&id).await;
        assert_eq!(view["status"], "completed", "{view}");
        let sent = fake.seen(|s| s.launches.last().unwrap().body.clone());
        assert_eq!(sent["extra_vars"]["fence"], expected, "{sent}");
    }
    service.stop().await;
}

#[tokio::test]
async fn bad_lock_declarations_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let service = TestService::start(fixture_settings(dir.path())).await;
    let with_lock = |lock: Value| {
        let mut body = locked("prod", None, 0);
        body["template"]["locks"]["env"] = lock;
        body
    };
    for (lock, names) in [
        (json!({"name": "x", "mode": "sometimes"}), "locks.env.mode"),
        (json!({"name": "x", "limit": 3}), "locks.env.limit"),
        (
            json!({"name": "x", "mode": "shared", "limit": 100000}),
            "locks.env.limit",
        ),
        (
            json!({"name": "x", "steps": ["nope"]}),
            "locks.env.steps[0]",
        ),
    ] {
        let (status, answer) = service.post("/workflows", with_lock(lock.clone())).await;
        assert!((400..500).contains(&status), "{lock}: {status} {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(names), "{lock}: {answer}");
    }
    // A name that resolves to something no lock may be called.
    let (status, answer) = service
        .post("/workflows", {
            let mut body = locked("prod", None, 0);
            body["vars"]["env"] = json!("two words");
            body
        })
        .await;
    assert!((400..500).contains(&status), "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("locks.env.name"),
        "{answer}"
    );
    service.stop().await;
}

/// Submits `n` workflows that each hold `env:<env>` for `hold_ms`.
fn submit_holders(url: &str, env: &str, n: usize, hold_ms: u64) -> Vec<String> {
    (0..n)
        .map(|_| {
            let created = submit(&format!("{url}/workflows"), locked(env, None, hold_ms));
            created["id"]
                .as_str()
                .unwrap_or_else(|| panic!("{created}"))
                .to_owned()
        })
        .collect()
}

/// What every drill checks of a hold log: no OVERLAP was seen, each
/// `enter` is left (`exit`) before the next one (a holder killed inside
/// leaves no `exit`, and its successor came only after it was gone: the
/// script itself checks the previous holder's process), and the tokens of
/// the entries only grow. A failure shows the whole log, with each line's
/// task: which task entered with which token says what went wrong.
fn check_hold_log(state: &Path, resource: &str) {
    let log = lock_log(state, resource);
    let raw =
        std::fs::read_to_string(state.join(format!("locks-{resource}.log"))).unwrap_or_default();
    assert!(!log.is_empty(), "nothing ever held the lock");
    assert!(
        log.iter().all(|(event, _)| event != "OVERLAP"),
        "overlapping holders:\n{raw}"
    );
    let entries: Vec<u64> = log
        .iter()
        .filter(|(event, _)| event == "enter")
        .map(|(_, token)| token.parse().unwrap())
        .collect();
    assert!(
        entries.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens went backwards: {entries:?}\n{raw}"
    );
}

fn wait_no_lock(daemon: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = daemon.cli_json(&["locks", "--json"]);
        if list["locks"].as_array().unwrap().is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "a lock was never let go: {list}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until some holder of `env:<env>` is inside (its `enter` logged).
fn wait_inside(state: &Path, env: &str, entries: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while lock_log(state, env)
        .iter()
        .filter(|(e, _)| e == "enter")
        .count()
        < entries
    {
        assert!(Instant::now() < deadline, "nobody entered");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One node on the filesystem store, killed with SIGKILL while a holder
/// is inside, twice: after each restart the dead life's hold is gone, the
/// work resumes, and no two holders were ever inside at once.
#[test]
fn kill_9_drill_on_one_node() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let state = crate::harness::script_state(&data);
    let mut ids = Vec::new();
    for round in 0..2 {
        let daemon = Daemon::start(&data, &["--lease-secs", "3"]);
        ids.extend(submit_holders(&daemon.url, "drill", 3, 300));
        wait_inside(&state, "drill", round + 1);
        daemon.signal("-KILL");
        assert!(!daemon.wait().success());
    }
    let daemon = Daemon::start(&data, &["--lease-secs", "3"]);
    let views = crate::faults::wait_for_workflows(&daemon, &ids);
    for view in &views {
        assert_eq!(view["status"], "completed", "{view}");
    }
    check_hold_log(&state, "drill");
    wait_no_lock(&daemon);
    daemon.signal("-TERM");
    assert!(daemon.wait().success());
}

/// Two nodes on one SurrealDB server, both running holders of one lock;
/// one is killed with SIGKILL while a holder is inside. The other goes on
/// once the dead node's lease ends: no overlap across the nodes, tokens
/// that only grow, and no lock left held.
#[cfg(feature = "surrealdb")]
#[test]
fn kill_9_drill_on_two_nodes_sharing_a_surrealdb_server() {
    use crate::faults::nodes::SharedStore;
    let cluster = SharedStore::new(&["--lease-secs", "3", "--workers", "2"]);
    let (dir, args) = (&cluster.dir, cluster.args());
    // Both nodes' scripts write to one state dir: one log, one `inside`.
    let shared_state = dir.path().join("shared-state");
    std::fs::create_dir_all(&shared_state).unwrap();
    let start = |name: &str| {
        let data = dir.path().join(name);
        std::fs::create_dir_all(&data).unwrap();
        std::os::unix::fs::symlink(&shared_state, crate::harness::script_state(&data)).unwrap();
        Daemon::start(&data, &args)
    };
    let a = start("a");
    let b = start("b");
    let mut ids = submit_holders(&a.url, "shared", 3, 300);
    ids.extend(submit_holders(&b.url, "shared", 3, 300));
    wait_inside(&shared_state, "shared", 2);
    a.signal("-KILL");
    assert!(!a.wait().success());
    let views = crate::faults::wait_for_workflows(&b, &ids);
    for view in &views {
        assert_eq!(view["status"], "completed", "{view}");
    }
    check_hold_log(&shared_state, "shared");
    wait_no_lock(&b);
}
