//! The built-in provisioning workflows: servers, taskservs and clusters.
//!
//! Each request is checked field by field, then planned as tasks with
//! dependencies that the engine runs: servers in parallel; each server's
//! taskservs in the order given (later ones may need earlier ones, as
//! kubernetes needs containerd); a cluster's join step after everything.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::{Error, Result};
use orchestrator_core::Priority;

pub const SERVER_CREATE_SCRIPT: &str = "servers/create.nu";
pub const TASKSERV_INSTALL_SCRIPT: &str = "taskservs/install.nu";
pub const CLUSTER_CREATE_SCRIPT: &str = "cluster/create.nu";

/// Options shared by every workflow submission.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunOptions {
    #[serde(default)]
    pub priority: Priority,
    /// Attempts per task; the service default when absent.
    pub max_attempts: Option<u32>,
    /// Per-attempt timeout in seconds; the service default when absent.
    pub timeout_secs: Option<u64>,
    /// Dry run: scripts are told to change nothing.
    #[serde(default)]
    pub check_mode: bool,
    /// Honoured by the API: answer only when the workflow has finished.
    #[serde(default)]
    pub wait: bool,
    /// Honoured by the API: the most seconds `wait` may block.
    pub wait_timeout_secs: Option<u64>,
}

/// `POST /workflows/servers/create`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServersCreate {
    pub infra: String,
    pub settings: Option<String>,
    pub servers: Vec<String>,
    #[serde(default)]
    pub priority: Priority,
    pub max_attempts: Option<u32>,
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub check_mode: bool,
    #[serde(default)]
    pub wait: bool,
    pub wait_timeout_secs: Option<u64>,
}

/// `POST /workflows/taskserv/create`: every taskserv on every server.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskservCreate {
    pub infra: String,
    pub settings: Option<String>,
    pub servers: Vec<String>,
    pub taskservs: Vec<String>,
    #[serde(default)]
    pub priority: Priority,
    pub max_attempts: Option<u32>,
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub check_mode: bool,
    #[serde(default)]
    pub wait: bool,
    pub wait_timeout_secs: Option<u64>,
}

/// `POST /workflows/cluster/create`: servers, then taskservs, then the join.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterCreate {
    pub infra: String,
    pub settings: Option<String>,
    pub cluster: String,
    pub servers: Vec<String>,
    #[serde(default)]
    pub taskservs: Vec<String>,
    #[serde(default)]
    pub priority: Priority,
    pub max_attempts: Option<u32>,
    pub timeout_secs: Option<u64>,
    #[serde(default)]
    pub check_mode: bool,
    #[serde(default)]
    pub wait: bool,
    pub wait_timeout_secs: Option<u64>,
}

/// A task to create, with dependencies as indices of earlier planned tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTask {
    pub name: String,
    pub script: String,
    pub input: Value,
    pub depends_on: Vec<usize>,
}

/// A workflow ready for [`crate::Engine::submit`].
#[derive(Debug, Clone)]
pub struct WorkflowPlan {
    pub kind: String,
    pub name: String,
    /// The request as received, kept with the workflow.
    pub request: Value,
    pub options: RunOptions,
    pub tasks: Vec<PlannedTask>,
}

/// Names of infras, servers, taskservs and clusters become directory names
/// in scripts, so they are held to a safe, portable alphabet.
fn check_name(field: &str, value: &str) -> Result<()> {
    let valid = !value.is_empty()
        && value.len() <= 63
        && value.as_bytes()[0].is_ascii_alphanumeric()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(Error::validation(
            field,
            format!(
                "`{value}` is not a valid name (1-63 letters, digits, `.`, `_` or `-`, starting with a letter or digit)"
            ),
        ))
    }
}

fn check_names(field: &str, values: &[String], allow_empty: bool) -> Result<()> {
    if values.is_empty() && !allow_empty {
        return Err(Error::validation(field, "must list at least one name"));
    }
    for (i, value) in values.iter().enumerate() {
        check_name(&format!("{field}[{i}]"), value)?;
        if values[..i].contains(value) {
            return Err(Error::validation(
                format!("{field}[{i}]"),
                format!("`{value}` is listed twice"),
            ));
        }
    }
    Ok(())
}

fn check_options(options: &RunOptions) -> Result<()> {
    if options.max_attempts == Some(0) {
        return Err(Error::validation("max_attempts", "must be at least 1"));
    }
    if let Some(max) = options.max_attempts.filter(|&n| n > 100) {
        return Err(Error::validation(
            "max_attempts",
            format!("{max} is more than the limit of 100"),
        ));
    }
    if options.timeout_secs == Some(0) {
        return Err(Error::validation("timeout_secs", "must be at least 1"));
    }
    Ok(())
}

/// The input common to every script of a workflow.
fn base_input(infra: &str, settings: &Option<String>, check_mode: bool) -> Map<String, Value> {
    let mut input = Map::new();
    input.insert("infra".into(), json!(infra));
    if let Some(settings) = settings {
        input.insert("settings".into(), json!(settings));
    }
    input.insert("check_mode".into(), json!(check_mode));
    input
}

fn with(mut base: Map<String, Value>, extra: Value) -> Value {
    if let Value::Object(extra) = extra {
        base.extend(extra);
    }
    Value::Object(base)
}

/// One create task per server, plus each server's taskserv chain.
fn plan_servers_and_taskservs(
    infra: &str,
    settings: &Option<String>,
    check_mode: bool,
    servers: &[String],
    taskservs: &[String],
    create_servers: bool,
) -> (Vec<PlannedTask>, Vec<usize>) {
    let base = base_input(infra, settings, check_mode);
    let mut tasks = Vec::new();
    let mut chain_ends = Vec::new();
    for server in servers {
        let mut previous = None;
        if create_servers {
            tasks.push(PlannedTask {
                name: format!("create server {server}"),
                script: SERVER_CREATE_SCRIPT.into(),
                input: with(base.clone(), json!({"server": server})),
                depends_on: vec![],
            });
            previous = Some(tasks.len() - 1);
        }
        for taskserv in taskservs {
            tasks.push(PlannedTask {
                name: format!("install {taskserv} on {server}"),
                script: TASKSERV_INSTALL_SCRIPT.into(),
                input: with(
                    base.clone(),
                    json!({"server": server, "taskserv": taskserv}),
                ),
                depends_on: previous.into_iter().collect(),
            });
            previous = Some(tasks.len() - 1);
        }
        chain_ends.extend(previous);
    }
    (tasks, chain_ends)
}

impl ServersCreate {
    pub fn plan(self) -> Result<WorkflowPlan> {
        check_name("infra", &self.infra)?;
        check_names("servers", &self.servers, false)?;
        let options = RunOptions {
            priority: self.priority,
            max_attempts: self.max_attempts,
            timeout_secs: self.timeout_secs,
            check_mode: self.check_mode,
            wait: self.wait,
            wait_timeout_secs: self.wait_timeout_secs,
        };
        check_options(&options)?;
        let (tasks, _) = plan_servers_and_taskservs(
            &self.infra,
            &self.settings,
            self.check_mode,
            &self.servers,
            &[],
            true,
        );
        Ok(WorkflowPlan {
            kind: "servers/create".into(),
            name: format!("create {} server(s) in {}", self.servers.len(), self.infra),
            request: request_json(
                &self.infra,
                &self.settings,
                json!({"servers": self.servers}),
            ),
            options,
            tasks,
        })
    }
}

impl TaskservCreate {
    pub fn plan(self) -> Result<WorkflowPlan> {
        check_name("infra", &self.infra)?;
        check_names("servers", &self.servers, false)?;
        check_names("taskservs", &self.taskservs, false)?;
        let options = RunOptions {
            priority: self.priority,
            max_attempts: self.max_attempts,
            timeout_secs: self.timeout_secs,
            check_mode: self.check_mode,
            wait: self.wait,
            wait_timeout_secs: self.wait_timeout_secs,
        };
        check_options(&options)?;
        let (tasks, _) = plan_servers_and_taskservs(
            &self.infra,
            &self.settings,
            self.check_mode,
            &self.servers,
            &self.taskservs,
            false,
        );
        Ok(WorkflowPlan {
            kind: "taskserv/create".into(),
            name: format!(
                "install {} on {} server(s) in {}",
                self.taskservs.join(", "),
                self.servers.len(),
                self.infra
            ),
            request: request_json(
                &self.infra,
                &self.settings,
                json!({"servers": self.servers, "taskservs": self.taskservs}),
            ),
            options,
            tasks,
        })
    }
}

impl ClusterCreate {
    pub fn plan(self) -> Result<WorkflowPlan> {
        check_name("infra", &self.infra)?;
        check_name("cluster", &self.cluster)?;
        check_names("servers", &self.servers, false)?;
        check_names("taskservs", &self.taskservs, true)?;
        let options = RunOptions {
            priority: self.priority,
            max_attempts: self.max_attempts,
            timeout_secs: self.timeout_secs,
            check_mode: self.check_mode,
            wait: self.wait,
            wait_timeout_secs: self.wait_timeout_secs,
        };
        check_options(&options)?;
        let (mut tasks, chain_ends) = plan_servers_and_taskservs(
            &self.infra,
            &self.settings,
            self.check_mode,
            &self.servers,
            &self.taskservs,
            true,
        );
        tasks.push(PlannedTask {
            name: format!("join cluster {}", self.cluster),
            script: CLUSTER_CREATE_SCRIPT.into(),
            input: with(
                base_input(&self.infra, &self.settings, self.check_mode),
                json!({"cluster": self.cluster, "servers": self.servers, "taskservs": self.taskservs}),
            ),
            depends_on: chain_ends,
        });
        Ok(WorkflowPlan {
            kind: "cluster/create".into(),
            name: format!("create cluster {} in {}", self.cluster, self.infra),
            request: request_json(
                &self.infra,
                &self.settings,
                json!({"cluster": self.cluster, "servers": self.servers, "taskservs": self.taskservs}),
            ),
            options,
            tasks,
        })
    }
}

fn request_json(infra: &str, settings: &Option<String>, extra: Value) -> Value {
    let mut base = Map::new();
    base.insert("infra".into(), json!(infra));
    if let Some(settings) = settings {
        base.insert("settings".into(), json!(settings));
    }
    with(base, extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(names: &[&str]) -> ServersCreate {
        serde_json::from_value(json!({"infra": "prod", "servers": names})).unwrap()
    }

    #[test]
    fn servers_run_in_parallel() {
        let plan = servers(&["web-01", "web-02"]).plan().unwrap();
        assert_eq!(plan.tasks.len(), 2);
        assert!(plan.tasks.iter().all(|t| t.depends_on.is_empty()));
        assert_eq!(plan.tasks[1].input["server"], "web-02");
        assert_eq!(plan.tasks[1].input["infra"], "prod");
    }

    #[test]
    fn cluster_orders_servers_then_taskservs_then_join() {
        let request: ClusterCreate = serde_json::from_value(json!({
            "infra": "prod", "cluster": "k8s", "servers": ["cp-01", "wk-01"],
            "taskservs": ["containerd", "kubernetes"]
        }))
        .unwrap();
        let plan = request.plan().unwrap();
        let names: Vec<_> = plan.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "create server cp-01",
                "install containerd on cp-01",
                "install kubernetes on cp-01",
                "create server wk-01",
                "install containerd on wk-01",
                "install kubernetes on wk-01",
                "join cluster k8s"
            ]
        );
        assert_eq!(plan.tasks[1].depends_on, vec![0]);
        assert_eq!(plan.tasks[2].depends_on, vec![1]);
        assert_eq!(plan.tasks[4].depends_on, vec![3]);
        assert_eq!(plan.tasks[6].depends_on, vec![2, 5]);
    }

    #[test]
    fn bad_names_are_refused_naming_the_field() {
        let cases = [
            (json!({"infra": "prod", "servers": []}), "servers"),
            (json!({"infra": "", "servers": ["a"]}), "infra"),
            (
                json!({"infra": "prod", "servers": ["ok", "../etc"]}),
                "servers[1]",
            ),
            (
                json!({"infra": "prod", "servers": ["a", "a"]}),
                "servers[1]",
            ),
            (
                json!({"infra": "prod", "servers": ["a"], "max_attempts": 0}),
                "max_attempts",
            ),
            (
                json!({"infra": "prod", "servers": ["a"], "timeout_secs": 0}),
                "timeout_secs",
            ),
        ];
        for (body, field) in cases {
            let request: ServersCreate = serde_json::from_value(body.clone()).unwrap();
            match request.plan() {
                Err(Error::Validation { field: f, .. }) => assert_eq!(f, field, "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
    }
}
