//! `orchestrator schedule …`: recurring runs of a template, through the
//! service's `/schedules` routes.

use orchestrator_api::client::{Client, ScheduleView};
use serde_json::{Map, Value, json};

use crate::cli::{ClientArgs, ScheduleCommand, ScheduleCreateArgs};
use crate::client::{connect, print_json, print_table, shown};
use crate::workflows::parse_inputs;

pub async fn run(client: &ClientArgs, command: ScheduleCommand) -> anyhow::Result<()> {
    let api = connect(client)?;
    match command {
        ScheduleCommand::Create(args) => {
            let json = args.json;
            let body = create_body(*args)?;
            print_schedule(&api.create_schedule(&body).await?, json)
        }
        ScheduleCommand::List(args) => {
            let list = api.list_schedules().await?;
            if args.json {
                return print_json(&list);
            }
            let rows: Vec<[String; 6]> = list
                .schedules
                .iter()
                .map(|s| {
                    [
                        shown(&s.schedule.id),
                        s.schedule.name.clone(),
                        s.schedule.cron.clone(),
                        s.schedule.timezone.clone(),
                        if s.schedule.paused {
                            "paused".to_owned()
                        } else {
                            shown(&s.next_due)
                        },
                        shown(&s.schedule.overlap),
                    ]
                })
                .collect();
            print_table(
                ["ID", "NAME", "CRON", "TIMEZONE", "NEXT DUE", "OVERLAP"],
                &rows,
            );
            Ok(())
        }
        ScheduleCommand::Show(args) => print_schedule(&api.schedule(&args.id).await?, args.json),
        ScheduleCommand::Pause(args) => set_paused(&api, &args.id, true, args.json).await,
        ScheduleCommand::Resume(args) => set_paused(&api, &args.id, false, args.json).await,
        ScheduleCommand::Delete(args) => {
            api.delete_schedule(&args.id).await?;
            println!("schedule {} deleted", args.id);
            Ok(())
        }
    }
}

async fn set_paused(api: &Client, id: &str, paused: bool, json: bool) -> anyhow::Result<()> {
    let schedule = api.update_schedule(id, &json!({"paused": paused})).await?;
    print_schedule(&schedule, json)
}

fn create_body(args: ScheduleCreateArgs) -> anyhow::Result<Value> {
    let mut body = Map::new();
    body.insert("template".into(), json!(args.template));
    body.insert("cron".into(), json!(args.cron));
    body.insert("vars".into(), Value::Object(parse_inputs(&args.inputs)?));
    body.insert("paused".into(), json!(args.paused));
    for (key, value) in [
        ("timezone", args.timezone),
        ("name", args.name),
        ("overlap", args.overlap),
        ("catch_up", args.catch_up),
        ("start_at", args.start_at),
        ("end_at", args.end_at),
    ] {
        if let Some(value) = value {
            body.insert(key.into(), json!(value));
        }
    }
    if let Some(secs) = args.catch_up_window_secs {
        body.insert("catch_up_window_secs".into(), json!(secs));
    }
    Ok(Value::Object(body))
}

/// The schedule, then its newest runs, one line each.
fn print_schedule(view: &ScheduleView, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(view);
    }
    let schedule = &view.schedule;
    println!(
        "schedule {}  {}  [{}]  template {}",
        shown(&schedule.id),
        schedule.name,
        if schedule.paused { "paused" } else { "active" },
        schedule.template,
    );
    println!(
        "cron `{}` in {}; overlap {}, catch-up {} within {}s",
        schedule.cron,
        schedule.timezone,
        shown(&schedule.overlap),
        shown(&schedule.catch_up),
        schedule.catch_up_window_secs,
    );
    println!("next due: {}", shown(&view.next_due));
    let rows: Vec<[String; 4]> = view
        .runs
        .iter()
        .map(|r| {
            let detail = match (&r.workflow_id, &r.reason) {
                (Some(id), _) => shown(id),
                (None, Some(reason)) => reason.clone(),
                (None, None) => "-".into(),
            };
            [shown(&r.due), shown(&r.state), r.node.clone(), detail]
        })
        .collect();
    if !rows.is_empty() {
        print_table(["DUE", "STATE", "NODE", "WORKFLOW / REASON"], &rows);
    }
    Ok(())
}
