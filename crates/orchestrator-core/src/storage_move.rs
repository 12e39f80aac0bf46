//! A storage move (the routes' "migration") as data: its phase and
//! progress, as the storage crate's runner reports it, the API shows it
//! and events carry it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Where a storage move is. The first four run in order; the last four
/// are ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
// The document keeps the name the API shipped with.
#[cfg_attr(feature = "openapi", schema(as = MigrationPhase))]
#[serde(rename_all = "snake_case")]
pub enum MovePhase {
    /// Every record of the source is copied to the target in batches.
    Copying,
    /// What changed during the copy is applied to the target.
    Mirroring,
    /// The whole target is compared with the source by content.
    Verifying,
    /// Writes are paused while the last changes move and the switch is
    /// recorded.
    Switching,
    /// The service works on the target.
    Completed,
    /// Cancelled before the switch: the service stays on the source.
    Cancelled,
    /// Stopped by an error before the switch: the service stays on the
    /// source; `error` says why.
    Failed,
    /// The service restarted before the switch and stayed on the source.
    Abandoned,
}

impl MovePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            MovePhase::Copying => "copying",
            MovePhase::Mirroring => "mirroring",
            MovePhase::Verifying => "verifying",
            MovePhase::Switching => "switching",
            MovePhase::Completed => "completed",
            MovePhase::Cancelled => "cancelled",
            MovePhase::Failed => "failed",
            MovePhase::Abandoned => "abandoned",
        }
    }

    /// Whether the migration has ended, one way or the other.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            MovePhase::Completed | MovePhase::Cancelled | MovePhase::Failed | MovePhase::Abandoned
        )
    }
}

/// How long each phase took, in milliseconds; absent until it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PhaseTimes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copying_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirroring_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verifying_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switching_ms: Option<u64>,
}

/// A storage move: `GET /admin/storage/migrations/{id}`, and the body
/// of its `storage_migration` events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = MigrationStatus))]
pub struct MoveStatus {
    pub id: String,
    /// The store the service ran on when it began, as a spec.
    #[cfg_attr(
        feature = "openapi",
        schema(example = "filesystem:/var/lib/orchestrator")
    )]
    pub source: String,
    /// The store it moves to, as a spec.
    #[cfg_attr(
        feature = "openapi",
        schema(example = "surrealdb-server:ws://127.0.0.1:8000/orchestrator/orchestrator")
    )]
    pub target: String,
    pub phase: MovePhase,
    pub started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// Records the source held when the copy began (every kind).
    pub records_total: u64,
    /// Records the copy has handled so far.
    pub records_copied: u64,
    /// Records changed during the copy and applied to the target since.
    pub records_mirrored: u64,
    /// Records and logs the verify compared.
    pub records_verified: u64,
    /// Copy rate so far, records per second.
    pub rate: f64,
    /// Seconds the copy still needs at that rate; absent outside the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_secs: Option<u64>,
    #[serde(default)]
    pub phases: PhaseTimes,
    /// How long writes were paused at the switch, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch_stall_ms: Option<f64>,
    /// Why it failed, or was abandoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
