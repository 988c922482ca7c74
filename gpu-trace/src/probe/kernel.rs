//! The running kernel's version and what gpu-trace needs of it, feature by feature: which
//! Linux release brought each feature, what uses it, and what gpu-trace does where it is
//! missing (docs/kernels.md has the same table with its sources). Pure: the release string and
//! the probe's answer come from the caller.
//!
//! The versions are mainline's. A distribution kernel may have a feature earlier (backports),
//! so gpu-trace decides on what the kernel *does* (probes), and uses the version only to say
//! which release has what is missing.

use std::fmt;

/// A kernel release as `uname -r` prints it, reduced to its first three numbers:
/// `6.12.117+deb12-amd64` → 6.12.117, `5.10.0-46-amd64` → 5.10.0 (Debian's ABI name; the
/// upstream patch level is in `/proc/version`, not needed here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KernelVersion {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self {
            major,
            minor,
            patch: 0,
        }
    }

    /// Parses the leading `MAJOR.MINOR[.PATCH]` of a release string; `None` when it has none.
    pub fn parse(release: &str) -> Option<Self> {
        let mut nums = release
            .split(|c: char| !c.is_ascii_digit())
            .take(3)
            .map(|s| s.parse::<u32>().ok());
        let major = nums.next()??;
        let minor = nums.next()??;
        // The third number only when it follows a dot (`6.1-rc1` has none).
        let patch = release
            .split_once('.')
            .and_then(|(_, rest)| rest.split_once('.'))
            .and_then(|(_, rest)| {
                let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                digits.parse().ok()
            })
            .unwrap_or(0);
        Some(Self {
            major,
            minor,
            patch,
        })
    }

    /// Whether this release is at least `major.minor` (patch level ignored).
    pub fn at_least(self, since: KernelVersion) -> bool {
        (self.major, self.minor) >= (since.major, since.minor)
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One kernel feature gpu-trace uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feature {
    /// Short name, as the reports print it.
    pub name: &'static str,
    /// The mainline release that brought it.
    pub since: KernelVersion,
    /// What gpu-trace uses it for.
    pub used_for: &'static str,
    /// What gpu-trace does without it. `None`: nothing can replace it; gpu-trace refuses to
    /// start (exit 3).
    pub without: Option<&'static str>,
}

/// The BPF ring buffer: every record goes through it. The hard minimum.
pub const RING_BUFFER: Feature = Feature {
    name: "BPF ring buffer",
    since: KernelVersion::new(5, 8),
    used_for: "every record from the kernel programs",
    without: None,
};

/// Kernel BTF in sysfs: the task and file offsets the programs need.
pub const VMLINUX_BTF: Feature = Feature {
    name: "/sys/kernel/btf/vmlinux",
    since: KernelVersion::new(5, 4),
    used_for: "the task and file structure offsets (no CO-RE in Rust eBPF)",
    without: None,
};

/// The cgroup options match a task's cgroup subtree with this helper in the syscall and LSM
/// programs.
pub const CGROUP_ANCESTOR: Feature = Feature {
    name: "bpf_get_current_ancestor_cgroup_id in tracing and LSM programs",
    since: KernelVersion::new(5, 14),
    used_for: "--cgroup, --container, --deny-cgroup, --deny-container",
    without: Some(
        "those options are refused (exit 3) with this reason; tracing without them works",
    ),
};

/// Every feature, oldest first. The hard ones (`without: None`) decide whether gpu-trace
/// starts; the others only change which hook serves an event.
pub const FEATURES: [Feature; 9] = [
    VMLINUX_BTF,
    Feature {
        name: "tp_btf (BTF-typed tracepoints)",
        since: KernelVersion::new(5, 5),
        used_for: "ioctl+close at sys_exit with plain loads",
        without: Some("raw_tp/sys_exit (one helper read per syscall)"),
    },
    Feature {
        name: "BPF LSM",
        since: KernelVersion::new(5, 7),
        used_for: "--deny-pid, --deny-cgroup, --deny-container",
        without: Some("those options are refused (exit 3); tracing works"),
    },
    RING_BUFFER,
    Feature {
        name: "module BTF (/sys/kernel/btf/<module>)",
        since: KernelVersion::new(5, 11),
        used_for: "fentry/fexit on the drivers' functions: NVIDIA's ioctl and release \
                   handlers, amdgpu's, gpu_ext's hooks",
        without: Some("kprobe and kretprobe on the same functions"),
    },
    Feature {
        name: "bpf_get_current_task_btf",
        since: KernelVersion::new(5, 11),
        used_for: "a trusted task pointer for bpf_task_pt_regs",
        without: Some("see bpf_task_pt_regs"),
    },
    CGROUP_ANCESTOR,
    Feature {
        name: "bpf_task_pt_regs",
        since: KernelVersion::new(5, 15),
        used_for: "the system call a gpu_ext hook ran in (its user registers)",
        without: Some("the registers are read from the top of the task's kernel stack"),
    },
    Feature {
        name: "bpf_get_func_ip in kprobes",
        since: KernelVersion::new(5, 15),
        used_for: "which copy of an MQD builder ran (mqd_init's address)",
        without: Some(
            "MQD init is not shown (its kprobe program is refused, the reason printed); before \
             5.11 it is not tried (no module BTF)",
        ),
    },
];

/// Helpers the kernel programs call only where a feature needs them, with the feature: a
/// verifier's `unknown func <helper>` then names what is missing.
const HELPERS: [(&str, &Feature); 1] = [("bpf_get_current_ancestor_cgroup_id", &CGROUP_ANCESTOR)];

/// What a program refusal means when the verifier did not know a helper gpu-trace calls only
/// for an optional feature: the feature, the release that has it, what it serves.
pub fn explain_refusal(verifier: &str) -> Option<String> {
    HELPERS.iter().find_map(|(helper, f)| {
        verifier
            .contains(&format!("unknown func {helper}"))
            .then(|| {
                format!(
                    "this kernel does not let these programs call {helper} ({}: Linux {} and \
                 later), which {} need",
                    f.name, f.since, f.used_for
                )
            })
    })
}

/// The lowest release that has every hard feature.
pub fn minimum() -> KernelVersion {
    FEATURES
        .iter()
        .filter(|f| f.without.is_none())
        .map(|f| f.since)
        .max()
        .unwrap_or(RING_BUFFER.since)
}

/// The features a release predates, in [`FEATURES`] order.
pub fn missing(version: KernelVersion) -> Vec<&'static Feature> {
    FEATURES
        .iter()
        .filter(|f| !version.at_least(f.since))
        .collect()
}

/// Whether gpu-trace can start: `Err` names the missing hard feature and the release that has
/// it. `ring_buffer` asks the kernel (`BPF_MAP_CREATE` of a ring buffer; `None` where it could
/// not be asked), only for a release older than the ring buffer's: such a kernel is refused
/// unless it has one (a backport); on a later release a failing map is something else (memory
/// lock, privileges), which the load that follows reports itself.
pub fn check_minimum(
    release: &str,
    ring_buffer: impl FnOnce() -> Option<bool>,
) -> Result<(), String> {
    let too_old = KernelVersion::parse(release).is_some_and(|v| !v.at_least(RING_BUFFER.since));
    if !too_old || ring_buffer() == Some(true) {
        return Ok(());
    }
    Err(format!(
        "this kernel ({release}) has no {} (Linux {} and later), which carries {}; gpu-trace \
         needs Linux {} or later (docs/kernels.md lists what each feature needs)",
        RING_BUFFER.name,
        RING_BUFFER.since,
        RING_BUFFER.used_for,
        minimum()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_parse_to_their_numbers() {
        let v = |s| KernelVersion::parse(s).map(|v| (v.major, v.minor, v.patch));
        assert_eq!(v("6.12.117+deb12-amd64"), Some((6, 12, 117)));
        assert_eq!(v("5.10.0-46-amd64"), Some((5, 10, 0)));
        assert_eq!(v("6.1.0-56-amd64"), Some((6, 1, 0)));
        assert_eq!(v("6.18.44-fc-v669"), Some((6, 18, 44)));
        assert_eq!(v("4.18.0-553.el8_10.x86_64"), Some((4, 18, 0)));
        assert_eq!(v("6.1-rc1"), Some((6, 1, 0)));
        assert_eq!(v("5"), None);
        assert_eq!(v("linux"), None);
        // 5.10 < 5.8 as strings; as versions 5.10 is the later one.
        assert!(KernelVersion::new(5, 10).at_least(KernelVersion::new(5, 8)));
        assert!(!KernelVersion::new(5, 7).at_least(KernelVersion::new(5, 8)));
    }

    #[test]
    fn the_minimum_is_the_ring_buffer_release() {
        // The ring buffer (5.8) is the newest hard requirement; kernel BTF in sysfs (5.4) is
        // older. Written out, not derived from the table.
        assert_eq!(minimum(), KernelVersion::new(5, 8));
    }

    #[test]
    fn old_kernels_lack_the_features_of_later_releases() {
        let names = |r: &str| -> Vec<&str> {
            missing(KernelVersion::parse(r).unwrap())
                .iter()
                .map(|f| f.name)
                .collect()
        };
        // Debian 11's kernel: everything from 5.11 on is missing.
        assert_eq!(
            names("5.10.0-46-amd64"),
            [
                "module BTF (/sys/kernel/btf/<module>)",
                "bpf_get_current_task_btf",
                "bpf_get_current_ancestor_cgroup_id in tracing and LSM programs",
                "bpf_task_pt_regs",
                "bpf_get_func_ip in kprobes"
            ]
        );
        assert!(names("6.1.0-56-amd64").is_empty());
        assert!(names("6.12.117+deb12-amd64").is_empty());
        assert_eq!(names("5.4.0-1").len(), 8);
    }

    #[test]
    fn an_unknown_helper_is_named_with_its_feature() {
        // The verifier's words on Debian 5.10 (lab run of 2026-11-25, --deny-cgroup).
        let log = "61: (bf) r7 = r0 | 62: (85) call bpf_get_current_ancestor_cgroup_id#123 | \
                   unknown func bpf_get_current_ancestor_cgroup_id#123 | verification time 9425 usec";
        let why = explain_refusal(log).unwrap();
        assert!(
            why.contains("Linux 5.14") && why.contains("--deny-cgroup"),
            "{why}"
        );
        assert_eq!(explain_refusal("invalid func unknown#158"), None);
        assert_eq!(explain_refusal("R1 invalid mem access 'scalar'"), None);
    }

    #[test]
    fn gpu_trace_refuses_a_kernel_without_the_ring_buffer() {
        // The probe decides where it answered: a backport counts, a missing map refuses.
        assert!(check_minimum("5.10.0-46-amd64", || Some(true)).is_ok());
        assert!(check_minimum("4.18.0-553.el8_10.x86_64", || Some(true)).is_ok());
        let e = check_minimum("5.4.0-1-amd64", || Some(false)).unwrap_err();
        assert!(e.contains("Linux 5.8 or later"), "{e}");
        assert!(
            e.contains("5.4.0-1-amd64") && e.contains("BPF ring buffer"),
            "{e}"
        );
        assert!(e.contains("Linux 5.8"), "{e}");
        // Without an answer, the release decides.
        assert!(check_minimum("5.7.19", || None).is_err());
        assert!(check_minimum("5.8.0", || None).is_ok());
        assert!(check_minimum("unparsable", || None).is_ok());
        assert!(check_minimum("5.7.19", || Some(false)).is_err());
        // A new kernel whose map creation failed (memory lock, privileges): not for this
        // check to explain; the load that follows says why.
        assert!(check_minimum("6.12.117+deb12-amd64", || Some(false)).is_ok());
    }
}
