//! One process's `/proc/PID` directory, opened once: every file then opened through it is
//! that process's (a directory whose process has ended opens nothing more, whoever is given
//! its pid since), and what is read of it is bounded.

use std::{
    ffi::CString,
    fs::File,
    io::Read,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::ffi::OsStrExt,
    },
};

use super::{proc_err, DiscoverError};

/// Most bytes of a process's `/proc/PID/maps` read: 65,530 mappings (the kernel's default
/// most) of 128-byte lines. Each line names its file, up to 4 KiB of path: a process of
/// any user can make its list a quarter of a gigabyte, which would be read whole (and
/// again whenever its mappings change) by a daemon reading it without a bound.
pub const MAX_MAPS_BYTES: u64 = 8 << 20;

/// Most bytes read of a file the kernel writes short (`stat`, `status`, `cgroup`).
pub const SMALL_FILE_BYTES: u64 = 64 << 10;

/// A process's `/proc/PID`, open.
#[derive(Debug)]
pub struct ProcessDir {
    pid: u32,
    dir: OwnedFd,
}

impl ProcessDir {
    /// `/proc/PID` of the process that has `pid` now; where `start_ticks` is given, only
    /// if that process started then (`start_ticks`: it is the process meant, not another
    /// given its pid since).
    pub fn open(pid: u32, start_ticks: Option<u64>) -> Result<ProcessDir, DiscoverError> {
        let path = CString::new(format!("/proc/{pid}")).expect("no NUL in a number");
        // SAFETY: a NUL-terminated path; the result is checked.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(proc_err(pid, "")(std::io::Error::last_os_error()));
        }
        let dir = ProcessDir {
            pid,
            // SAFETY: a new descriptor we now own.
            dir: unsafe { OwnedFd::from_raw_fd(fd) },
        };
        if let Some(want) = start_ticks {
            let stat = dir.read_text("stat", SMALL_FILE_BYTES)?;
            if super::stat_start_ticks(&stat) != Some(want) {
                return Err(DiscoverError::NoSuchProcess(pid));
            }
        }
        Ok(dir)
    }

    /// The process's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its file `name` (`mem`, `task/TID/syscall`), opened to read.
    pub fn file(&self, name: &'static str) -> Result<File, DiscoverError> {
        self.open_at(name).map_err(proc_err(self.pid, name))
    }

    fn open_at(&self, name: &str) -> std::io::Result<File> {
        let c = CString::new(name).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: a live directory descriptor and a NUL-terminated name; checked.
        let fd = unsafe {
            libc::openat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a new descriptor we now own.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// What `/proc/PID/task/TID/syscall` says of its thread `tid` (`None`: not its thread,
    /// or gone).
    pub fn thread_syscall(&self, tid: u32) -> Option<String> {
        let bytes = self.read_bytes(&format!("task/{tid}/syscall"), 512).ok()?;
        Some(lossy(bytes))
    }

    /// Where its link `name` (`ns/pid`) points (`None`: not readable).
    pub fn read_link(&self, name: &str) -> Option<std::path::PathBuf> {
        let c = CString::new(name).ok()?;
        let mut buf = [0u8; 256];
        // SAFETY: a live directory descriptor, a NUL-terminated name, a buffer of its length.
        let n = unsafe {
            libc::readlinkat(
                self.dir.as_raw_fd(),
                c.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        let n = usize::try_from(n).ok().filter(|&n| n < buf.len())?;
        Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
            &buf[..n],
        )))
    }

    /// Whether `tid` is one of its threads now.
    pub fn has_thread(&self, tid: u32) -> bool {
        let c = CString::new(format!("task/{tid}")).expect("no NUL in a number");
        // SAFETY: zeroed is a valid stat to be filled in.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a live directory descriptor, a NUL-terminated name, a stat to fill.
        unsafe { libc::fstatat(self.dir.as_raw_fd(), c.as_ptr(), &raw mut st, 0) == 0 }
    }

    /// Its file `name` (`cmdline`, `environ`), its first `cap` bytes at most.
    pub fn read_at_most(&self, name: &'static str, cap: u64) -> Result<Vec<u8>, DiscoverError> {
        self.read_bytes(name, cap).map_err(proc_err(self.pid, name))
    }

    /// [`ProcessDir::read_at_most`] as text (bytes not UTF-8 made so).
    pub fn read_text(&self, name: &'static str, cap: u64) -> Result<String, DiscoverError> {
        self.read_at_most(name, cap).map(lossy)
    }

    fn read_bytes(&self, name: &str, cap: u64) -> std::io::Result<Vec<u8>> {
        let mut bytes = Vec::new();
        self.open_at(name)?.take(cap).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// Its real user id (`status`'s `Uid:`): whom reading it is charged to.
    pub fn real_uid(&self) -> Result<u32, DiscoverError> {
        super::real_uid(&self.read_text("status", SMALL_FILE_BYTES)?)
            .ok_or_else(|| proc_err(self.pid, "status")(std::io::Error::other("no Uid line")))
    }

    /// Its mappings as `/proc/PID/maps` lists them (a file name not UTF-8 made so); an
    /// error past [`MAX_MAPS_BYTES`].
    pub fn maps(&self) -> Result<String, DiscoverError> {
        let bytes = self.read_at_most("maps", MAX_MAPS_BYTES + 1)?;
        if bytes.len() as u64 > MAX_MAPS_BYTES {
            return Err(DiscoverError::MapsTooLarge(self.pid));
        }
        Ok(lossy(bytes))
    }
}

/// `bytes` as text, those not UTF-8 made so (copied only then).
fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_own_directory_reads_its_maps_and_threads() {
        let me = std::process::id();
        let dir = ProcessDir::open(me, super::super::start_ticks(me)).unwrap();
        assert!(dir.maps().unwrap().contains("[stack]"));
        assert!(dir.has_thread(me));
        assert!(!dir.has_thread(u32::MAX));
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(dir.thread_syscall(tid).is_some());
        assert_eq!(
            dir.read_link("ns/pid"),
            std::fs::read_link("/proc/self/ns/pid").ok()
        );
    }

    #[test]
    fn another_start_is_another_process() {
        let me = std::process::id();
        let ticks = super::super::start_ticks(me).unwrap();
        assert!(matches!(
            ProcessDir::open(me, Some(ticks + 1)),
            Err(DiscoverError::NoSuchProcess(p)) if p == me
        ));
    }
}
