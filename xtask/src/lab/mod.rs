//! `cargo xtask lab`: the real-kernel lab. Boots a stock Debian kernel in QEMU with `amdgpu`
//! loaded (no GPU), runs gpu-trace and a test client inside it, and judges what they printed.
//!
//! Why: the CI machine's kernel has no kprobes and refuses fentry and BPF LSM programs; a stock
//! Debian kernel has all three (see docs/lab.md and docs/platforms.md).
//!
//! Steps, each cached under `target/lab-cache/` (or `$GPU_TRACE_LAB_CACHE`):
//! 1. host tools: `qemu-system-x86_64`, static `busybox`, `depmod`/`modprobe`, `xz`, `cc`
//!    (installed with apt-get when missing and running as root);
//! 2. the kernel: `apt-get download` of `linux-image-<ver>-amd64-unsigned` through a private apt
//!    configuration (never installed on the host), `dpkg -x`, `depmod -b`, and the `amdgpu`
//!    module chain from `modprobe --show-depends`, decompressed;
//! 3. a static gpu-trace (`cargo xtask dist`'s musl build) and the static test client (`lab/client.c`);
//! 4. an initramfs (newc, uncompressed: decompressing under TCG is slow) with `lab/init.sh` as
//!    `/init`;
//! 5. QEMU (KVM where it boots, else single-threaded TCG), `-nographic -no-reboot`, console on
//!    the first serial port, results on the second, a watchdog that kills QEMU;
//! 6. the verdict: PASS/FAIL per check (a feature that did not run is a FAIL) from the results log; non-zero exit on any FAIL.
//!
//! `--arch arm64` does the same with Debian's arm64 kernels in `qemu-system-aarch64`, the
//! binaries cross-built here (`arch.rs` holds every difference).
//!
//! `GPU_TRACE_LAB=skip` skips the whole lab, loudly (a `SKIPPED:` line, exit 0). Anything else
//! that prevents the lab from running is a failure.

mod arch;
mod builds;
mod debian;
mod initramfs;
mod judge;
mod qemu;

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use crate::elf;
use crate::host::{have, is_root, which, workspace_root};
use anyhow::{Context as _, Result, bail, ensure};
pub use arch::Arch;
use builds::{Clients, build_clients, guest_gpu_trace};
use clap::{Args, ValueEnum};
use debian::{Kernel, build_test_modules};
use initramfs::write_initramfs;
use judge::{Check, Results, judge, print_report, verdict};
use qemu::boot;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Accel {
    /// KVM when the host CPU virtualises (vmx/svm) and the guest boots within 30 s, else TCG.
    Auto,
    /// Software emulation: slow, works everywhere.
    Tcg,
    /// Hardware virtualisation (fails on hosts whose /dev/kvm cannot run stock kernels).
    Kvm,
}

#[derive(Debug, Args)]
pub struct LabArgs {
    /// Debian kernel: a series (`6.12`: bookworm-backports; `6.1`: bookworm; `5.10`: bullseye;
    /// `sid`: the newest Debian has, from unstable), the newest of it in those suites and their
    /// -security, or an exact version (`6.12.117+deb12`, `6.1.0-47`, `5.10.0-46`,
    /// `7.2.13+deb14`). Repeat it (or separate with commas) to run the scenario on several
    /// kernels, one boot each. `ARCH:VERSION` (`arm64:6.12`) takes that kernel of another
    /// architecture than `--arch`'s, in the same run.
    #[arg(
        long = "kernel",
        value_name = "VERSION",
        default_value = "6.12",
        value_delimiter = ','
    )]
    pub kernels: Vec<String>,

    /// The guest's architecture: Debian's kernels of that architecture; for arm64 (TCG only)
    /// gpu-trace, the test client and the test modules are cross-built on this machine.
    #[arg(long, value_enum, default_value_t = Arch::X86_64)]
    pub arch: Arch,

    /// More kernel command-line parameters for the guest (after the lab's own).
    #[arg(long, value_name = "PARAMS", default_value = "")]
    pub append: String,

    /// Virtualisation.
    #[arg(long, value_enum, default_value_t = Accel::Auto)]
    pub accel: Accel,

    /// Guests booted at once (default: this machine's CPUs). Under TCG each guest runs on one
    /// host thread, so one guest per CPU takes about as long as one alone.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,

    /// Watchdog: kill QEMU after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,

    /// Cache directory (downloads, unpacked kernels, builds, logs). Default:
    /// `$GPU_TRACE_LAB_CACHE`, else `target/lab-cache` in the workspace.
    #[arg(long)]
    pub cache: Option<PathBuf>,

    /// Use this static gpu-trace binary instead of building one.
    #[arg(long, value_name = "PATH")]
    pub gpu_trace: Option<PathBuf>,

    /// Debian mirror.
    #[arg(long, default_value = "http://deb.debian.org")]
    pub mirror: String,

    /// Print every console line (kernel messages included), not only the lab's progress.
    #[arg(short, long)]
    pub verbose: bool,

    /// Only judge an existing results log (from an earlier run) and exit.
    #[arg(long, value_name = "RESULTS_LOG")]
    pub judge: Option<PathBuf>,
}

pub fn run(args: LabArgs) -> Result<()> {
    if std::env::var("GPU_TRACE_LAB").is_ok_and(|v| v == "skip") {
        println!("SKIPPED: lab: GPU_TRACE_LAB=skip is set; the real-kernel lab did not run");
        return Ok(());
    }
    if let Some(path) = &args.judge {
        let text =
            fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let checks = judge(&Results::parse(&text));
        print_report(&checks, "judged from a saved log");
        return verdict(&[checks]);
    }
    let started = Instant::now();
    let root = workspace_root();
    let cache = match (&args.cache, std::env::var_os("GPU_TRACE_LAB_CACHE")) {
        (Some(c), _) => c.clone(),
        (None, Some(c)) => PathBuf::from(c),
        (None, None) => root.join("target/lab-cache"),
    };
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let cache = cache.canonicalize()?;
    let mut phases: Vec<(String, Duration)> = Vec::new();

    // Each kernel with its architecture (`ARCH:VERSION`, else --arch's).
    let wanted: Vec<(Arch, String)> = (args.kernels.iter())
        .map(|k| match k.split_once(':') {
            Some((arch, version)) => Arch::from_str(arch, true)
                .map(|a| (a, version.to_owned()))
                .map_err(|e| anyhow::anyhow!("--kernel {k}: {e}")),
            None => Ok((args.arch, k.clone())),
        })
        .collect::<Result<_>>()?;
    let mut arches: Vec<Arch> = Vec::new();
    for (arch, _) in &wanted {
        if !arches.contains(arch) {
            arches.push(*arch);
        }
    }
    // What every kernel of an architecture shares: the static gpu-trace and the clients.
    let mut built = Vec::new();
    for arch in arches {
        let t = Instant::now();
        ensure_host_tools(arch).context(
            "the lab cannot run on this machine; fix the above, or set GPU_TRACE_LAB=skip to skip \
             the lab explicitly",
        )?;
        phases.push((format!("host tools ({})", arch.deb()), t.elapsed()));
        let t = Instant::now();
        let build = cache.join("build");
        fs::create_dir_all(&build)?;
        let gpu_trace = match &args.gpu_trace {
            Some(p) if arch == args.arch => p.clone(),
            _ => guest_gpu_trace(&root, arch)?,
        };
        let bytes =
            fs::read(&gpu_trace).with_context(|| format!("reading {}", gpu_trace.display()))?;
        ensure!(
            elf::is_static(&bytes)?,
            "{} is dynamically linked: the guest has no libc. Give a static build (`cargo xtask \
             dist` makes one: target/<arch>-unknown-linux-musl/release/gpu-trace)",
            gpu_trace.display()
        );
        ensure!(
            elf::machine(&bytes) == Some(arch.machine()),
            "{} is not an {} binary (--arch {})",
            gpu_trace.display(),
            arch.machine(),
            arch.deb()
        );
        let clients = build_clients(&root, &build, arch)?;
        phases.push((
            format!("static gpu-trace and client ({})", arch.deb()),
            t.elapsed(),
        ));
        built.push((arch, gpu_trace, clients));
    }

    // The kernels, `--jobs` guests at once; the reports and timings in the order asked.
    let jobs = (args.jobs.unwrap_or_else(num_cpus)).clamp(1, wanted.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: Vec<std::sync::Mutex<Option<KernelRun>>> =
        wanted.iter().map(|_| Default::default()).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((arch, version)) = wanted.get(i) else {
                        break;
                    };
                    let (_, gpu_trace, clients) = (built.iter())
                        .find(|(a, _, _)| a == arch)
                        .expect("built for every architecture asked");
                    let bins = Binaries {
                        root: &root,
                        cache: &cache,
                        gpu_trace,
                        clients,
                    };
                    let mut phases = Vec::new();
                    let report = run_kernel(&bins, version, *arch, &args, &mut phases)
                        .unwrap_or_else(|e| {
                            (
                                format!("Debian {version} ({})", arch.deb()),
                                vec![Check::fail(
                                    "lab.kernel",
                                    "the lab kernel booted",
                                    format!("{e:#}"),
                                )],
                                String::new(),
                            )
                        });
                    *done[i].lock().unwrap() = Some((report, phases));
                }
            });
        }
    });
    let mut reports = Vec::new();
    for run in done {
        let (report, kernel_phases) = (run.into_inner().unwrap()).expect("every kernel ran");
        phases.extend(kernel_phases);
        reports.push(report);
    }

    println!(
        "\n=== gpu-trace lab: timings (this machine, {} CPUs) ===",
        num_cpus()
    );
    for (name, d) in &phases {
        println!("{:>8.1} s  {name}", d.as_secs_f64());
    }
    println!(
        "{:>8.1} s  total ({jobs} guest(s) at once: their phases overlap)",
        started.elapsed().as_secs_f64()
    );
    for (what, checks, logs) in &reports {
        print_report(checks, what);
        if !logs.is_empty() {
            println!("logs: {logs}");
        }
    }
    let all: Vec<Vec<Check>> = reports.into_iter().map(|(_, c, _)| c).collect();
    verdict(&all)
}

/// One kernel's report (title, checks, where its logs are) and the timings of its phases.
type KernelRun = ((String, Vec<Check>, String), Vec<(String, Duration)>);

/// What every kernel's run of one architecture shares.
struct Binaries<'a> {
    root: &'a Path,
    cache: &'a Path,
    gpu_trace: &'a Path,
    clients: &'a Clients,
}

/// One kernel: fetch, test modules, initramfs, boot, judge. Returns the report's title, the
/// checks and where the logs are.
fn run_kernel(
    bins: &Binaries,
    wanted: &str,
    arch: Arch,
    args: &LabArgs,
    phases: &mut Vec<(String, Duration)>,
) -> Result<(String, Vec<Check>, String)> {
    let cache = bins.cache;
    let t = Instant::now();
    let kernel = Kernel::fetch(cache, wanted, arch, &args.mirror)?;
    let r = &kernel.release;
    phases.push((
        format!("{r}: kernel (download, unpack, depmod)"),
        t.elapsed(),
    ));

    // Test modules (lab/modules/*): a failure here fails their checks, not the whole lab.
    let t = Instant::now();
    let build = cache.join("build").join(r);
    fs::create_dir_all(&build)?;
    let mut setup_failures = Vec::new();
    let test_modules = match kernel
        .headers(cache, &args.mirror)
        .and_then(|headers| build_test_modules(bins.root, &headers, &build, arch))
    {
        Ok(m) => m,
        Err(e) => {
            eprintln!("lab: the test modules could not be built: {e:#}");
            setup_failures.push(format!("{e:#}"));
            Vec::new()
        }
    };
    phases.push((format!("{r}: kernel headers and test modules"), t.elapsed()));

    let t = Instant::now();
    let initramfs = build.join("initramfs.cpio");
    let busybox = kernel.busybox(cache, &args.mirror)?;
    write_initramfs(
        &initramfs,
        bins.root,
        &kernel,
        &busybox,
        bins.gpu_trace,
        bins.clients,
        &test_modules,
    )?;
    phases.push((format!("{r}: initramfs"), t.elapsed()));

    let run_dir = cache.join("run").join(r);
    let mut boot = boot(&kernel, &initramfs, &run_dir, args)?;
    phases.push((format!("{r}: boot, scenario, power-off"), boot.wall));
    // A kernel that dies while booting, before /init has run a step, under TCG: nothing of
    // gpu-trace's has run yet. Seen on sid's 7.2 (`Oops: int3` in sched_clock_cpu at 1.9 s,
    // then a panic): a race between the kernel's text patching and QEMU's translation (docs/
    // lab.md, "A kernel Oops under TCG"). One more boot, said in the verdict's title; the first
    // console is kept beside the second.
    let mut again = String::new();
    if let Some(oops) = died_before_init(&boot) {
        let kept = run_dir.join("console-first-boot.log");
        fs::rename(&boot.console, &kept)?;
        eprintln!(
            "lab: {r} died while booting, before /init ran ({oops}; console kept in {}): booting \
             it again",
            kept.display()
        );
        again = format!("; booted twice: the first boot died before /init ran: {oops}");
        boot = qemu::boot(&kernel, &initramfs, &run_dir, args)?;
        phases.push((format!("{r}: second boot, scenario, power-off"), boot.wall));
    }

    let text = fs::read_to_string(&boot.results).unwrap_or_default();
    let mut checks = judge(&Results::parse(&text));
    for failure in setup_failures {
        checks.insert(
            0,
            Check::fail(
                "lab.modules",
                "test modules built against the lab kernel",
                failure,
            ),
        );
    }
    if let Some(reason) = &boot.failure {
        checks.insert(
            0,
            Check::fail(
                "lab.qemu",
                "QEMU ran the guest to power-off",
                reason.clone(),
            ),
        );
    }
    Ok((
        format!(
            "Debian {r} in QEMU ({} {}, 2 vCPU, 2 GiB{again})",
            arch.machine(),
            boot.accel
        ),
        checks,
        format!("{} and {}", boot.console.display(), boot.results.display()),
    ))
}

/// The kernel's own Oops or panic line when the guest died before `/init` reported its first
/// step (no `LAB step` on the results port).
fn died_before_init(boot: &qemu::Boot) -> Option<String> {
    let results = fs::read_to_string(&boot.results).unwrap_or_default();
    if results.lines().any(|l| l.starts_with("LAB step")) {
        return None;
    }
    let console = fs::read_to_string(&boot.console).unwrap_or_default();
    console.lines().find_map(|l| {
        let at = l.find("Oops:").or_else(|| l.find("Kernel panic"))?;
        Some(l[at..].trim().to_owned())
    })
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

// ---- host tools ---------------------------------------------------------------------------

/// Installs the Debian packages the lab needs when they are missing (root only).
fn ensure_host_tools(arch: Arch) -> Result<()> {
    // (tool, package, why)
    let mut wanted = arch.host_tools();
    wanted.extend([
        ("busybox", "busybox-static", "the guest's shell and tools"),
        ("depmod", "kmod", "resolves the amdgpu module chain"),
        ("xz", "xz-utils", "decompresses the kernel modules"),
        ("dpkg-deb", "dpkg", "unpacks the kernel package"),
        ("apt-get", "apt", "downloads the kernel package"),
        ("make", "make", "builds the test modules (lab/modules)"),
        (
            "pahole",
            "dwarves",
            "gives the test modules BTF where the headers ship vmlinux BTF (6.12)",
        ),
    ]);
    // A tool on PATH, or a file a package installs.
    let present = |tool: &str| {
        if tool.starts_with('/') {
            Path::new(tool).exists()
        } else {
            have(tool)
        }
    };
    let missing: Vec<_> = wanted.iter().filter(|(tool, ..)| !present(tool)).collect();
    if !missing.is_empty() {
        let pkgs: Vec<&str> = missing.iter().map(|(_, p, _)| *p).collect();
        eprintln!("lab: installing host tools: {}", pkgs.join(" "));
        ensure!(
            is_root() && have("apt-get"),
            "missing host tools: {}. Install them (Debian: apt-get install {}) or run as root",
            missing
                .iter()
                .map(|(t, _, why)| format!("{t} ({why})"))
                .collect::<Vec<_>>()
                .join(", "),
            pkgs.join(" ")
        );
        run_quiet(Command::new("apt-get").args(["update", "-qq"]))?;
        run_quiet(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(&pkgs)
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )?;
    }
    let busybox = which("busybox")?;
    ensure!(
        elf::is_static(&fs::read(&busybox)?)?,
        "{} is dynamically linked; the guest needs a static one (Debian package busybox-static)",
        busybox.display()
    );
    let cc = arch.cc();
    ensure!(
        have(&cc),
        "no C compiler ({cc}) for the test client: install gcc and libc6-dev"
    );
    Ok(())
}

/// Runs a command; on failure, the error carries its output.
fn run_quiet(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            text,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}
