//! [`ScheduleStore`] on SurrealDB: schedules (compare-and-set on
//! `version`) and the claims on their due times, created with `CREATE`,
//! which refuses a record that exists: the claim's insert-if-absent.

use async_trait::async_trait;
use orchestrator_core::ScheduleId;
use orchestrator_core::schedule::{Schedule, ScheduleClaim};
use surrealdb::types::Variables;

use super::SurrealBackend;
use super::errors::db_error;
use super::rows::{row_of, to_i64, version_param};
use crate::{Error, Record, Result, ScheduleStore};

impl SurrealBackend {
    /// Replaces a record of `table` whose stored version is `expected`;
    /// `Conflict` or `NotFound` otherwise.
    async fn compare_and_set(
        &self,
        what: &'static str,
        table: &'static str,
        record: &Record,
        expected: u64,
    ) -> Result<()> {
        let key = record.key();
        let mut vars = Variables::new();
        vars.insert("table", table);
        vars.insert("id", key.clone());
        vars.insert("expected", version_param(expected));
        vars.insert("row", row_of(record)?);
        let context = format!("update a {what}");
        let mut response = self
            .query(
                &context,
                "UPDATE type::record($table, $id) CONTENT $row WHERE version = $expected RETURN VALUE version;",
                &vars,
            )
            .await?;
        let updated: Vec<i64> = response.take(0).map_err(|e| db_error(&context, &e))?;
        if !updated.is_empty() {
            return Ok(());
        }
        let gone = Error::NotFound {
            what,
            id: key.clone(),
        };
        Err(self.why_stale(table, what, key, expected, gone).await?)
    }
}

#[async_trait]
impl ScheduleStore for SurrealBackend {
    async fn insert_schedule(&self, schedule: &Schedule) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("id", schedule.id.to_string());
        vars.insert("row", row_of(&Record::Schedule(schedule.clone()))?);
        self.query(
            "store a schedule",
            "CREATE type::record('schedule', $id) CONTENT $row;",
            &vars,
        )
        .await?;
        Ok(())
    }

    async fn update_schedule(&self, schedule: &Schedule) -> Result<Schedule> {
        let mut stored = schedule.clone();
        stored.version += 1;
        let record = Record::Schedule(stored.clone());
        self.compare_and_set("schedule", "schedule", &record, schedule.version)
            .await?;
        Ok(stored)
    }

    async fn delete_schedule(&self, id: ScheduleId) -> Result<bool> {
        let mut vars = Variables::new();
        vars.insert("id", id.to_string());
        let mut response = self
            .query(
                "delete a schedule",
                "DELETE type::record('schedule', $id) RETURN BEFORE;",
                &vars,
            )
            .await?;
        let deleted: Vec<serde_json::Value> = response
            .take(0)
            .map_err(|e| db_error("delete a schedule", &e))?;
        Ok(!deleted.is_empty())
    }

    async fn get_schedule(&self, id: ScheduleId) -> Result<Option<Schedule>> {
        let mut vars = Variables::new();
        vars.insert("id", id.to_string());
        let found = self
            .docs(
                "read a schedule",
                "SELECT VALUE doc FROM type::record('schedule', $id);",
                &vars,
            )
            .await?;
        Ok(found.into_iter().next())
    }

    async fn schedules(&self) -> Result<Vec<Schedule>> {
        self.docs(
            "list schedules",
            "SELECT VALUE doc FROM schedule ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    async fn claim(&self, claim: &ScheduleClaim) -> Result<bool> {
        let mut vars = Variables::new();
        vars.insert("id", claim.key());
        vars.insert("row", row_of(&Record::ScheduleClaim(claim.clone()))?);
        // Two nodes creating one record: the second `CREATE` (or its retry
        // after a write conflict) finds the record and fails as a
        // duplicate, so exactly one of them gets `true`.
        match self
            .query(
                "claim a due run",
                "CREATE type::record('schedule_claim', $id) CONTENT $row RETURN NONE;",
                &vars,
            )
            .await
        {
            Ok(_) => Ok(true),
            Err(Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn update_claim(&self, claim: &ScheduleClaim) -> Result<ScheduleClaim> {
        let mut stored = claim.clone();
        stored.version += 1;
        let record = Record::ScheduleClaim(stored.clone());
        self.compare_and_set("schedule claim", "schedule_claim", &record, claim.version)
            .await?;
        Ok(stored)
    }

    async fn claims(&self, schedule: ScheduleId, limit: usize) -> Result<Vec<ScheduleClaim>> {
        let mut vars = Variables::new();
        vars.insert("schedule", schedule.to_string());
        vars.insert("limit", to_i64(limit));
        self.docs(
            "list claims",
            "SELECT VALUE doc FROM schedule_claim WHERE schedule = $schedule ORDER BY id DESC LIMIT $limit;",
            &vars,
        )
        .await
    }
}
