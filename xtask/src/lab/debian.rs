//! The lab's kernel: a Debian kernel package (and its headers) downloaded through a private apt
//! configuration, unpacked, indexed, and the `amdgpu` module chain picked out; the test modules
//! (`lab/modules/`) built against its headers.

use std::{
    fmt::Write as _,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::{arch::Arch, run_quiet};
use crate::host::{have, which};
use anyhow::{Context as _, Result, anyhow, bail, ensure};

pub(super) struct Kernel {
    /// `uname -r` of the guest, e.g. `6.12.117+deb12-amd64`, `6.12.117+deb12-arm64`.
    pub(super) release: String,
    pub(super) arch: Arch,
    /// `6.12`, `6.1`: which apt suites carry it.
    series: String,
    pub(super) vmlinuz: PathBuf,
    /// The kernel's configuration (`/boot/config-<release>`): the guest reads from it whether
    /// KFD was built (`CONFIG_HSA_AMD`).
    pub(super) config: PathBuf,
    /// The amdgpu chain, decompressed, in load order.
    pub(super) modules: Vec<PathBuf>,
}

/// A private apt configuration: its own sources, lists and archive cache under the lab cache,
/// so that the host's /etc/apt is neither read for sources nor changed.
struct Apt {
    dir: PathBuf,
    /// The guest's architecture; apt's lists then have its packages too (kbuild's host tools
    /// stay this machine's).
    arch: Arch,
}

impl Apt {
    fn new(cache: &Path, series: &str, arch: Arch, mirror: &str) -> Result<Self> {
        let (key_name, suites) = suites(series);
        let dir = if arch.is_host() {
            cache.join("apt").join(key_name)
        } else {
            cache.join("apt").join(format!("{key_name}-{}", arch.deb()))
        };
        for sub in ["lists/partial", "archives/partial", "sources.list.d"] {
            fs::create_dir_all(dir.join(sub))?;
        }
        let key = "/usr/share/keyrings/debian-archive-keyring.gpg";
        ensure!(
            Path::new(key).exists(),
            "{key} is missing: install debian-archive-keyring (the lab downloads Debian kernels)"
        );
        let mut list = String::new();
        for (archive, suite) in suites {
            writeln!(
                list,
                "deb [signed-by={key}] {mirror}/{archive} {suite} main"
            )?;
        }
        fs::write(dir.join("sources.list"), list)?;
        Ok(Self { dir, arch })
    }

    fn command(&self, tool: &str) -> Command {
        let mut cmd = Command::new(tool);
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        for opt in [
            format!("Dir::Etc::SourceList={}", d("sources.list")),
            format!("Dir::Etc::SourceParts={}", d("sources.list.d")),
            format!("Dir::State::Lists={}", d("lists")),
            format!("Dir::Cache={}", self.dir.display()),
            format!("Dir::Cache::Archives={}", d("archives")),
            "APT::Sandbox::User=root".to_string(),
        ] {
            cmd.args(["-o", &opt]);
        }
        if !self.arch.is_host() {
            cmd.args(["-o", &format!("APT::Architectures::={}", self.arch.deb())]);
        }
        cmd
    }

    /// `apt-get download` of the guest architecture's `package` into `dir`, unless a .deb of
    /// it is there already; returns the .deb.
    fn download(&self, dir: &Path, package: &str, guest: bool) -> Result<PathBuf> {
        if let Some(deb) = find_deb(dir, package)? {
            return Ok(deb);
        }
        self.update()?;
        let wanted = if guest && !self.arch.is_host() {
            format!("{package}:{}", self.arch.deb())
        } else {
            package.to_owned()
        };
        eprintln!("lab: apt-get download {wanted}");
        run_quiet(
            self.command("apt-get")
                .current_dir(dir)
                .args(["-q", "download", &wanted]),
        )?;
        find_deb(dir, package)?.ok_or_else(|| {
            anyhow!(
                "apt-get download {wanted} left no .deb in {}",
                dir.display()
            )
        })
    }

    /// `apt-get update` of the private lists, at most once a day.
    fn update(&self) -> Result<()> {
        let stamp = self.dir.join("updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() < Duration::from_secs(86_400));
        if !fresh {
            eprintln!(
                "lab: apt-get update (private lists in {})",
                self.dir.display()
            );
            run_quiet(self.command("apt-get").args(["-q", "update"]))?;
            fs::write(&stamp, b"")?;
        }
        Ok(())
    }

    fn package_names(&self, prefix: &str) -> Result<Vec<String>> {
        let out = run_quiet(self.command("apt-cache").args(["pkgnames", prefix]))?;
        Ok(out.lines().map(str::to_owned).collect())
    }
}

/// The series the lab knows by their Debian suites; any other (and `sid`) is looked up in sid.
const STABLE_SERIES: [&str; 3] = ["5.10", "6.1", "6.12"];

/// The apt sources of a kernel series: the name of its private apt directory and the
/// (archive, suite) pairs. 5.10: bullseye (Debian 11); 6.1: bookworm (Debian 12); 6.12:
/// bookworm-backports (and -security, where its updates land); anything else, `sid` included:
/// unstable, whose kernel is the newest Debian has.
fn suites(series: &str) -> (&'static str, Vec<(&'static str, &'static str)>) {
    match series {
        "5.10" => (
            "5.10",
            vec![
                ("debian", "bullseye"),
                ("debian-security", "bullseye-security"),
            ],
        ),
        "6.1" => (
            "6.1",
            vec![
                ("debian-security", "bookworm-security"),
                ("debian", "bookworm"),
            ],
        ),
        "6.12" => (
            "6.12",
            vec![
                ("debian-security", "bookworm-security"),
                ("debian", "bookworm-backports"),
            ],
        ),
        _ => ("sid", vec![("debian", "sid")]),
    }
}

/// The version part of `linux-image-<version>-<arch>-unsigned` (for sid also
/// `linux-image-<version>-<arch>`: sid has no `-unsigned` package any more, and QEMU boots the
/// signed image as well) when it belongs to `series`
/// (`6.12`, `6.1`, `5.10`; `sid`: any series newer than the stable ones), excluding the cloud
/// and rt flavours.
fn image_version<'a>(package: &'a str, series: &str, arch: Arch) -> Option<&'a str> {
    let v = package.strip_prefix("linux-image-")?;
    let v = match v.strip_suffix(&format!("-{}-unsigned", arch.deb())) {
        Some(v) => v,
        None if series == "sid" => v.strip_suffix(&format!("-{}", arch.deb()))?,
        None => return None,
    };
    let flavour_ok = !v.ends_with("-cloud") && !v.ends_with("-rt");
    if series == "sid" {
        let newest_stable = STABLE_SERIES.iter().map(|s| version_key(s)).max()?;
        let k = version_key(v);
        let ok = flavour_ok && k.len() >= 3 && k[..2] > newest_stable[..];
        return ok.then_some(v);
    }
    let rest = v.strip_prefix(series)?.strip_prefix('.')?;
    let ok = rest.chars().next().is_some_and(|c| c.is_ascii_digit()) && flavour_ok;
    ok.then_some(v)
}

/// Orders kernel versions by their numbers: 6.12.117+deb12 > 6.12.95+deb12, 6.1.0-47 > 6.1.0-9.
fn version_key(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect()
}

fn newest_version(packages: &[String], series: &str, arch: Arch) -> Option<String> {
    packages
        .iter()
        .filter_map(|p| image_version(p, series, arch))
        .max_by_key(|v| version_key(v))
        .map(str::to_owned)
}

/// An exact version has at least three numbers (`6.12.117+deb12`, `6.1.0-47`).
fn is_exact_version(v: &str) -> bool {
    version_key(v).len() >= 3
}

impl Kernel {
    pub(super) fn fetch(cache: &Path, wanted: &str, arch: Arch, mirror: &str) -> Result<Self> {
        let series = if is_exact_version(wanted) {
            let k = version_key(wanted);
            let s = format!("{}.{}", k[0], k[1]);
            if STABLE_SERIES.contains(&s.as_str()) {
                s
            } else {
                "sid".to_owned()
            }
        } else {
            wanted.to_owned()
        };
        let kernels = cache.join("kernels");
        let apt = Apt::new(cache, &series, arch, mirror)?;
        let deb = arch.deb();
        let version = if is_exact_version(wanted) {
            wanted.to_owned()
        } else {
            let resolved = apt.update().and_then(|()| {
                let names = apt.package_names("linux-image-")?;
                newest_version(&names, &series, arch)
                    .ok_or_else(|| anyhow!("no linux-image-{series}.*-{deb}-unsigned in the lists"))
            });
            match resolved {
                Ok(v) => v,
                Err(e) => {
                    // Offline: the newest kernel of the series already unpacked.
                    let cached: Vec<String> = fs::read_dir(&kernels)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .filter(|e| e.path().join("ready").exists())
                        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                        .filter_map(|r| r.strip_suffix(&format!("-{deb}")).map(str::to_owned))
                        .collect();
                    let names: Vec<String> = cached
                        .iter()
                        .map(|v| format!("linux-image-{v}-{deb}-unsigned"))
                        .collect();
                    let v = newest_version(&names, &series, arch).ok_or_else(|| {
                        e.context(format!(
                            "cannot resolve the newest Debian {series} kernel and none is cached; \
                             check the network (the lab needs {mirror}) or pass --kernel <exact version>"
                        ))
                    })?;
                    eprintln!("lab: apt unavailable, using the cached kernel {v}");
                    v
                }
            }
        };
        let release = format!("{version}-{deb}");
        let dir = kernels.join(&release);
        let ready = dir.join("ready");
        if !ready.exists() {
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir)?;
            // The unsigned image (one package). sid has none: its kernel is split into
            // linux-binary (vmlinuz), linux-modules and linux-base (config), which the signed
            // linux-image package only depends on.
            let unsigned = format!("linux-image-{version}-{deb}-unsigned");
            let split: Vec<String> = ["binary", "modules", "base"]
                .iter()
                .map(|part| format!("linux-{part}-{version}-{deb}"))
                .collect();
            let debs = cache.join("debs");
            fs::create_dir_all(&debs)?;
            let packages = if find_deb(&debs, &unsigned)?.is_some() || series != "sid" {
                vec![unsigned]
            } else if split
                .iter()
                .all(|p| find_deb(&debs, p).ok().flatten().is_some())
            {
                split
            } else {
                if is_exact_version(wanted) {
                    apt.update()?;
                }
                let names = apt.package_names("linux-")?;
                if names.contains(&unsigned) {
                    vec![unsigned]
                } else if split.iter().all(|p| names.contains(p)) {
                    split
                } else {
                    bail!("neither {unsigned} nor {split:?} is in the lists");
                }
            };
            let root = dir.join("root");
            for package in &packages {
                let deb = apt
                    .download(&debs, package, true)
                    .context("downloading the kernel package (never installed on this host)")?;
                eprintln!("lab: dpkg -x {}", deb.display());
                run_quiet(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
            }
            // Newer packages (sid's) put the modules under /usr/lib/modules only (merged /usr);
            // depmod and modprobe -d look in <root>/lib/modules.
            let usr_modules = root.join("usr/lib/modules");
            if !root.join("lib/modules").exists() && usr_modules.exists() {
                fs::create_dir_all(root.join("lib"))?;
                std::os::unix::fs::symlink(&usr_modules, root.join("lib/modules"))?;
            }
            eprintln!("lab: depmod -b (a few seconds per thousand modules)");
            run_quiet(Command::new("depmod").arg("-b").arg(&root).arg(&release))?;
            let deps = run_quiet(Command::new("modprobe").arg("-d").arg(&root).args([
                "-S",
                &release,
                "--show-depends",
                "amdgpu",
            ]))?;
            let lab_modules = dir.join("lab-modules");
            fs::create_dir_all(&lab_modules)?;
            let mut order = String::new();
            for (i, path) in deps
                .lines()
                .filter_map(|l| l.strip_prefix("insmod "))
                .enumerate()
            {
                let path = PathBuf::from(path.split_whitespace().next().unwrap_or_default());
                let file = path
                    .file_name()
                    .and_then(|f| f.to_str())
                    .unwrap_or_default();
                let (stem, tool) = match file {
                    f if f.ends_with(".ko.xz") => (&f[..f.len() - 3], Some("xz")),
                    f if f.ends_with(".ko.zst") => (&f[..f.len() - 4], Some("zstd")),
                    f => (f, None),
                };
                let name = format!("{:02}-{stem}", i + 1);
                let out = lab_modules.join(&name);
                match tool {
                    Some(tool) => {
                        let data = Command::new(tool).arg("-dc").arg(&path).output()?;
                        ensure!(
                            data.status.success(),
                            "{tool} -dc {} failed",
                            path.display()
                        );
                        fs::write(&out, data.stdout)?;
                    }
                    None => {
                        fs::copy(&path, &out)?;
                    }
                }
                writeln!(order, "{name}")?;
            }
            ensure!(
                order.contains("amdgpu.ko"),
                "modprobe --show-depends amdgpu gave no amdgpu.ko:\n{deps}"
            );
            fs::write(lab_modules.join("order"), &order)?;
            // Keep the vmlinuz, the chain and the config; drop the rest of the unpacked tree.
            // /boot/<file>-<release>; the split packages (sid) have /usr/lib/modules/<release>/<file>.
            for file in ["vmlinuz", "config"] {
                let from = [
                    root.join(format!("boot/{file}-{release}")),
                    root.join(format!("lib/modules/{release}/{file}")),
                ]
                .into_iter()
                .find(|p| p.exists())
                .ok_or_else(|| anyhow!("the kernel package has no {file} for {release}"))?;
                fs::copy(from, dir.join(file))?;
            }
            fs::remove_dir_all(&root)?;
            fs::write(&ready, b"")?;
        }
        let order = fs::read_to_string(dir.join("lab-modules/order"))?;
        Ok(Self {
            modules: order
                .lines()
                .map(|m| dir.join("lab-modules").join(m))
                .collect(),
            vmlinuz: dir.join("vmlinuz"),
            config: dir.join("config"),
            release,
            arch,
            series,
        })
    }

    /// The Debian package version part of the release: `6.12.117+deb12`.
    fn version(&self) -> &str {
        self.release
            .strip_suffix(&format!("-{}", self.arch.deb()))
            .unwrap_or(&self.release)
    }

    /// A static busybox for the guest: this machine's (checked static by the host tools) when
    /// the guest has its architecture, else Debian 12's `busybox-static` of the guest's
    /// architecture (bookworm: the 6.12 kernel's backports suite has no busybox), unpacked
    /// into the cache.
    pub(super) fn busybox(&self, cache: &Path, mirror: &str) -> Result<PathBuf> {
        if self.arch.is_host() {
            return which("busybox");
        }
        let dir = cache.join("busybox").join(self.arch.deb());
        let bin = dir.join("busybox");
        if bin.exists() {
            return Ok(bin);
        }
        fs::create_dir_all(&dir)?;
        let apt = Apt::new(cache, "6.1", self.arch, mirror)?;
        let deb = apt.download(&dir, "busybox-static", true)?;
        let root = dir.join("root");
        run_quiet(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
        fs::copy(root.join("bin/busybox"), &bin).context("busybox-static has no bin/busybox")?;
        fs::remove_dir_all(&root)?;
        Ok(bin)
    }

    /// Kernel headers for building test modules: `linux-headers-<ver>-amd64`, `-common` and the
    /// matching `linux-kbuild`, downloaded and unpacked like the image (never installed).
    /// Returns the directory to pass to `make -C`.
    pub(super) fn headers(&self, cache: &Path, mirror: &str) -> Result<PathBuf> {
        let base = cache.join("kernels").join(&self.release).join("headers");
        let tree = base.join(format!("usr/src/linux-headers-{}", self.release));
        if base.join("ready").exists() {
            return Ok(tree);
        }
        let _ = fs::remove_dir_all(&base);
        let apt = Apt::new(cache, &self.series, self.arch, mirror)?;
        apt.update()?;
        let v = self.version();
        let kbuild = apt.package_names("linux-kbuild-")?;
        // 6.12 names kbuild by the full version, 6.1 by the series.
        let kbuild = [
            format!("linux-kbuild-{v}"),
            format!("linux-kbuild-{}", self.series),
        ]
        .into_iter()
        .find(|k| kbuild.contains(k))
        .ok_or_else(|| anyhow!("no linux-kbuild package for {v} in the lists"))?;
        let common = format!("linux-headers-{v}-common");
        let debs = cache.join("debs");
        fs::create_dir_all(&debs)?;
        // The headers are the guest's architecture; -common is `all`; kbuild's tools run here,
        // so it is this machine's (a cross build: `make ARCH= CROSS_COMPILE=`).
        let packages = [
            (format!("linux-headers-{}", self.release), true),
            (common, false),
            (kbuild, false),
        ];
        for (package, guest) in &packages {
            let deb = apt.download(&debs, package, *guest)?;
            run_quiet(Command::new("dpkg").arg("-x").arg(&deb).arg(&base))?;
        }
        // The -amd64 Makefile includes the -common one by its installed, absolute path.
        let makefile = tree.join("Makefile");
        let text = fs::read_to_string(&makefile)?;
        let src = base.join("usr/src");
        fs::write(
            &makefile,
            text.replace("/usr/src/", &format!("{}/", src.display())),
        )?;
        wrap_newer_glibc_tools(&base, &apt)?;
        fs::write(base.join("ready"), b"")?;
        Ok(tree)
    }
}

/// Builds every test module under `lab/modules/<name>/` (a Kbuild file and sources) against the
/// lab kernel's headers, out of tree in the build directory. Returns the `.ko` files.
pub(super) fn build_test_modules(
    root: &Path,
    headers: &Path,
    build: &Path,
    arch: Arch,
) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let Ok(dirs) = fs::read_dir(root.join("lab/modules")) else {
        return Ok(out);
    };
    let mut dirs: Vec<PathBuf> = dirs
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut overrides = make_overrides(headers, arch);
    if !arch.is_host() {
        overrides.push(format!("ARCH={}", arch.kbuild()));
        overrides.push(format!("CROSS_COMPILE={}", arch.gnu_prefix()));
    }
    for src in dirs {
        let name = src
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let dir = build.join("modules").join(&name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        for f in fs::read_dir(&src)?.flatten() {
            fs::copy(f.path(), dir.join(f.file_name()))?;
        }
        eprintln!("lab: building test module {name} against the lab kernel's headers");
        let mut make = Command::new("make");
        make.args(&overrides);
        run_quiet(
            make.arg("-C")
                .arg(headers)
                .arg(format!("M={}", dir.display()))
                // Module BTF (pahole) where the headers ship vmlinux's BTF: Debian's 6.12 headers
                // do, 6.1's do not (Kbuild then skips it and says so). So nvlab's gpu_ext hook
                // stand-ins are reached by fentry on 6.12 and by kprobe on 6.1.
                .arg("modules"),
        )
        .with_context(|| {
            format!(
                "building lab/modules/{name} (needs make and the gcc the kernel was built with, \
                 e.g. gcc-12 for Debian 12's kernels)"
            )
        })?;
        let ko = dir.join(format!("{name}.ko"));
        ensure!(
            ko.exists(),
            "building lab/modules/{name} produced no {name}.ko"
        );
        out.push(ko);
    }
    Ok(out)
}

/// Kbuild's host tools (modpost, objtool, resolve_btfids, …) come built in the kernel's suite:
/// sid's need a newer glibc than this host's (`GLIBC_2.38' not found`). Those are run with the
/// suite's own libc6, unpacked beside them: each becomes `<tool>.suite`, and `<tool>` a script
/// that starts it with that libc's loader. Tools that run here are left alone.
fn wrap_newer_glibc_tools(base: &Path, apt: &Apt) -> Result<()> {
    let mut broken = Vec::new();
    let mut dirs = vec![base.join("usr/lib")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                dirs.push(path);
            } else if meta.is_file()
                && std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0
                && fs::read(&path).is_ok_and(|b| b.starts_with(b"\x7fELF"))
            {
                // Only a glibc too old for the tool is mended here (`version `GLIBC_2.38' not
                // found`): a tool missing another library (bullseye's sign-file wants
                // libcrypto.so.1.1) is not one the module build runs, and the suite's libc6
                // would not give it that library anyway.
                let ldd = Command::new("ldd").arg(&path).output()?;
                let said = format!(
                    "{}{}",
                    String::from_utf8_lossy(&ldd.stdout),
                    String::from_utf8_lossy(&ldd.stderr)
                );
                if said
                    .lines()
                    .any(|l| l.contains("GLIBC_") && l.contains("not found"))
                {
                    broken.push(path);
                }
            }
        }
    }
    if broken.is_empty() {
        return Ok(());
    }
    let libc = base.join("suite-libc");
    fs::create_dir_all(&libc)?;
    eprintln!(
        "lab: {} kbuild tools need a newer glibc than this host's: running them with the \
         suite's libc6",
        broken.len()
    );
    run_quiet(
        apt.command("apt-get")
            .current_dir(&libc)
            .args(["-q", "download", "libc6"]),
    )?;
    let deb =
        find_deb(&libc, "libc6")?.ok_or_else(|| anyhow!("apt-get download libc6 left no .deb"))?;
    run_quiet(
        Command::new("dpkg")
            .arg("-x")
            .arg(&deb)
            .arg(libc.join("root")),
    )?;
    let lib = libc.join("root/usr/lib/x86_64-linux-gnu");
    let loader = lib.join("ld-linux-x86-64.so.2");
    ensure!(loader.exists(), "libc6 has no {}", loader.display());
    for tool in broken {
        let real = PathBuf::from(format!("{}.suite", tool.display()));
        fs::rename(&tool, &real)?;
        fs::write(
            &tool,
            format!(
                "#!/bin/sh\nexec '{}' --library-path '{}' '{}' \"$@\"\n",
                loader.display(),
                lib.display(),
                real.display()
            ),
        )?;
        let mut perms = fs::metadata(&tool)?.permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        fs::set_permissions(&tool, perms)?;
    }
    Ok(())
}

/// The compiler for the test modules when the kernel's own is not installed here: Debian's
/// headers name it in `.kernelvariables` (`CC = … $(CROSS_COMPILE)gcc-12`; gcc-10 for bullseye's
/// 5.10, a newer one for sid). Then the newest `<arch>-linux-gnu-gcc-N` on PATH builds them (the
/// headers set `DEBIAN_KERNEL_NO_CC_VERSION_CHECK`). None: the headers' own choice.
fn module_compiler(headers: &Path, arch: Arch) -> Option<String> {
    let vars = fs::read_to_string(headers.join(".kernelvariables")).ok()?;
    let prefix = arch.gnu_prefix();
    let wanted = vars
        .lines()
        .filter(|l| l.trim_start().starts_with("CC ="))
        .find_map(|l| l.split_whitespace().last())?
        .replace("$(CROSS_COMPILE)", prefix);
    if have(&wanted) {
        return None;
    }
    let newest = (8..=30)
        .rev()
        .map(|n| format!("{prefix}gcc-{n}"))
        .find(|c| have(c))?;
    eprintln!("lab: the kernel was built with {wanted}, not installed here: using {newest}");
    Some(newest)
}

/// What `make` is told when this host's tools are older than the kernel's: the compiler
/// ([`module_compiler`]), then the configuration's claims about it undone where they would
/// pass it options it lacks (`-fmin-function-alignment`, gcc 14; sid's kernel is built with
/// gcc 16), and module BTF left out where the kernel's pahole was newer than 1.26 and this
/// one is older (Kbuild would pass `--btf_features`, which older pahole refuses).
fn make_overrides(headers: &Path, arch: Arch) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(cc) = module_compiler(headers, arch) {
        out.push(format!("CC={cc}"));
        out.push("CONFIG_CC_HAS_MIN_FUNCTION_ALIGNMENT=".into());
    }
    let conf = fs::read_to_string(headers.join("include/config/auto.conf")).unwrap_or_default();
    let kernel_pahole = conf
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_PAHOLE_VERSION="))
        .and_then(|v| v.trim().parse::<u32>().ok());
    let host_pahole = Command::new("pahole")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let v = String::from_utf8_lossy(&o.stdout)
                .trim()
                .trim_start_matches('v')
                .replace('.', "");
            v.parse::<u32>().ok()
        });
    if let (Some(k), Some(h)) = (kernel_pahole, host_pahole)
        && k >= 126
        && h < 126
    {
        eprintln!(
            "lab: the kernel's pahole was {k}, this host's is {h} (no --btf_features): the test \
             modules get no BTF"
        );
        out.push("CONFIG_DEBUG_INFO_BTF_MODULES=".into());
    }
    out
}

fn find_deb(dir: &Path, package: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("{package}_");
    Ok(fs::read_dir(dir)?.flatten().map(|e| e.path()).find(|p| {
        p.file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| f.starts_with(&prefix) && f.ends_with(".deb"))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_newest_generic_image_of_the_series() {
        let names: Vec<String> = [
            "linux-image-6.12.95+deb12-amd64-unsigned",
            "linux-image-6.12.117+deb12-amd64-unsigned",
            "linux-image-6.12.117+deb12-cloud-amd64-unsigned",
            "linux-image-6.12.117+deb12-rt-amd64-unsigned",
            "linux-image-6.12.9+deb12-amd64-unsigned",
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-47-amd64-unsigned",
            "linux-image-6.1.0-47-cloud-amd64-unsigned",
            "linux-image-6.12.200+deb12-amd64", // signed image: not this package
            "linux-image-6.12.119+deb12-arm64-unsigned",
            "linux-image-6.12.119+deb12-arm64-16k-unsigned",
            "linux-image-6.12.119+deb12-cloud-arm64-unsigned",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            newest_version(&names, "6.12", Arch::X86_64).as_deref(),
            Some("6.12.117+deb12")
        );
        assert_eq!(
            newest_version(&names, "6.1", Arch::X86_64).as_deref(),
            Some("6.1.0-47")
        );
        assert_eq!(newest_version(&names, "6.6", Arch::X86_64), None);
        // arm64's images by their own suffix (a newer arm64 build does not leak into amd64).
        assert_eq!(
            newest_version(&names, "6.12", Arch::Arm64).as_deref(),
            Some("6.12.119+deb12")
        );
        assert_eq!(newest_version(&names, "6.1", Arch::Arm64), None);
        assert!(is_exact_version("6.12.117+deb12") && is_exact_version("6.1.0-47"));
        assert!(!is_exact_version("6.12") && !is_exact_version("6.1"));
    }

    #[test]
    fn sid_is_the_newest_series_past_the_stable_ones_signed_or_not() {
        // sid's list (2026-11-25) has only signed images; bullseye's are unsigned.
        let names: Vec<String> = [
            "linux-image-7.2.13+deb14-amd64",
            "linux-image-7.2.13+deb14-cloud-amd64",
            "linux-image-7.2.13+deb14-rt-amd64",
            "linux-image-7.2.13+deb14-amd64-dbg",
            "linux-image-amd64",
            "linux-image-6.12.117+deb12-amd64-unsigned",
            "linux-image-5.10.0-46-amd64-unsigned",
            "linux-image-5.10.0-9-amd64-unsigned",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            newest_version(&names, "sid", Arch::X86_64).as_deref(),
            Some("7.2.13+deb14")
        );
        assert_eq!(
            newest_version(&names, "5.10", Arch::X86_64).as_deref(),
            Some("5.10.0-46")
        );
        assert_eq!(suites("5.10").0, "5.10");
        assert_eq!(suites("7.2").0, "sid");
        assert_eq!(suites("sid").1, [("debian", "sid")]);
    }
}
