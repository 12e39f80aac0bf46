//! Extractors whose rejections use the API's error body and name the
//! field at fault.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Query, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;

use crate::ApiError;

/// A JSON body. Malformed JSON is a 400; JSON of the wrong shape is a 422
/// whose message gives the path of the offending field (`servers[1]`).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|e| match e {
                BytesRejection::FailedToBufferBody(_)
                    if e.status() == StatusCode::PAYLOAD_TOO_LARGE =>
                {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        format!(
                            "request body is larger than {} bytes",
                            crate::MAX_BODY_BYTES
                        ),
                    )
                }
                other => ApiError::bad_request(format!("could not read the request body: {other}")),
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request(
                "request body is empty; expected a JSON object",
            ));
        }
        let json: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_json",
                format!("malformed JSON: {e}"),
            )
        })?;
        if !json.is_object() {
            // serde would read an array as positional fields; say what we want instead.
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                format!("request body must be a JSON object, not {}", kind_of(&json)),
            ));
        }
        Ok(JsonBody(from_value(json)?))
    }
}

/// Deserializes a JSON value; a mismatch is a 422 naming the field's path.
pub fn from_value<T: DeserializeOwned>(json: serde_json::Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(json).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = if path == "." {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        };
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    })
}

fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Query parameters with 400 rejections naming the parameter.
pub struct QueryParams<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(value)| QueryParams(value))
            .map_err(|e: QueryRejection| {
                ApiError::bad_request(format!("invalid query string: {}", e.body_text()))
            })
    }
}

/// The API token a request comes from, as the submitter of what it
/// creates (a workflow's or a schedule's `submitted_by`: who its approval
/// gates refuse, whose script sandboxes it shares); `None` without tokens
/// (`local`: everyone is the same caller then). Never rejects.
pub struct Submitter(pub Option<String>);

impl<S: Send + Sync> FromRequestParts<S> for Submitter {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let principal = parts
            .extensions
            .get::<orchestrator_engine::access::Principal>();
        Ok(Submitter(
            principal
                .filter(|p| p.token_id.is_some())
                .map(|p| p.actor.clone()),
        ))
    }
}
