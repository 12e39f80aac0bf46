//! [`WebhookStore`] on SurrealDB: subscriptions, and deliveries created
//! with `CREATE` (which refuses a record that exists: the insert-if-absent
//! that lets several nodes store one event's delivery once) and changed
//! by compare-and-set on `version`.

use async_trait::async_trait;
use orchestrator_core::webhook::{Delivery, DeliveryStatus, Subscription};
use surrealdb::types::Variables;

use super::SurrealBackend;
use super::errors::db_error;
use super::rows::{delivery_row, to_doc, to_i64, version_param};
use crate::{DeliveryQuery, Error, Page, Result, WebhookStore};

#[async_trait]
impl WebhookStore for SurrealBackend {
    async fn insert_subscription(&self, subscription: &Subscription) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("id", subscription.id.clone());
        vars.insert("row", serde_json::json!({"doc": to_doc(subscription)?}));
        self.query(
            "store a webhook subscription",
            "CREATE type::record('webhook_subscription', $id) CONTENT $row RETURN NONE;",
            &vars,
        )
        .await?;
        Ok(())
    }

    async fn delete_subscription(&self, id: &str) -> Result<bool> {
        let mut vars = Variables::new();
        vars.insert("id", id.to_owned());
        let context = "delete a webhook subscription";
        let mut response = self
            .query(
                context,
                "DELETE type::record('webhook_subscription', $id) RETURN BEFORE;",
                &vars,
            )
            .await?;
        let deleted: Vec<serde_json::Value> =
            response.take(0).map_err(|e| db_error(context, &e))?;
        Ok(!deleted.is_empty())
    }

    async fn get_subscription(&self, id: &str) -> Result<Option<Subscription>> {
        let mut vars = Variables::new();
        vars.insert("id", id.to_owned());
        let found = self
            .docs(
                "read a webhook subscription",
                "SELECT VALUE doc FROM type::record('webhook_subscription', $id);",
                &vars,
            )
            .await?;
        Ok(found.into_iter().next())
    }

    async fn subscriptions(&self) -> Result<Vec<Subscription>> {
        self.docs(
            "list webhook subscriptions",
            "SELECT VALUE doc FROM webhook_subscription ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    async fn insert_delivery(&self, delivery: &Delivery) -> Result<bool> {
        let mut vars = Variables::new();
        vars.insert("id", delivery.id.clone());
        vars.insert("row", delivery_row(delivery)?);
        match self
            .query(
                "store a webhook delivery",
                "CREATE type::record('webhook_delivery', $id) CONTENT $row RETURN NONE;",
                &vars,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn update_delivery(&self, delivery: &Delivery) -> Result<Delivery> {
        let mut stored = delivery.clone();
        stored.version += 1;
        let mut vars = Variables::new();
        vars.insert("id", delivery.id.clone());
        vars.insert("expected", version_param(delivery.version));
        vars.insert("row", delivery_row(&stored)?);
        let context = "update a webhook delivery";
        let mut response = self
            .query(
                context,
                "UPDATE type::record('webhook_delivery', $id) CONTENT $row \
                 WHERE version = $expected RETURN VALUE version;",
                &vars,
            )
            .await?;
        let updated: Vec<i64> = response.take(0).map_err(|e| db_error(context, &e))?;
        if !updated.is_empty() {
            return Ok(stored);
        }
        let what = "webhook delivery";
        let id = delivery.id.clone();
        let gone = Error::NotFound {
            what,
            id: id.clone(),
        };
        Err(self
            .why_stale("webhook_delivery", what, id, delivery.version, gone)
            .await?)
    }

    async fn get_delivery(&self, id: &str) -> Result<Option<Delivery>> {
        let mut vars = Variables::new();
        vars.insert("id", id.to_owned());
        let found = self
            .docs(
                "read a webhook delivery",
                "SELECT VALUE doc FROM type::record('webhook_delivery', $id);",
                &vars,
            )
            .await?;
        Ok(found.into_iter().next())
    }

    async fn deliveries(&self, query: &DeliveryQuery) -> Result<Page<Delivery>> {
        // Fixed fragments only; the values are bound parameters.
        let mut conditions = Vec::new();
        let mut vars = Variables::new();
        if let Some(subscription) = &query.subscription {
            conditions.push("subscription = $subscription");
            vars.insert("subscription", subscription.clone());
        }
        if let Some(status) = query.status {
            conditions.push("status = $status");
            vars.insert("status", status.as_str());
        }
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", conditions.join(" AND "))
        };
        vars.insert("limit", to_i64(query.limit));
        vars.insert("offset", to_i64(query.offset));
        let sql = format!(
            "SELECT VALUE doc FROM webhook_delivery {filter} \
                 ORDER BY created_ms DESC, id DESC LIMIT $limit START $offset;
             SELECT count() AS n FROM webhook_delivery {filter} GROUP ALL;"
        );
        let context = "list webhook deliveries";
        let mut response = self.query(context, &sql, &vars).await?;
        let docs: Vec<String> = response.take(0).map_err(|e| db_error(context, &e))?;
        let counts: Vec<i64> = response.take((1, "n")).map_err(|e| db_error(context, &e))?;
        Ok(Page {
            items: docs
                .iter()
                .map(|doc| super::rows::from_doc(context, doc))
                .collect::<Result<_>>()?,
            total: counts.first().copied().unwrap_or(0).try_into().unwrap_or(0),
        })
    }

    async fn prune_deliveries(&self, ids: &[String]) -> Result<u64> {
        let mut vars = Variables::new();
        vars.insert("ids", ids.to_vec());
        vars.insert("pending", DeliveryStatus::Pending.as_str());
        self.delete_where(
            "prune webhook deliveries",
            "webhook_delivery",
            "record::id(id) IN $ids AND status != $pending",
            &vars,
        )
        .await
    }
}
