//! The Linux namespace provider. Per environment: a bridge with no address
//! on the host (so nothing routes between environments or to the host);
//! per node: a network namespace with a veth pair on that bridge and its
//! own address, and a first process, `sleep infinity`, started with
//! `unshare` in new UTS, mount and PID namespaces (host name = node name,
//! a private `/etc/hosts` bind-mounted, `/proc` of its own). Programs
//! enter a node with `nsenter` on that process. Everything is done by
//! running `ip`, `unshare`, `nsenter`, `hostname` and `mount` directly,
//! never through a shell.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::Command;

use crate::model::{EnvNames, EnvPlan, NodePlan, PREFIX};
use crate::provider::{NodeChild, NodeExit, NodeProcess, Provider};
use crate::{Error, Result};

/// The environment variable every process of a node carries, naming the
/// node's namespace: how a person (or a test) finds them in `/proc`.
pub const MARK_VAR: &str = "ORCHESTRATOR_TESTENV";

/// How long a node's first process may take to appear.
const INIT_WAIT: Duration = Duration::from_secs(15);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(25);

/// `setpriv`'s arguments that start a program with no capability at all:
/// none inheritable, none ambient, and none in the bounding set (so that
/// even uid 0 gains none at `exec`).
const NO_CAPABILITIES: [&str; 4] = [
    "--inh-caps=-all",
    "--ambient-caps=-all",
    "--bounding-set=-all",
    "--",
];

#[derive(Debug, Clone, Default)]
pub struct NamespaceProvider;

impl NamespaceProvider {
    pub fn new() -> NamespaceProvider {
        NamespaceProvider
    }
}

/// Runs a program to its end; its stdout, or an error naming the command
/// and what it printed on stderr.
async fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| Error::Provider(format!("cannot run `{program}`: {e}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Provider(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

async fn ip(args: &[&str]) -> Result<String> {
    run("ip", args).await
}

/// The network namespaces on this host (`ip netns list`).
async fn netns_names() -> Result<Vec<String>> {
    Ok(ip(&["netns", "list"])
        .await?
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect())
}

/// The links of the host's namespace (`ip -o link show`), without the
/// `@peer` suffix.
async fn link_names() -> Result<Vec<String>> {
    Ok(ip(&["-o", "link", "show"])
        .await?
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect())
}

/// The pids (as the host sees them) of the processes in a network namespace.
async fn netns_pids(netns: &str) -> Result<Vec<i32>> {
    Ok(ip(&["netns", "pids", netns])
        .await?
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect())
}

/// Whether a process is the first of its own PID namespace (`NSpid:
/// <host pid> 1`): a node's `sleep infinity`.
fn is_namespace_init(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .map(|ids| {
                    ids.split_whitespace().collect::<Vec<_>>() == [pid.to_string().as_str(), "1"]
                })
        })
        .unwrap_or(false)
}

fn cmdline(pid: i32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            String::from_utf8_lossy(&raw)
                .trim_end_matches('\0')
                .replace('\0', " ")
        })
        .unwrap_or_default()
}

/// The first process of the node in `netns`.
async fn init_pid(netns: &str) -> Result<Option<i32>> {
    Ok(netns_pids(netns)
        .await?
        .into_iter()
        .find(|pid| is_namespace_init(*pid)))
}

fn hosts_file(plan: &EnvPlan) -> String {
    let mut text = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost\n");
    for node in &plan.nodes {
        text.push_str(&format!("{}\t{}\n", node.address, node.name));
    }
    text
}

/// The environment a node's programs get: the service's PATH and little
/// else (never the service's own settings).
fn node_env(command: &mut Command, netns: &str, node_dir: &Path) {
    command.env_clear();
    for var in ["PATH", "LANG", "LC_ALL", "TZ"] {
        if let Some(value) = std::env::var_os(var) {
            command.env(var, value);
        }
    }
    command
        .env("HOME", node_dir)
        .env("ORCHESTRATOR_DATA_DIR", node_dir)
        .env(MARK_VAR, netns);
}

/// `nsenter` started in its own process group, with what it forked.
struct NamespaceChild {
    child: tokio::process::Child,
    group: Option<Pid>,
}

#[async_trait]
impl NodeChild for NamespaceChild {
    async fn wait(&mut self) -> Result<NodeExit> {
        let status =
            self.child.wait().await.map_err(|e| {
                Error::Provider(format!("cannot wait for a program in a node: {e}"))
            })?;
        Ok(NodeExit {
            code: status.code(),
            description: status.to_string(),
        })
    }

    async fn kill(&mut self) -> Result<()> {
        // The whole group: nsenter and the program it forked.
        if let Some(group) = self.group {
            let _ = killpg(group, Signal::SIGKILL);
        }
        Ok(())
    }
}

/// Starts a command made by `NamespaceProvider::command`.
fn start(mut command: Command, program: &Path, node: &NodePlan) -> Result<NodeProcess> {
    let mut child = command.spawn().map_err(|e| {
        Error::Provider(format!(
            "cannot start {} in node {}: {e}",
            program.display(),
            node.name
        ))
    })?;
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    Ok(NodeProcess {
        stdin: child.stdin.take().map(|p| Box::pin(p) as _),
        stdout: child.stdout.take().map(|p| Box::pin(p) as _),
        stderr: child.stderr.take().map(|p| Box::pin(p) as _),
        child: Box::new(NamespaceChild { child, group }),
    })
}

impl NamespaceProvider {
    /// `program` with `args` inside `node`: its namespaces, its private
    /// root as the working directory and as `ORCHESTRATOR_DATA_DIR`, in
    /// its own process group, with no capability.
    async fn command(
        &self,
        plan: &EnvPlan,
        node: &NodePlan,
        root: &Path,
        program: &Path,
        args: &[String],
    ) -> Result<Command> {
        let pid = init_pid(&node.netns).await?.ok_or_else(|| {
            Error::Provider(format!(
                "node {} is not running (its namespace {} has no first process)",
                node.name, node.netns
            ))
        })?;
        let node_dir = plan.names().dir(root).join(&node.name);
        let mut command = Command::new("nsenter");
        command
            .arg("-t")
            .arg(pid.to_string())
            .args(["-n", "-u", "-m", "-p"])
            .arg(format!("--wd={}", node_dir.display()))
            .arg("--")
            // `nsenter` needs the service's capabilities to enter; what
            // runs in the node gets none of them, root or not.
            .arg("setpriv")
            .args(NO_CAPABILITIES)
            .arg(program)
            .args(args)
            .current_dir(&node_dir)
            .process_group(0);
        node_env(&mut command, &node.netns, &node_dir);
        Ok(command)
    }

    /// One node: namespace, veth on the bridge, address, first process,
    /// host name, /etc/hosts.
    async fn create_node(&self, plan: &EnvPlan, node: &NodePlan, root: &Path) -> Result<()> {
        let names = plan.names();
        let (ns, host, peer) = (
            node.netns.as_str(),
            names.host_veth(node.index),
            names.peer_veth(node.index),
        );
        let bridge = names.bridge();
        let address = format!("{}/24", node.address);
        ip(&["netns", "add", ns]).await?;
        ip(&["link", "add", &host, "type", "veth", "peer", "name", &peer]).await?;
        ip(&["link", "set", &peer, "netns", ns]).await?;
        ip(&["-n", ns, "link", "set", &peer, "name", "eth0"]).await?;
        ip(&["-n", ns, "addr", "add", &address, "dev", "eth0"]).await?;
        ip(&["-n", ns, "link", "set", "eth0", "up"]).await?;
        ip(&["-n", ns, "link", "set", "lo", "up"]).await?;
        ip(&["link", "set", &host, "master", &bridge]).await?;
        ip(&["link", "set", &host, "up"]).await?;

        let node_dir = names.dir(root).join(&node.name);
        let mut init = Command::new("ip");
        init.args([
            "netns", "exec", ns, "unshare", "--uts", "--mount", "--pid", "--fork",
        ])
        .args([
            "--mount-proc",
            "--propagation",
            "private",
            "sleep",
            "infinity",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .current_dir(&node_dir)
        // Its own group: a signal to the service's group (Ctrl-C in a
        // terminal) does not reach the node.
        .process_group(0);
        node_env(&mut init, ns, &node_dir);
        let mut child = init
            .spawn()
            .map_err(|e| Error::Provider(format!("cannot start node {}: {e}", node.name)))?;
        // The node lives until teardown; reap it then.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let started = tokio::time::Instant::now();
        let pid = loop {
            if let Some(pid) = init_pid(ns).await? {
                break pid;
            }
            if started.elapsed() > INIT_WAIT {
                return Err(Error::Provider(format!(
                    "node {}: its first process did not appear in {} s",
                    node.name,
                    INIT_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(POLL).await;
        };
        let pid = pid.to_string();
        run("nsenter", &["-t", &pid, "-u", "hostname", &node.name]).await?;
        let hosts = node_dir.join("hosts");
        let hosts = hosts.to_string_lossy();
        run(
            "nsenter",
            &["-t", &pid, "-m", "mount", "--bind", &hosts, "/etc/hosts"],
        )
        .await?;
        Ok(())
    }
}

#[async_trait]
impl Provider for NamespaceProvider {
    fn name(&self) -> &'static str {
        "linux-namespaces"
    }

    fn missing_privileges(&self) -> Vec<String> {
        crate::caps::missing()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    async fn create(&self, plan: &EnvPlan, root: &Path) -> Result<()> {
        let names = plan.names();
        self.destroy(&names, root).await?;
        let dir = names.dir(root);
        let hosts = hosts_file(plan);
        for node in &plan.nodes {
            let node_dir = dir.join(&node.name);
            std::fs::create_dir_all(node_dir.join("run"))
                .and_then(|()| std::fs::write(node_dir.join("hosts"), &hosts))
                .map_err(|e| Error::Provider(format!("{}: {e}", node_dir.display())))?;
        }
        let bridge = names.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"]).await?;
        ip(&["link", "set", &bridge, "up"]).await?;
        for node in &plan.nodes {
            self.create_node(plan, node, root).await?;
        }
        Ok(())
    }

    async fn spawn(
        &self,
        plan: &EnvPlan,
        node: &NodePlan,
        root: &Path,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<NodeProcess> {
        let mut command = self.command(plan, node, root, program, args).await?;
        command
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        start(command, program, node)
    }

    async fn spawn_logged(
        &self,
        plan: &EnvPlan,
        node: &NodePlan,
        root: &Path,
        program: &Path,
        args: &[String],
        log: &Path,
    ) -> Result<NodeProcess> {
        // The file itself, not a pipe: the service keeps writing to it
        // after this one is gone.
        let file = std::fs::File::create(log)
            .and_then(|f| Ok((f.try_clone()?, f)))
            .map_err(|e| Error::Provider(format!("{}: {e}", log.display())))?;
        let mut command = self.command(plan, node, root, program, args).await?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(file.0))
            .stderr(Stdio::from(file.1));
        start(command, program, node)
    }

    async fn kill_matching(&self, _plan: &EnvPlan, node: &NodePlan, needle: &str) -> Result<usize> {
        let mut killed = 0;
        for pid in netns_pids(&node.netns).await? {
            if cmdline(pid).contains(needle) && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        Ok(killed)
    }

    async fn destroy(&self, names: &EnvNames, root: &Path) -> Result<usize> {
        let mut removed = 0;
        let prefix = names.netns_prefix();
        for ns in netns_names().await? {
            if !ns.starts_with(&prefix) {
                continue;
            }
            // Every process of the node is in its network namespace (the
            // `nsenter` parents too): SIGKILL to each, by pid, until none
            // is left. The first process going takes its PID namespace
            // with it.
            let started = tokio::time::Instant::now();
            loop {
                let pids = netns_pids(&ns).await?;
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                if started.elapsed() > INIT_WAIT {
                    return Err(Error::Provider(format!(
                        "processes of {ns} are still there after SIGKILL"
                    )));
                }
                tokio::time::sleep(POLL).await;
            }
            ip(&["netns", "del", &ns]).await?;
            removed += 1;
        }
        // The host ends of veth pairs go with their peers' namespaces;
        // what is left is the bridge, and pairs whose peer never moved.
        let links = names.link_prefix();
        for link in link_names().await? {
            if link.starts_with(&links) {
                match ip(&["link", "del", &link]).await {
                    Ok(_) => removed += 1,
                    // Gone meanwhile, with its peer.
                    Err(_) if !link_names().await?.contains(&link) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let dir = names.dir(root);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::Provider(format!("cannot remove {}: {e}", dir.display())))?;
            removed += 1;
        }
        Ok(removed)
    }

    async fn existing(&self, tag: &str, root: &Path) -> Result<Vec<EnvNames>> {
        let mut keys = BTreeSet::new();
        let netns_prefix = format!("{PREFIX}-{tag}-");
        for ns in netns_names().await? {
            if let Some(rest) = ns.strip_prefix(&netns_prefix)
                && let Some(key) = rest.get(..6)
            {
                keys.insert(key.to_owned());
            }
        }
        let link_prefix = format!("{PREFIX}{tag}");
        for link in link_names().await? {
            if let Some(rest) = link.strip_prefix(&link_prefix)
                && let Some(key) = rest.get(..6)
                && link.len() >= link_prefix.len() + 7
            {
                keys.insert(key.to_owned());
            }
        }
        if let Ok(entries) = std::fs::read_dir(root) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(key) = name.strip_prefix(&format!("{tag}-")) {
                    keys.insert(key.to_owned());
                }
            }
        }
        Ok(keys
            .into_iter()
            .filter(|key| key.len() == 6 && key.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(|key| EnvNames {
                tag: tag.to_owned(),
                key,
            })
            .collect())
    }
}
