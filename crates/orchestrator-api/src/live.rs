//! Live views: the event stream (`GET /events`, server-sent events) and a
//! task's log as it is written (`GET /tasks/{id}/logs?follow=true`).
//!
//! Both ride on the engine's event bus; neither polls storage in a loop
//! while nothing happens. One `/events` stream carries every workflow's
//! events, so a page needs one connection, however much it shows.
//!
//! Each stream holds a connection (and a subscription) for as long as the
//! client keeps it: a caller may hold at most `--max-streams` of them at
//! once, counted per token (the `local` principal without auth), and the
//! next is refused with `429 too_many_streams` ([`StreamSlots`]).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use futures_util::stream::{self, Stream};
use orchestrator_core::event::{Event, EventKind};
use orchestrator_core::{TaskId, TaskStatus, WorkflowId, WorkflowStatus};
use orchestrator_engine::Engine;
use orchestrator_engine::access::Principal;
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

/// How many streams each caller has open, against the limit.
#[derive(Debug, Clone)]
pub(crate) struct StreamSlots {
    limit: usize,
    /// By caller: its token's id, or its actor (`local`) without one.
    /// Entries go when their count drops to zero, so the map holds at most
    /// one per caller with a stream open. A std `Mutex`: one map operation
    /// at a time, never held across an await.
    open: Arc<Mutex<HashMap<String, usize>>>,
}

/// One open stream of one caller; dropped with the stream (the client
/// went away, or the stream ended), which frees the slot.
#[derive(Debug)]
pub(crate) struct StreamSlot {
    caller: String,
    open: Arc<Mutex<HashMap<String, usize>>>,
}

impl StreamSlots {
    pub(crate) fn new(limit: usize) -> StreamSlots {
        StreamSlots {
            limit,
            open: Arc::default(),
        }
    }

    /// A slot for `principal`'s next stream, or `429 too_many_streams`
    /// naming the limit.
    pub(crate) fn take(&self, principal: Option<&Principal>) -> Result<StreamSlot, ApiError> {
        let caller = principal.map_or_else(
            || "anonymous".to_owned(),
            |p| p.token_id.clone().unwrap_or_else(|| p.actor.clone()),
        );
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let count = open.entry(caller.clone()).or_default();
        if *count >= self.limit {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                format!(
                    "this caller already has {} open event streams and followed logs, the \
                     limit (--max-streams); close one first",
                    self.limit
                ),
            ));
        }
        *count += 1;
        Ok(StreamSlot {
            caller,
            open: self.open.clone(),
        })
    }

    #[cfg(test)]
    fn open_for(&self, caller: &str) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(caller).copied().unwrap_or(0)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.caller) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.caller);
            }
        }
    }
}

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
    extensions(("x-role" = json!("viewer"))),
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
    principal: Option<Extension<Principal>>,
    headers: HeaderMap,
    QueryParams(params): QueryParams<EventParams>,
) -> Result<Response, ApiError> {
    let filter = Filter::parse(params)?;
    let slot = state.streams.take(principal.as_ref().map(|p| &p.0))?;
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
    // The slot lives as long as the stream.
    let stream = event_stream(first, subscription, filter, life).map(move |event| {
        let _held = &slot;
        event
    });
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
    slot: StreamSlot,
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
    // The slot lives as long as the stream.
    let body = body.map(move |chunk| {
        let _held = &slot;
        chunk
    });
    Ok((headers, Body::from_stream(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_caller_holds_at_most_the_limit_of_streams_and_a_closed_one_frees_its_slot() {
        let slots = StreamSlots::new(2);
        let alice = Principal {
            actor: "alice".into(),
            role: Some(orchestrator_core::access::Role::Viewer),
            task: None,
            token_id: Some("a1".into()),
        };
        let local = Principal::local();
        let first = slots.take(Some(&alice)).unwrap();
        let _second = slots.take(Some(&alice)).unwrap();
        let refused = slots.take(Some(&alice)).unwrap_err();
        assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
        assert!(
            refused.message.contains("--max-streams"),
            "{}",
            refused.message
        );
        // Another caller has slots of its own.
        let _theirs = slots.take(Some(&local)).unwrap();
        drop(first);
        assert_eq!(slots.open_for("a1"), 1);
        let _again = slots.take(Some(&alice)).unwrap();
        drop(_theirs);
        assert_eq!(slots.open_for("local"), 0, "an idle caller leaves no entry");
    }

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
