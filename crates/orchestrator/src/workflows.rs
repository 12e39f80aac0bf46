//! `orchestrator workflow …` and `orchestrator template …`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, bail};
use orchestrator_api::client::{Client, WorkflowFilter, WorkflowView};
use orchestrator_core::template::Template;
use orchestrator_core::{TaskId, TaskStatus, WorkflowStatus};
use serde_json::{Map, Value, json};

use crate::cli::{
    ClientArgs, RerunArgs, SubmitArgs, TemplateCommand, WorkflowCommand, WorkflowListArgs,
};
use crate::client::{connect, print_json, print_table, shown};

pub async fn run(client: &ClientArgs, command: WorkflowCommand) -> anyhow::Result<()> {
    let api = connect(client)?;
    match command {
        WorkflowCommand::Submit(args) => submit(&api, args).await,
        WorkflowCommand::Status(args) if args.watch => watch(&api, &args.id).await,
        WorkflowCommand::Status(args) => print_view(&api.workflow(&args.id).await?, args.json),
        WorkflowCommand::List(args) => list(&api, args).await,
        WorkflowCommand::Cancel(args) => {
            print_view(&api.cancel_workflow(&args.id).await?, args.json)
        }
        WorkflowCommand::Retry(args) => print_view(&api.retry_workflow(&args.id).await?, args.json),
        WorkflowCommand::Rerun(args) => rerun(&api, args).await,
        WorkflowCommand::Pause(args) => print_view(&api.pause_workflow(&args.id).await?, args.json),
        WorkflowCommand::Resume(args) => {
            print_view(&api.resume_workflow(&args.id).await?, args.json)
        }
        WorkflowCommand::Diff(args) => {
            let comparison = api.compare_workflows(&args.a, &args.b).await?;
            if args.json {
                return print_json(&comparison);
            }
            crate::diff::print(&comparison, args.all);
            Ok(())
        }
    }
}

async fn rerun(api: &Client, args: RerunArgs) -> anyhow::Result<()> {
    let body = json!({
        "from": args.from,
        "include_downstream": !args.no_downstream,
        "vars": parse_inputs(&args.inputs)?,
    });
    let view = api.rerun_workflow(&args.id, &body).await?;
    let id = shown(&view.workflow.id);
    if args.wait {
        return follow(api, &id, args.json).await;
    }
    if args.json {
        print_json(&view)?;
    } else {
        println!(
            "workflow {id} (revision {} of {}) re-runs from {}",
            view.workflow.revision, args.id, args.from
        );
    }
    Ok(())
}

/// Draws the workflow, then draws it again whenever the event stream says
/// something about it, until it ends. One stream, no polling.
async fn watch(api: &Client, id: &str) -> anyhow::Result<()> {
    use std::io::{IsTerminal, Write};
    let redraw = |view: &WorkflowView| -> anyhow::Result<()> {
        let mut out = std::io::stdout();
        if out.is_terminal() {
            // Home the cursor and clear the screen, then draw afresh.
            write!(out, "\x1b[H\x1b[2J")?;
        }
        print_view(view, false)?;
        out.flush()?;
        Ok(())
    };
    loop {
        let mut stream = api.workflow_events(id).await?;
        let mut pending = String::new();
        loop {
            let view = api.workflow(id).await?;
            redraw(&view)?;
            if view.workflow.status.is_terminal() {
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

async fn submit(api: &Client, args: SubmitArgs) -> anyhow::Result<()> {
    let mut body = Map::new();
    body.insert("template".into(), json!(args.template));
    body.insert("vars".into(), Value::Object(parse_inputs(&args.inputs)?));
    body.insert("check_mode".into(), json!(args.check_mode));
    let mut meta = Map::new();
    if let Some(reference) = args.reference {
        meta.insert("ref".into(), json!(reference));
    }
    if let Some(trace_id) = args.trace_id {
        meta.insert("trace_id".into(), json!(trace_id));
    }
    body.insert("meta".into(), Value::Object(meta));
    if let Some(priority) = args.priority {
        body.insert("priority".into(), json!(priority));
    }
    if let Some(at) = args.at {
        body.insert("schedule".into(), json!({"when": "at", "start": at}));
    }
    let view = api.submit_workflow(&Value::Object(body)).await?;
    let id = shown(&view.workflow.id);
    if !args.wait {
        if args.json {
            print_json(&view)?;
        } else {
            println!("workflow {id} submitted ({} tasks)", view.tasks.len());
        }
        return Ok(());
    }
    follow(api, &id, args.json).await
}

/// Prints each status change of a workflow's tasks on stderr until it
/// ends, then the workflow; an error unless it completed.
async fn follow(api: &Client, id: &str, json: bool) -> anyhow::Result<()> {
    let mut last_seen: HashMap<TaskId, TaskStatus> = HashMap::new();
    let view = loop {
        let view = api.workflow(id).await?;
        if !json {
            for task in &view.tasks {
                if last_seen.get(&task.id) != Some(&task.status) {
                    eprintln!("{:<12} {}", shown(&task.status), task.name);
                    last_seen.insert(task.id, task.status);
                }
            }
        }
        if view.workflow.status.is_terminal() {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    print_view(&view, json)?;
    if view.workflow.status != WorkflowStatus::Completed {
        bail!("workflow {id} ended {}", shown(&view.workflow.status));
    }
    Ok(())
}

async fn list(api: &Client, args: WorkflowListArgs) -> anyhow::Result<()> {
    let filter = WorkflowFilter {
        status: args.status,
        template: args.template,
        reference: args.reference,
        trace_id: args.trace_id,
        q: args.search,
        limit: Some(args.limit),
        offset: None,
        after: args.after,
    };
    let list = api.list_workflows(&filter).await?;
    if args.json {
        return print_json(&list);
    }
    let rows: Vec<[String; 6]> = list
        .workflows
        .iter()
        .map(|w| {
            [
                shown(&w.id),
                shown(&w.status),
                w.template.clone(),
                shown(&w.reference),
                w.revision.to_string(),
                w.name.clone(),
            ]
        })
        .collect();
    print_table(["ID", "STATUS", "TEMPLATE", "REF", "REV", "NAME"], &rows);
    if let Some(next) = list.next_after {
        println!("next page: --after {next}");
    }
    Ok(())
}

fn icon(status: TaskStatus) -> &'static str {
    match status {
        TaskStatus::Completed => "✔",
        TaskStatus::Failed => "✘",
        TaskStatus::Running => "▶",
        TaskStatus::Cancelled => "■",
        TaskStatus::Skipped | TaskStatus::NotStarted => "○",
        TaskStatus::RetryWaiting => "↻",
        _ => "·",
    }
}

/// Prints a workflow's DAG: each task indented by its depth (the longest
/// chain of dependencies before it), with its status.
fn print_view(view: &WorkflowView, as_json: bool) -> anyhow::Result<()> {
    if as_json {
        return print_json(view);
    }
    let workflow = &view.workflow;
    println!(
        "workflow {}  {}  [{}]  template {}@{}",
        shown(&workflow.id),
        workflow.name,
        shown(&workflow.status),
        workflow.kind,
        Value::from(workflow.template_version)
    );
    if let Some(halt) = &workflow.halt {
        println!("halted: {}", halt.reason);
    }
    if workflow.paused {
        println!("paused: no new step starts until it is resumed");
    }
    let mut depth: HashMap<TaskId, usize> = HashMap::new();
    let names: HashMap<TaskId, &str> = view.tasks.iter().map(|t| (t.id, t.name.as_str())).collect();
    // Tasks come in topological order, so dependencies are seen first.
    for task in &view.tasks {
        let d = task
            .depends_on
            .iter()
            .filter_map(|dep| depth.get(dep))
            .max()
            .map_or(0, |d| d + 1);
        depth.insert(task.id, d);
        let deps: Vec<&str> = task
            .depends_on
            .iter()
            .filter_map(|dep| names.get(dep).copied())
            .collect();
        let status = shown(&task.status);
        let indent = "  ".repeat(d);
        let after = if deps.is_empty() {
            String::new()
        } else {
            format!("  ← {}", deps.join(", "))
        };
        println!(
            "{indent}{} {:<40} {:<13} {}/{}{after}",
            icon(task.status),
            task.name,
            status,
            task.attempts,
            task.max_attempts,
        );
        if let Some(error) = task
            .error
            .as_deref()
            .filter(|_| task.status != TaskStatus::Completed)
        {
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
            let list = connect(client)?.list_templates().await?;
            if args.json {
                return print_json(&list);
            }
            let rows: Vec<[String; 4]> = list
                .templates
                .iter()
                .map(|t| {
                    let inputs: Vec<&str> = t.inputs.keys().map(String::as_str).collect();
                    [
                        t.ref_name.clone(),
                        t.schema_version.to_string(),
                        t.name.clone(),
                        inputs.join(", "),
                    ]
                })
                .collect();
            print_table(["REF_NAME", "VERSION", "NAME", "INPUTS"], &rows);
            Ok(())
        }
    }
}
