//! `orchestrator schedule …`: recurring runs of a template, through the
//! service's `/schedules` routes.

use reqwest::Method;
use serde_json::{Value, json};

use crate::cli::{ClientArgs, ScheduleCommand, ScheduleCreateArgs};
use crate::client::{Api, print_table};
use crate::workflows::parse_inputs;

pub async fn run(client: &ClientArgs, command: ScheduleCommand) -> anyhow::Result<()> {
    let api = Api::new(client)?;
    match command {
        ScheduleCommand::Create(args) => {
            let json = args.json;
            let body = create_body(*args)?;
            let schedule = send(&api, Method::POST, "/schedules", Some(&body)).await?;
            print_schedule(&schedule, json)
        }
        ScheduleCommand::List(args) => {
            let list: Value = api.json(Method::GET, "/schedules", &[]).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(());
            }
            let rows: Vec<[String; 6]> = list["schedules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|s| {
                    [
                        text(&s["id"]),
                        text(&s["name"]),
                        text(&s["cron"]),
                        text(&s["timezone"]),
                        if s["paused"] == true {
                            "paused".to_owned()
                        } else {
                            text(&s["next_due"])
                        },
                        text(&s["overlap"]),
                    ]
                })
                .collect();
            print_table(
                ["ID", "NAME", "CRON", "TIMEZONE", "NEXT DUE", "OVERLAP"],
                &rows,
            );
            Ok(())
        }
        ScheduleCommand::Show(args) => {
            let schedule: Value = api
                .json(Method::GET, &format!("/schedules/{}", args.id), &[])
                .await?;
            print_schedule(&schedule, args.json)
        }
        ScheduleCommand::Pause(args) => set_paused(&api, &args.id, true, args.json).await,
        ScheduleCommand::Resume(args) => set_paused(&api, &args.id, false, args.json).await,
        ScheduleCommand::Delete(args) => {
            api.send(Method::DELETE, &format!("/schedules/{}", args.id), &[])
                .await?;
            println!("schedule {} deleted", args.id);
            Ok(())
        }
    }
}

async fn set_paused(api: &Api, id: &str, paused: bool, json: bool) -> anyhow::Result<()> {
    let body = json!({"paused": paused});
    let schedule = send(api, Method::PATCH, &format!("/schedules/{id}"), Some(&body)).await?;
    print_schedule(&schedule, json)
}

async fn send(
    api: &Api,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> anyhow::Result<Value> {
    Ok(api.send_body(method, path, &[], body).await?.json().await?)
}

fn create_body(args: ScheduleCreateArgs) -> anyhow::Result<Value> {
    let mut body = json!({
        "template": args.template,
        "cron": args.cron,
        "vars": parse_inputs(&args.inputs)?,
        "paused": args.paused,
    });
    for (key, value) in [
        ("timezone", args.timezone),
        ("name", args.name),
        ("overlap", args.overlap),
        ("catch_up", args.catch_up),
        ("start_at", args.start_at),
        ("end_at", args.end_at),
    ] {
        if let Some(value) = value {
            body[key] = json!(value);
        }
    }
    if let Some(secs) = args.catch_up_window_secs {
        body["catch_up_window_secs"] = json!(secs);
    }
    Ok(body)
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The schedule, then its newest runs, one line each.
fn print_schedule(schedule: &Value, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(schedule)?);
        return Ok(());
    }
    println!(
        "schedule {}  {}  [{}]  template {}",
        text(&schedule["id"]),
        text(&schedule["name"]),
        if schedule["paused"] == true {
            "paused"
        } else {
            "active"
        },
        text(&schedule["template"]),
    );
    println!(
        "cron `{}` in {}; overlap {}, catch-up {} within {}s",
        text(&schedule["cron"]),
        text(&schedule["timezone"]),
        text(&schedule["overlap"]),
        text(&schedule["catch_up"]),
        text(&schedule["catch_up_window_secs"]),
    );
    println!("next due: {}", text(&schedule["next_due"]));
    let rows: Vec<[String; 4]> = schedule["runs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let detail = match (&r["workflow_id"], &r["reason"]) {
                (Value::String(id), _) => id.clone(),
                (_, Value::String(reason)) => reason.clone(),
                _ => "-".into(),
            };
            [text(&r["due"]), text(&r["state"]), text(&r["node"]), detail]
        })
        .collect();
    if !rows.is_empty() {
        print_table(["DUE", "STATE", "NODE", "WORKFLOW / REASON"], &rows);
    }
    Ok(())
}
