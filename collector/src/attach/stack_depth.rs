//! The stack each BPF program's deepest chain of calls takes, as the kernel's verifier
//! sums it for a program without private stacks: every function's frame (its deepest
//! access below the frame pointer, rounded up to 16 bytes as for a JIT) down the chain,
//! global functions included, at most 512 bytes. A uprobe program has no private stack on
//! a kernel that knows it may be preempted (6.18.44 here), nor on any before 6.13; a kernel
//! that gives it one checks each frame alone, so a program whose chain grew past 512 bytes
//! loads there and is refused here. The end-to-end tests see that only on the second kind
//! of kernel; this test sees it on any.

use std::collections::HashMap;

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionIndex, SymbolKind};

/// BPF's stack for a whole chain of calls, bytes.
const MAX_BPF_STACK: u32 = 512;

/// A function: where its code is (section, first instruction) and how many instructions.
#[derive(Debug)]
struct Function {
    name: String,
    section: SectionIndex,
    first: usize,
    len: usize,
    /// A program (its section names where it attaches), not a function programs call.
    program: bool,
}

/// A program's deepest chain of calls: its functions' names and frames.
struct Chain {
    bytes: u32,
    functions: Vec<(String, u32)>,
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes:", self.bytes)?;
        for (name, frame) in &self.functions {
            write!(f, " {name} ({frame})")?;
        }
        Ok(())
    }
}

/// Every program of `elf` (a BPF object) with its deepest chain of calls.
fn deepest_chains(elf: &[u8]) -> Vec<Chain> {
    let file = object::File::parse(elf).expect("the BPF object");
    let mut functions: Vec<Function> = Vec::new();
    for sym in file
        .symbols()
        .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
    {
        let Some(section) = sym.section_index() else {
            continue;
        };
        let program = file
            .section_by_index(section)
            .ok()
            .and_then(|s| s.name().ok().map(|n| n != ".text"))
            .unwrap_or(false);
        functions.push(Function {
            name: sym.name().unwrap_or_default().to_string(),
            section,
            first: (sym.address() / 8) as usize,
            len: (sym.size() / 8) as usize,
            program,
        });
    }
    let at: HashMap<(SectionIndex, usize), usize> = functions
        .iter()
        .enumerate()
        .map(|(i, f)| ((f.section, f.first), i))
        .collect();
    let mut frames = vec![0u32; functions.len()];
    let mut callees: Vec<Vec<usize>> = vec![Vec::new(); functions.len()];
    for (i, f) in functions.iter().enumerate() {
        let section = file.section_by_index(f.section).expect("its section");
        let code = section.data().expect("its code");
        // Calls to another section's function, or through its section's symbol, are
        // relocated; a call within the section is not.
        let relocated: HashMap<usize, (SectionIndex, Option<usize>)> = section
            .relocations()
            .filter_map(|(offset, r)| match r.target() {
                RelocationTarget::Symbol(s) => {
                    let sym = file.symbol_by_index(s).ok()?;
                    let named =
                        (sym.kind() != SymbolKind::Section).then_some((sym.address() / 8) as usize);
                    Some(((offset / 8) as usize, (sym.section_index()?, named)))
                }
                _ => None,
            })
            .collect();
        let (depth, calls) = scan(code, f.first, f.len);
        frames[i] = depth.div_ceil(16) * 16;
        for (pc, imm) in calls {
            let target = match relocated.get(&pc) {
                Some(&(s, Some(first))) => (s, first),
                Some(&(s, None)) => (s, (i64::from(imm) + 1) as usize),
                None => (f.section, (pc as i64 + i64::from(imm) + 1) as usize),
            };
            let callee = at.get(&target).unwrap_or_else(|| {
                panic!(
                    "{} calls instruction {target:?}, no function's start",
                    f.name
                )
            });
            callees[i].push(*callee);
        }
    }
    let mut memo = HashMap::new();
    (0..functions.len())
        .filter(|&i| functions[i].program)
        .map(|i| deepest(i, &functions, &frames, &callees, &mut memo))
        .collect()
}

/// The deepest chain of calls from function `i`.
fn deepest(
    i: usize,
    functions: &[Function],
    frames: &[u32],
    callees: &[Vec<usize>],
    memo: &mut HashMap<usize, (u32, Vec<usize>)>,
) -> Chain {
    let (bytes, path) = chain(i, frames, callees, memo, 0);
    Chain {
        bytes,
        functions: path
            .iter()
            .map(|&f| (functions[f].name.clone(), frames[f]))
            .collect(),
    }
}

/// The bytes and functions of the deepest chain from `i` (memoized).
fn chain(
    i: usize,
    frames: &[u32],
    callees: &[Vec<usize>],
    memo: &mut HashMap<usize, (u32, Vec<usize>)>,
    level: usize,
) -> (u32, Vec<usize>) {
    // BPF has no recursion, and the verifier allows 8 frames.
    assert!(level < 16, "a cycle of calls");
    if let Some(done) = memo.get(&i) {
        return done.clone();
    }
    let mut best = (0, Vec::new());
    for &c in &callees[i] {
        let below = chain(c, frames, callees, memo, level + 1);
        if below.0 > best.0 {
            best = below;
        }
    }
    let mut path = vec![i];
    path.extend(best.1);
    let done = (frames[i] + best.0, path);
    memo.insert(i, done.clone());
    done
}

/// A function's deepest stack access below its frame pointer (`r10`, directly or through
/// a register set from it) and its BPF-to-BPF calls (instruction, immediate).
fn scan(code: &[u8], first: usize, len: usize) -> (u32, Vec<(usize, i32)>) {
    // What each register holds: the frame pointer plus an offset, or something else.
    let mut fp: [Option<i64>; 11] = [None; 11];
    fp[10] = Some(0);
    let mut depth = 0i64;
    let mut calls = Vec::new();
    let mut below = |base: Option<i64>, off: i16| {
        if let Some(b) = base {
            depth = depth.max(-(b + i64::from(off)));
        }
    };
    let mut pc = first;
    while pc < first + len {
        let insn = &code[pc * 8..pc * 8 + 8];
        let (op, dst, src) = (
            insn[0],
            usize::from(insn[1] & 0xf),
            usize::from(insn[1] >> 4),
        );
        let off = i16::from_le_bytes([insn[2], insn[3]]);
        let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
        let (dst, src) = (dst.min(10), src.min(10));
        match op & 7 {
            // LDX: a load from [src + off] into dst.
            1 => {
                below(fp[src], off);
                fp[dst] = None;
            }
            // ST, STX (and atomics): a store to [dst + off].
            2 | 3 => below(fp[dst], off),
            // ALU64.
            7 => {
                let by_reg = op & 8 != 0;
                fp[dst] = match (op & 0xf0, by_reg) {
                    (0xb0, true) => fp[src],
                    (0x00, false) => fp[dst].map(|b| b + i64::from(imm)),
                    (0x10, false) => fp[dst].map(|b| b - i64::from(imm)),
                    _ => None,
                };
            }
            // JMP: a call clobbers r0-r5; BPF_PSEUDO_CALL (src 1) calls a function.
            5 if op == 0x85 => {
                if src == 1 {
                    calls.push((pc, imm));
                }
                fp[..6].fill(None);
            }
            // ALU (32-bit) writes dst; LD (a 64-bit immediate: two slots) too.
            4 => fp[dst] = None,
            0 => {
                fp[dst] = None;
                if op == 0x18 {
                    pc += 1;
                }
            }
            _ => {}
        }
        pc += 1;
    }
    (depth.max(0) as u32, calls)
}

/// Every program's deepest chain of calls fits BPF's 512 bytes of stack (see the module).
/// Before this was checked, the return programs' chains were up to 1,024 bytes: the
/// kernel here refused every one of them. (448 bytes now: the transports' entry, and
/// NCCL's return.)
#[test]
fn every_programs_deepest_chain_of_calls_fits_bpfs_stack() {
    let chains = deepest_chains(super::BPF_OBJECT);
    // The session and return programs of each ABI, its entries, the transports', the
    // process tracepoints...
    assert!(chains.len() > 20, "{chains:#?}");
    let deepest = chains.iter().max_by_key(|c| c.bytes).expect("a program");
    // Its frames were found (a scan that saw no stack would pass anything).
    assert!(deepest.bytes >= 256, "{deepest:#?}");
    let over: Vec<&Chain> = chains.iter().filter(|c| c.bytes > MAX_BPF_STACK).collect();
    assert!(over.is_empty(), "{over:#?}");
}
