//! Pod names on the node: the kubelet's log directory (`/var/log/pods`), read as log shippers
//! (Fluent Bit, Vector) read it. The kubelet makes one directory per pod,
//! `<namespace>_<pod name>_<pod UID>` (kubernetes `pkg/kubelet/kuberuntime/helpers.go`,
//! `BuildPodLogsDirectory`, joined with `_`), and in it one per container,
//! `<container name>/` (`BuildContainerLogsDirectory`); where the node also keeps the legacy
//! symlinks `/var/log/containers/<pod name>_<namespace>_<container name>-<container id>.log`
//! (`legacyLogSymlink`, kuberuntime/legacy.go), a container id names its container.
//!
//! A pod's cgroup gives its UID (`model::workload`); this names it. The directory is read once,
//! then again only when a UID (or a container id) is not in it, at most once per
//! [`MIN_REREAD`] (a process in a pod whose directory is gone does not make every event reread
//! it), and at most [`MAX_PODS`] pods and [`MAX_CONTAINERS`] containers of each are kept. Names
//! are untrusted: only Kubernetes names (a namespace and a container are DNS-1123 labels, a
//! pod a DNS-1123 subdomain, so none holds `_`) are believed; any other directory is skipped,
//! never guessed at.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use gpu_trace_core::model::workload::{PodNames, PodResolver};

/// Where the kubelet keeps pod logs (the DaemonSet mounts it read-only at the same path).
pub const DEFAULT_DIR: &str = "/var/log/pods";

/// The shortest time between two reads of the directory.
pub const MIN_REREAD: Duration = Duration::from_secs(2);

/// Pods kept from one read (a node runs at most a few hundred).
pub const MAX_PODS: usize = 16_384;

/// Containers kept per pod.
pub const MAX_CONTAINERS: usize = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Pod {
    namespace: String,
    name: String,
    containers: Vec<String>,
}

/// The pods of a log directory, by UID (see the module documentation).
#[derive(Debug)]
pub struct PodDirectory {
    root: PathBuf,
    /// The legacy symlinks' directory (`containers` beside `root`), when there is one.
    links: PathBuf,
    pods: HashMap<String, Pod>,
    /// Container id → container name, from the legacy symlinks.
    containers: HashMap<String, String>,
    last_read: Option<Instant>,
    min_reread: Duration,
    reads: u64,
}

/// A DNS-1123 label: 1 to 63 of `a-z0-9-`, starting and ending with a letter or digit.
fn is_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain: labels joined by `.`, 253 bytes at most.
fn is_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_label)
}

/// A pod UID as the kubelet writes it (a UUID; a static pod's is a hash): hex digits and dashes.
fn is_uid(s: &str) -> bool {
    (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// `(namespace, pod name, UID)` of a pod directory's name.
pub fn parse_pod_dir(name: &str) -> Option<(&str, &str, &str)> {
    let mut parts = name.split('_');
    let (ns, pod, uid) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = parts.next().is_none() && is_label(ns) && is_subdomain(pod) && is_uid(uid);
    ok.then_some((ns, pod, uid))
}

/// `(pod name, namespace, container name, container id)` of a legacy symlink's name.
pub fn parse_container_link(name: &str) -> Option<(&str, &str, &str, &str)> {
    let stem = name.strip_suffix(".log")?;
    let (rest, id) = stem.rsplit_once('-')?;
    let mut parts = rest.split('_');
    let (pod, ns, container) = (parts.next()?, parts.next()?, parts.next()?);
    let ok = parts.next().is_none()
        && is_subdomain(pod)
        && is_label(ns)
        && is_label(container)
        && id.len() == 64
        && id.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then_some((pod, ns, container, id))
}

/// The names of the entries of `dir` (those that are UTF-8), at most `max`.
pub fn entries(dir: &Path, max: usize) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
        .take(max)
        .collect()
}

impl PodDirectory {
    /// The pods under `root` (normally [`DEFAULT_DIR`]); nothing is read until the first
    /// lookup.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let links = root.with_file_name("containers");
        Self {
            root,
            links,
            pods: HashMap::new(),
            containers: HashMap::new(),
            last_read: None,
            min_reread: MIN_REREAD,
            reads: 0,
        }
    }

    /// Rereads no more often than `every` (tests).
    pub fn with_min_reread(mut self, every: Duration) -> Self {
        self.min_reread = every;
        self
    }

    /// How many times the directory was read.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Reads the directory again, when the last read is at least [`MIN_REREAD`] old.
    fn refresh(&mut self) {
        let now = Instant::now();
        if self
            .last_read
            .is_some_and(|t| now.duration_since(t) < self.min_reread)
        {
            return;
        }
        self.last_read = Some(now);
        self.reads += 1;
        self.pods.clear();
        for name in entries(&self.root, MAX_PODS) {
            let Some((ns, pod, uid)) = parse_pod_dir(&name) else {
                continue;
            };
            let mut containers: Vec<String> = entries(&self.root.join(&name), MAX_CONTAINERS)
                .into_iter()
                .filter(|c| is_label(c))
                .collect();
            containers.sort();
            let pod = Pod {
                namespace: ns.to_string(),
                name: pod.to_string(),
                containers,
            };
            self.pods.insert(uid.to_string(), pod);
        }
        self.containers.clear();
        for name in entries(&self.links, MAX_PODS * 4) {
            if let Some((_, _, container, id)) = parse_container_link(&name) {
                self.containers
                    .insert(id.to_string(), container.to_string());
            }
        }
    }

    fn names(&self, uid: &str, container_id: Option<&str>) -> Option<PodNames> {
        let pod = self.pods.get(uid)?;
        let by_id = container_id
            .and_then(|id| self.containers.get(id))
            .filter(|c| pod.containers.contains(c));
        let container = match (by_id, pod.containers.as_slice()) {
            (Some(c), _) => Some(c.clone()),
            // One container: the process can be in no other.
            (None, [only]) => Some(only.clone()),
            _ => None,
        };
        Some(PodNames {
            namespace: pod.namespace.clone(),
            pod: pod.name.clone(),
            container,
        })
    }

    /// The names of pod `uid` (and of container `container_id` in it), reading the directory
    /// again (rate-limited) when it does not know them.
    pub fn lookup(&mut self, uid: &str, container_id: Option<&str>) -> Option<PodNames> {
        let known = |d: &Self| {
            d.names(uid, container_id)
                .filter(|n| n.container.is_some() || container_id.is_none())
        };
        if let Some(n) = known(self) {
            return Some(n);
        }
        self.refresh();
        self.names(uid, container_id)
    }
}

impl PodResolver for PodDirectory {
    fn resolve(&mut self, pod_uid: &str, container_id: Option<&str>) -> Option<PodNames> {
        self.lookup(pod_uid, container_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "11111111-2222-4333-8444-555555555501";
    const ID: &str = "c1c1c1c1aaaa000000000000000000000000000000000000000000000000c1c1";

    /// A kubelet-shaped tree in a fresh directory: `pods/` and `containers/`.
    fn tree(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("gpu-trace-pods-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("pods")).unwrap();
        fs::create_dir_all(dir.join("containers")).unwrap();
        dir
    }

    fn pod(dir: &Path, ns: &str, name: &str, uid: &str, containers: &[&str]) {
        for c in containers {
            fs::create_dir_all(dir.join("pods").join(format!("{ns}_{name}_{uid}")).join(c))
                .unwrap();
        }
    }

    #[test]
    fn directory_names_parse_as_the_kubelet_builds_them() {
        assert_eq!(
            parse_pod_dir(&format!("ml-team_trainer-0_{UID}")),
            Some(("ml-team", "trainer-0", UID))
        );
        // Subdomain pod names hold dots; namespaces do not.
        assert!(parse_pod_dir(&format!("ns_a.b-c_{UID}")).is_some());
        for bad in [
            format!("ns_{UID}"),
            format!("Ns_p_{UID}"),
            format!("ns_p_{UID}_x"),
            format!("ns_p\u{202e}x_{UID}"),
            format!("ns_p\nx_{UID}"),
            "ns_p_not-a-uid!".to_string(),
        ] {
            assert_eq!(parse_pod_dir(&bad), None, "{bad:?}");
        }
        assert_eq!(
            parse_container_link(&format!("trainer-0_ml-team_cuda-{ID}.log")),
            Some(("trainer-0", "ml-team", "cuda", ID))
        );
        assert_eq!(
            parse_container_link(&format!("p_ns_c-{}.log", &ID[1..])),
            None
        );
    }

    #[test]
    fn a_pod_is_named_its_one_container_too_and_others_by_their_link() {
        let dir = tree("names");
        pod(&dir, "ml-team", "trainer-0", UID, &["cuda"]);
        let two = "11111111-2222-4333-8444-555555555502";
        pod(&dir, "infer", "server-7f9", two, &["sidecar", "triton"]);
        let mut d = PodDirectory::new(dir.join("pods"));
        let n = d.lookup(UID, Some(ID)).unwrap();
        assert_eq!(
            (n.namespace.as_str(), n.pod.as_str(), n.container.as_deref()),
            ("ml-team", "trainer-0", Some("cuda"))
        );
        // Two containers and no link: which one is not known, so none is named.
        let n = d.lookup(two, Some(ID)).unwrap();
        assert_eq!((n.pod.as_str(), n.container), ("server-7f9", None));
        // The legacy link names it (after the reread interval).
        fs::File::create(dir.join(format!("containers/server-7f9_infer_triton-{ID}.log"))).unwrap();
        let mut d = PodDirectory::new(dir.join("pods"));
        let n = d.lookup(two, Some(ID)).unwrap();
        assert_eq!(n.container.as_deref(), Some("triton"));
        assert_eq!(d.lookup("99999999-2222-4333-8444-555555555509", None), None);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_uids_reread_at_most_once_per_interval() {
        let dir = tree("reread");
        let mut d = PodDirectory::new(dir.join("pods")).with_min_reread(Duration::from_secs(3600));
        assert_eq!(d.lookup(UID, None), None);
        // A pod that appears after the read is not seen within the interval, however often
        // it is asked for: one read in all.
        pod(&dir, "ns", "late", UID, &["c"]);
        for _ in 0..1000 {
            assert_eq!(d.lookup(UID, None), None);
        }
        assert_eq!(d.reads(), 1);
        // With the interval passed, it is.
        let mut d = PodDirectory::new(dir.join("pods")).with_min_reread(Duration::ZERO);
        assert_eq!(d.lookup(UID, None).unwrap().pod, "late");
        // Known UIDs are answered without reading again.
        for _ in 0..100 {
            d.lookup(UID, None).unwrap();
        }
        assert_eq!(d.reads(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
