//! What a caller asks for, and the plan it becomes: every node with its
//! address and the names of everything the environment makes, derived
//! from the environment's id so that a restarted service finds exactly
//! its own resources.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use crate::catalog::Catalog;
use crate::topology::truncate;
pub use crate::topology::{CrossCheck, LimitsOverride, Topology, TopologyNode, check_name};
use crate::{Result, invalid};

/// Most nodes one environment may have.
pub const MAX_NODES: usize = 8;
/// Most taskservs on one node.
pub const MAX_TASKSERVS_PER_NODE: usize = 8;
/// Most cross-node checks of one topology.
pub const MAX_CHECKS: usize = 32;
/// An environment lives this long unless `ttl` says otherwise.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// The bounds of `ttl`.
pub const MIN_TTL: Duration = Duration::from_secs(5);
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Every name this service gives a namespace, a link, a cgroup or a
/// directory starts with it; nothing else is ever removed.
pub const PREFIX: &str = "te";
/// A node's limits unless its topology or the request says otherwise:
/// room for a real postgres or etcd with its tools, and no more than a
/// core, so that one node cannot take a small host.
pub const DEFAULT_LIMITS: NodeLimits = NodeLimits {
    memory_mib: 512,
    pids: 512,
    cpus: 1.0,
};
/// The bounds of a node's memory limit, in MiB: below the minimum not even
/// a script's interpreter starts.
pub const MIN_MEMORY_MIB: u64 = 32;
pub const MAX_MEMORY_MIB: u64 = 16 * 1024;
/// The bounds of a node's pids limit (processes and threads).
pub const MIN_PIDS: u32 = 16;
pub const MAX_PIDS: u32 = 32768;
/// The least CPU a node may have, in cores; the most is the host's cores.
pub const MIN_CPUS: f64 = 0.1;

/// What an environment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EnvType {
    /// One taskserv alone on one node.
    SingleTaskserv,
    /// One server (a node of that name) with its taskservs.
    Server,
    /// A topology: a template of `templates/topologies/`, or inline.
    Cluster,
}

/// `topology`: a template's name, or a topology inline.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum TopologyChoice {
    Named(String),
    Inline(Topology),
}

/// `ttl`: seconds, or a duration such as `90s`, `15m`, `2h`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Ttl {
    Seconds(u64),
    Text(String),
}

/// `POST /test/environments/create`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    #[serde(rename = "type")]
    pub env_type: EnvType,
    /// A label for people; the type's subject when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// `single_taskserv`: the taskserv.
    #[serde(default)]
    pub taskserv: Option<String>,
    /// `server`: the server's name (its node's host name).
    #[serde(default)]
    pub server: Option<String>,
    /// `server`: its taskservs, installed in this order.
    #[serde(default)]
    pub taskservs: Vec<String>,
    /// `cluster`: a topology template's name, or a topology.
    #[serde(default)]
    pub topology: Option<TopologyChoice>,
    /// Start the taskservs once installed (else `run` starts them).
    #[serde(default = "yes")]
    pub auto_start: bool,
    /// Tear the environment down once a `run` has finished.
    #[serde(default)]
    pub auto_cleanup: bool,
    /// Torn down this long after creation, whatever else happens.
    #[serde(default)]
    pub ttl: Option<Ttl>,
    /// Answer once the environment is ready (or failed), up to 10 minutes.
    #[serde(default)]
    pub wait: bool,
    /// Limits for every node, over the defaults and the topology's.
    #[serde(default)]
    pub limits: Option<LimitsOverride>,
}

/// A node's limits, enforced by the kernel (cgroups): what a fork bomb or
/// a memory hog in the node runs into.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeLimits {
    /// Memory, swap included, in MiB: past it the kernel kills a process
    /// of the node.
    #[schema(minimum = 32, maximum = 16384)]
    pub memory_mib: u64,
    /// Processes and threads at once: past it a fork fails (`EAGAIN`).
    #[schema(minimum = 16, maximum = 32768)]
    pub pids: u32,
    /// CPU time, in cores (`0.5`: half of one; at most the host's): past
    /// it the node waits.
    #[schema(minimum = 0.1)]
    pub cpus: f64,
}

impl Default for NodeLimits {
    /// [`DEFAULT_LIMITS`]: what a plan stored without limits gets.
    fn default() -> NodeLimits {
        DEFAULT_LIMITS
    }
}

impl NodeLimits {
    pub fn memory_bytes(&self) -> u64 {
        self.memory_mib * 1024 * 1024
    }

    /// The CPU quota per `period_us`, in microseconds.
    pub fn cpu_quota_us(&self, period_us: u64) -> u64 {
        (self.cpus * period_us as f64).round() as u64
    }

    /// These limits with `changes` applied, each checked against its
    /// bounds; `at` prefixes the fields in errors.
    pub fn with(self, changes: Option<&LimitsOverride>, at: &str) -> Result<NodeLimits> {
        let Some(changes) = changes else {
            return Ok(self);
        };
        let mut limits = self;
        if let Some(memory) = changes.memory_mib {
            limits.memory_mib = memory;
        }
        if let Some(pids) = changes.pids {
            limits.pids = pids;
        }
        if let Some(cpus) = changes.cpus {
            limits.cpus = cpus;
        }
        limits.check(at)?;
        Ok(limits)
    }

    /// Each limit within its bounds; `at` prefixes the fields in errors.
    pub fn check(&self, at: &str) -> Result<()> {
        let field = |name: &str| {
            if at.is_empty() {
                name.to_owned()
            } else {
                format!("{at}.{name}")
            }
        };
        if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&self.memory_mib) {
            return Err(invalid(
                field("memory_mib"),
                format!(
                    "{} MiB is out of bounds: between {MIN_MEMORY_MIB} and {MAX_MEMORY_MIB} MiB",
                    self.memory_mib
                ),
            ));
        }
        if !(MIN_PIDS..=MAX_PIDS).contains(&self.pids) {
            return Err(invalid(
                field("pids"),
                format!(
                    "{} is out of bounds: between {MIN_PIDS} and {MAX_PIDS}",
                    self.pids
                ),
            ));
        }
        let cores = max_cpus();
        if !self.cpus.is_finite() || self.cpus < MIN_CPUS || self.cpus > cores {
            return Err(invalid(
                field("cpus"),
                format!(
                    "{} is out of bounds: between {MIN_CPUS} and {cores} (this host's cores)",
                    self.cpus
                ),
            ));
        }
        Ok(())
    }
}

/// The most CPU a node may have: the host's cores.
pub fn max_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1, |n| n.get()) as f64
}

/// The limits of a node that nobody overrides: the defaults, at most the
/// host's cores.
fn default_limits() -> NodeLimits {
    NodeLimits {
        cpus: DEFAULT_LIMITS.cpus.min(max_cpus()),
        ..DEFAULT_LIMITS
    }
}

fn yes() -> bool {
    true
}

/// An environment as planned and stored with its workflows: everything
/// the steps need, and every name they make.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EnvPlan {
    /// The environment's id (a UUIDv7).
    pub id: String,
    /// Six hex digits of the id: in every name the environment makes.
    pub key: String,
    /// Four hex digits naming the service that made it (from its node
    /// id): a service only ever removes what carries its own tag.
    pub tag: String,
    pub name: String,
    #[serde(rename = "type")]
    pub env_type: EnvType,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<String>,
    /// The first three octets of the environment's /24.
    pub subnet: String,
    pub nodes: Vec<NodePlan>,
    pub checks: Vec<CheckPlan>,
    pub auto_start: bool,
    pub auto_cleanup: bool,
    pub ttl_secs: u64,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

/// One node of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodePlan {
    pub name: String,
    /// 0-based; in the names of its namespace and links.
    pub index: usize,
    pub address: String,
    pub roles: Vec<String>,
    pub taskservs: Vec<String>,
    /// Its network namespace (`ip netns`).
    pub netns: String,
    /// What the kernel lets it use (plans stored before limits existed
    /// get the defaults).
    #[serde(default)]
    pub limits: NodeLimits,
}

/// One check of `run`: from `node`, `taskserv` answers on each of
/// `targets` at `port`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckPlan {
    pub name: String,
    pub node: String,
    pub taskserv: String,
    pub port: u16,
    pub targets: Vec<String>,
}

/// The names an environment's resources carry, from its tag and key only:
/// what teardown and recovery need when nothing else is known.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EnvNames {
    pub tag: String,
    pub key: String,
}

/// The environments of the service tagged `tag` that have anything left:
/// the keys a provider found (in namespace, link, container or network
/// names), with those of the environments' directories under `root`;
/// only well-formed keys (six hex digits) count.
pub fn leftover_envs(
    tag: &str,
    mut keys: std::collections::BTreeSet<String>,
    root: &std::path::Path,
) -> Vec<EnvNames> {
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(key) = name.strip_prefix(&format!("{tag}-")) {
                keys.insert(key.to_owned());
            }
        }
    }
    keys.into_iter()
        .filter(|key| key.len() == 6 && key.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(|key| EnvNames {
            tag: tag.to_owned(),
            key,
        })
        .collect()
}

impl EnvNames {
    /// The bridge: `te<tag><key>b` (13 characters; links allow 15).
    pub fn bridge(&self) -> String {
        format!("{PREFIX}{}{}b", self.tag, self.key)
    }

    /// Every host-side link of the environment starts with this.
    pub fn link_prefix(&self) -> String {
        format!("{PREFIX}{}{}", self.tag, self.key)
    }

    /// The host end of node `index`'s veth pair (14 characters).
    pub fn host_veth(&self, index: usize) -> String {
        format!("{}{index:02}", self.link_prefix())
    }

    /// The node end, until it is moved into the node and renamed `eth0`.
    pub fn peer_veth(&self, index: usize) -> String {
        format!("{}p{index:02}", self.link_prefix())
    }

    /// Every namespace of the environment starts with this.
    pub fn netns_prefix(&self) -> String {
        format!("{PREFIX}-{}-{}-", self.tag, self.key)
    }

    pub fn netns(&self, index: usize) -> String {
        format!("{}{index:02}", self.netns_prefix())
    }

    /// Node `index`'s cgroup (under the provider's parent): named as its
    /// network namespace, so that one prefix finds both.
    pub fn cgroup(&self, index: usize) -> String {
        self.netns(index)
    }

    /// The environment's directory: the nodes' dirs (their layers).
    pub fn dir(&self, root: &Path) -> PathBuf {
        root.join(format!("{}-{}", self.tag, self.key))
    }
}

/// The tag of a service whose node id is `node_id`.
pub fn service_tag(node_id: &str) -> String {
    hex(&Sha256::digest(node_id.as_bytes()))[..4].to_owned()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl EnvPlan {
    pub fn names(&self) -> EnvNames {
        EnvNames {
            tag: self.tag.clone(),
            key: self.key.clone(),
        }
    }

    pub fn node(&self, name: &str) -> Option<&NodePlan> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Whether this plan is one the service tagged `tag` could have made
    /// from a request: every name derived as `new` derives it, every
    /// taskserv known. A step's input is a plan; this is what keeps a
    /// workflow submitted by hand from naming something that is not an
    /// environment's (another namespace, a path outside the scripts).
    pub fn verify(&self, catalog: &Catalog, tag: &str) -> Result<()> {
        if self.tag != tag {
            return Err(invalid(
                "env.tag",
                format!("`{}` is not this service's tag", truncate(&self.tag, 16)),
            ));
        }
        let id = uuid::Uuid::parse_str(&self.id).map_err(|_| invalid("env.id", "is not a UUID"))?;
        let simple = id.simple().to_string();
        if self.key != simple[simple.len() - 6..] {
            return Err(invalid("env.key", "is not derived from the id"));
        }
        let octets: Vec<&str> = self.subnet.split('.').collect();
        let subnet_ok = octets.len() == 3
            && octets[0] == "10"
            && octets[1..].iter().all(|o| o.parse::<u8>().is_ok());
        if !subnet_ok {
            return Err(invalid("env.subnet", "is not a 10.x.y subnet"));
        }
        if self.nodes.is_empty() || self.nodes.len() > MAX_NODES {
            return Err(invalid(
                "env.nodes",
                format!("must hold 1 to {MAX_NODES} nodes"),
            ));
        }
        let names = self.names();
        for (index, node) in self.nodes.iter().enumerate() {
            let at = format!("env.nodes[{index}]");
            check_name(&format!("{at}.name"), &node.name)?;
            if node.index != index
                || node.netns != names.netns(index)
                || node.address != format!("{}.{}", self.subnet, 10 + index)
            {
                return Err(invalid(
                    at,
                    "its index, netns or address is not derived from the plan",
                ));
            }
            if node.taskservs.len() > MAX_TASKSERVS_PER_NODE {
                return Err(invalid(format!("{at}.taskservs"), "too many taskservs"));
            }
            node.limits.check(&format!("{at}.limits"))?;
            for taskserv in &node.taskservs {
                check_taskserv(&format!("{at}.taskservs"), taskserv, catalog)?;
            }
            if self.nodes[..index].iter().any(|n| n.name == node.name) {
                return Err(invalid(format!("{at}.name"), "appears twice"));
            }
        }
        if self.checks.len() > MAX_NODES * MAX_TASKSERVS_PER_NODE + MAX_CHECKS {
            return Err(invalid("env.checks", "too many checks"));
        }
        for (i, check) in self.checks.iter().enumerate() {
            let at = format!("env.checks[{i}]");
            check_taskserv(&format!("{at}.taskserv"), &check.taskserv, catalog)?;
            if catalog.taskserv(&check.taskserv).map(|t| t.port) != Some(check.port) {
                return Err(invalid(format!("{at}.port"), "is not the taskserv's port"));
            }
            for node in std::iter::once(&check.node).chain(&check.targets) {
                if self.node(node).is_none() {
                    return Err(invalid(at, format!("no node `{}`", truncate(node, 64))));
                }
            }
        }
        Ok(())
    }

    /// The request checked against the catalog, as a plan for the
    /// environment `id` of the service tagged `tag`.
    pub fn new(
        request: &CreateRequest,
        catalog: &Catalog,
        id: uuid::Uuid,
        tag: &str,
        now: DateTime<Utc>,
    ) -> Result<EnvPlan> {
        let (topology, topology_name) = shape(request, catalog)?;
        validate_topology(&topology, catalog, "topology")?;
        let name = match &request.name {
            Some(name) => {
                check_name("name", name)?;
                name.clone()
            }
            None => topology.name.clone(),
        };
        let ttl = match &request.ttl {
            None => DEFAULT_TTL,
            Some(ttl) => parse_ttl(ttl)?,
        };
        let simple = id.simple().to_string();
        let key = simple[simple.len() - 6..].to_owned();
        let digest = Sha256::digest(format!("{tag}{key}").as_bytes());
        let subnet = format!("10.{}.{}", subnet_second_octet(digest[0]), digest[1]);
        let names = EnvNames {
            tag: tag.to_owned(),
            key: key.clone(),
        };
        // The defaults, then the topology's, then its node's, then the
        // request's: the nearer to the caller, the later it applies. Each
        // override was checked on its own (`validate_topology`), and
        // values within bounds combine to values within bounds.
        let base = default_limits().with(topology.limits.as_ref(), "topology.limits")?;
        let mut nodes = Vec::with_capacity(topology.nodes.len());
        for (index, node) in topology.nodes.iter().enumerate() {
            let limits = base
                .with(
                    node.limits.as_ref(),
                    &format!("topology.nodes[{index}].limits"),
                )?
                .with(request.limits.as_ref(), "limits")?;
            nodes.push(NodePlan {
                name: node.name.clone(),
                index,
                address: format!("{subnet}.{}", 10 + index),
                roles: node.roles.clone(),
                taskservs: node.taskservs.clone(),
                netns: names.netns(index),
                limits,
            });
        }
        let port = |taskserv: &str| catalog.taskserv(taskserv).map(|t| t.port).unwrap_or(0);
        let mut checks: Vec<CheckPlan> = nodes
            .iter()
            .flat_map(|node| {
                node.taskservs.iter().map(|taskserv| CheckPlan {
                    name: format!("{taskserv}@{}", node.name),
                    node: node.name.clone(),
                    taskserv: taskserv.clone(),
                    port: port(taskserv),
                    targets: vec![node.name.clone()],
                })
            })
            .collect();
        checks.extend(topology.checks.iter().map(|check| CheckPlan {
            name: check.name.clone(),
            node: check.from.clone(),
            taskserv: check.taskserv.clone(),
            port: port(&check.taskserv),
            targets: check.to.clone(),
        }));
        let ttl_delta = chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::hours(1));
        Ok(EnvPlan {
            id: id.to_string(),
            key,
            tag: tag.to_owned(),
            name,
            env_type: request.env_type,
            topology: topology_name,
            subnet,
            nodes,
            checks,
            auto_start: request.auto_start,
            auto_cleanup: request.auto_cleanup,
            ttl_secs: ttl.as_secs(),
            created_at: now,
            expires_at: now + ttl_delta,
        })
    }
}

/// The request's nodes as a topology, with the template's name if one
/// was named; each type takes its own fields and refuses the others'.
fn shape(request: &CreateRequest, catalog: &Catalog) -> Result<(Topology, Option<String>)> {
    let refuse = |field: &str, present: bool| -> Result<()> {
        if present {
            let kind = serde_json::to_value(request.env_type)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            return Err(invalid(
                field,
                format!("is not taken by an environment of type `{kind}`"),
            ));
        }
        Ok(())
    };
    match request.env_type {
        EnvType::SingleTaskserv => {
            refuse("server", request.server.is_some())?;
            refuse("taskservs", !request.taskservs.is_empty())?;
            refuse("topology", request.topology.is_some())?;
            let taskserv = request
                .taskserv
                .as_deref()
                .ok_or_else(|| invalid("taskserv", "is required for type `single_taskserv`"))?;
            check_taskserv("taskserv", taskserv, catalog)?;
            Ok((
                Topology {
                    name: taskserv.to_owned(),
                    description: String::new(),
                    nodes: vec![TopologyNode {
                        name: taskserv.to_owned(),
                        roles: vec![],
                        taskservs: vec![taskserv.to_owned()],
                        limits: None,
                    }],
                    checks: vec![],
                    limits: None,
                },
                None,
            ))
        }
        EnvType::Server => {
            refuse("taskserv", request.taskserv.is_some())?;
            refuse("topology", request.topology.is_some())?;
            let server = request
                .server
                .as_deref()
                .ok_or_else(|| invalid("server", "is required for type `server`"))?;
            check_name("server", server)?;
            if request.taskservs.is_empty() {
                return Err(invalid("taskservs", "a server needs at least one taskserv"));
            }
            for (i, taskserv) in request.taskservs.iter().enumerate() {
                check_taskserv(&format!("taskservs[{i}]"), taskserv, catalog)?;
            }
            Ok((
                Topology {
                    name: server.to_owned(),
                    description: String::new(),
                    nodes: vec![TopologyNode {
                        name: server.to_owned(),
                        roles: vec!["server".to_owned()],
                        taskservs: request.taskservs.clone(),
                        limits: None,
                    }],
                    checks: vec![],
                    limits: None,
                },
                None,
            ))
        }
        EnvType::Cluster => {
            refuse("taskserv", request.taskserv.is_some())?;
            refuse("server", request.server.is_some())?;
            refuse("taskservs", !request.taskservs.is_empty())?;
            match &request.topology {
                None => Err(invalid(
                    "topology",
                    format!(
                        "is required for type `cluster`: a template ({}) or an inline topology",
                        catalog.topology_names().join(", ")
                    ),
                )),
                Some(TopologyChoice::Named(name)) => match catalog.topology(name) {
                    Some(topology) => Ok((topology.clone(), Some(name.clone()))),
                    None => Err(invalid(
                        "topology",
                        format!(
                            "unknown topology `{name}` (known: {})",
                            catalog.topology_names().join(", ")
                        ),
                    )),
                },
                Some(TopologyChoice::Inline(topology)) => Ok((topology.clone(), None)),
            }
        }
    }
}

/// Checks a topology against the catalog: names, bounds, taskservs the
/// catalog knows, checks that name existing nodes. `at` prefixes fields.
pub fn validate_topology(topology: &Topology, catalog: &Catalog, at: &str) -> Result<()> {
    check_name(&format!("{at}.name"), &topology.name)?;
    check_override(topology.limits.as_ref(), &format!("{at}.limits"))?;
    if topology.nodes.is_empty() {
        return Err(invalid(format!("{at}.nodes"), "needs at least one node"));
    }
    if topology.nodes.len() > MAX_NODES {
        return Err(invalid(
            format!("{at}.nodes"),
            format!(
                "{} nodes; an environment has at most {MAX_NODES}",
                topology.nodes.len()
            ),
        ));
    }
    let mut seen = BTreeSet::new();
    for (i, node) in topology.nodes.iter().enumerate() {
        let field = format!("{at}.nodes[{i}]");
        check_name(&format!("{field}.name"), &node.name)?;
        if !seen.insert(node.name.as_str()) {
            return Err(invalid(
                format!("{field}.name"),
                format!("node `{}` appears twice", node.name),
            ));
        }
        for role in &node.roles {
            check_name(&format!("{field}.roles"), role)?;
        }
        check_override(node.limits.as_ref(), &format!("{field}.limits"))?;
        if node.taskservs.is_empty() {
            return Err(invalid(
                format!("{field}.taskservs"),
                "a node needs at least one taskserv",
            ));
        }
        if node.taskservs.len() > MAX_TASKSERVS_PER_NODE {
            return Err(invalid(
                format!("{field}.taskservs"),
                format!("at most {MAX_TASKSERVS_PER_NODE} taskservs per node"),
            ));
        }
        let mut on_node = BTreeSet::new();
        for (j, taskserv) in node.taskservs.iter().enumerate() {
            let tfield = format!("{field}.taskservs[{j}]");
            check_taskserv(&tfield, taskserv, catalog)?;
            if !on_node.insert(taskserv.as_str()) {
                return Err(invalid(
                    tfield,
                    format!(
                        "taskserv `{taskserv}` appears twice on node `{}`",
                        node.name
                    ),
                ));
            }
        }
    }
    if topology.checks.len() > MAX_CHECKS {
        return Err(invalid(
            format!("{at}.checks"),
            format!("at most {MAX_CHECKS} checks"),
        ));
    }
    for (i, check) in topology.checks.iter().enumerate() {
        let field = format!("{at}.checks[{i}]");
        check_name(&format!("{field}.name"), &check.name)?;
        if !seen.contains(check.from.as_str()) {
            return Err(invalid(
                format!("{field}.from"),
                format!("no node `{}` in the topology", check.from),
            ));
        }
        check_taskserv(&format!("{field}.taskserv"), &check.taskserv, catalog)?;
        if check.to.is_empty() {
            return Err(invalid(format!("{field}.to"), "names no node"));
        }
        for target in &check.to {
            let Some(node) = topology.nodes.iter().find(|n| &n.name == target) else {
                return Err(invalid(
                    format!("{field}.to"),
                    format!("no node `{target}` in the topology"),
                ));
            };
            if !node.taskservs.contains(&check.taskserv) {
                return Err(invalid(
                    format!("{field}.to"),
                    format!("node `{target}` does not run `{}`", check.taskserv),
                ));
            }
        }
    }
    Ok(())
}

/// Each limit an override sets, within its bounds.
fn check_override(changes: Option<&LimitsOverride>, at: &str) -> Result<()> {
    default_limits().with(changes, at).map(|_| ())
}

fn check_taskserv(field: &str, taskserv: &str, catalog: &Catalog) -> Result<()> {
    check_name(field, taskserv)?;
    if catalog.taskserv(taskserv).is_none() {
        return Err(invalid(
            field,
            format!(
                "unknown taskserv `{taskserv}` (known: {})",
                catalog.taskserv_names().join(", ")
            ),
        ));
    }
    Ok(())
}

/// `ttl`, within [`MIN_TTL`] and [`MAX_TTL`].
pub fn parse_ttl(ttl: &Ttl) -> Result<Duration> {
    let duration = match ttl {
        Ttl::Seconds(secs) => Duration::from_secs(*secs),
        Ttl::Text(text) => {
            let text = text.trim();
            let (digits, unit) = text.split_at(
                text.find(|c: char| !c.is_ascii_digit())
                    .unwrap_or(text.len()),
            );
            let n: u64 = digits.parse().map_err(|_| {
                invalid(
                    "ttl",
                    format!("{text:?} is not a duration (seconds, or like `90s`, `15m`, `2h`)"),
                )
            })?;
            let unit_secs = match unit {
                "" | "s" => 1,
                "m" => 60,
                "h" => 3600,
                _ => {
                    return Err(invalid(
                        "ttl",
                        format!("{text:?}: unknown unit `{unit}` (use s, m or h)"),
                    ));
                }
            };
            Duration::from_secs(n.saturating_mul(unit_secs))
        }
    };
    if duration < MIN_TTL || duration > MAX_TTL {
        return Err(invalid(
            "ttl",
            format!(
                "{} s is out of bounds: between {} s and {} s",
                duration.as_secs(),
                MIN_TTL.as_secs(),
                MAX_TTL.as_secs()
            ),
        ));
    }
    Ok(duration)
}

/// Environments take a /24 in 10.64.0.0/10, second octet from a digest of
/// their id, except 10.88: Podman's default network is 10.88.0.0/16, and
/// its engine refuses a network that overlaps a configured one (the
/// docker provider's create failed for 1 environment in 63), as a host
/// with Podman routes 10.88 to its bridge.
fn subnet_second_octet(byte: u8) -> u8 {
    const PODMAN_DEFAULT: u8 = 88;
    let second = 64 + byte % 63;
    if second >= PODMAN_DEFAULT {
        second + 1
    } else {
        second
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn subnets_avoid_podmans_default_network() {
        let seconds: std::collections::BTreeSet<u8> =
            (0..=255).map(super::subnet_second_octet).collect();
        assert!(!seconds.contains(&88));
        assert_eq!(seconds.len(), 63);
        assert!(seconds.iter().all(|s| (64..=127).contains(s)));
    }
    use super::*;

    fn repo_scripts() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
    }

    #[test]
    fn every_shipped_topology_is_valid_against_the_shipped_taskservs() {
        let catalog = Catalog::load(&repo_scripts(), None).unwrap();
        assert_eq!(
            catalog.topology_names(),
            [
                "containerd_test",
                "etcd_cluster",
                "kubernetes_3node",
                "kubernetes_single",
                "postgres_redis"
            ]
        );
        for topology in catalog.topologies() {
            validate_topology(topology, &catalog, &topology.name).unwrap();
        }
    }

    #[test]
    fn names_fit_the_kernel_limits() {
        let names = EnvNames {
            tag: "abcd".into(),
            key: "123456".into(),
        };
        assert_eq!(names.bridge(), "teabcd123456b");
        assert!(names.bridge().len() <= 15);
        assert!(names.host_veth(7).len() <= 15);
        assert!(names.peer_veth(7).len() <= 15);
        assert!(names.host_veth(7).starts_with(&names.link_prefix()));
        assert_eq!(names.netns(3), "te-abcd-123456-03");
    }

    #[test]
    fn names_are_checked() {
        for good in ["pg1", "control-plane", "a", "etcd_1"] {
            assert!(check_name("f", good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-x",
            "x-",
            "Upper",
            "a b",
            "a/b",
            "../x",
            &"x".repeat(33),
        ] {
            let err = check_name("nodes[0].name", bad).unwrap_err().to_string();
            assert!(err.starts_with("nodes[0].name: "), "{err}");
        }
    }

    #[test]
    fn ttls_parse_within_bounds() {
        assert_eq!(parse_ttl(&Ttl::Seconds(60)).unwrap().as_secs(), 60);
        assert_eq!(parse_ttl(&Ttl::Text("15m".into())).unwrap().as_secs(), 900);
        assert_eq!(parse_ttl(&Ttl::Text("2h".into())).unwrap().as_secs(), 7200);
        for bad in [
            Ttl::Seconds(1),
            Ttl::Seconds(100_000),
            Ttl::Text("5d".into()),
            Ttl::Text("m".into()),
        ] {
            let err = parse_ttl(&bad).unwrap_err().to_string();
            assert!(err.starts_with("ttl: "), "{err}");
        }
    }
}

#[cfg(test)]
mod plan_tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts"),
            None,
        )
        .unwrap()
    }

    fn plan() -> EnvPlan {
        let request: CreateRequest = serde_json::from_value(
            serde_json::json!({"type": "cluster", "topology": "postgres_redis"}),
        )
        .unwrap();
        EnvPlan::new(
            &request,
            &catalog(),
            uuid::Uuid::now_v7(),
            "abcd",
            Utc::now(),
        )
        .unwrap()
    }

    #[test]
    fn a_plan_made_here_verifies() {
        plan().verify(&catalog(), "abcd").unwrap();
    }

    #[test]
    fn a_plan_that_names_anything_else_is_refused() {
        let catalog = catalog();
        type Change = Box<dyn Fn(&mut EnvPlan)>;
        let cases: Vec<(&str, Change)> = vec![
            ("env.tag", Box::new(|p| p.tag = "ffff".into())),
            ("env.key", Box::new(|p| p.key = "000000".into())),
            ("env.subnet", Box::new(|p| p.subnet = "192.168.1".into())),
            (
                "env.nodes[0]",
                Box::new(|p| p.nodes[0].netns = "other-namespace".into()),
            ),
            (
                "env.nodes[1].name",
                Box::new(|p| p.nodes[1].name = "../../etc".into()),
            ),
            (
                "env.nodes[0].taskservs",
                Box::new(|p| p.nodes[0].taskservs.push("../x".into())),
            ),
            (
                "env.checks[0].taskserv",
                Box::new(|p| p.checks[0].taskserv = "nope".into()),
            ),
            (
                "env.checks[0]",
                Box::new(|p| p.checks[0].targets.push("elsewhere".into())),
            ),
        ];
        for (field, change) in cases {
            let mut plan = plan();
            change(&mut plan);
            let err = plan.verify(&catalog, "abcd").unwrap_err().to_string();
            assert!(err.starts_with(field), "{field}: {err}");
        }
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    fn plan_for(request: serde_json::Value) -> Result<EnvPlan> {
        let catalog = Catalog::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts"),
            None,
        )
        .unwrap();
        let request: CreateRequest = serde_json::from_value(request).unwrap();
        EnvPlan::new(&request, &catalog, uuid::Uuid::now_v7(), "abcd", Utc::now())
    }

    #[test]
    fn a_node_nobody_limits_gets_the_defaults() {
        let plan =
            plan_for(serde_json::json!({"type": "single_taskserv", "taskserv": "redis"})).unwrap();
        assert_eq!(plan.nodes[0].limits, default_limits());
        assert_eq!(default_limits().memory_mib, 512);
    }

    #[test]
    fn topology_then_node_then_request_each_override_what_they_set() {
        let topology = serde_json::json!({
            "name": "t",
            "limits": {"memory_mib": 256, "pids": 64},
            "nodes": [
                {"name": "a", "taskservs": ["redis"], "limits": {"pids": 32, "cpus": 0.5}},
                {"name": "b", "taskservs": ["redis"]}
            ]
        });
        let plan =
            plan_for(serde_json::json!({"type": "cluster", "topology": topology.clone()})).unwrap();
        let cpus = default_limits().cpus;
        assert_eq!(
            plan.nodes[0].limits,
            NodeLimits {
                memory_mib: 256,
                pids: 32,
                cpus: 0.5
            }
        );
        assert_eq!(
            plan.nodes[1].limits,
            NodeLimits {
                memory_mib: 256,
                pids: 64,
                cpus
            }
        );
        let plan = plan_for(serde_json::json!({
            "type": "cluster", "topology": topology, "limits": {"pids": 100}
        }))
        .unwrap();
        assert!(plan.nodes.iter().all(|n| n.limits.pids == 100));
        assert_eq!(plan.nodes[0].limits.cpus, 0.5);
    }

    #[test]
    fn limits_out_of_bounds_name_the_field_and_the_bound() {
        for (limits, expected) in [
            (
                serde_json::json!({"memory_mib": 31}),
                "limits.memory_mib: 31 MiB is out of bounds: between 32 and 16384 MiB",
            ),
            (
                serde_json::json!({"pids": 15}),
                "limits.pids: 15 is out of bounds: between 16 and 32768",
            ),
            (
                serde_json::json!({"cpus": 0.05}),
                "limits.cpus: 0.05 is out of bounds: between 0.1 and",
            ),
        ] {
            let err = plan_for(serde_json::json!({
                "type": "single_taskserv", "taskserv": "redis", "limits": limits
            }))
            .unwrap_err()
            .to_string();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn a_stored_plan_without_limits_reads_with_the_defaults_and_bad_ones_are_refused() {
        let plan =
            plan_for(serde_json::json!({"type": "single_taskserv", "taskserv": "redis"})).unwrap();
        let mut stored = serde_json::to_value(&plan).unwrap();
        stored["nodes"][0].as_object_mut().unwrap().remove("limits");
        let read: EnvPlan = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(read.nodes[0].limits, DEFAULT_LIMITS);
        stored["nodes"][0]["limits"] =
            serde_json::json!({"memory_mib": 1, "pids": 16, "cpus": 1.0});
        let read: EnvPlan = serde_json::from_value(stored).unwrap();
        let catalog = Catalog::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts"),
            None,
        )
        .unwrap();
        let err = read.verify(&catalog, "abcd").unwrap_err().to_string();
        assert!(err.starts_with("env.nodes[0].limits.memory_mib: "), "{err}");
    }
}
