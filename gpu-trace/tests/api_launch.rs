//! `gpu-trace api -- CMD` traces the command from its first call, also when the command finds
//! its GPU library as the dynamic linker does beyond its cache: through `DT_RPATH` with
//! `$ORIGIN` (how CUDA wheels and vendored runtimes ship), `LD_LIBRARY_PATH` or `DT_RUNPATH`.
//! The library is examples/api/noop_lib.c (one function, `noop_fn`) and the command
//! examples/api/bench_noop.c, which calls it N times at once, without waiting: a probe attached
//! after exec (at a rescan) would miss the calls. The program prints its own count.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::skipped;

/// Compiles examples/api/`source` into `out` with `extra` flags.
fn cc(source: &str, out: &Path, extra: &[&str]) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/api")
        .join(source);
    let status = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc {}", src.display());
}

/// noop_fn's count in `gpu-trace api`'s final table (0 when it has no row).
fn counted(table: &str) -> u64 {
    table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("noop_fn"))
        .and_then(|l| l.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(0)
}

/// Builds libnoop.so in `dir/lib` and `dir/bench_noop` linked to it with `link` flags.
fn build(dir: &Path, link: &[&str]) -> Option<PathBuf> {
    std::fs::create_dir_all(dir.join("lib")).unwrap();
    cc(
        "noop_lib.c",
        &dir.join("lib/libnoop.so"),
        &["-shared", "-fPIC"],
    );
    let exe = dir.join("bench_noop");
    let libdir = dir.join("lib");
    let mut flags = vec!["-L", libdir.to_str()?, "-lnoop"];
    flags.extend_from_slice(link);
    cc("bench_noop.c", &exe, &flags);
    Some(exe)
}

/// Whether `test` cannot run here (said as a skip): it needs root, uprobes and a C compiler.
fn cannot_run(test: &str) -> bool {
    // SAFETY: no arguments.
    let why = if unsafe { libc::geteuid() } != 0 {
        "needs root (uprobes and BPF programs)"
    } else if !Path::new("/sys/bus/event_source/devices/uprobe").exists() {
        "the kernel has no uprobe PMU (CONFIG_UPROBE_EVENTS)"
    } else if Command::new("cc").arg("--version").output().is_err() {
        "no C compiler (cc)"
    } else {
        return false;
    };
    skipped(test, why);
    true
}

#[test]
fn api_launch_counts_every_call_of_a_library_found_by_rpath_ld_library_path_or_runpath() {
    let test =
        "api_launch_counts_every_call_of_a_library_found_by_rpath_ld_library_path_or_runpath";
    if cannot_run(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let lib = root.join("rp/lib");
    let cases: [(&str, Vec<String>, Option<&Path>); 3] = [
        // -rpath alone writes DT_RUNPATH on current toolchains; --disable-new-dtags DT_RPATH.
        (
            "rp",
            vec!["-Wl,--disable-new-dtags,-rpath,$ORIGIN/lib".into()],
            None,
        ),
        ("ldlp", vec![], Some(&lib)),
        (
            "runp",
            vec!["-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib".into()],
            None,
        ),
    ];
    for (name, link, ld_library_path) in cases {
        let dir = root.join(name);
        let link: Vec<&str> = link.iter().map(String::as_str).collect();
        let exe = build(&dir, &link).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-trace"));
        cmd.args(["api", "--probe", "libnoop.so:noop_fn", "--"])
            .arg(&exe)
            .args(["1000", "0"]);
        cmd.env_remove("LD_LIBRARY_PATH");
        if let Some(p) = ld_library_path {
            // The "ldlp" program has no search path of its own: the one built for "rp" is found.
            cmd.env("LD_LIBRARY_PATH", p);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{name}: {:?}\n{text}\n{err}",
            out.status
        );
        let own: u64 = text
            .split_whitespace()
            .find_map(|f| f.strip_prefix("calls=")?.parse().ok())
            .unwrap_or_else(|| panic!("{name}: the program printed no count\n{text}\n{err}"));
        assert_eq!(own, 1000, "{name}: {text}");
        assert_eq!(
            counted(&text),
            own,
            "{name}: every call from the first\n{text}\n{err}"
        );
    }
}

/// `gpu-trace api -o FILE -- CMD`: the command's standard output is its own (its one line,
/// nothing of the tracer's, however long either writes), and FILE holds the tracer's table,
/// which counts what the program says it called.
#[test]
fn api_output_file_leaves_the_commands_stdout_its_own() {
    let test = "api_output_file_leaves_the_commands_stdout_its_own";
    if cannot_run(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let exe = build(&root, &["-Wl,-rpath,$ORIGIN/lib"]).unwrap();
    let file = root.join("api.out");
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--probe", "libnoop.so:noop_fn", "-v", "-o"])
        .arg(&file)
        .arg("--")
        .arg(&exe)
        .args(["1000", "0"])
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{err}", out.status);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "stdout is the command's alone: {stdout:?}");
    let own: u64 = lines[0]
        .split_whitespace()
        .find_map(|f| f.strip_prefix("calls=")?.parse().ok())
        .unwrap_or_else(|| panic!("the program printed no count: {stdout}\n{err}"));
    assert_eq!(own, 1000);
    let written = std::fs::read_to_string(&file).unwrap();
    assert_eq!(
        counted(&written),
        own,
        "the table in -o FILE\n{written}\n{err}"
    );
    // -v: one API_CALL line per call, in the file too.
    assert_eq!(
        written.lines().filter(|l| l.contains("API_CALL")).count() as u64,
        own,
        "{err}"
    );
    assert!(
        !written.contains("calls="),
        "the command's line is not in the file"
    );

    // A file that cannot be written stops the run before the command starts.
    let marker = root.join("ran");
    let bad = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(["api", "--probe", "libnoop.so:noop_fn", "-o"])
        .arg(root.join("no-such-dir/out"))
        .args(["--", "touch"])
        .arg(&marker)
        .output()
        .unwrap();
    let bad_err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success(), "{bad_err}");
    assert!(
        bad_err.contains("-o ") && bad_err.contains("no-such-dir"),
        "{bad_err}"
    );
    assert!(
        !marker.exists(),
        "the command ran although -o could not be opened"
    );
}
