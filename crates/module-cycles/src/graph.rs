//! From references to cycles: each reference is resolved (through
//! `crate`/`self`/`super`, child modules, `use` bindings, re-exports and
//! globs) to the module that defines what it names; a reference from
//! inside one child of a module to inside another child is an edge
//! between those siblings; a cycle among the siblings of any module is a
//! module cycle.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::tree::{ModuleTree, Site};

/// A module cycle: `modules` along it, the first again at the end, and
/// for each step the references that make it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// Paths from the crate root (`fs::journal`).
    pub modules: Vec<String>,
    /// `sites[i]`: where `modules[i]` refers into `modules[i + 1]`.
    pub sites: Vec<Vec<Site>>,
}

impl std::fmt::Display for Cycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.modules.join(" -> "))
    }
}

/// How deep a resolution may follow re-exports and globs: a `use` that
/// names itself, directly or not, must not loop.
const MAX_DEPTH: usize = 32;

/// What a path reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// A module of the crate.
    Module(usize),
    /// An item defined in (or unknown to, hence taken as defined in) a
    /// module of the crate.
    ItemIn(usize),
}

impl Found {
    fn module(self) -> usize {
        match self {
            Found::Module(m) | Found::ItemIn(m) => m,
        }
    }
}

/// What one name means in one module.
enum Lookup {
    Found(Found),
    /// Something of another crate (a `use` of one, brought in here).
    External,
    NotFound,
}

/// What `path`, written in module `from`, reaches in the crate; `None`
/// for a path into another crate.
fn resolve(tree: &ModuleTree, from: usize, path: &[String], depth: usize) -> Option<Found> {
    if depth > MAX_DEPTH {
        return None;
    }
    let (first, _) = path.split_first()?;
    let (current, rest) = match first.as_str() {
        "crate" => (0, &path[1..]),
        "self" => (from, &path[1..]),
        "super" => {
            let mut current = from;
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                current = tree.modules[current].parent?;
                rest = &rest[1..];
            }
            (current, rest)
        }
        // A name in scope here, or another crate.
        _ => match lookup(tree, from, first, depth + 1) {
            Lookup::Found(found) => {
                return walk(tree, found, &path[1..], depth);
            }
            Lookup::External | Lookup::NotFound => return None,
        },
    };
    if let Some((first, _)) = rest.split_first() {
        match lookup(tree, current, first, depth + 1) {
            Lookup::Found(found) => return walk(tree, found, &rest[1..], depth),
            Lookup::External => return None,
            Lookup::NotFound => return Some(Found::ItemIn(current)),
        }
    }
    Some(Found::Module(current))
}

/// The rest of a path, from what its first segments reached.
fn walk(tree: &ModuleTree, mut at: Found, rest: &[String], depth: usize) -> Option<Found> {
    for segment in rest {
        let Found::Module(module) = at else {
            // Past an item (an enum's variant, an associated item): the
            // item's module is what is used.
            return Some(at);
        };
        at = match lookup(tree, module, segment, depth + 1) {
            Lookup::Found(found) => found,
            Lookup::External => return Some(Found::ItemIn(module)),
            Lookup::NotFound => Found::ItemIn(module),
        };
    }
    Some(at)
}

/// What `name` means in `module`: a child, something a `use` brought in,
/// an item, or what a glob import brings in.
fn lookup(tree: &ModuleTree, module: usize, name: &str, depth: usize) -> Lookup {
    if depth > MAX_DEPTH {
        return Lookup::NotFound;
    }
    let here = &tree.modules[module];
    if let Some(&child) = here.children.get(name) {
        return Lookup::Found(Found::Module(child));
    }
    if let Some(import) = here.bindings.get(name) {
        return match resolve(tree, module, import, depth + 1) {
            Some(found) => Lookup::Found(found),
            None => Lookup::External,
        };
    }
    if here.items.contains(name) {
        return Lookup::Found(Found::ItemIn(module));
    }
    for glob in &here.globs {
        let Some(Found::Module(source)) = resolve(tree, module, glob, depth + 1) else {
            continue;
        };
        if source == module {
            continue;
        }
        match lookup(tree, source, name, depth + 1) {
            Lookup::NotFound => continue,
            found => return found,
        }
    }
    Lookup::NotFound
}

/// Edges among the children of each module: parent's index, then
/// (from child, to child) -> the references that make the edge.
type SiblingEdges = BTreeMap<usize, BTreeMap<(String, String), Vec<Site>>>;

fn sibling_edges(tree: &ModuleTree) -> SiblingEdges {
    let mut edges = SiblingEdges::new();
    for (index, module) in tree.modules.iter().enumerate() {
        for reference in &module.references {
            let Some(found) = resolve(tree, index, &reference.path, 0) else {
                continue;
            };
            let target = &tree.modules[found.module()].path;
            let from = &module.path;
            let common = from.iter().zip(target).take_while(|(a, b)| a == b).count();
            // A reference to an ancestor or a descendant is no edge
            // between siblings.
            if common >= from.len() || common >= target.len() {
                continue;
            }
            let mut parent = index;
            for _ in common..from.len() {
                parent = tree.modules[parent].parent.unwrap_or(0);
            }
            edges
                .entry(parent)
                .or_default()
                .entry((from[common].clone(), target[common].clone()))
                .or_default()
                .push(reference.site.clone());
        }
    }
    edges
}

/// Every module cycle of the crate: for each group of siblings that reach
/// one another (a strongly connected component), its shortest cycle
/// through its first module by name.
pub fn cycles(tree: &ModuleTree) -> Vec<Cycle> {
    let mut found = Vec::new();
    for (parent, edges) in sibling_edges(tree) {
        let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (from, to) in edges.keys() {
            next.entry(from).or_default().insert(to);
        }
        let reach = |start: &str| -> BTreeSet<String> {
            let mut seen = BTreeSet::new();
            let mut queue = vec![start];
            while let Some(node) = queue.pop() {
                for &to in next.get(node).into_iter().flatten() {
                    if seen.insert(to.to_owned()) {
                        queue.push(to);
                    }
                }
            }
            seen
        };
        let reaches: BTreeMap<&str, BTreeSet<String>> =
            next.keys().map(|&node| (node, reach(node))).collect();
        let mut reported: BTreeSet<&str> = BTreeSet::new();
        for (&node, reached) in &reaches {
            if reported.contains(node) || !reached.contains(node) {
                continue;
            }
            let component: BTreeSet<&str> = reaches
                .iter()
                .filter(|(other, from_other)| {
                    reached.contains(**other) && from_other.contains(node)
                })
                .map(|(other, _)| *other)
                .collect();
            reported.extend(&component);
            let path = shortest_cycle(node, &next, &component);
            let prefix = &tree.modules[parent].path;
            let name = |child: &str| {
                let mut full = prefix.clone();
                full.push(child.to_owned());
                full.join("::")
            };
            found.push(Cycle {
                modules: path.iter().map(|m| name(m)).collect(),
                sites: path
                    .windows(2)
                    .map(|pair| edges[&(pair[0].to_owned(), pair[1].to_owned())].clone())
                    .collect(),
            });
        }
    }
    found
}

/// The shortest way from `start` back to itself inside `component`
/// (breadth first), `start` at both ends.
fn shortest_cycle<'a>(
    start: &'a str,
    next: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    component: &BTreeSet<&'a str>,
) -> Vec<&'a str> {
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for &to in next.get(node).into_iter().flatten() {
            if !component.contains(to) {
                continue;
            }
            if to == start {
                let mut path = vec![start, node];
                let mut at = node;
                while let Some(&before) = came_from.get(at) {
                    path.push(before);
                    at = before;
                }
                // `path` is start, node, ..., start backwards.
                path.reverse();
                if path.first() != Some(&start) {
                    path.insert(0, start);
                }
                return path;
            }
            if to != start && !came_from.contains_key(to) {
                came_from.insert(to, node);
                queue.push_back(to);
            }
        }
    }
    vec![start, start]
}
