//! `orchestrator workflow diff A B`: the service's comparison of two runs
//! as a table of what differs (everything with `--all`) and a summary line.

use orchestrator_core::compare::{Change, Comparison, KeyChange, LogOutcome, RunSummary, StepRun};
use serde_json::Value;

use crate::client::{print_table, shown};

/// Most characters of a value shown in a cell; `--json` has them whole.
const CELL_CHARS: usize = 60;

pub(crate) fn print(c: &Comparison, all: bool) {
    for (label, run) in [("a", &c.a), ("b", &c.b)] {
        println!("{label}  {}", run_line(run));
    }
    let mut rows: Vec<[String; 4]> = Vec::new();
    let mut row = |what: &str, item: &str, a: String, b: String| {
        rows.push([what.to_owned(), item.to_owned(), a, b]);
    };
    if c.template_changed || all {
        row(
            marked("template", c.template_changed),
            "",
            short_revision(&c.a.template_revision),
            short_revision(&c.b.template_revision),
        );
    }
    for input in c.inputs.iter().filter(|k| all || k.change != Change::Same) {
        let (a, b) = values(input);
        row(
            marked("input", input.change != Change::Same),
            &input.key,
            a,
            b,
        );
    }
    for step in &c.steps {
        match step.change {
            Change::OnlyA | Change::OnlyB => {
                let only = if step.change == Change::OnlyA {
                    "a"
                } else {
                    "b"
                };
                let run = step.a.as_ref().or(step.b.as_ref());
                let status = run.map(|r| shown(&r.status)).unwrap_or_default();
                let (a, b) = if only == "a" {
                    (status, "(no such step)".to_owned())
                } else {
                    ("(no such step)".to_owned(), status)
                };
                row(&format!("* only in {only}"), &step.key, a, b);
                continue;
            }
            Change::Same if !all => continue,
            _ => {}
        }
        let (Some(a), Some(b)) = (&step.a, &step.b) else {
            continue;
        };
        if step.status_changed || all {
            row(
                marked("status", step.status_changed),
                &step.key,
                status_cell(a),
                status_cell(b),
            );
        }
        if step.script_changed {
            row(
                marked("script", true),
                &step.key,
                script_cell(a),
                script_cell(b),
            );
        }
        for output in &step.outputs {
            let (x, y) = values(output);
            let item = if output.key.is_empty() {
                format!("{} output", step.key)
            } else {
                format!("{}.{}", step.key, output.key)
            };
            row(marked("output", true), &item, x, y);
        }
        if let Some(log) = &step.log {
            match log.outcome {
                LogOutcome::Differs => row(
                    &format!("* log line {}", log.line.unwrap_or_default()),
                    &step.key,
                    log.a.clone().map_or_else(|| "(log ended)".to_owned(), cell),
                    log.b.clone().map_or_else(|| "(log ended)".to_owned(), cell),
                ),
                LogOutcome::NotCompared if all => {
                    row("log", &step.key, "(not compared)".into(), String::new())
                }
                _ => {}
            }
        }
    }
    if !rows.is_empty() {
        println!();
        print_table(["WHAT", "ITEM", "A", "B"], &rows);
        println!();
    }
    println!("{}", summary_line(c));
}

fn run_line(run: &RunSummary) -> String {
    let reference = run
        .reference
        .as_deref()
        .map_or_else(String::new, |r| format!("  ref {r} rev {}", run.revision));
    format!(
        "{}  {}  [{}]  template {}{reference}",
        run.id,
        run.name,
        shown(&run.status),
        short_revision(&run.template_revision)
    )
}

/// `name@1 sha256:<64 hex>` with the hash cut to 12 characters, as git
/// shows a commit: enough to tell two apart (`--json` has it whole).
fn short_revision(revision: &str) -> String {
    match revision.split_once(" sha256:") {
        Some((name, hash)) if hash.len() > 12 => format!("{name} sha256:{}…", &hash[..12]),
        _ => revision.to_owned(),
    }
}

/// A `*` before what differs, so the table does not rely on its layout.
fn marked(what: &str, differs: bool) -> &'static str {
    match (what, differs) {
        ("template", true) => "* template",
        ("template", false) => "template",
        ("input", true) => "* input",
        ("input", false) => "input",
        ("status", true) => "* status",
        ("status", false) => "status",
        ("script", _) => "* script",
        _ => "* output",
    }
}

fn values(key: &KeyChange) -> (String, String) {
    let side = |v: &Option<Value>| {
        v.as_ref()
            .map_or_else(|| "(absent)".to_owned(), |v| cell(v.to_string()))
    };
    (side(&key.a), side(&key.b))
}

fn status_cell(run: &StepRun) -> String {
    match run.duration_ms {
        Some(ms) => format!("{} in {:.1}s", shown(&run.status), ms as f64 / 1000.0),
        None => shown(&run.status),
    }
}

fn script_cell(run: &StepRun) -> String {
    let hash = run.script_hash.as_deref().map_or_else(String::new, |h| {
        format!(" sha256:{}", h.get(..12).unwrap_or(h))
    });
    format!("{}{hash}", run.script)
}

fn cell(text: String) -> String {
    match text.char_indices().nth(CELL_CHARS) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// One line: what differs, counted, and how far the logs were compared.
fn summary_line(c: &Comparison) -> String {
    let s = &c.summary;
    if s.same {
        return format!(
            "no difference in {} steps (logs compared up to {} KiB / {} lines a step)",
            s.steps,
            c.limits.log_bytes_per_step / 1024,
            c.limits.log_lines_per_step
        );
    }
    let differ = |n: usize| if n == 1 { "differs" } else { "differ" };
    let mut parts = Vec::new();
    if c.template_changed {
        parts.push("the template revision differs".to_owned());
    }
    let inputs = if s.inputs_changed == 1 {
        "input"
    } else {
        "inputs"
    };
    parts.push(format!(
        "{} {inputs} {}",
        s.inputs_changed,
        differ(s.inputs_changed)
    ));
    parts.push(format!(
        "{} of {} steps {}",
        s.steps_differing,
        s.steps,
        differ(s.steps_differing)
    ));
    let mut line = parts.join("; ");
    if s.logs_capped > 0 {
        line.push_str(&format!(
            "; {} {} compared only up to {} KiB / {} lines",
            s.logs_capped,
            if s.logs_capped == 1 { "log" } else { "logs" },
            c.limits.log_bytes_per_step / 1024,
            c.limits.log_lines_per_step
        ));
    }
    line
}
