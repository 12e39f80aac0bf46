//! A node's limits, enforced by the kernel through cgroups: memory (swap
//! included, so that a hog cannot escape to swap), pids (a fork bomb gets
//! `EAGAIN`), and a CPU quota. Either hierarchy works, detected at start:
//! cgroup v2 where its mount provides `memory`, `pids` and `cpu`, else
//! cgroup v1 where each of them is mounted. A node's cgroup is
//! `<mount>/orchestrator-testenv/<netns name>` (once per v1 controller),
//! under a parent of the service's own rather than under the cgroup the
//! service runs in: the names carry the service's tag and the
//! environment's key (`EnvNames`), so a restarted service finds what an
//! earlier life left, wherever it now runs. Everything is plain file
//! writes under `/sys/fs/cgroup`; nothing here runs a program.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::model::NodeLimits;

/// The directory under each hierarchy that holds every node's cgroup.
pub const PARENT: &str = "orchestrator-testenv";
/// The controllers a node's limits need.
pub const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];
/// The CPU quota's period, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// How long removal keeps trying while the kernel still counts a killed
/// process in the cgroup (`EBUSY`).
const REMOVE_WAIT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(20);

/// Where the nodes' cgroups live on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// cgroup v2: one directory per node, under the unified mount.
    V2 { mount: PathBuf },
    /// cgroup v1: one directory per node in each controller's mount.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
    },
}

/// How often a node's limits stopped something; counters only grow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitEvents {
    /// Processes the kernel killed because the node was out of memory.
    pub oom_kills: u64,
    /// Forks refused because the node was at its pids limit.
    pub pids_max: u64,
}

impl LimitEvents {
    /// What happened after `before` was read.
    pub fn since(self, before: LimitEvents) -> LimitEvents {
        LimitEvents {
            oom_kills: self.oom_kills.saturating_sub(before.oom_kills),
            pids_max: self.pids_max.saturating_sub(before.pids_max),
        }
    }

    /// Why `node` failed, in words, if a limit stopped anything.
    pub fn describe(self, node: &str, limits: &NodeLimits) -> Option<String> {
        let mut reasons = Vec::new();
        if self.oom_kills > 0 {
            reasons.push(format!(
                "node {node} hit its memory limit ({} MiB): the kernel killed {} process{}",
                limits.memory_mib,
                self.oom_kills,
                if self.oom_kills == 1 { "" } else { "es" }
            ));
        }
        if self.pids_max > 0 {
            reasons.push(format!(
                "node {node} hit its pids limit ({}): the kernel refused {} fork{}",
                limits.pids,
                self.pids_max,
                if self.pids_max == 1 { "" } else { "s" }
            ));
        }
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }
}

impl Hierarchy {
    /// The hierarchy of this host, read from `/proc/self/mountinfo`, or
    /// why none provides memory, pids and cpu.
    pub fn detect() -> Result<Hierarchy, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        detect_in(&mountinfo, |mount| {
            std::fs::read_to_string(mount.join("cgroup.controllers")).ok()
        })
    }

    /// `cgroup v1` or `cgroup v2`, for messages and the API.
    pub fn version(&self) -> &'static str {
        match self {
            Hierarchy::V2 { .. } => "cgroup v2",
            Hierarchy::V1 { .. } => "cgroup v1",
        }
    }

    /// The parent directories of the nodes' cgroups (one per v1 controller).
    fn parents(&self) -> Vec<PathBuf> {
        match self {
            Hierarchy::V2 { mount } => vec![mount.join(PARENT)],
            Hierarchy::V1 { memory, pids, cpu } => {
                vec![memory.join(PARENT), pids.join(PARENT), cpu.join(PARENT)]
            }
        }
    }

    /// The directories of the cgroup `name` (one per v1 controller).
    pub fn dirs(&self, name: &str) -> Vec<PathBuf> {
        self.parents().into_iter().map(|p| p.join(name)).collect()
    }

    /// The `cgroup.procs` files a process writes its pid to, to join the
    /// cgroup `name`.
    pub fn procs_files(&self, name: &str) -> Vec<PathBuf> {
        self.dirs(name)
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// Makes the cgroup `name` with `limits` (again, if an earlier attempt
    /// left it: its limits are written anew).
    pub fn create(&self, name: &str, limits: &NodeLimits) -> Result<(), String> {
        self.prepare()?;
        for dir in self.dirs(name) {
            mkdir(&dir)?;
        }
        for (file, value) in self.settings(name, limits) {
            write(&file, &value)?;
        }
        Ok(())
    }

    /// The parent directories, and in v2 the controllers enabled for
    /// their children (the root's `cgroup.subtree_control` first: the
    /// root may hold processes, a parent of ours never does).
    fn prepare(&self) -> Result<(), String> {
        for parent in self.parents() {
            mkdir(&parent)?;
        }
        if let Hierarchy::V2 { mount } = self {
            let enable = CONTROLLERS.map(|c| format!("+{c}")).join(" ");
            for dir in [mount.clone(), mount.join(PARENT)] {
                let file = dir.join("cgroup.subtree_control");
                let enabled = std::fs::read_to_string(&file).unwrap_or_default();
                if !has_all(&enabled) {
                    write(&file, &enable)?;
                }
            }
        }
        Ok(())
    }

    /// The files and values that set `limits` on the cgroup `name`, in
    /// the order they must be written (v1: the memory limit before the
    /// memory+swap limit, which may not be below it).
    pub fn settings(&self, name: &str, limits: &NodeLimits) -> Vec<(PathBuf, String)> {
        let memory = limits.memory_bytes().to_string();
        let quota = limits.cpu_quota_us(CPU_PERIOD_US);
        let mut settings = Vec::new();
        match self {
            Hierarchy::V2 { mount } => {
                let dir = mount.join(PARENT).join(name);
                settings.push((dir.join("memory.max"), memory));
                // Without swap accounting the file is absent, and then
                // the node cannot swap beyond what memory.max allows.
                if dir.join("memory.swap.max").exists() {
                    settings.push((dir.join("memory.swap.max"), "0".to_owned()));
                }
                settings.push((dir.join("pids.max"), limits.pids.to_string()));
                settings.push((dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}")));
            }
            Hierarchy::V1 {
                memory: m,
                pids,
                cpu,
            } => {
                let dir = m.join(PARENT).join(name);
                settings.push((dir.join("memory.limit_in_bytes"), memory.clone()));
                if dir.join("memory.memsw.limit_in_bytes").exists() {
                    settings.push((dir.join("memory.memsw.limit_in_bytes"), memory));
                } else {
                    // No swap accounting: keep the node from swapping at all.
                    settings.push((dir.join("memory.swappiness"), "0".to_owned()));
                }
                settings.push((
                    pids.join(PARENT).join(name).join("pids.max"),
                    limits.pids.to_string(),
                ));
                let cpu = cpu.join(PARENT).join(name);
                settings.push((cpu.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string()));
                settings.push((cpu.join("cpu.cfs_quota_us"), quota.to_string()));
            }
        }
        settings
    }

    /// Moves `pid` into the cgroup `name` (its later children are born
    /// there; those it has already are not moved).
    pub fn join(&self, name: &str, pid: i32) -> Result<(), String> {
        for file in self.procs_files(name) {
            write(&file, &pid.to_string())?;
        }
        Ok(())
    }

    /// What the cgroup `name`'s limits have stopped so far (zero for a
    /// cgroup that does not exist).
    pub fn events(&self, name: &str) -> LimitEvents {
        let read = |path: PathBuf| std::fs::read_to_string(path).unwrap_or_default();
        let (memory, pids) = match self {
            Hierarchy::V2 { mount } => {
                let dir = mount.join(PARENT).join(name);
                (
                    read(dir.join("memory.events")),
                    read(dir.join("pids.events")),
                )
            }
            Hierarchy::V1 { memory, pids, .. } => (
                read(memory.join(PARENT).join(name).join("memory.oom_control")),
                read(pids.join(PARENT).join(name).join("pids.events")),
            ),
        };
        LimitEvents {
            oom_kills: counter(&memory, "oom_kill"),
            pids_max: counter(&pids, "max"),
        }
    }

    /// The names of the nodes' cgroups that exist, in any hierarchy.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .parents()
            .iter()
            .filter_map(|parent| std::fs::read_dir(parent).ok())
            .flat_map(|entries| entries.flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Kills what is left in the cgroup `name` and removes it; whether
    /// there was anything to remove.
    pub async fn remove(&self, name: &str) -> Result<bool, String> {
        let dirs: Vec<PathBuf> = self.dirs(name).into_iter().filter(|d| d.exists()).collect();
        if dirs.is_empty() {
            return Ok(false);
        }
        let started = tokio::time::Instant::now();
        for dir in &dirs {
            // v2's `cgroup.kill` kills the whole subtree at once, forks in
            // flight included; elsewhere each pid, until none is left.
            let kill_file = dir.join("cgroup.kill");
            if kill_file.exists() {
                let _ = std::fs::write(&kill_file, "1");
            }
            loop {
                let pids = procs(dir);
                if pids.is_empty() {
                    break;
                }
                for pid in pids {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
                if started.elapsed() > REMOVE_WAIT {
                    return Err(format!(
                        "processes of {} are still there after SIGKILL",
                        dir.display()
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
            // An exited process may be counted a moment longer: `EBUSY`.
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if started.elapsed() > REMOVE_WAIT => {
                        return Err(format!("cannot remove {}: {e}", dir.display()));
                    }
                    Err(_) => tokio::time::sleep(POLL).await,
                }
            }
        }
        Ok(true)
    }
}

/// Every cgroup file system (v1 and v2) that process `pid` sees mounted:
/// a node must see them read-only, if at all, since a process running as
/// root can move itself to another cgroup by writing its pid to a
/// `cgroup.procs` it may write, no capability needed.
pub fn mount_points(pid: i32) -> Vec<PathBuf> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map(|text| mount_points_in(&text))
        .unwrap_or_default()
}

/// [`mount_points`], from the text of a `/proc/self/mountinfo`.
pub fn mount_points_in(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fstype = after.split(' ').next()?;
            let mount = before.split(' ').nth(4)?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(unescape(mount)))
        })
        .collect()
}

/// [`Hierarchy::detect`], from the text of a `/proc/self/mountinfo` and
/// a reader of a v2 mount's `cgroup.controllers`.
pub fn detect_in(
    mountinfo: &str,
    v2_controllers: impl Fn(&Path) -> Option<String>,
) -> Result<Hierarchy, String> {
    let mut v2_found = Vec::new();
    let mut v1: Vec<(String, PathBuf)> = Vec::new();
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let Some(mount) = before.split(' ').nth(4) else {
            continue;
        };
        let mount = PathBuf::from(unescape(mount));
        let mut after = after.split(' ');
        let fstype = after.next().unwrap_or_default();
        let options = after.nth(1).unwrap_or_default();
        match fstype {
            "cgroup2" => {
                let controllers = v2_controllers(&mount).unwrap_or_default();
                if has_all(&controllers) {
                    return Ok(Hierarchy::V2 { mount });
                }
                v2_found.push(format!(
                    "v2 at {} has {}",
                    mount.display(),
                    if controllers.trim().is_empty() {
                        "no controller".to_owned()
                    } else {
                        controllers
                            .split_whitespace()
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ));
            }
            "cgroup" => {
                for option in options.split(',') {
                    if CONTROLLERS.contains(&option) && !v1.iter().any(|(c, _)| c == option) {
                        v1.push((option.to_owned(), mount.clone()));
                    }
                }
            }
            _ => {}
        }
    }
    let v1_mount = |controller: &str| {
        v1.iter()
            .find(|(c, _)| c == controller)
            .map(|(_, mount)| mount.clone())
    };
    if let (Some(memory), Some(pids), Some(cpu)) =
        (v1_mount("memory"), v1_mount("pids"), v1_mount("cpu"))
    {
        return Ok(Hierarchy::V1 { memory, pids, cpu });
    }
    let v1_missing: Vec<&str> = CONTROLLERS
        .into_iter()
        .filter(|c| v1_mount(c).is_none())
        .collect();
    let mut found = v2_found;
    found.push(format!("v1 lacks {}", v1_missing.join(", ")));
    Err(format!(
        "no cgroup hierarchy on this host provides memory, pids and cpu ({}): node limits \
         cannot be enforced, so no environment is made",
        found.join("; ")
    ))
}

/// Whether a list of controllers (spaces between) holds memory, pids and cpu.
fn has_all(controllers: &str) -> bool {
    let present: Vec<&str> = controllers.split_whitespace().collect();
    CONTROLLERS.iter().all(|c| present.contains(c))
}

/// The value of `key` in a flat-keyed file (`memory.events`, `pids.events`,
/// v1's `memory.oom_control`): `<key> <count>` per line.
pub fn counter(text: &str, key: &str) -> u64 {
    text.lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(0)
}

/// `mountinfo` escapes spaces, tabs, newlines and backslashes as octal.
fn unescape(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut rest = field;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let code = rest.get(at + 1..at + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[at + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|pid| pid.parse().ok())
        .collect()
}

fn mkdir(dir: &Path) -> Result<(), String> {
    match std::fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("cannot make the cgroup {}: {e}", dir.display())),
    }
}

fn write(file: &Path, value: &str) -> Result<(), String> {
    std::fs::write(file, value)
        .map_err(|e| format!("cannot write {value:?} to {}: {e}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const THIS_HOST: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const MODERN_HOST: &str = "\
25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    fn limits() -> NodeLimits {
        NodeLimits {
            memory_mib: 256,
            pids: 64,
            cpus: 0.5,
        }
    }

    #[test]
    fn a_hybrid_host_whose_v2_mount_has_no_controller_uses_v1() {
        let found = detect_in(THIS_HOST, |_| Some("hugetlb\n".to_owned())).unwrap();
        assert_eq!(
            found,
            Hierarchy::V1 {
                memory: "/sys/fs/cgroup/memory".into(),
                pids: "/sys/fs/cgroup/pids".into(),
                cpu: "/sys/fs/cgroup/cpu".into(),
            }
        );
        assert_eq!(found.version(), "cgroup v1");
    }

    #[test]
    fn a_v2_mount_with_the_controllers_is_preferred() {
        let found = detect_in(MODERN_HOST, |mount| {
            assert_eq!(mount, Path::new("/sys/fs/cgroup"));
            Some("cpuset cpu io memory hugetlb pids rdma misc\n".to_owned())
        })
        .unwrap();
        assert_eq!(
            found,
            Hierarchy::V2 {
                mount: "/sys/fs/cgroup".into()
            }
        );
    }

    #[test]
    fn v1_controllers_mounted_together_are_found() {
        let text = "1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                    2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    3 0 0:3 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n";
        let Hierarchy::V1 { cpu, .. } = detect_in(text, |_| None).unwrap() else {
            panic!("not v1");
        };
        assert_eq!(cpu, Path::new("/sys/fs/cgroup/cpu,cpuacct"));
    }

    #[test]
    fn no_hierarchy_with_all_three_is_refused_with_what_each_lacks() {
        let text = "1 0 0:1 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n\
                    2 0 0:2 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        let err = detect_in(text, |_| Some(String::new())).unwrap_err();
        assert!(
            err.starts_with("no cgroup hierarchy on this host provides memory, pids and cpu"),
            "{err}"
        );
        assert!(
            err.contains("v2 at /sys/fs/cgroup/unified has no controller"),
            "{err}"
        );
        assert!(err.contains("v1 lacks pids, cpu"), "{err}");
        assert!(detect_in("", |_| None).is_err());
    }

    #[test]
    fn every_cgroup_mount_is_listed() {
        let mounts = mount_points_in(THIS_HOST);
        assert_eq!(mounts.len(), 6, "{mounts:?}");
        assert!(mounts.contains(&PathBuf::from("/sys/fs/cgroup/unified")));
        assert!(!mounts.contains(&PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(
            mount_points_in(MODERN_HOST),
            [PathBuf::from("/sys/fs/cgroup")]
        );
    }

    #[test]
    fn mount_points_with_spaces_are_unescaped() {
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape(r"/x\134y"), r"/x\y");
        assert_eq!(unescape(r"/plain"), "/plain");
    }

    #[test]
    fn counters_are_read_from_events_files() {
        let v2_memory = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(counter(v2_memory, "oom_kill"), 1);
        assert_eq!(counter(v2_memory, "max"), 12);
        let v1_oom = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(counter(v1_oom, "oom_kill"), 3);
        assert_eq!(counter("max 40\n", "max"), 40);
        assert_eq!(counter("", "max"), 0);
    }

    #[test]
    fn paths_and_values_per_hierarchy() {
        let v2 = Hierarchy::V2 {
            mount: "/sys/fs/cgroup".into(),
        };
        assert_eq!(
            v2.procs_files("te-abcd-123456-00"),
            [PathBuf::from(
                "/sys/fs/cgroup/orchestrator-testenv/te-abcd-123456-00/cgroup.procs"
            )]
        );
        let settings: Vec<(String, String)> = v2
            .settings("n", &limits())
            .into_iter()
            .map(|(f, v)| (f.display().to_string(), v))
            .collect();
        let dir = "/sys/fs/cgroup/orchestrator-testenv/n";
        assert_eq!(
            settings,
            [
                (format!("{dir}/memory.max"), "268435456".to_owned()),
                (format!("{dir}/pids.max"), "64".to_owned()),
                (format!("{dir}/cpu.max"), "50000 100000".to_owned()),
            ]
        );

        let v1 = Hierarchy::V1 {
            memory: "/m".into(),
            pids: "/p".into(),
            cpu: "/c".into(),
        };
        assert_eq!(v1.procs_files("n").len(), 3);
        let settings: Vec<(String, String)> = v1
            .settings("n", &limits())
            .into_iter()
            .map(|(f, v)| (f.display().to_string(), v))
            .collect();
        assert_eq!(
            settings,
            [
                (
                    "/m/orchestrator-testenv/n/memory.limit_in_bytes".to_owned(),
                    "268435456".to_owned()
                ),
                (
                    "/m/orchestrator-testenv/n/memory.swappiness".to_owned(),
                    "0".to_owned()
                ),
                (
                    "/p/orchestrator-testenv/n/pids.max".to_owned(),
                    "64".to_owned()
                ),
                (
                    "/c/orchestrator-testenv/n/cpu.cfs_period_us".to_owned(),
                    "100000".to_owned()
                ),
                (
                    "/c/orchestrator-testenv/n/cpu.cfs_quota_us".to_owned(),
                    "50000".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn events_say_which_limit_stopped_what() {
        let before = LimitEvents {
            oom_kills: 1,
            pids_max: 5,
        };
        let now = LimitEvents {
            oom_kills: 2,
            pids_max: 5,
        };
        let hit = now.since(before);
        assert_eq!(
            hit.describe("hog", &limits()).unwrap(),
            "node hog hit its memory limit (256 MiB): the kernel killed 1 process"
        );
        let bomb = LimitEvents {
            oom_kills: 0,
            pids_max: 7,
        };
        assert_eq!(
            bomb.describe("bomb", &limits()).unwrap(),
            "node bomb hit its pids limit (64): the kernel refused 7 forks"
        );
        assert_eq!(now.since(now).describe("x", &limits()), None);
    }
}
