//! `orchestrator migrate`: store specs, credentials, progress and the
//! summary around [`orchestrator_storage::transfer`], which does the work.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use orchestrator_storage::transfer::{
    self, CopyOptions, CopyReport, Progress, TransferError, VerifyReport,
};
use orchestrator_storage::{RecordKind, StorageConfig, SurrealdbConfig, TransferStore};

use crate::cli::{MigrateArgs, MigrateCommand, ServeArgs, StoreArgs};
use crate::settings::ServeSettings;

/// Test hook: abort the process (as abruptly as `kill -9`) right after this
/// many durable writes to the target, to prove a resumed run finishes.
const CRASH_AFTER_WRITES: &str = "ORCHESTRATOR_MIGRATE_CRASH_AFTER_WRITES";

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    match args.command {
        Some(MigrateCommand::Verify(stores)) => verify_only(stores).await,
        None => migrate(args).await,
    }
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    let stores = &args.stores;
    let (from, to) = resolve_stores(stores)?;
    let started = Instant::now();
    let source = open_source(&from).await?;
    let options = CopyOptions {
        batch_size: stores.target.batch_size,
        dry_run: args.dry_run,
        skip_unreadable: args.skip_unreadable,
        resume: args.resume,
        snapshot: false,
    };
    if args.dry_run {
        // The target is not even opened: opening creates a store or
        // applies its schema. The source stands in for it, unused.
        let progress = Reporter::new();
        let report = transfer::copy(&*source, &*source, &options, &progress).await;
        progress.clear();
        source.close().await.ok();
        let report = report.context("dry run failed")?;
        finish_copy(stores, &from, &to, &report, None, started)?;
        if !report.unreadable.is_empty() && !args.skip_unreadable {
            bail!(
                "{} source records are unreadable: the migration would stop at the first \
                 (see above); --skip-unreadable copies everything else",
                report.unreadable.len()
            );
        }
        return Ok(());
    }
    let target = open(
        &to,
        "--to",
        orchestrator_storage::open_for_import(&to.config),
    )
    .await?;
    let progress = Reporter::new();
    let copied = transfer::copy(&*source, &*target, &options, &progress).await;
    let result = match copied {
        Ok(report) => {
            let verified = if args.verify {
                Some(
                    transfer::verify(&*source, &*target, stores.target.batch_size, &progress).await,
                )
            } else {
                None
            };
            Ok((report, verified))
        }
        Err(e) => Err(e),
    };
    progress.clear();
    let result = result.and_then(|(report, verified)| match verified {
        Some(Err(e)) => Err(e),
        Some(Ok(verified)) => Ok((report, Some(verified))),
        None => Ok((report, None)),
    });
    // Close both whatever happened: the target flushes and lets go of its
    // files, so a resumed run or the service can open it.
    let closed = target.close().await;
    source.close().await.ok();
    let (report, verified) = result.map_err(|e| match e {
        // A store failed midway: what was written is durable.
        TransferError::Source(_) | TransferError::Target(_) => {
            anyhow::Error::new(e).context(format!(
                "migration from {} to {} stopped; what was written is durable, and \
             `orchestrator migrate --resume` with the same stores continues",
                from.spec, to.spec
            ))
        }
        // The stores themselves are not fit: a re-run would meet the same.
        other => anyhow::Error::new(other).context(format!(
            "migration from {} to {} refused",
            from.spec, to.spec
        )),
    })?;
    closed.with_context(|| format!("cannot close the target {}", to.spec))?;
    finish_copy(stores, &from, &to, &report, verified.as_ref(), started)
}

fn finish_copy(
    stores: &StoreArgs,
    from: &Store,
    to: &Store,
    report: &CopyReport,
    verified: Option<&VerifyReport>,
    started: Instant,
) -> anyhow::Result<()> {
    let elapsed = started.elapsed();
    if stores.target.json {
        let summary = serde_json::json!({
            "from": from.spec,
            "to": to.spec,
            "elapsed_ms": elapsed.as_millis() as u64,
            "copy": report,
            "verify": verified,
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        print!("{}", render_copy(from, to, report, elapsed));
        if let Some(verified) = verified {
            print!("{}", render_verify(verified));
        }
    }
    if let Some(verified) = verified {
        check_verified(verified)?;
    }
    Ok(())
}

async fn verify_only(stores: StoreArgs) -> anyhow::Result<()> {
    let (from, to) = resolve_stores(&stores)?;
    let source = open_source(&from).await?;
    let target = open(
        &to,
        "--to",
        orchestrator_storage::open_read_only(&to.config),
    )
    .await?;
    let progress = Reporter::new();
    let report = transfer::verify(&*source, &*target, stores.target.batch_size, &progress).await;
    progress.clear();
    source.close().await.ok();
    target.close().await.ok();
    let report = report.context("verify failed")?;
    if stores.target.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_verify(&report));
    }
    check_verified(&report)
}

fn check_verified(report: &VerifyReport) -> anyhow::Result<()> {
    if report.matches() {
        return Ok(());
    }
    let first: Vec<String> = report
        .mismatches
        .iter()
        .take(3)
        .map(|m| format!("{} {}: {}", m.kind, m.key, m.problem))
        .collect();
    bail!(
        "source and target differ in {} records; first: {}",
        report.mismatch_count,
        first.join("; ")
    )
}

/// A parsed `--from` or `--to`.
pub(crate) struct Store {
    /// As given, for messages (a spec holds no credentials).
    pub(crate) spec: String,
    pub(crate) config: StorageConfig,
}

fn resolve_stores(args: &StoreArgs) -> anyhow::Result<(Store, Store)> {
    let defaults = spec_defaults(&args.target.config)?;
    let from = resolve_store(
        "--from",
        &args.from,
        &args.from_username,
        args.from_password.clone(),
        &defaults,
    )?;
    let to = resolve_store(
        "--to",
        &args.to,
        &args.target.to_username,
        args.target.to_password.clone(),
        &defaults,
    )?;
    if from.config.same_store(&to.config) {
        bail!(
            "--from and --to name the same store ({}); migrate into another one",
            to.spec
        );
    }
    Ok((from, to))
}

/// The SurrealDB settings every spec starts from: the config file's, then
/// ORCHESTRATOR_SURREALDB_USERNAME and _PASSWORD; a side's own flags beat
/// them.
pub(crate) fn spec_defaults(config: &Option<PathBuf>) -> anyhow::Result<SurrealdbConfig> {
    Ok(ServeSettings::resolve(ServeArgs {
        config: config.clone(),
        surrealdb_username: std::env::var("ORCHESTRATOR_SURREALDB_USERNAME").ok(),
        surrealdb_password: std::env::var("ORCHESTRATOR_SURREALDB_PASSWORD")
            .ok()
            .map(orchestrator_storage::Secret::new),
        ..Default::default()
    })?
    .surrealdb)
}

/// One side's spec with its credentials.
pub(crate) fn resolve_store(
    flag: &str,
    spec: &Option<String>,
    username: &Option<String>,
    password: Option<orchestrator_storage::Secret>,
    defaults: &SurrealdbConfig,
) -> anyhow::Result<Store> {
    let spec = spec
        .as_deref()
        .with_context(|| format!("{flag} is required"))?;
    let mut config = StorageConfig::from_spec(spec, defaults.clone())
        .map_err(|e| anyhow::anyhow!(e))
        .with_context(|| flag.to_owned())?;
    // Said before anything is opened: a missing backend is known up front,
    // and the other side's store may not even exist yet.
    if !config.storage_type.is_compiled_in() {
        bail!("{flag} {spec}: {}", config.storage_type.not_compiled());
    }
    if let Some(username) = username {
        config.surrealdb.username.clone_from(username);
    }
    if let Some(password) = password {
        config.surrealdb.password = password;
    }
    Ok(Store {
        spec: spec.to_owned(),
        config,
    })
}

async fn open_source(store: &Store) -> anyhow::Result<TransferStore> {
    open(
        store,
        "--from",
        orchestrator_storage::open_read_only(&store.config),
    )
    .await
}

/// Awaits the opening of one side, saying which side failed and, for
/// refused credentials, which settings hold them.
pub(crate) async fn open(
    store: &Store,
    side: &str,
    opening: impl Future<Output = orchestrator_storage::Result<TransferStore>>,
) -> anyhow::Result<TransferStore> {
    let role = if side == "--from" { "source" } else { "target" };
    opening.await.map_err(|e| {
        let hint = match &e {
            orchestrator_storage::Error::SignIn { .. } => {
                let upper = side.trim_start_matches("--").to_uppercase();
                format!(
                    "; check {side}-username and {side}-password (or \
                     ORCHESTRATOR_MIGRATE_{upper}_USERNAME and _PASSWORD)"
                )
            }
            _ => String::new(),
        };
        anyhow::anyhow!("cannot open the {role} {}: {e}{hint}", store.spec)
    })
}

fn render_copy(from: &Store, to: &Store, report: &CopyReport, elapsed: Duration) -> String {
    let mut out = if report.dry_run {
        format!(
            "dry run of {} -> {}: read in {:.1}s, nothing written\n",
            from.spec,
            to.spec,
            elapsed.as_secs_f64()
        )
    } else {
        format!(
            "migrated {} -> {} in {:.1}s\n",
            from.spec,
            to.spec,
            elapsed.as_secs_f64()
        )
    };
    for kind in &report.kinds {
        out.push_str(&format!(
            "  {:<10} {:>8} read {:>8} written {:>8} already there\n",
            kind.kind.plural(),
            kind.read,
            kind.written,
            kind.unchanged
        ));
    }
    out.push_str(&format!(
        "  {:<10} {:>8} tasks with logs, {} bytes ({} written now)\n",
        "logs", report.logs, report.log_bytes, report.log_bytes_written
    ));
    if report.unreadable.is_empty() {
        out.push_str("  unreadable source records: none\n");
    } else {
        out.push_str(&format!(
            "  unreadable source records ({}), not copied:\n",
            report.unreadable.len()
        ));
        for u in &report.unreadable {
            out.push_str(&format!("    {} {}: {}\n", u.kind, u.key, u.reason));
        }
    }
    out
}

fn render_verify(report: &VerifyReport) -> String {
    let mut out = String::from("verify:\n");
    for kind in &report.kinds {
        let same = kind.source == kind.target && kind.source_checksum == kind.target_checksum;
        out.push_str(&format!(
            "  {:<10} source {:>8} target {:>8}  checksum {} {}\n",
            kind.kind,
            kind.source,
            kind.target,
            &kind.source_checksum[..16.min(kind.source_checksum.len())],
            if same { "equal" } else { "DIFFERENT" }
        ));
    }
    if report.matches() {
        out.push_str("  every record matches\n");
    } else {
        out.push_str(&format!("  {} records differ:\n", report.mismatch_count));
        for m in &report.mismatches {
            out.push_str(&format!("    {} {}: {}\n", m.kind, m.key, m.problem));
        }
    }
    out
}

/// Shows progress: a bar on a terminal, a line a second otherwise.
struct Reporter {
    bar: Option<indicatif::ProgressBar>,
    plain: Mutex<PlainProgress>,
    writes: AtomicU64,
    crash_after: Option<u64>,
}

struct PlainProgress {
    kind: Option<RecordKind>,
    total: u64,
    done: u64,
    started: Instant,
    last_line: Instant,
}

impl Reporter {
    fn new() -> Reporter {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix:>10} [{bar:30}] {pos}/{len} {rate} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .with_key(
                    "rate",
                    |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
                        let _ = write!(out, "{:.0} records/s", state.per_sec());
                    },
                )
                .progress_chars("=> "),
            );
            bar
        });
        Reporter {
            bar,
            plain: Mutex::new(PlainProgress {
                kind: None,
                total: 0,
                done: 0,
                started: Instant::now(),
                last_line: Instant::now(),
            }),
            writes: AtomicU64::new(0),
            crash_after: std::env::var(CRASH_AFTER_WRITES)
                .ok()
                .and_then(|n| n.parse().ok()),
        }
    }

    fn clear(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        } else {
            self.plain_line(true);
        }
    }

    fn plain_line(&self, force: bool) {
        let mut plain = self.plain.lock().unwrap_or_else(|e| e.into_inner());
        let Some(kind) = plain.kind else { return };
        if !force && plain.last_line.elapsed() < Duration::from_secs(1) {
            return;
        }
        plain.last_line = Instant::now();
        let secs = plain.started.elapsed().as_secs_f64().max(0.001);
        let rate = plain.done as f64 / secs;
        // No rate yet, no estimate.
        let eta = if plain.done == 0 {
            String::new()
        } else {
            let left = plain.total.saturating_sub(plain.done) as f64 / rate;
            format!(", {rate:.0} records/s, eta {left:.0}s")
        };
        eprintln!(
            "migrate: {} {}/{}{eta}",
            kind.plural(),
            plain.done,
            plain.total
        );
    }
}

impl Progress for Reporter {
    fn phase(&self, kind: RecordKind, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_prefix(kind.plural());
            bar.set_length(total);
            bar.set_position(0);
            bar.reset_eta();
            return;
        }
        self.plain_line(true);
        let mut plain = self.plain.lock().unwrap_or_else(|e| e.into_inner());
        *plain = PlainProgress {
            kind: Some(kind),
            total,
            done: 0,
            started: Instant::now(),
            last_line: Instant::now(),
        };
    }

    fn advance(&self, records: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(records);
            return;
        }
        self.plain.lock().unwrap_or_else(|e| e.into_inner()).done += records;
        self.plain_line(false);
    }

    fn wrote(&self) {
        let writes = self.writes.fetch_add(1, Ordering::SeqCst) + 1;
        if self.crash_after == Some(writes) {
            eprintln!("migrate: {CRASH_AFTER_WRITES}={writes} reached; aborting");
            std::process::abort();
        }
    }
}
