//! Member offsets of the running kernel's structures, from its BTF
//! (`/sys/kernel/btf/vmlinux`): what the identity events need to find a process's
//! environment and arguments (`task_struct.mm`, `mm_struct.env_start` ...) and its cgroup
//! v1 (`task_struct.cgroups` ...), which move between kernel versions and configurations.
//!
//! aya-obj parses BTF but keeps member offsets private, so the few lookups needed are done
//! here, on the format the kernel documents (Documentation/bpf/btf.rst).

use std::collections::{BTreeMap, HashMap, HashSet};

use collector_common::IdentityOffsets;
use tracing::warn;

/// Errors reading the kernel's BTF.
#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    /// The file could not be read.
    #[error("reading /sys/kernel/btf/vmlinux")]
    Read(#[source] std::io::Error),
    /// It is not BTF as documented.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// A structure or member is not there.
    #[error("the kernel's BTF has no {0}")]
    Missing(String),
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC: u32 = 12;

/// One type of the BTF blob: its kind, name, and (structs and unions) its members as
/// (name offset, type id, bit offset).
struct Type {
    kind: u32,
    name: u32,
    members: Vec<(u32, u32, u32)>,
}

/// The types and strings of a BTF blob.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
    by_name: HashMap<String, u32>,
    /// The 32-bit enums' constants: (name offset, value).
    constants: Vec<(u32, i32)>,
}

impl Btf {
    /// The running kernel's BTF.
    pub fn vmlinux() -> Result<Btf, BtfError> {
        let data = std::fs::read("/sys/kernel/btf/vmlinux").map_err(BtfError::Read)?;
        Btf::parse(&data)
    }

    /// Parses a BTF blob (little-endian, as on x86-64).
    pub fn parse(data: &[u8]) -> Result<Btf, BtfError> {
        let u32_at = |at: usize| -> Result<u32, BtfError> {
            data.get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or(BtfError::Malformed("truncated"))
        };
        if data.get(0..2) != Some(&[0x9f, 0xeb]) {
            return Err(BtfError::Malformed("bad magic"));
        }
        let hdr_len = u32_at(4)? as usize;
        let (type_off, type_len) = (u32_at(8)? as usize, u32_at(12)? as usize);
        let (str_off, str_len) = (u32_at(16)? as usize, u32_at(20)? as usize);
        let types_at = hdr_len + type_off;
        let strings = data
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("strings out of range"))?
            .to_vec();
        // Type ids start at 1; id 0 is void.
        let mut types = vec![Type {
            kind: 0,
            name: 0,
            members: Vec::new(),
        }];
        let mut constants = Vec::new();
        let mut at = types_at;
        while at < types_at + type_len {
            let (name, info) = (u32_at(at)?, u32_at(at + 4)?);
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            at += 12;
            let mut members = Vec::new();
            let extra = match kind {
                1 | 14 | 17 => 4, // int, var, decl tag
                3 => 12,          // array
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + 12 * i;
                        let offset = u32_at(m + 8)?;
                        // With kind_flag, the low 24 bits are the bit offset.
                        let bits = if info >> 31 == 1 {
                            offset & 0xff_ffff
                        } else {
                            offset
                        };
                        members.push((u32_at(m)?, u32_at(m + 4)?, bits));
                    }
                    12 * vlen
                }
                KIND_ENUM => {
                    for i in 0..vlen {
                        let e = at + 8 * i;
                        constants.push((u32_at(e)?, u32_at(e + 4)? as i32));
                    }
                    8 * vlen
                }
                13 => 8 * vlen,       // func proto
                15 | 19 => 12 * vlen, // datasec, enum64
                2 | 7..=12 | 16 | 18 => 0,
                _ => return Err(BtfError::Malformed("unknown kind")),
            };
            at += extra;
            types.push(Type {
                kind,
                name,
                members,
            });
        }
        let mut btf = Btf {
            types,
            strings,
            by_name: HashMap::new(),
            constants,
        };
        for id in 1..btf.types.len() {
            let t = &btf.types[id];
            if t.kind == KIND_STRUCT && t.name != 0 {
                let name = btf.string(t.name).to_string();
                btf.by_name.entry(name).or_insert(id as u32);
            }
        }
        Ok(btf)
    }

    /// The type id of the kernel function `name` (a kfunc's, for a program to call it).
    pub fn func_id(&self, name: &str) -> Option<u32> {
        (1..self.types.len())
            .find(|&id| {
                let t = &self.types[id];
                t.kind == KIND_FUNC && self.string(t.name) == name
            })
            .map(|id| id as u32)
    }

    fn string(&self, at: u32) -> &str {
        let rest = self.strings.get(at as usize..).unwrap_or(&[]);
        let end = rest.iter().position(|b| *b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Byte offset of `member` in struct `name`, looking inside anonymous structs and
    /// unions (`mm_struct` keeps its fields in one).
    pub fn offset(&self, name: &str, member: &str) -> Result<u32, BtfError> {
        let id = *self
            .by_name
            .get(name)
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))?;
        self.find(id, member, 0, &mut HashSet::new())
            .map(|bits| bits / 8)
            .ok_or_else(|| BtfError::Missing(format!("{name}.{member}")))
    }

    /// `seen`: the types already searched by this lookup, each searched once (a malformed
    /// blob's type may hold itself as an anonymous member, or many members share one).
    fn find(&self, id: u32, member: &str, base_bits: u32, seen: &mut HashSet<u32>) -> Option<u32> {
        if !seen.insert(id) {
            return None;
        }
        let t = self.types.get(id as usize)?;
        for &(name, ty, bits) in &t.members {
            // A malformed blob's offsets may add up past u32::MAX: no such member then.
            let bits = base_bits.checked_add(bits)?;
            if name != 0 && self.string(name) == member {
                return Some(bits);
            }
            if name == 0 {
                let inner = self.resolve(ty)?;
                if let Some(found) = self.find(inner, member, bits, seen) {
                    return Some(found);
                }
            }
        }
        None
    }

    /// The struct or union an anonymous member is (its type names one directly).
    fn resolve(&self, id: u32) -> Option<u32> {
        let t = self.types.get(id as usize)?;
        matches!(t.kind, KIND_STRUCT | KIND_UNION).then_some(id)
    }
}

/// This kernel's offsets for the kernel side, each part marked where found: `valid`, where
/// identity events find a process's environment, arguments and start time and the linker
/// probe its process group, its parent's and its terminal; `cgroup_valid`
/// ([`cgroup_offsets`]); `userns_valid` ([`userns_offsets`]). A part not found is warned of.
pub fn kernel_offsets(btf: &Btf) -> IdentityOffsets {
    let none = IdentityOffsets::default();
    let mut found = identity_offsets(btf, none).unwrap_or_else(|e| {
        warn!("no identity events: {e:#}");
        none
    });
    found = cgroup_offsets(btf, found).unwrap_or(found);
    found = usage_offsets(btf, found).unwrap_or_else(|e| {
        warn!("{e:#}: no CPU time or largest resident set of the processes that end");
        found
    });
    found = userns_offsets(btf, found).unwrap_or_else(|e| {
        warn!("{e:#}: each uid of a user namespace is charged as a user of its own");
        found
    });
    found = uret_offsets(btf, found).unwrap_or_else(|e| {
        warn!("{e:#}: a call the probes saw begin is not named where it was made from");
        found
    });
    xol_offsets(btf, found).unwrap_or_else(|e| {
        warn!(
            "{e:#}: a call left without returning (a longjmp out of an error handler) is \
             found only when the thread's next call is made from above it"
        );
        found
    })
}

/// `found` with where the kernel side finds a process's return-probe trampoline (the start
/// of its uprobe page), which a call in progress has in place of its return address.
fn xol_offsets(btf: &Btf, found: IdentityOffsets) -> Result<IdentityOffsets, BtfError> {
    Ok(IdentityOffsets {
        xol_valid: 1,
        xol_mm_area: btf.offset("mm_struct", "uprobes_state")?
            + btf.offset("uprobes_state", "xol_area")?,
        xol_vaddr: btf.offset("xol_area", "vaddr")?,
        ..found
    })
}

/// `found` with where the task iterator finds a thread's calls whose returns are probed
/// (their return addresses, which the kernel replaced on the stack with its trampoline).
fn uret_offsets(btf: &Btf, found: IdentityOffsets) -> Result<IdentityOffsets, BtfError> {
    Ok(IdentityOffsets {
        uret_valid: 1,
        uret_task_utask: btf.offset("task_struct", "utask")?,
        uret_utask_instances: btf.offset("uprobe_task", "return_instances")?,
        uret_ri_stack: btf.offset("return_instance", "stack")?,
        uret_ri_orig: btf.offset("return_instance", "orig_ret_vaddr")?,
        uret_ri_next: btf.offset("return_instance", "next")?,
        ..found
    })
}

/// `found` with where the kernel side finds an ending thread's CPU time and context
/// switches and its process's largest resident set (what `getrusage` reports).
fn usage_offsets(btf: &Btf, found: IdentityOffsets) -> Result<IdentityOffsets, BtfError> {
    Ok(IdentityOffsets {
        usage_valid: 1,
        task_signal: btf.offset("task_struct", "signal")?,
        usage_task_utime: btf.offset("task_struct", "utime")?,
        usage_task_stime: btf.offset("task_struct", "stime")?,
        usage_task_nvcsw: btf.offset("task_struct", "nvcsw")?,
        usage_task_nivcsw: btf.offset("task_struct", "nivcsw")?,
        usage_task_sum_exec_runtime: btf.offset("task_struct", "se")?
            + btf.offset("sched_entity", "sum_exec_runtime")?,
        usage_signal_maxrss: btf.offset("signal_struct", "maxrss")?,
        usage_signal_live: btf.offset("signal_struct", "live")?,
        usage_task_exit_code: btf.offset("task_struct", "exit_code")?,
        usage_signal_flags: btf.offset("signal_struct", "flags")?,
        usage_signal_group_exit_code: btf.offset("signal_struct", "group_exit_code")?,
        ..found
    })
}

/// `found` with the identity offsets (see [`kernel_offsets`]).
fn identity_offsets(btf: &Btf, found: IdentityOffsets) -> Result<IdentityOffsets, BtfError> {
    Ok(IdentityOffsets {
        valid: 1,
        task_mm: btf.offset("task_struct", "mm")?,
        task_start_boottime: btf.offset("task_struct", "start_boottime")?,
        mm_arg_start: btf.offset("mm_struct", "arg_start")?,
        mm_env_start: btf.offset("mm_struct", "env_start")?,
        task_real_parent: btf.offset("task_struct", "real_parent")?,
        task_signal: btf.offset("task_struct", "signal")?,
        signal_pgrp: btf.offset("signal_struct", "pids")? + 8 * PIDTYPE_PGID,
        signal_tty: btf.offset("signal_struct", "tty")?,
        task_ptrace: btf.offset("task_struct", "ptrace")?,
        ..found
    })
}

/// `found` with the offsets by which the kernel side finds who answers for a process's
/// user namespace: the user who made it (or the one it was made in, up to the node's own),
/// or where root made it, the node's uid its first range maps to.
fn userns_offsets(btf: &Btf, found: IdentityOffsets) -> Result<IdentityOffsets, BtfError> {
    Ok(IdentityOffsets {
        userns_valid: 1,
        userns_task_cred: btf.offset("task_struct", "cred")?,
        userns_cred_user_ns: btf.offset("cred", "user_ns")?,
        userns_level: btf.offset("user_namespace", "level")?,
        userns_parent: btf.offset("user_namespace", "parent")?,
        userns_owner: btf.offset("user_namespace", "owner")?,
        userns_uid_map: btf.offset("user_namespace", "uid_map")?,
        uidmap_nr_extents: btf.offset("uid_gid_map", "nr_extents")?,
        uidmap_extent: btf.offset("uid_gid_map", "extent")?,
        uidmap_forward: btf.offset("uid_gid_map", "forward")?,
        extent_lower_first: btf.offset("uid_gid_extent", "lower_first")?,
        ..found
    })
}

/// `found` with where the kernel side finds a process's cgroup v1 directory and those above
/// it.
fn cgroup_offsets(btf: &Btf, found: IdentityOffsets) -> Result<IdentityOffsets, BtfError> {
    Ok(IdentityOffsets {
        cgroup_valid: 1,
        cgroup_task_cgroups: btf.offset("task_struct", "cgroups")?,
        cgroup_css_set_subsys: btf.offset("css_set", "subsys")?,
        cgroup_css_cgroup: btf.offset("cgroup_subsys_state", "cgroup")?,
        cgroup_kn: btf.offset("cgroup", "kn")?,
        cgroup_kernfs_id: btf.offset("kernfs_node", "id")?,
        // Renamed when it became RCU-protected (Linux 6.15).
        cgroup_kernfs_parent: btf
            .offset("kernfs_node", "__parent")
            .or_else(|_| btf.offset("kernfs_node", "parent"))?,
        ..found
    })
}

/// The cgroup controllers (`freezer`, `cpuset`...) whose v1 cgroup the kernel side can
/// find, each with its subsystem id (its constant `<name>_cgrp_id` of `enum
/// cgroup_subsys_id`, which indexes `css_set.subsys`); none where the structures' offsets
/// are not all known.
pub fn cgroup_v1_subsystems(btf: &Btf) -> BTreeMap<String, u32> {
    if cgroup_offsets(btf, IdentityOffsets::default()).is_err() {
        return BTreeMap::new();
    }
    let mut found: BTreeMap<String, u32> = btf
        .constants
        .iter()
        .filter_map(|&(name, value)| {
            let controller = btf.string(name).strip_suffix("_cgrp_id")?;
            Some((controller.to_string(), u32::try_from(value).ok()?))
        })
        .collect();
    // The one controller whose v1 name (mount option, /proc/cgroups) is not its own.
    if let Some(&io) = found.get("io") {
        found.insert("blkio".into(), io);
    }
    found
}

/// `PIDTYPE_PGID` of the kernel's `enum pid_type` (2 since Linux 4.19, which added
/// `PIDTYPE_TGID` before it; uprobe_multi needs 6.6): `signal_struct.pids` is indexed by it.
const PIDTYPE_PGID: u32 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernels_offsets_are_found() {
        let o = kernel_offsets(&Btf::vmlinux().expect("BTF"));
        assert_eq!(o.valid, 1, "{o:?}");
        // The kernel keeps arg_end right after arg_start, env_end after env_start.
        let btf = Btf::vmlinux().expect("btf");
        assert_eq!(
            btf.offset("mm_struct", "arg_end").expect("arg_end"),
            o.mm_arg_start + 8
        );
        assert_eq!(
            btf.offset("mm_struct", "env_end").expect("env_end"),
            o.mm_env_start + 8
        );
        assert!(o.task_mm > 0 && o.task_start_boottime > 0);
        assert_eq!(o.cgroup_valid, 1, "{o:?}");
        assert_eq!(o.userns_valid, 1, "{o:?}");
        assert!(o.userns_task_cred > 0 && o.userns_parent > 0, "{o:?}");
        assert_eq!(o.usage_valid, 1, "{o:?}");
        // utime and stime are neighbours; the scheduler's entity's runtime lies inside it.
        assert_eq!(o.usage_task_stime, o.usage_task_utime + 8, "{o:?}");
        let se = btf.offset("task_struct", "se").expect("se");
        assert!(o.usage_task_sum_exec_runtime > se, "{o:?}");
        assert!(o.usage_task_exit_code > 0, "{o:?}");
        assert!(
            o.uret_valid == 1 && o.uret_task_utask > 0 && o.uret_ri_orig > 0,
            "{o:?}"
        );
        // The page's address follows its wait queue, bitmap and page in `struct xol_area`.
        assert!(
            o.xol_valid == 1 && o.xol_mm_area > 0 && o.xol_vaddr > 0,
            "{o:?}"
        );
        assert!(
            o.usage_signal_flags > 0 && o.usage_signal_group_exit_code > 0,
            "{o:?}"
        );
        // The in-place ranges (5 of 12 bytes) and the pointer to more share a union; the
        // count is outside them both.
        assert_eq!(o.uidmap_extent, o.uidmap_forward, "{o:?}");
        assert!(
            o.uidmap_nr_extents >= o.uidmap_extent + 60
                || o.uidmap_nr_extents + 4 <= o.uidmap_extent,
            "{o:?}"
        );
        // /proc/cgroups lists the controllers in subsystem id order.
        let ids = cgroup_v1_subsystems(&btf);
        let listed = std::fs::read_to_string("/proc/cgroups").expect("/proc/cgroups");
        let listed: Vec<&str> = listed
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert!(listed.contains(&"freezer"), "{listed:?}");
        for (ssid, name) in listed.iter().enumerate() {
            assert_eq!(ids.get(*name), Some(&(ssid as u32)), "{name}: {ids:?}");
        }
    }

    #[test]
    fn a_struct_holding_itself_is_not_searched_forever() {
        // Found by fuzz/fuzz_targets/kernel_btf.rs (a stack overflow): struct task_struct
        // { struct task_struct; } (an anonymous member of its own type).
        let blob: &[u8] = b"\x9f\xeb\x01\x00\x18\x00\x00\x00\x00\x00\x00\x00\x18\x00\x00\x00\
            \x18\x00\x00\x00\x0d\x00\x00\x00\
            \x01\x00\x00\x00\x01\x00\x00\x04\x08\x00\x00\x00\
            \x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\
            \x00task_struct\x00";
        let btf = Btf::parse(blob).expect("well-formed BTF");
        assert!(matches!(
            btf.offset("task_struct", "mm"),
            Err(BtfError::Missing(_))
        ));
    }

    #[test]
    fn offsets_past_u32_max_are_refused() {
        // Found by fuzz/fuzz_targets/kernel_btf.rs (an overflow): struct task_struct {
        // struct { unsigned long mm; /* bit 8 */ } /* at bit 0xffffffff */; }.
        let blob: &[u8] = b"\x9f\xeb\x01\x00\x18\x00\x00\x00\x00\x00\x00\x00\x30\x00\x00\x00\
            \x30\x00\x00\x00\x10\x00\x00\x00\
            \x01\x00\x00\x00\x01\x00\x00\x04\x08\x00\x00\x00\
            \x00\x00\x00\x00\x02\x00\x00\x00\xff\xff\xff\xff\
            \x00\x00\x00\x00\x01\x00\x00\x04\x08\x00\x00\x00\
            \x0d\x00\x00\x00\x00\x00\x00\x00\x08\x00\x00\x00\
            \x00task_struct\x00mm\x00";
        let btf = Btf::parse(blob).expect("well-formed BTF");
        assert!(matches!(
            btf.offset("task_struct", "mm"),
            Err(BtfError::Missing(_))
        ));
    }
}
