//! [`AccessStore`] on SurrealDB: API tokens, secrets and the audit log.

use async_trait::async_trait;
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};
use surrealdb::types::Variables;

use super::errors::db_error;
use super::group::Write;
use super::rows::row_of;
use super::{Listing, Order, SurrealBackend, Window};
use crate::{AccessStore, AuditQuery, Page, Record, Result};

#[async_trait]
impl AccessStore for SurrealBackend {
    async fn put_token(&self, token: &ApiToken) -> Result<()> {
        self.upsert(&Record::Token(token.clone()), "store a token")
            .await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>> {
        self.docs(
            "list tokens",
            "SELECT VALUE doc FROM api_token ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    async fn delete_tokens(&self, ids: &[String]) -> Result<u64> {
        let mut vars = Variables::new();
        vars.insert("ids", ids.to_vec());
        self.delete_where(
            "delete token records",
            "api_token",
            "record::id(id) IN $ids",
            &vars,
        )
        .await
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.upsert(&Record::Secret(secret.clone()), "store a secret")
            .await
    }

    async fn delete_secret(&self, name: &str) -> Result<bool> {
        let mut vars = Variables::new();
        vars.insert("name", name.to_owned());
        let mut response = self
            .query(
                "delete a secret",
                "DELETE type::record('secret', $name) RETURN BEFORE;",
                &vars,
            )
            .await?;
        let deleted: Vec<serde_json::Value> = response
            .take(0)
            .map_err(|e| db_error("delete a secret", &e))?;
        Ok(!deleted.is_empty())
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        self.docs(
            "list secrets",
            "SELECT VALUE doc FROM secret ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    async fn append_audit(&self, record: &AuditRecord) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("id", record.id.clone());
        vars.insert("row", row_of(&Record::Audit(record.clone()))?);
        self.write(Write {
            context: "append an audit record",
            block: "CREATE type::record('audit', $p.id) CONTENT $p.row RETURN NONE;",
            params: vars,
            records: 1,
        })
        .await?;
        Ok(())
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        let mut conditions = Vec::new();
        let mut vars = Variables::new();
        if let Some(since) = query.since {
            conditions.push("time_ms >= $since");
            vars.insert("since", since.timestamp_millis());
        }
        if let Some(until) = query.until {
            conditions.push("time_ms < $until");
            vars.insert("until", until.timestamp_millis());
        }
        let text_filters = [
            ("actor = $actor", "actor", &query.actor),
            ("action = $action", "action", &query.action),
            ("target = $target", "target", &query.target),
        ];
        for (condition, name, value) in text_filters {
            if let Some(value) = value {
                conditions.push(condition);
                vars.insert(name, value.clone());
            }
        }
        let listing = Listing {
            table: "audit",
            conditions: conditions.into_iter().map(str::to_owned).collect(),
            page_only: None,
            index: None,
            order: Order::Id,
        };
        self.page(
            "list audit records",
            &listing,
            vars,
            Window {
                after: None,
                limit: query.limit,
                offset: query.offset,
            },
        )
        .await
    }
}
