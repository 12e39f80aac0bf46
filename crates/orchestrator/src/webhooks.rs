//! `orchestrator webhook …`: notification subscriptions, their delivery
//! log and re-sends, through the service's `/webhooks` and
//! `/webhook-deliveries` routes.

use anyhow::Context;
use orchestrator_api::client::{DeliveryFilter, DeliveryView, NewWebhook};

use crate::cli::{ClientArgs, WebhookCommand};
use crate::client::{connect, print_json, print_table, shown};

pub async fn run(client: &ClientArgs, command: WebhookCommand) -> anyhow::Result<()> {
    let api = connect(client)?;
    match command {
        WebhookCommand::Add(args) => {
            let body_template = match &args.body_template {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read {}", path.display()))?;
                    Some(serde_json::from_str(&text).with_context(|| {
                        format!("--body-template: {} is not JSON", path.display())
                    })?)
                }
                None => None,
            };
            let created = api
                .create_webhook(&NewWebhook {
                    url: args.target,
                    events: args.events,
                    body_template,
                    description: args.description,
                })
                .await?;
            if args.json {
                return print_json(&created);
            }
            println!("webhook {} created", created.subscription.id);
            println!(
                "signing secret (shown once, store it now): {}",
                created.secret
            );
            Ok(())
        }
        WebhookCommand::List(args) => {
            let list = api.list_webhooks().await?;
            if args.json {
                return print_json(&list);
            }
            let rows: Vec<[String; 4]> = list
                .webhooks
                .iter()
                .map(|w| {
                    [
                        w.id.clone(),
                        w.url.clone(),
                        w.events.join(","),
                        shown(&w.created_at),
                    ]
                })
                .collect();
            print_table(["ID", "URL", "EVENTS", "CREATED"], &rows);
            Ok(())
        }
        WebhookCommand::Rm { id } => {
            api.delete_webhook(&id).await?;
            println!("webhook {id} deleted");
            Ok(())
        }
        WebhookCommand::Deliveries(args) => {
            let page = api
                .webhook_deliveries(&DeliveryFilter {
                    webhook: args.webhook,
                    status: args.status,
                    limit: args.limit,
                    offset: None,
                })
                .await?;
            if args.json {
                return print_json(&page);
            }
            for delivery in &page.deliveries {
                print_delivery(delivery);
            }
            println!("{} of {} deliveries", page.deliveries.len(), page.total);
            Ok(())
        }
        WebhookCommand::Resend { id, json } => {
            let delivery = api.resend_delivery(&id).await?;
            if json {
                return print_json(&delivery);
            }
            println!("delivery {} is back in the outbox", delivery.id);
            Ok(())
        }
    }
}

fn print_delivery(delivery: &DeliveryView) {
    println!(
        "{}  {}  {}  {}  {}",
        delivery.id,
        delivery.event_type,
        shown(&delivery.status),
        delivery.subscription_id,
        shown(&delivery.created_at),
    );
    for attempt in &delivery.attempts {
        let outcome = match (attempt.status_code, &attempt.error) {
            (Some(code), _) => code.to_string(),
            (None, Some(error)) => error.clone(),
            (None, None) => "-".to_owned(),
        };
        println!(
            "    {}  {outcome}  {} ms",
            shown(&attempt.at),
            attempt.duration_ms
        );
    }
}
