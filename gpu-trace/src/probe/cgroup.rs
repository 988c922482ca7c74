//! Which cgroup, container and Kubernetes pod a process belongs to.
//!
//! Facts read here, and only here: the cgroup v2 mount(s) in `/proc/mounts`, a process's v2 path
//! in `/proc/PID/cgroup`, and the cgroup id of a directory under the cgroup2 mount (its inode
//! number: the id `bpf_get_current_cgroup_id()` returns). The classification of a path into a
//! container runtime, container id, pod UID and QoS class is pure and knows the naming schemes of
//! both cgroup drivers (systemd and cgroupfs):
//!
//! | runtime | systemd driver | cgroupfs driver |
//! |---|---|---|
//! | docker | `system.slice/docker-<id>.scope` | `/docker/<id>` |
//! | containerd (CRI) | `…/cri-containerd-<id>.scope` | `/kubepods/…/pod<uid>/<id>` |
//! | CRI-O | `…/crio-<id>.scope` | `/kubepods/…/pod<uid>/crio-<id>` |
//! | podman | `machine.slice/libpod-<id>.scope` (also under `user@UID.service`) | `/libpod_parent/libpod-<id>` |
//!
//! Kubernetes pods: `kubepods[-QOS].slice/kubepods-QOS-pod<uid with _>.slice` (systemd) or
//! `/kubepods/[QOS/]pod<uid>` (cgroupfs); a pod directly under `kubepods` is Guaranteed.

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

/// A container runtime recognised from a cgroup path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    Docker,
    Containerd,
    CriO,
    Podman,
    /// A Kubernetes container whose runtime the path does not name (cgroupfs driver with
    /// containerd, which uses the bare id).
    Kubernetes,
}

/// Kubernetes QoS class of a pod (from the kubelet's cgroup layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// What a cgroup path says about the workload that owns a process.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Workload {
    /// The container runtime and the container id (64 hex digits as the runtime spells it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<(Runtime, String)>,
    /// Kubernetes pod UID (with dashes) and QoS class.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<(String, QosClass)>,
    /// The systemd unit (service or scope) the process runs in, outside containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

impl Workload {
    /// The short container id printed in text output (12 hex digits, as docker and podman do).
    pub fn short_container_id(&self) -> Option<&str> {
        self.container
            .as_ref()
            .map(|(_, id)| &id[..id.len().min(12)])
    }
}

/// The mount points of cgroup v2 in a `/proc/mounts` text. Hybrid hosts mount it at
/// `/sys/fs/cgroup/unified`, pure v2 hosts at `/sys/fs/cgroup`; a host can have several
/// (containers, bind mounts).
pub fn cgroup2_mounts(proc_mounts: &str) -> Vec<PathBuf> {
    super::system::mounts_of_type(proc_mounts, "cgroup2")
        .into_iter()
        .map(PathBuf::from)
        .collect()
}

/// The cgroup v2 path of a process from its `/proc/PID/cgroup` text: the `0::PATH` line.
/// `None` on a host where the process has no v2 membership line.
pub fn v2_path(proc_pid_cgroup: &str) -> Option<&str> {
    proc_pid_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim_end)
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Pod UID from `pod<uid>` (cgroupfs, dashes) or `kubepods-<qos>-pod<uid>.slice` /
/// `kubepods-pod<uid>.slice` (systemd, dashes written as underscores).
fn pod_uid(component: &str) -> Option<String> {
    let rest = component.strip_suffix(".slice").unwrap_or(component);
    let uid = rest.rsplit_once("pod").map(|(_, u)| u)?;
    let uid = uid.replace('_', "-");
    let ok = uid.len() == 36
        && uid.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        });
    ok.then_some(uid)
}

/// Classifies a cgroup v2 path (as in `/proc/PID/cgroup`, starting with `/`).
pub fn classify(path: &str) -> Workload {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut w = Workload::default();

    // Kubernetes: the pod component and the QoS class from its parent.
    if let Some(kp) = components
        .iter()
        .position(|c| *c == "kubepods" || c.starts_with("kubepods"))
    {
        for (i, c) in components.iter().enumerate().skip(kp) {
            if let Some(uid) = pod_uid(c) {
                let qos_text = if c.contains("besteffort")
                    || components[kp..i].iter().any(|p| p.contains("besteffort"))
                {
                    QosClass::BestEffort
                } else if c.contains("burstable")
                    || components[kp..i].iter().any(|p| p.contains("burstable"))
                {
                    QosClass::Burstable
                } else {
                    QosClass::Guaranteed
                };
                w.pod = Some((uid, qos_text));
                // The container is the next component, if any.
                if let Some(next) = components.get(i + 1) {
                    w.container = container_of(next).or_else(|| {
                        is_container_id(next).then(|| (Runtime::Kubernetes, next.to_string()))
                    });
                }
                break;
            }
        }
    }
    if w.container.is_none() {
        // The innermost component naming a container wins (nested runtimes).
        w.container = components.iter().rev().find_map(|c| container_of(c));
        // cgroupfs docker: /docker/<id>
        if w.container.is_none() {
            w.container = components.windows(2).find_map(|pair| {
                (pair[0] == "docker" && is_container_id(pair[1]))
                    .then(|| (Runtime::Docker, pair[1].to_string()))
            });
        }
    }
    if w.container.is_none() && w.pod.is_none() {
        w.unit = components
            .iter()
            .rev()
            .find(|c| c.ends_with(".service") || c.ends_with(".scope"))
            .map(|c| c.to_string());
    }
    w
}

/// A single path component naming a container: `docker-<id>.scope`, `cri-containerd-<id>.scope`,
/// `crio-<id>.scope` / `crio-<id>`, `libpod-<id>.scope` / `libpod-<id>`. `libpod-conmon-…`
/// (podman's monitor process) is not a container.
fn container_of(component: &str) -> Option<(Runtime, String)> {
    let c = component.strip_suffix(".scope").unwrap_or(component);
    for (prefix, runtime) in [
        ("docker-", Runtime::Docker),
        ("cri-containerd-", Runtime::Containerd),
        ("crio-", Runtime::CriO),
        ("libpod-", Runtime::Podman),
    ] {
        if let Some(id) = c.strip_prefix(prefix)
            && is_container_id(id)
        {
            return Some((runtime, id.to_string()));
        }
    }
    None
}

/// Resolves cgroup ids (as the kernel programs record them) to cgroup v2 paths. The cgroup2
/// mount is walked once at start; an id not found triggers one more walk (a cgroup created
/// since), and an id still not found is remembered as missing, so that it costs another walk
/// only after [`Self::REFRESH_EVERY`] further misses: a stream of records from a cgroup that
/// vanished cannot make every record walk the tree.
#[derive(Debug)]
pub struct CgroupResolver {
    root: PathBuf,
    by_id: HashMap<u64, String>,
    missing: std::collections::HashSet<u64>,
    misses_since_walk: u32,
}

impl CgroupResolver {
    /// Misses of already-missing ids between two walks.
    const REFRESH_EVERY: u32 = 1024;

    /// A resolver over the cgroup2 mount at `root` (see [`cgroup2_mounts`]).
    pub fn new(root: PathBuf) -> Self {
        let mut r = Self {
            root,
            by_id: HashMap::new(),
            missing: Default::default(),
            misses_since_walk: 0,
        };
        r.walk();
        r
    }

    /// The first cgroup2 mount of this host, if any.
    pub fn for_host() -> Option<Self> {
        cgroup2_mounts(&super::system::mounts())
            .into_iter()
            .next()
            .map(Self::new)
    }

    /// Re-reads the tree: ids of removed cgroups disappear, new ones appear.
    pub fn walk(&mut self) {
        self.by_id.clear();
        self.missing.clear();
        self.misses_since_walk = 0;
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue;
            };
            let rel = dir.strip_prefix(&self.root).unwrap_or(Path::new(""));
            self.by_id
                .insert(meta.ino(), format!("/{}", rel.to_string_lossy()));
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }

    /// The cgroup v2 path of `id` (e.g. `/system.slice/docker-….scope`), or `None` when no
    /// cgroup with that id exists (any more).
    pub fn path(&mut self, id: u64) -> Option<&str> {
        if !self.by_id.contains_key(&id) {
            let known_missing = self.missing.contains(&id);
            self.misses_since_walk += u32::from(known_missing);
            if !known_missing || self.misses_since_walk >= Self::REFRESH_EVERY {
                self.walk();
                if !self.by_id.contains_key(&id) {
                    self.missing.insert(id);
                }
            }
        }
        self.by_id.get(&id).map(String::as_str)
    }

    /// The cgroup id of a cgroup v2 directory given as a path relative to the mount (`/a/b`)
    /// or as an absolute path under it.
    pub fn id_of(&self, path: &str) -> std::io::Result<u64> {
        let p = Path::new(path);
        let full = if p.starts_with(&self.root) {
            p.to_path_buf()
        } else {
            self.root.join(path.trim_start_matches('/'))
        };
        fs::metadata(full).map(|m| m.ino())
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1a6f0c9b3e2d8a7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d";
    const UID: &str = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f";

    #[test]
    fn finds_cgroup2_on_hybrid_and_pure_hosts() {
        // The CI machine (hybrid) and the GPU host (pure v2), as their /proc/mounts show them.
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs ro,nosuid 0 0\n\
                      cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid 0 0\n\
                      cgroup /sys/fs/cgroup/memory cgroup rw,memory 0 0\n";
        assert_eq!(
            cgroup2_mounts(hybrid),
            vec![PathBuf::from("/sys/fs/cgroup/unified")]
        );
        let pure =
            "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0\n";
        assert_eq!(cgroup2_mounts(pure), vec![PathBuf::from("/sys/fs/cgroup")]);
        assert!(cgroup2_mounts("proc /proc proc rw 0 0\n").is_empty());
        let spaced = "cgroup2 /mnt/my\\040cg cgroup2 rw 0 0\n";
        assert_eq!(cgroup2_mounts(spaced), vec![PathBuf::from("/mnt/my cg")]);
    }

    #[test]
    fn v2_line_of_proc_pid_cgroup() {
        assert_eq!(
            v2_path("0::/process_api/55c29c47b665f676013de2dd9d4732a7\n"),
            Some("/process_api/55c29c47b665f676013de2dd9d4732a7")
        );
        let hybrid = "12:memory:/user.slice\n1:name=systemd:/user.slice\n0::/user.slice/user-0.slice/session-3.scope\n";
        assert_eq!(
            v2_path(hybrid),
            Some("/user.slice/user-0.slice/session-3.scope")
        );
        assert_eq!(v2_path("12:memory:/x\n"), None);
    }

    #[test]
    fn docker_both_drivers() {
        let w = classify(&format!("/system.slice/docker-{ID}.scope"));
        assert_eq!(w.container, Some((Runtime::Docker, ID.to_string())));
        assert_eq!(w.short_container_id(), Some(&ID[..12]));
        let w = classify(&format!("/docker/{ID}"));
        assert_eq!(w.container, Some((Runtime::Docker, ID.to_string())));
        assert_eq!(w.pod, None);
    }

    #[test]
    fn kubernetes_systemd_driver_all_qos_classes() {
        let u = UID.replace('-', "_");
        let burstable = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"
        );
        let w = classify(&burstable);
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::Burstable)));
        assert_eq!(w.container, Some((Runtime::Containerd, ID.to_string())));
        let besteffort = format!(
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u}.slice/crio-{ID}.scope"
        );
        let w = classify(&besteffort);
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::BestEffort)));
        assert_eq!(w.container, Some((Runtime::CriO, ID.to_string())));
        let guaranteed = format!("/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope");
        assert_eq!(
            classify(&guaranteed).pod,
            Some((UID.to_string(), QosClass::Guaranteed))
        );
        // The pod's own cgroup (pause process or a process placed there): pod, no container.
        let w = classify(&format!("/kubepods.slice/kubepods-pod{u}.slice"));
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::Guaranteed)));
        assert_eq!(w.container, None);
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        let w = classify(&format!("/kubepods/burstable/pod{UID}/{ID}"));
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::Burstable)));
        assert_eq!(w.container, Some((Runtime::Kubernetes, ID.to_string())));
        let w = classify(&format!("/kubepods/pod{UID}/crio-{ID}"));
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::Guaranteed)));
        assert_eq!(w.container, Some((Runtime::CriO, ID.to_string())));
        let w = classify(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::BestEffort)));
    }

    #[test]
    fn podman_root_rootless_and_conmon() {
        let w = classify(&format!("/machine.slice/libpod-{ID}.scope"));
        assert_eq!(w.container, Some((Runtime::Podman, ID.to_string())));
        let w = classify(&format!(
            "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
        ));
        assert_eq!(w.container, Some((Runtime::Podman, ID.to_string())));
        let w = classify(&format!("/libpod_parent/libpod-{ID}"));
        assert_eq!(w.container, Some((Runtime::Podman, ID.to_string())));
        // podman's monitor is not the container.
        let w = classify(&format!("/machine.slice/libpod-conmon-{ID}.scope"));
        assert_eq!(w.container, None);
        assert_eq!(
            w.unit.as_deref(),
            Some(&*format!("libpod-conmon-{ID}.scope"))
        );
    }

    #[test]
    fn services_slices_and_lookalikes() {
        let w = classify("/system.slice/nvidia-persistenced.service");
        assert_eq!(w.unit.as_deref(), Some("nvidia-persistenced.service"));
        assert_eq!(w.container, None);
        let w = classify("/user.slice/user-0.slice/session-3.scope");
        assert_eq!(w.unit.as_deref(), Some("session-3.scope"));
        assert_eq!(classify("/"), Workload::default());
        // Not 64 hex digits: not a container id.
        assert_eq!(classify("/system.slice/docker-abc.scope").container, None);
        assert_eq!(classify("/docker/xyz").container, None);
        // A "pod" that is not a UID.
        assert_eq!(classify("/kubepods/podcast/x").pod, None);
    }

    #[test]
    fn resolver_maps_ids_to_paths_on_a_real_tree() {
        // A plain directory tree stands for the cgroup2 mount: ids are inode numbers there
        // too, which is what the resolver reads.
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let pod = dir.join("kubepods/besteffort").join(format!("pod{UID}"));
        fs::create_dir_all(&pod).unwrap();
        let mut r = CgroupResolver::new(dir.clone());
        let id = fs::metadata(&pod).unwrap().ino();
        assert_eq!(r.path(id), Some(&*format!("/kubepods/besteffort/pod{UID}")));
        assert_eq!(
            r.id_of(&format!("/kubepods/besteffort/pod{UID}")).unwrap(),
            id
        );
        // A cgroup created after the first walk is found by the walk a miss triggers.
        let late = dir.join("late");
        fs::create_dir(&late).unwrap();
        let late_id = fs::metadata(&late).unwrap().ino();
        assert_eq!(r.path(late_id), Some("/late"));
        // A removed one disappears on the next walk.
        fs::remove_dir(&late).unwrap();
        r.walk();
        assert_eq!(r.path(late_id), None);
        drop(scratch);
    }
}
