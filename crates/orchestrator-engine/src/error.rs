//! Engine errors, each with enough context for a client-facing message.

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The submission is malformed; `field` names the part at fault.
    #[error("{field}: {message}")]
    Validation { field: String, message: String },
    #[error("{what} {id} not found")]
    NotFound { what: &'static str, id: String },
    /// The request is valid but the target's state forbids it.
    #[error("{0}")]
    Conflict(String),
    /// A secret's scope does not allow this use; the message names the
    /// secret and the rule, never the value.
    #[error("{0}")]
    SecretNotAllowed(String),
    /// The caller may not do this (an approval gate's rule); the message
    /// names the token and the rule.
    #[error("{0}")]
    Forbidden(String),
    #[error("the service is shutting down")]
    ShuttingDown,
    /// A fault of the service itself (a panic while planning), told to
    /// the log, not the client.
    #[error("internal error: {0}")]
    Internal(String),
    #[error(transparent)]
    Storage(#[from] orchestrator_storage::Error),
}

impl Error {
    /// Whether a write lost a compare-and-set race: read again and decide
    /// again.
    pub(crate) fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::Storage(orchestrator_storage::Error::Conflict { .. })
        )
    }

    pub fn validation(field: impl Into<String>, message: impl Into<String>) -> Error {
        Error::Validation {
            field: field.into(),
            message: message.into(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<orchestrator_core::Error> for Error {
    fn from(e: orchestrator_core::Error) -> Self {
        Error::Conflict(e.to_string())
    }
}
