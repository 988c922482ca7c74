//! Booting the guest in QEMU, with a watchdog, and showing its progress.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{Accel, LabArgs, arch::Arch, debian::Kernel};
use crate::host::which;
use anyhow::{Context as _, Result, bail};

pub(super) struct Boot {
    pub(super) console: PathBuf,
    pub(super) results: PathBuf,
    pub(super) accel: &'static str,
    pub(super) wall: Duration,
    /// Why the guest did not reach power-off (watchdog, QEMU error), if it did not.
    pub(super) failure: Option<String>,
}

fn kvm_usable() -> bool {
    let cpu = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let virt = cpu
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    virt && fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// TCG with one host thread for all vCPUs (round robin). Multi-threaded TCG (QEMU's default)
/// runs each vCPU on its own thread, and the kernel's text patching (an `int3` written over an
/// instruction, then the new bytes, with IPIs between; done on every attach and detach of a
/// tracepoint program) then raced other vCPUs: `Oops: int3` on 6.12 and on sid's 7.2 at boot,
/// and on 5.10 both vCPUs stuck for good (soft lockups of the patching gpu-trace and of a client
/// in a system call) during `--deny-pid`'s start. One thread makes every code write visible
/// before the next vCPU runs; docs/lab.md, "A kernel Oops under TCG".
const TCG: &str = "tcg,thread=single";

/// The kernel command line: serial console, results port (`lab/init.sh`), no reboot on panic
/// (QEMU exits), the BPF LSM on.
fn cmdline(arch: Arch) -> String {
    let (console, results) = arch.serial();
    format!(
        "console={console} lab.results={results} loglevel=4 panic=-1 \
         lsm=lockdown,capability,landlock,yama,apparmor,bpf"
    )
}

pub(super) fn boot(
    kernel: &Kernel,
    initramfs: &Path,
    run_dir: &Path,
    args: &LabArgs,
) -> Result<Boot> {
    fs::create_dir_all(run_dir)?;
    let arch = kernel.arch;
    let tries: &[&'static str] = match args.accel {
        // KVM runs only a guest of this machine's architecture.
        _ if !arch.is_host() => &["tcg"],
        Accel::Tcg => &["tcg"],
        Accel::Kvm => &["kvm"],
        Accel::Auto if kvm_usable() => &["kvm", "tcg"],
        Accel::Auto => {
            eprintln!("lab: KVM not usable here (no vmx/svm in /proc/cpuinfo or no /dev/kvm): TCG");
            &["tcg"]
        }
    };
    for (i, &accel) in tries.iter().enumerate() {
        let last = i + 1 == tries.len();
        let console = run_dir.join("console.log");
        let results = run_dir.join("results.log");
        let _ = fs::remove_file(&console);
        let _ = fs::remove_file(&results);
        let qemu_path = which(arch.qemu())?;
        let mut cmd = Command::new(qemu_path);
        cmd.args([
            "-nodefaults",
            "-nographic",
            "-no-reboot",
            "-monitor",
            "none",
        ])
        .args(["-smp", "2", "-m", "2048"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args([
            "-append",
            format!("{} {}", cmdline(arch), args.append).trim_end(),
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .stdin(Stdio::null());
        cmd.args(arch.machine_args(if accel == "kvm" { "kvm" } else { TCG }, &results));
        eprintln!(
            "lab: booting {} under {accel} (watchdog {} s)",
            kernel.release, args.timeout
        );
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", arch.qemu()))?;
        let mut shown = 0usize;
        let mut failure = None;
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let text = fs::read(&console)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            // Print complete new lines only.
            let complete = text.rfind('\n').map_or(0, |i| i + 1);
            if complete > shown {
                for line in text[shown..complete].lines() {
                    if args.verbose || is_progress_line(line) {
                        // Named by the kernel: with --jobs, guests' lines interleave.
                        eprintln!(
                            "[{} {:6.1}] {line}",
                            kernel.release,
                            started.elapsed().as_secs_f64()
                        );
                    }
                }
                shown = complete;
            }
            if let Some(status) = child.try_wait()? {
                if !status.success() {
                    failure = Some(format!("QEMU exited with {status}"));
                }
                break;
            }
            if accel == "kvm"
                && !last
                && started.elapsed() > Duration::from_secs(30)
                && !text.contains("Linux version")
            {
                eprintln!(
                    "lab: {}: the guest printed nothing in 30 s under KVM; falling back to TCG",
                    kernel.release
                );
                let _ = child.kill();
                let _ = child.wait();
                failure = Some("kvm: no boot".into());
                break;
            }
            if started.elapsed() > Duration::from_secs(args.timeout) {
                let _ = child.kill();
                let _ = child.wait();
                // The console's last lines in the verdict itself: a CI log may keep only that.
                let tail: Vec<&str> = text.lines().rev().take(15).collect();
                failure = Some(format!(
                    "watchdog: the guest did not power off within {} s (killed); see {}; its \
                     console ended with: {}",
                    args.timeout,
                    console.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
                ));
                break;
            }
        }
        if failure.as_deref() == Some("kvm: no boot") {
            continue;
        }
        return Ok(Boot {
            console,
            results,
            accel,
            wall: started.elapsed(),
            failure,
        });
    }
    bail!("no accelerator could boot the guest")
}

fn is_progress_line(line: &str) -> bool {
    line.starts_with("LAB step")
        || line.starts_with("LAB fact")
        || line.starts_with("LAB modules")
        || line.starts_with("LAB module_failed")
        || line.starts_with("lab: ")
        || line.contains("Kernel panic")
        || line.contains("BUG:")
        || line.contains("Oops")
}
