//! Time-sortable identifiers (UUIDv7) for tasks, workflows and schedules.
//!
//! UUIDv7 ids sort by creation time, so "newest first" is simply "largest id
//! first" and storage backends need no separate creation-time index.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! time_sortable_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh id. UUIDv7 generation reads the clock, which is the one
            /// piece of ambient state the core accepts: ids must be unique
            /// without any coordination.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub fn from_uuid(uuid: Uuid) -> Self {
                Self(uuid)
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map(Self)
            }
        }
    };
}

time_sortable_id!(
    /// Identifies one task.
    TaskId
);
time_sortable_id!(
    /// Identifies one workflow (a submission that created one or more tasks).
    WorkflowId
);
time_sortable_id!(
    /// Identifies one recurring schedule.
    ScheduleId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sort_by_creation() {
        let ids: Vec<TaskId> = (0..1000).map(|_| TaskId::new()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
    }

    #[test]
    fn ids_round_trip_through_text() {
        let id = WorkflowId::new();
        assert_eq!(id.to_string().parse::<WorkflowId>().unwrap(), id);
        assert!("not-a-uuid".parse::<WorkflowId>().is_err());
    }
}
