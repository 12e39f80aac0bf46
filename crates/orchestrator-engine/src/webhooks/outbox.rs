//! What goes into the outbox: a delivery stored for each event a
//! subscription wants (the listener, and a catch-up for what the bus did
//! not bring) and for each missed schedule run (the schedule watch).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::event::{Event, EventKind};
use orchestrator_core::schedule::ClaimState;
use orchestrator_core::webhook::{self, Delivery, DeliveryStatus, EventFields, Subscription};
use orchestrator_core::{Task, TaskStatus, Workflow, WorkflowStatus};
use orchestrator_storage::DeliveryQuery;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::Result;

use super::Webhooks;

/// Claims per schedule the schedule watch reads each round.
const CLAIMS_LOOKED_AT: usize = 10;
/// How far back a catch-up looks for events the bus did not bring.
const CATCH_UP: Duration = Duration::from_secs(3600);
/// The newest finished workflows of each status (and failed tasks) a
/// catch-up reads.
const CATCH_UP_RECORDS: usize = 200;

impl Webhooks {
    pub(super) async fn listen(
        self: Arc<Self>,
        mut received: crate::events::Subscription,
        stopping: CancellationToken,
    ) {
        let mut behind = true;
        loop {
            if behind {
                match self.catch_up().await {
                    Ok(()) => behind = false,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot catch up on webhook events; trying again at the next event")
                    }
                }
            }
            let event = tokio::select! {
                () = stopping.cancelled() => return,
                next = received.recv() => match next {
                    Some(event) => event,
                    None => return,
                },
            };
            if crate::events::is_resync(&event) {
                behind = true;
                continue;
            }
            let Some(event_type) = event_type_of(&event) else {
                continue;
            };
            // Stored before the next event is taken; a storage failure
            // is retried, so a short outage loses no notification.
            let mut retries = 0u32;
            while let Err(e) = self.enqueue_event(event_type, &event).await {
                retries += 1;
                tracing::warn!(error = %e, event_type, retries, "cannot store a webhook delivery; retrying");
                let wait = self.config.backoff.delay(retries, 0.5);
                tokio::select! {
                    () = stopping.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    }

    async fn enqueue_event(&self, event_type: &'static str, event: &Event) -> Result<()> {
        let subscriptions = self.wanting(event_type).await?;
        if subscriptions.is_empty() {
            return Ok(());
        }
        let Some(workflow_id) = event.workflow_id else {
            return Ok(());
        };
        let Some(workflow) = self.store.tasks().get_workflow(workflow_id).await? else {
            return Ok(());
        };
        let task = match event.task_id {
            Some(id) => match self.store.tasks().get_task(id).await? {
                Some(task) => Some(task),
                None => return Ok(()),
            },
            None => None,
        };
        self.enqueue_about(
            &subscriptions,
            event_type,
            &workflow,
            task.as_ref(),
            event.time,
        )
        .await
    }

    /// Stores the deliveries of an event about a workflow (and one of its
    /// tasks, for a step's event).
    async fn enqueue_about(
        &self,
        subscriptions: &[Subscription],
        event_type: &'static str,
        workflow: &Workflow,
        task: Option<&Task>,
        seen: DateTime<Utc>,
    ) -> Result<()> {
        let (key, fields) = self.describe(event_type, workflow, task, seen);
        let happened = task
            .and_then(|t| t.finished_at)
            .or(workflow.finished_at)
            .unwrap_or(seen);
        self.enqueue(subscriptions, event_type, &key, fields, happened)
            .await
    }

    /// After a start, and after the bus dropped events for the listener
    /// (a `resync`): the events of the last [`CATCH_UP`] that the bus did
    /// not bring, read from the newest finished workflows and failed
    /// tasks. Their deliveries' ids are those the live events would have
    /// made, so one already stored is not stored again.
    async fn catch_up(&self) -> Result<()> {
        let window = CATCH_UP.min(self.config.retain);
        let since = chrono::Duration::from_std(window)
            .ok()
            .and_then(|w| Utc::now().checked_sub_signed(w))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let recent = |at: Option<DateTime<Utc>>| at.is_some_and(|at| at >= since);
        for (status, event_type) in [
            (WorkflowStatus::Completed, "workflow.completed"),
            (WorkflowStatus::Failed, "workflow.failed"),
            (WorkflowStatus::Cancelled, "workflow.cancelled"),
        ] {
            let subscriptions = self.wanting(event_type).await?;
            if subscriptions.is_empty() {
                continue;
            }
            let query = orchestrator_storage::WorkflowQuery {
                status: Some(status),
                limit: CATCH_UP_RECORDS,
                ..Default::default()
            };
            for workflow in self.store.tasks().list_workflows(&query).await?.items {
                if recent(workflow.finished_at) {
                    self.enqueue_about(&subscriptions, event_type, &workflow, None, Utc::now())
                        .await?;
                }
            }
        }
        let subscriptions = self.wanting("step.failed").await?;
        if !subscriptions.is_empty() {
            let query = orchestrator_storage::TaskQuery {
                status: Some(TaskStatus::Failed),
                limit: CATCH_UP_RECORDS,
                ..orchestrator_storage::TaskQuery::default()
            };
            for task in self.store.tasks().list_tasks(&query).await?.items {
                if !recent(task.finished_at) {
                    continue;
                }
                if let Some(workflow) = self.store.tasks().get_workflow(task.workflow_id).await? {
                    self.enqueue_about(
                        &subscriptions,
                        "step.failed",
                        &workflow,
                        Some(&task),
                        Utc::now(),
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }

    async fn wanting(&self, event_type: &str) -> Result<Vec<Subscription>> {
        let all = self.store.webhooks().subscriptions().await?;
        Ok(all.into_iter().filter(|s| s.wants(event_type)).collect())
    }

    /// The event's identity (the same on every node that sees it, and on
    /// a catch-up) and its fields.
    fn describe(
        &self,
        event_type: &'static str,
        workflow: &Workflow,
        task: Option<&Task>,
        seen: DateTime<Utc>,
    ) -> (String, EventFields) {
        let key = match task {
            Some(task) => format!("{event_type}:{}:{}:{}", task.id, task.reruns, task.attempts),
            None => format!(
                "{event_type}:{}:{}",
                workflow.id,
                workflow
                    .finished_at
                    .map(|t| t.timestamp_micros())
                    .unwrap_or_default()
            ),
        };
        let happened = task
            .and_then(|t| t.finished_at)
            .or(workflow.finished_at)
            .unwrap_or(seen);
        let mut fields = self.workflow_fields(event_type, happened, workflow);
        if let Some(task) = task {
            task_fields(&mut fields, workflow, task);
        }
        (key, fields)
    }

    fn workflow_fields(
        &self,
        event_type: &'static str,
        time: DateTime<Utc>,
        workflow: &Workflow,
    ) -> EventFields {
        let mut fields = EventFields::new();
        fields.insert("type", event_type.to_owned());
        fields.insert("timestamp", time.to_rfc3339());
        fields.insert("node", self.node_id.clone());
        fields.insert("workflow_id", workflow.id.to_string());
        fields.insert("workflow_name", workflow.name.clone());
        fields.insert("workflow_kind", workflow.kind.clone());
        fields.insert("workflow_status", workflow.status.as_str().to_owned());
        let verb = match workflow.status {
            WorkflowStatus::Completed => "completed",
            WorkflowStatus::Failed => "failed",
            WorkflowStatus::Cancelled => "was cancelled",
            other => other.as_str(),
        };
        fields.insert("summary", format!("workflow `{}` {verb}", workflow.name));
        if let Some(halt) = &workflow.halt {
            fields.insert("error", halt.reason.clone());
        }
        fields
    }

    /// Stores one delivery per subscription, each once: `key` names the
    /// event, and the delivery id is derived from it. A subscription
    /// created after the event does not get it.
    async fn enqueue(
        &self,
        subscriptions: &[Subscription],
        event_type: &str,
        key: &str,
        mut fields: EventFields,
        happened: DateTime<Utc>,
    ) -> Result<()> {
        let redactor = self.secrets.redactor();
        for value in fields.values_mut() {
            *value = redactor.text(value);
        }
        let now = Utc::now();
        let mut stored = false;
        for subscription in subscriptions {
            if subscription.created_at > happened {
                continue;
            }
            let id = delivery_id(&subscription.id, key);
            fields.insert("id", id.clone());
            let body = webhook::render_body(subscription.body_template.as_ref(), &fields);
            // The template is the admin's text: a secret value written
            // into it is redacted too.
            let body = redactor.strings(body).to_string();
            let mut delivery = Delivery::new(id, subscription, event_type, body, now);
            if self.outbox_full().await? {
                delivery.give_up(
                    format!(
                        "the outbox is full ({} pending deliveries); re-send it later",
                        self.config.max_pending
                    ),
                    now,
                );
            }
            stored |= self.store.webhooks().insert_delivery(&delivery).await?;
        }
        if stored {
            self.wake.notify_one();
        }
        Ok(())
    }

    async fn outbox_full(&self) -> Result<bool> {
        let query = DeliveryQuery {
            status: Some(DeliveryStatus::Pending),
            limit: 0,
            ..Default::default()
        };
        let pending = self.store.webhooks().deliveries(&query).await?.total;
        Ok(pending >= self.config.max_pending)
    }

    /// Looks at the newest claims of each schedule for missed due times.
    pub(super) async fn watch_schedules(self: Arc<Self>, stopping: CancellationToken) {
        loop {
            if let Err(e) = self.look_for_missed_runs().await {
                tracing::warn!(error = %e, "cannot look for missed schedule runs");
            }
            tokio::select! {
                () = stopping.cancelled() => return,
                () = tokio::time::sleep(self.config.poll) => {}
            }
        }
    }

    async fn look_for_missed_runs(&self) -> Result<()> {
        const TYPE: &str = "schedule.missed";
        let subscriptions = self.wanting(TYPE).await?;
        if subscriptions.is_empty() {
            return Ok(());
        }
        for schedule in self.store.schedules().schedules().await? {
            let claims = self
                .store
                .schedules()
                .claims(schedule.id, CLAIMS_LOOKED_AT)
                .await?;
            for claim in claims.iter().filter(|c| c.state == ClaimState::Missed) {
                let missed = claim.missed.max(1);
                let mut fields = EventFields::new();
                fields.insert("type", TYPE.to_owned());
                fields.insert("timestamp", claim.claimed_at.to_rfc3339());
                fields.insert("node", self.node_id.clone());
                fields.insert("schedule_id", schedule.id.to_string());
                fields.insert("schedule_name", schedule.name.clone());
                fields.insert("missed", missed.to_string());
                fields.insert(
                    "summary",
                    format!("schedule `{}` missed {missed} run(s)", schedule.name),
                );
                if let Some(reason) = &claim.reason {
                    fields.insert("error", reason.clone());
                }
                let key = format!("{TYPE}:{}", claim.key());
                self.enqueue(&subscriptions, TYPE, &key, fields, claim.claimed_at)
                    .await?;
            }
        }
        Ok(())
    }
}

/// The event type an event is, for subscriptions; `None` for the events
/// no subscription can name.
fn event_type_of(event: &Event) -> Option<&'static str> {
    match event.kind {
        EventKind::WorkflowStatusChanged => match event.status.as_deref()? {
            "completed" => Some("workflow.completed"),
            "failed" => Some("workflow.failed"),
            "cancelled" => Some("workflow.cancelled"),
            _ => None,
        },
        EventKind::Failed if event.task_id.is_some() => Some("step.failed"),
        EventKind::ApprovalRequested if event.task_id.is_some() => Some("approval.requested"),
        _ => None,
    }
}

fn task_fields(fields: &mut EventFields, workflow: &Workflow, task: &Task) {
    let step = task
        .step
        .ref_name
        .clone()
        .unwrap_or_else(|| task.name.clone());
    fields.insert("task_id", task.id.to_string());
    fields.insert("step", step.clone());
    let error = task.error.clone().unwrap_or_default();
    let verb = if task.status == TaskStatus::Failed {
        "failed"
    } else {
        task.status.as_str()
    };
    let mut summary = if task.approval.as_ref().is_some_and(|gate| gate.is_waiting()) {
        format!(
            "approval `{step}` of workflow `{}` waits for a decision",
            workflow.name
        )
    } else {
        format!("step `{step}` of workflow `{}` {verb}", workflow.name)
    };
    if !error.is_empty() {
        summary.push_str(": ");
        summary.push_str(&error);
    }
    fields.insert("summary", summary);
    fields.insert("error", error);
}

/// A delivery's id: the same for a subscription and an event on every
/// node, so the outbox stores it once.
fn delivery_id(subscription: &str, event_key: &str) -> String {
    let digest = Sha256::digest(format!("{subscription}\n{event_key}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("msg_{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(pairs: &[(&'static str, &str)]) -> EventFields {
        pairs
            .iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect::<std::collections::BTreeMap<_, _>>()
    }

    #[test]
    fn delivery_ids_depend_on_subscription_and_event_only() {
        let a = delivery_id("s1", "workflow.failed:w:t");
        assert_eq!(a, delivery_id("s1", "workflow.failed:w:t"));
        assert_ne!(a, delivery_id("s2", "workflow.failed:w:t"));
        assert_ne!(a, delivery_id("s1", "workflow.failed:w:u"));
        assert!(a.starts_with("msg_") && a.len() == 36, "{a}");
        assert!(!a.contains('.'), "the signed content is split on dots");
    }

    #[test]
    fn events_map_to_event_types() {
        let event = |kind, status: &str, task: bool| Event {
            seq: 1,
            node: "n".into(),
            time: Utc::now(),
            kind,
            workflow_id: Some(orchestrator_core::WorkflowId::new()),
            task_id: task.then(orchestrator_core::TaskId::new),
            status: Some(status.into()),
            attempt: None,
            outcome: None,
            retry_at: None,
            runner: None,
            log_length: None,
            missed: None,
            migration: None,
            reason: None,
            digest: None,
            lock: None,
            environment_id: None,
            schedule_id: None,
        };
        let of = |kind, status, task| event_type_of(&event(kind, status, task));
        assert_eq!(
            of(EventKind::WorkflowStatusChanged, "failed", false),
            Some("workflow.failed")
        );
        assert_eq!(
            of(EventKind::WorkflowStatusChanged, "completed", false),
            Some("workflow.completed")
        );
        assert_eq!(
            of(EventKind::WorkflowStatusChanged, "cancelled", false),
            Some("workflow.cancelled")
        );
        assert_eq!(of(EventKind::WorkflowStatusChanged, "running", false), None);
        assert_eq!(of(EventKind::Failed, "failed", true), Some("step.failed"));
        assert_eq!(
            of(EventKind::ApprovalRequested, "pending", true),
            Some("approval.requested")
        );
        assert_eq!(of(EventKind::AttemptEnded, "retry_waiting", true), None);
        for (name, _) in [("workflow.completed", ()), ("step.failed", ())] {
            assert!(webhook::EVENT_TYPES.contains(&name));
        }
    }

    #[test]
    fn secret_values_are_redacted_from_fields_and_templates() {
        let redactor = orchestrator_executor::Redactor::new([orchestrator_executor::KnownSecret {
            name: "db".into(),
            value: "hunter2-very-secret".into(),
            origins: Vec::new(),
        }]);
        let mut fields = fields_of(&[
            ("type", "step.failed"),
            ("error", "login failed for password hunter2-very-secret"),
        ]);
        for value in fields.values_mut() {
            *value = redactor.text(value);
        }
        let template = serde_json::json!({"text": "${event.error} (hunter2-very-secret)"});
        let body = redactor
            .strings(webhook::render_body(Some(&template), &fields))
            .to_string();
        assert!(!body.contains("hunter2-very-secret"), "{body}");
        assert!(body.contains(crate::secrets::REDACTED), "{body}");
    }
}
