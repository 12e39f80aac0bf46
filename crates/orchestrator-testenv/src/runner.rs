//! `NodeRunner`, the `testenv` step kind: the moves of an environment's
//! workflows. Its target says which (`testenv/nodes`, `testenv/install`,
//! `testenv/start`, `testenv/check`, `testenv/teardown`); its input
//! carries the environment's plan, so that every attempt, after a restart
//! too, knows every name it works on.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
        // What the node's limits stopped before this script: what they
        // stop while it runs is the reason it fails, if it does.
        let limits_before = self.provider.limit_events(plan, node).await;
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
        let limit_hit = self
            .provider
            .limit_events(plan, node)
            .await
            .since(limits_before)
            .describe(&node.name, &node.limits);
        let status = ending.map_err(|outcome| with_reason(outcome, limit_hit.as_deref()))?;
        let _ = err_task.await;
        let last = out_task.await.unwrap_or_default();
        match status {
            Ok(status) if status.success() => {
                Ok(serde_json::from_str(&last).unwrap_or_else(|_| json!({})))
            }
            Ok(status) => Err(with_reason(
                Outcome::Failed {
                    exit_code: status.code,
                    error: format!("{script} failed in node {} ({status})", node.name),
                },
                limit_hit.as_deref(),
            )),
            Err(e) => Err(failed(format!("{script} in node {}: {e}", node.name))),
        }
    }

    /// Starts each taskserv of `node` with its start script, inside the
    /// node (`taskservs/<name>/start.py`: it stops what an earlier attempt
    /// left, starts the daemon detached and waits until it answers by its
    /// own protocol); each script's result names the version it runs.
    async fn start(
        &self,
        attempt: &Attempt<'_>,
        plan: &EnvPlan,
        node: &NodePlan,
    ) -> Result<Value, Outcome> {
        let mut started = Vec::new();
        for taskserv in &node.taskservs {
            let (Some(info), Some(script)) = (
                self.catalog.taskserv(taskserv),
                self.catalog.start_script(taskserv),
            ) else {
                return Err(failed(format!("unknown taskserv `{taskserv}`")));
            };
            let input = start_input(plan, node, taskserv, info.port);
            let output = self.run_script(attempt, plan, node, script, &input).await?;
            match output.get("version").and_then(Value::as_str) {
                Some(version) if output.get("taskserv") == Some(&json!(taskserv)) => {
                    Self::say(
                        &attempt.log,
                        format!(
                            "[{}] {taskserv} {version} started on port {}",
                            node.name, info.port
                        ),
                    )
                    .await;
                }
                _ => {
                    return Err(failed(format!(
                        "{script} in node {} printed no {{\"taskserv\": \"{taskserv}\", \"version\"}} \
                         as its last line: {output}",
                        node.name
                    )));
                }
            }
            started.push(output);
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

/// What a start script reads on stdin (see `scripts/lib/taskserv_start.py`):
/// the node, its address and subnet, the taskserv's port, the nodes that
/// run the same taskserv (an etcd member's cluster), and its data dir,
/// relative to the node's `ORCHESTRATOR_DATA_DIR`.
fn start_input(plan: &EnvPlan, node: &NodePlan, taskserv: &str, port: u16) -> Value {
    let peers: Vec<Value> = plan
        .nodes
        .iter()
        .filter(|n| n.taskservs.iter().any(|t| t == taskserv))
        .map(|n| json!({"name": n.name, "address": n.address}))
        .collect();
    json!({
        "env": plan.id,
        "taskserv": taskserv,
        "node": node.name,
        "address": node.address,
        "subnet": format!("{}.0/24", plan.subnet),
        "port": port,
        "peers": peers,
        "data_dir": format!("taskservs/{taskserv}"),
    })
}

fn failed(error: impl Into<String>) -> Outcome {
    Outcome::Failed {
        exit_code: None,
        error: error.into(),
    }
}

/// A failed or timed-out step's error, with the limit the node hit
/// while it ran (the reason, more than the exit status).
fn with_reason(outcome: Outcome, limit_hit: Option<&str>) -> Outcome {
    let Some(reason) = limit_hit else {
        return outcome;
    };
    match outcome {
        Outcome::Failed { exit_code, error } => Outcome::Failed {
            exit_code,
            error: format!("{error}: {reason}"),
        },
        Outcome::TimedOut { error } => Outcome::TimedOut {
            error: format!("{error}: {reason}"),
        },
        other => other,
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::model::CreateRequest;

    #[test]
    fn a_start_script_learns_its_node_and_the_peers_of_its_taskserv() {
        let catalog = Catalog::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts"),
            None,
        )
        .unwrap();
        let request: CreateRequest = serde_json::from_value(json!({
            "type": "cluster",
            "topology": {"name": "mixed", "nodes": [
                {"name": "a", "taskservs": ["etcd", "redis"]},
                {"name": "b", "taskservs": ["redis"]},
                {"name": "c", "taskservs": ["etcd"]},
            ]},
        }))
        .unwrap();
        let plan = EnvPlan::new(
            &request,
            &catalog,
            uuid::Uuid::now_v7(),
            "abcd",
            chrono::Utc::now(),
        )
        .unwrap();
        let input = start_input(&plan, &plan.nodes[2], "etcd", 2379);
        assert_eq!(
            input,
            json!({
                "env": plan.id,
                "taskserv": "etcd",
                "node": "c",
                "address": format!("{}.12", plan.subnet),
                "subnet": format!("{}.0/24", plan.subnet),
                "port": 2379,
                // The nodes that run etcd, in the plan's order: b does not.
                "peers": [
                    {"name": "a", "address": format!("{}.10", plan.subnet)},
                    {"name": "c", "address": format!("{}.12", plan.subnet)},
                ],
                "data_dir": "taskservs/etcd",
            })
        );
    }
}
