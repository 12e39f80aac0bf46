//! The executor's errors: why a script cannot run, or the sandbox cannot
//! be set up.

use std::path::PathBuf;

/// Why a script path was refused (every message names the path), or why
/// scripts cannot run at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    #[error("script path must not be empty")]
    Empty,
    #[error("script path `{0}` must be relative to the scripts dir, not absolute")]
    Absolute(String),
    #[error("script path `{0}` must not contain `..`")]
    ParentDir(String),
    #[error("script `{0}` does not exist in the scripts dir")]
    NotFound(String),
    #[error("script `{0}` resolves outside the scripts dir (through a symlink)")]
    EscapesScriptsDir(String),
    #[error("script `{0}` is not a regular file")]
    NotAFile(String),
    #[error(
        "script `{0}` has no known interpreter extension (.nu, .sh, .py) and is not executable"
    )]
    NotExecutable(String),
    #[error(
        "the script sandbox needs `bwrap`, which is not on PATH ({path}): install the Debian \
         package `bubblewrap`, or set --script-sandbox none (unsafe: scripts can then read \
         the service's secret key, config and store)"
    )]
    NoSandbox { path: String },
    #[error(
        "this service holds capabilities without being root, and the script sandbox needs \
         `setpriv` (Debian package `util-linux`) on PATH to keep them from scripts"
    )]
    NoSetpriv,
    // The reason is in the message, not a `source` too: a chain of
    // causes (`{:#}`) would say it twice.
    #[error("scripts dir {} is not usable: {error}", dir.display())]
    ScriptsDir { dir: PathBuf, error: std::io::Error },
}
