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
