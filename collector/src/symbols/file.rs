//! Opening a library file once, and reading it in bounded pieces.
//!
//! The daemon is root and reads files that any user can map, name, rename, truncate or
//! replace. So a library is opened exactly once, never by a path a user can move under us:
//! a mapped object through `/proc/PID/map_files/LO-HI` (the very file the process maps,
//! with no path walked in its mount namespace), a file commtap's own caller named through
//! its path; non-blocking, and only if it is a regular file (a FIFO would stop the daemon)
//! with the identity the caller expects. The same descriptor is then parsed and given to
//! the kernel for the probes (`/proc/self/fd/N`), so what is probed is what was read.
//!
//! Nothing is mapped (a user truncating their own file would raise SIGBUS in the daemon):
//! reads go through [`LibraryData`], copies of the ranges the ELF parser asks for, each
//! read at most [`MAX_ONE_READ`] bytes and at most [`READ_BUDGET`] bytes a file in all.

use std::{
    cell::Cell,
    fs::File,
    io::{self, Read, Seek, SeekFrom},
    ops::Range,
    os::{
        fd::AsRawFd,
        unix::fs::{FileExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

use object::{ReadCache, ReadRef};

/// Most bytes one read of a library may copy (the largest section commtap reads from a
/// real library here, libnccl's `.strtab`, is under 1 MiB).
pub const MAX_ONE_READ: u64 = 64 << 20;
/// Most bytes all the reads of one library may copy.
pub const READ_BUDGET: u64 = 256 << 20;
/// Longest string read (symbol names, dynamic-section strings).
const MAX_STRING: u64 = 4096;

/// Errors opening a library file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be opened or examined.
    #[error("opening {what}")]
    Open {
        /// The file.
        what: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// It is not a regular file (a FIFO, a device, a directory): never read.
    #[error("{what} is not a regular file: not read")]
    NotRegular {
        /// The file.
        what: String,
    },
    /// The file opened is not the one the process maps (it was replaced meanwhile).
    #[error("{what} changed while it was opened (expected inode {expected}, found {found})")]
    Changed {
        /// The file.
        what: String,
        /// The inode the process maps.
        expected: u64,
        /// The inode opened.
        found: u64,
    },
}

/// A library file opened once and verified: parse it with [`LibraryFile::data`], probe it
/// with [`LibraryFile::probe_path`].
#[derive(Debug)]
pub struct LibraryFile {
    file: File,
    /// Device and inode of the file opened.
    pub identity: (u64, u64),
    /// The file's owner (a library a user owns counts against that user's quota of probed
    /// libraries, and is let go once no process maps it).
    pub owner: u32,
    /// The file's path as its process (or commtap's caller) names it, for messages.
    pub shown: String,
    /// What tells this file's contents from another's at the same identity.
    pub stamp: FileStamp,
}

/// A file's birth and change times and size. A file's identity (device, inode) outlives
/// its contents: a file rewritten in place keeps it, and a new file may be given the number
/// of one deleted. Either changes this, so a decision made on a file is known to be about
/// the same contents (a change of attributes alone, a `chmod`, costs a read again).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileStamp {
    /// When it was made, where the file system says (a reused number's file is another's,
    /// however coarse its change time).
    born: Option<std::time::SystemTime>,
    /// Seconds and nanoseconds of its last change (contents or attributes).
    changed: (i64, i64),
    /// Its size in bytes.
    size: u64,
}

/// A file's contents: its identity (device, inode) and its stamp.
pub type FileKey = ((u64, u64), FileStamp);

impl FileStamp {
    /// The stamp `meta` gives.
    fn of(meta: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            born: meta.created().ok(),
            changed: (meta.ctime(), meta.ctime_nsec()),
            size: meta.size(),
        }
    }
}

impl LibraryFile {
    /// Opens the file `pid` maps at `range` (any of its mappings), which must be the file
    /// `expected` (device, inode) names; `shown` is its path, for messages.
    pub fn open_mapped(
        pid: u32,
        range: (u64, u64),
        expected: (u64, u64),
        shown: &str,
    ) -> Result<LibraryFile, FileError> {
        let link = map_files_entry(pid, range);
        let file = open_nonblocking(&link, shown)?;
        let lib = LibraryFile::verified(file, shown)?;
        if lib.identity != expected {
            return Err(FileError::Changed {
                what: shown.to_string(),
                expected: expected.1,
                found: lib.identity.1,
            });
        }
        Ok(lib)
    }

    /// Opens a library commtap's own caller named (`--lib`, the linker's search path of a
    /// command it launches), following symlinks as the dynamic linker would.
    pub fn open_path(path: &Path) -> Result<LibraryFile, FileError> {
        let shown = path.display().to_string();
        let file = open_nonblocking(path, &shown)?;
        LibraryFile::verified(file, &shown)
    }

    fn verified(file: File, shown: &str) -> Result<LibraryFile, FileError> {
        let meta = file.metadata().map_err(|source| FileError::Open {
            what: shown.to_string(),
            source,
        })?;
        if !meta.file_type().is_file() {
            return Err(FileError::NotRegular {
                what: shown.to_string(),
            });
        }
        Ok(LibraryFile {
            file,
            identity: (meta.dev(), meta.ino()),
            owner: meta.uid(),
            shown: shown.to_string(),
            stamp: FileStamp::of(&meta),
        })
    }

    /// A bounded reader of the file for the ELF parser.
    pub fn data(&self) -> io::Result<LibraryData> {
        Ok(LibraryData {
            cache: ReadCache::new(Budget {
                file: self.file.try_clone()?,
                left: READ_BUDGET,
            }),
            used: Cell::new(0),
        })
    }

    /// The path through which the kernel reaches exactly this open file: attach probes by
    /// it, never by the file's own path (which its owner may point elsewhere meanwhile).
    pub fn probe_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }

    /// Where `needle` first occurs in bytes `range` of the file, read in 1 MiB pieces (for
    /// sections too large to copy whole, such as a framework's read-only data).
    pub fn find(&self, range: Range<u64>, needle: &[u8]) -> Option<u64> {
        const PIECE: u64 = 1 << 20;
        let overlap = needle.len() as u64;
        let mut buf = vec![0u8; (PIECE + overlap) as usize];
        let mut at = range.start;
        while at < range.end {
            let len = (range.end - at).min(PIECE + overlap) as usize;
            let n = self.file.read_at(&mut buf[..len], at).ok()?;
            if n == 0 {
                return None;
            }
            if let Some(i) = memchr::memmem::find(&buf[..n], needle) {
                return Some(at + i as u64);
            }
            at += PIECE;
        }
        None
    }

    /// Up to `len` bytes at file offset `at` (fewer at the end of the file).
    pub fn read_at(&self, at: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        let n = self.file.read_at(&mut buf, at).unwrap_or(0);
        buf.truncate(n);
        buf
    }
}

/// `/proc/PID/map_files/LO-HI`, the kernel's link to the file mapped at that range.
fn map_files_entry(pid: u32, (lo, hi): (u64, u64)) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/map_files/{lo:x}-{hi:x}"))
}

/// Device and inode of the file `pid` maps at `range`, and its stamp, without opening it.
pub fn mapped_identity(pid: u32, range: (u64, u64)) -> io::Result<((u64, u64), FileStamp)> {
    let meta = std::fs::metadata(map_files_entry(pid, range))?;
    Ok(((meta.dev(), meta.ino()), FileStamp::of(&meta)))
}

fn open_nonblocking(path: &Path, shown: &str) -> Result<File, FileError> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| FileError::Open {
            what: shown.to_string(),
            source,
        })
}

/// The file behind a [`ReadCache`], refusing to read past its budget.
struct Budget {
    file: File,
    left: u64,
}

impl Read for Budget {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = (buf.len() as u64).min(self.left) as usize;
        if want == 0 && !buf.is_empty() {
            return Err(io::Error::other("read budget of the library exhausted"));
        }
        let n = self.file.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

impl Seek for Budget {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

/// A library's bytes as the ELF parser reads them: each range copied once on first use,
/// none larger than [`MAX_ONE_READ`], all together at most [`READ_BUDGET`] (a file whose
/// headers claim more fails to parse, it never costs the daemon its memory).
pub struct LibraryData {
    cache: ReadCache<Budget>,
    used: Cell<u64>,
}

impl LibraryData {
    fn charge(&self, size: u64) -> Result<(), ()> {
        let used = self.used.get().saturating_add(size);
        if size > MAX_ONE_READ || used > READ_BUDGET {
            return Err(());
        }
        self.used.set(used);
        Ok(())
    }

    /// Bytes `at..at + len`, or `None` past the end of the file or the budget.
    pub fn bytes(&self, at: u64, len: u64) -> Option<&[u8]> {
        self.read_bytes_at(at, len).ok()
    }
}

impl<'a> ReadRef<'a> for &'a LibraryData {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        self.charge(size)?;
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        // Charged what the cache keeps of it, not the most it may read: a symbol table's
        // names (600,000 in libtorch) charged 4 KiB each spent the budget at its
        // 65,536th name.
        if self.used.get() >= READ_BUDGET {
            return Err(());
        }
        let end = range.end.min(range.start.saturating_add(MAX_STRING));
        let bytes = (&self.cache).read_bytes_at_until(range.start..end, delimiter)?;
        // And the cache's entry for it.
        self.charge(bytes.len() as u64 + 64)?;
        Ok(bytes)
    }
}

/// The ELF view of a library read through [`LibraryData`].
pub type Elf<'a> = object::File<'a, &'a LibraryData>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp(name: &str, bytes: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("commtap-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let p = dir.join(name);
        std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(bytes))
            .expect("write");
        p
    }

    #[test]
    fn contents_written_in_place_have_another_stamp_under_the_same_identity() {
        let p = temp("rewritten.so", b"one");
        let before = LibraryFile::open_path(&p).expect("open");
        let again = LibraryFile::open_path(&p).expect("open");
        assert_eq!(before.stamp, again.stamp, "nothing changed");
        // Truncated and written, as `cp` onto it does: the same inode.
        std::fs::write(&p, b"other contents").expect("rewrite");
        let after = LibraryFile::open_path(&p).expect("open");
        assert_eq!(before.identity, after.identity);
        assert_ne!(before.stamp, after.stamp);
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("commtap-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let fifo = dir.join("libmpi.so.40");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: mkfifo(3) with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        // Without O_NONBLOCK this open would wait for a writer forever.
        let err = LibraryFile::open_path(&fifo).expect_err("a FIFO is not a library");
        assert!(matches!(err, FileError::NotRegular { .. }), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn reads_are_bounded() {
        let p = temp("big", &vec![7u8; 4096]);
        let f = LibraryFile::open_path(&p).expect("open");
        let data = f.data().expect("data");
        assert_eq!(data.bytes(10, 4), Some(&[7u8; 4][..]));
        // Past the end of the file: refused before anything is allocated.
        assert!(data.bytes(0, 1 << 40).is_none());
        assert!(data.bytes(4000, 200).is_none());
        // Many reads of distinct ranges stop at the budget.
        let reads = (READ_BUDGET / 4096) + 10;
        let ok = (0..reads)
            .filter(|i| (&data).read_bytes_at(i % 2, 4094).is_ok())
            .count() as u64;
        assert!(ok <= READ_BUDGET / 4094, "{ok} reads of 4094 bytes");
        assert_eq!(f.find(0..4096, &[7, 7, 7]), Some(0));
        assert_eq!(f.find(0..4096, b"x"), None);
        let _ = std::fs::remove_file(p);
    }

    /// A symbol table's names are charged what they hold: 200,000 of them (libtorch has
    /// 600,000) are all read, where a charge of the most a name may be stopped at 65,536.
    #[test]
    fn many_names_are_read_within_the_budget() {
        let names: Vec<u8> = (0..200_000)
            .flat_map(|i| format!("function_{i}\0").into_bytes())
            .collect();
        let p = temp("names", &names);
        let f = LibraryFile::open_path(&p).expect("open");
        let data = f.data().expect("data");
        let end = names.len() as u64;
        let mut at = 0;
        for i in 0..200_000 {
            let name = (&data).read_bytes_at_until(at..end, 0).expect("a name");
            assert_eq!(name, format!("function_{i}").as_bytes());
            at += name.len() as u64 + 1;
        }
        let _ = std::fs::remove_file(p);
    }
}
