//! [`NodeStore`] on SurrealDB: heartbeats in the `node` table, and the
//! change feed of a shared server.
//!
//! The feed follows three `LIVE SELECT`s: the `doc` of every task and
//! workflow written, and `log_length` (the task and its new length: never
//! the log's bytes). A task spawned per feed pumps their notifications into
//! the feed's bounded channel without ever waiting for room (see
//! [`crate::ChangeSink`]). When a live query fails or the connection drops
//! (the SDK ends every live query of a connection it lost), the pump
//! subscribes again, with backoff, and then tells the reader with
//! [`Change::Lost`]: a live query replays nothing it missed.
//!
//! The live queries run on a connection of the feed's own. The server
//! closes a WebSocket whose queue of notifications fills (100 by default,
//! `SURREAL_WEBSOCKET_RESPONSE_CHANNEL_SIZE`), and one transaction that
//! writes many records (a workflow of 1,000 steps) fills it at once, however
//! fast the client reads. On the store's own connection that failed every
//! request in flight with it (and the node answered 503); on the feed's,
//! only the feed breaks, subscribes again and says what it lost.

use std::future::IntoFuture;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use orchestrator_core::backoff::Backoff;
use orchestrator_core::{Node, TaskId};
use surrealdb::engine::any::Any;
use surrealdb::method::QueryStream;
use surrealdb::types::{Action, SurrealValue, Value, Variables};
use surrealdb::{Notification, Surreal};
use tokio::sync::watch;

use super::SurrealBackend;
use super::connection::Target;
use super::errors::first_error;
use crate::{Change, ChangeFeed, ChangeSink, Error, NodeStore, Result, StorageConfig};

/// Changes a feed holds that its reader has not taken yet; past that,
/// changes are dropped and the reader gets one [`Change::Lost`].
const FEED_CAPACITY: usize = 1024;
/// Waits between attempts to subscribe again: doubling from the first to
/// the last.
const RESUBSCRIBE_BACKOFF: Backoff =
    Backoff::doubling(Duration::from_millis(250), Duration::from_secs(5));

/// The live queries of one feed, in one request. Tables are constants;
/// nothing else is put in the statement.
const SUBSCRIBE: &str = "LIVE SELECT VALUE doc FROM task;
     LIVE SELECT VALUE doc FROM workflow;
     LIVE SELECT record::id(id) AS task, bytes FROM log_length;";

#[async_trait]
impl NodeStore for SurrealBackend {
    fn shared(&self) -> bool {
        self.client.name == "surrealdb-server"
    }

    async fn heartbeat(&self, node: &Node) -> Result<()> {
        let mut vars = Variables::new();
        vars.insert("id", node.id.clone());
        vars.insert(
            "doc",
            serde_json::to_string(node)
                .map_err(|e| Error::io("serialize a node", std::io::Error::other(e)))?,
        );
        self.query(
            "record a heartbeat",
            "UPSERT type::record('node', $id) CONTENT { doc: $doc };",
            &vars,
        )
        .await?;
        Ok(())
    }

    async fn nodes(&self) -> Result<Vec<Node>> {
        self.docs(
            "list nodes",
            "SELECT VALUE doc FROM node ORDER BY id;",
            &Variables::new(),
        )
        .await
    }

    /// On a server: a feed of its own live queries. Embedded, `None`: one
    /// process has the store, and the engine knows its own writes.
    fn changes(&self) -> Option<ChangeFeed> {
        // Set exactly for a server, the one shared store.
        let config = self.feed_config.clone()?;
        let (sink, feed) = ChangeFeed::channel(FEED_CAPACITY);
        // A closed store has no client: the sink is dropped here, and the
        // feed ends at once.
        if let Ok(db) = self.client.handle() {
            let pump = Pump {
                db: Arc::downgrade(&db),
                config,
                sink,
                closing: self.closing.subscribe(),
                request_timeout: self.client.request_timeout,
                location: self.client.location.clone(),
            };
            tokio::spawn(pump.run());
        }
        Some(feed)
    }
}

/// What a feed's pump needs; it holds the store's client weakly, only to
/// tell that the store is open, so a closed or dropped store is not kept
/// open by its feeds.
struct Pump {
    db: Weak<Surreal<Any>>,
    /// How to open the feed's own connection.
    config: StorageConfig,
    sink: ChangeSink,
    /// `true`, or gone, once the store is closed.
    closing: watch::Receiver<bool>,
    request_timeout: Duration,
    /// The server's URL, for the reasons given in `Lost`.
    location: String,
}

/// The three live queries of a feed, on the feed's own connection.
struct Subscription {
    tasks: QueryStream<Value>,
    workflows: QueryStream<Value>,
    logs: QueryStream<Value>,
    /// Their ids, to end them.
    ids: Vec<Value>,
    /// The connection they run on; dropping it ends them on the server.
    db: Surreal<Any>,
}

/// Which table a notification came from.
#[derive(Clone, Copy)]
enum Table {
    Task,
    Workflow,
    Log,
}

/// A `log_length` notification, as projected by [`SUBSCRIBE`].
#[derive(SurrealValue)]
#[surreal(crate = "surrealdb::types")]
struct LogGrowth {
    task: String,
    bytes: i64,
}

/// What one notification means for the feed.
enum Notified {
    Change(Box<Change>),
    /// Nothing the feed reports (a delete).
    Nothing,
    /// This notification is lost (the server could not evaluate it, or it
    /// could not be read), but the subscription goes on.
    Missed(String),
    /// The live query ended: subscribe again.
    Broken(String),
}

impl Pump {
    async fn run(mut self) {
        // Failed subscriptions since the feed last followed.
        let mut failed = 0;
        loop {
            if self.db.strong_count() == 0 {
                return;
            }
            let subscribed = tokio::select! {
                _ = store_closed(&mut self.closing) => return,
                () = self.sink.closed() => return,
                subscribed = subscribe(&self.config, self.request_timeout) => subscribed,
            };
            let mut subscription = match subscribed {
                Ok(subscription) => subscription,
                Err(reason) => {
                    self.sink.lost(format!(
                        "the change feed from {} could not subscribe ({reason})",
                        self.location
                    ));
                    tokio::select! {
                        _ = store_closed(&mut self.closing) => return,
                        () = self.sink.closed() => return,
                        () = tokio::time::sleep(RESUBSCRIBE_BACKOFF.delay(failed, 0.0)) => {}
                    }
                    failed += 1;
                    continue;
                }
            };
            failed = 0;
            self.sink.set_following(true);
            let Some(reason) = self.follow(&mut subscription).await else {
                // The SDK's streams cannot end their live queries themselves
                // (they ask under a session id of their own), so end them
                // here, through the session that started them, before the
                // connection closes.
                kill(&subscription.db, &subscription.ids, self.request_timeout).await;
                return;
            };
            // The connection goes with what is left of the subscription.
            drop(subscription);
            self.sink.set_following(false);
            tracing::warn!(location = %self.location, %reason, "the change feed broke; subscribing again");
            // Told once the feed follows again: a reader that re-reads on
            // `Lost` then misses nothing.
            self.sink.lost(format!(
                "the change feed from {} broke ({reason}) and was re-established",
                self.location
            ));
        }
    }

    /// Pumps notifications until the subscription breaks (its reason) or
    /// the feed is over (`None`: the store closed or the reader left).
    async fn follow(&mut self, live: &mut Subscription) -> Option<String> {
        loop {
            let notified = tokio::select! {
                _ = store_closed(&mut self.closing) => return None,
                alive = self.sink.tend() => {
                    if alive {
                        continue;
                    }
                    return None;
                }
                item = live.tasks.next() => notified(Table::Task, item),
                item = live.workflows.next() => notified(Table::Workflow, item),
                item = live.logs.next() => notified(Table::Log, item),
            };
            match notified {
                Notified::Change(change) => {
                    if !self.sink.send(*change) {
                        return None;
                    }
                }
                Notified::Nothing => {}
                Notified::Missed(reason) => self.sink.lost(reason),
                Notified::Broken(reason) => return Some(reason),
            }
        }
    }
}

/// Resolves once the store is closed or dropped.
async fn store_closed(closing: &mut watch::Receiver<bool>) {
    // An error means the sender, in the store, is gone: closed too.
    let _ = closing.wait_for(|closed| *closed).await;
}

/// Opens the feed's connection (within the connect timeout) and starts its
/// live queries (within the request timeout).
async fn subscribe(
    config: &StorageConfig,
    timeout: Duration,
) -> std::result::Result<Subscription, String> {
    let db = match Target::of(config) {
        Ok(target) => target.connect(config, false).await,
        Err(e) => Err(e),
    }
    .map_err(|e| e.to_string())?;
    let mut response = match tokio::time::timeout(timeout, db.query(SUBSCRIBE).into_future()).await
    {
        Err(_) => return Err(format!("no answer within {}s", timeout.as_secs_f32())),
        Ok(Err(e)) => return Err(e.message().to_owned()),
        Ok(Ok(response)) => response,
    };
    if let Some(e) = first_error(&mut response) {
        return Err(e.message().to_owned());
    }
    let mut stream = |index: usize| {
        response
            .stream::<Value>(index)
            .map_err(|e| e.message().to_owned())
    };
    let (tasks, workflows, logs) = (stream(0)?, stream(1)?, stream(2)?);
    let ids = (0..3)
        .map(|index| response.take::<Value>(index))
        .collect::<surrealdb::Result<_>>()
        .map_err(|e| e.message().to_owned())?;
    Ok(Subscription {
        tasks,
        workflows,
        logs,
        ids,
        db,
    })
}

/// Ends live queries, within the request timeout; a failure is only
/// logged (a connection that dropped has ended them already).
async fn kill(db: &Surreal<Any>, ids: &[Value], timeout: Duration) {
    for id in ids {
        let request = db.query("KILL $id;").bind(("id", id.clone()));
        let failure = match tokio::time::timeout(timeout, request.into_future()).await {
            Err(_) => Some(format!("no answer within {}s", timeout.as_secs_f32())),
            Ok(Err(e)) => Some(e.message().to_owned()),
            Ok(Ok(mut response)) => first_error(&mut response).map(|e| e.message().to_owned()),
        };
        if let Some(reason) = failure {
            tracing::debug!(?id, %reason, "could not end a live query of a change feed");
        }
    }
}

/// What a live query's next item means for the feed.
fn notified(table: Table, item: Option<surrealdb::Result<Notification<Value>>>) -> Notified {
    let notification = match item {
        None => return Notified::Broken("the live query ended".into()),
        Some(Err(e)) => return Notified::Broken(e.message().to_owned()),
        Some(Ok(notification)) => notification,
    };
    let created = match notification.action {
        Action::Create => true,
        Action::Update => false,
        // Records are deleted only by an import that replaces them, which
        // creates them again.
        Action::Delete => return Notified::Nothing,
        Action::Killed => return Notified::Broken("the live query was killed".into()),
        Action::Error => {
            return Notified::Missed(format!(
                "the server could not evaluate a change notification: {:?}",
                notification.data
            ));
        }
    };
    let read = match table {
        Table::Task => read_doc(notification.data).map(|task| Change::Task { created, task }),
        Table::Workflow => {
            read_doc(notification.data).map(|workflow| Change::Workflow { created, workflow })
        }
        Table::Log => read_growth(notification.data),
    };
    match read {
        Ok(change) => Notified::Change(Box::new(change)),
        Err(reason) => Notified::Missed(format!("an unreadable change notification: {reason}")),
    }
}

fn read_doc<T: serde::de::DeserializeOwned>(data: Value) -> std::result::Result<T, String> {
    let doc: String = data.into_t().map_err(|e| e.to_string())?;
    serde_json::from_str(&doc).map_err(|e| e.to_string())
}

fn read_growth(data: Value) -> std::result::Result<Change, String> {
    let growth: LogGrowth = data.into_t().map_err(|e| e.to_string())?;
    Ok(Change::Log {
        task: growth.task.parse::<TaskId>().map_err(|e| e.to_string())?,
        length: u64::try_from(growth.bytes).map_err(|e| e.to_string())?,
    })
}
