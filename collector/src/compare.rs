//! `commtap compare`: a job's measured NCCL bus bandwidth per size bucket against what the
//! cluster can do, as an nccl-tests / rccl-tests run printed it.
//!
//! nccl-tests prints, per message size, `size count type redop root time algbw busbw
//! #wrong` for the out-of-place run, then the same for in-place. The out-of-place busbw is
//! the curve, or the in-place one where asked (PyTorch DDP's AllReduces are in place); the
//! measured side is a commtap profile's device time (see README "NCCL device time") or
//! another nccl-tests table.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use collector_common::{
    buckets::{bucket_range, RangeLabel},
    size_bucket,
};
use serde::Serialize;

use crate::profile::JobProfile;

/// One row of an nccl-tests table (out-of-place figures).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Message size in bytes (nccl-tests' "size").
    pub size: u64,
    /// Elements.
    pub count: u64,
    /// Datatype name as printed.
    pub dtype: String,
    /// Out-of-place time, microseconds.
    pub time_us: f64,
    /// Out-of-place algorithm bandwidth, GB/s.
    pub algbw: f64,
    /// Out-of-place bus bandwidth, GB/s.
    pub busbw: f64,
    /// In-place bus bandwidth, GB/s, where the row has the in-place columns.
    pub in_place_busbw: Option<f64>,
}

/// Which of an nccl-tests row's runs a curve is made of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// Separate send and receive buffers (the first columns).
    #[default]
    OutOfPlace,
    /// The result written over the input (the last columns).
    InPlace,
}

impl Placement {
    /// In place where `in_place` (an `--in-place` flag), else out of place.
    pub fn of(in_place: bool) -> Placement {
        if in_place {
            Placement::InPlace
        } else {
            Placement::OutOfPlace
        }
    }
}

/// A table of an nccl-tests output, with the operation its command line names.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    /// The NCCL routine, if the text names the benchmark (`all_reduce_perf` ...).
    pub op: Option<&'static str>,
    /// Rows in the order printed.
    pub rows: Vec<Row>,
}

/// nccl-tests benchmark names and the NCCL routine each measures.
const BENCHMARKS: &[(&str, &str)] = &[
    ("all_reduce_perf", "ncclAllReduce"),
    ("all_gather_perf", "ncclAllGather"),
    ("reduce_scatter_perf", "ncclReduceScatter"),
    ("broadcast_perf", "ncclBroadcast"),
    ("reduce_perf", "ncclReduce"),
    ("alltoall_perf", "ncclAlltoAll"),
    ("gather_perf", "ncclGather"),
    ("scatter_perf", "ncclScatter"),
    ("sendrecv_perf", "ncclSend"),
];

/// The benchmark a line names, if any (the longest name wins: `reduce_perf` is a suffix of
/// `all_reduce_perf`).
fn benchmark_in(line: &str) -> Option<&'static str> {
    line.split(|c: char| c.is_whitespace() || c == '/')
        .find_map(|word| BENCHMARKS.iter().find(|(b, _)| word == *b))
        .map(|(_, op)| *op)
}

/// A data row, if `line` is one: `size count type redop [root] time algbw busbw ...`.
fn parse_row(line: &str) -> Option<Row> {
    let t: Vec<&str> = line.split_whitespace().collect();
    let size: u64 = t.first()?.parse().ok()?;
    let count: u64 = t.get(1)?.parse().ok()?;
    let dtype = *t.get(2)?;
    if !dtype.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || dtype.parse::<f64>().is_ok()
    {
        return None;
    }
    // nccl-tests 2.x prints a root column (-1 when none); older versions do not. Told by
    // the row's length where it is a whole row (with the in-place run or without): a time
    // of 10,000 us or more is printed as an integer, which a root column looks like.
    let first = match t.len() {
        9 | 13 => 5,
        8 | 12 => 4,
        _ if t.get(4)?.parse::<i64>().is_ok() => 5,
        _ => 4,
    };
    let num = |i: usize| -> Option<f64> { t.get(first + i)?.parse().ok() };
    Some(Row {
        size,
        count,
        dtype: dtype.to_string(),
        time_us: num(0)?,
        algbw: num(1)?,
        busbw: num(2)?,
        // After the out-of-place #wrong (a count, or N/A): in-place time, algbw, busbw.
        in_place_busbw: num(6),
    })
}

/// Every table in an nccl-tests output (or a document quoting several).
pub fn parse_tables(text: &str) -> Vec<Table> {
    let mut tables = Vec::new();
    let mut op = None;
    let mut rows: Vec<Row> = Vec::new();
    for line in text.lines() {
        if let Some(row) = parse_row(line) {
            rows.push(row);
            continue;
        }
        if !rows.is_empty() {
            tables.push(Table {
                op,
                rows: std::mem::take(&mut rows),
            });
            op = None;
        }
        if let Some(b) = benchmark_in(line) {
            op = Some(b);
        }
    }
    if !rows.is_empty() {
        tables.push(Table { op, rows });
    }
    tables
}

/// Picks table `index` (1-based) of `file`, or its only one.
pub fn pick_table(text: &str, file: &str, index: Option<usize>) -> Result<Table> {
    let mut tables = parse_tables(text);
    if tables.is_empty() {
        bail!(
            "{file}: no nccl-tests table (rows of `size count type redop root time algbw busbw`)"
        );
    }
    match index {
        None if tables.len() == 1 => Ok(tables.remove(0)),
        None => bail!(
            "{file} holds {} nccl-tests tables: pick one with --expected-table N (or, for \
             --measured, --measured-table N), N from 1 to {}",
            tables.len(),
            tables.len()
        ),
        Some(i) if i >= 1 && i <= tables.len() => Ok(tables.remove(i - 1)),
        Some(i) => bail!("{file}: no table {i} (it holds {})", tables.len()),
    }
}

/// Parses a `--threshold`: a fraction of the expected bandwidth, in (0, 1].
pub fn parse_threshold(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t > 0.0 && t <= 1.0 => Ok(t),
        _ => Err(format!("{s:?}: expected a fraction in (0, 1], e.g. 0.5")),
    }
}

/// Bus bandwidth per commtap size bucket (GB/s).
pub type Curve = BTreeMap<u8, f64>;

/// A table's curve: the mean busbw of its rows' `placement` runs in each bucket; an error
/// where in place is asked of a table printed without it.
pub fn table_curve(table: &Table, placement: Placement) -> Result<Curve> {
    let mut sums: BTreeMap<u8, (f64, u32)> = BTreeMap::new();
    for r in &table.rows {
        let busbw = match placement {
            Placement::OutOfPlace => r.busbw,
            Placement::InPlace => r.in_place_busbw.with_context(|| {
                format!(
                    "the table's row of {} bytes has no in-place busbw (nccl-tests prints \
                     the in-place run after the out-of-place one; this row has one run \
                     only): its out-of-place figures are read without the in-place option",
                    r.size
                )
            })?,
        };
        let e = sums.entry(size_bucket(r.size)).or_default();
        e.0 += busbw;
        e.1 += 1;
    }
    Ok(sums
        .into_iter()
        .map(|(b, (sum, n))| (b, sum / f64::from(n)))
        .collect())
}

/// A profile's curve for routine `op`: bus bytes over device time, all ranks together, in
/// each bucket where device time was measured on communicators of known size.
pub fn profile_curve(profile: &JobProfile, op: &str) -> Curve {
    let mut sums: BTreeMap<u8, (u64, u64)> = BTreeMap::new();
    // The operation and its per-call-config variant (ncclAllReduceConfig) move the same data.
    let names = [op.to_string(), format!("{op}Config")];
    for stats in profile
        .ranks
        .iter()
        .flat_map(|r| names.iter().filter_map(|n| r.routines.get(n)))
    {
        for b in &stats.sizes {
            let (Some(bucket), Some(d)) = (b.bucket, b.device) else {
                continue;
            };
            if let Some(bus) = d.bus_bytes {
                let e = sums.entry(bucket).or_default();
                e.0 += bus;
                e.1 += d.time_ns;
            }
        }
    }
    sums.into_iter()
        .filter(|(_, (_, ns))| *ns > 0)
        .map(|(b, (bus, ns))| (b, bus as f64 / ns as f64))
        .collect()
}

/// One size bucket compared.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BucketComparison {
    /// Smallest byte count of the bucket.
    pub min_bytes: u64,
    /// Largest byte count of the bucket.
    pub max_bytes: u64,
    /// Expected bus bandwidth, GB/s.
    pub expected_busbw: f64,
    /// Measured bus bandwidth, GB/s.
    pub measured_busbw: f64,
    /// measured / expected.
    pub ratio: f64,
    /// The measured figure is below `threshold` x expected.
    pub below: bool,
}

/// The comparison of a job (or run) with the expected curve.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// The NCCL routine compared.
    pub op: String,
    /// Fraction of the expected bus bandwidth below which a bucket is flagged.
    pub threshold: f64,
    /// Buckets both sides have, smallest first.
    pub buckets: Vec<BucketComparison>,
    /// Buckets measured but absent from the expected table (bytes ranges).
    pub not_in_expected: Vec<(u64, u64)>,
    /// The tables' in-place figures were read (else the out-of-place).
    pub in_place: bool,
}

impl Comparison {
    /// Whether any bucket is below the threshold.
    pub fn any_below(&self) -> bool {
        self.buckets.iter().any(|b| b.below)
    }
}

/// Compares `measured` with `expected` bucket by bucket.
pub fn compare(op: &str, expected: &Curve, measured: &Curve, threshold: f64) -> Comparison {
    let mut buckets = Vec::new();
    let mut not_in_expected = Vec::new();
    for (&b, &m) in measured {
        let (lo, hi) = bucket_range(b);
        match expected.get(&b) {
            Some(&e) if e > 0.0 => buckets.push(BucketComparison {
                min_bytes: lo,
                max_bytes: hi,
                expected_busbw: e,
                measured_busbw: m,
                ratio: m / e,
                below: m < threshold * e,
            }),
            _ => not_in_expected.push((lo, hi)),
        }
    }
    Comparison {
        op: op.to_string(),
        threshold,
        buckets,
        not_in_expected,
        in_place: false,
    }
}

/// The comparison as a table for people.
pub fn render(c: &Comparison) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{}: measured bus bandwidth against expected{}, flagged below {:.0}% of it",
        c.op,
        if c.in_place { " (in place)" } else { "" },
        c.threshold * 100.0
    );
    let _ = writeln!(
        o,
        "{:>24}{:>16}{:>16}{:>8}",
        "size range (bytes)", "expected(GB/s)", "measured(GB/s)", "ratio"
    );
    let range = |lo: u64, hi: u64| RangeLabel { lo, hi }.to_string();
    for b in &c.buckets {
        let _ = writeln!(
            o,
            "{:>24}{:>16.2}{:>16.2}{:>7.0}%{}",
            range(b.min_bytes, b.max_bytes),
            b.expected_busbw,
            b.measured_busbw,
            b.ratio * 100.0,
            if b.below { "  BELOW" } else { "" }
        );
    }
    for (lo, hi) in &c.not_in_expected {
        let _ = writeln!(
            o,
            "{:>24}  measured, but not in the expected table",
            range(*lo, *hi)
        );
    }
    let below = c.buckets.iter().filter(|b| b.below).count();
    let _ = writeln!(
        o,
        "{below} of {} size buckets below {:.0}% of the expected bus bandwidth.",
        c.buckets.len(),
        c.threshold * 100.0
    );
    o
}

/// The routine to compare: `--op`, else what the expected table's text names.
pub fn resolve_op(op: Option<&str>, expected: &Table) -> Result<String> {
    if let Some(op) = op {
        if !BENCHMARKS.iter().any(|(_, o)| *o == op) {
            bail!(
                "--op {op}: not an NCCL collective nccl-tests measures (one of {})",
                BENCHMARKS
                    .iter()
                    .map(|(_, o)| *o)
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        return Ok(op.to_string());
    }
    expected.op.map(str::to_string).context(
        "the expected table's text names no nccl-tests benchmark (all_reduce_perf ...): give --op",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_with_and_without_root_and_blank_columns() {
        let r = parse_row("\t65536\t16384\tfloat\tsum\t-1\t37.54\t1.75\t3.06\t0\t34.53").unwrap();
        assert_eq!(
            (r.size, r.count, r.time_us, r.busbw, r.in_place_busbw),
            (65536, 16384, 37.54, 3.06, None)
        );
        // The whole row: in place last; #wrong may be N/A (nccl-tests -c 0).
        let r =
            parse_row("1048576 262144 float sum -1 101.7 10.31 18.05 N/A 101.4 10.34 18.10 N/A")
                .unwrap();
        assert_eq!((r.busbw, r.in_place_busbw), (18.05, Some(18.10)));
        let table = Table {
            op: None,
            rows: vec![r.clone()],
        };
        let bucket = size_bucket(1 << 20);
        assert_eq!(
            table_curve(&table, Placement::InPlace).unwrap()[&bucket],
            18.10
        );
        assert_eq!(
            table_curve(&table, Placement::OutOfPlace).unwrap()[&bucket],
            18.05
        );
        let r = parse_row("  1048576  262144  float  sum  101.7  10.31  18.05  0").unwrap();
        let table = Table {
            op: None,
            rows: vec![r],
        };
        let e = table_curve(&table, Placement::InPlace).unwrap_err();
        assert!(e.to_string().contains("no in-place busbw"), "{e}");
        // An empty column (tab tab) before #wrong.
        let r = parse_row("65536\t16384\tfloat\tsum\t-1\t138.8\t0.47\t0.89\t\t0").unwrap();
        assert_eq!(r.busbw, 0.89);
        // nccl-tests 1.x: no root column.
        let r = parse_row("  1048576  262144  float  sum  101.7  10.31  18.05  0").unwrap();
        assert_eq!((r.algbw, r.busbw), (10.31, 18.05));
        // No root column and a time printed as an integer: told by the row's length.
        let r =
            parse_row("1073741824 268435456 float sum 12345 86.98 163.09 0 12301 87.29 163.67 0")
                .unwrap();
        assert_eq!(
            (r.time_us, r.busbw, r.in_place_busbw),
            (12345.0, 163.09, Some(163.67))
        );
        assert_eq!(parse_row("# size count type"), None);
        assert_eq!(parse_row("Message Size\tNo Plugin"), None);
        assert_eq!(parse_row("65536\t0.93\t2.74\t2.67"), None);
    }

    #[test]
    fn benchmarks_are_named_exactly() {
        assert_eq!(
            benchmark_in("srun -n8 all_reduce_perf -b 64K"),
            Some("ncclAllReduce")
        );
        assert_eq!(benchmark_in("./build/reduce_perf -b 8"), Some("ncclReduce"));
        assert_eq!(benchmark_in("no benchmark here"), None);
    }
}
