//! `orchestrator test …`: test environments through the service's
//! `/test/environments` and `/test/topologies` routes.

use anyhow::{Context, bail};
use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::{
    ClientArgs, TestCommand, TestEnvCommand, TestEnvCreateArgs, TestQuickArgs, TopologyCommand,
};
use crate::client::{Api, print_table};

pub async fn run(client: &ClientArgs, command: TestCommand) -> anyhow::Result<()> {
    let api = Api::new(client)?;
    match command {
        TestCommand::Env(command) => env(&api, command).await,
        TestCommand::Topology(command) => topology(&api, command).await,
        TestCommand::Quick(args) => quick(&api, args).await,
    }
}

async fn env(api: &Api, command: TestEnvCommand) -> anyhow::Result<()> {
    match command {
        TestEnvCommand::Create(args) => {
            let json = args.json;
            let body = create_body(args)?;
            let env = send(
                api,
                Method::POST,
                "/test/environments/create",
                &[],
                Some(&body),
            )
            .await?;
            print_env(&env, json)
        }
        TestEnvCommand::List(args) => {
            let list = send(api, Method::GET, "/test/environments", &[], None).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            let rows: Vec<[String; 6]> = list["environments"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    [
                        text(&e["id"]),
                        text(&e["name"]),
                        text(&e["type"]),
                        text(&e["status"]),
                        e["nodes"].as_array().map_or(0, Vec::len).to_string(),
                        text(&e["expires_at"]),
                    ]
                })
                .collect();
            print_table(["ID", "NAME", "TYPE", "STATUS", "NODES", "EXPIRES"], &rows);
            Ok(())
        }
        TestEnvCommand::Show(args) => {
            let env = send(
                api,
                Method::GET,
                &format!("/test/environments/{}", args.id),
                &[],
                None,
            )
            .await?;
            print_env(&env, args.json)
        }
        TestEnvCommand::Run(args) => {
            let env = run_checks(api, &args.id).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&env)?);
            } else {
                print_checks(&env);
            }
            all_passed(&env)
        }
        TestEnvCommand::Logs(args) => {
            let logs = send(
                api,
                Method::GET,
                &format!("/test/environments/{}/logs", args.id),
                &[],
                None,
            )
            .await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&logs)?);
                return Ok(());
            }
            for entry in logs["entries"].as_array().into_iter().flatten() {
                println!(
                    "== {} / {} [{}]{}",
                    text(&entry["workflow"]),
                    text(&entry["step"]),
                    text(&entry["status"]),
                    entry["error"]
                        .as_str()
                        .map(|e| format!(": {e}"))
                        .unwrap_or_default()
                );
                print!("{}", entry["log"].as_str().unwrap_or_default());
            }
            Ok(())
        }
        TestEnvCommand::Delete(args) => {
            let env = delete(api, &args.id).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&env)?);
            } else {
                println!("environment {} {}", args.id, text(&env["status"]));
            }
            Ok(())
        }
    }
}

async fn topology(api: &Api, command: TopologyCommand) -> anyhow::Result<()> {
    match command {
        TopologyCommand::List(args) => {
            let list = send(api, Method::GET, "/test/topologies", &[], None).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            let rows: Vec<[String; 4]> = list["topologies"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    [
                        text(&t["name"]),
                        t["nodes"].as_array().map_or(0, Vec::len).to_string(),
                        t["checks"].as_array().map_or(0, Vec::len).to_string(),
                        text(&t["description"]),
                    ]
                })
                .collect();
            print_table(
                ["TOPOLOGY", "NODES", "CROSS-NODE CHECKS", "DESCRIPTION"],
                &rows,
            );
            let taskservs: Vec<String> = list["taskservs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| format!("{} (port {})", text(&t["name"]), text(&t["port"])))
                .collect();
            println!("\ntaskservs: {}", taskservs.join(", "));
            Ok(())
        }
        TopologyCommand::Show(args) => {
            let topology = send(
                api,
                Method::GET,
                &format!("/test/topologies/{}", args.name),
                &[],
                None,
            )
            .await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&topology)?);
                return Ok(());
            }
            println!(
                "topology {}: {}",
                text(&topology["name"]),
                text(&topology["description"])
            );
            let nodes: Vec<[String; 3]> = topology["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| [text(&n["name"]), list(&n["roles"]), list(&n["taskservs"])])
                .collect();
            print_table(["NODE", "ROLES", "TASKSERVS"], &nodes);
            let checks: Vec<[String; 4]> = topology["checks"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    [
                        text(&c["name"]),
                        text(&c["from"]),
                        text(&c["taskserv"]),
                        list(&c["to"]),
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
async fn quick(api: &Api, args: TestQuickArgs) -> anyhow::Result<()> {
    let catalog = send(api, Method::GET, "/test/topologies", &[], None).await?;
    let is = |kind: &str| {
        catalog[kind]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["name"] == args.subject.as_str())
    };
    let mut body = if is("topologies") {
        json!({"type": "cluster", "topology": args.subject})
    } else if is("taskservs") {
        json!({"type": "single_taskserv", "taskserv": args.subject})
    } else {
        bail!(
            "`{}` is neither a topology nor a taskserv; see `orchestrator test topology list`",
            args.subject
        );
    };
    body["wait"] = json!(true);
    let env = send(
        api,
        Method::POST,
        "/test/environments/create",
        &[],
        Some(&body),
    )
    .await?;
    let id = env["id"]
        .as_str()
        .context("the service answered without an id")?
        .to_owned();
    eprintln!(
        "environment {id}: {} ({} nodes)",
        text(&env["status"]),
        env["nodes"].as_array().map_or(0, Vec::len)
    );
    let result = if env["status"] == "ready" {
        run_checks(api, &id).await
    } else {
        Err(anyhow::anyhow!(
            "environment {id} is {}; see `orchestrator test env logs {id}`",
            text(&env["status"])
        ))
    };
    if !args.keep {
        let deleted = delete(api, &id).await?;
        eprintln!("environment {id}: {}", text(&deleted["status"]));
    }
    let env = result?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&env)?);
    } else {
        print_checks(&env);
    }
    all_passed(&env)
}

async fn run_checks(api: &Api, id: &str) -> anyhow::Result<Value> {
    send(
        api,
        Method::POST,
        &format!("/test/environments/{id}/run"),
        &[("wait", "true".to_owned())],
        None,
    )
    .await
}

async fn delete(api: &Api, id: &str) -> anyhow::Result<Value> {
    send(
        api,
        Method::DELETE,
        &format!("/test/environments/{id}"),
        &[("wait", "true".to_owned())],
        None,
    )
    .await
}

fn all_passed(env: &Value) -> anyhow::Result<()> {
    let run = &env["last_run"];
    if run["status"] == "passed" {
        Ok(())
    } else {
        bail!(
            "{} of {} checks failed (run {}); see `orchestrator test env logs {}`",
            text(&run["failed"]),
            run["checks"].as_array().map_or(0, Vec::len),
            text(&run["workflow_id"]),
            text(&env["id"])
        )
    }
}

fn print_checks(env: &Value) {
    let run = &env["last_run"];
    let rows: Vec<[String; 5]> = run["checks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            [
                text(&c["name"]),
                text(&c["node"]),
                list(&c["targets"]),
                match c["status"].as_str() {
                    Some("passed") => "PASS".to_owned(),
                    Some("failed") => "FAIL".to_owned(),
                    other => other.unwrap_or("-").to_owned(),
                },
                c["error"].as_str().unwrap_or_default().to_owned(),
            ]
        })
        .collect();
    print_table(["CHECK", "FROM", "TARGETS", "RESULT", "ERROR"], &rows);
    println!(
        "{}: {} passed, {} failed",
        text(&run["status"]),
        text(&run["passed"]),
        text(&run["failed"])
    );
}

fn print_env(env: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(env)?);
        return Ok(());
    }
    println!(
        "environment {}  {}  [{}]  {}{}",
        text(&env["id"]),
        text(&env["name"]),
        text(&env["status"]),
        text(&env["type"]),
        env["topology"]
            .as_str()
            .map(|t| format!(" {t}"))
            .unwrap_or_default()
    );
    println!(
        "expires {}; auto_start {}, auto_cleanup {}; workflow {}",
        text(&env["expires_at"]),
        text(&env["auto_start"]),
        text(&env["auto_cleanup"]),
        text(&env["create_workflow"])
    );
    let nodes: Vec<[String; 5]> = env["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| {
            [
                text(&n["name"]),
                text(&n["address"]),
                list(&n["roles"]),
                list(&n["taskservs"]),
                text(&n["netns"]),
            ]
        })
        .collect();
    print_table(["NODE", "ADDRESS", "ROLES", "TASKSERVS", "NETNS"], &nodes);
    if env["last_run"].is_object() {
        println!();
        print_checks(env);
    }
    Ok(())
}

fn create_body(args: TestEnvCreateArgs) -> anyhow::Result<Value> {
    let mut body = json!({
        "type": args.env_type,
        "auto_start": !args.no_auto_start,
        "auto_cleanup": args.auto_cleanup,
        "wait": args.wait,
    });
    if !args.taskservs.is_empty() {
        body["taskservs"] = json!(args.taskservs);
    }
    for (key, value) in [
        ("taskserv", args.taskserv),
        ("server", args.server),
        ("topology", args.topology),
        ("name", args.name),
    ] {
        if let Some(value) = value {
            body[key] = json!(value);
        }
    }
    if let Some(ttl) = args.ttl {
        body["ttl"] = match ttl.parse::<u64>() {
            Ok(secs) => json!(secs),
            Err(_) => json!(ttl),
        };
    }
    if let Some(path) = args.topology_file {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("--topology-file {}", path.display()))?;
        let topology: Value = serde_norway::from_str(&text)
            .with_context(|| format!("--topology-file {}: not YAML or JSON", path.display()))?;
        body["topology"] = topology;
    }
    Ok(body)
}

async fn send(
    api: &Api,
    method: Method,
    path: &str,
    query: &[(&str, String)],
    body: Option<&Value>,
) -> anyhow::Result<Value> {
    Ok(api
        .send_body(method, path, query, body)
        .await?
        .json()
        .await?)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn list(v: &Value) -> String {
    match v.as_array() {
        Some(items) if !items.is_empty() => items.iter().map(text).collect::<Vec<_>>().join(","),
        _ => "-".into(),
    }
}
