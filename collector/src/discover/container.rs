//! Containers: whether a process runs in one (a pid or mount namespace of its own, or a
//! cgroup a container runtime names), its pid there, and the container's identity.

use std::fs;

use serde::{Deserialize, Serialize};

use super::process_dir::ProcessDir;

/// The container a process runs in, as the kernel places it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Container {
    /// Its pid in its own pid namespace (what `ps` inside the container shows; the host's
    /// pid where it shares the host's pid namespace).
    pub pid: u32,
    /// Its cgroup as the host names it (cgroup v2's; else the first v1 hierarchy's).
    pub cgroup: String,
    /// The container id its cgroup names (Docker, containerd, CRI-O, Podman, Kubernetes
    /// pods), where one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// The container `process` runs in, from its `/proc/PID/cgroup` text and namespaces: None
/// when it shares the host's pid and mount namespaces (those of pid 1: the daemon's own
/// may be private) and no container runtime names its cgroup.
pub fn of_process(process: &ProcessDir, cgroup_text: &str) -> Option<Container> {
    let host = |kind: &str| fs::read_link(format!("/proc/1/ns/{kind}")).ok();
    // Told only where both can be read: an unreadable pid 1 puts nobody in a container.
    let own_namespace = [("pid", "ns/pid"), ("mnt", "ns/mnt")]
        .iter()
        .any(|&(kind, link)| {
            matches!((process.read_link(link), host(kind)), (Some(mine), Some(host)) if mine != host)
        });
    let (cgroup, id) = placement(cgroup_text);
    if !own_namespace && id.is_none() {
        return None;
    }
    let status = process
        .read_text("status", super::process_dir::SMALL_FILE_BYTES)
        .ok()?;
    Some(Container {
        pid: inner_pid(&status).unwrap_or(process.pid()),
        cgroup,
        id,
    })
}

/// The innermost pid of `NSpid:` in `/proc/PID/status` text.
fn inner_pid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// A process's cgroup path (the one naming a container, else cgroup v2's, else the first)
/// and the container id it names.
fn placement(cgroup_text: &str) -> (String, Option<String>) {
    let paths: Vec<&str> = cgroup_text
        .lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .collect();
    if let Some((path, id)) = paths
        .iter()
        .find_map(|p| container_id(p).map(|id| (*p, id)))
    {
        return (path.to_string(), Some(id));
    }
    let v2 = cgroup_text.lines().find_map(|l| l.strip_prefix("0::"));
    let path = v2.or(paths.first().copied()).unwrap_or_default();
    (path.to_string(), None)
}

/// The container id a cgroup path names: the last directory holding 64 hex digits, alone
/// (`/docker/<id>`, Kubernetes' `/kubepods/.../pod<uid>/<id>`) or after the runtime's
/// prefix (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `libpod-<id>.scope`, `cri-containerd:<id>`).
pub(crate) fn container_id(path: &str) -> Option<String> {
    path.rsplit('/').find_map(|dir| {
        let name = dir.strip_suffix(".scope").unwrap_or(dir);
        let id = name.rsplit(['-', ':']).next()?;
        (id.len() == 64
            && id
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| id.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::{container_id, inner_pid, placement};

    const ID: &str = "3f1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809";

    #[test]
    fn container_ids_of_every_runtime() {
        for path in [
            format!("/system.slice/docker-{ID}.scope"),
            format!("/docker/{ID}"),
            format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-{ID}.scope"),
            format!("/kubepods/besteffort/pod8d1e6a6c-1111-2222-3333-444455556666/{ID}"),
            format!("/machine.slice/libpod-{ID}.scope/container"),
            format!("/system.slice/crio-{ID}.scope"),
        ] {
            assert_eq!(container_id(&path).as_deref(), Some(ID), "{path}");
        }
        for path in [
            "/user.slice/user-1000.slice/session-3.scope",
            "/system.slice/docker-0123.scope",
            &format!("/docker/{}", ID.to_uppercase()),
        ] {
            assert_eq!(container_id(path), None, "{path}");
        }
    }

    #[test]
    fn the_path_naming_a_container_is_kept_else_cgroup_v2s() {
        let hybrid = format!("6:freezer:/docker/{ID}\n0::/\n");
        assert_eq!(
            placement(&hybrid),
            (format!("/docker/{ID}"), Some(ID.to_string()))
        );
        assert_eq!(
            placement("6:freezer:/\n0::/lxc.payload.c1\n"),
            ("/lxc.payload.c1".to_string(), None)
        );
        assert_eq!(inner_pid("Name:\tx\nNSpid:\t4242\t7\n"), Some(7));
        assert_eq!(inner_pid("NSpid:\t4242\n"), Some(4242));
    }
}
