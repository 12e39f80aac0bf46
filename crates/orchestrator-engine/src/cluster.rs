//! Life among other nodes: heartbeats, lease renewal, taking over the
//! running tasks of nodes that stopped, and (on a shared store) picking up
//! work that other nodes accepted.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use orchestrator_core::{Node, TaskStatus};

use crate::Result;
use crate::dispatch::is_conflict;
use crate::engine::{Inner, lock};

/// How often a node on a shared store looks for work others accepted.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Every this many polls, unfinished workflows are advanced too, in case
/// the node that should have done it stopped half-way.
const ADVANCE_EVERY: u32 = 10;

impl Inner {
    pub(crate) async fn heartbeat(&self) -> Result<()> {
        let node = Node {
            id: self.config.node_id.clone(),
            address: self.config.address.clone(),
            started_at: self.started_at,
            last_seen: Utc::now(),
        };
        Ok(self.store.nodes().heartbeat(&node).await?)
    }

    /// Runs until the engine has shut down completely (not just stopped
    /// dispatching): leases of scripts finishing in the shutdown grace
    /// must keep being renewed, or another node would take them over.
    pub(crate) async fn housekeeping_loop(self: Arc<Self>) {
        let renew_every = (self.config.lease / 3).max(Duration::from_millis(100));
        let shared = self.store.nodes().shared();
        let tick = if shared {
            POLL_INTERVAL.min(renew_every)
        } else {
            renew_every
        };
        let mut last_renewal = tokio::time::Instant::now();
        let mut polls = 0u32;
        loop {
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = self.closed.cancelled() => return,
            }
            if last_renewal.elapsed() >= renew_every {
                last_renewal = tokio::time::Instant::now();
                if let Err(e) = self.heartbeat().await {
                    tracing::warn!(error = %e, "heartbeat failed");
                }
                self.renew_leases().await;
            } else if shared {
                self.watch_running().await;
            }
            if self.stopping.is_cancelled() {
                continue;
            }
            polls += 1;
            if let Err(e) = self
                .look_for_work(shared, polls.is_multiple_of(ADVANCE_EVERY))
                .await
            {
                tracing::warn!(error = %e, "looking for work failed");
            }
        }
    }

    /// Stops the scripts of attempts this node no longer owns (their lease
    /// ran out and another node took them over) or whose cancel was
    /// requested through another node. Returns the tasks still owned.
    async fn watch_running(&self) -> Vec<orchestrator_core::Task> {
        let running: Vec<_> = lock(&self.running)
            .iter()
            .map(|(id, token)| (*id, token.clone()))
            .collect();
        let mut owned = Vec::new();
        for (id, token) in running {
            let Ok(Some(task)) = self.store.tasks().get_task(id).await else {
                continue;
            };
            if task.status != TaskStatus::Running
                || task.node.as_deref() != Some(&self.config.node_id)
            {
                tracing::warn!(task = %id, "another node took the task over; stopping its script here");
                token.cancel();
            } else {
                if task.cancel_requested {
                    token.cancel();
                }
                owned.push(task);
            }
        }
        owned
    }

    /// Pushes the lease of every attempt this node still owns forward
    /// (and stops those it lost).
    async fn renew_leases(&self) {
        for mut task in self.watch_running().await {
            let id = task.id;
            for _ in 0..3 {
                task.lease_until = Some(
                    Utc::now() + chrono::Duration::from_std(self.config.lease).unwrap_or_default(),
                );
                match self.store.tasks().update_task(&task).await {
                    Ok(_) => break,
                    Err(e) if is_conflict(&e) => match self.store.tasks().get_task(id).await {
                        Ok(Some(fresh))
                            if fresh.status == TaskStatus::Running && fresh.node == task.node =>
                        {
                            task = fresh
                        }
                        _ => break,
                    },
                    Err(e) => {
                        tracing::warn!(task = %id, error = %e, "lease renewal failed");
                        break;
                    }
                }
            }
        }
    }

    /// Takes over running tasks whose lease ran out (their node stopped, or
    /// this node could not record their outcome), and on a shared store
    /// queues what other nodes accepted.
    async fn look_for_work(&self, shared: bool, advance_workflows: bool) -> Result<()> {
        let now = Utc::now();
        for task in self.store.tasks().unfinished_tasks().await? {
            match task.status {
                TaskStatus::Running => {
                    let expired = task.lease_until.is_some_and(|until| until < now);
                    let mine_and_alive = lock(&self.running).contains_key(&task.id);
                    if expired && !mine_and_alive {
                        let error = format!(
                            "interrupted: node {} stopped renewing its lease during attempt {}",
                            task.node.as_deref().unwrap_or("?"),
                            task.attempts
                        );
                        self.take_over(task, error).await?;
                    }
                }
                TaskStatus::Queued | TaskStatus::RetryWaiting
                    if shared && !lock(&self.queue).contains(task.id) =>
                {
                    self.enqueue(&task);
                }
                _ => {}
            }
        }
        if shared && advance_workflows {
            self.advance_unfinished_workflows().await?;
        }
        Ok(())
    }
}
