//! Function names as their programmers wrote them: a C++ (Itanium ABI) or Rust symbol
//! demangled, for the call sites of C++ codes (LAMMPS, GROMACS, PyTorch's process groups),
//! whose symbols would otherwise read `_ZN4c10d16ProcessGroupNCCL...`.
//!
//! The names come from files any user maps, read by the root daemon: the demanglers'
//! recursion is bounded (their own limits), and the text they write is cut at a length
//! (a back-reference can make a short symbol's demangled text grow fast), which also ends
//! their work.

use std::fmt;

use cpp_demangle::{BorrowedSymbol, DemangleNodeType, DemangleOptions, DemangleWrite};

/// Most characters a demangler may write for one name, shown or not, and nodes it may
/// enter: a back-reference can make a short symbol's text grow exponentially, and this
/// ends the work.
const MAX_WORK: usize = 1 << 16;

/// `raw` demangled, at most `max` characters, or `raw` itself where it is not a mangled
/// name or cannot be read as one. A C++ name too long (a template's arguments run to
/// kilobytes) is shortened as a reader would: the template arguments left out (`<…>`),
/// then the parameters (`(…)`), then only its end kept (`…` and the class and function).
pub fn readable(raw: &str, max: usize) -> String {
    let max = max.max(2);
    if let Some(fortran) = module_procedure(raw) {
        return end_of(fortran, max);
    }
    if let Ok(rust) = rustc_demangle::try_demangle(raw) {
        let mut out = Bounded(String::new());
        // `#`: without the hash (`h0123456789abcdef`) a legacy Rust symbol ends with.
        if fmt::write(&mut out, format_args!("{rust:#}")).is_ok() {
            return end_of(out.0, max);
        }
    } else if raw.starts_with("_Z") {
        if let Ok(symbol) = BorrowedSymbol::new(raw.as_bytes()) {
            let mut last = None;
            for (elide, no_params) in [(false, false), (true, false), (true, true)] {
                let mut out = Shortened::new(elide);
                let mut options = DemangleOptions::new();
                if no_params {
                    options = options.no_params();
                }
                match symbol.structured_demangle(&mut out, &options) {
                    Ok(()) if out.text.chars().count() <= max => return out.text,
                    Ok(()) => last = Some(out.text),
                    // Past the work's bound: shortened at the next step.
                    Err(_) if out.work > MAX_WORK => {}
                    Err(_) => break,
                }
            }
            if let Some(text) = last {
                return end_of(text, max);
            }
        }
    }
    raw.chars().take(max).collect()
}

/// A Fortran module's procedure as gdb names it, `module::procedure`: from gfortran's
/// `__halo_MOD_exchange` and flang's `_QMhaloPexchange` (with a clone's suffix kept:
/// `halo::exchange.constprop.0`); `None` for any other name. Not Intel's
/// `halo_mp_exchange_`, which an external procedure named `halo_mp_exchange` shares.
fn module_procedure(raw: &str) -> Option<String> {
    let (name, clone) = raw.split_at(raw.find('.').unwrap_or(raw.len()));
    // Fortran names are case-insensitive: the compilers write them in lower case.
    let word = |w: &str| {
        !w.is_empty()
            && w.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let (module, procedure) = if let Some(rest) = name.strip_prefix("__") {
        rest.split_once("_MOD_")?
    } else {
        name.strip_prefix("_QM")?.split_once('P')?
    };
    (word(module) && word(procedure)).then(|| format!("{module}::{procedure}{clone}"))
}

/// `text`, or where longer than `max` characters its end, after `…`: the function's own
/// name.
fn end_of(text: String, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text;
    }
    std::iter::once('…')
        .chain(text.chars().skip(n - (max - 1)))
        .collect()
}

/// The demangled text, its template arguments left out where `elide` (`Map<…>`), bounded
/// ([`MAX_WORK`]).
struct Shortened {
    text: String,
    elide: bool,
    /// The nodes entered and not left.
    open: Vec<DemangleNodeType>,
    /// How many of them are template arguments.
    in_template: usize,
    /// Characters written, shown or not, and nodes entered.
    work: usize,
}

impl Shortened {
    fn new(elide: bool) -> Shortened {
        Shortened {
            text: String::new(),
            elide,
            open: Vec::new(),
            in_template: 0,
            work: 0,
        }
    }
}

/// A text of at most [`MAX_WORK`] bytes.
struct Bounded(String);

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.0.len() + s.len() > MAX_WORK {
            return Err(fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

impl DemangleWrite for Shortened {
    fn write_string(&mut self, s: &str) -> fmt::Result {
        self.work += s.len();
        if self.work > MAX_WORK {
            return Err(fmt::Error);
        }
        if self.in_template == 0 || !self.elide {
            // The demangler writes `> >` where arguments end in one: `Map<… >`.
            if s == " " && self.text.ends_with('…') {
                return Ok(());
            }
            self.text.push_str(s);
        }
        Ok(())
    }

    fn push_demangle_node(&mut self, node: DemangleNodeType) {
        // A node is work even where it writes nothing.
        self.work += 1;
        if node == DemangleNodeType::TemplateArgs {
            // The `<` is written; what follows up to the `>` is not shown.
            if self.in_template == 0 && self.elide {
                self.text.push('…');
            }
            self.in_template += 1;
        }
        self.open.push(node);
    }

    fn pop_demangle_node(&mut self) {
        if self.open.pop() == Some(DemangleNodeType::TemplateArgs) {
            self.in_template = self.in_template.saturating_sub(1);
        }
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
    fn fortran_module_procedures_are_named_as_gdb_names_them() {
        for (raw, shown) in [
            ("__halo_MOD_exchange", "halo::exchange"),
            (
                "__halo_MOD_exchange.constprop.0",
                "halo::exchange.constprop.0",
            ),
            ("__grid_2d_MOD_set_bc", "grid_2d::set_bc"),
            ("_QMhaloPexchange", "halo::exchange"),
        ] {
            assert_eq!(readable(raw, 256), shown, "{raw}");
        }
        // Not a module's procedure: kept as it is.
        for raw in [
            "MAIN__",
            "exchange_",
            "__MOD_x",
            "__Halo_MOD_exchange",
            "mpi_allreduce_",
            "x_mp_",
            // Intel's form, or an external procedure of that name: kept.
            "setup_mp_grid_",
        ] {
            assert_eq!(readable(raw, 256), raw, "{raw}");
        }
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

    /// A method of a class template whose arguments are maps of vectors of tuples: 292
    /// characters mangled, 24,166 demangled.
    const LONG: &str = "_ZN36very_long_namespace_name_for_physics7solvers6detail9ExchangerISt3mapINSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt6vectorISt4pairIS9_St5tupleIJidlS9_EEESaISE_EESt4lessIS9_ESaISB_IKS9_SG_EEESA_ISM_SaISM_EES3_ISM_SO_SH_ISM_ESaISB_IKSM_SO_EEEE13halo_exchangeERSQ_RKSO_RKST_i.isra.0";

    #[test]
    fn a_long_name_keeps_its_function_without_the_template_arguments() {
        assert_eq!(
            readable(LONG, 256),
            "very_long_namespace_name_for_physics::solvers::detail::Exchanger<…>::halo_exchange(std::map<…> const&, std::vector<…> const&, std::map<…> const&, int) [clone .isra.0]"
        );
        // Shorter still: without the parameters, then only the end.
        assert_eq!(
            readable(LONG, 120),
            "very_long_namespace_name_for_physics::solvers::detail::Exchanger<…>::halo_exchange"
        );
        let end = readable(LONG, 40);
        assert_eq!(end.chars().count(), 40, "{end}");
        assert!(
            end.starts_with('…') && end.ends_with("::Exchanger<…>::halo_exchange"),
            "{end}"
        );
        // Arguments that end in a template's: `> >` is not left as `<… >`.
        assert_eq!(
            readable("_ZN2ns3MapISt6vectorIiSaIiEEE3getEv", 20),
            "ns::Map<…>::get()"
        );
    }

    #[test]
    fn an_exponential_name_is_bounded() {
        // `f(pair<int, int>, pair<S0, S0>, pair<S1, S1>, ...)`: each parameter refers twice
        // to the one before, so the text doubles with each: 2^40 pairs. The demangler stops
        // at the work's bound and the name is shortened to the function's.
        let mut mangled = String::from("_Z1fSt4pairIiiE");
        for k in 0..40u32 {
            let id = char::from_digit(k % 36, 36)
                .expect("digit")
                .to_ascii_uppercase();
            let id = if k < 36 {
                id.to_string()
            } else {
                format!("1{id}")
            };
            mangled.push_str(&format!("S_IS{id}_S{id}_E"));
        }
        assert_eq!(readable(&mangled, 256), "f");
        // The first steps, demangled whole.
        assert_eq!(
            readable("_Z1fSt4pairIiiES_IS0_S0_E", 256),
            "f(std::pair<int, int>, std::pair<std::pair<int, int>, std::pair<int, int> >)"
        );
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
