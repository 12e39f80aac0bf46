//! Retention: which finished workflows, and which audit records, are old
//! enough to delete. The engine pages through the store and asks here; the
//! store deletes only what is still finished at the version decided on.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Workflow;

/// How long something is kept after it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    Forever,
    For(Duration),
}

/// Longest period accepted: far beyond any real need, and safe to subtract
/// from any clock reading chrono can hold.
const MAX_KEEP: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl FromStr for Keep {
    type Err = String;

    /// `forever`, or a period such as `30d`, `12h`, `90days`, `1h 30m`.
    fn from_str(s: &str) -> Result<Keep, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("forever") {
            return Ok(Keep::Forever);
        }
        let period = humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a period: {e} (write e.g. 30d, 12h, or forever)"))?;
        if period > MAX_KEEP {
            return Err(format!("{s:?} is longer than 100 years; use forever"));
        }
        Ok(Keep::For(period))
    }
}

impl fmt::Display for Keep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Keep::Forever => f.write_str("forever"),
            Keep::For(period) => write!(f, "{}", humantime::format_duration(*period)),
        }
    }
}

impl Serialize for Keep {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Keep {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Keep, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// On the wire a period is a string: `forever`, or `30d`, `12h`, ...
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Keep {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .description(Some(
                "`forever`, or a period such as `30d`, `12h`, `90days`, `1h 30m`",
            ))
            .examples(["30d"])
            .min_length(Some(1))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Keep {}

impl Keep {
    /// Whether something that ended at `ended` is past keeping at `now`.
    pub fn expired(self, ended: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        match self {
            Keep::Forever => false,
            Keep::For(period) => chrono::Duration::from_std(period)
                .ok()
                .and_then(|period| ended.checked_add_signed(period))
                .is_some_and(|until| until <= now),
        }
    }

    /// The moment before which anything that ended is past keeping.
    pub fn cutoff(self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match self {
            Keep::Forever => None,
            Keep::For(period) => chrono::Duration::from_std(period)
                .ok()
                .and_then(|period| now.checked_sub_signed(period)),
        }
    }
}

/// Whether retention may delete `workflow` at `now`: it is finished, its
/// own `retain` (or else `default`) has run out since it finished, and it
/// is not the newest revision of its `meta.ref` (`newest_of_reference`
/// tells), which a resubmission compares against.
pub fn prunable(
    workflow: &Workflow,
    default: Keep,
    newest_of_reference: bool,
    now: DateTime<Utc>,
) -> bool {
    if !workflow.status.is_terminal() || (workflow.reference.is_some() && newest_of_reference) {
        return false;
    }
    // A finished workflow always has `finished_at`; one from an older
    // build without it counts from its last change.
    let ended = workflow.finished_at.unwrap_or(workflow.updated_at);
    workflow.retain.unwrap_or(default).expired(ended, now)
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::WorkflowStatus;

    fn at(day: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, day, 0, 0, 0).unwrap()
    }

    fn finished(day: u32) -> Workflow {
        let mut w = Workflow::new("k", "n", at(day));
        w.status = WorkflowStatus::Completed;
        w.finished_at = Some(at(day));
        w
    }

    #[test]
    fn periods_and_forever_parse_and_print_back() {
        assert_eq!(
            "30d".parse(),
            Ok(Keep::For(Duration::from_secs(30 * 86400)))
        );
        assert_eq!(" forever ".parse(), Ok(Keep::Forever));
        let keep: Keep = "1h 30m".parse().unwrap();
        assert_eq!(keep.to_string().parse(), Ok(keep));
        let err = "soon".parse::<Keep>().unwrap_err();
        assert!(err.contains("\"soon\"") && err.contains("30d"), "{err}");
        assert!("1000years".parse::<Keep>().unwrap_err().contains("forever"));
        let json = serde_json::to_string(&Keep::For(Duration::from_secs(86400))).unwrap();
        assert_eq!(json, "\"1day\"");
        assert!(serde_json::from_str::<Keep>("\"7x\"").is_err());
    }

    #[test]
    fn a_finished_workflow_goes_once_its_period_has_run_out() {
        let week: Keep = "7d".parse().unwrap();
        let w = finished(1);
        assert!(!prunable(&w, week, false, at(7)));
        assert!(prunable(&w, week, false, at(8)));
        assert!(!prunable(&w, Keep::Forever, false, at(30)));
        assert_eq!(week.cutoff(at(8)), Some(at(1)));
        assert_eq!(Keep::Forever.cutoff(at(8)), None);
    }

    #[test]
    fn unfinished_workflows_are_never_pruned() {
        for status in [
            WorkflowStatus::Scheduled,
            WorkflowStatus::Queued,
            WorkflowStatus::Running,
            WorkflowStatus::RollingBack,
        ] {
            let mut w = finished(1);
            w.status = status;
            assert!(
                !prunable(&w, Keep::For(Duration::ZERO), false, at(30)),
                "{status:?}"
            );
        }
    }

    #[test]
    fn the_newest_revision_of_a_reference_is_kept() {
        let mut w = finished(1);
        w.reference = Some("web".into());
        assert!(!prunable(&w, Keep::For(Duration::ZERO), true, at(30)));
        assert!(prunable(&w, Keep::For(Duration::ZERO), false, at(30)));
    }

    #[test]
    fn a_workflow_s_own_retention_overrides_the_default() {
        let mut w = finished(1);
        w.retain = Some(Keep::Forever);
        assert!(!prunable(&w, Keep::For(Duration::ZERO), false, at(30)));
        w.retain = Some("1d".parse().unwrap());
        assert!(prunable(&w, Keep::Forever, false, at(2)));
    }
}
