//! cgroups: which cgroup v2 a daemon is limited to (a directory, or a Slurm job's), as the
//! kernel identifies it, and whether a process is in it; which Slurm job's cgroup (v1 or v2)
//! holds a process.

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
    /// The path is not in the cgroup v2 hierarchy.
    #[error("{} is not under the cgroup v2 mount {}", path.display(), root.display())]
    Outside {
        /// The path asked for, resolved.
        path: PathBuf,
        /// The hierarchy's mount point.
        root: PathBuf,
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
    #[error("no cgroup job_{job} under {} (is Slurm's cgroup v2 plugin in use on this node?)", root.display())]
    NoSlurmJob {
        /// The job id.
        job: String,
        /// The hierarchy's mount point.
        root: PathBuf,
    },
}

/// A cgroup v2 directory, as the kernel identifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupRef {
    /// Its path relative to the cgroup v2 root (`/` for the root), as `/proc/PID/cgroup`
    /// shows it.
    pub relative: String,
    /// Its id (the directory's inode number), as `bpf_get_current_ancestor_cgroup_id` gives.
    pub id: u64,
    /// Its depth below the root (the root is 0).
    pub level: u32,
}

/// The cgroup v2 mount point (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid hosts).
pub fn cgroup2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    hierarchy_mount(&mounts, "").map(|(mount_point, _)| PathBuf::from(mount_point))
}

/// Identifies the cgroup v2 directory `path`.
pub fn cgroup_ref(path: &Path) -> Result<CgroupRef, CgroupError> {
    let root = cgroup2_root().ok_or(CgroupError::NoHierarchy)?;
    let io = |source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    };
    let path = fs::canonicalize(path).map_err(io)?;
    let rel = path.strip_prefix(&root).map_err(|_| CgroupError::Outside {
        path: path.clone(),
        root: root.clone(),
    })?;
    let meta = fs::metadata(&path).map_err(io)?;
    if !meta.is_dir() {
        return Err(CgroupError::NotADirectory(path));
    }
    Ok(CgroupRef {
        relative: format!("/{}", rel.display()).replace("//", "/"),
        id: meta.ino(),
        level: rel.components().count() as u32,
    })
}

/// The cgroup of Slurm job `job` (Slurm's cgroup v2 plugin names it `job_<id>`).
pub fn slurm_job_cgroup(job: &str) -> Result<PathBuf, CgroupError> {
    let want = format!("job_{job}");
    let (root, found) = find_cgroups(5, |name| name == want)?;
    found.into_iter().next().ok_or(CgroupError::NoSlurmJob {
        job: job.to_string(),
        root,
    })
}

/// The cgroup of the container whose id is or starts with `id` (at least 12 characters, as
/// `docker ps` shows it): the directory Docker, containerd, CRI-O or Podman made for it.
pub fn container_cgroup(id: &str) -> Result<PathBuf, CgroupError> {
    let bad = || CgroupError::NoContainer {
        id: id.to_string(),
        root: cgroup2_root().unwrap_or_default(),
    };
    if id.len() < 12 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let id = id.to_ascii_lowercase();
    let (_, mut found) = find_cgroups(10, |name| {
        crate::discover::container::container_id(name).is_some_and(|c| c.starts_with(&id))
    })?;
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

/// The cgroup v2 root and the directories down to `max_depth` whose names satisfy `wanted`.
fn find_cgroups(
    max_depth: usize,
    wanted: impl Fn(&str) -> bool,
) -> Result<(PathBuf, Vec<PathBuf>), CgroupError> {
    let root = cgroup2_root().ok_or(CgroupError::NoHierarchy)?;
    let mut found = Vec::new();
    let mut dirs = vec![(root.clone(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if wanted(&e.file_name().to_string_lossy()) {
                found.push(e.path());
            } else if depth < max_depth {
                dirs.push((e.path(), depth + 1));
            }
        }
    }
    Ok((root, found))
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

/// Where the hierarchy a `/proc/PID/cgroup` line names (`controllers` empty: cgroup v2;
/// else v1's comma-separated controllers, `name=systemd` included) is mounted, and which of
/// its cgroups the mount shows at its top. Mount points with escaped characters are
/// skipped: nothing Slurm makes.
fn hierarchy_mount<'a>(mountinfo: &'a str, controllers: &str) -> Option<(&'a str, &'a str)> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut left = left.split_whitespace().skip(3);
        let (root, mount_point) = (left.next()?, left.next()?);
        let mut right = right.split_whitespace();
        let (fstype, superopts) = (right.next()?, right.nth(1).unwrap_or(""));
        let matches = if controllers.is_empty() {
            fstype == "cgroup2"
        } else {
            fstype == "cgroup"
                && controllers
                    .split(',')
                    .all(|c| superopts.split(',').any(|o| o == c))
        };
        (matches && !mount_point.contains('\\') && !root.contains('\\'))
            .then_some((mount_point, root))
    })
}

/// Whether `pid`'s cgroup v2 is `cg` or below it.
pub fn in_cgroup(pid: u32, cg: &CgroupRef) -> bool {
    let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return false;
    };
    text.lines()
        .filter_map(|l| l.strip_prefix("0::"))
        .any(|own| {
            own == cg.relative
                || cg.relative == "/"
                || own.starts_with(&format!("{}/", cg.relative))
        })
}

#[cfg(test)]
mod tests {
    use super::slurm_job_with;
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
}
