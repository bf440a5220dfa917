//! Who a uid is, for the caps kept per user: a sub-uid is its user's. A user given sub-uids
//! (`/etc/subuid`, which `newuidmap` grants from for rootless containers) runs processes
//! and owns files as each of them, so a cap per uid would give that user one per sub-uid:
//! its own libraries would take every library slot, its processes a share of the kernel's
//! maps each. The daemon's caps look a file's owner up here; the kernel side searches the
//! same ranges (`SUBUIDS`) after finding who answers for a process's user namespace (a
//! setuid program a sub-uid owns runs as that sub-uid in the node's own namespace too).

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    io::Read,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use collector_common::shares::{SubuidRange, MAX_SUBUID_RANGES};

use super::directory::{Answer, Answers, Directory};
use tracing::{info, warn};

/// Where the sub-uids users are given are listed, unless told otherwise.
pub const SUBUID_FILE: &str = "/etc/subuid";

/// Where user names are resolved (`/etc/subuid` may name its users).
const PASSWD_FILE: &str = "/etc/passwd";

/// The most bytes read of either file: beyond it, lines are not read (a range not read is
/// no one's: its uids are users of their own, as without the file).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// The most ranges kept (the kernel's too).
const MAX_RANGES: usize = MAX_SUBUID_RANGES as usize;

/// Errors reading the sub-uid file.
#[derive(Debug, thiserror::Error)]
pub enum AccountsError {
    /// It could not be opened or read.
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// It is not a regular file that only root may change: a user able to write it could
    /// make any uid theirs.
    #[error("{0}: not a regular file owned by root and writable by root only: not read")]
    Untrusted(PathBuf),
}

/// A file's device, inode, size, and modification and change times (ns): whether it
/// changed.
type FileSeen = (u64, u64, u64, i128, i128);

/// What `meta` says of whether its file changed.
fn seen(meta: &std::fs::Metadata) -> FileSeen {
    let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
    (
        meta.dev(),
        meta.ino(),
        meta.size(),
        ns(meta.mtime(), meta.mtime_nsec()),
        ns(meta.ctime(), meta.ctime_nsec()),
    )
}

/// The sub-uid ranges of a node (sorted, none overlapping another), and what the file they
/// were read from looked like then (to read it again only when it changed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accounts {
    ranges: Vec<SubuidRange>,
    /// What the file read looked like; none where none was.
    read_from: Option<FileSeen>,
    /// Names the file gives ranges to that `/etc/passwd` lacks: the user directory's to
    /// resolve (until it has, each such range is a user of its own).
    directory_names: Vec<String>,
}

impl Accounts {
    /// The user `uid` is charged as: the user given it where it is a sub-uid, else itself.
    pub fn of(&self, uid: u32) -> u32 {
        let after = self.ranges.partition_point(|r| r.start <= uid);
        match after.checked_sub(1).map(|i| self.ranges[i]) {
            Some(r) if r.holds(uid) => r.account(uid),
            _ => uid,
        }
    }

    /// The ranges, sorted, as the kernel side searches them.
    pub fn ranges(&self) -> &[SubuidRange] {
        &self.ranges
    }

    /// The names the file gives ranges to that `/etc/passwd` lacks.
    pub fn directory_names(&self) -> &[String] {
        &self.directory_names
    }

    /// The ranges in `subuid` (`/etc/subuid`'s `USER:FIRST:COUNT` lines), users named
    /// there resolved by `passwd` (`/etc/passwd`'s `NAME:x:UID:` lines), else by the
    /// directory's `answers`. Lines that do not parse are left out. Root's ranges are
    /// handed out to containers (LXD writes one): each block of 65,536 of them is a user
    /// ([`SubuidRange::account`]). A range overlapping one before it keeps what lies past
    /// it (merged into it where both are one user's), with a warning where they are not.
    pub fn parse<'a>(subuid: &'a str, passwd: &str, answers: &Answers) -> Accounts {
        // Once, not per range: both files may run to megabytes, read in the daemon's loop.
        let mut uids: HashMap<&str, u32> = HashMap::new();
        for (name, uid) in passwd.lines().filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            Some((name, f.nth(1)?.parse().ok()?))
        }) {
            // The first line of a name, as the C library reads it.
            uids.entry(name).or_insert(uid);
        }
        let mut directory_names: Vec<String> = Vec::new();
        let mut asked: HashSet<&str> = HashSet::new();
        let mut uid_of = |name: &'a str| {
            let uid = name.parse().ok().or_else(|| uids.get(name).copied());
            if uid.is_some() {
                return uid;
            }
            if directory_names.len() < MAX_RANGES && asked.insert(name) {
                directory_names.push(name.to_string());
            }
            match answers.get(name) {
                Some(Answer::User(uid)) => Some(*uid),
                _ => None,
            }
        };
        let mut ranges: Vec<SubuidRange> = subuid
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .filter_map(|l| {
                let mut f = l.trim().split(':');
                let (user, start, count) = (f.next()?, f.next()?, f.next()?);
                let start: u32 = start.parse().ok()?;
                let count: u32 = count.parse().ok()?;
                (count > 0 && u64::from(start) + u64::from(count) <= 1 << 32).then_some(())?;
                Some(SubuidRange {
                    start,
                    count,
                    owner: uid_of(user).unwrap_or(start),
                })
            })
            .collect();
        ranges.sort_by_key(|r| r.start);
        let end = |r: &SubuidRange| u64::from(r.start) + u64::from(r.count);
        let mut kept: Vec<SubuidRange> = Vec::with_capacity(ranges.len().min(MAX_RANGES));
        for mut r in ranges {
            if let Some(last) = kept.last_mut().filter(|l| l.holds(r.start)) {
                let (last_end, r_end) = (end(last), end(&r));
                if r.owner == last.owner {
                    let merged = (r_end.max(last_end) - u64::from(last.start)).min(u32::MAX.into());
                    last.count = merged as u32;
                    continue;
                }
                warn!(
                    "sub-uids {}..+{} of user {} overlap those of user {}: only those past \
                     theirs are counted as user {}",
                    r.start, r.count, r.owner, last.owner, r.owner
                );
                if r_end <= last_end {
                    continue;
                }
                r.start = last_end as u32;
                r.count = (r_end - last_end) as u32;
            }
            if kept.len() == MAX_RANGES {
                warn!(
                    "more than {MAX_RANGES} sub-uid ranges: those past them are each a user of \
                     their own"
                );
                break;
            }
            kept.push(r);
        }
        Accounts {
            ranges: kept,
            read_from: None,
            directory_names,
        }
    }

    /// The ranges in the file at `path` (root's, changed by root only: see
    /// [`AccountsError::Untrusted`]), names `/etc/passwd` lacks resolved by the directory's
    /// `answers`; none where there is no file.
    pub fn read(path: &Path, answers: &Answers) -> Result<Accounts, AccountsError> {
        let Some((text, seen)) = read_trusted(path)? else {
            return Ok(Accounts::default());
        };
        // Names are resolved where the file names users; a passwd that cannot be read
        // leaves those ranges each a user of its own.
        let passwd = match read_trusted(Path::new(PASSWD_FILE)) {
            Ok(Some((p, _))) => p,
            _ => String::new(),
        };
        let mut accounts = Accounts::parse(&text, &passwd, answers);
        accounts.read_from = Some(seen);
        Ok(accounts)
    }

    /// These accounts, or those of `path` where it changed since they were read (or the
    /// user `directory` answered for names `/etc/passwd` lacks): a user given sub-uids while
    /// the daemon runs has them counted as theirs from the next look. A file that can no
    /// longer be read keeps the accounts as they were. Never waits on the directory.
    pub fn refreshed(self, path: &Path, directory: &mut Directory) -> Accounts {
        let answered = directory.take_answers();
        let now = std::fs::symlink_metadata(path).ok().map(|m| seen(&m));
        let changed = now != self.read_from;
        if changed {
            // A user may have been made or renumbered in the directory since (root gives a
            // new user sub-uids): every name asked again, the old answers standing meanwhile.
            directory.ask_all_again();
        }
        let accounts = if changed || answered {
            match Accounts::read(path, directory.answers()) {
                Ok(a) => {
                    info!(
                        file = %path.display(),
                        ranges = a.ranges.len(),
                        names_for_the_directory = a.directory_names.len(),
                        "sub-uids read: each is charged as the user given it"
                    );
                    a
                }
                Err(e) => {
                    warn!("{e}; the sub-uids read before stand");
                    Accounts {
                        read_from: now,
                        ..self
                    }
                }
            }
        } else {
            self
        };
        directory.ask_for(&accounts.directory_names);
        accounts
    }
}

/// The text of `path` (at most [`MAX_FILE_BYTES`]) and what the file looked like, opened
/// once (not through a link) and checked as opened; none where there is no such file.
fn read_trusted(path: &Path) -> Result<Option<(String, FileSeen)>, AccountsError> {
    let io = |e| AccountsError::Io(path.to_path_buf(), e);
    let file = match File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() || meta.uid() != 0 || meta.mode() & 0o022 != 0 {
        return Err(AccountsError::Untrusted(path.to_path_buf()));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 == MAX_FILE_BYTES {
        // The last line may be cut short (a smaller count): only whole lines are read.
        bytes.truncate(bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1));
        warn!(
            "{}: only its first {MAX_FILE_BYTES} bytes are read",
            path.display()
        );
    }
    Ok(Some((
        String::from_utf8_lossy(&bytes).into_owned(),
        seen(&meta),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_uid_is_the_user_given_it_and_any_other_uid_itself() {
        let passwd = "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        let subuid = "alice:100000:65536\n# comment\n2000:300000:10\nghost:400000:5\n\
                      bad line\nbob:x:1\nzero:500000:0\nhuge:4294967295:2\n\
                      root:1000000:1000000\n1000:300005:100\n";
        let a = Accounts::parse(subuid, passwd, &Answers::new());
        assert_eq!(a.of(100_000), 1000);
        assert_eq!(a.of(165_535), 1000);
        assert_eq!(a.of(165_536), 165_536);
        assert_eq!(a.of(1000), 1000);
        // Named by uid.
        assert_eq!(a.of(300_009), 2000);
        // A name that does not resolve: the range is one user still.
        assert_eq!(a.of(400_004), 400_000);
        assert_eq!(a.of(400_000), 400_000);
        // Empty ranges and ranges past 2^32 are left out.
        assert_eq!(a.of(500_000), 500_000);
        assert_eq!(a.of(u32::MAX), u32::MAX);
        // Root's ranges are handed to containers: a block of 65,536 is one user.
        assert_eq!(a.of(1_500_000), 0x16_0000);
        assert_eq!(a.of(1_500_001), 0x16_0000);
        assert_eq!(a.of(1_999_999), 0x1e_0000);
        // A range overlapping another user's before it keeps what lies past it.
        assert_eq!(a.of(300_005), 2000);
        assert_eq!(a.of(300_050), 1000);
        assert_eq!(a.of(300_105), 300_105);
        // One user's ranges overlapping are one.
        let b = Accounts::parse(
            "1000:100:10\n1000:105:20\n1000:110:2\n",
            "",
            &Answers::new(),
        );
        assert_eq!(b.ranges().len(), 1);
        assert_eq!((b.of(124), b.of(125)), (1000, 125));
        assert_eq!(a.ranges().len(), 5);
        assert!(a.ranges().is_sorted_by_key(|r| r.start));
    }

    #[test]
    fn a_file_a_user_could_change_is_not_read() {
        let dir = std::env::temp_dir().join(format!("commtap-accounts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("subuid");
        std::fs::write(&path, "65534:3000000:10\n").expect("write");
        let mode = |m| {
            std::fs::set_permissions(
                &path,
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(m),
            )
            .expect("chmod");
        };
        mode(0o644);
        // Tests run as root: the file is root's.
        let mut dir_users = Directory::default();
        let read = Accounts::read(&path, &Answers::new()).expect("root's file");
        assert_eq!(read.of(3_000_005), 65534);
        // Unchanged: the same accounts; changed, read again.
        let again = read.clone().refreshed(&path, &mut dir_users);
        assert_eq!(again, read);
        std::fs::write(&path, "65534:3000000:10\n65534:4000000:10\n").expect("write");
        let again = again.refreshed(&path, &mut dir_users);
        assert_eq!(again.of(4_000_001), 65534);
        mode(0o666);
        assert!(matches!(
            Accounts::read(&path, &Answers::new()),
            Err(AccountsError::Untrusted(_))
        ));
        // Made untrusted after it was read: what was read stands.
        std::fs::write(&path, "").expect("write");
        assert_eq!(
            again.clone().refreshed(&path, &mut dir_users).of(4_000_001),
            65534
        );
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&path, &link).expect("symlink");
        assert!(
            Accounts::read(&link, &Answers::new()).is_err(),
            "read through a link"
        );
        assert_eq!(
            Accounts::read(&dir.join("none"), &Answers::new()).expect("no file"),
            Accounts::default()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Set when the test's directory may answer.
    static DIRECTORY_UP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// A directory that knows carol as 4242 and dave as 4343, and answers only once
    /// `DIRECTORY_UP` is set.
    fn slow_directory(name: &str) -> Answer {
        while !DIRECTORY_UP.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        match name {
            "carol" => Answer::User(4242),
            "dave" => Answer::User(4343),
            _ => Answer::NoSuchUser,
        }
    }

    /// `a` refreshed from `path` until `done` says so (the directory's answer taken).
    fn refreshed_until(
        mut a: Accounts,
        path: &Path,
        users: &mut Directory,
        done: impl Fn(&Accounts) -> bool,
    ) -> Accounts {
        let deadline = std::time::Instant::now() + std::time::Duration::from_mins(1);
        while !done(&a) {
            assert!(
                std::time::Instant::now() < deadline,
                "the answer never came"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
            a = a.refreshed(path, users);
        }
        a
    }

    #[test]
    fn a_name_only_the_directory_knows_is_its_user_once_it_answers_and_never_waited_for() {
        let dir = std::env::temp_dir().join(format!("commtap-directory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("subuid");
        std::fs::write(&path, "carol:5000000:65536\nno-such-user:6000000:10\n").expect("write");
        let mut users = Directory::new(
            slow_directory,
            std::time::Duration::from_mins(5),
            std::time::Duration::from_mins(1),
        );
        // The directory does not answer: the read does not wait, and each range is a user
        // of its own meanwhile.
        let a = Accounts::default().refreshed(&path, &mut users);
        assert_eq!(a.of(5_000_001), 5_000_000);
        assert_eq!(a.directory_names(), ["carol", "no-such-user"]);
        let a = a.refreshed(&path, &mut users);
        assert_eq!(a.of(5_000_001), 5_000_000);
        DIRECTORY_UP.store(true, std::sync::atomic::Ordering::SeqCst);
        let a = refreshed_until(a, &path, &mut users, |a| a.of(5_000_001) == 4242);
        // A name no one has stays a user of its own.
        assert_eq!(a.of(6_000_001), 6_000_000);
        // The file changes (a new user given sub-uids): carol's answer stands while the
        // names are asked again, and dave's comes.
        std::fs::write(&path, "carol:5000000:65536\ndave:7000000:10\n").expect("write");
        let a = a.refreshed(&path, &mut users);
        assert_eq!(a.of(5_000_001), 4242);
        let a = refreshed_until(a, &path, &mut users, |a| a.of(7_000_001) == 4343);
        assert_eq!(a.of(5_000_001), 4242);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
