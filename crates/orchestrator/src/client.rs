//! Client subcommands: talk to a running service over its HTTP API and
//! print a human table, or JSON with `--json`.

use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use orchestrator_core::Task;
use reqwest::{Client, Method, Response};
use serde::Deserialize;
use serde_json::Value;

use crate::cli::{
    AuditArgs, ClientArgs, LogsArgs, PruneArgs, SecretCommand, TaskArgs, TasksArgs, TokenCommand,
};

pub(crate) struct Api {
    http: Client,
    base: String,
}

impl Api {
    pub(crate) fn new(args: &ClientArgs) -> anyhow::Result<Api> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &args.token {
            let mut value =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                    .context("--token: not a valid header value")?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let http = Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .default_headers(headers)
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Api {
            http,
            base: args.url.trim_end_matches('/').to_owned(),
        })
    }

    /// Sends a request; a non-2xx answer becomes an error carrying the
    /// service's own message.
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
    ) -> anyhow::Result<Response> {
        self.send_body(method, path, query, None).await
    }

    /// Like [`Api::send`], with an optional JSON body.
    pub(crate) async fn send_body(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> anyhow::Result<Response> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url).query(query);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| {
            anyhow!(
                "cannot reach the orchestrator at {}: {e} (is `orchestrator serve` running?)",
                self.base
            )
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let message = body["error"]["message"].as_str().unwrap_or("no details");
        if status == reqwest::StatusCode::UNAUTHORIZED {
            bail!(
                "{message} (HTTP 401); pass --token or set ORCHESTRATOR_TOKEN \
                 (the first start of the service printed an admin token)"
            )
        }
        bail!("{message} (HTTP {})", status.as_u16())
    }

    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
    ) -> anyhow::Result<T> {
        self.json_body(method, path, query, None).await
    }

    /// [`Api::json`], with an optional JSON body.
    pub(crate) async fn json_body<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> anyhow::Result<T> {
        self.send_body(method, path, query, body)
            .await?
            .json()
            .await
            .context("the service answered with unexpected JSON")
    }
}

#[derive(Deserialize, serde::Serialize)]
struct TaskList {
    tasks: Vec<Task>,
    total: usize,
    limit: usize,
    offset: usize,
}

pub async fn tasks(client: &ClientArgs, args: TasksArgs) -> anyhow::Result<()> {
    let api = Api::new(client)?;
    let mut query = vec![
        ("limit", args.limit.to_string()),
        ("offset", args.offset.to_string()),
    ];
    if let Some(status) = args.status {
        query.push(("status", status));
    }
    if let Some(workflow) = args.workflow {
        query.push(("workflow", workflow));
    }
    let list: TaskList = api.json(Method::GET, "/tasks", &query).await?;
    if args.json {
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
    let api = Api::new(client)?;
    let task: Value = api
        .json(Method::GET, &format!("/tasks/{}", args.id), &[])
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&task)?);
        return Ok(());
    }
    print_task(&task);
    Ok(())
}

fn print_task(task: &Value) {
    let text = |key: &str| match &task[key] {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for (label, key) in [
        ("id", "id"),
        ("name", "name"),
        ("status", "status"),
        ("workflow", "workflow_id"),
        ("script", "script"),
        ("priority", "priority"),
        ("check mode", "check_mode"),
        ("created", "created_at"),
        ("started", "started_at"),
        ("finished", "finished_at"),
        ("exit code", "exit_code"),
        ("error", "error"),
    ] {
        println!("{label:<11} {}", text(key));
    }
    println!(
        "{:<11} {}/{}",
        "attempts",
        text("attempts"),
        text("max_attempts")
    );
    if !task["output"].is_null() {
        println!("output:");
        println!(
            "{}",
            serde_json::to_string_pretty(&task["output"]).unwrap_or_default()
        );
    }
}

pub async fn logs(client: &ClientArgs, args: LogsArgs) -> anyhow::Result<()> {
    use std::io::Write;
    let api = Api::new(client)?;
    let mut offset = 0u64;
    loop {
        // `follow=true`: the service streams the log as it is written and
        // ends the response once the task has ended.
        let mut query = vec![("offset", offset.to_string())];
        if args.follow {
            query.push(("follow", "true".to_owned()));
        }
        let mut response = api
            .send(Method::GET, &format!("/tasks/{}/logs", args.id), &query)
            .await?;
        let mut stdout = std::io::stdout();
        loop {
            match response.chunk().await {
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
        let task: Value = api
            .json(Method::GET, &format!("/tasks/{}", args.id), &[])
            .await?;
        let finished = task["status"]
            .as_str()
            .and_then(|s| s.parse::<orchestrator_core::TaskStatus>().ok())
            .is_none_or(|s| s.is_terminal());
        if finished {
            let rest = api
                .send(
                    Method::GET,
                    &format!("/tasks/{}/logs", args.id),
                    &[("offset", offset.to_string())],
                )
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
    let api = Api::new(client)?;
    let task: Value = api
        .json(Method::POST, &format!("/tasks/{}/cancel", args.id), &[])
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&task)?);
    } else if task["status"] == "cancelled" {
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
    let api = Api::new(client)?;
    match command {
        CheckpointCommand::Set(args) => {
            let value = serde_json::from_str(&args.value).unwrap_or(Value::String(args.value));
            let body = serde_json::json!({ args.key: value });
            api.send_body(
                Method::PUT,
                &format!("/tasks/{}/checkpoint", args.task),
                &[],
                Some(&body),
            )
            .await?;
            Ok(())
        }
        CheckpointCommand::Get(args) => {
            let saved: Value = api
                .json(
                    Method::GET,
                    &format!("/tasks/{}/checkpoint", args.task),
                    &[],
                )
                .await?;
            match args.key {
                Some(key) => match &saved[&key] {
                    Value::Null => bail!("checkpoint of task {} has no key `{key}`", args.task),
                    Value::String(s) => println!("{s}"),
                    other => println!("{other}"),
                },
                None => println!("{saved}"),
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
    let api = Api::new(client)?;
    match command {
        TokenCommand::Create { name, role, .. } => {
            let body = serde_json::json!({"name": name, "role": role});
            let created: Value = api
                .send_body(Method::POST, "/tokens", &[], Some(&body))
                .await?
                .json()
                .await
                .context("the service answered with unexpected JSON")?;
            println!(
                "created token {} ({}, {}); it is shown only this once:\n\n{}",
                created["id"].as_str().unwrap_or("?"),
                created["name"].as_str().unwrap_or("?"),
                created["role"].as_str().unwrap_or("?"),
                created["token"].as_str().unwrap_or("?"),
            );
        }
        TokenCommand::List => {
            let list: Value = api.json(Method::GET, "/tokens", &[]).await?;
            println!(
                "{:<32}  {:<20}  {:<8}  {:<25}  STATE",
                "ID", "NAME", "ROLE", "CREATED"
            );
            for token in list["tokens"].as_array().into_iter().flatten() {
                println!(
                    "{:<32}  {:<20}  {:<8}  {:<25}  {}",
                    token["id"].as_str().unwrap_or("?"),
                    token["name"].as_str().unwrap_or("?"),
                    token["role"].as_str().unwrap_or("?"),
                    token["created_at"].as_str().unwrap_or("?"),
                    token["revoked_at"]
                        .as_str()
                        .map_or_else(|| "active".to_owned(), |t| format!("revoked {t}")),
                );
            }
        }
        TokenCommand::Revoke { id } => {
            let path = format!("/tokens/{id}");
            let revoked: Value = api.json(Method::DELETE, &path, &[]).await?;
            println!(
                "revoked token {} ({})",
                revoked["id"].as_str().unwrap_or("?"),
                revoked["name"].as_str().unwrap_or("?")
            );
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
        let mut body = serde_json::Map::new();
        if let Some(templates) = list(templates) {
            body.insert("templates".into(), serde_json::json!(templates));
        }
        if let Some(origins) = list(origins) {
            body.insert("origins".into(), serde_json::json!(origins));
        }
        body
    };
    let api = Api::new(client)?;
    let shown = |info: &Value| {
        let names = |key: &str| {
            info["scope"][key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        };
        format!(
            "{:<32}  {:<25}  templates [{}]  origins [{}]",
            info["name"].as_str().unwrap_or("?"),
            info["updated_at"].as_str().unwrap_or("?"),
            names("templates"),
            names("origins"),
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
            let path = format!("/secrets/{name}");
            let info: Value = api
                .json_body(Method::PUT, &path, &[], Some(&Value::Object(body)))
                .await?;
            println!("{}", shown(&info));
        }
        SecretCommand::Scope {
            name,
            templates,
            origins,
        } => {
            let body = Value::Object(scope_body(templates, origins));
            let path = format!("/secrets/{name}");
            let info: Value = api
                .json_body(Method::PATCH, &path, &[], Some(&body))
                .await?;
            println!("{}", shown(&info));
        }
        SecretCommand::List => {
            let list: Value = api.json(Method::GET, "/secrets", &[]).await?;
            println!("{:<32}  {:<25}  SCOPE", "NAME", "UPDATED");
            for info in list["secrets"].as_array().into_iter().flatten() {
                println!("{}", shown(info));
            }
        }
        SecretCommand::Delete { name } => {
            api.send(Method::DELETE, &format!("/secrets/{name}"), &[])
                .await?;
            println!("deleted secret {name}");
        }
    }
    Ok(())
}

pub async fn audit(client: &ClientArgs, args: AuditArgs) -> anyhow::Result<()> {
    let api = Api::new(client)?;
    let mut query = vec![
        ("limit", args.limit.to_string()),
        ("offset", args.offset.to_string()),
    ];
    for (name, value) in [
        ("since", args.since),
        ("until", args.until),
        ("actor", args.actor),
        ("action", args.action),
        ("target", args.target),
    ] {
        if let Some(value) = value {
            query.push((name, value));
        }
    }
    let page: Value = api.json(Method::GET, "/audit", &query).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    for record in page["records"].as_array().into_iter().flatten() {
        println!(
            "{}  {:<16} {:<26} {:<8} {:>3}  {}",
            record["time"].as_str().unwrap_or("?"),
            record["actor"].as_str().unwrap_or("?"),
            record["action"].as_str().unwrap_or("?"),
            record["outcome"].as_str().unwrap_or("?"),
            record["status"],
            record["target"].as_str().unwrap_or("-"),
        );
    }
    println!(
        "{} of {} records",
        page["records"].as_array().map_or(0, Vec::len),
        page["total"]
    );
    Ok(())
}

pub async fn prune(client: &ClientArgs, args: PruneArgs) -> anyhow::Result<()> {
    if args.older_than.is_none() && args.audit_older_than.is_none() {
        anyhow::bail!("say what to prune: --older-than PERIOD and/or --audit-older-than PERIOD");
    }
    let api = Api::new(client)?;
    let body = serde_json::json!({
        "older_than": args.older_than.map(|k| k.to_string()),
        "audit_older_than": args.audit_older_than.map(|k| k.to_string()),
        "dry_run": args.dry_run,
    });
    let report: Value = api
        .send_body(Method::POST, "/prune", &[], Some(&body))
        .await?
        .json()
        .await
        .context("the service answered with unexpected JSON")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let verb = if args.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    println!(
        "{verb} {} finished workflows ({} tasks) and {} audit records",
        report["workflows"], report["tasks"], report["audit_records"]
    );
    Ok(())
}
