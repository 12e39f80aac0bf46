//! The one error body every failed request gets:
//! `{"error": {"code": "...", "message": "..."}}`.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use orchestrator_engine::Error as EngineError;
use serde::Serialize;
use utoipa::ToSchema;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable, machine-readable code.
    pub code: &'static str,
    /// For humans; names the field or value at fault.
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

/// The one error body of every failed request.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorBody {
    error: ErrorDetail,
}

/// The answer of an operation that reads or writes the store while the
/// store does not answer: declared once, named in each operation's
/// `responses(...)`.
#[derive(utoipa::IntoResponses)]
#[response(status = 503, description = "Storage unavailable")]
#[allow(dead_code)] // Only its declaration is used: handlers answer through `ApiError`.
pub(crate) struct StorageUnavailable(ErrorBody);

/// [`StorageUnavailable`], for an operation that also refuses new work
/// while the service shuts down.
#[derive(utoipa::IntoResponses)]
#[response(status = 503, description = "Shutting down, or storage unavailable")]
#[allow(dead_code)]
pub(crate) struct ShuttingDownOrStorageUnavailable(ErrorBody);

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ErrorDetail {
    /// Stable and meant for programs: `bad_request`, `invalid_json`,
    /// `not_found`, `method_not_allowed`, `conflict`, `request_timeout`,
    /// `payload_too_large`, `invalid_request`, `unauthorized`, `forbidden`,
    /// `secret_not_allowed`, `rate_limited`, `shutting_down`,
    /// `storage_unavailable`, ...
    #[schema(example = "invalid_request")]
    code: &'static str,
    /// For people; names the field, parameter or id at fault.
    #[schema(example = "servers[1]: invalid name")]
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code,
                message: self.message,
            },
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> ApiError {
        match error {
            EngineError::Validation { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                error.to_string(),
            ),
            EngineError::NotFound { .. } => ApiError::not_found(error.to_string()),
            EngineError::Conflict(message) => {
                ApiError::new(StatusCode::CONFLICT, "conflict", message)
            }
            EngineError::SecretNotAllowed(message) => {
                ApiError::new(StatusCode::FORBIDDEN, "secret_not_allowed", message)
            }
            EngineError::Forbidden(message) => {
                ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
            }
            EngineError::ShuttingDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                error.to_string(),
            ),
            EngineError::Internal(_) => {
                tracing::error!(error = %error, "request failed inside the service");
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the service failed to answer; see the service log",
                )
            }
            error => {
                // Details go to the log, not to the client.
                tracing::error!(error = %error, "request failed inside the service");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "storage_unavailable",
                    "the service could not read or write its storage; see the service log",
                )
            }
        }
    }
}
