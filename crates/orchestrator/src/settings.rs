//! Service settings: command-line flags and `ORCHESTRATOR_*` variables
//! (both through clap), then the TOML config file, then defaults.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use orchestrator_core::RetryPolicy;
use orchestrator_core::retention::Keep;
use orchestrator_core::template::{Limits, MAX_DURATION};
use orchestrator_storage::{StorageType, SurrealdbConfig};
use serde::Deserialize;

use crate::cli::ServeArgs;

/// The config file. Every key is optional and named like its flag, with
/// underscores (`data_dir`, `storage_type`, ...).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub port: Option<u16>,
    pub bind: Option<IpAddr>,
    pub data_dir: Option<PathBuf>,
    pub storage_type: Option<String>,
    pub scripts_dir: Option<PathBuf>,
    pub templates_dir: Option<PathBuf>,
    pub workers: Option<usize>,
    pub max_attempts: Option<u32>,
    pub task_timeout: Option<u64>,
    pub retry_base_ms: Option<u64>,
    pub retry_max_ms: Option<u64>,
    pub shutdown_grace: Option<u64>,
    pub kill_grace: Option<u64>,
    pub max_log_bytes: Option<u64>,
    pub node_id: Option<String>,
    pub lease_secs: Option<u64>,
    pub poll_ms: Option<u64>,
    pub log_format: Option<String>,
    pub no_auth: Option<bool>,
    pub secure_cookies: Option<bool>,
    pub rate_limit: Option<u32>,
    pub retain_finished: Option<Keep>,
    pub retain_audit: Option<Keep>,
    pub address_rate_limit: Option<u32>,
    pub surrealdb_url: Option<String>,
    pub surrealdb_username: Option<String>,
    pub surrealdb_password: Option<orchestrator_storage::Secret>,
    pub surrealdb_namespace: Option<String>,
    pub surrealdb_database: Option<String>,
    pub surrealdb_engine: Option<String>,
    pub surrealdb_connect_timeout: Option<u64>,
    pub surrealdb_request_timeout: Option<u64>,
    /// Interpreter per script extension, e.g. `nu = "/opt/nu/bin/nu"`.
    #[serde(default)]
    pub interpreters: HashMap<String, PathBuf>,
    /// Hosts http steps may reach: `["awx.example.com", "127.0.0.1:8081"]`.
    pub http_allow: Option<Vec<String>>,
    // Connections, proxies and names (`HttpConfig`).
    pub header_timeout: Option<u64>,
    pub max_connections: Option<usize>,
    pub max_streams: Option<usize>,
    /// `["10.0.0.5", "192.168.0.0/16"]`.
    pub trusted_proxy: Option<Vec<String>>,
    /// `["orchestrator.example.com"]`.
    pub public_host: Option<Vec<String>>,
    // Limits on the work of one submission.
    pub max_step_instances: Option<u64>,
    pub max_workflow_tasks: Option<u64>,
    pub max_template_steps: Option<u64>,
    pub max_list_items: Option<u64>,
    pub max_template_bytes: Option<u64>,
    pub max_input_bytes: Option<u64>,
    /// `bubblewrap` or `none`.
    pub script_sandbox: Option<String>,
    /// Paths scripts may write in the sandbox.
    pub script_writable: Option<Vec<PathBuf>>,
    pub secret_key_file: Option<PathBuf>,
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
    /// What scripts may write besides their own dirs.
    pub script_writable: Vec<PathBuf>,
    /// Where the secret key is read from, when not from the default places.
    pub secret_key_file: Option<PathBuf>,
}

impl ServeSettings {
    /// The store to open: the configured one, unless a live migration
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
        ServeSettings {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 8080,
            data_dir,
            storage_type: StorageType::Filesystem,
            surrealdb: SurrealdbConfig::default(),
            scripts_dir,
            templates_dir: PathBuf::from("./templates"),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_attempts: 3,
            task_timeout: Duration::from_secs(3600),
            retry: RetryPolicy::default(),
            shutdown_grace: Duration::from_secs(30),
            kill_grace: Duration::from_secs(10),
            max_log_bytes: orchestrator_executor::DEFAULT_MAX_LOG_BYTES,
            node_id: None,
            lease: Duration::from_secs(15),
            poll: Duration::from_secs(1),
            log_format: LogFormat::Pretty,
            interpreters: HashMap::new(),
            auth: true,
            secure_cookies: false,
            rate_limit: 50,
            retain_finished: Keep::Forever,
            retain_audit: Keep::Forever,
            retention_every: Duration::from_secs(600),
            address_rate_limit: 200,
            bootstrap_token: None,
            http_allow: orchestrator_http::Allowlist::default(),
            network: orchestrator_api::HttpConfig::default(),
            limits: Limits::default(),
            config_file: None,
            script_sandbox: ScriptSandbox::Bubblewrap,
            script_writable: Vec::new(),
            secret_key_file: None,
        }
    }

    pub fn resolve(args: ServeArgs) -> anyhow::Result<ServeSettings> {
        let file = match &args.config {
            Some(path) => read_config_file(path)?,
            None => FileConfig::default(),
        };
        let defaults = ServeSettings::new(PathBuf::from("./data"), PathBuf::from("./scripts"));
        let surrealdb = resolve_surrealdb(&args, &file, defaults.surrealdb.clone())?;
        let network = resolve_network(&args, &file, defaults.network.clone())?;
        let limits = resolve_limits(&args, &file, defaults.limits)?;
        let storage_type = match args.storage_type.or(file.storage_type) {
            Some(name) => name
                .parse::<StorageType>()
                .map_err(|e| anyhow::anyhow!("--storage-type: {e}"))?,
            None => defaults.storage_type,
        };
        let log_format = match args.log_format.or(file.log_format).as_deref() {
            None | Some("pretty") => LogFormat::Pretty,
            Some("json") => LogFormat::Json,
            Some(other) => {
                bail!("--log-format: unknown format `{other}` (expected pretty or json)")
            }
        };
        let workers = args.workers.or(file.workers).unwrap_or(defaults.workers);
        if workers == 0 {
            bail!("--workers: must be at least 1");
        }
        let max_attempts = args
            .max_attempts
            .or(file.max_attempts)
            .unwrap_or(defaults.max_attempts);
        if max_attempts == 0 {
            bail!("--max-attempts: must be at least 1");
        }
        let task_timeout = args.task_timeout.or(file.task_timeout);
        if let Some(secs) = task_timeout.filter(|s| !(1..=MAX_DURATION.as_secs()).contains(s)) {
            bail!(
                "--task-timeout: {secs} is out of range: must be from 1 to {} seconds (30 days)",
                MAX_DURATION.as_secs()
            );
        }
        // Flags (or the variable) replace the file's list rather than add
        // to it, as every other setting does.
        let http_allow = if args.http_allow.is_empty() {
            file.http_allow.clone().unwrap_or_default()
        } else {
            args.http_allow.clone()
        };
        let http_allow = orchestrator_http::Allowlist::parse(&http_allow)
            .map_err(|e| anyhow::anyhow!("--http-allow: {e}"))?;
        let script_sandbox = match args
            .script_sandbox
            .as_deref()
            .or(file.script_sandbox.as_deref())
        {
            None | Some("bubblewrap") => ScriptSandbox::Bubblewrap,
            Some("none") => ScriptSandbox::None,
            Some(other) => {
                bail!("--script-sandbox: unknown sandbox `{other}` (expected bubblewrap or none)")
            }
        };
        let script_writable = if args.script_writable.is_empty() {
            file.script_writable.clone().unwrap_or_default()
        } else {
            args.script_writable.clone()
        };
        if let Some(relative) = script_writable.iter().find(|p| !p.is_absolute()) {
            bail!(
                "--script-writable: `{}` must be an absolute path",
                relative.display()
            );
        }
        let retry = RetryPolicy {
            base_delay: args
                .retry_base_ms
                .or(file.retry_base_ms)
                .map_or(defaults.retry.base_delay, Duration::from_millis),
            max_delay: args
                .retry_max_ms
                .or(file.retry_max_ms)
                .map_or(defaults.retry.max_delay, Duration::from_millis),
        };
        let settings = ServeSettings {
            bind: args.bind.or(file.bind).unwrap_or(defaults.bind),
            port: args.port.or(file.port).unwrap_or(defaults.port),
            data_dir: args.data_dir.or(file.data_dir).unwrap_or(defaults.data_dir),
            storage_type,
            surrealdb,
            scripts_dir: args
                .scripts_dir
                .or(file.scripts_dir)
                .unwrap_or(defaults.scripts_dir),
            templates_dir: args
                .templates_dir
                .or(file.templates_dir)
                .unwrap_or(defaults.templates_dir),
            workers,
            max_attempts,
            task_timeout: task_timeout.map_or(defaults.task_timeout, Duration::from_secs),
            retry,
            shutdown_grace: args
                .shutdown_grace
                .or(file.shutdown_grace)
                .map_or(defaults.shutdown_grace, Duration::from_secs),
            kill_grace: args
                .kill_grace
                .or(file.kill_grace)
                .map_or(defaults.kill_grace, Duration::from_secs),
            max_log_bytes: match args.max_log_bytes.or(file.max_log_bytes) {
                Some(bytes) if bytes < 1024 => {
                    bail!("--max-log-bytes: {bytes} is too small; give at least 1024")
                }
                Some(bytes) => bytes,
                None => defaults.max_log_bytes,
            },
            node_id: args.node_id.or(file.node_id),
            lease: match args.lease_secs.or(file.lease_secs) {
                Some(0) => bail!("--lease-secs: must be at least 1"),
                Some(secs) => Duration::from_secs(secs),
                None => defaults.lease,
            },
            poll: match args.poll_ms.or(file.poll_ms) {
                Some(0) => bail!("--poll-ms: must be at least 1"),
                Some(ms) => Duration::from_millis(ms),
                None => defaults.poll,
            },
            log_format,
            interpreters: file.interpreters,
            auth: !(args.no_auth || file.no_auth.unwrap_or(false)),
            secure_cookies: args.secure_cookies || file.secure_cookies.unwrap_or(false),
            rate_limit: args
                .rate_limit
                .or(file.rate_limit)
                .unwrap_or(defaults.rate_limit),
            retain_finished: args
                .retain_finished
                .or(file.retain_finished)
                .unwrap_or(defaults.retain_finished),
            retain_audit: args
                .retain_audit
                .or(file.retain_audit)
                .unwrap_or(defaults.retain_audit),
            retention_every: defaults.retention_every,
            address_rate_limit: args
                .address_rate_limit
                .or(file.address_rate_limit)
                .unwrap_or(defaults.address_rate_limit),
            bootstrap_token: std::env::var("ORCHESTRATOR_BOOTSTRAP_TOKEN")
                .ok()
                .filter(|t| !t.is_empty())
                .map(orchestrator_storage::Secret::new),
            http_allow,
            network,
            limits,
            config_file: args.config.clone(),
            script_sandbox,
            script_writable,
            secret_key_file: args.secret_key_file.or(file.secret_key_file),
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

/// The limits on one submission, flag over variable over file over
/// default; each at least 1, and a template and inputs at their limits
/// must fit in a request body (else the body's limit would refuse them
/// first, naming the wrong limit).
fn resolve_limits(args: &ServeArgs, file: &FileConfig, defaults: Limits) -> anyhow::Result<Limits> {
    let pick =
        |flag: &'static str, arg: Option<u64>, key: Option<u64>, default: u64| match arg.or(key) {
            Some(0) => bail!("{flag}: must be at least 1"),
            Some(n) => Ok(n),
            None => Ok(default),
        };
    let limits = Limits {
        max_step_instances: pick(
            "--max-step-instances",
            args.max_step_instances,
            file.max_step_instances,
            defaults.max_step_instances,
        )?,
        max_workflow_tasks: pick(
            "--max-workflow-tasks",
            args.max_workflow_tasks,
            file.max_workflow_tasks,
            defaults.max_workflow_tasks,
        )?,
        max_template_steps: pick(
            "--max-template-steps",
            args.max_template_steps,
            file.max_template_steps,
            defaults.max_template_steps,
        )?,
        max_list_items: pick(
            "--max-list-items",
            args.max_list_items,
            file.max_list_items,
            defaults.max_list_items,
        )?,
        max_template_bytes: pick(
            "--max-template-bytes",
            args.max_template_bytes,
            file.max_template_bytes,
            defaults.max_template_bytes,
        )?,
        max_input_bytes: pick(
            "--max-input-bytes",
            args.max_input_bytes,
            file.max_input_bytes,
            defaults.max_input_bytes,
        )?,
    };
    let body = (orchestrator_api::MAX_BODY_BYTES - orchestrator_api::BODY_OVERHEAD_BYTES) as u64;
    let sizes = limits
        .max_template_bytes
        .saturating_add(limits.max_input_bytes);
    if sizes > body {
        bail!(
            "--max-template-bytes ({}) and --max-input-bytes ({}) add up to more than the {body} bytes a request body may hold for them",
            limits.max_template_bytes,
            limits.max_input_bytes
        );
    }
    Ok(limits)
}

/// The API's connection settings, flag over variable over file over
/// default. Lists from flags replace the file's, as `--http-allow` does.
fn resolve_network(
    args: &ServeArgs,
    file: &FileConfig,
    defaults: orchestrator_api::HttpConfig,
) -> anyhow::Result<orchestrator_api::HttpConfig> {
    let list = |flag: &Vec<String>, key: &Option<Vec<String>>| {
        if flag.is_empty() {
            key.clone().unwrap_or_default()
        } else {
            flag.clone()
        }
    };
    let at_least_one = |flag: &'static str, value: Option<usize>, default: usize| match value {
        Some(0) => bail!("{flag}: must be at least 1"),
        Some(n) => Ok(n),
        None => Ok(default),
    };
    let trusted_proxies = list(&args.trusted_proxy, &file.trusted_proxy)
        .iter()
        .filter(|t| !t.trim().is_empty())
        .map(|t| orchestrator_api::parse_trusted_proxy(t))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--trusted-proxy: {e}"))?;
    let public_hosts = list(&args.public_host, &file.public_host)
        .into_iter()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .map(|h| orchestrator_api::parse_public_host(&h))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--public-host: {e}"))?;
    Ok(orchestrator_api::HttpConfig {
        header_timeout: match args.header_timeout.or(file.header_timeout) {
            Some(0) => bail!("--header-timeout: must be at least 1 second"),
            Some(secs) => Duration::from_secs(secs),
            None => defaults.header_timeout,
        },
        max_connections: at_least_one(
            "--max-connections",
            args.max_connections.or(file.max_connections),
            defaults.max_connections,
        )?,
        max_streams: at_least_one(
            "--max-streams",
            args.max_streams.or(file.max_streams),
            defaults.max_streams,
        )?,
        trusted_proxies,
        public_hosts,
    })
}

/// The `--surrealdb-*` settings, flag over variable over file over default.
fn resolve_surrealdb(
    args: &ServeArgs,
    file: &FileConfig,
    defaults: SurrealdbConfig,
) -> anyhow::Result<SurrealdbConfig> {
    let text = |flag: &Option<String>, key: &Option<String>, default: String| {
        flag.clone().or_else(|| key.clone()).unwrap_or(default)
    };
    let engine = match args
        .surrealdb_engine
        .as_ref()
        .or(file.surrealdb_engine.as_ref())
    {
        Some(name) => name
            .parse()
            .map_err(|e| anyhow::anyhow!("--surrealdb-engine: {e}"))?,
        None => defaults.engine,
    };
    let seconds = |flag: &'static str, value: Option<u64>, default: Duration| match value {
        Some(0) => bail!("{flag}: must be at least 1 second"),
        Some(secs) => Ok(Duration::from_secs(secs)),
        None => Ok(default),
    };
    Ok(SurrealdbConfig {
        url: text(&args.surrealdb_url, &file.surrealdb_url, defaults.url),
        username: text(
            &args.surrealdb_username,
            &file.surrealdb_username,
            defaults.username,
        ),
        password: args
            .surrealdb_password
            .clone()
            .or_else(|| file.surrealdb_password.clone())
            .unwrap_or(defaults.password),
        namespace: text(
            &args.surrealdb_namespace,
            &file.surrealdb_namespace,
            defaults.namespace,
        ),
        database: text(
            &args.surrealdb_database,
            &file.surrealdb_database,
            defaults.database,
        ),
        engine,
        connect_timeout: seconds(
            "--surrealdb-connect-timeout",
            args.surrealdb_connect_timeout
                .or(file.surrealdb_connect_timeout),
            defaults.connect_timeout,
        )?,
        request_timeout: seconds(
            "--surrealdb-request-timeout",
            args.surrealdb_request_timeout
                .or(file.surrealdb_request_timeout),
            defaults.request_timeout,
        )?,
    })
}

fn read_config_file(path: &Path) -> anyhow::Result<FileConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_the_file_which_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orchestrator.toml");
        std::fs::write(&path, "port = 9000\nworkers = 7\ndata_dir = \"/var/lib/orch\"\n[interpreters]\nnu = \"/opt/nu\"\n").unwrap();
        let args = ServeArgs {
            config: Some(path),
            port: Some(9100),
            ..Default::default()
        };
        let settings = ServeSettings::resolve(args).unwrap();
        assert_eq!(settings.port, 9100);
        assert_eq!(settings.workers, 7);
        assert_eq!(settings.data_dir, PathBuf::from("/var/lib/orch"));
        assert_eq!(settings.scripts_dir, PathBuf::from("./scripts"));
        assert_eq!(settings.interpreters["nu"], PathBuf::from("/opt/nu"));
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
