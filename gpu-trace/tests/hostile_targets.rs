//! A traced process must not decide what the root tracer opens, reads, prints or waits for
//! (docs/reliability.md, "Threat model"). Each test builds a hostile target
//! (tests/api/hostile_target.c): it maps a file the tracer parses, chroots into a directory
//! whose `/etc/ld.so.preload` the test planted — an absolute symlink to a secret file of this
//! machine, a FIFO, a device node — and waits. The expectations come from what the test
//! planted (the secret's random token must never appear; a FIFO must not block), and the
//! memory bound from the kernel's own accounting of the tracer process (`wait4`'s
//! `ru_maxrss`), never from gpu-trace's output about itself.
//!
//! Without root or a C compiler the tests print `SKIPPED: <why>` and return.

use std::io::{BufRead as _, BufReader, Read as _};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod api_support;
mod common;
use api_support::{c_compiler, cc, hip_runtime, uprobes};
use common::skipped;

/// The bound on the tracer's peak RSS with a hostile file in play: the per-file read budget
/// (64 MiB, docs/reliability.md) plus the process's own (~30 MiB), with room.
const RSS_BOUND_KIB: i64 = 160 * 1024;
/// Liveness bound: a run that has not ended by then is taken to hang.
const HANG: Duration = Duration::from_secs(60);

/// Kills the process when the test ends, passed or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The built target, its root directory (to plant in) and a secret file outside that root.
struct Lab {
    _dir: tempfile::TempDir,
    dir: PathBuf,
    target: PathBuf,
    root: PathBuf,
    secret: PathBuf,
    token: String,
}

fn lab(test: &str) -> Option<Lab> {
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        skipped(
            test,
            "needs root (chroot, and reading another process's root)",
        );
        return None;
    }
    if !c_compiler(test) {
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    let target = cc(&dir, "hostile_target.c", "hostile_target", &["-ldl"]);
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let token = format!(
        "SECRET-{}-{:x}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ 0x5eed
    );
    let secret = dir.join("secret");
    std::fs::write(&secret, format!("root:{token}:19000:0:99999:7:::\n")).unwrap();
    Some(Lab {
        _dir: tmp,
        dir,
        target,
        root,
        secret,
        token,
    })
}

impl Lab {
    /// The target with `elf` mapped and `lib` loaded, chrooted, once it said "ready".
    fn start(&self, elf: Option<&Path>, lib: Option<&Path>) -> Reaped {
        let mut cmd = Command::new(&self.target);
        cmd.arg(&self.root);
        cmd.arg(elf.map_or(PathBuf::new(), Path::to_path_buf));
        if let Some(lib) = lib {
            cmd.arg(lib);
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        api_support::wait_ready(&mut child);
        Reaped(child)
    }

    fn plant_preload(&self, make: impl FnOnce(&Path)) {
        let at = self.root.join("etc/ld.so.preload");
        let _ = std::fs::remove_file(&at);
        make(&at);
    }

    /// A 2 GiB sparse copy of a real shared object whose `.dynsym` claims the whole file.
    fn sparse_elf(&self) -> PathBuf {
        let so = cc(&self.dir, "shim_stub.c", "stub.so", &["-shared", "-fPIC"]);
        let mut bytes = std::fs::read(&so).unwrap();
        let u16_at = |b: &[u8], o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let (shoff, shnum) = (u64_at(&bytes, 0x28) as usize, u16_at(&bytes, 0x3c) as usize);
        const LEN: u64 = 2 << 30;
        let mut patched = false;
        for i in 0..shnum {
            let sh = shoff + i * 64;
            if u32::from_le_bytes(bytes[sh + 4..sh + 8].try_into().unwrap()) == 11 {
                let off = u64_at(&bytes, sh + 24);
                let size = (LEN - off - 4096) / 24 * 24;
                bytes[sh + 32..sh + 40].copy_from_slice(&size.to_le_bytes());
                patched = true;
            }
        }
        assert!(patched, "the stub has a .dynsym");
        let out = self.dir.join("sparse.so");
        std::fs::write(&out, &bytes).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&out)
            .unwrap()
            .set_len(LEN)
            .unwrap();
        out
    }
}

fn mkfifo(at: &Path) {
    common::mkfifo(at, 0o644);
}

/// A device node 1:5 (what /dev/zero is) at `at`.
fn dev_zero(at: &Path) {
    let c = std::ffi::CString::new(at.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o644, libc::makedev(1, 5)) };
    assert_eq!(made, 0);
}

/// What a finished tracer run gave.
struct Ran {
    code: Option<i32>,
    out: String,
    err: String,
    max_rss_kib: i64,
}

/// Runs gpu-trace to its end (`HANG` at most), with its peak RSS from `wait4`. `signal`:
/// sent once stderr shows `when`.
fn run(args: &[&str], signal: Option<(&str, i32)>) -> Ran {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut stdout = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let when = signal.map(|(w, s)| (w.to_string(), s));
    let err = std::thread::spawn(move || {
        let mut all = String::new();
        for line in stderr.lines().map_while(Result::ok) {
            if let Some((w, sig)) = &when
                && line.contains(w.as_str())
            {
                // SAFETY: our own child, not reaped before this thread ends.
                unsafe { libc::kill(pid, *sig) };
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let started = Instant::now();
    let mut status = 0;
    // SAFETY: zeroed rusage is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: our own child; status and rusage are valid out-pointers.
        let r = unsafe { libc::wait4(pid, &raw mut status, libc::WNOHANG, &raw mut ru) };
        if r == pid {
            break;
        }
        if started.elapsed() > HANG {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let err = err.join().unwrap();
            panic!("gpu-trace {args:?} did not end within {HANG:?} (hangs): {err}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::mem::forget(child); // reaped above
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    Ran {
        code,
        out: out.join().unwrap(),
        err: err.join().unwrap(),
        max_rss_kib: ru.ru_maxrss,
    }
}

#[test]
fn an_absolute_symlink_in_the_targets_root_does_not_print_a_host_file() {
    let test = "an_absolute_symlink_in_the_targets_root_does_not_print_a_host_file";
    let Some(lab) = lab(test) else { return };
    lab.plant_preload(|at| symlink(&lab.secret, at).unwrap());
    // The same path inside the target's root holds a harmless entry: what it names is what
    // the target itself would load.
    let inside = lab.root.join(lab.secret.strip_prefix("/").unwrap());
    std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
    std::fs::write(&inside, "/inside/libinside.so\n").unwrap();
    let target = lab.start(None, None);
    let pid = target.0.id().to_string();
    for format in ["text", "json"] {
        let ran = run(
            &["api", "--resolve", "--format", format, "--pid", &pid],
            None,
        );
        assert_eq!(ran.code, Some(0), "{}", ran.err);
        for text in [&ran.out, &ran.err] {
            assert!(
                !text.contains(&lab.token),
                "the host's secret printed: {text}"
            );
        }
        assert!(
            ran.out.contains("/inside/libinside.so"),
            "the entry of the target's own file is read ({format}): {}",
            ran.out
        );
    }
}

#[test]
fn a_fifo_or_a_device_as_ld_so_preload_is_refused_at_once() {
    let test = "a_fifo_or_a_device_as_ld_so_preload_is_refused_at_once";
    let Some(lab) = lab(test) else { return };
    let target = lab.start(None, None);
    let pid = target.0.id().to_string();
    for (make, kind) in [
        (mkfifo as fn(&Path), "a FIFO"),
        (dev_zero as fn(&Path), "a character device"),
    ] {
        lab.plant_preload(make);
        let ran = run(&["api", "--resolve", "--pid", &pid], None);
        assert_eq!(ran.code, Some(0), "{}", ran.err);
        assert!(
            ran.err.contains("/etc/ld.so.preload") && ran.err.contains(kind),
            "one line says what was refused ({kind}): {}",
            ran.err
        );
        assert!(
            ran.max_rss_kib < RSS_BOUND_KIB,
            "{kind}: peak RSS {} KiB",
            ran.max_rss_kib
        );
    }
}

#[test]
fn a_sparse_elf_claiming_a_2_gib_symbol_table_is_read_within_the_budget() {
    let test = "a_sparse_elf_claiming_a_2_gib_symbol_table_is_read_within_the_budget";
    let Some(lab) = lab(test) else { return };
    let elf = lab.sparse_elf();
    let target = lab.start(Some(&elf), None);
    let pid = target.0.id().to_string();
    let ran = run(&["api", "--resolve", "--pid", &pid], None);
    assert_eq!(ran.code, Some(0), "{}", ran.err);
    assert!(
        ran.err.contains("sparse.so") && ran.err.contains("64 MiB read limit"),
        "one line says what was left out: {}",
        ran.err
    );
    assert!(
        ran.max_rss_kib < RSS_BOUND_KIB,
        "peak RSS {} KiB (the file claims 2 GiB)",
        ran.max_rss_kib
    );
}

#[test]
fn tracing_a_hostile_target_ends_on_sigint() {
    let test = "tracing_a_hostile_target_ends_on_sigint";
    let Some(lab) = lab(test) else { return };
    if !uprobes(test) {
        return;
    }
    let Some(hip) = hip_runtime() else {
        skipped(
            test,
            "Debian's HIP runtime (libamdhip64.so.5) is not installed: run scripts/setup.sh",
        );
        return;
    };
    let elf = lab.sparse_elf();
    lab.plant_preload(mkfifo);
    let target = lab.start(Some(&elf), Some(&hip));
    let pid = target.0.id().to_string();
    // gpu-trace api: its loop rescans the target each interval (the FIFO and the sparse file
    // read again); SIGINT once it says what it attached.
    let ran = run(
        &["api", "--pid", &pid, "--interval", "0.2"],
        Some(("uprobes attached", libc::SIGINT)),
    );
    // `gpu-trace api --pid` is ended by SIGINT as a matter of course: exit 0, its table out.
    assert_eq!(ran.code, Some(0), "ended by SIGINT: {}", ran.err);
    assert!(ran.err.contains("a FIFO"), "{}", ran.err);
    // What was left out is counted at the end: the FIFO and the sparse file's symbols.
    assert!(
        ran.err
            .contains("api: 2 file(s) or process(es) a target controls were left out"),
        "{}",
        ran.err
    );
    assert!(
        ran.max_rss_kib < RSS_BOUND_KIB,
        "peak RSS {} KiB",
        ran.max_rss_kib
    );
    // The main trace's --api: SIGTERM once it says tracing started (after the API layer's
    // attach; `-q` leaves out the line that says what it attached).
    let ran = run(
        &["--api", "--pid", &pid, "-q"],
        Some(("tracing NVIDIA RM calls", libc::SIGTERM)),
    );
    // The main trace is ended by SIGTERM as a matter of course (exit 0, statistics out).
    assert_eq!(ran.code, Some(0), "ended by SIGTERM: {}", ran.err);
    assert!(ran.err.contains("a FIFO"), "{}", ran.err);
    assert!(
        ran.max_rss_kib < RSS_BOUND_KIB,
        "peak RSS {} KiB",
        ran.max_rss_kib
    );
    for text in [&ran.out, &ran.err] {
        assert!(!text.contains(&lab.token));
    }
}

#[test]
fn a_probe_file_that_is_a_fifo_or_a_device_is_refused() {
    let test = "a_probe_file_that_is_a_fifo_or_a_device_is_refused";
    let Some(lab) = lab(test) else { return };
    let fifo = lab.dir.join("probes.fifo");
    mkfifo(&fifo);
    let own = std::process::id().to_string();
    for (file, kind) in [
        (fifo.to_str().unwrap(), "a FIFO"),
        ("/dev/zero", "a character device"),
    ] {
        let ran = run(
            &["api", "--resolve", "--probe-file", file, "--pid", &own],
            None,
        );
        assert_eq!(ran.code, Some(2), "a usage error: {}", ran.err);
        assert!(ran.err.contains(kind), "{}", ran.err);
        assert!(
            ran.max_rss_kib < RSS_BOUND_KIB,
            "peak RSS {} KiB",
            ran.max_rss_kib
        );
    }
}
