//! cgroup v2: which cgroup a daemon is limited to (a directory, or a Slurm job's), as the
//! kernel identifies it, and whether a process is in it.

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
    mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mount_point = left.split_whitespace().nth(4)?;
        right
            .starts_with("cgroup2 ")
            .then(|| PathBuf::from(mount_point))
    })
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
    let root = cgroup2_root().ok_or(CgroupError::NoHierarchy)?;
    let want = format!("job_{job}");
    let mut dirs = vec![(root.clone(), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name().to_string_lossy() == want {
                return Ok(e.path());
            }
            if depth < 5 {
                dirs.push((e.path(), depth + 1));
            }
        }
    }
    Err(CgroupError::NoSlurmJob {
        job: job.to_string(),
        root,
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
