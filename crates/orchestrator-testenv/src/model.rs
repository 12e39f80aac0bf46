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
pub use crate::topology::{CrossCheck, Topology, TopologyNode, check_name};
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
/// Every name this service gives a namespace, a link or a directory starts
/// with it; nothing else is ever removed.
pub const PREFIX: &str = "te";

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
        let subnet = format!("10.{}.{}", 64 + digest[0] % 64, digest[1]);
        let names = EnvNames {
            tag: tag.to_owned(),
            key: key.clone(),
        };
        let nodes: Vec<NodePlan> = topology
            .nodes
            .iter()
            .enumerate()
            .map(|(index, node)| NodePlan {
                name: node.name.clone(),
                index,
                address: format!("{subnet}.{}", 10 + index),
                roles: node.roles.clone(),
                taskservs: node.taskservs.clone(),
                netns: names.netns(index),
            })
            .collect();
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
                    }],
                    checks: vec![],
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
                    }],
                    checks: vec![],
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

#[cfg(test)]
mod tests {
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
