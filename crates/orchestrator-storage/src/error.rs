//! Storage errors.

use std::path::PathBuf;

use orchestrator_core::TaskId;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("task {0} not found")]
    TaskNotFound(TaskId),
    #[error("workflow {0} not found")]
    WorkflowNotFound(orchestrator_core::WorkflowId),
    #[error("{what} {id} was changed concurrently (expected version {expected}, found {found})")]
    Conflict {
        what: &'static str,
        id: String,
        expected: u64,
        found: u64,
    },
    /// A record other than a task or workflow (a schedule, a claim) that
    /// does not exist.
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    #[error("{what} {id} already exists")]
    AlreadyExists { what: &'static str, id: String },
    #[error(
        "storage backend `{backend}` is not available in this build; rebuild with `--features {feature}`"
    )]
    BackendNotCompiled {
        backend: &'static str,
        feature: &'static str,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}: corrupt record: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{}", .0)]
    Layout(String),
    #[error(
        "data dir {} is in use by another orchestrator process (lock file {} is held)",
        dir.display(),
        dir.join("LOCK").display()
    )]
    Locked { dir: PathBuf },
    /// A durable write failed earlier; in-memory state may be ahead of disk,
    /// so the store refuses further writes until it is reopened.
    #[error("storage is unusable after an earlier write failure ({0}); restart the service")]
    Poisoned(String),
    #[error("storage is closed")]
    Closed,
    /// A store opened with [`crate::open_read_only`] was asked to write.
    #[error("{0} is open read-only; it is never written to")]
    ReadOnly(String),
    /// The database cannot be reached right now (a server that went away,
    /// a request that timed out). The write may or may not have happened;
    /// the caller re-reads before deciding again.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A SurrealDB server refused the credentials. Callers add which of
    /// their settings hold them: the flags differ between commands.
    #[error("cannot sign in to the SurrealDB server at {location} as `{username}`: {reason}")]
    SignIn {
        location: String,
        username: String,
        reason: String,
    },
    /// The database refused a request for a reason other than the ones
    /// above (a malformed record, a permission, an internal error).
    #[error("database error while trying to {context}: {message}")]
    Database { context: String, message: String },
    /// The schema cannot be brought to what this build needs: a changed or
    /// dirty migration, a newer schema, a held lock. The message says what
    /// to do.
    #[error("{0}")]
    Schema(String),
    /// A setting is unusable (an empty URL, an unknown engine); the message
    /// names the setting and the value.
    #[error("{0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }
}
