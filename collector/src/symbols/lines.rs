//! Source lines of call sites: a file's DWARF line tables (a program built with `-g`), read
//! once with its symbols, so that a site reads `negotiate+0x51 at ddp.c:31`, as mpitrace's
//! profile by call site and `addr2line` give it. The line of inlined code is the inlined
//! source's (the line table's own rows), so a call inlined into `main` still has its line.
//!
//! The file is any user's, read by root: its sections come through the file's bounded
//! reads; a line program whose header is larger than any compiler writes, or that defines
//! files as it runs (DWARF 2-4's `DW_LNE_define_file`, which no compiler emits now), is
//! skipped before gimli builds anything of it (each file entry is some 90 bytes in
//! memory, from as little as one byte in the file); names in the string sections are read
//! at most [`MAX_NAME_READ`] bytes each, once each, and [`MAX_SCANNED`] bytes in all; the
//! rows kept are capped, and a table past a cap is dropped whole.

use std::{cell::OnceCell, collections::HashMap};

use object::{CompressionFormat, Object, ObjectSection};

use super::Elf;

/// Most line rows kept of one file (16 bytes each).
const MAX_ROWS: usize = 4 << 20;
/// Most distinct source files named by one file's rows.
const MAX_FILES: usize = 1 << 16;
/// Largest line program header read (its directories and files): a C++ unit including
/// thousands of headers takes tens of KiB.
const MAX_HEADER: u64 = 256 << 10;
/// Most bytes of a string section looked at for one name.
const MAX_NAME_READ: usize = 4 * super::MAX_PATH;
/// Most bytes of the string sections looked at for one file's names, in all.
const MAX_SCANNED: usize = 64 << 20;

/// A row's file where the row ends a sequence: addresses from it on have no line.
const NO_FILE: u32 = u32::MAX;

/// The files' byte order (x86-64's).
const LE: gimli::LittleEndian = gimli::LittleEndian;

/// A section's bytes, as gimli reads them.
type Slice<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// A file's address-to-line table.
#[derive(Debug, Default)]
pub struct Lines {
    /// Address, source file (index in `files`, or [`NO_FILE`]), line (0: none); sorted,
    /// each sequence's rows then its end.
    rows: Vec<(u64, u32, u32)>,
    files: Vec<Box<str>>,
}

/// One sequence of rows while the table is read: its start and end addresses and its rows'
/// place in the rows read.
struct Sequence {
    start: u64,
    end: u64,
    rows: std::ops::Range<usize>,
}

impl Lines {
    /// The line tables of `elf`, or `None` where it has none (no `-g`), compressed ones,
    /// tables past the caps, or any it cannot read.
    ///
    /// Read from `.debug_line` alone, program after program, without the units of
    /// `.debug_info` (often the largest section, past the file's read caps in a large C++
    /// program): so a path is as the line table names it (with its directory, which is
    /// the compilation's in DWARF 5 and absent for the compilation's own in DWARF 4).
    pub fn read(elf: &Elf) -> Option<Lines> {
        if !elf.is_little_endian() {
            return None;
        }
        let data = plain_section(elf, ".debug_line")?;
        let mut strings = Strings {
            elf,
            line: OnceCell::new(),
            str: OnceCell::new(),
            names: HashMap::new(),
            scanned: 0,
        };
        let mut reading = Reading::default();
        let debug_line = gimli::DebugLine::new(data, LE);
        let mut at = 0usize;
        while at < data.len() {
            let (length, header_fits) = unit_extent(data.get(at..)?)?;
            let next = at.checked_add(length)?;
            if header_fits {
                let program = debug_line
                    .program(gimli::DebugLineOffset(at), 8, None, None)
                    .ok()?;
                if !defines_files(&program)? {
                    reading.add_rows(program, &mut strings)?;
                }
            }
            at = next;
        }
        Some(reading.finish())
    }

    /// The source file and line of the instruction at `address` (file-relative).
    pub fn at(&self, address: u64) -> Option<(&str, u32)> {
        let i = self.rows.partition_point(|(a, ..)| *a <= address);
        let (_, file, line) = *self.rows.get(i.checked_sub(1)?)?;
        if line == 0 || file == NO_FILE {
            return None;
        }
        let file = self.files.get(file as usize)?;
        (!file.is_empty()).then_some((file, line))
    }

    /// The memory it holds, about.
    pub fn bytes(&self) -> u64 {
        let names: usize = self.files.iter().map(|f| f.len()).sum();
        (self.rows.capacity() * size_of::<(u64, u32, u32)>()
            + self.files.capacity() * size_of::<Box<str>>()
            + names) as u64
    }
}

/// `name`'s bytes where the section is there and not compressed.
fn plain_section<'a>(elf: &Elf<'a>, name: &str) -> Option<&'a [u8]> {
    let s = elf.section_by_name(name)?;
    let plain = s
        .compressed_file_range()
        .is_ok_and(|r| r.format == CompressionFormat::None);
    plain.then(|| s.data().ok()).flatten()
}

/// The length of the line program at the start of `unit` (its initial length included),
/// and whether its header is at most [`MAX_HEADER`] bytes: read here, before gimli parses
/// and keeps its directories and files.
fn unit_extent(unit: &[u8]) -> Option<(usize, bool)> {
    let word = |at: usize, n: usize| -> Option<u64> {
        let b = unit.get(at..at.checked_add(n)?)?;
        Some(b.iter().rev().fold(0u64, |v, &x| (v << 8) | u64::from(x)))
    };
    let (length, offset_size, at) = match word(0, 4)? {
        0xffff_ffff => (word(4, 8)?, 8, 12),
        l if l >= 0xffff_fff0 => return None,
        l => (l, 4, 4),
    };
    let total = usize::try_from(length).ok()?.checked_add(at)?;
    let version = word(at, 2)?;
    // DWARF 5 puts the address and segment selector sizes before the header's length.
    let header_length_at = if version >= 5 { at + 4 } else { at + 2 };
    let header_length = word(header_length_at, offset_size)?;
    Some((total, header_length <= MAX_HEADER))
}

/// Whether `program` defines files as it runs (which would grow its file list with every
/// such instruction); `None` where its instructions cannot be read.
fn defines_files(program: &gimli::IncompleteLineProgram<Slice<'_>>) -> Option<bool> {
    let header = program.header();
    let mut instructions = header.instructions();
    while let Some(i) = instructions.next_instruction(header).ok()? {
        if matches!(i, gimli::LineInstruction::DefineFile(_)) {
            return Some(true);
        }
    }
    Some(false)
}

/// A table being read.
#[derive(Default)]
struct Reading {
    /// Every sequence's rows, as read.
    read: Vec<(u64, u32, u32)>,
    sequences: Vec<Sequence>,
    files: Vec<Box<str>>,
    /// Paths already among `files`.
    interned: HashMap<String, u32>,
}

impl Reading {
    /// The rows of one line program; `None` where unreadable or past the caps.
    fn add_rows(
        &mut self,
        program: gimli::IncompleteLineProgram<Slice<'_>>,
        strings: &mut Strings<'_, '_>,
    ) -> Option<()> {
        // The program's file indices, interned once each.
        let mut program_files: HashMap<u64, u32> = HashMap::new();
        let mut rows = program.rows();
        let mut start = None;
        // The last row kept: a row of the same file and line (another column) adds nothing.
        let mut last = (NO_FILE, 0);
        while let Some((header, row)) = rows.next_row().ok()? {
            let (from, begin) = *start.get_or_insert((self.read.len(), row.address()));
            if row.end_sequence() {
                self.sequences.push(Sequence {
                    start: begin,
                    end: row.address(),
                    rows: from..self.read.len(),
                });
                (start, last) = (None, (NO_FILE, 0));
                continue;
            }
            let file = if let Some(f) = program_files.get(&row.file_index()) {
                *f
            } else {
                let path = row
                    .file(header)
                    .and_then(|f| strings.path(header, f))
                    .unwrap_or_default();
                let next = u32::try_from(self.files.len()).ok()?;
                let files = &mut self.files;
                let f = *self.interned.entry(path).or_insert_with_key(|path| {
                    files.push(path.clone().into_boxed_str());
                    next
                });
                program_files.insert(row.file_index(), f);
                f
            };
            let line = row
                .line()
                .map_or(0, |l| u32::try_from(l.get()).unwrap_or(0));
            if (file, line) == last {
                continue;
            }
            if self.read.len() >= MAX_ROWS || self.files.len() > MAX_FILES {
                tracing::debug!("line tables past their cap: call sites without lines");
                return None;
            }
            last = (file, line);
            self.read.push((row.address(), file, line));
        }
        Some(())
    }

    /// The table: sequences by address, each's rows then its end. A sequence that is
    /// empty, starts at 0 (code the linker dropped, which would cover the program's first
    /// pages) or overlaps one before it (identical code folded, or dropped code at a
    /// relocation's addend) is left out: an address has one line or none.
    fn finish(mut self) -> Lines {
        self.sequences.retain(|s| s.start != 0 && s.end > s.start);
        self.sequences.sort_by_key(|s| s.start);
        let mut rows = Vec::with_capacity(self.read.len() + self.sequences.len());
        let mut covered = 0;
        for s in &self.sequences {
            if s.start < covered {
                continue;
            }
            rows.extend(
                self.read[s.rows.clone()]
                    .iter()
                    .filter(|(a, ..)| (s.start..s.end).contains(a)),
            );
            rows.push((s.end, NO_FILE, 0));
            covered = s.end;
        }
        rows.shrink_to_fit();
        self.files.shrink_to_fit();
        Lines {
            rows,
            files: self.files,
        }
    }
}

/// The sections a line table's names are in (DWARF 5 names its files by offset in them),
/// each read on its first use.
struct Strings<'a, 'data> {
    elf: &'a Elf<'data>,
    line: OnceCell<&'data [u8]>,
    str: OnceCell<&'data [u8]>,
    /// Names read, by section (`true`: `.debug_line_str`) and offset.
    names: HashMap<(bool, usize), String>,
    /// Bytes of the string sections looked at.
    scanned: usize,
}

impl Strings<'_, '_> {
    /// A name a line table gives (none past the scanning bound).
    fn text(&mut self, v: gimli::AttributeValue<Slice<'_>>) -> Option<String> {
        let (in_line_str, offset) = match v {
            gimli::AttributeValue::String(s) => {
                let s = s.slice();
                return Some(String::from_utf8_lossy(&s[..s.len().min(MAX_NAME_READ)]).into());
            }
            gimli::AttributeValue::DebugLineStrRef(o) => (true, o.0),
            gimli::AttributeValue::DebugStrRef(o) => (false, o.0),
            _ => return None,
        };
        if let Some(name) = self.names.get(&(in_line_str, offset)) {
            return Some(name.clone());
        }
        let (cell, section) = if in_line_str {
            (&self.line, ".debug_line_str")
        } else {
            (&self.str, ".debug_str")
        };
        let data = *cell.get_or_init(|| plain_section(self.elf, section).unwrap_or(&[]));
        let from = data.get(offset..)?;
        let window = &from[..from.len().min(MAX_NAME_READ)];
        self.scanned += window.len();
        if self.scanned > MAX_SCANNED {
            return None;
        }
        let end = memchr::memchr(0, window).unwrap_or(window.len());
        let name = String::from_utf8_lossy(&window[..end]).into_owned();
        self.names.insert((in_line_str, offset), name.clone());
        Some(name)
    }

    /// A line table's file as a path: its directory's, unless absolute; printable and cut.
    fn path(
        &mut self,
        header: &gimli::LineProgramHeader<Slice<'_>>,
        file: &gimli::FileEntry<Slice<'_>>,
    ) -> Option<String> {
        let name = self.text(file.path_name())?;
        let path = match file.directory(header).and_then(|d| self.text(d)) {
            Some(dir) if !name.starts_with('/') && !dir.is_empty() => format!("{dir}/{name}"),
            _ => name,
        };
        Some(super::shown(&path, super::MAX_PATH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_has_the_line_of_the_row_holding_it() {
        let lines = Lines {
            rows: vec![
                (0x1000, 0, 10),
                (0x1008, 0, 11),
                (0x1010, NO_FILE, 0),
                (0x2000, 1, 5),
                (0x2002, 2, 6),
                (0x2004, NO_FILE, 0),
            ],
            files: vec!["/src/a.c".into(), "/src/b.c".into(), String::new().into()],
        };
        assert_eq!(lines.at(0xfff), None);
        assert_eq!(lines.at(0x1000), Some(("/src/a.c", 10)));
        assert_eq!(lines.at(0x100f), Some(("/src/a.c", 11)));
        // Between sequences: no line.
        assert_eq!(lines.at(0x1010), None);
        assert_eq!(lines.at(0x1fff), None);
        assert_eq!(lines.at(0x2001), Some(("/src/b.c", 5)));
        // A file without a name: no line.
        assert_eq!(lines.at(0x2003), None);
        assert_eq!(lines.at(0x2004), None);
    }

    /// Sequences as a linker leaves them: one folded onto another's code, an empty one,
    /// one at 0, one ending where the next starts.
    #[test]
    fn overlapping_empty_and_dropped_sequences_are_left_out() {
        let reading = Reading {
            read: vec![
                (0x1000, 0, 10),
                (0x1008, 0, 11),
                // Folded onto 0x1000..0x1010: left out.
                (0x1004, 0, 90),
                // Empty.
                (0x3000, 0, 70),
                // At 0.
                (0x0, 0, 50),
                (0x10, 0, 51),
                // Starts where the first ends.
                (0x1010, 0, 20),
            ],
            sequences: vec![
                Sequence {
                    start: 0x1000,
                    end: 0x1010,
                    rows: 0..2,
                },
                Sequence {
                    start: 0x1004,
                    end: 0x1020,
                    rows: 2..3,
                },
                Sequence {
                    start: 0x3000,
                    end: 0x3000,
                    rows: 3..4,
                },
                Sequence {
                    start: 0,
                    end: 0x2000,
                    rows: 4..6,
                },
                Sequence {
                    start: 0x1010,
                    end: 0x1018,
                    rows: 6..7,
                },
            ],
            files: vec!["/src/a.c".into()],
            interned: HashMap::new(),
        };
        let lines = reading.finish();
        assert_eq!(lines.at(0x10), None);
        assert_eq!(lines.at(0x1004), Some(("/src/a.c", 10)));
        assert_eq!(lines.at(0x1009), Some(("/src/a.c", 11)));
        assert_eq!(lines.at(0x1010), Some(("/src/a.c", 20)));
        assert_eq!(lines.at(0x1018), None);
        assert_eq!(lines.at(0x3000), None);
    }

    #[test]
    fn a_units_extent_is_read_before_its_header() {
        // DWARF 4: unit length 100, version 4, header length 30.
        let mut v4 = vec![100, 0, 0, 0, 4, 0, 30, 0, 0, 0];
        v4.resize(104, 0);
        assert_eq!(unit_extent(&v4), Some((104, true)));
        // DWARF 5 (address and selector sizes first), a header past the bound.
        let big = u32::try_from(MAX_HEADER + 1).expect("small").to_le_bytes();
        let v5 = [&[100, 0, 0, 0, 5, 0, 8, 0][..], &big].concat();
        assert_eq!(unit_extent(&v5), Some((104, false)));
        // 64-bit DWARF.
        let mut d64 = vec![0xff, 0xff, 0xff, 0xff, 50, 0, 0, 0, 0, 0, 0, 0, 3, 0];
        d64.extend([10, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(unit_extent(&d64), Some((62, true)));
        // Truncated, reserved lengths.
        assert_eq!(unit_extent(&[1, 0]), None);
        assert_eq!(unit_extent(&[0xf0, 0xff, 0xff, 0xff, 4, 0]), None);
    }
}
