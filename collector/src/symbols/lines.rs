//! Source lines of call sites: a file's DWARF line tables (a program built with `-g`), read
//! once with its symbols, so that a site reads `negotiate+0x51 at ddp.c:31`, as mpitrace's
//! profile by call site and `addr2line` give it. The line of inlined code is the inlined
//! source's (the line table's own rows), so a call inlined into `main` still has its line.
//!
//! The file is any user's: its sections are read through the file's bounded reads, the
//! rows kept are capped, and a table past a cap is dropped whole (never a partial one,
//! whose last sequence would run on over code it does not describe).

use std::collections::HashMap;

use object::{CompressionFormat, Object, ObjectSection};

use super::Elf;

/// Most line rows kept of one file (16 bytes each).
const MAX_ROWS: usize = 4 << 20;
/// Most distinct source files named by one file's rows.
const MAX_FILES: usize = 1 << 16;
/// Longest source path kept.
const MAX_PATH: usize = 512;

/// A row's file where the row ends a sequence: addresses from it on have no line.
const NO_FILE: u32 = u32::MAX;

/// The files' byte order (x86-64's).
const LE: gimli::LittleEndian = gimli::LittleEndian;

/// A section's bytes, as gimli reads them.
type Slice<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// A file's address-to-line table.
#[derive(Debug, Default)]
pub struct Lines {
    /// Address, source file (index in `files`, or [`NO_FILE`]), line (0: none); sorted.
    rows: Vec<(u64, u32, u32)>,
    files: Vec<Box<str>>,
}

impl Lines {
    /// The line tables of `elf`, or `None` where it has none (no `-g`), compressed ones,
    /// tables past the caps, or any it cannot read.
    ///
    /// Read from `.debug_line` alone, program after program, without the units of
    /// `.debug_info` (often the largest section, past the file's read caps in a large C++
    /// program): so a path is as the line table names it, relative to the compilation's
    /// directory in DWARF 4 (`src/halo.c`), whole in DWARF 5.
    pub fn read(elf: &Elf) -> Option<Lines> {
        if !elf.is_little_endian() {
            return None;
        }
        let section = |name: &str| -> Option<&[u8]> {
            let s = elf.section_by_name(name)?;
            let plain = s
                .compressed_file_range()
                .is_ok_and(|r| r.format == CompressionFormat::None);
            plain.then(|| s.data().ok()).flatten()
        };
        let data = section(".debug_line")?;
        let strings = Strings {
            line: gimli::DebugLineStr::new(section(".debug_line_str").unwrap_or(&[]), LE),
            str: gimli::DebugStr::new(section(".debug_str").unwrap_or(&[]), LE),
        };
        let debug_line = gimli::DebugLine::new(data, LE);
        let mut lines = Lines::default();
        let mut interned: HashMap<String, u32> = HashMap::new();
        let mut at = 0usize;
        while at < data.len() {
            let program = debug_line
                .program(gimli::DebugLineOffset(at), 8, None, None)
                .ok()?;
            let header = program.header();
            let next = at
                .checked_add(header.unit_length())?
                .checked_add(usize::from(header.format().initial_length_size()))?;
            lines.add_rows(program, &strings, &mut interned)?;
            if next <= at {
                return None;
            }
            at = next;
        }
        // Stable: within one address, a sequence's end before the next one's start keeps
        // the start's line.
        lines
            .rows
            .sort_by_key(|(a, f, _)| (*a, u8::from(*f != NO_FILE)));
        Some(lines)
    }

    /// The rows of one line program; `None` where unreadable or past the caps.
    fn add_rows(
        &mut self,
        program: gimli::IncompleteLineProgram<Slice<'_>>,
        strings: &Strings<'_>,
        interned: &mut HashMap<String, u32>,
    ) -> Option<()> {
        // The program's file indices, interned once each.
        let mut program_files: HashMap<u64, u32> = HashMap::new();
        let mut rows = program.rows();
        // Whether the sequence being read is kept: one starting at address 0 is code the
        // linker dropped, which would otherwise cover the program's first pages.
        let mut kept = None;
        // The last row kept: a row of the same file and line (another column) adds nothing.
        let mut last = (NO_FILE, 0);
        while let Some((header, row)) = rows.next_row().ok()? {
            let keep = *kept.get_or_insert(row.address() != 0);
            if row.end_sequence() {
                if keep {
                    self.rows.push((row.address(), NO_FILE, 0));
                }
                (kept, last) = (None, (NO_FILE, 0));
                continue;
            }
            if !keep {
                continue;
            }
            let file = if let Some(f) = program_files.get(&row.file_index()) {
                *f
            } else {
                let path = row
                    .file(header)
                    .map(|f| strings.path(header, f))
                    .unwrap_or_default();
                let next = u32::try_from(interned.len()).ok()?;
                let f = *interned.entry(path.clone()).or_insert_with(|| {
                    self.files.push(path.into_boxed_str());
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
            last = (file, line);
            self.rows.push((row.address(), file, line));
            if self.rows.len() > MAX_ROWS || self.files.len() > MAX_FILES {
                tracing::debug!("line tables past their cap: call sites without lines");
                return None;
            }
        }
        Some(())
    }

    /// The source file and line of the instruction at `address` (file-relative).
    pub fn at(&self, address: u64) -> Option<(&str, u32)> {
        let i = self.rows.partition_point(|(a, ..)| *a <= address);
        let (_, file, line) = *self.rows.get(i.checked_sub(1)?)?;
        if line == 0 || file == NO_FILE {
            return None;
        }
        Some((self.files.get(file as usize)?, line))
    }

    /// The memory it holds, about.
    pub fn bytes(&self) -> u64 {
        let names: usize = self.files.iter().map(|f| f.len()).sum();
        (self.rows.len() * size_of::<(u64, u32, u32)>()
            + self.files.len() * size_of::<Box<str>>()
            + names) as u64
    }
}

/// The sections a line table's names are in (DWARF 5 names its files by offset in them).
struct Strings<'a> {
    line: gimli::DebugLineStr<Slice<'a>>,
    str: gimli::DebugStr<Slice<'a>>,
}

impl Strings<'_> {
    /// A name a line table gives.
    fn text(&self, v: gimli::AttributeValue<Slice<'_>>) -> Option<String> {
        let s = match v {
            gimli::AttributeValue::String(s) => s,
            gimli::AttributeValue::DebugLineStrRef(o) => self.line.get_str(o).ok()?,
            gimli::AttributeValue::DebugStrRef(o) => self.str.get_str(o).ok()?,
            _ => return None,
        };
        Some(s.to_string_lossy().into_owned())
    }

    /// A line table's file as a path: its directory's, unless absolute; printable and cut.
    fn path(
        &self,
        header: &gimli::LineProgramHeader<Slice<'_>>,
        file: &gimli::FileEntry<Slice<'_>>,
    ) -> String {
        let name = self.text(file.path_name()).unwrap_or_default();
        let path = match file.directory(header).and_then(|d| self.text(d)) {
            Some(dir) if !name.starts_with('/') && !dir.is_empty() => format!("{dir}/{name}"),
            _ => name,
        };
        crate::client::printable(&path)
            .chars()
            .take(MAX_PATH)
            .collect()
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
                (0x2004, NO_FILE, 0),
            ],
            files: vec!["/src/a.c".into(), "/src/b.c".into()],
        };
        assert_eq!(lines.at(0xfff), None);
        assert_eq!(lines.at(0x1000), Some(("/src/a.c", 10)));
        assert_eq!(lines.at(0x100f), Some(("/src/a.c", 11)));
        // Between sequences: no line.
        assert_eq!(lines.at(0x1010), None);
        assert_eq!(lines.at(0x1fff), None);
        assert_eq!(lines.at(0x2003), Some(("/src/b.c", 5)));
        assert_eq!(lines.at(0x2004), None);
    }
}
