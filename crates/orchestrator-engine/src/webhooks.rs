//! Notifications: webhook subscriptions, the durable outbox their
//! deliveries go through, and the Standard Webhooks signature of each
//! request (see `docs/notifications.md`).
//!
//! Three loops, each resuming from what is stored:
//! - the *listener* reads the event bus; for each event a subscription
//!   wants it stores a delivery (insert-if-absent, under an id derived
//!   from the subscription and the event, so nodes that each see the
//!   event store it once) before it takes the next event;
//! - the *schedule watch* looks at the newest claims of every schedule
//!   and stores a delivery for each `missed` one (the claim is stored
//!   before it is looked at, so a restart misses none);
//! - the *sender* takes due deliveries from the outbox, claims each by
//!   compare-and-set (a lease of one request's time), signs and sends
//!   it, and stores the attempt in the delivery's log: delivered on a
//!   2xx, otherwise retried with backoff until the round's attempts are
//!   spent. A crash after a send and before its record sends it again
//!   when the lease ends: at least once.
//!
//! The engine knows no HTTP: a [`WebhookSender`] (the `orchestrator-http`
//! crate's) sends, and says which targets its allowlist lets through.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use orchestrator_core::backoff::Backoff;
use orchestrator_core::event::{Event, EventKind};
use orchestrator_core::schedule::ClaimState;
use orchestrator_core::template::limits::{
    MAX_WEBHOOK_ATTEMPTS, MAX_WEBHOOK_DESCRIPTION_CHARS, MAX_WEBHOOK_SUBSCRIPTIONS,
};
use orchestrator_core::webhook::{
    self, Delivery, DeliveryAttempt, DeliveryStatus, EventFields, Subscription,
};
use orchestrator_core::{Task, TaskStatus, Workflow, WorkflowStatus};
use orchestrator_storage::{DeliveryQuery, Page, Storage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::events::EventBus;
use crate::secrets::Secrets;
use crate::{Error, Result};

/// Bytes of a new signing secret (the spec asks for 24 to 64).
const SECRET_BYTES: usize = 32;
/// Deliveries the sender takes from the outbox per round.
const BATCH: usize = 64;
/// Claims per schedule the schedule watch reads each round.
const CLAIMS_LOOKED_AT: usize = 10;
/// How often retention looks through the delivery log.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// How far back a catch-up looks for events the bus did not bring.
const CATCH_UP: Duration = Duration::from_secs(3600);
/// The newest finished workflows of each status (and failed tasks) a
/// catch-up reads.
const CATCH_UP_RECORDS: usize = 200;

/// How deliveries are sent, retried and kept.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Attempts per round (a delivery's first round, and each re-send),
    /// at most [`MAX_WEBHOOK_ATTEMPTS`].
    pub max_attempts: u32,
    /// The wait before the n-th retry.
    pub backoff: Backoff,
    /// How long one request may take.
    pub request_timeout: Duration,
    /// How long delivered and failed deliveries stay in the log.
    pub retain: Duration,
    /// The most deliveries kept in the log (the oldest finished go first).
    pub max_deliveries: usize,
    /// The most pending deliveries: past it, a new one is stored as
    /// failed ("outbox full") instead of queued, and can be re-sent.
    pub max_pending: usize,
    /// How often the outbox and the schedules' claims are looked at when
    /// nothing wakes the loops (other nodes' deliveries, due retries).
    pub poll: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            max_attempts: 8,
            backoff: Backoff::doubling(Duration::from_secs(1), Duration::from_secs(600)),
            request_timeout: Duration::from_secs(10),
            retain: Duration::from_secs(7 * 24 * 3600),
            max_deliveries: 10_000,
            max_pending: 10_000,
            poll: Duration::from_secs(1),
        }
    }
}

/// One signed request to send.
#[derive(Debug, Clone)]
pub struct WebhookRequest {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
    pub timeout: Duration,
}

/// What became of a request: the answer's status code, or why none came.
pub type SendOutcome = std::result::Result<u16, String>;

/// Sends webhook requests (a POST each, no redirects followed), only to
/// the targets it allows.
#[async_trait]
pub trait WebhookSender: Send + Sync {
    /// Whether `url` may be reached; the reason, naming the host, if not.
    fn check_target(&self, url: &str) -> std::result::Result<(), String>;

    async fn send(&self, request: WebhookRequest) -> SendOutcome;
}

/// A subscription as shown: never its secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SubscriptionView {
    pub id: String,
    pub url: String,
    pub events: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_template: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl SubscriptionView {
    fn of(subscription: Subscription) -> SubscriptionView {
        SubscriptionView {
            id: subscription.id,
            url: subscription.url,
            events: subscription.events,
            body_template: subscription.body_template,
            description: subscription.description,
            created_at: subscription.created_at,
        }
    }
}

/// A new subscription, with its signing secret: the only time it is shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedSubscription {
    pub subscription: SubscriptionView,
    /// `whsec_` and the base64 of the key: verify `webhook-signature`
    /// with it. Shown once; store it now.
    pub secret: String,
}

/// A delivery as the log shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeliveryView {
    /// Sent as `webhook-id`.
    pub id: String,
    pub subscription_id: String,
    pub event_type: String,
    pub url: String,
    pub status: DeliveryStatus,
    /// The body as sent (secret values redacted).
    pub body: String,
    /// The newest attempts, oldest first.
    pub attempts: Vec<DeliveryAttempt>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl DeliveryView {
    fn of(delivery: Delivery) -> DeliveryView {
        DeliveryView {
            id: delivery.id,
            subscription_id: delivery.subscription_id,
            event_type: delivery.event_type,
            url: delivery.url,
            status: delivery.status,
            body: delivery.body,
            attempts: delivery.attempts,
            next_attempt_at: delivery.next_attempt_at,
            created_at: delivery.created_at,
            updated_at: delivery.updated_at,
        }
    }
}

/// `POST /webhooks`.
#[derive(Debug, Clone, Default)]
pub struct SubscriptionRequest {
    pub url: String,
    pub events: Vec<String>,
    pub body_template: Option<Value>,
    pub description: Option<String>,
}

/// The service's webhooks: subscriptions, the outbox and its sender.
pub struct Webhooks {
    store: Storage,
    secrets: Arc<Secrets>,
    sender: Arc<dyn WebhookSender>,
    config: WebhookConfig,
    node_id: String,
    /// Wakes the sender when a delivery is stored or re-sent here.
    wake: Notify,
}

impl Webhooks {
    pub(crate) fn new(
        store: Storage,
        secrets: Arc<Secrets>,
        sender: Arc<dyn WebhookSender>,
        config: WebhookConfig,
        node_id: String,
    ) -> Webhooks {
        let config = WebhookConfig {
            max_attempts: config.max_attempts.clamp(1, MAX_WEBHOOK_ATTEMPTS),
            ..config
        };
        Webhooks {
            store,
            secrets,
            sender,
            config,
            node_id,
            wake: Notify::new(),
        }
    }

    /// Starts the listener, the schedule watch and the sender, until
    /// `stopping`.
    pub(crate) fn start(self: &Arc<Self>, events: &EventBus, stopping: CancellationToken) {
        // Subscribed before this returns: no event after the start is lost.
        let received = events.subscribe();
        tokio::spawn(self.clone().listen(received, stopping.clone()));
        tokio::spawn(self.clone().watch_schedules(stopping.clone()));
        tokio::spawn(self.clone().send_due(stopping));
    }

    /// Stores a subscription; its secret is in the answer and nowhere
    /// else. The target must pass the sender's allowlist.
    pub async fn create(&self, request: SubscriptionRequest) -> Result<CreatedSubscription> {
        let invalid = |e: webhook::SubscriptionError| Error::validation(e.field, e.message);
        webhook::check_url(&request.url).map_err(invalid)?;
        self.sender
            .check_target(&request.url)
            .map_err(|why| Error::validation("url", why))?;
        webhook::check_event_types(&request.events).map_err(invalid)?;
        if let Some(template) = &request.body_template {
            webhook::check_body_template(template).map_err(invalid)?;
        }
        if let Some(description) = &request.description {
            // Counted in characters, as the API document's `maxLength` is.
            let length = description.chars().count();
            if length > MAX_WEBHOOK_DESCRIPTION_CHARS {
                return Err(Error::validation(
                    "description",
                    format!(
                        "{length} characters is more than the maximum of \
                         {MAX_WEBHOOK_DESCRIPTION_CHARS}"
                    ),
                ));
            }
        }
        let existing = self.store.webhooks().subscriptions().await?.len();
        if existing >= MAX_WEBHOOK_SUBSCRIPTIONS {
            return Err(Error::Conflict(format!(
                "there are {existing} webhook subscriptions, the maximum of \
                 {MAX_WEBHOOK_SUBSCRIPTIONS}; delete one first"
            )));
        }
        let id = uuid::Uuid::now_v7().to_string();
        let mut key = [0u8; SECRET_BYTES];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut key);
        let subscription = Subscription {
            secret: self.secrets.seal(&purpose(&id), &key)?,
            id,
            url: request.url,
            events: request.events,
            body_template: request.body_template,
            description: request.description,
            created_at: Utc::now(),
        };
        self.store
            .webhooks()
            .insert_subscription(&subscription)
            .await?;
        Ok(CreatedSubscription {
            subscription: SubscriptionView::of(subscription),
            secret: format!("whsec_{}", BASE64.encode(key)),
        })
    }

    /// Every subscription, oldest first.
    pub async fn list(&self) -> Result<Vec<SubscriptionView>> {
        let subscriptions = self.store.webhooks().subscriptions().await?;
        Ok(subscriptions
            .into_iter()
            .map(SubscriptionView::of)
            .collect())
    }

    /// Deletes a subscription; its pending deliveries are not sent.
    pub async fn delete(&self, id: &str) -> Result<()> {
        if self.store.webhooks().delete_subscription(id).await? {
            Ok(())
        } else {
            Err(not_found("webhook subscription", id))
        }
    }

    /// The delivery log, newest first.
    pub async fn deliveries(&self, query: &DeliveryQuery) -> Result<Page<DeliveryView>> {
        let page = self.store.webhooks().deliveries(query).await?;
        Ok(Page {
            items: page.items.into_iter().map(DeliveryView::of).collect(),
            total: page.total,
        })
    }

    /// Puts a delivered or failed delivery back in the outbox for a new
    /// round of attempts, with its id and body as before. A pending one
    /// is refused: it is on its way.
    pub async fn resend(&self, id: &str) -> Result<DeliveryView> {
        let webhooks = self.store.webhooks();
        let mut delivery = webhooks
            .get_delivery(id)
            .await?
            .ok_or_else(|| not_found("webhook delivery", id))?;
        if delivery.status == DeliveryStatus::Pending {
            return Err(Error::Conflict(format!(
                "delivery {id} is pending: it is sent already"
            )));
        }
        if webhooks
            .get_subscription(&delivery.subscription_id)
            .await?
            .is_none()
        {
            return Err(Error::Conflict(format!(
                "delivery {id}: its subscription {} was deleted",
                delivery.subscription_id
            )));
        }
        delivery.resend(Utc::now());
        let stored = webhooks.update_delivery(&delivery).await?;
        self.wake.notify_one();
        Ok(DeliveryView::of(stored))
    }

    async fn listen(
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
    async fn watch_schedules(self: Arc<Self>, stopping: CancellationToken) {
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

    async fn send_due(self: Arc<Self>, stopping: CancellationToken) {
        let mut last_prune: Option<std::time::Instant> = None;
        loop {
            let next = match self.send_round().await {
                Ok(next) => next,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the webhook outbox");
                    None
                }
            };
            let wait = next
                .and_then(|at| (at - Utc::now()).to_std().ok())
                .map_or(self.config.poll, |until| until.min(self.config.poll));
            tokio::select! {
                () = stopping.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(wait) => {}
            }
            if last_prune.is_none_or(|at| at.elapsed() >= PRUNE_EVERY) {
                last_prune = Some(std::time::Instant::now());
                if let Err(e) = self.prune().await {
                    tracing::warn!(error = %e, "cannot prune the webhook delivery log");
                }
            }
        }
    }

    /// Sends the due deliveries of the outbox, at once; returns when the
    /// next one is due.
    async fn send_round(&self) -> Result<Option<DateTime<Utc>>> {
        let query = DeliveryQuery {
            status: Some(DeliveryStatus::Pending),
            limit: usize::MAX,
            ..Default::default()
        };
        let mut pending = self.store.webhooks().deliveries(&query).await?.items;
        pending.sort_by_key(|d| d.next_attempt_at);
        let now = Utc::now();
        let (due, later): (Vec<_>, Vec<_>) = pending
            .into_iter()
            .partition(|d| d.next_attempt_at.is_none_or(|at| at <= now));
        let more = due.len() > BATCH;
        let sends = due.into_iter().take(BATCH).map(|d| self.attempt(d));
        for result in futures_util::future::join_all(sends).await {
            if let Err(e) = result
                && !e.is_conflict()
            {
                tracing::warn!(error = %e, "a webhook delivery attempt was not recorded");
            }
        }
        if more {
            return Ok(Some(now));
        }
        Ok(later.first().and_then(|d| d.next_attempt_at))
    }

    /// One attempt: claimed (by moving its due time past the request's
    /// deadline, so no other node sends it meanwhile), sent, recorded.
    async fn attempt(&self, delivery: Delivery) -> Result<()> {
        let webhooks = self.store.webhooks();
        let Some(subscription) = webhooks.get_subscription(&delivery.subscription_id).await? else {
            let mut orphan = delivery;
            orphan.give_up("its subscription was deleted".into(), Utc::now());
            webhooks.update_delivery(&orphan).await?;
            return Ok(());
        };
        let lease = self.config.request_timeout * 2 + Duration::from_secs(5);
        let mut claimed = delivery;
        claimed.next_attempt_at = Some(Utc::now() + lease);
        let claimed = webhooks.update_delivery(&claimed).await?;
        let started = Utc::now();
        let timestamp = started.timestamp();
        let key = match self
            .secrets
            .unseal(&purpose(&subscription.id), &subscription.secret)
        {
            Ok(key) => key,
            Err(e) => {
                // Counted as an attempt, so a key that cannot open the
                // secret (a changed --secret-key-file) ends the round.
                let attempt = DeliveryAttempt {
                    at: started,
                    status_code: None,
                    error: Some(e.to_string()),
                    duration_ms: 0,
                };
                return self.record(claimed, attempt).await;
            }
        };
        let request = WebhookRequest {
            url: claimed.url.clone(),
            headers: vec![
                ("content-type", "application/json".to_owned()),
                ("webhook-id", claimed.id.clone()),
                ("webhook-timestamp", timestamp.to_string()),
                (
                    "webhook-signature",
                    sign(&key, &claimed.id, timestamp, claimed.body.as_bytes()),
                ),
            ],
            body: claimed.body.clone().into_bytes(),
            timeout: self.config.request_timeout,
        };
        let clock = std::time::Instant::now();
        let outcome = self.sender.send(request).await;
        let duration_ms = u64::try_from(clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        let attempt = match outcome {
            Ok(code) => DeliveryAttempt {
                at: started,
                status_code: Some(code),
                error: (!(200..300).contains(&code)).then(|| format!("answered {code}")),
                duration_ms,
            },
            Err(why) => DeliveryAttempt {
                at: started,
                status_code: None,
                error: Some(self.secrets.redactor().text(&why)),
                duration_ms,
            },
        };
        self.record(claimed, attempt).await
    }

    /// Stores an attempt in its delivery, moving it on.
    async fn record(&self, mut claimed: Delivery, attempt: DeliveryAttempt) -> Result<()> {
        let retry_in = self
            .config
            .backoff
            .delay(claimed.round_attempts + 1, rand::random::<f64>());
        claimed.record(
            attempt,
            self.config.max_attempts,
            chrono::Duration::from_std(retry_in).unwrap_or(chrono::Duration::MAX),
        );
        let stored = self.store.webhooks().update_delivery(&claimed).await?;
        tracing::info!(
            delivery = %stored.id,
            status = %stored.status,
            attempts = stored.round_attempts,
            "webhook delivery attempted"
        );
        Ok(())
    }

    /// Retention: finished deliveries older than `retain` go, and the
    /// oldest finished ones beyond `max_deliveries`.
    async fn prune(&self) -> Result<()> {
        let webhooks = self.store.webhooks();
        let all = webhooks
            .deliveries(&DeliveryQuery {
                limit: usize::MAX,
                ..Default::default()
            })
            .await?;
        // A period too long to subtract keeps every delivery by time.
        let cutoff = chrono::Duration::from_std(self.config.retain)
            .ok()
            .and_then(|retain| Utc::now().checked_sub_signed(retain))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        let doomed: Vec<String> = all
            .items
            .iter()
            .enumerate()
            .filter(|(i, d)| {
                d.status != DeliveryStatus::Pending
                    && (d.updated_at < cutoff || *i >= self.config.max_deliveries)
            })
            .map(|(_, d)| d.id.clone())
            .collect();
        if !doomed.is_empty() {
            let pruned = webhooks.prune_deliveries(&doomed).await?;
            tracing::debug!(pruned, "pruned the webhook delivery log");
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

/// What a subscription's secret is sealed for.
fn purpose(subscription: &str) -> String {
    format!("webhook:{subscription}")
}

fn not_found(what: &'static str, id: &str) -> Error {
    Error::NotFound {
        what,
        id: id.to_owned(),
    }
}

/// The `webhook-signature` header of Standard Webhooks: `v1,` and the
/// base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}` with the key.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    // HMAC takes a key of any length.
    let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
}

/// The key of a `whsec_` secret, as a receiver reads it.
pub fn secret_key(secret: &str) -> Option<Vec<u8>> {
    BASE64.decode(secret.strip_prefix("whsec_")?).ok()
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

    /// The test vector the Standard Webhooks libraries publish.
    #[test]
    fn signatures_match_the_standard_webhooks_test_vector() {
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let signature = sign(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let other = sign(
            &key,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265331,
            br#"{"test": 2432232314}"#,
        );
        assert_ne!(other, signature, "the timestamp is signed");
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
