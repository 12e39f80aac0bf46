//! Service settings, layered by figment: the defaults of [`ServeConfig`],
//! then the TOML config file, then `ORCHESTRATOR_*` variables and flags
//! (clap reads both into [`ServeArgs`], a flag over its variable); then
//! checked into the [`ServeSettings`] the service runs with.
//!
//! A new setting is a field of [`ServeConfig`] with its default in
//! `ServeConfig::default`, a flag of [`ServeArgs`] of the same name, its
//! check in [`ServeConfig::into_settings`] and a row in
//! docs/configuration.md; the tests below hold the four together.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use orchestrator_core::RetryPolicy;
use orchestrator_core::retention::Keep;
use orchestrator_core::template::{Limits, MAX_DURATION};
use orchestrator_storage::{Secret, StorageType, SurrealdbConfig};
use serde::{Deserialize, Serialize, Serializer};

use crate::cli::ServeArgs;

/// What `--print-config` shows instead of a secret.
const MASK: &str = "***";

/// Every `serve` setting, named as in the config file (the flag's name
/// with underscores), in the units the file uses. The layers are merged
/// into this one struct, and `--print-config` prints it as TOML: a valid
/// config file. Unknown keys are refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    pub port: u16,
    pub bind: IpAddr,
    pub data_dir: PathBuf,
    /// `filesystem`, `surrealdb-embedded` or `surrealdb-server`.
    pub storage_type: String,
    pub scripts_dir: PathBuf,
    pub templates_dir: PathBuf,
    pub workers: usize,
    pub max_attempts: u32,
    /// Seconds.
    pub task_timeout: u64,
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// Seconds.
    pub shutdown_grace: u64,
    /// Seconds.
    pub kill_grace: u64,
    pub max_log_bytes: u64,
    /// Absent: read (or create) `<data-dir>/node-id` at start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    pub lease_secs: u64,
    pub poll_ms: u64,
    /// `pretty` or `json`.
    pub log_format: String,
    pub no_auth: bool,
    pub secure_cookies: bool,
    #[serde(serialize_with = "period")]
    pub retain_finished: Keep,
    #[serde(serialize_with = "period")]
    pub retain_audit: Keep,
    pub webhook_max_attempts: u32,
    pub webhook_retry_base_ms: u64,
    #[serde(serialize_with = "period")]
    pub webhook_retain: Keep,
    pub rate_limit: u32,
    pub address_rate_limit: u32,
    /// Hosts http steps may reach: `["awx.example.com", "127.0.0.1:8081"]`.
    pub http_allow: Vec<String>,
    // The API's connections (`HttpConfig`).
    /// Seconds.
    pub header_timeout: u64,
    pub max_connections: usize,
    pub max_streams: usize,
    /// `["10.0.0.5", "192.168.0.0/16"]`.
    pub trusted_proxy: Vec<String>,
    /// `["orchestrator.example.com"]`.
    pub public_host: Vec<String>,
    // Limits on the work of one submission (`Limits`).
    pub max_step_instances: u64,
    pub max_workflow_tasks: u64,
    pub max_template_steps: u64,
    pub max_list_items: u64,
    pub max_template_bytes: u64,
    pub max_input_bytes: u64,
    /// `bubblewrap` or `none`.
    pub script_sandbox: String,
    /// Attempts one sandbox serves, one after another.
    pub script_sandbox_attempts: u32,
    /// Whose attempts those are: `submitter`, `workflow` or `any`.
    pub script_sandbox_reuse: String,
    /// Paths scripts may write in the sandbox.
    pub script_writable: Vec<PathBuf>,
    /// What test environments' nodes are: `namespaces` or `docker`.
    pub testenv_provider: String,
    /// The Docker Engine API's socket (`unix:///path`), for `docker`.
    pub docker_host: String,
    /// The image the `docker` provider's nodes run.
    pub docker_image: String,
    /// A path, not a secret: shown as it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_key_file: Option<PathBuf>,
    // How to reach SurrealDB (`SurrealdbConfig`).
    pub surrealdb_url: String,
    pub surrealdb_username: String,
    /// Serialized as itself, so that the layers can be merged;
    /// [`ServeConfig::masked`] hides it before anything is shown.
    #[serde(serialize_with = "expose_secret")]
    pub surrealdb_password: Secret,
    pub surrealdb_namespace: String,
    pub surrealdb_database: String,
    /// `surrealkv` or `rocksdb`.
    pub surrealdb_engine: String,
    /// Seconds.
    pub surrealdb_connect_timeout: u64,
    /// Seconds.
    pub surrealdb_request_timeout: u64,
    /// Interpreter per script extension, e.g. `nu = "/opt/nu/bin/nu"`;
    /// only in the file. Last, as a TOML table must be.
    pub interpreters: BTreeMap<String, PathBuf>,
}

/// The defaults, the one place they are written; those of a part that
/// another crate owns (the store, the API's connections, the limits, the
/// retry policy, the log cap) come from that crate.
impl Default for ServeConfig {
    fn default() -> Self {
        let surrealdb = SurrealdbConfig::default();
        let network = orchestrator_api::HttpConfig::default();
        let limits = Limits::default();
        let retry = RetryPolicy::default();
        ServeConfig {
            port: 8080,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            data_dir: PathBuf::from("./data"),
            storage_type: StorageType::Filesystem.as_str().to_owned(),
            scripts_dir: PathBuf::from("./scripts"),
            templates_dir: PathBuf::from("./templates"),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_attempts: 3,
            task_timeout: 3600,
            retry_base_ms: millis(retry.base_delay),
            retry_max_ms: millis(retry.max_delay),
            shutdown_grace: 30,
            kill_grace: 10,
            max_log_bytes: orchestrator_executor::DEFAULT_MAX_LOG_BYTES,
            node_id: None,
            lease_secs: 15,
            poll_ms: 1000,
            log_format: "pretty".to_owned(),
            no_auth: false,
            secure_cookies: false,
            retain_finished: Keep::Forever,
            retain_audit: Keep::Forever,
            webhook_max_attempts: 8,
            webhook_retry_base_ms: 1000,
            webhook_retain: Keep::For(Duration::from_secs(7 * 86_400)),
            rate_limit: 50,
            address_rate_limit: 200,
            http_allow: Vec::new(),
            header_timeout: network.header_timeout.as_secs(),
            max_connections: network.max_connections,
            max_streams: network.max_streams,
            trusted_proxy: Vec::new(),
            public_host: Vec::new(),
            max_step_instances: limits.max_step_instances,
            max_workflow_tasks: limits.max_workflow_tasks,
            max_template_steps: limits.max_template_steps,
            max_list_items: limits.max_list_items,
            max_template_bytes: limits.max_template_bytes,
            max_input_bytes: limits.max_input_bytes,
            script_sandbox: "bubblewrap".to_owned(),
            script_sandbox_attempts: 100,
            script_sandbox_reuse: "submitter".to_owned(),
            script_writable: Vec::new(),
            testenv_provider: "namespaces".to_owned(),
            docker_host: orchestrator_testenv::docker::DEFAULT_HOST.to_owned(),
            docker_image: orchestrator_testenv::docker::DEFAULT_IMAGE.to_owned(),
            secret_key_file: None,
            surrealdb_url: surrealdb.url,
            surrealdb_username: surrealdb.username,
            surrealdb_password: surrealdb.password,
            surrealdb_namespace: surrealdb.namespace,
            surrealdb_database: surrealdb.database,
            surrealdb_engine: surrealdb.engine.as_str().to_owned(),
            surrealdb_connect_timeout: surrealdb.connect_timeout.as_secs(),
            surrealdb_request_timeout: surrealdb.request_timeout.as_secs(),
            interpreters: BTreeMap::new(),
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// How scripts are isolated from the service (`--script-sandbox`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptSandbox {
    /// Each script in its own `bwrap` sandbox (the default).
    Bubblewrap,
    /// Scripts as plain children of the service: unsafe.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Pretty,
    Json,
}

/// What test environments' nodes are made of (`--testenv-provider`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TestenvProvider {
    /// Linux namespaces of this host (the default).
    Namespaces,
    /// Containers of the Docker Engine API at `host` (`unix:///path`),
    /// running `image`.
    Docker { host: String, image: String },
}

/// Fully resolved settings for `serve`.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub bind: IpAddr,
    pub port: u16,
    pub data_dir: PathBuf,
    pub storage_type: StorageType,
    /// How to reach SurrealDB; its password's `Debug` is redacted.
    pub surrealdb: SurrealdbConfig,
    pub scripts_dir: PathBuf,
    pub templates_dir: PathBuf,
    pub workers: usize,
    pub max_attempts: u32,
    pub task_timeout: Duration,
    pub retry: RetryPolicy,
    pub shutdown_grace: Duration,
    pub kill_grace: Duration,
    /// The most of one attempt's output kept in its log.
    pub max_log_bytes: u64,
    /// `None`: read (or create) `<data-dir>/node-id` at start.
    pub node_id: Option<String>,
    pub lease: Duration,
    /// How often a node on a shared store looks through it for work and
    /// for leases that ran out (the change feed brings new work at once).
    pub poll: Duration,
    pub log_format: LogFormat,
    pub interpreters: HashMap<String, PathBuf>,
    /// API tokens required (the default); off only on loopback.
    pub auth: bool,
    /// Clients come over HTTPS: `Secure`, `__Host-` session cookies.
    pub secure_cookies: bool,
    /// Requests per second per caller; 0 for no limit.
    pub rate_limit: u32,
    /// How long finished workflows and audit records are kept.
    pub retain_finished: Keep,
    pub retain_audit: Keep,
    /// How webhook deliveries are retried and kept.
    pub webhooks: orchestrator_engine::webhooks::WebhookConfig,
    /// Between background retention sweeps (a setting for tests).
    pub retention_every: Duration,
    /// Requests per second per client address, before the token is
    /// checked; 0 for no limit.
    pub address_rate_limit: u32,
    /// `ORCHESTRATOR_BOOTSTRAP_TOKEN`: the first admin token, instead of
    /// one made and printed at the first start.
    pub bootstrap_token: Option<orchestrator_storage::Secret>,
    /// Where http steps may send requests; nowhere by default.
    pub http_allow: orchestrator_http::Allowlist,
    /// The API's connections: header timeout, connection and stream caps,
    /// trusted proxies, public names.
    pub network: orchestrator_api::HttpConfig,
    /// How much work one submission may ask for (`--max-step-instances`,
    /// `--max-workflow-tasks`, ...).
    pub limits: Limits,
    /// The config file the settings came from: scripts must not read it.
    pub config_file: Option<PathBuf>,
    pub script_sandbox: ScriptSandbox,
    /// Attempts one sandbox serves, one after another (1 to
    /// [`MAX_SANDBOX_ATTEMPTS`]).
    pub script_sandbox_attempts: u32,
    /// Whose attempts one sandbox serves in a row.
    pub script_sandbox_reuse: orchestrator_executor::SandboxReuse,
    /// What scripts may write besides their own dirs.
    pub script_writable: Vec<PathBuf>,
    pub testenv_provider: TestenvProvider,
    /// Where the secret key is read from, when not from the default places.
    pub secret_key_file: Option<PathBuf>,
    /// The `orchestrator` binary, whose `testenv-node-init` is each test
    /// node's first process: this executable (a test that runs the service
    /// inside its own binary names the real one). Not a setting of the
    /// file or the flags.
    pub node_init_program: Option<PathBuf>,
}

impl ServeSettings {
    /// The store to open: the configured one, unless a storage move
    /// switched this data dir to another (`<data-dir>/storage.json`), with
    /// that choice.
    pub fn store(
        &self,
    ) -> anyhow::Result<(
        orchestrator_storage::StorageConfig,
        Option<orchestrator_storage::live::BackendChoice>,
    )> {
        let configured = orchestrator_storage::StorageConfig {
            storage_type: self.storage_type,
            data_dir: self.data_dir.clone(),
            surrealdb: self.surrealdb.clone(),
        };
        let data_dir = std::path::absolute(&self.data_dir)
            .with_context(|| format!("--data-dir {}", self.data_dir.display()))?;
        orchestrator_storage::live::effective_config(&configured, &data_dir)
            .context("cannot choose the store")
    }

    /// Defaults for a data dir and scripts dir, as `serve` with no flags.
    pub fn new(data_dir: PathBuf, scripts_dir: PathBuf) -> ServeSettings {
        ServeConfig {
            data_dir,
            scripts_dir,
            ..ServeConfig::default()
        }
        .into_settings(None)
        .expect("the defaults are valid settings")
    }

    /// The settings of `serve` (and of the commands that take its flags):
    /// the layers merged, then checked.
    pub fn resolve(args: ServeArgs) -> anyhow::Result<ServeSettings> {
        let mut settings = ServeConfig::layered(&args)?.into_settings(args.config)?;
        // Only a variable: a flag would show it in `ps`, and the file is
        // for what stays.
        settings.bootstrap_token = std::env::var("ORCHESTRATOR_BOOTSTRAP_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
            .map(Secret::new);
        Ok(settings)
    }
}

/// `orchestrator serve --print-config`: the merged settings as TOML,
/// checked as `serve` checks them, secrets masked. Starts nothing.
pub fn print_config(args: ServeArgs) -> anyhow::Result<()> {
    print!("{}", printed_config(&args)?);
    Ok(())
}

/// What [`print_config`] prints.
pub fn printed_config(args: &ServeArgs) -> anyhow::Result<String> {
    let config = ServeConfig::layered(args)?;
    config.clone().into_settings(args.config.clone())?;
    toml::to_string(&config.masked()).context("cannot print the settings")
}

impl ServeConfig {
    /// The defaults, then the config file (`--config`), then the variables
    /// and flags that were given: each layer replaces the values the one
    /// below set, a list as a whole.
    pub fn layered(args: &ServeArgs) -> anyhow::Result<ServeConfig> {
        let mut layers = Figment::from(Serialized::defaults(ServeConfig::default()));
        if let Some(path) = &args.config {
            // figment would only say that it cannot read it, at the end.
            std::fs::File::open(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            layers = layers.merge(Toml::file_exact(path));
        }
        // The variables and flags are typed like the fields, so whatever
        // fails to fit is the file's.
        layers
            .merge(GivenArgs(args))
            .extract()
            // The key at fault and what is wrong with it; figment's own
            // text adds the profile and the provider, which say nothing here.
            .map_err(|e| match e.path.is_empty() {
                true => anyhow!("{}", e.kind),
                false => anyhow!("{}: {}", e.path.join("."), e.kind),
            })
            .with_context(|| match &args.config {
                Some(path) => format!("invalid config file {}", path.display()),
                None => "invalid settings".to_owned(),
            })
    }

    /// A copy safe to show: the SurrealDB password, and any user and
    /// password in its URL, become `***`.
    pub fn masked(&self) -> ServeConfig {
        ServeConfig {
            surrealdb_password: Secret::new(MASK),
            surrealdb_url: mask_url_credentials(&self.surrealdb_url),
            ..self.clone()
        }
    }

    /// Checks every value and builds what the service runs with. An error
    /// names the setting by its flag, and the value at fault.
    pub fn into_settings(self, config_file: Option<PathBuf>) -> anyhow::Result<ServeSettings> {
        let surrealdb = SurrealdbConfig {
            engine: self
                .surrealdb_engine
                .parse()
                .map_err(|e| anyhow!("--surrealdb-engine: {e}"))?,
            connect_timeout: whole_seconds(
                "--surrealdb-connect-timeout",
                self.surrealdb_connect_timeout,
            )?,
            request_timeout: whole_seconds(
                "--surrealdb-request-timeout",
                self.surrealdb_request_timeout,
            )?,
            url: self.surrealdb_url,
            username: self.surrealdb_username,
            password: self.surrealdb_password,
            namespace: self.surrealdb_namespace,
            database: self.surrealdb_database,
        };
        let network = orchestrator_api::HttpConfig {
            header_timeout: whole_seconds("--header-timeout", self.header_timeout)?,
            max_connections: at_least_one("--max-connections", self.max_connections)?,
            max_streams: at_least_one("--max-streams", self.max_streams)?,
            trusted_proxies: self
                .trusted_proxy
                .iter()
                .filter(|t| !t.trim().is_empty())
                .map(|t| orchestrator_api::parse_trusted_proxy(t))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow!("--trusted-proxy: {e}"))?,
            public_hosts: self
                .public_host
                .iter()
                .map(|h| h.trim())
                .filter(|h| !h.is_empty())
                .map(orchestrator_api::parse_public_host)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow!("--public-host: {e}"))?,
        };
        let limits = Limits {
            max_step_instances: at_least_one("--max-step-instances", self.max_step_instances)?,
            max_workflow_tasks: at_least_one("--max-workflow-tasks", self.max_workflow_tasks)?,
            max_template_steps: at_least_one("--max-template-steps", self.max_template_steps)?,
            max_list_items: at_least_one("--max-list-items", self.max_list_items)?,
            max_template_bytes: at_least_one("--max-template-bytes", self.max_template_bytes)?,
            max_input_bytes: at_least_one("--max-input-bytes", self.max_input_bytes)?,
        };
        // A template and inputs at their limits must fit in a request
        // body, else the body's limit would refuse them first, naming the
        // wrong limit.
        let body =
            (orchestrator_api::MAX_BODY_BYTES - orchestrator_api::BODY_OVERHEAD_BYTES) as u64;
        if limits
            .max_template_bytes
            .saturating_add(limits.max_input_bytes)
            > body
        {
            bail!(
                "--max-template-bytes ({}) and --max-input-bytes ({}) add up to more than the {body} bytes a request body may hold for them",
                limits.max_template_bytes,
                limits.max_input_bytes
            );
        }
        let storage_type = self
            .storage_type
            .parse::<StorageType>()
            .map_err(|e| anyhow!("--storage-type: {e}"))?;
        let log_format = match self.log_format.as_str() {
            "pretty" => LogFormat::Pretty,
            "json" => LogFormat::Json,
            other => bail!("--log-format: unknown format `{other}` (expected pretty or json)"),
        };
        let task_timeout = self.task_timeout;
        if !(1..=MAX_DURATION.as_secs()).contains(&task_timeout) {
            bail!(
                "--task-timeout: {task_timeout} is out of range: must be from 1 to {} seconds (30 days)",
                MAX_DURATION.as_secs()
            );
        }
        let http_allow = orchestrator_http::Allowlist::parse(&self.http_allow)
            .map_err(|e| anyhow!("--http-allow: {e}"))?;
        let script_sandbox = match self.script_sandbox.as_str() {
            "bubblewrap" => ScriptSandbox::Bubblewrap,
            "none" => ScriptSandbox::None,
            other => {
                bail!("--script-sandbox: unknown sandbox `{other}` (expected bubblewrap or none)")
            }
        };
        if !(1..=MAX_SANDBOX_ATTEMPTS).contains(&self.script_sandbox_attempts) {
            bail!(
                "--script-sandbox-attempts: {} is out of range: must be from 1 to {MAX_SANDBOX_ATTEMPTS}",
                self.script_sandbox_attempts
            );
        }
        let script_sandbox_reuse = match self.script_sandbox_reuse.as_str() {
            "submitter" => orchestrator_executor::SandboxReuse::Submitter,
            "workflow" => orchestrator_executor::SandboxReuse::Workflow,
            "any" => orchestrator_executor::SandboxReuse::Any,
            other => {
                bail!(
                    "--script-sandbox-reuse: unknown value `{other}` (expected submitter, workflow or any)"
                )
            }
        };
        if let Some(relative) = self.script_writable.iter().find(|p| !p.is_absolute()) {
            bail!(
                "--script-writable: `{}` must be an absolute path",
                relative.display()
            );
        }
        let testenv_provider = match self.testenv_provider.as_str() {
            "namespaces" => TestenvProvider::Namespaces,
            "docker" => TestenvProvider::Docker {
                host: self.docker_host,
                image: self.docker_image,
            },
            other => bail!(
                "--testenv-provider: unknown provider `{other}` (expected namespaces or docker)"
            ),
        };
        if let TestenvProvider::Docker { host, image } = &testenv_provider {
            let socket = host.strip_prefix("unix://").unwrap_or_default();
            if !socket.starts_with('/') {
                bail!("--docker-host: `{host}` is not unix:///<absolute path of a socket>");
            }
            if image.trim().is_empty() {
                bail!("--docker-image: is empty");
            }
        }
        if self.max_log_bytes < 1024 {
            bail!(
                "--max-log-bytes: {} is too small; give at least 1024",
                self.max_log_bytes
            );
        }
        let max_attempts = orchestrator_core::template::limits::MAX_WEBHOOK_ATTEMPTS;
        if !(1..=max_attempts).contains(&self.webhook_max_attempts) {
            bail!(
                "--webhook-max-attempts: {} is out of range: must be from 1 to {max_attempts}",
                self.webhook_max_attempts
            );
        }
        let retry_max = Duration::from_secs(600);
        let webhook_retry_base = Duration::from_millis(self.webhook_retry_base_ms);
        if webhook_retry_base.is_zero() || webhook_retry_base > retry_max {
            bail!(
                "--webhook-retry-base-ms: {} is out of range: must be from 1 to {}",
                self.webhook_retry_base_ms,
                retry_max.as_millis()
            );
        }
        let webhooks = orchestrator_engine::webhooks::WebhookConfig {
            max_attempts: self.webhook_max_attempts,
            backoff: orchestrator_core::backoff::Backoff::doubling(webhook_retry_base, retry_max),
            retain: match self.webhook_retain {
                Keep::Forever => Duration::MAX,
                Keep::For(period) => period,
            },
            ..Default::default()
        };
        let settings = ServeSettings {
            bind: self.bind,
            port: self.port,
            data_dir: self.data_dir,
            storage_type,
            surrealdb,
            scripts_dir: self.scripts_dir,
            templates_dir: self.templates_dir,
            workers: at_least_one("--workers", self.workers)?,
            max_attempts: at_least_one("--max-attempts", self.max_attempts)?,
            task_timeout: Duration::from_secs(task_timeout),
            retry: RetryPolicy {
                base_delay: Duration::from_millis(self.retry_base_ms),
                max_delay: Duration::from_millis(self.retry_max_ms),
            },
            shutdown_grace: Duration::from_secs(self.shutdown_grace),
            kill_grace: Duration::from_secs(self.kill_grace),
            max_log_bytes: self.max_log_bytes,
            node_id: self.node_id,
            lease: Duration::from_secs(at_least_one("--lease-secs", self.lease_secs)?),
            poll: Duration::from_millis(at_least_one("--poll-ms", self.poll_ms)?),
            log_format,
            interpreters: self.interpreters.into_iter().collect(),
            auth: !self.no_auth,
            secure_cookies: self.secure_cookies,
            rate_limit: self.rate_limit,
            retain_finished: self.retain_finished,
            retain_audit: self.retain_audit,
            webhooks,
            retention_every: Duration::from_secs(600),
            address_rate_limit: self.address_rate_limit,
            bootstrap_token: None,
            http_allow,
            network,
            limits,
            config_file,
            script_sandbox,
            script_sandbox_attempts: self.script_sandbox_attempts,
            script_sandbox_reuse,
            script_writable: self.script_writable,
            testenv_provider,
            secret_key_file: self.secret_key_file,
            node_init_program: None,
        };
        // Each is added to the clock somewhere (a lease to now, a retry
        // delay to a due time): bounded like every timeout, so that no
        // addition can overflow.
        for (flag, duration) in [
            ("--retry-base-ms", settings.retry.base_delay),
            ("--retry-max-ms", settings.retry.max_delay),
            ("--shutdown-grace", settings.shutdown_grace),
            ("--kill-grace", settings.kill_grace),
            ("--lease-secs", settings.lease),
            ("--poll-ms", settings.poll),
        ] {
            if duration > MAX_DURATION {
                bail!(
                    "{flag}: {} seconds is longer than the maximum of {} seconds (30 days)",
                    duration.as_secs(),
                    MAX_DURATION.as_secs()
                );
            }
        }
        Ok(settings)
    }
}

/// The most attempts one script sandbox may serve: what one attempt could
/// leave behind for the next stays bounded.
const MAX_SANDBOX_ATTEMPTS: u32 = 1000;

/// A count that must be at least 1.
fn at_least_one<N: PartialEq + Default>(flag: &str, value: N) -> anyhow::Result<N> {
    if value == N::default() {
        bail!("{flag}: must be at least 1");
    }
    Ok(value)
}

/// A timeout in seconds that must be at least 1.
fn whole_seconds(flag: &str, secs: u64) -> anyhow::Result<Duration> {
    if secs == 0 {
        bail!("{flag}: must be at least 1 second");
    }
    Ok(Duration::from_secs(secs))
}

/// `scheme://user:password@host/...` with what comes before the `@` of
/// its authority replaced by `***` (a user name alone may be a token).
fn mask_url_credentials(url: &str) -> String {
    let authority_start = url.find("://").map_or(0, |i| i + 3);
    let rest = &url[authority_start..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}{MASK}{}", &url[..authority_start], &rest[at..]),
        None => url.to_owned(),
    }
}

/// The layer of the variables and flags: only those given, so that an
/// absent flag (`None`, a `false` switch, an empty list) leaves the value
/// of the layers below. A switch can only turn its setting on.
struct GivenArgs<'a>(&'a ServeArgs);

impl Provider for GivenArgs<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::named("flags and ORCHESTRATOR_* variables")
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        let mut data = Serialized::defaults(self.0).data()?;
        for dict in data.values_mut() {
            dict.retain(|_, value| match value {
                Value::Empty(..) => false,
                Value::Bool(_, on) => *on,
                Value::Array(_, items) => !items.is_empty(),
                _ => true,
            });
        }
        Ok(data)
    }
}

/// A period in its largest whole unit (`90d` rather than humantime's
/// `2months 29days 2h 52m 48s`), which reads back as the same period.
fn period<S: Serializer>(keep: &Keep, serializer: S) -> Result<S::Ok, S::Error> {
    let Keep::For(duration) = keep else {
        return keep.serialize(serializer);
    };
    let secs = duration.as_secs();
    if secs == 0 || duration.subsec_nanos() != 0 {
        return keep.serialize(serializer);
    }
    let (count, unit) = [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")]
        .into_iter()
        .find(|(unit_secs, _)| secs % unit_secs == 0)
        .map_or((secs, "s"), |(unit_secs, unit)| (secs / unit_secs, unit));
    serializer.collect_str(&format_args!("{count}{unit}"))
}

/// A password as itself, for merging the layers (never for showing).
fn expose_secret<S: Serializer>(secret: &Secret, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(secret.expose())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// `orchestrator serve <flags>` through the real parser.
    fn serve_flags(flags: &[&str]) -> ServeArgs {
        let cli = Cli::try_parse_from(["orchestrator", "serve"].iter().chain(flags)).unwrap();
        match cli.command {
            Command::Serve(serve) => serve.settings,
            other => panic!("not serve: {other:?}"),
        }
    }

    fn config_file(dir: &tempfile::TempDir, text: &str) -> String {
        let path = dir.path().join("orchestrator.toml");
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    }

    #[test]
    fn each_layer_beats_the_one_below_for_every_kind_of_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "port = 9000\nworkers = 7\ndata_dir = \"/var/lib/orch\"\nnode_id = \"file-node\"\n\
             log_format = \"json\"\nno_auth = true\nhttp_allow = [\"a.example\", \"b.example\"]\n\
             surrealdb_password = \"file-secret\"\nretain_finished = \"30d\"\n",
        );
        // The file over the defaults.
        let from_file = ServeSettings::resolve(serve_flags(&["--config", &path])).unwrap();
        assert_eq!(from_file.port, 9000);
        assert_eq!(from_file.workers, 7);
        assert_eq!(from_file.data_dir, PathBuf::from("/var/lib/orch"));
        assert_eq!(from_file.node_id.as_deref(), Some("file-node"));
        assert_eq!(from_file.log_format, LogFormat::Json);
        assert!(!from_file.auth);
        assert_eq!(
            from_file.http_allow.to_string(),
            "allowed: a.example, b.example"
        );
        assert_eq!(from_file.surrealdb.password.expose(), "file-secret");
        assert_eq!(from_file.retain_finished, "30d".parse().unwrap());
        // What the file leaves out keeps its default.
        let defaults = ServeConfig::default();
        assert_eq!(from_file.scripts_dir, defaults.scripts_dir);
        assert_eq!(from_file.rate_limit, defaults.rate_limit);
        assert!(!from_file.secure_cookies);

        // The flags over the file: a number, a string, a list (replaced
        // whole), a secret, a period, a switch; the rest stays the file's.
        let from_flags = ServeSettings::resolve(serve_flags(&[
            "--config",
            &path,
            "--port",
            "9100",
            "--node-id",
            "flag-node",
            "--http-allow",
            "c.example",
            "--surrealdb-password",
            "flag-secret",
            "--retain-finished",
            "12h",
            "--secure-cookies",
        ]))
        .unwrap();
        assert_eq!(from_flags.port, 9100);
        assert_eq!(from_flags.node_id.as_deref(), Some("flag-node"));
        assert_eq!(from_flags.http_allow.to_string(), "allowed: c.example");
        assert_eq!(from_flags.surrealdb.password.expose(), "flag-secret");
        assert_eq!(from_flags.retain_finished, "12h".parse().unwrap());
        assert!(from_flags.secure_cookies);
        assert_eq!(from_flags.workers, 7);
        assert_eq!(from_flags.log_format, LogFormat::Json);
        // A switch not given does not turn the file's setting off.
        assert!(!from_flags.auth);

        // No file, no flags: the defaults.
        let settings = ServeSettings::resolve(serve_flags(&[])).unwrap();
        assert_eq!(settings.port, defaults.port);
        assert_eq!(settings.surrealdb.password.expose(), "root");
        assert!(settings.auth);
        assert!(settings.http_allow.is_empty());
    }

    #[test]
    fn printed_config_masks_secrets_and_reads_back_as_a_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = config_file(
            &dir,
            "surrealdb_url = \"ws://admin:url-secret@db.example:8000/rpc\"\n\
             surrealdb_password = \"file-secret\"\nsecret_key_file = \"/etc/orchestrator/secret-key\"\n\
             [interpreters]\nnu = \"/opt/nu\"\n",
        );
        let printed = printed_config(&serve_flags(&["--config", &path, "--port", "9100"])).unwrap();
        assert!(!printed.contains("file-secret"), "{printed}");
        assert!(!printed.contains("url-secret"), "{printed}");
        let shown: toml::Table = toml::from_str(&printed).unwrap();
        assert_eq!(shown["port"].as_integer(), Some(9100));
        assert_eq!(shown["surrealdb_password"].as_str(), Some("***"));
        assert_eq!(
            shown["surrealdb_url"].as_str(),
            Some("ws://***@db.example:8000/rpc")
        );
        // A key file's path is not a secret.
        assert_eq!(
            shown["secret_key_file"].as_str(),
            Some("/etc/orchestrator/secret-key")
        );
        assert_eq!(shown["interpreters"]["nu"].as_str(), Some("/opt/nu"));
        // What is printed is a config file that gives the same settings.
        let again = config_file(&dir, &printed);
        assert_eq!(
            printed_config(&serve_flags(&["--config", &again])).unwrap(),
            printed
        );
        // A bad value is refused, naming its setting, before anything is printed.
        let message = format!(
            "{:#}",
            printed_config(&serve_flags(&["--max-connections", "0"])).unwrap_err()
        );
        assert_eq!(message, "--max-connections: must be at least 1");
    }

    #[test]
    fn url_credentials_are_masked_whatever_their_form() {
        for (url, shown) in [
            ("ws://127.0.0.1:8000", "ws://127.0.0.1:8000"),
            ("surreal+ws://user:pass@host", "surreal+ws://***@host"),
            ("wss://token@db.example/rpc", "wss://***@db.example/rpc"),
            ("ws://u:p@ss@host:1/x@y", "ws://***@host:1/x@y"),
            (
                "ws://host/path@not-credentials",
                "ws://host/path@not-credentials",
            ),
            ("user:pass@host", "***@host"),
        ] {
            assert_eq!(mask_url_credentials(url), shown, "{url}");
        }
    }

    #[test]
    fn periods_print_in_their_largest_whole_unit_and_read_back() {
        for (given, shown) in [
            ("90d", "90d"),
            ("2w", "14d"),
            ("36h", "36h"),
            ("1h 30m", "90m"),
            ("61s", "61s"),
            ("forever", "forever"),
        ] {
            let config = ServeConfig {
                retain_audit: given.parse().unwrap(),
                ..ServeConfig::default()
            };
            let printed = toml::Table::try_from(&config).unwrap();
            assert_eq!(printed["retain_audit"].as_str(), Some(shown), "{given}");
            assert_eq!(
                shown.parse::<Keep>().unwrap(),
                config.retain_audit,
                "{given}"
            );
        }
    }

    /// The flags, their variables, their help's `[default: ...]`, the
    /// file's keys and the defaults all name the same settings.
    #[test]
    fn flags_variables_keys_and_defaults_agree() {
        let defaults = toml::Table::try_from(ServeConfig::default()).unwrap();
        let command = <ServeArgs as clap::Args>::augment_args(clap::Command::new("serve"));
        let mut keys_with_a_flag = Vec::new();
        for arg in command.get_arguments() {
            let Some(flag) = arg.get_long() else { continue };
            if flag == "config" {
                continue;
            }
            let key = flag.replace('-', "_");
            assert_eq!(
                arg.get_env().and_then(|v| v.to_str()),
                Some(format!("ORCHESTRATOR_{}", key.to_uppercase()).as_str()),
                "--{flag}"
            );
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let documented = help
                .split_once("[default: ")
                .map(|(_, rest)| rest.split([' ', ']']).next().unwrap_or_default())
                .map(|word| word.trim_end_matches([':', ',', ';']));
            let default = match defaults.get(&key) {
                Some(toml::Value::String(text)) => Some(text.clone()),
                Some(toml::Value::Integer(n)) => Some(n.to_string()),
                Some(toml::Value::Array(items)) if items.is_empty() => Some("none".to_owned()),
                Some(toml::Value::Boolean(_)) | None => None,
                Some(other) => panic!("--{flag}: no rule for a default like {other}"),
            };
            assert!(
                defaults.contains_key(&key) || ["node_id", "secret_key_file"].contains(&&*key),
                "--{flag} has no config file key"
            );
            // The number of CPUs is this machine's.
            if let (Some(documented), Some(default), false) =
                (documented, default, key == "workers")
            {
                assert_eq!(documented, default, "--{flag}: {help}");
            }
            keys_with_a_flag.push(key);
        }
        for key in defaults.keys() {
            assert!(
                keys_with_a_flag.contains(key) || key == "interpreters",
                "`{key}` has no flag"
            );
        }
        // docs/configuration.md has a row for each.
        let docs = include_str!("../../../docs/configuration.md");
        for key in keys_with_a_flag {
            let flag = format!("`--{}", key.replace('_', "-"));
            let variable = format!("`ORCHESTRATOR_{}`", key.to_uppercase());
            let key = format!("`{key}`");
            assert!(
                docs.lines().any(|row| row.contains(&flag)
                    && row.contains(&variable)
                    && row.contains(&key)),
                "docs/configuration.md has no row for {key}"
            );
        }
    }

    #[test]
    fn bad_values_name_their_setting() {
        let cases = [
            (
                ServeArgs {
                    storage_type: Some("mysql".into()),
                    ..Default::default()
                },
                "--storage-type",
            ),
            (
                ServeArgs {
                    workers: Some(0),
                    ..Default::default()
                },
                "--workers",
            ),
            (
                ServeArgs {
                    log_format: Some("xml".into()),
                    ..Default::default()
                },
                "--log-format",
            ),
            (
                ServeArgs {
                    config: Some("/nonexistent.toml".into()),
                    ..Default::default()
                },
                "/nonexistent.toml",
            ),
            (
                ServeArgs {
                    lease_secs: Some(u64::MAX),
                    ..Default::default()
                },
                "--lease-secs: 18446744073709551615 seconds is longer than the maximum",
            ),
            (
                ServeArgs {
                    max_step_instances: Some(0),
                    ..Default::default()
                },
                "--max-step-instances: must be at least 1",
            ),
            (
                ServeArgs {
                    task_timeout: Some(u64::MAX),
                    ..Default::default()
                },
                "--task-timeout: 18446744073709551615 is out of range",
            ),
            (
                ServeArgs {
                    script_sandbox_attempts: Some(0),
                    ..Default::default()
                },
                "--script-sandbox-attempts: 0 is out of range: must be from 1 to 1000",
            ),
            (
                ServeArgs {
                    script_sandbox_attempts: Some(1001),
                    ..Default::default()
                },
                "--script-sandbox-attempts: 1001 is out of range",
            ),
            // A template at its limit would not fit in a request body.
            (
                ServeArgs {
                    max_template_bytes: Some(2 * 1024 * 1024),
                    ..Default::default()
                },
                "--max-template-bytes (2097152) and --max-input-bytes (65536) add up to more than",
            ),
        ];
        for (args, expected) in cases {
            let message = format!("{:#}", ServeSettings::resolve(args).unwrap_err());
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn surrealdb_settings_come_from_flags_and_the_file_and_hide_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orchestrator.toml");
        std::fs::write(
            &path,
            "storage_type = \"surrealdb-server\"\nsurrealdb_url = \"ws://db:8000\"\n\
             surrealdb_password = \"from-the-file\"\nsurrealdb_namespace = \"ops\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path),
            surrealdb_database: Some("prod".into()),
            surrealdb_connect_timeout: Some(3),
            ..Default::default()
        };
        let settings = ServeSettings::resolve(args).unwrap();
        assert_eq!(settings.storage_type, StorageType::SurrealdbServer);
        let surreal = &settings.surrealdb;
        assert_eq!(surreal.url, "ws://db:8000");
        assert_eq!(surreal.username, "root");
        assert_eq!(surreal.password.expose(), "from-the-file");
        assert_eq!(
            (surreal.namespace.as_str(), surreal.database.as_str()),
            ("ops", "prod")
        );
        assert_eq!(surreal.connect_timeout, Duration::from_secs(3));
        assert!(!format!("{settings:?}").contains("from-the-file"));

        let args = ServeArgs {
            surrealdb_password: Some("from-the-flag".parse().unwrap()),
            ..Default::default()
        };
        let settings = ServeSettings::resolve(args).unwrap();
        assert_eq!(settings.surrealdb.password.expose(), "from-the-flag");
        assert!(!format!("{settings:?}").contains("from-the-flag"));

        for (args, expected) in [
            (
                ServeArgs {
                    surrealdb_engine: Some("leveldb".into()),
                    ..Default::default()
                },
                "--surrealdb-engine: unknown embedded engine `leveldb`",
            ),
            (
                ServeArgs {
                    surrealdb_connect_timeout: Some(0),
                    ..Default::default()
                },
                "--surrealdb-connect-timeout",
            ),
        ] {
            let message = format!("{:#}", ServeSettings::resolve(args).unwrap_err());
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn the_http_allowlist_comes_from_flags_or_the_file_and_is_empty_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orchestrator.toml");
        std::fs::write(
            &path,
            "http_allow = [\"awx.example.com\", \"127.0.0.1:8081\"]\n",
        )
        .unwrap();
        let from_file = ServeSettings::resolve(ServeArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            from_file.http_allow.to_string(),
            "allowed: awx.example.com, 127.0.0.1:8081"
        );
        let from_flags = ServeSettings::resolve(ServeArgs {
            config: Some(path),
            http_allow: vec!["tfc.example.com:443".into()],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            from_flags.http_allow.to_string(),
            "allowed: tfc.example.com:443"
        );
        assert!(
            ServeSettings::resolve(ServeArgs::default())
                .unwrap()
                .http_allow
                .is_empty()
        );
        let message = format!(
            "{:#}",
            ServeSettings::resolve(ServeArgs {
                http_allow: vec!["https://x".into()],
                ..Default::default()
            })
            .unwrap_err()
        );
        assert!(message.contains("--http-allow: `https://x`"), "{message}");
    }

    #[test]
    fn network_settings_come_from_flags_or_the_file_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orchestrator.toml");
        std::fs::write(
            &path,
            "max_connections = 300\ntrusted_proxy = [\"10.0.0.5\"]\npublic_host = [\"orch.example.com\"]\n",
        )
        .unwrap();
        let settings = ServeSettings::resolve(ServeArgs {
            config: Some(path.clone()),
            trusted_proxy: vec!["127.0.0.1/32".into(), "::1".into()],
            header_timeout: Some(5),
            ..Default::default()
        })
        .unwrap();
        let network = &settings.network;
        assert_eq!(network.max_connections, 300);
        assert_eq!(network.header_timeout, Duration::from_secs(5));
        assert_eq!(network.max_streams, orchestrator_api::DEFAULT_MAX_STREAMS);
        let proxies: Vec<String> = network
            .trusted_proxies
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(
            proxies,
            ["127.0.0.1/32", "::1/128"],
            "the flags replace the file's list"
        );
        assert_eq!(network.public_hosts, ["orch.example.com"]);
        for (args, expected) in [
            (
                ServeArgs {
                    trusted_proxy: vec!["proxy.example".into()],
                    ..Default::default()
                },
                "--trusted-proxy: `proxy.example`",
            ),
            (
                ServeArgs {
                    public_host: vec!["https://x".into()],
                    ..Default::default()
                },
                "--public-host: `https://x`",
            ),
            (
                ServeArgs {
                    max_connections: Some(0),
                    ..Default::default()
                },
                "--max-connections",
            ),
            (
                ServeArgs {
                    header_timeout: Some(0),
                    ..Default::default()
                },
                "--header-timeout",
            ),
        ] {
            let message = format!("{:#}", ServeSettings::resolve(args).unwrap_err());
            assert!(message.contains(expected), "{message}");
        }
    }

    #[test]
    fn limits_come_from_flags_or_the_file_with_safe_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orchestrator.toml");
        std::fs::write(&path, "max_step_instances = 50\nmax_list_items = 60\n").unwrap();
        let settings = ServeSettings::resolve(ServeArgs {
            config: Some(path),
            max_list_items: Some(70),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(settings.limits.max_step_instances, 50);
        assert_eq!(
            settings.limits.max_list_items, 70,
            "the flag beats the file"
        );
        assert_eq!(
            settings.limits.max_workflow_tasks,
            Limits::default().max_workflow_tasks
        );
    }

    #[test]
    fn unknown_config_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "prot = 1\n").unwrap();
        let args = ServeArgs {
            config: Some(path),
            ..Default::default()
        };
        let message = format!("{:#}", ServeSettings::resolve(args).unwrap_err());
        assert!(message.contains("prot"), "{message}");
    }
}
