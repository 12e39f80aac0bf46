//! The Linux namespace provider. Per environment: a bridge with no address
//! on the host (so nothing routes between environments or to the host);
//! per node: a network namespace with a veth pair on that bridge and its
//! own address, and a first process, the node's init
//! (`orchestrator testenv-node-init`, in `node_init`), started with
//! `unshare` in new UTS, mount, PID and IPC namespaces (System V IPC of
//! its own: what a killed daemon leaves there goes with the node): it
//! builds the node's own
//! root filesystem (the host's `/` copy-on-write, its own `/proc`, `/tmp`,
//! `/run`, `/dev`, `/etc/hosts`; the service's paths and the host's secrets
//! masked) and enters it with `pivot_root`. Programs enter a node with
//! `nsenter` on that process, into its root, as root with a bounded set of
//! capabilities ([`NODE_CAPABILITIES`]). Everything is done by running
//! `ip`, `unshare`, `nsenter` and `setpriv` directly, never through a
//! shell. Each node has a cgroup with its limits (see `cgroup`): its
//! init is moved in as soon as it exists, and every program that enters
//! the node joins it before `nsenter` starts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::Command;

use crate::cgroup::{Hierarchy, LimitEvents};
use crate::model::{EnvNames, EnvPlan, NodePlan, PREFIX};
use crate::node_init::{NODE_HOME, NodeSpec, READY};
use crate::provider::{NodeChild, NodeExit, NodeProcess, Provider};
use crate::{Error, Result};

/// The environment variable every process of a node carries, naming the
/// node's namespace: how a person (or a test) finds them in `/proc`.
pub const MARK_VAR: &str = "ORCHESTRATOR_TESTENV";

/// How long a node's init may take to build the node.
const INIT_WAIT: Duration = Duration::from_secs(15);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(25);

/// The capabilities a node's programs hold (as root; a program that
/// switches to another user, as postgres's start does, drops them): the
/// default set of Docker's containers less `mknod` (Docker bounds device
/// nodes with a device cgroup; a node has none). Never `sys_admin` (mount, and most
/// of what escapes a namespace), `net_admin`, `sys_ptrace`, `sys_module`,
/// `sys_rawio`, `dac_read_search` (open by handle, outside the root) or
/// `mknod` (a device node of a host disk).
pub const NODE_CAPABILITIES: [&str; 13] = [
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "net_raw",
    "sys_chroot",
    "audit_write",
    "setfcap",
];

/// Joins the cgroups whose `cgroup.procs` files come before `--`, then
/// becomes the program after it. `nsenter` forks what it runs as soon as
/// it has started, so moving its pid after the spawn would leave a child
/// forked meanwhile outside; and writing to `cgroup.procs` between fork
/// and exec in the service would take a `pre_exec` (unsafe, forbidden).
/// A process that moves itself before it execs `nsenter` has no child
/// yet: everything it starts is born in the node's cgroup. `python3` is
/// already required where environments run (`testenv/serve.py`, the
/// checks); the program is constant and every value comes as an
/// argument, never as code.
const JOIN_CGROUP: &str = "import os,sys\n\
a=sys.argv[1:]\n\
i=a.index('--')\n\
for p in a[:i]:\n    \
with open(p,'w') as f: f.write(str(os.getpid()))\n\
os.execvp(a[i+1],a[i+1:])\n";

/// `setpriv`'s arguments that start a program with [`NODE_CAPABILITIES`]
/// at most: its bounding set is that list (uid 0 gains it at `exec`, and
/// never more: the provider's own capabilities stay its own), with none
/// inheritable and none ambient (a program that switches to another user
/// keeps none).
pub fn node_capabilities() -> Vec<String> {
    let bounding: Vec<String> = NODE_CAPABILITIES
        .iter()
        .map(|cap| format!("+{cap}"))
        .collect();
    vec![
        "--inh-caps=-all".to_owned(),
        "--ambient-caps=-all".to_owned(),
        format!("--bounding-set=-all,{}", bounding.join(",")),
        "--".to_owned(),
    ]
}

/// Makes nodes in Linux namespaces. Cheap to clone.
#[derive(Debug, Clone)]
pub struct NamespaceProvider {
    /// The program whose `testenv-node-init` subcommand is each node's
    /// first process: the `orchestrator` binary.
    init_program: PathBuf,
    /// The service's paths no node may see: its data dir (which holds the
    /// nodes' own dirs too) and its config file's dir.
    hidden: Vec<PathBuf>,
    /// What node programs run from the host: the scripts dir and the
    /// interpreters' dirs, bound read-only where a node's root would not
    /// show them.
    exposed: Vec<PathBuf>,
    /// Where the nodes' cgroups go, detected at start, or why no
    /// hierarchy can hold them (then nothing is made).
    cgroups: std::result::Result<Hierarchy, String>,
}

impl NamespaceProvider {
    /// `init_program`: the `orchestrator` binary; `data_dir` and
    /// `config_file`: the service's, masked in every node.
    pub fn new(
        init_program: PathBuf,
        data_dir: &Path,
        config_file: Option<&Path>,
    ) -> NamespaceProvider {
        let mut hidden = vec![real_path(data_dir)];
        if let Some(dir) = config_file.and_then(|file| real_path(file).parent().map(Path::to_owned))
        {
            hidden.push(dir);
        }
        NamespaceProvider {
            init_program,
            hidden,
            exposed: Vec::new(),
            cgroups: Hierarchy::detect(),
        }
    }

    fn cgroups(&self) -> Result<&Hierarchy> {
        self.cgroups
            .as_ref()
            .map_err(|reason| Error::Unsupported(reason.clone()))
    }

    /// Also hides `path` (a file or a dir of the service's) from nodes.
    pub fn hide(mut self, path: &Path) -> NamespaceProvider {
        self.hidden.push(real_path(path));
        self
    }

    /// Makes `path` (a dir node programs run from) visible in nodes,
    /// read-only, at the same path.
    pub fn expose(mut self, path: &Path) -> NamespaceProvider {
        let path = real_path(path);
        if !self.exposed.contains(&path) {
            self.exposed.push(path);
        }
        self
    }

    /// What the init of `node` builds.
    fn node_spec(&self, plan: &EnvPlan, node: &NodePlan, root: &Path) -> NodeSpec {
        let node_dir = real_path(&plan.names().dir(root).join(&node.name));
        NodeSpec {
            node_dir,
            hostname: node.name.clone(),
            hidden: self.hidden.clone(),
            exposed: self.exposed.clone(),
        }
    }
}

/// `path` with its symbolic links resolved (as the node's init, which
/// binds and masks by path, needs it), or as given if it does not exist.
fn real_path(path: &Path) -> PathBuf {
    path.canonicalize().unwrap_or_else(|_| path.to_path_buf())
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
/// <host pid> 1`): a node's init.
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
/// else (never the service's own settings); their home is the node's own
/// dir inside the node.
fn node_env(command: &mut Command, netns: &str) {
    command.env_clear();
    for var in ["PATH", "LANG", "LC_ALL", "TZ"] {
        if let Some(value) = std::env::var_os(var) {
            command.env(var, value);
        }
    }
    command
        .env("HOME", NODE_HOME)
        .env("ORCHESTRATOR_DATA_DIR", NODE_HOME)
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

        let spec = self.node_spec(plan, node, root);
        let mut init = Command::new("ip");
        init.args(["netns", "exec", ns])
            .args(init_command(&self.init_program, &spec))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .current_dir(&spec.node_dir)
            // Its own group: a signal to the service's group (Ctrl-C in a
            // terminal) does not reach the node.
            .process_group(0);
        node_env(&mut init, ns);
        let mut child = init
            .spawn()
            .map_err(|e| Error::Provider(format!("cannot start node {}: {e}", node.name)))?;
        let mut stdout = BufReader::new(child.stdout.take().expect("piped")).lines();
        let mut stderr = child.stderr.take().expect("piped");
        let ready = tokio::time::timeout(INIT_WAIT, stdout.next_line()).await;
        if !matches!(&ready, Ok(Ok(Some(line))) if line == READY) {
            let _ = child.start_kill();
            let mut why = String::new();
            let _ = tokio::time::timeout(INIT_WAIT, stderr.read_to_string(&mut why)).await;
            let why = match ready {
                Err(_) => format!("not ready in {} s", INIT_WAIT.as_secs()),
                _ => why.trim().to_owned(),
            };
            return Err(Error::Provider(format!(
                "node {}: its init failed: {why}",
                node.name
            )));
        }
        // The node lives until teardown: its init says nothing more; reap
        // it then, holding its pipes open until.
        tokio::spawn(async move {
            let _ = child.wait().await;
            drop((stdout, stderr));
        });
        // Limited before any program of the node runs: the init starts
        // none, and every later one joins by itself (`command`).
        let pid = init_pid(ns).await?.ok_or_else(|| {
            Error::Provider(format!(
                "node {}: its init said ready, then went",
                node.name
            ))
        })?;
        let cgroups = self.cgroups()?;
        let cgroup = names.cgroup(node.index);
        cgroups
            .create(&cgroup, &node.limits)
            .and_then(|()| cgroups.join(&cgroup, pid))
            .map_err(|e| Error::Provider(format!("node {}: {e}", node.name)))?;
        // Readable (a runtime may size itself by its limits), never
        // writable: root in a node may still write its pid to another
        // cgroup's `cgroup.procs`, and leave its limits. (The init mounts
        // a sysfs of its own, without them; whatever a node still sees
        // is made read-only.)
        let init = pid.to_string();
        for mount in crate::cgroup::mount_points(pid) {
            let mount = mount.to_string_lossy();
            run(
                "nsenter",
                &["-t", &init, "-m", "mount", "-o", "remount,bind,ro", &mount],
            )
            .await?;
        }
        Ok(())
    }

    /// `program` with `args` inside `node`: its namespaces and root, its
    /// home as the working directory, in its own process group, in the
    /// node's cgroup (joined before `nsenter` starts: see
    /// [`JOIN_CGROUP`]), with the node's bounded capabilities.
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
        let names = plan.names();
        let node_dir = names.dir(root).join(&node.name);
        let mut command = Command::new("python3");
        command
            .args(["-I", "-S", "-c", JOIN_CGROUP])
            .args(self.cgroups()?.procs_files(&names.cgroup(node.index)))
            .args(["--", "nsenter"])
            .args(enter_args(pid))
            .arg(program)
            .args(args)
            .current_dir(&node_dir)
            .process_group(0);
        node_env(&mut command, &node.netns);
        Ok(command)
    }
}

/// After `ip netns exec <ns>`: the node's init, in new UTS, mount and PID
/// namespaces (`--fork`: its first child is pid 1 of the new one; a
/// private propagation: nothing it mounts reaches the host).
fn init_command(init_program: &Path, spec: &NodeSpec) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "unshare",
        "--uts",
        "--mount",
        "--pid",
        "--ipc",
        "--fork",
        "--propagation",
        "private",
    ]
    .into_iter()
    .map(Into::into)
    .collect();
    args.push(init_program.into());
    args.push("testenv-node-init".into());
    args.extend(spec.to_args());
    args
}

/// The `nsenter` arguments that run a program in the node whose init is
/// `pid`: every namespace of the node, its root, its home as working dir,
/// then `setpriv` with [`node_capabilities`].
fn enter_args(pid: i32) -> Vec<String> {
    let mut args = vec!["-t".to_owned(), pid.to_string()];
    // `--root` and `--wd` with no value: the init's root and working
    // directory ([`NODE_HOME`]); a path given to either is opened on the
    // host, before entering.
    // `-i`: its own System V IPC too (a killed PostgreSQL's segment goes
    // with the node).
    args.extend(["-n", "-u", "-m", "-p", "-i", "--root", "--wd"].map(str::to_owned));
    args.push("--".to_owned());
    // `nsenter` needs the service's capabilities to enter; what runs in
    // the node gets a bounded set, none of the provider's own.
    args.push("setpriv".to_owned());
    args.extend(node_capabilities());
    args
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
        self.cgroups()?;
        self.destroy(&names, root).await?;
        let dir = names.dir(root);
        let hosts = hosts_file(plan);
        for node in &plan.nodes {
            let node_dir = dir.join(&node.name);
            // The node's init makes its layers (`upper`, `work`, `root`).
            std::fs::create_dir_all(&node_dir)
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

    fn limits_enforcement(&self) -> std::result::Result<String, String> {
        self.cgroups
            .as_ref()
            .map(|h| h.version().to_owned())
            .map_err(Clone::clone)
    }

    async fn limit_events(&self, plan: &EnvPlan, node: &NodePlan) -> LimitEvents {
        match &self.cgroups {
            Ok(cgroups) => cgroups.events(&plan.names().cgroup(node.index)),
            Err(_) => LimitEvents::default(),
        }
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
        // What the namespaces held is gone; what is left in a cgroup
        // (a process that never entered a namespace) is killed with it.
        if let Ok(cgroups) = &self.cgroups {
            let prefix = names.netns_prefix();
            for cgroup in cgroups.names() {
                if cgroup.starts_with(&prefix)
                    && cgroups.remove(&cgroup).await.map_err(Error::Provider)?
                {
                    removed += 1;
                }
            }
        }
        let dir = names.dir(root);
        if dir.exists() {
            // Overlayfs makes `work/work` with mode 0: a service that is
            // not root (and holds no CAP_DAC_OVERRIDE) could not empty it.
            for node in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let scratch = node.path().join("work/work");
                if scratch.is_dir() {
                    let _ = std::fs::set_permissions(
                        &scratch,
                        std::os::unix::fs::PermissionsExt::from_mode(0o700),
                    );
                }
            }
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
        if let Ok(cgroups) = &self.cgroups {
            for cgroup in cgroups.names() {
                if let Some(rest) = cgroup.strip_prefix(&netns_prefix)
                    && let Some(key) = rest.get(..6)
                {
                    keys.insert(key.to_owned());
                }
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
        Ok(crate::model::leftover_envs(tag, keys, root))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Catalog;
    use crate::model::{CreateRequest, EnvPlan};

    #[test]
    fn a_node_program_is_bounded_to_dockers_set_less_mknod() {
        assert_eq!(
            node_capabilities(),
            [
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--bounding-set=-all,+chown,+dac_override,+fowner,+fsetid,+kill,+setgid,\
                 +setuid,+setpcap,+net_bind_service,+net_raw,+sys_chroot,+audit_write,+setfcap",
                "--",
            ]
        );
        for never in [
            "sys_admin",
            "net_admin",
            "sys_ptrace",
            "sys_module",
            "sys_rawio",
            "dac_read_search",
            "mknod",
        ] {
            assert!(!NODE_CAPABILITIES.contains(&never), "{never}");
        }
    }

    #[test]
    fn programs_enter_the_nodes_root_and_home() {
        assert_eq!(
            enter_args(4242)[..10],
            [
                "-t", "4242", "-n", "-u", "-m", "-p", "-i", "--root", "--wd", "--"
            ]
        );
        assert_eq!(enter_args(4242)[10], "setpriv");
    }

    #[test]
    fn the_init_runs_in_new_namespaces_with_its_spec() {
        let spec = NodeSpec {
            node_dir: "/d/testenv/ab12-cd34ef/n1".into(),
            hostname: "n1".into(),
            hidden: vec!["/d".into()],
            exposed: vec![],
        };
        let args: Vec<String> = init_command(Path::new("/usr/bin/orchestrator"), &spec)
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "unshare",
                "--uts",
                "--mount",
                "--pid",
                "--ipc",
                "--fork",
                "--propagation",
                "private",
                "/usr/bin/orchestrator",
                "testenv-node-init",
                "--node-dir",
                "/d/testenv/ab12-cd34ef/n1",
                "--hostname",
                "n1",
                "--hide",
                "/d",
            ]
        );
    }

    #[test]
    fn the_service_paths_are_hidden_and_programs_exposed_once() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let config = dir.path().join("etc/config.toml");
        std::fs::create_dir_all(&data).unwrap();
        let provider = NamespaceProvider::new("/bin/orchestrator".into(), &data, Some(&config))
            .hide(&dir.path().join("secret.key"))
            .expose(Path::new("/usr/bin"))
            .expose(Path::new("/usr/bin"));
        let real = dir.path().canonicalize().unwrap();
        assert_eq!(
            provider.hidden,
            [
                real.join("data"),
                dir.path().join("etc"),
                dir.path().join("secret.key")
            ]
        );
        assert_eq!(provider.exposed, [PathBuf::from("/usr/bin")]);
    }

    #[tokio::test]
    async fn without_a_hierarchy_for_the_limits_nothing_is_made_and_the_reason_is_given() {
        let reason =
            "no cgroup hierarchy on this host provides memory, pids and cpu (v1 lacks pids)";
        let mut provider =
            NamespaceProvider::new("/bin/orchestrator".into(), Path::new("/nonexistent"), None);
        provider.cgroups = Err(reason.to_owned());
        assert_eq!(provider.limits_enforcement(), Err(reason.to_owned()));
        let catalog = Catalog::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts"),
            None,
        )
        .unwrap();
        let request: CreateRequest = serde_json::from_value(
            serde_json::json!({"type": "single_taskserv", "taskserv": "redis"}),
        )
        .unwrap();
        let plan = EnvPlan::new(
            &request,
            &catalog,
            uuid::Uuid::now_v7(),
            "abcd",
            chrono::Utc::now(),
        )
        .unwrap();
        let root = std::env::temp_dir().join(format!("limits-unit-{}", plan.key));
        let err = provider.create(&plan, &root).await.unwrap_err();
        assert!(
            matches!(&err, Error::Unsupported(message) if message == reason),
            "{err}"
        );
        // Refused before anything was made: not even the directory.
        assert!(!root.exists());
    }
}
