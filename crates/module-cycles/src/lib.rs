//! Finds module cycles in a crate: two modules (siblings under one parent,
//! at any depth) that reach each other, directly or through others,
//! through any path that names an item of the other: every form of `use`
//! (groups, nesting, renames, `self`/`super`/`crate`, globs, `use` inside
//! functions, any visibility) and paths written in code. A re-export
//! stands for the module the item comes from.
//!
//! Paths inside macro invocations (`format!`, `json!`) are not read: a
//! macro's tokens are not Rust syntax until the macro expands.

mod graph;
mod tree;

use std::path::PathBuf;

pub use graph::{Cycle, cycles};
pub use tree::{ModuleTree, Site};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read {}", file.display())]
    Missing { file: PathBuf },
    #[error("{}:{line}: `mod {module};` has no file ({module}.rs or {module}/mod.rs)", file.display())]
    MissingModule {
        file: PathBuf,
        line: usize,
        module: String,
    },
    #[error("{}:{line}: cannot parse: {message}", file.display())]
    Parse {
        file: PathBuf,
        line: usize,
        message: String,
    },
}

#[cfg(test)]
mod tests;
