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

/// The Debian revision of the packages (`0.1.0-1`): the packaging's own version.
const DEB_REVISION: u32 = 1;

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

/// Which architectures `dist` builds (`--arch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arch {
    /// The build machine's own architecture only: the quick path (one release build).
    Host,
    #[value(name = "x86_64", alias = "amd64")]
    X86_64,
    #[value(name = "aarch64", alias = "arm64")]
    Aarch64,
    /// x86_64 and aarch64.
    All,
}

impl Arch {
    /// The targets built for this choice, the host's first.
    fn targets(self) -> Result<Vec<&'static Target>> {
        let by_machine = |machine: &str| {
            TARGETS
                .iter()
                .find(|t| t.triple.split('-').next() == Some(machine))
                .with_context(|| {
                    format!("dist builds no binary for {machine}: use --arch x86_64 or aarch64")
                })
        };
        Ok(match self {
            Arch::Host => vec![by_machine(std::env::consts::ARCH)?],
            Arch::X86_64 => vec![by_machine("x86_64")?],
            Arch::Aarch64 => vec![by_machine("aarch64")?],
            Arch::All => TARGETS.iter().collect(),
        })
    }
}

#[derive(clap::Args)]
pub struct DistArgs {
    /// Which architectures to build: `host` (this machine's only, the quick path), `x86_64`,
    /// `aarch64` or `all`.
    #[arg(long, value_enum, default_value = "all")]
    pub arch: Arch,
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
    let targets = args.arch.targets()?;
    ensure!(
        !args.check || targets.iter().any(|t| t.qemu.is_none()),
        "--check installs this machine's package into a Debian root: use --arch host or all"
    );
    let mut built = Vec::new();
    for target in targets {
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
    let artifacts: Vec<PathBuf> = built
        .iter()
        .flat_map(|b| [b.tarball.clone(), b.deb.clone()])
        .collect();
    let sums = record_checksums(&out, &artifacts)?;
    println!("wrote {}", sums.display());
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

/// Lays out bin/, share/ and the docs under `dir`: README.md, every file it links to at the
/// same relative path (so its links work in the installed copy), and the copyright file.
fn lay_out(dir: &Path, bin: &Path, generated: &[PathBuf], doc_dir: &str) -> Result<()> {
    let root = workspace_root();
    let mut copies = vec![(bin.to_path_buf(), PathBuf::from("bin/gpu-trace"))];
    for file in generated {
        if let Some(dest) = install_path(file) {
            copies.push((file.clone(), dest));
        }
    }
    for doc in readme_documents(&root)? {
        copies.push((root.join(&doc), Path::new(doc_dir).join(&doc)));
    }
    for (from, to) in copies {
        let to = dir.join(to);
        fs::create_dir_all(to.parent().expect("a file path has a parent"))?;
        fs::copy(&from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    let copyright = debian_copyright(&root)?;
    fs::write(dir.join(doc_dir).join("copyright"), copyright)?;
    Ok(())
}

/// The relative link targets of a Markdown text (`[text](target)`), without `#anchor`s; web
/// addresses, `mailto:` and in-page anchors left out.
fn relative_links(markdown: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = markdown;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split('#').next().unwrap_or_default().trim();
        if !target.is_empty() && !target.contains(':') && !links.iter().any(|l| l == target) {
            links.push(target.to_string());
        }
        rest = &rest[end..];
    }
    links
}

/// Most that a directory the README links to may hold (its files are installed with it).
const LINKED_DIR_MAX_BYTES: u64 = 4 << 20;

/// README.md and the repository files it links to (paths relative to the workspace root); a
/// linked directory brings its files (at most [`LINKED_DIR_MAX_BYTES`]).
fn readme_documents(root: &Path) -> Result<Vec<PathBuf>> {
    let readme = fs::read_to_string(root.join("README.md")).context("reading README.md")?;
    let mut docs = vec![PathBuf::from("README.md")];
    for link in relative_links(&readme) {
        let path = PathBuf::from(&link);
        ensure!(
            path.components()
                .all(|c| matches!(c, std::path::Component::Normal(_))),
            "README.md links to {link}, outside the source tree: the package cannot install it"
        );
        let full = root.join(&path);
        if full.is_dir() {
            let size = dir_size(&full)?;
            ensure!(
                size <= LINKED_DIR_MAX_BYTES,
                "README.md links to the directory {link} ({size} bytes, more than the \
                 {LINKED_DIR_MAX_BYTES} the package takes): link to a file in it instead"
            );
            docs.extend(files_under(root, &path)?);
            continue;
        }
        ensure!(
            full.is_file(),
            "README.md links to {link}, which does not exist: fix the link"
        );
        docs.push(path);
    }
    docs.dedup();
    Ok(docs)
}

/// The files under `root/dir`, as paths relative to `root`.
fn files_under(root: &Path, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(root.join(dir))? {
        let rel = dir.join(entry?.file_name());
        if root.join(&rel).is_dir() {
            files.extend(files_under(root, &rel)?);
        } else {
            files.push(rel);
        }
    }
    files.sort();
    Ok(files)
}

/// The Debian maintainer: `[package.metadata.deb] maintainer` in gpu-trace/Cargo.toml.
fn deb_maintainer(cargo_toml: &str) -> Result<String> {
    let mut section = "";
    for line in cargo_toml.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[package.metadata.deb]"
            && let Some(value) = line.strip_prefix("maintainer")
            && let Some(value) = value.trim_start().strip_prefix('=')
        {
            let value = value.trim().trim_matches('"');
            let address = value
                .rsplit_once('<')
                .and_then(|(_, a)| a.strip_suffix('>'))
                .unwrap_or_default();
            let domain = address.rsplit_once('@').map_or("", |(_, d)| d);
            ensure!(
                value.ends_with('>') && address.contains('@') && !placeholder_domain(domain),
                "gpu-trace/Cargo.toml: maintainer {value:?} is not `Name <address>` with a real \
                 address (not localhost, nor a reserved example or test domain)"
            );
            return Ok(value.to_string());
        }
    }
    bail!("gpu-trace/Cargo.toml has no [package.metadata.deb] maintainer = \"Name <address>\"")
}

/// A domain no mail reaches: localhost, one without a dot, or a name RFC 2606/6761 reserves
/// for examples and tests (`example`, `example.com`/`.net`/`.org`, `.test`, `.invalid`,
/// `.localhost`).
fn placeholder_domain(domain: &str) -> bool {
    let d = domain.to_ascii_lowercase();
    let d = d.trim_end_matches('.');
    !d.contains('.')
        || ["example.com", "example.net", "example.org"].contains(&d)
        || [".example", ".test", ".invalid", ".localhost"]
            .iter()
            .any(|tld| d.ends_with(tld))
        || [".example.com", ".example.net", ".example.org"]
            .iter()
            .any(|tld| d.ends_with(tld))
}

/// The date of the commit built (RFC 2822, as Debian changelogs write it); the build's time
/// where there is no git: the same tree gives the same package.
fn source_date(root: &Path) -> String {
    Command::new("git")
        .current_dir(root)
        .args(["log", "-1", "--format=%cD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|d| !d.is_empty())
        .or_else(|| {
            let out = Command::new("date").arg("-R").output().ok()?;
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        })
        .unwrap_or_default()
}

/// `/usr/share/doc/gpu-trace/copyright` (machine-readable, DEP-5): packaging/debian/copyright
/// with the year, the maintainer and the workspace's licence filled in.
fn debian_copyright(root: &Path) -> Result<String> {
    let template = fs::read_to_string(root.join("packaging/debian/copyright"))
        .context("reading packaging/debian/copyright")?;
    let maintainer = deb_maintainer(&fs::read_to_string(root.join("gpu-trace/Cargo.toml"))?)?;
    let date = source_date(root);
    let year = date.split_whitespace().nth(3).unwrap_or("2026");
    // Cargo's SPDX names as DEP-5 spells them (MIT is "Expat" there).
    let license = env!("CARGO_PKG_LICENSE")
        .replace(" OR ", " or ")
        .replace("MIT", "Expat");
    Ok(template
        .replace("@YEAR@", year)
        .replace("@MAINTAINER@", &maintainer)
        .replace("@LICENSE@", &license))
}

/// `changelog.Debian.gz`'s text: one entry for the version built.
fn debian_changelog(root: &Path, deb_version: &str) -> Result<String> {
    let maintainer = deb_maintainer(&fs::read_to_string(root.join("gpu-trace/Cargo.toml"))?)?;
    let commit = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| format!(" from commit {}", String::from_utf8_lossy(&o.stdout).trim()))
        .unwrap_or_default();
    Ok(format!(
        "gpu-trace ({deb_version}) unstable; urgency=medium\n\n  \
         * Built by `cargo xtask dist`{commit}.\n    \
         Changes: the project's history and /usr/share/doc/gpu-trace/README.md.\n\n \
         -- {maintainer}  {date}\n",
        date = source_date(root)
    ))
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
    // Debian policy 10.1: binaries are stripped (the tarball keeps its symbols). The binutils
    // strip of the target's architecture: the build machine's own, or the cross one that ships
    // with the cross gcc.
    let ar = target.c_compiler.1;
    let strip = format!("{}strip", ar.strip_suffix("ar").unwrap_or(ar));
    run_cmd(
        Command::new(&strip)
            .args(["--strip-unneeded", "--remove-section=.comment"])
            .arg(dir.join("usr/bin/gpu-trace")),
    )
    .with_context(|| format!("stripping the packaged binary with {strip}"))?;
    let overrides = dir.join("usr/share/lintian/overrides");
    fs::create_dir_all(&overrides)?;
    fs::write(overrides.join("gpu-trace"), LINTIAN_OVERRIDES)?;
    // Debian policy: man pages are gzip-compressed.
    run_cmd(
        Command::new("gzip").arg("-9n").args(
            fs::read_dir(dir.join("usr/share/man/man1"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .collect::<Vec<_>>(),
        ),
    )?;
    // Debian policy 12.7: the packaging's changelog, compressed (-n: no name or time stamp).
    let deb_version = format!("{version}-{DEB_REVISION}");
    let changelog = dir.join("usr/share/doc/gpu-trace/changelog.Debian");
    fs::write(
        &changelog,
        debian_changelog(&workspace_root(), &deb_version)?,
    )?;
    run_cmd(Command::new("gzip").arg("-9n").arg(&changelog))?;
    let maintainer = deb_maintainer(&fs::read_to_string(
        workspace_root().join("gpu-trace/Cargo.toml"),
    )?)?;
    let size_kib = dir_size(&dir)?.div_ceil(1024);
    fs::create_dir_all(dir.join("DEBIAN"))?;
    md5sums(&dir)?;
    fs::write(
        dir.join("DEBIAN/control"),
        format!(
            "Package: gpu-trace\n\
             Version: {deb_version}\n\
             Architecture: {arch}\n\
             Maintainer: {maintainer}\n\
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
    let path = out.join(format!("gpu-trace_{deb_version}_{}.deb", target.deb_arch));
    run_cmd(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "--build"])
            .arg(&dir)
            .arg(&path),
    )?;
    Ok(path)
}

/// What lintian says of the package that is so by design, each with the reason
/// (`/usr/share/lintian/overrides/gpu-trace`).
const LINTIAN_OVERRIDES: &str = "\
# A static binary by design (no runtime dependency, the kernel programs embedded): the Rust port
# of libyaml that serde_yaml_ng uses (unsafe-libyaml) is compiled in; no copy of the C library.
gpu-trace: embedded-library libyaml [usr/bin/gpu-trace]
# A static executable by design: on x86-64 static-pie (ELF type DYN without an interpreter, not
# a shared library), on arm64 a plain static ELF.
gpu-trace: shared-library-lacks-prerequisites [usr/bin/gpu-trace]
gpu-trace: statically-linked-binary [usr/bin/gpu-trace]
# Built outside Debian's archive: there is no ITP bug for the first upload to close.
gpu-trace: initial-upload-closes-no-bugs [usr/share/doc/gpu-trace/changelog.Debian.gz:1]
";

/// `lintian` on `deb` when lintian is installed (scripts/setup.sh installs it): any error or
/// warning it gives, beyond the overrides above, fails.
fn lintian(deb: &Path) -> Result<()> {
    if !have("lintian") {
        eprintln!(
            "dist: lintian not installed: {} not checked by it",
            deb.display()
        );
        return Ok(());
    }
    let out = Command::new("lintian")
        .args(["--fail-on", "error,warning", "--tag-display-limit", "0"])
        .arg(deb)
        .env("LC_ALL", "C.UTF-8")
        .output()
        .context("running lintian")?;
    let said = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "lintian on {}: {}{}",
        deb.display(),
        said.trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    eprintln!(
        "dist: lintian: {} clean{}",
        deb.display(),
        if said.trim().is_empty() {
            String::new()
        } else {
            format!(" ({})", said.trim())
        }
    );
    Ok(())
}

/// `DEBIAN/md5sums`: every file under usr/ (dpkg --verify and debsums read it).
fn md5sums(dir: &Path) -> Result<()> {
    let out = Command::new("sh")
        .current_dir(dir)
        .args(["-c", "find usr -type f | LC_ALL=C sort | xargs md5sum"])
        .output()
        .context("running md5sum")?;
    ensure!(out.status.success(), "md5sum failed: {out:?}");
    fs::write(dir.join("DEBIAN/md5sums"), out.stdout)?;
    Ok(())
}

/// Writes `out/SHA256SUMS` (the `sha256sum` format, `sha256sum -c SHA256SUMS` checks it in
/// `out`): a line for each of `files` (in `out`), replacing an earlier line for the same name;
/// lines of files no longer there are dropped. `dist` and `fleet --save-image` both write it.
pub(crate) fn record_checksums(out: &Path, files: &[PathBuf]) -> Result<PathBuf> {
    let path = out.join("SHA256SUMS");
    let names = files
        .iter()
        .map(|f| {
            ensure!(
                f.parent() == Some(out),
                "{} is not in {}",
                f.display(),
                out.display()
            );
            Ok(f.file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned())
        })
        .collect::<Result<Vec<_>>>()?;
    let mut lines: Vec<String> = fs::read_to_string(&path)
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.split_once("  ")
                .is_some_and(|(_, n)| !names.iter().any(|m| m == n) && out.join(n).is_file())
        })
        .map(str::to_string)
        .collect();
    if !names.is_empty() {
        let sums = Command::new("sha256sum")
            .current_dir(out)
            .arg("--")
            .args(&names)
            .output()
            .context("running sha256sum")?;
        ensure!(sums.status.success(), "sha256sum failed: {sums:?}");
        lines.extend(String::from_utf8(sums.stdout)?.lines().map(str::to_string));
    }
    lines.sort_by_key(|l| l.split_once("  ").map(|(_, n)| n.to_string()));
    fs::write(
        &path,
        lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
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
        .context("no build for this machine's architecture (--arch host builds it)")?;
    let (tarball, deb) = (&native.tarball, &native.deb);
    for b in built {
        lintian(&b.deb)?;
    }
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
# Debian policy's metadata, and every installed file as md5sums lists it.
test -f /usr/share/doc/gpu-trace/copyright
gzip -t /usr/share/doc/gpu-trace/changelog.Debian.gz
dpkg --verify gpu-trace
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;
    use gpu_trace_core::skip::skipped;

    /// A fresh scratch directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-dist-{name}-{}", std::process::id()));
        if dir.exists() {
            fs::remove_dir_all(&dir).unwrap();
        }
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn stdout(cmd: &mut Command) -> String {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    /// The package's Maintainer is a real address; the check refuses the placeholders it had
    /// (a reserved `.example` domain) and the other reserved names.
    #[test]
    fn the_maintainer_is_a_real_address() {
        let cargo = fs::read_to_string(workspace_root().join("gpu-trace/Cargo.toml")).unwrap();
        assert_eq!(
            deb_maintainer(&cargo).unwrap(),
            "gpu-trace developers <gpu-trace@users.noreply.github.com>"
        );
        let with =
            |m: &str| deb_maintainer(&format!("[package.metadata.deb]\nmaintainer = \"{m}\"\n"));
        for bad in [
            "gpu-trace maintainers <maintainers@users.noreply.a-seed-1f7ffee1.example>",
            "x <a@example.com>",
            "x <a@mail.example.org>",
            "x <a@localhost>",
            "x <a@host.test>",
            "x <a@host.invalid>",
            "x <nobody>",
            "no address",
        ] {
            assert!(with(bad).is_err(), "{bad}");
        }
        assert!(with("Jo Doe <jo@debian.org>").is_ok());
    }
    #[test]
    fn arch_host_builds_only_this_machines_target() {
        let cli =
            crate::Cli::try_parse_from(["xtask", "dist", "--arch", "host", "--check"]).unwrap();
        let crate::Task::Dist(args) = cli.task else {
            panic!("not dist")
        };
        let targets = args.arch.targets().unwrap();
        assert_eq!(targets.len(), 1);
        assert!(targets[0].triple.starts_with(std::env::consts::ARCH));
        // The default is still both, and the Debian names are accepted.
        let cli = crate::Cli::try_parse_from(["xtask", "dist"]).unwrap();
        let crate::Task::Dist(args) = cli.task else {
            panic!("not dist")
        };
        assert_eq!(args.arch.targets().unwrap().len(), TARGETS.len());
        for (name, triple) in [("arm64", "aarch64-"), ("x86_64", "x86_64-")] {
            let targets = crate::Cli::try_parse_from(["xtask", "dist", "--arch", name]).unwrap();
            let crate::Task::Dist(args) = targets.task else {
                panic!("not dist")
            };
            assert!(args.arch.targets().unwrap()[0].triple.starts_with(triple));
        }
    }

    /// The .deb as `dist` builds it (a stand-in for the static binary, which takes minutes to
    /// build: a C program built here, with its symbols; the packaging is what is checked), read back with
    /// dpkg-deb.
    #[test]
    fn deb_carries_debian_policy_metadata() {
        if !have("dpkg-deb") {
            skipped(
                "deb_carries_debian_policy_metadata",
                "dpkg-deb is not installed (a Debian machine has it)",
            );
            return;
        }
        let dir = scratch("deb");
        let bin = dir.join("gpu-trace");
        let source = dir.join("main.c");
        fs::write(&source, "int main(void) { return 0; }\n").unwrap();
        stdout(Command::new("cc").arg("-o").arg(&bin).arg(&source));
        assert!(symbol_table(&bin), "the stand-in has symbols to strip");
        let generated = crate::r#gen::generate(&dir.join("gen")).unwrap();
        let deb = deb(
            &dir,
            &dir.join("stage"),
            &bin,
            &generated,
            "0.1.0",
            &TARGETS[0],
        )
        .unwrap();
        assert_eq!(deb.file_name().unwrap(), "gpu-trace_0.1.0-1_amd64.deb");

        let info = stdout(Command::new("dpkg-deb").arg("-I").arg(&deb));
        let cargo = fs::read_to_string(workspace_root().join("gpu-trace/Cargo.toml")).unwrap();
        let maintainer = deb_maintainer(&cargo).unwrap();
        assert!(
            info.contains(&format!(" Maintainer: {maintainer}\n")),
            "{info}"
        );
        assert!(!info.contains("@localhost"), "{info}");
        assert!(info.contains(" Version: 0.1.0-1\n"), "{info}");

        let files = stdout(Command::new("dpkg-deb").arg("-c").arg(&deb));
        for f in ["copyright", "changelog.Debian.gz", "README.md"] {
            assert!(
                files.contains(&format!(" ./usr/share/doc/gpu-trace/{f}\n")),
                "{f} missing:\n{files}"
            );
        }
        let root = dir.join("root");
        stdout(Command::new("dpkg-deb").arg("-R").arg(&deb).arg(&root));
        let doc = root.join("usr/share/doc/gpu-trace");

        // copyright: DEP-5, every licence of the Files paragraph spelled out in a paragraph.
        let copyright = fs::read_to_string(doc.join("copyright")).unwrap();
        assert!(copyright.starts_with(
            "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
        ));
        assert!(copyright.contains(&format!("\nUpstream-Contact: {maintainer}\n")));
        for placeholder in ["@YEAR@", "@LICENSE@", "@MAINTAINER@"] {
            assert!(!copyright.contains(placeholder), "{placeholder} left in");
        }
        let files_license = copyright
            .split("\n\n")
            .find(|p| p.starts_with("Files: *"))
            .and_then(|p| p.lines().find_map(|l| l.strip_prefix("License: ")))
            .expect("a Files: * paragraph with a License");
        assert_eq!(files_license, "Expat or Apache-2.0");
        for name in files_license.split(" or ") {
            assert!(
                copyright.contains(&format!("\n\nLicense: {name}\n ")),
                "no standalone License: {name} paragraph"
            );
        }

        // changelog.Debian.gz: gzip -9n (no name, no time stamp), a Debian changelog entry.
        let gz = fs::read(doc.join("changelog.Debian.gz")).unwrap();
        assert_eq!(&gz[..2], b"\x1f\x8b");
        assert_eq!(gz[3] & 0x08, 0, "the gzip header holds a file name");
        assert_eq!(
            &gz[4..8],
            &[0, 0, 0, 0],
            "the gzip header holds a time stamp"
        );
        let changelog = stdout(
            Command::new("gzip")
                .arg("-dc")
                .arg(doc.join("changelog.Debian.gz")),
        );
        assert!(
            changelog.starts_with("gpu-trace (0.1.0-1) unstable; urgency=medium\n\n  * "),
            "{changelog}"
        );
        // Debian's changelog lines stay within 80 columns (lintian: debian-changelog-line-too-long).
        for line in changelog.lines() {
            assert!(
                line.chars().count() <= 80 || line.starts_with(" -- "),
                "{line:?}"
            );
        }
        let trailer = changelog.lines().last().unwrap();
        let date = trailer
            .strip_prefix(&format!(" -- {maintainer}  "))
            .unwrap_or_else(|| panic!("trailer {trailer:?}"));
        // RFC 2822, as `date -R` writes it: "Thu, 26 Nov 2026 23:20:34 +0000".
        let parts: Vec<&str> = date.split(' ').collect();
        assert!(
            parts.len() == 6 && parts[0].ends_with(',') && parts[5].len() == 5,
            "{date}"
        );

        // Every relative link of the installed README resolves to an installed file.
        let readme = fs::read_to_string(doc.join("README.md")).unwrap();
        let links = relative_links(&readme);
        assert!(links.iter().any(|l| l == "docs/install.md"), "{links:?}");
        for link in links {
            assert!(
                doc.join(&link).exists(),
                "README.md links to {link}, not installed"
            );
        }

        // Stripped (policy 10.1), and lintian's overrides installed where lintian reads them.
        assert!(
            !symbol_table(&root.join("usr/bin/gpu-trace")),
            "not stripped"
        );
        let overrides =
            fs::read_to_string(root.join("usr/share/lintian/overrides/gpu-trace")).unwrap();
        assert_eq!(overrides, LINTIAN_OVERRIDES);

        // DEBIAN/md5sums lists every file and matches.
        let sums = fs::read_to_string(root.join("DEBIAN/md5sums")).unwrap();
        assert!(sums.contains("  usr/bin/gpu-trace\n"));
        stdout(
            Command::new("md5sum")
                .current_dir(&root)
                .args(["--quiet", "-c", "DEBIAN/md5sums"]),
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// Whether the ELF file `path` has a symbol table (`readelf -S` lists `.symtab`).
    fn symbol_table(path: &Path) -> bool {
        stdout(Command::new("readelf").arg("-SW").arg(path)).contains(".symtab")
    }

    /// A README linking to a directory installs the directory's files; a link out of the tree
    /// or to nothing stops the build with what to fix.
    #[test]
    fn readme_links_to_directories_bring_their_files() {
        let dir = scratch("links");
        fs::create_dir_all(dir.join("docs/shots")).unwrap();
        fs::write(dir.join("docs/a.md"), "a").unwrap();
        fs::write(dir.join("docs/shots/top.txt"), "t").unwrap();
        let readme = |text: &str| fs::write(dir.join("README.md"), text).unwrap();
        readme("[a](docs/a.md#x) [s](docs/shots/) [web](https://x.invalid/) [me](#top)");
        let docs = readme_documents(&dir).unwrap();
        let want = ["README.md", "docs/a.md", "docs/shots/top.txt"].map(PathBuf::from);
        assert_eq!(docs, want);
        readme("[up](../etc/passwd)");
        assert!(
            readme_documents(&dir)
                .unwrap_err()
                .to_string()
                .contains("outside")
        );
        readme("[gone](docs/b.md)");
        assert!(
            readme_documents(&dir)
                .unwrap_err()
                .to_string()
                .contains("does not exist")
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn checksums_file_is_what_sha256sum_checks() {
        let dir = scratch("sums");
        let (a, b) = (dir.join("a.deb"), dir.join("b.tar.gz"));
        fs::write(&a, "one").unwrap();
        fs::write(&b, "two").unwrap();
        let sums = record_checksums(&dir, &[a.clone(), b.clone()]).unwrap();
        let check = || {
            Command::new("sha256sum")
                .current_dir(&dir)
                .args(["--strict", "-c", "SHA256SUMS"])
                .output()
                .unwrap()
                .status
                .success()
        };
        assert!(check());
        // A file changed and recorded again: its line is replaced, the other kept.
        fs::write(&a, "changed").unwrap();
        assert!(!check(), "sha256sum -c must see the change");
        record_checksums(&dir, std::slice::from_ref(&a)).unwrap();
        assert!(check());
        let text = fs::read_to_string(&sums).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        // A file gone: its line goes at the next write (the image's, say).
        fs::remove_file(&b).unwrap();
        let c = dir.join("c.oci.tar");
        fs::write(&c, "three").unwrap();
        record_checksums(&dir, std::slice::from_ref(&c)).unwrap();
        assert!(check());
        let text = fs::read_to_string(&sums).unwrap();
        assert!(
            text.ends_with("  c.oci.tar\n") && !text.contains("b.tar.gz"),
            "{text}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    /// `cargo xtask ...` command lines in a text: from `cargo xtask` to the end of the line,
    /// a backtick, a `)`, or a shell separator.
    fn xtask_commands(text: &str) -> Vec<Vec<String>> {
        let mut commands = Vec::new();
        for line in text.lines() {
            let mut rest = line;
            while let Some(at) = rest.find("cargo xtask ") {
                rest = &rest[at + "cargo xtask ".len()..];
                let end = rest
                    .find(['`', ')', '|', ';', '&', '#'])
                    .unwrap_or(rest.len());
                let mut words = vec!["xtask".to_string()];
                words.extend(rest[..end].split_whitespace().map(str::to_string));
                commands.push(words);
            }
        }
        commands
    }

    /// Every `cargo xtask` command the release pipeline runs, and the ones the files about
    /// installing and deploying tell the reader to run, are commands xtask accepts (the
    /// Containerfile named a `cargo xtask image` that never existed).
    #[test]
    fn release_workflow_runs_only_real_xtask_commands() {
        let root = workspace_root();
        let workflow = root.join(".github/workflows/release.yml");
        // The workflow parses as YAML (BaseLoader: `on` stays a key, not a boolean).
        let parsed = Command::new("python3")
            .args([
                "-c",
                "import json, sys, yaml; d = yaml.load(open(sys.argv[1]), Loader=yaml.BaseLoader); \
                 json.dump(d, sys.stdout)",
            ])
            .arg(&workflow)
            .output()
            .unwrap();
        if !parsed.status.success()
            && String::from_utf8_lossy(&parsed.stderr).contains("No module named")
        {
            skipped(
                "release_workflow_runs_only_real_xtask_commands",
                "python3 has no PyYAML (apt-get install python3-yaml)",
            );
            return;
        }
        assert!(parsed.status.success(), "{parsed:?}");
        let w: serde_json::Value = serde_json::from_slice(&parsed.stdout).unwrap();
        assert_eq!(w["on"]["push"]["tags"][0], "v*");
        let steps = w["jobs"]["release"]["steps"].as_array().unwrap();
        let runs: String = steps
            .iter()
            .filter_map(|s| s["run"].as_str())
            .map(|r| format!("{r}\n"))
            .collect();
        let commands = xtask_commands(&runs);
        let tasks: Vec<&str> = commands.iter().map(|c| c[1].as_str()).collect();
        assert_eq!(tasks, ["dist", "fleet"], "{commands:?}");
        let mut checked = 0;
        for file in [
            ".github/workflows/release.yml",
            "Containerfile",
            "deploy/daemonset.yaml",
            "deploy/daemonset-flight-recorder.yaml",
            "deploy/podmonitor.yaml",
            "docs/install.md",
            "docs/fleet.md",
            "CONTRIBUTING.md",
        ] {
            let text = fs::read_to_string(root.join(file)).unwrap();
            // (`cargo xtask …` is a placeholder, not a command.)
            for command in xtask_commands(&text).into_iter().filter(|c| c[1] != "…") {
                if let Err(e) = crate::Cli::try_parse_from(&command) {
                    panic!(
                        "{file}: `cargo {}` is not an xtask command:\n{e}",
                        command.join(" ")
                    );
                }
                checked += 1;
            }
        }
        assert!(checked >= 5, "{checked}");
        // What the release attaches is what dist and fleet write.
        let uploads = steps
            .iter()
            .find_map(|s| s["with"]["files"].as_str())
            .expect("a step attaching files");
        for pattern in ["*.deb", "*.tar.gz", "*.oci.tar", "SHA256SUMS"] {
            assert!(
                uploads.contains(&format!("target/dist/{pattern}")),
                "{uploads}"
            );
        }
    }
}
