//! A crate's module tree, read from its files with `syn`: every module
//! (out-of-line, inline, `#[path]`), what each defines, what each `use`
//! binds (renames, groups, `self`, globs, inside functions too), and every
//! path that may name another module of the crate, with where it is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

use crate::Error;

/// Where a reference is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    pub file: PathBuf,
    pub line: usize,
    /// The reference as written: `use crate::task::Task`, or a path in
    /// code such as `crate::task::Task::new`.
    pub text: String,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {}", self.file.display(), self.line, self.text)
    }
}

/// A path that may name an item of another module, as written (its first
/// segment may be `crate`, `self`, `super` or a name in scope).
#[derive(Debug, Clone)]
pub(crate) struct Reference {
    pub(crate) path: Vec<String>,
    pub(crate) site: Site,
}

/// One module of the crate.
#[derive(Debug, Default)]
pub(crate) struct Module {
    /// From the crate root: `["fs", "journal"]`; empty for the root.
    pub(crate) path: Vec<String>,
    pub(crate) parent: Option<usize>,
    pub(crate) children: BTreeMap<String, usize>,
    /// Names a `use` brings in, with the path they stand for (relative to
    /// this module, as written).
    pub(crate) bindings: BTreeMap<String, Vec<String>>,
    /// What `use ...::*` brings in everything from.
    pub(crate) globs: Vec<Vec<String>>,
    /// Names of the items defined here (what a glob import of this module
    /// can find besides its children and its own imports).
    pub(crate) items: BTreeSet<String>,
    pub(crate) references: Vec<Reference>,
}

/// Every module of one crate (a library, a binary, a test target...);
/// the root is the first.
#[derive(Debug, Default)]
pub struct ModuleTree {
    pub(crate) modules: Vec<Module>,
}

impl ModuleTree {
    /// Reads the crate whose root file is `root`, and every module file it
    /// declares, through `read` (the file's text, `None` if there is none).
    pub fn read(root: &Path, read: &dyn Fn(&Path) -> Option<String>) -> Result<ModuleTree, Error> {
        let mut tree = ModuleTree::default();
        let text = read(root).ok_or_else(|| Error::Missing {
            file: root.to_owned(),
        })?;
        let dir = root.parent().unwrap_or(Path::new("")).to_owned();
        tree.add_file(Vec::new(), None, root, &text, &dir, read)?;
        Ok(tree)
    }

    /// How many modules were read.
    pub fn len(&self) -> usize {
        self.modules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    fn add_file(
        &mut self,
        path: Vec<String>,
        parent: Option<usize>,
        file: &Path,
        text: &str,
        children_dir: &Path,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> Result<usize, Error> {
        let ast = syn::parse_file(text).map_err(|e| Error::Parse {
            file: file.to_owned(),
            line: e.span().start().line,
            message: e.to_string(),
        })?;
        let index = self.push(path, parent);
        self.add_items(index, &ast.items, file, children_dir, false, read)?;
        Ok(index)
    }

    fn push(&mut self, path: Vec<String>, parent: Option<usize>) -> usize {
        let index = self.modules.len();
        if let (Some(parent), Some(name)) = (parent, path.last()) {
            self.modules[parent].children.insert(name.clone(), index);
        }
        self.modules.push(Module {
            path,
            parent,
            ..Module::default()
        });
        index
    }

    /// The items of module `index`, written in `file` (`inline`: inside a
    /// `mod name { ... }` of it); its out-of-line children are in
    /// `children_dir`.
    fn add_items(
        &mut self,
        index: usize,
        items: &[syn::Item],
        file: &Path,
        children_dir: &Path,
        inline: bool,
        read: &dyn Fn(&Path) -> Option<String>,
    ) -> Result<(), Error> {
        for item in items {
            let syn::Item::Mod(declared) = item else {
                let module = &mut self.modules[index];
                if let Some(name) = item_name(item) {
                    module.items.insert(name);
                }
                Uses { module, file }.visit_item(item);
                continue;
            };
            let name = declared.ident.to_string();
            let mut path = self.modules[index].path.clone();
            path.push(name.clone());
            let path_attr = path_attribute(declared);
            if let Some((_, content)) = &declared.content {
                let child = self.push(path, Some(index));
                let dir = match &path_attr {
                    Some(dir) => children_dir.join(dir),
                    None => children_dir.join(&name),
                };
                self.add_items(child, content, file, &dir, true, read)?;
                continue;
            }
            // `#[path]` is relative to the declaring file's dir (its
            // children dir inside an inline module), and its file holds
            // its own children beside it (as `mod.rs` does); `name.rs`
            // holds them in `name/`.
            let candidates = match &path_attr {
                Some(relative) => {
                    let base = match inline {
                        true => children_dir,
                        false => file.parent().unwrap_or(Path::new("")),
                    };
                    let file = base.join(relative);
                    let dir = file.parent().unwrap_or(Path::new("")).to_owned();
                    vec![(file, dir)]
                }
                None => vec![
                    (
                        children_dir.join(format!("{name}.rs")),
                        children_dir.join(&name),
                    ),
                    (
                        children_dir.join(&name).join("mod.rs"),
                        children_dir.join(&name),
                    ),
                ],
            };
            let found = candidates
                .into_iter()
                .find_map(|(file, dir)| read(&file).map(|text| (file, dir, text)));
            let Some((child_file, dir, text)) = found else {
                return Err(Error::MissingModule {
                    file: file.to_owned(),
                    line: declared.ident.span().start().line,
                    module: name,
                });
            };
            self.add_file(path, Some(index), &child_file, &text, &dir, read)?;
        }
        Ok(())
    }
}

/// The value of a module's `#[path = "..."]`.
fn path_attribute(declared: &syn::ItemMod) -> Option<String> {
    declared.attrs.iter().find_map(|attr| match &attr.meta {
        syn::Meta::NameValue(pair) if pair.path.is_ident("path") => match &pair.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(path),
                ..
            }) => Some(path.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The name an item defines in its module's namespace.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Collects one module's `use` bindings and references, from one item
/// (functions' bodies included: a `use` there is the module's too).
struct Uses<'a> {
    module: &'a mut Module,
    file: &'a Path,
}

impl Uses<'_> {
    fn site(&self, span: proc_macro2::Span, text: String) -> Site {
        Site {
            file: self.file.to_owned(),
            line: span.start().line,
            text,
        }
    }

    /// One `use` tree under `prefix`, down to its leaves.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(step) => {
                prefix.push(step.ident.to_string());
                self.use_tree(prefix, &step.tree);
                prefix.pop();
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
            syn::UseTree::Name(leaf) => self.use_leaf(prefix, &leaf.ident, None),
            syn::UseTree::Rename(leaf) => self.use_leaf(prefix, &leaf.ident, Some(&leaf.rename)),
            syn::UseTree::Glob(glob) => {
                let site = self.site(
                    glob.star_token.span,
                    format!("use {}::*", prefix.join("::")),
                );
                self.module.globs.push(prefix.clone());
                self.module.references.push(Reference {
                    path: prefix.clone(),
                    site,
                });
            }
        }
    }

    /// `use prefix::ident [as rename]`; `ident` may be `self` (the prefix
    /// itself).
    fn use_leaf(&mut self, prefix: &[String], ident: &syn::Ident, rename: Option<&syn::Ident>) {
        let mut path = prefix.to_vec();
        if ident != "self" {
            path.push(ident.to_string());
        }
        let Some(last) = path.last().cloned() else {
            return;
        };
        let mut text = format!("use {}", path.join("::"));
        if let Some(rename) = rename {
            text.push_str(&format!(" as {rename}"));
        }
        let name = rename.map_or(last, ToString::to_string);
        let site = self.site(ident.span(), text);
        if name != "_" {
            self.module.bindings.insert(name, path.clone());
        }
        self.module.references.push(Reference { path, site });
    }
}

impl<'ast> Visit<'ast> for Uses<'_> {
    /// A module declared inside a function is not followed: its items are
    /// out of this module's reach.
    fn visit_item_mod(&mut self, _: &'ast syn::ItemMod) {}

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_none() {
            self.use_tree(&mut Vec::new(), &item.tree);
        }
    }

    /// Paths inside a macro call (`routes!(crate::live::events)`): the
    /// tokens are not parsed as Rust, so every run `a::b[::c...]` among
    /// them counts as a path in code.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let mut runs = Vec::new();
        paths_in_tokens(mac.tokens.clone(), &mut runs);
        for (segments, span) in runs {
            let site = self.site(span, segments.join("::"));
            self.module.references.push(Reference {
                path: segments,
                site,
            });
        }
        syn::visit::visit_macro(self, mac);
    }

    /// Paths written as strings in an attribute (`#[serde(serialize_with =
    /// "crate::settings::expose")]`): a string that reads as a path of two
    /// segments or more names what it points at.
    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        // Only lists (`#[serde(...)]`): a `#[doc = "..."]` is prose.
        let syn::Meta::List(list) = &attr.meta else {
            return;
        };
        let mut found = Vec::new();
        string_paths_in_tokens(list.tokens.clone(), &mut found);
        for (segments, span) in found {
            let site = self.site(span, segments.join("::"));
            self.module.references.push(Reference {
                path: segments,
                site,
            });
        }
        syn::visit::visit_attribute(self, attr);
    }

    /// A path of two segments or more in code (`crate::task::Task::new`,
    /// `task::Task`); a single name was brought in by a `use`, counted
    /// there.
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            let span = path.segments[0].ident.span();
            let site = self.site(span, segments.join("::"));
            self.module.references.push(Reference {
                path: segments,
                site,
            });
        }
        syn::visit::visit_path(self, path);
    }
}

/// Every run of two names or more joined by `::` in `tokens`, groups
/// included, with the span of its first name. A run after a leading `::`
/// (an external crate) is left out, as `visit_path` leaves it.
fn paths_in_tokens(
    tokens: proc_macro2::TokenStream,
    runs: &mut Vec<(Vec<String>, proc_macro2::Span)>,
) {
    use proc_macro2::{Spacing, TokenTree};
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let is_colons = |i: usize| {
        matches!((tokens.get(i), tokens.get(i + 1)),
            (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':')
    };
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(group) => {
                paths_in_tokens(group.stream(), runs);
                i += 1;
            }
            TokenTree::Ident(first) if !(i >= 2 && is_colons(i - 2)) => {
                let mut segments = vec![first.to_string()];
                let mut next = i + 1;
                while is_colons(next) {
                    let Some(TokenTree::Ident(ident)) = tokens.get(next + 2) else {
                        break;
                    };
                    segments.push(ident.to_string());
                    next += 3;
                }
                if segments.len() > 1 {
                    runs.push((segments, first.span()));
                }
                i = next.max(i + 1);
            }
            _ => i += 1,
        }
    }
}

/// Every string literal in `tokens` (groups included) that reads as a path
/// of two segments or more, without a leading `::`.
fn string_paths_in_tokens(
    tokens: proc_macro2::TokenStream,
    found: &mut Vec<(Vec<String>, proc_macro2::Span)>,
) {
    for token in tokens {
        match token {
            proc_macro2::TokenTree::Group(group) => string_paths_in_tokens(group.stream(), found),
            proc_macro2::TokenTree::Literal(literal) => {
                let Ok(text) = syn::parse2::<syn::LitStr>(proc_macro2::TokenStream::from(
                    proc_macro2::TokenTree::Literal(literal.clone()),
                )) else {
                    continue;
                };
                if let Ok(path) = syn::parse_str::<syn::Path>(&text.value())
                    && path.leading_colon.is_none()
                    && path.segments.len() > 1
                {
                    let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
                    found.push((segments, literal.span()));
                }
            }
            _ => {}
        }
    }
}
