//! doctor's rows and verdicts on facts captured on the CI machine and on the GPU host.

use super::*;
use crate::{
    probe::{
        kallsyms::count_symbols,
        trial::{Refusal, Stage, TrialHook},
    },
    targets::{KFD_ENTRY, NVIDIA_ENTRY},
};

/// `/proc/devices` of the CI machine (6.18.44, no GPU driver), captured 2026-11-22.
const CI_PROC_DEVICES: &str = include_str!("../../tests/fixtures/doctor/ci_proc_devices.txt");
/// `/proc/devices` as read on the GPU host (examples/gpu-host-run.sh, doctor_facts.txt).
const GPU_PROC_DEVICES: &str =
    include_str!("../../tests/fixtures/doctor/gpu_host_proc_devices.txt");
/// `/proc/mounts` lines of the CI machine for tracefs and securityfs.
const CI_MOUNTS: &str = "tracefs /sys/kernel/tracing tracefs rw,relatime 0 0\n\
                         securityfs /sys/kernel/security securityfs rw,relatime 0 0\n";
/// Excerpt of the CI machine's `/proc/kallsyms` (the symbols of interest and some others).
const CI_KALLSYMS: &str = include_str!("../../tests/fixtures/doctor/ci_kallsyms_excerpt.txt");
/// `/sys/kernel/security/lsm` on the CI machine and on the GPU host (platforms.md).
const LSM_LIST: &str = "lockdown,capability,landlock,bpf";
/// `/sys/kernel/security/lockdown` on both.
const LOCKDOWN: &str = "none [integrity] confidentiality\n";
/// `/proc/driver/nvidia/version` on the GPU host (tests/fixtures/host.txt).
const GPU_NV_VERSION: &str = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \nGCC version:  gcc version 15.3.0 (GCC) \n";

fn eperm(stage: Stage) -> Result<(), Refusal> {
    Err(Refusal {
        stage,
        errno: Some(libc::EPERM),
        detail: String::new(),
    })
}

/// The CI machine as measured (platforms.md): raw_tp/tp_btf/tracepoints work, no kprobes,
/// fentry and LSM refused with EPERM at load, root.
fn ci_facts() -> Facts {
    let names = symbols_of_interest();
    Facts {
        kernel: "6.18.44-fc-v669".into(),
        arch: "x86_64".into(),
        euid: 0,
        privileged: true,
        vmlinux_btf: Ok(6_000_000),
        offsets: Ok(()),
        nvidia_btf: ModuleBtf::default(),
        amdgpu_btf: ModuleBtf::default(),
        mounts: CI_MOUNTS.into(),
        tracefs: Ok("/sys/kernel/tracing".into()),
        lsm: Ok(LSM_LIST.into()),
        lockdown: Ok(LOCKDOWN.into()),
        kprobe_pmu: None,
        kprobe_events: false,
        kallsyms: Ok(count_symbols(CI_KALLSYMS, &names)),
        filter_functions: Err("cannot read /sys/kernel/tracing/available_filter_functions: EPERM (Operation not permitted (os error 1))".into()),
        proc_devices: CI_PROC_DEVICES.into(),
        nvidia_module: false,
        nvidia_version: None,
        nvidia_nodes: vec![],
        amdgpu_module: false,
        kfd_node: None,
        kfd_version: None,
        kfd_gpus: None,
        trials: vec![
            (TrialHook::RawTracepoint("sys_exit"), Ok(())),
            (TrialHook::BtfTracepoint("sys_exit"), Ok(())),
            (TrialHook::Tracepoint { category: "syscalls", name: "sys_exit_ioctl" }, Ok(())),
            (TrialHook::RawTracepoint("sched_process_exit"), Ok(())),
            (
                TrialHook::Kprobe(PROBE_FUNCTION),
                Err(Refusal {
                    stage: Stage::Prepare,
                    errno: None,
                    detail: "no kprobe PMU (/sys/bus/event_source/devices/kprobe/type is missing)".into(),
                }),
            ),
            (TrialHook::Fentry(PROBE_FUNCTION), eperm(Stage::Load)),
            (TrialHook::Fexit(PROBE_FUNCTION), eperm(Stage::Load)),
            (TrialHook::Lsm(LSM_HOOK), eperm(Stage::Load)),
        ],
        tracer: TracerLoad::Attached(vec![
            "ioctl+close → raw_tp/sys_exit".into(),
            "process exit → raw_tp/sched_process_exit".into(),
        ]),
        deny_load: None,
        api_attach: Ok(crate::api::attach::AttachMethod::Batched),
    }
}

/// The API layer's row says which attach method this kernel allows, and why not batched.
#[test]
fn the_api_attach_row_names_the_method_and_why() {
    use crate::api::attach::AttachMethod;
    use crate::doctor::API_ATTACH;
    let mut f = ci_facts();
    let r = evaluate(&f);
    let got = row(&r, Scope::System, API_ATTACH);
    assert_eq!(got.status, Status::Yes);
    assert!(got.why.starts_with("batched uprobe links"), "{}", got.why);
    f.api_attach = Ok(AttachMethod::PerProbe("Linux 6.1 < 6.10".into()));
    let r = evaluate(&f);
    let got = row(&r, Scope::System, API_ATTACH);
    assert_eq!(got.status, Status::Info);
    assert!(
        got.why
            .starts_with("one perf-event uprobe per symbol (Linux 6.1 < 6.10): each probe"),
        "{}",
        got.why
    );
}

/// The GPU host (platforms.md, host.txt): the CI kernel's answers plus the NVIDIA open
/// module 580.159.04 with module BTF for its glue layer.
fn gpu_host_facts() -> Facts {
    let mut f = ci_facts();
    f.kernel = "6.18.44-fc-v657-gpu".into();
    f.nvidia_module = true;
    f.nvidia_version = Some(GPU_NV_VERSION.into());
    f.proc_devices = GPU_PROC_DEVICES.into();
    f.nvidia_nodes = vec![
        DevNode {
            path: "/dev/nvidiactl".into(),
            major: 195,
            minor: 255,
        },
        DevNode {
            path: "/dev/nvidia0".into(),
            major: 195,
            minor: 0,
        },
    ];
    f.nvidia_btf = ModuleBtf {
        present: true,
        names: [(NVIDIA_ENTRY.to_string(), true)].into(),
    };
    f
}

/// The CI machine seen by a user without privileges: every load refused with EPERM.
fn unprivileged_facts() -> Facts {
    let mut f = ci_facts();
    f.euid = 1000;
    f.privileged = false;
    f.tracer = TracerLoad::NotTried("needs root (or CAP_BPF and CAP_PERFMON)".into());
    f.trials
        .iter_mut()
        .for_each(|(_, r)| *r = eperm(Stage::Load));
    f
}

fn row<'a>(r: &'a Report, scope: Scope, check: &str) -> &'a Row {
    r.rows
        .iter()
        .find(|x| x.scope == scope && x.check == check)
        .unwrap_or_else(|| panic!("no row {scope:?} {check}"))
}

#[test]
fn the_lsm_symbol_is_the_deny_hooks_stub() {
    assert_eq!(LSM_SYMBOL, format!("bpf_lsm_{LSM_HOOK}"));
}

#[test]
fn kallsyms_counts_copies_and_modules() {
    let m = count_symbols(CI_KALLSYMS, &symbols_of_interest());
    assert_eq!(m["vfs_read"], [None]);
    assert_eq!(m["bpf_lsm_file_ioctl"], [None]);
    assert!(m["nvidia_unlocked_ioctl"].is_empty());
    // Module symbols and duplicates (static functions of the same name in several files).
    let text = "ffffffffc1000000 t init_mqd\t[amdgpu]\nffffffffc1000100 t init_mqd\t[amdgpu]\n\
                ffffffffc1000200 t init_mqd\t[amdgpu]\nffffffffc1000300 d init_mqd\t[amdgpu]\n\
                ffffffffc2000000 t nvidia_unlocked_ioctl\t[nvidia]\n0000000000000000 t nvidia_unlocked_ioctl.cold\t[nvidia]\n";
    let m = count_symbols(text, &symbols_of_interest());
    assert_eq!(m["init_mqd"].len(), 3, "data symbols are not code copies");
    assert_eq!(m["nvidia_unlocked_ioctl"], [Some("nvidia".to_string())]);
}

#[test]
fn ci_machine_tracing_yes_deny_no_exit_5() {
    let r = evaluate(&ci_facts());
    assert!(r.tracing.ok, "{:?}", r.tracing);
    assert!(!r.deny.ok);
    assert!(r.deny.why.contains("EPERM"), "{}", r.deny.why);
    assert_eq!(r.exit_code, exit::NO_DENY);
    for scope in [Scope::Nvidia, Scope::Amd] {
        assert_eq!(row(&r, scope, hook::RAW_TP).status, Status::Yes);
        assert!(
            row(&r, scope, hook::RAW_TP)
                .why
                .contains("gpu-trace uses it")
        );
        assert!(
            !row(&r, scope, hook::TP_BTF)
                .why
                .contains("gpu-trace uses it")
        );
        assert_eq!(row(&r, scope, hook::PROCESS_EXIT).status, Status::Yes);
        assert_eq!(row(&r, scope, hook::KPROBE).status, Status::No);
        assert!(
            row(&r, scope, hook::KPROBE)
                .fix
                .as_deref()
                .unwrap()
                .contains("CONFIG_KPROBES")
        );
        assert_eq!(row(&r, scope, hook::FENTRY).status, Status::No);
        assert_eq!(row(&r, scope, hook::LSM).status, Status::No);
        assert_eq!(row(&r, scope, "driver").status, Status::No);
    }
    assert_eq!(row(&r, Scope::System, "kprobes").status, Status::No);
    assert_eq!(row(&r, Scope::System, "lockdown").status, Status::Yes);
    assert_eq!(row(&r, Scope::System, "active LSMs").status, Status::Yes);
}

#[test]
fn gpu_host_shows_the_open_driver_and_its_nodes() {
    let r = evaluate(&gpu_host_facts());
    let driver = row(&r, Scope::Nvidia, "driver");
    assert_eq!(driver.status, Status::Yes);
    assert!(
        driver.why.contains("580.159.04") && driver.why.contains("open"),
        "{}",
        driver.why
    );
    let nodes = row(&r, Scope::Nvidia, "device nodes");
    assert_eq!(nodes.status, Status::Yes, "{}", nodes.why);
    assert!(
        nodes.why.contains("195 nvidia") && nodes.why.contains("195:255"),
        "{}",
        nodes.why
    );
    // Module BTF is there, trampolines are not: fentry still "no", for the trampolines.
    let fentry = row(&r, Scope::Nvidia, hook::FENTRY);
    assert_eq!(fentry.status, Status::No);
    assert!(fentry.why.contains("EPERM"), "{}", fentry.why);
    assert_eq!(r.exit_code, exit::NO_DENY);
}

#[test]
fn every_no_names_a_fix() {
    let unprivileged = unprivileged_facts();
    let mut bare = ci_facts();
    bare.vmlinux_btf = Err("/sys/kernel/btf/vmlinux: No such file or directory".into());
    bare.offsets = Err("kernel BTF not found".into());
    bare.tracefs = Err("tracefs is not mounted".into());
    bare.lsm = Ok("capability,selinux".into());
    bare.lockdown = Ok("none integrity [confidentiality]".into());
    bare.kallsyms = Err("cannot read /proc/kallsyms".into());
    bare.amdgpu_module = true;
    bare.nvidia_module = true;
    bare.tracer = TracerLoad::Failed("the kernel refused every hook".into());
    for facts in [ci_facts(), gpu_host_facts(), unprivileged, bare] {
        let r = evaluate(&facts);
        for row in &r.rows {
            if row.status == Status::No {
                assert!(
                    row.fix.as_ref().is_some_and(|f| !f.is_empty()),
                    "no fix: {row:?}"
                );
            }
        }
        for v in [&r.tracing, &r.deny] {
            assert!(v.ok || v.fix.is_some(), "verdict without a fix: {v:?}");
        }
    }
}

#[test]
fn unprivileged_is_unsupported_and_says_sudo() {
    let f = unprivileged_facts();
    let r = evaluate(&f);
    assert_eq!(r.exit_code, exit::UNSUPPORTED);
    assert!(r.tracing.fix.as_deref().unwrap().contains("sudo"));
    assert!(
        row(&r, Scope::Nvidia, hook::RAW_TP)
            .fix
            .as_deref()
            .unwrap()
            .contains("sudo")
    );
    assert_eq!(row(&r, Scope::System, "privileges").status, Status::No);
}

#[test]
fn a_live_bpf_lsm_and_a_working_deny_load_give_exit_0() {
    // The QEMU lab kernel (platforms.md): everything works, bpf is active.
    let mut f = ci_facts();
    f.kprobe_pmu = Some(6);
    f.kprobe_events = true;
    f.lockdown = Ok("[none] integrity confidentiality".into());
    f.trials.iter_mut().for_each(|(_, r)| *r = Ok(()));
    f.deny_load = Some(Ok(()));
    let r = evaluate(&f);
    assert_eq!(r.exit_code, exit::READY, "{}", r.render_text());
    assert_eq!(row(&r, Scope::Amd, hook::LSM).status, Status::Yes);
    // Without the driver, kprobe and fentry on its functions are still "no", with the fix.
    assert_eq!(row(&r, Scope::Amd, hook::KPROBE).status, Status::No);
    assert!(
        row(&r, Scope::Amd, hook::KPROBE)
            .fix
            .as_deref()
            .unwrap()
            .contains("amdgpu")
    );
    // The same, with bpf missing from the LSM list: the LSM loads but would never run.
    f.lsm = Ok("lockdown,capability,landlock".into());
    let r = evaluate(&f);
    assert_eq!(r.exit_code, exit::NO_DENY);
    assert!(
        row(&r, Scope::Nvidia, hook::LSM)
            .fix
            .as_deref()
            .unwrap()
            .contains("lsm=lockdown,capability,landlock,bpf")
    );
}

#[test]
fn amd_driver_with_duplicate_init_mqd_is_reported() {
    let mut f = ci_facts();
    f.amdgpu_module = true;
    f.proc_devices = CI_PROC_DEVICES.replacen("245 hidraw", "236 kfd\n245 hidraw", 1);
    f.kfd_node = Some(DevNode {
        path: "/dev/kfd".into(),
        major: 236,
        minor: 0,
    });
    f.kfd_version = Some(Ok((1, 17)));
    f.kfd_gpus = Some(0);
    f.kprobe_pmu = Some(6);
    let kallsyms = "ffffffffc1000000 t init_mqd\t[amdgpu]\nffffffffc1000100 t init_mqd\t[amdgpu]\n\
                    ffffffffc1000200 t kfd_ioctl\t[amdgpu]\n";
    f.kallsyms = Ok(count_symbols(kallsyms, &symbols_of_interest()));
    f.trials.push((TrialHook::Kprobe(KFD_ENTRY), Ok(())));
    for (h, r) in f.trials.iter_mut() {
        if *h == TrialHook::Kprobe(PROBE_FUNCTION) {
            *r = Ok(());
        }
    }
    let r = evaluate(&f);
    assert_eq!(
        row(&r, Scope::Amd, "driver").why,
        "KFD 1.17 (AMDKFD_IOC_GET_VERSION); 0 GPU node(s) in the KFD topology"
    );
    assert_eq!(row(&r, Scope::Amd, "device nodes").status, Status::Yes);
    let kprobe = row(&r, Scope::Amd, hook::KPROBE);
    assert_eq!(kprobe.status, Status::Yes);
    assert!(
        kprobe.why.contains("init_mqd has 2 copies"),
        "{}",
        kprobe.why
    );
}

/// Debian sid's 7.2.13 in the lab (no GPU): /dev/kfd exists, its open() is refused with EINVAL
/// (`no gpu node! Cannot create KFD process` in dmesg), and the topology lists no GPU.
#[test]
fn kfd_refusing_open_without_a_gpu_names_the_kernel_change() {
    let mut f = ci_facts();
    f.amdgpu_module = true;
    f.kfd_node = Some(DevNode {
        path: "/dev/kfd".into(),
        major: 241,
        minor: 0,
    });
    f.kfd_version = Some(Err(
        "opening /dev/kfd: Invalid argument (os error 22)".into()
    ));
    f.kfd_gpus = Some(0);
    let r = evaluate(&f);
    let driver = row(&r, Scope::Amd, "driver");
    assert_eq!(driver.status, Status::No);
    let fix = driver.fix.as_deref().unwrap_or_default();
    assert!(
        fix.contains("Linux 7.0") && fix.contains("no gpu node"),
        "{fix}"
    );
    // Another refusal, or one with a GPU in the topology, keeps the general advice.
    f.kfd_gpus = Some(1);
    let r = evaluate(&f);
    let fix = row(&r, Scope::Amd, "driver")
        .fix
        .clone()
        .unwrap_or_default();
    assert!(fix.starts_with("run as root"), "{fix}");
}

#[test]
fn text_and_json_renderings_carry_the_rows_and_the_exit_status() {
    let r = evaluate(&ci_facts());
    let text = r.render_text();
    assert!(text.contains("exit status 5: tracing can work, --deny-pid cannot"));
    assert!(
        text.lines().any(|l| l.starts_with("NVIDIA")
            && l.contains("raw_tp sys_exit")
            && l.contains(" yes "))
    );
    let json: serde_json::Value = serde_json::from_str(&r.render_json()).unwrap();
    assert_eq!(json["exit_code"], 5);
    assert_eq!(json["rows"].as_array().unwrap().len(), r.rows.len());
    assert_eq!(json["rows"][0]["scope"], "system");
}

/// Debian 11's kernel as the lab saw it (run of 2026-11-25, `cargo xtask lab --kernel 5.10`):
/// vmlinux BTF, kprobes, trampolines on vmlinux and BPF LSM all work; no module BTF.
fn debian_5_10_facts() -> Facts {
    let mut f = ci_facts();
    f.kernel = "5.10.0-46-amd64".into();
    f.kprobe_pmu = Some(6);
    f.kprobe_events = true;
    f.lsm = Ok("lockdown,capability,yama,apparmor,bpf".into());
    f.lockdown = Ok("[none] integrity confidentiality".into());
    f.trials.iter_mut().for_each(|(_, r)| *r = Ok(()));
    f.deny_load = Some(Ok(()));
    f
}

#[test]
fn an_old_kernel_gets_a_row_per_missing_feature() {
    let r = evaluate(&debian_5_10_facts());
    // Tracing and --deny-pid work on 5.10 (the lab's verdict); the rows say what is missing.
    assert_eq!(r.exit_code, exit::READY, "{}", r.render_text());
    let before = |since: &str| -> Vec<&Row> {
        r.rows
            .iter()
            .filter(|row| {
                row.scope == Scope::System && row.check == format!("before Linux {since}")
            })
            .collect()
    };
    // From the kernel's history: module BTF and bpf_get_current_task_btf came with 5.11, the
    // ancestor cgroup helper for tracing programs with 5.14, bpf_task_pt_regs and kprobes'
    // bpf_get_func_ip with 5.15.
    assert_eq!(before("5.11").len(), 2);
    assert_eq!(before("5.14").len(), 1);
    assert_eq!(before("5.15").len(), 2);
    assert!(before("5.8").is_empty() && before("5.5").is_empty());
    let btf = before("5.11")
        .into_iter()
        .find(|row| row.why.contains("module BTF"))
        .unwrap();
    assert_eq!(btf.status, Status::Info);
    assert!(btf.why.contains("kprobe"), "{}", btf.why);
    assert!(before("5.14")[0].why.contains("--deny-cgroup"));
    assert!(!r.rows.iter().any(|row| row.check == KERNEL_FEATURES));
}

#[test]
fn a_kernel_below_the_minimum_is_a_no_with_a_fix() {
    let mut f = debian_5_10_facts();
    f.kernel = "5.4.0-150-generic".into();
    let r = evaluate(&f);
    let ring = r
        .rows
        .iter()
        .find(|row| row.check == "before Linux 5.8")
        .expect("a row for the ring buffer");
    assert_eq!(ring.status, Status::No);
    assert!(ring.why.contains("ring buffer"), "{}", ring.why);
    assert!(ring.fix.as_deref().unwrap().contains("Linux 5.8 or later"));
}

#[test]
fn a_current_kernel_has_every_feature() {
    let r = evaluate(&ci_facts());
    assert_eq!(row(&r, Scope::System, KERNEL_FEATURES).status, Status::Yes);
    assert!(
        !r.rows
            .iter()
            .any(|row| row.check.starts_with("before Linux"))
    );
}

#[test]
fn a_warning_says_when_no_gpu_driver_is_loaded_and_the_verdict_comes_first() {
    // The CI machine: no driver of either vendor; tracing itself works.
    let r = evaluate(&ci_facts());
    assert!(r.tracing.ok);
    assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
    assert!(r.warnings[0].contains("no GPU driver is loaded"));
    let text = r.render_text();
    let at = |prefix: &str| {
        text.lines()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line:\n{text}"))
    };
    assert!(at("tracing") < at("VENDOR"), "{text}");
    assert!(at("WARNING: no GPU driver") < at("VENDOR"), "{text}");
    assert!(at("exit status") < at("VENDOR"), "{text}");
    // Either driver loaded: no warning.
    assert!(evaluate(&gpu_host_facts()).warnings.is_empty());
    let mut amd = ci_facts();
    amd.kfd_node = Some(DevNode {
        path: "/dev/kfd".into(),
        major: 236,
        minor: 0,
    });
    assert!(evaluate(&amd).warnings.is_empty());
}
