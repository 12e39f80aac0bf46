//! The typed client of this API: one method per operation, answering with
//! the very types the handlers send (so a field the service renames is a
//! compile error here, not a `null` in the CLI). Behind the `client`
//! feature, so the service does not link an HTTP client it never uses.
//!
//! Streaming operations (a followed log, the event stream, a backup)
//! answer with a [`ByteStream`]: their bodies are text or an archive, not
//! JSON.

use std::time::Duration;

use axum::body::Bytes;
use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use crate::routes::admin::{AuditPage, IssuedToken, SecretList, TokenList, TokenView};
pub use crate::routes::approvals::{ApprovalList, Decision};
pub use crate::routes::health::{Health, NodeList, NodeView};
pub use crate::routes::locks::{LockHolderView, LockList, LockView, LockWaiterView};
pub use crate::routes::schedules::{ScheduleList, SchedulePreview};
pub use crate::routes::storage_moves::MoveList;
pub use crate::routes::tasks::TaskList;
pub use crate::routes::templates::{TemplateList, TemplateSummary};
pub use crate::routes::testenv::{EnvironmentList, EnvironmentLogs, TopologyList};
pub use crate::routes::webhooks::{DeliveryList, WebhookList};
pub use crate::routes::workflows::{Validated, WorkflowCounts, WorkflowList, WorkflowSummary};
pub use orchestrator_core::Task;
pub use orchestrator_core::WorkflowView;
pub use orchestrator_core::access::AuditRecord;
pub use orchestrator_core::compare::Comparison;
pub use orchestrator_core::storage_move::MoveStatus;
pub use orchestrator_engine::approvals::{DecisionOutcome, PendingApproval};
pub use orchestrator_engine::secrets::SecretInfo;
pub use orchestrator_engine::webhooks::{CreatedSubscription, DeliveryView, SubscriptionView};
pub use orchestrator_engine::{PruneReport, ScheduleView};
pub use orchestrator_storage::live::StoreInfo;
pub use orchestrator_testenv::model::Topology;
pub use orchestrator_testenv::service::EnvView;

/// How long to wait for a connection; reads have no limit, since a
/// followed log or a `wait` submission may rightly take long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("token: not a valid header value")]
    InvalidToken,
    #[error("cannot build the HTTP client: {0}")]
    Build(reqwest::Error),
    /// No answer at all: nothing listens, or the connection broke.
    #[error("cannot reach the orchestrator at {url}: {error} (is `orchestrator serve` running?)")]
    Unreachable { url: String, error: reqwest::Error },
    /// The service said no, with its own error body
    /// (`{"error": {"code", "message"}}`); `hint` is the caller's advice
    /// for a 401 ([`Client::with_unauthorized_hint`]).
    #[error("{message} (HTTP {status}){}", hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
    Service {
        status: u16,
        /// The service's stable code (`not_found`, `conflict`, ...); empty
        /// when the answer had no error body.
        code: String,
        message: String,
        hint: Option<String>,
    },
    /// A 2xx answer whose body is not the declared type.
    #[error("the service answered with unexpected JSON: {0}")]
    Decode(reqwest::Error),
    /// A streamed body broke off.
    #[error("the answer broke off: {0}")]
    Body(reqwest::Error),
}

impl ClientError {
    /// The HTTP status of a refusal by the service.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Service { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// The error body every failed request gets (see `error::ErrorBody`).
#[derive(Deserialize)]
struct ErrorAnswer {
    error: ErrorAnswerDetail,
}

#[derive(Deserialize)]
struct ErrorAnswerDetail {
    code: String,
    message: String,
}

/// A streamed answer, read chunk by chunk as the service sends it.
pub struct ByteStream(Response);

impl ByteStream {
    /// The next chunk, `None` at the end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>> {
        self.0.chunk().await.map_err(ClientError::Body)
    }

    /// The rest of the body at once.
    pub async fn bytes(self) -> Result<Bytes> {
        self.0.bytes().await.map_err(ClientError::Body)
    }
}

/// `GET /tasks`: which page of which tasks.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TaskFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// Keyset paging: the last page's `next_after`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// `GET /workflows`: which page of which workflows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WorkflowFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// A template's `ref_name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Text in the name, template, reference or an input value, any case.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
    /// Keyset paging: the last page's `next_after`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// `GET /audit`: which page of which records.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditFilter {
    /// RFC 3339 or a period back from now (`24h`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
}

/// `GET /webhook-deliveries`: which page of which deliveries.
#[derive(Debug, Clone, Default, Serialize)]
pub struct DeliveryFilter {
    /// A subscription's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// `pending`, `delivered` or `failed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub offset: Option<usize>,
}

/// `POST /webhooks`: a new subscription.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NewWebhook {
    pub url: String,
    pub events: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_template: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A client of one service, with its token. Cheap to clone.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The service's base URL, without a trailing `/`.
    base: String,
    unauthorized_hint: Option<String>,
}

impl Client {
    /// A client of the service at `base_url`, sending `token` as
    /// `Authorization: Bearer` when given.
    pub fn new(base_url: &str, token: Option<&str>) -> Result<Client> {
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| ClientError::InvalidToken)?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .default_headers(headers)
            .build()
            .map_err(ClientError::Build)?;
        Ok(Client {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
            unauthorized_hint: None,
        })
    }

    /// Advice added to a 401's message: how this caller passes a token.
    pub fn with_unauthorized_hint(mut self, hint: impl Into<String>) -> Client {
        self.unauthorized_hint = Some(hint.into());
        self
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn request(&self, method: Method, path: &str) -> RequestBuilder {
        self.http.request(method, format!("{}{path}", self.base))
    }

    /// Sends a request; a non-2xx answer becomes [`ClientError::Service`]
    /// with the service's own code and message.
    async fn send(&self, request: RequestBuilder) -> Result<Response> {
        let response = request
            .send()
            .await
            .map_err(|error| ClientError::Unreachable {
                url: self.base.clone(),
                error,
            })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let (code, message) = match response.json::<ErrorAnswer>().await {
            Ok(body) => (body.error.code, body.error.message),
            Err(_) => (String::new(), "no details".to_owned()),
        };
        Err(ClientError::Service {
            status: status.as_u16(),
            code,
            message,
            hint: (status == StatusCode::UNAUTHORIZED)
                .then(|| self.unauthorized_hint.clone())
                .flatten(),
        })
    }

    async fn call<T: DeserializeOwned>(&self, request: RequestBuilder) -> Result<T> {
        self.send(request)
            .await?
            .json()
            .await
            .map_err(ClientError::Decode)
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(self.request(Method::GET, path)).await
    }

    // Tasks.

    pub async fn list_tasks(&self, filter: &TaskFilter) -> Result<TaskList> {
        self.call(self.request(Method::GET, "/tasks").query(filter))
            .await
    }

    pub async fn task(&self, id: &str) -> Result<Task> {
        self.get(&format!("/tasks/{id}")).await
    }

    /// A task's log from byte `offset`; with `follow`, streamed as it is
    /// written until the task ends.
    pub async fn task_log(&self, id: &str, offset: u64, follow: bool) -> Result<ByteStream> {
        let mut query = vec![("offset", offset.to_string())];
        if follow {
            query.push(("follow", "true".to_owned()));
        }
        let request = self
            .request(Method::GET, &format!("/tasks/{id}/logs"))
            .query(&query);
        Ok(ByteStream(self.send(request).await?))
    }

    pub async fn cancel_task(&self, id: &str) -> Result<Task> {
        self.call(self.request(Method::POST, &format!("/tasks/{id}/cancel")))
            .await
    }

    pub async fn checkpoint(&self, id: &str) -> Result<Map<String, Value>> {
        self.get(&format!("/tasks/{id}/checkpoint")).await
    }

    /// Merges `entries` into a running task's checkpoint; the whole
    /// checkpoint after.
    pub async fn save_checkpoint(
        &self,
        id: &str,
        entries: &Map<String, Value>,
    ) -> Result<Map<String, Value>> {
        let request = self
            .request(Method::PUT, &format!("/tasks/{id}/checkpoint"))
            .json(entries);
        self.call(request).await
    }

    // Workflows.

    pub async fn list_workflows(&self, filter: &WorkflowFilter) -> Result<WorkflowList> {
        self.call(self.request(Method::GET, "/workflows").query(filter))
            .await
    }

    /// How many workflows are in each status.
    pub async fn count_workflows(&self) -> Result<WorkflowCounts> {
        self.get("/workflows/counts").await
    }

    pub async fn workflow(&self, id: &str) -> Result<WorkflowView> {
        self.get(&format!("/workflows/{id}")).await
    }

    /// Two runs of one template side by side (`a` then `b`).
    pub async fn compare_workflows(&self, a: &str, b: &str) -> Result<Comparison> {
        self.get(&format!("/workflows/{a}/compare/{b}")).await
    }

    /// `POST /workflows` with a submission as the API documents it
    /// (`template`, `vars`, `meta`, ...).
    pub async fn submit_workflow(&self, submission: &Value) -> Result<WorkflowView> {
        self.call(self.request(Method::POST, "/workflows").json(submission))
            .await
    }

    /// Checks a submission and shows the workflow it would make, storing
    /// nothing.
    pub async fn validate_workflow(&self, submission: &Value) -> Result<Validated> {
        let request = self
            .request(Method::POST, "/workflows/validate")
            .json(submission);
        self.call(request).await
    }

    pub async fn cancel_workflow(&self, id: &str) -> Result<WorkflowView> {
        let path = format!("/workflows/{id}/cancel");
        self.call(self.request(Method::POST, &path)).await
    }

    pub async fn retry_workflow(&self, id: &str) -> Result<WorkflowView> {
        let path = format!("/workflows/{id}/retry");
        self.call(self.request(Method::POST, &path)).await
    }

    pub async fn pause_workflow(&self, id: &str) -> Result<WorkflowView> {
        let path = format!("/workflows/{id}/pause");
        self.call(self.request(Method::POST, &path)).await
    }

    pub async fn resume_workflow(&self, id: &str) -> Result<WorkflowView> {
        let path = format!("/workflows/{id}/resume");
        self.call(self.request(Method::POST, &path)).await
    }

    /// `GET /approvals`: the gates waiting for a decision.
    pub async fn approvals(&self) -> Result<ApprovalList> {
        self.get("/approvals").await
    }

    /// `GET /workflows/{id}/approval`: the workflow's waiting gate.
    pub async fn workflow_approval(&self, id: &str, step: Option<&str>) -> Result<PendingApproval> {
        let path = format!("/workflows/{id}/approval");
        self.call(self.request(Method::GET, &path).query(&[("step", step)]))
            .await
    }

    /// `POST /workflows/{id}/approve` (`approve`) or `/reject`.
    pub async fn decide_workflow(
        &self,
        id: &str,
        approve: bool,
        decision: &Decision,
    ) -> Result<DecisionOutcome> {
        let verb = if approve { "approve" } else { "reject" };
        let path = format!("/workflows/{id}/{verb}");
        self.call(self.request(Method::POST, &path).json(decision))
            .await
    }

    /// `POST /workflows/{id}/rerun` with `{from, include_downstream, vars}`.
    pub async fn rerun_workflow(&self, id: &str, rerun: &Value) -> Result<WorkflowView> {
        let path = format!("/workflows/{id}/rerun");
        self.call(self.request(Method::POST, &path).json(rerun))
            .await
    }

    /// The server-sent events about one workflow, as they come.
    pub async fn workflow_events(&self, workflow: &str) -> Result<ByteStream> {
        let request = self
            .request(Method::GET, "/events")
            .query(&[("workflow", workflow)]);
        Ok(ByteStream(self.send(request).await?))
    }

    pub async fn list_templates(&self) -> Result<TemplateList> {
        self.get("/templates").await
    }

    // Schedules.

    /// `POST /schedules` with a schedule as the API documents it.
    pub async fn create_schedule(&self, schedule: &Value) -> Result<ScheduleView> {
        self.call(self.request(Method::POST, "/schedules").json(schedule))
            .await
    }

    /// `POST /schedules/preview`: the next due times of `cron` in
    /// `timezone` (and `start_at`, `end_at`), as the scheduler reads them.
    pub async fn preview_schedule(&self, times: &Value) -> Result<SchedulePreview> {
        self.call(self.request(Method::POST, "/schedules/preview").json(times))
            .await
    }

    pub async fn list_schedules(&self) -> Result<ScheduleList> {
        self.get("/schedules").await
    }

    pub async fn schedule(&self, id: &str) -> Result<ScheduleView> {
        self.get(&format!("/schedules/{id}")).await
    }

    /// `PATCH /schedules/{id}` with the fields to change.
    pub async fn update_schedule(&self, id: &str, change: &Value) -> Result<ScheduleView> {
        let path = format!("/schedules/{id}");
        self.call(self.request(Method::PATCH, &path).json(change))
            .await
    }

    pub async fn delete_schedule(&self, id: &str) -> Result<()> {
        let path = format!("/schedules/{id}");
        self.send(self.request(Method::DELETE, &path)).await?;
        Ok(())
    }

    // Webhooks.

    /// A new subscription; its signing secret is in the answer only.
    pub async fn create_webhook(&self, webhook: &NewWebhook) -> Result<CreatedSubscription> {
        self.call(self.request(Method::POST, "/webhooks").json(webhook))
            .await
    }

    pub async fn list_webhooks(&self) -> Result<WebhookList> {
        self.get("/webhooks").await
    }

    pub async fn delete_webhook(&self, id: &str) -> Result<()> {
        let path = format!("/webhooks/{id}");
        self.send(self.request(Method::DELETE, &path)).await?;
        Ok(())
    }

    pub async fn webhook_deliveries(&self, filter: &DeliveryFilter) -> Result<DeliveryList> {
        let request = self
            .request(Method::GET, "/webhook-deliveries")
            .query(filter);
        self.call(request).await
    }

    /// Puts a delivered or failed delivery back in the outbox.
    pub async fn resend_delivery(&self, id: &str) -> Result<DeliveryView> {
        let path = format!("/webhook-deliveries/{id}/resend");
        self.call(self.request(Method::POST, &path)).await
    }

    // Tokens, secrets, audit, prune, backup.

    /// A new token; its secret is in the answer only.
    pub async fn create_token(&self, name: &str, role: &str) -> Result<IssuedToken> {
        let body = serde_json::json!({"name": name, "role": role});
        self.call(self.request(Method::POST, "/tokens").json(&body))
            .await
    }

    pub async fn list_tokens(&self) -> Result<TokenList> {
        self.get("/tokens").await
    }

    pub async fn revoke_token(&self, id: &str) -> Result<TokenView> {
        let path = format!("/tokens/{id}");
        self.call(self.request(Method::DELETE, &path)).await
    }

    /// `PUT /secrets/{name}` with `{value, templates?, origins?}`.
    pub async fn put_secret(&self, name: &str, secret: &Value) -> Result<SecretInfo> {
        let path = format!("/secrets/{name}");
        self.call(self.request(Method::PUT, &path).json(secret))
            .await
    }

    /// `PATCH /secrets/{name}` with `{templates?, origins?}`.
    pub async fn change_secret_scope(&self, name: &str, scope: &Value) -> Result<SecretInfo> {
        let path = format!("/secrets/{name}");
        self.call(self.request(Method::PATCH, &path).json(scope))
            .await
    }

    pub async fn list_secrets(&self) -> Result<SecretList> {
        self.get("/secrets").await
    }

    pub async fn delete_secret(&self, name: &str) -> Result<()> {
        let path = format!("/secrets/{name}");
        self.send(self.request(Method::DELETE, &path)).await?;
        Ok(())
    }

    pub async fn audit(&self, filter: &AuditFilter) -> Result<AuditPage> {
        self.call(self.request(Method::GET, "/audit").query(filter))
            .await
    }

    /// `POST /prune` with `{older_than?, audit_older_than?, dry_run}`.
    pub async fn prune(&self, request: &Value) -> Result<PruneReport> {
        self.call(self.request(Method::POST, "/prune").json(request))
            .await
    }

    /// A backup archive of the service's store, streamed.
    pub async fn backup(&self) -> Result<ByteStream> {
        Ok(ByteStream(
            self.send(self.request(Method::POST, "/backup")).await?,
        ))
    }

    pub async fn health(&self) -> Result<Health> {
        self.get("/health").await
    }

    pub async fn list_nodes(&self) -> Result<NodeList> {
        self.get("/cluster/nodes").await
    }

    /// Held and awaited locks (`GET /locks`).
    pub async fn list_locks(&self) -> Result<LockList> {
        self.get("/locks").await
    }

    // Live moves of the store.

    pub async fn store(&self) -> Result<StoreInfo> {
        self.get("/admin/storage").await
    }

    pub async fn start_migration(
        &self,
        target: &str,
        batch_size: Option<usize>,
    ) -> Result<MoveStatus> {
        let body = serde_json::json!({"target": target, "batch_size": batch_size});
        let request = self
            .request(Method::POST, "/admin/storage/migrations")
            .json(&body);
        self.call(request).await
    }

    pub async fn list_migrations(&self) -> Result<MoveList> {
        self.get("/admin/storage/migrations").await
    }

    pub async fn migration(&self, id: &str) -> Result<MoveStatus> {
        self.get(&format!("/admin/storage/migrations/{id}")).await
    }

    pub async fn cancel_migration(&self, id: &str) -> Result<MoveStatus> {
        let path = format!("/admin/storage/migrations/{id}/cancel");
        self.call(self.request(Method::POST, &path)).await
    }

    pub async fn rollback_store(&self) -> Result<StoreInfo> {
        self.call(self.request(Method::POST, "/admin/storage/rollback"))
            .await
    }

    // Test environments.

    /// `POST /test/environments/create` with a request as the API
    /// documents it (`type`, `topology`, `taskservs`, `wait`, ...).
    pub async fn create_environment(&self, request: &Value) -> Result<EnvView> {
        let request = self
            .request(Method::POST, "/test/environments/create")
            .json(request);
        self.call(request).await
    }

    pub async fn list_environments(&self) -> Result<EnvironmentList> {
        self.get("/test/environments").await
    }

    pub async fn environment(&self, id: &str) -> Result<EnvView> {
        self.get(&format!("/test/environments/{id}")).await
    }

    /// Runs the environment's checks; with `wait`, answers once they ran.
    pub async fn run_environment(&self, id: &str, wait: bool) -> Result<EnvView> {
        let request = self
            .request(Method::POST, &format!("/test/environments/{id}/run"))
            .query(&[("wait", wait)]);
        self.call(request).await
    }

    pub async fn environment_logs(&self, id: &str) -> Result<EnvironmentLogs> {
        self.get(&format!("/test/environments/{id}/logs")).await
    }

    /// Tears the environment down; with `wait`, answers once it is gone.
    pub async fn delete_environment(&self, id: &str, wait: bool) -> Result<EnvView> {
        let request = self
            .request(Method::DELETE, &format!("/test/environments/{id}"))
            .query(&[("wait", wait)]);
        self.call(request).await
    }

    pub async fn list_topologies(&self) -> Result<TopologyList> {
        self.get("/test/topologies").await
    }

    pub async fn topology(&self, name: &str) -> Result<Topology> {
        self.get(&format!("/test/topologies/{name}")).await
    }
}
