//! The guest's kernel and the lab itself (`a.*`, `lab.limits`): booted, the scenario finished
//! within its limits, what the kernel offers (KFD, BPF LSM, kprobes, module BTF), and
//! gpu-trace's doctor.

use super::{EINVAL, Guest, Judged, Needs, indent};

/// Module BTF (`/sys/kernel/btf/<module>`, and fentry/fexit on a module's functions through it)
/// came with Linux 5.11 ("bpf: Load and verify kernel module BTFs", "bpf: Allow to specify
/// kernel module BTFs when attaching BPF programs"). Before it, the checks of what needs it
/// assert the documented fallback instead (docs/kernels.md).
const MODULE_BTF_SINCE: (u32, u32) = (5, 11);

/// Whether the guest's kernel is one that has module BTF.
pub(super) fn has_module_btf(g: &Guest) -> bool {
    g.kernel_at_least(MODULE_BTF_SINCE)
}

/// What the guest's KFD allows. On a kernel where it cannot serve a process at all, the checks
/// that need KFD calls cannot pass or fail on gpu-trace's merits; `a.kfd` then asserts the
/// kernel's own reason instead, and the rest of those checks are not applicable.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Kfd {
    /// /dev/kfd answers (5.10–6.19 without a GPU): every AMD check is judged.
    Usable,
    /// The kernel was built without KFD (`CONFIG_HSA_AMD` not set: Debian's arm64 kernels).
    /// amdgpu loads, but there is no /dev/kfd and none of KFD's functions.
    NotBuilt { config: String },
    /// Linux 7.0 on: KFD refuses every `open()` while no AMD GPU is initialised ("no gpu
    /// node!", from "drm/amdkfd: kfd driver supports hot unplug/replug amdgpu devices").
    /// The functions exist, so the checks of what attaches to them are still judged.
    NoGpuNode { refusal: String },
}

impl Kfd {
    pub(super) fn of(g: &Guest) -> Self {
        if let Some(config) = g.fact("hsa_amd").and_then(|v| v.strip_prefix("n")) {
            return Kfd::NotBuilt {
                config: config.trim().to_owned(),
            };
        }
        let refused = g
            .records
            .find("error", &[("open", "/dev/kfd")])
            .is_some_and(|f| f.int("errno") == Some(EINVAL));
        match g.fact("kfd_refusal") {
            Some(refusal) if refused && refusal.contains("no gpu node") => Kfd::NoGpuNode {
                refusal: refusal.trim().to_owned(),
            },
            _ => Kfd::Usable,
        }
    }

    /// Why a check that needs `needs` is not applicable on this kernel (`a.kfd` asserts it),
    /// or `None` when it is judged.
    pub(super) fn cannot_serve(&self, needs: Needs) -> Option<&'static str> {
        match (self, needs) {
            (Kfd::Usable, _) | (_, Needs::Nothing | Needs::X86Compat) => None,
            (Kfd::NotBuilt { .. }, _) => Some("this kernel has no KFD (a.kfd)"),
            (Kfd::NoGpuNode { .. }, Needs::KfdCalls) => {
                Some("this kernel's KFD serves no process without a GPU (a.kfd)")
            }
            (Kfd::NoGpuNode { .. }, Needs::KfdFunctions) => None,
        }
    }
}

/// `a.kfd`: /dev/kfd present; on a kernel whose KFD cannot serve, its reason as the guest
/// showed it, and gpu-trace's doctor saying that the AMD driver cannot be used.
pub(super) fn kfd(g: &Guest) -> Judged {
    let doctor = g.block("doctor").map_or("", |b| b.text.as_str());
    let amd_row = doctor
        .lines()
        .find(|l| l.starts_with("AMD") && l.contains(" driver "))
        .unwrap_or("")
        .trim();
    let said_no = amd_row.split_whitespace().nth(2) == Some("no");
    let kfd = g.fact("kfd").unwrap_or("(no fact)");
    match Kfd::of(g) {
        Kfd::Usable => Judged::new("/dev/kfd present", kfd.starts_with("present"), kfd),
        Kfd::NotBuilt { config } => Judged::new(
            "kernel without KFD: no /dev/kfd, and gpu-trace doctor says the AMD driver is absent",
            kfd == "absent" && said_no,
            format!("{config}; /dev/kfd {kfd}; doctor: `{amd_row}`"),
        ),
        Kfd::NoGpuNode { refusal } => Judged::new(
            "KFD refuses processes without a GPU (Linux 7.0 on): open() EINVAL with the kernel's reason, doctor says why",
            kfd.starts_with("present") && said_no,
            format!("/dev/kfd {kfd}; open: EINVAL; dmesg: `{refusal}`; doctor: `{amd_row}`"),
        ),
    }
}

pub(super) fn boot(g: &Guest) -> Judged {
    let failed = g.records.lines_starting("LAB module_failed=");
    let modules = g
        .records
        .lines_starting("LAB modules_loaded=")
        .first()
        .map(|l| l.to_string())
        .unwrap_or_default();
    Judged::new(
        "guest booted, loaded the amdgpu module chain, finished the scenario",
        g.done && failed.is_empty() && !modules.is_empty(),
        format!(
            "kernel {}; {}{}{}",
            g.fact("kernel").unwrap_or("?"),
            modules.trim_start_matches("LAB "),
            if failed.is_empty() {
                String::new()
            } else {
                format!("; {failed:?}")
            },
            if g.done {
                String::new()
            } else {
                format!(
                    "; the scenario did not finish (no LAB-DONE; the last step begun: {})",
                    g.records
                        .lines
                        .iter()
                        .rev()
                        .find_map(|l| l.strip_prefix("LAB step "))
                        .unwrap_or("none")
                )
            }
        ),
    )
}

/// The guest limits each command (lab/init.sh `limit`); one that ran past its limit was killed
/// there, and is a failure here whatever its own check makes of the rest.
pub(super) fn limits(g: &Guest) -> Judged {
    let timeouts: Vec<&str> = g
        .records
        .lines
        .iter()
        .filter_map(|l| l.strip_prefix("LAB timeout"))
        .map(str::trim_start)
        .collect();
    Judged::new(
        "every command of the scenario ended within its limit",
        g.done && timeouts.is_empty(),
        match (timeouts.is_empty(), g.done) {
            (true, true) => "none killed".to_owned(),
            (true, false) => "unknown: the scenario did not finish".to_owned(),
            (false, _) => format!("killed: {}", timeouts.join(" | ")),
        },
    )
}

pub(super) fn kfd_version(g: &Guest) -> Judged {
    let v = g.records.find("kfd", &[("rc", "0")]);
    Judged::new(
        "KFD GET_VERSION answers",
        v.is_some(),
        match &v {
            Some(f) => format!(
                "KFD {}.{}",
                f.get("major").unwrap_or("?"),
                f.get("minor").unwrap_or("?")
            ),
            None => g
                .records
                .find("kfd", &[])
                .map_or("no answer".into(), |f| format!("{:?}", f.kv)),
        },
    )
}

pub(super) fn lsm(g: &Guest) -> Judged {
    let lsm = g.fact("lsm").unwrap_or("(no fact)");
    Judged::new(
        "BPF LSM active (bpf in /sys/kernel/security/lsm)",
        lsm.split(',').any(|m| m == "bpf"),
        lsm,
    )
}

pub(super) fn kprobes(g: &Guest) -> Judged {
    let pmu = g.fact("kprobe_pmu").unwrap_or("absent");
    let events = g.fact("kprobe_events").unwrap_or("absent");
    Judged::new(
        "kprobes available (perf kprobe PMU, tracefs kprobe_events)",
        pmu != "absent" && events == "present",
        format!(
            "kprobe PMU type {pmu}, kprobe_events {events}, lockdown {}",
            g.fact("lockdown").unwrap_or("?")
        ),
    )
}

pub(super) fn module_btf(g: &Guest) -> Judged {
    let btf = g.fact("amdgpu_btf").unwrap_or("absent");
    let vmlinux = g.fact("vmlinux_btf").unwrap_or("absent");
    let detail = format!(
        "{btf} bytes; vmlinux BTF {} bytes",
        g.fact("vmlinux_btf").unwrap_or("?")
    );
    if has_module_btf(g) {
        Judged::new(
            "module BTF for amdgpu (/sys/kernel/btf/amdgpu)",
            btf != "absent",
            detail,
        )
    } else {
        Judged::new(
            "before 5.11: no module BTF (/sys/kernel/btf/amdgpu absent), vmlinux BTF present",
            btf == "absent" && vmlinux != "absent",
            detail,
        )
    }
}

/// Exit 0: tracing and --deny-pid can both work, which on this kernel they should.
pub(super) fn doctor(g: &Guest) -> Judged {
    let title = "gpu-trace doctor: tracing and --deny-pid both supported (exit 0)";
    match g.block("doctor") {
        Some(b) => Judged::new(
            title,
            b.rc == Some(0),
            format!("exit {}\n{}", b.rc.unwrap_or(-1), indent(&b.text)),
        ),
        None => Judged::fail(
            title,
            "the guest did not run `gpu-trace doctor` (no doctor block in the log)",
        ),
    }
}
