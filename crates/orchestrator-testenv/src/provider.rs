//! The seam between environments and what their nodes are made of. Two
//! implementations ship: Linux namespaces (`NamespaceProvider`, in
//! `netns`) and containers of a Docker Engine API (`DockerProvider`, in
//! `docker`), chosen by `--testenv-provider`.
//!
//! A program in a node is a [`NodeProcess`], not a `Command`: a container
//! engine starts it through its API, so that its pipes are streams and
//! its end is the engine's to tell.

use std::fmt;
use std::path::Path;
use std::pin::Pin;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::Result;
use crate::cgroup::LimitEvents;
use crate::model::{EnvNames, EnvPlan, NodePlan};

/// A program's stdin, as a provider hands it.
pub type NodeWriter = Pin<Box<dyn AsyncWrite + Send>>;
/// A program's stdout or stderr, as a provider hands it.
pub type NodeReader = Pin<Box<dyn AsyncRead + Send>>;

/// How a program in a node ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeExit {
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// As a person reads it: `exit status: 1`, `signal: 9 (SIGKILL)`.
    pub description: String,
}

impl NodeExit {
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

impl fmt::Display for NodeExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.description)
    }
}

/// Waits for, or ends, one program started in a node.
#[async_trait]
pub trait NodeChild: Send {
    /// Until it ends; how it ended.
    async fn wait(&mut self) -> Result<NodeExit>;

    /// Ends it and what it started (SIGKILL), if it still runs.
    async fn kill(&mut self) -> Result<()>;
}

/// A program started in a node: its pipes (each taken at most once) and
/// its end.
pub struct NodeProcess {
    pub stdin: Option<NodeWriter>,
    pub stdout: Option<NodeReader>,
    pub stderr: Option<NodeReader>,
    pub child: Box<dyn NodeChild>,
}

impl NodeProcess {
    pub async fn wait(&mut self) -> Result<NodeExit> {
        self.child.wait().await
    }

    pub async fn kill(&mut self) -> Result<()> {
        self.child.kill().await
    }
}

/// Makes nodes, runs programs in them, and tears them down. Every call
/// finds what it works on by the names a plan derives from the
/// environment's id, so that a restarted service can finish or clean up
/// what an earlier life began.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Its name, for messages and `GET /test/environments`.
    fn name(&self) -> &'static str;

    /// What this process lacks to make nodes, named (empty: nothing).
    /// Checked before anything is made.
    fn missing_privileges(&self) -> Vec<String>;

    /// Whether what the provider drives (a container engine) answers:
    /// `Error::Unavailable` naming it when not. Checked before anything
    /// is made.
    async fn health(&self) -> Result<()> {
        Ok(())
    }

    /// Makes the environment's nodes, each reachable by name from the
    /// others and from nothing else. Whatever an earlier attempt left is
    /// removed first, so that a retry starts clean.
    async fn create(&self, plan: &EnvPlan, root: &Path) -> Result<()>;

    /// Starts `program` with `args` inside `node`, stdin, stdout and
    /// stderr piped, with `env` added to the node's environment: its
    /// namespaces and its root filesystem, its own dir in it as the working
    /// directory, `HOME` and `ORCHESTRATOR_DATA_DIR`, with a bounded set of
    /// capabilities (those the provider holds to make nodes stay its own).
    /// `program` and the paths in `args` are host paths the node shows at
    /// the same place (the scripts dir and the interpreters).
    async fn spawn(
        &self,
        plan: &EnvPlan,
        node: &NodePlan,
        root: &Path,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<NodeProcess>;

    /// Removes everything of the environment: processes, namespaces,
    /// links, directories. Idempotent; how many things it removed.
    async fn destroy(&self, names: &EnvNames, root: &Path) -> Result<usize>;

    /// The environments of the service tagged `tag` that have anything
    /// left on this host.
    async fn existing(&self, tag: &str, root: &Path) -> Result<Vec<EnvNames>>;

    /// How this provider enforces the nodes' limits (`cgroup v2`, ...),
    /// or why it cannot: then no environment is made.
    fn limits_enforcement(&self) -> std::result::Result<String, String> {
        Err(format!(
            "the {} provider enforces no node limits",
            self.name()
        ))
    }

    /// What `node`'s limits have stopped so far (counters only grow): a
    /// step compares them before and after, to say why it failed.
    async fn limit_events(&self, _plan: &EnvPlan, _node: &NodePlan) -> LimitEvents {
        LimitEvents::default()
    }
}
