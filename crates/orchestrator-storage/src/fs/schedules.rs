//! The filesystem backend's schedules and their claims
//! ([`crate::ScheduleStore`]).

use async_trait::async_trait;
use orchestrator_core::ScheduleId;
use orchestrator_core::schedule::{Schedule, ScheduleClaim};

use super::FsBackend;
use super::line::Line;
use super::state::State;
use crate::{Error, Result, ScheduleStore};

#[async_trait]
impl ScheduleStore for FsBackend {
    async fn insert_schedule(&self, schedule: &Schedule) -> Result<()> {
        let pending = {
            let mut state = self.lock_state();
            let id = schedule.id.to_string();
            if state.schedule(&id).is_some() {
                return Err(Error::AlreadyExists {
                    what: "schedule",
                    id,
                });
            }
            self.commit(&mut state, Line::Schedule(schedule.clone()))?
        };
        pending.durable().await
    }

    async fn update_schedule(&self, schedule: &Schedule) -> Result<Schedule> {
        let mut stored = schedule.clone();
        stored.version += 1;
        let version = |state: &State, key: &str| state.schedule(key).map(|s| s.version);
        let (key, line) = (schedule.id.to_string(), Line::Schedule(stored.clone()));
        self.compare_and_set("schedule", key, schedule.version, version, line)
            .await?;
        Ok(stored)
    }

    async fn delete_schedule(&self, id: ScheduleId) -> Result<bool> {
        let pending = {
            let mut state = self.lock_state();
            let id = id.to_string();
            if state.schedule(&id).is_none() {
                return Ok(false);
            }
            self.commit(&mut state, Line::ScheduleDeleted { id })?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn get_schedule(&self, id: ScheduleId) -> Result<Option<Schedule>> {
        Ok(self.lock_state().schedule(&id.to_string()).cloned())
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        Ok(self.lock_state().schedules().cloned().collect())
    }

    async fn claim(&self, claim: &ScheduleClaim) -> Result<bool> {
        let pending = {
            // The check and the insert happen under one lock: one process
            // has the store, so of racing claims exactly one inserts.
            let mut state = self.lock_state();
            if state.claim(&claim.key()).is_some() {
                return Ok(false);
            }
            self.commit(&mut state, Line::ScheduleClaim(claim.clone()))?
        };
        pending.durable().await?;
        Ok(true)
    }

    async fn update_claim(&self, claim: &ScheduleClaim) -> Result<ScheduleClaim> {
        let mut stored = claim.clone();
        stored.version += 1;
        let version = |state: &State, key: &str| state.claim(key).map(|c| c.version);
        let line = Line::ScheduleClaim(stored.clone());
        self.compare_and_set("schedule claim", claim.key(), claim.version, version, line)
            .await?;
        Ok(stored)
    }

    async fn claims(&self, schedule: ScheduleId, limit: usize) -> Result<Vec<ScheduleClaim>> {
        Ok(self.lock_state().claims_of(&schedule.to_string(), limit))
    }
}
