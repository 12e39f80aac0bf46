//! `NodeRunner`, the `testenv` step kind: the moves of an environment's
//! workflows. Its target says which (`testenv/nodes`, `testenv/install`,
//! `testenv/start`, `testenv/check`, `testenv/teardown`); its input
//! carries the environment's plan, so that every attempt, after a restart
//! too, knows every name it works on.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use orchestrator_executor::{
    Attempt, InputRefusal, Launcher, LogSink, Outcome, ScriptExecutor, StepRunner,
};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::catalog::Catalog;
use crate::model::{CheckPlan, EnvPlan, NodePlan};
use crate::provider::Provider;

/// The targets of the `testenv` kind.
pub const TARGETS: &[&str] = &[
    "testenv/nodes",
    "testenv/install",
    "testenv/start",
    "testenv/check",
    "testenv/teardown",
];

/// How long a started service may take to listen.
const START_WAIT: Duration = Duration::from_secs(30);
/// The most of one program's output kept in the log of a step, per line.
const MAX_LINE: usize = 8 * 1024;

/// A task's input.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StepInput {
    env: EnvPlan,
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    check: Option<CheckPlan>,
}

/// Runs the `testenv` steps. Cheap to clone.
#[derive(Clone)]
pub struct NodeRunner {
    provider: Arc<dyn Provider>,
    /// Resolves the provisioning scripts and their interpreters, as for
    /// the `script` kind, so that a node runs what production runs.
    scripts: ScriptExecutor,
    /// Where the nodes' private roots live (`<data dir>/testenv`).
    root: PathBuf,
    catalog: Arc<Catalog>,
    /// This service's tag: a step runs only a plan that carries it.
    tag: String,
}

impl NodeRunner {
    pub fn new(
        provider: Arc<dyn Provider>,
        scripts: ScriptExecutor,
        root: PathBuf,
        catalog: Arc<Catalog>,
        tag: String,
    ) -> NodeRunner {
        NodeRunner {
            provider,
            scripts,
            root,
            catalog,
            tag,
        }
    }

    /// The step's input, read and checked: a plan this service made.
    fn input(&self, input: &Value) -> Result<StepInput, String> {
        let input = StepInput::deserialize(input)
            .map_err(|e| format!("bad input of a testenv step: {e}"))?;
        input
            .env
            .verify(&self.catalog, &self.tag)
            .map_err(|e| e.to_string())?;
        Ok(input)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn provider(&self) -> &Arc<dyn Provider> {
        &self.provider
    }

    async fn say(log: &LogSink, line: impl Into<String>) {
        let mut line = line.into();
        line.push('\n');
        log.write(line.into_bytes()).await;
    }

    /// Runs a script of the scripts dir inside `node` with `input` on
    /// stdin, its output to the log; its result object, or why it failed.
    async fn run_script(
        &self,
        attempt: &Attempt<'_>,
        plan: &EnvPlan,
        node: &NodePlan,
        script: &str,
        input: &Value,
    ) -> Result<Value, Outcome> {
        let resolved = self
            .scripts
            .resolve(script)
            .map_err(|e| failed(e.to_string()))?;
        let (program, args) = match &resolved.launcher {
            Launcher::Interpreter(interpreter) => (
                interpreter.clone(),
                vec![resolved.path.to_string_lossy().into_owned()],
            ),
            Launcher::Direct => (resolved.path.clone(), vec![]),
        };
        Self::say(&attempt.log, format!("[{}] {script}", node.name)).await;
        let env = [
            (
                "ORCHESTRATOR_TASK_ID".to_owned(),
                attempt.task_id.to_string(),
            ),
            (
                "ORCHESTRATOR_WORKFLOW_ID".to_owned(),
                attempt.workflow_id.to_string(),
            ),
            (
                "ORCHESTRATOR_ATTEMPT".to_owned(),
                attempt.attempt.to_string(),
            ),
        ];
        let mut child = self
            .provider
            .spawn(plan, node, &self.root, &program, &args, &env)
            .await
            .map_err(|e| failed(format!("cannot start {script} in node {}: {e}", node.name)))?;
        if let Some(mut stdin) = child.stdin.take() {
            let body = input.to_string();
            // A script that does not read its input closes the pipe early;
            // that is its business. The end of the input is said (a
            // container engine's stream stays open until then).
            let _ = stdin.write_all(body.as_bytes()).await;
            let _ = stdin.shutdown().await;
        }
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let log = attempt.log.clone();
        let prefix = format!("[{}] ", node.name);
        let err_task = tokio::spawn({
            let (log, prefix) = (log.clone(), prefix.clone());
            async move {
                if let Some(stderr) = stderr {
                    let mut lines = BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        Self::say(&log, format!("{prefix}{}", cut(&line))).await;
                    }
                }
            }
        });
        let out_task = tokio::spawn(async move {
            let mut last = String::new();
            if let Some(stdout) = stdout {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    Self::say(&log, format!("{prefix}{}", cut(&line))).await;
                    if !line.trim().is_empty() {
                        last = cut(&line).to_owned();
                    }
                }
            }
            last
        });
        let ending = tokio::select! {
            status = child.wait() => Ok(status),
            () = attempt.cancel.cancelled() => Err(Outcome::Cancelled),
            () = tokio::time::sleep_until(attempt.deadline) => Err(Outcome::TimedOut {
                error: format!("{script} in node {} did not finish in {:?}", node.name, attempt.timeout),
            }),
        };
        if ending.is_err() {
            // The script and what it started.
            let _ = child.kill().await;
        }
        let status = ending?;
        let _ = err_task.await;
        let last = out_task.await.unwrap_or_default();
        match status {
            Ok(status) if status.success() => {
                Ok(serde_json::from_str(&last).unwrap_or_else(|_| json!({})))
            }
            Ok(status) => Err(Outcome::Failed {
                exit_code: status.code,
                error: format!("{script} failed in node {} ({status})", node.name),
            }),
            Err(e) => Err(failed(format!("{script} in node {}: {e}", node.name))),
        }
    }

    /// Starts each taskserv's service of `node` (stopping any left from an
    /// earlier attempt), and waits until each listens.
    async fn start(
        &self,
        attempt: &Attempt<'_>,
        plan: &EnvPlan,
        node: &NodePlan,
    ) -> Result<Value, Outcome> {
        let serve = self
            .scripts
            .resolve("testenv/serve.py")
            .map_err(|e| failed(e.to_string()))?;
        let python = match &serve.launcher {
            Launcher::Interpreter(interpreter) => interpreter.clone(),
            Launcher::Direct => PathBuf::from("python3"),
        };
        let run_dir = plan.names().dir(&self.root).join(&node.name).join("run");
        let mut started = Vec::new();
        for taskserv in &node.taskservs {
            let port = self
                .catalog
                .taskserv(taskserv)
                .map(|t| t.port)
                .ok_or_else(|| failed(format!("unknown taskserv `{taskserv}`")))?;
            let ready = run_dir.join(format!("{taskserv}.ready"));
            let ready_arg = ready.to_string_lossy().into_owned();
            // Left-overs are stopped, never adopted.
            self.provider
                .kill_matching(plan, node, &ready_arg)
                .await
                .map_err(|e| failed(e.to_string()))?;
            let _ = std::fs::remove_file(&ready);
            let log_path = run_dir.join(format!("{taskserv}.log"));
            let args = vec![
                serve.path.to_string_lossy().into_owned(),
                "--service".to_owned(),
                taskserv.clone(),
                "--port".to_owned(),
                port.to_string(),
                "--ready".to_owned(),
                ready_arg.clone(),
            ];
            let mut child = self
                .provider
                .spawn_logged(plan, node, &self.root, &python, &args, &log_path)
                .await
                .map_err(|e| {
                    failed(format!(
                        "cannot start {taskserv} in node {}: {e}",
                        node.name
                    ))
                })?;
            // Its end to the wait below; it runs until the node is torn
            // down.
            let (exit_tx, mut exit_rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let _ = exit_tx.send(child.wait().await);
            });
            let deadline = tokio::time::Instant::now() + START_WAIT;
            loop {
                if ready.exists() {
                    break;
                }
                if let Ok(status) = exit_rx.try_recv() {
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
                    return Err(failed(format!(
                        "{taskserv} in node {} exited ({status}) before listening on port {port}: {}",
                        node.name,
                        tail.lines().last().unwrap_or_default()
                    )));
                }
                if attempt.cancel.is_cancelled() {
                    return Err(Outcome::Cancelled);
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(failed(format!(
                        "{taskserv} in node {} did not listen on port {port} within {} s",
                        node.name,
                        START_WAIT.as_secs()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Self::say(
                &attempt.log,
                format!("[{}] {taskserv} listens on port {port}", node.name),
            )
            .await;
            started.push(json!({"taskserv": taskserv, "port": port}));
        }
        Ok(json!({"node": node.name, "started": started}))
    }

    async fn act(&self, attempt: &Attempt<'_>) -> Result<Value, Outcome> {
        let input = self.input(attempt.input).map_err(failed)?;
        let plan = &input.env;
        let node = |name: &Option<String>| -> Result<&NodePlan, Outcome> {
            let name = name.as_deref().unwrap_or_default();
            plan.node(name)
                .ok_or_else(|| failed(format!("no node `{name}` in environment {}", plan.id)))
        };
        match attempt.target {
            "testenv/nodes" => {
                self.provider
                    .health()
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                let missing = self.provider.missing_privileges();
                if !missing.is_empty() {
                    return Err(failed(format!(
                        "test environments need CAP_SYS_ADMIN and CAP_NET_ADMIN; this service lacks {}",
                        missing.join(", ")
                    )));
                }
                self.provider
                    .create(plan, &self.root)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                for node in &plan.nodes {
                    Self::say(
                        &attempt.log,
                        format!(
                            "node {} at {} (namespace {})",
                            node.name, node.address, node.netns
                        ),
                    )
                    .await;
                }
                Ok(json!({"nodes": plan.nodes}))
            }
            "testenv/install" => {
                let node = node(&input.node)?;
                // The production scripts, inside the node: the server, then
                // its taskservs in order, into the node's private root.
                let infra = format!("testenv-{}", plan.key);
                let server = self
                    .run_script(
                        attempt,
                        plan,
                        node,
                        "servers/create.nu",
                        &json!({"infra": infra, "server": node.name}),
                    )
                    .await?;
                let mut installed = Vec::new();
                for taskserv in &node.taskservs {
                    installed.push(
                        self.run_script(
                            attempt,
                            plan,
                            node,
                            "taskservs/install.nu",
                            &json!({"infra": infra, "server": node.name, "taskserv": taskserv}),
                        )
                        .await?,
                    );
                }
                Ok(json!({"server": server, "taskservs": installed}))
            }
            "testenv/start" => {
                let node = node(&input.node)?;
                self.start(attempt, plan, node).await
            }
            "testenv/check" => {
                let check = input
                    .check
                    .ok_or_else(|| failed("a check step needs `check`"))?;
                let node = node(&Some(check.node.clone()))?;
                let script = format!("taskservs/{}/check.nu", check.taskserv);
                self.run_script(
                    attempt,
                    plan,
                    node,
                    &script,
                    &json!({"taskserv": check.taskserv, "port": check.port, "targets": check.targets}),
                )
                .await
            }
            "testenv/teardown" => {
                let removed = self
                    .provider
                    .destroy(&plan.names(), &self.root)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                Self::say(
                    &attempt.log,
                    format!("environment {} torn down ({removed} namespaces, links and directories removed)", plan.id),
                )
                .await;
                Ok(json!({"removed": removed}))
            }
            other => Err(failed(format!("unknown testenv target `{other}`"))),
        }
    }
}

fn failed(error: impl Into<String>) -> Outcome {
    Outcome::Failed {
        exit_code: None,
        error: error.into(),
    }
}

fn cut(line: &str) -> &str {
    match line.char_indices().nth(MAX_LINE) {
        Some((at, _)) => &line[..at],
        None => line,
    }
}

#[async_trait]
impl StepRunner for NodeRunner {
    fn name(&self) -> &'static str {
        "testenv"
    }

    fn check(&self, target: &str) -> Result<(), String> {
        if TARGETS.contains(&target) {
            Ok(())
        } else {
            Err(format!(
                "`{target}` is not a testenv step (known: {})",
                TARGETS.join(", ")
            ))
        }
    }

    /// A testenv step's input is a whole plan, written by the service:
    /// one submitted by hand must be a plan this service could have made.
    fn check_input(&self, input: &Value) -> Result<(), InputRefusal> {
        self.input(input)
            .map(|_| ())
            .map_err(|message| InputRefusal {
                at: String::new(),
                message,
            })
    }

    async fn run(&self, attempt: Attempt<'_>) -> Outcome {
        match self.act(&attempt).await {
            Ok(output) => Outcome::Succeeded { output },
            Err(outcome) => outcome,
        }
    }

    fn stop_leftovers(&self, _task_id: &str) -> usize {
        // What a step leaves runs inside its environment's nodes: a retried
        // step stops it itself (`nodes` makes the nodes again, `start`
        // kills the services it replaces), and teardown removes the rest.
        0
    }
}
