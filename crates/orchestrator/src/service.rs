//! `orchestrator serve`: open storage, start the engine, serve HTTP, and
//! shut down gracefully on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, bail};
use orchestrator_engine::steps::Steps;
use orchestrator_engine::templates::Templates;
use orchestrator_engine::{Engine, EngineConfig, RetentionConfig};
use orchestrator_executor::{ExecutorConfig, Sandbox, ScriptExecutor};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cli::ServeArgs;
use crate::settings::{LogFormat, ServeSettings, TestenvProvider};

/// A running service: its address, and the means to stop it.
pub struct ServiceHandle {
    pub addr: SocketAddr,
    pub engine: Engine,
    pub testenvs: orchestrator_testenv::TestEnvs,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl ServiceHandle {
    /// Begins a graceful shutdown and waits for it to finish.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.stop.cancel();
        self.task.await.context("service task panicked")?
    }

    /// Waits until the service stops on its own (a signal).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await.context("service task panicked")?
    }
}

/// Opens storage, starts the engine and binds the listener. The service
/// runs in the background until [`ServiceHandle::shutdown`].
pub async fn start(settings: ServeSettings) -> anyhow::Result<ServiceHandle> {
    start_with_store(settings, |storage| storage).await
}

/// [`start`], with the opened store passed through `wrap` before the
/// engine sees it: the tests' fault-injection layer goes here.
pub async fn start_with_store(
    settings: ServeSettings,
    wrap: impl FnOnce(orchestrator_storage::Storage) -> orchestrator_storage::Storage,
) -> anyhow::Result<ServiceHandle> {
    // Scripts get absolute paths whatever their own cwd becomes.
    let data_dir = std::path::absolute(&settings.data_dir)
        .with_context(|| format!("--data-dir {}", settings.data_dir.display()))?;
    if !settings.auth && !settings.bind.is_loopback() {
        bail!(
            "--no-auth is allowed only on a loopback address, and --bind is {}: anyone who can \
             reach it could run and cancel work; bind 127.0.0.1 (or ::1), or keep auth on",
            settings.bind
        );
    }
    // Bound first: scripts are told the address to reach the API at.
    let listener = TcpListener::bind((settings.bind, settings.port))
        .await
        .with_context(|| format!("cannot listen on {}:{}", settings.bind, settings.port))?;
    let addr = listener.local_addr().context("listener address")?;
    // A storage move may have switched this data dir to another store
    // than the configured one: `storage.json` says which.
    let (config, choice) = settings.store()?;
    if let Some(choice) = &choice
        && config.storage_type != settings.storage_type
    {
        tracing::info!(
            store = %choice.store,
            configured = %settings.storage_type,
            migration = %choice.migration,
            "opening the store a storage move switched this service to"
        );
    }
    let storage = orchestrator_storage::open(&config)
        .await
        .map_err(|e| match e {
            orchestrator_storage::Error::SignIn { .. } => {
                anyhow::anyhow!("{e}; check --surrealdb-username and --surrealdb-password")
            }
            other => other.into(),
        })
        .context("cannot open storage")?;
    let (storage, live) =
        orchestrator_storage::live::wrap(storage, config.clone(), &data_dir, choice.as_ref())
            .context("cannot read the storage moves' state")?;
    // Metrics: the process's recorder is installed before any work starts,
    // and every storage call is timed whatever the backend.
    orchestrator_api::prometheus::handle();
    let storage = orchestrator_storage::timed::TimedBackend::wrap(wrap(storage));
    let state_dir = crate::sandbox::state_dir(&data_dir)?;
    let sandbox = crate::sandbox::script_sandbox(&settings, &data_dir)?;
    if let Sandbox::Bubblewrap(bwrap) = &sandbox {
        bwrap
            .probe(&settings.scripts_dir, &state_dir)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "the script sandbox does not work here: {e}; see docs/deployment.md, \
                     `orchestrator doctor`, or --script-sandbox none (unsafe)"
                )
            })?;
    }
    let executor = ScriptExecutor::new(ExecutorConfig {
        scripts_dir: settings.scripts_dir.clone(),
        work_dir: data_dir.join("work"),
        data_dir: state_dir,
        kill_grace: settings.kill_grace,
        interpreters: settings.interpreters.clone(),
        service_url: Some(format!("http://{}", reachable(addr))),
        sandbox,
    })
    .context("--scripts-dir")?
    .with_max_log_bytes(settings.max_log_bytes);
    // Sandboxes made ahead of the attempts, one per worker, with the
    // helper that waits in them.
    let executor = match crate::sandbox::prepared_helper() {
        Some(helper) => executor.prepare_sandboxes(
            helper,
            settings.workers,
            settings.script_sandbox_attempts,
            settings.script_sandbox_reuse,
        ),
        None => executor,
    };
    // Test environments: their step kind runs the same provisioning scripts
    // inside the nodes, resolved like the `script` kind's.
    let catalog = Arc::new(
        orchestrator_testenv::Catalog::load(&settings.scripts_dir, Some(&settings.templates_dir))
            .map_err(|e| anyhow::anyhow!(e))
            .context("cannot load the test environment topologies and taskservs")?,
    );
    let node_id = node_id(&settings, &data_dir)?;
    let tag = orchestrator_testenv::model::service_tag(&node_id);
    let provider: Arc<dyn orchestrator_testenv::Provider> = match &settings.testenv_provider {
        TestenvProvider::Namespaces => Arc::new(node_provider(&settings, &data_dir)?),
        TestenvProvider::Docker { host, image } => Arc::new(
            orchestrator_testenv::DockerProvider::new(host, image, &settings.scripts_dir)
                .map_err(|e| anyhow::anyhow!(e))
                .context("--testenv-provider docker")?,
        ),
    };
    let node_runner = orchestrator_testenv::NodeRunner::new(
        provider,
        executor.clone(),
        data_dir.join("testenv"),
        catalog.clone(),
        tag.clone(),
    );
    let steps = step_kinds(executor, &settings.http_allow)?.with(Arc::new(node_runner.clone()));
    let templates =
        Templates::load(Some(&settings.templates_dir), &steps).context("cannot load templates")?;
    let engine = Engine::start_with_steps(
        storage,
        steps,
        templates,
        EngineConfig {
            workers: settings.workers,
            default_max_attempts: settings.max_attempts,
            default_timeout: settings.task_timeout,
            retry: settings.retry,
            node_id: node_id.clone(),
            address: format!("http://{}", reachable(addr)),
            lease: settings.lease,
            poll: settings.poll,
            access: orchestrator_engine::access::AccessConfig {
                auth: settings.auth,
                rate_limit: settings.rate_limit,
                address_rate_limit: settings.address_rate_limit,
                secret_key: Some(secret_key(&data_dir, settings.secret_key_file.as_deref())?),
                secure_cookies: settings.secure_cookies,
            },
            retention: RetentionConfig {
                finished: settings.retain_finished,
                audit: settings.retain_audit,
                every: settings.retention_every,
            },
            limits: settings.limits,
            ..EngineConfig::default()
        },
    )
    .await
    .context("cannot start the engine")?;
    engine.attach_live_migrations(live);
    // Webhooks reach the hosts http steps may reach, and no others.
    let webhook_client = orchestrator_http::WebhookClient::new(settings.http_allow.clone())
        .map_err(|e| anyhow::anyhow!(e))?;
    engine.attach_webhooks(
        Arc::new(WebhookSender(webhook_client)),
        settings.webhooks.clone(),
    );
    announce_access(&engine, &settings).await?;
    let testenvs = orchestrator_testenv::TestEnvs::start(engine.clone(), node_runner, catalog, tag);
    tracing::info!(
        %addr,
        storage = %config.spec(),
        data_dir = %settings.data_dir.display(),
        scripts_dir = %settings.scripts_dir.display(),
        templates_dir = %settings.templates_dir.display(),
        workers = settings.workers,
        http_allow = %settings.http_allow,
        "orchestrator listening on http://{addr}"
    );

    let stop = CancellationToken::new();
    let grace = settings.shutdown_grace;
    let network = settings.network.clone();
    let task = {
        let stop = stop.clone();
        let engine = engine.clone();
        let testenvs = testenvs.clone();
        tokio::spawn(async move {
            // The API stays up through the grace period: submissions are
            // refused (503), but running scripts can still save checkpoints
            // and clients can watch them finish.
            let http_stop = CancellationToken::new();
            let http_stopped = http_stop.clone();
            let http = tokio::spawn(orchestrator_api::serve_with(
                listener,
                engine.clone(),
                Some(testenvs.clone()),
                network,
                async move { http_stopped.cancelled().await },
            ));
            stop.cancelled().await;
            tracing::info!(
                grace_secs = grace.as_secs(),
                "shutting down: no new work; letting running tasks finish"
            );
            testenvs.stop();
            engine.shutdown(grace).await;
            http_stop.cancel();
            // Requests still open (a long `wait`) get a moment, then are dropped.
            match tokio::time::timeout(std::time::Duration::from_secs(5), http).await {
                Ok(joined) => joined
                    .context("http server panicked")?
                    .context("http server failed")?,
                Err(_) => tracing::warn!("closing requests still open after shutdown"),
            }
            tracing::info!("shutdown complete");
            Ok(())
        })
    };
    Ok(ServiceHandle {
        addr,
        engine,
        testenvs,
        stop,
        task,
    })
}

/// The engine's webhook sender: HTTP through `orchestrator-http`.
struct WebhookSender(orchestrator_http::WebhookClient);

#[async_trait::async_trait]
impl orchestrator_engine::webhooks::WebhookSender for WebhookSender {
    fn check_target(&self, url: &str) -> Result<(), String> {
        self.0.check(url)
    }

    async fn send(
        &self,
        request: orchestrator_engine::webhooks::WebhookRequest,
    ) -> orchestrator_engine::webhooks::SendOutcome {
        self.0
            .post(
                &request.url,
                &request.headers,
                request.body,
                request.timeout,
            )
            .await
    }
}

/// The step kinds this service runs: scripts, and http steps limited to
/// the allowlist. `template validate` checks files against the same.
pub fn step_kinds(
    scripts: ScriptExecutor,
    http_allow: &orchestrator_http::Allowlist,
) -> anyhow::Result<Steps> {
    let http =
        orchestrator_http::HttpExecutor::new(http_allow.clone()).map_err(|e| anyhow::anyhow!(e))?;
    Ok(Steps::new(scripts).with(Arc::new(http)))
}

/// This node's id: the setting, else the one kept in the data dir (made
/// on the first start), so that a restarted node is the same node.
/// The namespace provider of test environments: each node's init is this
/// binary's `testenv-node-init`; the data dir, the config file's dir and the
/// secret key file are masked in every node; the scripts dir and the
/// interpreters are shown in every node, read-only.
fn node_provider(
    settings: &ServeSettings,
    data_dir: &std::path::Path,
) -> anyhow::Result<orchestrator_testenv::NamespaceProvider> {
    let init_program = match &settings.node_init_program {
        Some(program) => program.clone(),
        // Without `/proc` (a chroot), the path it was started by; a node
        // needs `/proc` anyway, and says so when one is made.
        None => std::env::current_exe()
            .ok()
            .or_else(|| std::env::args_os().next().map(std::path::PathBuf::from))
            .unwrap_or_else(|| std::path::PathBuf::from("orchestrator")),
    };
    let mut provider = orchestrator_testenv::NamespaceProvider::new(
        init_program,
        data_dir,
        settings.config_file.as_deref(),
    )
    .expose(&settings.scripts_dir);
    if let Some(file) = &settings.secret_key_file {
        provider = provider.hide(file);
    }
    // As `ScriptExecutor::resolve` picks them: configured, or found on PATH.
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let defaults = ["nu", "bash", "python3"].map(std::path::PathBuf::from);
    for program in settings.interpreters.values().chain(defaults.iter()) {
        let found = if program.is_absolute() {
            Some(program.clone())
        } else {
            std::env::split_paths(&path_var)
                .map(|dir| dir.join(program))
                .find(|candidate| candidate.is_file())
        };
        // The dir of the name it is called by, of the file a symbolic link
        // leads to, and the installation prefix above each (a version
        // manager's shim in `~/.pyenv/shims` runs `~/.pyenv/libexec`): the
        // node shows each read-only where its root does not already.
        for path in found
            .into_iter()
            .flat_map(|p| [p.canonicalize().ok(), Some(p)])
        {
            let dir = path.as_deref().and_then(std::path::Path::parent);
            for dir in dir.into_iter().chain(dir.and_then(std::path::Path::parent)) {
                provider = provider.expose(dir);
            }
        }
    }
    Ok(provider)
}

fn node_id(settings: &ServeSettings, data_dir: &std::path::Path) -> anyhow::Result<String> {
    if let Some(id) = &settings.node_id {
        anyhow::ensure!(
            !id.trim().is_empty() && id.len() <= 100,
            "--node-id: must be 1-100 characters"
        );
        return Ok(id.clone());
    }
    let path = data_dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    let id = format!("node-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    std::fs::write(&path, &id).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(id)
}

/// The address a local script can reach the listener at: a wildcard bind
/// is reached through loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => {
            SocketAddr::from(([127, 0, 0, 1], addr.port()))
        }
        ip if ip.is_unspecified() => SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, addr.port())),
        _ => addr,
    }
}

/// `orchestrator serve`: run until SIGTERM or Ctrl-C.
pub async fn serve_from_args(args: ServeArgs) -> anyhow::Result<()> {
    // First: no process of the same user may read this one's memory or
    // `/proc/<pid>/environ` (secrets, the key, tokens), nor ptrace it,
    // sandbox or not. Scripts are not affected: an exec makes a process
    // dumpable again.
    nix::sys::prctl::set_dumpable(false).context("cannot make the service non-dumpable")?;
    let settings = ServeSettings::resolve(args)?;
    init_logging(settings.log_format);
    // Listen for signals from the start, so that one arriving while the
    // service is still starting is not lost.
    let signal = tokio::spawn(wait_for_signal());
    let service = start(settings).await?;
    tokio::spawn(crate::systemd::notify_ready(reachable(service.addr)));
    let stop = service.stop.clone();
    tokio::spawn(async move {
        let _ = signal.await;
        crate::systemd::notify_stopping();
        stop.cancel();
    });
    service.wait().await
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,tower_http=info"));
    // Colours only for a person at a terminal, not in files or pipes.
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Says loudly when auth is off; on a store without an admin token, makes
/// the first one and prints it, once.
async fn announce_access(engine: &Engine, settings: &ServeSettings) -> anyhow::Result<()> {
    if !settings.auth {
        tracing::warn!(
            bind = %settings.bind,
            "AUTH IS OFF (--no-auth): every caller that reaches this address may do everything"
        );
        return Ok(());
    }
    let supplied = settings.bootstrap_token.as_ref().map(|t| t.expose());
    let issued = engine
        .access()
        .bootstrap(supplied)
        .await
        .context("cannot create the bootstrap admin token")?;
    match issued {
        Some(_) if supplied.is_some() => {
            tracing::info!("bootstrap admin token taken from ORCHESTRATOR_BOOTSTRAP_TOKEN");
        }
        // Under systemd stderr is the journal, one entry per line: one line
        // there, so that `journalctl -u orchestrator | grep` finds it whole.
        Some(issued) if crate::systemd::stderr_is_journal() => eprintln!(
            "bootstrap admin token (shown once, keep it safe): {} (use it as ORCHESTRATOR_TOKEN; \
             create others with `orchestrator token create`)",
            issued.token
        ),
        // Printed to the terminal, not logged: log files travel further.
        Some(issued) => eprintln!(
            "\n  bootstrap admin token (shown once, keep it safe):\n\n    {}\n\n  \
             use it as `Authorization: Bearer <token>` or ORCHESTRATOR_TOKEN; create \
             others with `orchestrator token create`\n",
            issued.token
        ),
        None => {}
    }
    Ok(())
}

/// The key secrets are sealed with (64 hex digits), from the first of:
/// `--secret-key-file`; `ORCHESTRATOR_SECRET_KEY` (kept for existing
/// setups; a file keeps it out of the environment); the systemd
/// credential `secret-key` (`$CREDENTIALS_DIRECTORY/secret-key`, from
/// `LoadCredential=`); `<data-dir>/secret.key`, made (mode 0600) on first
/// start. Nodes sharing a SurrealDB server need the same key.
fn secret_key(
    data_dir: &std::path::Path,
    key_file: Option<&std::path::Path>,
) -> anyhow::Result<[u8; 32]> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    let parse = |text: &str, from: &str| -> anyhow::Result<[u8; 32]> {
        let text = text.trim();
        let bytes: Option<Vec<u8>> = (text.len() == 64)
            .then(|| {
                (0..32)
                    .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok())
                    .collect()
            })
            .flatten();
        bytes
            .and_then(|b| b.try_into().ok())
            .with_context(|| format!("{from}: a secret key is 64 hex digits (32 bytes)"))
    };
    let read = |path: &std::path::Path| -> anyhow::Result<[u8; 32]> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the secret key file {}", path.display()))?;
        parse(&text, &path.display().to_string())
    };
    if let Some(path) = key_file {
        return read(path).context("--secret-key-file");
    }
    if let Ok(key) = std::env::var("ORCHESTRATOR_SECRET_KEY") {
        tracing::warn!(
            "the secret key comes from ORCHESTRATOR_SECRET_KEY: prefer --secret-key-file or a \
             systemd credential (LoadCredential=secret-key:...), which keep it out of the \
             environment"
        );
        return parse(&key, "ORCHESTRATOR_SECRET_KEY");
    }
    if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        let path = std::path::Path::new(&dir).join(crate::sandbox::KEY_CREDENTIAL);
        if path.exists() {
            return read(&path);
        }
    }
    let path = data_dir.join("secret.key");
    match std::fs::read_to_string(&path) {
        Ok(text) => return parse(&text, &path.display().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create {}", data_dir.display()))?;
    let mut key = [0u8; 32];
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut key);
    let text = orchestrator_core::access::hex(&key);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(key)
}
