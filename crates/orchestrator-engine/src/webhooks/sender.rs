//! The sender: due deliveries taken from the outbox, each claimed by
//! compare-and-set, signed (Standard Webhooks), sent and recorded in its
//! log; retries with backoff, and the delivery log's retention.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use orchestrator_core::webhook::{Delivery, DeliveryAttempt, DeliveryStatus};
use orchestrator_storage::DeliveryQuery;
use sha2::Sha256;
use tokio_util::sync::CancellationToken;

use crate::Result;

use super::{WebhookRequest, Webhooks, purpose};

/// Deliveries the sender takes from the outbox per round.
const BATCH: usize = 64;
/// How often retention looks through the delivery log.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

impl Webhooks {
    pub(super) async fn send_due(self: Arc<Self>, stopping: CancellationToken) {
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
}
