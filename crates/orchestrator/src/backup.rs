//! `orchestrator backup` and `orchestrator restore`: settings, files and
//! summaries around [`orchestrator_storage::backup`], which does the work.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use orchestrator_storage::backup::{self, BackupOptions, Manifest};
use orchestrator_storage::transfer::Silent;
use orchestrator_storage::{RecordKind, StorageConfig, StorageType};

use crate::cli::{BackupArgs, ClientArgs, RestoreArgs};
use crate::settings::ServeSettings;
use crate::store_copy;

pub async fn backup(client: &ClientArgs, args: BackupArgs) -> anyhow::Result<()> {
    let settings = ServeSettings::resolve(args.store)?;
    let (config, _) = settings.store()?;
    let to = &args.to;
    if to.exists() {
        bail!(
            "--to {}: the file exists; a backup never overwrites one, choose a new name",
            to.display()
        );
    }
    let work_dir = match to.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // Written next to the archive under another name, and renamed once
    // complete and synced: an interrupted backup never looks like one.
    let partial = to.with_file_name(format!(
        ".{}.partial",
        to.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .read(true)
        .create(true)
        .truncate(true)
        // Token hashes and sealed secrets: for the owner only.
        .mode(0o600)
        .open(&partial)
        .with_context(|| format!("--to {}: cannot create {}", to.display(), partial.display()))?;
    let location = location(&config);
    let through_service = config.storage_type == StorageType::SurrealdbEmbedded
        && orchestrator_storage::in_use(&config);
    let result = if through_service {
        through_the_service(client, &settings, file, &work_dir).await
    } else {
        directly(&config, &location, args.max_passes, file, &work_dir).await
    };
    let manifest = match result {
        Ok(manifest) => manifest,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    std::fs::rename(&partial, to)
        .with_context(|| format!("cannot rename {} to {}", partial.display(), to.display()))?;
    std::fs::File::open(&work_dir)
        .and_then(|dir| dir.sync_all())
        .with_context(|| format!("cannot sync {}", work_dir.display()))?;
    let size = std::fs::metadata(to).map(|m| m.len()).unwrap_or(0);
    println!(
        "backed up {location} into {} ({}){}",
        to.display(),
        bytes(size),
        if through_service {
            ", through the running service"
        } else {
            ""
        }
    );
    print!("{}", render_manifest(&manifest));
    if secrets(&manifest) > 0 {
        println!(
            "  its {} secrets are sealed with the store's secret key, which no archive holds: \
             keep {} (or ORCHESTRATOR_SECRET_KEY) safe, apart from the backups",
            secrets(&manifest),
            settings.data_dir.join("secret.key").display()
        );
    }
    Ok(())
}

/// Reads the store itself: a filesystem store or a SurrealDB server can be
/// read while their service runs.
async fn directly(
    config: &StorageConfig,
    location: &str,
    max_passes: u32,
    file: std::fs::File,
    work_dir: &Path,
) -> anyhow::Result<Manifest> {
    let source = orchestrator_storage::open_read_only(config)
        .await
        .map_err(|e| match e {
            orchestrator_storage::Error::SignIn { .. } => {
                anyhow::anyhow!("{e}; check --surrealdb-username and --surrealdb-password")
            }
            other => other.into(),
        })
        .with_context(|| format!("cannot open the store to back up, {location}"))?;
    let mut options = BackupOptions::new(location, work_dir);
    options.max_passes = max_passes;
    let result = backup::create(&*source, &options, &Silent, file).await;
    source.close().await.ok();
    result.with_context(|| format!("cannot back up {location}"))
}

/// Asks the service that holds the store for the archive (`POST /backup`),
/// at the address its settings give, and checks what arrived.
async fn through_the_service(
    client: &ClientArgs,
    settings: &ServeSettings,
    mut file: std::fs::File,
    work_dir: &Path,
) -> anyhow::Result<Manifest> {
    let host = match settings.bind {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_owned(),
        ip if ip.is_unspecified() => "[::1]".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    let url = format!("http://{host}:{}", settings.port);
    let api = crate::client::connect(&ClientArgs {
        url: url.clone(),
        token: client.token.clone(),
    })?;
    let mut response = api.backup().await.with_context(|| {
        format!(
            "the embedded SurrealDB store in {} is held by a running service, so the \
                 backup has to come from it (with an admin token: --token or \
                 ORCHESTRATOR_TOKEN), and asking it failed",
            settings.data_dir.display()
        )
    })?;
    while let Some(chunk) = response
        .chunk()
        .await
        .with_context(|| format!("the backup from {url} broke off"))?
    {
        file.write_all(&chunk).context("cannot write the backup")?;
    }
    file.sync_all().context("cannot sync the backup")?;
    // What came over the network is checked end to end before it counts.
    let mut file = file;
    std::io::Seek::rewind(&mut file).context("cannot read the backup back")?;
    let scratch = tempfile::Builder::new()
        .prefix(".orchestrator-check-")
        .tempdir_in(work_dir)
        .with_context(|| format!("cannot create a directory in {}", work_dir.display()))?;
    let dest = scratch.path().to_path_buf();
    let manifest = tokio::task::spawn_blocking(move || backup::unpack(file, &dest))
        .await
        .context("checking the backup panicked")?
        .with_context(|| format!("the backup sent by {url} is not sound"))?;
    Ok(manifest)
}

pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let defaults = store_copy::spec_defaults(&args.target.config)?;
    let target = store_copy::resolve_store(
        "--to",
        &Some(args.to.clone()),
        &args.target.to_username,
        args.target.to_password.clone(),
        &defaults,
    )?;
    let archive = std::fs::File::open(&args.from)
        .with_context(|| format!("--from {}: cannot open the archive", args.from.display()))?;
    // The archive is unpacked and checked before the target is touched
    // (opening a target creates it). Unpacked in TMPDIR.
    let unpacked = backup::open_archive(archive, &std::env::temp_dir())
        .await
        .with_context(|| format!("--from {}", args.from.display()))?;
    let store = store_copy::open(
        &target,
        "--to",
        orchestrator_storage::open_for_import(&target.config),
    )
    .await?;
    let result = unpacked
        .restore(&*store, args.target.batch_size, &Silent)
        .await;
    let closed = store.close().await;
    let report = result.with_context(|| {
        format!(
            "cannot restore {} into {}",
            args.from.display(),
            target.spec
        )
    })?;
    closed.with_context(|| format!("cannot close {}", target.spec))?;
    if args.target.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "restored {} into {}, and verified it record by record",
        args.from.display(),
        target.spec
    );
    print!("{}", render_manifest(&report.manifest));
    if secrets(&report.manifest) > 0 {
        println!(
            "  its {} secrets open only with the old store's secret key: put it in \
             <data-dir>/secret.key (mode 600) or ORCHESTRATOR_SECRET_KEY before the service starts",
            secrets(&report.manifest)
        );
    }
    Ok(())
}

fn secrets(manifest: &Manifest) -> u64 {
    manifest.records.get("secret").copied().unwrap_or(0)
}

/// Where a store is, for messages: never a password.
fn location(config: &StorageConfig) -> String {
    match config.storage_type {
        StorageType::SurrealdbServer => format!(
            "surrealdb-server at {} (namespace {}, database {})",
            config.surrealdb.url, config.surrealdb.namespace, config.surrealdb.database
        ),
        other => format!("{other} at {}", config.data_dir.display()),
    }
}

fn render_manifest(manifest: &Manifest) -> String {
    // Every kind the archive counts, in the order they move: a kind added
    // to the store shows up here without a change.
    let records: Vec<String> = RecordKind::ALL
        .into_iter()
        .map(|kind| {
            let n = manifest.records.get(kind.as_str()).copied().unwrap_or(0);
            format!("{n} {}", kind.plural())
        })
        .collect();
    format!(
        "  taken {} by orchestrator {} from {}\n  records: {}\n  logs: {} tasks' logs, {}\n  \
         consistent: pass {} found nothing changed\n",
        manifest.created_at.format("%Y-%m-%d %H:%M:%S UTC"),
        manifest.orchestrator_version,
        manifest.source,
        records.join(", "),
        manifest.logs,
        bytes(manifest.log_bytes),
        manifest.passes,
    )
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} bytes"),
    }
}
