//! `gpu-trace api --resolve` on Debian's real HIP runtime (`libamdhip64.so.5`, installed by
//! scripts/setup.sh): a C client (tests/api/client.c) calls hipInit and hipMalloc under three
//! shims this test builds with `cc` and preloads. The expected answers come from how the test
//! built the processes and from the dynamic linker itself (`LD_TRACE_LOADED_OBJECTS=1` lists
//! the link map in the order ld.so binds), never from gpu-trace's own output.
//!
//! Without the HIP runtime or a C compiler the tests print `SKIPPED: <why>` and return.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod api_support;
mod common;
use api_support::{cc, toolchain};
use common::skipped;

/// The client, the three shims and the HIP runtime's path; `None` (after SKIPPED) where they
/// cannot be built.
struct Built {
    _dir: tempfile::TempDir,
    client: PathBuf,
    shims: [PathBuf; 3],
    hip: PathBuf,
}

fn build(test: &str) -> Option<Built> {
    let (hip, dir, root) = toolchain(test)?;
    let client = cc(&root, "client.c", "client", &["-l:libamdhip64.so.5"]);
    let shims = ["shim_next", "shim_recursive", "shim_stub"].map(|s| {
        cc(
            &root,
            &format!("{s}.c"),
            &format!("{s}.so"),
            &["-shared", "-fPIC"],
        )
    });
    Some(Built {
        _dir: dir,
        client,
        shims,
        hip,
    })
}

/// Kills the process when the test ends, passed or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The client under `LD_PRELOAD=shim`, once it has made its calls.
fn client_under(b: &Built, shim: &Path) -> Reaped {
    let mut child = Command::new(&b.client)
        .env("LD_PRELOAD", shim)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    api_support::wait_ready(&mut child);
    Reaped(child)
}

fn gpu_trace(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
        .args(args)
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn resolve_json(pid: u32) -> Value {
    let (code, out, err) = gpu_trace(&[
        "api",
        "--resolve",
        "--format",
        "json",
        "--pid",
        &pid.to_string(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.lines().count(), 1, "one object per process: {out}");
    serde_json::from_str(&out).unwrap()
}

fn symbol<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["symbols"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["symbol"] == name)
        .unwrap_or_else(|| panic!("no {name} in {v}"))
}

fn dlsym_warned(v: &Value, lib: &Path) -> bool {
    v["warnings"].as_array().unwrap().iter().any(|w| {
        w["kind"] == "dlsym_interposer"
            && w["library"] == lib.to_str().unwrap()
            && w["symbols"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == "hipMalloc")
    })
}

/// The global scope in ld.so's own order: `LD_TRACE_LOADED_OBJECTS=1` prints the link map
/// (without running the program); the paths as /proc/PID/maps shows them (canonical).
fn ld_so_order(client: &Path, shim: &Path) -> Vec<PathBuf> {
    let out = Command::new(client)
        .env("LD_PRELOAD", shim)
        .env("LD_TRACE_LOADED_OBJECTS", "1")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.split_once(" => ").map_or(l, |(_, p)| p);
            let path = path.rsplit_once(" (0x").map_or(path, |(p, _)| p);
            path.starts_with('/')
                .then(|| std::fs::canonicalize(path).unwrap())
        })
        .collect()
}

#[test]
fn a_preloaded_shim_wins_hipmalloc_and_the_real_runtime_serves_the_rest() {
    let test = "a_preloaded_shim_wins_hipmalloc_and_the_real_runtime_serves_the_rest";
    let Some(b) = build(test) else { return };
    let [next, recursive, stub] = &b.shims;
    // A stripped shim keeps its dynamic symbol table: it still wins.
    let stripped = next.with_file_name("shim_next.stripped.so");
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg(next)
        .arg("-o")
        .arg(&stripped)
        .status();
    let mut shims = vec![(next, true), (recursive, true), (stub, false)];
    match status {
        Ok(s) if s.success() => shims.push((&stripped, true)),
        _ => skipped(test, "no `strip`: the stripped shim's case is left out"),
    }
    for (shim, imports_dlsym) in shims {
        let client = client_under(&b, shim);
        let v = resolve_json(client.0.id());
        let m = symbol(&v, "hipMalloc");
        assert_eq!(m["winner"], shim.to_str().unwrap(), "{shim:?}: {m}");
        assert_eq!(m["next"][0], b.hip.to_str().unwrap(), "{shim:?}: {m}");
        assert_eq!(m["real"], b.hip.to_str().unwrap());
        let i = symbol(&v, "hipInit");
        assert_eq!(i["winner"], b.hip.to_str().unwrap(), "{i}");
        assert_eq!(i["next"], Value::Array(vec![]), "{i}");
        assert_eq!(
            dlsym_warned(&v, shim),
            imports_dlsym,
            "{shim:?}: the dlsym warning is due exactly where the shim imports dlsym: {}",
            v["warnings"]
        );
        // The binding order is ld.so's: executable, the preload, DT_NEEDED breadth-first.
        let libs = v["libraries"].as_array().unwrap();
        assert_eq!(libs[0]["path"], b.client.to_str().unwrap());
        assert_eq!(libs[0]["origin"], "executable");
        assert_eq!(libs[1]["origin"], "preload");
        let ours: Vec<PathBuf> = libs[1..]
            .iter()
            .filter(|l| l["origin"] != "dlopen")
            .map(|l| PathBuf::from(l["path"].as_str().unwrap()))
            .collect();
        assert_eq!(ours, ld_so_order(&b.client, shim), "{shim:?}");
        // The text names the same winner.
        let (code, text, _) = gpu_trace(&["api", "--resolve", "--pid", &client.0.id().to_string()]);
        assert_eq!(code, Some(0));
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with("hipMalloc "))
            .unwrap();
        assert!(
            line.contains(&format!(
                "{} [LD_PRELOAD]; next: {}",
                shim.display(),
                b.hip.display()
            )),
            "{line}"
        );
    }
}

#[test]
fn a_shell_with_the_shim_preloaded_is_listed_as_a_leak() {
    let test = "a_shell_with_the_shim_preloaded_is_listed_as_a_leak";
    let Some(b) = build(test) else { return };
    let shim = &b.shims[0];
    let shell = |preload: bool| {
        let mut c = Command::new("bash");
        c.args(["-c", "sleep 30; true"]);
        if preload {
            c.env("LD_PRELOAD", shim);
        }
        Reaped(c.spawn().unwrap())
    };
    let leaky = shell(true);
    let clean = shell(false);
    // bash has started (its maps hold the shim) once the loader is done with it.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(format!("/proc/{}/maps", leaky.0.id()))
        .is_ok_and(|m| m.contains(shim.to_str().unwrap()))
    {
        assert!(Instant::now() < deadline, "bash never mapped the shim");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (code, out, err) = gpu_trace(&["api", "--resolve", "--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let objects: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let of = |pid: u32| objects.iter().find(|o| o["pid"] == pid);
    let leak = of(leaky.0.id()).expect("the preloaded bash maps a library defining hipMalloc");
    assert_eq!(leak["comm"], "bash");
    assert_eq!(leak["gpu_open"], false);
    assert!(
        leak["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| { w["kind"] == "preload_leak" && w["library"] == shim.to_str().unwrap() }),
        "{leak}"
    );
    assert!(
        of(clean.0.id()).is_none(),
        "a bash without the shim maps no GPU API library"
    );
    let (_, text, _) = gpu_trace(&["api", "--resolve"]);
    let summary = text
        .split("LD_PRELOAD leak: ")
        .nth(1)
        .expect("a leak summary");
    assert!(
        summary.contains(&format!("PID {} (bash): {}", leaky.0.id(), shim.display())),
        "{summary}"
    );
    assert!(!summary.contains(&format!("PID {} ", clean.0.id())));
}

#[test]
fn api_without_resolve_and_bad_targets_say_what_to_do() {
    // Tracing without a target: a usage error that names the choices.
    let (code, _, err) = gpu_trace(&["api"]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("give --pid, --comm, --cgroup, --container or `-- CMD`"),
        "{err}"
    );
    let (code, _, err) = gpu_trace(&["api", "--resolve", "--probe", "nocolon"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("is not LIB:SYMBOL"), "{err}");
    // A PID that no process has: the kernel's pid_max is at most 2^22.
    let (code, _, err) = gpu_trace(&["api", "--resolve", "--pid", "4194305"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("PID 4194305: no such process"), "{err}");
    // Not root: another user's process cannot be read, and the message says what to do.
    // SAFETY: no arguments.
    if unsafe { libc::geteuid() } == 0 {
        use std::os::unix::process::CommandExt as _;
        let out = Command::new(env!("CARGO_BIN_EXE_gpu-trace"))
            .args(["api", "--resolve", "--pid", &std::process::id().to_string()])
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("permission denied") && err.contains("run as root"),
            "{err}"
        );
    } else {
        skipped(
            "api_without_resolve_and_bad_targets_say_what_to_do",
            "not root: the unprivileged case is left out",
        );
    }
    // This test's own process maps no GPU API library: said, not an empty answer.
    let (code, out, _) = gpu_trace(&["api", "--resolve", "--pid", &std::process::id().to_string()]);
    assert_eq!(code, Some(0));
    assert!(out.contains("no GPU API library mapped"), "{out}");
}

/// Shims that bear the real library's name are resolved by the file they are, not by that
/// name (issue 39): (1) `shim_next.c` built as `…/byname/libamdhip64.so.5` and preloaded by
/// that path — the real runtime is mapped too, lower, and was taken for the preload; (2)
/// `shim_soname.c` with the soname `libamdhip64.so.5`, which satisfies the client's
/// `DT_NEEDED` itself and `dlopen`s the real runtime by path — the real one was put in the
/// global scope as needed. The oracle is ld.so's own link map (`LD_TRACE_LOADED_OBJECTS=1`).
#[test]
fn a_shim_with_the_real_librarys_name_is_resolved_by_the_file_it_is() {
    let test = "a_shim_with_the_real_librarys_name_is_resolved_by_the_file_it_is";
    let Some(b) = build(test) else { return };
    let root = b.client.parent().unwrap();
    let hip_name = b.hip.file_name().unwrap().to_str().unwrap().to_string();
    let mut cases = Vec::new();
    for (dir, source, extra) in [
        ("byname", "shim_next.c", vec!["-shared", "-fPIC"]),
        (
            "soname",
            "shim_soname.c",
            vec!["-shared", "-fPIC", "-Wl,-soname,libamdhip64.so.5"],
        ),
    ] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
        let out = format!("{dir}/libamdhip64.so.5");
        cases.push((dir, cc(root, source, &out, &extra)));
    }
    for (case, shim) in &cases {
        let mut child = Command::new(&b.client)
            .env("LD_PRELOAD", shim)
            .env("GT_REAL_HIP", &b.hip)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        api_support::wait_ready(&mut child);
        let client = Reaped(child);
        let v = resolve_json(client.0.id());
        let libs = v["libraries"].as_array().unwrap();
        let origin_of = |p: &Path| {
            libs.iter()
                .find(|l| l["path"] == p.to_str().unwrap())
                .map(|l| l["origin"].as_str().unwrap().to_string())
        };
        assert_eq!(origin_of(shim).as_deref(), Some("preload"), "{case}: {v}");
        let m = symbol(&v, "hipMalloc");
        assert_eq!(m["winner"], shim.to_str().unwrap(), "{case}: {m}");
        let ours: Vec<PathBuf> = libs[1..]
            .iter()
            .filter(|l| l["origin"] != "dlopen")
            .map(|l| PathBuf::from(l["path"].as_str().unwrap()))
            .collect();
        assert_eq!(ours, ld_so_order(&b.client, shim), "{case}: {v}");
        let real = origin_of(&b.hip);
        if *case == "soname" {
            assert_eq!(real.as_deref(), Some("dlopen"), "{case}: {hip_name} {v}");
        } else {
            assert_eq!(real.as_deref(), Some("needed"), "{case}: {hip_name} {v}");
        }
        assert!(
            v["preload_unmapped"].as_array().unwrap().is_empty(),
            "{case}: {v}"
        );
    }
}
