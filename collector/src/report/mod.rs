//! The renderings of a job's profile (`crate::profile`): JSON (the schema in the README),
//! an mpitrace-style text report, and mpitrace's per-rank `mpi_profile.<job>.<rank>` files.
//! Reports only render: every figure they show is in the profile.

pub mod diff;
mod durations;
mod endings;
pub mod html;
mod mpitrace;
mod peers;
mod skew;
pub mod units;

use std::{io::Write as _, path::PathBuf};

use anyhow::{Context, Result};
use tracing::info;

pub use mpitrace::{nothing_seen, render_text, write_mpitrace_dir};

use crate::profile::JobProfile;

/// Output format of a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Text for people (a profile in mpitrace's layout).
    Text,
    /// One JSON document (its fields: see the README).
    Json,
}

/// Where and how a profile is written (shared by `record` and `report`).
#[derive(clap::Args, Clone, Debug)]
pub struct Outputs {
    /// Output format (an HTML page with plots is --html FILE, beside either).
    #[arg(short, long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the profile to this file instead of standard output (`-`: standard output).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Also write the JSON profile to this file (whatever --format says).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write IBM mpitrace's `mpi_profile.<jobid>.<rank>` files into this directory.
    #[arg(long)]
    pub mpitrace_dir: Option<PathBuf>,
    /// Also write a one-file HTML report with plots into this file: message sizes, ranks'
    /// communication time, NCCL bus bandwidth, who is late, call durations, the peer
    /// matrix. No scripts and no network: it opens anywhere, JavaScript off.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// With --html: nccl-tests output whose out-of-place busbw the NCCL plot draws as the
    /// expected curve (buckets measured below --threshold of it are marked).
    #[arg(long, value_name = "FILE", requires = "html")]
    pub expected: Option<PathBuf>,
    /// Which table of --expected (1-based) when the file holds several.
    #[arg(long, value_name = "N", requires = "expected")]
    pub expected_table: Option<usize>,
    /// The NCCL routine --expected describes (default: the benchmark it names, e.g.
    /// all_reduce_perf is ncclAllReduce).
    #[arg(long, value_name = "ROUTINE", requires = "expected")]
    pub expected_op: Option<String>,
    /// With --expected: mark buckets measured below this fraction of the expected bus
    /// bandwidth.
    #[arg(long, default_value_t = 0.5, requires = "expected",
          value_parser = crate::compare::parse_threshold)]
    pub threshold: f64,
    /// With --expected: its in-place busbw, not the out-of-place (as `commtap compare
    /// --in-place`).
    #[arg(long, requires = "expected")]
    pub expected_in_place: bool,
}

/// Standard output's reader went away (`commtap ps | head`): the command ends quietly.
#[derive(Debug, thiserror::Error)]
#[error("standard output was closed")]
pub struct StdoutClosed;

/// Why a job has no MPI communication time, in the text and the HTML report alike.
const NO_MPI_COMMUNICATION: &str = "no rank called an MPI routine but MPI_Init and \
     MPI_Finalize (NCCL's operations run on the GPU: see the ranks' NCCL operations and \
     their device time)";

/// Writes `text` to standard output: [`StdoutClosed`] when its reader has gone, where
/// `print!` would panic (Rust ignores SIGPIPE).
pub fn to_stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        done => done.context("writing to standard output"),
    }
}

/// Writes `bytes` to `path`, created or truncated, never through a symlink: commtap runs
/// as root, and an output path in a shared directory (`/tmp/profile.json`) may have been
/// planted as a link to a file root owns.
pub fn write_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    create_file(path)?.write_all(bytes)
}

/// Creates (or truncates) the regular file `path` for writing, as [`write_file`] does:
/// never through a symbolic link, never blocking on a FIFO.
pub fn create_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    regular(path, |o| o.create(true).truncate(true))
}

/// Opens the regular file `path` for writing as [`create_file`] does, but leaves a file
/// that is there as it is (for the caller to truncate once it writes); says whether one
/// was there.
pub fn open_file(path: &std::path::Path) -> std::io::Result<(std::fs::File, bool)> {
    match regular(path, |o| o.create_new(true)) {
        Ok(f) => Ok((f, false)),
        // O_CREAT again (not truncating): the kernel's protected_regular refuses root a
        // file another user left in a sticky directory (/tmp) only on an O_CREAT open.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            regular(path, |o| o.create(true)).map(|f| (f, true))
        }
        Err(e) => Err(e),
    }
}

/// Opens `path` for writing with `how`'s flags, never through a symbolic link nor blocking
/// on a FIFO, and only if it is a regular file.
fn regular(
    path: &std::path::Path,
    how: impl FnOnce(&mut std::fs::OpenOptions) -> &mut std::fs::OpenOptions,
) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options
        .write(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    let file = how(&mut options).open(path).map_err(|e| {
        if e.raw_os_error() == Some(libc::ELOOP) {
            std::io::Error::other("it is a symbolic link, which commtap does not follow")
        } else {
            e
        }
    })?;
    let m = file.metadata()?;
    if !m.file_type().is_file() && !is_dev_null(&m) {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(file)
}

/// Whether `m` is the null device (character device 1:3, wherever it lies), the one file
/// besides regular ones commtap writes to: a profile nobody wants (`record -o /dev/null
/// --trace t.json`).
fn is_dev_null(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    m.file_type().is_char_device() && m.rdev() == libc::makedev(1, 3)
}

/// The directory `path` names its file in (`.` for a bare name).
pub fn directory_of(path: &std::path::Path) -> &std::path::Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => std::path::Path::new("."),
    }
}

/// Checks, before anything runs, that `path` can take a file commtap writes
/// ([`create_file`]): a regular file or none, in a directory that exists. A job of hours
/// must not end in "No such file or directory" with its profile lost.
pub fn check_writable(path: &std::path::Path) -> std::io::Result<()> {
    use nix::unistd::{access, AccessFlags};
    let refuse = |why: &str| Err(std::io::Error::other(why.to_string()));
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => {
            refuse("it is a symbolic link, which commtap does not follow")
        }
        Ok(m) if m.is_dir() => refuse("it is a directory; name a file"),
        Ok(m) if !m.is_file() && !is_dev_null(&m) => refuse("not a regular file"),
        Ok(_) => access(path, AccessFlags::W_OK).map_err(std::io::Error::from),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let dir = directory_of(path);
            match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() => {
                    access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
                        std::io::Error::other(format!("its directory {}: {e}", dir.display()))
                    })
                }
                Ok(_) => refuse(&format!("{} is not a directory", dir.display())),
                Err(_) => refuse(&format!("no directory {}", dir.display())),
            }
        }
        Err(e) => Err(e),
    }
}

impl Outputs {
    /// Checks every file and directory the profile is to be written to, and reads
    /// `--expected`, before the job runs: what would fail after it fails now, with nothing
    /// run and nothing lost.
    pub fn check(&self) -> Result<()> {
        let files = [
            ("-o", self.output_file()),
            ("--json", self.json.as_ref()),
            ("--html", self.html.as_ref()),
        ];
        for (flag, path) in files {
            if let Some(path) = path {
                check_writable(path).with_context(|| format!("{flag} {}", path.display()))?;
            }
        }
        if let Some(dir) = &self.mpitrace_dir {
            // Created at the end if missing (with its parents): the nearest that exists
            // must be a directory.
            let existing = dir
                .ancestors()
                .find(|a| !a.as_os_str().is_empty() && a.exists());
            if let Some(a) = existing.filter(|a| !a.is_dir()) {
                let which = if a == dir.as_path() {
                    "it".to_string()
                } else {
                    a.display().to_string()
                };
                anyhow::bail!(
                    "--mpitrace-dir {}: {which} is not a directory",
                    dir.display()
                );
            }
        }
        self.expected()?;
        Ok(())
    }

    /// The file `-o` names (None: standard output, `-o -` too).
    pub fn output_file(&self) -> Option<&PathBuf> {
        self.output.as_ref().filter(|p| p.as_os_str() != "-")
    }

    /// The expected NCCL curve of `--expected`, read now (a watch rereads it each time).
    fn expected(&self) -> Result<Option<html::Expected>> {
        let Some(path) = &self.expected else {
            return Ok(None);
        };
        let source = path.display().to_string();
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {source}"))?;
        let table = crate::compare::pick_table(&text, &source, self.expected_table)?;
        Ok(Some(html::Expected {
            op: crate::compare::resolve_op(self.expected_op.as_deref(), &table)?,
            curve: crate::compare::table_curve(
                &table,
                crate::compare::Placement::of(self.expected_in_place),
            )
            .with_context(|| source.clone())?,
            threshold: self.threshold,
            source,
        }))
    }

    /// Writes `profile` as asked.
    pub fn write(&self, profile: &JobProfile) -> Result<()> {
        self.write_files(profile, false, true).map(drop)
    }

    /// Writes the `n`th profile of a watch: on standard output, JSON as one line per
    /// profile (JSON lines, for `jq` and scripts) and text under a line saying when; files
    /// are rewritten each time, as [`Outputs::write`] does.
    pub fn write_watched(&self, profile: &JobProfile, n: u64) -> Result<()> {
        if self.output_file().is_some() {
            return self.write(profile);
        }
        let shown = match self.format {
            Format::Json => serde_json::to_string(profile)? + "\n",
            Format::Text => format!(
                "{}=== report {} at {} ===\n{}",
                if n == 0 { "" } else { "\n" },
                n + 1,
                humantime::format_rfc3339_seconds(std::time::SystemTime::now()),
                render_text(profile)
            ),
        };
        to_stdout(&shown)?;
        self.write_files(profile, false, false).map(drop)
    }

    /// Writes `profile` (a job with nothing recorded) as asked, except over files that are
    /// already there: an earlier run's profile is worth more than an empty one. Returns the
    /// files left as they were.
    pub fn write_unless_there(&self, profile: &JobProfile) -> Result<Vec<PathBuf>> {
        self.write_files(profile, true, true)
    }

    /// Writes what was asked, the main output (standard output or `-o`) only if `main`;
    /// none over a file that is there if `keep_existing`, which it returns.
    fn write_files(
        &self,
        profile: &JobProfile,
        keep_existing: bool,
        main: bool,
    ) -> Result<Vec<PathBuf>> {
        // A bad --expected stops everything before anything is written.
        let expected = self.expected()?;
        let mut kept = Vec::new();
        let mut to = |path: &PathBuf| {
            let there = keep_existing && std::fs::symlink_metadata(path).is_ok();
            if there {
                kept.push(path.clone());
            }
            !there
        };
        let json = || -> Result<String> { Ok(serde_json::to_string_pretty(profile)? + "\n") };
        // Standard output last: a reader gone (`| head`) must not cost the files.
        let mut to_print = None;
        if main {
            let text = match self.format {
                Format::Json => json()?,
                Format::Text => render_text(profile),
            };
            match self.output_file() {
                Some(path) if to(path) => write_file(path, text.as_bytes())
                    .with_context(|| format!("writing {}", path.display()))?,
                Some(_) => {}
                None => to_print = Some(text),
            }
        }
        if let Some(path) = self.json.as_ref().filter(|p| to(p)) {
            write_file(path, json()?.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if let Some(path) = self.html.as_ref().filter(|p| to(p)) {
            let html = html::render_html(profile, expected.as_ref());
            write_file(path, html.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        if let Some(dir) = &self.mpitrace_dir {
            let files = write_mpitrace_dir(profile, dir)
                .with_context(|| format!("writing mpitrace files to {}", dir.display()))?;
            info!(
                "wrote {} mpitrace profile files to {}",
                files.len(),
                dir.display()
            );
        }
        if let Some(text) = to_print {
            to_stdout(&text)?;
        }
        Ok(kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        out: Outputs,
    }

    /// `-o -` is standard output, as for most tools; any other name is a file.
    #[test]
    fn a_dash_names_standard_output() {
        let out = |args: &[&str]| Cli::parse_from([&["t"], args].concat()).out;
        assert_eq!(out(&["-o", "-"]).output_file(), None);
        assert_eq!(out(&[]).output_file(), None);
        assert_eq!(
            out(&["-o", "./-"]).output_file(),
            Some(&PathBuf::from("./-"))
        );
        assert!(out(&["-o", "-"]).check().is_ok());
    }

    /// The null device takes a profile nobody wants; no other device is written to.
    #[test]
    fn the_null_device_is_the_one_device_written_to() {
        let null = std::path::Path::new("/dev/null");
        assert!(check_writable(null).is_ok());
        assert!(create_file(null).is_ok());
        let zero = std::path::Path::new("/dev/zero");
        assert!(check_writable(zero).is_err());
        assert!(create_file(zero).is_err());
    }
}
