//! The snapshot, `snapshot.jsonl`: every record as of the last compaction,
//! one line each (see [`super::line`]), read back by the journal's reader.
//!
//! A compaction takes the records under the state lock
//! ([`Compaction::take`]): shared pointers for what is in memory, places
//! for what is on disk. The journal writer thread writes them, outside the
//! lock, with [`super::atomic::write_atomically_with`], then points every record at its
//! new line ([`SnapshotJob::installed`]) and empties the journal. So the
//! snapshot is only ever replaced whole, never torn.

use std::fs::File;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use orchestrator_core::access::AuditRecord;
use orchestrator_core::{Task, TaskId, Workflow, WorkflowId};

use super::history::{Files, Held, Place};
use super::journal::SnapshotJob;
use super::line::Line;
use super::state::State;
use crate::{Error, Record, RecordKind, Result};

/// A workflow or task as a compaction copies it.
enum Taken<T> {
    Memory(Arc<T>),
    /// Its line, read on the writer thread.
    Disk(Place),
}

/// Every record of a store, taken to be written as its snapshot.
pub(super) struct Compaction {
    workflows: Vec<(WorkflowId, u64, Taken<Workflow>)>,
    tasks: Vec<(TaskId, u64, Taken<Task>)>,
    audit: Vec<(String, Taken<AuditRecord>)>,
    /// Every other record, small and few: copied.
    others: Vec<Line>,
    /// Where records on disk are read from: the files as they are now.
    files: Files,
    /// Where each workflow and task was written, in the order above.
    workflow_places: Vec<Option<Place>>,
    task_places: Vec<Option<Place>>,
    audit_places: Vec<Option<Place>>,
    /// To point the records at their new lines once the snapshot is in place.
    state: Arc<Mutex<State>>,
}

impl Compaction {
    /// Takes every record of `state`. Called under the state lock, so it
    /// only copies pointers and places; the writing happens after.
    pub(super) fn take(state: &mut State, shared: Arc<Mutex<State>>) -> Result<Compaction> {
        // An earlier compaction still being written will empty the journal
        // before this one runs, and point the records it names elsewhere
        // only once done: a record this one would read from the journal is
        // read now instead. (Rare: the journal filled up again while a
        // snapshot was written.)
        let earlier = state.compactions_in_flight > 0;
        state.compactions_in_flight += 1;
        let state = &*state;
        fn taken<T, S>(
            held: &Held<T, S>,
            earlier: bool,
            read: impl FnOnce(Place) -> Result<Arc<T>>,
        ) -> Result<Taken<T>> {
            Ok(match held {
                Held::Memory { record, .. } => Taken::Memory(record.clone()),
                Held::Disk { at, .. } if earlier && at.in_journal_file() => {
                    Taken::Memory(read(*at)?)
                }
                Held::Disk { at, .. } => Taken::Disk(*at),
            })
        }
        let workflows = state
            .held_workflows()
            .map(|(id, held)| {
                let version = state.workflow_state(*id).map_or(0, |s| s.0);
                let taken = taken(held, earlier, |_| {
                    state.workflow(*id)?.ok_or(Error::WorkflowNotFound(*id))
                })?;
                Ok((*id, version, taken))
            })
            .collect::<Result<_>>()?;
        let tasks = state
            .held_tasks()
            .map(|(id, held)| {
                let version = state.task_version(*id).unwrap_or(0);
                let taken = taken(held, earlier, |_| {
                    state.task(*id)?.ok_or(Error::TaskNotFound(*id))
                })?;
                Ok((*id, version, taken))
            })
            .collect::<Result<_>>()?;
        let audit = state
            .held_audit()
            .map(|(id, held)| {
                let id = id.text();
                let taken = taken(held, earlier, |at| {
                    match state.files().read(RecordKind::Audit, &id, at)? {
                        Record::Audit(record) => Ok(Arc::new(record)),
                        _ => unreachable!("Files::read returns a record of the kind asked for"),
                    }
                })?;
                Ok((id.into_owned(), taken))
            })
            .collect::<Result<_>>()?;
        let others = (state.tokens().cloned().map(Line::Token))
            .chain(state.secrets().cloned().map(Line::Secret))
            .chain(state.schedules().cloned().map(Line::Schedule))
            .chain(state.all_claims().cloned().map(Line::ScheduleClaim))
            .chain(
                state
                    .subscriptions()
                    .cloned()
                    .map(Line::WebhookSubscription),
            )
            .chain(state.deliveries().cloned().map(Line::WebhookDelivery))
            .collect();
        Ok(Compaction {
            workflows,
            tasks,
            audit,
            others,
            files: state.files().clone(),
            workflow_places: Vec::new(),
            task_places: Vec::new(),
            audit_places: Vec::new(),
            state: shared,
        })
    }
}

/// Writes lines and counts the bytes, so each line's place is known.
struct Counted<'a> {
    out: &'a mut dyn Write,
    offset: u64,
    buffer: Vec<u8>,
}

impl Counted<'_> {
    /// Writes one line (given framed, without its newline) and returns
    /// where it is.
    fn line(&mut self, framed: &[u8]) -> io::Result<Option<Place>> {
        let at = Place::in_snapshot(self.offset, framed.len());
        self.out.write_all(framed)?;
        self.out.write_all(b"\n")?;
        self.offset += framed.len() as u64 + 1;
        Ok(at)
    }

    /// Encodes `line` and writes it.
    fn encode(&mut self, line: &Line) -> io::Result<Option<Place>> {
        self.buffer.clear();
        line.encode_into(&mut self.buffer)?;
        let mut framed = std::mem::take(&mut self.buffer);
        framed.pop(); // the newline `encode_into` ends with
        let at = self.line(&framed);
        self.buffer = framed;
        at
    }

    /// Writes a record that is on disk: a snapshot line as it is (one
    /// record a line, already framed), a journal line's record on its own.
    fn copy(
        &mut self,
        files: &Files,
        kind: RecordKind,
        key: &str,
        at: Place,
    ) -> io::Result<Option<Place>> {
        if at.in_journal_file() {
            let record = files.read(kind, key, at).map_err(io::Error::other)?;
            self.encode(&Line::of(record))
        } else {
            let framed = files.read_line(at).map_err(io::Error::other)?;
            self.line(&framed)
        }
    }
}

impl SnapshotJob for Compaction {
    /// One line a record, workflows first, then tasks (a task's workflow
    /// is known before it when the snapshot is read back).
    fn write(&mut self, out: &mut dyn Write) -> io::Result<()> {
        let mut lines = Counted {
            out,
            offset: 0,
            buffer: Vec::new(),
        };
        for (id, _, taken) in &self.workflows {
            let at = match taken {
                Taken::Memory(w) => lines.encode(&Line::Workflow(Workflow::clone(w)))?,
                Taken::Disk(at) => {
                    lines.copy(&self.files, RecordKind::Workflow, &id.to_string(), *at)?
                }
            };
            self.workflow_places.push(at);
        }
        for (id, _, taken) in &self.tasks {
            let at = match taken {
                Taken::Memory(t) => lines.encode(&Line::Task(Task::clone(t)))?,
                Taken::Disk(at) => {
                    lines.copy(&self.files, RecordKind::Task, &id.to_string(), *at)?
                }
            };
            self.task_places.push(at);
        }
        for (id, taken) in &self.audit {
            let at = match taken {
                Taken::Memory(a) => lines.encode(&Line::Audit(AuditRecord::clone(a)))?,
                Taken::Disk(at) => lines.copy(&self.files, RecordKind::Audit, id, *at)?,
            };
            self.audit_places.push(at);
        }
        for line in &self.others {
            lines.encode(line)?;
        }
        Ok(())
    }

    fn installed(self: Box<Self>, snapshot: File) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.compactions_in_flight -= 1;
        for ((id, version, _), at) in self.workflows.iter().zip(&self.workflow_places) {
            state.repoint_workflow(*id, *version, *at);
        }
        for ((id, version, _), at) in self.tasks.iter().zip(&self.task_places) {
            state.repoint_task(*id, *version, *at);
        }
        for ((id, _), at) in self.audit.iter().zip(&self.audit_places) {
            state.repoint_audit(id, *at);
        }
        state.install_snapshot(snapshot);
        // What finished before the compaction is durable in the snapshot
        // now, in lines of its own: out of memory with it.
        for (id, _, _) in &self.workflows {
            state.evict_finished(*id, 0, false);
        }
        for (id, _) in &self.audit {
            state.evict_audit(id, 0);
        }
    }
}
