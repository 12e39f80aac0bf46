//! What environments are made of: the topology templates (compiled in from
//! `templates/topologies/`, then the files of `<templates dir>/topologies/`,
//! which replace them by name) and the taskservs a node can run (every
//! `scripts/taskservs/<name>/` with a `testenv.json`, a start script and a
//! `check.nu`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::topology::{Topology, check_name};
use crate::{Result, invalid};

/// The shipped topologies, by file.
const BUILT_IN: &[(&str, &str)] = &[
    (
        "kubernetes_3node.yaml",
        include_str!("../../../templates/topologies/kubernetes_3node.yaml"),
    ),
    (
        "kubernetes_single.yaml",
        include_str!("../../../templates/topologies/kubernetes_single.yaml"),
    ),
    (
        "etcd_cluster.yaml",
        include_str!("../../../templates/topologies/etcd_cluster.yaml"),
    ),
    (
        "containerd_test.yaml",
        include_str!("../../../templates/topologies/containerd_test.yaml"),
    ),
    (
        "postgres_redis.yaml",
        include_str!("../../../templates/topologies/postgres_redis.yaml"),
    ),
];

/// The start scripts a taskserv may have, in the order they are looked
/// for (`scripts/taskservs/<name>/<file>`).
pub const START_SCRIPTS: &[&str] = &["start.py", "start.nu", "start.sh"];

/// A taskserv as test environments know it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskservInfo {
    pub name: String,
    /// The port its service listens on in its node (and checks ask).
    pub port: u16,
    #[serde(default)]
    pub description: String,
    /// It cannot run here for real: a stand-in answers on its port, and
    /// its checks test only that it answers.
    #[serde(default)]
    pub simulated: bool,
}

/// `scripts/taskservs/<name>/testenv.json`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskservFile {
    port: u16,
    #[serde(default)]
    description: String,
    #[serde(default)]
    simulated: bool,
}

/// Topologies and taskservs, read once at start.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    topologies: BTreeMap<String, Topology>,
    taskservs: BTreeMap<String, TaskservInfo>,
    /// Each taskserv's start script, relative to the scripts dir.
    start_scripts: BTreeMap<String, String>,
}

impl Catalog {
    /// The built-in topologies, those of `templates_dir/topologies`, and
    /// the taskservs of `scripts_dir/taskservs`. A bad file is an error
    /// naming it; a missing directory is empty.
    pub fn load(scripts_dir: &Path, templates_dir: Option<&Path>) -> Result<Catalog> {
        let mut topologies = BTreeMap::new();
        for (file, text) in BUILT_IN {
            let topology = parse_topology(file, text)?;
            topologies.insert(topology.name.clone(), topology);
        }
        if let Some(dir) = templates_dir {
            for path in files_in(&dir.join("topologies"), "yaml")? {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| invalid(path.display().to_string(), e.to_string()))?;
                let topology = parse_topology(&path.display().to_string(), &text)?;
                topologies.insert(topology.name.clone(), topology);
            }
        }
        let mut taskservs = BTreeMap::new();
        let mut start_scripts = BTreeMap::new();
        let dir = scripts_dir.join("taskservs");
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries.flatten().map(|e| e.path()).collect::<Vec<_>>(),
            Err(_) => Vec::new(),
        };
        for path in entries {
            let meta = path.join("testenv.json");
            if !path.is_dir() || !meta.is_file() {
                continue;
            }
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let at = meta.display().to_string();
            check_name(&at, &name)?;
            if !path.join("check.nu").is_file() {
                return Err(invalid(&at, "the taskserv has no check.nu beside it"));
            }
            let Some(start) = START_SCRIPTS.iter().find(|file| path.join(file).is_file()) else {
                return Err(invalid(
                    &at,
                    format!(
                        "the taskserv has no start script beside it ({})",
                        START_SCRIPTS.join(", ")
                    ),
                ));
            };
            start_scripts.insert(name.clone(), format!("taskservs/{name}/{start}"));
            let text = std::fs::read_to_string(&meta).map_err(|e| invalid(&at, e.to_string()))?;
            let file: TaskservFile =
                serde_json::from_str(&text).map_err(|e| invalid(&at, e.to_string()))?;
            taskservs.insert(
                name.clone(),
                TaskservInfo {
                    name,
                    port: file.port,
                    description: file.description,
                    simulated: file.simulated,
                },
            );
        }
        Ok(Catalog {
            topologies,
            taskservs,
            start_scripts,
        })
    }

    pub fn topology(&self, name: &str) -> Option<&Topology> {
        self.topologies.get(name)
    }

    pub fn topologies(&self) -> impl Iterator<Item = &Topology> {
        self.topologies.values()
    }

    pub fn topology_names(&self) -> Vec<String> {
        self.topologies.keys().cloned().collect()
    }

    pub fn taskserv(&self, name: &str) -> Option<&TaskservInfo> {
        self.taskservs.get(name)
    }

    /// The script that starts `taskserv` in a node, relative to the
    /// scripts dir (`taskservs/<name>/start.py`).
    pub fn start_script(&self, taskserv: &str) -> Option<&str> {
        self.start_scripts.get(taskserv).map(String::as_str)
    }

    pub fn taskserv_names(&self) -> Vec<String> {
        self.taskservs.keys().cloned().collect()
    }
}

fn parse_topology(file: &str, text: &str) -> Result<Topology> {
    serde_norway::from_str(text).map_err(|e| invalid(file, e.to_string()))
}

fn files_in(dir: &Path, extension: &str) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(invalid(dir.display().to_string(), e.to_string())),
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_scripts() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
    }

    #[test]
    fn the_shipped_taskservs_say_which_are_simulated() {
        let catalog = Catalog::load(&repo_scripts(), None).unwrap();
        let (simulated, real): (Vec<String>, Vec<String>) = catalog
            .taskserv_names()
            .into_iter()
            .partition(|name| catalog.taskserv(name).unwrap().simulated);
        assert_eq!(simulated, ["containerd", "kubernetes"]);
        assert_eq!(real, ["etcd", "postgres", "redis"]);
        for name in catalog.taskserv_names() {
            let info = catalog.taskserv(&name).unwrap();
            // A description never calls a stand-in real, nor a real one
            // simulated.
            assert_eq!(
                info.description.contains("simulated"),
                info.simulated,
                "{info:?}"
            );
            assert_eq!(
                catalog.start_script(&name),
                Some(format!("taskservs/{name}/start.py").as_str())
            );
        }
    }

    #[test]
    fn a_taskserv_needs_a_start_script() {
        let dir = tempfile::tempdir().unwrap();
        let taskserv = dir.path().join("taskservs/foo");
        std::fs::create_dir_all(&taskserv).unwrap();
        std::fs::write(taskserv.join("testenv.json"), r#"{"port": 7000}"#).unwrap();
        std::fs::write(taskserv.join("check.nu"), "").unwrap();
        let err = Catalog::load(dir.path(), None).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "the taskserv has no start script beside it (start.py, start.nu, start.sh)"
            ),
            "{err}"
        );
        std::fs::write(taskserv.join("start.sh"), "").unwrap();
        let catalog = Catalog::load(dir.path(), None).unwrap();
        assert_eq!(catalog.start_script("foo"), Some("taskservs/foo/start.sh"));
        assert!(!catalog.taskserv("foo").unwrap().simulated);
    }
}
