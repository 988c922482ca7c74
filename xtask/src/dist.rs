//! `cargo xtask dist`: a gpu-trace that installs without a toolchain. A static (musl) release
//! build with the kernel programs embedded, its man pages and shell completions, packed as a
//! tarball and as a Debian package (`dpkg-deb`); `--check` installs both into a fresh Debian
//! root made by `debootstrap` (no Rust, no LLVM) and runs the installed binary there.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail, ensure};

use crate::host::{have, is_root, workspace_root};

/// Architectures `dist` builds. The kernel programs inside each binary are built for that
/// architecture's syscall register layout (aya-build passes the target's `bpf_target_arch`).
const TARGETS: [Target; 2] = [
    Target {
        triple: "x86_64-unknown-linux-musl",
        deb_arch: "amd64",
        suffix: "x86_64-linux-musl",
        // The build machine's own architecture: Rust's self-contained musl linking with cc.
        linker: None,
        // ring's C and assembly (rustls's crypto, for the endpoint's TLS) need no musl headers:
        // the build machine's own compiler and archiver serve (the cc crate would otherwise look
        // for x86_64-linux-musl-gcc, which no distribution package installs by that name).
        c_compiler: ("cc", "ar"),
        qemu: None,
    },
    Target {
        triple: "aarch64-unknown-linux-musl",
        deb_arch: "arm64",
        suffix: "aarch64-linux-musl",
        // Cross-linked with the LLVM linker that ships with Rust: no cross gcc needed.
        linker: Some("rust-lld"),
        // ring's C and assembly: the arm64 cross gcc that scripts/setup.sh installs for the lab
        // (gcc-aarch64-linux-gnu); the cc crate's default, aarch64-linux-musl-gcc, does not exist.
        c_compiler: ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-ar"),
        qemu: Some("qemu-aarch64-static"),
    },
];

struct Target {
    triple: &'static str,
    deb_arch: &'static str,
    suffix: &'static str,
    /// Linker for a cross build (`None`: the default).
    linker: Option<&'static str>,
    /// C compiler and archiver for the target's C code (ring), given to the cc crate as
    /// `CC_<triple>` and `AR_<triple>`.
    c_compiler: (&'static str, &'static str),
    /// User-mode emulator that runs the binary on an x86-64 build machine (`--check`).
    qemu: Option<&'static str>,
}

#[derive(clap::Args)]
pub struct DistArgs {
    /// Where the tarball and the .deb go.
    #[arg(long, value_name = "DIR", default_value = "target/dist")]
    pub out: PathBuf,
    /// Then install both into a fresh Debian root (debootstrap, as root) and run the installed
    /// gpu-trace there: --version, --help, doctor, a replay of a committed recording.
    #[arg(long)]
    pub check: bool,
    /// Debian mirror for --check's debootstrap.
    #[arg(long, default_value = "http://deb.debian.org/debian")]
    pub mirror: String,
    /// Debian suite for --check.
    #[arg(long, default_value = "bookworm")]
    pub suite: String,
}

pub fn run(args: DistArgs) -> Result<()> {
    let root = workspace_root();
    let out = root.join(&args.out);
    fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let version = env!("CARGO_PKG_VERSION");
    let mut built = Vec::new();
    for target in &TARGETS {
        let bin = build(&root, target)?;
        let staging = out.join(format!("stage-{}", target.suffix));
        if staging.exists() {
            fs::remove_dir_all(&staging)?;
        }
        let generated = crate::r#gen::generate(&staging.join("gen"))?;
        let tarball = tarball(&out, &staging, &bin, &generated, version, target)?;
        println!("wrote {}", tarball.display());
        let deb = deb(&out, &staging, &bin, &generated, version, target)?;
        println!("wrote {}", deb.display());
        built.push(Built {
            target,
            staging,
            tarball,
            deb,
        });
    }
    if args.check {
        for b in &built {
            if let Some(qemu) = b.target.qemu {
                check_emulated(&root, &b.staging, qemu, b.target, version)?;
            }
        }
        check(&root, &out, &args, &built)?;
    }
    for b in &built {
        fs::remove_dir_all(&b.staging).ok();
    }
    Ok(())
}

/// One architecture's artifacts.
struct Built<'a> {
    target: &'a Target,
    staging: PathBuf,
    tarball: PathBuf,
    deb: PathBuf,
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {:?}", cmd.get_program()))?;
    ensure!(status.success(), "{cmd:?} failed ({status})");
    Ok(())
}

/// The static (musl) release binary, built if needed (`cargo xtask fleet` puts it in the image).
pub(crate) fn static_binary(root: &Path) -> Result<PathBuf> {
    build(root, &TARGETS[0])
}

/// The static (musl) release binary for the architecture `machine` (`uname -m`: `aarch64`),
/// built if needed: the lab's arm64 guest runs it.
pub(crate) fn static_binary_for(root: &Path, machine: &str) -> Result<PathBuf> {
    let target = TARGETS
        .iter()
        .find(|t| t.triple.split('-').next() == Some(machine))
        .with_context(|| format!("dist builds no binary for {machine}"))?;
    build(root, target)
}

/// The static release binary for `target`; adds the Rust target with rustup when it is missing.
fn build(root: &Path, target: &Target) -> Result<PathBuf> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("running rustup (dist needs rustup to add the musl target)")?;
    if !String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == target.triple)
    {
        run_cmd(Command::new("rustup").args(["target", "add", target.triple]))?;
    }
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(root)
        .args(["build", "--release", "-p", "gpu-trace", "--target"])
        .arg(target.triple);
    let cc_var = target.triple.replace('-', "_");
    let (cc, ar) = target.c_compiler;
    cargo
        .env(format!("CC_{cc_var}"), cc)
        .env(format!("AR_{cc_var}"), ar);
    if let Some(linker) = target.linker {
        // musl keeps dlopen in libc.a and ships an empty libdl.a, which Rust's self-contained
        // musl for aarch64 lacks; libloading (NVML, loaded at run time) asks for -ldl. An empty
        // archive satisfies it, as musl's own does.
        let stubs = root.join("target/dist/link-stubs").join(target.triple);
        fs::create_dir_all(&stubs)?;
        fs::write(stubs.join("libdl.a"), b"!<arch>\n")?;
        let var = target.triple.to_uppercase().replace('-', "_");
        cargo.env(format!("CARGO_TARGET_{var}_LINKER"), linker).env(
            format!("CARGO_TARGET_{var}_RUSTFLAGS"),
            format!("-C linker-flavor=ld.lld -L {}", stubs.display()),
        );
    }
    run_cmd(&mut cargo)?;
    let bin = root
        .join("target")
        .join(target.triple)
        .join("release/gpu-trace");
    let bytes = fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?;
    ensure!(
        crate::elf::is_static(&bytes)?,
        "{} has a program interpreter: not a static build",
        bin.display()
    );
    Ok(bin)
}

/// Where each generated file goes under a prefix (`usr/` in the .deb, the top directory in the
/// tarball). `None` for shells without a conventional system-wide location (elvish).
fn install_path(file: &Path) -> Option<PathBuf> {
    let name = file.file_name()?.to_str()?;
    let dir = if name.ends_with(".1") {
        "share/man/man1"
    } else if name == "gpu-trace.bash" {
        return Some(PathBuf::from("share/bash-completion/completions/gpu-trace"));
    } else if name == "_gpu-trace" {
        "share/zsh/vendor-completions"
    } else if name == "gpu-trace.fish" {
        "share/fish/vendor_completions.d"
    } else {
        return None;
    };
    Some(Path::new(dir).join(name))
}

/// Lays out bin/, share/ and the docs under `dir`.
fn lay_out(dir: &Path, bin: &Path, generated: &[PathBuf], doc_dir: &str) -> Result<()> {
    let root = workspace_root();
    let mut copies = vec![(bin.to_path_buf(), PathBuf::from("bin/gpu-trace"))];
    for file in generated {
        if let Some(dest) = install_path(file) {
            copies.push((file.clone(), dest));
        }
    }
    copies.push((root.join("README.md"), Path::new(doc_dir).join("README.md")));
    for (from, to) in copies {
        let to = dir.join(to);
        fs::create_dir_all(to.parent().expect("a file path has a parent"))?;
        fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

fn tarball(
    out: &Path,
    staging: &Path,
    bin: &Path,
    generated: &[PathBuf],
    version: &str,
    target: &Target,
) -> Result<PathBuf> {
    let name = format!("gpu-trace-{version}-{}", target.suffix);
    let dir = staging.join(&name);
    lay_out(&dir, bin, generated, "share/doc/gpu-trace")?;
    let path = out.join(format!("{name}.tar.gz"));
    run_cmd(
        Command::new("tar")
            .arg("-C")
            .arg(staging)
            .args(["--owner=0", "--group=0", "-czf"])
            .arg(&path)
            .arg(&name),
    )?;
    Ok(path)
}

fn deb(
    out: &Path,
    staging: &Path,
    bin: &Path,
    generated: &[PathBuf],
    version: &str,
    target: &Target,
) -> Result<PathBuf> {
    let dir = staging.join("deb");
    lay_out(&dir.join("usr"), bin, generated, "share/doc/gpu-trace")?;
    // Debian policy: man pages are gzip-compressed.
    run_cmd(
        Command::new("gzip").arg("-9n").args(
            fs::read_dir(dir.join("usr/share/man/man1"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect::<Vec<_>>(),
        ),
    )?;
    let size_kib = dir_size(&dir)?.div_ceil(1024);
    fs::create_dir_all(dir.join("DEBIAN"))?;
    fs::write(
        dir.join("DEBIAN/control"),
        format!(
            "Package: gpu-trace\n\
             Version: {version}\n\
             Architecture: {arch}\n\
             Maintainer: gpu-trace developers <gpu-trace@localhost>\n\
             Installed-Size: {size_kib}\n\
             Section: utils\n\
             Priority: optional\n\
             Description: eBPF tracer of GPU driver scheduling (NVIDIA RM, AMD KFD)\n \
             gpu-trace prints one line each time the GPU driver creates, schedules, hands\n \
             a work-submit token to, or tears down a channel group (NVIDIA TSG) or a\n \
             compute queue (AMD KFD), for every process; static binary, kernel programs\n \
             embedded. Needs root (or CAP_BPF + CAP_PERFMON) and a kernel with BTF.\n",
            arch = target.deb_arch,
        ),
    )?;
    let path = out.join(format!("gpu-trace_{version}_{}.deb", target.deb_arch));
    run_cmd(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&dir)
            .arg(&path),
    )?;
    Ok(path)
}

fn dir_size(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// Installs the .deb and the tarball into a fresh Debian root (cached debootstrap of `suite`,
/// never written: each check runs in an overlay on it) and runs the installed binaries there.
fn check(root: &Path, out: &Path, args: &DistArgs, built: &[Built]) -> Result<()> {
    let native = built
        .iter()
        .find(|b| b.target.qemu.is_none())
        .context("no build for this machine's architecture")?;
    let (tarball, deb) = (&native.tarball, &native.deb);
    if !is_root() {
        bail!("dist --check needs root (debootstrap and chroot)");
    }
    if !have("debootstrap") {
        run_cmd(Command::new("apt-get").args(["install", "-y", "-qq", "debootstrap"]))
            .context("installing debootstrap (apt-get update first if this fails)")?;
    }
    let base = out.join(format!("debootstrap-{}", args.suite));
    if !base.join("bin/sh").exists() {
        let partial = out.join(format!("debootstrap-{}.partial", args.suite));
        if partial.exists() {
            fs::remove_dir_all(&partial)?;
        }
        run_cmd(
            Command::new("debootstrap")
                .args(["--variant=minbase", &args.suite])
                .arg(&partial)
                .arg(&args.mirror),
        )
        .context("making a fresh Debian root with debootstrap (needs the Debian mirror)")?;
        // The packages debootstrap downloaded are installed already: ~100 MB nobody reads.
        let archives = partial.join("var/cache/apt/archives");
        for entry in fs::read_dir(&archives)? {
            let path = entry?.path();
            if path.extension().is_some_and(|e| e == "deb") {
                fs::remove_file(path)?;
            }
        }
        fs::rename(&partial, &base)?;
    }
    ensure!(
        !base.join("usr/bin/cargo").exists() && !base.join("usr/bin/rustc").exists(),
        "the fresh root has a Rust toolchain: not a fair check"
    );
    // The check never writes into the cached root: it runs in an overlay (the root below, a
    // small upper layer for what the check writes) mounted in a private mount namespace, so
    // nothing stays mounted and the disk holds one Debian root, not two (a full copy filled
    // a CI disk once). Where overlayfs is refused, a hard-link copy stands in.
    let fresh = out.join("fresh-root");
    let upper = out.join("fresh-upper");
    let work = out.join("fresh-work");
    ensure!(
        !fs::read_to_string("/proc/mounts")?.contains(&*fresh.to_string_lossy()),
        "something is mounted under {} (an earlier check?): unmount it first",
        fresh.display()
    );
    for dir in [&fresh, &upper, &work] {
        if dir.exists() {
            run_cmd(Command::new("rm").arg("-rf").arg(dir))?;
        }
        fs::create_dir_all(dir)?;
    }
    let tmp = upper.join("tmp");
    fs::create_dir_all(&tmp)?;
    fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o1777))?;
    fs::copy(deb, tmp.join("gpu-trace.deb"))?;
    fs::copy(tarball, tmp.join("gpu-trace.tar.gz"))?;
    let fixture = root.join("gpu-trace/tests/fixtures/two_streams.gtrace");
    fs::copy(&fixture, tmp.join("two_streams.gtrace"))?;
    // doctor's verdict inside the root must be the host's: the root sees the host's /sys and
    // /dev (bound below), so an installed binary that misjudges the machine fails here. The
    // host's verdict comes from the same static binary, run outside.
    let host_doctor = Command::new(native.staging.join("deb/usr/bin/gpu-trace"))
        .arg("doctor")
        .output()
        .context("running the built gpu-trace doctor on this machine")?;
    let host_rc = host_doctor
        .status
        .code()
        .context("gpu-trace doctor was killed by a signal")?;
    println!("dist check: doctor on this machine exits {host_rc}");
    // The other architectures' packages, installed in turn in the same root and run under
    // their user-mode emulator (copied in: the root has none).
    let mut foreign = String::new();
    for b in built.iter().filter(|b| b.target.qemu.is_some()) {
        let qemu = b.target.qemu.unwrap_or_default();
        let Some(emulator) = crate::host::find_in_path(qemu) else {
            println!(
                "SKIPPED: dist --check: installing the {} package: {qemu} is not installed \
                 (apt-get install qemu-user-static)",
                b.target.deb_arch
            );
            continue;
        };
        let arch = b.target.deb_arch;
        fs::copy(&b.deb, tmp.join(format!("gpu-trace-{arch}.deb")))?;
        fs::copy(&b.tarball, tmp.join(format!("gpu-trace-{arch}.tar.gz")))?;
        fs::copy(&emulator, tmp.join(qemu))?;
        foreign.push_str(&format!(
            r#"
# The {arch} package: replaces the native one, installs the same files, replays the same.
dpkg -r gpu-trace
test ! -e /usr/bin/gpu-trace
dpkg --add-architecture {arch}
dpkg -i /tmp/gpu-trace-{arch}.deb
test "$(dpkg-query -W -f='${{Architecture}}' gpu-trace)" = {arch}
test -f /usr/share/man/man1/gpu-trace.1.gz
test -f /usr/share/bash-completion/completions/gpu-trace
/tmp/{qemu} /usr/bin/gpu-trace --version
/tmp/{qemu} /usr/bin/gpu-trace replay /tmp/two_streams.gtrace | cmp - /tmp/replay.txt
mkdir -p /opt/{arch} && tar -C /opt/{arch} -xzf /tmp/gpu-trace-{arch}.tar.gz
/tmp/{qemu} /opt/{arch}/gpu-trace-*/bin/gpu-trace replay /tmp/two_streams.gtrace | cmp - /tmp/replay.txt
dpkg -r gpu-trace
test ! -e /usr/bin/gpu-trace
echo "dist check ({arch} package): ok"
"#
        ));
    }
    let script = format!(
        r#"set -eu
dpkg -i /tmp/gpu-trace.deb
gpu-trace --version
test -f /usr/share/man/man1/gpu-trace.1.gz
test -f /usr/share/bash-completion/completions/gpu-trace
gpu-trace replay /tmp/two_streams.gtrace > /tmp/replay.txt
# The fixture's PyTorch run scheduled 4 TSGs (tests/fixtures/README.md).
test "$(grep -c '^[0-9:.]* \[CPU[0-9]*\] SCHEDULE ' /tmp/replay.txt)" = 4
rc=0; gpu-trace doctor > /tmp/doctor.txt || rc=$?
echo "doctor exit $rc (on the host: {host_rc})"; head -3 /tmp/doctor.txt
if [ "$rc" != {host_rc} ]; then echo "doctor: exit $rc in the fresh root, {host_rc} on the host"; cat /tmp/doctor.txt; exit 1; fi
mkdir -p /opt/t && tar -C /opt/t -xzf /tmp/gpu-trace.tar.gz
/opt/t/gpu-trace-*/bin/gpu-trace --version
/opt/t/gpu-trace-*/bin/gpu-trace replay /tmp/two_streams.gtrace | cmp - /tmp/replay.txt
{foreign}
echo "dist check: ok"
"#
    );
    fs::write(tmp.join("check.sh"), script)?;
    // Runs in the private mount namespace: $1 the cached root, $2 the upper layer, $3 overlay's
    // work directory, $4 the mount point.
    let mount_and_run = r#"set -eu
if ! mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" 2>/tmp/gpu-trace-overlay.err; then
  echo "dist check: overlayfs refused ($(cat /tmp/gpu-trace-overlay.err)); using a hard-link copy"
  cp -al "$1/." "$4/" && cp -a "$2/." "$4/"
fi
rm -f /tmp/gpu-trace-overlay.err
mount --rbind /sys "$4/sys" && mount --rbind /dev "$4/dev"
exec chroot "$4" /bin/sh -c 'mount -t proc proc /proc && exec /bin/sh /tmp/check.sh'
"#;
    let result = run_cmd(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--"])
            .args(["/bin/sh", "-c", mount_and_run, "sh"])
            .args([&base, &upper, &work, &fresh])
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            ),
    );
    ensure!(
        !fs::read_to_string("/proc/mounts")?.contains(&*fresh.to_string_lossy()),
        "something is still mounted under {}; not deleting it",
        fresh.display()
    );
    result.context("the installed gpu-trace failed in the fresh Debian root")?;
    for dir in [&fresh, &upper, &work] {
        run_cmd(Command::new("rm").arg("-rf").arg(dir))?;
    }
    Ok(())
}

/// A cross-built binary, run on this machine under a user-mode emulator: `--version`, and a
/// replay of the committed PyTorch recording that must print what the native build prints.
/// (Its kernel programs cannot run here: that needs an arm64 kernel.)
fn check_emulated(
    root: &Path,
    staging: &Path,
    qemu: &str,
    target: &Target,
    version: &str,
) -> Result<()> {
    if !have(qemu) {
        // The loud skip, as the test suite does it: CI's log shows it.
        println!(
            "SKIPPED: dist --check for {}: {qemu} is not installed (apt-get install qemu-user-static)",
            target.triple
        );
        return Ok(());
    }
    let bin = staging
        .join(format!("gpu-trace-{version}-{}", target.suffix))
        .join("bin/gpu-trace");
    let fixture = root.join("gpu-trace/tests/fixtures/two_streams.gtrace");
    let out = Command::new(qemu).arg(&bin).arg("--version").output()?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("gpu-trace "),
        "{} --version under {qemu} failed: {out:?}",
        target.triple
    );
    let emulated = Command::new(qemu)
        .arg(&bin)
        .arg("replay")
        .arg(&fixture)
        .output()?;
    let native = Command::new(root.join("target/x86_64-unknown-linux-musl/release/gpu-trace"))
        .arg("replay")
        .arg(&fixture)
        .output()?;
    ensure!(
        emulated.status.success() && native.status.success(),
        "replay failed: emulated {:?}, native {:?}",
        emulated.status,
        native.status
    );
    ensure!(
        emulated.stdout == native.stdout && !native.stdout.is_empty(),
        "the {} build replays the recording differently from the x86-64 build",
        target.triple
    );
    println!(
        "dist check ({}): --version and a replay under {qemu}: ok",
        target.triple
    );
    Ok(())
}
