//! Submissions: a template plus inputs becomes a workflow and its tasks,
//! stored in one atomic write. Idempotency keys and `meta.ref` revisions
//! make resubmission safe.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::submission::submission_digest;
use orchestrator_core::template::{
    Expansion, Limit, MAX_DURATION, MAX_PARALLEL_LIMIT, Template, json_size,
};
use orchestrator_core::{Priority, Task, TaskSpec, Workflow, WorkflowStatus};
use orchestrator_storage::WorkflowQuery;
use serde_json::{Map, Value};

use crate::engine::Engine;
use crate::secrets::{SecretUser, secrets_named};
use crate::templates::{check, input_refusal};
use crate::{Error, Result, WorkflowView};

/// The most attempts a submission may ask for per task (`max_attempts`);
/// the API's document states it as the field's `maximum`.
pub const MAX_ATTEMPTS: u32 = 100;

/// Which template a submission runs.
#[derive(Debug, Clone)]
pub enum TemplateSource {
    /// A registered template; the newest `schema_version` unless given.
    Named {
        ref_name: String,
        version: Option<u32>,
    },
    /// A template sent with the submission.
    Inline(Box<Template>),
}

impl TemplateSource {
    /// Who uses a secret in a workflow of this template.
    pub fn secret_user(&self) -> SecretUser<'_> {
        match self {
            TemplateSource::Named { ref_name, .. } => SecretUser::Registered(ref_name),
            TemplateSource::Inline(_) => SecretUser::Inline,
        }
    }
}

/// Caller-side labels of a workflow.
#[derive(Debug, Clone, Default)]
pub struct Meta {
    /// The caller's name for this piece of work; the same `reference` with
    /// the same body is the same workflow, with another body a new revision.
    pub reference: Option<String>,
    pub trace_id: Option<String>,
    pub name: Option<String>,
    pub description: Option<String>,
    /// How long to keep the workflow once finished (`meta.retain`).
    pub retain: Option<orchestrator_core::retention::Keep>,
    /// The token that submits it, when the service runs with tokens: its
    /// approval gates refuse its own approval unless they allow it.
    pub submitted_by: Option<String>,
}

/// Everything a workflow submission says.
#[derive(Debug, Clone)]
pub struct SubmitRequest {
    pub template: TemplateSource,
    /// Workflow inputs; `steps.<ref_name>` holds per-step input overrides.
    pub vars: Map<String, Value>,
    pub meta: Meta,
    /// Start no step before this time.
    pub start_at: Option<DateTime<Utc>>,
    pub check_mode: bool,
    pub priority: Priority,
    /// Attempts per step where the template does not say.
    pub max_attempts: Option<u32>,
    /// Per-attempt timeout where the template does not say.
    pub timeout: Option<Duration>,
    /// Overrides the template's `parallel_limit`.
    pub parallel_limit: Option<usize>,
    pub idempotency_key: Option<String>,
    /// The body as received: stored with the workflow, and digested to tell
    /// a repeat from a change.
    pub body: Value,
}

/// The numbers of a submission's options, each within its range: what
/// meets the clock (a timeout) is bounded so that no addition overflows.
pub(crate) fn check_numbers(request: &SubmitRequest) -> Result<()> {
    if let Some(n) = request
        .max_attempts
        .filter(|n| !(1..=MAX_ATTEMPTS).contains(n))
    {
        return Err(Error::validation(
            "max_attempts",
            format!("{n} is out of range: must be from 1 to {MAX_ATTEMPTS}"),
        ));
    }
    if let Some(timeout) = request
        .timeout
        .filter(|t| *t < Duration::from_secs(1) || *t > MAX_DURATION)
    {
        return Err(Error::validation(
            "timeout_secs",
            format!(
                "{} is out of range: must be from 1 to {} (30 days)",
                timeout.as_secs(),
                MAX_DURATION.as_secs()
            ),
        ));
    }
    if let Some(n) = request
        .parallel_limit
        .filter(|n| !(1..=MAX_PARALLEL_LIMIT).contains(n))
    {
        return Err(Error::validation(
            "parallel_limit",
            format!("{n} is out of range: must be from 1 to {MAX_PARALLEL_LIMIT}"),
        ));
    }
    Ok(())
}

impl Engine {
    fn template_for(&self, source: &TemplateSource) -> Result<Arc<Template>> {
        let limits = &self.config().limits;
        // Counted before the template is checked: checking is linear in
        // its steps, but not free.
        let too_many_steps = |template: &Template, field: &str| {
            limits
                .check(
                    field,
                    Limit::TemplateSteps,
                    u64::try_from(template.steps.len()).ok(),
                )
                .map_err(|e| Error::validation(e.field, e.message))
        };
        match source {
            TemplateSource::Named { ref_name, version } => {
                let template = self.named_template(ref_name, *version)?;
                too_many_steps(&template, "steps")?;
                // Scripts may have changed since the start (and built-ins are
                // not checked then): check them for every submission.
                check(&template, self.steps())
                    .map_err(|e| Error::validation(e.field, e.message))?;
                Ok(template)
            }
            TemplateSource::Inline(template) => {
                too_many_steps(template, "template.steps")?;
                check(template, self.steps())
                    .map_err(|e| Error::validation(format!("template.{}", e.field), e.message))?;
                Ok(Arc::new((**template).clone()))
            }
        }
    }

    fn named_template(&self, ref_name: &str, version: Option<u32>) -> Result<Arc<Template>> {
        self.templates().get(ref_name, version).ok_or_else(|| {
            let known: Vec<String> = self
                .templates()
                .all()
                .map(|t| format!("{}@{}", t.ref_name, t.schema_version))
                .collect();
            let wanted = match version {
                Some(v) => format!("{ref_name}@{v}"),
                None => ref_name.to_owned(),
            };
            Error::validation(
                "template",
                format!("unknown template `{wanted}` (known: {})", known.join(", ")),
            )
        })
    }

    /// Full validation and the planned DAG, without storing or running anything.
    pub async fn validate(&self, request: &SubmitRequest) -> Result<WorkflowView> {
        let (workflow, tasks) = self.plan_off_workers(request).await?;
        self.check_secret_use(request.template.secret_user(), &tasks)
            .await?;
        Ok(WorkflowView::new(workflow, tasks))
    }

    /// Whether the workflow's template may use every secret its tasks
    /// reference: written in the template, or put in by the submission's
    /// inputs (a `${secrets.x}` in an input is resolved like one in the
    /// template). Checked wherever a template and inputs become tasks.
    pub(crate) async fn check_secret_use(
        &self,
        user: SecretUser<'_>,
        tasks: &[Task],
    ) -> Result<()> {
        let mut names = std::collections::BTreeSet::new();
        for task in tasks {
            names.extend(secrets_named(&task.input));
            if let Some(input) = &task.step.input_template {
                names.extend(secrets_named(input));
            }
        }
        self.secrets().check_use(user, &names).await
    }

    /// [`Engine::plan`] on a blocking thread: a large (allowed) template
    /// takes a while to expand, and the async workers must go on serving
    /// `/health` and everyone else meanwhile.
    pub(crate) async fn plan_off_workers(
        &self,
        request: &SubmitRequest,
    ) -> Result<(Workflow, Vec<Task>)> {
        let engine = self.clone();
        let request = request.clone();
        tokio::task::spawn_blocking(move || engine.plan(&request))
            .await
            .map_err(|e| Error::Internal(format!("planning a submission failed: {e}")))?
    }

    /// Checks a submission and builds its workflow and tasks. Every limit
    /// on its size is checked before anything is built.
    pub(crate) fn plan(&self, request: &SubmitRequest) -> Result<(Workflow, Vec<Task>)> {
        check_numbers(request)?;
        let limits = &self.config().limits;
        let too_big =
            |e: orchestrator_core::template::TemplateError| Error::validation(e.field, e.message);
        // The template as the caller sent it (a rerun's is the stored
        // body's); a registered one was checked when it was loaded.
        if let (TemplateSource::Inline(_), Some(sent @ Value::Object(_))) =
            (&request.template, request.body.get("template"))
        {
            limits
                .check("template", Limit::TemplateBytes, Some(json_size(sent)))
                .map_err(too_big)?;
        }
        limits
            .check("vars", Limit::InputBytes, Some(json_size(&request.vars)))
            .map_err(too_big)?;
        let template = self.template_for(&request.template)?;
        let Expansion {
            vars,
            tasks: planned,
            ..
        } = template
            .expand(
                self.steps().kinds(),
                &request.vars,
                request.check_mode,
                limits,
            )
            .map_err(|e| Error::validation(e.field, e.message))?;
        let now = Utc::now();
        let mut workflow = Workflow::new(
            template.ref_name.clone(),
            request
                .meta
                .name
                .clone()
                .unwrap_or_else(|| template.name.clone()),
            now,
        );
        workflow.template_version = Some(template.schema_version);
        workflow.description = request
            .meta
            .description
            .clone()
            .or_else(|| template.description.clone());
        workflow.input = std::sync::Arc::new(request.body.clone());
        workflow.vars = vars;
        workflow.check_mode = request.check_mode;
        workflow.priority = request.priority;
        workflow.on_failure = template.on_failure;
        workflow.parallel_limit = request.parallel_limit.or(template.parallel_limit);
        workflow.reference = request.meta.reference.clone();
        workflow.trace_id = request.meta.trace_id.clone();
        workflow.retain = request.meta.retain;
        workflow.idempotency_key = request.idempotency_key.clone();
        workflow.request_digest = Some(submission_digest(&request.body));
        workflow.submitted_by = request.meta.submitted_by.clone();
        workflow.start_at = request.start_at.filter(|at| *at > now);
        if workflow.start_at.is_some() {
            workflow.status = WorkflowStatus::Scheduled;
        }
        let config = self.config();
        let mut tasks: Vec<Task> = Vec::with_capacity(planned.len());
        for planned in planned {
            // What the template check could not see: the values this
            // submission put in (an http step's URL from a workflow input).
            // Inputs that wait for step outputs are checked when they run.
            if !planned.input.is_null() {
                let kind = planned.step.kind;
                self.steps()
                    .check_input(kind, &planned.input)
                    .map_err(|refusal| {
                        let ref_name = planned.step.ref_name.as_deref().unwrap_or_default();
                        let e = input_refusal(ref_name, self.steps().input_field(kind), refusal);
                        Error::validation(e.field, e.message)
                    })?;
            }
            let depends_on = planned.depends_on.iter().map(|&i| tasks[i].id).collect();
            let spec = TaskSpec {
                name: planned.name,
                script: planned.script,
                input: planned.input,
                priority: request.priority,
                max_attempts: planned
                    .max_attempts
                    .or(request.max_attempts)
                    .unwrap_or(config.default_max_attempts),
                timeout: planned
                    .timeout
                    .or(request.timeout)
                    .unwrap_or(config.default_timeout),
                check_mode: request.check_mode,
                depends_on,
                step: planned.step,
            };
            let mut task = Task::new(workflow.id, spec, now);
            task.not_before = workflow.start_at;
            if task.step.kind.as_str() == crate::approval_step::APPROVAL {
                crate::approval_step::make_gate(&mut task, request.meta.submitted_by.clone(), now);
            }
            if task.step.input_template.is_some() {
                // Its input is resolved at release, even when the steps it
                // reads from have no instances (then it reads `[]`).
                task.status = orchestrator_core::TaskStatus::Pending;
            }
            tasks.push(task);
        }
        workflow.task_ids = tasks.iter().map(|t| t.id).collect();
        Ok((workflow, tasks))
    }

    /// Validates and stores a workflow, then starts it. Returns the view and
    /// whether it already existed (an idempotent repeat).
    pub async fn submit(&self, request: SubmitRequest) -> Result<(WorkflowView, bool)> {
        self.accepting()?;
        let inner = &self.inner;
        let (mut workflow, tasks) = self.plan_off_workers(&request).await?;
        self.check_secret_use(request.template.secret_user(), &tasks)
            .await?;
        loop {
            if let Some(existing) = self.find_repeat(&mut workflow).await? {
                return Ok((self.workflow(existing.id).await?, true));
            }
            match inner.records.insert_workflow(&workflow, &tasks).await {
                Ok(()) => break,
                // A concurrent twin got there first: look again.
                Err(Error::Storage(orchestrator_storage::Error::AlreadyExists {
                    what: "idempotency key" | "workflow revision",
                    ..
                })) => continue,
                Err(e) => {
                    // The write may have landed even so (an answer lost
                    // after the commit): then the workflow is stored and
                    // nothing here queued it. The next look starts it if
                    // it exists; the client, told of the error, may send
                    // the submission again under its Idempotency-Key.
                    inner.lifecycle.mark_uncertain(workflow.id);
                    return Err(e);
                }
            }
        }
        tracing::info!(workflow = %workflow.id, template = %workflow.kind, tasks = tasks.len(), "workflow submitted");
        let started = self
            .start_stored(&workflow, &tasks)
            .await
            .inspect_err(|_| {
                // Its first decisions may be half-stored: the next look
                // decides again.
                inner.lifecycle.mark_uncertain(workflow.id);
            })?;
        if started {
            Ok((self.workflow(workflow.id).await?, false))
        } else {
            // Nothing was decided, so the records are as inserted: no
            // second read of what was just written (on a SurrealDB server
            // each read is a round trip, and a one-step workflow made 17).
            Ok((WorkflowView::new(workflow, tasks), false))
        }
    }

    /// Starts a workflow that is stored (durably) with its tasks: queues
    /// the ready ones and settles the rest. Returns false when there was
    /// nothing to settle, so the stored records are still as given.
    pub(crate) async fn start_stored(&self, workflow: &Workflow, tasks: &[Task]) -> Result<bool> {
        let inner = &self.inner;
        inner.queue.register_limit(workflow);
        for task in tasks
            .iter()
            .filter(|t| t.status == orchestrator_core::TaskStatus::Queued)
        {
            inner.queue.push(task);
        }
        // Every task queued: there is nothing to release or skip, and a
        // workflow whose tasks have not ended can not finish, so a round of
        // decisions would only read the records back. (A workflow without
        // tasks finishes in that round.)
        let all_queued = !tasks.is_empty()
            && tasks
                .iter()
                .all(|t| t.status == orchestrator_core::TaskStatus::Queued);
        if all_queued {
            // Stored as given: the first claim marks it running from here.
            inner.lifecycle.keep_fresh(workflow);
            return Ok(false);
        }
        inner.lifecycle.advance(workflow.id).await?;
        Ok(true)
    }

    /// The workflow this submission repeats, if any; sets the revision of
    /// `workflow` when its `reference` was seen with another body.
    async fn find_repeat(&self, workflow: &mut Workflow) -> Result<Option<Workflow>> {
        let store = self.inner.store.tasks();
        if let Some(key) = &workflow.idempotency_key {
            let query = WorkflowQuery {
                idempotency_key: Some(key.clone()),
                limit: 1,
                ..Default::default()
            };
            if let Some(existing) = store.list_workflows(&query).await?.items.pop() {
                if existing.request_digest != workflow.request_digest {
                    return Err(Error::Conflict(format!(
                        "Idempotency-Key `{key}` was already used for a different request (workflow {})",
                        existing.id
                    )));
                }
                return Ok(Some(existing));
            }
        }
        if let Some(reference) = &workflow.reference {
            let query = WorkflowQuery {
                reference: Some(reference.clone()),
                limit: 1,
                ..Default::default()
            };
            if let Some(latest) = store.list_workflows(&query).await?.items.pop() {
                if latest.request_digest == workflow.request_digest {
                    return Ok(Some(latest));
                }
                workflow.revision = latest.revision + 1;
                workflow.previous_revision = Some(latest.id);
            }
        }
        Ok(None)
    }
}
