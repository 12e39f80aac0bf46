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

mod outbox;
mod sender;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use orchestrator_core::backoff::Backoff;
use orchestrator_core::template::limits::{
    MAX_WEBHOOK_ATTEMPTS, MAX_WEBHOOK_DESCRIPTION_CHARS, MAX_WEBHOOK_SUBSCRIPTIONS,
};
use orchestrator_core::webhook::{self, Delivery, DeliveryAttempt, DeliveryStatus, Subscription};
use orchestrator_storage::{DeliveryQuery, Page, Storage};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::events::EventBus;
use crate::secrets::Secrets;
use crate::{Error, Result};

pub use sender::{secret_key, sign};

/// Bytes of a new signing secret (the spec asks for 24 to 64).
const SECRET_BYTES: usize = 32;

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
