//! [`LockStore`] on SurrealDB: one `resource_lock` record per name. A
//! first record is made with `CREATE` (refused if another node made it
//! first); a change is an `UPDATE ... WHERE version = $expected`, one
//! statement, so of nodes racing on one lock on a shared server exactly
//! one write lands and the others get a conflict and read again.

use async_trait::async_trait;
use orchestrator_core::lock::LockRecord;
use surrealdb::types::Variables;

use super::SurrealBackend;
use super::errors::db_error;
use super::rows::{to_doc, version_param};
use crate::{Error, LockStore, Result};

#[async_trait]
impl LockStore for SurrealBackend {
    async fn get_lock(&self, name: &str) -> Result<Option<LockRecord>> {
        let mut vars = Variables::new();
        vars.insert("id", name.to_owned());
        let found = self
            .docs(
                "read a lock",
                "SELECT VALUE doc FROM type::record('resource_lock', $id);",
                &vars,
            )
            .await?;
        Ok(found.into_iter().next())
    }

    async fn put_lock(&self, lock: &LockRecord) -> Result<LockRecord> {
        let mut stored = lock.clone();
        stored.version += 1;
        let mut vars = Variables::new();
        vars.insert("id", lock.name.clone());
        vars.insert(
            "row",
            serde_json::json!({"doc": to_doc(&stored)?, "version": version_param(stored.version)}),
        );
        vars.insert("expected", version_param(lock.version));
        let conflict = |found| Error::Conflict {
            what: "lock",
            id: lock.name.clone(),
            expected: lock.version,
            found,
        };
        if lock.version == 0 {
            return match self
                .query(
                    "store a lock",
                    "CREATE type::record('resource_lock', $id) CONTENT $row RETURN NONE;",
                    &vars,
                )
                .await
            {
                Ok(_) => Ok(stored),
                Err(Error::AlreadyExists { .. }) => Err(conflict(
                    self.stored_version("resource_lock", lock.name.clone())
                        .await?
                        .unwrap_or(0),
                )),
                Err(e) => Err(e),
            };
        }
        let context = "update a lock";
        let mut response = self
            .query(
                context,
                "UPDATE type::record('resource_lock', $id) CONTENT $row WHERE version = $expected RETURN VALUE version;",
                &vars,
            )
            .await?;
        let updated: Vec<i64> = response.take(0).map_err(|e| db_error(context, &e))?;
        if updated.is_empty() {
            let found = self
                .stored_version("resource_lock", lock.name.clone())
                .await?
                .unwrap_or(0);
            return Err(conflict(found));
        }
        Ok(stored)
    }

    async fn locks(&self) -> Result<Vec<LockRecord>> {
        self.docs(
            "list locks",
            "SELECT VALUE doc FROM resource_lock ORDER BY id;",
            &Variables::new(),
        )
        .await
    }
}
