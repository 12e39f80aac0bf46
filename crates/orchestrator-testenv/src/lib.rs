//! Test environments: a taskserv alone, a server with its taskservs, or a
//! cluster topology, each node in its own Linux namespaces, made, checked
//! and torn down as workflows of the engine (see docs/test-environments.md).
//!
//! - `model`: what a caller asks for (`CreateRequest`), its validation into
//!   an `EnvPlan` (nodes, addresses, checks, deadlines), and the names of
//!   everything a plan makes.
//! - `catalog`: the shipped topologies (`templates/topologies/*.yaml`) and
//!   the taskservs a node can run (`scripts/taskservs/<name>/testenv.json`).
//! - `provider`: the `Provider` trait (make nodes, run a program in one,
//!   tear down, list what exists) and `netns`, its Linux namespace
//!   implementation, and `docker`, its Docker Engine API one; `node_init`, the first process of each of its nodes,
//!   which builds the node's root filesystem and enters it.
//! - `cgroup`: the nodes' limits (memory, pids, cpu), through cgroup v1
//!   or v2, whichever this host provides.
//! - `runner`: `NodeRunner`, the engine's `testenv` step kind.
//! - `service`: `TestEnvs`, the environments as workflows: create, run,
//!   delete, show, logs, the ttl and auto-cleanup loop, and recovery.

pub mod caps;
pub mod catalog;
pub mod cgroup;
pub mod docker;
pub mod model;
pub mod netns;
pub mod node_init;
pub mod provider;
pub mod runner;
pub mod service;
pub mod topology;

pub use catalog::Catalog;
pub use docker::DockerProvider;
pub use model::{CreateRequest, EnvPlan, EnvType, NodePlan};
pub use netns::NamespaceProvider;
pub use provider::Provider;
pub use runner::NodeRunner;
pub use service::{EnvView, TestEnvs};

/// What can go wrong with a test environment. Messages are lowercase and
/// name the field or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request is wrong: `field` says where.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },
    #[error("no test environment `{0}`")]
    NotFound(String),
    /// The environment is not in a state that allows the call.
    #[error("{0}")]
    Conflict(String),
    /// A bound (environments, nodes) would be exceeded.
    #[error("{0}")]
    Limit(String),
    /// The service lacks a privilege; nothing was made.
    #[error("{0}")]
    Privileges(String),
    /// This host cannot do what environments need (enforce the nodes'
    /// limits); nothing was made.
    #[error("{0}")]
    Unsupported(String),
    /// What the provider drives (a container engine) does not answer;
    /// nothing was made.
    #[error("{0}")]
    Unavailable(String),
    /// A command of the provider failed.
    #[error("{0}")]
    Provider(String),
    #[error(transparent)]
    Engine(#[from] orchestrator_engine::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Error {
    Error::Invalid {
        field: field.into(),
        message: message.into(),
    }
}
