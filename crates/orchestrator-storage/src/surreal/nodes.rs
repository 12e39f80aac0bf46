//! [`NodeStore`] on SurrealDB: heartbeats in the `node` table, and the
//! change feed of a shared server.

use async_trait::async_trait;
use orchestrator_core::Node;
use surrealdb::types::Variables;

use super::SurrealBackend;
use crate::{ChangeFeed, Error, NodeStore, Result};

#[async_trait]
impl NodeStore for SurrealBackend {
    fn shared(&self) -> bool {
        self.name == "surrealdb-server"
    }

    async fn heartbeat(&self, node: &Node) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("id", node.id.clone());
        vars.insert(
            "doc",
            serde_json::to_string(node)
                .map_err(|e| Error::io("serialize a node", std::io::Error::other(e)))?,
        );
        self.query(
            "record a heartbeat",
            "UPSERT type::record('node', $id) CONTENT { doc: $doc };",
            &vars,
        )
        .await?;
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<Node>> {
        self.docs(
            "list nodes",
            "SELECT VALUE doc FROM node ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    /// Phase 1: no feed yet; every node polls the shared store.
    fn changes(&self) -> Option<ChangeFeed> {
        None
    }
}
