//! Client subcommands: talk to a running service over its HTTP API and
//! print a human table, or JSON with `--json`.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use orchestrator_api::client::{AuditFilter, Client, ClientError, TaskFilter};
use orchestrator_core::{Task, TaskStatus};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::cli::{
    AuditArgs, ClientArgs, LogsArgs, PruneArgs, SecretCommand, TaskArgs, TasksArgs, TokenCommand,
};

/// The typed client of the service named by `--url`, with `--token`.
pub(crate) fn connect(args: &ClientArgs) -> anyhow::Result<Client> {
    let token = args.token.as_ref().map(|t| t.expose());
    let client = Client::new(&args.url, token).map_err(|e| match e {
        ClientError::InvalidToken => anyhow!("--token: not a valid header value"),
        e => e.into(),
    })?;
    Ok(client.with_unauthorized_hint(
        "pass --token or set ORCHESTRATOR_TOKEN \
         (the first start of the service printed an admin token)",
    ))
}

/// Prints an answer as pretty JSON with its keys sorted, as `--json` always
/// has: through `Value`, whose maps sort their keys.
pub(crate) fn print_json<T: Serialize>(answer: &T) -> anyhow::Result<()> {
    let value = serde_json::to_value(answer)?;
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(())
}

/// A field for a human table, as the service wrote it: text as is,
/// `null` as `-`, anything else as JSON.
pub(crate) fn shown<T: Serialize>(field: &T) -> String {
    match serde_json::to_value(field) {
        Ok(Value::String(s)) => s,
        Ok(Value::Null) | Err(_) => "-".to_owned(),
        Ok(other) => other.to_string(),
    }
}

pub async fn tasks(client: &ClientArgs, args: TasksArgs) -> anyhow::Result<()> {
    let api = connect(client)?;
    let filter = TaskFilter {
        status: args.status,
        workflow: args.workflow,
        limit: Some(args.limit),
        offset: Some(args.offset),
        after: args.after,
    };
    let list = api.list_tasks(&filter).await?;
    if args.json {
        // In the fields' order, as this command always printed it.
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    let rows: Vec<[String; 6]> = list
        .tasks
        .iter()
        .map(|t| {
            [
                t.id.to_string(),
                t.status.to_string(),
                t.priority.to_string(),
                format!("{}/{}", t.attempts, t.max_attempts),
                t.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                t.name.clone(),
            ]
        })
        .collect();
    print_table(
        [
            "ID",
            "STATUS",
            "PRIORITY",
            "ATTEMPTS",
            "CREATED (UTC)",
            "NAME",
        ],
        &rows,
    );
    println!(
        "{} of {} task(s) shown (offset {})",
        list.tasks.len(),
        list.total,
        list.offset
    );
    if let Some(next) = list.next_after {
        println!("next page: --after {next}");
    }
    Ok(())
}

pub(crate) fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        println!("{}", padded.join("  ").trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

pub async fn task(client: &ClientArgs, args: TaskArgs) -> anyhow::Result<()> {
    let task = connect(client)?.task(&args.id).await?;
    if args.json {
        return print_json(&task);
    }
    print_task(&task);
    Ok(())
}

fn print_task(task: &Task) {
    for (label, value) in [
        ("id", shown(&task.id)),
        ("name", shown(&task.name)),
        ("status", shown(&task.status)),
        ("workflow", shown(&task.workflow_id)),
        ("script", shown(&task.script)),
        ("priority", shown(&task.priority)),
        ("check mode", shown(&task.check_mode)),
        ("created", shown(&task.created_at)),
        ("started", shown(&task.started_at)),
        ("finished", shown(&task.finished_at)),
        ("exit code", shown(&task.exit_code)),
        ("error", shown(&task.error)),
    ] {
        println!("{label:<11} {value}");
    }
    println!("{:<11} {}/{}", "attempts", task.attempts, task.max_attempts);
    if let Some(output) = &task.output {
        println!("output:");
        println!(
            "{}",
            serde_json::to_string_pretty(output).unwrap_or_default()
        );
    }
}

pub async fn logs(client: &ClientArgs, args: LogsArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let api = connect(client)?;
    let mut offset = 0u64;
    loop {
        // `follow`: the service streams the log as it is written and ends
        // the response once the task has ended.
        let mut stream = api.task_log(&args.id, offset, args.follow).await?;
        let mut stdout = std::io::stdout();
        loop {
            match stream.chunk().await {
                Ok(Some(bytes)) => {
                    offset += bytes.len() as u64;
                    stdout.write_all(&bytes)?;
                    stdout.flush()?;
                }
                Ok(None) => break,
                // A dropped connection: pick up from the offset below.
                Err(e) if args.follow => {
                    tracing::debug!(error = %e, "log stream broke; reconnecting");
                    break;
                }
                Err(e) => return Err(e).context("reading the log"),
            }
        }
        if !args.follow {
            return Ok(());
        }
        // The stream ends when the task ends; make sure it did, rather
        // than a proxy or a restart having cut it.
        if api.task(&args.id).await?.status.is_terminal() {
            let rest = api
                .task_log(&args.id, offset, false)
                .await?
                .bytes()
                .await
                .context("reading the log")?;
            stdout.write_all(&rest)?;
            stdout.flush()?;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn cancel(client: &ClientArgs, args: TaskArgs) -> anyhow::Result<()> {
    let task = connect(client)?.cancel_task(&args.id).await?;
    if args.json {
        print_json(&task)?;
    } else if task.status == TaskStatus::Cancelled {
        println!("task {} cancelled", args.id);
    } else {
        println!(
            "cancel requested for task {}; its script is being stopped",
            args.id
        );
    }
    Ok(())
}

pub async fn checkpoint(
    client: &ClientArgs,
    command: crate::cli::CheckpointCommand,
) -> anyhow::Result<()> {
    use crate::cli::CheckpointCommand;
    let api = connect(client)?;
    match command {
        CheckpointCommand::Set(args) => {
            let value = serde_json::from_str(&args.value).unwrap_or(Value::String(args.value));
            let entries = Map::from_iter([(args.key, value)]);
            api.save_checkpoint(&args.task, &entries).await?;
            Ok(())
        }
        CheckpointCommand::Get(args) => {
            let saved = api.checkpoint(&args.task).await?;
            match args.key {
                Some(key) => match saved.get(&key) {
                    None | Some(Value::Null) => {
                        bail!("checkpoint of task {} has no key `{key}`", args.task)
                    }
                    Some(Value::String(s)) => println!("{s}"),
                    Some(other) => println!("{other}"),
                },
                None => println!("{}", Value::Object(saved)),
            }
            Ok(())
        }
    }
}

pub async fn token(client: &ClientArgs, command: TokenCommand) -> anyhow::Result<()> {
    if let TokenCommand::Create {
        name,
        role,
        local: true,
        store,
    } = command
    {
        return crate::recovery::create_token_locally(&name, &role, *store).await;
    }
    let api = connect(client)?;
    match command {
        TokenCommand::Create { name, role, .. } => {
            let created = api.create_token(&name, &role).await?;
            println!(
                "created token {} ({}, {}); it is shown only this once:\n\n{}",
                created.id,
                created.name,
                shown(&created.role),
                created.token,
            );
        }
        TokenCommand::List => {
            let list = api.list_tokens().await?;
            println!(
                "{:<32}  {:<20}  {:<8}  {:<25}  STATE",
                "ID", "NAME", "ROLE", "CREATED"
            );
            for token in &list.tokens {
                println!(
                    "{:<32}  {:<20}  {:<8}  {:<25}  {}",
                    token.id,
                    token.name,
                    shown(&token.role),
                    shown(&token.created_at),
                    token
                        .revoked_at
                        .map_or_else(|| "active".to_owned(), |t| format!("revoked {}", shown(&t))),
                );
            }
        }
        TokenCommand::Revoke { id } => {
            let revoked = api.revoke_token(&id).await?;
            println!("revoked token {} ({})", revoked.id, revoked.name);
        }
    }
    Ok(())
}

pub async fn secret(client: &ClientArgs, command: SecretCommand) -> anyhow::Result<()> {
    // `--templates ''` is the empty list, not a list of one empty name.
    let list = |items: Option<Vec<String>>| {
        items.map(|items| {
            items
                .into_iter()
                .filter(|item| !item.is_empty())
                .collect::<Vec<_>>()
        })
    };
    let scope_body = |templates, origins| {
        let mut body = Map::new();
        if let Some(templates) = list(templates) {
            body.insert("templates".into(), serde_json::json!(templates));
        }
        if let Some(origins) = list(origins) {
            body.insert("origins".into(), serde_json::json!(origins));
        }
        body
    };
    let api = connect(client)?;
    let shown_secret = |info: &orchestrator_api::client::SecretInfo| {
        format!(
            "{:<32}  {:<25}  templates [{}]  origins [{}]",
            info.name,
            shown(&info.updated_at),
            info.scope.templates.join(","),
            info.scope.origins.join(","),
        )
    };
    match command {
        SecretCommand::Put {
            name,
            templates,
            origins,
        } => {
            let mut value = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut value)
                .context("cannot read the secret's value from stdin")?;
            let value = value.strip_suffix('\n').unwrap_or(&value);
            let value = value.strip_suffix('\r').unwrap_or(value);
            let mut body = scope_body(templates, origins);
            body.insert("value".into(), value.into());
            let info = api.put_secret(&name, &Value::Object(body)).await?;
            println!("{}", shown_secret(&info));
        }
        SecretCommand::Scope {
            name,
            templates,
            origins,
        } => {
            let body = Value::Object(scope_body(templates, origins));
            let info = api.change_secret_scope(&name, &body).await?;
            println!("{}", shown_secret(&info));
        }
        SecretCommand::List => {
            let list = api.list_secrets().await?;
            println!("{:<32}  {:<25}  SCOPE", "NAME", "UPDATED");
            for info in &list.secrets {
                println!("{}", shown_secret(info));
            }
        }
        SecretCommand::Delete { name } => {
            api.delete_secret(&name).await?;
            println!("deleted secret {name}");
        }
    }
    Ok(())
}

pub async fn audit(client: &ClientArgs, args: AuditArgs) -> anyhow::Result<()> {
    let filter = AuditFilter {
        since: args.since,
        until: args.until,
        actor: args.actor,
        action: args.action,
        target: args.target,
        limit: Some(args.limit),
        offset: Some(args.offset),
    };
    let page = connect(client)?.audit(&filter).await?;
    if args.json {
        return print_json(&page);
    }
    for record in &page.records {
        println!(
            "{}  {:<16} {:<26} {:<8} {:>3}  {}",
            shown(&record.time),
            record.actor,
            record.action,
            record.outcome,
            record.status,
            record.target.as_deref().unwrap_or("-"),
        );
    }
    println!("{} of {} records", page.records.len(), page.total);
    Ok(())
}

/// `orchestrator locks`: one line per holder and per waiter, by lock.
pub async fn locks(client: &ClientArgs, args: crate::cli::LocksArgs) -> anyhow::Result<()> {
    let list = connect(client)?.list_locks().await?;
    if args.json {
        return print_json(&list);
    }
    if list.locks.is_empty() {
        println!("no lock is held or waited for");
    }
    for lock in &list.locks {
        println!("{} (last token {})", lock.name, lock.fencing);
        for h in &lock.holders {
            println!(
                "  held    token {:<6} {:<9} {} {} since {}",
                h.token,
                h.mode.as_str(),
                h.workflow_id,
                h.step,
                shown(&h.since),
            );
        }
        for (i, w) in lock.waiters.iter().enumerate() {
            println!(
                "  waiting #{:<5} {:<9} {} {} since {}",
                i + 1,
                w.mode.as_str(),
                w.workflow_id,
                w.step,
                shown(&w.since),
            );
        }
    }
    Ok(())
}

pub async fn prune(client: &ClientArgs, args: PruneArgs) -> anyhow::Result<()> {
    if args.older_than.is_none() && args.audit_older_than.is_none() {
        anyhow::bail!("say what to prune: --older-than PERIOD and/or --audit-older-than PERIOD");
    }
    let body = serde_json::json!({
        "older_than": args.older_than.map(|k| k.to_string()),
        "audit_older_than": args.audit_older_than.map(|k| k.to_string()),
        "dry_run": args.dry_run,
    });
    let report = connect(client)?.prune(&body).await?;
    if args.json {
        return print_json(&report);
    }
    let verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    println!(
        "{verb} {} finished workflows ({} tasks) and {} audit records",
        report.workflows, report.tasks, report.audit_records
    );
    Ok(())
}
