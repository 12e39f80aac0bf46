//! The plans of the task listings, checked with `EXPLAIN ANALYZE` on the
//! exact text the backend sends: each page is read from an index, newest
//! first, with the LIMIT inside the scan and no sort; each total is counted
//! from index entries, without reading a record. Before, a status filter's
//! total read every matching record (1.2 s at 100k tasks).

use orchestrator_core::{TaskStatus, WorkflowId, WorkflowStatus};
use surrealdb::types::Variables;

use super::tasks::{WORKFLOW_TASKS, task_listing, workflow_listing};
use super::{SurrealBackend, newest_first, open_embedded, page_sql};
use crate::{TaskQuery, WorkflowQuery};

/// The key a cursor is past in these plans: 150 of the seeded tasks are
/// older.
const CURSOR: &str = "00000150";

/// The first page of the listing of these filters.
fn query(workflow: Option<WorkflowId>, status: Option<TaskStatus>) -> TaskQuery {
    TaskQuery {
        workflow,
        status,
        limit: 20,
        ..TaskQuery::default()
    }
}

async fn explain(db: &SurrealBackend, sql: &str) -> String {
    explain_with(db, sql, Variables::new()).await
}

/// `EXPLAIN ANALYZE` of `sql` with a listing's variables bound.
async fn explain_with(db: &SurrealBackend, sql: &str, mut vars: Variables) -> String {
    vars.insert("limit", 20i64);
    vars.insert("offset", 10i64);
    // As `page` binds a cursor.
    vars.insert("after", newest_first(CURSOR));
    let mut response = db
        .query("explain", &format!("EXPLAIN ANALYZE {sql}"), &vars)
        .await
        .unwrap();
    let plan: String = response
        .take::<Option<String>>(0)
        .unwrap()
        .expect("EXPLAIN answers the plan as text");
    plan
}

/// `n` tasks of 3 workflows, in turn completed, failed and queued: written
/// as rows directly, since only the plans are under test here (the
/// conformance suite checks the listings' answers on every backend).
async fn seed(db: &SurrealBackend, workflows: &[WorkflowId], n: usize) {
    let statuses = [
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Queued,
    ];
    let mut sql = String::from("BEGIN;");
    for i in 0..n {
        sql.push_str(&format!(
            "CREATE type::record('task', '{:08}') SET doc = '{{}}', version = 1, workflow = '{}', status = '{}', priority = 1, newest_first = '{}';",
            i,
            workflows[i % workflows.len()],
            statuses[i % statuses.len()].as_str(),
            newest_first(&format!("{i:08}"))
        ));
    }
    sql.push_str("COMMIT;");
    db.query("seed", &sql, &Variables::new()).await.unwrap();
}

#[tokio::test]
async fn task_listings_read_indexes_not_records() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_embedded(dir.path()).await;
    let workflows = [WorkflowId::new(), WorkflowId::new(), WorkflowId::new()];
    seed(&db, &workflows, 300).await;

    let shapes = [
        (
            None,
            None,
            "IndexScan [ctx: Db] [index: task_listed_newest,",
        ),
        (
            None,
            Some(TaskStatus::Completed),
            "IndexScan [ctx: Db] [index: task_status_newest,",
        ),
        (
            Some(workflows[1]),
            None,
            "IndexScan [ctx: Db] [index: task_workflow_newest,",
        ),
        (
            Some(workflows[1]),
            Some(TaskStatus::Failed),
            "IndexScan [ctx: Db] [index: task_workflow_status_newest,",
        ),
    ];
    for (workflow, status, scan) in shapes {
        let listing = task_listing(&query(workflow, status));
        let sql = page_sql(&listing, false);
        let (page, count) = (sql.page.as_str(), sql.count.as_str());
        let plan = explain(&db, page).await;
        assert!(plan.contains(scan), "{page}\n{plan}");
        assert!(
            plan.contains("direction: Forward, limit: $limit, offset: $offset"),
            "the page must come newest first from the scan itself, read forwards, LIMIT inside it:\n{page}\n{plan}"
        );
        for slow in ["Sort", "Filter", "Limit ["] {
            assert!(
                !plan.contains(slow),
                "no {slow} over the matches:\n{page}\n{plan}"
            );
        }
        let plan = explain(&db, count.trim()).await;
        assert!(
            plan.starts_with("IndexCountScan") || plan.starts_with("CountScan"),
            "the total must be counted from index entries:\n{count}\n{plan}"
        );
        assert!(
            !plan.contains("IndexScan") && !plan.contains("TableScan"),
            "{plan}"
        );
    }

    // A keyset cursor is a seek in every shape: the range of the index
    // past the mirrored cursor, after its leading fields, read forwards,
    // LIMIT inside.
    let cursors = [
        (None, None, "task_listed_newest, access: [true]"),
        (
            None,
            Some(TaskStatus::Completed),
            "task_status_newest, access: ['completed']",
        ),
        (
            Some(workflows[1]),
            None,
            &*format!("task_workflow_newest, access: ['{}']", workflows[1]),
        ),
        (
            Some(workflows[1]),
            Some(TaskStatus::Failed),
            &*format!(
                "task_workflow_status_newest, access: ['{}', 'failed']",
                workflows[1]
            ),
        ),
    ];
    for (workflow, status, seek) in cursors {
        let sql = page_sql(&task_listing(&query(workflow, status)), true);
        let page = sql.page.as_str();
        let plan = explain(&db, page).await;
        assert!(
            plan.contains(&format!(
                "index: {seek} MoreThan '{}'",
                newest_first(CURSOR)
            )) && plan.contains("direction: Forward, limit: $limit, offset: $offset"),
            "{page}\n{plan}"
        );
        for slow in ["Sort", "Filter", "Limit ["] {
            assert!(!plan.contains(slow), "no {slow}:\n{page}\n{plan}");
        }
        // The scan itself stops at the page: 20 rows out of the 50 (150
        // without a filter) matching tasks below the cursor, 10 skipped by
        // the offset.
        let scan = plan.lines().find(|l| l.contains("IndexScan")).unwrap();
        assert!(scan.contains("{rows: 20,"), "{plan}");
    }

    // A workflow's tasks come in order from its index, read forwards: the
    // text `workflow_tasks` sends, with its bound workflow.
    let mut vars = Variables::new();
    vars.insert("workflow", workflows[1].to_string());
    let mut response = db
        .query(
            "explain",
            &format!("EXPLAIN ANALYZE {WORKFLOW_TASKS}"),
            &vars,
        )
        .await
        .unwrap();
    let plan: String = response.take::<Option<String>>(0).unwrap().unwrap();
    assert!(
        plan.contains("index: task_workflow_newest,")
            && plan.contains("direction: Forward")
            && !plan.contains("Sort"),
        "{plan}"
    );

    // A deep page by offset without a filter skips table entries, which
    // costs less than skipping index entries (those read their records).
    let deep = task_listing(&TaskQuery {
        offset: 10,
        ..query(None, None)
    });
    let sql = page_sql(&deep, false);
    let page = sql.page.as_str();
    let plan = explain(&db, page).await;
    assert!(
        plan.contains(
            "TableScan [ctx: Db] [table: task, direction: Backward, limit: $limit, offset: $offset"
        ),
        "{page}\n{plan}"
    );

    // Every final status, present or not, has its COUNT index (a status
    // added later without one would count the entries of the status index,
    // as many as history holds); a status a task passes through has none
    // (migration 0015), and is counted from the status index's entries,
    // never its records.
    let mut info = db
        .query("info", "INFO FOR TABLE task;", &Variables::new())
        .await
        .unwrap();
    let info: surrealdb::types::Value = info.take(0).unwrap();
    let info = format!("{info:?}");
    for status in TaskStatus::ALL {
        let name = format!("task_count_{}", status.as_str());
        let listing = task_listing(&query(None, Some(*status)));
        let count = format!(
            "SELECT count() AS n FROM task WHERE {} GROUP ALL",
            listing.conditions[0]
        );
        let plan = explain(&db, &count).await;
        assert!(plan.starts_with("IndexCountScan"), "{count}\n{plan}");
        assert_eq!(
            info.contains(&format!("\"{name}\"")),
            status.is_terminal(),
            "a COUNT index {name} for each final status only: {info}"
        );
    }
}

/// The cursor's bound, computed here, is what migration 0011's function
/// stores, and sorts keys newest first.
#[tokio::test]
async fn a_cursor_is_mirrored_as_the_stored_field_is() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_embedded(dir.path()).await;
    let keys = [
        "0123456789abcdef",
        "01a221ef-c589-7373-bb81-88fc95d167ce",
        "ffffffff-ffff-7fff-bfff-ffffffffffff",
        CURSOR,
    ];
    for key in keys {
        let mut vars = Variables::new();
        vars.insert("key", key);
        let mut response = db
            .query("mirror", "RETURN fn::newest_first($key);", &vars)
            .await
            .unwrap();
        let stored: Option<String> = response.take(0).unwrap();
        assert_eq!(stored.as_deref(), Some(&*newest_first(key)), "{key}");
    }
    assert_eq!(newest_first("0123456789abcdef"), "PONMLKJIHGFEDCBA");
    let mut sorted = keys.map(str::to_owned);
    sorted.sort();
    let mut mirrored = keys.map(newest_first);
    mirrored.sort();
    let newest_first_order: Vec<_> = sorted.iter().rev().map(|k| newest_first(k)).collect();
    assert_eq!(mirrored.to_vec(), newest_first_order);
}

/// The workflow list without a filter and by status reads its index
/// forwards, LIMIT inside, and a cursor seeks; a deep offset without a
/// filter reads the table.
#[tokio::test]
async fn the_workflow_list_reads_its_indexes_forwards() {
    let dir = tempfile::tempdir().unwrap();
    let db = open_embedded(dir.path()).await;
    let statuses = [WorkflowStatus::Completed, WorkflowStatus::Failed];
    let mut sql = String::from("BEGIN;");
    for i in 0..300 {
        sql.push_str(&format!(
            "CREATE type::record('workflow', '{i:08}') SET doc = '{{}}', version = 1, status = '{}', kind = 'k', priority = 1, revision = 0, newest_first = '{}';",
            statuses[i % statuses.len()].as_str(),
            newest_first(&format!("{i:08}"))
        ));
    }
    sql.push_str("COMMIT;");
    db.query("seed", &sql, &Variables::new()).await.unwrap();

    let shapes = [
        (None, "workflow_listed_newest, access: [true]"),
        (
            Some(WorkflowStatus::Completed),
            "workflow_status_newest, access: ['completed']",
        ),
    ];
    for (status, index) in shapes {
        for after in [false, true] {
            let (listing, vars) = workflow_listing(&WorkflowQuery {
                status,
                after: after.then(orchestrator_core::WorkflowId::new),
                limit: 20,
                ..WorkflowQuery::default()
            });
            let sql = page_sql(&listing, after);
            let page = sql.page.as_str();
            let plan = explain_with(&db, page, vars).await;
            let seek = if after {
                format!("index: {index} MoreThan '{}'", newest_first(CURSOR))
            } else {
                format!("index: {index}")
            };
            assert!(
                plan.contains(&seek)
                    && plan.contains("direction: Forward, limit: $limit, offset: $offset"),
                "{page}\n{plan}"
            );
            for slow in ["Sort", "Filter", "Limit ["] {
                assert!(!plan.contains(slow), "no {slow}:\n{page}\n{plan}");
            }
        }
    }
    let (deep, vars) = workflow_listing(&WorkflowQuery {
        offset: 10,
        limit: 20,
        ..WorkflowQuery::default()
    });
    let sql = page_sql(&deep, false);
    let page = sql.page.as_str();
    let plan = explain_with(&db, page, vars).await;
    assert!(
        plan.contains("TableScan [ctx: Db] [table: workflow, direction: Backward"),
        "{page}\n{plan}"
    );
}
