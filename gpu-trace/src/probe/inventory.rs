//! Inventory at start: every process that has a GPU device open when tracing starts.
//!
//! A process that opened the GPU before gpu-trace attached made its driver objects (RM clients,
//! TSGs, channels; KFD queues) where no hook could see them. The inventory names those
//! processes, so that a tracer attached to a busy machine is not silent, and so that the kernel
//! programs report their `close()` and exit (their pids are put in the `TRACKED` map).
//!
//! Found by walking `/proc/*/fd`: a process whose fd links point at `/dev/nvidiactl`,
//! `/dev/nvidiaN`, `/dev/nvidia-uvm` (NVIDIA), `/dev/kfd` (AMD, `--vendor amd`), or the
//! `--watch-device` node. Per process: pid, `comm`, command line, executable, cgroup, which
//! GPUs (device minor → PCI bus id and UUID from `/proc/driver/nvidia/gpus/*/information`) and
//! which fds. The walk tolerates processes that exit while it runs and `/proc` mounted with
//! `hidepid` or other permission refusals: those are counted, never fatal.
//!
//! The parsing functions are pure and unit-tested on real text (tests/fixtures/h100_late_mps); the
//! walker around them is thin.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use gpu_trace_core::escape::decode_lossless;
use gpu_trace_core::inventory::{
    GpuInfo, GpuNode, Inventory, InventoryProcess, Lacking, MpsRole, ProcessGpu,
};

/// Which device nodes the walk looks for.
#[derive(Clone, Debug, Default)]
pub struct WalkOptions {
    /// NVIDIA nodes.
    pub nvidia: bool,
    /// `/dev/kfd`.
    pub kfd: bool,
    /// The `--watch-device` node: its kernel-format `dev_t` (major/minor as `stat` gives them).
    pub watched_rdev: Option<u64>,
    /// The process running the walk (left out: gpu-trace itself).
    pub self_pid: Option<u32>,
}

/// Parses one `/proc/driver/nvidia/gpus/*/information` file.
pub fn parse_gpu_information(text: &str) -> Option<GpuInfo> {
    let mut info = GpuInfo::default();
    let mut minor = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let value = (!value.is_empty()).then(|| value.to_string());
        match key.trim() {
            "Model" => info.name = value,
            "GPU UUID" => info.uuid = value,
            "Bus Location" => info.bus_id = value,
            "Device Minor" => minor = value.and_then(|v| v.parse().ok()),
            _ => {}
        }
    }
    info.minor = minor?;
    Some(info)
}

/// What an fd link target names (`readlink /proc/PID/fd/N`), for the nodes asked for.
pub fn classify_fd_target(target: &str, opts: &WalkOptions) -> Option<GpuNode> {
    let target = target.strip_suffix(" (deleted)").unwrap_or(target);
    if opts.nvidia {
        match target {
            "/dev/nvidiactl" => return Some(GpuNode::NvCtl),
            "/dev/nvidia-uvm" => return Some(GpuNode::NvUvm),
            _ => {}
        }
        if let Some(n) = target.strip_prefix("/dev/nvidia")
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
        {
            return n.parse().ok().map(GpuNode::NvGpu);
        }
    }
    (opts.kfd && target == "/dev/kfd").then_some(GpuNode::Kfd)
}

/// `/proc/PID/cmdline`: NUL-separated arguments, each byte kept (bytes that are not UTF-8
/// carried as `gpu_trace_core::escape::decode_lossless` does: every output escapes them).
pub fn parse_cmdline(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes.split(|&b| b == 0).map(decode_lossless).collect()
}

/// `/proc/PID/cgroup`: the cgroup v2 path (`0::PATH`), else the first hierarchy's path.
pub fn parse_cgroup(text: &str) -> Option<String> {
    let mut first = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" {
            return Some(path.to_string());
        }
        first.get_or_insert_with(|| path.to_string());
    }
    first
}

/// The MPS role from the executable path (or `argv[0]`): the basename, exactly.
pub fn mps_role(exe_or_argv0: &str) -> Option<MpsRole> {
    let exe = exe_or_argv0
        .strip_suffix(" (deleted)")
        .unwrap_or(exe_or_argv0);
    match exe.rsplit('/').next()? {
        "nvidia-cuda-mps-server" => Some(MpsRole::Server),
        "nvidia-cuda-mps-control" => Some(MpsRole::Control),
        _ => None,
    }
}

/// The GPUs of the NVIDIA driver (`/proc/driver/nvidia/gpus/*/information`), by minor.
pub fn nvidia_gpus(proc_root: &Path) -> Vec<GpuInfo> {
    let mut out = Vec::new();
    let Ok(dir) = fs::read_dir(proc_root.join("driver/nvidia/gpus")) else {
        return out;
    };
    for entry in dir.flatten() {
        if let Ok(text) = fs::read_to_string(entry.path().join("information"))
            && let Some(info) = parse_gpu_information(&text)
        {
            out.push(info);
        }
    }
    out.sort_by_key(|g| g.minor);
    out
}

/// Why one process could not be read.
enum Skip {
    /// It exited during the walk.
    Vanished,
    /// Reading its fds was refused.
    Denied,
}

fn skip_of(e: &io::Error) -> Skip {
    if is_refusal(e) {
        Skip::Denied
    } else {
        // ENOENT / ESRCH: the process (or the fd) went away.
        Skip::Vanished
    }
}

/// EACCES or EPERM: the kernel's ptrace read check (or `hidepid`) said no.
fn is_refusal(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied || e.raw_os_error() == Some(libc::EPERM)
}

/// What this process lacks to read every process's fd table, from `/proc/self/status` (`Uid`'s
/// effective id, `CapEff`).
pub fn lacking_from_status(status: &str) -> Option<Lacking> {
    const CAP_SYS_PTRACE: u32 = 19;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let euid: u32 = field("Uid")?.split_whitespace().nth(1)?.parse().ok()?;
    let caps = u64::from_str_radix(field("CapEff")?, 16).ok()?;
    Some(if caps & (1 << CAP_SYS_PTRACE) != 0 {
        Lacking::Nothing
    } else if euid == 0 {
        Lacking::SysPtrace
    } else {
        Lacking::Root
    })
}

/// Walks `proc_root` (normally `/proc`).
pub fn walk(proc_root: &Path, opts: &WalkOptions) -> Inventory {
    let gpus = if opts.nvidia {
        nvidia_gpus(proc_root)
    } else {
        Vec::new()
    };
    let mut inv = Inventory {
        gpus,
        ..Inventory::default()
    };
    let Ok(dir) = fs::read_dir(proc_root) else {
        return inv;
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| Some(pid) != opts.self_pid)
        .collect();
    pids.sort_unstable();
    for pid in pids {
        match read_process(proc_root, pid, opts, &inv.gpus) {
            Ok(Some(p)) => inv.processes.push(p),
            Ok(None) => {}
            Err(Skip::Vanished) => inv.vanished += 1,
            Err(Skip::Denied) => inv.denied += 1,
        }
    }
    if inv.denied != 0 {
        inv.denied_because = fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| lacking_from_status(&s));
    }
    inv
}

/// The GPU nodes among the fds of `pid`, ascending fd.
fn gpu_fds(dir: &Path, opts: &WalkOptions) -> Result<Vec<(i32, GpuNode)>, Skip> {
    let entries = fs::read_dir(dir).map_err(|e| skip_of(&e))?;
    let mut out = Vec::new();
    // The directory may list while its links are refused (a process of the same user with
    // capabilities the walker lacks): such a process is refused, not "no GPU".
    let mut refused = false;
    for entry in entries {
        // An fd closed between readdir and readlink is simply gone.
        let Ok(entry) = entry else { continue };
        let Some(fd) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let target = match fs::read_link(entry.path()) {
            Ok(t) => t,
            Err(e) => {
                refused |= is_refusal(&e);
                continue;
            }
        };
        let node = classify_fd_target(&target.to_string_lossy(), opts).or_else(|| {
            let want = opts.watched_rdev?;
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let meta = fs::metadata(entry.path()).ok()?;
            (meta.file_type().is_char_device() && meta.rdev() == want).then_some(GpuNode::Watched)
        });
        if let Some(node) = node {
            out.push((fd, node));
        }
    }
    if refused && out.is_empty() {
        return Err(Skip::Denied);
    }
    out.sort_unstable();
    Ok(out)
}

fn read_process(
    proc_root: &Path,
    pid: u32,
    opts: &WalkOptions,
    gpus: &[GpuInfo],
) -> Result<Option<InventoryProcess>, Skip> {
    let base: PathBuf = proc_root.join(pid.to_string());
    let fds = gpu_fds(&base.join("fd"), opts)?;
    if fds.is_empty() {
        return Ok(None);
    }
    // The rest is best effort: the process may exit now; what was read still counts.
    // Untrusted bytes, kept exactly (not UTF-8 is no reason to lose the name).
    let comm = fs::read(base.join("comm"))
        .map(|b| decode_lossless(b.strip_suffix(b"\n").unwrap_or(&b)))
        .unwrap_or_default();
    let cmdline = fs::read(base.join("cmdline"))
        .map(|b| parse_cmdline(&b))
        .unwrap_or_default();
    let exe = fs::read_link(base.join("exe")).ok().map(|p| {
        use std::os::unix::ffi::OsStrExt;
        decode_lossless(p.as_os_str().as_bytes())
    });
    let cgroup = fs::read(base.join("cgroup"))
        .ok()
        .and_then(|t| parse_cgroup(&decode_lossless(&t)));
    let mps = exe
        .as_deref()
        .and_then(mps_role)
        .or_else(|| cmdline.first().and_then(|a| mps_role(a)));
    let by_minor: BTreeMap<u32, &GpuInfo> = gpus.iter().map(|g| (g.minor, g)).collect();
    let mut minors: Vec<u32> = fds
        .iter()
        .filter_map(|(_, n)| match n {
            GpuNode::NvGpu(m) => Some(*m),
            _ => None,
        })
        .collect();
    minors.dedup();
    minors.sort_unstable();
    minors.dedup();
    let gpus = minors
        .into_iter()
        .map(|minor| {
            let info = by_minor.get(&minor);
            ProcessGpu {
                minor,
                bus_id: info.and_then(|i| i.bus_id.clone()),
                uuid: info.and_then(|i| i.uuid.clone()),
                name: info.and_then(|i| i.name.clone()),
                memory_bytes: None,
            }
        })
        .collect();
    Ok(Some(InventoryProcess {
        pid,
        comm,
        cmdline,
        exe,
        cgroup,
        gpus,
        fds,
        mps,
    }))
}

/// A process with one GPU on bus `0000:00:06.0` (minor 0) and nothing else known (tests).
#[cfg(test)]
pub(crate) fn test_process(pid: u32, comm: &str, fds: Vec<(i32, GpuNode)>) -> InventoryProcess {
    InventoryProcess {
        pid,
        comm: comm.into(),
        cmdline: vec![],
        exe: None,
        cgroup: None,
        gpus: vec![ProcessGpu {
            minor: 0,
            bus_id: Some("0000:00:06.0".into()),
            uuid: None,
            name: None,
            memory_bytes: None,
        }],
        fds,
        mps: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpu_trace_core::inventory::render_text;

    /// `/proc/driver/nvidia/gpus/0000:00:06.0/information` of the H100 host
    /// (tests/fixtures/h100_late_mps/facts.txt).
    const H100_INFO: &str = "Model: \t\t NVIDIA H100 80GB HBM3\n\
IRQ:   \t\t 41\n\
GPU UUID: \t GPU-a62f238f-2a5a-7342-8f19-17c8eaf33997\n\
Video BIOS: \t 96.00.da.00.0c\n\
Bus Type: \t PCIe\n\
DMA Size: \t 52 bits\n\
DMA Mask: \t 0xfffffffffffff\n\
Bus Location: \t 0000:00:06.0\n\
Device Minor: \t 0\n\
GPU Firmware: \t 580.159.04\n\
GPU Excluded:\t No\n";

    fn nv() -> WalkOptions {
        WalkOptions {
            nvidia: true,
            ..WalkOptions::default()
        }
    }

    #[test]
    fn gpu_information_of_the_h100() {
        let g = parse_gpu_information(H100_INFO).unwrap();
        assert_eq!(g.minor, 0);
        assert_eq!(g.bus_id.as_deref(), Some("0000:00:06.0"));
        assert_eq!(
            g.uuid.as_deref(),
            Some("GPU-a62f238f-2a5a-7342-8f19-17c8eaf33997")
        );
        assert_eq!(g.name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        // Without a minor the file names no device node.
        assert_eq!(parse_gpu_information("Model: X\n"), None);
    }

    #[test]
    fn fd_targets_of_the_late_job() {
        // Link targets from tests/fixtures/h100_late_mps/late_facts.txt and mps_ps.txt.
        let o = nv();
        assert_eq!(
            classify_fd_target("/dev/nvidiactl", &o),
            Some(GpuNode::NvCtl)
        );
        assert_eq!(
            classify_fd_target("/dev/nvidia0", &o),
            Some(GpuNode::NvGpu(0))
        );
        assert_eq!(
            classify_fd_target("/dev/nvidia13", &o),
            Some(GpuNode::NvGpu(13))
        );
        assert_eq!(
            classify_fd_target("/dev/nvidia-uvm", &o),
            Some(GpuNode::NvUvm)
        );
        assert_eq!(classify_fd_target("/dev/nvidia-uvm-tools", &o), None);
        assert_eq!(classify_fd_target("/dev/nvidia-caps/nvidia-cap1", &o), None);
        assert_eq!(classify_fd_target("/dev/nvidia-modeset", &o), None);
        assert_eq!(classify_fd_target("/dev/kfd", &o), None);
        assert_eq!(classify_fd_target("socket:[1234]", &o), None);
        let amd = WalkOptions {
            kfd: true,
            ..WalkOptions::default()
        };
        assert_eq!(classify_fd_target("/dev/kfd", &amd), Some(GpuNode::Kfd));
        assert_eq!(classify_fd_target("/dev/nvidiactl", &amd), None);
    }

    #[test]
    fn cmdline_and_cgroup() {
        assert_eq!(
            parse_cmdline(b"python3\0examples/late_job.py\0"),
            vec!["python3".to_string(), "examples/late_job.py".to_string()]
        );
        assert_eq!(parse_cmdline(b""), Vec::<String>::new());
        // An empty argument in the middle is kept.
        assert_eq!(parse_cmdline(b"a\0\0b\0"), vec!["a", "", "b"]);
        // A byte that is not UTF-8 is kept (issue 26: it became U+FFFD), and shown as `\xNN`.
        let odd = parse_cmdline(b"run\xff\0x\0");
        assert_eq!(
            odd.iter()
                .map(|a| gpu_trace_core::escape::raw_bytes(a).into_owned())
                .collect::<Vec<_>>(),
            vec![b"run\xff".to_vec(), b"x".to_vec()]
        );
        assert_eq!(gpu_trace_core::escape::escape_text(&odd[0]), "run\\xff");
        assert_eq!(
            parse_cgroup("0::/process_api/55c29c47b665f676013de2dd9d4732a7\n").as_deref(),
            Some("/process_api/55c29c47b665f676013de2dd9d4732a7")
        );
        // cgroup v1: the first hierarchy; a hybrid system's v2 line wins.
        assert_eq!(
            parse_cgroup("12:memory:/a\n11:cpu,cpuacct:/b\n").as_deref(),
            Some("/a")
        );
        assert_eq!(
            parse_cgroup("12:memory:/a\n0::/unified\n").as_deref(),
            Some("/unified")
        );
        assert_eq!(parse_cgroup(""), None);
    }

    #[test]
    fn mps_roles_from_the_executable() {
        // `comm` is "nvidia-cuda-mps" for both (15 characters): only the executable tells.
        assert_eq!(
            mps_role("/usr/bin/nvidia-cuda-mps-server"),
            Some(MpsRole::Server)
        );
        assert_eq!(mps_role("nvidia-cuda-mps-control"), Some(MpsRole::Control));
        assert_eq!(
            mps_role("/usr/bin/nvidia-cuda-mps-server (deleted)"),
            Some(MpsRole::Server)
        );
        assert_eq!(mps_role("nvidia-cuda-mps"), None);
        assert_eq!(mps_role("/usr/bin/python3"), None);
    }

    /// What the walker lacked, from `/proc/self/status` as the kernel writes it: root with the
    /// DaemonSet's capabilities (CAP_BPF 39, CAP_PERFMON 38) lacks CAP_SYS_PTRACE (19), and the
    /// message says so instead of "run as root".
    #[test]
    fn what_the_walker_lacked_is_said_exactly() {
        let status = |uid: u32, caps: &str| {
            format!("Name:\tgpu-trace\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nCapEff:\t{caps}\n")
        };
        // setpriv --bounding-set=-all,+bpf,+perfmon as root.
        let daemonset = status(0, "000000c000000000");
        assert_eq!(lacking_from_status(&daemonset), Some(Lacking::SysPtrace));
        assert_eq!(
            lacking_from_status(&status(0, "000001ffffffffff")),
            Some(Lacking::Nothing)
        );
        assert_eq!(
            lacking_from_status(&status(1000, "0000000000000000")),
            Some(Lacking::Root)
        );
        assert_eq!(
            lacking_from_status(&status(1000, "0000000000080000")),
            Some(Lacking::Nothing)
        );
        assert_eq!(lacking_from_status("Name: x\n"), None);
        let inv = Inventory {
            denied: 2,
            denied_because: Some(Lacking::SysPtrace),
            ..Inventory::default()
        };
        let text = render_text(&inv).join("\n");
        assert!(
            text.contains("of 2 processes could not be read")
                && text.contains("runs as root without CAP_SYS_PTRACE")
                && !text.contains("run as root"),
            "{text}"
        );
        let inv = Inventory {
            denied: 1,
            denied_because: Some(Lacking::Root),
            ..inv
        };
        assert!(
            render_text(&inv)
                .join("\n")
                .contains("of 1 process could not be read")
        );
    }

    #[test]
    fn text_lines_escape_untrusted_strings_and_show_memory_and_mps() {
        let inv = Inventory {
            processes: vec![
                {
                    let mut p = test_process(
                        538,
                        "nvidia-cuda-mps",
                        vec![(11, GpuNode::NvCtl), (15, GpuNode::NvGpu(0))],
                    );
                    p.cmdline = vec!["nvidia-cuda-mps-server".into()];
                    p.exe = Some("/usr/bin/nvidia-cuda-mps-server".into());
                    p.gpus[0].memory_bytes = Some(666 * 1024 * 1024);
                    p.mps = Some(MpsRole::Server);
                    p
                },
                InventoryProcess {
                    pid: 9,
                    comm: "evil\x1b]0;x\x07".into(),
                    cmdline: vec!["a\nb".into()],
                    exe: None,
                    cgroup: Some("/c\x1b".into()),
                    gpus: vec![],
                    fds: vec![(3, GpuNode::NvUvm)],
                    mps: None,
                },
            ],
            denied: 2,
            nvml_note: Some("NVML unavailable (x)".into()),
            ..Inventory::default()
        };
        // Without the host's GPU list, nvidia-smi's index of the process's GPU is not known.
        assert!(render_text(&inv)[1].contains(" gpu=?(0000:00:06.0 ? 666 MiB) "));
        // With it (the host's GPUs, two, listed out of bus order), the GPU at 0000:00:06.0
        // is nvidia-smi's 0 and shows so, its device node beside it.
        let gpu = |minor, bus: &str| GpuInfo {
            minor,
            bus_id: Some(bus.into()),
            uuid: None,
            name: None,
        };
        let inv = Inventory {
            gpus: vec![gpu(0, "0000:41:00.0"), gpu(1, "0000:00:06.0")],
            ..inv
        };
        let lines = render_text(&inv);
        assert_eq!(
            lines[..2],
            [
                "GPU 1: ? bus 0000:41:00.0 ? (/dev/nvidia0)",
                "GPU 0: ? bus 0000:00:06.0 ? (/dev/nvidia1)"
            ]
        );
        let lines = &lines[2..];
        assert_eq!(
            lines[0],
            "2 processes had a GPU open before tracing started (driver objects they made \
             earlier were not seen: their end is reported as PRETRACE_END)"
        );
        assert_eq!(
            lines[1],
            "  PID 538 nvidia-cuda-mps [MPS server: its TSGs are shared by the MPS clients] \
             gpu=0(0000:00:06.0 ? 666 MiB) fds=11:ctl,15:nvidia0 cgroup=? \
             cmd=\"nvidia-cuda-mps-server\""
        );
        assert_eq!(
            lines[2],
            "  PID 9 evil\\x1b]0;x\\x07 fds=3:uvm cgroup=/c\\x1b cmd=\"a\\nb\""
        );
        assert!(lines.iter().all(|l| !l.chars().any(char::is_control)));
        assert!(
            lines[3].contains("of 2 processes could not be read"),
            "{}",
            lines[3]
        );
        assert_eq!(
            lines[4],
            "  (no GPU memory per process: NVML unavailable (x))"
        );
    }

    /// A fake /proc with the late job's links (real targets from late_facts.txt).
    #[test]
    fn walk_of_a_fake_proc_tree() {
        use std::os::unix::fs::symlink;
        let scratch = tempfile::tempdir().unwrap();
        let root = scratch.path().to_path_buf();
        let gpus = root.join("driver/nvidia/gpus/0000:00:06.0");
        fs::create_dir_all(&gpus).unwrap();
        fs::write(gpus.join("information"), H100_INFO).unwrap();
        let p = root.join("441");
        fs::create_dir_all(p.join("fd")).unwrap();
        for (fd, t) in [
            (8, "/dev/nvidiactl"),
            (9, "/dev/nvidia-uvm"),
            (11, "/dev/nvidia0"),
            (12, "/dev/nvidia0"),
            (20, "/dev/nvidia-caps/nvidia-cap1"),
            (3, "/tmp/x"),
        ] {
            symlink(t, p.join("fd").join(fd.to_string())).unwrap();
        }
        fs::write(p.join("comm"), "python3\n").unwrap();
        fs::write(p.join("cmdline"), b"python3\0examples/late_job.py\0").unwrap();
        fs::write(
            p.join("cgroup"),
            "0::/process_api/55c29c47b665f676013de2dd9d4732a7\n",
        )
        .unwrap();
        // A process without GPU nodes, and a directory that vanished (no fd dir).
        fs::create_dir_all(root.join("7/fd")).unwrap();
        symlink("/dev/null", root.join("7/fd/0")).unwrap();
        fs::create_dir_all(root.join("8")).unwrap();

        let inv = walk(&root, &nv());
        drop(scratch);
        assert_eq!(inv.gpus.len(), 1);
        assert_eq!(inv.processes.len(), 1);
        assert_eq!(inv.vanished, 1);
        let p = &inv.processes[0];
        assert_eq!(p.pid, 441);
        assert_eq!(p.comm, "python3");
        assert_eq!(p.cmdline, ["python3", "examples/late_job.py"]);
        assert_eq!(
            p.cgroup.as_deref(),
            Some("/process_api/55c29c47b665f676013de2dd9d4732a7")
        );
        assert_eq!(
            p.fds,
            vec![
                (8, GpuNode::NvCtl),
                (9, GpuNode::NvUvm),
                (11, GpuNode::NvGpu(0)),
                (12, GpuNode::NvGpu(0))
            ]
        );
        assert_eq!(p.control_fds(), vec![8]);
        assert_eq!(p.gpus.len(), 1);
        assert_eq!(p.gpus[0].bus_id.as_deref(), Some("0000:00:06.0"));
        assert_eq!(
            p.gpus[0].uuid.as_deref(),
            Some("GPU-a62f238f-2a5a-7342-8f19-17c8eaf33997")
        );
        assert_eq!(p.mps, None);
        let text = render_text(&inv).join("\n");
        assert!(
            text.contains(
                "PID 441 python3 gpu=0(0000:00:06.0 GPU-a62f238f-2a5a-7342-8f19-17c8eaf33997)"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_process_in_a_pod_is_named_with_its_container_and_pod() {
        let mut p = test_process(77, "python3", vec![(3, GpuNode::NvCtl)]);
        let id = "4f1a6f0c9b3e2d8a7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d";
        let uid = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f";
        p.cgroup = Some(format!("/kubepods/besteffort/pod{uid}/crio-{id}"));
        let inv = Inventory {
            processes: vec![p],
            ..Inventory::default()
        };
        let line = &render_text(&inv)[1];
        assert!(
            line.contains(&format!(
                " container=cri_o:{} pod={uid} cgroup=/kubepods/",
                &id[..12]
            )),
            "{line}"
        );
        // A user's copy of that layout in its own subtree: the user's container, no pod.
        let mut p = test_process(78, "python3", vec![(3, GpuNode::NvCtl)]);
        p.cgroup = Some(format!(
            "/user.slice/user-1000.slice/user@1000.service/kubepods/besteffort/pod{uid}/crio-{id}"
        ));
        let inv = Inventory {
            processes: vec![p],
            ..Inventory::default()
        };
        let line = &render_text(&inv)[1];
        assert!(
            line.contains(&format!(
                " container=cri_o:{} container_user=1000 cgroup=/user.slice/",
                &id[..12]
            )),
            "{line}"
        );
    }
}
