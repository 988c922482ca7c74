//! What the API layer's tests share: Debian's HIP runtime as the dynamic linker finds it, and
//! the test programs under tests/api/ compiled with `cc`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub const HIP: &str = "libamdhip64.so.5";

/// The HIP runtime's file as the dynamic linker finds it (`None`: not installed).
pub fn hip_runtime() -> Option<PathBuf> {
    // ldconfig is in /sbin, which a user's PATH may lack.
    let out = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|l| Command::new(l).arg("-p").output().ok())?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{HIP} ")))
        .and_then(|l| l.rsplit(" => ").next())
        .map(|p| std::fs::canonicalize(p.trim()).unwrap())
}

/// Compiles tests/api/`source` into `dir`/`out` with `extra` flags.
pub fn cc(dir: &Path, source: &str, out: &str, extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/api")
        .join(source);
    let out = dir.join(out);
    let status = Command::new("cc")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc {}", src.display());
    out
}

/// Waits for a test program's first line, which must start with "ready" (it has made its
/// set-up calls, or is set up to be attacked).
pub fn wait_ready(child: &mut std::process::Child) {
    use std::io::BufRead as _;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("a piped stdout"))
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("ready"),
        "the program said {line:?}: {:?}",
        child.try_wait()
    );
}

/// Whether uprobes can be attached here (root, the kernel's uprobe PMU); SKIPPED otherwise.
pub fn uprobes(test: &str) -> bool {
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } != 0 {
        crate::common::skipped(test, "needs root (uprobes and BPF programs)");
        return false;
    }
    if !Path::new("/sys/bus/event_source/devices/uprobe").exists() {
        crate::common::skipped(test, "the kernel has no uprobe PMU (CONFIG_UPROBE_EVENTS)");
        return false;
    }
    true
}

/// Whether a C compiler (`cc`) runs here; SKIPPED otherwise.
pub fn c_compiler(test: &str) -> bool {
    let found = Command::new("cc").arg("--version").output().is_ok();
    if !found {
        crate::common::skipped(test, "no C compiler (cc)");
    }
    found
}

/// The HIP runtime's path and an empty directory (and its canonical path) to build the test
/// programs in; `None`, after SKIPPED, without the runtime or a C compiler.
pub fn toolchain(test: &str) -> Option<(PathBuf, tempfile::TempDir, PathBuf)> {
    let Some(hip) = hip_runtime() else {
        crate::common::skipped(
            test,
            format!("Debian's HIP runtime ({HIP}) is not installed: run scripts/setup.sh"),
        );
        return None;
    };
    if !c_compiler(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    Some((hip, dir, root))
}

/// The stand-in `libcuda.so.1` (tests/api/fake_cuda.c: its calls issue RM-shaped schedules on
/// the watched device; `cuda_flags` for it, e.g. `-DRECURSE=N`) and `libcudart.so.12`
/// (fake_cudart.c) built in a new directory, with each `(source, name)` of `clients` (under
/// tests/api) linked to both (DT_NEEDED, RPATH); the directory and its canonical path. `None`,
/// after SKIPPED, where the test cannot run here.
pub fn fake_cuda(
    test: &str,
    cuda_flags: &[&str],
    clients: &[(&str, &str)],
) -> Option<(tempfile::TempDir, PathBuf)> {
    if !uprobes(test) || !c_compiler(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let lib_dir = format!("-L{}", root.display());
    let rpath = format!("-Wl,-rpath,{}", root.display());
    let shared = ["-shared", "-fPIC"];
    cc(
        &root,
        "fake_cuda.c",
        "libcuda.so.1",
        &[&shared, cuda_flags].concat(),
    );
    let cuda = [&shared[..], &[&lib_dir, "-l:libcuda.so.1"]].concat();
    cc(&root, "fake_cudart.c", "libcudart.so.12", &cuda);
    let both = [&lib_dir, "-l:libcuda.so.1", "-l:libcudart.so.12", &rpath];
    for (source, name) in clients {
        cc(&root, source, name, &both);
    }
    Some((dir, root))
}

/// The probes a client of the stand-in libraries (`fake_cuda`) gets: three symbols (`cuInit`,
/// `cuCtxCreate_v4`, `cudaMalloc`), entry and return each, its dynamic linker's
/// `_dl_debug_state` (libraries loaded later, docs/api.md), and an entry probe on each distinct
/// `dlsym`/`dlvsym` function of its libc (the lookups, docs/api.md), counted here from
/// `nm -D` of the libc the dynamic linker finds.
pub fn probes_per_client() -> usize {
    7 + libc_lookups()
}

/// Distinct addresses of `dlsym` and `dlvsym` in the libc `ldconfig -p` names (versions of one
/// function share an address).
pub fn libc_lookups() -> usize {
    let out = ["ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"]
        .iter()
        .find_map(|l| Command::new(l).arg("-p").output().ok())
        .expect("ldconfig -p");
    let listing = String::from_utf8_lossy(&out.stdout).into_owned();
    let libc = listing
        .lines()
        .find(|l| l.trim_start().starts_with("libc.so.6 "))
        .and_then(|l| l.rsplit(" => ").next())
        .map(|p| p.trim().to_string())
        .expect("libc.so.6 in ldconfig -p");
    let nm = Command::new("nm")
        .args(["-D", "--defined-only", &libc])
        .output()
        .expect("nm");
    let mut addrs: Vec<String> = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (addr, kind, name) = (f.next()?, f.next()?, f.next()?);
            let name = name.split('@').next()?;
            (matches!(kind, "T" | "W" | "i") && (name == "dlsym" || name == "dlvsym"))
                .then(|| addr.to_string())
        })
        .collect();
    addrs.sort();
    addrs.dedup();
    addrs.len()
}

/// The uprobes process `pid` holds, from its BPF links' `fdinfo`: a link of type `perf` is one
/// uprobe; a batched link (`uprobe_multi`, `uretprobe_multi`) holds `uprobe_cnt` of them (the
/// main trace's own hooks are `tracing` or `raw_tracepoint` links, not counted).
pub fn bpf_links(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return 0;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy() == "anon_inode:bpf_link")
        })
        .filter_map(|e| {
            std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                e.file_name().to_string_lossy()
            ))
            .ok()
        })
        .map(|info| {
            let field = |name: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(":\t"))
                    .map(str::to_string)
            };
            match field("link_type").as_deref() {
                Some("perf") => 1,
                Some("uprobe_multi" | "uretprobe_multi") => field("uprobe_cnt")
                    .and_then(|n| n.parse().ok())
                    .expect("a batched link's fdinfo has uprobe_cnt"),
                _ => 0,
            }
        })
        .sum()
}

/// Waits (30 s at most, a liveness bound) until process `pid` holds exactly `n` uprobes (more
/// fails at once).
pub fn wait_links(pid: u32, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let held = bpf_links(pid);
        if held == n {
            return;
        }
        assert!(
            held < n,
            "gpu-trace {pid} holds {held} probes, more than {n}"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "gpu-trace {pid} holds {held} probes after 30 s, not {n}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
