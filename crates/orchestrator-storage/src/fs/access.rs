//! The filesystem backend's tokens, secrets and audit records
//! ([`crate::AccessStore`]).

use async_trait::async_trait;
use orchestrator_core::access::{ApiToken, AuditRecord, SecretRecord};

use super::FsBackend;
use super::line::Line;
use crate::{AccessStore, AuditQuery, Page, RecordKind, Result};

#[async_trait]
impl AccessStore for FsBackend {
    async fn put_token(&self, token: &ApiToken) -> Result<()> {
        self.write(Line::Token(token.clone())).await
    }

    async fn tokens(&self) -> Result<Vec<ApiToken>> {
        Ok(self.lock_state().tokens().cloned().collect())
    }

    async fn delete_tokens(&self, ids: &[String]) -> Result<u64> {
        let (pending, count) = {
            let mut state = self.lock_state();
            let held: Vec<String> = ids
                .iter()
                .filter(|id| state.has_token(id))
                .cloned()
                .collect();
            let pending = self.commit_pruned(&mut state, &held, |tokens| Line::Pruned {
                workflows: Vec::new(),
                tasks: Vec::new(),
                audit: Vec::new(),
                tokens,
            })?;
            (pending, held.len() as u64)
        };
        if let Some(pending) = pending {
            // Lines are durable in order: the last one covers the others.
            pending.durable().await?;
        }
        Ok(count)
    }

    async fn put_secret(&self, secret: &SecretRecord) -> Result<()> {
        self.write(Line::Secret(secret.clone())).await
    }

    async fn delete_secret(&self, name: &str) -> Result<bool> {
        let pending = {
            let mut state = self.lock_state();
            if state.record(RecordKind::Secret, name)?.is_none() {
                return Ok(false);
            }
            let line = Line::SecretDeleted {
                name: name.to_owned(),
            };
            self.commit(&mut state, line)?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn secrets(&self) -> Result<Vec<SecretRecord>> {
        Ok(self.lock_state().secrets().cloned().collect())
    }

    async fn append_audit(&self, record: &AuditRecord) -> Result<()> {
        let (pending, seq) = {
            let mut state = self.lock_state();
            let pending = self.commit(&mut state, Line::Audit(record.clone()))?;
            (pending, state.last_seq)
        };
        pending.durable().await?;
        // An audit record never changes: it is history once durable.
        self.lock_state().evict_audit(&record.id, seq);
        Ok(())
    }

    async fn list_audit(&self, query: &AuditQuery) -> Result<Page<AuditRecord>> {
        self.lock_state().list_audit(query)
    }
}
