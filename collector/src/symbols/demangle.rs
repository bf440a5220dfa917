//! Function names as their programmers wrote them: a C++ (Itanium ABI) or Rust symbol
//! demangled, for the call sites of C++ codes (LAMMPS, GROMACS, PyTorch's process groups),
//! whose symbols would otherwise read `_ZN4c10d16ProcessGroupNCCL...`.
//!
//! The names come from files any user maps, read by the root daemon: the demanglers'
//! recursion is bounded (their own limits), and the text they write is cut at a length
//! (a back-reference can make a short symbol's demangled text grow fast), which also ends
//! their work.

use std::fmt;

/// `raw` demangled, at most `max` characters (cut with `…`), or `raw` itself where it is
/// not a mangled name or cannot be read as one.
pub fn readable(raw: &str, max: usize) -> String {
    let mut out = Bounded::new(max);
    let done = if let Ok(rust) = rustc_demangle::try_demangle(raw) {
        // `#`: without the hash (`h0123456789abcdef`) a legacy Rust symbol ends with.
        fmt::write(&mut out, format_args!("{rust:#}"))
    } else if raw.starts_with("_Z") {
        match cpp_demangle::BorrowedSymbol::new(raw.as_bytes()) {
            Ok(symbol) => {
                symbol.structured_demangle(&mut out, &cpp_demangle::DemangleOptions::new())
            }
            Err(_) => Err(fmt::Error),
        }
    } else {
        Err(fmt::Error)
    };
    match (done, out.cut) {
        (Ok(()), _) if !out.text.is_empty() => out.text,
        // Cut by the bound: the beginning is the useful part (the namespace, class and
        // function).
        (Err(_), true) => {
            out.text.push('…');
            out.text
        }
        _ => raw.chars().take(max).collect(),
    }
}

/// A text that takes at most `max` characters, then refuses (ending the writer's work).
struct Bounded {
    text: String,
    left: usize,
    cut: bool,
}

impl Bounded {
    fn new(max: usize) -> Bounded {
        Bounded {
            text: String::new(),
            left: max.saturating_sub(1),
            cut: false,
        }
    }
}

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.left == 0 {
                self.cut = true;
                return Err(fmt::Error);
            }
            self.text.push(c);
            self.left -= 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::readable;

    #[test]
    fn cpp_names_are_demangled() {
        assert_eq!(
            readable("_ZN7trainer4Step9negotiateEl", 256),
            "trainer::Step::negotiate(long)"
        );
        assert_eq!(readable("_ZL9negotiatel", 256), "negotiate(long)");
        // GCC's clones keep their suffix.
        assert_eq!(
            readable("_ZL9negotiatel.constprop.0", 256),
            "negotiate(long) [clone .constprop.0]"
        );
        // PyTorch's NCCL process group.
        assert_eq!(
            readable(
                "_ZN4c10d16ProcessGroupNCCL9allreduceERSt6vectorIN2at6TensorESaIS3_EERKNS_16AllreduceOptionsE",
                256
            ),
            "c10d::ProcessGroupNCCL::allreduce(std::vector<at::Tensor, std::allocator<at::Tensor> >&, c10d::AllreduceOptions const&)"
        );
    }

    #[test]
    fn rust_names_are_demangled_without_their_hash() {
        assert_eq!(
            readable("_ZN5trace7collect17h0123456789abcdefE", 256),
            "trace::collect"
        );
        assert_eq!(readable("_RNvCs1234_5trace7collect", 256), "trace::collect");
    }

    #[test]
    fn other_names_are_kept() {
        for name in [
            "main",
            "negotiate_tensors.constprop.0",
            "MPI_Allreduce",
            "_Z",
            "_Zjunk",
            "",
        ] {
            assert_eq!(readable(name, 256), name);
        }
        assert_eq!(readable(&"x".repeat(300), 256), "x".repeat(256));
    }

    #[test]
    fn a_long_name_is_cut_at_the_bound() {
        // Each `S_` repeats the first type: the demangled text grows with every one.
        let mangled = format!("_Z1fP{}", "S_".repeat(200)).replacen("_Z1fP", "_Z1fPN1a1bE", 1);
        let out = readable(&mangled, 64);
        assert_eq!(out.chars().count(), 64, "{out}");
        assert!(out.starts_with("f(a::b*"), "{out}");
        assert!(out.ends_with('…'), "{out}");
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        // A pointer to a pointer to ... ten thousand deep: past the parser's recursion
        // limit, so left as it is (and the thread's stack intact).
        let mangled = format!("_Z1f{}i", "P".repeat(10_000));
        assert_eq!(
            readable(&mangled, 256),
            mangled.chars().take(256).collect::<String>()
        );
    }
}
