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
        let bytes = Bytes::from_request(request, state).await.map_err(|e| match e {
            BytesRejection::FailedToBufferBody(_) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    format!("request body is larger than {} bytes", crate::MAX_BODY_BYTES),
                )
            }
            other => ApiError::bad_request(format!("could not read the request body: {other}")),
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::bad_request("request body is empty; expected a JSON object"));
        }
        let mut deserializer = serde_json::Deserializer::from_slice(&bytes);
        let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            if inner.is_syntax() || inner.is_eof() {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", format!("malformed JSON: {inner}"))
            } else if path == "." {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", strip_position(&inner))
            } else {
                ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_request",
                    format!("{path}: {}", strip_position(&inner)),
                )
            }
        })?;
        deserializer
            .end()
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", format!("malformed JSON: {e}")))?;
        Ok(JsonBody(value))
    }
}

/// serde_json appends "at line 1 column 40"; the field path says more.
fn strip_position(error: &serde_json::Error) -> String {
    let text = error.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
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
            .map_err(|e: QueryRejection| ApiError::bad_request(format!("invalid query string: {}", e.body_text())))
    }
}
