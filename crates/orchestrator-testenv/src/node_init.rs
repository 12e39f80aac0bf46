//! The first process of a test node (`orchestrator testenv-node-init`):
//! started by the namespace provider as `ip netns exec <ns> unshare --uts
//! --mount --pid --fork --propagation private <orchestrator>
//! testenv-node-init ...`, so it is pid 1 of the node's PID namespace and
//! alone in its mount namespace. It builds the node's root and enters it
//! with `pivot_root`, says `ready` on stdout, then stays as pid 1: it reaps
//! the orphans the node's programs leave (daemons started by a taskserv
//! reparent to it) and never exits until it is killed.
//!
//! The root (`<node dir>/root`) is an overlay: the host's root filesystem
//! as the read-only lower layer, copy-on-write, with the node's own upper
//! and work dirs (`<node dir>/upper`, `<node dir>/work`). In it: a `/proc`
//! of the node's PID namespace (its `sys` and `sysrq-trigger` read-only),
//! `/sys` read-only, fresh size-bounded tmpfs `/tmp` and `/run`, a minimal
//! `/dev` (never the host's: a process of the node could write its disks),
//! the node's own `/etc/hosts` and `/etc/hostname`. What the service keeps
//! (its data dir, which holds the node dirs too; its config's dir) is
//! covered with an empty read-only tmpfs, the host's secrets
//! ([`SECRET_DIRS`], [`SECRET_FILES`], ssh host keys) with an empty tmpfs or
//! removed from the node's view; what node programs run that the root
//! would not show (the scripts dir, an interpreter on another filesystem)
//! is bind-mounted read-only at the same path. All these mounts live in
//! the node's mount namespace only: they go when the node goes, and the
//! host's mount table never shows them.
//!
//! Everything that resolves a path in the node happens after `pivot_root`,
//! so a symbolic link of the host's root (`/home -> /var/home`) resolves
//! inside the node, never on the host; the host's root stays reachable at
//! [`OLD_ROOT`] only as the source of bind mounts, then is detached.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, chdir, pivot_root, sethostname};

/// The node's own directory, inside the node: its programs' working
/// directory, `HOME` and `ORCHESTRATOR_DATA_DIR` (the host's paths of the
/// service are masked). Made by the init, in the node's upper layer; the
/// init's own working directory.
pub const NODE_HOME: &str = "/var/lib/orchestrator-node";

/// Where the host's root sits while the node's root is built: the source
/// of bind mounts, detached before the node is ready.
pub const OLD_ROOT: &str = "/.orchestrator-host";

/// The line the init prints on stdout once the node is built.
pub const READY: &str = "ready";

/// The host's directories of secrets a node never sees: each is covered
/// with an empty, writable tmpfs of the node's (so a package that writes a
/// home still works, into nothing the host keeps).
pub const SECRET_DIRS: &[&str] = &[
    "/root",
    "/home",
    "/etc/ssl/private",
    // Copies of passwd, shadow and group files.
    "/var/backups",
    "/var/lib/sss",
];

/// The host's files of secrets a node never sees: removed from its view (a
/// whiteout in its upper layer), so a package may write its own.
/// `/etc/shadow` and `/etc/gshadow` are rewritten instead (every password
/// locked): `useradd` needs them to exist, and an empty one would lose the
/// users the node sees in `/etc/passwd`.
pub const SECRET_FILES: &[&str] = &["/etc/shadow-", "/etc/gshadow-", "/etc/ssh/ssh_host_*_key"];

/// The password files rewritten with every password locked.
const PASSWORD_FILES: &[&str] = &["/etc/shadow", "/etc/gshadow"];

/// Sizes of the node's tmpfs mounts (memory is the host's: bounded).
const TMP_SIZE: &str = "size=256m";
const RUN_SIZE: &str = "size=64m";
const DEV_SIZE: &str = "size=1m";
const SHM_SIZE: &str = "size=64m";
const MASK_SIZE: &str = "size=16m";

/// The devices a node gets, bound from the host's: none that reaches
/// hardware or a disk.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// What a node is made of, as the provider passes it on the init's
/// command line ([`NodeSpec::to_args`]) and the `orchestrator` binary
/// parses it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// The node's dir on the host: `hosts` (its /etc/hosts), and the
    /// layers `upper`, `work`, `root`.
    pub node_dir: PathBuf,
    pub hostname: String,
    /// The service's paths a node must not see (its data dir, its config
    /// file's dir): covered with an empty read-only tmpfs.
    pub hidden: Vec<PathBuf>,
    /// Host paths node programs run (the scripts dir, interpreters'
    /// dirs): bound read-only at the same path where the root would not
    /// show them (another filesystem, or under a mask).
    pub exposed: Vec<PathBuf>,
}

impl NodeSpec {
    /// The arguments of `testenv-node-init` that carry this spec.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![
            "--node-dir".into(),
            self.node_dir.clone().into(),
            "--hostname".into(),
            self.hostname.clone().into(),
        ];
        for (flag, paths) in [("--hide", &self.hidden), ("--expose", &self.exposed)] {
            for path in paths {
                args.push(flag.into());
                args.push(path.clone().into());
            }
        }
        args
    }

    fn upper(&self) -> PathBuf {
        self.node_dir.join("upper")
    }

    fn work(&self) -> PathBuf {
        self.node_dir.join("work")
    }

    fn root(&self) -> PathBuf {
        self.node_dir.join("root")
    }

    /// The options of the overlay mount; refused for a node dir whose
    /// path the option syntax cannot carry.
    fn overlay_options(&self) -> Result<String, String> {
        let (upper, work) = (self.upper(), self.work());
        for path in [&upper, &work] {
            let text = path
                .to_str()
                .ok_or_else(|| format!("{}: not UTF-8", path.display()))?;
            if text.contains([',', ':', '\\']) {
                return Err(format!(
                    "{text}: an overlay layer's path cannot hold ',', ':' or '\\'"
                ));
            }
        }
        Ok(format!(
            "lowerdir=/,upperdir={},workdir={}",
            upper.display(),
            work.display()
        ))
    }
}

/// A path masked in the node, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mask {
    pub path: PathBuf,
    /// The service's own paths are read-only in the node; the host's
    /// secret dirs are writable tmpfs of the node's.
    pub read_only: bool,
}

/// The directories masked in a node: the host's secret dirs, then the
/// service's paths; parents before children.
pub fn masks(hidden: &[PathBuf]) -> Vec<Mask> {
    let mut masks: Vec<Mask> = SECRET_DIRS
        .iter()
        .map(|dir| Mask {
            path: PathBuf::from(dir),
            read_only: false,
        })
        .chain(hidden.iter().map(|path| Mask {
            path: path.clone(),
            read_only: true,
        }))
        .collect();
    masks.sort_by(|a, b| a.path.cmp(&b.path));
    masks.dedup_by(|a, b| a.path == b.path);
    masks
}

/// Whether an exposed host path must be bound into the node: when the
/// node's root would not show it (it is on another filesystem than the
/// host's `/`), or something of the node's covers it (a mask, or one of
/// the node's own mounts). Never a masked path itself (`/root`, the data
/// dir): what is masked inside a bound dir is masked again.
pub fn needs_bind(path: &Path, on_root_filesystem: bool, masks: &[Mask]) -> bool {
    const OWN_MOUNTS: &[&str] = &["/proc", "/sys", "/dev", "/tmp", "/run"];
    if masks.iter().any(|m| m.path == path) {
        return false;
    }
    !on_root_filesystem
        || masks.iter().any(|m| path.starts_with(&m.path))
        || OWN_MOUNTS.iter().any(|m| path.starts_with(m))
}

/// `/etc/shadow` (or `/etc/gshadow`) with every password locked: the
/// second field of each entry becomes `*`.
pub fn locked_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut fields: Vec<&str> = line.split(':').collect();
        if fields.len() > 1 {
            fields[1] = "*";
        }
        out.push_str(&fields.join(":"));
        out.push('\n');
    }
    out
}

/// The init: builds the node, says [`READY`], reaps forever. Exits only on
/// a failure to build, with the reason on stderr.
pub fn run(spec: &NodeSpec) -> ExitCode {
    if let Err(e) = build(spec) {
        eprintln!("testenv-node-init: {e}");
        return ExitCode::FAILURE;
    }
    let mut stdout = std::io::stdout();
    if writeln!(stdout, "{READY}")
        .and_then(|()| stdout.flush())
        .is_err()
    {
        return ExitCode::FAILURE;
    }
    reap_forever()
}

fn nix_err(what: impl std::fmt::Display) -> impl FnOnce(nix::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn io_err(what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> String {
    move |e| format!("{what}: {e}")
}

fn mount_fs(fstype: &str, target: &str, flags: MsFlags, options: &str) -> Result<(), String> {
    mount(Some(fstype), target, Some(fstype), flags, Some(options))
        .map_err(nix_err(format!("cannot mount {fstype} on {target}")))
}

/// Binds `source` on `target`, then, with `flags`, makes the bind
/// `nosuid`, `nodev` and those flags (`MS_RDONLY`: read-only).
fn bind(source: &Path, target: &Path, flags: Option<MsFlags>) -> Result<(), String> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(nix_err(format!(
        "cannot bind {} on {}",
        source.display(),
        target.display()
    )))?;
    match flags {
        Some(flags) => remount(target, MsFlags::MS_NOSUID | MsFlags::MS_NODEV | flags),
        None => Ok(()),
    }
}

/// Sets the flags of the mount on `target` (`MS_RDONLY`: read-only).
fn remount(target: &Path, flags: MsFlags) -> Result<(), String> {
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags,
        None::<&str>,
    )
    .map_err(nix_err(format!(
        "cannot remount {} ({flags:?})",
        target.display()
    )))
}

const READ_ONLY: Option<MsFlags> = Some(MsFlags::MS_RDONLY);

/// A mount point for a bind of `source`: a dir, or an empty file.
fn mount_point(target: &Path, source_is_dir: bool) -> Result<(), String> {
    if source_is_dir {
        std::fs::create_dir_all(target).map_err(io_err(target.display()))
    } else {
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(io_err(parent.display()))?;
        }
        if !target.exists() {
            std::fs::write(target, b"").map_err(io_err(target.display()))?;
        }
        Ok(())
    }
}

/// The host's `path`, seen from the node's root before [`OLD_ROOT`] goes.
fn on_host(path: &Path) -> PathBuf {
    Path::new(OLD_ROOT).join(path.strip_prefix("/").unwrap_or(path))
}

fn build(spec: &NodeSpec) -> Result<(), String> {
    // Pid 1 of a fresh PID namespace, alone in its mount namespace: never
    // pivot the root of anything else.
    if std::process::id() != 1 {
        return Err(
            "must be the first process of a new PID and mount namespace (started under \
             `unshare --mount --pid --fork`)"
                .to_owned(),
        );
    }
    // Nothing done here propagates to the host (nor back).
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(nix_err("cannot make / private"))?;
    let options = spec.overlay_options()?;
    let root = spec.root();
    for dir in [spec.upper(), spec.work(), root.clone()] {
        std::fs::create_dir_all(&dir).map_err(io_err(dir.display()))?;
    }
    // The lower layer is the host's root filesystem only (not what is
    // mounted below it): read-only, every change copied up.
    mount(
        Some("overlay"),
        &root,
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(nix_err(format!(
        "cannot mount the node's root on {} ({options})",
        root.display()
    )))?;
    let on_root_filesystem = {
        let root_dev = std::fs::metadata("/").map_err(io_err("/"))?.dev();
        move |path: &Path| {
            std::fs::metadata(path)
                .map(|m| m.dev() == root_dev)
                .unwrap_or(false)
        }
    };
    let exposed: Vec<(PathBuf, bool)> = spec
        .exposed
        .iter()
        .map(|path| (path.clone(), on_root_filesystem(path)))
        .collect();
    let hosts = std::fs::read(spec.node_dir.join("hosts"))
        .map_err(io_err(spec.node_dir.join("hosts").display()))?;

    let old_root = root.join(OLD_ROOT.trim_start_matches('/'));
    std::fs::create_dir_all(&old_root).map_err(io_err(old_root.display()))?;
    chdir(&root).map_err(nix_err(root.display()))?;
    pivot_root(".", &old_root).map_err(nix_err("cannot pivot_root into the node's root"))?;
    chdir("/").map_err(nix_err("/"))?;

    own_mounts()?;
    let masks = masks(&spec.hidden);
    // The dirs a tmpfs now covers (a mask of what the node does not have,
    // under its own /tmp say, covers nothing).
    let mut covered = Vec::new();
    for mask in &masks {
        if apply_mask(mask)? {
            covered.push(mask.path.clone());
        }
    }
    let mut bound = Vec::new();
    for (path, on_root) in &exposed {
        if needs_bind(path, *on_root, &masks) {
            let source = on_host(path);
            mount_point(path, source.is_dir())?;
            bind(&source, path, READ_ONLY)?;
            bound.push(path.clone());
        }
    }
    // A bound dir never uncovers what is masked below it.
    for mask in &masks {
        if bound
            .iter()
            .any(|b| mask.path.starts_with(b) && mask.path != *b)
        {
            apply_mask(mask)?;
        }
    }
    for mask in masks.iter().filter(|m| m.read_only) {
        if covered.contains(&mask.path) {
            remount(
                &mask.path,
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            )?;
        }
    }
    umount2(OLD_ROOT, MntFlags::MNT_DETACH).map_err(nix_err("cannot detach the host's root"))?;
    std::fs::remove_dir(OLD_ROOT).map_err(io_err(OLD_ROOT))?;

    node_files(&spec.hostname, &hosts)?;
    sethostname(&spec.hostname).map_err(nix_err("cannot set the host name"))?;
    std::fs::create_dir_all(NODE_HOME).map_err(io_err(NODE_HOME))?;
    // Traversable, as `/var/lib` is: a daemon a start script runs as its
    // own user (postgres) reaches its data dir below it, and nothing
    // outside the node can see it anyway.
    std::fs::set_permissions(NODE_HOME, std::fs::Permissions::from_mode(0o755))
        .map_err(io_err(NODE_HOME))?;
    // Where programs that enter the node start (`nsenter --wd` takes the
    // init's working directory: a path given to it would be opened on the
    // host).
    chdir(NODE_HOME).map_err(nix_err(NODE_HOME))?;
    Ok(())
}

/// The node's `/proc`, `/sys`, `/dev`, `/tmp` and `/run`.
fn own_mounts() -> Result<(), String> {
    let hard = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    for dir in ["/proc", "/sys", "/dev", "/tmp", "/run"] {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    // Of the node's PID namespace, which this process is pid 1 of.
    mount_fs("proc", "/proc", hard, "")?;
    for path in ["/proc/sys", "/proc/sysrq-trigger"] {
        // A kernel built without magic SysRq has no trigger.
        if !Path::new(path).exists() {
            continue;
        }
        bind(
            Path::new(path),
            Path::new(path),
            Some(MsFlags::MS_RDONLY | hard),
        )?;
    }
    // Of the node's network namespace; read-only.
    mount_fs("sysfs", "/sys", hard | MsFlags::MS_RDONLY, "")?;
    mount_fs(
        "tmpfs",
        "/dev",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        &format!("mode=755,{DEV_SIZE}"),
    )?;
    for device in DEVICES {
        let target = Path::new("/dev").join(device);
        mount_point(&target, false)?;
        // As the host's devices are: a device node needs `dev`.
        bind(&on_host(&target), &target, None)?;
    }
    for dir in ["/dev/shm", "/dev/pts"] {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    mount_fs("tmpfs", "/dev/shm", hard, &format!("mode=1777,{SHM_SIZE}"))?;
    mount_fs(
        "devpts",
        "/dev/pts",
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        "newinstance,ptmxmode=0666,mode=620",
    )?;
    for (link, target) in [
        ("/dev/ptmx", "pts/ptmx"),
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, link).map_err(io_err(link))?;
    }
    // Executable, as a host's /tmp is: installers run what they unpack there.
    mount_fs(
        "tmpfs",
        "/tmp",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=1777,{TMP_SIZE}"),
    )?;
    mount_fs(
        "tmpfs",
        "/run",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode=755,{RUN_SIZE}"),
    )?;
    Ok(())
}

/// Covers a directory of the node with an empty tmpfs (of its mode), if
/// the node has it; whether it did.
fn apply_mask(mask: &Mask) -> Result<bool, String> {
    let Ok(metadata) = std::fs::metadata(&mask.path) else {
        return Ok(false);
    };
    if !metadata.is_dir() {
        // A hidden file of the service's: out of the node's view.
        std::fs::remove_file(&mask.path).map_err(io_err(mask.path.display()))?;
        return Ok(false);
    }
    let mode = metadata.permissions().mode() & 0o7777;
    let target = mask.path.to_string_lossy();
    mount_fs(
        "tmpfs",
        &target,
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("mode={mode:o},{MASK_SIZE}"),
    )?;
    Ok(true)
}

/// Files of the node's own, written in its upper layer: /etc/hosts,
/// /etc/hostname, the password files locked, the secret files removed.
fn node_files(hostname: &str, hosts: &[u8]) -> Result<(), String> {
    // Removed first: a symbolic link in the lower layer is replaced, never
    // followed.
    let replace = |path: &str, content: &[u8]| -> Result<(), String> {
        let _ = std::fs::remove_file(path);
        std::fs::write(path, content).map_err(io_err(path))
    };
    replace("/etc/hosts", hosts)?;
    replace("/etc/hostname", format!("{hostname}\n").as_bytes())?;
    for path in PASSWORD_FILES {
        if let Ok(text) = std::fs::read_to_string(path) {
            let metadata = std::fs::metadata(path).map_err(io_err(path))?;
            replace(path, locked_passwords(&text).as_bytes())?;
            std::os::unix::fs::chown(path, Some(metadata.uid()), Some(metadata.gid()))
                .and_then(|()| std::fs::set_permissions(path, metadata.permissions()))
                .map_err(io_err(path))?;
        }
    }
    for pattern in SECRET_FILES {
        for path in expand(pattern) {
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(format!("{}: {e}", path.display()));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// The files a pattern of [`SECRET_FILES`] names: a path, or a path whose
/// last component holds one `*`.
fn expand(pattern: &str) -> Vec<PathBuf> {
    let path = Path::new(pattern);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return vec![];
    };
    let Some((prefix, suffix)) = name.split_once('*') else {
        return vec![path.to_path_buf()];
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return vec![];
    };
    entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.len() >= prefix.len() + suffix.len()
                && name.starts_with(prefix)
                && name.ends_with(suffix)
        })
        .map(|e| e.path())
        .collect()
}

/// Pid 1's other job: every orphan of the node becomes its child; each
/// one that ends is reaped, so none stays a zombie. Never returns.
fn reap_forever() -> ExitCode {
    let mut children = SigSet::empty();
    children.add(Signal::SIGCHLD);
    // Blocked, so that an end between the last reap and the wait is kept
    // pending rather than lost.
    let _ = children.thread_block();
    loop {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = children.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> NodeSpec {
        NodeSpec {
            node_dir: "/var/lib/orchestrator/testenv/ab12-cd34ef/n1".into(),
            hostname: "n1".into(),
            hidden: vec!["/var/lib/orchestrator".into(), "/etc/orchestrator".into()],
            exposed: vec!["/usr/share/orchestrator/scripts".into()],
        }
    }

    #[test]
    fn the_spec_is_carried_as_flags_in_order() {
        let args: Vec<String> = spec()
            .to_args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args,
            [
                "--node-dir",
                "/var/lib/orchestrator/testenv/ab12-cd34ef/n1",
                "--hostname",
                "n1",
                "--hide",
                "/var/lib/orchestrator",
                "--hide",
                "/etc/orchestrator",
                "--expose",
                "/usr/share/orchestrator/scripts",
            ]
        );
    }

    #[test]
    fn the_overlay_is_the_hosts_root_under_the_nodes_layers() {
        assert_eq!(
            spec().overlay_options().unwrap(),
            "lowerdir=/,upperdir=/var/lib/orchestrator/testenv/ab12-cd34ef/n1/upper,\
             workdir=/var/lib/orchestrator/testenv/ab12-cd34ef/n1/work"
        );
        let mut odd = spec();
        odd.node_dir = "/srv/a,b/n1".into();
        assert_eq!(
            odd.overlay_options().unwrap_err(),
            "/srv/a,b/n1/upper: an overlay layer's path cannot hold ',', ':' or '\\'"
        );
    }

    #[test]
    fn masks_cover_the_hosts_secrets_and_the_services_paths_read_only() {
        let masks = masks(&spec().hidden);
        let shown: Vec<(&str, bool)> = masks
            .iter()
            .map(|m| (m.path.to_str().unwrap(), m.read_only))
            .collect();
        assert_eq!(
            shown,
            [
                ("/etc/orchestrator", true),
                ("/etc/ssl/private", false),
                ("/home", false),
                ("/root", false),
                ("/var/backups", false),
                ("/var/lib/orchestrator", true),
                ("/var/lib/sss", false),
            ]
        );
    }

    #[test]
    fn only_what_the_root_would_not_show_is_bound() {
        let masks = masks(&spec().hidden);
        let check = |path: &str, on_root: bool| needs_bind(Path::new(path), on_root, &masks);
        assert!(!check("/usr/share/orchestrator/scripts", true));
        assert!(!check("/usr/bin", true));
        assert!(check("/opt/tools/bin", false));
        assert!(check("/home/dev/.cargo/bin", true));
        assert!(check("/root/scripts", true));
        assert!(check("/root/.pyenv", true));
        assert!(!check("/root", true));
        assert!(!check("/var/lib/orchestrator", false));
        assert!(check("/var/lib/orchestrator/scripts", true));
        assert!(check("/tmp/scripts", true));
        assert!(check("/run/current-system/sw/bin", true));
        // A prefix of a name is not a parent.
        assert!(!check("/rootless/bin", true));
    }

    #[test]
    fn passwords_are_locked_and_everything_else_kept() {
        assert_eq!(
            locked_passwords("root:$y$j9T$abc:19000:0:99999:7:::\npostgres:!:19000::::::\n\nodd\n"),
            "root:*:19000:0:99999:7:::\npostgres:*:19000::::::\n\nodd\n"
        );
        assert_eq!(locked_passwords("sudo:x::alice\n"), "sudo:*::alice\n");
    }
}
