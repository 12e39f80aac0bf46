//! Recurring schedules: a template run on a cron expression in an IANA
//! time zone, and the decisions about which due times start a workflow.
//!
//! Pure: [`plan_due`] gets the last time already dealt with and `now`, and
//! answers which due times to start and how many were missed, so a test
//! drives it with any clock (downtime, DST jumps) without waiting. The
//! cron expression is read by `croner` and the zone by `chrono-tz`; nothing
//! here parses either by hand.
//!
//! Exactly-once across nodes is not decided here: every node computes the
//! same due times, and the store's claim on (schedule, due time), created
//! by one node only, says which node acts on each (see [`ScheduleClaim`]).

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, LocalResult, TimeDelta, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{ScheduleId, WorkflowId};

/// What a due run does while the schedule's previous run is still going.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Overlap {
    /// The due run does not start (counted as skipped).
    #[default]
    Skip,
    /// The due run waits, and starts once the previous runs have finished.
    Queue,
    /// The previous runs are cancelled, and the due run starts.
    CancelPrevious,
}

crate::named_variants!(Overlap, "overlap policy", [
    Skip => "skip",
    Queue => "queue",
    CancelPrevious => "cancel_previous",
]);

/// Which due times that passed while no node ran the schedule (downtime)
/// still start once a node is back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum CatchUp {
    /// None: they are counted as missed.
    #[default]
    None,
    /// The newest of them, if it is within the catch-up window and no due
    /// time is on time now.
    Latest,
    /// Every one within the catch-up window, oldest first.
    All,
}

crate::named_variants!(CatchUp, "catch-up policy", [
    None => "none",
    Latest => "latest",
    All => "all",
]);

/// A due time later than this after its time is late: it passed while no
/// node looked (downtime), and [`CatchUp`] decides whether it still runs.
pub const ON_TIME: Duration = Duration::from_secs(60);

/// The most late due times one plan starts under [`CatchUp::All`]; older
/// ones are counted as missed. A long outage of a frequent schedule must
/// not flood the queue.
pub const MAX_CATCH_UP: usize = 100;

/// The longest catch-up window: a year.
pub const MAX_CATCH_UP_WINDOW_SECS: u64 = 366 * 24 * 3600;

/// The most due times one plan walks through one by one; before them, a
/// long gap is counted in one step (its count then is a lower bound).
const MAX_WALK: usize = 10_000;

/// A recurring schedule as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Schedule {
    pub id: ScheduleId,
    /// For people; the template's `ref_name` unless given.
    pub name: String,
    /// The `ref_name` of a registered template.
    pub template: String,
    /// Its `schema_version`; the newest at each run when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_version: Option<u32>,
    /// The workflow inputs of every run, checked like a submission's.
    #[serde(default)]
    pub vars: Map<String, Value>,
    /// Five fields (minute granularity), or six with seconds first.
    pub cron: String,
    /// The IANA zone the cron expression is read in, e.g. `Europe/Berlin`.
    pub timezone: String,
    #[serde(default)]
    pub overlap: Overlap,
    #[serde(default)]
    pub catch_up: CatchUp,
    /// How old a late due time may be and still start under `catch_up`.
    pub catch_up_window_secs: u64,
    /// No due time before this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_at: Option<DateTime<Utc>>,
    /// No due time after this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_at: Option<DateTime<Utc>>,
    /// A paused schedule starts nothing, and does not catch up on what it
    /// skipped while paused.
    #[serde(default)]
    pub paused: bool,
    /// The API token that set up what it runs (created it, or last
    /// changed its template or inputs): each run is that token's
    /// submission, whose approval gates refuse that token's approval
    /// unless they allow it. Absent without tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// Due times up to this one are never run nor counted as missed: set
    /// at creation, at each resume, and when the cron or zone changes, so
    /// a paused or changed schedule does not catch up on times it was not
    /// meant to run at.
    pub active_since: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// Compare-and-set version, as on tasks.
    pub version: u64,
}

/// A schedule field that is not acceptable, named by its path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ScheduleError {
    pub field: String,
    pub message: String,
}

impl ScheduleError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> ScheduleError {
        ScheduleError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// A parsed cron expression in its time zone: what due times are.
#[derive(Clone)]
pub struct CronSpec {
    cron: Cron,
    zone: Tz,
}

impl fmt::Debug for CronSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CronSpec")
            .field("cron", &self.cron.pattern.to_string())
            .field("zone", &self.zone.name())
            .finish()
    }
}

impl CronSpec {
    /// Reads a cron expression (five fields, or six with seconds first)
    /// and an IANA zone name. Errors name the field: `cron` or `timezone`.
    pub fn parse(cron: &str, timezone: &str) -> Result<CronSpec, ScheduleError> {
        let fields = cron.split_whitespace().count();
        if !cron.trim_start().starts_with('@') && !(5..=6).contains(&fields) {
            return Err(ScheduleError::new(
                "cron",
                format!(
                    "`{cron}` has {fields} fields; expected five (minute hour day month weekday) \
                     or six (with seconds first)"
                ),
            ));
        }
        let parsed = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse(cron)
            .map_err(|e| ScheduleError::new("cron", format!("`{cron}` is not valid: {e}")))?;
        let zone: Tz = timezone.parse().map_err(|_| {
            ScheduleError::new(
                "timezone",
                format!("`{timezone}` is not an IANA time zone (e.g. `UTC`, `Europe/Berlin`)"),
            )
        })?;
        Ok(CronSpec { cron: parsed, zone })
    }

    /// The first due time strictly after `after`, or `None` if there is
    /// none (a date that never comes, like 30 February).
    ///
    /// Due times are wall-clock times in the zone, each due once: a time
    /// the clocks skip in spring comes due at the first moment after the
    /// jump, and a time they pass twice in autumn comes due the first time
    /// only (`croner`'s rules).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Due times are whole seconds: searching from the whole second at
        // or before `after` (exclusive) finds the first one after it.
        let from = after.with_nanosecond(0).unwrap_or(after);
        let next = self.find(from, false)?;
        if next > after {
            return Some(next);
        }
        // `after` is in the second pass of an hour the clocks went back
        // over, whose wall-clock times came due in the first pass (the
        // search above finds those again): look from where the wall clock
        // shows a new time. An overlap lasts at most a few hours.
        let mut at = from;
        for _ in 0..3 * 3600 {
            at += TimeDelta::seconds(1);
            let local = at.with_timezone(&self.zone).naive_local();
            if !matches!(
                self.zone.from_local_datetime(&local),
                LocalResult::Ambiguous(..)
            ) {
                return self.find(at, true).filter(|t| *t > after);
            }
        }
        None
    }

    /// The first `n` due times strictly after `after` and not after
    /// `until`, oldest first: what a page shows as the next runs.
    pub fn upcoming(
        &self,
        after: DateTime<Utc>,
        until: Option<DateTime<Utc>>,
        n: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut due = Vec::with_capacity(n);
        let mut from = after;
        while due.len() < n {
            match self.next_after(from) {
                Some(next) if until.is_none_or(|end| next <= end) => {
                    due.push(next);
                    from = next;
                }
                _ => break,
            }
        }
        due
    }

    fn find(&self, from: DateTime<Utc>, inclusive: bool) -> Option<DateTime<Utc>> {
        self.cron
            .find_next_occurrence(&from.with_timezone(&self.zone), inclusive)
            .ok()
            .map(|t| t.with_timezone(&Utc))
    }
}

impl Schedule {
    /// Checks every field that can be wrong on its own: the cron
    /// expression, the zone, the window, the names. Returns the parsed
    /// expression.
    pub fn check(&self) -> Result<CronSpec, ScheduleError> {
        if self.template.trim().is_empty() {
            return Err(ScheduleError::new("template", "must name a template"));
        }
        if self.name.trim().is_empty() {
            return Err(ScheduleError::new("name", "must not be empty"));
        }
        if self.name.chars().count() > 200 {
            return Err(ScheduleError::new("name", "must be at most 200 characters"));
        }
        let spec = CronSpec::parse(&self.cron, &self.timezone)?;
        if self.catch_up_window_secs == 0 {
            return Err(ScheduleError::new(
                "catch_up_window_secs",
                "must be at least 1",
            ));
        }
        if self.catch_up_window_secs > MAX_CATCH_UP_WINDOW_SECS {
            return Err(ScheduleError::new(
                "catch_up_window_secs",
                format!("must be at most {MAX_CATCH_UP_WINDOW_SECS} (a year)"),
            ));
        }
        if let (Some(start), Some(end)) = (self.start_at, self.end_at)
            && end <= start
        {
            return Err(ScheduleError::new(
                "end_at",
                format!("{end} is not after start_at ({start})"),
            ));
        }
        // Far enough ahead to reach any real date (29 February, a weekday
        // on the 31st) and never to search forever for an impossible one.
        let from = self.start_at.unwrap_or(self.active_since);
        if spec.next_after(from).is_none() {
            return Err(ScheduleError::new(
                "cron",
                format!("`{}` never comes due", self.cron),
            ));
        }
        Ok(spec)
    }

    /// Due times after this one are the schedule's to consider.
    fn floor(&self, after: DateTime<Utc>) -> DateTime<Utc> {
        let mut floor = after.max(self.active_since);
        if let Some(start) = self.start_at {
            // `start_at` itself may be due: look from just before it.
            floor = floor.max(start - TimeDelta::nanoseconds(1));
        }
        floor
    }

    /// When the schedule is next due after `now`, or `None` if it is
    /// paused or will never be due again.
    pub fn next_due(&self, spec: &CronSpec, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.paused {
            return None;
        }
        spec.next_after(self.floor(now))
            .filter(|due| self.end_at.is_none_or(|end| *due <= end))
    }
}

impl Schedule {
    /// The next `n` times the schedule is due after `now`, oldest first;
    /// none while it is paused.
    pub fn next_runs(&self, spec: &CronSpec, now: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        if self.paused {
            return Vec::new();
        }
        spec.upcoming(self.floor(now), self.end_at, n)
    }
}

/// When a schedule with these times would be due, before it is stored:
/// the first `n` due times after `now` (and not before `start_at`, not
/// after `end_at`). Errors name the field, as [`Schedule::check`]'s do.
pub fn preview(
    cron: &str,
    timezone: &str,
    start_at: Option<DateTime<Utc>>,
    end_at: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    n: usize,
) -> Result<Vec<DateTime<Utc>>, ScheduleError> {
    let spec = CronSpec::parse(cron, timezone)?;
    if let (Some(start), Some(end)) = (start_at, end_at)
        && end <= start
    {
        return Err(ScheduleError::new(
            "end_at",
            format!("{end} is not after start_at ({start})"),
        ));
    }
    let mut after = now;
    if let Some(start) = start_at {
        // `start_at` itself may be due: look from just before it.
        after = after.max(start - TimeDelta::nanoseconds(1));
    }
    if spec.next_after(after).is_none() {
        return Err(ScheduleError::new(
            "cron",
            format!("`{cron}` never comes due"),
        ));
    }
    Ok(spec.upcoming(after, end_at, n))
}

/// What a schedule should do now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DuePlan {
    /// Due times to start, oldest first.
    pub start: Vec<DateTime<Utc>>,
    /// Due times that passed and will never start (late, outside the
    /// catch-up window or policy).
    pub missed: u64,
    /// The newest due time this plan looked at. Nodes claim it even when
    /// it does not start, so that every node, and the next start of the
    /// service, knows it was dealt with.
    pub newest: Option<DateTime<Utc>>,
}

/// Which due times of `schedule` in (`after`, `now`] start, under its
/// window, pause and catch-up policy. A due time is on time while `now`
/// is less than `on_time` past it; later ones passed while no node looked.
pub fn plan_due(
    schedule: &Schedule,
    spec: &CronSpec,
    after: DateTime<Utc>,
    now: DateTime<Utc>,
    on_time: Duration,
) -> DuePlan {
    if schedule.paused {
        return DuePlan::default();
    }
    // Both bounded (a year at most, by `check`), so the subtractions
    // below cannot leave chrono's range.
    let on_time = TimeDelta::from_std(on_time.min(Duration::from_secs(MAX_CATCH_UP_WINDOW_SECS)))
        .unwrap_or(TimeDelta::zero());
    let window_secs = schedule.catch_up_window_secs.min(MAX_CATCH_UP_WINDOW_SECS);
    let window = TimeDelta::try_seconds(i64::try_from(window_secs).unwrap_or(0))
        .unwrap_or(TimeDelta::zero());
    let last = schedule.end_at.map_or(now, |end| end.min(now));
    let mut floor = schedule.floor(after);
    let mut plan = DuePlan::default();
    // Due times older than both the window and the on-time margin are
    // missed whatever the policy: count them without keeping them, and
    // skip a gap too long to walk.
    let horizon = now - window.max(on_time);
    let mut walked = 0;
    while let Some(due) = spec
        .next_after(floor)
        .filter(|d| *d <= last && *d < horizon)
    {
        plan.missed += 1;
        plan.newest = Some(due);
        floor = due;
        walked += 1;
        if walked >= MAX_WALK {
            floor = floor.max(horizon - TimeDelta::nanoseconds(1));
            break;
        }
    }
    let mut recent = Vec::new();
    while let Some(due) = spec.next_after(floor).filter(|d| *d <= last) {
        recent.push(due);
        floor = due;
    }
    let (on_time_dues, late): (Vec<_>, Vec<_>) =
        recent.iter().partition(|due| now - **due < on_time);
    let catch_up: Vec<DateTime<Utc>> = match schedule.catch_up {
        CatchUp::None => Vec::new(),
        CatchUp::Latest if on_time_dues.is_empty() => late
            .last()
            .filter(|due| now - **due <= window)
            .into_iter()
            .copied()
            .collect(),
        CatchUp::Latest => Vec::new(),
        CatchUp::All => {
            let within: Vec<_> = late
                .into_iter()
                .filter(|due| now - *due <= window)
                .collect();
            let keep = within.len().saturating_sub(MAX_CATCH_UP);
            within[keep..].to_vec()
        }
    };
    plan.start = catch_up.into_iter().chain(on_time_dues).collect();
    plan.missed += (recent.len() - plan.start.len()) as u64;
    if let Some(due) = recent.last() {
        plan.newest = Some(*due);
    }
    plan
}

/// What a due run does, given whether the schedule's previous run is
/// still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverlapAction {
    Start,
    /// Counted as skipped; nothing starts.
    Skip,
    /// Stays claimed, waiting, and starts once the previous runs finished.
    Wait,
    /// Cancel the previous runs, then start.
    CancelPreviousThenStart,
}

pub fn overlap_action(policy: Overlap, previous_running: bool) -> OverlapAction {
    match (policy, previous_running) {
        (_, false) => OverlapAction::Start,
        (Overlap::Skip, true) => OverlapAction::Skip,
        (Overlap::Queue, true) => OverlapAction::Wait,
        (Overlap::CancelPrevious, true) => OverlapAction::CancelPreviousThenStart,
    }
}

/// Where a due run is: created by the one node that claimed it, then
/// moved on by compare-and-set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum ClaimState {
    /// A node claimed it and is starting it.
    Claimed,
    /// Waits for the previous runs to finish (`overlap: queue`).
    Waiting,
    /// Its workflow was submitted (`workflow_id`).
    Started,
    /// It did not start: a previous run was still going (`overlap: skip`).
    Skipped,
    /// It passed while no node ran the schedule, and the catch-up policy
    /// does not start it; `missed` says how many due times it stands for.
    Missed,
    /// Its start failed for good (e.g. the template no longer exists);
    /// `reason` says why.
    Failed,
}

crate::named_variants!(ClaimState, "claim state", [
    Claimed => "claimed",
    Waiting => "waiting",
    Started => "started",
    Skipped => "skipped",
    Missed => "missed",
    Failed => "failed",
]);

/// One due time of one schedule, claimed by exactly one node: the store
/// creates it only if it does not exist (insert-if-absent), so of several
/// nodes sharing a store, one acts on each due time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleClaim {
    pub schedule_id: ScheduleId,
    pub due: DateTime<Utc>,
    pub state: ClaimState,
    /// The node that claimed it (or last moved it on).
    pub node: String,
    pub claimed_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_id: Option<WorkflowId>,
    /// For a `missed` claim: how many due times it stands for.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Compare-and-set version, as on tasks.
    pub version: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl ScheduleClaim {
    pub fn new(
        schedule_id: ScheduleId,
        due: DateTime<Utc>,
        state: ClaimState,
        node: impl Into<String>,
        now: DateTime<Utc>,
    ) -> ScheduleClaim {
        ScheduleClaim {
            schedule_id,
            due,
            state,
            node: node.into(),
            claimed_at: now,
            updated_at: now,
            workflow_id: None,
            missed: 0,
            reason: None,
            version: 0,
        }
    }

    /// The key it is stored under: the schedule, then the due time, so
    /// that keys sort by schedule and then by time.
    pub fn key(&self) -> String {
        claim_key(self.schedule_id, self.due)
    }

    /// The idempotency key of the workflow this due run submits: a retried
    /// start (after a node died mid-way) finds the first one.
    pub fn idempotency_key(&self) -> String {
        format!("schedule-{}", self.key())
    }
}

/// The key of the claim on (`schedule`, `due`): plain characters only.
pub fn claim_key(schedule: ScheduleId, due: DateTime<Utc>) -> String {
    format!("{schedule}_{}", due.format("%Y%m%dT%H%M%SZ"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    fn schedule(cron: &str, timezone: &str) -> Schedule {
        let now = at("2026-01-01T00:00:00Z");
        Schedule {
            id: ScheduleId::new(),
            name: "nightly".into(),
            template: "chain".into(),
            template_version: None,
            vars: Map::new(),
            cron: cron.into(),
            timezone: timezone.into(),
            overlap: Overlap::Skip,
            catch_up: CatchUp::None,
            catch_up_window_secs: 86_400,
            start_at: None,
            end_at: None,
            paused: false,
            submitted_by: None,
            active_since: now,
            created_at: now,
            updated_at: now,
            version: 0,
        }
    }

    #[test]
    fn next_runs_and_preview_follow_the_zone_and_the_bounds() {
        let s = schedule("0 2 * * *", "Europe/Berlin");
        let spec = s.check().unwrap();
        let now = at("2026-03-27T12:00:00Z");
        // 29 March: clocks go forward at 02:00, so 02:00 comes due at 03:00 CEST.
        assert_eq!(
            s.next_runs(&spec, now, 3),
            [
                at("2026-03-28T01:00:00Z"),
                at("2026-03-29T01:00:00Z"),
                at("2026-03-30T00:00:00Z")
            ]
        );
        let paused = Schedule {
            paused: true,
            ..s.clone()
        };
        assert!(paused.next_runs(&spec, now, 3).is_empty());
        let ended = Schedule {
            end_at: Some(at("2026-03-29T01:00:00Z")),
            ..s
        };
        assert_eq!(ended.next_runs(&spec, now, 3).len(), 2);

        let start = Some(at("2026-06-01T00:15:00Z"));
        assert_eq!(
            preview("*/15 * * * *", "UTC", start, None, now, 3).unwrap(),
            [
                at("2026-06-01T00:15:00Z"),
                at("2026-06-01T00:30:00Z"),
                at("2026-06-01T00:45:00Z")
            ]
        );
        let field = |r: Result<Vec<_>, ScheduleError>| r.unwrap_err().field;
        assert_eq!(field(preview("* *", "UTC", None, None, now, 3)), "cron");
        assert_eq!(
            field(preview("0 0 30 2 *", "UTC", None, None, now, 3)),
            "cron"
        );
        assert_eq!(
            field(preview("* * * * *", "Mars/Olympus", None, None, now, 3)),
            "timezone"
        );
        assert_eq!(
            field(preview("* * * * *", "UTC", start, start, now, 3)),
            "end_at"
        );
    }

    /// Every due time in (`from`, `to`], as UTC text.
    fn dues(spec: &CronSpec, from: &str, to: &str) -> Vec<String> {
        let (mut t, to) = (at(from), at(to));
        let mut out = Vec::new();
        while let Some(due) = spec.next_after(t).filter(|d| *d <= to) {
            out.push(due.to_rfc3339());
            t = due;
        }
        out
    }

    fn plan(s: &Schedule, after: &str, now: &str) -> DuePlan {
        plan_due(s, &s.check().unwrap(), at(after), at(now), ON_TIME)
    }

    fn times(list: &[DateTime<Utc>]) -> Vec<String> {
        list.iter().map(|t| t.format("%H:%M").to_string()).collect()
    }

    #[test]
    fn a_due_time_on_time_starts_once() {
        let s = schedule("0 * * * *", "UTC");
        let p = plan(&s, "2026-01-01T09:30:00Z", "2026-01-01T10:00:01Z");
        assert_eq!(times(&p.start), ["10:00"]);
        assert_eq!((p.missed, p.newest), (0, Some(at("2026-01-01T10:00:00Z"))));
        // The next tick, from where this one ended, finds nothing.
        let p = plan(&s, "2026-01-01T10:00:00Z", "2026-01-01T10:00:02Z");
        assert_eq!(p, DuePlan::default());
    }

    #[test]
    fn six_fields_are_seconds() {
        let s = schedule("*/2 * * * * *", "UTC");
        let p = plan(&s, "2026-01-01T10:00:00Z", "2026-01-01T10:00:05Z");
        assert_eq!(p.start.len(), 2, "{p:?}");
        assert_eq!(p.start[0], at("2026-01-01T10:00:02Z"));
    }

    #[test]
    fn catch_up_after_downtime_across_several_due_times() {
        // Down from just after 01:00 to 05:10: 02:00, 03:00, 04:00 and
        // 05:00 passed while nobody looked.
        let mut s = schedule("0 * * * *", "UTC");
        let (after, now) = ("2026-01-01T01:00:00Z", "2026-01-01T05:10:00Z");

        s.catch_up = CatchUp::None;
        let p = plan(&s, after, now);
        assert_eq!((times(&p.start), p.missed), (vec![], 4));
        assert_eq!(p.newest, Some(at("2026-01-01T05:00:00Z")));

        s.catch_up = CatchUp::Latest;
        let p = plan(&s, after, now);
        assert_eq!((times(&p.start), p.missed), (vec!["05:00".into()], 3));

        s.catch_up = CatchUp::All;
        let p = plan(&s, after, now);
        assert_eq!(times(&p.start), ["02:00", "03:00", "04:00", "05:00"]);
        assert_eq!(p.missed, 0);

        // Within a two-hour window only 04:00 and 05:00 may still run.
        s.catch_up_window_secs = 2 * 3600;
        let p = plan(&s, after, now);
        assert_eq!(
            (times(&p.start), p.missed),
            (vec!["04:00".into(), "05:00".into()], 2)
        );
        s.catch_up = CatchUp::Latest;
        let p = plan(&s, after, now);
        assert_eq!((times(&p.start), p.missed), (vec!["05:00".into()], 3));
    }

    #[test]
    fn latest_does_not_add_a_late_run_to_an_on_time_one() {
        let mut s = schedule("0 * * * *", "UTC");
        s.catch_up = CatchUp::Latest;
        // Back at 05:00:05: 05:00 is on time, 02:00-04:00 are not run.
        let p = plan(&s, "2026-01-01T01:00:00Z", "2026-01-01T05:00:05Z");
        assert_eq!((times(&p.start), p.missed), (vec!["05:00".into()], 3));
    }

    #[test]
    fn all_is_capped_and_a_long_gap_is_counted_without_walking_it() {
        let mut s = schedule("* * * * * *", "UTC");
        s.catch_up = CatchUp::All;
        s.catch_up_window_secs = 3600;
        s.active_since = at("2025-01-01T00:00:00Z");
        // A year of seconds down: the last minute is on time and starts;
        // of the rest of the window's hour, the newest MAX_CATCH_UP do.
        let p = plan(&s, "2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z");
        assert_eq!(p.start.len(), MAX_CATCH_UP + 60);
        assert_eq!(p.start.last(), Some(&at("2026-01-01T00:00:00Z")));
        assert!(p.missed >= 3600 - MAX_CATCH_UP as u64, "{}", p.missed);
    }

    #[test]
    fn a_paused_schedule_starts_nothing_and_a_window_bounds_it() {
        let mut s = schedule("0 * * * *", "UTC");
        s.paused = true;
        assert_eq!(
            plan(&s, "2026-01-01T01:00:00Z", "2026-01-01T05:00:01Z"),
            DuePlan::default()
        );
        assert_eq!(
            s.next_due(&s.check().unwrap(), at("2026-01-01T05:00:01Z")),
            None
        );

        s.paused = false;
        s.start_at = Some(at("2026-01-01T03:00:00Z"));
        s.end_at = Some(at("2026-01-01T04:00:00Z"));
        s.catch_up = CatchUp::All;
        let p = plan(&s, "2026-01-01T01:00:00Z", "2026-01-01T05:00:01Z");
        assert_eq!(
            times(&p.start),
            ["03:00", "04:00"],
            "start_at and end_at are due"
        );
        let spec = s.check().unwrap();
        assert_eq!(
            s.next_due(&spec, at("2026-01-01T02:00:00Z")),
            Some(at("2026-01-01T03:00:00Z"))
        );
        assert_eq!(
            s.next_due(&spec, at("2026-01-01T04:00:00Z")),
            None,
            "past end_at"
        );
    }

    #[test]
    fn active_since_keeps_a_resumed_schedule_from_catching_up() {
        let mut s = schedule("0 * * * *", "UTC");
        s.catch_up = CatchUp::All;
        s.active_since = at("2026-01-01T04:30:00Z");
        let p = plan(&s, "2026-01-01T01:00:00Z", "2026-01-01T05:10:00Z");
        assert_eq!((times(&p.start), p.missed), (vec!["05:00".into()], 0));
    }

    #[test]
    fn each_overlap_policy() {
        use OverlapAction::*;
        for policy in Overlap::ALL {
            assert_eq!(overlap_action(*policy, false), Start, "{policy}");
        }
        assert_eq!(overlap_action(Overlap::Skip, true), Skip);
        assert_eq!(overlap_action(Overlap::Queue, true), Wait);
        assert_eq!(
            overlap_action(Overlap::CancelPrevious, true),
            CancelPreviousThenStart
        );
        assert_eq!(
            "cancel_previous".parse::<Overlap>(),
            Ok(Overlap::CancelPrevious)
        );
        assert!(
            "later"
                .parse::<Overlap>()
                .unwrap_err()
                .contains("skip, queue, cancel_previous")
        );
    }

    #[test]
    fn spring_forward_runs_a_time_in_the_gap_once_after_the_jump() {
        // Berlin, 29 March 2026: 02:00 CET becomes 03:00 CEST; 02:30 does
        // not exist that day.
        let spec = CronSpec::parse("30 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            dues(&spec, "2026-03-27T12:00:00Z", "2026-03-30T12:00:00Z"),
            [
                "2026-03-28T01:30:00+00:00", // 02:30 CET
                "2026-03-29T01:00:00+00:00", // 03:00 CEST, right after the gap
                "2026-03-30T00:30:00+00:00", // 02:30 CEST
            ]
        );
        // An hourly schedule has 23 due times that day, an hour apart.
        let spec = CronSpec::parse("0 * * * *", "Europe/Berlin").unwrap();
        let day = dues(&spec, "2026-03-28T22:59:59Z", "2026-03-29T21:59:59Z");
        assert_eq!(day.len(), 23, "{day:?}");
        // New York, 8 March 2026, for a zone west of UTC.
        let spec = CronSpec::parse("30 2 * * *", "America/New_York").unwrap();
        assert_eq!(
            dues(&spec, "2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z"),
            ["2026-03-08T07:00:00+00:00"] // 03:00 EDT
        );
    }

    #[test]
    fn fall_back_runs_each_wall_clock_time_once() {
        // Berlin, 25 October 2026: 03:00 CEST becomes 02:00 CET; the
        // wall clock shows 02:00-02:59 twice.
        let spec = CronSpec::parse("30 2 * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            dues(&spec, "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z"),
            [
                "2026-10-25T00:30:00+00:00", // the first 02:30 (CEST), once
                "2026-10-26T01:30:00+00:00", // 02:30 CET
            ]
        );
        // Hourly: 24 due times for the 25 real hours, 02:00 once.
        let spec = CronSpec::parse("0 * * * *", "Europe/Berlin").unwrap();
        let day = dues(&spec, "2026-10-24T21:59:59Z", "2026-10-25T22:59:59Z");
        assert_eq!(day.len(), 24, "{day:?}");
        assert!(day.contains(&"2026-10-25T00:00:00+00:00".to_owned())); // 02:00 CEST
        assert!(day.contains(&"2026-10-25T02:00:00+00:00".to_owned())); // 03:00 CET
        // A node that looks from the second pass (02:30 CET) goes on at
        // 03:00 CET, never back to the first pass.
        let spec = CronSpec::parse("*/15 * * * *", "Europe/Berlin").unwrap();
        assert_eq!(
            spec.next_after(at("2026-10-25T01:30:00Z")),
            Some(at("2026-10-25T02:00:00Z"))
        );
        assert_eq!(
            spec.next_after(at("2026-10-25T00:50:00Z")),
            Some(at("2026-10-25T02:00:00Z")),
            "02:45 CEST is followed by 03:00 CET"
        );
    }

    #[test]
    fn a_plan_across_a_dst_change_is_in_real_time() {
        // A daily 02:30 Berlin schedule down over the spring jump catches
        // up the run that happened at 03:00 CEST.
        let mut s = schedule("30 2 * * *", "Europe/Berlin");
        s.catch_up = CatchUp::All;
        let p = plan(&s, "2026-03-28T12:00:00Z", "2026-03-29T05:00:00Z");
        assert_eq!(p.start, [at("2026-03-29T01:00:00Z")]);
    }

    #[test]
    fn bad_input_names_the_field() {
        let check = |cron: &str, tz: &str| schedule(cron, tz).check().unwrap_err();
        let e = check("61 * * * *", "UTC");
        assert_eq!(e.field, "cron", "{e}");
        assert!(e.message.contains("61"), "{e}");
        let e = check("* * *", "UTC");
        assert_eq!(e.field, "cron");
        assert!(e.message.contains("3 fields"), "{e}");
        let e = check("0 0 0 * * * 2030", "UTC");
        assert_eq!(e.field, "cron", "{e}");
        let e = check("0 0 30 2 *", "UTC");
        assert_eq!(
            e,
            ScheduleError::new("cron", "`0 0 30 2 *` never comes due")
        );
        let e = check("0 * * * *", "Mars/Olympus_Mons");
        assert_eq!(e.field, "timezone");
        assert!(e.message.contains("Mars/Olympus_Mons"), "{e}");
        let mut s = schedule("0 * * * *", "UTC");
        s.start_at = Some(at("2026-02-01T00:00:00Z"));
        s.end_at = Some(at("2026-01-01T00:00:00Z"));
        assert_eq!(s.check().unwrap_err().field, "end_at");
        let mut s = schedule("0 * * * *", "UTC");
        s.catch_up_window_secs = 0;
        assert_eq!(s.check().unwrap_err().field, "catch_up_window_secs");
        s.catch_up_window_secs = u64::MAX;
        assert_eq!(s.check().unwrap_err().field, "catch_up_window_secs");
        // Unchecked, a plan still does not overflow.
        s.catch_up = CatchUp::All;
        let spec = CronSpec::parse("0 * * * *", "UTC").unwrap();
        plan_due(
            &s,
            &spec,
            at("2026-01-01T00:00:00Z"),
            at("2026-01-01T05:00:00Z"),
            Duration::MAX,
        );
        assert!(CronSpec::parse("@daily", "UTC").is_ok());
    }

    #[test]
    fn claim_keys_sort_by_schedule_then_time() {
        let id = ScheduleId::new();
        let a = claim_key(id, Utc.with_ymd_and_hms(2026, 1, 1, 9, 0, 0).unwrap());
        let b = claim_key(id, Utc.with_ymd_and_hms(2026, 1, 1, 10, 0, 0).unwrap());
        assert!(a < b);
        assert!(
            a.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "{a}"
        );
    }
}
