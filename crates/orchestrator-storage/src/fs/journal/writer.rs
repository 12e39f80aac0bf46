//! The journal writer: one thread that appends the lines queued under the
//! state lock, batching concurrent appends into a single `fdatasync`
//! (group commit), and that replaces the snapshot and empties the journal
//! when a compaction is queued, in the order of the appends.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use tokio::sync::oneshot;

use crate::fs::atomic::write_atomically_with;
use crate::{Error, Result};

/// Most commands folded into one write-and-sync.
const MAX_BATCH: usize = 4096;

type Done = oneshot::Sender<std::result::Result<(), String>>;

enum Command {
    Append {
        bytes: Vec<u8>,
        done: Done,
    },
    /// Replace the snapshot with what `job` writes, then empty the
    /// journal. Queued behind every append issued before it, so the
    /// snapshot (of records taken from memory that already contains those
    /// appends) covers them all. The job runs on the writer thread: the
    /// records were taken under the state lock, their encoding happens
    /// here, outside it and off the async workers.
    Snapshot {
        job: Box<dyn SnapshotJob>,
        done: Done,
    },
}

/// A compaction's work on the writer thread.
pub(crate) trait SnapshotJob: Send {
    /// Writes the snapshot's lines to `out`, in order from offset 0.
    fn write(&mut self, out: &mut dyn Write) -> io::Result<()>;

    /// Called once the new snapshot is in place and synced, with it opened
    /// to read, and before the journal is emptied: whatever pointed into
    /// the old files must point into the new snapshot by the time this
    /// returns.
    fn installed(self: Box<Self>, snapshot: File);
}

/// Handle to the writer thread.
pub(crate) struct JournalWriter {
    sender: Mutex<Option<mpsc::Sender<Command>>>,
    poisoned: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl JournalWriter {
    pub(crate) fn start(journal_path: PathBuf, snapshot_path: PathBuf) -> Result<JournalWriter> {
        let created = !journal_path.exists();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(|e| Error::io(format!("open {}", journal_path.display()), e))?;
        if created {
            // A new file's name lives in its directory: without syncing it,
            // a power cut could lose the journal, and with it every append
            // acknowledged as durable.
            let dir = journal_path.parent().unwrap_or(Path::new("."));
            File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| Error::io(format!("sync directory {}", dir.display()), e))?;
        }
        let (sender, receiver) = mpsc::channel();
        let poisoned = Arc::new(AtomicBool::new(false));
        let thread_poisoned = poisoned.clone();
        let thread = std::thread::Builder::new()
            .name("journal-writer".into())
            .spawn(move || {
                writer_loop(
                    file,
                    &journal_path,
                    &snapshot_path,
                    receiver,
                    &thread_poisoned,
                )
            })
            .map_err(|e| Error::io("start journal writer thread", e))?;
        Ok(JournalWriter {
            sender: Mutex::new(Some(sender)),
            poisoned,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned("a journal write failed".into()));
        }
        Ok(())
    }

    /// Usable, and not shut down: what `health` reports.
    pub(crate) fn check_open(&self) -> Result<()> {
        self.check_usable()?;
        match self
            .sender
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(_) => Ok(()),
            None => Err(Error::Closed),
        }
    }

    fn send(&self, make: impl FnOnce(Done) -> Command) -> Result<Pending> {
        self.check_usable()?;
        let (done, receiver) = oneshot::channel();
        let guard = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        let sender = guard.as_ref().ok_or(Error::Closed)?;
        sender.send(make(done)).map_err(|_| Error::Closed)?;
        Ok(Pending(receiver))
    }

    /// Queues already-encoded lines. Call it while holding the lock that
    /// ordered the in-memory change, so the journal order matches.
    pub(crate) fn append(&self, bytes: Vec<u8>) -> Result<Pending> {
        self.send(|done| Command::Append { bytes, done })
    }

    /// Queues a compaction. Call it while holding the lock that ordered
    /// the in-memory changes, with the records `job` writes taken under
    /// it.
    pub(crate) fn snapshot(&self, job: Box<dyn SnapshotJob>) -> Result<Pending> {
        self.send(|done| Command::Snapshot { job, done })
    }

    /// Stops the thread after it has written everything queued.
    pub(crate) fn shutdown(&self) {
        self.sender.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

/// A queued write; resolves once it is durable.
pub(crate) struct Pending(oneshot::Receiver<std::result::Result<(), String>>);

impl Pending {
    pub(crate) async fn durable(self) -> Result<()> {
        match self.0.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(Error::Poisoned(message)),
            Err(_) => Err(Error::Closed),
        }
    }
}

fn writer_loop(
    mut file: File,
    journal_path: &Path,
    snapshot_path: &Path,
    receiver: mpsc::Receiver<Command>,
    poisoned: &AtomicBool,
) {
    let mut buffer = Vec::with_capacity(64 * 1024);
    let mut waiting: Vec<Done> = Vec::new();
    while let Ok(first) = receiver.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match receiver.try_recv() {
                Ok(command) => batch.push(command),
                Err(_) => break,
            }
        }
        let mut result: io::Result<()> = Ok(());
        for command in batch {
            if poisoned.load(Ordering::Acquire) {
                let done = match command {
                    Command::Append { done, .. } | Command::Snapshot { done, .. } => done,
                };
                let _ = done.send(Err("an earlier journal write failed".into()));
                continue;
            }
            match command {
                Command::Append { bytes, done } => {
                    buffer.extend_from_slice(&bytes);
                    waiting.push(done);
                }
                Command::Snapshot { mut job, done } => {
                    result = flush(&mut file, &mut buffer).and_then(|()| {
                        write_atomically_with(snapshot_path, |out| job.write(out))?;
                        job.installed(File::open(snapshot_path)?);
                        // The snapshot now holds everything; start the journal afresh.
                        file.set_len(0)?;
                        file.sync_all()
                    });
                    waiting.push(done);
                    if result.is_err() {
                        break;
                    }
                }
            }
        }
        if result.is_ok() {
            result = flush(&mut file, &mut buffer);
        }
        let reply = match &result {
            Ok(()) => Ok(()),
            Err(e) => {
                poisoned.store(true, Ordering::Release);
                tracing::error!(journal = %journal_path.display(), error = %e, "journal write failed; storage refuses further writes");
                buffer.clear();
                Err(format!(
                    "journal write to {} failed: {e}",
                    journal_path.display()
                ))
            }
        };
        for done in waiting.drain(..) {
            let _ = done.send(reply.clone());
        }
    }
}

fn flush(file: &mut File, buffer: &mut Vec<u8>) -> io::Result<()> {
    if buffer.is_empty() {
        return Ok(());
    }
    file.write_all(buffer)?;
    file.sync_data()?;
    buffer.clear();
    Ok(())
}
