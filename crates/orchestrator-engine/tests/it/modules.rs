//! Every crate's modules depend one way: no module reaches, directly or
//! through others, back to itself. Read from the sources, so a new `use`
//! that closes a cycle fails here, naming it. (The crates themselves cannot
//! form a cycle: cargo refuses one.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module name -> the modules it refers to through `crate::`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: BTreeMap<String, String> = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = if path.is_dir() {
            path.join("mod.rs")
                .exists()
                .then(|| path.file_name().unwrap().to_string_lossy().into_owned())
        } else {
            path.extension()
                .is_some_and(|e| e == "rs")
                .then(|| path.file_stem().unwrap().to_string_lossy().into_owned())
        };
        let Some(name) = name else { continue };
        let mut text = String::new();
        if path.is_dir() {
            for file in walk(&path) {
                text.push_str(&std::fs::read_to_string(file).unwrap());
            }
        } else {
            text = std::fs::read_to_string(&path).unwrap();
            // `x.rs` with its submodules in `x/`: one module.
            let children = path.with_extension("");
            if children.is_dir() {
                for file in walk(&children) {
                    text.push_str(&std::fs::read_to_string(file).unwrap());
                }
            }
        }
        files.insert(name, text);
    }
    // The crate root: a library's, or a binary's when there is no library.
    let lib = files
        .remove("lib")
        .or_else(|| files.remove("main"))
        .expect("src/lib.rs or src/main.rs");
    let modules: BTreeSet<String> = files.keys().cloned().collect();
    // Items the crate root re-exports stand for the module they come from.
    let mut reexported: BTreeMap<String, String> = BTreeMap::new();
    for line in lib.lines().map(str::trim) {
        let Some(rest) = line.strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.split_once("::") else {
            continue;
        };
        if modules.contains(module) {
            for item in names_in(items) {
                reexported.insert(item, module.to_owned());
            }
        }
    }
    files
        .iter()
        .map(|(name, text)| {
            let used = crate_paths(text)
                .into_iter()
                .filter_map(|first| {
                    if modules.contains(&first) {
                        Some(first)
                    } else {
                        reexported.get(&first).cloned()
                    }
                })
                .filter(|m| m != name)
                .collect();
            (name.clone(), used)
        })
        .collect()
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

/// The first segment after every `crate::` (each item of a `crate::{..}`
/// group), comments and strings included: a mention is a dependency too.
fn crate_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = matching_brace(group);
            found.extend(names_in(&format!("{{{}", &group[..end])));
        } else {
            found.push(ident(rest));
        }
    }
    found
}

/// The first segment of each path in `a` or `{a, b::c, d::{e}}`.
fn names_in(items: &str) -> Vec<String> {
    let items = items.trim().trim_end_matches(';');
    let Some(inner) = items.strip_prefix('{') else {
        return vec![ident(items)];
    };
    let inner = &inner[..matching_brace(inner)];
    let mut names = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                names.push(ident(&inner[start..i]));
                start = i + 1;
            }
            _ => {}
        }
    }
    names.push(ident(&inner[start..]));
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

fn matching_brace(text: &str) -> usize {
    let mut depth = 1;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    text.len()
}

fn ident(text: &str) -> String {
    text.trim()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// A cycle, as the modules along it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_engine_modules_have_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = module_graph(&src);
    // The graph is read for real: the components' known edges are there.
    for (from, to) in [
        ("dispatch", "lifecycle"),
        ("lifecycle", "records"),
        ("records", "events"),
        ("engine", "dispatch"),
        ("submit", "engine"),
    ] {
        assert!(
            graph.get(from).is_some_and(|uses| uses.contains(to)),
            "expected `{from}` to use `{to}`: {graph:?}"
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "module cycle in orchestrator-engine: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn no_crate_of_the_workspace_has_a_module_cycle() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let src = entry.unwrap().path().join("src");
        if !src.join("lib.rs").exists() && !src.join("main.rs").exists() {
            continue;
        }
        let name = src
            .parent()
            .unwrap()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if let Some(cycle) = find_cycle(&module_graph(&src)) {
            panic!("module cycle in {name}: {}", cycle.join(" -> "));
        }
        checked.push(name);
    }
    checked.sort();
    for expected in [
        "orchestrator",
        "orchestrator-api",
        "orchestrator-core",
        "orchestrator-storage",
    ] {
        assert!(
            checked.iter().any(|c| c == expected),
            "{expected} was not checked: {checked:?}"
        );
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        names_in("{Engine, engine::{lock, Inner}, self, dispatch::is_conflict}"),
        ["Engine", "engine", "dispatch"]
    );
    assert_eq!(
        crate_paths("use crate::records::Records; x(crate::lock(&m))"),
        ["records", "lock"]
    );
}
