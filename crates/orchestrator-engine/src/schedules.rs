//! Schedules as the engine's callers see them: create, list, show, change
//! and delete, each checked like a submission, and the submission of a
//! due run (the [`RunStarter`] the scheduler calls), which goes the same
//! way as `POST /workflows`.

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use orchestrator_core::schedule::{CatchUp, Overlap, Schedule, ScheduleClaim};
use orchestrator_core::{Priority, ScheduleId, WorkflowId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use crate::engine::Engine;
use crate::scheduler::RunStarter;
use crate::submit::{Meta, SubmitRequest, TemplateSource};
use crate::{Error, Result};

/// How old a late due time may be and still start under `catch_up`, when
/// the schedule does not say.
pub const DEFAULT_CATCH_UP_WINDOW_SECS: u64 = 24 * 3600;

/// How many of its newest runs a schedule is shown with.
const SHOWN_RUNS: usize = 20;

/// How many coming due times a schedule, or a preview, is shown with.
pub const NEXT_RUNS: usize = 3;

/// What `POST /schedules` asks for.
#[derive(Debug, Clone, Default)]
pub struct ScheduleRequest {
    pub name: Option<String>,
    pub template: String,
    pub version: Option<u32>,
    pub vars: Map<String, Value>,
    pub cron: String,
    /// `UTC` when absent.
    pub timezone: Option<String>,
    pub overlap: Overlap,
    pub catch_up: CatchUp,
    pub catch_up_window_secs: Option<u64>,
    pub start_at: Option<DateTime<Utc>>,
    pub end_at: Option<DateTime<Utc>>,
    pub paused: bool,
    /// The token that asks for it ([`Schedule::submitted_by`]).
    pub submitted_by: Option<String>,
}

/// What `PATCH /schedules/{id}` changes: each field that is set. The
/// optional times take `Some(None)` to be cleared.
#[derive(Debug, Clone, Default)]
pub struct SchedulePatch {
    pub name: Option<String>,
    pub template: Option<String>,
    pub version: Option<Option<u32>>,
    pub vars: Option<Map<String, Value>>,
    pub cron: Option<String>,
    pub timezone: Option<String>,
    pub overlap: Option<Overlap>,
    pub catch_up: Option<CatchUp>,
    pub catch_up_window_secs: Option<u64>,
    pub start_at: Option<Option<DateTime<Utc>>>,
    pub end_at: Option<Option<DateTime<Utc>>>,
    pub paused: Option<bool>,
}

/// A schedule with when it is next due and its newest runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ScheduleView {
    #[serde(flatten)]
    pub schedule: Schedule,
    /// `None` while paused, and once past `end_at`.
    pub next_due: Option<DateTime<Utc>>,
    /// The next three due times, oldest first (`next_due` is the first);
    /// empty while paused. From the service's cron engine and zone
    /// database, so a page never computes them itself.
    #[serde(default)]
    pub next_runs: Vec<DateTime<Utc>>,
    /// The newest claim on its due times (`runs[0]`), also in listings:
    /// what became of its last due run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<ScheduleClaim>,
    /// The newest claims on its due times, newest first: what became of
    /// each due run.
    pub runs: Vec<ScheduleClaim>,
}

impl Engine {
    pub async fn create_schedule(&self, request: ScheduleRequest) -> Result<ScheduleView> {
        let now = Utc::now();
        let schedule = Schedule {
            id: ScheduleId::new(),
            name: request.name.unwrap_or_else(|| request.template.clone()),
            template: request.template,
            template_version: request.version,
            vars: request.vars,
            cron: request.cron,
            timezone: request.timezone.unwrap_or_else(|| "UTC".to_owned()),
            overlap: request.overlap,
            catch_up: request.catch_up,
            catch_up_window_secs: request
                .catch_up_window_secs
                .unwrap_or(DEFAULT_CATCH_UP_WINDOW_SECS),
            start_at: request.start_at,
            end_at: request.end_at,
            paused: request.paused,
            submitted_by: request.submitted_by,
            active_since: now,
            created_at: now,
            updated_at: now,
            version: 0,
        };
        self.check_schedule(&schedule).await?;
        self.store().schedules().insert_schedule(&schedule).await?;
        tracing::info!(schedule = %schedule.id, cron = %schedule.cron, timezone = %schedule.timezone, "schedule created");
        self.inner.scheduler.wake();
        self.schedule_changed(schedule.id);
        self.view(schedule, Vec::new())
    }

    /// Every schedule, oldest first, with when it is next due and its
    /// newest run.
    pub async fn list_schedules(&self) -> Result<Vec<ScheduleView>> {
        let schedules = self.store().schedules().schedules().await?;
        let mut views = Vec::with_capacity(schedules.len());
        for schedule in schedules {
            let last = self.store().schedules().claims(schedule.id, 1).await?;
            let mut view = self.view(schedule, Vec::new())?;
            view.last_run = last.into_iter().next();
            views.push(view);
        }
        Ok(views)
    }

    /// The next due times of a schedule with these times, before it is
    /// stored: the same cron engine and zone database as the scheduler's.
    pub fn preview_schedule(
        &self,
        cron: &str,
        timezone: &str,
        start_at: Option<DateTime<Utc>>,
        end_at: Option<DateTime<Utc>>,
    ) -> Result<Vec<DateTime<Utc>>> {
        orchestrator_core::schedule::preview(
            cron,
            timezone,
            start_at,
            end_at,
            Utc::now(),
            NEXT_RUNS,
        )
        .map_err(|e| Error::validation(e.field, e.message))
    }

    pub async fn schedule(&self, id: ScheduleId) -> Result<ScheduleView> {
        let schedule = self.load_schedule(id).await?;
        let runs = self.store().schedules().claims(id, SHOWN_RUNS).await?;
        self.view(schedule, runs)
    }

    /// Applies a change, checked like a new schedule. Resuming, or a new
    /// cron expression or zone, starts counting due times from now: the
    /// schedule does not catch up on what it was not meant to run.
    /// A change of what it runs (its template, version or inputs) makes
    /// `changed_by` the token its runs are submitted by.
    pub async fn update_schedule(
        &self,
        id: ScheduleId,
        patch: SchedulePatch,
        changed_by: Option<String>,
    ) -> Result<ScheduleView> {
        loop {
            let old = self.load_schedule(id).await?;
            let now = Utc::now();
            let mut schedule = old.clone();
            apply(&mut schedule, patch.clone());
            if (&old.template, old.template_version, &old.vars)
                != (
                    &schedule.template,
                    schedule.template_version,
                    &schedule.vars,
                )
            {
                schedule.submitted_by.clone_from(&changed_by);
            }
            let resumed = old.paused && !schedule.paused;
            if resumed || old.cron != schedule.cron || old.timezone != schedule.timezone {
                schedule.active_since = now;
            }
            schedule.updated_at = now;
            self.check_schedule(&schedule).await?;
            match self.store().schedules().update_schedule(&schedule).await {
                Ok(stored) => {
                    tracing::info!(schedule = %id, paused = stored.paused, "schedule changed");
                    self.inner.scheduler.wake();
                    self.schedule_changed(id);
                    let runs = self.store().schedules().claims(id, SHOWN_RUNS).await?;
                    return self.view(stored, runs);
                }
                // Changed meanwhile (another request, another node): apply
                // the patch to what is stored now.
                Err(orchestrator_storage::Error::Conflict { .. }) => continue,
                Err(orchestrator_storage::Error::NotFound { .. }) => return Err(not_found(id)),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Deletes a schedule: no further run starts. Runs already started go
    /// on; its claims stay as history.
    pub async fn delete_schedule(&self, id: ScheduleId) -> Result<()> {
        if !self.store().schedules().delete_schedule(id).await? {
            return Err(not_found(id));
        }
        tracing::info!(schedule = %id, "schedule deleted");
        self.schedule_changed(id);
        Ok(())
    }

    /// Announces a stored change of a schedule to the event stream.
    fn schedule_changed(&self, id: ScheduleId) {
        self.inner
            .events
            .publish([orchestrator_core::event::Change::schedule_changed(id)]);
    }

    /// One scheduler round at `now`: the due runs of every schedule, and
    /// the waiting and abandoned ones. The engine's own loop does this
    /// every second; tests call it with a clock of their own.
    pub async fn tick_schedules(&self, now: DateTime<Utc>) -> Result<()> {
        self.inner.scheduler.tick(self, now).await
    }

    async fn load_schedule(&self, id: ScheduleId) -> Result<Schedule> {
        self.store()
            .schedules()
            .get_schedule(id)
            .await?
            .ok_or_else(|| not_found(id))
    }

    /// The schedule's own fields, then its template and vars as a
    /// submission would be checked.
    async fn check_schedule(&self, schedule: &Schedule) -> Result<()> {
        schedule
            .check()
            .map_err(|e| Error::validation(e.field, e.message))?;
        self.validate(&run_request(schedule, None)).await?;
        Ok(())
    }

    fn view(&self, schedule: Schedule, runs: Vec<ScheduleClaim>) -> Result<ScheduleView> {
        let now = Utc::now();
        let spec = schedule.check().ok();
        let next_due = spec.as_ref().and_then(|spec| schedule.next_due(spec, now));
        let next_runs = spec
            .as_ref()
            .map(|spec| schedule.next_runs(spec, now, NEXT_RUNS))
            .unwrap_or_default();
        Ok(ScheduleView {
            schedule,
            next_due,
            next_runs,
            last_run: runs.first().cloned(),
            runs,
        })
    }
}

fn not_found(id: ScheduleId) -> Error {
    Error::NotFound {
        what: "schedule",
        id: id.to_string(),
    }
}

fn apply(schedule: &mut Schedule, patch: SchedulePatch) {
    let SchedulePatch {
        name,
        template,
        version,
        vars,
        cron,
        timezone,
        overlap,
        catch_up,
        catch_up_window_secs,
        start_at,
        end_at,
        paused,
    } = patch;
    if let Some(v) = name {
        schedule.name = v;
    }
    if let Some(v) = template {
        schedule.template = v;
    }
    if let Some(v) = version {
        schedule.template_version = v;
    }
    if let Some(v) = vars {
        schedule.vars = v;
    }
    if let Some(v) = cron {
        schedule.cron = v;
    }
    if let Some(v) = timezone {
        schedule.timezone = v;
    }
    if let Some(v) = overlap {
        schedule.overlap = v;
    }
    if let Some(v) = catch_up {
        schedule.catch_up = v;
    }
    if let Some(v) = catch_up_window_secs {
        schedule.catch_up_window_secs = v;
    }
    if let Some(v) = start_at {
        schedule.start_at = v;
    }
    if let Some(v) = end_at {
        schedule.end_at = v;
    }
    if let Some(v) = paused {
        schedule.paused = v;
    }
}

/// The submission of one due run (or, without a claim, the one that
/// checks a schedule): the schedule's template and vars, traced to the
/// schedule, under the claim's idempotency key.
fn run_request(schedule: &Schedule, claim: Option<&ScheduleClaim>) -> SubmitRequest {
    let trace_id = format!("schedule:{}", schedule.id);
    let name = claim.map(|c| format!("{} @ {}", schedule.name, c.due.to_rfc3339()));
    let mut body = json!({
        "template": schedule.template,
        "vars": schedule.vars,
        "meta": {"trace_id": trace_id},
    });
    if let Some(version) = schedule.template_version {
        body["version"] = version.into();
    }
    if let Some(name) = &name {
        body["meta"]["name"] = name.clone().into();
    }
    SubmitRequest {
        template: TemplateSource::Named {
            ref_name: schedule.template.clone(),
            version: schedule.template_version,
        },
        vars: schedule.vars.clone(),
        meta: Meta {
            // The token that set up what the schedule runs.
            submitted_by: schedule.submitted_by.clone(),
            reference: None,
            trace_id: Some(trace_id),
            name,
            description: None,
            retain: None,
        },
        start_at: None,
        check_mode: false,
        priority: Priority::Normal,
        max_attempts: None,
        timeout: None,
        parallel_limit: None,
        idempotency_key: claim.map(ScheduleClaim::idempotency_key),
        body,
    }
}

impl RunStarter for Engine {
    fn start<'a>(
        &'a self,
        schedule: &'a Schedule,
        claim: &'a ScheduleClaim,
    ) -> BoxFuture<'a, Result<WorkflowId>> {
        Box::pin(async move {
            let (view, _) = self.submit(run_request(schedule, Some(claim))).await?;
            Ok(view.workflow.id)
        })
    }
}
