//! Group commit: the hot writes (a task's or a workflow's compare-and-set,
//! or a workflow's with some of its tasks, a submission, a log append, an
//! audit record) queue here, and one task sends them, as many as have
//! queued, in one transaction.
//!
//! Why: with SurrealDB a transaction costs far more than a statement in
//! it. Measured on SurrealKV (3.3.5), an indexed task update costs about
//! 0.85 ms of CPU as its own transaction and 0.32 ms as one of a hundred
//! in one; each commit also syncs the log. While one group commits, the
//! next gathers, so a lone write goes at once and a busy service commits
//! more writes a sync (docs/benchmarks.md, "Group commit on SurrealDB").
//!
//! A write is one block statement (`{ ... }`) that reads its parameters
//! from `$p` and answers with its last expression. Blocks never `THROW`:
//! a compare-and-set that finds another version answers so, and the
//! others of its group still commit. A group that fails as a whole (a
//! duplicate, a write conflict with another transaction) commits
//! nothing, and each of its writes is then sent alone, with the conflict
//! retries of any request, so each caller gets its own answer, as if it
//! had never been grouped. A group that got no answer (a deadline, a lost
//! server) may have committed: its writes are not sent again, and every
//! caller learns that the database does not answer, as a lone write
//! would.

use std::fmt::Write as _;
use std::sync::Arc;

use surrealdb::types::{Object, SurrealValue, Value, Variables};
use tokio::sync::{mpsc, oneshot};

use super::client::{Client, Retries};
use super::errors::db_error;
use crate::{Error, Result};

/// The most writes one transaction carries: enough for every worker and
/// every request in flight, and a bound on the statement a group makes.
const MOST_WRITES: usize = 128;

/// The most records a group's transaction writes: a submission of many
/// steps is a write of as many records, and a few of them together must
/// not make one transaction that outlasts the request deadline. A write
/// of more goes alone, as it would without a group.
const MOST_RECORDS: usize = 2048;

/// Writes waiting for the committing task; senders wait past it.
const QUEUE: usize = 1024;

/// One write of a group.
pub(super) struct Write {
    /// What the write does, for errors: "update a task".
    pub(super) context: &'static str,
    /// A block's statements, reading their parameters from `$p`; its last
    /// expression is the answer.
    pub(super) block: &'static str,
    pub(super) params: Variables,
    /// How many records it writes, which bounds how many a group takes.
    pub(super) records: usize,
}

/// The queue of writes, and the task that commits them.
pub(super) struct GroupCommit {
    queue: mpsc::Sender<Queued>,
    /// Transactions sent, for tests: a group, or a write alone.
    #[cfg(test)]
    transactions: Arc<std::sync::atomic::AtomicU64>,
}

struct Queued {
    write: Write,
    answer: oneshot::Sender<Result<Value>>,
}

impl GroupCommit {
    /// Starts the committing task, which ends once this is dropped.
    pub(super) fn start(client: Arc<Client>) -> GroupCommit {
        let (queue, queued) = mpsc::channel(QUEUE);
        let committer = Committer {
            client,
            #[cfg(test)]
            transactions: Arc::default(),
        };
        #[cfg(test)]
        let transactions = Arc::clone(&committer.transactions);
        tokio::spawn(committer.commit_all(queued));
        GroupCommit {
            queue,
            #[cfg(test)]
            transactions,
        }
    }

    #[cfg(test)]
    pub(super) fn transactions(&self) -> u64 {
        self.transactions.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Commits `write` (in a group, or alone) and gives its answer.
    pub(super) async fn write(&self, write: Write) -> Result<Value> {
        let context = write.context;
        let (answer, answered) = oneshot::channel();
        self.queue
            .send(Queued { write, answer })
            .await
            .map_err(|_| Error::Closed)?;
        // Dropped unanswered: its group's commit was cut short (see
        // `each_contained`), whether or not it reached the database.
        answered.await.map_err(|_| Error::Database {
            context: context.to_owned(),
            message: "the commit of its group was cut short (the database client panicked): \
                      it may or may not have been stored"
                .to_owned(),
        })?
    }
}

/// The committing task's own state.
struct Committer {
    client: Arc<Client>,
    #[cfg(test)]
    transactions: Arc<std::sync::atomic::AtomicU64>,
}

impl Committer {
    /// Commits what has queued, in groups of at most [`MOST_RECORDS`]
    /// records, until the queue closes.
    async fn commit_all(self, mut queued: mpsc::Receiver<Queued>) {
        let mut taken = Vec::with_capacity(MOST_WRITES);
        while queued.recv_many(&mut taken, MOST_WRITES).await > 0 {
            let records: Vec<usize> = taken.iter().map(|q| q.write.records).collect();
            let groups: Vec<Vec<Queued>> = group_lengths(&records)
                .into_iter()
                .map(|length| taken.drain(..length).collect())
                .collect();
            each_contained(groups, |group| self.send(group)).await;
        }
    }

    /// Commits one group, and answers each of its writes.
    async fn send(&self, mut group: Vec<Queued>) {
        if group.len() == 1 {
            let Queued { write, answer } = group.remove(0);
            let _ = answer.send(self.alone(&write).await);
        } else {
            self.commit(&mut group).await;
        }
    }

    /// Commits `group` in one transaction, or, if it fails as a whole,
    /// each of its writes alone.
    async fn commit(&self, group: &mut Vec<Queued>) {
        let (sql, params) = transaction(group.iter().map(|q| &q.write));
        #[cfg(test)]
        self.transactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match self
            .client
            .query("commit a group of writes", &sql, &params, Retries::None)
            .await
        {
            Ok(mut response) => {
                for (i, Queued { write, answer }) in group.drain(..).enumerate() {
                    // `BEGIN` is statement 0.
                    let value = response
                        .take::<Value>(i + 1)
                        .map_err(|e| db_error(write.context, &e));
                    let _ = answer.send(value);
                }
            }
            Err(Error::Closed) => {
                for queued in group.drain(..) {
                    let _ = queued.answer.send(Err(Error::Closed));
                }
            }
            // No answer (a deadline, a lost server): the group may have
            // committed. A conflict is not this (see `Retries::None`).
            Err(Error::Unavailable(_)) => {
                for queued in group.drain(..) {
                    let _ = queued.answer.send(Err(self.client.unavailable()));
                }
            }
            Err(_) => {
                let each = group.drain(..).map(|Queued { write, answer }| async move {
                    let _ = answer.send(self.alone(&write).await);
                });
                futures_util::future::join_all(each).await;
            }
        }
    }

    /// Commits one write alone, retried on conflicts as any request is.
    async fn alone(&self, write: &Write) -> Result<Value> {
        let (sql, params) = transaction(std::iter::once(write));
        #[cfg(test)]
        self.transactions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut response = self
            .client
            .query(write.context, &sql, &params, Retries::OnConflict)
            .await?;
        response
            .take::<Value>(1)
            .map_err(|e| db_error(write.context, &e))
    }
}

/// Sends each group in turn. A panic while one is sent (in the database's
/// client) ends that group's sending alone: the writes it had not answered
/// are dropped, and their callers learn that their commit was cut short
/// ([`GroupCommit::write`]). Uncaught, it would end the committing task,
/// and every later write of the service would fail.
async fn each_contained<F, Sent>(groups: Vec<Vec<Queued>>, send: F)
where
    F: Fn(Vec<Queued>) -> Sent,
    Sent: std::future::Future<Output = ()>,
{
    use futures_util::FutureExt as _;
    for group in groups {
        let writes = group.len();
        if std::panic::AssertUnwindSafe(send(group))
            .catch_unwind()
            .await
            .is_err()
        {
            tracing::error!(
                writes,
                "committing a group of writes panicked; its writes were answered with an \
                 error, and later writes go on"
            );
        }
    }
}

/// How many writes each group takes, in queue order, given how many
/// records each writes: as many as fit in [`MOST_RECORDS`], and at least
/// one.
fn group_lengths(records: &[usize]) -> Vec<usize> {
    let mut lengths = Vec::new();
    let (mut length, mut sum) = (0, 0);
    for &n in records {
        if length > 0 && sum + n > MOST_RECORDS {
            lengths.push(length);
            (length, sum) = (0, 0);
        }
        length += 1;
        sum += n;
    }
    if length > 0 {
        lengths.push(length);
    }
    lengths
}

/// One transaction of `writes`: a block each, its parameters as `$pN`.
fn transaction<'a>(writes: impl Iterator<Item = &'a Write>) -> (String, Variables) {
    let mut sql = String::from("BEGIN;\n");
    let mut params = Variables::new();
    for (i, write) in writes.enumerate() {
        let _ = writeln!(sql, "{{ LET $p = $p{i}; {} }};", write.block);
        params.insert(format!("p{i}"), Object::from(write.params.clone()));
    }
    sql.push_str("COMMIT;");
    (sql, params)
}

/// A write's answer as the type its block makes.
pub(super) fn answer<T: SurrealValue>(context: &str, value: Value) -> Result<T> {
    T::from_value(value).map_err(|e| Error::Database {
        context: context.to_owned(),
        message: format!("unexpected answer: {e}"),
    })
}

/// Whether a compare-and-set's block (`array::len` of what it updated)
/// updated its record.
pub(super) fn updated_any(context: &str, value: Value) -> Result<bool> {
    Ok(answer::<i64>(context, value)? > 0)
}

#[cfg(test)]
mod tests {
    use futures_util::future::join_all;
    use orchestrator_core::{Task, TaskStatus, Workflow};

    use crate::surreal::{SurrealBackend, open_embedded, test_task};
    use crate::{Error, TaskStore};

    /// A group whose sending panics fails its own writes, each with an
    /// error that says so, and the next group is still sent.
    #[tokio::test]
    async fn a_panic_while_a_group_commits_fails_that_group_alone() {
        use super::{GroupCommit, Queued, Write, each_contained};
        let (queue, mut queued) = tokio::sync::mpsc::channel(8);
        let commit = GroupCommit {
            queue,
            transactions: Default::default(),
        };
        let write = || Write {
            context: "update a task",
            block: "RETURN 1;",
            params: surrealdb::types::Variables::new(),
            records: 1,
        };
        let (first, second, third, committer) = tokio::join!(
            commit.write(write()),
            commit.write(write()),
            commit.write(write()),
            async {
                let mut taken: Vec<Queued> = Vec::new();
                while taken.len() < 3 {
                    queued.recv_many(&mut taken, 3).await;
                }
                let third = taken.split_off(2);
                let sent = std::sync::atomic::AtomicUsize::new(0);
                each_contained(vec![taken, third], |group| {
                    let n = sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    async move {
                        if n == 0 {
                            panic!("a panic in the database client");
                        }
                        for q in group {
                            let _ = q.answer.send(Ok(surrealdb::types::Value::from_t(7_i64)));
                        }
                    }
                })
                .await;
                sent.into_inner()
            }
        );
        assert_eq!(committer, 2, "the group after the panic was not sent");
        for answer in [first, second] {
            match answer {
                Err(Error::Database { context, message }) => {
                    assert_eq!(context, "update a task");
                    assert!(message.contains("cut short"), "{message}");
                }
                other => panic!("a write of the panicked group got {other:?}"),
            }
        }
        assert!(third.is_ok(), "{third:?}");
    }

    #[test]
    fn big_writes_make_groups_of_their_own() {
        use super::{MOST_RECORDS, group_lengths};
        assert_eq!(group_lengths(&[1, 1, 2, 1]), [4]);
        assert_eq!(group_lengths(&[]), Vec::<usize>::new());
        // A submission of many steps goes alone; those around it group.
        assert_eq!(group_lengths(&[1, 2, MOST_RECORDS + 5, 1, 1]), [2, 1, 2]);
        assert_eq!(group_lengths(&[MOST_RECORDS, 1]), [1, 1]);
        assert_eq!(
            group_lengths(&[MOST_RECORDS / 2, MOST_RECORDS / 2, 1]),
            [2, 1]
        );
    }

    async fn submitted(db: &SurrealBackend, steps: usize) -> (Workflow, Vec<Task>) {
        let workflow = Workflow::new("k", "w", chrono::Utc::now());
        let tasks: Vec<Task> = (0..steps)
            .map(|i| test_task(workflow.id, format!("t{i}")))
            .collect();
        db.insert_workflow(&workflow, &tasks).await.unwrap();
        (workflow, tasks)
    }

    fn transactions(db: &SurrealBackend) -> u64 {
        db.group
            .as_ref()
            .map_or(0, super::GroupCommit::transactions)
    }

    fn running(task: &Task) -> Task {
        let mut task = task.clone();
        task.status = TaskStatus::Running;
        task
    }

    /// The test runtime has one thread: every write below is queued
    /// before the committing task first runs, so they make one group.
    #[tokio::test]
    async fn writes_queued_meanwhile_commit_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_embedded(dir.path()).await;
        let (_, tasks) = submitted(&db, 40).await;
        let before = transactions(&db);
        // Two writers race for the first task from the same version: the
        // one queued first wins, the other must see a conflict.
        let changed: Vec<Task> = tasks.iter().chain([&tasks[0]]).map(running).collect();
        let answers = join_all(changed.iter().map(|t| db.update_task(t))).await;
        assert_eq!(transactions(&db) - before, 1, "not one transaction");
        let (last, rest) = answers.split_last().unwrap();
        let first = tasks[0].version;
        for answer in rest {
            assert_eq!(answer.as_ref().unwrap().version, first + 1);
        }
        match last {
            Err(Error::Conflict {
                what: "task",
                expected,
                found,
                ..
            }) if (*expected, *found) == (first, first + 1) => {}
            other => panic!("the losing writer got {other:?}"),
        }
        for task in &tasks {
            let stored = db.get_task(task.id).await.unwrap().unwrap();
            assert_eq!(
                (stored.version, stored.status),
                (first + 1, TaskStatus::Running)
            );
        }
    }

    /// A duplicate fails its group's transaction: nothing of it commits,
    /// and each write is then sent alone, so only the duplicate fails and
    /// the log is appended once.
    #[tokio::test]
    async fn a_group_that_fails_is_sent_write_by_write() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_embedded(dir.path()).await;
        let (workflow, tasks) = submitted(&db, 1).await;
        let before = transactions(&db);
        let changed = running(&tasks[0]);
        let (duplicate, updated, appended) = tokio::join!(
            db.insert_workflow(&workflow, &[]),
            db.update_task(&changed),
            db.append_log(tasks[0].id, b"hello\n"),
        );
        assert_eq!(transactions(&db) - before, 1 + 3);
        assert!(
            matches!(
                duplicate,
                Err(Error::AlreadyExists {
                    what: "workflow",
                    ..
                })
            ),
            "{duplicate:?}"
        );
        let first = tasks[0].version;
        assert_eq!(updated.unwrap().version, first + 1);
        assert_eq!(appended.unwrap(), 6);
        let log = db.read_log(tasks[0].id, 0, 1024).await.unwrap();
        assert_eq!(log.data, b"hello\n");
        let stored = db.get_task(tasks[0].id).await.unwrap().unwrap();
        assert_eq!(stored.version, first + 1);
    }

    /// Appends to one log in one group raise its length in turn.
    #[tokio::test]
    async fn appends_in_one_group_follow_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let db = open_embedded(dir.path()).await;
        let (_, tasks) = submitted(&db, 1).await;
        let id = tasks[0].id;
        let before = transactions(&db);
        let ends = join_all([&b"ab"[..], b"cde", b"f"].map(|chunk| db.append_log(id, chunk))).await;
        assert_eq!(transactions(&db) - before, 1);
        let ends: Vec<u64> = ends.into_iter().map(Result::unwrap).collect();
        assert_eq!(ends, [2, 5, 6]);
        assert_eq!(db.read_log(id, 0, 1024).await.unwrap().data, b"abcdef");
    }
}
