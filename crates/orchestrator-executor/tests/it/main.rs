//! The executor against real processes: bash and python scripts written to
//! a temporary scripts dir.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use orchestrator_executor::{ExecutorConfig, Job, LogSink, Outcome, ScriptExecutor};
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
    let executor = ScriptExecutor::new(ExecutorConfig {
        scripts_dir,
        work_dir: dir.path().join("work"),
        data_dir: dir.path().join("data"),
        kill_grace: Duration::from_millis(500),
        interpreters: HashMap::new(),
        service_url: None,
    })
    .unwrap();
    Fixture { dir, executor }
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
    let mut j = job("hang.sh", &Value::Null);
    j.timeout = Duration::from_millis(700);
    let (outcome, _) = run(&f, j).await;
    let Outcome::TimedOut { error } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(error.contains("timed out"), "{error}");
    let pid_file = f
        .executor
        .work_dir_of("0190aaaa-0000-7000-8000-000000000001")
        .join("child.pid");
    let pid: i32 = std::fs::read_to_string(pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The script ignored SIGTERM, so this also proves the SIGKILL follow-up.
    assert!(!pid_alive(pid), "background child {pid} survived");
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
