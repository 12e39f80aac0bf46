//! Storage move: a running service moves itself to another store while
//! it keeps serving.
//!
//! The service's [`Storage`] is wrapped once, at start ([`wrap`]), in a
//! store that can be swapped ([`switch`]). A migration then runs in the
//! background, in phases:
//!
//! 1. **copying**: every record of the current store (the *source*) goes to
//!    the *target* in batches, with the code of `orchestrator migrate`;
//!    meanwhile every write the service makes is noted by key;
//! 2. **mirroring**: the noted records are read afresh from the source and
//!    written to the target (or deleted there), round after round, until
//!    few are left;
//! 3. **verifying**: the whole target is compared with the source by
//!    content; whatever differs (written while it ran) is applied again;
//! 4. **switching**: writes pause; the last noted records are applied and
//!    compared; `storage.json` in the data dir names the target (the
//!    commit point); the target becomes the current store; writes resume.
//!
//! Until the switch the service works on the source only, so a cancel, an
//! error or a crash leaves it there with nothing lost. After it, a restart
//! opens the target. The source is left as it was at the switch, and stays
//! *level* with the target until the first write after it, which
//! durably marks it as not level first. [`LiveMigrations::rollback`]
//! switches back while the service knows every write since the switch
//! (it notes them, up to a bound, until it restarts), applying them to
//! the old store on the way; after a restart, only while it is level.

mod files;
mod switch;
mod sync;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use orchestrator_core::backoff::Backoff;
use orchestrator_core::storage_move::{MovePhase, MoveStatus};
use tokio_util::sync::CancellationToken;

pub use files::{BackendChoice, effective_config};
use switch::{Changed, LevelWatch, Live, Switchable};

use crate::transfer::{self, CopyOptions, Progress, TransferError};
use crate::{Error, RecordKind, Storage, StorageConfig, StorageType, SurrealdbConfig};

/// Records per batch when the request names none. Larger than
/// `migrate`'s 500: each batch of a filesystem target costs a journal sync
/// and a sync of its log files, and the bench (workload 8) copies about
/// half again as fast with batches four times as large, at a few MiB of
/// memory.
const DEFAULT_BATCH: usize = 2000;
/// Mirror rounds in a row, at most: under a steady write load a round
/// never reaches zero, and a target slower than the load never gets
/// ahead; the switch applies the rest.
const MIRROR_ROUNDS: usize = 8;
/// A mirror round this small ends the rounds: what the next would apply
/// is left to the switch.
const SMALL_ROUND: usize = 32;
/// Progress events, at most this often.
const PROGRESS_EVERY: Duration = Duration::from_millis(500);

/// Told of every change of a migration's status: the engine turns it into
/// a `storage_migration` event.
pub trait Observer: Send + Sync {
    fn changed(&self, status: &MoveStatus);
}

/// Why a migration or a rollback was refused, or an id is unknown.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    /// The target spec is malformed or cannot be opened; the message names
    /// the value.
    #[error("target: {0}")]
    BadTarget(String),
    #[error("target: {0}")]
    NotCompiled(Error),
    #[error("target: {0} is the store this service already works on")]
    SameStore(String),
    #[error(
        "target: {spec} already holds {records} records; a storage move moves only into an \
         empty store, the store this service left at its last switch, or the target of one of \
         its own unfinished migrations"
    )]
    TargetNotEmpty { spec: String, records: u64 },
    #[error(
        "storage move from a shared store ({0}) is refused: other nodes would go on writing to \
         it after this node switched, and those writes would be lost; stop every node and use \
         `orchestrator migrate` (docs/migration.md)"
    )]
    Shared(String),
    #[error("migration {0} is still running; cancel it or wait for it to end")]
    Running(String),
    #[error("no storage migration {0}")]
    NotFound(String),
    /// The migration is past the point where it can be cancelled.
    #[error("{0}")]
    TooLate(String),
    #[error("rollback refused: {0}")]
    Rollback(String),
    #[error("storage: {0}")]
    Storage(#[from] Error),
}

/// Wraps the store the service opened (`config`, as
/// [`effective_config`] chose it, with `choice` if a switch chose it), and
/// returns the [`Storage`] to give the engine and the migrations' handle.
pub fn wrap(
    storage: Storage,
    config: StorageConfig,
    data_dir: &Path,
    choice: Option<&BackendChoice>,
) -> Result<(Storage, LiveMigrations), Error> {
    let level = choice
        .filter(|c| c.level)
        .map(|_| LevelWatch::new(data_dir.to_owned()));
    let store = Arc::new(Switchable::new(storage, level));
    let mut history = files::load_history(data_dir)?;
    let mut ended = false;
    for status in history.iter_mut().filter(|s| !s.phase.is_final()) {
        ended = true;
        status.finished_at = Some(Utc::now());
        if choice.is_some_and(|c| c.migration == status.id) {
            // The switch was recorded; the crash came before the history.
            status.phase = MovePhase::Completed;
        } else {
            status.error = Some(format!(
                "the service stopped while {}; it stayed on {}, and the target is \
                 incomplete (a new migration to it continues it)",
                status.phase.as_str(),
                status.source
            ));
            status.phase = MovePhase::Abandoned;
        }
    }
    if ended {
        files::save_history(data_dir, &history)?;
    }
    let storage = Storage {
        backend: Arc::new(Live(store.clone())),
        tasks: Arc::new(Live(store.clone())),
        nodes: Arc::new(Live(store.clone())),
        access: Arc::new(Live(store.clone())),
        schedules: Arc::new(Live(store.clone())),
        retention: Arc::new(Live(store.clone())),
        transfer: Arc::new(Live(store.clone())),
        webhooks: Arc::new(Live(store.clone())),
        locks: Arc::new(Live(store.clone())),
    };
    let controller = Controller {
        store,
        data_dir: data_dir.to_owned(),
        defaults: config.surrealdb.clone(),
        config: Mutex::new(config),
        history: Mutex::new(history),
        running: Mutex::new(None),
        observer: OnceLock::new(),
        switching: tokio::sync::Mutex::new(()),
    };
    Ok((
        storage,
        LiveMigrations {
            inner: Arc::new(controller),
        },
    ))
}

/// The service's storage moves: start, watch, cancel, roll back.
#[derive(Clone)]
pub struct LiveMigrations {
    inner: Arc<Controller>,
}

/// The store a service works on, and the one it left.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoreInfo {
    /// The current store, as a spec.
    pub store: String,
    /// The store left at the last switch, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// Whether the store left behind still holds what the current one
    /// holds (nothing was written since the switch).
    pub level: bool,
    /// Whether a rollback may return to it now: it is level, or the
    /// service knows every write since the switch and brings them along.
    pub can_roll_back: bool,
    /// Why a rollback would be refused now, as `POST /admin/storage/rollback`
    /// would answer; absent when it is possible, or there is no previous
    /// store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_refused: Option<String>,
    /// The backends this build can move to (`filesystem`, and the
    /// SurrealDB ones when compiled in).
    #[serde(default)]
    pub backends: Vec<String>,
}

struct Controller {
    store: Arc<Switchable>,
    data_dir: PathBuf,
    /// SurrealDB settings a target spec starts from: the service's own, so
    /// that a restart signs in to the target the same way.
    defaults: SurrealdbConfig,
    /// The current store's config; changes at a switch.
    config: Mutex<StorageConfig>,
    /// The newest migrations, oldest first; saved at each phase.
    history: Mutex<Vec<MoveStatus>>,
    running: Mutex<Option<(String, CancellationToken)>>,
    observer: OnceLock<Arc<dyn Observer>>,
    /// One switch at a time: a migration's, or a rollback.
    switching: tokio::sync::Mutex<()>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl LiveMigrations {
    /// Sets who hears of status changes (once).
    pub fn observe(&self, observer: Arc<dyn Observer>) {
        let _ = self.inner.observer.set(observer);
    }

    /// The current store, and the one left at the last switch.
    pub fn store(&self) -> Result<StoreInfo, LiveError> {
        let choice = BackendChoice::load(&self.inner.data_dir)?;
        let level =
            choice.as_ref().is_some_and(|c| c.level) && self.inner.store.level() != Some(false);
        let refused = choice
            .as_ref()
            .and_then(|c| self.rollback_refusal(c).map(|e| e.to_string()));
        Ok(StoreInfo {
            store: lock(&self.inner.config).spec(),
            level,
            can_roll_back: choice.is_some() && refused.is_none(),
            rollback_refused: refused,
            previous: choice.map(|c| c.previous),
            backends: StorageType::ALL
                .into_iter()
                .filter(|t| t.is_compiled_in())
                .map(|t| t.as_str().to_owned())
                .collect(),
        })
    }

    /// Why a rollback to `choice.previous` cannot happen now, if it
    /// cannot: one place for the refusal that `store()` shows and
    /// `rollback()` answers.
    fn rollback_refusal(&self, choice: &BackendChoice) -> Option<LiveError> {
        let this = &self.inner;
        if let Some((id, _)) = &*lock(&this.running) {
            return Some(LiveError::Running(id.clone()));
        }
        let possible = this.store.noting() || (choice.level && this.store.level() != Some(false));
        if possible {
            return None;
        }
        Some(LiveError::Rollback(format!(
            "{} is no longer level with {}: the service wrote to the current store since \
             the switch at {} and no longer knows every such write (it restarted since, or \
             they were too many); to go back, move to it with a new storage move \
             (`orchestrator storage migrate --to {}`), which brings it up to date",
            choice.previous,
            choice.store,
            choice.switched_at.to_rfc3339(),
            choice.previous
        )))
    }

    /// Every migration remembered, oldest first.
    pub fn list(&self) -> Vec<MoveStatus> {
        lock(&self.inner.history).clone()
    }

    pub fn get(&self, id: &str) -> Result<MoveStatus, LiveError> {
        lock(&self.inner.history)
            .iter()
            .find(|s| s.id == id)
            .cloned()
            .ok_or_else(|| LiveError::NotFound(id.to_owned()))
    }

    /// Starts moving to `target` (a spec) in the background, `batch_size`
    /// records at a time, and returns its first status.
    pub async fn start(
        &self,
        target: &str,
        batch_size: Option<usize>,
    ) -> Result<MoveStatus, LiveError> {
        let this = &self.inner;
        // Not while a rollback switches: the copy would read a store that
        // stops being current under it.
        let _no_switch = this.switching.lock().await;
        if let Some((id, _)) = &*lock(&this.running) {
            return Err(LiveError::Running(id.clone()));
        }
        let mut target_config = StorageConfig::from_spec(target, this.defaults.clone())
            .map_err(LiveError::BadTarget)?;
        if target_config.storage_type == StorageType::SurrealdbServer {
            target_config.data_dir = this.data_dir.clone();
        }
        if !target_config.storage_type.is_compiled_in() {
            return Err(LiveError::NotCompiled(
                target_config.storage_type.not_compiled(),
            ));
        }
        let source_config = lock(&this.config).clone();
        if source_config.same_store(&target_config) {
            return Err(LiveError::SameStore(target.to_owned()));
        }
        let source = this.store.current();
        if source.nodes().shared() {
            return Err(LiveError::Shared(source_config.spec()));
        }
        let target_spec = target_config.spec();
        let target_store = crate::open(&target_config)
            .await
            .map_err(|e| LiveError::BadTarget(format!("cannot open {target_spec}: {e}")))?;
        let resume = match held_records(&target_store).await {
            Ok(0) => false,
            Ok(records) if self.may_resume(&target_spec) => {
                tracing::info!(target = %target_spec, records, "storage move resumes into a target it knows");
                true
            }
            Ok(records) => {
                let _ = target_store.close().await;
                return Err(LiveError::TargetNotEmpty {
                    spec: target_spec,
                    records,
                });
            }
            Err(e) => {
                let _ = target_store.close().await;
                return Err(LiveError::BadTarget(format!(
                    "cannot read {target_spec}: {e}"
                )));
            }
        };
        let id = uuid::Uuid::now_v7().to_string();
        let status = MoveStatus {
            id: id.clone(),
            source: source_config.spec(),
            target: target_spec,
            phase: MovePhase::Copying,
            started_at: Utc::now(),
            finished_at: None,
            records_total: 0,
            records_copied: 0,
            records_mirrored: 0,
            records_verified: 0,
            rate: 0.0,
            eta_secs: None,
            phases: Default::default(),
            switch_stall_ms: None,
            error: None,
        };
        let cancel = CancellationToken::new();
        lock(&this.history).push(status.clone());
        if let Err(e) = this.save_history() {
            lock(&this.history).retain(|s| s.id != id);
            let _ = target_store.close().await;
            return Err(e.into());
        }
        *lock(&this.running) = Some((id.clone(), cancel.clone()));
        this.announce(&status);
        let run = Run {
            controller: this.clone(),
            id,
            source,
            target: target_store,
            target_config,
            batch: batch_size.unwrap_or(DEFAULT_BATCH).clamp(1, 10_000),
            resume,
            cancel,
        };
        tokio::spawn(run.run());
        Ok(status)
    }

    /// A target that is not empty is accepted when it is the store this
    /// service left at its last switch (it is behind, never ahead), or the
    /// target of an unfinished migration of its own.
    fn may_resume(&self, target_spec: &str) -> bool {
        let previous = BackendChoice::load(&self.inner.data_dir)
            .ok()
            .flatten()
            .is_some_and(|c| c.previous == target_spec);
        previous
            || lock(&self.inner.history).iter().any(|s| {
                s.target == target_spec
                    && matches!(
                        s.phase,
                        MovePhase::Cancelled | MovePhase::Failed | MovePhase::Abandoned
                    )
            })
    }

    /// Cancels a migration before its switch: the service stays on its
    /// store, and the target is left incomplete.
    pub fn cancel(&self, id: &str) -> Result<MoveStatus, LiveError> {
        let status = self.get(id)?;
        let running = lock(&self.inner.running);
        match &*running {
            Some((running_id, cancel)) if running_id == id => {
                if status.phase == MovePhase::Switching {
                    return Err(LiveError::TooLate(format!(
                        "migration {id} is switching; it can no longer be cancelled"
                    )));
                }
                cancel.cancel();
                Ok(status)
            }
            _ => Err(LiveError::TooLate(format!(
                "migration {id} has already ended ({})",
                status.phase.as_str()
            ))),
        }
    }

    /// Switches back to the store left at the last switch, bringing along
    /// what was written since: possible while the service noted every
    /// such write (from the switch, or from a start at which the old store
    /// was level), and refused once it cannot know them (a restart after
    /// a write, or more writes than it notes).
    pub async fn rollback(&self) -> Result<StoreInfo, LiveError> {
        let this = &self.inner;
        let _one = this.switching.lock().await;
        if let Some((id, _)) = &*lock(&this.running) {
            return Err(LiveError::Running(id.clone()));
        }
        let Some(choice) = BackendChoice::load(&this.data_dir)? else {
            return Err(LiveError::Rollback(
                "this service never switched stores, so there is no store to go back to".into(),
            ));
        };
        if let Some(refused) = self.rollback_refusal(&choice) {
            return Err(refused);
        }
        let mut previous_config = StorageConfig::from_spec(&choice.previous, this.defaults.clone())
            .map_err(|e| LiveError::Rollback(format!("storage.json: {e}")))?;
        if previous_config.storage_type == StorageType::SurrealdbServer {
            previous_config.data_dir = this.data_dir.clone();
        }
        if !previous_config.storage_type.is_compiled_in() {
            return Err(LiveError::NotCompiled(
                previous_config.storage_type.not_compiled(),
            ));
        }
        // Opened, and brought nearly level, before the pause, which then
        // stays short.
        let previous = crate::open(&previous_config)
            .await
            .map_err(|e| LiveError::Rollback(format!("cannot open {}: {e}", choice.previous)))?;
        let current = this.store.current();
        let refuse = |noted: Changed, previous: Storage, error: LiveError| async move {
            this.store.give_back(noted);
            let _ = previous.close().await;
            Err(error)
        };
        let mut noted = this.store.take_changed();
        if let Err(e) = sync::apply(&current, &previous, &noted, DEFAULT_BATCH).await {
            return refuse(noted, previous, LiveError::Rollback(e.to_string())).await;
        }
        let paused = this.store.pause().await;
        // Checked again under the pause: a write may have ended the noting
        // meanwhile.
        if let Some(refused) = self.rollback_refusal(&choice) {
            drop(paused);
            return refuse(noted, previous, refused).await;
        }
        let rest = this.store.take_changed();
        let applied = match sync::apply(&current, &previous, &rest, DEFAULT_BATCH).await {
            Ok(_) => sync::differences(&current, &previous, &rest, DEFAULT_BATCH).await,
            Err(e) => Err(e),
        };
        noted.merge(rest);
        match applied {
            Ok(differ) if differ.is_empty() => {}
            Ok(differ) => {
                drop(paused);
                let error = LiveError::Rollback(format!(
                    "{} records still differ after the writes since the switch were applied \
                     (first: {})",
                    differ.len(),
                    differ[0]
                ));
                return refuse(noted, previous, error).await;
            }
            Err(e) => {
                drop(paused);
                return refuse(noted, previous, LiveError::Rollback(e.to_string())).await;
            }
        }
        let back = BackendChoice {
            store: choice.previous.clone(),
            previous: choice.store.clone(),
            migration: format!("rollback-{}", uuid::Uuid::now_v7()),
            switched_at: Utc::now(),
            level: true,
        };
        if let Err(e) = save_choice(&this.data_dir, back).await {
            drop(paused);
            return refuse(noted, previous, e.into()).await;
        }
        let left = this
            .store
            .swap(previous, LevelWatch::new(this.data_dir.clone()), &paused);
        this.store.follow_for_rollback(&paused);
        *lock(&this.config) = previous_config;
        drop(paused);
        drop(current);
        tracing::info!(store = %choice.previous, left = %choice.store, "storage rolled back");
        tokio::spawn(close_when_unused(left));
        self.store()
    }
}

impl Controller {
    fn save_history(&self) -> Result<(), Error> {
        let history = {
            let mut history = lock(&self.history);
            let excess = history.len().saturating_sub(files::HISTORY_KEPT);
            history.drain(..excess);
            history.clone()
        };
        files::save_history(&self.data_dir, &history)
    }

    fn announce(&self, status: &MoveStatus) {
        if let Some(observer) = self.observer.get() {
            observer.changed(status);
        }
    }

    /// Changes the migration's status; `durable` ones (phase changes) are
    /// saved before they are announced.
    fn update(&self, id: &str, durable: bool, change: impl FnOnce(&mut MoveStatus)) {
        let status = {
            let mut history = lock(&self.history);
            let Some(status) = history.iter_mut().find(|s| s.id == id) else {
                return;
            };
            change(status);
            status.clone()
        };
        if durable && let Err(e) = self.save_history() {
            tracing::warn!(error = %e, "cannot save the storage moves' history");
        }
        self.announce(&status);
    }
}

/// Records of every kind the store holds.
async fn held_records(store: &Storage) -> Result<u64, Error> {
    Ok(held_by_kind(store).await?.iter().sum())
}

/// Records the store holds, per kind in [`RecordKind::ALL`] order.
async fn held_by_kind(store: &Storage) -> Result<Vec<u64>, Error> {
    let mut held = Vec::with_capacity(RecordKind::ALL.len());
    for kind in RecordKind::ALL {
        held.push(store.transfer().count(kind).await?);
    }
    Ok(held)
}

async fn save_choice(data_dir: &Path, choice: BackendChoice) -> Result<(), Error> {
    let data_dir = data_dir.to_owned();
    tokio::task::spawn_blocking(move || choice.save(&data_dir))
        .await
        .unwrap_or_else(|e| Err(Error::Unavailable(e.to_string())))
}

/// Closes a store the service left once no call holds it any more (a
/// read that began just before the switch finishes on it first).
async fn close_when_unused(store: Arc<Storage>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Arc::strong_count(&store) > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if let Err(e) = store.close().await {
        tracing::warn!(error = %e, "closing the store left behind");
    }
}

/// One migration, running.
struct Run {
    controller: Arc<Controller>,
    id: String,
    source: Arc<Storage>,
    target: Storage,
    target_config: StorageConfig,
    batch: usize,
    resume: bool,
    cancel: CancellationToken,
}

/// Why a run stopped before its switch.
enum Stop {
    Cancelled,
    Failed(String),
}

impl From<TransferError> for Stop {
    fn from(e: TransferError) -> Stop {
        Stop::Failed(e.to_string())
    }
}

impl Run {
    async fn run(self) {
        let this = self.controller.clone();
        let id = self.id.clone();
        let outcome = self.phases().await;
        lock(&this.running).take();
        match outcome {
            Ok(()) => {}
            Err((stop, target)) => {
                this.store.unfollow();
                let _ = target.close().await;
                let (phase, error) = match stop {
                    Stop::Cancelled => (MovePhase::Cancelled, None),
                    Stop::Failed(e) => (MovePhase::Failed, Some(e)),
                };
                tracing::warn!(migration = %id, phase = phase.as_str(), error = ?error, "storage move ended before its switch; the service stays on its store");
                this.update(&id, true, |s| {
                    s.phase = phase;
                    s.error = error;
                    s.eta_secs = None;
                    s.finished_at = Some(Utc::now());
                });
            }
        }
    }

    /// Runs every phase. Before the switch, an error hands the target back
    /// to be closed.
    async fn phases(self) -> Result<(), (Stop, Storage)> {
        let Run {
            controller: this,
            id,
            source,
            target,
            target_config,
            batch,
            resume,
            cancel,
        } = self;
        macro_rules! step {
            ($e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(stop) => return Err((Stop::from(stop), target)),
                }
            };
        }
        let cancelled = |cancel: &CancellationToken| {
            if cancel.is_cancelled() {
                Err(Stop::Cancelled)
            } else {
                Ok(())
            }
        };
        this.store.follow().await;

        // Copying.
        let phase_start = Instant::now();
        let held = step!(
            held_by_kind(&source)
                .await
                .map_err(|e| Stop::Failed(format!("reading the source: {e}")))
        );
        let total = held.iter().sum();
        this.update(&id, false, |s| s.records_total = total);
        let progress = CopyProgress {
            controller: this.clone(),
            id: id.clone(),
            started: Instant::now(),
            copied: std::sync::atomic::AtomicU64::new(0),
            held: Mutex::new(held),
            last: Mutex::new(Instant::now()),
        };
        // Again after a transient failure: a copy is a sync, so a resumed
        // one writes only what the failed one had not.
        let copy = with_retries("the copy", |attempt| {
            let options = CopyOptions {
                batch_size: batch,
                resume: resume || attempt > 0,
                snapshot: true,
                ..CopyOptions::default()
            };
            progress
                .copied
                .store(0, std::sync::atomic::Ordering::Relaxed);
            let (source, target, progress) = (&source, &target, &progress);
            async move {
                transfer::copy(source.transfer(), target.transfer(), &options, progress)
                    .await
                    .map(drop)
            }
        });
        let copied = tokio::select! {
            copied = copy => copied.map_err(Stop::from),
            () = cancel.cancelled() => Err(Stop::Cancelled),
        };
        step!(copied);
        // The target's own housekeeping after a bulk load (a filesystem
        // store compacts its journal) happens now, not at the first write
        // after the switch, where requests would wait for it.
        step!(
            target
                .transfer()
                .settle()
                .await
                .map_err(TransferError::Target)
        );
        let copy_ms = elapsed_ms(phase_start);
        this.update(&id, true, |s| {
            s.phase = MovePhase::Mirroring;
            s.phases.copying_ms = Some(copy_ms);
            s.eta_secs = None;
        });

        // Mirroring.
        crash_point("mirroring");
        let phase_start = Instant::now();
        step!(
            mirror(
                &this,
                &id,
                &source,
                &target,
                batch,
                &cancel,
                Changed::default()
            )
            .await
        );
        let mirror_ms = elapsed_ms(phase_start);
        this.update(&id, true, |s| {
            s.phase = MovePhase::Verifying;
            s.phases.mirroring_ms = Some(mirror_ms);
        });

        // Verifying: differences are records written while it ran (or
        // left over in a resumed target); each is applied again.
        crash_point("verifying");
        let phase_start = Instant::now();
        let checked = Counted::default();
        let verify = with_retries("the verify", |_| {
            checked.0.store(0, std::sync::atomic::Ordering::Relaxed);
            transfer::verify_listing(
                source.transfer(),
                target.transfer(),
                batch,
                &checked,
                usize::MAX,
            )
        });
        let report = tokio::select! {
            report = verify => report.map_err(Stop::from),
            () = cancel.cancelled() => Err(Stop::Cancelled),
        };
        let report = step!(report);
        let mut again = Changed::default();
        for mismatch in &report.mismatches {
            if mismatch.kind == "log" {
                if let Ok(task) = mismatch.key.parse() {
                    again.logs.insert(task);
                }
            } else if let Some(kind) = RecordKind::ALL
                .into_iter()
                .find(|k| k.as_str() == mismatch.kind)
            {
                again.records.insert((kind, mismatch.key.clone()));
            }
        }
        // Then rounds again, so that the switch has little left to apply.
        step!(mirror(&this, &id, &source, &target, batch, &cancel, again).await);
        let verify_ms = elapsed_ms(phase_start);
        let verified = checked.count();
        this.update(&id, true, |s| {
            s.records_verified = verified;
            s.phase = MovePhase::Switching;
            s.phases.verifying_ms = Some(verify_ms);
        });
        step!(cancelled(&cancel));

        // Switching: writes pause until the target is current.
        let _one = this.switching.lock().await;
        let phase_start = Instant::now();
        let paused = this.store.pause().await;
        let stall_start = Instant::now();
        crash_point("switch-paused");
        let last = this.store.take_changed();
        let last_applied = match sync::apply(&source, &target, &last, batch).await {
            Ok(applied) => applied,
            Err(e) => {
                drop(paused);
                return Err((Stop::from(e), target));
            }
        };
        let differ = match sync::differences(&source, &target, &last, batch).await {
            Ok(differ) => differ,
            Err(e) => {
                drop(paused);
                return Err((Stop::from(e), target));
            }
        };
        if !differ.is_empty() {
            drop(paused);
            return Err((
                Stop::Failed(format!(
                    "after the last changes were applied, {} records still differ (first: {}); \
                     the service stays on its store",
                    differ.len(),
                    differ
                        .iter()
                        .take(3)
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
                target,
            ));
        }
        let source_spec = lock(&this.config).spec();
        let choice = BackendChoice {
            store: target_config.spec(),
            previous: source_spec,
            migration: id.clone(),
            switched_at: Utc::now(),
            level: true,
        };
        if let Err(e) = save_choice(&this.data_dir, choice).await {
            drop(paused);
            return Err((
                Stop::Failed(format!("cannot record the switch: {e}")),
                target,
            ));
        }
        // Recorded: from here on the target is the store, even after a crash.
        crash_point("switch-recorded");
        let left = this
            .store
            .swap(target, LevelWatch::new(this.data_dir.clone()), &paused);
        this.store.follow_for_rollback(&paused);
        *lock(&this.config) = target_config;
        drop(paused);
        let stall = stall_start.elapsed().as_secs_f64() * 1000.0;
        let switch_ms = elapsed_ms(phase_start);
        tracing::info!(migration = %id, stall_ms = stall, "storage switched; the store left behind is kept for a rollback");
        // Not running any more by the time anyone sees it completed: a
        // rollback may follow at once.
        lock(&this.running).take();
        this.update(&id, true, |s| {
            s.phase = MovePhase::Completed;
            s.phases.switching_ms = Some(switch_ms);
            s.switch_stall_ms = Some(stall);
            s.records_mirrored += last_applied;
            s.finished_at = Some(Utc::now());
        });
        drop(source);
        tokio::spawn(close_when_unused(left));
        Ok(())
    }
}

/// Attempts after the first, when a store is unavailable for a moment.
const RETRIES: u32 = 5;

/// The waits before those attempts: 0.25 s, doubling, 4 s before the last.
const RETRY_BACKOFF: Backoff =
    Backoff::doubling(Duration::from_millis(250), Duration::from_secs(4));

/// Runs `step` again (`attempt` counts from 0) while it fails because a
/// store did not answer, waiting longer each time: every step of a
/// migration before its switch can be run again without harm. Other
/// errors, and the last failure, end it.
async fn with_retries<T, F, Fut>(what: &str, mut step: F) -> Result<T, TransferError>
where
    F: FnMut(u32) -> Fut,
    Fut: std::future::Future<Output = Result<T, TransferError>>,
{
    let mut attempt = 0;
    loop {
        match step(attempt).await {
            Err(
                TransferError::Source(Error::Unavailable(e))
                | TransferError::Target(Error::Unavailable(e)),
            ) if attempt < RETRIES => {
                let wait = RETRY_BACKOFF.delay(attempt, 0.0);
                tracing::warn!(error = %e, ?wait, "storage move: {what} failed for a moment; trying again");
                tokio::time::sleep(wait).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The crash tests' hook: `ORCHESTRATOR_LIVE_MIGRATION_ABORT=<point>`
/// aborts the process at that point, as a power cut would. A signal sent
/// from outside cannot land reliably inside a pause of milliseconds.
fn crash_point(point: &str) {
    if std::env::var("ORCHESTRATOR_LIVE_MIGRATION_ABORT").is_ok_and(|p| p == point) {
        eprintln!("storage move: ORCHESTRATOR_LIVE_MIGRATION_ABORT={point} reached; aborting");
        std::process::abort();
    }
}

/// Mirror rounds: each applies what was written since the one before
/// (`first` too, in the first), until a round is small or there were
/// [`MIRROR_ROUNDS`]. While the target takes writes faster than the service
/// makes them, each round is shorter than the one before, and so is what
/// the switch has left to apply while writes wait.
async fn mirror(
    this: &Controller,
    id: &str,
    source: &Storage,
    target: &Storage,
    batch: usize,
    cancel: &CancellationToken,
    first: Changed,
) -> Result<(), Stop> {
    let mut pending = first;
    let mut previous = usize::MAX;
    for _ in 0..MIRROR_ROUNDS {
        if cancel.is_cancelled() {
            return Err(Stop::Cancelled);
        }
        pending.merge(this.store.take_changed());
        let n = pending.len();
        if n == 0 {
            break;
        }
        let applied = with_retries("a mirror round", |_| {
            sync::apply(source, target, &pending, batch)
        })
        .await?;
        pending = Changed::default();
        this.update(id, false, |s| s.records_mirrored += applied);
        // A round no smaller than the one before means the target takes
        // writes no faster than the service makes them: each further round
        // would take longer than the last, and the move would not end while
        // the load lasts. The switch applies the rest with writes paused
        // (a longer stall, but an end).
        if n <= SMALL_ROUND || n >= previous {
            break;
        }
        previous = n;
    }
    Ok(())
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The copy's progress, into the migration's status.
struct CopyProgress {
    controller: Arc<Controller>,
    id: String,
    started: Instant,
    copied: std::sync::atomic::AtomicU64,
    /// Records per kind: counted at the start, then again as each kind
    /// begins (the copy takes that many of it).
    held: Mutex<Vec<u64>>,
    /// When progress was last announced.
    last: Mutex<Instant>,
}

impl Progress for CopyProgress {
    fn phase(&self, kind: RecordKind, total: u64) {
        if let Some(at) = RecordKind::ALL.iter().position(|k| *k == kind) {
            lock(&self.held)[at] = total;
        }
    }

    fn advance(&self, records: u64) {
        use std::sync::atomic::Ordering;
        let copied = self.copied.fetch_add(records, Ordering::Relaxed) + records;
        let total: u64 = lock(&self.held).iter().sum();
        {
            let mut last = lock(&self.last);
            if last.elapsed() < PROGRESS_EVERY && copied < total {
                return;
            }
            *last = Instant::now();
        }
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = copied as f64 / secs;
        let eta = (rate > 0.0).then(|| (total.saturating_sub(copied) as f64 / rate).ceil() as u64);
        self.controller.update(&self.id, false, |s| {
            s.records_total = total;
            s.records_copied = copied;
            s.rate = (rate * 10.0).round() / 10.0;
            s.eta_secs = eta;
        });
    }
}

/// Counts what a verify compared.
#[derive(Default)]
struct Counted(std::sync::atomic::AtomicU64);

impl Counted {
    fn count(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Progress for Counted {
    fn phase(&self, _: RecordKind, _: u64) {}
    fn advance(&self, records: u64) {
        self.0
            .fetch_add(records, std::sync::atomic::Ordering::Relaxed);
    }
}
