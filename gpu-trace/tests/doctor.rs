//! `gpu-trace doctor` on the running kernel, checked against independent ground truth:
//! - the syscall-hook rows against gpu-trace's real programs loaded with that hook forced (what
//!   tests/kernel.rs proves for each hook);
//! - the trampoline and BPF LSM rows against aya's own feature probe
//!   (`aya::sys::is_program_supported`), a different implementation from doctor's trial loads;
//! - the exit status against the verdicts, and an unprivileged run against "needs root".
//!
//! Needs root (CI runs as root); without it the tests print `SKIPPED: <why>` and return.

use std::{
    os::unix::process::CommandExt as _,
    process::{Command, Output},
    sync::Mutex,
};

use aya::{
    programs::{LsmAttachType, ProgramType},
    sys::is_program_supported,
};
use gpu_trace::{
    doctor::{self, exit, hook},
    loader::{LoadError, LoadOptions, SyscallHook, Tracer},
};
use serde_json::Value;

mod common;
use common::skipped;

/// One loader at a time (the kernel tests count kernel-wide counters; keep out of their way).
static SERIAL: Mutex<()> = Mutex::new(());

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run_doctor(configure: impl FnOnce(&mut Command)) -> (Output, Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-trace"));
    cmd.args(["doctor", "--json"]);
    configure(&mut cmd);
    let out = cmd.output().expect("running gpu-trace doctor");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, report)
}

fn row<'a>(report: &'a Value, scope: &str, check: &str) -> &'a Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["scope"] == scope && r["check"] == check)
        .unwrap_or_else(|| panic!("no row {scope} / {check} in {report:#}"))
}

fn says_yes(report: &Value, scope: &str, check: &str) -> bool {
    match row(report, scope, check)["status"].as_str().unwrap() {
        "yes" => true,
        "no" => false,
        other => panic!("{scope} / {check}: status {other}"),
    }
}

/// Whether gpu-trace's own programs attach with `hook` forced (what the kernel tests do).
fn real_programs_attach(hook: SyscallHook) -> bool {
    match Tracer::load(&LoadOptions {
        syscall_hook: Some(hook),
        ..Default::default()
    }) {
        Ok(_) => true,
        Err(LoadError::NoHook { .. }) => false,
        Err(e) => panic!("loading gpu-trace's programs with {hook:?}: {e}"),
    }
}

#[test]
fn doctor_agrees_with_the_real_programs_and_with_aya() {
    let test = "doctor_agrees_with_the_real_programs_and_with_aya";
    if !is_root() {
        skipped(
            test,
            "needs root (doctor's trials and gpu-trace's programs load into the kernel)",
        );
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (out, report) = run_doctor(|_| {});
    let code = out.status.code().expect("doctor exited");
    eprintln!(
        "{test}: doctor exit status {code}; tracing: {}; --deny-pid: {}",
        report["tracing"]["why"], report["deny"]["why"]
    );
    assert_eq!(
        report["exit_code"], code,
        "the printed exit code is the real one"
    );

    // The syscall hooks: doctor's trial programs vs gpu-trace's real ones, per attach type.
    for (check, forced) in [
        (hook::RAW_TP, SyscallHook::RawTp),
        (hook::TP_BTF, SyscallHook::TpBtf),
        (hook::SYSCALL_TPS, SyscallHook::Tracepoint),
    ] {
        let real = real_programs_attach(forced);
        for scope in ["NVIDIA", "AMD"] {
            assert_eq!(
                says_yes(&report, scope, check),
                real,
                "{scope} / {check}: doctor vs the real programs"
            );
        }
    }
    // Tracing as a whole: the verdict is what gpu-trace's default load does.
    let default_load = Tracer::load(&LoadOptions::default()).is_ok();
    assert_eq!(report["tracing"]["ok"], default_load);

    // Trampolines and the BPF LSM: doctor's raw bpf(2) trials vs aya's feature probe.
    let aya_tracing = is_program_supported(ProgramType::Tracing);
    let aya_lsm = is_program_supported(ProgramType::Lsm(LsmAttachType::Mac));
    eprintln!("{test}: aya says tracing programs: {aya_tracing:?}, LSM programs: {aya_lsm:?}");
    let trampolines = says_yes(&report, "system", "trampolines");
    assert_eq!(
        trampolines,
        matches!(aya_tracing, Ok(true)),
        "trampolines: doctor vs aya"
    );
    if let Err(e) = &aya_tracing {
        // A refusal: doctor names the same errno.
        let errno = e.to_string();
        let why = row(&report, "system", "trampolines")["why"]
            .as_str()
            .unwrap()
            .to_string();
        if errno.contains("Operation not permitted") {
            assert!(why.contains("EPERM"), "{why}");
        }
    }
    let lsm_active = std::fs::read_to_string("/sys/kernel/security/lsm")
        .map(|l| doctor::lsm_list(&l).iter().any(|m| m == "bpf"))
        .unwrap_or(false);
    let lsm_usable = matches!(aya_lsm, Ok(true)) && lsm_active;
    for scope in ["NVIDIA", "AMD"] {
        assert_eq!(
            says_yes(&report, scope, hook::LSM),
            lsm_usable,
            "{scope} / BPF LSM: doctor vs aya + lsm list"
        );
    }

    // The exit status follows the verdicts; --deny-pid cannot work where the LSM cannot.
    let expected = match (
        report["tracing"]["ok"].as_bool().unwrap(),
        report["deny"]["ok"].as_bool().unwrap(),
    ) {
        (false, _) => exit::UNSUPPORTED,
        (true, false) => exit::NO_DENY,
        (true, true) => exit::READY,
    };
    assert_eq!(code, i32::from(expected));
    if !lsm_usable {
        assert_eq!(report["deny"]["ok"], false);
    }
    // Every "no" names its fix.
    for r in report["rows"].as_array().unwrap() {
        if r["status"] == "no" {
            assert!(r["fix"].as_str().is_some_and(|f| !f.is_empty()), "{r}");
        }
    }
}

#[test]
fn doctor_without_privileges_says_so_and_exits_3() {
    let test = "doctor_without_privileges_says_so_and_exits_3";
    if !is_root() {
        skipped(test, "needs root to start doctor as another user");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-trace"));
    cmd.args(["doctor", "--json"]).uid(65534).gid(65534);
    // The one skip: exec as nobody refused (std reports the child's failed exec as this
    // error). Whatever doctor itself does, a crash or any exit code, is judged below.
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            skipped(
                test,
                format!(
                    "user nobody cannot run the test binary ({e}); its directory is not \
                     world-readable"
                ),
            );
            return;
        }
        Err(e) => panic!("starting gpu-trace doctor as nobody: {e}"),
    };
    let report: Value = serde_json::from_slice(&out.stdout).expect("doctor --json output");
    assert_eq!(out.status.code(), Some(i32::from(exit::UNSUPPORTED)));
    assert_eq!(row(&report, "system", "privileges")["status"], "no");
    assert!(report["tracing"]["fix"].as_str().unwrap().contains("sudo"));
    assert_eq!(report["tracing"]["ok"], false);
}

#[test]
fn doctor_text_table_has_every_hook_for_both_vendors() {
    let test = "doctor_text_table_has_every_hook_for_both_vendors";
    if !is_root() {
        skipped(test, "needs root");
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for vendor in ["NVIDIA", "AMD"] {
        for check in [
            hook::RAW_TP,
            hook::TP_BTF,
            hook::SYSCALL_TPS,
            hook::PROCESS_EXIT,
            hook::KPROBE,
            hook::FENTRY,
            hook::LSM,
        ] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(vendor) && l.contains(check)),
                "no {vendor} / {check} line in:\n{text}"
            );
        }
    }
    assert!(
        text.contains(&format!("exit status {}", out.status.code().unwrap())),
        "{text}"
    );
}
