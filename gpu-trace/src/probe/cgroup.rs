//! Which cgroup a process belongs to, read from the system.
//!
//! Facts read here, and only here: the cgroup v2 mount(s) in `/proc/mounts`, a process's v2 path
//! in `/proc/PID/cgroup`, and the cgroup id of a directory under the cgroup2 mount (its inode
//! number: the id `bpf_get_current_cgroup_id()` returns). What a path says about containers and
//! pods is `model::workload`'s (pure).

use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use crate::model::workload::{
    ContainerCgroup, ContainerChoice, Maker, choose_container, container_cgroup,
};

/// Why a `--cgroup` / `--container` argument names no usable cgroup.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "no cgroup v2 mount on this host (/proc/mounts lists none): container filters and \
         attribution need cgroup v2 (mount it, or boot with systemd.unified_cgroup_hierarchy=1)"
    )]
    NoCgroup2,
    #[error("cgroup {path}: {source} (give a path under {root}, e.g. /system.slice)")]
    NoSuchCgroup {
        path: String,
        root: String,
        source: std::io::Error,
    },
    #[error(
        "container {prefix}: no running container's cgroup has an id starting with it (the \
         container must be running when gpu-trace starts; `podman ps`/`docker ps`/`crictl ps` \
         list ids)"
    )]
    NoSuchContainer { prefix: String },
    #[error(
        "container {prefix}: ambiguous, it matches {} containers: {}; give more digits, or \
         select one by its cgroup with --cgroup PATH",
        .candidates.len(),
        .candidates.join("; ")
    )]
    AmbiguousContainer {
        prefix: String,
        /// `ID12 (runtime) at PATH`, `… user UID's container` for a rootless one; sorted.
        candidates: Vec<String>,
    },
    #[error("container {0:?}: a container id is hexadecimal (at least 4 digits)")]
    BadContainerId(String),
    #[error("{what}: {n} cgroups given, the kernel programs take at most 8")]
    TooMany { what: &'static str, n: usize },
}

impl CgroupError {
    /// The host cannot do it (no cgroup v2), as opposed to a wrong argument.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Self::NoCgroup2)
    }
}

/// One cgroup subtree: its path below the cgroup2 root, id and depth (for the kernel's
/// ancestor match).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subtree {
    pub path: String,
    pub id: u64,
    pub level: u32,
}

impl Subtree {
    /// Whether the cgroup at `path` (below the cgroup2 root) is this subtree or below it.
    pub fn contains(&self, path: &str) -> bool {
        let root = self.path.trim_end_matches('/');
        path == self.path
            || path
                .strip_prefix(root)
                .is_some_and(|rest| rest.starts_with('/'))
    }

    /// The kernel programs' form of it.
    pub fn kernel_match(&self) -> gpu_trace_common::CgroupMatch {
        gpu_trace_common::CgroupMatch {
            id: self.id,
            level: self.level,
            _pad: 0,
        }
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

/// The cgroup v2 path of process `pid` now (`/proc/PID/cgroup`), `None` when it is gone or has
/// no v2 membership.
pub fn process_v2_path(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    v2_path(&text).map(str::to_string)
}

/// The cgroup v2 path of a process from its `/proc/PID/cgroup` text: the `0::PATH` line.
/// `None` on a host where the process has no v2 membership line.
pub fn v2_path(proc_pid_cgroup: &str) -> Option<&str> {
    proc_pid_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::trim_end)
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

/// The id (kernfs inode number) of the cgroup2 root.
const ROOT_CGROUP_ID: u64 = 1;

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

    /// The cgroup2 mount that shows the whole hierarchy, if any: the one whose directory is
    /// the root cgroup (id 1). In a container with a private cgroup namespace its own
    /// /sys/fs/cgroup shows only its subtree; the host's, mounted elsewhere (the DaemonSet's
    /// /host/sys/fs/cgroup), is preferred. Without a root mount, the first one.
    pub fn for_host() -> Option<Self> {
        let mounts = cgroup2_mounts(&super::system::mounts());
        let root = mounts
            .iter()
            .find(|m| fs::metadata(m).is_ok_and(|md| md.ino() == ROOT_CGROUP_ID));
        root.or(mounts.first()).cloned().map(Self::new)
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

    /// The subtree `path` names (relative to the cgroup2 root, `/a/b`, or absolute under it).
    pub fn subtree(&self, path: &str) -> Result<Subtree, CgroupError> {
        let p = Path::new(path);
        let rel = p
            .strip_prefix(&self.root)
            .unwrap_or_else(|_| Path::new(path.trim_start_matches('/')));
        let components: Vec<String> = rel
            .components()
            .filter_map(|c| match c {
                std::path::Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        let normal = format!("/{}", components.join("/"));
        let id = self
            .id_of(&normal)
            .map_err(|source| CgroupError::NoSuchCgroup {
                path: path.to_string(),
                root: self.root.display().to_string(),
                source,
            })?;
        Ok(Subtree {
            path: normal,
            id,
            level: components.len() as u32,
        })
    }

    /// The cgroup of the one running container whose id starts with `prefix`: the container's
    /// own cgroup (its inner cgroups are in the subtree), where
    /// [`crate::model::workload::classify`] believes a container is. Who made each cgroup found
    /// ([`Maker`]: the path's `user@UID.service`, else its directory's owner) decides between
    /// several ([`choose_container`]): root's container wins over users' copies of its id,
    /// which come back in [`ContainerFound::not_meant`]; two of the same rank (two containers)
    /// are refused with the candidates.
    pub fn find_container(&mut self, prefix: &str) -> Result<ContainerFound, CgroupError> {
        let want = prefix.to_ascii_lowercase();
        if want.len() < 4 || !want.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CgroupError::BadContainerId(prefix.to_string()));
        }
        self.walk();
        let mut found: Vec<(Maker, ContainerCgroup)> = Vec::new();
        for path in self.by_id.values() {
            if let Some(c) = container_cgroup(path)
                && c.id.starts_with(&want)
                && !found.iter().any(|(_, f)| f.path == c.path)
            {
                let owner = self.dir_meta(&c.path).map(|m| m.uid());
                found.push((Maker::of(&c, owner), c));
            }
        }
        // By path within a rank: the same order every run.
        found.sort_by(|a, b| a.1.path.cmp(&b.1.path));
        match choose_container(found) {
            ContainerChoice::None => Err(CgroupError::NoSuchContainer {
                prefix: prefix.to_string(),
            }),
            ContainerChoice::One { chosen, not_meant } => Ok(ContainerFound {
                subtree: self.subtree(&chosen.1.path)?,
                not_meant: not_meant.into_iter().map(|(m, c)| (m, c.path)).collect(),
            }),
            ContainerChoice::Ambiguous(all) => Err(CgroupError::AmbiguousContainer {
                prefix: prefix.to_string(),
                candidates: all.iter().map(|(m, c)| candidate(*m, c)).collect(),
            }),
        }
    }

    /// [`Self::find_container`]'s subtree (the cgroups not meant are not said).
    pub fn container(&mut self, prefix: &str) -> Result<Subtree, CgroupError> {
        self.find_container(prefix).map(|f| f.subtree)
    }

    /// The metadata of the cgroup directory at `path` (below the root).
    fn dir_meta(&self, path: &str) -> Option<fs::Metadata> {
        fs::metadata(self.root.join(path.trim_start_matches('/'))).ok()
    }
}

/// What [`CgroupResolver::container`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerFound {
    /// The container meant.
    pub subtree: Subtree,
    /// Cgroups with the same id made by less believed makers (users' copies): not selected.
    /// Paths as the host names them (escape before printing).
    pub not_meant: Vec<(Maker, String)>,
}

/// One candidate of an ambiguous `--container`: `ID12 (runtime[, maker]) at PATH`.
fn candidate(maker: Maker, c: &ContainerCgroup) -> String {
    let owner = match maker {
        Maker::Root => String::new(),
        Maker::User(uid) => format!(", user {uid}'s container"),
        Maker::Owner(uid) => format!(", cgroup owned by uid {uid}"),
    };
    format!(
        "{} ({}{owner}) at {}",
        &c.id[..12],
        c.runtime.name(),
        gpu_trace_core::escape::escape_text(&c.path)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn subtrees_and_containers_are_found_by_path_and_id_prefix() {
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().to_path_buf();
        let a = "4f1a6f0c9b3e2d8a7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d";
        let b = "4f1a00000000000000000000000000000000000000000000000000000000beef";
        let ctr_a = root.join(format!("machine.slice/libpod-{a}.scope"));
        // podman's inner cgroup for the container's processes: the outer one is the subtree.
        fs::create_dir_all(ctr_a.join("container")).unwrap();
        fs::create_dir_all(root.join(format!("system.slice/docker-{b}.scope"))).unwrap();
        let mut r = CgroupResolver::new(root.clone());

        // Depth counts components below the root; both spellings of a path name one subtree.
        let by_rel = r.subtree("/machine.slice").unwrap();
        assert_eq!(by_rel.level, 1);
        assert_eq!(by_rel.path, "/machine.slice");
        let abs = root.join("machine.slice");
        assert_eq!(r.subtree(abs.to_str().unwrap()).unwrap(), by_rel);
        assert_eq!(
            by_rel.id,
            fs::metadata(root.join("machine.slice")).unwrap().ino()
        );
        assert!(by_rel.contains("/machine.slice"));
        assert!(by_rel.contains("/machine.slice/libpod-x.scope/container"));
        assert!(!by_rel.contains("/machine.slice2/x"));
        assert!(!by_rel.contains("/"));
        let root_tree = r.subtree("/").unwrap();
        assert_eq!(root_tree.level, 0);
        assert!(root_tree.contains("/anything/below"));
        assert!(matches!(
            r.subtree("/nope.slice"),
            Err(CgroupError::NoSuchCgroup { .. })
        ));

        let sub = r.container("4F1A6F0C").unwrap();
        assert_eq!(sub.path, format!("/machine.slice/libpod-{a}.scope"));
        assert_eq!(sub.level, 2);
        assert_eq!(sub.id, fs::metadata(&ctr_a).unwrap().ino());
        match r.container("4f1a") {
            Err(CgroupError::AmbiguousContainer { candidates, .. }) => assert_eq!(
                candidates,
                vec![
                    format!("{} (podman) at /machine.slice/libpod-{a}.scope", &a[..12]),
                    format!("{} (docker) at /system.slice/docker-{b}.scope", &b[..12]),
                ]
            ),
            other => panic!("want ambiguous, got {other:?}"),
        }
        assert!(matches!(
            r.container("dead"),
            Err(CgroupError::NoSuchContainer { .. })
        ));
        assert!(matches!(
            r.container("xyz1"),
            Err(CgroupError::BadContainerId(_))
        ));
        assert!(matches!(
            r.container("4f1"),
            Err(CgroupError::BadContainerId(_))
        ));
    }

    /// Each runtime's real layout is found by `--container`; names a user (or a container, or a
    /// delegated service) made below its own cgroup are either marked as the user's or not
    /// believed, and a prefix that matches two root-made cgroups is refused with all listed.
    #[test]
    fn forged_containers_are_not_picked_by_prefix() {
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().to_path_buf();
        let real = "a1b2c3d4e5f60000000000000000000000000000000000000000000000000001";
        let nested = "c0ffee0000000000000000000000000000000000000000000000000000000002";
        let delegated = "d0d0d0d000000000000000000000000000000000000000000000000000000003";
        let rootless = "e0e0e0e000000000000000000000000000000000000000000000000000000004";
        let pod = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            UID.replace('-', "_")
        );
        let user = "user.slice/user-1000.slice/user@1000.service";
        for dir in [
            // A real pod's container (kubelet, systemd driver, containerd).
            format!("{pod}/cri-containerd-{real}.scope"),
            // The same id, forged by user 1000 in its own subtree (a shorter path).
            format!("{user}/docker-{real}.scope"),
            // A container named inside another container's cgroup.
            format!("system.slice/docker-{real}.scope/docker-{nested}.scope"),
            // A container named below a service that delegates its subtree.
            format!("system.slice/batch.service/docker-{delegated}.scope"),
            // A real rootless podman container.
            format!("{user}/user.slice/libpod-{rootless}.scope/container"),
        ] {
            fs::create_dir_all(root.join(dir)).unwrap();
        }
        let mut r = CgroupResolver::new(root);
        match r.container(&real[..8]) {
            Err(e @ CgroupError::AmbiguousContainer { .. }) => {
                let msg = e.to_string();
                for want in [
                    format!("a1b2c3d4e5f6 (containerd) at /{pod}/cri-containerd-{real}.scope"),
                    format!(
                        "a1b2c3d4e5f6 (docker, user 1000's container) at /{user}/docker-{real}.scope"
                    ),
                    format!("a1b2c3d4e5f6 (docker) at /system.slice/docker-{real}.scope"),
                ] {
                    assert!(msg.contains(&want), "{want} in {msg}");
                }
            }
            other => panic!("want ambiguous, got {other:?}"),
        }
        for not_believed in [nested, delegated] {
            assert!(
                matches!(
                    r.container(&not_believed[..8]),
                    Err(CgroupError::NoSuchContainer { .. })
                ),
                "{not_believed}"
            );
        }
        let sub = r.container(&rootless[..8]).unwrap();
        assert_eq!(
            sub.path,
            format!("/{user}/user.slice/libpod-{rootless}.scope")
        );
    }

    /// Issue 36, item 5: root's container wins over a user's copy of its id (under its
    /// `user@UID.service`, or in a directory it owns), which is listed, not selected.
    #[test]
    fn root_containers_win_over_users_copies_of_their_id() {
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().to_path_buf();
        let id = "3f2a9c1b00000000000000000000000000000000000000000000000000000005";
        let real = format!("system.slice/docker-{id}.scope");
        let copy =
            format!("user.slice/user-1000.slice/user@1000.service/app.slice/docker-{id}.scope");
        for dir in [&real, &copy] {
            fs::create_dir_all(root.join(dir)).unwrap();
        }
        let mut r = CgroupResolver::new(root.clone());
        let found = r.find_container(&id[..8]).unwrap();
        assert_eq!(found.subtree.path, format!("/{real}"));
        assert_eq!(
            found.not_meant,
            vec![(Maker::User(1000), format!("/{copy}"))]
        );

        // A copy at a place only root can name, but in a directory a user owns (handed by
        // hand): root's still wins; where this test may not chown, that part is skipped.
        let owned = format!("machine.slice/libpod-{id}.scope");
        fs::create_dir_all(root.join(&owned)).unwrap();
        if std::os::unix::fs::chown(root.join(&owned), Some(1000), Some(1000)).is_ok() {
            let found = r.find_container(&id[..8]).unwrap();
            assert_eq!(found.subtree.path, format!("/{real}"));
            assert_eq!(
                found.not_meant,
                vec![
                    (Maker::Owner(1000), format!("/{owned}")),
                    (Maker::User(1000), format!("/{copy}")),
                ]
            );
        }
        // Without root's, the user's rootless container is the one (nothing else to mean).
        fs::remove_dir(root.join(&real)).unwrap();
        fs::remove_dir(root.join(&owned)).unwrap();
        let found = r.find_container(&id[..8]).unwrap();
        assert_eq!(found.subtree.path, format!("/{copy}"));
        assert!(found.not_meant.is_empty());
    }
}
