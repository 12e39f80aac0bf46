//! The scheduler: starts the due runs of recurring schedules.
//!
//! Every node runs it. Each second it reads the schedules, asks the core
//! which due times to start (`plan_due`), and for each one tries to create
//! the store's claim on (schedule, due time). The store creates a claim
//! only if there is none (insert-if-absent), so of the nodes sharing a
//! store exactly one acts on each due time: no leader, nothing to elect,
//! nothing that can split. The claim then records what became of the due
//! run (started, skipped, waiting, missed), moved on by compare-and-set.
//!
//! A node that dies between its claim and the workflow's submission leaves
//! a claim in `claimed`; after [`CLAIM_LEASE`] another node takes it over
//! (compare-and-set) and submits again under the same idempotency key, so
//! the run starts once even if the first submission did get through.
//!
//! It submits through [`RunStarter`], which the engine implements with the
//! same path as `POST /workflows`; this module never names the engine, so
//! the dependency runs one way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use futures_util::future::BoxFuture;
use orchestrator_core::schedule::{
    ClaimState, ON_TIME, OverlapAction, Schedule, ScheduleClaim, overlap_action, plan_due,
};
use orchestrator_core::{ScheduleId, WorkflowId};
use orchestrator_storage::Storage;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::events::EventBus;
use crate::lifecycle::Lifecycle;
use crate::{Error, Result, lock};

/// How often the scheduler looks for due runs: due times are whole seconds.
const TICK: Duration = Duration::from_secs(1);

/// A claim still in `claimed` this long after its node last moved it
/// belongs to a node that stopped mid-way: another node may take it over.
pub(crate) const CLAIM_LEASE: Duration = Duration::from_secs(30);

/// How many of a schedule's newest claims are read to find its previous
/// runs and its waiting ones.
const RECENT_CLAIMS: usize = 100;

/// Starts a due run: submits the schedule's workflow, under the claim's
/// idempotency key.
pub(crate) trait RunStarter: Send + Sync {
    fn start<'a>(
        &'a self,
        schedule: &'a Schedule,
        claim: &'a ScheduleClaim,
    ) -> BoxFuture<'a, Result<WorkflowId>>;
}

/// The scheduler's state: where this node is in each schedule.
pub(crate) struct Scheduler {
    store: Storage,
    lifecycle: Arc<Lifecycle>,
    node_id: String,
    /// Where a claim's move is announced (`schedule_changed`), so a page
    /// showing the schedule's runs sees them without re-reading.
    events: Arc<EventBus>,
    /// Per schedule, the time up to which this node has dealt with its
    /// due times. Read from the newest claim when first seen, so a
    /// restart knows what ran before it. A std mutex: map operations only,
    /// never held across an await.
    cursors: Mutex<HashMap<ScheduleId, DateTime<Utc>>>,
    /// Wakes the loop at once when a schedule is created or changed.
    changed: Notify,
}

impl Scheduler {
    pub(crate) fn new(
        store: Storage,
        lifecycle: Arc<Lifecycle>,
        node_id: String,
        events: Arc<EventBus>,
    ) -> Scheduler {
        Scheduler {
            store,
            lifecycle,
            node_id,
            events,
            cursors: Mutex::new(HashMap::new()),
            changed: Notify::new(),
        }
    }

    /// A schedule was created or changed: look at it now rather than at
    /// the next tick.
    pub(crate) fn wake(&self) {
        self.changed.notify_one();
    }

    /// Ticks until `stop`.
    pub(crate) async fn run(
        self: Arc<Self>,
        starter: Arc<dyn RunStarter>,
        stop: CancellationToken,
    ) {
        loop {
            if let Err(e) = self.tick(&*starter, Utc::now()).await {
                tracing::warn!(error = %e, "scheduler: a round failed; trying again");
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = self.changed.notified() => {}
                () = tokio::time::sleep(TICK) => {}
            }
        }
    }

    /// One round at `now`: every schedule's due runs, then its waiting and
    /// abandoned claims.
    pub(crate) async fn tick(&self, starter: &dyn RunStarter, now: DateTime<Utc>) -> Result<()> {
        let schedules = self.store.schedules().schedules().await?;
        lock(&self.cursors).retain(|id, _| schedules.iter().any(|s| s.id == *id));
        for schedule in &schedules {
            if let Err(e) = self.tick_one(starter, schedule, now).await {
                tracing::warn!(schedule = %schedule.id, error = %e, "scheduler: schedule round failed");
            }
        }
        Ok(())
    }

    async fn tick_one(
        &self,
        starter: &dyn RunStarter,
        schedule: &Schedule,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let spec = match schedule.check() {
            Ok(spec) => spec,
            Err(e) => {
                tracing::warn!(schedule = %schedule.id, error = %e, "scheduler: schedule is not valid; skipped");
                return Ok(());
            }
        };
        let known = lock(&self.cursors).get(&schedule.id).copied();
        let after = match known {
            Some(at) => at,
            None => {
                let newest = self.store.schedules().claims(schedule.id, 1).await?;
                newest.first().map_or(schedule.active_since, |c| c.due)
            }
        };
        let plan = plan_due(schedule, &spec, after, now, ON_TIME);
        for due in &plan.start {
            // Due times before this one that will never start are counted
            // on the newest claim of the round.
            let missed = if Some(*due) == plan.newest {
                plan.missed
            } else {
                0
            };
            self.claim_and_start(starter, schedule, *due, missed, now)
                .await?;
        }
        if let Some(newest) = plan.newest.filter(|n| !plan.start.contains(n)) {
            let mut claim =
                ScheduleClaim::new(schedule.id, newest, ClaimState::Missed, &self.node_id, now);
            claim.missed = plan.missed;
            if self.store.schedules().claim(&claim).await? {
                self.announce(schedule.id);
                count("missed", plan.missed);
                tracing::info!(schedule = %schedule.id, missed = plan.missed, "scheduler: due runs missed");
            }
        }
        lock(&self.cursors).insert(schedule.id, now.max(after));
        self.resume_claims(starter, schedule, now).await
    }

    /// Claims one due time; if this node got it, starts it (or skips or
    /// queues it, by the overlap policy).
    async fn claim_and_start(
        &self,
        starter: &dyn RunStarter,
        schedule: &Schedule,
        due: DateTime<Utc>,
        missed: u64,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let mut claim =
            ScheduleClaim::new(schedule.id, due, ClaimState::Claimed, &self.node_id, now);
        claim.missed = missed;
        if !self.store.schedules().claim(&claim).await? {
            return Ok(()); // another node has it
        }
        self.announce(schedule.id);
        count("missed", missed);
        self.act(starter, schedule, claim, now).await
    }

    /// Applies the overlap policy to a claim this node holds (`claimed`).
    async fn act(
        &self,
        starter: &dyn RunStarter,
        schedule: &Schedule,
        mut claim: ScheduleClaim,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let previous = self.previous_runs(schedule, &claim, now).await?;
        match overlap_action(schedule.overlap, !previous.is_empty()) {
            action @ (OverlapAction::Skip | OverlapAction::Wait) => {
                let (state, reason) = if action == OverlapAction::Skip {
                    (ClaimState::Skipped, "the previous run is still going")
                } else {
                    (ClaimState::Waiting, "waits for the previous run")
                };
                claim.state = state;
                claim.reason = Some(format!("{reason} ({})", describe(&previous)));
                self.move_claim(claim, now).await?;
                if state == ClaimState::Skipped {
                    count("skipped", 1);
                }
                Ok(())
            }
            OverlapAction::CancelPreviousThenStart => {
                for run in previous.iter().filter_map(|r| r.workflow) {
                    match self.lifecycle.cancel_workflow(run).await {
                        // Finished meanwhile: nothing to cancel.
                        Ok(()) | Err(Error::Conflict(_)) => {}
                        Err(e) => return Err(e),
                    }
                }
                self.start(starter, schedule, claim, now).await
            }
            OverlapAction::Start => self.start(starter, schedule, claim, now).await,
        }
    }

    async fn start(
        &self,
        starter: &dyn RunStarter,
        schedule: &Schedule,
        mut claim: ScheduleClaim,
        now: DateTime<Utc>,
    ) -> Result<()> {
        match starter.start(schedule, &claim).await {
            Ok(workflow) => {
                claim.state = ClaimState::Started;
                claim.workflow_id = Some(workflow);
                claim.reason = None;
                self.move_claim(claim, now).await?;
                count("started", 1);
                tracing::info!(schedule = %schedule.id, %workflow, "scheduler: due run started");
                Ok(())
            }
            // A run that can never start (its template is gone, its vars
            // no longer fit): recorded, not retried.
            Err(Error::Validation { field, message }) => {
                claim.state = ClaimState::Failed;
                claim.reason = Some(format!("{field}: {message}"));
                tracing::warn!(schedule = %schedule.id, reason = ?claim.reason, "scheduler: due run cannot start");
                self.move_claim(claim, now).await?;
                count("failed", 1);
                Ok(())
            }
            // Anything else (storage, shutdown) leaves the claim `claimed`:
            // it is taken over after the lease and submitted again under
            // the same idempotency key.
            Err(e) => Err(e),
        }
    }

    async fn move_claim(&self, mut claim: ScheduleClaim, now: DateTime<Utc>) -> Result<()> {
        claim.node.clone_from(&self.node_id);
        claim.updated_at = now;
        self.store.schedules().update_claim(&claim).await?;
        self.announce(claim.schedule_id);
        Ok(())
    }

    /// A claim of the schedule was stored: its runs changed.
    fn announce(&self, schedule: ScheduleId) {
        self.events
            .publish([orchestrator_core::event::Change::schedule_changed(schedule)]);
    }

    /// The schedule's runs that are still going, other than `this`: a
    /// started run whose workflow has not finished, or a claim another
    /// node is starting right now.
    async fn previous_runs(
        &self,
        schedule: &Schedule,
        this: &ScheduleClaim,
        now: DateTime<Utc>,
    ) -> Result<Vec<PreviousRun>> {
        let claims = self
            .store
            .schedules()
            .claims(schedule.id, RECENT_CLAIMS)
            .await?;
        let mut going = Vec::new();
        for claim in claims.iter().filter(|c| c.key() != this.key()) {
            match claim.state {
                ClaimState::Started => {
                    let Some(id) = claim.workflow_id else {
                        continue;
                    };
                    let running = match self.store.tasks().get_workflow(id).await? {
                        Some(w) => !w.status.is_terminal(),
                        None => false,
                    };
                    if running {
                        going.push(PreviousRun {
                            due: claim.due,
                            workflow: Some(id),
                        });
                    }
                }
                ClaimState::Claimed if !lease_expired(claim, now) => going.push(PreviousRun {
                    due: claim.due,
                    workflow: None,
                }),
                _ => {}
            }
        }
        Ok(going)
    }

    /// Waiting claims whose turn came (`overlap: queue`), and claims left
    /// `claimed` by a node that stopped mid-way.
    async fn resume_claims(
        &self,
        starter: &dyn RunStarter,
        schedule: &Schedule,
        now: DateTime<Utc>,
    ) -> Result<()> {
        let claims = self
            .store
            .schedules()
            .claims(schedule.id, RECENT_CLAIMS)
            .await?;
        // Oldest first: a queue starts in due order.
        for claim in claims.into_iter().rev() {
            let ready = match claim.state {
                ClaimState::Claimed => lease_expired(&claim, now),
                ClaimState::Waiting => {
                    !schedule.paused && self.previous_runs(schedule, &claim, now).await?.is_empty()
                }
                _ => false,
            };
            if !ready {
                continue;
            }
            // Take it by compare-and-set: of nodes racing for it, one wins.
            let mut taken = claim.clone();
            taken.state = ClaimState::Claimed;
            taken.node.clone_from(&self.node_id);
            taken.updated_at = now;
            let taken = match self.store.schedules().update_claim(&taken).await {
                Ok(taken) => taken,
                Err(orchestrator_storage::Error::Conflict { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            if claim.state == ClaimState::Claimed {
                tracing::info!(schedule = %schedule.id, due = %claim.due, from = %claim.node, "scheduler: took over an abandoned claim");
                self.act(starter, schedule, taken, now).await?;
            } else {
                self.start(starter, schedule, taken, now).await?;
            }
            // One start per round: the next waiting run waits for this one.
            return Ok(());
        }
        Ok(())
    }
}

/// A run of the schedule that is still going.
struct PreviousRun {
    due: DateTime<Utc>,
    /// `None` while another node is starting it.
    workflow: Option<WorkflowId>,
}

fn describe(runs: &[PreviousRun]) -> String {
    runs.iter()
        .map(|r| match r.workflow {
            Some(id) => format!("due {}, workflow {id}", r.due.to_rfc3339()),
            None => format!("due {}, starting", r.due.to_rfc3339()),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn lease_expired(claim: &ScheduleClaim, now: DateTime<Utc>) -> bool {
    let lease = TimeDelta::from_std(CLAIM_LEASE).unwrap_or(TimeDelta::MAX);
    now - claim.updated_at > lease
}

/// `orchestrator_schedule_runs_total{outcome}`: due runs started, skipped
/// (overlap), missed (no node ran the schedule then, and catch-up did not
/// start them) and failed (could not be submitted), counted by the node
/// that claimed them, so a cluster counts each once.
fn count(outcome: &'static str, n: u64) {
    if n > 0 {
        metrics::counter!("orchestrator_schedule_runs_total", "outcome" => outcome).increment(n);
    }
}
