//! [`BulkTransfer`] on SurrealDB: key-ordered scans and bulk imports for
//! `orchestrator migrate`, and the read-only store a migration copies from.

use async_trait::async_trait;
use orchestrator_core::TaskId;
use surrealdb::types::{Bytes, RecordId, Variables};

use super::SurrealBackend;
use super::errors::db_error;
use super::recent::Written;
use super::rows::{
    LOG_CHUNKS_PER_READ, LogChunkRow, LogLengthRow, gather_log, is_plain_key, row_of, table_of,
    to_i64, version_param,
};
use crate::{
    Backend, BulkTransfer, Error, LogChunk, LogPiece, Record, RecordKind, Result, Scanned,
};

/// Logs read per request by `read_logs`.
const LOGS_PER_REQUEST: usize = 25;

/// A store opened by [`SurrealBackend::open_read_only`], to be copied
/// from: its bulk reads, and nothing that writes.
pub struct SurrealSource(pub(super) SurrealBackend);

#[async_trait]
impl BulkTransfer for SurrealSource {
    fn name(&self) -> &'static str {
        self.0.client.name
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        self.0.scan(kind, after, limit).await
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        self.0.fetch(kind, keys).await
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        self.0.count(kind).await
    }

    async fn import(&self, _: &[Record]) -> Result<()> {
        Err(Error::ReadOnly(self.0.client.location.clone()))
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        self.0.log_lengths(ids).await
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        self.0.read_logs(asks).await
    }

    async fn import_logs(&self, _: &[LogPiece]) -> Result<()> {
        Err(Error::ReadOnly(self.0.client.location.clone()))
    }

    async fn close(&self) -> Result<()> {
        Backend::close(&self.0).await
    }
}

#[async_trait]
impl BulkTransfer for SurrealBackend {
    fn name(&self) -> &'static str {
        self.client.name
    }

    async fn scan(
        &self,
        kind: RecordKind,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Scanned>> {
        let table = table_of(kind);
        // The range is put together from a table constant and a key of
        // plain characters only, so nothing else reaches the statement. A
        // range over record ids is a key scan, not a table scan.
        let from = match after {
            None => table.to_owned(),
            Some(key) if is_plain_key(key) => format!("{table}:⟨{key}⟩>.."),
            // Every key stored here is plain; anything else sorts after them.
            Some(_) => return Ok(Vec::new()),
        };
        let mut vars = Variables::new();
        vars.insert("limit", to_i64(limit));
        let sql =
            format!("SELECT VALUE [record::id(id), doc] FROM {from} ORDER BY id LIMIT $limit;");
        let mut response = self.query("scan records", &sql, &vars).await?;
        let rows: Vec<(String, String)> =
            response.take(0).map_err(|e| db_error("scan records", &e))?;
        Ok(Self::scanned(kind, rows))
    }

    async fn fetch(&self, kind: RecordKind, keys: &[String]) -> Result<Vec<Scanned>> {
        let table = table_of(kind);
        let ids: Vec<RecordId> = keys
            .iter()
            .filter(|k| is_plain_key(k))
            .map(|k| RecordId::new(table, k.clone()))
            .collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut vars = Variables::new();
        vars.insert("ids", ids);
        let mut response = self
            .query(
                "fetch records",
                "SELECT VALUE [record::id(id), doc] FROM $ids WHERE id != NONE;",
                &vars,
            )
            .await?;
        let rows: Vec<(String, String)> = response
            .take(0)
            .map_err(|e| db_error("fetch records", &e))?;
        Ok(Self::scanned(kind, rows))
    }

    async fn count(&self, kind: RecordKind) -> Result<u64> {
        let sql = format!("SELECT count() AS n FROM {} GROUP ALL;", table_of(kind));
        let mut response = self.query("count records", &sql, &Variables::new()).await?;
        let counts: Vec<i64> = response
            .take((0, "n"))
            .map_err(|e| db_error("count records", &e))?;
        Ok(counts.first().copied().unwrap_or(0).try_into().unwrap_or(0))
    }

    async fn import(&self, records: &[Record]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        // One bulk `INSERT` per table: statements evaluated per record (a
        // `FOR` over the rows, `UPSERT` each) cost SurrealDB far more than
        // the writes themselves. `INSERT` refuses a key that exists, so
        // whatever the target holds under these keys is deleted first, in
        // the same transaction: the records are replaced whole, as stored.
        let mut by_table: std::collections::BTreeMap<
            &'static str,
            (Vec<RecordId>, Vec<serde_json::Value>),
        > = Default::default();
        for record in records {
            let table = table_of(record.kind());
            let key = record.key();
            let mut row = row_of(record)?;
            row["id"] = key.clone().into();
            let (ids, rows) = by_table.entry(table).or_default();
            ids.push(RecordId::new(table, key));
            rows.push(row);
        }
        let mut vars = Variables::new();
        // Table names are constants of this module; the rows are bound.
        let mut sql = String::from("BEGIN;\n");
        for (table, (ids, rows)) in by_table {
            sql.push_str(&format!(
                "DELETE ${table}_ids RETURN NONE;\nINSERT INTO {table} ${table}_rows RETURN NONE;\n"
            ));
            vars.insert(format!("{table}_ids"), ids);
            vars.insert(format!("{table}_rows"), serde_json::Value::Array(rows));
        }
        sql.push_str("COMMIT;");
        let result = self.query("import records", &sql, &vars).await;
        if let Some(recent) = &self.recent {
            let written = records.iter().filter_map(|record| match record {
                Record::Task(task) => Some(Written::Task(task.id)),
                Record::Workflow(workflow) => Some(Written::Workflow(workflow.id)),
                _ => None,
            });
            recent.wrote(written, &result);
        }
        result?;
        Ok(())
    }

    async fn log_lengths(&self, ids: &[TaskId]) -> Result<Vec<u64>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut vars = Variables::new();
        vars.insert(
            "ids",
            ids.iter()
                .map(|id| RecordId::new("log_length", id.to_string()))
                .collect::<Vec<_>>(),
        );
        let mut response = self
            .query(
                "read log lengths",
                "SELECT VALUE [record::id(id), bytes] FROM $ids WHERE id != NONE;",
                &vars,
            )
            .await?;
        let rows: Vec<(String, i64)> = response
            .take(0)
            .map_err(|e| db_error("read log lengths", &e))?;
        let lengths: std::collections::HashMap<String, i64> = rows.into_iter().collect();
        Ok(ids
            .iter()
            .map(|id| {
                lengths
                    .get(&id.to_string())
                    .map_or(0, |n| u64::try_from(*n).unwrap_or(0))
            })
            .collect())
    }

    async fn read_logs(&self, asks: &[(TaskId, u64, usize)]) -> Result<Vec<LogChunk>> {
        // A few logs per request, one statement each: each reads by the
        // index on (task, end_offset), and none pays a round trip of its
        // own. Not all in one request: every statement of a request sees
        // all of its bound parameters, so a request's cost grows with the
        // square of its statements. An answer cut short by the chunk limit
        // is read on by the caller.
        let mut answers = Vec::with_capacity(asks.len());
        for group in asks.chunks(LOGS_PER_REQUEST) {
            let mut vars = Variables::new();
            vars.insert("limit", LOG_CHUNKS_PER_READ);
            let mut sql = String::new();
            for (i, &(id, offset, _)) in group.iter().enumerate() {
                sql.push_str(&format!(
                    "SELECT VALUE [start_offset, end_offset, data] FROM log_chunk \
                     WHERE task = $t{i} AND end_offset > $f{i} ORDER BY end_offset ASC LIMIT $limit;\n"
                ));
                vars.insert(format!("t{i}"), id.to_string());
                vars.insert(format!("f{i}"), i64::try_from(offset).unwrap_or(i64::MAX));
            }
            let mut response = self.query("read task logs", &sql, &vars).await?;
            for (i, &(_, offset, max_bytes)) in group.iter().enumerate() {
                let chunks: Vec<(i64, i64, Bytes)> = response
                    .take(i)
                    .map_err(|e| db_error("read task logs", &e))?;
                let mut data = Vec::new();
                gather_log(chunks, offset, max_bytes, &mut data);
                answers.push(LogChunk {
                    next_offset: offset + data.len() as u64,
                    data,
                });
            }
        }
        Ok(answers)
    }

    async fn import_logs(&self, pieces: &[LogPiece]) -> Result<()> {
        let pieces: Vec<&LogPiece> = pieces.iter().filter(|p| !p.data.is_empty()).collect();
        if pieces.is_empty() {
            return Ok(());
        }
        // Per task: the length its log must have now (its first piece's
        // offset) and the length it will have. Pieces of a task that do
        // not follow each other would leave a gap or an overlap.
        let mut tasks: Vec<(TaskId, u64, u64)> = Vec::new();
        let mut index: std::collections::HashMap<TaskId, usize> = Default::default();
        let mut chunks = Vec::with_capacity(pieces.len());
        for piece in &pieces {
            let end = piece.offset + piece.data.len() as u64;
            match index.get(&piece.task) {
                Some(&i) if tasks[i].2 != piece.offset => {
                    return Err(Error::Conflict {
                        what: "task log",
                        id: piece.task.to_string(),
                        expected: piece.offset,
                        found: tasks[i].2,
                    });
                }
                Some(&i) => tasks[i].2 = end,
                None => {
                    index.insert(piece.task, tasks.len());
                    tasks.push((piece.task, piece.offset, end));
                }
            }
            chunks.push(LogChunkRow {
                task: piece.task.to_string(),
                start_offset: i64::try_from(piece.offset).unwrap_or(i64::MAX),
                end_offset: i64::try_from(end).unwrap_or(i64::MAX),
                data: Bytes::from(piece.data.clone()),
            });
        }
        let ids: Vec<RecordId> = tasks
            .iter()
            .map(|(task, _, _)| RecordId::new("log_length", task.to_string()))
            .collect();
        // What the lengths must read now, in the order of `ids`: a log of
        // length 0 has no record.
        let expected: Vec<(String, i64)> = tasks
            .iter()
            .filter(|(_, offset, _)| *offset > 0)
            .map(|(task, offset, _)| (task.to_string(), version_param(*offset)))
            .collect();
        let lengths: Vec<LogLengthRow> = tasks
            .iter()
            .map(|(task, _, end)| LogLengthRow {
                id: RecordId::new("log_length", task.to_string()),
                bytes: version_param(*end),
            })
            .collect();
        let mut vars = Variables::new();
        vars.insert("ids", ids);
        vars.insert("expected", expected);
        vars.insert("lengths", lengths);
        vars.insert("chunks", chunks);
        // As `append_log`, but each log only from exactly its length, all
        // in one transaction of bulk statements: a repeated import can
        // never write a chunk twice, and an interrupted one wrote nothing.
        let result = self
            .query(
                "import task logs",
                "BEGIN;
                 LET $found = (SELECT VALUE [record::id(id), bytes] FROM $ids WHERE bytes > 0);
                 IF $found != $expected { THROW 'orchestrator: log length mismatch' };
                 DELETE $ids RETURN NONE;
                 INSERT INTO log_length $lengths RETURN NONE;
                 INSERT INTO log_chunk $chunks RETURN NONE;
                 COMMIT;",
                &vars,
            )
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(Error::Database { message, .. }) if message.contains("log length mismatch") => {
                let asked: Vec<TaskId> = tasks.iter().map(|(task, _, _)| *task).collect();
                let found = self.log_lengths(&asked).await?;
                let (task, expected, found) = tasks
                    .iter()
                    .zip(found)
                    .map(|(&(task, offset, _), found)| (task, offset, found))
                    .find(|(_, offset, found)| offset != found)
                    .unwrap_or((tasks[0].0, tasks[0].1, tasks[0].1));
                Err(Error::Conflict {
                    what: "task log",
                    id: task.to_string(),
                    expected,
                    found,
                })
            }
            Err(e) => Err(e),
        }
    }

    async fn close(&self) -> Result<()> {
        Backend::close(self).await
    }
}
