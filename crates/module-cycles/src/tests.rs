//! Each form of `use` (and of path) that can close a cycle, fed as
//! source strings.

#![allow(clippy::unwrap_used)] // tests fail loudly by design

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;

/// The crate made of `files` (`lib.rs` is its root), read as the binary
/// reads one.
fn tree(files: &[(&str, &str)]) -> ModuleTree {
    let files: BTreeMap<PathBuf, String> = files
        .iter()
        .map(|(path, text)| (Path::new("src").join(path), (*text).to_owned()))
        .collect();
    ModuleTree::read(Path::new("src/lib.rs"), &|file| files.get(file).cloned()).unwrap()
}

/// The crate's cycles, as `a -> b -> a`.
fn check(files: &[(&str, &str)]) -> Vec<String> {
    cycles(&tree(files))
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_multi_line_pub_use_stands_for_the_module_it_re_exports() {
    // orchestrator-core's error <-> task: the root re-exports `Task` from
    // `task` on a line of its own, and `error` names it through the root.
    let found = check(&[
        (
            "lib.rs",
            "mod error;\nmod task;\npub use error::Error;\npub use task::{\n    Task,\n    TaskStatus,\n};\n",
        ),
        (
            "error.rs",
            "use crate::{Task, TaskStatus};\npub struct Error;\n",
        ),
        (
            "task.rs",
            "use crate::Error;\npub struct Task;\npub enum TaskStatus {}\n",
        ),
    ]);
    assert_eq!(found, ["error -> task -> error"]);
}

#[test]
fn nested_groups_and_self_are_read() {
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::{b::{self, inner::{Deep}}};\n"),
        (
            "b.rs",
            "pub mod inner { pub struct Deep; }\nuse crate::a::{self as other};\n",
        ),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn super_and_self_paths_reach_across_levels() {
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "mod x;\n"),
        ("a/x.rs", "use super::super::b::Thing;\n"),
        (
            "b.rs",
            "pub struct Thing;\nuse self::inner::X;\nmod inner { pub use crate::a::*; }\n",
        ),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn a_use_inside_a_function_is_read() {
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() { use crate::b::g; g() }\n"),
        (
            "b.rs",
            "pub fn g() {}\nfn h() { { use crate::a::f as call; call(); } }\n",
        ),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn any_visibility_of_use_is_read() {
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub(crate) use crate::b::B;\npub struct A;\n"),
        ("b.rs", "pub(super) use crate::a::A;\npub struct B;\n"),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn a_glob_import_is_a_dependency_and_finds_names() {
    // `a` imports all of `b`; `b` reaches `a`'s item through the root's
    // glob re-export of `a`.
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\npub use a::*;\n"),
        ("a.rs", "use crate::b::*;\npub struct FromA;\n"),
        ("b.rs", "pub fn g(_: crate::FromA) {}\n"),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn a_path_in_code_is_a_dependency() {
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() -> crate::b::B { crate::b::B }\n"),
        (
            "b.rs",
            "pub struct B;\nimpl B { fn g() { let _ = crate::a::f(); } }\n",
        ),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn a_path_inside_a_macro_call_is_a_dependency() {
    // orchestrator-api's routes <-> openapi: the router names the
    // document's handler inside `routes!(...)`.
    let found = check(&[
        ("lib.rs", "mod openapi;\nmod routes;\n"),
        (
            "routes.rs",
            "pub fn all() { let _ = routes!(crate::openapi::handler, vec![1]); }\n",
        ),
        (
            "openapi.rs",
            "pub fn handler() {}\npub fn doc() { crate::routes::all(); }\n",
        ),
    ]);
    assert_eq!(found, ["openapi -> routes -> openapi"]);
    // Names in a macro that are not paths make no dependency.
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() { println!(\"b::x {}\", ::b::y); }\n"),
        ("b.rs", "pub fn g() { crate::a::f(); }\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_path_in_an_attribute_string_is_a_dependency() {
    // orchestrator's cli <-> settings: a serde attribute names a function
    // of `settings` as a string.
    let found = check(&[
        ("lib.rs", "mod cli;\nmod settings;\n"),
        (
            "cli.rs",
            "#[derive(Serialize)]\npub struct Args {\n    #[serde(serialize_with = \"crate::settings::expose\")]\n    pub p: String,\n    #[doc = \"not a path: a b\"]\n    pub q: u8,\n}\n",
        ),
        ("settings.rs", "use crate::cli::Args;\npub fn expose() {}\n"),
    ]);
    assert_eq!(found, ["cli -> settings -> cli"]);
}

#[test]
fn a_renamed_module_is_followed() {
    let found = check(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b as other;\nfn f() { other::g() }\n"),
        ("b.rs", "pub fn g() {}\nuse super::a;\nfn h() { a::f() }\n"),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn cycles_among_nested_siblings_are_found_in_mod_rs_and_inline_trees() {
    let found = check(&[
        (
            "lib.rs",
            "mod fs;\nmod net { mod x { use super::y::Y; pub struct X; } mod y { use super::x::X; pub struct Y; } }\n",
        ),
        ("fs/mod.rs", "mod journal;\nmod snapshot;\n"),
        (
            "fs/journal.rs",
            "use super::snapshot::Snapshot;\npub struct Journal;\n",
        ),
        (
            "fs/snapshot.rs",
            "use crate::fs::journal::Journal;\npub struct Snapshot;\n",
        ),
    ]);
    assert_eq!(
        found,
        [
            "fs::journal -> fs::snapshot -> fs::journal",
            "net::x -> net::y -> net::x"
        ]
    );
}

#[test]
fn a_path_attribute_is_followed() {
    let found = check(&[
        (
            "lib.rs",
            "#[path = \"elsewhere/a_impl.rs\"]\nmod a;\nmod b;\n",
        ),
        ("elsewhere/a_impl.rs", "use crate::b::B;\npub struct A;\n"),
        ("b.rs", "use crate::a::A;\npub struct B;\n"),
    ]);
    assert_eq!(found, ["a -> b -> a"]);
}

#[test]
fn parents_children_and_other_crates_make_no_cycle() {
    let found = check(&[
        (
            "lib.rs",
            "mod a;\nmod b;\npub use a::A;\nuse serde::Serialize;\n",
        ),
        // A child uses its parent, the parent its child, both use a crate
        // of the same name as a module elsewhere.
        (
            "a.rs",
            "mod tests;\npub struct A;\nfn f() { tests::t(); let _ = b::x(); }\nuse std::fmt as b;\n",
        ),
        (
            "a/tests.rs",
            "use super::*;\npub fn t() { let _ = A; crate::b::B; }\n",
        ),
        (
            "b.rs",
            "pub struct B;\nuse serde_json::Value;\nfn g(_: Value) {}\n",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_cycle_through_three_modules_is_shown_once_with_its_sites() {
    let tree = tree(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::B;\npub struct A;\n"),
        ("b.rs", "pub struct B;\nuse crate::c::C;\n"),
        (
            "c.rs",
            "pub struct C;\n\nfn f() -> crate::a::A { todo!() }\n",
        ),
    ]);
    let found = cycles(&tree);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].modules, ["a", "b", "c", "a"]);
    let sites: Vec<String> = found[0].sites.iter().map(|s| s[0].to_string()).collect();
    assert_eq!(
        sites,
        [
            "src/a.rs:1: use crate::b::B",
            "src/b.rs:2: use crate::c::C",
            "src/c.rs:3: crate::a::A",
        ]
    );
}

#[test]
fn a_module_without_a_file_or_a_syntax_error_is_an_error() {
    let read = |files: &'static [(&'static str, &'static str)]| {
        move |file: &Path| {
            files
                .iter()
                .find(|(path, _)| Path::new(path) == file)
                .map(|(_, text)| (*text).to_owned())
        }
    };
    let missing =
        ModuleTree::read(Path::new("lib.rs"), &read(&[("lib.rs", "\nmod gone;\n")])).unwrap_err();
    assert_eq!(
        missing.to_string(),
        "lib.rs:2: `mod gone;` has no file (gone.rs or gone/mod.rs)"
    );
    let broken = ModuleTree::read(Path::new("lib.rs"), &read(&[("lib.rs", "fn (")])).unwrap_err();
    assert!(
        broken.to_string().starts_with("lib.rs:1: cannot parse"),
        "{broken}"
    );
}
