//! The Docker Engine API provider (Docker, or Podman's compatible socket),
//! through `bollard`. Per environment: a user-defined bridge network,
//! internal (no route out), on the plan's /24. Per node: a container of
//! the test image with the node's name as host name and network alias, the
//! plan's address, every node in its `/etc/hosts`, `sleep infinity` as its
//! command, and no privilege beyond the engine's defaults. The scripts
//! dir and the host's interpreters that the image lacks (`nu`, a static
//! binary) are bind-mounted read-only at the same paths, and the node's private root
//! (`<data dir>/testenv/<tag>-<key>/<node>`) read-write at its host path,
//! so that a script runs where it would in a namespace node.
//!
//! Everything made carries the labels `orchestrator.testenv.tag` and
//! `orchestrator.testenv.key`: teardown and the sweep after a crash find
//! it by label, never by a name pattern.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::models::{
    ContainerCreateBody, EndpointIpamConfig, EndpointSettings, HostConfig, Ipam, IpamConfig,
    NetworkCreateRequest, NetworkingConfig,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListNetworksOptionsBuilder,
    RemoveContainerOptionsBuilder, StartContainerOptions,
};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::model::{EnvNames, EnvPlan, NodePlan, PREFIX};
use crate::netns::MARK_VAR;
use crate::provider::{NodeChild, NodeExit, NodeProcess, Provider};
use crate::{Error, Result};

/// `mib` MiB in bytes, as the engine takes memory limits.
fn mib_bytes(mib: u64) -> i64 {
    i64::try_from(mib.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX)
}

/// Where a Docker engine listens by default.
pub const DEFAULT_HOST: &str = "unix:///var/run/docker.sock";
/// The image nodes run by default: what `scripts/testenv/build-image.sh`
/// imports.
pub const DEFAULT_IMAGE: &str = "localhost/orchestrator-testenv:latest";
/// The label naming the service that made a container or network.
pub const LABEL_TAG: &str = "orchestrator.testenv.tag";
/// The label naming the environment (its key).
pub const LABEL_KEY: &str = "orchestrator.testenv.key";
/// The variable that marks each program started in a node, so that it
/// and what it starts can be found and killed from another exec (the API
/// has no call that signals an exec).
const EXEC_VAR: &str = "ORCHESTRATOR_EXEC";
/// The interpreters the image may lack, mounted from the host when found
/// on its PATH outside the system's own directories.
const HOST_TOOLS: &[&str] = &["nu"];
/// The PATH of a program in a node.
const NODE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long one request to the engine may take (not a program's run).
const REQUEST_TIMEOUT: u64 = 120;
/// How long an exec's end may take to show once its output closed.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(25);
/// The most of a pipe's bytes held before the reader takes them.
const PIPE_BUFFER: usize = 64 * 1024;

/// The containers of a Docker Engine API. Cheap to share.
#[derive(Debug)]
pub struct DockerProvider {
    /// `unix:///path`, as the setting gives it: in every message.
    host: String,
    image: String,
    scripts_dir: PathBuf,
    /// The host's programs mounted read-only into each node: (the file,
    /// where it is mounted, as the service's PATH found it).
    tools: Vec<(PathBuf, PathBuf)>,
    /// Connected (and its API version agreed) at the first call that
    /// reached the engine; a failed connection is tried again next time.
    client: tokio::sync::OnceCell<Docker>,
}

impl DockerProvider {
    /// A provider for the engine at `host` (`unix:///path`, the only kind
    /// of address taken), whose nodes run `image` and see `scripts_dir`.
    pub fn new(host: &str, image: &str, scripts_dir: &Path) -> Result<DockerProvider> {
        let socket = host.strip_prefix("unix://").unwrap_or_default();
        if !socket.starts_with('/') {
            return Err(crate::invalid(
                "docker_host",
                format!("`{host}` is not unix:///<absolute path of a socket>"),
            ));
        }
        if image.trim().is_empty() {
            return Err(crate::invalid("docker_image", "is empty"));
        }
        // As scripts are resolved: canonical, so that the paths a node is
        // given exist inside it.
        let scripts_dir = scripts_dir
            .canonicalize()
            .or_else(|_| std::path::absolute(scripts_dir))
            .map_err(|e| {
                crate::invalid("scripts_dir", format!("{}: {e}", scripts_dir.display()))
            })?;
        Ok(DockerProvider {
            host: host.to_owned(),
            image: image.to_owned(),
            scripts_dir,
            tools: host_tools(),
            client: tokio::sync::OnceCell::new(),
        })
    }

    async fn client(&self) -> Result<&Docker> {
        self.client
            .get_or_try_init(|| async {
                let docker = Docker::connect_with_unix(
                    &self.host,
                    REQUEST_TIMEOUT,
                    bollard::API_DEFAULT_VERSION,
                )
                .map_err(|e| self.unavailable(e))?;
                // An engine may speak an older API (Podman 4: 1.41).
                docker
                    .negotiate_version()
                    .await
                    .map_err(|e| self.unavailable(e))
            })
            .await
    }

    fn unavailable(&self, error: impl std::fmt::Display) -> Error {
        Error::Unavailable(format!(
            "the docker engine at {} does not answer ({error}); start it, or set --docker-host",
            self.host
        ))
    }

    fn failed(&self, what: &str, error: impl std::fmt::Display) -> Error {
        Error::Provider(format!("docker engine at {}: {what}: {error}", self.host))
    }

    /// The labels of everything the environment makes.
    fn labels(names: &EnvNames) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_TAG.to_owned(), names.tag.clone()),
            (LABEL_KEY.to_owned(), names.key.clone()),
        ])
    }

    /// The label filters of a list call: the service's, or the
    /// environment's too.
    fn filters(tag: &str, key: Option<&str>) -> HashMap<String, Vec<String>> {
        let mut labels = vec![format!("{LABEL_TAG}={tag}")];
        if let Some(key) = key {
            labels.push(format!("{LABEL_KEY}={key}"));
        }
        HashMap::from([("label".to_owned(), labels)])
    }

    /// The engine, connected.
    async fn engine(&self) -> Result<Engine> {
        Ok(Engine {
            docker: self.client().await?.clone(),
            host: self.host.clone(),
        })
    }

    async fn remove_containers(&self, names: &EnvNames) -> Result<usize> {
        let docker = self.client().await?;
        let listed = docker
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&Self::filters(&names.tag, Some(&names.key)))
                    .build(),
            ))
            .await
            .map_err(|e| self.failed("list containers", e))?;
        let mut removed = 0;
        for container in listed {
            let Some(id) = container.id else { continue };
            match docker
                .remove_container(
                    &id,
                    Some(RemoveContainerOptionsBuilder::new().force(true).build()),
                )
                .await
            {
                Ok(()) => removed += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(self.failed(&format!("remove container {id}"), e)),
            }
        }
        Ok(removed)
    }

    async fn remove_networks(&self, names: &EnvNames) -> Result<usize> {
        let docker = self.client().await?;
        let listed = docker
            .list_networks(Some(
                ListNetworksOptionsBuilder::new()
                    .filters(&Self::filters(&names.tag, Some(&names.key)))
                    .build(),
            ))
            .await
            .map_err(|e| self.failed("list networks", e))?;
        let mut removed = 0;
        for network in listed {
            let Some(name) = network.name else { continue };
            match docker.remove_network(&name).await {
                Ok(()) => removed += 1,
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(self.failed(&format!("remove network {name}"), e)),
            }
        }
        Ok(removed)
    }

    async fn create_node(&self, plan: &EnvPlan, node: &NodePlan, root: &Path) -> Result<()> {
        let docker = self.client().await?;
        let names = plan.names();
        let network = network_name(&names);
        let node_dir = names.dir(root).join(&node.name);
        let node_dir = node_dir.to_string_lossy();
        let scripts = self.scripts_dir.to_string_lossy();
        let mut binds = vec![
            format!("{scripts}:{scripts}:ro"),
            format!("{node_dir}:{node_dir}:rw"),
        ];
        // The program itself, not its directory: it may be a system
        // directory the image has its own of (`/usr/local/bin`).
        binds.extend(
            self.tools.iter().map(|(file, at)| {
                format!("{}:{}:ro", file.to_string_lossy(), at.to_string_lossy())
            }),
        );
        let mut labels = Self::labels(&names);
        labels.insert("orchestrator.testenv.node".to_owned(), node.name.clone());
        let body = ContainerCreateBody {
            image: Some(self.image.clone()),
            hostname: Some(node.name.clone()),
            cmd: Some(vec!["sleep".to_owned(), "infinity".to_owned()]),
            env: Some(vec![format!("{MARK_VAR}={}", node.netns)]),
            labels: Some(labels),
            host_config: Some(HostConfig {
                binds: Some(binds),
                network_mode: Some(network.clone()),
                // Names resolve without the engine's DNS (which Podman
                // with CNI lacks): every node in every /etc/hosts.
                extra_hosts: Some(
                    plan.nodes
                        .iter()
                        .map(|n| format!("{}:{}", n.name, n.address))
                        .collect(),
                ),
                // The node's limits, enforced by the engine's own cgroups:
                // memory with swap included (so a hog cannot escape to
                // swap), processes, and CPU time.
                memory: Some(mib_bytes(node.limits.memory_mib)),
                memory_swap: Some(mib_bytes(node.limits.memory_mib)),
                pids_limit: Some(i64::from(node.limits.pids)),
                nano_cpus: Some((node.limits.cpus * 1e9) as i64),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    network,
                    EndpointSettings {
                        ipam_config: Some(EndpointIpamConfig {
                            ipv4_address: Some(node.address.clone()),
                            ..Default::default()
                        }),
                        aliases: Some(vec![node.name.clone()]),
                        ..Default::default()
                    },
                )])),
            }),
            ..Default::default()
        };
        docker
            .create_container(
                Some(
                    CreateContainerOptionsBuilder::new()
                        .name(&node.netns)
                        .build(),
                ),
                body,
            )
            .await
            .map_err(|e| {
                self.failed(
                    &format!("create container {} ({})", node.netns, self.image),
                    e,
                )
            })?;
        docker
            .start_container(&node.netns, None::<StartContainerOptions>)
            .await
            .map_err(|e| self.failed(&format!("start container {}", node.netns), e))?;
        Ok(())
    }
}

/// The environment's network: `te-<tag>-<key>`.
fn network_name(names: &EnvNames) -> String {
    format!("{PREFIX}-{}-{}", names.tag, names.key)
}

fn is_not_found(error: &DockerError) -> bool {
    matches!(
        error,
        DockerError::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// The host's interpreters that the image may lack, found on the
/// service's PATH: (the program itself, where PATH found it).
fn host_tools() -> Vec<(PathBuf, PathBuf)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    HOST_TOOLS
        .iter()
        .filter_map(|tool| {
            let found = std::env::split_paths(&path)
                .map(|dir| dir.join(tool))
                .find(|candidate| candidate.is_file())?;
            Some((std::fs::canonicalize(&found).ok()?, found))
        })
        .collect()
}

/// A connection to the engine, and its address for messages.
#[derive(Clone)]
struct Engine {
    docker: Docker,
    host: String,
}

impl Engine {
    fn failed(&self, what: &str, error: impl std::fmt::Display) -> Error {
        Error::Provider(format!("docker engine at {}: {what}: {error}", self.host))
    }

    /// Runs a program in a container to its end; its stdout, or an error
    /// naming it.
    async fn exec_output(&self, container: &str, cmd: &[&str]) -> Result<String> {
        let mut process = self
            .exec(
                container,
                cmd.iter().map(|s| (*s).to_owned()).collect(),
                vec![],
                None,
            )
            .await?;
        drop(process.stdin.take());
        // Unread, it would fill and hold the stream.
        drop(process.stderr.take());
        let mut out = String::new();
        if let Some(mut stdout) = process.stdout.take() {
            tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out)
                .await
                .map_err(|e| self.failed(&cmd.join(" "), e))?;
        }
        let exit = process.wait().await?;
        if !exit.success() {
            return Err(self.failed(&format!("`{}` in {container}", cmd.join(" ")), exit));
        }
        Ok(out)
    }

    /// Starts `cmd` in `container`, attached: its stdin, stdout and
    /// stderr as pipes, its end read from the engine.
    async fn exec(
        &self,
        container: &str,
        cmd: Vec<String>,
        env: Vec<String>,
        working_dir: Option<String>,
    ) -> Result<NodeProcess> {
        let docker = self.docker.clone();
        let marker = uuid::Uuid::now_v7().simple().to_string();
        let mut env = env;
        env.push(format!("{EXEC_VAR}={marker}"));
        let what = format!("`{}` in {container}", cmd.join(" "));
        let exec = docker
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    env: Some(env),
                    cmd: Some(cmd),
                    working_dir,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.failed(&what, e))?
            .id;
        let started = docker
            .start_exec(
                &exec,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            )
            .await
            .map_err(|e| self.failed(&what, e))?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(self.failed(&what, "the engine did not attach to it"));
        };
        // The engine multiplexes stdout and stderr on one stream: each to
        // its own pipe, until the stream ends with the program.
        let (mut out_writer, out_reader) = tokio::io::duplex(PIPE_BUFFER);
        let (mut err_writer, err_reader) = tokio::io::duplex(PIPE_BUFFER);
        let streams = tokio::spawn(async move {
            let (mut out_open, mut err_open) = (true, true);
            while let Some(Ok(chunk)) = output.next().await {
                use bollard::container::LogOutput;
                match chunk {
                    LogOutput::StdErr { message } => {
                        if err_open {
                            err_open = err_writer.write_all(&message).await.is_ok();
                        }
                    }
                    LogOutput::StdOut { message } | LogOutput::Console { message } => {
                        if out_open {
                            out_open = out_writer.write_all(&message).await.is_ok();
                        }
                    }
                    LogOutput::StdIn { .. } => {}
                }
            }
        });
        Ok(NodeProcess {
            stdin: Some(input),
            stdout: Some(Box::pin(out_reader)),
            stderr: Some(Box::pin(err_reader)),
            child: Box::new(DockerChild {
                engine: Engine {
                    docker,
                    host: self.host.clone(),
                },
                container: container.to_owned(),
                exec,
                marker,
                streams: Some(streams),
            }),
        })
    }

    /// Kills the processes of `container` whose command line (and, with
    /// `environment`, whose environment) contains `needle`.
    async fn kill_matching(
        &self,
        container: &str,
        needle: &str,
        environment: bool,
    ) -> Result<usize> {
        let ps: &[&str] = if environment {
            // `e`: the environment after the command line.
            &["ps", "-e", "e", "-ww", "-o", "pid=,args="]
        } else {
            &["ps", "-e", "-ww", "-o", "pid=,args="]
        };
        let listed = self.exec_output(container, ps).await?;
        let pids: Vec<String> = listed
            .lines()
            .filter(|line| line.contains(needle))
            .filter_map(|line| line.split_whitespace().next())
            .filter(|pid| *pid != "1" && pid.bytes().all(|b| b.is_ascii_digit()))
            .map(str::to_owned)
            .collect();
        if pids.is_empty() {
            return Ok(0);
        }
        let mut kill = vec!["kill", "-KILL", "--"];
        kill.extend(pids.iter().map(String::as_str));
        // Some may have ended meanwhile: `kill` then fails for those only.
        let _ = self.exec_output(container, &kill).await;
        Ok(pids.len())
    }
}

/// One exec: its output's end, then its exit code from the engine.
struct DockerChild {
    engine: Engine,
    container: String,
    exec: String,
    /// The value of `ORCHESTRATOR_EXEC` it and its children carry.
    marker: String,
    streams: Option<tokio::task::JoinHandle<()>>,
}

#[async_trait]
impl NodeChild for DockerChild {
    async fn wait(&mut self) -> Result<NodeExit> {
        if let Some(streams) = self.streams.take() {
            let _ = streams.await;
        }
        let docker = &self.engine.docker;
        let started = tokio::time::Instant::now();
        loop {
            let inspected = docker.inspect_exec(&self.exec).await.map_err(|e| {
                Error::Provider(format!(
                    "docker engine at {}: inspect exec {}: {e}",
                    self.engine.host, self.exec
                ))
            })?;
            if inspected.running != Some(true) {
                let code = inspected.exit_code.and_then(|c| i32::try_from(c).ok());
                return Ok(NodeExit {
                    code,
                    description: match code {
                        Some(code) => format!("exit status: {code}"),
                        None => "no exit status".to_owned(),
                    },
                });
            }
            if started.elapsed() > EXIT_WAIT {
                return Err(Error::Provider(format!(
                    "docker engine at {}: exec {} in {} still runs {} s after its output closed",
                    self.engine.host,
                    self.exec,
                    self.container,
                    EXIT_WAIT.as_secs()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn kill(&mut self) -> Result<()> {
        // Every process of the container that carries the marker (it and
        // what it started), found with `ps` in another exec: the API has
        // no call that signals an exec.
        let needle = format!("{EXEC_VAR}={}", self.marker);
        self.engine
            .kill_matching(&self.container, &needle, true)
            .await?;
        Ok(())
    }
}

#[async_trait]
impl Provider for DockerProvider {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn missing_privileges(&self) -> Vec<String> {
        // The engine holds the privileges; reaching it is `health`.
        Vec::new()
    }

    async fn health(&self) -> Result<()> {
        self.client()
            .await?
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable(e))
    }

    async fn create(&self, plan: &EnvPlan, root: &Path) -> Result<()> {
        let names = plan.names();
        self.destroy(&names, root).await?;
        let dir = names.dir(root);
        for node in &plan.nodes {
            let node_dir = dir.join(&node.name);
            std::fs::create_dir_all(node_dir.join("run"))
                .map_err(|e| Error::Provider(format!("{}: {e}", node_dir.display())))?;
        }
        let docker = self.client().await?;
        let network = network_name(&names);
        docker
            .create_network(NetworkCreateRequest {
                name: network.clone(),
                driver: Some("bridge".to_owned()),
                // No route out of the environment.
                internal: Some(true),
                ipam: Some(Ipam {
                    config: Some(vec![IpamConfig {
                        subnet: Some(format!("{}.0/24", plan.subnet)),
                        gateway: Some(format!("{}.1", plan.subnet)),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                labels: Some(Self::labels(&names)),
                // The host's bridge named after the environment, as the
                // namespace provider names its own: an engine's default
                // names (`cni-podman1`) are counted per engine config, and
                // two engines could then share one bridge.
                options: Some(HashMap::from([(
                    "com.docker.network.bridge.name".to_owned(),
                    names.bridge(),
                )])),
                ..Default::default()
            })
            .await
            .map_err(|e| self.failed(&format!("create network {network}"), e))?;
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
        let node_dir = plan.names().dir(root).join(&node.name);
        let node_dir = node_dir.to_string_lossy().into_owned();
        let mut path = NODE_PATH.to_owned();
        for dir in self.tools.iter().filter_map(|(_, at)| at.parent()) {
            path.push(':');
            path.push_str(&dir.to_string_lossy());
        }
        let mut vars = vec![
            format!("PATH={path}"),
            format!("HOME={node_dir}"),
            format!("ORCHESTRATOR_DATA_DIR={node_dir}"),
            format!("{MARK_VAR}={}", node.netns),
        ];
        for var in ["LANG", "LC_ALL", "TZ"] {
            if let Ok(value) = std::env::var(var) {
                vars.push(format!("{var}={value}"));
            }
        }
        vars.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
        let mut cmd = vec![program.to_string_lossy().into_owned()];
        cmd.extend(args.iter().cloned());
        self.engine()
            .await?
            .exec(&node.netns, cmd, vars, Some(node_dir))
            .await
    }

    fn limits_enforcement(&self) -> std::result::Result<String, String> {
        Ok("the container engine".to_owned())
    }

    async fn destroy(&self, names: &EnvNames, root: &Path) -> Result<usize> {
        // The containers first: a network in use cannot go.
        let mut removed = self.remove_containers(names).await?;
        removed += self.remove_networks(names).await?;
        let dir = names.dir(root);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::Provider(format!("cannot remove {}: {e}", dir.display())))?;
            removed += 1;
        }
        Ok(removed)
    }

    async fn existing(&self, tag: &str, root: &Path) -> Result<Vec<EnvNames>> {
        let docker = self.client().await?;
        let mut keys = BTreeSet::new();
        let containers = docker
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&Self::filters(tag, None))
                    .build(),
            ))
            .await
            .map_err(|e| self.failed("list containers", e))?;
        keys.extend(
            containers
                .into_iter()
                .filter_map(|c| c.labels?.remove(LABEL_KEY)),
        );
        let networks = docker
            .list_networks(Some(
                ListNetworksOptionsBuilder::new()
                    .filters(&Self::filters(tag, None))
                    .build(),
            ))
            .await
            .map_err(|e| self.failed("list networks", e))?;
        keys.extend(
            networks
                .into_iter()
                .filter_map(|n| n.labels?.remove(LABEL_KEY)),
        );
        Ok(crate::model::leftover_envs(tag, keys, root))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_absolute_unix_socket_is_taken_as_the_host() {
        for bad in [
            "tcp://127.0.0.1:2375",
            "unix://relative.sock",
            "/var/run/docker.sock",
            "",
        ] {
            let error = DockerProvider::new(bad, DEFAULT_IMAGE, Path::new("/tmp"))
                .unwrap_err()
                .to_string();
            assert!(
                error.starts_with("docker_host:") && error.contains(&format!("`{bad}`")),
                "{bad}: {error}"
            );
        }
        assert!(DockerProvider::new(DEFAULT_HOST, DEFAULT_IMAGE, Path::new("/tmp")).is_ok());
    }

    #[tokio::test]
    async fn an_engine_that_does_not_answer_is_named_with_its_socket() {
        let dir = tempfile::tempdir().unwrap();
        let host = format!("unix://{}/none.sock", dir.path().display());
        let provider = DockerProvider::new(&host, DEFAULT_IMAGE, dir.path()).unwrap();
        let error = provider.health().await.unwrap_err();
        assert!(matches!(error, Error::Unavailable(_)), "{error:?}");
        assert!(error.to_string().contains(&host), "{error}");
    }

    #[test]
    fn the_network_is_named_after_the_environment() {
        let names = EnvNames {
            tag: "ab12".into(),
            key: "c0ffee".into(),
        };
        assert_eq!(network_name(&names), "te-ab12-c0ffee");
    }
}
