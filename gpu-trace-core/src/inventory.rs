//! What the start-up inventory found: every process that had a GPU device open when tracing
//! started, and the NVIDIA driver's GPUs (`gpu-trace`'s `probe::inventory` walks `/proc` to
//! make one; recordings carry it in their header). Plain data, its text for the start-up
//! report, and its fields of the JSON `INVENTORY` line (`output::json` writes the frame).

use serde::{Deserialize, Serialize};

use std::borrow::Cow;

use crate::escape::{self, escape_text};
use crate::model::gpus::GpuDirectory;

/// What an fd of a process points at, as far as the inventory cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "minor")]
pub enum GpuNode {
    /// `/dev/nvidiactl`: the control node RM clients are usually allocated on.
    NvCtl,
    /// `/dev/nvidiaN`: GPU `N` (the device minor).
    NvGpu(u32),
    /// `/dev/nvidia-uvm`.
    NvUvm,
    /// `/dev/kfd` (AMD).
    Kfd,
    /// The `--watch-device` node.
    Watched,
}

/// The MPS role of a process, from its executable's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MpsRole {
    /// `nvidia-cuda-mps-server`: creates the TSGs its clients' work runs in.
    Server,
    /// `nvidia-cuda-mps-control`: the daemon that starts servers (no TSGs of its own).
    Control,
}

/// One GPU as the driver describes it (defined with the GPU directory that names GPUs from it).
pub use crate::model::gpus::GpuInfo;

/// A GPU a process has open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessGpu {
    /// Device minor.
    pub minor: u32,
    pub bus_id: Option<String>,
    pub uuid: Option<String>,
    pub name: Option<String>,
    /// GPU memory the process uses on it (NVML), when known.
    pub memory_bytes: Option<u64>,
}

/// One process with a GPU device open when tracing started.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryProcess {
    pub pid: u32,
    /// `comm` (untrusted: escape before printing to a terminal).
    pub comm: String,
    /// Command line, one element per argument (untrusted).
    pub cmdline: Vec<String>,
    /// Target of `/proc/PID/exe`, when readable.
    pub exe: Option<String>,
    /// cgroup v2 path (or the first hierarchy's path on cgroup v1).
    pub cgroup: Option<String>,
    /// GPUs open (NVIDIA `/dev/nvidiaN`).
    pub gpus: Vec<ProcessGpu>,
    /// Every fd that points at a GPU node, ascending.
    pub fds: Vec<(i32, GpuNode)>,
    pub mps: Option<MpsRole>,
}

impl InventoryProcess {
    /// The fds on which RM clients can have been allocated before tracing: `/dev/nvidiactl`
    /// and the watched node. Their `close()` releases those clients and their TSGs.
    pub fn control_fds(&self) -> Vec<i32> {
        self.fds
            .iter()
            .filter(|(_, n)| matches!(n, GpuNode::NvCtl | GpuNode::Watched))
            .map(|&(fd, _)| fd)
            .collect()
    }

    /// Whether any NVIDIA node (or the watched node with NVIDIA tracing) is open.
    pub fn uses_nvidia(&self) -> bool {
        self.fds.iter().any(|(_, n)| {
            matches!(
                n,
                GpuNode::NvCtl | GpuNode::NvGpu(_) | GpuNode::NvUvm | GpuNode::Watched
            )
        })
    }

    /// Whether `/dev/kfd` is open.
    pub fn uses_kfd(&self) -> bool {
        self.fds.iter().any(|(_, n)| matches!(n, GpuNode::Kfd))
    }
}

/// Why the walker could not read some processes' fd tables. Reading `/proc/PID/fd` needs
/// ptrace read access to the process (`PTRACE_MODE_READ_FSCREDS`): the same user and no
/// capability the walker lacks, or CAP_SYS_PTRACE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lacking {
    /// Not root, without CAP_SYS_PTRACE.
    Root,
    /// Root (uid 0) without CAP_SYS_PTRACE: other users' processes and processes with
    /// capabilities it lacks are refused (the DaemonSet's CAP_BPF + CAP_PERFMON).
    SysPtrace,
    /// It had CAP_SYS_PTRACE: `/proc` is mounted with `hidepid`, or a security module refused.
    Nothing,
}

/// The result of the walk.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    /// When the walk was taken: CLOCK_MONOTONIC ns (the records' clock); 0 when unknown.
    #[serde(default)]
    pub taken_ns: u64,
    /// GPUs of the NVIDIA driver, by minor.
    pub gpus: Vec<GpuInfo>,
    /// Processes with a GPU node open, ascending pid.
    pub processes: Vec<InventoryProcess>,
    /// Processes that exited while the walk read them.
    pub vanished: u32,
    /// Processes whose fd table could not be read (the directory `/proc/PID/fd` or a link in
    /// it was refused: ptrace read access, `hidepid`), each counted once.
    pub denied: u32,
    /// What the walker lacked for the `denied` ones, when it knew (set with `denied`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied_because: Option<Lacking>,
    /// Why NVML added nothing (library absent, init failed), when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvml_note: Option<String>,
}

impl Inventory {
    /// The inventory as the output filters show it: only the processes that `--pid` (`pids`)
    /// and `--comm` (`comms`) select, as the events are (an empty list selects all). The
    /// GPUs and the counts of what could not be read stay.
    pub fn selected(&self, pids: &[u32], comms: &[String]) -> Inventory {
        let mut inv = self.clone();
        inv.processes.retain(|p| {
            (pids.is_empty() || pids.contains(&p.pid))
                && (comms.is_empty() || comms.contains(&p.comm))
        });
        inv
    }
}

/// nvidia-smi's index of the GPU at `bus_id` among the inventory's GPUs (`gpus`), as text;
/// `?` when it is not one of them.
fn smi_index(gpus: &GpuDirectory, bus_id: Option<&str>) -> String {
    bus_id
        .and_then(|b| gpus.index_of_bus(b))
        .map_or_else(|| "?".to_string(), |i| i.to_string())
}

/// The start-up report's line of one inventoried process (without prefix); `gpus` numbers its
/// GPUs as nvidia-smi does.
fn process_line(
    p: &InventoryProcess,
    gpus: &GpuDirectory,
    cmdlines: bool,
    names: &mut PodNamer<'_>,
) -> String {
    let mut line = format!("  PID {} {}", p.pid, escape_text(&p.comm));
    if let Some(role) = p.mps {
        line.push_str(match role {
            MpsRole::Server => " [MPS server: its TSGs are shared by the MPS clients]",
            MpsRole::Control => " [MPS control daemon]",
        });
    }
    for g in &p.gpus {
        line.push_str(&format!(
            " gpu={}({} {}",
            smi_index(gpus, g.bus_id.as_deref()),
            g.bus_id.as_deref().unwrap_or("?"),
            g.uuid.as_deref().unwrap_or("?")
        ));
        if let Some(b) = g.memory_bytes {
            line.push_str(&format!(" {} MiB", b / (1024 * 1024)));
        }
        line.push(')');
    }
    let nodes: Vec<String> = p
        .fds
        .iter()
        .map(|(fd, n)| match n {
            GpuNode::NvCtl => format!("{fd}:ctl"),
            GpuNode::NvGpu(m) => format!("{fd}:nvidia{m}"),
            GpuNode::NvUvm => format!("{fd}:uvm"),
            GpuNode::Kfd => format!("{fd}:kfd"),
            GpuNode::Watched => format!("{fd}:watched"),
        })
        .collect();
    line.push_str(&format!(" fds={}", nodes.join(",")));
    // The container and pod the path names (hex ids and a UUID, validated by the
    // classification: nothing untrusted).
    if let Some(w) = p.cgroup.as_deref().map(crate::model::workload::classify) {
        if let (Some((runtime, _)), Some(id)) = (&w.container, w.short_container_id()) {
            line.push_str(&format!(" container={}:{id}", runtime.name()));
            // A rootless container: the name is its user's claim (docs/containers.md).
            if let Some(uid) = w.user {
                line.push_str(&format!(" container_user={uid}"));
            }
        }
        // The pod by name where the node names it (as the event lines show it), else its UID.
        if let Some((uid, _)) = &w.pod {
            let id = w.container.as_ref().map(|(_, id)| id.as_str());
            match names(uid, id) {
                Some(n) => line.push_str(&format!(
                    " pod={} namespace={}",
                    escape_text(&n.pod),
                    escape_text(&n.namespace)
                )),
                None => line.push_str(&format!(" pod={uid}")),
            }
        }
    }
    line.push_str(&format!(
        " cgroup={}",
        p.cgroup
            .as_deref()
            .map_or("?".into(), |t| escape_text(t).into_owned())
    ));
    if cmdlines {
        let cmd: Vec<String> = p
            .cmdline
            .iter()
            .map(|a| escape_text(a).into_owned())
            .collect();
        line.push_str(&format!(" cmd=\"{}\"", cmd.join(" ")));
    }
    line
}

/// The inventory as text lines (without prefix), for the start-up report.
pub fn render_text(inv: &Inventory) -> Vec<String> {
    render_text_with(inv, true)
}

/// [`render_text`]; with `cmdlines` false (`--quiet`) without the processes' command lines
/// (`cmd="..."`), which can carry what a log should not (pod logs of the DaemonSet).
pub fn render_text_with(inv: &Inventory, cmdlines: bool) -> Vec<String> {
    render_text_named(inv, cmdlines, &mut |_, _| None)
}

/// What names a pod for the inventory's text: pod UID and container id → the node's names
/// ([`crate::model::workload::PodResolver`]); `None`: not named (the UID is shown).
pub type PodNamer<'a> =
    dyn FnMut(&str, Option<&str>) -> Option<crate::model::workload::PodNames> + 'a;

/// [`render_text_with`], each pod named by `names` where it can (` pod=NAME namespace=NS`, as
/// the event lines show it).
pub fn render_text_named(inv: &Inventory, cmdlines: bool, names: &mut PodNamer<'_>) -> Vec<String> {
    let mut out = Vec::new();
    // GPUs by nvidia-smi's index (what `gpu=` and `--gpu` say), the device node beside it.
    let gpus = GpuDirectory::new(&inv.gpus);
    for g in &inv.gpus {
        out.push(format!(
            "GPU {}: {} bus {} {} (/dev/nvidia{})",
            smi_index(&gpus, g.bus_id.as_deref()),
            g.name
                .as_deref()
                .map_or("?".into(), |t| escape_text(t).into_owned()),
            g.bus_id.as_deref().unwrap_or("?"),
            g.uuid.as_deref().unwrap_or("?"),
            g.minor,
        ));
    }
    let n = inv.processes.len();
    out.push(format!(
        "{n} process{} had a GPU open before tracing started{}",
        if n == 1 { "" } else { "es" },
        if n == 0 {
            ""
        } else {
            " (driver objects they made earlier were not seen: their end is reported as \
             PRETRACE_END)"
        }
    ));
    for p in &inv.processes {
        out.push(process_line(p, &gpus, cmdlines, names));
    }
    if inv.denied != 0 {
        let n = inv.denied;
        let whose = if n == 1 { "process" } else { "processes" };
        let why = match inv.denied_because {
            Some(Lacking::Root) => {
                "reading another user's needs root (run gpu-trace as root, with CAP_BPF and \
                 CAP_PERFMON) or CAP_SYS_PTRACE"
            }
            Some(Lacking::SysPtrace) => {
                "gpu-trace runs as root without CAP_SYS_PTRACE, which the kernel requires to read \
                 the open files of another user's process or of a process with capabilities \
                 gpu-trace lacks; add CAP_SYS_PTRACE to inventory them (docs/fleet.md)"
            }
            Some(Lacking::Nothing) => {
                "refused although gpu-trace has CAP_SYS_PTRACE: /proc is mounted with hidepid \
                 or a security module refuses; mount /proc without hidepid"
            }
            None => "run as root with CAP_SYS_PTRACE, or mount /proc without hidepid",
        };
        out.push(format!(
            "  (not inventoried: the open files (/proc/PID/fd) of {n} {whose} could not be \
             read, so a GPU they hold is not listed: {why})"
        ));
    }
    if inv.vanished != 0 {
        out.push(format!(
            "  (not inventoried: {} exited during the walk)",
            inv.vanished
        ));
    }
    if let Some(note) = &inv.nvml_note {
        out.push(format!("  (no GPU memory per process: {note})"));
    }
    out
}

impl Inventory {
    /// Appends the `INVENTORY` line's own fields (after its `event` and `time`), each as
    /// `,"KEY":VALUE`: `taken_ns`, `gpus`, `processes`, `vanished`, `denied`, `nvml_note`.
    pub fn write_json_fields(&self, out: &mut Vec<u8>) {
        let line = InventoryLine {
            taken_ns: self.taken_ns,
            gpus: &self.gpus,
            processes: self
                .processes
                .iter()
                .map(InventoryProcessLine::of)
                .collect(),
            vanished: self.vanished,
            denied: self.denied,
            nvml_note: self.nvml_note.as_deref(),
        };
        crate::section::splice_object(out, &line);
    }
}

/// The inventory as the `INVENTORY` line shows it: [`Inventory`]'s fields in
/// its order, the strings from /proc as UTF-8 text (U+FFFD for a byte that is not UTF-8) and,
/// where that is not exact, their bytes (`comm_bytes`, ... as events' `comm_bytes`).
#[derive(Serialize)]
struct InventoryLine<'a> {
    taken_ns: u64,
    gpus: &'a [GpuInfo],
    processes: Vec<InventoryProcessLine<'a>>,
    vanished: u32,
    denied: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    nvml_note: Option<&'a str>,
}

#[derive(Serialize)]
struct InventoryProcessLine<'a> {
    pid: u32,
    comm: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    comm_bytes: Option<Cow<'a, [u8]>>,
    cmdline: Vec<Cow<'a, str>>,
    /// Every argument's bytes, when one of them is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    cmdline_bytes: Option<Vec<Cow<'a, [u8]>>>,
    exe: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exe_bytes: Option<Cow<'a, [u8]>>,
    cgroup: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cgroup_bytes: Option<Cow<'a, [u8]>>,
    gpus: &'a [ProcessGpu],
    fds: &'a [(i32, GpuNode)],
    mps: Option<MpsRole>,
}

impl<'a> InventoryProcessLine<'a> {
    fn of(p: &'a InventoryProcess) -> Self {
        use escape::{is_exact, lossy, raw_bytes};
        let bytes = |s: &'a str| (!is_exact(s)).then(|| raw_bytes(s));
        Self {
            pid: p.pid,
            comm: lossy(&p.comm),
            comm_bytes: bytes(&p.comm),
            cmdline: p.cmdline.iter().map(|a| lossy(a)).collect(),
            cmdline_bytes: (!p.cmdline.iter().all(|a| is_exact(a)))
                .then(|| p.cmdline.iter().map(|a| raw_bytes(a)).collect()),
            exe: p.exe.as_deref().map(lossy),
            exe_bytes: p.exe.as_deref().and_then(bytes),
            cgroup: p.cgroup.as_deref().map(lossy),
            cgroup_bytes: p.cgroup.as_deref().and_then(bytes),
            gpus: &p.gpus,
            fds: &p.fds,
            mps: p.mps,
        }
    }
}
