//! `/webhooks` and `/webhook-deliveries`: notification subscriptions, the
//! delivery log and re-sends (role admin: a target URL, such as a Slack
//! incoming webhook's, is itself a credential), each with its OpenAPI
//! declaration.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use orchestrator_core::webhook::DeliveryStatus;
use orchestrator_engine::webhooks::{
    CreatedSubscription, DeliveryView, SubscriptionRequest, SubscriptionView, Webhooks,
};
use orchestrator_storage::DeliveryQuery;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::page_bounds;
use crate::error::{ErrorBody, StorageUnavailable};
use crate::extract::{JsonBody, QueryParams};
use crate::{ApiError, AppState};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_webhooks, create_webhook))
        .routes(routes!(delete_webhook))
        .routes(routes!(list_deliveries))
        .routes(routes!(resend_delivery))
}

fn webhooks(state: &AppState) -> Result<&Webhooks, ApiError> {
    state
        .engine
        .webhooks()
        .ok_or_else(|| ApiError::not_found("webhooks are not enabled on this service"))
}

/// `POST /webhooks`.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "url": "http://hooks.example.com/services/T000/B000/XXXX",
    "events": ["workflow.failed", "step.failed"],
    "body_template": {"text": "${event.summary}"}
}))]
pub(crate) struct NewWebhook {
    /// Where to POST; its host must be in the service's HTTP allowlist.
    #[schema(max_length = 2048)]
    url: String,
    /// Event types: `workflow.completed`, `workflow.failed`,
    /// `workflow.cancelled`, `step.failed`, `schedule.missed`.
    #[schema(max_items = 16)]
    events: Vec<String>,
    /// The body to send, with `${event.<field>}` placeholders in its
    /// strings; the Standard Webhooks shape (`type`, `timestamp`, `data`)
    /// when absent.
    body_template: Option<Map<String, Value>>,
    #[schema(max_length = 1024)]
    description: Option<String>,
}

/// Subscribes a URL to events. The answer holds the signing secret,
/// shown this once.
#[utoipa::path(post, path = "/webhooks", tag = "webhooks",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("webhook.create"))),
    request_body = NewWebhook,
    responses(
        (status = 201, description = "Stored; `secret` verifies its signatures and is never shown again", body = CreatedSubscription, links(
            ("delete" = (operation_id = "delete_webhook", parameters(("id" = "$response.body#/subscription/id")))),
        )),
        (status = 400, description = "Empty body or malformed JSON", body = ErrorBody),
        (status = 404, description = "Webhooks are not enabled on this service", body = ErrorBody),
        (status = 409, description = "There are as many subscriptions as the service keeps", body = ErrorBody),
        (status = 413, description = "The body is larger than 1 MiB", body = ErrorBody),
        (status = 422, description = "A URL outside the HTTP allowlist (the message names the host), an unknown event type or placeholder; the message names the field", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn create_webhook(
    State(state): State<AppState>,
    JsonBody(body): JsonBody<NewWebhook>,
) -> Result<Response, ApiError> {
    let created = webhooks(&state)?
        .create(SubscriptionRequest {
            url: body.url,
            events: body.events,
            body_template: body.body_template.map(Value::Object),
            description: body.description,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(created)).into_response())
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WebhookList {
    /// Oldest first; never their secrets.
    pub webhooks: Vec<SubscriptionView>,
}

/// Every webhook subscription, oldest first.
#[utoipa::path(get, path = "/webhooks", tag = "webhooks",
    extensions(("x-role" = json!("admin"))),
    responses(
        (status = 200, description = "The subscriptions", body = WebhookList),
        (status = 404, description = "Webhooks are not enabled on this service", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn list_webhooks(
    State(state): State<AppState>,
) -> Result<Json<WebhookList>, ApiError> {
    let webhooks = webhooks(&state)?.list().await?;
    Ok(Json(WebhookList { webhooks }))
}

/// Deletes a subscription; its deliveries still pending are not sent.
#[utoipa::path(delete, path = "/webhooks/{id}", tag = "webhooks",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("webhook.delete"))),
    params(("id" = String, Path, description = "Subscription id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such subscription", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn delete_webhook(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    webhooks(&state)?.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeliveryParams {
    /// Only deliveries of this subscription.
    webhook: Option<String>,
    /// Only deliveries in this status.
    #[param(value_type = Option<DeliveryStatus>)]
    status: Option<String>,
    /// Page size, default 50.
    #[param(minimum = 0, maximum = 1000)]
    limit: Option<u32>,
    /// Records to skip.
    #[param(minimum = 0, maximum = 4294967295u32)]
    offset: Option<u32>,
}

/// A page of the delivery log, newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeliveryList {
    pub deliveries: Vec<DeliveryView>,
    /// How many deliveries match, in all pages.
    pub total: usize,
    pub limit: usize,
    pub offset: usize,
}

/// The delivery log: each delivery with its attempts (time, status code
/// or error, duration).
#[utoipa::path(get, path = "/webhook-deliveries", tag = "webhooks",
    extensions(("x-role" = json!("admin"))),
    params(DeliveryParams),
    responses(
        (status = 200, description = "A page of deliveries", body = DeliveryList),
        (status = 400, description = "A bad query parameter", body = ErrorBody),
        (status = 404, description = "Webhooks are not enabled on this service", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn list_deliveries(
    State(state): State<AppState>,
    QueryParams(params): QueryParams<DeliveryParams>,
) -> Result<Json<DeliveryList>, ApiError> {
    let status = params
        .status
        .as_deref()
        .map(|s| {
            s.parse::<DeliveryStatus>()
                .map_err(|e| ApiError::bad_request(format!("status: {e}")))
        })
        .transpose()?;
    let (limit, offset) = page_bounds(params.limit, params.offset)?;
    let page = webhooks(&state)?
        .deliveries(&DeliveryQuery {
            subscription: params.webhook,
            status,
            limit,
            offset,
        })
        .await?;
    Ok(Json(DeliveryList {
        deliveries: page.items,
        total: page.total,
        limit,
        offset,
    }))
}

/// Sends a delivered or failed delivery again: a new round of attempts,
/// with the same `webhook-id` and body.
#[utoipa::path(post, path = "/webhook-deliveries/{id}/resend", tag = "webhooks",
    extensions(("x-role" = json!("admin")), ("x-audit" = json!("webhook.resend"))),
    params(("id" = String, Path, description = "Delivery id (`webhook-id`)")),
    responses(
        (status = 202, description = "Back in the outbox", body = DeliveryView),
        (status = 404, description = "No such delivery", body = ErrorBody),
        (status = 409, description = "The delivery is pending already, or its subscription was deleted", body = ErrorBody),
        StorageUnavailable,
    ))]
pub(crate) async fn resend_delivery(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let delivery = webhooks(&state)?.resend(&id).await?;
    Ok((StatusCode::ACCEPTED, Json(delivery)).into_response())
}
