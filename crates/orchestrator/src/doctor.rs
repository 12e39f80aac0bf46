//! `orchestrator doctor`: checks a host before the first start, with the
//! settings `serve` would use, and prints one line per check with what to
//! do about a problem. A failed check would stop the service or its
//! scripts; a warning is worth a look but does not.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use orchestrator_executor::SandboxReuse;
use orchestrator_storage::{StorageConfig, StorageType};

use crate::cli::ServeArgs;
use crate::settings::ServeSettings;

/// Below this much free space the store soon cannot write: fail.
const DISK_FAIL_BYTES: u64 = 512 << 20;
/// Below this much, warn: logs and work dirs grow with every task.
const DISK_WARN_BYTES: u64 = 2 << 30;
/// How long an interpreter may take to print its version.
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Capability bits in `/proc/self/status` (`linux/capability.h`).
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    Ok,
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug)]
struct Check {
    name: String,
    level: Level,
    /// What was found.
    detail: String,
    /// What to do about a warning or a failure.
    fix: Option<String>,
}

impl Check {
    fn ok(name: impl Into<String>, detail: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            level: Level::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn warn(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            level: Level::Warn,
            fix: Some(fix.into()),
            ..Check::ok(name, detail)
        }
    }

    fn fail(name: impl Into<String>, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            level: Level::Fail,
            ..Check::warn(name, detail, fix)
        }
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let settings = ServeSettings::resolve(args)?;
    let mut checks = Vec::new();
    for (extension, program) in [("nu", "nu"), ("sh", "bash"), ("py", "python3")] {
        checks.push(interpreter(&settings, extension, program).await);
    }
    checks.push(scripts_dir(&settings));
    checks.push(data_dir(&settings.data_dir));
    checks.push(free_disk(&settings.data_dir));
    checks.push(clock());
    checks.push(port(&settings).await);
    checks.push(script_sandbox(&settings).await);
    checks.push(namespaces());
    checks.push(storage(&settings).await);
    print!("{}", render(&checks));
    let failed = checks.iter().filter(|c| c.level == Level::Fail).count();
    if failed > 0 {
        bail!(
            "{failed} of {} checks failed; fix them before starting the service",
            checks.len()
        );
    }
    Ok(())
}

/// The table: status, check, what was found, and the fix, one line each.
fn render(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for check in checks {
        let status = match check.level {
            Level::Ok => "ok",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        };
        out.push_str(&format!(
            "{status:<4}  {:<width$}  {}",
            check.name, check.detail
        ));
        if let Some(fix) = &check.fix {
            out.push_str(&format!("; fix: {fix}"));
        }
        out.push('\n');
    }
    out
}

/// An interpreter of the shipped scripts: where the service finds it and
/// that it runs.
async fn interpreter(settings: &ServeSettings, extension: &str, default: &str) -> Check {
    let configured = settings.interpreters.get(extension);
    let program = configured.map_or_else(|| PathBuf::from(default), Clone::clone);
    let name = format!("interpreter {default}");
    let how = match configured {
        Some(_) => {
            format!("set [interpreters] {extension} in the config file to a working {default}")
        }
        None => format!(
            "install {default} on the service's PATH, or set [interpreters] {extension} = \
             \"/path/to/{default}\" in the config file"
        ),
    };
    let Some(path) = find_program(&program) else {
        return Check::fail(
            name,
            format!(
                "{} not found{}: scripts ending in .{extension} cannot run",
                program.display(),
                if program.components().count() > 1 {
                    ""
                } else {
                    " on PATH"
                }
            ),
            how,
        );
    };
    let output = tokio::time::timeout(
        VERSION_TIMEOUT,
        tokio::process::Command::new(&path)
            .arg("--version")
            .kill_on_drop(true)
            .output(),
    )
    .await;
    match output {
        Ok(Ok(output)) if output.status.success() => {
            let version = String::from_utf8_lossy(&output.stdout);
            let version = String::from_utf8_lossy(&output.stderr)
                .lines()
                .chain(version.lines())
                .find(|l| !l.trim().is_empty())
                .map(|l| l.trim().to_owned())
                .unwrap_or_default();
            Check::ok(name, format!("{} ({version})", path.display()))
        }
        Ok(Ok(output)) => Check::fail(
            name,
            format!("{} --version exited with {}", path.display(), output.status),
            how,
        ),
        Ok(Err(e)) => Check::fail(name, format!("cannot run {}: {e}", path.display()), how),
        Err(_) => Check::fail(
            name,
            format!(
                "{} --version gave no answer within {}s",
                path.display(),
                VERSION_TIMEOUT.as_secs()
            ),
            how,
        ),
    }
}

/// A program as the executor finds it: a path as given, a bare name on PATH.
fn find_program(program: &Path) -> Option<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.components().count() > 1 {
        return executable(program).then(|| program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

fn scripts_dir(settings: &ServeSettings) -> Check {
    let dir = &settings.scripts_dir;
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Check::ok("scripts dir", dir.display().to_string()),
        Ok(_) => Check::fail(
            "scripts dir",
            format!("{} is not a directory", dir.display()),
            "set scripts_dir (or --scripts-dir) to the directory of your scripts",
        ),
        Err(e) => Check::fail(
            "scripts dir",
            format!(
                "{}: {e}; the service refuses to start without it",
                dir.display()
            ),
            "set scripts_dir (or --scripts-dir) to the directory of your scripts",
        ),
    }
}

/// The data dir: there or creatable, writable by this user, and not open
/// to every user (it holds the secret key, logs and outputs).
fn data_dir(dir: &Path) -> Check {
    let name = "data dir";
    let metadata = match std::fs::metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = existing_ancestor(dir);
            return match writable(&parent) {
                Ok(()) => Check::ok(
                    name,
                    format!(
                        "{} does not exist yet; the first start creates it",
                        dir.display()
                    ),
                ),
                Err(e) => Check::fail(
                    name,
                    format!(
                        "{} does not exist, and {} is not writable for this user: {e}",
                        dir.display(),
                        parent.display()
                    ),
                    format!(
                        "create it for the service's user: install -d -o orchestrator -g \
                         orchestrator -m 750 {}",
                        dir.display()
                    ),
                ),
            };
        }
        Err(e) => {
            return Check::fail(
                name,
                format!("{}: {e}", dir.display()),
                "check the path and its parents' permissions",
            );
        }
    };
    if !metadata.is_dir() {
        return Check::fail(
            name,
            format!("{} is not a directory", dir.display()),
            "set data_dir (or --data-dir) to a directory",
        );
    }
    let mode = metadata.permissions().mode() & 0o7777;
    let owner = user_name(metadata.uid());
    if let Err(e) = writable(dir) {
        return Check::fail(
            name,
            format!(
                "{} (owner {owner}, mode {mode:o}) is not writable for this user: {e}",
                dir.display()
            ),
            format!(
                "give it to the service's user: chown -R orchestrator:orchestrator {}; run doctor \
                 as that user (sudo -u orchestrator orchestrator doctor ...)",
                dir.display()
            ),
        );
    }
    let key = dir.join("secret.key");
    if let Ok(key_meta) = std::fs::metadata(&key)
        && key_meta.permissions().mode() & 0o077 != 0
    {
        return Check::fail(
            name,
            format!(
                "{} is readable by others (mode {:o}): it opens every stored secret",
                key.display(),
                key_meta.permissions().mode() & 0o777
            ),
            format!("chmod 600 {}", key.display()),
        );
    }
    if mode & 0o007 != 0 {
        return Check::warn(
            name,
            format!(
                "{} (owner {owner}, mode {mode:o}) is open to every user; it holds task logs, \
                 outputs and the secret key",
                dir.display()
            ),
            format!("chmod 750 {}", dir.display()),
        );
    }
    Check::ok(
        name,
        format!("{} (owner {owner}, mode {mode:o}), writable", dir.display()),
    )
}

/// The dir itself or the nearest of its parents that exists.
fn existing_ancestor(dir: &Path) -> PathBuf {
    let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    absolute
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"))
        .to_path_buf()
}

/// Whether this user can create a file in `dir`: by trying, since
/// permission bits do not tell about ACLs, read-only mounts or sandboxes.
fn writable(dir: &Path) -> std::io::Result<()> {
    let probe = dir.join(format!(".orchestrator-doctor-{}", std::process::id()));
    std::fs::File::create(&probe)?;
    std::fs::remove_file(&probe)
}

fn user_name(uid: u32) -> String {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map_or_else(|| uid.to_string(), |u| u.name)
}

fn free_disk(dir: &Path) -> Check {
    let name = "free disk";
    let at = existing_ancestor(dir);
    let stats = match nix::sys::statvfs::statvfs(&at) {
        Ok(stats) => stats,
        Err(e) => {
            return Check::warn(
                name,
                format!("cannot read the free space of {}: {e}", at.display()),
                "check the disk with `df -h`",
            );
        }
    };
    let free = stats.blocks_available() * stats.fragment_size();
    let shown = format!(
        "{:.1} GiB free at {}",
        free as f64 / f64::from(1u32 << 30),
        at.display()
    );
    let fix = "free space, or move data_dir to a larger disk (the journal, logs and work \
               dirs grow with every task)";
    if free < DISK_FAIL_BYTES {
        Check::fail(name, shown, fix)
    } else if free < DISK_WARN_BYTES {
        Check::warn(name, shown, fix)
    } else {
        Check::ok(name, shown)
    }
}

/// The clock: plausible, and synchronized, since leases, retries and
/// schedules are times, compared across nodes on a shared server.
fn clock() -> Check {
    let name = "clock";
    let now = chrono::Utc::now();
    // This code was written in 2025: a clock before then is wrong.
    if now.timestamp() < 1_735_689_600 {
        return Check::fail(
            name,
            format!(
                "the clock says {}, before this release existed",
                now.to_rfc3339()
            ),
            "set the time and enable NTP (timedatectl set-ntp true)",
        );
    }
    let shown = now.format("%Y-%m-%d %H:%M:%S UTC").to_string();
    match ntp_synchronized() {
        Some(true) => Check::ok(name, format!("{shown}, synchronized")),
        Some(false) => Check::warn(
            name,
            format!("{shown}, not synchronized"),
            "enable NTP (timedatectl set-ntp true, or chrony): nodes sharing a SurrealDB \
             server compare lease times",
        ),
        None => Check::warn(
            name,
            format!("{shown}; cannot tell whether it is synchronized (no timedatectl answer)"),
            "make sure NTP (systemd-timesyncd, chrony or ntpd) keeps the clock in sync",
        ),
    }
}

/// What systemd knows of the clock's synchronization, if it is there.
fn ntp_synchronized() -> Option<bool> {
    let output = std::process::Command::new("timedatectl")
        .args(["show", "--property=NTPSynchronized", "--value"])
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    match String::from_utf8_lossy(&output.stdout).trim() {
        "yes" => Some(true),
        "no" => Some(false),
        _ => None,
    }
}

async fn port(settings: &ServeSettings) -> Check {
    let name = "port";
    let at = std::net::SocketAddr::new(settings.bind, settings.port);
    match tokio::net::TcpListener::bind(at).await {
        Ok(_) => Check::ok(name, format!("{at} is free")),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Check::fail(
            name,
            format!("{at} is already in use (a running orchestrator?)"),
            format!(
                "stop what listens there (ss -ltnp 'sport = :{}'), or choose another port",
                settings.port
            ),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => Check::fail(
            name,
            format!("{at}: binding a port below 1024 needs a privilege: {e}"),
            "use a port from 1024 up (and a reverse proxy on 80/443)",
        ),
        Err(e) => Check::fail(
            name,
            format!("cannot listen on {at}: {e}"),
            "check bind (an address of this host) and port",
        ),
    }
}

/// Whether scripts started by this process could make the network and
/// mount namespaces of test environments: the two capabilities they need.
/// That scripts can run in their sandbox: `true`, started as a script
/// would be.
async fn script_sandbox(settings: &ServeSettings) -> Check {
    let name = "script sandbox";
    let data_dir = match std::path::absolute(&settings.data_dir) {
        Ok(dir) => dir,
        Err(e) => return Check::fail(name, format!("--data-dir: {e}"), "fix --data-dir"),
    };
    let sandbox = match crate::sandbox::script_sandbox(settings, &data_dir) {
        Ok(orchestrator_executor::Sandbox::Bubblewrap(sandbox)) => sandbox,
        Ok(orchestrator_executor::Sandbox::None) => {
            return Check::warn(
                name,
                "off (--script-sandbox none): scripts can read the service's secret key, \
                 config and store",
                format!(
                    "install the Debian package `{}` and drop --script-sandbox none",
                    orchestrator_executor::BUBBLEWRAP_PACKAGE
                ),
            );
        }
        Err(e) => {
            return Check::fail(
                name,
                format!("{e:#}"),
                format!(
                    "apt-get install {}",
                    orchestrator_executor::BUBBLEWRAP_PACKAGE
                ),
            );
        }
    };
    // The state dir may not exist before the first start: the probe then
    // binds nothing there.
    let state_dir = data_dir.join("script-state");
    match sandbox.probe(&settings.scripts_dir, &state_dir).await {
        Ok(()) => Check::ok(
            name,
            format!(
                "{}: scripts run without the service's files, processes or capabilities{}",
                sandbox.program().display(),
                match (
                    settings.script_sandbox_attempts,
                    settings.script_sandbox_reuse
                ) {
                    (1, _) => "; each attempt in a sandbox of its own".to_owned(),
                    (n, reuse) => format!(
                        "; one sandbox serves up to {n} attempts in a row {} \
                         (--script-sandbox-attempts, --script-sandbox-reuse), emptied between \
                         them, and an attempt given a secret alone",
                        match reuse {
                            SandboxReuse::Submitter => "of the workflows one token submitted",
                            SandboxReuse::Workflow => "of one workflow",
                            SandboxReuse::Any => "of any workflow",
                        }
                    ),
                }
            ),
        ),
        Err(e) => Check::fail(
            name,
            e,
            "bwrap needs user namespaces when the service is not root (Debian: \
             kernel.unprivileged_userns_clone=1); under systemd, keep the unit's \
             RestrictNamespaces= and SystemCallFilter= lines (see docs/deployment.md)",
        ),
    }
}

fn namespaces() -> Check {
    let name = "namespaces";
    let effective = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        });
    let Some(effective) = effective else {
        return Check::warn(
            name,
            "cannot read this process's capabilities from /proc/self/status",
            "test environments need CAP_SYS_ADMIN and CAP_NET_ADMIN; see docs/deployment.md",
        );
    };
    let missing: Vec<&str> = [
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
    ]
    .into_iter()
    .filter(|(bit, _)| effective & (1 << bit) == 0)
    .map(|(_, cap)| cap)
    .collect();
    if missing.is_empty() {
        return Check::ok(
            name,
            "CAP_SYS_ADMIN and CAP_NET_ADMIN: the service can create the namespaces of test \
             environments (scripts never hold them)",
        );
    }
    Check::warn(
        name,
        format!(
            "{} missing: the service cannot create the namespaces of test environments \
             (nothing else needs them)",
            missing.join(" and ")
        ),
        "only if you run test environments: install the unit's drop-in \
         /usr/share/orchestrator/systemd/test-environments.conf (see docs/deployment.md)",
    )
}

/// The store: compiled in, reachable (a SurrealDB server within the
/// connect timeout), and of a schema this build opens.
async fn storage(settings: &ServeSettings) -> Check {
    let kind = settings.storage_type;
    let name = format!("storage {kind}");
    if !kind.is_compiled_in() {
        return Check::fail(
            name,
            format!("this build has no {kind} backend"),
            format!(
                "use a build with `--features {}`, or storage_type = \"filesystem\"",
                kind.cargo_feature().unwrap_or("?")
            ),
        );
    }
    let config = StorageConfig {
        storage_type: kind,
        data_dir: settings.data_dir.clone(),
        surrealdb: settings.surrealdb.clone(),
    };
    let at = match kind {
        StorageType::SurrealdbServer => format!(
            "{} (namespace {}, database {})",
            settings.surrealdb.url, settings.surrealdb.namespace, settings.surrealdb.database
        ),
        _ => settings.data_dir.display().to_string(),
    };
    if orchestrator_storage::in_use(&config) {
        return Check::ok(name, format!("{at} is in use by a running service"));
    }
    match orchestrator_storage::schema_status(&config).await {
        Ok(status) => {
            let pending = status
                .entries
                .iter()
                .filter(|e| e.state == orchestrator_storage::schema::EntryState::Pending)
                .count();
            let refused: Vec<String> = status
                .entries
                .iter()
                .filter(|e| {
                    !matches!(
                        e.state,
                        orchestrator_storage::schema::EntryState::Applied
                            | orchestrator_storage::schema::EntryState::Pending
                    )
                })
                .map(|e| format!("{} is {}", e.name, e.state))
                .collect();
            if !refused.is_empty() {
                return Check::fail(
                    name,
                    format!("{at}: {}", refused.join(", ")),
                    "`orchestrator db status` shows the details; run the version that wrote \
                     the store, or restore a backup",
                );
            }
            let state = if pending == 0 {
                "up to date".to_owned()
            } else if pending == status.entries.len() {
                "no store yet; the first start creates it".to_owned()
            } else {
                format!("{pending} schema steps pending, applied by the next start")
            };
            Check::ok(name, format!("{at}: {state}"))
        }
        Err(e) => Check::fail(
            name,
            format!("{at}: {e}"),
            match kind {
                StorageType::SurrealdbServer => {
                    "start the server or fix surrealdb_url, and check surrealdb_username and \
                     ORCHESTRATOR_SURREALDB_PASSWORD"
                }
                _ => "`orchestrator db status` shows the details",
            },
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_is_one_line_with_its_fix() {
        let checks = [
            Check::ok("port", "127.0.0.1:8080 is free"),
            Check::fail("interpreter nu", "nu not found on PATH", "install nu"),
        ];
        let expected = "ok    port            127.0.0.1:8080 is free
FAIL  interpreter nu  nu not found on PATH; fix: install nu
";
        assert_eq!(render(&checks), expected);
    }

    #[test]
    fn a_missing_data_dir_under_a_writable_parent_is_fine() {
        let root = tempfile::tempdir().unwrap();
        let check = data_dir(&root.path().join("new/deeper"));
        assert_eq!(check.level, Level::Ok, "{check:?}");
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let check = data_dir(root.path());
        assert_eq!(check.level, Level::Warn, "{check:?}");
        assert!(check.fix.unwrap().contains("chmod 750"));
    }
}
