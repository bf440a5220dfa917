//! cgroups: which cgroup a daemon is limited to (a directory of the v2 hierarchy or of a v1
//! controller's, a Slurm job's, a container's), as the kernel identifies it, and whether a
//! process is in it; which Slurm job's cgroup (v1 or v2) holds a process.

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

/// Why a cgroup could not be identified.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// No cgroup v2 mount.
    #[error("no cgroup v2 hierarchy is mounted")]
    NoHierarchy,
    /// The path could not be resolved or read.
    #[error("{}", path.display())]
    Io {
        /// The path asked for.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The path is in no cgroup hierarchy.
    #[error("{} is not in a cgroup hierarchy (the v2 one or a v1 controller's: {})", path.display(), mounts.join(", "))]
    Outside {
        /// The path asked for, resolved.
        path: PathBuf,
        /// The hierarchies' mount points.
        mounts: Vec<String>,
    },
    /// The path is in a named v1 hierarchy, which no controller's state leads to.
    #[error("{} is in {}, a cgroup v1 hierarchy of no controller (as systemd's name=systemd): give a directory of the v2 hierarchy or of a controller's (freezer, cpu, memory...)", path.display(), mount.display())]
    NoController {
        /// The path asked for, resolved.
        path: PathBuf,
        /// The hierarchy's mount point.
        mount: PathBuf,
    },
    /// The path is a file.
    #[error("{} is not a cgroup directory", .0.display())]
    NotADirectory(PathBuf),
    /// No cgroup of that container.
    #[error("no container {id} under {} (give its id, or the first 12 or more hex digits of it, as `docker ps` or `crictl ps` shows it; its cgroup must be in the cgroup v2 hierarchy)", root.display())]
    NoContainer {
        /// The id asked for.
        id: String,
        /// The hierarchy's mount point.
        root: PathBuf,
    },
    /// More than one container's id starts so.
    #[error("{found} containers' ids start with {id}: give more of it")]
    AmbiguousContainer {
        /// The id asked for.
        id: String,
        /// How many matched.
        found: usize,
    },
    /// No cgroup of that Slurm job.
    #[error("no cgroup job_{job} of root's under {} (is the job running on this node, and Slurm's proctrack/cgroup or task/cgroup plugin in use?)", searched.join(", "))]
    NoSlurmJob {
        /// The job id.
        job: String,
        /// The hierarchies searched.
        searched: Vec<String>,
    },
}

/// A cgroup directory, as the kernel identifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRef {
    /// Its path relative to its hierarchy's root (`/` for the root), as `/proc/PID/cgroup`
    /// shows it.
    pub relative: String,
    /// Its id (the directory's inode number), as `bpf_get_current_ancestor_cgroup_id` gives
    /// (cgroup v2), or as the kernel's `kernfs_node` holds it (v1).
    pub id: u64,
    /// Its depth below the root (the root is 0).
    pub level: u32,
    /// None: a cgroup v2. Else a cgroup v1, in the hierarchy of this controller.
    pub v1_controller: Option<String>,
}

/// A mounted cgroup hierarchy.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mount<'a> {
    /// Where.
    point: &'a str,
    /// Which of its cgroups the mount shows at its top (`/` but for a subtree's mount).
    root: &'a str,
    /// cgroup v2.
    v2: bool,
    /// Its mount options: a v1 hierarchy's controllers (`freezer`, `cpu,cpuacct`,
    /// `name=systemd`) among others (`rw`, `xattr`).
    options: &'a str,
}

impl Mount<'_> {
    /// The controller that names a v1 hierarchy (the first of its mount options that
    /// `known`, the kernel's controllers, holds); None for a named one (`name=systemd`).
    fn controller(&self, known: &[String]) -> Option<&str> {
        self.options
            .split(',')
            .find(|o| known.iter().any(|k| k == o))
    }
}

/// The cgroup hierarchies mounted, as a mount table (`/proc/self/mountinfo`) lists them.
/// Mount points with escaped characters are skipped: nothing Slurm or a runtime makes.
fn mounts(mountinfo: &str) -> impl Iterator<Item = Mount<'_>> {
    mountinfo.lines().filter_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut left = left.split_whitespace().skip(3);
        let (root, point) = (left.next()?, left.next()?);
        let mut right = right.split_whitespace();
        let (fstype, options) = (right.next()?, right.nth(1).unwrap_or(""));
        let v2 = match fstype {
            "cgroup2" => true,
            "cgroup" => false,
            _ => return None,
        };
        (!point.contains('\\') && !root.contains('\\')).then_some(Mount {
            point,
            root,
            v2,
            options,
        })
    })
}

/// Where the hierarchy a `/proc/PID/cgroup` line names (`controllers` empty: cgroup v2;
/// else v1's comma-separated controllers, `name=systemd` included) is mounted, and which of
/// its cgroups the mount shows at its top.
fn hierarchy_mount<'a>(mountinfo: &'a str, controllers: &str) -> Option<(&'a str, &'a str)> {
    mounts(mountinfo)
        .find(|m| {
            if controllers.is_empty() {
                m.v2
            } else {
                !m.v2
                    && controllers
                        .split(',')
                        .all(|c| m.options.split(',').any(|o| o == c))
            }
        })
        .map(|m| (m.point, m.root))
}

/// The controllers this kernel has (`/proc/cgroups`' first column).
fn controllers() -> Vec<String> {
    fs::read_to_string("/proc/cgroups")
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The cgroup v2 mount point (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    hierarchy_mount(&mounts, "").map(|(mount_point, _)| PathBuf::from(mount_point))
}

/// The hierarchies a cgroup may be looked for in, each as its mount point and (v1) the
/// controller that names it: cgroup v2 first, then the v1 controllers' (`freezer` first:
/// Slurm's proctrack/cgroup keeps every process of a job in it). Named v1 hierarchies
/// (`name=systemd`) have no controller, and no kernel structure for a probe to find.
fn hierarchies() -> Vec<(PathBuf, Option<String>)> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let known = controllers();
    let mut found: Vec<(PathBuf, Option<String>)> = mounts(&table)
        .filter_map(|m| {
            let controller = if m.v2 {
                None
            } else {
                Some(m.controller(&known)?.to_string())
            };
            Some((PathBuf::from(m.point), controller))
        })
        .collect();
    found.sort_by_key(|(_, c)| match c.as_deref() {
        None => 0,
        Some("freezer") => 1,
        Some(_) => 2,
    });
    found.dedup_by(|a, b| a.0 == b.0);
    found
}

/// Identifies the cgroup directory `path`: in the cgroup v2 hierarchy, or in a v1
/// controller's.
pub fn cgroup_ref(path: &Path) -> Result<CgroupRef, CgroupError> {
    let table = fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Io {
        path: "/proc/self/mountinfo".into(),
        source,
    })?;
    let io = |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    };
    let path = fs::canonicalize(path).map_err(io)?;
    let known = controllers();
    // The innermost cgroup mount holding the path.
    let (mount, rest) = mounts(&table)
        .filter_map(|m| Some((m.clone(), path.strip_prefix(m.point).ok()?.to_path_buf())))
        .min_by_key(|(_, rest)| rest.components().count())
        .ok_or_else(|| CgroupError::Outside {
            path: path.clone(),
            mounts: mounts(&table).map(|m| m.point.to_string()).collect(),
        })?;
    let v1_controller = if mount.v2 {
        None
    } else {
        let controller = mount
            .controller(&known)
            .ok_or_else(|| CgroupError::NoController {
                path: path.clone(),
                mount: mount.point.into(),
            })?;
        Some(controller.to_string())
    };
    let meta = fs::metadata(&path).map_err(io)?;
    if !meta.is_dir() {
        return Err(CgroupError::NotADirectory(path));
    }
    let relative = if rest.as_os_str().is_empty() {
        PathBuf::from(mount.root)
    } else {
        Path::new(mount.root).join(&rest)
    };
    Ok(CgroupRef {
        relative: relative.display().to_string(),
        id: meta.ino(),
        level: relative
            .components()
            .filter(|c| matches!(c, std::path::Component::Normal(_)))
            .count() as u32,
        v1_controller,
    })
}

/// The cgroup of Slurm job `job`: the directory `job_<id>` Slurm made for it, in the
/// cgroup v2 hierarchy (Slurm's cgroup/v2 plugin) or a v1 controller's (cgroup/v1, as on
/// hybrid hosts), it and every directory above it root's: a user's delegated cgroup may be
/// named so too.
pub fn slurm_job_cgroup(job: &str) -> Result<PathBuf, CgroupError> {
    let want = format!("job_{job}");
    let mut searched = Vec::new();
    for (root, _) in hierarchies() {
        let root_owned = |dir: &Path| fs::symlink_metadata(dir).is_ok_and(|m| m.uid() == 0);
        if !root_owned(&root) {
            continue;
        }
        let found = find_cgroups(&root, 5, |name| name == want, root_owned);
        if let Some(dir) = found.into_iter().min() {
            return Ok(dir);
        }
        searched.push(root.display().to_string());
    }
    Err(CgroupError::NoSlurmJob {
        job: job.to_string(),
        searched,
    })
}

/// The cgroup of the container whose id is or starts with `id` (at least 12 characters, as
/// `docker ps` shows it): the directory Docker, containerd, CRI-O or Podman made for it.
pub fn container_cgroup(id: &str) -> Result<PathBuf, CgroupError> {
    let root = cgroup2_root();
    let bad = || CgroupError::NoContainer {
        id: id.to_string(),
        root: root.clone().unwrap_or_default(),
    };
    if id.len() < 12 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let id = id.to_ascii_lowercase();
    let mut found = find_cgroups(
        root.as_deref().ok_or(CgroupError::NoHierarchy)?,
        10,
        |name| crate::discover::container::container_id(name).is_some_and(|c| c.starts_with(&id)),
        |_| true,
    );
    // A container's own cgroups below its directory (`.../container` of Podman) do not
    // name it again; two directories do only for two containers sharing the prefix.
    found.sort();
    match found.len() {
        0 => Err(bad()),
        1 => Ok(found.remove(0)),
        _ => Err(CgroupError::AmbiguousContainer {
            id,
            found: found.len(),
        }),
    }
}

/// The directories below `root`, down to `max_depth`, whose names satisfy `wanted`, looked
/// for only in (and below) those that `enter` lets in.
fn find_cgroups(
    root: &Path,
    max_depth: usize,
    wanted: impl Fn(&str) -> bool,
    enter: impl Fn(&Path) -> bool,
) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![(root.to_path_buf(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) || !enter(&e.path()) {
                continue;
            }
            if wanted(&e.file_name().to_string_lossy()) {
                found.push(e.path());
            } else if depth < max_depth {
                dirs.push((e.path(), depth + 1));
            }
        }
    }
    found
}

/// The Slurm job whose cgroup holds a process, from its `/proc/PID/cgroup` text: a
/// `job_<id>` directory in any hierarchy (cgroup v2: `.../slurmstepd.scope/job_<id>/...`;
/// v1: `/slurm/uid_<uid>/job_<id>/...`), believed only where that directory and every one
/// above it belong to root. A user's delegated cgroup (systemd's `user@UID.service`) is the
/// user's own, and its user may name a directory there `job_<id>` and move into it.
pub fn slurm_job(cgroup_text: &str) -> Option<String> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    slurm_job_with(cgroup_text, &mounts, |dir| {
        fs::symlink_metadata(dir).ok().map(|m| m.uid())
    })
}

/// [`slurm_job`] over the given mount table, with `owner` telling a directory's owner
/// (None: gone, or unreadable).
fn slurm_job_with(
    cgroup_text: &str,
    mountinfo: &str,
    owner: impl Fn(&Path) -> Option<u32>,
) -> Option<String> {
    cgroup_text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
        let at = parts.iter().position(|c| job_of_dir(c).is_some())?;
        let (mount_point, root) = hierarchy_mount(mountinfo, controllers)?;
        // The path is the cgroup's from the hierarchy's root; the mount may show a subtree.
        let below: Vec<&str> = root.split('/').filter(|c| !c.is_empty()).collect();
        let rest = parts[..=at].strip_prefix(below.as_slice())?;
        let mut dir = PathBuf::from(mount_point);
        if owner(&dir) != Some(0) {
            return None;
        }
        for c in rest {
            if *c == "." || *c == ".." {
                return None;
            }
            dir.push(c);
            if owner(&dir) != Some(0) {
                return None;
            }
        }
        job_of_dir(parts[at]).map(str::to_string)
    })
}

/// The job id a directory named `job_<id>` stands for.
fn job_of_dir(name: &str) -> Option<&str> {
    name.strip_prefix("job_")
        .filter(|id| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
}

/// Whether `pid`'s cgroup (in `cg`'s hierarchy) is `cg` or below it.
pub fn in_cgroup(pid: u32, cg: &CgroupRef) -> bool {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    in_cgroup_text(&text, cg)
}

/// [`in_cgroup`] on a `/proc/PID/cgroup` text.
fn in_cgroup_text(text: &str, cg: &CgroupRef) -> bool {
    text.lines()
        .filter_map(|l| {
            let mut fields = l.splitn(3, ':');
            let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let ours = match &cg.v1_controller {
                None => controllers.is_empty(),
                Some(c) => controllers.split(',').any(|x| x == c),
            };
            ours.then_some(path)
        })
        .any(|own| {
            own == cg.relative
                || cg.relative == "/"
                || own.starts_with(&format!("{}/", cg.relative))
        })
}

#[cfg(test)]
mod tests {
    use super::{hierarchy_mount, in_cgroup_text, slurm_job_with, CgroupRef};
    use std::path::Path;

    /// A hybrid host's mounts, as on the test machines (cgroup v1 controllers and a v2
    /// hierarchy at `unified`).
    const HYBRID: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
36 30 0:32 / /sys/fs/cgroup/freezer rw,nosuid - cgroup cgroup rw,freezer\n\
37 30 0:33 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n";

    /// Root owns everything but what is under a `user@1000.service`.
    fn owner(dir: &Path) -> Option<u32> {
        let user = dir.to_string_lossy().contains("user@1000.service");
        [Some(0), Some(1000)][usize::from(user)]
    }

    #[test]
    fn slurm_jobs_come_from_root_made_job_cgroups_v1_or_v2() {
        let v2 = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_1\n";
        assert_eq!(slurm_job_with(v2, HYBRID, owner).as_deref(), Some("4242"));
        let v1 = "6:freezer:/slurm_vm/uid_0/job_2/step_batch\n0::/\n";
        assert_eq!(slurm_job_with(v1, HYBRID, owner).as_deref(), Some("2"));
        let joined = "5:cpuacct,cpu:/slurm/uid_7/job_9/step_0\n";
        assert_eq!(slurm_job_with(joined, HYBRID, owner).as_deref(), Some("9"));
        for none in [
            "0::/user.slice/user-1000.slice\n",
            "0::/x/job_/y\n",
            "0::/a/job_1;x\n",
        ] {
            assert_eq!(slurm_job_with(none, HYBRID, owner), None, "{none}");
        }
    }

    #[test]
    fn a_users_own_cgroup_named_like_a_job_is_not_believed() {
        let delegated = "0::/user.slice/user-1000.slice/user@1000.service/job_4242/x\n";
        assert_eq!(slurm_job_with(delegated, HYBRID, owner), None);
        // Nor one that cannot be checked: no such hierarchy mounted, or the directory gone.
        assert_eq!(
            slurm_job_with("3:memory:/slurm/uid_0/job_5\n", HYBRID, owner),
            None
        );
        assert_eq!(
            slurm_job_with("0::/system.slice/job_5\n", HYBRID, |_| None),
            None
        );
        // A mount showing a subtree: the path must lie in it.
        let sub = "40 25 0:27 /system.slice /mnt/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            slurm_job_with("0::/system.slice/job_5/step_0\n", sub, owner).as_deref(),
            Some("5")
        );
        assert_eq!(slurm_job_with("0::/other/job_5\n", sub, owner), None);
    }

    #[test]
    fn a_process_is_in_a_cgroup_by_its_line_of_that_hierarchy() {
        let job = |v1_controller: Option<&str>| CgroupRef {
            relative: "/slurm_vm/uid_65534/job_3".into(),
            id: 7,
            level: 3,
            v1_controller: v1_controller.map(str::to_string),
        };
        let text = "6:freezer:/slurm_vm/uid_65534/job_3/step_0/task_0\n\
                    5:cpu,cpuacct:/slurm_vm/uid_65534/job_31\n\
                    0::/user.slice\n";
        assert!(in_cgroup_text(text, &job(Some("freezer"))));
        // A job whose id starts like it, another hierarchy's line, or v2's: not in it.
        assert!(!in_cgroup_text(text, &job(Some("cpuacct"))));
        assert!(!in_cgroup_text(text, &job(Some("memory"))));
        assert!(!in_cgroup_text(text, &job(None)));
        let v2 = "0::/slurm_vm/uid_65534/job_3\n";
        assert!(in_cgroup_text(v2, &job(None)));
        assert!(!in_cgroup_text(v2, &job(Some("freezer"))));
    }

    #[test]
    fn hierarchies_are_found_by_their_controllers() {
        assert_eq!(
            hierarchy_mount(HYBRID, ""),
            Some(("/sys/fs/cgroup/unified", "/"))
        );
        assert_eq!(
            hierarchy_mount(HYBRID, "cpuacct,cpu"),
            Some(("/sys/fs/cgroup/cpu,cpuacct", "/"))
        );
        assert_eq!(hierarchy_mount(HYBRID, "memory"), None);
        // tmpfs is not a cgroup hierarchy, whatever its options.
        assert_eq!(hierarchy_mount(HYBRID, "ro"), None);
    }
}
