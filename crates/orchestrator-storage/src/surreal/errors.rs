//! Database errors as storage errors: which statement of a request is the
//! cause, which are retryable write conflicts, and which mean a duplicate.

use surrealdb::IndexedResults;
use surrealdb::types::AlreadyExistsError;

use crate::Error;

/// The error that made a request fail. In a transaction every statement
/// reports an error, but only one is the cause; the others say they were
/// not executed because of it.
pub(crate) fn first_error(response: &mut IndexedResults) -> Option<surrealdb::Error> {
    let mut errors: Vec<(usize, surrealdb::Error)> = response.take_errors().into_iter().collect();
    errors.sort_by_key(|(index, _)| *index);
    // Statements after a failed one are "not executed", and a COMMIT after
    // it "aborted": consequences. A COMMIT that failed by itself (a write
    // conflict found at commit, as between two writers of one workflow) is
    // the cause, and must not hide behind the "not executed" rows before it.
    let is_consequence = |e: &surrealdb::Error| {
        let message = e.message();
        message.contains("not executed")
            || (message.contains("Cannot COMMIT") && message.contains("aborted"))
    };
    match errors.iter().position(|(_, e)| !is_consequence(e)) {
        Some(cause) => Some(errors.swap_remove(cause).1),
        None => errors.into_iter().next().map(|(_, e)| e),
    }
}

pub(crate) fn db_error(context: &str, e: &surrealdb::Error) -> Error {
    Error::Database {
        context: context.to_owned(),
        message: e.message().to_owned(),
    }
}

pub(super) fn is_retryable(e: &surrealdb::Error) -> bool {
    let message = e.message();
    // A conflict inside a statement says "can be retried"; one found when
    // the transaction commits comes as "Cannot COMMIT: Transaction
    // conflict: ...". Retrying re-runs every check (a compare-and-set then
    // sees the winner's version), so it is always safe.
    message.contains("can be retried") || message.contains("Transaction conflict")
}

/// A statement error as the storage error the trait promises.
pub(super) fn classify(context: &str, e: surrealdb::Error) -> Error {
    let message = e.message();
    if let Some(AlreadyExistsError::Record { id }) = e.already_exists_details() {
        // `task:⟨0190…⟩` or task:`0190…`: the table, then the key as printed.
        let (table, key) = id.split_once(':').unwrap_or((id.as_str(), ""));
        let key = key
            .trim_matches(|c| matches!(c, '`' | '⟨' | '⟩'))
            .to_owned();
        match table {
            "task" => {
                return Error::AlreadyExists {
                    what: "task",
                    id: key,
                };
            }
            "workflow" => {
                return Error::AlreadyExists {
                    what: "workflow",
                    id: key,
                };
            }
            "schedule" => {
                return Error::AlreadyExists {
                    what: "schedule",
                    id: key,
                };
            }
            "schedule_claim" => {
                return Error::AlreadyExists {
                    what: "schedule claim",
                    id: key,
                };
            }
            "webhook_subscription" => {
                return Error::AlreadyExists {
                    what: "webhook subscription",
                    id: key,
                };
            }
            "webhook_delivery" => {
                return Error::AlreadyExists {
                    what: "webhook delivery",
                    id: key,
                };
            }
            "resource_lock" => {
                return Error::AlreadyExists {
                    what: "lock",
                    id: key,
                };
            }
            _ => {}
        }
    }
    // "Database index `workflow_idempotency_key` already contains 'k', with record ..."
    if message.contains("already contains") {
        let value = message
            .split("already contains ")
            .nth(1)
            .and_then(|rest| rest.split(", with record").next())
            .unwrap_or("")
            .trim_matches('\'')
            .to_owned();
        if message.contains("`workflow_idempotency_key`") {
            return Error::AlreadyExists {
                what: "idempotency key",
                id: value,
            };
        }
        if message.contains("`workflow_revision`") {
            return Error::AlreadyExists {
                what: "workflow revision",
                id: value,
            };
        }
    }
    if is_retryable(&e) {
        return Error::Unavailable(format!(
            "{context}: too many concurrent writers on one record ({message})"
        ));
    }
    db_error(context, &e)
}
