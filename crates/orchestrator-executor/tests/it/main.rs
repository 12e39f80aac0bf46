//! The executor against real processes: bash and python scripts written to
//! a temporary scripts dir.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use orchestrator_executor::{
    Bubblewrap, ExecutorConfig, Job, LogSink, Outcome, Sandbox, ScriptExecutor,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

struct Fixture {
    dir: tempfile::TempDir,
    executor: ScriptExecutor,
}

fn fixture(scripts: &[(&str, &str)]) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let scripts_dir = dir.path().join("scripts");
    for (name, body) in scripts {
        let path = scripts_dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
    }
    std::fs::create_dir_all(&scripts_dir).unwrap();
    // What the service would hide: its own files, beside the scripts'.
    let service_dir = dir.path().join("service");
    std::fs::create_dir_all(&service_dir).unwrap();
    std::fs::write(service_dir.join("secret.key"), SERVICE_SECRET).unwrap();
    let state_dir = dir.path().join("data");
    std::fs::create_dir_all(&state_dir).unwrap();
    let executor = ScriptExecutor::new(ExecutorConfig {
        scripts_dir,
        work_dir: dir.path().join("work"),
        data_dir: state_dir,
        kill_grace: Duration::from_millis(500),
        interpreters: HashMap::new(),
        service_url: None,
        sandbox: Sandbox::Bubblewrap(sandbox().hide(&service_dir)),
    })
    .unwrap();
    Fixture { dir, executor }
}

/// A file only the service may read.
const SERVICE_SECRET: &str = "the-service-secret-0123456789";

/// The sandbox, as the service runs scripts by default (CI installs
/// `bwrap`: `.ci/run`).
fn sandbox() -> Bubblewrap {
    Bubblewrap::find(std::env::var_os("PATH").as_deref())
        .unwrap_or_else(|e| panic!("these tests run scripts in the sandbox: {e}"))
}

fn with_sandbox(fixture: &Fixture, sandbox: Sandbox) -> ScriptExecutor {
    let mut config = fixture.executor.config().clone();
    config.sandbox = sandbox;
    ScriptExecutor::new(config).unwrap()
}

/// The processes (host pids) whose environment says they belong to
/// `task_id`, as `kill_leftovers` finds them.
fn processes_of(task_id: &str) -> Vec<i32> {
    let needle = format!("ORCHESTRATOR_TASK_ID={task_id}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| pid_alive(*pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == needle.as_bytes()))
        })
        .collect()
}

static NO_CHECKPOINT: std::sync::LazyLock<serde_json::Map<String, Value>> =
    std::sync::LazyLock::new(serde_json::Map::new);

fn job<'a>(script: &'a str, input: &'a Value) -> Job<'a> {
    Job {
        script,
        input,
        task_id: "0190aaaa-0000-7000-8000-000000000001".into(),
        workflow_id: "0190aaaa-0000-7000-8000-000000000002".into(),
        attempt: 2,
        check_mode: true,
        timeout: Duration::from_secs(20),
        checkpoint: &NO_CHECKPOINT,
        token: None,
        redactor: Default::default(),
        holds_secrets: false,
        more_steps: true,
        party: None,
        lock_tokens: Vec::new(),
    }
}

async fn run(fixture: &Fixture, job: Job<'_>) -> (Outcome, String) {
    run_with(fixture, job, CancellationToken::new()).await
}

async fn run_with(fixture: &Fixture, job: Job<'_>, cancel: CancellationToken) -> (Outcome, String) {
    let (sink, mut rx) = LogSink::channel(16);
    // Stored as it comes, as the engine does: the sink is bounded.
    let collector = tokio::spawn(async move {
        let mut log = Vec::new();
        while let Some(chunk) = rx.recv().await {
            log.extend(chunk);
        }
        log
    });
    let outcome = fixture.executor.run(job, sink, cancel).await;
    let log = collector.await.unwrap();
    (outcome, String::from_utf8(log).unwrap())
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true)
}

#[tokio::test]
async fn input_env_and_result_follow_the_contract() {
    let f = fixture(&[(
        "echo.sh",
        r#"input=$(cat)
echo "progress: starting" >&2
echo "not json"
echo '{"early": true}'
printf '{"input":%s,"task":"%s","workflow":"%s","attempt":%s,"check":"%s","work":"%s","data":"%s"}\n' \
  "$input" "$ORCHESTRATOR_TASK_ID" "$ORCHESTRATOR_WORKFLOW_ID" "$ORCHESTRATOR_ATTEMPT" \
  "$ORCHESTRATOR_CHECK_MODE" "$ORCHESTRATOR_WORK_DIR" "$ORCHESTRATOR_DATA_DIR"
echo "trailing text"
"#,
    )]);
    let input = json!({"server": "web-01", "n": [1, 2]});
    let (outcome, log) = run(&f, job("echo.sh", &input)).await;
    let Outcome::Succeeded { output } = outcome else {
        panic!("{outcome:?}")
    };
    // An object input also carries the (here empty) checkpoint.
    let mut expected = input.clone();
    expected["checkpoint"] = json!({});
    assert_eq!(output["input"], expected);
    assert_eq!(output["task"], "0190aaaa-0000-7000-8000-000000000001");
    assert_eq!(output["workflow"], "0190aaaa-0000-7000-8000-000000000002");
    assert_eq!(output["attempt"], 2);
    assert_eq!(output["check"], "true");
    assert!(
        output["work"]
            .as_str()
            .unwrap()
            .ends_with("0190aaaa-0000-7000-8000-000000000001")
    );
    assert_eq!(
        output["data"],
        f.dir.path().join("data").display().to_string()
    );
    assert!(log.contains("progress: starting"));
    assert!(log.contains("not json"));
    assert!(log.contains("trailing text"));
}

#[tokio::test]
async fn the_result_file_wins_over_stdout() {
    let f = fixture(&[(
        "file.py",
        "import json, os, sys\nd = json.load(sys.stdin)\nprint('{\"from\": \"stdout\"}')\n\
         open(os.environ['ORCHESTRATOR_RESULT_FILE'], 'w').write(json.dumps({'from': 'file', 'x': d['x']}))\n",
    )]);
    let input = json!({"x": 42});
    let (outcome, _) = run(&f, job("file.py", &input)).await;
    assert_eq!(
        outcome,
        Outcome::Succeeded {
            output: json!({"from": "file", "x": 42})
        }
    );
}

#[tokio::test]
async fn a_script_without_a_result_succeeds_with_an_empty_object() {
    let f = fixture(&[("quiet.sh", "exit 0\n")]);
    let (outcome, _) = run(&f, job("quiet.sh", &Value::Null)).await;
    assert_eq!(outcome, Outcome::Succeeded { output: json!({}) });
}

#[tokio::test]
async fn a_bad_result_file_fails_the_attempt() {
    let f = fixture(&[("bad.sh", "echo '[1,2]' > \"$ORCHESTRATOR_RESULT_FILE\"\n")]);
    let (outcome, _) = run(&f, job("bad.sh", &Value::Null)).await;
    let Outcome::Failed {
        exit_code: Some(0),
        error,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert!(error.contains("JSON object"), "{error}");
}

#[tokio::test]
async fn failure_keeps_the_exit_code_and_the_stderr_tail() {
    let f = fixture(&[(
        "fail.sh",
        "echo 'first detail' >&2\necho 'disk quota exceeded' >&2\nexit 3\n",
    )]);
    let (outcome, log) = run(&f, job("fail.sh", &Value::Null)).await;
    let Outcome::Failed { exit_code, error } = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(exit_code, Some(3));
    assert!(error.contains("code 3"), "{error}");
    assert!(error.contains("disk quota exceeded"), "{error}");
    assert!(log.contains("first detail"));
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let f = fixture(&[(
        "hang.sh",
        "sleep 300 &\necho \"$!\" > \"$ORCHESTRATOR_WORK_DIR/child.pid\"\ntrap '' TERM\nwhile true; do sleep 1; done\n",
    )]);
    for sandboxed in [true, false] {
        let executor = if sandboxed {
            f.executor.clone()
        } else {
            with_sandbox(&f, Sandbox::None)
        };
        let mut j = job("hang.sh", &Value::Null);
        // Its own task id: other tests run scripts at the same time.
        j.task_id = format!("0190aaaa-0000-7000-8000-00000000010{}", u8::from(sandboxed));
        let task_id = j.task_id.clone();
        j.timeout = Duration::from_millis(700);
        let (sink, _rx) = LogSink::channel(1024);
        let outcome = executor.run(j, sink, CancellationToken::new()).await;
        let Outcome::TimedOut { error } = outcome else {
            panic!("{outcome:?}")
        };
        assert!(error.contains("timed out"), "{error}");
        // The child wrote its pid (in the sandbox, as its own PID namespace
        // numbers it): it was there.
        let pid_file = executor.work_dir_of(&task_id).join("child.pid");
        assert!(std::fs::read_to_string(pid_file).is_ok_and(|p| !p.trim().is_empty()));
        // The script ignored SIGTERM, so this also proves the SIGKILL
        // follow-up: nothing of the task is left.
        let left = processes_of(&task_id);
        assert!(left.is_empty(), "sandboxed {sandboxed}: {left:?} survived");
    }
}

/// In the sandbox, SIGTERM still reaches the script first, and it gets
/// the kill grace to finish: `bwrap` itself is spared, or it would take
/// the sandbox down with SIGKILL at once.
#[tokio::test]
async fn a_sandboxed_script_gets_sigterm_and_its_grace() {
    let f = fixture(&[(
        "graceful.sh",
        "trap 'sleep 0.2; echo cleaned up; exit 0' TERM
echo started
sleep 300 &
wait
",
    )]);
    let cancel = CancellationToken::new();
    let (sink, mut rx) = LogSink::channel(64);
    let trigger = cancel.clone();
    let watcher = tokio::spawn(async move {
        let mut log = Vec::new();
        while let Some(chunk) = rx.recv().await {
            if String::from_utf8_lossy(&chunk).contains("started") {
                trigger.cancel();
            }
            log.extend(chunk);
        }
        String::from_utf8(log).unwrap()
    });
    let mut j = job("graceful.sh", &Value::Null);
    j.task_id = "0190aaaa-0000-7000-8000-000000000201".into();
    let outcome = f.executor.run(j, sink, cancel).await;
    assert_eq!(outcome, Outcome::Cancelled);
    let log = watcher.await.unwrap();
    assert!(log.contains("cleaned up"), "{log}");
    assert!(processes_of("0190aaaa-0000-7000-8000-000000000201").is_empty());
}

/// What a sandboxed script can reach: its work dir and the state dir
/// (read-write), the scripts dir (read-only); not what the service
/// hides, not another process's environment, no capability.
#[tokio::test]
async fn a_sandboxed_script_sees_only_its_own() {
    let f = fixture(&[(
        "look.py",
        r#"import glob, json, os, sys
service = json.load(sys.stdin)["service_dir"]
def attempt(f):
    try:
        return f()
    except OSError as e:
        return "refused: " + type(e).__name__
status = open("/proc/self/status").read().splitlines()
caps = {l.split(":")[0]: l.split()[1] for l in status if l.startswith(("CapEff", "CapPrm", "CapAmb"))}
environs = []
for path in glob.glob("/proc/[0-9]*/environ"):
    environs.append(attempt(lambda: open(path, "rb").read().decode(errors="replace")))
def write(path):
    with open(path, "w") as f:
        f.write("x")
    return "ok"
print(json.dumps({
    "secret": attempt(lambda: open(os.path.join(service, "secret.key")).read()),
    "listing": attempt(lambda: os.listdir(service)),
    "caps": caps,
    "environs": environs,
    "state": attempt(lambda: write(os.path.join(os.environ["ORCHESTRATOR_DATA_DIR"], "kept"))),
    "work": attempt(lambda: write(os.path.join(os.environ["ORCHESTRATOR_WORK_DIR"], "kept"))),
    "scripts": attempt(lambda: write(os.path.join(os.environ["ORCHESTRATOR_SCRIPTS_DIR"], "new"))),
}))
"#,
    )]);
    let service_dir = f.dir.path().join("service");
    let input = json!({"service_dir": service_dir});
    let mut look = job("look.py", &input);
    look.task_id = "0190aaaa-0000-7000-8000-000000000301".into();
    let (outcome, log) = run(&f, look).await;
    let Outcome::Succeeded { output } = outcome else {
        panic!("{outcome:?}: {log}")
    };
    assert_eq!(output["secret"], "refused: FileNotFoundError", "{output}");
    // Hidden: absent (under the private /tmp, as here) or empty.
    assert!(
        [json!([]), json!("refused: FileNotFoundError")].contains(&output["listing"]),
        "{output}"
    );
    assert_eq!(
        output["caps"],
        json!({"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapAmb": "0000000000000000"})
    );
    assert_eq!(output["state"], "ok");
    assert_eq!(output["work"], "ok");
    assert_eq!(output["scripts"], "refused: OSError", "{output}");
    // Its own PID namespace: only the sandbox's init and the script.
    assert_eq!(output["environs"].as_array().unwrap().len(), 2, "{output}");
    assert!(!log.contains(SERVICE_SECRET));
    assert!(f.dir.path().join("data/kept").exists());
}

#[tokio::test]
async fn cancel_stops_a_running_script() {
    let f = fixture(&[("long.sh", "echo started\nsleep 300\n")]);
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        trigger.cancel();
    });
    let started = std::time::Instant::now();
    let (outcome, log) = run_with(&f, job("long.sh", &Value::Null), cancel).await;
    assert_eq!(outcome, Outcome::Cancelled);
    assert!(log.contains("started"));
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test]
async fn a_missing_interpreter_is_a_failed_attempt_naming_it() {
    let mut f = fixture(&[("x.nu", "")]);
    let mut config = f.executor.config().clone();
    config
        .interpreters
        .insert("nu".into(), "/nonexistent/nu".into());
    f.executor = ScriptExecutor::new(config).unwrap();
    let (outcome, _) = run(&f, job("x.nu", &Value::Null)).await;
    let Outcome::Failed {
        exit_code: None,
        error,
    } = outcome
    else {
        panic!("{outcome:?}")
    };
    assert!(
        error.contains("/nonexistent/nu") && error.contains("x.nu"),
        "{error}"
    );
}

#[tokio::test]
async fn input_never_goes_through_a_shell() {
    let f = fixture(&[(
        "echo.py",
        "import json,sys\nprint(json.dumps({'got': json.load(sys.stdin)}))\n",
    )]);
    let marker = f.dir.path().join("pwned");
    let input = json!({"name": format!("$(touch {0}); `touch {0}`", marker.display())});
    let (outcome, _) = run(&f, job("echo.py", &input)).await;
    let mut input = input;
    input["checkpoint"] = json!({});
    assert_eq!(
        outcome,
        Outcome::Succeeded {
            output: json!({"got": input})
        }
    );
    assert!(!marker.exists());
}

#[tokio::test]
async fn the_checkpoint_reaches_the_next_attempt_in_input_and_env() {
    let f = fixture(&[(
        "cp.py",
        "import json, os, sys\nd = json.load(sys.stdin)\n\
         print(json.dumps({'input': d['checkpoint'], 'env': json.loads(os.environ['ORCHESTRATOR_CHECKPOINT'])}))\n",
    )]);
    let mut saved = serde_json::Map::new();
    saved.insert("job_id".into(), json!(42));
    let input = json!({"server": "a"});
    let mut j = job("cp.py", &input);
    j.checkpoint = &saved;
    let (outcome, _) = run(&f, j).await;
    assert_eq!(
        outcome,
        Outcome::Succeeded {
            output: json!({"input": {"job_id": 42}, "env": {"job_id": 42}})
        }
    );
    // A non-object input is passed unchanged; the env still has it.
    let list = json!([1, 2]);
    let mut j = job("cp.py", &list);
    j.checkpoint = &saved;
    let (outcome, _) = run(&f, j).await;
    assert!(
        matches!(outcome, Outcome::Failed { .. }),
        "a list has no `checkpoint` key: {outcome:?}"
    );
}

/// Output is bounded whatever the script does: a line longer than a piece
/// is logged in pieces with a notice, the log stops at its limit with one
/// line saying so, and the script is neither blocked nor killed by it.
#[tokio::test]
async fn long_lines_are_split_and_the_log_stops_at_its_limit() {
    // 150 KB without a newline, then 400 lines of 1 KB, then the result.
    let mut fixture = fixture(&[(
        "loud.sh",
        "head -c 150000 /dev/zero | tr '\\0' a\necho\nfor i in $(seq 400); do head -c 1000 /dev/zero | tr '\\0' b; echo; done\necho '{\"done\": true}'\n",
    )]);
    fixture.executor = fixture.executor.clone().with_max_log_bytes(200_000);
    let (outcome, log) = run(&fixture, job("loud.sh", &json!({}))).await;
    assert_eq!(
        outcome,
        Outcome::Succeeded {
            output: json!({"done": true})
        },
        "the result after the cap is still read"
    );
    let lines: Vec<&str> = log.lines().collect();
    let first = lines[0];
    assert_eq!(first.len(), 64 * 1024, "a piece of the long line");
    assert!(lines[1].contains("was split"), "{}", lines[1]);
    assert_eq!(
        log.matches("was split").count(),
        1,
        "one notice per long line"
    );
    assert!(
        log.len() <= 200_000 + 200,
        "the log holds {} bytes",
        log.len()
    );
    assert!(
        log.trim_end()
            .ends_with("the rest of its output is dropped"),
        "{}",
        &log[log.len().saturating_sub(200)..]
    );
    assert!(!log.contains("done"), "the result line came after the cap");
}
