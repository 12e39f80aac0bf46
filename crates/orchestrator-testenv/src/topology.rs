//! The shape of a cluster: its nodes, their taskservs and the checks across
//! them, as a topology template or an inline topology says; and the rule
//! for the names that become host names and paths.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::{Result, invalid};

/// A topology template of a cluster, or the one sent inline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub nodes: Vec<TopologyNode>,
    /// Checks across nodes, run by `run` after each taskserv's own check.
    #[serde(default)]
    pub checks: Vec<CrossCheck>,
    /// Limits for every node of the topology, over the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsOverride>,
}

/// One node of a topology.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TopologyNode {
    /// Its host name, and how the other nodes reach it.
    pub name: String,
    /// What the node is for (`control-plane`, `worker`, ...): labels only.
    #[serde(default)]
    pub roles: Vec<String>,
    pub taskservs: Vec<String>,
    /// Limits for this node, over the topology's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsOverride>,
}

/// Some of a node's limits (`NodeLimits`); what it leaves out comes from
/// the level below (defaults, topology, node, request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsOverride {
    /// Memory, swap included, in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 32, maximum = 16384)]
    pub memory_mib: Option<u64>,
    /// Processes and threads at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 16, maximum = 32768)]
    pub pids: Option<u32>,
    /// CPU time, in cores: at most the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.1)]
    pub cpus: Option<f64>,
}

/// A check across nodes: from node `from`, the `taskserv` answers on each
/// node of `to` at its port (through the bridge, by name).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CrossCheck {
    pub name: String,
    pub from: String,
    pub taskserv: String,
    pub to: Vec<String>,
}

/// A name that becomes a host name and a path component: a DNS label in
/// lower case, 1-32 characters.
pub fn check_name(field: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && !name.starts_with(['-', '_'])
        && !name.ends_with(['-', '_']);
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "{:?} is not a valid name: 1-32 lower-case letters, digits, `-` or `_`, \
                 starting and ending with a letter or digit",
                truncate(name, 64)
            ),
        ))
    }
}

pub(crate) fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}
