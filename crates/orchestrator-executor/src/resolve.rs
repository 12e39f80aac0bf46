//! Turning a user-supplied script path into a file we are willing to run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::ScriptExecutor;
use crate::error::ScriptError;

/// How a script is started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launcher {
    /// Run this interpreter with the script as its argument.
    Interpreter(PathBuf),
    /// The script is executable itself.
    Direct,
}

/// A script that passed every check.
#[derive(Debug, Clone)]
pub struct ResolvedScript {
    /// As the user wrote it, for messages.
    pub name: String,
    /// Canonical path inside the scripts dir.
    pub path: PathBuf,
    pub launcher: Launcher,
}

impl ScriptExecutor {
    /// Checks a script path: relative, no `..`, inside the scripts dir even
    /// after following symlinks, and runnable.
    pub fn resolve(&self, script: &str) -> Result<ResolvedScript, ScriptError> {
        if script.trim().is_empty() {
            return Err(ScriptError::Empty);
        }
        let relative = Path::new(script);
        if relative.is_absolute() {
            return Err(ScriptError::Absolute(script.to_owned()));
        }
        if relative
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(ScriptError::ParentDir(script.to_owned()));
        }
        let scripts_dir = &self.config.scripts_dir;
        let path = scripts_dir
            .join(relative)
            .canonicalize()
            .map_err(|_| ScriptError::NotFound(script.to_owned()))?;
        if !path.starts_with(scripts_dir) {
            return Err(ScriptError::EscapesScriptsDir(script.to_owned()));
        }
        let metadata =
            std::fs::metadata(&path).map_err(|_| ScriptError::NotFound(script.to_owned()))?;
        if !metadata.is_file() {
            return Err(ScriptError::NotAFile(script.to_owned()));
        }
        let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
        let launcher = match self.config.interpreters.get(extension) {
            Some(interpreter) => Launcher::Interpreter(interpreter.clone()),
            None => match extension {
                "nu" => Launcher::Interpreter("nu".into()),
                "sh" => Launcher::Interpreter("bash".into()),
                "py" => Launcher::Interpreter("python3".into()),
                _ if metadata.permissions().mode() & 0o111 != 0 => Launcher::Direct,
                _ => return Err(ScriptError::NotExecutable(script.to_owned())),
            },
        };
        Ok(ResolvedScript {
            name: script.to_owned(),
            path,
            launcher,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    use super::*;
    use crate::ExecutorConfig;

    fn executor(scripts: &Path) -> ScriptExecutor {
        ScriptExecutor::new(ExecutorConfig {
            scripts_dir: scripts.to_path_buf(),
            work_dir: scripts.join("work"),
            data_dir: scripts.to_path_buf(),
            kill_grace: Duration::from_secs(1),
            interpreters: HashMap::new(),
            service_url: None,
            sandbox: crate::Sandbox::None,
        })
        .unwrap()
    }

    #[test]
    fn accepts_scripts_inside_and_picks_the_interpreter() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("servers")).unwrap();
        for name in ["servers/create.nu", "a.sh", "b.py"] {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        let exe = dir.path().join("tool");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let ex = executor(dir.path());
        assert_eq!(
            ex.resolve("servers/create.nu").unwrap().launcher,
            Launcher::Interpreter("nu".into())
        );
        assert_eq!(
            ex.resolve("a.sh").unwrap().launcher,
            Launcher::Interpreter("bash".into())
        );
        assert_eq!(
            ex.resolve("b.py").unwrap().launcher,
            Launcher::Interpreter("python3".into())
        );
        assert_eq!(ex.resolve("./tool").unwrap().launcher, Launcher::Direct);
    }

    #[test]
    fn refuses_every_escape_and_names_the_path() {
        let root = tempfile::tempdir().unwrap();
        let scripts = root.path().join("scripts");
        std::fs::create_dir_all(&scripts).unwrap();
        std::fs::write(root.path().join("outside.sh"), "").unwrap();
        std::fs::write(scripts.join("plain.txt"), "").unwrap();
        std::fs::create_dir(scripts.join("dir.sh")).unwrap();
        symlink(root.path().join("outside.sh"), scripts.join("link.sh")).unwrap();
        let ex = executor(&scripts);
        type Case = (&'static str, fn(&ScriptError) -> bool);
        let cases: &[Case] = &[
            ("", |e| matches!(e, ScriptError::Empty)),
            ("/etc/passwd", |e| matches!(e, ScriptError::Absolute(_))),
            ("../outside.sh", |e| matches!(e, ScriptError::ParentDir(_))),
            ("servers/../../outside.sh", |e| {
                matches!(e, ScriptError::ParentDir(_))
            }),
            ("link.sh", |e| {
                matches!(e, ScriptError::EscapesScriptsDir(_))
            }),
            ("missing.sh", |e| matches!(e, ScriptError::NotFound(_))),
            ("dir.sh", |e| matches!(e, ScriptError::NotAFile(_))),
            ("plain.txt", |e| matches!(e, ScriptError::NotExecutable(_))),
        ];
        for (path, expected) in cases {
            let err = ex.resolve(path).unwrap_err();
            assert!(expected(&err), "{path}: {err}");
            if !path.is_empty() {
                assert!(err.to_string().contains(path), "{err}");
            }
        }
    }
}
