//! Where a script runs: inside a bubblewrap (`bwrap`) sandbox, the
//! default, or beside the service (`none`, unsafe).
//!
//! A script is whatever the scripts directory holds, written by whoever
//! may write there, and it runs with input an operator chose: it must not
//! reach what the service holds. In the sandbox each script gets its own
//! mount, PID and IPC namespaces and no capability (`--cap-drop ALL`, also
//! when the service runs as root); it sees a fresh `/proc` with its own
//! processes only (not the service's environment or memory), the whole
//! filesystem read-only, a private `/tmp`, and none of the paths the
//! service hides (its data dir, config file, secret key file, systemd
//! credentials). Back in view, read-write: the task's own work dir and the
//! scripts' state dir; read-only: the scripts dir. The network is shared:
//! scripts call the API back at `ORCHESTRATOR_URL`.
//!
//! The rules for nested paths are simple: a path's view is set by the
//! deepest rule above it, so the mounts are applied shallowest first (a
//! scripts dir inside the data dir is back in view; a data dir inside the
//! scripts dir is hidden).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::error::ScriptError;
use crate::lookup::find_program;
use crate::wire::EXEC_FLAG;

/// The Debian package that ships `bwrap`, for messages.
pub const BUBBLEWRAP_PACKAGE: &str = "bubblewrap";

/// How scripts are isolated from the service.
#[derive(Debug, Clone)]
pub enum Sandbox {
    /// Scripts run as plain children of the service: they can read
    /// whatever the service's user can, its `/proc` included. Unsafe.
    None,
    Bubblewrap(Bubblewrap),
}

/// A script's view of the filesystem, and the `bwrap` that sets it up.
#[derive(Debug, Clone)]
pub struct Bubblewrap {
    /// `bwrap` by absolute path, so that spawning it is a `posix_spawn`
    /// (see `ScriptExecutor::on_path`).
    program: PathBuf,
    /// What scripts must not see: the data dir, config and key files,
    /// credentials. A directory becomes an empty tmpfs, a file `/dev/null`.
    hidden: Vec<PathBuf>,
    /// Paths scripts may write besides their work dir, the state dir and
    /// their private `/tmp`.
    writable: Vec<PathBuf>,
    /// `setpriv`, when this process holds capabilities without being
    /// root (the test-environment drop-in grants two as ambient ones):
    /// `bwrap` refuses to start with capabilities it does not expect (it
    /// takes them for a file-capability install it no longer supports),
    /// and a script must not inherit them, so they are cleared before it.
    clear_caps: Option<PathBuf>,
    /// Root without `CAP_SYS_ADMIN` (a bounding set without it): `bwrap`
    /// cannot mount as it is, and must make a user namespace to, as it does
    /// by itself for any other user.
    unshare_user: bool,
    /// The helper (`orchestrator-sandbox-exec`), bound read-only into
    /// every sandbox: each script starts through it, which refuses it the
    /// kernel's keyrings (`syscalls`). Without it, scripts start directly.
    helper: Option<PathBuf>,
}

/// One rule of a script's view of a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum View {
    /// Not there: an empty tmpfs for a directory, `/dev/null` for a file.
    Hidden,
    /// An empty, private, writable tmpfs (`/tmp`).
    Scratch,
    ReadOnly,
    ReadWrite,
}

/// What one attempt's sandbox shows besides the defaults.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt<'a> {
    pub scripts_dir: &'a Path,
    pub state_dir: &'a Path,
    pub work_dir: &'a Path,
}

impl Bubblewrap {
    /// Finds `bwrap` on `path_var` (the `PATH` scripts get); the error
    /// names the package and the setting that turns the sandbox off.
    pub fn find(path_var: Option<&std::ffi::OsStr>) -> Result<Bubblewrap, ScriptError> {
        let program = find_program("bwrap", path_var).ok_or_else(|| ScriptError::NoSandbox {
            path: path_var
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default(),
        })?;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let root = nix::unistd::geteuid().is_root();
        let clear_caps = if !root && capability_set(&status, "CapPrm") != 0 {
            Some(find_program("setpriv", path_var).ok_or(ScriptError::NoSetpriv)?)
        } else {
            None
        };
        Ok(Bubblewrap {
            program,
            hidden: Vec::new(),
            writable: Vec::new(),
            clear_caps,
            unshare_user: root && capability_set(&status, "CapEff") & (1 << CAP_SYS_ADMIN) == 0,
            helper: None,
        })
    }

    /// A sandbox run by `program`, for tests of the arguments.
    pub fn with_program(program: PathBuf) -> Bubblewrap {
        Bubblewrap {
            program,
            hidden: Vec::new(),
            writable: Vec::new(),
            clear_caps: None,
            unshare_user: false,
            helper: None,
        }
    }

    /// Hides `path` from scripts (when it exists at spawn time).
    pub fn hide(mut self, path: impl Into<PathBuf>) -> Bubblewrap {
        self.hidden.push(path.into());
        self
    }

    /// Lets scripts write `path` (when it exists at spawn time: a sandbox
    /// made ahead of it is not used once it does, see `HostView`).
    pub fn allow_writes(mut self, path: impl Into<PathBuf>) -> Bubblewrap {
        self.writable.push(path.into());
        self
    }

    /// Starts every script through `helper` ([`crate::HELPER_NAME`]).
    pub(crate) fn set_helper(&mut self, helper: PathBuf) {
        self.helper = Some(helper);
    }

    pub(crate) fn helper(&self) -> Option<&Path> {
        self.helper.as_deref()
    }

    /// [`Bubblewrap::command_line`] for a script that starts with the
    /// sandbox: through the helper, when there is one. The script's own
    /// command line follows.
    pub(crate) fn script_line(&self, attempt: Attempt<'_>) -> (PathBuf, Vec<OsString>) {
        let (program, mut args) = self.command_line(attempt);
        if let Some(helper) = &self.helper {
            args.extend([helper.clone().into_os_string(), EXEC_FLAG.into()]);
        }
        (program, args)
    }

    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Runs `true` in the sandbox as a script in `scripts_dir` with
    /// `state_dir` would run: `Err` with what `bwrap` said when it cannot
    /// (no user namespaces for an unprivileged user, a unit that forbids
    /// them, ...).
    pub async fn probe(&self, scripts_dir: &Path, state_dir: &Path) -> Result<(), String> {
        let truth = find_program("true", std::env::var_os("PATH").as_deref())
            .unwrap_or_else(|| PathBuf::from("/bin/true"));
        let (program, args) = self.command_line(Attempt {
            scripts_dir,
            state_dir,
            work_dir: state_dir,
        });
        let output = tokio::process::Command::new(&program)
            .args(args)
            .arg(truth)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{} failed ({}): {}",
                program.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// The program to spawn and its arguments up to the `--` after which
    /// the script's own command line follows.
    pub(crate) fn command_line(&self, attempt: Attempt<'_>) -> (PathBuf, Vec<OsString>) {
        let (program, args, _) = self.command_line_seen(attempt);
        (program, args)
    }

    /// [`Bubblewrap::command_line`], and the host it was made from.
    pub(crate) fn command_line_seen(
        &self,
        attempt: Attempt<'_>,
    ) -> (PathBuf, Vec<OsString>, HostView) {
        let mut args = Vec::new();
        let program = match &self.clear_caps {
            Some(setpriv) => {
                args.extend(["--inh-caps=-all", "--ambient-caps=-all", "--"].map(OsString::from));
                args.push(self.program.clone().into_os_string());
                setpriv.clone()
            }
            None => self.program.clone(),
        };
        let (own, seen) = self.args_seen(attempt);
        args.extend(own);
        args.push("--".into());
        (program, args, seen)
    }

    /// `bwrap`'s own arguments for one attempt, for the filesystem as it
    /// is now, and what of it they were made from.
    fn args_seen(&self, attempt: Attempt<'_>) -> (Vec<OsString>, HostView) {
        let seen = std::cell::RefCell::new(Vec::new());
        let args = self.args_on(attempt, &|path: &Path| {
            let kind = kind_of(path);
            seen.borrow_mut().push(kind);
            kind
        });
        (args, HostView(seen.into_inner()))
    }

    /// The host as a sandbox for `attempt` made now would see it: compared
    /// with a sandbox's own ([`Bubblewrap::command_line_seen`]), whether
    /// that sandbox is stale.
    pub(crate) fn host_view(&self, attempt: Attempt<'_>) -> HostView {
        // The paths `plan` asks about, in its order.
        HostView(
            self.rules(attempt)
                .iter()
                .filter(|(path, _)| path.is_absolute())
                .map(|(path, _)| kind_of(path))
                .collect(),
        )
    }

    /// [`Bubblewrap::args_seen`] on a filesystem where `kind` says what each
    /// path is (`None`: absent).
    fn args_on(&self, attempt: Attempt<'_>, kind: &dyn Fn(&Path) -> Option<Kind>) -> Vec<OsString> {
        let mut args: Vec<OsString> = [
            // Killed with the service: no script outlives a crash of it.
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--cap-drop",
            "ALL",
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            // `/dev` itself is read-only (below): its nodes cannot be
            // swapped for files, and nothing is left there for a later
            // attempt of a kept sandbox. Shared memory and message queues
            // get writable mounts of their own, which such a sandbox
            // empties between attempts (`private_dirs`).
            "--tmpfs",
            DEV_SHM,
            "--mqueue",
            DEV_MQUEUE,
            "--proc",
            "/proc",
        ]
        .map(OsString::from)
        .to_vec();
        if self.unshare_user {
            args.push("--unshare-user".into());
        }
        for (path, view, kind) in plan(self.rules(attempt), kind) {
            let path = path.into_os_string();
            match view {
                View::Hidden if kind == Kind::Dir => {
                    args.extend(["--tmpfs".into(), path]);
                }
                View::Hidden => args.extend(["--ro-bind".into(), "/dev/null".into(), path]),
                View::Scratch => args.extend(["--tmpfs".into(), path]),
                View::ReadOnly => args.extend(["--ro-bind".into(), path.clone(), path]),
                View::ReadWrite => args.extend(["--bind".into(), path.clone(), path]),
            }
        }
        // The helper in view, read-only, wherever it is (a build tree in
        // `/tmp` would be under the sandbox's own): over the rest.
        if let Some(helper) = &self.helper {
            let helper = helper.clone().into_os_string();
            args.extend(["--ro-bind".into(), helper.clone(), helper]);
        }
        // Last: a rule may have made a mount point under it.
        args.extend(["--remount-ro", "/dev"].map(OsString::from));
        args
    }

    /// Every file system of its own that a sandbox for `attempt` mounts
    /// writable: the tmpfs of each scratch and hidden dir, `/dev/shm` and
    /// the message queues. What a script leaves in one, a later attempt in
    /// the same sandbox would find, so a kept sandbox empties them all
    /// between attempts (without crossing into the mounts beneath them,
    /// which are the host's).
    pub(crate) fn private_dirs(&self, attempt: Attempt<'_>) -> Vec<PathBuf> {
        self.private_dirs_on(attempt, &kind_of)
    }

    fn private_dirs_on(
        &self,
        attempt: Attempt<'_>,
        kind: &dyn Fn(&Path) -> Option<Kind>,
    ) -> Vec<PathBuf> {
        let mut dirs: Vec<PathBuf> = plan(self.rules(attempt), kind)
            .into_iter()
            .filter(|(_, view, kind)| {
                *kind == Kind::Dir && matches!(view, View::Hidden | View::Scratch)
            })
            .map(|(path, _, _)| path)
            .collect();
        dirs.extend([DEV_SHM, DEV_MQUEUE].map(PathBuf::from));
        dirs
    }
}

/// The host's control sockets whose services trust a caller by its user:
/// to them a script of a service run as root would be root, whatever
/// capabilities it lacks (`systemd-run` through systemd's own socket or
/// the system bus starts anything, a container engine's socket mounts the
/// host). Hidden (`/dev/null` over each, where it exists), as the
/// service's files are. Other sockets stay in reach: security.md.
const CONTROL_SOCKETS: [&str; 8] = [
    "/run/systemd/private",
    "/run/dbus/system_bus_socket",
    "/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/run/podman/podman.sock",
    "/run/crio/crio.sock",
    "/run/snapd.socket",
    "/run/libvirt/libvirt-sock",
];

/// What of `/proc` a script may read but never write (where it exists).
const PROC_READ_ONLY: [&str; 3] = ["/proc/sys", "/proc/sysrq-trigger", "/proc/fs"];

/// Shared memory (`shm_open`), a tmpfs of the sandbox's own.
const DEV_SHM: &str = "/dev/shm";
/// POSIX message queues of the sandbox's IPC namespace, as files.
const DEV_MQUEUE: &str = "/dev/mqueue";

impl Bubblewrap {
    /// Every rule of one attempt's view, in no particular order.
    fn rules(&self, attempt: Attempt<'_>) -> Vec<(PathBuf, View)> {
        let mut rules: Vec<(PathBuf, View)> = vec![
            (PathBuf::from("/tmp"), View::Scratch),
            (PathBuf::from("/var/tmp"), View::Scratch),
        ];
        // The kernel's settings, read-only over the sandbox's `/proc`: a
        // script of a service run as root is root without capabilities,
        // which the file modes alone let write most of them (a
        // `core_pattern` the kernel would run as root on the next crash,
        // a `sysrq-trigger` that halts the host). `bwrap` covers
        // `/proc/irq` and `/proc/bus` itself.
        rules.extend(PROC_READ_ONLY.map(|path| (PathBuf::from(path), View::ReadOnly)));
        // Before the service's own rules: `--script-writable` gives one
        // back to scripts that must use it.
        rules.extend(CONTROL_SOCKETS.map(|path| (PathBuf::from(path), View::Hidden)));
        rules.extend(self.hidden.iter().map(|p| (p.clone(), View::Hidden)));
        rules.push((attempt.scripts_dir.to_path_buf(), View::ReadOnly));
        rules.extend(self.writable.iter().map(|p| (p.clone(), View::ReadWrite)));
        rules.push((attempt.state_dir.to_path_buf(), View::ReadWrite));
        rules.push((attempt.work_dir.to_path_buf(), View::ReadWrite));
        rules
    }

    /// Whether an attempt sees `dir` as a private tmpfs of its own: the
    /// deepest rule above it (or on it) hides it. What a script writes
    /// there stays in its sandbox.
    pub(crate) fn is_private(&self, dir: &Path, attempt: Attempt<'_>) -> bool {
        self.rules(attempt)
            .into_iter()
            .filter(|(path, _)| dir.starts_with(path))
            // Stable: among rules for the same path, the later one wins.
            .max_by_key(|(path, _)| path.components().count())
            .is_some_and(|(_, view)| view == View::Hidden)
    }
}

/// How an attempt's process starts, in or out of a sandbox, made at once
/// or ahead: its streams piped to the service, and in a process group of
/// its own, so that a timeout or cancel stops the script together with
/// everything it started.
pub(crate) fn as_attempt(command: &mut tokio::process::Command) -> &mut tokio::process::Command {
    command
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
}

/// The rules to apply, in order: shallowest path first, so that a deeper
/// rule lands on top; without rules that change nothing (a hidden path
/// under a hidden or scratch one, which would only show its name) and
/// without paths that do not exist (`bwrap` cannot bind them).
fn plan(
    rules: Vec<(PathBuf, View)>,
    kind: &dyn Fn(&Path) -> Option<Kind>,
) -> Vec<(PathBuf, View, Kind)> {
    let mut rules: Vec<(PathBuf, View, Kind)> = rules
        .into_iter()
        .filter(|(path, _)| path.is_absolute())
        .filter_map(|(path, view)| kind(&path).map(|kind| (path, view, kind)))
        .collect();
    // Stable: among rules for the same path, the later one wins.
    rules.sort_by_key(|(path, _, _)| path.components().count());
    let mut planned: Vec<(PathBuf, View, Kind)> = Vec::new();
    for (path, view, kind) in rules {
        let governing = planned
            .iter()
            .rev()
            .find(|(above, _, _)| path.starts_with(above) && *above != path)
            .map(|(_, view, _)| *view);
        let covered =
            view == View::Hidden && matches!(governing, Some(View::Hidden | View::Scratch));
        if !covered {
            planned.push((path, view, kind));
        }
    }
    planned
}

/// What the host had, when a sandbox was made, of the paths its rules
/// name: each absent, a dir or a file. A sandbox shows the host as it was
/// then, so once this changes it is stale: a control socket or a file to
/// hide that appeared since would be in reach in it, and a writable path
/// that appeared since would be missing. A sandbox made ahead of its
/// attempt is not used then (`prepared`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostView(Vec<Option<Kind>>);

/// What `path` is now, following links as `bwrap` does; `None` if absent.
fn kind_of(path: &Path) -> Option<Kind> {
    std::fs::metadata(path)
        .ok()
        .map(|m| if m.is_dir() { Kind::Dir } else { Kind::File })
}

/// What a path is, for the rule that hides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

/// `CAP_SYS_ADMIN`'s bit in the capability sets.
const CAP_SYS_ADMIN: u32 = 21;

/// A capability set (`CapEff`, `CapPrm`, ...) from the text of a
/// `/proc/<pid>/status`; 0 when absent.
pub fn capability_set(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// The mounts after the fixed flags, each flag with its paths.
    fn mounts(args: &[String]) -> Vec<String> {
        let fixed = args.iter().position(|a| a == "/proc").unwrap() + 1;
        let mut out = Vec::new();
        let mut rest = &args[fixed..];
        while let Some(flag) = rest.first() {
            let n = match flag.as_str() {
                "--tmpfs" | "--remount-ro" => 2,
                "--" => break,
                _ => 3,
            };
            out.push(rest[..n].join(" "));
            rest = &rest[n..];
        }
        out
    }

    /// A filesystem of these directories and files (and their parents).
    fn fs(
        dirs: &'static [&'static str],
        files: &'static [&'static str],
    ) -> impl Fn(&Path) -> Option<Kind> {
        move |path: &Path| {
            if files.iter().any(|f| Path::new(f) == path) {
                Some(Kind::File)
            } else if dirs
                .iter()
                .chain(files)
                .any(|d| Path::new(d).starts_with(path))
            {
                Some(Kind::Dir)
            } else {
                None
            }
        }
    }

    fn attempt<'a>(scripts: &'a str, state: &'a str, work: &'a str) -> Attempt<'a> {
        Attempt {
            scripts_dir: Path::new(scripts),
            state_dir: Path::new(state),
            work_dir: Path::new(work),
        }
    }

    fn position(mounts: &[String], mount: &str) -> usize {
        mounts
            .iter()
            .position(|m| m == mount)
            .unwrap_or_else(|| panic!("{mount} not in {mounts:?}"))
    }

    /// A sandbox's view of the host, as its command line saw it, equals
    /// the host's now until a path of its rules appears or goes.
    #[test]
    fn a_sandbox_s_host_view_changes_when_a_path_of_its_rules_appears() {
        let dir = tempfile::tempdir().unwrap();
        let later = dir.path().join("later");
        let sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into()).allow_writes(&later);
        let on = attempt("/", "/tmp", "/tmp");
        let (_, _, made) = sandbox.command_line_seen(on);
        assert_eq!(made, sandbox.host_view(on));
        std::fs::create_dir(&later).unwrap();
        assert_ne!(made, sandbox.host_view(on), "a writable dir appeared");
        let (_, _, remade) = sandbox.command_line_seen(on);
        assert_eq!(remade, sandbox.host_view(on));
        std::fs::remove_dir(&later).unwrap();
        assert_eq!(made, sandbox.host_view(on), "and went again");
    }

    #[test]
    fn a_script_gets_no_capability_its_own_pid_namespace_and_a_read_only_root() {
        let sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into());
        let (program, args) = sandbox.command_line(attempt("/", "/tmp", "/tmp"));
        assert_eq!(program, PathBuf::from("/usr/bin/bwrap"));
        let args = strings(&args);
        let joined = args.join(" ");
        for wanted in [
            "--die-with-parent",
            "--unshare-pid",
            "--cap-drop ALL",
            "--ro-bind / /",
            "--proc /proc",
            "--dev /dev",
        ] {
            assert!(joined.contains(wanted), "{wanted} in {joined}");
        }
        // The network stays shared: scripts call the API back.
        assert!(!joined.contains("--unshare-net") && !joined.contains("--unshare-all"));
        // Never a new session: it would take the script out of the process
        // group that a timeout or cancel stops.
        assert!(!joined.contains("--new-session"));
        assert_eq!(args.last().unwrap(), "--");
    }

    #[test]
    fn the_data_dir_is_hidden_but_the_work_dir_state_dir_and_scripts_come_back() {
        let sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into())
            .hide("/srv/data")
            .hide("/srv/data/secret.key")
            .hide("/etc/orchestrator/config.toml")
            .hide("/run/credentials/orchestrator.service")
            .hide("/srv/absent")
            .allow_writes("/srv/cache");
        let args = strings(&sandbox.args_on(
            attempt(
                "/srv/data/scripts",
                "/srv/data/script-state",
                "/srv/data/work/task-1",
            ),
            &fs(
                &[
                    "/tmp",
                    "/srv/data/scripts",
                    "/srv/data/script-state",
                    "/srv/data/work/task-1",
                    "/run/credentials/orchestrator.service",
                    "/srv/cache",
                ],
                &["/srv/data/secret.key", "/etc/orchestrator/config.toml"],
            ),
        ));
        let mounts = mounts(&args);
        assert_eq!(mounts[0], "--tmpfs /tmp", "{mounts:?}");
        let data = position(&mounts, "--tmpfs /srv/data");
        position(&mounts, "--ro-bind /dev/null /etc/orchestrator/config.toml");
        position(&mounts, "--tmpfs /run/credentials/orchestrator.service");
        position(&mounts, "--bind /srv/cache /srv/cache");
        let scripts = position(&mounts, "--ro-bind /srv/data/scripts /srv/data/scripts");
        let state = position(
            &mounts,
            "--bind /srv/data/script-state /srv/data/script-state",
        );
        let work = position(
            &mounts,
            "--bind /srv/data/work/task-1 /srv/data/work/task-1",
        );
        // Deeper rules land on top of shallower ones.
        assert!(data < scripts && data < state && state < work, "{mounts:?}");
        // The key is under the hidden data dir already: binding /dev/null
        // on it would only show its name. Absent paths are skipped, and so
        // is /var/tmp here.
        assert!(
            !mounts.iter().any(|m| m.ends_with("secret.key")),
            "{mounts:?}"
        );
        assert!(
            !mounts
                .iter()
                .any(|m| m.contains("absent") || m.contains("/var/tmp"))
        );
    }

    #[test]
    fn dev_and_kernel_settings_are_read_only_and_every_writable_mount_of_its_own_is_listed() {
        let sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into())
            .hide("/srv/data")
            .hide("/srv/data/inner")
            .hide("/etc/orchestrator/config.toml")
            .allow_writes("/srv/cache");
        let files = fs(
            &[
                "/tmp",
                "/proc/sys",
                "/srv/data/work/t",
                "/srv/data/inner",
                "/srv/cache",
            ],
            &["/etc/orchestrator/config.toml"],
        );
        let attempt = attempt("/srv/scripts", "/srv/state", "/srv/data/work/t");
        let args = strings(&sandbox.args_on(attempt, &files));
        let joined = args.join(" ");
        assert!(
            joined.contains("--dev /dev --tmpfs /dev/shm --mqueue /dev/mqueue"),
            "{joined}"
        );
        // After every mount, so that none needs a mount point made in it.
        let mounts = mounts(&args);
        position(&mounts, "--ro-bind /proc/sys /proc/sys");
        assert_eq!(mounts.last().unwrap(), "--remount-ro /dev", "{mounts:?}");
        // The tmpfs of the scratch and hidden dirs (not the hidden one
        // under another, which is not mounted), /dev/shm and the queues:
        // never a bound path, which is the host's.
        let dirs = sandbox.private_dirs_on(attempt, &files);
        let dirs: Vec<&str> = dirs.iter().map(|d| d.to_str().unwrap()).collect();
        assert_eq!(
            dirs,
            ["/tmp", "/srv/data", "/dev/shm", "/dev/mqueue"],
            "{mounts:?}"
        );
    }

    #[test]
    fn the_host_s_control_sockets_are_hidden_unless_given_back() {
        let sandbox =
            Bubblewrap::with_program("/usr/bin/bwrap".into()).allow_writes("/run/docker.sock");
        let files = fs(
            &["/srv/data/work/t"],
            &["/run/systemd/private", "/run/docker.sock"],
        );
        let args =
            strings(&sandbox.args_on(attempt("/srv/s", "/srv/state", "/srv/data/work/t"), &files));
        let mounts = mounts(&args);
        position(&mounts, "--ro-bind /dev/null /run/systemd/private");
        // Listed in --script-writable: the script may use it (the later
        // mount of the same path lands on top).
        let hidden = position(&mounts, "--ro-bind /dev/null /run/docker.sock");
        let given_back = position(&mounts, "--bind /run/docker.sock /run/docker.sock");
        assert!(hidden < given_back, "{mounts:?}");
        // Absent: nothing to hide.
        assert!(
            !mounts.iter().any(|m| m.contains("system_bus_socket")),
            "{mounts:?}"
        );
    }

    #[test]
    fn a_data_dir_inside_the_scripts_dir_stays_hidden() {
        let sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into()).hide("/srv/scripts/data");
        let args = strings(&sandbox.args_on(
            attempt(
                "/srv/scripts",
                "/srv/scripts/data/state",
                "/srv/scripts/data/work/t",
            ),
            &fs(
                &["/srv/scripts/data/state", "/srv/scripts/data/work/t"],
                &[],
            ),
        ));
        let mounts = mounts(&args);
        let scripts = position(&mounts, "--ro-bind /srv/scripts /srv/scripts");
        let data = position(&mounts, "--tmpfs /srv/scripts/data");
        let work = position(
            &mounts,
            "--bind /srv/scripts/data/work/t /srv/scripts/data/work/t",
        );
        assert!(scripts < data && data < work, "{mounts:?}");
    }

    #[test]
    fn what_is_under_the_private_tmp_needs_no_hiding() {
        let sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into()).hide("/tmp/data");
        let args = strings(&sandbox.args_on(
            attempt("/tmp/scripts", "/tmp/data/state", "/tmp/data/work/t"),
            &fs(
                &["/tmp/scripts", "/tmp/data/state", "/tmp/data/work/t"],
                &[],
            ),
        ));
        let mounts = mounts(&args);
        assert!(
            !mounts.contains(&"--tmpfs /tmp/data".to_owned()),
            "{mounts:?}"
        );
        position(&mounts, "--ro-bind /tmp/scripts /tmp/scripts");
        position(&mounts, "--bind /tmp/data/work/t /tmp/data/work/t");
    }

    #[test]
    fn capabilities_are_cleared_before_bwrap_when_setpriv_is_set() {
        let mut sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into());
        sandbox.clear_caps = Some("/usr/bin/setpriv".into());
        let (program, args) = sandbox.command_line(attempt("/", "/tmp", "/tmp"));
        assert_eq!(program, PathBuf::from("/usr/bin/setpriv"));
        assert_eq!(
            strings(&args[..4]),
            [
                "--inh-caps=-all",
                "--ambient-caps=-all",
                "--",
                "/usr/bin/bwrap"
            ]
        );
        assert!(strings(&args).contains(&"--cap-drop".to_owned()));
    }

    #[test]
    fn root_without_cap_sys_admin_makes_a_user_namespace() {
        let mut sandbox = Bubblewrap::with_program("/usr/bin/bwrap".into());
        let (_, args) = sandbox.command_line(attempt("/", "/tmp", "/tmp"));
        assert!(!strings(&args).contains(&"--unshare-user".to_owned()));
        sandbox.unshare_user = true;
        let (_, args) = sandbox.command_line(attempt("/", "/tmp", "/tmp"));
        assert!(strings(&args).contains(&"--unshare-user".to_owned()));
    }

    #[test]
    fn capability_sets_are_read_from_proc_status() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapPrm:\t0000000000201000\nCapEff:\t0000000000201000\n";
        assert_eq!(capability_set(status, "CapPrm"), 0x201000);
        assert_eq!(capability_set(status, "CapInh"), 0);
        assert_eq!(capability_set(status, "CapAmb"), 0);
    }
}
