//! Who owns a process, from its cgroup v2 path: container runtime and id, Kubernetes pod UID
//! and QoS class, or systemd unit. Pure: the path comes from a record (the kernel's cgroup id,
//! resolved by `probe::cgroup`) or from /proc. The naming schemes of both cgroup drivers
//! (systemd and cgroupfs):
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

use std::borrow::Cow;

use crate::escape::escape_text;

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
    /// The systemd unit (service or scope) the process runs in, outside containers: the
    /// outermost one (the one the host's systemd made).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The path is in the subtree systemd delegates to this user (`user@UID.service`): what it
    /// names there (a rootless container) is that user's claim, never a pod.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<u32>,
}

impl Workload {
    /// The short container id printed in text output (12 hex digits, as docker and podman do).
    pub fn short_container_id(&self) -> Option<&str> {
        self.container
            .as_ref()
            .map(|(_, id)| &id[..id.len().min(12)])
    }
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

/// `user@UID.service`: the unit of a user's own systemd, whose subtree systemd delegates to
/// that (unprivileged) user.
fn user_service_uid(component: &str) -> Option<u32> {
    component
        .strip_prefix("user@")?
        .strip_suffix(".service")?
        .parse()
        .ok()
}

/// A systemd unit's cgroup (a service or a scope): what is below it may be delegated (container
/// scopes, `user@UID.service`, services with `Delegate=yes`), so its contents are named by
/// whoever runs in it. Slices cannot be delegated.
fn is_unit(component: &str) -> bool {
    component.ends_with(".service") || component.ends_with(".scope")
}

/// A container found by [`classify`]: what it says and where its own cgroup is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerCgroup {
    pub runtime: Runtime,
    /// 64 hex digits.
    pub id: String,
    /// The container is in the subtree systemd delegates to this user (rootless).
    pub user: Option<u32>,
    /// The container's own cgroup (a prefix of the classified path).
    pub path: String,
}

/// Who made a container's cgroup, for `--container`/`--deny-container`: the most believed
/// first (the order [`choose_container`] ranks by).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Maker {
    /// A place only root can create, in a directory root owns: the host's runtime.
    Root,
    /// A place only root can create, but the directory belongs to this uid: handed over (a
    /// runtime may give a user-namespaced container its cgroup) or delegated by hand.
    Owner(u32),
    /// The subtree systemd delegates to this user (`user@UID.service`): the user's own claim.
    User(u32),
}

impl Maker {
    /// The maker of `c`, whose directory belongs to `dir_uid` (`None`: not known).
    pub fn of(c: &ContainerCgroup, dir_uid: Option<u32>) -> Self {
        match (c.user, dir_uid) {
            (Some(uid), _) => Self::User(uid),
            (None, Some(uid)) if uid != 0 => Self::Owner(uid),
            _ => Self::Root,
        }
    }
}

impl std::fmt::Display for Maker {
    /// Where such a cgroup is: `under user 1000's delegated cgroup`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Root => write!(f, "in a root-owned cgroup"),
            Self::Owner(uid) => write!(f, "in a cgroup owned by uid {uid}"),
            Self::User(uid) => write!(f, "under user {uid}'s delegated cgroup"),
        }
    }
}

/// What [`choose_container`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerChoice<T> {
    None,
    /// The one meant, and the cgroups with the same id whose makers are less believed (a
    /// user's copy of the id cannot take its place, nor make the choice ambiguous).
    One {
        chosen: T,
        not_meant: Vec<T>,
    },
    /// Several cgroups of the most believed maker found: all of them, most believed first.
    Ambiguous(Vec<T>),
}

/// Chooses among the cgroups of the containers an id prefix matches: the most believed
/// [`Maker`] rank wins when it has one cgroup (the others are `not_meant`); two of that rank
/// are ambiguous. Root's scope therefore wins over any number of users' copies of its id; two
/// copies made by users, with no root one, stay ambiguous.
pub fn choose_container<T>(mut found: Vec<(Maker, T)>) -> ContainerChoice<(Maker, T)> {
    found.sort_by_key(|(m, _)| rank(*m));
    let Some(first) = found.first().map(|(m, _)| rank(*m)) else {
        return ContainerChoice::None;
    };
    if found.get(1).is_some_and(|(m, _)| rank(*m) == first) {
        return ContainerChoice::Ambiguous(found);
    }
    let mut found = found.into_iter();
    let chosen = found.next().expect("one at least");
    ContainerChoice::One {
        chosen,
        not_meant: found.collect(),
    }
}

/// The rank of a maker: every user or owner is the same rank (two users' copies are as
/// believable as each other).
fn rank(m: Maker) -> u8 {
    match m {
        Maker::Root => 0,
        Maker::Owner(_) => 1,
        Maker::User(_) => 2,
    }
}

/// Classifies a cgroup v2 path (as in `/proc/PID/cgroup`, starting with `/`). Only what the
/// host's root wrote is believed (docs/containers.md, "Where runtimes put containers"): the
/// path is read from the top down to its first systemd unit, and
///
/// - a Kubernetes pod is a `kubepods*` component with the pod one or two levels below it (the
///   QoS level between), all above any unit: kubelet's layout at the top of the hierarchy or
///   under a node-level parent that is not a unit (`--cgroup-root`);
/// - a container is the first unit when it names one (`docker-`, `cri-containerd-`, `crio-`,
///   `libpod-<64 hex>.scope`) and its parent is a slice (`system.slice`, `machine.slice`); the
///   component after a pod's; or, above any unit, `docker/<id>` or `libpod_parent/libpod-<id>`
///   (cgroupfs drivers);
/// - below `user@UID.service` (a user's delegated subtree) a container name is a rootless
///   container of that user ([`Workload::user`]), and never a pod;
/// - below any other unit, nothing is believed: a container's inner cgroups (nested runtimes)
///   are the container's, a delegated service's are the service's.
///
/// Paths with no container and no pod give the outermost unit.
pub fn classify(path: &str) -> Workload {
    analyse(path).0
}

/// The container of the process in `path` and its own cgroup, if [`classify`] finds one.
pub fn container_cgroup(path: &str) -> Option<ContainerCgroup> {
    let (w, at) = analyse(path);
    let (runtime, id) = w.container?;
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    Some(ContainerCgroup {
        runtime,
        id,
        user: w.user,
        path: format!("/{}", components[..=at?].join("/")),
    })
}

/// [`classify`], with the index of the container's component.
fn analyse(path: &str) -> (Workload, Option<usize>) {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut w = Workload::default();
    let mut at = None;
    for (i, &c) in components.iter().enumerate() {
        let parent = i.checked_sub(1).map(|p| components[p]);
        if c.starts_with("kubepods") && !is_unit(c) {
            if let Some((j, pod)) = pod_below(&components, i) {
                w.pod = Some(pod);
                // The container is the next component, if any.
                if let Some(next) = components.get(j + 1) {
                    w.container = container_of(next).or_else(|| {
                        is_container_id(next).then(|| (Runtime::Kubernetes, next.to_string()))
                    });
                    at = w.container.is_some().then_some(j + 1);
                }
            }
            break;
        }
        if parent == Some("docker") && is_container_id(c) {
            w.container = Some((Runtime::Docker, c.to_string()));
            at = Some(i);
            break;
        }
        if parent == Some("libpod_parent")
            && let Some(found @ (Runtime::Podman, _)) = container_of(c)
        {
            w.container = Some(found);
            at = Some(i);
            break;
        }
        if is_unit(c) {
            if let Some(uid) = user_service_uid(c) {
                // A user's own subtree: a rootless container (the outermost name), never a pod.
                w.user = Some(uid);
                if let Some((k, found)) = components
                    .iter()
                    .enumerate()
                    .skip(i + 1)
                    .find_map(|(k, c)| Some((k, container_of(c)?)))
                {
                    w.container = Some(found);
                    at = Some(k);
                }
            } else if parent.is_some_and(|p| p.ends_with(".slice"))
                && let Some(found) = container_of(c)
            {
                w.container = Some(found);
                at = Some(i);
            }
            break;
        }
    }
    if w.container.is_none() && w.pod.is_none() {
        w.unit = components
            .iter()
            .find(|c| is_unit(c))
            .map(|c| c.to_string());
    }
    (w, at)
}

/// The pod below the `kubepods*` component at `kp`: at `kp + 1` (Guaranteed) or at `kp + 2`
/// below a `besteffort`/`burstable` level, none of them a unit. Its index, UID and QoS class.
fn pod_below(components: &[&str], kp: usize) -> Option<(usize, (String, QosClass))> {
    for j in [kp + 1, kp + 2] {
        let c = components.get(j)?;
        if is_unit(c) {
            return None;
        }
        let between = &components[kp + 1..j];
        let qos_level = |word: &str| c.contains(word) || between.iter().any(|p| p.contains(word));
        if let Some(uid) = pod_uid(c) {
            if j == kp + 2
                && !between
                    .iter()
                    .any(|p| p.contains("besteffort") || p.contains("burstable"))
            {
                return None;
            }
            let qos = if qos_level("besteffort") {
                QosClass::BestEffort
            } else if qos_level("burstable") {
                QosClass::Burstable
            } else {
                QosClass::Guaranteed
            };
            return Some((j, (uid, qos)));
        }
    }
    None
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

/// Who a traced process is, from the kernel's cgroup record and what userspace resolved it to
/// (a `TASK_CGROUP` and an `ATTRIBUTION` record).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The kernel's cgroup id (cgroup v2); 0 when not known (a path from the start-up
    /// inventory).
    pub cgroup_id: u64,
    /// Its path below the cgroup2 root; `None` when it was not resolved (the cgroup was gone,
    /// or only the kernel's record was seen).
    pub cgroup: Option<String>,
    pub workload: Workload,
    /// The process's PID in its own PID namespace, when that is not the host's.
    pub ns_pid: Option<u32>,
    /// The pod's name and namespace (and the container's name), when the node said
    /// ([`PodResolver`]); never guessed.
    pub names: Option<PodNames>,
}

/// What the node says a pod (and one of its containers) is called: the kubelet's log directory
/// `/var/log/pods/<namespace>_<pod name>_<pod UID>/<container name>/` (gpu-trace's
/// `probe::pods`). Each value is a Kubernetes name (DNS-1123 label or subdomain) as the
/// resolver checked it; outputs still escape them as untrusted text.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodNames {
    pub namespace: String,
    pub pod: String,
    /// The container's name, when it is known which of the pod's containers the process is in.
    pub container: Option<String>,
}

/// Names a pod by its UID (and a container by its id), for [`Attribution::names`]: the pipeline
/// asks once per attribution of a process in a pod. `None`: not known (then nothing is shown,
/// nothing invented).
pub trait PodResolver: Send {
    fn resolve(&mut self, pod_uid: &str, container_id: Option<&str>) -> Option<PodNames>;
}

/// The `cgroup` object of a JSON line ([`Attribution::json_fields`]): `id` (null when 0),
/// `path`, then each only when known: `container_runtime`, `container_id`, `container_user`,
/// `pod_uid`, `qos`, `pod_name`, `namespace`, `container_name`, `unit`, `ns_pid`.
#[derive(serde::Serialize)]
pub struct CgroupFields<'a> {
    id: Option<u64>,
    path: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_runtime: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_user: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_uid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    qos: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_name: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    container_name: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unit: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ns_pid: Option<u32>,
}

impl Attribution {
    /// This attribution as the `cgroup` object of a JSON line.
    pub fn json_fields(&self) -> CgroupFields<'_> {
        let w = &self.workload;
        let container = w.container.as_ref();
        CgroupFields {
            id: (self.cgroup_id != 0).then_some(self.cgroup_id),
            path: self.cgroup.as_deref(),
            container_runtime: container.map(|(rt, _)| rt.name()),
            container_id: container.map(|(_, id)| id.as_str()),
            container_user: container.and(w.user),
            pod_uid: w.pod.as_ref().map(|(uid, _)| uid.as_str()),
            qos: w.pod.as_ref().map(|(_, qos)| qos.name()),
            pod_name: self.names.as_ref().map(|n| escape_text(&n.pod)),
            namespace: self.names.as_ref().map(|n| escape_text(&n.namespace)),
            container_name: (self.names.as_ref())
                .and_then(|n| n.container.as_deref())
                .map(escape_text),
            unit: w.unit.as_deref(),
            ns_pid: self.ns_pid,
        }
    }

    pub fn new(cgroup_id: u64, cgroup: Option<String>, ns_pid: Option<u32>) -> Self {
        let workload = cgroup.as_deref().map(classify).unwrap_or_default();
        Self {
            cgroup_id,
            cgroup,
            workload,
            ns_pid,
            names: None,
        }
    }

    /// `--pod`, `--namespace`: whether this process is in one of `pods` (its pod's name as the
    /// node names it, or its UID) and in one of `namespaces`, each list where it is not empty.
    /// Outside pods, never; in a pod the node did not name, only by `--pod UID`.
    pub fn in_pods(&self, pods: &[String], namespaces: &[String]) -> bool {
        let Some((uid, _)) = self.workload.pod.as_ref() else {
            return false;
        };
        let names = self.names.as_ref();
        let pod_ok = pods.is_empty()
            || (pods.iter()).any(|p| p == uid || names.is_some_and(|n| n.pod == *p));
        let ns_ok =
            namespaces.is_empty() || names.is_some_and(|n| namespaces.contains(&n.namespace));
        pod_ok && ns_ok
    }

    /// In a container or a Kubernetes pod.
    pub fn contained(&self) -> bool {
        self.workload.container.is_some() || self.workload.pod.is_some()
    }

    /// The fields the text output appends to a line: ` container=ID12`, then the pod:
    /// ` pod=NAME namespace=NS` when the node named it ([`Self::names`]), else ` pod=UID`
    /// (the UID stays in JSON's `pod_uid` either way), then ` nspid=N`; each only when known;
    /// with `always`, ` container=-` for a process outside containers. Empty when there is
    /// nothing to say. (Hex ids, UUIDs and numbers are nothing a traced process chose; the
    /// names are Kubernetes names the resolver checked, escaped all the same.)
    pub fn text_fields(&self, always: bool) -> String {
        let mut out = String::new();
        match self.workload.short_container_id() {
            Some(id) => out.push_str(&format!(" container={id}")),
            None if always => out.push_str(" container=-"),
            None => {}
        }
        if let (Some(_), Some(uid)) = (&self.workload.container, self.workload.user) {
            out.push_str(&format!(" container_user={uid}"));
        }
        match (&self.workload.pod, &self.names) {
            (Some(_), Some(n)) => out.push_str(&format!(
                " pod={} namespace={}",
                escape_text(&n.pod),
                escape_text(&n.namespace)
            )),
            (Some((uid, _)), None) => out.push_str(&format!(" pod={uid}")),
            (None, _) => {}
        }
        if let Some(n) = self.ns_pid {
            out.push_str(&format!(" nspid={n}"));
        }
        out
    }

    /// The pod as the labels show it: `NAMESPACE/NAME` (kubectl's way) when the node named
    /// it, else its UID; `None` outside pods.
    pub fn pod_label(&self) -> Option<String> {
        let (uid, _) = self.workload.pod.as_ref()?;
        Some(match &self.names {
            Some(n) => format!("{}/{}", escape_text(&n.namespace), escape_text(&n.pod)),
            None => uid.clone(),
        })
    }

    /// `top`'s label of a process in a pod the node named: `NAMESPACE/NAME`, then the runtime
    /// and short id of its container where known (its column is narrow: the name first);
    /// `None` otherwise (`top` shows [`Self::group`]).
    pub fn row_label(&self) -> Option<String> {
        self.names.as_ref()?;
        let pod = self.pod_label()?;
        Some(match &self.workload.container {
            Some((rt, _)) => format!(
                "{pod} {} {}",
                rt.name(),
                self.workload.short_container_id().unwrap_or("?")
            ),
            None => pod,
        })
    }

    /// The row label of the statistics' per-container table, `top`'s container column and the
    /// Perfetto process tracks (`None` outside containers and pods): the pod by
    /// [`Self::pod_label`].
    pub fn group(&self) -> Option<String> {
        let w = &self.workload;
        let pod = self.pod_label();
        match (&w.container, &w.pod) {
            (Some((rt, _)), Some((_, qos))) => Some(format!(
                "{} {} pod {} ({})",
                rt.name(),
                w.short_container_id().unwrap_or("?"),
                pod.unwrap_or_default(),
                qos.name()
            )),
            (Some((rt, _)), None) => Some(format!(
                "{} {}{}",
                rt.name(),
                w.short_container_id().unwrap_or("?"),
                w.user
                    .map_or_else(String::new, |uid| format!(" (user {uid})"))
            )),
            (None, Some((_, qos))) => {
                Some(format!("pod {} ({})", pod.unwrap_or_default(), qos.name()))
            }
            (None, None) => None,
        }
    }
}

impl Runtime {
    /// As JSON spells it.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri_o",
            Runtime::Podman => "podman",
            Runtime::Kubernetes => "kubernetes",
        }
    }
}

impl QosClass {
    /// As JSON spells it.
    pub fn name(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "guaranteed",
            QosClass::Burstable => "burstable",
            QosClass::BestEffort => "best_effort",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1a6f0c9b3e2d8a7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d";
    const UID: &str = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f";

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
        let rootless =
            format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope");
        let w = classify(&format!("{rootless}/container"));
        assert_eq!(w.container, Some((Runtime::Podman, ID.to_string())));
        assert_eq!(w.user, Some(1000), "a user's container, marked as such");
        assert_eq!(
            container_cgroup(&format!("{rootless}/container"))
                .unwrap()
                .path,
            rootless
        );
        let a = Attribution::new(1, Some(rootless), None);
        assert_eq!(
            a.text_fields(false),
            format!(" container={} container_user=1000", &ID[..12])
        );
        assert_eq!(
            a.group().unwrap(),
            format!("podman {} (user 1000)", &ID[..12])
        );
        // Root's podman: no user.
        assert_eq!(
            classify(&format!("/machine.slice/libpod-{ID}.scope")).user,
            None
        );
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

    const OTHER: &str = "00000000000000000000000000000000000000000000000000000000deadbeef";

    /// What an unprivileged user (or a process in a container or a delegated service) can name
    /// below its own cgroup is never believed as a pod, nor as a container of the host.
    #[test]
    fn forged_pods_and_containers_below_delegated_subtrees() {
        let u = UID.replace('-', "_");
        let user = "/user.slice/user-1000.slice/user@1000.service";
        // A user's copy of kubelet's layout: at most a user's container, never a pod.
        for forged in [
            format!("{user}/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope"),
            format!("{user}/app.slice/kubepods/besteffort/pod{UID}/{ID}"),
            format!("{user}/kubepods/pod{UID}/crio-{ID}"),
        ] {
            let w = classify(&forged);
            assert_eq!(w.pod, None, "{forged}");
            assert_eq!(w.user, Some(1000), "{forged}");
            assert!(
                w.container.is_none() || w.user.is_some(),
                "{forged}: a container only as the user's"
            );
        }
        let w = classify(&format!(
            "{user}/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope"
        ));
        assert_eq!(w.container, Some((Runtime::Containerd, ID.to_string())));
        // A docker name in a user's subtree: the user's container.
        let w = classify(&format!("{user}/app.slice/docker-{ID}.scope"));
        assert_eq!(
            (w.container.unwrap().0, w.user),
            (Runtime::Docker, Some(1000))
        );
        // Below a service that delegates its subtree (Delegate=yes), or inside a container:
        // nothing is believed; the outermost unit or container is what the host made.
        let w = classify(&format!("/system.slice/batch.service/docker-{ID}.scope"));
        assert_eq!((w.container, w.pod.clone()), (None, None));
        assert_eq!(w.unit.as_deref(), Some("batch.service"));
        let w = classify(&format!(
            "/system.slice/batch.service/kubepods/pod{UID}/{ID}"
        ));
        assert_eq!((w.container, w.pod), (None, None));
        let w = classify(&format!(
            "/system.slice/docker-{OTHER}.scope/docker-{ID}.scope"
        ));
        assert_eq!(w.container, Some((Runtime::Docker, OTHER.to_string())));
        let w = classify(&format!(
            "/system.slice/docker-{OTHER}.scope/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{ID}.scope"
        ));
        assert_eq!(w.container, Some((Runtime::Docker, OTHER.to_string())));
        assert_eq!(
            w.pod, None,
            "a pod inside a container is the container's claim"
        );
        let w = classify(&format!("/docker/{OTHER}/kubepods/pod{UID}/{ID}"));
        assert_eq!(
            (w.container, w.pod),
            (Some((Runtime::Docker, OTHER.to_string())), None)
        );
        // A container scope not under a slice is not where a runtime puts one.
        assert_eq!(classify(&format!("/docker-{ID}.scope")).container, None);
        // A pod two levels below kubepods needs a QoS level between.
        assert_eq!(classify(&format!("/kubepods/x/pod{UID}/{ID}")).pod, None);
    }

    /// A user's copy of a container id (its own `user@UID.service`, or a directory it owns)
    /// never takes the place of root's container, nor makes the choice ambiguous.
    #[test]
    fn root_made_containers_win_over_users_copies_of_their_id() {
        let user = "/user.slice/user-1000.slice/user@1000.service";
        let root_path = format!("/system.slice/docker-{ID}.scope");
        let copy = format!("{user}/app.slice/docker-{ID}.scope");
        let podman_copy = format!("{user}/user.slice/libpod-{ID}.scope/container");
        let maker = |path: &str, dir_uid: Option<u32>| {
            let c = container_cgroup(path).unwrap();
            (Maker::of(&c, dir_uid), c.path)
        };
        assert_eq!(maker(&root_path, Some(0)).0, Maker::Root);
        assert_eq!(maker(&root_path, None).0, Maker::Root);
        assert_eq!(maker(&root_path, Some(1001)).0, Maker::Owner(1001));
        // The path's user wins over the directory's owner.
        assert_eq!(maker(&copy, Some(0)).0, Maker::User(1000));
        assert_eq!(maker(&copy, Some(1000)).0, Maker::User(1000));

        let found = vec![
            maker(&copy, Some(1000)),
            maker(&root_path, Some(0)),
            maker(&podman_copy, Some(1000)),
        ];
        match choose_container(found) {
            ContainerChoice::One { chosen, not_meant } => {
                assert_eq!(chosen, (Maker::Root, root_path.clone()));
                let user_container = format!("{user}/user.slice/libpod-{ID}.scope");
                assert_eq!(
                    not_meant,
                    vec![
                        (Maker::User(1000), copy.clone()),
                        (Maker::User(1000), user_container),
                    ]
                );
            }
            other => panic!("want root's, got {other:?}"),
        }
        // A container handed to a uid still wins over a user's copy.
        let handed = vec![maker(&copy, Some(1000)), maker(&root_path, Some(1001))];
        assert!(matches!(
            choose_container(handed),
            ContainerChoice::One {
                chosen: (Maker::Owner(1001), _),
                ..
            }
        ));
        // A rootless container alone is found; two users' copies, or two root containers,
        // are ambiguous.
        assert!(matches!(
            choose_container(vec![maker(&copy, Some(1000))]),
            ContainerChoice::One { chosen: (Maker::User(1000), _), ref not_meant } if not_meant.is_empty()
        ));
        let two_users = vec![maker(&copy, Some(1000)), maker(&podman_copy, Some(1000))];
        assert!(matches!(
            choose_container(two_users),
            ContainerChoice::Ambiguous(v) if v.len() == 2
        ));
        let two_roots = vec![
            maker(&root_path, Some(0)),
            maker(&format!("/machine.slice/libpod-{ID}.scope"), Some(0)),
            maker(&copy, Some(1000)),
        ];
        match choose_container(two_roots) {
            ContainerChoice::Ambiguous(v) => {
                assert_eq!(v.len(), 3);
                assert_eq!(v[2].0, Maker::User(1000), "the user's copy listed last");
            }
            other => panic!("want ambiguous, got {other:?}"),
        }
        assert_eq!(choose_container::<String>(vec![]), ContainerChoice::None);
        assert_eq!(
            Maker::User(1000).to_string(),
            "under user 1000's delegated cgroup"
        );
        assert_eq!(Maker::Owner(7).to_string(), "in a cgroup owned by uid 7");
    }

    /// kubelet under a node-level parent that is no unit (`--cgroup-root=/node`, or a test's
    /// own root cgroup) is believed: only root creates cgroups there.
    #[test]
    fn kubelet_under_a_node_level_parent() {
        let w = classify(&format!("/node/kubepods/burstable/pod{UID}/{ID}"));
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::Burstable)));
        assert_eq!(w.container, Some((Runtime::Kubernetes, ID.to_string())));
        let w = classify(&format!("/node/system.slice/docker-{ID}.scope"));
        assert_eq!(w.container, Some((Runtime::Docker, ID.to_string())));
    }

    #[test]
    fn text_fields_and_groups() {
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{ID}.scope",
            UID.replace('-', "_")
        );
        let a = Attribution::new(7, Some(path), Some(12));
        assert!(a.contained());
        assert_eq!(
            a.text_fields(false),
            format!(" container={} pod={UID} nspid=12", &ID[..12])
        );
        assert_eq!(
            a.group().unwrap(),
            format!("containerd {} pod {UID} (burstable)", &ID[..12])
        );
        // Named by the node: the names where the UID was (JSON keeps the UID), escaped.
        let mut named = a.clone();
        named.names = Some(PodNames {
            namespace: "ml-team".into(),
            pod: "trainer-0".into(),
            container: Some("cuda".into()),
        });
        assert_eq!(
            named.text_fields(false),
            format!(
                " container={} pod=trainer-0 namespace=ml-team nspid=12",
                &ID[..12]
            )
        );
        assert_eq!(
            named.group().unwrap(),
            format!("containerd {} pod ml-team/trainer-0 (burstable)", &ID[..12])
        );
        assert_eq!(
            named.row_label().unwrap(),
            format!("ml-team/trainer-0 containerd {}", &ID[..12])
        );
        assert_eq!(a.row_label(), None, "not named: top shows the group");
        assert_eq!(named.json_fields().pod_uid, Some(UID));
        named.names.as_mut().unwrap().pod = "x\u{1b}[2Jy".into();
        assert!(!named.text_fields(false).contains('\u{1b}'));
        assert!(!named.group().unwrap().contains('\u{1b}'));
        let host = Attribution::new(
            1,
            Some("/user.slice/user-0.slice/session-1.scope".into()),
            None,
        );
        assert!(!host.contained());
        assert_eq!(host.text_fields(false), "");
        assert_eq!(host.text_fields(true), " container=-");
        assert_eq!(host.group(), None);
        // Not resolved: nothing is claimed.
        let unknown = Attribution::new(99, None, None);
        assert_eq!(unknown.workload, Workload::default());
        assert_eq!(unknown.text_fields(false), "");
    }

    /// A pod's container cgroup is the container's component (an inner cgroup of the
    /// container below it is the container's), not the pod's.
    #[test]
    fn a_pods_container_cgroup_ends_at_the_container() {
        let pod = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            UID.replace('-', "_")
        );
        let container = format!("{pod}/cri-containerd-{ID}.scope");
        let c = container_cgroup(&format!("{container}/inner")).unwrap();
        assert_eq!(
            (c.runtime, c.id.as_str(), c.path),
            (Runtime::Containerd, ID, container)
        );
        assert!(
            container_cgroup(&pod).is_none(),
            "the pod's own cgroup: no container"
        );
    }

    /// `--pod` matches a pod by its UID (named by the node or not) or by the name the node
    /// gave it; `--namespace` only a named pod; a process outside pods, never.
    #[test]
    fn pods_are_selected_by_uid_or_name_and_namespace() {
        let path = format!("/kubepods/burstable/pod{UID}/{ID}");
        let unnamed = Attribution::new(7, Some(path), None);
        let mut named = unnamed.clone();
        named.names = Some(PodNames {
            namespace: "ml-team".into(),
            pod: "trainer-0".into(),
            container: None,
        });
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for a in [&unnamed, &named] {
            assert!(a.in_pods(&[], &[]));
            assert!(a.in_pods(&v(&[UID]), &[]), "by UID");
            assert!(!a.in_pods(&v(&["other"]), &[]));
        }
        assert!(named.in_pods(&v(&["other", "trainer-0"]), &[]), "by name");
        assert!(
            !unnamed.in_pods(&v(&["trainer-0"]), &[]),
            "a name the node did not give"
        );
        assert!(named.in_pods(&[], &v(&["ml-team"])));
        assert!(named.in_pods(&v(&["trainer-0"]), &v(&["ml-team"])));
        assert!(!named.in_pods(&v(&["trainer-0"]), &v(&["default"])));
        assert!(
            !unnamed.in_pods(&[], &v(&["ml-team"])),
            "no namespace known"
        );
        let host = Attribution::new(1, Some("/system.slice/a.service".into()), None);
        assert!(!host.in_pods(&[], &[]), "outside pods, never");
        // A container outside pods is contained, never in a pod.
        let docker = Attribution::new(2, Some(format!("/docker/{ID}")), None);
        assert!(docker.contained() && !host.contained());
        assert!(!docker.in_pods(&[], &[]));
        // The QoS class is read below the kubepods component, not from it.
        let w = classify(&format!(
            "/kubepods-besteffort.slice/kubepods-pod{}.slice",
            UID.replace('-', "_")
        ));
        assert_eq!(w.pod, Some((UID.to_string(), QosClass::Guaranteed)));
    }
}
