//! Live views: the event stream (`GET /events`, server-sent events) and a
//! task's log as it is written (`GET /tasks/{id}/logs?follow=true`).
//!
//! Both ride on the engine's event bus; neither polls storage in a loop
//! while nothing happens. One `/events` stream carries every workflow's
//! events, so a page needs one connection, however much it shows.

use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use orchestrator_core::event::{Event, EventKind};
use orchestrator_core::{TaskId, TaskStatus, WorkflowId, WorkflowStatus};
use orchestrator_engine::Engine;
use orchestrator_engine::events::Subscription;
use orchestrator_storage::WorkflowQuery;
use serde::{Deserialize, Serialize};

use crate::extract::QueryParams;
use crate::{ApiError, AppState};

/// How often an idle stream sends a comment, so that proxies and clients
/// can tell a quiet stream from a dead one.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// How many workflows the snapshot of an unfiltered stream describes.
const SNAPSHOT_WORKFLOWS: usize = 50;
/// The most a follow-stream reads from storage at once.
const FOLLOW_CHUNK: usize = 64 * 1024;
/// How long a follow-stream waits for an event before looking at storage
/// anyway (a change feed can lose events; this bounds the delay).
const FOLLOW_RECHECK: Duration = Duration::from_secs(2);

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventParams {
    /// Only this workflow's events.
    #[param(value_type = Option<uuid::Uuid>)]
    workflow: Option<String>,
    /// Only these event kinds, comma-separated.
    kind: Option<String>,
}

/// The filters of one stream.
struct Filter {
    workflow: Option<WorkflowId>,
    kinds: Option<HashSet<EventKind>>,
}

impl Filter {
    fn parse(params: EventParams) -> Result<Filter, ApiError> {
        let workflow = params
            .workflow
            .map(|id| {
                id.parse::<WorkflowId>().map_err(|_| {
                    ApiError::bad_request(format!("workflow: `{id}` is not a workflow id"))
                })
            })
            .transpose()?;
        let kinds = params
            .kind
            .map(|kinds| {
                kinds
                    .split(',')
                    .map(|k| {
                        k.trim()
                            .parse::<EventKind>()
                            .map_err(|e| ApiError::bad_request(format!("kind: {e}")))
                    })
                    .collect::<Result<HashSet<_>, _>>()
            })
            .transpose()?;
        Ok(Filter { workflow, kinds })
    }

    /// A resync always passes: whatever the filter, the client must know.
    fn passes(&self, event: &Event) -> bool {
        event.kind == EventKind::Resync
            || (self.workflow.is_none_or(|w| event.workflow_id == Some(w))
                && self.kinds.as_ref().is_none_or(|k| k.contains(&event.kind)))
    }
}

/// The state a stream starts from.
#[derive(Serialize)]
struct Snapshot {
    workflows: Vec<WorkflowSummary>,
    /// More workflows exist than the snapshot describes.
    truncated: bool,
}

#[derive(Serialize)]
struct WorkflowSummary {
    id: WorkflowId,
    status: WorkflowStatus,
    name: String,
    kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tasks: Option<Vec<TaskSummary>>,
}

#[derive(Serialize)]
struct TaskSummary {
    id: TaskId,
    status: TaskStatus,
    attempts: u32,
}

async fn snapshot(engine: &Engine, filter: &Filter) -> Result<Snapshot, ApiError> {
    if let Some(id) = filter.workflow {
        let view = engine.workflow(id).await?;
        let tasks = view
            .tasks
            .iter()
            .map(|t| TaskSummary {
                id: t.id,
                status: t.status,
                attempts: t.attempts,
            })
            .collect();
        return Ok(Snapshot {
            workflows: vec![WorkflowSummary {
                id,
                status: view.workflow.status,
                name: view.workflow.name,
                kind: view.workflow.kind,
                tasks: Some(tasks),
            }],
            truncated: false,
        });
    }
    let page = engine
        .list_workflows(&WorkflowQuery {
            limit: SNAPSHOT_WORKFLOWS,
            ..Default::default()
        })
        .await?;
    Ok(Snapshot {
        truncated: page.total > page.items.len(),
        workflows: page
            .items
            .into_iter()
            .map(|w| WorkflowSummary {
                id: w.id,
                status: w.status,
                name: w.name,
                kind: w.kind,
                tasks: None,
            })
            .collect(),
    })
}

/// The id a client sends back as `Last-Event-ID`: this life of the node
/// and the event's number, so that numbers from an earlier life (before a
/// restart) are never mistaken for this one's.
fn event_id(life: &str, seq: u64) -> String {
    format!("{life}-{seq}")
}

/// The `seq` to resume after, from `Last-Event-ID`; `Some(u64::MAX)` for
/// an id of another life (the bus then answers with a resync).
fn resume_point(headers: &HeaderMap, life: &str) -> Option<u64> {
    let id = headers.get("last-event-id")?.to_str().ok()?.trim();
    let seq = id
        .strip_prefix(life)
        .and_then(|rest| rest.strip_prefix('-'))
        .and_then(|seq| seq.parse().ok());
    Some(seq.unwrap_or(u64::MAX))
}

/// Every durable change of a task or workflow as it happens, as
/// server-sent events: a `snapshot` first, then `change` events (each with
/// an `id` for `Last-Event-ID`), and `resync` when events were lost.
#[utoipa::path(get, path = "/events", tag = "operations",
    params(
        EventParams,
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event"),
    ),
    responses(
        (status = 200, description = "The event stream (it does not end)", content_type = "text/event-stream", body = String),
        (status = 400, description = "An unknown kind or a bad workflow id", body = crate::error::ErrorBody),
        (status = 404, description = "No such workflow", body = crate::error::ErrorBody),
        (status = 503, description = "Storage unavailable", body = crate::error::ErrorBody),
    ))]
pub(crate) async fn events(
    State(state): State<AppState>,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventParams>,
) -> Result<Response, ApiError> {
    let filter = Filter::parse(params)?;
    let engine = state.engine.clone();
    let life = engine.event_life();
    // Subscribed before the snapshot is read: a change in between shows up
    // as an event after it, never falls between the two.
    let resume = resume_point(&headers, &life);
    let subscription = match resume {
        Some(seq) => engine.subscribe_after(seq),
        None => engine.subscribe(),
    };
    let first = match resume {
        // A resumed stream goes on where it was; no snapshot needed.
        Some(_) => None,
        None => {
            let snapshot = snapshot(&engine, &filter).await?;
            Some(
                SseEvent::default()
                    .event("snapshot")
                    .json_data(&snapshot)
                    .unwrap_or_else(|_| SseEvent::default().event("resync")),
            )
        }
    };
    let stream = event_stream(first, subscription, filter, life);
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response();
    // Buffering proxies (nginx) would hold events back.
    response
        .headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

fn event_stream(
    first: Option<SseEvent>,
    subscription: Subscription,
    filter: Filter,
    life: Arc<str>,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let first = stream::iter(first.map(Ok));
    let rest = stream::unfold(
        (subscription, filter, life),
        |(mut subscription, filter, life)| async move {
            loop {
                let event = subscription.recv().await?;
                if !filter.passes(&event) {
                    continue;
                }
                let sse = if event.kind == EventKind::Resync {
                    // No id: a resync is no place to resume from.
                    SseEvent::default().event("resync")
                } else {
                    SseEvent::default()
                        .event("change")
                        .id(event_id(&life, event.seq))
                };
                let sse = sse
                    .json_data(&*event)
                    .unwrap_or_else(|_| SseEvent::default().comment("unserializable event"));
                return Some((Ok(sse), (subscription, filter, life)));
            }
        },
    );
    futures_util::StreamExt::chain(first, rest)
}

/// `GET /tasks/{id}/logs?follow=true`: the log from `offset` as it is
/// written, ending once the task has ended and everything is sent.
pub(crate) async fn follow_log(
    engine: Engine,
    id: TaskId,
    offset: u64,
) -> Result<Response, ApiError> {
    // Fails with 404 before any stream starts.
    engine.task(id).await?;
    let subscription = engine.subscribe();
    let body = stream::unfold(
        Some((engine, subscription, offset)),
        move |state| async move {
            let (engine, mut subscription, mut offset) = state?;
            loop {
                let chunk = match engine
                    .store()
                    .tasks()
                    .read_log(id, offset, FOLLOW_CHUNK)
                    .await
                {
                    Ok(chunk) => chunk,
                    Err(e) => {
                        tracing::warn!(task = %id, error = %e, "log follow: read failed");
                        return None;
                    }
                };
                if !chunk.data.is_empty() {
                    offset = chunk.next_offset;
                    return Some((
                        Ok::<_, Infallible>(chunk.data),
                        Some((engine, subscription, offset)),
                    ));
                }
                // Nothing new: done if the task has ended (its log is
                // complete before its final state is stored), else wait
                // for the next event about it.
                match engine.task(id).await {
                    Ok(task) if task.status.is_terminal() => return None,
                    Ok(_) => {}
                    Err(_) => return None,
                }
                let _ = tokio::time::timeout(FOLLOW_RECHECK, async {
                    while let Some(event) = subscription.recv().await {
                        if event.task_id == Some(id) || event.kind == EventKind::Resync {
                            return;
                        }
                    }
                })
                .await;
            }
        },
    );
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok((headers, Body::from_stream(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_name_what_is_wrong() {
        let bad_kind = Filter::parse(EventParams {
            workflow: None,
            kind: Some("completed,nonsense".into()),
        });
        let message = bad_kind.err().unwrap().message;
        assert!(
            message.contains("kind") && message.contains("nonsense"),
            "{message}"
        );
        let bad_id = Filter::parse(EventParams {
            workflow: Some("nope".into()),
            kind: None,
        });
        assert!(bad_id.err().unwrap().message.contains("workflow"));
    }

    #[test]
    fn resume_points_belong_to_one_life() {
        let mut headers = HeaderMap::new();
        assert_eq!(resume_point(&headers, "17"), None);
        headers.insert("last-event-id", HeaderValue::from_static("17-42"));
        assert_eq!(resume_point(&headers, "17"), Some(42));
        assert_eq!(resume_point(&headers, "18"), Some(u64::MAX));
        headers.insert("last-event-id", HeaderValue::from_static("garbage"));
        assert_eq!(resume_point(&headers, "17"), Some(u64::MAX));
    }
}
