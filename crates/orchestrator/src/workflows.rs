//! `orchestrator workflow …` and `orchestrator template …`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, bail};
use orchestrator_core::template::Template;
use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::cli::{
    ClientArgs, RerunArgs, SubmitArgs, TemplateCommand, WorkflowCommand, WorkflowListArgs,
};
use crate::client::{Api, print_table};

pub async fn run(client: &ClientArgs, command: WorkflowCommand) -> anyhow::Result<()> {
    let api = Api::new(client)?;
    match command {
        WorkflowCommand::Submit(args) => submit(&api, args).await,
        WorkflowCommand::Status(args) if args.watch => watch(&api, &args.id).await,
        WorkflowCommand::Status(args) => {
            let view: Value = api
                .json(Method::GET, &format!("/workflows/{}", args.id), &[])
                .await?;
            print_view(&view, args.json)
        }
        WorkflowCommand::List(args) => list(&api, args).await,
        WorkflowCommand::Cancel(args) => {
            let view = post(&api, &format!("/workflows/{}/cancel", args.id), None).await?;
            print_view(&view, args.json)
        }
        WorkflowCommand::Retry(args) => {
            let view = post(&api, &format!("/workflows/{}/retry", args.id), None).await?;
            print_view(&view, args.json)
        }
        WorkflowCommand::Rerun(args) => rerun(&api, args).await,
    }
}

async fn rerun(api: &Api, args: RerunArgs) -> anyhow::Result<()> {
    let body = json!({
        "from": args.from,
        "include_downstream": !args.no_downstream,
        "vars": parse_inputs(&args.inputs)?,
    });
    let view = post(api, &format!("/workflows/{}/rerun", args.id), Some(&body)).await?;
    let id = view["id"].as_str().unwrap_or_default().to_owned();
    if args.wait {
        return follow(api, &id, args.json).await;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        println!(
            "workflow {id} (revision {} of {}) re-runs from {}",
            view["revision"], args.id, args.from
        );
    }
    Ok(())
}

/// Draws the workflow, then draws it again whenever the event stream says
/// something about it, until it ends. One stream, no polling.
async fn watch(api: &Api, id: &str) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let redraw = |view: &Value| -> anyhow::Result<()> {
        let mut out = std::io::stdout();
        if out.is_terminal() {
            // Home the cursor and clear the screen, then draw afresh.
            write!(out, "\x1b[H\x1b[2J")?;
        }
        print_view(view, false)?;
        out.flush()?;
        Ok(())
    };
    let finished = |view: &Value| {
        matches!(
            view["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        )
    };
    loop {
        let mut stream = api
            .send(Method::GET, "/events", &[("workflow", id.to_owned())])
            .await?;
        let mut pending = String::new();
        loop {
            let view: Value = api
                .json(Method::GET, &format!("/workflows/{id}"), &[])
                .await?;
            redraw(&view)?;
            if finished(&view) {
                return Ok(());
            }
            // Wait for the next whole event (a blank line ends one); the
            // stream's keep-alive comments are not events.
            let got_event = loop {
                if let Some(end) = pending.find("\n\n") {
                    let event: String = pending.drain(..end + 2).collect();
                    if event.lines().any(|l| l.starts_with("data:")) {
                        break true;
                    }
                    continue;
                }
                match stream.chunk().await {
                    Ok(Some(bytes)) => pending.push_str(&String::from_utf8_lossy(&bytes)),
                    Ok(None) | Err(_) => break false,
                }
            };
            if !got_event {
                break;
            }
        }
        // The stream ended (a restart, a proxy): connect again.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn post(api: &Api, path: &str, body: Option<&Value>) -> anyhow::Result<Value> {
    api.send_body(Method::POST, path, &[], body)
        .await?
        .json()
        .await
        .context("the service answered with unexpected JSON")
}

/// `key=value` with the value read as JSON when it parses, else as text.
fn parse_input(raw: &str) -> anyhow::Result<(String, Value)> {
    let Some((key, value)) = raw.split_once('=') else {
        bail!("-i {raw}: expected KEY=VALUE");
    };
    if key.is_empty() {
        bail!("-i {raw}: the key is empty");
    }
    let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
    Ok((key.to_owned(), value))
}

/// Every `-i key=value` as an object of inputs.
pub(crate) fn parse_inputs(inputs: &[String]) -> anyhow::Result<Map<String, Value>> {
    let mut vars = Map::new();
    for raw in inputs {
        let (key, value) = parse_input(raw)?;
        vars.insert(key, value);
    }
    Ok(vars)
}

async fn submit(api: &Api, args: SubmitArgs) -> anyhow::Result<()> {
    let vars = parse_inputs(&args.inputs)?;
    let mut body = json!({"template": args.template, "vars": vars, "check_mode": args.check_mode});
    let mut meta = Map::new();
    if let Some(reference) = args.reference {
        meta.insert("ref".into(), json!(reference));
    }
    if let Some(trace_id) = args.trace_id {
        meta.insert("trace_id".into(), json!(trace_id));
    }
    body["meta"] = Value::Object(meta);
    if let Some(priority) = args.priority {
        body["priority"] = json!(priority);
    }
    if let Some(at) = args.at {
        body["schedule"] = json!({"when": "at", "start": at});
    }
    let view = post(api, "/workflows", Some(&body)).await?;
    let id = view["id"].as_str().unwrap_or_default().to_owned();
    if !args.wait {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&view)?);
        } else {
            println!(
                "workflow {id} submitted ({} tasks)",
                view["tasks"].as_array().map_or(0, Vec::len)
            );
        }
        return Ok(());
    }
    follow(api, &id, args.json).await
}

/// Prints each status change of a workflow's tasks on stderr until it
/// ends, then the workflow; an error unless it completed.
async fn follow(api: &Api, id: &str, json: bool) -> anyhow::Result<()> {
    let mut last_seen: HashMap<String, String> = HashMap::new();
    let view = loop {
        let view: Value = api
            .json(Method::GET, &format!("/workflows/{id}"), &[])
            .await?;
        if !json {
            for task in view["tasks"].as_array().into_iter().flatten() {
                let (tid, status) = (
                    task["id"].as_str().unwrap_or_default(),
                    task["status"].as_str().unwrap_or_default(),
                );
                if last_seen.get(tid).map(String::as_str) != Some(status) {
                    eprintln!(
                        "{:<12} {}",
                        status,
                        task["name"].as_str().unwrap_or_default()
                    );
                    last_seen.insert(tid.to_owned(), status.to_owned());
                }
            }
        }
        if matches!(
            view["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    print_view(&view, json)?;
    if view["status"] != "completed" {
        bail!(
            "workflow {id} ended {}",
            view["status"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

async fn list(api: &Api, args: WorkflowListArgs) -> anyhow::Result<()> {
    let mut query = vec![("limit", args.limit.to_string())];
    for (key, value) in [
        ("status", args.status),
        ("template", args.template),
        ("ref", args.reference),
        ("trace_id", args.trace_id),
    ] {
        if let Some(value) = value {
            query.push((key, value));
        }
    }
    let list: Value = api.json(Method::GET, "/workflows", &query).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let text = |v: &Value| {
        v.as_str().map(str::to_owned).unwrap_or_else(|| {
            if v.is_null() {
                "-".into()
            } else {
                v.to_string()
            }
        })
    };
    let rows: Vec<[String; 6]> = list["workflows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            [
                text(&w["id"]),
                text(&w["status"]),
                text(&w["template"]),
                text(&w["ref"]),
                text(&w["revision"]),
                text(&w["name"]),
            ]
        })
        .collect();
    print_table(["ID", "STATUS", "TEMPLATE", "REF", "REV", "NAME"], &rows);
    Ok(())
}

fn icon(status: &str) -> &'static str {
    match status {
        "completed" => "✔",
        "failed" => "✘",
        "running" => "▶",
        "cancelled" => "■",
        "skipped" | "not_started" => "○",
        "retry_waiting" => "↻",
        _ => "·",
    }
}

/// Prints a workflow's DAG: each task indented by its depth (the longest
/// chain of dependencies before it), with its status.
fn print_view(view: &Value, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        println!("{}", serde_json::to_string_pretty(view)?);
        return Ok(());
    }
    let text = |v: &Value| v.as_str().unwrap_or("-").to_owned();
    println!(
        "workflow {}  {}  [{}]  template {}@{}",
        text(&view["id"]),
        text(&view["name"]),
        text(&view["status"]),
        text(&view["kind"]),
        view["template_version"]
    );
    if let Some(halt) = view["halt"]["reason"].as_str() {
        println!("halted: {halt}");
    }
    let tasks = view["tasks"].as_array().cloned().unwrap_or_default();
    let mut depth: HashMap<String, usize> = HashMap::new();
    let names: HashMap<String, String> = tasks
        .iter()
        .map(|t| (text(&t["id"]), text(&t["name"])))
        .collect();
    // Tasks come in topological order, so dependencies are seen first.
    for task in &tasks {
        let d = task["depends_on"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|dep| depth.get(dep.as_str().unwrap_or_default()))
            .max()
            .map_or(0, |d| d + 1);
        depth.insert(text(&task["id"]), d);
        let deps: Vec<String> = task["depends_on"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|dep| names.get(dep.as_str().unwrap_or_default()).cloned())
            .collect();
        let status = text(&task["status"]);
        let indent = "  ".repeat(d);
        let after = if deps.is_empty() {
            String::new()
        } else {
            format!("  ← {}", deps.join(", "))
        };
        println!(
            "{indent}{} {:<40} {:<13} {}/{}{after}",
            icon(&status),
            text(&task["name"]),
            status,
            task["attempts"],
            task["max_attempts"],
        );
        if let Some(error) = task["error"].as_str().filter(|_| status != "completed") {
            println!("{indent}    {error}");
        }
    }
    Ok(())
}

pub async fn template(client: &ClientArgs, command: TemplateCommand) -> anyhow::Result<()> {
    match command {
        TemplateCommand::Validate(args) => {
            let text = std::fs::read_to_string(&args.file)
                .with_context(|| format!("cannot read {}", args.file.display()))?;
            let is_json = args.file.extension().is_some_and(|e| e == "json");
            let template = Template::parse(&text, is_json)
                .map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
            let executor =
                orchestrator_executor::ScriptExecutor::new(orchestrator_executor::ExecutorConfig {
                    scripts_dir: args.scripts_dir.clone(),
                    work_dir: std::env::temp_dir(),
                    data_dir: std::env::temp_dir(),
                    kill_grace: Duration::from_secs(1),
                    interpreters: HashMap::new(),
                    service_url: None,
                    // Only checks paths: runs nothing.
                    sandbox: orchestrator_executor::Sandbox::None,
                })
                .with_context(|| format!("--scripts-dir {}", args.scripts_dir.display()))?;
            let http_allow = orchestrator_http::Allowlist::parse(&args.http_allow)
                .map_err(|e| anyhow::anyhow!("--http-allow: {e}"))?;
            let steps = crate::service::step_kinds(executor, &http_allow)?;
            orchestrator_engine::templates::check(&template, &steps)
                .map_err(|e| anyhow::anyhow!("{}: {e}", args.file.display()))?;
            println!(
                "{}: template {}@{} is valid ({} steps)",
                args.file.display(),
                template.ref_name,
                template.schema_version,
                template.steps.len()
            );
            Ok(())
        }
        TemplateCommand::List(args) => {
            let api = Api::new(client)?;
            let list: Value = api.json(Method::GET, "/templates", &[]).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            let rows: Vec<[String; 4]> = list["templates"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|t| {
                    let inputs: Vec<&str> = t["inputs"]
                        .as_object()
                        .map(|m| m.keys().map(String::as_str).collect())
                        .unwrap_or_default();
                    [
                        t["ref_name"].as_str().unwrap_or_default().to_owned(),
                        t["schema_version"].to_string(),
                        t["name"].as_str().unwrap_or_default().to_owned(),
                        inputs.join(", "),
                    ]
                })
                .collect();
            print_table(["REF_NAME", "VERSION", "NAME", "INPUTS"], &rows);
            Ok(())
        }
    }
}
