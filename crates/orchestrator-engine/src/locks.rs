//! Locks: the engine's side of named resource locks. Before a task with
//! `locks` is claimed, each of its locks is asked for (in name order, so
//! two workflows can not each hold what the other waits for within one
//! step); a task that must wait goes back to the queue and holds no
//! worker. A lock is let go once no unfinished task of its workflow needs
//! it: after each attempt that held it, and in a sweep (every lease
//! check) that also catches cancels, skips and node lives that ended.
//!
//! Every change is a read, the core's decision (`orchestrator_core::lock`)
//! and a compare-and-set write, durable before the step runs and before
//! its event is announced. Events are announced by the node that made the
//! write.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use orchestrator_core::event::{Change, EventKind, LockChange};
use orchestrator_core::lock::{Answer, LockRecord, LockRequest, Moves, NodeLife, Tokens};
use orchestrator_core::{Task, TaskId, WorkflowId};

use crate::Result;
use crate::records::Records;

/// How soon a task waiting for a lock asks again. It holds no worker
/// meanwhile; a release on another node wakes nothing here.
pub(crate) const LOCK_RETRY: Duration = Duration::from_millis(250);

/// Rounds of read-decide-write on one lock before a caller is told of the
/// conflict (and tries again later).
const WRITE_ROUNDS: usize = 16;

/// One node's view of the locks.
pub(crate) struct Locks {
    records: Arc<Records>,
    /// This node's life: holds and places in line last while it does.
    life: NodeLife,
    /// A node whose last heartbeat is older than this is gone, and so
    /// are its holds.
    lease: Duration,
}

/// Sweeps every `every` until `stopping` (see [`Locks::sweep`]).
pub(crate) async fn sweep_every(
    locks: Arc<Locks>,
    every: Duration,
    stopping: tokio_util::sync::CancellationToken,
) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = stopping.cancelled() => return,
        }
        if let Err(e) = locks.sweep().await {
            tracing::warn!(error = %e, "sweeping locks failed");
        }
    }
}

/// Whether a node life is still alive.
type Alive = Box<dyn Fn(&NodeLife) -> bool + Send + Sync>;

impl Locks {
    pub(crate) fn new(records: Arc<Records>, life: NodeLife, lease: Duration) -> Locks {
        Locks {
            records,
            life,
            lease,
        }
    }

    /// The node lives alive now: this one, and each node whose heartbeat
    /// is younger than the lease, in the life its heartbeat names.
    async fn alive(&self) -> Result<Alive> {
        let lease = chrono::Duration::from_std(self.lease).unwrap_or_default();
        let now = Utc::now();
        let live: HashSet<(String, DateTime<Utc>)> = self
            .records
            .store()
            .nodes()
            .nodes()
            .await?
            .into_iter()
            .filter(|n| n.alive(lease, now))
            .map(|n| (n.id, n.started_at))
            .collect();
        let me = self.life.clone();
        Ok(Box::new(move |l: &NodeLife| {
            *l == me || live.contains(&(l.node.clone(), l.life))
        }))
    }

    /// Asks for every lock `task` needs: the fencing tokens by key once
    /// all are held, `None` while one is waited for.
    pub(crate) async fn acquire(&self, task: &Task) -> Result<Option<Tokens>> {
        let mut tokens = Tokens::new();
        if task.step.locks.is_empty() {
            return Ok(Some(tokens));
        }
        let alive = self.alive().await?;
        let mut claims = task.step.locks.clone();
        claims.sort_by(|a, b| a.name.cmp(&b.name));
        let step = task
            .step
            .ref_name
            .clone()
            .unwrap_or_else(|| task.name.clone());
        for claim in &claims {
            let request = LockRequest::of(claim, task.workflow_id, self.life.clone(), &step);
            let (answer, moves) = self
                .change(&claim.name, |lock, now| {
                    lock.request(&request, &*alive, now)
                })
                .await?;
            self.announce_moves(&claim.name, &moves);
            match answer {
                Answer::Held { token, fresh } => {
                    if fresh {
                        tracing::info!(lock = %claim.name, workflow = %task.workflow_id, token, "lock granted");
                        self.announce(
                            EventKind::LockGranted,
                            task.workflow_id,
                            Some(task.id),
                            LockChange {
                                name: claim.name.clone(),
                                token: Some(token),
                                position: None,
                                reason: None,
                            },
                        );
                    }
                    tokens.insert(claim.key.clone(), token);
                }
                Answer::Waiting { position, fresh } => {
                    if fresh {
                        self.announce(
                            EventKind::LockWaiting,
                            task.workflow_id,
                            Some(task.id),
                            LockChange {
                                name: claim.name.clone(),
                                token: None,
                                position: Some(position),
                                reason: None,
                            },
                        );
                    }
                    return Ok(None);
                }
            }
        }
        Ok(Some(tokens))
    }

    /// Lets go of the locks `workflow` holds or waits for among `names`
    /// that none of its unfinished tasks needs any more.
    pub(crate) async fn release_unneeded(
        &self,
        workflow: WorkflowId,
        names: &[String],
    ) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        let needed = self.needed_by(workflow).await?;
        let alive = self.alive().await?;
        for name in names.iter().filter(|n| !needed.contains(*n)) {
            self.release(workflow, name, &alive, "ended").await?;
        }
        Ok(())
    }

    /// The lock names the unfinished tasks of `workflow` need.
    async fn needed_by(&self, workflow: WorkflowId) -> Result<HashSet<String>> {
        let tasks = self
            .records
            .store()
            .tasks()
            .workflow_tasks(workflow)
            .await?;
        Ok(tasks
            .iter()
            .filter(|t| !t.status.is_terminal())
            .flat_map(|t| t.step.locks.iter().map(|c| c.name.clone()))
            .collect())
    }

    async fn release(
        &self,
        workflow: WorkflowId,
        name: &str,
        alive: &Alive,
        reason: &str,
    ) -> Result<()> {
        let (involved, held, moves) = self
            .change(name, |lock, now| {
                if lock.involves(workflow) {
                    let (held, moves) = lock.release(workflow, &**alive, now);
                    (true, held, moves)
                } else {
                    (false, None, Moves::default())
                }
            })
            .await?;
        if involved {
            // A hold let go (with its token), or a place in line left.
            tracing::info!(lock = %name, workflow = %workflow, token = ?held, "lock released");
            self.announce(
                EventKind::LockReleased,
                workflow,
                None,
                LockChange {
                    name: name.to_owned(),
                    token: held,
                    position: None,
                    reason: Some(reason.to_owned()),
                },
            );
        }
        self.announce_moves(name, &moves);
        Ok(())
    }

    /// One round over every lock with a holder or a waiter: node lives
    /// that ended lose their holds, and workflows that need a lock no
    /// more (finished, cancelled, pruned) let it go.
    pub(crate) async fn sweep(&self) -> Result<()> {
        let busy: Vec<LockRecord> = self
            .records
            .store()
            .locks()
            .locks()
            .await?
            .into_iter()
            .filter(|l| !l.idle())
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        let alive = self.alive().await?;
        for lock in busy {
            let mut owners: Vec<WorkflowId> = lock.holders.iter().map(|h| h.workflow).collect();
            owners.extend(lock.waiters.iter().map(|w| w.workflow));
            for workflow in owners {
                if !self.needed_by(workflow).await?.contains(&lock.name) {
                    self.release(workflow, &lock.name, &alive, "finished")
                        .await?;
                }
            }
            let (_, moves) = self
                .change(&lock.name, |record, now| {
                    let mut moves = Moves::default();
                    record.expire(&*alive, &mut moves);
                    // Those behind a lost holder move up.
                    moves.granted.extend(record.grant_waiters(now));
                    ((), moves)
                })
                .await?;
            self.announce_moves(&lock.name, &moves);
        }
        Ok(())
    }

    /// Every lock record, by name.
    pub(crate) async fn list(&self) -> Result<Vec<LockRecord>> {
        Ok(self.records.store().locks().locks().await?)
    }

    /// Reads the lock, applies `decide` and writes it back if it changed,
    /// by compare-and-set; reads and decides again on a conflict.
    async fn change<T>(
        &self,
        name: &str,
        mut decide: impl FnMut(&mut LockRecord, DateTime<Utc>) -> T,
    ) -> Result<T> {
        let store = self.records.store().locks();
        let mut last = None;
        for _ in 0..WRITE_ROUNDS {
            let mut lock = store
                .get_lock(name)
                .await?
                .unwrap_or_else(|| LockRecord::new(name));
            let before = lock.clone();
            let out = decide(&mut lock, Utc::now());
            if lock == before {
                return Ok(out);
            }
            match store.put_lock(&lock).await {
                Ok(_) => return Ok(out),
                Err(e @ orchestrator_storage::Error::Conflict { .. }) => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last
            .map(crate::Error::from)
            .unwrap_or_else(|| crate::Error::Internal("lock write rounds ran out".into())))
    }

    fn announce_moves(&self, name: &str, moves: &Moves) {
        for (workflow, token) in &moves.expired {
            tracing::warn!(lock = %name, workflow = %workflow, "a node life ended: its hold on the lock is gone");
            self.announce(
                EventKind::LockReleased,
                *workflow,
                None,
                LockChange {
                    name: name.to_owned(),
                    token: *token,
                    position: None,
                    reason: Some("expired".to_owned()),
                },
            );
        }
        for (workflow, token) in &moves.granted {
            self.announce(
                EventKind::LockGranted,
                *workflow,
                None,
                LockChange {
                    name: name.to_owned(),
                    token: Some(*token),
                    position: None,
                    reason: None,
                },
            );
        }
    }

    fn announce(
        &self,
        kind: EventKind,
        workflow: WorkflowId,
        task: Option<TaskId>,
        lock: LockChange,
    ) {
        self.records
            .announce_here(Change::lock(kind, workflow, task, lock));
    }
}
