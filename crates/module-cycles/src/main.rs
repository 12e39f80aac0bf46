//! `module-cycles [WORKSPACE_ROOT]`: checks every target of every crate of
//! the workspace (as `cargo metadata` lists them) for module cycles,
//! prints each as `crate: a -> b -> a` with the references that make it,
//! and exits non-zero if there is any (1), or if a file cannot be read or
//! parsed (2).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use module_cycles::{ModuleTree, cycles};

/// At most this many references are shown for one step of a cycle.
const SITES_SHOWN: usize = 3;

/// One target to check: its label and root file.
struct Target {
    label: String,
    root: PathBuf,
}

fn main() -> ExitCode {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| ".".into()));
    let targets = match targets(&root) {
        Ok(targets) => targets,
        Err(e) => {
            eprintln!("module-cycles: {e}");
            return ExitCode::from(2);
        }
    };
    let base = root.canonicalize().unwrap_or(root);
    let shown = |path: &Path| {
        path.strip_prefix(&base)
            .unwrap_or(path)
            .display()
            .to_string()
    };
    let (mut n_cycles, mut n_modules) = (0, 0);
    for target in &targets {
        let tree = match ModuleTree::read(&target.root, &|file| std::fs::read_to_string(file).ok())
        {
            Ok(tree) => tree,
            Err(e) => {
                eprintln!("module-cycles: {}: {e}", target.label);
                return ExitCode::from(2);
            }
        };
        n_modules += tree.len();
        for cycle in cycles(&tree) {
            n_cycles += 1;
            println!("{}: {cycle}", target.label);
            for (step, sites) in cycle.modules.windows(2).zip(&cycle.sites) {
                println!("  {} -> {}:", step[0], step[1]);
                for site in sites.iter().take(SITES_SHOWN) {
                    println!("    {}:{}: {}", shown(&site.file), site.line, site.text);
                }
                if sites.len() > SITES_SHOWN {
                    println!("    and {} more", sites.len() - SITES_SHOWN);
                }
            }
        }
    }
    if n_cycles > 0 {
        eprintln!("module-cycles: {n_cycles} module cycle(s)");
        return ExitCode::FAILURE;
    }
    eprintln!(
        "module-cycles: no module cycle in {} targets ({n_modules} modules)",
        targets.len()
    );
    ExitCode::SUCCESS
}

/// Every target of every workspace member: libraries, binaries, tests,
/// benches, examples, build scripts.
fn targets(root: &Path) -> Result<Vec<Target>, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--manifest-path",
        ])
        .arg(root.join("Cargo.toml"))
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata answered no JSON: {e}"))?;
    let mut targets = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default();
        for target in package["targets"].as_array().into_iter().flatten() {
            let kind = target["kind"][0].as_str().unwrap_or_default();
            let label = match kind {
                "lib" | "proc-macro" => name.to_owned(),
                _ => format!(
                    "{name} ({kind} {})",
                    target["name"].as_str().unwrap_or_default()
                ),
            };
            let Some(root) = target["src_path"].as_str() else {
                continue;
            };
            targets.push(Target {
                label,
                root: root.into(),
            });
        }
    }
    targets.sort_by(|a, b| a.label.cmp(&b.label));
    Ok(targets)
}
