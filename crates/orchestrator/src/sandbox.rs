//! The script sandbox as this service sets it up: what it hides (the data
//! dir, the config file, the secret key file, systemd credentials, the
//! test environments' container engine), what
//! scripts may write, and where they keep their own state.

use std::path::{Path, PathBuf};

use anyhow::Context;
use orchestrator_executor::{Bubblewrap, Sandbox};

use crate::settings::{ScriptSandbox, ServeSettings, TestenvProvider};

/// The systemd credential that holds the secret key (`LoadCredential=`).
pub const KEY_CREDENTIAL: &str = "secret-key";

/// The scripts' own directory under the data dir: `ORCHESTRATOR_DATA_DIR`
/// for scripts, the one part of the data dir they can reach.
const STATE_DIR: &str = "script-state";

/// What the shipped scripts keep, which earlier versions left at the top
/// of the data dir.
const SHIPPED_STATE: &str = "infra";

/// The scripts' state dir, made if missing. State the shipped scripts
/// kept at the top of the data dir (before the sandbox hid it) moves in.
pub fn state_dir(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let state = data_dir.join(STATE_DIR);
    if !state.exists() {
        std::fs::create_dir_all(&state)
            .with_context(|| format!("cannot create {}", state.display()))?;
        let old = data_dir.join(SHIPPED_STATE);
        if old.is_dir() {
            let new = state.join(SHIPPED_STATE);
            std::fs::rename(&old, &new)
                .with_context(|| format!("cannot move {} to {}", old.display(), new.display()))?;
            tracing::info!(
                from = %old.display(),
                to = %new.display(),
                "moved the scripts' state into the scripts' state dir"
            );
        }
    }
    Ok(state)
}

/// The sandbox `--script-sandbox` asks for, hiding the service's own
/// files. Fails when `bwrap` is missing, naming the package and the
/// setting; `none` is logged as the risk it is.
pub fn script_sandbox(settings: &ServeSettings, data_dir: &Path) -> anyhow::Result<Sandbox> {
    match settings.script_sandbox {
        ScriptSandbox::None => {
            tracing::warn!(
                "SCRIPTS ARE NOT SANDBOXED (--script-sandbox none): every script can read this \
                 service's secret key, config and store, and holds its capabilities"
            );
            Ok(Sandbox::None)
        }
        ScriptSandbox::Bubblewrap => {
            let mut sandbox = Bubblewrap::find(std::env::var_os("PATH").as_deref())
                .context("--script-sandbox bubblewrap")?
                .hide(data_dir);
            let absolute =
                |path: &Path| std::path::absolute(path).with_context(|| path.display().to_string());
            for file in settings.config_file.iter().chain(&settings.secret_key_file) {
                sandbox = sandbox.hide(absolute(file)?);
            }
            if let Some(dir) = std::env::var_os("CREDENTIALS_DIRECTORY") {
                sandbox = sandbox.hide(PathBuf::from(dir));
            }
            // The container engine of test environments: root on its host.
            if let TestenvProvider::Docker { host, .. } = &settings.testenv_provider
                && let Some(socket) = host.strip_prefix("unix://")
            {
                sandbox = sandbox.hide(PathBuf::from(socket));
            }
            for path in &settings.script_writable {
                sandbox = sandbox.allow_writes(path);
            }
            Ok(Sandbox::Bubblewrap(sandbox))
        }
    }
}

/// Where the Debian package installs the helper of prepared sandboxes.
const LIBEXEC_DIR: &str = "/usr/libexec/orchestrator";

/// The helper every sandboxed script starts through: beside this binary
/// (a build tree), else in [`LIBEXEC_DIR`] (the package). Without it every
/// attempt makes its own sandbox at its start and scripts may use the
/// kernel's keyrings, which is logged.
pub fn prepared_helper() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name(orchestrator_executor::HELPER_NAME));
    let found = beside
        .into_iter()
        .chain([Path::new(LIBEXEC_DIR).join(orchestrator_executor::HELPER_NAME)])
        .find(|path| path.is_file());
    if found.is_none() {
        tracing::warn!(
            helper = orchestrator_executor::HELPER_NAME,
            "no sandbox helper beside this binary nor in {LIBEXEC_DIR}: each script's \
             sandbox is made when it starts, and scripts are not refused the kernel's \
             keyrings (docs/security.md)"
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped scripts' state at the top of the data dir (where the
    /// sandbox no longer lets them see it) moves into the state dir once.
    #[test]
    fn the_shipped_scripts_state_moves_into_the_state_dir() {
        let dir = tempfile::tempdir().unwrap();
        let server = dir.path().join("infra/lab/servers/web-01");
        std::fs::create_dir_all(&server).unwrap();
        std::fs::write(server.join("server.json"), "{}").unwrap();
        let state = state_dir(dir.path()).unwrap();
        assert_eq!(state, dir.path().join("script-state"));
        assert!(state.join("infra/lab/servers/web-01/server.json").is_file());
        assert!(!dir.path().join("infra").exists());
        // Once there, nothing moves again.
        std::fs::create_dir_all(dir.path().join("infra/new")).unwrap();
        state_dir(dir.path()).unwrap();
        assert!(dir.path().join("infra/new").is_dir());
        assert!(!state.join("infra/new").exists());
    }
}
