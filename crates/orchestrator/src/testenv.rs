//! `orchestrator test …`: test environments through the service's
//! `/test/environments` and `/test/topologies` routes.

use anyhow::{Context, bail};
use orchestrator_api::client::{Client, EnvView};
use orchestrator_testenv::service::{EnvStatus, RunView};
use serde_json::{Map, Value, json};

use crate::cli::{
    ClientArgs, TestCommand, TestEnvCommand, TestEnvCreateArgs, TestQuickArgs, TopologyCommand,
};
use crate::client::{connect, print_json, print_table, shown};

pub async fn run(client: &ClientArgs, command: TestCommand) -> anyhow::Result<()> {
    let api = connect(client)?;
    match command {
        TestCommand::Env(command) => env(&api, command).await,
        TestCommand::Topology(command) => topology(&api, command).await,
        TestCommand::Quick(args) => quick(&api, args).await,
    }
}

async fn env(api: &Client, command: TestEnvCommand) -> anyhow::Result<()> {
    match command {
        TestEnvCommand::Create(args) => {
            let json = args.json;
            let body = create_body(args)?;
            print_env(&api.create_environment(&body).await?, json)
        }
        TestEnvCommand::List(args) => {
            let list = api.list_environments().await?;
            if args.json {
                return print_json(&list);
            }
            let rows: Vec<[String; 6]> = list
                .environments
                .iter()
                .map(|e| {
                    [
                        e.id.clone(),
                        e.name.clone(),
                        shown(&e.env_type),
                        shown(&e.status),
                        e.nodes.len().to_string(),
                        shown(&e.expires_at),
                    ]
                })
                .collect();
            print_table(["ID", "NAME", "TYPE", "STATUS", "NODES", "EXPIRES"], &rows);
            Ok(())
        }
        TestEnvCommand::Show(args) => print_env(&api.environment(&args.id).await?, args.json),
        TestEnvCommand::Run(args) => {
            let env = api.run_environment(&args.id, true).await?;
            if args.json {
                print_json(&env)?;
            } else {
                print_checks(env.last_run.as_ref());
            }
            all_passed(&env)
        }
        TestEnvCommand::Logs(args) => {
            let logs = api.environment_logs(&args.id).await?;
            if args.json {
                return print_json(&logs);
            }
            for entry in &logs.entries {
                println!(
                    "== {} / {} [{}]{}",
                    entry.workflow,
                    entry.step,
                    entry.status,
                    entry
                        .error
                        .as_deref()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                print!("{}", entry.log);
            }
            Ok(())
        }
        TestEnvCommand::Delete(args) => {
            let env = api.delete_environment(&args.id, true).await?;
            if args.json {
                print_json(&env)?;
            } else {
                println!("environment {} {}", args.id, shown(&env.status));
            }
            Ok(())
        }
    }
}

async fn topology(api: &Client, command: TopologyCommand) -> anyhow::Result<()> {
    match command {
        TopologyCommand::List(args) => {
            let list = api.list_topologies().await?;
            if args.json {
                return print_json(&list);
            }
            let simulated = |name: &String| {
                list.taskservs
                    .iter()
                    .any(|t| &t.name == name && t.simulated)
            };
            let rows: Vec<[String; 5]> = list
                .topologies
                .iter()
                .map(|t| {
                    let mut fakes: Vec<String> = t
                        .nodes
                        .iter()
                        .flat_map(|n| &n.taskservs)
                        .filter(|name| simulated(name))
                        .cloned()
                        .collect();
                    fakes.sort();
                    fakes.dedup();
                    [
                        t.name.clone(),
                        t.nodes.len().to_string(),
                        t.checks.len().to_string(),
                        list_or(&fakes, "none"),
                        text(&t.description),
                    ]
                })
                .collect();
            print_table(
                [
                    "TOPOLOGY",
                    "NODES",
                    "CROSS-NODE CHECKS",
                    "SIMULATED",
                    "DESCRIPTION",
                ],
                &rows,
            );
            println!();
            let taskservs: Vec<[String; 4]> = list
                .taskservs
                .iter()
                .map(|t| {
                    [
                        t.name.clone(),
                        t.port.to_string(),
                        if t.simulated { "simulated" } else { "real" }.to_owned(),
                        text(&t.description),
                    ]
                })
                .collect();
            print_table(["TASKSERV", "PORT", "KIND", "DESCRIPTION"], &taskservs);
            Ok(())
        }
        TopologyCommand::Show(args) => {
            let topology = api.topology(&args.name).await?;
            if args.json {
                return print_json(&topology);
            }
            println!(
                "topology {}: {}",
                topology.name,
                text(&topology.description)
            );
            let nodes: Vec<[String; 3]> = topology
                .nodes
                .iter()
                .map(|n| [n.name.clone(), list(&n.roles), list(&n.taskservs)])
                .collect();
            print_table(["NODE", "ROLES", "TASKSERVS"], &nodes);
            let checks: Vec<[String; 4]> = topology
                .checks
                .iter()
                .map(|c| {
                    [
                        c.name.clone(),
                        c.from.clone(),
                        c.taskserv.clone(),
                        list(&c.to),
                    ]
                })
                .collect();
            if !checks.is_empty() {
                println!();
                print_table(["CHECK", "FROM", "TASKSERV", "TO"], &checks);
            }
            Ok(())
        }
    }
}

/// Create (a topology, or one taskserv), run, tear down, print the table.
async fn quick(api: &Client, args: TestQuickArgs) -> anyhow::Result<()> {
    let catalog = api.list_topologies().await?;
    let subject = args.subject.as_str();
    let mut body = if catalog.topologies.iter().any(|t| t.name == subject) {
        json!({"type": "cluster", "topology": subject})
    } else if catalog.taskservs.iter().any(|t| t.name == subject) {
        json!({"type": "single_taskserv", "taskserv": subject})
    } else {
        bail!(
            "`{}` is neither a topology nor a taskserv; see `orchestrator test topology list`",
            args.subject
        );
    };
    if let Value::Object(body) = &mut body {
        body.insert("wait".into(), json!(true));
    }
    let env = api.create_environment(&body).await?;
    let id = env.id.clone();
    eprintln!(
        "environment {id}: {} ({} nodes)",
        shown(&env.status),
        env.nodes.len()
    );
    let result = if env.status == EnvStatus::Ready {
        api.run_environment(&id, true)
            .await
            .map_err(anyhow::Error::from)
    } else {
        Err(anyhow::anyhow!(
            "environment {id} is {}; see `orchestrator test env logs {id}`",
            shown(&env.status)
        ))
    };
    if !args.keep {
        let deleted = api.delete_environment(&id, true).await?;
        eprintln!("environment {id}: {}", shown(&deleted.status));
    }
    let env = result?;
    if args.json {
        print_json(&env)?;
    } else {
        print_checks(env.last_run.as_ref());
    }
    all_passed(&env)
}

fn all_passed(env: &EnvView) -> anyhow::Result<()> {
    let run = env.last_run.as_ref();
    if run.is_some_and(|run| run.status == "passed") {
        Ok(())
    } else {
        bail!(
            "{} of {} checks failed (run {}); see `orchestrator test env logs {}`",
            shown(&run.map(|run| run.failed)),
            run.map_or(0, |run| run.checks.len()),
            shown(&run.map(|run| run.workflow_id)),
            env.id
        )
    }
}

/// The checks of a run and their outcome (a header and dashes before the
/// first run).
fn print_checks(run: Option<&RunView>) {
    let rows: Vec<[String; 5]> = run
        .into_iter()
        .flat_map(|run| &run.checks)
        .map(|c| {
            [
                c.name.clone(),
                c.node.clone(),
                list(&c.targets),
                match c.status.as_str() {
                    "passed" => "PASS".to_owned(),
                    "failed" => "FAIL".to_owned(),
                    other => other.to_owned(),
                },
                c.error.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print_table(["CHECK", "FROM", "TARGETS", "RESULT", "ERROR"], &rows);
    println!(
        "{}: {} passed, {} failed",
        shown(&run.map(|run| &run.status)),
        shown(&run.map(|run| run.passed)),
        shown(&run.map(|run| run.failed))
    );
}

fn print_env(env: &EnvView, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(env);
    }
    println!(
        "environment {}  {}  [{}]  {}{}",
        env.id,
        env.name,
        shown(&env.status),
        shown(&env.env_type),
        env.topology
            .as_deref()
            .map(|t| format!(" {t}"))
            .unwrap_or_default()
    );
    println!(
        "expires {}; auto_start {}, auto_cleanup {}; workflow {}",
        shown(&env.expires_at),
        env.auto_start,
        env.auto_cleanup,
        shown(&env.create_workflow)
    );
    let nodes: Vec<[String; 7]> = env
        .nodes
        .iter()
        .map(|n| {
            let taskservs: Vec<String> = n
                .services
                .iter()
                .map(|t| match (&t.version, t.simulated) {
                    (_, true) => format!("{} (simulated)", t.name),
                    (Some(version), false) => format!("{} {version}", t.name),
                    (None, false) => t.name.clone(),
                })
                .collect();
            [
                n.plan.name.clone(),
                n.plan.address.clone(),
                shown(&n.status),
                list(&n.plan.roles),
                list(&taskservs),
                n.plan.netns.clone(),
                format!(
                    "{} MiB, {} pids, {} cpu",
                    n.plan.limits.memory_mib, n.plan.limits.pids, n.plan.limits.cpus
                ),
            ]
        })
        .collect();
    print_table(
        [
            "NODE",
            "ADDRESS",
            "STATUS",
            "ROLES",
            "TASKSERVS",
            "NETNS",
            "LIMITS",
        ],
        &nodes,
    );
    for node in env.nodes.iter().filter(|n| n.error.is_some()) {
        println!(
            "node {}: {}",
            node.plan.name,
            text(node.error.as_deref().unwrap_or_default())
        );
    }
    if env.last_run.is_some() {
        println!();
        print_checks(env.last_run.as_ref());
    }
    Ok(())
}

fn create_body(args: TestEnvCreateArgs) -> anyhow::Result<Value> {
    let mut body = Map::new();
    body.insert("type".into(), json!(args.env_type));
    body.insert("auto_start".into(), json!(!args.no_auto_start));
    body.insert("auto_cleanup".into(), json!(args.auto_cleanup));
    body.insert("wait".into(), json!(args.wait));
    if !args.taskservs.is_empty() {
        body.insert("taskservs".into(), json!(args.taskservs));
    }
    for (key, value) in [
        ("taskserv", args.taskserv),
        ("server", args.server),
        ("topology", args.topology),
        ("name", args.name),
    ] {
        if let Some(value) = value {
            body.insert(key.into(), json!(value));
        }
    }
    if let Some(ttl) = args.ttl {
        let ttl = match ttl.parse::<u64>() {
            Ok(secs) => json!(secs),
            Err(_) => json!(ttl),
        };
        body.insert("ttl".into(), ttl);
    }
    if let Some(path) = args.topology_file {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("--topology-file {}", path.display()))?;
        let topology: Value = serde_norway::from_str(&text)
            .with_context(|| format!("--topology-file {}: not YAML or JSON", path.display()))?;
        body.insert("topology".into(), topology);
    }
    Ok(Value::Object(body))
}

/// Free text as a table cell: `-` when empty (the service leaves it out).
fn text(value: &str) -> String {
    if value.is_empty() {
        "-".into()
    } else {
        value.to_owned()
    }
}

/// Names as a table cell: `a,b`, or `-` for none.
fn list(items: &[String]) -> String {
    list_or(items, "-")
}

/// Names as a table cell: `a,b`, or `none` when there are none.
fn list_or(items: &[String], none: &str) -> String {
    if items.is_empty() {
        none.into()
    } else {
        items.join(",")
    }
}
