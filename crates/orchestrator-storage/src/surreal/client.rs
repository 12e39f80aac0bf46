//! The request path every call of the SurrealDB backends takes: the
//! client (or none once closed), a deadline, conflict retries, the first
//! statement error as a storage error, and whether the database answers,
//! with the probe that finds out when a server that went away answers
//! again.
//!
//! A [`Client`] is shared (`Arc`) by the backend and its group commit's
//! task (see `group`), which sends requests on the backend's behalf.

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use orchestrator_core::backoff::{Backoff, Jitter};
use surrealdb::engine::any::Any;
use surrealdb::types::Variables;
use surrealdb::{IndexedResults, Surreal};

use super::errors::{classify, db_error, first_error, is_retryable};
use crate::{Error, Result};

/// Transaction conflicts (two writers on one record) are retried this many
/// times; a compare-and-set then sees the winner's version and reports
/// `Conflict`.
const CONFLICT_RETRIES: u32 = 8;

/// The waits between those retries: up to 10 ms, then 20, 40, 80 and at
/// most 160 ms, each spread over all of its range so that racing writers
/// retry apart.
const CONFLICT_BACKOFF: Backoff =
    Backoff::doubling(Duration::from_millis(10), Duration::from_millis(160))
        .with_jitter(Jitter::Full);

/// The health probe's own deadline: `/health` should answer quickly.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The waits between health probes of a server that stopped answering.
pub(super) const PROBE_BACKOFF: Backoff =
    Backoff::doubling(Duration::from_millis(250), Duration::from_secs(5));

/// Checks the server until it answers, waiting longer after each failure.
pub(super) async fn probe(db: Weak<Surreal<Any>>, link: Arc<Link>, location: String) {
    let mut failed = 0;
    loop {
        tokio::time::sleep(PROBE_BACKOFF.delay(failed, 0.0)).await;
        let Some(db) = db.upgrade() else {
            break;
        };
        let answered = matches!(
            tokio::time::timeout(PROBE_TIMEOUT, db.query("RETURN true;").into_future()).await,
            Ok(Ok(_))
        );
        if answered {
            link.down.store(false, Ordering::Release);
            tracing::info!(%location, "surrealdb answers again");
            break;
        }
        failed += 1;
    }
    link.probing.store(false, Ordering::Release);
}

/// Whether a request that conflicts with another writer is sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retries {
    /// Up to [`CONFLICT_RETRIES`] times: every request of one caller.
    OnConflict,
    /// Never: a group commit's, whose writes are then sent each alone.
    None,
}

pub(super) struct Client {
    pub(super) name: &'static str,
    /// Where the data is, for messages: a directory, or the server URL.
    pub(super) location: String,
    /// `None` once closed. A std lock: it is held only to clone the `Arc`.
    pub(super) db: RwLock<Option<Arc<Surreal<Any>>>>,
    pub(super) request_timeout: Duration,
    /// Shared with the probe task, which outlives no one: it holds the
    /// client weakly and stops when the backend is dropped.
    pub(super) link: Arc<Link>,
}

/// Whether the server answered last time, and why not if it did not.
#[derive(Default)]
pub(super) struct Link {
    pub(super) down: AtomicBool,
    /// Set while a probe task runs, so there is only ever one.
    pub(super) probing: AtomicBool,
    reason: Mutex<String>,
}

impl Client {
    pub(super) fn new(
        name: &'static str,
        location: String,
        db: Surreal<Any>,
        request_timeout: Duration,
    ) -> Client {
        Client {
            name,
            location,
            db: RwLock::new(Some(Arc::new(db))),
            request_timeout,
            link: Arc::new(Link::default()),
        }
    }

    pub(super) fn handle(&self) -> Result<Arc<Surreal<Any>>> {
        self.db
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::Closed)
    }

    pub(super) fn unavailable(&self) -> Error {
        let reason = self.link.reason.lock().unwrap_or_else(|e| e.into_inner());
        Error::Unavailable(format!(
            "the SurrealDB {} at {} does not answer ({reason}); reconnecting",
            if self.name == "surrealdb-server" {
                "server"
            } else {
                "database"
            },
            self.location
        ))
    }

    /// Records that the database did not answer, and starts the probe that
    /// lets calls through again once it does.
    pub(super) fn mark_down(&self, db: &Arc<Surreal<Any>>, reason: String) -> Error {
        *self.link.reason.lock().unwrap_or_else(|e| e.into_inner()) = reason;
        if !self.link.down.swap(true, Ordering::AcqRel) {
            tracing::warn!(location = %self.location, "{}", self.unavailable());
        }
        if !self.link.probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(probe(
                Arc::downgrade(db),
                Arc::clone(&self.link),
                self.location.clone(),
            ));
        }
        self.unavailable()
    }

    /// Runs one request: bound parameters, a deadline, conflict retries
    /// as `retries` says, and the first statement error turned into a
    /// storage error.
    pub(super) async fn query(
        &self,
        context: &str,
        sql: &str,
        vars: &Variables,
        retries: Retries,
    ) -> Result<IndexedResults> {
        let db = self.handle()?;
        if self.link.down.load(Ordering::Acquire) {
            return Err(self.unavailable());
        }
        let mut attempt = 0;
        loop {
            let request = db.query(sql).bind(vars.clone());
            let mut response =
                match tokio::time::timeout(self.request_timeout, request.into_future()).await {
                    Err(_) => {
                        return Err(self.mark_down(
                            &db,
                            format!("no answer within {}s", self.request_timeout.as_secs_f32()),
                        ));
                    }
                    Ok(Err(e)) if e.is_connection() => {
                        return Err(self.mark_down(&db, e.to_string()));
                    }
                    Ok(Err(e)) => return Err(db_error(context, &e)),
                    Ok(Ok(response)) => response,
                };
            match first_error(&mut response) {
                None => return Ok(response),
                Some(e) => match after_failure(context, e, retries, attempt) {
                    Next::Retry(wait) => {
                        attempt += 1;
                        tokio::time::sleep(wait).await;
                    }
                    Next::Fail(error) => return Err(error),
                },
            }
        }
    }
}

/// What a request does after the database refused it.
#[derive(Debug)]
enum Next {
    Retry(Duration),
    Fail(Error),
}

/// A write conflict is retried as `retries` says, after a wait that grows
/// with `attempt`; anything else is the storage error it means.
fn after_failure(context: &str, e: surrealdb::Error, retries: Retries, attempt: u32) -> Next {
    if !is_retryable(&e) {
        return Next::Fail(classify(context, e));
    }
    match retries {
        Retries::OnConflict if attempt < CONFLICT_RETRIES => {
            Next::Retry(CONFLICT_BACKOFF.delay(attempt, clock_sample()))
        }
        // `classify` makes a conflict that outlasted its retries
        // `Unavailable`; a group's must not be taken for a database that
        // does not answer: it answered, and committed nothing.
        Retries::None => Next::Fail(db_error(context, &e)),
        Retries::OnConflict => Next::Fail(classify(context, e)),
    }
}

/// A sample in `[0, 1)` for a few milliseconds of jitter; exactness does
/// not matter, so no RNG dependency: the clock's nanoseconds will do.
fn clock_sample() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    f64::from(nanos) / 1e9
}

#[cfg(test)]
mod tests {
    use super::{CONFLICT_RETRIES, Next, Retries, after_failure};
    use crate::Error;

    fn conflict() -> surrealdb::Error {
        surrealdb::Error::internal("Transaction conflict: Write conflict".to_owned())
    }

    #[test]
    fn a_conflict_is_retried_then_unavailable() {
        let first = after_failure("w", conflict(), Retries::OnConflict, 0);
        assert!(matches!(first, Next::Retry(_)), "{first:?}");
        let last = after_failure("w", conflict(), Retries::OnConflict, CONFLICT_RETRIES);
        assert!(
            matches!(last, Next::Fail(Error::Unavailable(_))),
            "{last:?}"
        );
    }

    /// A group commit sends the writes of a group that conflicted again,
    /// one by one; it gives up on them only when the database does not
    /// answer (`Unavailable`). So its conflict must not be that.
    #[test]
    fn a_group_commits_conflict_is_a_refusal_not_a_silence() {
        let next = after_failure("group", conflict(), Retries::None, 0);
        assert!(
            matches!(next, Next::Fail(Error::Database { .. })),
            "{next:?}"
        );
    }
}
