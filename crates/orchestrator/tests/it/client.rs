//! The typed client (`orchestrator_api::client`) against a real service:
//! each method once, reading typed fields, so an answer type that does
//! not deserialize what the handler sends fails here, not in the CLI.

use std::time::Duration;

use orchestrator_api::client::{
    AuditFilter, Client, ClientError, TaskFilter, WorkflowFilter, WorkflowView,
};
use orchestrator_core::storage_move::MovePhase;
use orchestrator_core::{TaskStatus, WorkflowStatus};
use serde_json::{Map, json};

use crate::harness::{TestService, fixture_settings, real_scripts};

const ADMIN: &str = "bootstrap-admin-token-for-the-client-tests-0123456789";

/// A service with auth on (so tokens and the audit log are real), and
/// the admin's client of it.
async fn start(dir: &std::path::Path) -> (TestService, Client) {
    let mut settings = fixture_settings(dir);
    settings.auth = true;
    settings.rate_limit = 0;
    settings.bootstrap_token = Some(orchestrator_storage::Secret::new(ADMIN));
    let service = TestService::start(settings).await;
    let client = Client::new(&service.base, Some(ADMIN)).unwrap();
    (service, client)
}

/// Polls until the workflow has ended (or panics after a minute).
async fn ended(client: &Client, id: &str) -> WorkflowView {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let view = client.workflow(id).await.unwrap();
        if view.workflow.status.is_terminal() {
            return view;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "workflow {id} never ended: {:?}",
            view.workflow.status
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The service's refusal, with its own code and status.
fn refusal(error: ClientError) -> (u16, String) {
    match error {
        ClientError::Service { status, code, .. } => (status, code),
        other => panic!("expected the service's refusal, got: {other}"),
    }
}

#[tokio::test]
async fn every_operation_of_the_cli_reads_what_the_service_sends() {
    let dir = tempfile::tempdir().unwrap();
    let (service, client) = start(&dir.path().join("data")).await;

    let health = client.health().await.unwrap();
    assert_eq!(health.status, "ok");
    assert!(!health.storage.is_empty());
    let nodes = client.list_nodes().await.unwrap();
    assert!(nodes.nodes.iter().any(|n| n.this_node && n.alive));

    // Workflows and their tasks.
    let templates = client.list_templates().await.unwrap();
    let chain = templates
        .templates
        .iter()
        .find(|t| t.ref_name == "chain")
        .expect("the fixture template `chain`");
    assert!(chain.inputs.contains_key("sleep"));
    assert_eq!(chain.steps.first().map(String::as_str), Some("a"));

    let validated = client
        .validate_workflow(&json!({"template": "chain"}))
        .await
        .unwrap();
    assert!(validated.valid);
    assert_eq!(validated.workflow.workflow.kind, "chain");
    let submitted = client
        .submit_workflow(&json!({"template": "chain", "meta": {"ref": "client-test"}}))
        .await
        .unwrap();
    assert_eq!(submitted.workflow.kind, "chain");
    assert!(!submitted.tasks.is_empty());
    let id = submitted.workflow.id.to_string();
    let view = ended(&client, &id).await;
    assert_eq!(view.workflow.status, WorkflowStatus::Completed);
    assert!(view.outputs.contains_key("a"));

    let listed = client
        .list_workflows(&WorkflowFilter {
            reference: Some("client-test".into()),
            ..WorkflowFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.total, 1);
    assert_eq!(
        listed.workflows[0].reference.as_deref(),
        Some("client-test")
    );
    let searched = client
        .list_workflows(&WorkflowFilter {
            q: Some("CLIENT-TEST".into()),
            ..WorkflowFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(searched.total, 1);
    let counts = client.count_workflows().await.unwrap();
    assert_eq!(counts.counts.get("completed"), Some(&1));

    let tasks = client
        .list_tasks(&TaskFilter {
            workflow: Some(id.clone()),
            ..TaskFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(tasks.total, view.tasks.len());
    let first = &view.tasks[0];
    let task = client.task(&first.id.to_string()).await.unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.name, first.name);
    let log = client
        .task_log(&first.id.to_string(), 0, false)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(!log.is_empty(), "the task's log is empty");
    assert!(
        client
            .checkpoint(&first.id.to_string())
            .await
            .unwrap()
            .is_empty()
    );
    // A finished task takes no checkpoint: the service's refusal comes
    // through with its code and status.
    let entries = Map::from_iter([("k".to_owned(), json!(1))]);
    let error = client
        .save_checkpoint(&first.id.to_string(), &entries)
        .await
        .unwrap_err();
    assert_eq!(refusal(error), (409, "conflict".to_owned()));
    let error = client.cancel_task(&first.id.to_string()).await.unwrap_err();
    assert_eq!(refusal(error).0, 409);
    let error = client.retry_workflow(&id).await.unwrap_err();
    assert_eq!(refusal(error).0, 409);

    let rerun = client
        .rerun_workflow(&id, &json!({"from": "b"}))
        .await
        .unwrap();
    assert_eq!(rerun.workflow.revision, 2);
    let rerun_id = rerun.workflow.id.to_string();
    let _events = client.workflow_events(&rerun_id).await.unwrap();
    assert_eq!(
        ended(&client, &rerun_id).await.workflow.status,
        WorkflowStatus::Completed
    );

    // A workflow scheduled far ahead: its tasks wait, so they cancel.
    let later = client
        .submit_workflow(&json!({
            "template": "chain",
            "schedule": {"when": "at", "start": "2999-01-01T00:00:00Z"}
        }))
        .await
        .unwrap();
    let waiting = later.tasks[0].id.to_string();
    let cancelled = client.cancel_task(&waiting).await.unwrap();
    assert_eq!(cancelled.status, TaskStatus::Cancelled);
    let cancelled = client
        .cancel_workflow(&later.workflow.id.to_string())
        .await
        .unwrap();
    assert!(cancelled.workflow.cancel_requested || cancelled.workflow.status.is_terminal());

    // Schedules.
    let schedule = client
        .create_schedule(&json!({"template": "chain", "cron": "0 0 1 1 *", "paused": true}))
        .await
        .unwrap();
    assert!(schedule.schedule.paused);
    assert_eq!(schedule.next_due, None);
    let schedule_id = schedule.schedule.id.to_string();
    let schedules = client.list_schedules().await.unwrap();
    assert_eq!(schedules.schedules.len(), 1);
    assert_eq!(client.schedule(&schedule_id).await.unwrap().runs.len(), 0);
    let resumed = client
        .update_schedule(&schedule_id, &json!({"paused": false}))
        .await
        .unwrap();
    assert!(!resumed.schedule.paused && resumed.next_due.is_some());
    client.delete_schedule(&schedule_id).await.unwrap();
    let error = client.schedule(&schedule_id).await.unwrap_err();
    assert_eq!(refusal(error), (404, "not_found".to_owned()));

    // Tokens, secrets, the audit log, prune, backup.
    let issued = client.create_token("ci", "viewer").await.unwrap();
    assert_eq!(issued.name, "ci");
    assert!(!issued.token.is_empty());
    let tokens = client.list_tokens().await.unwrap();
    assert!(tokens.tokens.iter().any(|t| t.id == issued.id));
    let revoked = client.revoke_token(&issued.id).await.unwrap();
    assert!(revoked.revoked_at.is_some());
    let error = Client::new(&service.base, Some(&issued.token))
        .unwrap()
        .with_unauthorized_hint("pass a token")
        .health()
        .await;
    assert!(error.is_ok(), "/health needs no token");
    let error = Client::new(&service.base, Some(&issued.token))
        .unwrap()
        .with_unauthorized_hint("pass a token")
        .list_tasks(&TaskFilter::default())
        .await
        .unwrap_err();
    assert!(
        error.to_string().ends_with("(HTTP 401); pass a token"),
        "{error}"
    );

    let secret = client
        .put_secret(
            "api-key",
            &json!({"value": "s3cret", "templates": ["chain"]}),
        )
        .await
        .unwrap();
    assert_eq!(secret.scope.templates, ["chain"]);
    let secret = client
        .change_secret_scope("api-key", &json!({"origins": ["https://example.org"]}))
        .await
        .unwrap();
    assert_eq!(secret.scope.origins, ["https://example.org"]);
    let secrets = client.list_secrets().await.unwrap();
    assert_eq!(secrets.secrets.len(), 1);
    client.delete_secret("api-key").await.unwrap();

    let audit = client
        .audit(&AuditFilter {
            action: Some("workflow.submit".into()),
            ..AuditFilter::default()
        })
        .await
        .unwrap();
    assert!(!audit.records.is_empty());
    assert!(
        audit
            .records
            .iter()
            .all(|r| r.action == "workflow.submit" && r.actor == "bootstrap")
    );
    let pruned = client
        .prune(&json!({"older_than": "forever", "dry_run": true}))
        .await
        .unwrap();
    assert!(pruned.dry_run);

    let mut backup = client.backup().await.unwrap();
    let mut archive = 0;
    while let Some(chunk) = backup.chunk().await.unwrap() {
        archive += chunk.len();
    }
    assert!(archive > 0, "an empty backup");

    // Live moves of the store: the last thing, since it switches stores.
    let store = client.store().await.unwrap();
    assert!(store.previous.is_none());
    assert!(
        client
            .list_migrations()
            .await
            .unwrap()
            .migrations
            .is_empty()
    );
    let error = client.rollback_store().await.unwrap_err();
    assert_eq!(refusal(error).0, 409);
    let target = format!("filesystem:{}", dir.path().join("moved").display());
    let started = client.start_migration(&target, Some(50)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let moved = loop {
        let status = client.migration(&started.id).await.unwrap();
        if status.phase.is_final() {
            break status;
        }
        assert!(tokio::time::Instant::now() < deadline, "{status:?}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(moved.phase, MovePhase::Completed, "{moved:?}");
    let error = client.cancel_migration(&started.id).await.unwrap_err();
    assert_eq!(refusal(error).0, 409);
    assert_eq!(client.store().await.unwrap().previous, Some(store.store));

    service.stop().await;
}

#[tokio::test]
async fn test_environments_and_topologies_come_typed() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = fixture_settings(dir.path());
    settings.scripts_dir = real_scripts();
    settings.templates_dir = real_scripts().join("../templates");
    let service = TestService::start(settings).await;
    let client = Client::new(&service.base, None).unwrap();

    let catalog = client.list_topologies().await.unwrap();
    let listed = catalog.topologies.first().expect("the shipped topologies");
    assert!(!catalog.taskservs.is_empty());
    assert_eq!(&client.topology(&listed.name).await.unwrap(), listed);
    assert!(
        client
            .list_environments()
            .await
            .unwrap()
            .environments
            .is_empty()
    );
    let error = client
        .environment("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert_eq!(refusal(error).0, 404);
    let error = client
        .environment_logs("00000000-0000-0000-0000-000000000000")
        .await
        .unwrap_err();
    assert_eq!(refusal(error).0, 404);

    service.stop().await;
}
