//! Quantities as reports print them: three significant figures and an SI prefix
//! (`2.5 ms`, `1.5 MB`, `12k`), for chart axes and the live view alike.

/// `ns` nanoseconds in seconds.
pub fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// What a value measures: how it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// A count (calls, instances).
    Count,
    /// Seconds, given in seconds.
    Seconds,
    /// Bytes.
    Bytes,
    /// GB/s.
    GBps,
    /// A fraction, written as a percentage.
    Share,
}

impl Unit {
    /// `v` for an axis or a label: three significant figures and a unit.
    pub fn format(self, v: f64) -> String {
        let (scaled, prefix) = match self {
            Unit::Seconds => {
                let a = v.abs();
                if a == 0.0 || a >= 1.0 {
                    (v, "")
                } else if a >= 1e-3 {
                    (v * 1e3, "m")
                } else if a >= 1e-6 {
                    (v * 1e6, "µ")
                } else {
                    (v * 1e9, "n")
                }
            }
            Unit::GBps => (v, ""),
            Unit::Share => (v * 100.0, ""),
            Unit::Count | Unit::Bytes => {
                let a = v.abs();
                if a >= 1e12 {
                    (v / 1e12, "T")
                } else if a >= 1e9 {
                    (v / 1e9, "G")
                } else if a >= 1e6 {
                    (v / 1e6, "M")
                } else if a >= 1e3 {
                    (v / 1e3, "k")
                } else {
                    (v, "")
                }
            }
        };
        // Three significant figures, without trailing zeros: 6 µs, 1.25 ms, 120 GB/s.
        let number = if scaled.abs() >= 100.0 {
            format!("{scaled:.0}")
        } else {
            let digits = if scaled.abs() >= 10.0 { 1 } else { 2 };
            let s = format!("{scaled:.digits$}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        };
        match self {
            Unit::Count => format!("{number}{prefix}"),
            Unit::Seconds => format!("{number} {prefix}s"),
            Unit::Bytes => format!("{number} {prefix}B"),
            Unit::GBps => format!("{number} GB/s"),
            Unit::Share => format!("{number}%"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_read_as_people_write_them() {
        assert_eq!(Unit::Seconds.format(0.0025), "2.5 ms");
        assert_eq!(Unit::Seconds.format(0.000_006), "6 µs");
        assert_eq!(Unit::Bytes.format(1_500_000.0), "1.5 MB");
        assert_eq!(Unit::Count.format(12.0), "12");
        assert_eq!(Unit::GBps.format(123.4), "123 GB/s");
        assert_eq!(Unit::Share.format(0.5), "50%");
    }
}
