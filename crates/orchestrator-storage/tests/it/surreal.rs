//! The SurrealDB backends, embedded and against a real server: the
//! conformance suite, persistence, migrations, and what happens when the
//! server is wrong, missing, or goes away.

use std::path::Path;
use std::time::{Duration, Instant};

use chrono::Utc;
use orchestrator_core::TaskStatus;
use orchestrator_storage::schema::EntryState;
use orchestrator_storage::surreal::SurrealBackend;
use orchestrator_storage::surreal::schema_migrations::{MIGRATIONS, Migration};
use orchestrator_storage::{
    EmbeddedEngine, Error, Record, Secret, Storage, StorageConfig, StorageType, SurrealdbConfig,
    TaskQuery,
};
use serde_json::json;
use surrealdb::Surreal;
use surrealdb::engine::any::Any;
use surrealdb::opt::auth::Root;

use crate::conformance::{self, Harness, workflow_with_tasks};
use crate::dev_server::DevServer;

pub(crate) fn embedded_config(data_dir: &Path) -> StorageConfig {
    StorageConfig {
        storage_type: StorageType::SurrealdbEmbedded,
        data_dir: data_dir.to_path_buf(),
        surrealdb: SurrealdbConfig::default(),
    }
}

/// A config for `server`, in a database of its own so tests sharing the
/// server never see each other's records.
pub(crate) fn server_config(server: &DevServer) -> StorageConfig {
    StorageConfig {
        storage_type: StorageType::SurrealdbServer,
        data_dir: std::env::temp_dir(),
        surrealdb: SurrealdbConfig {
            url: server.url(),
            database: format!("test_{}", uuid::Uuid::now_v7().simple()),
            request_timeout: Duration::from_secs(3),
            ..SurrealdbConfig::default()
        },
    }
}

async fn open(config: &StorageConfig) -> Storage {
    orchestrator_storage::open(config).await.unwrap()
}

/// A plain SDK connection to the same database, to look at or tamper with
/// what the backend stored.
pub(crate) async fn raw(config: &StorageConfig) -> Surreal<Any> {
    let db = surrealdb::engine::any::connect(config.surrealdb.url.as_str())
        .await
        .unwrap();
    db.signin(Root {
        username: "root".into(),
        password: "root".into(),
    })
    .await
    .unwrap();
    db.use_ns(config.surrealdb.namespace.clone())
        .use_db(config.surrealdb.database.clone())
        .await
        .unwrap();
    db
}

struct EmbeddedHarness {
    root: tempfile::TempDir,
}

impl Harness for EmbeddedHarness {
    async fn open(&self) -> Storage {
        let dir = self.root.path().join(uuid::Uuid::now_v7().to_string());
        open(&embedded_config(&dir)).await
    }
}

struct ServerHarness {
    server: DevServer,
}

impl Harness for ServerHarness {
    async fn open(&self) -> Storage {
        open(&server_config(&self.server)).await
    }
}

#[tokio::test]
async fn embedded_passes_the_conformance_suite() {
    let harness = EmbeddedHarness {
        root: tempfile::tempdir().unwrap(),
    };
    conformance::suite(&harness).await;
}

#[tokio::test]
async fn server_passes_the_conformance_suite() {
    let harness = ServerHarness {
        server: DevServer::start_memory(),
    };
    conformance::suite(&harness).await;
}

/// The bulk suite on a store `orchestrator migrate` copies from: opened
/// read-only, embedded (once its service closed it) and on a server.
#[tokio::test]
async fn read_only_sources_pass_the_bulk_suite() {
    let root = tempfile::tempdir().unwrap();
    let server = DevServer::start_memory();
    for config in [embedded_config(root.path()), server_config(&server)] {
        let store = open(&config).await;
        let fixture = conformance::BulkFixture::new();
        fixture.import_into(store.transfer()).await;
        store.close().await.unwrap();
        let source = orchestrator_storage::open_read_only(&config).await.unwrap();
        conformance::read_only_bulk_suite(&*source, &fixture).await;
        source.close().await.unwrap();
    }
}

/// The embedded store keeps the tasks, workflows and task listings it read
/// lately: each replaced by an import (a storage move onto this store)
/// reads as imported, not as it was kept.
#[tokio::test]
async fn embedded_reads_what_it_read_before_as_imported_since() {
    let root = tempfile::tempdir().unwrap();
    let store = open(&embedded_config(root.path())).await;
    let (workflow, tasks) = workflow_with_tasks(1);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    let listing = TaskQuery {
        workflow: Some(workflow.id),
        limit: 10,
        ..Default::default()
    };
    let read = store.tasks().get_task(tasks[0].id).await.unwrap();
    assert_eq!(read.as_ref(), Some(&tasks[0]));
    let page = store.tasks().list_tasks(&listing).await.unwrap();
    assert_eq!(page.items, tasks);
    let read = store.tasks().get_workflow(workflow.id).await.unwrap();
    assert_eq!(read.map(|w| w.name), Some(workflow.name.clone()));
    let mut changed = tasks[0].clone();
    changed.name = "renamed".into();
    changed.version += 3;
    let mut renamed = workflow.clone();
    renamed.name = "renamed".into();
    store
        .transfer()
        .import(&[
            Record::Workflow(renamed.clone()),
            Record::Task(changed.clone()),
        ])
        .await
        .unwrap();
    let read = store.tasks().get_task(changed.id).await.unwrap();
    assert_eq!(read.as_ref(), Some(&changed));
    let page = store.tasks().list_tasks(&listing).await.unwrap();
    assert_eq!(page.items, [changed], "a page read before the import");
    let read = store.tasks().get_workflow(workflow.id).await.unwrap();
    assert_eq!(read, Some(renamed), "a workflow read before the import");
    store.close().await.unwrap();
}

#[tokio::test]
async fn embedded_reopen_keeps_every_record_and_log() {
    let root = tempfile::tempdir().unwrap();
    let config = embedded_config(root.path());
    let (workflow, tasks) = workflow_with_tasks(5);
    let expected = {
        let store = open(&config).await;
        store
            .tasks()
            .insert_workflow(&workflow, &tasks)
            .await
            .unwrap();
        let mut task = tasks[2].clone();
        task.start(Utc::now()).unwrap();
        let task = store.tasks().update_task(&task).await.unwrap();
        let mut done = task.clone();
        done.complete(json!({"ip": "10.0.0.3"}), Utc::now())
            .unwrap();
        store.tasks().update_task(&done).await.unwrap();
        store
            .tasks()
            .append_log(task.id, "héllo\n".as_bytes())
            .await
            .unwrap();
        let all = store
            .tasks()
            .list_tasks(&TaskQuery {
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        store.close().await.unwrap();
        assert!(matches!(store.health().await, Err(Error::Closed)));
        all
    };
    assert!(root.path().join("surrealdb").is_dir());

    let store = open(&config).await;
    store.health().await.unwrap();
    let again = store
        .tasks()
        .list_tasks(&TaskQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(again, expected);
    let task = store.tasks().get_task(tasks[2].id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Completed);
    assert_eq!(task.output, Some(json!({"ip": "10.0.0.3"})));
    assert_eq!(
        store.tasks().read_log(task.id, 0, 100).await.unwrap().data,
        "héllo\n".as_bytes()
    );
    assert_eq!(
        store.tasks().get_workflow(workflow.id).await.unwrap(),
        Some(workflow)
    );
    let status = orchestrator_storage::schema_status(&config).await;
    // The open store holds the embedded database's lock: status says so
    // rather than waiting or reading a half-written state.
    assert!(status.is_err());
    store.close().await.unwrap();
}

#[tokio::test]
async fn db_status_shows_pending_then_applied_migrations() {
    let root = tempfile::tempdir().unwrap();
    let config = embedded_config(root.path());
    let before = orchestrator_storage::schema_status(&config).await.unwrap();
    assert_eq!(before.backend, "surrealdb-embedded");
    assert_eq!(before.entries.len(), MIGRATIONS.len());
    assert!(
        before
            .entries
            .iter()
            .all(|e| e.state == EntryState::Pending)
    );
    assert!(
        !root.path().join("surrealdb").exists(),
        "status changes nothing"
    );

    open(&config).await.close().await.unwrap();
    let after = wait_for_status(&config).await;
    assert!(after.is_up_to_date(), "{after:?}");
    for (entry, migration) in after.entries.iter().zip(MIGRATIONS) {
        assert_eq!(
            entry.checksum.as_deref(),
            Some(migration.checksum().as_str())
        );
        assert!(entry.applied_at.is_some());
    }
}

/// The closed store's datastore shuts down in the background; status
/// retries while its lock is still held.
async fn wait_for_status(config: &StorageConfig) -> orchestrator_storage::schema::SchemaStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match orchestrator_storage::schema_status(config).await {
            Ok(status) => return status,
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting for the datastore to close: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test]
async fn a_second_open_of_an_embedded_dir_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let config = embedded_config(root.path());
    let _first = open(&config).await;
    let err = orchestrator_storage::open(&config)
        .await
        .expect_err("the directory is taken");
    assert!(err.to_string().contains("in use"), "{err}");
}

#[cfg(not(feature = "surrealdb-rocksdb"))]
#[tokio::test]
async fn the_rocksdb_engine_names_its_feature_when_not_compiled_in() {
    let root = tempfile::tempdir().unwrap();
    let mut config = embedded_config(root.path());
    config.surrealdb.engine = EmbeddedEngine::RocksDb;
    let message = orchestrator_storage::open(&config)
        .await
        .expect_err("not compiled in")
        .to_string();
    assert!(
        message.contains("--features surrealdb-rocksdb"),
        "{message}"
    );
}

#[cfg(feature = "surrealdb-rocksdb")]
#[tokio::test]
async fn embedded_rocksdb_passes_the_conformance_suite() {
    struct RocksHarness(tempfile::TempDir);
    impl Harness for RocksHarness {
        async fn open(&self) -> Storage {
            let dir = self.0.path().join(uuid::Uuid::now_v7().to_string());
            let mut config = embedded_config(&dir);
            config.surrealdb.engine = EmbeddedEngine::RocksDb;
            open(&config).await
        }
    }
    conformance::suite(&RocksHarness(tempfile::tempdir().unwrap())).await;
}

#[tokio::test]
async fn migrations_are_recorded_with_checksums() {
    let server = DevServer::start_memory();
    let config = server_config(&server);
    let store = open(&config).await;
    let db = raw(&config).await;
    let mut response = db
        .query("SELECT VALUE [version, checksum, state] FROM schema_migration ORDER BY version")
        .await
        .unwrap();
    let rows: Vec<(i64, String, String)> = response.take(0).unwrap();
    let expected: Vec<(i64, String, String)> = MIGRATIONS
        .iter()
        .map(|m| (i64::from(m.version), m.checksum(), "applied".to_owned()))
        .collect();
    assert_eq!(rows, expected);
    // The lock is released once the start is done.
    let mut response = db.query("SELECT * FROM schema_lock").await.unwrap();
    let locks: Vec<serde_json::Value> = response.take(0).unwrap();
    assert!(locks.is_empty(), "{locks:?}");
    store.close().await.unwrap();

    // A second start applies nothing and is happy.
    let store = open(&config).await;
    let status = orchestrator_storage::schema_status(&config).await.unwrap();
    assert!(status.is_up_to_date(), "{status:?}");
    store.close().await.unwrap();
}

#[tokio::test]
async fn an_applied_migration_whose_file_changed_is_refused() {
    let server = DevServer::start_memory();
    let config = server_config(&server);
    open(&config).await.close().await.unwrap();

    let mut edited: Vec<Migration> = MIGRATIONS.to_vec();
    edited[0].sql = "DEFINE TABLE workflow SCHEMAFULL; -- edited after it was applied";
    let err = SurrealBackend::open_with_migrations(&config, &edited)
        .await
        .err()
        .expect("refused");
    let message = err.to_string();
    assert!(matches!(err, Error::Schema(_)), "{message}");
    assert!(
        message.contains("0001_workflows_and_tasks.surql"),
        "{message}"
    );
    assert!(
        message.contains("new, higher-numbered migration"),
        "{message}"
    );

    let status = orchestrator_storage::schema_status(&config).await.unwrap();
    assert!(
        status.is_up_to_date(),
        "the real files still match: {status:?}"
    );
}

#[tokio::test]
async fn a_dirty_migration_is_refused_with_what_to_do() {
    let server = DevServer::start_memory();
    let config = server_config(&server);
    open(&config).await.close().await.unwrap();
    // As if a start died between marking migration 2 and committing it.
    raw(&config)
        .await
        .query("UPDATE schema_migration:2 SET state = 'dirty'")
        .await
        .unwrap()
        .check()
        .unwrap();

    let message = orchestrator_storage::open(&config)
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("0002_task_logs.surql is dirty"),
        "{message}"
    );
    assert!(message.contains("DELETE schema_migration:2"), "{message}");
    let status = orchestrator_storage::schema_status(&config).await.unwrap();
    assert_eq!(status.entries[1].state, EntryState::Dirty);
}

#[tokio::test]
async fn a_failing_migration_applies_nothing_and_leaves_no_mark() {
    let server = DevServer::start_memory();
    let config = server_config(&server);
    let mut migrations: Vec<Migration> = MIGRATIONS.to_vec();
    migrations.push(Migration {
        version: 99,
        name: "broken",
        sql: "DEFINE TABLE half_done SCHEMAFULL; THROW 'this migration is broken';",
    });
    let message = SurrealBackend::open_with_migrations(&config, &migrations)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(message.contains("0099_broken.surql failed"), "{message}");
    assert!(message.contains("nothing of it was applied"), "{message}");

    let db = raw(&config).await;
    let mut response = db
        .query("SELECT VALUE version FROM schema_migration ORDER BY version; INFO FOR DB;")
        .await
        .unwrap();
    let versions: Vec<i64> = response.take(0).unwrap();
    let known: Vec<i64> = MIGRATIONS.iter().map(|m| i64::from(m.version)).collect();
    assert_eq!(versions, known, "the earlier ones stay applied");
    let info: Option<serde_json::Value> = response.take(1).unwrap();
    assert!(!info.unwrap().to_string().contains("half_done"));
    // And the real set still opens.
    open(&config).await.close().await.unwrap();
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_error_that_does_not_echo_it() {
    let server = DevServer::start_memory();
    let mut config = server_config(&server);
    config.surrealdb.password = Secret::new("hunter2-wrong");
    let message = orchestrator_storage::open(&config)
        .await
        .expect_err("refused")
        .to_string();
    assert!(message.contains("cannot sign in"), "{message}");
    assert!(message.contains("as `root`"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!format!("{config:?}").contains("hunter2"));
}

#[tokio::test]
async fn an_unreachable_server_fails_within_the_connect_timeout() {
    // Nothing listens on this port: refused at once.
    let mut config = StorageConfig {
        storage_type: StorageType::SurrealdbServer,
        data_dir: std::env::temp_dir(),
        surrealdb: SurrealdbConfig {
            url: format!("ws://127.0.0.1:{}", crate::dev_server::free_port()),
            connect_timeout: Duration::from_secs(2),
            ..SurrealdbConfig::default()
        },
    };
    let message = orchestrator_storage::open(&config)
        .await
        .expect_err("refused")
        .to_string();
    assert!(message.contains("cannot connect"), "{message}");
    assert!(message.contains(&config.surrealdb.url), "{message}");

    // Something listens but never answers: the timeout ends the wait.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    config.surrealdb.url = format!("ws://{}", silent.local_addr().unwrap());
    let started = Instant::now();
    let message = orchestrator_storage::open(&config)
        .await
        .expect_err("refused")
        .to_string();
    assert!(message.contains("no answer within 2s"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(5));

    config.surrealdb.url = "http://127.0.0.1:8000".into();
    let message = orchestrator_storage::open(&config)
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("--surrealdb-url `http://127.0.0.1:8000`"),
        "{message}"
    );
}

#[tokio::test]
async fn a_server_that_dies_fails_writes_and_health_then_reconnects() {
    let data = tempfile::tempdir().unwrap();
    let mut server = DevServer::start_persistent(data.path());
    let mut config = server_config(&server);
    config.surrealdb.request_timeout = Duration::from_secs(2);
    let store = open(&config).await;
    let (workflow, tasks) = workflow_with_tasks(2);
    store
        .tasks()
        .insert_workflow(&workflow, &tasks)
        .await
        .unwrap();
    store.health().await.unwrap();

    server.kill();
    let mut claim = tasks[0].clone();
    claim.start(Utc::now()).unwrap();
    let started = Instant::now();
    let err = store
        .tasks()
        .update_task(&claim)
        .await
        .expect_err("no server");
    assert!(matches!(err, Error::Unavailable(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = store.health().await.expect_err("unhealthy");
    assert!(err.to_string().contains(&config.surrealdb.url), "{err}");
    // While it is down, calls fail at once instead of piling up.
    let started = Instant::now();
    assert!(store.tasks().get_task(tasks[0].id).await.is_err());
    assert!(started.elapsed() < Duration::from_millis(500));

    server.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = store.health().await {
        assert!(Instant::now() < deadline, "never reconnected: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Everything written before the crash is there. The claim that failed
    // may or may not have reached the server before it died (a request
    // cut off in flight is ambiguous), so re-read and decide again, as the
    // engine does after a failed write.
    assert_eq!(
        store
            .tasks()
            .workflow_tasks(workflow.id)
            .await
            .unwrap()
            .len(),
        2
    );
    let current = store.tasks().get_task(tasks[0].id).await.unwrap().unwrap();
    if current.status == TaskStatus::Queued {
        let mut claim = current.clone();
        claim.start(Utc::now()).unwrap();
        store.tasks().update_task(&claim).await.unwrap();
    }
    let task = store.tasks().get_task(tasks[0].id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Running);
    store.close().await.unwrap();
}
