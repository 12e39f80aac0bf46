//! The filesystem backend's webhook subscriptions and deliveries
//! ([`crate::WebhookStore`]).

use async_trait::async_trait;
use orchestrator_core::webhook::{Delivery, DeliveryStatus, Subscription};

use super::FsBackend;
use super::line::Line;
use super::state::State;
use crate::{DeliveryQuery, Error, Page, Result, WebhookStore};

#[async_trait]
impl WebhookStore for FsBackend {
    async fn insert_subscription(&self, subscription: &Subscription) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            if state.subscription(&subscription.id).is_some() {
                return Err(Error::AlreadyExists {
                    what: "webhook subscription",
                    id: subscription.id.clone(),
                });
            }
            self.commit(&mut state, Line::WebhookSubscription(subscription.clone()))?
        };
        pending.durable().await
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool> {
        let pending = {
            let mut state = self.lock_state();
            if state.subscription(id).is_none() {
                return Ok(false);
            }
            let line = Line::WebhookSubscriptionDeleted { id: id.to_owned() };
            self.commit(&mut state, line)?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn get_subscription(&self, id: &str) -> Result<Option<Subscription>> {
        Ok(self.lock_state().subscription(id).cloned())
    }

    async fn subscriptions(&self) -> Result<Vec<Subscription>> {
        Ok(self.lock_state().subscriptions().cloned().collect())
    }

    async fn insert_delivery(&self, delivery: &Delivery) -> Result<bool> {
        let pending = {
            // The check and the insert under one lock: of racing inserts
            // of one id, exactly one stores it.
            let mut state = self.lock_state();
            if state.delivery(&delivery.id).is_some() {
                return Ok(false);
            }
            self.commit(&mut state, Line::WebhookDelivery(delivery.clone()))?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn update_delivery(&self, delivery: &Delivery) -> Result<Delivery> {
        let mut stored = delivery.clone();
        stored.version += 1;
        let version = |state: &State, key: &str| state.delivery(key).map(|d| d.version);
        let line = Line::WebhookDelivery(stored.clone());
        self.compare_and_set(
            "webhook delivery",
            delivery.id.clone(),
            delivery.version,
            version,
            line,
        )
        .await?;
        Ok(stored)
    }

    async fn get_delivery(&self, id: &str) -> Result<Option<Delivery>> {
        Ok(self.lock_state().delivery(id).cloned())
    }

    async fn deliveries(&self, query: &DeliveryQuery) -> Result<Page<Delivery>> {
        let mut matching: Vec<Delivery> = {
            let state = self.lock_state();
            state
                .deliveries()
                .filter(|d| query.matches(d))
                .cloned()
                .collect()
        };
        matching.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        let total = matching.len();
        let items = matching
            .into_iter()
            .skip(query.offset)
            .take(query.limit)
            .collect();
        Ok(Page { items, total })
    }

    async fn prune_deliveries(&self, ids: &[String]) -> Result<u64> {
        let (pending, pruned) = {
            let mut state = self.lock_state();
            let ids: Vec<String> = ids
                .iter()
                .filter(|id| {
                    state
                        .delivery(id)
                        .is_some_and(|d| d.status != DeliveryStatus::Pending)
                })
                .cloned()
                .collect();
            if ids.is_empty() {
                return Ok(0);
            }
            let pruned = ids.len() as u64;
            let line = Line::WebhookDeliveriesPruned { ids };
            (self.commit(&mut state, line)?, pruned)
        };
        pending.durable().await?;
        Ok(pruned)
    }
}
