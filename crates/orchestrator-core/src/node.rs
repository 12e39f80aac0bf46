//! Service instances sharing one store.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One `orchestrator serve` instance, as its heartbeats describe it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Node {
    /// Stable across restarts (kept in the data dir, or set by `--node-id`).
    pub id: String,
    /// Where its API listens.
    pub address: String,
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub last_seen: DateTime<Utc>,
}

impl Node {
    /// A node is alive while its last heartbeat is younger than `lease`.
    pub fn alive(&self, lease: chrono::Duration, now: DateTime<Utc>) -> bool {
        now - self.last_seen < lease
    }
}
