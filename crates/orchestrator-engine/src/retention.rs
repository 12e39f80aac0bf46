//! Retention: deletes finished workflows (with their tasks and logs) and
//! audit records once they are older than the service keeps them, in the
//! background on every backend, or once on request (`orchestrator prune`).
//!
//! The decision per workflow is core's (`retention::prunable`); the store
//! deletes a workflow only if it is still finished at the version decided
//! on, so a retry that revives it meanwhile wins. On a shared store every
//! node sweeps; two nodes deleting the same workflow is harmless.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::retention::{Keep, prunable};
use orchestrator_core::{Workflow, WorkflowId, WorkflowStatus};
use orchestrator_storage::{AuditQuery, Storage, WorkflowQuery};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::Result;

/// How long the service keeps what has ended; `Keep::Forever` keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Finished workflows, unless a workflow's `meta.retain` says otherwise.
    pub finished: Keep,
    pub audit: Keep,
    /// Between background sweeps.
    pub every: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            finished: Keep::Forever,
            audit: Keep::Forever,
            every: Duration::from_secs(600),
        }
    }
}

/// One prune: what to delete, or only count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneRequest {
    pub finished: Keep,
    pub audit: Keep,
    /// Count what would go, delete nothing.
    pub dry_run: bool,
}

/// What a prune deleted (or, dry, would delete).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PruneReport {
    pub dry_run: bool,
    pub workflows: u64,
    pub tasks: u64,
    pub audit_records: u64,
}

/// Finished workflows read per page of a sweep.
const PAGE: usize = 500;

const FINISHED: [WorkflowStatus; 3] = [
    WorkflowStatus::Completed,
    WorkflowStatus::Failed,
    WorkflowStatus::Cancelled,
];

/// Runs one prune against `store` at `now`.
pub(crate) async fn prune(
    store: &Storage,
    request: PruneRequest,
    now: DateTime<Utc>,
) -> Result<PruneReport> {
    let mut report = PruneReport {
        dry_run: request.dry_run,
        ..PruneReport::default()
    };
    if request.finished != Keep::Forever {
        for status in FINISHED {
            prune_finished(store, status, request, now, &mut report).await?;
        }
    }
    if let Some(before) = request.audit.cutoff(now) {
        report.audit_records = if request.dry_run {
            let query = AuditQuery {
                until: Some(before),
                limit: 0,
                ..AuditQuery::default()
            };
            store.access().list_audit(&query).await?.total as u64
        } else {
            store.retention().prune_audit(before).await?
        };
    }
    Ok(report)
}

/// Pages through the workflows in one finished status, newest first, and
/// deletes those past keeping, page by page.
async fn prune_finished(
    store: &Storage,
    status: WorkflowStatus,
    request: PruneRequest,
    now: DateTime<Utc>,
    report: &mut PruneReport,
) -> Result<()> {
    // The newest workflow of each `meta.ref` seen this sweep: it is kept,
    // since a resubmission compares itself against it.
    let mut newest: HashMap<String, WorkflowId> = HashMap::new();
    let mut offset = 0;
    loop {
        let query = WorkflowQuery {
            status: Some(status),
            limit: PAGE,
            offset,
            ..WorkflowQuery::default()
        };
        let page = store.tasks().list_workflows(&query).await?.items;
        let mut doomed: Vec<(WorkflowId, u64)> = Vec::new();
        for workflow in &page {
            let is_newest = newest_of_reference(store, workflow, &mut newest).await?;
            if prunable(workflow, request.finished, is_newest, now) {
                doomed.push((workflow.id, workflow.version));
            }
        }
        let deleted = if request.dry_run {
            for (id, _) in &doomed {
                report.tasks += store.tasks().workflow_tasks(*id).await?.len() as u64;
            }
            report.workflows += doomed.len() as u64;
            0
        } else {
            let pruned = store.retention().prune_workflows(&doomed).await?;
            report.workflows += pruned.workflows.len() as u64;
            report.tasks += pruned.tasks;
            pruned.workflows.len()
        };
        if page.len() < PAGE {
            return Ok(());
        }
        // What was deleted no longer takes a place in the listing.
        offset += page.len() - deleted;
    }
}

async fn newest_of_reference(
    store: &Storage,
    workflow: &Workflow,
    newest: &mut HashMap<String, WorkflowId>,
) -> Result<bool> {
    let Some(reference) = &workflow.reference else {
        return Ok(false);
    };
    if let Some(id) = newest.get(reference) {
        return Ok(*id == workflow.id);
    }
    let query = WorkflowQuery {
        reference: Some(reference.clone()),
        limit: 1,
        ..WorkflowQuery::default()
    };
    // Newest first: revisions are created in order.
    let page = store.tasks().list_workflows(&query).await?;
    let id = page.items.first().map_or(workflow.id, |w| w.id);
    newest.insert(reference.clone(), id);
    Ok(id == workflow.id)
}

/// Sweeps every `config.every` until `stopping`, when anything is to be
/// deleted at all.
pub(crate) async fn run(store: Storage, config: RetentionConfig, stopping: CancellationToken) {
    if config.finished == Keep::Forever && config.audit == Keep::Forever {
        return;
    }
    loop {
        let request = PruneRequest {
            finished: config.finished,
            audit: config.audit,
            dry_run: false,
        };
        match prune(&store, request, Utc::now()).await {
            Ok(report) => record(&report),
            Err(e) => {
                tracing::warn!(error = %e, "retention sweep failed; next one in {:?}", config.every)
            }
        }
        tokio::select! {
            () = stopping.cancelled() => return,
            () = tokio::time::sleep(config.every) => {}
        }
    }
}

/// The log line and metrics of a prune that deleted something.
pub(crate) fn record(report: &PruneReport) {
    if report.dry_run {
        return;
    }
    metrics::counter!("orchestrator_pruned_workflows_total").increment(report.workflows);
    metrics::counter!("orchestrator_pruned_tasks_total").increment(report.tasks);
    metrics::counter!("orchestrator_pruned_audit_records_total").increment(report.audit_records);
    if report.workflows + report.audit_records > 0 {
        tracing::info!(
            workflows = report.workflows,
            tasks = report.tasks,
            audit_records = report.audit_records,
            "retention: deleted what was past keeping"
        );
    }
}
