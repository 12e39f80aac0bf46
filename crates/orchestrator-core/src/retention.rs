//! Retention: which finished workflows, and which audit records, are old
//! enough to delete. The engine pages through the store and asks here; the
//! store deletes only what is still finished at the version decided on.

use chrono::{DateTime, Utc};

use crate::Workflow;
pub use crate::period::Keep;

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
    use std::time::Duration;

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
        assert_eq!("1000years".parse(), Ok(Keep::Forever), "past a century");
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
