//! The 100k-task data directory of workload 5.
//!
//! A real service runs one seed workflow; its final records are read back
//! from the journal and copied, with fresh UUIDv7 ids, into the layout a
//! compacted filesystem backend leaves behind (docs/storage.md): a
//! `snapshot.jsonl` of every workflow record, then every task record, each
//! line `<crc32 hex> <json>`, and an empty `journal.jsonl`. Every task also
//! gets a log, `logs/<task-id>.log`: the seed task's captured output,
//! padded with synthetic output lines to about [`LOG_BYTES`]. Running 100k
//! scripts for real would take minutes; the records are the same ones.

use std::collections::{HashMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};

/// The final records of the seed run, as record JSON text.
pub struct Seed {
    pub workflow: String,
    /// Task record lines, oldest task first.
    pub tasks: Vec<String>,
    /// The ids inside the texts: the workflow's first, then the tasks'.
    pub ids: Vec<String>,
    /// The log of each task of the copies, in the order of `tasks`.
    pub logs: Vec<Vec<u8>>,
}

/// The least size of a generated task log ("a few hundred bytes").
pub const LOG_BYTES: usize = 320;

/// The seed task's own log, padded with output-like lines to at least
/// [`LOG_BYTES`] and cut at four times that.
fn padded_log(mut log: Vec<u8>, n: usize) -> Vec<u8> {
    let mut line = 0;
    while log.len() < LOG_BYTES {
        line += 1;
        let text = format!(
            "[bench] step {n:03} output line {line}: provisioning progress {}%\n",
            line * 10
        );
        log.extend_from_slice(text.as_bytes());
    }
    log.truncate(LOG_BYTES * 4);
    log
}

/// Replays `snapshot.jsonl` (if any) and `journal.jsonl` of a stopped seed
/// service; the last record of each id wins, as at a real start.
pub fn read_seed(dir: &Path) -> Result<Seed> {
    let mut workflows: HashMap<String, Value> = HashMap::new();
    let mut tasks: HashMap<String, Value> = HashMap::new();
    for file in ["snapshot.jsonl", "journal.jsonl"] {
        let path = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let (_, json) = line
                .split_once(' ')
                .ok_or_else(|| anyhow!("{}:{}: not `<crc> <json>`", path.display(), n + 1))?;
            let record: Value = serde_json::from_str(json)
                .with_context(|| format!("{}:{}", path.display(), n + 1))?;
            let data = &record["data"];
            match record["type"].as_str() {
                Some("workflow") => put(&mut workflows, data)?,
                Some("task") => put(&mut tasks, data)?,
                Some("submission") => {
                    put(&mut workflows, &data["workflow"])?;
                    for t in data["tasks"].as_array().into_iter().flatten() {
                        put(&mut tasks, t)?;
                    }
                }
                // Access records of the seed service (its audit trail, a
                // token) are not part of the data set.
                Some("audit" | "token" | "secret" | "secret_deleted") => {}
                other => bail!(
                    "{}:{}: unknown record type {other:?}; the bench's data generator needs updating",
                    path.display(),
                    n + 1
                ),
            }
        }
    }
    if workflows.len() != 1 {
        bail!(
            "expected one seed workflow in {}, found {}",
            dir.display(),
            workflows.len()
        );
    }
    let (wf_id, wf) = workflows
        .into_iter()
        .next()
        .ok_or_else(|| anyhow!("no workflow"))?;
    let mut task_ids: Vec<String> = tasks.keys().cloned().collect();
    task_ids.sort(); // UUIDv7: creation order
    let mut ids = vec![wf_id];
    let mut texts = Vec::new();
    let logs = orchestrator_storage::fs::read_task_logs(dir, &task_ids_of(&task_ids)?)?
        .into_iter()
        .enumerate()
        .map(|(n, log)| padded_log(log, n))
        .collect();
    for id in &task_ids {
        texts.push(serde_json::to_string(
            &json!({"type": "task", "data": tasks[id]}),
        )?);
        ids.push(id.clone());
    }
    Ok(Seed {
        workflow: serde_json::to_string(&json!({"type": "workflow", "data": wf}))?,
        tasks: texts,
        ids,
        logs,
    })
}

fn task_ids_of(ids: &[String]) -> Result<Vec<orchestrator_core::TaskId>> {
    ids.iter()
        .map(|id| {
            let uuid: uuid::Uuid = id.parse().with_context(|| format!("task id {id}"))?;
            Ok(orchestrator_core::TaskId::from_uuid(uuid))
        })
        .collect()
}

fn put(map: &mut HashMap<String, Value>, data: &Value) -> Result<()> {
    let id = data["id"]
        .as_str()
        .ok_or_else(|| anyhow!("record without an id"))?;
    map.insert(id.to_owned(), data.clone());
    Ok(())
}

/// A text cut at every seed id, so copies are rendered in one pass.
struct Pieces {
    literals: Vec<String>,
    /// `holes[i]` is the id index between `literals[i]` and `literals[i+1]`.
    holes: Vec<usize>,
}

fn cut(text: &str, index: &HashMap<&str, usize>) -> Pieces {
    let mut literals = Vec::new();
    let mut holes = Vec::new();
    let mut last = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i + 36 <= bytes.len() {
        if let Some(&k) = text.get(i..i + 36).and_then(|s| index.get(s)) {
            literals.push(text[last..i].to_owned());
            holes.push(k);
            i += 36;
            last = i;
        } else {
            i += 1;
        }
    }
    literals.push(text[last..].to_owned());
    Pieces { literals, holes }
}

fn render(p: &Pieces, ids: &[String], out: &mut String) {
    out.clear();
    for (lit, hole) in p.literals.iter().zip(&p.holes) {
        out.push_str(lit);
        out.push_str(&ids[*hole]);
    }
    if let Some(last) = p.literals.last() {
        out.push_str(last);
    }
}

fn line(json: &str, out: &mut impl Write) -> std::io::Result<u64> {
    let crc = crc32fast::hash(json.as_bytes());
    writeln!(out, "{crc:08x} {json}")?;
    Ok(9 + json.len() as u64 + 1)
}

/// What [`write`] wrote.
pub struct Written {
    pub snapshot_bytes: u64,
    pub logs: usize,
    pub log_bytes: u64,
}

/// Writes `copies` copies of the seed workflow, and a log for each task,
/// into `dir`.
pub fn write(seed: &Seed, seed_dir: &Path, dir: &Path, copies: usize) -> Result<Written> {
    std::fs::create_dir_all(dir)?;
    std::fs::copy(seed_dir.join("layout.json"), dir.join("layout.json"))
        .context("the seed data dir has no layout.json")?;
    let index: HashMap<&str, usize> = seed
        .ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    if index.len() != seed.ids.len() {
        bail!("duplicate ids in the seed");
    }
    let wf = cut(&seed.workflow, &index);
    let tasks: Vec<Pieces> = seed.tasks.iter().map(|t| cut(t, &index)).collect();
    // Ids for every copy, in creation order.
    let mut all_ids: Vec<Vec<String>> = Vec::with_capacity(copies);
    let mut seen = HashSet::new();
    for _ in 0..copies {
        let ids: Vec<String> = (0..seed.ids.len())
            .map(|_| uuid::Uuid::now_v7().to_string())
            .collect();
        for id in &ids {
            if !seen.insert(id.clone()) {
                bail!("uuid collision");
            }
        }
        all_ids.push(ids);
    }
    let file = std::fs::File::create(dir.join("snapshot.jsonl"))?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    let mut buf = String::new();
    let mut bytes = 0;
    for ids in &all_ids {
        render(&wf, ids, &mut buf);
        bytes += line(&buf, &mut out)?;
    }
    for ids in &all_ids {
        for t in &tasks {
            render(t, ids, &mut buf);
            bytes += line(&buf, &mut out)?;
        }
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::File::create(dir.join("journal.jsonl"))?.sync_all()?;
    // Written as an import writes them: packed, many to a file.
    let (mut logs, mut log_bytes) = (0, 0);
    for copies in all_ids.chunks(10_000) {
        let mut batch = Vec::new();
        for ids in copies {
            for (id, log) in task_ids_of(&ids[1..])?.into_iter().zip(&seed.logs) {
                batch.push((id, log.clone()));
                logs += 1;
                log_bytes += log.len() as u64;
            }
        }
        orchestrator_storage::fs::write_task_logs(dir, &batch)?;
    }
    Ok(Written {
        snapshot_bytes: bytes,
        logs,
        log_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_are_a_few_hundred_bytes() {
        let log = padded_log(b"{}\n".to_vec(), 7);
        assert!(log.starts_with(b"{}\n"));
        assert!((LOG_BYTES..LOG_BYTES + 100).contains(&log.len()));
        assert_eq!(padded_log(vec![b'x'; 10_000], 0).len(), LOG_BYTES * 4);
    }

    #[test]
    fn copies_replace_every_id() {
        let a = "0190a0a0-0000-7000-8000-000000000001";
        let b = "0190a0a0-0000-7000-8000-000000000002";
        let index: HashMap<&str, usize> = [(a, 0), (b, 1)].into_iter().collect();
        let text = format!(r#"{{"id":"{b}","workflow_id":"{a}","depends_on":["{b}"]}}"#);
        let p = cut(&text, &index);
        let mut out = String::new();
        render(&p, &["W".to_owned(), "T".to_owned()], &mut out);
        assert_eq!(out, r#"{"id":"T","workflow_id":"W","depends_on":["T"]}"#);
    }
}
