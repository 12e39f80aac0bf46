//! The seam between environments and what their nodes are made of. One
//! implementation ships: Linux namespaces (`NamespaceProvider`, in `netns`).
//! A container engine could be another, behind a cargo feature; none is
//! shipped untested.

use std::path::Path;

use async_trait::async_trait;

use crate::Result;
use crate::cgroup::LimitEvents;
use crate::model::{EnvNames, EnvPlan, NodePlan};

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

    /// Makes the environment's nodes, each reachable by name from the
    /// others and from nothing else. Whatever an earlier attempt left is
    /// removed first, so that a retry starts clean.
    async fn create(&self, plan: &EnvPlan, root: &Path) -> Result<()>;

    /// A command that runs `program` with `args` inside `node`: its
    /// namespaces and its root filesystem, its own dir in it as the working
    /// directory, `HOME` and `ORCHESTRATOR_DATA_DIR`. In its own process
    /// group, with a bounded set of capabilities: those the provider holds
    /// to make nodes stay its own. `program` and the paths in `args` are
    /// host paths the node shows at the same place (the scripts dir and
    /// the interpreters; the node's `run` dir, writable).
    async fn command(
        &self,
        plan: &EnvPlan,
        node: &NodePlan,
        root: &Path,
        program: &Path,
        args: &[String],
    ) -> Result<tokio::process::Command>;

    /// The processes running in `node`: pid (as the host sees it) and
    /// command line, arguments separated by spaces.
    async fn processes(&self, plan: &EnvPlan, node: &NodePlan) -> Result<Vec<(i32, String)>>;

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
